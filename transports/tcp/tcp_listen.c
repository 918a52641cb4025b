/* TCP listener: an accept thread that authenticates every incoming socket
 * in a poll() state machine (so strays, garbage, wrong secrets and silent
 * connections are dropped at their deadline without delaying anyone) and
 * parks good ones per peer rank until accept() takes the whole set. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap/admit.h"
#include "bootstrap/auth.h"
#include "log.h"
#include "status.h"
#include "tcp.h"
#include "tcp_conn.h"
#include "transports/common/acceptor.h"

#define ACCEPT_PAUSE_MS 100
#define FD_CLAIMED (-2) /* a verified socket whose verdict is being sent */

/* A socket still in its handshake. Owned by the accept thread. */
typedef struct pending {
    int fd;
    int64_t deadline;
    int claimed; /* holds slots[peer.rank].fds[peer.sock_index] */
    int dead;
    int counted; /* in the admission table (until it proves the secret) */
    int delayed; /* a wrong proof, held until deadline, then closed */
    char addr[BRAID_SOCK_ADDR_STR];
    char host[BRAID_SOCK_ADDR_STR];
    braid_auth_accept hs;
    struct pending *next;
} pending;

/* Sockets of one peer rank. Guarded by the listener's mu. */
typedef struct {
    int nsocks; /* 0 until the first socket is verified */
    int arrived;
    int taken; /* handed out by accept(): later ones are duplicates */
    int *fds;  /* [nsocks]: fd, -1 missing, FD_CLAIMED */
    char addr[BRAID_SOCK_ADDR_STR];
} slot;

typedef struct {
    braid_acceptor core; /* first: braid_listener * downcasts to this */
    slot *slots;      /* [core.ctx.size] */
    pending *pending; /* accept thread only */
    size_t npending;
    braid_admit admit; /* accept thread only: per-source caps and delays (admit.h) */
    struct pollfd *pfds;
    pending **ppend;
    size_t pcap;
    int64_t accept_resume;
} tcp_listener;

static tcp_listener *listener_of(braid_listener *l)
{
    return (tcp_listener *)l;
}

static void uncount(tcp_listener *l, pending *p)
{
    if (p->counted)
        braid__admit_leave(&l->admit, p->host);
    p->counted = 0;
}

static void drop(tcp_listener *l, pending *p, int level, const char *why)
{
    if (p->dead)
        return;
    BRAID_LOG(level, "rank %d: dropped a connection from %s: %s", l->core.ctx.rank, p->addr, why);
    p->dead = 1;
    uncount(l, p);
}

/* Room for a newcomer: drop the oldest unproven socket (of host, or of
 * anybody when NULL), a held wrong proof first. The list runs newest first. */
static void evict_oldest(tcp_listener *l, const char *host)
{
    pending *victim = NULL;
    for (pending *p = l->pending; p; p = p->next) {
        if (p->dead || !p->counted || (host && strcmp(p->host, host) != 0))
            continue;
        if (!victim || p->delayed || !victim->delayed)
            victim = p;
    }
    if (victim)
        drop(l, victim, BRAID_LOG_INFO, "too many unauthenticated connections: oldest dropped");
}

/* Verdict on a verified initiator; claims its slot when accepted. */
static uint32_t judge(tcp_listener *l, pending *p)
{
    const braid_hello *h = &p->hs.peer;
    if (h->pg_tag != l->core.ctx.pg_tag)
        return BRAID_AUTH_REJECT_GROUP;
    if (h->target != l->core.ctx.rank || h->rank >= l->core.ctx.size)
        return BRAID_AUTH_REJECT_RANK;
    if (h->nsocks < 1 || h->nsocks > BRAID_TCP_MAX_SOCKS || h->sock_index >= h->nsocks)
        return BRAID_AUTH_REJECT_SOCKETS;
    uint32_t verdict = BRAID_AUTH_ACCEPTED;
    pthread_mutex_lock(&l->core.mu);
    slot *s = &l->slots[h->rank];
    if (s->taken) {
        verdict = BRAID_AUTH_REJECT_DUPLICATE;
    } else if (s->nsocks && s->nsocks != h->nsocks) {
        verdict = BRAID_AUTH_REJECT_SOCKETS;
    } else {
        if (!s->nsocks) {
            s->fds = malloc((size_t)h->nsocks * sizeof(int));
            if (!s->fds) {
                pthread_mutex_unlock(&l->core.mu);
                return BRAID_AUTH_REJECT_SOCKETS; /* out of memory: the peer sees a refusal */
            }
            for (int i = 0; i < h->nsocks; i++)
                s->fds[i] = -1;
            s->nsocks = h->nsocks;
        }
        if (s->fds[h->sock_index] != -1) {
            verdict = BRAID_AUTH_REJECT_DUPLICATE;
        } else {
            s->fds[h->sock_index] = FD_CLAIMED;
            p->claimed = 1;
        }
    }
    pthread_mutex_unlock(&l->core.mu);
    return verdict;
}

