/* test_tensor.c - backend tensors: creation, the seeded generator, layout,
 * accessors, views and the storage byte counters. */
#include <criterion/criterion.h>
#include <tapegrad.h>

#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- creation */

Test(tensor, from_data_copies_the_source_buffer)
{
    double src[6] = {1, 2, 3, 4, 5, 6};
    tg_tensor *t = tg_tensor_from_data(TG_F64, 2, SHAPE(2, 3), src);
    tu_expect_shape(t, 2, SHAPE(2, 3));
    cr_assert_eq(tg_tensor_dtype(t), TG_F64);
    for (int i = 0; i < 6; i++) src[i] = -100.0;
    const double want[6] = {1, 2, 3, 4, 5, 6};
    tu_expect_values(t, want, 6, 1e-15);
    cr_assert(tg_tensor_is_contiguous(t));
    cr_assert_eq(tg_tensor_backend(t), tg_default_backend());
    tg_tensor_release(t);
}

Test(tensor, from_data_works_for_f32_and_i64)
{
    const float f[3] = {0.5f, -1.25f, 3.0f};
    const int64_t l[3] = {-7, 0, 1234567890123LL};
    tg_tensor *tf = tg_tensor_from_data(TG_F32, 1, SHAPE(3), f);
    tg_tensor *tl = tg_tensor_from_data(TG_I64, 1, SHAPE(3), l);
    tu_expect_values(tf, (const double[]){0.5, -1.25, 3.0}, 3, 1e-15);
    tu_expect_values(tl, (const double[]){-7, 0, 1234567890123.0}, 3, 1e-15);
    cr_assert_eq(tg_tensor_dtype(tf), TG_F32);
    cr_assert_eq(tg_tensor_dtype(tl), TG_I64);
    tg_tensor_release(tf);
    tg_tensor_release(tl);
}

Test(tensor, from_data_with_null_data_fails_with_null)
{
    tg_error_clear();
    cr_assert_null(tg_tensor_from_data(TG_F64, 1, SHAPE(3), NULL));
    cr_assert_eq(tg_last_error(), TG_ERR_NULL);
}

Test(tensor, zeros_ones_and_full_fill_every_element)
{
    tg_tensor *z = tg_zeros(TG_F64, 2, SHAPE(2, 2));
    tg_tensor *o = tg_ones(TG_F32, 1, SHAPE(3));
    tg_tensor *f = tg_full(TG_F64, 3, SHAPE(1, 2, 2), -2.5);
    tg_tensor *fi = tg_full(TG_I64, 1, SHAPE(2), 7.0);
    tu_expect_values(z, (const double[]){0, 0, 0, 0}, 4, 1e-15);
    tu_expect_values(o, (const double[]){1, 1, 1}, 3, 1e-15);
    tu_expect_values(f, (const double[]){-2.5, -2.5, -2.5, -2.5}, 4, 1e-15);
    tu_expect_values(fi, (const double[]){7, 7}, 2, 1e-15);
    tu_expect_shape(f, 3, SHAPE(1, 2, 2));
    tg_tensor_release(z);
    tg_tensor_release(o);
    tg_tensor_release(f);
    tg_tensor_release(fi);
}

Test(tensor, scalar_is_zero_dimensional_with_one_element)
{
    tg_tensor *s = tg_scalar(TG_F64, 3.75);
    cr_assert_not_null(s);
    cr_assert_eq(tg_tensor_ndim(s), 0);
    cr_assert_eq(tg_tensor_numel(s), 1);
    double v = 0;
    cr_assert_eq(tg_tensor_item(s, &v), TG_OK);
    cr_assert(fabs(v - 3.75) < 1e-15, "item %g", v);
    tg_tensor_release(s);
}

Test(tensor, item_of_a_multi_element_tensor_fails_with_shape)
{
    tg_tensor *t = tg_zeros(TG_F64, 1, SHAPE(2));
    double v;
    tg_error_clear();
    cr_assert_eq(tg_tensor_item(t, &v), TG_ERR_SHAPE);
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE);
    tg_tensor_release(t);
}

Test(tensor, arange_counts_up_to_stop_exclusive)
{
    tg_tensor *a = tg_arange(TG_F64, 0.0, 5.0, 1.0);
    tu_expect_shape(a, 1, SHAPE(5));
    tu_expect_values(a, (const double[]){0, 1, 2, 3, 4}, 5, 1e-15);
    tg_tensor *b = tg_arange(TG_F64, 1.0, 2.0, 0.25);
    tu_expect_values(b, (const double[]){1.0, 1.25, 1.5, 1.75}, 4, 1e-15);
    tg_tensor_release(a);
    tg_tensor_release(b);
}

