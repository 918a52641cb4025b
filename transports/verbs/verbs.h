/* RDMA verbs transport: reliable-connected queue pairs, messages written
 * with RDMA WRITE WITH IMMEDIATE into the peer's pre-registered receive
 * ring under credit flow control (verbs_proto.h has the protocol, and
 * docs/TRANSPORTS.md the design and knobs). Connections are set up over the
 * TCP transport, whose job-secret handshake authenticates the peer before
 * any queue-pair address is revealed. */
#ifndef BRAID_VERBS_H
#define BRAID_VERBS_H

#include "braid_transport.h"

extern const braid_transport_ops braid__verbs_ops;

/* Data-path entry points shared by the transport's files. */
braid_status braid__verbs_test(braid_req *req, int *done);
braid_status braid__verbs_progress(braid_conn **conns, int nconns, int wake_fd, int timeout_ms);

#endif
