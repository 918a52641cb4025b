/* The flight recorder (trace.h): a ring of the group's last calls. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "log.h"
#include "param.h"
#include "pg.h"
#include "status.h"
#include "trace.h"

enum { QUEUED, STARTED, DONE, FAILED };
static const char *const state_names[] = {"queued", "started", "done", "failed"};

typedef struct {
    uint64_t id; /* record number, from 1; 0: never used */
    uint64_t seq;
    uint64_t bytes;
    int64_t queued_ns, started_ns, ended_ns; /* since the group was made; 0: not yet */
    int kind, dtype, op, peer, device, state;
    braid_status status;
    const char *algo;
} trace_entry;

struct braid_trace {
    int cap;
    uint64_t last;   /* the newest record number */
    int64_t t0_ns;
    unsigned dumps;  /* files written so far, for their names */
    trace_entry e[];
};

braid_trace *braid__trace_new(void)
{
    long long cap = braid__param_int("BRAID_TRACE_BUFFER", 2000);
    if (cap <= 0)
        return NULL;
    braid_trace *t = calloc(1, sizeof(*t) + (size_t)cap * sizeof(trace_entry));
    if (!t) {
        BRAID_WARN("flight recorder off: no memory for %lld records (BRAID_TRACE_BUFFER)", cap);
        return NULL;
    }
    t->cap = (int)cap;
    t->t0_ns = braid__now_ns();
    return t;
}

void braid__trace_free(braid_trace *t)
{
    free(t);
}

static trace_entry *entry(braid_trace *t, uint64_t id)
{
    if (!t || !id)
        return NULL;
    trace_entry *e = &t->e[(id - 1) % (uint64_t)t->cap];
    return e->id == id ? e : NULL; /* overwritten by a newer record */
}

uint64_t braid__trace_queued(braid_trace *t, const braid_coll *c, int64_t now_ns)
{
    if (!t)
        return 0;
    uint64_t id = ++t->last;
    trace_entry *e = &t->e[(id - 1) % (uint64_t)t->cap];
    int kind = braid__coll_job_kind(c);
    const braid_kind_traits *k = braid__kind(kind);
    *e = (trace_entry){
        .id = id,
        .seq = c->seq,
        .bytes = braid__coll_job_bytes(c),
        .queued_ns = now_ns - t->t0_ns,
        .kind = kind,
        .dtype = c->kind == BRAID_COLL_GROUP ? -1 : (int)c->dtype,
        .op = k->has_op ? (int)c->op : -1,
        .peer = k->p2p ? c->peer : k->has_root ? c->root : -1,
        .device = c->hmem != NULL || c->send_mem.device_mem || c->recv_mem.device_mem,
        .state = QUEUED,
    };
    return id;
}

void braid__trace_started(braid_trace *t, uint64_t id, int64_t now_ns)
{
    trace_entry *e = entry(t, id);
    if (e) {
        e->started_ns = now_ns - t->t0_ns;
        e->state = STARTED;
    }
}

void braid__trace_ended(braid_trace *t, uint64_t id, braid_status st, const char *algo, int64_t now_ns)
{
    trace_entry *e = entry(t, id);
    if (e) {
        e->ended_ns = now_ns - t->t0_ns;
        e->state = st == BRAID_OK ? DONE : FAILED;
        e->status = st;
        e->algo = algo;
    }
}

/* peers: "shm: 1; tcp: 2 3", the transport of each peer, grouped; names:
 * "shm+tcp", every transport serving a peer (a collective's). */
