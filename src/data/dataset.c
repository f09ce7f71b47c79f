/* Data sets kept as two contiguous tensors, CSV(.gz) loading through zlib
 * (gzread reads plain files too), stratified splits and shuffled batches. */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "core/internal.h"

struct tg_dataset {
    int64_t n;
    int f;
    int64_t classes;
    tg_tensor *x; /* (n, f) f32 */
    tg_tensor *y; /* (n) i64 */
};

struct tg_batches {
    const tg_dataset *ds;
    int64_t batch, pos;
    bool shuffle;
    tg_rng rng;
    int64_t *order;
    int rank, size; /* this iterator's part of each batch (1 part of 1 unsharded) */
};

static tg_status make(int64_t n, int f, tg_dataset **out)
{
    tg_dataset *ds = calloc(1, sizeof *ds);
    if (!ds) return tg__err(TG_ERR_NOMEM, "out of memory for a data set");
    int64_t xs[2] = {n, f};
    ds->n = n;
    ds->f = f;
    ds->x = tg__tensor_empty(TG_F32, 2, xs, tg_default_backend());
    ds->y = ds->x ? tg__tensor_empty(TG_I64, 1, &n, tg_default_backend()) : NULL;
    if (!ds->y) {
        tg_dataset_free(ds);
        return TG_ERR_NOMEM;
    }
    *out = ds;
    return TG_OK;
}

static void count_classes(tg_dataset *ds)
{
    const int64_t *y = tg__tensor_ptr(ds->y);
    ds->classes = 0;
    for (int64_t i = 0; i < ds->n; i++)
        if (y[i] + 1 > ds->classes) ds->classes = y[i] + 1;
}

void tg_dataset_free(tg_dataset *ds)
{
    if (!ds) return;
    tg_tensor_release(ds->x);
    tg_tensor_release(ds->y);
    free(ds);
}

tg_status tg_dataset_from_arrays(int64_t n, int nfeatures, const float *x, const int64_t *y,
                                 tg_dataset **out)
{
    if (!out) return tg__err(TG_ERR_NULL, "bad argument #5 to 'dataset_from_arrays' (NULL out)");
    *out = NULL;
    if (n < 0 || nfeatures < 1)
        return tg__err(TG_ERR_INVALID, "bad argument to 'dataset_from_arrays' (%lld rows of %d "
                                       "features)", (long long)n, nfeatures);
    if (n > 0 && (!x || !y))
        return tg__err(TG_ERR_NULL, "bad argument to 'dataset_from_arrays' (NULL data)");
    for (int64_t i = 0; i < n; i++)
        if (y[i] < 0 || y[i] >= TG_DATASET_MAX_CLASSES)
            return tg__err(TG_ERR_INVALID, "bad argument #4 to 'dataset_from_arrays' (label %lld "
                                           "at row %lld is not a class index in [0, %d))",
                           (long long)y[i], (long long)i, TG_DATASET_MAX_CLASSES);
    tg_dataset *ds;
    tg_status st = make(n, nfeatures, &ds);
    if (st) return st;
    if (n) {
        memcpy(tg__tensor_ptr(ds->x), x, (size_t)(n * nfeatures) * sizeof(float));
        memcpy(tg__tensor_ptr(ds->y), y, (size_t)n * sizeof(int64_t));
    }
    count_classes(ds);
    *out = ds;
    return TG_OK;
}

/* Growable arrays for the parser. */
typedef struct {
    float *x;
    int64_t *y;
    int64_t n, cap;
} rows;

static int rows_push(rows *r, const float *x, int f, int64_t y)
{
    if (r->n == r->cap) {
        int64_t cap = r->cap ? r->cap * 2 : 1024;
        float *nx = realloc(r->x, (size_t)(cap * f) * sizeof *nx);
        if (!nx) return -1;
        r->x = nx;
        int64_t *ny = realloc(r->y, (size_t)cap * sizeof *ny);
        if (!ny) return -1;
        r->y = ny;
        r->cap = cap;
    }
    memcpy(r->x + r->n * f, x, (size_t)f * sizeof *x);
    r->y[r->n++] = y;
    return 0;
}

