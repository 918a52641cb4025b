/* Shared-memory connection set-up over abstract Unix sockets, the
 * listening side (the dialling side is shm_dial.c).
 *
 * The listener binds an abstract-namespace socket (no file to leak) whose
 * name carries the group tag, the rank and a random part. A dialling rank
 * connects, runs the job-secret handshake as initiator, then sends the
 * memfd and both eventfds with SCM_RIGHTS. An accept thread on the
 * listening side serves every incoming socket at once from one poll()
 * loop (authenticate, receive the set-up, map the region) and parks the
 * finished connection per peer rank until accept() takes it, so a dialler
 * never waits for the acceptor's code to reach its accept() call.
 *
 * Abstract socket names are visible to every user (/proc/net/unix), so
 * the listener refuses a peer of another uid at accept (SO_PEERCRED): only
 * the job's own user can map its memory anyway. A silent or slow socket
 * costs one pollfd until its handshake limit, never a member's time; room
 * for newcomers never comes from a member's proven socket. A parked set-up
 * is acknowledged with one byte (BRAID_SHM_SETUP_ACK), the dialler's cue
 * that the connection exists on both sides. */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap/auth.h"
#include "bootstrap/sock.h"
#include "clock.h"
#include "log.h"
#include "shm.h"
#include "shm_conn.h"
#include "status.h"
#include "transports/common/acceptor.h"

#define PENDING_MAX 64 /* sockets in set-up at once; beyond, the oldest unproven goes */

/* An incoming socket on its way to a parked connection. */
typedef struct {
    int fd;
    int64_t deadline;
    int setup;     /* 0: handshake, 1: waiting for the set-up message */
    int claimed;   /* rank whose slot this socket holds (-1: none) */
    braid_auth_accept hs;
} pending;

typedef struct {
    braid_acceptor core;       /* first: braid_listener * downcasts to this */
    braid_shm_conn **parked;   /* [core.ctx.size]: connections not yet accept()ed */
    uint8_t *taken;            /* [core.ctx.size] */
    uint8_t *claimed;          /* [core.ctx.size]: authenticated, set-up under way (accept thread only) */
    pending *pend;             /* [PENDING_MAX] (accept thread only) */
    int npend;
    unsigned refused_uids;     /* other-uid connections refused, for the log */
} shm_listener;

static shm_listener *listener_of(braid_listener *l)
{
    return (shm_listener *)l;
}

/* The verdict on an authenticated dialler. */
static uint32_t judge(shm_listener *l, const braid_hello *h)
{
    uint32_t verdict = BRAID_AUTH_ACCEPTED;
    if (h->pg_tag != l->core.ctx.pg_tag)
        verdict = BRAID_AUTH_REJECT_GROUP;
    else if (h->target != l->core.ctx.rank || h->rank >= l->core.ctx.size || h->rank == l->core.ctx.rank)
        verdict = BRAID_AUTH_REJECT_RANK;
    else if (h->nsocks != 1 || h->sock_index != 0)
        verdict = BRAID_AUTH_REJECT_SOCKETS;
    else {
        pthread_mutex_lock(&l->core.mu);
        if (l->taken[h->rank] || l->parked[h->rank] || l->claimed[h->rank])
            verdict = BRAID_AUTH_REJECT_DUPLICATE;
        pthread_mutex_unlock(&l->core.mu);
    }
    if (verdict != BRAID_AUTH_ACCEPTED)
        BRAID_WARN("rank %d: refusing shared-memory rank %d: %s", l->core.ctx.rank, h->rank,
                   braid__auth_result_string(verdict));
    return verdict;
}

/* Receive the set-up message and its three descriptors. */
static braid_status recv_setup(int fd, int64_t deadline, braid_shm_setup *setup, int fds[3])
{
    union {
        char buf[CMSG_SPACE(3 * sizeof(int))];
        struct cmsghdr align;
    } u;
    uint8_t raw[sizeof(braid_shm_setup)];
    struct iovec iov = {.iov_base = raw, .iov_len = sizeof(raw)};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf)};
    ssize_t n;
    for (;;) {
        n = recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            break;
        int left = braid__ms_until(deadline);
        if (left == 0)
            return braid__error_quiet(BRAID_ERR_TIMEOUT, "no shared-memory set-up in time");
        struct pollfd p = {.fd = fd, .events = POLLIN};
        poll(&p, 1, left);
    }
    if (n < 0)
        return braid__error_quiet(BRAID_ERR_PEER, "receiving the shared-memory set-up: %m");
    int got = 0;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
            continue;
        size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k; i++) {
            int f;
            memcpy(&f, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
            if (got < 3)
                fds[got++] = f;
            else
                close(f); /* more than we asked for: not ours to keep */
        }
    }
    if ((size_t)n != sizeof(raw) || got != 3 || (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
        for (int i = 0; i < got; i++)
            close(fds[i]);
        return braid__error_quiet(BRAID_ERR_PEER, "malformed shared-memory set-up (%zd bytes, %d fds)", n, got);
    }
    memcpy(setup, raw, sizeof(*setup));
    return BRAID_OK;
}

