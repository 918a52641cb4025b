/* Shared-memory connection set-up, the dialling side: connect to the
 * peer's abstract socket (waiting for backlog room in the kernel's queue),
 * run the job-secret handshake as initiator, send the memfd and both
 * eventfds, and count the connection made only on the listener's
 * acknowledgement, so that a socket the listener drops is a connection on
 * neither side; a dial the listener dropped is tried again while time is
 * left. The listening side is shm_listen.c. */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "bootstrap/auth.h"
#include "bootstrap/sock.h"
#include "clock.h"
#include "log.h"
#include "shm.h"
#include "shm_conn.h"
#include "status.h"

#define DIAL_RETRY_MS 5 /* while the peer does not listen yet, and per attempt after a drop */

/* "unix:@name" -> abstract address (leading NUL, no terminator). */
braid_status braid__shm_addr_parse(const char *text, struct sockaddr_un *sa, socklen_t *len)
{
    size_t plen = strlen(BRAID_SHM_ADDR_PREFIX);
    if (strncmp(text, BRAID_SHM_ADDR_PREFIX, plen) != 0)
        return braid__error(BRAID_ERR_INVALID_ARG, "shm: '%s' is not a shared-memory address", text);
    const char *name = text + plen;
    size_t n = strlen(name);
    if (n == 0 || n + 1 > sizeof(sa->sun_path))
        return braid__error(BRAID_ERR_INVALID_ARG, "shm: address '%s' has a bad length", text);
    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    memcpy(sa->sun_path + 1, name, n);
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
    return BRAID_OK;
}

static braid_status send_setup(int fd, size_t ring_bytes, const int fds[3], int64_t deadline, const char *what)
{
    braid_shm_setup setup = {.magic = BRAID_SHM_MAGIC, .version = BRAID_WIRE_VERSION, .ring_bytes = ring_bytes};
    union {
        char buf[CMSG_SPACE(3 * sizeof(int))];
        struct cmsghdr align;
    } u;
    memset(&u, 0, sizeof(u));
    struct iovec iov = {.iov_base = &setup, .iov_len = sizeof(setup)};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf)};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(3 * sizeof(int));
    memcpy(CMSG_DATA(cm), fds, 3 * sizeof(int));
    for (;;) {
        ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n == (ssize_t)sizeof(setup))
            return BRAID_OK;
        if (n >= 0)
            return braid__error(BRAID_ERR_PEER, "%s: short shared-memory set-up write", what);
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return braid__error(braid__sock_errno_status(errno), "%s: sending the shared-memory set-up: %m", what);
        int left = braid__ms_until(deadline);
        if (left == 0)
            return braid__error(BRAID_ERR_TIMEOUT, "%s: timed out sending the shared-memory set-up", what);
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        poll(&p, 1, left);
    }
}

/* The listener's acknowledgement of our set-up: 1 when it came, 0 when
 * the listener dropped the socket first (it was full of connections in
 * set-up), or an error. */
static braid_status await_ack(int fd, int64_t deadline, const char *what, int *acked)
{
    for (;;) {
        char b;
        ssize_t n = recv(fd, &b, 1, MSG_DONTWAIT);
        if (n == 1 && b == BRAID_SHM_SETUP_ACK[0]) {
            *acked = 1;
            return BRAID_OK;
        }
        if (n == 1)
            return braid__error(BRAID_ERR_PEER, "%s: the listener answered the set-up with byte 0x%02x", what,
                                (unsigned char)b);
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            *acked = 0;
            return BRAID_OK;
        }
        int left = braid__ms_until(deadline);
        if (left == 0)
            return braid__error(BRAID_ERR_TIMEOUT, "%s: the listener did not acknowledge the set-up in time", what);
        struct pollfd p = {.fd = fd, .events = POLLIN};
        poll(&p, 1, left);
    }
}

/* One attempt: *dropped when the listener closed the socket before it
 * proved itself or acknowledged the set-up (busy: try again). */
