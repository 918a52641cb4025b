/* Verbs transport protocol suite, runnable without an RDMA device:
 * immediate encoding, chunking, credit windows, the set-up message, device
 * specs and GID choice, the registration cache, and the data-path engine
 * driven over a simulated fabric that checks the hardware's rules (no
 * receive-queue underrun, no send-queue overflow, no write into a ring slot
 * the receiver has not copied out yet) under random schedules. */
#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "braid.h"
#include "braid_transport.h"
#include "transports/verbs/verbs_engine.h"
#include "transports/verbs/verbs_proto.h"
#include "transports/verbs/verbs_regcache.h"

static uint64_t rng_state;

static void rng_seed(uint64_t s)
{
    rng_state = s * 0x9e3779b97f4a7c15ull + 0x2545f4914f6cdd1dull;
}

static uint64_t rng(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    rng_state = x;
    return x;
}

static uint32_t rng_below(uint32_t n)
{
    return (uint32_t)(rng() % n);
}

/* ---- immediates ------------------------------------------------------------ */

START_TEST(imm_data_round_trip)
{
    const uint32_t nslots = BRAID_VERBS_MAX_SLOTS, slot_bytes = BRAID_VERBS_MAX_SLOT_BYTES;
    const uint32_t lens[] = {0, 1, 2, 4095, 4096, 65537, slot_bytes - 1};
    for (uint32_t slot = 0; slot < nslots; slot++) {
        for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
            braid_verbs_imm d;
            char why[128];
            uint32_t imm = braid__verbs_imm_data(slot, lens[i], 1);
            ck_assert_int_eq(braid__verbs_imm_decode(imm, nslots, slot_bytes, &d, why, sizeof(why)), BRAID_OK);
            ck_assert_int_eq(d.kind, BRAID_VERBS_IMM_DATA);
            ck_assert_uint_eq(d.slot, slot);
            ck_assert_uint_eq(d.len, lens[i]);
            ck_assert_int_eq(d.last, 1);
        }
        /* Non-final chunks are exactly one slot. */
        braid_verbs_imm d;
        uint32_t imm = braid__verbs_imm_data(slot, slot_bytes, 0);
        ck_assert_int_eq(braid__verbs_imm_decode(imm, nslots, slot_bytes, &d, NULL, 0), BRAID_OK);
        ck_assert_uint_eq(d.len, slot_bytes);
        ck_assert_int_eq(d.last, 0);
    }
}
END_TEST

START_TEST(imm_control_round_trip)
{
    braid_verbs_imm d;
    for (uint32_t n = 1; n <= BRAID_VERBS_MAX_SLOTS; n++) {
        ck_assert_int_eq(braid__verbs_imm_decode(braid__verbs_imm_credit(n), 8, 4096, &d, NULL, 0), BRAID_OK);
        ck_assert_int_eq(d.kind, BRAID_VERBS_IMM_CREDIT);
        ck_assert_uint_eq(d.credits, n);
    }
    ck_assert_int_eq(braid__verbs_imm_decode(braid__verbs_imm_close(), 8, 4096, &d, NULL, 0), BRAID_OK);
    ck_assert_int_eq(d.kind, BRAID_VERBS_IMM_CLOSE);
}
END_TEST

static void expect_reject(uint32_t imm, uint32_t nslots, uint32_t slot_bytes, const char *needle)
{
    braid_verbs_imm d;
    char why[160] = "";
    ck_assert_int_eq(braid__verbs_imm_decode(imm, nslots, slot_bytes, &d, why, sizeof(why)), BRAID_ERR_PEER);
    ck_assert_msg(strstr(why, needle) != NULL, "reason '%s' lacks '%s'", why, needle);
}

START_TEST(imm_rejects)
{
    expect_reject(0xC0000000u, 8, 4096, "reserved");
    expect_reject(braid__verbs_imm_data(8, 10, 1), 8, 4096, "slot 8");
    expect_reject(braid__verbs_imm_data(255, 10, 1), 8, 4096, "slot 255");
    expect_reject(braid__verbs_imm_data(0, 4097, 1), 8, 4096, "4097 bytes");
    expect_reject(braid__verbs_imm_data(0, 4095, 0), 8, 4096, "non-final");
    expect_reject(braid__verbs_imm_data(0, 0, 0), 8, 4096, "non-final");
    expect_reject(braid__verbs_imm_credit(0), 8, 4096, "0 credits");
    expect_reject(braid__verbs_imm_credit(BRAID_VERBS_MAX_SLOTS + 1), 8, 4096, "credits");
    expect_reject(braid__verbs_imm_close() | 1u, 8, 4096, "payload");
}
END_TEST

/* Every 32-bit value either fails to decode or re-encodes to itself: no
 * two immediates mean the same thing and nothing decodes out of range. */
START_TEST(imm_fuzz)
{
    rng_seed(1);
    const uint32_t nslots = 16, slot_bytes = 8192;
    for (int i = 0; i < 2000000; i++) {
        uint32_t imm = (uint32_t)rng();
        braid_verbs_imm d;
        if (braid__verbs_imm_decode(imm, nslots, slot_bytes, &d, NULL, 0) != BRAID_OK)
            continue;
        uint32_t again = 0;
        switch (d.kind) {
        case BRAID_VERBS_IMM_DATA:
            ck_assert_uint_lt(d.slot, nslots);
            ck_assert_uint_le(d.len, slot_bytes);
            again = braid__verbs_imm_data(d.slot, d.len, d.last);
            break;
        case BRAID_VERBS_IMM_CREDIT:
            ck_assert_uint_ge(d.credits, 1);
            again = braid__verbs_imm_credit(d.credits);
            break;
        case BRAID_VERBS_IMM_CLOSE:
            again = braid__verbs_imm_close();
            break;
        }
        ck_assert_uint_eq(again, imm);
    }
}
END_TEST

/* ---- chunking -------------------------------------------------------------- */

static void check_chunks(size_t len, uint32_t slot)
{
    uint64_t n = braid__verbs_chunk_count(len, slot);
    ck_assert_uint_ge(n, 1);
    if (len > (size_t)1 << 40) {
        /* Too many to walk: check the ends only. */
        size_t off;
        uint32_t clen;
        int last;
        braid__verbs_chunk_at(len, slot, 0, &off, &clen, &last);
        ck_assert_uint_eq(off, 0);
        ck_assert_uint_eq(clen, slot);
        ck_assert_int_eq(last, 0);
        braid__verbs_chunk_at(len, slot, n - 1, &off, &clen, &last);
        ck_assert_int_eq(last, 1);
        ck_assert_uint_eq(off + clen, len);
        ck_assert_uint_ge(clen, 1);
        return;
    }
    size_t total = 0;
    for (uint64_t i = 0; i < n; i++) {
        size_t off;
        uint32_t clen;
        int last;
        braid__verbs_chunk_at(len, slot, i, &off, &clen, &last);
        ck_assert_uint_eq(off, total);
        ck_assert_int_eq(last, i + 1 == n);
        if (!last)
            ck_assert_uint_eq(clen, slot);
        else
            ck_assert_uint_le(clen, slot);
        total += clen;
    }
    ck_assert_uint_eq(total, len);
}

START_TEST(chunk_sizes)
{
    const uint32_t slot = 4096;
    ck_assert_uint_eq(braid__verbs_chunk_count(0, slot), 1);
    ck_assert_uint_eq(braid__verbs_chunk_count(1, slot), 1);
    ck_assert_uint_eq(braid__verbs_chunk_count(slot - 1, slot), 1);
    ck_assert_uint_eq(braid__verbs_chunk_count(slot, slot), 1);
    ck_assert_uint_eq(braid__verbs_chunk_count(slot + 1, slot), 2);
    ck_assert_uint_eq(braid__verbs_chunk_count(2 * slot, slot), 2);
    ck_assert_uint_eq(braid__verbs_chunk_count(SIZE_MAX, slot), SIZE_MAX / slot + 1);
    size_t off;
    uint32_t clen;
    int last;
    braid__verbs_chunk_at(0, slot, 0, &off, &clen, &last);
    ck_assert_uint_eq(clen, 0);
    ck_assert_int_eq(last, 1);
    const size_t sizes[] = {0,
                            1,
                            slot - 1,
                            slot,
                            slot + 1,
                            3 * slot - 1,
                            3 * slot,
                            100 * slot + 7,
                            (size_t)1 << 30,
                            SIZE_MAX,
                            SIZE_MAX - slot};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
        check_chunks(sizes[i], slot);
    check_chunks(12345, 1);
    check_chunks(BRAID_VERBS_MAX_SLOT_BYTES * 3ull + 1, BRAID_VERBS_MAX_SLOT_BYTES);
}
END_TEST

/* ---- credit windows -------------------------------------------------------- */

