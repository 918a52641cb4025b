/* Two ranks joined by one connection (transport_pair.h). */
#include "transport_pair.h"

#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "clock.h"
#include "harness.h"
#include "status.h"

#define PAIR_TIMEOUT_S 120

tp_transport tp;

braid_transport_ctx tp_ctx(int rank)
{
    braid_transport_ctx ctx;
    memset(&ctx, 0, sizeof(ctx));
    ctx.rank = rank;
    ctx.size = 2;
    for (int i = 0; i < BRAID_SECRET_BYTES; i++)
        ctx.secret[i] = (uint8_t)(0xa0 + i);
    ctx.pg_tag = 0x0123456789abcdefull;
    ctx.timeout_ms = 20000;
    ctx.nsocks = 1;
    snprintf(ctx.bind_ip, sizeof(ctx.bind_ip), "127.0.0.1");
    if (tp.tune)
        tp.tune(&ctx, tp.variant);
    return ctx;
}

void tp_fill(uint8_t *buf, size_t len, uint64_t seed)
{
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        buf[i] = (uint8_t)(x >> 24);
    }
}

int tp_check_fill(const uint8_t *buf, size_t len, uint64_t seed)
{
    uint8_t *want = malloc(len ? len : 1);
    if (!want)
        return 0;
    tp_fill(want, len, seed);
    int ok = memcmp(want, buf, len) == 0;
    free(want);
    return ok;
}

braid_status tp_wait_all(braid_req *reqs, int n, int timeout_ms)
{
    int64_t deadline = braid__now_ms() + timeout_ms;
    braid_conn *conn = reqs[0].conn;
    for (;;) {
        int all = 1;
        for (int i = 0; i < n; i++) {
            int done;
            braid_status st = tp.ops->test(&reqs[i], &done);
            if (st != BRAID_OK)
                return st;
            all &= done;
        }
        if (all)
            return BRAID_OK;
        if (braid__now_ms() > deadline)
            return BRAID_ERR_TIMEOUT;
        braid_status st = tp.ops->progress(&conn, 1, -1, 100);
        if (st != BRAID_OK)
            return st;
    }
}

braid_status tp_send(braid_conn *c, const void *buf, size_t len)
{
    braid_req r;
    braid_status st = tp.ops->isend(c, &r, buf, len);
    return st != BRAID_OK ? st : tp_wait_all(&r, 1, 30000);
}

braid_status tp_recv(braid_conn *c, void *buf, size_t len)
{
    braid_req r;
    braid_status st = tp.ops->irecv(c, &r, buf, len);
    return st != BRAID_OK ? st : tp_wait_all(&r, 1, 30000);
}

/* Where rank 1 puts its address for rank 0, once it listens. */
typedef void (*publish_fn)(const char addr[BRAID_ADDR_MAX], void *to);

/* One rank's part: rank 1 listens and publishes its address, rank 0 dials
 * addr. Returns fn's result or a set-up failure code. */
static int side(int rank, const char *addr, publish_fn publish, void *to, tp_side_fn fn, void *arg)
{
    braid_transport_ctx ctx = tp_ctx(rank);
    braid_conn *conn;
    braid_listener *l = NULL;
    if (rank == 1) {
        char mine[BRAID_ADDR_MAX] = {0};
        if (tp.ops->listen(&ctx, &l, mine) != BRAID_OK) {
            fprintf(stderr, "rank 1: listen: %s\n", braid_last_error());
            mine[0] = '\0';
            publish(mine, to); /* "": rank 0 gives up */
            return 10;
        }
        publish(mine, to);
        if (tp.ops->accept(l, 0, 20000, &conn) != BRAID_OK) {
            fprintf(stderr, "rank 1: accept: %s\n", braid_last_error());
            tp.ops->close_listener(l);
            return 12;
        }
    } else if (!addr[0]) {
        return 11;
    } else if (tp.ops->connect(&ctx, 1, addr, 20000, &conn) != BRAID_OK) {
        fprintf(stderr, "rank 0: connect: %s\n", braid_last_error());
        return 12;
    }
    int rc = fn(rank, conn, arg);
    tp.ops->close(conn);
    if (l)
        tp.ops->close_listener(l);
    return rc;
}

