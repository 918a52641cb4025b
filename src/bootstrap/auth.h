/* Job-secret handshake: every braid connection (store or transport) starts
 * with a mutual challenge-response over HMAC-SHA256 keyed by the job
 * secret, so strays, stale jobs and garbage are dropped before any request
 * or data is trusted.
 *
 *   initiator -> acceptor   hello_i                       (BRAID_HELLO_BYTES)
 *   acceptor  -> initiator  hello_a, mac_a                (+ BRAID_MAC_BYTES)
 *   initiator -> acceptor   mac_i
 *   acceptor  -> initiator  result                        (BRAID_RESULT_BYTES)
 *
 * mac_x = HMAC(secret, label | role of x | hello_i | hello_a): each side
 * proves the secret over both fresh nonces, bound to its own role, so a
 * reply can neither be replayed nor reflected. The initiator checks mac_a
 * before it reveals mac_i. The result tells an authenticated initiator
 * whether the acceptor kept it (a duplicate, a wrong group tag...).
 *
 * Message encode/decode are pure functions over byte buffers, with every
 * length and range checked, so fuzz targets can drive them directly. */
#ifndef BRAID_AUTH_H
#define BRAID_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include "braid.h"
#include "braid_transport.h"

#define BRAID_HELLO_MAGIC "BRD1"
#define BRAID_HELLO_BYTES 44
#define BRAID_MAC_BYTES 32
#define BRAID_NONCE_BYTES 16
#define BRAID_RESULT_BYTES 4

/* Who sends a hello. A connection pairs an initiator with its acceptor. */
typedef enum {
    BRAID_ROLE_STORE_CLIENT = 1, /* initiator */
    BRAID_ROLE_STORE_SERVER = 2,
    BRAID_ROLE_TCP_CONNECT = 3, /* initiator */
    BRAID_ROLE_TCP_ACCEPT = 4,
    BRAID_ROLE_MAX = BRAID_ROLE_TCP_ACCEPT
} braid_role;

/* Acceptor's verdict on an authenticated initiator. */
typedef enum {
    BRAID_AUTH_ACCEPTED = 0,
    BRAID_AUTH_REJECT_DUPLICATE = 1, /* that (rank, socket) is already connected */
    BRAID_AUTH_REJECT_GROUP = 2,     /* pg_tag differs: another group */
    BRAID_AUTH_REJECT_RANK = 3,      /* rank out of range or not the listener's rank */
    BRAID_AUTH_REJECT_SOCKETS = 4,   /* socket index / count invalid or inconsistent */
    BRAID_AUTH_REJECT_MAX = BRAID_AUTH_REJECT_SOCKETS
} braid_auth_result;

/* Hello message. Wire layout (big endian, 44 bytes):
 *   0 magic "BRD1" | 4 version u16 | 6 role u8 | 7 flags u8 (0)
 *   8 rank i32 | 12 target rank i32 (-1: any) | 16 pg_tag u64
 *  24 nonce[16] | 40 socket index u16 | 42 socket count u16
 * The last two are transport fields (TCP striping); the store sends 0, 0. */
typedef struct {
    uint16_t version;
    uint8_t role;
    int32_t rank;
    int32_t target;
    uint64_t pg_tag;
    uint8_t nonce[BRAID_NONCE_BYTES];
    uint16_t sock_index;
    uint16_t nsocks;
} braid_hello;

/* Cryptographically random bytes (RAND_bytes): nonces, secrets, tags. */
braid_status braid__random_bytes(void *buf, size_t len);

void braid__hello_encode(const braid_hello *hello, uint8_t out[BRAID_HELLO_BYTES]);

/* Decode exactly len == BRAID_HELLO_BYTES bytes. Anything else, a wrong
 * magic or version, an unknown role, non-zero flags, a negative rank or a
 * target below -1 gives BRAID_ERR_AUTH with the reason in the error text
 * (not logged: the caller names the peer). */
braid_status braid__hello_decode(const uint8_t *buf, size_t len, braid_hello *hello);