START_TEST(window_random_schedules)
{
    for (int round = 0; round < 200; round++) {
        rng_seed((uint64_t)round + 100);
        uint32_t nslots = 1 + rng_below(BRAID_VERBS_MAX_SLOTS);
        uint32_t window = 1 + rng_below(nslots);
        braid_verbs_tx tx;
        braid_verbs_rx rx;
        braid__verbs_tx_init(&tx, window);
        braid__verbs_rx_init(&rx, nslots);
        /* In flight: chunks posted but not arrived, credits sent but not
         * received, completions not yet polled. */
        uint64_t wire = 0, credits_wire = 0, unpolled = 0;
        for (int step = 0; step < 20000; step++) {
            switch (rng_below(5)) {
            case 0:
                if (braid__verbs_tx_can_post(&tx)) {
                    braid__verbs_tx_post(&tx);
                    wire++;
                }
                break;
            case 1:
                if (wire) {
                    uint32_t slot = (uint32_t)((tx.posted - wire) % nslots);
                    char why[128];
                    if (braid__verbs_rx_arrive(&rx, slot, why, sizeof(why)) != BRAID_OK)
                        ck_abort_msg("%s", why);
                    wire--;
                    unpolled++;
                }
                break;
            case 2:
                if (rx.consumed < rx.arrived)
                    braid__verbs_rx_consume(&rx);
                break;
            case 3: {
                uint32_t n = braid__verbs_rx_credits_due(&rx);
                if (n) {
                    braid__verbs_rx_returned(&rx, n);
                    credits_wire += n;
                }
                if (credits_wire && rng_below(2)) {
                    uint32_t take = credits_wire > 300 ? 300 : (uint32_t)credits_wire;
                    if (braid__verbs_tx_credit(&tx, take) != BRAID_OK)
                        ck_abort_msg("credit of %u refused: %s", take, braid_last_error());
                    credits_wire -= take;
                }
                break;
            }
            case 4:
                if (unpolled) {
                    if (braid__verbs_tx_complete(&tx) != BRAID_OK)
                        ck_abort_msg("completion refused: %s", braid_last_error());
                    unpolled--;
                }
                break;
            }
            /* The invariants the ring relies on. Plain checks: a passing
             * ck_assert records its location through a system call, which
             * made this loop of 4 million steps take minutes under load. */
            if (tx.posted - tx.credited > window || tx.posted - tx.completed > window ||
                rx.arrived - rx.consumed > nslots || rx.returned > rx.consumed || tx.credited > rx.returned)
                ck_abort_msg("round %d step %d: window %u, slots %u: posted %llu credited %llu completed %llu, "
                             "arrived %llu consumed %llu returned %llu",
                             round, step, window, nslots, (unsigned long long)tx.posted,
                             (unsigned long long)tx.credited, (unsigned long long)tx.completed,
                             (unsigned long long)rx.arrived, (unsigned long long)rx.consumed,
                             (unsigned long long)rx.returned);
        }
    }
}
END_TEST

START_TEST(window_rejects)
{
    braid_verbs_tx tx;
    braid__verbs_tx_init(&tx, 4);
    ck_assert_int_eq(braid__verbs_tx_credit(&tx, 1), BRAID_ERR_PEER); /* nothing posted */
    ck_assert_int_eq(braid__verbs_tx_complete(&tx), BRAID_ERR_INTERNAL);
    for (int i = 0; i < 4; i++) {
        ck_assert(braid__verbs_tx_can_post(&tx));
        braid__verbs_tx_post(&tx);
    }
    ck_assert(!braid__verbs_tx_can_post(&tx));
    ck_assert_int_eq(braid__verbs_tx_credit(&tx, 5), BRAID_ERR_PEER);
    ck_assert_int_eq(braid__verbs_tx_credit(&tx, 4), BRAID_OK);
    ck_assert(!braid__verbs_tx_can_post(&tx)); /* completions still due: staging slots busy */
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(braid__verbs_tx_complete(&tx), BRAID_OK);
    ck_assert(braid__verbs_tx_can_post(&tx));

    braid_verbs_rx rx;
    char why[128];
    braid__verbs_rx_init(&rx, 4);
    ck_assert_int_eq(braid__verbs_rx_arrive(&rx, 1, why, sizeof(why)), BRAID_ERR_PEER);
    ck_assert_ptr_nonnull(strstr(why, "expected slot 0"));
    for (uint32_t i = 0; i < 4; i++)
        ck_assert_int_eq(braid__verbs_rx_arrive(&rx, i, why, sizeof(why)), BRAID_OK);
    /* A fifth chunk before any credit went back overruns the window. */
    ck_assert_int_eq(braid__verbs_rx_arrive(&rx, 0, why, sizeof(why)), BRAID_ERR_PEER);
    ck_assert_ptr_nonnull(strstr(why, "overran"));
}
END_TEST

START_TEST(window_credit_batching)
{
    braid_verbs_rx rx;
    char why[64];
    braid__verbs_rx_init(&rx, 16); /* batch 4 */
    ck_assert_uint_eq(rx.batch, 4);
    for (uint32_t i = 0; i < 8; i++)
        ck_assert_int_eq(braid__verbs_rx_arrive(&rx, i, why, sizeof(why)), BRAID_OK);
    ck_assert_uint_eq(braid__verbs_rx_credits_due(&rx), 0);
    braid__verbs_rx_consume(&rx);
    braid__verbs_rx_consume(&rx);
    ck_assert_uint_eq(braid__verbs_rx_credits_due(&rx), 0); /* 2 < batch, more arrived unconsumed */
    braid__verbs_rx_consume(&rx);
    braid__verbs_rx_consume(&rx);
    ck_assert_uint_eq(braid__verbs_rx_credits_due(&rx), 4);
    braid__verbs_rx_returned(&rx, 4);
    for (int i = 0; i < 4; i++)
        braid__verbs_rx_consume(&rx);
    /* Caught up: everything owed goes back even below a batch... */
    ck_assert_uint_eq(braid__verbs_rx_credits_due(&rx), 4);
    braid__verbs_rx_returned(&rx, 4);
    ck_assert_int_eq(braid__verbs_rx_arrive(&rx, 8, why, sizeof(why)), BRAID_OK);
    braid__verbs_rx_consume(&rx);
    ck_assert_uint_eq(braid__verbs_rx_credits_due(&rx), 1);
    /* ...and a one-slot ring returns every credit at once. */
    braid__verbs_rx_init(&rx, 1);
    ck_assert_uint_eq(rx.batch, 1);
}
END_TEST

/* ---- set-up message -------------------------------------------------------- */

static braid_verbs_info sample_info(void)
{
    braid_verbs_info i = {
        .link_layer = BRAID_VERBS_LINK_ETH,
        .mtu = 5,
        .qpn = 0x1234,
        .psn = 0xABCDEF,
        .lid = 0,
        .flags = BRAID_VERBS_INFO_GID_VALID,
        .nslots = 32,
        .slot_bytes = 131072,
        .ring_addr = 0x7f0012345000ull,
        .ring_rkey = 0xdeadbeef,
        .rank = 3,
    };
    for (int k = 0; k < 16; k++)
        i.gid[k] = (uint8_t)(k * 17);
    return i;
}

START_TEST(info_round_trip)
{
    braid_verbs_info in = sample_info(), out;
    uint8_t buf[BRAID_VERBS_INFO_BYTES];
    braid__verbs_info_encode(&in, buf);
    char why[128];
    ck_assert_int_eq(braid__verbs_info_decode(buf, sizeof(buf), &out, why, sizeof(why)), BRAID_OK);
    ck_assert_uint_eq(out.link_layer, in.link_layer);
    ck_assert_uint_eq(out.mtu, in.mtu);
    ck_assert_uint_eq(out.qpn, in.qpn);
    ck_assert_uint_eq(out.psn, in.psn);
    ck_assert_uint_eq(out.lid, in.lid);
    ck_assert_uint_eq(out.flags, in.flags);
    ck_assert_mem_eq(out.gid, in.gid, 16);
    ck_assert_uint_eq(out.nslots, in.nslots);
    ck_assert_uint_eq(out.slot_bytes, in.slot_bytes);
    ck_assert_uint_eq(out.ring_addr, in.ring_addr);
    ck_assert_uint_eq(out.ring_rkey, in.ring_rkey);
    ck_assert_int_eq(out.rank, in.rank);
    /* Little endian on the wire, whatever the host. */
    ck_assert_mem_eq(buf, "BVQ1", 4);
    ck_assert_uint_eq(buf[8], 0x34);
    ck_assert_uint_eq(buf[9], 0x12);
}
END_TEST

static void info_expect_reject(const braid_verbs_info *info, const char *needle)
{
    uint8_t buf[BRAID_VERBS_INFO_BYTES];
    braid_verbs_info out;
    char why[160] = "";
    braid__verbs_info_encode(info, buf);
    ck_assert_int_eq(braid__verbs_info_decode(buf, sizeof(buf), &out, why, sizeof(why)), BRAID_ERR_PEER);
    ck_assert_msg(strstr(why, needle) != NULL, "reason '%s' lacks '%s'", why, needle);
}

