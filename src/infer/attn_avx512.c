/*
 * attn_avx512.c — grouped decode attention over f16 KV segments, AVX-512.
 *
 * Long-context decode is bound by reading the KV cache, so the kernel's job
 * is to keep up with memory: every K and V row is converted from f16 once and
 * used by all query heads of its GQA group, and nothing but the scores leaves
 * the registers.
 *  - Scores: four rows x a group of up to 4 heads give 16 zmm partial dot
 *    products, reduced together by one unpack/shuffle butterfly into a
 *    16-vector that is already in the t-major layout scores[t][4]; no
 *    horizontal sum per score.
 *  - Softmax runs vectorised over that [len][4] block (lane = head) with a
 *    polynomial exp (relative error ~2e-7) scaled by scalef.
 *  - V: rows are taken in blocks that stay in L1/L2 while each head group
 *    accumulates its outputs in registers (hd 64: 4 heads x 4 zmm; hd 128:
 *    2 heads x 8 zmm), so V is read from memory once per step.
 * Only head dims 64 and 128 (nearly every current model) take this path; the
 * caller falls back to the portable kernel otherwise.
 */
#include "infer/infer.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

/* Rows ahead to prefetch (2 KiB at hd 64), into L2 (T1).  One-thread scans of
 * 16 layers x 8 heads x 32K rows, alternating binaries: with a head's pages
 * at consecutive ids (the store's home ids: one K stream per head) T1 and T0
 * are equal (~22-25 GB/s); with 32-row pages interleaved by head (ids off
 * the free list) T1 reads 18.7-19.0 GB/s against 16.1-18.6.  8, 24, 32 and
 * 64 rows were no better. */
#define KS_ATTN_PREFETCH_ROWS 16
#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))
#define INL static inline __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c"), always_inline))

INL __m512 exp512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

INL __m128 fold512(__m512 v) {
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* Sixteen horizontal sums at once: r[k] = sum of the lanes of v[k].  A
 * butterfly of unpacks and 128-bit shuffles costs ~45 instructions for all
 * sixteen, against ~7 per sum done one by one. */
INL __m512 reduce16(const __m512 v[16]) {
    __m512 a[8], c[4];
    _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++)  /* per 128-bit lane: [x0+x2, y0+y2, x1+x3, y1+y3] */
        a[k] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * k], v[2 * k + 1]), _mm512_unpackhi_ps(v[2 * k], v[2 * k + 1]));
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) /* per 128-bit lane: partial sums of v[4j..4j+3] */
        c[j] = _mm512_add_ps(_mm512_shuffle_ps(a[2 * j], a[2 * j + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(a[2 * j], a[2 * j + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* fold the four 128-bit lanes of each c[j] and gather c[j] into block j */
    __m512 e01 = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xDD));
    __m512 e23 = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], 0x88), _mm512_shuffle_f32x4(c[2], c[3], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(e01, e23, 0x88), _mm512_shuffle_f32x4(e01, e23, 0xDD));
}

/* scores[t][4] for heads g0..g0+ng-1 (ng <= 4; missing heads get zero q),
 * t running over the concatenated segments.  Four rows at a time: their 16
 * (row, head) partial dot products are reduced together by reduce16, whose
 * output order (row-major, head-minor) is exactly the t-major score layout.
 * Prefetches run ahead into the next segment near a segment's end, since the
 * next page of a head is usually not the next address. */
#define PF_PTR(base, len, t, next, hd)                                                           \
    ((t) + KS_ATTN_PREFETCH_ROWS < (len) ? (base) + (size_t)((t) + KS_ATTN_PREFETCH_ROWS) * (hd) \
     : (next) ? (next) + (size_t)((t) + KS_ATTN_PREFETCH_ROWS - (len)) * (hd)                  \
              : (base))
