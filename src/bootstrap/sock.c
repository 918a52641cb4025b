/* Socket helpers: see sock.h. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <limits.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "sock.h"
#include "status.h"

#define CONNECT_BACKOFF_MIN_MS 10
#define CONNECT_BACKOFF_MAX_MS 250

int braid__ms_until(int64_t deadline_ms)
{
    int64_t left = deadline_ms - braid__now_ms();
    if (left <= 0)
        return 0;
    return left > INT_MAX ? INT_MAX : (int)left;
}

/* poll() timeout for a deadline: -1 (none) stays infinite. */
static int poll_timeout(int64_t deadline_ms)
{
    return deadline_ms < 0 ? -1 : braid__ms_until(deadline_ms);
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* ---- addresses --------------------------------------------------------- */

static braid_status lookup(const char *host, int port, int flags, braid_sockaddr *addr, int *gai_err)
{
    char service[16];
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = flags | AI_NUMERICSERV;
    snprintf(service, sizeof(service), "%d", port);
    int rc = getaddrinfo(host, service, &hints, &res);
    *gai_err = rc;
    if (rc != 0 || !res)
        return BRAID_ERR_INVALID_ARG;
    if (res->ai_addrlen > sizeof(addr->ss)) {
        freeaddrinfo(res);
        return BRAID_ERR_INVALID_ARG;
    }
    memset(addr, 0, sizeof(*addr));
    memcpy(&addr->ss, res->ai_addr, res->ai_addrlen);
    addr->len = res->ai_addrlen;
    freeaddrinfo(res);
    return BRAID_OK;
}

braid_status braid__sock_addr_parse(const char *text, braid_sockaddr *addr)
{
    char host[BRAID_SOCK_ADDR_STR];
    if (!text)
        return braid__error(BRAID_ERR_INVALID_ARG, "address is NULL");
    const char *colon = strrchr(text, ':');
    if (!colon || colon == text)
        return braid__error(BRAID_ERR_INVALID_ARG, "address '%s' is not ip:port or [ip6]:port", text);
    const char *h = text;
    size_t hl = (size_t)(colon - text);
    if (text[0] == '[') {
        if (hl < 3 || text[hl - 1] != ']')
            return braid__error(BRAID_ERR_INVALID_ARG, "address '%s' is not ip:port or [ip6]:port", text);
        h++;
        hl -= 2;
    } else if (memchr(text, ':', hl)) {
        return braid__error(BRAID_ERR_INVALID_ARG, "address '%s': an IPv6 address needs brackets, [ip6]:port", text);
    }
    char *end;
    errno = 0;
    long port = strtol(colon + 1, &end, 10);
    if (hl == 0 || hl >= sizeof(host) || colon[1] == '\0' || *end || errno || port < 0 || port > 65535)
        return braid__error(BRAID_ERR_INVALID_ARG, "address '%s' is not ip:port or [ip6]:port", text);
    memcpy(host, h, hl);
    host[hl] = '\0';
    int gai;
    if (lookup(host, (int)port, AI_NUMERICHOST, addr, &gai) != BRAID_OK)
        return braid__error(BRAID_ERR_INVALID_ARG, "address '%s': '%s' is not a numeric IP address", text, host);
    return BRAID_OK;
}

braid_status braid__sock_resolve(const char *host, int port, braid_sockaddr *addr)
{
    char buf[256];
    if (!host || !*host || port < 0 || port > 65535)
        return braid__error(BRAID_ERR_INVALID_ARG, "cannot resolve host '%s' port %d", host ? host : "(null)", port);
    size_t hl = strlen(host);
    if (host[0] == '[' && hl > 2 && host[hl - 1] == ']' && hl - 2 < sizeof(buf)) {
        memcpy(buf, host + 1, hl - 2);
        buf[hl - 2] = '\0';
        host = buf;
    }
    int gai;
    if (lookup(host, port, 0, addr, &gai) != BRAID_OK)
        return braid__error(BRAID_ERR_INVALID_ARG, "cannot resolve host '%s': %s", host,
                            gai == EAI_SYSTEM ? strerror(errno) : gai_strerror(gai));
    return BRAID_OK;
}

braid_status braid__sock_addr_host(const braid_sockaddr *addr, char *ip, size_t cap)
{
    char host[NI_MAXHOST];
    if (addr->ss.ss_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)&addr->ss;
        if (IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr)) {
            if (!inet_ntop(AF_INET, &s6->sin6_addr.s6_addr[12], host, sizeof(host)))
                return braid__error(BRAID_ERR_SYSTEM, "inet_ntop: %m");
            goto copy;
        }
    }
    int rc = getnameinfo((const struct sockaddr *)&addr->ss, addr->len, host, sizeof(host), NULL, 0, NI_NUMERICHOST);
    if (rc != 0)
        return braid__error(BRAID_ERR_INVALID_ARG, "cannot print address: %s", gai_strerror(rc));
