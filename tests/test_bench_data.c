/* braid-bench's checking (bench/data.c, bench/verify.c) against a
 * reference: every collective's data movement is done here in memory, on
 * the pointers braid-bench would pass (in place included), and the check
 * must then find 0 wrong elements; with one output element changed it must
 * find exactly 1 more; and with the call left out (out of place, 2 ranks or
 * more) it must find every checked element wrong. So a check that passed
 * everything, looked at the wrong block or mixed up ranks fails here. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../bench/bench.h"

#define MAXR 5

static int failures;

#define EXPECT(cond, ...)                                                                                              \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                                       \
            fprintf(stderr, __VA_ARGS__);                                                                              \
            fprintf(stderr, "\n");                                                                                     \
            failures++;                                                                                                \
        }                                                                                                              \
    } while (0)

typedef struct {
    const bench_coll_info *info;
    braid_dtype dtype;
    braid_op op;
    int n, root, in_place;
    bench_counts k;
    size_t es;
    unsigned char *sendbuf[MAXR], *recvbuf[MAXR];
    bench_pattern *pat[MAXR];
} sim;

static unsigned char *elem(void *buf, size_t i, size_t es)
{
    return (unsigned char *)buf + i * es;
}

/* The pointers braid-bench passes (measure.c's coll_issue, shift 0). */
static void call_ptrs(const sim *s, int r, unsigned char **send, unsigned char **recv)
{
    *send = s->in_place ? elem(s->recvbuf[r], s->k.send_ip * (size_t)r, s->es) : s->sendbuf[r];
    *recv = elem(s->recvbuf[r], s->in_place ? s->k.recv_ip * (size_t)r : 0, s->es);
}

/* Combine element values of every rank with the op, as braid.h defines it. */
static double combine(const sim *s, const double *v)
{
    double acc = s->op == BRAID_MULSUM ? v[0] * bench_premul_scalar(0) : v[0];
    for (int r = 1; r < s->n; r++) {
        switch (s->op) {
        case BRAID_PROD:
            acc *= v[r];
            break;
        case BRAID_MIN:
            acc = v[r] < acc ? v[r] : acc;
            break;
        case BRAID_MAX:
            acc = v[r] > acc ? v[r] : acc;
            break;
        case BRAID_MULSUM:
            acc += v[r] * bench_premul_scalar(r);
            break;
        default:
            acc += v[r];
        }
    }
    if (s->op == BRAID_AVG)
        acc = bench_type_is_float(s->dtype) ? acc / s->n : trunc(acc / s->n);
    return acc;
}

/* Reduce elements [from, from + count) of every rank's input into dst. */
static void reduce_into(const sim *s, unsigned char *const in[], size_t from, size_t count, unsigned char *dst)
{
    double v[MAXR];
    for (size_t i = 0; i < count; i++) {
        for (int r = 0; r < s->n; r++)
            v[r] = bench_decode(s->dtype, elem(in[r], from + i, s->es));
        bench_encode(s->dtype, combine(s, v), elem(dst, i, s->es));
    }
}

/* The collective, done in memory: every input is copied before any output
 * is written, so in place works as on real ranks. */
