/* Refused calls: the notice to the peers and its reading (refuse.h). */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "algo/algo.h"
#include "log.h"
#include "pg.h"
#include "pg_shrink.h"
#include "refuse.h"
#include "status.h"
#include "bytes.h"

/* Longest the refusing rank spends leaving notices in its peers' stores. */
#define NOTICE_SEND_MS 2000
/* After a peer's close: how long to wait for a notice. The refusing rank
 * left its notices before it closed a link, so one is there already; this
 * bounds only what a plain close (a peer that died) pays. */
#define NOTICE_WAIT_MS 50

#define NOTICE_MAGIC "BRFN"
#define NOTICE_BYTES 36
/* magic[4] | rank u32 | kind u8 | code u8 | arg u8 | 0 u8 | seq u64 |
 * pg_tag u64 | value u64; big endian. */

typedef enum {
    REFUSED_OTHER = 1,    /* a check without a code (overlap, device memory...) */
    REFUSED_NULL_BUF = 2, /* arg: which buffer; value: the count */
    REFUSED_DTYPE = 3,    /* value: the dtype */
    REFUSED_OP = 4,       /* value: the op */
    REFUSED_ROOT = 5,     /* value: the root */
    REFUSED_COUNT = 6,    /* value: the count, which overflows */
    REFUSED_PEER = 7,     /* value: the send's or receive's peer (out of range, or the rank itself) */
    REFUSED_MAX = REFUSED_PEER
} refused_code;

enum { BUF_NONE = 0, BUF_SEND = 1, BUF_RECV = 2, BUF_BUF = 3, BUF_MAX = BUF_BUF };
static const char *const buffer_names[] = {"?", "send", "recv", "buf"};

typedef struct {
    uint32_t rank;
    int kind, code, arg;
    uint64_t seq, pg_tag, value;
} notice;

/* A mismatch found by one rank, for the others: magic[4] | finder u32 |
 * its peer u32 | 0 u32 | pg_tag u64 | the finder's call | the peer's call
 * (fingerprints as on the data links, algo.h). */
#define MISMATCH_MAGIC "BRMM"
#define MISMATCH_BYTES (24 + 2 * BRAID_FP_BYTES)
#define NOTICE_MAX (MISMATCH_BYTES > NOTICE_BYTES ? MISMATCH_BYTES : NOTICE_BYTES)

static void notice_encode(const notice *n, uint8_t out[NOTICE_BYTES])
{
    memcpy(out, NOTICE_MAGIC, 4);
    braid__put_be32(out + 4, n->rank);
    out[8] = (uint8_t)n->kind;
    out[9] = (uint8_t)n->code;
    out[10] = (uint8_t)n->arg;
    out[11] = 0;
    braid__put_be64(out + 12, n->seq);
    braid__put_be64(out + 20, n->pg_tag);
    braid__put_be64(out + 28, n->value);
}

/* The calls a rank refuses to its peers, and so the kinds a notice may
 * name: every call but a group (braid_coll_kind). */
static int refusable(int k)
{
    return braid__kind_valid(k) && k != BRAID_COLL_GROUP;
}

/* "allreduce #3" for a call named name of this kind; a send or receive
 * has no sequence number. */
static void call_name(char *out, size_t size, const char *name, int kind, uint64_t seq)
{
    if (braid__kind(kind)->p2p)
        snprintf(out, size, "%s", name);
    else
        snprintf(out, size, "%s #%" PRIu64, name, seq);
}

/* Every field checked: 1 when buf is a notice from another member of this
 * group, of call seq or an earlier one (whose peers' calls did not need
 * the refusing rank, as a broadcast's other ranks may not). */
static int notice_decode(const braid_pg *pg, uint64_t seq, const uint8_t *buf, size_t len, notice *n)
{
    if (len != NOTICE_BYTES || memcmp(buf, NOTICE_MAGIC, 4) != 0 || buf[11] != 0)
        return 0;
    n->rank = braid__get_be32(buf + 4);
    n->kind = buf[8];
    n->code = buf[9];
    n->arg = buf[10];
    n->seq = braid__get_be64(buf + 12);
    n->pg_tag = braid__get_be64(buf + 20);
    n->value = braid__get_be64(buf + 28);
    return n->rank < (uint32_t)pg->size && (int)n->rank != pg->rank && refusable(n->kind) && n->code >= 1 &&
           n->code <= REFUSED_MAX && n->arg <= BUF_MAX && n->seq <= seq && n->pg_tag == pg->ctx.pg_tag;
}

/* Whether the call needs its send (recv) buffer on this rank. */
static int needs_send(const braid_pg *pg, const braid_coll *c)
{
    return braid__blocks_on(braid__kind(c->kind)->send_blocks, pg->rank, c->root, pg->size) > 0;
}

static int needs_recv(const braid_pg *pg, const braid_coll *c)
{
    return braid__blocks_on(braid__kind(c->kind)->recv_blocks, pg->rank, c->root, pg->size) > 0;
}

