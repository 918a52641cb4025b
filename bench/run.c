/* One rank of braid-bench: its buffers (host, or CUDA device memory), the
 * outputs rank 0 owns, the device list, and the loops over types, ops and
 * roots around measure.c's sweep. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"

const char *bench_error_text(braid_status st)
{
    const char *text = braid_last_error();
    return text[0] ? text : braid_status_string(st);
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
static void memory_and_transport(const bench_ctx *c, bench_rank_info *info)
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
static int gather_info(bench_ctx *c, bench_rank_info **out)
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
        return bench_fail(c, "host info all-reduce", st);
    }
    *out = infos;
    return 0;
}

/* Every (type, op, root) of the run, in nccl-tests' order. */
static int run_tests(bench_ctx *c, bench_report *rep)
{
    const bench_opts *o = c->o;
    unsigned flags = c->info->flags;
    if ((flags & BENCH_POWER_OF_TWO) && (c->nranks & (c->nranks - 1))) {
        if (c->rank == 0)
            printf("nRanks %d is not a power of 2, skipping\n", c->nranks);
        return 0;
    }
    int nops = flags & BENCH_TAKES_OP ? o->nops : 1;
    int first_root = -1, last_root = -1;
    if (flags & BENCH_TAKES_ROOT) {
        first_root = o->root == BENCH_ROOT_ALL ? 0 : o->root;
        last_root = o->root == BENCH_ROOT_ALL ? c->nranks - 1 : o->root;
    }
    for (int t = 0; t < o->ntypes; t++) {
        for (int k = 0; k < nops; k++) {
            for (int r = first_root; r <= last_root; r++) {
                c->dtype = o->types[t];
                c->op = flags & BENCH_TAKES_OP ? o->ops[k] : BRAID_SUM;
                /* hypercube_perf names no op at all */
                c->opname = flags & BENCH_TAKES_OP ? bench_op_name(c->op)
                                                   : (c->info->id == BENCH_HYPERCUBE ? "" : "none");
                c->root = r;
                if (bench_time_test(c, rep))
                    return -1;
            }
        }
    }
    return 0;
}

/* Rank 0's outputs: the csv (a temporary one for --plot alone). 0, or -1
 * with the reason printed. */
static int open_outputs(bench_opts *local, bench_report *rep, char *tmp_csv, size_t len)
{
    if (local->plot_path && !local->csv_path) {
        const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
        snprintf(tmp_csv, len, "%s/braid-bench-XXXXXX", dir);
        int fd = mkstemp(tmp_csv);
        if (fd < 0) {
            fprintf(stderr, "braid-bench: cannot create a temporary csv in %s\n", dir);
            tmp_csv[0] = '\0';
            return -1;
        }
        close(fd);
        local->csv_path = tmp_csv;
    }
    if (local->plot_path && bench_plot_available() != 0)
        return -1;
    return bench_report_open(rep, local) || bench_json_open(local) ? -1 : 0;
}

/* Device buffers by default where a GPU is usable, as nccl-tests (which
 * has no other kind); --buffers forces either. 0, or -1 with the reason. */
static int use_device(bench_ctx *c, bench_opts *local, size_t cap, void **dsend, void **drecv)
{
    const bench_opts *o = c->o;
    if (!(o->buffers == BENCH_BUF_DEVICE || (o->buffers == BENCH_BUF_AUTO && BENCH_BRAID_CUDA)))
        return 0;
    int dev = -1;
    char name[128] = "";
    if (bench_device_init(braid_pg_local_rank(c->pg), &dev, name, sizeof(name)) != 0) {
        if (o->buffers != BENCH_BUF_DEVICE)
            return 0;
        fprintf(stderr, "braid-bench: rank %d: --buffers device needs a CUDA device: %s\n", c->rank,
                bench_device_error());
        return -1;
    }
    if (!(*dsend = bench_device_alloc(cap)) || !(*drecv = bench_device_alloc(cap))) {
        fprintf(stderr, "braid-bench: rank %d: device buffers: %s\n", c->rank, bench_device_error());
        return -1;
    }
    local->gpu = 1;
    if (getenv("BRAID_BENCH_VERBOSE"))
        fprintf(stderr, "braid-bench: rank %d: CUDA device %d (%s)\n", c->rank, dev, name);
    return 0;
}

