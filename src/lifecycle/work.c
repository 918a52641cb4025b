/* Executor: runs a group's collectives one at a time in issue order, so
 * every rank runs them in the same order. A blocking call on an idle group
 * runs inline (no thread hand-off on the latency path), and so does a
 * waited-for call the progress thread has not picked up yet; everything
 * else goes through the group's progress thread. */
#include <errno.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "algo/algo.h"
#include "clock.h"
#include "hmem.h"
#include "log.h"
#include "pg.h"
#include "trace.h"
#include "status.h"

static void work_unref(braid_work *w)
{
    if (atomic_fetch_sub(&w->refs, 1) == 1) {
        braid__coll_release(&w->coll);
        free(w);
    }
}

/* Record a result and wake waiters; caller holds pg->mu. */
static void work_complete_locked(braid_pg *pg, braid_work *w, braid_status st, const char *text)
{
    w->status = st;
    snprintf(w->error_text, sizeof(w->error_text), "%s", st == BRAID_OK ? "" : text);
    atomic_store(&w->done, 1);
    pthread_cond_broadcast(&pg->cv);
}

static braid_work *queue_pop_locked(braid_pg *pg)
{
    braid_work *w = pg->queue_head;
    if (w) {
        pg->queue_head = w->next;
        if (!pg->queue_head)
            pg->queue_tail = NULL;
    }
    return w;
}

/* A call of kind (braid__coll_job_kind) ran from t0 to t1 (braid__now_ns)
 * and ended with st: count it (braid_pg_stats) and close its flight-recorder
 * record, which the group's first failure writes out; pg->mu held. */
static void call_ended_locked(braid_pg *pg, int kind, uint64_t bytes, uint64_t trace_id, const char *algo,
                              braid_status st, int64_t t0, int64_t t1)
{
    if ((unsigned)kind < BRAID_COLL_KIND_COUNT) {
        struct braid_kind_counters *k = &pg->kind_stats[kind];
        k->calls++;
        k->failed += st != BRAID_OK;
        k->bytes += bytes;
        k->total_ns += (uint64_t)(t1 - t0);
        if ((uint64_t)(t1 - t0) > k->max_ns)
            k->max_ns = (uint64_t)(t1 - t0);
    }
    braid__trace_ended(pg->trace, trace_id, st, algo, t1);
    braid__trace_failed_locked(pg, st);
}

/* Run the queue's head w (popped by the caller, pg->mu held, the group
 * not busy); returns with pg->mu released (the group may be destroyed as
 * soon as it is idle). */
static void run_head_unlocking(braid_pg *pg, braid_work *w)
{
    /* One clock read per end of the call serves the wait deadline, the
     * statistics and the flight recorder. */
    int64_t t0 = braid__now_ns();
    w->start_ms = t0 / 1000000;
    pg->busy = 1;
    braid__trace_started(pg->trace, w->trace_id, t0);
    pthread_mutex_unlock(&pg->mu);
    braid_status st = braid__coll_run(pg, &w->coll);
    int64_t t1 = braid__now_ns();
    pthread_mutex_lock(&pg->mu);
    call_ended_locked(pg, braid__coll_job_kind(&w->coll), braid__coll_job_bytes(&w->coll), w->trace_id,
                      braid__coll_algo_name(&w->coll, pg->size), st, t0, t1);
    pg->busy = 0;
    work_complete_locked(pg, w, st, braid_last_error());
    pthread_mutex_unlock(&pg->mu);
    braid__hmem_coll_done(&w->coll); /* the caller's streams go on once the handle says done */
    work_unref(w);
}

static void *progress_main(void *arg)
{
    braid_pg *pg = arg;
    braid__log_set_rank(pg->rank);
    pthread_mutex_lock(&pg->mu);
    for (;;) {
        while (!pg->stopping && (pg->busy || !pg->queue_head))
            pthread_cond_wait(&pg->cv, &pg->mu);
        if (pg->stopping)
            break;
        run_head_unlocking(pg, queue_pop_locked(pg));
        pthread_mutex_lock(&pg->mu);
    }
    /* Stopping: whatever is still queued never ran. */
    braid_work *w;
    while ((w = queue_pop_locked(pg)) != NULL) {
        work_complete_locked(pg, w, BRAID_ERR_ABORTED, "BRAID_ERR_ABORTED: process group destroyed before the call ran");
        braid__hmem_coll_done(&w->coll);
        work_unref(w);
    }
    pthread_mutex_unlock(&pg->mu);
    return NULL;
}

braid_status braid__work_start_thread(braid_pg *pg)
{
    int rc = pthread_create(&pg->thread, NULL, progress_main, pg);
    if (rc != 0) {
        errno = rc;
        return braid__error(BRAID_ERR_SYSTEM, "rank %d: cannot start the progress thread: %m", pg->rank);
    }
    char name[16];
    snprintf(name, sizeof(name), "braid-prog-%d", pg->rank);
    pthread_setname_np(pg->thread, name);
    pg->thread_started = 1;
    return BRAID_OK;
}

