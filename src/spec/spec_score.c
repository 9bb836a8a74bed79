/*
 * spec_score.c — SpeContext's retrieval-head scoring kernels (spec_score.h):
 * per (row, KV head) the G DLM query heads against the head's K cache (f16
 * or Q8_0 rows),
 * then a per-head softmax folded into the group max.  Portable, AVX2 + FMA +
 * F16C, AVX-512 and NEON paths; apart from spec_head.c, which keeps the head's model
 * (fused features, q/k projections, K cache), and p_spec.c, the policy hooks.
 */
#include "spec/spec_score.h"

#include "policy/policy_util.h"
#include "policy/topk_parts.h"

#include "core/core.h"
#include "tensor/ops.h"
#include "tensor/q8dot_avx512.h"
#include "tensor/simd_avx2.h"
#include "tensor/simd_avx512.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#if defined(__aarch64__)
#include "tensor/simd_neon.h"
#endif

/* Row j of a K cache of type kt (f16 rows, or Q8_0 rows of hd rounded up to
 * 32 with zeros), hd elements into f32. */
static void key_row(const uint8_t *K, ks_dtype kt, int32_t j, int hd, float *out) {
    if (kt == KS_DTYPE_F16) {
        const ks_f16 *k = (const ks_f16 *)K + (size_t)j * hd;
        for (int i = 0; i < hd; i++) out[i] = ks_f16_to_f32(k[i]);
    } else {
        int hdp = ks_spec_kcache_dim(hd);
        float tmp[KS_SPEC_HD_MAX];
        ks_dequantize_row(KS_DTYPE_Q8_0, K + (size_t)j * ks_dtype_row_bytes(KS_DTYPE_Q8_0, hdp), tmp, hdp);
        memcpy(out, tmp, sizeof(float) * (size_t)hd);
    }
}

/* scores of G query heads against keys [0, n): out[g][j] */
static void scores_ref(const float *q, const uint8_t *K, ks_dtype kt, int32_t n, int hd, int G, float scale,
                       float *out) {
    float k[KS_SPEC_HD_MAX];
    for (int32_t j = 0; j < n; j++) {
        key_row(K, kt, j, hd, k);
        for (int g = 0; g < G; g++) {
            float acc = 0;
            for (int i = 0; i < hd; i++) acc += q[(size_t)g * hd + i] * k[i];
            out[(size_t)g * n + j] = acc * scale;
        }
    }
}

/* w[t..n) = max_g (x_gt - c_g): the combine pass, from entry t on (the SIMD
 * paths' tails, and the whole of the portable one). */
static void combine_from(const float *x, int G, int32_t n, const float *c, int32_t t, float *w) {
    for (; t < n; t++) {
        float v = x[t] - c[0];
        for (int g = 1; g < G; g++) v = fmaxf(v, x[(size_t)g * n + t] - c[g]);
        w[t] = v;
    }
}

/* One head's scaled query in Q8_0 blocks, as the AVX-512 VNNI path
 * quantises it (ks_q8_query_init: q * scale, then ks_quantize_query_q8):
 * the query side of the integer paths for Q8_0 keys at hd 64 or 128
 * (AVX2, NEON and q8_int_ref), which all give the VNNI path's bits. */
typedef struct q8_head {
    int8_t qi[128] __attribute__((aligned(32)));
    uint8_t qa[128] __attribute__((aligned(32))); /* |qi| */
    float d[4];
} q8_head;

static void q8_heads_init(const float *q, int hd, int G, float scale, q8_head *qh) {
    float qs[128];
    uint8_t qu[128];
    for (int g = 0; g < G; g++) {
        for (int i = 0; i < hd; i++) qs[i] = q[(size_t)g * hd + i] * scale;
        ks_quantize_query_q8(qs, hd, qh[g].qi, qu, qh[g].d);
        for (int i = 0; i < hd; i++) qh[g].qa[i] = (uint8_t)abs(qh[g].qi[i]);
    }
}

#if defined(__x86_64__)
#define SPEC_AVX512_TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c,fma")))
#define SPEC_AVX512_INL static inline __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,f16c,fma"), always_inline))

/* The 16 key lanes at off of row k (a multiple of 16): f16, or Q8_0 (the
 * block's int8 values times its scale; a row is padded with zeros to a whole
 * block, so the 16 bytes are in bounds even past hd). */
SPEC_AVX512_INL __m512 key_chunk_avx512(const uint8_t *k, int off, __mmask16 m, const int Q8) {
    if (!Q8) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const ks_f16 *)k + off));
    const uint8_t *blk = k + (size_t)(off >> 5) * 34;
    uint16_t d;
    memcpy(&d, blk, 2);
    __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2 + (off & 31)))));
    return _mm512_mul_ps(v, _mm512_set1_ps(_cvtsh_ss(d)));
}

/* acc[r * GB + h] += q[h] . K[r] over the 16 lanes at off (masked: the
 * lanes of the head dim's tail) for R = 16 / GB rows and GB heads: every
 * K chunk converted once for the GB heads. */
SPEC_AVX512_INL void scores_chunk_avx512(__m512 acc[16], const float *qg, const uint8_t *const k[16], int hd, int off,
                                         __mmask16 m, const int GB, const int Q8) {
    const int R = 16 / GB;
    __m512 qv[4];
    _Pragma("GCC unroll 4") for (int h = 0; h < GB; h++) qv[h] = _mm512_maskz_loadu_ps(m, qg + (size_t)h * hd + off);
    _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) {
        __m512 kv = key_chunk_avx512(k[r], off, m, Q8);
        _Pragma("GCC unroll 4") for (int h = 0; h < GB; h++)
            acc[r * GB + h] = _mm512_fmadd_ps(kv, qv[h], acc[r * GB + h]);
    }
}

/* Scores of G heads (in groups of GB = 4, 2 or 1 dividing G) against R =
 * 16 / GB keys at a time: 16 accumulators (rows x heads) reduced together
 * by ks_avx512_reduce16 into lanes r * GB + h, then transposed to the output's
 * [head][row] layout.  Any head dim: the last hd % 16 lanes are masked loads
 * (drafts need not pad their heads to 16).  K: rows of rb bytes. */
