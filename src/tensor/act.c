/*
 * act.c — GELU with the tanh approximation, gated (gemma's GEGLU), over a
 * row of the feed-forward's n_ff gates.
 *
 * Why a kernel of its own: libm's tanhf (with its expm1f) is a scalar call
 * per element, and a prefill makes n_ff of them per row and layer: 11.5%
 * of a 64K gemma-3-4b prefill on an AVX-512 host (docs/results/gemma3.md).
 * The identity 0.5 (1 + tanh u) = 1 / (1 + e^(-2u)) turns it into one
 * exponential of a non-positive argument, e^(-2|u|), which the vector
 * helpers every softmax here uses already compute (KS_SIMD_EXP_NEG_POLY,
 * tensor/simd_avx2.h; relative error about 2e-7):
 *     t = e^(-2|u|),  s = u >= 0 ? 1 / (1 + t) : t / (1 + t),
 *     GELU_tanh(g) = g s,  u = sqrt(2 / pi) (g + 0.044715 g^3).
 * The sigmoid form also avoids the cancellation of 1 + tanh u for very
 * negative u.  Lanes past the last whole vector take the same formula with
 * expf, so an element's bits depend on its index and n only.
 */
#include "tensor/act.h"

#include "core/simd.h"
#include "tensor/simd_avx2.h"
#include "tensor/simd_avx512.h"
#include "tensor/simd_neon.h"

#include <math.h>

#define GELU_C 0.7978845608f /* sqrt(2 / pi) */
#define GELU_A 0.044715f

static inline float geglu_one(float g, float up) {
    float u = GELU_C * (g + GELU_A * g * g * g);
    float t = expf(-2.0f * fabsf(u));
    float s = u >= 0 ? 1.0f / (1.0f + t) : t / (1.0f + t);
    return g * s * up;
}

static void geglu_scalar(float *gate, const float *up, int64_t i, int64_t n) {
    for (; i < n; i++) gate[i] = geglu_one(gate[i], up[i]);
}

#if defined(__x86_64__)
__attribute__((target("avx512f,fma"))) static int64_t geglu_avx512(float *gate, const float *up, int64_t n) {
    const __m512 c = _mm512_set1_ps(GELU_C), a = _mm512_set1_ps(GELU_A), one = _mm512_set1_ps(1.0f);
    const __m512 m2 = _mm512_set1_ps(-2.0f), zero = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 g = _mm512_loadu_ps(gate + i);
        __m512 u = _mm512_mul_ps(c, _mm512_fmadd_ps(_mm512_mul_ps(a, g), _mm512_mul_ps(g, g), g));
        __m512 t = ks_avx512_exp_neg(_mm512_mul_ps(m2, _mm512_abs_ps(u)));
        __m512 num = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(u, zero, _CMP_GE_OQ), t, one);
        __m512 s = _mm512_div_ps(num, _mm512_add_ps(one, t));
        _mm512_storeu_ps(gate + i, _mm512_mul_ps(_mm512_mul_ps(g, s), _mm512_loadu_ps(up + i)));
    }
    return i;
}

__attribute__((target("avx2,fma,f16c"))) static int64_t geglu_avx2(float *gate, const float *up, int64_t n) {
    const __m256 c = _mm256_set1_ps(GELU_C), a = _mm256_set1_ps(GELU_A), one = _mm256_set1_ps(1.0f);
    const __m256 m2 = _mm256_set1_ps(-2.0f), zero = _mm256_setzero_ps();
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i);
        __m256 u = _mm256_mul_ps(c, _mm256_fmadd_ps(_mm256_mul_ps(a, g), _mm256_mul_ps(g, g), g));
        __m256 t = ks_avx2_exp_neg(_mm256_mul_ps(m2, _mm256_and_ps(u, abs_mask)));
        __m256 num = _mm256_blendv_ps(t, one, _mm256_cmp_ps(u, zero, _CMP_GE_OQ));
        __m256 s = _mm256_div_ps(num, _mm256_add_ps(one, t));
        _mm256_storeu_ps(gate + i, _mm256_mul_ps(_mm256_mul_ps(g, s), _mm256_loadu_ps(up + i)));
    }
    return i;
}
#endif

#if defined(__aarch64__)
static int64_t geglu_neon(float *gate, const float *up, int64_t n) {
    const float32x4_t c = vdupq_n_f32(GELU_C), a = vdupq_n_f32(GELU_A), one = vdupq_n_f32(1.0f);
    const float32x4_t m2 = vdupq_n_f32(-2.0f);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        float32x4_t g = vld1q_f32(gate + i);
        float32x4_t u = vmulq_f32(c, vfmaq_f32(g, vmulq_f32(a, g), vmulq_f32(g, g)));
        float32x4_t t = ks_neon_exp_neg(vmulq_f32(m2, vabsq_f32(u)));
        float32x4_t num = vbslq_f32(vcgeq_f32(u, vdupq_n_f32(0.0f)), one, t);
        float32x4_t s = vdivq_f32(num, vaddq_f32(one, t));
        vst1q_f32(gate + i, vmulq_f32(vmulq_f32(g, s), vld1q_f32(up + i)));
    }
    return i;
}
#endif

void ks_geglu_tanh(float *gate, const float *up, int64_t n) {
    int64_t i = 0;
    ks_simd_level lv = ks_simd_current();
#if defined(__x86_64__)
    if (lv == KS_SIMD_AVX512) i = geglu_avx512(gate, up, n);
    else if (lv == KS_SIMD_AVX2) i = geglu_avx2(gate, up, n);
#elif defined(__aarch64__)
    if (lv >= KS_SIMD_NEON) i = geglu_neon(gate, up, n);
#else
    (void)lv;
#endif
    geglu_scalar(gate, up, i, n);
}
