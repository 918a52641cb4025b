/* A small multi-layer perceptron in plain C: dense layers with ReLU between
 * them and softmax cross-entropy on top, forward, backward and SGD.
 *
 * Parameters are numbered in model order, two per layer: 2*l is layer l's
 * weight matrix, 2*l+1 its bias. Backward walks the layers from the last
 * to the first and reports each gradient the moment it is final, which is
 * what lets a data-parallel trainer start communicating it while the rest
 * of backward still runs. */
#ifndef EXAMPLES_MLP_H
#define EXAMPLES_MLP_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int in, out;
    float *w, *b;   /* w: [in][out] row-major (y = x w + b), b: [out] */
    float *gw, *gb; /* gradients, same shapes */
} mlp_layer;

typedef struct {
    int nlayers;
    mlp_layer *layers;
    int batch_cap;
    float **act;     /* act[l]: input of layer l, [batch][in]; act[nlayers]: logits */
    float *delta[2]; /* ping-pong buffers for the backward signal */
} mlp;

/* Called by mlp_backward once a parameter's gradient is final; a nonzero
 * return stops backward and is returned from it. */
typedef int (*mlp_grad_ready_fn)(void *ctx, int param);

int mlp_create(mlp *m, int in, int hidden, int nhidden, int classes, int batch_cap);
void mlp_destroy(mlp *m);

int mlp_param_count(const mlp *m); /* 2 * nlayers */
float *mlp_param(const mlp *m, int param, size_t *count);
float *mlp_grad(const mlp *m, int param, size_t *count);
size_t mlp_total_params(const mlp *m);

/* He-normal weights from seed, zero biases. */
void mlp_init(mlp *m, uint64_t seed);

/* Forward pass on x[batch][in]; returns the mean cross-entropy over the
 * batch and leaves dL/dlogits (for that mean) ready for backward. */
double mlp_forward(mlp *m, const float *x, const int *labels, int batch);

/* Backward pass after mlp_forward: fills every gradient, calling ready
 * (when not NULL) for each parameter as soon as it is done. */
int mlp_backward(mlp *m, int batch, mlp_grad_ready_fn ready, void *ctx);

/* w -= lr * grad for every parameter. */
void mlp_sgd(mlp *m, float lr);

#endif
