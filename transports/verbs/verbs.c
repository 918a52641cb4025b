/* The verbs transport's ops table: listeners and connection set-up over
 * the TCP transport, posting, and memory registration. */
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "log.h"
#include "status.h"
#include "transports/tcp/tcp.h"
#include "verbs.h"
#include "verbs_conn.h"
#include "verbs_dev.h"

/* The listener is a TCP listener plus a reference on the device, taken at
 * listen() so an unusable device fails the group's start-up rather than
 * its first collective. */
typedef struct {
    braid_listener base; /* first */
    braid_listener *tcp;
    braid_transport_ctx ctx; /* with nsocks = 1: set-up needs one socket */
    braid_verbs_dev *dev;
} braid_verbs_listener;

/* A reg_mem() handle: the registration and the range the caller named,
 * which dereg_mem() invalidates (the caller may free it next). Handles
 * belong to the device the connection uses: deregister them before the
 * connection closes. */
typedef struct {
    braid_verbs_region *region;
    void *buf;
    size_t len;
} braid_verbs_reg;

#define DEFAULT_TIMEOUT_MS 300000

static int64_t deadline_of(int timeout_ms, const braid_transport_ctx *ctx)
{
    int ms = timeout_ms > 0 ? timeout_ms : ctx->timeout_ms > 0 ? ctx->timeout_ms : DEFAULT_TIMEOUT_MS;
    return braid__now_ms() + ms;
}

static braid_transport_ctx oob_ctx(const braid_transport_ctx *ctx)
{
    braid_transport_ctx t = *ctx;
    t.nsocks = 1;
    return t;
}

static braid_status verbs_listen(const braid_transport_ctx *ctx, braid_listener **listener, char addr[BRAID_ADDR_MAX])
{
    braid_verbs_listener *l = calloc(1, sizeof(*l));
    if (!l)
        return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: out of memory for the verbs listener", ctx->rank);
    l->base.ops = &braid__verbs_ops;
    l->ctx = oob_ctx(ctx);
    braid_status st;
    BRAID_CHECK_GOTO(braid__verbs_dev_acquire(ctx->rank, &l->dev), st, err_free);
    BRAID_CHECK_GOTO(braid__tcp_ops.listen(&l->ctx, &l->tcp, addr), st, err_release);
    *listener = &l->base;
    return BRAID_OK;

err_release:
    braid__verbs_dev_release(l->dev);
err_free:
    free(l);
    return st;
}

static braid_status verbs_accept(braid_listener *listener, int peer, int timeout_ms, braid_conn **conn)
{
    braid_verbs_listener *l = (braid_verbs_listener *)listener;
    int64_t deadline = deadline_of(timeout_ms, &l->ctx);
    braid_conn *oob;
    BRAID_CHECK(braid__tcp_ops.accept(l->tcp, peer, timeout_ms, &oob));
    return braid__verbs_conn_setup(&l->ctx, peer, oob, deadline, conn);
}

static braid_status verbs_connect(const braid_transport_ctx *ctx, int peer, const char *addr, int timeout_ms,
                                  braid_conn **conn)
{
    braid_transport_ctx t = oob_ctx(ctx);
    int64_t deadline = deadline_of(timeout_ms, ctx);
    braid_conn *oob;
    BRAID_CHECK(braid__tcp_ops.connect(&t, peer, addr, timeout_ms, &oob));
    return braid__verbs_conn_setup(&t, peer, oob, deadline, conn);
}

static void verbs_close_listener(braid_listener *listener)
{
    if (!listener)
        return;
    braid_verbs_listener *l = (braid_verbs_listener *)listener;
    braid__tcp_ops.close_listener(l->tcp);
    braid__verbs_dev_release(l->dev);
    free(l);
}

