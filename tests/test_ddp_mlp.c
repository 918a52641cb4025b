/* End-to-end data-parallel training: runs examples/ddp_mlp on 1, 2 and 4
 * ranks and checks what DDP promises.
 *
 * The reference is independent of braid: `ddp_mlp --reference` trains the
 * same model on the same data in one process with no process group and no
 * bucketer (whole global batch, plain SGD), so a bucketer bug that a
 * one-rank run shares with an N-rank run cannot hide.
 *
 *  - Every rank ends with bit-identical weights (they all apply the same
 *    averaged gradient, and the all-reduce hands every rank the same bits).
 *  - One rank through braid is bit-identical to the reference: the same
 *    forward and backward on the same batch, and AVG over one rank is the
 *    identity.
 *  - The N-rank run matches the reference:
 *    max |w_N - w_ref| <= 1e-5 * max(1, |w_ref|). The two compute the same
 *    mean gradient but add it up in a different order (per shard, then
 *    across ranks, versus one pass over the batch), so each step differs
 *    by a few float32 roundings (~1e-7 relative) that 20 SGD steps carry
 *    forward; 1e-5 leaves two orders of magnitude of margin over that and
 *    is far below what a wrong average does (summing instead of averaging
 *    scales every step by N).
 *  - The loss falls.
 *  - Marking gradients after backward (--no-overlap) changes only timing:
 *    same buckets, same all-reduces, bit-identical weights.
 *  - Launched through torchrun-style variables the trainer gets the same
 *    weights as when it forks its own ranks.
 *  - With f16 wire compression the ranks still agree bit for bit, the loss
 *    falls, and the weights stay within 1e-2 of the reference.
 *
 * The trainer binary comes from DDP_MLP (set by meson); without it the
 * test skips. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "harness.h"

#define RUN_TIMEOUT_S 240
#define SKIP 77

static const char *trainer;
static char workdir[256];

/* The model and data every run shares: small enough for a 2-core box,
 * with bucket caps that split it into several buckets. */
static const char *const common_args[] = {
    "--steps",           "20",   "--in",          "64", "--hidden", "256", "--batch", "64", "--bucket-mb", "0.1",
    "--first-bucket-mb", "0.02", "--print-every", "0",  "--warmup", "0",   NULL};

typedef struct {
    double first_loss, final_loss;
    int buckets;
    int reference; /* the RESULT line came from --reference */
} run_result;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Start the trainer with common_args + extra, stdout/stderr to log. env
 * entries ("NAME=value") are added to the environment. */
static pid_t start_trainer(const char *const *extra, const char *const *env, const char *log)
{
    const char *argv[64];
    int n = 0;
    argv[n++] = trainer;
    for (const char *const *a = common_args; *a; a++)
        argv[n++] = *a;
    for (const char *const *a = extra; a && *a; a++)
        argv[n++] = *a;
    argv[n] = NULL;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0)
            _exit(126);
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
        for (const char *const *e = env; e && *e; e++)
            putenv((char *)*e);
        execv(trainer, (char *const *)argv);
        _exit(127);
    }
    return pid;
}

static int wait_trainer(pid_t pid, const char *log)
{
    double deadline = now_s() + RUN_TIMEOUT_S;
    for (;;) {
        int status;
        pid_t p = waitpid(pid, &status, WNOHANG);
        if (p == pid) {
            int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            if (rc != 0) {
                fprintf(stderr, "trainer exited %d; its output (%s):\n", rc, log);
                FILE *f = fopen(log, "r");
                char line[512];
                while (f && fgets(line, sizeof(line), f))
                    fputs(line, stderr);
                if (f)
                    fclose(f);
            }
            return rc;
        }
        if (now_s() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            fprintf(stderr, "trainer still running after %d s: killed (log %s)\n", RUN_TIMEOUT_S, log);
            return 124;
        }
        usleep(20000);
    }
}

static void parse_result(const char *log, run_result *r)
{
    FILE *f = fopen(log, "r");
    ck_assert_msg(f != NULL, "cannot read %s", log);
    char line[1024];
    int found = 0;
    while (fgets(line, sizeof(line), f)) {
        const char *p = strstr(line, "RESULT ");
        if (!p)
            continue;
        const char *fl = strstr(p, "first_loss="), *ll = strstr(p, "final_loss="), *bk = strstr(p, "buckets=");
        ck_assert_msg(fl && ll && bk, "malformed RESULT line in %s: %s", log, line);
        r->first_loss = strtod(fl + 11, NULL);
        r->final_loss = strtod(ll + 11, NULL);
        r->buckets = atoi(bk + 8);
        r->reference = strstr(p, "reference=1") != NULL;
        found = 1;
    }
    fclose(f);
    ck_assert_msg(found, "no RESULT line in %s", log);
}

