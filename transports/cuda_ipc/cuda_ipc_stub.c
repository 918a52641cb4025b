/* transports/cuda_ipc/cuda_ipc.h in a build without CUDA: there is no
 * cuda_ipc transport, so the group never makes device links. */
#include "cuda_ipc.h"
#include "status.h"

const braid_transport_ops *braid__cuda_ipc_transport(void)
{
    return NULL;
}

braid_status braid__cuda_ipc_wrap(int rank, braid_conn *tcp, braid_conn **out)
{
    tcp->ops->close(tcp);
    *out = NULL;
    return braid__error(BRAID_ERR_UNSUPPORTED, "rank %d: cuda_ipc needs a CUDA build", rank);
}

braid_status braid__cuda_ipc_settle(braid_conn *conn, int *settled, int *usable)
{
    (void)conn;
    *settled = 1;
    *usable = 0;
    return BRAID_OK;
}

braid_status braid__cuda_ipc_tx_pending(braid_conn *conn, int *pending)
{
    (void)conn;
    *pending = 0;
    return BRAID_OK;
}

const char *braid__cuda_ipc_unusable_why(braid_conn *conn)
{
    (void)conn;
    return "braid was built without CUDA";
}
