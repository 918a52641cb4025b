/* braid_pg_init_env under each launcher's variables: forked ranks see only
 * what torchrun, mpirun or srun would set, join one group, all-reduce and
 * report their local rank. */
#include <check.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "braid.h"
#include "harness.h"

#define NRANKS 3
#define DEADLINE_S 60

typedef enum { TORCHRUN, OPEN_MPI, SLURM } launcher;


/* Only the chosen launcher's variables, as a fresh process would see them. */
static void set_launcher_env(launcher l, int rank, int master_port)
{
    static const char *const all[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK",
                                      "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK", "PMI_SIZE",
                                      "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_JOB_ID",
                                      "BRAID_JOB_SECRET", "BRAID_STORE_PORT", "BRAID_TIMEOUT_MS", NULL};
    for (const char *const *p = all; *p; p++)
        unsetenv(*p);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    harness_setenv_int("MASTER_PORT", master_port);
    /* Local ranks deliberately differ from the rank order, so the test
     * sees that the launcher's value wins. */
    int local = NRANKS - 1 - rank;
    switch (l) {
    case TORCHRUN:
        harness_setenv_int("RANK", rank);
        harness_setenv_int("WORLD_SIZE", NRANKS);
        harness_setenv_int("LOCAL_RANK", local);
        break;
    case OPEN_MPI:
        harness_setenv_int("OMPI_COMM_WORLD_RANK", rank);
        harness_setenv_int("OMPI_COMM_WORLD_SIZE", NRANKS);
        harness_setenv_int("OMPI_COMM_WORLD_LOCAL_RANK", local);
        break;
    case SLURM:
        harness_setenv_int("SLURM_PROCID", rank);
        harness_setenv_int("SLURM_NTASKS", NRANKS);
        harness_setenv_int("SLURM_LOCALID", local);
        setenv("SLURM_JOB_ID", "4242", 1);
        break;
    }
}

static int rank_main(launcher l, int rank, int master_port)
{
    set_launcher_env(l, rank, master_port);
    braid_pg *pg;
    braid_status st = braid_pg_init_env(&pg, NULL);
    if (st != BRAID_OK) {
        fprintf(stderr, "rank %d: init_env: %s\n", rank, braid_last_error());
        return 1;
    }
    int bad = braid_pg_rank(pg) != rank || braid_pg_size(pg) != NRANKS;
    bad |= braid_pg_local_rank(pg) != NRANKS - 1 - rank || braid_pg_local_size(pg) != NRANKS;
    int64_t v[5];
    for (int i = 0; i < 5; i++)
        v[i] = (int64_t)(rank + 1) * (i + 1);
    st = braid_allreduce(pg, v, v, 5, BRAID_I64, BRAID_SUM, NULL, NULL);
    for (int i = 0; i < 5 && st == BRAID_OK; i++)
        bad |= v[i] != (int64_t)(NRANKS * (NRANKS + 1) / 2) * (i + 1);
    if (st != BRAID_OK || bad)
        fprintf(stderr, "rank %d: %s, rank %d size %d local %d/%d, v[0]=%lld\n", rank,
                st == BRAID_OK ? "wrong values" : braid_last_error(), braid_pg_rank(pg), braid_pg_size(pg),
                braid_pg_local_rank(pg), braid_pg_local_size(pg), (long long)v[0]);
    braid_pg_destroy(pg);
    return st != BRAID_OK || bad;
}

static void run_launcher(launcher l)
{
    int port = harness_free_port_pair();
    pid_t pids[NRANKS];
    for (int r = 0; r < NRANKS; r++) {
        pids[r] = fork();
        ck_assert_int_ge(pids[r], 0);
        if (pids[r] == 0) {
            alarm(DEADLINE_S);
            _exit(rank_main(l, r, port));
        }
    }
    for (int r = 0; r < NRANKS; r++) {
        int status;
        ck_assert_int_eq(waitpid(pids[r], &status, 0), pids[r]);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "launcher %d: rank %d failed (status %#x)",
                      (int)l, r, status);
    }
}

START_TEST(test_torchrun) { run_launcher(TORCHRUN); }
END_TEST

START_TEST(test_open_mpi) { run_launcher(OPEN_MPI); }
END_TEST

START_TEST(test_slurm) { run_launcher(SLURM); }
END_TEST

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Rank `odd` is started with WORLD_SIZE 4, the others with 3. Every rank
 * must fail init with BRAID_ERR_MISMATCH naming WORLD_SIZE and both
 * values, long before the 60 s timeout. */
static void run_size_mismatch(int odd)
{
    int port = harness_free_port_pair();
    pid_t pids[NRANKS];
    double t0 = now_s();
    for (int r = 0; r < NRANKS; r++) {
        fflush(NULL);
        pids[r] = fork();
        ck_assert_int_ge(pids[r], 0);
        if (pids[r] == 0) {
            alarm(DEADLINE_S);
            set_launcher_env(TORCHRUN, r, port);
            if (r == odd)
                harness_setenv_int("WORLD_SIZE", NRANKS + 1);
            setenv("BRAID_TIMEOUT_MS", "60000", 1);
            braid_pg *pg;
            braid_status st = braid_pg_init_env(&pg, NULL);
            const char *e = braid_last_error();
            char want_odd[64], want_rest[64];
            snprintf(want_odd, sizeof(want_odd), "%d at rank %d", NRANKS + 1, odd);
            snprintf(want_rest, sizeof(want_rest), "%d at rank ", NRANKS);
            if (st == BRAID_OK) {
                fprintf(stderr, "rank %d: init succeeded with mixed world sizes\n", r);
                braid_pg_destroy(pg);
                _exit(1);
            }
            if (st != BRAID_ERR_MISMATCH || !strstr(e, "WORLD_SIZE differs") || !strstr(e, want_odd) ||
                !strstr(e, want_rest)) {
                fprintf(stderr, "rank %d: got %s: %s\n", r, braid_status_string(st), e);
                _exit(2);
            }
            _exit(0);
        }
    }
    for (int r = 0; r < NRANKS; r++) {
        int status;
        ck_assert_int_eq(waitpid(pids[r], &status, 0), pids[r]);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "odd rank %d: rank %d: status %#x", odd, r,
                      status);
    }
    /* Told at once, not by a timeout (rank 0's store lingers at most 5 s
     * for a rank that never comes). */
    ck_assert_double_lt(now_s() - t0, 15.0);
}

START_TEST(test_world_size_mismatch) { run_size_mismatch(_i == 0 ? NRANKS - 1 : 0); }
END_TEST

/* A local rank outside the job is the launcher's mistake, said clearly. */
START_TEST(test_bad_local_rank)
{
    set_launcher_env(TORCHRUN, 0, harness_free_port_pair());
    setenv("WORLD_SIZE", "1", 1);
    setenv("LOCAL_RANK", "7", 1);
    braid_pg *pg;
    ck_assert_int_eq(braid_pg_init_env(&pg, NULL), BRAID_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(braid_last_error(), "LOCAL_RANK=7"));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("launch_env");
    TCase *tc = tcase_create("launchers");
    tcase_set_timeout(tc, DEADLINE_S + 10);
    tcase_add_test(tc, test_torchrun);
    tcase_add_test(tc, test_open_mpi);
    tcase_add_test(tc, test_slurm);
    tcase_add_test(tc, test_bad_local_rank);
    tcase_add_loop_test(tc, test_world_size_mismatch, 0, 2);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
