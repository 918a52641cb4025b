/* Device discovery and the process-wide device (see verbs_dev.h). */
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "log.h"
#include "param.h"
#include "status.h"
#include "verbs_conn.h"
#include "verbs_dev.h"
#include "verbs_proto.h"

/* What discovery settled on; ctx stays open for the caller. */
typedef struct {
    struct ibv_context *ctx;
    char name[64];
    uint8_t port;
    struct ibv_port_attr pattr;
    int gid_index;
    union ibv_gid gid;
} found_port;

/* Append one reason to why, "; "-separated, so a probe that tried several
 * devices says what was wrong with each. */
static void add_reason(char *why, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void add_reason(char *why, size_t cap, const char *fmt, ...)
{
    size_t used = strnlen(why, cap);
    if (used + 3 >= cap)
        return;
    if (used) {
        memcpy(why + used, "; ", 3);
        used += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why + used, cap - used, fmt, ap);
    va_end(ap);
}

/* GID type from sysfs, for kernels without the extended query. */
static braid_verbs_gid_type sysfs_gid_type(const char *ibdev_path, int port, int index)
{
    char path[512], text[32] = "";
    snprintf(path, sizeof(path), "%s/ports/%d/gid_attrs/types/%d", ibdev_path, port, index);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return BRAID_VERBS_GID_UNKNOWN;
    ssize_t n = read(fd, text, sizeof(text) - 1);
    close(fd);
    if (n <= 0)
        return BRAID_VERBS_GID_UNKNOWN;
    text[n] = '\0';
    if (strstr(text, "RoCE v2"))
        return BRAID_VERBS_GID_ROCE_V2;
    if (strstr(text, "RoCE") || strstr(text, "IB/RoCE v1"))
        return BRAID_VERBS_GID_ROCE_V1;
    return BRAID_VERBS_GID_UNKNOWN;
}

/* One GID table entry: 0 when present. */
static int gid_entry(struct ibv_context *ctx, const char *ibdev_path, int port, int index, uint8_t gid[16],
                     braid_verbs_gid_type *type)
{
#ifdef BRAID_VERBS_HAVE_GID_EX
    struct ibv_gid_entry entry;
    int err = ibv_query_gid_ex(ctx, (uint32_t)port, (uint32_t)index, &entry, 0);
    if (err == 0) {
        memcpy(gid, entry.gid.raw, 16);
        *type = entry.gid_type == IBV_GID_TYPE_ROCE_V2   ? BRAID_VERBS_GID_ROCE_V2
                : entry.gid_type == IBV_GID_TYPE_ROCE_V1 ? BRAID_VERBS_GID_ROCE_V1
                                                         : BRAID_VERBS_GID_IB;
        return 0;
    }
    if (err == ENODATA || err == EINVAL)
        return -1; /* an empty slot of the table */
#endif
    union ibv_gid g;
    if (ibv_query_gid(ctx, (uint8_t)port, index, &g) != 0)
        return -1;
    memcpy(gid, g.raw, 16);
    *type = sysfs_gid_type(ibdev_path, port, index);
    return 0;
}

static int gid_nonzero(const uint8_t *g)
{
    for (int i = 0; i < 16; i++)
        if (g[i])
            return 1;
    return 0;
}

/* The GID index of a RoCE port: BRAID_IB_GID_INDEX, else the best RoCE v2
 * entry, else (with a note) the first non-zero entry of any type. */
static int pick_gid(struct ibv_context *ctx, const char *ibdev_path, const char *name, int port, int tbl_len,
                    union ibv_gid *out, char *why, size_t cap)
{
    long long forced = braid__param_int("BRAID_IB_GID_INDEX", -1);
    uint8_t g[16];
    braid_verbs_gid_type t;
    if (forced >= 0) {
        if (forced >= tbl_len || gid_entry(ctx, ibdev_path, port, (int)forced, g, &t) != 0 || !gid_nonzero(g)) {
            add_reason(why, cap, "BRAID_IB_GID_INDEX=%lld is not a valid GID of %s port %d (table of %d)", forced, name,
                       port, tbl_len);
            return -1;
        }
        memcpy(out->raw, g, 16);
        return (int)forced;
    }
    enum { MAX_GIDS = 256 };
    uint8_t gids[MAX_GIDS][16];
    braid_verbs_gid_type types[MAX_GIDS];
    int present[MAX_GIDS];
    int n = tbl_len < MAX_GIDS ? tbl_len : MAX_GIDS;
    for (int i = 0; i < n; i++)
        present[i] = gid_entry(ctx, ibdev_path, port, i, gids[i], &types[i]) == 0;
    int idx = braid__verbs_gid_pick((const uint8_t(*)[16])gids, types, present, n);
    if (idx < 0) {
        for (int i = 0; i < n && idx < 0; i++)
            if (present[i] && gid_nonzero(gids[i]))
                idx = i;
        if (idx >= 0)
            BRAID_INFO("verbs: %s port %d has no RoCE v2 GID; using GID index %d (RoCE v1: not routable)", name, port,
                       idx);
    }
    if (idx < 0) {
        add_reason(why, cap, "%s port %d has no usable GID (no IP address on its netdev?)", name, port);
        return -1;
    }
    memcpy(out->raw, gids[idx], 16);
    return idx;
}

/* "DOWN" rather than ibv_port_state_str's "PORT_DOWN": reads as a sentence
 * in "port 1 of mlx5_0 is DOWN". */
static const char *port_state_name(enum ibv_port_state st)
{
    switch (st) {
    case IBV_PORT_NOP:
        return "NOP";
    case IBV_PORT_DOWN:
        return "DOWN";
    case IBV_PORT_INIT:
        return "INIT (no subnet manager yet?)";
    case IBV_PORT_ARMED:
        return "ARMED";
    case IBV_PORT_ACTIVE:
        return "ACTIVE";
    case IBV_PORT_ACTIVE_DEFER:
        return "ACTIVE_DEFER";
    default:
        return "in an unknown state";
    }
}

static int try_port(struct ibv_context *ctx, const char *ibdev_path, const char *name, int port, found_port *f,
                    char *why, size_t cap)
{
    struct ibv_port_attr pa;
    if (ibv_query_port(ctx, (uint8_t)port, &pa) != 0) {
        add_reason(why, cap, "cannot query port %d of %s: %s", port, name, strerror(errno));
        return -1;
    }
    if (pa.state != IBV_PORT_ACTIVE) {
        add_reason(why, cap, "port %d of %s is %s", port, name, port_state_name(pa.state));
        return -1;
    }
    f->gid_index = -1;
    memset(&f->gid, 0, sizeof(f->gid));
    if (pa.link_layer == IBV_LINK_LAYER_ETHERNET) {
        f->gid_index = pick_gid(ctx, ibdev_path, name, port, pa.gid_tbl_len, &f->gid, why, cap);
        if (f->gid_index < 0)
            return -1;
    } else {
        if (pa.lid == 0) {
            add_reason(why, cap, "port %d of %s has no LID (is a subnet manager running?)", port, name);
            return -1;
        }
        /* InfiniBand routes by LID inside a subnet; a GID is only needed to
         * cross routers, and then the operator names it. */
        if (braid__param_str("BRAID_IB_GID_INDEX")) {
            f->gid_index = pick_gid(ctx, ibdev_path, name, port, pa.gid_tbl_len, &f->gid, why, cap);
            if (f->gid_index < 0)
                return -1;
        }
    }
    f->port = (uint8_t)port;
    f->pattr = pa;
    return 0;
}

static int try_device(struct ibv_device *dev, int want_port, found_port *f, char *why, size_t cap)
{
    const char *name = ibv_get_device_name(dev);
    if (dev->transport_type != IBV_TRANSPORT_IB) {
        add_reason(why, cap, "%s is not an InfiniBand/RoCE device (iWARP and others need rdma_cm)", name);
        return -1;
    }
    struct ibv_context *ctx = ibv_open_device(dev);
    if (!ctx) {
        add_reason(why, cap, "cannot open %s: %s", name, strerror(errno));
        return -1;
    }
    struct ibv_device_attr attr;
    if (ibv_query_device(ctx, &attr) != 0) {
        add_reason(why, cap, "cannot query %s: %s", name, strerror(errno));
        ibv_close_device(ctx);
        return -1;
    }
    if (want_port > attr.phys_port_cnt) {
        add_reason(why, cap, "%s has no port %d (it has %d)", name, want_port, attr.phys_port_cnt);
        ibv_close_device(ctx);
        return -1;
    }
    int first = want_port ? want_port : 1, last = want_port ? want_port : attr.phys_port_cnt;
    for (int p = first; p <= last; p++) {
        if (try_port(ctx, dev->ibdev_path, name, p, f, why, cap) == 0) {
            f->ctx = ctx;
            snprintf(f->name, sizeof(f->name), "%s", name);
            return 0;
        }
    }
    ibv_close_device(ctx);
    return -1;
}

static braid_status discover(found_port *f, char *why, size_t cap)
{
    why[0] = '\0';
    int n = 0;
    errno = 0;
    struct ibv_device **devs = ibv_get_device_list(&n);
    if (!devs) {
        snprintf(why, cap, "cannot list RDMA devices: %s",
                 errno == ENOSYS ? "the kernel has no RDMA support" : strerror(errno));
        return BRAID_ERR_UNSUPPORTED;
    }
    braid_status st = BRAID_ERR_UNSUPPORTED;
    if (n == 0) {
        snprintf(why, cap, "no RDMA devices found");
        goto out_free;
    }
    const char *spec = braid__param_str("BRAID_IB_HCA");
    if (spec) {
        braid_verbs_hca want[BRAID_VERBS_HCA_MAX];
        int nwant;
        if (braid__verbs_hca_parse(spec, want, BRAID_VERBS_HCA_MAX, &nwant, why, cap) != BRAID_OK)
            goto out_free;
        for (int w = 0; w < nwant; w++) {
            int i = 0;
            while (i < n && strcmp(ibv_get_device_name(devs[i]), want[w].name) != 0)
                i++;
            if (i == n) {
                char have[256] = "";
                for (int j = 0; j < n; j++)
                    add_reason(have, sizeof(have), "%s", ibv_get_device_name(devs[j]));
                add_reason(why, cap, "device %s (BRAID_IB_HCA) not found (have: %s)", want[w].name, have);
                continue;
            }
            if (try_device(devs[i], want[w].port, f, why, cap) == 0) {
                st = BRAID_OK;
                goto out_free;
            }
        }
    } else {
        for (int i = 0; i < n; i++) {
            if (try_device(devs[i], 0, f, why, cap) == 0) {
                st = BRAID_OK;
                goto out_free;
            }
        }
    }
out_free:
    ibv_free_device_list(devs);
    return st;
}

/* Whether this thread may lock memory past RLIMIT_MEMLOCK (CAP_IPC_LOCK,
 * as root usually has). */
static int can_lock_any(void)
{
    struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3];
    memset(data, 0, sizeof(data));
    if (syscall(SYS_capget, &hdr, data) != 0)
        return 0;
    return (data[CAP_IPC_LOCK / 32].effective >> (CAP_IPC_LOCK % 32)) & 1;
}

