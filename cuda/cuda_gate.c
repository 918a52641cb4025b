/* Stream gates (braid_cuda.h): hold a caller's stream until the host says
 * the collective's result is in place, without CUDA's callback thread.
 *
 * A host function (cudaLaunchHostFunc) that blocks is the obvious gate and
 * the wrong one: CUDA runs every host function of a process on one
 * callback thread, in turn, so a blocked one holds the host functions of
 * every other stream too. Two ranks in one process (nccl-tests -t 2, or
 * -g 2 from one thread) then deadlock: rank 0's gate waits for a
 * collective that needs rank 1's next call, whose stream waits behind a
 * host function the callback thread never reaches. A gate here is a
 * one-thread kernel that polls a word of mapped pinned memory
 * (braid__cuda_wait_flag); it holds only its own stream.
 *
 * Flags: GATE_SLOTS words, one process-wide array, allocated once before
 * the first gate and never freed (a gate kernel may still be queued behind
 * other work when its group goes away). Gate n uses slot n % GATE_SLOTS
 * with sequence n / GATE_SLOTS + 1; opening stores the sequence, never
 * lowering it, and a gate passes once its slot's word has reached its
 * sequence. A slot is reused only after GATE_SLOTS later gates; arming one
 * whose previous user is still closed is refused rather than letting the
 * older gate through early. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "braid_cuda.h"
#include "status.h"

#define GATE_SLOTS 4096u

static pthread_once_t prepare_once = PTHREAD_ONCE_INIT;
static braid_status prepare_status;
static char prepare_error[256];
static _Atomic uint32_t *flags_host; /* mapped pinned memory */
static volatile uint32_t *flags_dev; /* the same words, as the device sees them */
static atomic_uint_fast64_t gates_armed;

static void prepare(void)
{
    /* Kernels first: loading one may synchronize the device, which is
     * harmless only while braid holds no stream. */
    braid_status st = braid__cuda_preload();
    void *host = NULL, *dev = NULL;
    cudaError_t err = cudaSuccess;
    if (st == BRAID_OK) {
        err = cudaHostAlloc(&host, GATE_SLOTS * sizeof(uint32_t), cudaHostAllocMapped | cudaHostAllocPortable);
        if (err == cudaSuccess) {
            memset(host, 0, GATE_SLOTS * sizeof(uint32_t));
            err = cudaHostGetDevicePointer(&dev, host, 0);
        }
        if (err != cudaSuccess) {
            (void)cudaGetLastError();
            st = braid__error(BRAID_ERR_CUDA, "cuda gates: cannot allocate %u mapped pinned flags: %s", GATE_SLOTS,
                              cudaGetErrorString(err));
        }
    }
    if (st != BRAID_OK) {
        const char *e = braid_last_error(), *colon = strstr(e, ": ");
        snprintf(prepare_error, sizeof(prepare_error), "%s", colon ? colon + 2 : e);
        prepare_status = st;
        return; /* the pinned block, if any, is left: a failed start is rare and final */
    }
    flags_host = host;
    flags_dev = dev;
    prepare_status = BRAID_OK;
}

braid_status braid__cuda_gate_prepare(void)
{
    pthread_once(&prepare_once, prepare);
    if (prepare_status != BRAID_OK)
        return braid__error(prepare_status, "%s", prepare_error);
    return braid__cuda_preload(); /* the current device's kernels: at once when loaded */
}

braid_status braid__cuda_gate_arm(braid_cuda_gate *g, void *stream)
{
    g->armed = 0;
    BRAID_CHECK(braid__cuda_gate_prepare());
    uint64_t n = atomic_fetch_add(&gates_armed, 1);
    uint32_t slot = (uint32_t)(n % GATE_SLOTS), seq = (uint32_t)(n / GATE_SLOTS) + 1;
    if ((int32_t)(atomic_load(&flags_host[slot]) - (seq - 1)) < 0)
        return braid__error(BRAID_ERR_UNSUPPORTED,
                            "cuda gates: more than %u device collectives in flight in this process (slot %u "
                            "still held)",
                            GATE_SLOTS, slot);
    BRAID_CHECK(braid__cuda_wait_flag(&flags_dev[slot], seq, stream));
    g->slot = slot;
    g->seq = seq;
    g->armed = 1;
    return BRAID_OK;
}

void braid__cuda_gate_open(braid_cuda_gate *g)
{
    if (!g->armed)
        return; /* opening twice is harmless: the word only grows */
    _Atomic uint32_t *f = &flags_host[g->slot];
    uint32_t cur = atomic_load(f);
    while ((int32_t)(cur - g->seq) < 0 && !atomic_compare_exchange_weak(f, &cur, g->seq))
        ;
}
