/* The measurement loop of braid-bench, run by every rank of a group.
 *
 * It follows nccl-tests' TimeTest/BenchTime: warm up at the largest and the
 * smallest size, then for every size one untimed call, a barrier, -n timed
 * calls, and (with -c 1) one more call on fresh verifiable data that is
 * checked. The reported time is the slowest rank's mean, taken with a MAX
 * all-reduce, so one straggler cannot hide behind fast peers (-a 3, the
 * default; -a 0, 1, 2 report rank 0's, the mean or the min). Everything
 * goes through the public API, including the barrier and the gathers. */
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

typedef struct {
    braid_pg *pg;
    const bench_opts *o;
    int rank, nranks;
    void *send, *recv;    /* what the collectives get: device memory with -g 1 */
    void *hsend, *hrecv;  /* -g 1: host mirrors for filling and checking */
    uint32_t seed;        /* verification round, varies the data */
    long long wrong_total;
} run_ctx;

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

const char *bench_error_text(braid_status st)
{
    const char *text = braid_last_error();
    return text[0] ? text : braid_status_string(st);
}

static int fail(const run_ctx *c, const char *what, braid_status st)
{
    fprintf(stderr, "braid-bench: rank %d/%d: %s failed: %s\n", c->rank, c->nranks, what, bench_error_text(st));
    return -1;
}

/* Small helpers on one element, used for barriers and result exchange. */
static int reduce_scalar(run_ctx *c, void *val, braid_dtype dtype, braid_op op, const char *why)
{
    braid_status st = braid_allreduce(c->pg, val, val, 1, dtype, op, NULL, NULL);
    return st == BRAID_OK ? 0 : fail(c, why, st);
}

static int barrier(run_ctx *c)
{
    int32_t one = 1;
    return reduce_scalar(c, &one, BRAID_I32, BRAID_SUM, "barrier all-reduce");
}

/* Buffer a rank passes to the collective. Broadcast has a single buffer:
 * out of place, the root sends from its send buffer and everyone else
 * receives into the receive buffer, which is ncclBroadcast's data flow. */
static void coll_buffers(const run_ctx *c, int in_place, const void **send, void **recv)
{
    if (c->o->coll == BENCH_ALLREDUCE) {
        *recv = c->recv;
        *send = in_place ? c->recv : c->send;
    } else {
        *recv = (!in_place && c->rank == c->o->root) ? c->send : c->recv;
        *send = *recv;
    }
}

/* Issue one collective; work NULL blocks until it is done. */
static int coll_issue(run_ctx *c, size_t count, braid_dtype dtype, braid_op op, int in_place, braid_work **work)
{
    const void *send;
    void *recv;
    braid_status st;
    coll_buffers(c, in_place, &send, &recv);
    if (c->o->coll == BENCH_ALLREDUCE && op == BRAID_MULSUM) {
        unsigned char scalar[8];
        bench_encode(dtype, bench_premul_scalar(c->rank), scalar);
        st = braid_allreduce_mulsum(c->pg, send, recv, count, dtype, scalar, NULL, work);
    } else if (c->o->coll == BENCH_ALLREDUCE)
        st = braid_allreduce(c->pg, send, recv, count, dtype, op, NULL, work);
    else
        st = braid_broadcast(c->pg, recv, count, dtype, c->o->root, NULL, work);
    if (st != BRAID_OK) {
        char what[160];
        if (c->o->coll == BENCH_ALLREDUCE)
            snprintf(what, sizeof(what), "allreduce of %zu %s elements (%s, %s)", count, bench_type_name(dtype),
                     bench_op_name(op), in_place ? "in place" : "out of place");
        else
            snprintf(what, sizeof(what), "broadcast of %zu %s elements (root %d, %s)", count,
                     bench_type_name(dtype), c->o->root, in_place ? "in place" : "out of place");
        return fail(c, what, st);
    }
    return 0;
}

static int coll_once(run_ctx *c, size_t count, braid_dtype dtype, braid_op op, int in_place)
{
    return coll_issue(c, count, dtype, op, in_place, NULL);
}

/* One iteration of the timed loop: -m collectives, as one braid group
 * when more than one (nccl-tests' ncclGroupStart/End around -m calls).
 * With -z 0 it returns a work handle to wait on later; with -z 1 it has
 * waited already. */
