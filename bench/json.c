/* -J FILE: nccl-tests' JSON report (version 3 of its src/util.cu), so its
 * tools (tools/analyze_perf_json.py) read braid-bench's runs unchanged:
 * the start and end times, the command line and environment, the config
 * with the device list, one record per table row (with the per-iteration
 * times under -I), and the footer's verdicts. Written by rank 0.
 *
 * The writer is a few lines of its own: Debian's JSON libraries need
 * headers that are not part of the build's dependencies, and the output
 * is flat. Values of environment variables named like secrets (the job
 * secret, tokens, passwords) are written as "<redacted>". */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"

extern char **environ;

#define JSON_VERSION 3
#define DEPTH 8

static FILE *out;
static int first[DEPTH]; /* no member yet at this nesting level */
static int depth;
static int after_key;

/* Separator before a value or key at the current level. */
static void sep(void)
{
    if (after_key) {
        after_key = 0;
        return;
    }
    if (depth > 0 && !first[depth - 1])
        fputc(',', out);
    if (depth > 0)
        first[depth - 1] = 0;
}

static void open_level(char c)
{
    sep();
    fputc(c, out);
    if (depth < DEPTH)
        first[depth] = 1;
    depth++;
}

static void close_level(char c)
{
    depth--;
    fputc(c, out);
}

static void str(const char *s)
{
    sep();
    fputc('"', out);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(out, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(out, "\\u%04x", *p);
        else
            fputc(*p, out);
    }
    fputc('"', out);
}

static void key(const char *k)
{
    str(k);
    fputc(':', out);
    after_key = 1;
}

static void num(double v)
{
    sep();
    if (v != v)
        fputs("\"nan\"", out);
    else
        fprintf(out, "%f", v);
}

static void integer(long long v)
{
    sep();
    fprintf(out, "%lld", v);
}

static void null_value(void)
{
    sep();
    fputs("null", out);
}

/* nccl-tests writes its booleans as the strings "true" and "false". */
static void flag(int v)
{
    str(v ? "true" : "false");
}

static void now_string(char *buf, size_t len)
{
    time_t t = time(NULL);
    strftime(buf, len, "%Y-%m-%d %H:%M:%S", localtime(&t));
}

static int secret_name(const char *name, size_t len)
{
    static const char *const words[] = {"SECRET", "TOKEN", "PASSWORD", "PASSWD", "CREDENTIAL"};
    char upper[256];
    size_t n = len < sizeof(upper) - 1 ? len : sizeof(upper) - 1;
    for (size_t i = 0; i < n; i++)
        upper[i] = (char)(name[i] >= 'a' && name[i] <= 'z' ? name[i] - 32 : name[i]);
    upper[n] = '\0';
    for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++)
        if (strstr(upper, words[i]))
            return 1;
    return 0;
}

int bench_json_open(const bench_opts *o)
{
    if (!o->json_path)
        return 0;
    /* As nccl-tests: never overwrite; FILE taken, try FILE.0, FILE.1 ... */
    char path[4096];
    snprintf(path, sizeof(path), "%s", o->json_path);
    for (int i = 0; i < 1000; i++) {
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
        if (fd >= 0) {
            out = fdopen(fd, "w");
            break;
        }
        if (errno != EEXIST) {
            fprintf(stderr, "braid-bench: cannot write the JSON report %s: %s\n", path, strerror(errno));
            return -1;
        }
        snprintf(path, sizeof(path), "%s.%d", o->json_path, i);
    }
    if (!out) {
        fprintf(stderr, "braid-bench: cannot create the JSON report %s or any %s.N\n", o->json_path, o->json_path);
        return -1;
    }
    printf("# Writing JSON output to %s\n", path);
    char t[64];
    now_string(t, sizeof(t));
    depth = 0;
    open_level('{');
    key("version");
    integer(JSON_VERSION);
    key("start_time");
    str(t);
    key("args");
    open_level('[');
    for (int i = 0; i < o->argc; i++)
        str(o->argv[i]);
    close_level(']');
    key("env");
    open_level('[');
    for (char **e = environ; e && *e; e++) {
        const char *eq = strchr(*e, '=');
        if (eq && secret_name(*e, (size_t)(eq - *e))) {
            char red[300];
            snprintf(red, sizeof(red), "%.*s=<redacted>", (int)(eq - *e) > 250 ? 250 : (int)(eq - *e), *e);
            str(red);
        } else {
            str(*e);
        }
    }
    close_level(']');
    /* The NCCL version braid-bench's header gives: none. */
    key("nccl_version");
    integer(0);
    return 0;
}

