/* A group's kernel-driven device collectives (device_coll_group.h): the
 * regions, their exchange, and the calls. See device_coll.h for the
 * protocol the kernels run. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "algo/algo.h"
#include "bootstrap/store.h"
#include "braid_cuda.h"
#include "device_coll.h"
#include "device_coll_group.h"
#include "device_coll_int.h"
#include "log.h"
#include "proc_id.h"
#include "param.h"
#include "status.h"

static size_t region_bytes(void)
{
    return braid__devcoll_region_bytes(BRAID_DEVCOLL_MAX_BLOCKS, SEG_BYTES);
}

static void watch_stop(struct braid_devcoll_group *g)
{
    if (g->watching) {
        uint64_t one = 1;
        ssize_t w = write(g->stop_fd, &one, sizeof(one));
        (void)w;
        pthread_join(g->watch, NULL);
        g->watching = 0;
    }
    for (int p = 0; p < BRAID_DEVCOLL_MAX_RANKS; p++)
        if (g->pidfd[p] >= 0)
            close(g->pidfd[p]);
    if (g->stop_fd >= 0)
        close(g->stop_fd);
}

void braid__devcoll_close_peers(struct braid_devcoll_group *g)
{
    for (int p = 0; p < BRAID_DEVCOLL_MAX_RANKS; p++)
        if (g->opened[p]) {
            if (cudaIpcCloseMemHandle(g->peer[p]) != cudaSuccess)
                (void)cudaGetLastError();
            g->opened[p] = 0;
        }
}

/* A region peers may still map is left to the process rather than freed
 * under their kernels (CUDA leaves that undefined). */
static void group_free(struct braid_devcoll_group *g)
{
    watch_stop(g);
    for (int i = 0; i < LAST_STREAMS; i++)
        if (g->last_ev[i] && cudaEventDestroy(g->last_ev[i]) != cudaSuccess)
            (void)cudaGetLastError();
    braid__devcoll_close_peers(g);
    if (g->region && g->exported && !g->peers_let_go)
        BRAID_WARN("device collectives: leaving a %zu-byte region allocated: not every peer said it let go of it",
                   region_bytes());
    else if (g->region && cudaFree(g->region) != cudaSuccess)
        (void)cudaGetLastError();
    if (g->flags_host && cudaFreeHost(g->flags_host) != cudaSuccess)
        (void)cudaGetLastError();
    free(g);
}

/* Groups that may run device collectives: asked alike by every rank. */
static int wanted(const braid_pg *pg)
{
    return pg->size >= 2 && pg->size <= BRAID_DEVCOLL_MAX_RANKS && braid__param_bool("BRAID_DEVCOLL", 0);
}

/* This rank's region on device, made at the group's first device call. */
static struct braid_devcoll_group *region_make(braid_pg *pg, int device)
{
    struct braid_devcoll_group *g = calloc(1, sizeof(*g));
    if (!g)
        return NULL;
    for (int p = 0; p < BRAID_DEVCOLL_MAX_RANKS; p++)
        g->pidfd[p] = -1;
    g->stop_fd = -1;
    atomic_init(&g->dead_rank, -1);
    atomic_init(&g->detaching, 0);
    g->device = device;
    cudaError_t err = cudaMalloc((void **)&g->region, region_bytes());
    if (err == cudaSuccess) /* counters start at zero */
        err = cudaMemset(g->region, 0, braid__devcoll_data_offset());
    if (err == cudaSuccess)
        err = cudaHostAlloc((void **)&g->flags_host, 64, cudaHostAllocMapped);
    if (err == cudaSuccess) {
        memset(g->flags_host, 0, 64);
        err = cudaHostGetDevicePointer(&g->flags_dev, g->flags_host, 0);
    }
    if (err == cudaSuccess)
        err = cudaIpcGetMemHandle(&g->mine.handle, g->region);
    if (err == cudaSuccess)
        err = cudaDeviceGetPCIBusId(g->mine.bus, sizeof(g->mine.bus), g->device);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        BRAID_INFO("rank %d: no device collectives: cannot make a %zu-byte region on device %d: %s", pg->rank,
                   region_bytes(), g->device, cudaGetErrorString(err));
        group_free(g);
        return NULL;
    }
    /* Loaded now, before any rank can launch one (device_coll.h). */
    if (braid__cuda_devcoll_preload() != BRAID_OK) {
        BRAID_INFO("rank %d: no device collectives: %s", pg->rank, braid_last_error());
        braid__error_clear();
        group_free(g);
        return NULL;
    }
    g->mine.ok = 1;
    g->mine.pid = (int32_t)getpid();
    g->mine.pidns = braid__pidns_self();
    g->mine.sm_count = braid__cuda_sm_count(g->device);
    g->mine.region = (uint64_t)(uintptr_t)g->region;
    return g;
}