/* Run the trainer forking `ranks` local ranks (0: --reference, no braid);
 * weights go to <tag>.<rank>. */
static void run_local(const char *tag, int ranks, const char *const *extra, run_result *r)
{
    char nbuf[16], dump[512], log[512];
    snprintf(nbuf, sizeof(nbuf), "%d", ranks);
    snprintf(dump, sizeof(dump), "%s/%s", workdir, tag);
    snprintf(log, sizeof(log), "%s/%s.log", workdir, tag);
    const char *args[32] = {"--dump", dump, "-N", ranks > 0 ? nbuf : "1"};
    int n = 4;
    if (ranks == 0)
        args[n++] = "--reference";
    for (const char *const *a = extra; a && *a; a++)
        args[n++] = *a;
    args[n] = NULL;
    int rc = wait_trainer(start_trainer(args, NULL, log), log);
    ck_assert_msg(rc == 0, "trainer on %d ranks (%s) exited %d", ranks, tag, rc);
    parse_result(log, r);
}

static float *read_weights(const char *tag, int rank, size_t *count)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s.%d", workdir, tag, rank);
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "no weights dumped at %s: %s", path, strerror(errno));
    struct stat st;
    ck_assert(fstat(fileno(f), &st) == 0);
    size_t n = (size_t)st.st_size / sizeof(float);
    float *w = malloc(n * sizeof(float) + 1);
    ck_assert(w != NULL);
    ck_assert_msg(fread(w, sizeof(float), n, f) == n, "short read of %s", path);
    fclose(f);
    *count = n;
    return w;
}

/* Every rank of run `tag` holds exactly the weights of its rank 0. */
static void check_ranks_identical(const char *tag, int ranks)
{
    size_t n0;
    float *w0 = read_weights(tag, 0, &n0);
    ck_assert_msg(n0 > 0, "%s: empty weights", tag);
    for (int r = 1; r < ranks; r++) {
        size_t n;
        float *w = read_weights(tag, r, &n);
        ck_assert_msg(n == n0, "%s: rank %d has %zu weights, rank 0 %zu", tag, r, n, n0);
        for (size_t i = 0; i < n; i++)
            ck_assert_msg(memcmp(&w[i], &w0[i], sizeof(float)) == 0,
                          "%s: rank %d weight %zu is %.9g, rank 0 has %.9g (must be bit-identical)", tag, r, i, w[i],
                          w0[i]);
        free(w);
    }
    free(w0);
}

/* Largest |a - b| / max(1, |b|) between rank 0 of two runs. */
static double max_rel_diff(const char *a_tag, const char *b_tag)
{
    size_t na, nb;
    float *a = read_weights(a_tag, 0, &na), *b = read_weights(b_tag, 0, &nb);
    ck_assert_msg(na == nb, "%s has %zu weights, %s %zu", a_tag, na, b_tag, nb);
    double worst = 0;
    for (size_t i = 0; i < na; i++) {
        double d = fabs((double)a[i] - (double)b[i]) / fmax(1.0, fabs((double)b[i]));
        ck_assert_msg(isfinite(d), "%s weight %zu is not finite", a_tag, i);
        worst = fmax(worst, d);
    }
    free(a);
    free(b);
    return worst;
}

static run_result reference;

/* The reference: one process, the whole batch, no braid. Each test runs
 * in its own forked process, so each computes it (well under a second). */
static void ensure_reference(void)
{
    run_local("reference", 0, NULL, &reference);
    ck_assert_msg(reference.reference && reference.buckets == 0, "the --reference run did not report itself as one");
    ck_assert_msg(reference.final_loss < 0.9 * reference.first_loss, "reference loss did not fall: %.4f -> %.4f",
                  reference.first_loss, reference.final_loss);
}

static const int rank_counts[] = {1, 2, 4};

START_TEST(test_matches_reference)
{
    ensure_reference();
    int n = rank_counts[_i];
    char tag[32];
    snprintf(tag, sizeof(tag), "ddp%d", n);
    run_result r;
    run_local(tag, n, NULL, &r);
    check_ranks_identical(tag, n);
    double d = max_rel_diff(tag, "reference");
    fprintf(stderr, "%d ranks: loss %.4f -> %.4f (reference %.4f -> %.4f), %d buckets, max relative weight "
                    "difference to the reference %.3g\n",
            n, r.first_loss, r.final_loss, reference.first_loss, reference.final_loss, r.buckets, d);
    ck_assert_msg(!r.reference, "the %d-rank run took the reference path", n);
    ck_assert_msg(r.buckets >= 3, "only %d buckets: the test wants several", r.buckets);
    if (n == 1)
        ck_assert_msg(d == 0.0, "1 rank through braid differs from the reference by %.3g (must be bit-identical)", d);
    ck_assert_msg(d <= 1e-5, "%d ranks differ from the reference by %.3g > 1e-5", n, d);
    ck_assert_msg(r.final_loss < 0.9 * r.first_loss, "%d ranks: loss did not fall: %.4f -> %.4f", n, r.first_loss,
                  r.final_loss);
}
END_TEST