SPEC_AVX512_INL void scores_blocked_avx512(const float *q, const uint8_t *K, size_t rb, int32_t n, int hd, int G,
                                           float scale, float *out, const int GB, const int Q8) {
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
    const size_t block_bytes = (size_t)R * rb;
    for (int32_t j = 0; j < n; j += R) {
        int nr = n - j < R ? (int)(n - j) : R;
        /* the K cache is one forward stream: its rows KS_STREAM_AHEAD bytes ahead */
        ks_prefetch_lines(K + (size_t)j * rb + KS_STREAM_AHEAD, block_bytes);
        const uint8_t *k[16];
        _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) /* a short block repeats row j */
            k[r] = K + (size_t)(j + (r < nr ? r : 0)) * rb;
        for (int g0 = 0; g0 < G; g0 += GB) { /* heads inner: the R rows stay in L1 for the whole group */
            __m512 acc[16];
            _Pragma("GCC unroll 16") for (int a = 0; a < 16; a++) acc[a] = _mm512_setzero_ps();
            const float *qg = q + (size_t)g0 * hd;
            for (int i = 0; i < body; i += 16) scores_chunk_avx512(acc, qg, k, hd, i, all, GB, Q8);
            if (tail) scores_chunk_avx512(acc, qg, k, hd, body, tail, GB, Q8);
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

/* Q8_0 keys at hd 64 or 128 on integer units: the G heads four at a time,
 * their scaled queries quantised once (ks_q8_query_init), sixteen rows per
 * ks_q8_score16_heads, whose per-head vectors are already the output's
 * [head][row] layout.  The query's rounding (Q8_0, per 32-block) adds to
 * the keys': the scores differ from the f32 path by ~1e-3 relative. */
SPEC_AVX512_TGT static void scores_q8_vnni(const float *q, const uint8_t *K, size_t rb, int32_t n, int hd, int G,
                                           float scale, float *out) {
    const int NZ = hd / 64;
    for (int g0 = 0; g0 < G; g0 += 4) {
        int ng = G - g0 < 4 ? G - g0 : 4;
        ks_q8_query qz;
        ks_q8_query_init(q, hd, g0, ng, scale, &qz);
        for (int32_t j = 0; j < n; j += 16) {
            int nr = n - j < 16 ? (int)(n - j) : 16;
            ks_prefetch_lines(K + (size_t)j * rb + KS_STREAM_AHEAD, 16 * rb);
            const uint16_t *kp[16];
            for (int r = 0; r < 16; r++) /* a short block repeats row j */
                kp[r] = (const uint16_t *)(K + (size_t)(j + (r < nr ? r : 0)) * rb);
            __m512 f[4];
            ks_q8_score16_heads(kp, &qz, NZ, f);
            __mmask16 m = (__mmask16)((1u << nr) - 1u);
            for (int h = 0; h < ng; h++) _mm512_mask_storeu_ps(out + (size_t)(g0 + h) * n + j, m, f[h]);
        }
    }
}

SPEC_AVX512_TGT static void scores_avx512(const float *q, const uint8_t *K, size_t rb, bool q8, int32_t n, int hd,
                                          int G, float scale, float *out) {
    int GB = G % 4 == 0 ? 4 : G % 2 == 0 ? 2 : 1;
    if (q8) {
        switch (GB) {
        case 4: scores_blocked_avx512(q, K, rb, n, hd, G, scale, out, 4, 1); break;
        case 2: scores_blocked_avx512(q, K, rb, n, hd, G, scale, out, 2, 1); break;
        default: scores_blocked_avx512(q, K, rb, n, hd, G, scale, out, 1, 1); break;
        }
        return;
    }
    switch (GB) {
    case 4: scores_blocked_avx512(q, K, rb, n, hd, G, scale, out, 4, 0); break;
    case 2: scores_blocked_avx512(q, K, rb, n, hd, G, scale, out, 2, 0); break;
    default: scores_blocked_avx512(q, K, rb, n, hd, G, scale, out, 1, 0); break;
    }
}

/* The group weights in the log domain: for each head g, c_g = m_g +
 * log sum_j e^(x_gj - m_g) (m_g its max), so that log p_gj = x_gj - c_g,
 * and w_j = max_g (x_gj - c_g).  The log is monotonic, so the top-B of w is
 * the top-B of max_g p_gj (up to rounding at near-ties), without writing
 * the G rows of probabilities back or normalising them: one read for the
 * max, one for the sum of exponentials, one for the combine. */
__attribute__((target("avx512f,avx512dq,fma"))) static float log_normaliser_avx512(const float *x, int32_t n) {
    __m512 mx = _mm512_set1_ps(-INFINITY);
    int32_t t = 0;
    for (; t + 16 <= n; t += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(x + t));
    float m = _mm512_reduce_max_ps(mx);
    for (; t < n; t++) m = x[t] > m ? x[t] : m;
    __m512 mv = _mm512_set1_ps(m), sum = _mm512_setzero_ps();
    for (t = 0; t + 16 <= n; t += 16) sum = _mm512_add_ps(sum, ks_avx512_exp_neg(_mm512_sub_ps(_mm512_loadu_ps(x + t), mv)));
    float tot = _mm512_reduce_add_ps(sum);
    for (; t < n; t++) tot += _mm512_cvtss_f32(ks_avx512_exp_neg(_mm512_set1_ps(x[t] - m)));
    return m + logf(tot);
}

__attribute__((target("avx512f,avx512dq,fma"))) static void combine_avx512(const float *x, int G, int32_t n,
                                                                           const float *c, float *w) {
    int32_t t = 0;
    for (; t + 16 <= n; t += 16) {
        __m512 v = _mm512_sub_ps(_mm512_loadu_ps(x + t), _mm512_set1_ps(c[0]));
        for (int g = 1; g < G; g++)
            v = _mm512_max_ps(v, _mm512_sub_ps(_mm512_loadu_ps(x + (size_t)g * n + t), _mm512_set1_ps(c[g])));
        _mm512_storeu_ps(w + t, v);
    }
    combine_from(x, G, n, c, t, w);
}

__attribute__((target("avx512f,avx512dq,fma"))) static void group_logweights_avx512(const float *x, int G, int32_t n,
                                                                                    float *w) {
    float c[KS_SPEC_GROUP_MAX];
    for (int g = 0; g < G; g++) c[g] = log_normaliser_avx512(x + (size_t)g * n, n);
    combine_avx512(x, G, n, c, w);
}

/* The group weight at t as the combine pass computes it: the vector loop's
 * max (a > b ? a : b, MAXPS) below n16, fmaxf in the scalar tail. */
static inline float weight_at(const float *x, int G, int32_t n, const float *c, int32_t t, int32_t n16) {
    float v = x[t] - c[0];
    for (int g = 1; g < G; g++) {
        float u = x[(size_t)g * n + t] - c[g];
        v = t < n16 ? (v > u ? v : u) : fmaxf(v, u);
    }
    return v;
}

/* The group reduction fused with the top-k's sampled filter
 * (ks_spec_group_topk): the sample and the filter compute each weight where
 * they need it instead of reading a written-out w, so the 32K weights of a
 * long context are neither stored nor read back.  Returns -1, having
 * written nothing to idx, where the sampled filter gives up (the caller
 * then takes the unfused path, as ks_topk_scratch would). */
__attribute__((target("avx512f,avx512dq,fma"))) static int32_t group_topk_avx512(const float *x, int G, int32_t n,
                                                                                  const float *c, int32_t lo, int32_t hi,
                                                                                  int32_t k, int32_t *idx, float *w) {
    int32_t nn = hi - lo, m, want;
    if (!ks_topk_sample_plan(nn, k, &m, &want)) return -1;
    const int32_t n16 = n & ~15, cap = nn / 4;
    float *sample = w;                                          /* [m] */
    uint32_t *sample_tmp = (uint32_t *)(void *)(w + m);         /* [m] */
    float *cand = w + 2 * m;                                    /* [nn / 4] */
    int32_t *cand_pos = (int32_t *)(void *)(cand + cap);        /* [nn / 4] */
    uint32_t *cand_tmp = (uint32_t *)(void *)(cand_pos + cap);  /* [nn / 4] */
    for (int32_t i = 0; i < m; i++) sample[i] = weight_at(x, G, n, c, lo + 8 * i, n16);
    int32_t ties, cnt = 0, i = 0;
    uint32_t t = ks_topk_kth_key(sample, m, want, sample_tmp, &ties);
    /* the filter of topk.c's topk_filter_avx512 over the weights as they are made */
    const __m512i tv = _mm512_set1_epi32((int32_t)t);
    const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (; lo + i + 16 <= n16 && i + 16 <= nn; i += 16) {
        const float *xt = x + lo + i;
        __m512 v = _mm512_sub_ps(_mm512_loadu_ps(xt), _mm512_set1_ps(c[0]));
        for (int g = 1; g < G; g++)
            v = _mm512_max_ps(v, _mm512_sub_ps(_mm512_loadu_ps(xt + (size_t)g * n), _mm512_set1_ps(c[g])));
        __m512i key = ks_topk_key16(v);
        __mmask16 keep = _mm512_cmp_epu32_mask(key, tv, _MM_CMPINT_NLT);
        if (!keep) continue;
        int32_t nk = __builtin_popcount(keep);
        if (cnt + nk > cap) return -1;
        _mm512_mask_compressstoreu_ps(cand + cnt, keep, v);
        _mm512_mask_compressstoreu_epi32(cand_pos + cnt, keep, _mm512_add_epi32(lanes, _mm512_set1_epi32(i)));
        cnt += nk;
    }
    for (; i < nn; i++) {
        float v = weight_at(x, G, n, c, lo + i, n16);
        if (ks_topk_key(v) < t) continue;
        if (cnt == cap) return -1;
        cand[cnt] = v, cand_pos[cnt++] = i;
    }
    if (cnt < k) return -1;
    uint32_t th = ks_topk_kth_key(cand, cnt, k, cand_tmp, &ties);
    int32_t got = ks_topk_emit(cand, cand_pos, cnt, th, ties, idx, k);
    for (int32_t j = 0; j < got; j++) idx[j] += lo;
    return got;
}

/* AVX2 + FMA + F16C (AMD parts and most laptops lack AVX-512).  Scores:
 * eight accumulators = R rows x GB heads (GB: the largest of 8, 4, 2, 1
 * dividing G), reduced together by one hadd/permute butterfly into a vector
 * whose lanes are (head, row) pairs, so no horizontal sum per score; every K
 * chunk is converted from f16 once for the GB heads.  Any head dim >= 8: the
 * tail is one more chunk loaded at hd - 8 (in bounds) with the lanes the body
 * already counted zeroed, so nothing past the row is read. */

/* acc[h * R + r] += q[h] * K[r] over the 8 lanes at off.  f16: masked
 * zeroes the K lanes outside mask (the tail chunk at hd - 8, whose first
 * lanes the body already counted).  Q8_0 (Q8): chunks stay at multiples of 8
 * so that none crosses a 32-block, and the tail chunk instead loads only the
 * query lanes inside mask (the row's padding past hd is zeros). */
KS_AVX2_INL void scores_chunk_avx2(__m256 acc[8], const float *qg, const uint8_t *const k[8], int hd, int off,
                                   const bool masked, __m256 mask, const int GB, const int Q8) {
    const int R = 8 / GB;
    __m256 qv[8];
    _Pragma("GCC unroll 8") for (int h = 0; h < GB; h++) {
        qv[h] = Q8 && masked ? _mm256_maskload_ps(qg + (size_t)h * hd + off, _mm256_castps_si256(mask))
                             : _mm256_loadu_ps(qg + (size_t)h * hd + off);
        if (GB < 8) __asm__("" : "+x"(qv[h])); /* one load per head, not one per row (load ports) */
    }
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
        __m256 kv;
        if (Q8) {
            const uint8_t *blk = k[r] + (size_t)(off >> 5) * 34;
            uint16_t d;
            memcpy(&d, blk, 2);
            kv = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 2 + (off & 31)))));
            kv = _mm256_mul_ps(kv, _mm256_set1_ps(_cvtsh_ss(d)));
        } else {
            kv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const ks_f16 *)k[r] + off)));
            if (masked) kv = _mm256_and_ps(kv, mask);
        }
        _Pragma("GCC unroll 8") for (int h = 0; h < GB; h++)
            acc[h * R + r] = _mm256_fmadd_ps(kv, qv[h], acc[h * R + r]);
    }
}

