/* Posting work requests for the engine: RDMA writes with immediate into
 * the peer's ring, empty sends with immediate, empty receives, and the
 * zero-copy registrations from the device's cache. */
#include <arpa/inet.h>
#include <errno.h>

#include "verbs_conn.h"

#define RECV_BATCH 32

static int io_write_imm(void *ctx, uint32_t slot, const void *src, uint32_t lkey, uint32_t len, uint32_t imm,
                        uint64_t wr_id)
{
    braid_verbs_conn *c = ctx;
    if (c->qp_dead)
        return ENOTCONN;
    struct ibv_sge sge = {.addr = (uintptr_t)src, .length = len, .lkey = lkey};
    struct ibv_send_wr wr = {
        .wr_id = wr_id,
        .sg_list = len ? &sge : NULL, /* an empty chunk moves no bytes, only its immediate */
        .num_sge = len ? 1 : 0,
        .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
        .send_flags = IBV_SEND_SIGNALED,
        .imm_data = htonl(imm),
    };
    wr.wr.rdma.remote_addr = c->remote_ring + (uint64_t)slot * c->remote_slot_bytes;
    wr.wr.rdma.rkey = c->remote_rkey;
    struct ibv_send_wr *bad;
    int err = ibv_post_send(c->qp, &wr, &bad);
    if (!err)
        c->outstanding++;
    return err;
}

static int io_send_imm(void *ctx, uint32_t imm, uint64_t wr_id)
{
    braid_verbs_conn *c = ctx;
    if (c->qp_dead)
        return ENOTCONN;
    struct ibv_send_wr wr = {
        .wr_id = wr_id,
        .opcode = IBV_WR_SEND_WITH_IMM,
        .send_flags = IBV_SEND_SIGNALED,
        .imm_data = htonl(imm),
    };
    struct ibv_send_wr *bad;
    int err = ibv_post_send(c->qp, &wr, &bad);
    if (!err)
        c->outstanding++;
    return err;
}

/* Zero copy is only taken from registrations the cache already has
 * (reg_mem) unless BRAID_IB_REGCACHE=1 allows registering on demand. */
static int io_zcopy_get(void *ctx, const void *buf, size_t len, uint32_t *lkey, void **token)
{
    braid_verbs_conn *c = ctx;
    braid_verbs_region *r;
    pthread_mutex_lock(&c->dev->mu);
    int err = braid__verbs_regcache_acquire(&c->dev->cache, buf, len, c->dev->implicit_reg, &r);
    pthread_mutex_unlock(&c->dev->mu);
    if (err)
        return err;
    *lkey = r->lkey;
    *token = r;
    return 0;
}

static void io_zcopy_put(void *ctx, void *token)
{
    braid_verbs_conn *c = ctx;
    pthread_mutex_lock(&c->dev->mu);
    braid__verbs_regcache_release(&c->dev->cache, token);
    pthread_mutex_unlock(&c->dev->mu);
}

void braid__verbs_conn_io(braid_verbs_conn *c, braid_verbs_io *io)
{
    *io = (braid_verbs_io){.ctx = c,
                           .write_imm = io_write_imm,
                           .send_imm = io_send_imm,
                           .zcopy_get = io_zcopy_get,
                           .zcopy_put = io_zcopy_put};
}

int braid__verbs_post_recvs(braid_verbs_conn *c, uint32_t n)
{
    /* Receives carry no buffer: data arrives by RDMA write into the ring
     * and control messages are empty, so a receive is only a ticket for
     * one immediate. */
    struct ibv_recv_wr wrs[RECV_BATCH];
    while (n > 0) {
        uint32_t k = n < RECV_BATCH ? n : RECV_BATCH;
        for (uint32_t i = 0; i < k; i++)
            wrs[i] = (struct ibv_recv_wr){.wr_id = BRAID_VERBS_WR_ID(BRAID_VERBS_WR_RECV, 0),
                                          .next = i + 1 < k ? &wrs[i + 1] : NULL};
        struct ibv_recv_wr *bad = NULL;
        int err = ibv_post_recv(c->qp, wrs, &bad);
        if (err) {
            for (struct ibv_recv_wr *w = wrs; w != bad && w < wrs + k; w++)
                c->outstanding++;
            return err;
        }
        c->outstanding += k;
        n -= k;
    }
    return 0;
}
