/*
 * braid — gradient communication for data-parallel training.
 *
 * Public API. Everything here is stable across minor versions; structures
 * that may grow start with a `size` field that callers set with
 * BRAID_CONFIG_INIT / sizeof.
 */
#ifndef BRAID_H
#define BRAID_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(BRAID_BUILDING) && defined(__GNUC__)
#define BRAID_API __attribute__((visibility("default")))
#else
#define BRAID_API
#endif

#define BRAID_VERSION_MAJOR 0
#define BRAID_VERSION_MINOR 1
#define BRAID_VERSION_PATCH 0

/** Status returned by every fallible call; braid_last_error() has the detail. */
typedef enum {
    BRAID_OK = 0,
    BRAID_ERR_INVALID_ARG,  /**< caller passed a bad argument */
    BRAID_ERR_SYSTEM,       /**< a system call failed (errno in the message) */
    BRAID_ERR_TIMEOUT,      /**< a blocking wait passed its timeout */
    BRAID_ERR_PEER,         /**< a peer closed, died or sent something invalid */
    BRAID_ERR_MISMATCH,     /**< ranks called different collectives */
    BRAID_ERR_AUTH,         /**< a connection failed the job-secret handshake */
    BRAID_ERR_UNSUPPORTED,  /**< not available in this build or on this machine */
    BRAID_ERR_CUDA,         /**< a CUDA runtime call failed */
    BRAID_ERR_ABORTED,      /**< braid_pg_abort() was called */
    BRAID_ERR_INTERNAL,     /**< a bug in braid: please report it */
    BRAID_ERR_NO_MEMORY,    /**< an allocation failed */
    BRAID_ERR_CORRUPT,      /**< received data failed its checksum (braid_config.checksum) */
    BRAID_STATUS_COUNT
} braid_status;

/** Element types. Values are part of the ABI. */
typedef enum {
    BRAID_F32 = 0,
    BRAID_F64,
    BRAID_F16,
    BRAID_BF16,
    BRAID_I8,
    BRAID_U8,
    BRAID_I32,
    BRAID_I64,
    BRAID_U32,
    BRAID_U64,
    BRAID_DTYPE_COUNT
} braid_dtype;

/** Reduction operators. AVG is SUM divided by the group size (integer
 *  types: truncating division). MULSUM is a sum of each rank's input
 *  multiplied by that rank's scalar (NCCL's ncclRedOpCreatePreMulSum): it
 *  takes the scalar, so only the *_mulsum calls accept it; the plain calls
 *  refuse it with BRAID_ERR_INVALID_ARG. */
typedef enum {
    BRAID_SUM = 0,
    BRAID_PROD,
    BRAID_MIN,
    BRAID_MAX,
    BRAID_AVG,
    BRAID_MULSUM,
    BRAID_OP_COUNT
} braid_op;

/** Collective algorithm selection (braid_config.algo, BRAID_ALGO). */
typedef enum {
    BRAID_ALGO_AUTO = 0, /**< tuner picks by size and group size */
    BRAID_ALGO_RING,     /**< chunked, pipelined ring */
    BRAID_ALGO_RECURSIVE_DOUBLING, /**< latency-bound small messages */
    BRAID_ALGO_HIER,     /**< multi-host all-reduce: reduce-scatter within each host, a ring per
                              local rank across hosts, all-gather within each host; falls back to
                              the ring (with a warning) on one host or one rank per host */
    BRAID_ALGO_COUNT
} braid_algo;

#define BRAID_UNIQUE_ID_BYTES 128

/** Rendezvous handle made by rank 0 and handed to every rank (like
 *  ncclUniqueId): rank 0's store address plus a random 128-bit job secret.
 *  Treat it as a credential. */
typedef struct {
    char internal[BRAID_UNIQUE_ID_BYTES];
} braid_unique_id_t;

/** Process-group configuration. Zero/NULL fields take the environment
 *  value (BRAID_*), then the built-in default. Values out of range
 *  (a negative timeout_ms, nsocks outside 0..16, checksum outside -1..1,
 *  an unknown algo) make braid_pg_init fail with BRAID_ERR_INVALID_ARG. */
