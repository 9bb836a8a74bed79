/*
 * attn_avx512.c — grouped decode attention over f16 KV segments, AVX-512.
 *
 * Long-context decode is bound by reading the KV cache, so the kernel's job
 * is to keep up with memory: every K and V row is converted from f16 once and
 * used by all query heads of its GQA group, and nothing but the scores leaves
 * the registers.
 *  - One pass, page by page (online softmax): a page's K rows give its
 *    scores, the running max and denominator are updated (the accumulators
 *    rescaled when the max grows), then the same page's V rows are weighted
 *    in.  A head is then one forward stream where a page is K rows then V
 *    rows (slow tier, gather buffer) and two where K and V live in regions
 *    of their own (fast tier, slots), which the hardware prefetchers follow.
 *    A kernel that read all K, then all V, would read the paged layout as
 *    small pieces with holes between them, which the prefetchers do not
 *    follow.
 *  - Scores: four rows x a group of up to 4 heads give 16 zmm partial dot
 *    products, reduced together by one unpack/shuffle butterfly into a
 *    16-vector that is already in the row-major layout [row][4 heads]; no
 *    horizontal sum per score.  exp is a polynomial (relative error ~2e-7).
 *  - V: the page's rows are accumulated into registers per head group
 *    (hd 64: 4 heads x 4 zmm; hd 128: 2 heads x 8 zmm, two passes over the
 *    page while it is in L1).
 * Only head dims 64 and 128 (nearly every current model) take this path; the
 * caller falls back to the AVX2 or portable kernel otherwise.
 */
#include "infer/attn.h"

#include "core/core.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

#include "tensor/simd_avx512.h"

/* Rows of a block: the unit of the online softmax, and of the memory order.
 * A block is one page, so a page's K and V rows are read back to back;
 * blocks of two pages (K0 K1 V0 V1) would break the single forward stream
 * again.  Pages longer than this are taken in pieces
 * (two forward streams, K and V); runs shorter than BLOCK_MIN (token-level
 * selections) are merged into one block and the next block's rows are
 * prefetched, since their addresses follow no stream. */
enum { BLOCK_MAX = 32, BLOCK_MIN = 16 };
#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))
#define INL static inline __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c"), always_inline))

INL __m128 exp128(__m128 x) { return _mm512_castps512_ps128(ks_avx512_exp_neg(_mm512_castps128_ps512(x))); }

