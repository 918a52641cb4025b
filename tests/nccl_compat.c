/* A program built against NVIDIA's own nccl.h (NCCL 2.28.9, from the CUDA
 * toolkit) and run on braid's libnccl.so.2, the way PyTorch and nccl-tests
 * use it: every entry point is called on host buffers and its result,
 * error code and text checked. The parent makes the unique ids, forks N
 * ranks, and each rank runs:
 *
 *  1. config versioning: structs of older and newer NCCL headers, bad
 *     magic, fields out of range, accepted or refused as NCCL does;
 *  2. a nonblocking communicator (blocking = 0): init returns
 *     ncclInProgress, ncclCommGetAsyncError reports completion, a
 *     collective's ncclInProgress is polled to its result;
 *  3. every collective (all-to-all, gather and scatter included), groups,
 *     PreMulSum, fp8, registration, symmetric-memory stubs, the simulated
 *     group end, scalable init, ncclCommInitAll;
 *  4. ncclCommRevoke stopping a call blocked in another thread, then
 *     ncclCommShrink of the revoked communicator;
 *  5. the last rank SIGKILLed, the survivors shrink it away and go on.
 *
 * usage: nccl_compat [NRANKS...]   (default: 1 2 3 4) */
#include <nccl.h>

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nccl_compat.h"

/* nccl_device/core.h (C++ only) declares these two; PyTorch imports them. */
struct ncclDevComm;
struct ncclDevCommRequirements;
ncclResult_t ncclDevCommCreate(ncclComm_t, const struct ncclDevCommRequirements *, struct ncclDevComm *);
ncclResult_t ncclDevCommDestroy(ncclComm_t, const struct ncclDevComm *);

int g_rank = -1;

/* A word said twice in a row ("BRAID_ERR_PEER: BRAID_ERR_PEER: ..."), as
 * a status name does when one layer adds it to a text that has it: the
 * word, or NULL. */
const char *doubled_word(const char *text)
{
    static char word[64];
    for (const char *p = text; *p; p++) {
        if (p != text && (isalnum((unsigned char)p[-1]) || p[-1] == '_'))
            continue;
        size_t n = 0;
        while (isalnum((unsigned char)p[n]) || p[n] == '_')
            n++;
        if (n < 4 || n >= sizeof(word) || strncmp(p + n, ": ", 2) != 0 || strncmp(p + n + 2, p, n) != 0)
            continue;
        char after = p[2 * n + 2];
        if (!isalnum((unsigned char)after) && after != '_') {
            memcpy(word, p, n);
            word[n] = '\0';
            return word;
        }
    }
    return NULL;
}

/* Poll ncclCommGetAsyncError until comm leaves ncclInProgress (bounded). */
static ncclResult_t settle(ncclComm_t comm, ncclResult_t r)
{
    struct timespec ms = {0, 1000000};
    for (int i = 0; r == ncclInProgress && i < 120000; i++) {
        ncclResult_t q = ncclCommGetAsyncError(comm, &r);
        if (q != ncclSuccess)
            return q;
        if (r == ncclInProgress)
            nanosleep(&ms, NULL);
    }
    return r;
}

/* ---- 1. config versioning --------------------------------------------- */

/* Create (and destroy) a one-rank communicator with config; returns the
 * init's result. */
static ncclResult_t init_one(const void *config)
{
    /* An id a refused config never used serves the next init: each id
     * keeps a socket in this process until used, and braid keeps only the
     * newest few (the ids the parent made for this rank among them). */
    static ncclUniqueId id;
    static int unused;
    ncclResult_t r = unused ? ncclSuccess : ncclGetUniqueId(&id);
    if (r != ncclSuccess)
        return r;
    ncclComm_t c = NULL;
    r = ncclCommInitRankConfig(&c, 1, id, 0, (ncclConfig_t *)config);
    unused = r == ncclInvalidArgument;
    if (r == ncclInProgress)
        r = settle(c, r);
    if (c)
        ncclCommDestroy(c);
    return r;
}

