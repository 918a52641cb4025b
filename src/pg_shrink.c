/* Group shrink: after a rank failure the survivors agree on who is left and
 * go on in a smaller group (MPI ULFM's MPI_Comm_shrink, ncclCommShrink).
 *
 * Every rank opens a shrink socket in braid_pg_init, serves a temporary
 * store on it (authenticated with the group's secret, one thread) and
 * learns every other rank's shrink address through the store, while the
 * store still exists (rank 0 may be the one that dies). The socket serves
 * twice:
 *  - liveness: the kernel closes a dead process's sockets, so a connect to
 *    its shrink socket is refused, and a live member's store proves the
 *    secret at once. An endpoint that accepts but cannot prove membership
 *    (wrong proof, garbage, a close, or silence for PROBE_AUTH_MS) is a
 *    process that took the dead rank's port, not a member: it counts as
 *    gone. A live member is never presumed dead for being slow to call
 *    braid_pg_shrink, which could let two coordinators form two groups;
 *  - coordination: the coordinator's store gathers the registrations and
 *    carries the decision.
 *
 * The agreement (docs/RELIABILITY.md, "Group shrink"):
 *  1. each caller walks ranks 0, 1, ... and stops at the first whose socket
 *     does not refuse: it waits for that rank's temporary store to answer,
 *     or, when it reaches itself, starts serving one. Death is permanent, so
 *     every caller stops at the same rank, the lowest live one, whatever
 *     failures it saw before;
 *  2. callers register with the coordinator, which waits until every rank
 *     has registered or been refused, or until half the timeout has passed
 *     (ranks that are alive but silent are then left out);
 *  3. the coordinator publishes one decision: the members in old-rank order,
 *     a fresh nonce and the address of the new group's store, which it
 *     serves as the new rank 0 (it is the lowest member);
 *  4. each member derives the new job secret as an HMAC of the old one over
 *     the decision (nothing secret crosses the wire) and joins through the
 *     normal init path, which also draws a fresh group tag. Traffic of the
 *     old group can therefore not authenticate into the new one. */
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap/auth.h"
#include "bootstrap/sock.h"
#include "bootstrap/store.h"
#include "clock.h"
#include "log.h"
#include "pg_shrink.h"
#include "status.h"

#define RESULT_MAGIC "BSHR"
#define RESULT_VERSION 1
#define RESULT_HOST_BYTES 64
/* magic | version u32 | count u32 | port u32 | nonce[16] | host[64], then
 * count u32 old ranks, ascending; all integers big endian. */
#define RESULT_HEADER_BYTES (4 + 4 + 4 + 4 + BRAID_NONCE_BYTES + RESULT_HOST_BYTES)
#define SECRET_LABEL "braid-shrink-v1"

#define PROBE_CONNECT_MS 100  /* one liveness probe's connect limit */
#define PROBE_INTERVAL_MS 100 /* re-probe of a rank that is alive but has not registered */
#define POLL_MS 5             /* coordinator: registration poll */
#define RETRY_MS 10           /* caller: pause before trying a coordinator again */
#define PROBE_AUTH_MS 3000    /* a live member's store proves itself well within this */
#define PROBE_RESETS 3        /* resets in a row before an endpoint counts as no member */

enum { RANK_UNKNOWN = 0, RANK_MEMBER, RANK_DEAD };

struct braid_shrink {
    int listen_fd;                     /* this rank's shrink socket */
    char (*addr)[BRAID_SOCK_ADDR_STR]; /* [size]: every rank's shrink socket */
    braid_config cfg;                  /* the caller's, so the new group is made alike */
    char *transports, *socket_ifname;  /* cfg's strings, owned */
    braid_store_server *server;        /* temporary store, while this rank coordinates */
    unsigned calls;                    /* braid_pg_shrink calls on this group, to name keys */
};

/* Key of the temporary store for this call: "<call>/<name>[/<rank>]". A
 * caller that retries after a failed call must not read the decision of
 * the call before, which a coordinator may still serve. */
static void shrink_key(char *buf, size_t cap, const struct braid_shrink *s, const char *name, int rank)
{
    if (rank >= 0)
        snprintf(buf, cap, "%u/%s/%d", s->calls, name, rank);
    else
        snprintf(buf, cap, "%u/%s", s->calls, name);
}

