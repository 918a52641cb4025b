/* How braid-bench gets its ranks: from a launcher (torchrun, mpirun, srun)
 * through braid_pg_init_env, or by forking -N ranks on this host after
 * making a unique id in the parent, the way a trainer that spawns its own
 * workers would use braid_unique_id + braid_pg_init. */
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

int bench_run_env(const bench_opts *opts)
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
        fprintf(stderr, "braid-bench: ignoring -N %d: the launcher started %d ranks\n", opts->nranks,
                braid_pg_size(pg));
    int rc = bench_run(pg, opts);
    braid_pg_destroy(pg);
    return rc;
}

static int child_main(const bench_opts *opts, int rank, const braid_unique_id_t *id, pid_t parent)
{
    braid_config cfg;
    braid_pg *pg;
    /* A rank whose launcher died must not linger until its group timeout. */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent)
        return BENCH_EXIT_FAILED;
    bench_config(opts, &cfg);
    braid_status st = braid_pg_init(&pg, rank, opts->nranks, id, &cfg);
    if (st != BRAID_OK) {
        fprintf(stderr, "braid-bench: rank %d/%d: joining the group failed: %s\n", rank, opts->nranks,
                bench_error_text(st));
        return BENCH_EXIT_FAILED;
    }
    int rc = bench_run(pg, opts);
    braid_pg_destroy(pg);
    return rc;
}

/* Worse outcomes win when ranks disagree. */
static int severity(int code)
{
    return code == BENCH_EXIT_OK ? 0 : code == BENCH_EXIT_WRONG ? 1 : code == BENCH_EXIT_USAGE ? 2 : 3;
}

int bench_spawn_local(const bench_opts *opts)
{
    int n = opts->nranks;
    braid_unique_id_t id;
    braid_status st = braid_unique_id(&id);
    if (st != BRAID_OK) {
        fprintf(stderr, "braid-bench: creating the unique id failed: %s\n", bench_error_text(st));
        return BENCH_EXIT_FAILED;
    }
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
            int crc = child_main(opts, r, &id, self);
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
