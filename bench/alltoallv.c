/* alltoallv's traffic, as nccl-tests' alltoallv_perf makes it: each rank
 * sends a size's worth in total, more of it to ranks further away
 * (NCCL_TESTS_ALLTOALLV_SPREAD, 0 uniform .. 1 distance-weighted, default
 * 1), or the bytes of a matrix file (NCCL_TESTS_ALLTOALLV_MATRIX_FILE, cell
 * [i][j] = bytes from rank i to rank j, scaled by
 * NCCL_TESTS_ALLTOALLV_MATRIX_SCALE). Every amount is rounded down to 16
 * bytes. Read once per process, before the first rank runs. */
#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

static double spread = 1.0;
static double scale = 1.0;
static size_t *matrix; /* dim x dim bytes, or NULL: the generated pattern */
static int dim;

/* A number from the environment, clamped to [lo, hi]; unparsable: keep. */
static void env_number(const char *name, double lo, double hi, double *out)
{
    const char *text = getenv(name);
    if (!text)
        return;
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno == ERANGE || end == text || *end != '\0') {
        fprintf(stderr, "braid-bench: ignoring %s='%s': not a number\n", name, text);
        return;
    }
    *out = v < lo ? lo : (v > hi ? hi : v);
}

/* Read the whitespace-separated square matrix; 0, or -1 with the reason
 * printed. */
static int read_matrix(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "braid-bench: cannot open alltoallv traffic matrix %s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t cap = 0, n = 0, rows = 0, cols = 0, in_row = 0;
    size_t *vals = NULL;
    int c, rc = -1;
    char word[64];
    size_t wl = 0;
    for (;;) {
        c = fgetc(f);
        if (c != EOF && !isspace(c)) {
            if (wl + 1 >= sizeof(word))
                goto bad_value;
            word[wl++] = (char)c;
            continue;
        }
        if (wl) {
            word[wl] = '\0';
            wl = 0;
            char *end;
            errno = 0;
            double v = strtod(word, &end);
            if (errno == ERANGE || *end != '\0' || v < 0 || v * scale > (double)SIZE_MAX)
                goto bad_value;
            if (n == cap) {
                size_t *grown = realloc(vals, (cap = cap ? cap * 2 : 64) * sizeof(*vals));
                if (!grown)
                    goto out;
                vals = grown;
            }
            vals[n++] = (size_t)(v * scale) & ~(size_t)15;
            in_row++;
        }
        if ((c == '\n' || c == EOF) && in_row) {
            if (rows && in_row != cols) {
                fprintf(stderr, "braid-bench: %s: row %zu has %zu values, the first has %zu\n", path, rows, in_row,
                        cols);
                goto out;
            }
            cols = in_row;
            in_row = 0;
            rows++;
        }
        if (c == EOF)
            break;
    }
    if (rows == 0 || rows != cols) {
        fprintf(stderr, "braid-bench: %s: the alltoallv traffic matrix must be square and not empty (%zu x %zu)\n",
                path, rows, cols);
        goto out;
    }
    matrix = vals;
    vals = NULL;
    dim = (int)rows;
    rc = 0;
    goto out;
bad_value:
    fprintf(stderr, "braid-bench: %s: value %zu is not a non-negative number of bytes\n", path, n + 1);
out:
    free(vals);
    fclose(f);
    return rc;
}

int bench_alltoallv_setup(void)
{
    env_number("NCCL_TESTS_ALLTOALLV_SPREAD", 0.0, 1.0, &spread);
    env_number("NCCL_TESTS_ALLTOALLV_MATRIX_SCALE", 0.0, 1e300, &scale);
    const char *path = getenv("NCCL_TESTS_ALLTOALLV_MATRIX_FILE");
    return path && !matrix ? read_matrix(path) : 0;
}

int bench_alltoallv_check(int nranks, size_t min_bytes, size_t max_bytes)
{
    if (!matrix)
        return 0;
    if (nranks > dim) {
        fprintf(stderr, "braid-bench: the alltoallv traffic matrix is %d x %d, smaller than the %d ranks\n", dim, dim,
                nranks);
        return -1;
    }
    if (min_bytes != max_bytes) {
        fprintf(stderr, "braid-bench: with an alltoallv traffic matrix, -b and -e must be equal (the matrix sets "
                        "the sizes)\n");
        return -1;
    }
    size_t most_send, most_recv;
    bench_alltoallv_most(0, 1, nranks, &most_send, &most_recv);
    size_t need = most_send > most_recv ? most_send : most_recv;
    if (max_bytes < need) {
        fprintf(stderr, "braid-bench: -e must be at least %zu bytes for the alltoallv traffic matrix (got %zu)\n",
                need, max_bytes);
        return -1;
    }
    return 0;
}

int bench_alltoallv_from_matrix(void)
{
    return matrix != NULL;
}

size_t bench_alltoallv_bytes(int src, int dst, int nranks, size_t total_bytes)
{
    if (matrix)
        return matrix[(size_t)src * (size_t)dim + (size_t)dst];
    if (nranks == 1)
        return total_bytes & ~(size_t)15;
    int distance = (dst - src + nranks) % nranks;
    double sum_distances = (double)nranks * (nranks - 1) / 2;
    double uniform = (double)total_bytes / nranks;
    double weighted = distance * (double)total_bytes / sum_distances;
    return (size_t)((1.0 - spread) * uniform + spread * weighted) & ~(size_t)15;
}

void bench_alltoallv_most(size_t total_bytes, size_t esize, int nranks, size_t *send, size_t *recv)
{
    *send = *recv = 0;
    for (int i = 0; i < nranks; i++) {
        size_t s = 0, r = 0;
        for (int j = 0; j < nranks; j++) {
            s += bench_alltoallv_bytes(i, j, nranks, total_bytes) / esize;
            r += bench_alltoallv_bytes(j, i, nranks, total_bytes) / esize;
        }
        *send = s > *send ? s : *send;
        *recv = r > *recv ? r : *recv;
    }
}
