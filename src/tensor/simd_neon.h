/*
 * simd_neon.h — the NEON building blocks of the AArch64 kernels outside
 * tensor/ (decode attention): e^x for x <= 0 and the softmax numerators.
 *
 * They are the x86 helpers' twins (tensor/simd_avx2.h): the same
 * range-reduction and degree-6 polynomial (KS_SIMD_EXP_NEG_POLY) and the same
 * max / exp / sum pass (KS_SIMD_SOFTMAX_EXP), written once for any vector
 * width, so a probability means the same arithmetic on either architecture.
 * Plain Armv8.0 NEON: every AArch64 CPU has it, so no target attribute and
 * no dispatch below the NEON level are needed.
 */
#ifndef KS_SIMD_NEON_H
#define KS_SIMD_NEON_H

#include "tensor/simd_avx2.h" /* KS_SIMD_EXP_NEG_POLY, KS_SIMD_SOFTMAX_EXP (width-generic) */

#if defined(__aarch64__)
#include <arm_neon.h>

#define KS_NEON_FMADD_(a, b, c) vfmaq_f32((c), (a), (b))  /* a * b + c */
#define KS_NEON_FNMADD_(a, b, c) vfmsq_f32((c), (a), (b)) /* c - a * b */
#define KS_NEON_STORE_(p, v) vst1q_f32((p), (v))
#define KS_NEON_LANE0_(v) vgetq_lane_f32((v), 0)

/* e^x for x <= 0 (KS_SIMD_EXP_NEG_POLY), 2^n built in the exponent bits. */
static inline float32x4_t ks_neon_exp_neg(float32x4_t x) {
    float32x4_t n, p;
    KS_SIMD_EXP_NEG_POLY(x, n, p, vdupq_n_f32, vmaxq_f32, vrndnq_f32, vmulq_f32, KS_NEON_FMADD_, KS_NEON_FNMADD_);
    int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtnq_s32_f32(n), vdupq_n_s32(127)), 23);
    return vmulq_f32(p, vreinterpretq_f32_s32(e));
}

/* x[0..n) = e^(x - max x) in place; returns their sum */
static inline float ks_neon_softmax_exp(float *x, int n) {
    float tot;
    KS_SIMD_SOFTMAX_EXP(x, n, tot, 4, float32x4_t, vdupq_n_f32, vld1q_f32, KS_NEON_STORE_, vmaxq_f32, vsubq_f32,
                        vaddq_f32, vmaxvq_f32, vaddvq_f32, ks_neon_exp_neg, KS_NEON_LANE0_);
    return tot;
}
#endif
#endif
