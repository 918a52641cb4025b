/* CUDA kernels (cuda/): results bit for bit equal to the CPU engine for
 * every dtype x op, odd sizes, unaligned and mixed-alignment pointers,
 * in place, 1..8 inputs, pre-multiplied sums and reduce+cast. Exits 77
 * (meson: skipped) with the reason when there is no usable device.
 *
 * The CPU reference for several inputs follows the kernels' documented
 * rule: widen to the compute type, fold left to right with the CPU engine,
 * finish (AVG) on the last fold, narrow once.
 *
 * Built twice: 'cuda' against the real kernels, and 'cuda-emu' against
 * reduce_kernels.cu compiled for the host (cuda/emu/), which checks the
 * kernel logic on machines without a GPU. */
#include <check.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "braid_cuda.h"
#include "dtype_compare.h"
#include "reduce/reduce.h"

static const char *const dtype_names[] = {"f32", "f64", "f16", "bf16", "i8", "u8", "i32", "i64"};
static const char *const op_names[] = {"sum", "prod", "min", "max", "avg"};

static size_t dsize(braid_dtype t)
{
    static const size_t sizes[BRAID_DTYPE_COUNT] = {4, 8, 2, 2, 1, 1, 4, 8, 4, 8};
    return sizes[t];
}

static int is_half(braid_dtype t)
{
    return t == BRAID_F16 || t == BRAID_BF16;
}

static uint64_t rng = 0x243f6a8885a308d3ull;
static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* Random bits (NaN, inf, subnormals included) mixed with ordinary values. */
static void fill(braid_dtype t, void *buf, size_t n)
{
    unsigned char *p = buf;
    for (size_t i = 0; i < n; i++) {
        uint64_t v = rnd(), r = rnd() % 4;
        if (r >= 2) { /* ordinary: small exponents, small integers */
            switch (t) {
            case BRAID_F32: v = (v & 0x807fffffu) | ((uint64_t)(120 + v % 16) << 23); break;
            case BRAID_F64: v = (v & 0x800fffffffffffffull) | ((uint64_t)(1016 + v % 16) << 52); break;
            case BRAID_F16: v = (v & 0x83ffu) | ((uint64_t)(8 + (v >> 20) % 16) << 10); break;
            case BRAID_BF16: v = (v & 0x807fu) | ((uint64_t)(120 + (v >> 20) % 16) << 7); break;
            default: v %= 64; break;
            }
        }
        memcpy(p + i * dsize(t), &v, dsize(t));
    }
}

/* Equal bits, or both NaN where the definition leaves the payload open
 * (dtype_compare.h). */
static void compare(braid_dtype t, braid_op op, const void *got, const void *want, size_t n, const char *what)
{
    long i = dtype_first_difference(t, op, got, want, n);
    if (i < 0)
        return;
    size_t es = dsize(t);
    uint64_t gv = 0, wv = 0;
    memcpy(&gv, (const unsigned char *)got + (size_t)i * es, es);
    memcpy(&wv, (const unsigned char *)want + (size_t)i * es, es);
    ck_abort_msg("%s: %s %s elem %ld of %zu: gpu 0x%" PRIx64 " cpu 0x%" PRIx64, what, dtype_names[t], op_names[op],
                 i, n, gv, wv);
}

/* CPU reference of the kernels' rule. srcs are host copies of src_t. */
static void cpu_reference(braid_dtype dst_t, void *out, braid_dtype src_t, braid_op op,
                          void *const *srcs, int nsrcs, size_t n, int nranks)
{
    /* compute type: f32 when halves are involved, else the dtype itself */
    braid_dtype ct = (is_half(src_t) || is_half(dst_t) || src_t != dst_t) ? BRAID_F32 : src_t;
    size_t cs = dsize(ct);
    unsigned char *acc = malloc(n * cs + 1), *tmp = malloc(n * cs + 1);
    ck_assert(acc && tmp);
    braid__cast(ct, acc, src_t, srcs[0], n);
    for (int k = 1; k < nsrcs; k++) {
        braid__cast(ct, tmp, src_t, srcs[k], n);
        if (k == nsrcs - 1)
            braid__reduce_final(ct, op, acc, acc, tmp, n, nranks);
        else
            braid__reduce(ct, op, acc, acc, tmp, n);
    }
    if (nsrcs == 1)
        braid__reduce_scale(ct, op, acc, n, nranks);
    braid__cast(dst_t, out, ct, acc, n);
    free(acc);
    free(tmp);
}

