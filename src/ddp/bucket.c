/* DDP gradient bucketer: groups gradients into flat buckets and all-reduces
 * each bucket asynchronously as soon as backward has produced all of it, so
 * communication overlaps the rest of backward (the scheme of PyTorch DDP's
 * Reducer).
 *
 * Rules that keep every rank in step:
 *  - the layout is a pure function of the registered (count, dtype) list and
 *    the caps, and it is checked to be identical on every rank when it is
 *    formed, so every rank runs the same all-reduces;
 *  - buckets are launched strictly in index order: a bucket that completes
 *    early waits until all lower-indexed buckets were launched, so a rank
 *    whose backward marks params in a slightly different order still issues
 *    the same sequence of collectives.
 * A bucketer is used from one thread (the one running backward). */
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

#define DEFAULT_BUCKET_BYTES ((size_t)25 << 20)
#define DEFAULT_FIRST_BUCKET_BYTES ((size_t)1 << 20)

/* ---- layout ---------------------------------------------------------- */

static braid_status bucket_push(braid_bucketer *b, bucket *bk, int id)
{
    if (bk->nparams == bk->cap_params) {
        int cap = bk->cap_params ? 2 * bk->cap_params : 8;
        int *ids = realloc(bk->param_ids, (size_t)cap * sizeof(*ids));
        if (!ids)
            return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: bucketer: out of memory for the bucket layout",
                                rank_of(b));
        bk->param_ids = ids;
        size_t *offs = realloc(bk->offsets, (size_t)cap * sizeof(*offs));
        if (!offs)
            return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: bucketer: out of memory for the bucket layout",
                                rank_of(b));
        bk->offsets = offs;
        bk->cap_params = cap;
    }
    param_slot *p = &b->params[id];
    p->bucket = (int)(bk - b->buckets);
    p->offset = bk->count;
    bk->param_ids[bk->nparams] = id;
    bk->offsets[bk->nparams] = bk->count;
    bk->nparams++;
    bk->count += p->count;
    bk->bytes += p->count * braid_dtype_size(p->dtype);
    return BRAID_OK;
}

/* Assign params to buckets the way PyTorch DDP does: walk the params in
 * reverse registration order (backward produces the last layer's grads
 * first), keep one open bucket per dtype, and close a bucket when the next
 * param would push it past its cap. The first bucket of each dtype has the
 * small cap so that the first all-reduce starts early in backward; a
 * param larger than the cap gets a bucket of its own. Buckets are numbered
 * by the position of their first param in that walk, which is the order in
 * which they become complete. */
static braid_status assign_buckets(braid_bucketer *b)
{
    int open[BRAID_DTYPE_COUNT], closed[BRAID_DTYPE_COUNT];
    for (int d = 0; d < BRAID_DTYPE_COUNT; d++) {
        open[d] = -1;
        closed[d] = 0;
    }
    /* At most one bucket per param, so this never grows. */
    b->buckets = calloc(b->nparams > 0 ? (size_t)b->nparams : 1, sizeof(*b->buckets));
    if (!b->buckets)
        return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: bucketer: out of memory for %d buckets", rank_of(b),
                            b->nparams);
    for (int id = b->nparams - 1; id >= 0; id--) {
        param_slot *p = &b->params[id];
        int d = (int)p->dtype;
        size_t bytes = p->count * braid_dtype_size(p->dtype);
        size_t cap = closed[d] == 0 ? b->first_bucket_bytes : b->bucket_bytes;
        if (open[d] >= 0 && b->buckets[open[d]].bytes + bytes > cap) {
            open[d] = -1;
            closed[d]++;
            cap = b->bucket_bytes;
        }
        if (open[d] < 0) {
            bucket *bk = &b->buckets[b->nbuckets];
            bk->dtype = p->dtype;
            bk->wire_dtype = p->dtype == BRAID_F32 ? b->wire_dtype : p->dtype;
            open[d] = b->nbuckets++;
        }
        BRAID_CHECK(bucket_push(b, &b->buckets[open[d]], id));
        if (b->buckets[open[d]].bytes >= cap) {
            open[d] = -1;
            closed[d]++;
        }
    }
    for (int k = 0; k < b->nbuckets; k++) {
        bucket *bk = &b->buckets[k];
        size_t wire_bytes = bk->count * braid_dtype_size(bk->wire_dtype);
        if (wire_bytes > 0 && posix_memalign(&bk->flat, 64, wire_bytes) != 0) {
            bk->flat = NULL;
            return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: bucketer: cannot allocate %zu bytes for bucket %d",
                                rank_of(b), wire_bytes, k);
        }
        bk->pending = bk->nparams;
    }
    return BRAID_OK;
}


