/* Start-up mistakes a new user makes, and what braid says about them: a
 * rank that never starts, a store port held by another program, rank 0 not
 * running, a slow rank within the init timeout. Each case checks the text
 * every rank gets and how long it took to fail, with short timeouts. Ranks
 * are forked processes launched the torchrun way (RANK, WORLD_SIZE,
 * MASTER_ADDR, MASTER_PORT); each one's stderr (braid's log) goes to a file
 * the test reads back. */
#include <check.h>
#include <signal.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "braid.h"
#include "harness.h"

/* Ranks in the job (WORLD_SIZE): 3 unless a test says otherwise. */
#define NRANKS 4
static int world = 3;
#define DEADLINE_S 60
#define TEXT_MAX 4096

typedef struct {
    int status;       /* braid_pg_init_env's result, or -1 if the rank did not report */
    long elapsed_ms;  /* from the start of braid_pg_init_env to its return */
    char error[TEXT_MAX];
    char log[4 * TEXT_MAX];
} rank_result;

static long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000L + ts.tv_nsec / 1000000;
}


/* Variables set on every rank, then on the odd rank only: name, value
 * pairs, NULL-terminated (a NULL value unsets). */
#define ODD_RANK 2
static const char *all_env[9];
static const char *odd_env[9];

static void apply_env(const char *const *pairs)
{
    for (int i = 0; pairs[i]; i += 2) {
        if (pairs[i + 1])
            setenv(pairs[i], pairs[i + 1], 1);
        else
            unsetenv(pairs[i]);
    }
}

/* A job held formed while another starts (two jobs on one port): its
 * ranks write a byte to ready[1] once joined, then wait for hold[0] to
 * close before their all-reduce. -1 when no job is held. */
static int hold[2] = {-1, -1}, ready[2] = {-1, -1};
/* The slot that exits while the group forms (BRAID_TEST_EXIT_IN_INIT), -1: none. */
static int dies_in_init = -1;
/* The RANK each slot is started with: a slot may repeat a rank. */
static int rank_as[NRANKS] = {0, 1, 2, 3};

/* One rank: join after start_delay_ms, all-reduce once if that worked, and
 * write "status elapsed_ms error text" to out_fd. */
