/* ncclConfig_t, read the way NCCL 2.28 reads it, so that a struct built
 * with any NCCL header since 2.14 is accepted or refused exactly as
 * NVIDIA's library would:
 *
 *  - at most `size` bytes are read (a struct from a newer header, larger
 *    than ours, is accepted and its extra fields ignored; a smaller one
 *    leaves the fields it lacks at their defaults);
 *  - the magic must be NCCL_CONFIG_INITIALIZER's, else
 *    ncclInvalidArgument: a struct nobody initialised;
 *  - fields added after the struct's `version` are reset to their
 *    defaults, whatever bytes the caller left there (NCCL's thresholds:
 *    blocking 2.14; CTA shape and netName 2.17; trafficClass 2.25;
 *    collnetEnable, CTAPolicy, shrinkShare and nvlsCTAs 2.27;
 *    nChannelsPerNetPeer and nvlinkCentricSched 2.28);
 *  - each field is range-checked as NCCL does, including its quirk that a
 *    minCTAs set without maxCTAs is refused (INT_MIN is below any count).
 *
 * braid uses blocking, netName and commName; the GPU launch fields are
 * checked and otherwise ignored (docs/NCCL_COMPAT.md). */
#include <string.h>

#include "nccl_internal.h"
#include "param.h"

#define CONFIG_MAGIC 0xcafebeefu
#define NCCL_MAX_CHANNELS 64 /* NCCL's MAXCHANNELS: the bound of nChannelsPerNetPeer */

static int undef_or_bool(int v)
{
    return v == NCCL_CONFIG_UNDEF_INT || v == 0 || v == 1;
}

/* Reset the fields newer than the struct's version to the initializer's. */
static void reset_newer_fields(ncclConfig_t *c)
{
    const ncclConfig_t def = NCCL_CONFIG_INITIALIZER;
    if (c->version < NCCL_VERSION(2, 14, 0))
        c->blocking = def.blocking;
    if (c->version < NCCL_VERSION(2, 17, 0)) {
        c->cgaClusterSize = def.cgaClusterSize;
        c->minCTAs = def.minCTAs;
        c->maxCTAs = def.maxCTAs;
        c->netName = def.netName;
    }
    if (c->version < NCCL_VERSION(2, 25, 0))
        c->trafficClass = def.trafficClass;
    if (c->version < NCCL_VERSION(2, 27, 0)) {
        c->collnetEnable = def.collnetEnable;
        c->CTAPolicy = def.CTAPolicy;
        c->shrinkShare = def.shrinkShare;
        c->nvlsCTAs = def.nvlsCTAs;
    }
    if (c->version < NCCL_VERSION(2, 28, 0)) {
        c->nChannelsPerNetPeer = def.nChannelsPerNetPeer;
        c->nvlinkCentricSched = def.nvlinkCentricSched;
    }
}

/* The first field out of NCCL's range, or NULL. */
static const char *bad_field(const ncclConfig_t *c, int *value)
{
    const int policy_bits = NCCL_CTA_POLICY_EFFICIENCY | NCCL_CTA_POLICY_ZERO;
#define BAD(field)                                                                                                     \
    do {                                                                                                               \
        *value = c->field;                                                                                             \
        return #field;                                                                                                 \
    } while (0)
    if (!undef_or_bool(c->blocking))
        BAD(blocking);
    if (c->cgaClusterSize != NCCL_CONFIG_UNDEF_INT && c->cgaClusterSize < 0)
        BAD(cgaClusterSize);
    if (c->minCTAs != NCCL_CONFIG_UNDEF_INT && c->minCTAs <= 0)
        BAD(minCTAs);
    if ((c->maxCTAs != NCCL_CONFIG_UNDEF_INT && c->maxCTAs <= 0) || c->minCTAs > c->maxCTAs)
        BAD(maxCTAs);
    if (!undef_or_bool(c->splitShare))
        BAD(splitShare);
    if (!undef_or_bool(c->collnetEnable))
        BAD(collnetEnable);
    if (c->CTAPolicy != NCCL_CONFIG_UNDEF_INT && (c->CTAPolicy & ~policy_bits) != 0)
        BAD(CTAPolicy);
    if (!undef_or_bool(c->shrinkShare))
        BAD(shrinkShare);
    if (c->nvlsCTAs != NCCL_CONFIG_UNDEF_INT && c->nvlsCTAs <= 0)
        BAD(nvlsCTAs);
    if (c->nChannelsPerNetPeer != NCCL_CONFIG_UNDEF_INT &&
        (c->nChannelsPerNetPeer <= 0 || c->nChannelsPerNetPeer > NCCL_MAX_CHANNELS))
        BAD(nChannelsPerNetPeer);
    if (!undef_or_bool(c->nvlinkCentricSched))
        BAD(nvlinkCentricSched);
#undef BAD
    return NULL;
}

ncclResult_t nccl__config_read(const ncclConfig_t *config, nccl_comm_config *out, const char *call)
{
    ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
    memset(out, 0, sizeof(*out));
    out->blocking = 1;
    if (config) {
        size_t size;
        memcpy(&size, config, sizeof(size));
        if (size > sizeof(c))
            size = sizeof(c);
        c.magic = 0; /* a struct too small to hold a magic has none */
        memcpy(&c, config, size);
        if (c.magic != CONFIG_MAGIC)
            return nccl__fail(ncclInvalidArgument,
                              "%s: config was not initialised with NCCL_CONFIG_INITIALIZER (magic 0x%x, size %zu)",
                              call, c.magic, size);
        reset_newer_fields(&c);
    }
    int value = 0;
    const char *field = bad_field(&c, &value);
    if (field)
        return nccl__fail(ncclInvalidArgument, "%s: config.%s = %d is out of range", call, field, value);
    const char *net = c.netName;
    if (net && strcmp(net, "Socket") != 0 && strcmp(net, "IB") != 0)
        return nccl__fail(ncclInvalidArgument,
                          "%s: config.netName \"%s\" unknown: braid offers \"Socket\" (tcp) and \"IB\" (verbs)", call,
                          net);
    if (net)
        memcpy(out->net, strcmp(net, "IB") == 0 ? "verbs" : "tcp", strcmp(net, "IB") == 0 ? 6 : 4);
    if (c.blocking == 0)
        out->blocking = 0;
    /* NCCL_COMM_BLOCKING overrides the struct both ways once it passed its
     * checks, as NCCL's envConfigOverride does; other values are ignored. */
    long long env = braid__param_int("NCCL_COMM_BLOCKING", -1);
    if (env == 0 || env == 1)
        out->blocking = (int)env;
    if (c.commName) {
        size_t n = strnlen(c.commName, sizeof(out->name) - 1);
        memcpy(out->name, c.commName, n);
        out->name[n] = '\0';
    }
    return ncclSuccess;
}
