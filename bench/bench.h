/* braid-bench internals shared by the files of bench/. The benchmark is a
 * plain client of the library: it includes braid.h and nothing else from
 * braid, so it measures exactly what a trainer would get. */
#ifndef BENCH_H
#define BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "braid.h"

#define BENCH_MAX_TYPES 10
#define BENCH_MAX_OPS 6

/* One per nccl-tests program (<name>_perf). */
typedef enum {
    BENCH_ALLREDUCE = 1,
    BENCH_BROADCAST,
    BENCH_REDUCE,
    BENCH_ALLGATHER,
    BENCH_REDUCE_SCATTER,
    BENCH_ALLTOALL,
    BENCH_ALLTOALLV,
    BENCH_SENDRECV,
    BENCH_GATHER,
    BENCH_SCATTER,
    BENCH_HYPERCUBE,
} bench_coll;

/* -r all (or -1, as nccl-tests): every rank in turn. */
#define BENCH_ROOT_ALL (-1)

/* Where the buffers live: device memory when a GPU can be used (nccl-tests
 * only has GPU buffers), else host memory; or forced. */
enum { BENCH_BUF_AUTO = 0, BENCH_BUF_HOST, BENCH_BUF_DEVICE };

/* Exit codes. A rank that saw wrong results still finishes the table, so
 * only BENCH_EXIT_FAILED makes the local launcher stop the other ranks. */
enum {
    BENCH_EXIT_OK = 0,
    BENCH_EXIT_WRONG = 1,  /* some #wrong > 0 (nccl-tests exits 1 too) */
    BENCH_EXIT_USAGE = 2,  /* bad options or outputs that cannot be written */
    BENCH_EXIT_FAILED = 3, /* a braid call failed */
};

/* Command line, parsed once in every process (the local launcher forks after
 * parsing, so children inherit it). Field names follow nccl-tests. */
typedef struct {
    bench_coll coll;
    size_t min_bytes, max_bytes;
    size_t step_bytes;   /* -i: additive step, used when step_factor <= 1 */
    size_t step_factor;  /* -f: multiplicative step */
    int iters, warmup_iters;
    int agg_iters;       /* -m: collectives per iteration, in one braid group */
    int run_cycles;      /* -N: sweeps over the sizes; 0 repeats until stopped */
    int check;           /* -c: verifications per size (0: none) */
    int ntypes;
    braid_dtype types[BENCH_MAX_TYPES];
    int nops;
    braid_op ops[BENCH_MAX_OPS];
    int root;            /* BENCH_ROOT_ALL: each rank in turn */
    int nthreads, ngpus; /* -t, -g: ranks per process = nthreads * ngpus */
    int per_process_given; /* -t or -g appeared on the command line */
    int nranks;          /* --nranks: local ranks to spawn without a launcher */
    int nranks_given;    /* --nranks appeared on the command line */
    int blocking;        /* -z: 0 issue every iteration, then wait; 1 wait and barrier after each;
                            2 wait after each; 3 as 1, the barrier left out of the time */
    int unalign;         /* -u: buffers start this many elements past their alignment */
    int report_timestamps; /* -S: a timestamp after each row */
    int per_iter;        /* -I: per-iteration min, max, p99 and cv columns */
    int per_iter_skip;   /* -K: leading iterations left out of -I's summary */
    int memory_report;   /* -M: memory line in the footer */
    const char *json_path; /* -J: nccl-tests' JSON report */
    int argc;            /* the command line, for -J */
    char **argv;
    double min_bw;       /* NCCL_TESTS_MIN_BW: the average busbw must reach 90% of it; -1 none */
    int report_cputime;  /* -C: report the time to issue the calls */
    braid_algo algo;
    int average;     /* -a as nccl-tests: 0 rank 0's time, 1 mean, 2 min, 3 max over ranks (default 3) */
    int timeout_s;       /* -T: 0 keeps the library default */
    const char *csv_path;
    const char *plot_path;
    const char *label;   /* series name in csv and plot; NULL: derived */
    const char *program; /* the name it was run as (argv[0]'s last part), for the header and footer */
    int buffers;         /* --buffers: BENCH_BUF_* */
    int gpu;             /* set by bench_run: this rank uses CUDA device buffers */
} bench_opts;

