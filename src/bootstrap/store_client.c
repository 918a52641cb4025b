/* Rendezvous store client: blocking requests with deadlines over one
 * authenticated connection. A failed transfer leaves the stream out of
 * step, so it marks the client broken and later calls fail fast. */
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "auth.h"
#include "log.h"
#include "sock.h"
#include "status.h"
#include "store.h"
#include "store_wire.h"

/* Extra time a GET waits for the server's own timeout answer. */
#define GET_REPLY_MARGIN_MS 5000
/* Pause before connecting again after the store dropped us, per attempt. */
#define DROPPED_RETRY_MS 20
/* Longest reason a FAILED reply may carry. */
#define FAILED_TEXT_MAX 1024

struct braid_store {
    int fd;
    int rank;
    int server_rank; /* whose store this must be: its proven hello says */
    int timeout_ms;
    int broken;
    char addr[BRAID_SOCK_ADDR_STR];
    char what[BRAID_SOCK_ADDR_STR + 48];
    pthread_mutex_t mu;
};

/* Authenticate over the connected fd and wrap it; closes fd on failure
 * (s->fd = -1) and leaves s to the caller. s->addr / s->what are set. */
static braid_status store_handshake(braid_store *s, const uint8_t secret[BRAID_SECRET_BYTES],
                                    const braid_job_params *job, int64_t deadline, braid_store **store)
{
    braid_status st;
    braid_hello self = {.role = BRAID_ROLE_STORE_CLIENT, .rank = s->rank, .target = s->server_rank}, peer;
    if (job)
        self.job = *job;
    uint32_t result;
    BRAID_CHECK_GOTO(
        braid__auth_initiate(s->fd, secret, &self, BRAID_ROLE_STORE_SERVER, deadline, s->what, &peer, &result), st,
        err_close);
    /* The hello is proven with the secret: a relay to another member's
     * store (which names that member) is caught here. */
    if (peer.rank != s->server_rank) {
        st = braid__error(BRAID_ERR_AUTH,
                          "%s: the store that answered proves to be rank %d's, not rank %d's: the connection is "
                          "relayed to another member's store",
                          s->what, peer.rank, s->server_rank);
        goto err_close;
    }
    char why[384], me[32];
    int bound;
    snprintf(me, sizeof(me), "rank %d (here)", s->rank);
    if (result == BRAID_AUTH_REJECT_PARAMS &&
        braid__job_params_diff(&self.job, me, &peer.job, "rank 0 (the store)", why, sizeof(why), &bound)) {
        st = braid__error(BRAID_ERR_MISMATCH, "%s: refused: %s", s->what, why);
        goto err_close;
    }
    if (result == BRAID_AUTH_REJECT_FORMED) {
        st = braid__error(BRAID_ERR_MISMATCH,
                          "%s: refused: every rank of that store's job (%u ranks) has joined it already: it is "
                          "another job's store, on this job's port; give each job its own port",
                          s->what, (unsigned)peer.job.size);
        goto err_close;
    }
    if (result == BRAID_AUTH_REJECT_TAKEN) {
        st = braid__error(BRAID_ERR_MISMATCH,
                          "%s: refused: another connected process holds rank %d there, and the store fails its "
                          "job: two processes were given one RANK, or two jobs share the port",
                          s->what, s->rank);
        goto err_close;
    }
    if (result == BRAID_AUTH_REJECT_RANK && job) {
        st = braid__error(BRAID_ERR_MISMATCH, "%s: refused: rank %d is out of range for its job of %u ranks",
                          s->what, s->rank, (unsigned)peer.job.size);
        goto err_close;
    }
    if (result != BRAID_AUTH_ACCEPTED) {
        st = braid__error(BRAID_ERR_AUTH, "%s: rejected: %s", s->what, braid__auth_result_string(result));
        goto err_close;
    }
    int rc = pthread_mutex_init(&s->mu, NULL);
    if (rc != 0) {
        st = braid__error(BRAID_ERR_SYSTEM, "%s: pthread_mutex_init failed (%d)", s->what, rc);
        goto err_close;
    }
    *store = s;
    return BRAID_OK;

err_close:
    close(s->fd);
    s->fd = -1;
    return st;
}