/* Registration pins pages, which RLIMIT_MEMLOCK caps: below one
 * connection's rings every connection would fail at set-up, so the device
 * counts as unusable and the group falls back before trying. */
static braid_status memlock_check(char *why, size_t why_len)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY || can_lock_any())
        return BRAID_OK;
    size_t need = braid__verbs_conn_pinned_bytes();
    if ((unsigned long long)rl.rlim_cur >= need)
        return BRAID_OK;
    snprintf(why, why_len,
             "RLIMIT_MEMLOCK is %llu KiB, need %zu KiB per connection (BRAID_IB_SLOTS x BRAID_IB_SLOT_BYTES x 2); "
             "raise ulimit -l",
             (unsigned long long)rl.rlim_cur / 1024, need / 1024);
    return BRAID_ERR_UNSUPPORTED;
}

braid_status braid__verbs_probe(char *why, size_t why_len)
{
    found_port f;
    char local[512];
    braid_status st = discover(&f, local, sizeof(local));
    if (st != BRAID_OK) {
        snprintf(why, why_len, "%s", local);
        return st;
    }
    ibv_close_device(f.ctx);
    return memlock_check(why, why_len);
}

/* ---- the shared device --------------------------------------------------- */

static pthread_mutex_t dev_mu = PTHREAD_MUTEX_INITIALIZER;
static braid_verbs_dev *the_dev;

