/* Job-secret handshake: messages, proofs and the two sides of the exchange
 * (see auth.h for the protocol). */
#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "auth.h"
#include "sock.h"
#include "status.h"
#include "bytes.h"

/* Domain separation: a braid proof is never valid for anything else keyed
 * by the same secret. */
#define MAC_LABEL "braid-auth-v1"
#define MAC_LABEL_LEN (sizeof(MAC_LABEL) - 1)
/* Same length as MAC_LABEL: a claim is never a proof, nor the reverse. */
#define CLAIM_LABEL "braid-claim-1"
_Static_assert(sizeof(CLAIM_LABEL) == sizeof(MAC_LABEL), "labels of one length");

braid_status braid__random_bytes(void *buf, size_t len)
{
    if (len > (size_t)0x7fffffff || RAND_bytes(buf, (int)len) != 1)
        return braid__error(BRAID_ERR_SYSTEM, "no randomness: RAND_bytes failed for %zu bytes", len);
    return BRAID_OK;
}

void braid__hello_encode(const braid_hello *h, uint8_t out[BRAID_HELLO_BYTES])
{
    memcpy(out, BRAID_HELLO_MAGIC, 4);
    braid__put_be16(out + 4, h->version);
    out[6] = h->role;
    out[7] = h->flags;
    braid__put_be32(out + 8, (uint32_t)h->rank);
    braid__put_be32(out + 12, (uint32_t)h->target);
    braid__put_be64(out + 16, h->pg_tag);
    memcpy(out + 24, h->nonce, BRAID_NONCE_BYTES);
    braid__put_be16(out + 40, h->sock_index);
    braid__put_be16(out + 42, h->nsocks);
    braid__put_be32(out + 44, h->job.size);
    out[48] = h->job.source;
    out[49] = h->job.checksum;
    braid__put_be16(out + 50, 0);
    braid__put_be32(out + 52, h->job.secret_id);
    /* Longer launcher ids are cut: the field names the job in messages,
     * the secret binds the whole id. */
    size_t n = strnlen(h->job.job_id, BRAID_JOB_ID_BYTES);
    memset(out + 56, 0, BRAID_JOB_ID_BYTES);
    memcpy(out + 56, h->job.job_id, n);
}

/* The job id field: printable ASCII, then only NULs. */
static int job_id_valid(const uint8_t *p)
{
    size_t i = 0;
    while (i < BRAID_JOB_ID_BYTES && p[i] >= 0x20 && p[i] < 0x7f)
        i++;
    for (; i < BRAID_JOB_ID_BYTES; i++)
        if (p[i] != 0)
            return 0;
    return 1;
}