/* Close a pending socket (why: NULL when handed on) and free its slot. */
static void pending_drop(shm_listener *l, int i, const char *why)
{
    pending *p = &l->pend[i];
    if (why)
        BRAID_LOG(p->hs.bytes_in ? BRAID_LOG_WARN : BRAID_LOG_INFO, "rank %d: dropped a shared-memory connection: %s",
                  l->core.ctx.rank, why);
    if (p->fd >= 0)
        close(p->fd);
    if (p->claimed >= 0)
        l->claimed[p->claimed] = 0;
    braid__auth_accept_clear(&p->hs);
    l->pend[i] = l->pend[--l->npend];
}

/* The set-up message of an authenticated dialler: map and park. */
static void finish_setup(shm_listener *l, int i)
{
    pending *p = &l->pend[i];
    braid_shm_setup setup;
    int fds[3];
    braid_shm_conn *c;
    int rank = p->hs.peer.rank;
    if (recv_setup(p->fd, p->deadline, &setup, fds) != BRAID_OK) {
        pending_drop(l, i, braid_last_error());
        return;
    }
    if (setup.magic != BRAID_SHM_MAGIC || setup.version != BRAID_WIRE_VERSION || setup.ring_bytes < 4096 ||
        setup.ring_bytes > ((uint64_t)1 << 30) || (setup.ring_bytes & (setup.ring_bytes - 1))) {
        braid__error_quiet(BRAID_ERR_PEER, "bad shared-memory set-up header");
        goto err_close_fds;
    }
    int efd[2] = {fds[1], fds[2]};
    if (braid__shm_conn_create(l->core.ctx.rank, rank, 1, p->fd, fds[0], efd, (size_t)setup.ring_bytes, &c) != BRAID_OK)
        goto err_close_fds;
    p->fd = -1; /* the connection owns it now */
    /* The dialler counts itself connected only on this byte: a socket we
     * drop during set-up is never a connection one side believes in. */
    if (send(c->sock, BRAID_SHM_SETUP_ACK, 1, MSG_NOSIGNAL | MSG_DONTWAIT) != 1) {
        braid__error_quiet(BRAID_ERR_PEER, "acknowledging the shared-memory set-up: %m");
        braid__shm_close(&c->base);
        pending_drop(l, i, braid_last_error());
        return;
    }
    pthread_mutex_lock(&l->core.mu);
    l->parked[rank] = c; /* claimed by this socket alone: the slot is empty */
    pthread_cond_broadcast(&l->core.cv);
    pthread_mutex_unlock(&l->core.mu);
    BRAID_TRACE("rank %d: shared-memory peer %d authenticated", l->core.ctx.rank, rank);
    pending_drop(l, i, NULL);
    return;

err_close_fds:
    for (int k = 0; k < 3; k++)
        close(fds[k]);
    pending_drop(l, i, braid_last_error());
}

/* Move pending socket i on; it may be dropped (and slot i refilled). */
static void pending_step(shm_listener *l, int i)
{
    pending *p = &l->pend[i];
    if (p->setup) {
        finish_setup(l, i);
        return;
    }
    if (braid__auth_accept_step(&p->hs, p->fd) != BRAID_OK) {
        pending_drop(l, i, braid_last_error());
        return;
    }
    if (p->hs.state == BRAID_AUTH_VERIFIED) {
        uint32_t verdict = judge(l, &p->hs.peer);
        if (verdict == BRAID_AUTH_ACCEPTED) {
            p->claimed = p->hs.peer.rank;
            l->claimed[p->claimed] = 1;
        }
        braid__auth_accept_finish(&p->hs, verdict);
        if (braid__auth_accept_step(&p->hs, p->fd) != BRAID_OK) {
            pending_drop(l, i, braid_last_error());
            return;
        }
    }
    if (p->hs.state == BRAID_AUTH_DONE) {
        if (p->hs.result != BRAID_AUTH_ACCEPTED) {
            pending_drop(l, i, braid__auth_result_string(p->hs.result));
            return;
        }
        p->setup = 1;
    }
}

