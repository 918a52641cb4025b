/* Process group: create and destroy (stale handles stay detectable), the
 * accessors and the public collective entry points (argument checks, then
 * the executor). Joining is in pg_join.c, the configuration in pg_config.c,
 * connections and the failure state in pg_conn.c. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bootstrap/bootstrap.h"
#include "bootstrap/store.h"
#include "coll_check.h"
#include "device_coll_group.h"
#include "devlink.h"
#include "hmem.h"
#include "log.h"
#include "param.h"
#include "pg.h"
#include "trace.h"
#include "pg_int.h"
#include "pg_shrink.h"
#include "refuse.h"
#include "status.h"
#include "transports/registry.h"

#define STORE_DRAIN_MS 5000 /* longest rank 0 waits at destroy for others to leave its store */

BRAID_API int braid_version(void)
{
    return BRAID_VERSION_MAJOR * 10000 + BRAID_VERSION_MINOR * 100 + BRAID_VERSION_PATCH;
}

static braid_pg *pg_alloc(int rank, int size)
{
    braid_pg *pg = calloc(1, sizeof(*pg));
    if (!pg)
        return NULL;
    pg->rank = rank;
    pg->size = size;
    pg->ctx.rank = rank;
    pg->ctx.size = size;
    pg->wake_fd = -1;
    pg->conns = calloc((size_t)size, sizeof(*pg->conns));
    pg->addr = calloc((size_t)size, sizeof(*pg->addr));
    pg->link = calloc((size_t)size, sizeof(*pg->link));
    pg->host_hash = calloc((size_t)size, sizeof(*pg->host_hash));
    if (!pg->conns || !pg->addr || !pg->link || !pg->host_hash) {
        free(pg->conns);
        free(pg->addr);
        free(pg->link);
        free(pg->host_hash);
        free(pg);
        return NULL;
    }
    atomic_init(&pg->magic, BRAID_PG_MAGIC_LIVE);
    pthread_mutex_init(&pg->mu, NULL);
    braid__work_cond_init(pg);
    atomic_init(&pg->aborted, 0);
    atomic_init(&pg->error, BRAID_OK);
    pg->trace = braid__trace_new();
    return pg;
}

/* Destroyed groups, kept so stale handles stay detectable (pg.h). */
static pthread_mutex_t destroyed_mu = PTHREAD_MUTEX_INITIALIZER;
static braid_pg *destroyed_head;

braid_status braid__pg_check_handle_quiet(const braid_pg *pg)
{
    if (!pg || atomic_load(&((braid_pg *)pg)->magic) != BRAID_PG_MAGIC_LIVE)
        return BRAID_ERR_INVALID_ARG;
    return BRAID_OK;
}

braid_status braid__pg_check_handle(const braid_pg *pg, const char *op)
{
    if (!pg)
        return braid__error(BRAID_ERR_INVALID_ARG, "%s: pg is NULL", op);
    uint64_t magic = atomic_load(&((braid_pg *)pg)->magic);
    if (magic == BRAID_PG_MAGIC_DEAD)
        return braid__error(BRAID_ERR_INVALID_ARG,
                            "%s: process group %p was destroyed by braid_pg_destroy; a destroyed handle must not be "
                            "used", op, (const void *)pg);
    if (magic != BRAID_PG_MAGIC_LIVE)
        return braid__error(BRAID_ERR_INVALID_ARG, "%s: %p is not a process group handle", op, (const void *)pg);
    return BRAID_OK;
}

static void pg_release_members(braid_pg *pg);

/* Init failed before the caller saw the handle: nothing can refer to it. */
static void pg_release(braid_pg *pg)
{
    pg_release_members(pg);
    free(pg);
}

/* braid_pg_destroy: release everything but the struct itself, which is
 * emptied (so a stale call finds no connections, threads or buffers) and
 * kept. About 1 KiB per destroyed group, for the life of the process. */
