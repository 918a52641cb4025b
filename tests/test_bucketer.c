/* DDP bucketer: layout (reverse registration order, first/regular caps,
 * one dtype per bucket), averaged gradients on 1-4 ranks, f16/bf16 wire
 * compression, multi-step reuse and the error paths.
 *
 * Gradients are small integers, exact in every dtype, so their sums are
 * exact whatever order the ring adds them in; the average is then one
 * division, rounded once, and the expected bits are computed the same way
 * (the reduce engine's AVG contract in src/reduce/reduce.h). Compressed
 * results are compared with a stated error bound instead. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bucket.h"
#include "harness.h"
#include "reduce/reduce.h"

#define TIMEOUT_S 120

typedef struct {
    braid_dtype dtype;
    size_t count;
} pspec;

/* A model with every dtype the bucketer must keep apart, empty and tiny
 * params, odd sizes and one param bigger than the regular cap. */
static const pspec mixed_model[] = {
    {BRAID_F32, 1000}, {BRAID_F32, 1},    {BRAID_F64, 300},   {BRAID_F32, 0},  {BRAID_F16, 777},
    {BRAID_BF16, 513}, {BRAID_I32, 4099}, {BRAID_F32, 70000}, {BRAID_I64, 5},  {BRAID_F32, 3},
    {BRAID_F64, 9000}, {BRAID_I8, 100},   {BRAID_F32, 2500},  {BRAID_F16, 31}, {BRAID_F32, 4096},
};
#define MIXED_N ((int)(sizeof(mixed_model) / sizeof(mixed_model[0])))
#define MIXED_FIRST_CAP 4096
#define MIXED_CAP 65536

static int is_float(braid_dtype t)
{
    return t == BRAID_F32 || t == BRAID_F64 || t == BRAID_F16 || t == BRAID_BF16;
}

static braid_config test_config(void)
{
    braid_config cfg = BRAID_CONFIG_INIT;
    cfg.timeout_ms = 30000;
    return cfg;
}

static void run_or_fail(int n, harness_rank_fn fn, void *arg)
{
    braid_config cfg = test_config();
    harness_result res;
    int failed = harness_run(n, fn, arg, &cfg, TIMEOUT_S, &res);
    ck_assert_msg(failed == 0, "%d of %d ranks failed (exit codes %d %d %d %d)", failed, n, res.exit_code[0],
                  res.exit_code[1], res.exit_code[2], res.exit_code[3]);
}

/* ---- model helpers -------------------------------------------------- */

typedef struct {
    int n;
    void **grads;
    int *ids;
    braid_bucketer *b;
} model;

static int model_create(braid_pg *pg, model *m, const pspec *spec, int n, size_t cap, size_t first_cap)
{
    int rank = braid_pg_rank(pg);
    m->n = n;
    m->grads = calloc((size_t)n, sizeof(*m->grads));
    m->ids = calloc((size_t)n, sizeof(*m->ids));
    if (!m->grads || !m->ids)
        HARNESS_FAIL("rank %d: out of memory", rank);
    if (braid_bucketer_create(&m->b, pg, cap, first_cap) != BRAID_OK)
        HARNESS_FAIL("rank %d: bucketer_create: %s", rank, braid_last_error());
    for (int p = 0; p < n; p++) {
        size_t bytes = spec[p].count * braid_dtype_size(spec[p].dtype);
        m->grads[p] = bytes ? malloc(bytes) : NULL;
        if (bytes && !m->grads[p])
            HARNESS_FAIL("rank %d: out of memory", rank);
        if (braid_bucketer_add(m->b, m->grads[p], spec[p].count, spec[p].dtype, &m->ids[p]) != BRAID_OK)
            HARNESS_FAIL("rank %d: bucketer_add(param %d): %s", rank, p, braid_last_error());
        if (m->ids[p] != p)
            HARNESS_FAIL("rank %d: param %d got id %d, want ids in registration order", rank, p, m->ids[p]);
    }
    return 0;
}

static void model_destroy(model *m)
{
    braid_bucketer_destroy(m->b);
    for (int p = 0; p < m->n; p++)
        free(m->grads[p]);
    free(m->grads);
    free(m->ids);
}

static double grad_value(int rank, int param, size_t i, uint32_t seed)
{
    return (double)harness_value(rank, i + (size_t)param * 100003u, seed, -8, 8);
}

static void fill_grads(model *m, const pspec *spec, int rank, uint32_t seed)
{
    for (int p = 0; p < m->n; p++)
        for (size_t i = 0; i < spec[p].count; i++)
            harness_store(spec[p].dtype, m->grads[p], i, grad_value(rank, p, i, seed));
}

/* The engine's AVG of the exact integer sum: one division, rounded once
 * (f32 for f32/f16/bf16, f64 for f64), truncating for integers. */
static void expected_avg(braid_dtype t, int64_t sum, int n, void *out)
{
    double v;
    if (t == BRAID_F64)
        v = (double)sum / n;
    else if (is_float(t))
        v = (double)((float)sum / (float)n);
    else
        v = (double)(sum / n);
    harness_store(t, out, 0, v);
}

static int check_averaged(model *m, const pspec *spec, int rank, int nranks, uint32_t seed, int step)
{
    for (int p = 0; p < m->n; p++) {
        size_t es = braid_dtype_size(spec[p].dtype);
        for (size_t i = 0; i < spec[p].count; i++) {
            int64_t sum = 0;
            for (int r = 0; r < nranks; r++)
                sum += (int64_t)grad_value(r, p, i, seed);
            unsigned char want[8];
            expected_avg(spec[p].dtype, sum, nranks, want);
            if (memcmp((char *)m->grads[p] + i * es, want, es) != 0)
                HARNESS_FAIL("rank %d of %d step %d: param %d (dtype %d) element %zu is %g, want %g", rank, nranks,
                             step, p, spec[p].dtype, i, harness_load(spec[p].dtype, m->grads[p], i),
                             harness_load(spec[p].dtype, want, 0));
        }
    }
    return 0;
}