/* The proof of `role` over the two raw hellos. */
braid_status braid__auth_mac(const uint8_t secret[BRAID_SECRET_BYTES], uint8_t role,
                             const uint8_t hello_i[BRAID_HELLO_BYTES], const uint8_t hello_a[BRAID_HELLO_BYTES],
                             uint8_t out[BRAID_MAC_BYTES]);

/* Constant-time check of a received proof: BRAID_OK or BRAID_ERR_AUTH. */
braid_status braid__auth_mac_check(const uint8_t secret[BRAID_SECRET_BYTES], uint8_t role,
                                   const uint8_t hello_i[BRAID_HELLO_BYTES], const uint8_t hello_a[BRAID_HELLO_BYTES],
                                   const uint8_t mac[BRAID_MAC_BYTES]);

void braid__auth_result_encode(uint32_t result, uint8_t out[BRAID_RESULT_BYTES]);
/* BRAID_ERR_AUTH for a short buffer or an unknown code. */
braid_status braid__auth_result_decode(const uint8_t *buf, size_t len, uint32_t *result);
const char *braid__auth_result_string(uint32_t result);

/* ---- initiator: blocking, with a deadline ---------------------------------
 * Runs the whole exchange on fd. self->nonce is drawn here. Checks the
 * acceptor's hello (magic, version, role == peer_role) and proof; writes
 * the acceptor's hello and verdict. The caller checks the hello's rank
 * and tag and turns a rejecting verdict into its own error.
 * `what` names the connection in errors ("rank 1: peer 2 (10.0.0.2:4000)"). */
braid_status braid__auth_initiate(int fd, const uint8_t secret[BRAID_SECRET_BYTES], braid_hello *self,
                                  uint8_t peer_role, int64_t deadline_ms, const char *what, braid_hello *peer,
                                  uint32_t *result);

/* ---- acceptor: a non-blocking state machine -------------------------------
 * For servers that poll many sockets: braid__auth_accept_init(), then on
 * every readiness call braid__auth_accept_step() and poll for
 * braid__auth_accept_events(). When state reaches BRAID_AUTH_VERIFIED the
 * initiator has proven the secret: inspect `peer`, call
 * braid__auth_accept_finish() with the verdict and keep stepping until
 * BRAID_AUTH_DONE. Errors (garbage, wrong secret, peer gone) end the
 * machine; the caller drops the socket and logs the error text with the
 * peer's address. */
typedef enum {
    BRAID_AUTH_RECV_HELLO = 0,
    BRAID_AUTH_SEND_HELLO,
    BRAID_AUTH_RECV_MAC,
    BRAID_AUTH_VERIFIED,
    BRAID_AUTH_SEND_RESULT,
    BRAID_AUTH_DONE
} braid_auth_state;

typedef struct {
    braid_auth_state state;
    uint8_t peer_role;
    uint8_t self_role;
    uint8_t secret[BRAID_SECRET_BYTES];
    uint8_t raw_i[BRAID_HELLO_BYTES];
    uint8_t raw_a[BRAID_HELLO_BYTES];
    uint8_t buf[BRAID_HELLO_BYTES + BRAID_MAC_BYTES];
    size_t pos, len; /* progress through buf */
    size_t bytes_in; /* received in total: 0 means a bare connect */
    uint32_t result;
    braid_hello peer; /* valid from BRAID_AUTH_SEND_HELLO on */
} braid_auth_accept;

/* self: the acceptor's hello (role, rank, tag...); its nonce is drawn here. */
braid_status braid__auth_accept_init(braid_auth_accept *hs, const uint8_t secret[BRAID_SECRET_BYTES],
                                     const braid_hello *self, uint8_t peer_role);

/* Move as far as the socket allows without blocking. BRAID_OK while the
 * handshake is healthy (check hs->state); an error ends it. */
braid_status braid__auth_accept_step(braid_auth_accept *hs, int fd);

/* poll() events the machine waits for (0 in VERIFIED and DONE). */
short braid__auth_accept_events(const braid_auth_accept *hs);

/* Give the verdict on a VERIFIED initiator. */
void braid__auth_accept_finish(braid_auth_accept *hs, uint32_t result);

/* Forget the secret copy (call when done with hs). */
void braid__auth_accept_clear(braid_auth_accept *hs);

#endif