Test(tensor, arange_with_negative_step_counts_down)
{
    tg_tensor *a = tg_arange(TG_F64, 5.0, 0.0, -1.5);
    tu_expect_shape(a, 1, SHAPE(4));
    tu_expect_values(a, (const double[]){5.0, 3.5, 2.0, 0.5}, 4, 1e-15);
    tg_tensor *i = tg_arange(TG_I64, 3.0, -1.0, -1.0);
    tu_expect_values(i, (const double[]){3, 2, 1, 0}, 4, 1e-15);
    tg_tensor_release(a);
    tg_tensor_release(i);
}

Test(tensor, arange_with_an_empty_range_has_zero_elements)
{
    tg_tensor *a = tg_arange(TG_F64, 0.0, 0.0, 1.0);
    tg_tensor *b = tg_arange(TG_F64, 3.0, 1.0, 1.0);  /* wrong direction */
    tg_tensor *c = tg_arange(TG_F64, 1.0, 3.0, -1.0); /* wrong direction */
    tu_expect_shape(a, 1, SHAPE(0));
    tu_expect_shape(b, 1, SHAPE(0));
    tu_expect_shape(c, 1, SHAPE(0));
    cr_assert_eq(tg_tensor_numel(a) + tg_tensor_numel(b) + tg_tensor_numel(c), 0);
    tg_tensor_release(a);
    tg_tensor_release(b);
    tg_tensor_release(c);
}

Test(tensor, arange_with_zero_step_fails_with_invalid)
{
    tg_error_clear();
    cr_assert_null(tg_arange(TG_F64, 0.0, 1.0, 0.0));
    cr_assert_eq(tg_last_error(), TG_ERR_INVALID);
}

Test(tensor, eight_dims_are_accepted)
{
    const int64_t shape[8] = {1, 2, 1, 2, 1, 2, 1, 3};
    tg_tensor *t = tg_ones(TG_F64, 8, shape);
    tu_expect_shape(t, 8, shape);
    cr_assert_eq(tg_tensor_numel(t), 24);
    cr_assert_eq(tg_tensor_dim(t, -1), 3);
    cr_assert_eq(tg_tensor_dim(t, 7), 3);
    cr_assert_eq(tg_tensor_dim(t, 8), -1);
    cr_assert_eq(tg_tensor_dim(t, -9), -1);
    tg_tensor_release(t);
}

Test(tensor, nine_dims_are_rejected_with_shape)
{
    const int64_t shape[9] = {1, 1, 1, 1, 1, 1, 1, 1, 2};
    const double data[2] = {1, 2};
    tg_error_clear();
    cr_assert_null(tg_zeros(TG_F64, 9, shape));
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE);
    tg_error_clear();
    cr_assert_null(tg_tensor_from_data(TG_F64, 9, shape, data));
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE);
    tg_error_clear();
    cr_assert_null(tg_full(TG_F64, -1, shape, 0.0));
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE);
}

Test(tensor, negative_dim_sizes_are_rejected_with_shape)
{
    tg_error_clear();
    cr_assert_null(tg_zeros(TG_F64, 2, SHAPE(2, -3)));
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE);
    cr_assert(strstr(tg_last_error_message(), "-3") != NULL, "message: %s",
              tg_last_error_message());
    tg_error_clear();
    cr_assert_null(tg_ones(TG_F32, 1, SHAPE(-1)));
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE);
}

Test(tensor, invalid_dtype_is_rejected_with_dtype)
{
    tg_error_clear();
    cr_assert_null(tg_zeros((tg_dtype)7, 1, SHAPE(2)));
    cr_assert_eq(tg_last_error(), TG_ERR_DTYPE);
}

Test(tensor, dtype_and_backend_names_and_sizes)
{
    cr_assert_str_eq(tg_dtype_name(TG_F32), "f32");
    cr_assert_str_eq(tg_dtype_name(TG_F64), "f64");
    cr_assert_str_eq(tg_dtype_name(TG_I64), "i64");
    cr_assert_str_eq(tg_backend_name(TG_BACKEND_REF), "ref");
    cr_assert_str_eq(tg_backend_name(TG_BACKEND_CPU), "cpu");
    cr_assert_eq(tg_dtype_size(TG_F32), 4);
    cr_assert_eq(tg_dtype_size(TG_F64), 8);
    cr_assert_eq(tg_dtype_size(TG_I64), 8);
    cr_assert_eq(tg_dtype_size((tg_dtype)9), 0);
}

