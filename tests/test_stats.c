/* braid_pg_stats: per-kind call counters and per-transport bytes, on three
 * ranks over two pretend hosts (ranks 0 and 1 share memory, rank 2 is
 * reached over TCP), after a known sequence of calls. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "braid.h"
#include "harness.h"

#define RANKS 3

static void two_hosts(int rank)
{
    setenv("BRAID_HOST_ID", rank < 2 ? "host-a" : "host-b", 1);
}

static const braid_call_stats *kind(const braid_stats *s, const char *name)
{
    for (int i = 0; i < s->nkinds; i++)
        if (strcmp(s->kinds[i].name, name) == 0)
            return &s->kinds[i];
    return NULL;
}

static const braid_transport_stats *transport(const braid_stats *s, const char *name)
{
    for (int i = 0; i < s->ntransports; i++)
        if (strcmp(s->transports[i].name, name) == 0)
            return &s->transports[i];
    return NULL;
}

static int expect_kind(int rank, const braid_stats *s, const char *name, uint64_t calls, uint64_t bytes)
{
    const braid_call_stats *k = kind(s, name);
    if (!k)
        HARNESS_FAIL("rank %d: no %s entry", rank, name);
    if (k->calls != calls || k->bytes != bytes || k->failed != 0)
        HARNESS_FAIL("rank %d: %s: %llu calls, %llu bytes, %llu failed; want %llu calls, %llu bytes, 0 failed",
                     rank, name, (unsigned long long)k->calls, (unsigned long long)k->bytes,
                     (unsigned long long)k->failed, (unsigned long long)calls, (unsigned long long)bytes);
    if (k->max_ns == 0 || k->max_ns > k->total_ns)
        HARNESS_FAIL("rank %d: %s: max %llu ns, total %llu ns", rank, name, (unsigned long long)k->max_ns,
                     (unsigned long long)k->total_ns);
    return 0;
}

static int stats_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int rank = braid_pg_rank(pg);
    braid_stats s;
    memset(&s, 0, sizeof(s));
    if (braid_pg_stats(pg, &s) != BRAID_ERR_INVALID_ARG || !strstr(braid_last_error(), "sizeof(braid_stats)"))
        HARNESS_FAIL("rank %d: size 0 was not refused: %s", rank, braid_last_error());
    s.size = sizeof(s);
    if (braid_pg_stats(pg, &s) != BRAID_OK || s.nkinds != 0)
        HARNESS_FAIL("rank %d: a new group has %d kinds of calls counted", rank, s.nkinds);

    float f[1000];
    int64_t i64[10];
    uint8_t u8[500];
    float a2a_in[RANKS * 7], a2a_out[RANKS * 7];
    memset(f, 0, sizeof(f));
    memset(i64, 0, sizeof(i64));
    memset(u8, 0, sizeof(u8));
    memset(a2a_in, 0, sizeof(a2a_in));
    for (int k = 0; k < 3; k++)
        if (braid_allreduce(pg, f, f, 1000, BRAID_F32, BRAID_SUM, NULL, NULL) != BRAID_OK)
            HARNESS_FAIL("rank %d: allreduce: %s", rank, braid_last_error());
    braid_work *w;
    if (braid_allreduce(pg, i64, i64, 10, BRAID_I64, BRAID_MAX, NULL, &w) != BRAID_OK || braid_wait(w, -1) != BRAID_OK)
        HARNESS_FAIL("rank %d: async allreduce: %s", rank, braid_last_error());
    braid_work_free(w);
    if (braid_broadcast(pg, u8, 500, BRAID_U8, 1, NULL, NULL) != BRAID_OK)
        HARNESS_FAIL("rank %d: broadcast: %s", rank, braid_last_error());
    if (braid_alltoall(pg, a2a_in, a2a_out, 7, BRAID_F32, NULL, NULL) != BRAID_OK)
        HARNESS_FAIL("rank %d: alltoall: %s", rank, braid_last_error());
    if (braid_pg_stats(pg, &s) != BRAID_OK)
        HARNESS_FAIL("rank %d: braid_pg_stats: %s", rank, braid_last_error());

    if (s.nkinds != 3)
        HARNESS_FAIL("rank %d: %d kinds of calls counted, want 3 (allreduce, broadcast, alltoall)", rank, s.nkinds);
    if (expect_kind(rank, &s, "allreduce", 4, 3 * 1000 * 4 + 10 * 8) || expect_kind(rank, &s, "broadcast", 1, 500) ||
        expect_kind(rank, &s, "alltoall", 1, RANKS * 7 * 4))
        return 1;

    /* Every rank sends each peer its 28-byte alltoall block, at least. */
    const braid_transport_stats *shm = transport(&s, "shm"), *tcp = transport(&s, "tcp");
    int want_shm = rank < 2 ? 1 : 0, want_tcp = rank < 2 ? 1 : 2;
    if (s.ntransports != (want_shm ? 2 : 1) || !tcp || tcp->peers != want_tcp || tcp->bytes_sent < 28u * want_tcp)
        HARNESS_FAIL("rank %d: %d transports; tcp %d peers %llu bytes", rank, s.ntransports, tcp ? tcp->peers : -1,
                     tcp ? (unsigned long long)tcp->bytes_sent : 0ull);
    if (want_shm && (!shm || shm->peers != 1 || shm->bytes_sent < 28))
        HARNESS_FAIL("rank %d: shm %d peers %llu bytes", rank, shm ? shm->peers : -1,
                     shm ? (unsigned long long)shm->bytes_sent : 0ull);
    printf("rank %d: allreduce %llu calls %llu ns in all; tcp %llu bytes", rank,
           (unsigned long long)kind(&s, "allreduce")->calls, (unsigned long long)kind(&s, "allreduce")->total_ns,
           (unsigned long long)tcp->bytes_sent);
    if (shm)
        printf(", shm %llu bytes", (unsigned long long)shm->bytes_sent);
    printf("\n");
    fflush(stdout);
    return 0;
}

START_TEST(test_stats_counts)
{
    harness_rank_setup = two_hosts;
    harness_result r;
    int failed = harness_run(RANKS, stats_body, NULL, NULL, 60, &r);
    harness_rank_setup = NULL;
    ck_assert_msg(failed == 0, "%d of %d ranks failed", failed, RANKS);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("stats");
    TCase *tc = tcase_create("stats");
    tcase_set_timeout(tc, 90);
    tcase_add_test(tc, test_stats_counts);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
