/*
 * simd_avx2.h — the AVX2 + FMA building blocks more than one hot kernel
 * needs (decode attention, SpeContext's retrieval-head scoring, LRQK's proxy
 * scores).  Header-only and always inline: each caller compiles them inside
 * its own target("avx2,fma,f16c") functions, so the library still builds
 * without -march flags and picks kernels at run time (ks_simd_current()).
 */
#ifndef KS_SIMD_AVX2_H
#define KS_SIMD_AVX2_H

#if defined(__x86_64__)
#include <immintrin.h>

#define KS_AVX2_TGT __attribute__((target("avx2,fma,f16c")))
#define KS_AVX2_INL static inline __attribute__((target("avx2,fma,f16c"), always_inline))

/* Eight horizontal sums at once: r[k] = sum of the lanes of a[k].  One
 * hadd/permute butterfly (9 ops for all eight) instead of a reduction per
 * sum; callers order a[] so that r comes out in the layout they store. */
KS_AVX2_INL __m256 ks_avx2_reduce8(const __m256 a[8]) {
    __m256 h01 = _mm256_hadd_ps(a[0], a[1]), h23 = _mm256_hadd_ps(a[2], a[3]);
    __m256 h45 = _mm256_hadd_ps(a[4], a[5]), h67 = _mm256_hadd_ps(a[6], a[7]);
    __m256 l = _mm256_hadd_ps(h01, h23), h = _mm256_hadd_ps(h45, h67); /* per 128-bit half */
    return _mm256_add_ps(_mm256_permute2f128_ps(l, h, 0x20), _mm256_permute2f128_ps(l, h, 0x31));
}

/* e^x for x <= 0 (softmax after the max is subtracted), relative error
 * ~2e-7: range reduction by n = round(x log2 e), a degree-6 polynomial, and
 * 2^n built in the exponent bits (AVX2 has no scalef).  x is clamped at -87,
 * so n stays in [-126, 0] and 2^n is a normal float. */
KS_AVX2_INL __m256 ks_avx2_exp_neg(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
#endif
#endif
