/* cuda_ipc transport, the data path's engine: control messages on the TCP
 * channel, copies into the peer's slots and out of ours with their
 * events, and one progress step of a connection. */
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
#include "transports/tcp/tcp.h"

braid_status braid__cuda_ipc_cuda_fail(ipc_conn *c, cudaError_t err, const char *what)
{
    (void)cudaGetLastError();
    return braid__error(BRAID_ERR_CUDA, "rank %d: cuda_ipc peer %d: %s failed: %s", c->rank, c->base.peer, what,
                        cudaGetErrorString(err));
}

/* ---- data path ----------------------------------------------------------------- */

static braid_status conn_error(ipc_conn *c, braid_status st)
{
    if (c->base.error == BRAID_OK) {
        c->base.error = st;
        snprintf(c->error_text, sizeof(c->error_text), "%s", braid_last_error());
    }
    return c->base.error;
}

static braid_status peer_error(ipc_conn *c, braid_status st, const char *why)
{
    return conn_error(c, braid__error(st, "rank %d: cuda_ipc peer %d: %s", c->rank, c->base.peer, why));
}

/* Queue a control message; 0 when every transmit buffer is busy (cannot
 * happen within the window's bounds, but then the caller retries). */
braid_status braid__cuda_ipc_ctrl_send(ipc_conn *c, const braid_ipc_ctrl *m, int *sent)
{
    *sent = 0;
    for (int i = 0; i < IPC_TX_MAX; i++) {
        if (c->tx_busy[i]) {
            int done = 0;
            BRAID_CHECK(c->tcp->ops->test(&c->tx[i], &done));
            if (!done)
                continue;
            c->tx_busy[i] = 0;
        }
        braid__ipc_ctrl_encode(m, c->tx_buf[i]);
        memset(&c->tx[i], 0, sizeof(c->tx[i]));
        BRAID_CHECK(c->tcp->ops->isend(c->tcp, &c->tx[i], c->tx_buf[i], BRAID_IPC_CTRL_BYTES));
        c->tx_busy[i] = 1;
        *sent = 1;
        /* Push it now: a posted TCP send moves only when progressed, and
         * the peer may be waiting for exactly this message after we moved
         * on to other links (braid__cuda_ipc_tx_pending). */
        int done = 0;
        BRAID_CHECK(c->tcp->ops->test(&c->tx[i], &done));
        c->tx_busy[i] = !done;
        return BRAID_OK;
    }
    return BRAID_OK;
}

/* An event finished? cudaErrorNotReady is "not yet". */
static braid_status event_done(ipc_conn *c, cudaEvent_t e, int *done)
{
    cudaError_t err = cudaEventQuery(e);
    if (err == cudaErrorNotReady) {
        *done = 0;
        return BRAID_OK;
    }
    if (err != cudaSuccess)
        return conn_error(c, braid__cuda_ipc_cuda_fail(c, err, "cudaEventQuery"));
    *done = 1;
    return BRAID_OK;
}

static braid_status on_ctrl(ipc_conn *c, const braid_ipc_ctrl *m)
{
    if (m->kind == BRAID_IPC_VERDICT) {
        if (c->peer_verdict >= 0)
            return peer_error(c, BRAID_ERR_PEER, "a second verdict");
        c->peer_verdict = (int)m->len;
        if (!c->peer_verdict && c->my_verdict == 1) {
            char why[256];
            snprintf(why, sizeof(why), "rank %d: cuda_ipc peer %d cannot reach this GPU (%s; its log says why)",
                     c->rank, c->base.peer, c->me.bus_id);
            snprintf(c->unusable_why, sizeof(c->unusable_why), "%s", why);
            if (c->eager)
                return conn_error(c, braid__error(BRAID_ERR_UNSUPPORTED, "%s", why));
        }
        c->ready = c->my_verdict == 1 && c->peer_verdict == 1;
        return BRAID_OK;
    }
    if (!c->ready)
        return peer_error(c, BRAID_ERR_PEER, "data or credit on a link that is not set up");
    if (m->kind == BRAID_IPC_CREDIT) {
        if (braid__ipc_window_credit(&c->win, m->slot) != BRAID_OK)
            return peer_error(c, BRAID_ERR_PEER, "credit for a slot not in flight");
        return BRAID_OK;
    }
    if (braid__ipc_window_arrive(&c->win, m->slot) != BRAID_OK || c->ngot >= c->nslots)
        return peer_error(c, BRAID_ERR_PEER, "data for a slot out of order or beyond its credit");
    ipc_chunk *g = &c->got[(c->got_head + c->ngot) % c->nslots];
    *g = (ipc_chunk){.slot = m->slot, .len = (size_t)m->len, .last = m->last};
    c->ngot++;
    return BRAID_OK;
}

