/* In-process fake of the libibverbs entry points the verbs transport uses
 * (see verbs_fake.h). One device "fake0" with one RoCE port; queue pairs
 * in a global table; work requests execute under one lock when posted (or,
 * after an RNR wait, when the receiver posts a receive), with every check
 * listed in the header. */
#include <errno.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "verbs_fake.h"

/* verbs.h turns these into inline wrappers; the fake defines the symbols
 * the wrappers call. */
#undef ibv_query_port
#undef ibv_reg_mr

#define MAX_QP 1024
#define MAX_MR 8192
#define QPN_BASE 0x100
#define NGIDS 4

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int live_ctx, live_pd, live_mr, live_cq, live_qp, live_chan;
static int fail_next_status = -1;
static unsigned long n_writes, n_sends;

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("verbs fake: misuse: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    abort();
}

typedef struct {
    struct ibv_pd pd;
    int mrs, qps;
} fake_pd;

typedef struct {
    struct ibv_mr mr;
    int access;
} fake_mr;

typedef struct fake_cq fake_cq;

typedef struct {
    struct ibv_comp_channel ch;
    fake_cq *fired[256];
    int nfired;
    int cqs;
} fake_chan;

typedef struct {
    struct ibv_wc wc;
    int is_send;
} fake_cqe;

struct fake_cq {
    struct ibv_cq cq;
    fake_cqe *ring;
    int cap, first, count;
    int armed;
    unsigned events, acked;
    int qps;
};

typedef struct {
    uint64_t wr_id;
    enum ibv_wr_opcode opcode;
    uint32_t imm; /* big endian, as posted */
    int signaled;
    int nsge;
    struct ibv_sge sge;
    uint64_t raddr;
    uint32_t rkey;
} fake_wr;

typedef struct {
    struct ibv_qp qp;
    fake_pd *pd;
    int sig_all;
    uint32_t max_send, max_recv, max_sge;
    uint32_t dest_qpn, rq_psn, sq_psn;
    uint64_t *rq;
    uint32_t rq_first, rq_count;
    fake_wr *sq;
    uint32_t sq_first, sq_count; /* posted, not yet executed */
    uint32_t sq_out;             /* posted, completion not yet polled */
} fake_qp;

static fake_qp *qps[MAX_QP];
static fake_mr *mrs[MAX_MR];
static struct ibv_device fake_dev;

int verbs_fake_live(char *desc, size_t cap)
{
    pthread_mutex_lock(&mu);
    int total = live_ctx + live_pd + live_mr + live_cq + live_qp + live_chan;
    snprintf(desc, cap, "contexts %d, PDs %d, MRs %d, CQs %d, QPs %d, channels %d", live_ctx, live_pd, live_mr, live_cq,
             live_qp, live_chan);
    pthread_mutex_unlock(&mu);
    return total;
}

void verbs_fake_fail_next_write(int status)
{
    pthread_mutex_lock(&mu);
    fail_next_status = status;
    pthread_mutex_unlock(&mu);
}

unsigned long verbs_fake_writes(void)
{
    pthread_mutex_lock(&mu);
    unsigned long n = n_writes;
    pthread_mutex_unlock(&mu);
    return n;
}

unsigned long verbs_fake_sends(void)
{
    pthread_mutex_lock(&mu);
    unsigned long n = n_sends;
    pthread_mutex_unlock(&mu);
    return n;
}

/* ---- devices ------------------------------------------------------------- */

static pthread_once_t dev_once = PTHREAD_ONCE_INIT;

static void dev_init(void)
{
    fake_dev.node_type = IBV_NODE_CA;
    fake_dev.transport_type = IBV_TRANSPORT_IB;
    snprintf(fake_dev.name, sizeof(fake_dev.name), "fake0");
    snprintf(fake_dev.dev_name, sizeof(fake_dev.dev_name), "uverbs0");
    snprintf(fake_dev.ibdev_path, sizeof(fake_dev.ibdev_path), "/nonexistent/fake0");
}

