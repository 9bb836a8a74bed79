/*
 * test_matmul.c — ks_matmul against a double-precision reference, for every
 * weight type, every SIMD level this CPU has, several shapes and batch sizes,
 * with and without a thread pool.
 *
 * Error metric: ||Y - ref|| / sqrt(sum over outputs and i of (w_i x_i)^2),
 * i.e. relative to the size of the terms each dot sums (for random data this
 * equals the usual ||Y - ref|| / ||ref|| in expectation, but cannot blow up
 * when a dot cancels to near zero).
 *
 * Why these tolerances.  The reference is dequant(W) . X in double, so weight
 * quantization error is excluded by construction; what remains is
 *   - float weights (f32/f16/bf16): f32 accumulation order only.  Relative L2
 *     error ~ 1e-7 * sqrt(cols); bound 1e-5.
 *   - quantized weights: ks_matmul also quantizes X to 8 bits (step amax/127
 *     per 32 or 256 values).  For Gaussian X that is a relative rms error of
 *     ~0.5-0.7% per element (see test_dtype.c), and it propagates to a dot
 *     product of independent terms with the same relative size, so the
 *     expected relative L2 error of Y is ~0.006; bound 0.02 (3x margin).
 * SIMD and scalar kernels see the same quantized X and compute the same
 * integer block sums, so they differ only by f32 summation order: bound 1e-5.
 */
#include "testutil.h"

#include "core/core.h"
#include "tensor/dtype.h"
#include "core/simd.h"
#include "matmul/matmul.h"
#include "matmul/matmul_packed_x8q.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const ks_dtype k_types[] = {KS_DTYPE_F32,  KS_DTYPE_F16,  KS_DTYPE_BF16,   KS_DTYPE_Q8_0,  KS_DTYPE_Q4_0,
                                   KS_DTYPE_Q4_K, KS_DTYPE_Q6_K, KS_DTYPE_Q4_1,   KS_DTYPE_Q5_0,  KS_DTYPE_Q5_1,
                                   KS_DTYPE_IQ4_NL, KS_DTYPE_Q2_K, KS_DTYPE_Q3_K, KS_DTYPE_Q5_K, KS_DTYPE_IQ4_XS,
                                   KS_DTYPE_MXFP4};
#define N_TYPES (sizeof k_types / sizeof k_types[0])

static bool is_float_type(ks_dtype t) {
    return t == KS_DTYPE_F32 || t == KS_DTYPE_F16 || t == KS_DTYPE_BF16;
}

typedef struct {
    ks_dtype t;
    int64_t rows, cols;
    void *W;   /* [rows][row bytes] */
    float *Wd; /* [rows][cols] dequantized */
} wmat;

static wmat make_w(ks_dtype t, int64_t rows, int64_t cols, uint64_t seed) {
    wmat m = {t, rows, cols, NULL, NULL};
    size_t rb = ks_dtype_row_bytes(t, cols);
    m.W = ks_malloc_aligned(rb * (size_t)rows + 64);
    m.Wd = ks_malloc((size_t)(rows * cols) * sizeof(float));
    float *tmp = ks_malloc((size_t)cols * sizeof(float));
    ks_rng rng = {seed};
    for (int64_t r = 0; r < rows; r++) {
        float rs = 0.5f + (float)ks_rng_uniform(&rng); /* rows of different scale */
        for (int64_t i = 0; i < cols; i++) tmp[i] = ks_rng_normal(&rng) * rs * 0.05f;
        ks_quantize_row(t, tmp, (uint8_t *)m.W + (size_t)r * rb, cols);
        ks_dequantize_row(t, (uint8_t *)m.W + (size_t)r * rb, m.Wd + r * cols, cols);
    }
    ks_free(tmp);
    return m;
}

static void free_w(wmat *m) {
    ks_free_aligned(m->W);
    ks_free(m->Wd);
}

static float *make_x(int64_t n, int64_t cols, uint64_t seed) {
    float *x = ks_malloc((size_t)(n * cols) * sizeof(float));
    ks_rng rng = {seed};
    for (int64_t i = 0; i < n * cols; i++) x[i] = ks_rng_normal(&rng);
    return x;
}

/* Reference product; *scale2 (optional) receives sum over outputs of
 * sum_i (w_i x_i)^2, the natural size of the terms the dots are made of. */
static void ref_matmul(const wmat *m, const float *X, int64_t n, float *Y, double *scale2) {
    double sc = 0;
    for (int64_t c = 0; c < n; c++)
        for (int64_t r = 0; r < m->rows; r++) {
            double s = 0;
            for (int64_t i = 0; i < m->cols; i++) {
                double p = (double)m->Wd[r * m->cols + i] * X[c * m->cols + i];
                s += p;
                sc += p * p;
            }
            Y[c * m->rows + r] = (float)s;
        }
    if (scale2) *scale2 = sc;
}

/* ||y - ref|| / sqrt(sum_i (w_i x_i)^2): unlike ||y - ref|| / ||ref|| this
 * does not blow up when a dot happens to cancel to near zero (a single
 * output of a random 256-term dot can be arbitrarily small). */
static double term_err(const float *y, const float *ref, size_t n, double scale2) {
    double e = 0;
    for (size_t i = 0; i < n; i++) e += ((double)y[i] - ref[i]) * ((double)y[i] - ref[i]);
    return sqrt(e / (scale2 > 0 ? scale2 : 1));
}

static void run_matmul(ks_pool *pool, const wmat *m, const float *X, int64_t n, float *Y) {
    size_t sb = ks_matmul_scratch_bytes(m->t, m->cols, n);
    if (is_float_type(m->t)) assert_int_equal(sb, 0);
    void *scratch = sb ? ks_malloc_aligned(sb) : NULL;
    for (int64_t i = 0; i < n * m->rows; i++) Y[i] = NAN; /* every output must be written */
    ks_matmul(pool, m->t, m->W, m->rows, m->cols, X, n, Y, scratch);
    if (scratch) ks_free_aligned(scratch);
}

/* ---------------------------------------------------------------- tests -- */

static void test_simd_levels(void **state) {
    (void)state;
    ks_simd_level hw = ks_simd_detect();
    assert_true(hw >= KS_SIMD_SCALAR && hw <= KS_SIMD_LEVEL_MAX);
    assert_string_equal(ks_simd_name(KS_SIMD_SCALAR), "scalar");
    assert_string_equal(ks_simd_name(KS_SIMD_AVX2), "avx2");
    assert_string_equal(ks_simd_name(KS_SIMD_AVX512), "avx512");
    assert_string_equal(ks_simd_name(KS_SIMD_NEON), "neon");
    assert_string_equal(ks_simd_name(KS_SIMD_NEON_DOT), "dotprod");
    assert_string_equal(ks_simd_name(KS_SIMD_NEON_I8MM), "i8mm");
    fprintf(stderr, "simd: best level %s\n", ks_simd_name(hw));
    ks_simd_level prev = ks_simd_force(KS_SIMD_SCALAR);
    assert_int_equal(ks_simd_force(prev), KS_SIMD_SCALAR);
    /* forcing above the hardware is clamped, never executes missing ISA */
    prev = ks_simd_force(hw >= KS_SIMD_NEON ? KS_SIMD_NEON_I8MM : KS_SIMD_AVX512);
    assert_int_equal(ks_simd_force(prev), hw);
    /* another architecture's level is scalar, whatever this CPU has */
    prev = ks_simd_force(hw >= KS_SIMD_NEON ? KS_SIMD_AVX2 : KS_SIMD_NEON);
    assert_int_equal(ks_simd_force(prev), KS_SIMD_SCALAR);
}

static void test_dot_row_ref(void **state) {
    (void)state;
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        wmat m = make_w(k_types[ti], 3, 512, 11 + ti);
        float *x = make_x(1, 512, 5);
        size_t rb = ks_dtype_row_bytes(m.t, 512);
        for (int r = 0; r < 3; r++) {
            double s = 0, a = 0;
            for (int i = 0; i < 512; i++) s += (double)m.Wd[r * 512 + i] * x[i], a += fabs((double)m.Wd[r * 512 + i] * x[i]);
            float got = ks_dot_row_ref(m.t, (uint8_t *)m.W + r * rb, x, 512);
            assert_true(fabs(got - s) <= 1e-6 * a + 1e-30);
        }
        ks_free(x);
        free_w(&m);
    }
}

