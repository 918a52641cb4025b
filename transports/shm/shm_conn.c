/* Shared-memory connections: the memfd region and its mapping. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "shm.h"
#include "shm_conn.h"
#include "status.h"

const uint64_t braid_shm_cookie = BRAID_SHM_COOKIE;

braid_status braid__shm_region_create(int rank, int peer, size_t ring_bytes, int *memfd, int efd[2])
{
    braid_status st;
    size_t bytes = braid__shm_map_bytes(ring_bytes);
    char name[64];
    snprintf(name, sizeof(name), "braid-shm-%d-%d", rank, peer);
    /* A memfd has no name in any file system, so nothing is left behind
     * when either process dies, whatever the way. */
    int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return braid__error(BRAID_ERR_SYSTEM, "rank %d: memfd_create for peer %d: %m", rank, peer);
    if (ftruncate(fd, (off_t)bytes) != 0) {
        st = braid__error(BRAID_ERR_SYSTEM, "rank %d: sizing %zu bytes of shared memory for peer %d: %m", rank,
                          bytes, peer);
        goto err_close;
    }
    /* Neither side may resize the region under the other's mapping (a
     * shrink would turn the peer's next access into SIGBUS). */
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        st = braid__error(BRAID_ERR_SYSTEM, "rank %d: sealing shared memory for peer %d: %m", rank, peer);
        goto err_close;
    }
    braid_shm_region *r = mmap(NULL, BRAID_SHM_CTRL_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (r == MAP_FAILED) {
        st = braid__error(BRAID_ERR_SYSTEM, "rank %d: mapping shared memory for peer %d: %m", rank, peer);
        goto err_close;
    }
    r->magic = BRAID_SHM_MAGIC;
    r->version = BRAID_WIRE_VERSION;
    r->ring_bytes = ring_bytes;
    for (int i = 0; i < 2; i++) {
        atomic_init(&r->cookie_addr[i], 0);
        atomic_init(&r->can_read[i], 0);
        atomic_init(&r->acked[i].v, 0);
        atomic_init(&r->sleeping[i].v, 0);
        atomic_init(&r->ring[i].head, 0);
        atomic_init(&r->ring[i].tail, 0);
    }
    munmap(r, BRAID_SHM_CTRL_BYTES);
    efd[0] = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    efd[1] = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (efd[0] < 0 || efd[1] < 0) {
        st = braid__error(BRAID_ERR_SYSTEM, "rank %d: eventfd for peer %d: %m", rank, peer);
        goto err_close_efd;
    }
    *memfd = fd;
    return BRAID_OK;

err_close_efd:
    if (efd[0] >= 0)
        close(efd[0]);
    if (efd[1] >= 0)
        close(efd[1]);
err_close:
    close(fd);
    return st;
}

braid_status braid__shm_conn_create(int rank, int peer, int side, int sock, int memfd, const int efd[2],
                                    size_t ring_bytes, braid_shm_conn **conn)
{
    size_t bytes = braid__shm_map_bytes(ring_bytes);
    struct stat sb;
    if (fstat(memfd, &sb) != 0 || sb.st_size < 0 || (size_t)sb.st_size != bytes)
        return braid__error(BRAID_ERR_PEER, "rank %d: peer %d sent shared memory of the wrong size", rank, peer);
    int seals = fcntl(memfd, F_GET_SEALS);
    if (seals < 0 || !(seals & F_SEAL_SHRINK))
        return braid__error(BRAID_ERR_PEER, "rank %d: peer %d sent shared memory that is not sealed", rank, peer);
    braid_shm_conn *c = calloc(1, sizeof(*c));
    if (!c)
        return braid__error(BRAID_ERR_NO_MEMORY, "rank %d: out of memory for a connection to peer %d", rank, peer);
    void *map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    if (map == MAP_FAILED) {
        free(c);
        return braid__error(BRAID_ERR_SYSTEM, "rank %d: mapping %zu bytes shared with peer %d: %m", rank, bytes,
                            peer);
    }
    braid_shm_region *r = map;
    if (r->magic != BRAID_SHM_MAGIC || r->version != BRAID_WIRE_VERSION || r->ring_bytes != ring_bytes) {
        munmap(map, bytes);
        free(c);
        return braid__error(BRAID_ERR_PEER, "rank %d: peer %d sent shared memory with a bad header", rank, peer);
    }
    c->base.ops = &braid__shm_ops;
    c->base.peer = peer;
    c->base.error = BRAID_OK;
    c->rank = rank;
    c->side = side;
    c->sock = sock;
    c->efd[0] = efd[0];
    c->efd[1] = efd[1];
    c->region = r;
    c->map_bytes = bytes;
    c->ring_bytes = ring_bytes;
    uint8_t *data = (uint8_t *)map + BRAID_SHM_CTRL_BYTES;
    c->tx = &r->ring[side];
    c->rx = &r->ring[1 - side];
    c->tx_data = data + (size_t)side * ring_bytes;
    c->rx_data = data + (size_t)(1 - side) * ring_bytes;
    struct ucred cred;
    socklen_t clen = sizeof(cred);
    if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &clen) == 0 && cred.pid > 0 && cred.pid != getpid())
        c->peer_pid = cred.pid;
    /* Only this side writes its slot: tell the peer where to find our cookie. */
    atomic_store_explicit(&r->cookie_addr[side], (uint64_t)(uintptr_t)&braid_shm_cookie, memory_order_release);
    c->tx_head = atomic_load_explicit(&c->tx->head, memory_order_relaxed);
    c->rx_tail = atomic_load_explicit(&c->rx->tail, memory_order_relaxed);
    /* The memfd is no longer needed once mapped: the mapping keeps the
     * memory alive until both sides unmap it. */
    close(memfd);
    *conn = c;
    return BRAID_OK;
}

/* On a connection's first pass: fault in the start of both rings, where the
 * rewinds keep the messages (shm_conn.h), in one call each, instead of a
 * page fault on each side whenever a message first reaches a page. Only
 * used connections pay it (mapping every pair's rings up front did not
 * scale). Best effort. */
void braid__shm_conn_warm(braid_shm_conn *c)
{
    c->warm = 1;
#if defined(MADV_POPULATE_WRITE) && defined(MADV_POPULATE_READ)
    size_t n = BRAID_SHM_WARM_BYTES < c->ring_bytes ? BRAID_SHM_WARM_BYTES : c->ring_bytes;
    (void)madvise(c->tx_data, n, MADV_POPULATE_WRITE);
    (void)madvise(c->rx_data, n, MADV_POPULATE_READ);
#endif
}

void braid__shm_close(braid_conn *conn)
{
    if (!conn)
        return;
    braid_shm_conn *c = braid__shm_conn_of(conn);
    /* The socket's hang-up tells the peer; it may still drain what we wrote
     * from its own mapping, which outlives ours. */
    close(c->sock);
    munmap(c->region, c->map_bytes);
    close(c->efd[0]);
    close(c->efd[1]);
    free(c);
}
