/* nccl.h against NCCL 2.28.9's published values: every enumerator, macro and
 * size a binary built with NVIDIA's header bakes in. The compile-time half
 * is the test; the run-time half checks what the library reports. */
#include <nccl.h>

#include <stddef.h>
#include <stdio.h>
#include <string.h>

_Static_assert(ncclSuccess == 0 && ncclUnhandledCudaError == 1 && ncclSystemError == 2 && ncclInternalError == 3 &&
                   ncclInvalidArgument == 4 && ncclInvalidUsage == 5 && ncclRemoteError == 6 && ncclInProgress == 7 &&
                   ncclNumResults == 8,
               "ncclResult_t");
_Static_assert(ncclInt8 == 0 && ncclChar == 0 && ncclUint8 == 1 && ncclInt32 == 2 && ncclInt == 2 && ncclUint32 == 3 &&
                   ncclInt64 == 4 && ncclUint64 == 5 && ncclFloat16 == 6 && ncclHalf == 6 && ncclFloat32 == 7 &&
                   ncclFloat == 7 && ncclFloat64 == 8 && ncclDouble == 8 && ncclBfloat16 == 9 && ncclFloat8e4m3 == 10 && ncclFloat8e5m2 == 11 && ncclNumTypes == 12,
               "ncclDataType_t");
_Static_assert(ncclSum == 0 && ncclProd == 1 && ncclMax == 2 && ncclMin == 3 && ncclAvg == 4 && ncclNumOps == 5 &&
                   ncclMaxRedOp == 0x7fffffff,
               "ncclRedOp_t");
_Static_assert(sizeof(ncclRedOp_t) == 4 && sizeof(ncclDataType_t) == 4 && sizeof(ncclResult_t) == 4, "enum sizes");
_Static_assert(ncclScalarDevice == 0 && ncclScalarHostImmediate == 1, "ncclScalarResidence_t");
_Static_assert(NCCL_UNIQUE_ID_BYTES == 128 && sizeof(ncclUniqueId) == 128, "ncclUniqueId");
_Static_assert(NCCL_MAJOR == 2 && NCCL_MINOR == 28 && NCCL_PATCH == 9 && NCCL_VERSION_CODE == 22809, "version");
_Static_assert(NCCL_VERSION(2, 28, 9) == 22809 && NCCL_VERSION(2, 8, 4) == 2804 && NCCL_VERSION(3, 0, 1) == 30001,
               "NCCL_VERSION");
_Static_assert(NCCL_SPLIT_NOCOLOR == -1 && NCCL_CONFIG_UNDEF_INT == (-2147483647 - 1), "config constants");
_Static_assert(NCCL_WIN_DEFAULT == 0 && NCCL_WIN_COLL_SYMMETRIC == 1 && NCCL_WIN_REQUIRED_ALIGNMENT == 4096 &&
                   NCCL_CTA_POLICY_DEFAULT == 0 && NCCL_CTA_POLICY_EFFICIENCY == 1 && NCCL_CTA_POLICY_ZERO == 2 &&
                   NCCL_SHRINK_DEFAULT == 0 && NCCL_SHRINK_ABORT == 1 && NCCL_REVOKE_DEFAULT == 0,
               "flags");
/* ncclSimInfo_v22200 and ncclConfig_v22800 as laid out by NVIDIA's 2.28 header. */
_Static_assert(offsetof(ncclSimInfo_t, magic) == 8 && offsetof(ncclSimInfo_t, version) == 12 &&
                   offsetof(ncclSimInfo_t, estimatedTime) == 16 && sizeof(ncclSimInfo_t) == 24,
               "ncclSimInfo_t layout (LP64)");
_Static_assert(offsetof(ncclConfig_t, size) == 0 && offsetof(ncclConfig_t, magic) == 8 &&
                   offsetof(ncclConfig_t, version) == 12 && offsetof(ncclConfig_t, blocking) == 16 &&
                   offsetof(ncclConfig_t, cgaClusterSize) == 20 && offsetof(ncclConfig_t, minCTAs) == 24 &&
                   offsetof(ncclConfig_t, maxCTAs) == 28 && offsetof(ncclConfig_t, netName) == 32 &&
                   offsetof(ncclConfig_t, splitShare) == 40 && offsetof(ncclConfig_t, trafficClass) == 44 &&
                   offsetof(ncclConfig_t, commName) == 48 && offsetof(ncclConfig_t, collnetEnable) == 56 &&
                   offsetof(ncclConfig_t, CTAPolicy) == 60 && offsetof(ncclConfig_t, shrinkShare) == 64 &&
                   offsetof(ncclConfig_t, nvlsCTAs) == 68 && offsetof(ncclConfig_t, nChannelsPerNetPeer) == 72 &&
                   offsetof(ncclConfig_t, nvlinkCentricSched) == 76 && sizeof(ncclConfig_t) == 80,
               "ncclConfig_t layout (LP64)");

int main(void)
{
    ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
    if (c.size != sizeof(ncclConfig_t) || c.magic != 0xcafebeef || c.version != 22809 ||
        c.blocking != NCCL_CONFIG_UNDEF_INT || c.netName != NULL || c.splitShare != NCCL_CONFIG_UNDEF_INT ||
        c.commName != NULL || c.nvlinkCentricSched != NCCL_CONFIG_UNDEF_INT) {
        fprintf(stderr, "NCCL_CONFIG_INITIALIZER gives unexpected fields\n");
        return 1;
    }
    int v = 0;
    if (ncclGetVersion(&v) != ncclSuccess || v != NCCL_VERSION_CODE) {
        fprintf(stderr, "ncclGetVersion: %d, header %d\n", v, NCCL_VERSION_CODE);
        return 1;
    }
    for (int r = 0; r <= ncclNumResults; r++)
        if (!ncclGetErrorString((ncclResult_t)r) || !*ncclGetErrorString((ncclResult_t)r)) {
            fprintf(stderr, "ncclGetErrorString(%d) is empty\n", r);
            return 1;
        }
    if (strcmp(ncclGetErrorString(ncclSuccess), "no error") != 0) {
        fprintf(stderr, "ncclGetErrorString(ncclSuccess) = %s\n", ncclGetErrorString(ncclSuccess));
        return 1;
    }
    if (strcmp(ncclGetLastError(NULL), "") != 0) {
        fprintf(stderr, "ncclGetLastError is not empty before any failure\n");
        return 1;
    }
    return 0;
}
