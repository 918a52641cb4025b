/* Job-secret handshake: every braid connection (store or transport) starts
 * with a challenge-response over HMAC-SHA256 keyed by the job secret, so
 * strays, stale jobs and garbage are dropped before any request or data is
 * trusted.
 *
 *   initiator -> acceptor   hello_i                       (BRAID_HELLO_BYTES)
 *   acceptor  -> initiator  hello_a                       (BRAID_HELLO_BYTES)
 *   initiator -> acceptor   mac_i                         (BRAID_MAC_BYTES)
 *   acceptor  -> initiator  mac_a, result                 (+ BRAID_RESULT_BYTES)
 *
 * mac_x = HMAC(secret, label | role of x | hello_i | hello_a): each side
 * proves the secret over both fresh nonces, bound to its own role, so a
 * reply can neither be replayed nor reflected. The side that connects
 * proves first, and the acceptor proves only to an initiator whose proof
 * it has checked: a stranger who connects learns nothing it could test
 * guesses of the secret against offline. A wrong proof costs the prover
 * the connection (acceptors add a growing delay per source, admit.h).
 * The result tells an authenticated initiator whether the acceptor kept it
 * (a duplicate, a wrong group tag, job parameters that differ...).
 *
 * Both hellos state the job's parameters (world size, secret source,
 * launcher job id, checksum setting), so ranks that were started alike
 * in all but one of them are told which one, with both values, instead of
 * "wrong proof" (braid__job_params_diff).
 *
 * Mismatch claims. When a parameter the secret derives from differs (secret
 * source, launcher job id, the secret itself), the initiator cannot prove
 * the job secret, and the acceptor would learn nothing but "wrong proof".
 * So the initiator also sends a claim:
 *   claim = HMAC(claim key, claim label | role | hello_i | hello_a)
 * where the claim key derives from the user's key file (job_secret.c),
 * which both sides hold whatever their job secrets. When a difference
 * shows in the acceptor's hello (secret source, job id), the claim takes
 * the proof's place; otherwise it follows the proof (hello flag CLAIM),
 * since only the acceptor can tell that the secrets differ. An acceptor
 * whose own claim key verifies it knows the claimant is a process of the
 * same user whose parameters differ as its hello says, and may fail the
 * job with the named cause (store_server.c). To a claim that followed a
 * wrong proof it answers with its own claim and its secret id, in place of
 * its proof and verdict, so the claimant can name the difference too.
 * Without a key file on both sides the claim is unproven and counts as a
 * wrong proof: a stranger's word never fails a job (docs/RELIABILITY.md).
 *
 * Nothing derived from the secret goes to a side that has not proven
 * itself: an acceptor's hello states no secret id (0), so a stranger who
 * connects learns nothing to test guesses of the secret against. The
 * initiator's hello does state its id, as its proof follows anyway.
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
#define BRAID_HELLO_BYTES 88
#define BRAID_MAC_BYTES 32
#define BRAID_NONCE_BYTES 16
#define BRAID_RESULT_BYTES 4
#define BRAID_JOB_ID_BYTES 32

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
    BRAID_AUTH_REJECT_PARAMS = 5,    /* job parameters differ (world size, checksum...) */
    BRAID_AUTH_REJECT_FORMED = 6,    /* store: every rank of its job has joined; this is another job's */
    BRAID_AUTH_REJECT_TAKEN = 7,     /* store: a connected member holds that rank */
    BRAID_AUTH_REJECT_MAX = BRAID_AUTH_REJECT_TAKEN
} braid_auth_result;

/* Where a job secret came from. Ranks that disagree have different secrets,
 * so the hellos say it in clear to name the cause. */
typedef enum {
    BRAID_SECRET_UNSTATED = 0, /* transports: parameters not compared */
    BRAID_SECRET_UNIQUE_ID = 1,  /* random, from braid_unique_id */
    BRAID_SECRET_ENV = 2,        /* BRAID_JOB_SECRET */
    BRAID_SECRET_KEY_FILE = 3,   /* the user's key file and the launch variables */
    BRAID_SECRET_PUBLIC = 4,     /* launch variables only: anyone can compute it */
    BRAID_SECRET_MAX = BRAID_SECRET_PUBLIC
} braid_secret_source;

/* Parameters every member of a job must agree on. size 0: not stated (the
 * transports' hellos), and then nothing is compared. */