/* Maps peer p's region; 0 when it cannot. Ranks of this process (threads)
 * use the address as it is: CUDA does not open a process's own handles. */
static int map_peer(braid_pg *pg, struct braid_devcoll_group *g, int p, const region_record *r)
{
    if (braid__is_this_process((uint32_t)r->pid, r->pidns)) {
        g->peer[p] = (char *)(uintptr_t)r->region;
        return 1;
    }
    void *ptr = NULL;
    cudaError_t err = cudaIpcOpenMemHandle(&ptr, r->handle, cudaIpcMemLazyEnablePeerAccess);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        BRAID_INFO("rank %d: no device collectives: cannot map rank %d's region: %s", pg->rank, p,
                   cudaGetErrorString(err));
        return 0;
    }
    g->peer[p] = ptr;
    g->opened[p] = 1;
    return 1;
}

/* One lock-free store to host memory the kernels poll: safe in a signal
 * handler, and from several threads at once. */
void braid__devcoll_raise_abort(struct braid_devcoll_group *g)
{
    __atomic_store_n(g->flags_host, 1u, __ATOMIC_RELEASE);
}

static void *watch_main(void *arg)
{
    struct braid_devcoll_group *g = arg;
    struct pollfd fds[BRAID_DEVCOLL_MAX_RANKS + 1];
    int rank_of[BRAID_DEVCOLL_MAX_RANKS + 1], n = 0;
    fds[n] = (struct pollfd){.fd = g->stop_fd, .events = POLLIN};
    rank_of[n++] = -1;
    for (int p = 0; p < BRAID_DEVCOLL_MAX_RANKS; p++)
        if (g->pidfd[p] >= 0) {
            fds[n] = (struct pollfd){.fd = g->pidfd[p], .events = POLLIN};
            rank_of[n++] = p;
        }
    for (;;) {
        if (poll(fds, (nfds_t)n, -1) < 0) {
            if (errno == EINTR)
                continue;
            return NULL;
        }
        if (fds[0].revents)
            return NULL; /* the group is going away */
        for (int i = 1; i < n; i++)
            if (fds[i].revents) {
                atomic_store(&g->dead_rank, rank_of[i]);
                braid__devcoll_raise_abort(g); /* every waiting block gives up */
                return NULL;
            }
    }
}

/* Watch every peer process other than this one; without pidfds (kernels
 * before 5.3) the kernels' own timeout is the only bound. */
static void watch_start(braid_pg *pg, struct braid_devcoll_group *g, const region_record *recs)
{
    int any = 0;
    for (int p = 0; p < pg->size; p++) {
        if (p == pg->rank || braid__is_this_process((uint32_t)recs[p].pid, recs[p].pidns))
            continue;
        if (!braid__pid_is_ours(recs[p].pidns)) {
            /* Its pid names some other process here: not watched (the
             * kernels' own timeout bounds a wait on it). */
            BRAID_INFO("rank %d: device collectives: rank %d runs in another pid namespace; its process is not "
                       "watched",
                       pg->rank, p);
            continue;
        }
        g->pidfd[p] = (int)syscall(SYS_pidfd_open, (pid_t)recs[p].pid, 0);
        if (g->pidfd[p] < 0 && errno == ESRCH) { /* gone already */
            atomic_store(&g->dead_rank, p);
            braid__devcoll_raise_abort(g);
        }
        any |= g->pidfd[p] >= 0;
    }
    if (!any)
        return;
    g->stop_fd = eventfd(0, EFD_CLOEXEC);
    if (g->stop_fd >= 0 && pthread_create(&g->watch, NULL, watch_main, g) == 0)
        g->watching = 1;
    else
        BRAID_INFO("rank %d: device collectives: no watchdog on the peer processes: %s", pg->rank, strerror(errno));
}

/* Blocks a call may use: the smallest SM count of the group divided by
 * the most ranks on one GPU, at least 1. A block spins while it waits for
 * its peers' same block, so every block of every rank on a GPU must fit
 * on it at once. Every rank computes it from the same records, so all
 * agree. */
static int group_blocks(const region_record *recs, int n)
{
    int sms = BRAID_DEVCOLL_MAX_BLOCKS, share = 1;
    for (int p = 0; p < n; p++) {
        if (recs[p].sm_count > 0 && recs[p].sm_count < sms)
            sms = recs[p].sm_count;
        int same = 0;
        for (int q = 0; q < n; q++)
            same += strcmp(recs[p].bus, recs[q].bus) == 0;
        if (same > share)
            share = same;
    }
    return sms / share > 0 ? sms / share : 1;
}

