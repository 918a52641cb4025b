/* Reliable-connected queue pairs: creation and the INIT -> RTR -> RTS
 * transitions, with the path attributes from the peer's set-up message and
 * the BRAID_IB_* tuning knobs. */
#ifndef BRAID_VERBS_QP_H
#define BRAID_VERBS_QP_H

#include <infiniband/verbs.h>

#include "braid.h"
#include "verbs_dev.h"
#include "verbs_proto.h"

/* RC queue pair on cq (send and receive), in INIT, ready for receives. */
braid_status braid__verbs_qp_create(braid_verbs_dev *dev, struct ibv_cq *cq, uint32_t sq_depth, uint32_t rq_depth,
                                    int rank, int peer, struct ibv_qp **qp);

/* Connect to the peer described by remote: RTR with the smaller of both
 * MTUs, then RTS with our PSN. */
braid_status braid__verbs_qp_connect(struct ibv_qp *qp, braid_verbs_dev *dev, const braid_verbs_info *remote,
                                     uint32_t local_psn, int rank, int peer);

/* Move to ERR so outstanding work flushes (teardown; best effort). */
void braid__verbs_qp_to_error(struct ibv_qp *qp);

#endif