/* out[g0 + h][j + r] for h < GB, r < nr: rows j.. of K (rb bytes each) against heads g0.. */
KS_AVX2_INL void scores_block_avx2(const float *q, const uint8_t *K, size_t rb, int32_t n, int hd, int g0, int32_t j,
                                   int nr, float scale, __m256 tmask, float *out, const int GB, const int Q8) {
    const int R = 8 / GB;
    const uint8_t *k[8];
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) /* a short block repeats row j */
        k[r] = K + (size_t)(j + (r < nr ? r : 0)) * rb;
    const float *qg = q + (size_t)g0 * hd;
    __m256 acc[8]; /* [GB][R] */
    _Pragma("GCC unroll 8") for (int a = 0; a < 8; a++) acc[a] = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= hd; i += 8) scores_chunk_avx2(acc, qg, k, hd, i, false, tmask, GB, Q8);
    if (i < hd) scores_chunk_avx2(acc, qg, k, hd, Q8 ? i : hd - 8, true, tmask, GB, Q8);
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

KS_AVX2_INL void scores_blocked_avx2(const float *q, const uint8_t *K, size_t rb, int32_t n, int hd, int G,
                                     float scale, float *out, const int GB, const int Q8) {
    const int R = 8 / GB;
    /* f16: tail lanes hd - 8 + l hold new elements for l >= 8 - hd % 8;
     * Q8_0: tail lanes (hd & ~7) + l are inside the head for l < hd % 8 */
    __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256 tmask = Q8 ? _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(hd % 8), lane))
                      : _mm256_castsi256_ps(_mm256_cmpgt_epi32(lane, _mm256_set1_epi32(7 - hd % 8)));
    for (int32_t j = 0; j < n; j += R) { /* heads inner: the R rows stay in L1 for the whole group */
        int nr = n - j < R ? (int)(n - j) : R;
        for (int g0 = 0; g0 < G; g0 += GB)
            scores_block_avx2(q, K, rb, n, hd, g0, j, nr, scale, tmask, out, GB, Q8);
    }
}

