/*
 * spec_score.c — SpeContext's retrieval-head scoring kernels (spec_score.h):
 * per (row, KV head) the G DLM query heads against the head's f16 K cache,
 * then a per-head softmax folded into the group max.  Portable, AVX2 + FMA +
 * F16C, and AVX-512 paths; split from p_spec.c, which keeps the head's model
 * (fused features, q/k projections, K cache) and the policy hooks.
 */
#include "select/spec_score.h"

#include "tensor/ops.h"
#include "tensor/simd_avx2.h"
#include "tensor/simd_avx512.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* scores of G query heads against keys [0, n): out[g][j] (f16 keys) */
static void scores_ref(const float *q, const ks_f16 *K, int32_t n, int hd, int G, float scale, float *out) {
    for (int32_t j = 0; j < n; j++)
        for (int g = 0; g < G; g++) {
            float acc = 0;
            for (int i = 0; i < hd; i++) acc += q[(size_t)g * hd + i] * ks_f16_to_f32(K[(size_t)j * hd + i]);
            out[(size_t)g * n + j] = acc * scale;
        }
}

#if defined(__x86_64__)
#define SPEC_AVX512_TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,f16c,fma")))
#define SPEC_AVX512_INL static inline __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,f16c,fma"), always_inline))

/* acc[r * GB + h] += q[h] . K[r] over the 16 lanes at off (masked: the
 * lanes of the head dim's tail) for R = 16 / GB rows and GB heads: every
 * K chunk converted from f16 once for the GB heads. */
SPEC_AVX512_INL void scores_chunk_avx512(__m512 acc[16], const float *qg, const ks_f16 *const k[16], int hd, int off,
                                         __mmask16 m, const int GB) {
    const int R = 16 / GB;
    __m512 qv[4];
    _Pragma("GCC unroll 4") for (int h = 0; h < GB; h++) qv[h] = _mm512_maskz_loadu_ps(m, qg + (size_t)h * hd + off);
    _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) {
        __m512 kv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, k[r] + off));
        _Pragma("GCC unroll 4") for (int h = 0; h < GB; h++)
            acc[r * GB + h] = _mm512_fmadd_ps(kv, qv[h], acc[r * GB + h]);
    }
}

/* Scores of G heads (in groups of GB = 4, 2 or 1 dividing G) against R =
 * 16 / GB keys at a time: 16 accumulators (rows x heads) reduced together
 * by ks_avx512_reduce16 into lanes r * GB + h, then transposed to the output's
 * [head][row] layout.  Any head dim: the last hd % 16 lanes are masked loads
 * (drafts need not pad their heads to 16). */
SPEC_AVX512_INL void scores_blocked_avx512(const float *q, const ks_f16 *K, int32_t n, int hd, int G, float scale,
                                           float *out, const int GB) {
    const int R = 16 / GB, body = hd & ~15;
    const __mmask16 all = 0xFFFF, tail = (__mmask16)((1u << (hd - body)) - 1u);
    /* lane r * GB + h -> lane h * R + r: each head's R scores side by side */
    __m512i tr = _mm512_setzero_si512();
    {
        int32_t idx[16];
        for (int h = 0; h < GB; h++)
            for (int r = 0; r < R; r++) idx[h * R + r] = r * GB + h;
        tr = _mm512_loadu_si512(idx);
    }
    const __m512 vs = _mm512_set1_ps(scale);
    const size_t block_bytes = (size_t)R * hd * sizeof(ks_f16);
    for (int32_t j = 0; j < n; j += R) {
        int nr = n - j < R ? (int)(n - j) : R;
        /* the K cache is one forward stream: its rows KS_STREAM_AHEAD bytes ahead */
        ks_prefetch_lines((const char *)(K + (size_t)j * hd) + KS_STREAM_AHEAD, block_bytes);
        const ks_f16 *k[16];
        _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) /* a short block repeats row j */
            k[r] = K + (size_t)(j + (r < nr ? r : 0)) * hd;
        for (int g0 = 0; g0 < G; g0 += GB) { /* heads inner: the R rows stay in L1 for the whole group */
            __m512 acc[16];
            _Pragma("GCC unroll 16") for (int a = 0; a < 16; a++) acc[a] = _mm512_setzero_ps();
            const float *qg = q + (size_t)g0 * hd;
            for (int i = 0; i < body; i += 16) scores_chunk_avx512(acc, qg, k, hd, i, all, GB);
            if (tail) scores_chunk_avx512(acc, qg, k, hd, body, tail, GB);
            __m512 s = _mm512_permutexvar_ps(tr, _mm512_mul_ps(ks_avx512_reduce16(acc), vs)); /* lane h * R + r */
            float *o = out + (size_t)g0 * n + j;
            if (nr == R) {
                __mmask16 row_mask = (__mmask16)((1u << R) - 1u);
                _Pragma("GCC unroll 4") for (int h = 0; h < GB; h++)
                    _mm512_mask_storeu_ps(o + (size_t)h * n - h * R, (__mmask16)(row_mask << (h * R)), s);
            } else {
                float t[16];
                _mm512_storeu_ps(t, s);
                for (int h = 0; h < GB; h++)
                    for (int r = 0; r < nr; r++) o[(size_t)h * n + r] = t[h * R + r];
            }
        }
    }
}

