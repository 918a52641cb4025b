/* All-to-all, gather and scatter: collectives whose every byte has one
 * source and one destination, so there is nothing to reduce or forward.
 * Each is one braid group of sends and receives (group.c): the executor
 * progresses all of a rank's transfers together, so no ordering of peers
 * can deadlock, and the p2p layer's fingerprints catch ranks that disagree
 * on count or dtype. A rank's own block is a send to itself paired with a
 * receive from itself inside the group, i.e. one copy, skipped when the
 * call is in place. Work handles, nesting inside an open group and the
 * failure path are the group's. A call its checks refuse is refused to the
 * peers, as the other collectives are (refuse.h); the group job carries
 * the call's kind, so that a peer's failure names the call. */
#include <stdio.h>
#include <stdlib.h>

#include "coll_check.h"
#include "hmem.h"
#include "pg.h"
#include "refuse.h"
#include "status.h"

/* One transfer of the plan: this rank's block for/from `peer`. */
typedef struct {
    const char *send; /* NULL: nothing to send to peer */
    char *recv;       /* NULL: nothing to receive from peer */
} exchange_slot;

/* Record sends and receives (peer order, starting after this rank so that
 * rank r's first message goes to r+1, spreading the load), then run them
 * as one group that runs public call `call`. mem: the memory of the
 * buffers sends read (mem[0]) and receives write (mem[1]), classified once
 * by the caller; device buffers run on cuda_stream (hmem.h). */
static braid_status exchange_run(braid_pg *pg, const exchange_slot *slots, size_t count, braid_dtype dtype,
                                 braid_coll_kind call, const braid_mem mem[2], void *cuda_stream, braid_work **work)
{
    int n = pg->size, rank = pg->rank;
    if (work)
        *work = NULL;
    braid_status st = braid_group_start(pg);
    if (st != BRAID_OK)
        return st;
    for (int k = 0; k < n && st == BRAID_OK; k++) {
        int peer = (rank + k) % n;
        if (slots[peer].send)
            st = braid__p2p_submit(pg, BRAID_COLL_SEND, slots[peer].send, count, dtype, peer, &mem[0], cuda_stream,
                                   NULL);
        if (st == BRAID_OK && slots[peer].recv)
            st = braid__p2p_submit(pg, BRAID_COLL_RECV, slots[peer].recv, count, dtype, peer, &mem[1], cuda_stream,
                                   NULL);
    }
    /* The group is closed also when recording failed; then nothing runs
     * that the caller would have to wait for. */
    braid_status end = braid__group_end(pg, call, st == BRAID_OK ? work : NULL);
    return st != BRAID_OK ? st : end;
}

/* Run the plan and free it. */
static braid_status exchange_with_plan(braid_pg *pg, exchange_slot *slots, size_t count, braid_dtype dtype,
                                       braid_coll_kind call, const braid_mem mem[2], void *cuda_stream,
                                       braid_work **work)
{
    braid_status st = exchange_run(pg, slots, count, dtype, call, mem, cuda_stream, work);
    free(slots);
    return st;
}

/* An empty plan, one slot per rank. */
static braid_status slots_alloc(const braid_pg *pg, const char *name, exchange_slot **out)
{
    *out = calloc((size_t)pg->size, sizeof(**out));
    if (!*out)
        return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: %s: out of memory for %d peers", pg->rank, name, pg->size);
    return BRAID_OK;
}

static braid_status alltoall_checked(braid_pg *pg, const void *send, void *recv, size_t count, braid_dtype dtype,
                                     void *cuda_stream, braid_work **work)
{
    const char *name = "alltoall";
    /* Every block of recv is written while others of send are still to be
     * read: there is no in-place form (NCCL has none either). */
    braid_coll c = {.kind = BRAID_COLL_ALLTOALL, .send = send, .recv = recv, .count = count, .dtype = dtype,
                    .root = -1};
    BRAID_CHECK(braid__check_call(pg, name, &c, NULL));
    size_t bytes = count * braid_dtype_size(dtype);
    exchange_slot *slots;
    BRAID_CHECK(slots_alloc(pg, name, &slots));
    for (int p = 0; p < pg->size; p++)
        slots[p] = (exchange_slot){(const char *)send + (size_t)p * bytes, (char *)recv + (size_t)p * bytes};
    braid_mem mem[2] = {{0, 0}, {0, 0}};
    if (count > 0)
        mem[0] = braid__mem_known(send), mem[1] = braid__mem_known(recv);
    return exchange_with_plan(pg, slots, count, dtype, BRAID_COLL_ALLTOALL, mem, cuda_stream, work);
}

