/* cuda_ipc transport: same-host GPU peers move chunks device to device.
 *
 * A connection is a TCP connection (authenticated by the TCP transport's
 * job-secret handshake, so IPC handles are only ever given to group
 * members) plus, on each side, a receive ring of device slots the peer
 * writes into through cudaIpcOpenMemHandle, and inter-process events that
 * order the writer's copy before the reader's (cuda_ipc_proto.h has the
 * protocol). Every copy is a cudaMemcpyAsync (cudaMemcpyDefault, so the
 * user buffer may be host or device memory) on the connection's own
 * non-blocking stream; the TCP channel only carries 16-byte control
 * messages. Completion is polled with cudaEventQuery: progress() never
 * blocks on the GPU, and waits in poll() (1 ms at most while copies are in
 * flight) only when nothing moved.
 *
 * Two uses. BRAID_TRANSPORT=cuda_ipc makes it the group's transport
 * (single-host groups whose GPUs reach each other): connections set up at
 * once, and a pair that cannot reach fails. Otherwise the group keeps
 * shm/TCP for everything and adds a device link (braid__cuda_ipc_wrap)
 * between same-host ring neighbours for the device ring (src/devlink.c):
 * those set up on first use, on the thread and device of the first device
 * call, and a pair that cannot reach settles on "unusable" (both ends
 * alike, through VERDICT messages) instead of failing. */
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
#include "status.h"
#include "transports/tcp/tcp.h"

#define IPC_NSLOTS 4
#define IPC_SLOT_BYTES (1u << 20)
#define IPC_TX_MAX (2 * BRAID_IPC_MAX_SLOTS) /* DATA and CREDIT messages in flight */

typedef struct {
    braid_listener base; /* first */
    braid_listener *tcp;
    braid_transport_ctx ctx;
} ipc_listener;

/* A chunk in flight: sent (copy into the peer's slot) or received (copy
 * out of ours). */
typedef struct {
    uint32_t slot;
    size_t len;
    int last;
    int copying;    /* receive side: the copy out is queued */
    braid_req *req;
} ipc_chunk;

typedef struct {
    braid_conn base; /* first: braid_conn * downcasts to this */
    braid_conn *tcp;
    int rank;
    int device;
    uint32_t nslots, slot_bytes;
    cudaStream_t stream;
    void *ring;                                  /* ours; the peer writes it */
    void *peer_ring;                             /* the peer's, opened */
    cudaEvent_t wrote[BRAID_IPC_MAX_SLOTS];      /* ours, exported: recorded after writing peer slot k */
    cudaEvent_t peer_wrote[BRAID_IPC_MAX_SLOTS]; /* opened: the peer wrote our slot k */
    cudaEvent_t read[BRAID_IPC_MAX_SLOTS];       /* local: our copy out of slot k finished */
    braid_ipc_window win;

    /* Set-up: ours goes out when the connection starts (when it is made,
     * or for a device link at first use), the peer's is taken in by a
     * later progress, so no dial waits for the peer's accept (the group
     * dials and accepts in an order that would deadlock a blocking
     * exchange with three or more ranks). Then each side says whether it
     * can reach the other's GPU (VERDICT); data moves once both said yes. */
    int eager;        /* the group's transport: unreachable peers are errors */
    int started;      /* our set-up went out */
    int my_verdict;   /* -1 until the peer's set-up was read; then 1 reachable, 0 not */
    int peer_verdict; /* -1 until the peer's VERDICT arrived */
    int ready;        /* both said yes, the peer's ring and events are open */
    char unusable_why[256];
    braid_ipc_setup me;
    braid_req setup_tx, setup_rx;
    uint8_t setup_out[BRAID_IPC_SETUP_BYTES], setup_in[BRAID_IPC_SETUP_BYTES];

    braid_req *send_head, *send_tail, *send_assign; /* send_assign: first not fully copied */
    size_t send_off;
    braid_req *recv_head, *recv_tail, *recv_assign;
    size_t recv_off;
    ipc_chunk sent[BRAID_IPC_MAX_SLOTS];  /* FIFO of nsent from sent_head */
    uint32_t sent_head, nsent;
    ipc_chunk got[BRAID_IPC_MAX_SLOTS];   /* FIFO of ngot from got_head */
    uint32_t got_head, ngot;

    braid_req rx;
    uint8_t rx_buf[BRAID_IPC_CTRL_BYTES];
    int rx_posted;
    braid_req tx[IPC_TX_MAX];
    uint8_t tx_buf[IPC_TX_MAX][BRAID_IPC_CTRL_BYTES];
    int tx_busy[IPC_TX_MAX];
    char error_text[384];
} ipc_conn;

