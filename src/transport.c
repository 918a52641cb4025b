#include <stdio.h>
#include <string.h>

#include "log.h"
#include "status.h"
#include "transport.h"
#include "transports/tcp/tcp.h"
#ifdef BRAID_HAVE_VERBS
#include "transports/verbs/verbs.h"
#endif

static const braid_transport_ops *const builtin[BRAID_TRANSPORT_ID_COUNT] = {
    [BRAID_TRANSPORT_TCP] = &braid__tcp_ops,
#ifdef BRAID_HAVE_VERBS
    [BRAID_TRANSPORT_VERBS] = &braid__verbs_ops,
#endif
};

/* Auto-selection order: fastest first, TCP last since it works anywhere. */
static const braid_transport_id preference[] = {BRAID_TRANSPORT_VERBS, BRAID_TRANSPORT_TCP};

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

braid_status braid__transport_select(const char *want, int rank, const braid_transport_ops **ops)
{
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
        if (!t)
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