braid_status braid__hello_decode(const uint8_t *buf, size_t len, braid_hello *h)
{
    if (!buf || len != BRAID_HELLO_BYTES)
        return braid__error_quiet(BRAID_ERR_AUTH, "hello of %zu bytes, expected %d", buf ? len : 0, BRAID_HELLO_BYTES);
    if (memcmp(buf, BRAID_HELLO_MAGIC, 4) != 0)
        return braid__error_quiet(BRAID_ERR_AUTH, "not a braid hello (bad magic %02x%02x%02x%02x)", buf[0], buf[1],
                                  buf[2], buf[3]);
    braid_hello t;
    t.version = braid__get_be16(buf + 4);
    t.role = buf[6];
    t.flags = buf[7];
    t.rank = (int32_t)braid__get_be32(buf + 8);
    t.target = (int32_t)braid__get_be32(buf + 12);
    t.pg_tag = braid__get_be64(buf + 16);
    memcpy(t.nonce, buf + 24, BRAID_NONCE_BYTES);
    t.sock_index = braid__get_be16(buf + 40);
    t.nsocks = braid__get_be16(buf + 42);
    t.job.size = braid__get_be32(buf + 44);
    t.job.source = buf[48];
    t.job.checksum = buf[49];
    t.job.secret_id = braid__get_be32(buf + 52);
    t.job.has_claim_key = 0;
    memset(t.job.claim_key, 0, sizeof(t.job.claim_key));
    memcpy(t.job.job_id, buf + 56, BRAID_JOB_ID_BYTES);
    t.job.job_id[BRAID_JOB_ID_BYTES] = '\0';
    if (t.version != BRAID_WIRE_VERSION)
        return braid__error_quiet(BRAID_ERR_AUTH, "wire version %u, this build speaks %d", t.version,
                                  BRAID_WIRE_VERSION);
    if (t.role < 1 || t.role > BRAID_ROLE_MAX)
        return braid__error_quiet(BRAID_ERR_AUTH, "unknown role %u in hello", t.role);
    if (buf[7] & ~BRAID_HELLO_FLAGS_KNOWN)
        return braid__error_quiet(BRAID_ERR_AUTH, "unknown flags 0x%02x in hello", buf[7]);
    if (t.rank < 0 || t.target < -1)
        return braid__error_quiet(BRAID_ERR_AUTH, "rank %d / target %d out of range in hello", t.rank, t.target);
    if (t.job.size > 0x7fffffffu || t.job.source > BRAID_SECRET_MAX || t.job.checksum > 1 || braid__get_be16(buf + 50) != 0 ||
        !job_id_valid(buf + 56))
        return braid__error_quiet(BRAID_ERR_AUTH, "job parameters out of range in hello");
    *h = t;
    return BRAID_OK;
}

static braid_status labeled_mac(const char *label, const uint8_t secret[BRAID_SECRET_BYTES], uint8_t role,
                                const uint8_t hello_i[BRAID_HELLO_BYTES], const uint8_t hello_a[BRAID_HELLO_BYTES],
                                uint8_t out[BRAID_MAC_BYTES])
{
    uint8_t msg[MAC_LABEL_LEN + 1 + 2 * BRAID_HELLO_BYTES];
    memcpy(msg, label, MAC_LABEL_LEN);
    msg[MAC_LABEL_LEN] = role;
    memcpy(msg + MAC_LABEL_LEN + 1, hello_i, BRAID_HELLO_BYTES);
    memcpy(msg + MAC_LABEL_LEN + 1 + BRAID_HELLO_BYTES, hello_a, BRAID_HELLO_BYTES);
    unsigned int len = 0;
    if (!HMAC(EVP_sha256(), secret, BRAID_SECRET_BYTES, msg, sizeof(msg), out, &len) || len != BRAID_MAC_BYTES)
        return braid__error(BRAID_ERR_SYSTEM, "HMAC-SHA256 failed in libcrypto");
    return BRAID_OK;
}

braid_status braid__auth_mac(const uint8_t secret[BRAID_SECRET_BYTES], uint8_t role,
                             const uint8_t hello_i[BRAID_HELLO_BYTES], const uint8_t hello_a[BRAID_HELLO_BYTES],
                             uint8_t out[BRAID_MAC_BYTES])
{
    return labeled_mac(MAC_LABEL, secret, role, hello_i, hello_a, out);
}

braid_status braid__auth_claim(const uint8_t claim_key[BRAID_SECRET_BYTES], uint8_t role,
                               const uint8_t hello_i[BRAID_HELLO_BYTES], const uint8_t hello_a[BRAID_HELLO_BYTES],
                               uint8_t out[BRAID_MAC_BYTES])
{
    return labeled_mac(CLAIM_LABEL, claim_key, role, hello_i, hello_a, out);
}

