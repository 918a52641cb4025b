/* What transports' ops tables share: the slot function types (to declare a
 * transport's slot functions with) and the no-registration slots. */
#ifndef BRAID_TRANSPORT_OPS_H
#define BRAID_TRANSPORT_OPS_H

#include "braid_transport.h"

/* One type per slot of braid_transport_ops, as a function type:
 * `braid_isend_func_t braid__tcp_isend;` declares a function that fits. */
typedef braid_status braid_listen_func_t(const braid_transport_ctx *ctx, braid_listener **listener,
                                         char addr[BRAID_ADDR_MAX]);
typedef braid_status braid_accept_func_t(braid_listener *listener, int peer, int timeout_ms, braid_conn **conn);
typedef void braid_close_listener_func_t(braid_listener *listener);
typedef braid_status braid_connect_func_t(const braid_transport_ctx *ctx, int peer, const char *addr, int timeout_ms,
                                          braid_conn **conn);
typedef void braid_close_func_t(braid_conn *conn);
typedef braid_status braid_isend_func_t(braid_conn *conn, braid_req *req, const void *buf, size_t len);
typedef braid_status braid_irecv_func_t(braid_conn *conn, braid_req *req, void *buf, size_t len);
typedef braid_status braid_test_func_t(braid_req *req, int *done);
typedef braid_status braid_progress_func_t(braid_conn **conns, int nconns, int wake_fd, int timeout_ms);
typedef braid_status braid_reg_mem_func_t(braid_conn *conn, void *buf, size_t len, void **handle);
typedef braid_status braid_dereg_mem_func_t(braid_conn *conn, void *handle);

/* reg_mem and dereg_mem of a transport that copies through its own
 * buffers: nothing to register, both succeed (*handle = NULL), so callers
 * may register unconditionally (ops_none.c). */
braid_reg_mem_func_t braid__reg_mem_none;
braid_dereg_mem_func_t braid__dereg_mem_none;

/* The ops table of a transport that needs no memory registration and
 * names its slot functions by the rule braid__<name>_<slot>:
 * `const braid_transport_ops braid__tcp_ops = BRAID_COPY_TRANSPORT_OPS(tcp, tcp_probe, BRAID_TRANSPORT_ANY_PAIR,
 * NULL);` */
#define BRAID_COPY_TRANSPORT_OPS(name_, probe_, scope_, can_connect_)                                                 \
    {                                                                                                                  \
        .size = sizeof(braid_transport_ops), .name = #name_, .probe = probe_, .listen = braid__##name_##_listen,       \
        .accept = braid__##name_##_accept, .close_listener = braid__##name_##_close_listener,                          \
        .connect = braid__##name_##_connect, .reg_mem = braid__reg_mem_none, .dereg_mem = braid__dereg_mem_none,       \
        .isend = braid__##name_##_isend, .irecv = braid__##name_##_irecv, .test = braid__##name_##_test,               \
        .progress = braid__##name_##_progress, .close = braid__##name_##_close, .scope = scope_,                       \
        .can_connect = can_connect_,                                                                                   \
    }

#endif