/* One timed measurement (one half of a table row). */
typedef struct {
    double time_us;      /* mean per-iteration time, combined over ranks as -a says */
    double algbw, busbw; /* GB/s (1e9 bytes/s) */
    long long wrong;     /* wrong elements summed over ranks; -1: not checked */
    double cpu_us;       /* user + system CPU time per call, summed over ranks */
    /* -I: over the iterations (each the slowest rank's), in us and % */
    double i_min, i_max, i_p99, i_cv, i_avg, i_p50, i_p95, i_stdev;
    double *iter_us;     /* -I: each iteration's us, the slowest rank's (owned) */
    double *proc_us;     /* -I with -J, rank 0: nprocs x iters, each rank's (owned) */
    int nprocs;
} bench_result;

/* coll.c: the collectives, as nccl-tests' src/<coll>.cu define them. */
enum {
    BENCH_TAKES_OP = 1,           /* reduces: -o applies, rows name the op */
    BENCH_TAKES_ROOT = 2,         /* -r applies */
    BENCH_IN_PLACE_UNCHECKED = 4, /* in place runs, but nccl-tests checks nothing */
    BENCH_POWER_OF_TWO = 8,       /* skipped unless the rank count is a power of two */
};

/* Element counts of one size (nccl-tests' getCollByteCount). */
typedef struct {
    size_t send, recv;        /* elements in each buffer */
    size_t param;             /* the count passed to the call (the table's count) */
    size_t send_ip, recv_ip;  /* in place: send/recv = recv buffer + rank * these */
} bench_counts;

typedef struct {
    bench_coll id;
    const char *name;     /* braid-bench's: "allreduce" */
    const char *perf;     /* nccl-tests' program: "all_reduce_perf" */
    unsigned flags;       /* BENCH_TAKES_OP ... */
    void (*counts)(size_t count, size_t esize, int nranks, bench_counts *k);
} bench_coll_info;

/* One call's arguments. */
typedef struct {
    braid_pg *pg;
    int rank, nranks;
    bench_coll coll;
    const void *send;
    void *recv;
    size_t count;
    braid_dtype dtype;
    braid_op op;
    int root;
} bench_call;

const bench_coll_info *bench_coll_get(bench_coll coll);
/* By braid-bench's name, nccl-tests' program name (with or without
 * _perf), or an alias; NULL if none. */
const bench_coll_info *bench_coll_find(const char *name);
const char *bench_coll_names(void);
/* algbw and busbw in GB/s of param elements moved in sec. */
void bench_coll_bw(bench_coll coll, size_t param, size_t esize, double sec, int nranks, double *algbw,
                   double *busbw);
/* Issue the call; work NULL blocks. */
braid_status bench_coll_issue(const bench_call *call, braid_work **work);

/* alltoallv.c: alltoallv_perf's traffic (NCCL_TESTS_ALLTOALLV_*). */
/* Read the environment and any matrix file; -1 with the reason printed. */
int bench_alltoallv_setup(void);
/* Whether the ranks and sizes suit the matrix; -1 with the reason printed. */
int bench_alltoallv_check(int nranks, size_t min_bytes, size_t max_bytes);
int bench_alltoallv_from_matrix(void);
/* Bytes from src to dst when each rank sends total_bytes. */
size_t bench_alltoallv_bytes(int src, int dst, int nranks, size_t total_bytes);
/* The most elements any rank sends and receives. */
void bench_alltoallv_most(size_t total_bytes, size_t esize, int nranks, size_t *send, size_t *recv);

/* options.c */
/* Parse argv. Returns 0 to run, 1 when help was printed, -1 on a usage error
 * (already reported on stderr). */
int bench_parse_args(int argc, char **argv, bench_opts *opts);
/* Parse a size with an optional K/M/G suffix (powers of 1024). -1 on error. */
int bench_parse_size(const char *text, size_t *out);