static void free_buckets(braid_bucketer *b)
{
    for (int k = 0; k < b->nbuckets; k++) {
        free(b->buckets[k].param_ids);
        free(b->buckets[k].offsets);
        free(b->buckets[k].flat);
        braid__cuda_free(b->buckets[k].dflat);
    }
    free(b->buckets);
    b->buckets = NULL;
    b->nbuckets = 0;
}

braid_status braid__bucketer_build(braid_bucketer *b)
{
    if (!b)
        return braid__error(BRAID_ERR_INVALID_ARG, "bucketer: bucketer is NULL");
    if (b->built)
        return BRAID_OK;
    if (b->build_status != BRAID_OK) {
        braid__error_set_text(b->build_text);
        return b->build_status;
    }
    braid_status st;
    BRAID_CHECK_GOTO(assign_buckets(b), st, err_free_buckets);
    BRAID_CHECK_GOTO(braid__bucketer_check_layout(b), st, err_free_buckets);
    b->built = 1;
    BRAID_INFO("bucketer: %d params in %d buckets (caps %zu / %zu bytes, wire %s)", b->nparams, b->nbuckets,
               b->first_bucket_bytes, b->bucket_bytes,
               b->wire_dtype == BRAID_F32   ? "uncompressed"
               : b->wire_dtype == BRAID_F16 ? "f16"
                                            : "bf16");
    return BRAID_OK;

err_free_buckets:
    free_buckets(b);
    for (int id = 0; id < b->nparams; id++)
        b->params[id].bucket = -1;
    b->build_status = st;
    snprintf(b->build_text, sizeof(b->build_text), "%s", braid_last_error());
    return st;
}

braid_status braid__bucketer_bucket_info(const braid_bucketer *b, int k, braid__bucket_info *info)
{
    if (!b || !info)
        return braid__error(BRAID_ERR_INVALID_ARG, "bucketer: bucket_info: NULL argument");
    if (!b->built || k < 0 || k >= b->nbuckets)
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: bucketer: no bucket %d (%d buckets formed)", rank_of(b), k,
                            b->built ? b->nbuckets : 0);
    const bucket *bk = &b->buckets[k];
    info->dtype = bk->dtype;
    info->wire_dtype = bk->wire_dtype;
    info->count = bk->count;
    info->bytes = bk->bytes;
    info->nparams = bk->nparams;
    info->param_ids = bk->param_ids;
    info->offsets = bk->offsets;
    return BRAID_OK;
}

/* ---- public API ------------------------------------------------------ */

BRAID_API braid_status braid_bucketer_create(braid_bucketer **out, braid_pg *pg, size_t bucket_bytes,
                                             size_t first_bucket_bytes)
{
    if (!out)
        return braid__error(BRAID_ERR_INVALID_ARG, "bucketer: create: bucketer pointer is NULL");
    BRAID_CHECK(braid__pg_check_handle(pg, "bucketer: create"));
    braid_bucketer *b = calloc(1, sizeof(*b));
    if (!b)
        return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: bucketer: out of memory", braid_pg_rank(pg));
    b->pg = pg;
    b->bucket_bytes = bucket_bytes ? bucket_bytes : DEFAULT_BUCKET_BYTES;
    b->first_bucket_bytes = first_bucket_bytes ? first_bucket_bytes : DEFAULT_FIRST_BUCKET_BYTES;
    b->wire_dtype = BRAID_F32;
    *out = b;
    braid__error_clear();
    return BRAID_OK;
}

