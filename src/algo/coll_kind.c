/* What each kind of call is (coll.h): one row per kind, read by the entry
 * checks, refusals, fingerprints, the tuner, device staging and the NCCL
 * shim, so that none of them spells out a list of kinds of its own. */
#include "algo/coll.h"

#define ROW(k) [BRAID_COLL_##k]
#define EQUAL BRAID_IN_PLACE_EQUAL
#define BLOCK BRAID_IN_PLACE_BLOCK
#define ONE BRAID_BLOCKS_ONE
#define ALL BRAID_BLOCKS_ALL
#define ROOT_ONE BRAID_BLOCKS_ROOT_ONE
#define ROOT_ALL BRAID_BLOCKS_ROOT_ALL

/* Unnamed fields are 0: no op, no root, not in place, no buffer. */
const braid_kind_traits braid__kind_table[BRAID_COLL_KIND_COUNT] = {
    ROW(ALLREDUCE) = {.name = "allreduce",
                      .nccl_name = "ncclAllReduce",
                      .has_op = 1,
                      .in_place = EQUAL,
                      .send_blocks = ONE,
                      .recv_blocks = ONE},
    ROW(BROADCAST) = {.name = "broadcast",
                      .nccl_name = "ncclBroadcast",
                      .has_root = 1,
                      .one_buf = 1,
                      .in_place = EQUAL,
                      .send_blocks = ROOT_ONE,
                      .recv_blocks = ONE},
    ROW(REDUCE) = {.name = "reduce",
                   .nccl_name = "ncclReduce",
                   .has_op = 1,
                   .has_root = 1,
                   .in_place = EQUAL,
                   .send_blocks = ONE,
                   .recv_blocks = ROOT_ONE},
    ROW(ALLGATHER) =
        {.name = "allgather", .nccl_name = "ncclAllGather", .in_place = BLOCK, .send_blocks = ONE, .recv_blocks = ALL},
    ROW(REDUCE_SCATTER) = {.name = "reduce_scatter",
                           .nccl_name = "ncclReduceScatter",
                           .has_op = 1,
                           .in_place = BLOCK,
                           .send_blocks = ALL,
                           .recv_blocks = ONE},
    ROW(SEND) = {.name = "send", .nccl_name = "ncclSend", .p2p = 1, .one_buf = 1, .send_blocks = ONE},
    ROW(RECV) = {.name = "recv", .nccl_name = "ncclRecv", .p2p = 1, .one_buf = 1, .recv_blocks = ONE},
    ROW(GROUP) = {.name = "group", .nccl_name = "ncclGroupEnd"},
    ROW(ALLTOALL) =
        {.name = "alltoall", .nccl_name = "ncclAlltoAll", .exchange = 1, .send_blocks = ALL, .recv_blocks = ALL},
    ROW(GATHER) = {.name = "gather",
                   .nccl_name = "ncclGather",
                   .has_root = 1,
                   .exchange = 1,
                   .in_place = BLOCK,
                   .send_blocks = ONE,
                   .recv_blocks = ROOT_ALL},
    ROW(SCATTER) = {.name = "scatter",
                    .nccl_name = "ncclScatter",
                    .has_root = 1,
                    .exchange = 1,
                    .in_place = BLOCK,
                    .send_blocks = ROOT_ALL,
                    .recv_blocks = ONE},
};

const braid_kind_traits braid__kind_unknown = {.name = "?", .nccl_name = "?"};

size_t braid__blocks_on(braid_blocks b, int rank, int root, int size)
{
    switch (b) {
    case BRAID_BLOCKS_NONE:
        return 0;
    case BRAID_BLOCKS_ONE:
        return 1;
    case BRAID_BLOCKS_ALL:
        return (size_t)size;
    case BRAID_BLOCKS_ROOT_ONE:
        return rank == root;
    case BRAID_BLOCKS_ROOT_ALL:
        return rank == root ? (size_t)size : 0;
    }
    return 0;
}

int braid__coll_job_kind(const braid_coll *coll)
{
    return coll->kind == BRAID_COLL_GROUP && coll->call ? (int)coll->call : (int)coll->kind;
}

const char *braid__coll_job_name(const braid_coll *coll)
{
    return braid__kind(braid__coll_job_kind(coll))->name;
}

uint64_t braid__coll_job_bytes(const braid_coll *coll)
{
    if (coll->kind != BRAID_COLL_GROUP)
        return (uint64_t)coll->count * braid_dtype_size(coll->dtype);
    uint64_t sum = 0;
    for (int i = 0; i < coll->nops; i++)
        if (!coll->call || coll->ops[i].kind == BRAID_COLL_SEND)
            sum += braid__coll_job_bytes(&coll->ops[i]);
    return sum;
}
