/* Rendezvous store server: one thread, one poll() loop over the listening
 * socket, a wake pipe and every client. Each client is a small state
 * machine (handshake, request header, body, parked GET, reply), so a slow,
 * silent, half-open or garbage connection costs one pollfd and never
 * blocks anybody else; an unauthenticated one is dropped at its deadline. */
#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "admit.h"
#include "auth.h"
#include "log.h"
#include "sock.h"
#include "status.h"
#include "store.h"
#include "store_wire.h"

#define ACCEPT_PAUSE_MS 100 /* after EMFILE: let fds free up instead of spinning */
#define INITIAL_BUCKETS 64
#define DRAIN_POLL_MS 10    /* while stopping: how often the client count is checked */
#define FAILED_DRAIN_MS 5000 /* a failed job's store stays until every rank was told, or this long */

/* CL_DELAY: a wrong proof, held silently until its deadline, then closed. */
typedef enum { CL_HANDSHAKE, CL_HEADER, CL_BODY, CL_PARKED, CL_REPLY, CL_DELAY, CL_DEAD } client_state;

typedef struct client {
    int fd;
    client_state state;
    int rank;         /* -1 until authenticated */
    int64_t deadline; /* handshake, or parked GET (-1: none) */
    char addr[BRAID_SOCK_ADDR_STR];
    char host[BRAID_SOCK_ADDR_STR]; /* addr without the port: the admission source */
    int unproven;                   /* counted in the server's admission table */
    braid_auth_accept hs;
    uint8_t hdr[BRAID_STORE_REQ_BYTES];
    size_t hdr_pos;
    braid_store_req req;
    uint8_t *body; /* key then value */
    size_t body_pos;
    uint8_t *out; /* reply being sent */
    size_t out_pos, out_len;
    struct client *next;
} client;

typedef struct entry {
    struct entry *next;
    uint8_t *key;
    size_t key_len;
    uint8_t *value;
    size_t value_len;
} entry;

struct braid_store_server {
    int listen_fd;
    int wake[2];
    pthread_t thread;
    uint8_t secret[BRAID_SECRET_BYTES];
    client *clients;
    size_t nclients;
    entry **buckets;
    size_t nbuckets, nentries;
    struct pollfd *pfds;
    client **pclients;
    size_t pcap;
    int64_t accept_resume; /* listen fd ignored until then */
    int drain_ms;          /* on stop: serve connected members this long */
    braid_admit admit;
    braid_job_params job; /* size 0: parameters not checked */
    char failed[512];     /* why the job cannot start; "" while it can */
    uint8_t *told;        /* [job.size]: ranks that got the reason */
    uint32_t ntold;
    uint32_t expect;      /* ranks to tell: the smallest world size any member stated */
};

/* A rank has been given the reason the job failed. */
static void mark_told(braid_store_server *s, int rank)
{
    if (s->told && rank >= 0 && (uint32_t)rank < s->job.size && !s->told[rank]) {
        s->told[rank] = 1;
        s->ntold++;
    }
}

/* ---- key-value table --------------------------------------------------- */

static uint64_t hash_key(const uint8_t *k, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ k[i]) * 1099511628211ull;
    return h;
}

static entry *kv_find(braid_store_server *s, const uint8_t *key, size_t len)
{
    for (entry *e = s->buckets[hash_key(key, len) & (s->nbuckets - 1)]; e; e = e->next)
        if (e->key_len == len && memcmp(e->key, key, len) == 0)
            return e;
    return NULL;
}

static void kv_grow(braid_store_server *s)
{
    size_t n = s->nbuckets * 2;
    entry **b = calloc(n, sizeof(*b));
    if (!b)
        return; /* keep the longer chains; still correct */
    for (size_t i = 0; i < s->nbuckets; i++) {
        for (entry *e = s->buckets[i], *next; e; e = next) {
            next = e->next;
            size_t j = hash_key(e->key, e->key_len) & (n - 1);
            e->next = b[j];
            b[j] = e;
        }
    }
    free(s->buckets);
    s->buckets = b;
    s->nbuckets = n;
}

