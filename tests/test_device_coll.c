/* The kernel-driven device collectives (cuda/device_coll.h) on the host
 * emulation: cuda/device_coll_kernels.cu compiled as C++, each rank a
 * process, the ranks' regions one shared mapping made before the fork (the
 * emulation's IPC). Every block's threads run as host threads, so the
 * barriers, the slot alternation and the fault paths run for real; only
 * the GPU's memory model and speed are not modelled.
 *
 * Results are checked bit for bit against the CPU engine folding the
 * ranks' inputs in rank order (the kernels' documented rule): every dtype x
 * op, 1..8 ranks, odd counts, in and out of place, unaligned buffers, small
 * segments that force many chunks through both slots, several calls with
 * the same arguments (what a CUDA graph replay does). A missing rank ends
 * every peer's kernel within its timeout, or at once on abort, naming it. */
#include <check.h>
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "device_coll.h"
#include "dtype_compare.h"
#include "reduce/reduce.h"

static const char *const dtype_names[] = {"f32", "f64", "f16", "bf16", "i8", "u8", "i32", "i64", "u32", "u64"};
static const char *const op_names[] = {"sum", "prod", "min", "max", "avg", "mulsum"};
static const char *const algo_names[] = {"one-shot", "two-shot", "broadcast"};

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* Ordinary values mostly, some raw bits (NaN, inf, subnormals) too. */
static void fill(braid_dtype t, void *buf, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t v = rnd(), r = rnd() % 8;
        if (r != 0) {
            switch (t) {
            case BRAID_F32: v = (v & 0x807fffffu) | ((uint64_t)(124 + v % 6) << 23); break;
            case BRAID_F64: v = (v & 0x800fffffffffffffull) | ((uint64_t)(1020 + v % 6) << 52); break;
            case BRAID_F16: v = (v & 0x83ffu) | ((uint64_t)(12 + (v >> 20) % 6) << 10); break;
            case BRAID_BF16: v = (v & 0x807fu) | ((uint64_t)(124 + (v >> 20) % 6) << 7); break;
            default: v %= 64; break;
            }
        }
        memcpy((char *)buf + i * braid_dtype_size(t), &v, braid_dtype_size(t));
    }
}

/* The kernels' rule on the CPU engine: premultiply (MULSUM), widen, fold
 * in rank order, finish on the last fold, narrow once. */
static void reference(braid_dtype t, braid_op op, void *out, void *const *in, const uint64_t *scalars, int n,
                      size_t count)
{
    braid_dtype ct = (t == BRAID_F16 || t == BRAID_BF16) ? BRAID_F32 : t;
    size_t cs = braid_dtype_size(ct);
    unsigned char *acc = malloc(count * cs + 1), *tmp = malloc(count * cs + 1), *pre = malloc(count * braid_dtype_size(t) + 1);
    ck_assert(acc && tmp && pre);
    for (int k = 0; k < n; k++) {
        const void *src = in[k];
        if (op == BRAID_MULSUM) {
            braid__reduce_premul(t, pre, src, count, &scalars[k]);
            src = pre;
        }
        braid__cast(ct, k == 0 ? acc : tmp, t, src, count);
        if (k > 0 && k == n - 1)
            braid__reduce_final(ct, op, acc, acc, tmp, count, n);
        else if (k > 0)
            braid__reduce(ct, op, acc, acc, tmp, count);
    }
    if (n == 1)
        braid__reduce_scale(ct, op, acc, count, n);
    braid__cast(t, out, ct, acc, count);
    free(acc);
    free(tmp);
    free(pre);
}

/* ---- a group of forked ranks over one shared mapping --------------------- */

#define MAXR BRAID_DEVCOLL_MAX_RANKS

typedef struct {
    int nranks, max_blocks;
    size_t seg_bytes, region_bytes, buf_bytes;
    char *map;
    size_t map_bytes;
    char *region[MAXR];
    char *input[MAXR];  /* pristine inputs, + 16 bytes of room for offsets */
    char *buf[MAXR];    /* the send (and in place: recv) buffer */
    char *out[MAXR];    /* recv when out of place */
    volatile uint32_t *abort_flag;
    braid_devcoll_fault *fault; /* one per rank */
} group;

