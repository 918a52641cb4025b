/* The parameter table (src/base/param.c) as the single source of truth: strict
 * parsing of integers, sizes, booleans and choices; every bad variable
 * failing group creation at once; the same rank limit in braid_pg_init and
 * braid_pg_init_env; docs/CONFIG.md's tables equal to the table's
 * rendering; and no library source reading an environment variable the
 * table lacks (or the table listing one nothing reads).
 *
 * `test_params --markdown` prints the rendered tables (scripts/config-doc). */
#include <check.h>
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bootstrap/bootstrap.h"
#include "braid.h"
#include "param.h"

#define BEGIN_MARK "<!-- params:begin -->\n"
#define END_MARK "<!-- params:end -->\n"

static const char *source_root(void)
{
    const char *r = getenv("BRAID_SOURCE_ROOT");
    return r ? r : ".";
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    if (buf)
        buf[n] = '\0';
    fclose(f);
    return buf;
}

static long long parse_ok(const char *name, const char *text)
{
    const braid_param_info *p = braid__param_find(name);
    ck_assert_ptr_nonnull(p);
    long long v = -12345;
    braid_status st = braid__param_parse(p, text, &v);
    ck_assert_msg(st == BRAID_OK, "%s=%s refused: %s", name, text, braid_last_error());
    return v;
}

static void parse_bad(const char *name, const char *text, const char *why)
{
    const braid_param_info *p = braid__param_find(name);
    ck_assert_ptr_nonnull(p);
    long long v;
    ck_assert_msg(braid__param_parse(p, text, &v) == BRAID_ERR_INVALID_ARG, "%s=%s accepted", name, text);
    ck_assert_msg(strstr(braid_last_error(), name) && strstr(braid_last_error(), why),
                  "%s=%s: \"%s\" lacks \"%s\"", name, text, braid_last_error(), why);
}

START_TEST(test_integers)
{
    ck_assert_int_eq(parse_ok("BRAID_TIMEOUT_MS", "2000"), 2000);
    ck_assert_int_eq(parse_ok("BRAID_TIMEOUT_MS", "02000"), 2000); /* decimal, not octal 1024 */
    ck_assert_int_eq(parse_ok("BRAID_TIMEOUT_MS", "86400000"), 86400000);
    parse_bad("BRAID_TIMEOUT_MS", "86400001", "out of range [1, 86400000]");
    parse_bad("BRAID_TIMEOUT_MS", "0", "out of range");
    parse_bad("BRAID_TIMEOUT_MS", "0x10", "not a decimal integer");
    parse_bad("BRAID_TIMEOUT_MS", " 5", "not a decimal integer");
    parse_bad("BRAID_TIMEOUT_MS", "+5", "not a decimal integer");
    parse_bad("BRAID_TIMEOUT_MS", "5 ", "not a decimal integer");
    parse_bad("BRAID_TIMEOUT_MS", "5k", "not a decimal integer"); /* no suffix on a time */
    parse_bad("BRAID_TIMEOUT_MS", "18014398509481986k", "not a decimal integer");
    parse_bad("BRAID_TIMEOUT_MS", "99999999999999999999", "overflows");
    parse_bad("BRAID_NSOCKS", "-1", "out of range [0, 16]");
    parse_bad("BRAID_NSOCKS", "17", "out of range [0, 16]");
    ck_assert_int_eq(parse_ok("BRAID_NSOCKS", "0"), 0);
    ck_assert_int_eq(parse_ok("BRAID_TEST_CORRUPT_CHUNK", "9223372036854775807"), LLONG_MAX);
    parse_bad("BRAID_TEST_CORRUPT_CHUNK", "9223372036854775808", "overflows");
}
END_TEST