/* The bytes of a CSV file: plain, or gzip members decoded with inflate.
 * Not gzread: it drops what follows the last member without a word, and
 * its lines (gzgets) end at a NUL byte, losing the rest of the line. */
#define SRC_BUF (1 << 16)
typedef struct {
    FILE *f;
    const char *path;
    bool gz, member;  /* gzip file; inside a member (more output due) */
    bool eof;
    z_stream zs;
    bool zinit;
    long long in_used; /* compressed bytes consumed before in[] */
    size_t pos, len;   /* unread decoded bytes: out[pos..len) */
    unsigned char in[SRC_BUF];
    unsigned char out[SRC_BUF];
} src;

static tg_status src_read_in(src *s, size_t *got)
{
    s->in_used += (long long)(s->zs.next_in ? s->zs.next_in - s->in : 0);
    *got = fread(s->in, 1, SRC_BUF, s->f);
    s->zs.next_in = s->in;
    s->zs.avail_in = (uInt)*got;
    if (*got == 0 && ferror(s->f))
        return tg__err(TG_ERR_IO, "cannot read '%s': %s", s->path, strerror(errno ? errno : EIO));
    return TG_OK;
}

/* Refills out[]; sets eof at the end of the data. */
static tg_status src_fill(src *s)
{
    s->pos = s->len = 0;
    if (!s->gz) {
        s->len = fread(s->out, 1, SRC_BUF, s->f);
        if (s->len == 0 && ferror(s->f))
            return tg__err(TG_ERR_IO, "cannot read '%s': %s", s->path,
                           strerror(errno ? errno : EIO));
        s->eof = s->len == 0;
        return TG_OK;
    }
    while (s->len == 0) {
        size_t got = 1;
        if (s->zs.avail_in == 0) {
            tg_status st = src_read_in(s, &got);
            if (st) return st;
        }
        if (got == 0) {
            if (s->member)
                return tg__err(TG_ERR_IO, "cannot read '%s': the gzip stream is truncated",
                               s->path);
            s->eof = true;
            return TG_OK;
        }
        if (!s->member) {
            /* Another member may follow one that ended; anything else is
             * trailing garbage, rejected rather than ignored. */
            if (s->zs.next_in[0] != 0x1f)
                return tg__err(TG_ERR_PARSE, "%s: %lld bytes after the end of the gzip stream "
                                             "(at byte %lld)", s->path,
                               (long long)s->zs.avail_in, s->in_used +
                               (long long)(s->zs.next_in - s->in));
            if (inflateReset(&s->zs) != Z_OK)
                return tg__err(TG_ERR_IO, "cannot read '%s': inflateReset failed", s->path);
            s->member = true;
        }
        s->zs.next_out = s->out;
        s->zs.avail_out = SRC_BUF;
        int rc = inflate(&s->zs, Z_NO_FLUSH);
        s->len = SRC_BUF - s->zs.avail_out;
        if (rc == Z_STREAM_END)
            s->member = false;
        else if (rc == Z_MEM_ERROR)
            return tg__err(TG_ERR_NOMEM, "out of memory decompressing '%s'", s->path);
        else if (rc != Z_OK && rc != Z_BUF_ERROR)
            return tg__err(TG_ERR_IO, "cannot read '%s': %s", s->path,
                           s->zs.msg ? s->zs.msg : "corrupt gzip data");
    }
    return TG_OK;
}

