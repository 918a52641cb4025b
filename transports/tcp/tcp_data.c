/* TCP data path: posting, non-blocking progress and completion.
 *
 * Each direction of a connection is a FIFO of caller-owned requests. Every
 * socket walks that FIFO on its own, moving its stripe of each message
 * (tcp_conn.h) with scatter/gather calls that may cover many queued
 * messages at once; a request is complete when every socket has moved its
 * stripe, and completions are reported in posting order. Nothing here
 * blocks except progress(), and that only in poll() when nothing moved. */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "clock.h"
#include "log.h"
#include "param.h"
#include "status.h"
#include "tcp_conn.h"
#include "bytes.h"

#define IOV_BATCH 64
#define POLL_STACK_FDS 64

/* Request scratch (braid_req.tp). */
#define TP_HDR 0     /* the 8 header bytes, as sent or received */
#define TP_PENDING 1 /* sockets that still have to move their stripe */

static size_t hdr_bytes(int k)
{
    return k == 0 ? BRAID_TCP_HDR_BYTES : 0;
}

/* Bytes socket k moves for req: its stripe, plus the header on socket 0. */
static size_t work_bytes(const braid_tcp_conn *c, const braid_req *r, int k)
{
    size_t off, len;
    braid__tcp_stripe(r->len, c->nsocks, k, &off, &len);
    return len + hdr_bytes(k);
}

static braid_req *next_for(const braid_tcp_conn *c, braid_req *r, int k)
{
    while (r && work_bytes(c, r, k) == 0)
        r = r->next;
    return r;
}

/* Record the connection's first failure (logged once, here) and return it. */
static braid_status conn_fail(braid_tcp_conn *c, braid_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static braid_status conn_fail(braid_tcp_conn *c, braid_status st, const char *fmt, ...)
{
    char text[448];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    braid__error(st, "rank %d: peer %d (%s) %s", c->rank, c->base.peer, c->addr, text);
    snprintf(c->error_text, sizeof(c->error_text), "%s", braid_last_error());
    c->base.error = st;
    return st;
}

/* The sticky error again, with its text in this thread's buffer. */
static braid_status conn_error(const braid_tcp_conn *c)
{
    braid__error_set_text(c->error_text);
    return c->base.error;
}

static void sock_name(const braid_tcp_conn *c, int k, char *buf, size_t cap)
{
    if (c->nsocks > 1)
        snprintf(buf, cap, " (socket %d of %d)", k, c->nsocks);
    else
        buf[0] = '\0';
}

static braid_status io_error(braid_tcp_conn *c, int k, int err, const char *op)
{
    char sn[48];
    sock_name(c, k, sn, sizeof(sn));
    errno = err;
    braid_status st = braid__sock_errno_status(err);
    if (err == EPIPE || err == ECONNRESET)
        return conn_fail(c, BRAID_ERR_PEER, "closed the connection during %s%s: %m", op, sn);
    return conn_fail(c, st, "%s failed%s: %m", op, sn);
}

/* Gather the iovecs socket k still owes, starting at its cursor. */
static int build_iov(const braid_tcp_conn *c, int k, braid_req *r, size_t off, struct iovec *iov)
{
    int n = 0;
    for (; r && n <= IOV_BATCH - 2; r = next_for(c, r->next, k), off = 0) {
        size_t s_off, s_len, h = hdr_bytes(k);
        braid__tcp_stripe(r->len, c->nsocks, k, &s_off, &s_len);
        if (off < h) {
            iov[n++] = (struct iovec){(uint8_t *)&r->tp[TP_HDR] + off, h - off};
            off = h;
        }
        if (s_len > off - h)
            iov[n++] = (struct iovec){(uint8_t *)r->buf + s_off + (off - h), s_len - (off - h)};
    }
    return n;
}

/* Account for n bytes moved by socket k in direction cur/off. Checks each
 * received header as it completes. */
static braid_status advance(braid_tcp_conn *c, int k, braid_req **cur, size_t *off, size_t n, int recv)
{
    while (n > 0) {
        braid_req *r = *cur;
        size_t w = work_bytes(c, r, k), h = hdr_bytes(k);
        size_t step = w - *off < n ? w - *off : n;
        size_t before = *off > h ? *off - h : 0, after = *off + step > h ? *off + step - h : 0;
        int hdr_done = recv && h && *off < h && *off + step >= h;
        r->moved += after - before;
        *off += step;
        n -= step;
        if (hdr_done) {
            uint64_t sent = braid__get_be64((const uint8_t *)&r->tp[TP_HDR]);
            if (sent != (uint64_t)r->len)
                return conn_fail(c, BRAID_ERR_MISMATCH,
                                 "sent a message of %llu bytes where this rank posted a receive of %zu bytes "
                                 "(ranks called different operations?)",
                                 (unsigned long long)sent, r->len);
        }
        if (*off == w) {
            r->tp[TP_PENDING]--;
            *cur = next_for(c, r->next, k);
            *off = 0;
        }
    }
    return BRAID_OK;
}

static braid_status sock_send(braid_tcp_conn *c, int k, int *moved)
{
    braid_tcp_sock *s = &c->socks[k];
    struct iovec iov[IOV_BATCH];
    while (s->send_cur) {
        int n_iov = build_iov(c, k, s->send_cur, s->send_off, iov);
        size_t want = 0;
        for (int i = 0; i < n_iov; i++)
            want += iov[i].iov_len;
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)n_iov};
        ssize_t n = sendmsg(s->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return BRAID_OK;
            return io_error(c, k, errno, "send");
        }
        *moved = 1;
        BRAID_CHECK(advance(c, k, &s->send_cur, &s->send_off, (size_t)n, 0));
        if ((size_t)n < want)
            return BRAID_OK; /* the socket buffer is full */
    }
    return BRAID_OK;
}