typedef struct {
    size_t size;             /**< sizeof(braid_config): set by BRAID_CONFIG_INIT */
    int timeout_ms;          /**< every blocking wait; 0: BRAID_TIMEOUT_MS or 300000 */
    int nsocks;              /**< TCP sockets per peer; 0: BRAID_NSOCKS or default */
    size_t chunk_bytes;      /**< pipeline chunk; 0: BRAID_CHUNK_BYTES or default */
    braid_algo algo;         /**< 0: BRAID_ALGO or tuner */
    const char *transports;  /**< "tcp,verbs,..."; NULL: BRAID_TRANSPORT or auto */
    const char *socket_ifname; /**< NULL: BRAID_SOCKET_IFNAME or route to the store */
    int checksum;            /**< CRC32C of every message between ranks, checked before use (a mismatch
                                  is BRAID_ERR_CORRUPT): 1 on, -1 off, 0: BRAID_CHECKSUM (default off).
                                  Every rank must agree; braid_pg_init fails otherwise */
    int init_timeout_ms;     /**< how long braid_pg_init waits for every rank to reach rank 0's store;
                                  0: BRAID_INIT_TIMEOUT_MS or 1800000 (30 min, torch's default
                                  process-group timeout). Rank 0 logs the missing ranks meanwhile */
} braid_config;

#define BRAID_CONFIG_INIT { sizeof(braid_config), 0, 0, 0, BRAID_ALGO_AUTO, NULL, NULL, 0, 0 }

typedef struct braid_pg braid_pg;             /**< opaque process group */
typedef struct braid_work braid_work;         /**< opaque async handle */
typedef struct braid_bucketer braid_bucketer; /**< opaque DDP gradient bucketer */

/*
 * Threads and lifetimes.
 *
 * Threads: the library is thread-safe across groups (calls on different
 * groups may run at once on any threads). On one group:
 *  - braid_pg_rank, _size, _local_rank, _local_size and braid_pg_error may
 *    run on any thread at any time while the group is alive;
 *  - braid_pg_abort may run on any thread, also in a signal handler, while
 *    another thread is blocked in a call on the group: that call returns
 *    BRAID_ERR_ABORTED;
 *  - collectives, sends and receives run one at a time in the order the
 *    group receives them, and every rank must issue them in the same order.
 *    Issue them from one thread at a time, or order the threads yourself:
 *    otherwise the order is up to the scheduler and ranks disagree on it
 *    (BRAID_ERR_MISMATCH);
 *  - braid_group_start/end are per thread (see there); a bucketer is used
 *    by one thread at a time;
 *  - braid_wait, braid_test and braid_work_free on a work handle may run on
 *    any thread, one at a time per handle;
 *  - braid_last_error is per thread: it describes the calling thread's last
 *    failed call, whatever other threads do.
 *
 * Lifetimes:
 *  - a group lives from a successful braid_pg_init/_init_env/_shrink until
 *    braid_pg_destroy, which must not run at the same time as any other call
 *    on that group (braid_pg_abort included). After it returns the handle is
 *    dead and must not be used. braid detects such use without undefined
 *    behaviour: the destroyed group's memory is emptied but kept (about
 *    1 KiB for the life of the process, never reused for another group),
 *    so every call through the dead handle, a second
 *    braid_pg_destroy included, returns BRAID_ERR_INVALID_ARG saying the
 *    group was destroyed (braid_pg_rank and the other int queries return
 *    -1). Two threads destroying one group at once: exactly one succeeds;
 *  - a work handle stays valid until braid_work_free, also after its group
 *    is destroyed (destroy ends pending work with BRAID_ERR_ABORTED first),
 *    and must be freed exactly once;
 *  - buffers passed to a call must stay valid until it completes (for an
 *    asynchronous call: until braid_wait or braid_test reports it done). A
 *    rank that frees a buffer under a pending call is a program error; a
 *    peer that fails and frees its buffers is a failure, reported as
 *    BRAID_ERR_PEER naming it;
 *  - buffers may have any alignment: element access is defined for every
 *    address (aligned buffers are faster);
 *  - a bucketer must be destroyed before its group.
 */

/** Name of a status code ("BRAID_ERR_PEER"). Never NULL. */
BRAID_API const char *braid_status_string(braid_status status);

/** Detail text of the last failure on this thread: names the rank, peer, op
 *  and cause. Empty string when nothing failed. */
BRAID_API const char *braid_last_error(void);

/** Size in bytes of one element of dtype, or 0 for an invalid dtype. */
BRAID_API size_t braid_dtype_size(braid_dtype dtype);

/** Library version as MAJOR*10000 + MINOR*100 + PATCH. */
BRAID_API int braid_version(void);