START_TEST(info_rejects)
{
    braid_verbs_info i;
    i = sample_info();
    i.link_layer = 3;
    info_expect_reject(&i, "link layer");
    i = sample_info();
    i.mtu = 0;
    info_expect_reject(&i, "MTU");
    i = sample_info();
    i.mtu = 6;
    info_expect_reject(&i, "MTU");
    i = sample_info();
    i.qpn = 1;
    info_expect_reject(&i, "QP number");
    i = sample_info();
    i.qpn = 0x1000000;
    info_expect_reject(&i, "QP number");
    i = sample_info();
    i.psn = 0x1000000;
    info_expect_reject(&i, "PSN");
    i = sample_info();
    i.flags = 2;
    info_expect_reject(&i, "flags");
    i = sample_info();
    i.flags = 0;
    info_expect_reject(&i, "GID");
    i = sample_info();
    i.nslots = 0;
    info_expect_reject(&i, "slots");
    i = sample_info();
    i.nslots = BRAID_VERBS_MAX_SLOTS + 1;
    info_expect_reject(&i, "slots");
    i = sample_info();
    i.slot_bytes = 4095;
    info_expect_reject(&i, "-byte slots");
    i = sample_info();
    i.slot_bytes = BRAID_VERBS_MAX_SLOT_BYTES + 1;
    info_expect_reject(&i, "-byte slots");
    i = sample_info();
    i.ring_addr = 0;
    info_expect_reject(&i, "null ring");
    i = sample_info();
    i.rank = -1;
    info_expect_reject(&i, "negative rank");
    /* An InfiniBand peer routes by LID and may omit the GID. */
    i = sample_info();
    i.link_layer = BRAID_VERBS_LINK_IB;
    i.flags = 0;
    i.lid = 7;
    uint8_t buf[BRAID_VERBS_INFO_BYTES];
    braid_verbs_info out;
    braid__verbs_info_encode(&i, buf);
    ck_assert_int_eq(braid__verbs_info_decode(buf, sizeof(buf), &out, NULL, 0), BRAID_OK);

    char why[160];
    i = sample_info();
    braid__verbs_info_encode(&i, buf);
    ck_assert_int_eq(braid__verbs_info_decode(buf, sizeof(buf) - 1, &out, why, sizeof(why)), BRAID_ERR_PEER);
    ck_assert_ptr_nonnull(strstr(why, "63 bytes"));
    buf[0] = 'X';
    ck_assert_int_eq(braid__verbs_info_decode(buf, sizeof(buf), &out, why, sizeof(why)), BRAID_ERR_PEER);
    ck_assert_ptr_nonnull(strstr(why, "magic"));
    braid__verbs_info_encode(&i, buf);
    buf[4] = 2;
    ck_assert_int_eq(braid__verbs_info_decode(buf, sizeof(buf), &out, why, sizeof(why)), BRAID_ERR_PEER);
    ck_assert_ptr_nonnull(strstr(why, "version 2"));
    braid__verbs_info_encode(&i, buf);
    buf[63] = 1;
    ck_assert_int_eq(braid__verbs_info_decode(buf, sizeof(buf), &out, why, sizeof(why)), BRAID_ERR_PEER);
    ck_assert_ptr_nonnull(strstr(why, "reserved"));
}
END_TEST

/* Bit flips and random bytes: decode never reads out of bounds, and what
 * it accepts re-encodes to the same bytes. */
START_TEST(info_fuzz)
{
    rng_seed(7);
    braid_verbs_info base = sample_info(), out;
    uint8_t good[BRAID_VERBS_INFO_BYTES], buf[BRAID_VERBS_INFO_BYTES], again[BRAID_VERBS_INFO_BYTES];
    braid__verbs_info_encode(&base, good);
    for (int i = 0; i < 200000; i++) {
        memcpy(buf, good, sizeof(buf));
        int flips = 1 + (int)rng_below(4);
        for (int f = 0; f < flips; f++)
            buf[rng_below(sizeof(buf))] ^= (uint8_t)(1u << rng_below(8));
        if (i % 10 == 0)
            for (size_t k = 4; k < sizeof(buf); k++)
                buf[k] = (uint8_t)rng();
        size_t len = i % 97 == 0 ? rng_below(sizeof(buf) + 1) : sizeof(buf);
        if (braid__verbs_info_decode(buf, len, &out, NULL, 0) != BRAID_OK)
            continue;
        braid__verbs_info_encode(&out, again);
        ck_assert_mem_eq(again, buf, sizeof(buf));
    }
}
END_TEST

START_TEST(mtu_codes)
{
    ck_assert_uint_eq(braid__verbs_mtu_bytes(0), 0);
    ck_assert_uint_eq(braid__verbs_mtu_bytes(1), 256);
    ck_assert_uint_eq(braid__verbs_mtu_bytes(3), 1024);
    ck_assert_uint_eq(braid__verbs_mtu_bytes(5), 4096);
    ck_assert_uint_eq(braid__verbs_mtu_bytes(6), 0);
}
END_TEST

/* ---- device selection ------------------------------------------------------ */

START_TEST(hca_parse_ok)
{
    braid_verbs_hca h[BRAID_VERBS_HCA_MAX];
    int n;
    char why[160];
    ck_assert_int_eq(braid__verbs_hca_parse("mlx5_0", h, BRAID_VERBS_HCA_MAX, &n, why, sizeof(why)), BRAID_OK);
    ck_assert_int_eq(n, 1);
    ck_assert_str_eq(h[0].name, "mlx5_0");
    ck_assert_int_eq(h[0].port, 0);
    ck_assert_int_eq(braid__verbs_hca_parse("mlx5_0:2,rxe0, mlx5_3:1", h, BRAID_VERBS_HCA_MAX, &n, why, sizeof(why)),
                     BRAID_OK);
    ck_assert_int_eq(n, 3);
    ck_assert_str_eq(h[0].name, "mlx5_0");
    ck_assert_int_eq(h[0].port, 2);
    ck_assert_str_eq(h[1].name, "rxe0");
    ck_assert_int_eq(h[1].port, 0);
    ck_assert_str_eq(h[2].name, "mlx5_3");
    ck_assert_int_eq(h[2].port, 1);
    ck_assert_int_eq(braid__verbs_hca_parse("a:255", h, BRAID_VERBS_HCA_MAX, &n, why, sizeof(why)), BRAID_OK);
    ck_assert_int_eq(h[0].port, 255);
}
END_TEST

START_TEST(hca_parse_rejects)
{
    const char *bad[] = {"",
                         ",",
                         "a,",
                         ",a",
                         ":1",
                         "a:",
                         "a:0",
                         "a:256",
                         "a:x",
                         "a:1x",
                         "a:-1",
                         "a:99999999",
                         "a234567890123456789012345678901234567890123456789012345678901234"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        braid_verbs_hca h[BRAID_VERBS_HCA_MAX];
        int n = -1;
        char why[200] = "";
        ck_assert_msg(braid__verbs_hca_parse(bad[i], h, BRAID_VERBS_HCA_MAX, &n, why, sizeof(why)) ==
                          BRAID_ERR_INVALID_ARG,
                      "'%s' accepted", bad[i]);
        ck_assert_ptr_nonnull(strstr(why, "BRAID_IB_HCA"));
        ck_assert_int_eq(n, -1);
    }
    braid_verbs_hca h[2];
    int n;
    char why[200];
    ck_assert_int_eq(braid__verbs_hca_parse("a,b,c", h, 2, &n, why, sizeof(why)), BRAID_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(why, "more than 2"));
}
END_TEST

static void set_gid(uint8_t g[16], const char *kind, int tag)
{
    memset(g, 0, 16);
    if (!strcmp(kind, "v4")) {
        g[10] = g[11] = 0xff;
        g[12] = 10;
        g[15] = (uint8_t)tag;
    } else if (!strcmp(kind, "ll")) {
        g[0] = 0xfe;
        g[1] = 0x80;
        g[15] = (uint8_t)tag;
    } else if (!strcmp(kind, "v6")) {
        g[0] = 0xfd;
        g[15] = (uint8_t)tag;
    }
}

START_TEST(gid_pick_order)
{
    uint8_t g[6][16];
    braid_verbs_gid_type t[6];
    int present[6] = {1, 1, 1, 1, 1, 1};
    /* 0: v1 link-local, 1: v2 link-local, 2: v1 v4, 3: v2 v6, 4: v2 v4, 5: zero v2 */
    set_gid(g[0], "ll", 1);
    t[0] = BRAID_VERBS_GID_ROCE_V1;
    set_gid(g[1], "ll", 1);
    t[1] = BRAID_VERBS_GID_ROCE_V2;
    set_gid(g[2], "v4", 2);
    t[2] = BRAID_VERBS_GID_ROCE_V1;
    set_gid(g[3], "v6", 3);
    t[3] = BRAID_VERBS_GID_ROCE_V2;
    set_gid(g[4], "v4", 4);
    t[4] = BRAID_VERBS_GID_ROCE_V2;
    set_gid(g[5], "zero", 0);
    t[5] = BRAID_VERBS_GID_ROCE_V2;
    ck_assert_int_eq(braid__verbs_gid_pick((const uint8_t(*)[16])g, t, present, 6), 4);
    present[4] = 0; /* unreadable entry */
    ck_assert_int_eq(braid__verbs_gid_pick((const uint8_t(*)[16])g, t, present, 6), 3);
    present[3] = 0;
    ck_assert_int_eq(braid__verbs_gid_pick((const uint8_t(*)[16])g, t, present, 6), 1);
    present[1] = 0;
    ck_assert_int_eq(braid__verbs_gid_pick((const uint8_t(*)[16])g, t, present, 6), -1); /* only v1 / zero */
    ck_assert_int_eq(braid__verbs_gid_pick((const uint8_t(*)[16])g, t, present, 0), -1);
}
END_TEST

/* ---- registration cache ---------------------------------------------------- */

#define FAKE_MAX 4096

/* Fake registrar: remembers every live registration so the tests can see
 * leaks, double deregistrations, and coverage of what the cache returns. */
typedef struct {
    uintptr_t start, end;
    int live;
} fake_entry;

