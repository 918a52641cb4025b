/* Built-in transports, in an explicit table indexed by id. */
#ifndef BRAID_TRANSPORT_REGISTRY_H
#define BRAID_TRANSPORT_REGISTRY_H

#include "braid_transport.h"

typedef enum {
    BRAID_TRANSPORT_TCP = 0,
    BRAID_TRANSPORT_VERBS,     /* NULL unless built with libibverbs */
    BRAID_TRANSPORT_SHM,       /* same-host peers (Linux memfd) */
    BRAID_TRANSPORT_CUDA_IPC,  /* same-host GPU peers; NULL unless built with CUDA (or linked by a test) */
    BRAID_TRANSPORT_ID_COUNT
} braid_transport_id;

/* The ops of transport id, or NULL when not built in. */
const braid_transport_ops *braid__transport_get(braid_transport_id id);
/* The id of built-in transport t, or -1. */
int braid__transport_id_of(const braid_transport_ops *t);

/* The transport that serves the pair (me, peer), as an id, decided alike
 * at both ends: the first transport that serves some pairs (scope
 * BRAID_TRANSPORT_SOME_PAIRS), listens here (listeners[id]), has the
 * peer's address (addr[id], "" where the peer does not listen on it) and
 * accepts the pair (can_connect); else the group's transport, group_id.
 * NCCL's selectTransport asks its transports the same way. */
int braid__transport_for_peer(braid_listener *const listeners[BRAID_TRANSPORT_ID_COUNT],
                              const char addr[BRAID_TRANSPORT_ID_COUNT][BRAID_ADDR_MAX], int group_id,
                              const braid_peer_info *me, const braid_peer_info *peer);
/* The transport serving some pairs that listeners has, or NULL (for logs). */
const braid_transport_ops *braid__transport_some_pairs(braid_listener *const listeners[BRAID_TRANSPORT_ID_COUNT]);

/* Group agreement on the transports that need it (verbs: reaches other
 * hosts, but may be missing or broken on some). Every rank builds its vote
 * (braid__transport_vote: its own probe verdicts, as text), publishes it,
 * and adds every rank's vote, its own included, to a tally; since all
 * ranks tally the same votes, all decide alike. */
#define BRAID_TRANSPORT_WHY_MAX 384
#define BRAID_TRANSPORT_VOTE_MAX 1024

typedef struct {
    int voters;
    int failed[BRAID_TRANSPORT_ID_COUNT];     /* ranks that cannot use it */
    int first_rank[BRAID_TRANSPORT_ID_COUNT]; /* the lowest of them, -1: none */
    char first_why[BRAID_TRANSPORT_ID_COUNT][BRAID_TRANSPORT_WHY_MAX];
} braid_transport_tally;

/* Whether any built-in transport needs the agreement (else skip it). */
int braid__transport_agreement_needed(void);
/* This rank's vote on the agreed transports that want considers: a
 * line per transport, "+name" or "-name:reason". */
void braid__transport_vote(const char *want, char *vote, size_t cap);
void braid__transport_tally_init(braid_transport_tally *tally);
void braid__transport_tally_add(braid_transport_tally *tally, int voter, const char *vote);

/* Pick the transport for the group: the first of `want` (comma-separated
 * names, NULL = every built-in in preference order: verbs, then tcp) that
 * is usable: an agreed transport (verbs) when every rank's vote in tally
 * says so, any other when this rank's probe succeeds (tally NULL: by the
 * local probe alone). When an agreed transport is passed over for a later
 * one, rank 0 logs one INFO line naming the first failing rank and its
 * reason; other skipped transports are logged per rank (INFO). The error,
 * when none is usable, names the last reason. */
braid_status braid__transport_select(const char *want, int rank, const braid_transport_tally *tally,
                                     const braid_transport_ops **ops);

/* Transport for peers on this rank's host, used beside the one
 * braid__transport_select picks: shm when want is NULL or names shm next to
 * other transports, and it probes usable; NULL otherwise (also when shm is
 * the only name in want: then it is the group's transport for every peer).
 * braid__transport_select skips shm in a list that names others. */
const braid_transport_ops *braid__transport_select_local(const char *want, int rank);

/* Whether the group should add cuda_ipc device links between same-host
 * ring neighbours (src/lifecycle/devlink.c): cuda_ipc is built and want is NULL or
 * names it next to other transports (alone, it is the group's transport;
 * a list without it leaves it out). */
int braid__transport_devlinks_wanted(const char *want);

#endif