static braid_status sock_recv(braid_tcp_conn *c, int k, int *moved)
{
    braid_tcp_sock *s = &c->socks[k];
    struct iovec iov[IOV_BATCH];
    while (s->recv_cur) {
        int n_iov = build_iov(c, k, s->recv_cur, s->recv_off, iov);
        size_t want = 0;
        for (int i = 0; i < n_iov; i++)
            want += iov[i].iov_len;
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)n_iov};
        ssize_t n = recvmsg(s->fd, &msg, MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return BRAID_OK;
            return io_error(c, k, errno, "recv");
        }
        if (n == 0) {
            char sn[48];
            sock_name(c, k, sn, sizeof(sn));
            return conn_fail(c, BRAID_ERR_PEER,
                             "closed the connection during recv%s: %zu of %zu bytes of the current message received",
                             sn, s->recv_cur->moved, s->recv_cur->len);
        }
        *moved = 1;
        BRAID_CHECK(advance(c, k, &s->recv_cur, &s->recv_off, (size_t)n, 1));
        if ((size_t)n < want)
            return BRAID_OK; /* drained what has arrived */
    }
    return BRAID_OK;
}

/* Report finished requests, oldest first, stopping at the first that is
 * not finished: completion follows posting order. */
static void complete(braid_tcp_conn *c, braid_req **head, braid_req **tail, int *moved)
{
    while (*head && (*head)->tp[TP_PENDING] == 0) {
        braid_req *r = *head;
        *head = r->next;
        if (!*head)
            *tail = NULL;
        r->next = NULL;
        r->done = 1; /* last touch: the caller may reuse r from here on */
        *moved = 1;
        c->unseen_done = 1;
    }
}

static braid_status conn_progress(braid_tcp_conn *c, int *moved)
{
    if (c->base.error != BRAID_OK)
        return conn_error(c);
    braid_status st = BRAID_OK;
    for (int k = 0; k < c->nsocks && st == BRAID_OK; k++) {
        if (c->socks[k].send_cur)
            st = sock_send(c, k, moved);
        if (st == BRAID_OK && c->socks[k].recv_cur)
            st = sock_recv(c, k, moved);
    }
    /* Even after a failure, report what fully arrived before it: a call
     * fingerprint received just ahead of a mismatched message lets the
     * algorithm name both calls. */
    complete(c, &c->send_head, &c->send_tail, moved);
    complete(c, &c->recv_head, &c->recv_tail, moved);
    return st;
}