/* How the ranks swap their records and their answers: through the store
 * while the group forms, or with host collectives at its first device call. */
typedef struct {
    braid_status (*gather)(braid_pg *pg, const region_record *mine, region_record *recs);
    /* step names the round ("ok", "closed"): each is a fresh exchange */
    braid_status (*all_ok)(braid_pg *pg, const char *step, int ok, int *all);
} swap_ops;

static braid_status store_gather(braid_pg *pg, const region_record *mine, region_record *recs)
{
    char key[64];
    size_t len;
    snprintf(key, sizeof(key), "dcoll/%d", pg->rank);
    BRAID_CHECK(braid__store_set(pg->store, key, mine, sizeof(*mine)));
    for (int p = 0; p < pg->size; p++) {
        snprintf(key, sizeof(key), "dcoll/%d", p);
        BRAID_CHECK(braid__store_get(pg->store, key, &recs[p], sizeof(recs[p]), &len, braid__pg_init_wait_ms(pg)));
        if (len != sizeof(recs[p]))
            return braid__error(BRAID_ERR_PEER, "rank %d: rank %d published a malformed device region record",
                                pg->rank, p);
    }
    return BRAID_OK;
}

static braid_status store_all_ok(braid_pg *pg, const char *step, int ok, int *all)
{
    char key[64];
    uint32_t v = (uint32_t)ok, got;
    size_t len;
    snprintf(key, sizeof(key), "dcoll_%s/%d", step, pg->rank);
    BRAID_CHECK(braid__store_set(pg->store, key, &v, sizeof(v)));
    *all = 1;
    for (int p = 0; p < pg->size; p++) {
        snprintf(key, sizeof(key), "dcoll_%s/%d", step, p);
        BRAID_CHECK(braid__store_get(pg->store, key, &got, sizeof(got), &len, braid__pg_init_wait_ms(pg)));
        if (len != sizeof(got))
            return braid__error(BRAID_ERR_PEER, "rank %d: rank %d published a malformed device region answer",
                                pg->rank, p);
        *all &= got == 1;
    }
    return BRAID_OK;
}

/* Over the group's own (authenticated) connections, issued like any
 * call: every rank runs them at the same point of its call sequence. */
static braid_status coll_gather(braid_pg *pg, const region_record *mine, region_record *recs)
{
    return braid_allgather(pg, mine, recs, sizeof(*mine), BRAID_U8, NULL, NULL);
}

static braid_status coll_all_ok(braid_pg *pg, const char *step, int ok, int *all)
{
    (void)step; /* collectives are matched by their order */
    int32_t mine = ok, min = 0;
    BRAID_CHECK(braid_allreduce(pg, &mine, &min, 1, BRAID_I32, BRAID_MIN, NULL, NULL));
    *all = min == 1;
    return BRAID_OK;
}

static const swap_ops by_store = {store_gather, store_all_ok};
static const swap_ops by_collectives = {coll_gather, coll_all_ok};

/* Map every peer's region and agree, all or nothing; recs are every
 * rank's records. On: pg->devcoll is ready. Off: the region is freed. */
static braid_status decide(braid_pg *pg, const swap_ops *swap, const region_record *recs)
{
    struct braid_devcoll_group *g = pg->devcoll;
    int ok = g != NULL;
    for (int p = 0; ok && p < pg->size; p++) {
        if (p == pg->rank)
            continue;
        if (recs[p].ok != 1 || pg->host_hash[p] != pg->host_hash[pg->rank])
            ok = 0; /* a rank without a region, or on another host */
        else
            ok = map_peer(pg, g, p, &recs[p]);
    }
    if (g)
        g->exported = 1; /* from here some peer may have mapped it */
    int all_ok = 0;
    braid_status st = swap->all_ok(pg, "ok", ok, &all_ok);
    pg->devcoll_agreed = 1;
    if (st != BRAID_OK || !all_ok) {
        /* Off: every rank closes what it mapped, and frees its own region
         * only once every rank has. */
        int all_closed = 0;
        if (g)
            braid__devcoll_close_peers(g);
        if (st == BRAID_OK)
            st = swap->all_ok(pg, "closed", 1, &all_closed);
        if (g) {
            g->peers_let_go = all_closed;
            group_free(g);
        }
        pg->devcoll = NULL;
        if (st == BRAID_OK)
            BRAID_INFO("rank %d: device collectives off: not every rank has a mapped region", pg->rank);
        return st;
    }
    g->peer[pg->rank] = g->region;
    g->one_process = 1;
    for (int p = 0; p < pg->size; p++)
        g->one_process &= braid__is_this_process((uint32_t)recs[p].pid, recs[p].pidns);
    g->max_blocks = group_blocks(recs, pg->size);
    watch_start(pg, g, recs);
    g->ready = 1;
    BRAID_INFO("rank %d: device collectives on: every rank mapped every region; %d blocks a call at most",
               pg->rank, g->max_blocks);
    return BRAID_OK;
}

