#include <stdio.h>
#include <string.h>

#include "log.h"
#include "status.h"
#include "transports/registry.h"
#include "transports/shm/shm.h"
#include "transports/tcp/tcp.h"
#ifdef BRAID_HAVE_VERBS
#include "transports/verbs/verbs.h"
#endif
#include "transports/cuda_ipc/cuda_ipc.h"

static const braid_transport_ops *const fixed[BRAID_TRANSPORT_ID_COUNT] = {
    [BRAID_TRANSPORT_TCP] = &braid__tcp_ops,
    [BRAID_TRANSPORT_SHM] = &braid__shm_ops,
#ifdef BRAID_HAVE_VERBS
    [BRAID_TRANSPORT_VERBS] = &braid__verbs_ops,
#endif
};

/* cuda_ipc comes from its own file (a stub without CUDA, which says
 * NULL), so that a test can link the transport against a stand-in
 * runtime. */
static const braid_transport_ops *builtin_at(int id)
{
    return id == BRAID_TRANSPORT_CUDA_IPC ? braid__cuda_ipc_transport() : fixed[id];
}

/* Auto-selection order of the group's transport (BRAID_TRANSPORT_ANY_PAIR only): fastest
 * first, TCP last since it works anywhere. */
static const braid_transport_id preference[] = {BRAID_TRANSPORT_VERBS, BRAID_TRANSPORT_TCP};

const braid_transport_ops *braid__transport_get(braid_transport_id id)
{
    return (unsigned)id < BRAID_TRANSPORT_ID_COUNT ? builtin_at(id) : NULL;
}

static const braid_transport_ops *by_name(const char *name, size_t len)
{
    for (int i = 0; i < BRAID_TRANSPORT_ID_COUNT; i++)
        if (builtin_at(i) && strlen(builtin_at(i)->name) == len && !strncmp(builtin_at(i)->name, name, len))
            return builtin_at(i);
    return NULL;
}

static int usable(const braid_transport_ops *ops, int rank, char *why, size_t why_len)
{
    why[0] = '\0';
    if (ops->probe(why, why_len) == BRAID_OK)
        return 1;
    BRAID_INFO("rank %d: transport %s unusable: %s", rank, ops->name, why);
    return 0;
}

int braid__transport_id_of(const braid_transport_ops *t)
{
    for (int i = 0; i < BRAID_TRANSPORT_ID_COUNT; i++)
        if (builtin_at(i) == t)
            return i;
    return -1;
}

/* Transports the whole group agrees on before any rank uses one. */
static int agreed(const braid_transport_ops *t)
{
    return t && t->agreed;
}

/* The built-in transport of the given scope (one each), or NULL. */
static const braid_transport_ops *scoped(braid_transport_scope scope)
{
    for (int i = 0; i < BRAID_TRANSPORT_ID_COUNT; i++)
        if (builtin_at(i) && builtin_at(i)->scope == (int)scope)
            return builtin_at(i);
    return NULL;
}

int braid__transport_agreement_needed(void)
{
    for (int i = 0; i < BRAID_TRANSPORT_ID_COUNT; i++)
        if (agreed(builtin_at(i)))
            return 1;
    return 0;
}

/* Number of names in a comma-separated list, and whether one is name. */
static int list_count(const char *want, const char *name, int *has)
{
    int n = 0;
    *has = 0;
    for (const char *p = want; *p;) {
        size_t len = strcspn(p, ",");
        if (len) {
            n++;
            if (strlen(name) == len && !strncmp(name, p, len))
                *has = 1;
        }
        p += len;
        if (*p == ',')
            p++;
    }
    return n;
}

/* Does want (NULL: automatic) consider t for the group's transport? */
static int candidate(const char *want, const braid_transport_ops *t)
{
    if (!want) {
        for (size_t i = 0; i < sizeof(preference) / sizeof(preference[0]); i++)
            if (builtin_at(preference[i]) == t)
                return 1;
        return 0;
    }
    int has;
    list_count(want, t->name, &has);
    return has;
}

/* A vote is one line per agreed transport this rank considers: "+name"
 * when its probe passed, "-name:reason" when not; a transport the rank
 * does not consider has no line. */
