/* The first step of a group's start: rank 0 serves the store, every rank
 * reaches it, and every rank waits until all have. This is where a user's
 * launch mistakes show (a rank that never started, a port held by another
 * program), so each wait says what it waits for: rank 0 names the missing
 * ranks while it waits and when it gives up, and the other ranks learn rank
 * 0's verdict from the store instead of timing out on their own. */
#include <stdio.h>
#include <string.h>

#include "bootstrap/auth.h"
#include "bootstrap/sock.h"
#include "bootstrap/store.h"
#include "clock.h"
#include "log.h"
#include "param.h"
#include "pg.h"
#include "pg_rendezvous.h"
#include "status.h"

/* Longest gap between rank 0's reports of missing ranks, and the first
 * report's delay: ranks that start a moment after rank 0 are not news. */
#define JOIN_REPORT_MS 10000
#define JOIN_FIRST_REPORT_MS 1000
/* Ranks listed by name in a report; the rest are counted. */
#define JOIN_LIST_MAX 8
/* Ranks checked one by one for a report; beyond this only the count. */
#define JOIN_PROBE_MAX 4096
/* How long a rank other than 0 waits beyond its own init timeout for rank
 * 0's verdict (rank 0 may have started a little later). */
#define JOIN_VERDICT_GRACE_MS 5000
/* A braid store answers the handshake at once; see braid__store_connect. */
#define STORE_HELLO_MS 10000
#define JOIN_OK "ok"
/* Longest a process that cannot be a rank tries to reach the store to say why. */
#define MISTAKE_REPORT_MS 30000

static const char *port_source(const braid_rendezvous *rv)
{
    return rv->port_source[0] ? rv->port_source : "the shrink coordinator";
}

/* Rank 0 serves the store on the rendezvous port: the one braid_unique_id
 * bound in this process (or its parent), else a fresh bind. */
static braid_status serve_store(braid_pg *pg, const braid_rendezvous *rv, const braid_job_params *job)
{
    int fd = braid__prebound_take(rv->port);
    if (fd < 0) {
        int port;
        braid_status st = braid__sock_listen(rv->host, rv->port, &fd, &port);
        if (st != BRAID_OK) {
            char why[512];
            snprintf(why, sizeof(why), "%s", braid__error_detail());
            return braid__error(BRAID_ERR_SYSTEM,
                                "rank 0: cannot serve the rendezvous store on port %d (chosen by %s): %s; another "
                                "program (another job's rank 0?) holds the port: set BRAID_STORE_PORT to a free "
                                "port on every rank",
                                rv->port, port_source(rv), why);
        }
    }
    return braid__store_server_start_job(fd, rv->secret, job, &pg->store_server);
}

static braid_status connect_store(braid_pg *pg, const braid_rendezvous *rv, const braid_job_params *job)
{
    int hello_ms = 0;
    if (pg->rank != 0 && rv->bound_at_init)
        hello_ms = pg->init_timeout_ms / 4 < STORE_HELLO_MS ? pg->init_timeout_ms / 4 : STORE_HELLO_MS;
    braid_status st = braid__store_connect_job(rv->host, rv->port, rv->secret, job, pg->rank, pg->init_timeout_ms,
                                               hello_ms > 0 ? hello_ms : 0, &pg->store);
    if (st == BRAID_OK)
        return st;
    char why[512];
    snprintf(why, sizeof(why), "%s", braid__error_detail());
    if (st == BRAID_ERR_TIMEOUT)
        return braid__error(st,
                            "rank %d: rank 0's store at %s:%d did not come up within %d ms (BRAID_INIT_TIMEOUT_MS): "
                            "is rank 0 running, and is %s its address? (%s)",
                            pg->rank, rv->host, rv->port, pg->init_timeout_ms,
                            rv->bound_at_init ? "MASTER_ADDR" : "the id's host", why);
    if (st == BRAID_ERR_AUTH && rv->bound_at_init)
        return braid__error(st, "%s; the store's port is %d (chosen by %s)", why, rv->port, port_source(rv));
    if (st == BRAID_ERR_PEER && rv->bound_at_init)
        return braid__error(st,
                            "%s; rank 0 cannot serve its store on port %d (chosen by %s) while another program "
                            "holds it: set BRAID_STORE_PORT to a free port on every rank",
                            why, rv->port, port_source(rv));
    return st;
}

/* "rank 2", "ranks 2, 5", "ranks 2, 5, ... (12 in all)", or "12 ranks"
 * beyond JOIN_PROBE_MAX: the ranks that have not joined. Returns how many
 * are missing, -1 if the store did not answer. */
