/* Output of braid-bench, on rank 0 only.
 *
 * The table reproduces the output of nccl-tests 2.19 (../shared/third_party)
 * byte for byte (version and start lines, header lines, column widths,
 * numbers narrowed to their columns as its getFloatStr does, "N/A" in
 * #wrong without -c, the footer), because people diff and parse it with
 * the scripts they already have. Only the device
 * lines differ in content: a rank here is a host process, so they name the
 * CPU instead of a GPU. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "bench.h"

/* nccl-tests' TIME_STRING_FORMAT (-S) */
#define TIME_FORMAT "%Y-%m-%d %H:%M:%S"

static const char csv_header[] = "size,count,type,redop,root,oop_time_us,oop_algbw,oop_busbw,oop_wrong,"
                                 "ip_time_us,ip_algbw,ip_busbw,ip_wrong,nranks,label,oop_cpu_us,ip_cpu_us";

void bench_report_label(const bench_opts *opts, int nranks, char *buf, size_t len)
{
    if (opts->label)
        snprintf(buf, len, "%s", opts->label);
    else
        snprintf(buf, len, "braid %s %dr", bench_coll_get(opts->coll)->name, nranks);
}

int bench_report_open(bench_report *rep, const bench_opts *opts)
{
    memset(rep, 0, sizeof(*rep));
    if (!opts->csv_path)
        return 0;
    if (opts->label && strpbrk(opts->label, ",\"\n")) {
        fprintf(stderr, "braid-bench: --label must not contain commas, quotes or newlines\n");
        return -1;
    }
    /* Append, so several runs (rank counts, algorithms, builds) accumulate
     * in one file and plot as separate series by label. */
    FILE *f = fopen(opts->csv_path, "a+");
    if (!f) {
        fprintf(stderr, "braid-bench: cannot open csv file %s: %s\n", opts->csv_path, strerror(errno));
        return -1;
    }
    char first[512] = "";
    rewind(f);
    if (fgets(first, sizeof(first), f)) {
        first[strcspn(first, "\r\n")] = '\0';
        if (strcmp(first, csv_header) != 0) {
            fprintf(stderr, "braid-bench: %s exists and is not a braid-bench csv (first line differs)\n",
                    opts->csv_path);
            fclose(f);
            return -1;
        }
    } else {
        fprintf(f, "%s\n", csv_header);
    }
    fseek(f, 0, SEEK_END);
    rep->csv = f;
    return 0;
}

/* One line: each rank's memory and transport, runs of alike ranks merged:
 * "# braid: ranks 0-3 host memory, shm". */
static void memory_line(const bench_rank_info *infos, int nranks)
{
    printf("# braid:");
    for (int r = 0; r < nranks;) {
        int e = r;
        while (e + 1 < nranks && strcmp(infos[e + 1].memory, infos[r].memory) == 0 &&
               strcmp(infos[e + 1].transport, infos[r].transport) == 0)
            e++;
        if (e > r)
            printf("%s ranks %d-%d %s memory, %s", r ? ";" : "", r, e, infos[r].memory, infos[r].transport);
        else
            printf("%s rank %d %s memory, %s", r ? ";" : "", r, infos[r].memory, infos[r].transport);
        r = e + 1;
    }
    printf("\n");
}

int bench_rank_device(const bench_rank_info *infos, int r)
{
    int local = 0;
    for (int p = 0; p < r; p++)
        local += strcmp(infos[p].host, infos[r].host) == 0;
    return local;
}

const char *bench_rank_cpu(const bench_rank_info *info)
{
    return info->cpu[0] ? info->cpu : "cpu";
}

