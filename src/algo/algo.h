/* Helpers shared by the collective algorithms. */
#ifndef BRAID_ALGO_H
#define BRAID_ALGO_H

#include <stdint.h>

#include "algo_ctx.h"

/* State every algorithm carries: the group's context, the deadline and a
 * name for error messages. */
typedef struct {
    const braid_algo_ctx *ctx;
    const braid_coll *coll;
    int64_t deadline_ms;
    const char *name;        /* "allreduce", "broadcast" */
    /* Waits on links of several transports (common.c): the current idle
     * spell spins until spin_until_us; last_wait_us is when the previous
     * wait returned, to tell a new spell from a continuing one. */
    int64_t spin_until_us, last_wait_us;
    /* The latest peer fingerprint being received, kept here so that a
     * failure can still be explained by it (braid__fp_explain). */
    struct {
        braid_req req;
        uint8_t theirs[BRAID_FP_BYTES];
        int peer;
        int posted;
    } fp_in;
} braid_algo_run;

void braid__algo_run_init(braid_algo_run *run, const braid_algo_ctx *ctx, const braid_coll *coll);


/* Block until some connection may progress, honouring abort and the
 * deadline; `waiting_on` names the peer for the timeout message. */
braid_status braid__algo_wait(braid_algo_run *run, braid_conn **conns, int nconns, int waiting_on);

/* Non-blocking test of a request; transport errors get the op name. */
braid_status braid__algo_test(braid_algo_run *run, braid_req *req, int *done);

/* Blocking exchange with one peer: send sbuf and receive rbuf (either may
 * be empty: len 0 skips it). With fp set, fingerprints are exchanged first
 * and the peer's is checked before any data is accepted. */
braid_status braid__algo_sendrecv(braid_algo_run *run, int send_peer, const void *sbuf, size_t slen,
                                  int recv_peer, void *rbuf, size_t rlen, int fp);

/* Post the receive of peer's fingerprint into run->fp_in, and test it:
 * *checked = 1 once it arrived and matches this call. */
braid_status braid__fp_recv(braid_algo_run *run, braid_conn *conn, int peer);
braid_status braid__fp_poll(braid_algo_run *run, int *checked);

/* Turn a failure into BRAID_ERR_MISMATCH when the peer's fingerprint did
 * arrive and shows a different call (e.g. the transport saw the peer's
 * data not fit ours before the algorithm looked): the message then names
 * both calls. Other failures pass through. */
braid_status braid__fp_explain(braid_algo_run *run, braid_status st);

/* Encode this call's fingerprint, and compare a peer's against ours: a
 * mismatch is BRAID_ERR_MISMATCH naming both calls, and is recorded in
 * ctx->mismatch. */
void braid__fp_encode(const braid_coll *coll, uint8_t out[BRAID_FP_BYTES]);
braid_status braid__fp_check(braid_algo_run *run, int peer, const uint8_t theirs[BRAID_FP_BYTES]);

/* "#3 allreduce(count=4, f32, sum)" for a fingerprint from anywhere (a
 * peer's notice): 0, with nothing written, when it is not a valid one. */
int braid__fp_describe(const uint8_t fp[BRAID_FP_BYTES], char *buf, size_t cap);

/* Mark a fingerprint as the device ring's (cuda/device_ring.c). The flag is
 * not compared: a host rank may join the call; it tells a neighbour with
 * a device link (src/lifecycle/devlink.c) whether to move the data over it. */
void braid__fp_set_dring(uint8_t fp[BRAID_FP_BYTES]);
int braid__fp_dring(const uint8_t fp[BRAID_FP_BYTES]);

/* Ring neighbours joined by a device link also send their fingerprint
 * backwards (to prev), so that a device-ring rank learns, before it sends
 * any data, whether its next rank runs the device ring too. Every flat
 * ring all-reduce does it on such links, host or device. */
typedef struct {
    braid_req send_req, recv_req;
    uint8_t theirs[BRAID_FP_BYTES];
    int next;
    int sending, receiving; /* posted and not yet finished */
    int exchanged;          /* next's fingerprint arrived and matched */
} braid_fp_back;

/* Post the backward exchange (mine must live until it is done). */
braid_status braid__fp_back_start(braid_algo_run *run, braid_fp_back *b, const uint8_t mine[BRAID_FP_BYTES], int prev,
                                  int next);
/* *done once both halves finished (next's fingerprint checked). */
braid_status braid__fp_back_poll(braid_algo_run *run, braid_fp_back *b, int *done);

/* Elements [start, start+len) of segment i when count is split n ways as
 * evenly as possible (the first count % n segments get one more). */