static void pg_tombstone(braid_pg *pg)
{
    pg_release_members(pg);
    memset((char *)pg + offsetof(braid_pg, rank), 0, sizeof(*pg) - offsetof(braid_pg, rank));
    pg->wake_fd = -1;
    atomic_store(&pg->error, BRAID_ERR_INVALID_ARG);
    atomic_store(&pg->aborted, 1);
    pthread_mutex_lock(&destroyed_mu);
    pg->next_destroyed = destroyed_head;
    destroyed_head = pg;
    pthread_mutex_unlock(&destroyed_mu);
}

static void pg_release_members(braid_pg *pg)
{
    braid__work_stop_thread(pg);
    braid__hmem_pg_release(pg);
    braid__devcoll_release(pg);
    braid__shrink_release(pg);
    braid__group_release(pg);
    braid__devlink_release(pg);
    for (int i = 0; i < pg->size; i++)
        if (pg->conns[i])
            pg->conns[i]->ops->close(pg->conns[i]);
    for (int id = 0; id < BRAID_TRANSPORT_ID_COUNT; id++)
        if (pg->listeners[id])
            pg->listeners[id]->ops->close_listener(pg->listeners[id]);
    /* A joined rank closed its store client at the end of init; rank 0
     * then serves the others until they have too (briefly: they close
     * right after their last answer), instead of cutting one off mid-read.
     * A failed init stops at once, so waiting peers learn of it. */
    int joined = pg->store == NULL;
    if (pg->store)
        braid__store_close(pg->store);
    if (pg->store_server)
        braid__store_server_stop_drained(pg->store_server, joined ? STORE_DRAIN_MS : 0);
    if (pg->wake_fd >= 0)
        close(pg->wake_fd);
    pthread_mutex_destroy(&pg->mu);
    pthread_cond_destroy(&pg->cv);
    free(pg->scratch);
    free(pg->conns);
    free(pg->addr);
    free(pg->link);
    free(pg->host_hash);
    free(pg->hier_topo);
    braid__trace_free(pg->trace);
}

static braid_status pg_init_common(braid_pg **out, int rank, int size, const braid_rendezvous *rv,
                                   const braid_config *cfg)
{
    /* Every bad BRAID_* variable fails every rank here, at once, instead
     * of being ignored with a warning or met later in a transport. */
    BRAID_CHECK(braid__params_check(0));
    braid_pg *pg = pg_alloc(rank, size);
    if (!pg)
        return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: out of memory for a group of %d", rank, size);
    braid__log_set_rank(rank);
    braid__log_build_line(rank);
    braid_status st = braid__pg_join(pg, rv, cfg);
    if (st == BRAID_OK && rv->local_rank >= 0) {
        /* The launcher knows which device slot it gave this process. */
        if (rv->local_rank != pg->local_rank)
            BRAID_INFO("rank %d: launcher local rank %d, position %d of %d among this host's ranks", rank,
                       rv->local_rank, pg->local_rank, pg->local_size);
        pg->local_rank = rv->local_rank;
    }
    if (st != BRAID_OK) {
        char text[512];
        snprintf(text, sizeof(text), "%s", braid_last_error());
        atomic_store(&pg->aborted, 1);
        pg_release(pg);
        braid__error_set_text(text);
        return st;
    }
    braid__error_clear();
    *out = pg;
    return BRAID_OK;
}

braid_status braid__pg_create(braid_pg **pg, int rank, int size, const braid_rendezvous *rv,
                              const braid_config *cfg)
{
    return pg_init_common(pg, rank, size, rv, cfg);
}

BRAID_API braid_status braid_pg_init(braid_pg **pg, int rank, int size, const braid_unique_id_t *id,
                                     const braid_config *cfg)
{
    if (!pg || !id)
        return braid__error(BRAID_ERR_INVALID_ARG, "braid_pg_init: %s is NULL", !pg ? "pg" : "id");
    if (size < 1 || size > BRAID_MAX_RANKS || rank < 0 || rank >= size)
        return braid__error(BRAID_ERR_INVALID_ARG, "braid_pg_init: rank %d / size %d out of range", rank, size);
    braid_rendezvous rv;
    BRAID_CHECK(braid__unique_id_decode(id, &rv));
    return pg_init_common(pg, rank, size, &rv, cfg);
}