static int rank_main(int rank, int master_port, int start_delay_ms, int out_fd, int held)
{
    unsetenv("BRAID_STORE_PORT");
    unsetenv("BRAID_JOB_SECRET");
    setenv("BRAID_DEBUG", "WARN", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    harness_setenv_int("MASTER_PORT", master_port);
    harness_setenv_int("RANK", rank);
    harness_setenv_int("WORLD_SIZE", world);
    apply_env(all_env);
    if (rank == ODD_RANK)
        apply_env(odd_env);
    if (start_delay_ms > 0)
        usleep((useconds_t)start_delay_ms * 1000);
    braid_pg *pg = NULL;
    long t0 = now_ms();
    braid_status st = braid_pg_init_env(&pg, NULL);
    long elapsed = now_ms() - t0;
    char line[TEXT_MAX + 64];
    int n = snprintf(line, sizeof(line), "%d %ld %s", (int)st, elapsed, st == BRAID_OK ? "" : braid_last_error());
    if (st == BRAID_OK) {
        if (held) {
            char b = 'R', drain;
            ssize_t w = write(ready[1], &b, 1);
            (void)w;
            while (read(hold[0], &drain, 1) > 0) {
            }
        }
        int v = rank + 1;
        braid_status ar = braid_allreduce(pg, &v, &v, 1, BRAID_I32, BRAID_SUM, NULL, NULL);
        if (ar != BRAID_OK || v != world * (world + 1) / 2)
            n = snprintf(line, sizeof(line), "%d %ld allreduce: %s (v=%d)", (int)BRAID_ERR_INTERNAL, elapsed,
                         braid_last_error(), v);
        braid_pg_destroy(pg);
    }
    ssize_t w = write(out_fd, line, (size_t)n);
    (void)w;
    return 0;
}

static void read_file(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
    buf[n] = '\0';
    if (f)
        fclose(f);
    unlink(path);
}

/* Ranks started and not yet collected. */
typedef struct {
    pid_t pids[NRANKS];
    int pipes[NRANKS][2];
    char logs[NRANKS][64];
} launched;

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

/* Start the slots in `which` (a bit mask), each after its delay, as the
 * ranks rank_as names; held: they wait on `hold` once joined. */
static void start_ranks(int master_port, unsigned which, const int delay_ms[NRANKS], int held, launched *l)
{
    static int launches;
    launches++;
    for (int r = 0; r < NRANKS; r++) {
        l->pids[r] = -1;
        if (!(which & (1u << r)))
            continue;
        snprintf(l->logs[r], sizeof(l->logs[r]), "/tmp/braid-startup-%d-%d-%d.log", (int)getpid(), launches, r);
        unlink(l->logs[r]);
        ck_assert_int_eq(pipe(l->pipes[r]), 0);
        l->pids[r] = fork();
        ck_assert_int_ge(l->pids[r], 0);
        if (l->pids[r] == 0) {
            alarm(DEADLINE_S);
            close(l->pipes[r][0]);
            close_fd(&hold[1]);
            close_fd(&ready[0]);
            if (!held) {
                close_fd(&hold[0]);
                close_fd(&ready[1]);
            }
            FILE *f = freopen(l->logs[r], "a", stderr);
            (void)f;
            _exit(rank_main(rank_as[r], master_port, delay_ms ? delay_ms[r] : 0, l->pipes[r][1], held));
        }
        close(l->pipes[r][1]);
    }
}

/* Collect what each started slot reported; the others report status -1. */
static void collect_ranks(launched *l, rank_result res[NRANKS])
{
    for (int r = 0; r < NRANKS; r++) {
        memset(&res[r], 0, sizeof(res[r]));
        res[r].status = -1;
        if (l->pids[r] < 0)
            continue;
        char line[TEXT_MAX + 64];
        ssize_t got = 0, n;
        while ((n = read(l->pipes[r][0], line + got, sizeof(line) - 1 - (size_t)got)) > 0)
            got += n;
        line[got > 0 ? got : 0] = '\0';
        close(l->pipes[r][0]);
        int status;
        ck_assert_int_eq(waitpid(l->pids[r], &status, 0), l->pids[r]);
        if (r == dies_in_init && WIFEXITED(status) && WEXITSTATUS(status) == 3) {
            res[r].status = -2; /* exited in init, as the test asked (BRAID_TEST_EXIT_IN_INIT) */
            read_file(l->logs[r], res[r].log, sizeof(res[r].log));
            continue;
        }
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "slot %d died (status %#x)", r, status);
        int off = 0;
        ck_assert_msg(sscanf(line, "%d %ld %n", &res[r].status, &res[r].elapsed_ms, &off) == 2,
                      "slot %d reported '%s'", r, line);
        snprintf(res[r].error, sizeof(res[r].error), "%s", line + off);
        read_file(l->logs[r], res[r].log, sizeof(res[r].log));
        printf("slot %d (rank %d): status %d after %ld ms: %s\n%s", r, rank_as[r], res[r].status,
               res[r].elapsed_ms, res[r].error, res[r].log);
    }
}

/* Start the ranks in `which` and collect what each reported. */
static void run_ranks(int master_port, unsigned which, const int delay_ms[NRANKS], rank_result res[NRANKS])
{
    launched l;
    start_ranks(master_port, which, delay_ms, 0, &l);
    collect_ranks(&l, res);
}

static int count_of(const char *text, const char *needle)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    return n;
}

#define ASSERT_HAS(text, needle) \
    ck_assert_msg(strstr((text), (needle)) != NULL, "'%s' not in: %s", (needle), (text))

/* Rank 2 never starts. Rank 0 says so at the start and every period (a
 * quarter of the init timeout here), then fails naming rank 2 and the
 * store; rank 1 fails at the same moment with rank 0's words. */