static void group_make(group *g, int nranks, int max_blocks, size_t seg_bytes, size_t max_bytes)
{
    memset(g, 0, sizeof(*g));
    g->nranks = nranks;
    g->max_blocks = max_blocks;
    g->seg_bytes = seg_bytes;
    g->region_bytes = (braid__devcoll_region_bytes(max_blocks, seg_bytes) + 63) / 64 * 64;
    g->buf_bytes = (max_bytes + 64 + 63) / 64 * 64;
    g->map_bytes = (size_t)nranks * (g->region_bytes + 3 * g->buf_bytes) + 4096;
    g->map = mmap(NULL, g->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert(g->map != MAP_FAILED);
    char *p = g->map;
    g->abort_flag = (volatile uint32_t *)p;
    g->fault = (braid_devcoll_fault *)(p + 64);
    p += 4096;
    for (int r = 0; r < nranks; r++) {
        g->region[r] = p;
        p += g->region_bytes;
        g->input[r] = p;
        p += g->buf_bytes;
        g->buf[r] = p;
        p += g->buf_bytes;
        g->out[r] = p;
        p += g->buf_bytes;
    }
}

static void group_free(group *g)
{
    munmap(g->map, g->map_bytes);
}

static braid_devcoll_args args_for(const group *g, int rank, braid_devcoll_algo algo, braid_dtype t, braid_op op,
                                   int root, size_t count, int in_place, size_t misalign, uint64_t timeout_ns)
{
    braid_devcoll_args a;
    memset(&a, 0, sizeof(a));
    a.algo = algo;
    a.dtype = t;
    a.op = op;
    a.rank = rank;
    a.nranks = g->nranks;
    a.root = root;
    a.nblocks = braid__devcoll_blocks_for(count * braid_dtype_size(t), g->max_blocks);
    a.send = g->buf[rank] + misalign * braid_dtype_size(t);
    a.recv = in_place ? (void *)a.send : g->out[rank] + 2 * misalign * braid_dtype_size(t);
    a.count = count;
    for (int p = 0; p < g->nranks; p++) {
        a.signal[p] = (braid_devcoll_signal *)g->region[p];
        a.data[p] = g->region[p] + braid__devcoll_data_offset();
    }
    a.seg_bytes = g->seg_bytes;
    a.abort = g->abort_flag;
    a.fault = &g->fault[rank];
    a.timeout_ns = timeout_ns;
    return a;
}

/* Rank `rank`'s child: `calls` calls with the same arguments, each from its
 * pristine input; exits 0 when every result equals want. */
static void rank_main(const group *g, int rank, const braid_devcoll_args *a, const void *want, int calls)
{
    size_t bytes = a->count * braid_dtype_size(a->dtype);
    for (int c = 0; c < calls; c++) {
        memcpy((void *)a->send, g->input[rank], bytes);
        if (a->recv != a->send)
            memset(a->recv, 0xa5, bytes);
        braid_status st = braid__cuda_devcoll(a, NULL);
        if (st != BRAID_OK) {
            fprintf(stderr, "rank %d: launch failed: %s\n", rank, braid_last_error());
            _exit(2);
        }
        if (g->fault[rank].code != BRAID_DEVCOLL_OK) {
            fprintf(stderr, "rank %d: kernel gave up: code %u peer %d\n", rank, g->fault[rank].code,
                    g->fault[rank].peer);
            _exit(3);
        }
        long d = dtype_first_difference(a->dtype, a->op, a->recv, want, a->count);
        if (d >= 0) {
            uint64_t gv = 0, wv = 0;
            memcpy(&gv, (const char *)a->recv + d * braid_dtype_size(a->dtype), braid_dtype_size(a->dtype));
            memcpy(&wv, (const char *)want + d * braid_dtype_size(a->dtype), braid_dtype_size(a->dtype));
            fprintf(stderr, "rank %d call %d: element %ld of %zu: got 0x%" PRIx64 " want 0x%" PRIx64 "\n", rank, c,
                    d, a->count, gv, wv);
            _exit(1);
        }
    }
    _exit(0);
}

/* Waits for every child; kills them all past deadline_s. Returns the
 * number that failed (a kill counts). */
static int reap(const pid_t *pids, int n, int deadline_s, int *status_out)
{
    int failed = 0;
    time_t end = time(NULL) + deadline_s;
    for (int left = n; left > 0;) {
        int st;
        pid_t p = waitpid(-1, &st, WNOHANG);
        if (p > 0) {
            for (int r = 0; r < n; r++)
                if (pids[r] == p && status_out)
                    status_out[r] = st;
            if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
                failed++;
            left--;
            continue;
        }
        if (time(NULL) > end) {
            for (int r = 0; r < n; r++)
                kill(pids[r], SIGKILL);
            while (waitpid(-1, NULL, 0) > 0)
                ;
            return failed + left;
        }
        usleep(2000);
    }
    return failed;
}

static void run_case(braid_devcoll_algo algo, braid_dtype t, braid_op op, int nranks, size_t count, int in_place,
                     size_t misalign, size_t seg_bytes, int max_blocks, int calls)
{
    size_t es = braid_dtype_size(t), bytes = count * es;
    group g;
    group_make(&g, nranks, max_blocks, seg_bytes, bytes + 2 * misalign * es);
    uint64_t scalars[MAXR] = {0};
    void *in[MAXR];
    for (int r = 0; r < nranks; r++) {
        fill(t, g.input[r], count);
        fill(t, &scalars[r], 1);
        in[r] = g.input[r];
    }
    int root = nranks > 1 ? (int)(count % nranks) : 0;
    char *want = malloc(bytes + 1);
    ck_assert(want);
    if (algo == BRAID_DEVCOLL_BROADCAST)
        memcpy(want, g.input[root], bytes);
    else
        reference(t, op, want, in, scalars, nranks, count);

    pid_t pids[MAXR];
    for (int r = 0; r < nranks; r++) {
        braid_devcoll_args a = args_for(&g, r, algo, t, op, root, count, in_place, misalign, 20ull * 1000000000u);
        a.scalar = scalars[r];
        pids[r] = fork();
        ck_assert(pids[r] >= 0);
        if (pids[r] == 0)
            rank_main(&g, r, &a, want, calls);
    }
    int failed = reap(pids, nranks, 120, NULL);
    ck_assert_msg(failed == 0, "%s %s %s, %d ranks, %zu elements%s, misalign %zu, seg %zu, %d blocks: %d ranks failed",
                  algo_names[algo], dtype_names[t], op_names[op], nranks, count, in_place ? " in place" : "",
                  misalign, seg_bytes, max_blocks, failed);
    free(want);
    group_free(&g);
}

/* ---- cases ------------------------------------------------------------------ */

/* Every dtype x op, both all-reduce algorithms, 3 ranks, a count that
 * leaves a tail in every block and crosses chunks. */
START_TEST(test_every_dtype_op)
{
    braid_dtype t = (braid_dtype)(_i / BRAID_OP_COUNT);
    braid_op op = (braid_op)(_i % BRAID_OP_COUNT);
    run_case(BRAID_DEVCOLL_ONESHOT, t, op, 3, 1003, 0, 0, 256, 4, 1);
    run_case(BRAID_DEVCOLL_TWOSHOT, t, op, 3, 1003, 1, 0, 256, 4, 1);
}
END_TEST

/* 1 to 8 ranks, odd and even counts, in and out of place. */
START_TEST(test_rank_counts)
{
    int n = _i + 1;
    static const size_t counts[] = {1, 5, 64, 4099};
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
        run_case(BRAID_DEVCOLL_ONESHOT, BRAID_F32, BRAID_SUM, n, counts[c], c % 2, 0, 1024, 2, 1);
        run_case(BRAID_DEVCOLL_TWOSHOT, BRAID_I32, BRAID_AVG, n, counts[c], (c + 1) % 2, 0, 1024, 2, 1);
        run_case(BRAID_DEVCOLL_BROADCAST, BRAID_BF16, BRAID_SUM, n, counts[c], c % 2, 0, 1024, 2, 1);
    }
}
END_TEST