#define SCORE_BODY(HDV)                                                                           \
    do {                                                                                          \
        __m512 qv[4][HDV];                                                                        \
        _Pragma("GCC unroll 16") for (int g = 0; g < 4; g++)                                      \
            _Pragma("GCC unroll 16") for (int i = 0; i < HDV; i++)                                \
                qv[g][i] = g < ng ? _mm512_mul_ps(_mm512_loadu_ps(q + (size_t)(g0 + g) * hd + 16 * i), \
                                                  _mm512_set1_ps(scale))                          \
                                  : _mm512_setzero_ps();                                          \
        int base = 0;                                                                             \
        for (int si = 0; si < nseg; si++) {                                                       \
            const uint16_t *K = segs[si].K;                                                       \
            const uint16_t *Kn = si + 1 < nseg ? segs[si + 1].K : NULL;                           \
            int len = segs[si].len, t = 0;                                                        \
            float *sc = scores + 4 * (size_t)base;                                                \
            for (; t + 4 <= len; t += 4) {                                                        \
                __m512 part[16];                                                                  \
                const uint16_t *pf = PF_PTR(K, len, t, Kn, hd);                                   \
                _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++) {                             \
                    const uint16_t *k = K + (size_t)(t + r) * hd;                                 \
                    _mm_prefetch((const char *)(pf + (size_t)r * hd), _MM_HINT_T1);               \
                    __m512 kv[HDV];                                                               \
                    _Pragma("GCC unroll 16") for (int i = 0; i < HDV; i++)                        \
                        kv[i] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(k + 16 * i))); \
                    _Pragma("GCC unroll 16") for (int g = 0; g < 4; g++) {                        \
                        __m512 acc = _mm512_mul_ps(kv[0], qv[g][0]);                              \
                        _Pragma("GCC unroll 16") for (int i = 1; i < HDV; i++)                    \
                            acc = _mm512_fmadd_ps(kv[i], qv[g][i], acc);                          \
                        part[4 * r + g] = acc;                                                    \
                    }                                                                             \
                }                                                                                 \
                _mm512_storeu_ps(sc + 4 * (size_t)t, reduce16(part));                             \
            }                                                                                     \
            for (; t < len; t++) {                                                                \
                const uint16_t *k = K + (size_t)t * hd;                                           \
                __m512 kv[HDV];                                                                   \
                _Pragma("GCC unroll 16") for (int i = 0; i < HDV; i++)                            \
                    kv[i] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(k + 16 * i)));   \
                __m128 part[4];                                                                   \
                _Pragma("GCC unroll 16") for (int g = 0; g < 4; g++) {                            \
                    __m512 acc = _mm512_mul_ps(kv[0], qv[g][0]);                                  \
                    _Pragma("GCC unroll 16") for (int i = 1; i < HDV; i++) acc = _mm512_fmadd_ps(kv[i], qv[g][i], acc); \
                    part[g] = fold512(acc);                                                       \
                }                                                                                 \
                __m128 sv = _mm_hadd_ps(_mm_hadd_ps(part[0], part[1]), _mm_hadd_ps(part[2], part[3])); \
                _mm_storeu_ps(sc + 4 * (size_t)t, sv);                                            \
            }                                                                                     \
            base += len;                                                                          \
        }                                                                                         \
    } while (0)

/* softmax over t for each of the 4 lanes of scores[len][4] */
TGT static void softmax_lanes4(float *scores, int len) {
    int n = 4 * len, i;
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (i = 0; i + 16 <= n; i += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(scores + i));
    __m128 m4 = _mm_max_ps(_mm_max_ps(_mm512_castps512_ps128(mx), _mm512_extractf32x4_ps(mx, 1)),
                           _mm_max_ps(_mm512_extractf32x4_ps(mx, 2), _mm512_extractf32x4_ps(mx, 3)));
    for (; i < n; i += 4) m4 = _mm_max_ps(m4, _mm_loadu_ps(scores + i));
    __m512 m16 = _mm512_broadcast_f32x4(m4);
    __m512 sum = _mm512_setzero_ps();
    for (i = 0; i + 16 <= n; i += 16) {
        __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(scores + i), m16));
        _mm512_storeu_ps(scores + i, e);
        sum = _mm512_add_ps(sum, e);
    }
    __m128 s4 = _mm_add_ps(_mm_add_ps(_mm512_castps512_ps128(sum), _mm512_extractf32x4_ps(sum, 1)),
                           _mm_add_ps(_mm512_extractf32x4_ps(sum, 2), _mm512_extractf32x4_ps(sum, 3)));
    for (; i < n; i += 4) {
        __m512 x = _mm512_castps128_ps512(_mm_sub_ps(_mm_loadu_ps(scores + i), m4));
        __m128 e = _mm512_castps512_ps128(exp512(x));
        _mm_storeu_ps(scores + i, e);
        s4 = _mm_add_ps(s4, e);
    }
    /* lanes of absent heads are exp(0 - 0) = 1 each: harmless, never read */
    __m512 inv = _mm512_broadcast_f32x4(_mm_div_ps(_mm_set1_ps(1.0f), s4));
    for (i = 0; i + 16 <= n; i += 16) _mm512_storeu_ps(scores + i, _mm512_mul_ps(_mm512_loadu_ps(scores + i), inv));
    for (; i < n; i += 4) _mm_storeu_ps(scores + i, _mm_mul_ps(_mm_loadu_ps(scores + i), _mm512_castps512_ps128(inv)));
}