/* Every type x level x shape x n x {no pool, 2 threads} vs the reference. */
static void test_matmul_vs_reference(void **state) {
    (void)state;
    ks_pool *pool2 = NULL;
    assert_int_equal(ks_pool_create(2, &pool2), KS_OK);
    /* cols 352 and 32: 11 and 1 blocks, the partial 4-block group of the
     * AVX-512 grouped Q8_0/Q4_0 kernels; odd row counts: their 2-row tiles */
    static const int64_t shapes[][2] = {{37, 256}, {70, 512}, {16, 2048}, {1, 256}, {13, 352}, {5, 32}};
    static const int64_t ns[] = {1, 3, 16, 64};
    ks_simd_level hw = ks_simd_detect();
    ks_simd_level saved = ks_simd_force(hw);
    double worst[N_TYPES] = {0};
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        ks_dtype t = k_types[ti];
        double tol = is_float_type(t) ? 1e-5 : 2e-2;
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            if (shapes[si][1] % ks_dtype_block_size(t) != 0) continue; /* K-quants: 256 */
            wmat m = make_w(t, shapes[si][0], shapes[si][1], 100 + ti * 10 + si);
            for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
                int64_t n = ns[ni];
                if (m.rows * m.cols * n > 4 * 1024 * 1024) continue; /* keep the test fast */
                float *X = make_x(n, m.cols, 7 + ni);
                float *Yr = ks_malloc((size_t)(n * m.rows) * sizeof(float));
                float *Y = ks_malloc((size_t)(n * m.rows) * sizeof(float));
                float *Ys = ks_malloc((size_t)(n * m.rows) * sizeof(float));
                double scale2;
                ref_matmul(&m, X, n, Yr, &scale2);
                ks_simd_force(KS_SIMD_SCALAR);
                run_matmul(NULL, &m, X, n, Ys);
                for (int lv = KS_SIMD_SCALAR; lv <= (int)hw; lv++) {
                    ks_simd_force((ks_simd_level)lv);
                    for (int pi = 0; pi < 2; pi++) {
                        run_matmul(pi ? pool2 : NULL, &m, X, n, Y);
                        double e = term_err(Y, Yr, (size_t)(n * m.rows), scale2);
                        double es = term_err(Y, Ys, (size_t)(n * m.rows), scale2);
                        if (!(e <= tol) || !(es <= 1e-5))
                            fprintf(stderr, "FAIL %s %s rows=%lld cols=%lld n=%lld pool=%d: err %.3g (tol %.3g) vs scalar %.3g\n",
                                    ks_dtype_name(t), ks_simd_name((ks_simd_level)lv), (long long)m.rows,
                                    (long long)m.cols, (long long)n, pi, e, tol, es);
                        assert_true(e <= tol);
                        assert_true(es <= 1e-5);
                        if (e > worst[ti]) worst[ti] = e;
                    }
                }
                ks_free(X);
                ks_free(Yr);
                ks_free(Y);
                ks_free(Ys);
            }
            free_w(&m);
        }
    }
    for (size_t ti = 0; ti < N_TYPES; ti++)
        fprintf(stderr, "matmul %-5s worst rel error vs double reference %.2e\n", ks_dtype_name(k_types[ti]), worst[ti]);
    ks_simd_force(saved);
    ks_pool_destroy(pool2);
}

/* Float weights need no block alignment: odd column counts exercise tails. */
static void test_matmul_float_tails(void **state) {
    (void)state;
    ks_simd_level hw = ks_simd_detect();
    ks_simd_level saved = ks_simd_force(hw);
    static const ks_dtype ft[] = {KS_DTYPE_F32, KS_DTYPE_F16, KS_DTYPE_BF16};
    static const int64_t colss[] = {1, 7, 100, 333};
    for (size_t ti = 0; ti < 3; ti++)
        for (size_t ci = 0; ci < 4; ci++) {
            wmat m = make_w(ft[ti], 19, colss[ci], 3 + ci);
            float *X = make_x(5, colss[ci], 9);
            float Yr[5 * 19], Y[5 * 19];
            double scale2;
            ref_matmul(&m, X, 5, Yr, &scale2);
            for (int lv = KS_SIMD_SCALAR; lv <= (int)hw; lv++) {
                ks_simd_force((ks_simd_level)lv);
                run_matmul(NULL, &m, X, 5, Y);
                assert_true(term_err(Y, Yr, 5 * 19, scale2) <= 1e-5);
            }
            ks_free(X);
            free_w(&m);
        }
    ks_simd_force(saved);
}

/* Large n with long rows: several L2 row chunks and vector groups per thread. */
static void test_matmul_chunked(void **state) {
    (void)state;
    ks_pool *pool2 = NULL;
    assert_int_equal(ks_pool_create(2, &pool2), KS_OK);
    static const ks_dtype ct[] = {KS_DTYPE_F32, KS_DTYPE_Q8_0, KS_DTYPE_Q4_K};
    const int64_t rows = 40, cols = 8192, n = 20;
    for (size_t ti = 0; ti < 3; ti++) {
        wmat m = make_w(ct[ti], rows, cols, 77 + ti);
        float *X = make_x(n, cols, 78);
        float *Yr = ks_malloc((size_t)(n * rows) * sizeof(float));
        float *Y = ks_malloc((size_t)(n * rows) * sizeof(float));
        double scale2;
        ref_matmul(&m, X, n, Yr, &scale2);
        run_matmul(pool2, &m, X, n, Y);
        assert_true(term_err(Y, Yr, (size_t)(n * rows), scale2) <= (is_float_type(m.t) ? 1e-5 : 2e-2));
        ks_free(X);
        ks_free(Yr);
        ks_free(Y);
        free_w(&m);
    }
    ks_pool_destroy(pool2);
}

/* Scale extremes: a row of zeros, a huge-scale row, and an all-zero X. */
static void test_matmul_extremes(void **state) {
    (void)state;
    ks_simd_level hw = ks_simd_detect();
    ks_simd_level saved = ks_simd_force(hw);
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        ks_dtype t = k_types[ti];
        const int64_t rows = 3, cols = 256;
        size_t rb = ks_dtype_row_bytes(t, cols);
        void *W = ks_malloc_aligned(rb * rows);
        float w[256], Xz[2 * 256], Y[2 * 3];
        for (int i = 0; i < 256; i++) w[i] = 0.0f;
        ks_quantize_row(t, w, W, cols);
        for (int i = 0; i < 256; i++) w[i] = (i % 3 - 1) * 1000.0f;
        ks_quantize_row(t, w, (uint8_t *)W + rb, cols);
        for (int i = 0; i < 256; i++) w[i] = (i & 1) ? 0.5f : -0.25f;
        ks_quantize_row(t, w, (uint8_t *)W + 2 * rb, cols);
        memset(Xz, 0, sizeof Xz);
        for (int i = 0; i < 256; i++) Xz[256 + i] = 1.0f;
        void *scratch = ks_matmul_scratch_bytes(t, cols, 2) ? ks_malloc_aligned(ks_matmul_scratch_bytes(t, cols, 2)) : NULL;
        for (int lv = KS_SIMD_SCALAR; lv <= (int)hw; lv++) {
            ks_simd_force((ks_simd_level)lv);
            ks_matmul(NULL, t, W, rows, cols, Xz, 2, Y, scratch);
            for (int r = 0; r < 3; r++) assert_true(Y[r] == 0.0f); /* X = 0 */
            /* W row = 0: exact, except that MXFP4 has no zero scale (E8M0's least
             * is 2^-127), so the AVX-512 form's level offset of 128 cancels
             * against the block sums in subnormal arithmetic, to about 1e-37 */
            if (t == KS_DTYPE_MXFP4) assert_true(fabsf(Y[3]) <= 1e-30f);
            else assert_true(Y[3] == 0.0f);
            float expect1 = ks_dot_row_ref(t, (uint8_t *)W + rb, Xz + 256, cols);
            float expect2 = ks_dot_row_ref(t, (uint8_t *)W + 2 * rb, Xz + 256, cols);
            assert_true(fabsf(Y[4] - expect1) <= 1e-4f * 1000.0f * 256);
            assert_true(fabsf(Y[5] - expect2) <= 1e-3f * 256);
        }
        if (scratch) ks_free_aligned(scratch);
        ks_free_aligned(W);
    }
    ks_simd_force(saved);
}

/* Byte offsets of a block's f16 scale fields (-1: none). */
static void scale_fields(ks_dtype t, int off[2]) {
    off[0] = 0, off[1] = -1;
    switch (t) {
    case KS_DTYPE_Q4_K:
    case KS_DTYPE_Q5_K:
    case KS_DTYPE_Q4_1:
    case KS_DTYPE_Q5_1: off[1] = 2; break;
    case KS_DTYPE_Q6_K: off[0] = 208; break;
    case KS_DTYPE_Q3_K: off[0] = 108; break;
    case KS_DTYPE_Q2_K: off[0] = 80, off[1] = 82; break;
    default: break;
    }
}

