/* Where a group meets: the unique id's contents and the launcher
 * environment, decoded into one rendezvous description. */
#ifndef BRAID_BOOTSTRAP_H
#define BRAID_BOOTSTRAP_H

#include <stddef.h>
#include <stdint.h>

#include "braid.h"
#include "braid_transport.h"

typedef struct {
    char host[96];                        /* rank 0's store address */
    int port;
    uint8_t secret[BRAID_SECRET_BYTES];
    int local_rank;                       /* the launcher's, -1 when it set none */
    uint8_t secret_source;                /* braid_secret_source (auth.h) */
    char job_id[33];                      /* launcher's job id as hellos show it, "" when none */
    /* What chose the port, for messages ("MASTER_PORT+1", "BRAID_STORE_PORT"),
     * and whether rank 0 binds it only at init (the launcher path), so that
     * a silent program on it can only be a stranger. */
    char port_source[48];
    int bound_at_init;
    /* Key for a mismatch claim (auth.h): derived from the user's key file,
     * which every rank of the user's jobs shares whatever its job secret,
     * so a rank whose secret differs can still prove it is one of ours. */
    uint8_t claim_key[BRAID_SECRET_BYTES];
    int has_claim_key;
    /* Set when this process cannot be a rank of the job its launch
     * variables name (RANK=2 with WORLD_SIZE=2), though the store is known:
     * it tells the store why it leaves, so the others stop at once. */
    char launch_error[160];
} braid_rendezvous;

/* Decode and validate a unique id. */
braid_status braid__unique_id_decode(const braid_unique_id_t *id, braid_rendezvous *rv);

/* Rank, size and rendezvous from torchrun / Open MPI / Slurm variables. A
 * rank outside [0, size) still gives the rendezvous, with rv->launch_error
 * saying what is wrong. */
braid_status braid__env_rendezvous(int *rank, int *size, braid_rendezvous *rv);

/* The job secret for the launcher environment (job_secret.c): sets
 * rv->secret, secret_source and job_id; host and port must be set. Warns
 * once when the secret derives from public values only. */
braid_status braid__job_secret_env(int rank, braid_rendezvous *rv);
/* BRAID_KEY_FILE, or ~/.config/braid/job.key. */
braid_status braid__key_file_path(char *path, size_t cap);
/* Read the 32-byte key at path, making it (mode 0600) when missing; refuses
 * a file that is a link, not ours, or readable by others. */
braid_status braid__key_load(const char *path, uint8_t key[32]);
/* The mismatch-claim key of the user's key file (auth.h): from key when
 * given, else from the key file when it exists and is ours (never made
 * here). 0 when there is none. */
int braid__claim_key(const uint8_t *key, uint8_t out[BRAID_SECRET_BYTES]);

/* The listening socket braid_unique_id() bound for port, if this process
 * (or its parent, before fork) made it; -1 otherwise. The caller owns it.
 * braid__prebound_release() closes an inherited one that this rank does
 * not serve, so a dead rank 0 is seen as refused connections. */
int braid__prebound_take(int port);
void braid__prebound_release(int port);
/* Keep a bound, listening fd for port until taken (group shrink hands the
 * new group's store socket to the init path this way). */
void braid__prebound_put(int port, int fd);

#endif