static int iteration(run_ctx *c, size_t count, braid_dtype dtype, braid_op op, int in_place, braid_work **work)
{
    const bench_opts *o = c->o;
    braid_work **w = o->blocking ? NULL : work;
    if (o->agg_iters == 1)
        return coll_issue(c, count, dtype, op, in_place, w);
    braid_status st = braid_group_start(c->pg);
    if (st != BRAID_OK)
        return fail(c, "group start", st);
    for (int a = 0; a < o->agg_iters; a++) {
        if (coll_issue(c, count, dtype, op, in_place, NULL)) {
            (void)braid_group_end(c->pg, NULL);
            return -1;
        }
    }
    st = braid_group_end(c->pg, w);
    return st == BRAID_OK ? 0 : fail(c, "group end", st);
}

/* Calls of an -z 0 loop in flight at once. */
#define ISSUE_WINDOW 64

/* Wait for and free the handles of an -z 0 loop; all of them, also after
 * a failure. */
static int wait_all(run_ctx *c, braid_work **works, int n)
{
    int rc = 0;
    for (int i = 0; i < n; i++) {
        if (!works[i])
            continue;
        braid_status st = braid_wait(works[i], -1);
        if (st != BRAID_OK && rc == 0)
            rc = fail(c, "wait", st);
        braid_work_free(works[i]);
        works[i] = NULL;
    }
    return rc;
}

/* Host memory standing for buf (one of c->send, c->recv): itself, or its
 * mirror with -g 1. */
static void *host_of(const run_ctx *c, const void *buf)
{
    if (!c->o->gpu)
        return (void *)buf;
    return buf == c->send ? c->hsend : c->hrecv;
}

/* With -g 1, copy the host mirror of buf to the device. */
static int upload(const run_ctx *c, void *buf, size_t bytes)
{
    if (!c->o->gpu || bench_device_put(buf, host_of(c, buf), bytes) == 0)
        return 0;
    fprintf(stderr, "braid-bench: rank %d: %s\n", c->rank, bench_device_error());
    return -1;
}

/* Fill the buffers a collective reads with the pattern's input and the
 * buffers it must write with junk. */
static int fill(run_ctx *c, const bench_pattern *pat, size_t count, braid_dtype dtype, int in_place)
{
    const void *send;
    void *recv;
    size_t bytes = count * braid_dtype_size(dtype);
    if (c->o->coll == BENCH_ALLREDUCE) {
        if (in_place) {
            bench_pattern_fill_input(pat, host_of(c, c->recv), count);
            return upload(c, c->recv, bytes);
        }
        bench_pattern_fill_input(pat, host_of(c, c->send), count);
        bench_pattern_fill_junk(pat, host_of(c, c->recv), count);
        return upload(c, c->send, bytes) || upload(c, c->recv, bytes) ? -1 : 0;
    }
    coll_buffers(c, in_place, &send, &recv);
    if (c->rank == c->o->root)
        bench_pattern_fill_input(pat, host_of(c, recv), count);
    else
        bench_pattern_fill_junk(pat, host_of(c, recv), count);
    return upload(c, recv, bytes);
}

static int verify(run_ctx *c, size_t count, braid_dtype dtype, braid_op op, int in_place, long long *wrong)
{
    bench_pattern *pat;
    const void *send;
    void *recv;
    c->seed++;
    if (bench_pattern_create(&pat, c->o->coll, dtype, op, c->rank, c->nranks, c->o->root, c->seed) != 0) {
        fprintf(stderr, "braid-bench: rank %d: out of memory building check data\n", c->rank);
        return -1;
    }
    int rc = fill(c, pat, count, dtype, in_place);
    if (rc == 0)
        rc = coll_once(c, count, dtype, op, in_place);
    if (rc == 0) {
        coll_buffers(c, in_place, &send, &recv);
        if (c->o->gpu && bench_device_get(host_of(c, recv), recv, count * braid_dtype_size(dtype)) != 0) {
            fprintf(stderr, "braid-bench: rank %d: %s\n", c->rank, bench_device_error());
            bench_pattern_destroy(pat);
            return -1;
        }
        long long w = bench_pattern_check(pat, host_of(c, recv), count);
        int64_t total = w;
        rc = reduce_scalar(c, &total, BRAID_I64, BRAID_SUM, "#wrong all-reduce");
        *wrong = total;
        if (w && c->o->coll == BENCH_ALLREDUCE)
            fprintf(stderr, "braid-bench: rank %d: allreduce of %zu %s elements (%s, %s): %lld wrong\n", c->rank,
                    count, bench_type_name(dtype), bench_op_name(op), in_place ? "in place" : "out of place", w);
        else if (w)
            fprintf(stderr, "braid-bench: rank %d: broadcast of %zu %s elements (root %d, %s): %lld wrong\n",
                    c->rank, count, bench_type_name(dtype), c->o->root, in_place ? "in place" : "out of place", w);
    }
    bench_pattern_destroy(pat);
    return rc;
}