/* Quantized blocks of random bytes: every scale/min bit pattern (the
 * high bits packed into Q4_K / Q5_K / Q3_K scale bytes, negative Q6_K, Q3_K
 * and IQ4_XS scales, every IQ4 level, every Q5 high bit), which quantized
 * smooth data rarely produces.  Each level must match the scalar kernel to
 * f32 summation order, for nc = 1..4 and a tail. */
static void test_matmul_kquant_raw(void **state) {
    (void)state;
    ks_simd_level hw = ks_simd_detect();
    ks_simd_level saved = ks_simd_force(hw);
    static const ks_dtype kt[] = {KS_DTYPE_Q4_K, KS_DTYPE_Q6_K, KS_DTYPE_Q4_1, KS_DTYPE_Q5_0,  KS_DTYPE_Q5_1,
                                  KS_DTYPE_IQ4_NL, KS_DTYPE_Q2_K, KS_DTYPE_Q3_K, KS_DTYPE_Q5_K, KS_DTYPE_IQ4_XS,
                                  KS_DTYPE_MXFP4};
    const int64_t rows = 9, cols = 768, n = 5;
    ks_rng rng = {1234};
    for (size_t ti = 0; ti < sizeof kt / sizeof kt[0]; ti++) {
        const ks_dtype t = kt[ti];
        const size_t rb = ks_dtype_row_bytes(t, cols), bb = ks_dtype_block_bytes(t);
        int off[2];
        scale_fields(t, off);
        uint8_t *W = ks_malloc_aligned(rb * rows);
        for (size_t i = 0; i < rb * rows; i++) W[i] = (uint8_t)ks_rng_next(&rng);
        for (size_t o = 0; o < rb * rows; o += bb) /* finite, varied block scales */
            if (t == KS_DTYPE_MXFP4) W[o] = (uint8_t)(118 + ks_rng_next(&rng) % 8); /* E8M0: 2^-10 .. 2^-3 */
            else for (int k = 0; k < 2; k++)
                if (off[k] >= 0) {
                    ks_f16 d = ks_f32_to_f16((float)(0.001 + 0.01 * ks_rng_uniform(&rng)));
                    memcpy(W + o + off[k], &d, 2);
                }
        float *X = make_x(n, cols, 21 + ti);
        float *Wd = ks_malloc((size_t)cols * sizeof(float));
        double scale2 = 0;
        for (int64_t r = 0; r < rows; r++) {
            ks_dequantize_row(t, W + (size_t)r * rb, Wd, cols);
            for (int64_t c = 0; c < n; c++)
                for (int64_t i = 0; i < cols; i++) scale2 += (double)Wd[i] * X[c * cols + i] * Wd[i] * X[c * cols + i];
        }
        float Ys[5 * 9], Y[5 * 9];
        wmat m = {t, rows, cols, W, NULL};
        ks_simd_force(KS_SIMD_SCALAR);
        run_matmul(NULL, &m, X, n, Ys);
        for (int lv = KS_SIMD_SCALAR + 1; lv <= (int)hw; lv++) {
            ks_simd_force((ks_simd_level)lv);
            run_matmul(NULL, &m, X, n, Y);
            double e = term_err(Y, Ys, (size_t)(n * rows), scale2);
            if (!(e <= 1e-5)) fprintf(stderr, "FAIL raw %s %s: err %.3g\n", ks_dtype_name(t), ks_simd_name((ks_simd_level)lv), e);
            assert_true(e <= 1e-5);
        }
        ks_free(Wd);
        ks_free(X);
        ks_free_aligned(W);
    }
    ks_simd_force(saved);
}

/* The AVX2 two-row float-weight tiles (matmul_x86_panel.c), taken from 8
 * vectors on and whenever four vectors outgrow L1: a product of 11 vectors
 * (tiles of 4, 4 and 3; 13 rows, so the last row runs the one-row kernel;
 * 771 columns, a scalar tail) gives, bit for bit, what the one-row kernel
 * gives vector by vector (decode equals prefill), and agrees with the
 * scalar kernels to float rounding. */
static void test_matmul_avx2_x2(void **state) {
    (void)state;
    ks_simd_level hw = ks_simd_detect();
    if (!ks_simd_x86(hw)) skip();
    ks_simd_level saved = ks_simd_force(KS_SIMD_AVX2);
    static const ks_dtype kt[] = {KS_DTYPE_F32, KS_DTYPE_F16, KS_DTYPE_BF16};
    const int64_t rows = 13, n = 11, cols = 771;
    ks_pool *pool2 = NULL;
    assert_int_equal(ks_pool_create(2, &pool2), KS_OK);
    for (size_t ti = 0; ti < sizeof kt / sizeof kt[0]; ti++) {
        const ks_dtype t = kt[ti];
        assert_non_null(ks_matmul_kernel_name(t, true));
        wmat m = make_w(t, rows, cols, 41 + ti);
        float *X = make_x(n, cols, 31 + ti);
        float Y[11 * 13], Y1[13], Ys[11 * 13];
        run_matmul(pool2, &m, X, n, Y);
        double scale2 = 0;
        for (int64_t c = 0; c < n; c++) {
            run_matmul(NULL, &m, X + c * cols, 1, Y1);
            for (int64_t r = 0; r < rows; r++) {
                scale2 += (double)Y1[r] * Y1[r];
                if (memcmp(&Y1[r], &Y[c * rows + r], sizeof(float)))
                    fprintf(stderr, "FAIL x2 %s row %lld vec %lld: %.9g vs one-row %.9g\n", ks_dtype_name(t), (long long)r,
                            (long long)c, Y[c * rows + r], Y1[r]);
                assert_memory_equal(&Y1[r], &Y[c * rows + r], sizeof(float));
            }
        }
        ks_simd_force(KS_SIMD_SCALAR);
        run_matmul(NULL, &m, X, n, Ys);
        ks_simd_force(KS_SIMD_AVX2);
        /* relative to the outputs' size (sum y^2, a smaller yardstick than the terms') */
        assert_true(term_err(Y, Ys, (size_t)(n * rows), scale2) <= 1e-5);
        ks_free(X);
        free_w(&m);
    }
    ks_pool_destroy(pool2);
    ks_simd_force(saved);
}

/* The i8mm two-row tiles (matmul_neon.c, smmla), which the driver takes at
 * that level for every product of more than one vector: per output they
 * compute the sdot kernel's exact integer sums and then its very float
 * steps in its order, so the product at the i8mm level is the dotprod
 * level's bit for bit, at every n.  Every quantized type; odd row counts
 * (the last row of each thread's share runs the one-row kernel); n = 1..9
 * (vector pairs, a lone last vector paired with itself, tiles of four);
 * column counts with a partial group of four 32-blocks; quantized weights
 * and raw random bytes (every nibble, scale and min pattern); with and
 * without a pool. */
