/* Process group: rendezvous, connections, failure state and the public
 * collective entry points (argument checks, then the executor). */
#include <inttypes.h>
#include <stddef.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "bootstrap/auth.h"
#include "bootstrap/bootstrap.h"
#include "bootstrap/sock.h"
#include "bootstrap/store.h"
#include "log.h"
#include "param.h"
#include "pg.h"
#include "pg_rendezvous.h"
#include "pg_shrink.h"
#include "refuse.h"
#include "status.h"
#include "transport.h"
#include "hmem.h"
#include "coll_check.h"
#include "checksum.h"
#include "devlink.h"

#define DEFAULT_TIMEOUT_MS 300000
/* torch's default process-group timeout (default_pg_timeout, 30 min),
 * which its rendezvous also waits: a job that torch would start, braid does. */
#define DEFAULT_INIT_TIMEOUT_MS 1800000
#define AUTO_NSOCKS 0 /* the transport picks per peer */
#define STORE_DRAIN_MS 5000 /* longest rank 0 waits at destroy for others to leave its store */
#define DEFAULT_CHUNK_BYTES (512 * 1024)
#define EAGER_MESH_MAX 64

BRAID_API size_t braid_dtype_size(braid_dtype dtype)
{
    static const size_t sizes[BRAID_DTYPE_COUNT] = {
        [BRAID_F32] = 4, [BRAID_F64] = 8, [BRAID_F16] = 2, [BRAID_BF16] = 2,
        [BRAID_I8] = 1,  [BRAID_U8] = 1,  [BRAID_I32] = 4, [BRAID_I64] = 8,
        [BRAID_U32] = 4, [BRAID_U64] = 8,
    };
    return (unsigned)dtype < BRAID_DTYPE_COUNT ? sizes[dtype] : 0;
}

BRAID_API int braid_version(void)
{
    return BRAID_VERSION_MAJOR * 10000 + BRAID_VERSION_MINOR * 100 + BRAID_VERSION_PATCH;
}

static braid_algo parse_algo(const char *s)
{
    if (!s || !strcasecmp(s, "auto"))
        return BRAID_ALGO_AUTO;
    if (!strcasecmp(s, "ring"))
        return BRAID_ALGO_RING;
    if (!strcasecmp(s, "rd") || !strcasecmp(s, "recursive_doubling"))
        return BRAID_ALGO_RECURSIVE_DOUBLING;
    if (!strcasecmp(s, "hier") || !strcasecmp(s, "hierarchical"))
        return BRAID_ALGO_HIER;
    BRAID_WARN("ignoring BRAID_ALGO=%s (expected auto, ring, rd or hier)", s);
    return BRAID_ALGO_AUTO;
}