/* Give back a claim whose socket did not make it. */
static void unclaim(tcp_listener *l, pending *p)
{
    if (!p->claimed)
        return;
    pthread_mutex_lock(&l->core.mu);
    slot *s = &l->slots[p->hs.peer.rank];
    s->fds[p->hs.peer.sock_index] = -1;
    if (s->arrived == 0) {
        free(s->fds);
        s->fds = NULL;
        s->nsocks = 0;
    }
    pthread_mutex_unlock(&l->core.mu);
    p->claimed = 0;
}

static void park(tcp_listener *l, pending *p)
{
    const braid_hello *h = &p->hs.peer;
    pthread_mutex_lock(&l->core.mu);
    slot *s = &l->slots[h->rank];
    s->fds[h->sock_index] = p->fd;
    if (h->sock_index == 0)
        snprintf(s->addr, sizeof(s->addr), "%s", p->addr);
    if (++s->arrived == s->nsocks)
        pthread_cond_broadcast(&l->core.cv);
    pthread_mutex_unlock(&l->core.mu);
    BRAID_TRACE("rank %d: peer %d socket %d of %d from %s authenticated", l->core.ctx.rank, h->rank, h->sock_index,
                h->nsocks, p->addr);
    p->fd = -1; /* the slot owns it now */
    p->claimed = 0;
    p->dead = 1;
}

static void step(tcp_listener *l, pending *p)
{
    if (braid__auth_accept_step(&p->hs, p->fd) != BRAID_OK) {
        if (p->hs.bad_proof) {
            /* Hold it, silent, before the close (admit.h). */
            int delay = braid__admit_fail(&l->admit, p->host, braid__now_ms());
            BRAID_WARN("rank %d: connection from %s: %s; closing it in %d ms", l->core.ctx.rank, p->addr,
                       braid_last_error(), delay);
            p->delayed = 1;
            p->deadline = braid__now_ms() + delay;
            return;
        }
        /* A bare connect-and-close is a port scan or a health check. */
        int quiet = p->hs.bytes_in == 0 && p->hs.state == BRAID_AUTH_RECV_HELLO;
        unclaim(l, p);
        drop(l, p, quiet ? BRAID_LOG_INFO : BRAID_LOG_WARN, braid_last_error());
        return;
    }
    if (p->hs.state == BRAID_AUTH_VERIFIED) {
        uncount(l, p);
        uint32_t verdict = judge(l, p);
        if (verdict != BRAID_AUTH_ACCEPTED)
            BRAID_WARN("rank %d: refusing rank %d (socket %u of %u) from %s: %s", l->core.ctx.rank, p->hs.peer.rank,
                       p->hs.peer.sock_index, p->hs.peer.nsocks, p->addr, braid__auth_result_string(verdict));
        braid__auth_accept_finish(&p->hs, verdict);
        if (braid__auth_accept_step(&p->hs, p->fd) != BRAID_OK) {
            unclaim(l, p);
            drop(l, p, BRAID_LOG_WARN, braid_last_error());
            return;
        }
    }
    if (p->hs.state == BRAID_AUTH_DONE) {
        if (p->hs.result == BRAID_AUTH_ACCEPTED)
            park(l, p);
        else
            p->dead = 1; /* refusal sent (and logged) */
    }
}

static void accept_sockets(tcp_listener *l)
{
    for (;;) {
        braid_sockaddr a;
        a.len = sizeof(a.ss);
        int fd = accept4(l->core.listen_fd, (struct sockaddr *)&a.ss, &a.len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOMEM || errno == ENOBUFS) {
                BRAID_WARN("rank %d: accept on %s: %m; pausing for %d ms", l->core.ctx.rank, l->core.addr,
                           ACCEPT_PAUSE_MS);
                l->accept_resume = braid__now_ms() + ACCEPT_PAUSE_MS;
            } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED) {
                BRAID_WARN("rank %d: accept on %s: %m", l->core.ctx.rank, l->core.addr);
            }
            return;
        }
        pending *p = calloc(1, sizeof(*p));
        braid_hello self = {
            .role = BRAID_ROLE_TCP_ACCEPT, .rank = l->core.ctx.rank, .target = -1, .pg_tag = l->core.ctx.pg_tag};
        if (!p || braid__auth_accept_init(&p->hs, l->core.ctx.secret, &self, BRAID_ROLE_TCP_CONNECT) != BRAID_OK) {
            BRAID_WARN("rank %d: cannot take a connection: out of memory or randomness", l->core.ctx.rank);
            free(p);
            close(fd);
            continue;
        }
        braid__sock_tune(fd);
        p->fd = fd;
        p->deadline = braid__now_ms() + l->core.hs_timeout_ms;
        braid__sock_addr_format(&a, p->addr, sizeof(p->addr));
        braid__admit_host(&a, p->host);
        int evict = braid__admit_enter(&l->admit, p->host);
        if (evict < 0) {
            BRAID_WARN("rank %d: cannot take a connection from %s: out of memory", l->core.ctx.rank, p->addr);
            braid__auth_accept_clear(&p->hs);
            free(p);
            close(fd);
            continue;
        }
        p->counted = 1;
        if (evict)
            evict_oldest(l, evict == 1 ? p->host : NULL);
        p->next = l->pending;
        l->pending = p;
        l->npending++;
    }
}

