/* tapegrad/data.h - in-memory data sets, stratified splits and shuffling
 * mini-batch iterators. Included by <tapegrad.h>; do not include directly. */
#ifndef TAPEGRAD_DATA_H
#define TAPEGRAD_DATA_H

#include "status.h"
#include "tensor.h"

/* Opaque: N samples of F f32 features and one i64 class label each. */
typedef struct tg_dataset tg_dataset;

/* Labels are class indices in [0, TG_DATASET_MAX_CLASSES). */
#define TG_DATASET_MAX_CLASSES 65536

/* Reads a CSV file, plain or gzip-compressed (detected from the content),
 * where every row is nfeatures finite numbers that fit in f32 followed by
 * an integer label in [0, TG_DATASET_MAX_CLASSES). Blank lines are
 * skipped. TG_ERR_IO if the file cannot be read or its gzip data is
 * corrupt, TG_ERR_PARSE (with path:line:column) for a malformed row, a NUL
 * byte or bytes after the gzip stream. On success *out is a new data set
 * (tg_dataset_free). The rules in full: docs/api.md. */
tg_status tg_dataset_load_csv(const char *path, int nfeatures, tg_dataset **out);
/* New data set copying n rows: x (n*nfeatures row-major), y (n labels,
 * each in [0, TG_DATASET_MAX_CLASSES), else TG_ERR_INVALID). */
tg_status tg_dataset_from_arrays(int64_t n, int nfeatures, const float *x, const int64_t *y,
                                 tg_dataset **out);
void tg_dataset_free(tg_dataset *ds);

int64_t tg_dataset_size(const tg_dataset *ds);
int tg_dataset_features(const tg_dataset *ds);
/* 1 + the largest label. */
int64_t tg_dataset_classes(const tg_dataset *ds);
/* Borrowed views of all features (N, F) f32 and labels (N) i64, on the
 * default backend at load time; valid until tg_dataset_free. */
tg_tensor *tg_dataset_x(const tg_dataset *ds);
tg_tensor *tg_dataset_y(const tg_dataset *ds);
/* Multiplies every feature by factor (e.g. 1/16 for the digits pixels). */
void tg_dataset_scale(tg_dataset *ds, float factor);

/* Standardises every feature of ds to zero mean and unit variance with
 * ds's own statistics (population variance, accumulated in f64), and
 * applies the same shift and scale to other (may be NULL), e.g. the test
 * split. A constant feature is only centred. TG_ERR_SHAPE if other has
 * another number of features. */
tg_status tg_dataset_standardize(tg_dataset *ds, tg_dataset *other);

/* Deterministic stratified split: within each class, a seeded shuffle puts
 * round(test_fraction * count) samples in *test and the rest in *train (in
 * their original order). Same seed, same split on every machine. */
tg_status tg_dataset_split(const tg_dataset *ds, double test_fraction, uint64_t seed,
                           tg_dataset **train, tg_dataset **test);

/* Mini-batch iterator over a data set (which must outlive it). With
 * shuffle, each epoch visits the samples in a new seeded order; the last
 * batch of an epoch may be smaller. */
typedef struct tg_batches tg_batches;

tg_batches *tg_batches_new(const tg_dataset *ds, int64_t batch_size, bool shuffle, uint64_t seed);
void tg_batches_free(tg_batches *it);
/* Next batch of the current epoch: *x (B, F) f32 and *y (B) i64 as new
 * references (scope-owned inside a scope). Returns false, setting nothing,
 * when the epoch is over; tg_batches_next_epoch starts the next one. */
bool tg_batches_next(tg_batches *it, tg_tensor **x, tg_tensor **y);
void tg_batches_next_epoch(tg_batches *it);
/* Batches per epoch: ceil(N / batch_size). */
int64_t tg_batches_count(const tg_batches *it);

/* Rank `rank`'s shard of each global batch, for data-parallel training
 * (tapegrad/dist.h; needs no MPI): every rank draws the epoch order that
 * tg_batches_new(ds, global_batch, shuffle, seed) would and takes rows
 * [B*rank/size, B*(rank+1)/size) of each global batch of B rows, so the
 * ranks' shards of step s, in rank order, are exactly that iterator's
 * batch s, and every rank has tg_batches_count() batches, the global
 * count (the ranks stay in step). Shards differ by at most one row; the
 * last batch of an epoch may leave a rank with 0 rows (a (0, F) batch)
 * when it has fewer rows than ranks. TG_ERR_INVALID unless 0 <= rank <
 * size, or for a global_batch < size. */
tg_batches *tg_batches_new_sharded(const tg_dataset *ds, int64_t global_batch, bool shuffle,
                                   uint64_t seed, int rank, int size);

#endif