static int missing_ranks(braid_pg *pg, char *buf, size_t cap)
{
    int64_t joined = 0;
    if (braid__store_add(pg->store, "join/count", 0, &joined) != BRAID_OK)
        return -1;
    int missing = pg->size - (int)joined, listed = 0;
    char list[128] = "";
    size_t o = 0;
    for (int r = 1; r < pg->size && pg->size <= JOIN_PROBE_MAX && listed < JOIN_LIST_MAX; r++) {
        char key[32], v[4];
        size_t len;
        snprintf(key, sizeof(key), "join/%d", r);
        braid_status st = braid__store_get(pg->store, key, v, sizeof(v), &len, 0);
        if (st == BRAID_OK)
            continue;
        if (st != BRAID_ERR_TIMEOUT)
            return -1;
        o += (size_t)snprintf(list + o, o < sizeof(list) ? sizeof(list) - o : 0, "%s%d", listed ? ", " : "", r);
        listed++;
    }
    if (listed == 0)
        snprintf(buf, cap, "%d ranks", missing);
    else if (missing > listed)
        snprintf(buf, cap, "ranks %s, ... (%d in all)", list, missing);
    else
        snprintf(buf, cap, "rank%s %s", listed > 1 ? "s" : "", list);
    return missing;
}

/* Rank 0: wait until every rank has joined, saying which are missing. */
static braid_status await_all(braid_pg *pg, const braid_rendezvous *rv, int64_t deadline)
{
    int period = pg->init_timeout_ms / 4 < JOIN_REPORT_MS ? pg->init_timeout_ms / 4 : JOIN_REPORT_MS;
    int64_t start = braid__now_ms(), report = start + (period < JOIN_FIRST_REPORT_MS ? period : JOIN_FIRST_REPORT_MS);
    char v[sizeof(JOIN_OK)], who[192];
    size_t len;
    for (;;) {
        int64_t now = braid__now_ms(), until = report < deadline ? report : deadline;
        int slice = until > now ? (int)(until - now) : 0;
        braid_status st = braid__store_get(pg->store, "join/done", v, sizeof(v), &len, slice);
        if (st != BRAID_ERR_TIMEOUT)
            return st;
        int missing = missing_ranks(pg, who, sizeof(who));
        if (missing < 0)
            return braid__error(BRAID_ERR_INTERNAL, "rank 0: cannot read its own store's join count");
        if (missing == 0)
            continue; /* the last one is setting join/done */
        now = braid__now_ms();
        if (now >= deadline)
            return braid__error(BRAID_ERR_TIMEOUT,
                                "rank 0: %s never joined: %d of %d ranks reached the store at %s:%d within %d ms "
                                "(BRAID_INIT_TIMEOUT_MS)",
                                who, pg->size - missing, pg->size, rv->host, rv->port, pg->init_timeout_ms);
        BRAID_WARN("rank 0: %d of %d ranks joined the store at %s:%d; waiting for %s (%lld of %d s left, "
                   "BRAID_INIT_TIMEOUT_MS)",
                   pg->size - missing, pg->size, rv->host, rv->port, who, (long long)(deadline - now + 999) / 1000,
                   (pg->init_timeout_ms + 999) / 1000);
        report = now + period;
    }
}

/* Every other rank: wait for rank 0's verdict (join/done) until end,
 * saying now and then that it waits and how many have joined, so a hung
 * start shows on every rank, not on rank 0 only. */
static braid_status await_verdict(braid_pg *pg, const braid_rendezvous *rv, int64_t deadline, int64_t end, char *v,
                                  size_t cap, size_t *len)
{
    int period = pg->init_timeout_ms / 4 < JOIN_REPORT_MS ? pg->init_timeout_ms / 4 : JOIN_REPORT_MS;
    int64_t report = braid__now_ms() + (period < JOIN_FIRST_REPORT_MS ? period : JOIN_FIRST_REPORT_MS);
    for (;;) {
        int64_t now = braid__now_ms(), until = report < end ? report : end;
        int slice = until > now ? (int)(until - now) : 0;
        braid_status st = braid__store_get(pg->store, "join/done", v, cap, len, slice);
        if (st != BRAID_ERR_TIMEOUT)
            return st;
        now = braid__now_ms();
        if (now >= end)
            return st;
        int64_t joined = -1;
        if (braid__store_add(pg->store, "join/count", 0, &joined) != BRAID_OK)
            braid__error_clear(); /* the verdict's wait above reports a lost store */
        int64_t left = deadline > now ? (deadline - now + 999) / 1000 : 0;
        BRAID_WARN("rank %d: joined the store at %s:%d; waiting for the other ranks (%lld of %d joined; %lld of %d s "
                   "left, BRAID_INIT_TIMEOUT_MS)",
                   pg->rank, rv->host, rv->port, (long long)joined, pg->size, (long long)left,
                   (pg->init_timeout_ms + 999) / 1000);
        report = now + period;
    }
}

/* What every member must agree on, compared in the store handshake so a
 * rank started with another WORLD_SIZE (or checksum setting, job id,
 * secret) is named at once on every rank. NULL for a shrunk group, which
 * states none: its members come from one agreement. */
