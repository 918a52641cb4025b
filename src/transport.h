/* Built-in transports, in an explicit table indexed by id. */
#ifndef BRAID_TRANSPORT_REGISTRY_H
#define BRAID_TRANSPORT_REGISTRY_H

#include "braid_transport.h"

typedef enum {
    BRAID_TRANSPORT_TCP = 0,
    BRAID_TRANSPORT_VERBS,     /* NULL unless built with libibverbs */
    BRAID_TRANSPORT_SHM,       /* same-host peers (Linux memfd) */
    BRAID_TRANSPORT_CUDA_IPC,  /* same-host GPU peers; NULL unless built with CUDA */
    BRAID_TRANSPORT_ID_COUNT
} braid_transport_id;

/* The ops of transport id, or NULL when not built in. */
const braid_transport_ops *braid__transport_get(braid_transport_id id);

/* Pick the transport for the group: the first of `want` (comma-separated
 * names, NULL = every built-in in preference order: verbs, then tcp) whose
 * probe succeeds. Logs why each skipped one is unusable (INFO), and names
 * the last reason in the error when none is. */
braid_status braid__transport_select(const char *want, int rank, const braid_transport_ops **ops);

/* Transport for peers on this rank's host, used beside the one
 * braid__transport_select picks: shm when want is NULL or names shm next to
 * other transports, and it probes usable; NULL otherwise (also when shm is
 * the only name in want: then it is the group's transport for every peer).
 * braid__transport_select skips shm in a list that names others. */
const braid_transport_ops *braid__transport_select_local(const char *want, int rank);

#endif
