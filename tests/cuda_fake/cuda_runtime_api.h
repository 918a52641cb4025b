/* A stand-in for the CUDA runtime API, just what cuda/hmem_cuda.c,
 * cuda/cuda_device.c and tests/test_cuda_coll.c call, implemented on the
 * host by tests/cuda_fake.c: "device" memory is malloc'd memory that
 * cudaPointerGetAttributes reports as device memory, and every stream is a
 * worker thread running its queue in order (copies after a random short
 * delay), so the staging layer's stream, event and host-function ordering
 * is exercised on machines without a GPU. Not a CUDA emulator: the only
 * "kernel" is braid__cuda_reduce, run by the CPU engine as a stream
 * operation (tests/cuda_fake.c); one device. It keeps CUDA's rules that
 * real hardware enforces and a host-only model easily forgets: host
 * functions of all streams run on one callback thread per process, in
 * turn; a CUDA call made from a host function aborts with a message; the
 * legacy default stream synchronizes with every blocking stream (work on
 * one waits for work queued earlier on the other); cudaMemcpy, cudaMemset,
 * cudaHostAlloc, cudaMallocHost and cudaFreeHost wait for the legacy
 * stream and so for busy blocking streams; cudaFree synchronizes the
 * device; and the first launch of each kernel in a process ("lazy module
 * loading") synchronizes the device unless braid__cuda_preload ran. Device allocations and inter-process events live in
 * memfd mappings, so cudaIpc* handles work between forked ranks (an
 * opened handle maps the owner's memfd through /proc/<pid>/fd): the
 * cuda_ipc transport runs on it. CUDA_FAKE_BUS_ID sets the device's PCI
 * bus id (a peer with another id is "not visible"), CUDA_FAKE_NO_IPC=1
 * turns IPC event support off. */
#ifndef BRAID_CUDA_FAKE_RUNTIME_API_H
#define BRAID_CUDA_FAKE_RUNTIME_API_H

#include <stddef.h>

#define CUDART_CB

typedef enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorIllegalState = 401,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureInvalidated = 901,
    cudaErrorInvalidContext = 201,
    cudaErrorMapBufferObjectFailed = 205,
    cudaErrorNotReady = 600,
} cudaError_t;

typedef struct fake_stream *cudaStream_t;
typedef struct fake_event *cudaEvent_t;
typedef struct fake_graph *cudaGraph_t;
typedef void (*cudaHostFn_t)(void *user_data);
typedef struct { char reserved[64]; } cudaIpcMemHandle_t;
typedef struct { char reserved[64]; } cudaIpcEventHandle_t;

enum cudaMemcpyKind { cudaMemcpyHostToHost = 0, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
                      cudaMemcpyDeviceToDevice, cudaMemcpyDefault };
enum cudaMemoryType { cudaMemoryTypeUnregistered = 0, cudaMemoryTypeHost, cudaMemoryTypeDevice,
                      cudaMemoryTypeManaged };
enum cudaStreamCaptureStatus { cudaStreamCaptureStatusNone = 0, cudaStreamCaptureStatusActive,
                               cudaStreamCaptureStatusInvalidated };
enum cudaStreamCaptureMode { cudaStreamCaptureModeGlobal = 0, cudaStreamCaptureModeThreadLocal,
                             cudaStreamCaptureModeRelaxed };
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16, cudaDevAttrIpcEventSupport = 130 };

struct cudaPointerAttributes {
    enum cudaMemoryType type;
    int device;
    void *devicePointer;
    void *hostPointer;
};

#define cudaStreamDefault 0x0
#define cudaStreamNonBlocking 0x1
#define cudaEventDefault 0x0
#define cudaEventDisableTiming 0x2
#define cudaEventInterprocess 0x4
#define cudaIpcMemLazyEnablePeerAccess 0x1
#define cudaHostAllocDefault 0x0
#define cudaHostAllocPortable 0x1
#define cudaHostAllocMapped 0x2

const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);
cudaError_t cudaGetLastError(void);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaGetDevice(int *d);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int d);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p);
cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaFree(void *p);
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMallocHost(void **p, size_t n);
cudaError_t cudaHostGetDevicePointer(void **d, void *h, unsigned flags);
cudaError_t cudaMemset(void *p, int v, size_t n);
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k);
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st);
cudaError_t cudaMemcpy2DAsync(void *d, size_t dpitch, const void *s, size_t spitch, size_t width, size_t height,
                              enum cudaMemcpyKind k, cudaStream_t st);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *c);
/* Capture records the stream's work instead of running it; the graph is
 * not replayed here (no cudaGraphLaunch). During a capture, synchronizing
 * or querying the stream and copies between it and pageable host memory
 * fail as CUDA's do (cudaErrorStreamCaptureUnsupported) and invalidate it. */
cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *arg);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *h, void *p);
cudaError_t cudaIpcOpenMemHandle(void **p, cudaIpcMemHandle_t h, unsigned flags);
cudaError_t cudaIpcCloseMemHandle(void *p);
cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t *h, cudaEvent_t e);
cudaError_t cudaIpcOpenEventHandle(cudaEvent_t *e, cudaIpcEventHandle_t h);
cudaError_t cudaDeviceGetPCIBusId(char *id, int len, int device);
cudaError_t cudaDeviceGetByPCIBusId(int *device, const char *id);
cudaError_t cudaDeviceCanAccessPeer(int *can, int device, int peer);

#endif
