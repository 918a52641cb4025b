#include "mlp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "blobs.h"

/* Rows of the batch processed together, so that each weight row loaded
 * into cache is used ROWS times before it is evicted. */
#define ROWS 8

static float *alloc_floats(size_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, (n ? n : 1) * sizeof(float)) != 0)
        return NULL;
    memset(p, 0, (n ? n : 1) * sizeof(float));
    return p;
}

int mlp_create(mlp *m, int in, int hidden, int nhidden, int classes, int batch_cap)
{
    memset(m, 0, sizeof(*m));
    m->nlayers = nhidden + 1;
    m->batch_cap = batch_cap;
    m->layers = calloc((size_t)m->nlayers, sizeof(*m->layers));
    m->act = calloc((size_t)m->nlayers + 1, sizeof(*m->act));
    if (!m->layers || !m->act)
        return -1;
    int widest = in > hidden ? in : hidden;
    widest = widest > classes ? widest : classes;
    for (int l = 0; l < m->nlayers; l++) {
        mlp_layer *L = &m->layers[l];
        L->in = l == 0 ? in : hidden;
        L->out = l == m->nlayers - 1 ? classes : hidden;
        size_t nw = (size_t)L->in * L->out;
        L->w = alloc_floats(nw);
        L->gw = alloc_floats(nw);
        L->b = alloc_floats((size_t)L->out);
        L->gb = alloc_floats((size_t)L->out);
        if (!L->w || !L->gw || !L->b || !L->gb)
            return -1;
    }
    for (int l = 0; l <= m->nlayers; l++) {
        int width = l < m->nlayers ? m->layers[l].in : classes;
        if (!(m->act[l] = alloc_floats((size_t)batch_cap * width)))
            return -1;
    }
    for (int i = 0; i < 2; i++)
        if (!(m->delta[i] = alloc_floats((size_t)batch_cap * widest)))
            return -1;
    return 0;
}

void mlp_destroy(mlp *m)
{
    for (int l = 0; m->layers && l < m->nlayers; l++) {
        free(m->layers[l].w);
        free(m->layers[l].gw);
        free(m->layers[l].b);
        free(m->layers[l].gb);
    }
    for (int l = 0; m->act && l <= m->nlayers; l++)
        free(m->act[l]);
    free(m->delta[0]);
    free(m->delta[1]);
    free(m->layers);
    free(m->act);
    memset(m, 0, sizeof(*m));
}

int mlp_param_count(const mlp *m)
{
    return 2 * m->nlayers;
}

float *mlp_param(const mlp *m, int param, size_t *count)
{
    const mlp_layer *L = &m->layers[param / 2];
    *count = param % 2 ? (size_t)L->out : (size_t)L->in * L->out;
    return param % 2 ? L->b : L->w;
}

float *mlp_grad(const mlp *m, int param, size_t *count)
{
    const mlp_layer *L = &m->layers[param / 2];
    *count = param % 2 ? (size_t)L->out : (size_t)L->in * L->out;
    return param % 2 ? L->gb : L->gw;
}

size_t mlp_total_params(const mlp *m)
{
    size_t n = 0;
    for (int p = 0; p < mlp_param_count(m); p++) {
        size_t c;
        mlp_param(m, p, &c);
        n += c;
    }
    return n;
}

void mlp_init(mlp *m, uint64_t seed)
{
    for (int l = 0; l < m->nlayers; l++) {
        mlp_layer *L = &m->layers[l];
        /* He init for ReLU layers; the logits layer gets LeCun scale so the
         * first loss is near log(classes) instead of far above it. */
        float scale = sqrtf((l == m->nlayers - 1 ? 1.0f : 2.0f) / (float)L->in);
        for (int i = 0; i < L->in; i++)
            for (int o = 0; o < L->out; o++)
                L->w[(size_t)i * L->out + o] = scale * blobs_normal(seed, (uint64_t)l << 40 | (uint64_t)i, (uint64_t)o);
        memset(L->b, 0, (size_t)L->out * sizeof(float));
    }
}

/* y[n] += a * x[n]: the inner loop of every product below, written so the
 * compiler vectorizes it without reassociating anything (results are the
 * same bits at any vector width). */
static inline void axpy(float a, const float *restrict x, float *restrict y, int n)
{
    for (int j = 0; j < n; j++)
        y[j] += a * x[j];
}

/* Y[batch][out] = X[batch][in] W[in][out] + b */
static void dense_forward(const mlp_layer *L, const float *X, float *Y, int batch)
{
    for (int r0 = 0; r0 < batch; r0 += ROWS) {
        int rows = batch - r0 < ROWS ? batch - r0 : ROWS;
        for (int r = 0; r < rows; r++)
            memcpy(Y + (size_t)(r0 + r) * L->out, L->b, (size_t)L->out * sizeof(float));
        for (int i = 0; i < L->in; i++) {
            const float *w = L->w + (size_t)i * L->out;
            for (int r = 0; r < rows; r++)
                axpy(X[(size_t)(r0 + r) * L->in + i], w, Y + (size_t)(r0 + r) * L->out, L->out);
        }
    }
}