/* Buffers off 16-byte alignment take the per-element paths. */
START_TEST(test_unaligned)
{
    run_case(BRAID_DEVCOLL_ONESHOT, BRAID_F16, BRAID_SUM, 2, 777, 0, 1, 512, 2, 1);
    run_case(BRAID_DEVCOLL_TWOSHOT, BRAID_I8, BRAID_MAX, 3, 777, 0, 3, 512, 2, 1);
    run_case(BRAID_DEVCOLL_TWOSHOT, BRAID_F64, BRAID_MULSUM, 4, 777, 1, 1, 512, 2, 1);
    run_case(BRAID_DEVCOLL_BROADCAST, BRAID_U8, BRAID_SUM, 3, 777, 0, 5, 512, 2, 1);
}
END_TEST

/* The smallest segments: hundreds of chunks per block, both slots many
 * times over, and several calls with the same arguments, each starting
 * where the last one left the counters (a replayed graph does this). */
START_TEST(test_many_chunks_and_replays)
{
    run_case(BRAID_DEVCOLL_ONESHOT, BRAID_I64, BRAID_SUM, 4, 3001, 0, 0, 64, 3, 3);
    run_case(BRAID_DEVCOLL_TWOSHOT, BRAID_U32, BRAID_PROD, 5, 3001, 1, 0, 80, 3, 3);
    run_case(BRAID_DEVCOLL_BROADCAST, BRAID_F32, BRAID_SUM, 3, 3001, 0, 0, 48, 3, 3);
}
END_TEST