static void run_reference(sim *s)
{
    size_t es = s->es, b = s->k.param, n = (size_t)s->n;
    unsigned char *snap[MAXR], *send[MAXR], *recv[MAXR];
    for (int r = 0; r < s->n; r++) {
        call_ptrs(s, r, &send[r], &recv[r]);
        snap[r] = malloc(s->k.send * es + 1);
        memcpy(snap[r], send[r], s->k.send * es);
    }
    for (int r = 0; r < s->n; r++) {
        int prev = (r + s->n - 1) % s->n;
        switch (s->info->id) {
        case BENCH_ALLREDUCE:
            reduce_into(s, snap, 0, b, recv[r]);
            break;
        case BENCH_REDUCE:
            if (r == s->root)
                reduce_into(s, snap, 0, b, recv[r]);
            break;
        case BENCH_REDUCE_SCATTER:
            reduce_into(s, snap, (size_t)r * b, b, recv[r]);
            break;
        case BENCH_BROADCAST:
            /* The root's buffer is its send buffer (or recv in place). */
            if (r != s->root)
                memcpy(recv[r], snap[s->root], b * es);
            break;
        case BENCH_ALLGATHER:
        case BENCH_HYPERCUBE:
        case BENCH_GATHER:
            if (s->info->id != BENCH_GATHER || r == s->root)
                for (size_t p = 0; p < n; p++)
                    memcpy(elem(recv[r], p * b, es), snap[p], b * es);
            break;
        case BENCH_SCATTER:
            memcpy(recv[r], elem(snap[s->root], (size_t)r * b, es), b * es);
            break;
        case BENCH_ALLTOALL:
            for (size_t p = 0; p < n; p++)
                memcpy(elem(recv[r], p * b, es), elem(snap[p], (size_t)r * b, es), b * es);
            break;
        case BENCH_ALLTOALLV: {
            size_t total = b * n * es, got = 0;
            for (int p = 0; p < s->n; p++) {
                size_t from = 0;
                for (int q = 0; q < r; q++)
                    from += bench_alltoallv_bytes(p, q, s->n, total) / es;
                size_t cnt = bench_alltoallv_bytes(p, r, s->n, total) / es;
                memcpy(elem(recv[r], got, es), elem(snap[p], from, es), cnt * es);
                got += cnt;
            }
            break;
        }
        case BENCH_SENDRECV:
            memcpy(recv[r], snap[prev], b * es);
            break;
        }
    }
    for (int r = 0; r < s->n; r++)
        free(snap[r]);
}

static long long check_all(sim *s, int *unchecked)
{
    long long wrong = 0;
    *unchecked = 0;
    for (int r = 0; r < s->n; r++) {
        bench_layout l = {.coll = s->info->id, .k = s->k, .rank = r, .nranks = s->n, .root = s->root,
                          .in_place = s->in_place, .dtype = s->dtype};
        long long w = bench_data_check(&l, s->pat[r], s->sendbuf[r], s->recvbuf[r]);
        if (w < 0)
            *unchecked = 1;
        else
            wrong += w;
    }
    return wrong;
}

static void fill_all(sim *s)
{
    for (int r = 0; r < s->n; r++) {
        bench_layout l = {.coll = s->info->id, .k = s->k, .rank = r, .nranks = s->n, .root = s->root,
                          .in_place = s->in_place, .dtype = s->dtype};
        bench_data_fill(&l, s->pat[r], s->sendbuf[r], s->recvbuf[r]);
    }
}

/* The element one rank's check looks at first: a rank that checks, and the
 * first element of its result. */
static unsigned char *first_checked(sim *s)
{
    int r = s->info->flags & BENCH_TAKES_ROOT ? s->root : s->n - 1;
    unsigned char *send, *recv;
    call_ptrs(s, r, &send, &recv);
    if (s->info->id == BENCH_BROADCAST && r == s->root)
        return s->in_place ? recv : send;
    return recv;
}