void braid__work_stop_thread(braid_pg *pg)
{
    if (!pg->thread_started)
        return;
    pthread_mutex_lock(&pg->mu);
    pg->stopping = 1;
    pthread_cond_broadcast(&pg->cv);
    /* A blocking caller may be running inline: let it finish first. */
    while (pg->busy)
        pthread_cond_wait(&pg->cv, &pg->mu);
    pthread_mutex_unlock(&pg->mu);
    pthread_join(pg->thread, NULL);
    pg->thread_started = 0;
}

/* The clock pg->cv's timed waits use: CLOCK_MONOTONIC, unless the C
 * library refuses it (Linux never does), then the wall clock with each
 * deadline converted just before the wait. */
static clockid_t wait_clock = CLOCK_MONOTONIC;

void braid__work_cond_init(braid_pg *pg)
{
    pthread_condattr_t attr;
    int rc = pthread_condattr_init(&attr);
    if (rc == 0) {
        rc = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
        if (rc == 0)
            rc = pthread_cond_init(&pg->cv, &attr);
        pthread_condattr_destroy(&attr);
    }
    if (rc != 0) {
        BRAID_WARN("rank %d: no CLOCK_MONOTONIC condition variable (error %d): braid_wait deadlines follow the "
                   "wall clock",
                   pg->rank, rc);
        wait_clock = CLOCK_REALTIME;
        pthread_cond_init(&pg->cv, NULL);
    }
}

/* Time after the collective's own deadline (pg->timeout_ms from its start,
 * see algo/common.c) that braid_wait(-1) still waits: the executor reports
 * the collective's BRAID_ERR_TIMEOUT, with its detail, before this fires. */
#define WAIT_GRACE_MS 1000