/** Create a unique id on rank 0: binds the rendezvous port now (so that the
 *  id stays valid across fork) and draws a random job secret.
 *  The address is 127.0.0.1 (a job on one host) unless BRAID_SOCKET_IFNAME
 *  names an interface, whose address it takes; set that for ranks on other
 *  hosts. The port is a free one the kernel picks. BRAID_STORE_ADDR=host:port
 *  overrides both (it is then bound by rank 0 at braid_pg_init). */
BRAID_API braid_status braid_unique_id(braid_unique_id_t *id);

/** Join a process group of `size` ranks as `rank`. Blocks until every rank
 *  has joined or the timeout passes. cfg may be NULL. */
BRAID_API braid_status braid_pg_init(braid_pg **pg, int rank, int size, const braid_unique_id_t *id,
                                     const braid_config *cfg);

/** Join using the launcher's environment: torchrun (RANK, WORLD_SIZE,
 *  MASTER_ADDR, MASTER_PORT), Open MPI (OMPI_COMM_WORLD_RANK/SIZE) or Slurm
 *  (SLURM_PROCID/SLURM_NTASKS). MASTER_ADDR names rank 0's host; mpirun and
 *  srun do not set it (nor MASTER_PORT): export both on every rank. braid's
 *  store listens on MASTER_PORT+1 (torchrun's own store holds MASTER_PORT;
 *  MASTER_PORT defaults to 29500), or on BRAID_STORE_PORT when set. Rank 0
 *  waits up to BRAID_INIT_TIMEOUT_MS for the others, logging the missing
 *  ranks. The job secret is BRAID_JOB_SECRET when set (32 hex digits), else
 *  derived from the launch variables under the user's private key file
 *  (BRAID_KEY_FILE, default ~/.config/braid/job.key, made on first use), so
 *  no other user can compute it; without a usable key file, from the launch
 *  variables alone, with a warning on every rank. A rank whose WORLD_SIZE
 *  (or checksum setting, job id, secret) differs makes every rank fail with
 *  BRAID_ERR_MISMATCH naming it. */
BRAID_API braid_status braid_pg_init_env(braid_pg **pg, const braid_config *cfg);

/** Abort the group from any thread, also from a signal handler: every
 *  pending and future call on it returns BRAID_ERR_ABORTED. */
BRAID_API braid_status braid_pg_abort(braid_pg *pg);

/** Release the group. Pending work ends with BRAID_ERR_ABORTED first. NULL
 *  is a no-op; a handle already destroyed gives BRAID_ERR_INVALID_ARG (see
 *  "Threads and lifetimes" above). */
BRAID_API braid_status braid_pg_destroy(braid_pg *pg);

BRAID_API int braid_pg_rank(const braid_pg *pg);
BRAID_API int braid_pg_size(const braid_pg *pg);
/* Ranks of this group on this host (same host identity, see BRAID_HOST_ID)
 * and this rank's place among them: the launcher's LOCAL_RANK
 * (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID) for a group made by
 * braid_pg_init_env, else its position in rank order. Use it to pick a GPU. */
BRAID_API int braid_pg_local_rank(const braid_pg *pg);
BRAID_API int braid_pg_local_size(const braid_pg *pg);

/** Name of the transport this rank uses to reach peer ("shm", "tcp",
 *  "verbs"; "self" for its own rank), NULL for a bad argument. */
BRAID_API const char *braid_pg_peer_transport(const braid_pg *pg, int peer);

/** First error that broke the group (BRAID_OK while healthy). */
BRAID_API braid_status braid_pg_error(const braid_pg *pg);

/* ---- statistics -------------------------------------------------------- */

/** One kind of call's counters since the group was made. */
typedef struct {
    const char *name;  /* "allreduce", "broadcast", ..., "send", "recv", "alltoall", ...;
                        * "group": a braid_group_end job of other calls */
    uint64_t calls;    /* calls the group's executor ran: host calls and staged device calls. Not counted:
                        * a call refused at entry (bad argument); device-collective kernels and a device
                        * call on a group of one, which run on the caller's stream alone */
    uint64_t failed;   /* of these, calls that ended in an error (a refusal this rank told its peers
                        * counts here) */
    uint64_t bytes;    /* sum over calls of count times the element size (a group: over its calls;
                        * alltoall, gather, scatter: over the sends they run) */
    uint64_t total_ns; /* sum over calls of the time from when each started running to its end */
    uint64_t max_ns;   /* the longest such time */
} braid_call_stats;

