/* Internal to cuda/device_coll_*.c: a group's device-collective state,
 * shared by the set-up and calls (device_coll_group.c) and the teardown
 * (device_coll_teardown.c). */
#ifndef BRAID_DEVICE_COLL_INT_H
#define BRAID_DEVICE_COLL_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "device_coll.h"
#include "pg.h"

/* One block's segment of one slot: the largest chunk a block moves
 * between two barriers. 32 blocks x 2 slots x 256 KiB = 16 MiB a rank. */
#define SEG_BYTES (256u << 10)

/* Streams whose last kernel a group remembers (devcoll_flush). */
#define LAST_STREAMS 8

/* What each rank publishes in the store. */
typedef struct {
    uint32_t ok; /* 1: a region is made here; 0: none; 2 (at group creation): no CUDA context yet */
    int32_t pid;
    int32_t sm_count;
    uint32_t pidns; /* pid's namespace (src/base/proc_id.h): two containers may both have a pid 1 */
    uint64_t region; /* the region's address in its own process */
    char bus[32];    /* the device's PCI bus id: ranks that share a GPU share its SMs */
    cudaIpcMemHandle_t handle;
} region_record;

struct braid_devcoll_group {
    int device;
    int ready;      /* every rank mapped every region */
    int max_blocks; /* blocks a call may use (group_blocks) */
    char *region;   /* ours */
    char *peer[BRAID_DEVCOLL_MAX_RANKS];
    int opened[BRAID_DEVCOLL_MAX_RANKS]; /* peer[p] came from cudaIpcOpenMemHandle */
    uint32_t *flags_host;                /* [0]: abort; then the fault record */
    void *flags_dev;
    region_record mine;
    /* The watchdog: a thread that waits on a pidfd per peer process and
     * sets the abort flag the moment one exits, so a dead peer ends the
     * kernels at once instead of at their timeout. */
    int pidfd[BRAID_DEVCOLL_MAX_RANKS]; /* -1: none (a thread of this process, or no pidfd) */
    int stop_fd;
    pthread_t watch;
    int watching;
    atomic_int dead_rank; /* -1 until the watchdog saw a peer exit */
    int exported;         /* peers may have mapped region: free it only once they let go */
    int peers_let_go;     /* every peer closed its mapping of region (braid__devcoll_detach) */
    atomic_int detaching;
    /* The last kernel launched on each stream (a few streams, the oldest
     * waited for and reused when more appear): what a flush waits for,
     * since a call's work handle completes when its kernel is queued. */
    cudaEvent_t last_ev[LAST_STREAMS];
    cudaStream_t last_stream[LAST_STREAMS];
    int nlast;
    int one_process;      /* every rank is a thread of this process */
};

/* Unmap the peers' regions this rank opened. */
void braid__devcoll_close_peers(struct braid_devcoll_group *g);

/* Make every waiting kernel of the group give up (one store). */
void braid__devcoll_raise_abort(struct braid_devcoll_group *g);

/* A kernel gave up, or a peer process exited: the group is broken. */
int braid__devcoll_faulted(struct braid_devcoll_group *g);

/* Remember stream's last kernel, for braid__devcoll_flush. */
void braid__devcoll_note_launch(struct braid_devcoll_group *g, void *stream);

#endif
