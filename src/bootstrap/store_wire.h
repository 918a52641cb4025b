/* Rendezvous store wire format, shared by the server and the client.
 * After the job-secret handshake (auth.h) the client sends requests and
 * waits for each reply; all integers big endian.
 *
 *   request  (16 bytes): op u8 | 3 zero bytes | key_len u32 | value_len u32 |
 *                        timeout_ms u32 (GET; UINT32_MAX: no limit), then key, value
 *   reply     (8 bytes): code u8 | 3 zero bytes | value_len u32, then value
 *
 * SET stores value; GET answers with the value, waiting server-side up to
 * timeout_ms for a missing key; ADD adds the i64 value to the i64 at key
 * (missing: 0) and answers with the sum. Once the server has seen members
 * that cannot form one job (job parameters that differ), it answers every
 * request, and every GET still waiting, with FAILED and the reason. Decoders are pure and range-check
 * everything, for the fuzz targets. */
#ifndef BRAID_STORE_WIRE_H
#define BRAID_STORE_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "braid.h"

#define BRAID_STORE_KEY_MAX 512
#define BRAID_STORE_VALUE_MAX (1024 * 1024)
#define BRAID_STORE_REQ_BYTES 16
#define BRAID_STORE_REPLY_BYTES 8
#define BRAID_STORE_WAIT_FOREVER UINT32_MAX

typedef enum { BRAID_STORE_SET = 1, BRAID_STORE_GET = 2, BRAID_STORE_ADD = 3 } braid_store_op;

typedef enum {
    BRAID_STORE_REPLY_OK = 0,
    BRAID_STORE_REPLY_TIMEOUT = 1, /* GET: key still missing at the deadline */
    BRAID_STORE_REPLY_BAD = 2,     /* ADD on a value that is not an i64 */
    BRAID_STORE_REPLY_FAILED = 3,  /* the job failed at start-up; the value says why (text) */
    BRAID_STORE_REPLY_MAX = BRAID_STORE_REPLY_FAILED
} braid_store_code;

typedef struct {
    uint8_t op;
    uint32_t key_len;
    uint32_t value_len;
    uint32_t timeout_ms;
} braid_store_req;

typedef struct {
    uint8_t code;
    uint32_t value_len;
} braid_store_reply;

void braid__store_req_encode(const braid_store_req *req, uint8_t out[BRAID_STORE_REQ_BYTES]);

/* BRAID_ERR_PEER (quiet) unless len == BRAID_STORE_REQ_BYTES, op is known,
 * padding is zero, 1 <= key_len <= KEY_MAX, value_len <= VALUE_MAX, an ADD
 * carries exactly 8 bytes and a GET none. */
braid_status braid__store_req_decode(const uint8_t *buf, size_t len, braid_store_req *req);

void braid__store_reply_encode(const braid_store_reply *reply, uint8_t out[BRAID_STORE_REPLY_BYTES]);
braid_status braid__store_reply_decode(const uint8_t *buf, size_t len, braid_store_reply *reply);

void braid__store_put_i64(uint8_t out[8], int64_t v);
int64_t braid__store_get_i64(const uint8_t in[8]);

/* Handshake limit of the server per connection, in ms (tests lower it). */
extern int braid__store_handshake_ms;

#endif
