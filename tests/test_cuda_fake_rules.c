/* The CUDA rules tests/cuda_fake.c keeps (docs/CUDA.md, "CUDA rules braid
 * relies on"), checked on the stand-in itself: the suites that run braid's
 * device path on it catch a design that breaks a rule only if the rule is
 * really there.
 *
 * Each assertion that something waits checks it has not happened after a
 * pause (it cannot happen early under load); each that something does not
 * wait allows generous time. Built only where braid has no CUDA (the
 * stand-in replaces the runtime). */
#include <check.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda_runtime_api.h"

static atomic_int release, a_started, b_ran, copy_done;

static void sleep_ms(int ms)
{
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

/* Waits up to limit_ms for *flag; 1 when set. */
static int wait_flag(atomic_int *flag, int limit_ms)
{
    for (int waited = 0; waited < limit_ms; waited += 10) {
        if (atomic_load(flag))
            return 1;
        sleep_ms(10);
    }
    return atomic_load(flag);
}

static void CUDART_CB hold(void *arg)
{
    (void)arg;
    atomic_store(&a_started, 1);
    while (!atomic_load(&release))
        sleep_ms(1);
}

static void CUDART_CB mark(void *arg)
{
    (void)arg;
    atomic_store(&b_ran, 1);
}

static void reset(void)
{
    atomic_store(&release, 0);
    atomic_store(&a_started, 0);
    atomic_store(&b_ran, 0);
    atomic_store(&copy_done, 0);
}

/* One callback thread: a blocked host function holds another stream's. */
START_TEST(callback_thread)
{
    reset();
    cudaStream_t s1, s2;
    ck_assert_int_eq(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), cudaSuccess);
    ck_assert_int_eq(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), cudaSuccess);
    ck_assert_int_eq(cudaLaunchHostFunc(s1, hold, NULL), cudaSuccess);
    ck_assert_msg(wait_flag(&a_started, 30000), "the first host function never started");
    ck_assert_int_eq(cudaLaunchHostFunc(s2, mark, NULL), cudaSuccess);
    sleep_ms(300);
    ck_assert_msg(!atomic_load(&b_ran), "a host function ran while another one blocked the callback thread");
    atomic_store(&release, 1);
    ck_assert_int_eq(cudaStreamSynchronize(s2), cudaSuccess);
    ck_assert(atomic_load(&b_ran));
    ck_assert_int_eq(cudaStreamDestroy(s1), cudaSuccess);
    ck_assert_int_eq(cudaStreamDestroy(s2), cudaSuccess);
}
END_TEST

static void *sync_copy(void *arg)
{
    static char a[64], b[64];
    (void)arg;
    cudaMemcpy(a, b, sizeof(a), cudaMemcpyHostToHost);
    atomic_store(&copy_done, 1);
    return NULL;
}

/* cudaMemcpy (the legacy stream) waits for a busy blocking stream, and
 * not for a busy non-blocking one. */
static void check_legacy(unsigned flags, int waits)
{
    reset();
    cudaStream_t s;
    pthread_t t;
    ck_assert_int_eq(cudaStreamCreateWithFlags(&s, flags), cudaSuccess);
    ck_assert_int_eq(cudaLaunchHostFunc(s, hold, NULL), cudaSuccess);
    ck_assert_msg(wait_flag(&a_started, 30000), "the host function never started");
    ck_assert_int_eq(pthread_create(&t, NULL, sync_copy, NULL), 0);
    if (waits) {
        sleep_ms(300);
        ck_assert_msg(!atomic_load(&copy_done), "cudaMemcpy did not wait for a busy blocking stream");
        atomic_store(&release, 1);
        ck_assert_msg(wait_flag(&copy_done, 30000), "cudaMemcpy still waits after the stream went idle");
    } else {
        ck_assert_msg(wait_flag(&copy_done, 30000), "cudaMemcpy waited for a non-blocking stream");
        atomic_store(&release, 1);
    }
    pthread_join(t, NULL);
    ck_assert_int_eq(cudaStreamDestroy(s), cudaSuccess);
}

START_TEST(legacy_blocking) { check_legacy(cudaStreamDefault, 1); }
END_TEST

START_TEST(legacy_nonblocking) { check_legacy(cudaStreamNonBlocking, 0); }
END_TEST

