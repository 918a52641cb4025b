/* One verbs connection: an RC queue pair with its completion queue and
 * channel, the two rings, the data-path engine, and the authenticated TCP
 * connection it was set up over. The TCP connection stays open for the
 * connection's life: it carries nothing after set-up, but its end tells us
 * that a peer died without saying goodbye, which an idle RC queue pair
 * would never report. */
#ifndef BRAID_VERBS_CONN_H
#define BRAID_VERBS_CONN_H

#include <infiniband/verbs.h>
#include <stdint.h>

#include "braid_transport.h"
#include "verbs_dev.h"
#include "verbs_engine.h"

typedef struct braid_verbs_conn {
    braid_conn base;            /* first: braid_conn * downcasts to this */
    int rank;
    int timeout_ms;
    braid_verbs_dev *dev;

    braid_conn *oob;            /* TCP, authenticated by the job secret */
    braid_req oob_watch;        /* 1-byte receive the peer never sends */
    uint8_t oob_byte;
    int64_t oob_next_check_ms;
    int64_t oob_gone_ms;        /* when the TCP connection ended; 0: alive */

    struct ibv_comp_channel *chan;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    uint32_t sq_depth, rq_depth;
    int64_t outstanding;        /* posted work requests not yet completed */
    int qp_dead;                /* a completion failed: the QP is in ERR */
    int draining;               /* closing: completions only counted */

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

static inline braid_verbs_conn *braid_verbs_conn_of(braid_conn *conn)
{
    return (braid_verbs_conn *)conn; /* base is the first member */
}

/* Build a connection to peer over the authenticated TCP connection oob,
 * which it owns from here on (closed on failure too). */
braid_status braid__verbs_conn_setup(const braid_transport_ctx *ctx, int peer, braid_conn *oob,
                                     int64_t deadline_ms, braid_conn **conn);

/* Goodbye, drain, ERR, flush, destroy. */
void braid__verbs_conn_close(braid_conn *conn);

/* One non-blocking pass: poll the completion queue, advance the engine,
 * look at the TCP connection. *moved when anything changed. */
braid_status braid__verbs_conn_pass(braid_verbs_conn *c, int *moved);

/* Arm the completion channel, then poll once more so a completion that
 * landed before arming is not slept through. */
braid_status braid__verbs_conn_arm(braid_verbs_conn *c, int *moved);

/* Consume the channel's pending events (non-blocking). */
void braid__verbs_conn_ack_events(braid_verbs_conn *c);

/* Post n empty receives; 0 or the errno of ibv_post_recv. */
int braid__verbs_post_recvs(braid_verbs_conn *c, uint32_t n);

#endif
