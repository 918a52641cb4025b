/* braid-bench: nccl-tests' benchmarks (all_reduce_perf, all_gather_perf,
 * ...) on braid. See `braid-bench --help` and bench/README.md. */
#include <stdio.h>

#include "bench.h"

int main(int argc, char **argv)
{
    bench_opts opts;
    /* Rows appear as they are measured, also through a pipe. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    bench_memory_mark_process_start();
    int prc = bench_parse_args(argc, argv, &opts);
    if (prc != 0)
        return prc > 0 ? BENCH_EXIT_OK : BENCH_EXIT_USAGE;
    if (bench_have_launcher_env())
        return bench_run_env(&opts);
    /* Forked here, the ranks are this process's, as with braid-bench -t N:
     * the header's nThread counts them (it said 1 for the 4 ranks run
     * without arguments). */
    if (!opts.per_process_given)
        opts.nthreads = bench_local_ranks(&opts);
    return bench_spawn_local(&opts);
}
