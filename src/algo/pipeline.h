/* The one pipelined engine that every ring and chain collective runs on,
 * as NCCL writes its collectives over one primitives layer.
 *
 * A rank sends items to its next neighbour and receives items from its
 * previous one; an item is a chunk of some buffer, and many are in flight
 * at once within fixed windows. A schedule (ring all-reduce pass,
 * reduce-scatter, all-gather, chain broadcast, chain reduce) says only
 * which buffer each item is, how a received item combines with local data,
 * and which items wait on which:
 *
 *  - send k >= send_lead forwards what receive k - send_lead produced, so
 *    it waits until that receive is combined;
 *  - combine k >= combine_lead rewrites the data that send k reads (a
 *    partial forwarded from the buffer it accumulates in), so it waits
 *    until send k completed;
 *  - a receive takes one of recv_slots slots, free again once its item is
 *    combined, or, where the schedule forwards straight from the slot
 *    (slot_forwarded), once the send of that item completed.
 *
 * Every wait is on an earlier item, here or at a neighbour nearer the end
 * of the pipeline, so the pipeline never stalls on itself whatever the
 * chunk count. Call fingerprints go first on both links, and no received
 * data is accepted before the previous rank's matched. A received item is
 * combined as soon as it completes, while it is still in cache. */
#ifndef BRAID_ALGO_PIPELINE_H
#define BRAID_ALGO_PIPELINE_H

#include "algo.h"

#define BRAID_PIPE_WINDOW 8 /* most items in flight per direction */

typedef struct braid_pipeline braid_pipeline;

/* Each item hook is called once per item, in item order, so a schedule may
 * walk its items with a cursor; an error it returns ends the run. */
typedef struct {
    /* Buffer and length of send item k. *buf NULL: not ready yet (asked
     * again later, after the other work of this round). */
    braid_status (*send_item)(braid_pipeline *p, size_t k, const void **buf, size_t *bytes);
    /* Buffer and length receive item k lands in. *buf NULL: its slot is
     * not free yet. */
    braid_status (*recv_item)(braid_pipeline *p, size_t k, void **buf, size_t *bytes);
    /* Combine received item k with local data; NULL: received data is final. */
    braid_status (*combine)(braid_pipeline *p, size_t k);
    /* Optional: work to overlap with the first transfers, run once right
     * after the first items are posted. */
    void (*started)(braid_pipeline *p);

    /* Optional, for data that passes through asynchronous stages (the
     * device ring's copies and kernels, cuda/device_ring.c): */
    /* Send k's gate opened: start producing its data (send_item then says
     * when it is ready). Counted against the send window. */
    braid_status (*stage_send)(braid_pipeline *p, size_t k);
    /* Nothing moved: *waited = 1 after blocking on local work (a copy
     * that a not-ready item waits for) instead of on the links. */
    braid_status (*idle)(braid_pipeline *p, int *waited);
    /* Every item is done: *done = 1 once whatever else must end first has
     * (control messages, copies still running). */
    braid_status (*finish)(braid_pipeline *p, int *done);
} braid_pipeline_hooks;

#define BRAID_PIPE_MAX_CONNS 4

struct braid_pipeline {
    /* Set by the schedule. */
    braid_algo_run *run;
    const braid_pipeline_hooks *hooks;
    void *sched;               /* the schedule's own state, for the hooks */
    int next, prev;            /* neighbours' group ranks; -1: none (a chain's ends) */
    size_t sends, recvs;       /* items each way */
    size_t send_lead;          /* sends that wait for no receive */
    size_t combine_lead;       /* combines that wait for no send; SIZE_MAX: none waits */
    int recv_slots;            /* 1..BRAID_PIPE_WINDOW */
    int slot_forwarded;        /* a receive slot is free once its item's send completed */
    int fp;                    /* exchange call fingerprints first */
    int fp_back;               /* also backwards, on device links (the flat ring all-reduce) */

    /* Links: the engine connects to next and prev, unless the schedule
     * set nconns (and to_next, from_prev, conns: every link to wait on). */
    braid_conn *to_next, *from_prev, *conns[BRAID_PIPE_MAX_CONNS];
    int nconns;

    /* The engine's. */
    uint8_t fp_mine[BRAID_FP_BYTES];
    braid_req fp_send_req;
    braid_fp_back back;
    int fp_sent, fp_checked, back_done;
    braid_req recv_reqs[BRAID_PIPE_WINDOW], send_reqs[BRAID_PIPE_WINDOW];
    size_t staged_s, posted_s, done_s, posted_r, done_r, combined;
};

/* Run the pipeline to its end (or the call's failure). */
braid_status braid__pipeline_run(braid_pipeline *p);

#endif