static braid_status pump_sends(ipc_conn *c, int *moved)
{
    /* Hand chunks of the unsent messages to the copy engine. */
    while (c->send_assign && c->nsent < c->nslots) {
        braid_req *r = c->send_assign;
        uint32_t slot;
        size_t len;
        if (!braid__ipc_window_take(&c->win, r->len - c->send_off, &slot, &len))
            break;
        int last = c->send_off + len == r->len;
        if (len > 0) {
            IPC_CU(c, cudaMemcpyAsync((char *)c->peer_ring + (size_t)slot * c->slot_bytes,
                                      (const char *)r->buf + c->send_off, len, cudaMemcpyDefault, c->stream));
            IPC_CU(c, cudaEventRecord(c->wrote[slot], c->stream));
        }
        braid_ipc_ctrl m = {.kind = BRAID_IPC_DATA, .slot = slot, .last = last, .len = len};
        int sent;
        BRAID_CHECK(braid__cuda_ipc_ctrl_send(c, &m, &sent));
        if (!sent)
            return peer_error(c, BRAID_ERR_INTERNAL, "control transmit buffers exhausted");
        c->sent[(c->sent_head + c->nsent) % c->nslots] = (ipc_chunk){.slot = slot, .len = len, .last = last, .req = r};
        c->nsent++;
        c->send_off += len;
        if (last) {
            c->send_assign = r->next;
            c->send_off = 0;
        }
        *moved = 1;
    }
    /* A send is done once its copies have left the user's buffer. */
    while (c->nsent > 0) {
        ipc_chunk *s = &c->sent[c->sent_head];
        int done = 1;
        if (s->len > 0)
            BRAID_CHECK(event_done(c, c->wrote[s->slot], &done));
        if (!done)
            break;
        s->req->moved += s->len;
        if (s->last) {
            s->req->done = 1;
            c->send_head = s->req->next;
            if (!c->send_head)
                c->send_tail = NULL;
        }
        c->sent_head = (c->sent_head + 1) % c->nslots;
        c->nsent--;
        *moved = 1;
    }
    return BRAID_OK;
}

