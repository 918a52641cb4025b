/* The measurement loop of braid-bench, run by every rank of a group.
 *
 * It follows nccl-tests' TimeTest/BenchTime (src/common.cu): warm up at
 * every power-of-two size from -b to -e, then for every size one untimed
 * call, a barrier, -n timed iterations of -m calls, and -c checked calls
 * on fresh data. Each iteration's buffers start at a different offset in
 * the -e sized buffers, as nccl-tests' startColl does, so small sizes are
 * not timed from a warm cache. Times are combined over ranks as -a says.
 * Everything goes through the public API, including barriers and the
 * exchange of results. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "bench.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* User + system CPU time of this process: every rank is a process of its
 * own, so this counts the rank and its library threads. */
static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

int bench_fail(const bench_ctx *c, const char *what, braid_status st)
{
    fprintf(stderr, "braid-bench: rank %d/%d: %s failed: %s\n", c->rank, c->nranks, what, bench_error_text(st));
    return -1;
}

int bench_reduce_scalar(bench_ctx *c, void *val, braid_dtype dtype, braid_op op, const char *why)
{
    braid_status st = braid_allreduce(c->pg, val, val, 1, dtype, op, NULL, NULL);
    return st == BRAID_OK ? 0 : bench_fail(c, why, st);
}

static int barrier(bench_ctx *c)
{
    int32_t one = 1;
    return bench_reduce_scalar(c, &one, BRAID_I32, BRAID_SUM, "barrier all-reduce");
}

static size_t esize(const bench_ctx *c)
{
    return braid_dtype_size(c->dtype);
}

/* Elements of the larger of the two buffers of the current size. */
static size_t larger_buffer(const bench_ctx *c)
{
    return c->k.send > c->k.recv ? c->k.send : c->k.recv;
}

/* The counts of a size in bytes (nccl-tests' setupArgs). */
static void set_size(bench_ctx *c, size_t bytes)
{
    c->info->counts(bytes / esize(c), esize(c), c->nranks, &c->k);
}

/* "allreduce of 1024 float elements (sum, in place)": names a call in errors. */
static void describe(const bench_ctx *c, int in_place, char *buf, size_t len)
{
    int n = snprintf(buf, len, "%s of %zu %s elements (", c->info->name, c->k.param, bench_type_name(c->dtype));
    if (c->info->flags & BENCH_TAKES_OP)
        n += snprintf(buf + n, len - (size_t)n, "%s, ", bench_op_name(c->op));
    if (c->root >= 0)
        n += snprintf(buf + n, len - (size_t)n, "root %d, ", c->root);
    snprintf(buf + n, len - (size_t)n, "%s)", in_place ? "in place" : "out of place");
}

/* Issue the iter-th call of the current size; work NULL blocks until done.
 * Its buffers start iter x the call's extent into the -e sized buffers
 * (nccl-tests' shift), wrapping around. */
static int coll_issue(bench_ctx *c, int in_place, long iter, braid_work **work)
{
    size_t es = esize(c), extent = larger_buffer(c) * es;
    size_t steps = extent ? c->o->max_bytes / extent : 1;
    size_t shift = steps ? extent * ((size_t)iter % steps) : 0;
    char *send = (char *)c->send + shift, *recv = (char *)c->recv + shift;
    bench_call call = {.pg = c->pg, .rank = c->rank, .nranks = c->nranks, .coll = c->info->id,
                       .count = c->k.param, .dtype = c->dtype, .op = c->op, .root = c->root};
    call.send = in_place ? recv + c->k.send_ip * (size_t)c->rank * es : send;
    call.recv = recv + (in_place ? c->k.recv_ip * (size_t)c->rank * es : 0);
    braid_status st = bench_coll_issue(&call, work);
    if (st != BRAID_OK) {
        char what[192];
        describe(c, in_place, what, sizeof(what));
        return bench_fail(c, what, st);
    }
    return 0;
}

/* One iteration: -m calls, as one braid group when more than one
 * (nccl-tests' ncclGroupStart/End around -m calls). */