braid_status braid__auth_mac_check(const uint8_t secret[BRAID_SECRET_BYTES], uint8_t role,
                                   const uint8_t hello_i[BRAID_HELLO_BYTES], const uint8_t hello_a[BRAID_HELLO_BYTES],
                                   const uint8_t mac[BRAID_MAC_BYTES])
{
    uint8_t want[BRAID_MAC_BYTES];
    BRAID_CHECK(braid__auth_mac(secret, role, hello_i, hello_a, want));
    int diff = CRYPTO_memcmp(want, mac, BRAID_MAC_BYTES);
    OPENSSL_cleanse(want, sizeof(want));
    if (diff != 0)
        return braid__error_quiet(BRAID_ERR_AUTH, "wrong authentication proof (a different job secret?)");
    return BRAID_OK;
}

void braid__auth_result_encode(uint32_t result, uint8_t out[BRAID_RESULT_BYTES])
{
    braid__put_be32(out, result);
}

braid_status braid__auth_result_decode(const uint8_t *buf, size_t len, uint32_t *result)
{
    if (!buf || len != BRAID_RESULT_BYTES)
        return braid__error_quiet(BRAID_ERR_AUTH, "handshake result of %zu bytes, expected %d", buf ? len : 0,
                                  BRAID_RESULT_BYTES);
    uint32_t r = braid__get_be32(buf);
    if (r > BRAID_AUTH_REJECT_MAX)
        return braid__error_quiet(BRAID_ERR_AUTH, "unknown handshake result %u", r);
    *result = r;
    return BRAID_OK;
}

const char *braid__auth_result_string(uint32_t result)
{
    switch (result) {
    case BRAID_AUTH_ACCEPTED:
        return "accepted";
    case BRAID_AUTH_REJECT_DUPLICATE:
        return "duplicate connection";
    case BRAID_AUTH_REJECT_GROUP:
        return "different process group (pg_tag)";
    case BRAID_AUTH_REJECT_RANK:
        return "rank out of range or wrong target rank";
    case BRAID_AUTH_REJECT_SOCKETS:
        return "invalid or inconsistent socket index/count";
    case BRAID_AUTH_REJECT_PARAMS:
        return "job parameters differ";
    case BRAID_AUTH_REJECT_FORMED:
        return "the store's job has all its ranks already";
    case BRAID_AUTH_REJECT_TAKEN:
        return "another connected process holds that rank";
    default:
        return "unknown verdict";
    }
}

uint32_t braid__secret_id(const uint8_t secret[BRAID_SECRET_BYTES])
{
    static const char label[] = "braid-secret-id-v1";
    uint8_t msg[sizeof(label) + BRAID_SECRET_BYTES], d[32];
    memcpy(msg, label, sizeof(label));
    memcpy(msg + sizeof(label), secret, BRAID_SECRET_BYTES);
    unsigned int len = 0;
    if (!EVP_Digest(msg, sizeof(msg), d, &len, EVP_sha256(), NULL))
        return 0;
    uint32_t id = braid__get_be32(d);
    OPENSSL_cleanse(msg, sizeof(msg));
    return id ? id : 1; /* 0 would read as "unstated" in messages */
}

static const char *source_name(unsigned source)
{
    static const char *const names[] = {"unstated", "unique id", "BRAID_JOB_SECRET", "key file",
                                        "public launch variables"};
    return source <= BRAID_SECRET_MAX ? names[source] : "?";
}

