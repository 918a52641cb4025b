/* Store server requests: the key-value table, and each client's request
 * state machine (header, body, parked GET, reply) over it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "log.h"
#include "status.h"
#include "store_server_int.h"

#define INITIAL_BUCKETS 64

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

int braid__store_kv_init(braid_store_server *s)
{
    s->nbuckets = INITIAL_BUCKETS;
    s->buckets = calloc(s->nbuckets, sizeof(*s->buckets));
    return s->buckets ? 0 : -1;
}

void braid__store_kv_free(braid_store_server *s)
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

/* Answer every GET parked on the key just written. */
static void wake_parked(braid_store_server *s, const entry *e)
{
    for (client *c = s->clients; c; c = c->next) {
        if (c->state == CL_PARKED && c->req.key_len == e->key_len && memcmp(c->body, e->key, e->key_len) == 0)
            braid__store_client_reply(c, BRAID_STORE_REPLY_OK, e->value, e->value_len);
    }
}

static void handle_request(braid_store_server *s, client *c)
{
    const uint8_t *key = c->body, *value = c->body + c->req.key_len;
    size_t key_len = c->req.key_len;
    if (s->failed[0]) {
        braid__store_mark_told(s, c->rank);
        braid__store_client_reply(c, BRAID_STORE_REPLY_FAILED, (const uint8_t *)s->failed, strlen(s->failed));
        return;
    }
    entry *e = kv_find(s, key, key_len);
    switch (c->req.op) {
    case BRAID_STORE_SET:
        if (kv_put(s, key, key_len, value, c->req.value_len) != 0) {
            braid__store_client_drop(c, BRAID_LOG_WARN, "out of memory for a value");
            return;
        }
        /* Waiters first: the reply frees the request (and key) once sent. */
        wake_parked(s, kv_find(s, key, key_len));
        braid__store_client_reply(c, BRAID_STORE_REPLY_OK, NULL, 0);
        return;
    case BRAID_STORE_GET:
        if (e) {
            braid__store_client_reply(c, BRAID_STORE_REPLY_OK, e->value, e->value_len);
        } else if (c->req.timeout_ms == 0) {
            braid__store_client_reply(c, BRAID_STORE_REPLY_TIMEOUT, NULL, 0);
        } else {
            c->state = CL_PARKED;
            c->deadline = c->req.timeout_ms == BRAID_STORE_WAIT_FOREVER ? -1 : braid__now_ms() + c->req.timeout_ms;
        }
        return;
    case BRAID_STORE_ADD: {
        if (e && e->value_len != 8) {
            braid__store_client_reply(c, BRAID_STORE_REPLY_BAD, NULL, 0);
            return;
        }
        /* Wrap-around addition, well defined on the unsigned value. */
        uint64_t sum = (uint64_t)(e ? braid__store_get_i64(e->value) : 0) + (uint64_t)braid__store_get_i64(value);
        uint8_t out[8];
        braid__store_put_i64(out, (int64_t)sum);
        if (kv_put(s, key, key_len, out, sizeof(out)) != 0) {
            braid__store_client_drop(c, BRAID_LOG_WARN, "out of memory for a value");
            return;
        }
        wake_parked(s, kv_find(s, key, key_len));
        braid__store_client_reply(c, BRAID_STORE_REPLY_OK, out, sizeof(out));
        return;
    }
    default:
        braid__store_client_drop(c, BRAID_LOG_WARN, "unknown op"); /* decode rules this out */
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
            /* A rank that is done closes between requests: not an error,
             * and not worded as one. */
            if (*pos == 0 && c->state == CL_HEADER && c->rank >= 0) {
                BRAID_INFO("store: rank %d (%s) is done with the store and left", c->rank, c->addr);
                c->state = CL_DEAD;
            } else {
                braid__store_client_drop(c, *pos == 0 && c->state == CL_HEADER ? BRAID_LOG_INFO : BRAID_LOG_WARN,
                                         "connection closed");
            }
            return -1;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            return 0;
        } else if (errno != EINTR) {
            char why[128];
            snprintf(why, sizeof(why), "recv: %s", strerror(errno));
            braid__store_client_drop(c, BRAID_LOG_WARN, why);
            return -1;
        }
    }
    return 1;
}

void braid__store_client_step(braid_store_server *s, client *c, short revents)
{
    int r;
    switch (c->state) {
    case CL_HANDSHAKE:
        braid__store_step_handshake(s, c);
        if (c->state != CL_HEADER)
            return;
        /* A request may already be queued behind the handshake. */
        /* fall through */
    case CL_HEADER:
        r = client_recv(c, c->hdr, &c->hdr_pos, sizeof(c->hdr));
        if (r <= 0)
            return;
        if (braid__store_req_decode(c->hdr, sizeof(c->hdr), &c->req) != BRAID_OK) {
            braid__store_client_drop(c, BRAID_LOG_WARN, braid_last_error());
            return;
        }
        c->body = malloc((size_t)c->req.key_len + c->req.value_len);
        if (!c->body) {
            braid__store_client_drop(c, BRAID_LOG_WARN, "out of memory for a request");
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
            braid__store_client_drop(c, BRAID_LOG_INFO, "closed while waiting for a key");
        else if (n > 0)
            braid__store_client_drop(c, BRAID_LOG_WARN, "sent data while waiting for a key");
        else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            braid__store_client_drop(c, BRAID_LOG_WARN, "error while waiting for a key");
        return;
    }
    case CL_REPLY:
        if (revents & (POLLERR | POLLHUP | POLLOUT))
            braid__store_client_flush(c);
        return;
    case CL_DELAY:
    case CL_DEAD:
        return;
    }
}

short braid__store_client_events(const client *c)
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