/** Bytes this rank sent over one transport since the group was made. */
typedef struct {
    const char *name;    /* "tcp", "shm", "verbs", "cuda_ipc" */
    int peers;           /* peers this rank reaches over it */
    uint64_t bytes_sent; /* posted on its connections by braid's algorithms (data, fingerprints), counted
                          * as they are posted; not what device-collective kernels move */
} braid_transport_stats;

#define BRAID_STATS_MAX_KINDS 16
#define BRAID_STATS_MAX_TRANSPORTS 8

/** A group's statistics (braid_pg_stats). */
typedef struct {
    size_t size;    /* the caller sets sizeof(braid_stats) */
    int nkinds;     /* kinds[0..nkinds): the kinds with calls, in braid's order */
    braid_call_stats kinds[BRAID_STATS_MAX_KINDS];
    int ntransports; /* transports[0..ntransports): those serving a peer */
    braid_transport_stats transports[BRAID_STATS_MAX_TRANSPORTS];
} braid_stats;

/** Write the group's flight recorder (its last BRAID_TRACE_BUFFER calls:
 *  kind, bytes, dtype, op, root or peer, memory, algorithm, transport,
 *  state and times) to path, or with path NULL into BRAID_TRACE_DIR (a
 *  file per rank and dump), or to stderr when that is unset. Every rank
 *  also writes it at the group's first failed call. scripts/braid-trace-merge
 *  puts the ranks' files side by side. BRAID_ERR_INVALID_ARG when the
 *  recorder is off (BRAID_TRACE_BUFFER=0). */
BRAID_API braid_status braid_pg_trace_dump(braid_pg *pg, const char *path);

/** Fill *stats (stats->size set by the caller) with the group's per-kind
 *  call counters and per-transport bytes. Cheap, and safe from any thread
 *  while calls run; a call still running is not counted yet. */
BRAID_API braid_status braid_pg_stats(const braid_pg *pg, braid_stats *stats);

/** Shrink a group after a rank failure (MPI_Comm_shrink, ncclCommShrink).
 *  Every surviving rank calls it on its handle of the old group, which may
 *  be broken (BRAID_ERR_PEER, BRAID_ERR_TIMEOUT), aborted or healthy. The
 *  survivors agree on one set of ranks and each gets the same smaller group
 *  in *new_pg: ranks renumbered densely in old-rank order, a fresh job
 *  secret and group tag, the old group's configuration. A healthy group
 *  yields a group of every rank. The lowest live rank coordinates; a rank
 *  counts as dead when its process is gone (connections to it are refused).
 *  A rank that is alive but has not called braid_pg_shrink within half the
 *  timeout is left out (it gets BRAID_ERR_TIMEOUT if it calls later). Fails
 *  with BRAID_ERR_TIMEOUT, never hangs, when a rank below every survivor is
 *  alive but silent (stopped, unreachable host), and with BRAID_ERR_PEER or
 *  BRAID_ERR_TIMEOUT when a member dies during the call: call it again.
 *  timeout_ms: -1 for the group's timeout. The old group stays valid until
 *  braid_pg_destroy, which the caller does once it is done with it. One
 *  call at a time per group. See docs/RELIABILITY.md, "Group shrink". */
BRAID_API braid_status braid_pg_shrink(braid_pg *pg, int timeout_ms, braid_pg **new_pg);

/** All-reduce `count` elements of `send` into `recv` on every rank.
 *  send == recv is in place. Buffers: host memory, or (CUDA builds) CUDA
 *  device or managed memory on the calling thread's current device.
 *  cuda_stream: NULL for host memory or the legacy default stream; a
 *  device call is ordered after the work queued on it before the call.
 *  work: NULL blocks until done (the result in place); else returns a
 *  handle at once, and later work on cuda_stream sees the result. */
BRAID_API braid_status braid_allreduce(braid_pg *pg, const void *send, void *recv, size_t count,
                                       braid_dtype dtype, braid_op op, void *cuda_stream,
                                       braid_work **work);

/** Broadcast `count` elements of buf from `root` to every rank. */
BRAID_API braid_status braid_broadcast(braid_pg *pg, void *buf, size_t count, braid_dtype dtype,
                                       int root, void *cuda_stream, braid_work **work);