Test(tensor, default_backend_applies_to_creation)
{
    cr_assert_eq(tg_default_backend(), TG_BACKEND_CPU);
    tg_backend prev = tg_set_default_backend(TG_BACKEND_REF);
    cr_assert_eq(prev, TG_BACKEND_CPU);
    tg_tensor *t = tg_zeros(TG_F64, 1, SHAPE(2));
    cr_assert_eq(tg_tensor_backend(t), TG_BACKEND_REF);
    tg_set_default_backend(prev);
    tg_tensor *u = tg_zeros(TG_F64, 1, SHAPE(2));
    cr_assert_eq(tg_tensor_backend(u), TG_BACKEND_CPU);
    tg_tensor_release(t);
    tg_tensor_release(u);
}

Test(tensor, shape_str_formats_brackets_and_commas)
{
    char buf[64];
    cr_assert_str_eq(tg_shape_str(3, SHAPE(2, 3, 4), buf, sizeof buf), "[2,3,4]");
    cr_assert_str_eq(tg_shape_str(0, NULL, buf, sizeof buf), "[]");
    /* issue 15: a rank with a NULL shape is named, not dereferenced */
    cr_assert_str_eq(tg_shape_str(2, NULL, buf, 16), "[?]");
}

/* ---- the seeded generator */

/* Reference xoshiro256** seeded through splitmix64, written from the
 * published algorithms (Vigna), independent of the library. */
