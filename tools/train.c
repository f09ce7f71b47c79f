/* `tapegrad train digits`: the README's main job. An MLP 64-128-10 (ReLU)
 * on the bundled 8x8 digits (stratified 80/20 split, features standardised
 * with the training split's mean and deviation), Adam,
 * shuffled mini-batches; a progress bar per epoch on a terminal, plain
 * lines otherwise. After training it saves the parameters, reloads them
 * into a fresh model and checks that its test logits (hence accuracy) are
 * bitwise the same. Same seed, same run, on every machine.
 *
 * --workers N splits each mini-batch across N worker threads (replicas.h);
 * --dist, under mpirun, across the MPI ranks (dist.h, builds with MPI):
 * every rank loads the data, takes its shard of each global batch, and
 * only rank 0 prints and saves. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <tapegrad.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

#ifdef TG_HAVE_MPI
#include <tapegrad/dist.h>
#endif

#ifndef TG_DATA_DIR
#define TG_DATA_DIR "data"
#endif

typedef struct {
    int64_t epochs, batch, hidden, seed, workers;
    double lr;
    const char *data, *save;
    bool quiet, dist;
} train_opts;

/* --dist: this process's place in the job. */
typedef struct {
#ifdef TG_HAVE_MPI
    tg_dist *d;
#else
    void *d;
#endif
    int rank, size;
    bool mpi_started; /* this command called MPI_Init (and finalizes) */
} dist_state;

typedef struct {
    tg_params *ps;
    tg_linear *l1, *l2;
} mlp;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static tg_status mlp_new(mlp *m, int64_t in, int64_t hidden, int64_t classes, uint64_t seed)
{
    tg_rng rng;
    tg_rng_seed(&rng, seed);
    m->ps = tg_params_new();
    if (!m->ps) return tg_last_error() ? tg_last_error() : TG_ERR_NOMEM;
    m->l1 = tg_linear_new(m->ps, "fc1", in, hidden, true, TG_F32, &rng);
    m->l2 = m->l1 ? tg_linear_new(m->ps, "fc2", hidden, classes, true, TG_F32, &rng) : NULL;
    return m->l2 ? TG_OK : tg_last_error();
}

static void mlp_free(mlp *m)
{
    tg_linear_free(m->l1);
    tg_linear_free(m->l2);
    tg_params_free(m->ps);
}

static tg_tensor *mlp_forward(const mlp *m, tg_tensor *x)
{
    return tg_linear_forward(m->l2, tg_relu(tg_linear_forward(m->l1, x)));
}

/* Number of rows where argmax(logits) == y. */
static int64_t correct(tg_tensor *logits, tg_tensor *y)
{
    tg_tensor *hit = tg_sum(tg_cast(tg_eq(tg_argmax(logits, 1, false), y), TG_F64));
    double v = -1;
    if (!hit || tg_tensor_item(hit, &v)) return -1;
    return (int64_t)v;
}

/* Test-set logits with grad off (copied out, for the reload check). */
static float *evaluate(const mlp *m, const tg_dataset *test, double *acc)
{
    int64_t n = tg_dataset_size(test);
    bool prev = tg_grad_set_enabled(false);
    tg_scope_begin();
    tg_tensor *logits = mlp_forward(m, tg_dataset_x(test));
    int64_t ok = logits ? correct(logits, tg_dataset_y(test)) : -1;
    float *out = NULL;
    if (ok >= 0) {
        size_t bytes = (size_t)tg_tensor_numel(logits) * sizeof(float);
        out = malloc(bytes);
        if (out) tg_tensor_copy_out(logits, out, bytes);
    }
    tg_scope_end();
    tg_grad_set_enabled(prev);
    *acc = n ? (double)ok / (double)n : 0.0;
    return out;
}

/* The replicas' loss (--workers): cross-entropy of the shard, and the
 * shard's correct predictions counted per worker. */
typedef struct {
    const mlp *m;
    int64_t hits[TG_REPLICAS_MAX_WORKERS];
} shard_ctx;