BRAID_API braid_status braid_bucketer_add(braid_bucketer *b, void *grad, size_t count, braid_dtype dtype, int *param_id)
{
    if (!b || !param_id)
        return braid__error(BRAID_ERR_INVALID_ARG, "bucketer: add: %s is NULL", b ? "param_id" : "bucketer");
    if (b->built)
        return braid__error(BRAID_ERR_INVALID_ARG,
                            "rank %d: bucketer: add after the buckets were formed (register every param before the "
                            "first ready())",
                            rank_of(b));
    size_t esize = braid_dtype_size(dtype);
    if (esize == 0)
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: bucketer: add: invalid dtype %d", rank_of(b), (int)dtype);
    if (count > 0 && !grad)
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: bucketer: add: grad is NULL with count %zu", rank_of(b),
                            count);
    if (count > SIZE_MAX / 4 / esize)
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: bucketer: add: count %zu overflows", rank_of(b), count);
    if (b->nparams == b->cap_params) {
        int cap = b->cap_params ? 2 * b->cap_params : 16;
        param_slot *p = realloc(b->params, (size_t)cap * sizeof(*p));
        if (!p)
            return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: bucketer: out of memory for %d params", rank_of(b), cap);
        b->params = p;
        b->cap_params = cap;
    }
    int id = b->nparams++;
    b->params[id] = (param_slot){.grad = grad, .count = count, .dtype = dtype, .bucket = -1};
    *param_id = id;
    braid__error_clear();
    return BRAID_OK;
}

BRAID_API braid_status braid_bucketer_set_compression(braid_bucketer *b, braid_dtype wire_dtype)
{
    if (!b)
        return braid__error(BRAID_ERR_INVALID_ARG, "bucketer: set_compression: bucketer is NULL");
    if (wire_dtype != BRAID_F32 && wire_dtype != BRAID_F16 && wire_dtype != BRAID_BF16)
        return braid__error(BRAID_ERR_INVALID_ARG,
                            "rank %d: bucketer: set_compression: wire dtype %d is not BRAID_F16, BRAID_BF16 or "
                            "BRAID_F32 (off)",
                            rank_of(b), (int)wire_dtype);
    if (b->built)
        return braid__error(BRAID_ERR_INVALID_ARG,
                            "rank %d: bucketer: set_compression after the buckets were formed (call it before the "
                            "first ready())",
                            rank_of(b));
    b->wire_dtype = wire_dtype;
    braid__error_clear();
    return BRAID_OK;
}

/* Gradients may be CUDA device memory (braid__mem_is_device). An
 * uncompressed bucket made mostly of device gradients stays on the device (bucket_flat): copies in and out are device-to-device
 * on the legacy default stream, which orders them after the backward
 * kernels that produced the gradients on any blocking stream, the
 * all-reduce is a device call on that stream, and finish waits for the
 * stream once per bucket. Otherwise the flat buffer is host memory and a
 * device gradient is copied down with a wait. Host gradients keep plain
 * memcpy. */
static braid_status grad_copy(void *dst, const void *src, size_t bytes, int on_device)
{
    if (!on_device) {
        memcpy(dst, src, bytes);
        return BRAID_OK;
    }
    BRAID_CHECK(braid__cuda_memcpy_async(dst, src, bytes, NULL));
    return braid__cuda_stream_sync(NULL);
}

/* The flat buffer bucket bk's copies use: device memory when device
 * gradients make up at least half its bytes and it is not compressed,
 * decided once (the gradients' addresses are fixed at braid_bucketer_add,
 * so every rank of a DDP job decides alike). */
static braid_status bucket_flat(braid_bucketer *b, bucket *bk, void **flat)
{
    if (!bk->placed) {
        size_t dev_bytes = 0;
        for (int i = 0; i < bk->nparams; i++) {
            const param_slot *q = &b->params[bk->param_ids[i]];
            if (q->count > 0 && braid__mem_is_device(q->grad))
                dev_bytes += q->count * braid_dtype_size(q->dtype);
        }
        bk->on_device = bk->wire_dtype == bk->dtype && dev_bytes > 0 && 2 * dev_bytes >= bk->bytes;
        bk->placed = 1;
    }
    if (bk->on_device && !bk->dflat) {
        braid_status st = braid__cuda_malloc(&bk->dflat, bk->count * braid_dtype_size(bk->dtype));
        if (st != BRAID_OK)
            return braid__error(st, "rank %d: bucketer: cannot allocate a device bucket of %zu elements: %s",
                                rank_of(b), bk->count, braid__error_detail());
    }
    *flat = bk->on_device ? bk->dflat : bk->flat;
    return BRAID_OK;
}

