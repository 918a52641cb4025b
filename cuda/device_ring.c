/* The device ring: the all-reduce of device buffers with the reduction on
 * the GPU, run on the group's executor (braid__hmem_coll_run).
 *
 * The host ring of src/algo/ring_allreduce.c (the same item order, from
 * src/algo/ring_cursor.h, and fingerprint, so it meets a host rank's ring
 * on the wire), with the data on the device:
 *
 *  receive item k (slot k % DRING_RECV_SLOTS): the transport fills
 *    rpin[slot]; then on h2d: wait for the kernel that last read
 *    dslot[slot], copy rpin -> dslot (reduce-scatter) or straight into
 *    recv (all-gather), record ev_h2d; on comp (reduce-scatter only): wait
 *    ev_h2d, run the fused kernel recv = op(send, dslot) (AVG's division in
 *    the segment's last one), record ev_kern. The pinned slot is free again
 *    once ev_h2d completed.
 *  send item j (slot j % DRING_SEND_SLOTS): step 0 sends input chunks,
 *    later steps the chunk of receive item j - step0, once its kernel ran
 *    (reduce-scatter) or it was copied into recv (all-gather): on d2h,
 *    wait for that, copy down into spin[slot], record ev_d2h, and post the
 *    send once ev_d2h completed. All-gather chunks are forwarded from the
 *    device, not from their pinned receive slot: a receive slot then never
 *    waits for a send, which would chain every rank's receives to its
 *    successor's and deadlock the ring once a segment has more chunks than
 *    the windows hold.
 *
 * A side whose connection moves device memory itself (a device link,
 * src/lifecycle/devlink.c, where the neighbour runs the device ring too; or a group
 * whose transport is cuda_ipc) skips its pinned slots: receives land in
 * dslot (reduce-scatter) or in recv (all-gather) and a slot is free once
 * the kernel that read it finished; sends go from send/recv once ev_d2h,
 * recorded on d2h after the producer, completed.
 *
 * Which connection each side uses is settled before any data moves
 * (pick_links): fingerprints go over the host links, forwards and, where
 * a device link exists, backwards, flagged as the device ring's; a side
 * takes its device link when the neighbour's flag says it runs the device
 * ring too and the link settles as usable, else the host link (a host
 * rank in the call, GPUs that cannot reach each other).
 *
 * Only the host waits on events (cudaEventQuery in the loop; a blocking
 * wait when nothing else can move), streams wait on each other through
 * events, so copies up, kernels, copies down and the network all overlap.
 *
 * The loop itself is the pipelined engine's (src/algo/pipeline.h), the one
 * every host ring and chain runs on: this file gives its hooks (stage a
 * send, a send or a slot ready, an arrival, what to block on, the end). */
#include <cuda_runtime_api.h>

#include "braid_cuda.h"
#include "devlink.h"
#include "fault_inject.h"
#include "hmem_cuda.h"
#include "algo/pipeline.h"
#include "algo/ring_cursor.h"
#include "pg_algo.h"
#include "status.h"
#include "transports/registry.h"
#include "transports/cuda_ipc/cuda_ipc.h"

/* Whether conn moves device memory itself (isend reads device memory,
 * irecv writes it, both complete only when the data has moved): the
 * cuda_ipc transport, whose copies are cudaMemcpyDefault on its own
 * stream. The device ring then skips the pinned slots on that side. In
 * the host stand-in runtime of tests/cuda_fake.c "device" memory is host
 * memory that every transport can move, and CUDA_FAKE_DIRECT=1 makes
 * every connection count, so that path runs without a GPU too. */
static int conn_takes_device_memory(const braid_conn *conn)
{
#ifdef BRAID_CUDA_FAKE
    if (braid__fault_cuda_direct())
        return 1;
#endif
    const braid_transport_ops *ipc = braid__transport_get(BRAID_TRANSPORT_CUDA_IPC);
    return ipc && conn->ops == ipc;
}

/* Control messages still going out on the device links in use (see
 * braid__cuda_ipc_tx_pending): the ring ends only once they are out. */
static braid_status links_pending(braid_conn *to_next, braid_conn *host_next, braid_conn *from_prev,
                                  braid_conn *host_prev, int *pending)
{
    int n = 0, m = 0;
    if (to_next != host_next)
        BRAID_CHECK(braid__cuda_ipc_tx_pending(to_next, &n));
    if (from_prev != host_prev && from_prev != to_next)
        BRAID_CHECK(braid__cuda_ipc_tx_pending(from_prev, &m));
    *pending = n + m;
    return BRAID_OK;
}