/* Only the job's user may connect: refuse others before reading a byte. */
static int peer_is_us(shm_listener *l, int fd)
{
    struct ucred cred;
    socklen_t len = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || len != sizeof(cred)) {
        BRAID_WARN("rank %d: shared-memory connection without peer credentials: %m; refused", l->core.ctx.rank);
        return 0;
    }
    if (cred.uid == geteuid())
        return 1;
    /* Say it once, then count: a flood must not flood the log. */
    if (l->refused_uids++ == 0)
        BRAID_WARN("rank %d: refused a shared-memory connection from uid %u (pid %d): not this job's user (uid %u)",
                   l->core.ctx.rank, (unsigned)cred.uid, (int)cred.pid, (unsigned)geteuid());
    return 0;
}

static void accept_new(shm_listener *l)
{
    for (;;) {
        int fd = accept4(l->core.listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOMEM || errno == ENOBUFS) {
                BRAID_WARN("rank %d: shared-memory accept: %m; pausing", l->core.ctx.rank);
                poll(NULL, 0, 100);
            }
            return;
        }
        if (!peer_is_us(l, fd)) {
            close(fd);
            continue;
        }
        if (l->npend == PENDING_MAX) {
            /* Room from the oldest socket that has not proven the secret,
             * one that has sent nothing first; a member's, once proven, is
             * never the one dropped. With none, the newcomer waits its turn:
             * its dialler connects again. */
            int oldest = -1;
            for (int i = 0; i < l->npend; i++) {
                const pending *p = &l->pend[i], *o = oldest >= 0 ? &l->pend[oldest] : NULL;
                if (p->claimed >= 0 || p->setup)
                    continue;
                if (!o || (p->hs.bytes_in == 0) > (o->hs.bytes_in == 0) ||
                    ((p->hs.bytes_in == 0) == (o->hs.bytes_in == 0) && p->deadline < o->deadline))
                    oldest = i;
            }
            if (oldest < 0) {
                BRAID_INFO("rank %d: %d shared-memory connections in set-up, all proven: a newcomer waits",
                           l->core.ctx.rank, l->npend);
                close(fd);
                continue;
            }
            pending_drop(l, oldest, "too many connections in set-up: oldest unproven dropped");
        }
        pending *p = &l->pend[l->npend];
        braid_hello self = {
            .role = BRAID_ROLE_TCP_ACCEPT, .rank = l->core.ctx.rank, .target = -1, .pg_tag = l->core.ctx.pg_tag};
        if (braid__auth_accept_init(&p->hs, l->core.ctx.secret, &self, BRAID_ROLE_TCP_CONNECT) != BRAID_OK) {
            BRAID_WARN("rank %d: shared-memory accept: %s", l->core.ctx.rank, braid_last_error());
            close(fd);
            continue;
        }
        p->fd = fd;
        p->setup = 0;
        p->claimed = -1;
        p->deadline = braid__now_ms() + l->core.hs_timeout_ms;
        l->npend++;
    }
}

static void *accept_main(void *arg)
{
    shm_listener *l = arg;
    struct pollfd pfd[2 + PENDING_MAX];
    for (;;) {
        int64_t now = braid__now_ms();
        for (int i = 0; i < l->npend;) {
            if (l->pend[i].deadline <= now)
                pending_drop(l, i, "no complete handshake and set-up in time");
            else
                i++;
        }
        int timeout = -1;
        pfd[0] = (struct pollfd){.fd = l->core.wake[0], .events = POLLIN};
        pfd[1] = (struct pollfd){.fd = l->core.listen_fd, .events = POLLIN};
        int n = l->npend;
        for (int i = 0; i < n; i++) {
            pending *p = &l->pend[i];
            pfd[2 + i] = (struct pollfd){.fd = p->fd, .events = p->setup ? POLLIN : braid__auth_accept_events(&p->hs)};
            int left = braid__ms_until(p->deadline);
            if (timeout < 0 || left < timeout)
                timeout = left;
        }
        int rc = poll(pfd, (nfds_t)(2 + n), timeout);
        if (rc < 0) {
            if (errno != EINTR) {
                BRAID_WARN("rank %d: shared-memory listener poll: %m", l->core.ctx.rank);
                poll(NULL, 0, 100);
            }
            continue;
        }
        if (pfd[0].revents)
            break;
        /* Backwards: a drop moves the last entry into the freed slot. */
        for (int i = n - 1; i >= 0; i--)
            if (pfd[2 + i].revents)
                pending_step(l, i);
        if (pfd[1].revents)
            accept_new(l);
    }
    while (l->npend > 0)
        pending_drop(l, l->npend - 1, NULL);
    return NULL;
}

