/*
 * policy_util.c — the group reductions every selector shares
 * (policy_util.h): G query heads' scores of one KV head reduced to one score
 * per entry or page (max, mean, or the mean of per-head softmaxes).  Below
 * the policies, beside the top-k (topk.c) and Quest's page bounds
 * (page_bounds.c).
 */
#include "policy/policy.h"
#include "core/simd.h"
#include "tensor/simd_avx2.h"
#include "tensor/simd_neon.h"

#include <math.h>
#include <string.h>

/* ----------------------------------------------------------- helpers -- */
/* (top-k: topk.c; Quest's page bounds: page_bounds.c) */

#if defined(__x86_64__)
KS_AVX2_TGT static float softmax_exp_avx2(float *x, int32_t n) { return ks_avx2_softmax_exp(x, n); }
#endif

/* x[0..n) = e^(x - max x) in place; returns their sum.  FreeKV's group
 * reduction runs it G times per selection over every competing page, so the
 * AVX2 polynomial (relative error ~2e-7) replaces libm's expf there; on
 * ARM the same polynomial in NEON quads (tensor/simd_neon.h). */
static float softmax_exp(float *x, int32_t n) {
#if defined(__x86_64__)
    if (ks_simd_current() >= KS_SIMD_AVX2) return softmax_exp_avx2(x, n);
#elif defined(__aarch64__)
    if (ks_simd_current() >= KS_SIMD_NEON) return ks_neon_softmax_exp(x, n);
#endif
    float mx = -INFINITY;
    for (int32_t i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    double sum = 0;
    for (int32_t i = 0; i < n; i++) sum += x[i] = expf(x[i] - mx);
    return (float)sum;
}

ks_status ks_group_reduce_scores(const float *scores, int32_t G, int32_t n, ks_group_reduce how, float *out) {
    if (how == KS_GROUP_SOFTMAX_MEAN) { /* softmax per head, averaged: out = sum_g e_g / (G sum e_g) */
        if (n <= 0) return KS_OK;
        float *p = ks_scratch(KS_SCRATCH_MATH1, sizeof(float) * (size_t)n);
        if (!p) return KS_FAIL(KS_ERR_NOMEM, "softmax of %d scores", n);
        for (int32_t g = 0; g < G; g++) {
            memcpy(p, scores + (size_t)g * n, sizeof(float) * (size_t)n);
            float w = 1.0f / (softmax_exp(p, n) * (float)G);
            if (g == 0)
                for (int32_t i = 0; i < n; i++) out[i] = p[i] * w;
            else
                for (int32_t i = 0; i < n; i++) out[i] += p[i] * w;
        }
        return KS_OK;
    }
    for (int32_t i = 0; i < n; i++) {
        float acc = how == KS_GROUP_MAX ? -INFINITY : 0;
        for (int32_t g = 0; g < G; g++) {
            float v = scores[(size_t)g * n + i];
            if (how == KS_GROUP_MAX) acc = v > acc ? v : acc;
            else acc += v / G;
        }
        out[i] = acc;
    }
    return KS_OK;
}

ks_status ks_group_reduce_parse(const char *s, ks_group_reduce *out) {
    if (strcmp(s, "max") == 0) *out = KS_GROUP_MAX;
    else if (strcmp(s, "mean") == 0) *out = KS_GROUP_MEAN;
    else if (strcmp(s, "softmax") == 0) *out = KS_GROUP_SOFTMAX_MEAN;
    else return KS_FAIL(KS_ERR_INVALID_ARG, "group reduction '%s': expected max, mean or softmax", s);
    return KS_OK;
}
