/* The pipelined engine (pipeline.h): posting within the windows, in-order
 * completion, the gates between items, fingerprints and waiting. */
#include "pipeline.h"
#include "status.h"

static braid_status connect_links(braid_pipeline *p)
{
    const braid_algo_ctx *ctx = p->run->ctx;
    if (p->nconns > 0)
        return BRAID_OK; /* the schedule's own */
    p->to_next = p->from_prev = NULL;
    p->nconns = 0;
    if (p->next >= 0) {
        BRAID_CHECK(braid__ctx_conn(ctx, p->next, &p->to_next));
        p->conns[p->nconns++] = p->to_next;
    }
    if (p->prev >= 0) {
        BRAID_CHECK(braid__ctx_conn(ctx, p->prev, &p->from_prev));
        if (p->from_prev != p->to_next)
            p->conns[p->nconns++] = p->from_prev;
    }
    return BRAID_OK;
}

static braid_status start_fingerprints(braid_pipeline *p)
{
    braid_algo_run *run = p->run;
    p->fp_sent = !p->fp || !p->to_next;
    p->fp_checked = !p->fp || !p->from_prev;
    p->back_done = 1;
    if (!p->fp)
        return BRAID_OK;
    braid__fp_encode(run->coll, p->fp_mine);
    if (p->to_next)
        BRAID_CHECK(braid__conn_isend(p->to_next, &p->fp_send_req, p->fp_mine, sizeof(p->fp_mine)));
    if (p->from_prev)
        BRAID_CHECK(braid__fp_recv(run, p->from_prev, p->prev));
    if (p->fp_back && p->to_next && p->from_prev) {
        BRAID_CHECK(braid__fp_back_start(run, &p->back, p->fp_mine, p->prev, p->next));
        p->back_done = 0;
    }
    return BRAID_OK;
}

static inline int combine_ready(const braid_pipeline *p)
{
    return p->combined < p->done_r && (p->combined < p->combine_lead || p->combined < p->done_s);
}

static inline braid_status combine_ready_items(braid_pipeline *p, int *moved)
{
    if (!p->hooks->combine) {
        *moved |= p->combined != p->done_r;
        p->combined = p->done_r;
        return BRAID_OK;
    }
    while (combine_ready(p)) {
        BRAID_CHECK(p->hooks->combine(p, p->combined));
        p->combined++;
        *moved = 1;
    }
    return BRAID_OK;
}

/* Send k may be produced: within the window, and past the lead once the
 * receive it forwards is combined. */
static inline int send_open(const braid_pipeline *p, size_t k)
{
    return k < p->sends && k - p->done_s < BRAID_PIPE_WINDOW &&
           (k < p->send_lead || k - p->send_lead < p->combined);
}

static inline braid_status post_sends(braid_pipeline *p, int *moved)
{
    if (p->hooks->stage_send) {
        while (send_open(p, p->staged_s)) {
            BRAID_CHECK(p->hooks->stage_send(p, p->staged_s));
            p->staged_s++;
            *moved = 1;
        }
    }
    while (p->hooks->stage_send ? p->posted_s < p->staged_s : send_open(p, p->posted_s)) {
        const void *buf;
        size_t bytes;
        BRAID_CHECK(p->hooks->send_item(p, p->posted_s, &buf, &bytes));
        if (!buf)
            break;
        BRAID_CHECK(braid__conn_isend(p->to_next, &p->send_reqs[p->posted_s % BRAID_PIPE_WINDOW], buf, bytes));
        p->posted_s++;
        *moved = 1;
    }
    return BRAID_OK;
}

static inline braid_status post_recvs(braid_pipeline *p, int *moved)
{
    size_t freed = p->slot_forwarded ? p->done_s : p->combined;
    while (p->posted_r < p->recvs && p->posted_r - freed < (size_t)p->recv_slots) {
        void *buf;
        size_t bytes;
        BRAID_CHECK(p->hooks->recv_item(p, p->posted_r, &buf, &bytes));
        if (!buf)
            break;
        BRAID_CHECK(
            p->from_prev->ops->irecv(p->from_prev, &p->recv_reqs[p->posted_r % BRAID_PIPE_WINDOW], buf, bytes));
        p->posted_r++;
        *moved = 1;
    }
    return BRAID_OK;
}

/* Receives complete in order, only once the previous rank's fingerprint
 * matched; each is combined at once where its gate allows. */
static inline braid_status complete_recvs(braid_pipeline *p, int *moved)
{
    int done;
    if (!p->fp_checked) {
        BRAID_CHECK(braid__fp_poll(p->run, &p->fp_checked));
        *moved |= p->fp_checked;
    }
    while (p->fp_checked && p->done_r < p->posted_r) {
        BRAID_CHECK(braid__algo_test(p->run, &p->recv_reqs[p->done_r % BRAID_PIPE_WINDOW], &done));
        if (!done)
            break;
        p->done_r++;
        *moved = 1;
        BRAID_CHECK(combine_ready_items(p, moved));
    }
    return BRAID_OK;
}

static inline braid_status complete_sends(braid_pipeline *p, int *moved)
{
    int done;
    if (!p->fp_sent) {
        BRAID_CHECK(braid__algo_test(p->run, &p->fp_send_req, &p->fp_sent));
        *moved |= p->fp_sent;
    }
    if (!p->back_done) {
        BRAID_CHECK(braid__fp_back_poll(p->run, &p->back, &p->back_done));
        *moved |= p->back_done;
    }
    while (p->done_s < p->posted_s) {
        BRAID_CHECK(braid__algo_test(p->run, &p->send_reqs[p->done_s % BRAID_PIPE_WINDOW], &done));
        if (!done)
            break;
        p->done_s++;
        *moved = 1;
    }
    /* Combines held back until their partial was forwarded. */
    return combine_ready_items(p, moved);
}

static inline int items_done(const braid_pipeline *p)
{
    return p->fp_sent && p->fp_checked && p->back_done && p->combined == p->recvs && p->done_s == p->sends;
}

braid_status braid__pipeline_run(braid_pipeline *p)
{
    const braid_pipeline_hooks *h = p->hooks;
    p->staged_s = p->posted_s = p->done_s = p->posted_r = p->done_r = p->combined = 0;
    if (p->recv_slots < 1 || p->recv_slots > BRAID_PIPE_WINDOW)
        p->recv_slots = BRAID_PIPE_WINDOW;
    BRAID_CHECK(connect_links(p));
    BRAID_CHECK(start_fingerprints(p));
    int started = !h->started;
    for (;;) {
        int moved = 0, done = 1, waited = 0;
        BRAID_CHECK(post_sends(p, &moved));
        BRAID_CHECK(post_recvs(p, &moved));
        if (!started) {
            h->started(p);
            started = 1;
        }
        BRAID_CHECK(complete_recvs(p, &moved));
        BRAID_CHECK(complete_sends(p, &moved));
        if (items_done(p)) {
            if (h->finish)
                BRAID_CHECK(h->finish(p, &done));
            if (done)
                return BRAID_OK;
        }
        if (moved)
            continue;
        if (h->idle)
            BRAID_CHECK(h->idle(p, &waited));
        if (!waited)
            BRAID_CHECK(braid__algo_wait(p->run, p->conns, p->nconns,
                                         p->done_r < p->recvs || !p->fp_checked ? p->prev : p->next));
    }
}
