/* Shared-memory data path: posting, ring copies, progress and waiting. */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "clock.h"
#include "log.h"
#include "param.h"
#include "shm_conn.h"
#include "status.h"

/* Passes over the connections before blocking: short, because on a host
 * with fewer cores than ranks every spin steals the peer's time slice. */
#define SPIN_PASSES 64
#define YIELD_PASSES 4
#define POLL_MAX 64

#define REQ_HDR_DONE tp[0]
#define REQ_NEED_ACKS tp[1]    /* send: peer acks that complete it */
#define REQ_CMA tp[2]          /* moved in place with process_vm_readv */
#define REQ_REMOTE tp[3]       /* receive in place: the sender's buffer */

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static braid_status conn_fail(braid_shm_conn *c, braid_status st)
{
    if (c->base.error == BRAID_OK) {
        c->base.error = st;
        snprintf(c->error_text, sizeof(c->error_text), "%s", braid_last_error());
    }
    return c->base.error;
}

static braid_status sticky(braid_shm_conn *c)
{
    braid__error_set_text(c->error_text);
    return c->base.error;
}

static void ring_write(braid_shm_conn *c, uint64_t pos, const void *src, size_t n)
{
    size_t mask = c->ring_bytes - 1, off = (size_t)pos & mask, first = c->ring_bytes - off;
    if (first > n)
        first = n;
    memcpy(c->tx_data + off, src, first);
    if (n > first)
        memcpy(c->tx_data, (const uint8_t *)src + first, n - first);
}

static void ring_read(braid_shm_conn *c, uint64_t pos, void *dst, size_t n)
{
    size_t mask = c->ring_bytes - 1, off = (size_t)pos & mask, first = c->ring_bytes - off;
    if (first > n)
        first = n;
    memcpy(dst, c->rx_data + off, first);
    if (n > first)
        memcpy((uint8_t *)dst + first, c->rx_data, n - first);
}

/* A send is written: done at once unless it (or an earlier one) waits
 * for the peer to read it in place. */
static void pop_send(braid_shm_conn *c, uint64_t acked)
{
    braid_req *r = c->send_head;
    c->send_head = r->next;
    if (!c->send_head)
        c->send_tail = NULL;
    r->next = NULL;
    r->REQ_NEED_ACKS = c->cma_sent;
    if (!c->sent_head && r->REQ_NEED_ACKS <= acked) {
        r->done = 1;
        return;
    }
    if (c->sent_tail)
        c->sent_tail->next = r;
    else
        c->sent_head = r;
    c->sent_tail = r;
}

/* Complete the written sends the peer's acks cover. */
static int reap_sent(braid_shm_conn *c, uint64_t acked)
{
    int any = 0;
    while (c->sent_head && c->sent_head->REQ_NEED_ACKS <= acked) {
        braid_req *r = c->sent_head;
        c->sent_head = r->next;
        if (!c->sent_head)
            c->sent_tail = NULL;
        r->next = NULL;
        if (r->REQ_CMA)
            r->moved = r->len;
        r->done = 1;
        any = 1;
    }
    return any;
}

/* Can we read the peer's memory? Try once, on its cookie, and tell it:
 * it sends in place only after we succeeded. */
static void cma_check(braid_shm_conn *c)
{
    braid_shm_region *r = c->region;
    int me = c->side, peer = 1 - c->side;
    if (c->peer_pid <= 0 || braid__param_int("BRAID_SHM_CMA", 1) == 0) {
        atomic_store_explicit(&r->can_read[me], 2u, memory_order_release);
        c->cma_checked = 1;
        return;
    }
    uint64_t addr = atomic_load_explicit(&r->cookie_addr[peer], memory_order_acquire);
    if (!addr)
        return; /* the peer has not mapped the region yet */
    uint64_t v = 0;
    struct iovec l = {.iov_base = &v, .iov_len = sizeof(v)};
    struct iovec rem = {.iov_base = (void *)(uintptr_t)addr, .iov_len = sizeof(v)};
    ssize_t n = process_vm_readv(c->peer_pid, &l, 1, &rem, 1, 0);
    int ok = n == (ssize_t)sizeof(v) && v == BRAID_SHM_COOKIE;
    if (!ok)
        BRAID_INFO("rank %d: peer %d: single-copy reads unavailable (%s); copying through the ring", c->rank,
                   c->base.peer, n < 0 ? strerror(errno) : "wrong cookie");
    atomic_store_explicit(&r->can_read[me], ok ? 1u : 2u, memory_order_release);
    c->cma_checked = 1;
}

