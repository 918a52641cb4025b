/* Rendezvous store server: one thread, one poll() loop over the listening
 * socket, a wake pipe and every client. Each client is a small state
 * machine (handshake, request header, body, parked GET, reply), so a slow,
 * silent, half-open or garbage connection costs one pollfd and never
 * blocks anybody else; an unauthenticated one is dropped at its deadline.
 * This file runs the thread: the loop, deadlines, draining, start and stop;
 * store_conn.c handles connections, store_request.c the requests. */
#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "sock.h"
#include "status.h"
#include "store_server_int.h"

#define DRAIN_POLL_MS 10     /* while stopping: how often the client count is checked */
#define FAILED_DRAIN_MS 5000 /* a failed job's store stays until every rank was told, or this long */

static void sweep_dead(braid_store_server *s)
{
    for (client **pp = &s->clients; *pp;) {
        client *c = *pp;
        if (c->state == CL_DEAD) {
            braid__store_client_proven(s, c);
            *pp = c->next;
            s->nclients--;
            braid__store_client_free(c);
        } else {
            pp = &c->next;
        }
    }
}

static void expire_deadlines(braid_store_server *s, int64_t now)
{
    for (client *c = s->clients; c; c = c->next) {
        if (c->deadline < 0 || c->deadline > now)
            continue;
        if (c->state == CL_HANDSHAKE)
            braid__store_client_drop(c, c->hs.bytes_in ? BRAID_LOG_WARN : BRAID_LOG_INFO,
                                     "no complete handshake in time (slow, silent or not a braid client)");
        else if (c->state == CL_DELAY)
            braid__store_client_drop(c, BRAID_LOG_INFO, "closed after a wrong proof");
        else if (c->state == CL_PARKED)
            braid__store_client_reply(c, BRAID_STORE_REPLY_TIMEOUT, NULL, 0);
    }
}

static int poll_timeout(const braid_store_server *s, int64_t now)
{
    int64_t next = -1;
    for (const client *c = s->clients; c; c = c->next)
        if (c->deadline >= 0 && (next < 0 || c->deadline < next))
            next = c->deadline;
    if (s->accept_resume > now && (next < 0 || s->accept_resume < next))
        next = s->accept_resume;
    if (next < 0)
        return -1;
    return next <= now ? 0 : (int)(next - now > 60000 ? 60000 : next - now);
}

static int grow_pollfds(braid_store_server *s, size_t n)
{
    if (n <= s->pcap)
        return 0;
    size_t cap = s->pcap ? s->pcap : 16;
    while (cap < n)
        cap *= 2;
    struct pollfd *p = realloc(s->pfds, cap * sizeof(*p));
    if (!p)
        return -1;
    s->pfds = p;
    client **c = realloc(s->pclients, cap * sizeof(*c));
    if (!c)
        return -1;
    s->pclients = c;
    s->pcap = cap;
    return 0;
}

static size_t members(const braid_store_server *s)
{
    size_t n = 0;
    for (const client *c = s->clients; c; c = c->next)
        n += c->rank >= 0 && c->state != CL_DEAD;
    return n;
}

/* Stopping may finish: members gone, or, for a failed job, every rank of
 * it told why and every reply sent. */
static int drained(const braid_store_server *s)
{
    if (!s->failed[0])
        return members(s) == 0;
    for (const client *c = s->clients; c; c = c->next)
        if (c->state == CL_REPLY || (c->state == CL_HANDSHAKE && c->hs.state >= BRAID_AUTH_SEND_RESULT))
            return 0;
    uint32_t n = s->expect < s->job.size ? s->expect : s->job.size;
    for (uint32_t r = 0; r < n; r++)
        if (!s->told[r])
            return 0;
    return 1;
}