static braid_status connect_once(const braid_transport_ctx *ctx, int peer, const struct sockaddr_un *sa,
                                 socklen_t salen, int timeout_ms, int64_t deadline, const char *what,
                                 braid_conn **conn, int *dropped)
{
    braid_status st;
    int fd = -1;
    *dropped = 0;
    /* Retry while the peer is not listening yet. A full backlog is waited
     * for in connect() itself, bounded by SO_SNDTIMEO: the kernel queues
     * the waiters, where polling again would lose every race to a process
     * that floods the listener with blocking connects. */
    for (;;) {
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return braid__error(BRAID_ERR_SYSTEM, "%s: unix socket: %m", what);
        int left = braid__ms_until(deadline);
        struct timeval tv = {.tv_sec = (left > 0 ? left : 1) / 1000, .tv_usec = ((left > 0 ? left : 1) % 1000) * 1000};
        if (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) == 0 &&
            connect(fd, (const struct sockaddr *)sa, salen) == 0 && braid__sock_set_nonblock(fd) == BRAID_OK)
            break;
        int err = errno;
        close(fd);
        if (err != ECONNREFUSED && err != ENOENT && err != EAGAIN && err != EINTR) {
            errno = err;
            return braid__error(BRAID_ERR_PEER, "%s: connect: %m", what);
        }
        if (braid__ms_until(deadline) == 0) {
            errno = err;
            return braid__error(BRAID_ERR_TIMEOUT, "%s: no listener after %d ms: %m", what, timeout_ms);
        }
        poll(NULL, 0, DIAL_RETRY_MS);
    }
    braid_hello self = {.role = BRAID_ROLE_TCP_CONNECT, .rank = ctx->rank, .target = peer, .pg_tag = ctx->pg_tag,
                        .sock_index = 0, .nsocks = 1};
    braid_hello ph;
    uint32_t result;
    st = braid__auth_initiate(fd, ctx->secret, &self, BRAID_ROLE_TCP_ACCEPT, deadline, what, &ph, &result);
    if (st != BRAID_OK) {
        *dropped = st == BRAID_ERR_PEER;
        goto err_close_sock;
    }
    if (ph.rank != peer || ph.pg_tag != ctx->pg_tag) {
        st = braid__error(BRAID_ERR_AUTH, "%s: answered as rank %d of group %016" PRIx64, what, (int)ph.rank,
                          ph.pg_tag);
        goto err_close_sock;
    }
    if (result != BRAID_AUTH_ACCEPTED) {
        st = braid__error(BRAID_ERR_AUTH, "%s: refused us: %s", what, braid__auth_result_string(result));
        goto err_close_sock;
    }
    int memfd, efd[2], acked = 0;
    BRAID_CHECK_GOTO(braid__shm_region_create(ctx->rank, peer, BRAID_SHM_RING_BYTES, &memfd, efd), st, err_close_sock);
    int fds[3] = {memfd, efd[0], efd[1]};
    BRAID_CHECK_GOTO(send_setup(fd, BRAID_SHM_RING_BYTES, fds, deadline, what), st, err_close_region);
    BRAID_CHECK_GOTO(await_ack(fd, deadline, what, &acked), st, err_close_region);
    if (!acked) {
        *dropped = 1;
        st = braid__error_quiet(BRAID_ERR_PEER, "%s: the listener dropped the connection during set-up", what);
        goto err_close_region;
    }
    braid_shm_conn *c;
    BRAID_CHECK_GOTO(braid__shm_conn_create(ctx->rank, peer, 0, fd, memfd, efd, BRAID_SHM_RING_BYTES, &c), st,
                     err_close_region);
    BRAID_INFO("rank %d: connected to shared-memory peer %d", ctx->rank, peer);
    *conn = &c->base;
    return BRAID_OK;

err_close_region:
    close(memfd);
    close(efd[0]);
    close(efd[1]);
err_close_sock:
    close(fd);
    return st;
}

braid_status braid__shm_connect(const braid_transport_ctx *ctx, int peer, const char *addr, int timeout_ms,
                                braid_conn **conn)
{
    char what[BRAID_ADDR_MAX + 64];
    snprintf(what, sizeof(what), "rank %d: shared-memory peer %d (%s)", ctx->rank, peer, addr);
    struct sockaddr_un sa;
    socklen_t salen;
    BRAID_CHECK(braid__shm_addr_parse(addr, &sa, &salen));
    if (timeout_ms <= 0)
        timeout_ms = ctx->timeout_ms > 0 ? ctx->timeout_ms : 300000;
    int64_t deadline = braid__now_ms() + timeout_ms;
    for (int attempt = 1;; attempt++) {
        int dropped;
        braid_status st = connect_once(ctx, peer, &sa, salen, timeout_ms, deadline, what, conn, &dropped);
        int pause = DIAL_RETRY_MS * (attempt < 8 ? attempt : 8);
        if (st == BRAID_OK || !dropped || braid__ms_until(deadline) <= pause)
            return st;
        BRAID_INFO("%s: the listener dropped the connection before it was made (attempt %d): connecting again",
                   what, attempt);
        poll(NULL, 0, pause);
    }
}
