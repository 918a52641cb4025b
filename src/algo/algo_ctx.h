/* What an algorithm may see of its group: the narrow context filled in
 * one place (src/calls/pg_algo.c). Algorithms never see braid_pg; everything
 * they need from it comes through here, as Gloo's algorithms see only a
 * context and a pair per peer. */
#ifndef BRAID_ALGO_CTX_H
#define BRAID_ALGO_CTX_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "braid.h"
#include "braid_transport.h"
#include "algo/coll.h"

struct braid_hier_topo;

#define BRAID_FP_BYTES 40 /* fingerprint message, sent before a collective's data */

/* Both calls of a mismatch found by this rank (fingerprints in their wire
 * form), kept so that the caller can tell every rank, not only the one
 * that found it (src/calls/refuse.c). */
typedef struct {
    int found;
    int peer;
    uint8_t mine[BRAID_FP_BYTES], theirs[BRAID_FP_BYTES];
} braid_mismatch_seen;

typedef struct braid_algo_ctx {
    int rank, size;
    size_t chunk_bytes;        /* pipeline chunk (BRAID_CHUNK_BYTES) */
    int timeout_ms;            /* per call; the deadline counts from the call's start */
    braid_algo algo;           /* configured all-reduce algorithm (BRAID_ALGO) */
    int wake_fd;               /* blocked waits poll it, so that abort is seen at once */
    const atomic_int *aborted; /* set by braid_pg_abort */
    const uint64_t *host_hash; /* [size] host identity per rank; NULL: unknown */

    /* Per-group state the algorithms keep between calls (executor only). */
    struct braid_hier_topo **hier_topo; /* made on first use */
    unsigned *algo_logged;              /* bit (1 << algo) once logged */
    uint64_t **p2p_seq;                 /* [2 * size] message counters, made on first use */

    /* The group behind the context, passed back to the callbacks. */
    void *owner;
    /* Connection to peer, connecting on first use. */
    braid_status (*conn)(void *owner, int peer, braid_conn **conn);
    /* Scratch buffer of at least bytes, owned by the group. */
    braid_status (*scratch)(void *owner, size_t bytes, void **buf);
    /* 1 when peer is joined by a device link (src/lifecycle/devlink.c). */
    int (*has_devlink)(void *owner, int peer);
    /* Just before each collective of a job runs (so after the one before
     * it in a group): the caller's work on its buffers, such as
     * multiplying a MULSUM input (src/calls/mulsum.c). *scratch, if set, is
     * freed after the run. NULL: none. */
    braid_status (*prepare)(void *owner, struct braid_coll *coll, void **scratch);
    /* Where the first mismatch with a peer's call is recorded; NULL: not kept. */
    braid_mismatch_seen *mismatch;
} braid_algo_ctx;

static inline braid_status braid__ctx_conn(const braid_algo_ctx *ctx, int peer, braid_conn **conn)
{
    return ctx->conn(ctx->owner, peer, conn);
}

static inline braid_status braid__ctx_scratch(const braid_algo_ctx *ctx, size_t bytes, void **buf)
{
    return ctx->scratch(ctx->owner, bytes, buf);
}

/* Post a send on conn, counting its bytes for braid_pg_stats, which reads
 * the total from any thread. */
static inline braid_status braid__conn_isend(braid_conn *conn, braid_req *req, const void *buf, size_t len)
{
    if (conn->bytes_sent)
        __atomic_fetch_add(conn->bytes_sent, (uint64_t)len, __ATOMIC_RELAXED);
    return conn->ops->isend(conn, req, buf, len);
}

#endif
