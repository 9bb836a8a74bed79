/*
 * test_spec_proj.c — the exactness of SpeContext's batch-1 head kernels:
 * the selection must not move when they replace the generic paths.
 *
 *  - ks_spec_proj (four rows side by side, q and k in one dispatch) gives
 *    bit for bit what ks_matmul gives at n = 1, at AVX2 and AVX-512, or at
 *    NEON, dotprod and i8mm (each level's ks_matmul; the kernel asserted by
 *    name), for bf16, f16 and f32 weights, row counts that leave 1-3 rows over, on one thread and on a
 *    pool of three.
 *  - ks_spec_group_topk (the group reduction fused with the top-k's sampled
 *    filter) returns the indices, in order, of ks_spec_group_logweights
 *    followed by ks_topk_range, for groups of 1, 3 and 4 heads and lengths
 *    with and without a 16-lane tail, at every SIMD level this CPU has, on
 *    random scores, on scores with many ties, with NaNs, and with too few
 *    entries or too large a k for the sampled filter.
 * Tiny sizes: no model is loaded.
 */
#include "core/simd.h"
#include "policy/policy.h"
#include "policy/policy_util.h"
#include "spec/spec_proj.h"
#include "spec/spec_score.h"
#include "tensor/dtype.h"
#include "matmul/matmul.h"
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
    ks_simd_level hw = ks_simd_detect(), saved = ks_simd_current();
    if (!ks_spec_proj_supported(KS_DTYPE_BF16, 64)) skip(); /* no SIMD level: p_spec uses ks_matmul */
    ks_pool *pool = NULL;
    assert_int_equal(ks_pool_create(3, &pool), KS_OK);
    const ks_dtype types[] = {KS_DTYPE_BF16, KS_DTYPE_F16, KS_DTYPE_F32};
    const int64_t rows_a[] = {1, 7, 33, 130}, rows_b[] = {5, 2, 64, 31}, cols_v[] = {16, 48, 512};
    /* each level of the CPU's family against its own ks_matmul: AVX2 and
     * AVX-512 on x86, NEON, dotprod and i8mm on ARM (all three run the NEON
     * form, as ks_matmul runs its NEON float kernels at each) */
    const bool arm = hw >= KS_SIMD_NEON;
    for (int lv = arm ? KS_SIMD_NEON : KS_SIMD_AVX2; lv <= (int)hw && (arm || lv <= (int)KS_SIMD_AVX512); lv++) {
    ks_simd_force((ks_simd_level)lv);
    assert_true(ks_spec_proj_supported(KS_DTYPE_BF16, 64));
    assert_string_equal(ks_spec_proj_kernel_name(), arm ? "neon" : lv == KS_SIMD_AVX512 ? "avx512" : "avx2");
    print_message("spec_proj at %s: %s\n", ks_simd_name((ks_simd_level)lv), ks_spec_proj_kernel_name());
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
    }
    ks_simd_force(KS_SIMD_SCALAR); /* no kernel of its own there: the caller uses ks_matmul */
    assert_false(ks_spec_proj_supported(KS_DTYPE_BF16, 64));
    assert_null(ks_spec_proj_kernel_name());
    ks_simd_force(saved);
    ks_pool_destroy(pool);
}

/* kind 0: random; 1: few distinct values (ties; the filter gives up);
 * 2: random with a NaN every 97th entry */
static void check_group_topk(int G, int32_t n, int32_t lo, int32_t hi, int32_t k, int kind, ks_simd_level lv) {
    size_t sz = sizeof(float) * (size_t)G * n;
    float *x = ks_malloc(sz), *x2 = ks_malloc(sz), *w = ks_malloc(sizeof(float) * n),
          *w2 = ks_malloc(sizeof(float) * n);
    int32_t *a = ks_malloc(sizeof(int32_t) * n), *b = ks_malloc(sizeof(int32_t) * n);
    uint64_t s = 1000 + (uint64_t)(G * 7 + kind) * 31 + (uint64_t)n;
    for (size_t i = 0; i < (size_t)G * n; i++) {
        float v = frand(&s) * 8.0f;
        if (kind == 1) v = floorf(v);
        if (kind == 2 && i % 97 == 5) v = NAN;
        x[i] = v;
    }
    memcpy(x2, x, sz);
    ks_spec_group_logweights(x, G, n, w, lv);
    int32_t na = ks_topk_range(w, lo, hi, k, a, x);
    int32_t nb = ks_spec_group_topk(x2, G, n, lo, hi, k, b, w2, lv);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, sizeof(int32_t) * (size_t)na);
    ks_free(x);
    ks_free(x2);
    ks_free(w);
    ks_free(w2);
    ks_free(a);
    ks_free(b);
}

static void test_group_topk_matches(void **state) {
    (void)state;
    const int groups[] = {1, 3, 4};
    const int32_t lens[] = {0, 100, 300, 4096, 5003};
    for (int lv = KS_SIMD_SCALAR; lv <= (int)ks_simd_detect(); lv++) {
        ks_simd_level prev = ks_simd_force((ks_simd_level)lv);
        for (int gi = 0; gi < 3; gi++)
            for (int li = 0; li < 5; li++)
                for (int kind = 0; kind < 3; kind++) {
                    int32_t n = lens[li], lo = n > 8 ? 4 : 0, hi = n > 80 && kind != 0 ? n - 64 : n; /* kind 0: the weights past n16 too */
                    const int32_t ks[] = {0, 1, (hi - lo) / 16, (hi - lo) / 8, (hi - lo) / 2, hi - lo + 3};
                    for (int ki = 0; ki < 6; ki++) check_group_topk(groups[gi], n, lo, hi, ks[ki], kind, (ks_simd_level)lv);
                }
        ks_simd_force(prev);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_proj_matches_matmul),
        cmocka_unit_test(test_group_topk_matches),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
