/* The cut of a staged job's ops into pieces and their areas in a pool
 * half (hmem_plan.h). */
#include "hmem_plan.h"

#include <stdlib.h>

#include "hmem.h"

/* Largest piece of a send or receive; a run of them to and from every peer
 * takes (2 x group size) areas, which must fit one half. */
#define P2P_PIECE_MAX (1u << 20)
#define P2P_PIECE_MIN 4096u

static size_t align_up(size_t n)
{
    return (n + BRAID_PLAN_ALIGN - 1) / BRAID_PLAN_ALIGN * BRAID_PLAN_ALIGN;
}

static size_t p2p_budget(int size)
{
    size_t b = BRAID_HMEM_PIECE_BYTES / (2 * (size_t)size) / BRAID_PLAN_ALIGN * BRAID_PLAN_ALIGN;
    return b > P2P_PIECE_MAX ? P2P_PIECE_MAX : b < P2P_PIECE_MIN ? P2P_PIECE_MIN : b;
}

void braid__plan_op(int rank, int size, braid_coll *op, braid_piece_plan *p)
{
    size_t n = (size_t)size, rows = 1;
    /* Two areas: room for both to round up. All-reduce and broadcast keep
     * whole pieces of BRAID_HMEM_PIECE_BYTES (one area), as a host rank
     * of the same call may count on. */
    size_t budget = BRAID_HMEM_PIECE_BYTES - 2 * BRAID_PLAN_ALIGN;
    *p = (braid_piece_plan){.op = op, .esize = braid_dtype_size(op->dtype)};
    switch (op->kind) {
    case BRAID_COLL_ALLREDUCE:
        p->srows = p->rrows = p->shared = p->down = p->up = 1;
        budget = BRAID_HMEM_PIECE_BYTES;
        break;
    case BRAID_COLL_BROADCAST: /* the root's goes down, the others' comes up (the root's too, out of place) */
        p->srows = p->rrows = p->shared = 1;
        p->down = op->root == rank;
        p->up = !p->down || (const void *)op->recv != op->send;
        budget = BRAID_HMEM_PIECE_BYTES;
        break;
    case BRAID_COLL_REDUCE:
        p->srows = p->down = 1;
        p->rrows = p->up = op->root == rank;
        rows = 2;
        break;
    case BRAID_COLL_ALLGATHER:
        p->srows = p->down = p->up = 1;
        p->rrows = size;
        rows = n + 1;
        break;
    case BRAID_COLL_REDUCE_SCATTER:
        p->srows = size;
        p->rrows = p->down = p->up = 1;
        rows = n + 1;
        break;
    case BRAID_COLL_SEND:
        p->srows = p->down = 1;
        budget = p2p_budget(size);
        break;
    case BRAID_COLL_RECV:
        p->rrows = p->up = 1;
        budget = p2p_budget(size);
        break;
    default:
        break; /* nothing else reaches the executor with buffers */
    }
    p->per = p->esize ? budget / (p->esize * rows) : 1;
    if (p->per == 0)
        p->per = 1;
    if (op->count && p->per > op->count)
        p->per = op->count;
    p->npieces = op->count ? (op->count + p->per - 1) / p->per : 1;
    if (!op->send_mem.device_mem && !op->recv_mem.device_mem) { /* as a host call would run it */
        p->whole = 1;
        p->per = op->count ? op->count : 1;
        p->npieces = 1;
    }
}

static int same_chain(const braid_piece_plan *a, const braid_piece_plan *b)
{
    int p2p = a->op->kind == BRAID_COLL_SEND || a->op->kind == BRAID_COLL_RECV;
    return p2p && a->op->kind == b->op->kind && a->op->peer == b->op->peer;
}

size_t braid__plan_layout(braid_piece_plan *plans, int n)
{
    /* A (peer, direction)'s messages go in issue order, as NCCL matches
     * them: an op starts where the one before it to that peer ended, and
     * shares its area (never two of them at one step). */
    int *owner = malloc((size_t)(n ? n : 1) * sizeof(*owner));
    size_t *sbytes = calloc((size_t)(n ? n : 1), sizeof(*sbytes)), *rbytes = calloc((size_t)(n ? n : 1), sizeof(*rbytes));
    size_t off = 0;
    if (!owner || !sbytes || !rbytes) {
        free(owner);
        free(sbytes);
        free(rbytes);
        return (size_t)-1;
    }
    for (int i = 0; i < n; i++) {
        braid_piece_plan *p = &plans[i];
        owner[i] = i;
        for (int j = i - 1; j >= 0; j--)
            if (same_chain(&plans[j], p)) {
                p->start = plans[j].start + plans[j].npieces;
                break;
            }
        if (p->whole)
            continue;
        for (int j = 0; j < i; j++)
            if (same_chain(&plans[j], p) && !plans[j].whole) {
                owner[i] = j;
                break;
            }
        size_t piece = p->per * p->esize, o = (size_t)owner[i];
        sbytes[o] = piece * (size_t)p->srows > sbytes[o] ? piece * (size_t)p->srows : sbytes[o];
        rbytes[o] = piece * (size_t)p->rrows > rbytes[o] ? piece * (size_t)p->rrows : rbytes[o];
    }
    for (int i = 0; i < n; i++) {
        braid_piece_plan *p = &plans[i];
        if (p->whole || owner[i] != i)
            continue;
        p->soff = off;
        off += align_up(sbytes[i]);
        p->roff = p->shared ? p->soff : off;
        if (!p->shared)
            off += align_up(rbytes[i]);
    }
    for (int i = 0; i < n; i++)
        if (!plans[i].whole && owner[i] != i) {
            plans[i].soff = plans[owner[i]].soff;
            plans[i].roff = plans[owner[i]].roff;
        }
    free(owner);
    free(sbytes);
    free(rbytes);
    return off;
}

size_t braid__plan_steps(const braid_piece_plan *plans, int n)
{
    size_t steps = 0;
    for (int i = 0; i < n; i++)
        if (plans[i].start + plans[i].npieces > steps)
            steps = plans[i].start + plans[i].npieces;
    return steps;
}

int braid__plan_piece(const braid_piece_plan *p, size_t k, size_t *off, size_t *len)
{
    if (k < p->start || k - p->start >= p->npieces)
        return 0;
    size_t j = k - p->start;
    *off = j * p->per;
    *len = p->op->count - *off < p->per ? p->op->count - *off : p->per;
    return 1;
}
