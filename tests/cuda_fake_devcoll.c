/* braid__cuda_devcoll for the CUDA stand-in (tests/cuda_fake.c): the
 * kernels of cuda/device_coll_kernels.cu compiled for the host emulation
 * (there named braid__emu_devcoll), run on the stream's thread in stream
 * order, as the GPU would run the launch. The regions are the stand-in's
 * device memory, which other processes map through its IPC handles, so a
 * group's ranks run the kernels' protocol against each other for real. */
#include <pthread.h>
#include <stdlib.h>

#include "cuda_runtime_api.h"
#include "device_coll.h"
#include "status.h"

braid_status braid__emu_devcoll(const braid_devcoll_args *a, void *stream);
void cuda_fake_launch(cudaStream_t stream, void (*fn)(void *), void *arg);

static _Atomic unsigned long launches;

/* Device-collective kernels this process queued. */
unsigned long cuda_fake_devcoll_launches(void)
{
    return launches;
}

static void run(void *arg)
{
    braid_devcoll_args *a = arg;
    (void)braid__emu_devcoll(a, NULL); /* checked at the launch */
    free(a);
}

/* Lazy module loading, as on CUDA: a kernel's first launch in the process
 * synchronizes the device (which waits for a peer thread's kernel that
 * spins until this one runs), unless braid__cuda_devcoll_preload loaded
 * them all first. */
static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;
static int preloaded;
static unsigned char loaded[BRAID_DTYPE_COUNT][BRAID_OP_COUNT];

braid_status braid__cuda_devcoll_preload(void)
{
    pthread_mutex_lock(&load_mu);
    int load = !preloaded;
    pthread_mutex_unlock(&load_mu);
    if (load) {
        cudaDeviceSynchronize();
        pthread_mutex_lock(&load_mu);
        preloaded = 1;
        pthread_mutex_unlock(&load_mu);
    }
    return BRAID_OK;
}

static void load_lazily(const braid_devcoll_args *a)
{
    braid_op op = a->algo == BRAID_DEVCOLL_BROADCAST ? BRAID_SUM : a->op;
    pthread_mutex_lock(&load_mu);
    int load = !preloaded && !loaded[a->dtype][op];
    pthread_mutex_unlock(&load_mu);
    if (load) {
        cudaDeviceSynchronize();
        pthread_mutex_lock(&load_mu);
        loaded[a->dtype][op] = 1;
        pthread_mutex_unlock(&load_mu);
    }
}

braid_status braid__cuda_devcoll(const braid_devcoll_args *a, void *stream)
{
    if (a == NULL)
        return braid__emu_devcoll(a, stream);
    braid_devcoll_args check = *a;
    check.count = 0; /* the arguments are checked, nothing runs */
    BRAID_CHECK(braid__emu_devcoll(&check, stream));
    if (a->count == 0)
        return BRAID_OK;
    braid_devcoll_args *copy = malloc(sizeof(*copy));
    if (!copy)
        return braid__error(BRAID_ERR_NO_MEMORY, "cuda fake: out of memory");
    *copy = *a;
    load_lazily(a);
    launches++;
    cuda_fake_launch((cudaStream_t)stream, run, copy);
    return BRAID_OK;
}
