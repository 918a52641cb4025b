/* Device buffers, build without CUDA: there is no device path, so device
 * memory (told apart through the driver the program loaded, nccl_mem.c)
 * is refused with ncclInvalidUsage, and ncclMemAlloc returns host memory. */
#include <stdlib.h>

#include "nccl_internal.h"

ncclResult_t nccl__dev_check(const void *p, const char *what, const char *call)
{
    return nccl__check_host(p, what, call);
}

ncclResult_t nccl__dev_submit(ncclComm_t comm, nccl_op *ops, int n)
{
    (void)comm;
    (void)n;
    return nccl__fail(ncclInternalError, "%s: no device path in this build", ops[0].call);
}

void nccl__dev_finish_kernels(ncclComm_t comm)
{
    (void)comm;
}

void nccl__dev_poll_kernels(ncclComm_t comm)
{
    (void)comm;
}

void nccl__dev_attach(ncclComm_t comm)
{
    (void)comm;
}

ncclResult_t nccl__dev_root_copy(const nccl_op *op)
{
    return nccl__fail(ncclInternalError, "%s: no device path in this build", op->call);
}

/* Page-aligned host memory (like NCCL's granularity), never a NULL success. */
NCCL_API ncclResult_t ncclMemAlloc(void **ptr, size_t size)
{
    if (!ptr)
        return nccl__fail(ncclInvalidArgument, "ncclMemAlloc: ptr is NULL");
    void *p = NULL;
    if (posix_memalign(&p, 4096, size ? size : 1) != 0)
        return nccl__fail(ncclSystemError, "ncclMemAlloc: cannot allocate %zu bytes of host memory", size);
    *ptr = p;
    return ncclSuccess;
}

NCCL_API ncclResult_t ncclMemFree(void *ptr)
{
    free(ptr);
    return ncclSuccess;
}
