/* How braid-bench gets its ranks: from a launcher (torchrun, mpirun, srun)
 * through braid_pg_init_env, or by forking ranks on this host after making
 * a unique id in the parent, the way a trainer that spawns its own workers
 * would use braid_unique_id + braid_pg_init. Like nccl-tests, a process
 * may run -t x -g ranks: under a launcher it forks them, each with its own
 * RANK / WORLD_SIZE / LOCAL_RANK derived from the launcher's. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

/* The rank/size pairs braid_pg_init_env reads, in its order. */
int bench_have_launcher_env(void)
{
    static const char *const pairs[][2] = {{"RANK", "WORLD_SIZE"},
                                           {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                                           {"PMI_RANK", "PMI_SIZE"},
                                           {"SLURM_PROCID", "SLURM_NTASKS"}};
    for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++)
        if (getenv(pairs[i][0]) && getenv(pairs[i][1]))
            return 1;
    return 0;
}

void bench_config(const bench_opts *opts, braid_config *cfg)
{
    braid_config init = BRAID_CONFIG_INIT;
    *cfg = init;
    cfg->algo = opts->algo;
    cfg->timeout_ms = opts->timeout_s * 1000;
}

/* One rank joining through the launcher environment (RANK etc. as set by
 * the launcher, or by spawn_env_ranks for -t x -g > 1). */
static int env_rank_main(const bench_opts *opts)
{
    braid_config cfg;
    braid_pg *pg;
    bench_config(opts, &cfg);
    braid_status st = braid_pg_init_env(&pg, &cfg);
    if (st != BRAID_OK) {
        fprintf(stderr, "braid-bench: joining the group from the launcher environment failed: %s\n",
                bench_error_text(st));
        return BENCH_EXIT_FAILED;
    }
    if (opts->nranks_given && opts->nranks != braid_pg_size(pg) && braid_pg_rank(pg) == 0)
        fprintf(stderr, "braid-bench: ignoring --nranks %d: the launcher started %d ranks\n", opts->nranks,
                braid_pg_size(pg));
    int rc = bench_run(pg, opts);
    braid_pg_destroy(pg);
    return rc;
}

/* What a forked rank runs: index r of the n this process spawns. */
typedef int (*rank_fn)(const bench_opts *opts, int r, int n, const void *arg);

static int local_rank_main(const bench_opts *opts, int rank, int n, const void *arg)
{
    braid_config cfg;
    braid_pg *pg;
    bench_config(opts, &cfg);
    braid_status st = braid_pg_init(&pg, rank, n, arg, &cfg);
    if (st != BRAID_OK) {
        fprintf(stderr, "braid-bench: rank %d/%d: joining the group failed: %s\n", rank, n, bench_error_text(st));
        return BENCH_EXIT_FAILED;
    }
    int rc = bench_run(pg, opts);
    braid_pg_destroy(pg);
    return rc;
}

/* The first set variable of names, as an integer; def when none is. */
static long env_first(const char *const *names, long def)
{
    for (; *names; names++) {
        const char *v = getenv(*names);
        if (v && *v)
            return strtol(v, NULL, 10);
    }
    return def;
}

static void set_env_long(const char *name, long v)
{
    char text[24];
    snprintf(text, sizeof(text), "%ld", v);
    setenv(name, text, 1);
}

/* Rank i of the k this launched process runs: rank r*k+i of s*k, local
 * rank l*k+i. RANK and WORLD_SIZE come first in braid_pg_init_env's
 * order, so they win over the launcher's own names. */
static int env_child_main(const bench_opts *opts, int i, int k, const void *arg)
{
    (void)arg;
    static const char *const rank_vars[] = {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", NULL};
    static const char *const size_vars[] = {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", NULL};
    static const char *const local_vars[] = {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", NULL};
    long r = env_first(rank_vars, 0), s = env_first(size_vars, 1), l = env_first(local_vars, 0);
    set_env_long("RANK", r * k + i);
    set_env_long("WORLD_SIZE", s * k);
    set_env_long("LOCAL_RANK", l * k + i);
    return env_rank_main(opts);
}

/* Worse outcomes win when ranks disagree. */
static int severity(int code)
{
    return code == BENCH_EXIT_OK ? 0 : code == BENCH_EXIT_WRONG ? 1 : code == BENCH_EXIT_USAGE ? 2 : 3;
}

/* Fork n ranks running fn and wait for them. */
static int spawn(const bench_opts *opts, int n, rank_fn fn, const void *arg)
{
    pid_t *pids = calloc((size_t)n, sizeof(*pids));
    if (!pids) {
        fprintf(stderr, "braid-bench: out of memory\n");
        return BENCH_EXIT_FAILED;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t self = getpid();
    int rc = 0, alive = 0;
    for (int r = 0; r < n; r++) {
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, "braid-bench: fork for rank %d failed: %s\n", r, strerror(errno));
            rc = BENCH_EXIT_FAILED;
            break;
        }
        if (pid == 0) {
            free(pids); /* the parent's bookkeeping */
            /* A rank whose launcher died must not linger until its group
             * timeout. */
            prctl(PR_SET_PDEATHSIG, SIGTERM);
            int crc = getppid() == self ? fn(opts, r, n, arg) : BENCH_EXIT_FAILED;
            fflush(stdout);
            _exit(crc);
        }
        pids[r] = pid;
        alive++;
    }

    /* The first rank whose braid call failed (or that died) stops the
     * others: they would otherwise wait for it until the group timeout.
     * Ranks we stop are not reported. */
    int stopping = rc != 0;
    if (stopping) {
        for (int r = 0; r < n; r++)
            if (pids[r] > 0)
                kill(pids[r], SIGTERM);
    }
    while (alive > 0) {
        int status;
        pid_t pid = waitpid(-1, &status, 0);
        if (pid < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        int r = 0;
        while (r < n && pids[r] != pid)
            r++;
        if (r == n)
            continue;
        pids[r] = 0;
        alive--;
        int code = WIFEXITED(status) ? WEXITSTATUS(status) : BENCH_EXIT_FAILED;
        if (code == BENCH_EXIT_OK || (stopping && WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM))
            continue;
        if (WIFSIGNALED(status))
            fprintf(stderr, "braid-bench: rank %d (pid %d) was killed by signal %d (%s)\n", r, (int)pid,
                    WTERMSIG(status), strsignal(WTERMSIG(status)));
        if (severity(code) > severity(rc))
            rc = code;
        if (!stopping && code != BENCH_EXIT_WRONG) {
            stopping = 1;
            for (int k = 0; k < n; k++)
                if (pids[k] > 0)
                    kill(pids[k], SIGTERM);
        }
    }
    free(pids);
    return rc;
}

int bench_local_ranks(const bench_opts *opts)
{
    if (opts->nranks_given)
        return opts->nranks;
    return opts->per_process_given ? opts->nthreads * opts->ngpus : opts->nranks;
}

int bench_spawn_local(const bench_opts *opts)
{
    braid_unique_id_t id;
    braid_status st = braid_unique_id(&id);
    if (st != BRAID_OK) {
        fprintf(stderr, "braid-bench: creating the unique id failed: %s\n", bench_error_text(st));
        return BENCH_EXIT_FAILED;
    }
    return spawn(opts, bench_local_ranks(opts), local_rank_main, &id);
}

int bench_run_env(const bench_opts *opts)
{
    int k = opts->nthreads * opts->ngpus;
    return k > 1 ? spawn(opts, k, env_child_main, NULL) : env_rank_main(opts);
}
