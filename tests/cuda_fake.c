/* Host implementation of tests/cuda_fake/cuda_runtime_api.h (see there).
 * One global lock and condition variable keep it simple: every stream is
 * a thread that runs its queue in order; events count records and
 * completions, and a wait or synchronize targets the latest record at the
 * time of the call, as CUDA's do. Also defines the kernel entry points of
 * braid_cuda.h (braid__cuda_reduce on the CPU engine, the others
 * unsupported), so libbraid_internal's cuda_stub.o is never pulled in next
 * to the real cuda_device.c this test compiles.
 *
 * Device memory and inter-process events are memfd mappings, so that IPC
 * handles ({pid, fd, size}) open in other processes through
 * /proc/<pid>/fd/<fd>. A shared event is recorded in one process and
 * waited on in another, where no condition variable reaches: waits on one
 * poll.
 *
 * CUDA's rules that a host-only model easily forgets are kept (see
 * cuda_fake/cuda_runtime_api.h): one callback thread runs every host
 * function of the process in turn; a CUDA call from a host function
 * aborts; the legacy stream and blocking streams wait for each other's
 * earlier work; the synchronous copy/set/pinned-allocation calls go
 * through the legacy stream; the first launch of a kernel synchronizes
 * the device unless braid__cuda_preload ran. A design that holds a stream
 * against one of these hangs here as it does on a GPU. */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "braid_cuda.h"
#include "cuda_runtime_api.h"
#include "reduce/reduce.h"
#include "status.h"

enum { OP_COPY, OP_RECORD, OP_WAIT, OP_HOSTFN, OP_KERNEL, OP_NOP, OP_FLAG };

/* Work of another stream an op waits for first (legacy-stream implicit
 * synchronization): stream id and its op count at the time. */
typedef struct {
    unsigned id;
    uint64_t target;
} fake_after;

typedef struct fake_op {
    int kind;
    void *dst;
    const void *src;
    size_t n;
    struct fake_event *ev;
    uint64_t gen;
    cudaHostFn_t fn;
    void *arg;
    const _Atomic uint32_t *flag; /* OP_FLAG: wait until *flag reaches n */
    fake_after *after;
    int nafter;
    struct fake_op *next;
} fake_op;

struct fake_stream {
    pthread_t thread;
    fake_op *head, *tail;
    int stop;
    int blocking;       /* synchronizes with the legacy stream */
    unsigned id;
    uint64_t enq, done; /* ops queued and finished */
    int capturing;      /* 1 active, 2 invalidated (cudaStreamBeginCapture) */
    fake_op *captured;  /* recorded while capturing: never run */
    struct fake_stream *next_stream;
};

/* A host function handed to the callback thread. */
typedef struct fake_cb {
    cudaHostFn_t fn;
    void *arg;
    int done;
    struct fake_cb *next;
} fake_cb;

/* An event's generation counters: in the event itself, or for an
 * inter-process event in a memfd mapping other processes open too. */
typedef struct {
    _Atomic uint64_t recorded, completed;
} fake_counters;

struct fake_event {
    fake_counters own;
    fake_counters *c; /* &own, or the shared mapping */
    int shared;
    int fd;           /* the shared mapping's memfd when we made it; else -1 */
};

typedef struct fake_alloc {
    char *p;
    size_t n;
    int fd;     /* the owner's memfd; -1 for a mapping opened from a handle */
    struct fake_alloc *next;
} fake_alloc;

#define FAKE_IPC_MAGIC 0x46495043u /* "CPIF" */

typedef struct {
    uint32_t magic;
    int32_t pid, fd;
    uint64_t size;
} fake_ipc_handle;

static pthread_mutex_t G = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t GC = PTHREAD_COND_INITIALIZER;
static struct fake_stream *streams;
static struct fake_stream *legacy;
static fake_alloc *allocs;
static __thread unsigned rnd_state;
static unsigned next_stream_id;
/* The process's callback thread and its queue (cudaLaunchHostFunc). */
static fake_cb *cb_head, *cb_tail;
static int cb_started;
/* Set on the callback thread: any CUDA call there aborts. */
static __thread int in_host_fn;
/* braid__cuda_preload ran; else kernels "load" (synchronize the device)
 * at their first launch. */
static int preloaded;
static unsigned char kernel_loaded[BRAID_DTYPE_COUNT][BRAID_OP_COUNT];

/* CUDA forbids CUDA calls from a host function; the real runtime may
 * deadlock or fail there, the stand-in stops with the caller's name. */
#define GUARD() guard(__func__)
static void guard(const char *fn)
{
    if (in_host_fn) {
        fprintf(stderr, "cuda fake: %s called from a host function (cudaLaunchHostFunc): CUDA calls are not "
                        "allowed there\n", fn);
        abort();
    }
}
/* A CUDA context exists once the program made a runtime call that needs
 * one (as the primary context is made on real CUDA); cudaGetDeviceCount,
 * the error queries and cudaPointerGetAttributes make none. Until then
 * braid's cuda_device.c must see no device memory and stay off CUDA. */
