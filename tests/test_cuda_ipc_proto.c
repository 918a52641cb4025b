/* cuda_ipc transport protocol (transports/cuda_ipc/cuda_ipc_proto.c): the
 * set-up message carrying the IPC memory and event handles, the control
 * messages, and the slot window, including a simulated sender and
 * receiver moving messages of many sizes through a small ring. Pure code:
 * runs without CUDA. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "transports/cuda_ipc/cuda_ipc_proto.h"

static braid_ipc_setup sample(void)
{
    braid_ipc_setup s;
    memset(&s, 0, sizeof(s));
    s.version = BRAID_IPC_VERSION;
    s.device = 3;
    s.nslots = 4;
    s.slot_bytes = 1u << 20;
    s.pid = 0x89abcdefu;
    s.pidns = 0xf0000123u;
    s.host_hash = 0x0123456789abcdefull;
    strcpy(s.bus_id, "0000:3b:00.0");
    for (int i = 0; i < BRAID_IPC_HANDLE_BYTES; i++)
        s.ring[i] = (uint8_t)(i * 7 + 1);
    for (uint32_t k = 0; k < s.nslots; k++)
        for (int i = 0; i < BRAID_IPC_HANDLE_BYTES; i++)
            s.events[k][i] = (uint8_t)(k * 31 + i + 2);
    return s;
}

START_TEST(setup_roundtrip)
{
    braid_ipc_setup s = sample(), d;
    uint8_t wire[BRAID_IPC_SETUP_BYTES];
    braid__ipc_setup_encode(&s, wire);
    char why[128] = "";
    ck_assert_int_eq(braid__ipc_setup_decode(wire, &d, why, sizeof(why)), BRAID_OK);
    ck_assert_int_eq(d.version, s.version);
    ck_assert_int_eq(d.device, 3);
    ck_assert_uint_eq(d.nslots, 4);
    ck_assert_uint_eq(d.slot_bytes, 1u << 20);
    ck_assert_uint_eq(d.pid, 0x89abcdefu);
    ck_assert_uint_eq(d.pidns, 0xf0000123u);
    ck_assert(d.host_hash == s.host_hash);
    ck_assert_str_eq(d.bus_id, "0000:3b:00.0");
    ck_assert(!memcmp(d.ring, s.ring, sizeof(s.ring)));
    ck_assert(!memcmp(d.events, s.events, (size_t)s.nslots * BRAID_IPC_HANDLE_BYTES));
    for (uint32_t k = s.nslots; k < BRAID_IPC_MAX_SLOTS; k++)
        for (int i = 0; i < BRAID_IPC_HANDLE_BYTES; i++)
            ck_assert_int_eq(d.events[k][i], 0);
    /* Every handle byte value survives, and the table may be full. */
    s.nslots = BRAID_IPC_MAX_SLOTS;
    for (uint32_t k = 0; k < s.nslots; k++)
        memset(s.events[k], 0xff - (int)k, BRAID_IPC_HANDLE_BYTES);
    braid__ipc_setup_encode(&s, wire);
    ck_assert_int_eq(braid__ipc_setup_decode(wire, &d, why, sizeof(why)), BRAID_OK);
    ck_assert(!memcmp(d.events, s.events, sizeof(s.events)));
}
END_TEST

/* Re-encode sample() with one field changed and expect a rejection. */
static void expect_bad(void (*mutate)(braid_ipc_setup *, uint8_t *), braid_status want, const char *needle)
{
    braid_ipc_setup s = sample(), d;
    uint8_t wire[BRAID_IPC_SETUP_BYTES];
    braid__ipc_setup_encode(&s, wire);
    mutate(&s, wire);
    char why[160] = "";
    memset(&d, 0x5a, sizeof(d));
    braid_ipc_setup before = d;
    ck_assert_int_eq(braid__ipc_setup_decode(wire, &d, why, sizeof(why)), want);
    ck_assert_msg(strstr(why, needle), "why = '%s', expected '%s'", why, needle);
    ck_assert_msg(!memcmp(&d, &before, sizeof(d)), "output written on failure");
}