/* gW[in][out] = X^T dY, gb = column sums of dY. */
static void dense_grads(mlp_layer *L, const float *X, const float *dY, int batch)
{
    for (int i = 0; i < L->in; i++) {
        float *g = L->gw + (size_t)i * L->out;
        memset(g, 0, (size_t)L->out * sizeof(float));
        for (int r = 0; r < batch; r++)
            axpy(X[(size_t)r * L->in + i], dY + (size_t)r * L->out, g, L->out);
    }
    memset(L->gb, 0, (size_t)L->out * sizeof(float));
    for (int r = 0; r < batch; r++)
        axpy(1.0f, dY + (size_t)r * L->out, L->gb, L->out);
}

/* dX[batch][in] = dY[batch][out] W^T, masked by ReLU'(X) (X is the ReLU
 * output that fed this layer, so X > 0 exactly where the unit was on). */
static void dense_input_grad(const mlp_layer *L, const float *X, const float *dY, float *dX, int batch)
{
    for (int r = 0; r < batch; r++) {
        const float *dy = dY + (size_t)r * L->out;
        for (int i = 0; i < L->in; i++) {
            const float *w = L->w + (size_t)i * L->out;
            /* Eight independent partial sums: vectorizable and fixed-order. */
            float acc[8] = {0};
            int o = 0;
            for (; o + 8 <= L->out; o += 8)
                for (int k = 0; k < 8; k++)
                    acc[k] += dy[o + k] * w[o + k];
            float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
            for (; o < L->out; o++)
                s += dy[o] * w[o];
            dX[(size_t)r * L->in + i] = X[(size_t)r * L->in + i] > 0.0f ? s : 0.0f;
        }
    }
}

double mlp_forward(mlp *m, const float *x, const int *labels, int batch)
{
    memcpy(m->act[0], x, (size_t)batch * m->layers[0].in * sizeof(float));
    for (int l = 0; l < m->nlayers; l++) {
        const mlp_layer *L = &m->layers[l];
        float *y = m->act[l + 1];
        dense_forward(L, m->act[l], y, batch);
        if (l < m->nlayers - 1)
            for (size_t j = 0; j < (size_t)batch * L->out; j++)
                y[j] = y[j] > 0.0f ? y[j] : 0.0f;
    }
    /* Softmax cross-entropy; the gradient of the batch mean goes to
     * delta[0] for backward. */
    int classes = m->layers[m->nlayers - 1].out;
    double loss = 0;
    for (int r = 0; r < batch; r++) {
        const float *z = m->act[m->nlayers] + (size_t)r * classes;
        float *d = m->delta[0] + (size_t)r * classes;
        float zmax = z[0];
        for (int c = 1; c < classes; c++)
            zmax = z[c] > zmax ? z[c] : zmax;
        double sum = 0;
        for (int c = 0; c < classes; c++)
            sum += exp((double)(z[c] - zmax));
        for (int c = 0; c < classes; c++) {
            double p = exp((double)(z[c] - zmax)) / sum;
            d[c] = (float)((p - (c == labels[r] ? 1.0 : 0.0)) / batch);
        }
        loss += log(sum) - (double)(z[labels[r]] - zmax);
    }
    return loss / batch;
}

int mlp_backward(mlp *m, int batch, mlp_grad_ready_fn ready, void *ctx)
{
    int cur = 0;
    for (int l = m->nlayers - 1; l >= 0; l--) {
        mlp_layer *L = &m->layers[l];
        const float *dY = m->delta[cur];
        dense_grads(L, m->act[l], dY, batch);
        /* Both gradients of this layer are final: hand them over before
         * spending time on the signal for the layers below. */
        if (ready) {
            int rc = ready(ctx, 2 * l);
            if (rc == 0)
                rc = ready(ctx, 2 * l + 1);
            if (rc != 0)
                return rc;
        }
        if (l > 0) {
            dense_input_grad(L, m->act[l], dY, m->delta[1 - cur], batch);
            cur = 1 - cur;
        }
    }
    return 0;
}

void mlp_sgd(mlp *m, float lr)
{
    for (int l = 0; l < m->nlayers; l++) {
        mlp_layer *L = &m->layers[l];
        size_t nw = (size_t)L->in * L->out;
        for (size_t j = 0; j < nw; j++)
            L->w[j] -= lr * L->gw[j];
        for (int o = 0; o < L->out; o++)
            L->b[o] -= lr * L->gb[o];
    }
}