SPEC_AVX512_TGT static void scores_avx512(const float *q, const ks_f16 *K, int32_t n, int hd, int G, float scale,
                                          float *out) {
    switch (G % 4 == 0 ? 4 : G % 2 == 0 ? 2 : 1) {
    case 4: scores_blocked_avx512(q, K, n, hd, G, scale, out, 4); break;
    case 2: scores_blocked_avx512(q, K, n, hd, G, scale, out, 2); break;
    default: scores_blocked_avx512(q, K, n, hd, G, scale, out, 1); break;
    }
}

/* w = p (first) or max(w, p) for p = x * inv: the group reduction fused
 * with the normalisation.  Plain C, always inlined into the SIMD callers,
 * whose targets vectorise it at their width. */
static inline __attribute__((always_inline)) void normalize_max(const float *x, int32_t n, float inv, float *w,
                                                                bool first) {
    for (int32_t i = 0; i < n; i++) {
        float p = x[i] * inv;
        w[i] = first || p > w[i] ? p : w[i];
    }
}

/* softmax of x[0..n) (in place: the numerators), then normalize_max; the
 * shared polynomial exp (tensor/simd_avx512.h, rel. error ~2e-7), the
 * selection only ranks these values */
__attribute__((target("avx512f,avx512dq,fma"))) static void softmax_max_avx512(float *x, int32_t n, float *w,
                                                                               bool first) {
    normalize_max(x, n, 1.0f / ks_avx512_softmax_exp(x, n), w, first);
}

/* AVX2 + FMA + F16C (AMD parts and most laptops lack AVX-512).  Scores:
 * eight accumulators = R rows x GB heads (GB: the largest of 8, 4, 2, 1
 * dividing G), reduced together by one hadd/permute butterfly into a vector
 * whose lanes are (head, row) pairs, so no horizontal sum per score; every K
 * chunk is converted from f16 once for the GB heads.  Any head dim >= 8: the
 * tail is one more chunk loaded at hd - 8 (in bounds) with the lanes the body
 * already counted zeroed, so nothing past the row is read. */

/* acc[h * R + r] += q[h] * K[r] over the 8 lanes at off; masked: zero the K
 * lanes outside mask (the tail chunk) */
KS_AVX2_INL void scores_chunk_avx2(__m256 acc[8], const float *qg, const ks_f16 *const k[8], int hd, int off,
                                     const bool masked, __m256 mask, const int GB) {
    const int R = 8 / GB;
    __m256 qv[8];
    _Pragma("GCC unroll 8") for (int h = 0; h < GB; h++) {
        qv[h] = _mm256_loadu_ps(qg + (size_t)h * hd + off);
        if (GB < 8) __asm__("" : "+x"(qv[h])); /* one load per head, not one per row (load ports) */
    }
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
        __m256 kv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k[r] + off)));
        if (masked) kv = _mm256_and_ps(kv, mask);
        _Pragma("GCC unroll 8") for (int h = 0; h < GB; h++)
            acc[h * R + r] = _mm256_fmadd_ps(kv, qv[h], acc[h * R + r]);
    }
}