static braid_status check_records(braid_pg *pg, const region_record *recs)
{
    for (int p = 0; p < pg->size; p++)
        if (memchr(recs[p].bus, '\0', sizeof(recs[p].bus)) == NULL || recs[p].ok > 2)
            return braid__error(BRAID_ERR_PEER, "rank %d: rank %d sent a malformed device region record", pg->rank,
                                p);
    return BRAID_OK;
}

void braid__devcoll_prepare(braid_pg *pg)
{
    int device = -1;
    if (!wanted(pg))
        return;
    pg->devcoll_no_context = !braid__cuda_context_seen();
    if (pg->devcoll_no_context || !braid__cuda_available())
        return;
    if (cudaGetDevice(&device) != cudaSuccess) {
        (void)cudaGetLastError();
        return;
    }
    pg->devcoll = region_make(pg, device);
}

/* Kernels reach peers' regions only on one host; every rank knows every
 * host once the group has formed, so each decides this alike, unasked. */
static int spans_hosts(const braid_pg *pg)
{
    for (int p = 1; p < pg->size; p++)
        if (pg->host_hash[p] != pg->host_hash[0])
            return 1;
    return 0;
}

braid_status braid__devcoll_exchange(braid_pg *pg)
{
    if (!wanted(pg))
        return BRAID_OK;
    if (spans_hosts(pg)) {
        pg->devcoll_agreed = 1;
        if (pg->devcoll)
            group_free(pg->devcoll); /* never exported: nobody maps it */
        pg->devcoll = NULL;
        BRAID_INFO("rank %d: device collectives off: the group spans hosts", pg->rank);
        return BRAID_OK;
    }
    region_record none, recs[BRAID_DEVCOLL_MAX_RANKS];
    memset(&none, 0, sizeof(none));
    none.ok = pg->devcoll_no_context ? 2 : 0;
    BRAID_CHECK(store_gather(pg, pg->devcoll ? &pg->devcoll->mine : &none, recs));
    BRAID_CHECK(check_records(pg, recs));
    for (int p = 0; p < pg->size; p++)
        if (recs[p].ok == 2)
            return BRAID_OK; /* a rank has no context yet: all decide at the first device call */
    return decide(pg, &by_store, recs);
}

braid_status braid__devcoll_agree(braid_pg *pg, int device)
{
    if (pg->devcoll_agreed || !wanted(pg))
        return BRAID_OK;
    if (pg->devcoll && pg->devcoll->device != device) {
        group_free(pg->devcoll); /* made at creation on another device than the calls use */
        pg->devcoll = NULL;
    }
    if (!pg->devcoll)
        pg->devcoll = region_make(pg, device);
    region_record none, recs[BRAID_DEVCOLL_MAX_RANKS];
    memset(&none, 0, sizeof(none));
    braid_status st = by_collectives.gather(pg, pg->devcoll ? &pg->devcoll->mine : &none, recs);
    if (st == BRAID_OK)
        st = check_records(pg, recs);
    if (st != BRAID_OK) {
        pg->devcoll_agreed = 1;
        if (pg->devcoll)
            group_free(pg->devcoll);
        pg->devcoll = NULL;
        return st;
    }
    return decide(pg, &by_collectives, recs);
}

void braid__devcoll_abort(braid_pg *pg)
{
    struct braid_devcoll_group *g = pg->devcoll;
    if (g && g->flags_host)
        braid__devcoll_raise_abort(g);
}

void braid__devcoll_release(braid_pg *pg)
{
    if (pg->devcoll)
        group_free(pg->devcoll);
    pg->devcoll = NULL;
}

static braid_devcoll_fault *fault_host(struct braid_devcoll_group *g)
{
    return (braid_devcoll_fault *)(g->flags_host + 4);
}

/* A kernel gave up, or a peer process exited: the group is broken. */
int braid__devcoll_faulted(struct braid_devcoll_group *g)
{
    return fault_host(g)->code != BRAID_DEVCOLL_OK || atomic_load(&g->dead_rank) >= 0;
}

