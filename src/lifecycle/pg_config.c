/* Process-group configuration: braid_config fields, checked, then the
 * BRAID_* environment, then the defaults, into the group's settings. */
#include <stddef.h>
#include <string.h>
#include <strings.h>

#include "log.h"
#include "param.h"
#include "pg.h"
#include "pg_int.h"
#include "status.h"

#define DEFAULT_TIMEOUT_MS 300000
/* torch's default process-group timeout (default_pg_timeout, 30 min),
 * which its rendezvous also waits: a job that torch would start, braid does. */
#define DEFAULT_INIT_TIMEOUT_MS 1800000
#define AUTO_NSOCKS 0 /* the transport picks per peer */
#define DEFAULT_CHUNK_BYTES (512 * 1024)

static braid_algo parse_algo(const char *s)
{
    if (!s || !strcasecmp(s, "auto"))
        return BRAID_ALGO_AUTO;
    if (!strcasecmp(s, "ring"))
        return BRAID_ALGO_RING;
    if (!strcasecmp(s, "rd") || !strcasecmp(s, "recursive_doubling"))
        return BRAID_ALGO_RECURSIVE_DOUBLING;
    if (!strcasecmp(s, "hier") || !strcasecmp(s, "hierarchical"))
        return BRAID_ALGO_HIER;
    BRAID_WARN("ignoring BRAID_ALGO=%s (expected auto, ring, rd or hier)", s);
    return BRAID_ALGO_AUTO;
}

/* Config fields win over the environment, which wins over defaults. */
braid_status braid__pg_apply_config(braid_pg *pg, const braid_config *cfg)
{
    braid_config c = BRAID_CONFIG_INIT;
    if (cfg) {
        if (cfg->size < offsetof(braid_config, timeout_ms) + sizeof(int) || cfg->size > sizeof(braid_config) * 4)
            return braid__error(BRAID_ERR_INVALID_ARG, "braid_config.size %zu is invalid: use BRAID_CONFIG_INIT",
                                cfg->size);
        memcpy(&c, cfg, cfg->size < sizeof(c) ? cfg->size : sizeof(c));
    }
    /* 0 means "not set"; a negative value is a mistake, not a default. */
    if (c.timeout_ms < 0)
        return braid__error(BRAID_ERR_INVALID_ARG, "braid_config.timeout_ms %d is negative (0: BRAID_TIMEOUT_MS or "
                            "the default)", c.timeout_ms);
    if (c.nsocks < 0 || c.nsocks > 16)
        return braid__error(BRAID_ERR_INVALID_ARG, "braid_config.nsocks %d out of range [1, 16] (0: automatic)",
                            c.nsocks);
    if (c.checksum < -1 || c.checksum > 1)
        return braid__error(BRAID_ERR_INVALID_ARG, "braid_config.checksum %d is invalid (1 on, -1 off, 0: "
                            "BRAID_CHECKSUM)", c.checksum);
    long long timeout = c.timeout_ms > 0 ? c.timeout_ms : braid__param_int("BRAID_TIMEOUT_MS", DEFAULT_TIMEOUT_MS);
    long long nsocks = c.nsocks > 0 ? c.nsocks : braid__param_int("BRAID_NSOCKS", AUTO_NSOCKS);
    long long chunk = c.chunk_bytes > 0 ? (long long)c.chunk_bytes
                                        : braid__param_int("BRAID_CHUNK_BYTES", DEFAULT_CHUNK_BYTES);
    int has_init_field = c.size >= offsetof(braid_config, init_timeout_ms) + sizeof(int);
    if (has_init_field && c.init_timeout_ms < 0)
        return braid__error(BRAID_ERR_INVALID_ARG, "braid_config.init_timeout_ms %d is negative (0: "
                            "BRAID_INIT_TIMEOUT_MS or the default)", c.init_timeout_ms);
    int has_init = has_init_field && c.init_timeout_ms > 0;
    long long init_timeout = has_init ? c.init_timeout_ms
                                      : braid__param_int("BRAID_INIT_TIMEOUT_MS", DEFAULT_INIT_TIMEOUT_MS);
    if (timeout <= 0 || timeout > 24LL * 3600 * 1000)
        return braid__error(BRAID_ERR_INVALID_ARG, "timeout %lld ms out of range", timeout);
    if (init_timeout <= 0 || init_timeout > 24LL * 3600 * 1000)
        return braid__error(BRAID_ERR_INVALID_ARG, "init timeout %lld ms out of range (1 ms to 24 h)", init_timeout);
    if (nsocks < 0 || nsocks > 16)
        return braid__error(BRAID_ERR_INVALID_ARG, "nsocks %lld out of range [1, 16] (0: automatic)", nsocks);
    if (chunk < 4096 || chunk > (1LL << 30))
        return braid__error(BRAID_ERR_INVALID_ARG, "chunk size %lld out of range [4096, 1 GiB]", chunk);
    if ((unsigned)c.algo >= BRAID_ALGO_COUNT)
        return braid__error(BRAID_ERR_INVALID_ARG, "braid_config.algo %d is invalid", (int)c.algo);
    pg->timeout_ms = (int)timeout;
    pg->init_timeout_ms = (int)init_timeout;
    pg->ctx.timeout_ms = (int)timeout;
    pg->ctx.nsocks = (int)nsocks;
    pg->chunk_bytes = (size_t)chunk & ~(size_t)63; /* whole cache lines: vector-friendly chunk edges */
    pg->algo = c.algo != BRAID_ALGO_AUTO ? c.algo : parse_algo(braid__param_str("BRAID_ALGO"));
    pg->checksum = c.checksum != 0 ? c.checksum > 0 : braid__param_bool("BRAID_CHECKSUM", 0);
    return BRAID_OK;
}
