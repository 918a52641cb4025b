/* docs/CONFIG.md's tables, rendered from the parameter table (param.c):
 * scripts/config-doc writes them, tests/test_params.c checks them. */
#include <stdio.h>
#include <string.h>

#include "param.h"

static const char *const section_titles[BRAID_PARAM_SECTION_COUNT] = {
    [BRAID_PARAM_CORE] = "Library",
    [BRAID_PARAM_VERBS] = "RDMA verbs transport",
    [BRAID_PARAM_LAUNCHER] = "Launcher variables (read by `braid_pg_init_env` and the NCCL drop-in)",
    [BRAID_PARAM_TEST] = "Test hooks (not for production)",
};

static void print_size(FILE *out, long long v)
{
    static const char units[] = "KMG";
    int u = -1;
    while (u < 2 && v != 0 && v % 1024 == 0) {
        v /= 1024;
        u++;
    }
    if (u >= 0)
        fprintf(out, "%lld%c", v, units[u]);
    else
        fprintf(out, "%lld", v);
}

static void print_values(FILE *out, const braid_param_info *p)
{
    switch (p->kind) {
    case BRAID_PARAM_STR:
        fputs("text", out);
        break;
    case BRAID_PARAM_LIST:
        fputs("comma-separated, each of ", out);
        /* fall through */
    case BRAID_PARAM_CHOICE:
        for (const char *c = p->choices; *c;) {
            const char *bar = strchr(c, '|');
            size_t len = bar ? (size_t)(bar - c) : strlen(c);
            fprintf(out, "%s`%.*s`", c == p->choices ? "" : ", ", (int)len, c);
            c += len + (bar != NULL);
        }
        break;
    case BRAID_PARAM_BOOL:
        fputs("boolean", out);
        break;
    case BRAID_PARAM_INT:
        fprintf(out, "%lld..%lld", p->min, p->max);
        break;
    case BRAID_PARAM_SIZE:
        print_size(out, p->min);
        fputs("..", out);
        print_size(out, p->max);
        fputs(" (K, M, G)", out);
        break;
    }
}

void braid__params_markdown(FILE *out)
{
    fputs("<!-- Generated from src/base/param.c by scripts/config-doc; edit the table there. -->\n", out);
    for (int s = 0; s < BRAID_PARAM_SECTION_COUNT; s++) {
        fprintf(out, "\n### %s\n\n| variable | default | values | meaning |\n| --- | --- | --- | --- |\n",
                section_titles[s]);
        for (size_t i = 0; i < braid__param_count; i++) {
            const braid_param_info *p = &braid__params[i];
            if ((int)p->section != s)
                continue;
            fprintf(out, "| `%s` | ", p->name);
            if (p->default_value)
                fprintf(out, "`%s`", p->default_value);
            else
                fputs("unset", out);
            fputs(" | ", out);
            print_values(out, p);
            fprintf(out, " | %s |\n", p->help);
        }
    }
}
