/* cuda_ipc transport: same-host GPU peers, device-to-device copies through
 * a CUDA IPC staging ring per connection (cuda_ipc.c). Built only with
 * CUDA (BRAID_HAVE_CUDA). */
#ifndef BRAID_CUDA_IPC_H
#define BRAID_CUDA_IPC_H

#include "braid_transport.h"

extern const braid_transport_ops braid__cuda_ipc_ops;

#endif
