/* Start, stop and tear down a listener's accept thread; accept()'s wait set-up. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "status.h"
#include "transports/common/acceptor.h"

void braid__acceptor_init(braid_acceptor *a, const braid_transport_ops *ops, const braid_transport_ctx *ctx,
                          int hs_max_ms)
{
    a->base.ops = ops;
    a->ctx = *ctx;
    a->hs_timeout_ms = ctx->timeout_ms > 0 && ctx->timeout_ms < hs_max_ms ? ctx->timeout_ms : hs_max_ms;
}

braid_status braid__acceptor_start(braid_acceptor *a, void *(*main)(void *), void *arg, const char *what)
{
    braid_status st;
    if (pipe2(a->wake, O_CLOEXEC | O_NONBLOCK) != 0)
        return braid__error(BRAID_ERR_SYSTEM, "rank %d: pipe: %m", a->ctx.rank);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(&a->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (rc != 0) {
        st = braid__error(BRAID_ERR_SYSTEM, "rank %d: pthread_cond_init failed (%d)", a->ctx.rank, rc);
        goto err_close_pipe;
    }
    pthread_mutex_init(&a->mu, NULL);
    rc = pthread_create(&a->thread, NULL, main, arg);
    if (rc != 0) {
        errno = rc;
        st = braid__error(BRAID_ERR_SYSTEM, "rank %d: cannot start the %s: %m", a->ctx.rank, what);
        goto err_destroy_sync;
    }
    return BRAID_OK;

err_destroy_sync:
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cv);
err_close_pipe:
    close(a->wake[0]);
    close(a->wake[1]);
    return st;
}

void braid__acceptor_stop(braid_acceptor *a)
{
    pthread_mutex_lock(&a->mu);
    a->stopping = 1;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    ssize_t w;
    do {
        w = write(a->wake[1], "x", 1);
    } while (w < 0 && errno == EINTR);
    pthread_join(a->thread, NULL);
}

void braid__acceptor_fini(braid_acceptor *a)
{
    close(a->wake[0]);
    close(a->wake[1]);
    close(a->listen_fd);
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cv);
    memset(a->ctx.secret, 0, sizeof(a->ctx.secret));
}

braid_status braid__acceptor_deadline(const braid_acceptor *a, int peer, int *timeout_ms, struct timespec *ts)
{
    if (peer < 0 || peer >= a->ctx.size)
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: accept from peer %d of a group of %d", a->ctx.rank, peer,
                            a->ctx.size);
    if (*timeout_ms <= 0)
        *timeout_ms = a->ctx.timeout_ms > 0 ? a->ctx.timeout_ms : 300000;
    int64_t deadline = braid__now_ms() + *timeout_ms;
    *ts = (struct timespec){(time_t)(deadline / 1000), (long)(deadline % 1000) * 1000000L};
    return BRAID_OK;
}

braid_status braid__acceptor_check(const braid_acceptor *a, int peer, int taken)
{
    if (a->stopping)
        return braid__error(BRAID_ERR_ABORTED, "rank %d: listener closed while waiting for peer %d", a->ctx.rank, peer);
    if (taken)
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: the connection from peer %d was already accepted",
                            a->ctx.rank, peer);
    return BRAID_OK;
}