static void sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* This thread's error text without its status name, to quote as a cause. */
static void last_cause(char *buf, size_t cap)
{
    snprintf(buf, cap, "%s", braid__error_detail());
}

/* ---- set-up and teardown ------------------------------------------------ */

static char *dup_or_null(const char *s)
{
    return s ? strdup(s) : NULL;
}

braid_status braid__shrink_prepare(braid_pg *pg, const braid_config *cfg)
{
    struct braid_shrink *s = calloc(1, sizeof(*s));
    if (!s)
        return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: out of memory for the shrink state", pg->rank);
    s->listen_fd = -1;
    pg->shrink = s; /* from here on braid__shrink_release() undoes everything */
    s->addr = calloc((size_t)pg->size, sizeof(*s->addr));
    if (!s->addr)
        return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: out of memory for %d shrink addresses", pg->rank, pg->size);

    /* apply_config has validated cfg->size already. */
    braid_config c = BRAID_CONFIG_INIT;
    if (cfg)
        memcpy(&c, cfg, cfg->size < sizeof(c) ? cfg->size : sizeof(c));
    c.size = sizeof(c);
    s->transports = dup_or_null(c.transports);
    s->socket_ifname = dup_or_null(c.socket_ifname);
    if ((c.transports && !s->transports) || (c.socket_ifname && !s->socket_ifname))
        return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: out of memory for the shrink state", pg->rank);
    c.transports = s->transports;
    c.socket_ifname = s->socket_ifname;
    s->cfg = c;

    int port;
    braid_sockaddr a;
    BRAID_CHECK(braid__sock_listen(pg->ctx.bind_ip, 0, &s->listen_fd, &port));
    BRAID_CHECK(braid__sock_local_addr(s->listen_fd, &a));
    braid__sock_addr_format(&a, s->addr[pg->rank], sizeof(s->addr[pg->rank]));
    /* Served from now on (on a duplicate: the server closes what it is
     * given), so that probes can tell this member from a squatter. */
    int fd = fcntl(s->listen_fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0)
        return braid__error(BRAID_ERR_SYSTEM, "rank %d: shrink: dup of the shrink socket: %m", pg->rank);
    /* Sized for every rank probing and registering at once; the size is
     * not compared (callers state none). */
    braid_job_params sized = {.size = (uint32_t)pg->size};
    BRAID_CHECK(braid__store_server_start_job(fd, pg->ctx.secret, &sized, &s->server));

    char key[64];
    size_t len;
    snprintf(key, sizeof(key), "shrink/%d", pg->rank);
    BRAID_CHECK(braid__store_set(pg->store, key, s->addr[pg->rank], strlen(s->addr[pg->rank]) + 1));
    for (int p = 0; p < pg->size; p++) {
        if (p == pg->rank)
            continue;
        snprintf(key, sizeof(key), "shrink/%d", p);
        BRAID_CHECK(braid__store_get(pg->store, key, s->addr[p], sizeof(s->addr[p]), &len, pg->timeout_ms));
        if (len == 0 || s->addr[p][len - 1] != '\0')
            return braid__error(BRAID_ERR_PEER, "rank %d: rank %d published a malformed shrink address", pg->rank, p);
    }
    return BRAID_OK;
}

const char *braid__shrink_addr(const braid_pg *pg, int p)
{
    const struct braid_shrink *s = pg->shrink;
    return s && p >= 0 && p < pg->size ? s->addr[p] : NULL;
}

void braid__shrink_release(braid_pg *pg)
{
    struct braid_shrink *s = pg->shrink;
    if (!s)
        return;
    if (s->server)
        braid__store_server_stop(s->server);
    if (s->listen_fd >= 0)
        close(s->listen_fd);
    free(s->addr);
    free(s->transports);
    free(s->socket_ifname);
    free(s);
    pg->shrink = NULL;
}

/* ---- liveness ----------------------------------------------------------- */

typedef enum { PROBE_LIVE, PROBE_DEAD, PROBE_UNKNOWN } probe_result;

/* A connect that reached its own address (TCP simultaneous open onto a
 * port that nobody listens on any more). */
