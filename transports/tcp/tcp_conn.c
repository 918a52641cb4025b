/* TCP connections: creation, the connecting side's handshakes, close. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bootstrap/auth.h"
#include "log.h"
#include "status.h"
#include "tcp.h"
#include "tcp_conn.h"

#define DEFAULT_TIMEOUT_MS 300000

void braid__tcp_stripe(size_t msg_len, int nsocks, int k, size_t *off, size_t *len)
{
    if (nsocks <= 1 || msg_len < BRAID_TCP_STRIPE_MIN) {
        *off = 0;
        *len = k == 0 ? msg_len : 0;
        return;
    }
    size_t n = (size_t)nsocks;
    size_t chunk = (msg_len + n - 1) / n;
    chunk = (chunk + BRAID_TCP_STRIPE_ALIGN - 1) / BRAID_TCP_STRIPE_ALIGN * BRAID_TCP_STRIPE_ALIGN;
    size_t start = chunk * (size_t)k;
    if (start > msg_len)
        start = msg_len;
    size_t end = start + chunk > msg_len ? msg_len : start + chunk;
    *off = start;
    *len = end - start;
}

braid_status braid__tcp_conn_create(int rank, int peer, int nsocks, const int *fds, const char *addr,
                                    braid_tcp_conn **conn)
{
    braid_tcp_conn *c = calloc(1, sizeof(*c) + (size_t)nsocks * sizeof(c->socks[0]));
    if (!c)
        return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: out of memory for the connection to peer %d", rank, peer);
    for (int k = 0; k < nsocks; k++) {
        braid_status st = braid__sock_set_nonblock(fds[k]);
        if (st != BRAID_OK) {
            free(c);
            return st;
        }
        c->socks[k].fd = fds[k];
    }
    c->base.ops = &braid__tcp_ops;
    c->base.peer = peer;
    c->base.error = BRAID_OK;
    c->rank = rank;
    c->nsocks = nsocks;
    snprintf(c->addr, sizeof(c->addr), "%s", addr);
    *conn = c;
    return BRAID_OK;
}

void braid__tcp_close(braid_conn *conn)
{
    if (!conn)
        return;
    braid_tcp_conn *c = braid__tcp_conn_of(conn);
    /* Pending requests are abandoned: they belong to the caller. */
    for (int k = 0; k < c->nsocks; k++)
        close(c->socks[k].fd);
    free(c);
}

/* Open and authenticate socket k of the connection to peer. */
static braid_status connect_one(const braid_transport_ctx *ctx, int peer, const braid_sockaddr *sa, const char *addr,
                                int k, int nsocks, int64_t deadline, int *out)
{
    char what[BRAID_SOCK_ADDR_STR + 96];
    int fd;
    if (nsocks > 1)
        snprintf(what, sizeof(what), "rank %d: connect to peer %d at %s (socket %d of %d)", ctx->rank, peer, addr, k,
                 nsocks);
    else
        snprintf(what, sizeof(what), "rank %d: connect to peer %d at %s", ctx->rank, peer, addr);
    BRAID_CHECK(braid__sock_connect(sa, deadline, what, &fd));

    braid_hello self = {.role = BRAID_ROLE_TCP_CONNECT,
                        .rank = ctx->rank,
                        .target = peer,
                        .pg_tag = ctx->pg_tag,
                        .sock_index = (uint16_t)k,
                        .nsocks = (uint16_t)nsocks};
    braid_hello theirs;
    uint32_t result;
    braid_status st;
    BRAID_CHECK_GOTO(
        braid__auth_initiate(fd, ctx->secret, &self, BRAID_ROLE_TCP_ACCEPT, deadline, what, &theirs, &result), st,
        err_close);
    if (theirs.rank != peer || theirs.pg_tag != ctx->pg_tag) {
        st = braid__error(BRAID_ERR_AUTH,
                          "%s: the listener there is rank %d of group %016llx, expected rank %d of "
                          "group %016llx (a stale address?)",
                          what, theirs.rank, (unsigned long long)theirs.pg_tag, peer, (unsigned long long)ctx->pg_tag);
        goto err_close;
    }
    if (result != BRAID_AUTH_ACCEPTED) {
        st = braid__error(BRAID_ERR_AUTH, "%s: the peer refused the connection: %s", what,
                          braid__auth_result_string(result));
        goto err_close;
    }
    *out = fd;
    return BRAID_OK;

err_close:
    close(fd);
    return st;
}

/* Sockets per peer unless configured: several let a NIC spread a
 * connection over queues and cores; over loopback there is no NIC and the
 * extra socket only adds system calls (4-rank 64 MiB all-reduce: ~8%). */
static int auto_nsocks(const braid_sockaddr *sa)
{
    const struct sockaddr_storage *ss = &sa->ss;
    if (ss->ss_family == AF_INET) {
        uint32_t ip = ntohl(((const struct sockaddr_in *)ss)->sin_addr.s_addr);
        return (ip >> 24) == 127 ? 1 : BRAID_TCP_DEFAULT_SOCKS;
    }
    if (ss->ss_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)ss)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) ? 1 : BRAID_TCP_DEFAULT_SOCKS;
    }
    return BRAID_TCP_DEFAULT_SOCKS;
}

braid_status braid__tcp_connect(const braid_transport_ctx *ctx, int peer, const char *addr, int timeout_ms,
                                braid_conn **conn)
{
    braid_sockaddr sa;
    BRAID_CHECK(braid__sock_addr_parse(addr, &sa));
    int nsocks = ctx->nsocks > 0 ? ctx->nsocks : auto_nsocks(&sa);
    if (nsocks > BRAID_TCP_MAX_SOCKS)
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: %d sockets per peer asked, at most %d supported",
                            ctx->rank, nsocks, BRAID_TCP_MAX_SOCKS);
    if (peer < 0 || peer >= ctx->size)
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: connect to peer %d of a group of %d", ctx->rank, peer,
                            ctx->size);
    if (timeout_ms <= 0)
        timeout_ms = ctx->timeout_ms > 0 ? ctx->timeout_ms : DEFAULT_TIMEOUT_MS;
    int64_t deadline = braid__now_ms() + timeout_ms;

    int fds[BRAID_TCP_MAX_SOCKS];
    int opened = 0;
    braid_status st = BRAID_OK;
    for (; opened < nsocks; opened++)
        BRAID_CHECK_GOTO(connect_one(ctx, peer, &sa, addr, opened, nsocks, deadline, &fds[opened]), st, err_close_fds);
    braid_tcp_conn *c;
    BRAID_CHECK_GOTO(braid__tcp_conn_create(ctx->rank, peer, nsocks, fds, addr, &c), st, err_close_fds);
    BRAID_INFO("rank %d: connected to peer %d at %s with %d socket%s", ctx->rank, peer, addr, nsocks,
               nsocks > 1 ? "s" : "");
    *conn = &c->base;
    return BRAID_OK;

err_close_fds:
    while (opened-- > 0)
        close(fds[opened]);
    return st;
}