/* Has the peer found it can read our memory? */
static int peer_reads_us(braid_shm_conn *c)
{
    return atomic_load_explicit(&c->region->can_read[1 - c->side], memory_order_acquire) == 1;
}

static void pop_recv(braid_shm_conn *c)
{
    braid_req *r = c->recv_head;
    c->recv_head = r->next;
    if (!c->recv_head)
        c->recv_tail = NULL;
    r->next = NULL;
    r->done = 1;
}

/* Wake the peer if it sleeps; called after this side moved a counter. The
 * fence orders our counter store before the flag load (the sleeping side
 * orders its flag store before its counter loads the same way). */
static void notify_peer(braid_shm_conn *c)
{
    int peer_side = 1 - c->side;
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&c->region->sleeping[peer_side].v, memory_order_relaxed)) {
        uint64_t one = 1;
        ssize_t w = write(c->efd[peer_side], &one, sizeof(one));
        (void)w; /* EAGAIN only when the counter is saturated: the peer is awake anyway */
    }
}

/* Read the liveness socket: it carries nothing after set-up, so readable
 * means end of file or an error. */
static void check_sock(braid_shm_conn *c, short revents)
{
    if (!(revents & (POLLIN | POLLHUP | POLLERR | POLLRDHUP)))
        return;
    char b;
    ssize_t n = recv(c->sock, &b, 1, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) || (revents & POLLHUP))
        c->peer_gone = 1;
}

/* Is the peer gone or going? Its socket hung up (a failing group closes
 * every connection before its call returns, so before the caller can free
 * the buffer we were reading), or the process no longer exists. */
static int peer_known_gone(braid_shm_conn *c)
{
    if (!c->peer_gone) {
        struct pollfd p = {.fd = c->sock, .events = POLLIN | POLLRDHUP};
        if (poll(&p, 1, 0) > 0)
            check_sock(c, p.revents);
    }
    return c->peer_gone || (c->peer_pid > 0 && kill(c->peer_pid, 0) != 0 && errno == ESRCH);
}

/* process_vm_readv of an in-place message failed with err (0: it read
 * nothing). ESRCH, or any failure once the peer is known to be gone, is
 * the peer's failure: it exited, or failed its call and released the
 * buffer (EFAULT). A bad address from a peer that is still connected is
 * not explained by a failure, so it stays a system error that says so. */
static braid_status cma_read_failed(braid_shm_conn *c, const braid_req *r, int err)
{
    if (err == ESRCH || err == 0 || peer_known_gone(c))
        return braid__error(BRAID_ERR_PEER,
                            "rank %d: peer %d failed while its message of %zu bytes was being read from its memory "
                            "(%s)",
                            c->rank, c->base.peer, r->len, err ? strerror(err) : "nothing read");
    return braid__error(BRAID_ERR_SYSTEM,
                        "rank %d: reading a message of %zu bytes from peer %d's memory at 0x%llx: %s (the peer is "
                        "still connected: its send buffer was freed or unmapped before the send completed)",
                        c->rank, r->len, c->base.peer, (unsigned long long)(r->REQ_REMOTE + r->moved), strerror(err));
}

/* Write r's header at head: its length, and for an in-place send (the peer
 * reads the payload from r->buf) the address too. 0: no room yet; else 1,
 * or 2 for an in-place send. */
