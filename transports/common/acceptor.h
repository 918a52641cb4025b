/* The accept-thread skeleton of the TCP and shared-memory listeners. */
#ifndef BRAID_ACCEPTOR_H
#define BRAID_ACCEPTOR_H

#include <pthread.h>
#include <time.h>

#include "braid_transport.h"

/* Embedded first in a transport's listener; the accept thread polls
 * wake[0] and leaves when it turns readable. */
typedef struct {
    braid_listener base; /* first: braid_listener * downcasts to this */
    braid_transport_ctx ctx;
    char addr[BRAID_ADDR_MAX];
    int listen_fd;
    int wake[2];
    int hs_timeout_ms; /* ctx.timeout_ms, capped by the transport */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stopping; /* under mu: close_listener() has begun */
} braid_acceptor;

/* Fill in ops, ctx and the handshake limit (ctx->timeout_ms, at most hs_max_ms). */
void braid__acceptor_init(braid_acceptor *a, const braid_transport_ops *ops, const braid_transport_ctx *ctx,
                          int hs_max_ms);

/* Open the wake pipe and start the accept thread (what names it in errors).
 * On failure nothing it opened is left open; listen_fd is the caller's. */
braid_status braid__acceptor_start(braid_acceptor *a, void *(*main)(void *), void *arg, const char *what);

/* Set stopping, wake accept() waiters and the thread, and join it. */
void braid__acceptor_stop(braid_acceptor *a);

/* After stop: close the wake pipe and listen_fd, wipe the secret. */
void braid__acceptor_fini(braid_acceptor *a);

/* accept()'s prologue: check peer, default *timeout_ms, absolute deadline
 * for pthread_cond_timedwait on cv. */
braid_status braid__acceptor_deadline(const braid_acceptor *a, int peer, int *timeout_ms, struct timespec *ts);

/* Under mu, after the wait: why peer's connection cannot be handed out
 * (listener closing, or taken already), or BRAID_OK. */
braid_status braid__acceptor_check(const braid_acceptor *a, int peer, int taken);

#endif