static atomic_int context_made;

int cuda_fake_context_exists(void)
{
    return atomic_load(&context_made);
}

#define CONTEXT() atomic_store(&context_made, 1)

/* Kernels launched by this process (cuda_fake_kernel_launches()). */
static _Atomic unsigned long kernel_launches;

unsigned long cuda_fake_kernel_launches(void)
{
    return kernel_launches;
}

/* cudaMemcpyAsync calls made by this process (cuda_fake_copies()). */
static _Atomic unsigned long async_copies;

unsigned long cuda_fake_copies(void)
{
    return async_copies;
}

static void jitter(void)
{
    if (!rnd_state)
        rnd_state = (unsigned)(uintptr_t)&rnd_state ^ (unsigned)getpid();
    rnd_state = rnd_state * 1103515245u + 12345u;
    unsigned us = (rnd_state >> 16) % 300;
    if (us > 150)
        usleep(us);
}

/* Wait (holding G) until e completed generation gen. */
static void event_wait_locked(struct fake_event *e, uint64_t gen)
{
    while (e->c->completed < gen) {
        if (e->shared) {
            pthread_mutex_unlock(&G);
            usleep(20);
            pthread_mutex_lock(&G);
        } else {
            pthread_cond_wait(&GC, &G);
        }
    }
}

/* A shared mapping of n bytes backed by a new memfd. */
static void *shared_map(size_t n, int *fd_out)
{
    int fd = memfd_create("cuda-fake", MFD_CLOEXEC);
    if (fd < 0)
        return NULL;
    if (ftruncate(fd, (off_t)n) != 0) {
        close(fd);
        return NULL;
    }
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        close(fd);
        return NULL;
    }
    *fd_out = fd;
    return p;
}

static void handle_put(char out[64], int fd, size_t size)
{
    fake_ipc_handle h = {.magic = FAKE_IPC_MAGIC, .pid = (int32_t)getpid(), .fd = fd, .size = size};
    memset(out, 0, 64);
    memcpy(out, &h, sizeof(h));
}

/* Device memory (cudaMalloc) keeps, past its n bytes, the pids of the
 * other processes that mapped it through an IPC handle and have not closed
 * it, one slot per open: CUDA leaves a cudaFree of such memory undefined
 * while they live, and the stand-in aborts. A process that died has lost
 * its mappings, as with CUDA, and no longer counts. */
#define IMPORTER_SLOTS 16
static size_t with_count(size_t n)
{
    return (n + 63) / 64 * 64 + IMPORTER_SLOTS * sizeof(int);
}

static _Atomic int *importers(char *m, size_t n)
{
    return (_Atomic int *)(m + (n + 63) / 64 * 64);
}

static void importer_add(char *m, size_t n)
{
    _Atomic int *slot = importers(m, n);
    for (int i = 0; i < IMPORTER_SLOTS; i++) {
        int free_slot = 0;
        if (atomic_compare_exchange_strong(&slot[i], &free_slot, (int)getpid()))
            return;
    }
    fprintf(stderr, "cuda fake: more than %d open IPC mappings of one allocation\n", IMPORTER_SLOTS);
    abort();
}

static void importer_remove(char *m, size_t n)
{
    _Atomic int *slot = importers(m, n);
    for (int i = 0; i < IMPORTER_SLOTS; i++) {
        int me = (int)getpid();
        if (atomic_compare_exchange_strong(&slot[i], &me, 0))
            return;
    }
}

/* Live (not exited, not a zombie) processes holding a mapping. */
static int importers_alive(char *m, size_t n)
{
    _Atomic int *slot = importers(m, n);
    int alive = 0;
    for (int i = 0; i < IMPORTER_SLOTS; i++) {
        int pid = atomic_load(&slot[i]);
        if (pid <= 0 || kill(pid, 0) != 0)
            continue;
        char path[64], stat[256] = "";
        snprintf(path, sizeof(path), "/proc/%d/stat", pid);
        FILE *f = fopen(path, "r");
        if (f) {
            if (!fgets(stat, sizeof(stat), f))
                stat[0] = '\0';
            fclose(f);
        }
        const char *state = strrchr(stat, ')');
        if (state && (state[2] == 'Z' || state[2] == 'X'))
            continue;
        alive++;
    }
    return alive;
}

/* Map another process's memfd named by a handle (device memory: with its
 * importers' count, which the caller takes part in). */
static void *handle_map(const char in[64], size_t *size, int counted)
{
    fake_ipc_handle h;
    memcpy(&h, in, sizeof(h));
    if (h.magic != FAKE_IPC_MAGIC || h.size == 0)
        return NULL;
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)h.pid, (int)h.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    void *p = mmap(NULL, counted ? with_count(h.size) : h.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return NULL;
    *size = h.size;
    return p;
}