static void test_matmul_i8mm_x2(void **state) {
    (void)state;
    const ks_simd_level hw = ks_simd_detect();
    if (hw != KS_SIMD_NEON_I8MM) skip();
    static const ks_dtype kt[] = {KS_DTYPE_Q8_0, KS_DTYPE_Q4_0, KS_DTYPE_Q4_1, KS_DTYPE_Q5_0,  KS_DTYPE_Q5_1,
                                  KS_DTYPE_IQ4_NL, KS_DTYPE_MXFP4, KS_DTYPE_Q2_K, KS_DTYPE_Q3_K, KS_DTYPE_Q4_K,
                                  KS_DTYPE_Q5_K, KS_DTYPE_Q6_K, KS_DTYPE_IQ4_XS};
    enum { NMAX = 9 };
    ks_pool *pool2 = NULL;
    assert_int_equal(ks_pool_create(2, &pool2), KS_OK);
    ks_simd_level saved = ks_simd_force(KS_SIMD_NEON_I8MM);
    for (size_t ti = 0; ti < sizeof kt / sizeof kt[0]; ti++) {
        const ks_dtype t = kt[ti];
        const int64_t cols = ks_dtype_block_size(t) == 32 ? 352 : 768; /* 11 blocks or 3 super-blocks */
        const char *name2 = ks_matmul_kernel_name(t, true);
        assert_non_null(name2);
        assert_non_null(strstr(name2, "x2_i8mm"));
        for (int raw = 0; raw < 2; raw++) {
            const int64_t rows = raw ? 7 : 37; /* 37: a pool splits it 32 + 5 */
            wmat m = make_w(t, rows, cols, 500 + 2 * ti + raw);
            if (raw) {
                const size_t rb = ks_dtype_row_bytes(t, cols), bb = ks_dtype_block_bytes(t);
                uint8_t *W = m.W;
                ks_rng rng = {600 + ti};
                int off[2];
                scale_fields(t, off);
                for (size_t i = 0; i < rb * (size_t)rows; i++) W[i] = (uint8_t)ks_rng_next(&rng);
                for (size_t o = 0; o < rb * (size_t)rows; o += bb) /* finite, varied block scales */
                    if (t == KS_DTYPE_MXFP4) W[o] = (uint8_t)(118 + ks_rng_next(&rng) % 8);
                    else for (int k = 0; k < 2; k++)
                        if (off[k] >= 0) {
                            ks_f16 d = ks_f32_to_f16((float)(0.001 + 0.01 * ks_rng_uniform(&rng)));
                            memcpy(W + o + off[k], &d, 2);
                        }
            }
            float *X = make_x(NMAX, cols, 700 + ti);
            float *Yd = ks_malloc(sizeof(float) * (size_t)(NMAX * rows)), *Yi = ks_malloc(sizeof(float) * (size_t)(NMAX * rows));
            for (int64_t n = 1; n <= NMAX; n++) {
                ks_simd_force(KS_SIMD_NEON_DOT);
                run_matmul(NULL, &m, X, n, Yd);
                ks_simd_force(KS_SIMD_NEON_I8MM);
                for (int pi = 0; pi < 2; pi++) {
                    run_matmul(pi ? pool2 : NULL, &m, X, n, Yi);
                    for (int64_t i = 0; i < n * rows; i++)
                        if (memcmp(&Yd[i], &Yi[i], sizeof(float)))
                            fprintf(stderr, "FAIL i8mm x2 %s raw=%d rows=%lld n=%lld pool=%d out %lld: %.9g vs dotprod %.9g\n",
                                    ks_dtype_name(t), raw, (long long)rows, (long long)n, pi, (long long)i, Yi[i], Yd[i]);
                    assert_memory_equal(Yd, Yi, sizeof(float) * (size_t)(n * rows));
                }
            }
            ks_free(X);
            ks_free(Yd);
            ks_free(Yi);
            free_w(&m);
        }
    }
    ks_simd_force(saved);
    ks_pool_destroy(pool2);
}

/* The AVX2 eight-row Q4_K and Q5_K tiles (matmul_x86_panel.c): their fixed arithmetic
 * per output, emulated in scalar C on the very activation bytes the product
 * makes (ks_matmul_quantize_x): per super-block, exact int32 sums isum =
 * sum_s sc_s (q_s . a_s) and msum = sum_s m_s bsum_s, then
 * acc = fma(isum, d * da, acc), acc = fma(-msum, dmin * da, acc).  Bit for
 * bit at n = 8, 11 and 21, with and without a pool (every n and split runs
 * the same per-output steps), on raw random bytes (every nibble and 6-bit
 * scale); the rows past the last whole 8 run the other kernels. */
static void q4k_scales_ref(const uint8_t *q, int sc[8], int m[8]) {
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            sc[j] = q[j] & 63;
            m[j] = q[j + 4] & 63;
        } else {
            sc[j] = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
            m[j] = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
        }
    }
}

static void test_matmul_avx2_k8(void **state) {
    (void)state;
    ks_simd_level hw = ks_simd_detect();
    if (!ks_simd_x86(hw)) skip();
    ks_simd_level saved = ks_simd_force(KS_SIMD_AVX2);
    for (int q5 = 0; q5 < 2; q5++) {
    const ks_dtype t = q5 ? KS_DTYPE_Q5_K : KS_DTYPE_Q4_K;
    const int64_t rows = 21, cols = 768, nb = cols / 256;
    const size_t rb = ks_dtype_row_bytes(t, cols), bb = ks_dtype_block_bytes(t);
    const size_t xs = (nb * sizeof(ks_block_q8_k) + 63) & ~(size_t)63;
    ks_rng rng = {999};
    uint8_t *W = ks_malloc_aligned(rb * rows);
    for (size_t i = 0; i < rb * rows; i++) W[i] = (uint8_t)ks_rng_next(&rng);
    for (size_t o = 0; o < rb * rows; o += bb)
        for (int k = 0; k < 2; k++) {
            ks_f16 d = ks_f32_to_f16((float)(0.001 + 0.01 * ks_rng_uniform(&rng)));
            memcpy(W + o + 2 * k, &d, 2);
        }
    ks_weight wt = {.type = t, .rows = rows, .cols = cols, .data = W};
    ks_pool *pool2 = NULL;
    assert_int_equal(ks_pool_create(2, &pool2), KS_OK);
    static const int64_t ns[] = {8, 11, 21};
    for (size_t ni = 0; ni < 3; ni++) {
        const int64_t n = ns[ni];
        float *X = make_x(n, cols, 500 + ni);
        uint8_t *xq = ks_malloc_aligned(ks_matmul_scratch_bytes(t, cols, n));
        for (int64_t c = 0; c < n; c++) ks_matmul_quantize_x(&wt, X + c * cols, c, xq);
        float *Y = ks_malloc(sizeof(float) * (size_t)(n * rows));
        for (int p = 0; p < 2; p++) {
            wmat m = {t, rows, cols, W, NULL};
            run_matmul(p ? pool2 : NULL, &m, X, n, Y);
            for (int64_t c = 0; c < n; c++)
                for (int64_t r = 0; r < 16; r++) { /* rows 0-15: two whole tiles (16-20: the other kernels) */
                    const ks_block_q4_k *wb = (const ks_block_q4_k *)(W + (size_t)r * rb); /* Q4_K's fields, */
                    const ks_block_q5_k *w5 = (const ks_block_q5_k *)(W + (size_t)r * rb);  /* or Q5_K's */
                    const ks_block_q8_k *a = (const ks_block_q8_k *)(xq + (size_t)c * xs);
                    float acc = 0.0f;
                    for (int64_t b = 0; b < nb; b++) {
                        int sc[8], mn[8];
                        q4k_scales_ref(q5 ? w5[b].scales : wb[b].scales, sc, mn);
                        int32_t isum = 0, msum = 0;
                        for (int s = 0; s < 8; s++) {
                            int32_t dot = 0;
                            for (int l = 0; l < 32; l++) {
                                const uint8_t *qs = q5 ? w5[b].qs : wb[b].qs;
                                int q = (qs[32 * (s / 2) + l] >> (4 * (s & 1))) & 0xF;
                                if (q5) q |= ((w5[b].qh[l] >> s) & 1) << 4;
                                dot += q * a[b].qs[32 * s + l];
                            }
                            isum += sc[s] * dot;
                            msum += mn[s] * (a[b].bsums[2 * s] + a[b].bsums[2 * s + 1]);
                        }
                        const float dd = ks_f16_to_f32(q5 ? w5[b].d : wb[b].d) * a[b].d,
                                    dm = ks_f16_to_f32(q5 ? w5[b].dmin : wb[b].dmin) * a[b].d;
                        acc = fmaf((float)isum, dd, acc);
                        acc = fmaf(-(float)msum, dm, acc);
                    }
                    if (memcmp(&acc, &Y[c * rows + r], sizeof(float)))
                        fprintf(stderr, "FAIL %s k8 n=%lld row %lld vec %lld: %.9g vs emulated %.9g\n", ks_dtype_name(t), (long long)n,
                                (long long)r, (long long)c, Y[c * rows + r], acc);
                    assert_memory_equal(&acc, &Y[c * rows + r], sizeof(float));
                }
        }
        ks_free(Y);
        ks_free_aligned(xq);
        ks_free(X);
    }
    ks_pool_destroy(pool2);
    ks_free_aligned(W);
    }
    ks_simd_force(saved);
}

/* The AVX2 eight-row Q6_K tile: per output and super-block
 * acc = fma((float)(isum - 32 corr), d * da, acc), isum = sum_s sc_s (q_s . a_s)
 * over the 16-weight sub-blocks (q 0..63), corr = sum_s sc_s bsum_s; bit
 * for bit, as test_matmul_avx2_k8. */
