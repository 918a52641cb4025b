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

/* Shared memory reaches ranks of this host only. */
static int shm_can_connect(const braid_peer_info *me, const braid_peer_info *peer)
{
    (void)me;
    return peer->same_host;
}

const braid_transport_ops braid__shm_ops =
    BRAID_COPY_TRANSPORT_OPS(shm, shm_probe, BRAID_TRANSPORT_SOME_PAIRS, shm_can_connect);