static struct fake_stream *stream_by_id_locked(unsigned id)
{
    for (struct fake_stream *t = streams; t; t = t->next_stream)
        if (t->id == id)
            return t;
    return NULL;
}

/* A destroyed stream had finished all its work. */
static int after_done_locked(const fake_after *a)
{
    struct fake_stream *t = stream_by_id_locked(a->id);
    return !t || t->done >= a->target;
}

static void *callback_main(void *arg)
{
    (void)arg;
    in_host_fn = 1;
    pthread_mutex_lock(&G);
    for (;;) {
        while (!cb_head)
            pthread_cond_wait(&GC, &G);
        fake_cb *c = cb_head;
        cb_head = c->next;
        if (!cb_head)
            cb_tail = NULL;
        pthread_mutex_unlock(&G);
        c->fn(c->arg);
        pthread_mutex_lock(&G);
        c->done = 1;
        pthread_cond_broadcast(&GC);
    }
    return NULL;
}

/* Runs fn on the process's one callback thread, after the host functions
 * other streams handed it earlier, and waits for it (holding G): a host
 * function that blocks holds every stream's host functions, as in CUDA. */
static void host_fn_locked(cudaHostFn_t fn, void *arg)
{
    if (!cb_started) {
        pthread_t t;
        if (pthread_create(&t, NULL, callback_main, NULL) != 0)
            abort();
        pthread_detach(t);
        cb_started = 1;
    }
    fake_cb c = {.fn = fn, .arg = arg};
    if (cb_tail)
        cb_tail->next = &c;
    else
        cb_head = &c;
    cb_tail = &c;
    pthread_cond_broadcast(&GC);
    while (!c.done)
        pthread_cond_wait(&GC, &G);
}

static void *stream_main(void *arg)
{
    struct fake_stream *s = arg;
    pthread_mutex_lock(&G);
    for (;;) {
        while (!s->head && !s->stop)
            pthread_cond_wait(&GC, &G);
        if (!s->head)
            break;
        fake_op *op = s->head;
        for (int i = 0; i < op->nafter; i++)
            while (!after_done_locked(&op->after[i]))
                pthread_cond_wait(&GC, &G);
        switch (op->kind) {
        case OP_COPY:
            pthread_mutex_unlock(&G);
            jitter();
            memcpy(op->dst, op->src, op->n);
            pthread_mutex_lock(&G);
            break;
        case OP_RECORD:
            if (op->ev->c->completed < op->gen)
                op->ev->c->completed = op->gen;
            break;
        case OP_WAIT:
            event_wait_locked(op->ev, op->gen);
            break;
        case OP_HOSTFN:
            host_fn_locked(op->fn, op->arg);
            break;
        case OP_KERNEL:
            pthread_mutex_unlock(&G);
            jitter();
            op->fn(op->arg);
            pthread_mutex_lock(&G);
            break;
        case OP_NOP:
            break;
        case OP_FLAG:
            pthread_mutex_unlock(&G);
            while ((int32_t)(atomic_load(op->flag) - (uint32_t)op->n) < 0)
                usleep(20);
            pthread_mutex_lock(&G);
            break;
        }
        s->head = op->next;
        if (!s->head)
            s->tail = NULL;
        s->done++;
        free(op->after);
        free(op);
        pthread_cond_broadcast(&GC);
    }
    pthread_mutex_unlock(&G);
    return NULL;
}

static struct fake_stream *stream_new_locked(int blocking)
{
    struct fake_stream *s = calloc(1, sizeof(*s));
    if (!s)
        abort();
    s->blocking = blocking;
    s->id = ++next_stream_id;
    pthread_create(&s->thread, NULL, stream_main, s);
    s->next_stream = streams;
    streams = s;
    return s;
}

static struct fake_stream *resolve_locked(cudaStream_t s)
{
    if (s)
        return s;
    if (!legacy)
        legacy = stream_new_locked(1);
    return legacy;
}

static void enqueue(cudaStream_t st, fake_op op)
{
    fake_op *o = malloc(sizeof(*o));
    if (!o)
        abort();
    *o = op;
    o->next = NULL;
    pthread_mutex_lock(&G);
    struct fake_stream *s = resolve_locked(st);
    if (s->capturing) { /* recorded into the graph, not run */
        o->after = NULL;
        o->next = s->captured;
        s->captured = o;
        pthread_mutex_unlock(&G);
        return;
    }
    /* Legacy-stream implicit synchronization: work on the legacy stream
     * waits for the work queued before it on every blocking stream, and
     * work on a blocking stream for the legacy stream's. */
    int n = 0;
    for (struct fake_stream *t = streams; t; t = t->next_stream)
        n++;
    o->after = calloc((size_t)n, sizeof(*o->after));
    if (!o->after)
        abort();
    o->nafter = 0;
    for (struct fake_stream *t = streams; t; t = t->next_stream)
        if (t != s && t->blocking && s->blocking && (s == legacy || t == legacy) && t->enq > t->done)
            o->after[o->nafter++] = (fake_after){t->id, t->enq};
    s->enq++;
    if (s->tail)
        s->tail->next = o;
    else
        s->head = o;
    s->tail = o;
    pthread_cond_broadcast(&GC);
    pthread_mutex_unlock(&G);
}