typedef struct {
    fake_entry regs[FAKE_MAX];
    int count, live, fail_next, fail_over;
    size_t fail_len_over; /* fail registrations longer than this (0: never) */
} fake_registrar;

static int fake_reg(void *ctx, void *addr, size_t len, void **mr, uint32_t *lkey)
{
    fake_registrar *f = ctx;
    if (f->fail_next) {
        f->fail_next--;
        return EFAULT;
    }
    if (f->fail_len_over && len > f->fail_len_over)
        return EFAULT;
    ck_assert_int_lt(f->count, FAKE_MAX);
    int i = f->count++;
    f->regs[i].start = (uintptr_t)addr;
    f->regs[i].end = (uintptr_t)addr + len;
    f->regs[i].live = 1;
    f->live++;
    *mr = &f->regs[i];
    *lkey = (uint32_t)i + 1000;
    return 0;
}

static void fake_dereg(void *ctx, void *mr)
{
    fake_registrar *f = ctx;
    fake_entry *r = mr;
    ck_assert_msg(r->live, "double deregistration");
    r->live = 0;
    f->live--;
}

static fake_registrar *fake;

static void cache_init(braid_verbs_regcache *rc, size_t max_regions, size_t max_bytes)
{
    fake = calloc(1, sizeof(*fake));
    ck_assert_ptr_nonnull(fake);
    braid_verbs_regcache_cfg cfg = {.reg = fake_reg,
                                    .dereg = fake_dereg,
                                    .ctx = fake,
                                    .page_bytes = 4096,
                                    .max_regions = max_regions,
                                    .max_bytes = max_bytes};
    ck_assert_int_eq(braid__verbs_regcache_init(rc, &cfg), 0);
}

static void cache_done(braid_verbs_regcache *rc)
{
    ck_assert_uint_eq(braid__verbs_regcache_fini(rc), 0);
    ck_assert_int_eq(fake->live, 0);
    free(fake);
}

#define A(x) ((void *)(uintptr_t)(x))

START_TEST(cache_hit_miss)
{
    braid_verbs_regcache rc;
    cache_init(&rc, 16, SIZE_MAX);
    braid_verbs_region *r1, *r2, *r3;
    ck_assert_int_eq(braid__verbs_regcache_acquire(&rc, A(0x10010), 100, 1, &r1), 0);
    ck_assert_uint_eq(rc.stats.misses, 1);
    ck_assert_uint_eq(r1->start, 0x10000); /* page-aligned */
    ck_assert_uint_eq(r1->end, 0x11000);
    ck_assert_uint_eq(r1->lkey, 1000);
    /* Same page, other buffer: a hit on the same region. */
    ck_assert_int_eq(braid__verbs_regcache_acquire(&rc, A(0x10800), 0x800, 0, &r2), 0);
    ck_assert_ptr_eq(r1, r2);
    ck_assert_uint_eq(rc.stats.hits, 1);
    ck_assert_int_eq(r1->refs, 2);
    /* Past the page: lookup-only misses, creating registers. */
    ck_assert_int_eq(braid__verbs_regcache_acquire(&rc, A(0x10800), 0x801, 0, &r3), ENOENT);
    ck_assert_int_eq(braid__verbs_regcache_acquire(&rc, A(0x20000), 1, 0, &r3), ENOENT);
    ck_assert_int_eq(braid__verbs_regcache_acquire(&rc, A(0x20000), 1, 1, &r3), 0);
    ck_assert_ptr_ne(r3, r1);
    ck_assert_uint_eq(rc.count, 2);
    braid__verbs_regcache_release(&rc, r1);
    braid__verbs_regcache_release(&rc, r2);
    braid__verbs_regcache_release(&rc, r3);
    /* Released regions stay cached. */
    ck_assert_uint_eq(rc.count, 2);
    ck_assert_int_eq(fake->live, 2);
    ck_assert_int_eq(braid__verbs_regcache_acquire(&rc, A(0x10000), 4096, 0, &r1), 0);
    braid__verbs_regcache_release(&rc, r1);
    /* Bad ranges. */
    ck_assert_int_eq(braid__verbs_regcache_acquire(&rc, A(0x1000), 0, 1, &r1), EINVAL);
    ck_assert_int_eq(braid__verbs_regcache_acquire(&rc, A(UINTPTR_MAX - 10), 100, 1, &r1), EINVAL);
    cache_done(&rc);
}
END_TEST

START_TEST(cache_overlap_merges)
{
    braid_verbs_regcache rc;
    cache_init(&rc, 16, SIZE_MAX);
    braid_verbs_region *a, *b, *c;
    ck_assert_int_eq(braid__verbs_regcache_acquire(&rc, A(0x10000), 0x2000, 1, &a), 0);
    ck_assert_int_eq(braid__verbs_regcache_acquire(&rc, A(0x14000), 0x1000, 1, &b), 0);
    braid__verbs_regcache_release(&rc, b);
    ck_assert_uint_eq(rc.count, 2);
    /* [0x11000, 0x14800) overlaps both: one region for the union; b (idle)
     * is deregistered now, a (in use) lives on out of the index. */
    ck_assert_int_eq(braid__verbs_regcache_acquire(&rc, A(0x11000), 0x3800, 1, &c), 0);
    ck_assert_uint_eq(c->start, 0x10000);
    ck_assert_uint_eq(c->end, 0x15000);
    ck_assert_uint_eq(rc.count, 1);
    ck_assert_uint_eq(rc.stats.retired, 2);
    ck_assert_int_eq(fake->live, 2); /* a and c */
    ck_assert_int_eq(a->indexed, 0);
    braid__verbs_regcache_release(&rc, a); /* last user of a: deregistered */
    ck_assert_int_eq(fake->live, 1);
    /* Everything inside the union hits. */
    braid_verbs_region *d;
    ck_assert_int_eq(braid__verbs_regcache_acquire(&rc, A(0x10000), 0x5000, 0, &d), 0);
    ck_assert_ptr_eq(d, c);
    braid__verbs_regcache_release(&rc, d);
    braid__verbs_regcache_release(&rc, c);
    /* Adjacent but not overlapping: kept apart. */
    ck_assert_int_eq(braid__verbs_regcache_acquire(&rc, A(0x15000), 0x1000, 1, &d), 0);
    ck_assert_uint_eq(rc.count, 2);
    braid__verbs_regcache_release(&rc, d);
    cache_done(&rc);
}
END_TEST

START_TEST(cache_union_fallback)
{
    braid_verbs_regcache rc;
    cache_init(&rc, 16, SIZE_MAX);
    braid_verbs_region *a, *b;
    ck_assert_int_eq(braid__verbs_regcache_acquire(&rc, A(0x100000), 0x10000, 1, &a), 0);
    braid__verbs_regcache_release(&rc, a);
    /* The union would be 0x20000 bytes; pretend it spans a hole. */
    fake->fail_len_over = 0x10000;
    ck_assert_int_eq(braid__verbs_regcache_acquire(&rc, A(0x10f000), 0x10000, 1, &b), 0);
    ck_assert_uint_eq(b->start, 0x10f000);
    ck_assert_uint_eq(b->end, 0x11f000);
    ck_assert_uint_eq(rc.count, 1); /* the overlapped region was retired */
    braid__verbs_regcache_release(&rc, b);
    /* A failing registration leaves the cache as it was. */
    fake->fail_len_over = 0;
    fake->fail_next = 1;
    size_t before = rc.count;
    ck_assert_int_eq(braid__verbs_regcache_acquire(&rc, A(0x300000), 10, 1, &b), EFAULT);
    ck_assert_uint_eq(rc.count, before);
    cache_done(&rc);
}
END_TEST

START_TEST(cache_lru_eviction)
{
    braid_verbs_regcache rc;
    cache_init(&rc, 3, SIZE_MAX);
    braid_verbs_region *r[5];
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(braid__verbs_regcache_acquire(&rc, A(0x100000 * (i + 1)), 10, 1, &r[i]), 0);
        braid__verbs_regcache_release(&rc, r[i]);
    }
    /* Touch region 0 so region 1 is the oldest. */
    ck_assert_int_eq(braid__verbs_regcache_acquire(&rc, A(0x100000), 10, 0, &r[0]), 0);
    braid__verbs_regcache_release(&rc, r[0]);
    ck_assert_int_eq(braid__verbs_regcache_acquire(&rc, A(0x400000), 10, 1, &r[3]), 0);
    braid__verbs_regcache_release(&rc, r[3]);
    ck_assert_uint_eq(rc.count, 3);
    ck_assert_uint_eq(rc.stats.evictions, 1);
    braid_verbs_region *x;
    ck_assert_int_eq(braid__verbs_regcache_acquire(&rc, A(0x200000), 10, 0, &x), ENOENT); /* evicted */
    ck_assert_int_eq(braid__verbs_regcache_acquire(&rc, A(0x100000), 10, 0, &x), 0);
    braid__verbs_regcache_release(&rc, x);
    ck_assert_int_eq(braid__verbs_regcache_acquire(&rc, A(0x300000), 10, 0, &x), 0);
    braid__verbs_regcache_release(&rc, x);
    /* Regions in use are never evicted, even over the limit. */
    braid_verbs_region *held[4];
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(braid__verbs_regcache_acquire(&rc, A(0x1000000 * (i + 1)), 10, 1, &held[i]), 0);
    ck_assert_uint_eq(rc.count, 4);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(held[i]->indexed, 1);
    for (int i = 0; i < 4; i++)
        braid__verbs_regcache_release(&rc, held[i]);
    ck_assert_uint_eq(rc.count, 3);
    ck_assert_int_eq(fake->live, 3);
    cache_done(&rc);
}
END_TEST