START_TEST(test_rank_never_joins)
{
    int port = harness_free_port_pair();
    setenv("BRAID_INIT_TIMEOUT_MS", "4000", 1);
    rank_result res[NRANKS];
    run_ranks(port, 0x3, NULL, res);
    char store[64];
    snprintf(store, sizeof(store), "127.0.0.1:%d", port + 1);
    for (int r = 0; r < 2; r++) {
        ck_assert_msg(res[r].status == BRAID_ERR_TIMEOUT, "rank %d: status %d: %s", r, res[r].status, res[r].error);
        ASSERT_HAS(res[r].error, "rank 2 never joined");
        ASSERT_HAS(res[r].error, "2 of 3 ranks reached the store at");
        ASSERT_HAS(res[r].error, store);
        ASSERT_HAS(res[r].error, "BRAID_INIT_TIMEOUT_MS");
        /* Not before the init timeout, and not much after it. */
        ck_assert_msg(res[r].elapsed_ms >= (r == 0 ? 3900 : 3000) && res[r].elapsed_ms < 15000,
                      "rank %d failed after %ld ms", r, res[r].elapsed_ms);
    }
    ASSERT_HAS(res[1].error, "rank 1: the group did not form; rank 0 reports: rank 0: rank 2 never joined");
    /* Not taken for a rank that joined and then stopped answering. */
    for (int r = 0; r < 2; r++)
        ck_assert_msg(!strstr(res[r].error, "stopped answering"), "rank %d: %s", r, res[r].error);
    /* Reports at about 1, 2 and 3 s: at least two even under load. */
    int reports = count_of(res[0].log, "2 of 3 ranks joined the store at");
    ck_assert_msg(reports >= 2 && reports <= 4, "%d reports in rank 0's log: %s", reports, res[0].log);
    ASSERT_HAS(res[0].log, "waiting for rank 2 (");
    ASSERT_HAS(res[0].log, " WARN ");
    /* The error itself is the caller's to print, not logged again as WARN. */
    ck_assert_msg(count_of(res[0].log, "never joined") == 0, "error logged as well: %s", res[0].log);
    /* The rank that did join says it waits, and for what. */
    ASSERT_HAS(res[0].log, "BRAID_INIT_TIMEOUT_MS)");
    int waits = count_of(res[1].log, "rank 1: joined the store at");
    ck_assert_msg(waits >= 2 && waits <= 4, "%d waiting lines in rank 1's log: %s", waits, res[1].log);
    ASSERT_HAS(res[1].log, "waiting for the other ranks (2 of 3 joined; ");
    ck_assert_msg(count_of(res[1].log, "never joined") == 0, "error logged as well: %s", res[1].log);
    unsetenv("BRAID_INIT_TIMEOUT_MS");
}
END_TEST

/* Two of four ranks never start: both are named, in the log and the error. */
START_TEST(test_two_ranks_never_join)
{
    int port = harness_free_port_pair();
    world = 4;
    setenv("BRAID_INIT_TIMEOUT_MS", "2000", 1);
    rank_result res[NRANKS];
    run_ranks(port, 0x3, NULL, res);
    for (int r = 0; r < 2; r++) {
        ck_assert_msg(res[r].status == BRAID_ERR_TIMEOUT, "rank %d: status %d: %s", r, res[r].status, res[r].error);
        ASSERT_HAS(res[r].error, "rank 0: ranks 2, 3 never joined: 2 of 4 ranks reached the store at");
    }
    ASSERT_HAS(res[0].log, "2 of 4 ranks joined the store at");
    ASSERT_HAS(res[0].log, "waiting for ranks 2, 3 (");
    unsetenv("BRAID_INIT_TIMEOUT_MS");
    world = 3;
}
END_TEST

/* Another program listens on MASTER_PORT + 1 and never answers. Rank 0
 * cannot bind it: BRAID_ERR_SYSTEM naming the variable and the fix, at
 * once. Rank 1 reaches the stranger and fails within a quarter of the init
 * timeout with the same advice, instead of waiting out the timeout. */