static ipc_conn *conn_of(braid_conn *c)
{
    return (ipc_conn *)c;
}



/* ---- probe ----------------------------------------------------------------- */

static braid_status ipc_probe(char *why, size_t why_len)
{
    if (!braid__cuda_available()) {
        snprintf(why, why_len, "%s", braid__cuda_unavailable_reason());
        return BRAID_ERR_UNSUPPORTED;
    }
    int dev = 0, ipc_events = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&ipc_events, cudaDevAttrIpcEventSupport, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(why, why_len, "cannot query CUDA IPC support of the current device");
        return BRAID_ERR_UNSUPPORTED;
    }
    if (!ipc_events) {
        snprintf(why, why_len, "device %d does not support CUDA IPC events (e.g. WSL, some MIG set-ups)", dev);
        return BRAID_ERR_UNSUPPORTED;
    }
    why[0] = '\0';
    return BRAID_OK;
}

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

static braid_status cuda_fail(ipc_conn *c, cudaError_t err, const char *what)
{
    (void)cudaGetLastError();
    return braid__error(BRAID_ERR_CUDA, "rank %d: cuda_ipc peer %d: %s failed: %s", c->rank, c->base.peer, what,
                        cudaGetErrorString(err));
}

#define IPC_CU(c, call)                                                                        \
    do {                                                                                       \
        cudaError_t e_ = (call);                                                               \
        if (e_ != cudaSuccess)                                                                 \
            return cuda_fail((c), e_, #call);                                                  \
    } while (0)

static braid_status local_setup(ipc_conn *c, braid_ipc_setup *me)
{
    memset(me, 0, sizeof(*me));
    me->version = BRAID_IPC_VERSION;
    me->device = -1;
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

static void conn_free(ipc_conn *c)
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
    if (c->ring)
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

static braid_status ctrl_send(ipc_conn *c, const braid_ipc_ctrl *m, int *sent);

/* The peer's set-up arrived: check it, open its ring and events, and tell
 * the peer whether we can reach its GPU. */
static braid_status finish_setup(ipc_conn *c)
{
    braid_ipc_setup peer;
    char why[256];
    braid_status st = braid__ipc_setup_decode(c->setup_in, &peer, why, sizeof(why));
    if (st != BRAID_OK)
        return braid__error(st, "rank %d: cuda_ipc peer %d: %s", c->rank, c->base.peer, why);
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
    BRAID_CHECK(ctrl_send(c, &m, &sent));
    if (!sent)
        return braid__error(BRAID_ERR_INTERNAL, "rank %d: cuda_ipc peer %d: no transmit buffer for the verdict",
                            c->rank, c->base.peer);
    return BRAID_OK;
}

/* Build our ring on the current device and send its handles; the peer's
 * come in with a later progress. A device link that cannot build one
 * sends a set-up with no slots instead, so the peer learns it at once. */
static braid_status start(ipc_conn *c)
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
 * eager: start now, on the calling thread's device. */
static braid_status conn_setup(int rank, braid_conn *tcp, int eager, braid_conn **out)
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
        braid_status st = start(c);
        if (st != BRAID_OK) {
            conn_free(c);
            return st;
        }
    }
    *out = &c->base;
    return BRAID_OK;
}

braid_status braid__cuda_ipc_wrap(int rank, braid_conn *tcp, braid_conn **out)
{
    return conn_setup(rank, tcp, 0, out);
}

const braid_transport_ops *braid__cuda_ipc_transport(void)
{
    return &braid__cuda_ipc_ops;
}

static braid_status ipc_listen(const braid_transport_ctx *ctx, braid_listener **listener, char addr[BRAID_ADDR_MAX])
{
    ipc_listener *l = calloc(1, sizeof(*l));
    if (!l)
        return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: out of memory for a cuda_ipc listener", ctx->rank);
    braid_status st = braid__tcp_ops.listen(ctx, &l->tcp, addr);
    if (st != BRAID_OK) {
        free(l);
        return st;
    }
    l->base.ops = &braid__cuda_ipc_ops;
    l->ctx = *ctx;
    *listener = &l->base;
    return BRAID_OK;
}