struct ibv_device **ibv_get_device_list(int *num_devices)
{
    const char *n = getenv("FAKE_VERBS_DEVICES");
    int count = n && !strcmp(n, "0") ? 0 : 1;
    struct ibv_device **list = calloc(2, sizeof(*list));
    if (!list) {
        errno = ENOMEM;
        return NULL;
    }
    pthread_once(&dev_once, dev_init);
    if (count)
        list[0] = &fake_dev;
    if (num_devices)
        *num_devices = count;
    return list;
}

void ibv_free_device_list(struct ibv_device **list)
{
    free(list);
}

const char *ibv_get_device_name(struct ibv_device *device)
{
    return device->name;
}

static int f_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);
static int f_req_notify_cq(struct ibv_cq *cq, int solicited_only);
static int f_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
static int f_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);

struct ibv_context *ibv_open_device(struct ibv_device *device)
{
    if (device != &fake_dev)
        die("ibv_open_device on a device the fake did not list");
    struct ibv_context *ctx = calloc(1, sizeof(*ctx));
    if (!ctx) {
        errno = ENOMEM;
        return NULL;
    }
    ctx->device = device;
    ctx->cmd_fd = ctx->async_fd = -1;
    ctx->num_comp_vectors = 1;
    ctx->abi_compat = NULL; /* not extended: wrappers take the legacy path */
    ctx->ops.poll_cq = f_poll_cq;
    ctx->ops.req_notify_cq = f_req_notify_cq;
    ctx->ops.post_send = f_post_send;
    ctx->ops.post_recv = f_post_recv;
    pthread_mutex_lock(&mu);
    live_ctx++;
    pthread_mutex_unlock(&mu);
    return ctx;
}

int ibv_close_device(struct ibv_context *context)
{
    pthread_mutex_lock(&mu);
    live_ctx--;
    pthread_mutex_unlock(&mu);
    free(context);
    return 0;
}

int ibv_query_device(struct ibv_context *context, struct ibv_device_attr *attr)
{
    (void)context;
    memset(attr, 0, sizeof(*attr));
    snprintf(attr->fw_ver, sizeof(attr->fw_ver), "fake");
    attr->phys_port_cnt = 1;
    attr->max_qp = MAX_QP;
    attr->max_qp_wr = 16384;
    attr->max_sge = 16;
    attr->max_cq = 1024;
    attr->max_cqe = 65536;
    attr->max_mr = MAX_MR;
    attr->max_pd = 64;
    attr->max_mr_size = UINT64_MAX;
    return 0;
}

#define FAKE_LID 7

/* FAKE_VERBS_LINK=IB: an InfiniBand port (LID routing) instead of RoCE. */
static int fake_ib(void)
{
    const char *l = getenv("FAKE_VERBS_LINK");
    return l && !strcmp(l, "IB");
}

static _Thread_local int thread_port_down;

void verbs_fake_thread_port_down(int down)
{
    thread_port_down = down;
}

int ibv_query_port(struct ibv_context *context, uint8_t port_num, struct _compat_ibv_port_attr *compat)
{
    (void)context;
    /* The inline wrapper hands us the caller's full ibv_port_attr. */
    struct ibv_port_attr *pa = (struct ibv_port_attr *)(void *)compat;
    if (port_num != 1)
        return EINVAL;
    const char *st = getenv("FAKE_VERBS_PORT_STATE");
    pa->state = thread_port_down || (st && !strcmp(st, "DOWN")) ? IBV_PORT_DOWN : IBV_PORT_ACTIVE;
    pa->max_mtu = IBV_MTU_4096;
    pa->active_mtu = IBV_MTU_4096;
    pa->gid_tbl_len = NGIDS;
    if (fake_ib()) {
        const char *lid = getenv("FAKE_VERBS_LID");
        pa->lid = (uint16_t)(lid ? atoi(lid) : FAKE_LID);
        pa->link_layer = IBV_LINK_LAYER_INFINIBAND;
    } else {
        pa->lid = 0;
        pa->link_layer = IBV_LINK_LAYER_ETHERNET;
    }
    pa->max_msg_sz = 1u << 31;
    pa->pkey_tbl_len = 1;
    return 0;
}