static braid_status post(braid_tcp_conn *c, braid_req *req, braid_req_kind kind, void *buf, size_t len)
{
    if (c->base.error != BRAID_OK)
        return conn_error(c);
    if (!req || (len && !buf))
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: %s to peer %d with a NULL %s", c->rank,
                            kind == BRAID_REQ_SEND ? "send" : "receive", c->base.peer, req ? "buffer" : "request");
    if (kind == BRAID_REQ_SEND && c->peer_closed)
        return conn_fail(c, BRAID_ERR_PEER, "closed the connection; cannot send %zu bytes", len);
    memset(req, 0, sizeof(*req));
    req->conn = &c->base;
    req->kind = kind;
    req->buf = buf;
    req->len = len;
    if (kind == BRAID_REQ_SEND)
        braid__put_be64((uint8_t *)&req->tp[TP_HDR], (uint64_t)len);

    braid_req **head = kind == BRAID_REQ_SEND ? &c->send_head : &c->recv_head;
    braid_req **tail = kind == BRAID_REQ_SEND ? &c->send_tail : &c->recv_tail;
    if (*tail)
        (*tail)->next = req;
    else
        *head = req;
    *tail = req;
    for (int k = 0; k < c->nsocks; k++) {
        if (work_bytes(c, req, k) == 0)
            continue;
        req->tp[TP_PENDING]++;
        braid_tcp_sock *s = &c->socks[k];
        braid_req **cur = kind == BRAID_REQ_SEND ? &s->send_cur : &s->recv_cur;
        if (!*cur) {
            /* This socket has moved everything before req. */
            *cur = req;
            if (kind == BRAID_REQ_SEND)
                s->send_off = 0;
            else
                s->recv_off = 0;
        }
    }
    return BRAID_OK;
}

braid_status braid__tcp_isend(braid_conn *conn, braid_req *req, const void *buf, size_t len)
{
    return post(braid__tcp_conn_of(conn), req, BRAID_REQ_SEND, (void *)buf, len);
}

braid_status braid__tcp_irecv(braid_conn *conn, braid_req *req, void *buf, size_t len)
{
    return post(braid__tcp_conn_of(conn), req, BRAID_REQ_RECV, buf, len);
}

braid_status braid__tcp_test(braid_req *req, int *done)
{
    if (req->done) {
        *done = 1;
        return BRAID_OK;
    }
    braid_tcp_conn *c = braid__tcp_conn_of(req->conn);
    int moved = 0;
    braid_status st = conn_progress(c, &moved);
    *done = req->done;
    return req->done ? BRAID_OK : st;
}

/* poll() said socket k, with no receive posted, was hung up or failed.
 * An orderly close with data still buffered is left for the receives to
 * drain; with nothing buffered the peer is gone, which is a failure only
 * if sends are pending (it will never read them). */
