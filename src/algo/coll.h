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
    /* Run as a GROUP of sends and receives (src/calls/exchange.c); a job of these
     * kinds is only ever a refusal (src/calls/refuse.h), and names the group's
     * call (.call). Last, so the kinds above keep their wire values. */
    BRAID_COLL_ALLTOALL,
    BRAID_COLL_GATHER,
    BRAID_COLL_SCATTER,
} braid_coll_kind;

/* How many of a buffer's count-element blocks a rank passes to a call:
 * none, one, one per rank, or those two on the call's root only. */
typedef enum {
    BRAID_BLOCKS_NONE,
    BRAID_BLOCKS_ONE,
    BRAID_BLOCKS_ALL,
    BRAID_BLOCKS_ROOT_ONE,
    BRAID_BLOCKS_ROOT_ALL,
} braid_blocks;

/* How a call's send and recv buffers may share memory. */
typedef enum {
    BRAID_IN_PLACE_NONE,  /* not at all */
    BRAID_IN_PLACE_EQUAL, /* send == recv */
    BRAID_IN_PLACE_BLOCK, /* the smaller one is this rank's (the root's, for a rooted call) block of the larger */
} braid_in_place;

/* What a kind of call is (coll_kind.c): the one description that entry
 * checks, refusals, fingerprints, the tuner, staging and the NCCL shim
 * read. */
typedef struct {
    const char *name;      /* braid's: "allreduce" */
    const char *nccl_name; /* the NCCL call: "ncclAllReduce" */
    unsigned char has_op;   /* takes a reduction op */
    unsigned char has_root; /* takes a root */
    unsigned char p2p;      /* a send or receive: takes a peer, no sequence number */
    unsigned char exchange; /* runs as a group of sends and receives (src/calls/exchange.c) */
    unsigned char one_buf;  /* the public call takes one buffer, "buf" (broadcast, send, recv) */
    unsigned char in_place; /* braid_in_place */
    unsigned char send_blocks, recv_blocks; /* braid_blocks */
} braid_kind_traits;

#define BRAID_COLL_KIND_COUNT (BRAID_COLL_SCATTER + 1)
extern const braid_kind_traits braid__kind_table[BRAID_COLL_KIND_COUNT];
extern const braid_kind_traits braid__kind_unknown;

/* The traits of kind; a row named "?" for a value that is no kind. Inline:
 * every call reads it on its way in. */
static inline const braid_kind_traits *braid__kind(int kind)
{
    if ((unsigned)kind >= BRAID_COLL_KIND_COUNT || !braid__kind_table[kind].name)
        return &braid__kind_unknown;
    return &braid__kind_table[kind];
}

/* 1 when kind is a braid_coll_kind. */
static inline int braid__kind_valid(int kind)
{
    return braid__kind(kind) != &braid__kind_unknown;
}
/* The blocks b comes to on rank of a group of size with this root. */
size_t braid__blocks_on(braid_blocks b, int rank, int root, int size);

/* Where a buffer lives, decided once per buffer at a call's entry by the
 * one classifier (braid__mem_of, src/calls/hmem.h) and carried in the call
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
    struct braid_hmem_job *hmem; /* device buffers: staging job (src/calls/hmem.h); the job owns it */
    int premul;                  /* MULSUM: send is still to be multiplied by scalar (src/calls/mulsum.c) */
    unsigned char scalar[8];     /* MULSUM: this rank's scalar, one element of dtype */
    const char *refused; /* set: this rank refused the call, for this reason; tell the peers (src/calls/refuse.h) */
    braid_mem send_mem, recv_mem; /* set at the entry (count > 0; braid__coll_classify) */
    void *stream; /* a call inside a group: the caller's CUDA stream (cudaStream_t), or NULL */
} braid_coll;

/* A job's kind: its own, or for a group that runs one public call
 * (braid_alltoall...) that call's; and that kind's name, for messages. */
int braid__coll_job_kind(const braid_coll *coll);
const char *braid__coll_job_name(const braid_coll *coll);
/* A job's count times its element size; a group's, summed over its calls
 * (over the sends only for a group that runs a public call: alltoall...).
 * What braid_pg_stats and the flight recorder count. */
uint64_t braid__coll_job_bytes(const braid_coll *coll);

#endif
