/*
 * nccl.h — the NCCL 2.19 API, implemented by braid's libnccl.so.2.
 *
 * Names, values and prototypes are NCCL 2.19.3's, so a program written
 * against NCCL compiles against this header and runs on braid unchanged
 * (see docs/NCCL_COMPAT.md for what is covered and how it differs). Calls
 * on CUDA device buffers are enqueued on their stream, as in NCCL (with a
 * CUDA build of braid); calls on host buffers are complete when the call
 * (or, inside a group, ncclGroupEnd) returns.
 *
 * Differences in the header itself:
 *  - cuda_runtime.h is included only when it can be found; otherwise just
 *    cudaStream_t is declared, as the CUDA runtime does;
 *  - ncclBfloat16 is always defined (NCCL defines it only when cuda_bf16.h
 *    was included), since braid reduces bf16 on the host;
 *  - the pncclXxx profiling aliases are not declared.
 */
#ifndef NCCL_H_
#define NCCL_H_

#if !defined(CUDART_VERSION) && defined(__has_include)
#if __has_include(<cuda_runtime.h>)
#include <cuda_runtime.h>
#endif
#endif
/* As NVIDIA's nccl.h: half and (CUDA 11 on) __nv_bfloat16 come with it;
 * nccl-tests needs both. */
#if defined(CUDART_VERSION) && defined(__has_include)
#if __has_include(<cuda_fp16.h>)
#include <cuda_fp16.h>
#endif
#if CUDART_VERSION >= 11000 && __has_include(<cuda_bf16.h>)
#include <cuda_bf16.h>
#endif
#endif
#if !defined(CUDART_VERSION)
/* The CUDA runtime's own declaration; repeating it later is harmless. */
typedef struct CUstream_st *cudaStream_t;
#endif

#define NCCL_MAJOR 2
#define NCCL_MINOR 19
#define NCCL_PATCH 3
#define NCCL_SUFFIX ""

#define NCCL_VERSION_CODE 21903
/* Codes of 2.8 and older were X*1000 + Y*100 + Z; from 2.9 on X*10000 + Y*100 + Z. */
#define NCCL_VERSION(X, Y, Z) (((X) <= 2 && (Y) <= 8) ? (X)*1000 + (Y)*100 + (Z) : (X)*10000 + (Y)*100 + (Z))

#ifdef __cplusplus
extern "C" {
#endif

#include <limits.h>
#include <stddef.h>

/** Opaque handle to a communicator. */
typedef struct ncclComm *ncclComm_t;
#define NCCL_COMM_NULL NULL

#define NCCL_UNIQUE_ID_BYTES 128
/** Rendezvous handle made by ncclGetUniqueId on one rank and handed to all
 *  (it carries a job secret: treat it as a credential). */
typedef struct {
    char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

/** Result of every call. */
typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
    ncclNumResults = 8
} ncclResult_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR -1

/** Communicator configuration; initialise with NCCL_CONFIG_INITIALIZER. */
typedef struct ncclConfig_v21700 {
    /* attributes that users should never touch. */
    size_t size;
    unsigned int magic;
    unsigned int version;
    /* attributes that users are able to customize. */
    int blocking;        /**< 0: non-blocking; braid completes init before returning either way */
    int cgaClusterSize;  /**< GPU launch shape: ignored */
    int minCTAs;         /**< ignored */
    int maxCTAs;         /**< ignored */
    const char *netName; /**< "Socket" (braid tcp) or "IB" (braid verbs); NULL: automatic */
    int splitShare;      /**< ignored */
} ncclConfig_t;

/** Must be assigned to every ncclConfig_t when it is created. */
/* clang-format off */
#define NCCL_CONFIG_INITIALIZER                                                                \
    {                                                                                          \
        sizeof(ncclConfig_t),                             /* size */                           \
        0xcafebeef,                                       /* magic */                          \
        NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), /* version */                        \
        NCCL_CONFIG_UNDEF_INT,                            /* blocking */                       \
        NCCL_CONFIG_UNDEF_INT,                            /* cgaClusterSize */                 \
        NCCL_CONFIG_UNDEF_INT,                            /* minCTAs */                        \
        NCCL_CONFIG_UNDEF_INT,                            /* maxCTAs */                        \
        NCCL_CONFIG_UNDEF_PTR,                            /* netName */                        \
        NCCL_CONFIG_UNDEF_INT                             /* splitShare */                     \
    }
/* clang-format on */

/** Allocate memory for communication buffers (host memory, 4 KiB aligned,
 *  in this implementation). */
ncclResult_t ncclMemAlloc(void **ptr, size_t size);
/** Free memory from ncclMemAlloc. */
ncclResult_t ncclMemFree(void *ptr);

/** Store NCCL_VERSION_CODE of the library in *version. */
ncclResult_t ncclGetVersion(int *version);

/** Make the id passed to ncclCommInitRank on every rank. Call it once (on
 *  one rank) and distribute the id, e.g. before fork or over MPI. */
ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId);

/** Create a communicator with a configuration (NULL: defaults). */
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t *config);

