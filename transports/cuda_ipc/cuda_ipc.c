/* cuda_ipc transport: same-host GPU peers move chunks device to device.
 *
 * A connection is a TCP connection (authenticated by the TCP transport's
 * job-secret handshake, so IPC handles are only ever given to group
 * members) plus, on each side, a receive ring of device slots the peer
 * writes into through cudaIpcOpenMemHandle, and inter-process events that
 * order the writer's copy before the reader's (cuda_ipc_proto.h has the
 * protocol). Every copy is a cudaMemcpyAsync (cudaMemcpyDefault, so the
 * user buffer may be host or device memory) on the connection's own
 * non-blocking stream; the TCP channel only carries 16-byte control
 * messages. Completion is polled with cudaEventQuery: progress() never
 * blocks on the GPU, and waits in poll() (1 ms at most while copies are in
 * flight) only when nothing moved.
 *
 * Two uses. BRAID_TRANSPORT=cuda_ipc makes it the group's transport
 * (single-host groups whose GPUs reach each other): connections set up at
 * once, and a pair that cannot reach fails. Otherwise the group keeps
 * shm/TCP for everything and adds a device link (braid__cuda_ipc_wrap)
 * between same-host ring neighbours for the device ring (src/lifecycle/devlink.c):
 * those set up on first use, on the thread and device of the first device
 * call, and a pair that cannot reach settles on "unusable" (both ends
 * alike, through VERDICT messages) instead of failing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "braid_cuda.h"
#include "clock.h"
#include "cuda_ipc.h"
#include "cuda_ipc_proto.h"
#include "log.h"
#include "status.h"
#include "cuda_ipc_int.h"
#include "transports/common/ops.h"
#include "transports/tcp/tcp.h"

/* ---- probe ----------------------------------------------------------------- */

static braid_status ipc_probe(char *why, size_t why_len)
{
    if (!braid__cuda_available()) {
        snprintf(why, why_len, "%s", braid__cuda_unavailable_reason());
        return BRAID_ERR_UNSUPPORTED;
    }
    int dev = 0, ipc_events = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&ipc_events, cudaDevAttrIpcEventSupport, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(why, why_len, "cannot query CUDA IPC support of the current device");
        return BRAID_ERR_UNSUPPORTED;
    }
    if (!ipc_events) {
        snprintf(why, why_len, "device %d does not support CUDA IPC events (e.g. WSL, some MIG set-ups)", dev);
        return BRAID_ERR_UNSUPPORTED;
    }
    why[0] = '\0';
    return BRAID_OK;
}

braid_status braid__cuda_ipc_wrap(int rank, braid_conn *tcp, braid_conn **out)
{
    return braid__cuda_ipc_conn_setup(rank, tcp, 0, out);
}

const braid_transport_ops *braid__cuda_ipc_transport(void)
{
    return &braid__cuda_ipc_ops;
}

static braid_status ipc_listen(const braid_transport_ctx *ctx, braid_listener **listener, char addr[BRAID_ADDR_MAX])
{
    ipc_listener *l = calloc(1, sizeof(*l));
    if (!l)
        return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: out of memory for a cuda_ipc listener", ctx->rank);
    braid_status st = braid__tcp_ops.listen(ctx, &l->tcp, addr);
    if (st != BRAID_OK) {
        free(l);
        return st;
    }
    l->base.ops = &braid__cuda_ipc_ops;
    l->ctx = *ctx;
    *listener = &l->base;
    return BRAID_OK;
}

static braid_status ipc_accept(braid_listener *listener, int peer, int timeout_ms, braid_conn **conn)
{
    ipc_listener *l = (ipc_listener *)listener;
    braid_conn *tcp;
    BRAID_CHECK(l->tcp->ops->accept(l->tcp, peer, timeout_ms, &tcp));
    return braid__cuda_ipc_conn_setup(l->ctx.rank, tcp, 1, conn);
}

/* The set-up message exchange finishes under the first collective's
 * deadline (see ipc_conn.ready), not under timeout_ms. */
static braid_status ipc_connect(const braid_transport_ctx *ctx, int peer, const char *addr, int timeout_ms,
                                braid_conn **conn)
{
    braid_conn *tcp;
    BRAID_CHECK(braid__tcp_ops.connect(ctx, peer, addr, timeout_ms, &tcp));
    return braid__cuda_ipc_conn_setup(ctx->rank, tcp, 1, conn);
}

static void ipc_close_listener(braid_listener *listener)
{
    ipc_listener *l = (ipc_listener *)listener;
    l->tcp->ops->close_listener(l->tcp);
    free(l);
}