static int send_header(braid_shm_conn *c, braid_req *r, uint64_t *head, size_t *space)
{
    int cma = r->len >= BRAID_SHM_CMA_MIN && peer_reads_us(c);
    size_t hdr_len = cma ? 2 * BRAID_SHM_HDR_BYTES : BRAID_SHM_HDR_BYTES;
    if (*space < hdr_len)
        return 0;
    uint8_t hdr[2 * BRAID_SHM_HDR_BYTES];
    braid__put_le64(hdr, (uint64_t)r->len | (cma ? BRAID_SHM_CMA_FLAG : 0));
    braid__put_le64(hdr + BRAID_SHM_HDR_BYTES, (uint64_t)(uintptr_t)r->buf);
    ring_write(c, *head, hdr, hdr_len);
    *head += hdr_len;
    *space -= hdr_len;
    r->REQ_HDR_DONE = 1;
    return cma ? 2 : 1;
}

/* Before r's header: jump back to the ring's start (a skip header,
 * shm_conn.h) when the space that leaves holds r whole and at least
 * BRAID_SHM_HOT_BYTES, so that the ring's used part stays small, faulted
 * in and cached. */
static void maybe_rewind(braid_shm_conn *c, const braid_req *r, uint64_t *head, uint64_t tail, size_t *space)
{
    size_t off = (size_t)*head & (c->ring_bytes - 1), used = (size_t)(*head - tail);
    size_t need = r->len >= BRAID_SHM_CMA_MIN && peer_reads_us(c) ? 2 * BRAID_SHM_HDR_BYTES
                                                                   : BRAID_SHM_HDR_BYTES + r->len;
    if (need < BRAID_SHM_HOT_BYTES)
        need = BRAID_SHM_HOT_BYTES;
    if (off < used + need || c->ring_bytes - off < BRAID_SHM_HDR_BYTES)
        return;
    uint8_t hdr[BRAID_SHM_HDR_BYTES];
    braid__put_le64(hdr, (uint64_t)(c->ring_bytes - off) | BRAID_SHM_SKIP_FLAG);
    ring_write(c, *head, hdr, sizeof(hdr));
    *head += c->ring_bytes - off;
    *space = off - used;
}

/* Complete acked sends and write the queued ones into the ring as far as
 * it has room. Returns 1 when anything moved. */
static int send_pass(braid_shm_conn *c)
{
    int any = 0;
    uint64_t acked = atomic_load_explicit(&c->region->acked[1 - c->side].v, memory_order_acquire);
    any |= reap_sent(c, acked);
    uint64_t tail = atomic_load_explicit(&c->tx->tail, memory_order_acquire);
    uint64_t head = c->tx_head;
    while (c->send_head) {
        braid_req *r = c->send_head;
        size_t space = c->ring_bytes - (size_t)(head - tail);
        if (!r->REQ_HDR_DONE) {
            maybe_rewind(c, r, &head, tail, &space);
            int written = send_header(c, r, &head, &space);
            if (!written)
                break;
            if (written == 2) {
                /* The peer's ack completes r. */
                r->REQ_CMA = 1;
                c->cma_sent++;
                pop_send(c, acked);
                continue;
            }
        }
        size_t n = r->len - r->moved;
        if (n > space)
            n = space;
        if (n) {
            ring_write(c, head, (const uint8_t *)r->buf + r->moved, n);
            head += n;
            r->moved += n;
        }
        if (r->moved < r->len)
            break;
        pop_send(c, acked);
    }
    if (head != c->tx_head) {
        c->tx_head = head;
        atomic_store_explicit(&c->tx->head, head, memory_order_release);
        any = 1;
    }
    return any;
}

/* Read r's header at tail, past any skip; an in-place message carries the
 * sender's address after it. 1 read, 0 not all there yet, -1 a length
 * other than r's or a bad skip (*st says so). */
