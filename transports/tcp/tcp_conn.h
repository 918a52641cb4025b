/* TCP transport internals shared by its files (not for the rest of braid).
 *
 * Wire format of the data path: each message of len bytes becomes an
 * 8-byte big-endian length header plus the payload, striped over the
 * connection's sockets. Messages under BRAID_TCP_STRIPE_MIN (or with one
 * socket) travel whole on socket 0; larger ones are cut into nsocks
 * contiguous parts of `chunk` bytes (the last ones possibly shorter or
 * empty), part k on socket k, the header in front of part 0. Both sides
 * derive the layout from len alone, and the receiver checks the header
 * against the length it posted, so a mismatched pair of calls fails with
 * BRAID_ERR_MISMATCH instead of corrupting later messages. */
#ifndef BRAID_TCP_CONN_H
#define BRAID_TCP_CONN_H

#include <stddef.h>
#include <stdint.h>

#include "bootstrap/sock.h"
#include "braid_transport.h"
#include "transports/common/ops.h"

#define BRAID_TCP_MAX_SOCKS 64
#define BRAID_TCP_DEFAULT_SOCKS 2 /* per peer across a network (BRAID_NSOCKS unset) */
#define BRAID_TCP_STRIPE_MIN (64 * 1024)
#define BRAID_TCP_STRIPE_ALIGN 4096
#define BRAID_TCP_HDR_BYTES 8
#define BRAID_TCP_HANDSHAKE_MAX_MS 10000

/* One socket of a connection and where it stands in each queue: the
 * message it is moving (NULL: none) and how many of its bytes of that
 * message (header included on socket 0) are done. */
typedef struct {
    int fd;
    braid_req *send_cur;
    size_t send_off;
    braid_req *recv_cur;
    size_t recv_off;
    int eof_seen; /* peer closed this socket; data may remain */
} braid_tcp_sock;

typedef struct {
    braid_conn base; /* first: braid_conn * downcasts to this */
    int rank;
    int nsocks;
    int peer_closed; /* orderly close seen with nothing pending */
    int unseen_done; /* requests completed since the last progress() */
    char addr[BRAID_SOCK_ADDR_STR];
    char error_text[512]; /* of the sticky error, for later calls */
    braid_req *send_head, *send_tail;
    braid_req *recv_head, *recv_tail;
    braid_tcp_sock socks[]; /* [nsocks] */
} braid_tcp_conn;

static inline braid_tcp_conn *braid__tcp_conn_of(braid_conn *conn)
{
    return (braid_tcp_conn *)conn; /* base is the first member */
}

/* Wrap nsocks connected, authenticated sockets (fds[k] = socket k) into a
 * connection. On success the connection owns the fds; on failure the
 * caller still does. */
braid_status braid__tcp_conn_create(int rank, int peer, int nsocks, const int *fds, const char *addr,
                                    braid_tcp_conn **conn);

/* Stripe layout: bytes [*off, *off + *len) of a message of msg_len go on
 * socket k of nsocks. */
void braid__tcp_stripe(size_t msg_len, int nsocks, int k, size_t *off, size_t *len);

/* Ops (tcp_conn.c, tcp_data.c, tcp_listen.c), declared by slot type (common/ops.h). */
braid_listen_func_t braid__tcp_listen;
braid_accept_func_t braid__tcp_accept;
braid_close_listener_func_t braid__tcp_close_listener;
braid_connect_func_t braid__tcp_connect;
braid_close_func_t braid__tcp_close;
braid_isend_func_t braid__tcp_isend;
braid_irecv_func_t braid__tcp_irecv;
braid_test_func_t braid__tcp_test;
braid_progress_func_t braid__tcp_progress;

#endif