/* dtype.c: names as nccl-tests spells them, and exact element codecs. */
const char *bench_type_name(braid_dtype dtype);
const char *bench_op_name(braid_op op);
int bench_type_from_name(const char *name, braid_dtype *dtype);
int bench_op_from_name(const char *name, braid_op *op);
int bench_type_is_float(braid_dtype dtype);
int bench_type_is_signed(braid_dtype dtype);

/* The scalar rank multiplies its input by for mulsum (nccl-tests'). */
int bench_premul_scalar(int rank);
/* Store value (already exact or to be rounded to nearest even) as dtype.
 * Integer types wrap modulo 2^bits. */
void bench_encode(braid_dtype dtype, double value, void *dst);
/* Store the low bits of a two's-complement integer (integer dtypes only). */
void bench_encode_bits(braid_dtype dtype, uint64_t bits, void *dst);
/* Exact value of one element. */
double bench_decode(braid_dtype dtype, const void *src);

/* verify.c: rank-dependent inputs whose reduction is exact in every dtype,
 * so results can be compared for equality (nccl-tests does the same), and
 * every rank's data for the collectives that move data. Patterns repeat,
 * so element i of a sequence is defined for any i. */
typedef struct bench_pattern bench_pattern;
/* Tables of one (dtype, op) for this rank: a reduction's input and result,
 * or (reduction 0) every rank's data. seed varies the data between checks. */
int bench_pattern_create(bench_pattern **pat, int reduction, braid_dtype dtype, braid_op op, int rank, int nranks,
                         uint32_t seed);
void bench_pattern_destroy(bench_pattern *pat);
/* Fill buf with elements [start, start + count) of this rank's input, of
 * rank src's data, or of junk that differs from every expected value. */
void bench_pattern_fill_input(const bench_pattern *pat, void *buf, size_t start, size_t count);
void bench_pattern_fill_source(const bench_pattern *pat, int src, void *buf, size_t start, size_t count);
void bench_pattern_fill_junk(const bench_pattern *pat, void *buf, size_t start, size_t count);
/* Elements of buf that differ from elements [start, start + count) of the
 * reduction's result, or of rank src's data. */
long long bench_pattern_check(const bench_pattern *pat, const void *buf, size_t start, size_t count);
long long bench_pattern_check_source(const bench_pattern *pat, int src, const void *buf, size_t start, size_t count);

/* data.c: which part of the buffers holds what, per collective. */
typedef struct {
    bench_coll coll;
    bench_counts k;
    int rank, nranks, root, in_place;
    braid_dtype dtype;
} bench_layout;
void bench_data_fill(const bench_layout *l, const bench_pattern *pat, void *send, void *recv);
/* Wrong elements; -1 where nccl-tests checks nothing (reported N/A). */
long long bench_data_check(const bench_layout *l, const bench_pattern *pat, const void *send, const void *recv);

/* report.c: nccl-tests' table on rank 0, and the csv file. */
typedef struct {
    FILE *csv;
    double bw_sum;       /* busbw summed over every printed measurement */
    long bw_count;
    long long errors;    /* measurements with wrong elements */
} bench_report;

/* memory.c: -M's report of rank 0's resident memory. */
typedef struct {
    long long init, buffers, collective; /* bytes */
    long long after_buffers;             /* KiB resident after the buffers */
} bench_memory;
void bench_memory_mark_process_start(void); /* in main, before joining */
void bench_memory_start(bench_memory *m);   /* group joined */
void bench_memory_buffers(bench_memory *m, size_t bytes);
void bench_memory_end(bench_memory *m);
void bench_memory_print(const bench_memory *m);

/* Host description of one rank, gathered to rank 0 for the device list. */
typedef struct {
    int64_t pid;
    char host[64];
    char cpu[48];
    char memory[8];      /* "host" or "device" */
    char transport[24];  /* to its peers: "shm", "tcp", "shm+tcp", ... */
} bench_rank_info;

int bench_report_open(bench_report *rep, const bench_opts *opts);
/* The "device" of rank r in the device list: its index among the ranks on
 * its host, as a GPU index would be under nccl-tests. */
