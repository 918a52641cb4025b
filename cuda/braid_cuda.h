/*
 * CUDA side of braid behind a plain C interface: fused reduce kernels and
 * the few runtime queries the rest of the library needs.
 *
 * Built from cuda/reduce_kernels.cu + cuda/cuda_device.c when braid is
 * configured with CUDA (BRAID_HAVE_CUDA=1), else from cuda/cuda_stub.c,
 * whose functions return BRAID_ERR_UNSUPPORTED ("braid was built without
 * CUDA") and report no device. Callers never need #ifdefs.
 *
 * The CUDA runtime is linked statically and finds the driver (libcuda.so.1)
 * with dlopen at first use, so libbraid loads on machines without a GPU or
 * driver; braid__cuda_available() then returns 0 and says why.
 *
 * Kernels use the elementwise definitions of src/reduce/elementwise.h, so a
 * GPU result is bit for bit the CPU engine's result (f32/f64 NaN payloads
 * aside, which the definition leaves open). All launches are asynchronous
 * on the caller's stream (NULL: the legacy default stream) and on the
 * calling thread's current device; pointers must be device-accessible
 * (device, managed or mapped host memory). Errors are returned as
 * BRAID_ERR_CUDA with cudaGetErrorString's text in braid_last_error().
 */
#ifndef BRAID_CUDA_H
#define BRAID_CUDA_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "braid.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Most inputs one multi-input reduce takes. */
#define BRAID_CUDA_MAX_SRCS 8

/* ---- queries --------------------------------------------------------------- */

/** 1 when a CUDA device can be used by this process, else 0. Probed once
 *  (cudaGetDeviceCount); the answer is cached. */
int braid__cuda_available(void);

/** Why braid__cuda_available() is 0 ("braid was built without CUDA", "no
 *  CUDA driver: ..."); "" when it is 1. Never NULL. */
const char *braid__cuda_unavailable_reason(void);

/** Whether NVIDIA device nodes exist (/dev/nvidiactl), without loading the
 * driver: a CPU-only job must never load it, so group creation asks this,
 * not braid__cuda_available(), before offering cuda_ipc device links. */
int braid__cuda_device_nodes_present(void);

/** Number of visible devices (0 when unavailable). */
int braid__cuda_device_count(void);

/** Streaming multiprocessors of device (cached per device); 0 on error. */
int braid__cuda_sm_count(int device);

typedef enum {
    BRAID_CUDA_PTR_HOST = 0, /**< ordinary or pinned host memory, or unknown to CUDA */
    BRAID_CUDA_PTR_DEVICE,   /**< cudaMalloc'd device memory */
    BRAID_CUDA_PTR_MANAGED,  /**< cudaMallocManaged */
} braid_cuda_ptr_kind;

/** Whether a CUDA context may exist in the process (current on the calling
 *  thread, or an active primary context), asked of the driver only if
 *  someone loaded it: never initializes CUDA. */
int braid__cuda_context_seen(void);

/** Memory type of p (cudaPointerGetAttributes). HOST when CUDA is
 *  unavailable; *device (may be NULL) gets the owning device or -1. */
braid_cuda_ptr_kind braid__cuda_ptr_kind(const void *p, int *device);

/* ---- kernels ------------------------------------------------------------------
 * For every element i, with C the compute type of the dtype (f32 for
 * f16/bf16, else the type itself):
 *     acc = load(srcs[0][i]);  acc = op(acc, load(srcs[k][i])) for k = 1..nsrcs-1
 *     dst[i] = store(op == AVG ? acc / nranks : acc)
 * so with nsrcs == 2 the result equals braid__reduce_final() on the CPU,
 * and f16/bf16 inputs are rounded once, at the end, however many there are.
 * nsrcs == 1 is a copy (AVG: a scale). dst may be one of srcs exactly
 * (in place), not a partial overlap. Any alignment works; when dst and all
 * srcs are 16-byte aligned at a common element the kernels use 128-bit
 * accesses. count == 0 launches nothing. */

/** dst = op(srcs[0..nsrcs-1]), all of dtype; nsrcs 1..BRAID_CUDA_MAX_SRCS;
 *  nranks > 0 for AVG (ignored otherwise). */
braid_status braid__cuda_reduce(braid_dtype dtype, braid_op op, void *dst, const void *const *srcs,
                                int nsrcs, size_t count, int nranks, void *stream);

