/* Data-parallel training of an MLP with braid, the way PyTorch DDP does it:
 *
 *  - rank 0's initial weights are broadcast, so every replica starts equal;
 *  - each step's global batch is split into one contiguous shard per rank;
 *  - backward hands each gradient to the bucketer as soon as it is final,
 *    so full buckets are all-reduced while backward continues below them
 *    (--no-overlap hands them over only after backward, for comparison);
 *  - finish() leaves the average gradient on every rank, and every replica
 *    takes the same SGD step, so the weights stay identical.
 *
 * --reference trains the same model on the same data in one process
 * without braid at all (whole global batch, plain SGD): the independent
 * result a data-parallel run must reproduce.
 *
 * Launch with torchrun / mpirun / srun (braid_pg_init_env), or run it as is
 * and it forks -N local ranks on loopback.
 *
 *   ddp_mlp -N 4 --steps 50 --hidden 1024 --batch 256
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <braid.h>

#include "blobs.h"
#include "mlp.h"

typedef struct {
    int steps;
    int ranks;
    int in, hidden, layers, classes;
    int batch;
    float lr;
    int overlap;
    int reference;
    const char *dump;
    int print_every;
    int warmup;
    double bucket_mb, first_bucket_mb;
    braid_dtype compress;
    uint64_t seed;
} options;

static void usage(FILE *f)
{
    fprintf(f, "usage: ddp_mlp [options]\n"
               "  --steps N          training steps (default 30)\n"
               "  -N, --ranks N      local ranks to fork when not under a launcher (default 2)\n"
               "  --in N             input features (default 512)\n"
               "  --hidden N         width of each hidden layer (default 1024)\n"
               "  --layers N         hidden layers (default 2)\n"
               "  --classes N        classes (default 10)\n"
               "  --batch N          global batch, split evenly over ranks (default 256)\n"
               "  --lr X             SGD learning rate (default 0.05)\n"
               "  --no-overlap       hand gradients to the bucketer only after the whole backward\n"
               "  --reference        one process, no braid: the whole global batch, plain SGD\n"
               "  --bucket-mb X      bucket cap in MiB (default 25)\n"
               "  --first-bucket-mb X first bucket cap in MiB (default 1)\n"
               "  --compress f16|bf16 compress gradients on the wire\n"
               "  --dump FILE        write each rank's final weights (raw f32, model order) to FILE.<rank>\n"
               "  --print-every N    print the loss every N steps (default 10; 0: only the last)\n"
               "  --warmup N         steps left out of the timing (default 3)\n"
               "  --seed N           data and init seed (default 1)\n");
}

static int parse_int(const char *name, const char *text, int lo, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || *end || v < lo || v > 1 << 30) {
        fprintf(stderr, "ddp_mlp: %s needs an integer >= %d, got '%s'\n", name, lo, text);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int parse_double(const char *name, const char *text, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || *end || !(v > 0)) {
        fprintf(stderr, "ddp_mlp: %s needs a positive number, got '%s'\n", name, text);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_options(int argc, char **argv, options *o)
{
    *o = (options){.steps = 30,
                   .ranks = 2,
                   .in = 512,
                   .hidden = 1024,
                   .layers = 2,
                   .classes = 10,
                   .batch = 256,
                   .lr = 0.05f,
                   .overlap = 1,
                   .print_every = 10,
                   .warmup = 3,
                   .compress = BRAID_F32,
                   .seed = 1};
    enum {
        O_STEPS = 256,
        O_IN,
        O_HIDDEN,
        O_LAYERS,
        O_CLASSES,
        O_BATCH,
        O_LR,
        O_NO_OVERLAP,
        O_REFERENCE,
        O_BUCKET,
        O_FIRST,
        O_COMPRESS,
        O_DUMP,
        O_PRINT,
        O_WARMUP,
        O_SEED
    };
    static const struct option longopts[] = {{"steps", required_argument, NULL, O_STEPS},
                                             {"ranks", required_argument, NULL, 'N'},
                                             {"in", required_argument, NULL, O_IN},
                                             {"hidden", required_argument, NULL, O_HIDDEN},
                                             {"layers", required_argument, NULL, O_LAYERS},
                                             {"classes", required_argument, NULL, O_CLASSES},
                                             {"batch", required_argument, NULL, O_BATCH},
                                             {"lr", required_argument, NULL, O_LR},
                                             {"no-overlap", no_argument, NULL, O_NO_OVERLAP},
                                             {"reference", no_argument, NULL, O_REFERENCE},
                                             {"bucket-mb", required_argument, NULL, O_BUCKET},
                                             {"first-bucket-mb", required_argument, NULL, O_FIRST},
                                             {"compress", required_argument, NULL, O_COMPRESS},
                                             {"dump", required_argument, NULL, O_DUMP},
                                             {"print-every", required_argument, NULL, O_PRINT},
                                             {"warmup", required_argument, NULL, O_WARMUP},
                                             {"seed", required_argument, NULL, O_SEED},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    int c, seed = 1;
    double lr;
    while ((c = getopt_long(argc, argv, "N:h", longopts, NULL)) != -1) {
        int rc = 0;
        switch (c) {
        case O_STEPS:
            rc = parse_int("--steps", optarg, 1, &o->steps);
            break;
        case 'N':
            rc = parse_int("--ranks", optarg, 1, &o->ranks);
            break;
        case O_IN:
            rc = parse_int("--in", optarg, 1, &o->in);
            break;
        case O_HIDDEN:
            rc = parse_int("--hidden", optarg, 1, &o->hidden);
            break;
        case O_LAYERS:
            rc = parse_int("--layers", optarg, 0, &o->layers);
            break;
        case O_CLASSES:
            rc = parse_int("--classes", optarg, 2, &o->classes);
            break;
        case O_BATCH:
            rc = parse_int("--batch", optarg, 1, &o->batch);
            break;
        case O_LR:
            rc = parse_double("--lr", optarg, &lr);
            o->lr = (float)lr;
            break;
        case O_NO_OVERLAP:
            o->overlap = 0;
            break;
        case O_REFERENCE:
            o->reference = 1;
            break;
        case O_BUCKET:
            rc = parse_double("--bucket-mb", optarg, &o->bucket_mb);
            break;
        case O_FIRST:
            rc = parse_double("--first-bucket-mb", optarg, &o->first_bucket_mb);
            break;
        case O_COMPRESS:
            if (strcmp(optarg, "f16") == 0)
                o->compress = BRAID_F16;
            else if (strcmp(optarg, "bf16") == 0)
                o->compress = BRAID_BF16;
            else {
                fprintf(stderr, "ddp_mlp: --compress takes f16 or bf16, got '%s'\n", optarg);
                rc = -1;
            }
            break;
        case O_DUMP:
            o->dump = optarg;
            break;
        case O_PRINT:
            rc = parse_int("--print-every", optarg, 0, &o->print_every);
            break;
        case O_WARMUP:
            rc = parse_int("--warmup", optarg, 0, &o->warmup);
            break;
        case O_SEED:
            rc = parse_int("--seed", optarg, 0, &seed);
            o->seed = (uint64_t)seed;
            break;
        case 'h':
            usage(stdout);
            exit(0);
        default:
            usage(stderr);
            return -1;
        }
        if (rc)
            return -1;
    }
    if (optind < argc) {
        fprintf(stderr, "ddp_mlp: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- one rank -------------------------------------------------------- */