static braid_status ipc_accept(braid_listener *listener, int peer, int timeout_ms, braid_conn **conn)
{
    ipc_listener *l = (ipc_listener *)listener;
    braid_conn *tcp;
    BRAID_CHECK(l->tcp->ops->accept(l->tcp, peer, timeout_ms, &tcp));
    return conn_setup(l->ctx.rank, tcp, 1, conn);
}

/* The set-up message exchange finishes under the first collective's
 * deadline (see ipc_conn.ready), not under timeout_ms. */
static braid_status ipc_connect(const braid_transport_ctx *ctx, int peer, const char *addr, int timeout_ms,
                                braid_conn **conn)
{
    braid_conn *tcp;
    BRAID_CHECK(braid__tcp_ops.connect(ctx, peer, addr, timeout_ms, &tcp));
    return conn_setup(ctx->rank, tcp, 1, conn);
}

static void ipc_close_listener(braid_listener *listener)
{
    ipc_listener *l = (ipc_listener *)listener;
    l->tcp->ops->close_listener(l->tcp);
    free(l);
}

/* ---- data path ----------------------------------------------------------------- */

static braid_status conn_error(ipc_conn *c, braid_status st)
{
    if (c->base.error == BRAID_OK) {
        c->base.error = st;
        snprintf(c->error_text, sizeof(c->error_text), "%s", braid_last_error());
    }
    return c->base.error;
}

static braid_status peer_error(ipc_conn *c, braid_status st, const char *why)
{
    return conn_error(c, braid__error(st, "rank %d: cuda_ipc peer %d: %s", c->rank, c->base.peer, why));
}

/* Queue a control message; 0 when every transmit buffer is busy (cannot
 * happen within the window's bounds, but then the caller retries). */
static braid_status ctrl_send(ipc_conn *c, const braid_ipc_ctrl *m, int *sent)
{
    *sent = 0;
    for (int i = 0; i < IPC_TX_MAX; i++) {
        if (c->tx_busy[i]) {
            int done = 0;
            BRAID_CHECK(c->tcp->ops->test(&c->tx[i], &done));
            if (!done)
                continue;
            c->tx_busy[i] = 0;
        }
        braid__ipc_ctrl_encode(m, c->tx_buf[i]);
        memset(&c->tx[i], 0, sizeof(c->tx[i]));
        BRAID_CHECK(c->tcp->ops->isend(c->tcp, &c->tx[i], c->tx_buf[i], BRAID_IPC_CTRL_BYTES));
        c->tx_busy[i] = 1;
        *sent = 1;
        /* Push it now: a posted TCP send moves only when progressed, and
         * the peer may be waiting for exactly this message after we moved
         * on to other links (braid__cuda_ipc_tx_pending). */
        int done = 0;
        BRAID_CHECK(c->tcp->ops->test(&c->tx[i], &done));
        c->tx_busy[i] = !done;
        return BRAID_OK;
    }
    return BRAID_OK;
}

/* An event finished? cudaErrorNotReady is "not yet". */
static braid_status event_done(ipc_conn *c, cudaEvent_t e, int *done)
{
    cudaError_t err = cudaEventQuery(e);
    if (err == cudaErrorNotReady) {
        *done = 0;
        return BRAID_OK;
    }
    if (err != cudaSuccess)
        return conn_error(c, cuda_fail(c, err, "cudaEventQuery"));
    *done = 1;
    return BRAID_OK;
}