braid_status braid__cuda_ipc_settle(braid_conn *conn, int *is_settled, int *usable)
{
    ipc_conn *c = conn_of(conn);
    int moved = 0;
    if (!braid__cuda_ipc_settled(c)) /* once braid__cuda_ipc_settled, the answer never changes: no I/O to ask it */
        BRAID_CHECK(braid__cuda_ipc_conn_progress(c, &moved));
    *usable = c->ready;
    *is_settled = braid__cuda_ipc_settled(c);
    return BRAID_OK;
}

braid_status braid__cuda_ipc_tx_pending(braid_conn *conn, int *pending)
{
    ipc_conn *c = conn_of(conn);
    *pending = 0;
    for (int i = 0; i < IPC_TX_MAX; i++) {
        if (!c->tx_busy[i])
            continue;
        int done = 0;
        BRAID_CHECK(c->tcp->ops->test(&c->tx[i], &done));
        c->tx_busy[i] = !done;
        *pending += !done;
    }
    return BRAID_OK;
}

const char *braid__cuda_ipc_unusable_why(braid_conn *conn)
{
    return conn_of(conn)->unusable_why;
}

static braid_status ipc_isend(braid_conn *conn, braid_req *req, const void *buf, size_t len)
{
    ipc_conn *c = conn_of(conn);
    if (c->base.error != BRAID_OK) {
        braid__error_set_text(c->error_text);
        return c->base.error;
    }
    memset(req, 0, sizeof(*req));
    req->conn = conn;
    req->kind = BRAID_REQ_SEND;
    req->buf = (void *)buf;
    req->len = len;
    if (c->send_tail)
        c->send_tail->next = req;
    else
        c->send_head = req;
    c->send_tail = req;
    if (!c->send_assign)
        c->send_assign = req;
    return BRAID_OK;
}

static braid_status ipc_irecv(braid_conn *conn, braid_req *req, void *buf, size_t len)
{
    ipc_conn *c = conn_of(conn);
    if (c->base.error != BRAID_OK) {
        braid__error_set_text(c->error_text);
        return c->base.error;
    }
    memset(req, 0, sizeof(*req));
    req->conn = conn;
    req->kind = BRAID_REQ_RECV;
    req->buf = buf;
    req->len = len;
    if (c->recv_tail)
        c->recv_tail->next = req;
    else
        c->recv_head = req;
    c->recv_tail = req;
    if (!c->recv_assign)
        c->recv_assign = req;
    return BRAID_OK;
}

static braid_status ipc_test(braid_req *req, int *done)
{
    ipc_conn *c = conn_of(req->conn);
    int moved = 0;
    *done = req->done;
    if (req->done)
        return BRAID_OK;
    BRAID_CHECK(braid__cuda_ipc_conn_progress(c, &moved));
    *done = req->done;
    return BRAID_OK;
}

static braid_status ipc_progress(braid_conn **conns, int nconns, int wake_fd, int timeout_ms)
{
    int moved = 0, busy = 0;
    for (int i = 0; i < nconns; i++) {
        BRAID_CHECK(braid__cuda_ipc_conn_progress(conn_of(conns[i]), &moved));
        busy |= braid__cuda_ipc_gpu_busy(conn_of(conns[i]));
    }
    if (moved)
        return BRAID_OK;
    /* Nothing moved: wait on the control sockets, briefly while the GPU
     * has copies in flight (their completion wakes no file descriptor). */
    int wait_ms = busy && (timeout_ms < 0 || timeout_ms > 1) ? 1 : timeout_ms;
    braid_conn *inner[64];
    for (int i = 0; i < nconns; i += 64) {
        int n = nconns - i < 64 ? nconns - i : 64;
        for (int k = 0; k < n; k++)
            inner[k] = conn_of(conns[i + k])->tcp;
        BRAID_CHECK(inner[0]->ops->progress(inner, n, wake_fd, i == 0 ? wait_ms : 0));
    }
    return BRAID_OK;
}

static void ipc_close(braid_conn *conn)
{
    if (conn)
        braid__cuda_ipc_conn_free(conn_of(conn));
}

const braid_transport_ops braid__cuda_ipc_ops = {
    .size = sizeof(braid_transport_ops),
    .name = "cuda_ipc",
    .probe = ipc_probe,
    .listen = ipc_listen, .accept = ipc_accept, .close_listener = ipc_close_listener,
    .connect = ipc_connect,
    .reg_mem = braid__reg_mem_none, .dereg_mem = braid__dereg_mem_none, /* copies go through the staging ring */
    .isend = ipc_isend, .irecv = ipc_irecv, .test = ipc_test,
    .progress = ipc_progress, .close = ipc_close,
    .scope = BRAID_TRANSPORT_DEVICE_LINK, /* every pair only when named alone */
};