/* Config fields win over the environment, which wins over defaults. */
static braid_status apply_config(braid_pg *pg, const braid_config *cfg)
{
    braid_config c = BRAID_CONFIG_INIT;
    if (cfg) {
        if (cfg->size < offsetof(braid_config, timeout_ms) + sizeof(int) || cfg->size > sizeof(braid_config) * 4)
            return braid__error(BRAID_ERR_INVALID_ARG, "braid_config.size %zu is invalid: use BRAID_CONFIG_INIT",
                                cfg->size);
        memcpy(&c, cfg, cfg->size < sizeof(c) ? cfg->size : sizeof(c));
    }
    /* 0 means "not set"; a negative value is a mistake, not a default. */
    if (c.timeout_ms < 0)
        return braid__error(BRAID_ERR_INVALID_ARG, "braid_config.timeout_ms %d is negative (0: BRAID_TIMEOUT_MS or "
                            "the default)", c.timeout_ms);
    if (c.nsocks < 0 || c.nsocks > 16)
        return braid__error(BRAID_ERR_INVALID_ARG, "braid_config.nsocks %d out of range [1, 16] (0: automatic)",
                            c.nsocks);
    if (c.checksum < -1 || c.checksum > 1)
        return braid__error(BRAID_ERR_INVALID_ARG, "braid_config.checksum %d is invalid (1 on, -1 off, 0: "
                            "BRAID_CHECKSUM)", c.checksum);
    long long timeout = c.timeout_ms > 0 ? c.timeout_ms : braid__param_int("BRAID_TIMEOUT_MS", DEFAULT_TIMEOUT_MS);
    long long nsocks = c.nsocks > 0 ? c.nsocks : braid__param_int("BRAID_NSOCKS", AUTO_NSOCKS);
    long long chunk = c.chunk_bytes > 0 ? (long long)c.chunk_bytes
                                        : braid__param_int("BRAID_CHUNK_BYTES", DEFAULT_CHUNK_BYTES);
    int has_init_field = c.size >= offsetof(braid_config, init_timeout_ms) + sizeof(int);
    if (has_init_field && c.init_timeout_ms < 0)
        return braid__error(BRAID_ERR_INVALID_ARG, "braid_config.init_timeout_ms %d is negative (0: "
                            "BRAID_INIT_TIMEOUT_MS or the default)", c.init_timeout_ms);
    int has_init = has_init_field && c.init_timeout_ms > 0;
    long long init_timeout = has_init ? c.init_timeout_ms
                                      : braid__param_int("BRAID_INIT_TIMEOUT_MS", DEFAULT_INIT_TIMEOUT_MS);
    if (timeout <= 0 || timeout > 24LL * 3600 * 1000)
        return braid__error(BRAID_ERR_INVALID_ARG, "timeout %lld ms out of range", timeout);
    if (init_timeout <= 0 || init_timeout > 24LL * 3600 * 1000)
        return braid__error(BRAID_ERR_INVALID_ARG, "init timeout %lld ms out of range (1 ms to 24 h)", init_timeout);
    if (nsocks < 0 || nsocks > 16)
        return braid__error(BRAID_ERR_INVALID_ARG, "nsocks %lld out of range [1, 16] (0: automatic)", nsocks);
    if (chunk < 4096 || chunk > (1LL << 30))
        return braid__error(BRAID_ERR_INVALID_ARG, "chunk size %lld out of range [4096, 1 GiB]", chunk);
    if ((unsigned)c.algo >= BRAID_ALGO_COUNT)
        return braid__error(BRAID_ERR_INVALID_ARG, "braid_config.algo %d is invalid", (int)c.algo);
    pg->timeout_ms = (int)timeout;
    pg->init_timeout_ms = (int)init_timeout;
    pg->ctx.timeout_ms = (int)timeout;
    pg->ctx.nsocks = (int)nsocks;
    pg->chunk_bytes = (size_t)chunk & ~(size_t)63; /* whole cache lines: vector-friendly chunk edges */
    pg->algo = c.algo != BRAID_ALGO_AUTO ? c.algo : parse_algo(braid__param_str("BRAID_ALGO"));
    pg->checksum = c.checksum != 0 ? c.checksum > 0 : braid__param_bool("BRAID_CHECKSUM", 0);
    return BRAID_OK;
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
    pg->peer_addr = calloc((size_t)size, sizeof(*pg->peer_addr));
    pg->local_addr = calloc((size_t)size, sizeof(*pg->local_addr));
    pg->host_hash = calloc((size_t)size, sizeof(*pg->host_hash));
    if (!pg->conns || !pg->peer_addr || !pg->local_addr || !pg->host_hash) {
        free(pg->conns);
        free(pg->peer_addr);
        free(pg->local_addr);
        free(pg->host_hash);
        free(pg);
        return NULL;
    }
    atomic_init(&pg->magic, BRAID_PG_MAGIC_LIVE);
    pthread_mutex_init(&pg->mu, NULL);
    braid__work_cond_init(pg);
    atomic_init(&pg->aborted, 0);
    atomic_init(&pg->error, BRAID_OK);
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
    braid__shrink_release(pg);
    braid__group_release(pg);
    braid__devlink_release(pg);
    for (int i = 0; i < pg->size; i++)
        if (pg->conns[i])
            pg->conns[i]->ops->close(pg->conns[i]);
    if (pg->local_listener)
        pg->local_listener->ops->close_listener(pg->local_listener);
    if (pg->listener)
        pg->listener->ops->close_listener(pg->listener);
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
    free(pg->peer_addr);
    free(pg->local_addr);
    free(pg->host_hash);
    free(pg->hier_topo);
}

