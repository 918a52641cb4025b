/* TCP transport: authenticated connections of ctx->nsocks sockets per peer
 * (the connecting side's count wins), messages striped across them, and
 * non-blocking progress with poll().
 *
 * Contract details beyond braid_transport.h:
 *  - One thread at a time per connection (the executor); the listener's
 *    accept thread is internal and only hands out whole connections.
 *  - Every message carries its length: a receive posted with a different
 *    length than the matching send fails the connection with
 *    BRAID_ERR_MISMATCH instead of desynchronising it.
 *  - Errors are sticky per connection; after one, requests still queued are
 *    never touched again (they may be gone), so the owner closes it.
 *  - A peer that closes an idle connection is not an error until the
 *    connection is used: data it sent before closing can still be
 *    received; a send, or a receive beyond that data, fails with
 *    BRAID_ERR_PEER.
 *  - progress() never reads wake_fd (its owner drains it) and returns at
 *    once, without blocking, when bytes moved or a request completed since
 *    the previous progress() call, including completions seen only by
 *    test(). It returns BRAID_OK on timeout: deadlines are the caller's.
 *  - reg_mem/dereg_mem are no-ops that succeed (*handle = NULL).
 *  - Do not fork() while a listener exists: its thread may hold a libcrypto
 *    or allocator lock at that instant, and the child would inherit it. */
#ifndef BRAID_TCP_H
#define BRAID_TCP_H

#include "braid_transport.h"

extern const braid_transport_ops braid__tcp_ops;

#endif
