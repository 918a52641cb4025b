/* Rendezvous store messages: see store_wire.h. */
#include <string.h>

#include "status.h"
#include "store_wire.h"
#include "bytes.h"

int braid__store_handshake_ms = 10000;

void braid__store_put_i64(uint8_t out[8], int64_t v)
{
    uint64_t u = (uint64_t)v;
    braid__put_be32(out, (uint32_t)(u >> 32));
    braid__put_be32(out + 4, (uint32_t)u);
}

int64_t braid__store_get_i64(const uint8_t in[8])
{
    return (int64_t)((uint64_t)braid__get_be32(in) << 32 | braid__get_be32(in + 4));
}

void braid__store_req_encode(const braid_store_req *req, uint8_t out[BRAID_STORE_REQ_BYTES])
{
    memset(out, 0, BRAID_STORE_REQ_BYTES);
    out[0] = req->op;
    braid__put_be32(out + 4, req->key_len);
    braid__put_be32(out + 8, req->value_len);
    braid__put_be32(out + 12, req->timeout_ms);
}

braid_status braid__store_req_decode(const uint8_t *buf, size_t len, braid_store_req *req)
{
    if (!buf || len != BRAID_STORE_REQ_BYTES)
        return braid__error_quiet(BRAID_ERR_PEER, "store request header of %zu bytes, expected %d", buf ? len : 0,
                                  BRAID_STORE_REQ_BYTES);
    braid_store_req r = {
        .op = buf[0], .key_len = braid__get_be32(buf + 4), .value_len = braid__get_be32(buf + 8), .timeout_ms = braid__get_be32(buf + 12)};
    if (r.op < BRAID_STORE_SET || r.op > BRAID_STORE_ADD)
        return braid__error_quiet(BRAID_ERR_PEER, "unknown store op %u", r.op);
    if (buf[1] || buf[2] || buf[3])
        return braid__error_quiet(BRAID_ERR_PEER, "non-zero padding in store request");
    if (r.key_len < 1 || r.key_len > BRAID_STORE_KEY_MAX)
        return braid__error_quiet(BRAID_ERR_PEER, "store key of %u bytes (1 to %d allowed)", r.key_len,
                                  BRAID_STORE_KEY_MAX);
    if (r.value_len > BRAID_STORE_VALUE_MAX)
        return braid__error_quiet(BRAID_ERR_PEER, "store value of %u bytes (at most %d allowed)", r.value_len,
                                  BRAID_STORE_VALUE_MAX);
    if (r.op == BRAID_STORE_ADD && r.value_len != 8)
        return braid__error_quiet(BRAID_ERR_PEER, "store ADD with a %u-byte operand, expected 8", r.value_len);
    if (r.op == BRAID_STORE_GET && r.value_len != 0)
        return braid__error_quiet(BRAID_ERR_PEER, "store GET carrying %u value bytes", r.value_len);
    *req = r;
    return BRAID_OK;
}

void braid__store_reply_encode(const braid_store_reply *reply, uint8_t out[BRAID_STORE_REPLY_BYTES])
{
    memset(out, 0, BRAID_STORE_REPLY_BYTES);
    out[0] = reply->code;
    braid__put_be32(out + 4, reply->value_len);
}

braid_status braid__store_reply_decode(const uint8_t *buf, size_t len, braid_store_reply *reply)
{
    if (!buf || len != BRAID_STORE_REPLY_BYTES)
        return braid__error_quiet(BRAID_ERR_PEER, "store reply header of %zu bytes, expected %d", buf ? len : 0,
                                  BRAID_STORE_REPLY_BYTES);
    braid_store_reply r = {.code = buf[0], .value_len = braid__get_be32(buf + 4)};
    if (r.code > BRAID_STORE_REPLY_MAX || buf[1] || buf[2] || buf[3])
        return braid__error_quiet(BRAID_ERR_PEER, "malformed store reply (code %u)", r.code);
    if (r.value_len > BRAID_STORE_VALUE_MAX)
        return braid__error_quiet(BRAID_ERR_PEER, "store reply of %u bytes (at most %d allowed)", r.value_len,
                                  BRAID_STORE_VALUE_MAX);
    *reply = r;
    return BRAID_OK;
}
