/* Result codes and error text. The text is per thread (NCCL keeps one
 * process-wide buffer that any thread may overwrite mid-read), and always
 * names the NCCL call plus braid's own detail: rank, peer, cause. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "log.h"
#include "nccl_internal.h"
#include "status.h"

static _Thread_local char last_error[1024];
static _Thread_local nccl_scope *scope; /* innermost call on a communicator */

void nccl__scope_enter(nccl_scope *s, const struct ncclComm *comm)
{
    s->prev = scope;
    s->name[0] = '\0';
    /* A copy: the call may free comm (ncclCommDestroy) and fail after. */
    if (comm)
        snprintf(s->name, sizeof(s->name), "%s", comm->conf.name);
    scope = s;
}

void nccl__scope_leave(nccl_scope *s)
{
    scope = s->prev;
}

/* NCCL_DEBUG asks for warnings: -1 until read (ncclResetDebugInit). */
static atomic_int warn_cached = -1;

static int warn_enabled(void)
{
    int cached = atomic_load(&warn_cached);
    if (cached < 0) {
        const char *d = getenv("NCCL_DEBUG");
        cached = d && (!strcasecmp(d, "WARN") || !strcasecmp(d, "INFO") || !strcasecmp(d, "TRACE"));
        atomic_store(&warn_cached, cached);
    }
    return cached;
}

static void set_text(const char *text)
{
    /* Name the communicator unless the text already does (its label). */
    if (scope && scope->name[0] && !strstr(text, scope->name)) {
        /* a long text is cut, never the name */
        size_t room = sizeof(last_error) - strlen(scope->name) - sizeof(" (comm \"\")");
        size_t n = strnlen(text, room);
        memcpy(last_error, text, n);
        snprintf(last_error + n, sizeof(last_error) - n, " (comm \"%s\")", scope->name);
    } else {
        snprintf(last_error, sizeof(last_error), "%s", text);
    }
    text = last_error;
    BRAID_INFO("nccl: %s", text);
    if (warn_enabled()) {
        char host[64] = "?";
        gethostname(host, sizeof(host));
        host[sizeof(host) - 1] = '\0';
        fprintf(stderr, "%s:%d NCCL WARN %s\n", host, (int)getpid(), text);
    }
}

ncclResult_t nccl__fail(ncclResult_t code, const char *fmt, ...)
{
    char text[sizeof(last_error)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    set_text(text);
    return code;
}

ncclResult_t nccl__result_of(braid_status st)
{
    switch (st) {
    case BRAID_OK:
        return ncclSuccess;
    case BRAID_ERR_INVALID_ARG:
        return ncclInvalidArgument;
    case BRAID_ERR_SYSTEM:
    case BRAID_ERR_NO_MEMORY:
    case BRAID_ERR_AUTH:
        return ncclSystemError;
    /* Both mean the other side is gone or silent, which NCCL reports as a
     * remote error. */
    case BRAID_ERR_TIMEOUT:
    case BRAID_ERR_PEER:
    case BRAID_ERR_CORRUPT: /* data damaged between ranks (checksums on) */
        return ncclRemoteError;
    /* Ranks disagreeing on the calls, a feature this build lacks, or work
     * on an aborted communicator: all the caller's usage. */
    case BRAID_ERR_MISMATCH:
    case BRAID_ERR_UNSUPPORTED:
    case BRAID_ERR_ABORTED:
        return ncclInvalidUsage;
    case BRAID_ERR_CUDA:
        return ncclUnhandledCudaError;
    case BRAID_ERR_INTERNAL:
    case BRAID_STATUS_COUNT:
        break;
    }
    return ncclInternalError;
}

ncclResult_t nccl__from_braid(braid_status st, const char *call)
{
    if (st == BRAID_OK)
        return ncclSuccess;
    /* braid's text starts with the status name already: quoted once. */
    return nccl__fail(nccl__result_of(st), "%s: %s: %s", call, braid_status_string(st),
                      braid__status_strip(braid_last_error()));
}

NCCL_API const char *ncclGetErrorString(ncclResult_t result)
{
    switch (result) {
    case ncclSuccess:
        return "no error";
    case ncclUnhandledCudaError:
        return "unhandled cuda error (see ncclGetLastError for details)";
    case ncclSystemError:
        return "unhandled system error (see ncclGetLastError for details)";
    case ncclInternalError:
        return "internal error - please report this issue to the braid developers";
    case ncclInvalidArgument:
        return "invalid argument (see ncclGetLastError for details)";
    case ncclInvalidUsage:
        return "invalid usage (see ncclGetLastError for details)";
    case ncclRemoteError:
        return "remote process exited or there was a network error";
    case ncclInProgress:
        return "NCCL operation in progress";
    case ncclNumResults:
        break;
    }
    return "unknown result code";
}

/* Read NCCL_DEBUG again at the next message (deprecated in NCCL 2.28). */
NCCL_API void ncclResetDebugInit(void)
{
    atomic_store(&warn_cached, -1);
}

NCCL_API const char *ncclGetLastError(ncclComm_t comm)
{
    (void)comm;
    return last_error;
}
