/* The checksum trailer (transports/checksum/checksum.c) as read off the wire, and CRC32C.
 *
 * Input: byte 0 picks the number of messages (1..3); then per message a
 * length byte (0..255) and that many payload bytes, then an 8-byte trailer
 * taken from the input as it is (u32 CRC, u32 message number), or, when the
 * top bit of the length byte is set, the correct trailer with one bit of it
 * flipped at a fuzz-chosen position (so near misses are common). A plain TCP
 * connection writes them; the receiving end is wrapped.
 *
 * Invariants: the receiver completes messages in order exactly while each
 * trailer equals (crc32c(payload), its number); the first other one is
 * BRAID_ERR_CORRUPT, that receive and every later one are never reported
 * done, the error sticks, and the reported fault names that message, its
 * length and buffer, and which check failed. The hardware and table CRCs
 * agree on every payload, also when computed in two pieces. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transports/checksum/checksum.h"
#include "crc32c.h"
#include "fuzz_common.h"
#include "transports/tcp/tcp_conn.h"

#define MAX_MSGS 3

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void check_crc(const uint8_t *p, size_t n)
{
    uint32_t sw = braid__crc32c_sw(0, p, n);
    braid_crc32c_func_t hw = braid__crc32c_hw();
    if (hw)
        FUZZ_ASSERT(hw(0, p, n) == sw);
    size_t cut = n / 2;
    FUZZ_ASSERT(braid__crc32c(braid__crc32c(0, p, cut), p + cut, n - cut) == sw);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int once;
    if (!once) {
        fuzz_quiet();
        once = 1;
    }
    if (size < 1)
        return 0;
    check_crc(data, size);
    int m = 1 + data[0] % MAX_MSGS;
    size_t off = 1;
    uint8_t wire[MAX_MSGS][255 + 8];
    size_t lens[MAX_MSGS];
    int good[MAX_MSGS], order_bad[MAX_MSGS];
    for (int i = 0; i < m; i++) {
        if (off >= size)
            return 0;
        int near = data[off] >> 7;
        size_t len = data[off++] & 0x7f;
        len = len * 2 > size - off ? size - off : len * 2;
        lens[i] = len;
        memcpy(wire[i], data + off, len);
        off += len;
        uint8_t *t = wire[i] + len;
        uint32_t crc = braid__crc32c(0, wire[i], len);
        if (near) {
            put32(t, crc);
            put32(t + 4, (uint32_t)i);
            if (off < size) {
                uint8_t bit = data[off++];
                t[(bit >> 3) % 8] ^= (uint8_t)(1u << (bit & 7));
            }
        } else {
            if (size - off < 8)
                return 0;
            memcpy(t, data + off, 8);
            off += 8;
        }
        order_bad[i] = get32(t + 4) != (uint32_t)i;
        good[i] = !order_bad[i] && get32(t) == crc;
    }

    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
        return 0;
    braid_tcp_conn *a, *b;
    FUZZ_ASSERT(braid__tcp_conn_create(0, 1, 1, &sv[0], "fuzz-tx", &a) == BRAID_OK);
    FUZZ_ASSERT(braid__tcp_conn_create(1, 0, 1, &sv[1], "fuzz-rx", &b) == BRAID_OK);
    braid_conn *tx = &a->base, *rx = &b->base;
    FUZZ_ASSERT(braid__checksum_wrap(1, &rx) == BRAID_OK);

    braid_req sreq[2 * MAX_MSGS], rreq[MAX_MSGS];
    uint8_t got[MAX_MSGS][255];
    for (int i = 0; i < m; i++) {
        FUZZ_ASSERT(tx->ops->isend(tx, &sreq[2 * i], wire[i], lens[i]) == BRAID_OK);
        FUZZ_ASSERT(tx->ops->isend(tx, &sreq[2 * i + 1], wire[i] + lens[i], 8) == BRAID_OK);
    }
    int first_bad = m;
    for (int i = 0; i < m && first_bad == m; i++)
        if (!good[i])
            first_bad = i;
    braid_status st = BRAID_OK;
    for (int i = 0; i < m && st == BRAID_OK; i++)
        st = rx->ops->irecv(rx, &rreq[i], got[i], lens[i]);
    /* Everything fits the socket buffers: a few rounds move it all. */
    for (int spin = 0; spin < 200 && st == BRAID_OK; spin++) {
        int all = 1;
        for (int i = 0; i < m && st == BRAID_OK; i++) {
            int d = 0;
            st = rx->ops->test(&rreq[i], &d);
            all &= d;
        }
        if (all || st != BRAID_OK)
            break;
        braid_conn *c[1] = {tx};
        FUZZ_ASSERT(tx->ops->progress(c, 1, -1, 0) == BRAID_OK);
        c[0] = rx;
        st = rx->ops->progress(c, 1, -1, 1);
    }
    for (int i = 0; i < m; i++) {
        if (i < first_bad) {
            FUZZ_ASSERT(rreq[i].done);
            FUZZ_ASSERT(memcmp(got[i], wire[i], lens[i]) == 0);
        } else if (i < m && st != BRAID_OK) {
            FUZZ_ASSERT(!rreq[i].done);
        }
    }
    if (first_bad == m) {
        FUZZ_ASSERT(st == BRAID_OK);
    } else {
        FUZZ_ASSERT(st == BRAID_ERR_CORRUPT);
        braid_checksum_fault f;
        FUZZ_ASSERT(braid__checksum_fault(rx, &f));
        FUZZ_ASSERT(f.msg == (uint64_t)first_bad && f.len == lens[first_bad] && f.buf == got[first_bad]);
        FUZZ_ASSERT(f.order == order_bad[first_bad]);
        braid_req again;
        FUZZ_ASSERT(rx->ops->irecv(rx, &again, got[0], 1) == BRAID_ERR_CORRUPT);
    }
    tx->ops->close(tx);
    rx->ops->close(rx);
    return 0;
}