/* GID table: 0 link-local RoCE v2, 1 IPv4-mapped RoCE v2 (the one to pick),
 * 2 IPv4-mapped RoCE v1, 3 empty. */
static int gid_at(int index, union ibv_gid *g, uint32_t *type)
{
    memset(g, 0, sizeof(*g));
    switch (index) {
    case 0:
        g->raw[0] = 0xfe;
        g->raw[1] = 0x80;
        g->raw[15] = 1;
        *type = IBV_GID_TYPE_ROCE_V2;
        return 0;
    case 1:
    case 2:
        g->raw[10] = g->raw[11] = 0xff;
        g->raw[12] = 10;
        g->raw[15] = 1;
        *type = index == 1 ? IBV_GID_TYPE_ROCE_V2 : IBV_GID_TYPE_ROCE_V1;
        return 0;
    default:
        return -1;
    }
}

int ibv_query_gid(struct ibv_context *context, uint8_t port_num, int index, union ibv_gid *gid)
{
    (void)context;
    uint32_t type;
    if (port_num != 1 || index < 0 || index >= NGIDS)
        return -1;
    gid_at(index, gid, &type); /* an empty entry reads as zeros */
    return 0;
}

int _ibv_query_gid_ex(struct ibv_context *context, uint32_t port_num, uint32_t gid_index, struct ibv_gid_entry *entry,
                      uint32_t flags, size_t entry_size)
{
    (void)context;
    if (flags || entry_size < sizeof(*entry) || port_num != 1 || gid_index >= NGIDS)
        return EINVAL;
    uint32_t type;
    if (gid_at((int)gid_index, &entry->gid, &type) != 0)
        return ENODATA;
    entry->gid_index = gid_index;
    entry->port_num = port_num;
    entry->gid_type = type;
    entry->ndev_ifindex = 2;
    return 0;
}

/* ---- protection domains and memory ---------------------------------------- */

struct ibv_pd *ibv_alloc_pd(struct ibv_context *context)
{
    fake_pd *p = calloc(1, sizeof(*p));
    if (!p) {
        errno = ENOMEM;
        return NULL;
    }
    p->pd.context = context;
    pthread_mutex_lock(&mu);
    live_pd++;
    pthread_mutex_unlock(&mu);
    return &p->pd;
}

int ibv_dealloc_pd(struct ibv_pd *pd)
{
    fake_pd *p = (fake_pd *)pd;
    pthread_mutex_lock(&mu);
    if (p->mrs || p->qps) {
        pthread_mutex_unlock(&mu);
        return EBUSY;
    }
    live_pd--;
    pthread_mutex_unlock(&mu);
    free(p);
    return 0;
}

static struct ibv_mr *reg(struct ibv_pd *pd, void *addr, size_t length, int access)
{
    if (!addr || length == 0 ||
        ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(access & IBV_ACCESS_LOCAL_WRITE))) {
        errno = EINVAL;
        return NULL;
    }
    fake_mr *m = calloc(1, sizeof(*m));
    if (!m) {
        errno = ENOMEM;
        return NULL;
    }
    pthread_mutex_lock(&mu);
    int i = 0;
    while (i < MAX_MR && mrs[i])
        i++;
    if (i == MAX_MR) {
        pthread_mutex_unlock(&mu);
        free(m);
        errno = ENOMEM;
        return NULL;
    }
    mrs[i] = m;
    m->mr.context = pd->context;
    m->mr.pd = pd;
    m->mr.addr = addr;
    m->mr.length = length;
    m->mr.lkey = 0x1000u + (uint32_t)i;
    m->mr.rkey = 0x800000u + (uint32_t)i;
    m->access = access;
    ((fake_pd *)pd)->mrs++;
    live_mr++;
    pthread_mutex_unlock(&mu);
    return &m->mr;
}

struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
    return reg(pd, addr, length, access);
}

struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, unsigned int access)
{
    if (iova != (uintptr_t)addr)
        die("ibv_reg_mr_iova2 with an iova other than the address");
    return reg(pd, addr, length, (int)access);
}