static int recv_header(braid_shm_conn *c, braid_req *r, uint64_t *tail, size_t *avail, braid_status *st)
{
    uint8_t hdr[2 * BRAID_SHM_HDR_BYTES];
    uint64_t word;
    for (;;) {
        if (*avail < BRAID_SHM_HDR_BYTES)
            return 0;
        ring_read(c, *tail, hdr, BRAID_SHM_HDR_BYTES);
        word = braid__get_le64(hdr);
        if (!(word & BRAID_SHM_SKIP_FLAG))
            break;
        uint64_t skip = word & ~BRAID_SHM_SKIP_FLAG; /* the sender rewound (maybe_rewind) */
        /* 0 would read the same header forever */
        if (skip == 0 || skip > *avail || ((*tail + skip) & (c->ring_bytes - 1)) != 0) {
            *st = braid__error(BRAID_ERR_PEER, "rank %d: peer %d wrote a bad ring skip of %llu bytes", c->rank,
                               c->base.peer, (unsigned long long)skip);
            return -1;
        }
        *tail += skip;
        *avail -= skip;
    }
    uint64_t len = word & ~BRAID_SHM_CMA_FLAG;
    int cma = (word & BRAID_SHM_CMA_FLAG) != 0;
    if (len != (uint64_t)r->len) {
        *st = braid__error(BRAID_ERR_MISMATCH, "rank %d: peer %d sent a message of %llu bytes where %zu were expected",
                           c->rank, c->base.peer, (unsigned long long)len, r->len);
        return -1;
    }
    if (cma) {
        if (*avail < 2 * BRAID_SHM_HDR_BYTES)
            return 0; /* cannot happen: header and address are published together */
        ring_read(c, *tail + BRAID_SHM_HDR_BYTES, hdr + BRAID_SHM_HDR_BYTES, BRAID_SHM_HDR_BYTES);
        r->REQ_REMOTE = braid__get_le64(hdr + BRAID_SHM_HDR_BYTES);
        r->REQ_CMA = 1;
        *tail += BRAID_SHM_HDR_BYTES;
        *avail -= BRAID_SHM_HDR_BYTES;
    }
    *tail += BRAID_SHM_HDR_BYTES;
    *avail -= BRAID_SHM_HDR_BYTES;
    r->REQ_HDR_DONE = 1;
    return 1;
}

/* Read the next piece of an in-place message from the sender's memory;
 * *any is set when bytes came. 1 r complete, 0 more to read, -1 failed
 * (*st says why). */
static int recv_cma_piece(braid_shm_conn *c, braid_req *r, int *any, braid_status *st)
{
    size_t n = r->len - r->moved;
    if (n > BRAID_SHM_CMA_PIECE)
        n = BRAID_SHM_CMA_PIECE;
    struct iovec l = {.iov_base = (uint8_t *)r->buf + r->moved, .iov_len = n};
    struct iovec rem = {.iov_base = (void *)(uintptr_t)(r->REQ_REMOTE + r->moved), .iov_len = n};
    ssize_t got = process_vm_readv(c->peer_pid, &l, 1, &rem, 1, 0);
    if (got <= 0) {
        *st = cma_read_failed(c, r, got == 0 ? 0 : errno);
        return -1;
    }
    r->moved += (size_t)got;
    *any = 1;
    if (r->moved < r->len)
        return 0; /* a turn for the other connections */
    /* A sender that closed (abort) may have reused the buffer we just
     * read; it closes the socket before that, so a hang-up seen now means
     * the data cannot be trusted. */
    struct pollfd p = {.fd = c->sock, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) > 0) {
        check_sock(c, p.revents);
        if (c->peer_gone) {
            *st = braid__error(BRAID_ERR_PEER, "rank %d: peer %d closed while its message of %zu bytes was being read",
                               c->rank, c->base.peer, r->len);
            return -1;
        }
    }
    c->cma_read++;
    atomic_store_explicit(&c->region->acked[c->side].v, c->cma_read, memory_order_release);
    pop_recv(c);
    return 1;
}

/* Fill the posted receives from the ring, or from the sender's memory,
 * as far as data has come; *any is set when anything moved. */