START_TEST(test_sizes)
{
    ck_assert_int_eq(parse_ok("BRAID_CHUNK_BYTES", "4096"), 4096);
    ck_assert_int_eq(parse_ok("BRAID_CHUNK_BYTES", "64k"), 65536);
    ck_assert_int_eq(parse_ok("BRAID_CHUNK_BYTES", "2M"), 2 << 20);
    ck_assert_int_eq(parse_ok("BRAID_CHUNK_BYTES", "1G"), 1 << 30);
    ck_assert_int_eq(parse_ok("BRAID_IB_REGCACHE_BYTES", "8G"), 8LL << 30);
    parse_bad("BRAID_CHUNK_BYTES", "2G", "out of range");
    parse_bad("BRAID_CHUNK_BYTES", "18014398509481986k", "overflows"); /* used to wrap to 2048 */
    parse_bad("BRAID_IB_REGCACHE_BYTES", "9007199254740992G", "overflows");
    parse_bad("BRAID_CHUNK_BYTES", "64kb", "K, M or G suffix");
    parse_bad("BRAID_CHUNK_BYTES", "k", "not a decimal integer");
    parse_bad("BRAID_CHUNK_BYTES", "64T", "K, M or G suffix");
}
END_TEST

START_TEST(test_booleans_and_choices)
{
    const char *yes[] = {"1", "yes", "YES", "true", "True", "on", "ON"};
    const char *no[] = {"0", "no", "No", "false", "FALSE", "off", "Off"};
    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
        ck_assert_int_eq(parse_ok("BRAID_CHECKSUM", yes[i]), 1);
        ck_assert_int_eq(parse_ok("BRAID_CHECKSUM", no[i]), 0);
    }
    parse_bad("BRAID_CHECKSUM", "maybe", "not a boolean");
    parse_bad("BRAID_CHECKSUM", "2", "not a boolean");
    parse_bad("BRAID_CHECKSUM", "yess", "not a boolean");
    setenv("BRAID_CHECKSUM", "yes", 1); /* used to be ignored with a warning */
    ck_assert_int_eq(braid__param_bool("BRAID_CHECKSUM", 0), 1);
    setenv("BRAID_CHECKSUM", "off", 1);
    ck_assert_int_eq(braid__param_bool("BRAID_CHECKSUM", 1), 0);
    unsetenv("BRAID_CHECKSUM");
    ck_assert_int_eq(braid__param_bool("BRAID_CHECKSUM", 1), 1);

    parse_ok("BRAID_ALGO", "ring");
    parse_ok("BRAID_ALGO", "HIER");
    parse_ok("BRAID_DEBUG", "info");
    parse_bad("BRAID_ALGO", "fast", "not one of auto|ring|rd|recursive_doubling|hier|hierarchical");
    parse_bad("BRAID_DEBUG", "LOUD", "not one of");

    /* BRAID_TRANSPORT: every entry a transport braid has. */
    parse_ok("BRAID_TRANSPORT", "tcp");
    parse_ok("BRAID_TRANSPORT", "shm,tcp");
    parse_ok("BRAID_TRANSPORT", "verbs,TCP,cuda_ipc");
    parse_bad("BRAID_TRANSPORT", "tcp,tpc", "unknown entry 'tpc' (each one of tcp|shm|verbs|cuda_ipc)");
    parse_bad("BRAID_TRANSPORT", "infiniband", "unknown entry 'infiniband'");
}
END_TEST

static void clear_env(void);

/* Misspelt variables are named with the nearest known one; BRAID_* names
 * braid's tools read are not "unknown". */