static int bench_time(run_ctx *c, size_t count, braid_dtype dtype, braid_op op, int in_place, bench_result *res)
{
    const bench_opts *o = c->o;
    bench_pattern *pat;
    /* Defined values for the timed loop too (junk from a previous size
     * could be NaN or denormal, which would time the FPU, not braid). */
    if (bench_pattern_create(&pat, o->coll, dtype, op, c->rank, c->nranks, o->root, 0) != 0) {
        fprintf(stderr, "braid-bench: rank %d: out of memory building input data\n", c->rank);
        return -1;
    }
    int filled = fill(c, pat, count, dtype, in_place);
    bench_pattern_destroy(pat);
    if (filled)
        return -1;

    if (coll_once(c, count, dtype, op, in_place) || barrier(c))
        return -1;
    /* -z 0 keeps at most ISSUE_WINDOW calls in flight: issuing handle i
     * first waits for handle i - ISSUE_WINDOW. That bounds memory for any
     * -n, and a failed group stops the loop at the next wait (within the
     * timeout) instead of issuing every remaining iteration. */
    braid_work *works[ISSUE_WINDOW] = {0};
    double cpu0 = cpu_s(), t0 = now_s(), t_issued;
    int rc = 0;
    for (int i = 0; i < o->iters && rc == 0; i++) {
        braid_work **slot = o->blocking ? NULL : &works[i % ISSUE_WINDOW];
        if (slot && *slot)
            rc = wait_all(c, slot, 1);
        if (rc == 0)
            rc = iteration(c, count, dtype, op, in_place, slot);
    }
    t_issued = now_s();
    rc |= wait_all(c, works, ISSUE_WINDOW);
    if (rc)
        return -1;
    /* nccl-tests divides by iters x agg_iters: the time per collective.
     * -C reports the time to issue them instead of to complete them. */
    double dt = ((o->report_cputime ? t_issued : now_s()) - t0) / o->iters / o->agg_iters;
    /* CPU cost per call of the whole group: the sum over ranks. */
    double cpu = (cpu_s() - cpu0) / o->iters / o->agg_iters;
    if (reduce_scalar(c, &cpu, BRAID_F64, BRAID_SUM, "cpu time all-reduce"))
        return -1;
    res->cpu_us = cpu * 1e6;
    /* nccl-tests' -a: 0 reports rank 0's own time (the only one printed). */
    static const braid_op time_ops[] = {BRAID_SUM, BRAID_AVG, BRAID_MIN, BRAID_MAX};
    if (o->average != 0 && reduce_scalar(c, &dt, BRAID_F64, time_ops[o->average], "time all-reduce"))
        return -1;

    double bytes = (double)count * (double)braid_dtype_size(dtype);
    res->time_us = dt * 1e6;
    res->algbw = dt > 0 ? bytes / 1e9 / dt : 0.0;
    /* nccl-tests' bus bandwidth: what each rank's link carries. */
    res->busbw = o->coll == BENCH_ALLREDUCE ? res->algbw * 2.0 * (c->nranks - 1) / c->nranks : res->algbw;
    res->wrong = -1;
    /* -c N: up to N verifications with fresh data, stopping at the first
     * with wrong elements, as nccl-tests does. */
    for (int k = 0; k < o->check; k++) {
        if (verify(c, count, dtype, op, in_place, &res->wrong))
            return -1;
        if (res->wrong)
            break;
    }
    if (o->check)
        c->wrong_total += res->wrong;
    return 0;
}

static int warmup(run_ctx *c, size_t bytes, braid_dtype dtype, braid_op op)
{
    size_t count = bytes / braid_dtype_size(dtype);
    for (int i = 0; i < c->o->warmup_iters; i++) {
        if (coll_once(c, count, dtype, op, 0))
            return -1;
    }
    return 0;
}