static braid_status on_ctrl(ipc_conn *c, const braid_ipc_ctrl *m)
{
    if (m->kind == BRAID_IPC_VERDICT) {
        if (c->peer_verdict >= 0)
            return peer_error(c, BRAID_ERR_PEER, "a second verdict");
        c->peer_verdict = (int)m->len;
        if (!c->peer_verdict && c->my_verdict == 1) {
            char why[256];
            snprintf(why, sizeof(why), "rank %d: cuda_ipc peer %d cannot reach this GPU (%s; its log says why)",
                     c->rank, c->base.peer, c->me.bus_id);
            snprintf(c->unusable_why, sizeof(c->unusable_why), "%s", why);
            if (c->eager)
                return conn_error(c, braid__error(BRAID_ERR_UNSUPPORTED, "%s", why));
        }
        c->ready = c->my_verdict == 1 && c->peer_verdict == 1;
        return BRAID_OK;
    }
    if (!c->ready)
        return peer_error(c, BRAID_ERR_PEER, "data or credit on a link that is not set up");
    if (m->kind == BRAID_IPC_CREDIT) {
        if (braid__ipc_window_credit(&c->win, m->slot) != BRAID_OK)
            return peer_error(c, BRAID_ERR_PEER, "credit for a slot not in flight");
        return BRAID_OK;
    }
    if (braid__ipc_window_arrive(&c->win, m->slot) != BRAID_OK || c->ngot >= c->nslots)
        return peer_error(c, BRAID_ERR_PEER, "data for a slot out of order or beyond its credit");
    ipc_chunk *g = &c->got[(c->got_head + c->ngot) % c->nslots];
    *g = (ipc_chunk){.slot = m->slot, .len = (size_t)m->len, .last = m->last};
    c->ngot++;
    return BRAID_OK;
}

static braid_status pump_sends(ipc_conn *c, int *moved)
{
    /* Hand chunks of the unsent messages to the copy engine. */
    while (c->send_assign && c->nsent < c->nslots) {
        braid_req *r = c->send_assign;
        uint32_t slot;
        size_t len;
        if (!braid__ipc_window_take(&c->win, r->len - c->send_off, &slot, &len))
            break;
        int last = c->send_off + len == r->len;
        if (len > 0) {
            IPC_CU(c, cudaMemcpyAsync((char *)c->peer_ring + (size_t)slot * c->slot_bytes,
                                      (const char *)r->buf + c->send_off, len, cudaMemcpyDefault, c->stream));
            IPC_CU(c, cudaEventRecord(c->wrote[slot], c->stream));
        }
        braid_ipc_ctrl m = {.kind = BRAID_IPC_DATA, .slot = slot, .last = last, .len = len};
        int sent;
        BRAID_CHECK(ctrl_send(c, &m, &sent));
        if (!sent)
            return peer_error(c, BRAID_ERR_INTERNAL, "control transmit buffers exhausted");
        c->sent[(c->sent_head + c->nsent) % c->nslots] = (ipc_chunk){.slot = slot, .len = len, .last = last, .req = r};
        c->nsent++;
        c->send_off += len;
        if (last) {
            c->send_assign = r->next;
            c->send_off = 0;
        }
        *moved = 1;
    }
    /* A send is done once its copies have left the user's buffer. */
    while (c->nsent > 0) {
        ipc_chunk *s = &c->sent[c->sent_head];
        int done = 1;
        if (s->len > 0)
            BRAID_CHECK(event_done(c, c->wrote[s->slot], &done));
        if (!done)
            break;
        s->req->moved += s->len;
        if (s->last) {
            s->req->done = 1;
            c->send_head = s->req->next;
            if (!c->send_head)
                c->send_tail = NULL;
        }
        c->sent_head = (c->sent_head + 1) % c->nslots;
        c->nsent--;
        *moved = 1;
    }
    return BRAID_OK;
}

static braid_status pump_recvs(ipc_conn *c, int *moved)
{
    /* Give arrived chunks their place in the posted receives, in order. */
    for (uint32_t i = 0; i < c->ngot; i++) {
        ipc_chunk *g = &c->got[(c->got_head + i) % c->nslots];
        if (g->copying)
            continue;
        braid_req *r = c->recv_assign;
        if (!r)
            break;
        size_t left = r->len - c->recv_off;
        if (g->len > left || (g->last != (g->len == left)))
            return peer_error(c, BRAID_ERR_MISMATCH, "message length differs from the posted receive");
        if (g->len > 0) {
            IPC_CU(c, cudaStreamWaitEvent(c->stream, c->peer_wrote[g->slot], 0));
            IPC_CU(c, cudaMemcpyAsync((char *)r->buf + c->recv_off, (char *)c->ring + (size_t)g->slot * c->slot_bytes,
                                      g->len, cudaMemcpyDefault, c->stream));
            IPC_CU(c, cudaEventRecord(c->read[g->slot], c->stream));
        }
        g->copying = 1;
        g->req = r;
        c->recv_off += g->len;
        if (g->last) {
            c->recv_assign = r->next;
            c->recv_off = 0;
        }
        *moved = 1;
    }
    /* Copies out finished in order: free the slot, finish the receive. */
    while (c->ngot > 0 && c->got[c->got_head].copying) {
        ipc_chunk *g = &c->got[c->got_head];
        int done = 1;
        if (g->len > 0)
            BRAID_CHECK(event_done(c, c->read[g->slot], &done));
        if (!done)
            break;
        braid_ipc_ctrl m = {.kind = BRAID_IPC_CREDIT, .slot = braid__ipc_window_release(&c->win)};
        int sent;
        BRAID_CHECK(ctrl_send(c, &m, &sent));
        if (!sent)
            return peer_error(c, BRAID_ERR_INTERNAL, "control transmit buffers exhausted");
        g->req->moved += g->len;
        if (g->last) {
            g->req->done = 1;
            c->recv_head = g->req->next;
            if (!c->recv_head)
                c->recv_tail = NULL;
        }
        c->got_head = (c->got_head + 1) % c->nslots;
        c->ngot--;
        *moved = 1;
    }
    return BRAID_OK;
}

