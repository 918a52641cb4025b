/* Synthetic classification data: Gaussian blobs around class centers.
 *
 * Every sample is a pure function of (seed, sample index), so each rank
 * generates exactly its own shard of a global batch without any data
 * exchange, and a single-process run sees the very same samples. */
#ifndef EXAMPLES_BLOBS_H
#define EXAMPLES_BLOBS_H

#include <stdint.h>

typedef struct {
    int dim;
    int classes;
    uint64_t seed;
    float spread;   /* scale of the class centers relative to the unit noise */
    float *centers; /* [classes][dim] */
} blobs;

/* Draw the class centers from seed. Returns 0, or -1 when out of memory. */
int blobs_create(blobs *d, int dim, int classes, uint64_t seed, float spread);
void blobs_destroy(blobs *d);

/* Sample number `index` of the infinite stream: x[dim] and its label. */
void blobs_sample(const blobs *d, uint64_t index, float *x, int *label);

/* Standard normal value for (seed, a, b), from a counter-based generator. */
float blobs_normal(uint64_t seed, uint64_t a, uint64_t b);

#endif