static tg_status src_open(src *s, const char *path)
{
    s->path = path;
    s->f = fopen(path, "rb");
    if (!s->f) return tg__err(TG_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    unsigned char magic[2];
    size_t n = fread(magic, 1, 2, s->f);
    s->gz = n == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
    if (fseek(s->f, 0, SEEK_SET) != 0) { /* a pipe: keep the two bytes */
        if (s->gz) return tg__err(TG_ERR_IO, "cannot read '%s': not seekable", path);
        memcpy(s->out, magic, n);
        s->len = n;
        return TG_OK;
    }
    if (s->gz) {
        if (inflateInit2(&s->zs, 16 + MAX_WBITS) != Z_OK)
            return tg__err(TG_ERR_NOMEM, "out of memory decompressing '%s'", path);
        s->zinit = true;
        s->member = true;
    }
    return TG_OK;
}

static void src_close(src *s)
{
    if (s->zinit) inflateEnd(&s->zs);
    if (s->f) fclose(s->f);
}

/* Reads one line (with its '\n' if any) into line[0..*n); *n == 0 at the
 * end. A line of cap bytes or more is an error. */
static tg_status src_line(src *s, int64_t lineno, char *line, size_t cap, size_t *n)
{
    *n = 0;
    for (;;) {
        if (s->pos == s->len) {
            if (s->eof) return TG_OK;
            tg_status st = src_fill(s);
            if (st) return st;
            if (s->eof) return TG_OK;
        }
        const unsigned char *p = s->out + s->pos;
        size_t avail = s->len - s->pos;
        const unsigned char *nl = memchr(p, '\n', avail);
        size_t take = nl ? (size_t)(nl - p) + 1 : avail;
        if (*n + take >= cap)
            return tg__err(TG_ERR_PARSE, "%s:%lld: line longer than %zu bytes", s->path,
                           (long long)lineno, cap - 1);
        memcpy(line + *n, p, take);
        *n += take;
        s->pos += take;
        if (nl) return TG_OK;
    }
}

static bool is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\r';
}

/* Parses one CSV row of f features and a label; line is NUL-terminated.
 * The rules (docs/api.md, data.h): fields are numbers as strtod reads
 * them; features must be finite and fit in f32 (values below its range
 * become 0 or subnormal); the label is an integer in [0,
 * TG_DATASET_MAX_CLASSES). Every error names path:line:column. */
static tg_status parse_row(const char *path, int64_t lineno, const char *line, int f,
                           float *feat, int64_t *label)
{
    const char *p = line;
    char *end;
    for (int i = 0; i <= f; i++) {
        while (is_space(*p)) p++;
        long long col = (long long)(p - line) + 1;
        errno = 0;
        double v = strtod(p, &end);
        if (end == p)
            return tg__err(TG_ERR_PARSE, "%s:%lld:%lld: field %d is not a number (need %d "
                                         "features and a label)", path, (long long)lineno, col,
                           i + 1, f);
        if (!isfinite(v))
            return tg__err(TG_ERR_PARSE, "%s:%lld:%lld: field %d (%.*s) is not a finite number",
                           path, (long long)lineno, col, i + 1, (int)(end - p < 40 ? end - p : 40),
                           p);
        while (is_space(*end)) end++;
        if (i < f) {
            if (*end != ',')
                return tg__err(TG_ERR_PARSE, "%s:%lld:%lld: %d fields, need %d features and a "
                                             "label", path, (long long)lineno,
                               (long long)(end - line) + 1, i + 1, f);
            if (fabs(v) > FLT_MAX)
                return tg__err(TG_ERR_PARSE, "%s:%lld:%lld: field %d (%g) does not fit in f32",
                               path, (long long)lineno, col, i + 1, v);
            feat[i] = (float)v;
            p = end + 1;
        } else {
            if (*end != '\0' && *end != '\n')
                return tg__err(TG_ERR_PARSE, "%s:%lld:%lld: more than %d fields", path,
                               (long long)lineno, (long long)(end - line) + 1, f + 1);
            /* Range first: the cast is only defined for values that fit. */
            if (!(v >= 0 && v < TG_DATASET_MAX_CLASSES) || v != floor(v))
                return tg__err(TG_ERR_PARSE, "%s:%lld:%lld: label %g is not a class index in "
                                             "[0, %d)", path, (long long)lineno, col, v,
                               TG_DATASET_MAX_CLASSES);
            *label = (int64_t)v;
        }
    }
    return TG_OK;
}