START_TEST(test_store_port_in_use)
{
    int port = harness_free_port_pair();
    int stranger = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)(port + 1)),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ck_assert_int_eq(bind(stranger, (struct sockaddr *)&a, sizeof(a)), 0);
    ck_assert_int_eq(listen(stranger, 16), 0);
    setenv("BRAID_INIT_TIMEOUT_MS", "20000", 1);
    rank_result res[NRANKS];
    run_ranks(port, 0x3, NULL, res);
    close(stranger);
    char what[96];
    snprintf(what, sizeof(what), "port %d (chosen by MASTER_PORT+1)", port + 1);
    for (int r = 0; r < 2; r++) {
        ASSERT_HAS(res[r].error, what);
        ASSERT_HAS(res[r].error, "set BRAID_STORE_PORT to a free port on every rank");
    }
    ck_assert_msg(res[0].status == BRAID_ERR_SYSTEM, "rank 0: status %d: %s", res[0].status, res[0].error);
    ASSERT_HAS(res[0].error, "Address already in use");
    ck_assert_msg(res[0].elapsed_ms < 3000, "rank 0 failed after %ld ms", res[0].elapsed_ms);
    ck_assert_msg(res[1].status == BRAID_ERR_PEER, "rank 1: status %d: %s", res[1].status, res[1].error);
    ASSERT_HAS(res[1].error, "did not answer braid's store handshake within 5000 ms: not a braid store");
    ck_assert_msg(res[1].elapsed_ms >= 4900 && res[1].elapsed_ms < 15000, "rank 1 failed after %ld ms",
                  res[1].elapsed_ms);
    unsetenv("BRAID_INIT_TIMEOUT_MS");
}
END_TEST

/* Rank 0 is not running: the others say where they looked and what to
 * check, when the init timeout passes. */
START_TEST(test_rank0_missing)
{
    int port = harness_free_port_pair();
    setenv("BRAID_INIT_TIMEOUT_MS", "2000", 1);
    rank_result res[NRANKS];
    run_ranks(port, 0x2, NULL, res);
    char what[96];
    snprintf(what, sizeof(what), "rank 1: rank 0's store at 127.0.0.1:%d did not come up within 2000 ms", port + 1);
    ck_assert_msg(res[1].status == BRAID_ERR_TIMEOUT, "rank 1: status %d: %s", res[1].status, res[1].error);
    ASSERT_HAS(res[1].error, what);
    ASSERT_HAS(res[1].error, "is rank 0 running, and is MASTER_ADDR its address?");
    ck_assert_msg(res[1].elapsed_ms >= 1900 && res[1].elapsed_ms < 12000, "rank 1 failed after %ld ms",
                  res[1].elapsed_ms);
    unsetenv("BRAID_INIT_TIMEOUT_MS");
}
END_TEST

/* The init timeout is not the collective timeout: a rank that starts 4 s
 * late joins a group whose collectives time out after 2 s. */
START_TEST(test_init_timeout_separate)
{
    int port = harness_free_port_pair();
    setenv("BRAID_TIMEOUT_MS", "2000", 1);
    setenv("BRAID_INIT_TIMEOUT_MS", "30000", 1);
    const int delays[NRANKS] = {0, 0, 4000, 0};
    rank_result res[NRANKS];
    run_ranks(port, 0x7, delays, res);
    for (int r = 0; r < world; r++)
        ck_assert_msg(res[r].status == BRAID_OK, "rank %d: status %d: %s", r, res[r].status, res[r].error);
    ck_assert_msg(res[0].elapsed_ms >= 3900, "rank 0 joined after %ld ms", res[0].elapsed_ms);
    ASSERT_HAS(res[0].log, "waiting for rank 2 (");
    unsetenv("BRAID_TIMEOUT_MS");
    unsetenv("BRAID_INIT_TIMEOUT_MS");
}
END_TEST

/* A private key file for the ranks (BRAID_KEY_FILE), 64 hex digits from
 * seed, mode 0600. */
static void make_key_file(char *path, size_t cap, int seed)
{
    snprintf(path, cap, "/tmp/braid-startup-key-%d-%d", (int)getpid(), seed);
    unlink(path);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < 32; i++)
        fprintf(f, "%02x", (unsigned)((seed * 37 + i * 11) & 0xff));
    fputc('\n', f);
    fclose(f);
    ck_assert_int_eq(chmod(path, 0600), 0);
}

#define SECRET_A "00112233445566778899aabbccddeeff"
#define SECRET_B "ffeeddccbbaa99887766554433221100"

/* One parameter differs on rank 2. Every rank fails with BRAID_ERR_MISMATCH
 * naming it and both values, long before the 30 s init timeout: the
 * secret-bound ones through rank 2's claim proven by the shared key file. */