static braid_status conn_progress(ipc_conn *c, int *moved)
{
    if (c->base.error != BRAID_OK) {
        braid__error_set_text(c->error_text);
        return c->base.error;
    }
    if (c->started && c->me.nslots > 0) {
        cudaError_t err = cudaSetDevice(c->device);
        if (err != cudaSuccess)
            return conn_error(c, cuda_fail(c, err, "cudaSetDevice"));
    }
    braid_status st;
    if (!c->started) {
        BRAID_CHECK_GOTO(start(c), st, fail);
        *moved = 1;
    }
    if (c->my_verdict < 0) {
        int tx_done = 0, rx_done = 0;
        BRAID_CHECK_GOTO(c->tcp->ops->test(&c->setup_tx, &tx_done), st, fail);
        BRAID_CHECK_GOTO(c->tcp->ops->test(&c->setup_rx, &rx_done), st, fail);
        if (!rx_done)
            return BRAID_OK;
        BRAID_CHECK_GOTO(finish_setup(c), st, fail);
        *moved = 1;
    }
    for (;;) {
        if (!c->rx_posted) {
            memset(&c->rx, 0, sizeof(c->rx));
            BRAID_CHECK_GOTO(c->tcp->ops->irecv(c->tcp, &c->rx, c->rx_buf, BRAID_IPC_CTRL_BYTES), st, fail);
            c->rx_posted = 1;
        }
        int done = 0;
        BRAID_CHECK_GOTO(c->tcp->ops->test(&c->rx, &done), st, fail);
        if (!done)
            break;
        c->rx_posted = 0;
        braid_ipc_ctrl m;
        char why[128];
        if (braid__ipc_ctrl_decode(c->rx_buf, c->nslots, c->slot_bytes, &m, why, sizeof(why)) != BRAID_OK)
            return peer_error(c, BRAID_ERR_PEER, why);
        BRAID_CHECK(on_ctrl(c, &m));
        *moved = 1;
    }
    if (!c->ready)
        return BRAID_OK;
    BRAID_CHECK_GOTO(pump_sends(c, moved), st, fail);
    BRAID_CHECK_GOTO(pump_recvs(c, moved), st, fail);
    return BRAID_OK;
fail:
    return conn_error(c, st);
}

static int gpu_busy(const ipc_conn *c)
{
    return c->started && (c->nsent > 0 || c->ngot > 0 || !c->setup_tx.done);
}

/* Both ends know whether the link carries data: we said no, or we said
 * yes and heard the peer's verdict. */
static int settled(const ipc_conn *c)
{
    return c->my_verdict == 0 || (c->my_verdict == 1 && c->peer_verdict >= 0);
}

braid_status braid__cuda_ipc_settle(braid_conn *conn, int *is_settled, int *usable)
{
    ipc_conn *c = conn_of(conn);
    int moved = 0;
    if (!settled(c)) /* once settled, the answer never changes: no I/O to ask it */
        BRAID_CHECK(conn_progress(c, &moved));
    *usable = c->ready;
    *is_settled = settled(c);
    return BRAID_OK;
}