static void test_matmul_avx2_q6_k8(void **state) {
    (void)state;
    ks_simd_level hw = ks_simd_detect();
    if (!ks_simd_x86(hw)) skip();
    ks_simd_level saved = ks_simd_force(KS_SIMD_AVX2);
    const int64_t rows = 21, cols = 768, nb = cols / 256;
    const size_t rb = ks_dtype_row_bytes(KS_DTYPE_Q6_K, cols), xs = (nb * sizeof(ks_block_q8_k) + 63) & ~(size_t)63;
    ks_rng rng = {777};
    uint8_t *W = ks_malloc_aligned(rb * rows);
    for (size_t i = 0; i < rb * rows; i++) W[i] = (uint8_t)ks_rng_next(&rng);
    for (size_t o = 0; o < rb * rows; o += sizeof(ks_block_q6_k)) {
        ks_f16 d = ks_f32_to_f16((float)(0.001 + 0.01 * ks_rng_uniform(&rng)));
        memcpy(W + o + offsetof(ks_block_q6_k, d), &d, 2);
    }
    ks_weight wt = {.type = KS_DTYPE_Q6_K, .rows = rows, .cols = cols, .data = W};
    ks_pool *pool2 = NULL;
    assert_int_equal(ks_pool_create(2, &pool2), KS_OK);
    static const int64_t ns[] = {8, 11, 21};
    for (size_t ni = 0; ni < 3; ni++) {
        const int64_t n = ns[ni];
        float *X = make_x(n, cols, 600 + ni);
        uint8_t *xq = ks_malloc_aligned(ks_matmul_scratch_bytes(KS_DTYPE_Q6_K, cols, n));
        for (int64_t c = 0; c < n; c++) ks_matmul_quantize_x(&wt, X + c * cols, c, xq);
        float *Y = ks_malloc(sizeof(float) * (size_t)(n * rows));
        for (int p = 0; p < 2; p++) {
            wmat m = {KS_DTYPE_Q6_K, rows, cols, W, NULL};
            run_matmul(p ? pool2 : NULL, &m, X, n, Y);
            for (int64_t c = 0; c < n; c++)
                for (int64_t r = 0; r < 16; r++) {
                    const ks_block_q6_k *wb = (const ks_block_q6_k *)(W + (size_t)r * rb);
                    const ks_block_q8_k *a = (const ks_block_q8_k *)(xq + (size_t)c * xs);
                    float acc = 0.0f;
                    for (int64_t b = 0; b < nb; b++) {
                        int32_t isum = 0, corr = 0;
                        for (int s = 0; s < 16; s++) {
                            int32_t dot = 0;
                            for (int e = 16 * s; e < 16 * s + 16; e++) {
                                const int h = e / 128, i = (e % 128) / 32, l = e % 32;
                                const uint8_t ql = wb[b].ql[64 * h + 32 * (i & 1) + l];
                                const int q = (i >= 2 ? ql >> 4 : ql & 0xF) | ((wb[b].qh[32 * h + l] >> (2 * i)) & 3) << 4;
                                dot += q * a[b].qs[e];
                            }
                            isum += wb[b].scales[s] * dot;
                            corr += wb[b].scales[s] * a[b].bsums[s];
                        }
                        acc = fmaf((float)(isum - 32 * corr), ks_f16_to_f32(wb[b].d) * a[b].d, acc);
                    }
                    if (memcmp(&acc, &Y[c * rows + r], sizeof(float)))
                        fprintf(stderr, "FAIL q6_k8 n=%lld row %lld vec %lld: %.9g vs emulated %.9g\n", (long long)n,
                                (long long)r, (long long)c, Y[c * rows + r], acc);
                    assert_memory_equal(&acc, &Y[c * rows + r], sizeof(float));
                }
        }
        ks_free(Y);
        ks_free_aligned(xq);
        ks_free(X);
    }
    ks_pool_destroy(pool2);
    ks_free_aligned(W);
    ks_simd_force(saved);
}

/* The AVX2 eight-row IQ4_XS tile (matmul_x86_tiles.c): per output and
 * super-block acc = fma((float)isum, d * da, acc), isum = sum_s (ls_s - 32)
 * (q_s . a_s) exact over the 32-weight sub-blocks (q the IQ4 levels); bit
 * for bit, as test_matmul_avx2_k8.  Rows 16-20 run the one-row kernel,
 * which takes the same steps: they are checked too, and n = 1 (decode)
 * against the same emulation. */
static void test_matmul_avx2_iq4_xs8(void **state) {
    (void)state;
    ks_simd_level hw = ks_simd_detect();
    if (!ks_simd_x86(hw)) skip();
    ks_simd_level saved = ks_simd_force(KS_SIMD_AVX2);
    assert_non_null(ks_matmul_kernel_name(KS_DTYPE_IQ4_XS, false));
    const int64_t rows = 21, cols = 768, nb = cols / 256;
    const size_t rb = ks_dtype_row_bytes(KS_DTYPE_IQ4_XS, cols), xs = (nb * sizeof(ks_block_q8_k) + 63) & ~(size_t)63;
    ks_rng rng = {4242};
    uint8_t *W = ks_malloc_aligned(rb * rows);
    for (size_t i = 0; i < rb * rows; i++) W[i] = (uint8_t)ks_rng_next(&rng);
    for (size_t o = 0; o < rb * rows; o += sizeof(ks_block_iq4_xs)) {
        ks_f16 d = ks_f32_to_f16((float)(0.001 + 0.01 * ks_rng_uniform(&rng)));
        memcpy(W + o + offsetof(ks_block_iq4_xs, d), &d, 2);
    }
    ks_weight wt = {.type = KS_DTYPE_IQ4_XS, .rows = rows, .cols = cols, .data = W};
    ks_pool *pool2 = NULL;
    assert_int_equal(ks_pool_create(2, &pool2), KS_OK);
    static const int64_t ns[] = {1, 8, 11, 21};
    for (size_t ni = 0; ni < 4; ni++) {
        const int64_t n = ns[ni];
        float *X = make_x(n, cols, 700 + ni);
        uint8_t *xq = ks_malloc_aligned(ks_matmul_scratch_bytes(KS_DTYPE_IQ4_XS, cols, n));
        for (int64_t c = 0; c < n; c++) ks_matmul_quantize_x(&wt, X + c * cols, c, xq);
        float *Y = ks_malloc(sizeof(float) * (size_t)(n * rows));
        for (int p = 0; p < 2; p++) {
            wmat m = {KS_DTYPE_IQ4_XS, rows, cols, W, NULL};
            run_matmul(p ? pool2 : NULL, &m, X, n, Y);
            for (int64_t c = 0; c < n; c++)
                for (int64_t r = 0; r < rows; r++) {
                    const ks_block_iq4_xs *wb = (const ks_block_iq4_xs *)(W + (size_t)r * rb);
                    const ks_block_q8_k *a = (const ks_block_q8_k *)(xq + (size_t)c * xs);
                    float acc = 0.0f;
                    for (int64_t b = 0; b < nb; b++) {
                        int32_t isum = 0;
                        for (int s = 0; s < 8; s++) {
                            const int ls = ((wb[b].scales_l[s / 2] >> (4 * (s & 1))) & 0xF) | (((wb[b].scales_h >> (2 * s)) & 3) << 4);
                            int32_t dot = 0;
                            for (int l = 0; l < 16; l++) {
                                const uint8_t q = wb[b].qs[16 * s + l];
                                dot += ks_iq4_values[q & 0xF] * a[b].qs[32 * s + l] + ks_iq4_values[q >> 4] * a[b].qs[32 * s + 16 + l];
                            }
                            isum += (ls - 32) * dot;
                        }
                        acc = fmaf((float)isum, ks_f16_to_f32(wb[b].d) * a[b].d, acc);
                    }
                    if (memcmp(&acc, &Y[c * rows + r], sizeof(float)))
                        fprintf(stderr, "FAIL iq4_xs8 n=%lld row %lld vec %lld: %.9g vs emulated %.9g\n", (long long)n,
                                (long long)r, (long long)c, Y[c * rows + r], acc);
                    assert_memory_equal(&acc, &Y[c * rows + r], sizeof(float));
                }
        }
        ks_free(Y);
        ks_free_aligned(xq);
        ks_free(X);
    }
    ks_pool_destroy(pool2);
    ks_free_aligned(W);
    ks_simd_force(saved);
}

/* The transposed Q8_0 panels' arithmetic in scalar C (matmul_x86_panel.c, "Q8_0
 * transposed panels"): X quantized with a power-of-two scale per block
 * (dx = 2^k, k the least integer with amax <= 127 * 2^k, within [-100, 100];
 * q = round(x / dx), ties to even), then per output, block after block,
 * acc = fma((float)sum(w q), dw * dx, acc).  -std=c11 keeps the compiler
 * from fusing the multiply, so this is the kernel's result bit for bit. */
static float pow2_scale(float amax) {
    int k = -100;
    while (k < 100 && 127.0f * ldexpf(1.0f, k) < amax) k++;
    return ldexpf(1.0f, k);
}

