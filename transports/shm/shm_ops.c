/* The shared-memory transport's ops table. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "shm.h"
#include "shm_conn.h"
#include "transports/common/ops.h"

/* Needs memfd_create (Linux 3.17) to share memory without a name. */
static braid_status shm_probe(char *why, size_t why_len)
{
    int fd = memfd_create("braid-shm-probe", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        if (why && why_len)
            snprintf(why, why_len, "memfd_create: %s", strerror(errno));
        return BRAID_ERR_UNSUPPORTED;
    }
    close(fd);
    if (why && why_len)
        why[0] = '\0';
    return BRAID_OK;
}

const braid_transport_ops braid__shm_ops = {
    .size = sizeof(braid_transport_ops),
    .name = "shm",
    .probe = shm_probe,
    .listen = braid_shm_listen, .accept = braid_shm_accept, .close_listener = braid_shm_close_listener,
    .connect = braid_shm_connect,
    .reg_mem = braid__reg_mem_none, .dereg_mem = braid__dereg_mem_none,
    .isend = braid_shm_isend, .irecv = braid_shm_irecv, .test = braid_shm_test,
    .progress = braid_shm_progress, .close = braid_shm_close,
};