/* out[g0 + h][j + r] for h < GB, r < nr: rows j.. of K against heads g0.. */
KS_AVX2_INL void scores_block_avx2(const float *q, const ks_f16 *K, int32_t n, int hd, int g0, int32_t j, int nr,
                                     float scale, __m256 tmask, float *out, const int GB) {
    const int R = 8 / GB;
    const ks_f16 *k[8];
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) /* a short block repeats row j */
        k[r] = K + (size_t)(j + (r < nr ? r : 0)) * hd;
    const float *qg = q + (size_t)g0 * hd;
    __m256 acc[8]; /* [GB][R] */
    _Pragma("GCC unroll 8") for (int a = 0; a < 8; a++) acc[a] = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= hd; i += 8) scores_chunk_avx2(acc, qg, k, hd, i, false, tmask, GB);
    if (i < hd) scores_chunk_avx2(acc, qg, k, hd, hd - 8, true, tmask, GB);
    __m256 s = _mm256_mul_ps(ks_avx2_reduce8(acc), _mm256_set1_ps(scale)); /* lane h * R + r */
    float *o = out + (size_t)g0 * n + j;
    if (nr == R && R == 8) {
        _mm256_storeu_ps(o, s);
    } else if (nr == R && R == 4) {
        _mm_storeu_ps(o, _mm256_castps256_ps128(s));
        _mm_storeu_ps(o + n, _mm256_extractf128_ps(s, 1));
    } else if (nr == R && R == 2) {
        __m128 lo = _mm256_castps256_ps128(s), hi = _mm256_extractf128_ps(s, 1);
        _mm_storel_pi((__m64 *)o, lo);
        _mm_storeh_pi((__m64 *)(o + n), lo);
        _mm_storel_pi((__m64 *)(o + 2 * (size_t)n), hi);
        _mm_storeh_pi((__m64 *)(o + 3 * (size_t)n), hi);
    } else {
        float t[8];
        _mm256_storeu_ps(t, s);
        for (int h = 0; h < GB; h++)
            for (int r = 0; r < nr; r++) o[(size_t)h * n + r] = t[h * R + r];
    }
}

KS_AVX2_INL void scores_blocked_avx2(const float *q, const ks_f16 *K, int32_t n, int hd, int G, float scale,
                                       float *out, const int GB) {
    const int R = 8 / GB;
    /* tail lanes hd - 8 + l hold new elements for l >= 8 - hd % 8 */
    __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256 tmask = _mm256_castsi256_ps(_mm256_cmpgt_epi32(lane, _mm256_set1_epi32(7 - hd % 8)));
    for (int32_t j = 0; j < n; j += R) { /* heads inner: the R rows stay in L1 for the whole group */
        int nr = n - j < R ? (int)(n - j) : R;
        for (int g0 = 0; g0 < G; g0 += GB) scores_block_avx2(q, K, n, hd, g0, j, nr, scale, tmask, out, GB);
    }
}

KS_AVX2_TGT static void scores_avx2(const float *q, const ks_f16 *K, int32_t n, int hd, int G, float scale,
                                  float *out) {
    if (hd < 8) {
        scores_ref(q, K, n, hd, G, scale, out);
        return;
    }
    switch (G % 8 == 0 ? 8 : G % 4 == 0 ? 4 : G % 2 == 0 ? 2 : 1) {
    case 8: scores_blocked_avx2(q, K, n, hd, G, scale, out, 8); break;
    case 4: scores_blocked_avx2(q, K, n, hd, G, scale, out, 4); break;
    case 2: scores_blocked_avx2(q, K, n, hd, G, scale, out, 2); break;
    default: scores_blocked_avx2(q, K, n, hd, G, scale, out, 1); break;
    }
}

/* softmax_max_avx512 in 8 lanes */
KS_AVX2_TGT static void softmax_max_avx2(float *x, int32_t n, float *w, bool first) {
    normalize_max(x, n, 1.0f / ks_avx2_softmax_exp(x, n), w, first);
}
#endif

void ks_spec_scores(const float *q, const ks_f16 *K, int32_t n, int hd, int G, float scale, float *out,
                    ks_simd_level simd) {
#if defined(__x86_64__)
    if (simd >= KS_SIMD_AVX512) {
        scores_avx512(q, K, n, hd, G, scale, out);
        return;
    }
    if (simd >= KS_SIMD_AVX2) {
        scores_avx2(q, K, n, hd, G, scale, out);
        return;
    }
#endif
    (void)simd;
    scores_ref(q, K, n, hd, G, scale, out);
}

void ks_spec_softmax_max(float *x, int32_t n, float *w, bool first, ks_simd_level simd) {
#if defined(__x86_64__)
    if (simd >= KS_SIMD_AVX512) {
        softmax_max_avx512(x, n, w, first);
        return;
    }
    if (simd >= KS_SIMD_AVX2) {
        softmax_max_avx2(x, n, w, first);
        return;
    }
#endif
    (void)simd;
    ks_softmax(x, n);
    for (int32_t i = 0; i < n; i++) w[i] = first || x[i] > w[i] ? x[i] : w[i];
}
