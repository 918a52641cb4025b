#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap/bootstrap.h"
#include "harness.h"
#include "reduce/reduce.h"
#include "stack_dump.h"

void (*harness_rank_setup)(int rank);

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int harness_run(int n, harness_rank_fn fn, void *arg, const braid_config *cfg, int timeout_s,
                harness_result *result)
{
    return harness_run_faulty(n, fn, arg, cfg, timeout_s, NULL, result);
}

int harness_run_faulty(int n, harness_rank_fn fn, void *arg, const braid_config *cfg, int timeout_s,
                       const harness_fault *fault, harness_result *result)
{
    harness_result local;
    harness_result *res = result ? result : &local;
    memset(res, 0, sizeof(*res));
    braid_unique_id_t id;
    if (braid_unique_id(&id) != BRAID_OK) {
        fprintf(stderr, "braid_unique_id: %s\n", braid_last_error());
        return n;
    }
    pid_t pids[64];
    int joined[2];
    if (pipe(joined) != 0)
        return n;
    double start = now_s();
    for (int r = 0; r < n; r++) {
        fflush(NULL);
        pids[r] = fork();
        if (pids[r] == 0) {
            close(joined[0]);
            if (harness_rank_setup)
                harness_rank_setup(r);
            braid_pg *pg;
            braid_status st = braid_pg_init(&pg, r, n, &id, cfg);
            if (st != BRAID_OK) {
                fprintf(stderr, "rank %d: init failed: %s\n", r, braid_last_error());
                _exit(10);
            }
            ssize_t wr = write(joined[1], "j", 1);
            (void)wr;
            close(joined[1]);
            int rc = fn(pg, arg);
            braid_pg_destroy(pg);
            _exit(rc);
        }
    }
    close(joined[1]);
    /* The children serve the id now; the parent's copy of the port goes. */
    braid_rendezvous rv;
    if (braid__unique_id_decode(&id, &rv) == BRAID_OK)
        braid__prebound_release(rv.port);
    fcntl(joined[0], F_SETFL, O_NONBLOCK);
    int njoined = 0;
    double all_joined_at = 0;
    int failures = 0, left = n;
    double deadline = start + timeout_s, fault_at = 0;
    int fault_pending = fault && fault->rank >= 0 && fault->rank < n;
    int fault_sig = fault && fault->signal ? fault->signal : SIGKILL;
    while (left > 0) {
        char jb[64];
        ssize_t got;
        while (njoined < n && (got = read(joined[0], jb, sizeof(jb))) > 0)
            if ((njoined += (int)got) == n)
                all_joined_at = now_s();
        if (fault_pending && all_joined_at > 0 && now_s() >= all_joined_at + fault->after_ms / 1000.0) {
            if (pids[fault->rank] > 0)
                kill(pids[fault->rank], fault_sig);
            fault_at = now_s();
            fault_pending = 0;
        }
        int status;
        pid_t p = waitpid(-1, &status, WNOHANG);
        if (p > 0) {
            for (int r = 0; r < n; r++) {
                if (pids[r] == p) {
                    res->exit_code[r] = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
                    int expected_death = fault && r == fault->rank && res->exit_code[r] == -fault_sig;
                    if (res->exit_code[r] != 0 && !expected_death)
                        failures++;
                    pids[r] = 0;
                    left--;
                }
            }
            continue;
        }
        if (now_s() > deadline) {
            for (int r = 0; r < n; r++) {
                if (pids[r] > 0) {
                    char what[32];
                    snprintf(what, sizeof(what), "rank %d", r);
                    stack_dump(pids[r], what);
                    kill(pids[r], SIGKILL);
                    waitpid(pids[r], NULL, 0);
                    fprintf(stderr, "rank %d still running after %d s: killed\n", r, timeout_s);
                    res->exit_code[r] = 124;
                    failures++;
                    left--;
                }
            }
            break;
        }
        usleep(1000);
    }
    close(joined[0]);
    res->seconds = now_s() - start;
    res->fault_to_end_s = fault_at > 0 ? now_s() - fault_at : 0;
    return failures;
}

int64_t harness_value(int rank, size_t i, uint32_t seed, int lo, int hi)
{
    uint64_t x = (uint64_t)rank * 0x9E3779B97F4A7C15ull ^ (uint64_t)i * 0xBF58476D1CE4E5B9ull ^ seed;
    x ^= x >> 31;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 29;
    return lo + (int64_t)(x % (uint64_t)(hi - lo + 1));
}