static int self_connected(int fd)
{
    braid_sockaddr l, r;
    char a[BRAID_SOCK_ADDR_STR], b[BRAID_SOCK_ADDR_STR];
    if (braid__sock_local_addr(fd, &l) != BRAID_OK || braid__sock_peer_addr(fd, &r) != BRAID_OK)
        return 0;
    braid__sock_addr_format(&l, a, sizeof(a));
    braid__sock_addr_format(&r, b, sizeof(b));
    return strcmp(a, b) == 0;
}

/* One connect to a shrink socket, unlike braid__sock_connect never retried:
 * refused means the process is gone (PROBE_DEAD); connected is PROBE_LIVE
 * (the socket goes to *fd, or is closed when fd is NULL); anything else,
 * no answer before deadline included, is PROBE_UNKNOWN with errno in *err. */
static probe_result probe(const char *addr_text, int64_t deadline, int *fd, int *err)
{
    braid_sockaddr a;
    *err = 0;
    if (braid__sock_addr_parse(addr_text, &a) != BRAID_OK) {
        *err = EINVAL;
        return PROBE_UNKNOWN;
    }
    int s = socket(a.ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0) {
        *err = errno;
        return PROBE_UNKNOWN;
    }
    braid__sock_tune(s); /* TCP_NODELAY: the store's requests are small */
    int e = 0;
    if (connect(s, (const struct sockaddr *)&a.ss, a.len) != 0) {
        e = errno;
        if (e == EINPROGRESS || e == EINTR) {
            struct pollfd p = {.fd = s, .events = POLLOUT};
            int rc;
            do {
                rc = poll(&p, 1, braid__ms_until(deadline));
            } while (rc < 0 && errno == EINTR);
            if (rc == 0) {
                e = ETIMEDOUT;
            } else if (rc < 0) {
                e = errno;
            } else {
                socklen_t len = sizeof(e);
                if (getsockopt(s, SOL_SOCKET, SO_ERROR, &e, &len) != 0)
                    e = errno;
            }
        }
    }
    if (e == 0 && self_connected(s))
        e = ECONNREFUSED;
    if (e != 0) {
        close(s);
        *err = e;
        return e == ECONNREFUSED ? PROBE_DEAD : PROBE_UNKNOWN;
    }
    if (fd)
        *fd = s;
    else
        close(s);
    return PROBE_LIVE;
}

/* ---- step 1: find the coordinator ---------------------------------------- */

/* Connect to our own temporary store like every other caller. */
static braid_status serve(braid_pg *pg, struct braid_shrink *s, int64_t deadline, braid_store **store)
{
    int err, conn = -1;
    if (probe(s->addr[pg->rank], deadline, &conn, &err) != PROBE_LIVE)
        return braid__error(BRAID_ERR_SYSTEM, "rank %d: shrink: cannot connect to its own store at %s: %s", pg->rank,
                            s->addr[pg->rank], strerror(err));
    return braid__store_attach(conn, s->addr[pg->rank], pg->ctx.secret, pg->rank, braid__ms_until(deadline), store);
}

int braid__shrink_notice_send(braid_pg *pg, const char *key, const void *value, size_t len, int budget_ms)
{
    struct braid_shrink *s = pg->shrink;
    int64_t deadline = braid__now_ms() + budget_ms;
    int told = 0;
    for (int p = 0; s && p < pg->size && braid__ms_until(deadline) > 0; p++) {
        int fd, err;
        braid_store *st = NULL;
        int64_t one = braid__now_ms() + PROBE_CONNECT_MS;
        if (p == pg->rank || probe(s->addr[p], one < deadline ? one : deadline, &fd, &err) != PROBE_LIVE)
            continue;
        int left = braid__ms_until(deadline);
        if (braid__store_attach(fd, s->addr[p], pg->ctx.secret, pg->rank, left > 0 ? left : 1, &st) != BRAID_OK)
            continue;
        told += braid__store_set(st, key, value, len) == BRAID_OK;
        braid__store_close(st);
    }
    braid__error_clear();
    return told;
}