braid_status braid__shm_listen(const braid_transport_ctx *ctx, braid_listener **listener, char addr[BRAID_ADDR_MAX])
{
    braid_status st;
    if (ctx->size < 1 || ctx->rank < 0 || ctx->rank >= ctx->size)
        return braid__error(BRAID_ERR_INVALID_ARG, "shm listen: rank %d of %d", ctx->rank, ctx->size);
    shm_listener *l = calloc(1, sizeof(*l));
    if (!l)
        return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: out of memory for a listener", ctx->rank);
    braid__acceptor_init(&l->core, &braid__shm_ops, ctx, BRAID_SHM_HANDSHAKE_MAX_MS);
    l->parked = calloc((size_t)ctx->size, sizeof(*l->parked));
    l->taken = calloc((size_t)ctx->size, 1);
    l->claimed = calloc((size_t)ctx->size, 1);
    l->pend = calloc(PENDING_MAX, sizeof(*l->pend));
    if (!l->parked || !l->taken || !l->claimed || !l->pend) {
        st = braid__error(BRAID_ERR_NO_MEMORY, "rank %d: out of memory for %d peers", ctx->rank, ctx->size);
        goto err_free;
    }
    uint8_t rnd[8];
    BRAID_CHECK_GOTO(braid__random_bytes(rnd, sizeof(rnd)), st, err_free);
    uint64_t salt;
    memcpy(&salt, rnd, sizeof(salt));
    snprintf(l->core.addr, sizeof(l->core.addr), BRAID_SHM_ADDR_PREFIX "braid-shm-%016" PRIx64 "-%d-%016" PRIx64, ctx->pg_tag,
             ctx->rank, salt);
    struct sockaddr_un sa;
    socklen_t salen;
    BRAID_CHECK_GOTO(braid__shm_addr_parse(l->core.addr, &sa, &salen), st, err_free);
    l->core.listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (l->core.listen_fd < 0) {
        st = braid__error(BRAID_ERR_SYSTEM, "rank %d: unix socket: %m", ctx->rank);
        goto err_free;
    }
    if (bind(l->core.listen_fd, (struct sockaddr *)&sa, salen) != 0 || listen(l->core.listen_fd, 128) != 0) {
        st = braid__error(BRAID_ERR_SYSTEM, "rank %d: listening on %s: %m", ctx->rank, l->core.addr);
        goto err_close_listen;
    }
    BRAID_CHECK_GOTO(braid__acceptor_start(&l->core, accept_main, l, "shared-memory accept thread"), st,
                     err_close_listen);
    snprintf(addr, BRAID_ADDR_MAX, "%s", l->core.addr);
    BRAID_INFO("rank %d: shm listening on %s", ctx->rank, l->core.addr);
    *listener = &l->core.base;
    return BRAID_OK;

err_close_listen:
    close(l->core.listen_fd);
err_free:
    free(l->parked);
    free(l->taken);
    free(l->claimed);
    free(l->pend);
    free(l);
    return st;
}

braid_status braid__shm_accept(braid_listener *listener, int peer, int timeout_ms, braid_conn **conn)
{
    shm_listener *l = listener_of(listener);
    struct timespec ts;
    BRAID_CHECK(braid__acceptor_deadline(&l->core, peer, &timeout_ms, &ts));
    braid_status st;
    pthread_mutex_lock(&l->core.mu);
    while (!l->core.stopping && !l->taken[peer] && !l->parked[peer]) {
        if (pthread_cond_timedwait(&l->core.cv, &l->core.mu, &ts) == ETIMEDOUT && !l->parked[peer]) {
            st = braid__error(BRAID_ERR_TIMEOUT, "rank %d: timed out after %d ms waiting for peer %d to connect to %s",
                              l->core.ctx.rank, timeout_ms, peer, l->core.addr);
            goto out_unlock;
        }
    }
    st = braid__acceptor_check(&l->core, peer, l->taken[peer]);
    if (st != BRAID_OK)
        goto out_unlock;
    braid_shm_conn *c = l->parked[peer];
    l->parked[peer] = NULL; /* the caller owns it now */
    l->taken[peer] = 1;
    pthread_mutex_unlock(&l->core.mu);
    BRAID_INFO("rank %d: accepted shared-memory peer %d", l->core.ctx.rank, peer);
    *conn = &c->base;
    return BRAID_OK;

out_unlock:
    pthread_mutex_unlock(&l->core.mu);
    return st;
}

void braid__shm_close_listener(braid_listener *listener)
{
    if (!listener)
        return;
    shm_listener *l = listener_of(listener);
    braid__acceptor_stop(&l->core);
    for (int r = 0; r < l->core.ctx.size; r++)
        if (l->parked[r])
            braid__shm_close(&l->parked[r]->base);
    free(l->parked);
    free(l->taken);
    free(l->claimed);
    free(l->pend);
    braid__acceptor_fini(&l->core);
    free(l);
}
