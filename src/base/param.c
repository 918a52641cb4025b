/* The parameter table and its strict parsers (param.h). */
#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "log.h"
#include "param.h"

#define KIB 1024LL
#define MIB (1024LL * KIB)
#define GIB (1024LL * MIB)

#define STR(name, sec, def, help) {name, BRAID_PARAM_STR, sec, 0, 0, NULL, def, help}
#define CHOICE(name, sec, choices, def, help) {name, BRAID_PARAM_CHOICE, sec, 0, 0, choices, def, help}
#define INT(name, sec, lo, hi, def, help) {name, BRAID_PARAM_INT, sec, lo, hi, NULL, def, help}
#define SIZE(name, sec, lo, hi, def, help) {name, BRAID_PARAM_SIZE, sec, lo, hi, NULL, def, help}
#define BOOL(name, sec, def, help) {name, BRAID_PARAM_BOOL, sec, 0, 1, NULL, def, help}
#define LIST(name, sec, choices, def, help) {name, BRAID_PARAM_LIST, sec, 0, 0, choices, def, help}

#define CORE BRAID_PARAM_CORE
#define VERBS BRAID_PARAM_VERBS
#define LAUNCHER BRAID_PARAM_LAUNCHER
#define TEST BRAID_PARAM_TEST

/* Every environment variable the library reads. Keep help to one line of
 * markdown: docs/CONFIG.md's tables are generated from it. */