typedef struct {
    braid_bucketer *bucketer;
    int rank;
    int *param_ids;
} ready_ctx;

static int grad_ready(void *vctx, int param)
{
    ready_ctx *ctx = vctx;
    if (braid_bucketer_ready(ctx->bucketer, ctx->param_ids[param]) != BRAID_OK) {
        fprintf(stderr, "rank %d: bucketer ready(param %d): %s\n", ctx->rank, param, braid_last_error());
        return 1;
    }
    return 0;
}

static int dump_weights(const mlp *m, const char *prefix, int rank)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s.%d", prefix, rank);
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "rank %d: cannot write %s: %s\n", rank, path, strerror(errno));
        return 1;
    }
    int rc = 0;
    for (int p = 0; p < mlp_param_count(m) && rc == 0; p++) {
        size_t n;
        const float *w = mlp_param(m, p, &n);
        if (fwrite(w, sizeof(float), n, f) != n)
            rc = 1;
    }
    if (fclose(f) != 0 || rc) {
        fprintf(stderr, "rank %d: writing %s failed: %s\n", rank, path, strerror(errno));
        return 1;
    }
    return 0;
}

/* Every rank starts from rank 0's weights, whatever it initialized
 * itself (here: from a different seed, so a missing broadcast shows). */
static int broadcast_weights(braid_pg *pg, mlp *m)
{
    for (int p = 0; p < mlp_param_count(m); p++) {
        size_t n;
        float *w = mlp_param(m, p, &n);
        if (braid_broadcast(pg, w, n, BRAID_F32, 0, NULL, NULL) != BRAID_OK) {
            fprintf(stderr, "rank %d: broadcast of param %d: %s\n", braid_pg_rank(pg), p, braid_last_error());
            return 1;
        }
    }
    return 0;
}

