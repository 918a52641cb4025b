/* Ranks as threads of the process that made the unique id, as NCCL's
 * ncclCommInitAll and nccl-tests -t N run them. The id's listening socket
 * then exists once in the process: rank 0 must find it whichever thread
 * reaches the rendezvous first, and the other ranks must not close it
 * under rank 0. Each case checks that every rank joins and an all-reduce
 * gives the right sum; a case runs in a child with a deadline, whose
 * threads' stacks are printed if it hangs. */
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap/bootstrap.h"
#include "braid.h"
#include "stack_dump.h"

#define MAX_RANKS 4
#define CASE_DEADLINE_S 60

typedef struct {
    braid_unique_id_t id;
    int rank, size;
    braid_status st;
    char error[512];
    float sum;
} thread_rank;

static void *rank_main(void *arg)
{
    thread_rank *t = arg;
    braid_config cfg = BRAID_CONFIG_INIT;
    cfg.init_timeout_ms = 20000;
    cfg.timeout_ms = 20000;
    braid_pg *pg = NULL;
    t->st = braid_pg_init(&pg, t->rank, t->size, &t->id, &cfg);
    if (t->st == BRAID_OK) {
        t->sum = (float)(t->rank + 1);
        t->st = braid_allreduce(pg, &t->sum, &t->sum, 1, BRAID_F32, BRAID_SUM, NULL, NULL);
    }
    if (t->st != BRAID_OK)
        snprintf(t->error, sizeof(t->error), "%s", braid_last_error());
    if (pg)
        braid_pg_destroy(pg);
    return NULL;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Whether something accepts connections on the id's port now. */
static int id_port_listens(const braid_unique_id_t *id)
{
    braid_rendezvous rv;
    if (braid__unique_id_decode(id, &rv) != BRAID_OK)
        return 0;
    char port[16];
    snprintf(port, sizeof(port), "%d", rv.port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (getaddrinfo(rv.host, port, &hints, &ai) != 0)
        return 0;
    int fd = socket(ai->ai_family, SOCK_STREAM, 0), ok = 0;
    if (fd >= 0)
        ok = connect(fd, ai->ai_addr, ai->ai_addrlen) == 0;
    if (fd >= 0)
        close(fd);
    freeaddrinfo(ai);
    return ok;
}

/* n ranks started in `order`, `gap_ms` apart; with check_listen, the id's
 * port must still accept connections just before the last rank starts. */
static int run_ranks(int n, const int *order, int gap_ms, int check_listen)
{
    braid_unique_id_t id;
    if (braid_unique_id(&id) != BRAID_OK) {
        fprintf(stderr, "braid_unique_id: %s\n", braid_last_error());
        return 1;
    }
    thread_rank t[MAX_RANKS];
    pthread_t th[MAX_RANKS];
    int failed = 0;
    for (int i = 0; i < n; i++) {
        int r = order[i];
        t[r] = (thread_rank){.id = id, .rank = r, .size = n};
        if (i > 0 && gap_ms > 0)
            sleep_ms(gap_ms);
        if (i == n - 1 && check_listen && !id_port_listens(&id)) {
            fprintf(stderr, "the id's port stopped listening before rank %d started\n", r);
            failed = 1;
        }
        if (pthread_create(&th[r], NULL, rank_main, &t[r]) != 0) {
            fprintf(stderr, "cannot start rank %d's thread\n", r);
            return 1;
        }
    }
    for (int r = 0; r < n; r++)
        pthread_join(th[r], NULL);
    float want = (float)(n * (n + 1) / 2);
    for (int r = 0; r < n; r++) {
        if (t[r].st != BRAID_OK) {
            fprintf(stderr, "rank %d of %d: %s\n", r, n, t[r].error);
            failed = 1;
        } else if (t[r].sum != want) {
            fprintf(stderr, "rank %d of %d: all-reduce gave %g, want %g\n", r, n, (double)t[r].sum, (double)want);
            failed = 1;
        }
    }
    return failed;
}

/* Rank 0 last, after the others have had time to reach the rendezvous. */
static int rank0_last(void)
{
    static const int order3[] = {1, 2, 0}, order4[] = {3, 1, 2, 0};
    return run_ranks(3, order3, 300, 1) | run_ranks(4, order4, 300, 1);
}

/* Every start order of 3 ranks, back to back, several times. */
static int any_order(void)
{
    static const int orders[][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
    int failed = 0;
    for (int rep = 0; rep < 5 && !failed; rep++)
        for (size_t k = 0; k < sizeof(orders) / sizeof(orders[0]) && !failed; k++)
            failed |= run_ranks(3, orders[k], 0, 0);
    return failed;
}

int main(void)
{
    int failed = stack_dump_run_case(rank0_last, "rank 0 starts last (3 and 4 ranks)", CASE_DEADLINE_S);
    failed |= stack_dump_run_case(any_order, "every start order of 3 ranks, 5 times", CASE_DEADLINE_S);
    return failed;
}
