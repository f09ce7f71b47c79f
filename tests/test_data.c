/* Data sets: CSV(.gz) loading, stratified splits, shuffled mini-batches. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tapegrad.h>
#include <unistd.h>

static char *digits_path(void)
{
    static char buf[4096];
    const char *root = getenv("TG_SOURCE_ROOT");
    snprintf(buf, sizeof buf, "%s/data/digits.csv.gz", root ? root : ".");
    return buf;
}

static char *write_tmp_n(const char *bytes, size_t n)
{
    static char path[64];
    strcpy(path, "/tmp/tg_data_XXXXXX");
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    cr_assert_eq(write(fd, bytes, n), (ssize_t)n);
    close(fd);
    return path;
}

static char *write_tmp(const char *text)
{
    return write_tmp_n(text, strlen(text));
}

/* Loads n bytes as a CSV of nfeatures; expects status want and, when it is
 * an error, needle in the message. */
static void expect_load(const char *bytes, size_t n, int nfeatures, tg_status want,
                        const char *needle)
{
    char *p = write_tmp_n(bytes, n);
    tg_dataset *ds = (tg_dataset *)1;
    tg_status st = tg_dataset_load_csv(p, nfeatures, &ds);
    unlink(p);
    cr_expect_eq(st, want, "%.*s: status %d (%s), want %d", (int)n, bytes, st,
                 tg_last_error_message(), want);
    if (want != TG_OK) {
        cr_expect_null(ds);
        cr_expect(strstr(tg_last_error_message(), needle) != NULL, "%.*s: '%s' lacks '%s'",
                  (int)n, bytes, tg_last_error_message(), needle);
    }
    tg_dataset_free(want == TG_OK ? ds : NULL);
}
#define EXPECT_LOAD(text, f, want, needle)                                                         \
    expect_load((text), sizeof(text) - 1, (f), (want), (needle))

Test(data, digits_load_with_the_documented_size_and_labels)
{
    tg_dataset *ds = NULL;
    cr_assert_eq(tg_dataset_load_csv(digits_path(), 64, &ds), TG_OK, "%s", tg_last_error_message());
    cr_assert_eq(tg_dataset_size(ds), 1797);
    cr_assert_eq(tg_dataset_features(ds), 64);
    cr_assert_eq(tg_dataset_classes(ds), 10);
    double v;
    /* First row of the file: 0,0,5,13,9,1,0,0,... label 0. */
    cr_assert_eq(tg_tensor_get(tg_dataset_x(ds), 2, &v), TG_OK);
    cr_assert_float_eq(v, 5.0, 1e-12);
    cr_assert_eq(tg_tensor_get(tg_dataset_y(ds), 0, &v), TG_OK);
    cr_assert_float_eq(v, 0.0, 1e-12);
    tg_dataset_free(ds);
}

Test(data, stratified_split_keeps_class_proportions_and_is_deterministic)
{
    tg_dataset *ds, *tr, *te, *tr2, *te2;
    cr_assert_eq(tg_dataset_load_csv(digits_path(), 64, &ds), TG_OK);
    cr_assert_eq(tg_dataset_split(ds, 0.2, 7, &tr, &te), TG_OK);
    cr_assert_eq(tg_dataset_size(tr) + tg_dataset_size(te), 1797);
    int64_t all[10] = {0}, test[10] = {0};
    for (int64_t i = 0; i < 1797; i++) {
        double y;
        tg_tensor_get(tg_dataset_y(ds), i, &y);
        all[(int)y]++;
    }
    for (int64_t i = 0; i < tg_dataset_size(te); i++) {
        double y;
        tg_tensor_get(tg_dataset_y(te), i, &y);
        test[(int)y]++;
    }
    for (int c = 0; c < 10; c++)
        cr_expect_eq(test[c], (int64_t)(0.2 * (double)all[c] + 0.5), "class %d", c);

    cr_assert_eq(tg_dataset_split(ds, 0.2, 7, &tr2, &te2), TG_OK);
    size_t nb = (size_t)tg_dataset_size(te) * 64 * sizeof(float);
    float *a = malloc(nb), *b = malloc(nb);
    tg_tensor_copy_out(tg_dataset_x(te), a, nb);
    tg_tensor_copy_out(tg_dataset_x(te2), b, nb);
    cr_expect_eq(memcmp(a, b, nb), 0, "same seed must give the same split");
    tg_dataset_free(tr2);
    tg_dataset_free(te2);
    cr_assert_eq(tg_dataset_split(ds, 0.2, 8, &tr2, &te2), TG_OK);
    tg_tensor_copy_out(tg_dataset_x(te2), b, nb);
    cr_expect_neq(memcmp(a, b, nb), 0, "another seed should give another split");
    free(a);
    free(b);
    tg_dataset_free(tr2);
    tg_dataset_free(te2);
    tg_dataset_free(tr);
    tg_dataset_free(te);
    tg_dataset_free(ds);
}