static int cache_reg(void *ctx, void *addr, size_t len, void **mr, uint32_t *lkey)
{
    braid_verbs_dev *dev = ctx;
    struct ibv_mr *m = ibv_reg_mr(dev->pd, addr, len, IBV_ACCESS_LOCAL_WRITE);
    if (!m)
        return errno ? errno : EIO;
    *mr = m;
    *lkey = m->lkey;
    return 0;
}

static void cache_dereg(void *ctx, void *mr)
{
    (void)ctx;
    if (ibv_dereg_mr(mr) != 0)
        BRAID_WARN("verbs: ibv_dereg_mr failed: %m");
}

/* Training processes fork (data-loader workers). On kernels that do not
 * keep pinned pages with their owner across fork, a parent touching a
 * registered page after fork gets a copy the HCA never sees; ibv_fork_init
 * marks registrations MADV_DONTFORK to prevent that. It must run before the
 * first registration, so it runs here, once. */
static void fork_safety(int rank)
{
#ifdef BRAID_VERBS_HAVE_FORK_STATUS
    if (ibv_is_fork_initialized() != IBV_FORK_DISABLED)
        return; /* the kernel handles it, or someone already asked */
#endif
    int err = ibv_fork_init();
    if (err)
        BRAID_INFO("rank %d: verbs: ibv_fork_init: %s (fork after init may corrupt RDMA buffers)", rank, strerror(err));
}

