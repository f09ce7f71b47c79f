/* libFuzzer target: the CSV(.gz) loader. The first byte picks the feature
 * count (1..4), the rest is the file (plain or gzip, as the bytes say). A
 * data set that loads is split, standardised and batched; every label is
 * a class index below TG_DATASET_MAX_CLASSES and every feature finite. */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <tapegrad.h>

#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    if (size < 1) return 0;
    int nf = 1 + data[0] % 4;
    const char *path = fuzz_file(data + 1, size - 1, ".csv");
    size_t base = tg_mem_current_bytes();
    tg_dataset *ds = (tg_dataset *)&ds;
    tg_status st = tg_dataset_load_csv(path, nf, &ds);
    if (st != TG_OK) {
        FUZZ_CHECK(ds == NULL, "a failed load set *out");
        FUZZ_CHECK(tg_last_error() == st, "status %d, last error %d", st, tg_last_error());
        tg_error_clear();
        FUZZ_CHECK(tg_mem_current_bytes() == base, "a failed load leaked tensor memory");
        return 0;
    }
    int64_t n = tg_dataset_size(ds);
    FUZZ_CHECK(n > 0 && tg_dataset_features(ds) == nf, "%lld rows", (long long)n);
    FUZZ_CHECK(tg_dataset_classes(ds) >= 1 && tg_dataset_classes(ds) <= TG_DATASET_MAX_CLASSES,
               "%lld classes", (long long)tg_dataset_classes(ds));
    const float *x = tg_tensor_data(tg_dataset_x(ds));
    const int64_t *y = tg_tensor_data(tg_dataset_y(ds));
    for (int64_t i = 0; i < n; i++) {
        FUZZ_CHECK(y[i] >= 0 && y[i] < tg_dataset_classes(ds), "label %lld", (long long)y[i]);
        for (int f = 0; f < nf; f++) FUZZ_CHECK(isfinite(x[i * nf + f]), "feature not finite");
    }
    tg_dataset *tr = NULL, *te = NULL;
    if (tg_dataset_split(ds, 0.25, 7, &tr, &te) == TG_OK) {
        FUZZ_CHECK(tg_dataset_size(tr) + tg_dataset_size(te) == n, "the split lost rows");
        tg_dataset_standardize(tr, te);
        tg_batches *it = tg_batches_new(tr, 3, true, 1);
        tg_tensor *bx, *by;
        int64_t seen = 0;
        while (it && tg_batches_next(it, &bx, &by)) {
            seen += tg_tensor_dim(by, 0);
            tg_tensor_release(bx);
            tg_tensor_release(by);
        }
        FUZZ_CHECK(!it || seen == tg_dataset_size(tr), "batches saw %lld rows", (long long)seen);
        tg_batches_free(it);
    }
    tg_dataset_free(tr);
    tg_dataset_free(te);
    tg_dataset_free(ds);
    tg_error_clear();
    FUZZ_CHECK(tg_mem_current_bytes() == base, "tensor memory grew by %zu bytes",
               tg_mem_current_bytes() - base);
    return 0;
}