typedef struct {
    double step, backward, wait; /* summed seconds over the timed steps */
    int timed;
} timing;

static int train(braid_pg *pg, const options *o)
{
    int rank = braid_pg_rank(pg), world = braid_pg_size(pg);
    if (o->batch % world != 0) {
        fprintf(stderr, "rank %d: --batch %d does not split evenly over %d ranks\n", rank, o->batch, world);
        return 2;
    }
    int local = o->batch / world;
    int rc = 1;
    mlp m = {0};
    blobs data = {0};
    braid_bucketer *bk = NULL;
    float *x = malloc((size_t)local * o->in * sizeof(float));
    int *labels = malloc((size_t)local * sizeof(int));
    int *ids = NULL;
    if (!x || !labels || mlp_create(&m, o->in, o->hidden, o->layers, o->classes, local) != 0 ||
        blobs_create(&data, o->in, o->classes, o->seed, 0.3f) != 0) {
        fprintf(stderr, "rank %d: out of memory for the model\n", rank);
        goto out;
    }
    mlp_init(&m, o->seed * 1000 + (uint64_t)rank);
    if (broadcast_weights(pg, &m))
        goto out;

    size_t cap = (size_t)(o->bucket_mb * 1048576.0), first = (size_t)(o->first_bucket_mb * 1048576.0);
    if (braid_bucketer_create(&bk, pg, cap, first) != BRAID_OK ||
        (o->compress != BRAID_F32 && braid_bucketer_set_compression(bk, o->compress) != BRAID_OK)) {
        fprintf(stderr, "rank %d: bucketer: %s\n", rank, braid_last_error());
        goto out;
    }
    int np = mlp_param_count(&m);
    ids = malloc((size_t)np * sizeof(int));
    if (!ids)
        goto out;
    for (int p = 0; p < np; p++) {
        size_t n;
        float *g = mlp_grad(&m, p, &n);
        if (braid_bucketer_add(bk, g, n, BRAID_F32, &ids[p]) != BRAID_OK) {
            fprintf(stderr, "rank %d: bucketer add(param %d): %s\n", rank, p, braid_last_error());
            goto out;
        }
    }
    ready_ctx ctx = {.bucketer = bk, .rank = rank, .param_ids = ids};
    size_t nparams = mlp_total_params(&m);
    if (rank == 0)
        printf("ddp_mlp: %d ranks, %d hidden layers of %d, %zu params (%.1f MiB of gradients), global batch %d "
               "(%d per rank), overlap %s%s\n",
               world, o->layers, o->hidden, nparams, (double)nparams * 4 / 1048576.0, o->batch, local,
               o->overlap ? "on" : "off",
               o->compress == BRAID_F16    ? ", f16 wire"
               : o->compress == BRAID_BF16 ? ", bf16 wire"
                                           : "");

    timing t = {0};
    double first_loss = 0, last_loss = 0;
    for (int step = 0; step < o->steps; step++) {
        if (step == o->warmup) {
            /* Start the clock together: a blocking all-reduce is a barrier. */
            int one = 1;
            if (braid_allreduce(pg, &one, &one, 1, BRAID_I32, BRAID_SUM, NULL, NULL) != BRAID_OK) {
                fprintf(stderr, "rank %d: barrier: %s\n", rank, braid_last_error());
                goto out;
            }
        }
        double t0 = now_s();
        for (int r = 0; r < local; r++)
            blobs_sample(&data, (uint64_t)step * o->batch + (uint64_t)rank * local + r, x + (size_t)r * o->in,
                         &labels[r]);
        double loss = mlp_forward(&m, x, labels, local);
        double t1 = now_s();
        if (mlp_backward(&m, local, o->overlap ? grad_ready : NULL, &ctx) != 0)
            goto out;
        if (!o->overlap)
            for (int p = np - 1; p >= 0; p--)
                if (grad_ready(&ctx, p) != 0)
                    goto out;
        double t2 = now_s();
        if (braid_bucketer_finish(bk) != BRAID_OK) {
            fprintf(stderr, "rank %d: step %d: bucketer finish: %s\n", rank, step, braid_last_error());
            goto out;
        }
        double t3 = now_s();
        mlp_sgd(&m, o->lr);
        double t4 = now_s();
        if (step >= o->warmup) {
            t.step += t4 - t0;
            t.backward += t2 - t1;
            t.wait += t3 - t2;
            t.timed++;
        }
        int last = step == o->steps - 1;
        if (step == 0 || last || (o->print_every > 0 && step % o->print_every == 0)) {
            /* The loss of the global batch is the mean of the shard means. */
            if (braid_allreduce(pg, &loss, &loss, 1, BRAID_F64, BRAID_AVG, NULL, NULL) != BRAID_OK) {
                fprintf(stderr, "rank %d: loss all-reduce: %s\n", rank, braid_last_error());
                goto out;
            }
            if (step == 0)
                first_loss = loss;
            last_loss = loss;
            if (rank == 0)
                printf("step %4d  loss %.6f\n", step, loss);
        }
    }
    if (rank == 0) {
        printf("final loss %.6f (first %.6f)\n", last_loss, first_loss);
        if (t.timed > 0)
            printf("time: %.2f ms/step (backward %.2f ms, waiting for gradients %.2f ms) over %d steps\n",
                   1e3 * t.step / t.timed, 1e3 * t.backward / t.timed, 1e3 * t.wait / t.timed, t.timed);
        printf("RESULT ranks=%d params=%zu hidden=%d layers=%d batch=%d overlap=%d buckets=%d ms_per_step=%.3f "
               "wait_ms=%.3f first_loss=%.6f final_loss=%.6f\n",
               world, nparams, o->hidden, o->layers, o->batch, o->overlap, braid_bucketer_bucket_count(bk),
               t.timed ? 1e3 * t.step / t.timed : 0.0, t.timed ? 1e3 * t.wait / t.timed : 0.0, first_loss, last_loss);
        fflush(stdout);
    }
    if (o->dump && dump_weights(&m, o->dump, rank))
        goto out;
    rc = 0;
out:
    braid_bucketer_destroy(bk);
    free(ids);
    free(x);
    free(labels);
    blobs_destroy(&data);
    mlp_destroy(&m);
    return rc;
}