/* Device buffer with a byte offset; freed through base. */
typedef struct {
    unsigned char *base;
    unsigned char *p;
} dbuf;

static dbuf dalloc(size_t bytes, size_t offset)
{
    dbuf b;
    braid_status st = braid__cuda_malloc((void **)&b.base, bytes + 64);
    ck_assert_msg(st == BRAID_OK, "cuda malloc: %s", braid_last_error());
    b.p = b.base + offset;
    return b;
}

static void h2d(void *d, const void *h, size_t bytes)
{
    ck_assert_msg(braid__cuda_memcpy_async(d, h, bytes, NULL) == BRAID_OK, "%s", braid_last_error());
    ck_assert_msg(braid__cuda_stream_sync(NULL) == BRAID_OK, "%s", braid_last_error());
}

static void d2h(void *h, const void *d, size_t bytes)
{
    h2d(h, d, bytes); /* cudaMemcpyDefault works out the direction */
}

/* One GPU call checked against the CPU: nsrcs inputs of src_t, output
 * dst_t; offs[k] are element offsets (srcs 0..7, then dst). in_place: dst
 * is srcs[0] (needs dst_t == src_t). */
static void run(braid_dtype dst_t, braid_dtype src_t, braid_op op, int nsrcs, size_t n, int nranks,
                const size_t *offs, int in_place)
{
    size_t ss = dsize(src_t), ds = dsize(dst_t);
    void *host[BRAID_CUDA_MAX_SRCS];
    dbuf dev[BRAID_CUDA_MAX_SRCS], dout;
    const void *dptr[BRAID_CUDA_MAX_SRCS];
    for (int k = 0; k < nsrcs; k++) {
        host[k] = malloc(n * ss + 1);
        ck_assert_ptr_nonnull(host[k]);
        fill(src_t, host[k], n);
        dev[k] = dalloc(n * ss, offs[k] * ss);
        h2d(dev[k].p, host[k], n * ss);
        dptr[k] = dev[k].p;
    }
    void *dst;
    if (in_place) {
        dst = dev[0].p;
    } else {
        dout = dalloc(n * ds, offs[BRAID_CUDA_MAX_SRCS] * ds);
        dst = dout.p;
    }
    braid_status st = dst_t == src_t ? braid__cuda_reduce(dst_t, op, dst, dptr, nsrcs, n, nranks, NULL)
                                     : braid__cuda_reduce_cast(dst_t, dst, src_t, op, dptr, nsrcs, n, nranks, NULL);
    ck_assert_msg(st == BRAID_OK, "launch: %s", braid_last_error());
    ck_assert_msg(braid__cuda_stream_sync(NULL) == BRAID_OK, "kernel: %s", braid_last_error());

    void *got = malloc(n * ds + 1), *want = malloc(n * ds + 1);
    ck_assert(got && want);
    d2h(got, dst, n * ds);
    cpu_reference(dst_t, want, src_t, op, host, nsrcs, n, nranks);
    char what[160];
    snprintf(what, sizeof(what), "%s <- %d x %s, n %zu, offs %zu/%zu%s", dtype_names[dst_t], nsrcs,
             dtype_names[src_t], n, offs[0], offs[BRAID_CUDA_MAX_SRCS], in_place ? ", in place" : "");
    compare(dst_t, op, got, want, n, what);

    for (int k = 0; k < nsrcs; k++) {
        braid__cuda_free(dev[k].base);
        free(host[k]);
    }
    if (!in_place)
        braid__cuda_free(dout.base);
    free(got);
    free(want);
}

static const size_t sizes[] = {1, 2, 3, 7, 15, 16, 17, 31, 33, 1000, 4099, 100003};
static const size_t zero_offs[BRAID_CUDA_MAX_SRCS + 1] = {0};

/* Two inputs: exactly braid__reduce_final on the CPU. */
START_TEST(test_two_inputs)
{
    braid_dtype t = (braid_dtype)(_i / BRAID_OP_COUNT);
    braid_op op = (braid_op)(_i % BRAID_OP_COUNT);
    rng += (uint64_t)_i;
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        size_t same[BRAID_CUDA_MAX_SRCS + 1], mixed[BRAID_CUDA_MAX_SRCS + 1];
        for (int k = 0; k <= BRAID_CUDA_MAX_SRCS; k++) {
            same[k] = s % 5;             /* common misalignment: head + 128-bit body */
            mixed[k] = (s + (size_t)k) % 3; /* cannot align together: per-element path */
        }
        run(t, t, op, 2, sizes[s], 4, zero_offs, 0);
        run(t, t, op, 2, sizes[s], 3, same, 0);
        run(t, t, op, 2, sizes[s], 7, mixed, 0);
        run(t, t, op, 2, sizes[s], 2, same, 1);
    }
    run(t, t, op, 2, (1u << 22) + 5, 8, zero_offs, 0); /* more groups than threads: grid-stride */
}
END_TEST