/* A compressed bucket carries grad / world, divided in f32 and then
 * rounded once to the wire type, and is all-reduced with SUM: the sum is
 * the average already, and no partial sum on the wire exceeds the largest
 * |grad| by more than its rounding. Averaging on the wire instead would
 * add up to world * |grad| in f16 first (4 ranks of 30000 make 120000,
 * past f16's 65504: inf). torch's fp16_compress_hook divides first too
 * (after its cast). */
#define PRESCALE_CHUNK 512

static braid_status cast_prescaled(const braid_bucketer *b, braid_dtype wire, void *dst, const float *src,
                                   size_t count, int on_device)
{
    int world = braid_pg_size(b->pg);
    size_t wsize = braid_dtype_size(wire);
    float tmp[PRESCALE_CHUNK];
    float *host = NULL;
    if (on_device) {
        /* one copy down of the whole gradient, then the host pass */
        host = malloc(count * sizeof(float));
        if (!host)
            return braid__error(BRAID_ERR_NO_MEMORY, "out of memory for %zu gradient elements", count);
        braid_status st = grad_copy(host, src, count * sizeof(float), 1);
        if (st != BRAID_OK) {
            free(host);
            return st;
        }
        src = host;
    }
    for (size_t i = 0; i < count; i += PRESCALE_CHUNK) {
        size_t c = count - i < PRESCALE_CHUNK ? count - i : PRESCALE_CHUNK;
        memcpy(tmp, src + i, c * sizeof(float));
        braid__reduce_scale(BRAID_F32, BRAID_AVG, tmp, c, world);
        braid__cast(wire, (char *)dst + i * wsize, BRAID_F32, tmp, c);
    }
    free(host);
    return BRAID_OK;
}

/* Start the all-reduce of bucket k in place in the flat buffer: AVG, or
 * SUM of the pre-scaled values of a compressed bucket (cast_prescaled). */
static braid_status launch(braid_bucketer *b, int k)
{
    bucket *bk = &b->buckets[k];
    bk->launched = 1;
    if (bk->count == 0)
        return BRAID_OK; /* only empty params: nothing to exchange, on any rank */
    braid_op op = bk->wire_dtype != bk->dtype ? BRAID_SUM : BRAID_AVG;
    void *flat = bk->on_device ? bk->dflat : bk->flat;
    braid_status st = braid_allreduce(b->pg, flat, flat, bk->count, bk->wire_dtype, op, NULL, &bk->work);
    if (st != BRAID_OK) {
        bk->work = NULL;
        bk->launched = 0; /* nothing to wait for or copy back */
        char text[TEXT_MAX];
        snprintf(text, sizeof(text), "%s", braid__error_detail());
        braid__error(st, "rank %d: bucketer step %llu: cannot start the all-reduce of bucket %d (%zu elements): %s",
                     rank_of(b), b->step, k, bk->count, text);
        b->step_status = st;
        snprintf(b->step_text, sizeof(b->step_text), "%s", braid_last_error());
    }
    return st;
}