static tg_tensor *shard_loss(void *ud, const tg_replica_info *info, int n, tg_tensor *const *in)
{
    shard_ctx *c = ud;
    (void)n;
    tg_tensor *logits = mlp_forward(c->m, in[0]);
    c->hits[info->worker] = logits ? correct(tg_detach(logits), in[1]) : 0;
    return tg_cross_entropy(logits, in[1]);
}

static void progress(bool tty, int64_t epoch, int64_t epochs, int64_t b, int64_t nb, double loss,
                     double acc)
{
    if (!tty) return;
    int width = 30, filled = (int)(width * b / (nb ? nb : 1));
    printf("\repoch %3lld/%lld [", (long long)epoch, (long long)epochs);
    for (int i = 0; i < width; i++) putchar(i < filled ? '#' : (i == filled ? '>' : '.'));
    printf("] %3lld/%lld  loss %.4f  acc %.3f", (long long)b, (long long)nb, loss, acc);
    fflush(stdout);
}

/* Every trainable value of ps is finite (the model trains in f32). */
static bool params_finite(tg_params *ps)
{
    tg_tensor *flat = tg_params_flat(ps, TG_F32);
    if (!flat) return false;
    const float *v = tg_tensor_data_ro(flat);
    bool ok = v != NULL;
    for (int64_t i = 0; ok && i < tg_tensor_numel(flat); i++) ok = isfinite(v[i]);
    tg_tensor_release(flat);
    return ok;
}

static const char train_usage[] =
    "usage: tapegrad train digits [--epochs N] [--lr X] [--seed S] [--batch B] [--hidden H]\n"
    "                             [--save FILE] [--data CSV] [--workers N] [--dist]\n"
    "                             [--quiet]\n"
    "\n"
    "Train an MLP 64-H-10 (ReLU, Adam) on the 8x8 digits, report the test accuracy, save the\n"
    "parameters, reload them into a fresh model and check its logits are bitwise the same.\n"
    "  --epochs N   passes over the training split (default 20, 1..100000)\n"
    "  --lr X       Adam learning rate (default 0.001, > 0)\n"
    "  --seed S     seed of the split, the initial weights and the shuffles (default 0)\n"
    "  --batch B    mini-batch size (default 32, 1..1048576)\n"
    "  --hidden H   hidden units (default 128, 1..65536)\n"
    "  --save FILE  where to save the parameters (default digits-mlp.safetensors; checked\n"
    "               to be writable before training)\n"
    "  --data CSV   the data set, 64 features and a label per row, plain or gzip (default\n"
    "               data/digits.csv.gz)\n"
    "  --workers N  data-parallel worker threads (default 0: the plain loop on one tape);\n"
    "               each mini-batch is split across N replicas whose gradients are summed\n"
    "               (tg_replicas; OpenBLAS then runs one thread per worker)\n"
    "  --dist       data-parallel across MPI ranks: run under mpirun (mpirun -np 2 tapegrad\n"
    "               train digits --dist); each global mini-batch of B rows is split across\n"
    "               the ranks, gradients averaged (tg_dist), output and --save on rank 0\n"
    "               only (needs a build with MPI; not combined with --workers)\n"
    "  --quiet      no per-epoch lines\n"
    "Options take their value as the next argument or after '=' (--epochs=3).\n"
    "exit status: 0 success, 1 a library call or the reload check failed, 2 usage error\n";