typedef struct {
    uint32_t size;                       /* world size */
    uint8_t source;                      /* braid_secret_source */
    uint8_t checksum;                    /* BRAID_CHECKSUM on (1) or off (0) */
    uint32_t secret_id;                  /* braid__secret_id(): tells secrets apart, reveals none */
    char job_id[BRAID_JOB_ID_BYTES + 1]; /* launcher's job id, printable, "" when none */
    /* Not on the wire: the key of this side's mismatch claims (below), from
     * the user's key file; has_claim_key 0 when there is none. */
    uint8_t claim_key[BRAID_SECRET_BYTES];
    uint8_t has_claim_key;
} braid_job_params;

/* Hello message. Wire layout (big endian, 88 bytes):
 *   0 magic "BRD1" | 4 version u16 | 6 role u8 | 7 flags u8
 *   8 rank i32 | 12 target rank i32 (-1: any) | 16 pg_tag u64
 *  24 nonce[16] | 40 socket index u16 | 42 socket count u16
 *  44 world size u32 | 48 secret source u8 | 49 checksum u8 | 50 zero u16
 *  52 secret id u32 | 56 job id[32] (printable ASCII, NUL padded)
 * Socket index and count are transport fields (TCP striping); the store
 * sends 0, 0. The job parameters are all zero where not stated. */
/* Hello flags. CLAIM: the initiator sends a mismatch claim right after its
 * proof (BRAID_MAC_BYTES more), for the acceptor to read when the proof
 * fails; see "Mismatch claims" above. */
#define BRAID_HELLO_FLAG_CLAIM 0x01u
#define BRAID_HELLO_FLAGS_KNOWN BRAID_HELLO_FLAG_CLAIM

typedef struct {
    uint16_t version;
    uint8_t role;
    uint8_t flags; /* BRAID_HELLO_FLAG_* */
    int32_t rank;
    int32_t target;
    uint64_t pg_tag;
    uint8_t nonce[BRAID_NONCE_BYTES];
    uint16_t sock_index;
    uint16_t nsocks;
    braid_job_params job;
} braid_hello;

/* 32 bits of SHA-256 over a label and the secret: ranks with different
 * secrets see that they differ, before any proof. A random or per-user
 * secret keeps 96 unknown bits; a public one was computable anyway. */
uint32_t braid__secret_id(const uint8_t secret[BRAID_SECRET_BYTES]);

/* Compare the parameters of two processes, a and b named for messages
 * ("rank 2", "rank 0 (the store)"). 0 when they agree or either states
 * none; otherwise 1 with "WORLD_SIZE differs: 3 at rank 2, 4 at rank 0" in
 * why. *secret_bound is set when the parameter that differs is one the
 * secret derives from (secret source, job id, the secret itself): then no
 * proof can succeed, and only the side that sees the hello learns why. */
int braid__job_params_diff(const braid_job_params *a, const char *a_name, const braid_job_params *b,
                           const char *b_name, char *why, size_t cap, int *secret_bound);

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

/* A mismatch claim over the two raw hellos (see the top of this file). */
braid_status braid__auth_claim(const uint8_t claim_key[BRAID_SECRET_BYTES], uint8_t role,
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
 * acceptor's hello (magic, version, role == peer_role, job parameters) and,
 * after sending its own proof, the acceptor's; writes the acceptor's hello
 * and verdict. Parameters that the secret derives from and that differ
 * fail at once with BRAID_ERR_MISMATCH; others are left to the acceptor,
 * which checks them after the proof and answers BRAID_AUTH_REJECT_PARAMS. The caller checks the hello's rank
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
    BRAID_AUTH_SEND_HELLO, /* hello_a only: the acceptor's proof waits for the initiator's */
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
    uint8_t buf[BRAID_HELLO_BYTES + BRAID_MAC_BYTES]; /* room for a proof and a claim */
    size_t pos, len; /* progress through buf */
    size_t bytes_in; /* received in total: 0 means a bare connect */
    int bad_proof;   /* the error was a wrong proof (not garbage or a close) */
    int mac_failed;  /* libcrypto failed to make our proof */
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

/* After a wrong proof (hs->bad_proof): 1 when what the initiator sent is a
 * valid mismatch claim under claim_key, so its hello's job parameters are
 * those of a process of this user. */
int braid__auth_claim_valid(const braid_auth_accept *hs, const uint8_t claim_key[BRAID_SECRET_BYTES]);

/* After a valid claim that followed a wrong proof (hello flag CLAIM):
 * answer it with our own claim and secret_id, then the machine goes on to
 * BRAID_AUTH_DONE with result BRAID_AUTH_REJECT_PARAMS. 0 when the
 * initiator sent no such claim (nothing to answer). */
int braid__auth_accept_answer_claim(braid_auth_accept *hs, const uint8_t claim_key[BRAID_SECRET_BYTES],
                                    uint32_t secret_id);

/* Forget the secret copy (call when done with hs). */
void braid__auth_accept_clear(braid_auth_accept *hs);

#endif