Test(data, shuffled_batches_visit_every_sample_once_per_epoch)
{
    enum { N = 10 };
    float x[N];
    int64_t y[N];
    for (int i = 0; i < N; i++) {
        x[i] = (float)i;
        y[i] = i % 3;
    }
    tg_dataset *ds;
    cr_assert_eq(tg_dataset_from_arrays(N, 1, x, y, &ds), TG_OK);
    tg_batches *it = tg_batches_new(ds, 4, true, 3);
    cr_assert_not_null(it);
    cr_assert_eq(tg_batches_count(it), 3);
    int order[2][N];
    for (int epoch = 0; epoch < 2; epoch++) {
        int seen[N] = {0}, k = 0, sizes[3], nb = 0;
        tg_tensor *bx, *by;
        while (tg_batches_next(it, &bx, &by)) {
            sizes[nb++] = (int)tg_tensor_dim(bx, 0);
            for (int64_t i = 0; i < tg_tensor_dim(bx, 0); i++) {
                double v, l;
                tg_tensor_get(bx, i, &v);
                tg_tensor_get(by, i, &l);
                cr_assert_eq((int)l, (int)v % 3, "label travels with its sample");
                seen[(int)v]++;
                order[epoch][k++] = (int)v;
            }
            tg_tensor_release(bx);
            tg_tensor_release(by);
        }
        cr_assert_eq(nb, 3);
        cr_expect_eq(sizes[0], 4);
        cr_expect_eq(sizes[2], 2);
        for (int i = 0; i < N; i++) cr_expect_eq(seen[i], 1, "sample %d", i);
        tg_batches_next_epoch(it);
    }
    cr_expect_neq(memcmp(order[0], order[1], sizeof order[0]), 0, "epochs reshuffle");
    tg_batches_free(it);
    tg_dataset_free(ds);
}

/* Issue 16: the ranks' shards of each step, in rank order, are exactly the
 * unsharded iterator's batch, over two shuffled epochs, for several rank
 * counts (a batch of 7 splits unevenly; the last batch of 23 rows has 2). */
Test(data, sharded_batches_put_together_are_the_unsharded_batches)
{
    enum { N = 23, B = 7 };
    float x[N];
    int64_t y[N];
    for (int i = 0; i < N; i++) {
        x[i] = (float)i;
        y[i] = i % 4;
    }
    tg_dataset *ds;
    cr_assert_eq(tg_dataset_from_arrays(N, 1, x, y, &ds), TG_OK);
    for (int size = 1; size <= 3; size++) {
        tg_batches *whole = tg_batches_new(ds, B, true, 11);
        tg_batches *part[3];
        for (int r = 0; r < size; r++) {
            part[r] = tg_batches_new_sharded(ds, B, true, 11, r, size);
            cr_assert_not_null(part[r], "%s", tg_last_error_message());
            cr_assert_eq(tg_batches_count(part[r]), tg_batches_count(whole));
        }
        for (int epoch = 0; epoch < 2; epoch++) {
            tg_tensor *wx, *wy;
            int steps = 0;
            while (tg_batches_next(whole, &wx, &wy)) {
                int64_t at = 0;
                for (int r = 0; r < size; r++) {
                    tg_tensor *px, *py;
                    cr_assert(tg_batches_next(part[r], &px, &py), "rank %d step %d", r, steps);
                    int64_t rows = tg_tensor_dim(px, 0);
                    int64_t gb = tg_tensor_dim(wx, 0);
                    cr_expect_eq(rows, gb * (r + 1) / size - gb * r / size);
                    for (int64_t i = 0; i < rows; i++) {
                        double a, b, la, lb;
                        tg_tensor_get(px, i, &a);
                        tg_tensor_get(wx, at + i, &b);
                        tg_tensor_get(py, i, &la);
                        tg_tensor_get(wy, at + i, &lb);
                        cr_expect_eq(a, b, "size %d rank %d step %d row %lld", size, r, steps,
                                     (long long)i);
                        cr_expect_eq(la, lb);
                    }
                    at += rows;
                    tg_tensor_release(px);
                    tg_tensor_release(py);
                }
                cr_expect_eq(at, tg_tensor_dim(wx, 0));
                tg_tensor_release(wx);
                tg_tensor_release(wy);
                steps++;
            }
            for (int r = 0; r < size; r++) {
                tg_tensor *px, *py;
                cr_expect_not(tg_batches_next(part[r], &px, &py), "rank %d ends with the epoch", r);
                tg_batches_next_epoch(part[r]);
            }
            tg_batches_next_epoch(whole);
        }
        for (int r = 0; r < size; r++) tg_batches_free(part[r]);
        tg_batches_free(whole);
    }
    cr_expect_null(tg_batches_new_sharded(ds, B, true, 1, 3, 3));
    cr_expect_eq(tg_last_error(), TG_ERR_INVALID);
    cr_expect_null(tg_batches_new_sharded(ds, B, true, 1, -1, 2));
    cr_expect_null(tg_batches_new_sharded(ds, B, true, 1, 0, 0));
    cr_expect_null(tg_batches_new_sharded(ds, 2, true, 1, 0, 3));
    cr_expect(strstr(tg_last_error_message(), "smaller than") != NULL, "%s",
              tg_last_error_message());
    tg_dataset_free(ds);
}

