/* braid_cuda.h queries and memory helpers for the host emulation (see
 * cuda_runtime.h here): "device" memory is host memory. Defines every
 * symbol of cuda_device.c / cuda_stub.c, so when the test also links
 * libbraid_internal none of those archive members is pulled in. */
#include <stdlib.h>
#include <string.h>

#include "braid_cuda.h"
#include "status.h"

int braid__cuda_available(void)
{
    return 1;
}

int braid__cuda_device_nodes_present(void)
{
    return 0; /* no cuda_ipc here: the emulation has no IPC */
}

const char *braid__cuda_unavailable_reason(void)
{
    return "";
}

int braid__cuda_device_count(void)
{
    return 1;
}

/* One "SM": 8 blocks of 256 threads, so large inputs take several
 * grid-stride rounds. */
int braid__cuda_sm_count(int device)
{
    (void)device;
    return 1;
}

/* No runtime, no context: nothing touches the (absent) driver. */
int braid__cuda_context_seen(void)
{
    return 0;
}

braid_cuda_ptr_kind braid__cuda_ptr_kind(const void *p, int *device)
{
    (void)p;
    if (device)
        *device = 0;
    return BRAID_CUDA_PTR_DEVICE;
}

braid_status braid__cuda_malloc(void **p, size_t bytes)
{
    void *m = malloc(bytes ? bytes : 1);
    if (m == NULL)
        return braid__error(BRAID_ERR_NO_MEMORY, "emulated cuda malloc of %zu bytes", bytes);
    *p = m;
    return BRAID_OK;
}

void braid__cuda_free(void *p)
{
    free(p);
}

braid_status braid__cuda_memcpy_async(void *dst, const void *src, size_t bytes, void *stream)
{
    (void)stream;
    memmove(dst, src, bytes);
    return BRAID_OK;
}

braid_status braid__cuda_stream_sync(void *stream)
{
    (void)stream;
    return BRAID_OK;
}