/* ---- layout --------------------------------------------------------- */

typedef struct {
    int nparams;
    int ids[8];
    size_t offsets[8];
    braid_dtype dtype;
} want_bucket;

static int check_layout(braid_bucketer *b, int rank, const want_bucket *want, int nwant)
{
    if (braid_bucketer_bucket_count(b) != nwant)
        HARNESS_FAIL("rank %d: %d buckets, want %d", rank, braid_bucketer_bucket_count(b), nwant);
    for (int k = 0; k < nwant; k++) {
        braid__bucket_info info;
        if (braid__bucketer_bucket_info(b, k, &info) != BRAID_OK)
            HARNESS_FAIL("rank %d: bucket_info(%d): %s", rank, k, braid_last_error());
        if (info.nparams != want[k].nparams || info.dtype != want[k].dtype)
            HARNESS_FAIL("rank %d: bucket %d has %d params of dtype %d, want %d of dtype %d", rank, k, info.nparams,
                         info.dtype, want[k].nparams, want[k].dtype);
        for (int i = 0; i < info.nparams; i++)
            if (info.param_ids[i] != want[k].ids[i] || info.offsets[i] != want[k].offsets[i])
                HARNESS_FAIL("rank %d: bucket %d slot %d holds param %d at offset %zu, want param %d at %zu", rank, k,
                             i, info.param_ids[i], info.offsets[i], want[k].ids[i], want[k].offsets[i]);
    }
    return 0;
}

/* Reverse order, the small first cap, an oversized param alone, and a
 * bucket closed exactly at its cap. Caps: first 1000 bytes, then 4000. */
static int layout_caps_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int rank = braid_pg_rank(pg);
    static const pspec spec[] = {{BRAID_F32, 100},  {BRAID_F32, 50},  {BRAID_F32, 300},
                                 {BRAID_F32, 2000}, {BRAID_F32, 100}, {BRAID_F32, 150}};
    model m;
    if (model_create(pg, &m, spec, 6, 4000, 1000))
        return 1;
    if (braid_bucketer_bucket_count(m.b) != 0)
        HARNESS_FAIL("rank %d: bucket_count before the layout is formed is %d, want 0", rank,
                     braid_bucketer_bucket_count(m.b));
    if (braid__bucketer_build(m.b) != BRAID_OK)
        HARNESS_FAIL("rank %d: build: %s", rank, braid_last_error());
    /* Walk 5,4,3,2,1,0: {5,4} fills the 1000-byte first bucket exactly;
     * param 3 (8000 bytes) exceeds the 4000-byte cap and stands alone;
     * {2,1,0} is 1800 bytes. */
    static const want_bucket want[] = {
        {2, {5, 4}, {0, 150}, BRAID_F32},
        {1, {3}, {0}, BRAID_F32},
        {3, {2, 1, 0}, {0, 300, 350}, BRAID_F32},
    };
    int rc = check_layout(m.b, rank, want, 3);
    model_destroy(&m);
    return rc;
}

/* Mixed dtypes get separate buckets, each dtype with its own first cap,
 * numbered by where their first param sits in the reverse walk. */
static int layout_dtypes_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int rank = braid_pg_rank(pg);
    static const pspec spec[] = {{BRAID_F32, 100}, {BRAID_F64, 100}, {BRAID_F32, 100}, {BRAID_F64, 100},
                                 {BRAID_I32, 10},  {BRAID_F32, 300}, {BRAID_F64, 10}};
    model m;
    if (model_create(pg, &m, spec, 7, 2000, 800))
        return 1;
    if (braid_bucketer_ready(m.b, 6) != BRAID_OK) /* the first ready() forms the layout */
        HARNESS_FAIL("rank %d: ready: %s", rank, braid_last_error());
    /* Walk 6..0 (first cap 800 B, then 2000 B): 6 (f64, 80 B) opens the
     * first f64 bucket; 5 (f32, 1200 B) is over the f32 first cap and
     * stands alone; 4 opens the i32 bucket; 3 (f64, 800 B) would take the
     * f64 bucket to 880 B > 800, so {6} closes and 3 opens the next f64
     * bucket, which 1 joins (1600 B); 2 and 0 (f32, 400 B each) share the
     * second f32 bucket. */
    static const want_bucket want[] = {
        {1, {6}, {0}, BRAID_F64},         {1, {5}, {0}, BRAID_F32},         {1, {4}, {0}, BRAID_I32},
        {2, {3, 1}, {0, 100}, BRAID_F64}, {2, {2, 0}, {0, 100}, BRAID_F32},
    };
    int rc = check_layout(m.b, rank, want, 5);
    model_destroy(&m);
    return rc;
}

/* Defaults are PyTorch's: 1 MiB first bucket, 25 MiB after. Ten 400 KB
 * params: two fill the first bucket, the other eight (3.2 MB) share one. */
static int layout_defaults_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int rank = braid_pg_rank(pg);
    pspec spec[10];
    for (int p = 0; p < 10; p++)
        spec[p] = (pspec){BRAID_F32, 100000};
    model m;
    if (model_create(pg, &m, spec, 10, 0, 0))
        return 1;
    if (braid__bucketer_build(m.b) != BRAID_OK)
        HARNESS_FAIL("rank %d: build: %s", rank, braid_last_error());
    braid__bucket_info a, c;
    if (braid_bucketer_bucket_count(m.b) != 2 || braid__bucketer_bucket_info(m.b, 0, &a) != BRAID_OK ||
        braid__bucketer_bucket_info(m.b, 1, &c) != BRAID_OK)
        HARNESS_FAIL("rank %d: %d buckets with default caps, want 2", rank, braid_bucketer_bucket_count(m.b));
    if (a.nparams != 2 || a.param_ids[0] != 9 || a.param_ids[1] != 8 || c.nparams != 8 || c.param_ids[0] != 7 ||
        c.param_ids[7] != 0)
        HARNESS_FAIL("rank %d: default-cap buckets hold %d and %d params, want 2 (9, 8) and 8 (7..0)", rank, a.nparams,
                     c.nparams);
    model_destroy(&m);
    return 0;
}