/* Gather (gather = 1: every rank's `block` goes to the root's `all`) and
 * scatter (gather = 0: the root's `all` is dealt out into every `block`).
 * all holds size blocks and is only used on the root; the call is in place
 * there when block is the root's own block of all. */
static braid_status rooted(braid_pg *pg, const char *name, int gather, const void *all, const void *block, size_t count,
                           braid_dtype dtype, int root, void *cuda_stream, braid_work **work)
{
    braid_coll c = {.kind = gather ? BRAID_COLL_GATHER : BRAID_COLL_SCATTER, .send = gather ? block : all,
                    .recv = (void *)(gather ? all : block), .count = count, .dtype = dtype, .root = root};
    BRAID_CHECK(braid__check_call(pg, name, &c, NULL));
    size_t bytes = count * braid_dtype_size(dtype);
    /* all is only valid on the root (NULL elsewhere, as NCCL allows) */
    int in_place = pg->rank == root && all && (const char *)block == (const char *)all + (size_t)root * bytes;
    exchange_slot *slots;
    BRAID_CHECK(slots_alloc(pg, name, &slots));
    if (pg->rank == root)
        for (int p = 0; p < pg->size; p++) {
            const char *b = (const char *)all + (size_t)p * bytes;
            if (p == root && in_place)
                continue; /* the block is already where it belongs */
            if (gather)
                slots[p].recv = (char *)b;
            else
                slots[p].send = b;
        }
    if (!in_place) {
        if (gather)
            slots[root].send = block;
        else
            slots[root].recv = (char *)block;
    }
    /* The buffers sends read and receives write, each classified once. */
    braid_mem block_mem = count ? braid__mem_known(block) : (braid_mem){0, 0};
    braid_mem all_mem = count && pg->rank == root ? braid__mem_known(all) : (braid_mem){0, 0};
    braid_mem mem[2] = {gather ? block_mem : all_mem, gather ? all_mem : block_mem};
    return exchange_with_plan(pg, slots, count, dtype, gather ? BRAID_COLL_GATHER : BRAID_COLL_SCATTER, mem,
                              cuda_stream, work);
}

/* A call its checks refuse is refused to the peers as well (refuse.h). */
BRAID_API braid_status braid_alltoall(braid_pg *pg, const void *send, void *recv, size_t count, braid_dtype dtype,
                                      void *cuda_stream, braid_work **work)
{
    braid_status st = alltoall_checked(pg, send, recv, count, dtype, cuda_stream, work);
    return braid__refuse_call(pg, st, BRAID_COLL_ALLTOALL, send, recv, count, dtype, BRAID_SUM, -1);
}

BRAID_API braid_status braid_gather(braid_pg *pg, const void *send, void *recv, size_t count, braid_dtype dtype,
                                    int root, void *cuda_stream, braid_work **work)
{
    braid_status st = rooted(pg, "gather", 1, recv, send, count, dtype, root, cuda_stream, work);
    return braid__refuse_call(pg, st, BRAID_COLL_GATHER, send, recv, count, dtype, BRAID_SUM, root);
}

BRAID_API braid_status braid_scatter(braid_pg *pg, const void *send, void *recv, size_t count, braid_dtype dtype,
                                     int root, void *cuda_stream, braid_work **work)
{
    braid_status st = rooted(pg, "scatter", 0, send, recv, count, dtype, root, cuda_stream, work);
    return braid__refuse_call(pg, st, BRAID_COLL_SCATTER, send, recv, count, dtype, BRAID_SUM, root);
}
