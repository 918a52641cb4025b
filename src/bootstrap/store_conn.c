/* Store server connections: accepting and admitting them, the handshake
 * and the verdict on a member's job parameters, and a client's replies. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "status.h"
#include "store_server_int.h"

/* A rank has been given the reason the job failed. */
void braid__store_mark_told(braid_store_server *s, int rank)
{
    if (s->told && rank >= 0 && (uint32_t)rank < s->job.size && !s->told[rank]) {
        s->told[rank] = 1;
        s->ntold++;
    }
}

void braid__store_client_drop(client *c, int level, const char *why)
{
    if (c->state == CL_DEAD)
        return;
    if (c->rank >= 0)
        BRAID_LOG(level, "store: dropping rank %d (%s): %s", c->rank, c->addr, why);
    else
        BRAID_LOG(level, "store: dropping unauthenticated connection from %s: %s", c->addr, why);
    c->state = CL_DEAD;
}

void braid__store_client_free(client *c)
{
    if (c->fd >= 0)
        close(c->fd);
    braid__auth_accept_clear(&c->hs);
    free(c->body);
    free(c->out);
    free(c);
}

/* Try to send the pending reply; on completion wait for the next request. */
void braid__store_client_flush(client *c)
{
    while (c->out_pos < c->out_len) {
        ssize_t n = send(c->fd, c->out + c->out_pos, c->out_len - c->out_pos, MSG_NOSIGNAL);
        if (n >= 0) {
            c->out_pos += (size_t)n;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            c->state = CL_REPLY;
            return;
        } else if (errno != EINTR) {
            char why[128];
            snprintf(why, sizeof(why), "send: %s", strerror(errno));
            braid__store_client_drop(c, BRAID_LOG_WARN, why);
            return;
        }
    }
    free(c->out);
    c->out = NULL;
    c->out_pos = c->out_len = 0;
    free(c->body);
    c->body = NULL;
    c->hdr_pos = 0;
    c->state = CL_HEADER;
}

void braid__store_client_reply(client *c, uint8_t code, const uint8_t *value, size_t len)
{
    braid_store_reply r = {.code = code, .value_len = (uint32_t)len};
    c->out = malloc(BRAID_STORE_REPLY_BYTES + len);
    if (!c->out) {
        braid__store_client_drop(c, BRAID_LOG_WARN, "out of memory for a reply");
        return;
    }
    braid__store_reply_encode(&r, c->out);
    if (len)
        memcpy(c->out + BRAID_STORE_REPLY_BYTES, value, len);
    c->out_pos = 0;
    c->out_len = BRAID_STORE_REPLY_BYTES + len;
    c->deadline = -1;
    braid__store_client_flush(c);
}

/* Members that cannot form one job: every waiting and later request is
 * answered with the reason, so each member stops at once. */
static void fail_job(braid_store_server *s, const char *why)
{
    if (s->failed[0])
        return;
    snprintf(s->failed, sizeof(s->failed), "%s", why);
    BRAID_WARN("store: the job cannot start: %s", why);
    for (client *c = s->clients; c; c = c->next) {
        if (c->state == CL_PARKED) {
            braid__store_mark_told(s, c->rank);
            braid__store_client_reply(c, BRAID_STORE_REPLY_FAILED, (const uint8_t *)s->failed, strlen(s->failed));
        }
    }
}

/* The connection no longer counts as unproven for admission. */
void braid__store_client_proven(braid_store_server *s, client *c)
{
    if (c->unproven)
        braid__admit_leave(&s->admit, c->host);
    c->unproven = 0;
}

/* Whether every rank of the job has joined: from then on the job has no
 * place left, and whoever else proves the secret belongs to another job
 * (two jobs started on one port share a secret without a launcher job id). */
static int formed(const braid_store_server *s)
{
    return s->joined && s->njoined == s->job.size;
}

/* The verdict on a member's rank: in range, not held by another connected
 * process, and a place left in the job. Fails the job where the mistake
 * is one of the job's own (a rank out of range, one rank started twice),
 * so that every member stops with the cause. */
static uint32_t judge_rank(braid_store_server *s, client *c)
{
    int r = c->hs.peer.rank;
    if (!s->joined || c->hs.peer.job.size == 0)
        return BRAID_AUTH_ACCEPTED; /* not tracked, or a probe that states no parameters */
    if (formed(s)) {
        BRAID_WARN("store: refusing a rank %d from %s: every one of the job's %u ranks has joined, so it belongs to "
                   "another job (one started on this port?)",
                   r, c->addr, (unsigned)s->job.size);
        return BRAID_AUTH_REJECT_FORMED;
    }
    char text[448];
    if ((uint32_t)r >= s->job.size) {
        snprintf(text, sizeof(text),
                 "a process from %s joined as rank %d of a job of %u ranks (0 to %u): its launch variables (RANK, "
                 "WORLD_SIZE) are wrong",
                 c->addr, r, (unsigned)s->job.size, (unsigned)s->job.size - 1);
        fail_job(s, text);
        return BRAID_AUTH_REJECT_RANK;
    }
    for (client *o = s->clients; o; o = o->next) {
        if (o == c || !o->member || o->rank != r || o->state == CL_DEAD)
            continue;
        snprintf(text, sizeof(text),
                 "rank %d joined twice, from %s and from %s: two processes were given one RANK, or another job uses "
                 "this port",
                 r, o->addr, c->addr);
        fail_job(s, text);
        return BRAID_AUTH_REJECT_TAKEN;
    }
    if (!s->joined[r]) {
        s->joined[r] = 1;
        s->njoined++;
    }
    c->member = 1;
    c->rank = r; /* now, not when the verdict is sent: a second process for r is compared with this one */
    return BRAID_AUTH_ACCEPTED;
}