/* Parses the options after "train digits"; CLI_USAGE after one message. */
static int parse(int argc, char **argv, train_opts *o)
{
    static const char *const cmd = "train";
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        char name[32];
        const char *eq = strchr(a, '=');
        if (strncmp(a, "--", 2) == 0 && eq && (size_t)(eq - a) < sizeof name) {
            snprintf(name, sizeof name, "%.*s", (int)(eq - a), a); /* --opt=value */
            v = eq + 1;
        } else {
            snprintf(name, sizeof name, "%.31s", a);
        }
        if (strcmp(name, "--quiet") == 0 && !v) {
            o->quiet = true;
            continue;
        }
        if (strcmp(name, "--dist") == 0 && !v) {
            o->dist = true;
            continue;
        }
        static const char *const known[] = {"--epochs", "--batch", "--hidden", "--seed",
                                            "--lr",     "--save",  "--data",   "--workers"};
        bool ok = false;
        for (size_t k = 0; k < sizeof known / sizeof known[0]; k++)
            ok |= strcmp(name, known[k]) == 0;
        if (!ok) {
            fprintf(stderr, "tapegrad train: unknown option '%s' (see 'tapegrad train --help')\n",
                    a);
            return CLI_USAGE;
        }
        if (!v) {
            if (i + 1 >= argc) {
                fprintf(stderr, "tapegrad train: %s needs a value\n", name);
                return CLI_USAGE;
            }
            v = argv[++i];
        }
        int64_t iv;
        if (strcmp(name, "--epochs") == 0) {
            if (!cli_parse_int(cmd, name, v, 1, 100000, &iv)) return CLI_USAGE;
            o->epochs = iv;
        } else if (strcmp(name, "--batch") == 0) {
            if (!cli_parse_int(cmd, name, v, 1, 1 << 20, &iv)) return CLI_USAGE;
            o->batch = iv;
        } else if (strcmp(name, "--workers") == 0) {
            if (!cli_parse_int(cmd, name, v, 0, TG_REPLICAS_MAX_WORKERS, &iv)) return CLI_USAGE;
            o->workers = iv;
        } else if (strcmp(name, "--hidden") == 0) {
            if (!cli_parse_int(cmd, name, v, 1, 1 << 16, &iv)) return CLI_USAGE;
            o->hidden = iv;
        } else if (strcmp(name, "--seed") == 0) {
            if (!cli_parse_int(cmd, name, v, 0, INT64_MAX, &iv)) return CLI_USAGE;
            o->seed = iv;
        } else if (strcmp(name, "--lr") == 0) {
            char *end;
            o->lr = strtod(v, &end);
            if (!*v || *end || !(o->lr > 0) || !isfinite(o->lr)) {
                fprintf(stderr, "tapegrad train: --lr needs a positive number, got '%s'\n", v);
                return CLI_USAGE;
            }
        } else if (strcmp(name, "--save") == 0) {
            o->save = v;
        } else {
            o->data = v;
        }
    }
    if (o->dist && o->workers > 0) {
        fprintf(stderr, "tapegrad train: --dist and --workers cannot be combined (use one: MPI "
                        "ranks or worker threads)\n");
        return CLI_USAGE;
    }
    return CLI_OK;
}

/* Rows of global batch b (0-based) of an epoch over ntrain rows. */
static int64_t global_rows(int64_t ntrain, int64_t batch, int64_t b)
{
    int64_t left = ntrain - b * batch;
    return left < batch ? left : batch;
}

#ifdef TG_HAVE_MPI
/* Joins the MPI job (MPI_Init unless the caller did) and makes the
 * data-parallel context; ranks other than 0 send stdout to /dev/null. */
static int dist_begin(dist_state *ds)
{
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        if (MPI_Init(NULL, NULL) != MPI_SUCCESS) {
            fprintf(stderr, "tapegrad train: --dist: MPI_Init failed\n");
            return CLI_FAIL;
        }
        ds->mpi_started = true;
    }
    if (tg_dist_new(MPI_COMM_WORLD, &(tg_dist_opts){.timeout_s = 60}, &ds->d))
        return cli_lib_error("train", "joining the MPI job");
    ds->rank = tg_dist_rank(ds->d);
    ds->size = tg_dist_size(ds->d);
    if (ds->rank != 0 && !freopen("/dev/null", "w", stdout)) {
        fprintf(stderr, "tapegrad train: rank %d: cannot silence stdout\n", ds->rank);
        return CLI_FAIL;
    }
    return CLI_OK;
}

static void dist_end(dist_state *ds)
{
    tg_dist_free(ds->d);
    ds->d = NULL;
    if (ds->mpi_started) MPI_Finalize();
}

/* Sums n doubles over the ranks, in place (a collective). */
static bool dist_sum(double *v, int n)
{
    return MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD) == MPI_SUCCESS;
}

