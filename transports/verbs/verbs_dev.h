/* The RDMA device a process uses: found once (BRAID_IB_HCA, else the first
 * device with an active port), opened once and shared by every listener and
 * connection of the process, with its protection domain and registration
 * cache. */
#ifndef BRAID_VERBS_DEV_H
#define BRAID_VERBS_DEV_H

#include <infiniband/verbs.h>
#include <pthread.h>
#include <sys/types.h>

#include "braid.h"
#include "verbs_regcache.h"

typedef struct braid_verbs_dev {
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_device_attr attr;
    char name[64];
    uint8_t port;
    uint8_t link_layer; /* IBV_LINK_LAYER_INFINIBAND or _ETHERNET */
    enum ibv_mtu mtu;   /* the port's active MTU */
    uint16_t lid;
    int gid_index; /* -1: no GRH (InfiniBand inside one subnet) */
    union ibv_gid gid;

    /* Guards refs and the cache: connections on different threads share
     * them. */
    pthread_mutex_t mu;
    int refs;
    pid_t pid; /* a forked child must not use its parent's context */
    braid_verbs_regcache cache;
    int implicit_reg; /* BRAID_IB_REGCACHE=1: register send buffers on demand */
} braid_verbs_dev;

/* Is a usable device and port there? Opens and closes it; on failure the
 * reason ("no RDMA devices found", "port 1 of mlx5_0 is DOWN", ...) is
 * written into why. */
braid_status braid__verbs_probe(char *why, size_t why_len);

/* The shared device, opened on first use (error text names rank). */
braid_status braid__verbs_dev_acquire(int rank, braid_verbs_dev **dev);
void braid__verbs_dev_release(braid_verbs_dev *dev);

#endif
