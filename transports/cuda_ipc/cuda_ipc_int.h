/* cuda_ipc transport internals, shared by cuda_ipc.c (the ops table and
 * requests), cuda_ipc_setup.c (connection set-up and teardown) and
 * cuda_ipc_progress.c (control messages, copies, one progress step). */
#ifndef BRAID_CUDA_IPC_INT_H
#define BRAID_CUDA_IPC_INT_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#include "braid_transport.h"
#include "cuda_ipc_proto.h"

#define IPC_NSLOTS 4
#define IPC_SLOT_BYTES (1u << 20)
#define IPC_TX_MAX (2 * BRAID_IPC_MAX_SLOTS) /* DATA and CREDIT messages in flight */

typedef struct {
    braid_listener base; /* first */
    braid_listener *tcp;
    braid_transport_ctx ctx;
} ipc_listener;

/* A chunk in flight: sent (copy into the peer's slot) or received (copy
 * out of ours). */
typedef struct {
    uint32_t slot;
    size_t len;
    int last;
    int copying;    /* receive side: the copy out is queued */
    braid_req *req;
} ipc_chunk;

typedef struct {
    braid_conn base; /* first: braid_conn * downcasts to this */
    braid_conn *tcp;
    int rank;
    int device;
    uint32_t nslots, slot_bytes;
    cudaStream_t stream;
    void *ring;                                  /* ours; the peer writes it */
    void *peer_ring;                             /* the peer's, opened */
    cudaEvent_t wrote[BRAID_IPC_MAX_SLOTS];      /* ours, exported: recorded after writing peer slot k */
    cudaEvent_t peer_wrote[BRAID_IPC_MAX_SLOTS]; /* opened: the peer wrote our slot k */
    cudaEvent_t read[BRAID_IPC_MAX_SLOTS];       /* local: our copy out of slot k finished */
    braid_ipc_window win;

    /* Set-up: ours goes out when the connection starts (when it is made,
     * or for a device link at first use), the peer's is taken in by a
     * later progress, so no dial waits for the peer's accept (the group
     * dials and accepts in an order that would deadlock a blocking
     * exchange with three or more ranks). Then each side says whether it
     * can reach the other's GPU (VERDICT); data moves once both said yes. */
    int eager;        /* the group's transport: unreachable peers are errors */
    int started;      /* our set-up went out */
    int my_verdict;   /* -1 until the peer's set-up was read; then 1 reachable, 0 not */
    int peer_verdict; /* -1 until the peer's VERDICT arrived */
    uint32_t peer_pid; /* from the peer's set-up (same host): 0 until it arrived */
    uint32_t peer_pidns; /* ... and its pid namespace: peer_pid is ours to signal only in the same one */
    int ready;        /* both said yes, the peer's ring and events are open */
    char unusable_why[256];
    braid_ipc_setup me;
    braid_req setup_tx, setup_rx;
    uint8_t setup_out[BRAID_IPC_SETUP_BYTES], setup_in[BRAID_IPC_SETUP_BYTES];

    braid_req *send_head, *send_tail, *send_assign; /* send_assign: first not fully copied */
    size_t send_off;
    braid_req *recv_head, *recv_tail, *recv_assign;
    size_t recv_off;
    ipc_chunk sent[BRAID_IPC_MAX_SLOTS];  /* FIFO of nsent from sent_head */
    uint32_t sent_head, nsent;
    ipc_chunk got[BRAID_IPC_MAX_SLOTS];   /* FIFO of ngot from got_head */
    uint32_t got_head, ngot;

    braid_req rx;
    uint8_t rx_buf[BRAID_IPC_CTRL_BYTES];
    int rx_posted;
    braid_req tx[IPC_TX_MAX];
    uint8_t tx_buf[IPC_TX_MAX][BRAID_IPC_CTRL_BYTES];
    int tx_busy[IPC_TX_MAX];
    char error_text[384];
} ipc_conn;

static inline ipc_conn *conn_of(braid_conn *c)
{
    return (ipc_conn *)c;
}



/* A failed CUDA call on connection c: BRAID_ERR_CUDA naming rank, peer,
 * the call and the runtime's text (the sticky error is cleared). */
braid_status braid__cuda_ipc_cuda_fail(ipc_conn *c, cudaError_t err, const char *what);
#define IPC_CU(c, call)                                                                        \
    do {                                                                                       \
        cudaError_t e_ = (call);                                                               \
        if (e_ != cudaSuccess)                                                                 \
            return braid__cuda_ipc_cuda_fail((c), e_, #call);                                   \
    } while (0)

/* Set-up (cuda_ipc_setup.c). A connection over an authenticated TCP
 * connection (taken over); eager: the group's transport, where an
 * unreachable peer is an error rather than an unusable link. */
braid_status braid__cuda_ipc_conn_setup(int rank, braid_conn *tcp, int eager, braid_conn **out);
/* Send our set-up message (once). */
braid_status braid__cuda_ipc_start(ipc_conn *c);
/* The peer's set-up arrived: check it, open its ring and events, and tell
 * the peer whether we can reach its GPU. */
braid_status braid__cuda_ipc_finish_setup(ipc_conn *c);
void braid__cuda_ipc_conn_free(ipc_conn *c);

/* Progress (cuda_ipc_progress.c). */
braid_status braid__cuda_ipc_ctrl_send(ipc_conn *c, const braid_ipc_ctrl *m, int *sent);
/* One non-blocking step: control messages, copies, completions; *moved
 * when anything advanced. */
braid_status braid__cuda_ipc_conn_progress(ipc_conn *c, int *moved);
/* Copies or set-up messages are in flight on the GPU or the channel. */
int braid__cuda_ipc_gpu_busy(const ipc_conn *c);
/* Both ends know whether the link carries data. */
int braid__cuda_ipc_settled(const ipc_conn *c);

#endif
