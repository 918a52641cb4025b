/*
 * nccl.h — the NCCL 2.28 API, implemented by braid's libnccl.so.2.
 *
 * Names, values and prototypes are NCCL 2.28.9's, so a program written
 * against NCCL compiles against this header and runs on braid unchanged
 * (see docs/NCCL_COMPAT.md for what is covered and how it differs). Calls
 * on CUDA device buffers are enqueued on their stream, as in NCCL (with a
 * CUDA build of braid); calls on host buffers are complete when the call
 * (or, inside a group, ncclGroupEnd) returns.
 *
 * Differences in the header itself:
 *  - cuda_runtime.h (and with it cuda_fp16.h, and cuda_bf16.h from CUDA 11
 *    on, as NVIDIA's header does) is included only when it can be found;
 *    otherwise just cudaStream_t is declared, as the CUDA runtime does;
 *  - ncclBfloat16 is always defined, since braid reduces bf16 on the host;
 *  - the pncclXxx profiling aliases are exported by the library but not
 *    declared here, and cuda_fp8.h is not included: braid has no fp8
 *    reductions (ncclFloat8e4m3 and ncclFloat8e5m2 are refused).
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
#define NCCL_MINOR 28
#define NCCL_PATCH 9
#define NCCL_SUFFIX ""

#define NCCL_VERSION_CODE 22809
/* Codes of 2.8 and older were X*1000 + Y*100 + Z; from 2.9 on X*10000 + Y*100 + Z. */
#define NCCL_VERSION(X, Y, Z) (((X) <= 2 && (Y) <= 8) ? (X)*1000 + (Y)*100 + (Z) : (X)*10000 + (Y)*100 + (Z))

#ifdef __cplusplus
extern "C" {
#endif

#include <limits.h>
#include <stddef.h>

/** Opaque handle to a communicator. */
typedef struct ncclComm *ncclComm_t;
/** Opaque handle to a registered memory window (ncclCommWindowRegister). */
typedef struct ncclWindow_vidmem *ncclWindow_t;
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
#define NCCL_UNDEF_FLOAT -1.0f

/* ncclCommWindowRegister flags. */
#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01
#define NCCL_WIN_REQUIRED_ALIGNMENT 4096

/* ncclConfig_t.CTAPolicy flags. */
#define NCCL_CTA_POLICY_DEFAULT 0x00
#define NCCL_CTA_POLICY_EFFICIENCY 0x01
#define NCCL_CTA_POLICY_ZERO 0x02

/* ncclCommShrink flags. */
#define NCCL_SHRINK_DEFAULT 0x00 /**< shrink the parent communicator */
#define NCCL_SHRINK_ABORT 0x01   /**< abort the parent's pending operations first */

/* ncclCommRevoke flags. */
#define NCCL_REVOKE_DEFAULT 0x00 /**< the only value; reserved */

/** Communicator configuration; initialise with NCCL_CONFIG_INITIALIZER.
 *  The library reads `size` bytes of it and the fields that existed at
 *  `version`, as NCCL does, so structs from older and newer headers work. */
typedef struct ncclConfig_v22800 {
    /* attributes that users should never touch. */
    size_t size;
    unsigned int magic;
    unsigned int version;
    /* attributes that users are able to customize. */
    int blocking;            /**< 0: init and calls may return ncclInProgress (see ncclCommGetAsyncError) */
    int cgaClusterSize;      /**< GPU launch shape: checked, not used */
    int minCTAs;             /**< checked, not used */
    int maxCTAs;             /**< checked, not used */
    const char *netName;     /**< "Socket" (braid tcp) or "IB" (braid verbs); NULL: automatic */
    int splitShare;          /**< checked, not used */
    int trafficClass;        /**< not used */
    const char *commName;    /**< named in this communicator's log lines and errors */
    int collnetEnable;       /**< checked, not used */
    int CTAPolicy;           /**< checked, not used */
    int shrinkShare;         /**< checked, not used */
    int nvlsCTAs;            /**< checked, not used */
    int nChannelsPerNetPeer; /**< checked, not used */
    int nvlinkCentricSched;  /**< checked, not used */
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
        NCCL_CONFIG_UNDEF_INT,                            /* splitShare */                     \
        NCCL_CONFIG_UNDEF_INT,                            /* trafficClass */                   \
        NCCL_CONFIG_UNDEF_PTR,                            /* commName */                       \
        NCCL_CONFIG_UNDEF_INT,                            /* collnetEnable */                  \
        NCCL_CONFIG_UNDEF_INT,                            /* CTAPolicy */                      \
        NCCL_CONFIG_UNDEF_INT,                            /* shrinkShare */                    \
        NCCL_CONFIG_UNDEF_INT,                            /* nvlsCTAs */                       \
        NCCL_CONFIG_UNDEF_INT,                            /* nChannelsPerNetPeer */            \
        NCCL_CONFIG_UNDEF_INT,                            /* nvlinkCentricSched */             \
    }
/* clang-format on */

/** What ncclGroupSimulateEnd reports; initialise with
 *  NCCL_SIM_INFO_INITIALIZER. */
typedef struct ncclSimInfo_v22200 {
    size_t size;
    unsigned int magic;
    unsigned int version;
    float estimatedTime; /**< microseconds, from braid's tuner model */
} ncclSimInfo_t;

/* clang-format off */
#define NCCL_SIM_INFO_INITIALIZER                                                              \
    {                                                                                          \
        sizeof(ncclSimInfo_t),                            /* size */                           \
        0x74685283,                                       /* magic */                          \
        NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), /* version */                        \
        NCCL_UNDEF_FLOAT                                  /* estimated time */                 \
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

/** Create a communicator from nId unique ids (1 <= nId <= nranks, the
 *  same ids in the same order on every rank). braid rendezvouses through
 *  the first id, which rank 0 made, as NCCL programs do. */
ncclResult_t ncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId, ncclUniqueId *commIds,
                                      ncclConfig_t *config);