/* Whether rank 0 says yes (a collective). */
static bool dist_agree(const dist_state *ds, bool root_ok)
{
    int v = root_ok;
    if (!ds->d) return root_ok;
    return MPI_Bcast(&v, 1, MPI_INT, 0, MPI_COMM_WORLD) == MPI_SUCCESS && v;
}

/* FNV-1a over the bytes of every trainable value (f32): equal on every
 * rank when the replicas are bitwise identical. */
static uint64_t params_hash(tg_params *ps)
{
    uint64_t h = 14695981039346656037u;
    tg_tensor *flat = tg_params_flat(ps, TG_F32);
    const unsigned char *b = flat ? tg_tensor_data_ro(flat) : NULL;
    size_t n = b ? (size_t)tg_tensor_numel(flat) * sizeof(float) : 0;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211u;
    tg_tensor_release(flat);
    return h;
}

/* 1 when every rank's parameters hash as rank 0's, 0 when one differs, -1
 * when MPI fails (a collective). */
static int dist_identical(tg_params *ps)
{
    uint64_t mine = params_hash(ps), root = mine;
    if (MPI_Bcast(&root, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD) != MPI_SUCCESS) return -1;
    double differ = root != mine;
    return dist_sum(&differ, 1) ? differ == 0 : -1;
}

/* One --dist step on this rank's shard (x, y) of a global batch of `rows`
 * rows: forward, the data-parallel backward (gradients averaged over the
 * ranks), then the step's statistics summed over the ranks into stats:
 * loss * rows, rows, correct predictions, ranks with a non-finite loss.
 * Each rank's mean loss is weighted by size * its rows / rows, so the
 * average over the ranks is the mean over the global batch even where the
 * shards differ by a row; a rank with no rows sends zeros. */
static tg_status dist_step(const dist_state *ds, const mlp *m, tg_tensor *x, tg_tensor *y,
                           int64_t rows, double stats[4])
{
    int64_t n = tg_tensor_dim(y, 0);
    tg_tensor *logits = mlp_forward(m, x), *loss = NULL;
    double lv = 0;
    if (logits && n == 0) {
        loss = tg_mul_scalar(tg_sum(logits), 0.0);
    } else if (logits) {
        tg_tensor *ce = tg_cross_entropy(logits, y);
        double w = (double)n * ds->size / (double)rows;
        if (ce && tg_tensor_item(ce, &lv) == TG_OK) loss = w == 1 ? ce : tg_mul_scalar(ce, w);
    }
    tg_status st = tg_dist_backward(ds->d, loss);
    if (st) return st;
    stats[0] = lv * (double)n;
    stats[1] = (double)n;
    stats[2] = n ? (double)correct(tg_detach(logits), y) : 0;
    stats[3] = !isfinite(lv);
    if (!dist_sum(stats, 4)) return tg_dist_check(ds->d, TG_ERR_DIST);
    return TG_OK;
}

static tg_status save_params(const dist_state *ds, tg_params *ps, tg_optim *opt, const char *path)
{
    return ds->d ? tg_dist_params_save(ds->d, ps, opt, path) : tg_params_save(ps, opt, path);
}
#else
/* Without MPI ds->d is always NULL: only dist_begin is reached, and it
 * says so; the others exist for the call sites. */
static int dist_begin(dist_state *ds)
{
    (void)ds;
    fprintf(stderr, "tapegrad train: --dist: this tapegrad was built without MPI (install "
                    "libopenmpi-dev openmpi-bin, then 'meson setup --reconfigure build')\n");
    return CLI_FAIL;
}
static void dist_end(dist_state *ds)
{
    (void)ds;
}
static bool dist_agree(const dist_state *ds, bool root_ok)
{
    (void)ds;
    return root_ok;
}
static int dist_identical(tg_params *ps)
{
    (void)ps;
    return -1;
}
static tg_status dist_step(const dist_state *ds, const mlp *m, tg_tensor *x, tg_tensor *y,
                           int64_t rows, double stats[4])
{
    (void)ds, (void)m, (void)x, (void)y, (void)rows, (void)stats;
    return TG_ERR_INVALID;
}
static tg_status save_params(const dist_state *ds, tg_params *ps, tg_optim *opt, const char *path)
{
    (void)ds;
    return tg_params_save(ps, opt, path);
}
#endif