/* The integer path for Q8_0 keys at hd 64 or 128, AVX2's form of
 * scores_q8_vnni, with the same bits: each head's scaled query quantised
 * once into Q8_0 blocks (q8_heads_init), each (row, head, block) dot product
 * summed exactly in int32, then the VNNI kernel's float epilogue per 64-value
 * chunk c: s = I_2c * (dk_2c * dq_2c), s = fma(I_2c+1, dk_2c+1 * dq_2c+1, s),
 * f = c ? f + s : s.  AVX2 has no u8 x s8 dword dot product; vpmaddubsw
 * with the sign trick (|k| unsigned, q with k's sign applied) sums byte
 * pairs into int16 without saturating (|k| <= 128, |q| <= 127: at most
 * 32,512), vpmaddwd by ones widens the pairs to int32.  Eight rows at a
 * time, each (head, block) reduced over the rows' eight vectors by one
 * hadd butterfly into a vector whose lanes are the rows, so the epilogue
 * and the store run across rows as the VNNI kernel's do. */
KS_AVX2_INL __m256i q8_reduce8_epi32(const __m256i a[8]) {
    __m256i h01 = _mm256_hadd_epi32(a[0], a[1]), h23 = _mm256_hadd_epi32(a[2], a[3]);
    __m256i h45 = _mm256_hadd_epi32(a[4], a[5]), h67 = _mm256_hadd_epi32(a[6], a[7]);
    __m256i l = _mm256_hadd_epi32(h01, h23), h = _mm256_hadd_epi32(h45, h67); /* per 128-bit half */
    return _mm256_add_epi32(_mm256_permute2x128_si256(l, h, 0x20), _mm256_permute2x128_si256(l, h, 0x31));
}

/* lane r: the exact integer dot product of block b of row kp[r] with qv */
KS_AVX2_INL __m256i q8_block8_avx2(const uint8_t *const kp[8], int b, __m256i qv, __m256i qa) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i v[8];
    _Pragma("GCC unroll 8") for (int r = 0; r < 8; r++) {
        __m256i k = _mm256_loadu_si256((const __m256i *)(kp[r] + 34 * (size_t)b + 2));
        v[r] = _mm256_madd_epi16(_mm256_maddubs_epi16(qa, _mm256_sign_epi8(k, qv)), ones);
    }
    return q8_reduce8_epi32(v);
}

KS_AVX2_INL void scores_q8_int_avx2_nb(const q8_head *qh, const uint8_t *K, size_t rb, int32_t n, int G, float *out,
                                       const int NB) {
    for (int32_t j = 0; j < n; j += 8) {
        int nr = n - j < 8 ? (int)(n - j) : 8;
        ks_prefetch_lines(K + (size_t)j * rb + KS_STREAM_AHEAD, 8 * rb);
        const uint8_t *kp[8];
        _Pragma("GCC unroll 8") for (int r = 0; r < 8; r++) /* a short block repeats row j */
            kp[r] = K + (size_t)(j + (r < nr ? r : 0)) * rb;
        __m256 dk[4]; /* [block] lane r: row r's f16 scale */
        _Pragma("GCC unroll 4") for (int b = 0; b < NB; b++) {
            uint16_t hk[8];
            _Pragma("GCC unroll 8") for (int r = 0; r < 8; r++) memcpy(&hk[r], kp[r] + 34 * (size_t)b, 2);
            dk[b] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)hk));
        }
        for (int g = 0; g < G; g++) { /* heads inner: the eight rows stay in L1 for the whole group */
            __m256 f = _mm256_setzero_ps();
            _Pragma("GCC unroll 2") for (int c = 0; c < NB / 2; c++) {
                __m256i i0 = q8_block8_avx2(kp, 2 * c, _mm256_load_si256((const __m256i *)(qh[g].qi + 64 * c)),
                                            _mm256_load_si256((const __m256i *)(qh[g].qa + 64 * c)));
                __m256i i1 = q8_block8_avx2(kp, 2 * c + 1, _mm256_load_si256((const __m256i *)(qh[g].qi + 64 * c + 32)),
                                            _mm256_load_si256((const __m256i *)(qh[g].qa + 64 * c + 32)));
                __m256 s = _mm256_mul_ps(_mm256_cvtepi32_ps(i0), _mm256_mul_ps(dk[2 * c], _mm256_set1_ps(qh[g].d[2 * c])));
                s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i1), _mm256_mul_ps(dk[2 * c + 1], _mm256_set1_ps(qh[g].d[2 * c + 1])),
                                    s);
                f = c ? _mm256_add_ps(f, s) : s;
            }
            float *o = out + (size_t)g * n + j;
            if (nr == 8) {
                _mm256_storeu_ps(o, f);
            } else {
                float t[8];
                _mm256_storeu_ps(t, f);
                memcpy(o, t, sizeof(float) * (size_t)nr);
            }
        }
    }
}