Test(data, plain_and_gzip_files_load_the_same_rows)
{
    char *p = write_tmp("1,2,0\n\n3.5,4,1\n");
    tg_dataset *ds;
    cr_assert_eq(tg_dataset_load_csv(p, 2, &ds), TG_OK, "%s", tg_last_error_message());
    cr_assert_eq(tg_dataset_size(ds), 2);
    cr_assert_eq(tg_dataset_classes(ds), 2);
    double v;
    tg_tensor_get(tg_dataset_x(ds), 2, &v);
    cr_assert_float_eq(v, 3.5, 1e-6);
    tg_dataset_free(ds);
    unlink(p);
}

Test(data, malformed_files_fail_with_specific_codes_and_line_numbers)
{
    tg_dataset *ds = (tg_dataset *)1;
    cr_assert_eq(tg_dataset_load_csv("/nonexistent/digits.csv", 64, &ds), TG_ERR_IO);
    cr_assert_null(ds);
    static const struct { const char *text; const char *needle; } bad[] = {
        {"1,2,0\n1,x,1\n", ":2:"},   /* not a number on line 2 */
        {"1,2\n", ":1:"},            /* missing label */
        {"1,2,3,0\n", ":1:"},        /* too many fields */
        {"1,2,-1\n", "label"},       /* negative label */
        {"1,2,0.5\n", "label"},      /* fractional label */
        {"\n\n", "no data rows"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *p = write_tmp(bad[i].text);
        ds = (tg_dataset *)1;
        cr_expect_eq(tg_dataset_load_csv(p, 2, &ds), TG_ERR_PARSE, "case %zu", i);
        cr_expect_null(ds);
        cr_expect(strstr(tg_last_error_message(), bad[i].needle) != NULL, "case %zu: %s", i,
                  tg_last_error_message());
        unlink(p);
    }
    cr_assert_eq(tg_dataset_load_csv(NULL, 2, &ds), TG_ERR_NULL);
    cr_assert_eq(tg_dataset_load_csv("x", 0, &ds), TG_ERR_INVALID);
}

/* Issue 15 item 2: a label is cast to i64 only once known to be a class
 * index, so NaN, inf and 1e19 are errors naming line and column. */
Test(data, labels_that_are_nan_inf_or_too_large_are_rejected_naming_line_and_column)
{
    EXPECT_LOAD("0,nan\n", 1, TG_ERR_PARSE, ":1:3: field 2 (nan) is not a finite number");
    EXPECT_LOAD("0,1\n0,-inf\n", 1, TG_ERR_PARSE, ":2:3: field 2 (-inf) is not a finite number");
    EXPECT_LOAD("0,1e19\n", 1, TG_ERR_PARSE,
                ":1:3: label 1e+19 is not a class index in [0, 65536)");
    EXPECT_LOAD("0, 9.3e18\n", 1, TG_ERR_PARSE, ":1:4: label");
}

/* Item 3: the class count is bounded (TG_DATASET_MAX_CLASSES), and a split
 * costs the same whatever the largest label is. */
Test(data, class_count_is_bounded_and_split_visits_only_present_classes)
{
    EXPECT_LOAD("0,1e12\n1,0\n", 1, TG_ERR_PARSE, ":1:3: label 1e+12 is not a class index");
    EXPECT_LOAD("0,65536\n", 1, TG_ERR_PARSE, "[0, 65536)");
    int64_t y[4] = {65535, 0, 65535, 0};
    float x[4] = {1, 2, 3, 4};
    tg_dataset *ds = (tg_dataset *)1, *tr, *te;
    int64_t big[1] = {1000000000000};
    cr_assert_eq(tg_dataset_from_arrays(1, 1, x, big, &ds), TG_ERR_INVALID);
    cr_assert_null(ds);
    cr_assert(strstr(tg_last_error_message(), "label 1000000000000 at row 0 is not a class index"));
    cr_assert_eq(tg_dataset_from_arrays(4, 1, x, y, &ds), TG_OK);
    cr_assert_eq(tg_dataset_classes(ds), TG_DATASET_MAX_CLASSES);
    cr_assert_eq(tg_dataset_split(ds, 0.5, 3, &tr, &te), TG_OK);
    cr_assert_eq(tg_dataset_size(tr), 2);
    cr_assert_eq(tg_dataset_size(te), 2);
    double a, b;
    tg_tensor_get(tg_dataset_y(te), 0, &a);
    tg_tensor_get(tg_dataset_y(te), 1, &b);
    cr_assert(a + b == 65535.0, "one test row per class: %g %g", a, b);
    tg_dataset_free(tr);
    tg_dataset_free(te);
    tg_dataset_free(ds);
}

/* Item 14: one rule per quirk (docs/api.md, "data.h"), and every rejection
 * names path:line:column. */
Test(data, csv_quirks_follow_one_documented_rule_each)
{
    /* A NUL byte is an error, not the end of the line. */
    EXPECT_LOAD("0,1\n1,\0002\n", 1, TG_ERR_PARSE, ":2:3: NUL byte");
    /* Features: finite and within f32; below its range they become 0. */
    EXPECT_LOAD("1e-400,0\n", 1, TG_OK, NULL);
    EXPECT_LOAD("1e39,0\n", 1, TG_ERR_PARSE, ":1:1: field 1 (1e+39) does not fit in f32");
    EXPECT_LOAD("0,0\n1000000000000000000000000000000000000000000000000000000000000000000000000"
                "0000000000000000000,1\n", 1, TG_ERR_PARSE, ":2:1: field 1 (1e+91) does not fit");
    EXPECT_LOAD("1e400,0\n", 1, TG_ERR_PARSE, ":1:1: field 1 (1e400) is not a finite number");
    EXPECT_LOAD("nan,0\n", 1, TG_ERR_PARSE, ":1:1: field 1 (nan) is not a finite number");
    EXPECT_LOAD("1,INF,0\n", 2, TG_ERR_PARSE, ":1:3: field 2 (INF) is not a finite number");
    EXPECT_LOAD("1,2;0\n", 2, TG_ERR_PARSE, ":1:4: 2 fields, need 2 features and a label");
    EXPECT_LOAD("1,2,0 x\n", 2, TG_ERR_PARSE, ":1:7: more than 3 fields");
    /* gzip: members may follow one another; anything else after is an error. */
    static const char m1[] = "\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\x03\x33\xd4\x31\xd2\x31\xe0"
                             "\x02\x00\xed\xe7\x33\x2e\x06\x00\x00\x00";
    static const char m2[] = "\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\x03\x33\xd6\x31\xd1\x31\xe4"
                             "\x02\x00\x7b\x28\x8b\x5f\x06\x00\x00\x00";
    char buf[64];
    memcpy(buf, m1, 26);
    expect_load(buf, 26, 2, TG_OK, NULL);
    memcpy(buf + 26, m2, 26);
    char *p = write_tmp_n(buf, 52);
    tg_dataset *ds = NULL;
    cr_assert_eq(tg_dataset_load_csv(p, 2, &ds), TG_OK, "%s", tg_last_error_message());
    cr_assert_eq(tg_dataset_size(ds), 2);
    tg_dataset_free(ds);
    unlink(p);
    memcpy(buf + 26, "junk", 4);
    expect_load(buf, 30, 2, TG_ERR_PARSE, "4 bytes after the end of the gzip stream (at byte 26)");
    expect_load(buf, 20, 2, TG_ERR_IO, "truncated");
}
