/*
 * test_select_simd.c — the selection kernels at every SIMD level this CPU
 * has against the scalar level, small enough to run under emulation (the
 * policy tests that also cover them take hours under QEMU):
 *  - ks_topk_scratch (the sampled filter and the emit: AVX-512, AVX2 and
 *    NEON forms) returns exactly the scalar indices in the same order, on
 *    random values, many ties, ties at the threshold, NaNs and -0, for k far
 *    below n (the sampled path) and k near n / 8 and above (the full radix
 *    select);
 *  - ks_page_upper_bounds8_pages and ks_page_upper_bounds16_pages (Quest's
 *    every-page scoring) give the scalar bounds up to rounding (the vector
 *    forms sum q+ hi + q- lo by FMA), for head dims with and without a
 *    16-lane remainder, group sizes 1-5 and page counts that leave 1-3 pages
 *    over; the group max alone (out = NULL) equals the max of the bounds.
 */
#include "core/simd.h"
#include "kv/kv.h"
#include "policy/policy.h"
#include "policy/policy_util.h"
#include "tensor/dtype.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static float frand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)(*s >> 40) / (float)(1u << 24);
}

/* kind 0: random; 1: 40 distinct values (ties everywhere); 2: 90% below
 * 0.9, the rest one value (ties at the threshold; the filter gives up);
 * 3: random with NaNs and signed zeros */
static void fill(float *v, int32_t n, int kind, uint64_t seed) {
    uint64_t s = seed;
    for (int32_t i = 0; i < n; i++) {
        float u = frand(&s);
        v[i] = kind == 0 ? u * 10 - 3 : kind == 1 ? (float)(int)(u * 40) : kind == 2 ? (u < 0.9f ? u : 0.95f) : u - 0.5f;
        if (kind == 3 && i % 13 == 2) v[i] = NAN;
        if (kind == 3 && i % 17 == 3) v[i] = i % 2 ? -0.0f : 0.0f;
    }
}

static void test_topk_levels(void **state) {
    (void)state;
    static const int32_t shapes[][2] = {{1024, 62}, {2048, 64}, {512, 30}, {32768, 1980}, {4096, 8},
                                        {333, 40},  {1000, 125}, {1000, 126}, {300, 200}, {257, 1}};
    enum { NMAX = 32768 };
    float *v = malloc(sizeof(float) * NMAX), *scr = malloc(sizeof(float) * NMAX);
    int32_t *ref = malloc(sizeof(int32_t) * NMAX), *got = malloc(sizeof(int32_t) * NMAX);
    ks_simd_level hw = ks_simd_detect(), saved = ks_simd_current();
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++)
        for (int kind = 0; kind < 4; kind++) {
            int32_t n = shapes[sh][0], k = shapes[sh][1];
            fill(v, n, kind, 11 + sh * 5 + (uint64_t)kind);
            ks_simd_force(KS_SIMD_SCALAR);
            assert_int_equal(ks_topk_scratch(v, n, k, ref, scr), k);
            for (int lv = KS_SIMD_SCALAR + 1; lv <= (int)hw; lv++) {
                ks_simd_force((ks_simd_level)lv);
                if (ks_simd_current() != (ks_simd_level)lv) continue; /* another architecture's level */
                for (int with_scratch = 0; with_scratch < 2; with_scratch++) {
                    memset(got, 0xff, sizeof(int32_t) * (size_t)n);
                    assert_int_equal(ks_topk_scratch(v, n, k, got, with_scratch ? scr : NULL), k);
                    if (memcmp(got, ref, sizeof(int32_t) * (size_t)k))
                        fail_msg("top %d of %d, kind %d, %s (%s): not the scalar indices", k, n, kind,
                                 ks_simd_name((ks_simd_level)lv), ks_topk_kernel_name());
                    if (got[k] != -1 && k < n) fail_msg("top %d of %d at %s: wrote past k", k, n, ks_simd_name((ks_simd_level)lv));
                }
            }
        }
    ks_simd_force(saved);
    free(v);
    free(scr);
    free(ref);
    free(got);
}