/* out[g0+g][hd] = sum_t p[t][g] * V[t]; heads g < ng, VG heads per pass.
 * Segments are taken in chunks of >= BLOCK rows that stay in L1/L2 while
 * every head pass reads them, so V comes from memory once per step. */
#define VALUE_BODY(HDV, VG)                                                                       \
    do {                                                                                          \
        enum { BLOCK = 256 };                                                                     \
        int base = 0;                                                                             \
        for (int s0 = 0; s0 < nseg;) {                                                            \
            int s1 = s0, rows = 0;                                                                \
            while (s1 < nseg && rows < BLOCK) rows += segs[s1++].len;                             \
            for (int gs = 0; gs < ng; gs += VG) {                                                 \
                __m512 acc[VG][HDV];                                                              \
                _Pragma("GCC unroll 16") for (int g = 0; g < VG; g++)                             \
                    _Pragma("GCC unroll 16") for (int i = 0; i < HDV; i++)                        \
                        acc[g][i] = (gs + g < ng && base > 0)                                     \
                                        ? _mm512_loadu_ps(out + (size_t)(g0 + gs + g) * hd + 16 * i) \
                                        : _mm512_setzero_ps();                                    \
                int tb = base;                                                                    \
                for (int si = s0; si < s1; si++) {                                                \
                    const uint16_t *V = segs[si].V;                                               \
                    const uint16_t *Vn = si + 1 < nseg ? segs[si + 1].V : NULL;                   \
                    int len = segs[si].len;                                                       \
                    const float *sc = scores + 4 * (size_t)tb;                                    \
                    for (int t = 0; t < len; t++) {                                               \
                        const uint16_t *v = V + (size_t)t * hd;                                   \
                        _mm_prefetch((const char *)PF_PTR(V, len, t, Vn, hd), _MM_HINT_T1);       \
                        __m512 vv[HDV];                                                           \
                        _Pragma("GCC unroll 16") for (int i = 0; i < HDV; i++)                    \
                            vv[i] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(v + 16 * i))); \
                        _Pragma("GCC unroll 16") for (int g = 0; g < VG; g++) {                   \
                            __m512 p = _mm512_set1_ps(sc[4 * (size_t)t + gs + g]);                \
                            _Pragma("GCC unroll 16") for (int i = 0; i < HDV; i++) acc[g][i] = _mm512_fmadd_ps(p, vv[i], acc[g][i]); \
                        }                                                                         \
                    }                                                                             \
                    tb += len;                                                                    \
                }                                                                                 \
                _Pragma("GCC unroll 16") for (int g = 0; g < VG; g++)                             \
                    if (gs + g < ng)                                                              \
                        _Pragma("GCC unroll 16") for (int i = 0; i < HDV; i++)                    \
                            _mm512_storeu_ps(out + (size_t)(g0 + gs + g) * hd + 16 * i, acc[g][i]); \
            }                                                                                     \
            base += rows;                                                                         \
            s0 = s1;                                                                              \
        }                                                                                         \
    } while (0)

/* Fragmented selections (token-level policies: a few rows per segment) run
 * on a flat list of row pointers instead: the four-row blocks and the
 * prefetch distance then ignore segment boundaries. */