/* Properties of any layout, checked on a pseudo-random model: a partition
 * of the params; one dtype per bucket; slots in decreasing id order with
 * contiguous offsets; buckets of a dtype follow the reverse walk and are
 * maximal (the next param would not have fitted) and within their cap
 * unless they hold a single param; buckets numbered by first param. */
static int layout_random_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int rank = braid_pg_rank(pg);
    enum { P = 200 };
    static const braid_dtype dts[] = {BRAID_F32, BRAID_F32, BRAID_F32, BRAID_F64, BRAID_BF16, BRAID_I32};
    const size_t first_cap = 3000, cap = 20000;
    pspec spec[P];
    for (int p = 0; p < P; p++) {
        spec[p].dtype = dts[harness_value(0, (size_t)p, 5, 0, 5)];
        spec[p].count =
            (size_t)harness_value(0, (size_t)p, 6, 1, harness_value(0, (size_t)p, 7, 0, 9) == 0 ? 9000 : 600);
    }
    model m;
    if (model_create(pg, &m, spec, P, cap, first_cap))
        return 1;
    if (braid__bucketer_build(m.b) != BRAID_OK)
        HARNESS_FAIL("rank %d: build: %s", rank, braid_last_error());
    int nb = braid_bucketer_bucket_count(m.b);
    int seen[P] = {0};
    int last_of_dtype[BRAID_DTYPE_COUNT]; /* bucket index, -1 none */
    for (int d = 0; d < BRAID_DTYPE_COUNT; d++)
        last_of_dtype[d] = -1;
    int prev_first = P;
    for (int k = 0; k < nb; k++) {
        braid__bucket_info info;
        if (braid__bucketer_bucket_info(m.b, k, &info) != BRAID_OK)
            HARNESS_FAIL("rank %d: bucket_info(%d): %s", rank, k, braid_last_error());
        if (info.nparams < 1)
            HARNESS_FAIL("rank %d: bucket %d is empty", rank, k);
        if (info.param_ids[0] >= prev_first)
            HARNESS_FAIL("rank %d: bucket %d starts at param %d, after bucket %d's %d", rank, k, info.param_ids[0],
                         k - 1, prev_first);
        prev_first = info.param_ids[0];
        size_t off = 0, bytes = 0;
        for (int i = 0; i < info.nparams; i++) {
            int id = info.param_ids[i];
            if (id < 0 || id >= P || seen[id]++)
                HARNESS_FAIL("rank %d: param %d placed twice or out of range", rank, id);
            if (spec[id].dtype != info.dtype)
                HARNESS_FAIL("rank %d: bucket %d (dtype %d) holds param %d of dtype %d", rank, k, info.dtype, id,
                             spec[id].dtype);
            if (i > 0 && id >= info.param_ids[i - 1])
                HARNESS_FAIL("rank %d: bucket %d not in reverse registration order", rank, k);
            if (info.offsets[i] != off)
                HARNESS_FAIL("rank %d: bucket %d slot %d at offset %zu, want %zu", rank, k, i, info.offsets[i], off);
            off += spec[id].count;
            bytes += spec[id].count * braid_dtype_size(spec[id].dtype);
        }
        if (info.count != off || info.bytes != bytes)
            HARNESS_FAIL("rank %d: bucket %d count %zu bytes %zu, want %zu and %zu", rank, k, info.count, info.bytes,
                         off, bytes);
        int d = (int)info.dtype;
        size_t my_cap = last_of_dtype[d] < 0 ? first_cap : cap;
        if (bytes > my_cap && info.nparams != 1)
            HARNESS_FAIL("rank %d: bucket %d has %zu bytes > cap %zu with %d params", rank, k, bytes, my_cap,
                         info.nparams);
        if (last_of_dtype[d] >= 0) {
            /* The previous bucket of this dtype must have been full: the
             * next param of the walk (this bucket's first) did not fit. */
            braid__bucket_info prev;
            braid__bucketer_bucket_info(m.b, last_of_dtype[d], &prev);
            int prev_is_first = 1;
            for (int j = 0; j < last_of_dtype[d]; j++) {
                braid__bucket_info o;
                braid__bucketer_bucket_info(m.b, j, &o);
                if (o.dtype == info.dtype)
                    prev_is_first = 0;
            }
            size_t prev_cap = prev_is_first ? first_cap : cap;
            size_t next = spec[info.param_ids[0]].count * braid_dtype_size(info.dtype);
            if (prev.bytes + next <= prev_cap && prev.bytes < prev_cap)
                HARNESS_FAIL("rank %d: bucket %d (%zu bytes, cap %zu) closed although param %d (%zu bytes) fitted",
                             rank, last_of_dtype[d], prev.bytes, prev_cap, info.param_ids[0], next);
            /* And no param of this dtype was skipped between the two. */
            int last_prev = prev.param_ids[prev.nparams - 1];
            for (int id = last_prev - 1; id > info.param_ids[0]; id--)
                if (spec[id].dtype == info.dtype)
                    HARNESS_FAIL("rank %d: param %d skipped between buckets %d and %d", rank, id, last_of_dtype[d], k);
        }
        last_of_dtype[d] = k;
    }
    for (int p = 0; p < P; p++)
        if (!seen[p])
            HARNESS_FAIL("rank %d: param %d in no bucket", rank, p);
    model_destroy(&m);
    return 0;
}

/* ---- averaged gradients ---------------------------------------------- */

/* Order in which a step marks params: 0 reverse (backward), 1 forward,
 * 2 a permutation that differs per rank (launching in bucket order must
 * still pair the same all-reduces on every rank). */