int braid__job_params_diff(const braid_job_params *a, const char *a_name, const braid_job_params *b,
                           const char *b_name, char *why, size_t cap, int *secret_bound)
{
    *secret_bound = 0;
    if (a->size == 0 || b->size == 0)
        return 0;
    /* The secret-bound ones first: when they differ, so do the proofs. */
    if (a->source != b->source) {
        *secret_bound = 1;
        snprintf(why, cap, "job secret source differs: %s at %s, %s at %s", source_name(a->source), a_name,
                 source_name(b->source), b_name);
    } else if (strcmp(a->job_id, b->job_id) != 0) {
        *secret_bound = 1;
        snprintf(why, cap, "launcher job id differs: '%s' at %s, '%s' at %s (another job?)", a->job_id, a_name,
                 b->job_id, b_name);
    } else if (a->secret_id && b->secret_id && a->secret_id != b->secret_id) { /* 0: not shown */
        *secret_bound = 1;
        snprintf(why, cap, "job secret differs (id %08x at %s, %08x at %s): %s", (unsigned)a->secret_id, a_name,
                 (unsigned)b->secret_id, b_name,
                 a->source == BRAID_SECRET_ENV         ? "BRAID_JOB_SECRET differs"
                 : a->source == BRAID_SECRET_UNIQUE_ID ? "the ranks got different unique ids"
                 : a->source == BRAID_SECRET_KEY_FILE  ? "the hosts do not share the key file (BRAID_KEY_FILE)"
                                                       : "MASTER_ADDR or the port differs");
    } else if (a->size != b->size) {
        snprintf(why, cap, "WORLD_SIZE differs: %u at %s, %u at %s", (unsigned)a->size, a_name, (unsigned)b->size,
                 b_name);
    } else if (a->checksum != b->checksum) {
        snprintf(why, cap, "BRAID_CHECKSUM differs: %s at %s, %s at %s", a->checksum ? "on" : "off", a_name,
                 b->checksum ? "on" : "off", b_name);
    } else {
        return 0;
    }
    return 1;
}

/* The likely cause of a refused proof, by where our secret came from. */
static const char *secret_hint(unsigned source)
{
    switch (source) {
    case BRAID_SECRET_ENV: return "BRAID_JOB_SECRET differs from the job's, or the port is another job's";
    case BRAID_SECRET_KEY_FILE:
        return "the hosts do not share the key file (BRAID_KEY_FILE), or the port is another job's";
    case BRAID_SECRET_UNIQUE_ID: return "the ranks got different unique ids, or the port is another job's";
    case BRAID_SECRET_PUBLIC: return "MASTER_ADDR or the port differs, or the port is another job's";
    default: return "another job, or a different unique id / BRAID_JOB_SECRET / key file?";
    }
}

static const char *role_name(unsigned role)
{
    static const char *const names[] = {"?", "store client", "store server", "tcp connector", "tcp acceptor"};
    return role <= BRAID_ROLE_MAX ? names[role] : "?";
}

/* ---- initiator ------------------------------------------------------------ */

