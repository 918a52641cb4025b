/* braid-kernel-bench: bandwidth of the fused CUDA reduce kernels against
 * cudaMemcpy device-to-device on the same buffers.
 *
 *   braid-kernel-bench [-b MIN_BYTES] [-e MAX_BYTES] [-n ITERS] [-s NSRCS] [-t MIN_RATIO]
 *
 * Bandwidth counts every byte a call moves: (nsrcs reads + 1 write) x size
 * for a reduce, 2 x size for a copy, so "ratio" (kernel GB/s over the
 * cudaMemcpy D2D GB/s measured in the same run at the same size) near 1
 * means the kernel runs at copy speed, i.e. at memory bandwidth.
 *
 * Inputs are random finite values of each dtype (not zeros, which some
 * hardware paths compress or short-cut), different per input buffer; every
 * dtype is timed with SUM, floats with AVG too, and f16 inputs into an f32
 * accumulator. The last line gives the smallest ratio at the largest size;
 * with -t the exit status is 1 when it is below MIN_RATIO (0.9 is the
 * target on H100/H200-class GPUs). Exits 0 with "SKIP: ..." when there is no
 * device, so scripted runs on CPU machines do not fail. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "braid_cuda.h"
#include "reduce/reduce.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what)
{
    fprintf(stderr, "braid-kernel-bench: %s: %s\n", what, braid_last_error());
    exit(1);
}

/* What one timed call does: a copy, or a reduce with these arguments. */
typedef struct {
    int is_copy;
    braid_dtype dst_t, src_t;
    braid_op op;
    void *dst;
    const void *const *srcs;
    int nsrcs;
    size_t count; /* elements (copy: bytes) */
} bench_call;

static braid_status call_once(const bench_call *c)
{
    if (c->is_copy)
        return braid__cuda_memcpy_async(c->dst, c->srcs[0], c->count, NULL);
    return braid__cuda_reduce_cast(c->dst_t, c->dst, c->src_t, c->op, c->srcs, c->nsrcs, c->count, c->nsrcs, NULL);
}

/* Seconds per call after warm-up. Host timing around a stream sync: launch
 * overhead (microseconds) is small next to the millisecond transfers this
 * is meant for, and the copy baseline is measured the same way. */