/* The connections the device ring moves data on (see above), once the
 * fingerprints from prev (forwards) and next (backwards, with a device
 * link only) arrived and matched. */
static braid_status pick_links(braid_pg *pg, braid_algo_run *run, braid_fp_back *back, int next, int prev, braid_conn *host_next,
                               braid_conn *host_prev, braid_conn **to_next, braid_conn **from_prev)
{
    braid_conn *dl_next = braid__devlink(pg, next), *dl_prev = braid__devlink(pg, prev);
    int fp_checked = 0, back_done = 0;
    *to_next = host_next;
    *from_prev = host_prev;
    for (;;) {
        int moved = 0;
        if (!fp_checked) {
            BRAID_CHECK(braid__fp_poll(run, &fp_checked));
            moved |= fp_checked;
        }
        if (!back_done) {
            BRAID_CHECK(braid__fp_back_poll(run, back, &back_done));
            moved |= back_done;
        }
        /* The device links are progressed too: control messages of the
         * previous call may still be going out on them. */
        braid_conn *waits[4] = {host_next, host_prev};
        int nwaits = host_next == host_prev ? 1 : 2, settled_all = fp_checked && back_done;
        if (dl_next)
            waits[nwaits++] = dl_next;
        if (dl_prev && dl_prev != dl_next)
            waits[nwaits++] = dl_prev;
        if (settled_all) {
            /* Both fingerprints in: which neighbours run the device ring. */
            int use_next = dl_next && back->exchanged && braid__fp_dring(back->theirs);
            int use_prev = dl_prev && braid__fp_dring(run->fp_in.theirs);
            int settled, usable;
            if (use_next) {
                BRAID_CHECK(braid__devlink_settle(pg, next, &settled, &usable));
                settled_all &= settled;
                *to_next = settled && usable ? dl_next : host_next;
            }
            if (use_prev) {
                BRAID_CHECK(braid__devlink_settle(pg, prev, &settled, &usable));
                settled_all &= settled;
                *from_prev = settled && usable ? dl_prev : host_prev;
            }
        }
        if (settled_all)
            return BRAID_OK;
        if (!moved)
            BRAID_CHECK(braid__algo_wait(run, waits, nwaits, !fp_checked ? prev : next));
    }
}

/* 1 when ev completed, 0 when not yet; errors are returned. */
static braid_status event_done(braid_pg *pg, cudaEvent_t ev, int *done)
{
    cudaError_t err = cudaEventQuery(ev);
    if (err == cudaErrorNotReady) {
        *done = 0;
        return BRAID_OK;
    }
    CUDA_CALL(err, "cudaEventQuery", pg->rank);
    *done = 1;
    return BRAID_OK;
}

/* The engine's send window is the pinned send slots; its receive window
 * the receive slots. */
_Static_assert(DRING_SEND_SLOTS == BRAID_PIPE_WINDOW, "one send slot per send in flight");
_Static_assert(DRING_RECV_SLOTS <= BRAID_PIPE_WINDOW, "receive slots within the engine's window");

/* One device ring call from its set-up to its end: the host ring's view of
 * the call, the links picked, and the cursors of the item hooks; the
 * pipelined engine (src/algo/pipeline.c) owns the windows and the order. */
typedef struct {
    braid_pg *pg;
    struct braid_hmem *h;
    const braid_coll *coll;
    braid_coll rc; /* the call as the host ring runs it: fingerprint, messages */
    braid_algo_ctx ctx;
    braid_algo_run run;
    braid_ring_geom g;
    size_t es, sb; /* element size, slot bytes */
    const uint8_t *send;
    uint8_t *recv, *rpin, *spin, *dslot;
    int next, prev;
    braid_conn *host_next, *host_prev, *to_next, *from_prev;
    int dsend, drecv; /* sides whose connection moves device memory: no pinned slot there */
    braid_conn *conns[BRAID_PIPE_MAX_CONNS];
    int nconns;
    uint8_t fp_mine[BRAID_FP_BYTES];
    braid_req fp_send_req;
    braid_fp_back back;
    int fp_sent;
    braid_ring_cursor done_r, stage_s, post_s, post_r;
    size_t step0; /* sends of step 0, which need no receive first */
    /* slot_busy[s]: the event that frees slot s (its copy up, or with a
     * direct receive the kernel reading the device slot), or NULL */
    cudaEvent_t slot_busy[DRING_RECV_SLOTS];
    const uint8_t *ssrc[DRING_SEND_SLOTS];
    cudaEvent_t block_on; /* what to wait for when nothing moved */
} dring_call;

