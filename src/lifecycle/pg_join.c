/* Joining a process group: rendezvous, the group tag, the transport vote,
 * address and host exchange through the store, then the eager connections. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "bootstrap/auth.h"
#include "bootstrap/sock.h"
#include "bootstrap/store.h"
#include "transports/checksum/checksum.h"
#include "transports/tcp/tcp_conn.h"
#include "device_coll_group.h"
#include "clock.h"
#include "devlink.h"
#include "fault_inject.h"
#include "hmem.h"
#include "log.h"
#include "param.h"
#include "pg.h"
#include "pg_int.h"
#include "pg_rendezvous.h"
#include "pg_shrink.h"
#include "status.h"
#include "transports/registry.h"

#define EAGER_MESH_MAX 64

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
    return braid__store_get(pg->store, key, v, sizeof(v), &len, braid__pg_init_wait_ms(pg));
}

/* Every rank's addresses, one record per rank with a slot per transport
 * id ("" where it does not listen). */
static braid_status exchange_addresses(braid_pg *pg)
{
    char key[64];
    snprintf(key, sizeof(key), "addr/%d", pg->rank);
    BRAID_CHECK(braid__store_set(pg->store, key, pg->addr[pg->rank], sizeof(pg->addr[pg->rank])));
    for (int i = 0; i < pg->size; i++) {
        if (i == pg->rank)
            continue;
        size_t len;
        snprintf(key, sizeof(key), "addr/%d", i);
        BRAID_CHECK(braid__store_get(pg->store, key, pg->addr[i], sizeof(pg->addr[i]), &len, braid__pg_init_wait_ms(pg)));
        int ok = len == sizeof(pg->addr[i]);
        for (int id = 0; ok && id < BRAID_TRANSPORT_ID_COUNT; id++)
            ok = memchr(pg->addr[i][id], '\0', BRAID_ADDR_MAX) != NULL;
        if (!ok)
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

/* Publish this rank's host identity and read everyone's: ranks of one
 * host (exact identity) count towards local_rank and local_size, and are
 * told to the transports as same-host pairs. Then each peer's transport,
 * chosen alike at both ends from what both published. */
static braid_status exchange_hosts(braid_pg *pg)
{
    char key[64], me[512], other[512];
    size_t len;
    host_identity(me, sizeof(me));
    pg->host_hash[pg->rank] = host_hash(me);
    pg->local_rank = 0;
    pg->local_size = 1;
    snprintf(key, sizeof(key), "host/%d", pg->rank);
    BRAID_CHECK(braid__store_set(pg->store, key, me, strlen(me) + 1));
    braid_peer_info mine = {.rank = pg->rank, .host_hash = pg->host_hash[pg->rank], .same_host = 1};
    int group_id = braid__transport_id_of(pg->transport);
    for (int i = 0; i < pg->size; i++) {
        if (i == pg->rank)
            continue;
        snprintf(key, sizeof(key), "host/%d", i);
        BRAID_CHECK(braid__store_get(pg->store, key, other, sizeof(other), &len, braid__pg_init_wait_ms(pg)));
        if (len == 0 || len > sizeof(other) || other[len - 1] != '\0')
            return braid__error(BRAID_ERR_PEER, "rank %d: rank %d published a malformed host identity", pg->rank, i);
        pg->host_hash[i] = host_hash(other);
        int same = strcmp(me, other) == 0;
        if (same) {
            pg->local_size++;
            pg->local_rank += i < pg->rank;
        }
        braid_peer_info peer = {.rank = i, .host_hash = pg->host_hash[i], .same_host = same};
        pg->link[i] = (unsigned char)braid__transport_for_peer(pg->listeners, pg->addr[i], group_id, &mine, &peer);
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
    BRAID_CHECK(braid__store_get(pg->store, "pg_tag", &tag, sizeof(tag), &len, braid__pg_init_wait_ms(pg)));
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
        BRAID_CHECK_GOTO(braid__store_get(pg->store, key, vote, BRAID_TRANSPORT_VOTE_MAX, &len, braid__pg_init_wait_ms(pg)), st,
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

/* Listen on the group's transport, and on one that serves same-host
 * pairs beside it where want allows (braid__transport_select_local); that
 * one failing only leaves its pairs to the group's transport. */
static braid_status listen_all(braid_pg *pg, const char *want)
{
    int id = braid__transport_id_of(pg->transport);
    BRAID_CHECK(pg->transport->listen(&pg->ctx, &pg->listeners[id], pg->addr[pg->rank][id]));
    const braid_transport_ops *local = pg->size > 1 ? braid__transport_select_local(want, pg->rank) : NULL;
    if (!local)
        return BRAID_OK;
    id = braid__transport_id_of(local);
    if (local->listen(&pg->ctx, &pg->listeners[id], pg->addr[pg->rank][id]) != BRAID_OK) {
        BRAID_INFO("rank %d: no %s for same-host peers: %s", pg->rank, local->name, braid_last_error());
        pg->listeners[id] = NULL;
        pg->addr[pg->rank][id][0] = '\0';
    }
    return BRAID_OK;
}

/* Everything of the start after every rank reached the store. */
static braid_status form_group(braid_pg *pg, const braid_rendezvous *rv, const braid_config *cfg)
{
    braid__fault_exit_in_init("joined");
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
    /* The environment's list was checked with every variable; a config's
     * list is checked here, against the same names. */
    long long unused;
    if (want && braid__param_parse(braid__param_find("BRAID_TRANSPORT"), want, &unused) != BRAID_OK)
        return braid__error(BRAID_ERR_INVALID_ARG, "rank %d: transports: %s", pg->rank, braid__error_detail());
    BRAID_CHECK(select_transport(pg, want));
    BRAID_CHECK(listen_all(pg, want));
    BRAID_CHECK(braid__devlink_listen(pg, want));
    BRAID_CHECK(exchange_addresses(pg));
    /* Every rank announced its checksum setting before its address, so all
     * are counted now; read before the barrier, which rank 0's store
     * outlives, and judged after it, so every rank fails alike. */
    int64_t checksum_ranks;
    BRAID_CHECK(braid__checksum_count(pg->store, &checksum_ranks));
    BRAID_CHECK(exchange_hosts(pg));
    BRAID_CHECK(braid__devlink_exchange(pg));
    BRAID_CHECK(braid__devcoll_exchange(pg));
    BRAID_CHECK(braid__shrink_prepare(pg, cfg));
    BRAID_CHECK(store_barrier(pg, "init"));
    BRAID_CHECK(braid__checksum_agree(pg->store, pg->rank, pg->size, pg->checksum, checksum_ranks, braid__pg_init_wait_ms(pg)));
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
    int nlocal = 0, group_id = braid__transport_id_of(pg->transport);
    for (int p = 0; p < pg->size; p++)
        nlocal += p != pg->rank && pg->link[p] != group_id;
    const braid_transport_ops *local = braid__transport_some_pairs(pg->listeners);
    char socks[64];
    snprintf(socks, sizeof(socks), "auto (tcp: 1 on loopback, %d across a network)", BRAID_TCP_DEFAULT_SOCKS);
    if (pg->ctx.nsocks > 0)
        snprintf(socks, sizeof(socks), "%d", pg->ctx.nsocks);
    pg->init_deadline = 0; /* formed: from here the group timeout alone bounds its waits */
    BRAID_INFO("rank %d of %d joined via %s:%d, transport %s, listening on %s, %s sockets/peer, chunk %zu, "
               "%s for %d same-host peers, %d cuda_ipc device links",
               pg->rank, pg->size, rv->host, rv->port, pg->transport->name, pg->addr[pg->rank][group_id],
               socks, pg->chunk_bytes, local ? local->name : "none", nlocal,
               braid__devlink_count(pg));
    return BRAID_OK;
}

braid_status braid__pg_join(braid_pg *pg, const braid_rendezvous *rv, const braid_config *cfg)
{
    BRAID_CHECK(braid__pg_apply_config(pg, cfg));
    if (rv->launch_error[0])
        return braid__pg_report_launch_mistake(pg, rv);
    braid__hmem_pg_prepare(pg); /* before any rank of the group can hold a stream */
    braid__devcoll_prepare(pg);
    memcpy(pg->ctx.secret, rv->secret, sizeof(pg->ctx.secret));
    pg->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (pg->wake_fd < 0)
        return braid__error(BRAID_ERR_SYSTEM, "rank %d: eventfd: %m", pg->rank);

    /* From here every wait of the start is bounded by the init timeout too:
     * a rank that dies while the group forms stops the others by then. */
    pg->init_deadline = braid__now_ms() + pg->init_timeout_ms;
    BRAID_CHECK(braid__pg_rendezvous(pg, rv)); /* names missing ranks itself */
    braid_status st = form_group(pg, rv, cfg);
    /* A wait that the init timeout cut short, after every rank had joined:
     * one of them stopped answering while the group formed. */
    if (st == BRAID_ERR_TIMEOUT && pg->init_deadline != 0 && braid__now_ms() >= pg->init_deadline) {
        char why[512];
        snprintf(why, sizeof(why), "%s", braid__error_detail());
        return braid__error(st,
                            "rank %d: the group did not form within the init timeout (%d ms, "
                            "BRAID_INIT_TIMEOUT_MS): every rank had reached the store, then one stopped answering "
                            "(died?): %s",
                            pg->rank, pg->init_timeout_ms, why);
    }
    return st;
}
