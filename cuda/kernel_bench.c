/* braid-kernel-bench: bandwidth of the fused CUDA reduce kernels against
 * cudaMemcpy device-to-device on the same buffers.
 *
 *   braid-kernel-bench [-b MIN_BYTES] [-e MAX_BYTES] [-n ITERS] [-s NSRCS]
 *
 * Bandwidth counts every byte a call moves: (nsrcs reads + 1 write) x size
 * for a reduce, 2 x size for a copy, so "ratio" near 1 means the kernel runs
 * at copy speed, i.e. at memory bandwidth. Exits 0 with "SKIP: ..." when
 * there is no device, so scripted runs on CPU machines do not fail. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "braid_cuda.h"

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

int main(int argc, char **argv)
{
    size_t min_bytes = 1 << 20, max_bytes = 256u << 20;
    int iters = 20, nsrcs = 2, opt;
    while ((opt = getopt(argc, argv, "b:e:n:s:h")) != -1) {
        switch (opt) {
        case 'b': min_bytes = strtoull(optarg, NULL, 0); break;
        case 'e': max_bytes = strtoull(optarg, NULL, 0); break;
        case 'n': iters = atoi(optarg); break;
        case 's': nsrcs = atoi(optarg); break;
        default:
            fprintf(stderr, "usage: %s [-b MIN_BYTES] [-e MAX_BYTES] [-n ITERS] [-s NSRCS 1..%d]\n", argv[0],
                    BRAID_CUDA_MAX_SRCS);
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
    /* zeroed inputs: contents do not change the kernels' speed */
    void *zeros = calloc(1, max_bytes);
    if (zeros == NULL)
        die("calloc");
    for (int k = 0; k < nsrcs; k++)
        if (braid__cuda_memcpy_async(src[k], zeros, max_bytes, NULL) != BRAID_OK)
            die("memcpy");
    free(zeros);

    printf("# %d inputs, %d iterations, %d SMs\n", nsrcs, iters, braid__cuda_sm_count(0));
    printf("%12s %6s %10s %10s %10s %12s\n", "bytes", "type", "op", "GB/s", "copy GB/s", "ratio");
    const void *const *srcs = (const void *const *)src;
    struct {
        const char *name;
        braid_dtype dst_t, src_t;
        braid_op op;
    } cases[] = {
        {"f32", BRAID_F32, BRAID_F32, BRAID_SUM},   {"f32", BRAID_F32, BRAID_F32, BRAID_AVG},
        {"f16", BRAID_F16, BRAID_F16, BRAID_SUM},   {"bf16", BRAID_BF16, BRAID_BF16, BRAID_SUM},
        {"bf16", BRAID_BF16, BRAID_BF16, BRAID_AVG}, {"f16>32", BRAID_F32, BRAID_F16, BRAID_SUM},
    };
    const char *op_names[] = {"sum", "prod", "min", "max", "avg"};
    for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
        bench_call copy = {.is_copy = 1, .dst = dst, .srcs = srcs, .count = bytes};
        double tcopy = time_call(&copy, iters);
        double copy_bw = 2.0 * (double)bytes / tcopy / 1e9;
        for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
            size_t in_es = cases[c].src_t == BRAID_F32 ? 4 : 2, out_es = cases[c].dst_t == BRAID_F32 ? 4 : 2;
            size_t count = bytes / in_es;
            if (count * out_es > max_bytes)
                continue;
            bench_call red = {.dst_t = cases[c].dst_t, .src_t = cases[c].src_t, .op = cases[c].op,
                              .dst = dst, .srcs = srcs, .nsrcs = nsrcs, .count = count};
            double t = time_call(&red, iters);
            double moved = (double)count * (double)(in_es * (size_t)nsrcs + out_es);
            double bw = moved / t / 1e9;
            printf("%12zu %6s %10s %10.1f %10.1f %12.2f\n", bytes, cases[c].name, op_names[cases[c].op], bw, copy_bw,
                   bw / copy_bw);
        }
    }
    for (int k = 0; k < nsrcs; k++)
        braid__cuda_free(src[k]);
    braid__cuda_free(dst);
    return 0;
}