static int test_config_versions(void)
{
    ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
    CHECK(init_one(NULL));
    CHECK(init_one(&c));

    c.magic = 0;
    EXPECT(init_one(&c), ncclInvalidArgument, "NCCL_CONFIG_INITIALIZER");
    /* size too small to cover the magic: not read, so refused */
    c = (ncclConfig_t)NCCL_CONFIG_INITIALIZER;
    c.size = 4;
    EXPECT(init_one(&c), ncclInvalidArgument, "NCCL_CONFIG_INITIALIZER");

    /* blocking out of range: refused at 2.28, ignored from a 2.13 header */
    c = (ncclConfig_t)NCCL_CONFIG_INITIALIZER;
    c.blocking = 7;
    EXPECT(init_one(&c), ncclInvalidArgument, "blocking");
    c.version = NCCL_VERSION(2, 13, 4);
    CHECK(init_one(&c));

    /* 2.28 fields: checked at 2.28, reset from a 2.27 header */
    c = (ncclConfig_t)NCCL_CONFIG_INITIALIZER;
    c.nvlinkCentricSched = 5;
    EXPECT(init_one(&c), ncclInvalidArgument, "nvlinkCentricSched");
    c.version = NCCL_VERSION(2, 27, 3);
    CHECK(init_one(&c));
    c = (ncclConfig_t)NCCL_CONFIG_INITIALIZER;
    c.nChannelsPerNetPeer = 0;
    EXPECT(init_one(&c), ncclInvalidArgument, "nChannelsPerNetPeer");

    /* a 2.19 struct (48 bytes): what lies beyond its size is never read */
    struct {
        ncclConfig_t c;
        char more[64];
    } buf;
    memset(&buf, 0x7f, sizeof(buf));
    memcpy(&buf.c, &(ncclConfig_t)NCCL_CONFIG_INITIALIZER, 48);
    buf.c.size = 48;
    buf.c.version = NCCL_VERSION(2, 19, 3);
    CHECK(init_one(&buf.c));

    /* a newer header's larger struct: our fields read, the rest ignored */
    memset(&buf, 0x7f, sizeof(buf));
    buf.c = (ncclConfig_t)NCCL_CONFIG_INITIALIZER;
    buf.c.size = sizeof(buf);
    buf.c.version = NCCL_VERSION(2, 30, 5);
    CHECK(init_one(&buf.c));

    /* NCCL's CTA checks, including minCTAs without maxCTAs being refused */
    c = (ncclConfig_t)NCCL_CONFIG_INITIALIZER;
    c.minCTAs = 2;
    EXPECT(init_one(&c), ncclInvalidArgument, "maxCTAs");
    c.maxCTAs = 4;
    CHECK(init_one(&c));
    c.maxCTAs = 1;
    EXPECT(init_one(&c), ncclInvalidArgument, "maxCTAs");
    c = (ncclConfig_t)NCCL_CONFIG_INITIALIZER;
    c.CTAPolicy = 0x40;
    EXPECT(init_one(&c), ncclInvalidArgument, "CTAPolicy");
    c.CTAPolicy = NCCL_CTA_POLICY_EFFICIENCY;
    c.splitShare = 1;
    c.shrinkShare = 0;
    c.collnetEnable = 0;
    c.trafficClass = 3;
    CHECK(init_one(&c));
    c = (ncclConfig_t)NCCL_CONFIG_INITIALIZER;
    c.netName = "Bogus";
    EXPECT(init_one(&c), ncclInvalidArgument, "netName");
    c.netName = "Socket";
    CHECK(init_one(&c));
    return 0;
}

/* NCCL_COMM_BLOCKING overrides config.blocking both ways, as NCCL 2.28's
 * envConfigOverride does; values other than 0 and 1 are ignored. blocking
 * -1: ncclCommInitRank, no config. A nonblocking init returns
 * ncclInProgress; a blocking one, and its calls, never do. */
static int init_with_env(const char *env, int blocking, ncclResult_t want)
{
    ncclUniqueId id;
    CHECK(ncclGetUniqueId(&id));
    ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
    c.blocking = blocking;
    ncclComm_t comm = NULL;
    setenv("NCCL_COMM_BLOCKING", env, 1);
    ncclResult_t r = blocking < 0 ? ncclCommInitRank(&comm, 1, id, 0) : ncclCommInitRankConfig(&comm, 1, id, 0, &c);
    unsetenv("NCCL_COMM_BLOCKING");
    if (r != want)
        FAIL("NCCL_COMM_BLOCKING=%s, config.blocking %d: init returned %s, want %s", env, blocking,
             ncclGetErrorString(r), ncclGetErrorString(want));
    CHECK(settle(comm, r));
    int32_t v = 7;
    r = ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, comm, NULL);
    if (want == ncclSuccess && r != ncclSuccess)
        FAIL("NCCL_COMM_BLOCKING=%s: all-reduce on a blocking communicator returned %s", env, ncclGetErrorString(r));
    CHECK(settle(comm, r));
    if (v != 7)
        FAIL("NCCL_COMM_BLOCKING=%s: one-rank all-reduce gave %d", env, v);
    CHECK(ncclCommDestroy(comm));
    return 0;
}

static int test_env_blocking(void)
{
    return init_with_env("0", 1, ncclInProgress) || init_with_env("0", -1, ncclInProgress) ||
           init_with_env("1", 0, ncclSuccess) || init_with_env("1", -1, ncclSuccess) ||
           init_with_env("2", 0, ncclInProgress) || init_with_env("2", 1, ncclSuccess);
}