/* The code of a refused call, found again from its arguments (the checks
 * at the entry points set only text). */
static void classify(const braid_pg *pg, const braid_coll *c, notice *n)
{
    size_t esize = braid_dtype_size(c->dtype);
    const braid_kind_traits *t = braid__kind(c->kind);
    n->arg = BUF_NONE;
    n->value = 0;
    if (esize == 0) {
        n->code = REFUSED_DTYPE;
        n->value = (uint64_t)(unsigned)c->dtype;
    } else if (t->has_op && (unsigned)c->op >= BRAID_OP_COUNT) {
        n->code = REFUSED_OP;
        n->value = (uint64_t)(unsigned)c->op;
    } else if (t->has_root && (c->root < 0 || c->root >= pg->size)) {
        n->code = REFUSED_ROOT;
        n->value = (uint64_t)(int64_t)c->root;
    } else if (c->count > SIZE_MAX / esize / 2 / (size_t)pg->size) {
        n->code = REFUSED_COUNT;
        n->value = c->count;
    } else if (t->p2p && c->count > 0 && !(c->kind == BRAID_COLL_SEND ? c->send : c->recv)) {
        n->code = REFUSED_NULL_BUF;
        n->arg = BUF_BUF;
        n->value = c->count;
    } else if (t->p2p && (c->peer < 0 || c->peer >= pg->size || c->peer == pg->rank)) {
        n->code = REFUSED_PEER;
        n->value = (uint64_t)(int64_t)c->peer;
    } else if (c->count > 0 && c->kind == BRAID_COLL_BROADCAST && !c->send) {
        n->code = REFUSED_NULL_BUF;
        n->arg = BUF_BUF;
        n->value = c->count;
    } else if (c->count > 0 && ((!c->send && needs_send(pg, c)) || (!c->recv && needs_recv(pg, c)))) {
        n->code = REFUSED_NULL_BUF;
        n->arg = !c->send && needs_send(pg, c) ? BUF_SEND : BUF_RECV;
        n->value = c->count;
    } else {
        n->code = REFUSED_OTHER;
    }
}

/* One key: a group breaks at its first refusal, so there is no second. */
#define NOTICE_KEY "refused"

braid_status braid__coll_refuse(braid_pg *pg, const braid_coll *intended, braid_status st)
{
    if (st != BRAID_ERR_INVALID_ARG || braid__pg_check_handle_quiet(pg) != BRAID_OK || pg->size < 2 || !pg->shrink ||
        !refusable((int)intended->kind) || atomic_load(&pg->aborted) || atomic_load(&pg->error) != BRAID_OK ||
        braid__group_open_here(pg))
        return st;
    char text[512], detail[512];
    snprintf(text, sizeof(text), "%s", braid_last_error());
    snprintf(detail, sizeof(detail), "%s", braid__error_detail());
    braid_coll c = *intended;
    c.refused = detail;
    /* Blocking: the job runs in issue order, after this rank's earlier
     * calls, and is done with c before we return. */
    (void)braid__work_submit(pg, &c, NULL);
    braid__error_set_text(text);
    return st;
}

braid_status braid__refuse_call(braid_pg *pg, braid_status st, braid_coll_kind kind, const void *send, void *recv,
                                size_t count, braid_dtype dtype, braid_op op, int root)
{
    braid_coll c = {.kind = kind, .send = send, .recv = recv, .count = count, .dtype = dtype, .op = op, .root = root};
    return st == BRAID_ERR_INVALID_ARG ? braid__coll_refuse(pg, &c, st) : st;
}

braid_status braid__refusal_run(braid_pg *pg, const braid_coll *coll)
{
    notice n = {.rank = (uint32_t)pg->rank, .kind = (int)coll->kind, .seq = coll->seq, .pg_tag = pg->ctx.pg_tag};
    classify(pg, coll, &n);
    uint8_t buf[NOTICE_BYTES];
    notice_encode(&n, buf);
    int told = braid__shrink_notice_send(pg, NOTICE_KEY, buf, sizeof(buf), NOTICE_SEND_MS);
    char name[64];
    call_name(name, sizeof(name), braid__kind(coll->kind)->name, (int)coll->kind, coll->seq);
    BRAID_INFO("rank %d: told %d of %d peers that it refused braid_%s", pg->rank, told, pg->size - 1, name);
    /* Broken from here, as after any failed call: the peers' matching
     * calls fail. Closing the links (braid__pg_fail) lets the peers blocked
     * on this rank see it at once; the text is this rank's own. */
    braid__error_quiet(BRAID_ERR_INVALID_ARG,
                       "rank %d refused braid_%s and told its peers, whose matching calls failed (%s): recreate the group",
                       pg->rank, name, coll->refused);
    braid__pg_fail(pg, BRAID_ERR_INVALID_ARG);
    return BRAID_ERR_INVALID_ARG;
}