static braid_status check_hangup(braid_tcp_conn *c, int k, short revents)
{
    braid_tcp_sock *s = &c->socks[k];
    char sn[48];
    sock_name(c, k, sn, sizeof(sn));
    if (revents & POLLERR) {
        int err = 0;
        socklen_t len = sizeof(err);
        if (getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err != 0)
            return io_error(c, k, err, "an idle wait");
    }
    uint8_t b;
    ssize_t n = recv(s->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return BRAID_OK;
    if (n < 0)
        return io_error(c, k, errno, "an idle wait");
    s->eof_seen = 1;
    if (n > 0)
        return BRAID_OK;
    c->peer_closed = 1;
    if (c->send_head)
        return conn_fail(c, BRAID_ERR_PEER, "closed the connection with sends pending%s", sn);
    BRAID_INFO("rank %d: peer %d (%s) closed the connection%s", c->rank, c->base.peer, c->addr, sn);
    return BRAID_OK;
}

static short sock_events(const braid_tcp_sock *s)
{
    short ev = 0;
    if (s->recv_cur)
        ev |= POLLIN;
    else if (!s->eof_seen)
        ev |= POLLRDHUP; /* a close, without waking for early data */
    if (s->send_cur)
        ev |= POLLOUT;
    return ev;
}

/* Busy-retry the connections for up to spin_us(); yields the CPU between
 * tries so that ranks sharing a core still make progress. */
static braid_status spin(braid_conn **conns, int nconns, int *moved)
{
    int us = braid__spin_us();
    if (us == 0)
        return BRAID_OK;
    int64_t until = braid__now_us() + us;
    do {
        sched_yield();
        for (int i = 0; i < nconns; i++)
            BRAID_CHECK(conn_progress(braid__tcp_conn_of(conns[i]), moved));
    } while (!*moved && braid__now_us() < until);
    return BRAID_OK;
}

braid_status braid__tcp_progress(braid_conn **conns, int nconns, int wake_fd, int timeout_ms)
{
    int moved = 0, total = 0;
    for (int i = 0; i < nconns; i++) {
        braid_tcp_conn *c = braid__tcp_conn_of(conns[i]);
        BRAID_CHECK(conn_progress(c, &moved));
        /* A request that completed inside an earlier test() call counts
         * as progress: the caller may have tested it before it finished,
         * and blocking now would sit on a completion nobody has seen. */
        moved |= c->unseen_done;
        c->unseen_done = 0;
        total += c->nsocks;
    }
    if (moved || timeout_ms == 0)
        return BRAID_OK;
    BRAID_CHECK(spin(conns, nconns, &moved));
    if (moved)
        return BRAID_OK;

    struct pollfd stack_fds[POLL_STACK_FDS];
    struct pollfd *fds = stack_fds;
    if (total + 1 > POLL_STACK_FDS) {
        fds = malloc((size_t)(total + 1) * sizeof(*fds));
        if (!fds)
            return braid__error(BRAID_ERR_NO_MEMORY, "out of memory for %d pollfds", total + 1);
    }
    int n = 0;
    for (int i = 0; i < nconns; i++) {
        braid_tcp_conn *c = braid__tcp_conn_of(conns[i]);
        for (int k = 0; k < c->nsocks; k++) {
            short ev = sock_events(&c->socks[k]);
            fds[n++] = (struct pollfd){.fd = ev ? c->socks[k].fd : -1, .events = ev};
        }
    }
    int wake_at = -1;
    if (wake_fd >= 0) {
        wake_at = n;
        fds[n++] = (struct pollfd){.fd = wake_fd, .events = POLLIN};
    }
    braid_status st = BRAID_OK;
    int rc = poll(fds, (nfds_t)n, timeout_ms < 0 ? -1 : timeout_ms);
    if (rc < 0 && errno != EINTR) {
        st = braid__error(BRAID_ERR_SYSTEM, "poll on %d sockets: %m", n);
        goto out_free;
    }
    if (rc > 0 && wake_at >= 0 && fds[wake_at].revents)
        goto out_free; /* the owner wants control back; it drains wake_fd */
    if (rc > 0) {
        int j = 0;
        for (int i = 0; i < nconns && st == BRAID_OK; i++) {
            braid_tcp_conn *c = braid__tcp_conn_of(conns[i]);
            for (int k = 0; k < c->nsocks && st == BRAID_OK; k++, j++) {
                short re = fds[j].revents;
                if (re && !c->socks[k].recv_cur && (re & (POLLRDHUP | POLLHUP | POLLERR)))
                    st = check_hangup(c, k, re);
            }
        }
        for (int i = 0; i < nconns && st == BRAID_OK; i++)
            st = conn_progress(braid__tcp_conn_of(conns[i]), &moved);
    }

out_free:
    if (fds != stack_fds)
        free(fds);
    return st;
}