static void CUDART_CB calls_cuda(void *arg)
{
    int d;
    (void)arg;
    cudaGetDevice(&d);
}

/* A CUDA call from a host function stops the process with a message. */
START_TEST(call_in_host_function)
{
    int err[2];
    ck_assert_int_eq(pipe(err), 0);
    pid_t p = fork();
    if (p == 0) {
        dup2(err[1], 2);
        cudaStream_t s;
        cudaStreamCreate(&s);
        cudaLaunchHostFunc(s, calls_cuda, NULL);
        cudaStreamSynchronize(s);
        _exit(0);
    }
    close(err[1]);
    char text[512] = {0};
    size_t n = 0;
    ssize_t r;
    while (n < sizeof(text) - 1 && (r = read(err[0], text + n, sizeof(text) - 1 - n)) > 0)
        n += (size_t)r;
    close(err[0]);
    int status;
    waitpid(p, &status, 0);
    ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT, "the child was not aborted (status %d)", status);
    ck_assert_msg(strstr(text, "cudaGetDevice called from a host function"), "message: %s", text);
}
END_TEST


/* Runs fn in a forked child (process-wide stand-in state starts fresh) and
 * returns its wait status; its stderr goes to text. */
static int in_child(void (*fn)(void), char *text, size_t cap)
{
    int err[2];
    ck_assert_int_eq(pipe(err), 0);
    fflush(NULL);
    pid_t p = fork();
    if (p == 0) {
        dup2(err[1], 2);
        close(err[0]);
        fn();
        _exit(0);
    }
    close(err[1]);
    size_t n = 0;
    ssize_t r;
    while (n < cap - 1 && (r = read(err[0], text + n, cap - 1 - n)) > 0)
        n += (size_t)r;
    text[n] = '\0';
    close(err[0]);
    int status;
    waitpid(p, &status, 0);
    return status;
}

int cuda_fake_context_exists(void); /* tests/cuda_fake.c */

/* No context until a runtime call that makes one: counting devices makes
 * none, cudaSetDevice does (the primary context, as CUDA 12 on). */
static void context_child(void)
{
    int n = 0;
    if (cuda_fake_context_exists() || cudaGetDeviceCount(&n) != cudaSuccess || cuda_fake_context_exists())
        _exit(1);
    if (cudaSetDevice(0) != cudaSuccess || !cuda_fake_context_exists())
        _exit(2);
}

START_TEST(context_at_first_call)
{
    char text[256];
    int status = in_child(context_child, text, sizeof(text));
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %d: %s", status, text);
}
END_TEST

/* A process's own IPC handles do not open, as CUDA's ("invalid device
 * context"). */
START_TEST(own_ipc_handle)
{
    void *d = NULL, *mapped = NULL;
    cudaIpcMemHandle_t h;
    ck_assert_int_eq(cudaMalloc(&d, 4096), cudaSuccess);
    ck_assert_int_eq(cudaIpcGetMemHandle(&h, d), cudaSuccess);
    ck_assert_int_eq(cudaIpcOpenMemHandle(&mapped, h, 0), cudaErrorInvalidContext);
    static cudaEvent_t e; /* the stand-in keeps destroyed events (a wait may hold one): reachable */
    cudaEvent_t opened;
    cudaIpcEventHandle_t eh;
    ck_assert_int_eq(cudaEventCreateWithFlags(&e, cudaEventInterprocess | cudaEventDisableTiming), cudaSuccess);
    ck_assert_int_eq(cudaIpcGetEventHandle(&eh, e), cudaSuccess);
    ck_assert_int_eq(cudaIpcOpenEventHandle(&opened, eh), cudaErrorInvalidContext);
    ck_assert_int_eq(cudaFree(d), cudaSuccess);
}
END_TEST

/* cudaFree of memory another process still maps aborts with a message;
 * once it closed its mapping, the same free works. */
static int close_first;