/* ---- data ------------------------------------------------------------- */

static int32_t val(int rank, size_t i)
{
    return (int32_t)(rank * 1000 + (int)(i % 997));
}

/* ---- 2. nonblocking ---------------------------------------------------- */

static int test_nonblocking(ncclComm_t comm, int rank, int n)
{
    int32_t in[257], out[257];
    for (int i = 0; i < 257; i++)
        in[i] = val(rank, (size_t)i);
    ncclResult_t r = ncclAllReduce(in, out, 257, ncclInt32, ncclSum, comm, NULL);
    if (r != ncclSuccess && r != ncclInProgress)
        FAIL("nonblocking ncclAllReduce returned %s: %s", ncclGetErrorString(r), ncclGetLastError(NULL));
    CHECK(settle(comm, r));
    for (int i = 0; i < 257; i++) {
        int64_t want = 0;
        for (int p = 0; p < n; p++)
            want += val(p, (size_t)i);
        if (out[i] != want)
            FAIL("nonblocking all-reduce element %d is %d, want %lld", i, out[i], (long long)want);
    }
    /* A second call right after a first one in flight: the library orders
     * them itself. */
    int32_t a = rank + 1, b = 2 * (rank + 1);
    r = ncclAllReduce(&a, &a, 1, ncclInt32, ncclSum, comm, NULL);
    if (r != ncclSuccess && r != ncclInProgress)
        FAIL("nonblocking ncclAllReduce #2 returned %s", ncclGetErrorString(r));
    r = ncclAllReduce(&b, &b, 1, ncclInt32, ncclSum, comm, NULL);
    if (r != ncclSuccess && r != ncclInProgress)
        FAIL("nonblocking ncclAllReduce #3 returned %s", ncclGetErrorString(r));
    CHECK(settle(comm, r));
    if (a != n * (n + 1) / 2 || b != n * (n + 1))
        FAIL("back-to-back nonblocking all-reduces gave %d and %d, want %d and %d", a, b, n * (n + 1) / 2,
             n * (n + 1));
    return 0;
}

/* ---- 3. every collective ----------------------------------------------- */

