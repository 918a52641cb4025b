/* Unique ids (NCCL style) and launcher-environment rendezvous. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <openssl/rand.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bootstrap.h"
#include "bootstrap/auth.h"
#include "bootstrap/sock.h"
#include "log.h"
#include "param.h"
#include "status.h"

#define ID_MAGIC "BRID"
#define ID_VERSION 1
#define DEFAULT_MASTER_PORT 29500

/* Layout of braid_unique_id_t.internal (all bytes defined, so ids compare
 * and copy as plain memory). */
typedef struct {
    char magic[4];
    uint8_t version;
    uint8_t reserved;
    uint16_t port;                        /* network byte order */
    uint8_t secret[BRAID_SECRET_BYTES];
    char host[96];
    uint8_t pad[BRAID_UNIQUE_ID_BYTES - 4 - 2 - 2 - BRAID_SECRET_BYTES - 96];
} id_layout;

_Static_assert(sizeof(id_layout) == BRAID_UNIQUE_ID_BYTES, "unique id layout must fill the id");

/* Listening sockets made by braid_unique_id(), kept across fork so that
 * whichever process becomes rank 0 can serve the id it was given. */
#define PREBOUND_MAX 16
static struct {
    int port, fd;
} prebound[PREBOUND_MAX];
static int prebound_count;
static pthread_mutex_t prebound_mu = PTHREAD_MUTEX_INITIALIZER;

static int prebound_remove(int port)
{
    int fd = -1;
    pthread_mutex_lock(&prebound_mu);
    for (int i = 0; i < prebound_count; i++) {
        if (prebound[i].port == port) {
            fd = prebound[i].fd;
            prebound[i] = prebound[--prebound_count];
            break;
        }
    }
    pthread_mutex_unlock(&prebound_mu);
    return fd;
}

int braid__prebound_take(int port)
{
    return prebound_remove(port);
}

void braid__prebound_put(int port, int fd)
{
    pthread_mutex_lock(&prebound_mu);
    if (prebound_count == PREBOUND_MAX) {
        /* The oldest one has long been handed out: stop serving it here. */
        BRAID_INFO("rendezvous socket for port %d no longer kept in this process", prebound[0].port);
        close(prebound[0].fd);
        memmove(&prebound[0], &prebound[1], sizeof(prebound[0]) * (PREBOUND_MAX - 1));
        prebound_count--;
    }
    prebound[prebound_count].port = port;
    prebound[prebound_count].fd = fd;
    prebound_count++;
    pthread_mutex_unlock(&prebound_mu);
}

void braid__prebound_release(int port)
{
    int fd = prebound_remove(port);
    if (fd >= 0)
        close(fd);
}

static braid_status parse_host_port(const char *text, char *host, size_t cap, int *port)
{
    const char *colon = strrchr(text, ':');
    if (!colon || colon == text)
        return braid__error(BRAID_ERR_INVALID_ARG, "'%s' is not host:port", text);
    size_t hl = (size_t)(colon - text);
    if (text[0] == '[' && hl >= 2 && text[hl - 1] == ']') { /* [v6]:port */
        text++;
        hl -= 2;
    }
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (hl >= cap || *end || p <= 0 || p > 65535)
        return braid__error(BRAID_ERR_INVALID_ARG, "'%s' is not host:port", text);
    memcpy(host, text, hl);
    host[hl] = '\0';
    *port = (int)p;
    return BRAID_OK;
}

BRAID_API braid_status braid_unique_id(braid_unique_id_t *id)
{
    if (!id)
        return braid__error(BRAID_ERR_INVALID_ARG, "braid_unique_id: id is NULL");
    id_layout l;
    memset(&l, 0, sizeof(l));
    memcpy(l.magic, ID_MAGIC, 4);
    l.version = ID_VERSION;
    if (RAND_bytes(l.secret, sizeof(l.secret)) != 1)
        return braid__error(BRAID_ERR_SYSTEM, "braid_unique_id: no randomness for the job secret");

    const char *fixed = braid__param_str("BRAID_STORE_ADDR");
    int port = 0;
    if (fixed) {
        BRAID_CHECK(parse_host_port(fixed, l.host, sizeof(l.host), &port));
    } else {
        /* Default to loopback: a single-host job needs nothing more, and a
         * multi-host job names its interface (BRAID_SOCKET_IFNAME). */
        const char *ifname = braid__param_str("BRAID_SOCKET_IFNAME");
        if (ifname)
            BRAID_CHECK(braid__sock_ifname_ip(ifname, l.host, sizeof(l.host)));
        else
            snprintf(l.host, sizeof(l.host), "127.0.0.1");
        int fd;
        BRAID_CHECK(braid__sock_listen(l.host, 0, &fd, &port));
        /* A process that makes many ids (a launcher, a test driver) has
         * long handed the oldest ones out: the table drops those. */
        braid__prebound_put(port, fd);
    }
    l.port = htons((uint16_t)port);
    memcpy(id->internal, &l, sizeof(l));
    BRAID_INFO("unique id: store at %s:%d", l.host, port);
    return BRAID_OK;
}