static void ready_order(int kind, int n, int rank, uint32_t seed, int *order)
{
    for (int i = 0; i < n; i++)
        order[i] = kind == 1 ? i : n - 1 - i;
    if (kind == 2) {
        for (int i = n - 1; i > 0; i--) {
            int j = (int)harness_value(rank, (size_t)i, seed, 0, i);
            int t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
    }
}

static int mixed_steps_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int rank = braid_pg_rank(pg), n = braid_pg_size(pg);
    model m;
    if (model_create(pg, &m, mixed_model, MIXED_N, MIXED_CAP, MIXED_FIRST_CAP))
        return 1;
    int nb = -1;
    for (int step = 0; step < 4; step++) {
        uint32_t seed = 1000u + (uint32_t)step;
        fill_grads(&m, mixed_model, rank, seed);
        int order[MIXED_N];
        ready_order(step % 3, MIXED_N, rank, seed, order);
        for (int i = 0; i < MIXED_N; i++)
            if (braid_bucketer_ready(m.b, order[i]) != BRAID_OK)
                HARNESS_FAIL("rank %d step %d: ready(%d): %s", rank, step, order[i], braid_last_error());
        if (braid_bucketer_finish(m.b) != BRAID_OK)
            HARNESS_FAIL("rank %d step %d: finish: %s", rank, step, braid_last_error());
        if (check_averaged(&m, mixed_model, rank, n, seed, step))
            return 1;
        if (nb < 0)
            nb = braid_bucketer_bucket_count(m.b);
        else if (nb != braid_bucketer_bucket_count(m.b))
            HARNESS_FAIL("rank %d: bucket count changed from %d to %d", rank, nb, braid_bucketer_bucket_count(m.b));
    }
    /* 15 params in 7 dtypes with small caps: at least one bucket per dtype. */
    if (nb < 7)
        HARNESS_FAIL("rank %d: %d buckets for 7 dtypes", rank, nb);
    model_destroy(&m);
    return 0;
}

/* ---- compression ---------------------------------------------------- */

/* f32 gradients in [-1, 1] sent as f16/bf16. Each rank sends x / n
 * (divided in f32, then rounded to the wire type) and the wire sums them.
 * Bound, with u = 2^-p the unit roundoff (p = 11 significand bits for f16,
 * 8 for bf16): each of the n inputs x / n is rounded once to the wire type
 * (error <= u / n, plus 2^-24 relative from the f32 division), and each of
 * the n-1 partial sums (magnitude <= 1) once more (<= u); so
 * |error of the mean| <= n u (1 + 2^-12). The f64 param must stay exact:
 * compression applies to f32 buckets only. */
typedef struct {
    braid_dtype wire;
} compress_arg;

static float unit_value(int rank, int p, size_t i, uint32_t seed)
{
    return (float)harness_value(rank, i + (size_t)p * 7919u, seed, -1000, 1000) / 1000.0f;
}

static int compression_body(braid_pg *pg, void *varg)
{
    const compress_arg *arg = varg;
    int rank = braid_pg_rank(pg), n = braid_pg_size(pg);
    static const pspec spec[] = {{BRAID_F32, 5000}, {BRAID_F64, 64}, {BRAID_F32, 333}, {BRAID_F32, 40000}};
    enum { P = 4 };
    model m;
    if (model_create(pg, &m, spec, P, 100000, 8192))
        return 1;
    if (braid_bucketer_set_compression(m.b, arg->wire) != BRAID_OK)
        HARNESS_FAIL("rank %d: set_compression: %s", rank, braid_last_error());
    const int p_bits = arg->wire == BRAID_F16 ? 11 : 8;
    const double tol = n * ldexp(1.0, -p_bits) * (1.0 + ldexp(1.0, -12));
    double max_err = 0;
    for (int step = 0; step < 2; step++) {
        uint32_t seed = 50u + (uint32_t)step;
        for (int p = 0; p < P; p++)
            for (size_t i = 0; i < spec[p].count; i++) {
                if (spec[p].dtype == BRAID_F32)
                    ((float *)m.grads[p])[i] = unit_value(rank, p, i, seed);
                else
                    ((double *)m.grads[p])[i] = grad_value(rank, p, i, seed);
            }
        for (int p = P - 1; p >= 0; p--)
            if (braid_bucketer_ready(m.b, p) != BRAID_OK)
                HARNESS_FAIL("rank %d: ready(%d): %s", rank, p, braid_last_error());
        if (braid_bucketer_finish(m.b) != BRAID_OK)
            HARNESS_FAIL("rank %d: finish: %s", rank, braid_last_error());
        for (int k = 0; k < braid_bucketer_bucket_count(m.b); k++) {
            braid__bucket_info info;
            braid__bucketer_bucket_info(m.b, k, &info);
            braid_dtype want = info.dtype == BRAID_F32 ? arg->wire : info.dtype;
            if (info.wire_dtype != want)
                HARNESS_FAIL("rank %d: bucket %d of dtype %d has wire dtype %d, want %d", rank, k, info.dtype,
                             info.wire_dtype, want);
        }
        for (int p = 0; p < P; p++) {
            for (size_t i = 0; i < spec[p].count; i++) {
                if (spec[p].dtype == BRAID_F64) {
                    int64_t sum = 0;
                    for (int r = 0; r < n; r++)
                        sum += (int64_t)grad_value(r, p, i, seed);
                    double want = (double)sum / n, got = ((double *)m.grads[p])[i];
                    if (got != want)
                        HARNESS_FAIL("rank %d: f64 param %d element %zu is %.17g, want exactly %.17g", rank, p, i, got,
                                     want);
                    continue;
                }
                double mean = 0;
                for (int r = 0; r < n; r++)
                    mean += unit_value(r, p, i, seed);
                mean /= n;
                float got = ((float *)m.grads[p])[i];
                double err = fabs((double)got - mean);
                if (err > max_err)
                    max_err = err;
                if (err > tol)
                    HARNESS_FAIL("rank %d of %d: wire dtype %d param %d element %zu is %.8g, mean %.8g: error %.3g "
                                 "> bound %.3g",
                                 rank, n, arg->wire, p, i, got, mean, err, tol);
                /* The value came back through the wire type: it must be
                 * exactly representable there. */
                uint16_t h;
                float back;
                braid__cast(arg->wire, &h, BRAID_F32, &got, 1);
                braid__cast(BRAID_F32, &back, arg->wire, &h, 1);
                if (back != got)
                    HARNESS_FAIL("rank %d: param %d element %zu = %.9g is not a dtype-%d value: not compressed", rank,
                                 p, i, got, arg->wire);
            }
        }
    }
    if (rank == 0)
        fprintf(stderr, "compression wire=%d ranks=%d: max error %.3g (bound %.3g)\n", arg->wire, n, max_err, tol);
    model_destroy(&m);
    return 0;
}