braid_status braid__store_connect(const char *host, int port, const uint8_t secret[BRAID_SECRET_BYTES], int rank,
                                  int timeout_ms, int hello_ms, braid_store **store)
{
    return braid__store_connect_job(host, port, secret, NULL, rank, timeout_ms, hello_ms, store);
}

braid_status braid__store_connect_job(const char *host, int port, const uint8_t secret[BRAID_SECRET_BYTES],
                                      const braid_job_params *job, int rank, int timeout_ms, int hello_ms,
                                      braid_store **store)
{
    braid_status st;
    braid_sockaddr addr;
    int64_t deadline = braid__now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    braid_store *s = calloc(1, sizeof(*s));
    if (!s)
        return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: out of memory for the store client", rank);
    s->fd = -1;
    s->rank = rank;
    s->timeout_ms = timeout_ms;
    BRAID_CHECK_GOTO(braid__sock_resolve(host, port, &addr), st, err_free);
    braid__sock_addr_format(&addr, s->addr, sizeof(s->addr));
    snprintf(s->what, sizeof(s->what), "rank %d: store at %s", rank, s->addr);
    /* A busy store (a flood of strangers' connections) may drop ours
     * before its hello is read: connect again while time is left. */
    for (int attempt = 1;; attempt++) {
        BRAID_CHECK_GOTO(braid__sock_connect(&addr, deadline, s->what, &s->fd), st, err_free);
        /* A braid store answers the handshake at once; whatever accepted the
         * connection and stays silent is not one (another program on the
         * port), and waiting out the whole timeout would hide that. */
        int64_t hello_deadline = deadline;
        if (hello_ms > 0 && braid__now_ms() + hello_ms < deadline)
            hello_deadline = braid__now_ms() + hello_ms;
        st = store_handshake(s, secret, job, hello_deadline, store);
        if (st == BRAID_OK)
            return st;
        if (st == BRAID_ERR_TIMEOUT && hello_deadline < deadline) {
            free(s);
            return braid__error_quiet(BRAID_ERR_PEER,
                                      "rank %d: the program at %s:%d accepted the connection but did not answer "
                                      "braid's store handshake within %d ms: not a braid store",
                                      rank, host, port, hello_ms);
        }
        int64_t pause = DROPPED_RETRY_MS * (attempt < 8 ? attempt : 8);
        if (st != BRAID_ERR_PEER || braid__now_ms() + pause >= deadline)
            goto err_free;
        BRAID_INFO("rank %d: the store at %s dropped the connection during the handshake (attempt %d: %s); "
                   "connecting again",
                   rank, s->addr, attempt, braid__error_detail());
        poll(NULL, 0, (int)pause);
    }

err_free:
    free(s);
    return st;
}

braid_status braid__store_attach(int fd, const char *addr, const uint8_t secret[BRAID_SECRET_BYTES], int rank,
                                 int server_rank, int timeout_ms, braid_store **store)
{
    braid_store *s = calloc(1, sizeof(*s));
    if (!s) {
        close(fd);
        return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: out of memory for the store client", rank);
    }
    s->fd = fd;
    s->rank = rank;
    s->server_rank = server_rank;
    s->timeout_ms = timeout_ms;
    snprintf(s->addr, sizeof(s->addr), "%s", addr);
    snprintf(s->what, sizeof(s->what), "rank %d: rank %d's store at %s", rank, server_rank, s->addr);
    braid_status st = store_handshake(s, secret, NULL, braid__now_ms() + (timeout_ms > 0 ? timeout_ms : 0), store);
    if (st != BRAID_OK)
        free(s);
    return st;
}