/* Every rank arrives before any leaves: rank 0's store must outlive the
 * other ranks' address look-ups. */
static braid_status store_barrier(braid_pg *pg, const char *name)
{
    char key[64];
    int64_t arrived;
    snprintf(key, sizeof(key), "%s/count", name);
    BRAID_CHECK(braid__store_add(pg->store, key, 1, &arrived));
    snprintf(key, sizeof(key), "%s/done", name);
    if (arrived == pg->size)
        BRAID_CHECK(braid__store_set(pg->store, key, "1", 1));
    char v[4];
    size_t len;
    return braid__store_get(pg->store, key, v, sizeof(v), &len, pg->timeout_ms);
}

static braid_status exchange_addresses(braid_pg *pg)
{
    char key[64];
    snprintf(key, sizeof(key), "addr/%d", pg->rank);
    BRAID_CHECK(braid__store_set(pg->store, key, pg->peer_addr[pg->rank], strlen(pg->peer_addr[pg->rank]) + 1));
    for (int i = 0; i < pg->size; i++) {
        if (i == pg->rank)
            continue;
        size_t len;
        snprintf(key, sizeof(key), "addr/%d", i);
        BRAID_CHECK(braid__store_get(pg->store, key, pg->peer_addr[i], BRAID_ADDR_MAX, &len, pg->timeout_ms));
        if (len == 0 || len > BRAID_ADDR_MAX || pg->peer_addr[i][len - 1] != '\0')
            return braid__error(BRAID_ERR_PEER, "rank %d: rank %d published a malformed address", pg->rank, i);
    }
    return BRAID_OK;
}

/* Where this process runs, as far as shared memory cares: host name, boot
 * (a rebooted or cloned machine differs) and network namespace (abstract
 * Unix sockets are per namespace). */
static void host_identity(char *buf, size_t cap)
{
    const char *forced = braid__param_str("BRAID_HOST_ID");
    if (forced) {
        snprintf(buf, cap, "id:%s", forced);
        return;
    }
    char host[256] = "", boot[64] = "", netns[64] = "";
    if (gethostname(host, sizeof(host) - 1) != 0)
        host[0] = '\0';
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof(boot), f))
            boot[0] = '\0';
        fclose(f);
        boot[strcspn(boot, "\n")] = '\0';
    }
    ssize_t n = readlink("/proc/self/ns/net", netns, sizeof(netns) - 1);
    netns[n > 0 ? n : 0] = '\0';
    snprintf(buf, cap, "%s|%s|%s", host, boot, netns);
}

/* FNV-1a of a host identity: ranks with equal hashes form one host for the
 * hierarchical all-reduce (a collision would only cost speed, never
 * results: that algorithm is exact for any grouping). */
static uint64_t host_hash(const char *id)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *id; id++)
        h = (h ^ (uint8_t)*id) * 0x100000001b3ull;
    return h;
}

/* Publish this rank's host identity and same-host address ("" without a
 * local transport); a pair uses the local transport when both ends
 * published an address from one host, so both decide alike. */