/** Block until work completes or timeout_ms passes, counted from this
 *  call on the monotonic clock. -1: the group's timeout (BRAID_TIMEOUT_MS)
 *  counted from when the collective started (from when it was issued
 *  while it is still queued), not re-armed by each call, plus a second of
 *  grace so that the collective's own BRAID_ERR_TIMEOUT, with its detail,
 *  comes first. Returns the collective's status, or BRAID_ERR_TIMEOUT when
 *  the wait ran out (the work is still pending then). */
BRAID_API braid_status braid_wait(braid_work *work, int timeout_ms);

/** Non-blocking completion check: *done = 1 when finished; returns the
 *  collective's status once done, BRAID_OK while pending. */
BRAID_API braid_status braid_test(braid_work *work, int *done);

/** Release a handle. A handle freed before completion still completes. */
BRAID_API void braid_work_free(braid_work *work);

/* ---- more collectives, point-to-point, groups ------------------------ */
/* Same conventions as braid_allreduce: host or CUDA device buffers, a
 * cuda_stream for device calls, work NULL to block. Every rank must make
 * the same calls in the same order (sends and receives excepted); a
 * mismatch fails with BRAID_ERR_MISMATCH naming both calls. Calls inside
 * braid_group_start/end keep their streams: the group waits for each and,
 * with a work handle, holds each until all of it is done (docs/CUDA.md). */

/** Reduce `count` elements of `send` over all ranks into `recv` on `root`
 *  (a pipelined chain ending at the root). recv is only written, and only
 *  needs to be valid, on the root; send == recv there is in place. AVG
 *  divides by the group size once, in the root's final combine. */
BRAID_API braid_status braid_reduce(braid_pg *pg, const void *send, void *recv, size_t count, braid_dtype dtype,
                                    braid_op op, int root, void *cuda_stream, braid_work **work);

/* ---- pre-multiplied sum (NCCL's PreMulSum) ---------------------------- */
/* As braid_allreduce, braid_reduce and braid_reduce_scatter with op SUM,
 * except that each rank's input is first multiplied by *scalar, one
 * element of dtype read at the call (each rank may pass its own value).
 * Integers: exact, wrapping modulo 2^bits. f32/f64: each product rounded
 * once, then summed as SUM does. f16/bf16: the product is computed in f32
 * (exact) and rounded once to the dtype, then summed as SUM does. Ranks
 * must all call the same *_mulsum function (a plain SUM on another rank
 * is BRAID_ERR_MISMATCH, or BRAID_ERR_PEER on a rank that only saw it
 * fail). A NULL scalar is BRAID_ERR_INVALID_ARG, refused to the peers as
 * a plain call's bad argument is. Device buffers are staged and scaled in
 * host memory. The input is scaled into recv (allreduce) or a temporary
 * copy when the collective runs, so send is never written. */

BRAID_API braid_status braid_allreduce_mulsum(braid_pg *pg, const void *send, void *recv, size_t count,
                                              braid_dtype dtype, const void *scalar, void *cuda_stream,
                                              braid_work **work);

BRAID_API braid_status braid_reduce_mulsum(braid_pg *pg, const void *send, void *recv, size_t count,
                                           braid_dtype dtype, const void *scalar, int root, void *cuda_stream,
                                           braid_work **work);

BRAID_API braid_status braid_reduce_scatter_mulsum(braid_pg *pg, const void *send, void *recv, size_t recvcount,
                                                   braid_dtype dtype, const void *scalar, void *cuda_stream,
                                                   braid_work **work);

/** Gather `sendcount` elements from every rank into recv, which holds
 *  size * sendcount elements in rank order (ring, pipelined, received in
 *  place). In place when send == recv + rank * sendcount elements. */
BRAID_API braid_status braid_allgather(braid_pg *pg, const void *send, void *recv, size_t sendcount,
                                       braid_dtype dtype, void *cuda_stream, braid_work **work);

/** Reduce send (size * recvcount elements) over all ranks and leave block
 *  r (elements [r * recvcount, (r+1) * recvcount)) of the result in recv on
 *  rank r (ring, pipelined). In place when recv == send + rank * recvcount
 *  elements. AVG as in braid_allreduce. */
BRAID_API braid_status braid_reduce_scatter(braid_pg *pg, const void *send, void *recv, size_t recvcount,
                                            braid_dtype dtype, braid_op op, void *cuda_stream, braid_work **work);

/** Send `count` elements to rank `peer`, which must post a matching
 *  braid_recv (same count and dtype). Messages between two ranks match in
 *  call order, as in NCCL. Completes once the data has been handed to the
 *  transport. peer may be the caller only inside a group that also
 *  receives from itself (a copy). Outside a group, a send or receive this
 *  rank refuses (NULL buf, bad peer...) is told to the peers and breaks
 *  the group, as a refused collective does (docs/RELIABILITY.md). */
