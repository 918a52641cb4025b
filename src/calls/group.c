/* Groups (NCCL's ncclGroupStart/End on one process group): calls made
 * between braid_group_start and braid_group_end by the thread that opened
 * the group are recorded, not run, and the outermost end submits them as
 * one executor job. That job runs them in issue order, and every run of
 * consecutive sends and receives as one batch progressed together
 * (algo/dispatch.c, algo/p2p.c), which is what lets a rank exchange with
 * several peers at once without deadlock.
 *
 * The group belongs to the thread that opened it, as NCCL's group is
 * thread-local: other threads' calls on the same group go straight to the
 * executor. Recording happens inside braid__work_submit under pg->mu, so
 * every entry point (all-reduce and broadcast included) joins groups
 * without knowing about them. */
#include <stdlib.h>

#include "algo/algo.h"
#include "hmem.h"
#include "pg.h"
#include "status.h"

struct braid_group {
    int depth;       /* nesting: only the outermost end submits */
    pthread_t owner; /* the opening thread, while depth > 0 */
    braid_coll *ops;
    int nops, cap;
};

static int owned_here(const struct braid_group *g)
{
    return g && g->depth > 0 && pthread_equal(g->owner, pthread_self());
}

BRAID_API braid_status braid_group_start(braid_pg *pg)
{
    BRAID_CHECK(braid__pg_check_handle(pg, "braid_group_start"));
    pthread_mutex_lock(&pg->mu);
    if (!pg->group && !(pg->group = calloc(1, sizeof(*pg->group)))) {
        pthread_mutex_unlock(&pg->mu);
        return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: out of memory for a group", pg->rank);
    }
    struct braid_group *g = pg->group;
    if (g->depth > 0 && !pthread_equal(g->owner, pthread_self())) {
        pthread_mutex_unlock(&pg->mu);
        return braid__error(BRAID_ERR_INVALID_ARG,
                            "rank %d: braid_group_start: another thread has a group open on this process group",
                            pg->rank);
    }
    if (g->depth++ == 0)
        g->owner = pthread_self();
    pthread_mutex_unlock(&pg->mu);
    return BRAID_OK;
}

/* Every run of consecutive sends/receives must pair its messages to this
 * rank itself; checked here so a usage error does not break the group. */
static braid_status check_batches(const braid_pg *pg, const braid_coll *ops, int nops)
{
    for (int i = 0; i < nops;) {
        int n = 0;
        while (i + n < nops && (ops[i + n].kind == BRAID_COLL_SEND || ops[i + n].kind == BRAID_COLL_RECV))
            n++;
        if (n)
            BRAID_CHECK(braid__p2p_check_self(pg->rank, ops + i, n));
        i += n ? n : 1;
    }
    return BRAID_OK;
}

BRAID_API braid_status braid_group_end(braid_pg *pg, braid_work **work)
{
    return braid__group_end(pg, (braid_coll_kind)0, work);
}

braid_status braid__group_end(braid_pg *pg, braid_coll_kind call, braid_work **work)
{
    BRAID_CHECK(braid__pg_check_handle(pg, "braid_group_end"));
    if (work)
        *work = NULL;
    pthread_mutex_lock(&pg->mu);
    struct braid_group *g = pg->group;
    if (!owned_here(g)) {
        pthread_mutex_unlock(&pg->mu);
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: braid_group_end without braid_group_start on this thread",
                            pg->rank);
    }
    if (--g->depth > 0) {
        pthread_mutex_unlock(&pg->mu);
        return BRAID_OK; /* an inner end: the outermost one runs the group */
    }
    /* The job takes the recorded calls over. */
    braid_coll job = {.kind = BRAID_COLL_GROUP, .ops = g->ops, .nops = g->nops, .call = call, .root = -1};
    g->ops = NULL;
    g->nops = g->cap = 0;
    pthread_mutex_unlock(&pg->mu);

    braid_status st = check_batches(pg, job.ops, job.nops);
    if (st != BRAID_OK) {
        braid__coll_release(&job);
        return st;
    }
    if (job.nops == 0 && !work) {
        braid__coll_release(&job);
        return BRAID_OK;
    }
    return braid__hmem_submit(pg, &job, NULL, work); /* device buffers: staged, after their streams */
}

int braid__group_capture_locked(braid_pg *pg, const braid_coll *coll, braid_work **work, braid_status *st)
{
    struct braid_group *g = pg->group;
    if (coll->kind == BRAID_COLL_GROUP || !owned_here(g))
        return 0;
    if (work) {
        *st = braid__error(BRAID_ERR_INVALID_ARG,
                           "rank %d: %s inside a group takes work = NULL: braid_group_end returns the group's handle",
                           pg->rank, braid__kind(coll->kind)->name);
        return 1;
    }
    if (g->nops == g->cap) {
        int cap = g->cap ? 2 * g->cap : 16;
        braid_coll *ops = realloc(g->ops, (size_t)cap * sizeof(*ops));
        if (!ops) {
            *st = braid__error(BRAID_ERR_NO_MEMORY, "rank %d: out of memory recording call %d of a group", pg->rank,
                               g->nops);
            return 1;
        }
        g->ops = ops;
        g->cap = cap;
    }
    g->ops[g->nops++] = *coll;
    *st = BRAID_OK;
    return 1;
}

int braid__group_open_here(braid_pg *pg)
{
    pthread_mutex_lock(&pg->mu);
    int open = owned_here(pg->group);
    pthread_mutex_unlock(&pg->mu);
    return open;
}

uint64_t braid__coll_seqs(const braid_coll *coll)
{
    const braid_kind_traits *t = braid__kind(coll->kind);
    if (t->p2p || t->exchange)
        return 0; /* an exchange kind here is a refusal of a group of sends and receives */
    if (coll->kind != BRAID_COLL_GROUP)
        return 1;
    uint64_t n = 0;
    for (int i = 0; i < coll->nops; i++)
        n += braid__coll_seqs(&coll->ops[i]);
    return n;
}

void braid__coll_release(braid_coll *coll)
{
    braid__hmem_coll_release(coll); /* device staging job: lets the caller's stream go on */
    if (coll->kind == BRAID_COLL_GROUP) {
        free(coll->ops);
        coll->ops = NULL;
        coll->nops = 0;
    }
}

void braid__group_release(braid_pg *pg)
{
    if (pg->group) {
        free(pg->group->ops); /* a group still open at destruction never runs */
        free(pg->group);
        pg->group = NULL;
    }
    free(pg->p2p_seq);
    pg->p2p_seq = NULL;
}