static const struct {
    const char *name;
    const char *all[8];
    const char *odd[8];
    const char *cause; /* in every rank's error */
    const char *odd_value, *rest_value;
} mismatch_cases[] = {
    {"world size", {NULL}, {"WORLD_SIZE", "4", NULL}, "WORLD_SIZE differs: ", "4 at rank 2", "3 at rank 0"},
    {"launcher job id", {"TORCHELASTIC_RUN_ID", "job-a", NULL}, {"TORCHELASTIC_RUN_ID", "job-b", NULL},
     "launcher job id differs: ", "'job-b' at rank 2", "'job-a' at rank 0"},
    {"secret source", {NULL}, {"BRAID_JOB_SECRET", SECRET_B, NULL}, "job secret source differs: ",
     "BRAID_JOB_SECRET at rank 2", "key file at rank 0"},
    {"checksum", {"BRAID_CHECKSUM", "0", NULL}, {"BRAID_CHECKSUM", "1", NULL}, "BRAID_CHECKSUM differs: ",
     "on at rank 2", "off at rank 0"},
    {"job secret", {"BRAID_JOB_SECRET", SECRET_A, NULL}, {"BRAID_JOB_SECRET", SECRET_B, NULL},
     "job secret differs (id ", "BRAID_JOB_SECRET differs", " at rank 0"},
};

START_TEST(test_params_mismatch)
{
    char key[128];
    make_key_file(key, sizeof(key), 1);
    int n = 0;
    all_env[n++] = "BRAID_KEY_FILE";
    all_env[n++] = key;
    for (int i = 0; mismatch_cases[_i].all[i]; i += 2) {
        all_env[n++] = mismatch_cases[_i].all[i];
        all_env[n++] = mismatch_cases[_i].all[i + 1];
    }
    all_env[n] = NULL;
    memcpy(odd_env, mismatch_cases[_i].odd, sizeof(mismatch_cases[_i].odd));
    int port = harness_free_port_pair();
    setenv("BRAID_INIT_TIMEOUT_MS", "30000", 1);
    rank_result res[NRANKS];
    run_ranks(port, 0x7, NULL, res);
    printf("case %s\n", mismatch_cases[_i].name);
    fflush(stdout);
    for (int r = 0; r < world; r++) {
        ck_assert_msg(res[r].status == BRAID_ERR_MISMATCH, "rank %d: status %d: %s", r, res[r].status,
                      res[r].error);
        ASSERT_HAS(res[r].error, mismatch_cases[_i].cause);
        ASSERT_HAS(res[r].error, mismatch_cases[_i].odd_value);
        ASSERT_HAS(res[r].error, mismatch_cases[_i].rest_value);
        char who[32];
        snprintf(who, sizeof(who), "rank %d: ", r);
        ASSERT_HAS(res[r].error, who);
        /* At once: not the init timeout, which is 30 s. */
        ck_assert_msg(res[r].elapsed_ms < 5000, "rank %d failed after %ld ms", r, res[r].elapsed_ms);
    }
    /* Told once: the error is the caller's, not logged again. */
    for (int r = 0; r < world; r++)
        ck_assert_msg(count_of(res[r].error, mismatch_cases[_i].cause) == 1, "rank %d: %s", r, res[r].error);
    unsetenv("BRAID_INIT_TIMEOUT_MS");
    all_env[0] = odd_env[0] = NULL;
    unlink(key);
}
END_TEST

/* Rank 2 reads another key file: its secret differs, and its claim does
 * not verify under rank 0's key. An unproven claim must not fail the job,
 * and the store shows nothing derived from its secret to a process that
 * has not proven it: rank 2 fails at once, its proof refused, naming the
 * likely cause from its own secret's source; the others wait for a rank 2
 * until the init timeout, as they would for any stranger. */