/** Flush issued operations (the device calls enqueued so far) and mark
 *  the communicator finalized. */
ncclResult_t ncclCommFinalize(ncclComm_t comm);

/** Free the communicator. */
ncclResult_t ncclCommDestroy(ncclComm_t comm);

/** Abort pending operations (they fail) and free the communicator. */
ncclResult_t ncclCommAbort(ncclComm_t comm);

/** Stop comm's in-flight operations (they fail) and refuse new ones; only
 *  ncclCommDestroy, ncclCommAbort and ncclCommShrink may follow.
 *  revokeFlags must be NCCL_REVOKE_DEFAULT. */
ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags);

/** Make a communicator of comm's ranks minus excludeRanksList (ranks
 *  renumbered densely in order). Called by every rank that stays, on a
 *  healthy or failed comm; excluded ranks do not call it. NCCL_SHRINK_ABORT
 *  aborts comm's pending operations first. config NULL: comm's. */
ncclResult_t ncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount, ncclComm_t *newcomm,
                            ncclConfig_t *config, int shrinkFlags);

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

/** Symmetric memory windows: braid has none yet, so both return
 *  ncclInvalidUsage with an ncclGetLastError text. */
ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win, int winFlags);
ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);

/** Deprecated in NCCL; logging settings are read at each use here. */
void ncclResetDebugInit(void);

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
    ncclFloat8e4m3 = 10, /**< not reduced or moved by braid: ncclInvalidUsage */
    ncclFloat8e5m2 = 11, /**< not reduced or moved by braid: ncclInvalidUsage */
    ncclNumTypes = 12
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

/** Rank j's block j of sendbuff (count elements at sendbuff + j*count) goes
 *  to rank j, and rank i's block lands at recvbuff + i*count. sendbuff and
 *  recvbuff must not overlap. */
ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                          ncclComm_t comm, cudaStream_t stream);

/** Each rank's count elements land on root at recvbuff + rank*count
 *  (recvbuff unused elsewhere). In place when sendbuff == recvbuff +
 *  root*count on the root. */
ncclResult_t ncclGather(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                        ncclComm_t comm, cudaStream_t stream);

/** Rank i receives root's sendbuff + i*count (sendbuff unused elsewhere).
 *  In place when recvbuff == sendbuff + root*count on the root. */
ncclResult_t ncclScatter(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
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

/** Like ncclGroupEnd, but run nothing: drop the recorded calls and report
 *  in simInfo->estimatedTime (microseconds) how long braid's tuner model
 *  expects them to take. Communicators whose init was deferred are still
 *  created. */
ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t *simInfo);

#ifdef __cplusplus
} /* end extern "C" */
#endif

#endif /* NCCL_H_ */
