/* A group's kernel-driven device collectives (cuda/device_coll.h): each
 * rank's region made at group creation (or, where some rank had no CUDA
 * context yet, at the group's first device call), exchanged through the
 * store or the group's connections (both authenticated with the job
 * secret), mapped by every peer; then
 * device-memory all-reduces and broadcasts are one kernel on the caller's
 * stream.
 *
 * On only where BRAID_DEVCOLL=1, every rank of the group is on one host,
 * and every rank mapped every region: the group agrees, all or nothing. Then every rank must pass
 * device memory to those calls (as NCCL requires); a rank that does not
 * leaves its peers' kernels waiting until their timeout, which names it.
 *
 * Without CUDA (device_coll_stub.c) nothing is ever on. */
#ifndef BRAID_DEVICE_COLL_GROUP_H
#define BRAID_DEVICE_COLL_GROUP_H

#include "pg.h"

/* Before the rendezvous (no stream of the group is held yet): where the
 * calling thread has a CUDA context, make this rank's region on its
 * current device. Failures are logged and leave this rank without one. */
void braid__devcoll_prepare(braid_pg *pg);

/* During the join, through the store (every rank calls it): publish the
 * region, or that this rank has no CUDA context yet. When every rank has
 * one, map the peers' regions and agree now; else every rank leaves the
 * decision to braid__devcoll_agree. */
braid_status braid__devcoll_exchange(braid_pg *pg);

/* At each device all-reduce or broadcast, on the calling thread (current
 * device `device`, the buffers'), before the call is queued; decides only
 * the first time, where the join did not: make this rank's region, swap
 * the records with a host all-gather over the group's connections, map
 * the peers', agree with a host all-reduce (all or nothing). Every rank
 * reaches it at the same call, so the decision does not depend on when
 * the program made its CUDA context. That first call waits for every rank
 * to reach it. A no-op unless BRAID_DEVCOLL=1; fails only when those host
 * collectives fail. */
braid_status braid__devcoll_agree(braid_pg *pg, int device);

/* 1 when coll (on device memory of device) runs as a device collective. */
int braid__devcoll_takes(braid_pg *pg, const braid_coll *coll, int device);

/* Queues coll's kernel on stream. work != NULL: a completed work handle,
 * the result ordered on the stream; work == NULL: waits for the stream.
 * A kernel that gave up (a peer missing past the timeout, or an abort)
 * breaks the group; the next call, or this one when blocking, says so,
 * naming the peer. */
braid_status braid__devcoll_run(braid_pg *pg, const braid_coll *coll, void *stream, braid_work **work);

/* 1 when a device-collective kernel of the group gave up, with why in
 * text (the same words a later call fails with); else 0. Any thread. */
int braid__devcoll_fault(braid_pg *pg, char *text, size_t cap);

/* First thing in braid_pg_destroy, while the group still works: close
 * this rank's mappings of the peers' regions and, where ranks live in more
 * than one process, meet the peers (a host all-reduce, at most 10 s), so
 * that each rank frees its own region only once no peer maps it (a peer's
 * kernel may read it until its last call ends). A group that failed, or
 * peers that do not come, leave the region allocated rather than freed
 * under them. Ranks that are all threads of one process do not meet: the
 * program finishes every rank's calls before destroying any. */
void braid__devcoll_detach(braid_pg *pg);

/* Wait until every device-collective kernel this rank launched on the group
 * has ended (a call's work handle completes when its kernel is queued):
 * ncclCommFinalize flushes with it. Bounded by the kernels' timeout. */
void braid__devcoll_flush(braid_pg *pg);

/* Make every waiting kernel of the group give up (abort, peer failure):
 * one store to host memory, safe in a signal handler. */
void braid__devcoll_abort(braid_pg *pg);

/* Unmap and free (group teardown). */
void braid__devcoll_release(braid_pg *pg);

#endif