START_TEST(cache_byte_limit)
{
    braid_verbs_regcache rc;
    cache_init(&rc, 100, 0x10000);
    braid_verbs_region *a, *b;
    ck_assert_int_eq(braid__verbs_regcache_acquire(&rc, A(0x100000), 0x8000, 1, &a), 0);
    braid__verbs_regcache_release(&rc, a);
    ck_assert_int_eq(braid__verbs_regcache_acquire(&rc, A(0x200000), 0x9000, 1, &b), 0);
    braid__verbs_regcache_release(&rc, b);
    ck_assert_uint_eq(rc.count, 1); /* 0x11000 > 0x10000: the older one went */
    ck_assert_uint_eq(rc.bytes, 0x9000);
    ck_assert_int_eq(braid__verbs_regcache_acquire(&rc, A(0x200000), 1, 0, &b), 0);
    braid__verbs_regcache_release(&rc, b);
    cache_done(&rc);
}
END_TEST

START_TEST(cache_invalidate)
{
    braid_verbs_regcache rc;
    cache_init(&rc, 16, SIZE_MAX);
    braid_verbs_region *a, *b, *c;
    ck_assert_int_eq(braid__verbs_regcache_acquire(&rc, A(0x10000), 0x1000, 1, &a), 0);
    ck_assert_int_eq(braid__verbs_regcache_acquire(&rc, A(0x20000), 0x1000, 1, &b), 0);
    ck_assert_int_eq(braid__verbs_regcache_acquire(&rc, A(0x30000), 0x1000, 1, &c), 0);
    braid__verbs_regcache_release(&rc, a);
    braid__verbs_regcache_release(&rc, c);
    /* [0x10800, 0x20001) touches a and b but not c. */
    braid__verbs_regcache_invalidate(&rc, A(0x10800), 0x10000 - 0x800 + 1);
    ck_assert_uint_eq(rc.count, 1);
    ck_assert_int_eq(fake->live, 2); /* b still in use, c cached */
    braid_verbs_region *x;
    ck_assert_int_eq(braid__verbs_regcache_acquire(&rc, A(0x20000), 1, 0, &x), ENOENT);
    braid__verbs_regcache_release(&rc, b);
    ck_assert_int_eq(fake->live, 1);
    braid__verbs_regcache_invalidate(&rc, A(0x0), 0); /* empty range: no-op */
    ck_assert_uint_eq(rc.count, 1);
    cache_done(&rc);
}
END_TEST

START_TEST(cache_fini_reports_leaks)
{
    braid_verbs_regcache rc;
    cache_init(&rc, 16, SIZE_MAX);
    braid_verbs_region *a;
    ck_assert_int_eq(braid__verbs_regcache_acquire(&rc, A(0x10000), 1, 1, &a), 0);
    ck_assert_uint_eq(braid__verbs_regcache_fini(&rc), 1);
    ck_assert_int_eq(fake->live, 0);
    free(fake);
}
END_TEST

static void cache_check_invariants(const braid_verbs_regcache *rc)
{
    size_t bytes = 0;
    for (size_t i = 0; i < rc->count; i++) {
        const braid_verbs_region *r = rc->index[i];
        ck_assert(r->indexed);
        ck_assert_uint_lt(r->start, r->end);
        ck_assert_uint_eq(r->start % 4096, 0);
        ck_assert_uint_eq(r->end % 4096, 0);
        ck_assert(((fake_registrar *)rc->cfg.ctx)->regs[r->lkey - 1000].live);
        if (i)
            ck_assert_uint_le(rc->index[i - 1]->end, r->start);
        bytes += r->end - r->start;
    }
    ck_assert_uint_eq(bytes, rc->bytes);
    size_t lru = 0;
    for (const braid_verbs_region *r = rc->lru_head; r; r = r->lru_next) {
        ck_assert_int_eq(r->refs, 0);
        ck_assert(r->indexed);
        lru++;
    }
    ck_assert_uint_le(lru, rc->count);
}

/* Random workload against the invariants: sorted, disjoint, page-aligned
 * index; every held region still registered and covering what it was
 * asked for; nothing leaked or deregistered twice at the end. */
START_TEST(cache_random)
{
    braid_verbs_regcache rc;
    cache_init(&rc, 8, 64 * 4096);
    rng_seed(99);
    enum { HELD = 32 };
    struct {
        braid_verbs_region *r;
        uintptr_t a;
        size_t len;
    } held[HELD] = {{0}};
    for (int step = 0; step < 3000; step++) {
        int k = (int)rng_below(HELD);
        uint32_t op = rng_below(10);
        if (op < 5 && !held[k].r) {
            uintptr_t a = 0x100000 + (uintptr_t)rng_below(256) * 1024;
            size_t len = 1 + rng_below(6 * 4096);
            braid_verbs_region *r;
            int err = braid__verbs_regcache_acquire(&rc, A(a), len, op < 4, &r);
            if (err == 0) {
                ck_assert_uint_le(r->start, a);
                ck_assert_uint_ge(r->end, a + len);
                held[k].r = r;
                held[k].a = a;
                held[k].len = len;
            } else {
                ck_assert_int_eq(err, ENOENT);
            }
        } else if (op < 9 && held[k].r) {
            braid__verbs_regcache_release(&rc, held[k].r);
            held[k].r = NULL;
        } else if (op == 9) {
            braid__verbs_regcache_invalidate(&rc, A(0x100000 + (uintptr_t)rng_below(256) * 1024), rng_below(8192));
        }
        for (int i = 0; i < HELD; i++)
            if (held[i].r)
                ck_assert(fake->regs[held[i].r->lkey - 1000].live);
        cache_check_invariants(&rc);
    }
    for (int i = 0; i < HELD; i++)
        if (held[i].r)
            braid__verbs_regcache_release(&rc, held[i].r);
    cache_done(&rc);
}
END_TEST

/* ---- engine over a simulated fabric ---------------------------------------- */

#define SIM_WIRE 1024
#define SIM_CQ 2048

typedef struct {
    int is_write;
    uint32_t slot, len, imm;
    const uint8_t *src;
    uint64_t wr_id;
} sim_pkt;

typedef struct {
    int is_send, error;
    uint64_t wr_id;
    uint32_t imm, byte_len;
    int is_write;
} sim_cqe;

typedef struct sim_side sim_side;
struct sim_side {
    braid_verbs_engine e;
    sim_side *peer;
    uint8_t *ring, *stage;
    uint32_t slots, slot_bytes;
    uint32_t sq_depth, rq_depth;
    uint32_t sq_used;       /* posted sends not yet completed */
    int64_t rq_free;        /* posted receives not yet consumed */
    sim_pkt wire[SIM_WIRE]; /* posted, not yet executed by the "hardware" */
    uint32_t w_first, w_count;
    sim_cqe cq[SIM_CQ];
    uint32_t c_first, c_count;
    uint64_t credit_msgs, data_chunks;
    uint64_t chunks_landed; /* data writes executed into this side's ring */
    int zcopy;              /* offer zero copy for every send */
    int tokens_out;
    int post_fail; /* next post returns this errno */
};

static int sim_post(sim_side *s, const sim_pkt *p)
{
    if (s->post_fail) {
        int err = s->post_fail;
        s->post_fail = 0;
        return err;
    }
    ck_assert_msg(s->sq_used < s->sq_depth, "send queue overflow (%u of %u)", s->sq_used, s->sq_depth);
    ck_assert_uint_lt(s->w_count, SIM_WIRE);
    s->wire[(s->w_first + s->w_count++) % SIM_WIRE] = *p;
    s->sq_used++;
    return 0;
}

static int sim_write_imm(void *ctx, uint32_t slot, const void *src, uint32_t lkey, uint32_t len, uint32_t imm,
                         uint64_t wr_id)
{
    sim_side *s = ctx;
    (void)lkey;
    ck_assert_uint_lt(slot, s->peer->slots);
    ck_assert_uint_le(len, s->peer->slot_bytes);
    s->data_chunks++;
    sim_pkt p = {.is_write = 1, .slot = slot, .len = len, .imm = imm, .src = src, .wr_id = wr_id};
    return sim_post(s, &p);
}

static int sim_send_imm(void *ctx, uint32_t imm, uint64_t wr_id)
{
    sim_side *s = ctx;
    if (BRAID_VERBS_WR_KIND(wr_id) == BRAID_VERBS_WR_CREDIT)
        s->credit_msgs++;
    sim_pkt p = {.is_write = 0, .imm = imm, .wr_id = wr_id};
    return sim_post(s, &p);
}

static int sim_zcopy_get(void *ctx, const void *buf, size_t len, uint32_t *lkey, void **token)
{
    sim_side *s = ctx;
    (void)buf;
    (void)len;
    if (!s->zcopy)
        return ENOENT;
    *lkey = 77;
    *token = s;
    s->tokens_out++;
    return 0;
}

static void sim_zcopy_put(void *ctx, void *token)
{
    sim_side *s = ctx;
    ck_assert_ptr_eq(token, s);
    ck_assert_int_gt(s->tokens_out, 0);
    s->tokens_out--;
}