START_TEST(test_unknown_variables_warn)
{
    ck_assert_str_eq(braid__param_nearest("BRAID_TIMEOUT"), "BRAID_TIMEOUT_MS");
    ck_assert_str_eq(braid__param_nearest("BRAID_NSOCK"), "BRAID_NSOCKS");
    ck_assert_str_eq(braid__param_nearest("BRAID_CHEKSUM"), "BRAID_CHECKSUM");
    ck_assert_ptr_null(braid__param_nearest("BRAID_SOMETHING_ELSE_ENTIRELY"));

    char log[] = "/tmp/braid-params-log.XXXXXX";
    int fd = mkstemp(log);
    ck_assert_int_ge(fd, 0);
    close(fd);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) { /* a fresh process: the warning comes once per process, at its first check */
        clear_env();
        setenv("BRAID_DEBUG", "WARN", 1);
        setenv("BRAID_DEBUG_FILE", log, 1);
        setenv("BRAID_TIMEOUT", "5000", 1);
        setenv("BRAID_NSOCK", "4", 1);
        setenv("BRAID_LIBRARY", "/opt/libbraid.so", 1);
        braid_status first = braid__params_check(0), second = braid__params_check(0);
        _exit(first == BRAID_OK && second == BRAID_OK ? 0 : 1);
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "unknown variables failed the check");
    FILE *f = fopen(log, "r");
    ck_assert_ptr_nonnull(f);
    char text[4096] = "";
    size_t n = fread(text, 1, sizeof(text) - 1, f);
    text[n] = '\0';
    fclose(f);
    unlink(log);
    ck_assert_msg(strstr(text, "BRAID_TIMEOUT is not a braid variable: ignored (did you mean BRAID_TIMEOUT_MS?)"),
                  "log: %s", text);
    ck_assert_msg(strstr(text, "BRAID_NSOCK is not a braid variable: ignored (did you mean BRAID_NSOCKS?)"), "log: %s",
                  text);
    ck_assert_msg(!strstr(text, "BRAID_LIBRARY"), "a tool's variable was called unknown: %s", text);
    const char *second = strstr(text, "BRAID_NSOCK is not");
    ck_assert_msg(second && !strstr(second + 1, "BRAID_NSOCK is not"), "warned twice: %s", text);
}
END_TEST

static void clear_env(void)
{
    for (size_t i = 0; i < braid__param_count; i++)
        if (strncmp(braid__params[i].name, "BRAID_DEBUG", strlen("BRAID_DEBUG")) != 0) /* keep the test quiet */
            unsetenv(braid__params[i].name);
}

/* Every bad variable in one error, and group creation refuses them at
 * once (no rendezvous, no waiting). */
START_TEST(test_bad_env_fails_init)
{
    clear_env();
    setenv("BRAID_TIMEOUT_MS", "02x", 1);
    setenv("BRAID_CHECKSUM", "maybe", 1);
    setenv("BRAID_IB_SLOTS", "1000", 1);
    setenv("BRAID_TRANSPORT", "tcp,tpc", 1);
    setenv("BRAID_TEST_CORRUPT_CHUNK", "x", 1); /* test hooks are not checked up front */
    ck_assert_int_eq(braid__params_check(0), BRAID_ERR_INVALID_ARG);
    const char *e = braid_last_error();
    ck_assert_msg(strstr(e, "4 invalid environment variables") && strstr(e, "BRAID_TIMEOUT_MS=02x") &&
                      strstr(e, "BRAID_CHECKSUM=maybe") && strstr(e, "BRAID_IB_SLOTS=1000") &&
                      strstr(e, "BRAID_TRANSPORT=tcp,tpc: unknown entry 'tpc'") && !strstr(e, "BRAID_TEST_CORRUPT_CHUNK"),
                  "error text: %s", e);

    braid_unique_id_t id;
    ck_assert_int_eq(braid_unique_id(&id), BRAID_OK);
    braid_pg *pg = NULL;
    ck_assert_int_eq(braid_pg_init(&pg, 0, 1, &id, NULL), BRAID_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(braid_last_error(), "BRAID_CHECKSUM=maybe"));
    ck_assert_ptr_null(pg);
    clear_env();
    ck_assert_int_eq(braid__params_check(1), BRAID_OK);

    /* A config's transport list is held to the same names. */
    braid_config cfg = BRAID_CONFIG_INIT;
    cfg.transports = "tcp,tpc";
    ck_assert_int_eq(braid_pg_init(&pg, 0, 1, &id, &cfg), BRAID_ERR_INVALID_ARG);
    ck_assert_msg(strstr(braid_last_error(), "unknown entry 'tpc'"), "error text: %s", braid_last_error());
    ck_assert_ptr_null(pg);
}
END_TEST

