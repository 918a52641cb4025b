/* Device links: a cuda_ipc connection between same-host ring neighbours,
 * beside their shm/TCP connection, for device all-reduces that run the
 * device ring on both ends (cuda/device_ring.c, docs/CUDA.md).
 *
 * Made at group creation, for every pair of ring neighbours that share a
 * host and both offer one (a CUDA build with a device visible, and
 * BRAID_TRANSPORT unset or naming cuda_ipc beside other transports), so
 * that both ends know which pairs have one without asking at call time.
 * Creation is a TCP connection only; the CUDA side is set up by the first
 * device ring that uses the link, on its device, and settles on usable or
 * not (GPUs that cannot reach each other) alike on both ends. */
#ifndef BRAID_DEVLINK_H
#define BRAID_DEVLINK_H

#include "pg.h"

/* Before the address exchange: listen when this rank offers links. */
braid_status braid__devlink_listen(braid_pg *pg, const char *want);

/* Through the store, after the host identities are known: publish our
 * address ("" when we offer none) and read the ring neighbours'. */
braid_status braid__devlink_exchange(braid_pg *pg);

/* After the host connections: connect the links (the lower rank dials). */
braid_status braid__devlink_connect(braid_pg *pg);

/* The link to peer, or NULL when the pair has none. */
braid_conn *braid__devlink(braid_pg *pg, int peer);

/* Number of neighbours with a link (for the join log line). */
int braid__devlink_count(const braid_pg *pg);

/* Progress the link's set-up without blocking: *settled once both ends
 * know whether it carries data, *usable when it does. Logs once per link
 * why one is not usable. */
braid_status braid__devlink_settle(braid_pg *pg, int peer, int *settled, int *usable);

/* Close the links. status != BRAID_OK: a failing group (peers blocked on
 * them fail now), whose links are marked failed first, so that closing one
 * waits for nothing from its peer. */
void braid__devlink_close(braid_pg *pg, braid_status status);

/* Close the links and the listener, free the state (group teardown). */
void braid__devlink_release(braid_pg *pg);

#endif