static void transports_of(const braid_pg *pg, char *peers, size_t pcap, char *names, size_t ncap)
{
    size_t n = 0, m = 0;
    peers[0] = names[0] = '\0';
    for (int id = 0; id < BRAID_TRANSPORT_ID_COUNT; id++) {
        int any = 0;
        for (int p = 0; p < pg->size; p++) {
            if (p == pg->rank || pg->link[p] != id)
                continue;
            if (!any) {
                const braid_transport_ops *t = braid__transport_get((braid_transport_id)id);
                const char *name = t ? t->name : "?";
                if (n < pcap)
                    n += (size_t)snprintf(peers + n, pcap - n, "%s%s:", n ? "; " : "", name);
                if (m < ncap)
                    m += (size_t)snprintf(names + m, ncap - m, "%s%s", m ? "+" : "", name);
                any = 1;
            }
            if (n < pcap)
                n += (size_t)snprintf(peers + n, pcap - n, " %d", p);
        }
    }
    if (!peers[0])
        snprintf(peers, pcap, "none");
    if (!names[0])
        snprintf(names, ncap, "-");
}

static const char *peer_transport(const braid_pg *pg, const trace_entry *e, const char *all)
{
    if (!braid__kind(e->kind)->p2p || e->peer < 0 || e->peer >= pg->size)
        return all;
    if (e->peer == pg->rank)
        return "self";
    const braid_transport_ops *t = braid__transport_get((braid_transport_id)pg->link[e->peer]);
    return t ? t->name : "?";
}

static void us(char *out, size_t cap, int64_t ns)
{
    if (ns)
        snprintf(out, cap, "%.1f", (double)ns / 1000.0);
    else
        snprintf(out, cap, "-");
}

/* Records [first, t->last] to f; on stderr only the last STDERR_RECORDS
 * (a file takes them all). */
enum { STDERR_RECORDS = 32 };

static void write_records(FILE *f, const braid_pg *pg, const braid_trace *t, const char *reason)
{
    char host[128] = "?", peers[512], transports[64];
    gethostname(host, sizeof(host) - 1);
    transports_of(pg, peers, sizeof(peers), transports, sizeof(transports));
    uint64_t first = t->last > (uint64_t)t->cap ? t->last - (uint64_t)t->cap + 1 : 1;
    const trace_entry *started = NULL, *done = NULL;
    for (uint64_t id = first; id <= t->last; id++) {
        const trace_entry *e = &t->e[(id - 1) % (uint64_t)t->cap];
        if (e->state >= STARTED && !braid__kind(e->kind)->p2p)
            started = e;
        if (e->state == DONE && !braid__kind(e->kind)->p2p)
            done = e;
    }
    uint64_t shown = first;
    if (f == stderr && t->last - first + 1 > STDERR_RECORDS)
        shown = t->last - STDERR_RECORDS + 1;
    fprintf(f, "# braid flight recorder: rank %d of %d, pid %d, host %s, group %016llx\n", pg->rank, pg->size,
            (int)getpid(), host, (unsigned long long)pg->ctx.pg_tag);
    fprintf(f, "# reason: %s\n", reason);
    fprintf(f, "# peers by transport: %s\n", peers);
    fprintf(f, "# records %llu-%llu of %llu (BRAID_TRACE_BUFFER %d)%s; times in us since the group was made\n",
            (unsigned long long)(t->last ? shown : 0), (unsigned long long)t->last, (unsigned long long)t->last,
            t->cap, shown > first ? ", the last ones only: BRAID_TRACE_DIR=DIR writes them all to a file" : "");
    if (started)
        fprintf(f, "# last started: #%llu %s (%s)\n", (unsigned long long)started->seq,
                braid__kind(started->kind)->name, state_names[started->state]);
    else
        fprintf(f, "# last started: none\n");
    if (done)
        fprintf(f, "# last done: #%llu %s\n", (unsigned long long)done->seq, braid__kind(done->kind)->name);
    else
        fprintf(f, "# last done: none\n");
    fprintf(f, "# %8s  %-14s  %12s  %-8s  %-4s  %5s  %-6s  %-5s  %-9s  %-7s  %12s  %12s  %12s  %s\n", "seq", "kind",
            "bytes", "dtype", "op", "peer", "mem", "algo", "transport", "state", "queued", "started", "ended",
            "status");
    for (uint64_t id = shown; id <= t->last; id++) {
        const trace_entry *e = &t->e[(id - 1) % (uint64_t)t->cap];
        char q[32], s[32], d[32], peer[16];
        us(q, sizeof(q), e->queued_ns);
        us(s, sizeof(s), e->started_ns);
        us(d, sizeof(d), e->ended_ns);
        if (e->peer >= 0)
            snprintf(peer, sizeof(peer), "%d", e->peer);
        else
            snprintf(peer, sizeof(peer), "-");
        fprintf(f, "  %8llu  %-14s  %12llu  %-8s  %-4s  %5s  %-6s  %-5s  %-9s  %-7s  %12s  %12s  %12s  %s\n",
                (unsigned long long)e->seq, braid__kind(e->kind)->name, (unsigned long long)e->bytes,
                e->dtype >= 0 ? braid__dtype_name((braid_dtype)e->dtype) : "-",
                e->op >= 0 ? braid__op_name((braid_op)e->op) : "-", peer, e->device ? "device" : "host",
                e->algo ? e->algo : "-", peer_transport(pg, e, transports),
                state_names[e->state], q, s, d, e->state >= DONE ? braid_status_string(e->status) : "-");
    }
    fflush(f);
}

