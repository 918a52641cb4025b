/* braid-bench: nccl-tests style all-reduce and broadcast benchmark for
 * braid. See `braid-bench --help` and bench/README.md. */
#include <stdio.h>

#include "bench.h"

int main(int argc, char **argv)
{
    bench_opts opts;
    /* Rows appear as they are measured, also through a pipe. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    int prc = bench_parse_args(argc, argv, &opts);
    if (prc != 0)
        return prc > 0 ? BENCH_EXIT_OK : BENCH_EXIT_USAGE;
    if (bench_have_launcher_env())
        return bench_run_env(&opts);
    return bench_spawn_local(&opts);
}