copy:
    if (strlen(host) >= cap)
        return braid__error(BRAID_ERR_INVALID_ARG, "address %s does not fit in %zu bytes", host, cap);
    strcpy(ip, host);
    return BRAID_OK;
}

int braid__sock_addr_port(const braid_sockaddr *addr)
{
    if (addr->ss.ss_family == AF_INET)
        return ntohs(((const struct sockaddr_in *)&addr->ss)->sin_port);
    if (addr->ss.ss_family == AF_INET6)
        return ntohs(((const struct sockaddr_in6 *)&addr->ss)->sin6_port);
    return -1;
}

void braid__sock_addr_format(const braid_sockaddr *addr, char *buf, size_t cap)
{
    char host[NI_MAXHOST];
    int saved = errno;
    if (braid__sock_addr_host(addr, host, sizeof(host)) != BRAID_OK) {
        snprintf(buf, cap, "?");
    } else if (strchr(host, ':')) {
        snprintf(buf, cap, "[%s]:%d", host, braid__sock_addr_port(addr));
    } else {
        snprintf(buf, cap, "%s:%d", host, braid__sock_addr_port(addr));
    }
    errno = saved;
}

braid_status braid__sock_local_addr(int fd, braid_sockaddr *addr)
{
    memset(addr, 0, sizeof(*addr));
    addr->len = sizeof(addr->ss);
    if (getsockname(fd, (struct sockaddr *)&addr->ss, &addr->len) != 0)
        return braid__error(BRAID_ERR_SYSTEM, "getsockname: %m");
    return BRAID_OK;
}

braid_status braid__sock_peer_addr(int fd, braid_sockaddr *addr)
{
    memset(addr, 0, sizeof(*addr));
    addr->len = sizeof(addr->ss);
    if (getpeername(fd, (struct sockaddr *)&addr->ss, &addr->len) != 0)
        return braid__error_quiet(BRAID_ERR_PEER, "getpeername: %m");
    return BRAID_OK;
}

/* ---- options ----------------------------------------------------------- */

static long read_sysctl(const char *path)
{
    FILE *f = fopen(path, "re");
    long v = -1;
    if (f) {
        if (fscanf(f, "%ld", &v) != 1)
            v = -1;
        fclose(f);
    }
    return v;
}

/* Third field of net.ipv4.tcp_[rw]mem: the autotuning ceiling. */
static long read_autotune_max(const char *path)
{
    FILE *f = fopen(path, "re");
    long lo, def, hi = -1;
    if (f) {
        if (fscanf(f, "%ld %ld %ld", &lo, &def, &hi) != 3)
            hi = -1;
        fclose(f);
    }
    return hi;
}

/* Whether to pin SO_SNDBUF / SO_RCVBUF. A fixed value turns Linux's
 * autotuning off, so it only helps where the autotuning ceiling is below
 * the wanted size and net.core.[rw]mem_max lets the fixed value through;
 * elsewhere pinning would shrink the window. Decided once per process. */
static int want_sndbuf, want_rcvbuf;
static pthread_once_t bufs_once = PTHREAD_ONCE_INIT;

static void decide_bufs(void)
{
    long wmax = read_sysctl("/proc/sys/net/core/wmem_max");
    long rmax = read_sysctl("/proc/sys/net/core/rmem_max");
    long wauto = read_autotune_max("/proc/sys/net/ipv4/tcp_wmem");
    long rauto = read_autotune_max("/proc/sys/net/ipv4/tcp_rmem");
    want_sndbuf = wauto >= 0 && wauto < BRAID_SOCK_BUF_BYTES && wmax >= BRAID_SOCK_BUF_BYTES;
    want_rcvbuf = rauto >= 0 && rauto < BRAID_SOCK_BUF_BYTES && rmax >= BRAID_SOCK_BUF_BYTES;
}