/* Whether the parameters can be saved to path: creates and removes a file
 * beside it, as the save's temporary file will be, so that a bad --save
 * is found before training rather than after. */
static bool save_path_ok(const char *path)
{
    size_t len = strlen(path);
    char *probe = malloc(len + 16);
    if (!probe) return false;
    snprintf(probe, len + 16, "%s.probe.XXXXXX", path);
    int fd = mkstemp(probe);
    int err = errno;
    if (fd >= 0) {
        close(fd);
        unlink(probe);
    }
    free(probe);
    if (fd < 0) {
        fprintf(stderr, "tapegrad train: cannot write '%s' (--save): %s\n", path, strerror(err));
        return false;
    }
    return true;
}

static int train_run(const train_opts *op, const dist_state *ds);

int cli_train(int argc, char **argv)
{
    train_opts o = {.epochs = 20, .batch = 32, .hidden = 128, .seed = 0, .lr = 1e-3,
                    .data = NULL, .save = "digits-mlp.safetensors"};
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return fputs(train_usage, stdout) < 0 ? CLI_FAIL : CLI_OK;
    if (argc < 2) {
        fputs(train_usage, stderr);
        return CLI_USAGE;
    }
    if (strcmp(argv[1], "digits") != 0) {
        fprintf(stderr, "tapegrad train: unknown data set '%s'; the one bundled is 'digits' (see "
                        "'tapegrad train --help')\n", argv[1]);
        return CLI_USAGE;
    }
    int st = parse(argc, argv, &o);
    if (st) return st;
    dist_state ds = {.rank = 0, .size = 1};
    if (o.dist && (st = dist_begin(&ds)) != CLI_OK) {
        dist_end(&ds);
        return st;
    }
    st = train_run(&o, &ds);
    dist_end(&ds);
    return st;
}