void braid__store_close(braid_store *s)
{
    if (!s)
        return;
    close(s->fd);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static int64_t io_deadline(const braid_store *s)
{
    return s->timeout_ms > 0 ? braid__now_ms() + s->timeout_ms : -1;
}

static braid_status check_key(const braid_store *s, const char *key, size_t *key_len)
{
    size_t n = key ? strlen(key) : 0;
    if (n < 1 || n > BRAID_STORE_KEY_MAX)
        return braid__error(BRAID_ERR_INVALID_ARG, "%s: key of %zu bytes (1 to %d allowed)", s->what, n,
                            BRAID_STORE_KEY_MAX);
    *key_len = n;
    return BRAID_OK;
}

/* One request/reply exchange; the reply value is left unread on the
 * socket for the caller. Caller holds mu. */
static braid_status exchange(braid_store *s, const braid_store_req *req, const char *key, const void *value,
                             int64_t reply_deadline, braid_store_reply *reply)
{
    uint8_t hdr[BRAID_STORE_REQ_BYTES], rh[BRAID_STORE_REPLY_BYTES];
    int64_t deadline = io_deadline(s);
    if (s->broken)
        return braid__error(BRAID_ERR_PEER, "%s: connection unusable after an earlier failure", s->what);
    braid__store_req_encode(req, hdr);
    braid_status st;
    BRAID_CHECK_GOTO(braid__sock_write_full(s->fd, hdr, sizeof(hdr), deadline, s->what), st, err_broken);
    BRAID_CHECK_GOTO(braid__sock_write_full(s->fd, key, req->key_len, deadline, s->what), st, err_broken);
    if (req->value_len)
        BRAID_CHECK_GOTO(braid__sock_write_full(s->fd, value, req->value_len, deadline, s->what), st, err_broken);
    BRAID_CHECK_GOTO(braid__sock_read_full(s->fd, rh, sizeof(rh), reply_deadline, s->what), st, err_broken);
    if (braid__store_reply_decode(rh, sizeof(rh), reply) != BRAID_OK) {
        char why[256];
        snprintf(why, sizeof(why), "%s", braid_last_error());
        st = braid__error(BRAID_ERR_PEER, "%s: %s", s->what, why);
        goto err_broken;
    }
    if (reply->code == BRAID_STORE_REPLY_FAILED) {
        char why[FAILED_TEXT_MAX + 1];
        size_t n = reply->value_len;
        if (n > FAILED_TEXT_MAX) {
            st = braid__error(BRAID_ERR_PEER, "%s: failure text of %zu bytes", s->what, n);
            goto err_broken;
        }
        BRAID_CHECK_GOTO(braid__sock_read_full(s->fd, why, n, deadline, s->what), st, err_broken);
        why[n] = '\0';
        for (size_t i = 0; i < n; i++)
            if ((unsigned char)why[i] < 0x20 || (unsigned char)why[i] >= 0x7f)
                why[i] = '?';
        st = braid__error(BRAID_ERR_MISMATCH, "%s: the job cannot start: %s", s->what, why);
        goto err_broken;
    }
    return BRAID_OK;

err_broken:
    s->broken = 1;
    return st;
}

braid_status braid__store_set(braid_store *s, const char *key, const void *value, size_t len)
{
    size_t key_len = 0;
    BRAID_CHECK(check_key(s, key, &key_len));
    if (len > BRAID_STORE_VALUE_MAX || (len && !value))
        return braid__error(BRAID_ERR_INVALID_ARG, "%s: value of %zu bytes for key '%s' (at most %d allowed)", s->what,
                            len, key, BRAID_STORE_VALUE_MAX);
    braid_store_req req = {.op = BRAID_STORE_SET, .key_len = (uint32_t)key_len, .value_len = (uint32_t)len};
    braid_store_reply reply;
    pthread_mutex_lock(&s->mu);
    braid_status st = exchange(s, &req, key, value, io_deadline(s), &reply);
    if (st == BRAID_OK && (reply.code != BRAID_STORE_REPLY_OK || reply.value_len != 0)) {
        s->broken = 1;
        st = braid__error(BRAID_ERR_PEER, "%s: unexpected reply to SET '%s'", s->what, key);
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

braid_status braid__store_get(braid_store *s, const char *key, void *value, size_t cap, size_t *len, int timeout_ms)
{
    size_t key_len = 0;
    BRAID_CHECK(check_key(s, key, &key_len));
    uint32_t wire_timeout = timeout_ms < 0 ? BRAID_STORE_WAIT_FOREVER : (uint32_t)timeout_ms;
    braid_store_req req = {.op = BRAID_STORE_GET, .key_len = (uint32_t)key_len, .timeout_ms = wire_timeout};
    int64_t reply_deadline = timeout_ms < 0 ? -1 : braid__now_ms() + timeout_ms + GET_REPLY_MARGIN_MS;
    braid_store_reply reply;
    braid_status st;
    pthread_mutex_lock(&s->mu);
    BRAID_CHECK_GOTO(exchange(s, &req, key, NULL, reply_deadline, &reply), st, out_unlock);
    if (reply.code == BRAID_STORE_REPLY_TIMEOUT) {
        st = braid__error(BRAID_ERR_TIMEOUT, "%s: key '%s' did not appear within %d ms", s->what, key, timeout_ms);
        goto out_unlock;
    }
    if (reply.code != BRAID_STORE_REPLY_OK) {
        s->broken = 1;
        st = braid__error(BRAID_ERR_PEER, "%s: unexpected reply code %u to GET '%s'", s->what, reply.code, key);
        goto out_unlock;
    }
    if (reply.value_len > cap) {
        /* Drain the value so the stream stays in step. */
        uint8_t sink[4096];
        for (size_t left = reply.value_len; left > 0;) {
            size_t n = left < sizeof(sink) ? left : sizeof(sink);
            BRAID_CHECK_GOTO(braid__sock_read_full(s->fd, sink, n, io_deadline(s), s->what), st, out_broken);
            left -= n;
        }
        st = braid__error(BRAID_ERR_INVALID_ARG, "%s: value of key '%s' is %u bytes, the buffer holds %zu", s->what,
                          key, reply.value_len, cap);
        goto out_unlock;
    }
    BRAID_CHECK_GOTO(braid__sock_read_full(s->fd, value, reply.value_len, io_deadline(s), s->what), st, out_broken);
    *len = reply.value_len;
    st = BRAID_OK;
    goto out_unlock;

out_broken:
    s->broken = 1;
out_unlock:
    pthread_mutex_unlock(&s->mu);
    return st;
}

braid_status braid__store_add(braid_store *s, const char *key, int64_t delta, int64_t *result)
{
    size_t key_len = 0;
    BRAID_CHECK(check_key(s, key, &key_len));
    uint8_t operand[8], sum[8];
    braid__store_put_i64(operand, delta);
    braid_store_req req = {.op = BRAID_STORE_ADD, .key_len = (uint32_t)key_len, .value_len = 8};
    braid_store_reply reply;
    braid_status st;
    pthread_mutex_lock(&s->mu);
    BRAID_CHECK_GOTO(exchange(s, &req, key, operand, io_deadline(s), &reply), st, out_unlock);
    if (reply.code == BRAID_STORE_REPLY_BAD && reply.value_len == 0) {
        st = braid__error(BRAID_ERR_INVALID_ARG, "%s: ADD on key '%s', which does not hold an integer", s->what, key);
        goto out_unlock;
    }
    if (reply.code != BRAID_STORE_REPLY_OK || reply.value_len != 8) {
        s->broken = 1;
        st = braid__error(BRAID_ERR_PEER, "%s: unexpected reply to ADD '%s'", s->what, key);
        goto out_unlock;
    }
    st = braid__sock_read_full(s->fd, sum, sizeof(sum), io_deadline(s), s->what);
    if (st != BRAID_OK) {
        s->broken = 1;
        goto out_unlock;
    }
    *result = braid__store_get_i64(sum);

out_unlock:
    pthread_mutex_unlock(&s->mu);
    return st;
}

braid_status braid__store_local_ip(braid_store *s, char *ip, size_t cap)
{
    braid_sockaddr a;
    BRAID_CHECK(braid__sock_local_addr(s->fd, &a));
    return braid__sock_addr_host(&a, ip, cap);
}