braid_status braid__auth_initiate(int fd, const uint8_t secret[BRAID_SECRET_BYTES], braid_hello *self,
                                  uint8_t peer_role, int64_t deadline_ms, const char *what, braid_hello *peer,
                                  uint32_t *result)
{
    uint8_t raw_i[BRAID_HELLO_BYTES], raw_a[BRAID_HELLO_BYTES], mac[BRAID_MAC_BYTES];
    uint8_t in[BRAID_MAC_BYTES + BRAID_RESULT_BYTES];
    char reason[256];
    braid_hello h;

    self->version = BRAID_WIRE_VERSION;
    /* With a key file, a claim follows the proof: only the acceptor can
     * see that the secrets differ (its hello does not show its id). */
    int claim_follows = self->job.size > 0 && self->job.has_claim_key;
    self->flags = claim_follows ? BRAID_HELLO_FLAG_CLAIM : 0;
    BRAID_CHECK(braid__random_bytes(self->nonce, sizeof(self->nonce)));
    braid__hello_encode(self, raw_i);
    BRAID_CHECK(braid__sock_write_full(fd, raw_i, sizeof(raw_i), deadline_ms, what));
    BRAID_CHECK(braid__sock_read_full(fd, raw_a, sizeof(raw_a), deadline_ms, what));
    if (braid__hello_decode(raw_a, BRAID_HELLO_BYTES, &h) != BRAID_OK) {
        snprintf(reason, sizeof(reason), "%s", braid_last_error());
        return braid__error(BRAID_ERR_AUTH, "%s: not a braid peer, dropped: %s", what, reason);
    }
    if (h.role != peer_role)
        return braid__error(BRAID_ERR_AUTH, "%s: peer answered as a %s, expected a %s", what, role_name(h.role),
                            role_name(peer_role));
    /* Unproven, but a peer with another secret could refuse us anyway: a
     * parameter the secret derives from that differs ends it here, named.
     * The others are checked by the acceptor once we have proven the secret,
     * so every member hears of them. */
    int bound;
    char me[32], them[32];
    snprintf(me, sizeof(me), "rank %d (here)", self->rank);
    snprintf(them, sizeof(them), "rank %d", h.rank);
    if (braid__job_params_diff(&self->job, me, &h.job, them, reason, sizeof(reason), &bound) && bound) {
        /* Tell the acceptor why, in a form it can verify (a claim under
         * the key file's key), so the rest of the job stops too. Best
         * effort: our own error is the same either way. */
        uint8_t claim[2 * BRAID_MAC_BYTES] = {0}; /* no proof we could make, then the claim (hello flag CLAIM) */
        if (claim_follows &&
            braid__auth_claim(self->job.claim_key, self->role, raw_i, raw_a, claim + BRAID_MAC_BYTES) == BRAID_OK)
            (void)braid__sock_write_full(fd, claim, sizeof(claim), deadline_ms, what);
        return braid__error(BRAID_ERR_MISMATCH, "%s: %s", what, reason);
    }
    uint8_t out[2 * BRAID_MAC_BYTES];
    BRAID_CHECK(braid__auth_mac(secret, self->role, raw_i, raw_a, out));
    if (claim_follows)
        BRAID_CHECK(braid__auth_claim(self->job.claim_key, self->role, raw_i, raw_a, out + BRAID_MAC_BYTES));
    braid_status st = braid__sock_write_full(fd, out, claim_follows ? sizeof(out) : BRAID_MAC_BYTES, deadline_ms, what);
    OPENSSL_cleanse(out, sizeof(out));
    if (st != BRAID_OK)
        return st;
    st = braid__sock_read_full(fd, in, sizeof(in), deadline_ms, what);
    if (st == BRAID_ERR_PEER)
        return braid__error(BRAID_ERR_AUTH,
                            "%s: peer closed the connection after our proof: it did not accept our proof of the job "
                            "secret (%s)",
                            what, secret_hint(self->job.source));
    if (st != BRAID_OK)
        return st;
    if (braid__auth_mac_check(secret, peer_role, raw_i, raw_a, in) != BRAID_OK && claim_follows &&
        braid__auth_claim(self->job.claim_key, peer_role, raw_i, raw_a, mac) == BRAID_OK &&
        CRYPTO_memcmp(mac, in, BRAID_MAC_BYTES) == 0) {
        /* The acceptor took our claim, not our proof: it is one of ours
         * with another secret, and says which. */
        h.job.secret_id = braid__get_be32(in + BRAID_MAC_BYTES);
        if (braid__job_params_diff(&self->job, me, &h.job, them, reason, sizeof(reason), &bound) && bound)
            return braid__error(BRAID_ERR_MISMATCH, "%s: %s", what, reason);
        return braid__error(BRAID_ERR_MISMATCH, "%s: the job secret differs from %s's", what, them);
    }
    if (braid__auth_mac_check(secret, peer_role, raw_i, raw_a, in) != BRAID_OK)
        return braid__error(BRAID_ERR_AUTH,
                            "%s: peer failed authentication: wrong proof of the job secret "
                            "(another job, or a different unique id / BRAID_JOB_SECRET / key file?)",
                            what);
    uint32_t r;
    if (braid__auth_result_decode(in + BRAID_MAC_BYTES, BRAID_RESULT_BYTES, &r) != BRAID_OK) {
        snprintf(reason, sizeof(reason), "%s", braid_last_error());
        return braid__error(BRAID_ERR_AUTH, "%s: %s", what, reason);
    }
    *peer = h;
    *result = r;
    return BRAID_OK;
}