static void p16_emulate(const void *W, int64_t rows, int64_t cols, const float *X, int64_t n, float *Y) {
    const int64_t nb = cols / 32;
    int8_t *q = ks_malloc((size_t)cols);
    float *dx = ks_malloc(sizeof(float) * (size_t)nb);
    const ks_block_q8_0 *wb = W;
    for (int64_t c = 0; c < n; c++) {
        for (int64_t b = 0; b < nb; b++) {
            float amax = 0.0f;
            for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(X[c * cols + 32 * b + i]));
            dx[b] = pow2_scale(amax);
            for (int i = 0; i < 32; i++) q[32 * b + i] = (int8_t)lrintf(X[c * cols + 32 * b + i] / dx[b]);
        }
        for (int64_t r = 0; r < rows; r++) {
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const ks_block_q8_0 *blk = &wb[r * nb + b];
                int32_t p = 0;
                for (int i = 0; i < 32; i++) p += blk->qs[i] * q[32 * b + i];
                float s = ks_f16_to_f32(blk->d) * dx[b];
                acc = fmaf((float)p, s, acc);
            }
            Y[c * rows + r] = acc;
        }
    }
    ks_free(q);
    ks_free(dx);
}

/* Packed Q8_0 and Q4_0 (ks_matmul_pack).  Transposed Q8_0 panels (rows a
 * multiple of 16, AVX-512): the scalar emulation above, bit for bit, at every
 * n, with and without a pool — the engine's promise that chunked prefill
 * equals one prefill and decode equals prefill rests on it — and within the
 * quantization tolerance of the double reference.  Every other packed form,
 * and every level below AVX-512: bit-identical to the unpacked matmul.  Rows
 * of zeros included. */
static void test_matmul_packed_q8_0(void **state) {
    (void)state;
    ks_pool *pool2 = NULL;
    assert_int_equal(ks_pool_create(2, &pool2), KS_OK);
    /* 240 x 2048: 15 panels, more than one L2 row block per thread, each
     * block ending in a panel the two-panel prefill tile leaves over; n = 12
     * and 33: whole 6-vector tiles and a tail; n = 100: more than one
     * 48-vector unit of the balanced prefill split, the last one short;
     * 1056 columns: 33 blocks, two 16-block batches of the quantizer and one over */
    static const int64_t shapes[][2] = {{4, 128}, {12, 384}, {64, 256}, {36, 2048}, {16, 96}, {48, 2048}, {240, 2048},
                                                {32, 1056}};
    enum { NMAX = 100 };
    double worst_ratio = 0;
    static const int64_t ns[] = {1, 3, 4, 5, 9, 12, 33, NMAX};
    const size_t n_shapes = sizeof shapes / sizeof shapes[0];
    for (size_t si = 0; si < 2 * n_shapes; si++) {
        const ks_dtype t = si % 2 ? KS_DTYPE_Q4_0 : KS_DTYPE_Q8_0;
        const int64_t rows = shapes[si / 2][0], cols = shapes[si / 2][1];
        if (t == KS_DTYPE_Q4_0 && cols % 128) continue; /* not packable: nothing to compare */
        wmat m = make_w(t, rows, cols, 91 + si);
        memset(m.W, 0, ks_dtype_row_bytes(t, cols)); /* row 0: zeros */
        size_t bytes = ks_dtype_row_bytes(t, cols) * (size_t)rows;
        void *P = ks_malloc_aligned(bytes + 64);
        memcpy((uint8_t *)P + 32, m.W, bytes); /* 32-byte aligned only, as in a GGUF file */
        ks_weight w = {.type = t, .rows = rows, .cols = cols, .data = (uint8_t *)P + 32};
        bool packs = ks_matmul_can_pack(&w);
        ks_matmul_pack(&w);
        const bool p16 = packs && t == KS_DTYPE_Q8_0 && rows % 16 == 0;
        assert_int_equal(w.layout, !packs ? KS_WEIGHT_ROWS
                                   : p16  ? KS_WEIGHT_Q8_0_P16
                                   : t == KS_DTYPE_Q8_0 ? KS_WEIGHT_Q8_0_P4
                                                        : KS_WEIGHT_Q4_0_P4);
        float *X = make_x(NMAX, cols, 92);
        float *Y = ks_malloc(sizeof(float) * (size_t)(NMAX * rows)), *Yp = ks_malloc(sizeof(float) * (size_t)(NMAX * rows));
        float *Yr = ks_malloc(sizeof(float) * (size_t)(NMAX * rows));
        void *scratch = ks_malloc_aligned(ks_matmul_scratch_bytes(t, cols, NMAX));
        double *Yd = ks_malloc(sizeof(double) * (size_t)(NMAX * rows)); /* exact weights times exact X */
        for (int64_t c = 0; c < NMAX; c++)
            for (int64_t r = 0; r < rows; r++) {
                double a = 0;
                for (int64_t i = 0; i < cols; i++) a += (double)m.Wd[r * cols + i] * X[c * cols + i];
                Yd[c * rows + r] = a;
            }
        if (p16) p16_emulate(m.W, rows, cols, X, NMAX, Yr);
        for (int lv = KS_SIMD_SCALAR; lv <= (int)ks_simd_detect(); lv++) {
            ks_simd_level prev = ks_simd_force((ks_simd_level)lv);
            for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
                for (int pi = 0; pi < 2; pi++) {
                    ks_pool *pool = pi ? pool2 : NULL;
                    ks_matmul(pool, t, m.W, rows, cols, X, ns[ni], Y, scratch);
                    for (int64_t i = 0; i < ns[ni] * rows; i++) Yp[i] = NAN;
                    ks_matmul_weight(pool, &w, X, ns[ni], Yp, scratch);
                    if (p16 && lv == KS_SIMD_AVX512) {
                        assert_memory_equal(Yr, Yp, sizeof(float) * (size_t)(ns[ni] * rows));
                        /* the panels' power-of-two activation scales against the file layout's
                         * amax / 127: a step up to twice as coarse, so an error against the
                         * exact product up to about twice as large (1.4x on average) */
                        double ep = 0, er = 0, scale2 = 0;
                        for (int64_t i = 0; i < ns[ni] * rows; i++) {
                            ep += (Yp[i] - Yd[i]) * (Yp[i] - Yd[i]);
                            er += (Y[i] - Yd[i]) * (Y[i] - Yd[i]);
                            scale2 += Yd[i] * Yd[i];
                        }
                        if (er > 0 && ep / er > worst_ratio) worst_ratio = ep / er;
                        assert_true(ep <= 6.25 * er + 1e-12 * scale2); /* RMS at most 2.5x */
                    } else {
                        assert_memory_equal(Y, Yp, sizeof(float) * (size_t)(ns[ni] * rows));
                    }
                }
            ks_simd_force(prev);
        }
        ks_free_aligned(scratch);
        ks_free(X);
        ks_free(Y);
        ks_free(Yp);
        ks_free(Yr);
        ks_free(Yd);
        ks_free_aligned(P);
        free_w(&m);
    }
    printf("packed q8_0 panels: squared error against the exact product at most %.2fx the file layout's\n", worst_ratio);
    ks_pool_destroy(pool2);
}

/* Q4_K repacked into eight-row groups (ks_matmul_pack: four-byte lanes on
 * AVX2 hosts, eight-byte lanes on AVX-512 VNNI hosts): at every level, every
 * n (decode 1-9, prefill tiles and tails, the balanced prefill split) and
 * with and without a pool, the very bits of the product over the file's
 * rows at that level, which test_matmul_avx2_k8 ties to the scalar
 * emulation; the AVX-512 group kernel has the AVX2 level's float order
 * (matmul_x86_q4k.c), so at AVX-512 its reference is the file's rows at
 * AVX2.  Vector 0's outputs are checked to be the same bits at every n
 * (decode against prefill).  Quantized weights and raw random bytes (every
 * nibble and 6-bit scale); row counts that are no multiple of 8 (13, 12)
 * keep the file layout. */