static void fault_words(braid_pg *pg, const char *op, char *text, size_t cap)
{
    braid_devcoll_fault *f = fault_host(pg->devcoll);
    int dead = atomic_load(&pg->devcoll->dead_rank);
    if (dead >= 0 && f->code != BRAID_DEVCOLL_TIMED_OUT) {
        snprintf(text, cap, "rank %d: %s: the device collective was aborted: rank %d's process exited", pg->rank,
                 op, dead);
        return;
    }
    snprintf(text, cap, "rank %d: %s: the device collective %s waiting for rank %d (block %u)", pg->rank, op,
             f->code == BRAID_DEVCOLL_TIMED_OUT ? "timed out" : "was aborted", (int)f->peer, f->block);
}

int braid__devcoll_fault(braid_pg *pg, char *text, size_t cap)
{
    if (!pg || !pg->devcoll || !pg->devcoll->flags_host || !braid__devcoll_faulted(pg->devcoll))
        return 0;
    fault_words(pg, "a device call", text, cap);
    return 1;
}

/* An earlier kernel gave up: the group is broken. */
static braid_status fault_status(braid_pg *pg, const char *op)
{
    char text[256];
    fault_words(pg, op, text, sizeof(text));
    braid_status st = braid__error(fault_host(pg->devcoll)->code == BRAID_DEVCOLL_TIMED_OUT ? BRAID_ERR_TIMEOUT
                                                                                             : BRAID_ERR_PEER,
                                   "%s", text);
    braid__pg_fail(pg, st);
    return st;
}

int braid__devcoll_takes(braid_pg *pg, const braid_coll *coll, int device)
{
    struct braid_devcoll_group *g = pg->devcoll;
    if (!g || !g->ready || device != g->device || coll->count == 0 || coll->refused)
        return 0;
    return coll->kind == BRAID_COLL_ALLREDUCE || coll->kind == BRAID_COLL_BROADCAST;
}

braid_status braid__devcoll_run(braid_pg *pg, const braid_coll *coll, void *stream, braid_work **work)
{
    struct braid_devcoll_group *g = pg->devcoll;
    const char *op = braid__kind(coll->kind)->name;
    if (braid__devcoll_faulted(g))
        return fault_status(pg, op);
    BRAID_CHECK(braid__pg_check_usable(pg, op));

    braid_devcoll_args a;
    memset(&a, 0, sizeof(a));
    size_t bytes = coll->count * braid_dtype_size(coll->dtype);
    if (coll->kind == BRAID_COLL_BROADCAST)
        a.algo = BRAID_DEVCOLL_BROADCAST;
    else /* one-shot reads every peer's whole input: cheapest while latency rules */
        a.algo = bytes <= (size_t)braid__param_int("BRAID_DEVCOLL_ONESHOT_BYTES", 262144) ? BRAID_DEVCOLL_ONESHOT
                                                                                     : BRAID_DEVCOLL_TWOSHOT;
    a.dtype = coll->dtype;
    a.op = coll->op;
    a.rank = pg->rank;
    a.nranks = pg->size;
    a.root = coll->root;
    a.nblocks = braid__devcoll_blocks_for(bytes, g->max_blocks);
    a.send = coll->send;
    a.recv = coll->recv;
    a.count = coll->count;
    memcpy(&a.scalar, coll->scalar, sizeof(coll->scalar));
    if (a.op == BRAID_MULSUM && !coll->premul)
        a.op = BRAID_SUM; /* already multiplied */
    for (int p = 0; p < pg->size; p++) {
        a.signal[p] = (braid_devcoll_signal *)g->peer[p];
        a.data[p] = g->peer[p] + braid__devcoll_data_offset();
    }
    a.seg_bytes = SEG_BYTES;
    a.abort = (const volatile uint32_t *)g->flags_dev;
    a.fault = (braid_devcoll_fault *)((uint32_t *)g->flags_dev + 4);
    a.timeout_ns = (uint64_t)pg->timeout_ms * 1000000u;
    BRAID_CHECK(braid__cuda_devcoll(&a, stream));
    braid__devcoll_note_launch(g, stream);
    if (work)
        return braid__work_completed(pg, work); /* ordered on the stream, as NCCL's calls are */
    BRAID_CHECK(braid__cuda_stream_sync(stream));
    /* Only the kernel's own verdict: a peer that finished this call and
     * exited before we looked did not fail it (the next call says so). */
    if (fault_host(g)->code != BRAID_DEVCOLL_OK)
        return fault_status(pg, op);
    return BRAID_OK;
}