/* The verdict on a client that has proven the secret: its parameters,
 * then its rank. */
static uint32_t judge(braid_store_server *s, client *c)
{
    char why[384], name[32];
    int bound;
    if (c->hs.peer.target != s->rank)
        return BRAID_AUTH_REJECT_RANK; /* it wants another member's store: relayed, or a stale address */
    if (formed(s))
        return judge_rank(s, c); /* another job's, whatever its parameters: the job is not failed */
    if (s->joined && c->hs.peer.job.size > 0 && (uint32_t)c->hs.peer.rank >= c->hs.peer.job.size) {
        /* A process that knows it is out of range (braid_pg_init_env with
         * RANK not below WORLD_SIZE) comes to say so before it leaves. */
        char text[448];
        snprintf(text, sizeof(text),
                 "a process from %s was started as rank %d with a world size of %u (its RANK is not below its "
                 "WORLD_SIZE; this job has %u ranks): its launch variables are wrong, and it left",
                 c->addr, c->hs.peer.rank, (unsigned)c->hs.peer.job.size, (unsigned)s->job.size);
        fail_job(s, text);
        braid__store_mark_told(s, c->hs.peer.rank); /* the process knows; nobody else comes as that rank */
        return BRAID_AUTH_REJECT_RANK;
    }
    snprintf(name, sizeof(name), "rank %d", c->hs.peer.rank);
    if (c->hs.peer.job.size > 0 && c->hs.peer.job.size < s->expect)
        s->expect = c->hs.peer.job.size;
    if (!braid__job_params_diff(&c->hs.peer.job, name, &s->job, "rank 0 (the store)", why, sizeof(why), &bound))
        return judge_rank(s, c);
    char text[448];
    snprintf(text, sizeof(text), "job parameters differ: %s", why);
    fail_job(s, text);
    braid__store_mark_told(s, c->hs.peer.rank); /* the refusal names the parameter: it learns from its own hello */
    return BRAID_AUTH_REJECT_PARAMS;
}

/* A valid mismatch claim (auth.h, checked by the caller) with a wrong
 * proof, from a process of this user for a rank no member holds: its
 * parameters, which the secret derives from, differ from the job's, so
 * that rank can never join. Fail the job with the cause, as for a proven
 * member (judge). Returns 1 when the claim was taken. */
static int take_claim(braid_store_server *s, client *c)
{
    const braid_hello *h = &c->hs.peer;
    if (s->failed[0] || formed(s) || h->job.size == 0 || h->rank <= 0 || (uint32_t)h->rank >= s->job.size)
        return 0;
    for (client *o = s->clients; o; o = o->next)
        if (o != c && o->rank == h->rank && o->state != CL_DEAD)
            return 0; /* a member holds that rank: this is another job's */
    char why[384], name[32];
    int bound;
    snprintf(name, sizeof(name), "rank %d", h->rank);
    if (!braid__job_params_diff(&h->job, name, &s->job, "rank 0 (the store)", why, sizeof(why), &bound) || !bound)
        return 0;
    char text[448];
    snprintf(text, sizeof(text), "job parameters differ: %s", why);
    fail_job(s, text);
    braid__store_mark_told(s, h->rank); /* it found the difference itself, from our hello */
    return 1;
}

