/* Fingerprints and in-order completion for the block rings
 * (ring_allgather.c, ring_reduce_scatter.c): the bookkeeping both share,
 * while each keeps its own posting and data handling. */
#include "algo.h"
#include "status.h"

braid_status braid__ring_flow_start(braid_ring_flow *f, const braid_coll *coll)
{
    braid__fp_encode(coll, f->fp_mine);
    BRAID_CHECK(f->to_next->ops->isend(f->to_next, &f->fp_send_req, f->fp_mine, sizeof(f->fp_mine)));
    BRAID_CHECK(f->from_prev->ops->irecv(f->from_prev, &f->fp_recv_req, f->fp_theirs, sizeof(f->fp_theirs)));
    f->fp_sent = f->fp_checked = 0;
    return BRAID_OK;
}

braid_status braid__ring_flow_poll(braid_algo_run *run, braid_ring_flow *f, int *moved)
{
    int done;
    /* No data is accepted before the previous rank's fingerprint matched. */
    if (!f->fp_checked) {
        BRAID_CHECK(braid__algo_test(run, &f->fp_recv_req, &done));
        if (done) {
            BRAID_CHECK(braid__fp_check(run, f->prev, f->fp_theirs));
            f->fp_checked = *moved = 1;
        }
    }
    while (f->fp_checked && f->done_r < f->posted_r) {
        BRAID_CHECK(braid__algo_test(run, &f->recv_reqs[f->done_r % f->recv_window], &done));
        if (!done)
            break;
        f->done_r++;
        *moved = 1;
    }
    if (!f->fp_sent) {
        BRAID_CHECK(braid__algo_test(run, &f->fp_send_req, &f->fp_sent));
        *moved |= f->fp_sent;
    }
    while (f->done_s < f->posted_s) {
        BRAID_CHECK(braid__algo_test(run, &f->send_reqs[f->done_s % f->send_window], &done));
        if (!done)
            break;
        f->done_s++;
        *moved = 1;
    }
    return BRAID_OK;
}
