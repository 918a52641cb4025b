/* Verbs transport wire protocol, as pure functions over integers and byte
 * buffers: no verbs headers here, so every rule is unit-tested on machines
 * without an RDMA device.
 *
 * Data path. Each side of a connection owns a receive ring of `nslots`
 * slots of `slot_bytes` each, registered for remote write. A message is cut
 * into chunks of slot_bytes (the last one shorter; a 0-byte message is one
 * empty chunk) and each chunk is an RDMA WRITE WITH IMMEDIATE into the next
 * slot of the peer's ring, in order: chunk number k of the connection goes
 * to slot k % nslots. The immediate names the slot, the length and whether
 * the chunk ends a message, so the receiver can frame messages without a
 * header in the payload. The receiver copies a slot out into the posted
 * receive buffer and then owes the sender one credit; credits travel back
 * as zero-byte SEND WITH IMMEDIATE messages. A sender holds at most nslots
 * unreturned chunks, so it can never overwrite a slot not yet copied out.
 *
 * Immediate layout (32 bits, sent big endian as verbs requires):
 *   31..30 kind: 0 data, 1 credit, 2 close, 3 reserved (rejected)
 *   data:   29 last | 28..21 slot (8 bits) | 20..0 length (21 bits)
 *   credit: 29..0 number of slots returned (>= 1)
 *   close:  29..0 zero; sent once, after every data chunk, on clean close
 */
#ifndef BRAID_VERBS_PROTO_H
#define BRAID_VERBS_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "braid.h"

#define BRAID_VERBS_MAX_SLOTS 256u /* 8 slot bits */
#define BRAID_VERBS_MIN_SLOT_BYTES 4096u
#define BRAID_VERBS_MAX_SLOT_BYTES (1u << 20) /* fits the 21 length bits */

typedef enum {
    BRAID_VERBS_IMM_DATA = 0,
    BRAID_VERBS_IMM_CREDIT = 1,
    BRAID_VERBS_IMM_CLOSE = 2,
} braid_verbs_imm_kind;

typedef struct {
    braid_verbs_imm_kind kind;
    uint32_t slot;    /* data */
    uint32_t len;     /* data */
    int last;         /* data */
    uint32_t credits; /* credit */
} braid_verbs_imm;

/* Encoders take values the caller has already bounded (slot < 256,
 * len <= BRAID_VERBS_MAX_SLOT_BYTES, 1 <= credits < 2^30). */
uint32_t braid__verbs_imm_data(uint32_t slot, uint32_t len, int last);
uint32_t braid__verbs_imm_credit(uint32_t credits);
uint32_t braid__verbs_imm_close(void);

/* Decode an immediate received on a ring of nslots x slot_bytes. Rejects a
 * reserved kind, a slot or length outside the ring, a non-final chunk that
 * is not full (chunking is deterministic, so the sender cannot mean it), a
 * zero or oversized credit and a close with payload bits. On rejection
 * writes the reason into why and returns BRAID_ERR_PEER. */
braid_status braid__verbs_imm_decode(uint32_t imm, uint32_t nslots, uint32_t slot_bytes, braid_verbs_imm *out,
                                     char *why, size_t why_len);

/* ---- chunking ------------------------------------------------------------ */

/* Number of chunks of a len-byte message: at least 1, so that an empty
 * message still marks its place in the stream. */
uint64_t braid__verbs_chunk_count(size_t len, uint32_t slot_bytes);

/* Offset and length of chunk i (< count) and whether it is the last. */
void braid__verbs_chunk_at(size_t len, uint32_t slot_bytes, uint64_t i, size_t *off, uint32_t *clen, int *last);

/* ---- credit windows -------------------------------------------------------
 * Counters only grow (64 bits do not wrap in practice), so every invariant
 * is a plain comparison. */

/* Sender side. Chunk k goes out when fewer than `window` chunks are
 * unreturned by the peer AND fewer than `window` are locally incomplete:
 * the second bound frees the staging slot k % window and bounds the send
 * queue. */
typedef struct {
    uint64_t posted;    /* chunks handed to the hardware */
    uint64_t credited;  /* chunks the peer has returned */
    uint64_t completed; /* chunks whose send completion was polled */
    uint32_t window;    /* <= the peer's nslots */
} braid_verbs_tx;

void braid__verbs_tx_init(braid_verbs_tx *tx, uint32_t window);
int braid__verbs_tx_can_post(const braid_verbs_tx *tx);
void braid__verbs_tx_post(braid_verbs_tx *tx);
/* BRAID_ERR_PEER when the peer returns more than was posted. */
braid_status braid__verbs_tx_credit(braid_verbs_tx *tx, uint32_t n);
/* BRAID_ERR_INTERNAL when nothing was outstanding. */
braid_status braid__verbs_tx_complete(braid_verbs_tx *tx);

/* Receiver side. `returned` counts credits handed to the hardware: the
 * sender's `credited` can only trail it, so arrived - returned < nslots is
 * exactly the condition that the sender respected the window. */
