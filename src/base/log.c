/* Log sink: one line per call, written with a single write() so lines from
 * several threads or ranks do not interleave. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "log.h"

int braid__log_level_cached = -1;
static int log_rank = -1;
static int log_fd = 2;
static char log_host[64];
static pthread_once_t log_once = PTHREAD_ONCE_INIT;

static void open_log_file(const char *pattern)
{
    char path[512];
    size_t o = 0;
    for (const char *p = pattern; *p && o + 32 < sizeof(path); p++) {
        if (p[0] == '%' && p[1] == 'h') {
            o += (size_t)snprintf(path + o, sizeof(path) - o, "%s", log_host);
            p++;
        } else if (p[0] == '%' && p[1] == 'p') {
            o += (size_t)snprintf(path + o, sizeof(path) - o, "%d", (int)getpid());
            p++;
        } else {
            path[o++] = *p;
        }
    }
    path[o] = '\0';
    FILE *f = fopen(path, "a");
    if (f)
        log_fd = fileno(f); /* kept open for the life of the process */
}

static void log_init(void)
{
    gethostname(log_host, sizeof(log_host) - 1);
    const char *lvl = getenv("BRAID_DEBUG");
    int level = BRAID_LOG_WARN;
    if (lvl) {
        if (!strcasecmp(lvl, "NONE") || !strcmp(lvl, "0"))
            level = BRAID_LOG_NONE;
        else if (!strcasecmp(lvl, "INFO"))
            level = BRAID_LOG_INFO;
        else if (!strcasecmp(lvl, "TRACE"))
            level = BRAID_LOG_TRACE;
    }
    const char *file = getenv("BRAID_DEBUG_FILE");
    if (file && *file)
        open_log_file(file);
    __atomic_store_n(&braid__log_level_cached, level, __ATOMIC_RELEASE);
#ifndef BRAID_ENABLE_TRACE
    /* Said once: the level is cached above, so this line does not come back here. */
    if (level == BRAID_LOG_TRACE)
        BRAID_INFO("BRAID_DEBUG=TRACE: this build has no trace lines (configure with -Dtrace=true); the log shows "
                   "INFO and WARN");
#endif
}

int braid__log_level(void)
{
    int level = __atomic_load_n(&braid__log_level_cached, __ATOMIC_ACQUIRE);
    if (level >= 0)
        return level;
    pthread_once(&log_once, log_init);
    return __atomic_load_n(&braid__log_level_cached, __ATOMIC_ACQUIRE);
}

void braid__log_set_rank(int rank)
{
    __atomic_store_n(&log_rank, rank, __ATOMIC_RELAXED);
}

void braid__log_write(braid_log_level level, const char *file, int line, const char *fmt, ...)
{
    static const char *const names[] = {"NONE", "WARN", "INFO", "TRACE"};
    char buf[1400];
    const char *base = strrchr(file, '/');
    int n = snprintf(buf, sizeof(buf), "%s:%d:%d [rank %d] braid %s %s:%d ", log_host, (int)getpid(),
                     (int)gettid(), __atomic_load_n(&log_rank, __ATOMIC_RELAXED), names[level],
                     base ? base + 1 : file, line);
    if (n < 0)
        return;
    if ((size_t)n < sizeof(buf)) {
        va_list ap;
        va_start(ap, fmt);
        int m = vsnprintf(buf + n, sizeof(buf) - (size_t)n, fmt, ap);
        va_end(ap);
        if (m > 0)
            n += m;
    }
    if ((size_t)n >= sizeof(buf) - 1)
        n = (int)sizeof(buf) - 2;
    buf[n++] = '\n';
    ssize_t w = write(log_fd, buf, (size_t)n);
    (void)w;
}
