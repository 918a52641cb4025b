/* Optional end-to-end CRC32C of every message between two ranks
 * (BRAID_CHECKSUM=1, braid_config.checksum), as a connection that wraps a
 * transport's connection. See checksum.c for the wire format. */
#ifndef BRAID_CHECKSUM_H
#define BRAID_CHECKSUM_H

#include <stdint.h>

#include "braid_transport.h"

/* Bytes that follow every checksummed message on the wire. */
#define BRAID_CHECKSUM_TRAILER_BYTES 8

/* Wrap the connection *conn (to peer, of this rank) so that every message
 * carries a CRC32C that the receiver checks before it reports the message
 * done. On success *conn is the wrapper, which owns and closes the inner
 * connection; on failure *conn is unchanged and still the caller's. */
braid_status braid__checksum_wrap(int rank, braid_conn **conn);

/* Group agreement through the rendezvous store: each rank announces its
 * setting (before it publishes its address), reads how many ranks have
 * checksums on (once it has every address: all have announced by then),
 * and fails with BRAID_ERR_MISMATCH unless all or none do (called after the
 * init barrier; on a mismatch rank 0, which serves the store, returns only
 * once the others are done with it). A mixed group would misread every
 * message, so it must not start. */
struct braid_store;
braid_status braid__checksum_announce(struct braid_store *store, int on);
braid_status braid__checksum_count(struct braid_store *store, int64_t *on_ranks);
braid_status braid__checksum_agree(struct braid_store *store, int rank, int size, int on, int64_t on_ranks,
                                   int timeout_ms);

/* What a connection that failed with BRAID_ERR_CORRUPT found, for the
 * algorithm to name its call and where the chunk was going. */
typedef struct {
    int rank, peer;
    uint64_t msg;    /* message number on the link, from 0 */
    const void *buf; /* where the message was received */
    size_t len;
    uint32_t expected; /* CRC32C the sender computed */
    uint32_t actual;   /* CRC32C of the bytes received */
    int order;         /* 1: the trailer named another message number (expected/actual are those) */
} braid_checksum_fault;

/* 1 and *f filled when conn is a wrapper that failed a check, else 0. */
int braid__checksum_fault(const braid_conn *conn, braid_checksum_fault *f);

/* 1 when conn is a checksumming wrapper. */
int braid__checksum_is_wrapper(const braid_conn *conn);

#endif