START_TEST(test_unproven_claim_fails_nobody)
{
    char key_a[128], key_b[128];
    make_key_file(key_a, sizeof(key_a), 1);
    make_key_file(key_b, sizeof(key_b), 2);
    const char *all[] = {"BRAID_KEY_FILE", key_a, NULL};
    const char *odd[] = {"BRAID_KEY_FILE", key_b, NULL};
    memcpy(all_env, all, sizeof(all));
    memcpy(odd_env, odd, sizeof(odd));
    int port = harness_free_port_pair();
    setenv("BRAID_INIT_TIMEOUT_MS", "3000", 1);
    rank_result res[NRANKS];
    run_ranks(port, 0x7, NULL, res);
    ck_assert_msg(res[2].status == BRAID_ERR_AUTH, "rank 2: status %d: %s", res[2].status, res[2].error);
    ASSERT_HAS(res[2].error, "did not accept our proof of the job secret (the hosts do not share the key file "
                             "(BRAID_KEY_FILE), or the port is another job's)");
    ck_assert_msg(res[2].elapsed_ms < 2000, "rank 2 failed after %ld ms", res[2].elapsed_ms);
    for (int r = 0; r < 2; r++) {
        ck_assert_msg(res[r].status == BRAID_ERR_TIMEOUT, "rank %d: status %d: %s", r, res[r].status, res[r].error);
        ASSERT_HAS(res[r].error, "rank 2 never joined");
        ck_assert_msg(res[r].elapsed_ms >= 2900, "rank %d failed after %ld ms", r, res[r].elapsed_ms);
    }
    ASSERT_HAS(res[0].log, "wrong proof");
    unsetenv("BRAID_INIT_TIMEOUT_MS");
    all_env[0] = odd_env[0] = NULL;
    unlink(key_a);
    unlink(key_b);
}
END_TEST

/* Wait until n held ranks have joined (a byte each on ready[0]). */
static void await_ready(int n)
{
    long until = now_ms() + 30000;
    for (int got = 0; got < n;) {
        struct pollfd p = {.fd = ready[0], .events = POLLIN};
        ck_assert_msg(now_ms() < until && poll(&p, 1, 1000) >= 0, "%d of %d held ranks joined", got, n);
        char b;
        if (p.revents && read(ready[0], &b, 1) == 1)
            got++;
    }
}

/* Job A has formed and runs; job B is started on A's MASTER_PORT. B's rank
 * 0 cannot serve the store (the port is A's); B's other ranks prove A's
 * secret (no launcher job id: both derive the same one) and must be turned
 * away at once, naming the cause, instead of joining A's store and waiting
 * out BRAID_TIMEOUT_MS. A is not disturbed. */
START_TEST(test_two_jobs_one_port)
{
    int port = harness_free_port_pair();
    setenv("BRAID_INIT_TIMEOUT_MS", "20000", 1);
    ck_assert_int_eq(pipe(hold), 0);
    ck_assert_int_eq(pipe(ready), 0);
    launched a;
    start_ranks(port, 0x7, NULL, 1, &a);
    close_fd(&hold[0]);
    close_fd(&ready[1]);
    await_ready(world);
    rank_result b[NRANKS], res_a[NRANKS];
    run_ranks(port, 0x7, NULL, b);
    close_fd(&hold[1]);
    collect_ranks(&a, res_a);
    close_fd(&ready[0]);
    for (int r = 0; r < world; r++)
        ck_assert_msg(res_a[r].status == BRAID_OK, "job A rank %d: status %d: %s", r, res_a[r].status,
                      res_a[r].error);
    ck_assert_msg(b[0].status == BRAID_ERR_SYSTEM, "job B rank 0: status %d: %s", b[0].status, b[0].error);
    ASSERT_HAS(b[0].error, "Address already in use");
    for (int r = 1; r < world; r++) {
        ck_assert_msg(b[r].status == BRAID_ERR_MISMATCH, "job B rank %d: status %d: %s", r, b[r].status,
                      b[r].error);
        ASSERT_HAS(b[r].error, "refused: every rank of that store's job (3 ranks) has joined it already: it is "
                               "another job's store");
        ck_assert_msg(b[r].elapsed_ms < 3000, "job B rank %d failed after %ld ms", r, b[r].elapsed_ms);
    }
    ASSERT_HAS(res_a[0].log, "every one of the job's 3 ranks has joined, so it belongs to another job");
    unsetenv("BRAID_INIT_TIMEOUT_MS");
}
END_TEST

/* Two processes are started as rank 1 (slot 3 a moment after slot 1),
 * before rank 2 has started. The store fails the job at the second one:
 * every process stops at once with the cause, rank 2 too when it comes. */