START_TEST(test_multi_input)
{
    braid_dtype t = (braid_dtype)(_i / BRAID_OP_COUNT);
    braid_op op = (braid_op)(_i % BRAID_OP_COUNT);
    rng += 1000 + (uint64_t)_i;
    for (int nsrcs = 1; nsrcs <= BRAID_CUDA_MAX_SRCS; nsrcs++) {
        size_t offs[BRAID_CUDA_MAX_SRCS + 1];
        for (int k = 0; k <= BRAID_CUDA_MAX_SRCS; k++)
            offs[k] = (size_t)(nsrcs % 2);
        run(t, t, op, nsrcs, 1000 + (size_t)nsrcs, nsrcs + 1, offs, 0);
        run(t, t, op, nsrcs, 33, 5, zero_offs, 1);
    }
}
END_TEST

/* f32/f16/bf16 in any combination, f32 accumulation. */
START_TEST(test_reduce_cast)
{
    static const braid_dtype fl[] = {BRAID_F32, BRAID_F16, BRAID_BF16};
    braid_dtype dst_t = fl[_i / 3], src_t = fl[_i % 3];
    rng += 2000 + (uint64_t)_i;
    for (int op = 0; op < BRAID_OP_COUNT; op++) {
        for (int nsrcs = 1; nsrcs <= BRAID_CUDA_MAX_SRCS; nsrcs += 3) {
            run(dst_t, src_t, (braid_op)op, nsrcs, 4099, 4, zero_offs, 0);
            size_t offs[BRAID_CUDA_MAX_SRCS + 1] = {1, 1, 1, 1, 1, 1, 1, 1, 3};
            run(dst_t, src_t, (braid_op)op, nsrcs, 1001, 6, offs, 0);
        }
    }
}
END_TEST

START_TEST(test_premul)
{
    static const braid_dtype fl[] = {BRAID_F32, BRAID_F64, BRAID_F16, BRAID_BF16};
    braid_dtype t = fl[_i];
    size_t n = 10007, es = dsize(t);
    const double scale = 0.125 + 1.0 / 3.0;
    for (int nsrcs = 1; nsrcs <= BRAID_CUDA_MAX_SRCS; nsrcs++) {
        void *host[BRAID_CUDA_MAX_SRCS];
        dbuf dev[BRAID_CUDA_MAX_SRCS];
        const void *dptr[BRAID_CUDA_MAX_SRCS];
        for (int k = 0; k < nsrcs; k++) {
            host[k] = malloc(n * es);
            fill(t, host[k], n);
            dev[k] = dalloc(n * es, (size_t)(k == 0) * es);
            h2d(dev[k].p, host[k], n * es);
            dptr[k] = dev[k].p;
        }
        dbuf out = dalloc(n * es, es);
        ck_assert_msg(braid__cuda_reduce_premul(t, out.p, dptr, nsrcs, n, scale, NULL) == BRAID_OK, "%s",
                      braid_last_error());
        ck_assert_msg(braid__cuda_stream_sync(NULL) == BRAID_OK, "%s", braid_last_error());
        void *got = malloc(n * es), *want = malloc(n * es);
        d2h(got, out.p, n * es);
        /* reference: plain loops in the compute type */
        if (t == BRAID_F64) {
            for (size_t i = 0; i < n; i++) {
                double acc = 0;
                for (int k = 0; k < nsrcs; k++) {
                    double x = ((double *)host[k])[i] * scale;
                    acc = k == 0 ? x : acc + x;
                }
                ((double *)want)[i] = acc;
            }
        } else {
            float *acc = malloc(n * 4), *x = malloc(n * 4);
            for (int k = 0; k < nsrcs; k++) {
                braid__cast(BRAID_F32, x, t, host[k], n);
                for (size_t i = 0; i < n; i++) {
                    float v = x[i] * (float)scale;
                    acc[i] = k == 0 ? v : acc[i] + v;
                }
            }
            braid__cast(t, want, BRAID_F32, acc, n);
            free(acc);
            free(x);
        }
        compare(t, BRAID_SUM, got, want, n, "premul");
        for (int k = 0; k < nsrcs; k++) {
            braid__cuda_free(dev[k].base);
            free(host[k]);
        }
        braid__cuda_free(out.base);
        free(got);
        free(want);
    }
}
END_TEST