static uint64_t ref_splitmix64(uint64_t *x)
{
    uint64_t z = (*x += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

static uint64_t ref_rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static uint64_t ref_xoshiro_next(uint64_t s[4])
{
    const uint64_t result = ref_rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = ref_rotl(s[3], 45);
    return result;
}

Test(tensor, rng_stream_for_seed_42_matches_the_reference_algorithm)
{
    uint64_t x = 42, s[4];
    for (int i = 0; i < 4; i++) s[i] = ref_splitmix64(&x);
    /* The same values computed by a separate Python implementation, so a
     * shared misreading of the algorithm would still be caught. */
    const uint64_t golden[5] = {
        UINT64_C(0x15780b2e0c2ec716), UINT64_C(0x6104d9866d113a7e), UINT64_C(0xae17533239e499a1),
        UINT64_C(0xecb8ad4703b360a1), UINT64_C(0xfde6dc7fe2ec5e64),
    };
    tg_rng rng;
    tg_rng_seed(&rng, 42);
    for (int i = 0; i < 5; i++) {
        uint64_t want = ref_xoshiro_next(s);
        cr_assert_eq(want, golden[i], "reference draw %d", i);
        uint64_t got = tg_rng_next(&rng);
        cr_assert_eq(got, want, "draw %d: 0x%016llx, expected 0x%016llx", i,
                     (unsigned long long)got, (unsigned long long)want);
    }
    for (int i = 5; i < 1000; i++)
        cr_assert_eq(tg_rng_next(&rng), ref_xoshiro_next(s), "draw %d", i);
}

Test(tensor, rng_double_uses_the_top_53_bits)
{
    tg_rng a, b;
    tg_rng_seed(&a, 7);
    tg_rng_seed(&b, 7);
    for (int i = 0; i < 100; i++) {
        double d = tg_rng_double(&a);
        double want = (double)(tg_rng_next(&b) >> 11) * 0x1.0p-53;
        cr_assert(d >= 0.0 && d < 1.0, "draw %d = %g outside [0,1)", i, d);
        cr_assert(fabs(d - want) < 1e-16, "draw %d = %.17g, expected %.17g", i, d, want);
    }
}

Test(tensor, rand_uniform_with_the_same_seed_gives_the_same_tensor)
{
    tg_rng r1, r2;
    tg_rng_seed(&r1, 123);
    tg_rng_seed(&r2, 123);
    tg_tensor *a = tg_rand_uniform(&r1, TG_F64, 2, SHAPE(4, 5), -2.0, 3.0);
    tg_tensor *b = tg_rand_uniform(&r2, TG_F64, 2, SHAPE(4, 5), -2.0, 3.0);
    cr_assert_not_null(a);
    cr_assert_not_null(b);
    /* bit-identical, not merely close */
    cr_assert_eq(memcmp(tg_tensor_data(a), tg_tensor_data(b), 20 * sizeof(double)), 0,
                 "the same seed gave different bits");
    for (int64_t i = 0; i < 20; i++) {
        double va;
        tg_tensor_get(a, i, &va);
        cr_assert(va >= -2.0 && va < 3.0, "element %lld = %g outside [-2,3)", (long long)i, va);
    }
    tg_tensor_release(a);
    tg_tensor_release(b);
}

Test(tensor, rand_uniform_with_different_seeds_differs)
{
    tg_rng r1, r2;
    tg_rng_seed(&r1, 1);
    tg_rng_seed(&r2, 2);
    tg_tensor *a = tg_rand_uniform(&r1, TG_F32, 1, SHAPE(16), 0.0, 1.0);
    tg_tensor *b = tg_rand_uniform(&r2, TG_F32, 1, SHAPE(16), 0.0, 1.0);
    int differ = 0;
    for (int64_t i = 0; i < 16; i++) {
        double va, vb;
        tg_tensor_get(a, i, &va);
        tg_tensor_get(b, i, &vb);
        if (fabs(va - vb) > 1e-9) differ++;
    }
    cr_assert_geq(differ, 15, "only %d of 16 elements differ", differ);
    tg_tensor_release(a);
    tg_tensor_release(b);
}

Test(tensor, rand_uniform_values_follow_the_generator_stream)
{
    tg_rng r1, r2;
    tg_rng_seed(&r1, 99);
    tg_rng_seed(&r2, 99);
    tg_tensor *a = tg_rand_uniform(&r1, TG_F64, 1, SHAPE(8), 10.0, 14.0);
    for (int64_t i = 0; i < 8; i++) {
        double v, want = 10.0 + 4.0 * tg_rng_double(&r2);
        tg_tensor_get(a, i, &v);
        cr_assert(fabs(v - want) < 1e-12, "element %lld = %.17g, expected %.17g", (long long)i, v,
                  want);
    }
    tg_tensor_release(a);
}

Test(tensor, rand_normal_is_reproducible_and_seed_dependent)
{
    tg_rng r1, r2, r3;
    tg_rng_seed(&r1, 5);
    tg_rng_seed(&r2, 5);
    tg_rng_seed(&r3, 6);
    tg_tensor *a = tg_rand_normal(&r1, TG_F64, 1, SHAPE(10), 0.0, 1.0);
    tg_tensor *b = tg_rand_normal(&r2, TG_F64, 1, SHAPE(10), 0.0, 1.0);
    tg_tensor *c = tg_rand_normal(&r3, TG_F64, 1, SHAPE(10), 0.0, 1.0);
    cr_assert_eq(memcmp(tg_tensor_data(a), tg_tensor_data(b), 10 * sizeof(double)), 0,
                 "the same seed gave different bits");
    int differ = 0;
    for (int64_t i = 0; i < 10; i++) {
        double va, vc;
        tg_tensor_get(a, i, &va);
        tg_tensor_get(c, i, &vc);
        if (fabs(va - vc) > 1e-12) differ++;
    }
    cr_assert_geq(differ, 9, "only %d of 10 elements differ between seeds 5 and 6", differ);
    tg_tensor_release(a);
    tg_tensor_release(b);
    tg_tensor_release(c);
}

Test(tensor, rand_normal_has_mean_zero_and_std_one_over_100k_samples)
{
    tg_rng rng;
    tg_rng_seed(&rng, 2024);
    const int64_t n = 100000;
    tg_tensor *t = tg_rand_normal(&rng, TG_F64, 1, &n, 0.0, 1.0);
    cr_assert_not_null(t);
    const double *p = tg_tensor_data(t);
    cr_assert_not_null(p);
    double sum = 0.0, sq = 0.0;
    for (int64_t i = 0; i < n; i++) sum += p[i];
    double mean = sum / (double)n;
    for (int64_t i = 0; i < n; i++) sq += (p[i] - mean) * (p[i] - mean);
    double sd = sqrt(sq / (double)(n - 1));
    /* Standard error of the mean is 1/sqrt(1e5) ~ 0.0032. */
    cr_assert(fabs(mean) < 0.015, "mean %g", mean);
    cr_assert(fabs(sd - 1.0) < 0.015, "std %g", sd);
    tg_tensor_release(t);
}

Test(tensor, rand_normal_applies_mean_and_std)
{
    tg_rng rng;
    tg_rng_seed(&rng, 11);
    const int64_t n = 50000;
    tg_tensor *t = tg_rand_normal(&rng, TG_F32, 1, &n, 3.0, 0.5);
    const float *p = tg_tensor_data(t);
    cr_assert_not_null(p);
    double sum = 0.0, sq = 0.0;
    for (int64_t i = 0; i < n; i++) sum += p[i];
    double mean = sum / (double)n;
    for (int64_t i = 0; i < n; i++) sq += (p[i] - mean) * (p[i] - mean);
    double sd = sqrt(sq / (double)(n - 1));
    cr_assert(fabs(mean - 3.0) < 0.02, "mean %g", mean);
    cr_assert(fabs(sd - 0.5) < 0.02, "std %g", sd);
    tg_tensor_release(t);
}

Test(tensor, rand_of_an_integer_dtype_fails_with_dtype)
{
    tg_rng rng;
    tg_rng_seed(&rng, 1);
    tg_error_clear();
    cr_assert_null(tg_rand_uniform(&rng, TG_I64, 1, SHAPE(3), 0.0, 1.0));
    cr_assert_eq(tg_last_error(), TG_ERR_DTYPE);
    tg_error_clear();
    cr_assert_null(tg_rand_normal(NULL, TG_F64, 1, SHAPE(3), 0.0, 1.0));
    cr_assert_eq(tg_last_error(), TG_ERR_NULL);
}

/* ---- layout, views, copy_out */

Test(tensor, copy_out_of_a_transposed_view_gives_transposed_order)
{
    /* x = [[1,2,3],[4,5,6]]; x^T = [[1,4],[2,5],[3,6]] */
    tg_tensor *x = tg_tensor_from_data(TG_F64, 2, SHAPE(2, 3), (const double[]){1, 2, 3, 4, 5, 6});
    tg_tensor *t = tg_transpose(x, 0, 1);
    tu_expect_shape(t, 2, SHAPE(3, 2));
    cr_assert_not(tg_tensor_is_contiguous(t));
    double out[6] = {0};
    cr_assert_eq(tg_tensor_copy_out(t, out, sizeof out), TG_OK);
    const double want[6] = {1, 4, 2, 5, 3, 6};
    for (int i = 0; i < 6; i++)
        cr_assert(fabs(out[i] - want[i]) < 1e-15, "out[%d] = %g, expected %g", i, out[i], want[i]);
    tu_expect_values(t, want, 6, 1e-15);
    tg_tensor_release(t);
    tg_tensor_release(x);
}

/* copy_out of views copies runs of contiguous inner dims at once: every
 * kind of view against tg_tensor_get element by element. x (3, 4, 5) holds
 * 0..59. */
Test(tensor, copy_out_of_strided_views_matches_get_element_by_element)
{
    tg_scope_begin();
    double v[60];
    for (int i = 0; i < 60; i++) v[i] = i;
    tg_tensor *x = tg_tensor_from_data(TG_F64, 3, SHAPE(3, 4, 5), v);
    tg_tensor *col = tg_narrow(tg_reshape(x, 2, SHAPE(12, 5)), 1, 3, 1); /* (12, 1) */
    tg_tensor *views[] = {
        tg_narrow(x, 1, 1, 2),                               /* inner rows of 5 */
        tg_narrow(x, 2, 1, 3),                               /* runs of 3 */
        tg_narrow(tg_narrow(x, 0, 1, 2), 2, 0, 4),           /* two dims cut */
        tg_transpose(x, 0, 2),                               /* runs of 1 */
        tg_permute(x, 3, (const int[]){1, 0, 2}),            /* runs of 5 */
        tg_expand(tg_narrow(x, 0, 2, 1), 3, SHAPE(4, 4, 5)), /* stride 0 */
        tg_reshape(col, 3, SHAPE(12, 1, 1)),                 /* ones */
        tg_narrow(x, 1, 2, 1),                               /* a dim of one */
    };
    for (size_t k = 0; k < sizeof views / sizeof *views; k++) {
        tg_tensor *t = views[k];
        cr_assert_not_null(t, "view %zu: %s", k, tg_last_error_message());
        int64_t n = tg_tensor_numel(t);
        double out[80];
        cr_assert(n <= 80);
        cr_assert_eq(tg_tensor_copy_out(t, out, sizeof out), TG_OK);
        for (int64_t i = 0; i < n; i++) {
            double want;
            cr_assert_eq(tg_tensor_get(t, i, &want), TG_OK);
            cr_expect_eq(out[i], want, "view %zu [%lld]: %g, get %g", k, (long long)i, out[i],
                         want);
        }
    }
    tg_tensor *f = tg_cast(x, TG_F32);
    float o32[20];
    cr_assert_eq(tg_tensor_copy_out(tg_narrow(f, 1, 3, 1), o32, sizeof o32), TG_OK);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 5; j++) cr_expect_eq(o32[i * 5 + j], (float)(i * 20 + 15 + j));
    tg_scope_end();
}

Test(tensor, copy_out_of_a_contiguous_tensor_copies_row_major)
{
    const float src[4] = {1.5f, 2.5f, 3.5f, 4.5f};
    tg_tensor *x = tg_tensor_from_data(TG_F32, 2, SHAPE(2, 2), src);
    float out[4] = {0};
    cr_assert_eq(tg_tensor_copy_out(x, out, sizeof out), TG_OK);
    for (int i = 0; i < 4; i++) cr_assert(fabsf(out[i] - src[i]) < 1e-7f, "out[%d]", i);
    tg_tensor_release(x);
}

Test(tensor, copy_out_with_a_too_small_buffer_fails_with_invalid)
{
    tg_tensor *x = tg_zeros(TG_F64, 1, SHAPE(4));
    double out[4] = {9, 9, 9, 9};
    tg_error_clear();
    cr_assert_eq(tg_tensor_copy_out(x, out, 3 * sizeof(double)), TG_ERR_INVALID);
    cr_assert_eq(tg_last_error(), TG_ERR_INVALID);
    for (int i = 0; i < 4; i++) cr_assert(fabs(out[i] - 9.0) < 1e-15, "out[%d] was written", i);
    tg_tensor_release(x);
}

Test(tensor, data_of_a_strided_view_is_null_with_invalid)
{
    tg_tensor *x = tg_zeros(TG_F64, 2, SHAPE(2, 3));
    tg_tensor *t = tg_transpose(x, 0, 1);
    tg_error_clear();
    cr_assert_null(tg_tensor_data(t));
    cr_assert_eq(tg_last_error(), TG_ERR_INVALID);
    cr_assert_not_null(tg_tensor_data(x));
    tg_tensor_release(t);
    tg_tensor_release(x);
}

Test(tensor, get_out_of_range_fails_with_invalid)
{
    tg_tensor *x = tg_zeros(TG_F64, 1, SHAPE(3));
    double v;
    tg_error_clear();
    cr_assert_eq(tg_tensor_get(x, 3, &v), TG_ERR_INVALID);
    cr_assert_eq(tg_tensor_get(x, -1, &v), TG_ERR_INVALID);
    tg_tensor_release(x);
}

Test(tensor, reshape_of_contiguous_data_is_a_view_sharing_storage)
{
    tg_tensor *x = tg_tensor_from_data(TG_F64, 2, SHAPE(2, 3), (const double[]){1, 2, 3, 4, 5, 6});
    tg_tensor *r = tg_reshape(x, 2, SHAPE(3, 2));
    tu_expect_shape(r, 2, SHAPE(3, 2));
    size_t before = tg_mem_current_bytes();
    tg_tensor *r2 = tg_reshape(x, 1, SHAPE(6));
    cr_assert_eq(tg_mem_current_bytes(), before, "reshape allocated %zu bytes",
                 tg_mem_current_bytes() - before);
    double *p = tg_tensor_data(x);
    cr_assert_not_null(p);
    p[4] = 50.0;
    tu_expect_values(r, (const double[]){1, 2, 3, 4, 50, 6}, 6, 1e-15);
    tu_expect_values(r2, (const double[]){1, 2, 3, 4, 50, 6}, 6, 1e-15);
    /* ... and the other way round. */
    double *q = tg_tensor_data(r);
    cr_assert_not_null(q);
    q[0] = -1.0;
    tu_expect_values(x, (const double[]){-1, 2, 3, 4, 50, 6}, 6, 1e-15);
    tg_tensor_release(r2);
    tg_tensor_release(r);
    tg_tensor_release(x);
}

Test(tensor, reshape_infers_one_minus_one_dim)
{
    tg_tensor *x = tg_arange(TG_F64, 0, 24, 1);
    tg_tensor *r = tg_reshape(x, 3, SHAPE(2, -1, 4));
    tu_expect_shape(r, 3, SHAPE(2, 3, 4));
    tg_tensor *r2 = tg_reshape(x, 2, SHAPE(-1, 8));
    tu_expect_shape(r2, 2, SHAPE(3, 8));
    double v;
    tg_tensor_get(r2, 9, &v);
    cr_assert(fabs(v - 9.0) < 1e-15, "element 9 = %g", v);
    tg_error_clear();
    cr_assert_null(tg_reshape(x, 2, SHAPE(-1, 5)));
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE);
    tg_error_clear();
    cr_assert_null(tg_reshape(x, 2, SHAPE(5, 5)));
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE);
    tg_tensor_release(r2);
    tg_tensor_release(r);
    tg_tensor_release(x);
}