static braid_status exchange_local(braid_pg *pg)
{
    char key[64], me[512], other[512];
    size_t len;
    host_identity(me, sizeof(me));
    pg->host_hash[pg->rank] = host_hash(me);
    pg->local_rank = 0;
    pg->local_size = 1;
    snprintf(key, sizeof(key), "host/%d", pg->rank);
    BRAID_CHECK(braid__store_set(pg->store, key, me, strlen(me) + 1));
    snprintf(key, sizeof(key), "laddr/%d", pg->rank);
    BRAID_CHECK(braid__store_set(pg->store, key, pg->local_addr[pg->rank], strlen(pg->local_addr[pg->rank]) + 1));
    for (int i = 0; i < pg->size; i++) {
        if (i == pg->rank)
            continue;
        snprintf(key, sizeof(key), "host/%d", i);
        BRAID_CHECK(braid__store_get(pg->store, key, other, sizeof(other), &len, pg->timeout_ms));
        if (len == 0 || len > sizeof(other) || other[len - 1] != '\0')
            return braid__error(BRAID_ERR_PEER, "rank %d: rank %d published a malformed host identity", pg->rank, i);
        pg->host_hash[i] = host_hash(other);
        if (strcmp(me, other) == 0) {
            pg->local_size++;
            pg->local_rank += i < pg->rank;
        }
        snprintf(key, sizeof(key), "laddr/%d", i);
        BRAID_CHECK(braid__store_get(pg->store, key, pg->local_addr[i], BRAID_ADDR_MAX, &len, pg->timeout_ms));
        if (len == 0 || len > BRAID_ADDR_MAX || pg->local_addr[i][len - 1] != '\0')
            return braid__error(BRAID_ERR_PEER, "rank %d: rank %d published a malformed address", pg->rank, i);
        if (!pg->local_transport || strcmp(me, other) != 0)
            pg->local_addr[i][0] = '\0';
    }
    return BRAID_OK;
}

/* A tag shared by the group's members, so connections of another group
 * with the same secret (an earlier incarnation, a shrunk group) are told
 * apart. Rank 0 draws it. */
static braid_status agree_tag(braid_pg *pg)
{
    uint64_t tag;
    size_t len;
    if (pg->rank == 0) {
        BRAID_CHECK(braid__random_bytes(&tag, sizeof(tag)));
        BRAID_CHECK(braid__store_set(pg->store, "pg_tag", &tag, sizeof(tag)));
    }
    BRAID_CHECK(braid__store_get(pg->store, "pg_tag", &tag, sizeof(tag), &len, pg->timeout_ms));
    if (len != sizeof(tag))
        return braid__error(BRAID_ERR_PEER, "rank %d: malformed group tag in the store", pg->rank);
    pg->ctx.pg_tag = tag;
    return BRAID_OK;
}

/* The group's transport. Ranks vote on the transports used only when every
 * rank can (verbs): each publishes its probe verdicts and reads everyone's,
 * so all take verbs or all fall back, and rank 0 logs why
 * (docs/TRANSPORTS.md). A single rank has nobody to agree with. */
static braid_status select_transport(braid_pg *pg, const char *want)
{
    if (pg->size == 1 || !braid__transport_agreement_needed())
        return braid__transport_select(want, pg->rank, NULL, &pg->transport);
    braid_transport_tally *tally = malloc(sizeof(*tally));
    char *vote = malloc(BRAID_TRANSPORT_VOTE_MAX);
    braid_status st = BRAID_OK;
    if (!tally || !vote) {
        st = braid__error(BRAID_ERR_NO_MEMORY, "rank %d: out of memory for the transport vote", pg->rank);
        goto out;
    }
    char key[64];
    size_t len;
    braid__transport_tally_init(tally);
    braid__transport_vote(want, vote, BRAID_TRANSPORT_VOTE_MAX);
    braid__transport_tally_add(tally, pg->rank, vote);
    snprintf(key, sizeof(key), "tvote/%d", pg->rank);
    BRAID_CHECK_GOTO(braid__store_set(pg->store, key, vote, strlen(vote) + 1), st, out);
    for (int i = 0; i < pg->size; i++) {
        if (i == pg->rank)
            continue;
        snprintf(key, sizeof(key), "tvote/%d", i);
        BRAID_CHECK_GOTO(braid__store_get(pg->store, key, vote, BRAID_TRANSPORT_VOTE_MAX, &len, pg->timeout_ms), st,
                         out);
        if (len == 0 || len > BRAID_TRANSPORT_VOTE_MAX || vote[len - 1] != '\0') {
            st = braid__error(BRAID_ERR_PEER, "rank %d: rank %d published a malformed transport vote", pg->rank, i);
            goto out;
        }
        braid__transport_tally_add(tally, i, vote);
    }
    st = braid__transport_select(want, pg->rank, tally, &pg->transport);
    if (st != BRAID_OK) {
        /* Every rank fails alike; rank 0's store must outlive the others'
         * reads of the votes. */
        char text[512];
        snprintf(text, sizeof(text), "%s", braid_last_error());
        (void)store_barrier(pg, "tvote");
        braid__error_set_text(text);
    }
out:
    free(vote);
    free(tally);
    return st;
}