INL __m128 fold512(__m512 v) {
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* The four 128-bit lanes of v added: for a [4 rows][4 heads] vector, the
 * per-head sum. */
INL __m128 sum_lanes4(__m512 v) {
    return _mm_add_ps(_mm_add_ps(_mm512_castps512_ps128(v), _mm512_extractf32x4_ps(v, 1)),
                      _mm_add_ps(_mm512_extractf32x4_ps(v, 2), _mm512_extractf32x4_ps(v, 3)));
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

/* The next block from cursor (*si, *sj): its rows' K and V pointers into
 * kp/vp [BLOCK_MAX] and its row count; *frag is set when it merged runs. */
INL int next_block(const ks_kv_seg16 *segs, int nseg, int hd, int *si, int *sj, const uint16_t **kp,
                   const uint16_t **vp, int *frag) {
    int n = 0, runs = 0;
    while (*si < nseg && n < BLOCK_MAX) {
        int left = segs[*si].len - *sj, take = left < BLOCK_MAX - n ? left : BLOCK_MAX - n;
        const uint16_t *k = segs[*si].K + (size_t)*sj * hd, *v = segs[*si].V + (size_t)*sj * hd;
        for (int j = 0; j < take; j++) {
            kp[n + j] = k + (size_t)j * hd;
            vp[n + j] = v + (size_t)j * hd;
        }
        n += take, runs += take > 0;
        *sj += take;
        if (*sj == segs[*si].len) ++*si, *sj = 0;
        if (n >= BLOCK_MIN) break; /* a page, or a piece of a long one */
    }
    *frag = runs > 1;
    return n;
}

/* One pass over the segments for heads g0..g0+ng-1 (ng <= 4; absent heads
 * get zero q), block by block: the block's scores [n][4] (lane = head) by
 * four-row dot products reduced together (reduce16's output order is that
 * layout), the running max and denominator per head, the accumulators
 * rescaled when the max grows, then the block's V rows weighted into them.
 * K and V of a page are read back to back while the page is in L1.
 * The result depends only on the sequence of rows and where blocks fall,
 * which is fixed by the segments: a policy that selects every page passes
 * the dense segments and gets dense output bit for bit.  With want_probs the
 * raw scores are kept in scores[total][4] and turned into probabilities at
 * the end (for the policies that accumulate attention weights). */
#define DECODE_BODY(HDV, VG)                                                                      \
    do {                                                                                          \
        __m512 qv[4][HDV];                                                                        \
        _Pragma("GCC unroll 16") for (int g = 0; g < 4; g++)                                      \
            _Pragma("GCC unroll 16") for (int i = 0; i < HDV; i++)                                \
                qv[g][i] = g < ng ? _mm512_mul_ps(_mm512_loadu_ps(q + (size_t)(g0 + g) * hd + 16 * i), \
                                                  _mm512_set1_ps(scale))                          \
                                  : _mm512_setzero_ps();                                          \
        float acc_mem[4][16 * HDV] __attribute__((aligned(64))); /* [head][hd] running sums */    \
        float p_blk[4 * BLOCK_MAX] __attribute__((aligned(64)));  /* [row][head] exp(s - max) */  \
        float s_blk[4 * BLOCK_MAX] __attribute__((aligned(64)));  /* [row][head] raw scores */    \
        const uint16_t *kp[2][BLOCK_MAX], *vp[2][BLOCK_MAX];                                      \
        memset(acc_mem, 0, sizeof acc_mem);                                                       \
        __m128 run_max = _mm_set1_ps(-INFINITY), run_sum = _mm_setzero_ps();                      \
        int si = 0, sj = 0, cur = 0, frag = 0, nfrag = 0, done = 0;                               \
        int n = next_block(segs, nseg, hd, &si, &sj, kp[0], vp[0], &frag);                        \
        while (n > 0) {                                                                           \
            int nx = cur ^ 1;                                                                     \
            int nn = next_block(segs, nseg, hd, &si, &sj, kp[nx], vp[nx], &nfrag);                \
            int pf = frag || nfrag ? nn : 0; /* rows of the next block to prefetch */             \
            float *sc = want_probs ? scores + 4 * (size_t)done : s_blk;                           \
            int t = 0;                                                                            \
            for (; t + 4 <= n; t += 4) {                                                          \
                __m512 part[16];                                                                  \
                _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++) {                             \
                    const uint16_t *k = kp[cur][t + r];                                           \
                    if (t + r < pf) _mm_prefetch((const char *)kp[nx][t + r], _MM_HINT_T0);       \
                    __m512 kv[HDV];                                                               \
                    _Pragma("GCC unroll 16") for (int i = 0; i < HDV; i++)                        \
                        kv[i] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(k + 16 * i))); \
                    _Pragma("GCC unroll 16") for (int g = 0; g < 4; g++) {                        \
                        __m512 a = _mm512_mul_ps(kv[0], qv[g][0]);                                \
                        _Pragma("GCC unroll 16") for (int i = 1; i < HDV; i++)                    \
                            a = _mm512_fmadd_ps(kv[i], qv[g][i], a);                              \
                        part[4 * r + g] = a;                                                      \
                    }                                                                             \
                }                                                                                 \
                _mm512_storeu_ps(sc + 4 * (size_t)t, reduce16(part));                             \
            }                                                                                     \
            for (; t < n; t++) {                                                                  \
                const uint16_t *k = kp[cur][t];                                                   \
                if (t < pf) _mm_prefetch((const char *)kp[nx][t], _MM_HINT_T0);                   \
                __m512 kv[HDV];                                                                   \
                _Pragma("GCC unroll 16") for (int i = 0; i < HDV; i++)                            \
                    kv[i] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(k + 16 * i)));   \
                __m128 part[4];                                                                   \
                _Pragma("GCC unroll 4") for (int g = 0; g < 4; g++) {                             \
                    __m512 a = _mm512_mul_ps(kv[0], qv[g][0]);                                    \
                    _Pragma("GCC unroll 16") for (int i = 1; i < HDV; i++) a = _mm512_fmadd_ps(kv[i], qv[g][i], a); \
                    part[g] = fold512(a);                                                         \
                }                                                                                 \
                _mm_storeu_ps(sc + 4 * (size_t)t, _mm_hadd_ps(_mm_hadd_ps(part[0], part[1]), _mm_hadd_ps(part[2], part[3]))); \
            }                                                                                     \
            /* online softmax: new max, rescale factor, this block's exps */                      \
            __m512 bm_a = _mm512_set1_ps(-INFINITY), bm_b = bm_a; /* two chains: max is exact in any order */ \
            int m4 = 0;                                                                           \
            for (; m4 + 32 <= 4 * n; m4 += 32) {                                                  \
                bm_a = _mm512_max_ps(bm_a, _mm512_loadu_ps(sc + m4));                             \
                bm_b = _mm512_max_ps(bm_b, _mm512_loadu_ps(sc + m4 + 16));                        \
            }                                                                                     \
            for (; m4 + 16 <= 4 * n; m4 += 16) bm_a = _mm512_max_ps(bm_a, _mm512_loadu_ps(sc + m4)); \
            bm_a = _mm512_max_ps(bm_a, bm_b);                                                     \
            __m128 blk_max = _mm_max_ps(_mm_max_ps(_mm512_castps512_ps128(bm_a), _mm512_extractf32x4_ps(bm_a, 1)), \
                                        _mm_max_ps(_mm512_extractf32x4_ps(bm_a, 2), _mm512_extractf32x4_ps(bm_a, 3))); \
            blk_max = _mm_max_ps(blk_max, run_max);                                               \
            for (; m4 < 4 * n; m4 += 4) blk_max = _mm_max_ps(blk_max, _mm_loadu_ps(sc + m4));    \
            /* the max unchanged (most blocks once it settles): alpha is exactly 1 */             \
            const bool rescale = _mm_movemask_ps(_mm_cmpeq_ps(blk_max, run_max)) != 0xF;         \
            __m128 alpha = exp128(_mm_sub_ps(run_max, blk_max)); /* exp(-inf) clamps to ~1e-38 */ \
            run_max = blk_max;                                                                    \
            __m512 m16 = _mm512_broadcast_f32x4(run_max), psum = _mm512_setzero_ps();             \
            int i4 = 0;                                                                           \
            for (; i4 + 16 <= 4 * n; i4 += 16) {                                                  \
                __m512 e = ks_avx512_exp_neg(_mm512_sub_ps(_mm512_loadu_ps(sc + i4), m16));                  \
                _mm512_store_ps(p_blk + i4, e);                                                   \
                psum = _mm512_add_ps(psum, e);                                                    \
            }                                                                                     \
            __m128 s4 = sum_lanes4(psum);                                                         \
            for (; i4 < 4 * n; i4 += 4) {                                                         \
                __m128 e = exp128(_mm_sub_ps(_mm_loadu_ps(sc + i4), run_max));                    \
                _mm_store_ps(p_blk + i4, e);                                                      \
                s4 = _mm_add_ps(s4, e);                                                           \
            }                                                                                     \
            run_sum = _mm_add_ps(_mm_mul_ps(run_sum, alpha), s4);                                 \
            float al[4];                                                                          \
            _mm_storeu_ps(al, alpha);                                                             \
            for (int gs = 0; gs < ng; gs += VG) {                                                 \
                __m512 acc[VG][HDV];                                                              \
                _Pragma("GCC unroll 16") for (int g = 0; g < VG; g++) {                           \
                    __m512 a = _mm512_set1_ps(al[gs + g]);                                  \
                    _Pragma("GCC unroll 16") for (int i = 0; i < HDV; i++) {                      \
                        acc[g][i] = _mm512_load_ps(&acc_mem[gs + g][16 * i]);              \
                        if (rescale) acc[g][i] = _mm512_mul_ps(acc[g][i], a);                      \
                    }                                                                             \
                }                                                                                 \
                for (int r = 0; r < n; r++) {                                                     \
                    const uint16_t *v = vp[cur][r];                                               \
                    if (gs == 0 && r < pf) _mm_prefetch((const char *)vp[nx][r], _MM_HINT_T0);    \
                    __m512 vv[HDV];                                                               \
                    _Pragma("GCC unroll 16") for (int i = 0; i < HDV; i++)                        \
                        vv[i] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(v + 16 * i))); \
                    _Pragma("GCC unroll 16") for (int g = 0; g < VG; g++) {                       \
                        __m512 pr = _mm512_set1_ps(p_blk[4 * r + (gs + g)]);                \
                        _Pragma("GCC unroll 16") for (int i = 0; i < HDV; i++)                    \
                            acc[g][i] = _mm512_fmadd_ps(pr, vv[i], acc[g][i]);                    \
                    }                                                                             \
                }                                                                                 \
                _Pragma("GCC unroll 16") for (int g = 0; g < VG; g++)                             \
                    _Pragma("GCC unroll 16") for (int i = 0; i < HDV; i++)                        \
                        _mm512_store_ps(&acc_mem[gs + g][16 * i], acc[g][i]);               \
            }                                                                                     \
            done += n;                                                                            \
            n = nn;                                                                               \
            frag = nfrag;                                                                         \
            cur = nx;                                                                             \
        }                                                                                         \
        KS_ASSERT(done == total);                                                                 \
        float sums[4];                                                                            \
        _mm_storeu_ps(sums, run_sum);                                                             \
        for (int g = 0; g < ng; g++) {                                                            \
            __m512 inv = _mm512_set1_ps(1.0f / sums[g]);                                          \
            _Pragma("GCC unroll 16") for (int i = 0; i < HDV; i++)                                \
                _mm512_storeu_ps(out + (size_t)(g0 + g) * hd + 16 * i,                            \
                                 _mm512_mul_ps(_mm512_load_ps(&acc_mem[g][16 * i]), inv));        \
        }                                                                                         \
        if (want_probs) {                                                                         \
            __m128 inv4 = _mm_div_ps(_mm_set1_ps(1.0f), run_sum);                                 \
            __m512 m16 = _mm512_broadcast_f32x4(run_max), inv16 = _mm512_broadcast_f32x4(inv4);   \
            int i4 = 0;                                                                           \
            for (; i4 + 16 <= 4 * total; i4 += 16)                                                \
                _mm512_storeu_ps(scores + i4,                                                     \
                                 _mm512_mul_ps(ks_avx512_exp_neg(_mm512_sub_ps(_mm512_loadu_ps(scores + i4), m16)), inv16)); \
            for (; i4 < 4 * total; i4 += 4)                                                       \
                _mm_storeu_ps(scores + i4, _mm_mul_ps(exp128(_mm_sub_ps(_mm_loadu_ps(scores + i4), run_max)), inv4)); \
        }                                                                                         \
    } while (0)

