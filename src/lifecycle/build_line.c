/* The first log line of a process's first group: which braid this is
 * (version, build type, sanitizers, what was compiled in) and what CUDA
 * can be had here, without loading the driver: a CPU-only job must not
 * pay for it, so the devices are counted at the first device buffer. */
#include <stdatomic.h>

#include "braid.h"
#include "braid_cuda.h"
#include "log.h"
#include "pg_int.h"

#ifndef BRAID_BUILD_TYPE
#define BRAID_BUILD_TYPE "unknown"
#endif
#ifndef BRAID_BUILD_SANITIZE
#define BRAID_BUILD_SANITIZE "none"
#endif

#if defined(BRAID_HAVE_CUDA)
#define BUILT_CUDA 1
#else
#define BUILT_CUDA 0
#endif
#if defined(BRAID_HAVE_VERBS)
#define BUILT_VERBS "verbs"
#else
#define BUILT_VERBS "no verbs"
#endif
#if defined(BRAID_ENABLE_TRACE)
#define BUILT_TRACE "trace lines"
#else
#define BUILT_TRACE "no trace lines"
#endif

void braid__log_build_line(int rank)
{
    static atomic_int said;
    if (atomic_exchange(&said, 1))
        return;
    const char *cuda = !BUILT_CUDA                               ? "not built in"
                       : braid__cuda_context_seen()              ? "built in, a CUDA context exists"
                       : braid__cuda_device_nodes_present()      ? "built in, NVIDIA devices present (driver not loaded yet)"
                                                                 : "built in, no NVIDIA device on this host";
    BRAID_INFO("rank %d: braid %d.%d.%d (%s build, sanitizers %s, %s, %s); cuda: %s", rank, BRAID_VERSION_MAJOR,
               BRAID_VERSION_MINOR, BRAID_VERSION_PATCH, BRAID_BUILD_TYPE, BRAID_BUILD_SANITIZE, BUILT_VERBS,
               BUILT_TRACE, cuda);
}
