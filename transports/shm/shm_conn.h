/* Shared-memory transport internals shared by its files.
 *
 * A connection is one memfd mapped by both processes:
 *
 *   [ control page | ring 0 data | ring 1 data ]
 *
 * Ring i is written by side i (side 0 dialled, side 1 accepted) and read by
 * the other side. Each ring is a byte stream indexed by two monotonically
 * growing 64-bit counters, head (bytes written, stored by the producer with
 * release) and tail (bytes consumed, stored by the consumer with release),
 * each on its own cache line so the two processes do not share a line they
 * both write. A message of len bytes is an 8-byte little-endian length
 * header followed by the payload, both possibly wrapping around the ring
 * end; the receiver checks the header against the length it posted, so a
 * mismatched pair of calls fails with BRAID_ERR_MISMATCH.
 *
 * Waiting: a side that found nothing to do for a while sets its `sleeping`
 * flag, re-checks the rings and then poll()s its eventfd, its Unix socket
 * and the caller's wake fd. After moving the counters a side issues a full
 * fence and writes the peer's eventfd only if the peer's flag is set (the
 * flag store and the counter load on the sleeping side are separated by a
 * full fence too), so no wake-up is lost and the busy path makes no system
 * calls. The Unix socket carries nothing after set-up: its hang-up is how
 * a dead peer is seen.
 *
 * Single copy: once a side has read a cookie from its peer's memory with
 * process_vm_readv() (same user, no ptrace restriction), the peer sends
 * messages of BRAID_SHM_CMA_MIN bytes and more as a header with
 * BRAID_SHM_CMA_FLAG plus the 8-byte address of its buffer; the receiver
 * reads the payload straight from the sender's buffer and bumps its
 * `acked` counter, which completes the send. Sends complete in posting
 * order, so a copied send behind an unacknowledged one waits for it.
 *
 * Rewind: before a message header the sender may write a header with
 * BRAID_SHM_SKIP_FLAG and the distance to the ring's end instead, and go on
 * at the ring's start; the receiver skips that far. It does so when the
 * space left holds the message and BRAID_SHM_HOT_BYTES, so messages keep to
 * the ring's first tens of KiB (about twice the message), faulted in and
 * cached, instead of walking all of it (a fresh page fault on both sides
 * every 4 KiB, and cold cache lines, until the ring had wrapped once). */
#ifndef BRAID_SHM_CONN_H
#define BRAID_SHM_CONN_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "braid_transport.h"
#include "transports/common/ops.h"
#include "bytes.h"

#define BRAID_SHM_RING_BYTES ((size_t)4 << 20)   /* per direction; a power of two */
#define BRAID_SHM_CTRL_BYTES ((size_t)4096)
#define BRAID_SHM_HDR_BYTES 8
#define BRAID_SHM_MAGIC 0x4d485342u               /* "BSHM" */
#define BRAID_SHM_HANDSHAKE_MAX_MS 10000
#define BRAID_SHM_CACHELINE 64
#define BRAID_SHM_CMA_FLAG ((uint64_t)1 << 63)        /* in a header: an address follows */
#define BRAID_SHM_SKIP_FLAG ((uint64_t)1 << 62)       /* in a header: skip to the ring start */
#define BRAID_SHM_HOT_BYTES ((size_t)32 << 10)        /* least free space a skip leaves */
#define BRAID_SHM_WARM_BYTES ((size_t)256 << 10)      /* ring start faulted in on first use */
/* Smallest message read in place. Below it, two copies through the ring
 * (warm in cache) beat one process_vm_readv: at 128 KiB messages the
 * single copy made 8-rank 1 MiB all-reduces 1.3x slower (PERFORMANCE.md). */
#define BRAID_SHM_CMA_MIN ((size_t)256 << 10)
#define BRAID_SHM_CMA_PIECE ((size_t)4 << 20)         /* bytes read per request per pass */
#define BRAID_SHM_COOKIE 0x6272616964636d61ull         /* "braidcma" */

typedef struct {
    _Alignas(BRAID_SHM_CACHELINE) _Atomic uint64_t head;
    _Alignas(BRAID_SHM_CACHELINE) _Atomic uint64_t tail;
} braid_shm_ring_ctrl;

typedef struct {
    _Alignas(BRAID_SHM_CACHELINE) _Atomic uint32_t v;
} braid_shm_flag;

typedef struct {
    _Alignas(BRAID_SHM_CACHELINE) _Atomic uint64_t v;
} braid_shm_counter;