BRAID_API braid_status braid_pg_init_env(braid_pg **pg, const braid_config *cfg)
{
    if (!pg)
        return braid__error(BRAID_ERR_INVALID_ARG, "braid_pg_init_env: pg is NULL");
    braid_rendezvous rv;
    int rank, size;
    BRAID_CHECK(braid__params_check(1));
    BRAID_CHECK(braid__env_rendezvous(&rank, &size, &rv));
    return pg_init_common(pg, rank, size, &rv, cfg);
}

/* Only async-signal-safe operations: atomic stores and a write(). */
static void pg_abort_now(braid_pg *pg)
{
    atomic_store(&pg->aborted, 1);
    braid__devcoll_abort(pg);
    int expected = BRAID_OK;
    atomic_compare_exchange_strong(&pg->error, &expected, BRAID_ERR_ABORTED);
    uint64_t one = 1;
    ssize_t w = write(pg->wake_fd, &one, sizeof(one));
    (void)w;
}

BRAID_API braid_status braid_pg_abort(braid_pg *pg)
{
    if (braid__pg_check_handle_quiet(pg) != BRAID_OK)
        return BRAID_ERR_INVALID_ARG; /* no error text: may run in a signal handler */
    pg_abort_now(pg);
    return BRAID_OK;
}

BRAID_API braid_status braid_pg_destroy(braid_pg *pg)
{
    if (!pg)
        return BRAID_OK;
    if (braid__pg_check_handle_quiet(pg) == BRAID_OK)
        braid__devcoll_detach(pg); /* while the group still works: the peers let go of its region */
    /* One destroy wins the magic word; a concurrent second one touches
     * nothing else (not even the wake-up fd, which the winner closes). */
    uint64_t live = BRAID_PG_MAGIC_LIVE;
    if (!atomic_compare_exchange_strong(&pg->magic, &live, BRAID_PG_MAGIC_DEAD))
        return braid__pg_check_handle(pg, "braid_pg_destroy");
    pg_abort_now(pg);
    pg_tombstone(pg);
    return BRAID_OK;
}

BRAID_API int braid_pg_rank(const braid_pg *pg)
{
    return braid__pg_check_handle_quiet(pg) == BRAID_OK ? pg->rank : -1;
}

BRAID_API int braid_pg_size(const braid_pg *pg)
{
    return braid__pg_check_handle_quiet(pg) == BRAID_OK ? pg->size : -1;
}

BRAID_API int braid_pg_local_rank(const braid_pg *pg)
{
    return braid__pg_check_handle_quiet(pg) == BRAID_OK ? pg->local_rank : -1;
}

BRAID_API int braid_pg_local_size(const braid_pg *pg)
{
    return braid__pg_check_handle_quiet(pg) == BRAID_OK ? pg->local_size : -1;
}

BRAID_API const char *braid_pg_peer_transport(const braid_pg *pg, int peer)
{
    if (!pg || peer < 0 || peer >= pg->size)
        return NULL;
    if (peer == pg->rank)
        return "self";
    const braid_transport_ops *t = braid__transport_get((braid_transport_id)pg->link[peer]);
    return t ? t->name : NULL;
}

BRAID_API braid_status braid_pg_error(const braid_pg *pg)
{
    BRAID_CHECK(braid__pg_check_handle(pg, "braid_pg_error"));
    return (braid_status)atomic_load(&pg->error);
}

/* ---- collectives ------------------------------------------------------ */

static braid_status allreduce_checked(braid_pg *pg, const void *send, void *recv, size_t count, braid_dtype dtype,
                                      braid_op op, const braid_mem *mem, void *cuda_stream, braid_work **work)
{
    return braid__allreduce_submit(pg, "allreduce", send, recv, count, dtype, op, NULL, mem, cuda_stream, work);
}