/* The whole job, on this rank with --dist. */
static int train_run(const train_opts *op, const dist_state *ds)
{
    train_opts o = *op;
    /* Rank 0 writes the file: it checks the path, and the others follow. */
    bool path_ok = true;
    if (ds->rank == 0) {
        struct stat sb;
        if (stat(o.save, &sb) == 0 && S_ISDIR(sb.st_mode)) {
            fprintf(stderr, "tapegrad train: cannot write '%s' (--save): it is a directory\n",
                    o.save);
            path_ok = false;
        } else {
            path_ok = save_path_ok(o.save);
        }
    }
    if (!dist_agree(ds, path_ok)) return CLI_FAIL;
    const char *path = o.data;
    if (!path) path = access("data/digits.csv.gz", R_OK) == 0 ? "data/digits.csv.gz"
                                                            : TG_DATA_DIR "/digits.csv.gz";
    tg_set_default_backend(TG_BACKEND_CPU);
    tg_dataset *all = NULL, *train = NULL, *test = NULL;
    if (tg_dataset_load_csv(path, 64, &all)) return cli_lib_error("train", "loading the data");
    if (tg_dataset_split(all, 0.2, (uint64_t)o.seed, &train, &test)) {
        tg_dataset_free(all);
        return cli_lib_error("train", "splitting the data");
    }
    /* Features standardised with the training split's statistics. */
    if (tg_dataset_standardize(train, test)) {
        tg_dataset_free(all);
        tg_dataset_free(train);
        tg_dataset_free(test);
        return cli_lib_error("train", "standardising the data");
    }
    int64_t classes = tg_dataset_classes(all);
    printf("digits: %lld samples (%lld train, %lld test), %lld classes; MLP 64-%lld-%lld ReLU, "
           "Adam lr %g, batch %lld, %lld epochs, seed %lld\n",
           (long long)tg_dataset_size(all), (long long)tg_dataset_size(train),
           (long long)tg_dataset_size(test), (long long)classes, (long long)o.hidden,
           (long long)classes, o.lr, (long long)o.batch, (long long)o.epochs, (long long)o.seed);

    int status = CLI_FAIL;
    mlp m = {0}, m2 = {0};
    tg_optim *opt = NULL;
    tg_tape *tape = NULL;
    tg_batches *it = NULL;
    tg_replicas *rep = NULL;
    shard_ctx sc = {.m = &m};
    float *logits1 = NULL, *logits2 = NULL;
    if (mlp_new(&m, 64, o.hidden, classes, (uint64_t)o.seed + 1)) {
        cli_lib_error("train", "building the model");
        goto out;
    }
    tg_optim_opts oo = tg_optim_defaults(TG_OPTIM_ADAM);
    oo.lr = o.lr;
    opt = tg_optim_new(m.ps, &oo);
    tape = tg_tape_new(NULL);
    if (ds->d) {
        it = tg_batches_new_sharded(train, o.batch, true, (uint64_t)o.seed + 2, ds->rank,
                                    ds->size);
        if (!it) {
            cli_lib_error("train", "sharding the batches (--batch must be at least the ranks)");
            goto out;
        }
        printf("data-parallel: %d MPI ranks, each mini-batch of %lld rows split across them, "
               "gradients averaged\n", ds->size, (long long)o.batch);
    } else {
        it = tg_batches_new(train, o.batch, true, (uint64_t)o.seed + 2);
    }
    if (o.workers > 0) {
        rep = tg_replicas_new(m.ps, &(tg_replicas_opts){.workers = (int)o.workers});
        if (!rep) {
            cli_lib_error("train", "starting the workers");
            goto out;
        }
        printf("data-parallel: %lld worker threads, each mini-batch split across them\n",
               (long long)o.workers);
    }
    if (!opt || !tape || !it || tg_params_requires_grad(m.ps, tape)) {
        cli_lib_error("train", "setting up training");
        goto out;
    }
#ifdef TG_HAVE_MPI
    /* Every rank starts from rank 0's parameters and overlaps the
     * gradient all-reduce with its backward. */
    if (ds->d && (tg_dist_broadcast(ds->d, m.ps, opt) || tg_dist_attach(ds->d, m.ps, tape))) {
        cli_lib_error("train", "starting the replicas");
        goto out;
    }
#endif
    int64_t ntrain = tg_dataset_size(train);
    bool tty = !o.quiet && isatty(STDOUT_FILENO);
    int64_t steps = 0, nb = tg_batches_count(it);
    double t0 = now_s();
    for (int64_t e = 1; e <= o.epochs; e++) {
        double loss_sum = 0;
        int64_t seen = 0, hits = 0, b = 0;
        tg_tensor *x, *y;
        tg_scope_begin();
        while (tg_batches_next(it, &x, &y)) {
            tg_scope_begin();
            tg_optim_zero_grad(opt);
            tg_tensor *logits = NULL, *loss = NULL;
            double lv = 0;
            bool failed;
            double stats[4] = {0}; /* --dist: loss * rows, rows, hits, non-finite */
            if (ds->d) {
                failed = dist_step(ds, &m, x, y, global_rows(ntrain, o.batch, b), stats) ||
                         (stats[3] == 0 && tg_optim_step(opt));
                lv = stats[1] > 0 ? stats[0] / stats[1] : 0;
                if (stats[3] != 0) lv = NAN;
            } else if (rep) {
                /* The replicas' backward runs before the loss is seen:
                 * a non-finite loss still stops before the step. */
                failed = tg_replicas_step(rep, 2, (tg_tensor *[]){x, y}, shard_loss, &sc, &lv) ||
                         (isfinite(lv) && tg_optim_step(opt));
            } else {
                logits = mlp_forward(&m, x);
                loss = tg_cross_entropy(logits, y);
                failed = !loss || tg_tensor_item(loss, &lv) ||
                         (isfinite(lv) && (tg_backward(loss) || tg_optim_step(opt)));
            }
            if (failed) {
                tg_scope_end();
                tg_scope_end();
                cli_lib_error("train", "training step");
                goto out;
            }
            if (!isfinite(lv)) {
                /* Stop before the step: the model is left as the last
                 * finite step made it, and nothing is saved. */
                tg_scope_end();
                tg_scope_end();
                if (tty) printf("\n");
                if (ds->rank == 0)
                    fprintf(stderr,
                            "tapegrad train: the loss is %s at epoch %lld, step %lld (learning "
                            "rate %g too high, or non-finite data?); stopped, nothing saved\n",
                            isnan(lv) ? "NaN" : "infinite", (long long)e, (long long)b + 1, o.lr);
                goto out;
            }
            int64_t bsz = ds->d ? (int64_t)stats[1] : tg_tensor_dim(y, 0);
            loss_sum += lv * (double)bsz;
            seen += bsz;
            if (ds->d)
                hits += (int64_t)stats[2];
            else if (rep)
                for (int k = 0; k < tg_replicas_workers(rep); k++) hits += sc.hits[k];
            else
                hits += correct(tg_detach(logits), y);
            tg_scope_end();
            tg_tape_reset(tape);
            steps++;
            progress(tty, e, o.epochs, ++b, nb, loss_sum / (double)seen,
                     (double)hits / (double)seen);
        }
        tg_scope_end();
        tg_batches_next_epoch(it);
        if (tty)
            printf("\n");
        else if (!o.quiet)
            printf("epoch %3lld/%lld  loss %.4f  train acc %.3f\n", (long long)e,
                   (long long)o.epochs, loss_sum / (double)seen, (double)hits / (double)seen);
    }
    double secs = now_s() - t0;
    double acc1, acc2;
    logits1 = evaluate(&m, test, &acc1);
    if (!logits1) {
        cli_lib_error("train", "evaluating");
        goto out;
    }
    printf("test accuracy %.4f (%lld samples); trained in %.3f s, %.3f ms/step (%lld steps)\n",
           acc1, (long long)tg_dataset_size(test), secs, 1e3 * secs / (double)steps,
           (long long)steps);
    if (!params_finite(m.ps)) {
        fprintf(stderr, "tapegrad train: the trained parameters hold NaN or infinity; not saving "
                        "%s\n", o.save);
        goto out;
    }
    if (ds->d) {
        int same = dist_identical(m.ps);
        if (same < 0) goto out;
        printf("parameters of the %d ranks: %s\n", ds->size, same ? "bitwise identical" : "DIFFER");
        if (!same) {
            fprintf(stderr, "tapegrad train: rank %d: the replicas' parameters differ\n",
                    ds->rank);
            goto out;
        }
    }
    if (save_params(ds, m.ps, opt, o.save)) {
        cli_lib_error("train", "saving the parameters");
        goto out;
    }
    if (ds->rank != 0) { /* the check below reads rank 0's file */
        status = CLI_OK;
        goto out;
    }
    /* A fresh model with other initial values, then the saved ones. */
    if (mlp_new(&m2, 64, o.hidden, classes, (uint64_t)o.seed + 1000) ||
        tg_params_load(m2.ps, NULL, o.save)) {
        cli_lib_error("train", "reloading the parameters");
        goto out;
    }
    logits2 = evaluate(&m2, test, &acc2);
    size_t nlog = (size_t)tg_dataset_size(test) * (size_t)classes * sizeof(float);
    bool same = logits2 && memcmp(logits1, logits2, nlog) == 0 && acc1 == acc2;
    printf("saved %s; reloaded into a fresh model: test accuracy %.4f, logits %s\n", o.save, acc2,
           same ? "bitwise identical" : "DIFFER");
    status = same ? CLI_OK : CLI_FAIL;
out:
    free(logits1);
    free(logits2);
    tg_batches_free(it);
    tg_replicas_free(rep);
    tg_optim_free(opt);
    mlp_free(&m);
    mlp_free(&m2);
    tg_tape_free(tape);
    tg_dataset_free(all);
    tg_dataset_free(train);
    tg_dataset_free(test);
    return status;
}