/* Store a copy of value under key. 0 on success, -1 out of memory. */
static int kv_put(braid_store_server *s, const uint8_t *key, size_t key_len, const uint8_t *value, size_t len)
{
    uint8_t *v = malloc(len ? len : 1);
    if (!v)
        return -1;
    memcpy(v, value, len);
    entry *e = kv_find(s, key, key_len);
    if (e) {
        free(e->value);
        e->value = v;
        e->value_len = len;
        return 0;
    }
    e = calloc(1, sizeof(*e));
    uint8_t *k = malloc(key_len);
    if (!e || !k) {
        free(e);
        free(k);
        free(v);
        return -1;
    }
    memcpy(k, key, key_len);
    e->key = k;
    e->key_len = key_len;
    e->value = v;
    e->value_len = len;
    size_t j = hash_key(key, key_len) & (s->nbuckets - 1);
    e->next = s->buckets[j];
    s->buckets[j] = e;
    if (++s->nentries > s->nbuckets)
        kv_grow(s);
    return 0;
}

static void kv_free(braid_store_server *s)
{
    for (size_t i = 0; i < s->nbuckets; i++) {
        for (entry *e = s->buckets[i], *next; e; e = next) {
            next = e->next;
            free(e->key);
            free(e->value);
            free(e);
        }
    }
    free(s->buckets);
}

/* ---- clients ------------------------------------------------------------- */

static void client_drop(client *c, int level, const char *why)
{
    if (c->state == CL_DEAD)
        return;
    if (c->rank >= 0)
        BRAID_LOG(level, "store: dropping rank %d (%s): %s", c->rank, c->addr, why);
    else
        BRAID_LOG(level, "store: dropping unauthenticated connection from %s: %s", c->addr, why);
    c->state = CL_DEAD;
}

static void client_free(client *c)
{
    if (c->fd >= 0)
        close(c->fd);
    braid__auth_accept_clear(&c->hs);
    free(c->body);
    free(c->out);
    free(c);
}

/* Try to send the pending reply; on completion wait for the next request. */
static void client_flush(client *c)
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
            client_drop(c, BRAID_LOG_WARN, why);
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

static void client_reply(client *c, uint8_t code, const uint8_t *value, size_t len)
{
    braid_store_reply r = {.code = code, .value_len = (uint32_t)len};
    c->out = malloc(BRAID_STORE_REPLY_BYTES + len);
    if (!c->out) {
        client_drop(c, BRAID_LOG_WARN, "out of memory for a reply");
        return;
    }
    braid__store_reply_encode(&r, c->out);
    if (len)
        memcpy(c->out + BRAID_STORE_REPLY_BYTES, value, len);
    c->out_pos = 0;
    c->out_len = BRAID_STORE_REPLY_BYTES + len;
    c->deadline = -1;
    client_flush(c);
}

/* Answer every GET parked on the key just written. */
static void wake_parked(braid_store_server *s, const entry *e)
{
    for (client *c = s->clients; c; c = c->next) {
        if (c->state == CL_PARKED && c->req.key_len == e->key_len && memcmp(c->body, e->key, e->key_len) == 0)
            client_reply(c, BRAID_STORE_REPLY_OK, e->value, e->value_len);
    }
}

static void handle_request(braid_store_server *s, client *c)
{
    const uint8_t *key = c->body, *value = c->body + c->req.key_len;
    size_t key_len = c->req.key_len;
    if (s->failed[0]) {
        mark_told(s, c->rank);
        client_reply(c, BRAID_STORE_REPLY_FAILED, (const uint8_t *)s->failed, strlen(s->failed));
        return;
    }
    entry *e = kv_find(s, key, key_len);
    switch (c->req.op) {
    case BRAID_STORE_SET:
        if (kv_put(s, key, key_len, value, c->req.value_len) != 0) {
            client_drop(c, BRAID_LOG_WARN, "out of memory for a value");
            return;
        }
        /* Waiters first: the reply frees the request (and key) once sent. */
        wake_parked(s, kv_find(s, key, key_len));
        client_reply(c, BRAID_STORE_REPLY_OK, NULL, 0);
        return;
    case BRAID_STORE_GET:
        if (e) {
            client_reply(c, BRAID_STORE_REPLY_OK, e->value, e->value_len);
        } else if (c->req.timeout_ms == 0) {
            client_reply(c, BRAID_STORE_REPLY_TIMEOUT, NULL, 0);
        } else {
            c->state = CL_PARKED;
            c->deadline = c->req.timeout_ms == BRAID_STORE_WAIT_FOREVER ? -1 : braid__now_ms() + c->req.timeout_ms;
        }
        return;
    case BRAID_STORE_ADD: {
        if (e && e->value_len != 8) {
            client_reply(c, BRAID_STORE_REPLY_BAD, NULL, 0);
            return;
        }
        /* Wrap-around addition, well defined on the unsigned value. */
        uint64_t sum = (uint64_t)(e ? braid__store_get_i64(e->value) : 0) + (uint64_t)braid__store_get_i64(value);
        uint8_t out[8];
        braid__store_put_i64(out, (int64_t)sum);
        if (kv_put(s, key, key_len, out, sizeof(out)) != 0) {
            client_drop(c, BRAID_LOG_WARN, "out of memory for a value");
            return;
        }
        wake_parked(s, kv_find(s, key, key_len));
        client_reply(c, BRAID_STORE_REPLY_OK, out, sizeof(out));
        return;
    }
    default:
        client_drop(c, BRAID_LOG_WARN, "unknown op"); /* decode rules this out */
        return;
    }
}