void bench_report_header(const bench_opts *o, const bench_rank_info *infos, int nranks)
{
    /* braid's own line first: what nccl-tests users cannot assume here.
     * The version line's NCCL codes are 0: no NCCL is involved. */
    memory_line(infos, nranks);
    int v = braid_version();
    printf("# nccl-tests version braid-bench-%d.%d.%d nccl-headers=0 nccl-library=0\n", v / 10000, v / 100 % 100,
           v % 100);
    printf("# Collective test starting: %s\n", o->program);
    printf("# nThread %d nGpus %d minBytes %ld maxBytes %ld step: %ld(%s) warmup iters: %d iters: %d agg iters: "
           "%d validation: %d graph: %d unalign: %d\n",
           o->nthreads, o->ngpus, (long)o->min_bytes, (long)o->max_bytes,
           (long)(o->step_factor > 1 ? o->step_factor : o->step_bytes), o->step_factor > 1 ? "factor" : "bytes",
           o->warmup_iters, o->iters, o->agg_iters, o->check, 0, o->unalign);
    if (o->blocking == 1)
        printf("# Blocking Enabled: wait and barrier after each inner iteration (-m) \n");
    if (o->blocking == 2)
        printf("# Blocking Enabled: wait after each inner iteration (-m), no barrier \n");
    if (o->blocking == 3)
        printf("# Blocking Enabled: wait and barrier after each outer iteration (-n); time excludes barrier \n");
    if (o->per_iter) {
        /* braid-bench's clock is the host's: nccl-tests says CUDA event timing */
        printf("# Per-Iteration Report: host timing; i_* uses max over process rows");
        if (o->per_iter_skip)
            printf("; summary skips first %d iterations", o->per_iter_skip);
        printf(" \n");
    }
    printf("#\n");
    printf("# Using devices\n");
    for (int r = 0; r < nranks; r++)
        printf("#  Rank %2d Group %2d Pid %6d on %10s device %2d [%04x:%02x:%02x] %s\n", r, 0, (int)infos[r].pid,
               infos[r].host, bench_rank_device(infos, r), 0, 0, 0, bench_rank_cpu(&infos[r]));
    /* nccl-tests' writeResultHeader, its -I, -C and -S variants included */
    const char *ts_label = o->report_timestamps ? "timestamp" : "";
    const char *ts_format = o->report_timestamps ? TIME_FORMAT : "";
    int ts_pad = o->report_timestamps ? 19 : 0;
    const char *t = o->report_cputime ? "cputime" : "time";
    printf("#\n");
    if (o->per_iter) {
        printf("# %10s  %12s  %8s  %6s  %6s              out-of-place (+ per-iteration)                                "
               "in-place (+ per-iteration)\n", "", "", "", "", "");
        printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %7s  %7s  %7s  %7s  %6s  %6s  %6s  %7s  %7s  %7s  "
               "%7s %*s\n", "size", "count", "type", "redop", "root", t, "algbw", "busbw", "#wrong", "i_min", "i_max",
               "i_p99", "i_cv%", t, "algbw", "busbw", "#wrong", "i_min", "i_max", "i_p99", "i_cv%", ts_pad, ts_label);
        printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %7s  %7s  %7s  %7s  %6s  %6s  %6s  %7s  %7s  %7s  "
               "%7s %*s\n", "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)", "(us)",
               "(%)", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)", "(us)", "(%)", ts_pad, ts_format);
    } else {
        printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n", "", "",
               "", "", "");
        printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s\n", "size", "count", "type",
               "redop", "root", t, "algbw", "busbw", "#wrong", t, "algbw", "busbw", "#wrong", ts_pad, ts_label);
        printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s\n", "(B)", "(elements)", "",
               "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "", ts_pad, ts_format);
    }
    bench_json_config(o, infos, nranks);
    fflush(stdout);
}

/* nccl-tests' getFloatStr: the value in width characters, dropping
 * decimals, then to an exponent, as it needs. */
static void fit(double v, int width, char *out)
{
    if (snprintf(out, (size_t)width + 1, "%*.2f", width, v) <= width)
        return;
    if (snprintf(out, (size_t)width + 1, "%*.1f", width, v) <= width)
        return;
    if (snprintf(out, (size_t)width + 1, "%*.0f", width, v) <= width)
        return;
    snprintf(out, (size_t)width + 1, width >= 7 ? "%*.1e" : "%*.0e", width, v);
}

