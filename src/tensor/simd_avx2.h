/*
 * simd_avx2.h — the AVX2 + FMA building blocks more than one hot kernel
 * needs (decode attention, SpeContext's retrieval-head scoring, LRQK's proxy
 * scores).  Header-only and always inline: each caller compiles them inside
 * its own target("avx2,fma,f16c") functions, so the library still builds
 * without -march flags and picks kernels at run time (ks_simd_current()).
 */
#ifndef KS_SIMD_AVX2_H
#define KS_SIMD_AVX2_H

#include <math.h> /* INFINITY */

/* The two width-generic bodies below are shared with the NEON kernels
 * (tensor/simd_neon.h), so they stand outside the x86 part. */
/* The body of e^x for x <= 0 (softmax after the max is subtracted) at any
 * vector width, relative error ~2e-7: x clamped at -87 (so n stays in
 * [-126, 0] and 2^n is a normal float), range reduction by n = round(x log2
 * e) with ln 2 split in two for accuracy, and a degree-6 polynomial p of the
 * remainder; then e^x = p * 2^n, which each width applies as its ISA allows.
 * One definition, so that every kernel's probabilities agree bit for bit. */
#define KS_SIMD_EXP_NEG_POLY(x, n, p, SET1, MAX, ROUND, MUL, FMADD, FNMADD) \
    do {                                                                     \
        x = MAX(x, SET1(-87.0f));                                            \
        n = ROUND(MUL(x, SET1(1.44269504088896341f)));                       \
        __typeof__(x) r_ = FNMADD(n, SET1(0.693359375f), x);                 \
        r_ = FNMADD(n, SET1(-2.12194440e-4f), r_);                           \
        p = SET1(1.0f / 720);                                                \
        p = FMADD(p, r_, SET1(1.0f / 120));                                  \
        p = FMADD(p, r_, SET1(1.0f / 24));                                   \
        p = FMADD(p, r_, SET1(1.0f / 6));                                    \
        p = FMADD(p, r_, SET1(0.5f));                                        \
        p = FMADD(p, r_, SET1(1.0f));                                        \
        p = FMADD(p, r_, SET1(1.0f));                                        \
    } while (0)

/* The softmax numerators at any vector width: x[0..n) = e^(x - max x) in
 * place, their sum into tot; the tail past the last full vector goes one
 * element at a time through the same polynomial.  One definition for the
 * AVX2, AVX-512 and NEON helpers (ks_avx2_softmax_exp, ks_avx512_softmax_exp,
 * ks_neon_softmax_exp). */
#define KS_SIMD_SOFTMAX_EXP(x, n, tot, VL, VT, SET1, LOADU, STOREU, MAX, SUB, ADD, HMAX, HSUM, EXPNEG, CVTSS) \
    do {                                                                                                   \
        VT mx_ = SET1(-INFINITY);                                                                          \
        int t_ = 0;                                                                                        \
        for (; t_ + (VL) <= (n); t_ += (VL)) mx_ = MAX(mx_, LOADU((x) + t_));                              \
        float m_ = HMAX(mx_);                                                                              \
        for (; t_ < (n); t_++) m_ = (x)[t_] > m_ ? (x)[t_] : m_;                                           \
        VT mv_ = SET1(m_), sum_ = SET1(0.0f);                                                              \
        for (t_ = 0; t_ + (VL) <= (n); t_ += (VL)) {                                                       \
            VT e_ = EXPNEG(SUB(LOADU((x) + t_), mv_));                                                     \
            STOREU((x) + t_, e_);                                                                          \
            sum_ = ADD(sum_, e_);                                                                          \
        }                                                                                                  \
        tot = HSUM(sum_);                                                                                  \
        for (; t_ < (n); t_++) {                                                                           \
            (x)[t_] = CVTSS(EXPNEG(SET1((x)[t_] - m_)));                                                   \
            tot += (x)[t_];                                                                                \
        }                                                                                                  \
    } while (0)

#if defined(__x86_64__)
#include <immintrin.h>

#define KS_AVX2_TGT __attribute__((target("avx2,fma,f16c")))

/* How far ahead of a forward stream (a contiguous run of KV rows, a K
 * cache) the kernels prefetch.  The hardware prefetchers follow such
 * streams, but not far enough ahead to hide DRAM behind the kernels'
 * arithmetic: on a 2-vCPU Xeon, 16 layers x 8 heads x 32K rows of f16 KV
 * (hd 64) took 58 ms from DRAM against a 37 ms plain read and 32 ms hot,
 * and 42 ms with lines 2 KB ahead (q8 rows 37 -> 29 ms, hd 128 51 -> 40
 * ms); 1-4 KB measured alike (`build/attn_bench 2 1 1024 split ...`). */
#define KS_STREAM_AHEAD 2048
/* Every line of [p, p + bytes) into L1 (no fault past a mapping's end). */
static inline __attribute__((always_inline)) void ks_prefetch_lines(const void *p, size_t bytes) {
    const char *c = (const char *)p;
    for (size_t o = 0; o < bytes; o += 64) _mm_prefetch(c + o, _MM_HINT_T0);
}
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

#define KS_AVX2_ROUND_(v) _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

/* e^x for x <= 0 (KS_SIMD_EXP_NEG_POLY), 2^n built in the exponent bits
 * (AVX2 has no scalef). */
KS_AVX2_INL __m256 ks_avx2_exp_neg(__m256 x) {
    __m256 n, p;
    KS_SIMD_EXP_NEG_POLY(x, n, p, _mm256_set1_ps, _mm256_max_ps, KS_AVX2_ROUND_, _mm256_mul_ps, _mm256_fmadd_ps,
                         _mm256_fnmadd_ps);
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

KS_AVX2_INL float ks_avx2_hmax(__m256 v) {
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    return _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
}

KS_AVX2_INL float ks_avx2_hsum(__m256 v) {
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s4, _mm_movehdup_ps(s4)));
}

/* x[0..n) = e^(x - max x) in place; returns their sum */
KS_AVX2_INL float ks_avx2_softmax_exp(float *x, int n) {
    float tot;
    KS_SIMD_SOFTMAX_EXP(x, n, tot, 8, __m256, _mm256_set1_ps, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_max_ps,
                        _mm256_sub_ps, _mm256_add_ps, ks_avx2_hmax, ks_avx2_hsum, ks_avx2_exp_neg, _mm256_cvtss_f32);
    return tot;
}
#endif
#endif