/* ---- acceptor ---------------------------------------------------------------- */

braid_status braid__auth_accept_init(braid_auth_accept *hs, const uint8_t secret[BRAID_SECRET_BYTES],
                                     const braid_hello *self, uint8_t peer_role)
{
    braid_hello me = *self;
    memset(hs, 0, sizeof(*hs));
    me.version = BRAID_WIRE_VERSION;
    BRAID_CHECK(braid__random_bytes(me.nonce, sizeof(me.nonce)));
    braid__hello_encode(&me, hs->raw_a);
    memcpy(hs->secret, secret, BRAID_SECRET_BYTES);
    hs->state = BRAID_AUTH_RECV_HELLO;
    hs->peer_role = peer_role;
    hs->self_role = me.role;
    hs->len = BRAID_HELLO_BYTES;
    return BRAID_OK;
}

short braid__auth_accept_events(const braid_auth_accept *hs)
{
    switch (hs->state) {
    case BRAID_AUTH_RECV_HELLO:
    case BRAID_AUTH_RECV_MAC:
        return POLLIN;
    case BRAID_AUTH_SEND_HELLO:
    case BRAID_AUTH_SEND_RESULT:
        return POLLOUT;
    default:
        return 0;
    }
}

void braid__auth_accept_finish(braid_auth_accept *hs, uint32_t result)
{
    if (hs->state != BRAID_AUTH_VERIFIED)
        return;
    hs->result = result;
    /* Our own proof only now, to an initiator that has proven the secret. */
    if (braid__auth_mac(hs->secret, hs->self_role, hs->raw_i, hs->raw_a, hs->buf) != BRAID_OK)
        hs->mac_failed = 1; /* reported by the next step */
    braid__auth_result_encode(result, hs->buf + BRAID_MAC_BYTES);
    hs->pos = 0;
    hs->len = BRAID_MAC_BYTES + BRAID_RESULT_BYTES;
    hs->state = BRAID_AUTH_SEND_RESULT;
}

int braid__auth_claim_valid(const braid_auth_accept *hs, const uint8_t claim_key[BRAID_SECRET_BYTES])
{
    uint8_t want[BRAID_MAC_BYTES];
    if (!hs->bad_proof || braid__auth_claim(claim_key, hs->peer_role, hs->raw_i, hs->raw_a, want) != BRAID_OK)
        return 0;
    size_t at = hs->peer.flags & BRAID_HELLO_FLAG_CLAIM ? BRAID_MAC_BYTES : 0;
    int same = CRYPTO_memcmp(want, hs->buf + at, BRAID_MAC_BYTES) == 0;
    OPENSSL_cleanse(want, sizeof(want));
    return same;
}

int braid__auth_accept_answer_claim(braid_auth_accept *hs, const uint8_t claim_key[BRAID_SECRET_BYTES],
                                    uint32_t secret_id)
{
    if (!hs->bad_proof || !(hs->peer.flags & BRAID_HELLO_FLAG_CLAIM))
        return 0;
    if (braid__auth_claim(claim_key, hs->self_role, hs->raw_i, hs->raw_a, hs->buf) != BRAID_OK)
        hs->mac_failed = 1; /* reported by the next step */
    braid__put_be32(hs->buf + BRAID_MAC_BYTES, secret_id);
    hs->result = BRAID_AUTH_REJECT_PARAMS;
    hs->pos = 0;
    hs->len = BRAID_MAC_BYTES + BRAID_RESULT_BYTES;
    hs->state = BRAID_AUTH_SEND_RESULT;
    return 1;
}

void braid__auth_accept_clear(braid_auth_accept *hs)
{
    OPENSSL_cleanse(hs->secret, sizeof(hs->secret));
}