#define SCORE_ROWS(HDV)                                                                           \
    do {                                                                                          \
        __m512 qv[4][HDV];                                                                        \
        _Pragma("GCC unroll 16") for (int g = 0; g < 4; g++)                                      \
            _Pragma("GCC unroll 16") for (int i = 0; i < HDV; i++)                                \
                qv[g][i] = g < ng ? _mm512_mul_ps(_mm512_loadu_ps(q + (size_t)(g0 + g) * hd + 16 * i), \
                                                  _mm512_set1_ps(scale))                          \
                                  : _mm512_setzero_ps();                                          \
        int t = 0;                                                                                \
        for (; t + 4 <= total; t += 4) {                                                          \
            __m512 part[16];                                                                      \
            _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++) {                                 \
                const uint16_t *k = KR[t + r];                                                    \
                if (t + r + KS_ATTN_PREFETCH_ROWS < total) {                                      \
                    _mm_prefetch((const char *)KR[t + r + KS_ATTN_PREFETCH_ROWS], _MM_HINT_T1);   \
                    _mm_prefetch((const char *)(KR[t + r + KS_ATTN_PREFETCH_ROWS] + hd - 1), _MM_HINT_T1); \
                }                                                                                 \
                __m512 kv[HDV];                                                                   \
                _Pragma("GCC unroll 16") for (int i = 0; i < HDV; i++)                            \
                    kv[i] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(k + 16 * i)));   \
                _Pragma("GCC unroll 16") for (int g = 0; g < 4; g++) {                            \
                    __m512 acc = _mm512_mul_ps(kv[0], qv[g][0]);                                  \
                    _Pragma("GCC unroll 16") for (int i = 1; i < HDV; i++)                        \
                        acc = _mm512_fmadd_ps(kv[i], qv[g][i], acc);                              \
                    part[4 * r + g] = acc;                                                        \
                }                                                                                 \
            }                                                                                     \
            _mm512_storeu_ps(scores + 4 * (size_t)t, reduce16(part));                             \
        }                                                                                         \
        for (; t < total; t++) {                                                                  \
            const uint16_t *k = KR[t];                                                            \
            __m512 kv[HDV];                                                                       \
            _Pragma("GCC unroll 16") for (int i = 0; i < HDV; i++)                                \
                kv[i] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(k + 16 * i)));       \
            __m128 part[4];                                                                       \
            _Pragma("GCC unroll 16") for (int g = 0; g < 4; g++) {                                \
                __m512 acc = _mm512_mul_ps(kv[0], qv[g][0]);                                      \
                _Pragma("GCC unroll 16") for (int i = 1; i < HDV; i++) acc = _mm512_fmadd_ps(kv[i], qv[g][i], acc); \
                part[g] = fold512(acc);                                                           \
            }                                                                                     \
            __m128 sv = _mm_hadd_ps(_mm_hadd_ps(part[0], part[1]), _mm_hadd_ps(part[2], part[3])); \
            _mm_storeu_ps(scores + 4 * (size_t)t, sv);                                            \
        }                                                                                         \
    } while (0)

#define VALUE_ROWS(HDV, VG)                                                                       \
    do {                                                                                          \
        enum { BLOCK = 256 };                                                                     \
        for (int t0 = 0; t0 < total; t0 += BLOCK) {                                               \
            int t1 = t0 + BLOCK < total ? t0 + BLOCK : total;                                     \
            for (int gs = 0; gs < ng; gs += VG) {                                                 \
                __m512 acc[VG][HDV];                                                              \
                _Pragma("GCC unroll 16") for (int g = 0; g < VG; g++)                             \
                    _Pragma("GCC unroll 16") for (int i = 0; i < HDV; i++)                        \
                        acc[g][i] = (gs + g < ng && t0 > 0)                                       \
                                        ? _mm512_loadu_ps(out + (size_t)(g0 + gs + g) * hd + 16 * i) \
                                        : _mm512_setzero_ps();                                    \
                for (int t = t0; t < t1; t++) {                                                   \
                    const uint16_t *v = VR[t];                                                    \
                    if (t + KS_ATTN_PREFETCH_ROWS < total) {                                      \
                        _mm_prefetch((const char *)VR[t + KS_ATTN_PREFETCH_ROWS], _MM_HINT_T1);   \
                        _mm_prefetch((const char *)(VR[t + KS_ATTN_PREFETCH_ROWS] + hd - 1), _MM_HINT_T1); \
                    }                                                                             \
                    __m512 vv[HDV];                                                               \
                    _Pragma("GCC unroll 16") for (int i = 0; i < HDV; i++)                        \
                        vv[i] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(v + 16 * i))); \
                    _Pragma("GCC unroll 16") for (int g = 0; g < VG; g++) {                       \
                        __m512 p = _mm512_set1_ps(scores[4 * (size_t)t + gs + g]);                \
                        _Pragma("GCC unroll 16") for (int i = 0; i < HDV; i++) acc[g][i] = _mm512_fmadd_ps(p, vv[i], acc[g][i]); \
                    }                                                                             \
                }                                                                                 \
                _Pragma("GCC unroll 16") for (int g = 0; g < VG; g++)                             \
                    if (gs + g < ng)                                                              \
                        _Pragma("GCC unroll 16") for (int i = 0; i < HDV; i++)                    \
                            _mm512_storeu_ps(out + (size_t)(g0 + gs + g) * hd + 16 * i, acc[g][i]); \
            }                                                                                     \
        }                                                                                         \
    } while (0)