/* Exchange fingerprints, pick the links (pick_links) and the set of
 * connections to wait on. */
static braid_status dring_connect(dring_call *d)
{
    braid_pg *pg = d->pg;
    d->rc = *d->coll;
    d->rc.hmem = NULL;
    d->rc.algo = BRAID_ALGO_RING;
    braid__pg_algo_ctx(pg, &d->ctx);
    braid__algo_run_init(&d->run, &d->ctx, &d->rc);
    d->next = (d->g.rank + 1) % d->g.n;
    d->prev = (d->g.rank + d->g.n - 1) % d->g.n;
    BRAID_CHECK(braid__pg_conn(pg, d->next, &d->host_next));
    BRAID_CHECK(braid__pg_conn(pg, d->prev, &d->host_prev));

    braid__fp_encode(&d->rc, d->fp_mine);
    braid__fp_set_dring(d->fp_mine);
    braid_status st = braid__conn_isend(d->host_next, &d->fp_send_req, d->fp_mine, sizeof(d->fp_mine));
    if (st == BRAID_OK)
        st = braid__fp_recv(&d->run, d->host_prev, d->prev);
    if (st == BRAID_OK)
        st = braid__fp_back_start(&d->run, &d->back, d->fp_mine, d->prev, d->next);
    d->to_next = d->host_next;
    d->from_prev = d->host_prev;
    if (st == BRAID_OK)
        st = pick_links(pg, &d->run, &d->back, d->next, d->prev, d->host_next, d->host_prev, &d->to_next,
                        &d->from_prev);
    if (st != BRAID_OK)
        return braid__fp_explain(&d->run, st);
    d->fp_sent = 0;
    d->dsend = d->to_next != d->host_next || conn_takes_device_memory(d->to_next);
    d->drecv = d->from_prev != d->host_prev || conn_takes_device_memory(d->from_prev);
    /* Waits cover the data links and the host links (the forward
     * fingerprint may still be going out; a failing peer closes both). */
    braid_conn *all[4] = {d->to_next, d->from_prev, d->host_next, d->host_prev};
    d->nconns = 0;
    for (int i = 0; i < 4; i++) {
        int seen = 0;
        for (int j = 0; j < d->nconns; j++)
            seen |= d->conns[j] == all[i];
        if (!seen)
            d->conns[d->nconns++] = all[i];
    }
    return BRAID_OK;
}

/* Stage send j: an input chunk (step 0), a reduced chunk or a gathered
 * chunk goes down to its pinned send slot on d2h after whatever produced
 * it; with a direct connection only ev_d2h is recorded, to tell the host
 * when the chunk is final. */
static braid_status dring_stage_send(braid_pipeline *p, size_t j)
{
    dring_call *d = p->sched;
    struct braid_hmem *h = d->h;
    size_t es = d->es, sb = d->sb, off, len, s = j % DRING_SEND_SLOTS;
    braid__ring_cursor_range(&d->g, &d->stage_s, &off, &len);
    if (d->stage_s.step > 0) {
        /* the chunk of receive item j - step0: reduced by its kernel, or
         * (all-gather) copied up into recv */
        size_t r = (j - d->step0) % DRING_RECV_SLOTS;
        cudaEvent_t after = d->stage_s.step < d->g.n ? h->ev_kern[r] : h->ev_h2d[r];
        CUDA_CALL(cudaStreamWaitEvent(h->d2h, after, 0), "cudaStreamWaitEvent", d->pg->rank);
    }
    const uint8_t *from = (d->stage_s.step == 0 ? d->send : d->recv) + off * es;
    if (d->dsend) {
        d->ssrc[s] = from; /* sent from where it is, once ev_d2h says it is final */
    } else {
        CUDA_CALL(cudaMemcpyAsync(d->spin + s * sb, from, len * es, cudaMemcpyDefault, h->d2h), "cudaMemcpyAsync",
                  d->pg->rank);
        d->ssrc[s] = d->spin + s * sb;
    }
    CUDA_CALL(cudaEventRecord(h->ev_d2h[s], h->d2h), "cudaEventRecord", d->pg->rank);
    braid__ring_cursor_next(&d->g, &d->stage_s);
    return BRAID_OK;
}