int bench_rank_device(const bench_rank_info *infos, int r);
/* The device description: the host's CPU model, or "cpu". */
const char *bench_rank_cpu(const bench_rank_info *info);
void bench_report_header(const bench_opts *opts, const bench_rank_info *infos, int nranks);
void bench_report_row(bench_report *rep, const bench_opts *opts, int nranks, size_t bytes, size_t count,
                      braid_dtype dtype, const char *opname, int root, const bench_result *oop,
                      const bench_result *ip);
/* Footer lines (mem: -M's line, or NULL); returns 0 when no measurement
 * had wrong elements and the average busbw meets NCCL_TESTS_MIN_BW. */
int bench_report_close(bench_report *rep, const bench_opts *opts, const bench_memory *mem);
/* Series label for this run (opts->label or e.g. "braid allreduce 4r"). */
void bench_report_label(const bench_opts *opts, int nranks, char *buf, size_t len);

/* json.c: -J's report, rank 0 only; each call does nothing without -J. */
int bench_json_open(const bench_opts *o); /* 0, or -1 with the reason printed */
void bench_json_config(const bench_opts *o, const bench_rank_info *infos, int nranks);
void bench_json_row(const bench_opts *o, size_t bytes, size_t count, const char *type, const char *opname,
                    const char *root, const bench_result *oop, const bench_result *ip);
void bench_json_close(long long errors, double avg_bw, int bw_checked, int bw_ok);
void bench_json_abandon(void);

/* plot.c: busbw vs size with gnuplot. */
/* 0 when gnuplot can be run; else prints why on stderr. */
int bench_plot_available(void);
/* Plot every series of the given csv files into png_path. */
int bench_plot(const char *png_path, const char *const *csv_paths, int ncsv);

/* run.c: the per-rank benchmark, on an initialized group. Returns this
 * rank's BENCH_EXIT_* code. */
int bench_run(braid_pg *pg, const bench_opts *opts);

/* One rank's state while it measures. */
typedef struct {
    braid_pg *pg;
    const bench_opts *o;
    int rank, nranks;
    void *send, *recv;    /* what the calls get: device memory with -g 1; -u applied */
    void *hsend, *hrecv;  /* host memory, or with -g 1 the host mirrors; -u applied */
    uint32_t seed;        /* verification round, varies the data */
    long long wrong_total;
    /* what is being measured */
    const bench_coll_info *info;
    braid_dtype dtype;
    braid_op op;
    const char *opname;
    int root;             /* -1 where the call has none */
    bench_counts k;       /* of the current size */
} bench_ctx;

/* measure.c: nccl-tests' TimeTest for one (type, op, root) on every rank:
 * warm-up, then each size out of place and in place, a row on rank 0. */
int bench_time_test(bench_ctx *c, bench_report *rep);
/* Report a failed braid call of this rank; returns -1. */
int bench_fail(const bench_ctx *c, const char *what, braid_status st);
/* A one-element all-reduce (barriers, exchanging results). */
int bench_reduce_scalar(bench_ctx *c, void *val, braid_dtype dtype, braid_op op, const char *why);

/* What to print for a failed braid call: braid_last_error(), which already
 * starts with the status name, or the name alone when it is empty. */
const char *bench_error_text(braid_status st);

/* device.c: CUDA device buffers through the driver API (dlopen).
 * Every function returns 0 / non-NULL on success, else the reason is in
 * bench_device_error(). */
int bench_device_init(int local_rank, int *device, char *name, size_t name_len);
const char *bench_device_error(void);
void *bench_device_alloc(size_t bytes);
void bench_device_free(void *p);
int bench_device_put(void *dst, const void *src, size_t bytes); /* host -> device */
int bench_device_get(void *dst, const void *src, size_t bytes); /* device -> host */

/* launch.c */
/* 1 when torchrun, mpirun or srun set up this process. */
int bench_have_launcher_env(void);
/* Spawn the local ranks (--nranks, -t x -g, or 4) by fork and wait for them. */
int bench_spawn_local(const bench_opts *opts);
/* Ranks to fork without a launcher. */
int bench_local_ranks(const bench_opts *opts);
/* Join through the launcher's environment and run. */
int bench_run_env(const bench_opts *opts);
/* Config for braid_pg_init*, from the options. */
void bench_config(const bench_opts *opts, braid_config *cfg);

#endif