static braid_status recv_pass(braid_shm_conn *c, int *any)
{
    uint64_t head = atomic_load_explicit(&c->rx->head, memory_order_acquire);
    uint64_t tail = c->rx_tail;
    braid_status st = BRAID_OK;
    while (c->recv_head) {
        braid_req *r = c->recv_head;
        size_t avail = (size_t)(head - tail);
        if (!r->REQ_HDR_DONE && recv_header(c, r, &tail, &avail, &st) <= 0)
            break;
        if (r->REQ_CMA) {
            if (recv_cma_piece(c, r, any, &st) == 1)
                continue;
            break;
        }
        size_t n = r->len - r->moved;
        if (n > avail)
            n = avail;
        if (n) {
            ring_read(c, tail, (uint8_t *)r->buf + r->moved, n);
            tail += n;
            r->moved += n;
        }
        if (r->moved < r->len)
            break;
        pop_recv(c);
    }
    if (tail != c->rx_tail) {
        c->rx_tail = tail;
        atomic_store_explicit(&c->rx->tail, tail, memory_order_release);
        *any = 1;
    }
    return st;
}

/* Move as much as the rings allow without blocking. *moved is set when any
 * byte or header went either way. */
static braid_status conn_pass(braid_shm_conn *c, int *moved)
{
    if (c->base.error != BRAID_OK)
        return sticky(c);
    if (!c->warm)
        braid__shm_conn_warm(c);
    if (!c->cma_checked)
        cma_check(c);
    int any = 0;
    if (c->sent_head || c->send_head)
        any |= send_pass(c);
    if (c->recv_head) {
        braid_status st = recv_pass(c, &any);
        if (st != BRAID_OK) {
            if (any)
                notify_peer(c);
            return conn_fail(c, st);
        }
    }
    if (any)
        notify_peer(c);
    *moved |= any;
    return BRAID_OK;
}

static int conn_busy(const braid_shm_conn *c)
{
    return c->send_head || c->recv_head || c->sent_head;
}

/* The peer hung up: whatever it wrote before is still in the ring, so
 * drain first and fail only what can no longer complete. */
static braid_status check_gone(braid_shm_conn *c)
{
    if (!c->peer_gone || !conn_busy(c))
        return BRAID_OK;
    int moved = 0;
    BRAID_CHECK(conn_pass(c, &moved));
    while (moved) {
        moved = 0;
        BRAID_CHECK(conn_pass(c, &moved));
    }
    if (!conn_busy(c))
        return BRAID_OK;
    return conn_fail(c, braid__error(BRAID_ERR_PEER,
                                     "rank %d: peer %d closed its shared-memory connection with %s pending "
                                     "(exited or killed)",
                                     c->rank, c->base.peer, c->recv_head ? "a receive" : "a send"));
}

static braid_status post_check(braid_shm_conn *c, braid_req *req)
{
    if (c->base.error != BRAID_OK)
        return sticky(c);
    if (!req)
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: NULL request for peer %d", c->rank, c->base.peer);
    return BRAID_OK;
}

braid_status braid__shm_isend(braid_conn *conn, braid_req *req, const void *buf, size_t len)
{
    braid_shm_conn *c = braid__shm_conn_of(conn);
    BRAID_CHECK(post_check(c, req));
    *req = (braid_req){.conn = conn, .kind = BRAID_REQ_SEND, .buf = (void *)buf, .len = len};
    if (c->send_tail)
        c->send_tail->next = req;
    else
        c->send_head = req;
    c->send_tail = req;
    int moved = 0;
    return conn_pass(c, &moved);
}

braid_status braid__shm_irecv(braid_conn *conn, braid_req *req, void *buf, size_t len)
{
    braid_shm_conn *c = braid__shm_conn_of(conn);
    BRAID_CHECK(post_check(c, req));
    *req = (braid_req){.conn = conn, .kind = BRAID_REQ_RECV, .buf = buf, .len = len};
    if (c->recv_tail)
        c->recv_tail->next = req;
    else
        c->recv_head = req;
    c->recv_tail = req;
    int moved = 0;
    return conn_pass(c, &moved);
}

braid_status braid__shm_test(braid_req *req, int *done)
{
    braid_shm_conn *c = braid__shm_conn_of(req->conn);
    if (!req->done) {
        int moved = 0;
        BRAID_CHECK(conn_pass(c, &moved));
        if (!req->done && !moved && c->peer_gone)
            BRAID_CHECK(check_gone(c));
    }
    *done = req->done;
    return BRAID_OK;
}