void harness_store(braid_dtype dtype, void *buf, size_t i, double v)
{
    switch (dtype) {
    case BRAID_F32: ((float *)buf)[i] = (float)v; break;
    case BRAID_F64: ((double *)buf)[i] = v; break;
    case BRAID_I8: ((int8_t *)buf)[i] = (int8_t)(int64_t)v; break;
    case BRAID_U8: ((uint8_t *)buf)[i] = (uint8_t)(int64_t)v; break;
    case BRAID_I32: ((int32_t *)buf)[i] = (int32_t)(int64_t)v; break;
    case BRAID_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case BRAID_F16:
    case BRAID_BF16: {
        float f = (float)v;
        braid__cast(dtype, (uint16_t *)buf + i, BRAID_F32, &f, 1);
        break;
    }
    default: abort();
    }
}

double harness_load(braid_dtype dtype, const void *buf, size_t i)
{
    switch (dtype) {
    case BRAID_F32: return ((const float *)buf)[i];
    case BRAID_F64: return ((const double *)buf)[i];
    case BRAID_I8: return ((const int8_t *)buf)[i];
    case BRAID_U8: return ((const uint8_t *)buf)[i];
    case BRAID_I32: return ((const int32_t *)buf)[i];
    case BRAID_I64: return (double)((const int64_t *)buf)[i];
    case BRAID_F16:
    case BRAID_BF16: {
        float f;
        braid__cast(BRAID_F32, &f, dtype, (const uint16_t *)buf + i, 1);
        return f;
    }
    default: abort();
    }
}

int harness_is_float(braid_dtype t)
{
    return t == BRAID_F32 || t == BRAID_F64 || t == BRAID_F16 || t == BRAID_BF16;
}

double harness_input(int rank, size_t i, uint32_t seed, braid_dtype t, braid_op op)
{
    int lo = -8, hi = 8;
    if (op == BRAID_PROD) {
        lo = t == BRAID_U8 ? 0 : -2;
        hi = 2;
    } else if (t == BRAID_U8) {
        lo = 0;
        hi = 20;
    }
    return (double)harness_value(rank, i, seed, lo, hi);
}

/* An exact integer result wrapped into the dtype, as two's complement does. */
static double wrap(braid_dtype t, int64_t v)
{
    switch (t) {
    case BRAID_I8: return (int8_t)(uint8_t)v;
    case BRAID_U8: return (uint8_t)v;
    case BRAID_I32: return (int32_t)(uint32_t)v;
    default: return (double)v;
    }
}

void harness_expected(braid_dtype t, braid_op op, int n, size_t i, uint32_t seed, void *out)
{
    if (op == BRAID_PROD && harness_is_float(t)) {
        double prod = 1; /* in floating point a zero product keeps the factors' sign */
        for (int r = 0; r < n; r++)
            prod *= harness_input(r, i, seed, t, op);
        harness_store(t, out, 0, prod);
        return;
    }
    int64_t acc = (int64_t)harness_input(0, i, seed, t, op);
    for (int r = 1; r < n; r++) {
        int64_t v = (int64_t)harness_input(r, i, seed, t, op);
        switch (op) {
        case BRAID_SUM:
        case BRAID_AVG: acc += v; break;
        case BRAID_PROD: acc = (int64_t)wrap(t, acc * v); break;
        case BRAID_MIN: acc = v < acc ? v : acc; break;
        case BRAID_MAX: acc = v > acc ? v : acc; break;
        default: abort();
        }
    }
    double result;
    if (op == BRAID_AVG && harness_is_float(t))
        result = t == BRAID_F64 ? (double)acc / n : (double)((float)acc / (float)n);
    else if (op == BRAID_AVG)
        result = (double)((int64_t)wrap(t, acc) / n);
    else
        result = harness_is_float(t) ? (double)acc : wrap(t, acc);
    harness_store(t, out, 0, result);
}