static void cq_push(sim_side *s, sim_cqe e)
{
    ck_assert_uint_lt(s->c_count, SIM_CQ);
    s->cq[(s->c_first + s->c_count++) % SIM_CQ] = e;
}

/* The "hardware" executes s's oldest posted work request: the data lands
 * in the peer's ring (read from the source only now, as DMA would), the
 * peer gets its receive completion and s its send completion. */
static int sim_deliver(sim_side *s)
{
    if (!s->w_count)
        return 0;
    sim_pkt p = s->wire[s->w_first];
    s->w_first = (s->w_first + 1) % SIM_WIRE;
    s->w_count--;
    sim_side *d = s->peer;
    ck_assert_msg(d->rq_free > 0, "receiver not ready (RNR): the receive queue depth is too small");
    d->rq_free--;
    if (p.is_write) {
        /* The chunk number this slot holds must not be a wrap-around onto
         * a chunk the receiver has not copied out. */
        uint64_t k = d->chunks_landed++;
        ck_assert_msg(k < d->e.rx.consumed + d->slots, "write into an unconsumed slot");
        ck_assert_uint_eq(p.slot, k % d->slots);
        if (p.len)
            memcpy(d->ring + (size_t)p.slot * d->slot_bytes, p.src, p.len);
    }
    cq_push(d, (sim_cqe){.is_send = 0, .imm = p.imm, .byte_len = p.len, .is_write = p.is_write});
    cq_push(s, (sim_cqe){.is_send = 1, .wr_id = p.wr_id});
    return 1;
}

/* Poll up to max completions into the engine, as verbs_cq.c does. */
static braid_status sim_poll(sim_side *s, uint32_t max, int *moved)
{
    *moved = 0;
    for (uint32_t i = 0; i < max && s->c_count; i++) {
        sim_cqe c = s->cq[s->c_first];
        s->c_first = (s->c_first + 1) % SIM_CQ;
        s->c_count--;
        *moved = 1;
        braid_status st;
        if (c.is_send) {
            s->sq_used--;
            st = c.error ? braid__verbs_engine_on_error(&s->e, c.wr_id, "simulated failure")
                         : braid__verbs_engine_on_send(&s->e, c.wr_id);
        } else {
            s->rq_free++; /* reposted at once */
            st = braid__verbs_engine_on_recv(&s->e, c.imm, c.byte_len, c.is_write);
        }
        if (st != BRAID_OK)
            return st;
    }
    int m;
    braid_status st = braid__verbs_engine_advance(&s->e, &m);
    *moved |= m;
    return st;
}

static void sim_side_init(sim_side *s, sim_side *peer, uint32_t slots, uint32_t slot_bytes, int rank)
{
    memset(s, 0, sizeof(*s));
    s->peer = peer;
    s->slots = slots;
    s->slot_bytes = slot_bytes;
    s->ring = calloc(slots, slot_bytes);
    ck_assert_ptr_nonnull(s->ring);
    (void)rank;
}

/* Connect both sides with their own geometries, as set-up would. */
static void sim_connect(sim_side *a, sim_side *b, size_t zcopy_min)
{
    sim_side *sides[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        sim_side *s = sides[i], *p = s->peer;
        uint32_t window = p->slots < s->slots ? p->slots : s->slots;
        s->stage = calloc(window, p->slot_bytes);
        ck_assert_ptr_nonnull(s->stage);
        s->sq_depth = BRAID_VERBS_SQ_DEPTH(s->slots);
        s->rq_depth = BRAID_VERBS_RQ_DEPTH(s->slots, s->slots);
        s->rq_free = s->rq_depth;
        braid_verbs_engine_cfg cfg = {.rank = i,
                                      .peer = 1 - i,
                                      .rx_ring = s->ring,
                                      .rx_slots = s->slots,
                                      .rx_slot_bytes = s->slot_bytes,
                                      .tx_slots = p->slots,
                                      .tx_slot_bytes = p->slot_bytes,
                                      .tx_window = window,
                                      .tx_stage = s->stage,
                                      .tx_stage_lkey = 5,
                                      .zcopy_min = zcopy_min};
        braid_verbs_io io = {.ctx = s,
                             .write_imm = sim_write_imm,
                             .send_imm = sim_send_imm,
                             .zcopy_get = sim_zcopy_get,
                             .zcopy_put = sim_zcopy_put};
        ck_assert_int_eq(braid__verbs_engine_init(&s->e, &cfg, &io), BRAID_OK);
    }
}

static void sim_free(sim_side *s)
{
    braid__verbs_engine_fini(&s->e);
    ck_assert_int_eq(s->tokens_out, 0);
    free(s->ring);
    free(s->stage);
}

static void fill(uint8_t *buf, size_t len, uint64_t seed)
{
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 12345;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        buf[i] = (uint8_t)(x >> 24);
    }
}

/* One direction of traffic: messages a sender posts and a receiver
 * expects, at most `depth` of each outstanding, checked in order. */
#define MAXMSG 64
#define DEPTH 6

typedef struct {
    sim_side *from, *to;
    size_t sizes[MAXMSG];
    int n;
    uint64_t seed;
    uint8_t *sbuf[MAXMSG], *rbuf[MAXMSG];
    braid_req sreq[MAXMSG], rreq[MAXMSG];
    int sent_posted, sent_done, recv_posted, recv_done;
} flow;

static void flow_init(flow *f, sim_side *from, sim_side *to, const size_t *sizes, int n, uint64_t seed)
{
    memset(f, 0, sizeof(*f));
    f->from = from;
    f->to = to;
    f->n = n;
    f->seed = seed;
    for (int i = 0; i < n; i++) {
        f->sizes[i] = sizes[i];
        f->sbuf[i] = malloc(sizes[i] ? sizes[i] : 1);
        f->rbuf[i] = malloc(sizes[i] ? sizes[i] : 1);
        ck_assert(f->sbuf[i] && f->rbuf[i]);
        fill(f->sbuf[i], sizes[i], seed + (uint64_t)i);
        memset(f->rbuf[i], 0xEE, sizes[i]);
    }
}

static void flow_free(flow *f)
{
    for (int i = 0; i < f->n; i++) {
        free(f->sbuf[i]);
        free(f->rbuf[i]);
    }
}

static int flow_done(const flow *f)
{
    return f->sent_done == f->n && f->recv_done == f->n;
}

/* Post what the depth allows, retire completions in order and check them.
 * A finished send's buffer is scribbled on at once: if the engine (or its
 * DMA) still read it, the receiver would see the scribble. */
static void flow_step(flow *f)
{
    if (f->sent_posted < f->n && f->sent_posted - f->sent_done < DEPTH && rng_below(2)) {
        int i = f->sent_posted++;
        ck_assert_int_eq(braid__verbs_engine_isend(&f->from->e, &f->sreq[i], f->sbuf[i], f->sizes[i]), BRAID_OK);
    }
    if (f->recv_posted < f->n && f->recv_posted - f->recv_done < DEPTH && rng_below(2)) {
        int i = f->recv_posted++;
        ck_assert_int_eq(braid__verbs_engine_irecv(&f->to->e, &f->rreq[i], f->rbuf[i], f->sizes[i]), BRAID_OK);
    }
    for (int i = f->sent_done; i < f->sent_posted; i++) {
        if (!f->sreq[i].done)
            break;
        ck_assert_int_eq(i, f->sent_done); /* in order */
        ck_assert_uint_eq(f->sreq[i].moved, f->sizes[i]);
        memset(f->sbuf[i], 0x5A, f->sizes[i]);
        f->sent_done++;
    }
    for (int i = f->sent_done; i < f->sent_posted; i++)
        ck_assert_msg(!f->sreq[i].done, "send %d finished before send %d", i, f->sent_done);
    for (int i = f->recv_done; i < f->recv_posted; i++) {
        if (!f->rreq[i].done)
            break;
        uint8_t *want = malloc(f->sizes[i] ? f->sizes[i] : 1);
        fill(want, f->sizes[i], f->seed + (uint64_t)i);
        ck_assert_msg(memcmp(want, f->rbuf[i], f->sizes[i]) == 0, "message %d (%zu bytes) corrupted", i, f->sizes[i]);
        free(want);
        ck_assert_uint_eq(f->rreq[i].moved, f->sizes[i]);
        f->recv_done++;
    }
}

/* Run two flows (a->b and b->a) to completion under a random schedule of
 * deliveries and polls. */
static void run_flows(sim_side *a, sim_side *b, flow *ab, flow *ba)
{
    long steps = 0;
    while (!flow_done(ab) || !flow_done(ba)) {
        ck_assert_msg(++steps < 2000000, "no progress: stuck (deadlock?) after %ld steps", steps);
        flow_step(ab);
        flow_step(ba);
        int moved;
        switch (rng_below(4)) {
        case 0:
            for (uint32_t k = rng_below(8); k > 0 && sim_deliver(a); k--)
                ;
            break;
        case 1:
            for (uint32_t k = rng_below(8); k > 0 && sim_deliver(b); k--)
                ;
            break;
        case 2:
            ck_assert_int_eq(sim_poll(a, 1 + rng_below(40), &moved), BRAID_OK);
            break;
        case 3:
            ck_assert_int_eq(sim_poll(b, 1 + rng_below(40), &moved), BRAID_OK);
            break;
        }
    }
    /* Drain what is still in flight (credits, completions). */
    for (int i = 0; i < 1000 && (a->w_count || b->w_count || a->c_count || b->c_count); i++) {
        int moved;
        sim_deliver(a);
        sim_deliver(b);
        ck_assert_int_eq(sim_poll(a, 64, &moved), BRAID_OK);
        ck_assert_int_eq(sim_poll(b, 64, &moved), BRAID_OK);
    }
    ck_assert(braid__verbs_engine_drained(&a->e));
    ck_assert(braid__verbs_engine_drained(&b->e));
}

