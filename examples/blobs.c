#include "blobs.h"

#include <math.h>
#include <stdlib.h>

/* Independent streams for centers, labels and noise under one seed. */
#define CENTER_STREAM 0x243F6A8885A308D3ull
#define LABEL_STREAM 0x13198A2E03707344ull

/* splitmix64: a counter-based generator, so any sample can be produced
 * without generating the ones before it. */
static uint64_t mix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static double uniform01(uint64_t h)
{
    /* 53 random bits in (0, 1]: never 0, so log() below is finite. */
    return ((double)(h >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

float blobs_normal(uint64_t seed, uint64_t a, uint64_t b)
{
    uint64_t h = mix64(seed ^ mix64(a * 0xD1B54A32D192ED03ull ^ mix64(b)));
    double u1 = uniform01(h), u2 = uniform01(mix64(h));
    /* Box-Muller in double, rounded once: the same bits on every rank. */
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

int blobs_create(blobs *d, int dim, int classes, uint64_t seed, float spread)
{
    d->dim = dim;
    d->classes = classes;
    d->seed = seed;
    d->spread = spread;
    d->centers = malloc((size_t)dim * (size_t)classes * sizeof(float));
    if (!d->centers)
        return -1;
    for (int c = 0; c < classes; c++)
        for (int j = 0; j < dim; j++)
            d->centers[(size_t)c * dim + j] = spread * blobs_normal(seed ^ CENTER_STREAM, (uint64_t)c, (uint64_t)j);
    return 0;
}

void blobs_destroy(blobs *d)
{
    free(d->centers);
    d->centers = NULL;
}

void blobs_sample(const blobs *d, uint64_t index, float *x, int *label)
{
    int c = (int)(mix64(d->seed ^ LABEL_STREAM ^ mix64(index)) % (uint64_t)d->classes);
    const float *center = d->centers + (size_t)c * d->dim;
    for (int j = 0; j < d->dim; j++)
        x[j] = center[j] + blobs_normal(d->seed, index, (uint64_t)j);
    *label = c;
}