static int test_collectives(ncclComm_t comm, int rank, int n)
{
    enum { C = 300 };
    int32_t *send = calloc((size_t)n * C, 4), *recv = calloc((size_t)n * C, 4);
    if (!send || !recv)
        FAIL("out of memory");
    int64_t sum[C];
    for (int i = 0; i < C; i++) {
        sum[i] = 0;
        for (int p = 0; p < n; p++)
            sum[i] += val(p, (size_t)i);
    }
    for (int i = 0; i < C; i++)
        send[i] = val(rank, (size_t)i);
    int root = n - 1;

    CHECK(ncclAllReduce(send, recv, C, ncclInt32, ncclSum, comm, NULL));
    for (int i = 0; i < C; i++)
        if (recv[i] != sum[i])
            FAIL("ncclAllReduce element %d is %d, want %lld", i, recv[i], (long long)sum[i]);
    CHECK(pncclAllReduce(send, recv, C, ncclInt32, ncclMax, comm, NULL)); /* the profiling alias */
    for (int i = 0; i < C; i++)
        if (recv[i] != val(n - 1, (size_t)i))
            FAIL("pncclAllReduce max element %d is %d", i, recv[i]);

    memset(recv, 0, (size_t)C * 4);
    CHECK(ncclReduce(send, recv, C, ncclInt32, ncclSum, root, comm, NULL));
    if (rank == root)
        for (int i = 0; i < C; i++)
            if (recv[i] != sum[i])
                FAIL("ncclReduce element %d is %d", i, recv[i]);

    for (int i = 0; i < C; i++)
        recv[i] = rank == root ? val(root, (size_t)i) : -1;
    CHECK(ncclBcast(recv, C, ncclInt32, root, comm, NULL));
    CHECK(ncclBroadcast(send, send + C / 2, C / 2, ncclInt32, 0, comm, NULL)); /* out of place */
    for (int i = 0; i < C; i++)
        if (recv[i] != val(root, (size_t)i) || (i < C / 2 && send[C / 2 + i] != val(0, (size_t)i)))
            FAIL("ncclBcast/ncclBroadcast element %d wrong", i);

    /* all-gather, then reduce-scatter of it: block r of the gather is rank r's */
    for (int i = 0; i < C; i++)
        send[i] = val(rank, (size_t)i);
    CHECK(ncclAllGather(send, recv, C, ncclInt32, comm, NULL));
    for (int p = 0; p < n; p++)
        for (int i = 0; i < C; i++)
            if (recv[p * C + i] != val(p, (size_t)i))
                FAIL("ncclAllGather block %d element %d is %d", p, i, recv[p * C + i]);
    CHECK(ncclReduceScatter(recv, send, C, ncclInt32, ncclSum, comm, NULL));
    for (int i = 0; i < C; i++)
        if (send[i] != n * val(rank, (size_t)i))
            FAIL("ncclReduceScatter element %d is %d, want %d", i, send[i], n * val(rank, (size_t)i));

    /* all-to-all: block p of rank r's input carries (r, p) */
    for (int p = 0; p < n; p++)
        for (int i = 0; i < C; i++)
            send[p * C + i] = rank * 100 + p + i * 10000;
    CHECK(ncclAlltoAll(send, recv, C, ncclInt32, comm, NULL));
    for (int p = 0; p < n; p++)
        for (int i = 0; i < C; i++)
            if (recv[p * C + i] != p * 100 + rank + i * 10000)
                FAIL("ncclAlltoAll block %d element %d is %d", p, i, recv[p * C + i]);
    if (n > 1)
        EXPECT(ncclAlltoAll(send, send, C, ncclInt32, comm, NULL), ncclInvalidArgument, "in-place");

    /* gather to root, scatter back from root, in and out of place */
    for (int i = 0; i < C; i++)
        send[i] = val(rank, (size_t)i);
    memset(recv, 0, (size_t)n * C * 4);
    CHECK(ncclGather(send, rank == root ? recv : NULL, C, ncclInt32, root, comm, NULL));
    if (rank == root)
        for (int p = 0; p < n; p++)
            for (int i = 0; i < C; i++)
                if (recv[p * C + i] != val(p, (size_t)i))
                    FAIL("ncclGather block %d element %d is %d", p, i, recv[p * C + i]);
    int32_t mine[C];
    CHECK(ncclScatter(rank == root ? recv : NULL, mine, C, ncclInt32, root, comm, NULL));
    for (int i = 0; i < C; i++)
        if (mine[i] != val(rank, (size_t)i))
            FAIL("ncclScatter element %d is %d", i, mine[i]);
    if (rank == root) { /* in place on the root */
        CHECK(ncclGather(recv + root * C, recv, C, ncclInt32, root, comm, NULL));
        CHECK(ncclScatter(recv, recv + root * C, C, ncclInt32, root, comm, NULL));
    } else {
        CHECK(ncclGather(send, NULL, C, ncclInt32, root, comm, NULL));
        CHECK(ncclScatter(NULL, mine, C, ncclInt32, root, comm, NULL));
    }
    EXPECT(ncclGather(send, recv, C, ncclInt32, n, comm, NULL), ncclInvalidArgument, "root");

    /* send/receive ring inside a group */
    int32_t out = rank, in = -1;
    CHECK(ncclGroupStart());
    CHECK(ncclSend(&out, 1, ncclInt32, (rank + 1) % n, comm, NULL));
    CHECK(ncclRecv(&in, 1, ncclInt32, (rank + n - 1) % n, comm, NULL));
    CHECK(ncclGroupEnd());
    if (in != (rank + n - 1) % n)
        FAIL("ring send/recv got %d", in);

    /* fp8: moved as bytes, never reduced */
    unsigned char f8[4] = {(unsigned char)rank, 1, 2, 3}, f8all[4 * 4 * 8];
    CHECK(ncclAllGather(f8, f8all, 4, ncclFloat8e4m3, comm, NULL));
    for (int p = 0; p < n; p++)
        if (f8all[4 * p] != p || f8all[4 * p + 3] != 3)
            FAIL("fp8 all-gather block %d wrong", p);
    EXPECT(ncclAllReduce(f8, f8, 4, ncclFloat8e5m2, ncclSum, comm, NULL), ncclInvalidUsage, "fp8");
    EXPECT(ncclAllReduce(f8, f8, 4, (ncclDataType_t)ncclNumTypes, ncclSum, comm, NULL), ncclInvalidArgument,
           "invalid datatype");
    free(send);
    free(recv);
    return 0;
}

/* With NCCL_DEBUG=WARN, the line printed for a failed call names the
 * communicator too. */
static int warn_names_comm(ncclComm_t comm)
{
    char path[] = "/tmp/nccl_compat_warn_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0)
        FAIL("mkstemp: %s", strerror(errno));
    unlink(path);
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    setenv("NCCL_DEBUG", "WARN", 1);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    ncclResetDebugInit();
    ncclResult_t r = ncclCommUserRank(comm, NULL);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    unsetenv("NCCL_DEBUG");
    ncclResetDebugInit();
#pragma GCC diagnostic pop
    char log[2048] = "";
    ssize_t got = pread(fd, log, sizeof(log) - 1, 0);
    close(fd);
    log[got > 0 ? got : 0] = '\0';
    if (r != ncclInvalidArgument || !strstr(log, "NCCL WARN ncclCommUserRank") || !strstr(log, "compat"))
        FAIL("NCCL_DEBUG=WARN: ncclCommUserRank(comm, NULL) returned %s and printed \"%s\"; want a WARN line naming "
             "\"compat\"", ncclGetErrorString(r), log);
    return 0;
}