START_TEST(test_no_overlap_same_weights)
{
    /* Three ranks (an odd ring) need a batch that splits in three. */
    static const char *const overlap[] = {"--batch", "63", NULL};
    static const char *const no_overlap[] = {"--batch", "63", "--no-overlap", NULL};
    run_result a, b;
    run_local("overlap3", 3, overlap, &a);
    run_local("nooverlap3", 3, no_overlap, &b);
    check_ranks_identical("nooverlap3", 3);
    double d = max_rel_diff("nooverlap3", "overlap3");
    ck_assert_msg(d == 0.0, "--no-overlap changed the weights by %.3g (must be bit-identical)", d);
    ck_assert_msg(a.final_loss == b.final_loss, "losses differ: %.9g vs %.9g", a.final_loss, b.final_loss);
}
END_TEST

START_TEST(test_launcher_env)
{
    enum { N = 2 };
    run_result spawned;
    run_local("spawn2", N, NULL, &spawned);
    int port = harness_free_port_pair();
    ck_assert_msg(port > 0, "no free port pair on loopback");
    static char envs[N][4][64];
    pid_t pids[N];
    char dump[512], logs[N][512];
    snprintf(dump, sizeof(dump), "%s/env2", workdir);
    for (int r = 0; r < N; r++) {
        snprintf(envs[r][0], 64, "RANK=%d", r);
        snprintf(envs[r][1], 64, "WORLD_SIZE=%d", N);
        snprintf(envs[r][2], 64, "MASTER_ADDR=127.0.0.1");
        snprintf(envs[r][3], 64, "MASTER_PORT=%d", port);
        const char *env[] = {envs[r][0], envs[r][1], envs[r][2], envs[r][3], NULL};
        const char *args[] = {"--dump", dump, NULL};
        snprintf(logs[r], sizeof(logs[r]), "%s/env2.rank%d.log", workdir, r);
        pids[r] = start_trainer(args, env, logs[r]);
    }
    for (int r = 0; r < N; r++)
        ck_assert_msg(wait_trainer(pids[r], logs[r]) == 0, "rank %d under launcher variables failed", r);
    check_ranks_identical("env2", N);
    double d = max_rel_diff("env2", "spawn2");
    ck_assert_msg(d == 0.0, "launcher-env run differs from the self-spawned one by %.3g", d);
}
END_TEST

START_TEST(test_f16_compression)
{
    static const char *const f16[] = {"--compress", "f16", NULL};
    ensure_reference();
    run_result r;
    run_local("f16x2", 2, f16, &r);
    check_ranks_identical("f16x2", 2);
    double d = max_rel_diff("f16x2", "reference");
    fprintf(stderr, "f16 wire, 2 ranks: loss %.4f -> %.4f, max relative weight difference %.3g\n", r.first_loss,
            r.final_loss, d);
    ck_assert_msg(r.final_loss < 0.9 * r.first_loss, "f16: loss did not fall: %.4f -> %.4f", r.first_loss,
                  r.final_loss);
    /* f16 keeps 11 significant bits: each step's gradient is off by up to
     * ~2^-11 relative, times lr 0.05 over 20 steps. */
    ck_assert_msg(d <= 1e-2, "f16-compressed training strays %.3g from uncompressed", d);
    ck_assert_msg(d > 0.0, "f16 compression left the weights bit-identical: was it applied?");
}
END_TEST

static void cleanup(void)
{
    if (!workdir[0])
        return;
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", workdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", workdir);
}

int main(void)
{
    trainer = getenv("DDP_MLP");
    if (!trainer || access(trainer, X_OK) != 0) {
        printf("SKIP: examples/ddp_mlp not built (DDP_MLP=%s); configure with -Dexamples=true\n",
               trainer ? trainer : "(unset)");
        return SKIP;
    }
    snprintf(workdir, sizeof(workdir), "/tmp/braid-ddp-mlp-XXXXXX");
    if (!mkdtemp(workdir)) {
        perror("mkdtemp");
        return 1;
    }
    Suite *s = suite_create("ddp_mlp");
    TCase *tc = tcase_create("training");
    tcase_set_timeout(tc, 3 * RUN_TIMEOUT_S);
    tcase_add_loop_test(tc, test_matches_reference, 0, 3);
    tcase_add_test(tc, test_no_overlap_same_weights);
    tcase_add_test(tc, test_launcher_env);
    tcase_add_test(tc, test_f16_compression);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    cleanup();
    return failed ? 1 : 0;
}