/* Gradients near f16's top (max 65504): the average fits, the sum over
 * ranks would not (4 ranks x 30000 = 120000; 2 ranks x 60000). Sent as
 * x / n and summed, every partial sum stays within rounding of max |x|
 * (64000 here; right at 65504 that rounding can still reach inf), so the
 * result is finite and within the bound above scaled by 65504. */
static float big_value(int rank, size_t i)
{
    static const float v[] = {30000.0f, 60000.0f, -60000.0f, 64000.0f, 1.0f};
    return i % 7 == 6 ? (float)(rank + 1) * 1000.0f : v[(i + (size_t)(i % 3 == 0 ? rank : 0)) % 5];
}

static int compression_range_body(braid_pg *pg, void *varg)
{
    (void)varg;
    int rank = braid_pg_rank(pg), n = braid_pg_size(pg);
    static const pspec spec[] = {{BRAID_F32, 3001}, {BRAID_F32, 77}};
    model m;
    if (model_create(pg, &m, spec, 2, 1 << 20, 4096))
        return 1;
    if (braid_bucketer_set_compression(m.b, BRAID_F16) != BRAID_OK)
        HARNESS_FAIL("rank %d: set_compression: %s", rank, braid_last_error());
    for (int p = 0; p < 2; p++)
        for (size_t i = 0; i < spec[p].count; i++)
            ((float *)m.grads[p])[i] = big_value(rank, i);
    for (int p = 1; p >= 0; p--)
        if (braid_bucketer_ready(m.b, p) != BRAID_OK)
            HARNESS_FAIL("rank %d: ready(%d): %s", rank, p, braid_last_error());
    if (braid_bucketer_finish(m.b) != BRAID_OK)
        HARNESS_FAIL("rank %d: finish: %s", rank, braid_last_error());
    const double tol = 65504.0 * n * ldexp(1.0, -11) * (1.0 + ldexp(1.0, -12));
    double max_err = 0;
    int all_30000 = 0;
    for (int p = 0; p < 2; p++)
        for (size_t i = 0; i < spec[p].count; i++) {
            double mean = 0;
            int same = 1;
            for (int r = 0; r < n; r++) {
                mean += big_value(r, i);
                same &= big_value(r, i) == 30000.0f;
            }
            mean /= n;
            float got = ((float *)m.grads[p])[i];
            if (!isfinite(got) || fabs((double)got - mean) > tol)
                HARNESS_FAIL("rank %d of %d: param %d element %zu is %.8g, mean %.8g (bound %.3g): f16 overflowed or "
                             "lost the value",
                             rank, n, p, i, got, mean, tol);
            if (same) {
                all_30000++;
                /* 30000 / n summed n times: exact for n = 1, 2, 4 and within
                 * one f16 step (16 at this magnitude) otherwise. */
                if (fabs((double)got - 30000.0) > 16.0)
                    HARNESS_FAIL("rank %d of %d: %d x 30000 averaged to %.8g", rank, n, n, got);
            }
            max_err = fmax(max_err, fabs((double)got - mean));
        }
    if (all_30000 == 0)
        HARNESS_FAIL("rank %d: the test data has no element that is 30000 on every rank", rank);
    if (rank == 0)
        fprintf(stderr, "compression range f16 ranks=%d: max error %.3g (bound %.3g), %d elements of 30000 on every "
                        "rank\n",
                n, max_err, tol, all_30000);
    model_destroy(&m);
    return 0;
}

/* ---- errors ---------------------------------------------------------- */

static int contains(const char *text, const char *word)
{
    return strstr(text, word) != NULL;
}

/* Marking twice is rejected, names the param, and does not break the step. */
static int double_mark_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int rank = braid_pg_rank(pg), n = braid_pg_size(pg);
    model m;
    if (model_create(pg, &m, mixed_model, MIXED_N, MIXED_CAP, MIXED_FIRST_CAP))
        return 1;
    fill_grads(&m, mixed_model, rank, 7);
    for (int p = MIXED_N - 1; p >= 0; p--) {
        if (braid_bucketer_ready(m.b, p) != BRAID_OK)
            HARNESS_FAIL("rank %d: ready(%d): %s", rank, p, braid_last_error());
        if (p == 9) {
            braid_status st = braid_bucketer_ready(m.b, 9);
            if (st != BRAID_ERR_INVALID_ARG || !contains(braid_last_error(), "param 9") ||
                !contains(braid_last_error(), "twice") || !contains(braid_last_error(), "rank"))
                HARNESS_FAIL("rank %d: second ready(9) gave %s '%s', want INVALID_ARG naming param 9", rank,
                             braid_status_string(st), braid_last_error());
        }
    }
    if (braid_bucketer_finish(m.b) != BRAID_OK)
        HARNESS_FAIL("rank %d: finish after a rejected double mark: %s", rank, braid_last_error());
    int rc = check_averaged(&m, mixed_model, rank, n, 7, 0);
    model_destroy(&m);
    return rc;
}