const braid_param_info braid__params[] = {
    CHOICE("BRAID_DEBUG", CORE, "NONE|WARN|INFO|TRACE|0", "WARN",
           "log level (`0` is `NONE`; TRACE needs `-Dtrace=true`); from INFO, each process's first group starts "
           "with a line naming braid's version, build and CUDA state"),
    STR("BRAID_DEBUG_FILE", CORE, NULL, "log to this file instead of stderr; `%h` is replaced by the host name, "
                                        "`%p` by the pid"),
    INT("BRAID_TIMEOUT_MS", CORE, 1, 24LL * 3600 * 1000, "300000",
        "limit of every blocking wait, in milliseconds (`braid_config.timeout_ms`)"),
    INT("BRAID_INIT_TIMEOUT_MS", CORE, 1, 24LL * 3600 * 1000, "1800000",
        "how long `braid_pg_init` waits for every rank to reach rank 0's store (`braid_config.init_timeout_ms`); "
        "30 min is torch's default process-group timeout (`default_pg_timeout`, which its rendezvous waits too; "
        "NCCL process groups default to 10 min). Meanwhile rank 0 logs the missing ranks (WARN, every 10 s); then "
        "every rank fails naming them"),
    LIST("BRAID_TRANSPORT", CORE, "tcp|shm|verbs|cuda_ipc", NULL,
        "comma-separated transports in order of preference, e.g. `tcp` or `verbs,tcp`; `shm` next to others "
        "serves same-host peers, alone every peer; `cuda_ipc` next to others allows device links (on by default "
        "in CUDA builds; a list without it turns them off), alone every peer. Unset: shm for same-host peers, "
        "verbs or tcp for the rest"),
    INT("BRAID_TRACE_BUFFER", CORE, 0, 10000000, "2000",
        "flight recorder: calls each group keeps (kind, size, peer, algorithm, state, times), written out at the "
        "group's first failure and by `braid_pg_trace_dump`; 0 turns it off"),
    STR("BRAID_TRACE_DIR", CORE, NULL,
        "flight recorder: directory for its files, one per rank and dump (`braid-trace-GROUP-rRANK-pPID-N.txt`; "
        "`scripts/braid-trace-merge` reads them); unset: the last 32 records go to stderr (at a failure, unless "
        "`BRAID_DEBUG=NONE`)"),
    STR("BRAID_HOST_ID", CORE, NULL,
        "ranks with equal values use shared memory between them (unset: host name, boot id and network "
        "namespace)"),
    BOOL("BRAID_SHM_CMA", CORE, "1",
         "shm: read large messages straight from the sender (`process_vm_readv`); off copies them through the "
         "ring"),
    BOOL("BRAID_DEVCOLL", CORE, "0",
         "same-host device all-reduce and broadcast as one kernel over IPC-mapped memory (docs/CUDA.md); every "
         "rank must then pass device memory to them"),
    SIZE("BRAID_DEVCOLL_ONESHOT_BYTES", CORE, 0, GIB, "262144",
         "device collectives: largest all-reduce read whole from every peer (one-shot); larger ones reduce a "
         "shard each and gather (two-shot)"),
    STR("BRAID_SOCKET_IFNAME", CORE, NULL,
        "interface (or prefix, `eth`) whose address braid listens on (unset: the route to rank 0)"),
    INT("BRAID_NSOCKS", CORE, 0, 16, NULL,
        "TCP sockets per peer connection (`braid_config.nsocks`); unset or `0`: 1 over loopback, 2 across a "
        "network"),
    INT("BRAID_SPIN_US", CORE, 0, 100000, "50",
        "tcp, shm: microseconds a wait keeps retrying (yielding the CPU) before it sleeps in `poll()`; `0` "
        "sleeps at once"),
    SIZE("BRAID_CHUNK_BYTES", CORE, 4096, GIB, "524288",
         "pipeline chunk of the ring algorithms (`braid_config.chunk_bytes`)"),
    CHOICE("BRAID_ALGO", CORE, "auto|ring|rd|recursive_doubling|hier|hierarchical", "auto",
           "all-reduce algorithm: `rd` is recursive doubling; `hier` is hierarchical (the ring, with a warning, "
           "on one host or one rank per host)"),
    BOOL("BRAID_CHECKSUM", CORE, "0",
         "every message between ranks carries a CRC32C that the receiver checks before using the data; a "
         "mismatch is `BRAID_ERR_CORRUPT` (`braid_config.checksum`: `1` on, `-1` off, `0` this variable). Must "
         "be alike on every rank, else `braid_pg_init` fails with `BRAID_ERR_MISMATCH`"),
    STR("BRAID_JOB_SECRET", CORE, NULL,
        "32 hex digits: the job secret for `braid_pg_init_env` (unset: derived, see below)"),
    STR("BRAID_KEY_FILE", CORE, NULL,
        "per-user key the job secret of `braid_pg_init_env` derives from when `BRAID_JOB_SECRET` is unset: 64 "
        "hex digits, mode 0600, made on first use; must be the same file on every host (a shared home, or a "
        "copy). Unset: `~/.config/braid/job.key`; `none`: derive from public values only (every rank warns)"),
    INT("BRAID_STORE_PORT", CORE, 1, 65535, NULL,
        "port of braid's rendezvous store for `braid_pg_init_env` (unset: `MASTER_PORT` + 1)"),
    STR("BRAID_STORE_ADDR", CORE, NULL,
        "`host:port` put into ids made by `braid_unique_id` (unset: `127.0.0.1` or the `BRAID_SOCKET_IFNAME` "
        "address, on a free port)"),

    STR("BRAID_IB_HCA", VERBS, NULL, "`name[:port]`, comma-separated, e.g. `mlx5_0:1,mlx5_1` (unset: the first "
                                     "device with an active port)"),
    INT("BRAID_IB_GID_INDEX", VERBS, 0, 65535, NULL,
        "GID table index; on InfiniBand also turns on the GRH (unset: the best RoCE v2 entry)"),
    INT("BRAID_IB_TC", VERBS, 0, 255, "0", "traffic class (GRH): DSCP << 2 on RoCE"),
    INT("BRAID_IB_SL", VERBS, 0, 15, "0", "service level"),
    INT("BRAID_IB_TIMEOUT", VERBS, 1, 31, "18", "local ACK timeout, 4.096 us * 2^n (18 is about 1 s)"),
    INT("BRAID_IB_RETRY_CNT", VERBS, 0, 7, "7", "transport retries before an error completion"),
    INT("BRAID_IB_SLOTS", VERBS, 1, 256, "32", "receive ring slots per connection"),
    SIZE("BRAID_IB_SLOT_BYTES", VERBS, 4096, MIB, "131072", "bytes per slot (= chunk size)"),
    SIZE("BRAID_IB_ZCOPY_BYTES", VERBS, 0, GIB, "65536", "smallest send that tries zero copy; `0` disables it"),
    BOOL("BRAID_IB_REGCACHE", VERBS, "0", "register large send buffers on demand (docs/TRANSPORTS.md)"),
    INT("BRAID_IB_REGCACHE_MAX", VERBS, 1, 1 << 20, "256", "cached registrations kept"),
    SIZE("BRAID_IB_REGCACHE_BYTES", VERBS, MIB, 1LL << 50, "8G", "cached registered bytes kept"),

    INT("RANK", LAUNCHER, 0, BRAID_MAX_RANKS - 1, NULL, "this rank (torchrun); with `WORLD_SIZE`"),
    INT("WORLD_SIZE", LAUNCHER, 1, BRAID_MAX_RANKS, NULL, "number of ranks (torchrun)"),
    INT("OMPI_COMM_WORLD_RANK", LAUNCHER, 0, BRAID_MAX_RANKS - 1, NULL, "this rank (Open MPI)"),
    INT("OMPI_COMM_WORLD_SIZE", LAUNCHER, 1, BRAID_MAX_RANKS, NULL, "number of ranks (Open MPI)"),
    INT("PMI_RANK", LAUNCHER, 0, BRAID_MAX_RANKS - 1, NULL, "this rank (PMI)"),
    INT("PMI_SIZE", LAUNCHER, 1, BRAID_MAX_RANKS, NULL, "number of ranks (PMI)"),
    INT("SLURM_PROCID", LAUNCHER, 0, BRAID_MAX_RANKS - 1, NULL, "this rank (Slurm)"),
    INT("SLURM_NTASKS", LAUNCHER, 1, BRAID_MAX_RANKS, NULL, "number of ranks (Slurm)"),
    INT("LOCAL_RANK", LAUNCHER, 0, BRAID_MAX_RANKS - 1, NULL, "rank among this host's ranks (torchrun)"),
    INT("OMPI_COMM_WORLD_LOCAL_RANK", LAUNCHER, 0, BRAID_MAX_RANKS - 1, NULL, "rank on this host (Open MPI)"),
    INT("SLURM_LOCALID", LAUNCHER, 0, BRAID_MAX_RANKS - 1, NULL, "rank on this host (Slurm)"),
    STR("MASTER_ADDR", LAUNCHER, NULL, "rank 0's host (all launchers)"),
    INT("MASTER_PORT", LAUNCHER, 1, 65534, "29500", "the launcher's store port; braid's store uses the next one"),
    STR("HOME", LAUNCHER, NULL, "the user's home: where the key file is kept unless `BRAID_KEY_FILE` says otherwise"),
    STR("TORCHELASTIC_RUN_ID", LAUNCHER, NULL, "job id mixed into the derived secret (torchrun)"),
    STR("SLURM_JOB_ID", LAUNCHER, NULL, "job id mixed into the derived secret (Slurm)"),
    STR("OMPI_MCA_ess_base_jobid", LAUNCHER, NULL, "job id mixed into the derived secret (Open MPI)"),
    STR("PMIX_NAMESPACE", LAUNCHER, NULL, "job id mixed into the derived secret (PMIx)"),
    STR("NCCL_DEBUG", LAUNCHER, NULL, "NCCL drop-in (`libnccl.so.2`): `WARN`, `INFO` or `TRACE` prints each error "
                                      "the shim returns (docs/NCCL_COMPAT.md)"),
    INT("NCCL_COMM_BLOCKING", LAUNCHER, LLONG_MIN, LLONG_MAX, NULL,
        "NCCL drop-in: `1` makes every communicator blocking, `0` nonblocking, whatever `ncclConfig_t.blocking` "
        "says (read at each communicator creation, split and shrink, as NCCL 2.28 does); other integers are "
        "ignored"),

    INT("BRAID_TEST_CORRUPT_CHUNK", TEST, 0, LLONG_MAX, "0",
        "flip one bit of the K-th non-empty message this process sends with checksums on (docs/RELIABILITY.md)"),
    STR("BRAID_TEST_EXIT_IN_INIT", TEST, NULL,
        "`joined`: the process exits at once after the rendezvous of `braid_pg_init`, a rank that dies while the "
        "group forms"),
    STR("CUDA_FAKE_DIRECT", TEST, NULL,
        "builds against tests/cuda_fake.c: `1` treats every connection as one that moves device memory itself"),
};
const size_t braid__param_count = sizeof(braid__params) / sizeof(braid__params[0]);