braid_status braid__shrink_notice_wait(braid_pg *pg, const char *key, void *value, size_t cap, size_t *len,
                                       int wait_ms)
{
    struct braid_shrink *s = pg->shrink;
    if (!s)
        return braid__error_quiet(BRAID_ERR_INTERNAL, "rank %d: no shrink socket", pg->rank);
    braid_store *st;
    BRAID_CHECK(serve(pg, s, braid__now_ms() + PROBE_AUTH_MS, &st));
    braid_status rc = braid__store_get(st, key, value, cap, len, wait_ms);
    braid__store_close(st);
    return rc;
}

/* After a connect (PROBE_LIVE, fd): does the endpoint prove membership?
 * PROBE_LIVE with the authenticated store in *store (closed when store is
 * NULL); PROBE_DEAD when it cannot prove it (why in the error text);
 * PROBE_UNKNOWN for a reset, to probe again; anything else is an error in
 * *st (the deadline passed). Takes fd. */
static probe_result prove_member(braid_pg *pg, struct braid_shrink *s, int c, int fd, int64_t deadline,
                                 braid_store **store, braid_status *st)
{
    int left = braid__ms_until(deadline);
    braid_store *got = NULL;
    *st = braid__store_attach(fd, s->addr[c], pg->ctx.secret, pg->rank, left < PROBE_AUTH_MS ? left : PROBE_AUTH_MS,
                              &got);
    if (*st == BRAID_OK) {
        if (store)
            *store = got;
        else
            braid__store_close(got);
        return PROBE_LIVE;
    }
    if (*st == BRAID_ERR_AUTH || *st == BRAID_ERR_MISMATCH || (*st == BRAID_ERR_TIMEOUT && left > PROBE_AUTH_MS)) {
        char why[512];
        last_cause(why, sizeof(why));
        BRAID_WARN("rank %d: shrink: rank %d's shrink socket %s accepts but does not prove membership: not a live "
                   "member (another process holds its port?): %s",
                   pg->rank, c, s->addr[c], why);
        return PROBE_DEAD;
    }
    return *st == BRAID_ERR_PEER ? PROBE_UNKNOWN : PROBE_LIVE;
}

/* Walk ranks upwards to the first live one and connect to its temporary
 * store, or become the coordinator on reaching this rank. dead[p] = 1 for
 * every rank found refused on the way. */
static braid_status join_coordinator(braid_pg *pg, struct braid_shrink *s, int64_t deadline, uint8_t *dead, int *coord,
                                     braid_store **store)
{
    for (int c = 0; c < pg->size; c++) {
        if (c == pg->rank) {
            *coord = c;
            return serve(pg, s, deadline, store);
        }
        int resets = 0;
        for (;;) {
            int fd = -1, err = 0;
            probe_result pr = probe(s->addr[c], deadline, &fd, &err);
            if (pr == PROBE_DEAD) {
                BRAID_INFO("rank %d: shrink: rank %d is gone (its shrink socket %s refuses connections)", pg->rank, c,
                           s->addr[c]);
                dead[c] = 1;
                break;
            }
            if (pr == PROBE_UNKNOWN) {
                if (braid__now_ms() >= deadline)
                    return braid__error(BRAID_ERR_TIMEOUT,
                                        "rank %d: shrink: rank %d (shrink socket %s) neither answered nor refused "
                                        "before the timeout (%s): it may be alive, so no coordinator can be chosen "
                                        "without it",
                                        pg->rank, c, s->addr[c], strerror(err));
                sleep_ms(RETRY_MS);
                continue;
            }
            /* Connected: a member proves the secret at once (its store runs
             * from init). A reset means it died meanwhile, or a squatter
             * closes on us: the next probe tells, up to PROBE_RESETS. */
            braid_status st;
            probe_result m = prove_member(pg, s, c, fd, deadline, store, &st);
            if (m == PROBE_LIVE && st == BRAID_OK) {
                *coord = c;
                return BRAID_OK;
            }
            if (m == PROBE_DEAD || (m == PROBE_UNKNOWN && ++resets >= PROBE_RESETS)) {
                dead[c] = 1;
                break;
            }
            if (m == PROBE_UNKNOWN && braid__now_ms() < deadline) {
                sleep_ms(RETRY_MS);
                continue;
            }
            char why[512];
            last_cause(why, sizeof(why));
            return braid__error(st,
                                "rank %d: shrink: rank %d is alive but its coordination store did not answer (it "
                                "must call braid_pg_shrink too): %s",
                                pg->rank, c, why);
        }
    }
    return braid__error(BRAID_ERR_INTERNAL, "rank %d: shrink: walked past its own rank", pg->rank);
}