/* One sweep over the sizes: a table row each. */
static int sweep(run_ctx *c, bench_report *rep, braid_dtype dtype, braid_op op)
{
    const bench_opts *o = c->o;
    size_t esize = braid_dtype_size(dtype);
    for (size_t size = o->min_bytes; size <= o->max_bytes;) {
        size_t count = size / esize;
        bench_result oop, ip;
        if (bench_time(c, count, dtype, op, 0, &oop) || bench_time(c, count, dtype, op, 1, &ip))
            return -1;
        if (c->rank == 0) {
            int allreduce = o->coll == BENCH_ALLREDUCE;
            bench_report_row(rep, o, c->nranks, count * esize, count, dtype, allreduce ? bench_op_name(op) : "none",
                             allreduce ? -1 : o->root, &oop, &ip);
        }
        size_t next = o->step_factor > 1 ? size * o->step_factor : size + o->step_bytes;
        if (next <= size)
            break; /* overflow, or a zero step at max */
        size = next;
    }
    return 0;
}

static int time_test(run_ctx *c, bench_report *rep, braid_dtype dtype, braid_op op)
{
    const bench_opts *o = c->o;
    if (barrier(c) || warmup(c, o->max_bytes, dtype, op) || warmup(c, o->min_bytes, dtype, op))
        return -1;
    /* -N: sweeps over the sizes; 0 never stops (the count goes negative). */
    long cycles = o->run_cycles;
    do {
        if (sweep(c, rep, dtype, op))
            return -1;
    } while (--cycles != 0);
    return 0;
}

static void host_info(bench_rank_info *info)
{
    memset(info, 0, sizeof(*info));
    info->pid = getpid();
    if (gethostname(info->host, sizeof(info->host) - 1) != 0)
        snprintf(info->host, sizeof(info->host), "?");
    /* Only the first name component, as nccl-tests' getHostName does. */
    info->host[strcspn(info->host, ".")] = '\0';
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[256];
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, "model name", 10) == 0) {
            const char *v = strchr(line, ':');
            if (v) {
                v += strspn(v + 1, " \t") + 1;
                snprintf(info->cpu, sizeof(info->cpu), "%.*s", (int)strcspn(v, "\n"), v);
            }
            break;
        }
    }
    fclose(f);
}

/* Which memory this rank's buffers are in, and the transports it uses to
 * its peers ("shm", "shm+tcp"), in order of first use by peer. */
static void memory_and_transport(const run_ctx *c, bench_rank_info *info)
{
    snprintf(info->memory, sizeof(info->memory), "%s", c->o->gpu ? "device" : "host");
    size_t o = 0;
    for (int p = 0; p < c->nranks; p++) {
        const char *t = braid_pg_peer_transport(c->pg, p);
        if (p == c->rank || !t)
            continue;
        size_t n = strlen(t);
        int seen = 0;
        for (const char *q = info->transport; (q = strstr(q, t)) != NULL; q += n)
            seen |= (q == info->transport || q[-1] == '+') && (q[n] == '\0' || q[n] == '+');
        if (!seen && o + n + 2 < sizeof(info->transport))
            o += (size_t)snprintf(info->transport + o, sizeof(info->transport) - o, "%s%s", o ? "+" : "", t);
    }
    if (o == 0)
        snprintf(info->transport, sizeof(info->transport), "none");
}

/* Gather every rank's host description to all ranks: each rank writes its
 * own slot of a zeroed array and a bytewise MAX merges them. */
static int gather_info(run_ctx *c, bench_rank_info **out)
{
    bench_rank_info *infos = calloc((size_t)c->nranks, sizeof(*infos));
    if (!infos) {
        fprintf(stderr, "braid-bench: rank %d: out of memory\n", c->rank);
        return -1;
    }
    host_info(&infos[c->rank]);
    memory_and_transport(c, &infos[c->rank]);
    braid_status st = braid_allreduce(c->pg, infos, infos, (size_t)c->nranks * sizeof(*infos), BRAID_U8, BRAID_MAX,
                                      NULL, NULL);
    if (st != BRAID_OK) {
        free(infos);
        return fail(c, "host info all-reduce", st);
    }
    *out = infos;
    return 0;
}

