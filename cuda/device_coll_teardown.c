/* A group's device-collective teardown (device_coll_group.h): wait for this
 * rank's kernels, unmap the peers' regions, meet the peers, and only then
 * free this rank's region (docs/CUDA.md, "Teardown"). */
#include <cuda_runtime_api.h>

#include "device_coll_group.h"
#include "device_coll_int.h"
#include "log.h"
#include "status.h"

/* Remember stream's last kernel. Not under capture: the record would be a
 * graph node, never completed here; a replayed graph is the program's to
 * wait for before destroy (as NCCL asks). */
void braid__devcoll_note_launch(struct braid_devcoll_group *g, void *stream)
{
    enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing((cudaStream_t)stream, &cap) != cudaSuccess || cap != cudaStreamCaptureStatusNone) {
        (void)cudaGetLastError();
        return;
    }
    int i = 0;
    while (i < g->nlast && g->last_stream[i] != (cudaStream_t)stream)
        i++;
    if (i == LAST_STREAMS) { /* full: wait for the oldest, reuse its slot */
        i = 0;
        if (cudaEventSynchronize(g->last_ev[0]) != cudaSuccess)
            (void)cudaGetLastError();
    } else if (i == g->nlast) {
        if (!g->last_ev[i] && cudaEventCreateWithFlags(&g->last_ev[i], cudaEventDisableTiming) != cudaSuccess) {
            (void)cudaGetLastError();
            g->last_ev[i] = NULL;
            return;
        }
        g->nlast++;
    }
    g->last_stream[i] = (cudaStream_t)stream;
    if (cudaEventRecord(g->last_ev[i], (cudaStream_t)stream) != cudaSuccess)
        (void)cudaGetLastError();
}

/* Wait for every kernel this rank launched on the group (bounded by the
 * kernels' own timeout and the abort flag). */
static void flush(struct braid_devcoll_group *g)
{
    for (int i = 0; i < g->nlast; i++)
        if (cudaEventSynchronize(g->last_ev[i]) != cudaSuccess)
            (void)cudaGetLastError();
}

void braid__devcoll_flush(braid_pg *pg)
{
    if (pg && pg->devcoll && pg->devcoll->ready)
        flush(pg->devcoll);
}

/* How long braid_pg_destroy waits for the peers to let go of the regions. */
#define DETACH_MS 10000

void braid__devcoll_detach(braid_pg *pg)
{
    struct braid_devcoll_group *g = pg->devcoll;
    if (!g || !g->ready || atomic_exchange(&g->detaching, 1))
        return;
    int broken = braid_pg_error(pg) != BRAID_OK || braid__devcoll_faulted(g);
    if (broken)
        braid__devcoll_raise_abort(g); /* our kernels give up now rather than at their timeout */
    /* Our kernels read the peers' regions until they end: only then unmap
     * them, and only then tell the peers (the meeting) we let go of theirs. */
    flush(g);
    braid__devcoll_close_peers(g);
    if (g->one_process) {
        /* Ranks as threads: the program orders its threads' last calls
         * before any destroy (docs/CUDA.md), and one thread may destroy
         * all of them in turn, which a meeting would stall. */
        g->peers_let_go = 1;
        return;
    }
    if (broken)
        return; /* the peers may never come; the region is left allocated */
    int32_t one = 1, sum = 0;
    braid_work *w = NULL;
    if (braid_allreduce(pg, &one, &sum, 1, BRAID_I32, BRAID_SUM, NULL, &w) == BRAID_OK)
        g->peers_let_go = braid_wait(w, DETACH_MS) == BRAID_OK && sum == pg->size;
    braid_work_free(w); /* still pending after the wait: the destroy's abort ends it */
    if (!g->peers_let_go)
        BRAID_INFO("rank %d: device collectives: the peers did not all reach braid_pg_destroy within %d ms", pg->rank,
                   DETACH_MS);
    braid__error_clear();
}