/* ---- step 2 and 3: the coordinator decides --------------------------------- */

/* Append " p" to a rank list for the log, keeping it bounded. */
static void list_add(char *buf, size_t cap, int p)
{
    size_t n = strlen(buf);
    if (n + 16 < cap)
        snprintf(buf + n, cap - n, " %d", p);
    else if (n + 5 < cap && strcmp(buf + n - 4, " ...") != 0)
        snprintf(buf + n, cap - n, " ...");
}

/* Has another rank published a decision for this call in its store? */
static int already_decided(const struct braid_shrink *s, braid_store *other)
{
    char key[64];
    uint8_t buf[RESULT_HEADER_BYTES];
    size_t len;
    shrink_key(key, sizeof(key), s, "result", -1);
    braid_status st = braid__store_get(other, key, buf, sizeof(buf), &len, 0);
    return st == BRAID_OK || st == BRAID_ERR_INVALID_ARG; /* present (INVALID_ARG: longer than the header) */
}

/* Wait for registrations until every rank has registered or is gone, or
 * reg_deadline; then publish the decision and make the new group's store
 * socket (handed over through braid__prebound_put to the init path). */
static braid_status decide(braid_pg *pg, struct braid_shrink *s, braid_store *store, uint8_t *state,
                           int64_t reg_deadline, int64_t deadline, uint8_t **result, size_t *result_len,
                           int *store_port)
{
    char key[64];
    int64_t seen = -1, nreg;
    int unknown = 0;
    int64_t *next_probe = calloc((size_t)pg->size, sizeof(*next_probe));
    if (!next_probe)
        return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: shrink: out of memory", pg->rank);
    for (int p = 0; p < pg->size; p++)
        unknown += state[p] == RANK_UNKNOWN;
    braid_status st = BRAID_OK;
    while (unknown > 0) {
        shrink_key(key, sizeof(key), s, "nreg", -1);
        BRAID_CHECK_GOTO(braid__store_add(store, key, 0, &nreg), st, out_free);
        if (nreg != seen) { /* somebody registered since the last look */
            seen = nreg;
            for (int p = 0; p < pg->size; p++) {
                if (state[p] != RANK_UNKNOWN)
                    continue;
                int64_t v;
                shrink_key(key, sizeof(key), s, "reg", p);
                BRAID_CHECK_GOTO(braid__store_add(store, key, 0, &v), st, out_free);
                if (v > 0) {
                    state[p] = RANK_MEMBER;
                    unknown--;
                }
            }
        }
        int64_t now = braid__now_ms();
        for (int p = 0; p < pg->size && unknown > 0; p++) {
            if (state[p] != RANK_UNKNOWN || now < next_probe[p])
                continue;
            int err, fd = -1;
            int64_t limit = now + PROBE_CONNECT_MS < deadline ? now + PROBE_CONNECT_MS : deadline;
            probe_result pr = probe(s->addr[p], limit, &fd, &err);
            if (pr == PROBE_LIVE) {
                braid_status pst;
                braid_store *other = NULL;
                pr = prove_member(pg, s, p, fd, deadline, &other, &pst);
                pr = pr == PROBE_DEAD ? PROBE_DEAD : PROBE_LIVE;
                if (other && already_decided(s, other)) {
                    /* This rank could not prove it was alive in time (it was
                     * stopped?) and the others went on without it. */
                    braid__store_close(other);
                    st = braid__error(BRAID_ERR_TIMEOUT,
                                      "rank %d: shrink: left out: rank %d already coordinates the shrunk group of this "
                                      "call (this rank did not answer in time)",
                                      pg->rank, p);
                    goto out_free;
                }
                if (other)
                    braid__store_close(other);
            }
            if (pr == PROBE_DEAD) {
                state[p] = RANK_DEAD;
                unknown--;
                BRAID_INFO("rank %d: shrink: rank %d is gone (its shrink socket %s refuses connections or does not "
                           "prove membership)",
                           pg->rank, p, s->addr[p]);
            } else {
                next_probe[p] = braid__now_ms() + PROBE_INTERVAL_MS;
            }
        }
        if (unknown == 0 || braid__now_ms() >= reg_deadline)
            break;
        sleep_ms(POLL_MS);
    }

    /* Ranks still unknown are alive (or unreachable) but did not call
     * braid_pg_shrink in time: they are left out, and find out from the
     * decision if they come later. */
    int count = 0;
    char dead_list[256] = "", out_list[256] = "";
    for (int p = 0; p < pg->size; p++) {
        count += state[p] == RANK_MEMBER;
        if (state[p] == RANK_DEAD)
            list_add(dead_list, sizeof(dead_list), p);
        else if (state[p] == RANK_UNKNOWN)
            list_add(out_list, sizeof(out_list), p);
    }
    if (out_list[0])
        BRAID_WARN("rank %d: shrink: leaving out ranks%s: alive or unreachable, but not registered in time", pg->rank,
                   out_list);

    size_t len = RESULT_HEADER_BYTES + (size_t)count * 4;
    uint8_t *r = calloc(1, len);
    if (!r) {
        st = braid__error(BRAID_ERR_NO_MEMORY, "rank %d: shrink: out of memory for the decision", pg->rank);
        goto out_free;
    }
    memcpy(r, RESULT_MAGIC, 4);
    put32(r + 4, RESULT_VERSION);
    put32(r + 8, (uint32_t)count);
    BRAID_CHECK_GOTO(braid__random_bytes(r + 16, BRAID_NONCE_BYTES), st, out_free_result);
    if (strlen(pg->ctx.bind_ip) >= RESULT_HOST_BYTES) {
        st = braid__error(BRAID_ERR_INTERNAL, "rank %d: shrink: address %s too long", pg->rank, pg->ctx.bind_ip);
        goto out_free_result;
    }
    memcpy(r + 16 + BRAID_NONCE_BYTES, pg->ctx.bind_ip, strlen(pg->ctx.bind_ip));
    for (int p = 0, i = 0; p < pg->size; p++)
        if (state[p] == RANK_MEMBER)
            put32(r + RESULT_HEADER_BYTES + 4 * (size_t)i++, (uint32_t)p);

    /* The new group's store: bound now so that its port is in the decision,
     * and served by the init path, which takes the socket back by port. */
    int fd, port;
    BRAID_CHECK_GOTO(braid__sock_listen(pg->ctx.bind_ip, 0, &fd, &port), st, out_free_result);
    put32(r + 12, (uint32_t)port);
    braid__prebound_put(port, fd);
    shrink_key(key, sizeof(key), s, "result", -1);
    st = braid__store_set(store, key, r, len);
    if (st != BRAID_OK) {
        braid__prebound_release(port);
        goto out_free_result;
    }
    BRAID_INFO("rank %d: shrink: %d of %d ranks go on; gone:%s; left out:%s", pg->rank, count, pg->size,
               dead_list[0] ? dead_list : " none", out_list[0] ? out_list : " none");
    *result = r;
    *result_len = len;
    *store_port = port;
    free(next_probe);
    return BRAID_OK;

out_free_result:
    free(r);
out_free:
    free(next_probe);
    return st;
}