/* ---- ranks as processes ---------------------------------------------------- */

static void publish_to_pipe(const char addr[BRAID_ADDR_MAX], void *to)
{
    if (write(*(int *)to, addr, BRAID_ADDR_MAX) != BRAID_ADDR_MAX)
        _exit(11);
}

/* Both are forked before either touches the transport, and rank 0 reads
 * the address from a pipe: forking while another thread holds a lock
 * (libcrypto's, the allocator's) leaves the child a copy of the held lock. */
static void run_processes(tp_side_fn fn, void *arg, int *rc0, int *rc1)
{
    int p[2];
    ck_assert_int_eq(pipe(p), 0);
    fflush(NULL);
    pid_t pid1 = fork();
    ck_assert_int_ge(pid1, 0);
    if (pid1 == 0) {
        close(p[0]);
        _exit(side(1, NULL, publish_to_pipe, &p[1], fn, arg));
    }
    close(p[1]);
    pid_t pid0 = fork();
    ck_assert_int_ge(pid0, 0);
    if (pid0 == 0) {
        char addr[BRAID_ADDR_MAX];
        size_t got = 0;
        while (got < sizeof(addr)) {
            ssize_t n = read(p[0], addr + got, sizeof(addr) - got);
            if (n <= 0 && !(n < 0 && errno == EINTR))
                _exit(11);
            if (n > 0)
                got += (size_t)n;
        }
        addr[sizeof(addr) - 1] = '\0';
        _exit(side(0, addr, NULL, NULL, fn, arg));
    }
    close(p[0]);
    *rc0 = harness_wait_child(pid0, PAIR_TIMEOUT_S);
    *rc1 = harness_wait_child(pid1, PAIR_TIMEOUT_S);
}

/* ---- ranks as threads -------------------------------------------------------- */

typedef struct {
    tp_side_fn fn;
    void *arg;
    char addr[BRAID_ADDR_MAX];
    int published, rc0;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} thread_pair;

static void publish_to_thread(const char addr[BRAID_ADDR_MAX], void *to)
{
    thread_pair *t = to;
    pthread_mutex_lock(&t->mu);
    memcpy(t->addr, addr, BRAID_ADDR_MAX);
    t->published = 1;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

static void *rank0_main(void *p)
{
    thread_pair *t = p;
    pthread_mutex_lock(&t->mu);
    while (!t->published)
        pthread_cond_wait(&t->cv, &t->mu);
    pthread_mutex_unlock(&t->mu);
    t->rc0 = side(0, t->addr, NULL, NULL, t->fn, t->arg);
    return NULL;
}

/* Rank 0 dials from a thread; rank 1 listens and accepts on this one. */
static void run_threads(tp_side_fn fn, void *arg, int *rc0, int *rc1)
{
    thread_pair t = {.fn = fn, .arg = arg, .rc0 = -1};
    pthread_mutex_init(&t.mu, NULL);
    pthread_cond_init(&t.cv, NULL);
    pthread_t dialer;
    ck_assert_int_eq(pthread_create(&dialer, NULL, rank0_main, &t), 0);
    *rc1 = side(1, NULL, publish_to_thread, &t, fn, arg);
    pthread_join(dialer, NULL);
    *rc0 = t.rc0;
    pthread_mutex_destroy(&t.mu);
    pthread_cond_destroy(&t.cv);
}

void tp_run_pair(tp_side_fn fn, void *arg, int *rc0, int *rc1)
{
    if (tp.in_process)
        run_threads(fn, arg, rc0, rc1);
    else
        run_processes(fn, arg, rc0, rc1);
}