static braid_status pg_join(braid_pg *pg, const braid_rendezvous *rv, const braid_config *cfg)
{
    BRAID_CHECK(apply_config(pg, cfg));
    braid__hmem_pg_prepare(pg); /* before any rank of the group can hold a stream */
    memcpy(pg->ctx.secret, rv->secret, sizeof(pg->ctx.secret));
    pg->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (pg->wake_fd < 0)
        return braid__error(BRAID_ERR_SYSTEM, "rank %d: eventfd: %m", pg->rank);

    BRAID_CHECK(braid__pg_rendezvous(pg, rv));
    BRAID_CHECK(agree_tag(pg));
    BRAID_CHECK(braid__checksum_announce(pg->store, pg->checksum)); /* before our address: see below */

    const char *ifname = cfg && cfg->size > offsetof(braid_config, socket_ifname) && cfg->socket_ifname
                             ? cfg->socket_ifname
                             : braid__param_str("BRAID_SOCKET_IFNAME");
    if (ifname)
        BRAID_CHECK(braid__sock_ifname_ip(ifname, pg->ctx.bind_ip, sizeof(pg->ctx.bind_ip)));
    else
        BRAID_CHECK(braid__store_local_ip(pg->store, pg->ctx.bind_ip, sizeof(pg->ctx.bind_ip)));

    const char *want = cfg && cfg->size > offsetof(braid_config, transports) && cfg->transports
                           ? cfg->transports
                           : braid__param_str("BRAID_TRANSPORT");
    BRAID_CHECK(select_transport(pg, want));
    BRAID_CHECK(pg->transport->listen(&pg->ctx, &pg->listener, pg->peer_addr[pg->rank]));
    pg->local_transport = pg->size > 1 ? braid__transport_select_local(want, pg->rank) : NULL;
    if (pg->local_transport &&
        pg->local_transport->listen(&pg->ctx, &pg->local_listener, pg->local_addr[pg->rank]) != BRAID_OK) {
        BRAID_INFO("rank %d: no %s for same-host peers: %s", pg->rank, pg->local_transport->name, braid_last_error());
        pg->local_transport = NULL;
        pg->local_listener = NULL;
        pg->local_addr[pg->rank][0] = '\0';
    }
    BRAID_CHECK(braid__devlink_listen(pg, want));
    BRAID_CHECK(exchange_addresses(pg));
    /* Every rank announced its checksum setting before its address, so all
     * are counted now; read before the barrier, which rank 0's store
     * outlives, and judged after it, so every rank fails alike. */
    int64_t checksum_ranks;
    BRAID_CHECK(braid__checksum_count(pg->store, &checksum_ranks));
    BRAID_CHECK(exchange_local(pg));
    BRAID_CHECK(braid__devlink_exchange(pg));
    BRAID_CHECK(braid__shrink_prepare(pg, cfg));
    BRAID_CHECK(store_barrier(pg, "init"));
    BRAID_CHECK(braid__checksum_agree(pg->store, pg->rank, pg->size, pg->checksum, checksum_ranks, pg->timeout_ms));
    /* That was the last store call: nothing later needs the store. */
    braid__store_close(pg->store);
    pg->store = NULL;

    /* Connect every peer now (ring neighbours first) for groups up to
     * EAGER_MESH_MAX: no collective pays set-up, and a failing rank's closed
     * sockets reach every peer, whatever algorithm it is blocked in. */
    braid_conn *c;
    if (pg->size > 1) {
        BRAID_CHECK(braid__pg_conn(pg, (pg->rank + 1) % pg->size, &c));
        BRAID_CHECK(braid__pg_conn(pg, (pg->rank + pg->size - 1) % pg->size, &c));
    }
    if (pg->size <= EAGER_MESH_MAX) {
        /* Dial upwards first, then accept from below: every accept is
         * matched by a peer that has finished its own dials or is dialling. */
        for (int p = pg->rank + 1; p < pg->size; p++)
            BRAID_CHECK(braid__pg_conn(pg, p, &c));
        for (int p = 0; p < pg->rank; p++)
            BRAID_CHECK(braid__pg_conn(pg, p, &c));
    }
    BRAID_CHECK(braid__devlink_connect(pg));
    BRAID_CHECK(braid__work_start_thread(pg));
    int nlocal = 0;
    for (int p = 0; p < pg->size; p++)
        nlocal += p != pg->rank && pg->local_addr[p][0] != '\0';
    char socks[16] = "auto";
    if (pg->ctx.nsocks > 0)
        snprintf(socks, sizeof(socks), "%d", pg->ctx.nsocks);
    BRAID_INFO("rank %d of %d joined via %s:%d, transport %s, listening on %s, %s sockets/peer, chunk %zu, "
               "%s for %d same-host peers, %d cuda_ipc device links",
               pg->rank, pg->size, rv->host, rv->port, pg->transport->name, pg->peer_addr[pg->rank], socks,
               pg->chunk_bytes, pg->local_transport ? pg->local_transport->name : "none", nlocal,
               braid__devlink_count(pg));
    return BRAID_OK;
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
    braid_status st = pg_join(pg, rv, cfg);
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
    /* exchange_local left a same-host address only where both ends use the
     * local transport. */
    if (pg->local_transport && pg->local_addr[peer][0] != '\0')
        return pg->local_transport->name;
    return pg->transport->name;
}

