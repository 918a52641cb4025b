/* The flight recorder: each group keeps its last BRAID_TRACE_BUFFER calls
 * (default 2000, 0 off) with what they were and how far they got, and
 * writes them out when a call fails (a timeout, an abort, a lost peer) or
 * when asked (braid_pg_trace_dump). scripts/braid-trace-merge puts the
 * ranks' files side by side and says where the ranks disagree.
 *
 * Every record, update and dump runs with the group's mu held, on paths
 * that hold it already (src/lifecycle/work.c), with the clock reads the
 * executor makes anyway: recording costs a few stores per call. */
#ifndef BRAID_TRACE_H
#define BRAID_TRACE_H

#include <stdint.h>

#include "braid.h"
#include "algo/coll.h"

struct braid_pg;
typedef struct braid_trace braid_trace;

/* NULL where the recorder is off (BRAID_TRACE_BUFFER=0) or out of memory. */
braid_trace *braid__trace_new(void);
void braid__trace_free(braid_trace *t);

/* A call entered the queue (or runs at once): its record number, 0 when
 * the recorder is off. now_ns: braid__now_ns(), read by the caller for
 * its own use too (the recorder reads no clock). */
uint64_t braid__trace_queued(braid_trace *t, const braid_coll *c, int64_t now_ns);
void braid__trace_started(braid_trace *t, uint64_t id, int64_t now_ns);
/* algo: the algorithm that ran it (a static string). */
void braid__trace_ended(braid_trace *t, uint64_t id, braid_status st, const char *algo, int64_t now_ns);

/* A call ended with st: at the group's first failure, write the records
 * where BRAID_TRACE_DIR says (a file per rank; unset: the last ones to
 * stderr), headed by the failure's text. The thread's error text stays. */
void braid__trace_failed_locked(struct braid_pg *pg, braid_status st);

#endif