/* Illegal on a capturing stream: fails and invalidates the capture. */
static int capture_refuses_locked(struct fake_stream *s)
{
    if (!s->capturing)
        return 0;
    s->capturing = 2;
    return 1;
}

static void drain_locked(struct fake_stream *s)
{
    while (s->head)
        pthread_cond_wait(&GC, &G);
}

const char *cudaGetErrorString(cudaError_t e)
{
    return e == cudaSuccess ? "no error" : "fake cuda error";
}

const char *cudaGetErrorName(cudaError_t e)
{
    return e == cudaSuccess ? "cudaSuccess" : "cudaErrorFake";
}

cudaError_t cudaGetLastError(void)
{
    GUARD();
    return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int *n)
{
    GUARD();
    *n = 1;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *d)
{
    GUARD();
    *d = 0;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int d)
{
    GUARD();
    CONTEXT();
    return d == 0 ? cudaSuccess : cudaErrorInvalidDevice;
}

cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int d)
{
    GUARD();
    (void)d;
    const char *no_ipc = getenv("CUDA_FAKE_NO_IPC");
    *v = a == cudaDevAttrIpcEventSupport && no_ipc && no_ipc[0] == '1' ? 0 : 1;
    if (a == cudaDevAttrMultiProcessorCount)
        *v = 12; /* device collectives spread a large call over 12 / (ranks on the GPU) blocks */
    return cudaSuccess;
}

static const char *bus_id(void)
{
    const char *id = getenv("CUDA_FAKE_BUS_ID");
    return id && id[0] ? id : "0000:01:00.0";
}

cudaError_t cudaDeviceGetPCIBusId(char *id, int len, int device)
{
    GUARD();
    if (device != 0 || len < 13)
        return cudaErrorInvalidValue;
    snprintf(id, (size_t)len, "%s", bus_id());
    return cudaSuccess;
}

/* Only this process's own device is visible. */
cudaError_t cudaDeviceGetByPCIBusId(int *device, const char *id)
{
    GUARD();
    if (strcmp(id, bus_id()) != 0)
        return cudaErrorInvalidDevice;
    *device = 0;
    return cudaSuccess;
}

cudaError_t cudaDeviceCanAccessPeer(int *can, int device, int peer)
{
    GUARD();
    (void)device, (void)peer;
    *can = 0;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    GUARD();
    CONTEXT();
    pthread_mutex_lock(&G);
    for (struct fake_stream *s = streams; s; s = s->next_stream)
        drain_locked(s);
    pthread_mutex_unlock(&G);
    return cudaSuccess;
}

/* cudaPointerGetAttributes calls so far (cuda_fake_pointer_queries()):
 * how often a call classified its buffers. */
static _Atomic unsigned long pointer_queries;

unsigned long cuda_fake_pointer_queries(void)
{
    return pointer_queries;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p)
{
    GUARD();
    pointer_queries++;
    memset(a, 0, sizeof(*a));
    a->device = -1;
    pthread_mutex_lock(&G);
    for (fake_alloc *f = allocs; f; f = f->next)
        if ((const char *)p >= f->p && (const char *)p < f->p + f->n) {
            a->type = cudaMemoryTypeDevice;
            a->device = 0;
            a->devicePointer = (void *)p;
        }
    pthread_mutex_unlock(&G);
    return cudaSuccess;
}

static void alloc_add(char *m, size_t n, int fd, fake_alloc *f)
{
    f->p = m;
    f->n = n;
    f->fd = fd;
    pthread_mutex_lock(&G);
    f->next = allocs;
    allocs = f;
    pthread_mutex_unlock(&G);
}

/* Remove p's record; returns it (the caller frees it) or NULL. */
static fake_alloc *alloc_take(const void *p)
{
    fake_alloc *found = NULL;
    pthread_mutex_lock(&G);
    for (fake_alloc **f = &allocs; *f; f = &(*f)->next)
        if ((*f)->p == p) {
            found = *f;
            *f = found->next;
            break;
        }
    pthread_mutex_unlock(&G);
    return found;
}

