/* Command line of braid-bench. Letters, long names, meanings and defaults
 * follow nccl-tests (src/common.cu of all_reduce_perf, broadcast_perf) so
 * existing scripts carry over; the options that cannot apply to braid say
 * why when given a value other than their default. --nranks, --algo,
 * --buffers, --csv, --plot and --label are braid's own. */
#include <getopt.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "bench.h"

static void usage(FILE *out, const char *prog)
{
    fprintf(out,
            "usage: %s [COLLECTIVE] [options]      (default: allreduce, or the one a *_perf name says)\n"
            "COLLECTIVE: %s\n"
            "  (or nccl-tests' program names: all_reduce_perf, all_gather_perf, ...; braid-bench installed under\n"
            "  such a name runs that collective)\n"
            "nccl-tests options, same letters and meanings:\n"
            "  -t, --nthreads N          ranks per process (nccl-tests' threads); with -g, N x G ranks\n"
            "  -g, --ngpus N             ranks (GPUs) per thread: ranks per process = -t x -g\n"
            "  -b, --minbytes SIZE       smallest message (K/M/G suffixes; default 32M)\n"
            "  -e, --maxbytes SIZE       largest message (default 32M)\n"
            "  -f, --stepfactor N        multiply the size by N each step\n"
            "  -i, --stepbytes SIZE      else add SIZE each step (default 1M)\n"
            "  -n, --iters N             timed iterations per size (default 20)\n"
            "  -m, --agg_iters N         collectives per iteration, issued as one group (default 1)\n"
            "  -w, --warmup_iters N      warm-up iterations at each size -b, 2 x -b, ... up to -e (default 1)\n"
            "  -N, --run_cycles N        sweep the sizes N times, printing each (0: until stopped; default 1)\n"
            "  -c, --check N             verify each size N times and count #wrong (0: off; default 1)\n"
            "  -d, --datatype TYPE       float double half bfloat16 int8 uint8 int32 uint32 int64 uint64 | all\n"
            "  -o, --op OP               sum prod min max avg mulsum | all (allreduce, reduce, reduce_scatter)\n"
            "  -r, --root N|all          root of broadcast, reduce, gather, scatter (default 0; all or -1: each\n"
            "                            rank in turn)\n"
            "  -z, --blocking 0|1|2|3    0: issue every iteration, then wait (default); 1: wait and barrier after\n"
            "                            each; 2: wait after each, no barrier; 3: as 1, the barrier not timed\n"
            "  -C, --report_cputime 0|1  1: report the time to issue the calls, not to complete them\n"
            "  -a, --average 0|1|2|3     time reported: rank 0's, mean, min or max over ranks (default 1,\n"
            "                            as nccl-tests; 3: the slowest rank)\n"
            "  -u, --unalign N           buffers start N elements past their alignment (default 0)\n"
            "  -I, --per_iter_timing 0|1 1: per-iteration min, max, p99 and cv%% columns (host clock)\n"
            "  -K, --per_iter_skip N     leave the first N iterations out of -I's columns\n"
            "  -S, --report_timestamps 0|1  1: a timestamp after each row\n"
            "  -M, --memory 0|1          1: a memory usage line in the footer (resident host memory)\n"
            "  -T, --timeout SEC         group timeout for every blocking wait\n"
            "  -p, --parallel_init 0|1   accepted: each rank is its own process, so ranks always start in\n"
            "                            parallel\n"
            "  -y, --stream_null 0|1     accepted: braid-bench always passes the default stream\n"
            "  -x, --cta_policy 0|1|2    accepted, no effect: braid has no CTA policy to set\n"
            "  -V, --device_cta_count N  accepted, no effect without -D\n"
            "  -G, --cudagraph 0         only 0: braid's collectives cannot be captured in CUDA graphs\n"
            "  -R, --local_register 0    only 0: braid has no user buffer registration (verbs registers\n"
            "                            buffers itself, through a cache)\n"
            "  -D, --device_implementation 0  only 0: braid has no device-initiated (NCCL device API) collectives\n"
            "  -J, --output_file FILE    nccl-tests' JSON report (FILE taken: FILE.0, FILE.1, ...)\n"
            "braid's own:\n"
            "      --nranks N            local ranks to fork without a launcher (default: -t x -g when\n"
            "                            given, else 4)\n"
            "      --algo ALGO           auto ring rd hier: collective algorithm (default auto; -a ALGO too)\n"
            "      --buffers WHERE       auto (device memory when a GPU is usable, else host), host, device\n"
            "      --csv FILE            append rows to FILE (written with a header when new)\n"
            "      --plot FILE.png       plot busbw vs size (gnuplot) of this run, or of --csv FILE\n"
            "      --label NAME          series name in the csv and the plot\n"
            "Environment as nccl-tests: NCCL_TESTS_MIN_BW (the average busbw must reach 90%% of it, else exit 1),\n"
            "NCCL_TESTS_ALLTOALLV_SPREAD, NCCL_TESTS_ALLTOALLV_MATRIX_FILE, NCCL_TESTS_ALLTOALLV_MATRIX_SCALE.\n"
            "Under torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), mpirun (OMPI_COMM_WORLD_*)\n"
            "or srun (SLURM_PROCID, SLURM_NTASKS) each process runs -t x -g ranks (default 1);\n"
            "otherwise the ranks are forked on this host. Rank 0 prints the nccl-tests table, after a\n"
            "line naming each rank's memory and transport.\n",
            prog, bench_coll_names());
}

