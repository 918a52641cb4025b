/* Status, dtype and op names, and the thread-local error text behind
 * braid_last_error(). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "status.h"

#define ERROR_TEXT_MAX 1024

/* One buffer per thread, so that concurrent callers never see each other's
 * errors (NCCL's ncclGetLastError is process-wide). */
static _Thread_local char error_text[ERROR_TEXT_MAX];

static const char *const status_names[BRAID_STATUS_COUNT] = {
    [BRAID_OK] = "BRAID_OK",
    [BRAID_ERR_INVALID_ARG] = "BRAID_ERR_INVALID_ARG",
    [BRAID_ERR_SYSTEM] = "BRAID_ERR_SYSTEM",
    [BRAID_ERR_TIMEOUT] = "BRAID_ERR_TIMEOUT",
    [BRAID_ERR_PEER] = "BRAID_ERR_PEER",
    [BRAID_ERR_MISMATCH] = "BRAID_ERR_MISMATCH",
    [BRAID_ERR_AUTH] = "BRAID_ERR_AUTH",
    [BRAID_ERR_UNSUPPORTED] = "BRAID_ERR_UNSUPPORTED",
    [BRAID_ERR_CUDA] = "BRAID_ERR_CUDA",
    [BRAID_ERR_ABORTED] = "BRAID_ERR_ABORTED",
    [BRAID_ERR_INTERNAL] = "BRAID_ERR_INTERNAL",
    [BRAID_ERR_NO_MEMORY] = "BRAID_ERR_NO_MEMORY",
    [BRAID_ERR_CORRUPT] = "BRAID_ERR_CORRUPT",
};

BRAID_API const char *braid_status_string(braid_status status)
{
    if ((unsigned)status >= BRAID_STATUS_COUNT)
        return "BRAID_ERR_UNKNOWN";
    return status_names[status];
}

BRAID_API const char *braid_last_error(void)
{
    return error_text;
}

static void format_error(braid_status status, const char *fmt, va_list ap)
{
    int n = snprintf(error_text, sizeof(error_text), "%s: ", braid_status_string(status));
    if (n < 0 || (size_t)n >= sizeof(error_text))
        return;
    vsnprintf(error_text + n, sizeof(error_text) - (size_t)n, fmt, ap);
}

braid_status braid__error(braid_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    format_error(status, fmt, ap);
    va_end(ap);
    /* The caller gets this text back; logging it at WARN too would print
     * every error twice (once here, once by the program). */
    BRAID_INFO("%s", error_text);
    return status;
}

braid_status braid__error_quiet(braid_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    format_error(status, fmt, ap);
    va_end(ap);
    return status;
}

void braid__error_clear(void)
{
    error_text[0] = '\0';
}

void braid__error_set_text(const char *text)
{
    if (text != error_text)
        snprintf(error_text, sizeof(error_text), "%s", text);
}

const char *braid__status_strip(const char *text)
{
    for (int st = 0; st < BRAID_STATUS_COUNT; st++) {
        size_t n = strlen(status_names[st]);
        if (strncmp(text, status_names[st], n) == 0 && text[n] == ':' && text[n + 1] == ' ')
            return text + n + 2;
    }
    return text;
}

const char *braid__error_detail(void)
{
    return braid__status_strip(error_text);
}

const char *braid__op_name(braid_op op)
{
    static const char *const names[BRAID_OP_COUNT] = {
        [BRAID_SUM] = "sum", [BRAID_PROD] = "prod", [BRAID_MIN] = "min", [BRAID_MAX] = "max", [BRAID_AVG] = "avg",
        [BRAID_MULSUM] = "mulsum",
    };
    return (unsigned)op < BRAID_OP_COUNT && names[op] ? names[op] : "invalid";
}
