/*
 * test_quant_types.c — the weight types of llama.cpp's mixes beyond the first
 * seven: Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q5_K, IQ4_XS.
 *
 * - The type table: GGUF ids, names, block sizes and bytes.
 * - Golden dequantization: tests/fixtures/quant/<type>.bin holds random
 *   blocks and the values llama.cpp's gguf-py (an independent numpy
 *   implementation) dequantizes them to (tools/make_quant_fixtures.py).
 *   Both compute each value as a product of f32 factors, so they agree to an
 *   ulp or two (the order of the float products may differ): bound 4 ulp of
 *   the value.
 * - Round trip of the quantizers on Gaussian rows: relative L2 error
 *   ||deq(q(x)) - x|| / ||x||, with bounds set above the rounding step each
 *   type's levels imply (see round_cases).
 * - Zero and constant rows give exact zeros and no NaN.
 */
#include "testutil.h"

#include "core/core.h"
#include "tensor/dtype.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const struct {
    ks_dtype t;
    uint32_t id;
    const char *name;
    int64_t bs;
    size_t bytes;
} k_types[] = {
    {KS_DTYPE_Q4_1, 3, "q4_1", 32, 20},      {KS_DTYPE_Q5_0, 6, "q5_0", 32, 22},
    {KS_DTYPE_Q5_1, 7, "q5_1", 32, 24},      {KS_DTYPE_Q2_K, 10, "q2_k", 256, 84},
    {KS_DTYPE_Q3_K, 11, "q3_k", 256, 110},   {KS_DTYPE_Q5_K, 13, "q5_k", 256, 176},
    {KS_DTYPE_IQ4_NL, 20, "iq4_nl", 32, 18}, {KS_DTYPE_IQ4_XS, 23, "iq4_xs", 256, 136},
    {KS_DTYPE_MXFP4, 39, "mxfp4", 32, 17},
};
#define N_TYPES (sizeof k_types / sizeof k_types[0])

static void test_table(void **state) {
    (void)state;
    for (size_t i = 0; i < N_TYPES; i++) {
        assert_int_equal((uint32_t)k_types[i].t, k_types[i].id);
        assert_true(ks_dtype_is_weight_type(k_types[i].id));
        assert_int_equal(ks_dtype_block_size(k_types[i].t), k_types[i].bs);
        assert_int_equal(ks_dtype_block_bytes(k_types[i].t), k_types[i].bytes);
        ks_dtype t;
        assert_true(ks_dtype_from_name(k_types[i].name, &t));
        assert_int_equal(t, k_types[i].t);
        /* GGML spells the K-types with a capital K: both read */
        char up[16];
        snprintf(up, sizeof up, "%s", k_types[i].name);
        for (char *p = up; *p; p++) *p = (char)(*p >= 'a' && *p <= 'z' ? *p - 'a' + 'A' : *p);
        assert_true(ks_dtype_from_name(up, &t));
        assert_int_equal(t, k_types[i].t);
    }
    /* ids nobody implements stay rejected */
    assert_false(ks_dtype_is_weight_type(16)); /* IQ2_XXS */
    assert_false(ks_dtype_is_weight_type(4));  /* removed Q4_2 */
}

static void test_golden(void **state) {
    (void)state;
    for (size_t i = 0; i < N_TYPES; i++) {
        char rel[64];
        snprintf(rel, sizeof rel, "quant/%s.bin", k_types[i].name);
        size_t len = 0;
        char *buf = ks_test_read_file(ks_test_fixture(rel), &len);
        assert_non_null(buf);
        const int64_t n = 1024;
        const size_t raw = ks_dtype_row_bytes(k_types[i].t, n);
        assert_int_equal(len, raw + (size_t)n * 4);
        float *want = ks_malloc((size_t)n * sizeof(float)), *got = ks_malloc((size_t)n * sizeof(float));
        memcpy(want, buf + raw, (size_t)n * 4);
        ks_dequantize_row(k_types[i].t, buf, got, n);
        int exact = 0;
        for (int64_t k = 0; k < n; k++) {
            double tol = 4.0 * 0x1.0p-23 * fabs(want[k]);
            if (!(fabs((double)got[k] - want[k]) <= tol))
                fprintf(stderr, "%s: element %lld: got %.9g, gguf-py %.9g\n", k_types[i].name, (long long)k, got[k],
                        want[k]);
            assert_true(fabs((double)got[k] - want[k]) <= tol);
            exact += got[k] == want[k];
        }
        fprintf(stderr, "golden %-6s %d of %lld values bit-equal to gguf-py, the rest within 4 ulp\n",
                k_types[i].name, exact, (long long)n);
        ks_free(want);
        ks_free(got);
        free(buf);
    }
}

