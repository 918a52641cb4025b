/* An all_reduce_perf-style benchmark written only against nccl.h and libc,
 * the way nccl-tests programs are: it must build and link against any
 * libnccl.so.2 unchanged. Host buffers, NULL stream; the ranks are forked
 * here (nccl-tests gets them from MPI or threads).
 *
 * usage: nccl_perf_like [-b MINBYTES] [-e MAXBYTES] [-f FACTOR] [-n ITERS]
 *                       [-w WARMUP] [-c CHECK] [-N RANKS]
 * Sizes take K/M/G suffixes. Prints nccl-tests' table: time in us, algbw =
 * bytes / time, busbw = algbw * 2(n-1)/n; exits 1 when a result is wrong. */
#include <nccl.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NCCLCHECK(cmd)                                                                                                 \
    do {                                                                                                               \
        ncclResult_t r_ = (cmd);                                                                                       \
        if (r_ != ncclSuccess) {                                                                                       \
            fprintf(stderr, "%s:%d NCCL failure '%s': %s\n", __FILE__, __LINE__, ncclGetErrorString(r_),               \
                    ncclGetLastError(NULL));                                                                           \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

typedef struct {
    size_t min_bytes, max_bytes;
    int factor, iters, warmup, check, nranks;
} options;

static size_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'G':
    case 'g':
        v *= 1024.0 * 1024 * 1024;
        break;
    case 'M':
    case 'm':
        v *= 1024.0 * 1024;
        break;
    case 'K':
    case 'k':
        v *= 1024.0;
        break;
    default:
        break;
    }
    return (size_t)v;
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

/* Values whose sum over ranks is exact in float. */
static float value(int rank, size_t i)
{
    return (float)((rank + (int)(i % 7)) % 5);
}

static long long count_wrong(const float *out, size_t count, int n)
{
    long long bad = 0;
    for (size_t k = 0; k < count; k++) {
        float want = 0;
        for (int r = 0; r < n; r++)
            want += value(r, k);
        bad += out[k] != want;
    }
    return bad;
}

/* One size, out of place or in place: average time (us) of the slowest
 * rank, and the wrong elements of a checked run, over all ranks. */
static void run_size(ncclComm_t comm, int rank, int n, const options *o, size_t count, int in_place, float *send,
                     float *recv, double *time_us, long long *wrong)
{
    float *out = in_place ? send : recv;
    for (size_t i = 0; i < count; i++)
        send[i] = value(rank, i);
    for (int i = 0; i < o->warmup; i++)
        NCCLCHECK(ncclAllReduce(send, out, count, ncclFloat, ncclSum, comm, NULL));
    double t0 = now_us();
    for (int i = 0; i < o->iters; i++)
        NCCLCHECK(ncclAllReduce(send, out, count, ncclFloat, ncclSum, comm, NULL));
    double t = (now_us() - t0) / o->iters;
    long long bad = 0;
    if (o->check) {
        /* In place, the timed runs summed sums: start again from the input. */
        for (size_t i = 0; i < count; i++)
            send[i] = value(rank, i);
        NCCLCHECK(ncclAllReduce(send, out, count, ncclFloat, ncclSum, comm, NULL));
        bad = count_wrong(out, count, n);
    }
    NCCLCHECK(ncclAllReduce(&t, time_us, 1, ncclFloat64, ncclMax, comm, NULL));
    NCCLCHECK(ncclAllReduce(&bad, wrong, 1, ncclInt64, ncclSum, comm, NULL));
}

static int rank_main(int rank, const options *o, ncclUniqueId id)
{
    int n = o->nranks;
    ncclComm_t comm;
    NCCLCHECK(ncclCommInitRank(&comm, n, id, rank));
    size_t max_count = o->max_bytes / sizeof(float);
    float *send, *recv;
    NCCLCHECK(ncclMemAlloc((void **)&send, max_count * sizeof(float) + 64));
    NCCLCHECK(ncclMemAlloc((void **)&recv, max_count * sizeof(float) + 64));
    if (rank == 0) {
        int version;
        NCCLCHECK(ncclGetVersion(&version));
        printf("# nThread 1 nGpus 0 minBytes %zu maxBytes %zu step: %d(factor) warmup iters: %d iters: %d "
               "validation: %d\n#\n# Using %d ranks, NCCL version code %d\n#\n",
               o->min_bytes, o->max_bytes, o->factor, o->warmup, o->iters, o->check, n, version);
        printf("#                                                out-of-place                       in-place\n");
        printf("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   "
               "algbw   busbw #wrong\n");
        printf("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  "
               "(GB/s)  (GB/s)\n");
    }
    long long total_wrong = 0;
    double bw_sum = 0;
    int sizes = 0;
    for (size_t bytes = o->min_bytes; bytes <= o->max_bytes; bytes *= (size_t)o->factor) {
        size_t count = bytes / sizeof(float);
        double t[2];
        long long w[2] = {0, 0};
        for (int ip = 0; ip < 2; ip++)
            run_size(comm, rank, n, o, count, ip, send, recv, &t[ip], &w[ip]);
        double algbw[2], busbw[2];
        for (int ip = 0; ip < 2; ip++) {
            algbw[ip] = t[ip] > 0 ? (double)(count * sizeof(float)) / t[ip] / 1e3 : 0;
            busbw[ip] = algbw[ip] * (n > 1 ? 2.0 * (n - 1) / n : 1.0);
        }
        if (rank == 0)
            printf("%12zu  %12zu     float     sum      -1  %7.1f  %6.2f  %6.2f  %5lld  %7.1f  %6.2f  %6.2f  %5lld\n",
                   count * sizeof(float), count, t[0], algbw[0], busbw[0], w[0], t[1], algbw[1], busbw[1], w[1]);
        total_wrong += w[0] + w[1];
        bw_sum += busbw[1];
        sizes++;
        if (o->factor < 2)
            break;
    }
    if (rank == 0)
        printf("# Out of bounds values : %lld %s\n# Avg bus bandwidth    : %g\n#\n", total_wrong,
               total_wrong ? "FAILED" : "OK", sizes ? bw_sum / sizes : 0);
    NCCLCHECK(ncclMemFree(send));
    NCCLCHECK(ncclMemFree(recv));
    NCCLCHECK(ncclCommDestroy(comm));
    return total_wrong ? 1 : 0;
}

int main(int argc, char **argv)
{
    options o = {.min_bytes = 8, .max_bytes = 8u << 20, .factor = 2, .iters = 20, .warmup = 5, .check = 1, .nranks = 2};
    int c;
    while ((c = getopt(argc, argv, "b:e:f:n:w:c:N:")) != -1) {
        switch (c) {
        case 'b':
            o.min_bytes = parse_size(optarg);
            break;
        case 'e':
            o.max_bytes = parse_size(optarg);
            break;
        case 'f':
            o.factor = atoi(optarg);
            break;
        case 'n':
            o.iters = atoi(optarg);
            break;
        case 'w':
            o.warmup = atoi(optarg);
            break;
        case 'c':
            o.check = atoi(optarg);
            break;
        case 'N':
            o.nranks = atoi(optarg);
            break;
        default:
            fprintf(stderr, "usage: %s [-b min] [-e max] [-f factor] [-n iters] [-w warmup] [-c check] [-N ranks]\n",
                    argv[0]);
            return 2;
        }
    }
    if (o.nranks < 1 || o.nranks > 64 || o.min_bytes < sizeof(float) || o.max_bytes < o.min_bytes || o.iters < 1) {
        fprintf(stderr, "invalid options\n");
        return 2;
    }
    ncclUniqueId id;
    NCCLCHECK(ncclGetUniqueId(&id));
    pid_t pids[64];
    for (int r = 0; r < o.nranks; r++) {
        fflush(NULL);
        if ((pids[r] = fork()) == 0) {
            int rc = rank_main(r, &o, id);
            fflush(NULL); /* _exit does not flush stdio */
            _exit(rc);
        }
    }
    int failed = 0;
    for (int r = 0; r < o.nranks; r++) {
        int status;
        waitpid(pids[r], &status, 0);
        failed |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    }
    return failed;
}