void braid__mismatch_tell(braid_pg *pg, const braid_mismatch_seen *m)
{
    if (!m->found || pg->size < 2 || !pg->shrink || atomic_load(&pg->aborted))
        return;
    char text[512];
    snprintf(text, sizeof(text), "%s", braid_last_error());
    uint8_t buf[MISMATCH_BYTES];
    memcpy(buf, MISMATCH_MAGIC, 4);
    braid__put_be32(buf + 4, (uint32_t)pg->rank);
    braid__put_be32(buf + 8, (uint32_t)m->peer);
    braid__put_be32(buf + 12, 0);
    braid__put_be64(buf + 16, pg->ctx.pg_tag);
    memcpy(buf + 24, m->mine, BRAID_FP_BYTES);
    memcpy(buf + 24 + BRAID_FP_BYTES, m->theirs, BRAID_FP_BYTES);
    int told = braid__shrink_notice_send(pg, NOTICE_KEY, buf, sizeof(buf), NOTICE_SEND_MS);
    BRAID_INFO("rank %d: told %d of %d peers that its call and peer %d's differ", pg->rank, told, pg->size - 1,
               m->peer);
    braid__error_set_text(text);
}

/* A mismatch notice from another member of this group, in words: 0 when
 * any field is off. */
static int mismatch_explain(const braid_pg *pg, const braid_coll *coll, const uint8_t *buf, size_t len)
{
    if (len != MISMATCH_BYTES || memcmp(buf, MISMATCH_MAGIC, 4) != 0 || braid__get_be32(buf + 12) != 0 ||
        braid__get_be64(buf + 16) != pg->ctx.pg_tag)
        return 0;
    uint32_t finder = braid__get_be32(buf + 4), peer = braid__get_be32(buf + 8);
    char a[160], b[160], mine[64];
    if (finder >= (uint32_t)pg->size || (int)finder == pg->rank || peer >= (uint32_t)pg->size || peer == finder ||
        !braid__fp_describe(buf + 24, a, sizeof(a)) || !braid__fp_describe(buf + 24 + BRAID_FP_BYTES, b, sizeof(b)))
        return 0;
    call_name(mine, sizeof(mine), braid__coll_job_name(coll), (int)coll->kind, coll->seq);
    braid__error(BRAID_ERR_MISMATCH,
                 "rank %d: %s failed: rank %u found that the ranks' calls differ: rank %u called %s but rank %u "
                 "called %s",
                 pg->rank, mine, (unsigned)finder, (unsigned)finder, a, (unsigned)peer, b);
    return 1;
}

braid_status braid__refusal_explain(braid_pg *pg, const braid_coll *coll, braid_status st)
{
    if (st != BRAID_ERR_PEER || pg->size < 2 || !pg->shrink || atomic_load(&pg->aborted))
        return st;
    char saved[512], why[128];
    snprintf(saved, sizeof(saved), "%s", braid_last_error());
    uint8_t buf[NOTICE_MAX + 1];
    size_t len = 0;
    notice n;
    if (braid__shrink_notice_wait(pg, NOTICE_KEY, buf, sizeof(buf), &len, NOTICE_WAIT_MS) != BRAID_OK) {
        braid__error_set_text(saved);
        return st;
    }
    if (mismatch_explain(pg, coll, buf, len))
        return BRAID_ERR_MISMATCH;
    if (!notice_decode(pg, coll->seq, buf, len, &n)) {
        braid__error_set_text(saved);
        return st;
    }
    switch (n.code) {
    case REFUSED_NULL_BUF:
        snprintf(why, sizeof(why), "%s is NULL with count %" PRIu64, buffer_names[n.arg], n.value);
        break;
    case REFUSED_DTYPE:
        snprintf(why, sizeof(why), "invalid dtype %" PRIu64, n.value);
        break;
    case REFUSED_OP:
        snprintf(why, sizeof(why), "invalid op %" PRIu64, n.value);
        break;
    case REFUSED_ROOT:
        snprintf(why, sizeof(why), "root %" PRId64 " out of range [0, %d)", (int64_t)n.value, pg->size);
        break;
    case REFUSED_COUNT:
        snprintf(why, sizeof(why), "count %" PRIu64 " overflows", n.value);
        break;
    case REFUSED_PEER:
        if ((int64_t)n.value == (int64_t)n.rank)
            snprintf(why, sizeof(why), "peer %" PRId64 " is itself, outside a group", (int64_t)n.value);
        else
            snprintf(why, sizeof(why), "peer %" PRId64 " out of range [0, %d)", (int64_t)n.value, pg->size);
        break;
    default:
        snprintf(why, sizeof(why), "invalid arguments (rank %u's own error says which)", (unsigned)n.rank);
        break;
    }
    char mine[64], theirs[64];
    call_name(mine, sizeof(mine), braid__coll_job_name(coll), (int)coll->kind, coll->seq);
    call_name(theirs, sizeof(theirs), braid__kind(n.kind)->name, n.kind, n.seq);
    st = braid__error(BRAID_ERR_PEER, "rank %d: %s failed: rank %u refused braid_%s: %s", pg->rank, mine, (unsigned)n.rank, theirs, why);
    return st;
}