static double time_call(const bench_call *c, int iters)
{
    for (int i = 0; i < 3; i++)
        if (call_once(c) != BRAID_OK)
            die("warm-up");
    if (braid__cuda_stream_sync(NULL) != BRAID_OK)
        die("sync");
    double t0 = now();
    for (int i = 0; i < iters; i++)
        if (call_once(c) != BRAID_OK)
            die("call");
    if (braid__cuda_stream_sync(NULL) != BRAID_OK)
        die("sync");
    return (now() - t0) / iters;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t rng(void)
{
    /* xorshift64*: fast, and plenty for benchmark inputs */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1Dull;
}

/* Random finite values of dtype: floats uniform in [-4, 4) (normal
 * numbers, so no denormal slow paths), integers random bits. */
static void fill_random(braid_dtype t, void *buf, size_t count, float *scratch)
{
    switch (t) {
    case BRAID_F32:
    case BRAID_F16:
    case BRAID_BF16: {
        float *f = t == BRAID_F32 ? buf : scratch;
        for (size_t i = 0; i < count; i++)
            f[i] = (float)((double)(rng() >> 11) * 0x1p-53 * 8.0 - 4.0);
        if (t != BRAID_F32)
            braid__cast(t, buf, BRAID_F32, f, count);
        break;
    }
    case BRAID_F64: {
        double *d = buf;
        for (size_t i = 0; i < count; i++)
            d[i] = (double)(rng() >> 11) * 0x1p-53 * 8.0 - 4.0;
        break;
    }
    default: {
        unsigned char *b = buf;
        size_t bytes = count * braid_dtype_size(t);
        for (size_t i = 0; i < bytes; i += 8) {
            uint64_t v = rng();
            memcpy(b + i, &v, bytes - i < 8 ? bytes - i : 8);
        }
        break;
    }
    }
}

/* Random inputs of dtype t in every source buffer (count elements each). */
static void load_inputs(braid_dtype t, void *const *src, int nsrcs, size_t count, void *host, float *scratch)
{
    for (int k = 0; k < nsrcs; k++) {
        fill_random(t, host, count, scratch);
        if (braid__cuda_memcpy_async(src[k], host, count * braid_dtype_size(t), NULL) != BRAID_OK ||
            braid__cuda_stream_sync(NULL) != BRAID_OK)
            die("memcpy");
    }
}

int main(int argc, char **argv)
{
    size_t min_bytes = 1 << 20, max_bytes = 256u << 20;
    int iters = 20, nsrcs = 2, opt;
    double min_ratio = 0;
    while ((opt = getopt(argc, argv, "b:e:n:s:t:h")) != -1) {
        switch (opt) {
        case 'b': min_bytes = strtoull(optarg, NULL, 0); break;
        case 'e': max_bytes = strtoull(optarg, NULL, 0); break;
        case 'n': iters = atoi(optarg); break;
        case 's': nsrcs = atoi(optarg); break;
        case 't': min_ratio = atof(optarg); break;
        default:
            fprintf(stderr, "usage: %s [-b MIN_BYTES] [-e MAX_BYTES] [-n ITERS] [-s NSRCS 1..%d] [-t MIN_RATIO]\n",
                    argv[0], BRAID_CUDA_MAX_SRCS);
            return opt == 'h' ? 0 : 2;
        }
    }
    if (nsrcs < 1 || nsrcs > BRAID_CUDA_MAX_SRCS || iters < 1 || min_bytes == 0 || min_bytes > max_bytes) {
        fprintf(stderr, "braid-kernel-bench: bad arguments\n");
        return 2;
    }
    if (!braid__cuda_available()) {
        printf("SKIP: no CUDA device: %s\n", braid__cuda_unavailable_reason());
        return 0;
    }

    void *src[BRAID_CUDA_MAX_SRCS], *dst;
    for (int k = 0; k < nsrcs; k++)
        if (braid__cuda_malloc(&src[k], max_bytes) != BRAID_OK)
            die("malloc");
    if (braid__cuda_malloc(&dst, max_bytes) != BRAID_OK)
        die("malloc");
    void *host = malloc(max_bytes);
    float *scratch = malloc(max_bytes * 2); /* f32 values before narrowing to f16/bf16 */
    if (host == NULL || scratch == NULL)
        die("malloc");

    printf("# %d inputs, %d iterations, %d SMs, random inputs per dtype\n", nsrcs, iters, braid__cuda_sm_count(0));
    printf("%12s %8s %6s %10s %10s %12s\n", "bytes", "type", "op", "GB/s", "copy GB/s", "of copy");
    const void *const *srcs = (const void *const *)src;
    struct {
        const char *name;
        braid_dtype dst_t, src_t;
        braid_op op;
    } cases[] = {
        {"f32", BRAID_F32, BRAID_F32, BRAID_SUM},     {"f32", BRAID_F32, BRAID_F32, BRAID_AVG},
        {"f64", BRAID_F64, BRAID_F64, BRAID_SUM},     {"f16", BRAID_F16, BRAID_F16, BRAID_SUM},
        {"f16", BRAID_F16, BRAID_F16, BRAID_AVG},     {"bf16", BRAID_BF16, BRAID_BF16, BRAID_SUM},
        {"bf16", BRAID_BF16, BRAID_BF16, BRAID_AVG},  {"i8", BRAID_I8, BRAID_I8, BRAID_SUM},
        {"u8", BRAID_U8, BRAID_U8, BRAID_MAX},        {"i32", BRAID_I32, BRAID_I32, BRAID_SUM},
        {"i64", BRAID_I64, BRAID_I64, BRAID_SUM},     {"f16>f32", BRAID_F32, BRAID_F16, BRAID_SUM},
    };
    const char *op_names[] = {"sum", "prod", "min", "max", "avg"};
    double worst = -1;
    const char *worst_name = "";
    size_t last_bytes = 0;
    for (size_t bytes = min_bytes; bytes <= max_bytes && bytes > last_bytes; bytes *= 4)
        last_bytes = bytes;
    for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
        bench_call copy = {.is_copy = 1, .dst = dst, .srcs = srcs, .count = bytes};
        double tcopy = time_call(&copy, iters);
        double copy_bw = 2.0 * (double)bytes / tcopy / 1e9;
        braid_dtype loaded = (braid_dtype)-1;
        for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
            size_t in_es = braid_dtype_size(cases[c].src_t), out_es = braid_dtype_size(cases[c].dst_t);
            size_t count = bytes / in_es;
            if (count * out_es > max_bytes)
                continue;
            if (cases[c].src_t != loaded) {
                load_inputs(cases[c].src_t, src, nsrcs, count, host, scratch);
                loaded = cases[c].src_t;
            }
            bench_call red = {.dst_t = cases[c].dst_t, .src_t = cases[c].src_t, .op = cases[c].op,
                              .dst = dst, .srcs = srcs, .nsrcs = nsrcs, .count = count};
            double t = time_call(&red, iters);
            double moved = (double)count * (double)(in_es * (size_t)nsrcs + out_es);
            double bw = moved / t / 1e9, ratio = bw / copy_bw;
            printf("%12zu %8s %6s %10.1f %10.1f %12.3f\n", bytes, cases[c].name, op_names[cases[c].op], bw, copy_bw,
                   ratio);
            if (bytes == last_bytes && (worst < 0 || ratio < worst)) {
                worst = ratio;
                worst_name = cases[c].name;
            }
        }
        loaded = (braid_dtype)-1; /* the next size needs more elements */
    }
    int rc = 0;
    if (worst >= 0) {
        printf("# fused reduce at %zu bytes: at least %.3f of cudaMemcpy D2D bandwidth (lowest: %s)", last_bytes, worst,
               worst_name);
        if (min_ratio > 0) {
            rc = worst < min_ratio;
            printf(", target %.2f: %s", min_ratio, rc ? "FAIL" : "ok");
        }
        printf("\n");
    }
    free(host);
    free(scratch);
    for (int k = 0; k < nsrcs; k++)
        braid__cuda_free(src[k]);
    braid__cuda_free(dst);
    return rc;
}