void braid__store_step_handshake(braid_store_server *s, client *c)
{
    if (braid__auth_accept_step(&c->hs, c->fd) != BRAID_OK) {
        if (c->hs.bad_proof && s->job.has_claim_key && braid__auth_claim_valid(&c->hs, s->job.claim_key)) {
            /* One of ours whose parameters differ: fail the job if the
             * claim is about it, and answer a claim that followed a proof
             * (the claimant cannot see our secret id otherwise). */
            (void)take_claim(s, c);
            braid__store_client_proven(s, c);
            if (braid__auth_accept_answer_claim(&c->hs, s->job.claim_key, s->job.secret_id) &&
                braid__auth_accept_step(&c->hs, c->fd) == BRAID_OK && c->hs.state != BRAID_AUTH_DONE)
                return; /* the answer goes out as the socket allows; DONE drops it below */
            braid__store_client_drop(c, BRAID_LOG_INFO,
                                     "rank with different job parameters (claim proven by the key file)");
            return;
        }
        if (c->hs.bad_proof) {
            /* Hold the connection, silent, before the close. */
            int delay = braid__admit_fail(&s->admit, c->host, braid__now_ms());
            BRAID_WARN("store: connection from %s: %s; closing it in %d ms", c->addr, braid_last_error(), delay);
            c->state = CL_DELAY;
            c->deadline = braid__now_ms() + delay;
            return;
        }
        /* A bare connect-and-close is a port scan or a health check. */
        int quiet = c->hs.bytes_in == 0 && c->hs.state == BRAID_AUTH_RECV_HELLO;
        braid__store_client_drop(c, quiet ? BRAID_LOG_INFO : BRAID_LOG_WARN, braid_last_error());
        return;
    }
    if (c->hs.state == BRAID_AUTH_VERIFIED) {
        braid__store_client_proven(s, c);
        braid__auth_accept_finish(&c->hs, judge(s, c));
        if (braid__auth_accept_step(&c->hs, c->fd) != BRAID_OK) {
            braid__store_client_drop(c, BRAID_LOG_WARN, braid_last_error());
            return;
        }
    }
    if (c->hs.state == BRAID_AUTH_DONE) {
        if (c->hs.result != BRAID_AUTH_ACCEPTED) {
            braid__store_client_drop(c, BRAID_LOG_INFO, braid__auth_result_string(c->hs.result));
            return;
        }
        c->rank = c->hs.peer.rank;
        c->deadline = -1;
        c->state = CL_HEADER;
        braid__auth_accept_clear(&c->hs);
        BRAID_TRACE("store: rank %d connected from %s", c->rank, c->addr);
    }
}

/* Which unproven connection goes first when room is needed: one whose
 * proof failed, then one that has sent nothing, and only then one whose
 * hello has arrived (a member's, a round trip from its proof). */
static int evict_tier(const client *c)
{
    return c->state == CL_DELAY ? 0 : c->hs.bytes_in == 0 ? 1 : 2;
}

/* Make room for a newcomer: drop the oldest unproven connection of the
 * lowest tier (of host, or of anybody when NULL). The list runs newest
 * first. */
static void evict_oldest(braid_store_server *s, const char *host)
{
    client *victim = NULL;
    for (client *c = s->clients; c; c = c->next) {
        if (!c->unproven || c->state == CL_DEAD || (host && strcmp(c->host, host) != 0))
            continue;
        if (!victim || evict_tier(c) <= evict_tier(victim))
            victim = c;
    }
    if (victim) {
        braid__store_client_drop(victim, BRAID_LOG_INFO, "too many unauthenticated connections: oldest dropped");
        braid__store_client_proven(s, victim);
    }
}

void braid__store_accept_clients(braid_store_server *s)
{
    /* A bounded batch: between batches the loop reads the hellos that have
     * arrived, so a member accepted amid a flood shows itself before the
     * next newcomers need room. */
    for (int taken = 0; taken < ACCEPT_BATCH; taken++) {
        braid_sockaddr a;
        a.len = sizeof(a.ss);
        int fd = accept4(s->listen_fd, (struct sockaddr *)&a.ss, &a.len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOMEM || errno == ENOBUFS) {
                BRAID_WARN("store: accept: %m; pausing new connections for %d ms", ACCEPT_PAUSE_MS);
                s->accept_resume = braid__now_ms() + ACCEPT_PAUSE_MS;
            } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED) {
                BRAID_WARN("store: accept: %m");
            }
            return;
        }
        client *c = calloc(1, sizeof(*c));
        braid_hello self = {.role = BRAID_ROLE_STORE_SERVER, .rank = s->rank, .target = -1, .job = s->job};
        self.job.secret_id = 0; /* shown to nobody before a proof (auth.h) */
        if (!c || braid__auth_accept_init(&c->hs, s->secret, &self, BRAID_ROLE_STORE_CLIENT) != BRAID_OK) {
            BRAID_WARN("store: cannot take a new connection: out of memory or randomness");
            free(c);
            close(fd);
            continue;
        }
        braid__sock_tune(fd);
        c->fd = fd;
        c->rank = -1;
        c->state = CL_HANDSHAKE;
        c->deadline = braid__now_ms() + braid__store_handshake_ms;
        braid__sock_addr_format(&a, c->addr, sizeof(c->addr));
        braid__admit_host(&a, c->host);
        int evict = braid__admit_enter(&s->admit, c->host);
        if (evict < 0) {
            BRAID_WARN("store: cannot take a connection from %s: out of memory", c->addr);
            braid__store_client_free(c);
            continue;
        }
        c->unproven = 1;
        if (evict)
            evict_oldest(s, evict == 1 ? c->host : NULL);
        c->next = s->clients;
        s->clients = c;
        s->nclients++;
    }
}