/* Rank 2 never calls. Ranks 0 and 1 must give up and name it: after their
 * timeout, or at once when the host sets abort. */
static void missing_rank(int use_abort)
{
    group g;
    size_t count = 4096;
    group_make(&g, 3, 2, 1024, count * 4);
    pid_t pids[2];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int r = 0; r < 2; r++) {
        braid_devcoll_args a = args_for(&g, r, BRAID_DEVCOLL_ONESHOT, BRAID_F32, BRAID_SUM, 0, count, 0, 0,
                                        use_abort ? 0 : 300ull * 1000000u);
        pids[r] = fork();
        ck_assert(pids[r] >= 0);
        if (pids[r] == 0)
            _exit(braid__cuda_devcoll(&a, NULL) == BRAID_OK ? 0 : 2);
    }
    if (use_abort) {
        usleep(200 * 1000);
        *g.abort_flag = 1;
    }
    int failed = reap(pids, 2, 30, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    ck_assert_msg(failed == 0, "%d ranks failed to return", failed);
    for (int r = 0; r < 2; r++) {
        uint32_t want = use_abort ? BRAID_DEVCOLL_ABORTED : BRAID_DEVCOLL_TIMED_OUT;
        ck_assert_msg(g.fault[r].code == want, "rank %d: fault code %u, want %u", r, g.fault[r].code, want);
        ck_assert_msg(g.fault[r].peer == 2, "rank %d: names peer %d, want 2", r, g.fault[r].peer);
    }
    ck_assert_msg(s < 10.0, "took %.1f s to give up", s);
    group_free(&g);
}

START_TEST(test_missing_rank_times_out)
{
    missing_rank(0);
}
END_TEST

START_TEST(test_missing_rank_aborts)
{
    missing_rank(1);
}
END_TEST

START_TEST(test_bad_arguments)
{
    group g;
    group_make(&g, 2, 2, 256, 1024);
    braid_devcoll_args a = args_for(&g, 0, BRAID_DEVCOLL_ONESHOT, BRAID_F32, BRAID_SUM, 0, 16, 0, 0, 0);
    braid_devcoll_args b = a;
    b.nranks = MAXR + 1;
    ck_assert_int_eq(braid__cuda_devcoll(&b, NULL), BRAID_ERR_INVALID_ARG);
    b = a;
    b.seg_bytes = 24;
    ck_assert_int_eq(braid__cuda_devcoll(&b, NULL), BRAID_ERR_INVALID_ARG);
    b = a;
    b.nblocks = 0;
    ck_assert_int_eq(braid__cuda_devcoll(&b, NULL), BRAID_ERR_INVALID_ARG);
    b = a;
    b.data[1] = NULL;
    ck_assert_int_eq(braid__cuda_devcoll(&b, NULL), BRAID_ERR_INVALID_ARG);
    ck_assert_msg(strstr(braid_last_error(), "rank 1") != NULL, "%s", braid_last_error());
    b = a;
    b.algo = BRAID_DEVCOLL_BROADCAST;
    b.root = 2;
    ck_assert_int_eq(braid__cuda_devcoll(&b, NULL), BRAID_ERR_INVALID_ARG);
    b = a;
    b.count = 0;
    b.send = NULL;
    ck_assert_int_eq(braid__cuda_devcoll(&b, NULL), BRAID_OK); /* nothing to do */
    group_free(&g);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("device_coll");
    TCase *tc = tcase_create("emulated");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, test_every_dtype_op, 0, BRAID_DTYPE_COUNT * BRAID_OP_COUNT);
    tcase_add_loop_test(tc, test_rank_counts, 0, MAXR);
    tcase_add_test(tc, test_unaligned);
    tcase_add_test(tc, test_many_chunks_and_replays);
    tcase_add_test(tc, test_missing_rank_times_out);
    tcase_add_test(tc, test_missing_rank_aborts);
    tcase_add_test(tc, test_bad_arguments);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