BRAID_API braid_status braid_pg_error(const braid_pg *pg)
{
    BRAID_CHECK(braid__pg_check_handle(pg, "braid_pg_error"));
    return (braid_status)atomic_load(&pg->error);
}

braid_status braid__pg_conn(braid_pg *pg, int peer, braid_conn **conn)
{
    if (pg->conns[peer]) {
        *conn = pg->conns[peer];
        return BRAID_OK;
    }
    /* The lower rank dials; the higher one takes it from its listener,
     * whose accept thread has already authenticated it. */
    braid_conn *c;
    int local = pg->local_addr[peer][0] != '\0';
    const braid_transport_ops *t = local ? pg->local_transport : pg->transport;
    braid_listener *l = local ? pg->local_listener : pg->listener;
    if (pg->rank < peer)
        BRAID_CHECK(t->connect(&pg->ctx, peer, local ? pg->local_addr[peer] : pg->peer_addr[peer], pg->timeout_ms, &c));
    else
        BRAID_CHECK(l->ops->accept(l, peer, pg->timeout_ms, &c));
    if (pg->checksum) {
        braid_status st = braid__checksum_wrap(pg->rank, &c);
        if (st != BRAID_OK) {
            c->ops->close(c);
            return st;
        }
    }
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
            pg->conns[i]->ops->close(pg->conns[i]);
            pg->conns[i] = NULL;
        }
    }
    braid__devlink_close(pg);
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

/* ---- collectives ------------------------------------------------------ */