/* The monotonic time ms (braid__now_ms) on wait_clock. */
static void wait_clock_at(int64_t ms, struct timespec *ts)
{
    if (wait_clock != CLOCK_MONOTONIC) {
        struct timespec now;
        clock_gettime(wait_clock, &now);
        ms += (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000 - braid__now_ms();
    }
    ts->tv_sec = (time_t)(ms / 1000);
    ts->tv_nsec = (long)(ms % 1000) * 1000000L;
}

/* Wait for w until the monotonic time deadline_ms; deadline_ms < 0: the
 * default deadline, counted from when the collective started (or, while
 * it is still queued, from when it was submitted) and not from this call,
 * so repeated waits cannot push it out. The default is re-read after each
 * wake-up because start_ms is set when the executor picks w up. Returns
 * BRAID_ERR_TIMEOUT; *counted_from is where a default deadline counts
 * from. */
static braid_status wait_locked(braid_pg *pg, braid_work *w, int64_t deadline_ms, int64_t *counted_from)
{
    for (;;) {
        if (atomic_load(&w->done))
            return BRAID_OK;
        int64_t until = deadline_ms;
        if (deadline_ms < 0) {
            *counted_from = w->start_ms ? w->start_ms : w->submit_ms;
            until = *counted_from + pg->timeout_ms + WAIT_GRACE_MS;
        }
        if (braid__now_ms() >= until)
            return BRAID_ERR_TIMEOUT;
        struct timespec ts;
        wait_clock_at(until, &ts);
        pthread_cond_timedwait(&pg->cv, &pg->mu, &ts);
    }
}

braid_status braid__work_submit(braid_pg *pg, const braid_coll *coll, braid_work **work_out)
{
    pthread_mutex_lock(&pg->mu);
    braid_status captured;
    if (braid__group_capture_locked(pg, coll, work_out, &captured)) {
        pthread_mutex_unlock(&pg->mu);
        return captured;
    }
    /* From here the job's resources (a group's calls) are ours to free. */
    braid_coll c = *coll;
    if (pg->stopping) {
        pthread_mutex_unlock(&pg->mu);
        braid__coll_release(&c);
        return braid__error(BRAID_ERR_ABORTED, "rank %d: process group is being destroyed", pg->rank);
    }
    if (!work_out && !pg->busy && !pg->queue_head) {
        c.seq = pg->next_seq;
        pg->next_seq += braid__coll_seqs(&c);
        pg->busy = 1;
        int64_t t0 = braid__now_ns();
        uint64_t trace_id = braid__trace_queued(pg->trace, &c, t0);
        braid__trace_started(pg->trace, trace_id, t0);
        pthread_mutex_unlock(&pg->mu);
        uint64_t bytes = braid__coll_job_bytes(&c);
        int kind = braid__coll_job_kind(&c);
        braid_status st = braid__coll_run(pg, &c);
        int64_t t1 = braid__now_ns();
        const char *algo = braid__coll_algo_name(&c, pg->size);
        braid__coll_release(&c);
        pthread_mutex_lock(&pg->mu);
        call_ended_locked(pg, kind, bytes, trace_id, algo, st, t0, t1);
        pg->busy = 0;
        /* Only queued work or a stopping destroy waits for the group to go
         * idle; waking the progress thread otherwise costs every small
         * collective a thread switch and a contended lock. */
        if (pg->queue_head || pg->stopping)
            pthread_cond_broadcast(&pg->cv);
        pthread_mutex_unlock(&pg->mu);
        return st;
    }

    braid_work *w = calloc(1, sizeof(*w));
    if (!w) {
        pthread_mutex_unlock(&pg->mu);
        braid__coll_release(&c);
        return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: out of memory for a work handle", pg->rank);
    }
    w->coll = c;
    w->coll.seq = pg->next_seq;
    pg->next_seq += braid__coll_seqs(&c);
    w->pg = pg;
    int64_t now_ns = braid__now_ns();
    w->submit_ms = now_ns / 1000000;
    w->trace_id = braid__trace_queued(pg->trace, &w->coll, now_ns);
    atomic_init(&w->refs, 2);
    atomic_init(&w->done, 0);
    if (pg->queue_tail)
        pg->queue_tail->next = w;
    else
        pg->queue_head = w;
    pg->queue_tail = w;
    pthread_cond_broadcast(&pg->cv);
    if (work_out) {
        pthread_mutex_unlock(&pg->mu);
        *work_out = w;
        return BRAID_OK;
    }
    /* Blocking call behind queued work: the collective has its own
     * deadline, so wait without one here. */
    while (!atomic_load(&w->done))
        pthread_cond_wait(&pg->cv, &pg->mu);
    pthread_mutex_unlock(&pg->mu);
    braid_status st = w->status;
    if (st != BRAID_OK)
        braid__error_set_text(w->error_text);
    work_unref(w);
    return st;
}

static braid_status work_result(braid_work *w)
{
    if (w->status != BRAID_OK)
        braid__error_set_text(w->error_text);
    else
        braid__error_clear();
    return w->status;
}

BRAID_API braid_status braid_wait(braid_work *w, int timeout_ms)
{
    if (!w)
        return braid__error(BRAID_ERR_INVALID_ARG, "braid_wait: work is NULL");
    if (atomic_load(&w->done))
        return work_result(w);
    braid_pg *pg = w->pg;
    int64_t now = braid__now_ms(), counted_from = now;
    /* An explicit timeout counts from this call; -1 is the collective's
     * deadline (plus grace), fixed when it was issued. */
    int64_t deadline = timeout_ms < 0 ? -1 : now + timeout_ms;
    pthread_mutex_lock(&pg->mu);
    /* The progress thread has not picked w up yet and nothing runs before
     * it: run it here, as a blocking call on an idle group runs, instead of
     * waiting for that thread to be scheduled (two thread switches on the
     * latency path of every issue-then-wait). Only a wait for as long as
     * the collective takes (one with its own timeout must return on time),
     * and not a device call: its staging sets the thread's CUDA device. */
    if (timeout_ms < 0 && !atomic_load(&w->done) && !pg->busy && !pg->stopping && pg->queue_head == w &&
        !w->coll.hmem) {
        run_head_unlocking(pg, queue_pop_locked(pg)); /* w is ours still: the caller holds it */
        return work_result(w);
    }
    braid_status st = wait_locked(pg, w, deadline, &counted_from);
    pthread_mutex_unlock(&pg->mu);
    if (st != BRAID_OK) {
        if (timeout_ms >= 0)
            return braid__error_quiet(st, "rank %d: braid_wait: collective #%llu not done after %d ms", pg->rank,
                                      (unsigned long long)w->coll.seq, timeout_ms);
        return braid__error_quiet(st,
                                  "rank %d: braid_wait: collective #%llu not done %lld ms after it was %s "
                                  "(group timeout %d ms)",
                                  pg->rank, (unsigned long long)w->coll.seq,
                                  (long long)(braid__now_ms() - counted_from), w->start_ms ? "started" : "issued",
                                  pg->timeout_ms);
    }
    return work_result(w);
}

BRAID_API braid_status braid_test(braid_work *w, int *done)
{
    if (!w || !done)
        return braid__error(BRAID_ERR_INVALID_ARG, "braid_test: NULL argument");
    *done = atomic_load(&w->done);
    return *done ? work_result(w) : BRAID_OK;
}

braid_status braid__work_completed(braid_pg *pg, braid_work **work_out)
{
    braid_work *w = calloc(1, sizeof(*w));
    if (!w)
        return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: out of memory for a work handle", pg->rank);
    w->pg = pg;
    w->submit_ms = w->start_ms = braid__now_ms();
    atomic_init(&w->refs, 1); /* the caller's only: no executor holds it */
    atomic_init(&w->done, 1);
    *work_out = w;
    return BRAID_OK;
}

BRAID_API void braid_work_free(braid_work *w)
{
    if (w)
        work_unref(w);
}