typedef struct {
    uint64_t arrived;  /* chunks written into the ring */
    uint64_t consumed; /* chunks copied out */
    uint64_t returned; /* credits sent back */
    uint32_t nslots;
    uint32_t batch; /* return credits in groups of this many... */
} braid_verbs_rx;

void braid__verbs_rx_init(braid_verbs_rx *rx, uint32_t nslots);
/* Account for a data chunk that landed in slot: BRAID_ERR_PEER (reason in
 * why) when it is not the next slot or overruns the window. */
braid_status braid__verbs_rx_arrive(braid_verbs_rx *rx, uint32_t slot, char *why, size_t why_len);
/* Slot of the oldest chunk not yet consumed (only when consumed < arrived). */
uint32_t braid__verbs_rx_next_slot(const braid_verbs_rx *rx);
void braid__verbs_rx_consume(braid_verbs_rx *rx);
/* Credits to send now: a full batch, or whatever is owed once every
 * arrived chunk is consumed (the sender may be waiting on exactly those,
 * so holding them back could stall the stream). 0: nothing to send. */
uint32_t braid__verbs_rx_credits_due(const braid_verbs_rx *rx);
void braid__verbs_rx_returned(braid_verbs_rx *rx, uint32_t n);

/* ---- connection set-up message ------------------------------------------
 * Exchanged over the authenticated out-of-band TCP connection before the
 * queue pairs are connected. Little endian, fixed size:
 *   0 magic "BVQ1" | 4 version u16 | 6 link layer u8 | 7 mtu u8
 *   8 qpn u32 | 12 psn u32 | 16 lid u16 | 18 flags u16 (bit 0: gid valid)
 *  20 gid[16] | 36 nslots u32 | 40 slot_bytes u32 | 44 ring addr u64
 *  52 ring rkey u32 | 56 rank i32 | 60 reserved u32 (0) */
#define BRAID_VERBS_INFO_BYTES 64
#define BRAID_VERBS_INFO_VERSION 1
#define BRAID_VERBS_LINK_IB 1
#define BRAID_VERBS_LINK_ETH 2
#define BRAID_VERBS_INFO_GID_VALID 1u

typedef struct {
    uint8_t link_layer; /* BRAID_VERBS_LINK_* */
    uint8_t mtu;        /* ibv_mtu value: 1 (256) .. 5 (4096) */
    uint32_t qpn;
    uint32_t psn;
    uint16_t lid;
    uint16_t flags;
    uint8_t gid[16];
    uint32_t nslots;
    uint32_t slot_bytes;
    uint64_t ring_addr;
    uint32_t ring_rkey;
    int32_t rank;
} braid_verbs_info;

void braid__verbs_info_encode(const braid_verbs_info *info, uint8_t out[BRAID_VERBS_INFO_BYTES]);
/* Decode exactly BRAID_VERBS_INFO_BYTES; BRAID_ERR_PEER with the reason in
 * why for a bad magic, version, link layer, MTU, QP number, PSN, ring
 * geometry, null ring, negative rank or non-zero reserved bits. */
braid_status braid__verbs_info_decode(const uint8_t *buf, size_t len, braid_verbs_info *info, char *why,
                                      size_t why_len);

/* Bytes of an ibv_mtu value (1..5), 0 when out of range. */
uint32_t braid__verbs_mtu_bytes(uint8_t mtu);

/* ---- device selection -----------------------------------------------------
 * BRAID_IB_HCA: comma-separated "name[:port]" entries, in preference
 * order. */
#define BRAID_VERBS_HCA_MAX 16
#define BRAID_VERBS_HCA_NAME_MAX 64

typedef struct {
    char name[BRAID_VERBS_HCA_NAME_MAX];
    int port; /* 0: any active port */
} braid_verbs_hca;

/* Parse spec into at most max entries; BRAID_ERR_INVALID_ARG with the
 * reason in why on an empty entry, a name too long, or a port that is not
 * an integer in 1..255. */
braid_status braid__verbs_hca_parse(const char *spec, braid_verbs_hca *out, int max, int *n, char *why, size_t why_len);

/* GID table entry types, as ibv_query_gid_ex or sysfs report them. */
typedef enum {
    BRAID_VERBS_GID_IB = 0,
    BRAID_VERBS_GID_ROCE_V1 = 1,
    BRAID_VERBS_GID_ROCE_V2 = 2,
    BRAID_VERBS_GID_UNKNOWN = 3,
} braid_verbs_gid_type;

/* The GID index for RoCE: a RoCE v2 entry with an IPv4-mapped address
 * first (routable and what most fabrics configure), then a RoCE v2 entry
 * with a global IPv6 address, then any non-zero RoCE v2 entry; -1 when the
 * table has none. present[i] == 0 marks an unreadable entry. */
int braid__verbs_gid_pick(const uint8_t (*gids)[16], const braid_verbs_gid_type *types, const int *present, int n);

#endif