Test(tensor, retain_and_release_count_references)
{
    size_t base = tg_mem_current_bytes();
    tg_tensor *x = tg_zeros(TG_F64, 1, SHAPE(16));
    cr_assert_eq(tg_tensor_retain(x), x);
    tg_tensor_release(x);
    /* still alive: one reference left */
    cr_assert_eq(tg_mem_current_bytes(), base + 16 * sizeof(double));
    double v;
    cr_assert_eq(tg_tensor_get(x, 15, &v), TG_OK);
    tg_tensor_release(x);
    cr_assert_eq(tg_mem_current_bytes(), base);
    tg_tensor_release(NULL); /* no-op */
}

/* ---- memory accounting */

Test(tensor, mem_current_bytes_counts_exactly_the_data_size)
{
    size_t base = tg_mem_current_bytes();
    tg_tensor *a = tg_zeros(TG_F64, 2, SHAPE(3, 5));
    cr_assert_eq(tg_mem_current_bytes(), base + 15 * 8, "after f64 (3,5): %zu over base",
                 tg_mem_current_bytes() - base);
    tg_tensor *b = tg_ones(TG_F32, 1, SHAPE(7));
    cr_assert_eq(tg_mem_current_bytes(), base + 15 * 8 + 7 * 4);
    tg_tensor *c = tg_scalar(TG_I64, 1);
    cr_assert_eq(tg_mem_current_bytes(), base + 15 * 8 + 7 * 4 + 8);
    tg_tensor_release(a);
    cr_assert_eq(tg_mem_current_bytes(), base + 7 * 4 + 8);
    tg_tensor_release(b);
    tg_tensor_release(c);
    cr_assert_eq(tg_mem_current_bytes(), base);
}