/* The pages' bounds (8-bit: scale, lo[hd], hi[hd]; f16: lo[hd], hi[hd]) at
 * one level: out [G][np] and the group max red [np]. */
static void pages_at(int b8, const float *q, int G, const void *const *kb, int np, int hd, float *out, float *red) {
    if (b8) ks_page_upper_bounds8_pages(q, G, (const uint8_t *const *)kb, np, hd, out, red);
    else ks_page_upper_bounds16_pages(q, G, (const uint16_t *const *)kb, np, hd, out, red);
}

static void test_page_bounds_levels(void **state) {
    (void)state;
    enum { NP = 11, GMAX = 5, HMAX = 128 };
    static const int hds[] = {64, 72, 128};
    uint8_t pg8[NP][4 + 2 * HMAX];
    uint16_t pg16[NP][2 * HMAX];
    const void *kb8[NP], *kb16[NP];
    float q[GMAX * HMAX], kmin[HMAX], kmax[HMAX];
    float ref[GMAX * NP], rref[NP], got[GMAX * NP], rgot[NP], ralone[NP];
    ks_simd_level hw = ks_simd_detect(), saved = ks_simd_current();
    for (size_t hi = 0; hi < sizeof hds / sizeof hds[0]; hi++) {
        int hd = hds[hi];
        uint64_t s = 99 + (uint64_t)hd;
        for (int i = 0; i < GMAX * hd; i++) q[i] = (frand(&s) - 0.5f) * 3.0f;
        for (int p = 0; p < NP; p++) {
            for (int i = 0; i < hd; i++) {
                kmin[i] = (frand(&s) - 0.7f) * (float)(p + 1);
                kmax[i] = kmin[i] + frand(&s) * 2.0f;
                pg16[p][i] = ks_f32_to_f16(kmin[i]);
                pg16[p][hd + i] = ks_f32_to_f16(kmax[i]);
            }
            ks_kv_bounds8_encode(kmin, kmax, hd, pg8[p]);
            kb8[p] = pg8[p];
            kb16[p] = pg16[p];
        }
        for (int b8 = 0; b8 < 2; b8++)
            for (int G = 1; G <= GMAX; G += 2)
                for (int np = 1; np <= NP; np += 3) {
                    const void *const *kb = b8 ? kb8 : kb16;
                    ks_simd_force(KS_SIMD_SCALAR);
                    pages_at(b8, q, G, kb, np, hd, ref, rref);
                    for (int lv = KS_SIMD_SCALAR + 1; lv <= (int)hw; lv++) {
                        ks_simd_force((ks_simd_level)lv);
                        if (ks_simd_current() != (ks_simd_level)lv) continue;
                        pages_at(b8, q, G, kb, np, hd, got, rgot);
                        pages_at(b8, q, G, kb, np, hd, NULL, ralone);
                        assert_memory_equal(rgot, ralone, sizeof(float) * (size_t)np);
                        for (int p = 0; p < np; p++) {
                            float top = -INFINITY;
                            for (int g = 0; g < G; g++) {
                                double mag = 0;
                                for (int i = 0; i < hd; i++) mag += fabs(q[g * hd + i]) * (fabs(kmin[i]) + fabs(kmax[i]) + 1);
                                float a = got[g * np + p], r = ref[g * np + p];
                                if (fabs((double)a - r) > 1e-5 * mag)
                                    fail_msg("%s bounds, hd %d, G %d, np %d, page %d, head %d at %s (%s): %.9g, scalar %.9g",
                                             b8 ? "8-bit" : "f16", hd, G, np, p, g, ks_simd_name((ks_simd_level)lv),
                                             ks_page_bounds_pages_kernel_name(hd), a, r);
                                top = fmaxf(top, a);
                            }
                            if (rgot[p] != top) fail_msg("page %d: group max %.9g, want %.9g", p, rgot[p], top);
                        }
                    }
                }
    }
    ks_simd_force(saved);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_topk_levels),
        cmocka_unit_test(test_page_bounds_levels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