int ibv_dereg_mr(struct ibv_mr *mr)
{
    pthread_mutex_lock(&mu);
    uint32_t i = mr->lkey - 0x1000u;
    if (i >= MAX_MR || mrs[i] != (fake_mr *)mr)
        die("ibv_dereg_mr of an unknown or already deregistered MR");
    mrs[i] = NULL;
    ((fake_pd *)mr->pd)->mrs--;
    live_mr--;
    pthread_mutex_unlock(&mu);
    free(mr);
    return 0;
}

static fake_mr *mr_by_lkey(uint32_t lkey)
{
    uint32_t i = lkey - 0x1000u;
    return i < MAX_MR && mrs[i] && mrs[i]->mr.lkey == lkey ? mrs[i] : NULL;
}

static fake_mr *mr_by_rkey(uint32_t rkey)
{
    uint32_t i = rkey - 0x800000u;
    return i < MAX_MR && mrs[i] && mrs[i]->mr.rkey == rkey ? mrs[i] : NULL;
}

static int mr_covers(const fake_mr *m, uint64_t addr, uint32_t len)
{
    uint64_t s = (uintptr_t)m->mr.addr;
    return addr >= s && addr + len <= s + m->mr.length;
}

/* ---- completion channels and queues --------------------------------------- */

struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *context)
{
    fake_chan *c = calloc(1, sizeof(*c));
    if (!c) {
        errno = ENOMEM;
        return NULL;
    }
    c->ch.context = context;
    c->ch.fd = eventfd(0, EFD_SEMAPHORE | EFD_CLOEXEC);
    if (c->ch.fd < 0) {
        free(c);
        return NULL;
    }
    pthread_mutex_lock(&mu);
    live_chan++;
    pthread_mutex_unlock(&mu);
    return &c->ch;
}

int ibv_destroy_comp_channel(struct ibv_comp_channel *channel)
{
    fake_chan *c = (fake_chan *)channel;
    pthread_mutex_lock(&mu);
    if (c->cqs) {
        pthread_mutex_unlock(&mu);
        return EBUSY;
    }
    live_chan--;
    pthread_mutex_unlock(&mu);
    close(c->ch.fd);
    free(c);
    return 0;
}

struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context, struct ibv_comp_channel *channel,
                             int comp_vector)
{
    if (cqe < 1 || cqe > 65536 || comp_vector != 0) {
        errno = EINVAL;
        return NULL;
    }
    fake_cq *q = calloc(1, sizeof(*q));
    if (!q || !(q->ring = calloc((size_t)cqe, sizeof(*q->ring)))) {
        free(q);
        errno = ENOMEM;
        return NULL;
    }
    q->cq.context = context;
    q->cq.channel = channel;
    q->cq.cq_context = cq_context;
    q->cq.cqe = cqe;
    q->cap = cqe;
    pthread_mutex_lock(&mu);
    if (channel)
        ((fake_chan *)channel)->cqs++;
    live_cq++;
    pthread_mutex_unlock(&mu);
    return &q->cq;
}

int ibv_destroy_cq(struct ibv_cq *cq)
{
    fake_cq *q = (fake_cq *)cq;
    pthread_mutex_lock(&mu);
    if (q->qps) {
        pthread_mutex_unlock(&mu);
        return EBUSY;
    }
    /* libibverbs would wait here forever for the missing acks. */
    if (q->events != q->acked)
        die("ibv_destroy_cq with %u of %u events unacknowledged", q->events - q->acked, q->events);
    if (cq->channel) {
        fake_chan *c = (fake_chan *)cq->channel;
        for (int i = 0; i < c->nfired; i++)
            if (c->fired[i] == q)
                die("ibv_destroy_cq with an event not yet taken from its channel");
        c->cqs--;
    }
    live_cq--;
    pthread_mutex_unlock(&mu);
    free(q->ring);
    free(q);
    return 0;
}