START_TEST(engine_sizes)
{
    const uint32_t slot = 4096;
    const size_t sizes[] = {0, 1, slot - 1, slot, slot + 1, 2 * slot, 5 * slot + 3, 40 * slot + 1, 0, 7, 3 * slot};
    const int n = (int)(sizeof(sizes) / sizeof(sizes[0]));
    for (int zc = 0; zc < 2; zc++) {
        rng_seed(5 + (uint64_t)zc);
        sim_side a, b;
        sim_side_init(&a, &b, 8, slot, 0);
        sim_side_init(&b, &a, 8, slot, 1);
        sim_connect(&a, &b, zc ? 1 : 0);
        a.zcopy = b.zcopy = zc;
        flow ab, ba;
        flow_init(&ab, &a, &b, sizes, n, 1000);
        flow_init(&ba, &b, &a, sizes, n, 2000);
        run_flows(&a, &b, &ab, &ba);
        /* 40 slots through an 8-slot ring: credits came back in batches,
         * fewer messages than chunks. */
        ck_assert_uint_lt(b.credit_msgs, a.data_chunks);
        flow_free(&ab);
        flow_free(&ba);
        sim_free(&a);
        sim_free(&b);
    }
}
END_TEST

START_TEST(engine_random)
{
    for (int round = 0; round < 60; round++) {
        rng_seed(1000 + (uint64_t)round);
        uint32_t slots_a = 1 + rng_below(12), slots_b = 1 + rng_below(12);
        uint32_t bytes_a = 4096u << rng_below(2), bytes_b = 4096u << rng_below(2);
        sim_side a, b;
        sim_side_init(&a, &b, slots_a, bytes_a, 0);
        sim_side_init(&b, &a, slots_b, bytes_b, 1);
        int zc = round % 3 == 2;
        sim_connect(&a, &b, zc ? 10000 : 0);
        a.zcopy = b.zcopy = zc;
        size_t sa[MAXMSG], sb[MAXMSG];
        int n = 10 + (int)rng_below(40);
        for (int i = 0; i < n; i++) {
            uint32_t kind = rng_below(6);
            sa[i] = kind == 0 ? 0 : kind < 3 ? rng_below(100) : kind < 5 ? rng_below(20000) : rng_below(200000);
            sb[i] = rng_below(3) ? rng_below(9000) : rng_below(150000);
        }
        flow ab, ba;
        flow_init(&ab, &a, &b, sa, n, 10 * (uint64_t)round);
        flow_init(&ba, &b, &a, sb, n, 10 * (uint64_t)round + 5);
        run_flows(&a, &b, &ab, &ba);
        flow_free(&ab);
        flow_free(&ba);
        sim_free(&a);
        sim_free(&b);
    }
}
END_TEST

/* Pair with default geometry, for the failure tests. */
static void pair(sim_side *a, sim_side *b)
{
    sim_side_init(a, b, 4, 4096, 0);
    sim_side_init(b, a, 4, 4096, 1);
    sim_connect(a, b, 0);
}

static void settle(sim_side *a, sim_side *b, braid_status *sa, braid_status *sb)
{
    *sa = *sb = BRAID_OK;
    for (int i = 0; i < 100; i++) {
        int moved;
        sim_deliver(a);
        sim_deliver(b);
        if (*sa == BRAID_OK)
            *sa = sim_poll(a, 64, &moved);
        if (*sb == BRAID_OK)
            *sb = sim_poll(b, 64, &moved);
    }
}

START_TEST(engine_length_mismatch)
{
    for (int longer = 0; longer < 2; longer++) {
        sim_side a, b;
        pair(&a, &b);
        uint8_t sbuf[10000] = {0}, rbuf[10000];
        braid_req s, r;
        size_t slen = longer ? 9000 : 100, rlen = longer ? 5000 : 200;
        ck_assert_int_eq(braid__verbs_engine_isend(&a.e, &s, sbuf, slen), BRAID_OK);
        ck_assert_int_eq(braid__verbs_engine_irecv(&b.e, &r, rbuf, rlen), BRAID_OK);
        braid_status sa, sb;
        settle(&a, &b, &sa, &sb);
        ck_assert_int_eq(sb, BRAID_ERR_MISMATCH);
        ck_assert_ptr_nonnull(strstr(braid_last_error(), "rank 1: verbs connection to peer 0"));
        ck_assert_ptr_nonnull(strstr(braid_last_error(), "disagree"));
        /* Sticky, with its text, and the request is left alone. */
        braid_req r2;
        ck_assert_int_eq(braid__verbs_engine_irecv(&b.e, &r2, rbuf, 1), BRAID_ERR_MISMATCH);
        ck_assert_ptr_nonnull(strstr(braid_last_error(), "disagree"));
        ck_assert_int_eq(r.done, 0);
        sim_free(&a);
        sim_free(&b);
    }
}
END_TEST

START_TEST(engine_close)
{
    sim_side a, b;
    pair(&a, &b);
    uint8_t msg[6000], got[6000];
    fill(msg, sizeof(msg), 3);
    braid_req s, r, r2;
    ck_assert_int_eq(braid__verbs_engine_isend(&a.e, &s, msg, sizeof(msg)), BRAID_OK);
    ck_assert_int_eq(braid__verbs_engine_close(&a.e), 1);
    ck_assert_int_eq(braid__verbs_engine_close(&a.e), 0); /* once */
    braid_status sa, sb;
    settle(&a, &b, &sa, &sb);
    ck_assert_int_eq(sa, BRAID_OK);
    ck_assert_int_eq(sb, BRAID_OK);
    ck_assert(b.e.peer_closed);
    ck_assert(braid__verbs_engine_drained(&a.e));
    /* What arrived before the goodbye is still delivered... */
    ck_assert_int_eq(braid__verbs_engine_irecv(&b.e, &r, got, sizeof(got)), BRAID_OK);
    ck_assert_int_eq(r.done, 1);
    ck_assert_mem_eq(got, msg, sizeof(msg));
    /* ...but nothing more will come, and nothing can be sent. */
    ck_assert_int_eq(braid__verbs_engine_irecv(&b.e, &r2, got, 10), BRAID_ERR_PEER);
    ck_assert_ptr_nonnull(strstr(braid_last_error(), "closed the connection while a 10-byte receive"));
    sim_free(&a);
    sim_free(&b);

    pair(&a, &b);
    ck_assert_int_eq(braid__verbs_engine_close(&a.e), 1);
    settle(&a, &b, &sa, &sb);
    ck_assert_int_eq(braid__verbs_engine_isend(&b.e, &s, msg, 10), BRAID_ERR_PEER);
    ck_assert_ptr_nonnull(strstr(braid_last_error(), "cannot send"));
    /* The one who got a goodbye sends none back. */
    ck_assert_int_eq(braid__verbs_engine_close(&b.e), 0);
    sim_free(&a);
    sim_free(&b);
}
END_TEST