static braid_status verbs_reg_mem(braid_conn *conn, void *buf, size_t len, void **handle)
{
    braid_verbs_conn *c = braid__verbs_conn_of(conn);
    if (!buf || len == 0) {
        *handle = NULL;
        return BRAID_OK;
    }
    braid_verbs_reg *h = malloc(sizeof(*h));
    if (!h)
        return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: out of memory for a registration handle", c->rank);
    pthread_mutex_lock(&c->dev->mu);
    int err = braid__verbs_regcache_acquire(&c->dev->cache, buf, len, 1, &h->region);
    pthread_mutex_unlock(&c->dev->mu);
    if (err) {
        free(h);
        return braid__error(BRAID_ERR_SYSTEM, "rank %d: cannot register %zu bytes at %p on %s: %s", c->rank, len, buf,
                            c->dev->name, strerror(err));
    }
    h->buf = buf;
    h->len = len;
    *handle = h;
    return BRAID_OK;
}

static braid_status verbs_dereg_mem(braid_conn *conn, void *handle)
{
    braid_verbs_conn *c = braid__verbs_conn_of(conn);
    braid_verbs_reg *h = handle;
    if (!h)
        return BRAID_OK;
    pthread_mutex_lock(&c->dev->mu);
    braid__verbs_regcache_release(&c->dev->cache, h->region);
    braid__verbs_regcache_invalidate(&c->dev->cache, h->buf, h->len);
    pthread_mutex_unlock(&c->dev->mu);
    free(h);
    return BRAID_OK;
}

static braid_status post_check(braid_verbs_conn *c, braid_req *req, const void *buf, size_t len, const char *what)
{
    if (!req || (len && !buf))
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: %s to peer %d with a NULL %s", c->rank, what, c->base.peer,
                            req ? "buffer" : "request");
    memset(req, 0, sizeof(*req));
    req->conn = &c->base;
    return BRAID_OK;
}

/* Before the handshake is done, transfers wait on the connection in
 * posting order and go to the engine when it is (verbs_conn.c). */
static braid_status post(braid_verbs_conn *c, braid_req *req, braid_req_kind kind, void *buf, size_t len)
{
    if (c->base.error != BRAID_OK)
        return braid__verbs_conn_error(c);
    int moved = 0;
    if (c->hs != BRAID_VERBS_HS_UP)
        BRAID_CHECK(braid__verbs_conn_handshake(c, &moved));
    if (c->hs != BRAID_VERBS_HS_UP) {
        req->kind = kind;
        req->buf = buf;
        req->len = len;
        req->next = NULL;
        if (c->pre_tail)
            c->pre_tail->next = req;
        else
            c->pre_head = req;
        c->pre_tail = req;
        return BRAID_OK;
    }
    braid_status st = kind == BRAID_REQ_SEND ? braid__verbs_engine_isend(&c->eng, req, buf, len)
                                             : braid__verbs_engine_irecv(&c->eng, req, buf, len);
    return st == BRAID_OK ? st : braid__verbs_conn_failed(c, st);
}

static braid_status verbs_isend(braid_conn *conn, braid_req *req, const void *buf, size_t len)
{
    braid_verbs_conn *c = braid__verbs_conn_of(conn);
    BRAID_CHECK(post_check(c, req, buf, len, "send"));
    return post(c, req, BRAID_REQ_SEND, (void *)buf, len);
}

static braid_status verbs_irecv(braid_conn *conn, braid_req *req, void *buf, size_t len)
{
    braid_verbs_conn *c = braid__verbs_conn_of(conn);
    BRAID_CHECK(post_check(c, req, buf, len, "receive"));
    return post(c, req, BRAID_REQ_RECV, buf, len);
}

const braid_transport_ops braid__verbs_ops = {
    .size = sizeof(braid_transport_ops),
    .name = "verbs",
    .probe = braid__verbs_probe,
    .listen = verbs_listen, .accept = verbs_accept, .close_listener = verbs_close_listener,
    .connect = verbs_connect,
    .reg_mem = verbs_reg_mem, .dereg_mem = verbs_dereg_mem,
    .isend = verbs_isend, .irecv = verbs_irecv, .test = braid__verbs_test,
    .progress = braid__verbs_progress, .close = braid__verbs_conn_close,
    .scope = BRAID_TRANSPORT_ANY_PAIR, .agreed = 1,
};