static void packed_k_case(ks_dtype t) {
    ks_pool *pool2 = NULL;
    assert_int_equal(ks_pool_create(2, &pool2), KS_OK);
    static const int64_t shapes[][2] = {{8, 256}, {24, 768}, {12, 512}, {200, 2048}, {40, 8192}, {13, 256}, {8, 2560}};
    static const int64_t ns[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 33};
    enum { NMAX = 33 };
    const bool q6 = t == KS_DTYPE_Q6_K, iq4 = t == KS_DTYPE_IQ4_XS, q5 = t == KS_DTYPE_Q5_K;
    for (size_t si = 0; si < 2 * sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t rows = shapes[si / 2][0], cols = shapes[si / 2][1];
        const bool raw = si % 2;
        wmat m = make_w(t, rows, cols, 71 + si);
        const size_t rb = ks_dtype_row_bytes(t, cols), bytes = rb * (size_t)rows;
        if (raw) {
            ks_rng rng = {1234 + si};
            for (size_t i = 0; i < bytes; i++) ((uint8_t *)m.W)[i] = (uint8_t)ks_rng_next(&rng);
            for (size_t o = 0; o < bytes; o += ks_dtype_row_bytes(t, KS_QK_K))
                for (int k = 0; k < (q6 || iq4 ? 1 : 2); k++) {
                    ks_f16 d = ks_f32_to_f16((float)(0.001 + 0.01 * ks_rng_uniform(&rng)));
                    memcpy((uint8_t *)m.W + o + (q6 ? offsetof(ks_block_q6_k, d) : 2 * (size_t)k), &d, 2);
                }
        }
        void *P = ks_malloc_aligned(bytes + 64);
        memcpy((uint8_t *)P + 32, m.W, bytes); /* 32-byte aligned only, as in a GGUF file */
        ks_weight w = {.type = t, .rows = rows, .cols = cols, .data = (uint8_t *)P + 32};
        const bool packs = ks_matmul_can_pack(&w);
        const bool z = ks_simd_detect() == KS_SIMD_AVX512;
        assert_int_equal(packs, rows % 8 == 0 && ((!q6 && !iq4 && !q5 && ks_simd_detect() == KS_SIMD_AVX2) || z));
        assert_int_equal(ks_matmul_pack(&w), KS_OK);
        assert_int_equal(w.layout, !packs ? KS_WEIGHT_ROWS
                                   : q6   ? KS_WEIGHT_Q6_K_X8Q
                                   : iq4  ? KS_WEIGHT_IQ4_XS_X8Q
                                   : q5   ? KS_WEIGHT_Q5_K_X8Q
                                   : z    ? KS_WEIGHT_Q4_K_X8Q
                                          : KS_WEIGHT_Q4_K_X8);
        if (packs) assert_true(ks_matmul_worker_scratch_bytes(&w) >= 8 * rb);
        float *X = make_x(NMAX, cols, 72 + si);
        float *Y = ks_malloc(sizeof(float) * (size_t)(NMAX * rows)), *Yp = ks_malloc(sizeof(float) * (size_t)(NMAX * rows));
        float *Y1 = ks_malloc(sizeof(float) * (size_t)rows); /* vector 0 at n = 1, no pool: decode's bits */
        void *scratch = ks_malloc_aligned(ks_matmul_scratch_bytes(t, cols, NMAX));
        for (int lv = KS_SIMD_SCALAR; lv <= (int)ks_simd_detect(); lv++) {
            ks_simd_level prev = ks_simd_force((ks_simd_level)lv);
            for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
                for (int pi = 0; pi < 2; pi++) {
                    ks_pool *pool = pi ? pool2 : NULL;
                    const bool via_avx2 = packs && z && lv == KS_SIMD_AVX512;
                    if (via_avx2) ks_simd_force(KS_SIMD_AVX2);
                    ks_matmul(pool, t, m.W, rows, cols, X, ns[ni], Y, scratch);
                    if (via_avx2) ks_simd_force(KS_SIMD_AVX512);
                    for (int64_t i = 0; i < ns[ni] * rows; i++) Yp[i] = NAN;
                    ks_matmul_weight(pool, &w, X, ns[ni], Yp, scratch);
                    for (int64_t i = 0; i < ns[ni] * rows; i++)
                        if (memcmp(&Y[i], &Yp[i], sizeof(float)))
                            fprintf(stderr, "FAIL %s x8 %lldx%lld raw=%d level %d n=%lld out %lld: %.9g vs rows %.9g\n",
                                    q6 ? "q6_K" : iq4 ? "iq4_xs" : q5 ? "q5_K" : "q4_K", (long long)rows, (long long)cols,
                                    (int)raw, lv, (long long)ns[ni], (long long)i, Yp[i], Y[i]);
                    assert_memory_equal(Y, Yp, sizeof(float) * (size_t)(ns[ni] * rows));
                    /* decode and prefill: vector 0's outputs the same bits whatever n and the split */
                    if (ni == 0 && pi == 0) memcpy(Y1, Yp, sizeof(float) * (size_t)rows);
                    else assert_memory_equal(Y1, Yp, sizeof(float) * (size_t)rows);
                }
            ks_simd_force(prev);
        }
        ks_free_aligned(scratch);
        ks_free(X);
        ks_free(Y);
        ks_free(Yp);
        ks_free(Y1);
        ks_free_aligned(P);
        free_w(&m);
    }
    ks_pool_destroy(pool2);
}

static void test_matmul_packed_q4_k(void **state) {
    (void)state;
    packed_k_case(KS_DTYPE_Q4_K);
}

/* Q6_K in eight-row groups (AVX-512 VNNI hosts only; elsewhere the file's
 * rows): the same checks, the AVX2 level's bits at AVX-512. */
static void test_matmul_packed_q6_k(void **state) {
    (void)state;
    packed_k_case(KS_DTYPE_Q6_K);
}

/* IQ4_XS and Q5_K in eight-row groups (AVX-512 VNNI hosts only), likewise. */
static void test_matmul_packed_iq4_xs(void **state) {
    (void)state;
    packed_k_case(KS_DTYPE_IQ4_XS);
}

static void test_matmul_packed_q5_k(void **state) {
    (void)state;
    packed_k_case(KS_DTYPE_Q5_K);
}

/* The K-quants' eight-row group layouts as data (matmul_packed_x8q.c), all
 * five: each layout's fields read every byte of a block once and write
 * every byte of the super-block once, and unpack undoes pack on random
 * bytes (the output buffers filled with other bytes first, so a byte left
 * unwritten shows).  The X8 layout, which only an AVX2 host packs, is also
 * multiplied here at every level (through its AVX2 kernel at AVX2): the
 * bits of the file's rows at that level. */
static void test_matmul_group_layouts(void **state) {
    (void)state;
    static const ks_weight_layout layouts[] = {KS_WEIGHT_Q4_K_X8, KS_WEIGHT_Q4_K_X8Q, KS_WEIGHT_Q6_K_X8Q,
                                               KS_WEIGHT_IQ4_XS_X8Q, KS_WEIGHT_Q5_K_X8Q};
    assert_null(ks_matmul_group_layout_of(KS_WEIGHT_ROWS));
    assert_null(ks_matmul_group_layout_of(KS_WEIGHT_Q8_0_P16));
    for (size_t li = 0; li < sizeof layouts / sizeof layouts[0]; li++) {
        const ks_matmul_group_layout *g = ks_matmul_group_layout_of(layouts[li]);
        assert_non_null(g);
        assert_int_equal(g->layout, layouts[li]);
        assert_int_equal(g->block_bytes, ks_dtype_row_bytes(g->type, KS_QK_K));
        assert_int_equal(g->sbytes, 8 * g->block_bytes);
        int src_uses[256] = {0}, dst_uses[2048] = {0};
        assert_true(g->block_bytes <= 256 && g->sbytes <= 2048);
        for (int f = 0; f < g->nfields; f++) {
            const ks_matmul_group_field *fl = &g->field[f];
            assert_true(fl->lane == 1 || fl->lane == 2 || fl->lane == 4 || fl->lane == 8);
            for (int c = 0; c < fl->count; c++)
                for (int i = 0; i < fl->lane; i++) {
                    const int s = fl->src + fl->lane * c + i, d0 = fl->dst + 8 * fl->lane * c + i;
                    assert_true(s < g->block_bytes && d0 + 7 * fl->lane < g->sbytes);
                    src_uses[s]++;
                    for (int r = 0; r < 8; r++) dst_uses[d0 + fl->lane * r]++;
                }
        }
        for (int i = 0; i < g->block_bytes; i++) assert_int_equal(src_uses[i], 1);
        for (int i = 0; i < g->sbytes; i++) assert_int_equal(dst_uses[i], 1);
        for (int64_t nb = 1; nb <= 5; nb += 2) {
            const size_t bytes = 8 * (size_t)nb * g->block_bytes;
            uint8_t *rows = ks_malloc(bytes), *grp = ks_malloc(bytes), *back = ks_malloc(bytes);
            ks_rng rng = {900 + 10 * li + (uint64_t)nb};
            for (size_t i = 0; i < bytes; i++) rows[i] = (uint8_t)ks_rng_next(&rng);
            memset(grp, 0x5A, bytes);
            ks_matmul_group_pack(g, rows, nb, grp);
            memset(back, 0xA5, bytes);
            ks_matmul_group_unpack(g, grp, nb, back);
            assert_memory_equal(rows, back, bytes);
            ks_free(rows);
            ks_free(grp);
            ks_free(back);
        }
    }
    /* X8 (four-byte lanes) multiplied: the layout its AVX2 kernel reads */
    enum { ROWS = 16, COLS = 512, NMAX = 9 };
    wmat m = make_w(KS_DTYPE_Q4_K, ROWS, COLS, 911);
    const size_t bytes = ks_dtype_row_bytes(KS_DTYPE_Q4_K, COLS) * ROWS;
    void *P = ks_malloc_aligned(bytes);
    memcpy(P, m.W, bytes);
    ks_weight w = {.type = KS_DTYPE_Q4_K, .rows = ROWS, .cols = COLS, .data = P};
    assert_int_equal(ks_matmul_group_pack_weight(&w, KS_WEIGHT_Q4_K_X8), KS_OK);
    assert_int_equal(w.layout, KS_WEIGHT_Q4_K_X8);
    float *X = make_x(NMAX, COLS, 912), *Y = ks_malloc(sizeof(float) * NMAX * ROWS),
          *Yp = ks_malloc(sizeof(float) * NMAX * ROWS);
    void *scratch = ks_malloc_aligned(ks_matmul_scratch_bytes(KS_DTYPE_Q4_K, COLS, NMAX));
    for (int lv = KS_SIMD_SCALAR; lv <= (int)ks_simd_detect(); lv++) {
        ks_simd_level prev = ks_simd_force((ks_simd_level)lv);
        for (int64_t n = 1; n <= NMAX; n += 4) {
            ks_matmul(NULL, KS_DTYPE_Q4_K, m.W, ROWS, COLS, X, n, Y, scratch);
            ks_matmul_weight(NULL, &w, X, n, Yp, scratch);
            assert_memory_equal(Y, Yp, sizeof(float) * (size_t)(n * ROWS));
        }
        ks_simd_force(prev);
    }
    ks_free_aligned(scratch);
    ks_free(X);
    ks_free(Y);
    ks_free(Yp);
    ks_free_aligned(P);
    free_w(&m);
}