KS_AVX2_TGT static void scores_q8_int_avx2(const float *q, const uint8_t *K, size_t rb, int32_t n, int hd, int G,
                                           float scale, float *out) {
    q8_head qh[KS_SPEC_GROUP_MAX];
    q8_heads_init(q, hd, G, scale, qh);
    if (hd == 64) scores_q8_int_avx2_nb(qh, K, rb, n, G, out, 2);
    else scores_q8_int_avx2_nb(qh, K, rb, n, G, out, 4);
}

#define SCORES_AVX2_GB(Q8)                                                                \
    switch (G % 8 == 0 ? 8 : G % 4 == 0 ? 4 : G % 2 == 0 ? 2 : 1) {                       \
    case 8: scores_blocked_avx2(q, K, rb, n, hd, G, scale, out, 8, Q8); break;            \
    case 4: scores_blocked_avx2(q, K, rb, n, hd, G, scale, out, 4, Q8); break;            \
    case 2: scores_blocked_avx2(q, K, rb, n, hd, G, scale, out, 2, Q8); break;            \
    default: scores_blocked_avx2(q, K, rb, n, hd, G, scale, out, 1, Q8); break;           \
    }

KS_AVX2_TGT static void scores_avx2(const float *q, const uint8_t *K, size_t rb, bool q8, int32_t n, int hd, int G,
                                    float scale, float *out) {
    if (hd < 8) {
        scores_ref(q, K, q8 ? KS_DTYPE_Q8_0 : KS_DTYPE_F16, n, hd, G, scale, out);
        return;
    }
    if (q8) {
        SCORES_AVX2_GB(1)
    } else {
        SCORES_AVX2_GB(0)
    }
}
#undef SCORES_AVX2_GB

/* group_logweights_avx512 in 8 lanes */
KS_AVX2_TGT static float log_normaliser_avx2(const float *x, int32_t n) {
    __m256 mx = _mm256_set1_ps(-INFINITY);
    int32_t t = 0;
    for (; t + 8 <= n; t += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(x + t));
    float m = ks_avx2_hmax(mx);
    for (; t < n; t++) m = x[t] > m ? x[t] : m;
    __m256 mv = _mm256_set1_ps(m), sum = _mm256_setzero_ps();
    for (t = 0; t + 8 <= n; t += 8) sum = _mm256_add_ps(sum, ks_avx2_exp_neg(_mm256_sub_ps(_mm256_loadu_ps(x + t), mv)));
    float tot = ks_avx2_hsum(sum);
    for (; t < n; t++) tot += _mm256_cvtss_f32(ks_avx2_exp_neg(_mm256_set1_ps(x[t] - m)));
    return m + logf(tot);
}

KS_AVX2_TGT static void group_logweights_avx2(const float *x, int G, int32_t n, float *w) {
    float c[KS_SPEC_GROUP_MAX];
    for (int g = 0; g < G; g++) c[g] = log_normaliser_avx2(x + (size_t)g * n, n);
    int32_t t = 0;
    for (; t + 8 <= n; t += 8) {
        __m256 v = _mm256_sub_ps(_mm256_loadu_ps(x + t), _mm256_set1_ps(c[0]));
        for (int g = 1; g < G; g++)
            v = _mm256_max_ps(v, _mm256_sub_ps(_mm256_loadu_ps(x + (size_t)g * n + t), _mm256_set1_ps(c[g])));
        _mm256_storeu_ps(w + t, v);
    }
    combine_from(x, G, n, c, t, w);
}

/* group_topk_avx512 in 8 lanes: the weights as group_logweights_avx2 makes
 * them (MAXPS below n8, fmaxf in the tail), the sample and the filter of
 * topk.c's topk_filter_avx2 over them as they are made; the same set and
 * order as the unfused AVX2 path.  -1 where the filter gives up. */
KS_AVX2_TGT static int32_t group_topk_avx2(const float *x, int G, int32_t n, const float *c, int32_t lo, int32_t hi,
                                           int32_t k, int32_t *idx, float *w) {
    int32_t nn = hi - lo, m, want;
    if (!ks_topk_sample_plan(nn, k, &m, &want)) return -1;
    const int32_t n8 = n & ~7, cap = nn / 4;
    float *sample = w;                                         /* [m] */
    uint32_t *sample_tmp = (uint32_t *)(void *)(w + m);        /* [m] */
    float *cand = w + 2 * m;                                   /* [nn / 4] */
    int32_t *cand_pos = (int32_t *)(void *)(cand + cap);       /* [nn / 4] */
    uint32_t *cand_tmp = (uint32_t *)(void *)(cand_pos + cap); /* [nn / 4] */
    for (int32_t i = 0; i < m; i++) sample[i] = weight_at(x, G, n, c, lo + 8 * i, n8);
    int32_t ties, cnt = 0, i = 0;
    uint32_t t = ks_topk_kth_key(sample, m, want, sample_tmp, &ties);
    const __m256i tv = _mm256_set1_epi32((int32_t)(t ^ 0x80000000u));
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (; lo + i + 8 <= n8 && i + 8 <= nn; i += 8) {
        const float *xt = x + lo + i;
        __m256 v = _mm256_sub_ps(_mm256_loadu_ps(xt), _mm256_set1_ps(c[0]));
        for (int g = 1; g < G; g++)
            v = _mm256_max_ps(v, _mm256_sub_ps(_mm256_loadu_ps(xt + (size_t)g * n), _mm256_set1_ps(c[g])));
        __m256i below = _mm256_cmpgt_epi32(tv, ks_topk_skey8(v));
        unsigned keep = ~(unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(below)) & 0xFFu;
        if (!keep) continue;
        int32_t nk = __builtin_popcount(keep);
        if (cnt + nk > cap) return -1;
        __m256i perm = ks_topk_pack8(keep);
        __m256 pv = _mm256_permutevar8x32_ps(v, perm);
        __m256i pp = _mm256_permutevar8x32_epi32(_mm256_add_epi32(lanes, _mm256_set1_epi32(i)), perm);
        if (cnt + 8 <= cap) { /* whole stores while they stay in cand (its tail runs into cand_pos) */
            _mm256_storeu_ps(cand + cnt, pv);
            _mm256_storeu_si256((__m256i *)(void *)(cand_pos + cnt), pp);
        } else {
            float bv[8];
            int32_t bp[8];
            _mm256_storeu_ps(bv, pv);
            _mm256_storeu_si256((__m256i *)(void *)bp, pp);
            memcpy(cand + cnt, bv, sizeof(float) * (size_t)nk);
            memcpy(cand_pos + cnt, bp, sizeof(int32_t) * (size_t)nk);
        }
        cnt += nk;
    }
    for (; i < nn; i++) {
        float v = weight_at(x, G, n, c, lo + i, n8);
        if (ks_topk_key(v) < t) continue;
        if (cnt == cap) return -1;
        cand[cnt] = v, cand_pos[cnt++] = i;
    }
    if (cnt < k) return -1;
    uint32_t th = ks_topk_kth_key(cand, cnt, k, cand_tmp, &ties);
    int32_t got = ks_topk_emit(cand, cand_pos, cnt, th, ties, idx, k);
    for (int32_t j = 0; j < got; j++) idx[j] += lo;
    return got;
}
#endif

