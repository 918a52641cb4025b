/* The flight recorder (src/lifecycle/trace.h): what each rank writes at
 * the group's first failure and on braid_pg_trace_dump, its ring's
 * wrap-around, the off switch, and scripts/braid-trace-merge's line on
 * where the ranks disagree. */
#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "braid.h"
#include "harness.h"

#define RANKS 3
#define CALLS 6 /* before rank 2 leaves: 5 all-reduces and a broadcast */

static char dir[256];

static void trace_env(int rank)
{
    (void)rank;
    setenv("BRAID_TRACE_DIR", dir, 1);
}

/* The dump files of one rank in dir (names carry "-r<rank>-"). */
static int files_of(int rank, char names[][512], int max)
{
    char tag[32];
    snprintf(tag, sizeof(tag), "-r%d-", rank);
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL)
        if (strncmp(e->d_name, "braid-trace-", 12) == 0 && strstr(e->d_name, tag) && n < max)
            snprintf(names[n++], 512, "%s/%s", dir, e->d_name);
    if (d)
        closedir(d);
    return n;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static int count_rows(const char *text, const char *state)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, state)) != NULL; p += strlen(state))
        n++;
    return n;
}

/* Ranks 0 and 1 fail their 7th call because rank 2 left after its 6th
 * (which it wrote out first, as a rank would on a signal). */
static int failure_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int rank = braid_pg_rank(pg);
    float buf[256] = {0};
    for (int i = 0; i < CALLS - 1; i++)
        if (braid_allreduce(pg, buf, buf, 256, BRAID_F32, BRAID_SUM, NULL, NULL) != BRAID_OK)
            HARNESS_FAIL("rank %d: allreduce %d: %s", rank, i, braid_last_error());
    if (braid_broadcast(pg, buf, 100, BRAID_F32, 1, NULL, NULL) != BRAID_OK)
        HARNESS_FAIL("rank %d: broadcast: %s", rank, braid_last_error());
    if (rank == 2) {
        if (braid_pg_trace_dump(pg, NULL) != BRAID_OK)
            HARNESS_FAIL("rank 2: braid_pg_trace_dump: %s", braid_last_error());
        _exit(0);
    }
    braid_status st = braid_allreduce(pg, buf, buf, 256, BRAID_F32, BRAID_SUM, NULL, NULL);
    if (st == BRAID_OK)
        HARNESS_FAIL("rank %d: the all-reduce without rank 2 succeeded", rank);
    /* The thread's error text is the call's, not the recorder's. */
    if (strncmp(braid_last_error(), "BRAID_ERR_", 10) != 0 || !strstr(braid_last_error(), "peer"))
        HARNESS_FAIL("rank %d: error text after the dump: %s", rank, braid_last_error());
    return 0;
}

