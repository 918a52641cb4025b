#include <stdio.h>
#include <string.h>

#include "log.h"
#include "status.h"
#include "transport.h"
#include "transports/shm/shm.h"
#include "transports/tcp/tcp.h"
#ifdef BRAID_HAVE_VERBS
#include "transports/verbs/verbs.h"
#endif
#ifdef BRAID_HAVE_CUDA
#include "transports/cuda_ipc/cuda_ipc.h"
#endif

static const braid_transport_ops *const builtin[BRAID_TRANSPORT_ID_COUNT] = {
    [BRAID_TRANSPORT_TCP] = &braid__tcp_ops,
    [BRAID_TRANSPORT_SHM] = &braid__shm_ops,
#ifdef BRAID_HAVE_VERBS
    [BRAID_TRANSPORT_VERBS] = &braid__verbs_ops,
#endif
#ifdef BRAID_HAVE_CUDA
    [BRAID_TRANSPORT_CUDA_IPC] = &braid__cuda_ipc_ops,
#endif
};

/* Auto-selection order: fastest first, TCP last since it works anywhere. */
static const braid_transport_id preference[] = {BRAID_TRANSPORT_VERBS, BRAID_TRANSPORT_TCP,
                                                /* only by name until a pair's buffers decide (docs/CUDA.md) */
                                                BRAID_TRANSPORT_CUDA_IPC};

const braid_transport_ops *braid__transport_get(braid_transport_id id)
{
    return (unsigned)id < BRAID_TRANSPORT_ID_COUNT ? builtin[id] : NULL;
}

static const braid_transport_ops *by_name(const char *name, size_t len)
{
    for (int i = 0; i < BRAID_TRANSPORT_ID_COUNT; i++)
        if (builtin[i] && strlen(builtin[i]->name) == len && !strncmp(builtin[i]->name, name, len))
            return builtin[i];
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

const braid_transport_ops *braid__transport_select_local(const char *want, int rank)
{
    const braid_transport_ops *shm = builtin[BRAID_TRANSPORT_SHM];
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

braid_status braid__transport_select(const char *want, int rank, const braid_transport_ops **ops)
{
    /* shm reaches only this host: next to other names it serves same-host
     * peers (braid__transport_select_local) and the others pick the rest. */
    int has_shm = 0;
    int skip_shm = want && list_count(want, "shm", &has_shm) > 1 && has_shm;
    char why[512] = "";
    const char *last = NULL;
    if (!want) {
        for (size_t i = 0; i < sizeof(preference) / sizeof(preference[0]); i++) {
            const braid_transport_ops *t = builtin[preference[i]];
            if (t && usable(t, rank, why, sizeof(why))) {
                *ops = t;
                return BRAID_OK;
            }
        }
        return braid__error(BRAID_ERR_UNSUPPORTED, "rank %d: no usable transport", rank);
    }
    for (const char *p = want; *p;) {
        size_t len = strcspn(p, ",");
        const braid_transport_ops *t = by_name(p, len);
        if (t && skip_shm && t == builtin[BRAID_TRANSPORT_SHM]) {
            /* same-host peers only: chosen by braid__transport_select_local */
        } else if (!t)
            BRAID_WARN("rank %d: unknown transport '%.*s' in BRAID_TRANSPORT", rank, (int)len, p);
        else if (usable(t, rank, why, sizeof(why))) {
            *ops = t;
            return BRAID_OK;
        } else {
            last = t->name;
        }
        p += len;
        if (*p == ',')
            p++;
    }
    if (last)
        return braid__error(BRAID_ERR_UNSUPPORTED, "rank %d: none of the requested transports '%s' is usable (%s: %s)",
                            rank, want, last, why);
    return braid__error(BRAID_ERR_UNSUPPORTED, "rank %d: none of the requested transports '%s' is usable", rank, want);
}
