/* cuda_ipc transport: wire formats and slot accounting. Pure C with no
 * CUDA headers, so tests/test_cuda_ipc_proto.c runs on any machine.
 *
 * Each side of a connection owns a receive ring of nslots device slots of
 * slot_bytes, exported with cudaIpcGetMemHandle, and one inter-process
 * event per slot of the *peer's* ring, exported with cudaIpcGetEventHandle:
 * it records event k after copying a chunk into the peer's slot k, and the
 * peer waits on it before reading the slot. Both travel in the setup
 * message over the authenticated TCP connection that also carries the
 * per-chunk control messages:
 *   DATA(slot, len, last)  sender -> receiver: slot holds len bytes of the
 *                          current message; last marks its final chunk
 *   CREDIT(slot)           receiver -> sender: slot was read, write it again
 *   VERDICT(ok)            each way, once, right after the peer's set-up
 *                          was read: whether this side can reach the
 *                          peer's GPU; the link carries data only when
 *                          both said yes, so both ends decide alike even
 *                          where only one sees the other's GPU
 * A side that cannot use CUDA IPC at all (no IPC event support, a failed
 * allocation) still sends a set-up message, with no slots, so the peer
 * learns it instead of waiting.
 * Slots are used round-robin and freed in order, so the sender's window is
 * a count of credits plus the next slot. A zero-length message is one
 * DATA(slot, 0, last) that takes a slot but copies nothing, so it is flow
 * controlled like the rest; `last` lets the receiver check message
 * boundaries against the lengths it posted (BRAID_ERR_MISMATCH). */
#ifndef BRAID_CUDA_IPC_PROTO_H
#define BRAID_CUDA_IPC_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "braid.h"

#define BRAID_IPC_HANDLE_BYTES 64 /* sizeof(cudaIpcMemHandle_t) == sizeof(cudaIpcEventHandle_t) */
#define BRAID_IPC_MAX_SLOTS 16
#define BRAID_IPC_BUS_ID_BYTES 16 /* "0000:3b:00.0" and NUL */
#define BRAID_IPC_SETUP_MAGIC 0x43504942u /* "BIPC" */
#define BRAID_IPC_VERSION 4
/* The fixed fields and the largest event table, then the pid namespace. */
#define BRAID_IPC_SETUP_PIDNS_AT (32 + BRAID_IPC_BUS_ID_BYTES + BRAID_IPC_HANDLE_BYTES * (1 + BRAID_IPC_MAX_SLOTS))
#define BRAID_IPC_SETUP_BYTES (BRAID_IPC_SETUP_PIDNS_AT + 8)
#define BRAID_IPC_CTRL_BYTES 16

/* What one side tells the other at connection set-up. */
typedef struct {
    uint32_t version;
    int32_t device;                        /* ordinal in the sender's process (logs only) */
    uint32_t nslots;                       /* 1..BRAID_IPC_MAX_SLOTS; 0: this side cannot use IPC */
    uint32_t slot_bytes;                   /* multiple of 256, >= 4096; 0 with no slots */
    uint32_t pid;                          /* the sender's process: CUDA opens no handle in its own */
    uint32_t pidns;                        /* ... in this pid namespace (src/base/proc_id.h) */
    uint64_t host_hash;                    /* same-host check */
    char bus_id[BRAID_IPC_BUS_ID_BYTES];   /* PCI bus id of the sender's device */
    uint8_t ring[BRAID_IPC_HANDLE_BYTES];  /* the sender's receive ring */
    uint8_t events[BRAID_IPC_MAX_SLOTS][BRAID_IPC_HANDLE_BYTES]; /* [nslots] used */
} braid_ipc_setup;

void braid__ipc_setup_encode(const braid_ipc_setup *s, uint8_t out[BRAID_IPC_SETUP_BYTES]);

/* Decode and validate; on failure writes why (never trusted input). */
braid_status braid__ipc_setup_decode(const uint8_t in[BRAID_IPC_SETUP_BYTES], braid_ipc_setup *s, char *why,
                                     size_t why_len);

/* BYE (at close): the sender no longer maps the receiver's ring, which may
 * now be freed (slot 0, len 0). */
typedef enum { BRAID_IPC_DATA = 1, BRAID_IPC_CREDIT = 2, BRAID_IPC_VERDICT = 3, BRAID_IPC_BYE = 4 } braid_ipc_ctrl_kind;

typedef struct {
    braid_ipc_ctrl_kind kind;
    uint32_t slot;
    int last;     /* DATA: final chunk of its message */
    uint64_t len; /* DATA: bytes in the slot (0..slot_bytes, 0 only when last); CREDIT: 0;
                     VERDICT: 1 reachable, 0 not (slot 0) */
} braid_ipc_ctrl;

void braid__ipc_ctrl_encode(const braid_ipc_ctrl *c, uint8_t out[BRAID_IPC_CTRL_BYTES]);
/* Checks kind, slot < nslots and len against slot_bytes (VERDICT: slot 0,
 * len 0 or 1, whatever nslots is). */
braid_status braid__ipc_ctrl_decode(const uint8_t in[BRAID_IPC_CTRL_BYTES], uint32_t nslots, uint32_t slot_bytes,
                                    braid_ipc_ctrl *c, char *why, size_t why_len);

/* Sender's view of the peer's ring and receiver's view of its own. */
typedef struct {
    uint32_t nslots, slot_bytes;
    uint32_t send_next;  /* next slot of the peer's ring to fill */
    uint32_t credits;    /* free slots in the peer's ring */
    uint32_t recv_next;  /* next slot of our ring the peer fills */
    uint32_t recv_held;  /* filled slots of our ring not yet credited back */
} braid_ipc_window;

void braid__ipc_window_init(braid_ipc_window *w, uint32_t nslots, uint32_t slot_bytes);

/* Next chunk of a message with `left` bytes to go (0: an empty message's
 * single chunk): 1 with the slot and length taken from the window, 0 when
 * no slot is free. */
int braid__ipc_window_take(braid_ipc_window *w, size_t left, uint32_t *slot, size_t *len);

/* A CREDIT for slot arrived: must be the oldest slot in flight. */
braid_status braid__ipc_window_credit(braid_ipc_window *w, uint32_t slot);

/* A DATA for slot arrived: must be the next slot, and one the peer could
 * have had credit for. */
braid_status braid__ipc_window_arrive(braid_ipc_window *w, uint32_t slot);

/* We finished reading our oldest held slot: returns it (for the CREDIT). */
uint32_t braid__ipc_window_release(braid_ipc_window *w);

/* Stable hash of the host identity string (FNV-1a 64). */
uint64_t braid__ipc_host_hash(const char *identity);

#endif
