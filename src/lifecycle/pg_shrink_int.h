/* Group shrink, shared between pg_shrink.c (set-up, joining the new group,
 * braid_pg_shrink) and pg_shrink_agree.c (liveness and the agreement): the
 * decision's wire layout, timing constants, the per-group state and small
 * helpers. Internal to those two files. */
#ifndef BRAID_PG_SHRINK_INT_H
#define BRAID_PG_SHRINK_INT_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "bootstrap/sock.h"
#include "bootstrap/store.h"
#include "pg_shrink.h"
#include "status.h"
#include "bytes.h"

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
static inline void shrink_key(char *buf, size_t cap, const struct braid_shrink *s, const char *name, int rank)
{
    if (rank >= 0)
        snprintf(buf, cap, "%u/%s/%d", s->calls, name, rank);
    else
        snprintf(buf, cap, "%u/%s", s->calls, name);
}

static inline void sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* This thread's error text without its status name, to quote as a cause. */
static inline void last_cause(char *buf, size_t cap)
{
    snprintf(buf, cap, "%s", braid__error_detail());
}

/* Step 1: walk ranks upwards to the first live one and connect to its
 * temporary store, or become the coordinator on reaching this rank. dead[p] =
 * 1 for every rank found refused on the way. */
braid_status braid__shrink_join_coordinator(braid_pg *pg, struct braid_shrink *s, int64_t deadline, uint8_t *dead,
                                            int *coord, braid_store **store);

/* Steps 2 and 3 (the coordinator): wait for registrations until every rank
 * has registered or is gone, or reg_deadline; then publish the decision and
 * make the new group's store socket. */
braid_status braid__shrink_decide(braid_pg *pg, struct braid_shrink *s, braid_store *store, uint8_t *state,
                                  int64_t reg_deadline, int64_t deadline, uint8_t **result, size_t *result_len,
                                  int *store_port);

#endif