static void bad_magic(braid_ipc_setup *s, uint8_t *w) { (void)s; w[0] ^= 1; }
static void bad_version(braid_ipc_setup *s, uint8_t *w) { (void)s; w[4] = 9; }
static void zero_slots(braid_ipc_setup *s, uint8_t *w) { (void)s; memset(w + 12, 0, 4); } /* slot size kept */
static void many_slots(braid_ipc_setup *s, uint8_t *w) { (void)s; w[12] = BRAID_IPC_MAX_SLOTS + 1; }
static void odd_slot(braid_ipc_setup *s, uint8_t *w) { (void)s; w[16] = 1; }
static void tiny_slot(braid_ipc_setup *s, uint8_t *w) { (void)s; memset(w + 16, 0, 4); w[17] = 1; }
static void no_nul(braid_ipc_setup *s, uint8_t *w) { (void)s; memset(w + 32, 'a', BRAID_IPC_BUS_ID_BYTES); }
static void empty_bus(braid_ipc_setup *s, uint8_t *w) { (void)s; memset(w + 32, 0, BRAID_IPC_BUS_ID_BYTES); }
static void past_table(braid_ipc_setup *s, uint8_t *w) { (void)s; w[BRAID_IPC_SETUP_PIDNS_AT - 1] = 1; }
static void trailing(braid_ipc_setup *s, uint8_t *w) { (void)s; w[BRAID_IPC_SETUP_BYTES - 1] = 1; }

START_TEST(setup_rejects)
{
    expect_bad(bad_magic, BRAID_ERR_PEER, "magic");
    expect_bad(bad_version, BRAID_ERR_MISMATCH, "version 9");
    expect_bad(zero_slots, BRAID_ERR_PEER, "slot size");
    expect_bad(many_slots, BRAID_ERR_PEER, "slot count");
    expect_bad(odd_slot, BRAID_ERR_PEER, "slot size");
    expect_bad(tiny_slot, BRAID_ERR_PEER, "slot size");
    expect_bad(no_nul, BRAID_ERR_PEER, "bus id");
    expect_bad(empty_bus, BRAID_ERR_PEER, "bus id");
    expect_bad(past_table, BRAID_ERR_PEER, "past its event table");
    expect_bad(trailing, BRAID_ERR_PEER, "past its pid namespace");
}
END_TEST

/* A side that cannot use IPC sends no slots, no slot size and may have no
 * bus id; anything in its handle table is still refused. */
START_TEST(setup_unusable_side)
{
    braid_ipc_setup s, d;
    memset(&s, 0, sizeof(s));
    s.version = BRAID_IPC_VERSION;
    s.device = -1;
    s.host_hash = 42;
    uint8_t wire[BRAID_IPC_SETUP_BYTES];
    braid__ipc_setup_encode(&s, wire);
    char why[128] = "";
    ck_assert_int_eq(braid__ipc_setup_decode(wire, &d, why, sizeof(why)), BRAID_OK);
    ck_assert_uint_eq(d.nslots, 0);
    ck_assert_uint_eq(d.slot_bytes, 0);
    ck_assert(d.host_hash == 42);
    wire[32 + BRAID_IPC_BUS_ID_BYTES] = 1; /* a ring handle with no slots */
    ck_assert_int_eq(braid__ipc_setup_decode(wire, &d, why, sizeof(why)), BRAID_ERR_PEER);
    braid__ipc_setup_encode(&s, wire);
    wire[17] = 16; /* a slot size with no slots */
    ck_assert_int_eq(braid__ipc_setup_decode(wire, &d, why, sizeof(why)), BRAID_ERR_PEER);
    ck_assert_msg(strstr(why, "slot size"), "why = '%s'", why);
}
END_TEST