/** Create a communicator of nranks as rank. Synchronises with the other
 *  ranks, so each rank calls it from its own thread or process, or several
 *  are made from one thread between ncclGroupStart and ncclGroupEnd. */
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);

/** Create ndev communicators of one clique in this process (rank i is
 *  comm[i]; devlist only labels them, see ncclCommCuDevice). Use them from
 *  one thread with group calls, or one thread each. */
ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist);

/** Flush issued operations. braid completes every operation before the
 *  call issuing it returns, so this only marks the communicator finalized. */
ncclResult_t ncclCommFinalize(ncclComm_t comm);

/** Free the communicator. */
ncclResult_t ncclCommDestroy(ncclComm_t comm);

/** Abort pending operations (they fail) and free the communicator. */
ncclResult_t ncclCommAbort(ncclComm_t comm);

/** Split comm: ranks passing the same color form a new communicator,
 *  ordered by key then by rank in comm; NCCL_SPLIT_NOCOLOR gets NULL.
 *  Collective over comm. config NULL: comm's configuration. */
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config);

/** Name of a result code. */
const char *ncclGetErrorString(ncclResult_t result);

/** Text of the last failure on this thread (names rank, peer, operation
 *  and cause). comm is unused and may be NULL. */
const char *ncclGetLastError(ncclComm_t comm);

/** *asyncError = the error that broke comm, ncclSuccess while healthy. */
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);

/** Number of ranks in comm. */
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count);

/** The CUDA device recorded for comm at creation (-1 when none). */
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device);

/** The rank of this communicator. */
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank);

/** Register a buffer for communication. A no-op on host memory; the handle
 *  is only to be passed to ncclCommDeregister. */
ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle);
ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle);

/** Reduction operators. */
typedef enum { ncclNumOps_dummy = 5 } ncclRedOp_dummy_t;
typedef enum {
    ncclSum = 0,
    ncclProd = 1,
    ncclMax = 2,
    ncclMin = 3,
    ncclAvg = 4,
    /* ncclNumOps: the number of built-in ncclRedOp_t values, and the least
     * value of an operator made by ncclRedOpCreate*. */
    ncclNumOps = 5,
    /* ncclMaxRedOp: the largest valid ncclRedOp_t, chosen so the enum keeps
     * its size (compilers may make enums signed). */
    ncclMaxRedOp = 0x7fffffff >> (32 - 8 * sizeof(ncclRedOp_dummy_t))
} ncclRedOp_t;

/** Element types. */
typedef enum {
    ncclInt8 = 0,
    ncclChar = 0,
    ncclUint8 = 1,
    ncclInt32 = 2,
    ncclInt = 2,
    ncclUint32 = 3,
    ncclInt64 = 4,
    ncclUint64 = 5,
    ncclFloat16 = 6,
    ncclHalf = 6,
    ncclFloat32 = 7,
    ncclFloat = 7,
    ncclFloat64 = 8,
    ncclDouble = 8,
    ncclBfloat16 = 9,
    ncclNumTypes = 10
} ncclDataType_t;

/** Where the scalar of ncclRedOpCreatePreMulSum lives and when it is read. */
typedef enum {
    /** Device-visible memory, read when the collective runs (here: when the
     *  collective is called). */
    ncclScalarDevice = 0,
    /** Host memory, read before ncclRedOpCreatePreMulSum returns. */
    ncclScalarHostImmediate = 1
} ncclScalarResidence_t;

/** Create an operator that multiplies each input by *scalar (of datatype)
 *  and sums the products; for use with comm and datatype only. */
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm);

/** Destroy an operator made by ncclRedOpCreatePreMulSum on comm. */
ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);

/*
 * Collectives. Every rank of comm makes the same calls in the same order.
 * stream: NULL for plain host code; a CUDA stream is synchronised before
 * the host buffers are touched.
 */

/** Reduce count elements of sendbuff into recvbuff on root (recvbuff may
 *  be NULL elsewhere). In place when sendbuff == recvbuff. */
ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream);

/** (deprecated) In-place broadcast of count elements from root. */
ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream);

/** Copy count elements of root's sendbuff into every rank's recvbuff. In
 *  place when sendbuff == recvbuff. */
ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream);

/** Reduce count elements over all ranks into every recvbuff. In place when
 *  sendbuff == recvbuff. */
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream);

/** Reduce nranks*recvcount elements; rank i receives block i of the result.
 *  In place when recvbuff == sendbuff + rank * recvcount. */
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);

/** Gather sendcount elements from each rank; rank i's land at offset
 *  i*sendcount. In place when sendbuff == recvbuff + rank * sendcount. */
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream);

/** Send count elements to peer, which calls ncclRecv with the same count
 *  and datatype. Several sends/receives that must progress together go
 *  between ncclGroupStart and ncclGroupEnd. */
ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);

/** Receive count elements from peer (see ncclSend). */
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);

/*
 * Group semantics. Calls between ncclGroupStart and ncclGroupEnd (on any
 * communicator, from this thread) are collected and run together when the
 * outermost ncclGroupEnd is reached, which returns when they are complete.
 */
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

#ifdef __cplusplus
} /* end extern "C" */
#endif

#endif /* NCCL_H_ */