/* finish() with params never marked names them; the next step works. */
static int unmarked_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int rank = braid_pg_rank(pg), n = braid_pg_size(pg);
    model m;
    if (model_create(pg, &m, mixed_model, MIXED_N, MIXED_CAP, MIXED_FIRST_CAP))
        return 1;
    fill_grads(&m, mixed_model, rank, 3);
    for (int p = MIXED_N - 1; p >= 0; p--)
        if (p != 2 && p != 11 && braid_bucketer_ready(m.b, p) != BRAID_OK)
            HARNESS_FAIL("rank %d: ready(%d): %s", rank, p, braid_last_error());
    braid_status st = braid_bucketer_finish(m.b);
    const char *e = braid_last_error();
    if (st != BRAID_ERR_INVALID_ARG || !contains(e, "2, 11") || !contains(e, "2 of 15"))
        HARNESS_FAIL("rank %d: finish with params 2 and 11 unmarked gave %s '%s', want INVALID_ARG naming them", rank,
                     braid_status_string(st), e);
    for (int step = 1; step < 3; step++) {
        fill_grads(&m, mixed_model, rank, 3u + (uint32_t)step);
        for (int p = MIXED_N - 1; p >= 0; p--)
            if (braid_bucketer_ready(m.b, p) != BRAID_OK)
                HARNESS_FAIL("rank %d step %d: ready(%d): %s", rank, step, p, braid_last_error());
        if (braid_bucketer_finish(m.b) != BRAID_OK)
            HARNESS_FAIL("rank %d step %d: finish: %s", rank, step, braid_last_error());
        if (check_averaged(&m, mixed_model, rank, n, 3u + (uint32_t)step, step))
            return 1;
    }
    model_destroy(&m);
    return 0;
}

static int expect_invalid(braid_status st, const char *what, int rank)
{
    if (st != BRAID_ERR_INVALID_ARG)
        HARNESS_FAIL("rank %d: %s gave %s, want BRAID_ERR_INVALID_ARG", rank, what, braid_status_string(st));
    if (braid_last_error()[0] == '\0')
        HARNESS_FAIL("rank %d: %s failed without a message", rank, what);
    return 0;
}

static int bad_args_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int rank = braid_pg_rank(pg);
    braid_bucketer *b = NULL;
    float g[4] = {0};
    int id = -1;
    int rc = 0;
    rc |= expect_invalid(braid_bucketer_create(NULL, pg, 0, 0), "create(NULL out)", rank);
    rc |= expect_invalid(braid_bucketer_create(&b, NULL, 0, 0), "create(NULL pg)", rank);
    if (b != NULL)
        HARNESS_FAIL("rank %d: failed create set its output", rank);
    rc |= expect_invalid(braid_bucketer_add(NULL, g, 4, BRAID_F32, &id), "add(NULL bucketer)", rank);
    rc |= expect_invalid(braid_bucketer_ready(NULL, 0), "ready(NULL)", rank);
    rc |= expect_invalid(braid_bucketer_finish(NULL), "finish(NULL)", rank);
    rc |= expect_invalid(braid_bucketer_set_compression(NULL, BRAID_F16), "set_compression(NULL)", rank);
    if (braid_bucketer_bucket_count(NULL) != -1)
        HARNESS_FAIL("rank %d: bucket_count(NULL) is not -1", rank);
    braid_bucketer_destroy(NULL);

    if (braid_bucketer_create(&b, pg, 0, 0) != BRAID_OK)
        HARNESS_FAIL("rank %d: create: %s", rank, braid_last_error());
    rc |= expect_invalid(braid_bucketer_add(b, NULL, 4, BRAID_F32, &id), "add(NULL grad, count 4)", rank);
    rc |= expect_invalid(braid_bucketer_add(b, g, 4, BRAID_DTYPE_COUNT, &id), "add(invalid dtype)", rank);
    rc |= expect_invalid(braid_bucketer_add(b, g, 4, BRAID_F32, NULL), "add(NULL param_id)", rank);
    rc |= expect_invalid(braid_bucketer_set_compression(b, BRAID_I32), "set_compression(I32)", rank);
    rc |= expect_invalid(braid_bucketer_set_compression(b, BRAID_F64), "set_compression(F64)", rank);
    rc |= expect_invalid(braid_bucketer_ready(b, 0), "ready with nothing registered", rank);
    if (braid_bucketer_add(b, g, 4, BRAID_F32, &id) != BRAID_OK || id != 0)
        HARNESS_FAIL("rank %d: add: %s", rank, braid_last_error());
    int id0 = id;
    if (braid_bucketer_add(b, NULL, 0, BRAID_F64, &id) != BRAID_OK || id != 1) /* an empty param is fine */
        HARNESS_FAIL("rank %d: add(empty): %s", rank, braid_last_error());
    rc |= expect_invalid(braid_bucketer_ready(b, -1), "ready(-1)", rank);
    rc |= expect_invalid(braid_bucketer_ready(b, 2), "ready(2) of 2 params", rank);
    if (!contains(braid_last_error(), "param 2"))
        HARNESS_FAIL("rank %d: ready(2) message '%s' does not name param 2", rank, braid_last_error());
    if (braid_bucketer_ready(b, id0) != BRAID_OK)
        HARNESS_FAIL("rank %d: ready(0): %s", rank, braid_last_error());
    rc |= expect_invalid(braid_bucketer_add(b, g, 4, BRAID_F32, &id), "add after the layout was formed", rank);
    rc |= expect_invalid(braid_bucketer_set_compression(b, BRAID_BF16), "set_compression after the layout", rank);
    rc |= expect_invalid(braid_bucketer_finish(b), "finish with param 1 unmarked", rank);
    /* The failed finish reset the step: a full step now succeeds. */
    if (braid_bucketer_ready(b, 1) != BRAID_OK || braid_bucketer_ready(b, 0) != BRAID_OK ||
        braid_bucketer_finish(b) != BRAID_OK)
        HARNESS_FAIL("rank %d: step after the failed finish: %s", rank, braid_last_error());
    braid_bucketer_destroy(b);

    /* No params at all: finish is a no-op step. */
    if (braid_bucketer_create(&b, pg, 0, 0) != BRAID_OK || braid_bucketer_finish(b) != BRAID_OK ||
        braid_bucketer_bucket_count(b) != 0)
        HARNESS_FAIL("rank %d: empty bucketer: %s", rank, braid_last_error());
    braid_bucketer_destroy(b);
    return rc;
}

/* A rank registering a different model is caught when the layout is
 * formed, on every rank, instead of mispairing the all-reduces. */