Test(tensor, mem_views_share_bytes_until_the_last_reference_goes)
{
    size_t base = tg_mem_current_bytes();
    tg_tensor *x = tg_zeros(TG_F64, 2, SHAPE(4, 4));
    tg_tensor *t = tg_transpose(x, 0, 1);
    cr_assert_eq(tg_mem_current_bytes(), base + 128);
    tg_tensor_release(x);
    cr_assert_eq(tg_mem_current_bytes(), base + 128, "storage freed while a view holds it");
    tg_tensor *c = tg_contiguous(t);
    cr_assert_eq(tg_mem_current_bytes(), base + 256);
    tg_tensor_release(t);
    tg_tensor_release(c);
    cr_assert_eq(tg_mem_current_bytes(), base);
}

Test(tensor, mem_peak_tracks_the_high_water_mark)
{
    tg_mem_reset_peak();
    size_t base = tg_mem_current_bytes();
    cr_assert_eq(tg_mem_peak_bytes(), base);
    tg_tensor *a = tg_zeros(TG_F64, 1, SHAPE(100));
    tg_tensor_release(a);
    cr_assert_eq(tg_mem_current_bytes(), base);
    cr_assert_geq(tg_mem_peak_bytes(), base + 800);
    tg_mem_reset_peak();
    cr_assert_eq(tg_mem_peak_bytes(), base);
}