TGT static void rows64(const uint16_t *const *KR, const uint16_t *const *VR, int total, int hd, int g0, int ng,
                       const float *q, float *scores, float *out, float scale) {
    SCORE_ROWS(4);
    softmax_lanes4(scores, total);
    VALUE_ROWS(4, 4);
}

TGT static void rows128(const uint16_t *const *KR, const uint16_t *const *VR, int total, int hd, int g0, int ng,
                        const float *q, float *scores, float *out, float scale) {
    SCORE_ROWS(8);
    softmax_lanes4(scores, total);
    VALUE_ROWS(8, 2);
}

TGT static void group64(const ks_kv_seg16 *segs, int nseg, int total, int hd, int g0, int ng, const float *q,
                        float *scores, float *out, float scale) {
    SCORE_BODY(4);
    softmax_lanes4(scores, total);
    VALUE_BODY(4, 4);
}

TGT static void group128(const ks_kv_seg16 *segs, int nseg, int total, int hd, int g0, int ng, const float *q,
                         float *scores, float *out, float scale) {
    SCORE_BODY(8);
    softmax_lanes4(scores, total);
    VALUE_BODY(8, 2);
}

bool ks_attention_segs_avx512(const ks_kv_seg16 *segs, int nseg, int total, int hd, int G, const float *q,
                              float *scores, float *out, float scale, float *weights, const void **rows) {
    if (hd != 64 && hd != 128) return false;
    /* short segments on average: flatten to row pointers (rows: [2][total]) */
    const uint16_t **KR = NULL, **VR = NULL;
    if (rows && (size_t)nseg * 8 > (size_t)total) {
        KR = (const uint16_t **)rows;
        VR = KR + total;
        for (int si = 0, t = 0; si < nseg; si++)
            for (int j = 0; j < segs[si].len; j++, t++) {
                KR[t] = segs[si].K + (size_t)j * hd;
                VR[t] = segs[si].V + (size_t)j * hd;
            }
    }
    for (int g0 = 0; g0 < G; g0 += 4) {
        int ng = G - g0 < 4 ? G - g0 : 4;
        if (KR && hd == 64) rows64(KR, VR, total, hd, g0, ng, q, scores, out, scale);
        else if (KR) rows128(KR, VR, total, hd, g0, ng, q, scores, out, scale);
        else if (hd == 64) group64(segs, nseg, total, hd, g0, ng, q, scores, out, scale);
        else group128(segs, nseg, total, hd, g0, ng, q, scores, out, scale);
        if (weights)
            for (int t = 0; t < total; t++)
                for (int g = 0; g < ng; g++) weights[t] += scores[4 * (size_t)t + g];
    }
    return true;
}
#else
bool ks_attention_segs_avx512(const ks_kv_seg16 *segs, int nseg, int total, int hd, int G, const float *q,
                              float *scores, float *out, float scale, float *weights, const void **rows) {
    return false;
}
#endif

/* ------------------------------------------------ prefill, query blocks -- */
#if defined(__x86_64__)
/* Causal attention of a block of R consecutive query rows (G heads each) of
 * one sequence over one KV head's pages.  Decode attention streams the KV
 * once per row, which makes a long prefill read the cache O(n) times; here
 * each page's K and V rows are converted once into an L1/L2-resident f32
 * tile and used by every query of the block, so the cache is read n/R times.
 *   segs: pages in entry order covering [0, n_att[R-1]) (f16 rows)
 *   n_att[r]: entries row r may see (non-decreasing)
 *   q: row r, head g at q + r*q_stride + g*hd; out likewise (out_stride)
 *   S: [R*G][n_att[R-1]] scores scratch; tile: [max page len][hd] f32 */