int harness_check_allreduce(braid_pg *pg, braid_dtype t, braid_op op, size_t count, int in_place, uint32_t seed)
{
    int rank = braid_pg_rank(pg), n = braid_pg_size(pg);
    size_t es = braid_dtype_size(t);
    unsigned char *send = malloc(count * es + 1), *recv = malloc(count * es + 1), *want = malloc(es);
    if (!send || !recv || !want)
        HARNESS_FAIL("rank %d: out of memory", rank);
    for (size_t i = 0; i < count; i++)
        harness_store(t, send, i, harness_input(rank, i, seed, t, op));
    memset(recv, 0xA5, count * es + 1);
    send[count * es] = 0x5A;
    if (braid_allreduce(pg, send, in_place ? send : recv, count, t, op, NULL, NULL) != BRAID_OK)
        HARNESS_FAIL("rank %d: allreduce(count=%zu dtype=%d op=%d) failed: %s", rank, count, t, op,
                     braid_last_error());
    unsigned char *out = in_place ? send : recv;
    if (out[count * es] != (in_place ? 0x5A : 0xA5))
        HARNESS_FAIL("rank %d: allreduce wrote past the end of its output", rank);
    for (size_t i = 0; i < count; i++) {
        harness_expected(t, op, n, i, seed, want);
        if (memcmp(out + i * es, want, es) != 0)
            HARNESS_FAIL("rank %d of %d: allreduce dtype=%d op=%d count=%zu %s: element %zu is %g, want %g", rank,
                         n, t, op, count, in_place ? "in-place" : "out-of-place", i, harness_load(t, out, i),
                         harness_load(t, want, 0));
    }
    free(send);
    free(recv);
    free(want);
    return 0;
}

int harness_until_failure(braid_pg *pg, void *arg)
{
    (void)arg;
    enum { N = 1 << 18 };
    static float buf[N];
    int rank = braid_pg_rank(pg);
    for (int iter = 0; iter < 100000; iter++) {
        for (int i = 0; i < N; i += 997)
            buf[i] = 1.0f;
        braid_status st = braid_allreduce(pg, buf, buf, N, BRAID_F32, BRAID_SUM, NULL, NULL);
        if (st == BRAID_OK)
            continue;
        if (st != BRAID_ERR_PEER && st != BRAID_ERR_TIMEOUT)
            HARNESS_FAIL("rank %d: unexpected %s: %s", rank, braid_status_string(st), braid_last_error());
        if (!strstr(braid_last_error(), "peer"))
            HARNESS_FAIL("rank %d: error does not name the peer: %s", rank, braid_last_error());
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        braid_status again = braid_allreduce(pg, buf, buf, N, BRAID_F32, BRAID_SUM, NULL, NULL);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double dt = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
        if (again != st || dt > 0.1)
            HARNESS_FAIL("rank %d: call after failure returned %s (want sticky %s at once)", rank,
                         braid_status_string(again), braid_status_string(st));
        return 0;
    }
    HARNESS_FAIL("rank %d: no failure seen", rank);
}

int harness_wait_child(pid_t pid, int timeout_s)
{
    return stack_dump_wait(pid, timeout_s, "child");
}

/* Free ports are picked below the kernel's ephemeral range, so that no
 * connect() or bind(0) elsewhere (gloo's pair listeners, other tests'
 * clients) can take one between this check and the rank's own bind. */
static int ephemeral_low(void)
{
    int lo = 32768, hi = 60999;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f) {
        if (fscanf(f, "%d %d", &lo, &hi) != 2)
            lo = 32768;
        fclose(f);
    }
    return lo;
}

static int port_free(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                            .sin_port = htons((uint16_t)port)};
    int ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    if (fd >= 0)
        close(fd);
    return ok;
}

int harness_free_port_pair(void)
{
    int lo = 10000, hi = ephemeral_low() - 2;
    if (hi - lo < 1000) { /* a machine with a wide ephemeral range */
        lo = 1025;
        hi = 9998;
    }
    unsigned seed = (unsigned)getpid() ^ (unsigned)time(NULL) ^ (unsigned)clock();
    for (int tries = 0; tries < 200; tries++) {
        int port = lo + (int)(rand_r(&seed) % (unsigned)(hi - lo));
        if (port_free(port) && port_free(port + 1))
            return port;
    }
    fprintf(stderr, "harness_free_port_pair: no two adjacent free ports in %d..%d\n", lo, hi + 1);
    abort();
}

void harness_setenv_int(const char *name, int v)
{
    char text[16];
    snprintf(text, sizeof(text), "%d", v);
    setenv(name, text, 1);
}