BRAID_API braid_status braid_bucketer_ready(braid_bucketer *b, int param_id)
{
    if (!b)
        return braid__error(BRAID_ERR_INVALID_ARG, "bucketer: ready: bucketer is NULL");
    if (param_id < 0 || param_id >= b->nparams)
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: bucketer: ready: param %d does not exist (%d registered)",
                            rank_of(b), param_id, b->nparams);
    BRAID_CHECK(braid__bucketer_build(b));
    if (b->step_status != BRAID_OK) {
        braid__error_set_text(b->step_text);
        return b->step_status;
    }
    param_slot *p = &b->params[param_id];
    if (p->marked)
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: bucketer step %llu: param %d marked ready twice",
                            rank_of(b), b->step, param_id);
    p->marked = 1;
    bucket *bk = &b->buckets[p->bucket];
    /* Copy now, while the gradient is hot in cache; the caller's buffer is
     * not read again until finish() writes the average back. */
    if (p->count > 0) {
        int dev = braid__mem_is_device(p->grad);
        void *flat = NULL;
        braid_status st = bucket_flat(b, bk, &flat);
        char *dst = st == BRAID_OK ? (char *)flat + p->offset * braid_dtype_size(bk->wire_dtype) : NULL;
        if (st == BRAID_OK && bk->on_device) /* ordered on the legacy stream; no wait */
            st = braid__cuda_memcpy_async(dst, p->grad, p->count * braid_dtype_size(p->dtype), NULL);
        else if (st == BRAID_OK)
            st = bk->wire_dtype == p->dtype ? grad_copy(dst, p->grad, p->count * braid_dtype_size(p->dtype), dev)
                                            : cast_prescaled(b, bk->wire_dtype, dst, p->grad, p->count, dev);
        if (st != BRAID_OK) {
            char text[TEXT_MAX];
            snprintf(text, sizeof(text), "%s", braid__error_detail());
            p->marked = 0; /* not taken: the caller may retry or give up */
            return braid__error(st, "rank %d: bucketer step %llu: cannot copy device gradient of param %d: %s",
                                rank_of(b), b->step, param_id, text);
        }
    }
    bk->pending--;
    while (b->next_launch < b->nbuckets && b->buckets[b->next_launch].pending == 0) {
        BRAID_CHECK(launch(b, b->next_launch));
        b->next_launch++;
    }
    braid__error_clear();
    return BRAID_OK;
}

/* Wait for bucket k's all-reduce; on success copy the averages back. */
static braid_status drain_bucket(braid_bucketer *b, int k, char *text, size_t text_cap)
{
    bucket *bk = &b->buckets[k];
    if (!bk->launched)
        return BRAID_OK;
    if (bk->work) {
        braid_status st = braid_wait(bk->work, -1);
        braid_work_free(bk->work);
        bk->work = NULL;
        if (st != BRAID_OK) {
            snprintf(text, text_cap,
                     "rank %d: bucketer step %llu: all-reduce of bucket %d (%zu elements, %d params) "
                     "failed: %s",
                     rank_of(b), b->step, k, bk->count, bk->nparams, braid__error_detail());
            return st;
        }
    }
    size_t wsize = braid_dtype_size(bk->wire_dtype);
    if (bk->on_device) {
        /* device to wherever each gradient is, then one wait */
        braid_status st = BRAID_OK;
        for (int i = 0; i < bk->nparams && st == BRAID_OK; i++) {
            param_slot *p = &b->params[bk->param_ids[i]];
            st = braid__cuda_memcpy_async(p->grad, (const char *)bk->dflat + p->offset * wsize, p->count * wsize,
                                          NULL);
        }
        if (st == BRAID_OK)
            st = braid__cuda_stream_sync(NULL);
        if (st != BRAID_OK)
            snprintf(text, text_cap, "rank %d: bucketer step %llu: cannot copy the average of device bucket %d back: %s",
                     rank_of(b), b->step, k, braid__error_detail());
        return st;
    }
    for (int i = 0; i < bk->nparams; i++) {
        param_slot *p = &b->params[bk->param_ids[i]];
        if (p->count == 0)
            continue;
        const char *src = (const char *)bk->flat + p->offset * wsize;
        int dev = braid__mem_is_device(p->grad);
        braid_status st = BRAID_OK;
        if (bk->wire_dtype == p->dtype) {
            st = grad_copy(p->grad, src, p->count * wsize, dev);
        } else if (!dev) {
            braid__cast(p->dtype, p->grad, bk->wire_dtype, src, p->count);
        } else {
            /* widen on the host, then one copy up */
            void *wide = malloc(p->count * braid_dtype_size(p->dtype));
            if (!wide)
                st = braid__error(BRAID_ERR_NO_MEMORY, "out of memory");
            else {
                braid__cast(p->dtype, wide, bk->wire_dtype, src, p->count);
                st = grad_copy(p->grad, wide, p->count * braid_dtype_size(p->dtype), 1);
                free(wide);
            }
        }
        if (st != BRAID_OK) {
            snprintf(text, text_cap, "rank %d: bucketer step %llu: cannot copy the average of bucket %d back to "
                     "device gradient of param %d: %s", rank_of(b), b->step, k, bk->param_ids[i],
                     braid__error_detail());
            return st;
        }
    }
    return BRAID_OK;
}

