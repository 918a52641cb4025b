#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "log.h"
#include "param.h"

const braid_param_info braid__params[] = {
    {"BRAID_DEBUG", "WARN", "log level: NONE, WARN, INFO, TRACE"},
    {"BRAID_DEBUG_FILE", NULL, "log to this file instead of stderr (%h host, %p pid)"},
    {"BRAID_TIMEOUT_MS", "300000", "limit of every blocking wait, in milliseconds"},
    {"BRAID_INIT_TIMEOUT_MS", "1800000", "how long group creation waits for every rank to reach rank 0's store "
                                         "(torch's default process-group timeout)"},
    {"BRAID_TRANSPORT", NULL, "comma-separated transports to allow, in order of preference; shm beside "
                              "others serves same-host peers (unset: shm for them, verbs or tcp for the rest)"},
    {"BRAID_SHM_CMA", "1", "shm: 1 reads large messages straight from the sender (process_vm_readv), 0 copies "
                           "them through the ring"},
    {"BRAID_HOST_ID", NULL, "ranks with equal values share memory (default: host name, boot id, network namespace)"},
    {"BRAID_SOCKET_IFNAME", NULL, "network interface for TCP (default: the route to rank 0)"},
    {"BRAID_NSOCKS", NULL, "TCP sockets per peer connection (unset: 1 over loopback, 2 across a network)"},
    {"BRAID_SPIN_US", "50", "tcp, shm: microseconds to retry before sleeping in poll() (0: sleep at once)"},
    {"BRAID_CHUNK_BYTES", "524288", "pipeline chunk size of the ring algorithms"},
    {"BRAID_ALGO", "auto", "all-reduce algorithm: auto, ring, rd (recursive doubling), hier (hierarchical)"},
    {"BRAID_CHECKSUM", "0", "1: CRC32C every chunk and fail on a mismatch"},
    {"BRAID_JOB_SECRET", NULL, "32 hex digits: job secret for braid_pg_init_env"},
    {"BRAID_STORE_ADDR", NULL, "host:port for the unique id's rendezvous store"},
};
const size_t braid__param_count = sizeof(braid__params) / sizeof(braid__params[0]);

const char *braid__param_str(const char *name)
{
    const char *v = getenv(name);
    return (v && *v) ? v : NULL;
}

long long braid__param_int(const char *name, long long def)
{
    const char *v = braid__param_str(name);
    if (!v)
        return def;
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 0);
    if (errno || end == v) {
        BRAID_WARN("ignoring %s=%s: not a number", name, v);
        return def;
    }
    switch (*end) {
    case 'k': case 'K': x <<= 10; end++; break;
    case 'm': case 'M': x <<= 20; end++; break;
    case 'g': case 'G': x <<= 30; end++; break;
    default: break;
    }
    if (*end) {
        BRAID_WARN("ignoring %s=%s: trailing characters", name, v);
        return def;
    }
    return x;
}

int braid__spin_us(void)
{
    static _Atomic int cached = -1;
    int v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v < 0) {
        long long x = braid__param_int("BRAID_SPIN_US", 50);
        v = x < 0 ? 0 : x > 100000 ? 100000 : (int)x;
        atomic_store_explicit(&cached, v, memory_order_relaxed);
    }
    return v;
}