int ibv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq, void **cq_context)
{
    fake_chan *c = (fake_chan *)channel;
    pthread_mutex_lock(&mu);
    if (c->nfired == 0) {
        pthread_mutex_unlock(&mu);
        errno = EAGAIN;
        return -1;
    }
    fake_cq *q = c->fired[0];
    memmove(&c->fired[0], &c->fired[1], (size_t)(c->nfired - 1) * sizeof(c->fired[0]));
    c->nfired--;
    uint64_t v;
    if (read(c->ch.fd, &v, sizeof(v)) != (ssize_t)sizeof(v))
        die("completion channel counter out of step");
    pthread_mutex_unlock(&mu);
    *cq = &q->cq;
    *cq_context = q->cq.cq_context;
    return 0;
}

void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
    fake_cq *q = (fake_cq *)cq;
    pthread_mutex_lock(&mu);
    q->acked += nevents;
    if (q->acked > q->events)
        die("ibv_ack_cq_events acks %u events of %u", q->acked, q->events);
    pthread_mutex_unlock(&mu);
}

static void push_cqe(fake_cq *q, const struct ibv_wc *wc, int is_send)
{
    if (q->count == q->cap)
        die("completion queue overrun (%d entries)", q->cap);
    fake_cqe *e = &q->ring[(q->first + q->count++) % q->cap];
    e->wc = *wc;
    e->is_send = is_send;
    if (q->armed && q->cq.channel) {
        fake_chan *c = (fake_chan *)q->cq.channel;
        q->armed = 0;
        q->events++;
        if (c->nfired == (int)(sizeof(c->fired) / sizeof(c->fired[0])))
            die("too many unconsumed channel events");
        c->fired[c->nfired++] = q;
        uint64_t one = 1;
        if (write(c->ch.fd, &one, sizeof(one)) != (ssize_t)sizeof(one))
            die("completion channel write failed");
    }
}

static int f_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
    (void)solicited_only;
    pthread_mutex_lock(&mu);
    ((fake_cq *)cq)->armed = 1;
    pthread_mutex_unlock(&mu);
    return 0;
}

/* ---- queue pairs ---------------------------------------------------------- */

struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *ia)
{
    if (ia->qp_type != IBV_QPT_RC || !ia->send_cq || !ia->recv_cq || ia->srq || ia->cap.max_send_wr < 1 ||
        ia->cap.max_send_wr > 16384 || ia->cap.max_recv_wr < 1 || ia->cap.max_recv_wr > 16384 ||
        ia->cap.max_send_sge > 16 || ia->cap.max_recv_sge > 16) {
        errno = EINVAL;
        return NULL;
    }
    fake_qp *q = calloc(1, sizeof(*q));
    if (!q || !(q->rq = calloc(ia->cap.max_recv_wr, sizeof(*q->rq))) ||
        !(q->sq = calloc(ia->cap.max_send_wr, sizeof(*q->sq)))) {
        if (q)
            free(q->rq);
        free(q);
        errno = ENOMEM;
        return NULL;
    }
    pthread_mutex_lock(&mu);
    int i = 0;
    while (i < MAX_QP && qps[i])
        i++;
    if (i == MAX_QP) {
        pthread_mutex_unlock(&mu);
        free(q->rq);
        free(q->sq);
        free(q);
        errno = ENOMEM;
        return NULL;
    }
    qps[i] = q;
    q->qp.context = pd->context;
    q->qp.pd = pd;
    q->qp.send_cq = ia->send_cq;
    q->qp.recv_cq = ia->recv_cq;
    q->qp.qp_context = ia->qp_context;
    q->qp.qp_num = QPN_BASE + (uint32_t)i;
    q->qp.state = IBV_QPS_RESET;
    q->qp.qp_type = IBV_QPT_RC;
    q->pd = (fake_pd *)pd;
    q->sig_all = ia->sq_sig_all;
    q->max_send = ia->cap.max_send_wr;
    q->max_recv = ia->cap.max_recv_wr;
    q->max_sge = ia->cap.max_send_sge;
    q->pd->qps++;
    ((fake_cq *)ia->send_cq)->qps++;
    ((fake_cq *)ia->recv_cq)->qps++;
    live_qp++;
    pthread_mutex_unlock(&mu);
    return &q->qp;
}

