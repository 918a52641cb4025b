/* Logging: BRAID_DEBUG=NONE|WARN|INFO|TRACE, BRAID_DEBUG_FILE=path (%h host,
 * %p pid). Lines carry host, pid and rank. Macros test the level before
 * formatting and keep errno, so `%m` still names the failed syscall. */
#ifndef BRAID_LOG_H
#define BRAID_LOG_H

#include <errno.h>

typedef enum {
    BRAID_LOG_NONE = 0,
    BRAID_LOG_WARN,
    BRAID_LOG_INFO,
    BRAID_LOG_TRACE,
} braid_log_level;

extern int braid__log_level_cached; /* -1 until read from the environment */

int braid__log_level(void);
void braid__log_set_rank(int rank);
void braid__log_write(braid_log_level level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define BRAID_LOG(level, ...)                                                                  \
    do {                                                                                       \
        if (braid__log_level() >= (level)) {                                                   \
            int braid__saved_errno = errno;                                                    \
            braid__log_write((level), __FILE__, __LINE__, __VA_ARGS__);                        \
            errno = braid__saved_errno;                                                        \
        }                                                                                      \
    } while (0)

#define BRAID_WARN(...) BRAID_LOG(BRAID_LOG_WARN, __VA_ARGS__)
#define BRAID_INFO(...) BRAID_LOG(BRAID_LOG_INFO, __VA_ARGS__)
#ifdef BRAID_ENABLE_TRACE
#define BRAID_TRACE(...) BRAID_LOG(BRAID_LOG_TRACE, __VA_ARGS__)
#else
#define BRAID_TRACE(...) ((void)0)
#endif

#endif