Test(tensor, mem_allocator_is_named)
{
    const char *name = tg_mem_allocator();
    cr_assert(strcmp(name, "jemalloc") == 0 || strcmp(name, "malloc") == 0, "allocator '%s'", name);
}

/* Issue 15 item 7: an element count past i64 is an error, not a cast of
 * an out-of-range double. */
Test(tensor, arange_with_an_enormous_count_fails_with_shape)
{
    cr_assert_null(tg_arange(TG_F32, 0, 1, 1e-300));
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE);
    tu_expect_message_has(
        "bad argument to 'arange' (1e+300 elements from 0 to 1 by 1e-300; too many)");
    cr_assert_null(tg_arange(TG_F64, -1e308, 1e308, 1));
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE);
    tu_expect_message_has("(inf elements");
    tg_error_clear();
}

/* Item 8: a zero-size dim does not switch the overflow check off (the
 * strides of the other dims would overflow). */
Test(tensor, a_zero_size_dim_does_not_hide_an_overflowing_shape)
{
    int64_t big[3] = {0, INT64_MAX, INT64_MAX};
    cr_assert_null(tg_zeros(TG_F32, 3, big));
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE);
    tu_expect_message_has("bad argument to 'zeros' (shape too large)");
    tg_params *ps = tg_params_new();
    cr_assert_null(tg_params_add(ps, "w", TG_F32, 3, big));
    cr_assert_eq(tg_last_error(), TG_ERR_SHAPE);
    tu_expect_message_has("(shape too large)");
    tg_params_free(ps);
    tg_error_clear();
    tg_tensor *ok = tg_zeros(TG_F32, 3, SHAPE(0, 1 << 20, 1 << 20));
    cr_assert_not_null(ok, "%s", tg_last_error_message());
    cr_assert_eq(tg_tensor_numel(ok), 0);
    tg_tensor_release(ok);
}

/* Item 9: float -> i64 saturates (NaN gives 0), the same on both backends
 * and in tg_full. */