const braid_param_info *braid__param_find(const char *name)
{
    for (size_t i = 0; i < braid__param_count; i++)
        if (strcmp(braid__params[i].name, name) == 0)
            return &braid__params[i];
    return NULL;
}

const char *braid__param_str(const char *name)
{
    const char *v = getenv(name);
    return (v && *v) ? v : NULL;
}

long braid__param_decimal(const char *text, char **end)
{
    const char *p = text;
    int neg = *p == '-';
    if (neg)
        p++;
    if (*p < '0' || *p > '9') {
        *end = (char *)text;
        errno = EINVAL;
        return 0;
    }
    unsigned long v = 0, limit = neg ? (unsigned long)LONG_MAX + 1 : (unsigned long)LONG_MAX;
    int overflow = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        unsigned d = (unsigned)(*p - '0');
        if (v > (limit - d) / 10)
            overflow = 1;
        else
            v = v * 10 + d;
    }
    *end = (char *)p;
    if (overflow) {
        errno = ERANGE;
        return neg ? LONG_MIN : LONG_MAX;
    }
    errno = 0;
    return neg ? (long)(0 - v) : (long)v;
}

static int word_in(const char *word, const char *list, long long *index)
{
    size_t n = strlen(word);
    long long i = 0;
    for (const char *p = list; *p; i++) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && strncasecmp(p, word, n) == 0) {
            *index = i;
            return 1;
        }
        p += len + (bar != NULL);
    }
    return 0;
}

