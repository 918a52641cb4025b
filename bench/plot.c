/* --plot: bus bandwidth against message size, drawn by gnuplot.
 *
 * gnuplot is a run-time tool, not a build dependency: braid-bench writes a
 * script to its stdin. Each distinct (label, type, op) of the csv files is
 * one series, so runs appended to one csv with different --label values
 * land on one chart. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

#define MAX_SERIES 64

typedef struct {
    char label[128], type[16], op[16];
} series;

int bench_plot_available(void)
{
    const char *path = getenv("PATH");
    char dir[4096];
    if (!path)
        path = "/usr/bin:/bin";
    for (const char *p = path; *p;) {
        size_t n = strcspn(p, ":");
        snprintf(dir, sizeof(dir), "%.*s/gnuplot", (int)n, n ? p : ".");
        if (access(dir, X_OK) == 0)
            return 0;
        p += n;
        if (*p == ':')
            p++;
    }
    fprintf(stderr, "braid-bench: --plot needs gnuplot, which is not in PATH (Debian: apt-get install gnuplot-nox)\n");
    return -1;
}

/* Split one csv line in place into at most max fields. */
static int split(char *line, char **fields, int max)
{
    int n = 0;
    line[strcspn(line, "\r\n")] = '\0';
    for (char *p = line; n < max;) {
        fields[n++] = p;
        p = strchr(p, ',');
        if (!p)
            break;
        *p++ = '\0';
    }
    return n;
}

static int collect(const char *path, series *s, int *ns)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "braid-bench: cannot read %s: %s\n", path, strerror(errno));
        return -1;
    }
    char line[1024];
    char *fld[16];
    int lineno = 0;
    while (fgets(line, sizeof(line), f)) {
        if (lineno++ == 0)
            continue; /* header */
        if (split(line, fld, 16) < 15)
            continue;
        int found = 0;
        for (int i = 0; i < *ns && !found; i++)
            found = !strcmp(s[i].label, fld[14]) && !strcmp(s[i].type, fld[2]) && !strcmp(s[i].op, fld[3]);
        if (!found && *ns < MAX_SERIES) {
            snprintf(s[*ns].label, sizeof(s[*ns].label), "%s", fld[14]);
            snprintf(s[*ns].type, sizeof(s[*ns].type), "%s", fld[2]);
            snprintf(s[*ns].op, sizeof(s[*ns].op), "%s", fld[3]);
            (*ns)++;
        }
    }
    fclose(f);
    return 0;
}

/* gnuplot double-quoted string: escape backslash and quote. */
static void put_quoted(FILE *out, const char *s)
{
    fputc('"', out);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fputc('\\', out);
        fputc(*s, out);
    }
    fputc('"', out);
}

int bench_plot(const char *png_path, const char *const *csv_paths, int ncsv)
{
    series (*s)[MAX_SERIES] = calloc((size_t)ncsv, sizeof(*s));
    int *ns = calloc((size_t)ncsv, sizeof(*ns));
    int total = 0, types_vary = 0, ops_vary = 0;
    if (!s || !ns) {
        fprintf(stderr, "braid-bench: out of memory for the plot\n");
        goto err_free;
    }
    for (int k = 0; k < ncsv; k++) {
        if (collect(csv_paths[k], s[k], &ns[k]) != 0)
            goto err_free;
        for (int i = 0; i < ns[k]; i++) {
            types_vary |= strcmp(s[k][i].type, s[0][0].type) != 0;
            ops_vary |= strcmp(s[k][i].op, s[0][0].op) != 0;
        }
        total += ns[k];
    }
    if (total == 0) {
        fprintf(stderr, "braid-bench: nothing to plot (no rows in the csv)\n");
        goto err_free;
    }

    FILE *gp = popen("gnuplot", "w");
    if (!gp) {
        fprintf(stderr, "braid-bench: cannot run gnuplot: %s\n", strerror(errno));
        goto err_free;
    }
    fprintf(gp, "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) { set terminal pngcairo size 1000,600 } "
                "else { set terminal png size 1000,600 }\n");
    fprintf(gp, "set output ");
    put_quoted(gp, png_path);
    fprintf(gp, "\nset datafile separator ','\n"
                "set logscale x 2\nset format x '%%.0b %%BB'\nset grid\nset key top left\n"
                "set xlabel 'message size (bytes)'\nset ylabel 'bus bandwidth, out of place (GB/s)'\n"
                "set title 'braid-bench: busbw vs size'\nplot ");
    int first = 1;
    for (int k = 0; k < ncsv; k++) {
        for (int i = 0; i < ns[k]; i++) {
            const series *e = &s[k][i];
            char title[256];
            snprintf(title, sizeof(title), "%s%s%s%s%s", e->label, types_vary ? " " : "", types_vary ? e->type : "",
                     ops_vary ? " " : "", ops_vary ? e->op : "");
            if (!first)
                fprintf(gp, ", \\\n     ");
            first = 0;
            /* Rows of other series map to 1/0 (undefined) and are skipped. */
            put_quoted(gp, csv_paths[k]);
            fprintf(gp, " every ::1 using (strcol(15) eq ");
            put_quoted(gp, e->label);
            fprintf(gp, " && strcol(3) eq ");
            put_quoted(gp, e->type);
            fprintf(gp, " && strcol(4) eq ");
            put_quoted(gp, e->op);
            fprintf(gp, " ? $1 : 1/0):8 with linespoints title ");
            put_quoted(gp, title);
        }
    }
    fprintf(gp, "\n");
    int st = pclose(gp);
    free(s);
    free(ns);
    if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "braid-bench: gnuplot failed writing %s\n", png_path);
        return -1;
    }
    return 0;

err_free:
    free(s);
    free(ns);
    return -1;
}