static int test_comm_queries(ncclComm_t comm, int rank, int n)
{
    int count = -1, urank = -1, dev = -2, v = 0;
    CHECK(ncclCommCount(comm, &count));
    CHECK(ncclCommUserRank(comm, &urank));
    CHECK(ncclCommCuDevice(comm, &dev));
    if (count != n || urank != rank)
        FAIL("ncclCommCount %d / ncclCommUserRank %d, want %d / %d", count, urank, n, rank);
    CHECK(ncclGetVersion(&v));
    CHECK(pncclGetVersion(&v));
    if (v != NCCL_VERSION_CODE)
        FAIL("ncclGetVersion %d, NVIDIA's header %d", v, NCCL_VERSION_CODE);
    if (strcmp(ncclGetErrorString(ncclInProgress), "NCCL operation in progress") != 0)
        FAIL("ncclGetErrorString(ncclInProgress) = %s", ncclGetErrorString(ncclInProgress));
    /* deprecated in 2.28, still declared and exported */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    ncclResetDebugInit();
#pragma GCC diagnostic pop

    void *mem = NULL, *handle = NULL;
    CHECK(ncclMemAlloc(&mem, 1 << 16));
    CHECK(ncclCommRegister(comm, mem, 1 << 16, &handle));
    CHECK(ncclCommDeregister(comm, handle));
    ncclWindow_t win = (ncclWindow_t)&win;
    EXPECT(ncclCommWindowRegister(comm, mem, 1 << 16, &win, NCCL_WIN_COLL_SYMMETRIC), ncclInvalidUsage,
           "symmetric memory");
    if (win != NULL)
        FAIL("ncclCommWindowRegister left *win set after failing");
    /* the communicator's name (config.commName) is in the text */
    if (!strstr(ncclGetLastError(NULL), "(compat)"))
        FAIL("error text lacks the communicator's name: %s", ncclGetLastError(NULL));
    EXPECT(ncclCommCount(comm, NULL), ncclInvalidArgument, "(comm \"compat\")");
    EXPECT(ncclAllReduce(NULL, NULL, 5, ncclInt32, ncclSum, comm, NULL), ncclInvalidArgument, "compat");
    EXPECT(ncclAllReduce(mem, mem, 5, ncclInt32, (ncclRedOp_t)99, comm, NULL), ncclInvalidArgument, "compat");
    if (rank == 0 && warn_names_comm(comm))
        return 1;
    EXPECT(ncclCommWindowDeregister(comm, NULL), ncclInvalidUsage, "symmetric memory");
    EXPECT(ncclDevCommCreate(comm, NULL, NULL), ncclInvalidUsage, "device communicators");
    EXPECT(ncclDevCommDestroy(comm, NULL), ncclInvalidUsage, "device communicators");
    CHECK(ncclMemFree(mem));
    return 0;
}

/* The simulated end runs nothing and estimates a positive time that grows
 * with the message. */
static int test_simulate(ncclComm_t comm, int rank, int n)
{
    (void)n;
    static int32_t buf[1 << 18];
    buf[0] = rank + 7;
    ncclSimInfo_t small = NCCL_SIM_INFO_INITIALIZER, large = NCCL_SIM_INFO_INITIALIZER;
    CHECK(ncclGroupStart());
    CHECK(ncclAllReduce(buf, buf, 16, ncclInt32, ncclSum, comm, NULL));
    CHECK(ncclGroupSimulateEnd(&small));
    CHECK(ncclGroupStart());
    CHECK(ncclAllReduce(buf, buf, 1 << 18, ncclInt32, ncclSum, comm, NULL));
    CHECK(ncclAlltoAll(buf, buf + (1 << 17), 1, ncclInt32, comm, NULL));
    CHECK(ncclGroupSimulateEnd(&large));
    if (buf[0] != rank + 7)
        FAIL("ncclGroupSimulateEnd ran the all-reduce");
    if (!(small.estimatedTime > 0) || !(large.estimatedTime > small.estimatedTime))
        FAIL("estimated times %g us (64 B) and %g us (1 MiB) are not positive and increasing",
             (double)small.estimatedTime, (double)large.estimatedTime);
    ncclSimInfo_t bad = NCCL_SIM_INFO_INITIALIZER;
    bad.magic = 1;
    CHECK(ncclGroupStart());
    EXPECT(ncclGroupSimulateEnd(&bad), ncclInvalidArgument, "NCCL_SIM_INFO_INITIALIZER");
    CHECK(ncclGroupEnd());
    EXPECT(ncclGroupSimulateEnd(&small), ncclInvalidUsage, "without ncclGroupStart");
    if (rank == 0)
        printf("ncclGroupSimulateEnd: all-reduce of 64 B %.1f us, of 1 MiB + all-to-all %.1f us\n",
               (double)small.estimatedTime, (double)large.estimatedTime);
    return 0;
}