cudaError_t cudaMalloc(void **p, size_t n)
{
    GUARD();
    CONTEXT();
    fake_alloc *f = malloc(sizeof(*f));
    int fd = -1;
    size_t len = n ? n : 1;
    char *m = f ? shared_map(with_count(len), &fd) : NULL;
    if (!m) {
        free(f);
        return cudaErrorMemoryAllocation;
    }
    memset(m, 0xEE, len); /* device memory starts as garbage */
    memset((void *)importers(m, len), 0, IMPORTER_SLOTS * sizeof(int));
    alloc_add(m, len, fd, f);
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
    GUARD();
    CONTEXT();
    if (!p)
        return cudaSuccess;
    cudaDeviceSynchronize(); /* as CUDA's cudaFree does */
    fake_alloc *f = alloc_take(p);
    if (!f)
        return cudaErrorInvalidValue;
    if (f->fd < 0) { /* opened from a handle: cudaIpcCloseMemHandle's */
        alloc_add(f->p, f->n, f->fd, f);
        return cudaErrorInvalidValue;
    }
    int mapped = importers_alive(f->p, f->n);
    if (mapped) {
        fprintf(stderr, "cuda fake: cudaFree(%p) while %d other process(es) still map it (cudaIpcOpenMemHandle "
                        "without cudaIpcCloseMemHandle): their kernels may still read it\n", p, mapped);
        abort();
    }
    munmap(f->p, with_count(f->n));
    close(f->fd);
    free(f);
    return cudaSuccess;
}

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *h, void *p)
{
    GUARD();
    int fd = -1;
    size_t n = 0;
    pthread_mutex_lock(&G);
    for (fake_alloc *f = allocs; f; f = f->next)
        if (f->p == p && f->fd >= 0)
            fd = f->fd, n = f->n;
    pthread_mutex_unlock(&G);
    if (fd < 0)
        return cudaErrorInvalidValue; /* not the base of an allocation of ours */
    handle_put(h->reserved, fd, n);
    return cudaSuccess;
}

/* CUDA opens IPC handles only in other processes: in the process that
 * made one, cuIpcOpenMemHandle and cuIpcOpenEventHandle fail with "invalid
 * device context". Ranks that are threads of one process must not try. */
static int own_handle(const char in[64])
{
    fake_ipc_handle h;
    memcpy(&h, in, sizeof(h));
    return h.magic == FAKE_IPC_MAGIC && h.pid == (int32_t)getpid();
}

cudaError_t cudaIpcOpenMemHandle(void **p, cudaIpcMemHandle_t h, unsigned flags)
{
    GUARD();
    CONTEXT();
    (void)flags;
    if (own_handle(h.reserved))
        return cudaErrorInvalidContext;
    fake_alloc *f = malloc(sizeof(*f));
    size_t n = 0;
    char *m = f ? handle_map(h.reserved, &n, 1) : NULL;
    if (!m) {
        free(f);
        return cudaErrorMapBufferObjectFailed;
    }
    importer_add(m, n);
    alloc_add(m, n, -1, f);
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaIpcCloseMemHandle(void *p)
{
    GUARD();
    cudaDeviceSynchronize();
    fake_alloc *f = alloc_take(p);
    if (!f)
        return cudaErrorInvalidValue;
    if (f->fd >= 0) { /* our own allocation: cudaFree's */
        alloc_add(f->p, f->n, f->fd, f);
        return cudaErrorInvalidValue;
    }
    importer_remove(f->p, f->n);
    munmap(f->p, with_count(f->n));
    free(f);
    return cudaSuccess;
}

/* A synchronous call on the legacy stream: it waits for the legacy
 * stream, which waits for the work queued on every blocking stream. */
static void legacy_sync(void)
{
    enqueue(NULL, (fake_op){.kind = OP_NOP});
    pthread_mutex_lock(&G);
    drain_locked(legacy);
    pthread_mutex_unlock(&G);
}

/* Page-locked host allocations (cudaHostAlloc), so that copies between
 * device memory and pageable host memory can be counted
 * (cuda_fake_pageable_bytes()). */
typedef struct fake_pinned {
    char *p;
    size_t n;
    struct fake_pinned *next;
} fake_pinned;
static fake_pinned *pinned;

cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags)
{
    GUARD();
    CONTEXT();
    (void)flags; /* mapped or not: the device pointer is the host pointer */
    legacy_sync();
    fake_pinned *rec = malloc(sizeof(*rec));
    *p = malloc(n ? n : 1);
    if (!*p || !rec) {
        free(*p);
        free(rec);
        return cudaErrorMemoryAllocation;
    }
    pthread_mutex_lock(&G);
    *rec = (fake_pinned){*p, n ? n : 1, pinned};
    pinned = rec;
    pthread_mutex_unlock(&G);
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t n)
{
    GUARD();
    return cudaHostAlloc(p, n, cudaHostAllocDefault);
}

cudaError_t cudaHostGetDevicePointer(void **d, void *h, unsigned flags)
{
    GUARD();
    (void)flags;
    *d = h;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p)
{
    GUARD();
    legacy_sync();
    fake_pinned *found = NULL;
    pthread_mutex_lock(&G);
    for (fake_pinned **f = &pinned; *f; f = &(*f)->next)
        if ((*f)->p == p) {
            found = *f;
            *f = found->next;
            break;
        }
    pthread_mutex_unlock(&G);
    if (!found && p)
        return cudaErrorInvalidValue; /* not from cudaHostAlloc */
    free(found);
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int v, size_t n)
{
    GUARD();
    CONTEXT();
    legacy_sync();
    memset(p, v, n);
    return cudaSuccess;
}

