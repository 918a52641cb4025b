/* Fault injection (fault_inject.h): reads the test hooks, through the
 * parameter table like every other variable, and nothing else. */
#include <string.h>
#include <unistd.h>

#include "fault_inject.h"
#include "param.h"

long long braid__fault_corrupt_chunk_at(void)
{
    return braid__param_int("BRAID_TEST_CORRUPT_CHUNK", 0);
}

int braid__fault_cuda_direct(void)
{
    /* only the first character counts, as the test suites set it */
    const char *direct = braid__param_str("CUDA_FAKE_DIRECT");
    return direct && direct[0] == '1';
}

void braid__fault_exit_in_init(const char *step)
{
    const char *at = braid__param_str("BRAID_TEST_EXIT_IN_INIT");
    if (at && strcmp(at, step) == 0)
        _exit(3);
}