/* ---- step 4: join the new group ------------------------------------------- */

/* Check a decision read from the store; find this rank's new rank (-1 when
 * it was left out). */
static braid_status parse_result(braid_pg *pg, int coord, const uint8_t *r, size_t len, int *count, int *port,
                                 char host[RESULT_HOST_BYTES], int *new_rank)
{
    if (len < RESULT_HEADER_BYTES || memcmp(r, RESULT_MAGIC, 4) != 0 || get32(r + 4) != RESULT_VERSION)
        return braid__error(BRAID_ERR_PEER, "rank %d: shrink: coordinator rank %d published a malformed decision",
                            pg->rank, coord);
    uint32_t n = get32(r + 8), p = get32(r + 12);
    const char *h = (const char *)r + 16 + BRAID_NONCE_BYTES;
    if (n < 1 || n > (uint32_t)pg->size || len != RESULT_HEADER_BYTES + (size_t)n * 4 || p < 1 || p > 65535 ||
        !memchr(h, '\0', RESULT_HOST_BYTES) || h[0] == '\0')
        return braid__error(BRAID_ERR_PEER, "rank %d: shrink: coordinator rank %d published a malformed decision",
                            pg->rank, coord);
    *new_rank = -1;
    int64_t prev = -1;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t m = get32(r + RESULT_HEADER_BYTES + 4 * (size_t)i);
        if (m >= (uint32_t)pg->size || (int64_t)m <= prev)
            return braid__error(BRAID_ERR_PEER,
                                "rank %d: shrink: coordinator rank %d published a malformed member list", pg->rank,
                                coord);
        prev = m;
        if ((int)m == pg->rank)
            *new_rank = (int)i;
    }
    /* The coordinator serves the new store, so it must be the new rank 0. */
    if (get32(r + RESULT_HEADER_BYTES) != (uint32_t)coord)
        return braid__error(BRAID_ERR_INTERNAL, "rank %d: shrink: coordinator rank %d is not the lowest member (%u)",
                            pg->rank, coord, get32(r + RESULT_HEADER_BYTES));
    *count = (int)n;
    *port = (int)p;
    memcpy(host, h, RESULT_HOST_BYTES);
    return BRAID_OK;
}

