/* The registration slots of transports that copy: nothing to register. */
#include <stddef.h>

#include "transports/common/ops.h"

braid_status braid__reg_mem_none(braid_conn *conn, void *buf, size_t len, void **handle)
{
    (void)conn;
    (void)buf;
    (void)len;
    *handle = NULL;
    return BRAID_OK;
}

braid_status braid__dereg_mem_none(braid_conn *conn, void *handle)
{
    (void)conn;
    (void)handle;
    return BRAID_OK;
}
