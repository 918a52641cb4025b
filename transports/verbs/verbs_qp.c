/* Queue-pair set-up (see verbs_qp.h). */
#include <errno.h>
#include <string.h>

#include "log.h"
#include "param.h"
#include "status.h"
#include "verbs_qp.h"

/* Integer knob in [lo, hi]; out-of-range values are reported and replaced
 * by the default rather than passed to the hardware, which would fail the
 * transition with a bare EINVAL. */
static int knob(const char *name, int def, int lo, int hi)
{
    long long v = braid__param_int(name, def);
    if (v < lo || v > hi) {
        BRAID_WARN("ignoring %s=%lld: must be in %d..%d", name, v, lo, hi);
        return def;
    }
    return (int)v;
}

braid_status braid__verbs_qp_create(braid_verbs_dev *dev, struct ibv_cq *cq, uint32_t sq_depth, uint32_t rq_depth,
                                    int rank, int peer, struct ibv_qp **out)
{
    struct ibv_qp_init_attr ia = {
        .send_cq = cq,
        .recv_cq = cq,
        .cap = {.max_send_wr = sq_depth, .max_recv_wr = rq_depth, .max_send_sge = 1, .max_recv_sge = 1},
        .qp_type = IBV_QPT_RC,
        .sq_sig_all = 1, /* every completion drives the window */
    };
    struct ibv_qp *qp = ibv_create_qp(dev->pd, &ia);
    if (!qp)
        return braid__error(BRAID_ERR_SYSTEM, "rank %d: peer %d: ibv_create_qp on %s (%u send, %u receive): %m", rank,
                            peer, dev->name, sq_depth, rq_depth);
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_INIT,
        .pkey_index = 0,
        .port_num = dev->port,
        .qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
    };
    int err = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    if (err) {
        ibv_destroy_qp(qp);
        return braid__error(BRAID_ERR_SYSTEM, "rank %d: peer %d: queue pair to INIT on %s port %u: %s", rank, peer,
                            dev->name, dev->port, strerror(err));
    }
    *out = qp;
    return BRAID_OK;
}

braid_status braid__verbs_qp_connect(struct ibv_qp *qp, braid_verbs_dev *dev, const braid_verbs_info *remote,
                                     uint32_t local_psn, int rank, int peer)
{
    enum ibv_mtu mtu = (uint8_t)dev->mtu < remote->mtu ? dev->mtu : (enum ibv_mtu)remote->mtu;
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_RTR,
        .path_mtu = mtu,
        .dest_qp_num = remote->qpn,
        .rq_psn = remote->psn,
        /* No RDMA reads or atomics are used, but 0 is rejected by some
         * providers. */
        .max_dest_rd_atomic = 1,
        /* 12 = 0.64 ms: receives are reposted as completions are polled, so
         * an RNR NAK means a briefly busy receiver, not a lost one. */
        .min_rnr_timer = 12,
        .ah_attr =
            {
                .dlid = remote->lid,
                .sl = (uint8_t)knob("BRAID_IB_SL", 0, 0, 15),
                .src_path_bits = 0,
                .port_num = dev->port,
            },
    };
    if (dev->gid_index >= 0 && (remote->flags & BRAID_VERBS_INFO_GID_VALID)) {
        a.ah_attr.is_global = 1;
        memcpy(a.ah_attr.grh.dgid.raw, remote->gid, 16);
        a.ah_attr.grh.sgid_index = (uint8_t)dev->gid_index;
        a.ah_attr.grh.hop_limit = 255;
        a.ah_attr.grh.traffic_class = (uint8_t)knob("BRAID_IB_TC", 0, 0, 255);
        a.ah_attr.grh.flow_label = 0;
    } else if (dev->link_layer == IBV_LINK_LAYER_ETHERNET) {
        return braid__error(BRAID_ERR_PEER, "rank %d: peer %d sent no GID, which RoCE needs", rank, peer);
    }
    int err = ibv_modify_qp(qp, &a,
                            IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (err)
        return braid__error(BRAID_ERR_SYSTEM,
                            "rank %d: peer %d: queue pair to RTR (remote qpn %u, lid %u, mtu %u) on %s: %s", rank, peer,
                            remote->qpn, remote->lid, braid__verbs_mtu_bytes((uint8_t)mtu), dev->name, strerror(err));

    struct ibv_qp_attr r = {
        .qp_state = IBV_QPS_RTS,
        /* 4.096 us * 2^timeout per try: 18 is ~1 s, so a dead link fails
         * after retry_cnt seconds instead of hanging. */
        .timeout = (uint8_t)knob("BRAID_IB_TIMEOUT", 18, 1, 31),
        .retry_cnt = (uint8_t)knob("BRAID_IB_RETRY_CNT", 7, 0, 7),
        .rnr_retry = 7, /* infinite: see min_rnr_timer */
        .sq_psn = local_psn,
        .max_rd_atomic = 1,
    };
    err = ibv_modify_qp(qp, &r,
                        IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                            IBV_QP_MAX_QP_RD_ATOMIC);
    if (err)
        return braid__error(BRAID_ERR_SYSTEM, "rank %d: peer %d: queue pair to RTS on %s: %s", rank, peer, dev->name,
                            strerror(err));
    return BRAID_OK;
}

void braid__verbs_qp_to_error(struct ibv_qp *qp)
{
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
    int err = ibv_modify_qp(qp, &a, IBV_QP_STATE);
    if (err)
        BRAID_WARN("verbs: queue pair %u to ERR: %s", qp->qp_num, strerror(err));
}