START_TEST(test_rank_started_twice)
{
    int port = harness_free_port_pair();
    setenv("BRAID_INIT_TIMEOUT_MS", "20000", 1);
    rank_as[3] = 1;
    const int delays[NRANKS] = {0, 0, 2500, 800};
    rank_result res[NRANKS];
    run_ranks(port, 0xf, delays, res);
    rank_as[3] = 3;
    for (int r = 0; r < NRANKS; r++)
        ck_assert_msg(res[r].status == BRAID_ERR_MISMATCH, "slot %d: status %d: %s", r, res[r].status, res[r].error);
    ASSERT_HAS(res[3].error, "refused: another connected process holds rank 1 there, and the store fails its job");
    for (int r = 0; r < 3; r++) {
        ASSERT_HAS(res[r].error, "rank 1 joined twice, from 127.0.0.1:");
        ASSERT_HAS(res[r].error, "two processes were given one RANK, or another job uses this port");
    }
    ck_assert_msg(res[3].elapsed_ms < 3000, "slot 3 failed after %ld ms", res[3].elapsed_ms);
    ck_assert_msg(res[0].elapsed_ms < 6000 && res[1].elapsed_ms < 6000, "ranks 0 and 1 failed after %ld, %ld ms",
                  res[0].elapsed_ms, res[1].elapsed_ms);
    ck_assert_msg(res[2].elapsed_ms < 3000, "rank 2 failed after %ld ms", res[2].elapsed_ms);
    unsetenv("BRAID_INIT_TIMEOUT_MS");
}
END_TEST

/* One process's launch variables make it no rank of the job: RANK=2 with
 * WORLD_SIZE=2 in a job of 3, or RANK=3 in a job of 3. It cannot join,
 * but it can reach the store: it says why it leaves there, and every rank
 * fails at once with that reason instead of waiting for a rank 2. */
static const struct {
    const char *odd[8];
    const char *own;    /* in the odd process's error */
    const char *others; /* in the others' */
    long rank0_ms;      /* rank 0's bound: it serves the store up to 5 s for a rank not yet told */
} launch_cases[] = {
    {{"WORLD_SIZE", "2", NULL}, "rank 2: RANK=2 is not below WORLD_SIZE=2: this process cannot be a rank of a job of 2",
     "was started as rank 2 with a world size of 2 (its RANK is not below its WORLD_SIZE; this job has 3 ranks)",
     3000},
    {{"RANK", "3", NULL}, "rank 3: RANK=3 is not below WORLD_SIZE=3: this process cannot be a rank of a job of 3",
     "was started as rank 3 with a world size of 3 (its RANK is not below its WORLD_SIZE; this job has 3 ranks)",
     8000},
};

START_TEST(test_launch_env_wrong_on_one_rank)
{
    memcpy(odd_env, launch_cases[_i].odd, sizeof(launch_cases[_i].odd));
    int port = harness_free_port_pair();
    setenv("BRAID_INIT_TIMEOUT_MS", "30000", 1);
    rank_result res[NRANKS];
    run_ranks(port, 0x7, NULL, res);
    odd_env[0] = NULL;
    ck_assert_msg(res[2].status == BRAID_ERR_INVALID_ARG, "odd rank: status %d: %s", res[2].status, res[2].error);
    ASSERT_HAS(res[2].error, launch_cases[_i].own);
    ASSERT_HAS(res[2].error, "told rank 0's store at 127.0.0.1:");
    for (int r = 0; r < 2; r++) {
        ck_assert_msg(res[r].status == BRAID_ERR_MISMATCH, "rank %d: status %d: %s", r, res[r].status, res[r].error);
        ASSERT_HAS(res[r].error, launch_cases[_i].others);
        ASSERT_HAS(res[r].error, "its launch variables are wrong, and it left");
    }
    for (int r = 1; r < 3; r++)
        ck_assert_msg(res[r].elapsed_ms < 3000, "slot %d failed after %ld ms", r, res[r].elapsed_ms);
    ck_assert_msg(res[0].elapsed_ms < launch_cases[_i].rank0_ms, "rank 0 failed after %ld ms", res[0].elapsed_ms);
    unsetenv("BRAID_INIT_TIMEOUT_MS");
}
END_TEST

/* A stranger floods the store's port while the job forms: a process that
 * connects as fast as it can, keeps up to FLOOD_HELD connections open
 * (silent) and closes the oldest to make room. Every start must still
 * succeed: a member's connection is never the one evicted once its hello
 * has arrived, and a member that is dropped before retries. */
#define FLOOD_HELD 2000
#define FLOOD_STARTS 3

