/* Shared-memory transport: for peers on one host, a pair of single-producer
 * single-consumer byte rings in a memfd per connection, set up over an
 * authenticated abstract Unix socket that then stays open as the liveness
 * channel. */
#ifndef BRAID_SHM_H
#define BRAID_SHM_H

#include "braid_transport.h"

extern const braid_transport_ops braid__shm_ops;

#endif
