/* Argument checks shared by the collective entry points outside the
 * all-reduce and broadcast paths (coll_check.h): group handle, dtype,
 * count overflow, CUDA stream, buffers and op. Each failure sets the error
 * text (rank, call, cause) and returns its status; the entry point then
 * decides whether the call is refused to the peers (refuse.h). */
#include <stdint.h>

#include "coll_check.h"
#include "hmem.h"
#include "pg.h"
#include "status.h"

int braid__overlap(const void *a, size_t alen, const void *b, size_t blen)
{
    return alen && blen && (const char *)a < (const char *)b + blen && (const char *)b < (const char *)a + alen;
}

/* Checks every entry point shares. per_rank: the larger buffer holds one
 * count-sized block per rank, and its size must not overflow either. */
braid_status braid__check_common(braid_pg *pg, const char *name, size_t count, int per_rank, braid_dtype dtype)
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

braid_status braid__check_op(const braid_pg *pg, const char *name, braid_op op, const void *scalar)
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

braid_status braid__check_ptr(const braid_pg *pg, const char *name, const char *what, const void *p, size_t count)
{
    if (count > 0 && !p)
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: %s: %s is NULL with count %zu", pg->rank, name, what,
                            count);
    return BRAID_OK;
}