/* WORLD_SIZE and braid_pg_init's size share BRAID_MAX_RANKS: 100000 used
 * to pass braid_pg_init_env and then fail in braid_pg_init. */
START_TEST(test_rank_limit_everywhere)
{
    clear_env();
    setenv("RANK", "0", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", "29500", 1);
    setenv("WORLD_SIZE", "100000", 1);
    braid_pg *pg = NULL;
    ck_assert_int_eq(braid_pg_init_env(&pg, NULL), BRAID_ERR_INVALID_ARG);
    ck_assert_msg(strstr(braid_last_error(), "WORLD_SIZE=100000"), "%s", braid_last_error());
    braid_unique_id_t id;
    ck_assert_int_eq(braid_unique_id(&id), BRAID_OK);
    ck_assert_int_eq(braid_pg_init(&pg, 0, 100000, &id, NULL), BRAID_ERR_INVALID_ARG);

    /* The largest size passes both checks (the rendezvous is not reached). */
    char max[16];
    snprintf(max, sizeof(max), "%d", BRAID_MAX_RANKS);
    setenv("WORLD_SIZE", max, 1);
    ck_assert_int_eq(braid__params_check(1), BRAID_OK);
    int rank, size;
    braid_rendezvous rv;
    ck_assert_int_eq(braid__env_rendezvous(&rank, &size, &rv), BRAID_OK);
    ck_assert_int_eq(size, BRAID_MAX_RANKS);
    snprintf(max, sizeof(max), "%d", BRAID_MAX_RANKS + 1);
    setenv("WORLD_SIZE", max, 1);
    ck_assert_int_eq(braid__env_rendezvous(&rank, &size, &rv), BRAID_ERR_INVALID_ARG);
    setenv("WORLD_SIZE", "04", 1); /* decimal here too */
    ck_assert_int_eq(braid__env_rendezvous(&rank, &size, &rv), BRAID_OK);
    ck_assert_int_eq(size, 4);
    setenv("WORLD_SIZE", "+4", 1);
    ck_assert_int_eq(braid__env_rendezvous(&rank, &size, &rv), BRAID_ERR_INVALID_ARG);
    clear_env();
}
END_TEST

/* ---- docs/CONFIG.md -------------------------------------------------------- */

static char *render(void)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ck_assert_ptr_nonnull(f);
    braid__params_markdown(f);
    fclose(f);
    return buf;
}

START_TEST(test_config_doc_matches)
{
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/docs/CONFIG.md", source_root());
    char *doc = read_file(path);
    ck_assert_msg(doc != NULL, "cannot read %s", path);
    char *b = strstr(doc, BEGIN_MARK), *e = b ? strstr(b, END_MARK) : NULL;
    ck_assert_msg(b && e, "%s has no %s ... %s block", path, BEGIN_MARK, END_MARK);
    b += strlen(BEGIN_MARK);
    *e = '\0';
    char *want = render();
    ck_assert_msg(strcmp(b, want) == 0,
                  "docs/CONFIG.md's parameter tables differ from src/base/param.c: run scripts/config-doc");
    free(want);
    free(doc);
}
END_TEST

/* ---- sources ----------------------------------------------------------------- */

typedef struct {
    char problems[4096];
    size_t len;
    int nproblems;
    unsigned char *seen; /* [braid__param_count]: the name occurs as a literal */
} scan_state;

static void problem(scan_state *s, const char *file, const char *what, const char *name)
{
    s->nproblems++;
    if (s->len < sizeof(s->problems))
        s->len += (size_t)snprintf(s->problems + s->len, sizeof(s->problems) - s->len, "\n  %s: %s %s", file,
                                   what, name);
}

