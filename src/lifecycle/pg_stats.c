/* braid_pg_stats: the counters the executor keeps per kind of call and per
 * transport (src/lifecycle/work.c), copied out under the group's lock. */
#include <string.h>

#include "pg.h"
#include "status.h"

BRAID_API braid_status braid_pg_stats(const braid_pg *pg, braid_stats *stats)
{
    BRAID_CHECK(braid__pg_check_handle(pg, "braid_pg_stats"));
    if (!stats || stats->size < sizeof(braid_stats))
        return braid__error(BRAID_ERR_INVALID_ARG,
                            "braid_pg_stats: stats is NULL or stats->size (%zu) is not sizeof(braid_stats) (%zu)",
                            stats ? stats->size : 0, sizeof(braid_stats));
    memset((char *)stats + sizeof(stats->size), 0, sizeof(*stats) - sizeof(stats->size));
    int peers[BRAID_TRANSPORT_ID_COUNT] = {0};
    for (int p = 0; p < pg->size; p++)
        if (p != pg->rank && pg->link[p] < BRAID_TRANSPORT_ID_COUNT)
            peers[pg->link[p]]++;
    braid_pg *locked = (braid_pg *)pg; /* the lock, not the group, changes */
    pthread_mutex_lock(&locked->mu);
    for (int k = 0; k < BRAID_COLL_KIND_COUNT && stats->nkinds < BRAID_STATS_MAX_KINDS; k++) {
        const struct braid_kind_counters *c = &pg->kind_stats[k];
        if (!c->calls)
            continue;
        braid_call_stats *out = &stats->kinds[stats->nkinds++];
        out->name = braid__kind(k)->name;
        out->calls = c->calls;
        out->failed = c->failed;
        out->bytes = c->bytes;
        out->total_ns = c->total_ns;
        out->max_ns = c->max_ns;
    }
    for (int id = 0; id < BRAID_TRANSPORT_ID_COUNT && stats->ntransports < BRAID_STATS_MAX_TRANSPORTS; id++) {
        if (!peers[id])
            continue;
        braid_transport_stats *out = &stats->transports[stats->ntransports++];
        const braid_transport_ops *t = braid__transport_get((braid_transport_id)id);
        out->name = t ? t->name : "unknown";
        out->peers = peers[id];
        out->bytes_sent = __atomic_load_n(&pg->sent_by_transport[id], __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&locked->mu);
    return BRAID_OK;
}
