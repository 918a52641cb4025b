/* cuda_ipc transport: same-host GPU peers, device-to-device copies through
 * a CUDA IPC staging ring per connection (cuda_ipc.c). The ops table is
 * built only with CUDA (BRAID_HAVE_CUDA); without it cuda_ipc_stub.c
 * answers the functions below (no transport, nothing to wrap). */
#ifndef BRAID_CUDA_IPC_H
#define BRAID_CUDA_IPC_H

#include "braid_transport.h"

extern const braid_transport_ops braid__cuda_ipc_ops;

/* The ops table, or NULL in a build without CUDA. */
const braid_transport_ops *braid__cuda_ipc_transport(void);

/* A device link over an authenticated TCP connection (taken over; closed
 * on failure). Nothing CUDA happens until its first progress, which
 * builds the receive ring on the calling thread's current device and
 * starts the set-up exchange. */
braid_status braid__cuda_ipc_wrap(int rank, braid_conn *tcp, braid_conn **out);

/* Progress a device link's set-up without blocking: *settled once both
 * ends know whether it can carry data, *usable when it can (the same
 * answer on both ends). */
braid_status braid__cuda_ipc_settle(braid_conn *conn, int *settled, int *usable);

/* *pending: control messages posted but not yet handed to the socket. A
 * collective that used the link waits for 0 before it returns, so that
 * the peer is not left waiting for a DATA or CREDIT while this rank has
 * moved on to a call that does not progress the link. */
braid_status braid__cuda_ipc_tx_pending(braid_conn *conn, int *pending);

/* Why a settled link is unusable ("" while usable). */
const char *braid__cuda_ipc_unusable_why(braid_conn *conn);

#endif
