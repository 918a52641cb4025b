/* DDP gradient bucketer, the cross-rank layout check: a fingerprint of the
 * layout, all-gathered with a summary, and on a mismatch a report naming
 * this rank's layout, the other's and the first param where they part. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "braid_cuda.h"
#include "bucket.h"
#include "bucket_int.h"
#include "hmem.h"
#include "log.h"
#include "reduce/reduce.h"
#include "status.h"

/* FNV-1a over the 8 little-endian bytes of v: every byte goes through the
 * multiply in sequence, so the hash depends on order (a permutation of the
 * same values hashes differently, unlike a sum or xor of per-field mixes). */
static uint64_t fnv1a_u64(uint64_t h, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        h ^= (v >> (8 * i)) & 0xFF;
        h *= 0x100000001B3ull;
    }
    return h;
}

/* splitmix64's finalizer: spreads FNV's weak high bits over the word. */
static uint64_t fmix64(uint64_t h)
{
    h ^= h >> 30;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 27;
    h *= 0x94D049BB133111EBull;
    return h ^ (h >> 31);
}

/* Fingerprint of everything that decides the sequence of collectives and
 * what each element of a bucket means: the caps and wire dtype, every
 * param's (count, dtype) in registration order, and the buckets formed
 * from them. Two params swapped, or two sizes traded with the same total,
 * change it. */
static uint64_t layout_hash(const braid_bucketer *b)
{
    uint64_t h = 0xCBF29CE484222325ull; /* FNV-1a 64 offset basis */
    h = fnv1a_u64(h, (uint64_t)b->first_bucket_bytes);
    h = fnv1a_u64(h, (uint64_t)b->bucket_bytes);
    h = fnv1a_u64(h, (uint64_t)b->wire_dtype);
    h = fnv1a_u64(h, (uint64_t)b->nparams);
    for (int id = 0; id < b->nparams; id++) {
        h = fnv1a_u64(h, (uint64_t)b->params[id].count);
        h = fnv1a_u64(h, (uint64_t)b->params[id].dtype);
    }
    h = fnv1a_u64(h, (uint64_t)b->nbuckets);
    for (int k = 0; k < b->nbuckets; k++) {
        const bucket *bk = &b->buckets[k];
        h = fnv1a_u64(h, (uint64_t)bk->wire_dtype);
        h = fnv1a_u64(h, (uint64_t)bk->count);
        h = fnv1a_u64(h, (uint64_t)bk->nparams);
    }
    return fmix64(h);
}

/* One rank's layout summary as exchanged by the check. */
enum { SUM_HASH, SUM_NPARAMS, SUM_NBUCKETS, SUM_ELEMS, SUM_WIRE, SUM_FIRST_CAP, SUM_CAP, SUM_WORDS };
/* Above this many bytes (ranks x params x 16) the mismatch report leaves
 * out the first differing param rather than gather every param list. */
#define DETAIL_MAX_BYTES ((size_t)64 << 20)

static void layout_summary(const braid_bucketer *b, int64_t out[SUM_WORDS])
{
    size_t elems = 0;
    for (int id = 0; id < b->nparams; id++)
        elems += b->params[id].count;
    out[SUM_HASH] = (int64_t)layout_hash(b);
    out[SUM_NPARAMS] = b->nparams;
    out[SUM_NBUCKETS] = b->nbuckets;
    out[SUM_ELEMS] = (int64_t)elems;
    out[SUM_WIRE] = b->wire_dtype;
    out[SUM_FIRST_CAP] = (int64_t)b->first_bucket_bytes;
    out[SUM_CAP] = (int64_t)b->bucket_bytes;
}

static int describe_layout(char *out, size_t cap, const char *who, const int64_t *sum)
{
    return snprintf(out, cap,
                    "%s has %lld params, %lld elements in %lld buckets (caps %lld / %lld bytes, wire %s), "
                    "layout hash %016llx",
                    who, (long long)sum[SUM_NPARAMS], (long long)sum[SUM_ELEMS], (long long)sum[SUM_NBUCKETS],
                    (long long)sum[SUM_FIRST_CAP], (long long)sum[SUM_CAP],
                    sum[SUM_WIRE] == BRAID_F32 ? "uncompressed" : braid__dtype_name((braid_dtype)sum[SUM_WIRE]),
                    (unsigned long long)sum[SUM_HASH]);
}

/* After a mismatch every rank knows it (all saw every summary), so all
 * gather the (count, dtype) lists, padded to the longest, and name the
 * first param where this rank and `other` differ. */
