/* ncclCommInitRankScalable: which of several unique ids the ranks meet at.
 *
 * NCCL spreads its bootstrap over several roots; braid has one store, run
 * by rank 0, so the ranks meet at the first id whose store can run:
 *
 *  - rank 0 serves the first id it can: one whose socket it holds (made
 *    by its ncclGetUniqueId, or inherited across fork) or whose address it
 *    can bind; an id another process listens on, or of another host, is
 *    passed over;
 *  - every other rank closes the sockets it inherited (it serves none),
 *    then tries the ids in turn, round after round, until one answers
 *    braid's store handshake with that id's secret: only rank 0's store
 *    can, so every rank settles on the same id. A dead id refuses the
 *    connection or stays silent, and is passed over;
 *  - when none answers within the init timeout, ncclRemoteError naming
 *    each id (its host:port) and why it was passed over. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap/bootstrap.h"
#include "bootstrap/sock.h"
#include "bootstrap/store.h"
#include "clock.h"
#include "log.h"
#include "nccl_internal.h"
#include "param.h"

#define PROBE_CONNECT_MS 200 /* per id and round: a refused connection is retried this long */
#define PROBE_HELLO_MS 1000  /* a store answers its handshake at once; silence means no store */
#define DEFAULT_INIT_TIMEOUT_MS 1800000

typedef struct {
    braid_rendezvous rv;
    int valid;
    char why[200]; /* why it was passed over, last round */
} candidate;

/* "id 0 (127.0.0.1:4000): why; id 1 (...): why" */
static void list_reasons(const candidate *c, int n, char *buf, size_t cap)
{
    size_t o = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && o < cap; i++) {
        if (c[i].valid)
            o += (size_t)snprintf(buf + o, cap - o, "%sid %d (%s:%d): %s", i ? "; " : "", i, c[i].rv.host,
                                  c[i].rv.port, c[i].why);
        else
            o += (size_t)snprintf(buf + o, cap - o, "%sid %d: %s", i ? "; " : "", i, c[i].why);
    }
}

/* Rank 0: the first id it can serve; its socket is left for braid_pg_init. */
static int rank0_pick(candidate *c, int n)
{
    for (int i = 0; i < n; i++) {
        if (!c[i].valid)
            continue;
        int fd = braid__prebound_take(c[i].rv.port);
        if (fd < 0) {
            int port;
            if (braid__sock_listen(c[i].rv.host, c[i].rv.port, &fd, &port) != BRAID_OK) {
                snprintf(c[i].why, sizeof(c[i].why), "rank 0 cannot serve its store: %s", braid__error_detail());
                continue;
            }
        }
        braid__prebound_put(c[i].rv.port, fd);
        return i;
    }
    return -1;
}

/* Other ranks: the first id whose store answers, retried until deadline. */
static int member_pick(candidate *c, int n, int rank, int64_t deadline)
{
    for (int i = 0; i < n; i++)
        if (c[i].valid)
            braid__prebound_release(c[i].rv.port);
    do {
        for (int i = 0; i < n; i++) {
            if (!c[i].valid)
                continue;
            braid_store *store = NULL;
            braid_status st = braid__store_connect(c[i].rv.host, c[i].rv.port, c[i].rv.secret, rank,
                                                   PROBE_CONNECT_MS, PROBE_HELLO_MS, &store);
            if (st == BRAID_OK) {
                braid__store_close(store);
                return i;
            }
            snprintf(c[i].why, sizeof(c[i].why), "%s", braid__error_detail());
        }
    } while (braid__now_ms() < deadline);
    return -1;
}

ncclResult_t nccl__scalable_pick(ncclComm_t comm, int *chosen)
{
    const char *call = "ncclCommInitRankScalable";
    int n = comm->nids, any = 0;
    candidate *c = calloc((size_t)n, sizeof(*c));
    if (!c)
        return nccl__fail(ncclSystemError, "%s: %s: out of memory for %d unique ids", call, comm->label, n);
    for (int i = 0; i < n; i++) {
        c[i].valid = braid__unique_id_decode((const braid_unique_id_t *)&comm->ids[i], &c[i].rv) == BRAID_OK;
        if (!c[i].valid)
            snprintf(c[i].why, sizeof(c[i].why), "%s", braid__error_detail());
        any |= c[i].valid;
    }
    int timeout = comm->cfg.init_timeout_ms > 0 ? comm->cfg.init_timeout_ms
                                                : (int)braid__param_int("BRAID_INIT_TIMEOUT_MS", DEFAULT_INIT_TIMEOUT_MS);
    int pick = !any ? -1 : comm->rank == 0 ? rank0_pick(c, n) : member_pick(c, n, comm->rank, braid__now_ms() + timeout);
    char reasons[1024];
    list_reasons(c, pick >= 0 ? pick : n, reasons, sizeof(reasons));
    ncclResult_t r = ncclSuccess;
    if (pick > 0)
        BRAID_INFO("%s: %s: meeting at id %d (%s:%d); passed over %s", call, comm->label, pick, c[pick].rv.host,
                   c[pick].rv.port, reasons);
    if (pick >= 0)
        *chosen = pick;
    else if (comm->rank == 0)
        r = nccl__fail(ncclRemoteError, "%s: %s: none of the %d unique ids can be served here: %s", call, comm->label,
                       n, reasons);
    else
        r = nccl__fail(ncclRemoteError,
                       "%s: %s: none of the %d unique ids answered within %d ms (BRAID_INIT_TIMEOUT_MS): %s", call,
                       comm->label, n, timeout, reasons);
    free(c);
    return r;
}