/* Bytes copied from device to host memory by either copy call
 * (cuda_fake_d2h_bytes()). */
static _Atomic unsigned long long d2h_bytes;

unsigned long long cuda_fake_d2h_bytes(void)
{
    return d2h_bytes;
}

static int is_device_locked(const void *p)
{
    for (fake_alloc *f = allocs; f; f = f->next)
        if ((const char *)p >= f->p && (const char *)p < f->p + f->n)
            return 1;
    return 0;
}

/* Bytes copied between device memory and pageable host memory (neither
 * device nor from cudaHostAlloc), either way (cuda_fake_pageable_bytes()). */
static _Atomic unsigned long long pageable_bytes;

unsigned long long cuda_fake_pageable_bytes(void)
{
    return pageable_bytes;
}

static int is_pinned_locked(const void *p)
{
    for (fake_pinned *f = pinned; f; f = f->next)
        if ((const char *)p >= f->p && (const char *)p < f->p + f->n)
            return 1;
    return 0;
}

static void count_d2h(const void *d, const void *s, size_t n)
{
    pthread_mutex_lock(&G);
    int sdev = is_device_locked(s), ddev = is_device_locked(d);
    if (sdev && !ddev)
        d2h_bytes += n;
    if ((sdev && !ddev && !is_pinned_locked(d)) || (ddev && !sdev && !is_pinned_locked(s)))
        pageable_bytes += n;
    pthread_mutex_unlock(&G);
}

cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k)
{
    GUARD();
    CONTEXT();
    (void)k;
    count_d2h(d, s, n);
    legacy_sync();
    memcpy(d, s, n);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st)
{
    GUARD();
    CONTEXT();
    (void)k;
    if (st) { /* pageable host memory cannot be captured */
        pthread_mutex_lock(&G);
        struct fake_stream *fs = resolve_locked(st);
        int pageable = (!is_device_locked(d) && !is_pinned_locked(d)) || (!is_device_locked(s) && !is_pinned_locked(s));
        int refused = pageable && capture_refuses_locked(fs);
        pthread_mutex_unlock(&G);
        if (refused)
            return cudaErrorStreamCaptureUnsupported;
    }
    async_copies++;
    count_d2h(d, s, n);
    enqueue(st, (fake_op){.kind = OP_COPY, .dst = d, .src = s, .n = n});
    return cudaSuccess;
}

/* As height row copies on the stream, which is what it does. */
cudaError_t cudaMemcpy2DAsync(void *d, size_t dpitch, const void *s, size_t spitch, size_t width, size_t height,
                              enum cudaMemcpyKind k, cudaStream_t st)
{
    if (width > dpitch || width > spitch)
        return cudaErrorInvalidValue;
    for (size_t r = 0; r < height; r++) {
        cudaError_t err = cudaMemcpyAsync((char *)d + r * dpitch, (const char *)s + r * spitch, width, k, st);
        if (err != cudaSuccess)
            return err;
    }
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
    GUARD();
    CONTEXT();
    pthread_mutex_lock(&G);
    *s = stream_new_locked(!(flags & cudaStreamNonBlocking));
    pthread_mutex_unlock(&G);
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *s)
{
    GUARD();
    return cudaStreamCreateWithFlags(s, 0);
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    GUARD();
    pthread_mutex_lock(&G);
    drain_locked(s);
    s->stop = 1;
    pthread_cond_broadcast(&GC);
    for (struct fake_stream **p = &streams; *p; p = &(*p)->next_stream)
        if (*p == s) {
            *p = s->next_stream;
            break;
        }
    pthread_mutex_unlock(&G);
    pthread_join(s->thread, NULL);
    free(s);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t st)
{
    GUARD();
    if (!st) {
        legacy_sync();
        return cudaSuccess;
    }
    pthread_mutex_lock(&G);
    struct fake_stream *s = resolve_locked(st);
    if (capture_refuses_locked(s)) {
        pthread_mutex_unlock(&G);
        return cudaErrorStreamCaptureUnsupported;
    }
    drain_locked(s);
    pthread_mutex_unlock(&G);
    return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t st)
{
    GUARD();
    pthread_mutex_lock(&G);
    struct fake_stream *s = resolve_locked(st);
    if (capture_refuses_locked(s)) {
        pthread_mutex_unlock(&G);
        return cudaErrorStreamCaptureUnsupported;
    }
    int idle = s->head == NULL;
    pthread_mutex_unlock(&G);
    return idle ? cudaSuccess : cudaErrorNotReady;
}

struct fake_graph {
    int nodes;
};