START_TEST(engine_bad_peer)
{
    struct {
        uint32_t imm, len;
        int is_write;
        const char *needle;
    } cases[] = {
        {0xC0000000u, 0, 0, "reserved"},
        {braid__verbs_imm_data(1, 10, 1), 10, 1, "expected slot 0"},
        {braid__verbs_imm_data(0, 10, 1), 11, 1, "announced 10"},
        {braid__verbs_imm_data(0, 10, 1), 10, 0, "as a send"},
        {braid__verbs_imm_credit(1), 0, 1, "as an RDMA write"},
        {braid__verbs_imm_credit(1), 0, 0, "returned 1 credits"},
        {braid__verbs_imm_data(9, 10, 1), 10, 1, "slot 9"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        sim_side a, b;
        pair(&a, &b);
        ck_assert_int_eq(braid__verbs_engine_on_recv(&b.e, cases[i].imm, cases[i].len, cases[i].is_write),
                         BRAID_ERR_PEER);
        ck_assert_msg(strstr(braid_last_error(), cases[i].needle) != NULL, "case %zu: '%s' lacks '%s'", i,
                      braid_last_error(), cases[i].needle);
        ck_assert_ptr_nonnull(strstr(braid_last_error(), "peer 0"));
        sim_free(&a);
        sim_free(&b);
    }
    /* A window overrun: five chunks into a four-slot ring. */
    sim_side a, b;
    pair(&a, &b);
    for (uint32_t k = 0; k < 4; k++)
        ck_assert_int_eq(braid__verbs_engine_on_recv(&b.e, braid__verbs_imm_data(k, 4096, 0), 4096, 1), BRAID_OK);
    ck_assert_int_eq(braid__verbs_engine_on_recv(&b.e, braid__verbs_imm_data(0, 1, 1), 1, 1), BRAID_ERR_PEER);
    ck_assert_ptr_nonnull(strstr(braid_last_error(), "overran"));
    sim_free(&a);
    sim_free(&b);
}
END_TEST

START_TEST(engine_error_completion)
{
    sim_side a, b;
    pair(&a, &b);
    uint8_t buf[100] = {0};
    braid_req s;
    ck_assert_int_eq(braid__verbs_engine_isend(&a.e, &s, buf, sizeof(buf)), BRAID_OK);
    ck_assert_int_eq(braid__verbs_engine_on_error(&a.e, BRAID_VERBS_WR_ID(BRAID_VERBS_WR_DATA, 0),
                                                  "transport retry counter exceeded"),
                     BRAID_ERR_PEER);
    ck_assert_ptr_nonnull(strstr(braid_last_error(), "rank 0: verbs connection to peer 1: RDMA write failed: "
                                                     "transport retry counter exceeded"));
    ck_assert_int_eq(braid__verbs_engine_advance(&a.e, &(int){0}), BRAID_ERR_PEER);
    ck_assert_int_eq(braid__verbs_engine_close(&a.e), 0);
    sim_free(&a);
    sim_free(&b);

    /* After a goodbye a failed credit is no error. */
    pair(&a, &b);
    ck_assert_int_eq(braid__verbs_engine_on_recv(&b.e, braid__verbs_imm_close(), 0, 0), BRAID_OK);
    ck_assert_int_eq(braid__verbs_engine_on_error(&b.e, BRAID_VERBS_WR_ID(BRAID_VERBS_WR_CREDIT, 0), "flushed"),
                     BRAID_OK);
    ck_assert_int_eq(braid__verbs_engine_on_recv(&b.e, braid__verbs_imm_credit(1), 0, 0), BRAID_ERR_PEER);
    ck_assert_ptr_nonnull(strstr(braid_last_error(), "after closing"));
    sim_free(&a);
    sim_free(&b);

    /* After a goodbye, a zero-copy send whose completion is in the same
     * batch as a failed credit has finished: no error. One still waiting
     * can never finish: error. */
    for (int waiting = 0; waiting < 2; waiting++) {
        pair(&a, &b);
        a.zcopy = 1;
        a.e.cfg.zcopy_min = 1;
        ck_assert_int_eq(braid__verbs_engine_isend(&a.e, &s, buf, sizeof(buf)), BRAID_OK);
        ck_assert_int_eq(s.done, 0);
        ck_assert_int_eq(braid__verbs_engine_on_recv(&a.e, braid__verbs_imm_close(), 0, 0), BRAID_OK);
        if (!waiting)
            ck_assert_int_eq(braid__verbs_engine_on_send(&a.e, BRAID_VERBS_WR_ID(BRAID_VERBS_WR_DATA, 0)), BRAID_OK);
        braid_status st = braid__verbs_engine_on_error(&a.e, BRAID_VERBS_WR_ID(BRAID_VERBS_WR_CREDIT, 0), "flushed");
        ck_assert_int_eq(st, waiting ? BRAID_ERR_PEER : BRAID_OK);
        ck_assert_int_eq(s.done, !waiting);
        a.w_count = 0; /* the fabric is gone */
        a.sq_used = 0;
        sim_free(&a);
        sim_free(&b);
    }

    /* A failing post is a system error naming the cause. */
    pair(&a, &b);
    a.post_fail = ENOMEM;
    ck_assert_int_eq(braid__verbs_engine_isend(&a.e, &s, buf, sizeof(buf)), BRAID_ERR_SYSTEM);
    ck_assert_ptr_nonnull(strstr(braid_last_error(), "cannot post an RDMA write"));
    sim_free(&a);
    sim_free(&b);
}
END_TEST

/* After abandon() the engine never touches the requests again: their
 * memory is poisoned and the traffic still in flight is absorbed. */
START_TEST(engine_abandon)
{
    sim_side a, b;
    pair(&a, &b);
    a.zcopy = 1;
    a.e.cfg.zcopy_min = 1;
    size_t big = 10 * 4096;
    uint8_t *sbuf = calloc(1, big), *rbuf = calloc(1, big);
    braid_req *reqs = calloc(4, sizeof(braid_req));
    ck_assert_int_eq(braid__verbs_engine_isend(&a.e, &reqs[0], sbuf, big), BRAID_OK);
    ck_assert_int_eq(braid__verbs_engine_irecv(&a.e, &reqs[1], rbuf, big), BRAID_OK);
    ck_assert_int_eq(braid__verbs_engine_isend(&b.e, &reqs[2], sbuf, big), BRAID_OK);
    ck_assert_int_eq(braid__verbs_engine_irecv(&b.e, &reqs[3], rbuf, big), BRAID_OK);
    sim_deliver(&a);
    sim_deliver(&b);
    ck_assert_int_eq(a.tokens_out, 1);
    braid__verbs_engine_abandon(&a.e);
    braid__verbs_engine_abandon(&b.e);
    memset(reqs, 0xAB, 4 * sizeof(braid_req));
    memset(rbuf, 0xCD, big);
    ck_assert_int_eq(braid__verbs_engine_close(&a.e), 1);
    ck_assert_int_eq(braid__verbs_engine_close(&b.e), 1);
    braid_status sa, sb;
    settle(&a, &b, &sa, &sb);
    for (size_t i = 0; i < 4 * sizeof(braid_req); i++)
        ck_assert_uint_eq(((uint8_t *)reqs)[i], 0xAB);
    for (size_t i = 0; i < big; i++)
        ck_assert_uint_eq(rbuf[i], 0xCD);
    ck_assert(braid__verbs_engine_drained(&a.e));
    sim_free(&a); /* returns the abandoned send's registration */
    sim_free(&b);
    free(sbuf);
    free(rbuf);
    free(reqs);
}
END_TEST

START_TEST(engine_bad_geometry)
{
    braid_verbs_engine e;
    uint8_t ring[4096], stage[4096];
    braid_verbs_io io = {.write_imm = sim_write_imm, .send_imm = sim_send_imm};
    braid_verbs_engine_cfg cfg = {.rank = 2,
                                  .peer = 3,
                                  .rx_ring = ring,
                                  .rx_slots = 1,
                                  .rx_slot_bytes = 4096,
                                  .tx_slots = 1,
                                  .tx_slot_bytes = 4096,
                                  .tx_window = 2,
                                  .tx_stage = stage};
    ck_assert_int_eq(braid__verbs_engine_init(&e, &cfg, &io), BRAID_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(braid_last_error(), "rank 2: verbs connection to peer 3"));
    cfg.tx_window = 1;
    cfg.rx_slots = BRAID_VERBS_MAX_SLOTS + 1;
    ck_assert_int_eq(braid__verbs_engine_init(&e, &cfg, &io), BRAID_ERR_INVALID_ARG);
    cfg.rx_slots = 1;
    ck_assert_int_eq(braid__verbs_engine_init(&e, &cfg, &io), BRAID_OK);
}
END_TEST

static Suite *verbs_proto_suite(void)
{
    Suite *s = suite_create("verbs_proto");
    TCase *imm = tcase_create("immediates");
    tcase_add_test(imm, imm_data_round_trip);
    tcase_add_test(imm, imm_control_round_trip);
    tcase_add_test(imm, imm_rejects);
    tcase_add_test(imm, imm_fuzz);
    tcase_set_timeout(imm, 60);
    suite_add_tcase(s, imm);

    TCase *chunk = tcase_create("chunking_and_windows");
    tcase_add_test(chunk, chunk_sizes);
    tcase_add_test(chunk, window_random_schedules);
    tcase_add_test(chunk, window_rejects);
    tcase_add_test(chunk, window_credit_batching);
    /* Generous: 60 s ran out on a loaded 2-core machine (load average 20),
     * and this is about results, not speed. */
    tcase_set_timeout(chunk, 300);
    suite_add_tcase(s, chunk);

    TCase *wire = tcase_create("setup_and_selection");
    tcase_add_test(wire, info_round_trip);
    tcase_add_test(wire, info_rejects);
    tcase_add_test(wire, info_fuzz);
    tcase_add_test(wire, mtu_codes);
    tcase_add_test(wire, hca_parse_ok);
    tcase_add_test(wire, hca_parse_rejects);
    tcase_add_test(wire, gid_pick_order);
    tcase_set_timeout(wire, 60);
    suite_add_tcase(s, wire);

    TCase *cache = tcase_create("regcache");
    tcase_add_test(cache, cache_hit_miss);
    tcase_add_test(cache, cache_overlap_merges);
    tcase_add_test(cache, cache_union_fallback);
    tcase_add_test(cache, cache_lru_eviction);
    tcase_add_test(cache, cache_byte_limit);
    tcase_add_test(cache, cache_invalidate);
    tcase_add_test(cache, cache_fini_reports_leaks);
    tcase_add_test(cache, cache_random);
    tcase_set_timeout(cache, 60);
    suite_add_tcase(s, cache);

    TCase *eng = tcase_create("engine");
    tcase_add_test(eng, engine_sizes);
    tcase_add_test(eng, engine_random);
    tcase_add_test(eng, engine_length_mismatch);
    tcase_add_test(eng, engine_close);
    tcase_add_test(eng, engine_bad_peer);
    tcase_add_test(eng, engine_error_completion);
    tcase_add_test(eng, engine_abandon);
    tcase_add_test(eng, engine_bad_geometry);
    tcase_set_timeout(eng, 120);
    suite_add_tcase(s, eng);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(verbs_proto_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
