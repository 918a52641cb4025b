/* Process group internals shared by pg.c, work.c and the algorithms. */
#ifndef BRAID_PG_H
#define BRAID_PG_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "braid.h"
#include "clock.h"
#include "braid_transport.h"
#include "bootstrap/store.h"
#include "algo/coll.h"
#include "transports/registry.h"

struct braid_work {
    braid_coll coll;
    struct braid_work *next;    /* queue link */
    braid_pg *pg;
    atomic_int done;            /* set once, under pg->mu, with status */
    atomic_int refs;            /* caller + executor; the last one frees */
    int64_t submit_ms;          /* braid__now_ms() when queued */
    int64_t start_ms;           /* when the executor began it; 0 while queued (under pg->mu) */
    braid_status status;
    char error_text[512];
    uint64_t trace_id;          /* its flight-recorder record (trace.h); 0: none */
};

/* braid_pg.magic: a live group, and one braid_pg_destroy has released.
 * A destroyed group's struct is kept (emptied, on a list) rather than
 * freed, so a later call through a stale handle reads defined memory and
 * fails with BRAID_ERR_INVALID_ARG instead of using freed memory. */
#define BRAID_PG_MAGIC_LIVE 0x62726169642d7067ull /* "braid-pg" */
#define BRAID_PG_MAGIC_DEAD 0x64657374726f7964ull /* "destroyd" */

struct braid_pg {
    _Atomic uint64_t magic;
    struct braid_pg *next_destroyed;
    int rank;
    int size;
    int local_rank;             /* among the ranks on this host (see braid.h) */
    int local_size;
    braid_transport_ctx ctx;
    int timeout_ms;
    int init_timeout_ms;        /* until every rank has reached the store (BRAID_INIT_TIMEOUT_MS) */
    int64_t init_deadline;      /* while the group forms: when the init timeout ends (0 after) */
    size_t chunk_bytes;
    braid_algo algo;
    int checksum;               /* CRC32C every message (transports/checksum/checksum.c); same on every rank */

    /* Rendezvous: the store (rank 0 also serves it) and peer addresses. */
    braid_store_server *store_server;
    braid_store *store;
    /* Transports: the group's (`transport`: every pair no other serves)
     * and those that serve some pairs beside it (shm), by id
     * (transports/registry.h): listeners[id] (NULL: unused) and addr[p][id],
     * rank p's address on it ("" where p does not listen on it). link[p]:
     * the id that serves peer p, chosen once, after the address exchange,
     * by braid__transport_for_peer. */
    const braid_transport_ops *transport;
    braid_listener *listeners[BRAID_TRANSPORT_ID_COUNT];
    char (*addr)[BRAID_TRANSPORT_ID_COUNT][BRAID_ADDR_MAX];
    unsigned char *link;
    /* host_hash[p]: hash of rank p's host identity (the one that decides
     * same-host pairs, with or without a local transport), for
     * topology-aware algorithms; hier_topo is algo/hier_allreduce.c's view
     * of it, made on first use; algo_logged: bit (1 << algo) once the
     * tuner has logged its first choice of algo. */
    uint64_t *host_hash;
    struct braid_hier_topo *hier_topo;
    unsigned algo_logged;
    braid_conn **conns;         /* [size]; NULL until first use */
    /* cuda_ipc links to same-host ring neighbours for device all-reduces
     * (devlink.c); NULL when there are none. */
    struct braid_devlinks *devlinks;
    /* Kernel-driven device collectives (cuda/device_coll_group.h); NULL
     * when this rank has no region. */
    struct braid_devcoll_group *devcoll;
    int devcoll_agreed;    /* the group decided on device collectives */
    int devcoll_no_context; /* this rank had no CUDA context at creation: decide at the first device call */

    /* Failure state: sticky first error, abort flag and a wake-up fd that
     * blocked progress loops poll, so abort is seen at once. */
    atomic_int aborted;
    atomic_int error;           /* braid_status; BRAID_OK while healthy */
    char error_text[512];
    int wake_fd;

    /* Staging memory for the algorithms, grown on demand (executor only). */
    void *scratch;
    size_t scratch_bytes;