static fake_qp *qp_by_num(uint32_t qpn)
{
    uint32_t i = qpn - QPN_BASE;
    return i < MAX_QP ? qps[i] : NULL;
}

static void complete(fake_qp *q, int send, uint64_t wr_id, enum ibv_wc_status status, enum ibv_wc_opcode op,
                     uint32_t len, uint32_t imm, int with_imm)
{
    struct ibv_wc wc = {
        .wr_id = wr_id,
        .status = status,
        .opcode = op,
        .vendor_err = status == IBV_WC_SUCCESS ? 0 : 0x81,
        .byte_len = len,
        .imm_data = imm,
        .qp_num = q->qp.qp_num,
        .wc_flags = with_imm ? IBV_WC_WITH_IMM : 0,
    };
    push_cqe((fake_cq *)(send ? q->qp.send_cq : q->qp.recv_cq), &wc, send);
}

/* ERR: every queued work request completes with a flush error. */
static void to_error(fake_qp *q)
{
    q->qp.state = IBV_QPS_ERR;
    while (q->sq_count) {
        fake_wr *w = &q->sq[q->sq_first];
        q->sq_first = (q->sq_first + 1) % q->max_send;
        q->sq_count--;
        complete(q, 1, w->wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND, 0, 0, 0);
    }
    while (q->rq_count) {
        uint64_t id = q->rq[q->rq_first];
        q->rq_first = (q->rq_first + 1) % q->max_recv;
        q->rq_count--;
        complete(q, 0, id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0, 0, 0);
    }
}

static int need(int mask, int required, const char *what)
{
    if ((mask & required) != required) {
        fprintf(stderr, "verbs fake: %s without the required attributes (mask 0x%x, need 0x%x)\n", what, mask,
                required);
        return 0;
    }
    return 1;
}

static _Thread_local int thread_rtr_error;

void verbs_fake_thread_fail_rtr(int err)
{
    thread_rtr_error = err;
}

int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask)
{
    fake_qp *q = (fake_qp *)qp;
    if (!(mask & IBV_QP_STATE))
        return EINVAL;
    pthread_mutex_lock(&mu);
    int err = 0;
    enum ibv_qp_state from = qp->state, to = a->qp_state;
    if (to == IBV_QPS_ERR) {
        to_error(q);
    } else if (from == IBV_QPS_RESET && to == IBV_QPS_INIT) {
        if (!need(mask, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, "RESET->INIT") ||
            a->port_num != 1 || a->pkey_index != 0)
            err = EINVAL;
    } else if (from == IBV_QPS_INIT && to == IBV_QPS_RTR && thread_rtr_error) {
        err = thread_rtr_error; /* injected: verbs_fake_thread_fail_rtr */
        thread_rtr_error = 0;
    } else if (from == IBV_QPS_INIT && to == IBV_QPS_RTR) {
        int req = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
        union ibv_gid sgid;
        uint32_t type;
        static const uint8_t zero[16];
        /* RoCE needs a GRH with valid GIDs; InfiniBand a LID, and a GRH
         * only if one is given, then valid too. */
        int grh_ok = a->ah_attr.grh.sgid_index < NGIDS && gid_at(a->ah_attr.grh.sgid_index, &sgid, &type) == 0 &&
                     memcmp(a->ah_attr.grh.dgid.raw, zero, 16) && a->ah_attr.grh.hop_limit != 0;
        int path_ok = fake_ib() ? a->ah_attr.dlid == FAKE_LID && (!a->ah_attr.is_global || grh_ok)
                                : a->ah_attr.is_global && grh_ok;
        if (!need(mask, req, "INIT->RTR") || a->path_mtu < IBV_MTU_256 || a->path_mtu > IBV_MTU_4096 ||
            a->dest_qp_num > 0xFFFFFF || a->rq_psn > 0xFFFFFF || a->ah_attr.port_num != 1 || !path_ok) {
            fprintf(stderr, "verbs fake: INIT->RTR with a bad address vector for %s\n",
                    fake_ib() ? "InfiniBand" : "RoCE");
            err = EINVAL;
        } else {
            q->dest_qpn = a->dest_qp_num;
            q->rq_psn = a->rq_psn;
        }
    } else if (from == IBV_QPS_RTR && to == IBV_QPS_RTS) {
        int req = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                  IBV_QP_MAX_QP_RD_ATOMIC;
        if (!need(mask, req, "RTR->RTS") || a->retry_cnt > 7 || a->rnr_retry > 7 || a->sq_psn > 0xFFFFFF)
            err = EINVAL;
        else
            q->sq_psn = a->sq_psn;
    } else {
        err = EINVAL;
    }
    if (!err)
        qp->state = to;
    pthread_mutex_unlock(&mu);
    return err;
}