static braid_status first_param_difference(braid_bucketer *b, int other, int64_t max_params, char *out, size_t cap)
{
    int n = braid_pg_size(b->pg), rank = rank_of(b);
    out[0] = '\0';
    if (max_params <= 0 || (size_t)max_params > DETAIL_MAX_BYTES / 16 / (size_t)n)
        return BRAID_OK;
    size_t words = 2 * (size_t)max_params;
    int64_t *all = malloc((size_t)n * words * sizeof(*all));
    if (!all)
        return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: bucketer: out of memory comparing layouts", rank);
    int64_t *mine = all + (size_t)rank * words;
    for (int64_t i = 0; i < max_params; i++) {
        mine[2 * i] = i < b->nparams ? (int64_t)b->params[i].count : -1;
        mine[2 * i + 1] = i < b->nparams ? (int64_t)b->params[i].dtype : -1;
    }
    braid_status st = braid_allgather(b->pg, mine, all, words, BRAID_I64, NULL, NULL);
    if (st != BRAID_OK) {
        free(all);
        return st;
    }
    const int64_t *theirs = all + (size_t)other * words;
    for (int64_t i = 0; i < max_params; i++) {
        if (mine[2 * i] == theirs[2 * i] && mine[2 * i + 1] == theirs[2 * i + 1])
            continue;
        char a[64], c[64];
        if (mine[2 * i] < 0)
            snprintf(a, sizeof(a), "none");
        else
            snprintf(a, sizeof(a), "%lld x %s", (long long)mine[2 * i],
                     braid__dtype_name((braid_dtype)mine[2 * i + 1]));
        if (theirs[2 * i] < 0)
            snprintf(c, sizeof(c), "none");
        else
            snprintf(c, sizeof(c), "%lld x %s", (long long)theirs[2 * i],
                     braid__dtype_name((braid_dtype)theirs[2 * i + 1]));
        snprintf(out, cap, "; first difference at param %lld: %s on rank %d, %s on rank %d", (long long)i, a, rank, c,
                 other);
        break;
    }
    free(all);
    return BRAID_OK;
}

/* Every rank must form the same buckets, or their all-reduces would pair
 * up wrongly and produce garbage or hang (DDP checks parameter shapes
 * across ranks for the same reason). The ranks all-gather a summary with
 * the layout hash; on a mismatch each names its own layout and that of the
 * first rank that differs from it (rank 0's when this rank differs from
 * rank 0), plus the first param where they part. */
braid_status braid__bucketer_check_layout(braid_bucketer *b)
{
    int n = braid_pg_size(b->pg), rank = rank_of(b);
    if (n == 1)
        return BRAID_OK;
    int64_t *sums = malloc((size_t)n * SUM_WORDS * sizeof(*sums));
    if (!sums)
        return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: bucketer: out of memory checking the layout", rank);
    layout_summary(b, sums + (size_t)rank * SUM_WORDS);
    braid_status st = braid_allgather(b->pg, sums + (size_t)rank * SUM_WORDS, sums, SUM_WORDS, BRAID_I64, NULL, NULL);
    if (st != BRAID_OK) {
        free(sums);
        char text[TEXT_MAX];
        snprintf(text, sizeof(text), "%s", braid__error_detail());
        return braid__error(st, "rank %d: bucketer: checking the bucket layout across ranks failed: %s", rank, text);
    }
    const int64_t *mine = sums + (size_t)rank * SUM_WORDS;
    int other = -1;
    int64_t max_params = 0;
    for (int r = 0; r < n; r++) {
        const int64_t *s = sums + (size_t)r * SUM_WORDS;
        if (s[SUM_NPARAMS] > max_params)
            max_params = s[SUM_NPARAMS];
        if (other < 0 && s[SUM_HASH] != mine[SUM_HASH])
            other = r;
    }
    int all_agree = 1;
    for (int r = 1; r < n; r++)
        all_agree &= sums[(size_t)r * SUM_WORDS + SUM_HASH] == sums[SUM_HASH];
    if (all_agree) {
        free(sums);
        return BRAID_OK;
    }
    /* Not all equal: every rank, this one included, sees one that differs. */
    char detail[256] = "";
    st = first_param_difference(b, other, max_params, detail, sizeof(detail));
    if (st != BRAID_OK)
        detail[0] = '\0';
    char here[256], there[256], who[32];
    describe_layout(here, sizeof(here), "this rank", mine);
    snprintf(who, sizeof(who), "rank %d", other);
    describe_layout(there, sizeof(there), who, sums + (size_t)other * SUM_WORDS);
    free(sums);
    return braid__error(BRAID_ERR_MISMATCH,
                        "rank %d: bucketer: ranks formed different buckets: %s; %s%s. Every rank must register "
                        "the same params (count and dtype, same order) with the same caps and compression",
                        rank, here, there, detail);
}
