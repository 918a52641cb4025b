/* Socket helpers shared by the rendezvous store and the TCP transport:
 * addresses (IPv4 and IPv6), listening and connecting with deadlines,
 * exact reads and writes on non-blocking sockets, interface addresses.
 *
 * Every socket made here is close-on-exec and non-blocking; the blocking
 * helpers wait with poll() against an absolute deadline from
 * braid__now_ms() (clock.h), so EINTR, EAGAIN and partial transfers never
 * stretch a timeout. Errors are reported through braid__error() with the
 * caller's `what` text (naming rank, peer and address) and the cause. */
#ifndef BRAID_SOCK_H
#define BRAID_SOCK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "braid.h"
#include "clock.h"

/* Socket buffer size asked for on data sockets (best effort: only when the
 * system allows it, since a smaller fixed value would disable autotuning). */
#define BRAID_SOCK_BUF_BYTES (4 * 1024 * 1024)

/* Longest printable address: "[v6%scope]:65535". */
#define BRAID_SOCK_ADDR_STR 80

typedef struct {
    struct sockaddr_storage ss;
    socklen_t len;
} braid_sockaddr;

/* Milliseconds from now until deadline_ms, clamped to [0, INT_MAX]. */
int braid__ms_until(int64_t deadline_ms);

/* Parse a numeric "ip:port" or "[ip6]:port" (no name look-up). */
braid_status braid__sock_addr_parse(const char *text, braid_sockaddr *addr);

/* Resolve host (a name or a numeric address, IPv6 with or without
 * brackets) and port; prefers the first result getaddrinfo() returns. */
braid_status braid__sock_resolve(const char *host, int port, braid_sockaddr *addr);

/* "ip:port" or "[ip6]:port"; never fails (writes "?" on a bad address). */
void braid__sock_addr_format(const braid_sockaddr *addr, char *buf, size_t cap);

/* Numeric host part alone ("10.0.0.1", "fd00::2"); IPv4-mapped IPv6
 * addresses are written as plain IPv4. */
braid_status braid__sock_addr_host(const braid_sockaddr *addr, char *ip, size_t cap);
int braid__sock_addr_port(const braid_sockaddr *addr);

/* Local / remote address of a connected socket. */
braid_status braid__sock_local_addr(int fd, braid_sockaddr *addr);
braid_status braid__sock_peer_addr(int fd, braid_sockaddr *addr);

/* Listening socket on host (numeric address; NULL, "" or a name that is not
 * a local numeric address: every interface) and port (0: ephemeral).
 * The socket carries the data-socket options, so accepted sockets inherit
 * them. Writes the bound port. */
braid_status braid__sock_listen(const char *host, int port, int *fd, int *bound_port);

/* Connect to addr before deadline_ms, retrying while the peer refuses
 * (it may not listen yet). The socket is tuned (braid__sock_tune) before
 * connecting and returned connected and non-blocking. */
braid_status braid__sock_connect(const braid_sockaddr *addr, int64_t deadline_ms, const char *what, int *fd);

/* Read / write exactly len bytes before deadline_ms (-1: no deadline).
 * A peer that closes gives BRAID_ERR_PEER, a late one BRAID_ERR_TIMEOUT. */
braid_status braid__sock_read_full(int fd, void *buf, size_t len, int64_t deadline_ms, const char *what);
braid_status braid__sock_write_full(int fd, const void *buf, size_t len, int64_t deadline_ms, const char *what);

/* Data-socket options, best effort: TCP_NODELAY, SO_KEEPALIVE and large
 * send/receive buffers when net.core.[rw]mem_max permits them. */
void braid__sock_tune(int fd);

braid_status braid__sock_set_nonblock(int fd);

/* The errno of a failed transfer, as a braid status: peer-caused errors
 * (reset, broken pipe, unreachable) are BRAID_ERR_PEER. */
braid_status braid__sock_errno_status(int err);

/* Numeric address of interface ifname (IPv4 preferred, then global IPv6,
 * then link-local IPv6 with its scope). An exact name wins; otherwise the
 * first interface whose name starts with ifname ("eth" finds eth0). */
braid_status braid__sock_ifname_ip(const char *ifname, char *ip, size_t cap);

/* First IPv4 address of an up, non-loopback interface, else 127.0.0.1. */
void braid__sock_default_ip(char *ip, size_t cap);

#endif