START_TEST(ctrl_verdict)
{
    uint8_t w[BRAID_IPC_CTRL_BYTES];
    char why[128];
    for (uint64_t ok = 0; ok <= 1; ok++) {
        braid_ipc_ctrl m = {.kind = BRAID_IPC_VERDICT, .len = ok}, d;
        braid__ipc_ctrl_encode(&m, w);
        /* decodes even on a side with no slots */
        ck_assert_int_eq(braid__ipc_ctrl_decode(w, 0, 0, &d, why, sizeof(why)), BRAID_OK);
        ck_assert(d.kind == BRAID_IPC_VERDICT && d.len == ok && d.slot == 0 && !d.last);
    }
    braid_ipc_ctrl m = {.kind = BRAID_IPC_VERDICT, .len = 2}, d;
    braid__ipc_ctrl_encode(&m, w);
    ck_assert_int_eq(braid__ipc_ctrl_decode(w, 4, 4096, &d, why, sizeof(why)), BRAID_ERR_PEER);
    m = (braid_ipc_ctrl){.kind = BRAID_IPC_VERDICT, .slot = 1, .len = 1};
    braid__ipc_ctrl_encode(&m, w);
    ck_assert_int_eq(braid__ipc_ctrl_decode(w, 4, 4096, &d, why, sizeof(why)), BRAID_ERR_PEER);
    m = (braid_ipc_ctrl){.kind = BRAID_IPC_VERDICT, .last = 1, .len = 1};
    braid__ipc_ctrl_encode(&m, w);
    ck_assert_int_eq(braid__ipc_ctrl_decode(w, 4, 4096, &d, why, sizeof(why)), BRAID_ERR_PEER);
    ck_assert_msg(strstr(why, "verdict"), "why = '%s'", why);
}
END_TEST

/* BYE: "I no longer map your ring"; decodes on a side with no slots too,
 * and carries nothing else. */
START_TEST(ctrl_bye)
{
    uint8_t w[BRAID_IPC_CTRL_BYTES];
    char why[128];
    braid_ipc_ctrl m = {.kind = BRAID_IPC_BYE}, d;
    braid__ipc_ctrl_encode(&m, w);
    ck_assert_int_eq(braid__ipc_ctrl_decode(w, 0, 0, &d, why, sizeof(why)), BRAID_OK);
    ck_assert(d.kind == BRAID_IPC_BYE && d.len == 0 && d.slot == 0 && !d.last);
    braid_ipc_ctrl bad[] = {{.kind = BRAID_IPC_BYE, .len = 1}, {.kind = BRAID_IPC_BYE, .slot = 1},
                            {.kind = BRAID_IPC_BYE, .last = 1}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        braid__ipc_ctrl_encode(&bad[i], w);
        ck_assert_int_eq(braid__ipc_ctrl_decode(w, 4, 4096, &d, why, sizeof(why)), BRAID_ERR_PEER);
        ck_assert_msg(strstr(why, "bye"), "why = '%s'", why);
    }
}
END_TEST

START_TEST(ctrl_roundtrip_and_rejects)
{
    uint8_t w[BRAID_IPC_CTRL_BYTES];
    braid_ipc_ctrl m = {.kind = BRAID_IPC_DATA, .slot = 3, .last = 1, .len = 4096}, d;
    char why[128];
    braid__ipc_ctrl_encode(&m, w);
    ck_assert_int_eq(braid__ipc_ctrl_decode(w, 4, 4096, &d, why, sizeof(why)), BRAID_OK);
    ck_assert(d.kind == BRAID_IPC_DATA && d.slot == 3 && d.last == 1 && d.len == 4096);
    m.last = 0;
    m.len = 17;
    braid__ipc_ctrl_encode(&m, w);
    ck_assert_int_eq(braid__ipc_ctrl_decode(w, 4, 4096, &d, why, sizeof(why)), BRAID_OK);
    ck_assert(d.last == 0 && d.len == 17);
    /* Zero-length chunks only end a message. */
    m.len = 0;
    braid__ipc_ctrl_encode(&m, w);
    ck_assert_int_eq(braid__ipc_ctrl_decode(w, 4, 4096, &d, why, sizeof(why)), BRAID_ERR_PEER);
    m.last = 1;
    braid__ipc_ctrl_encode(&m, w);
    ck_assert_int_eq(braid__ipc_ctrl_decode(w, 4, 4096, &d, why, sizeof(why)), BRAID_OK);
    /* Too long, slot out of range, unknown kind, flags on a credit. */
    m.len = 4097;
    braid__ipc_ctrl_encode(&m, w);
    ck_assert_int_eq(braid__ipc_ctrl_decode(w, 4, 4096, &d, why, sizeof(why)), BRAID_ERR_PEER);
    m.len = 1;
    m.slot = 4;
    braid__ipc_ctrl_encode(&m, w);
    ck_assert_int_eq(braid__ipc_ctrl_decode(w, 4, 4096, &d, why, sizeof(why)), BRAID_ERR_PEER);
    braid_ipc_ctrl cr = {.kind = BRAID_IPC_CREDIT, .slot = 2};
    braid__ipc_ctrl_encode(&cr, w);
    ck_assert_int_eq(braid__ipc_ctrl_decode(w, 4, 4096, &d, why, sizeof(why)), BRAID_OK);
    ck_assert(d.kind == BRAID_IPC_CREDIT && d.slot == 2 && d.len == 0);
    w[2] = 1; /* "last" on a credit */
    ck_assert_int_eq(braid__ipc_ctrl_decode(w, 4, 4096, &d, why, sizeof(why)), BRAID_ERR_PEER);
    braid__ipc_ctrl_encode(&cr, w);
    w[8] = 5; /* a credit with a length */
    ck_assert_int_eq(braid__ipc_ctrl_decode(w, 4, 4096, &d, why, sizeof(why)), BRAID_ERR_PEER);
    memset(w, 0, sizeof(w));
    w[0] = 7;
    ck_assert_int_eq(braid__ipc_ctrl_decode(w, 4, 4096, &d, why, sizeof(why)), BRAID_ERR_PEER);
    w[0] = 1;
    w[3] = 0x80; /* unknown flag bits */
    ck_assert_int_eq(braid__ipc_ctrl_decode(w, 4, 4096, &d, why, sizeof(why)), BRAID_ERR_PEER);
}
END_TEST