/* New secret = HMAC-SHA256(old secret, label | decision), truncated: every
 * member computes it, no eavesdropper can, and it differs per decision. */
static braid_status derive_secret(const uint8_t old[BRAID_SECRET_BYTES], const uint8_t *r, size_t len,
                                  uint8_t out[BRAID_SECRET_BYTES])
{
    size_t label = sizeof(SECRET_LABEL) - 1;
    uint8_t *msg = malloc(label + len);
    if (!msg)
        return braid__error(BRAID_ERR_NO_MEMORY, "shrink: out of memory");
    memcpy(msg, SECRET_LABEL, label);
    memcpy(msg + label, r, len);
    uint8_t mac[EVP_MAX_MD_SIZE];
    unsigned mac_len = 0;
    int ok = HMAC(EVP_sha256(), old, BRAID_SECRET_BYTES, msg, label + len, mac, &mac_len) != NULL;
    free(msg);
    if (!ok || mac_len < BRAID_SECRET_BYTES)
        return braid__error(BRAID_ERR_SYSTEM, "shrink: HMAC-SHA256 failed in libcrypto");
    memcpy(out, mac, BRAID_SECRET_BYTES);
    return BRAID_OK;
}

BRAID_API braid_status braid_pg_shrink(braid_pg *pg, int timeout_ms, braid_pg **new_pg)
{
    BRAID_CHECK(braid__pg_check_handle(pg, "braid_pg_shrink"));
    if (!pg || !new_pg)
        return braid__error(BRAID_ERR_INVALID_ARG, "braid_pg_shrink: %s is NULL", !pg ? "pg" : "new_pg");
    if (timeout_ms == -1)
        timeout_ms = pg->timeout_ms;
    if (timeout_ms <= 0)
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: braid_pg_shrink: timeout %d ms (want > 0, or -1)",
                            pg->rank, timeout_ms);
    struct braid_shrink *s = pg->shrink;
    if (!s)
        return braid__error(BRAID_ERR_INTERNAL, "rank %d: braid_pg_shrink: group has no shrink state", pg->rank);

    int64_t start = braid__now_ms(), deadline = start + timeout_ms;
    braid_status st;
    braid_store *store = NULL;
    uint8_t *result = NULL;
    size_t len = 0;
    int coord = -1, store_port = -1, count = 0, port = 0, new_rank = -1;
    uint8_t *state = calloc((size_t)pg->size, 1);
    if (!state)
        return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: shrink: out of memory", pg->rank);

    s->calls++;
    char key[64];
    for (;;) {
        BRAID_CHECK_GOTO(join_coordinator(pg, s, deadline, state, &coord, &store), st, out);
        if (coord == pg->rank)
            break;
        /* Register and wait for the decision. A reset means the coordinator
         * died: walk again, which finds out. */
        int64_t v;
        shrink_key(key, sizeof(key), s, "reg", pg->rank);
        st = braid__store_add(store, key, 1, &v);
        shrink_key(key, sizeof(key), s, "nreg", -1);
        if (st == BRAID_OK)
            st = braid__store_add(store, key, 1, &v);
        if (st == BRAID_OK && !result) {
            result = malloc(RESULT_HEADER_BYTES + (size_t)pg->size * 4);
            if (!result) {
                st = braid__error(BRAID_ERR_NO_MEMORY, "rank %d: shrink: out of memory", pg->rank);
                goto out;
            }
        }
        shrink_key(key, sizeof(key), s, "result", -1);
        if (st == BRAID_OK)
            st = braid__store_get(store, key, result, RESULT_HEADER_BYTES + (size_t)pg->size * 4, &len,
                                  braid__ms_until(deadline));
        braid__store_close(store); /* everything needed from it is read */
        store = NULL;
        if (st == BRAID_OK)
            break;
        if (st != BRAID_ERR_PEER || braid__now_ms() >= deadline) {
            char why[512];
            last_cause(why, sizeof(why));
            st = braid__error(st, "rank %d: shrink: no decision from coordinator rank %d: %s", pg->rank, coord, why);
            goto out;
        }
        BRAID_INFO("rank %d: shrink: lost coordinator rank %d, looking again", pg->rank, coord);
        sleep_ms(RETRY_MS);
    }

    if (coord == pg->rank) {
        /* The walk's dead ranks are the coordinator's first view. Half the
         * time to gather, the rest for everyone to read the decision and
         * build the new group. */
        for (int p = 0; p < pg->size; p++)
            state[p] = state[p] ? RANK_DEAD : RANK_UNKNOWN;
        state[pg->rank] = RANK_MEMBER;
        free(result); /* from an earlier walk that ended at another rank */
        result = NULL;
        BRAID_CHECK_GOTO(decide(pg, s, store, state, start + timeout_ms / 2, deadline, &result, &len, &store_port), st,
                         out);
    }

    char host[RESULT_HOST_BYTES];
    BRAID_CHECK_GOTO(parse_result(pg, coord, result, len, &count, &port, host, &new_rank), st, out);
    if (new_rank < 0) {
        st = braid__error(BRAID_ERR_TIMEOUT,
                          "rank %d: shrink: left out of the shrunk group: coordinator rank %d decided on %d ranks "
                          "before this rank registered",
                          pg->rank, coord, count);
        goto out;
    }

    braid_rendezvous rv;
    memset(&rv, 0, sizeof(rv));
    snprintf(rv.host, sizeof(rv.host), "%s", host);
    rv.port = port;
    rv.local_rank = pg->local_rank; /* same process, same device slot */
    BRAID_CHECK_GOTO(derive_secret(pg->ctx.secret, result, len, rv.secret), st, out);

    /* Join with what is left of the timeout, then give the new group the
     * old one's timeout for everything after. */
    braid_config cfg = s->cfg;
    int left = braid__ms_until(deadline);
    cfg.timeout_ms = left > 0 ? left : 1;
    cfg.init_timeout_ms = cfg.timeout_ms;
    braid_pg *np;
    st = braid__pg_create(&np, new_rank, count, &rv, &cfg);
    memset(rv.secret, 0, sizeof(rv.secret));
    if (st != BRAID_OK) {
        char why[512];
        last_cause(why, sizeof(why));
        st = braid__error(st, "rank %d: shrink: joining the shrunk group as rank %d of %d failed: %s", pg->rank,
                          new_rank, count, why);
        goto out;
    }
    np->timeout_ms = pg->timeout_ms;
    np->ctx.timeout_ms = pg->ctx.timeout_ms;
    if (np->shrink) {
        np->shrink->cfg.timeout_ms = s->cfg.timeout_ms;
        np->shrink->cfg.init_timeout_ms = s->cfg.init_timeout_ms;
    }
    BRAID_INFO("rank %d: shrink: now rank %d of %d (coordinator: old rank %d) after %lld ms", pg->rank, new_rank, count,
               coord, (long long)(braid__now_ms() - start));
    *new_pg = np;
    st = BRAID_OK;

out:
    /* The coordinator's temporary store keeps serving until the old group
     * is destroyed, so that a latecomer still reads the
     * decision and learns it was left out instead of waiting. */
    if (store)
        braid__store_close(store);
    if (st != BRAID_OK && store_port > 0)
        braid__prebound_release(store_port);
    if (result)
        memset(result, 0, len);
    free(result);
    free(state);
    if (st == BRAID_OK)
        braid__error_clear();
    return st;
}
