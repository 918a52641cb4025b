/* A process group's per-peer connections, made on first use, its staging
 * buffer and its failure state. */
#include <stdio.h>
#include <stdlib.h>

#include "transports/checksum/checksum.h"
#include "device_coll_group.h"
#include "devlink.h"
#include "log.h"
#include "pg.h"
#include "status.h"
#include "transports/registry.h"

braid_status braid__pg_conn(braid_pg *pg, int peer, braid_conn **conn)
{
    if (pg->conns[peer]) {
        *conn = pg->conns[peer];
        return BRAID_OK;
    }
    /* The lower rank dials; the higher one takes it from its listener,
     * whose accept thread has already authenticated it. */
    braid_conn *c;
    int id = pg->link[peer];
    if (pg->rank < peer)
        BRAID_CHECK(braid__transport_get((braid_transport_id)id)
                        ->connect(&pg->ctx, peer, pg->addr[peer][id], pg->timeout_ms, &c));
    else
        BRAID_CHECK(pg->listeners[id]->ops->accept(pg->listeners[id], peer, pg->timeout_ms, &c));
    if (pg->checksum) {
        braid_status st = braid__checksum_wrap(pg->rank, &c);
        if (st != BRAID_OK) {
            c->ops->close(c);
            return st;
        }
    }
    c->bytes_sent = &pg->sent_by_transport[id];
    pg->conns[peer] = c;
    *conn = c;
    return BRAID_OK;
}

braid_status braid__pg_scratch(braid_pg *pg, size_t bytes, void **buf)
{
    if (pg->scratch_bytes < bytes) {
        void *p = NULL;
        if (posix_memalign(&p, 64, bytes) != 0)
            return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: cannot allocate %zu bytes of staging memory",
                                pg->rank, bytes);
        free(pg->scratch);
        pg->scratch = p;
        pg->scratch_bytes = bytes;
    }
    *buf = pg->scratch;
    return BRAID_OK;
}

void braid__pg_fail(braid_pg *pg, braid_status status)
{
    int expected = BRAID_OK;
    if (atomic_compare_exchange_strong(&pg->error, &expected, (int)status))
        snprintf(pg->error_text, sizeof(pg->error_text), "%s", braid_last_error());
    /* Closing our ends makes every peer blocked on us see the failure now
     * instead of at its timeout. */
    for (int i = 0; i < pg->size; i++) {
        if (pg->conns[i]) {
            if (pg->conns[i]->error == BRAID_OK)
                pg->conns[i]->error = status; /* no goodbye waits: the peers are not closing with us */
            pg->conns[i]->ops->close(pg->conns[i]);
            pg->conns[i] = NULL;
        }
    }
    braid__devlink_close(pg, status);
    braid__devcoll_abort(pg);
}

braid_status braid__pg_check_usable(braid_pg *pg, const char *op_name)
{
    if (atomic_load(&pg->aborted))
        return braid__error_quiet(BRAID_ERR_ABORTED, "rank %d: %s on an aborted process group", pg->rank, op_name);
    int err = atomic_load(&pg->error);
    if (err != BRAID_OK)
        return braid__error_quiet((braid_status)err, "rank %d: %s on a process group broken by an earlier error: %s",
                                  pg->rank, op_name, pg->error_text);
    return BRAID_OK;
}