int bench_run(braid_pg *pg, const bench_opts *opts)
{
    run_ctx c = {.pg = pg, .o = opts, .rank = braid_pg_rank(pg), .nranks = braid_pg_size(pg)};
    bench_opts local = *opts;
    bench_report rep;
    bench_rank_info *infos = NULL;
    char tmp_csv[4096] = "";
    int32_t setup_failed = 0;
    int rc = BENCH_EXIT_USAGE;

    if (opts->coll == BENCH_BROADCAST && opts->root >= c.nranks) {
        if (c.rank == 0)
            fprintf(stderr, "braid-bench: root %d is not a rank of this %d-rank group\n", opts->root, c.nranks);
        return BENCH_EXIT_USAGE;
    }
    size_t cap = opts->max_bytes + 8; /* room for the widest element */
    if (posix_memalign(&c.hsend, 4096, cap) || posix_memalign(&c.hrecv, 4096, cap)) {
        fprintf(stderr, "braid-bench: rank %d: cannot allocate 2 x %zu bytes\n", c.rank, cap);
        setup_failed = 1;
    } else {
        /* Fault every page in now, not inside the first timed loop. */
        memset(c.hsend, 0, cap);
        memset(c.hrecv, 0, cap);
        c.send = c.hsend;
        c.recv = c.hrecv;
    }
    /* Device buffers by default where a GPU is usable, as nccl-tests
     * (which has no other kind); --buffers forces either. */
    c.o = &local;
    local.gpu = 0;
    int try_device = opts->buffers == BENCH_BUF_DEVICE || (opts->buffers == BENCH_BUF_AUTO && BENCH_BRAID_CUDA);
    if (try_device && !setup_failed) {
        int dev = -1;
        char name[128] = "";
        if (bench_device_init(braid_pg_local_rank(pg), &dev, name, sizeof(name)) != 0) {
            if (opts->buffers == BENCH_BUF_DEVICE) {
                fprintf(stderr, "braid-bench: rank %d: --buffers device needs a CUDA device: %s\n", c.rank,
                        bench_device_error());
                setup_failed = 1;
            }
        } else if (!(c.send = bench_device_alloc(cap)) || !(c.recv = bench_device_alloc(cap))) {
            fprintf(stderr, "braid-bench: rank %d: device buffers: %s\n", c.rank, bench_device_error());
            setup_failed = 1;
        } else {
            local.gpu = 1;
            if (getenv("BRAID_BENCH_VERBOSE"))
                fprintf(stderr, "braid-bench: rank %d: CUDA device %d (%s)\n", c.rank, dev, name);
        }
    }

    /* Rank 0 owns the outputs; a problem there must stop every rank, so
     * the verdict is shared with a MAX all-reduce before any timing. */
    memset(&rep, 0, sizeof(rep));
    if (c.rank == 0 && !setup_failed) {
        if (opts->plot_path && !opts->csv_path) {
            const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
            snprintf(tmp_csv, sizeof(tmp_csv), "%s/braid-bench-XXXXXX", dir);
            int fd = mkstemp(tmp_csv);
            if (fd < 0) {
                fprintf(stderr, "braid-bench: cannot create a temporary csv in %s\n", dir);
                tmp_csv[0] = '\0';
                setup_failed = 1;
            } else {
                close(fd);
                local.csv_path = tmp_csv;
            }
        }
        if (!setup_failed && opts->plot_path && bench_plot_available() != 0)
            setup_failed = 1;
        if (!setup_failed && bench_report_open(&rep, &local) != 0)
            setup_failed = 1;
    }
    if (reduce_scalar(&c, &setup_failed, BRAID_I32, BRAID_MAX, "setup all-reduce") || setup_failed)
        goto out_free;
    rc = BENCH_EXIT_FAILED; /* from here on a failure is a failed collective */
    if (gather_info(&c, &infos))
        goto out_free;
    if (c.rank == 0)
        bench_report_header(&local, infos, c.nranks);
    free(infos);

    for (int t = 0; t < opts->ntypes; t++) {
        for (int k = 0; k < (opts->coll == BENCH_ALLREDUCE ? opts->nops : 1); k++) {
            if (time_test(&c, &rep, opts->types[t], opts->ops[k]))
                goto out_free;
        }
    }
    rc = c.wrong_total ? BENCH_EXIT_WRONG : BENCH_EXIT_OK;
    if (c.rank == 0) {
        bench_report_close(&rep, opts->program);
        if (opts->plot_path) {
            const char *csv = local.csv_path;
            if (bench_plot(opts->plot_path, &csv, 1) != 0 && rc == BENCH_EXIT_OK)
                rc = BENCH_EXIT_USAGE;
        }
    }
out_free:
    if (rep.csv)
        fclose(rep.csv); /* still open only when the run failed */
    if (tmp_csv[0])
        unlink(tmp_csv);
    if (c.send && c.send != c.hsend)
        bench_device_free(c.send);
    if (c.recv && c.recv != c.hrecv)
        bench_device_free(c.recv);
    free(c.hsend);
    free(c.hrecv);
    return rc;
}