static int mismatch_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int rank = braid_pg_rank(pg);
    model m;
    if (model_create(pg, &m, mixed_model, rank == 1 ? MIXED_N - 1 : MIXED_N, MIXED_CAP, MIXED_FIRST_CAP))
        return 1;
    braid_status st = braid_bucketer_ready(m.b, 0);
    if (st != BRAID_ERR_MISMATCH || !contains(braid_last_error(), "different buckets"))
        HARNESS_FAIL("rank %d: ready with a different model on rank 1 gave %s '%s', want BRAID_ERR_MISMATCH", rank,
                     braid_status_string(st), braid_last_error());
    /* The failure sticks: later calls report it without another (lonely,
     * hanging) cross-rank check. */
    if (braid_bucketer_ready(m.b, 1) != BRAID_ERR_MISMATCH || braid_bucketer_finish(m.b) != BRAID_ERR_MISMATCH ||
        !contains(braid_last_error(), "different buckets"))
        HARNESS_FAIL("rank %d: calls after a layout mismatch gave '%s', want the same BRAID_ERR_MISMATCH", rank,
                     braid_last_error());
    model_destroy(&m);
    return 0;
}

/* Layouts that form the same buckets (same count of elements and params
 * per bucket) but whose elements mean different things on the two ranks:
 * rank 1 registers the same params in another order, or trades sizes
 * between two params keeping their total. A fingerprint of the buckets
 * alone misses both; the check must name both layouts and the first param
 * where they part. */
typedef struct {
    const pspec *other; /* rank 1's model; the rest use pspec_base */
    const char *first_diff; /* expected "first difference at param ..." text on rank 0 */
} layout_mismatch_arg;

static const pspec pspec_base[] = {{BRAID_F32, 1000}, {BRAID_F32, 2000}, {BRAID_F32, 3000}};
static const pspec pspec_swapped[] = {{BRAID_F32, 2000}, {BRAID_F32, 1000}, {BRAID_F32, 3000}};
static const pspec pspec_resized[] = {{BRAID_F32, 1500}, {BRAID_F32, 1500}, {BRAID_F32, 3000}};

static int layout_mismatch_body(braid_pg *pg, void *varg)
{
    const layout_mismatch_arg *arg = varg;
    int rank = braid_pg_rank(pg);
    model m;
    /* One bucket holds all three (24000 bytes under both caps). */
    if (model_create(pg, &m, rank == 1 ? arg->other : pspec_base, 3, 1 << 20, 1 << 20))
        return 1;
    fill_grads(&m, rank == 1 ? arg->other : pspec_base, rank, 5);
    braid_status st = braid_bucketer_ready(m.b, 2);
    const char *e = braid_last_error();
    if (rank == 0)
        fprintf(stderr, "layout mismatch: %s\n", e);
    char peer[32];
    snprintf(peer, sizeof(peer), "rank %d has", rank == 1 ? 0 : 1);
    if (st != BRAID_ERR_MISMATCH || !contains(e, "different buckets") || !contains(e, "this rank has 3 params") ||
        !contains(e, peer) || !contains(e, "6000 elements in 1 buckets") || !contains(e, "layout hash"))
        HARNESS_FAIL("rank %d: ready with rank 1's params %s gave %s '%s', want BRAID_ERR_MISMATCH naming this rank's "
                     "layout and %s's",
                     rank, arg->first_diff, braid_status_string(st), e, peer);
    if (rank == 0 && !contains(e, arg->first_diff))
        HARNESS_FAIL("rank 0: mismatch message '%s' does not say '%s'", e, arg->first_diff);
    if (braid_bucketer_finish(m.b) != BRAID_ERR_MISMATCH)
        HARNESS_FAIL("rank %d: finish after a layout mismatch did not report it: '%s'", rank, braid_last_error());
    model_destroy(&m);
    return 0;
}

/* Ranks with identical models (here all three shapes, each on every rank)
 * pass the check: the fingerprint is a function of the layout only. */
static int layout_same_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int rank = braid_pg_rank(pg), n = braid_pg_size(pg);
    const pspec *specs[] = {pspec_base, pspec_swapped, pspec_resized};
    for (int k = 0; k < 3; k++) {
        model m;
        if (model_create(pg, &m, specs[k], 3, 1 << 20, 1 << 20))
            return 1;
        fill_grads(&m, specs[k], rank, 6u + (uint32_t)k);
        for (int p = 2; p >= 0; p--)
            if (braid_bucketer_ready(m.b, p) != BRAID_OK)
                HARNESS_FAIL("rank %d: model %d ready(%d): %s", rank, k, p, braid_last_error());
        if (braid_bucketer_finish(m.b) != BRAID_OK)
            HARNESS_FAIL("rank %d: model %d finish: %s", rank, k, braid_last_error());
        if (check_averaged(&m, specs[k], rank, n, 6u + (uint32_t)k, 0))
            return 1;
        model_destroy(&m);
    }
    return 0;
}

/* A collective failure inside a step comes out of finish() with the
 * bucket and the cause: here rank 1 leaves after the layout is formed, so
 * rank 0's all-reduces find the peer gone. */
static int peer_gone_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int rank = braid_pg_rank(pg);
    model m;
    if (model_create(pg, &m, mixed_model, MIXED_N, MIXED_CAP, MIXED_FIRST_CAP))
        return 1;
    if (braid__bucketer_build(m.b) != BRAID_OK)
        HARNESS_FAIL("rank %d: build: %s", rank, braid_last_error());
    if (rank == 1) {
        model_destroy(&m);
        return 0; /* the harness destroys the group: connections close */
    }
    fill_grads(&m, mixed_model, rank, 9);
    braid_status st = BRAID_OK;
    for (int p = MIXED_N - 1; p >= 0 && st == BRAID_OK; p--)
        st = braid_bucketer_ready(m.b, p);
    braid_status fst = braid_bucketer_finish(m.b);
    const char *e = braid_last_error();
    if (fst == BRAID_OK || !contains(e, "bucket") || !contains(e, "rank 0"))
        HARNESS_FAIL("rank 0: finish with rank 1 gone gave %s '%s' (ready gave %s), want an error naming the bucket",
                     braid_status_string(fst), e, braid_status_string(st));
    fprintf(stderr, "peer gone: finish -> %s\n", e);
    model_destroy(&m);
    return 0;
}