static int iteration(bench_ctx *c, int in_place, long iter, braid_work **work)
{
    int agg = c->o->agg_iters;
    if (agg == 1)
        return coll_issue(c, in_place, iter, work);
    braid_status st = braid_group_start(c->pg);
    if (st != BRAID_OK)
        return bench_fail(c, "group start", st);
    for (int a = 0; a < agg; a++) {
        if (coll_issue(c, in_place, iter * agg + a, NULL)) {
            (void)braid_group_end(c->pg, NULL);
            return -1;
        }
    }
    st = braid_group_end(c->pg, work);
    return st == BRAID_OK ? 0 : bench_fail(c, "group end", st);
}

/* Calls of an -z 0 loop in flight at once: issuing call i first waits for
 * call i - WINDOW. That bounds memory for any -n, and a failed group stops
 * the loop at the next wait (within the timeout). */
#define WINDOW 64

/* Handles in flight, oldest first, and when each was seen complete. */
typedef struct {
    braid_work *works[WINDOW];
    long issued, oldest;
    double *done; /* -I: completion time per iteration, else NULL */
    int rc;
} flight;

static void retire(bench_ctx *c, flight *f, braid_status st)
{
    if (f->done)
        f->done[f->oldest] = now_s();
    if (st != BRAID_OK && f->rc == 0)
        f->rc = bench_fail(c, "wait", st);
    braid_work_free(f->works[f->oldest % WINDOW]);
    f->works[f->oldest % WINDOW] = NULL;
    f->oldest++;
}

/* Wait for the oldest handle (none: a call with nothing to do). */
static void wait_oldest(bench_ctx *c, flight *f)
{
    braid_work *w = f->works[f->oldest % WINDOW];
    retire(c, f, w ? braid_wait(w, -1) : BRAID_OK);
}

/* -I with -z 0: note the handles that completed since the last look, in
 * order (a group's calls complete in order), to time each iteration. */
static void poll_done(bench_ctx *c, flight *f)
{
    while (f->oldest < f->issued) {
        int done = 1;
        braid_work *w = f->works[f->oldest % WINDOW];
        braid_status st = w ? braid_test(w, &done) : BRAID_OK;
        if (st == BRAID_OK && !done)
            return;
        retire(c, f, st);
    }
}

static void wait_all(bench_ctx *c, flight *f)
{
    while (f->oldest < f->issued)
        wait_oldest(c, f);
}

/* Issue one more iteration with a handle, keeping at most WINDOW in flight. */
static int issue_async(bench_ctx *c, flight *f, int in_place, long iter)
{
    if (f->issued - f->oldest == WINDOW)
        wait_oldest(c, f);
    if (f->rc)
        return -1;
    if (iteration(c, in_place, iter, &f->works[f->issued % WINDOW]))
        return -1;
    f->issued++;
    return 0;
}

/* The timed loop (nccl-tests' BenchTime). elapsed: seconds per call;
 * issue: seconds per call to issue them (-C); iter_s (-I): each
 * iteration's seconds per call. */
