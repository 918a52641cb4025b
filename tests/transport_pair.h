/* Two ranks joined by one connection of a transport, driven through its
 * ops table: what every transport suite needs (tests/test_transport.c runs
 * one body over each transport; test_tcp.c, test_shm.c and test_verbs.c
 * add what only their transport has). */
#ifndef BRAID_TEST_TRANSPORT_PAIR_H
#define BRAID_TEST_TRANSPORT_PAIR_H

#include <stddef.h>
#include <stdint.h>

#include "braid_transport.h"

/* The transport under test and how its two ranks run. */
typedef struct {
    const braid_transport_ops *ops;
    /* 1: ranks are threads of this process (an in-process stand-in such as
     * tests/verbs_fake.c); 0: forked processes, as in a job. */
    int in_process;
    /* Called on each rank's context before it listens or dials (sockets
     * per peer, say); NULL: none. */
    void (*tune)(braid_transport_ctx *ctx, int variant);
    int variant;
} tp_transport;

extern tp_transport tp;

/* One side's body; returns 0 on success, else a code it explains on stderr. */
typedef int (*tp_side_fn)(int rank, braid_conn *conn, void *arg);

/* A context for rank of a two-rank group with the test secret. */
braid_transport_ctx tp_ctx(int rank);

/* Rank 1 listens, rank 0 dials (the lower rank dials, as in a group); each
 * then runs fn on its connection and closes it. Each side's result (124:
 * it ran past 120 s) goes to rc0 and rc1. */
void tp_run_pair(tp_side_fn fn, void *arg, int *rc0, int *rc1);

/* Deterministic contents for (len, seed), and whether buf holds them. */
void tp_fill(uint8_t *buf, size_t len, uint64_t seed);
int tp_check_fill(const uint8_t *buf, size_t len, uint64_t seed);

/* Wait for every request (all on one connection) with a deadline, using
 * test() and progress() the way the algorithms do. */
braid_status tp_wait_all(braid_req *reqs, int n, int timeout_ms);
braid_status tp_send(braid_conn *c, const void *buf, size_t len);
braid_status tp_recv(braid_conn *c, void *buf, size_t len);

#define TP_FAIL(...)                                                                                                  \
    do {                                                                                                               \
        fprintf(stderr, __VA_ARGS__);                                                                                  \
        fputc('\n', stderr);                                                                                           \
        return 1;                                                                                                      \
    } while (0)

#endif
