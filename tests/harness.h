/* Multi-process test harness: fork N ranks on loopback, run a function in
 * each, and collect their exit codes with a deadline. */
#ifndef BRAID_TEST_HARNESS_H
#define BRAID_TEST_HARNESS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "braid.h"

/* A rank body: returns 0 on success; failures print why to stderr. */
typedef int (*harness_rank_fn)(braid_pg *pg, void *arg);

typedef struct {
    int exit_code[64];      /* per rank; -SIG for a signal, 124 for timeout */
    double seconds;         /* wall time until the last rank ended */
    double fault_to_end_s;  /* harness_run_faulty: fault until the last exit */
} harness_result;

/* Run fn on n ranks; returns the number of ranks that did not exit 0.
 * cfg may be NULL. Ranks still running after timeout_s are killed. */
int harness_run(int n, harness_rank_fn fn, void *arg, const braid_config *cfg, int timeout_s,
                harness_result *result);

/* When set, called in every forked rank before braid_pg_init, e.g. to give
 * ranks different environments (BRAID_HOST_ID per rank). */
extern void (*harness_rank_setup)(int rank);

/* Fault injection for harness_run_faulty: SIGKILL (or another signal)
 * rank `rank` after_ms after the ranks were started. */
typedef struct {
    int rank;         /* -1: none */
    int after_ms;     /* counted from the moment every rank has joined */
    int signal;       /* 0 means SIGKILL */
} harness_fault;

/* Like harness_run; the killed rank's exit code is -signal and does not
 * count as a failure. result->fault_to_end_s is the time from the fault to
 * the last surviving rank's exit. */
int harness_run_faulty(int n, harness_rank_fn fn, void *arg, const braid_config *cfg, int timeout_s,
                       const harness_fault *fault, harness_result *result);

/* Deterministic test data: a small integer in [lo, hi] for (rank, i, seed),
 * exactly representable in every dtype, and helpers to store it. */
int64_t harness_value(int rank, size_t i, uint32_t seed, int lo, int hi);
void harness_store(braid_dtype dtype, void *buf, size_t i, double v);
double harness_load(braid_dtype dtype, const void *buf, size_t i);

/* Serial reference for reductions over harness data. harness_input is rank
 * r's element i for (dtype, op): small integers, kept in [-2, 2] for
 * products and non-negative for u8. harness_expected stores in out (one
 * element of dtype) the exact reduction over n ranks as braid computes it:
 * integers wrap, AVG divides once at the end (floats in the dtype's compute
 * precision, integers toward zero), a zero float product keeps its sign. */
int harness_is_float(braid_dtype dtype);
double harness_input(int rank, size_t i, uint32_t seed, braid_dtype dtype, braid_op op);
void harness_expected(braid_dtype dtype, braid_op op, int n, size_t i, uint32_t seed, void *out);
/* One all-reduce of harness data on this rank, blocking, checked bit-exact
 * against harness_expected and for writes past the output's end; returns 0
 * when right, else prints why and returns 1. */
int harness_check_allreduce(braid_pg *pg, braid_dtype dtype, braid_op op, size_t count, int in_place,
                            uint32_t seed);
/* A rank body for fault tests: all-reduces in a loop until one fails, which
 * must be BRAID_ERR_PEER or TIMEOUT with text naming the peer, and the next
 * call must return the same status at once (the group is broken). */
int harness_until_failure(braid_pg *pg, void *arg);

/* A free loopback port P whose successor is free too, for launcher-style
 * tests: MASTER_PORT = P, braid's store on P + 1. */
int harness_free_port_pair(void);
/* setenv(name, "v"). */
void harness_setenv_int(const char *name, int v);

#define HARNESS_FAIL(...)                                                                      \
    do {                                                                                       \
        fprintf(stderr, __VA_ARGS__);                                                          \
        fputc('\n', stderr);                                                                   \
        return 1;                                                                              \
    } while (0)

/* Wait for a forked child up to timeout_s (then SIGKILL it): its exit
 * status, 128 + the signal that ended it, or 124 on timeout. */
int harness_wait_child(pid_t pid, int timeout_s);

#endif