/* Calls that read the environment by a literal name. */
static const char *const readers[] = {"getenv(", "braid__param_int(", "braid__param_str(", "braid__param_bool(",
                                      "knob(", NULL};

/* Literal names that look like variables of the launchers or of braid.
 * Arrays of names (launcher rank/size/job id lists) are read in a loop, so
 * every such literal in the library must be in the table. */
static int looks_like_env(const char *lit, size_t n)
{
    static const char *const prefixes[] = {"BRAID_", "NCCL_", "OMPI_", "PMI_", "PMIX_", "SLURM_", "TORCHELASTIC_",
                                           "MASTER_", "CUDA_FAKE_", NULL};
    static const char *const exact[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", NULL};
    for (size_t i = 0; i < n; i++)
        if (!((lit[i] >= 'A' && lit[i] <= 'Z') || (lit[i] >= 'a' && lit[i] <= 'z') ||
              (lit[i] >= '0' && lit[i] <= '9') || lit[i] == '_'))
            return 0;
    for (const char *const *p = exact; *p; p++)
        if (strlen(*p) == n && !strncmp(*p, lit, n))
            return 1;
    for (const char *const *p = prefixes; *p; p++)
        if (n > strlen(*p) && !strncmp(*p, lit, strlen(*p)))
            return 1;
    return 0;
}

/* Names that look like variables but are not read from the environment. */
static int known_not_env(const char *name)
{
    /* status names (status.c), and the variables of braid's tools that the
     * library names only to leave them out of its unknown-variable warning */
    return !strcmp(name, "BRAID_OK") || !strncmp(name, "BRAID_ERR_", strlen("BRAID_ERR_")) ||
           braid__param_tool_name(name);
}

static void check_name(scan_state *s, const char *file, const char *name, const char *how)
{
    const braid_param_info *p = braid__param_find(name);
    if (p)
        s->seen[p - braid__params] = 1;
    else if (!known_not_env(name))
        problem(s, file, how, name);
}

static void scan_text(scan_state *s, const char *file, const char *text, int may_read_computed)
{
    for (const char *const *r = readers; *r; r++) {
        for (const char *p = strstr(text, *r); p; p = strstr(p + 1, *r)) {
            /* a whole identifier: not braid__getenv( or the like */
            if (p > text && (p[-1] == '_' || (p[-1] >= 'a' && p[-1] <= 'z') || (p[-1] >= 'A' && p[-1] <= 'Z')) &&
                strcmp(*r, "getenv(") == 0 && !(p >= text + 7 && !strncmp(p - 7, "secure_", 7)))
                continue;
            const char *a = p + strlen(*r);
            if (*a != '"') {
                if (strcmp(*r, "getenv(") == 0 && !may_read_computed)
                    problem(s, file, "getenv() of a computed name (only src/base/param.c may):", "");
                continue;
            }
            const char *end = strchr(a + 1, '"');
            if (!end)
                continue;
            char name[128];
            snprintf(name, sizeof(name), "%.*s", (int)(end - a - 1), a + 1);
            check_name(s, file, name, "reads a variable missing from src/base/param.c's table:");
        }
    }
    /* Every literal that looks like a variable name. */
    for (const char *q = strchr(text, '"'); q; q = strchr(q + 1, '"')) {
        if (q > text && (q[-1] == '\\' || q[-1] == '\''))
            continue;
        const char *end = strchr(q + 1, '"');
        if (!end)
            break;
        size_t n = (size_t)(end - q - 1);
        int read_above = 0; /* the argument of a reader, checked above */
        for (const char *const *r = readers; *r; r++)
            read_above |= (size_t)(q - text) >= strlen(*r) && !strncmp(q - strlen(*r), *r, strlen(*r));
        if (n > 0 && n < 128 && !read_above && looks_like_env(q + 1, n)) {
            char name[128];
            snprintf(name, sizeof(name), "%.*s", (int)n, q + 1);
            check_name(s, file, name, "names a variable missing from src/base/param.c's table:");
        }
        q = end;
    }
}

static void scan_dir(scan_state *s, const char *root, const char *rel)
{
    char path[2 * PATH_MAX + 2];
    snprintf(path, sizeof(path), "%s/%s", root, rel);
    DIR *d = opendir(path);
    if (!d)
        return;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        char sub[PATH_MAX + 258];
        snprintf(sub, sizeof(sub), "%s/%s", rel, e->d_name);
        snprintf(path, sizeof(path), "%s/%s", root, sub);
        struct stat st;
        if (stat(path, &st) != 0)
            continue;
        if (S_ISDIR(st.st_mode)) {
            scan_dir(s, root, sub);
            continue;
        }
        const char *dot = strrchr(e->d_name, '.');
        if (!dot || (strcmp(dot, ".c") && strcmp(dot, ".h") && strcmp(dot, ".cu")))
            continue;
        char *text = read_file(path);
        if (!text)
            continue;
        scan_text(s, sub, text, strcmp(sub, "src/base/param.c") == 0);
        free(text);
    }
    closedir(d);
}

