/* Collective call fingerprints (algo/common.c): the 40-byte header a rank
 * sends ahead of a collective's data, checked by braid__fp_check against
 * the local call.
 *
 * Invariants: any 40 bytes from a peer give OK, BRAID_ERR_PEER (not a
 * fingerprint) or BRAID_ERR_MISMATCH naming both calls, never a crash or
 * an out-of-bounds read; a call's own fingerprint always matches it
 * (decode(encode(x)) == x); changing any compared byte of it gives
 * MISMATCH, the magic gives PEER, the padding nothing. */
#include <stdint.h>
#include <string.h>

#include "algo/algo.h"
#include "fuzz_common.h"
#include "status.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_quiet();
    return 0;
}

static uint64_t take64(const uint8_t *p, size_t n)
{
    uint64_t v = 0;
    for (size_t i = 0; i < n && i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

/* Byte offsets of the fingerprint: magic [0,4), compared fields [4,7) and
 * [8,28), padding 7 and [28,40). */
static int fp_byte_class(size_t i)
{
    if (i < 4)
        return 0; /* magic */
    if (i == 7 || i >= 28)
        return 2; /* padding */
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < BRAID_FP_BYTES + 24)
        return 0;
    const uint8_t *theirs = data, *p = data + BRAID_FP_BYTES;

    static braid_algo_ctx ctx; /* only rank is read */
    ctx.rank = 3;
    braid_coll c;
    memset(&c, 0, sizeof(c));
    c.kind = (braid_coll_kind)(BRAID_COLL_ALLREDUCE + p[0] % (BRAID_COLL_RECV - BRAID_COLL_ALLREDUCE + 1));
    c.op = (braid_op)(p[1] % 8);
    c.dtype = (braid_dtype)(p[2] % 16);
    c.root = (int)(take64(p + 3, 2) % 1024);
    c.count = (size_t)take64(p + 5, 8);
    c.seq = take64(p + 13, 8);
    int peer = p[21] % 64;
    braid_algo_run run;
    memset(&run, 0, sizeof(run));
    braid__algo_run_init(&run, &ctx, &c);

    /* Arbitrary bytes from a peer. */
    braid_status st = braid__fp_check(&run, peer, theirs);
    FUZZ_ASSERT(st == BRAID_OK || st == BRAID_ERR_PEER || st == BRAID_ERR_MISMATCH);
    uint8_t mine[BRAID_FP_BYTES];
    braid__fp_encode(&c, mine);
    if (st == BRAID_OK) {
        for (size_t i = 0; i < BRAID_FP_BYTES; i++)
            FUZZ_ASSERT(fp_byte_class(i) == 2 || theirs[i] == mine[i]);
    } else if (st == BRAID_ERR_PEER) {
        FUZZ_ASSERT(memcmp(theirs, mine, 4) != 0);
    } else {
        const char *text = braid_last_error();
        FUZZ_ASSERT(strstr(text, "rank 3 called #") && strstr(text, " but peer ") && strstr(text, " called #"));
    }

    /* Our own fingerprint matches us. */
    FUZZ_ASSERT(braid__fp_check(&run, peer, mine) == BRAID_OK);

    /* One byte of it changed: the classification above must hold. */
    size_t at = p[22] % BRAID_FP_BYTES;
    uint8_t flip = p[23] ? p[23] : 1;
    uint8_t bad[BRAID_FP_BYTES];
    memcpy(bad, mine, sizeof(bad));
    bad[at] ^= flip;
    static const braid_status want[3] = {BRAID_ERR_PEER, BRAID_ERR_MISMATCH, BRAID_OK};
    FUZZ_ASSERT(braid__fp_check(&run, peer, bad) == want[fp_byte_class(at)]);
    return 0;
}
