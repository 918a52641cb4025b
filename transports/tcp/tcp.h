/* TCP transport: authenticated connections of one or more sockets per peer,
 * messages striped across the sockets, non-blocking progress with poll(). */
#ifndef BRAID_TCP_H
#define BRAID_TCP_H

#include "braid_transport.h"

extern const braid_transport_ops braid__tcp_ops;

#endif