void braid__transport_vote(const char *want, char *vote, size_t cap)
{
    size_t used = 0;
    vote[0] = '\0';
    for (int i = 0; i < BRAID_TRANSPORT_ID_COUNT; i++) {
        const braid_transport_ops *t = builtin_at(i);
        if (!agreed(t) || !candidate(want, t))
            continue;
        char why[BRAID_TRANSPORT_WHY_MAX] = "";
        int ok = t->probe(why, sizeof(why)) == BRAID_OK;
        for (char *p = why; *p; p++)
            if (*p == '\n')
                *p = ' ';
        if (!ok && !why[0])
            snprintf(why, sizeof(why), "probe failed");
        int n = ok ? snprintf(vote + used, cap - used, "+%s\n", t->name)
                   : snprintf(vote + used, cap - used, "-%s:%s\n", t->name, why);
        if (n < 0 || (size_t)n >= cap - used) {
            vote[used] = '\0'; /* a truncated line would read as another verdict */
            break;
        }
        used += (size_t)n;
    }
}

void braid__transport_tally_init(braid_transport_tally *tally)
{
    memset(tally, 0, sizeof(*tally));
    for (int i = 0; i < BRAID_TRANSPORT_ID_COUNT; i++)
        tally->first_rank[i] = -1;
}

/* Rank voter's verdict on t from its vote: 1 usable, 0 not (why says
 * so). */
static int vote_says(const char *vote, const braid_transport_ops *t, char *why, size_t cap)
{
    size_t nlen = strlen(t->name);
    for (const char *p = vote; *p;) {
        size_t len = strcspn(p, "\n");
        if (len == nlen + 1 && p[0] == '+' && !strncmp(p + 1, t->name, nlen))
            return 1;
        if (len > nlen + 1 && p[0] == '-' && !strncmp(p + 1, t->name, nlen) && p[nlen + 1] == ':') {
            snprintf(why, cap, "%.*s", (int)(len - nlen - 2), p + nlen + 2);
            return 0;
        }
        p += len;
        if (*p == '\n')
            p++;
    }
    snprintf(why, cap, "not requested there (BRAID_TRANSPORT or braid_config.transports)");
    return 0;
}

void braid__transport_tally_add(braid_transport_tally *tally, int voter, const char *vote)
{
    for (int i = 0; i < BRAID_TRANSPORT_ID_COUNT; i++) {
        const braid_transport_ops *t = builtin_at(i);
        char why[BRAID_TRANSPORT_WHY_MAX];
        if (!agreed(t) || vote_says(vote, t, why, sizeof(why)))
            continue;
        tally->failed[i]++;
        if (tally->first_rank[i] < 0 || voter < tally->first_rank[i]) {
            tally->first_rank[i] = voter;
            snprintf(tally->first_why[i], sizeof(tally->first_why[i]), "%s", why);
        }
    }
    tally->voters++;
}

int braid__transport_devlinks_wanted(const char *want)
{
    const braid_transport_ops *ipc = scoped(BRAID_TRANSPORT_DEVICE_LINK);
    if (!ipc)
        return 0;
    if (!want)
        return 1;
    int has;
    return list_count(want, ipc->name, &has) > 1 && has;
}

const braid_transport_ops *braid__transport_select_local(const char *want, int rank)
{
    const braid_transport_ops *shm = scoped(BRAID_TRANSPORT_SOME_PAIRS);
    char why[512];
    if (!shm)
        return NULL;
    if (want) {
        int has;
        if (list_count(want, shm->name, &has) < 2 || !has)
            return NULL;
    }
    return usable(shm, rank, why, sizeof(why)) ? shm : NULL;
}

/* "rank 3: port 1 of mlx5_0 is DOWN (and 2 more ranks)" */
static void tally_reason(const braid_transport_tally *tally, int id, char *why, size_t cap)
{
    int more = tally->failed[id] - 1;
    if (more > 0)
        snprintf(why, cap, "rank %d: %s (and %d more rank%s)", tally->first_rank[id], tally->first_why[id], more,
                 more > 1 ? "s" : "");
    else
        snprintf(why, cap, "rank %d: %s", tally->first_rank[id], tally->first_why[id]);
}