/* Relative L2 round-trip error on Gaussian data.  Expected, for uniform
 * rounding with step D (rms D / sqrt(12)) and sigma 1:
 *   q5_0 / q5_1: D ~ 2 amax32 / 31 ~ 0.14 -> ~0.04   bound 0.06
 *   q4_1: D ~ range32 / 15 ~ 0.28          -> ~0.08   bound 0.11
 *   q5_K: range32 / 31 + 6-bit scales      -> ~0.045  bound 0.07
 *   q3_K: amax16 / 4 (one level is -4 only)-> ~0.17   bound 0.22
 *   q2_K: range16 / 3                      -> ~0.3    bound 0.38
 *   iq4_nl / iq4_xs: 16 non-uniform levels -> ~0.08   bound 0.11
 *   mxfp4: power-of-two scale, E2M1 levels -> ~0.12   bound 0.2
 * The measured values are printed for the record. */
static const struct {
    ks_dtype t;
    double bound;
} round_cases[] = {
    {KS_DTYPE_Q4_1, 0.11}, {KS_DTYPE_Q5_0, 0.06}, {KS_DTYPE_Q5_1, 0.06},   {KS_DTYPE_IQ4_NL, 0.11},
    {KS_DTYPE_Q2_K, 0.38}, {KS_DTYPE_Q3_K, 0.22}, {KS_DTYPE_Q5_K, 0.07}, {KS_DTYPE_IQ4_XS, 0.11},
    {KS_DTYPE_MXFP4, 0.2},
};

static void test_roundtrip(void **state) {
    (void)state;
    const int64_t n = 8192;
    float *x = ks_malloc(n * sizeof(float)), *y = ks_malloc(n * sizeof(float));
    void *q = ks_malloc(ks_dtype_row_bytes(KS_DTYPE_Q5_1, n));
    ks_rng rng = {4747};
    for (int64_t i = 0; i < n; i++) x[i] = ks_rng_normal(&rng) * (i < 4096 ? 1.0f : 0.003f) + (i % 512 < 64 ? 0.5f * (i < 4096 ? 1.0f : 0.003f) : 0.0f);
    for (size_t c = 0; c < sizeof round_cases / sizeof round_cases[0]; c++) {
        double e[2];
        for (int h = 0; h < 2; h++) {
            ks_quantize_row(round_cases[c].t, x + 4096 * h, q, 4096);
            ks_dequantize_row(round_cases[c].t, q, y, 4096);
            double mx;
            e[h] = ks_test_nmse(y, x + 4096 * h, 4096, &mx);
        }
        fprintf(stderr, "roundtrip %-6s rel-L2 %.5f (unit)  %.5f (x0.003)  bound %.3g\n",
                ks_dtype_name(round_cases[c].t), e[0], e[1], round_cases[c].bound);
        assert_true(e[0] <= round_cases[c].bound);
        assert_true(e[1] <= round_cases[c].bound);
    }
    ks_free(q);
    ks_free(x);
    ks_free(y);
}

static void test_zero_and_constant(void **state) {
    (void)state;
    float z[512] = {0}, c[512], nc[512], y[512];
    for (int i = 0; i < 512; i++) c[i] = 0.75f, nc[i] = -0.3f;
    uint8_t buf[1024];
    for (size_t i = 0; i < N_TYPES; i++) {
        ks_dtype t = k_types[i].t;
        /* MXFP4's levels in the top binade are 4, 6, 8, 12 (doubled): a
         * constant lands up to a sixth away (0.3 -> 0.25) */
        const float rel = t == KS_DTYPE_MXFP4 ? 0.2f : 0.1f;
        ks_quantize_row(t, z, buf, 512);
        ks_dequantize_row(t, buf, y, 512);
        for (int k = 0; k < 512; k++) assert_true(y[k] == 0.0f);
        ks_quantize_row(t, c, buf, 512);
        ks_dequantize_row(t, buf, y, 512);
        for (int k = 0; k < 512; k++) assert_true(fabsf(y[k] - 0.75f) <= 0.75f * rel);
        ks_quantize_row(t, nc, buf, 512);
        ks_dequantize_row(t, buf, y, 512);
        for (int k = 0; k < 512; k++) assert_true(fabsf(y[k] + 0.3f) <= 0.3f * rel);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_golden),
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_zero_and_constant),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