int bench_run(braid_pg *pg, const bench_opts *opts)
{
    bench_opts local = *opts;
    bench_ctx c = {.pg = pg, .o = &local, .rank = braid_pg_rank(pg), .nranks = braid_pg_size(pg),
                   .info = bench_coll_get(opts->coll)};
    bench_report rep;
    bench_rank_info *infos = NULL;
    char tmp_csv[4096] = "";
    void *hsend = NULL, *hrecv = NULL, *dsend = NULL, *drecv = NULL;
    int32_t setup_failed = 0;
    int rc = BENCH_EXIT_USAGE;
    bench_memory mem = {0};

    if ((c.info->flags & BENCH_TAKES_ROOT) && opts->root >= c.nranks) {
        if (c.rank == 0)
            fprintf(stderr, "braid-bench: root %d is not a rank of this %d-rank group\n", opts->root, c.nranks);
        return BENCH_EXIT_USAGE;
    }
    if (opts->coll == BENCH_ALLTOALLV && bench_alltoallv_check(c.nranks, opts->min_bytes, opts->max_bytes) != 0)
        return BENCH_EXIT_USAGE;
    bench_memory_start(&mem);
    /* -e bytes for any collective's buffers, -u elements of the widest type
     * in front (nccl-tests pads the same way), and room for one element. */
    size_t pad = 8 * (size_t)opts->unalign, cap = opts->max_bytes + pad + 8;
    if (posix_memalign(&hsend, 4096, cap) || posix_memalign(&hrecv, 4096, cap)) {
        fprintf(stderr, "braid-bench: rank %d: cannot allocate 2 x %zu bytes\n", c.rank, cap);
        setup_failed = 1;
    } else {
        /* Fault every page in now, not inside the first timed loop. */
        memset(hsend, 0, cap);
        memset(hrecv, 0, cap);
        if (use_device(&c, &local, cap, &dsend, &drecv) != 0)
            setup_failed = 1;
    }
    bench_memory_buffers(&mem, 2 * cap);

    /* Rank 0 owns the outputs; a problem there must stop every rank, so
     * the verdict is shared with a MAX all-reduce before any timing. */
    memset(&rep, 0, sizeof(rep));
    if (c.rank == 0 && !setup_failed && open_outputs(&local, &rep, tmp_csv, sizeof(tmp_csv)) != 0)
        setup_failed = 1;
    if (bench_reduce_scalar(&c, &setup_failed, BRAID_I32, BRAID_MAX, "setup all-reduce") || setup_failed)
        goto out_free;
    rc = BENCH_EXIT_FAILED; /* from here on a failure is a failed collective */
    if (gather_info(&c, &infos))
        goto out_free;
    if (c.rank == 0)
        bench_report_header(&local, infos, c.nranks);
    free(infos);

    /* -u: every buffer starts that many elements past its alignment; the
     * widest element's worth keeps the offsets valid for every type. */
    c.hsend = (char *)hsend + pad;
    c.hrecv = (char *)hrecv + pad;
    c.send = local.gpu ? (char *)dsend + pad : c.hsend;
    c.recv = local.gpu ? (char *)drecv + pad : c.hrecv;
    if (run_tests(&c, &rep))
        goto out_free;
    rc = c.wrong_total ? BENCH_EXIT_WRONG : BENCH_EXIT_OK;
    bench_memory_end(&mem);
    if (c.rank == 0) {
        if (bench_report_close(&rep, &local, local.memory_report ? &mem : NULL) != 0 && rc == BENCH_EXIT_OK)
            rc = BENCH_EXIT_WRONG;
        if (opts->plot_path) {
            const char *csv = local.csv_path;
            if (bench_plot(opts->plot_path, &csv, 1) != 0 && rc == BENCH_EXIT_OK)
                rc = BENCH_EXIT_USAGE;
        }
    }
out_free:
    bench_json_abandon(); /* closed already unless the run failed */
    if (rep.csv)
        fclose(rep.csv); /* still open only when the run failed */
    if (tmp_csv[0])
        unlink(tmp_csv);
    if (dsend)
        bench_device_free(dsend);
    if (drecv)
        bench_device_free(drecv);
    free(hsend);
    free(hrecv);
    return rc;
}
