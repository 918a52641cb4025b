/* The one argument check of every call (braid__check_call), buffer
 * classification at the entry, and the entry points the public calls and
 * the NCCL shim share; defined in coll_check.c, pg.c, coll_reduce.c,
 * p2p_calls.c and mulsum.c. Checks return BRAID_OK or set the error text
 * (rank, call, cause). */
#ifndef BRAID_COLL_CHECK_H
#define BRAID_COLL_CHECK_H

#include <stddef.h>

#include "braid.h"
#include "algo/coll.h"

/* Every argument check of call c from its kind's traits (coll.h): the
 * group handle, dtype, count overflow, op (with MULSUM's scalar), root or
 * peer, the buffers this rank passes, and how send and recv may overlap.
 * name: the public call's, for messages. */
braid_status braid__check_call(braid_pg *pg, const char *name, const braid_coll *c, const void *scalar);

/* Set c->send_mem and recv_mem (count > 0): from mem (mem[0] send, mem[1]
 * recv) where the caller's entry classified the buffers already, else
 * with the one classifier (braid__mem_of, hmem.h), once per buffer. */
void braid__coll_classify(braid_coll *c, const braid_mem *mem);

/* An entry above braid's (the NCCL shim) classified the buffers of the
 * call it is about to make on this thread: braid's entry takes these
 * answers for those pointers instead of asking again. Cleared after the
 * call. */
void braid__mem_hint(const void *send, braid_mem send_mem, const void *recv, braid_mem recv_mem);
void braid__mem_hint_clear(void);

/* p's memory: the hint's answer where it names p, else braid__mem_of. */
braid_mem braid__mem_known(const void *p);

/* The all-reduce entry point behind braid_allreduce and
 * braid_allreduce_mulsum (pg.c); name is the public call's. mem: send's
 * and recv's memory as the caller's entry classified it (braid__mem_of),
 * or NULL to classify here. */
braid_status braid__allreduce_submit(braid_pg *pg, const char *name, const void *send, void *recv, size_t count,
                                     braid_dtype dtype, braid_op op, const void *scalar, const braid_mem *mem,
                                     void *cuda_stream, braid_work **work);

/* braid_allreduce and braid_broadcast for an entry that classified the
 * buffers already (mem[0] send, mem[1] recv; the NCCL shim): nothing
 * classifies them again. NULL mem: the public calls. */
braid_status braid__allreduce_classified(braid_pg *pg, const void *send, void *recv, size_t count, braid_dtype dtype,
                                         braid_op op, const braid_mem *mem, void *cuda_stream, braid_work **work);
braid_status braid__broadcast_classified(braid_pg *pg, void *buf, size_t count, braid_dtype dtype, int root,
                                         const braid_mem *mem, void *cuda_stream, braid_work **work);

/* A broadcast whose root reads send and writes recv (send == recv: in
 * place), recorded in the calling thread's open group (the NCCL shim's
 * device groups): staging reads the root's input when the group runs, so
 * the broadcast sees what earlier ops of the group wrote into send. */
braid_status braid__broadcast_from(braid_pg *pg, const void *send, void *recv, size_t count, braid_dtype dtype,
                                   int root, void *cuda_stream);

/* braid_reduce and braid_reduce_scatter with an optional MULSUM scalar
 * (coll_reduce.c). */
braid_status braid__reduce_submit(braid_pg *pg, const void *send, void *recv, size_t count, braid_dtype dtype,
                                  braid_op op, const void *scalar, int root, void *cuda_stream, braid_work **work);
braid_status braid__reduce_scatter_submit(braid_pg *pg, const void *send, void *recv, size_t recvcount,
                                          braid_dtype dtype, braid_op op, const void *scalar, void *cuda_stream,
                                          braid_work **work);

/* braid_send (kind SEND) and braid_recv (RECV) for an entry that
 * classified buf already (mem; NULL: classify here): all-to-all, gather
 * and scatter (exchange.c) classify their two buffers once, not per peer. */
braid_status braid__p2p_submit(braid_pg *pg, braid_coll_kind kind, const void *buf, size_t count, braid_dtype dtype,
                               int peer, const braid_mem *mem, void *cuda_stream, braid_work **work);

struct braid_coll;
/* Record scalar in c (MULSUM: c->premul = 1); no-op when scalar is NULL. */
void braid__mulsum_arm(struct braid_coll *c, const void *scalar);

/* Just before a collective's algorithm runs: multiply a MULSUM input by the
 * scalar (into recv for all-reduce, else into a copy that *scratch returns
 * for the caller to free after the run) and point coll->send at it. */
braid_status braid__mulsum_prepare(int rank, int size, struct braid_coll *coll, void **scratch);

#endif