/* The control page, at offset 0 of the memfd. */
typedef struct {
    uint32_t magic;
    uint32_t version;
    uint64_t ring_bytes;
    braid_shm_flag sleeping[2];    /* side i blocks in poll(): wake it via its eventfd */
    braid_shm_ring_ctrl ring[2];   /* ring i: written by side i */
    /* Single copy (see below): where side i keeps BRAID_SHM_COOKIE, and
     * whether side i could read it from side 1 - i (0 untested, 1 yes, 2 no). */
    _Alignas(BRAID_SHM_CACHELINE) _Atomic uint64_t cookie_addr[2];
    _Atomic uint32_t can_read[2];
    braid_shm_counter acked[2];    /* side i finished this many single-copy reads */
} braid_shm_region;

_Static_assert(sizeof(braid_shm_region) <= BRAID_SHM_CTRL_BYTES, "control page too small");

typedef struct {
    braid_conn base;               /* first: braid_conn * downcasts to this */
    int rank;
    int side;                      /* 0: dialled, 1: accepted */
    int sock;                      /* liveness channel */
    int efd[2];                    /* eventfd of side i */
    int peer_gone;                 /* the socket hung up */
    int peer_pid;                  /* for process_vm_readv; 0: unknown */
    int cma_checked;               /* tried reading the peer's cookie */
    int warm;                      /* braid__shm_conn_warm ran */
    uint64_t cma_sent;             /* single-copy messages sent */
    uint64_t cma_read;             /* single-copy messages read */
    braid_shm_region *region;
    size_t map_bytes;
    size_t ring_bytes;
    uint8_t *tx_data, *rx_data;
    braid_shm_ring_ctrl *tx, *rx;
    uint64_t tx_head, rx_tail;     /* local copies of the counters this side owns */
    char error_text[512];          /* of the sticky error, for later calls */
    braid_req *send_head, *send_tail;
    braid_req *recv_head, *recv_tail;
    braid_req *sent_head, *sent_tail; /* written, waiting for the peer's acks */
} braid_shm_conn;

static inline braid_shm_conn *braid__shm_conn_of(braid_conn *conn)
{
    return (braid_shm_conn *)conn; /* base is the first member */
}

static inline size_t braid__shm_map_bytes(size_t ring_bytes)
{
    return BRAID_SHM_CTRL_BYTES + 2 * ring_bytes;
}

/* Listener addresses: "unix:@name", an abstract Unix socket. */
#define BRAID_SHM_ADDR_PREFIX "unix:@"
/* The listener's last word of the set-up: the connection is parked. */
#define BRAID_SHM_SETUP_ACK "K"

/* "unix:@name" -> abstract address (leading NUL, no terminator). */
braid_status braid__shm_addr_parse(const char *text, struct sockaddr_un *sa, socklen_t *len);

/* Set-up message the dialling side sends after the handshake, together
 * with the memfd and both eventfds (SCM_RIGHTS, in that order). */
typedef struct {
    uint32_t magic;
    uint32_t version;
    uint64_t ring_bytes;
} braid_shm_setup;

/* The value a peer reads from our memory to see whether it can. */
extern const uint64_t braid_shm_cookie;

/* Fresh memfd of ring_bytes rings with an initialized control page, sealed
 * against resizing, and the two eventfds. */
braid_status braid__shm_region_create(int rank, int peer, size_t ring_bytes, int *memfd, int efd[2]);

/* Map memfd and wrap it with the socket and eventfds into a connection for
 * `side`. On success the connection owns the fds; on failure the caller
 * still does. */
braid_status braid__shm_conn_create(int rank, int peer, int side, int sock, int memfd, const int efd[2],
                                    size_t ring_bytes, braid_shm_conn **conn);

void braid__shm_conn_warm(braid_shm_conn *c);

/* Ops (shm_listen.c, shm_dial.c, shm_data.c, shm_conn.c), declared by slot type (common/ops.h). */
braid_listen_func_t braid__shm_listen;
braid_accept_func_t braid__shm_accept;
braid_close_listener_func_t braid__shm_close_listener;
braid_connect_func_t braid__shm_connect;
braid_close_func_t braid__shm_close;
braid_isend_func_t braid__shm_isend;
braid_irecv_func_t braid__shm_irecv;
braid_test_func_t braid__shm_test;
braid_progress_func_t braid__shm_progress;

#endif