static braid_status dev_open(int rank, braid_verbs_dev **out)
{
    braid_verbs_dev *dev = calloc(1, sizeof(*dev));
    if (!dev)
        return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: out of memory for the RDMA device", rank);
    found_port f;
    char why[512];
    fork_safety(rank);
    braid_status st = discover(&f, why, sizeof(why));
    if (st != BRAID_OK) {
        free(dev);
        return braid__error(st, "rank %d: verbs transport unusable: %s", rank, why);
    }
    dev->ctx = f.ctx;
    snprintf(dev->name, sizeof(dev->name), "%s", f.name);
    dev->port = f.port;
    dev->link_layer = f.pattr.link_layer;
    dev->mtu = f.pattr.active_mtu;
    dev->lid = f.pattr.lid;
    dev->gid_index = f.gid_index;
    dev->gid = f.gid;
    if (ibv_query_device(dev->ctx, &dev->attr) != 0) {
        st = braid__error(BRAID_ERR_SYSTEM, "rank %d: cannot query RDMA device %s: %m", rank, dev->name);
        goto err_close;
    }
    dev->pd = ibv_alloc_pd(dev->ctx);
    if (!dev->pd) {
        st = braid__error(BRAID_ERR_SYSTEM, "rank %d: ibv_alloc_pd on %s: %m", rank, dev->name);
        goto err_close;
    }
    long page = sysconf(_SC_PAGESIZE);
    braid_verbs_regcache_cfg cc = {
        .reg = cache_reg,
        .dereg = cache_dereg,
        .ctx = dev,
        .page_bytes = page > 0 ? (size_t)page : 4096,
        .max_regions = (size_t)braid__param_int("BRAID_IB_REGCACHE_MAX", 256),
        .max_bytes = (size_t)braid__param_int("BRAID_IB_REGCACHE_BYTES", 8ll << 30),
    };
    if (braid__verbs_regcache_init(&dev->cache, &cc) != 0) {
        st = braid__error(BRAID_ERR_INVALID_ARG, "rank %d: BRAID_IB_REGCACHE_MAX must be at least 1", rank);
        goto err_pd;
    }
    dev->implicit_reg = braid__param_int("BRAID_IB_REGCACHE", 0) != 0;
    pthread_mutex_init(&dev->mu, NULL);
    dev->pid = getpid();
    char gid_text[64] = "none";
    if (dev->gid_index >= 0) {
        const uint8_t *g = dev->gid.raw;
        snprintf(gid_text, sizeof(gid_text), "%d (%02x%02x:%02x%02x:...:%02x%02x:%02x%02x)", dev->gid_index, g[0], g[1],
                 g[2], g[3], g[12], g[13], g[14], g[15]);
    }
    BRAID_INFO("rank %d: verbs device %s port %u, %s, mtu %u, lid %u, gid index %s", rank, dev->name, dev->port,
               dev->link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand",
               braid__verbs_mtu_bytes((uint8_t)dev->mtu), dev->lid, gid_text);
    *out = dev;
    return BRAID_OK;

err_pd:
    ibv_dealloc_pd(dev->pd);
err_close:
    ibv_close_device(dev->ctx);
    free(dev);
    return st;
}

static void dev_close(braid_verbs_dev *dev)
{
    size_t leaked = braid__verbs_regcache_fini(&dev->cache);
    if (leaked)
        BRAID_WARN("verbs: %zu memory registrations still in use at close (missing dereg_mem?)", leaked);
    if (ibv_dealloc_pd(dev->pd) != 0)
        BRAID_WARN("verbs: ibv_dealloc_pd on %s failed: %m", dev->name);
    if (ibv_close_device(dev->ctx) != 0)
        BRAID_WARN("verbs: ibv_close_device on %s failed: %m", dev->name);
    pthread_mutex_destroy(&dev->mu);
    free(dev);
}

braid_status braid__verbs_dev_acquire(int rank, braid_verbs_dev **out)
{
    pthread_mutex_lock(&dev_mu);
    /* A child forked after the parent opened the device inherits a context
     * it cannot use; it forgets it (the parent still owns it) and opens
     * its own. */
    if (the_dev && the_dev->pid != getpid())
        the_dev = NULL;
    braid_status st = BRAID_OK;
    if (!the_dev)
        st = dev_open(rank, &the_dev);
    if (st == BRAID_OK) {
        pthread_mutex_lock(&the_dev->mu);
        the_dev->refs++;
        pthread_mutex_unlock(&the_dev->mu);
        *out = the_dev;
    }
    pthread_mutex_unlock(&dev_mu);
    return st;
}

void braid__verbs_dev_release(braid_verbs_dev *dev)
{
    pthread_mutex_lock(&dev_mu);
    pthread_mutex_lock(&dev->mu);
    int left = --dev->refs;
    pthread_mutex_unlock(&dev->mu);
    if (left == 0 && dev->pid == getpid()) {
        if (the_dev == dev)
            the_dev = NULL;
        dev_close(dev);
    }
    pthread_mutex_unlock(&dev_mu);
}