BRAID_API braid_status braid_send(braid_pg *pg, const void *buf, size_t count, braid_dtype dtype, int peer,
                                  void *cuda_stream, braid_work **work);

/** Receive `count` elements from rank `peer` into buf (see braid_send). */
BRAID_API braid_status braid_recv(braid_pg *pg, void *buf, size_t count, braid_dtype dtype, int peer,
                                  void *cuda_stream, braid_work **work);

/** All-to-all: send holds size blocks of `count` elements; block p goes to
 *  rank p, and the block from rank p lands at recv + p * count elements.
 *  send and recv must not overlap (there is no in-place form). */
BRAID_API braid_status braid_alltoall(braid_pg *pg, const void *send, void *recv, size_t count, braid_dtype dtype,
                                      void *cuda_stream, braid_work **work);

/** Gather `count` elements of send from every rank into recv on `root`:
 *  rank p's land at recv + p * count elements. recv is only used on the
 *  root; in place there when send == recv + root * count elements. */
BRAID_API braid_status braid_gather(braid_pg *pg, const void *send, void *recv, size_t count, braid_dtype dtype,
                                    int root, void *cuda_stream, braid_work **work);

/** Scatter: rank p receives into recv the block send + p * count elements
 *  of the root's send, which is only used on the root; in place there when
 *  recv == send + root * count elements. */
BRAID_API braid_status braid_scatter(braid_pg *pg, const void *send, void *recv, size_t count, braid_dtype dtype,
                                     int root, void *cuda_stream, braid_work **work);

/** Open a group on pg for the calling thread (NCCL's ncclGroupStart).
 *  Until the matching braid_group_end, this thread's calls on pg (any
 *  collective, send or receive, each with work = NULL) are only checked and
 *  recorded: their buffers must stay valid until the group completes.
 *  Groups nest; other threads' calls on pg are not affected. */
BRAID_API braid_status braid_group_start(braid_pg *pg);

/** Close the group; the outermost end runs the recorded calls as one job:
 *  in issue order, each run of consecutive sends and receives progressed
 *  together, so exchanging with several peers at once cannot deadlock.
 *  work: NULL blocks until done, else receives the group's handle (NULL
 *  after an inner end). Recorded collectives count as separate calls for
 *  matching, so ranks may group them differently. */
BRAID_API braid_status braid_group_end(braid_pg *pg, braid_work **work);

/* ---- DDP bucketer ---------------------------------------------------- */

/** Create a bucketer on pg. bucket_bytes 0: 25 MiB; first_bucket_bytes 0:
 *  1 MiB (PyTorch DDP defaults). */
BRAID_API braid_status braid_bucketer_create(braid_bucketer **b, braid_pg *pg, size_t bucket_bytes,
                                             size_t first_bucket_bytes);

/** Register a gradient buffer (in model order). Buckets are formed in
 *  reverse registration order when the first ready() is called. */
BRAID_API braid_status braid_bucketer_add(braid_bucketer *b, void *grad, size_t count, braid_dtype dtype,
                                          int *param_id);

/** Compress f32 buckets to dtype (BRAID_F16 or BRAID_BF16) on the wire;
 *  BRAID_F32 turns compression off. Call before the first ready(). Each
 *  rank sends grad / size (divided in f32, rounded once to dtype) and the
 *  wire sums them, so partial sums stay within rounding of the largest
 *  gradient (as in torch's fp16_compress_hook): f16 does not overflow
 *  where the sum over ranks would. */
BRAID_API braid_status braid_bucketer_set_compression(braid_bucketer *b, braid_dtype wire_dtype);

/** Mark a gradient as computed; launches its bucket's all-reduce once the
 *  bucket is complete. */
BRAID_API braid_status braid_bucketer_ready(braid_bucketer *b, int param_id);

/** Wait for every bucket: afterwards every gradient holds the average over
 *  ranks, in place. Resets for the next step. */
BRAID_API braid_status braid_bucketer_finish(braid_bucketer *b);

/** Number of buckets (valid after the first ready()). */
BRAID_API int braid_bucketer_bucket_count(const braid_bucketer *b);

BRAID_API void braid_bucketer_destroy(braid_bucketer *b);

#ifdef __cplusplus
}
#endif
#endif /* BRAID_H */