static const braid_job_params *job_params(const braid_pg *pg, const braid_rendezvous *rv, braid_job_params *params)
{
    memset(params, 0, sizeof(*params));
    params->size = (uint32_t)pg->size;
    params->source = rv->secret_source;
    params->checksum = (uint8_t)(pg->checksum != 0);
    params->secret_id = braid__secret_id(rv->secret);
    snprintf(params->job_id, sizeof(params->job_id), "%s", rv->job_id);
    if (rv->has_claim_key) {
        memcpy(params->claim_key, rv->claim_key, sizeof(params->claim_key));
        params->has_claim_key = 1;
    }
    return rv->secret_source != BRAID_SECRET_UNSTATED ? params : NULL;
}

braid_status braid__pg_report_launch_mistake(braid_pg *pg, const braid_rendezvous *rv)
{
    /* Rank 0 may start after us, but a process that cannot take part does
     * not wait the whole init timeout to say so. */
    if (pg->init_timeout_ms > MISTAKE_REPORT_MS)
        pg->init_timeout_ms = MISTAKE_REPORT_MS;
    BRAID_WARN("rank %d: %s: this process cannot be a rank of the job; telling rank 0's store at %s:%d (for up to %d "
               "s) before it leaves",
               pg->rank, rv->launch_error, rv->host, rv->port, (pg->init_timeout_ms + 999) / 1000);
    braid_job_params params;
    const braid_job_params *job = job_params(pg, rv, &params);
    braid_status st = connect_store(pg, rv, job);
    char told[640];
    if (st == BRAID_ERR_MISMATCH)
        snprintf(told, sizeof(told), "told rank 0's store at %s:%d, which stops every rank with the reason",
                 rv->host, rv->port);
    else if (st == BRAID_OK)
        snprintf(told, sizeof(told), "rank 0's store at %s:%d took it as a member all the same", rv->host,
                 rv->port);
    else
        snprintf(told, sizeof(told), "could not tell rank 0's store at %s:%d: %s", rv->host, rv->port,
                 braid__error_detail());
    braid__store_close(pg->store);
    pg->store = NULL;
    return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: %s: this process cannot be a rank of a job of %d; %s",
                        pg->rank, rv->launch_error, pg->size, told);
}

braid_status braid__pg_rendezvous(braid_pg *pg, const braid_rendezvous *rv)
{
    int64_t deadline = braid__now_ms() + pg->init_timeout_ms;
    braid_job_params params;
    const braid_job_params *job = job_params(pg, rv, &params);
    if (pg->rank == 0)
        BRAID_CHECK(serve_store(pg, rv, job));
    braid_status cst = connect_store(pg, rv, job);
    /* A copy of the id's socket inherited through fork goes now; not
     * before: where rank 0 is a thread of this same process (ncclCommInitAll,
     * nccl-tests -t N) that socket is the only one, and closing it before
     * rank 0 took it left the port unserved. Once the store answered, rank 0
     * has taken it and this finds nothing. */
    if (pg->rank != 0)
        braid__prebound_release(rv->port);
    BRAID_CHECK(cst);

    /* Mark ourselves before counting, so a counted rank is always listed
     * as present. The last rank to count tells everyone. */
    char key[32], v[512];
    size_t len;
    int64_t joined;
    snprintf(key, sizeof(key), "join/%d", pg->rank);
    BRAID_CHECK(braid__store_set(pg->store, key, "1", 1));
    BRAID_CHECK(braid__store_add(pg->store, "join/count", 1, &joined));
    if (joined == pg->size)
        BRAID_CHECK(braid__store_set(pg->store, "join/done", JOIN_OK, sizeof(JOIN_OK)));
    if (pg->rank == 0) {
        braid_status st = await_all(pg, rv, deadline);
        if (st == BRAID_ERR_TIMEOUT) {
            /* Tell the ranks that did join, then close our client so that
             * the failed init drains the store (pg.c) until they read it. */
            const char *text = braid__error_detail();
            (void)braid__store_set(pg->store, "join/done", text, strlen(text) + 1);
            braid__store_close(pg->store);
            pg->store = NULL;
        }
        return st;
    }
    braid_status st = await_verdict(pg, rv, deadline, deadline + JOIN_VERDICT_GRACE_MS, v, sizeof(v) - 1, &len);
    if (st == BRAID_ERR_TIMEOUT)
        return braid__error(st,
                            "rank %d: joined the store at %s:%d, but rank 0 did not report every rank joined within "
                            "%d ms (BRAID_INIT_TIMEOUT_MS)",
                            pg->rank, rv->host, rv->port, pg->init_timeout_ms);
    BRAID_CHECK(st);
    v[len] = '\0';
    if (strcmp(v, JOIN_OK) != 0)
        return braid__error(BRAID_ERR_TIMEOUT, "rank %d: the group did not form; rank 0 reports: %s", pg->rank, v);
    return BRAID_OK;
}
