/* -M: what the run's memory went to, as nccl-tests' memory report line
 * ("Initialization | User-Allocated | Collective | Total"). A rank here is
 * a host process, so the amounts are its resident memory (/proc/self/status)
 * rather than GPU memory: growth while joining the group, the benchmark's
 * buffers, and the peak beyond those while the collectives ran. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

static long long process_start_kib = -1;

/* VmRSS or VmHWM in KiB, -1 when unreadable. */
static long long status_kib(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return -1;
    char line[256];
    long long v = -1;
    size_t n = strlen(key);
    while (fgets(line, sizeof(line), f))
        if (strncmp(line, key, n) == 0 && line[n] == ':') {
            v = strtoll(line + n + 1, NULL, 10);
            break;
        }
    fclose(f);
    return v;
}

void bench_memory_mark_process_start(void)
{
    process_start_kib = status_kib("VmRSS");
}

void bench_memory_start(bench_memory *m)
{
    long long now = status_kib("VmRSS");
    m->init = now >= 0 && process_start_kib >= 0 && now > process_start_kib ? (now - process_start_kib) * 1024 : 0;
}

void bench_memory_buffers(bench_memory *m, size_t bytes)
{
    m->buffers = (long long)bytes;
    m->after_buffers = status_kib("VmRSS");
}

void bench_memory_end(bench_memory *m)
{
    long long peak = status_kib("VmHWM");
    m->collective = peak > m->after_buffers && m->after_buffers >= 0 ? (peak - m->after_buffers) * 1024 : 0;
}

/* nccl-tests' getMemString: B, KB, MB or GB with 2, 1 or 0 decimals. */
static void mem_string(long long bytes, char *out, size_t len)
{
    double v = (double)bytes;
    const char *unit = " B";
    if (v >= 1024.0 * 1024 * 1024) {
        unit = " GB";
        v /= 1024.0 * 1024 * 1024;
    } else if (v >= 1024.0 * 1024) {
        unit = " MB";
        v /= 1024.0 * 1024;
    } else if (v >= 1024.0) {
        unit = " KB";
        v /= 1024.0;
    }
    snprintf(out, len, "%.*f%s", v < 10.0 ? 2 : (v < 100.0 ? 1 : 0), v, unit);
}

void bench_memory_print(const bench_memory *m)
{
    char a[32], b[32], c[32], t[32];
    mem_string(m->init, a, sizeof(a));
    mem_string(m->buffers, b, sizeof(b));
    mem_string(m->collective, c, sizeof(c));
    mem_string(m->init + m->buffers + m->collective, t, sizeof(t));
    printf("# %-20s : Initialization %s | User-Allocated %s | Collective %s | Total  %s\n", "Host memory usage", a, b,
           c, t);
}
