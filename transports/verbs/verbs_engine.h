/* Data path of one verbs connection, without verbs: request queues, the
 * chunk scheduler, ring bookkeeping and credit return. The connection code
 * (verbs_conn.c) feeds it completions and gives it two ways to post work
 * requests; the unit tests give it a simulated fabric instead, so the whole
 * protocol runs on machines without an RDMA device.
 *
 * Ownership: requests are the caller's; the engine links them through
 * req->next and keeps its scratch in req->tp[]. Once the engine has failed
 * it never touches a queued request again (the owner may be gone), and it
 * keeps the registrations it borrowed for zero-copy sends in its own
 * memory, so fini() can return them without the requests. */
#ifndef BRAID_VERBS_ENGINE_H
#define BRAID_VERBS_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "braid_transport.h"
#include "verbs_proto.h"

/* Work request ids: kind in the top byte, chunk number below. */
#define BRAID_VERBS_WR_DATA 0u
#define BRAID_VERBS_WR_CREDIT 1u
#define BRAID_VERBS_WR_CLOSE 2u
#define BRAID_VERBS_WR_RECV 3u
#define BRAID_VERBS_WR_ID(kind, seq) (((uint64_t)(kind) << 56) | ((seq) & ((1ull << 56) - 1)))
#define BRAID_VERBS_WR_KIND(id) ((unsigned)((id) >> 56))

/* Credit messages in flight at once; more credits wait and merge into the
 * next message, so this bounds the send queue, not the throughput. */
#define BRAID_VERBS_CTRL_MAX 4u

/* Send-queue and receive-queue depths a connection needs: every data chunk
 * in the window, the credit messages and the close message; on the receive
 * side every chunk of our ring plus every credit message the peer may send
 * for our window before we repost (at most one per chunk of our window). */
#define BRAID_VERBS_SQ_DEPTH(tx_window) ((tx_window) + BRAID_VERBS_CTRL_MAX + 1u)
#define BRAID_VERBS_RQ_DEPTH(rx_slots, tx_window) ((rx_slots) + (tx_window) + 2u)

/* How the engine posts work; each returns 0 or an errno value. */
typedef struct {
    void *ctx;
    /* RDMA WRITE WITH IMMEDIATE: len bytes at src (registered, lkey) into
     * slot `slot` of the peer's ring. */
    int (*write_imm)(void *ctx, uint32_t slot, const void *src, uint32_t lkey, uint32_t len, uint32_t imm,
                     uint64_t wr_id);
    /* SEND WITH IMMEDIATE carrying no payload. */
    int (*send_imm)(void *ctx, uint32_t imm, uint64_t wr_id);
    /* Optional: a registration covering [buf, buf + len) for a zero-copy
     * send; nonzero when there is none (the chunk is then staged). */
    int (*zcopy_get)(void *ctx, const void *buf, size_t len, uint32_t *lkey, void **token);
    void (*zcopy_put)(void *ctx, void *token);
} braid_verbs_io;

typedef struct {
    int rank, peer;   /* for error messages */
    uint8_t *rx_ring; /* our ring: rx_slots x rx_slot_bytes */
    uint32_t rx_slots, rx_slot_bytes;
    uint32_t tx_slots, tx_slot_bytes; /* the peer's ring */
    uint32_t tx_window;               /* 1..tx_slots */
    uint8_t *tx_stage;                /* tx_window x tx_slot_bytes, registered */
    uint32_t tx_stage_lkey;
    size_t zcopy_min; /* sends of at least this many bytes try zero copy; 0: never */
} braid_verbs_engine_cfg;

typedef struct {
    braid_verbs_engine_cfg cfg;
    braid_verbs_io io;
    braid_verbs_tx tx;
    braid_verbs_rx rx;
    uint32_t rx_len[BRAID_VERBS_MAX_SLOTS];
    uint8_t rx_last[BRAID_VERBS_MAX_SLOTS];

    braid_req *send_head, *send_tail; /* not yet fully posted */
    braid_req *sent_head, *sent_tail; /* posted, zero-copy ones awaiting completion */
    braid_req *recv_head, *recv_tail;

    /* Zero-copy registrations in use: the head send's, then those of fully
     * posted sends until their last chunk completes. */
    int head_mode; /* 0 undecided, 1 staged, 2 zero copy */
    uint32_t head_lkey;
    void *head_token;
    struct {
        uint64_t last_seq;
        void *token;
    } zc[BRAID_VERBS_MAX_SLOTS];
    uint32_t zc_first, zc_count;

    uint32_t ctrl_inflight;
    int close_posted, close_done, peer_closed;

    braid_status error; /* sticky */
    char error_text[384];
} braid_verbs_engine;

/* Geometry is validated here (BRAID_ERR_INVALID_ARG on a bad one). */
braid_status braid__verbs_engine_init(braid_verbs_engine *e, const braid_verbs_engine_cfg *cfg,
                                      const braid_verbs_io *io);
/* Return borrowed registrations. Call once no posted work can still read
 * them (queue pair drained or destroyed). */
void braid__verbs_engine_fini(braid_verbs_engine *e);

/* Queue a transfer; the engine also tries to move it at once. */
braid_status braid__verbs_engine_isend(braid_verbs_engine *e, braid_req *req, const void *buf, size_t len);
braid_status braid__verbs_engine_irecv(braid_verbs_engine *e, braid_req *req, void *buf, size_t len);

/* Completions, in the order the completion queue gave them. */
braid_status braid__verbs_engine_on_send(braid_verbs_engine *e, uint64_t wr_id);
braid_status braid__verbs_engine_on_recv(braid_verbs_engine *e, uint32_t imm, uint32_t byte_len, int is_write);
/* A failed completion: fails the engine with `cause`, unless the peer has
 * already said goodbye and no send of ours still waits on a completion. */
braid_status braid__verbs_engine_on_error(braid_verbs_engine *e, uint64_t wr_id, const char *cause);

/* Copy arrived chunks out, return credits, post chunks, finish requests.
 * *moved is set when anything changed. */
braid_status braid__verbs_engine_advance(braid_verbs_engine *e, int *moved);

/* Fail with status; the text is formatted here and recorded (braid__error). */
braid_status braid__verbs_engine_fail(braid_verbs_engine *e, braid_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The sticky error again, with its original text, for later calls. */
braid_status braid__verbs_engine_error(const braid_verbs_engine *e);

/* Forget every queued request without touching it (the connection is
 * closing and their owners may be gone). Chunks already posted still
 * complete; their registrations are returned by fini(). */
void braid__verbs_engine_abandon(braid_verbs_engine *e);

/* Post the goodbye message (after every queued chunk) unless the engine
 * failed or the peer already left. 1 when posted. */
int braid__verbs_engine_close(braid_verbs_engine *e);

/* Every posted work request has completed (safe to tear down). */
int braid__verbs_engine_drained(const braid_verbs_engine *e);

#endif
