/* Memory-registration cache: registered regions keyed by address range,
 * so that sending from the same buffer again costs a lookup instead of an
 * ibv_reg_mr (which pins pages and takes tens of microseconds per MiB).
 *
 * The cache knows nothing about verbs: it calls the reg/dereg functions it
 * is given, so tests drive it with fakes. Rules:
 *  - regions are page-aligned and the index never holds two that overlap:
 *    a miss that overlaps cached regions registers their union and retires
 *    them, so neighbouring buffers converge on one registration;
 *  - a region is referenced while a transfer uses it; unreferenced regions
 *    stay cached on an LRU list and are evicted oldest first once the cache
 *    holds more than max_regions regions or max_bytes bytes;
 *  - invalidate() retires every region touching a range (memory about to be
 *    freed); a retired region still referenced lives on, out of the index,
 *    until its last release.
 * Not thread-safe: the owner serialises calls. */
#ifndef BRAID_VERBS_REGCACHE_H
#define BRAID_VERBS_REGCACHE_H

#include <stddef.h>
#include <stdint.h>

typedef struct braid_verbs_region {
    uintptr_t start, end; /* [start, end), page-aligned */
    void *mr;             /* what reg() returned */
    uint32_t lkey;
    int refs;
    int indexed; /* findable; 0 once retired */
    struct braid_verbs_region *lru_prev, *lru_next;
} braid_verbs_region;

typedef struct {
    /* Register [addr, addr + len): 0, or an errno value. */
    int (*reg)(void *ctx, void *addr, size_t len, void **mr, uint32_t *lkey);
    void (*dereg)(void *ctx, void *mr);
    void *ctx;
    size_t page_bytes;  /* power of two */
    size_t max_regions; /* >= 1 */
    size_t max_bytes;
} braid_verbs_regcache_cfg;

typedef struct {
    uint64_t hits, misses, evictions, retired;
} braid_verbs_regcache_stats;

typedef struct {
    braid_verbs_regcache_cfg cfg;
    braid_verbs_region **index; /* sorted by start, non-overlapping */
    size_t count, cap;
    size_t bytes;                            /* sum over the index */
    braid_verbs_region *lru_head, *lru_tail; /* unreferenced indexed regions, oldest first */
    braid_verbs_regcache_stats stats;
} braid_verbs_regcache;

/* 0 or EINVAL (bad config). Allocates nothing until the first miss. */
int braid__verbs_regcache_init(braid_verbs_regcache *rc, const braid_verbs_regcache_cfg *cfg);

/* Deregister everything in the index. Returns how many of those were
 * still referenced (a leak in the caller); they are freed all the same.
 * Release retired regions before this: afterwards nothing may touch rc. */
size_t braid__verbs_regcache_fini(braid_verbs_regcache *rc);

/* A referenced region covering [addr, addr + len). With create == 0 only a
 * cached region can answer (ENOENT otherwise). Errors: EINVAL for len 0 or
 * a range that wraps, ENOMEM, or the errno reg() gave; the cache is then
 * unchanged. */
int braid__verbs_regcache_acquire(braid_verbs_regcache *rc, const void *addr, size_t len, int create,
                                  braid_verbs_region **region);

void braid__verbs_regcache_release(braid_verbs_regcache *rc, braid_verbs_region *region);

/* Retire every region that overlaps [addr, addr + len). */
void braid__verbs_regcache_invalidate(braid_verbs_regcache *rc, const void *addr, size_t len);

#endif