/* Returns 0, or -1 with why filled. */
static int dump(braid_pg *pg, const char *reason, const char *path, char *why, size_t why_cap)
{
    braid_trace *t = pg->trace;
    if (!t) {
        snprintf(why, why_cap, "the flight recorder is off (BRAID_TRACE_BUFFER=0)");
        return -1;
    }
    char name[4096];
    const char *dir = braid__param_str("BRAID_TRACE_DIR");
    if (!path && dir && dir[0]) {
        snprintf(name, sizeof(name), "%s/braid-trace-%016llx-r%d-p%d-%u.txt", dir,
                 (unsigned long long)pg->ctx.pg_tag, pg->rank, (int)getpid(), t->dumps);
        path = name;
    }
    t->dumps++;
    if (!path) {
        write_records(stderr, pg, t, reason);
        return 0;
    }
    FILE *f = fopen(path, "w");
    if (!f) {
        snprintf(why, why_cap, "cannot write %s: %s", path, strerror(errno));
        return -1;
    }
    write_records(f, pg, t, reason);
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        snprintf(why, why_cap, "writing %s failed", path);
        return -1;
    }
    BRAID_INFO("rank %d: flight recorder written to %s", pg->rank, path);
    return 0;
}

void braid__trace_failed_locked(braid_pg *pg, braid_status st)
{
    if (st == BRAID_OK || !pg->trace || pg->trace_dumped)
        return;
    pg->trace_dumped = 1; /* the first failure: later calls fail at once for the same cause */
    const char *dir = braid__param_str("BRAID_TRACE_DIR");
    if ((!dir || !dir[0]) && braid__log_level() < BRAID_LOG_WARN)
        return; /* stderr, and logging is off (BRAID_DEBUG=NONE) */
    char reason[1024], why[4400];
    snprintf(reason, sizeof(reason), "%s", braid_last_error());
    if (dump(pg, reason, NULL, why, sizeof(why)) != 0)
        BRAID_WARN("rank %d: flight recorder: %s", pg->rank, why);
}

BRAID_API braid_status braid_pg_trace_dump(braid_pg *pg, const char *path)
{
    BRAID_CHECK(braid__pg_check_handle(pg, "braid_pg_trace_dump"));
    char why[4400];
    pthread_mutex_lock(&pg->mu);
    int rc = dump(pg, "asked for (braid_pg_trace_dump)", path, why, sizeof(why));
    pthread_mutex_unlock(&pg->mu);
    if (rc != 0)
        return braid__error(rc == -1 && !pg->trace ? BRAID_ERR_INVALID_ARG : BRAID_ERR_SYSTEM, "rank %d: %s",
                            pg->rank, why);
    return BRAID_OK;
}