/* Candidate t of the group's transport: an agreed one by every rank's
 * vote, any other by this rank's probe. */
static int group_usable(const braid_transport_ops *t, int rank, const braid_transport_tally *tally, char *why,
                        size_t cap)
{
    if (!agreed(t) || !tally)
        return usable(t, rank, why, cap);
    int id = braid__transport_id_of(t);
    if (tally->failed[id] == 0)
        return 1;
    tally_reason(tally, id, why, cap);
    return 0;
}

braid_status braid__transport_select(const char *want, int rank, const braid_transport_tally *tally,
                                     const braid_transport_ops **ops)
{
    /* A transport that serves only some pairs (its scope) is the
     * group's transport only when named alone; next to other names it
     * serves its pairs beside the group's transport (same-host peers:
     * braid__transport_select_local; device links:
     * braid__transport_devlinks_wanted) and the others pick the rest. */
    int nwant = 0, has;
    if (want)
        nwant = list_count(want, "", &has);
    char why[BRAID_TRANSPORT_WHY_MAX] = "", refused_why[BRAID_TRANSPORT_WHY_MAX] = "";
    const char *last = NULL;
    const braid_transport_ops *refused = NULL, *chosen = NULL;
    size_t npref = sizeof(preference) / sizeof(preference[0]);
    const char *p = want;
    for (size_t k = 0; !chosen && (want ? *p != '\0' : k < npref); k++) {
        const braid_transport_ops *t;
        if (want) {
            size_t len = strcspn(p, ",");
            t = by_name(p, len);
            if (!t && len)
                BRAID_INFO("rank %d: transport '%.*s' is not built into this braid: skipped", rank, (int)len, p);
            p += len;
            if (*p == ',')
                p++;
            if (!t || (nwant > 1 && t->scope != BRAID_TRANSPORT_ANY_PAIR))
                continue; /* some pairs only: braid__transport_select_local, src/lifecycle/devlink.c */
        } else {
            t = builtin_at(preference[k]);
            if (!t)
                continue;
        }
        if (group_usable(t, rank, tally, why, sizeof(why))) {
            chosen = t;
        } else {
            last = t->name;
            if (agreed(t) && tally && !refused) {
                refused = t;
                snprintf(refused_why, sizeof(refused_why), "%s", why);
            }
        }
    }
    if (chosen) {
        /* The group's one line about it: every rank read the same votes. */
        if (refused && rank == 0)
            BRAID_INFO("%s disabled: %s; using %s", refused->name, refused_why, chosen->name);
        *ops = chosen;
        return BRAID_OK;
    }
    if (!want)
        return braid__error(BRAID_ERR_UNSUPPORTED, "rank %d: no usable transport%s%s", rank, last ? ": " : "",
                            last ? why : "");
    if (last)
        return braid__error(BRAID_ERR_UNSUPPORTED, "rank %d: none of the requested transports '%s' is usable (%s: %s)",
                            rank, want, last, why);
    return braid__error(BRAID_ERR_UNSUPPORTED, "rank %d: none of the requested transports '%s' is usable", rank, want);
}

int braid__transport_for_peer(braid_listener *const listeners[BRAID_TRANSPORT_ID_COUNT],
                              const char addr[BRAID_TRANSPORT_ID_COUNT][BRAID_ADDR_MAX], int group_id,
                              const braid_peer_info *me, const braid_peer_info *peer)
{
    for (int id = 0; id < BRAID_TRANSPORT_ID_COUNT; id++) {
        const braid_transport_ops *t = builtin_at(id);
        if (id == group_id || !t || t->scope != BRAID_TRANSPORT_SOME_PAIRS || !listeners[id] || !addr[id][0])
            continue;
        if (!BRAID_TRANSPORT_HAS(t, can_connect) || t->can_connect(me, peer))
            return id;
    }
    return group_id;
}

const braid_transport_ops *braid__transport_some_pairs(braid_listener *const listeners[BRAID_TRANSPORT_ID_COUNT])
{
    const braid_transport_ops *t = scoped(BRAID_TRANSPORT_SOME_PAIRS);
    return t && listeners[braid__transport_id_of(t)] ? t : NULL;
}
