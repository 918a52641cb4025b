/* Rendezvous store wire (bootstrap/store_wire.h): request and reply
 * headers decoded from arbitrary bytes, as a stray or hostile client would
 * send them.
 *
 * Invariants: no read outside the buffer (ASan); a header decodes only
 * with exactly the documented length and ranges, and then re-encodes to
 * the same bytes; decode(encode(x)) == x for every valid x; the i64
 * helpers round-trip. */
#include <stdint.h>
#include <string.h>

#include "bootstrap/store_wire.h"
#include "fuzz_common.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_quiet();
    return 0;
}

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void check_req(const uint8_t *data, size_t size)
{
    braid_store_req r = {.op = 0xee, .key_len = 7, .value_len = 7, .timeout_ms = 7};
    braid_store_req before = r;
    braid_status st = braid__store_req_decode(data, size, &r);
    if (st != BRAID_OK) {
        FUZZ_ASSERT(st == BRAID_ERR_PEER);
        FUZZ_ASSERT(memcmp(&r, &before, sizeof(r)) == 0);
        return;
    }
    FUZZ_ASSERT(size == BRAID_STORE_REQ_BYTES);
    FUZZ_ASSERT(r.op >= BRAID_STORE_SET && r.op <= BRAID_STORE_ADD);
    FUZZ_ASSERT(r.key_len >= 1 && r.key_len <= BRAID_STORE_KEY_MAX);
    FUZZ_ASSERT(r.value_len <= BRAID_STORE_VALUE_MAX);
    FUZZ_ASSERT(r.op != BRAID_STORE_ADD || r.value_len == 8);
    FUZZ_ASSERT(r.op != BRAID_STORE_GET || r.value_len == 0);
    FUZZ_ASSERT(r.key_len == be32(data + 4) && r.value_len == be32(data + 8) && r.timeout_ms == be32(data + 12));
    uint8_t again[BRAID_STORE_REQ_BYTES];
    braid__store_req_encode(&r, again);
    FUZZ_ASSERT(memcmp(again, data, sizeof(again)) == 0);
}

static void check_reply(const uint8_t *data, size_t size)
{
    braid_store_reply r = {.code = 0xee, .value_len = 7};
    braid_store_reply before = r;
    braid_status st = braid__store_reply_decode(data, size, &r);
    if (st != BRAID_OK) {
        FUZZ_ASSERT(st == BRAID_ERR_PEER);
        FUZZ_ASSERT(memcmp(&r, &before, sizeof(r)) == 0);
        return;
    }
    FUZZ_ASSERT(size == BRAID_STORE_REPLY_BYTES);
    FUZZ_ASSERT(r.code <= BRAID_STORE_REPLY_MAX && r.value_len <= BRAID_STORE_VALUE_MAX);
    uint8_t again[BRAID_STORE_REPLY_BYTES];
    braid__store_reply_encode(&r, again);
    FUZZ_ASSERT(memcmp(again, data, sizeof(again)) == 0);
}

/* Valid messages made from the input must survive encode then decode. */
static void check_roundtrip(const uint8_t *data, size_t size)
{
    uint8_t raw[16] = {0};
    memcpy(raw, data, size < sizeof(raw) ? size : sizeof(raw));
    braid_store_req x = {.op = (uint8_t)(BRAID_STORE_SET + raw[0] % 3),
                         .key_len = 1 + be32(raw + 1) % BRAID_STORE_KEY_MAX,
                         .value_len = be32(raw + 5) % (BRAID_STORE_VALUE_MAX + 1),
                         .timeout_ms = be32(raw + 9)};
    if (x.op == BRAID_STORE_ADD)
        x.value_len = 8;
    if (x.op == BRAID_STORE_GET)
        x.value_len = 0;
    uint8_t wire[BRAID_STORE_REQ_BYTES];
    braid__store_req_encode(&x, wire);
    braid_store_req y;
    FUZZ_ASSERT(braid__store_req_decode(wire, sizeof(wire), &y) == BRAID_OK);
    FUZZ_ASSERT(x.op == y.op && x.key_len == y.key_len && x.value_len == y.value_len && x.timeout_ms == y.timeout_ms);

    braid_store_reply a = {.code = (uint8_t)(raw[13] % (BRAID_STORE_REPLY_MAX + 1)),
                           .value_len = be32(raw + 12) % (BRAID_STORE_VALUE_MAX + 1)};
    uint8_t rw[BRAID_STORE_REPLY_BYTES];
    braid__store_reply_encode(&a, rw);
    braid_store_reply b;
    FUZZ_ASSERT(braid__store_reply_decode(rw, sizeof(rw), &b) == BRAID_OK);
    FUZZ_ASSERT(a.code == b.code && a.value_len == b.value_len);

    int64_t v;
    memcpy(&v, raw + 4, sizeof(v));
    uint8_t iv[8];
    braid__store_put_i64(iv, v);
    FUZZ_ASSERT(braid__store_get_i64(iv) == v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check_req(data, size);
    check_reply(data, size);
    /* Also the exact-length prefixes, so the field checks are reached. */
    if (size >= BRAID_STORE_REQ_BYTES)
        check_req(data, BRAID_STORE_REQ_BYTES);
    if (size >= BRAID_STORE_REPLY_BYTES)
        check_reply(data, BRAID_STORE_REPLY_BYTES);
    check_roundtrip(data, size);
    return 0;
}