static int check_sum(ncclComm_t comm, int nr, const char *what)
{
    int32_t x = 1;
    CHECK(ncclAllReduce(&x, &x, 1, ncclInt32, ncclSum, comm, NULL));
    if (x != nr)
        FAIL("%s: all-reduce of ones gave %d, want %d", what, x, nr);
    return 0;
}

/* ---- 4. revoke, then shrink ------------------------------------------- */

typedef struct {
    ncclComm_t comm;
    ncclResult_t result;
} blocked_call;

static void *blocked_main(void *arg)
{
    blocked_call *b = arg;
    int32_t x[64] = {0};
    /* The other ranks never make this call, so only revoke ends it. */
    b->result = ncclAllReduce(x, x, 64, ncclInt32, ncclSum, b->comm, NULL);
    return NULL;
}

static int test_revoke_shrink(ncclComm_t comm, int rank, int n)
{
    if (rank == 0 && n > 1) {
        blocked_call b = {comm, ncclSuccess};
        pthread_t t;
        if (pthread_create(&t, NULL, blocked_main, &b) != 0)
            FAIL("pthread_create");
        struct timespec pause = {0, 300 * 1000000};
        nanosleep(&pause, NULL);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        CHECK(ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT));
        pthread_join(t, NULL);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
        if (b.result == ncclSuccess)
            FAIL("the broadcast blocked in another thread succeeded after ncclCommRevoke");
        if (s > 10)
            FAIL("ncclCommRevoke took %.1f s to stop the blocked call", s);
        printf("ncclCommRevoke: the blocked call returned %s after %.3f s\n", ncclGetErrorString(b.result), s);
    } else {
        CHECK(ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT));
    }
    EXPECT(ncclCommRevoke(comm, 3), ncclInvalidArgument, "revokeFlags");
    EXPECT(ncclAllReduce(&rank, &rank, 1, ncclInt32, ncclSum, comm, NULL), ncclInvalidUsage, "revoked");
    ncclResult_t state;
    CHECK(ncclCommGetAsyncError(comm, &state));
    if (state != ncclSuccess)
        FAIL("a revoked communicator reports %s, want ncclSuccess (quiescent)", ncclGetErrorString(state));
    /* every rank stays: a communicator of the same ranks */
    ncclComm_t again = NULL;
    CHECK(ncclCommShrink(comm, NULL, 0, &again, NULL, NCCL_SHRINK_DEFAULT));
    int cnt = 0, me = -1;
    CHECK(ncclCommCount(again, &cnt));
    CHECK(ncclCommUserRank(again, &me));
    if (cnt != n || me != rank)
        FAIL("shrink of a revoked communicator: %d ranks, rank %d; want %d, %d", cnt, me, n, rank);
    if (check_sum(again, n, "after revoke + shrink"))
        return 1;
    int self = rank;
    if (n > 1)
        EXPECT(ncclCommShrink(again, &self, 1, &comm, NULL, NCCL_SHRINK_DEFAULT), ncclInvalidArgument,
               "must not call");
    EXPECT(ncclCommShrink(again, NULL, 0, &comm, NULL, 9), ncclInvalidArgument, "shrinkFlags");
    CHECK(ncclCommDestroy(again));
    CHECK(ncclCommDestroy(comm));
    return 0;
}

/* ---- 5. a killed rank, shrunk away ------------------------------------- */

static int test_kill_shrink(ncclComm_t comm, int rank, int n)
{
    int victim = n - 1;
    if (check_sum(comm, n, "before the kill"))
        return 1;
    if (rank == victim) {
        fflush(NULL);
        raise(SIGKILL);
    }
    /* Survivors: the next call fails (the peer is gone) ... */
    int32_t x = 1;
    ncclResult_t r = ncclAllReduce(&x, &x, 1, ncclInt32, ncclSum, comm, NULL);
    if (r == ncclSuccess)
        FAIL("all-reduce with rank %d dead succeeded", victim);
    /* braid's text passes through the shim with its status name once */
    const char *text = ncclGetLastError(NULL), *st = strstr(text, "BRAID_ERR_");
    if (!st || strstr(st + 1, "BRAID_ERR_") || doubled_word(text))
        FAIL("all-reduce with a dead peer: text \"%s\" should name braid's status once", text);
    /* ... and a shrink without it makes a working communicator. */
    ncclComm_t small = NULL;
    int flags = rank % 2 ? NCCL_SHRINK_ABORT : NCCL_SHRINK_DEFAULT;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.commName = "shrunk";
    CHECK(ncclCommShrink(comm, &victim, 1, &small, rank == 0 ? &cfg : NULL, flags));
    int cnt = 0, me = -1;
    CHECK(ncclCommCount(small, &cnt));
    CHECK(ncclCommUserRank(small, &me));
    if (cnt != n - 1 || me != rank)
        FAIL("shrunk communicator: %d ranks, rank %d; want %d, %d", cnt, me, n - 1, rank);
    if (check_sum(small, n - 1, "after the shrink"))
        return 1;
    CHECK(ncclCommDestroy(small));
    CHECK(ncclCommAbort(comm));
    return 0;
}