void braid__sock_tune(int fd)
{
    int one = 1, size = BRAID_SOCK_BUF_BYTES;
    pthread_once(&bufs_once, decide_bufs);
    /* Best effort: a socket without these still works, only slower or
     * slower to notice a dead peer; unix sockets in tests reject some. */
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    (void)setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    if (want_sndbuf)
        (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof(size));
    if (want_rcvbuf)
        (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof(size));
}

braid_status braid__sock_set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
        return braid__error(BRAID_ERR_SYSTEM, "fcntl(O_NONBLOCK): %m");
    return BRAID_OK;
}

braid_status braid__sock_errno_status(int err)
{
    switch (err) {
    case ECONNRESET:
    case EPIPE:
    case ECONNABORTED:
    case ETIMEDOUT:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ENETDOWN:
    case ENOTCONN:
        return BRAID_ERR_PEER;
    case ENOMEM:
    case ENOBUFS:
        return BRAID_ERR_NO_MEMORY;
    default:
        return BRAID_ERR_SYSTEM;
    }
}

/* ---- listen / connect ---------------------------------------------------- */

static braid_status bind_listen(const braid_sockaddr *addr, int *fd)
{
    char text[BRAID_SOCK_ADDR_STR];
    int one = 1, zero = 0;
    braid__sock_addr_format(addr, text, sizeof(text));
    int s = socket(addr->ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0)
        return braid__error_quiet(BRAID_ERR_SYSTEM, "listen on %s: socket: %m", text);
    (void)setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (addr->ss.ss_family == AF_INET6)
        (void)setsockopt(s, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    braid__sock_tune(s);
    if (bind(s, (const struct sockaddr *)&addr->ss, addr->len) != 0) {
        braid_status st =
            braid__error_quiet(errno == EADDRNOTAVAIL ? BRAID_ERR_INVALID_ARG : BRAID_ERR_SYSTEM,
                               "listen on %s: bind: %m", text);
        close(s);
        return st;
    }
    if (listen(s, SOMAXCONN) != 0) {
        braid_status st = braid__error_quiet(BRAID_ERR_SYSTEM, "listen on %s: listen: %m", text);
        close(s);
        return st;
    }
    *fd = s;
    return BRAID_OK;
}

static braid_status listen_any(int port, int *fd)
{
    braid_sockaddr a;
    memset(&a, 0, sizeof(a));
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&a.ss;
    s6->sin6_family = AF_INET6;
    s6->sin6_addr = in6addr_any;
    s6->sin6_port = htons((uint16_t)port);
    a.len = sizeof(*s6);
    if (bind_listen(&a, fd) == BRAID_OK)
        return BRAID_OK;
    /* No IPv6 on this host: plain IPv4 wildcard. */
    memset(&a, 0, sizeof(a));
    struct sockaddr_in *s4 = (struct sockaddr_in *)&a.ss;
    s4->sin_family = AF_INET;
    s4->sin_addr.s_addr = htonl(INADDR_ANY);
    s4->sin_port = htons((uint16_t)port);
    a.len = sizeof(*s4);
    return bind_listen(&a, fd);
}

braid_status braid__sock_listen(const char *host, int port, int *fd, int *bound_port)
{
    braid_sockaddr a;
    braid_status st;
    int s = -1, gai;
    if (port < 0 || port > 65535)
        return braid__error(BRAID_ERR_INVALID_ARG, "listen: port %d out of range", port);
    if (!host || !*host) {
        st = listen_any(port, &s);
    } else if (lookup(host, port, AI_NUMERICHOST | AI_PASSIVE, &a, &gai) == BRAID_OK) {
        st = bind_listen(&a, &s);
    } else if (lookup(host, port, AI_PASSIVE, &a, &gai) == BRAID_OK && bind_listen(&a, &s) == BRAID_OK) {
        st = BRAID_OK; /* a name for one of our own addresses */
    } else {
        /* A name that is not local (a cluster alias, say): every interface. */
        BRAID_INFO("listen: '%s' is not a local address, listening on every interface", host);
        st = listen_any(port, &s);
    }
    if (st != BRAID_OK) {
        BRAID_INFO("%s", braid_last_error());
        return st;
    }
    braid_sockaddr bound;
    st = braid__sock_local_addr(s, &bound);
    if (st != BRAID_OK) {
        close(s);
        return st;
    }
    *fd = s;
    *bound_port = braid__sock_addr_port(&bound);
    return BRAID_OK;
}

static int connect_retryable(int err)
{
    return err == ECONNREFUSED || err == ETIMEDOUT || err == ECONNRESET || err == ECONNABORTED || err == EHOSTUNREACH ||
           err == ENETUNREACH || err == EAGAIN || err == EADDRNOTAVAIL;
}

/* A connect to a local port nobody listens on can, rarely, pick that very
 * port as its own and connect to itself (TCP simultaneous open). */
static int is_self_connected(int fd)
{
    braid_sockaddr l, r;
    if (getsockname(fd, (struct sockaddr *)&l.ss, &(socklen_t){sizeof(l.ss)}) != 0)
        return 0;
    if (getpeername(fd, (struct sockaddr *)&r.ss, &(socklen_t){sizeof(r.ss)}) != 0)
        return 0;
    char a[BRAID_SOCK_ADDR_STR], b[BRAID_SOCK_ADDR_STR];
    l.len = r.len = sizeof(l.ss);
    braid__sock_addr_format(&l, a, sizeof(a));
    braid__sock_addr_format(&r, b, sizeof(b));
    return strcmp(a, b) == 0;
}

/* One attempt: 0 and a connected socket, or the errno. */
static int connect_once(const braid_sockaddr *addr, int64_t deadline_ms, int *fd)
{
    int s = socket(addr->ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0)
        return errno;
    braid__sock_tune(s);
    int err = 0;
    if (connect(s, (const struct sockaddr *)&addr->ss, addr->len) != 0) {
        err = errno;
        if (err == EINPROGRESS || err == EINTR) {
            struct pollfd p = {.fd = s, .events = POLLOUT};
            int rc;
            do {
                rc = poll(&p, 1, poll_timeout(deadline_ms));
            } while (rc < 0 && errno == EINTR);
            if (rc == 0) {
                err = ETIMEDOUT;
            } else if (rc < 0) {
                err = errno;
            } else {
                socklen_t len = sizeof(err);
                if (getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
                    err = errno;
            }
        }
    }
    if (err == 0 && is_self_connected(s))
        err = ECONNREFUSED;
    if (err != 0) {
        close(s);
        return err;
    }
    *fd = s;
    return 0;
}

braid_status braid__sock_connect(const braid_sockaddr *addr, int64_t deadline_ms, const char *what, int *fd)
{
    int backoff = CONNECT_BACKOFF_MIN_MS, attempts = 0, err;
    int64_t start = braid__now_ms();
    for (;;) {
        attempts++;
        err = connect_once(addr, deadline_ms, fd);
        if (err == 0)
            return BRAID_OK;
        if (!connect_retryable(err))
            break;
        int left = braid__ms_until(deadline_ms);
        if (left == 0)
            break;
        sleep_ms(backoff < left ? backoff : left);
        backoff = backoff * 2 > CONNECT_BACKOFF_MAX_MS ? CONNECT_BACKOFF_MAX_MS : backoff * 2;
    }
    errno = err;
    if (connect_retryable(err))
        return braid__error(BRAID_ERR_TIMEOUT, "%s: no connection after %d attempts in %lld ms, last: %m", what,
                            attempts, (long long)(braid__now_ms() - start));
    return braid__error(braid__sock_errno_status(err) == BRAID_ERR_PEER ? BRAID_ERR_PEER : BRAID_ERR_SYSTEM,
                        "%s: connect: %m", what);
}

/* ---- exact transfers ----------------------------------------------------- */

static braid_status wait_fd(int fd, short events, int64_t deadline_ms, const char *what, const char *op)
{
    struct pollfd p = {.fd = fd, .events = events};
    for (;;) {
        int rc = poll(&p, 1, poll_timeout(deadline_ms));
        if (rc > 0)
            return BRAID_OK; /* errors and hang-ups show in the next call */
        if (rc == 0)
            return braid__error(BRAID_ERR_TIMEOUT, "%s: timed out during %s", what, op);
        if (errno != EINTR)
            return braid__error(BRAID_ERR_SYSTEM, "%s: poll: %m", what);
    }
}

braid_status braid__sock_read_full(int fd, void *buf, size_t len, int64_t deadline_ms, const char *what)
{
    char *p = buf;
    size_t got = 0;
    while (got < len) {
        ssize_t n = recv(fd, p + got, len - got, 0);
        if (n > 0) {
            got += (size_t)n;
        } else if (n == 0) {
            return braid__error(BRAID_ERR_PEER, "%s: connection closed by the peer (%zu of %zu bytes read)", what, got,
                                len);
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            BRAID_CHECK(wait_fd(fd, POLLIN, deadline_ms, what, "recv"));
        } else if (errno != EINTR) {
            return braid__error(braid__sock_errno_status(errno), "%s: recv: %m", what);
        }
    }
    return BRAID_OK;
}

braid_status braid__sock_write_full(int fd, const void *buf, size_t len, int64_t deadline_ms, const char *what)
{
    const char *p = buf;
    size_t put = 0;
    while (put < len) {
        ssize_t n = send(fd, p + put, len - put, MSG_NOSIGNAL);
        if (n >= 0) {
            put += (size_t)n;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            BRAID_CHECK(wait_fd(fd, POLLOUT, deadline_ms, what, "send"));
        } else if (errno != EINTR) {
            return braid__error(braid__sock_errno_status(errno), "%s: send: %m", what);
        }
    }
    return BRAID_OK;
}

/* ---- interfaces ---------------------------------------------------------- */

/* Preference of an interface address: IPv4, then global IPv6, then
 * link-local IPv6; 0 for anything else. */
static int addr_rank(const struct sockaddr *sa)
{
    if (!sa)
        return 0;
    if (sa->sa_family == AF_INET)
        return 3;
    if (sa->sa_family == AF_INET6)
        return IN6_IS_ADDR_LINKLOCAL(&((const struct sockaddr_in6 *)sa)->sin6_addr) ? 1 : 2;
    return 0;
}

static const struct ifaddrs *best_addr(const struct ifaddrs *list, const char *ifname, int prefix)
{
    const struct ifaddrs *best = NULL;
    int best_rank = 0;
    size_t n = strlen(ifname);
    for (const struct ifaddrs *i = list; i; i = i->ifa_next) {
        int match = prefix ? (strncmp(i->ifa_name, ifname, n) == 0 && (i->ifa_flags & IFF_UP))
                           : strcmp(i->ifa_name, ifname) == 0;
        int r = match ? addr_rank(i->ifa_addr) : 0;
        if (r > best_rank) {
            best = i;
            best_rank = r;
        }
    }
    return best;
}

static braid_status ifaddr_to_ip(const struct ifaddrs *i, char *ip, size_t cap)
{
    braid_sockaddr a;
    memset(&a, 0, sizeof(a));
    a.len = i->ifa_addr->sa_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
    memcpy(&a.ss, i->ifa_addr, a.len);
    return braid__sock_addr_host(&a, ip, cap);
}

braid_status braid__sock_ifname_ip(const char *ifname, char *ip, size_t cap)
{
    struct ifaddrs *list;
    if (!ifname || !*ifname)
        return braid__error(BRAID_ERR_INVALID_ARG, "empty interface name");
    if (getifaddrs(&list) != 0)
        return braid__error(BRAID_ERR_SYSTEM, "interface %s: getifaddrs: %m", ifname);
    const struct ifaddrs *best = best_addr(list, ifname, 0);
    if (!best)
        best = best_addr(list, ifname, 1);
    braid_status st;
    if (best) {
        st = ifaddr_to_ip(best, ip, cap);
    } else {
        char names[256] = "";
        size_t o = 0;
        for (const struct ifaddrs *i = list; i; i = i->ifa_next) {
            if (!addr_rank(i->ifa_addr) || strstr(names, i->ifa_name))
                continue;
            int w = snprintf(names + o, sizeof(names) - o, "%s%s", o ? ", " : "", i->ifa_name);
            if (w < 0 || (size_t)w >= sizeof(names) - o)
                break;
            o += (size_t)w;
        }
        st = braid__error(BRAID_ERR_INVALID_ARG, "interface '%s' has no IP address (interfaces with one: %s)", ifname,
                          names);
    }
    freeifaddrs(list);
    return st;
}

void braid__sock_default_ip(char *ip, size_t cap)
{
    struct ifaddrs *list;
    if (getifaddrs(&list) == 0) {
        for (const struct ifaddrs *i = list; i; i = i->ifa_next) {
            if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && (i->ifa_flags & IFF_UP) &&
                !(i->ifa_flags & IFF_LOOPBACK) && ifaddr_to_ip(i, ip, cap) == BRAID_OK) {
                freeifaddrs(list);
                return;
            }
        }
        freeifaddrs(list);
    }
    snprintf(ip, cap, "127.0.0.1");
}