/* ks_matmul_quantize_x row by row, then the product with x_ready: the very
 * bits of the product that quantizes X itself, for every type and layout
 * (file rows, the 4-row panels, the transposed Q8_0 panels), at decode and
 * prefill sizes, with and without a pool. */
static void test_matmul_quantize_x(void **state) {
    (void)state;
    ks_pool *pool2 = NULL;
    assert_int_equal(ks_pool_create(2, &pool2), KS_OK);
    static const ks_dtype types[] = {KS_DTYPE_Q8_0, KS_DTYPE_Q4_0, KS_DTYPE_Q4_K, KS_DTYPE_Q6_K, KS_DTYPE_F16,
                                     KS_DTYPE_Q5_0, KS_DTYPE_Q4_1, KS_DTYPE_Q5_K, KS_DTYPE_IQ4_XS, KS_DTYPE_MXFP4};
    enum { ROWS = 48, COLS = 512, NMAX = 40 };
    static const int64_t ns[] = {1, 5, NMAX};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (int packed = 0; packed < 2; packed++) {
            wmat m = make_w(types[ti], ROWS, COLS, 300 + ti);
            ks_weight w = {.type = types[ti], .rows = ROWS, .cols = COLS, .data = m.W};
            if (packed) {
                if (!ks_matmul_can_pack(&w)) { free_w(&m); continue; }
                assert_int_equal(ks_matmul_pack(&w), KS_OK);
            }
            float *X = make_x(NMAX, COLS, 301);
            float *Y = ks_malloc(sizeof(float) * NMAX * ROWS), *Yq = ks_malloc(sizeof(float) * NMAX * ROWS);
            void *scratch = ks_malloc_aligned(ks_matmul_scratch_bytes(types[ti], COLS, NMAX));
            for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
                for (int pi = 0; pi < 2; pi++) {
                    ks_pool *pool = pi ? pool2 : NULL;
                    ks_matmul_weight(pool, &w, X, ns[ni], Y, scratch);
                    memset(scratch, 0xA5, ks_matmul_scratch_bytes(types[ti], COLS, ns[ni])); /* nothing left over */
                    for (int64_t c = 0; c < ns[ni]; c++) ks_matmul_quantize_x(&w, X + c * COLS, c, scratch);
                    ks_matmul_weight_ex(pool, &w, X, ns[ni], Yq, scratch, true);
                    assert_memory_equal(Y, Yq, sizeof(float) * (size_t)(ns[ni] * ROWS));
                }
            ks_free_aligned(scratch);
            ks_free(X);
            ks_free(Y);
            ks_free(Yq);
            free_w(&m);
        }
    ks_pool_destroy(pool2);
}

/* The transposed panels scale by adding an exponent to the bits of each
 * block scale, which is the product only for finite scales: a block whose
 * scale is 0 (quants anything) still counts for nothing, bit for bit as in
 * the scalar emulation, and a matrix with an infinite or NaN scale is left
 * in the file layout, whose products carry it through. */
static void test_matmul_packed_scales(void **state) {
    (void)state;
    if (ks_simd_detect() != KS_SIMD_AVX512) skip(); /* the transposed panels exist only there */
    enum { ROWS = 32, COLS = 256, N = 20 };
    wmat m = make_w(KS_DTYPE_Q8_0, ROWS, COLS, 401);
    ks_block_q8_0 *blk = m.W;
    blk[3].d = 0; /* row 0, block 3: quants kept, scale +0 */
    blk[(size_t)5 * (COLS / 32) + 1].d = 0x8000; /* row 5, block 1: -0 */
    float *X = make_x(N, COLS, 402), *Yr = ks_malloc(sizeof(float) * N * ROWS), *Y = ks_malloc(sizeof(float) * N * ROWS);
    p16_emulate(m.W, ROWS, COLS, X, N, Yr);
    size_t bytes = ks_dtype_row_bytes(KS_DTYPE_Q8_0, COLS) * ROWS;
    void *P = ks_malloc_aligned(bytes);
    memcpy(P, m.W, bytes);
    ks_weight w = {.type = KS_DTYPE_Q8_0, .rows = ROWS, .cols = COLS, .data = P};
    assert_int_equal(ks_matmul_pack(&w), KS_OK);
    assert_int_equal(w.layout, KS_WEIGHT_Q8_0_P16);
    void *scratch = ks_malloc_aligned(ks_matmul_scratch_bytes(KS_DTYPE_Q8_0, COLS, N));
    ks_matmul_weight(NULL, &w, X, N, Y, scratch);
    assert_memory_equal(Yr, Y, sizeof(float) * N * ROWS);
    /* an infinite scale: not packed, and the products it enters are not finite */
    memcpy(P, m.W, bytes);
    ((ks_block_q8_0 *)P)[(size_t)7 * (COLS / 32)].d = 0x7C00;
    ks_weight wi = {.type = KS_DTYPE_Q8_0, .rows = ROWS, .cols = COLS, .data = P};
    assert_int_equal(ks_matmul_pack(&wi), KS_OK);
    assert_int_equal(wi.layout, KS_WEIGHT_ROWS);
    ks_matmul_weight(NULL, &wi, X, N, Y, scratch);
    assert_false(isfinite(Y[7]));
    assert_true(isfinite(Y[6]));
    ks_free_aligned(scratch);
    ks_free_aligned(P);
    ks_free(X);
    ks_free(Y);
    ks_free(Yr);
    free_w(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_simd_levels),
        cmocka_unit_test(test_dot_row_ref),
        cmocka_unit_test(test_matmul_vs_reference),
        cmocka_unit_test(test_matmul_float_tails),
        cmocka_unit_test(test_matmul_chunked),
        cmocka_unit_test(test_matmul_extremes),
        cmocka_unit_test(test_matmul_kquant_raw),
        cmocka_unit_test(test_matmul_avx2_x2),
        cmocka_unit_test(test_matmul_i8mm_x2),
        cmocka_unit_test(test_matmul_avx2_k8),
        cmocka_unit_test(test_matmul_avx2_q6_k8),
        cmocka_unit_test(test_matmul_packed_q4_k),
        cmocka_unit_test(test_matmul_packed_q6_k),
        cmocka_unit_test(test_matmul_packed_iq4_xs),
        cmocka_unit_test(test_matmul_packed_q5_k),
        cmocka_unit_test(test_matmul_group_layouts),
        cmocka_unit_test(test_matmul_avx2_iq4_xs8),
        cmocka_unit_test(test_matmul_packed_q8_0),
        cmocka_unit_test(test_matmul_quantize_x),
        cmocka_unit_test(test_matmul_packed_scales),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