int ibv_destroy_qp(struct ibv_qp *qp)
{
    fake_qp *q = (fake_qp *)qp;
    pthread_mutex_lock(&mu);
    qps[qp->qp_num - QPN_BASE] = NULL;
    q->pd->qps--;
    ((fake_cq *)qp->send_cq)->qps--;
    ((fake_cq *)qp->recv_cq)->qps--;
    live_qp--;
    pthread_mutex_unlock(&mu);
    free(q->rq);
    free(q->sq);
    free(q);
    return 0;
}

/* Fail work request w of q (already dequeued) and move q to ERR. */
static void fail_wr(fake_qp *q, const fake_wr *w, enum ibv_wc_status status)
{
    complete(q, 1, w->wr_id, status, IBV_WC_SEND, 0, 0, 0);
    to_error(q);
}

/* Execute the oldest posted send of s. 0: done (or failed), 1: the
 * receiver has no receive posted (RNR: retried on its next post_recv). */
static int execute(fake_qp *s)
{
    fake_wr w = s->sq[s->sq_first];
    fake_qp *d = qp_by_num(s->dest_qpn);
    int inject = fail_next_status >= 0 && w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
    if (d && d->qp.state != IBV_QPS_ERR && d->rq_count == 0 && !inject)
        return 1;
    s->sq_first = (s->sq_first + 1) % s->max_send;
    s->sq_count--;
    if (inject) {
        enum ibv_wc_status st = (enum ibv_wc_status)fail_next_status;
        fail_next_status = -1;
        fail_wr(s, &w, st);
        return 0;
    }
    /* A missing or mis-wired responder drops every packet: the requester
     * retries and gives up. */
    if (!d || (d->qp.state != IBV_QPS_RTR && d->qp.state != IBV_QPS_RTS) || d->dest_qpn != s->qp.qp_num ||
        d->rq_psn != s->sq_psn) {
        fail_wr(s, &w, IBV_WC_RETRY_EXC_ERR);
        return 0;
    }
    uint32_t len = w.nsge ? w.sge.length : 0;
    if (w.nsge) {
        fake_mr *lm = mr_by_lkey(w.sge.lkey);
        if (!lm || !mr_covers(lm, w.sge.addr, len)) {
            fail_wr(s, &w, IBV_WC_LOC_PROT_ERR);
            return 0;
        }
    }
    int write = w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
    if (write) {
        fake_mr *rm = mr_by_rkey(w.rkey);
        if (len && (!rm || !(rm->access & IBV_ACCESS_REMOTE_WRITE) || !mr_covers(rm, w.raddr, len))) {
            fail_wr(s, &w, IBV_WC_REM_ACCESS_ERR);
            to_error(d);
            return 0;
        }
        if (len)
            memcpy((void *)(uintptr_t)w.raddr, (void *)(uintptr_t)w.sge.addr, len);
        n_writes++;
    } else {
        if (len) { /* our receives carry no buffer */
            complete(d, 0, d->rq[d->rq_first], IBV_WC_LOC_LEN_ERR, IBV_WC_RECV, 0, 0, 0);
            d->rq_first = (d->rq_first + 1) % d->max_recv;
            d->rq_count--;
            to_error(d);
            fail_wr(s, &w, IBV_WC_REM_INV_REQ_ERR);
            return 0;
        }
        n_sends++;
    }
    uint64_t rid = d->rq[d->rq_first];
    d->rq_first = (d->rq_first + 1) % d->max_recv;
    d->rq_count--;
    complete(d, 0, rid, IBV_WC_SUCCESS, write ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV, len, w.imm, 1);
    if (w.signaled)
        complete(s, 1, w.wr_id, IBV_WC_SUCCESS, write ? IBV_WC_RDMA_WRITE : IBV_WC_SEND, len, 0, 0);
    else
        s->sq_out--;
    return 0;
}

