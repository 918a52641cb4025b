/*
 * braid transport interface: for transport authors, not for trainers.
 *
 * A transport moves bytes between two ranks over one connection. The
 * algorithms see only this table; the process group picks a transport per
 * peer pair. Modelled on NCCL's net plugin and libfabric's providers:
 *  - tables are const, filled with designated initializers, and start with
 *    `size` so optional slots can be probed with BRAID_TRANSPORT_HAS();
 *  - requests are caller-owned (no allocation on the data path);
 *  - each connection is authenticated with the job secret before use.
 */
#ifndef BRAID_TRANSPORT_H
#define BRAID_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "braid.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BRAID_SECRET_BYTES 16
#define BRAID_ADDR_MAX 128     /* printable listener address, NUL included */
#define BRAID_WIRE_VERSION 3   /* bumped on any incompatible wire change */

typedef struct braid_transport_ops braid_transport_ops;

/** What a transport needs to know about the group it serves. */
typedef struct {
    int rank;
    int size;
    uint8_t secret[BRAID_SECRET_BYTES]; /* job secret: proves group membership */
    uint64_t pg_tag;     /* distinguishes groups sharing a secret (shrink, split) */
    int timeout_ms;      /* connection set-up and handshake limit */
    int nsocks;          /* sockets per connection (TCP); 0: the transport picks */
    char bind_ip[64];    /* numeric address to listen on ("" = any) */
} braid_transport_ctx;

/** Base of every transport connection; transports embed it first. */
typedef struct braid_conn {
    const braid_transport_ops *ops;
    int peer;             /* remote rank */
    braid_status error;   /* sticky: first failure of this connection */
    uint64_t *bytes_sent; /* where braid's algorithms count what they post on it: the group's total for its
                           * transport (braid_pg_stats); NULL: not counted. Transports leave it alone */
} braid_conn;

/** Base of every transport listener; transports embed it first. */
typedef struct braid_listener {
    const braid_transport_ops *ops;
} braid_listener;

/** What a transport is told of each end of a pair it may serve. */
typedef struct {
    int rank;
    uint64_t host_hash; /* equal for ranks of one host */
    int same_host;      /* the peer's host identity equals this rank's (exact, not by hash) */
} braid_peer_info;

/** Which pairs a transport can serve (the scope slot). */
typedef enum {
    BRAID_TRANSPORT_ANY_PAIR = 0,    /* any: a candidate for the group's transport */
    BRAID_TRANSPORT_SOME_PAIRS = 1,  /* those can_connect accepts, beside the group's transport (shm) */
    BRAID_TRANSPORT_DEVICE_LINK = 2, /* device calls between same-host ring neighbours (src/lifecycle/devlink.c) */
} braid_transport_scope;

typedef enum { BRAID_REQ_SEND = 1, BRAID_REQ_RECV = 2 } braid_req_kind;

/** One posted transfer. Owned by the caller; must stay valid until test()
 *  reports done or the connection is closed. */
typedef struct braid_req {
    braid_conn *conn;
    braid_req_kind kind;
    void *buf;
    size_t len;
    size_t moved;          /* bytes transferred so far (transport-maintained) */
    int done;
    struct braid_req *next;          /* transport queue link */
    uint64_t tp[6];                  /* transport-private scratch */
} braid_req;

struct braid_transport_ops {
    size_t size;          /* sizeof(braid_transport_ops) the transport was built with */
    const char *name;     /* "tcp", "verbs", ... */

    /** Usable on this machine? On failure writes a reason into why. */
    braid_status (*probe)(char *why, size_t why_len);

    /** Open a listener; writes the address peers pass to connect(). */
    braid_status (*listen)(const braid_transport_ctx *ctx, braid_listener **listener,
                           char addr[BRAID_ADDR_MAX]);

    /** Wait for the authenticated connection from rank `peer`. Connections
     *  from other ranks are kept for later accept() calls; strangers and
     *  failed handshakes are dropped and logged. */
    braid_status (*accept)(braid_listener *listener, int peer, int timeout_ms, braid_conn **conn);

    /** Connect to rank `peer` listening at addr and authenticate. */
    braid_status (*connect)(const braid_transport_ctx *ctx, int peer, const char *addr, int timeout_ms,
                            braid_conn **conn);

    void (*close_listener)(braid_listener *listener);

    /** Optional: register memory for zero-copy transports. */
    braid_status (*reg_mem)(braid_conn *conn, void *buf, size_t len, void **handle);
    braid_status (*dereg_mem)(braid_conn *conn, void *handle);

    /** Post a send / receive of exactly len bytes. Transfers on one
     *  connection complete in posting order per direction. */
    braid_status (*isend)(braid_conn *conn, braid_req *req, const void *buf, size_t len);
    braid_status (*irecv)(braid_conn *conn, braid_req *req, void *buf, size_t len);

    /** Make progress without blocking; *done = 1 when req finished.
     *  Returns the connection's error once it has failed. */
    braid_status (*test)(braid_req *req, int *done);

    /** Progress every listed connection; when nothing moved, block until one
     *  may move, wake_fd becomes readable, or timeout_ms passes. */
    braid_status (*progress)(braid_conn **conns, int nconns, int wake_fd, int timeout_ms);

    /** Close a connection; pending requests are abandoned. */
    void (*close)(braid_conn *conn);

    /** Which pairs it serves (braid_transport_scope). */
    int scope;
    /** 1: the whole group agrees on it before any rank uses it. It reaches
     *  other hosts but, unlike TCP, may be missing or broken on some of
     *  them, and a pair whose ends chose differently could never connect. */
    int agreed;
    /** Optional: whether it can serve the pair (me, peer) when both listen
     *  on it; both ends must answer alike. NULL: every such pair. */
    int (*can_connect)(const braid_peer_info *me, const braid_peer_info *peer);
};

/** True when the table has slot `field` filled (for optional slots). */
#define BRAID_TRANSPORT_HAS(ops, field)                                                        \
    ((ops)->size > offsetof(braid_transport_ops, field) && (ops)->field != NULL)

#ifdef __cplusplus
}
#endif
#endif /* BRAID_TRANSPORT_H */
