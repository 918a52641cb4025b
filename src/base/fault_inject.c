/* Fault injection (fault_inject.h): reads the test hooks, through the
 * parameter table like every other variable, and nothing else. */
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