/* ---- reference ------------------------------------------------------- */

/* The same training without a process group or bucketer: rank 0's initial
 * weights (what the data-parallel run broadcasts), the whole global batch
 * in one forward/backward (the same samples the ranks' shards hold), and
 * SGD on its mean gradient. Writes FILE.0 for --dump. */
static int train_reference(const options *o)
{
    int rc = 1;
    mlp m = {0};
    blobs data = {0};
    float *x = malloc((size_t)o->batch * o->in * sizeof(float));
    int *labels = malloc((size_t)o->batch * sizeof(int));
    if (!x || !labels || mlp_create(&m, o->in, o->hidden, o->layers, o->classes, o->batch) != 0 ||
        blobs_create(&data, o->in, o->classes, o->seed, 0.3f) != 0) {
        fprintf(stderr, "reference: out of memory for the model\n");
        goto out;
    }
    mlp_init(&m, o->seed * 1000);
    size_t nparams = mlp_total_params(&m);
    printf("ddp_mlp reference: 1 process, no braid, %d hidden layers of %d, %zu params, batch %d\n", o->layers,
           o->hidden, nparams, o->batch);
    double first_loss = 0, last_loss = 0, step_s = 0;
    int timed = 0;
    for (int step = 0; step < o->steps; step++) {
        double t0 = now_s();
        for (int r = 0; r < o->batch; r++)
            blobs_sample(&data, (uint64_t)step * o->batch + (uint64_t)r, x + (size_t)r * o->in, &labels[r]);
        double loss = mlp_forward(&m, x, labels, o->batch);
        if (mlp_backward(&m, o->batch, NULL, NULL) != 0)
            goto out;
        mlp_sgd(&m, o->lr);
        if (step >= o->warmup) {
            step_s += now_s() - t0;
            timed++;
        }
        if (step == 0)
            first_loss = loss;
        last_loss = loss;
        int last = step == o->steps - 1;
        if (step == 0 || last || (o->print_every > 0 && step % o->print_every == 0))
            printf("step %4d  loss %.6f\n", step, loss);
    }
    printf("final loss %.6f (first %.6f)\n", last_loss, first_loss);
    printf("RESULT ranks=1 params=%zu hidden=%d layers=%d batch=%d overlap=0 buckets=0 ms_per_step=%.3f "
           "wait_ms=0.000 first_loss=%.6f final_loss=%.6f reference=1\n",
           nparams, o->hidden, o->layers, o->batch, timed ? 1e3 * step_s / timed : 0.0, first_loss, last_loss);
    fflush(stdout);
    if (o->dump && dump_weights(&m, o->dump, 0))
        goto out;
    rc = 0;
out:
    free(x);
    free(labels);
    blobs_destroy(&data);
    mlp_destroy(&m);
    return rc;
}