START_TEST(window_accounting)
{
    braid_ipc_window w;
    braid__ipc_window_init(&w, 3, 4096);
    uint32_t slot;
    size_t len;
    ck_assert(braid__ipc_window_take(&w, 10000, &slot, &len) && slot == 0 && len == 4096);
    ck_assert(braid__ipc_window_take(&w, 5904, &slot, &len) && slot == 1 && len == 4096);
    ck_assert(braid__ipc_window_take(&w, 1808, &slot, &len) && slot == 2 && len == 1808);
    ck_assert(!braid__ipc_window_take(&w, 1, &slot, &len)); /* no credit left */
    /* Credits come back oldest first; anything else is a protocol error. */
    ck_assert_int_eq(braid__ipc_window_credit(&w, 1), BRAID_ERR_PEER);
    ck_assert_int_eq(braid__ipc_window_credit(&w, 0), BRAID_OK);
    ck_assert(braid__ipc_window_take(&w, 0, &slot, &len) && slot == 0 && len == 0); /* empty message */
    ck_assert_int_eq(braid__ipc_window_credit(&w, 1), BRAID_OK);
    ck_assert_int_eq(braid__ipc_window_credit(&w, 2), BRAID_OK);
    ck_assert_int_eq(braid__ipc_window_credit(&w, 0), BRAID_OK);
    ck_assert_int_eq(braid__ipc_window_credit(&w, 1), BRAID_ERR_PEER); /* nothing in flight */
    /* Receiver: in order, and never more than the ring holds. */
    ck_assert_int_eq(braid__ipc_window_arrive(&w, 1), BRAID_ERR_PEER);
    ck_assert_int_eq(braid__ipc_window_arrive(&w, 0), BRAID_OK);
    ck_assert_int_eq(braid__ipc_window_arrive(&w, 1), BRAID_OK);
    ck_assert_int_eq(braid__ipc_window_arrive(&w, 2), BRAID_OK);
    ck_assert_int_eq(braid__ipc_window_arrive(&w, 0), BRAID_ERR_PEER); /* beyond the credit it had */
    ck_assert_uint_eq(braid__ipc_window_release(&w), 0);
    ck_assert_int_eq(braid__ipc_window_arrive(&w, 0), BRAID_OK);
    ck_assert_uint_eq(braid__ipc_window_release(&w), 1);
    ck_assert_uint_eq(braid__ipc_window_release(&w), 2);
    ck_assert_uint_eq(braid__ipc_window_release(&w), 0);
}
END_TEST