/* Receive into buf[*pos..len). 1 complete, 0 would block, -1 dropped. */
static int client_recv(client *c, uint8_t *buf, size_t *pos, size_t len)
{
    while (*pos < len) {
        ssize_t n = recv(c->fd, buf + *pos, len - *pos, 0);
        if (n > 0) {
            *pos += (size_t)n;
        } else if (n == 0) {
            /* A rank that is done closes between requests: not an error. */
            client_drop(c, *pos == 0 && c->state == CL_HEADER ? BRAID_LOG_INFO : BRAID_LOG_WARN, "connection closed");
            return -1;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            return 0;
        } else if (errno != EINTR) {
            char why[128];
            snprintf(why, sizeof(why), "recv: %s", strerror(errno));
            client_drop(c, BRAID_LOG_WARN, why);
            return -1;
        }
    }
    return 1;
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
            mark_told(s, c->rank);
            client_reply(c, BRAID_STORE_REPLY_FAILED, (const uint8_t *)s->failed, strlen(s->failed));
        }
    }
}

/* The connection no longer counts as unproven for admission. */
static void client_proven(braid_store_server *s, client *c)
{
    if (c->unproven)
        braid__admit_leave(&s->admit, c->host);
    c->unproven = 0;
}

/* The verdict on a client that has proven the secret: its parameters. */
static uint32_t judge(braid_store_server *s, client *c)
{
    char why[384], name[32];
    int bound;
    snprintf(name, sizeof(name), "rank %d", c->hs.peer.rank);
    if (c->hs.peer.job.size > 0 && c->hs.peer.job.size < s->expect)
        s->expect = c->hs.peer.job.size;
    if (!braid__job_params_diff(&c->hs.peer.job, name, &s->job, "rank 0 (the store)", why, sizeof(why), &bound))
        return BRAID_AUTH_ACCEPTED;
    char text[448];
    snprintf(text, sizeof(text), "job parameters differ: %s", why);
    fail_job(s, text);
    mark_told(s, c->hs.peer.rank); /* the refusal names the parameter: it learns from its own hello */
    return BRAID_AUTH_REJECT_PARAMS;
}

/* A wrong proof that is a valid mismatch claim (auth.h) from a process
 * of this user for a rank no member holds: its parameters, which the
 * secret derives from, differ from the job's, so that rank can never
 * join. Fail the job with the cause, as for a proven member (judge).
 * Returns 1 when the claim was taken. */
static int take_claim(braid_store_server *s, client *c)
{
    const braid_hello *h = &c->hs.peer;
    if (!s->job.has_claim_key || s->failed[0] || h->job.size == 0 || h->rank <= 0 ||
        (uint32_t)h->rank >= s->job.size || !braid__auth_claim_valid(&c->hs, s->job.claim_key))
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
    mark_told(s, h->rank); /* it found the difference itself, from our hello */
    return 1;
}

