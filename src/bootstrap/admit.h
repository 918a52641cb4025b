/* Admission of unauthenticated connections, shared by the listeners that
 * serve many sockets from one poll loop (the store, the TCP listener).
 *
 * Per source address it counts the connections that have not proven the
 * job secret yet and the wrong proofs made recently:
 *  - a source holds at most BRAID_ADMIT_PER_SOURCE unproven connections and
 *    the listener at most BRAID_ADMIT_TOTAL, both raised by twice the
 *    sockets its members open at once (braid__admit_size); beyond that the listener drops
 *    the oldest unproven one (one whose proof already failed first), never
 *    the newcomer, so a flood costs no file descriptors beyond the cap and
 *    cannot lock out a member, whose handshake takes a round trip;
 *  - a wrong proof is answered by a close only after a delay that doubles
 *    with each wrong proof from that source (braid__admit_fail), so a prover
 *    waits ever longer to learn that a guess was wrong.
 * Members never wait on either: they are counted only until they prove. */
#ifndef BRAID_ADMIT_H
#define BRAID_ADMIT_H

#include <stddef.h>
#include <stdint.h>

#include "sock.h"

#define BRAID_ADMIT_PER_SOURCE 32
#define BRAID_ADMIT_TOTAL 256
#define BRAID_ADMIT_DELAY_MIN_MS 100
#define BRAID_ADMIT_DELAY_MAX_MS 5000
#define BRAID_ADMIT_FORGET_MS 60000 /* a source quiet this long starts over */

typedef struct {
    char host[BRAID_SOCK_ADDR_STR]; /* address without the port */
    int unproven;                   /* connections not yet authenticated */
    int fails;                      /* wrong proofs since the last quiet spell */
    int64_t last_fail;
} braid_admit_source;

typedef struct {
    braid_admit_source *v;
    size_t n, cap;
    int unproven;   /* over all sources */
    int per_source; /* caps; 0: BRAID_ADMIT_PER_SOURCE, BRAID_ADMIT_TOTAL */
    int total;
} braid_admit;

/* Caps for a listener that expects `members` sockets at once (every rank
 * of a job on one host dialling together must fit with room to spare). */
void braid__admit_size(braid_admit *a, long members);

/* The source's host text for addr ("?" when it has none). */
void braid__admit_host(const braid_sockaddr *addr, char host[BRAID_SOCK_ADDR_STR]);

/* Count a new unproven connection from host. Returns what must go first:
 * 0 nothing, 1 an unproven connection of this source, 2 one of any source
 * (the caller drops its oldest and calls braid__admit_leave for it). -1
 * when out of memory (refuse the connection). */
int braid__admit_enter(braid_admit *a, const char *host);

/* A connection of host stops being unproven (proven, or closed). */
void braid__admit_leave(braid_admit *a, const char *host);

/* Record a wrong proof from host; returns how long to hold the connection
 * before closing it, in ms. */
int braid__admit_fail(braid_admit *a, const char *host, int64_t now_ms);

void braid__admit_free(braid_admit *a);

#endif