tg_status tg_dataset_load_csv(const char *path, int nfeatures, tg_dataset **out)
{
    if (!out) return tg__err(TG_ERR_NULL, "bad argument #3 to 'dataset_load_csv' (NULL out)");
    *out = NULL;
    if (!path) return tg__err(TG_ERR_NULL, "bad argument #1 to 'dataset_load_csv' (NULL path)");
    if (nfeatures < 1 || nfeatures > (1 << 20))
        return tg__err(TG_ERR_INVALID, "bad argument #2 to 'dataset_load_csv' (%d features)",
                       nfeatures);
    src *s = calloc(1, sizeof *s);
    if (!s) return tg__err(TG_ERR_NOMEM, "out of memory reading '%s'", path);
    tg_status st = src_open(s, path);
    size_t cap = (size_t)nfeatures * 32 + 64;
    char *line = malloc(cap);
    float *feat = malloc((size_t)nfeatures * sizeof *feat);
    rows r = {0};
    if (!st && !(line && feat)) st = tg__err(TG_ERR_NOMEM, "out of memory reading '%s'", path);
    int64_t lineno = 0;
    while (!st) {
        size_t len;
        st = src_line(s, lineno + 1, line, cap, &len);
        if (st || len == 0) break;
        lineno++;
        const char *nul = memchr(line, '\0', len);
        if (nul) {
            st = tg__err(TG_ERR_PARSE, "%s:%lld:%lld: NUL byte", path, (long long)lineno,
                         (long long)(nul - line) + 1);
            break;
        }
        line[len] = '\0';
        const char *t = line;
        while (is_space(*t) || *t == '\n') t++;
        if (!*t) continue;
        int64_t label = 0;
        st = parse_row(path, lineno, line, nfeatures, feat, &label);
        if (!st && rows_push(&r, feat, nfeatures, label))
            st = tg__err(TG_ERR_NOMEM, "out of memory reading '%s'", path);
    }
    src_close(s);
    free(s);
    if (!st && r.n == 0) st = tg__err(TG_ERR_PARSE, "%s: no data rows", path);
    if (!st) st = tg_dataset_from_arrays(r.n, nfeatures, r.x, r.y, out);
    free(r.x);
    free(r.y);
    free(line);
    free(feat);
    return st;
}

int64_t tg_dataset_size(const tg_dataset *ds)
{
    return ds ? ds->n : 0;
}

int tg_dataset_features(const tg_dataset *ds)
{
    return ds ? ds->f : 0;
}

int64_t tg_dataset_classes(const tg_dataset *ds)
{
    return ds ? ds->classes : 0;
}

tg_tensor *tg_dataset_x(const tg_dataset *ds)
{
    return ds ? ds->x : NULL;
}

tg_tensor *tg_dataset_y(const tg_dataset *ds)
{
    return ds ? ds->y : NULL;
}

void tg_dataset_scale(tg_dataset *ds, float factor)
{
    if (!ds) return;
    float *x = tg__tensor_ptr(ds->x);
    for (int64_t i = 0; i < ds->n * ds->f; i++) x[i] *= factor;
}

tg_status tg_dataset_standardize(tg_dataset *ds, tg_dataset *other)
{
    if (!ds) return tg__err(TG_ERR_NULL, "bad argument #1 to 'dataset_standardize' (NULL)");
    if (other && other->f != ds->f)
        return tg__err(TG_ERR_SHAPE, "bad argument #2 to 'dataset_standardize' (%d features, "
                                     "need %d)", other->f, ds->f);
    float *x = tg__tensor_ptr(ds->x);
    for (int f = 0; f < ds->f; f++) {
        double mean = 0.0, var = 0.0;
        for (int64_t i = 0; i < ds->n; i++) mean += x[i * ds->f + f];
        mean = ds->n ? mean / (double)ds->n : 0.0;
        for (int64_t i = 0; i < ds->n; i++) {
            double d = x[i * ds->f + f] - mean;
            var += d * d;
        }
        double sd = ds->n ? sqrt(var / (double)ds->n) : 0.0;
        double inv = sd > 1e-12 ? 1.0 / sd : 1.0;
        tg_dataset *sets[2] = {ds, other};
        for (int k = 0; k < 2; k++) {
            if (!sets[k]) continue;
            float *y = tg__tensor_ptr(sets[k]->x);
            for (int64_t i = 0; i < sets[k]->n; i++)
                y[i * ds->f + f] = (float)((y[i * ds->f + f] - mean) * inv);
        }
    }
    return TG_OK;
}