static void step_handshake(braid_store_server *s, client *c)
{
    if (braid__auth_accept_step(&c->hs, c->fd) != BRAID_OK) {
        if (c->hs.bad_proof && take_claim(s, c)) {
            client_proven(s, c);
            client_drop(c, BRAID_LOG_INFO, "rank with different job parameters (claim proven by the key file)");
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
        client_drop(c, quiet ? BRAID_LOG_INFO : BRAID_LOG_WARN, braid_last_error());
        return;
    }
    if (c->hs.state == BRAID_AUTH_VERIFIED) {
        client_proven(s, c);
        braid__auth_accept_finish(&c->hs, judge(s, c));
        if (braid__auth_accept_step(&c->hs, c->fd) != BRAID_OK) {
            client_drop(c, BRAID_LOG_WARN, braid_last_error());
            return;
        }
    }
    if (c->hs.state == BRAID_AUTH_DONE) {
        if (c->hs.result != BRAID_AUTH_ACCEPTED) {
            client_drop(c, BRAID_LOG_INFO, braid__auth_result_string(c->hs.result));
            return;
        }
        c->rank = c->hs.peer.rank;
        c->deadline = -1;
        c->state = CL_HEADER;
        braid__auth_accept_clear(&c->hs);
        BRAID_TRACE("store: rank %d connected from %s", c->rank, c->addr);
    }
}

static void step_client(braid_store_server *s, client *c, short revents)
{
    int r;
    switch (c->state) {
    case CL_HANDSHAKE:
        step_handshake(s, c);
        if (c->state != CL_HEADER)
            return;
        /* A request may already be queued behind the handshake. */
        /* fall through */
    case CL_HEADER:
        r = client_recv(c, c->hdr, &c->hdr_pos, sizeof(c->hdr));
        if (r <= 0)
            return;
        if (braid__store_req_decode(c->hdr, sizeof(c->hdr), &c->req) != BRAID_OK) {
            client_drop(c, BRAID_LOG_WARN, braid_last_error());
            return;
        }
        c->body = malloc((size_t)c->req.key_len + c->req.value_len);
        if (!c->body) {
            client_drop(c, BRAID_LOG_WARN, "out of memory for a request");
            return;
        }
        c->body_pos = 0;
        c->state = CL_BODY;
        /* fall through */
    case CL_BODY:
        r = client_recv(c, c->body, &c->body_pos, (size_t)c->req.key_len + c->req.value_len);
        if (r > 0)
            handle_request(s, c);
        return;
    case CL_PARKED: {
        /* The client waits for this reply and sends nothing meanwhile:
         * readable means it closed, or broke the protocol. */
        uint8_t b;
        ssize_t n = recv(c->fd, &b, 1, MSG_PEEK);
        if (n == 0)
            client_drop(c, BRAID_LOG_INFO, "closed while waiting for a key");
        else if (n > 0)
            client_drop(c, BRAID_LOG_WARN, "sent data while waiting for a key");
        else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            client_drop(c, BRAID_LOG_WARN, "error while waiting for a key");
        return;
    }
    case CL_REPLY:
        if (revents & (POLLERR | POLLHUP | POLLOUT))
            client_flush(c);
        return;
    case CL_DELAY:
    case CL_DEAD:
        return;
    }
}

static short client_events(const client *c)
{
    switch (c->state) {
    case CL_HANDSHAKE:
        return braid__auth_accept_events(&c->hs);
    case CL_HEADER:
    case CL_BODY:
    case CL_PARKED:
        return POLLIN;
    case CL_REPLY:
        return POLLOUT;
    default:
        return 0;
    }
}

/* Make room for a newcomer: drop the oldest unproven connection (of host,
 * or of anybody when NULL), one whose proof failed first. The list runs
 * newest first. */
static void evict_oldest(braid_store_server *s, const char *host)
{
    client *victim = NULL;
    for (client *c = s->clients; c; c = c->next) {
        if (!c->unproven || c->state == CL_DEAD || (host && strcmp(c->host, host) != 0))
            continue;
        if (!victim || c->state == CL_DELAY || victim->state != CL_DELAY)
            victim = c;
    }
    if (victim) {
        client_drop(victim, BRAID_LOG_INFO, "too many unauthenticated connections: oldest dropped");
        client_proven(s, victim);
    }
}

static void accept_clients(braid_store_server *s)
{
    for (;;) {
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
        braid_hello self = {.role = BRAID_ROLE_STORE_SERVER, .rank = 0, .target = -1, .job = s->job};
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
            client_free(c);
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

static void sweep_dead(braid_store_server *s)
{
    for (client **pp = &s->clients; *pp;) {
        client *c = *pp;
        if (c->state == CL_DEAD) {
            client_proven(s, c);
            *pp = c->next;
            s->nclients--;
            client_free(c);
        } else {
            pp = &c->next;
        }
    }
}

static void expire_deadlines(braid_store_server *s, int64_t now)
{
    for (client *c = s->clients; c; c = c->next) {
        if (c->deadline < 0 || c->deadline > now)
            continue;
        if (c->state == CL_HANDSHAKE)
            client_drop(c, c->hs.bytes_in ? BRAID_LOG_WARN : BRAID_LOG_INFO,
                        "no complete handshake in time (slow, silent or not a braid client)");
        else if (c->state == CL_DELAY)
            client_drop(c, BRAID_LOG_INFO, "closed after a wrong proof");
        else if (c->state == CL_PARKED)
            client_reply(c, BRAID_STORE_REPLY_TIMEOUT, NULL, 0);
    }
}

static int poll_timeout(const braid_store_server *s, int64_t now)
{
    int64_t next = -1;
    for (const client *c = s->clients; c; c = c->next)
        if (c->deadline >= 0 && (next < 0 || c->deadline < next))
            next = c->deadline;
    if (s->accept_resume > now && (next < 0 || s->accept_resume < next))
        next = s->accept_resume;
    if (next < 0)
        return -1;
    return next <= now ? 0 : (int)(next - now > 60000 ? 60000 : next - now);
}

static int grow_pollfds(braid_store_server *s, size_t n)
{
    if (n <= s->pcap)
        return 0;
    size_t cap = s->pcap ? s->pcap : 16;
    while (cap < n)
        cap *= 2;
    struct pollfd *p = realloc(s->pfds, cap * sizeof(*p));
    if (!p)
        return -1;
    s->pfds = p;
    client **c = realloc(s->pclients, cap * sizeof(*c));
    if (!c)
        return -1;
    s->pclients = c;
    s->pcap = cap;
    return 0;
}

static size_t members(const braid_store_server *s)
{
    size_t n = 0;
    for (const client *c = s->clients; c; c = c->next)
        n += c->rank >= 0 && c->state != CL_DEAD;
    return n;
}

/* Stopping may finish: members gone, or, for a failed job, every rank of
 * it told why and every reply sent. */
static int drained(const braid_store_server *s)
{
    if (!s->failed[0])
        return members(s) == 0;
    for (const client *c = s->clients; c; c = c->next)
        if (c->state == CL_REPLY || (c->state == CL_HANDSHAKE && c->hs.state >= BRAID_AUTH_SEND_RESULT))
            return 0;
    uint32_t n = s->expect < s->job.size ? s->expect : s->job.size;
    for (uint32_t r = 0; r < n; r++)
        if (!s->told[r])
            return 0;
    return 1;
}

static void *server_main(void *arg)
{
    braid_store_server *s = arg;
    int64_t stop_at = -1; /* set once stopping */
    for (;;) {
        int64_t now = braid__now_ms();
        if (grow_pollfds(s, s->nclients + 2) != 0) {
            BRAID_WARN("store: out of memory for %zu connections; retrying", s->nclients);
            poll(NULL, 0, ACCEPT_PAUSE_MS);
            continue;
        }
        size_t n = 0;
        s->pfds[n++] = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
        s->pfds[n++] = (struct pollfd){.fd = s->accept_resume > now ? -1 : s->listen_fd, .events = POLLIN};
        for (client *c = s->clients; c; c = c->next) {
            s->pclients[n] = c;
            /* A held connection is not watched: a close would wake us in a loop. */
            s->pfds[n++] = (struct pollfd){.fd = c->state == CL_DELAY ? -1 : c->fd, .events = client_events(c)};
        }
        int timeout = poll_timeout(s, now);
        if (stop_at >= 0 && (timeout < 0 || timeout > DRAIN_POLL_MS))
            timeout = DRAIN_POLL_MS;
        int rc = poll(s->pfds, (nfds_t)n, timeout);
        if (rc < 0 && errno != EINTR) {
            BRAID_WARN("store: poll: %m");
            poll(NULL, 0, ACCEPT_PAUSE_MS);
            continue;
        }
        if (rc > 0 && s->pfds[0].revents && stop_at < 0) {
            char drain[16];
            ssize_t r = read(s->wake[0], drain, sizeof(drain));
            (void)r;
            /* A failed job's members are told why, even when the owner leaves at once. */
            int grace = s->failed[0] && s->drain_ms < FAILED_DRAIN_MS ? FAILED_DRAIN_MS : s->drain_ms;
            stop_at = braid__now_ms() + grace;
        }
        /* Only members are waited for: a stranger's connection is no reason
         * to keep the store. */
        if (stop_at >= 0 && (drained(s) || braid__now_ms() >= stop_at))
            break;
        for (size_t i = 2; rc > 0 && i < n; i++)
            if (s->pfds[i].revents)
                step_client(s, s->pclients[i], s->pfds[i].revents);
        if (rc > 0 && s->pfds[1].revents)
            accept_clients(s);
        expire_deadlines(s, braid__now_ms());
        sweep_dead(s);
    }
    return NULL;
}

braid_status braid__store_server_start(int listen_fd, const uint8_t secret[BRAID_SECRET_BYTES],
                                       braid_store_server **server)
{
    return braid__store_server_start_job(listen_fd, secret, NULL, server);
}

braid_status braid__store_server_start_job(int listen_fd, const uint8_t secret[BRAID_SECRET_BYTES],
                                           const braid_job_params *job, braid_store_server **server)
{
    braid_status st;
    braid_store_server *s = calloc(1, sizeof(*s));
    if (!s) {
        st = braid__error(BRAID_ERR_NO_MEMORY, "store: out of memory");
        goto err_close_listen;
    }
    s->listen_fd = listen_fd;
    memcpy(s->secret, secret, BRAID_SECRET_BYTES);
    if (job && job->size > 0) {
        s->job = *job;
        s->expect = job->size;
        braid__admit_size(&s->admit, job->size); /* every rank connects at once at init */
        s->told = calloc(job->size, 1);
        if (!s->told) {
            st = braid__error(BRAID_ERR_NO_MEMORY, "store: out of memory");
            goto err_free_server;
        }
    }
    s->nbuckets = INITIAL_BUCKETS;
    s->buckets = calloc(s->nbuckets, sizeof(*s->buckets));
    if (!s->buckets) {
        st = braid__error(BRAID_ERR_NO_MEMORY, "store: out of memory");
        goto err_free_server;
    }
    if (braid__sock_set_nonblock(listen_fd) != BRAID_OK) {
        st = BRAID_ERR_SYSTEM;
        goto err_free_buckets;
    }
    if (pipe2(s->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        st = braid__error(BRAID_ERR_SYSTEM, "store: pipe: %m");
        goto err_free_buckets;
    }
    int rc = pthread_create(&s->thread, NULL, server_main, s);
    if (rc != 0) {
        errno = rc;
        st = braid__error(BRAID_ERR_SYSTEM, "store: cannot start the server thread: %m");
        goto err_close_pipe;
    }
    *server = s;
    return BRAID_OK;

err_close_pipe:
    close(s->wake[0]);
    close(s->wake[1]);
err_free_buckets:
    free(s->buckets);
err_free_server:
    free(s->told);
    free(s);
err_close_listen:
    close(listen_fd);
    return st;
}

void braid__store_server_stop(braid_store_server *s)
{
    braid__store_server_stop_drained(s, 0);
}

void braid__store_server_stop_drained(braid_store_server *s, int grace_ms)
{
    if (!s)
        return;
    s->drain_ms = grace_ms > 0 ? grace_ms : 0; /* read by the thread after the wake-up below */
    ssize_t w;
    do {
        w = write(s->wake[1], "x", 1);
    } while (w < 0 && errno == EINTR);
    pthread_join(s->thread, NULL);
    for (client *c = s->clients, *next; c; c = next) {
        next = c->next;
        client_free(c);
    }
    kv_free(s);
    braid__admit_free(&s->admit);
    free(s->told);
    OPENSSL_cleanse(&s->job, sizeof(s->job));
    free(s->pfds);
    free(s->pclients);
    close(s->wake[0]);
    close(s->wake[1]);
    close(s->listen_fd);
    memset(s->secret, 0, sizeof(s->secret));
    free(s);
}