braid_status braid__unique_id_decode(const braid_unique_id_t *id, braid_rendezvous *rv)
{
    id_layout l;
    memcpy(&l, id->internal, sizeof(l));
    if (memcmp(l.magic, ID_MAGIC, 4) != 0 || l.version != ID_VERSION)
        return braid__error(BRAID_ERR_INVALID_ARG, "unique id is not a braid id of version %d (bad magic or version)",
                            ID_VERSION);
    if (memchr(l.host, '\0', sizeof(l.host)) == NULL || l.host[0] == '\0' || ntohs(l.port) == 0)
        return braid__error(BRAID_ERR_INVALID_ARG, "unique id has no valid store address");
    snprintf(rv->host, sizeof(rv->host), "%s", l.host);
    rv->port = ntohs(l.port);
    memcpy(rv->secret, l.secret, sizeof(rv->secret));
    rv->secret_source = BRAID_SECRET_UNIQUE_ID;
    rv->job_id[0] = '\0';
    rv->has_claim_key = 0; /* a unique id's ranks share no key file to prove a claim with */
    rv->local_rank = -1;
    snprintf(rv->port_source, sizeof(rv->port_source), "the unique id");
    rv->bound_at_init = 0;
    rv->launch_error[0] = '\0';
    return BRAID_OK;
}

/* First set variable of a list, with its name for messages. */
static const char *first_env(const char *const *names, const char **which)
{
    for (; *names; names++) {
        const char *v = braid__param_str(*names);
        if (v) {
            *which = *names;
            return v;
        }
    }
    return NULL;
}

static braid_status env_int(const char *name, const char *text, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long v = braid__param_decimal(text, &end);
    if (errno || *end || v < lo || v > hi)
        return braid__error(BRAID_ERR_INVALID_ARG, "%s=%s is not an integer in [%ld, %ld]", name, text, lo, hi);
    *out = (int)v;
    return BRAID_OK;
}

braid_status braid__env_rendezvous(int *rank, int *size, braid_rendezvous *rv)
{
    static const char *const rank_vars[] = {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", NULL};
    static const char *const size_vars[] = {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", NULL};
    const char *rank_name = NULL, *size_name = NULL;
    const char *rank_text = first_env(rank_vars, &rank_name), *size_text = first_env(size_vars, &size_name);
    if (!rank_text || !size_text)
        return braid__error(BRAID_ERR_INVALID_ARG,
                            "braid_pg_init_env: no launcher environment (need RANK/WORLD_SIZE from torchrun, "
                            "OMPI_COMM_WORLD_RANK/SIZE from mpirun or SLURM_PROCID/SLURM_NTASKS from srun)");
    int r, s;
    BRAID_CHECK(env_int(size_name, size_text, 1, BRAID_MAX_RANKS, &s));
    BRAID_CHECK(env_int(rank_name, rank_text, 0, BRAID_MAX_RANKS - 1, &r));
    braid__log_set_rank(r); /* the warnings below (a public secret, a refused key file) name it */
    rv->launch_error[0] = '\0';
    if (r >= s)
        snprintf(rv->launch_error, sizeof(rv->launch_error), "%s=%d is not below %s=%d", rank_name, r, size_name, s);

    const char *addr = braid__param_str("MASTER_ADDR");
    if (!addr && rv->launch_error[0]) /* no store to tell: the mistake is all there is to say */
        return braid__error(BRAID_ERR_INVALID_ARG, "braid_pg_init_env: %s", rv->launch_error);
    if (!addr)
        return braid__error(BRAID_ERR_INVALID_ARG,
                            "braid_pg_init_env: MASTER_ADDR is not set (rank %d of %d from %s): set it to rank 0's "
                            "host, as torchrun does", r, s, rank_name);
    snprintf(rv->host, sizeof(rv->host), "%s", addr);
    /* torchrun's own store already listens on MASTER_PORT, so braid's
     * store takes the next port unless BRAID_STORE_PORT says otherwise. */
    const char *port_text = braid__param_str("BRAID_STORE_PORT");
    rv->bound_at_init = 1;
    if (port_text) {
        BRAID_CHECK(env_int("BRAID_STORE_PORT", port_text, 1, 65535, &rv->port));
        snprintf(rv->port_source, sizeof(rv->port_source), "BRAID_STORE_PORT");
    } else {
        int master_port = DEFAULT_MASTER_PORT;
        const char *mp = braid__param_str("MASTER_PORT");
        if (mp)
            BRAID_CHECK(env_int("MASTER_PORT", mp, 1, 65534, &master_port));
        rv->port = master_port + 1;
        snprintf(rv->port_source, sizeof(rv->port_source), mp ? "MASTER_PORT+1" : "MASTER_PORT (unset: %d)+1",
                 DEFAULT_MASTER_PORT);
    }

    BRAID_CHECK(braid__job_secret_env(r, rv));
    static const char *const local_vars[] = {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", NULL};
    const char *local_name = NULL, *local_text = first_env(local_vars, &local_name);
    rv->local_rank = -1;
    if (local_text && r < s)
        BRAID_CHECK(env_int(local_name, local_text, 0, s - 1, &rv->local_rank));
    *rank = r;
    *size = s;
    return BRAID_OK;
}
