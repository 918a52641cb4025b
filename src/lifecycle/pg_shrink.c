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
#include "pg_shrink_int.h"
#include "status.h"

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
    BRAID_CHECK(braid__store_server_start_as(fd, pg->ctx.secret, &sized, pg->rank, &s->server));

    char key[64];
    size_t len;
    snprintf(key, sizeof(key), "shrink/%d", pg->rank);
    BRAID_CHECK(braid__store_set(pg->store, key, s->addr[pg->rank], strlen(s->addr[pg->rank]) + 1));
    for (int p = 0; p < pg->size; p++) {
        if (p == pg->rank)
            continue;
        snprintf(key, sizeof(key), "shrink/%d", p);
        BRAID_CHECK(braid__store_get(pg->store, key, s->addr[p], sizeof(s->addr[p]), &len, braid__pg_init_wait_ms(pg)));
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

/* ---- step 4: join the new group ------------------------------------------- */

/* Check a decision read from the store; find this rank's new rank (-1 when
 * it was left out). */
static braid_status parse_result(braid_pg *pg, int coord, const uint8_t *r, size_t len, int *count, int *port,
                                 char host[RESULT_HOST_BYTES], int *new_rank)
{
    if (len < RESULT_HEADER_BYTES || memcmp(r, RESULT_MAGIC, 4) != 0 || braid__get_be32(r + 4) != RESULT_VERSION)
        return braid__error(BRAID_ERR_PEER, "rank %d: shrink: coordinator rank %d published a malformed decision",
                            pg->rank, coord);
    uint32_t n = braid__get_be32(r + 8), p = braid__get_be32(r + 12);
    const char *h = (const char *)r + 16 + BRAID_NONCE_BYTES;
    if (n < 1 || n > (uint32_t)pg->size || len != RESULT_HEADER_BYTES + (size_t)n * 4 || p < 1 || p > 65535 ||
        !memchr(h, '\0', RESULT_HOST_BYTES) || h[0] == '\0')
        return braid__error(BRAID_ERR_PEER, "rank %d: shrink: coordinator rank %d published a malformed decision",
                            pg->rank, coord);
    *new_rank = -1;
    int64_t prev = -1;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t m = braid__get_be32(r + RESULT_HEADER_BYTES + 4 * (size_t)i);
        if (m >= (uint32_t)pg->size || (int64_t)m <= prev)
            return braid__error(BRAID_ERR_PEER,
                                "rank %d: shrink: coordinator rank %d published a malformed member list", pg->rank,
                                coord);
        prev = m;
        if ((int)m == pg->rank)
            *new_rank = (int)i;
    }
    /* The coordinator serves the new store, so it must be the new rank 0. */
    if (braid__get_be32(r + RESULT_HEADER_BYTES) != (uint32_t)coord)
        return braid__error(BRAID_ERR_INTERNAL, "rank %d: shrink: coordinator rank %d is not the lowest member (%u)",
                            pg->rank, coord, braid__get_be32(r + RESULT_HEADER_BYTES));
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

/* Steps 1 and 2 for every caller: find the coordinator, register with it
 * and read its decision into *result (allocated here, kept across walks).
 * Returns with *coord == pg->rank and *store open when this rank is the
 * coordinator. */
static braid_status await_decision(braid_pg *pg, struct braid_shrink *s, int64_t deadline, uint8_t *state, int *coord,
                                   braid_store **store, uint8_t **result, size_t *len)
{
    braid_status st;
    char key[64];
    for (;;) {
        BRAID_CHECK(braid__shrink_join_coordinator(pg, s, deadline, state, coord, store));
        if (*coord == pg->rank)
            return BRAID_OK;
        /* Register and wait for the decision. A reset means the coordinator
         * died: walk again, which finds out. */
        int64_t v;
        shrink_key(key, sizeof(key), s, "reg", pg->rank);
        st = braid__store_add(*store, key, 1, &v);
        shrink_key(key, sizeof(key), s, "nreg", -1);
        if (st == BRAID_OK)
            st = braid__store_add(*store, key, 1, &v);
        if (st == BRAID_OK && !*result) {
            *result = malloc(RESULT_HEADER_BYTES + (size_t)pg->size * 4);
            if (!*result)
                return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: shrink: out of memory", pg->rank);
        }
        shrink_key(key, sizeof(key), s, "result", -1);
        if (st == BRAID_OK)
            st = braid__store_get(*store, key, *result, RESULT_HEADER_BYTES + (size_t)pg->size * 4, len,
                                  braid__ms_until(deadline));
        braid__store_close(*store); /* everything needed from it is read */
        *store = NULL;
        if (st == BRAID_OK)
            return BRAID_OK;
        if (st != BRAID_ERR_PEER || braid__now_ms() >= deadline) {
            char why[512];
            last_cause(why, sizeof(why));
            return braid__error(st, "rank %d: shrink: no decision from coordinator rank %d: %s", pg->rank, *coord,
                                why);
        }
        BRAID_INFO("rank %d: shrink: lost coordinator rank %d, looking again", pg->rank, *coord);
        sleep_ms(RETRY_MS);
    }
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
    BRAID_CHECK_GOTO(await_decision(pg, s, deadline, state, &coord, &store, &result, &len), st, out);

    if (coord == pg->rank) {
        /* The walk's dead ranks are the coordinator's first view. Half the
         * time to gather, the rest for everyone to read the decision and
         * build the new group. */
        for (int p = 0; p < pg->size; p++)
            state[p] = state[p] ? RANK_DEAD : RANK_UNKNOWN;
        state[pg->rank] = RANK_MEMBER;
        free(result); /* from an earlier walk that ended at another rank */
        result = NULL;
        BRAID_CHECK_GOTO(braid__shrink_decide(pg, s, store, state, start + timeout_ms / 2, deadline, &result, &len,
                                              &store_port),
                         st, out);
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