/* Every comma-separated entry of text one of choices (empty entries are
 * skipped): 1, else 0 with why said. */
static int list_in(const char *text, const char *choices, char *why, size_t cap)
{
    for (const char *p = text; *p;) {
        size_t len = strcspn(p, ",");
        char word[64];
        long long index;
        int ok = len < sizeof(word);
        if (ok && len) {
            memcpy(word, p, len);
            word[len] = '\0';
            ok = word_in(word, choices, &index);
        }
        if (!ok) {
            snprintf(why, cap, "unknown entry '%.*s' (each one of %s)", (int)(len < 40 ? len : 40), p, choices);
            return 0;
        }
        p += len + (p[len] == ',');
    }
    return 1;
}

/* Parse text as p's value: 1 with *out set, else 0 with why said. */
static int parse_value(const braid_param_info *p, const char *text, long long *out, char *why, size_t cap)
{
    switch (p->kind) {
    case BRAID_PARAM_STR:
        *out = 0;
        return 1;
    case BRAID_PARAM_LIST:
        *out = 0;
        return list_in(text, p->choices, why, cap);
    case BRAID_PARAM_CHOICE:
        if (word_in(text, p->choices, out))
            return 1;
        snprintf(why, cap, "not one of %s", p->choices);
        return 0;
    case BRAID_PARAM_BOOL:
        if (word_in(text, "0|no|false|off", out)) {
            *out = 0;
            return 1;
        }
        if (word_in(text, "1|yes|true|on", out)) {
            *out = 1;
            return 1;
        }
        snprintf(why, cap, "not a boolean (1/0, yes/no, true/false, on/off)");
        return 0;
    case BRAID_PARAM_INT:
    case BRAID_PARAM_SIZE:
        break;
    }
    char *end;
    long long v = braid__param_decimal(text, &end);
    if (errno == EINVAL) {
        snprintf(why, cap, "not a decimal integer");
        return 0;
    }
    int overflow = errno == ERANGE;
    if (!overflow && p->kind == BRAID_PARAM_SIZE && *end) {
        int shift = 0;
        switch (*end) {
        case 'k': case 'K': shift = 10; break;
        case 'm': case 'M': shift = 20; break;
        case 'g': case 'G': shift = 30; break;
        default: break;
        }
        if (shift) {
            end++;
            if (v > (LLONG_MAX >> shift) || v < -(LLONG_MAX >> shift))
                overflow = 1;
            else
                v *= 1LL << shift;
        }
    }
    if (*end) {
        snprintf(why, cap, "%s", p->kind == BRAID_PARAM_SIZE ? "not a decimal integer with an optional K, M or G "
                                                               "suffix"
                                                             : "not a decimal integer");
        return 0;
    }
    if (overflow || v < p->min || v > p->max) {
        snprintf(why, cap, "%sout of range [%lld, %lld]", overflow ? "overflows; " : "", p->min, p->max);
        return 0;
    }
    *out = v;
    return 1;
}

braid_status braid__param_parse(const braid_param_info *p, const char *text, long long *out)
{
    char why[160];
    if (parse_value(p, text, out, why, sizeof(why)))
        return BRAID_OK;
    return braid__error_quiet(BRAID_ERR_INVALID_ARG, "%s=%s: %s", p->name, text, why);
}

