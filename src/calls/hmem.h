/* Memory-type layer: which buffers live on a CUDA device, and how a
 * collective on device buffers runs (staged through pinned host memory,
 * or as the device ring with the reduction in CUDA kernels) and is ordered
 * against the caller's CUDA stream (docs/CUDA.md).
 *
 * Two implementations with one interface, like cuda/braid_cuda.h:
 * cuda/hmem_cuda.c when braid is built with CUDA, cuda/hmem_stub.c when it
 * is not. Without CUDA no pointer is a device pointer, so the entry points
 * reduce to braid__work_submit() and the CPU path is exactly as before. */
#ifndef BRAID_HMEM_H
#define BRAID_HMEM_H

#include "pg.h"

/* Staging piece: a device collective larger than this runs as consecutive
 * host collectives of this many bytes (whole elements), so that copying
 * piece k+1 down and piece k-1 back overlaps the ring on piece k. Every
 * rank must use the same value, hence a constant. */
#define BRAID_HMEM_PIECE_BYTES (4u << 20)

/* The one memory classifier: device_mem = 1 for CUDA device memory and for
 * managed memory (both are what a CUDA program passes as "device
 * buffers"; managed memory is also host-visible, but braid orders it on
 * streams like device memory), with device its ordinal; zero for host
 * memory, for memory CUDA does not know, and always where CUDA is not
 * built, no device is usable or no CUDA context exists yet (then it makes
 * no CUDA call: docs/CUDA.md). A call classifies each buffer once, at its
 * entry, and carries the answer in its record (braid_coll.send_mem,
 * recv_mem; nccl_op's too). */
braid_mem braid__mem_of(const void *p);

static inline int braid__mem_is_device(const void *p)
{
    return braid__mem_of(p).device_mem;
}

/* Entry point of every call (after argument checks, with coll->send_mem
 * and recv_mem set) and of braid_group_end (coll a GROUP, owned, its ops
 * carrying their streams): host buffers with no stream go straight to
 * braid__work_submit(); inside the caller's open group the call is
 * recorded with its stream; device buffers get a staging job ordered
 * after the work already on cuda_stream (and, for work != NULL,
 * cuda_stream is made to wait for the result). */
braid_status braid__hmem_submit(braid_pg *pg, const braid_coll *coll, void *cuda_stream, braid_work **work);

/* Run a staging job (coll->hmem != NULL) on the executor: the device ring
 * for all-reduces above one piece on device buffers, else copies down,
 * runs the host algorithm per piece through braid__coll_run() (a group:
 * per segment, cuda/hmem_stage.c), copies
 * back; then releases the caller's stream. Called by braid__coll_run(). */
braid_status braid__hmem_coll_run(braid_pg *pg, braid_coll *coll);

/* The executor marked the job's work handle done: let the callers'
 * streams go on (a handle polled after its stream synchronized reads
 * done). Idempotent; the release does it too. */
void braid__hmem_coll_done(braid_coll *coll);

/* Drop the job's staging state; a job that never ran still releases the
 * caller's stream here (its data is left as it was). Idempotent. */
void braid__hmem_coll_release(braid_coll *coll);

/* At group creation, before the rendezvous: where the calling thread has
 * a CUDA context, set up the group's staging state on its current device
 * now. Allocating pinned memory waits for busy blocking streams, so doing
 * it at the first device call could wait for another rank's stream that
 * braid holds (two ranks as threads of one process); before the
 * rendezvous no rank of this group can hold one yet. Failures only
 * postpone the set-up to the first device call (logged). */
void braid__hmem_pg_prepare(braid_pg *pg);

/* Free the group's pinned buffers, streams and events (group teardown,
 * after the executor stopped). */
void braid__hmem_pg_release(braid_pg *pg);

/* ---- pure staging schedule, shared by both builds and unit-tested ---- */

/* Pieces a device collective of count elements of esize bytes runs as:
 * piece i covers elements [i * per, min(count, (i + 1) * per)). */
static inline size_t braid__hmem_piece_elems(size_t esize)
{
    size_t per = BRAID_HMEM_PIECE_BYTES / esize;
    return per ? per : 1;
}

static inline size_t braid__hmem_piece_count(size_t count, size_t esize)
{
    size_t per = braid__hmem_piece_elems(esize);
    return count == 0 ? 0 : (count + per - 1) / per;
}

#endif