cudaError_t cudaStreamBeginCapture(cudaStream_t st, enum cudaStreamCaptureMode mode)
{
    GUARD();
    (void)mode;
    if (!st)
        return cudaErrorStreamCaptureUnsupported; /* the legacy stream cannot be captured */
    pthread_mutex_lock(&G);
    struct fake_stream *s = resolve_locked(st);
    cudaError_t err = s->capturing ? cudaErrorIllegalState : cudaSuccess;
    if (!s->capturing)
        s->capturing = 1;
    pthread_mutex_unlock(&G);
    return err;
}

cudaError_t cudaStreamEndCapture(cudaStream_t st, cudaGraph_t *graph)
{
    GUARD();
    pthread_mutex_lock(&G);
    struct fake_stream *s = resolve_locked(st);
    int was = s->capturing, nodes = 0;
    fake_op *ops = s->captured;
    s->capturing = 0;
    s->captured = NULL;
    pthread_mutex_unlock(&G);
    for (fake_op *o = ops, *next; o; o = next, nodes++) {
        next = o->next;
        free(o);
    }
    *graph = NULL;
    if (was != 1)
        return was ? cudaErrorStreamCaptureInvalidated : cudaErrorIllegalState;
    if (!(*graph = malloc(sizeof(**graph))))
        return cudaErrorMemoryAllocation;
    (*graph)->nodes = nodes;
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
    GUARD();
    free(graph);
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags)
{
    GUARD();
    (void)flags;
    pthread_mutex_lock(&G);
    uint64_t gen = e->c->recorded;
    pthread_mutex_unlock(&G);
    enqueue(s, (fake_op){.kind = OP_WAIT, .ev = e, .gen = gen});
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *c)
{
    GUARD();
    pthread_mutex_lock(&G);
    int capturing = s ? resolve_locked(s)->capturing : 0;
    pthread_mutex_unlock(&G);
    *c = capturing == 1 ? cudaStreamCaptureStatusActive
                        : capturing ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusNone;
    return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *arg)
{
    GUARD();
    CONTEXT();
    enqueue(s, (fake_op){.kind = OP_HOSTFN, .fn = fn, .arg = arg});
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags)
{
    GUARD();
    CONTEXT();
    struct fake_event *ev = calloc(1, sizeof(*ev));
    if (!ev)
        return cudaErrorMemoryAllocation;
    ev->c = &ev->own;
    ev->fd = -1;
    if (flags & cudaEventInterprocess) {
        ev->c = shared_map(sizeof(fake_counters), &ev->fd);
        if (!ev->c) {
            free(ev);
            return cudaErrorMemoryAllocation;
        }
        memset(ev->c, 0, sizeof(fake_counters));
        ev->shared = 1;
    }
    *e = ev;
    return cudaSuccess;
}

/* Kept alive (leaked): a stream may still hold a wait on it, which CUDA
 * allows. A shared event's memfd is closed: no new handle may open it. */
cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    GUARD();
    pthread_mutex_lock(&G);
    if (e->fd >= 0) {
        close(e->fd);
        e->fd = -1;
    }
    pthread_mutex_unlock(&G);
    return cudaSuccess;
}

cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t *h, cudaEvent_t e)
{
    GUARD();
    if (!e->shared || e->fd < 0)
        return cudaErrorInvalidResourceHandle; /* made without cudaEventInterprocess */
    handle_put(h->reserved, e->fd, sizeof(fake_counters));
    return cudaSuccess;
}

cudaError_t cudaIpcOpenEventHandle(cudaEvent_t *e, cudaIpcEventHandle_t h)
{
    GUARD();
    CONTEXT();
    if (own_handle(h.reserved))
        return cudaErrorInvalidContext;
    size_t n = 0;
    fake_counters *c = handle_map(h.reserved, &n, 0);
    if (!c)
        return cudaErrorInvalidResourceHandle;
    struct fake_event *ev = n == sizeof(*c) ? calloc(1, sizeof(*ev)) : NULL;
    if (!ev) {
        munmap(c, n);
        return cudaErrorInvalidResourceHandle;
    }
    ev->c = c;
    ev->shared = 1;
    ev->fd = -1;
    *e = ev;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    GUARD();
    pthread_mutex_lock(&G);
    uint64_t gen = ++e->c->recorded;
    pthread_mutex_unlock(&G);
    enqueue(s, (fake_op){.kind = OP_RECORD, .ev = e, .gen = gen});
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    GUARD();
    pthread_mutex_lock(&G);
    event_wait_locked(e, e->c->recorded);
    pthread_mutex_unlock(&G);
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e)
{
    GUARD();
    pthread_mutex_lock(&G);
    int done = e->c->completed >= e->c->recorded;
    pthread_mutex_unlock(&G);
    return done ? cudaSuccess : cudaErrorNotReady;
}