int bench_parse_size(const char *text, size_t *out)
{
    double value;
    char unit[8] = {0};
    int n = sscanf(text, "%lf%7s", &value, unit);
    if (n < 1 || value < 0)
        return -1;
    double mult = 1;
    if (n == 2) {
        /* K, KB, KiB (any case): always powers of 1024, as nccl-tests. */
        const char *rest = unit + 1;
        switch (unit[0]) {
        case 'k':
        case 'K':
            mult = 1024.0;
            break;
        case 'm':
        case 'M':
            mult = 1024.0 * 1024;
            break;
        case 'g':
        case 'G':
            mult = 1024.0 * 1024 * 1024;
            break;
        case 'b':
        case 'B':
            rest = unit + 1;
            if (*rest)
                return -1;
            break;
        default:
            return -1;
        }
        if (*rest && strcasecmp(rest, "b") != 0 && strcasecmp(rest, "ib") != 0)
            return -1;
    }
    *out = (size_t)(value * mult);
    return 0;
}

static int parse_int(const char *text, const char *what, long lo, long hi, long *out)
{
    char *end;
    long v = strtol(text, &end, 0);
    if (*text == '\0' || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "braid-bench: invalid %s '%s' (expected an integer in [%ld, %ld])\n", what, text, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_types(const char *text, bench_opts *o)
{
    /* nccl-tests' order for 'all', minus fp8, which braid does not have. */
    static const braid_dtype all[] = {BRAID_I8,  BRAID_U8,  BRAID_I32, BRAID_U32, BRAID_I64,
                                      BRAID_U64, BRAID_F16, BRAID_F32, BRAID_F64, BRAID_BF16};
    if (strcasecmp(text, "all") == 0) {
        o->ntypes = (int)(sizeof(all) / sizeof(all[0]));
        memcpy(o->types, all, sizeof(all));
        return 0;
    }
    /* nccl-tests types braid does not have yet: say so, not "unknown". */
    static const char *const missing[] = {"fp8_e4m3", "fp8_e5m2", "f8e4m3", "f8e5m2"};
    for (size_t i = 0; i < sizeof(missing) / sizeof(missing[0]); i++) {
        if (strcasecmp(text, missing[i]) == 0) {
            fprintf(stderr, "braid-bench: -d %s is not supported: braid has no %s dtype (braid_dtype in braid.h: "
                            "float double half bfloat16 int8 uint8 int32 uint32 int64 uint64)\n", text, text);
            return -1;
        }
    }
    if (bench_type_from_name(text, &o->types[0]) != 0) {
        fprintf(stderr,
                "braid-bench: unknown datatype '%s' (float double half bfloat16 int8 uint8 int32 uint32 int64 uint64 all)\n",
                text);
        return -1;
    }
    o->ntypes = 1;
    return 0;
}

static int parse_ops(const char *text, bench_opts *o)
{
    static const braid_op all[] = {BRAID_SUM, BRAID_PROD, BRAID_MAX, BRAID_MIN, BRAID_AVG, BRAID_MULSUM}; /* nccl-tests order */
    if (strcasecmp(text, "all") == 0) {
        o->nops = (int)(sizeof(all) / sizeof(all[0]));
        memcpy(o->ops, all, sizeof(all));
        return 0;
    }
    if (bench_op_from_name(text, &o->ops[0]) != 0) {
        fprintf(stderr, "braid-bench: unknown op '%s' (sum prod min max avg mulsum all)\n", text);
        return -1;
    }
    o->nops = 1;
    return 0;
}

static int parse_algo(const char *text, braid_algo *algo)
{
    if (strcasecmp(text, "auto") == 0)
        *algo = BRAID_ALGO_AUTO;
    else if (strcasecmp(text, "ring") == 0)
        *algo = BRAID_ALGO_RING;
    else if (strcasecmp(text, "rd") == 0 || strcasecmp(text, "recursive_doubling") == 0)
        *algo = BRAID_ALGO_RECURSIVE_DOUBLING;
    else if (strcasecmp(text, "hier") == 0 || strcasecmp(text, "hierarchical") == 0)
        *algo = BRAID_ALGO_HIER;
    else {
        fprintf(stderr, "braid-bench: unknown algorithm '%s' (auto ring rd hier)\n", text);
        return -1;
    }
    return 0;
}

static int parse_coll(const char *text, bench_coll *coll)
{
    const bench_coll_info *info = bench_coll_find(text);
    if (!info)
        return -1;
    *coll = info->id;
    return 0;
}

enum { OPT_CSV = 1000, OPT_PLOT, OPT_LABEL, OPT_ALGO, OPT_NRANKS, OPT_BUFFERS };

/* An nccl-tests option that cannot apply: its default is accepted, any
 * other value is a usage error that says why. */
static int only_default(const char *text, char letter, long def, const char *why)
{
    long v;
    char *end;
    v = strtol(text, &end, 0);
    if (*text != '\0' && *end == '\0' && v == def)
        return 0;
    fprintf(stderr, "braid-bench: -%c %s is not supported: %s\n", letter, text, why);
    return -1;
}

static int parse_buffers(const char *text, int *out)
{
    if (strcasecmp(text, "auto") == 0)
        *out = BENCH_BUF_AUTO;
    else if (strcasecmp(text, "host") == 0)
        *out = BENCH_BUF_HOST;
    else if (strcasecmp(text, "device") == 0)
        *out = BENCH_BUF_DEVICE;
    else {
        fprintf(stderr, "braid-bench: unknown --buffers '%s' (auto host device)\n", text);
        return -1;
    }
    return 0;
}

/* An option that takes an integer and keeps it in an int of bench_opts:
 * what names it in the error, [lo, hi] bounds it. */
typedef struct {
    int opt;
    const char *what;
    long lo, hi;
    size_t offset; /* of the int in bench_opts; NO_FIELD: checked, then ignored */
} int_flag;

#define NO_FIELD ((size_t)-1)

static const int_flag int_flags[] = {
    {'n', "iteration count", 1, 1 << 30, offsetof(bench_opts, iters)},
    {'m', "aggregated iteration count", 1, 1024, offsetof(bench_opts, agg_iters)},
    {'w', "warm-up count", 0, 1 << 30, offsetof(bench_opts, warmup_iters)},
    {'N', "run cycle count", 0, 1 << 30, offsetof(bench_opts, run_cycles)},
    {'c', "check count", 0, 1 << 20, offsetof(bench_opts, check)},
    {'C', "report_cputime flag", 0, 1, offsetof(bench_opts, report_cputime)},
    {'p', "parallel_init flag", 0, 1, NO_FIELD},
    {'y', "stream_null flag", 0, 1, NO_FIELD},
    {'x', "cta_policy", 0, 2, NO_FIELD},
    {'u', "unalign element count", 0, 1 << 20, offsetof(bench_opts, unalign)},
    {'S', "report_timestamps flag", 0, 1, offsetof(bench_opts, report_timestamps)},
    {'I', "per_iter_timing flag", 0, 1, offsetof(bench_opts, per_iter)},
    {'K', "per_iter_skip count", 0, 1 << 30, offsetof(bench_opts, per_iter_skip)},
    {'M', "memory report flag", 0, 1, offsetof(bench_opts, memory_report)},
    {'T', "timeout", 0, 1 << 21, offsetof(bench_opts, timeout_s)},
    {'t', "thread count", 1, 1024, offsetof(bench_opts, nthreads)},
    {'g', "gpu count", 1, 1024, offsetof(bench_opts, ngpus)},
    {OPT_NRANKS, "rank count", 1, 1024, offsetof(bench_opts, nranks)},
};

static const int_flag *find_int_flag(int c)
{
    for (size_t i = 0; i < sizeof(int_flags) / sizeof(int_flags[0]); i++)
        if (int_flags[i].opt == c)
            return &int_flags[i];
    return NULL;
}

/* Parse an integer option of the table into its field. */
static int parse_int_flag(const int_flag *f, const char *text, bench_opts *o)
{
    long v;
    if (parse_int(text, f->what, f->lo, f->hi, &v))
        return -1;
    if (f->offset != NO_FIELD)
        *(int *)((char *)o + f->offset) = (int)v;
    if (f->opt == 't' || f->opt == 'g')
        o->per_process_given = 1;
    else if (f->opt == OPT_NRANKS)
        o->nranks_given = 1;
    return 0;
}

/* The message sizes: -b, -e, -i take a size, -f a factor. */
static int parse_size_flag(int c, const char *text, bench_opts *o)
{
    if (c == 'f') {
        long v;
        if (parse_int(text, "step factor", 1, 1 << 30, &v))
            return -1;
        o->step_factor = (size_t)v;
        return 0;
    }
    size_t s;
    if (bench_parse_size(text, &s) != 0) {
        fprintf(stderr, "braid-bench: invalid size '%s' for -%c (e.g. 8, 4K, 64M, 1G)\n", text, c);
        return -1;
    }
    if (c == 'b')
        o->min_bytes = s;
    else if (c == 'e')
        o->max_bytes = s;
    else
        o->step_bytes = s;
    return 0;
}

static int parse_blocking(const char *text, bench_opts *o)
{
    long v;
    if (parse_int(text, "blocking mode", 0, 3, &v))
        return -1;
    o->blocking = (int)v;
    return 0;
}

/* -r: a rank, or every rank in turn ("all", or nccl-tests' -1). */
static int parse_root(const char *text, bench_opts *o)
{
    long v;
    if (strcasecmp(text, "all") == 0 || strcmp(text, "-1") == 0) {
        o->root = BENCH_ROOT_ALL;
        return 0;
    }
    if (parse_int(text, "root", 0, 1 << 20, &v))
        return -1;
    o->root = (int)v;
    return 0;
}

/* -V: nccl-tests takes 1..128 and falls back to 16 otherwise; it only
 * matters with -D, which braid does not have. */
static int parse_device_cta_count(const char *text)
{
    long v;
    return parse_int(text, "device_cta_count", 1, 128, &v);
}

/* -a: nccl-tests' is a digit (the time reported); an algorithm name is
 * braid's own, as --algo. */
static int parse_average_or_algo(const char *text, bench_opts *o)
{
    long v;
    if (text[0] >= '0' && text[0] <= '9') {
        if (parse_int(text, "average mode", 0, 3, &v))
            return -1;
        o->average = (int)v;
        return 0;
    }
    return parse_algo(text, &o->algo);
}

/* Every option that is neither an integer of the table nor a size. */
static int parse_other_flag(int c, const char *text, bench_opts *o)
{
    switch (c) {
    case 'o':
        return parse_ops(text, o);
    case 'd':
        return parse_types(text, o);
    case 'z':
        return parse_blocking(text, o);
    case 'r':
        return parse_root(text, o);
    case 'V':
        return parse_device_cta_count(text);
    case 'D':
        return only_default(text, 'D', 0, "braid has no device-initiated (NCCL device API) collectives");
    case 'J':
        o->json_path = text;
        return 0;
    case 'G':
        return only_default(text, 'G', 0, "braid's collectives cannot be captured in CUDA graphs");
    case 'R':
        return only_default(text, 'R', 0,
                            "braid has no user buffer registration (verbs registers buffers itself, through a "
                            "cache)");
    case 'a':
        return parse_average_or_algo(text, o);
    case OPT_ALGO:
        return parse_algo(text, &o->algo);
    case OPT_BUFFERS:
        return parse_buffers(text, &o->buffers);
    case OPT_CSV:
        o->csv_path = text;
        return 0;
    case OPT_PLOT:
        o->plot_path = text;
        return 0;
    case OPT_LABEL:
        o->label = text;
        return 0;
    default:
        usage(stderr, "braid-bench");
        return -1;
    }
}

static void set_defaults(bench_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->coll = BENCH_ALLREDUCE;
    o->min_bytes = o->max_bytes = 32u << 20;
    o->step_bytes = 1u << 20;
    o->step_factor = 1;
    o->iters = 20;
    o->agg_iters = 1;
    o->warmup_iters = 1;
    o->run_cycles = 1;
    o->check = 1;
    o->ntypes = 1;
    o->types[0] = BRAID_F32;
    o->nops = 1;
    o->ops[0] = BRAID_SUM;
    o->nthreads = o->ngpus = 1;
    o->nranks = 4;
    o->algo = BRAID_ALGO_AUTO;
    o->average = 1;
    o->program = "braid-bench";
    o->min_bw = -1;
    const char *min_bw = getenv("NCCL_TESTS_MIN_BW");
    if (min_bw)
        o->min_bw = atof(min_bw);
}

/* What the options mean together, once all are read. */
static int check_combination(const bench_opts *o)
{
    if ((long)o->nthreads * o->ngpus > 1024) {
        fprintf(stderr, "braid-bench: -t %d x -g %d is more than 1024 ranks per process\n", o->nthreads, o->ngpus);
        return -1;
    }
    if (o->min_bytes > o->max_bytes) {
        fprintf(stderr, "braid-bench: minbytes %zu is larger than maxbytes %zu\n", o->min_bytes, o->max_bytes);
        return -1;
    }
    /* Sizes that would never advance (nccl-tests loops forever on these). */
    if (o->step_factor > 1 && o->min_bytes == 0 && o->max_bytes > 0) {
        fprintf(stderr, "braid-bench: -f needs minbytes > 0 (0 * factor stays 0)\n");
        return -1;
    }
    if (o->step_factor <= 1 && o->step_bytes == 0 && o->min_bytes < o->max_bytes) {
        fprintf(stderr, "braid-bench: -i 0 with -f 1 never reaches maxbytes\n");
        return -1;
    }
    return 0;
}

/* nccl-tests' adjustments of -I and -K: it warns and goes on. */
static void adjust_per_iter(bench_opts *o)
{
    if (o->per_iter_skip >= o->iters) {
        fprintf(stderr, "per-iteration skip (-K) must be between 0 and %d. Disabling.\n", o->iters - 1);
        o->per_iter_skip = 0;
    }
    if (o->per_iter_skip && !o->per_iter) {
        fprintf(stderr, "per-iteration skip (-K) requires per-iteration timing (-I 1). Disabling.\n");
        o->per_iter_skip = 0;
    }
}

int bench_parse_args(int argc, char **argv, bench_opts *o)
{
    static const struct option longopts[] = {
        {"nthreads", required_argument, 0, 't'},       {"ngpus", required_argument, 0, 'g'},
        {"minbytes", required_argument, 0, 'b'},       {"maxbytes", required_argument, 0, 'e'},
        {"stepbytes", required_argument, 0, 'i'},      {"stepfactor", required_argument, 0, 'f'},
        {"iters", required_argument, 0, 'n'},          {"agg_iters", required_argument, 0, 'm'},
        {"warmup_iters", required_argument, 0, 'w'},   {"run_cycles", required_argument, 0, 'N'},
        {"parallel_init", required_argument, 0, 'p'},  {"check", required_argument, 0, 'c'},
        {"op", required_argument, 0, 'o'},             {"datatype", required_argument, 0, 'd'},
        {"root", required_argument, 0, 'r'},           {"blocking", required_argument, 0, 'z'},
        {"stream_null", required_argument, 0, 'y'},    {"timeout", required_argument, 0, 'T'},
        {"cudagraph", required_argument, 0, 'G'},      {"report_cputime", required_argument, 0, 'C'},
        {"average", required_argument, 0, 'a'},        {"local_register", required_argument, 0, 'R'},
        {"nranks", required_argument, 0, OPT_NRANKS},  {"algo", required_argument, 0, OPT_ALGO},
        {"buffers", required_argument, 0, OPT_BUFFERS}, {"csv", required_argument, 0, OPT_CSV},
        {"plot", required_argument, 0, OPT_PLOT},      {"label", required_argument, 0, OPT_LABEL},
        {"report_timestamps", required_argument, 0, 'S'}, {"output_file", required_argument, 0, 'J'},
        {"cta_policy", required_argument, 0, 'x'},     {"device_implementation", required_argument, 0, 'D'},
        {"device_cta_count", required_argument, 0, 'V'}, {"memory", required_argument, 0, 'M'},
        {"unalign", required_argument, 0, 'u'},        {"per_iter_timing", required_argument, 0, 'I'},
        {"per_iter_skip", required_argument, 0, 'K'},
        {"help", no_argument, 0, 'h'},                 {0, 0, 0, 0},
    };
    const char *prog = "braid-bench";

    set_defaults(o);
    o->argc = argc;
    o->argv = argv;
    if (argc > 0 && argv[0] && argv[0][0]) {
        const char *slash = strrchr(argv[0], '/');
        o->program = slash ? slash + 1 : argv[0];
        /* Run as all_gather_perf (an installed link), it is that program. */
        const bench_coll_info *named = bench_coll_find(o->program);
        if (named)
            o->coll = named->id;
        prog = o->program;
    }
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "t:g:b:e:i:f:n:m:w:N:p:I:K:c:o:d:r:z:y:T:hG:C:a:R:x:D:V:J:S:M:u:", longopts, NULL)) != -1) {
        const int_flag *f = find_int_flag(c);
        int rc;
        if (c == 'h') {
            usage(stdout, prog);
            return 1;
        }
        if (f)
            rc = parse_int_flag(f, optarg, o);
        else if (c == 'b' || c == 'e' || c == 'i' || c == 'f')
            rc = parse_size_flag(c, optarg, o);
        else
            rc = parse_other_flag(c, optarg, o);
        if (rc)
            return -1;
    }
    if (optind < argc && parse_coll(argv[optind], &o->coll) != 0) {
        fprintf(stderr, "braid-bench: unknown collective '%s' (%s)\n", argv[optind], bench_coll_names());
        return -1;
    }
    if (optind + 1 < argc) {
        fprintf(stderr, "braid-bench: unexpected argument '%s'\n", argv[optind + 1]);
        return -1;
    }
    adjust_per_iter(o);
    if (check_combination(o))
        return -1;
    return o->coll == BENCH_ALLTOALLV ? bench_alltoallv_setup() : 0;
}
