/* Device links between same-host ring neighbours (devlink.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "braid_cuda.h"
#include "bootstrap/store.h"
#include "devlink.h"
#include "log.h"
#include "status.h"
#include "transports/registry.h"
#include "transports/cuda_ipc/cuda_ipc.h"
#include "transports/tcp/tcp.h"

/* The ring neighbours: next and prev, one peer when they are the same
 * rank (a group of two). */
#define MAX_LINKS 2

struct braid_devlinks {
    braid_listener *listener;          /* a TCP listener: no CUDA at creation */
    char addr[BRAID_ADDR_MAX];
    int npeers;
    int peer[MAX_LINKS];
    char peer_addr[MAX_LINKS][BRAID_ADDR_MAX];
    braid_conn *conn[MAX_LINKS];
    int logged[MAX_LINKS];
};

braid_status braid__devlink_listen(braid_pg *pg, const char *want)
{
    if (pg->size == 1 || !braid__transport_devlinks_wanted(want) || pg->transport == braid__cuda_ipc_transport())
        return BRAID_OK;
    /* Not braid__cuda_available(): that loads the driver, which a CPU-only
     * job must never do. A link costs a TCP connection until a device ring
     * uses it; on a machine whose GPUs turn out unusable it settles as
     * unusable then. */
    if (!braid__cuda_device_nodes_present()) {
        BRAID_INFO("rank %d: no cuda_ipc device links: no NVIDIA device nodes (/dev/nvidiactl)", pg->rank);
        return BRAID_OK;
    }
    struct braid_devlinks *d = calloc(1, sizeof(*d));
    if (!d)
        return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: out of memory for device links", pg->rank);
    braid_status st = braid__tcp_ops.listen(&pg->ctx, &d->listener, d->addr);
    if (st != BRAID_OK) {
        free(d);
        return st;
    }
    pg->devlinks = d;
    return BRAID_OK;
}

braid_status braid__devlink_exchange(braid_pg *pg)
{
    if (pg->size == 1)
        return BRAID_OK;
    struct braid_devlinks *d = pg->devlinks;
    char key[64], addr[BRAID_ADDR_MAX];
    size_t len;
    const char *mine = d ? d->addr : "";
    snprintf(key, sizeof(key), "daddr/%d", pg->rank);
    BRAID_CHECK(braid__store_set(pg->store, key, mine, strlen(mine) + 1));
    int next = (pg->rank + 1) % pg->size, prev = (pg->rank + pg->size - 1) % pg->size;
    int peers[2] = {next, prev};
    for (int i = 0; i < (next == prev ? 1 : 2); i++) {
        int p = peers[i];
        snprintf(key, sizeof(key), "daddr/%d", p);
        BRAID_CHECK(braid__store_get(pg->store, key, addr, sizeof(addr), &len, braid__pg_init_wait_ms(pg)));
        if (len == 0 || len > sizeof(addr) || addr[len - 1] != '\0')
            return braid__error(BRAID_ERR_PEER, "rank %d: rank %d published a malformed device link address",
                                pg->rank, p);
        /* Both ends see the same two records: they agree on the pair. */
        if (!d || !addr[0] || pg->host_hash[p] != pg->host_hash[pg->rank])
            continue;
        d->peer[d->npeers] = p;
        memcpy(d->peer_addr[d->npeers], addr, sizeof(addr));
        d->npeers++;
    }
    return BRAID_OK;
}

static braid_status link_one(braid_pg *pg, struct braid_devlinks *d, int i)
{
    int p = d->peer[i];
    braid_conn *tcp;
    if (pg->rank < p) {
        braid_transport_ctx ctx = pg->ctx;
        ctx.nsocks = 1; /* control messages only: the data moves on the GPU */
        BRAID_CHECK(braid__tcp_ops.connect(&ctx, p, d->peer_addr[i], braid__pg_init_wait_ms(pg), &tcp));
    } else {
        BRAID_CHECK(d->listener->ops->accept(d->listener, p, braid__pg_init_wait_ms(pg), &tcp));
    }
    return braid__cuda_ipc_wrap(pg->rank, tcp, &d->conn[i]);
}

braid_status braid__devlink_connect(braid_pg *pg)
{
    struct braid_devlinks *d = pg->devlinks;
    if (!d)
        return BRAID_OK;
    /* Dial upwards first, then accept from below, as for the host links. */
    for (int i = 0; i < d->npeers; i++)
        if (pg->rank < d->peer[i])
            BRAID_CHECK(link_one(pg, d, i));
    for (int i = 0; i < d->npeers; i++)
        if (pg->rank > d->peer[i])
            BRAID_CHECK(link_one(pg, d, i));
    return BRAID_OK;
}

static int find(const struct braid_devlinks *d, int peer)
{
    for (int i = 0; d && i < d->npeers; i++)
        if (d->peer[i] == peer)
            return i;
    return -1;
}

braid_conn *braid__devlink(braid_pg *pg, int peer)
{
    int i = find(pg->devlinks, peer);
    return i < 0 ? NULL : pg->devlinks->conn[i];
}

int braid__devlink_count(const braid_pg *pg)
{
    return pg->devlinks ? pg->devlinks->npeers : 0;
}

braid_status braid__devlink_settle(braid_pg *pg, int peer, int *settled, int *usable)
{
    struct braid_devlinks *d = pg->devlinks;
    int i = find(d, peer);
    if (i < 0 || !d->conn[i])
        return braid__error(BRAID_ERR_INTERNAL, "rank %d: no device link to rank %d", pg->rank, peer);
    BRAID_CHECK(braid__cuda_ipc_settle(d->conn[i], settled, usable));
    if (*settled && !d->logged[i]) {
        d->logged[i] = 1;
        if (*usable)
            BRAID_INFO("rank %d: device all-reduces with rank %d go over cuda_ipc", pg->rank, peer);
        else
            BRAID_INFO("rank %d: device all-reduces with rank %d stay on %s: %s", pg->rank, peer,
                       braid_pg_peer_transport(pg, peer),
                       braid__cuda_ipc_unusable_why(d->conn[i]));
    }
    return BRAID_OK;
}

/* In increasing peer rank on every rank: closing a link waits for its
 * peer to close it too (cuda_ipc frees its ring only then), and that order
 * never has two ranks each waiting for the other's later link. */
void braid__devlink_close(braid_pg *pg, braid_status status)
{
    struct braid_devlinks *d = pg->devlinks;
    for (;;) {
        int next = -1;
        for (int i = 0; d && i < d->npeers; i++)
            if (d->conn[i] && (next < 0 || d->conn[i]->peer < d->conn[next]->peer))
                next = i;
        if (next < 0)
            return;
        if (status != BRAID_OK && d->conn[next]->error == BRAID_OK)
            d->conn[next]->error = status;
        d->conn[next]->ops->close(d->conn[next]);
        d->conn[next] = NULL;
    }
}

void braid__devlink_release(braid_pg *pg)
{
    struct braid_devlinks *d = pg->devlinks;
    if (!d)
        return;
    braid__devlink_close(pg, BRAID_OK);
    if (d->listener)
        d->listener->ops->close_listener(d->listener);
    free(d);
    pg->devlinks = NULL;
}