TGT bool ks_attention_block_avx512(const ks_kv_seg16 *segs, int nseg, const int32_t *n_att, int R, int hd, int G,
                                   const float *q, size_t q_stride, float *out, size_t out_stride, float *S,
                                   float *tile, float scale) {
    if (hd % 16) return false;
    int n_max = n_att[R - 1], RG = R * G, hv = hd / 16;
    /* scores, page by page */
    for (int si = 0, e0 = 0; si < nseg; e0 += segs[si].len, si++) {
        int L = segs[si].len;
        for (int t = 0; t < L; t++)
            for (int i = 0; i < hv; i++)
                _mm512_storeu_ps(tile + (size_t)t * hd + 16 * i,
                                 _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(segs[si].K + (size_t)t * hd + 16 * i))));
        for (int x = 0; x < RG; x++) {
            int r = x / G, g = x % G, lim = n_att[r] - e0;
            if (lim <= 0) continue;
            if (lim > L) lim = L;
            const float *qq = q + (size_t)r * q_stride + (size_t)g * hd;
            float *srow = S + (size_t)x * n_max + e0;
            for (int t = 0; t < lim; t++) {
                const float *k = tile + (size_t)t * hd;
                __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(qq), _mm512_loadu_ps(k));
                for (int i = 1; i < hv; i++) acc = _mm512_fmadd_ps(_mm512_loadu_ps(qq + 16 * i), _mm512_loadu_ps(k + 16 * i), acc);
                srow[t] = _mm512_reduce_add_ps(acc) * scale;
            }
        }
    }
    /* softmax per query over its visible entries */
    for (int x = 0; x < RG; x++) {
        int n = n_att[x / G];
        float *s = S + (size_t)x * n_max;
        __m512 mx = _mm512_set1_ps(-INFINITY);
        int t = 0;
        for (; t + 16 <= n; t += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(s + t));
        float m = _mm512_reduce_max_ps(mx);
        for (; t < n; t++) m = s[t] > m ? s[t] : m;
        __m512 mv = _mm512_set1_ps(m), sum = _mm512_setzero_ps();
        for (t = 0; t + 16 <= n; t += 16) {
            __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(s + t), mv));
            _mm512_storeu_ps(s + t, e);
            sum = _mm512_add_ps(sum, e);
        }
        float tot = _mm512_reduce_add_ps(sum);
        for (; t < n; t++) {
            __m512 e = exp512(_mm512_set1_ps(s[t] - m));
            s[t] = _mm512_cvtss_f32(e);
            tot += s[t];
        }
        __m512 inv = _mm512_set1_ps(1.0f / tot);
        for (t = 0; t + 16 <= n; t += 16) _mm512_storeu_ps(s + t, _mm512_mul_ps(_mm512_loadu_ps(s + t), inv));
        for (; t < n; t++) s[t] *= 1.0f / tot;
        float *o = out + (size_t)(x / G) * out_stride + (size_t)(x % G) * hd;
        memset(o, 0, sizeof(float) * hd);
    }
    /* values, page by page */
    for (int si = 0, e0 = 0; si < nseg; e0 += segs[si].len, si++) {
        int L = segs[si].len;
        for (int t = 0; t < L; t++)
            for (int i = 0; i < hv; i++)
                _mm512_storeu_ps(tile + (size_t)t * hd + 16 * i,
                                 _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(segs[si].V + (size_t)t * hd + 16 * i))));
        for (int x = 0; x < RG; x++) {
            int lim = n_att[x / G] - e0;
            if (lim <= 0) continue;
            if (lim > L) lim = L;
            const float *p = S + (size_t)x * n_max + e0;
            float *o = out + (size_t)(x / G) * out_stride + (size_t)(x % G) * hd;
            for (int i = 0; i < hv; i++) {
                __m512 acc = _mm512_loadu_ps(o + 16 * i);
                for (int t = 0; t < lim; t++)
                    acc = _mm512_fmadd_ps(_mm512_set1_ps(p[t]), _mm512_loadu_ps(tile + (size_t)t * hd + 16 * i), acc);
                _mm512_storeu_ps(o + 16 * i, acc);
            }
        }
    }
    return true;
}
#else
bool ks_attention_block_avx512(const ks_kv_seg16 *segs, int nseg, const int32_t *n_att, int R, int hd, int G,
                               const float *q, size_t q_stride, float *out, size_t out_stride, float *S, float *tile,
                               float scale) {
    return false;
}
#endif