/* Aborting the group makes the launch or the wait fail; finish reports
 * BRAID_ERR_ABORTED with the bucket, and nothing is left in flight. */
static int aborted_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int rank = braid_pg_rank(pg);
    model m;
    if (model_create(pg, &m, mixed_model, MIXED_N, MIXED_CAP, MIXED_FIRST_CAP))
        return 1;
    if (braid__bucketer_build(m.b) != BRAID_OK)
        HARNESS_FAIL("rank %d: build: %s", rank, braid_last_error());
    braid_pg_abort(pg);
    fill_grads(&m, mixed_model, rank, 11);
    for (int p = MIXED_N - 1; p >= 0; p--)
        (void)braid_bucketer_ready(m.b, p); /* may fail at launch: finish reports it */
    braid_status st = braid_bucketer_finish(m.b);
    if (st != BRAID_ERR_ABORTED || !contains(braid_last_error(), "bucket"))
        HARNESS_FAIL("rank %d: finish on an aborted group gave %s '%s', want BRAID_ERR_ABORTED naming the bucket", rank,
                     braid_status_string(st), braid_last_error());
    model_destroy(&m);
    return 0;
}

/* ---- suite ----------------------------------------------------------- */

static const int rank_counts[] = {1, 2, 3, 4};

START_TEST(test_layout_caps)
{
    run_or_fail(rank_counts[_i], layout_caps_body, NULL);
}
END_TEST

START_TEST(test_layout_dtypes)
{
    run_or_fail(1, layout_dtypes_body, NULL);
}
END_TEST

START_TEST(test_layout_defaults)
{
    run_or_fail(1, layout_defaults_body, NULL);
}
END_TEST

START_TEST(test_layout_random)
{
    run_or_fail(2, layout_random_body, NULL);
}
END_TEST

START_TEST(test_mixed_steps)
{
    run_or_fail(rank_counts[_i], mixed_steps_body, NULL);
}
END_TEST

START_TEST(test_compression_f16)
{
    compress_arg a = {BRAID_F16};
    run_or_fail(rank_counts[_i], compression_body, &a);
}
END_TEST

START_TEST(test_compression_bf16)
{
    compress_arg a = {BRAID_BF16};
    run_or_fail(rank_counts[_i], compression_body, &a);
}
END_TEST

START_TEST(test_compression_range)
{
    run_or_fail(rank_counts[_i], compression_range_body, NULL);
}
END_TEST

START_TEST(test_double_mark)
{
    run_or_fail(rank_counts[_i], double_mark_body, NULL);
}
END_TEST

START_TEST(test_unmarked)
{
    run_or_fail(rank_counts[_i], unmarked_body, NULL);
}
END_TEST

START_TEST(test_bad_args)
{
    run_or_fail(1, bad_args_body, NULL);
}
END_TEST

START_TEST(test_mismatch)
{
    run_or_fail(rank_counts[_i], mismatch_body, NULL);
}
END_TEST

START_TEST(test_mismatch_order)
{
    layout_mismatch_arg a = {pspec_swapped, "first difference at param 0: 1000 x f32 on rank 0, 2000 x f32 on rank 1"};
    run_or_fail(rank_counts[_i], layout_mismatch_body, &a);
}
END_TEST

START_TEST(test_mismatch_sizes)
{
    layout_mismatch_arg a = {pspec_resized, "first difference at param 0: 1000 x f32 on rank 0, 1500 x f32 on rank 1"};
    run_or_fail(rank_counts[_i], layout_mismatch_body, &a);
}
END_TEST

START_TEST(test_layout_same)
{
    run_or_fail(rank_counts[_i], layout_same_body, NULL);
}
END_TEST

START_TEST(test_peer_gone)
{
    run_or_fail(2, peer_gone_body, NULL);
}
END_TEST

START_TEST(test_aborted)
{
    run_or_fail(rank_counts[_i], aborted_body, NULL);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("bucketer");
    int nrc = (int)(sizeof(rank_counts) / sizeof(rank_counts[0]));

    TCase *layout = tcase_create("layout");
    tcase_set_timeout(layout, TIMEOUT_S + 30);
    tcase_add_loop_test(layout, test_layout_caps, 0, nrc);
    tcase_add_test(layout, test_layout_dtypes);
    tcase_add_test(layout, test_layout_defaults);
    tcase_add_test(layout, test_layout_random);
    suite_add_tcase(s, layout);

    TCase *sync = tcase_create("sync");
    tcase_set_timeout(sync, TIMEOUT_S + 30);
    tcase_add_loop_test(sync, test_mixed_steps, 0, nrc);
    tcase_add_loop_test(sync, test_compression_f16, 0, nrc);
    tcase_add_loop_test(sync, test_compression_bf16, 0, nrc);
    tcase_add_loop_test(sync, test_compression_range, 0, nrc);
    suite_add_tcase(s, sync);

    TCase *errors = tcase_create("errors");
    tcase_set_timeout(errors, TIMEOUT_S + 30);
    tcase_add_loop_test(errors, test_double_mark, 1, nrc);
    tcase_add_loop_test(errors, test_unmarked, 0, nrc);
    tcase_add_test(errors, test_bad_args);
    tcase_add_loop_test(errors, test_mismatch, 1, nrc); /* from 2 ranks */
    tcase_add_loop_test(errors, test_mismatch_order, 1, nrc);
    tcase_add_loop_test(errors, test_mismatch_sizes, 1, nrc);
    tcase_add_loop_test(errors, test_layout_same, 1, nrc);
    tcase_add_test(errors, test_peer_gone);
    tcase_add_loop_test(errors, test_aborted, 0, nrc);
    suite_add_tcase(s, errors);

    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
