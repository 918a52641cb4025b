/* The cut of staged device calls into pieces (cuda/hmem_plan.c): every
 * element of every block in exactly one piece, pieces matching between
 * ranks, sends and receives to one peer in issue order, zero-count and
 * host-buffer ops, and every segment within one pool half. Pure code:
 * runs without CUDA. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/hmem_plan.h"
#include "hmem.h"

static const braid_mem DEV = {1, 0};

static braid_coll op_of(braid_coll_kind kind, size_t count, braid_dtype dtype, int peer_or_root)
{
    braid_coll c = {.kind = kind, .count = count, .dtype = dtype, .root = peer_or_root, .peer = peer_or_root};
    c.send_mem = kind == BRAID_COLL_RECV ? (braid_mem){0, 0} : DEV;
    c.recv_mem = kind == BRAID_COLL_SEND ? (braid_mem){0, 0} : DEV;
    return c;
}

/* Steps and pieces of op alone: every element in exactly one piece, in order. */
static void check_cover(int rank, int size, braid_coll op)
{
    braid_piece_plan p;
    braid__plan_op(rank, size, &op, &p);
    size_t need = braid__plan_layout(&p, 1), next = 0, steps = braid__plan_steps(&p, 1);
    ck_assert_uint_le(need, BRAID_HMEM_PIECE_BYTES);
    ck_assert_uint_ge(p.per, 1);
    for (size_t k = 0; k < steps; k++) {
        size_t off, len;
        ck_assert(braid__plan_piece(&p, k, &off, &len));
        ck_assert_uint_eq(off, next);
        ck_assert(len > 0 || op.count == 0);
        next += len;
    }
    ck_assert_uint_eq(next, op.count);
    size_t off, len;
    ck_assert(!braid__plan_piece(&p, steps, &off, &len));
}

START_TEST(every_kind_covers_and_fits)
{
    const braid_coll_kind kinds[] = {BRAID_COLL_ALLREDUCE, BRAID_COLL_BROADCAST, BRAID_COLL_REDUCE,
                                     BRAID_COLL_ALLGATHER, BRAID_COLL_REDUCE_SCATTER, BRAID_COLL_SEND,
                                     BRAID_COLL_RECV};
    const size_t counts[] = {0, 1, 1001, 262144, 1048576, 1048577, 30000001};
    const braid_dtype dtypes[] = {BRAID_I8, BRAID_F16, BRAID_F32, BRAID_F64};
    const int sizes[] = {1, 2, 3, 8, 257};
    for (size_t a = 0; a < sizeof(kinds) / sizeof(kinds[0]); a++)
        for (size_t b = 0; b < sizeof(counts) / sizeof(counts[0]); b++)
            for (size_t d = 0; d < sizeof(dtypes) / sizeof(dtypes[0]); d++)
                for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++)
                    check_cover(1 % sizes[s], sizes[s], op_of(kinds[a], counts[b], dtypes[d], 0));
}
END_TEST

/* All-reduce and broadcast keep whole 4 MiB pieces (a host rank of the
 * same call may count on one piece), and the root and the others of a
 * collective cut it alike. */
START_TEST(ranks_cut_alike)
{
    braid_coll ar = op_of(BRAID_COLL_ALLREDUCE, 3u << 20, BRAID_F32, -1);
    braid_piece_plan p;
    braid__plan_op(0, 4, &ar, &p);
    ck_assert_uint_eq(p.per, braid__hmem_piece_elems(4));
    ck_assert_uint_eq(p.npieces, braid__hmem_piece_count(3u << 20, 4));
    const braid_coll_kind rooted[] = {BRAID_COLL_BROADCAST, BRAID_COLL_REDUCE};
    for (int k = 0; k < 2; k++) {
        braid_coll c = op_of(rooted[k], 5000001, BRAID_F64, 2);
        braid_piece_plan root, other;
        braid__plan_op(2, 5, &c, &root);
        braid__plan_op(3, 5, &c, &other);
        ck_assert_uint_eq(root.per, other.per);
        ck_assert_uint_eq(root.npieces, other.npieces);
        ck_assert(root.down && !other.down == (rooted[k] == BRAID_COLL_BROADCAST));
        ck_assert(!root.up == (rooted[k] == BRAID_COLL_BROADCAST) && !other.up == (rooted[k] == BRAID_COLL_REDUCE));
    }
    braid_coll s = op_of(BRAID_COLL_SEND, 777777, BRAID_F32, 1), r = op_of(BRAID_COLL_RECV, 777777, BRAID_F32, 0);
    braid_piece_plan ps, pr;
    braid__plan_op(0, 6, &s, &ps);
    braid__plan_op(1, 6, &r, &pr);
    ck_assert_uint_eq(ps.per, pr.per);
    ck_assert_uint_eq(ps.npieces, pr.npieces);
}
END_TEST