static braid_status pump_recvs(ipc_conn *c, int *moved)
{
    /* Give arrived chunks their place in the posted receives, in order. */
    for (uint32_t i = 0; i < c->ngot; i++) {
        ipc_chunk *g = &c->got[(c->got_head + i) % c->nslots];
        if (g->copying)
            continue;
        braid_req *r = c->recv_assign;
        if (!r)
            break;
        size_t left = r->len - c->recv_off;
        if (g->len > left || (g->last != (g->len == left)))
            return peer_error(c, BRAID_ERR_MISMATCH, "message length differs from the posted receive");
        if (g->len > 0) {
            IPC_CU(c, cudaStreamWaitEvent(c->stream, c->peer_wrote[g->slot], 0));
            IPC_CU(c, cudaMemcpyAsync((char *)r->buf + c->recv_off, (char *)c->ring + (size_t)g->slot * c->slot_bytes,
                                      g->len, cudaMemcpyDefault, c->stream));
            IPC_CU(c, cudaEventRecord(c->read[g->slot], c->stream));
        }
        g->copying = 1;
        g->req = r;
        c->recv_off += g->len;
        if (g->last) {
            c->recv_assign = r->next;
            c->recv_off = 0;
        }
        *moved = 1;
    }
    /* Copies out finished in order: free the slot, finish the receive. */
    while (c->ngot > 0 && c->got[c->got_head].copying) {
        ipc_chunk *g = &c->got[c->got_head];
        int done = 1;
        if (g->len > 0)
            BRAID_CHECK(event_done(c, c->read[g->slot], &done));
        if (!done)
            break;
        braid_ipc_ctrl m = {.kind = BRAID_IPC_CREDIT, .slot = braid__ipc_window_release(&c->win)};
        int sent;
        BRAID_CHECK(braid__cuda_ipc_ctrl_send(c, &m, &sent));
        if (!sent)
            return peer_error(c, BRAID_ERR_INTERNAL, "control transmit buffers exhausted");
        g->req->moved += g->len;
        if (g->last) {
            g->req->done = 1;
            c->recv_head = g->req->next;
            if (!c->recv_head)
                c->recv_tail = NULL;
        }
        c->got_head = (c->got_head + 1) % c->nslots;
        c->ngot--;
        *moved = 1;
    }
    return BRAID_OK;
}

braid_status braid__cuda_ipc_conn_progress(ipc_conn *c, int *moved)
{
    if (c->base.error != BRAID_OK) {
        braid__error_set_text(c->error_text);
        return c->base.error;
    }
    if (c->started && c->me.nslots > 0) {
        cudaError_t err = cudaSetDevice(c->device);
        if (err != cudaSuccess)
            return conn_error(c, braid__cuda_ipc_cuda_fail(c, err, "cudaSetDevice"));
    }
    braid_status st;
    if (!c->started) {
        BRAID_CHECK_GOTO(braid__cuda_ipc_start(c), st, fail);
        *moved = 1;
    }
    if (c->my_verdict < 0) {
        int tx_done = 0, rx_done = 0;
        BRAID_CHECK_GOTO(c->tcp->ops->test(&c->setup_tx, &tx_done), st, fail);
        BRAID_CHECK_GOTO(c->tcp->ops->test(&c->setup_rx, &rx_done), st, fail);
        if (!rx_done)
            return BRAID_OK;
        BRAID_CHECK_GOTO(braid__cuda_ipc_finish_setup(c), st, fail);
        *moved = 1;
    }
    for (;;) {
        if (!c->rx_posted) {
            memset(&c->rx, 0, sizeof(c->rx));
            BRAID_CHECK_GOTO(c->tcp->ops->irecv(c->tcp, &c->rx, c->rx_buf, BRAID_IPC_CTRL_BYTES), st, fail);
            c->rx_posted = 1;
        }
        int done = 0;
        BRAID_CHECK_GOTO(c->tcp->ops->test(&c->rx, &done), st, fail);
        if (!done)
            break;
        c->rx_posted = 0;
        braid_ipc_ctrl m;
        char why[128];
        if (braid__ipc_ctrl_decode(c->rx_buf, c->nslots, c->slot_bytes, &m, why, sizeof(why)) != BRAID_OK)
            return peer_error(c, BRAID_ERR_PEER, why);
        BRAID_CHECK(on_ctrl(c, &m));
        *moved = 1;
    }
    if (!c->ready)
        return BRAID_OK;
    BRAID_CHECK_GOTO(pump_sends(c, moved), st, fail);
    BRAID_CHECK_GOTO(pump_recvs(c, moved), st, fail);
    return BRAID_OK;
fail:
    return conn_error(c, st);
}

int braid__cuda_ipc_gpu_busy(const ipc_conn *c)
{
    return c->started && (c->nsent > 0 || c->ngot > 0 || !c->setup_tx.done);
}

/* Both ends know whether the link carries data: we said no, or we said
 * yes and heard the peer's verdict. */
int braid__cuda_ipc_settled(const ipc_conn *c)
{
    return c->my_verdict == 0 || (c->my_verdict == 1 && c->peer_verdict >= 0);
}