/* The scanner finds what it must (so a pass below means something). */
START_TEST(test_scanner_catches)
{
    scan_state s = {.seen = calloc(braid__param_count, 1)};
    scan_text(&s, "x.c", "const char *v = getenv(\"BRAID_NOT_A_PARAM\");", 0);
    ck_assert_int_eq(s.nproblems, 1);
    scan_text(&s, "x.c", "static const char *const v[] = {\"SLURM_SOMETHING\", NULL};", 0);
    ck_assert_int_eq(s.nproblems, 2);
    scan_text(&s, "x.c", "getenv(name)", 0);
    ck_assert_int_eq(s.nproblems, 3);
    scan_text(&s, "x.c", "braid__param_int(\"BRAID_TIMEOUT_MS\", 5); secure_getenv(\"BRAID_OOPS\");", 0);
    ck_assert_int_eq(s.nproblems, 4);
    ck_assert_int_eq(s.seen[braid__param_find("BRAID_TIMEOUT_MS") - braid__params], 1);
    scan_text(&s, "x.c", "return \"BRAID_ERR_PEER\";", 0);
    ck_assert_int_eq(s.nproblems, 4);
    free(s.seen);
}
END_TEST

START_TEST(test_sources_read_only_table_variables)
{
    scan_state s = {.seen = calloc(braid__param_count, 1)};
    const char *dirs[] = {"src", "transports", "cuda", "include"};
    for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++)
        scan_dir(&s, source_root(), dirs[i]);
    /* The reverse: nothing in the table that no source names. */
    for (size_t i = 0; i < braid__param_count; i++)
        if (!s.seen[i]) {
            char file[] = "src/base/param.c";
            problem(&s, file, "lists a variable no library source reads:", braid__params[i].name);
        }
    ck_assert_msg(s.nproblems == 0, "%d problems:%s", s.nproblems, s.problems);
    free(s.seen);
}
END_TEST

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--markdown") == 0) {
        braid__params_markdown(stdout);
        return 0;
    }
    Suite *su = suite_create("params");
    TCase *tc = tcase_create("params");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_integers);
    tcase_add_test(tc, test_sizes);
    tcase_add_test(tc, test_booleans_and_choices);
    tcase_add_test(tc, test_bad_env_fails_init);
    tcase_add_test(tc, test_unknown_variables_warn);
    tcase_add_test(tc, test_rank_limit_everywhere);
    tcase_add_test(tc, test_config_doc_matches);
    tcase_add_test(tc, test_scanner_catches);
    tcase_add_test(tc, test_sources_read_only_table_variables);
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