braid_status braid__cuda_ipc_tx_pending(braid_conn *conn, int *pending)
{
    ipc_conn *c = conn_of(conn);
    *pending = 0;
    for (int i = 0; i < IPC_TX_MAX; i++) {
        if (!c->tx_busy[i])
            continue;
        int done = 0;
        BRAID_CHECK(c->tcp->ops->test(&c->tx[i], &done));
        c->tx_busy[i] = !done;
        *pending += !done;
    }
    return BRAID_OK;
}

const char *braid__cuda_ipc_unusable_why(braid_conn *conn)
{
    return conn_of(conn)->unusable_why;
}

static braid_status ipc_isend(braid_conn *conn, braid_req *req, const void *buf, size_t len)
{
    ipc_conn *c = conn_of(conn);
    if (c->base.error != BRAID_OK) {
        braid__error_set_text(c->error_text);
        return c->base.error;
    }
    memset(req, 0, sizeof(*req));
    req->conn = conn;
    req->kind = BRAID_REQ_SEND;
    req->buf = (void *)buf;
    req->len = len;
    if (c->send_tail)
        c->send_tail->next = req;
    else
        c->send_head = req;
    c->send_tail = req;
    if (!c->send_assign)
        c->send_assign = req;
    return BRAID_OK;
}

static braid_status ipc_irecv(braid_conn *conn, braid_req *req, void *buf, size_t len)
{
    ipc_conn *c = conn_of(conn);
    if (c->base.error != BRAID_OK) {
        braid__error_set_text(c->error_text);
        return c->base.error;
    }
    memset(req, 0, sizeof(*req));
    req->conn = conn;
    req->kind = BRAID_REQ_RECV;
    req->buf = buf;
    req->len = len;
    if (c->recv_tail)
        c->recv_tail->next = req;
    else
        c->recv_head = req;
    c->recv_tail = req;
    if (!c->recv_assign)
        c->recv_assign = req;
    return BRAID_OK;
}

static braid_status ipc_test(braid_req *req, int *done)
{
    ipc_conn *c = conn_of(req->conn);
    int moved = 0;
    *done = req->done;
    if (req->done)
        return BRAID_OK;
    BRAID_CHECK(conn_progress(c, &moved));
    *done = req->done;
    return BRAID_OK;
}

static braid_status ipc_progress(braid_conn **conns, int nconns, int wake_fd, int timeout_ms)
{
    int moved = 0, busy = 0;
    for (int i = 0; i < nconns; i++) {
        BRAID_CHECK(conn_progress(conn_of(conns[i]), &moved));
        busy |= gpu_busy(conn_of(conns[i]));
    }
    if (moved)
        return BRAID_OK;
    /* Nothing moved: wait on the control sockets, briefly while the GPU
     * has copies in flight (their completion wakes no file descriptor). */
    int wait_ms = busy && (timeout_ms < 0 || timeout_ms > 1) ? 1 : timeout_ms;
    braid_conn *inner[64];
    for (int i = 0; i < nconns; i += 64) {
        int n = nconns - i < 64 ? nconns - i : 64;
        for (int k = 0; k < n; k++)
            inner[k] = conn_of(conns[i + k])->tcp;
        BRAID_CHECK(inner[0]->ops->progress(inner, n, wake_fd, i == 0 ? wait_ms : 0));
    }
    return BRAID_OK;
}

static void ipc_close(braid_conn *conn)
{
    if (conn)
        conn_free(conn_of(conn));
}

static braid_status ipc_reg_mem(braid_conn *conn, void *buf, size_t len, void **handle)
{
    (void)conn, (void)buf, (void)len;
    *handle = NULL; /* copies go through the staging ring: nothing to register */
    return BRAID_OK;
}

static braid_status ipc_dereg_mem(braid_conn *conn, void *handle)
{
    (void)conn, (void)handle;
    return BRAID_OK;
}

const braid_transport_ops braid__cuda_ipc_ops = {
    .size = sizeof(braid_transport_ops),
    .name = "cuda_ipc",
    .probe = ipc_probe,
    .listen = ipc_listen,
    .accept = ipc_accept,
    .connect = ipc_connect,
    .close_listener = ipc_close_listener,
    .reg_mem = ipc_reg_mem,
    .dereg_mem = ipc_dereg_mem,
    .isend = ipc_isend,
    .irecv = ipc_irecv,
    .test = ipc_test,
    .progress = ipc_progress,
    .close = ipc_close,
};