void bench_json_config(const bench_opts *o, const bench_rank_info *infos, int nranks)
{
    if (!out)
        return;
    key("config");
    open_level('{');
    key("nthreads");
    integer(o->nthreads);
    key("ngpus");
    integer(o->ngpus);
    key("minimum_bytes");
    integer((long long)o->min_bytes);
    key("maximum_bytes");
    integer((long long)o->max_bytes);
    key(o->step_factor > 1 ? "step_factor" : "step_bytes");
    integer((long long)(o->step_factor > 1 ? o->step_factor : o->step_bytes));
    key("warmup_iters");
    integer(o->warmup_iters);
    key("iterations");
    integer(o->iters);
    key("aggregated_iterations");
    integer(o->agg_iters);
    key("validation");
    integer(o->check);
    key("graph");
    integer(0);
    key("blocking_collectives");
    flag(o->blocking);
    key("per_iter_timing");
    flag(o->per_iter);
    key("per_iter_skip");
    integer(o->per_iter_skip);
    key("parallel_init");
    flag(0);
    key("devices");
    open_level('[');
    for (int r = 0; r < nranks; r++) {
        open_level('{');
        key("rank");
        integer(r);
        key("group");
        integer(0);
        key("pid");
        integer(infos[r].pid);
        key("hostname");
        str(infos[r].host);
        key("device");
        integer(bench_rank_device(infos, r));
        key("device_hex");
        str("0000:00:00");
        key("device_info");
        str(bench_rank_cpu(&infos[r]));
        close_level('}');
    }
    close_level(']');
    close_level('}');
    key("results");
    open_level('[');
}

static void per_iter(const bench_opts *o, const bench_result *r)
{
    key("skipped_iterations");
    integer(o->per_iter_skip);
    key("min_us");
    num(r->i_min);
    key("max_us");
    num(r->i_max);
    key("avg_us");
    num(r->i_avg);
    key("p50_us");
    num(r->i_p50);
    key("p95_us");
    num(r->i_p95);
    key("p99_us");
    num(r->i_p99);
    key("stdev_us");
    num(r->i_stdev);
    key("cv_pct");
    num(r->i_cv);
    key("times_us");
    open_level('[');
    for (int i = 0; i < o->iters; i++)
        num(r->iter_us[i]);
    close_level(']');
    if (r->proc_us && r->nprocs > 1) {
        key("per_process_max_times_us");
        open_level('[');
        for (int p = 0; p < r->nprocs; p++) {
            open_level('[');
            for (int i = 0; i < o->iters; i++)
                num(r->proc_us[(size_t)p * (size_t)o->iters + (size_t)i]);
            close_level(']');
        }
        close_level(']');
    }
}

static void half(const bench_opts *o, const char *name, const bench_result *r)
{
    key(name);
    open_level('{');
    key(o->report_cputime ? "cpu_time" : "time");
    num(r->time_us);
    key("alg_bw");
    num(r->algbw);
    key("bus_bw");
    num(r->busbw);
    key("nwrong");
    if (r->wrong >= 0)
        num((double)r->wrong);
    else
        null_value();
    close_level('}');
    if (r->iter_us) {
        char k[32];
        snprintf(k, sizeof(k), "%s_per_iter", name);
        key(k);
        open_level('{');
        per_iter(o, r);
        close_level('}');
    }
}

void bench_json_row(const bench_opts *o, size_t bytes, size_t count, const char *type, const char *opname,
                    const char *root, const bench_result *oop, const bench_result *ip)
{
    if (!out)
        return;
    open_level('{');
    key("size");
    integer((long long)bytes);
    key("count");
    integer((long long)count);
    key("type");
    str(type);
    key("redop");
    str(opname);
    key("root");
    str(root);
    half(o, "out_of_place", oop);
    half(o, "in_place", ip);
    key("actual_iterations");
    integer(o->iters);
    key("experiment_name");
    str("");
    close_level('}');
    fflush(out);
}

void bench_json_close(long long errors, double avg_bw, int bw_checked, int bw_ok)
{
    if (!out)
        return;
    close_level(']'); /* results */
    key("out_of_bounds");
    open_level('{');
    key("count");
    integer(errors);
    key("okay");
    flag(errors == 0);
    close_level('}');
    key("average_bus_bandwidth");
    open_level('{');
    key("bandwidth");
    num(avg_bw);
    key("okay");
    if (bw_checked)
        flag(bw_ok);
    else
        str("unchecked");
    close_level('}');
    key("errors");
    open_level('[');
    close_level(']');
    char t[64];
    now_string(t, sizeof(t));
    key("end_time");
    str(t);
    close_level('}');
    fputc('\n', out);
    fclose(out);
    out = NULL;
}

void bench_json_abandon(void)
{
    if (out)
        fclose(out); /* a failed run: the report stays unfinished, as nccl-tests' would */
    out = NULL;
}