/* ---- one rank ------------------------------------------------------------ */

typedef struct {
    ncclUniqueId main_id, scalable[2], fault_id;
    ncclUniqueId fresh[3]; /* for the scalable init past a dead id */
    ncclUniqueId dead[2];  /* ids of a port that is bound and never listens */
    int dead_port[2];
} ids;

/* ncclCommInitRankScalable meets at the first id that answers: past a dead
 * first one; with none, ncclRemoteError naming each id and why. */
static int test_scalable_dead(int rank, int n, const ids *id)
{
    if (n > 1) {
        ncclUniqueId list[3] = {id->dead[0], id->fresh[0], id->fresh[1]};
        ncclComm_t c = NULL;
        CHECK(ncclCommInitRankScalable(&c, n, rank, n > 2 ? 3 : 2, list, NULL));
        if (check_sum(c, n, "ncclCommInitRankScalable past a dead first id"))
            return 1;
        CHECK(ncclCommDestroy(c));
    }
    ncclUniqueId dead[2] = {id->dead[0], id->dead[1]};
    int nid = n > 1 ? 2 : 1;
    ncclComm_t c = NULL;
    setenv("BRAID_INIT_TIMEOUT_MS", "1500", 1); /* how long the other ranks keep trying */
    ncclResult_t r = ncclCommInitRankScalable(&c, n, rank, nid, dead, NULL);
    unsetenv("BRAID_INIT_TIMEOUT_MS");
    EXPECT(r, ncclRemoteError, rank == 0 ? "cannot serve its store" : "answered within");
    for (int i = 0; i < nid; i++) {
        char want[64];
        snprintf(want, sizeof(want), "id %d (127.0.0.1:%d): ", i, id->dead_port[i]);
        if (!strstr(ncclGetLastError(NULL), want))
            FAIL("scalable init with dead ids: text \"%s\" lacks \"%s\"", ncclGetLastError(NULL), want);
    }
    if (!strstr(ncclGetLastError(NULL), rank == 0 ? "in use" : "refused"))
        FAIL("scalable init with dead ids: text \"%s\" does not say why", ncclGetLastError(NULL));
    if (c)
        FAIL("failed ncclCommInitRankScalable set *newcomm");
    return 0;
}

static int rank_main(int rank, int n, const ids *id)
{
    g_rank = rank;
    if (test_config_versions() || test_env_blocking())
        return 1;

    /* 2: nonblocking init */
    ncclComm_t nb = NULL;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    cfg.commName = "compat";
    ncclResult_t r = ncclCommInitRankConfig(&nb, n, id->main_id, rank, &cfg);
    if (r != ncclInProgress)
        FAIL("nonblocking ncclCommInitRankConfig returned %s, want ncclInProgress", ncclGetErrorString(r));
    CHECK(settle(nb, r));
    if (test_nonblocking(nb, rank, n))
        return 1;

    /* 3: a blocking communicator split from it, keeping its name */
    ncclComm_t comm = NULL;
    ncclConfig_t bcfg = NCCL_CONFIG_INITIALIZER;
    bcfg.blocking = 1;
    bcfg.commName = "compat";
    CHECK(ncclCommSplit(nb, 0, rank, &comm, &bcfg));
    if (test_collectives(comm, rank, n) || test_premulsum(comm, rank, n) || test_comm_queries(comm, rank, n) ||
        test_simulate(comm, rank, n))
        return 1;
    CHECK(ncclCommFinalize(nb));
    CHECK(ncclCommDestroy(nb));

    ncclComm_t sc = NULL;
    CHECK(ncclCommInitRankScalable(&sc, n, rank, n > 1 ? 2 : 1, (ncclUniqueId *)id->scalable, NULL));
    if (check_sum(sc, n, "ncclCommInitRankScalable"))
        return 1;
    EXPECT(ncclCommInitRankScalable(&sc, n, rank, n + 1, (ncclUniqueId *)id->scalable, NULL), ncclInvalidArgument,
           "nId");
    CHECK(ncclCommDestroy(sc));
    if (test_scalable_dead(rank, n, id))
        return 1;

    if (rank == 0) {
        ncclComm_t all[3];
        int devs[3] = {0, 0, 0};
        CHECK(ncclCommInitAll(all, 3, devs));
        int32_t v[3] = {1, 2, 3};
        CHECK(ncclGroupStart());
        for (int i = 0; i < 3; i++)
            CHECK(ncclAllReduce(&v[i], &v[i], 1, ncclInt32, ncclSum, all[i], NULL));
        CHECK(ncclGroupEnd());
        for (int i = 0; i < 3; i++) {
            if (v[i] != 6)
                FAIL("ncclCommInitAll clique: all-reduce gave %d", v[i]);
            CHECK(ncclCommDestroy(all[i]));
        }
    }

    /* 4 */
    if (test_revoke_shrink(comm, rank, n))
        return 1;

    /* 5 */
    if (n > 1) {
        ncclComm_t f = NULL;
        CHECK(ncclCommInitRank(&f, n, id->fault_id, rank));
        if (test_kill_shrink(f, rank, n))
            return 1;
    }
    return 0;
}