TGT static void decode64(const ks_kv_seg16 *segs, int nseg, int total, int hd, int g0, int ng, const float *q,
                         float *scores, float *out, float scale, bool want_probs) {
    DECODE_BODY(4, 4);
}

TGT static void decode128(const ks_kv_seg16 *segs, int nseg, int total, int hd, int g0, int ng, const float *q,
                          float *scores, float *out, float scale, bool want_probs) {
    DECODE_BODY(8, 2);
}

bool ks_attention_segs_avx512(const ks_kv_seg16 *segs, int nseg, int total, int hd, int G, const float *q,
                              float *scores, float *out, float scale, float *weights) {
    if (hd != 64 && hd != 128) return false;
    for (int g0 = 0; g0 < G; g0 += 4) {
        int ng = G - g0 < 4 ? G - g0 : 4;
        if (hd == 64) decode64(segs, nseg, total, hd, g0, ng, q, scores, out, scale, weights != NULL);
        else decode128(segs, nseg, total, hd, g0, ng, q, scores, out, scale, weights != NULL);
        if (weights)
            for (int t = 0; t < total; t++)
                for (int g = 0; g < ng; g++) weights[t] += scores[4 * (size_t)t + g];
    }
    return true;
}
#else
bool ks_attention_segs_avx512(const ks_kv_seg16 *segs, int nseg, int total, int hd, int G, const float *q,
                              float *scores, float *out, float scale, float *weights) {
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
            __m512 e = ks_avx512_exp_neg(_mm512_sub_ps(_mm512_loadu_ps(s + t), mv));
            _mm512_storeu_ps(s + t, e);
            sum = _mm512_add_ps(sum, e);
        }
        float tot = _mm512_reduce_add_ps(sum);
        for (; t < n; t++) {
            __m512 e = ks_avx512_exp_neg(_mm512_set1_ps(s[t] - m));
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