/* Levenshtein distance of two short names. */
static size_t edits(const char *a, const char *b)
{
    size_t n = strlen(b), row[80];
    if (n >= sizeof(row) / sizeof(row[0]) || strlen(a) >= sizeof(row) / sizeof(row[0]))
        return (size_t)-1;
    for (size_t j = 0; j <= n; j++)
        row[j] = j;
    for (size_t i = 1; a[i - 1]; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= n; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (row[j] + 1 < best)
                best = row[j] + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[n];
}

const char *braid__param_nearest(const char *name)
{
    const char *best = NULL;
    size_t best_d = 4; /* more edits than this is no misspelling */
    for (size_t i = 0; i < braid__param_count; i++) {
        const char *known = braid__params[i].name;
        size_t d = edits(name, known);
        /* A missing suffix (BRAID_TIMEOUT for BRAID_TIMEOUT_MS) counts as one edit. */
        if (strncmp(known, name, strlen(name)) == 0 && strlen(name) >= 8)
            d = 1;
        if (d < best_d) {
            best_d = d;
            best = known;
        }
    }
    return best;
}

/* BRAID_* names that braid's tools read, not the library: the Python
 * package (BRAID_LIBRARY), the benchmark scripts and the test suites. */
static const char *const tool_names[] = {"BRAID_LIBRARY",      "BRAID_PYTHONPATH", "BRAID_BENCH",
                                         "BRAID_BENCH_VERBOSE", "BRAID_ANCHORS",    "BRAID_FAULT_SEED",
                                         "BRAID_FAULT_TRIALS",  "BRAID_NETNS_SEED", "BRAID_TEST_TSAN"};

int braid__param_tool_name(const char *name)
{
    for (size_t i = 0; i < sizeof(tool_names) / sizeof(tool_names[0]); i++)
        if (strcmp(tool_names[i], name) == 0)
            return 1;
    return 0;
}

/* One WARN per BRAID_* variable braid does not read, once per process:
 * a misspelt knob would otherwise be dropped without a word. */
static void warn_unknown(void)
{
    static atomic_int warned;
    extern char **environ;
    if (atomic_exchange(&warned, 1) || !environ)
        return;
    for (char **e = environ; *e; e++) {
        const char *eq = strchr(*e, '=');
        char name[80];
        size_t len = eq ? (size_t)(eq - *e) : strlen(*e);
        if (strncmp(*e, "BRAID_", 6) != 0 || len >= sizeof(name))
            continue;
        memcpy(name, *e, len);
        name[len] = '\0';
        if (braid__param_find(name) || braid__param_tool_name(name))
            continue;
        const char *near = braid__param_nearest(name);
        BRAID_WARN("%s is not a braid variable: ignored%s%s%s (docs/CONFIG.md lists them)", name,
                   near ? " (did you mean " : "", near ? near : "", near ? "?)" : "");
    }
}

braid_status braid__params_check(int launcher)
{
    warn_unknown();
    char text[1024] = "";
    size_t len = 0;
    int nbad = 0;
    for (size_t i = 0; i < braid__param_count; i++) {
        const braid_param_info *p = &braid__params[i];
        if (p->section == BRAID_PARAM_TEST || (p->section == BRAID_PARAM_LAUNCHER && !launcher))
            continue;
        const char *v = braid__param_str(p->name);
        long long x;
        char why[160];
        if (!v || parse_value(p, v, &x, why, sizeof(why)))
            continue;
        nbad++;
        if (len < sizeof(text))
            len += (size_t)snprintf(text + len, sizeof(text) - len, "%s%s=%s: %s", len ? "; " : "", p->name, v,
                                    why);
    }
    if (!nbad)
        return BRAID_OK;
    return braid__error(BRAID_ERR_INVALID_ARG, "%d invalid environment variable%s (docs/CONFIG.md): %s", nbad,
                        nbad > 1 ? "s" : "", text);
}

long long braid__param_int(const char *name, long long def)
{
    const char *v = braid__param_str(name);
    if (!v)
        return def;
    static const braid_param_info unlisted = {"(unlisted)", BRAID_PARAM_INT, BRAID_PARAM_CORE, LLONG_MIN, LLONG_MAX,
                                              NULL, NULL, ""};
    const braid_param_info *p = braid__param_find(name);
    braid_param_info any;
    if (!p) {
        /* tests/test_params.c keeps the sources from reading unlisted names */
        any = unlisted;
        any.name = name;
        p = &any;
    }
    long long x;
    char why[160];
    if (!parse_value(p, v, &x, why, sizeof(why))) {
        BRAID_WARN("ignoring %s=%s: %s", name, v, why);
        return def;
    }
    return x;
}

int braid__param_bool(const char *name, int def)
{
    return braid__param_int(name, def) != 0;
}

int braid__spin_us(void)
{
    static _Atomic int cached = -1;
    int v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v < 0) {
        long long x = braid__param_int("BRAID_SPIN_US", 50);
        v = x < 0 ? 0 : x > 100000 ? 100000 : (int)x;
        atomic_store_explicit(&cached, v, memory_order_relaxed);
    }
    return v;
}