START_TEST(test_failure_dumps)
{
    snprintf(dir, sizeof(dir), "/tmp/braid-trace-test-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    harness_rank_setup = trace_env;
    harness_result r;
    int failed = harness_run(RANKS, failure_body, NULL, NULL, 60, &r);
    harness_rank_setup = NULL;
    ck_assert_msg(failed == 0, "%d ranks failed", failed);

    char names[4][512];
    for (int rank = 0; rank < RANKS; rank++) {
        int n = files_of(rank, names, 4);
        ck_assert_msg(n == 1, "rank %d wrote %d files", rank, n);
        char *text = slurp(names[0]);
        ck_assert_ptr_nonnull(text);
        char head[64];
        snprintf(head, sizeof(head), "# braid flight recorder: rank %d of %d,", rank, RANKS);
        ck_assert_msg(strstr(text, head), "rank %d: no header in %s", rank, names[0]);
        ck_assert_msg(count_rows(text, "  allreduce  ") >= 5 && count_rows(text, "  broadcast  ") == 1,
                      "rank %d: calls missing:\n%s", rank, text);
        ck_assert_msg(strstr(text, " tree ") || strstr(text, " chain "), "rank %d: no broadcast algorithm:\n%s",
                      rank, text);
        if (rank == 2) {
            ck_assert_msg(strstr(text, "# reason: asked for (braid_pg_trace_dump)"), "rank 2's reason:\n%s", text);
            ck_assert_msg(count_rows(text, " done ") == CALLS && !strstr(text, " failed "), "rank 2:\n%s", text);
            ck_assert_msg(strstr(text, "# last done: #5 broadcast"), "rank 2's position:\n%s", text);
        } else {
            ck_assert_msg(strstr(text, "# reason: BRAID_ERR_PEER") || strstr(text, "# reason: BRAID_ERR_TIMEOUT"),
                          "rank %d's reason:\n%s", rank, text);
            ck_assert_msg(count_rows(text, " done ") == CALLS && count_rows(text, " failed ") == 1,
                          "rank %d: want %d done and 1 failed:\n%s", rank, CALLS, text);
            ck_assert_msg(strstr(text, "# last started: #6 allreduce (failed)"), "rank %d's position:\n%s", rank,
                          text);
        }
    }

    /* The merge script names the rank that is behind. */
    const char *src = getenv("BRAID_SOURCE_ROOT");
    if (src) {
        char cmd[1024], out[8192] = "";
        snprintf(cmd, sizeof(cmd), "python3 %s/scripts/braid-trace-merge %s 2>&1", src, dir);
        FILE *p = popen(cmd, "r");
        ck_assert_ptr_nonnull(p);
        size_t n = fread(out, 1, sizeof(out) - 1, p);
        out[n] = '\0';
        int rc = pclose(p);
        ck_assert_msg(rc == 0, "braid-trace-merge exited %d:\n%s", rc, out);
        ck_assert_msg(strstr(out, "where the ranks disagree: rank 2 is at broadcast #5, the others at allreduce #6"),
                      "braid-trace-merge:\n%s", out);
        printf("%s", out);
    }
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* BRAID_TRACE_BUFFER=4: the last four calls only. */
static int wrap_body(braid_pg *pg, void *arg)
{
    const char *path = arg;
    int rank = braid_pg_rank(pg);
    int v[8] = {0};
    for (int i = 0; i < 10; i++)
        if (braid_allreduce(pg, v, v, 8, BRAID_I32, BRAID_MAX, NULL, NULL) != BRAID_OK)
            HARNESS_FAIL("rank %d: allreduce: %s", rank, braid_last_error());
    if (rank != 0)
        return 0;
    if (braid_pg_trace_dump(pg, path) != BRAID_OK)
        HARNESS_FAIL("rank 0: dump: %s", braid_last_error());
    char *text = slurp(path);
    if (!text || count_rows(text, " done ") != 4 || !strstr(text, "# records 7-10 of 10 (BRAID_TRACE_BUFFER 4)") ||
        !strstr(text, "         9  allreduce") || strstr(text, "         5  allreduce") || !strstr(text, " i32 ") ||
        !strstr(text, " max "))
        HARNESS_FAIL("rank 0: wrapped records:\n%s", text ? text : "(no file)");
    return 0;
}

START_TEST(test_ring_wraps)
{
    char path[] = "/tmp/braid-trace-wrap-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    setenv("BRAID_TRACE_BUFFER", "4", 1);
    harness_result r;
    int failed = harness_run(2, wrap_body, path, NULL, 60, &r);
    unsetenv("BRAID_TRACE_BUFFER");
    unlink(path);
    ck_assert_msg(failed == 0, "%d ranks failed", failed);
}
END_TEST

static int off_body(braid_pg *pg, void *arg)
{
    (void)arg;
    int rank = braid_pg_rank(pg);
    if (braid_pg_trace_dump(pg, "/tmp/never-written") != BRAID_ERR_INVALID_ARG ||
        !strstr(braid_last_error(), "BRAID_TRACE_BUFFER=0"))
        HARNESS_FAIL("rank %d: dump with the recorder off: %s", rank, braid_last_error());
    return 0;
}

START_TEST(test_off)
{
    setenv("BRAID_TRACE_BUFFER", "0", 1);
    harness_result r;
    int failed = harness_run(2, off_body, NULL, NULL, 60, &r);
    unsetenv("BRAID_TRACE_BUFFER");
    ck_assert_msg(failed == 0, "%d ranks failed", failed);
    ck_assert_int_ne(access("/tmp/never-written", F_OK), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("trace");
    TCase *tc = tcase_create("trace");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_failure_dumps);
    tcase_add_test(tc, test_ring_wraps);
    tcase_add_test(tc, test_off);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