#if defined(__aarch64__)
/* NEON (every AArch64 CPU).  Scores: one key row at a time, converted to
 * f32 once (f16 by fcvtl, Q8_0 as ks_dequantize_row does: d * q in f32) and
 * dotted with the G heads' queries in four accumulators of four lanes, so
 * the row's conversion is shared by the group as in the AVX2 form; the sum
 * differs from the scalar path's only in order (test_spec bounds it). */
static float dot_neon(const float *a, const float *b, int n) {
    float32x4_t s0 = vdupq_n_f32(0.0f), s1 = s0, s2 = s0, s3 = s0;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
        s1 = vfmaq_f32(s1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
        s2 = vfmaq_f32(s2, vld1q_f32(a + i + 8), vld1q_f32(b + i + 8));
        s3 = vfmaq_f32(s3, vld1q_f32(a + i + 12), vld1q_f32(b + i + 12));
    }
    for (; i + 4 <= n; i += 4) s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
    float acc = vaddvq_f32(vaddq_f32(vaddq_f32(s0, s1), vaddq_f32(s2, s3)));
    for (; i < n; i++) acc += a[i] * b[i];
    return acc;
}

static void scores_neon(const float *q, const uint8_t *K, size_t rb, bool q8, int32_t n, int hd, int G, float scale,
                        float *out) {
    float k[KS_SPEC_HD_MAX];
    const int hdp = ks_spec_kcache_dim(hd);
    for (int32_t j = 0; j < n; j++) {
        const uint8_t *row = K + (size_t)j * rb;
        if (!q8) {
            const ks_f16 *h = (const ks_f16 *)row;
            int i = 0;
            for (; i + 8 <= hd; i += 8) {
                const float16x8_t v = vreinterpretq_f16_u16(vld1q_u16(h + i));
                vst1q_f32(k + i, vcvt_f32_f16(vget_low_f16(v)));
                vst1q_f32(k + i + 4, vcvt_high_f32_f16(v));
            }
            for (; i < hd; i++) k[i] = ks_f16_to_f32(h[i]);
        } else {
            const ks_block_q8_0 *b = (const ks_block_q8_0 *)row;
            for (int i = 0; i < hdp; i += 32, b++) {
                const float32x4_t d = vdupq_n_f32(ks_f16_to_f32(b->d));
                for (int h = 0; h < 32; h += 8) {
                    const int16x8_t v = vmovl_s8(vld1_s8(b->qs + h));
                    vst1q_f32(k + i + h, vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(v))), d));
                    vst1q_f32(k + i + h + 4, vmulq_f32(vcvtq_f32_s32(vmovl_high_s16(v)), d));
                }
            }
        }
        for (int g = 0; g < G; g++) out[(size_t)g * n + j] = dot_neon(q + (size_t)g * hd, k, hd) * scale;
    }
}

/* The integer path for Q8_0 keys at hd 64 or 128 on NEON, with the AVX2 and
 * VNNI paths' bits (q8_head, scores_q8_int_avx2): four rows at a time, each
 * (row, head, block) dot product exact in int32 lanes, the four rows'
 * partials reduced by two pairwise adds into a vector whose lanes are the
 * rows, then the same float epilogue per 64-value chunk (the mul, then
 * fmla, then the add across chunks).  DOT: sdot (16 multiply-adds a
 * instruction, dotprod CPUs); otherwise smull / smlal2 into int16 (two
 * products a lane, at most 2 * 128 * 127 = 32,512: no overflow) and
 * sadalp into int32, 4x the instructions and every AArch64 CPU has them. */
#if defined(__clang__)
#define SPEC_NEON_TGT_DOT __attribute__((target("dotprod")))
#else
#define SPEC_NEON_TGT_DOT __attribute__((target("arch=armv8.2-a+dotprod")))
#endif
#define SPEC_NEON_INL static inline __attribute__((always_inline))
#define SPEC_NEON_AHEAD 2048 /* KS_STREAM_AHEAD's distance (simd_avx2.h): not measured on ARM */

/* int32 partials of one 32-byte block (k at kb, query q0 / q1) */
SPEC_NEON_INL int32x4_t q8_block_neon(const int8_t *kb, int8x16_t q0, int8x16_t q1) {
    const int8x16_t k0 = vld1q_s8(kb), k1 = vld1q_s8(kb + 16);
    int16x8_t p0 = vmull_s8(vget_low_s8(k0), vget_low_s8(q0));
    p0 = vmlal_high_s8(p0, k0, q0);
    int16x8_t p1 = vmull_s8(vget_low_s8(k1), vget_low_s8(q1));
    p1 = vmlal_high_s8(p1, k1, q1);
    return vpadalq_s16(vpaddlq_s16(p0), p1);
}

SPEC_NEON_TGT_DOT SPEC_NEON_INL int32x4_t q8_block_dot(const int8_t *kb, int8x16_t q0, int8x16_t q1) {
    return vdotq_s32(vdotq_s32(vdupq_n_s32(0), vld1q_s8(kb), q0), vld1q_s8(kb + 16), q1);
}

/* The kernel once per block form, each under its own target (an always
 * inline body may not call sdot from a function built without dotprod). */
