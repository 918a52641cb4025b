/* How a staged job cuts its ops into pieces and lays them out in a pool
 * half (cuda/hmem_plan.c; docs/CUDA.md, "Staged pieces"). Pure code, no
 * CUDA: the staging (hmem_stage.c) runs what it plans. */
#ifndef BRAID_HMEM_PLAN_H
#define BRAID_HMEM_PLAN_H

#include <stddef.h>

#include "algo/coll.h"

/* Pool areas start on this boundary. */
#define BRAID_PLAN_ALIGN 256

/* One op of a segment. Piece j covers elements [j * per, j * per + len)
 * of each of its blocks and runs at step start + j. */
typedef struct {
    braid_coll *op;
    size_t esize, per, npieces;
    size_t start;      /* first step (a send or receive behind earlier ones to the same peer) */
    int srows, rrows;  /* blocks of the send and recv sides (0: none on this rank) */
    int shared;        /* send and recv are one area (in place on pinned memory) */
    int down, up;      /* the op's input goes down, its result comes up */
    int whole;         /* host buffers only: one piece, the whole op, on its own buffers */
    size_t soff, roff; /* the sides' areas in a half */
} braid_piece_plan;

/* Cut op for a group of `size` ranks as rank `rank`. The cut depends only
 * on what every rank of the op knows (kind, count, dtype, size, which
 * buffers are device memory): collectives and send/receive pairs meet
 * piece for piece. A zero-count op is one empty piece, as a host call of
 * it still runs. */
void braid__plan_op(int rank, int size, braid_coll *op, braid_piece_plan *p);

/* Order a segment's sends and receives (each (peer, direction) takes its
 * ops in issue order, one piece per step) and lay the areas out; returns
 * the bytes of a pool half the segment needs. At most
 * BRAID_HMEM_PIECE_BYTES for one collective, and for any run of sends and
 * receives of a group of up to 512 ranks. */
size_t braid__plan_layout(braid_piece_plan *plans, int n);

/* Steps the segment takes. */
size_t braid__plan_steps(const braid_piece_plan *plans, int n);

/* Whether p has a piece at step k; then its elements [*off, *off + *len). */
int braid__plan_piece(const braid_piece_plan *p, size_t k, size_t *off, size_t *len);

#endif