static void one_case(const bench_coll_info *info, braid_dtype dtype, braid_op op, int n, int root, int in_place,
                     size_t bytes)
{
    sim s = {.info = info, .dtype = dtype, .op = op, .n = n, .root = root, .in_place = in_place};
    s.es = braid_dtype_size(dtype);
    info->counts(bytes / s.es, s.es, n, &s.k);
    size_t cap = bytes + 64;
    char what[160];
    snprintf(what, sizeof(what), "%s %s %s n=%d root=%d %s %zu B", info->name, bench_type_name(dtype),
             bench_op_name(op), n, root, in_place ? "in place" : "out of place", bytes);
    for (int r = 0; r < n; r++) {
        s.sendbuf[r] = calloc(1, cap);
        s.recvbuf[r] = calloc(1, cap);
        if (bench_pattern_create(&s.pat[r], (info->flags & BENCH_TAKES_OP) != 0, dtype, op, r, n, 7) != 0) {
            EXPECT(0, "%s: pattern", what);
            return;
        }
    }
    int unchecked;
    /* Left out: every checked element still holds junk (out of place). */
    fill_all(&s);
    long long idle = check_all(&s, &unchecked);
    if (!in_place && n >= 2 && s.k.param > 0)
        EXPECT(idle > 0, "%s: a call that wrote nothing passed the check", what);
    /* Done right: nothing wrong, unless nccl-tests checks nothing there. */
    fill_all(&s);
    run_reference(&s);
    long long wrong = check_all(&s, &unchecked);
    EXPECT(wrong == 0, "%s: %lld wrong after a correct call", what, wrong);
    EXPECT(unchecked == (in_place && (info->flags & BENCH_IN_PLACE_UNCHECKED) != 0), "%s: unchecked=%d", what,
           unchecked);
    /* One element changed: exactly one more. */
    if (!unchecked && s.k.param > 0) {
        unsigned char *e = first_checked(&s);
        double v = bench_decode(dtype, e);
        bench_encode(dtype, v == 3 ? 5 : 3, e);
        long long now = check_all(&s, &unchecked);
        EXPECT(now == 1, "%s: one changed element counted as %lld", what, now);
    }
    for (int r = 0; r < n; r++) {
        free(s.sendbuf[r]);
        free(s.recvbuf[r]);
        bench_pattern_destroy(s.pat[r]);
    }
}

int main(void)
{
    static const bench_coll all[] = {BENCH_ALLREDUCE, BENCH_BROADCAST, BENCH_REDUCE,   BENCH_ALLGATHER,
                                     BENCH_REDUCE_SCATTER, BENCH_ALLTOALL, BENCH_ALLTOALLV, BENCH_SENDRECV,
                                     BENCH_GATHER,    BENCH_SCATTER,   BENCH_HYPERCUBE};
    static const braid_dtype types[] = {BRAID_F32, BRAID_BF16, BRAID_I8, BRAID_U64, BRAID_F16};
    static const braid_op ops[] = {BRAID_SUM, BRAID_PROD, BRAID_MIN, BRAID_MAX, BRAID_AVG, BRAID_MULSUM};
    static const size_t sizes[] = {0, 96, 4096 + 48, 70000};
    int cases = 0;
    if (bench_alltoallv_setup() != 0)
        return 1;
    for (size_t c = 0; c < sizeof(all) / sizeof(all[0]); c++) {
        const bench_coll_info *info = bench_coll_get(all[c]);
        EXPECT(info->id == all[c], "no table entry for collective %d", (int)all[c]);
        for (int n = 1; n <= MAXR; n++) {
            if ((info->flags & BENCH_POWER_OF_TWO) && (n & (n - 1)))
                continue;
            int nroots = info->flags & BENCH_TAKES_ROOT ? n : 1;
            int nops = info->flags & BENCH_TAKES_OP ? (int)(sizeof(ops) / sizeof(ops[0])) : 1;
            for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++)
                for (int o = 0; o < nops; o++)
                    for (int root = 0; root < nroots; root++)
                        for (int ip = 0; ip < 2; ip++)
                            for (size_t z = 0; z < sizeof(sizes) / sizeof(sizes[0]); z++) {
                                one_case(info, types[t], ops[o], n, root, ip, sizes[z]);
                                cases++;
                            }
        }
    }
    /* Every nccl-tests program name finds its collective, and braid-bench's own. */
    static const char *const perf[] = {"all_reduce_perf", "all_gather_perf", "broadcast_perf", "reduce_scatter_perf",
                                       "reduce_perf", "alltoall_perf", "alltoallv_perf", "sendrecv_perf",
                                       "gather_perf", "scatter_perf", "hypercube_perf"};
    for (size_t i = 0; i < sizeof(perf) / sizeof(perf[0]); i++) {
        const bench_coll_info *info = bench_coll_find(perf[i]);
        EXPECT(info && strcmp(info->perf, perf[i]) == 0, "%s is not a known program name", perf[i]);
    }
    EXPECT(bench_coll_find("braid-bench") == NULL, "braid-bench must not name a collective");
    printf("%d cases, %d failures\n", cases, failures);
    return failures ? 1 : 0;
}