static void shuffle(int64_t *v, int64_t n, tg_rng *rng)
{
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(tg_rng_next(rng) % (uint64_t)(i + 1));
        int64_t t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
}

/* New data set of the rows listed in idx (in that order). */
static tg_status subset(const tg_dataset *ds, const int64_t *idx, int64_t n, tg_dataset **out)
{
    tg_status st = make(n, ds->f, out);
    if (st) return st;
    const float *x = tg__tensor_ptr(ds->x);
    const int64_t *y = tg__tensor_ptr(ds->y);
    float *ox = tg__tensor_ptr((*out)->x);
    int64_t *oy = tg__tensor_ptr((*out)->y);
    for (int64_t i = 0; i < n; i++) {
        memcpy(ox + i * ds->f, x + idx[i] * ds->f, (size_t)ds->f * sizeof *x);
        oy[i] = y[idx[i]];
    }
    (*out)->classes = ds->classes;
    return TG_OK;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* (label, row) pairs, sorted so that each class's rows are together and in
 * their original order: the split visits the classes present, not every
 * index below the largest label. */
typedef struct {
    int64_t y, i;
} labelled;

static int cmp_labelled(const void *a, const void *b)
{
    const labelled *p = a, *q = b;
    if (p->y != q->y) return (p->y > q->y) - (p->y < q->y);
    return (p->i > q->i) - (p->i < q->i);
}

tg_status tg_dataset_split(const tg_dataset *ds, double test_fraction, uint64_t seed,
                           tg_dataset **train, tg_dataset **test)
{
    if (!ds || !train || !test) return tg__err(TG_ERR_NULL, "bad argument to 'dataset_split' (NULL)");
    *train = *test = NULL;
    if (!(test_fraction >= 0.0 && test_fraction <= 1.0))
        return tg__err(TG_ERR_INVALID, "bad argument #2 to 'dataset_split' (test fraction %g "
                                       "outside [0,1])", test_fraction);
    const int64_t *y = tg__tensor_ptr(ds->y);
    int64_t n = ds->n, *by_class = malloc((size_t)(n ? n : 1) * sizeof *by_class);
    int64_t *tr = malloc((size_t)(n ? n : 1) * sizeof *tr), *te = malloc((size_t)(n ? n : 1) * sizeof *te);
    labelled *order = malloc((size_t)(n ? n : 1) * sizeof *order);
    tg_status st = TG_OK;
    if (!by_class || !tr || !te || !order) st = tg__err(TG_ERR_NOMEM, "out of memory in split");
    int64_t ntr = 0, nte = 0;
    tg_rng rng;
    tg_rng_seed(&rng, seed);
    if (!st) {
        for (int64_t i = 0; i < n; i++) order[i] = (labelled){y[i], i};
        qsort(order, (size_t)n, sizeof *order, cmp_labelled);
    }
    /* Per class in increasing order, as the rng draws are part of the
     * result: an absent class draws nothing. */
    for (int64_t g = 0; g < n && !st;) {
        int64_t m = 0;
        for (int64_t c = order[g].y; g < n && order[g].y == c; g++) by_class[m++] = order[g].i;
        shuffle(by_class, m, &rng);
        int64_t k = (int64_t)(test_fraction * (double)m + 0.5);
        for (int64_t i = 0; i < m; i++) {
            if (i < k)
                te[nte++] = by_class[i];
            else
                tr[ntr++] = by_class[i];
        }
    }
    if (!st) {
        qsort(tr, (size_t)ntr, sizeof *tr, cmp_i64);
        qsort(te, (size_t)nte, sizeof *te, cmp_i64);
        st = subset(ds, tr, ntr, train);
        if (!st) st = subset(ds, te, nte, test);
        if (st) {
            tg_dataset_free(*train);
            *train = NULL;
        }
    }
    free(order);
    free(by_class);
    free(tr);
    free(te);
    return st;
}

static tg_batches *batches_new(const tg_dataset *ds, int64_t batch_size, bool shuf,
                               uint64_t seed, int rank, int size, const char *op)
{
    if (!ds) {
        tg__err(TG_ERR_NULL, "bad argument #1 to '%s' (NULL data set)", op);
        return NULL;
    }
    if (batch_size < 1) {
        tg__err(TG_ERR_INVALID, "bad argument #2 to '%s' (batch size %lld)", op,
                (long long)batch_size);
        return NULL;
    }
    if (size < 1 || rank < 0 || rank >= size) {
        tg__err(TG_ERR_INVALID, "bad argument #5 to '%s' (rank %d of %d; need 0 <= rank < "
                                "size)", op, rank, size);
        return NULL;
    }
    if (batch_size < size) {
        tg__err(TG_ERR_INVALID, "bad argument #2 to '%s' (global batch %lld is smaller than "
                                "the %d ranks)", op, (long long)batch_size, size);
        return NULL;
    }
    tg_batches *it = calloc(1, sizeof *it);
    if (it) it->order = malloc((size_t)(ds->n ? ds->n : 1) * sizeof *it->order);
    if (!it || !it->order) {
        free(it);
        tg__err(TG_ERR_NOMEM, "out of memory for a batch iterator");
        return NULL;
    }
    it->ds = ds;
    it->batch = batch_size;
    it->shuffle = shuf;
    it->rank = rank;
    it->size = size;
    tg_rng_seed(&it->rng, seed);
    for (int64_t i = 0; i < ds->n; i++) it->order[i] = i;
    tg_batches_next_epoch(it);
    return it;
}

tg_batches *tg_batches_new(const tg_dataset *ds, int64_t batch_size, bool shuf, uint64_t seed)
{
    return batches_new(ds, batch_size, shuf, seed, 0, 1, "batches_new");
}

/* Every rank draws the whole seeded order, as tg_batches_new does, and
 * keeps its rows of each batch: no communication, and the union over the
 * ranks of batch s is the unsharded batch s. */
tg_batches *tg_batches_new_sharded(const tg_dataset *ds, int64_t global_batch, bool shuf,
                                   uint64_t seed, int rank, int size)
{
    return batches_new(ds, global_batch, shuf, seed, rank, size, "batches_new_sharded");
}

void tg_batches_free(tg_batches *it)
{
    if (!it) return;
    free(it->order);
    free(it);
}

void tg_batches_next_epoch(tg_batches *it)
{
    if (!it) return;
    it->pos = 0;
    if (it->shuffle) shuffle(it->order, it->ds->n, &it->rng);
}

int64_t tg_batches_count(const tg_batches *it)
{
    return it ? (it->ds->n + it->batch - 1) / it->batch : 0;
}

bool tg_batches_next(tg_batches *it, tg_tensor **x, tg_tensor **y)
{
    if (!it || !x || !y || it->pos >= it->ds->n) return false;
    const tg_dataset *ds = it->ds;
    int64_t gb = ds->n - it->pos < it->batch ? ds->n - it->pos : it->batch;
    /* This rank's rows [gb*rank/size, gb*(rank+1)/size) of the batch. */
    int64_t r0 = gb * it->rank / it->size;
    int64_t b = gb * (it->rank + 1) / it->size - r0;
    int64_t xs[2] = {b, ds->f};
    tg_tensor *bx = tg__tensor_empty(TG_F32, 2, xs, ds->x->backend);
    tg_tensor *by = bx ? tg__tensor_empty(TG_I64, 1, &b, ds->y->backend) : NULL;
    if (!by) {
        tg_tensor_release(bx);
        return false;
    }
    const float *sx = tg__tensor_ptr(ds->x);
    const int64_t *sy = tg__tensor_ptr(ds->y);
    float *dx = tg__tensor_ptr(bx);
    int64_t *dy = tg__tensor_ptr(by);
    for (int64_t i = 0; i < b; i++) {
        int64_t r = it->order[it->pos + r0 + i];
        memcpy(dx + i * ds->f, sx + r * ds->f, (size_t)ds->f * sizeof *sx);
        dy[i] = sy[r];
    }
    it->pos += gb;
    *x = tg__scope_track(bx);
    *y = tg__scope_track(by);
    return *x && *y;
}
