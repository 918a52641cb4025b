/* Rendezvous store: a small key-value server run by rank 0 over TCP, used to
 * exchange listener addresses at start-up (like torch's TCPStore). Every
 * client authenticates with the job secret before any request is served. */
#ifndef BRAID_STORE_H
#define BRAID_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "auth.h"
#include "braid.h"
#include "braid_transport.h"

typedef struct braid_store_server braid_store_server;
typedef struct braid_store braid_store;

/* Serve on listen_fd (bound and listening; the server takes ownership) from
 * a background thread until stopped, as rank 0's store. */
braid_status braid__store_server_start(int listen_fd, const uint8_t secret[BRAID_SECRET_BYTES],
                                       braid_store_server **server);
/* Same, for a job with these parameters (auth.h): a member whose own differ
 * is refused, and the store fails every member's requests with the reason,
 * so all of them stop at once instead of waiting for the odd one. */
braid_status braid__store_server_start_job(int listen_fd, const uint8_t secret[BRAID_SECRET_BYTES],
                                           const braid_job_params *job, braid_store_server **server);
/* Same, as rank `rank`'s store: its proven hello names that rank, so a
 * client can tell it from another member's (braid__store_attach), and it
 * refuses clients that aim at another rank's. */
braid_status braid__store_server_start_as(int listen_fd, const uint8_t secret[BRAID_SECRET_BYTES],
                                          const braid_job_params *job, int rank, braid_store_server **server);
void braid__store_server_stop(braid_store_server *server);
/* Stop once every client has disconnected, or after grace_ms: a rank that
 * finished init early must not take the store away from one still reading
 * its last answer. */
void braid__store_server_stop_drained(braid_store_server *server, int grace_ms);

/* Connect to rank 0's store at host:port, retrying until timeout_ms (rank 0
 * may start last).
 * hello_ms > 0: a server that accepts but does not answer the handshake
 * within hello_ms fails with BRAID_ERR_PEER ("not a braid store"). */
braid_status braid__store_connect(const char *host, int port, const uint8_t secret[BRAID_SECRET_BYTES],
                                  int rank, int timeout_ms, int hello_ms, braid_store **store);
/* Same, stating this rank's job parameters (NULL: none). A store that
 * refuses them, or fails the job later, gives BRAID_ERR_MISMATCH naming
 * the parameter and both values. */
braid_status braid__store_connect_job(const char *host, int port, const uint8_t secret[BRAID_SECRET_BYTES],
                                      const braid_job_params *job, int rank, int timeout_ms, int hello_ms,
                                      braid_store **store);
/* Same over fd, already connected to rank server_rank's store at addr
 * (text for messages): authenticates only, and fails with BRAID_ERR_AUTH
 * when the store that proves the secret is another rank's (a relay).
 * The store takes fd, also on failure. */
braid_status braid__store_attach(int fd, const char *addr, const uint8_t secret[BRAID_SECRET_BYTES], int rank,
                                 int server_rank, int timeout_ms, braid_store **store);
void braid__store_close(braid_store *store);

braid_status braid__store_set(braid_store *store, const char *key, const void *value, size_t len);

/* Wait until key exists (or timeout_ms passes) and copy its value. */
braid_status braid__store_get(braid_store *store, const char *key, void *value, size_t cap, size_t *len,
                              int timeout_ms);

/* Atomically add delta to the integer at key (missing = 0); returns the sum. */
braid_status braid__store_add(braid_store *store, const char *key, int64_t delta, int64_t *result);

/* The local address of the connection to the store: the interface through
 * which rank 0 is reachable, used as this rank's listen address. */
braid_status braid__store_local_ip(braid_store *store, char *ip, size_t cap);

#endif
