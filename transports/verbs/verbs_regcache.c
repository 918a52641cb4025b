/* Registration cache: a sorted array of non-overlapping regions (binary
 * search; the cache holds at most a few hundred regions, so memmove on
 * insert is cheaper than a tree's pointer chasing) plus an LRU list of the
 * unreferenced ones. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "verbs_regcache.h"

int braid__verbs_regcache_init(braid_verbs_regcache *rc, const braid_verbs_regcache_cfg *cfg)
{
    if (!cfg->reg || !cfg->dereg || cfg->page_bytes == 0 || (cfg->page_bytes & (cfg->page_bytes - 1)) ||
        cfg->max_regions == 0)
        return EINVAL;
    memset(rc, 0, sizeof(*rc));
    rc->cfg = *cfg;
    return 0;
}

/* Index of the last region whose start is <= addr, or -1. */
static long find_le(const braid_verbs_regcache *rc, uintptr_t addr)
{
    long lo = 0, hi = (long)rc->count - 1, found = -1;
    while (lo <= hi) {
        long mid = lo + (hi - lo) / 2;
        if (rc->index[mid]->start <= addr) {
            found = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return found;
}

static void lru_unlink(braid_verbs_regcache *rc, braid_verbs_region *r)
{
    if (r->lru_prev)
        r->lru_prev->lru_next = r->lru_next;
    else if (rc->lru_head == r)
        rc->lru_head = r->lru_next;
    if (r->lru_next)
        r->lru_next->lru_prev = r->lru_prev;
    else if (rc->lru_tail == r)
        rc->lru_tail = r->lru_prev;
    r->lru_prev = r->lru_next = NULL;
}

static void lru_push(braid_verbs_regcache *rc, braid_verbs_region *r)
{
    r->lru_next = NULL;
    r->lru_prev = rc->lru_tail;
    if (rc->lru_tail)
        rc->lru_tail->lru_next = r;
    else
        rc->lru_head = r;
    rc->lru_tail = r;
}

static void destroy(braid_verbs_regcache *rc, braid_verbs_region *r)
{
    rc->cfg.dereg(rc->cfg.ctx, r->mr);
    free(r);
}

/* Take r out of the index; free it now if nobody uses it, else leave it to
 * the last release. */
static void retire(braid_verbs_regcache *rc, braid_verbs_region *r)
{
    long i = find_le(rc, r->start);
    if (i >= 0 && rc->index[i] == r) {
        memmove(&rc->index[i], &rc->index[i + 1], (rc->count - (size_t)i - 1) * sizeof(rc->index[0]));
        rc->count--;
        rc->bytes -= r->end - r->start;
    }
    r->indexed = 0;
    if (r->refs == 0) {
        lru_unlink(rc, r);
        destroy(rc, r);
    }
}

static void evict(braid_verbs_regcache *rc)
{
    while ((rc->count > rc->cfg.max_regions || rc->bytes > rc->cfg.max_bytes) && rc->lru_head) {
        rc->stats.evictions++;
        retire(rc, rc->lru_head);
    }
}

static int insert(braid_verbs_regcache *rc, braid_verbs_region *r)
{
    if (rc->count == rc->cap) {
        size_t cap = rc->cap ? rc->cap * 2 : 16;
        braid_verbs_region **grown = realloc(rc->index, cap * sizeof(*grown));
        if (!grown)
            return ENOMEM;
        rc->index = grown;
        rc->cap = cap;
    }
    size_t pos = (size_t)(find_le(rc, r->start) + 1);
    memmove(&rc->index[pos + 1], &rc->index[pos], (rc->count - pos) * sizeof(rc->index[0]));
    rc->index[pos] = r;
    rc->count++;
    rc->bytes += r->end - r->start;
    r->indexed = 1;
    return 0;
}

/* Index range [*first, *last) of regions overlapping [s, e). */
static void overlapping(const braid_verbs_regcache *rc, uintptr_t s, uintptr_t e, size_t *first, size_t *last)
{
    long i = find_le(rc, s);
    if (i < 0 || rc->index[i]->end <= s)
        i++;
    size_t j = (size_t)i;
    while (j < rc->count && rc->index[j]->start < e)
        j++;
    *first = (size_t)i;
    *last = j;
}

int braid__verbs_regcache_acquire(braid_verbs_regcache *rc, const void *addr, size_t len, int create,
                                  braid_verbs_region **region)
{
    uintptr_t a = (uintptr_t)addr;
    if (len == 0 || a + len < a)
        return EINVAL;
    long i = find_le(rc, a);
    if (i >= 0 && rc->index[i]->end >= a + len) {
        braid_verbs_region *r = rc->index[i];
        if (r->refs++ == 0)
            lru_unlink(rc, r);
        rc->stats.hits++;
        *region = r;
        return 0;
    }
    rc->stats.misses++;
    if (!create)
        return ENOENT;

    uintptr_t mask = rc->cfg.page_bytes - 1;
    uintptr_t s = a & ~mask;
    uintptr_t e = (a + len + mask) & ~mask;
    if (e < a + len) /* the last page ends at the top of the address space */
        e = UINTPTR_MAX & ~mask;
    size_t first, last;
    overlapping(rc, s, e, &first, &last);
    uintptr_t ms = s, me = e;
    if (first < last) {
        ms = rc->index[first]->start < s ? rc->index[first]->start : s;
        me = rc->index[last - 1]->end > e ? rc->index[last - 1]->end : e;
    }

    braid_verbs_region *r = calloc(1, sizeof(*r));
    if (!r)
        return ENOMEM;
    int err = rc->cfg.reg(rc->cfg.ctx, (void *)ms, me - ms, &r->mr, &r->lkey);
    if (err && (ms != s || me != e)) {
        /* The union may span a hole in the address space; the request
         * alone still deserves a registration. */
        ms = s;
        me = e;
        err = rc->cfg.reg(rc->cfg.ctx, (void *)ms, me - ms, &r->mr, &r->lkey);
    }
    if (err) {
        free(r);
        return err;
    }
    r->start = ms;
    r->end = me;
    r->refs = 1;

    /* Retire what the new region overlaps, newest index state each time
     * since retire() shifts the array. */
    for (;;) {
        overlapping(rc, ms, me, &first, &last);
        if (first == last)
            break;
        rc->stats.retired++;
        retire(rc, rc->index[first]);
    }
    err = insert(rc, r);
    if (err) {
        destroy(rc, r);
        return err;
    }
    evict(rc);
    *region = r;
    return 0;
}

void braid__verbs_regcache_release(braid_verbs_regcache *rc, braid_verbs_region *r)
{
    if (--r->refs > 0)
        return;
    if (!r->indexed) {
        destroy(rc, r);
        return;
    }
    lru_push(rc, r);
    evict(rc);
}

void braid__verbs_regcache_invalidate(braid_verbs_regcache *rc, const void *addr, size_t len)
{
    uintptr_t a = (uintptr_t)addr;
    uintptr_t e = a + len < a ? UINTPTR_MAX : a + len;
    if (len == 0)
        return;
    for (;;) {
        size_t first, last;
        overlapping(rc, a, e, &first, &last);
        if (first == last)
            break;
        rc->stats.retired++;
        retire(rc, rc->index[first]);
    }
}

size_t braid__verbs_regcache_fini(braid_verbs_regcache *rc)
{
    size_t leaked = 0;
    while (rc->count > 0) {
        braid_verbs_region *r = rc->index[rc->count - 1];
        if (r->refs > 0)
            leaked++;
        r->refs = 0;
        lru_unlink(rc, r);
        retire(rc, r);
    }
    free(rc->index);
    memset(rc, 0, sizeof(*rc));
    return leaked;
}