static int timed_loop(bench_ctx *c, int in_place, double *elapsed, double *issue, double *iter_s)
{
    const bench_opts *o = c->o;
    flight f = {.done = NULL};
    double *start = NULL;
    if (iter_s) {
        f.done = calloc((size_t)o->iters, sizeof(double));
        start = calloc((size_t)o->iters, sizeof(double));
        if (!f.done || !start) {
            fprintf(stderr, "braid-bench: rank %d: out of memory for -I\n", c->rank);
            free(f.done);
            free(start);
            return -1;
        }
    }
    double t0 = now_s(), coll_only = 0;
    for (long i = 0; i < o->iters && f.rc == 0; i++) {
        double ti = now_s();
        if (start)
            start[i] = o->blocking == 3 ? ti : (i ? f.done[i - 1] : t0);
        if (o->blocking == 0) {
            if (issue_async(c, &f, in_place, i))
                break;
            if (f.done)
                poll_done(c, &f);
            continue;
        }
        if (iteration(c, in_place, i, NULL)) {
            f.rc = -1;
            break;
        }
        double te = now_s();
        if (f.done)
            f.done[i] = te;
        coll_only += te - ti;
        /* -z 1 waits at a barrier after each iteration; -z 3 too, and
         * leaves it out of the time; -z 2 does not wait for the others. */
        if ((o->blocking == 1 || o->blocking == 3) && barrier(c))
            f.rc = -1;
    }
    double t_issued = now_s();
    wait_all(c, &f);
    double t_end = now_s();
    int rc = f.rc;
    double calls = (double)o->iters * o->agg_iters;
    *elapsed = (o->blocking == 3 ? coll_only : t_end - t0) / calls;
    *issue = (o->blocking == 3 ? coll_only : t_issued - t0) / calls;
    if (iter_s && rc == 0) {
        for (int i = 0; i < o->iters; i++) {
            /* -z 0: consecutive completions, as nccl-tests' events between
             * iterations; a previous completion seen late (polled between
             * issues) cannot make a time negative. */
            double s = o->blocking == 0 && i ? f.done[i - 1] : start[i];
            double d = f.done[i] - s;
            iter_s[i] = (d > 0 ? d : 0) / o->agg_iters;
        }
    }
    free(f.done);
    free(start);
    return rc;
}

/* With -g 1, copy the host mirror of the buffers to or from the device:
 * the send buffer's elements and, in place or not, the larger extent of
 * the receive buffer. */
static int sync_device(const bench_ctx *c, int to_device)
{
    if (!c->o->gpu)
        return 0;
    size_t es = esize(c), send = c->k.send * es, recv = larger_buffer(c) * es;
    int rc = to_device ? bench_device_put(c->send, c->hsend, send) || bench_device_put(c->recv, c->hrecv, recv)
                       : bench_device_get(c->hsend, c->send, send) || bench_device_get(c->hrecv, c->recv, recv);
    if (rc)
        fprintf(stderr, "braid-bench: rank %d: %s\n", c->rank, bench_device_error());
    return rc ? -1 : 0;
}

static bench_layout layout_of(const bench_ctx *c, int in_place)
{
    return (bench_layout){.coll = c->info->id, .k = c->k, .rank = c->rank, .nranks = c->nranks,
                          .root = c->root, .in_place = in_place, .dtype = c->dtype};
}

/* Fill the buffers for a call on fresh data (seed), through the host. */
static int fill(bench_ctx *c, int in_place, uint32_t seed, bench_pattern **keep)
{
    bench_pattern *pat;
    bench_layout l = layout_of(c, in_place);
    if (bench_pattern_create(&pat, (c->info->flags & BENCH_TAKES_OP) != 0, c->dtype, c->op, c->rank, c->nranks,
                             seed) != 0) {
        fprintf(stderr, "braid-bench: rank %d: out of memory building data\n", c->rank);
        return -1;
    }
    bench_data_fill(&l, pat, c->hsend, c->hrecv);
    int rc = sync_device(c, 1);
    if (keep && rc == 0)
        *keep = pat;
    else
        bench_pattern_destroy(pat);
    return rc;
}