static void free_pending(pending *p)
{
    if (p->fd >= 0)
        close(p->fd);
    braid__auth_accept_clear(&p->hs);
    free(p);
}

static void sweep(tcp_listener *l, int64_t now)
{
    for (pending **pp = &l->pending; *pp;) {
        pending *p = *pp;
        if (!p->dead && p->deadline <= now) {
            unclaim(l, p);
            if (p->delayed)
                drop(l, p, BRAID_LOG_INFO, "closed after a wrong proof");
            else
                drop(l, p, p->hs.bytes_in ? BRAID_LOG_WARN : BRAID_LOG_INFO,
                     "no complete handshake in time (slow, silent or not a braid peer)");
        }
        if (p->dead) {
            *pp = p->next;
            l->npending--;
            free_pending(p);
        } else {
            pp = &p->next;
        }
    }
}

static int grow(tcp_listener *l, size_t n)
{
    if (n <= l->pcap)
        return 0;
    size_t cap = l->pcap ? l->pcap : 16;
    while (cap < n)
        cap *= 2;
    struct pollfd *f = realloc(l->pfds, cap * sizeof(*f));
    if (!f)
        return -1;
    l->pfds = f;
    pending **p = realloc(l->ppend, cap * sizeof(*p));
    if (!p)
        return -1;
    l->ppend = p;
    l->pcap = cap;
    return 0;
}

static void *accept_main(void *arg)
{
    tcp_listener *l = arg;
    for (;;) {
        int64_t now = braid__now_ms();
        if (grow(l, l->npending + 2) != 0) {
            BRAID_WARN("rank %d: out of memory for %zu pending connections", l->core.ctx.rank, l->npending);
            poll(NULL, 0, ACCEPT_PAUSE_MS);
            continue;
        }
        int64_t next = l->accept_resume > now ? l->accept_resume : -1;
        size_t n = 0;
        l->pfds[n++] = (struct pollfd){.fd = l->core.wake[0], .events = POLLIN};
        l->pfds[n++] = (struct pollfd){.fd = l->accept_resume > now ? -1 : l->core.listen_fd, .events = POLLIN};
        for (pending *p = l->pending; p; p = p->next) {
            l->ppend[n] = p;
            /* A held wrong proof is not watched: its close would wake us in a loop. */
            l->pfds[n++] = (struct pollfd){.fd = p->delayed ? -1 : p->fd, .events = braid__auth_accept_events(&p->hs)};
            if (next < 0 || p->deadline < next)
                next = p->deadline;
        }
        int timeout = next < 0 ? -1 : next <= now ? 0 : (int)(next - now);
        int rc = poll(l->pfds, (nfds_t)n, timeout);
        if (rc < 0 && errno != EINTR) {
            BRAID_WARN("rank %d: listener poll: %m", l->core.ctx.rank);
            poll(NULL, 0, ACCEPT_PAUSE_MS);
            continue;
        }
        if (rc > 0 && l->pfds[0].revents)
            break;
        for (size_t i = 2; rc > 0 && i < n; i++)
            if (l->pfds[i].revents)
                step(l, l->ppend[i]);
        if (rc > 0 && l->pfds[1].revents)
            accept_sockets(l);
        sweep(l, braid__now_ms());
    }
    return NULL;
}

/* The address peers dial: the bound one, or for a wildcard bind the
 * first non-loopback IPv4 address. */
static braid_status listener_addr(tcp_listener *l, int port)
{
    braid_sockaddr a;
    char ip[64];
    if (l->core.ctx.bind_ip[0])
        snprintf(ip, sizeof(ip), "%s", l->core.ctx.bind_ip);
    else
        braid__sock_default_ip(ip, sizeof(ip));
    BRAID_CHECK(braid__sock_resolve(ip, port, &a));
    braid__sock_addr_format(&a, l->core.addr, sizeof(l->core.addr));
    return BRAID_OK;
}