static braid_status check_buffer_args(braid_pg *pg, const char *op, const void *a, const void *b, size_t count,
                                      braid_dtype dtype)
{
    BRAID_CHECK(braid__pg_check_handle(pg, op));
    size_t esize = braid_dtype_size(dtype);
    if (esize == 0)
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: %s: invalid dtype %d", pg->rank, op, (int)dtype);
    if (count > SIZE_MAX / esize / 2)
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: %s: count %zu overflows", pg->rank, op, count);
    if (count > 0 && (!a || !b))
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: %s: %s is NULL with count %zu", pg->rank, op,
                            a == b ? "buf" : !a ? "send" : "recv", count);
    return BRAID_OK;
}

static braid_status allreduce_checked(braid_pg *pg, const void *send, void *recv, size_t count, braid_dtype dtype,
                                      braid_op op, void *cuda_stream, braid_work **work)
{
    return braid__allreduce_submit(pg, "allreduce", send, recv, count, dtype, op, NULL, cuda_stream, work);
}

braid_status braid__allreduce_submit(braid_pg *pg, const char *name, const void *send, void *recv, size_t count,
                                     braid_dtype dtype, braid_op op, const void *scalar, void *cuda_stream,
                                     braid_work **work)
{
    BRAID_CHECK(check_buffer_args(pg, name, send, recv, count, dtype));
    BRAID_CHECK(braid__check_op(pg, name, op, scalar));
    size_t bytes = count * braid_dtype_size(dtype);
    if (send != recv && count > 0 &&
        (const char *)send < (const char *)recv + bytes && (const char *)recv < (const char *)send + bytes)
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: %s: send and recv overlap without being equal",
                            pg->rank, name);
    braid_coll c = {.kind = BRAID_COLL_ALLREDUCE, .send = send, .recv = recv, .count = count, .dtype = dtype,
                    .op = op, .root = -1};
    braid__mulsum_arm(&c, scalar);
    return braid__hmem_submit(pg, &c, cuda_stream, work); /* host memory: braid__work_submit */
}

static braid_status broadcast_checked(braid_pg *pg, void *buf, size_t count, braid_dtype dtype, int root,
                                      void *cuda_stream, braid_work **work)
{
    BRAID_CHECK(check_buffer_args(pg, "broadcast", buf, buf, count, dtype));
    if (root < 0 || root >= pg->size)
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: broadcast: root %d out of range [0, %d)", pg->rank, root,
                            pg->size);
    braid_coll c = {.kind = BRAID_COLL_BROADCAST, .send = buf, .recv = buf, .count = count, .dtype = dtype,
                    .op = BRAID_SUM, .root = root};
    return braid__hmem_submit(pg, &c, cuda_stream, work); /* host memory: braid__work_submit */
}

/* A call its checks refuse is refused to the peers as well (refuse.h). */
BRAID_API braid_status braid_allreduce(braid_pg *pg, const void *send, void *recv, size_t count, braid_dtype dtype,
                                       braid_op op, void *cuda_stream, braid_work **work)
{
    braid_status st = allreduce_checked(pg, send, recv, count, dtype, op, cuda_stream, work);
    braid_coll c = {.kind = BRAID_COLL_ALLREDUCE, .send = send, .recv = recv, .count = count, .dtype = dtype,
                    .op = op, .root = -1};
    return st == BRAID_ERR_INVALID_ARG ? braid__coll_refuse(pg, &c, st) : st;
}

BRAID_API braid_status braid_broadcast(braid_pg *pg, void *buf, size_t count, braid_dtype dtype, int root,
                                       void *cuda_stream, braid_work **work)
{
    braid_status st = broadcast_checked(pg, buf, count, dtype, root, cuda_stream, work);
    braid_coll c = {.kind = BRAID_COLL_BROADCAST, .send = buf, .recv = buf, .count = count, .dtype = dtype,
                    .op = BRAID_SUM, .root = root};
    return st == BRAID_ERR_INVALID_ARG ? braid__coll_refuse(pg, &c, st) : st;
}