/* ---- launching ------------------------------------------------------- */

static int under_launcher(void)
{
    static const char *const vars[] = {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", NULL};
    for (const char *const *v = vars; *v; v++)
        if (getenv(*v))
            return 1;
    return 0;
}

static int run_rank(braid_pg *pg, const options *o)
{
    int rc = train(pg, o);
    braid_pg_destroy(pg);
    return rc;
}

/* No launcher: make a unique id and fork one process per rank, the way
 * an NCCL program hands ncclUniqueId to its ranks. */
static int spawn_local(const options *o)
{
    braid_unique_id_t id;
    if (braid_unique_id(&id) != BRAID_OK) {
        fprintf(stderr, "ddp_mlp: braid_unique_id: %s\n", braid_last_error());
        return 1;
    }
    pid_t *pids = calloc((size_t)o->ranks, sizeof(pid_t));
    if (!pids)
        return 1;
    int failed = 0;
    for (int r = 0; r < o->ranks; r++) {
        fflush(NULL);
        pids[r] = fork();
        if (pids[r] < 0) {
            fprintf(stderr, "ddp_mlp: fork: %s\n", strerror(errno));
            failed++;
            break;
        }
        if (pids[r] == 0) {
            free(pids); /* the parent's bookkeeping */
            braid_pg *pg;
            if (braid_pg_init(&pg, r, o->ranks, &id, NULL) != BRAID_OK) {
                fprintf(stderr, "rank %d: braid_pg_init: %s\n", r, braid_last_error());
                _exit(1);
            }
            int rc = run_rank(pg, o);
            fflush(NULL);
            _exit(rc);
        }
    }
    for (int r = 0; r < o->ranks; r++) {
        int status = 0;
        if (pids[r] <= 0)
            continue;
        if (waitpid(pids[r], &status, 0) < 0) {
            fprintf(stderr, "ddp_mlp: waitpid for rank %d: %s\n", r, strerror(errno));
            failed++;
        } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "ddp_mlp: rank %d %s %d\n", r, WIFSIGNALED(status) ? "killed by signal" : "exited with",
                    WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
            failed++;
        }
    }
    free(pids);
    return failed ? 1 : 0;
}

int main(int argc, char **argv)
{
    options o;
    if (parse_options(argc, argv, &o) != 0)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (o.reference)
        return train_reference(&o);
    if (!under_launcher())
        return spawn_local(&o);
    braid_pg *pg;
    if (braid_pg_init_env(&pg, NULL) != BRAID_OK) {
        fprintf(stderr, "ddp_mlp: braid_pg_init_env: %s\n", braid_last_error());
        return 1;
    }
    return run_rank(pg, &o);
}