/* Two sends to one peer and one to another: the second to the same peer
 * starts where the first ended and shares its area; the other peer's runs
 * from step 0 beside them. */
START_TEST(one_peer_in_issue_order)
{
    braid_coll ops[3] = {op_of(BRAID_COLL_SEND, 1u << 20, BRAID_F32, 1), op_of(BRAID_COLL_SEND, 1u << 20, BRAID_F32, 2),
                         op_of(BRAID_COLL_SEND, 300000, BRAID_F32, 1)};
    braid_piece_plan p[3];
    for (int i = 0; i < 3; i++)
        braid__plan_op(0, 4, &ops[i], &p[i]);
    braid__plan_layout(p, 3);
    ck_assert_uint_gt(p[0].npieces, 1);
    ck_assert_uint_eq(p[0].start, 0);
    ck_assert_uint_eq(p[1].start, 0);
    ck_assert_uint_eq(p[2].start, p[0].npieces);
    ck_assert_uint_eq(p[2].soff, p[0].soff);
    ck_assert_uint_ne(p[1].soff, p[0].soff);
    ck_assert_uint_eq(braid__plan_steps(p, 3), p[0].npieces + p[2].npieces);
    for (size_t k = 0; k < braid__plan_steps(p, 3); k++) {
        size_t off, len;
        ck_assert(!(braid__plan_piece(&p[0], k, &off, &len) && braid__plan_piece(&p[2], k, &off, &len)));
    }
}
END_TEST

/* A send and a receive with every peer (an all-to-all) fits one half for
 * groups of up to 512 ranks. */
START_TEST(exchange_fits_one_half)
{
    for (int n = 1; n <= 512; n = n < 8 ? n + 1 : n * 2) {
        braid_coll *ops = calloc((size_t)(2 * n), sizeof(*ops));
        braid_piece_plan *p = calloc((size_t)(2 * n), sizeof(*p));
        ck_assert(ops && p);
        for (int peer = 0; peer < n; peer++) {
            ops[2 * peer] = op_of(BRAID_COLL_SEND, 50000000, BRAID_F64, peer);
            ops[2 * peer + 1] = op_of(BRAID_COLL_RECV, 50000000, BRAID_F64, peer);
        }
        for (int i = 0; i < 2 * n; i++)
            braid__plan_op(0, n, &ops[i], &p[i]);
        ck_assert_msg(braid__plan_layout(p, 2 * n) <= BRAID_HMEM_PIECE_BYTES, "%d ranks", n);
        free(ops);
        free(p);
    }
}
END_TEST

/* A zero-count op is one empty piece (a host call of it still runs); an
 * op on host buffers is one piece, the whole op, with no area. */
START_TEST(zero_and_host_ops)
{
    braid_coll z = op_of(BRAID_COLL_RECV, 0, BRAID_F32, 1);
    braid_coll h = op_of(BRAID_COLL_SEND, 9000000, BRAID_F32, 1);
    h.send_mem = (braid_mem){0, 0};
    braid_coll d = op_of(BRAID_COLL_SEND, 9000000, BRAID_F32, 1);
    braid_coll ops[3] = {z, h, d};
    braid_piece_plan p[3];
    for (int i = 0; i < 3; i++)
        braid__plan_op(0, 2, &ops[i], &p[i]);
    size_t need = braid__plan_layout(p, 3), off, len;
    ck_assert_uint_eq(p[0].npieces, 1);
    ck_assert(braid__plan_piece(&p[0], 0, &off, &len));
    ck_assert_uint_eq(len, 0);
    ck_assert(p[1].whole);
    ck_assert_uint_eq(p[1].npieces, 1);
    ck_assert(braid__plan_piece(&p[1], 0, &off, &len));
    ck_assert_uint_eq(len, 9000000);
    ck_assert_uint_eq(p[2].start, 1); /* behind the host send to the same peer */
    ck_assert_uint_le(need, BRAID_HMEM_PIECE_BYTES);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("hmem_plan");
    TCase *tc = tcase_create("plan");
    tcase_add_test(tc, every_kind_covers_and_fits);
    tcase_add_test(tc, ranks_cut_alike);
    tcase_add_test(tc, one_peer_in_issue_order);
    tcase_add_test(tc, exchange_fits_one_half);
    tcase_add_test(tc, zero_and_host_ops);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
