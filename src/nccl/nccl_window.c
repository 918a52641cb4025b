/* Symmetric memory: windows (ncclCommWindowRegister) and device
 * communicators (ncclDevCommCreate, declared by NVIDIA in
 * nccl_device/core.h). Both hand kernels direct access to every peer's
 * buffer, which braid does not offer yet, so they fail with
 * ncclInvalidUsage and say so. PyTorch calls them only where it can do
 * without: see docs/NCCL_COMPAT.md. */
#include "nccl_internal.h"

/* nccl_device/core.h's types, opaque here. */
struct ncclDevComm;
struct ncclDevCommRequirements;

static ncclResult_t unsupported(ncclComm_t comm, const char *call)
{
    return nccl__fail(ncclInvalidUsage,
                      "%s: %s: braid has no symmetric memory (windows, device communicators) yet; use ordinary "
                      "buffers, optionally registered with ncclCommRegister",
                      call, comm ? comm->label : "no communicator");
}

NCCL_API ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win, int winFlags)
{
    NCCL_ON_COMM(comm);
    (void)buff;
    (void)size;
    (void)winFlags;
    if (win)
        *win = NULL;
    return unsupported(comm, "ncclCommWindowRegister");
}

NCCL_API ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win)
{
    NCCL_ON_COMM(comm);
    (void)win;
    return unsupported(comm, "ncclCommWindowDeregister");
}

NCCL_API ncclResult_t ncclDevCommCreate(ncclComm_t comm, const struct ncclDevCommRequirements *reqs,
                                        struct ncclDevComm *outDevComm)
{
    NCCL_ON_COMM(comm);
    (void)reqs;
    (void)outDevComm;
    return unsupported(comm, "ncclDevCommCreate");
}

NCCL_API ncclResult_t ncclDevCommDestroy(ncclComm_t comm, const struct ncclDevComm *devComm)
{
    NCCL_ON_COMM(comm);
    (void)devComm;
    return unsupported(comm, "ncclDevCommDestroy");
}