/* A staged send goes out once its data is ready. */
static braid_status dring_send_item(braid_pipeline *p, size_t k, const void **buf, size_t *bytes)
{
    dring_call *d = p->sched;
    size_t off, len, s = k % DRING_SEND_SLOTS;
    int done;
    *buf = NULL;
    BRAID_CHECK(event_done(d->pg, d->h->ev_d2h[s], &done));
    if (!done) {
        d->block_on = d->h->ev_d2h[s];
        return BRAID_OK;
    }
    braid__ring_cursor_range(&d->g, &d->post_s, &off, &len);
    *buf = d->ssrc[s];
    *bytes = len * d->es;
    braid__ring_cursor_next(&d->g, &d->post_s);
    return BRAID_OK;
}

/* A receive takes its slot once the copy or kernel last using it ended;
 * direct: reduce-scatter chunks into the device slot, gathered ones
 * straight into place. */
static braid_status dring_recv_item(braid_pipeline *p, size_t k, void **buf, size_t *bytes)
{
    dring_call *d = p->sched;
    size_t off, len, s = k % DRING_RECV_SLOTS;
    int done;
    *buf = NULL;
    if (d->slot_busy[s]) {
        BRAID_CHECK(event_done(d->pg, d->slot_busy[s], &done));
        if (!done) {
            if (!d->block_on)
                d->block_on = d->slot_busy[s];
            return BRAID_OK;
        }
        d->slot_busy[s] = NULL;
    }
    braid__ring_cursor_range(&d->g, &d->post_r, &off, &len);
    *buf = !d->drecv                     ? d->rpin + s * d->sb
           : d->post_r.step < d->g.n - 1 ? d->dslot + s * d->sb
                                         : d->recv + off * d->es;
    *bytes = len * d->es;
    braid__ring_cursor_next(&d->g, &d->post_r);
    return BRAID_OK;
}

/* The chunk of receive slot s, elements [off, off+len), arrived: it goes
 * up (unless the transport put it on the device already) and, in the
 * reduce-scatter, is reduced into recv. */
static braid_status dring_arrived(dring_call *d, size_t s, size_t off, size_t len)
{
    struct braid_hmem *h = d->h;
    const braid_coll *coll = d->coll;
    size_t es = d->es, sb = d->sb;
    int rank = d->pg->rank;
    if (d->done_r.step < d->g.n - 1) {
        if (!d->drecv) {
            CUDA_CALL(cudaStreamWaitEvent(h->h2d, h->ev_kern[s], 0), "cudaStreamWaitEvent", rank);
            CUDA_CALL(cudaMemcpyAsync(d->dslot + s * sb, d->rpin + s * sb, len * es, cudaMemcpyDefault, h->h2d),
                      "cudaMemcpyAsync", rank);
            CUDA_CALL(cudaEventRecord(h->ev_h2d[s], h->h2d), "cudaEventRecord", rank);
            CUDA_CALL(cudaStreamWaitEvent(h->comp, h->ev_h2d[s], 0), "cudaStreamWaitEvent", rank);
        }
        const void *srcs[2] = {d->send + off * es, d->dslot + s * sb};
        int last = d->done_r.step == d->g.n - 2; /* the segment is complete: AVG divides */
        braid_op op = !last && coll->op == BRAID_AVG ? BRAID_SUM : coll->op;
        BRAID_CHECK(braid__cuda_reduce(coll->dtype, op, d->recv + off * es, srcs, 2, len, d->g.n, h->comp));
        CUDA_CALL(cudaEventRecord(h->ev_kern[s], h->comp), "cudaEventRecord", rank);
        d->slot_busy[s] = d->drecv ? h->ev_kern[s] : h->ev_h2d[s];
    } else if (!d->drecv) {
        CUDA_CALL(cudaMemcpyAsync(d->recv + off * es, d->rpin + s * sb, len * es, cudaMemcpyDefault, h->h2d),
                  "cudaMemcpyAsync", rank);
        CUDA_CALL(cudaEventRecord(h->ev_h2d[s], h->h2d), "cudaEventRecord", rank);
        d->slot_busy[s] = h->ev_h2d[s];
    } else {
        /* already in place: a forwarding send needs no event */
        CUDA_CALL(cudaEventRecord(h->ev_h2d[s], h->h2d), "cudaEventRecord", rank);
    }
    return BRAID_OK;
}

/* Receive item k arrived (the fingerprints were checked by pick_links). */
static braid_status dring_combine(braid_pipeline *p, size_t k)
{
    dring_call *d = p->sched;
    size_t off, len;
    braid__ring_cursor_range(&d->g, &d->done_r, &off, &len);
    BRAID_CHECK(dring_arrived(d, k % DRING_RECV_SLOTS, off, len));
    braid__ring_cursor_next(&d->g, &d->done_r);
    return BRAID_OK;
}

