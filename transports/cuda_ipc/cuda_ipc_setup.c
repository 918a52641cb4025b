/* cuda_ipc transport, connection set-up: this side's ring, stream and
 * events, the exchange of set-up messages over the TCP channel, the check
 * that the peer's GPU is reachable (VERDICT) and teardown. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "braid_cuda.h"
#include "clock.h"
#include "cuda_ipc.h"
#include "cuda_ipc_proto.h"
#include "log.h"
#include "proc_id.h"
#include "status.h"
#include "cuda_ipc_int.h"
#include "transports/tcp/tcp.h"

/* ---- set-up ----------------------------------------------------------------- */

static uint64_t host_hash(void)
{
    char host[256] = "", boot[64] = "", id[400];
    if (gethostname(host, sizeof(host) - 1) != 0)
        host[0] = '\0';
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof(boot), f))
            boot[0] = '\0';
        fclose(f);
    }
    snprintf(id, sizeof(id), "%s|%s", host, boot);
    return braid__ipc_host_hash(id);
}

static braid_status local_setup(ipc_conn *c, braid_ipc_setup *me)
{
    memset(me, 0, sizeof(*me));
    me->version = BRAID_IPC_VERSION;
    me->device = -1;
    me->pid = (uint32_t)getpid();
    me->pidns = braid__pidns_self();
    me->host_hash = host_hash();
    IPC_CU(c, cudaGetDevice(&c->device));
    int ipc_events = 0;
    IPC_CU(c, cudaDeviceGetAttribute(&ipc_events, cudaDevAttrIpcEventSupport, c->device));
    if (!ipc_events)
        return (c->eager ? braid__error : braid__error_quiet)(BRAID_ERR_UNSUPPORTED,
                            "rank %d: cuda_ipc peer %d: device %d does not support CUDA IPC "
                            "events", c->rank, c->base.peer, c->device);
    c->nslots = IPC_NSLOTS;
    c->slot_bytes = IPC_SLOT_BYTES;
    IPC_CU(c, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    IPC_CU(c, cudaMalloc(&c->ring, (size_t)c->nslots * c->slot_bytes));
    cudaIpcMemHandle_t mh;
    IPC_CU(c, cudaIpcGetMemHandle(&mh, c->ring));
    memcpy(me->ring, &mh, BRAID_IPC_HANDLE_BYTES);
    for (uint32_t k = 0; k < c->nslots; k++) {
        IPC_CU(c, cudaEventCreateWithFlags(&c->wrote[k], cudaEventInterprocess | cudaEventDisableTiming));
        IPC_CU(c, cudaEventCreateWithFlags(&c->read[k], cudaEventDisableTiming));
        cudaIpcEventHandle_t eh;
        IPC_CU(c, cudaIpcGetEventHandle(&eh, c->wrote[k]));
        memcpy(me->events[k], &eh, BRAID_IPC_HANDLE_BYTES);
    }
    IPC_CU(c, cudaDeviceGetPCIBusId(me->bus_id, BRAID_IPC_BUS_ID_BYTES, c->device));
    me->device = c->device;
    me->nslots = c->nslots;
    me->slot_bytes = c->slot_bytes;
    return BRAID_OK;
}

/* Can this process reach the peer's device? Same host, and the same GPU or
 * one with peer access. A device link that cannot is no failure (the pair
 * keeps its host link), so the answer is not logged as a warning there. */
static braid_status check_reach(ipc_conn *c, const braid_ipc_setup *me, const braid_ipc_setup *peer)
{
    if (peer->host_hash != me->host_hash)
        return (c->eager ? braid__error : braid__error_quiet)(BRAID_ERR_UNSUPPORTED, "rank %d: cuda_ipc peer %d runs on another host", c->rank,
                            c->base.peer);
    /* Ranks that are threads of one process: CUDA refuses to open a
     * process's own IPC handles, so the pair keeps its host link. */
    if (braid__is_this_process(peer->pid, peer->pidns))
        return (c->eager ? braid__error : braid__error_quiet)(BRAID_ERR_UNSUPPORTED,
                            "rank %d: cuda_ipc peer %d is a thread of this process (CUDA opens IPC handles only in "
                            "other processes)", c->rank, c->base.peer);
    if (!strcmp(peer->bus_id, me->bus_id))
        return BRAID_OK;
    int pdev = -1, can = 0;
    if (cudaDeviceGetByPCIBusId(&pdev, peer->bus_id) != cudaSuccess) {
        (void)cudaGetLastError();
        return (c->eager ? braid__error : braid__error_quiet)(BRAID_ERR_UNSUPPORTED,
                            "rank %d: cuda_ipc peer %d's GPU %s is not visible here (CUDA_VISIBLE_DEVICES?)", c->rank,
                            c->base.peer, peer->bus_id);
    }
    IPC_CU(c, cudaDeviceCanAccessPeer(&can, c->device, pdev));
    if (!can)
        return (c->eager ? braid__error : braid__error_quiet)(BRAID_ERR_UNSUPPORTED, "rank %d: cuda_ipc: GPU %s cannot access peer %d's GPU %s",
                            c->rank, me->bus_id, c->base.peer, peer->bus_id);
    return BRAID_OK;
}

/* Whether the connection's stream finished its work within DRAIN_MS. A
 * receive copy waits on the peer's event; a peer that died (or failed
 * before recording it) may never let it go, so a failed connection is not
 * waited for forever. */
#define DRAIN_MS 2000

static int stream_drained(ipc_conn *c)
{
    int64_t deadline = braid__now_ms() + DRAIN_MS;
    for (;;) {
        cudaError_t err = cudaStreamQuery(c->stream);
        if (err != cudaErrorNotReady) {
            (void)cudaGetLastError();
            return 1; /* done, or an error that ends the stream's work too */
        }
        if (braid__now_ms() > deadline)
            return 0;
        usleep(200);
    }
}

/* Tell the peer we no longer map its ring, then wait (DRAIN_MS at most)
 * until it says the same of ours, or its connection ends (a peer closes
 * only after its own BYE, or dies, which unmaps too). Returns 1 when our
 * ring may be freed. Links close in peer order on every rank, so two
 * ranks never wait for each other's later link. */
/* A connection that ended without the peer's BYE proves nothing (a peer
 * whose copies did not drain closes without unmapping): only a peer
 * process that is gone has let go. */
static int peer_gone(const ipc_conn *c)
{
    /* A pid from another pid namespace names some other process here:
     * such a peer is never known gone (its ring stays until we exit). */
    return c->peer_pid == 0 ||
           (braid__pid_is_ours(c->peer_pidns) && kill((pid_t)c->peer_pid, 0) != 0 && errno == ESRCH);
}

static int peer_let_go(ipc_conn *c)
{
    int mapped = c->peer_verdict != 0 && c->ring; /* a peer that said no never mapped our ring */
    if (c->base.error != BRAID_OK)
        return !mapped || peer_gone(c); /* a failed link (or group): the peer is not closing with us */
    int64_t deadline = braid__now_ms() + DRAIN_MS;
    braid_ipc_ctrl bye = {.kind = BRAID_IPC_BYE}; /* always: we may have mapped the peer's */
    int sent = 0;
    while (!sent && braid__now_ms() <= deadline)
        if (braid__cuda_ipc_ctrl_send(c, &bye, &sent) != BRAID_OK)
            return !mapped || peer_gone(c);
    if (!mapped)
        return 1;
    while (braid__now_ms() <= deadline) {
        if (!c->rx_posted) {
            memset(&c->rx, 0, sizeof(c->rx));
            if (c->tcp->ops->irecv(c->tcp, &c->rx, c->rx_buf, BRAID_IPC_CTRL_BYTES) != BRAID_OK)
                return peer_gone(c);
            c->rx_posted = 1;
        }
        int done = 0;
        if (c->tcp->ops->test(&c->rx, &done) != BRAID_OK)
            return peer_gone(c);
        if (!done) {
            usleep(200);
            continue;
        }
        c->rx_posted = 0;
        braid_ipc_ctrl m;
        if (braid__ipc_ctrl_decode(c->rx_buf, c->nslots, c->slot_bytes, &m, NULL, 0) != BRAID_OK)
            return 0; /* not a peer we understand: keep the ring */
        if (m.kind == BRAID_IPC_BYE || (m.kind == BRAID_IPC_VERDICT && m.len == 0))
            return 1;
    }
    return 0;
}

void braid__cuda_ipc_conn_free(ipc_conn *c)
{
    if (c->stream && !stream_drained(c)) {
        /* Copies may still touch the ring, the peer's ring and the
         * events: leave them to the process rather than free them under
         * the GPU. */
        BRAID_WARN("rank %d: cuda_ipc peer %d: copies still queued after %d ms; leaving the link's GPU buffers "
                   "allocated", c->rank, c->base.peer, DRAIN_MS);
        if (c->tcp)
            c->tcp->ops->close(c->tcp);
        free(c);
        return;
    }
    if (c->peer_ring)
        (void)cudaIpcCloseMemHandle(c->peer_ring);
    for (uint32_t k = 0; k < BRAID_IPC_MAX_SLOTS; k++) {
        if (c->wrote[k])
            (void)cudaEventDestroy(c->wrote[k]);
        if (c->read[k])
            (void)cudaEventDestroy(c->read[k]);
        if (c->peer_wrote[k])
            (void)cudaEventDestroy(c->peer_wrote[k]);
    }
    /* Our ring may still be mapped by the peer: free it only once it let go. */
    if (c->ring && c->started && c->tcp && !peer_let_go(c))
        BRAID_WARN("rank %d: cuda_ipc peer %d did not release this link's ring within %d ms; leaving it allocated",
                   c->rank, c->base.peer, DRAIN_MS);
    else if (c->ring)
        (void)cudaFree(c->ring);
    if (c->stream)
        (void)cudaStreamDestroy(c->stream);
    (void)cudaGetLastError();
    if (c->tcp)
        c->tcp->ops->close(c->tcp);
    free(c);
}

/* Settle as unreachable: our verdict is no (why says so). The group's
 * transport cannot do without the pair, so there it is an error. */
static braid_status refuse(ipc_conn *c, const char *why)
{
    snprintf(c->unusable_why, sizeof(c->unusable_why), "%s", why);
    if (c->eager)
        return braid__error(BRAID_ERR_UNSUPPORTED, "%s", why);
    c->my_verdict = 0;
    return BRAID_OK;
}

/* The peer's set-up arrived: check it, open its ring and events, and tell
 * the peer whether we can reach its GPU. */
braid_status braid__cuda_ipc_finish_setup(ipc_conn *c)
{
    braid_ipc_setup peer;
    char why[256];
    braid_status st = braid__ipc_setup_decode(c->setup_in, &peer, why, sizeof(why));
    if (st != BRAID_OK)
        return braid__error(st, "rank %d: cuda_ipc peer %d: %s", c->rank, c->base.peer, why);
    c->peer_pid = peer.pid;
    c->peer_pidns = peer.pidns;
    if (c->me.nslots == 0) {
        c->my_verdict = 0; /* we cannot: unusable_why said so when we started */
    } else if (peer.nslots == 0) {
        snprintf(why, sizeof(why), "rank %d: cuda_ipc peer %d cannot use CUDA IPC (its log says why)", c->rank,
                 c->base.peer);
        BRAID_CHECK(refuse(c, why));
    } else if (peer.nslots != c->nslots || peer.slot_bytes != c->slot_bytes) {
        return braid__error(BRAID_ERR_MISMATCH, "rank %d: cuda_ipc peer %d uses %u x %u byte slots, we use %u x %u",
                            c->rank, c->base.peer, peer.nslots, peer.slot_bytes, c->nslots, c->slot_bytes);
    } else if ((st = check_reach(c, &c->me, &peer)) != BRAID_OK) {
        if (st != BRAID_ERR_UNSUPPORTED || c->eager)
            return st;
        BRAID_CHECK(refuse(c, braid_last_error()));
    } else {
        cudaIpcMemHandle_t mh;
        memcpy(&mh, peer.ring, sizeof(mh));
        IPC_CU(c, cudaIpcOpenMemHandle(&c->peer_ring, mh, cudaIpcMemLazyEnablePeerAccess));
        for (uint32_t k = 0; k < c->nslots; k++) {
            cudaIpcEventHandle_t eh;
            memcpy(&eh, peer.events[k], sizeof(eh));
            IPC_CU(c, cudaIpcOpenEventHandle(&c->peer_wrote[k], eh));
        }
        braid__ipc_window_init(&c->win, c->nslots, c->slot_bytes);
        c->my_verdict = 1;
        BRAID_INFO("rank %d: cuda_ipc peer %d: GPU %s <-> %s, %u x %u byte slots", c->rank, c->base.peer,
                   c->me.bus_id, peer.bus_id, c->nslots, c->slot_bytes);
    }
    braid_ipc_ctrl m = {.kind = BRAID_IPC_VERDICT, .len = (uint64_t)c->my_verdict};
    int sent;
    BRAID_CHECK(braid__cuda_ipc_ctrl_send(c, &m, &sent));
    if (!sent)
        return braid__error(BRAID_ERR_INTERNAL, "rank %d: cuda_ipc peer %d: no transmit buffer for the verdict",
                            c->rank, c->base.peer);
    return BRAID_OK;
}

/* Build our ring on the current device and send its handles; the peer's
 * come in with a later progress. A device link that cannot build one
 * sends a set-up with no slots instead, so the peer learns it at once. */
braid_status braid__cuda_ipc_start(ipc_conn *c)
{
    braid_status st = local_setup(c, &c->me);
    if (st != BRAID_OK) {
        if (c->eager)
            return st;
        snprintf(c->unusable_why, sizeof(c->unusable_why), "%s", braid_last_error());
        uint64_t hash = c->me.host_hash;
        memset(&c->me, 0, sizeof(c->me));
        c->me.version = BRAID_IPC_VERSION;
        c->me.device = -1;
        c->me.host_hash = hash;
    }
    braid__ipc_setup_encode(&c->me, c->setup_out);
    BRAID_CHECK(c->tcp->ops->isend(c->tcp, &c->setup_tx, c->setup_out, sizeof(c->setup_out)));
    BRAID_CHECK(c->tcp->ops->irecv(c->tcp, &c->setup_rx, c->setup_in, sizeof(c->setup_in)));
    int done;
    BRAID_CHECK(c->tcp->ops->test(&c->setup_tx, &done)); /* usually fits the socket buffer now */
    c->started = 1;
    return BRAID_OK;
}

/* Wrap an authenticated TCP connection (taken over, closed on failure);
 * eager: braid__cuda_ipc_start now, on the calling thread's device. */
braid_status braid__cuda_ipc_conn_setup(int rank, braid_conn *tcp, int eager, braid_conn **out)
{
    ipc_conn *c = calloc(1, sizeof(*c));
    if (!c) {
        tcp->ops->close(tcp);
        return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: out of memory for a cuda_ipc connection", rank);
    }
    c->base.ops = &braid__cuda_ipc_ops;
    c->base.peer = tcp->peer;
    c->base.error = BRAID_OK;
    c->tcp = tcp; /* the connection owns the TCP channel now */
    c->rank = rank;
    c->eager = eager;
    c->my_verdict = c->peer_verdict = -1;
    if (eager) {
        braid_status st = braid__cuda_ipc_start(c);
        if (st != BRAID_OK) {
            braid__cuda_ipc_conn_free(c);
            return st;
        }
    }
    *out = &c->base;
    return BRAID_OK;
}