static void flooder_main(int port)
{
    static int fds[FLOOD_HELD];
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    for (int i = 0; i < FLOOD_HELD; i++)
        fds[i] = -1;
    for (long n = 0;; n++) {
        int *slot = &fds[n % FLOOD_HELD];
        if (*slot >= 0)
            close(*slot);
        *slot = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        if (*slot >= 0 && connect(*slot, (struct sockaddr *)&a, sizeof(a)) != 0 && errno != EINPROGRESS) {
            close(*slot);
            *slot = -1;
            usleep(1000); /* the store is not up yet */
        }
    }
}

START_TEST(test_start_under_flood)
{
    setenv("BRAID_INIT_TIMEOUT_MS", "30000", 1);
    for (int t = 0; t < FLOOD_STARTS; t++) {
        int port = harness_free_port_pair();
        pid_t flooder = fork();
        ck_assert_int_ge(flooder, 0);
        if (flooder == 0) {
            alarm(DEADLINE_S);
            flooder_main(port + 1);
        }
        rank_result res[NRANKS];
        run_ranks(port, 0x7, NULL, res);
        kill(flooder, SIGKILL);
        waitpid(flooder, NULL, 0);
        for (int r = 0; r < world; r++)
            ck_assert_msg(res[r].status == BRAID_OK, "start %d, rank %d: status %d after %ld ms: %s", t, r,
                          res[r].status, res[r].elapsed_ms, res[r].error);
    }
    unsetenv("BRAID_INIT_TIMEOUT_MS");
}
END_TEST

/* Rank 2 dies right after every rank reached the store, while the group
 * forms. The others stop within the init timeout (3 s here), not after
 * BRAID_TIMEOUT_MS (300 s by default), which bounds the group's calls. */
START_TEST(test_rank_dies_while_forming)
{
    int port = harness_free_port_pair();
    setenv("BRAID_INIT_TIMEOUT_MS", "3000", 1);
    unsetenv("BRAID_TIMEOUT_MS");
    const char *odd[] = {"BRAID_TEST_EXIT_IN_INIT", "joined", NULL};
    memcpy(odd_env, odd, sizeof(odd));
    dies_in_init = ODD_RANK;
    rank_result res[NRANKS];
    run_ranks(port, 0x7, NULL, res);
    dies_in_init = -1;
    odd_env[0] = NULL;
    ck_assert_int_eq(res[2].status, -2);
    for (int r = 0; r < 2; r++) {
        ck_assert_msg(res[r].status == BRAID_ERR_TIMEOUT || res[r].status == BRAID_ERR_PEER,
                      "rank %d: status %d: %s", r, res[r].status, res[r].error);
        ck_assert_msg(res[r].elapsed_ms < 8000, "rank %d failed after %ld ms", r, res[r].elapsed_ms);
        if (res[r].status == BRAID_ERR_TIMEOUT)
            ASSERT_HAS(res[r].error, "the group did not form within the init timeout (3000 ms, "
                                     "BRAID_INIT_TIMEOUT_MS): every rank had reached the store, then one stopped "
                                     "answering (died?)");
    }
    unsetenv("BRAID_INIT_TIMEOUT_MS");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("startup");
    TCase *tc = tcase_create("startup");
    tcase_set_timeout(tc, DEADLINE_S + 10);
    tcase_add_test(tc, test_rank_never_joins);
    tcase_add_test(tc, test_two_ranks_never_join);
    tcase_add_test(tc, test_store_port_in_use);
    tcase_add_test(tc, test_rank0_missing);
    tcase_add_test(tc, test_init_timeout_separate);
    tcase_add_loop_test(tc, test_params_mismatch, 0, (int)(sizeof(mismatch_cases) / sizeof(mismatch_cases[0])));
    tcase_add_test(tc, test_unproven_claim_fails_nobody);
    tcase_add_test(tc, test_two_jobs_one_port);
    tcase_add_test(tc, test_start_under_flood);
    tcase_add_test(tc, test_rank_dies_while_forming);
    tcase_add_test(tc, test_rank_started_twice);
    tcase_add_loop_test(tc, test_launch_env_wrong_on_one_rank, 0, (int)(sizeof(launch_cases) / sizeof(launch_cases[0])));
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