/* One checked call; wrong: elements wrong over all ranks, -1 unchecked. */
static int verify(bench_ctx *c, int in_place, long long *wrong)
{
    bench_pattern *pat = NULL;
    c->seed++;
    if (fill(c, in_place, c->seed, &pat))
        return -1;
    int rc = coll_issue(c, in_place, 0, NULL);
    if (rc == 0)
        rc = sync_device(c, 0);
    if (rc == 0) {
        bench_layout l = layout_of(c, in_place);
        long long w = bench_data_check(&l, pat, c->hsend, c->hrecv);
        if (w > 0) {
            char what[192];
            describe(c, in_place, what, sizeof(what));
            fprintf(stderr, "braid-bench: rank %d: %s: %lld wrong\n", c->rank, what, w);
        }
        /* Unchecked on every rank alike: the sum stays negative. */
        int64_t total = w;
        rc = bench_reduce_scalar(c, &total, BRAID_I64, BRAID_SUM, "#wrong all-reduce");
        *wrong = total < 0 ? -1 : total;
    }
    bench_pattern_destroy(pat);
    return rc;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* -J: every rank's iteration times to rank 0, for its per-process rows. */
static int gather_rows(bench_ctx *c, const double *iter_s, bench_result *res)
{
    size_t iters = (size_t)c->o->iters;
    double *all = c->rank == 0 ? malloc((size_t)c->nranks * iters * sizeof(double)) : NULL;
    if (c->rank == 0 && !all) {
        fprintf(stderr, "braid-bench: rank 0: out of memory for -J's per-process times\n");
        return -1; /* the others then fail in the gather, within the timeout */
    }
    braid_status st = braid_gather(c->pg, iter_s, all, iters, BRAID_F64, 0, NULL, NULL);
    if (st != BRAID_OK) {
        free(all);
        return bench_fail(c, "per-iteration time gather", st);
    }
    for (size_t i = 0; all && i < (size_t)c->nranks * iters; i++)
        all[i] *= 1e6;
    res->proc_us = all;
    res->nprocs = c->nranks;
    return 0;
}

/* -I's columns over the iterations after -K's skip, each iteration the
 * slowest rank's (nccl-tests' computeIterStats on its max over processes);
 * iter_s becomes those times in us, kept for -J. */
static int iter_stats(bench_ctx *c, double *iter_s, bench_result *res)
{
    const bench_opts *o = c->o;
    if (o->json_path && gather_rows(c, iter_s, res))
        return -1;
    braid_status st = braid_allreduce(c->pg, iter_s, iter_s, (size_t)o->iters, BRAID_F64, BRAID_MAX, NULL, NULL);
    if (st != BRAID_OK)
        return bench_fail(c, "per-iteration time all-reduce", st);
    for (int i = 0; i < o->iters; i++)
        iter_s[i] *= 1e6;
    int n = o->iters - o->per_iter_skip;
    double *t = malloc((size_t)n * sizeof(*t)), sum = 0, var = 0;
    if (!t) {
        fprintf(stderr, "braid-bench: rank %d: out of memory for -I\n", c->rank);
        return -1;
    }
    memcpy(t, iter_s + o->per_iter_skip, (size_t)n * sizeof(*t));
    qsort(t, (size_t)n, sizeof(*t), cmp_double);
    for (int i = 0; i < n; i++)
        sum += t[i];
    double avg = sum / n;
    for (int i = 0; i < n; i++)
        var += (t[i] - avg) * (t[i] - avg);
    /* nccl-tests' nearest-rank percentile */
    int p95 = (n * 95 + 99) / 100 - 1, p99 = (n * 99 + 99) / 100 - 1;
    res->i_min = t[0];
    res->i_max = t[n - 1];
    res->i_avg = avg;
    res->i_p50 = t[n / 2];
    res->i_p95 = t[p95 < n - 1 ? p95 : n - 1];
    res->i_p99 = t[p99 < n - 1 ? p99 : n - 1];
    res->i_stdev = sqrt(var / n);
    res->i_cv = avg > 0 ? res->i_stdev / avg * 100.0 : 0.0;
    free(t);
    res->iter_us = iter_s;
    return 0;
}

/* Free what a result owns. */
static void result_free(bench_result *r)
{
    free(r->iter_us);
    free(r->proc_us);
    r->iter_us = r->proc_us = NULL;
}

/* One half of a row: out of place or in place. */
static int bench_time(bench_ctx *c, int in_place, bench_result *res)
{
    const bench_opts *o = c->o;
    /* Defined values for the timed loop too (junk from a previous size
     * could be NaN or denormal, which would time the FPU, not braid). */
    if (fill(c, in_place, 0, NULL) || coll_issue(c, in_place, 0, NULL) || barrier(c))
        return -1;
    double *iter_s = o->per_iter ? calloc((size_t)o->iters, sizeof(double)) : NULL;
    if (o->per_iter && !iter_s) {
        fprintf(stderr, "braid-bench: rank %d: out of memory for -I\n", c->rank);
        return -1;
    }
    double cpu0 = cpu_s(), dt, dt_issue;
    int rc = timed_loop(c, in_place, &dt, &dt_issue, iter_s);
    /* CPU cost per call of the whole group: the sum over ranks. */
    double cpu = (cpu_s() - cpu0) / o->iters / o->agg_iters;
    if (rc == 0)
        rc = bench_reduce_scalar(c, &cpu, BRAID_F64, BRAID_SUM, "cpu time all-reduce");
    if (rc == 0 && iter_s)
        rc = iter_stats(c, iter_s, res);
    if (!res->iter_us)
        free(iter_s); /* else the result owns it */
    if (rc)
        return -1;
    res->cpu_us = cpu * 1e6;
    /* -C reports the time to issue the calls instead of to complete them. */
    double t = o->report_cputime ? dt_issue : dt;
    /* nccl-tests' -a: 0 reports rank 0's own time (the only one printed). */
    static const braid_op time_ops[] = {BRAID_SUM, BRAID_AVG, BRAID_MIN, BRAID_MAX};
    if (o->average != 0 && bench_reduce_scalar(c, &t, BRAID_F64, time_ops[o->average], "time all-reduce"))
        return -1;
    res->time_us = t * 1e6;
    bench_coll_bw(c->info->id, c->k.param, esize(c), t, c->nranks, &res->algbw, &res->busbw);
    res->wrong = -1;
    /* -c N: up to N checks with fresh data, stopping at the first with
     * wrong elements, as nccl-tests does. */
    for (int k = 0; k < o->check; k++) {
        if (verify(c, in_place, &res->wrong))
            return -1;
        if (res->wrong)
            break;
    }
    if (res->wrong > 0)
        c->wrong_total += res->wrong;
    return 0;
}

static size_t next_size(const bench_opts *o, size_t size)
{
    return o->step_factor > 1 ? size * o->step_factor : size + o->step_bytes;
}

/* nccl-tests' warm-up: -w calls at each size from -b doubling to -e. */
static int warmup(bench_ctx *c)
{
    const bench_opts *o = c->o;
    for (size_t size = o->min_bytes; size <= o->max_bytes;) {
        flight f = {.done = NULL};
        int rc = 0;
        set_size(c, size);
        for (long i = 0; i < o->warmup_iters && rc == 0; i++)
            rc = issue_async(c, &f, 0, i);
        wait_all(c, &f);
        if (rc || f.rc)
            return -1;
        size_t next = size ? size * 2 : 1;
        if (next <= size)
            break;
        size = next;
    }
    return 0;
}

/* One sweep over the sizes: a table row each. */
static int sweep(bench_ctx *c, bench_report *rep)
{
    const bench_opts *o = c->o;
    for (size_t size = o->min_bytes; size <= o->max_bytes;) {
        bench_result oop = {0}, ip = {0};
        set_size(c, size);
        int rc = bench_time(c, 0, &oop) || bench_time(c, 1, &ip) ? -1 : 0;
        if (rc == 0 && c->rank == 0) {
            bench_report_row(rep, o, c->nranks, larger_buffer(c) * esize(c), c->k.param, c->dtype, c->opname, c->root, &oop,
                             &ip);
        }
        result_free(&oop);
        result_free(&ip);
        if (rc)
            return -1;
        size_t next = next_size(o, size);
        if (next <= size)
            break; /* overflow, or a zero step at max */
        size = next;
    }
    return 0;
}

int bench_time_test(bench_ctx *c, bench_report *rep)
{
    if (barrier(c) || warmup(c))
        return -1;
    /* -N: sweeps over the sizes; 0 never stops (the count goes negative). */
    long cycles = c->o->run_cycles;
    do {
        if (sweep(c, rep))
            return -1;
    } while (--cycles != 0);
    return 0;
}