static int format_half(char *buf, size_t len, const bench_result *r, int per_iter)
{
    char t[8], alg[7], bus[7];
    int n;
    fit(r->time_us, 7, t);
    fit(r->algbw, 6, alg);
    fit(r->busbw, 6, bus);
    if (r->wrong >= 0)
        n = snprintf(buf, len, "  %7s  %6s  %6s  %6g", t, alg, bus, (double)r->wrong);
    else
        n = snprintf(buf, len, "  %7s  %6s  %6s    N/A", t, alg, bus);
    if (per_iter) {
        char mn[8], mx[8], p99[8], cv[8];
        fit(r->i_min, 7, mn);
        fit(r->i_max, 7, mx);
        fit(r->i_p99, 7, p99);
        fit(r->i_cv, 7, cv);
        n += snprintf(buf + n, len - (size_t)n, "  %7s  %7s  %7s  %7s", mn, mx, p99, cv);
    }
    return n;
}

static void csv_half(FILE *f, const bench_result *r)
{
    fprintf(f, ",%.3f,%.6f,%.6f,", r->time_us, r->algbw, r->busbw);
    if (r->wrong >= 0)
        fprintf(f, "%lld", r->wrong);
    else
        fprintf(f, "N/A");
}

void bench_report_row(bench_report *rep, const bench_opts *opts, int nranks, size_t bytes, size_t count,
                      braid_dtype dtype, const char *opname, int root, const bench_result *oop,
                      const bench_result *ip)
{
    char line[640];
    char rootname[16];
    int n;
    snprintf(rootname, sizeof(rootname), "%6i", root);
    n = snprintf(line, sizeof(line), "%12li  %12li  %8s  %6s  %6s", (long)bytes, (long)count, bench_type_name(dtype),
                 opname, rootname);
    n += format_half(line + n, sizeof(line) - (size_t)n, oop, opts->per_iter);
    n += format_half(line + n, sizeof(line) - (size_t)n, ip, opts->per_iter);
    if (opts->report_timestamps) {
        char now[64];
        time_t t = time(NULL);
        strftime(now, sizeof(now), TIME_FORMAT, localtime(&t));
        snprintf(line + n, sizeof(line) - (size_t)n, "%21s", now);
    }
    bench_json_row(opts, bytes, count, bench_type_name(dtype), opname, rootname, oop, ip);
    /* One write per row, so a row never interleaves with a log line. */
    printf("%s\n", line);
    fflush(stdout);

    rep->bw_sum += oop->busbw + ip->busbw;
    rep->bw_count += 2;
    rep->errors += (oop->wrong > 0) + (ip->wrong > 0);

    if (rep->csv) {
        char label[256];
        bench_report_label(opts, nranks, label, sizeof(label));
        fprintf(rep->csv, "%zu,%zu,%s,%s,%d", bytes, count, bench_type_name(dtype), opname, root);
        csv_half(rep->csv, oop);
        csv_half(rep->csv, ip);
        fprintf(rep->csv, ",%d,%s,%.3f,%.3f\n", nranks, label, oop->cpu_us, ip->cpu_us);
        fflush(rep->csv);
    }
}

int bench_report_close(bench_report *rep, const bench_opts *opts, const bench_memory *mem)
{
    double avg = rep->bw_count ? rep->bw_sum / (double)rep->bw_count : 0.0;
    int slow = opts->min_bw >= 0 && avg < opts->min_bw * 0.9;
    printf("# %-20s : %d %s\n", "Out of bounds values", (int)rep->errors, rep->errors ? "FAILED" : "OK");
    printf("# %-20s : %g %s\n", "Avg bus bandwidth", avg, opts->min_bw < 0 ? "" : (slow ? "FAILED" : "OK"));
    printf("#\n");
    printf("# Collective test concluded: %s\n", opts->program);
    if (mem)
        bench_memory_print(mem);
    bench_json_close(rep->errors, avg, opts->min_bw >= 0, !slow);
    printf("#\n");
    /* nccl-tests ends with its last-error line, empty on success. */
    printf("\n");
    fflush(stdout);
    if (rep->csv) {
        fclose(rep->csv);
        rep->csv = NULL;
    }
    return rep->errors || slow ? 1 : 0;
}
