/* Group shrink, the agreement (steps 1 to 3 of pg_shrink.c's header):
 * liveness probes of shrink sockets, the walk to the coordinator, and the
 * coordinator's decision. */
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
#include "pg_shrink_int.h"
#include "status.h"

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
    return braid__store_attach(conn, s->addr[pg->rank], pg->ctx.secret, pg->rank, pg->rank, braid__ms_until(deadline),
                               store);
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
    *st = braid__store_attach(fd, s->addr[c], pg->ctx.secret, pg->rank, c, left < PROBE_AUTH_MS ? left : PROBE_AUTH_MS,
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

braid_status braid__shrink_join_coordinator(braid_pg *pg, struct braid_shrink *s, int64_t deadline, uint8_t *dead,
                                            int *coord, braid_store **store)
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

/* Wait for registrations until every rank has registered or is gone
 * (state[p] becomes RANK_MEMBER or RANK_DEAD), or reg_deadline. */
static braid_status wait_registrations(braid_pg *pg, struct braid_shrink *s, braid_store *store, uint8_t *state,
                                       int64_t reg_deadline, int64_t deadline)
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
out_free:
    free(next_probe);
    return st;
}

/* The new group's store socket is handed over through braid__prebound_put
 * to the init path. */
braid_status braid__shrink_decide(braid_pg *pg, struct braid_shrink *s, braid_store *store, uint8_t *state,
                                  int64_t reg_deadline, int64_t deadline, uint8_t **result, size_t *result_len,
                                  int *store_port)
{
    char key[64];
    braid_status st = wait_registrations(pg, s, store, state, reg_deadline, deadline);
    if (st != BRAID_OK)
        return st;

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
        return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: shrink: out of memory for the decision", pg->rank);
    }
    memcpy(r, RESULT_MAGIC, 4);
    braid__put_be32(r + 4, RESULT_VERSION);
    braid__put_be32(r + 8, (uint32_t)count);
    BRAID_CHECK_GOTO(braid__random_bytes(r + 16, BRAID_NONCE_BYTES), st, out_free_result);
    if (strlen(pg->ctx.bind_ip) >= RESULT_HOST_BYTES) {
        st = braid__error(BRAID_ERR_INTERNAL, "rank %d: shrink: address %s too long", pg->rank, pg->ctx.bind_ip);
        goto out_free_result;
    }
    memcpy(r + 16 + BRAID_NONCE_BYTES, pg->ctx.bind_ip, strlen(pg->ctx.bind_ip));
    for (int p = 0, i = 0; p < pg->size; p++)
        if (state[p] == RANK_MEMBER)
            braid__put_be32(r + RESULT_HEADER_BYTES + 4 * (size_t)i++, (uint32_t)p);

    /* The new group's store: bound now so that its port is in the decision,
     * and served by the init path, which takes the socket back by port. */
    int fd, port;
    BRAID_CHECK_GOTO(braid__sock_listen(pg->ctx.bind_ip, 0, &fd, &port), st, out_free_result);
    braid__put_be32(r + 12, (uint32_t)port);
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
    return BRAID_OK;

out_free_result:
    free(r);
    return st;
}

/* ---- notices ------------------------------------------------------------ */

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
        if (braid__store_attach(fd, s->addr[p], pg->ctx.secret, pg->rank, p, left > 0 ? left : 1, &st) != BRAID_OK)
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