/** As braid__cuda_reduce with inputs of src_dtype and output of dst_dtype,
 *  accumulating in f32: both among F32, F16, BF16 (or dst_dtype ==
 *  src_dtype for any dtype, which is braid__cuda_reduce). E.g. f16 wire
 *  chunks reduced into an f32 accumulator, or f32 gradients averaged and
 *  compressed to bf16 in one pass. */
braid_status braid__cuda_reduce_cast(braid_dtype dst_dtype, void *dst, braid_dtype src_dtype,
                                     braid_op op, const void *const *srcs, int nsrcs, size_t count,
                                     int nranks, void *stream);

/** Pre-multiplied sum (NCCL's ncclRedOpCreatePreMulSum):
 *  dst = store(sum over k of load(srcs[k][i]) * scale), float dtypes only,
 *  scale converted to the compute type (f32, or f64 for F64); each product
 *  and each partial sum rounded in the compute type, one final rounding for
 *  f16/bf16. Scaling before summing keeps f16 sums of many ranks finite. */
braid_status braid__cuda_reduce_premul(braid_dtype dtype, void *dst, const void *const *srcs, int nsrcs,
                                       size_t count, double scale, void *stream);

/** Loads every braid kernel now (cudaFuncGetAttributes on each). With CUDA's
 *  lazy module loading (the default since CUDA 12.2) a kernel's first launch
 *  may synchronize the device; braid calls this before it holds any stream,
 *  so no later launch can wait for a stream braid itself holds. */
braid_status braid__cuda_preload(void);

/** Kernel modules load per context, so per device: a process may drive
 *  several. braid__cuda_once_per_device runs load() on the calling thread's
 *  current device unless it already succeeded there (cuda_device.c); what
 *  names it in errors. */
typedef struct {
    pthread_mutex_t mu;
    unsigned char done[64]; /* by device ordinal */
} braid_cuda_once;
#define BRAID_CUDA_ONCE_INIT {PTHREAD_MUTEX_INITIALIZER, {0}}
braid_status braid__cuda_once_per_device(braid_cuda_once *once, braid_status (*load)(void), const char *what);

/** Queues on stream a wait, on the device, until *flag reaches want (as a
 *  wrapping 32-bit sequence: (int32_t)(*flag - want) >= 0). flag is the
 *  device address of mapped pinned host memory that the host writes. A
 *  one-thread kernel that polls: unlike a host function (cudaLaunchHostFunc,
 *  run on the process's one callback thread) it holds nothing but its
 *  stream. */
braid_status braid__cuda_wait_flag(const volatile uint32_t *flag, uint32_t want, void *stream);

/* ---- stream gates (cuda_gate.c) -------------------------------------------------
 * A gate holds a caller's stream until the host opens it: later work queued
 * on the stream starts after the collective's result is in place, and the
 * caller's thread never waits. Flags live in one process-wide array of
 * mapped pinned memory, allocated once (with braid__cuda_preload) by
 * braid__cuda_gate_prepare and never freed: a gate kernel may still be
 * queued behind other work when its group is destroyed. */

typedef struct {
    uint32_t slot, seq;
    int armed;
} braid_cuda_gate;

/** Loads the kernels and allocates the gate flags, once per process; later
 *  calls return the first call's result. Call before holding any stream. */
braid_status braid__cuda_gate_prepare(void);

/** Queues a closed gate on stream (NULL: the legacy default stream). */
braid_status braid__cuda_gate_arm(braid_cuda_gate *g, void *stream);

/** Opens g (no CUDA call: any thread, any time); a no-op when g was not
 *  armed or is open already. */
void braid__cuda_gate_open(braid_cuda_gate *g);

/* ---- runtime helpers ---------------------------------------------------------- */

/** cudaMalloc; *p set only on success. */
braid_status braid__cuda_malloc(void **p, size_t bytes);

/** cudaFree; NULL is a no-op; failures are logged, not returned. */
void braid__cuda_free(void *p);

/** cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream). */
braid_status braid__cuda_memcpy_async(void *dst, const void *src, size_t bytes, void *stream);

/** cudaStreamSynchronize(stream). */
braid_status braid__cuda_stream_sync(void *stream);

#ifdef __cplusplus
}
#endif
#endif /* BRAID_CUDA_H */