#define SPEC_Q8_NEON_KERNEL(NAME, ATTR, BLOCK)                                                                    \
    ATTR SPEC_NEON_INL void NAME##_nb(const q8_head *qh, const uint8_t *K, size_t rb, int32_t n, int G, float *out, \
                                      const int NB) {                                                           \
        for (int32_t j = 0; j < n; j += 4) {                                                                    \
            int nr = n - j < 4 ? (int)(n - j) : 4;                                                              \
            for (size_t l = 0; l < 4 * rb; l += 64) /* the K cache's stream, as the x86 kernels */             \
                __builtin_prefetch(K + (size_t)j * rb + SPEC_NEON_AHEAD + l);                                   \
            const uint8_t *kp[4];                                                                               \
            _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++) /* a short block repeats row j */               \
                kp[r] = K + (size_t)(j + (r < nr ? r : 0)) * rb;                                                \
            float32x4_t dk[4];                                                                                  \
            _Pragma("GCC unroll 4") for (int b = 0; b < NB; b++) {                                              \
                uint16_t hk[4];                                                                                 \
                _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++) memcpy(&hk[r], kp[r] + 34 * (size_t)b, 2);  \
                dk[b] = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(hk)));                                       \
            }                                                                                                   \
            for (int g = 0; g < G; g++) {                                                                       \
                float32x4_t f = vdupq_n_f32(0.0f);                                                              \
                _Pragma("GCC unroll 2") for (int c = 0; c < NB / 2; c++) {                                      \
                    int32x4_t in[2];                                                                            \
                    _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {                                       \
                        const int b = 2 * c + h;                                                                \
                        const int8x16_t q0 = vld1q_s8(qh[g].qi + 32 * b), q1 = vld1q_s8(qh[g].qi + 32 * b + 16); \
                        int32x4_t v[4];                                                                         \
                        _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++)                                     \
                            v[r] = BLOCK((const int8_t *)(kp[r] + 34 * (size_t)b + 2), q0, q1);                 \
                        in[h] = vpaddq_s32(vpaddq_s32(v[0], v[1]), vpaddq_s32(v[2], v[3])); /* lane r: row r */ \
                    }                                                                                           \
                    float32x4_t s =                                                                             \
                        vmulq_f32(vcvtq_f32_s32(in[0]), vmulq_f32(dk[2 * c], vdupq_n_f32(qh[g].d[2 * c])));     \
                    s = vfmaq_f32(s, vcvtq_f32_s32(in[1]), vmulq_f32(dk[2 * c + 1], vdupq_n_f32(qh[g].d[2 * c + 1]))); \
                    f = c ? vaddq_f32(f, s) : s;                                                                \
                }                                                                                               \
                float *o = out + (size_t)g * n + j;                                                             \
                if (nr == 4) {                                                                                  \
                    vst1q_f32(o, f);                                                                            \
                } else {                                                                                        \
                    float t[4];                                                                                 \
                    vst1q_f32(t, f);                                                                            \
                    memcpy(o, t, sizeof(float) * (size_t)nr);                                                   \
                }                                                                                               \
            }                                                                                                   \
        }                                                                                                       \
    }                                                                                                           \
    ATTR static void NAME(const float *q, const uint8_t *K, size_t rb, int32_t n, int hd, int G, float scale,   \
                          float *out) {                                                                         \
        q8_head qh[KS_SPEC_GROUP_MAX];                                                                          \
        q8_heads_init(q, hd, G, scale, qh);                                                                     \
        if (hd == 64) NAME##_nb(qh, K, rb, n, G, out, 2);                                                       \
        else NAME##_nb(qh, K, rb, n, G, out, 4);                                                                \
    }
SPEC_Q8_NEON_KERNEL(scores_q8_int_neon, , q8_block_neon)
SPEC_Q8_NEON_KERNEL(scores_q8_int_dot, SPEC_NEON_TGT_DOT, q8_block_dot)
#undef SPEC_Q8_NEON_KERNEL

/* group_logweights_avx2 in 4 lanes */
static float log_normaliser_neon(const float *x, int32_t n) {
    float32x4_t mx = vdupq_n_f32(-INFINITY);
    int32_t t = 0;
    for (; t + 4 <= n; t += 4) mx = vmaxq_f32(mx, vld1q_f32(x + t));
    float m = vmaxvq_f32(mx);
    for (; t < n; t++) m = x[t] > m ? x[t] : m;
    const float32x4_t mv = vdupq_n_f32(m);
    float32x4_t sum = vdupq_n_f32(0.0f);
    for (t = 0; t + 4 <= n; t += 4) sum = vaddq_f32(sum, ks_neon_exp_neg(vsubq_f32(vld1q_f32(x + t), mv)));
    float tot = vaddvq_f32(sum);
    for (; t < n; t++) tot += vgetq_lane_f32(ks_neon_exp_neg(vdupq_n_f32(x[t] - m)), 0);
    return m + logf(tot);
}

static void group_logweights_neon(const float *x, int G, int32_t n, float *w) {
    float c[KS_SPEC_GROUP_MAX];
    for (int g = 0; g < G; g++) c[g] = log_normaliser_neon(x + (size_t)g * n, n);
    int32_t t = 0;
    for (; t + 4 <= n; t += 4) {
        float32x4_t v = vsubq_f32(vld1q_f32(x + t), vdupq_n_f32(c[0]));
        for (int g = 1; g < G; g++) v = vmaxq_f32(v, vsubq_f32(vld1q_f32(x + (size_t)g * n + t), vdupq_n_f32(c[g])));
        vst1q_f32(w + t, v);
    }
    combine_from(x, G, n, c, t, w);
}
#endif

int ks_spec_kcache_dim(int hd) { return (hd + 31) & ~31; }

size_t ks_spec_kcache_row_bytes(ks_dtype kt, int hd) {
    return kt == KS_DTYPE_F16 ? sizeof(ks_f16) * (size_t)hd : ks_dtype_row_bytes(KS_DTYPE_Q8_0, ks_spec_kcache_dim(hd));
}

void ks_spec_kcache_store(ks_dtype kt, const float *k, int hd, void *row) {
    if (kt == KS_DTYPE_F16) {
        ks_f16 *dst = row;
        for (int i = 0; i < hd; i++) dst[i] = ks_f32_to_f16(k[i]);
        return;
    }
    int hdp = ks_spec_kcache_dim(hd);
    if (hdp == hd) { /* whole blocks: no padding to write (every prompt row passes here) */
        ks_quantize_row(KS_DTYPE_Q8_0, k, row, hd);
        return;
    }
    float padded[KS_SPEC_HD_MAX];
    memcpy(padded, k, sizeof(float) * (size_t)hd);
    memset(padded + hd, 0, sizeof(float) * (size_t)(hdp - hd));
    ks_quantize_row(KS_DTYPE_Q8_0, padded, row, hdp);
}

