/* The one argument check of every call (coll_check.h), from its kind's
 * traits: group handle, dtype, count overflow, op, root or peer, buffers
 * and their overlap; and the classification of buffers at the entry. Each
 * failure sets the error text (rank, call, cause) and returns its status;
 * the entry point then decides whether the call is refused to the peers
 * (refuse.h). */
#include <stdint.h>
#include <stdio.h>

#include "coll_check.h"
#include "hmem.h"
#include "pg.h"
#include "status.h"

/* 1 when [a, a+alen) and [b, b+blen) share a byte. */
static int overlap(const void *a, size_t alen, const void *b, size_t blen)
{
    return alen && blen && (const char *)a < (const char *)b + blen && (const char *)b < (const char *)a + alen;
}

/* Checks every entry point shares. per_rank: the larger buffer holds one
 * count-sized block per rank, and its size must not overflow either. */
static braid_status check_common(braid_pg *pg, const char *name, size_t count, int per_rank, braid_dtype dtype)
{
    BRAID_CHECK(braid__pg_check_handle(pg, name));
    size_t blocks = per_rank ? (size_t)pg->size : 1;
    size_t esize = braid_dtype_size(dtype);
    if (esize == 0)
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: %s: invalid dtype %d", pg->rank, name, (int)dtype);
    if (count > SIZE_MAX / esize / 2 / blocks)
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: %s: count %zu overflows", pg->rank, name, count);
    return BRAID_OK;
}

/* What the calling thread's entry already knows (braid__mem_hint). */
static _Thread_local struct {
    const void *p[2];
    braid_mem m[2];
    int n;
} hint;

void braid__mem_hint(const void *send, braid_mem send_mem, const void *recv, braid_mem recv_mem)
{
    hint.n = 0;
    if (send)
        hint.p[hint.n] = send, hint.m[hint.n++] = send_mem;
    if (recv)
        hint.p[hint.n] = recv, hint.m[hint.n++] = recv_mem;
}

void braid__mem_hint_clear(void)
{
    hint.n = 0;
}

braid_mem braid__mem_known(const void *p)
{
    for (int i = 0; i < hint.n; i++)
        if (hint.p[i] == p)
            return hint.m[i];
    return braid__mem_of(p);
}

void braid__coll_classify(braid_coll *c, const braid_mem *mem)
{
    if (c->count == 0)
        return;
    if (mem) {
        c->send_mem = mem[0];
        c->recv_mem = mem[1];
        return;
    }
    if (c->send)
        c->send_mem = braid__mem_known(c->send);
    if (c->recv)
        c->recv_mem = (const void *)c->recv == c->send ? c->send_mem : braid__mem_known(c->recv);
}

/* op is valid, and MULSUM exactly when a scalar is given (the plain calls
 * pass NULL, the *_mulsum calls their scalar). */
static braid_status check_op(const braid_pg *pg, const char *name, braid_op op, const void *scalar)
{
    if ((unsigned)op >= BRAID_OP_COUNT)
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: %s: invalid op %d", pg->rank, name, (int)op);
    if (op == BRAID_MULSUM && !scalar)
        return braid__error(BRAID_ERR_INVALID_ARG,
                            "rank %d: %s: op BRAID_MULSUM needs each rank's scalar: call %s_mulsum instead",
                            pg->rank, name, name);
    if (op != BRAID_MULSUM && scalar)
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: %s: a scalar only goes with op BRAID_MULSUM", pg->rank,
                            name);
    return BRAID_OK;
}

/* p is not NULL when count > 0. */
static braid_status check_ptr(const braid_pg *pg, const char *name, const char *what, const void *p, size_t count)
{
    if (count > 0 && !p)
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: %s: %s is NULL with count %zu", pg->rank, name, what,
                            count);
    return BRAID_OK;
}

/* A buffer's name in messages: "buf" for a call that takes one, and "on
 * the root" where only the root passes it. */
static void buffer_name(char *out, size_t cap, const braid_kind_traits *t, int send)
{
    braid_blocks b = (braid_blocks)(send ? t->send_blocks : t->recv_blocks);
    if (t->one_buf)
        snprintf(out, cap, "buf");
    else
        snprintf(out, cap, "%s%s", send ? "send" : "recv",
                 b == BRAID_BLOCKS_ROOT_ONE || b == BRAID_BLOCKS_ROOT_ALL ? " on the root" : "");
}

/* How send and recv may share memory (braid_in_place). sb, rb: the bytes
 * this rank passes in each. */
static braid_status check_overlap(const braid_pg *pg, const char *name, const braid_coll *c, size_t sb, size_t rb)
{
    const braid_kind_traits *t = braid__kind(c->kind);
    if (!overlap(c->send, sb, c->recv, rb))
        return BRAID_OK;
    switch ((braid_in_place)t->in_place) {
    case BRAID_IN_PLACE_EQUAL:
        if (c->send == (const void *)c->recv && sb == rb)
            return BRAID_OK;
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: %s: send and recv overlap without being equal", pg->rank,
                            name);
    case BRAID_IN_PLACE_BLOCK: {
        int send_small = t->send_blocks == BRAID_BLOCKS_ONE; /* else recv is the block */
        const char *big = send_small ? (const char *)c->recv : (const char *)c->send;
        const void *small = send_small ? c->send : (const void *)c->recv;
        size_t block = send_small ? sb : rb;
        if (small == big + (size_t)pg->rank * block)
            return BRAID_OK;
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: %s: %s overlaps %s without being its block %d (in place)",
                            pg->rank, name, send_small ? "send" : "recv", send_small ? "recv" : "send", pg->rank);
    }
    case BRAID_IN_PLACE_NONE:
        break;
    }
    return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: %s: send and recv overlap; %s has no in-place form", pg->rank,
                        name, name);
}

braid_status braid__check_call(braid_pg *pg, const char *name, const braid_coll *c, const void *scalar)
{
    const braid_kind_traits *t = braid__kind(c->kind);
    int per_rank = t->send_blocks == BRAID_BLOCKS_ALL || t->send_blocks == BRAID_BLOCKS_ROOT_ALL ||
                   t->recv_blocks == BRAID_BLOCKS_ALL || t->recv_blocks == BRAID_BLOCKS_ROOT_ALL;
    BRAID_CHECK(check_common(pg, name, c->count, per_rank, c->dtype));
    if (t->has_op)
        BRAID_CHECK(check_op(pg, name, c->op, scalar));
    int who = t->p2p ? c->peer : c->root;
    if ((t->has_root || t->p2p) && (who < 0 || who >= pg->size))
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: %s: %s %d out of range [0, %d)", pg->rank, name,
                            t->p2p ? "peer" : "root", who, pg->size);
    size_t bytes = c->count * braid_dtype_size(c->dtype);
    size_t sb = bytes * braid__blocks_on((braid_blocks)t->send_blocks, pg->rank, c->root, pg->size);
    size_t rb = bytes * braid__blocks_on((braid_blocks)t->recv_blocks, pg->rank, c->root, pg->size);
    char what[24];
    if (sb && !c->send) {
        buffer_name(what, sizeof(what), t, 1);
        return check_ptr(pg, name, what, c->send, c->count);
    }
    if (rb && !c->recv) {
        buffer_name(what, sizeof(what), t, 0);
        return check_ptr(pg, name, what, c->recv, c->count);
    }
    return check_overlap(pg, name, c, sb, rb);
}