static inline void braid__segment(size_t count, int n, int i, size_t *start, size_t *len)
{
    size_t base = count / (size_t)n, rem = count % (size_t)n, ui = (size_t)i;
    *start = ui * base + (ui < rem ? ui : rem);
    *len = base + (ui < rem ? 1 : 0);
}

/* One pass of the ring all-reduce (ring_allreduce.c) over part of the group:
 * the flat ring all-reduce is one pass over every rank and every step; the
 * hierarchical all-reduce runs its phases as passes over sub-rings. */
typedef struct {
    const int *members;     /* group ranks in ring order; NULL: 0..n-1 */
    int n, index;           /* ring size and this rank's position in it */
    const void *send;       /* input (read by step 0 and the reduces), count elements */
    void *recv;             /* result, count elements; may equal send */
    size_t count;
    /* count is cut into nshards even shards (braid__segment); ring segment
     * b carries shard (b - shard_shift) mod n, empty when that is >= nshards.
     * After the reduce-scatter steps, position i holds segment (i + 1) mod n. */
    int nshards, shard_shift;
    int first_step, end_step; /* steps [first, end) of 0..2n-3: reduce-scatter 0..n-2, all-gather n-1.. */
    int divisor;            /* the last reduce-scatter step divides AVG by this; 0: plain combine */
    int fp;                 /* send and check call fingerprints on both links first */
} braid_ring_pass;

braid_status braid__ring_pass(braid_algo_run *run, const braid_ring_pass *pass);

/* Algorithms. */
braid_status braid__ring_allreduce(braid_algo_run *run);
braid_status braid__hier_allreduce(braid_algo_run *run);
braid_status braid__rd_allreduce(braid_algo_run *run);
braid_status braid__chain_broadcast(braid_algo_run *run);
braid_status braid__tree_broadcast(braid_algo_run *run);
braid_status braid__chain_reduce(braid_algo_run *run);
braid_status braid__ring_allgather(braid_algo_run *run);
braid_status braid__ring_reduce_scatter(braid_algo_run *run);

/* Hosts of the group as the hierarchical all-reduce sees them (hosts told
 * apart by the identity that decides shared-memory pairs, BRAID_HOST_ID
 * overriding it); computed once per group. */
typedef struct braid_hier_topo {
    int nhosts;
    int min_local, max_local; /* fewest and most ranks on one host */
    int host;                 /* this rank's host, hosts numbered by their lowest rank */
    int local_index;          /* this rank's position among its host's ranks */
    int nlocal;               /* ranks on this host */
    int *local;               /* [nlocal] this host's ranks, ascending */
    int *cross;               /* [nhosts] rank at local_index on every host (valid when local_index < min_local) */
} braid_hier_topo;

/* The group's topology, or NULL when it is unknown or cannot be held.
 * Made on first use: call it from the executor, or while no call of the
 * group is in flight. */
const braid_hier_topo *braid__hier_topo(const braid_algo_ctx *ctx);

/* Tuner's choice for an all-reduce of count dtype elements (never AUTO;
 * a forced hierarchical all-reduce on a topology without one becomes RING). */
braid_algo braid__allreduce_algo(const braid_algo_ctx *ctx, size_t count, braid_dtype dtype);
/* The algorithm a job ran ("ring", "rd", "tree", "chain", "p2p", "group",
 * "staged"...), for the flight recorder: call it after the job ran (an
 * all-reduce's choice is made when it runs). size: the group's. */
const char *braid__coll_algo_name(const braid_coll *c, int size);

/* Largest message (bytes) that recursive doubling takes on n ranks; never
 * above BRAID_RD_MAX_CAP (dispatch.c explains the cap). */
#define BRAID_RD_MAX_CAP (4u << 20)
size_t braid__rd_max_bytes(int n);

/* Run one collective (or a recorded group) on the calling thread; the
 * caller breaks the group on failure (src/calls/pg_algo.c). */
braid_status braid__algo_coll_run(const braid_algo_ctx *ctx, braid_coll *coll);

/* The tuner's cost model: microseconds a call of this kind is expected to
 * take on pg's group size (dispatch.c). bytes: the message for all-reduce,
 * broadcast, reduce and send/receive; one rank's block for the others. */
double braid__estimate_us(const braid_pg *pg, braid_coll_kind kind, size_t bytes);

/* Sends and receives ops[0..nops) (SEND/RECV calls) progressed together;
 * messages between two ranks match in posting order (algo/p2p.c). */
braid_status braid__p2p_run(braid_algo_run *run, const braid_coll *ops, int nops);
/* Sends to and receives from this rank itself in ops[0..nops) pair up in
 * order with equal count and dtype; else BRAID_ERR_INVALID_ARG. */
braid_status braid__p2p_check_self(int rank, const braid_coll *ops, int nops);

#endif