/* Which kernel ks_spec_scores runs: one choice for the dispatch and for
 * ks_spec_scores_kernel_name, so a test that asserts the name asserts the
 * path.  Q8_0 keys at hd 64 or 128 go to the integer paths at every SIMD
 * level (the same bits on each; 2.1x the AVX2 float path's speed on Zen 3,
 * docs/policies/spec-scores.md). */
typedef enum { SP_SCALAR, SP_AVX2, SP_Q8_AVX2, SP_AVX512, SP_Q8_VNNI, SP_NEON, SP_Q8_NEON, SP_Q8_DOT } scores_path_t;
static const char *const k_scores_names[] = {"scalar", "avx2",   "q8_int_avx2", "avx512",
                                             "q8_vnni", "neon", "q8_int_neon", "q8_int_dot"};

static scores_path_t scores_path(ks_dtype kt, int hd, ks_simd_level simd) {
    const bool qint = kt == KS_DTYPE_Q8_0 && (hd == 64 || hd == 128);
    (void)qint;
#if defined(__x86_64__)
    if (simd >= KS_SIMD_AVX512) return qint ? SP_Q8_VNNI : SP_AVX512;
    if (simd >= KS_SIMD_AVX2) return qint ? SP_Q8_AVX2 : hd < 8 ? SP_SCALAR : SP_AVX2;
#endif
#if defined(__aarch64__)
    if (simd >= KS_SIMD_NEON_DOT && qint) return SP_Q8_DOT;
    if (simd >= KS_SIMD_NEON) return qint ? SP_Q8_NEON : SP_NEON;
#endif
    (void)simd;
    (void)hd;
    return SP_SCALAR;
}

const char *ks_spec_scores_kernel_name(ks_dtype kt, int hd, ks_simd_level simd) {
    return k_scores_names[scores_path(kt, hd, simd)];
}

void ks_spec_scores(const float *q, const void *K, ks_dtype kt, int32_t n, int hd, int G, float scale, float *out,
                    ks_simd_level simd) {
    KS_ASSERT((kt == KS_DTYPE_F16 || kt == KS_DTYPE_Q8_0) && hd <= KS_SPEC_HD_MAX);
    const size_t rb = ks_spec_kcache_row_bytes(kt, hd);
    const bool q8 = kt == KS_DTYPE_Q8_0;
    (void)rb;
    (void)q8;
    switch (scores_path(kt, hd, simd)) {
#if defined(__x86_64__)
    case SP_Q8_VNNI: scores_q8_vnni(q, K, rb, n, hd, G, scale, out); return;
    case SP_AVX512: scores_avx512(q, K, rb, q8, n, hd, G, scale, out); return;
    case SP_Q8_AVX2: scores_q8_int_avx2(q, K, rb, n, hd, G, scale, out); return;
    case SP_AVX2: scores_avx2(q, K, rb, q8, n, hd, G, scale, out); return;
#endif
#if defined(__aarch64__)
    case SP_Q8_DOT: scores_q8_int_dot(q, K, rb, n, hd, G, scale, out); return;
    case SP_Q8_NEON: scores_q8_int_neon(q, K, rb, n, hd, G, scale, out); return;
    case SP_NEON: scores_neon(q, K, rb, q8, n, hd, G, scale, out); return;
#endif
    default: scores_ref(q, K, kt, n, hd, G, scale, out); return;
    }
}

void ks_spec_group_logweights(const float *x, int G, int32_t n, float *w, ks_simd_level simd) {
    KS_ASSERT(G >= 1 && G <= KS_SPEC_GROUP_MAX);
    if (n <= 0) return;
#if defined(__x86_64__)
    if (simd >= KS_SIMD_AVX512) {
        group_logweights_avx512(x, G, n, w);
        return;
    }
    if (simd >= KS_SIMD_AVX2) {
        group_logweights_avx2(x, G, n, w);
        return;
    }
#endif
#if defined(__aarch64__)
    if (simd >= KS_SIMD_NEON) {
        group_logweights_neon(x, G, n, w);
        return;
    }
#endif
    (void)simd;
    float c[KS_SPEC_GROUP_MAX];
    for (int g = 0; g < G; g++) {
        const float *xg = x + (size_t)g * n;
        float m = xg[0];
        for (int32_t j = 1; j < n; j++) m = xg[j] > m ? xg[j] : m;
        double tot = 0;
        for (int32_t j = 0; j < n; j++) tot += exp((double)xg[j] - m);
        c[g] = m + (float)log(tot);
    }
    combine_from(x, G, n, c, 0, w);
}

int32_t ks_spec_group_topk(float *x, int G, int32_t n, int32_t lo, int32_t hi, int32_t k, int32_t *idx, float *w,
                           ks_simd_level simd) {
    KS_ASSERT(G >= 1 && G <= KS_SPEC_GROUP_MAX && 0 <= lo && lo <= hi && hi <= n);
#if defined(__x86_64__)
    if (simd >= KS_SIMD_AVX512 && n > 0) {
        float c[KS_SPEC_GROUP_MAX];
        for (int g = 0; g < G; g++) c[g] = log_normaliser_avx512(x + (size_t)g * n, n);
        int32_t got = group_topk_avx512(x, G, n, c, lo, hi, k, idx, w);
        if (got >= 0) return got;
        combine_avx512(x, G, n, c, w); /* the filter gave up: every weight, then the whole select */
        return ks_topk_range(w, lo, hi, k, idx, x);
    }
    if (simd == KS_SIMD_AVX2 && n > 0) {
        float c[KS_SPEC_GROUP_MAX];
        for (int g = 0; g < G; g++) c[g] = log_normaliser_avx2(x + (size_t)g * n, n);
        int32_t got = group_topk_avx2(x, G, n, c, lo, hi, k, idx, w);
        if (got >= 0) return got;
        /* the filter gave up: group_logweights_avx2's weights, then the whole select */
    }
#endif
    ks_spec_group_logweights(x, G, n, w, simd);
    return ks_topk_range(w, lo, hi, k, idx, x);
}
