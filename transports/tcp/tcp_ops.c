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

const braid_transport_ops braid__tcp_ops = BRAID_COPY_TRANSPORT_OPS(tcp, tcp_probe, BRAID_TRANSPORT_ANY_PAIR, NULL);