/* Receive into buf[pos..len): 1 when complete, 0 when it would block. */
static braid_status recv_some(braid_auth_accept *hs, int fd, int *complete)
{
    while (hs->pos < hs->len) {
        ssize_t n = recv(fd, hs->buf + hs->pos, hs->len - hs->pos, 0);
        if (n > 0) {
            hs->pos += (size_t)n;
            hs->bytes_in += (size_t)n;
        } else if (n == 0) {
            return braid__error_quiet(BRAID_ERR_PEER, "closed the connection during the handshake after %zu bytes",
                                      hs->bytes_in);
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            *complete = 0;
            return BRAID_OK;
        } else if (errno != EINTR) {
            return braid__error_quiet(braid__sock_errno_status(errno), "recv during the handshake: %m");
        }
    }
    *complete = 1;
    return BRAID_OK;
}

static braid_status send_some(braid_auth_accept *hs, int fd, int *complete)
{
    while (hs->pos < hs->len) {
        ssize_t n = send(fd, hs->buf + hs->pos, hs->len - hs->pos, MSG_NOSIGNAL);
        if (n >= 0) {
            hs->pos += (size_t)n;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            *complete = 0;
            return BRAID_OK;
        } else if (errno != EINTR) {
            return braid__error_quiet(braid__sock_errno_status(errno), "send during the handshake: %m");
        }
    }
    *complete = 1;
    return BRAID_OK;
}

braid_status braid__auth_accept_step(braid_auth_accept *hs, int fd)
{
    int complete;
    for (;;) {
        switch (hs->state) {
        case BRAID_AUTH_RECV_HELLO:
            BRAID_CHECK(recv_some(hs, fd, &complete));
            if (!complete)
                return BRAID_OK;
            memcpy(hs->raw_i, hs->buf, BRAID_HELLO_BYTES);
            BRAID_CHECK(braid__hello_decode(hs->raw_i, BRAID_HELLO_BYTES, &hs->peer));
            if (hs->peer.role != hs->peer_role)
                return braid__error_quiet(BRAID_ERR_AUTH, "hello from a %s, expected a %s", role_name(hs->peer.role),
                                          role_name(hs->peer_role));
            memcpy(hs->buf, hs->raw_a, BRAID_HELLO_BYTES);
            hs->pos = 0;
            hs->len = BRAID_HELLO_BYTES;
            hs->state = BRAID_AUTH_SEND_HELLO;
            break;
        case BRAID_AUTH_SEND_HELLO:
            BRAID_CHECK(send_some(hs, fd, &complete));
            if (!complete)
                return BRAID_OK;
            hs->pos = 0;
            hs->len = hs->peer.flags & BRAID_HELLO_FLAG_CLAIM ? 2 * BRAID_MAC_BYTES : BRAID_MAC_BYTES;
            hs->state = BRAID_AUTH_RECV_MAC;
            break;
        case BRAID_AUTH_RECV_MAC:
            BRAID_CHECK(recv_some(hs, fd, &complete));
            if (!complete)
                return BRAID_OK;
            if (braid__auth_mac_check(hs->secret, hs->peer_role, hs->raw_i, hs->raw_a, hs->buf) != BRAID_OK) {
                hs->bad_proof = 1;
                return braid__error_quiet(BRAID_ERR_AUTH,
                                          "failed authentication: wrong proof of the job secret "
                                          "(rank %d of another job, or a different secret?)",
                                          hs->peer.rank);
            }
            hs->state = BRAID_AUTH_VERIFIED;
            return BRAID_OK;
        case BRAID_AUTH_SEND_RESULT:
            if (hs->mac_failed)
                return braid__error_quiet(BRAID_ERR_SYSTEM, "HMAC-SHA256 failed in libcrypto");
            BRAID_CHECK(send_some(hs, fd, &complete));
            if (!complete)
                return BRAID_OK;
            hs->state = BRAID_AUTH_DONE;
            return BRAID_OK;
        case BRAID_AUTH_VERIFIED:
        case BRAID_AUTH_DONE:
        default:
            return BRAID_OK;
        }
    }
}