static void reset_step(braid_bucketer *b)
{
    for (int id = 0; id < b->nparams; id++)
        b->params[id].marked = 0;
    for (int k = 0; k < b->nbuckets; k++) {
        b->buckets[k].pending = b->buckets[k].nparams;
        b->buckets[k].launched = 0;
        b->buckets[k].work = NULL;
    }
    b->next_launch = 0;
    b->step_status = BRAID_OK;
    b->step_text[0] = '\0';
    b->step++;
}

/* "3, 5, 7" for the unmarked params, cut short with "..." when they do not
 * fit; returns how many there are. */
static int list_unmarked(const braid_bucketer *b, char *out, size_t cap)
{
    int n = 0, cut = 0;
    size_t len = 0;
    out[0] = '\0';
    for (int id = 0; id < b->nparams; id++) {
        if (b->params[id].marked)
            continue;
        n++;
        if (cut)
            continue;
        char item[32];
        int w = snprintf(item, sizeof(item), "%s%d", n > 1 ? ", " : "", id);
        if (len + (size_t)w + 5 >= cap) {
            snprintf(out + len, cap - len, ", ...");
            cut = 1;
            continue;
        }
        memcpy(out + len, item, (size_t)w + 1);
        len += (size_t)w;
    }
    return n;
}

BRAID_API braid_status braid_bucketer_finish(braid_bucketer *b)
{
    if (!b)
        return braid__error(BRAID_ERR_INVALID_ARG, "bucketer: finish: bucketer is NULL");
    BRAID_CHECK(braid__bucketer_build(b));

    /* Wait for everything in flight before judging the step: the flat
     * buffers must not be reused while the progress thread still writes
     * them. Buckets are drained in launch order, so the copy-back of bucket
     * k overlaps the all-reduce of bucket k+1. */
    braid_status wait_st = BRAID_OK;
    char wait_text[TEXT_MAX] = "";
    for (int k = 0; k < b->nbuckets; k++) {
        char text[TEXT_MAX];
        braid_status st = drain_bucket(b, k, text, sizeof(text));
        if (st != BRAID_OK && wait_st == BRAID_OK) {
            wait_st = st;
            snprintf(wait_text, sizeof(wait_text), "%s", text);
        }
    }

    braid_status st = BRAID_OK;
    if (b->step_status != BRAID_OK) {
        st = b->step_status;
        braid__error_set_text(b->step_text);
    } else if (wait_st != BRAID_OK) {
        st = braid__error(wait_st, "%s", wait_text);
    } else {
        char ids[512];
        int unmarked = list_unmarked(b, ids, sizeof(ids));
        if (unmarked > 0)
            st = braid__error(BRAID_ERR_INVALID_ARG,
                              "rank %d: bucketer step %llu: finish with %d of %d params never marked ready: %s "
                              "(every registered param needs ready() in every step; their buckets were not "
                              "all-reduced)",
                              rank_of(b), b->step, unmarked, b->nparams, ids);
    }
    reset_step(b);
    if (st == BRAID_OK)
        braid__error_clear();
    return st;
}

BRAID_API int braid_bucketer_bucket_count(const braid_bucketer *b)
{
    if (!b)
        return -1;
    return b->built ? b->nbuckets : 0;
}

BRAID_API void braid_bucketer_destroy(braid_bucketer *b)
{
    if (!b)
        return;
    /* A step left without finish() may still have all-reduces writing into
     * the flat buffers: let them end before freeing. */
    for (int k = 0; k < b->nbuckets; k++) {
        if (b->buckets[k].work) {
            braid_status st = braid_wait(b->buckets[k].work, -1);
            if (st != BRAID_OK)
                BRAID_WARN("rank %d: bucketer destroyed with bucket %d in flight: %s", rank_of(b), k,
                           braid_last_error());
            braid_work_free(b->buckets[k].work);
        }
    }
    free_buckets(b);
    free(b->params);
    free(b);
}
