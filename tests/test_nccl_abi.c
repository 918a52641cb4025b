/* nccl.h against NCCL 2.19's published values: every enumerator, macro and
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
                   ncclFloat == 7 && ncclFloat64 == 8 && ncclDouble == 8 && ncclBfloat16 == 9 && ncclNumTypes == 10,
               "ncclDataType_t");
_Static_assert(ncclSum == 0 && ncclProd == 1 && ncclMax == 2 && ncclMin == 3 && ncclAvg == 4 && ncclNumOps == 5 &&
                   ncclMaxRedOp == 0x7fffffff,
               "ncclRedOp_t");
_Static_assert(sizeof(ncclRedOp_t) == 4 && sizeof(ncclDataType_t) == 4 && sizeof(ncclResult_t) == 4, "enum sizes");
_Static_assert(ncclScalarDevice == 0 && ncclScalarHostImmediate == 1, "ncclScalarResidence_t");
_Static_assert(NCCL_UNIQUE_ID_BYTES == 128 && sizeof(ncclUniqueId) == 128, "ncclUniqueId");
_Static_assert(NCCL_MAJOR == 2 && NCCL_MINOR == 19 && NCCL_PATCH == 3 && NCCL_VERSION_CODE == 21903, "version");
_Static_assert(NCCL_VERSION(2, 19, 3) == 21903 && NCCL_VERSION(2, 8, 4) == 2804 && NCCL_VERSION(3, 0, 1) == 30001,
               "NCCL_VERSION");
_Static_assert(NCCL_SPLIT_NOCOLOR == -1 && NCCL_CONFIG_UNDEF_INT == (-2147483647 - 1), "config constants");
/* ncclConfig_v21700 as laid out by NVIDIA's 2.19 header. */
_Static_assert(offsetof(ncclConfig_t, size) == 0 && offsetof(ncclConfig_t, magic) == 8 &&
                   offsetof(ncclConfig_t, version) == 12 && offsetof(ncclConfig_t, blocking) == 16 &&
                   offsetof(ncclConfig_t, cgaClusterSize) == 20 && offsetof(ncclConfig_t, minCTAs) == 24 &&
                   offsetof(ncclConfig_t, maxCTAs) == 28 && offsetof(ncclConfig_t, netName) == 32 &&
                   offsetof(ncclConfig_t, splitShare) == 40 && sizeof(ncclConfig_t) == 48,
               "ncclConfig_t layout (LP64)");

int main(void)
{
    ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
    if (c.size != sizeof(ncclConfig_t) || c.magic != 0xcafebeef || c.version != 21903 ||
        c.blocking != NCCL_CONFIG_UNDEF_INT || c.netName != NULL || c.splitShare != NCCL_CONFIG_UNDEF_INT) {
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