static void check_saturating_cast(void)
{
    static const double v[] = {NAN, INFINITY, -INFINITY, 1e19, -1e19, 2.9, -2.9, 9.2e18, -0.5};
    static const int64_t want[] = {0, INT64_MAX, INT64_MIN, INT64_MAX, INT64_MIN, 2, -2,
                                   9200000000000000000, 0};
    for (int d = 0; d < 2; d++) {
        tg_dtype dt = d ? TG_F32 : TG_F64;
        tg_tensor *x = tu_tensor(dt, 1, SHAPE(9), v), *y = tg_cast(x, TG_I64);
        cr_assert_not_null(y, "%s", tg_last_error_message());
        int64_t got[9];
        cr_assert_eq(tg_tensor_copy_out(y, got, sizeof got), TG_OK);
        for (int i = 0; i < 9; i++) {
            /* 9.2e18 is not an f32: compare with the f32 value's conversion */
            int64_t w = (dt == TG_F32 && i == 7) ? 9200000267938955264 : want[i];
            cr_expect_eq(got[i], w, "%s %g -> %lld, want %lld", tg_dtype_name(dt), v[i],
                         (long long)got[i], (long long)w);
        }
    }
    tg_tensor *f = tg_full(TG_I64, 1, SHAPE(2), NAN), *g = tg_full(TG_I64, 0, NULL, -1e300);
    int64_t a[2], b;
    tg_tensor_copy_out(f, a, sizeof a);
    tg_tensor_copy_out(g, &b, sizeof b);
    cr_expect(a[0] == 0 && a[1] == 0 && b == INT64_MIN); /* the scope releases them all */
}

Test(tensor, float_to_i64_casts_saturate_and_nan_gives_zero)
{
    tu_on_both_backends(check_saturating_cast);
}

Test(tensor, large_buffers_are_reused_across_more_sizes_than_the_cache_table)
{
    /* The freed-buffer cache (16 KiB and up) keeps a table of sizes: more
     * distinct sizes than it has entries (256) must still give every
     * tensor its own, correct values, and the accounting must come back
     * to where it was. */
    size_t base = tg_mem_current_bytes();
    for (int round = 0; round < 3; round++) {
        tg_tensor *t[300];
        for (int i = 0; i < 300; i++) {
            int64_t n = 4096 + 17 * i + round; /* 16 KiB and up, all different */
            t[i] = tg_full(TG_F32, 1, (int64_t[]){n}, (double)i);
            cr_assert_not_null(t[i], "%s", tg_last_error_message());
        }
        for (int i = 0; i < 300; i++) {
            const float *v = tg_tensor_data_ro(t[i]);
            int64_t n = tg_tensor_numel(t[i]);
            cr_assert(v[0] == (float)i && v[n - 1] == (float)i, "tensor %d", i);
        }
        for (int i = 0; i < 300; i++) tg_tensor_release(t[i]);
        cr_assert_eq(tg_mem_current_bytes(), base);
    }
    /* The same size again and again comes back from the cache, intact. */
    for (int i = 0; i < 1000; i++) {
        tg_tensor *a = tg_full(TG_F64, 1, (int64_t[]){4096}, 1.5);
        tg_tensor *b = tg_full(TG_F64, 1, (int64_t[]){4096}, 2.5);
        cr_assert(((const double *)tg_tensor_data_ro(a))[4095] == 1.5);
        cr_assert(((const double *)tg_tensor_data_ro(b))[0] == 2.5);
        tg_tensor_release(b);
        tg_tensor_release(a);
    }
    tg_mem_trim();
    cr_assert_eq(tg_mem_current_bytes(), base);
}

Test(tensor, headers_past_the_per_thread_cache_are_reused_intact)
{
    /* Far more tensors than the per-thread header cache holds (256): the
     * rest go to a spare list and come back on the next round, each a
     * fresh tensor with its own values; tg_mem_trim frees the spares. */
    enum { N = 5000 };
    static tg_tensor *t[N];
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < N; i++) {
            t[i] = tg_full(TG_F64, 1, (int64_t[]){1 + (i % 3)}, (double)(i + round));
            cr_assert_not_null(t[i], "%s", tg_last_error_message());
        }
        for (int i = 0; i < N; i++) {
            double v;
            cr_assert_eq(tg_tensor_ndim(t[i]), 1);
            cr_assert_eq(tg_tensor_numel(t[i]), 1 + (i % 3));
            cr_assert_eq(tg_tensor_get(t[i], 0, &v), TG_OK);
            cr_assert_eq(v, (double)(i + round));
        }
        for (int i = 0; i < N; i++) tg_tensor_release(t[i]);
        if (round == 1) tg_mem_trim();
    }
}