/* Run everything that can run. */
static void pump(void)
{
    int again = 1;
    while (again) {
        again = 0;
        for (int i = 0; i < MAX_QP; i++) {
            fake_qp *q = qps[i];
            while (q && q->sq_count && q->qp.state == IBV_QPS_RTS && execute(q) == 0)
                again = 1;
        }
    }
}

static int f_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    fake_qp *q = (fake_qp *)qp;
    int err = 0;
    pthread_mutex_lock(&mu);
    for (; wr; wr = wr->next) {
        if (qp->state != IBV_QPS_RTS && qp->state != IBV_QPS_ERR) {
            err = EINVAL;
            break;
        }
        if (wr->num_sge < 0 || (uint32_t)wr->num_sge > (q->max_sge ? q->max_sge : 1) || wr->num_sge > 1 ||
            (wr->send_flags & IBV_SEND_INLINE) ||
            (wr->opcode != IBV_WR_RDMA_WRITE_WITH_IMM && wr->opcode != IBV_WR_SEND_WITH_IMM)) {
            err = EINVAL;
            break;
        }
        if (q->sq_out == q->max_send) {
            err = ENOMEM; /* what providers return for a full send queue */
            break;
        }
        fake_wr w = {.wr_id = wr->wr_id,
                     .opcode = wr->opcode,
                     .imm = wr->imm_data,
                     .signaled = q->sig_all || (wr->send_flags & IBV_SEND_SIGNALED),
                     .nsge = wr->num_sge};
        if (w.nsge)
            w.sge = wr->sg_list[0];
        if (wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
            w.raddr = wr->wr.rdma.remote_addr;
            w.rkey = wr->wr.rdma.rkey;
        }
        q->sq_out++;
        if (qp->state == IBV_QPS_ERR) {
            complete(q, 1, w.wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND, 0, 0, 0);
            continue;
        }
        q->sq[(q->sq_first + q->sq_count++) % q->max_send] = w;
    }
    if (err)
        *bad = wr;
    pump();
    pthread_mutex_unlock(&mu);
    return err;
}

static int f_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
    fake_qp *q = (fake_qp *)qp;
    int err = 0;
    pthread_mutex_lock(&mu);
    for (; wr; wr = wr->next) {
        if (qp->state == IBV_QPS_RESET || wr->num_sge != 0) {
            err = EINVAL;
            break;
        }
        if (qp->state == IBV_QPS_ERR) {
            complete(q, 0, wr->wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0, 0, 0);
            continue;
        }
        if (q->rq_count == q->max_recv) {
            err = ENOMEM;
            break;
        }
        q->rq[(q->rq_first + q->rq_count++) % q->max_recv] = wr->wr_id;
    }
    if (err)
        *bad = wr;
    pump();
    pthread_mutex_unlock(&mu);
    return err;
}

static int f_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
    fake_cq *q = (fake_cq *)cq;
    pthread_mutex_lock(&mu);
    pump();
    int k = 0;
    while (k < n && q->count) {
        fake_cqe *e = &q->ring[q->first];
        q->first = (q->first + 1) % q->cap;
        q->count--;
        wc[k++] = e->wc;
        if (e->is_send) {
            fake_qp *owner = qp_by_num(e->wc.qp_num);
            if (owner)
                owner->sq_out--;
        }
    }
    pthread_mutex_unlock(&mu);
    return k;
}
