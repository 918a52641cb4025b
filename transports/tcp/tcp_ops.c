/* The TCP transport's ops table. */
#include <stddef.h>

#include "tcp.h"
#include "tcp_conn.h"

/* TCP works wherever sockets do. */
static braid_status tcp_probe(char *why, size_t why_len)
{
    if (why && why_len)
        why[0] = '\0';
    return BRAID_OK;
}

/* TCP copies through the kernel, so registration is a no-op that always
 * succeeds: callers may register unconditionally. */
static braid_status tcp_reg_mem(braid_conn *conn, void *buf, size_t len, void **handle)
{
    (void)conn;
    (void)buf;
    (void)len;
    *handle = NULL;
    return BRAID_OK;
}

static braid_status tcp_dereg_mem(braid_conn *conn, void *handle)
{
    (void)conn;
    (void)handle;
    return BRAID_OK;
}

const braid_transport_ops braid__tcp_ops = {
    .size = sizeof(braid_transport_ops),
    .name = "tcp",
    .probe = tcp_probe,
    .listen = braid_tcp_listen,
    .accept = braid_tcp_accept,
    .connect = braid_tcp_connect,
    .close_listener = braid_tcp_close_listener,
    .reg_mem = tcp_reg_mem,
    .dereg_mem = tcp_dereg_mem,
    .isend = braid_tcp_isend,
    .irecv = braid_tcp_irecv,
    .test = braid_tcp_test,
    .progress = braid_tcp_progress,
    .close = braid_tcp_close,
};