/* Nothing moved and an item waits for a copy: only that copy can unblock
 * us, and it finishes on its own. */
static braid_status dring_idle(braid_pipeline *p, int *waited)
{
    dring_call *d = p->sched;
    cudaEvent_t ev = d->block_on;
    d->block_on = NULL;
    *waited = ev != NULL;
    if (ev)
        CUDA_CALL(cudaEventSynchronize(ev), "cudaEventSynchronize", d->pg->rank);
    return BRAID_OK;
}

/* Every item is done: *done = 1 once the fingerprint send and the device
 * links' control messages are out, and every copy and kernel ran (recv is
 * final). */
static braid_status dring_finish(braid_pipeline *p, int *done)
{
    dring_call *d = p->sched;
    int pending = 0;
    *done = 0;
    if (!d->fp_sent)
        BRAID_CHECK(braid__algo_test(&d->run, &d->fp_send_req, &d->fp_sent));
    if (!d->fp_sent)
        return BRAID_OK;
    BRAID_CHECK(links_pending(d->to_next, d->host_next, d->from_prev, d->host_prev, &pending));
    if (pending)
        return BRAID_OK;
    CUDA_CALL(cudaStreamSynchronize(d->h->h2d), "cudaStreamSynchronize", d->pg->rank);
    CUDA_CALL(cudaStreamSynchronize(d->h->comp), "cudaStreamSynchronize", d->pg->rank);
    CUDA_CALL(cudaStreamSynchronize(d->h->d2h), "cudaStreamSynchronize", d->pg->rank);
    *done = 1;
    return BRAID_OK;
}

static const braid_pipeline_hooks dring_hooks = {.send_item = dring_send_item,
                                                 .recv_item = dring_recv_item,
                                                 .combine = dring_combine,
                                                 .stage_send = dring_stage_send,
                                                 .idle = dring_idle,
                                                 .finish = dring_finish};

braid_status braid__device_ring(braid_pg *pg, braid_coll *coll)
{
    struct braid_hmem *h = pg->hmem;
    size_t es = braid_dtype_size(coll->dtype);
    braid_ring_geom g = {.n = pg->size, .rank = pg->rank, .count = coll->count, .nshards = pg->size};
    g.elems_per_chunk = pg->chunk_bytes / es ? pg->chunk_bytes / es : 1;
    if (g.elems_per_chunk * es > h->slot_bytes)
        return braid__error(BRAID_ERR_INTERNAL, "rank %d: device ring chunk of %zu bytes exceeds its %zu-byte slots",
                            pg->rank, g.elems_per_chunk * es, h->slot_bytes);
    if (g.n == 1) {
        const void *src = coll->send;
        BRAID_CHECK(braid__cuda_reduce(coll->dtype, coll->op, coll->recv, &src, 1, coll->count, 1, h->comp));
        CUDA_CALL(cudaStreamSynchronize(h->comp), "cudaStreamSynchronize", pg->rank);
        return BRAID_OK;
    }

    dring_call d = {.pg = pg,
                    .h = h,
                    .coll = coll,
                    .g = g,
                    .es = es,
                    .sb = h->slot_bytes,
                    .send = coll->send,
                    .recv = coll->recv,
                    .rpin = h->rpin,
                    .spin = h->spin,
                    .dslot = h->dslot};
    BRAID_CHECK(dring_connect(&d));
    int end = 2 * (g.n - 1);
    braid__ring_cursor_init(&d.g, &d.post_r, 0, end, 1);
    braid__ring_cursor_init(&d.g, &d.stage_s, 0, end, 0);
    d.done_r = d.post_r;
    d.post_s = d.stage_s;
    d.step0 = d.stage_s.step == 0 ? d.stage_s.nchunks : 0;
    braid_pipeline p = {.run = &d.run,
                        .hooks = &dring_hooks,
                        .sched = &d,
                        .next = d.next,
                        .prev = d.prev,
                        .sends = braid__ring_cursor_items(&d.g, d.stage_s),
                        .recvs = braid__ring_cursor_items(&d.g, d.post_r),
                        .send_lead = d.step0,
                        .combine_lead = SIZE_MAX,
                        .recv_slots = DRING_RECV_SLOTS,
                        .to_next = d.to_next,
                        .from_prev = d.from_prev,
                        .nconns = d.nconns};
    for (int i = 0; i < d.nconns; i++)
        p.conns[i] = d.conns[i];
    /* fp 0: the fingerprints went first, in dring_connect */
    return braid__fp_explain(&d.run, braid__pipeline_run(&p));
}
