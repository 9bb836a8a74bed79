/*
 * simd_avx512.h — the AVX-512 building blocks more than one hot kernel needs
 * (decode attention; SpeContext's retrieval-head scoring computes the same
 * softmax).  Header-only and always inline, like simd_avx2.h: each caller
 * compiles them inside its own target(...) functions, so the library builds
 * without -march flags and picks kernels at run time.
 */
#ifndef KS_SIMD_AVX512_H
#define KS_SIMD_AVX512_H

#if defined(__x86_64__)
#include <immintrin.h>

#include "tensor/simd_avx2.h" /* KS_SIMD_EXP_NEG_POLY */

/* Only AVX-512F, so that the helpers inline into any AVX-512 kernel,
 * whatever further extensions its own target names. */
#define KS_AVX512_INL static inline __attribute__((target("avx512f"), always_inline))

#define KS_AVX512_ROUND_(v) _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT)

/* e^x for x <= 0 (KS_SIMD_EXP_NEG_POLY, simd_avx2.h), 2^n applied by scalef. */
KS_AVX512_INL __m512 ks_avx512_exp_neg(__m512 x) {
    __m512 n, p;
    KS_SIMD_EXP_NEG_POLY(x, n, p, _mm512_set1_ps, _mm512_max_ps, KS_AVX512_ROUND_, _mm512_mul_ps, _mm512_fmadd_ps,
                         _mm512_fnmadd_ps);
    return _mm512_scalef_ps(p, n);
}

/* Sixteen horizontal sums at once: lane k of the result is the sum of the
 * lanes of v[k].  A butterfly of unpacks and 128-bit shuffles costs ~45
 * instructions for all sixteen, against ~7 per sum done one by one; for
 * v[4 * r + g] (four rows x four heads) the result is already in the
 * row-major layout [row][head]. */
KS_AVX512_INL __m512 ks_avx512_reduce16(const __m512 v[16]) {
    __m512 a[8], c[4];
    _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) /* per 128-bit lane: [x0+x2, y0+y2, x1+x3, y1+y3] */
        a[k] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * k], v[2 * k + 1]), _mm512_unpackhi_ps(v[2 * k], v[2 * k + 1]));
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) /* per 128-bit lane: partial sums of v[4j..4j+3] */
        c[j] = _mm512_add_ps(_mm512_shuffle_ps(a[2 * j], a[2 * j + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(a[2 * j], a[2 * j + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* fold the four 128-bit lanes of each c[j] and gather c[j] into block j */
    __m512 e01 = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xDD));
    __m512 e23 = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], 0x88), _mm512_shuffle_f32x4(c[2], c[3], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(e01, e23, 0x88), _mm512_shuffle_f32x4(e01, e23, 0xDD));
}

/* x[0..n) = e^(x - max x) in place (the softmax numerators); returns their
 * sum (KS_SIMD_SOFTMAX_EXP, simd_avx2.h). */
KS_AVX512_INL float ks_avx512_softmax_exp(float *x, int n) {
    float tot;
    KS_SIMD_SOFTMAX_EXP(x, n, tot, 16, __m512, _mm512_set1_ps, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_max_ps,
                        _mm512_sub_ps, _mm512_add_ps, _mm512_reduce_max_ps, _mm512_reduce_add_ps, ks_avx512_exp_neg,
                        _mm512_cvtss_f32);
    return tot;
}
#endif
#endif
