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