    /* Executor: collectives run one at a time in issue order, either inline
     * in a blocking caller or on the progress thread. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* Per kind of call (braid_coll_kind): updated under mu at the end of
     * each call (src/lifecycle/work.c). Bytes sent per transport id: added
     * atomically as the algorithms post them (braid__conn_isend, through
     * each connection's bytes_sent). Both read by braid_pg_stats. */
    struct braid_kind_counters {
        uint64_t calls, failed, bytes, total_ns, max_ns;
    } kind_stats[BRAID_COLL_KIND_COUNT];
    uint64_t sent_by_transport[BRAID_TRANSPORT_ID_COUNT];
    /* The flight recorder (trace.h; NULL: off), under mu; trace_dumped:
     * the group's first failure was written out. */
    struct braid_trace *trace;
    int trace_dumped;
    braid_work *queue_head, *queue_tail;
    int busy;
    int stopping;
    uint64_t next_seq;
    pthread_t thread;
    int thread_started;

    /* Group recording (group.c, under mu) and point-to-point message
     * counters (algo/p2p.c, executor only); both made on first use. */
    struct braid_group *group;
    uint64_t *p2p_seq;          /* [2 * size]: sends to, receives from each peer */

    /* CUDA staging (src/calls/hmem.h): pinned buffers and streams, made by the
     * first call on device memory. */
    struct braid_hmem *hmem;

    /* Group shrink (pg_shrink.c): this rank's shrink socket, every rank's
     * shrink address and a copy of the config; made in braid_pg_init. */
    struct braid_shrink *shrink;
};

/* Connection to peer, connecting or accepting on first use. */
braid_status braid__pg_conn(braid_pg *pg, int peer, braid_conn **conn);

/* Scratch buffer of at least bytes, owned by the group. */
braid_status braid__pg_scratch(braid_pg *pg, size_t bytes, void **buf);

/* Mark the group broken with the current thread's error (first one wins)
 * and close every connection, so peers blocked on us fail fast too. */
void braid__pg_fail(braid_pg *pg, braid_status status);

/* BRAID_ERR_INVALID_ARG naming op when pg is NULL, destroyed or not a
 * group handle; BRAID_OK for a live group. Async-signal-safe when quiet
 * (no error text is written). */
braid_status braid__pg_check_handle(const braid_pg *pg, const char *op);
braid_status braid__pg_check_handle_quiet(const braid_pg *pg);

/* Returns the status to report when the group is unusable, else BRAID_OK. */
braid_status braid__pg_check_usable(braid_pg *pg, const char *op_name);

/* Work queue (work.c). Takes over what the job owns (a group's calls),
 * whatever it returns. */
braid_status braid__work_submit(braid_pg *pg, const braid_coll *coll, braid_work **work);
/* A work handle that is already done, with BRAID_OK: for calls whose
 * completion is ordered on a CUDA stream instead (device collectives). */
braid_status braid__work_completed(braid_pg *pg, braid_work **work);
braid_status braid__work_start_thread(braid_pg *pg);
/* Initialize pg->cv on the monotonic clock, which braid_wait's deadlines
 * are measured on (a wall-clock step must not stretch or cut them). */
void braid__work_cond_init(braid_pg *pg);
void braid__work_stop_thread(braid_pg *pg);

/* Groups (group.c). A call made inside an open group on its opening
 * thread is recorded instead of queued: returns 1 with *st set. Caller
 * holds pg->mu. */
int braid__group_capture_locked(braid_pg *pg, const braid_coll *coll, braid_work **work, braid_status *st);
/* braid_group_end, for a group that runs public call `call` (exchange.c:
 * BRAID_COLL_ALLTOALL...; 0 for braid_group_end), which a peer's refusal
 * of it names (refuse.h). */
braid_status braid__group_end(braid_pg *pg, braid_coll_kind call, braid_work **work);
/* 1 when the calling thread has a group open on pg. */
int braid__group_open_here(braid_pg *pg);
/* Sequence numbers a job takes: one per collective it contains (sends and
 * receives take none: only two ranks see them). */
uint64_t braid__coll_seqs(const braid_coll *coll);
/* Free what a job owns (a group's recorded calls); every job copy that the
 * executor drops goes through here once. */
void braid__coll_release(braid_coll *coll);
/* Free the group state and message counters (pg destruction). */
void braid__group_release(braid_pg *pg);

/* Run one collective on the calling thread (pg_algo.c, then algo/dispatch.c). */
braid_status braid__coll_run(braid_pg *pg, braid_coll *coll);

/* How long a wait of the group's start may take: the group timeout,
 * and no longer than the init timeout has left while the group forms. */
static inline int braid__pg_init_wait_ms(const braid_pg *pg)
{
    if (pg->init_deadline == 0)
        return pg->timeout_ms;
    int64_t left = pg->init_deadline - braid__now_ms();
    if (left < 1)
        left = 1;
    return left < pg->timeout_ms ? (int)left : pg->timeout_ms;
}

#endif