/* Sender and receiver windows driven in lock step with a random schedule:
 * every message of every size arrives whole, in order, with its last
 * chunk marked, and slots are never overwritten while held. */
START_TEST(window_simulation)
{
    enum { SLOT = 4096, NS = 4, NMSG = 200 };
    size_t sizes[NMSG];
    uint64_t rng = 88172645463325252ull;
    for (int i = 0; i < NMSG; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        size_t pick[] = {0, 1, SLOT - 1, SLOT, SLOT + 1, 3 * SLOT, 7 * SLOT + 5, (size_t)(rng % (9 * SLOT))};
        sizes[i] = pick[rng % 8];
    }
    braid_ipc_window tx, rx;
    braid__ipc_window_init(&tx, NS, SLOT);
    braid__ipc_window_init(&rx, NS, SLOT);
    braid_ipc_ctrl wire_data[64], wire_credit[64];
    int nd = 0, nc = 0, held_owner[NS];
    for (int k = 0; k < NS; k++)
        held_owner[k] = -1;
    int smsg = 0, rmsg = 0;
    size_t soff = 0, roff = 0;
    int steps = 0;
    while (rmsg < NMSG) {
        ck_assert_int_lt(++steps, 100000);
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        int action = (int)(rng % 3);
        if (action == 0 && smsg < NMSG) { /* sender takes a chunk */
            uint32_t slot;
            size_t len;
            if (braid__ipc_window_take(&tx, sizes[smsg] - soff, &slot, &len)) {
                ck_assert_int_eq(held_owner[slot], -1); /* the receiver is done with it */
                held_owner[slot] = smsg;
                soff += len;
                int last = soff == sizes[smsg];
                wire_data[nd++] = (braid_ipc_ctrl){.kind = BRAID_IPC_DATA, .slot = slot, .last = last, .len = len};
                if (last)
                    smsg++, soff = 0;
            }
        } else if (action == 1 && nd > 0) { /* receiver consumes the oldest chunk */
            braid_ipc_ctrl m = wire_data[0];
            memmove(wire_data, wire_data + 1, (size_t)--nd * sizeof(m));
            ck_assert_int_eq(braid__ipc_window_arrive(&rx, m.slot), BRAID_OK);
            ck_assert_int_eq(held_owner[m.slot], rmsg);
            roff += m.len;
            ck_assert_int_eq(m.last, roff == sizes[rmsg]);
            ck_assert_uint_le(roff, sizes[rmsg]);
            uint32_t freed = braid__ipc_window_release(&rx);
            ck_assert_uint_eq(freed, m.slot);
            held_owner[freed] = -1;
            wire_credit[nc++] = (braid_ipc_ctrl){.kind = BRAID_IPC_CREDIT, .slot = freed};
            if (m.last)
                rmsg++, roff = 0;
        } else if (nc > 0) { /* a credit reaches the sender */
            ck_assert_int_eq(braid__ipc_window_credit(&tx, wire_credit[0].slot), BRAID_OK);
            memmove(wire_credit, wire_credit + 1, (size_t)--nc * sizeof(wire_credit[0]));
        }
        ck_assert_int_le(nd + nc, NS);
    }
    ck_assert_int_eq(smsg, NMSG);
}
END_TEST

START_TEST(host_hash_stable)
{
    ck_assert(braid__ipc_host_hash("") == 1469598103934665603ull);
    ck_assert(braid__ipc_host_hash("node1|boot") == braid__ipc_host_hash("node1|boot"));
    ck_assert(braid__ipc_host_hash("node1|boot") != braid__ipc_host_hash("node2|boot"));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cuda_ipc_proto");
    TCase *tc = tcase_create("proto");
    tcase_add_test(tc, setup_roundtrip);
    tcase_add_test(tc, setup_rejects);
    tcase_add_test(tc, setup_unusable_side);
    tcase_add_test(tc, ctrl_verdict);
    tcase_add_test(tc, ctrl_bye);
    tcase_add_test(tc, ctrl_roundtrip_and_rejects);
    tcase_add_test(tc, window_accounting);
    tcase_add_test(tc, window_simulation);
    tcase_add_test(tc, host_hash_stable);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
