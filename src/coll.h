/* One collective call as the executor queues it and the algorithms run it. */
#ifndef BRAID_COLL_H
#define BRAID_COLL_H

#include <stddef.h>
#include <stdint.h>

#include "braid.h"

typedef enum {
    BRAID_COLL_ALLREDUCE = 1,
    BRAID_COLL_BROADCAST,
    BRAID_COLL_REDUCE,
    BRAID_COLL_ALLGATHER,
    BRAID_COLL_REDUCE_SCATTER,
    BRAID_COLL_SEND,  /* point-to-point with .peer; takes no sequence number */
    BRAID_COLL_RECV,
    BRAID_COLL_GROUP, /* .ops[0..nops) recorded between braid_group_start/end */
    /* Run as a GROUP of sends and receives (src/exchange.c); a job of these
     * kinds is only ever a refusal (src/refuse.h), and names the group's
     * call (.call). Last, so the kinds above keep their wire values. */
    BRAID_COLL_ALLTOALL,
    BRAID_COLL_GATHER,
    BRAID_COLL_SCATTER,
} braid_coll_kind;

/* Where a buffer lives, decided once per buffer at a call's entry by the
 * one classifier (braid__mem_of, src/hmem.h) and carried in the call
 * record. Zero is host memory. */
typedef struct {
    int device_mem; /* 1: CUDA device or managed memory */
    int device;     /* its device ordinal (device_mem only) */
} braid_mem;

/* One collective call, as the algorithms see it. */
typedef struct braid_coll {
    braid_coll_kind kind;
    const void *send;
    void *recv;
    size_t count;
    braid_dtype dtype;
    braid_op op;
    int root;
    uint64_t seq;      /* per-group sequence number, identical on every rank */
    braid_algo algo;   /* resolved by the tuner before running */
    int peer;          /* SEND/RECV: the other rank */
    struct braid_coll *ops; /* GROUP: the recorded calls; the job owns them */
    int nops;
    braid_coll_kind call;        /* GROUP: the public call it runs (ALLTOALL...), 0 for braid_group_end's */
    struct braid_hmem_job *hmem; /* device buffers: staging job (src/hmem.h); the job owns it */
    int premul;                  /* MULSUM: send is still to be multiplied by scalar (src/mulsum.c) */
    unsigned char scalar[8];     /* MULSUM: this rank's scalar, one element of dtype */
    const char *refused; /* set: this rank refused the call, for this reason; tell the peers (src/refuse.h) */
    braid_mem send_mem, recv_mem; /* set at the entry (count > 0; braid__coll_classify) */
    void *stream; /* a call inside a group: the caller's CUDA stream (cudaStream_t), or NULL */
} braid_coll;

#endif
