/* One verbs connection: an RC queue pair with its completion queue and
 * channel, the two rings, the data-path engine, and the authenticated TCP
 * connection it was set up over.
 *
 * Set-up never waits for the peer's application: connect() and accept()
 * create the queue pair and send our set-up message, then return; the rest
 * of the handshake (their message, RTR/RTS, a ready byte each way, or a
 * failed byte from a side whose queue pair did not reach RTS) moves
 * whenever the connection is used, and transfers posted meanwhile wait in
 * order. A blocking exchange inside connect() would deadlock a ring whose
 * every rank dials its successor before accepting its predecessor.
 *
 * The TCP connection stays open for the connection's life: it carries
 * nothing after set-up, but its end tells us that a peer died without
 * saying goodbye, which an idle RC queue pair would never report. */
#ifndef BRAID_VERBS_CONN_H
#define BRAID_VERBS_CONN_H

#include <infiniband/verbs.h>
#include <stdint.h>

#include "braid_transport.h"
#include "verbs_dev.h"
#include "verbs_engine.h"

typedef enum {
    BRAID_VERBS_HS_INFO = 0, /* our set-up message sent, waiting for theirs */
    BRAID_VERBS_HS_READY,    /* connected (RTS), ready byte sent, waiting for theirs */
    BRAID_VERBS_HS_UP,       /* both can receive: the engine runs */
} braid_verbs_hs_state;

typedef struct braid_verbs_conn {
    braid_conn base; /* first: braid_conn * downcasts to this */
    int rank;
    int timeout_ms;
    braid_verbs_dev *dev;
    char error_text[512]; /* of the sticky error, for later calls */

    /* Set-up, over the TCP connection. The buffers and requests live here
     * because TCP may still be moving them after connect() returns. */
    braid_conn *oob;
    braid_verbs_hs_state hs;
    uint32_t nslots, slot_bytes, psn; /* ours */
    uint8_t hs_out[BRAID_VERBS_INFO_BYTES], hs_in[BRAID_VERBS_INFO_BYTES];
    uint8_t ready_out, ready_in;
    braid_req hs_send, hs_recv, ready_send, ready_recv;
    braid_req *pre_head, *pre_tail; /* posted before UP, in order */

    /* After set-up the TCP connection only watches for the peer's end. */
    braid_req oob_watch; /* 1-byte receive the peer never sends */
    uint8_t oob_byte;
    int64_t oob_next_check_ms;
    int64_t oob_gone_ms; /* when the TCP connection ended; 0: alive */

    struct ibv_comp_channel *chan;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    uint32_t sq_depth, rq_depth;
    int64_t outstanding; /* posted work requests not yet completed */
    int qp_dead;         /* a completion failed: the QP is in ERR */
    int closing;         /* in close(): failures are expected, not news */

    void *rx_ring;
    struct ibv_mr *rx_mr;
    void *tx_stage;
    struct ibv_mr *tx_mr;
    uint64_t remote_ring;
    uint32_t remote_rkey;
    uint32_t remote_slot_bytes;

    braid_verbs_engine eng;
    int eng_ready;
} braid_verbs_conn;

static inline braid_verbs_conn *braid__verbs_conn_of(braid_conn *conn)
{
    return (braid_verbs_conn *)conn; /* base is the first member */
}

/* Start a connection to peer over the authenticated TCP connection oob,
 * which it owns from here on (closed on failure too). Returns once our
 * set-up message is on its way. */
braid_status braid__verbs_conn_setup(const braid_transport_ctx *ctx, int peer, braid_conn *oob, int64_t deadline_ms,
                                     braid_conn **conn);

/* Bytes one connection registers (pins) for its two rings with the
 * current BRAID_IB_SLOTS and BRAID_IB_SLOT_BYTES. */
size_t braid__verbs_conn_pinned_bytes(void);

/* Move the handshake as far as it goes without blocking; at UP hand the
 * waiting transfers to the engine. *moved when the state changed. */
braid_status braid__verbs_conn_handshake(braid_verbs_conn *c, int *moved);

/* Record the connection's first failure (the thread's current error) and
 * return it; later calls get braid__verbs_conn_error(). */
braid_status braid__verbs_conn_failed(braid_verbs_conn *c, braid_status st);
braid_status braid__verbs_conn_error(const braid_verbs_conn *c);

/* Goodbye, drain, ERR, flush, destroy. */
void braid__verbs_conn_close(braid_conn *conn);

/* One non-blocking pass: handshake, completion queue, engine, TCP watch.
 * *moved when anything changed. */
braid_status braid__verbs_conn_pass(braid_verbs_conn *c, int *moved);

/* Arm the completion channel, then poll once more so a completion that
 * landed before arming is not slept through. */
braid_status braid__verbs_conn_arm(braid_verbs_conn *c, int *moved);

/* Consume the channel's pending events (non-blocking). */
void braid__verbs_conn_ack_events(braid_verbs_conn *c);

/* Posting (verbs_post.c): the engine's io, and n empty receives (0 or the
 * errno of ibv_post_recv). */
void braid__verbs_conn_io(braid_verbs_conn *c, braid_verbs_io *io);
int braid__verbs_post_recvs(braid_verbs_conn *c, uint32_t n);

#endif