/* ---- braid_cuda.h kernels ----
 * braid__cuda_reduce runs on the stream's thread with the CPU engine,
 * after a jittered delay like a copy, so the device ring's ordering of
 * copies up, kernels and copies down is checked: a kernel that read its
 * inputs before their copy finished would give wrong sums. One or two
 * inputs only (what braid's collectives launch): with two the kernel's
 * definition is exactly braid__reduce_final. The cast and premul variants
 * are not faked. */
typedef struct {
    braid_dtype dtype;
    braid_op op;
    void *dst;
    const void *a, *b;
    size_t count;
    int nranks;
} fake_kernel;

static void fake_kernel_run(void *arg)
{
    fake_kernel *k = arg;
    if (k->b)
        braid__reduce_final(k->dtype, k->op, k->dst, k->a, k->b, k->count, k->nranks);
    else {
        if (k->dst != k->a)
            memmove(k->dst, k->a, k->count * braid_dtype_size(k->dtype));
        braid__reduce_scale(k->dtype, k->op, k->dst, k->count, k->nranks);
    }
    free(k);
}

braid_status braid__cuda_reduce(braid_dtype dtype, braid_op op, void *dst, const void *const *srcs, int nsrcs,
                                size_t count, int nranks, void *stream)
{
    GUARD();
    if (nsrcs < 1 || nsrcs > 2 || (op == BRAID_AVG && nranks <= 0))
        return braid__error(BRAID_ERR_INVALID_ARG, "cuda fake: reduce with %d inputs, nranks %d", nsrcs, nranks);
    if (count == 0)
        return BRAID_OK;
    fake_kernel *k = malloc(sizeof(*k));
    if (!k)
        return braid__error(BRAID_ERR_NO_MEMORY, "cuda fake: out of memory");
    *k = (fake_kernel){.dtype = dtype, .op = op, .dst = dst, .a = srcs[0], .b = nsrcs == 2 ? srcs[1] : NULL,
                       .count = count, .nranks = nranks};
    /* Lazy module loading: a kernel's first launch in the process may
     * synchronize the device (CUDA's lazy-loading notes), unless
     * braid__cuda_preload loaded them all first. */
    pthread_mutex_lock(&G);
    int load = !preloaded && (unsigned)dtype < BRAID_DTYPE_COUNT && (unsigned)op < BRAID_OP_COUNT &&
               !kernel_loaded[dtype][op];
    pthread_mutex_unlock(&G);
    if (load) {
        cudaDeviceSynchronize();
        pthread_mutex_lock(&G);
        kernel_loaded[dtype][op] = 1;
        pthread_mutex_unlock(&G);
    }
    kernel_launches++;
    enqueue((cudaStream_t)stream, (fake_op){.kind = OP_KERNEL, .fn = fake_kernel_run, .arg = k});
    return BRAID_OK;
}

braid_status braid__cuda_reduce_cast(braid_dtype dst_dtype, void *dst, braid_dtype src_dtype, braid_op op,
                                     const void *const *srcs, int nsrcs, size_t count, int nranks, void *stream)
{
    GUARD();
    (void)dst_dtype, (void)dst, (void)src_dtype, (void)op, (void)srcs, (void)nsrcs, (void)count, (void)nranks,
        (void)stream;
    return braid__error(BRAID_ERR_UNSUPPORTED, "cuda fake: no kernels");
}

braid_status braid__cuda_reduce_premul(braid_dtype dtype, void *dst, const void *const *srcs, int nsrcs,
                                       size_t count, double scale, void *stream)
{
    GUARD();
    (void)dtype, (void)dst, (void)srcs, (void)nsrcs, (void)count, (void)scale, (void)stream;
    return braid__error(BRAID_ERR_UNSUPPORTED, "cuda fake: no kernels");
}

/* Loading every kernel may synchronize the device, once. */
braid_status braid__cuda_preload(void)
{
    GUARD();
    pthread_mutex_lock(&G);
    int load = !preloaded;
    pthread_mutex_unlock(&G);
    if (load) {
        cudaDeviceSynchronize();
        pthread_mutex_lock(&G);
        preloaded = 1;
        pthread_mutex_unlock(&G);
    }
    return BRAID_OK;
}

/* The gate kernel: the stream's thread polls the flag, as the GPU does. */
braid_status braid__cuda_wait_flag(const volatile uint32_t *flag, uint32_t want, void *stream)
{
    GUARD();
    enqueue((cudaStream_t)stream,
            (fake_op){.kind = OP_FLAG, .flag = (const _Atomic uint32_t *)(const volatile void *)flag, .n = want});
    return BRAID_OK;
}

/* A kernel from elsewhere in the test (tests/cuda_fake_devcoll.c): fn(arg)
 * runs on the stream's thread in stream order, as a launch would. */
void cuda_fake_launch(cudaStream_t stream, void (*fn)(void *), void *arg)
{
    kernel_launches++;
    enqueue(stream, (fake_op){.kind = OP_KERNEL, .fn = fn, .arg = arg});
}