static braid_status pass_all(braid_conn **conns, int nconns, int *moved)
{
    for (int i = 0; i < nconns; i++)
        BRAID_CHECK(conn_pass(braid__shm_conn_of(conns[i]), moved));
    return BRAID_OK;
}

static void set_sleeping(braid_conn **conns, int nconns, uint32_t v)
{
    for (int i = 0; i < nconns; i++) {
        braid_shm_conn *c = braid__shm_conn_of(conns[i]);
        atomic_store_explicit(&c->region->sleeping[c->side].v, v, memory_order_relaxed);
    }
    atomic_thread_fence(memory_order_seq_cst);
}

braid_status braid__shm_progress(braid_conn **conns, int nconns, int wake_fd, int timeout_ms)
{
    int moved = 0;
    BRAID_CHECK(pass_all(conns, nconns, &moved));
    for (int i = 0; !moved && i < SPIN_PASSES; i++) {
        cpu_relax();
        BRAID_CHECK(pass_all(conns, nconns, &moved));
    }
    /* Then yield between passes for up to BRAID_SPIN_US before sleeping:
     * a peer on another core answers within microseconds, and one sharing
     * our core gets it. */
    if (!moved && timeout_ms != 0) {
        int64_t until = braid__now_us() + braid__spin_us();
        int i = 0;
        do {
            sched_yield();
            BRAID_CHECK(pass_all(conns, nconns, &moved));
        } while (!moved && (++i < YIELD_PASSES || braid__now_us() < until));
    }
    if (moved)
        return BRAID_OK;
    for (int i = 0; i < nconns; i++)
        BRAID_CHECK(check_gone(braid__shm_conn_of(conns[i])));
    if (timeout_ms == 0)
        return BRAID_OK;

    /* Announce the sleep, then look once more: a peer that moved a counter
     * before seeing our flag is caught by this pass. */
    set_sleeping(conns, nconns, 1);
    braid_status st = pass_all(conns, nconns, &moved);
    if (st != BRAID_OK || moved) {
        set_sleeping(conns, nconns, 0);
        return st;
    }
    struct pollfd pfd[2 * POLL_MAX + 1];
    int n = 0, nc = nconns < POLL_MAX ? nconns : POLL_MAX;
    for (int i = 0; i < nc; i++) {
        braid_shm_conn *c = braid__shm_conn_of(conns[i]);
        pfd[n++] = (struct pollfd){.fd = c->efd[c->side], .events = POLLIN};
        pfd[n++] = (struct pollfd){.fd = c->peer_gone ? -1 : c->sock, .events = POLLIN | POLLRDHUP};
    }
    if (wake_fd >= 0)
        pfd[n++] = (struct pollfd){.fd = wake_fd, .events = POLLIN};
    int rc = poll(pfd, (nfds_t)n, nc < nconns && (timeout_ms < 0 || timeout_ms > 1) ? 1 : timeout_ms);
    int err = errno;
    set_sleeping(conns, nconns, 0);
    if (rc < 0 && err != EINTR) {
        errno = err;
        return braid__error(BRAID_ERR_SYSTEM, "rank %d: poll on %d shared-memory connections: %m",
                            braid__shm_conn_of(conns[0])->rank, nconns);
    }
    for (int i = 0; rc > 0 && i < nc; i++) {
        braid_shm_conn *c = braid__shm_conn_of(conns[i]);
        if (pfd[2 * i].revents) {
            uint64_t v;
            ssize_t r = read(c->efd[c->side], &v, sizeof(v));
            (void)r;
        }
        check_sock(c, pfd[2 * i + 1].revents);
    }
    moved = 0;
    BRAID_CHECK(pass_all(conns, nconns, &moved));
    if (!moved)
        for (int i = 0; i < nconns; i++)
            BRAID_CHECK(check_gone(braid__shm_conn_of(conns[i])));
    return BRAID_OK;
}
