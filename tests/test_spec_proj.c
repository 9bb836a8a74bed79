/*
 * test_spec_proj.c — the exactness of SpeContext's batch-1 head kernels:
 * the selection must not move when they replace the generic paths.
 *
 *  - ks_spec_proj (four rows side by side, q and k in one dispatch) gives
 *    bit for bit what ks_matmul gives at n = 1, for bf16, f16 and f32
 *    weights, row counts that leave 1-3 rows over, on one thread and on a
 *    pool of three.
 * Tiny sizes: no model is loaded.
 */
#include "core/simd.h"
#include "select/policy.h"
#include "select/spec_proj.h"
#include "select/spec_score.h"
#include "tensor/dtype.h"
#include "tensor/matmul.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static float frand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xFFFFFF) / 16777216.0f * 2.0f - 1.0f;
}

static void *make_weights(ks_dtype t, int64_t rows, int64_t cols, uint64_t seed) {
    size_t n = (size_t)(rows * cols);
    uint8_t *w = ks_malloc_aligned(n * 4);
    for (size_t i = 0; i < n; i++) {
        float v = frand(&seed) * 0.1f;
        if (t == KS_DTYPE_F32) ((float *)w)[i] = v;
        else if (t == KS_DTYPE_F16) ((ks_f16 *)w)[i] = ks_f32_to_f16(v);
        else ((ks_bf16 *)w)[i] = ks_f32_to_bf16(v);
    }
    return w;
}

static void test_proj_matches_matmul(void **state) {
    (void)state;
    if (!ks_spec_proj_supported(KS_DTYPE_BF16, 64)) skip(); /* no AVX-512: p_spec uses ks_matmul */
    ks_pool *pool = NULL;
    assert_int_equal(ks_pool_create(3, &pool), KS_OK);
    const ks_dtype types[] = {KS_DTYPE_BF16, KS_DTYPE_F16, KS_DTYPE_F32};
    const int64_t rows_a[] = {1, 7, 33, 130}, rows_b[] = {5, 2, 64, 31}, cols_v[] = {16, 48, 512};
    for (int ti = 0; ti < 3; ti++)
        for (int ri = 0; ri < 4; ri++)
            for (int ci = 0; ci < 3; ci++)
                for (int pi = 0; pi < 2; pi++) {
                    ks_dtype t = types[ti];
                    int64_t ra = rows_a[ri], rb = rows_b[ri], cols = cols_v[ci];
                    void *wa = make_weights(t, ra, cols, 1 + ri), *wb = make_weights(t, rb, cols, 9 + ci);
                    float *x = ks_malloc_aligned(sizeof(float) * (size_t)cols);
                    uint64_t s = 77 + (uint64_t)ti;
                    for (int64_t i = 0; i < cols; i++) x[i] = frand(&s) * 3.0f;
                    float *ya = ks_malloc_aligned(sizeof(float) * (size_t)ra);
                    float *yb = ks_malloc_aligned(sizeof(float) * (size_t)rb);
                    float *ea = ks_malloc_aligned(sizeof(float) * (size_t)ra);
                    float *eb = ks_malloc_aligned(sizeof(float) * (size_t)rb);
                    ks_pool *p = pi ? pool : NULL;
                    ks_matmul(p, t, wa, ra, cols, x, 1, ea, NULL);
                    ks_matmul(p, t, wb, rb, cols, x, 1, eb, NULL);
                    ks_spec_proj_mat m[2] = {{t, wa, ra, cols, ya}, {t, wb, rb, cols, yb}};
                    ks_spec_proj(p, m, 2, x);
                    assert_memory_equal(ya, ea, sizeof(float) * (size_t)ra);
                    assert_memory_equal(yb, eb, sizeof(float) * (size_t)rb);
                    ks_free_aligned(wa);
                    ks_free_aligned(wb);
                    ks_free_aligned(x);
                    ks_free_aligned(ya);
                    ks_free_aligned(yb);
                    ks_free_aligned(ea);
                    ks_free_aligned(eb);
                }
    ks_pool_destroy(pool);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_proj_matches_matmul),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