braid_status braid__tcp_listen(const braid_transport_ctx *ctx, braid_listener **listener, char addr[BRAID_ADDR_MAX])
{
    braid_status st;
    if (ctx->size < 1 || ctx->rank < 0 || ctx->rank >= ctx->size)
        return braid__error(BRAID_ERR_INVALID_ARG, "tcp listen: rank %d of %d", ctx->rank, ctx->size);
    tcp_listener *l = calloc(1, sizeof(*l));
    if (!l)
        return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: out of memory for a listener", ctx->rank);
    braid__acceptor_init(&l->core, &braid__tcp_ops, ctx, BRAID_TCP_HANDSHAKE_MAX_MS);
    /* Every peer may dial with all its sockets at once (up to 16 each). */
    braid__admit_size(&l->admit, (long)ctx->size * (ctx->nsocks > 0 ? ctx->nsocks : 2));
    l->slots = calloc((size_t)ctx->size, sizeof(*l->slots));
    if (!l->slots) {
        st = braid__error(BRAID_ERR_NO_MEMORY, "rank %d: out of memory for %d peers", ctx->rank, ctx->size);
        goto err_free;
    }
    int port;
    BRAID_CHECK_GOTO(braid__sock_listen(ctx->bind_ip, 0, &l->core.listen_fd, &port), st, err_free_slots);
    BRAID_CHECK_GOTO(listener_addr(l, port), st, err_close_listen);
    BRAID_CHECK_GOTO(braid__acceptor_start(&l->core, accept_main, l, "accept thread"), st, err_close_listen);
    snprintf(addr, BRAID_ADDR_MAX, "%s", l->core.addr);
    BRAID_INFO("rank %d: tcp listening on %s", ctx->rank, l->core.addr);
    *listener = &l->core.base;
    return BRAID_OK;

err_close_listen:
    close(l->core.listen_fd);
err_free_slots:
    free(l->slots);
err_free:
    free(l);
    return st;
}

braid_status braid__tcp_accept(braid_listener *listener, int peer, int timeout_ms, braid_conn **conn)
{
    tcp_listener *l = listener_of(listener);
    struct timespec ts;
    BRAID_CHECK(braid__acceptor_deadline(&l->core, peer, &timeout_ms, &ts));
    braid_status st = BRAID_OK;
    int fds[BRAID_TCP_MAX_SOCKS], nsocks = 0;
    char addr[BRAID_SOCK_ADDR_STR];

    pthread_mutex_lock(&l->core.mu);
    slot *s = &l->slots[peer];
    while (!l->core.stopping && !s->taken && !(s->nsocks && s->arrived == s->nsocks)) {
        int rc = pthread_cond_timedwait(&l->core.cv, &l->core.mu, &ts);
        if (rc == ETIMEDOUT && !(s->nsocks && s->arrived == s->nsocks)) {
            st = braid__error(BRAID_ERR_TIMEOUT,
                              "rank %d: timed out after %d ms waiting for peer %d to connect to %s "
                              "(%d of %d sockets arrived)",
                              l->core.ctx.rank, timeout_ms, peer, l->core.addr, s->arrived, s->nsocks ? s->nsocks : 1);
            goto out_unlock;
        }
    }
    st = braid__acceptor_check(&l->core, peer, s->taken);
    if (st != BRAID_OK)
        goto out_unlock;
    nsocks = s->nsocks;
    memcpy(fds, s->fds, (size_t)nsocks * sizeof(int));
    snprintf(addr, sizeof(addr), "%s", s->addr);
    free(s->fds);
    s->fds = NULL;
    s->taken = 1;
    pthread_mutex_unlock(&l->core.mu);

    braid_tcp_conn *c;
    st = braid__tcp_conn_create(l->core.ctx.rank, peer, nsocks, fds, addr, &c);
    if (st != BRAID_OK) {
        for (int k = 0; k < nsocks; k++)
            close(fds[k]);
        return st;
    }
    BRAID_INFO("rank %d: accepted peer %d from %s with %d socket%s", l->core.ctx.rank, peer, addr, nsocks,
               nsocks > 1 ? "s" : "");
    *conn = &c->base;
    return BRAID_OK;

out_unlock:
    pthread_mutex_unlock(&l->core.mu);
    return st;
}

void braid__tcp_close_listener(braid_listener *listener)
{
    if (!listener)
        return;
    tcp_listener *l = listener_of(listener);
    braid__acceptor_stop(&l->core);
    for (pending *p = l->pending, *next; p; p = next) {
        next = p->next;
        free_pending(p);
    }
    for (int r = 0; r < l->core.ctx.size; r++) {
        slot *s = &l->slots[r];
        for (int k = 0; s->fds && k < s->nsocks; k++)
            if (s->fds[k] >= 0)
                close(s->fds[k]);
        free(s->fds);
    }
    free(l->slots);
    braid__admit_free(&l->admit);
    free(l->pfds);
    free(l->ppend);
    braid__acceptor_fini(&l->core);
    free(l);
}
