/*
 * Kernel-driven collectives between same-host device ranks: one kernel
 * launch per call on the caller's stream, no host work per chunk.
 *
 * Every rank owns one region of device memory that its peers have mapped
 * (cudaIpcOpenMemHandle, or a plain shared mapping in the host emulation):
 *
 *     [braid_devcoll_signal | slot 0: nblocks segments | slot 1: nblocks segments]
 *
 * Block b of a kernel works alone on its own range of the call's elements,
 * through segment b of its slots, and meets only block b of the peers'
 * kernels: it stages a chunk of its range into its segment (copy, or the
 * MULSUM premultiply), passes a barrier (it writes its barrier count into
 * every peer's arrive[b][rank] and waits until every peer wrote its own into
 * ours), then reads the peers' segments and reduces them in rank order 0..n-1
 * (so every rank gets the same bits) straight into the output:
 *   - one-shot: each rank reads all of every peer's chunk (small messages);
 *   - two-shot: each rank reduces shard `rank` of the chunk in place in its
 *     own segment, a second barrier, then every rank copies every shard from
 *     its owner (reduce-scatter by reading, all-gather by reading);
 *   - broadcast: the root stages, the others copy from the root.
 * Chunks alternate between the two slots. A rank overwrites a slot only
 * after the barrier of the next chunk, which every peer enters only after it
 * finished reading that slot, so one barrier per chunk (two for two-shot)
 * is all the synchronization there is.
 *
 * The barrier counts and the slot parity live in the owner's signal, in
 * device memory, and only the kernels update them: a call captured in a
 * CUDA graph replays correctly, since nothing per call comes from the host.
 *
 * A barrier that waits gives up when *abort (host-mapped memory the host
 * sets on peer failure or braid_pg_abort) turns nonzero, or after
 * timeout_ns of waiting; it records why and for which peer in *fault
 * (host-mapped) and the kernel returns, so a dead peer never leaves a
 * kernel spinning. The group is then broken: the counters of the blocks
 * that gave up no longer match their peers'.
 */
#ifndef BRAID_DEVICE_COLL_H
#define BRAID_DEVICE_COLL_H

#include <stddef.h>
#include <stdint.h>

#include "braid.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BRAID_DEVCOLL_MAX_RANKS 8
#define BRAID_DEVCOLL_MAX_BLOCKS 32

typedef enum {
    BRAID_DEVCOLL_ONESHOT = 0, /**< all-reduce: every rank reads every peer's whole chunk */
    BRAID_DEVCOLL_TWOSHOT,     /**< all-reduce: reduce own shard, then gather the shards */
    BRAID_DEVCOLL_BROADCAST,   /**< root's send to everyone's recv */
} braid_devcoll_algo;

/** Head of each rank's region. arrive[b][p] is written by peer p's block b
 *  only; barriers[b] and chunks[b] by this rank's block b only. Zeroed once
 *  when the region is made. */
typedef struct {
    volatile uint32_t arrive[BRAID_DEVCOLL_MAX_BLOCKS][BRAID_DEVCOLL_MAX_RANKS];
    uint32_t barriers[BRAID_DEVCOLL_MAX_BLOCKS];
    uint32_t chunks[BRAID_DEVCOLL_MAX_BLOCKS];
} braid_devcoll_signal;

enum { BRAID_DEVCOLL_OK = 0, BRAID_DEVCOLL_ABORTED = 1, BRAID_DEVCOLL_TIMED_OUT = 2 };

/** Why a kernel gave up: the first block to give up writes it. */
typedef struct {
    volatile uint32_t code; /**< BRAID_DEVCOLL_OK / _ABORTED / _TIMED_OUT */
    volatile int32_t peer;  /**< the peer that block waited for */
    volatile uint32_t block;
} braid_devcoll_fault;

/** One call. Passed by value to the kernel (constant memory). */
typedef struct {
    braid_devcoll_algo algo;
    braid_dtype dtype;
    braid_op op;
    int rank, nranks, root; /**< root: broadcast only */
    int nblocks;            /**< 1..BRAID_DEVCOLL_MAX_BLOCKS, equal on every rank */
    const void *send;       /**< may equal recv */
    void *recv;
    size_t count;
    uint64_t scalar; /**< MULSUM: this rank's scalar, the dtype's bytes at the start */
    braid_devcoll_signal *signal[BRAID_DEVCOLL_MAX_RANKS]; /**< every rank's, as mapped here */
    char *data[BRAID_DEVCOLL_MAX_RANKS];                   /**< every rank's slots, as mapped here */
    size_t seg_bytes; /**< one block's segment of one slot: a multiple of 16, >= 16 * nranks */
    const volatile uint32_t *abort; /**< nonzero: give up (device view of host-mapped memory) */
    braid_devcoll_fault *fault;     /**< where a kernel says why it gave up (device view) */
    uint64_t timeout_ns;            /**< longest wait in one barrier; 0: no limit */
} braid_devcoll_args;

/** Offset of the slots from the start of a region (the signal, padded). */
size_t braid__devcoll_data_offset(void);

/** Bytes of one rank's region for nblocks segments of seg_bytes. */
size_t braid__devcoll_region_bytes(int nblocks, size_t seg_bytes);

/** Blocks a call of `bytes` uses, at most max_blocks: the same answer on
 *  every rank for the same call, which the protocol needs. */
int braid__devcoll_blocks_for(size_t bytes, int max_blocks);

/** Checks a and queues the kernel on stream. count == 0 queues nothing.
 *  BRAID_ERR_INVALID_ARG names the bad field; a launch failure is
 *  BRAID_ERR_CUDA. The call's own failure (abort, timeout) shows later, in
 *  *a->fault. */
braid_status braid__cuda_devcoll(const braid_devcoll_args *a, void *stream);

/* Load every device-collective kernel now on the current device (once per
 * device; later calls return at once). Under lazy module loading a kernel's first launch may
 * synchronize the context, which would wait for a peer's kernel that spins
 * until this rank's own launches: call it before any rank of the group can
 * launch one. */
braid_status braid__cuda_devcoll_preload(void);

#ifdef __cplusplus
}
#endif
#endif /* BRAID_DEVICE_COLL_H */