static void *server_main(void *arg)
{
    braid_store_server *s = arg;
    int64_t stop_at = -1; /* set once stopping */
    for (;;) {
        int64_t now = braid__now_ms();
        if (grow_pollfds(s, s->nclients + 2) != 0) {
            BRAID_WARN("store: out of memory for %zu connections; retrying", s->nclients);
            poll(NULL, 0, ACCEPT_PAUSE_MS);
            continue;
        }
        size_t n = 0;
        s->pfds[n++] = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
        s->pfds[n++] = (struct pollfd){.fd = s->accept_resume > now ? -1 : s->listen_fd, .events = POLLIN};
        for (client *c = s->clients; c; c = c->next) {
            s->pclients[n] = c;
            /* A held connection is not watched: a close would wake us in a loop. */
            s->pfds[n++] =
                (struct pollfd){.fd = c->state == CL_DELAY ? -1 : c->fd, .events = braid__store_client_events(c)};
        }
        int timeout = poll_timeout(s, now);
        if (stop_at >= 0 && (timeout < 0 || timeout > DRAIN_POLL_MS))
            timeout = DRAIN_POLL_MS;
        int rc = poll(s->pfds, (nfds_t)n, timeout);
        if (rc < 0 && errno != EINTR) {
            BRAID_WARN("store: poll: %m");
            poll(NULL, 0, ACCEPT_PAUSE_MS);
            continue;
        }
        if (rc > 0 && s->pfds[0].revents && stop_at < 0) {
            char drain[16];
            ssize_t r = read(s->wake[0], drain, sizeof(drain));
            (void)r;
            /* A failed job's members are told why, even when the owner leaves at once. */
            int grace = s->failed[0] && s->drain_ms < FAILED_DRAIN_MS ? FAILED_DRAIN_MS : s->drain_ms;
            stop_at = braid__now_ms() + grace;
        }
        /* Only members are waited for: a stranger's connection is no reason
         * to keep the store. */
        if (stop_at >= 0 && (drained(s) || braid__now_ms() >= stop_at))
            break;
        for (size_t i = 2; rc > 0 && i < n; i++)
            if (s->pfds[i].revents)
                braid__store_client_step(s, s->pclients[i], s->pfds[i].revents);
        if (rc > 0 && s->pfds[1].revents)
            braid__store_accept_clients(s);
        expire_deadlines(s, braid__now_ms());
        sweep_dead(s);
    }
    return NULL;
}

braid_status braid__store_server_start(int listen_fd, const uint8_t secret[BRAID_SECRET_BYTES],
                                       braid_store_server **server)
{
    return braid__store_server_start_job(listen_fd, secret, NULL, server);
}

braid_status braid__store_server_start_job(int listen_fd, const uint8_t secret[BRAID_SECRET_BYTES],
                                           const braid_job_params *job, braid_store_server **server)
{
    return braid__store_server_start_as(listen_fd, secret, job, 0, server);
}

braid_status braid__store_server_start_as(int listen_fd, const uint8_t secret[BRAID_SECRET_BYTES],
                                          const braid_job_params *job, int rank, braid_store_server **server)
{
    braid_status st;
    braid_store_server *s = calloc(1, sizeof(*s));
    if (!s) {
        st = braid__error(BRAID_ERR_NO_MEMORY, "store: out of memory");
        goto err_close_listen;
    }
    s->listen_fd = listen_fd;
    s->rank = rank;
    memcpy(s->secret, secret, BRAID_SECRET_BYTES);
    if (job && job->size > 0) {
        s->job = *job;
        s->expect = job->size;
        braid__admit_size(&s->admit, job->size); /* every rank connects at once at init */
        s->told = calloc(job->size, 1);
        if (job->source != BRAID_SECRET_UNSTATED)
            s->joined = calloc(job->size, 1);
        if (!s->told || (job->source != BRAID_SECRET_UNSTATED && !s->joined)) {
            st = braid__error(BRAID_ERR_NO_MEMORY, "store: out of memory");
            goto err_free_server;
        }
    }
    if (braid__store_kv_init(s) != 0) {
        st = braid__error(BRAID_ERR_NO_MEMORY, "store: out of memory");
        goto err_free_server;
    }
    if (braid__sock_set_nonblock(listen_fd) != BRAID_OK) {
        st = BRAID_ERR_SYSTEM;
        goto err_free_buckets;
    }
    if (pipe2(s->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        st = braid__error(BRAID_ERR_SYSTEM, "store: pipe: %m");
        goto err_free_buckets;
    }
    int rc = pthread_create(&s->thread, NULL, server_main, s);
    if (rc != 0) {
        errno = rc;
        st = braid__error(BRAID_ERR_SYSTEM, "store: cannot start the server thread: %m");
        goto err_close_pipe;
    }
    *server = s;
    return BRAID_OK;

err_close_pipe:
    close(s->wake[0]);
    close(s->wake[1]);
err_free_buckets:
    braid__store_kv_free(s);
err_free_server:
    free(s->told);
    free(s->joined);
    free(s);
err_close_listen:
    close(listen_fd);
    return st;
}

void braid__store_server_stop(braid_store_server *s)
{
    braid__store_server_stop_drained(s, 0);
}

void braid__store_server_stop_drained(braid_store_server *s, int grace_ms)
{
    if (!s)
        return;
    s->drain_ms = grace_ms > 0 ? grace_ms : 0; /* read by the thread after the wake-up below */
    ssize_t w;
    do {
        w = write(s->wake[1], "x", 1);
    } while (w < 0 && errno == EINTR);
    pthread_join(s->thread, NULL);
    for (client *c = s->clients, *next; c; c = next) {
        next = c->next;
        braid__store_client_free(c);
    }
    braid__store_kv_free(s);
    braid__admit_free(&s->admit);
    free(s->told);
    free(s->joined);
    OPENSSL_cleanse(&s->job, sizeof(s->job));
    free(s->pfds);
    free(s->pclients);
    close(s->wake[0]);
    close(s->wake[1]);
    close(s->listen_fd);
    memset(s->secret, 0, sizeof(s->secret));
    free(s);
}