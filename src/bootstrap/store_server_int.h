/* The store server's state, shared by store_server.c (the thread and its
 * poll loop, start and stop), store_conn.c (accepting, admitting and
 * authenticating connections, and their socket I/O) and store_request.c
 * (the key-value table and the requests on it). Internal to those. */
#ifndef BRAID_STORE_SERVER_INT_H
#define BRAID_STORE_SERVER_INT_H

#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "admit.h"
#include "auth.h"
#include "sock.h"
#include "store.h"
#include "store_wire.h"

#define ACCEPT_PAUSE_MS 100 /* after EMFILE: let fds free up instead of spinning */
#define ACCEPT_BATCH 32     /* connections accepted per turn of the loop */

/* CL_DELAY: a wrong proof, held silently until its deadline, then closed. */
typedef enum { CL_HANDSHAKE, CL_HEADER, CL_BODY, CL_PARKED, CL_REPLY, CL_DELAY, CL_DEAD } client_state;

typedef struct client {
    int fd;
    client_state state;
    int rank;         /* -1 until authenticated */
    int64_t deadline; /* handshake, or parked GET (-1: none) */
    char addr[BRAID_SOCK_ADDR_STR];
    char host[BRAID_SOCK_ADDR_STR]; /* addr without the port: the admission source */
    int unproven;                   /* counted in the server's admission table */
    int member;                     /* holds its rank's place in the job (joined) */
    braid_auth_accept hs;
    uint8_t hdr[BRAID_STORE_REQ_BYTES];
    size_t hdr_pos;
    braid_store_req req;
    uint8_t *body; /* key then value */
    size_t body_pos;
    uint8_t *out; /* reply being sent */
    size_t out_pos, out_len;
    struct client *next;
} client;

typedef struct entry {
    struct entry *next;
    uint8_t *key;
    size_t key_len;
    uint8_t *value;
    size_t value_len;
} entry;

struct braid_store_server {
    int listen_fd;
    int rank; /* whose store: named in the proven hello, and the clients' target */
    int wake[2];
    pthread_t thread;
    uint8_t secret[BRAID_SECRET_BYTES];
    client *clients;
    size_t nclients;
    entry **buckets;
    size_t nbuckets, nentries;
    struct pollfd *pfds;
    client **pclients;
    size_t pcap;
    int64_t accept_resume; /* listen fd ignored until then */
    int drain_ms;          /* on stop: serve connected members this long */
    braid_admit admit;
    braid_job_params job; /* size 0: parameters not checked */
    char failed[512];     /* why the job cannot start; "" while it can */
    uint8_t *told;        /* [job.size]: ranks that got the reason */
    uint32_t ntold;
    uint32_t expect; /* ranks to tell: the smallest world size any member stated */
    /* Ranks that have joined, for a job whose parameters are stated (the
     * rendezvous store; not the shrink and probe stores): once every rank
     * has, a newcomer is another job's (two jobs on one port), and a rank
     * held by a connected member is refused to a second process. */
    uint8_t *joined; /* [job.size]; NULL: not tracked */
    uint32_t njoined;
};

/* ---- store_conn.c: connections ------------------------------------------ */

/* Mark c dead (freed by the loop's sweep), logging why at level. */
void braid__store_client_drop(client *c, int level, const char *why);
void braid__store_client_free(client *c);
/* Try to send the pending reply; on completion wait for the next request. */
void braid__store_client_flush(client *c);
/* Queue a reply (code, value) and start sending it. */
void braid__store_client_reply(client *c, uint8_t code, const uint8_t *value, size_t len);
/* The connection no longer counts as unproven for admission. */
void braid__store_client_proven(braid_store_server *s, client *c);
/* A rank has been given the reason the job failed. */
void braid__store_mark_told(braid_store_server *s, int rank);
/* Advance c's handshake; on success it waits for its first request. */
void braid__store_step_handshake(braid_store_server *s, client *c);
/* Accept every pending connection on the listening socket. */
void braid__store_accept_clients(braid_store_server *s);

/* ---- store_request.c: the key-value table and requests ------------------ */

/* 0 on success, -1 out of memory. */
int braid__store_kv_init(braid_store_server *s);
void braid__store_kv_free(braid_store_server *s);
/* Advance c's state machine after poll() reported revents on it. */
void braid__store_client_step(braid_store_server *s, client *c, short revents);
/* The poll() events c waits for in its state. */
short braid__store_client_events(const client *c);

#endif