START_TEST(test_errors)
{
    dbuf a = dalloc(64, 0);
    const void *srcs[9] = {a.p, a.p, a.p, a.p, a.p, a.p, a.p, a.p, a.p};
    ck_assert_int_eq(braid__cuda_reduce(BRAID_F32, BRAID_SUM, a.p, srcs, 0, 4, 1, NULL), BRAID_ERR_INVALID_ARG);
    ck_assert_int_eq(braid__cuda_reduce(BRAID_F32, BRAID_SUM, a.p, srcs, 9, 4, 1, NULL), BRAID_ERR_INVALID_ARG);
    ck_assert_int_eq(braid__cuda_reduce(BRAID_F32, BRAID_AVG, a.p, srcs, 2, 4, 0, NULL), BRAID_ERR_INVALID_ARG);
    ck_assert_int_eq(braid__cuda_reduce(BRAID_F32, BRAID_SUM, NULL, srcs, 2, 4, 1, NULL), BRAID_ERR_INVALID_ARG);
    ck_assert_int_eq(braid__cuda_reduce((braid_dtype)99, BRAID_SUM, a.p, srcs, 2, 4, 1, NULL), BRAID_ERR_INVALID_ARG);
    ck_assert_int_eq(braid__cuda_reduce_cast(BRAID_F32, a.p, BRAID_I32, BRAID_SUM, srcs, 2, 4, 1, NULL),
                     BRAID_ERR_UNSUPPORTED);
    ck_assert_int_eq(braid__cuda_reduce_premul(BRAID_I32, a.p, srcs, 2, 4, 0.5, NULL), BRAID_ERR_UNSUPPORTED);
    ck_assert(strstr(braid_last_error(), "i32") != NULL);
    /* nothing to do: no launch, no pointer touched */
    ck_assert_int_eq(braid__cuda_reduce(BRAID_F32, BRAID_SUM, NULL, NULL, 2, 0, 1, NULL), BRAID_OK);
    int dev = -5;
    ck_assert_int_eq(braid__cuda_ptr_kind(a.p, &dev), BRAID_CUDA_PTR_DEVICE);
    ck_assert_int_ge(dev, 0);
#ifndef BRAID_CUDA_EMULATION /* the emulation calls all memory device memory */
    int on_stack = 0;
    ck_assert_int_eq(braid__cuda_ptr_kind(&on_stack, &dev), BRAID_CUDA_PTR_HOST);
    ck_assert_int_eq(dev, -1);
#endif
    ck_assert_int_gt(braid__cuda_sm_count(0), 0);
    braid__cuda_free(a.base);
}
END_TEST

/* Probe in a child so the parent never initialises CUDA: Check forks per
 * test, and a CUDA context does not survive fork. */
static int probe_device(char *reason, size_t len)
{
    int fds[2];
    if (pipe(fds) != 0)
        return 0;
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        int ok = braid__cuda_available();
        const char *why = braid__cuda_unavailable_reason();
        if (write(fds[1], why, strlen(why)) < 0)
            _exit(2);
        _exit(ok ? 0 : 1);
    }
    close(fds[1]);
    ssize_t n = read(fds[0], reason, len - 1);
    reason[n > 0 ? n : 0] = '\0';
    close(fds[0]);
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) < 0)
        return 0;
    if (!WIFEXITED(status) || WEXITSTATUS(status) == 2) {
        snprintf(reason, len, "device probe crashed");
        return 0;
    }
    return WEXITSTATUS(status) == 0;
}

int main(void)
{
    char reason[512];
    if (!probe_device(reason, sizeof(reason))) {
        printf("SKIP: no CUDA device: %s\n", reason);
        return 77;
    }
    Suite *s = suite_create("cuda");
    TCase *tc = tcase_create("kernels");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_two_inputs, 0, BRAID_DTYPE_COUNT * BRAID_OP_COUNT);
    tcase_add_loop_test(tc, test_multi_input, 0, BRAID_DTYPE_COUNT * BRAID_OP_COUNT);
    tcase_add_loop_test(tc, test_reduce_cast, 0, 9);
    tcase_add_loop_test(tc, test_premul, 0, 4);
    tcase_add_test(tc, test_errors);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
