/* The TCP transport's ops table. */
#include <stddef.h>

#include "tcp.h"
#include "tcp_conn.h"
#include "transports/common/ops.h"

/* TCP works wherever sockets do. */
static braid_status tcp_probe(char *why, size_t why_len)
{
    if (why && why_len)
        why[0] = '\0';
    return BRAID_OK;
}

const braid_transport_ops braid__tcp_ops = {
    .size = sizeof(braid_transport_ops),
    .name = "tcp",
    .probe = tcp_probe,
    .listen = braid_tcp_listen, .accept = braid_tcp_accept, .close_listener = braid_tcp_close_listener,
    .connect = braid_tcp_connect,
    .reg_mem = braid__reg_mem_none, .dereg_mem = braid__dereg_mem_none,
    .isend = braid_tcp_isend, .irecv = braid_tcp_irecv, .test = braid_tcp_test,
    .progress = braid_tcp_progress, .close = braid_tcp_close,
};
