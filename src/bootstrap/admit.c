/* Per-source admission of unauthenticated connections (see admit.h). */
#include <stdlib.h>
#include <string.h>

#include "admit.h"
#include "clock.h"

#define MAX_SOURCES 4096 /* beyond: forget the quietest source with no connection */

void braid__admit_host(const braid_sockaddr *addr, char host[BRAID_SOCK_ADDR_STR])
{
    if (braid__sock_addr_host(addr, host, BRAID_SOCK_ADDR_STR) != BRAID_OK)
        strcpy(host, "?");
}

static braid_admit_source *find(braid_admit *a, const char *host)
{
    for (size_t i = 0; i < a->n; i++)
        if (strcmp(a->v[i].host, host) == 0)
            return &a->v[i];
    return NULL;
}

/* Drop sources that hold nothing: no connection and no recent failure. */
static void prune(braid_admit *a, int64_t now)
{
    for (size_t i = 0; i < a->n;) {
        braid_admit_source *s = &a->v[i];
        if (s->unproven == 0 && (s->fails == 0 || now - s->last_fail > BRAID_ADMIT_FORGET_MS))
            a->v[i] = a->v[--a->n];
        else
            i++;
    }
}

static braid_admit_source *find_or_add(braid_admit *a, const char *host)
{
    braid_admit_source *s = find(a, host);
    if (s)
        return s;
    if (a->n == a->cap) {
        prune(a, braid__now_ms());
        if (a->n == a->cap && a->cap >= MAX_SOURCES) {
            /* Forget the oldest failure record of an idle source. */
            size_t victim = a->n;
            for (size_t i = 0; i < a->n; i++)
                if (a->v[i].unproven == 0 && (victim == a->n || a->v[i].last_fail < a->v[victim].last_fail))
                    victim = i;
            if (victim == a->n)
                return NULL;
            a->v[victim] = a->v[--a->n];
        }
    }
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 16;
        braid_admit_source *v = realloc(a->v, cap * sizeof(*v));
        if (!v)
            return NULL;
        a->v = v;
        a->cap = cap;
    }
    s = &a->v[a->n++];
    memset(s, 0, sizeof(*s));
    strncpy(s->host, host, sizeof(s->host) - 1);
    return s;
}

int braid__admit_enter(braid_admit *a, const char *host)
{
    braid_admit_source *s = find_or_add(a, host);
    if (!s)
        return -1;
    int per_source = a->per_source > 0 ? a->per_source : BRAID_ADMIT_PER_SOURCE;
    int total = a->total > 0 ? a->total : BRAID_ADMIT_TOTAL;
    int evict = s->unproven >= per_source ? 1 : a->unproven >= total ? 2 : 0;
    s->unproven++;
    a->unproven++;
    return evict;
}

void braid__admit_size(braid_admit *a, long members)
{
    if (members < 0)
        members = 0;
    if (members > 1 << 20)
        members = 1 << 20;
    a->per_source = BRAID_ADMIT_PER_SOURCE + 2 * (int)members;
    a->total = BRAID_ADMIT_TOTAL + 2 * (int)members;
}

void braid__admit_leave(braid_admit *a, const char *host)
{
    braid_admit_source *s = find(a, host);
    if (!s || s->unproven == 0)
        return;
    s->unproven--;
    a->unproven--;
}

int braid__admit_fail(braid_admit *a, const char *host, int64_t now_ms)
{
    braid_admit_source *s = find_or_add(a, host);
    if (!s)
        return BRAID_ADMIT_DELAY_MAX_MS;
    if (s->fails > 0 && now_ms - s->last_fail > BRAID_ADMIT_FORGET_MS)
        s->fails = 0;
    s->last_fail = now_ms;
    if (s->fails < 30)
        s->fails++;
    int64_t d = (int64_t)BRAID_ADMIT_DELAY_MIN_MS << (s->fails - 1);
    return d > BRAID_ADMIT_DELAY_MAX_MS ? BRAID_ADMIT_DELAY_MAX_MS : (int)d;
}

void braid__admit_free(braid_admit *a)
{
    free(a->v);
    memset(a, 0, sizeof(*a));
}