/* A unique id of a loopback port that *fd holds bound but never listens
 * on: connections are refused and nobody else can bind it. braid makes an
 * id for a fixed address when BRAID_STORE_ADDR is set. */
static ncclResult_t dead_id(ncclUniqueId *id, int *port, int *fd)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    *fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (*fd < 0 || bind(*fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        getsockname(*fd, (struct sockaddr *)&a, &len) != 0) {
        fprintf(stderr, "dead id: socket: %s\n", strerror(errno));
        return ncclSystemError;
    }
    *port = ntohs(a.sin_port);
    char addr[32];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", *port);
    setenv("BRAID_STORE_ADDR", addr, 1);
    ncclResult_t r = ncclGetUniqueId(id);
    unsetenv("BRAID_STORE_ADDR");
    return r;
}

static int run(int n)
{
    ids id;
    int dead_fd[2] = {-1, -1};
    if (ncclGetUniqueId(&id.main_id) != ncclSuccess || ncclGetUniqueId(&id.scalable[0]) != ncclSuccess ||
        ncclGetUniqueId(&id.scalable[1]) != ncclSuccess || ncclGetUniqueId(&id.fault_id) != ncclSuccess ||
        ncclGetUniqueId(&id.fresh[0]) != ncclSuccess || ncclGetUniqueId(&id.fresh[1]) != ncclSuccess ||
        ncclGetUniqueId(&id.fresh[2]) != ncclSuccess || dead_id(&id.dead[0], &id.dead_port[0], &dead_fd[0]) ||
        dead_id(&id.dead[1], &id.dead_port[1], &dead_fd[1])) {
        fprintf(stderr, "ncclGetUniqueId: %s\n", ncclGetLastError(NULL));
        return 1;
    }
    pid_t pids[8];
    for (int r = 0; r < n; r++) {
        fflush(NULL);
        pids[r] = fork();
        if (pids[r] == 0)
            _exit(rank_main(r, n, &id) ? 1 : 0);
    }
    int failed = 0;
    for (int r = 0; r < n; r++) {
        int status = 0;
        waitpid(pids[r], &status, 0);
        int killed_as_planned = n > 1 && r == n - 1 && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
        if (!killed_as_planned && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
            fprintf(stderr, "%d ranks: rank %d failed (status %d)\n", n, r, status);
            failed = 1;
        }
    }
    close(dead_fd[0]);
    close(dead_fd[1]);
    printf("%d rank%s: %s\n", n, n == 1 ? "" : "s", failed ? "FAILED" : "ok");
    return failed;
}

int main(int argc, char **argv)
{
    int counts[8] = {1, 2, 3, 4}, ncounts = 4;
    if (argc > 1) {
        ncounts = 0;
        for (int i = 1; i < argc && ncounts < 8; i++) {
            int v = atoi(argv[i]);
            if (v < 1 || v > 8) {
                fprintf(stderr, "usage: %s [NRANKS (1-8)...]\n", argv[0]);
                return 2;
            }
            counts[ncounts++] = v;
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    /* Built with NVIDIA's header, the program would run just as well on
     * NVIDIA's library: make sure it is braid's that answered. */
    if (!strstr(ncclGetErrorString(ncclInternalError), "braid")) {
        fprintf(stderr, "libnccl.so.2 in use is not braid's (check the run path / LD_LIBRARY_PATH)\n");
        return 1;
    }
    int failed = 0;
    for (int i = 0; i < ncounts; i++)
        failed |= run(counts[i]);
    return failed;
}