static void free_child(void)
{
    void *d = NULL;
    cudaIpcMemHandle_t h;
    int go[2], done[2];
    if (cudaMalloc(&d, 4096) != cudaSuccess || cudaIpcGetMemHandle(&h, d) != cudaSuccess || pipe(go) || pipe(done))
        _exit(3);
    pid_t importer = fork();
    if (importer == 0) { /* ends when the parent's end of done closes, even when it aborted */
        close(go[0]);
        close(done[1]);
        void *m = NULL;
        char c = 0;
        if (cudaIpcOpenMemHandle(&m, h, 0) != cudaSuccess)
            _exit(1);
        if (close_first && cudaIpcCloseMemHandle(m) != cudaSuccess)
            _exit(1);
        if (write(go[1], &c, 1) != 1 || read(done[0], &c, 1) < 0)
            _exit(1);
        _exit(0);
    }
    close(go[1]);
    close(done[0]);
    char c;
    if (read(go[0], &c, 1) != 1)
        _exit(4);
    cudaError_t err = cudaFree(d); /* aborts while the importer maps it */
    if (write(done[1], &c, 1) != 1)
        _exit(5);
    waitpid(importer, NULL, 0);
    _exit(err == cudaSuccess ? 0 : 6);
}

START_TEST(free_while_mapped)
{
    char text[512];
    close_first = 0;
    int status = in_child(free_child, text, sizeof(text));
    ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT, "not aborted (status %d): %s", status, text);
    ck_assert_msg(strstr(text, "still map it"), "message: %s", text);
    close_first = 1;
    status = in_child(free_child, text, sizeof(text));
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %d: %s", status, text);
}
END_TEST

/* Under capture, work is recorded and not run; synchronizing the stream
 * and copying to or from pageable host memory fail and invalidate it. */
START_TEST(capture_rules)
{
    cudaStream_t s;
    cudaGraph_t g = NULL;
    enum cudaStreamCaptureStatus st;
    int *d = NULL, *pinned = NULL, pageable[4] = {0};
    ck_assert_int_eq(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    ck_assert_int_eq(cudaMalloc((void **)&d, sizeof(pageable)), cudaSuccess);
    ck_assert_int_eq(cudaHostAlloc((void **)&pinned, sizeof(pageable), cudaHostAllocDefault), cudaSuccess);
    ck_assert_int_eq(cudaMemset(d, 0, sizeof(pageable)), cudaSuccess);
    pinned[0] = 7;
    ck_assert_int_eq(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), cudaSuccess);
    ck_assert_int_eq(cudaStreamIsCapturing(s, &st), cudaSuccess);
    ck_assert_int_eq(st, cudaStreamCaptureStatusActive);
    ck_assert_int_eq(cudaMemcpyAsync(d, pinned, sizeof(pageable), cudaMemcpyHostToDevice, s), cudaSuccess);
    ck_assert_int_eq(cudaStreamEndCapture(s, &g), cudaSuccess);
    ck_assert_ptr_nonnull(g);
    ck_assert_int_eq(cudaGraphDestroy(g), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(pageable, d, sizeof(pageable), cudaMemcpyDeviceToHost), cudaSuccess);
    ck_assert_int_eq(pageable[0], 0); /* captured, never run */

    ck_assert_int_eq(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), cudaSuccess);
    ck_assert_int_eq(cudaStreamSynchronize(s), cudaErrorStreamCaptureUnsupported);
    ck_assert_int_eq(cudaStreamIsCapturing(s, &st), cudaSuccess);
    ck_assert_int_eq(st, cudaStreamCaptureStatusInvalidated);
    ck_assert_int_eq(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);

    ck_assert_int_eq(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), cudaSuccess);
    ck_assert_int_eq(cudaMemcpyAsync(pageable, d, sizeof(pageable), cudaMemcpyDeviceToHost, s),
                     cudaErrorStreamCaptureUnsupported);
    ck_assert_int_eq(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    ck_assert_int_eq(cudaStreamBeginCapture(NULL, cudaStreamCaptureModeRelaxed), cudaErrorStreamCaptureUnsupported);
    ck_assert_int_eq(cudaFreeHost(pinned), cudaSuccess);
    ck_assert_int_eq(cudaFree(d), cudaSuccess);
    ck_assert_int_eq(cudaStreamDestroy(s), cudaSuccess);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cuda_fake_rules");
    TCase *tc = tcase_create("rules");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, callback_thread);
    tcase_add_test(tc, legacy_blocking);
    tcase_add_test(tc, legacy_nonblocking);
    tcase_add_test(tc, call_in_host_function);
    tcase_add_test(tc, context_at_first_call);
    tcase_add_test(tc, own_ipc_handle);
    tcase_add_test(tc, free_while_mapped);
    tcase_add_test(tc, capture_rules);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