braid_status braid__allreduce_submit(braid_pg *pg, const char *name, const void *send, void *recv, size_t count,
                                     braid_dtype dtype, braid_op op, const void *scalar, const braid_mem *mem,
                                     void *cuda_stream, braid_work **work)
{
    braid_coll c = {.kind = BRAID_COLL_ALLREDUCE, .send = send, .recv = recv, .count = count, .dtype = dtype,
                    .op = op, .root = -1};
    BRAID_CHECK(braid__check_call(pg, name, &c, scalar));
    braid__coll_classify(&c, mem);
    braid__mulsum_arm(&c, scalar);
    return braid__hmem_submit(pg, &c, cuda_stream, work); /* host memory: braid__work_submit */
}

static braid_status broadcast_checked(braid_pg *pg, void *buf, size_t count, braid_dtype dtype, int root,
                                      const braid_mem *mem, void *cuda_stream, braid_work **work)
{
    braid_coll c = {.kind = BRAID_COLL_BROADCAST, .send = buf, .recv = buf, .count = count, .dtype = dtype,
                    .op = BRAID_SUM, .root = root};
    BRAID_CHECK(braid__check_call(pg, "broadcast", &c, NULL));
    braid__coll_classify(&c, mem);
    return braid__hmem_submit(pg, &c, cuda_stream, work); /* host memory: braid__work_submit */
}

/* A call its checks refuse is refused to the peers as well (refuse.h). */
braid_status braid__allreduce_classified(braid_pg *pg, const void *send, void *recv, size_t count, braid_dtype dtype,
                                         braid_op op, const braid_mem *mem, void *cuda_stream, braid_work **work)
{
    braid_status st = allreduce_checked(pg, send, recv, count, dtype, op, mem, cuda_stream, work);
    braid_coll c = {.kind = BRAID_COLL_ALLREDUCE, .send = send, .recv = recv, .count = count, .dtype = dtype,
                    .op = op, .root = -1};
    return st == BRAID_ERR_INVALID_ARG ? braid__coll_refuse(pg, &c, st) : st;
}

braid_status braid__broadcast_classified(braid_pg *pg, void *buf, size_t count, braid_dtype dtype, int root,
                                         const braid_mem *mem, void *cuda_stream, braid_work **work)
{
    braid_status st = broadcast_checked(pg, buf, count, dtype, root, mem, cuda_stream, work);
    braid_coll c = {.kind = BRAID_COLL_BROADCAST, .send = buf, .recv = buf, .count = count, .dtype = dtype,
                    .op = BRAID_SUM, .root = root};
    return st == BRAID_ERR_INVALID_ARG ? braid__coll_refuse(pg, &c, st) : st;
}

braid_status braid__broadcast_from(braid_pg *pg, const void *send, void *recv, size_t count, braid_dtype dtype,
                                   int root, void *cuda_stream)
{
    braid_coll c = {.kind = BRAID_COLL_BROADCAST, .send = recv, .recv = recv, .count = count, .dtype = dtype,
                    .op = BRAID_SUM, .root = root};
    braid_status st = braid__check_call(pg, "broadcast", &c, NULL);
    if (st == BRAID_OK && pg->rank == root && count > 0 && !send)
        st = braid__error(BRAID_ERR_INVALID_ARG, "rank %d: broadcast: send is NULL with count %zu", pg->rank, count);
    if (st != BRAID_OK)
        return st == BRAID_ERR_INVALID_ARG ? braid__coll_refuse(pg, &c, st) : st;
    if (!braid__group_open_here(pg))
        return braid__error(BRAID_ERR_INTERNAL, "rank %d: broadcast from a separate input outside a group", pg->rank);
    if (pg->rank == root)
        c.send = send;
    braid__coll_classify(&c, NULL);
    return braid__hmem_submit(pg, &c, cuda_stream, NULL);
}

BRAID_API braid_status braid_allreduce(braid_pg *pg, const void *send, void *recv, size_t count, braid_dtype dtype,
                                       braid_op op, void *cuda_stream, braid_work **work)
{
    return braid__allreduce_classified(pg, send, recv, count, dtype, op, NULL, cuda_stream, work);
}

BRAID_API braid_status braid_broadcast(braid_pg *pg, void *buf, size_t count, braid_dtype dtype, int root,
                                       void *cuda_stream, braid_work **work)
{
    return braid__broadcast_classified(pg, buf, count, dtype, root, NULL, cuda_stream, work);
}
