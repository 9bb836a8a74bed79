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
 *
 * 8-bit KV (Q8_0 rows) runs the same body (DECODE_BODY's KQ8): scores by
 * zmm vpdpbusd against the group's query quantised once per call, two
 * 32-blocks of a row per zmm, the butterfly kept in int32 up to the
 * per-block scales (q8_score4); values as f32 from int8 with the row's
 * block scale folded into the probabilities (pd_blk), so the V loop is
 * the f16 one with a different conversion.
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
/* avx512vnni for the 8-bit KV scores (ks_simd_current() == AVX512 implies it) */
#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c")))
#define INL static inline __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c"), always_inline))

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

/* 8-bit KV: a head group's scaled queries quantised once per call
 * (ks_attn_q8_query), laid out for q8_score4. */
typedef struct q8z_query {
    uint8_t qu[4][128] __attribute__((aligned(64))); /* [head][hd] q + 128 */
    float dq[2][16] __attribute__((aligned(64)));    /* [zmm chunk c][lane]: dq(head lane % 4, block 2c + lane / 4 % 2) */
} q8z_query;

/* Scores of four Q8_0 rows (kp4: their starts as uint16 pointers) against
 * the four heads, in reduce16's layout [row][head].  A zmm holds two 32-blocks
 * of a row (NZ zmm per row): vpdpbusd of the u8 query (q + 128) starting from
 * -128 * sum(k) (one more vpdpbusd per row) gives exact int32 lanes; the
 * butterfly's first three stages stay in int32 and leave each (row, head,
 * block) sum in a lane of its own, where it is scaled by d_k * d_q; the last
 * stage adds the blocks in float. */
INL __m512 q8_score4(const uint16_t *const *kp4, const q8z_query *qz, const int NZ) {
    const __m512i u128 = _mm512_set1_epi8((char)0x80), zero = _mm512_setzero_si512();
    const __m512i idx01 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i idx23 = _mm512_add_epi32(idx01, _mm512_set1_epi32(4));
    __m512 e01 = _mm512_setzero_ps(), e23 = _mm512_setzero_ps();
    _Pragma("GCC unroll 2") for (int c = 0; c < NZ; c++) {
        __m512i part[16];
        uint16_t h[8]; /* the rows' two block scales (f16) */
        _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++) {
            const uint8_t *row = (const uint8_t *)kp4[r] + 68 * (size_t)c;
            memcpy(&h[2 * r], row, 2);
            memcpy(&h[2 * r + 1], row + 34, 2);
            __m512i kz = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(row + 2))),
                                            _mm256_loadu_si256((const __m256i *)(row + 36)), 1);
            __m512i neg = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, u128, kz));
            _Pragma("GCC unroll 4") for (int g = 0; g < 4; g++)
                part[4 * r + g] = _mm512_dpbusd_epi32(neg, _mm512_load_si512(qz->qu[g] + 64 * c), kz);
        }
        __m512i a[8], cc[4];
        _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++)
            a[k] = _mm512_add_epi32(_mm512_unpacklo_epi32(part[2 * k], part[2 * k + 1]),
                                    _mm512_unpackhi_epi32(part[2 * k], part[2 * k + 1]));
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++)
            cc[j] = _mm512_add_epi32(_mm512_unpacklo_epi64(a[2 * j], a[2 * j + 1]),
                                     _mm512_unpackhi_epi64(a[2 * j], a[2 * j + 1]));
        /* [row 2j: block 2c, block 2c + 1 | row 2j + 1: ...] x 4 heads */
        __m512i i01 = _mm512_add_epi32(_mm512_shuffle_i32x4(cc[0], cc[1], 0x88), _mm512_shuffle_i32x4(cc[0], cc[1], 0xDD));
        __m512i i23 = _mm512_add_epi32(_mm512_shuffle_i32x4(cc[2], cc[3], 0x88), _mm512_shuffle_i32x4(cc[2], cc[3], 0xDD));
        __m128i hv = _mm_setr_epi16((short)h[0], (short)h[1], (short)h[2], (short)h[3], (short)h[4], (short)h[5],
                                    (short)h[6], (short)h[7]); /* built in registers, not stored and reloaded */
        __m512 dk = _mm512_castps256_ps512(_mm256_cvtph_ps(hv));
        __m512 dq = _mm512_load_ps(qz->dq[c]);
        e01 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i01), _mm512_mul_ps(_mm512_permutexvar_ps(idx01, dk), dq), e01);
        e23 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i23), _mm512_mul_ps(_mm512_permutexvar_ps(idx23, dk), dq), e23);
    }
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
#define DECODE_BODY(HDV, VG, KQ8)                                                                    \
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
        /* 8-bit V: [row][block][head] p times the row's block scale */                           \
        float pd_blk[KQ8 ? BLOCK_MAX * (HDV / 2) * 4 : 1] __attribute__((aligned(64)));          \
        const int rs = KQ8 ? (HDV) * 17 / 2 : hd; /* row stride in uint16 (Q8_0: 34 bytes per 32) */ \
        memset(acc_mem, 0, sizeof acc_mem);                                                       \
        __m128 run_max = _mm_set1_ps(-INFINITY), run_sum = _mm_setzero_ps();                      \
        int si = 0, sj = 0, cur = 0, frag = 0, nfrag = 0, done = 0;                               \
        int n = next_block(segs, nseg, rs, &si, &sj, kp[0], vp[0], &frag);                        \
        while (n > 0) {                                                                           \
            int nx = cur ^ 1;                                                                     \
            int nn = next_block(segs, nseg, rs, &si, &sj, kp[nx], vp[nx], &nfrag);                \
            int pf = frag || nfrag ? nn : 0; /* rows of the next block to prefetch */             \
            float *sc = want_probs ? scores + 4 * (size_t)done : s_blk;                           \
            int t = 0;                                                                            \
            for (; t + 4 <= n; t += 4) {                                                          \
                if (KQ8) {                                                                        \
                    _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++)                           \
                        if (t + r < pf) _mm_prefetch((const char *)kp[nx][t + r], _MM_HINT_T0);  \
                    _mm512_storeu_ps(sc + 4 * (size_t)t, q8_score4(kp[cur] + t, qz, HDV / 4));    \
                    continue;                                                                     \
                }                                                                                 \
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
                if (KQ8) { /* the row four times; its scores are the first four lanes */         \
                    const uint16_t *k4[4] = {k, k, k, k};                                         \
                    _mm_storeu_ps(sc + 4 * (size_t)t, _mm512_castps512_ps128(q8_score4(k4, qz, HDV / 4))); \
                    continue;                                                                     \
                }                                                                                 \
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
            if (KQ8)                                                                              \
                for (int r = 0; r < n; r++) {                                                     \
                    __m128 p4 = _mm_load_ps(p_blk + 4 * r);                                       \
                    _Pragma("GCC unroll 4") for (int b = 0; b < HDV / 2; b++)                     \
                        _mm_store_ps(pd_blk + (r * (HDV / 2) + b) * 4,                            \
                                     _mm_mul_ps(p4, _mm_set1_ps(_cvtsh_ss(vp[cur][r][17 * b])))); \
                }                                                                                 \
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
                        vv[i] = KQ8 ? _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(     \
                                          (const __m128i *)((const uint8_t *)v + 34 * (i / 2) + 2 + 16 * (i % 2))))) \
                                    : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(v + 16 * i))); \
                    _Pragma("GCC unroll 16") for (int g = 0; g < VG; g++) {                       \
                        __m512 pr = _mm512_set1_ps(p_blk[4 * r + (gs + g)]);                \
                        _Pragma("GCC unroll 16") for (int i = 0; i < HDV; i++) {                  \
                            __m512 pri = KQ8 ? _mm512_set1_ps(pd_blk[(r * (HDV / 2) + i / 2) * 4 + gs + g]) : pr; \
                            acc[g][i] = _mm512_fmadd_ps(pri, vv[i], acc[g][i]);                   \
                        }                                                                         \
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

#define DECODE_FN(NAME, HDV, VG, KQ8)                                                                       \
    TGT static void NAME(const ks_kv_seg16 *segs, int nseg, int total, int hd, int g0, int ng, const float *q,       \
                         const q8z_query *qz, float *scores, float *out, float scale, bool want_probs) {            \
        DECODE_BODY(HDV, VG, KQ8);                                                                              \
    }
DECODE_FN(decode64, 4, 4, 0)
DECODE_FN(decode128, 8, 2, 0)
DECODE_FN(decode64_q8, 4, 4, 1)
DECODE_FN(decode128_q8, 8, 2, 1)

/* the group's scaled queries [ng][hd] quantised into qz (absent heads zero) */
static void q8z_init(const float *q, int hd, int g0, int ng, float scale, q8z_query *qz) {
    float qs[128], d[4][4];
    for (int g = 0; g < 4; g++) {
        for (int i = 0; i < hd; i++) qs[i] = g < ng ? q[(size_t)(g0 + g) * hd + i] * scale : 0.0f;
        ks_attn_q8_query(qs, hd, NULL, qz->qu[g], d[g]);
    }
    for (int c = 0; c < hd / 64; c++)
        for (int l = 0; l < 16; l++) qz->dq[c][l] = d[l % 4][2 * c + (l / 4) % 2];
}

bool ks_attention_segs_avx512_kv(ks_kv_type kt, const ks_kv_seg *segs, int nseg, int total, int hd, int G,
                                 const float *q, float *scores, float *out, float scale, float *weights) {
    if ((hd != 64 && hd != 128) || (kt != KS_KV_F16 && kt != KS_KV_Q8)) return false;
    const ks_kv_seg16 *s16 = (const ks_kv_seg16 *)segs; /* Q8_0 rows are even-sized: walked as uint16 */
    for (int g0 = 0; g0 < G; g0 += 4) {
        int ng = G - g0 < 4 ? G - g0 : 4;
        bool wp = weights != NULL;
        if (kt == KS_KV_Q8) {
            q8z_query qz;
            q8z_init(q, hd, g0, ng, scale, &qz);
            if (hd == 64) decode64_q8(s16, nseg, total, hd, g0, ng, q, &qz, scores, out, scale, wp);
            else decode128_q8(s16, nseg, total, hd, g0, ng, q, &qz, scores, out, scale, wp);
        } else if (hd == 64) {
            decode64(s16, nseg, total, hd, g0, ng, q, NULL, scores, out, scale, wp);
        } else {
            decode128(s16, nseg, total, hd, g0, ng, q, NULL, scores, out, scale, wp);
        }
        if (weights)
            for (int t = 0; t < total; t++)
                for (int g = 0; g < ng; g++) weights[t] += scores[4 * (size_t)t + g];
    }
    return true;
}

bool ks_attention_segs_avx512(const ks_kv_seg16 *segs, int nseg, int total, int hd, int G, const float *q,
                              float *scores, float *out, float scale, float *weights) {
    return ks_attention_segs_avx512_kv(KS_KV_F16, (const ks_kv_seg *)segs, nseg, total, hd, G, q, scores, out, scale,
                                       weights);
}
#else
bool ks_attention_segs_avx512_kv(ks_kv_type kt, const ks_kv_seg *segs, int nseg, int total, int hd, int G,
                                 const float *q, float *scores, float *out, float scale, float *weights) {
    return false;
}
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
/* a page's f16 rows [L][hd] as f32 into tile [L][hd] */
INL void tile_f16(const uint16_t *rows, int L, int hd, float *tile) {
    for (int t = 0; t < L; t++)
        for (int i = 0; i < hd / 16; i++)
            _mm512_storeu_ps(tile + (size_t)t * hd + 16 * i,
                             _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rows + (size_t)t * hd + 16 * i))));
}

TGT bool ks_attention_block_avx512(const ks_kv_seg16 *segs, int nseg, const int32_t *n_att, int R, int hd, int G,
                                   const float *q, size_t q_stride, float *out, size_t out_stride, float *S,
                                   float *tile, float scale) {
    if (hd % 16) return false;
    int n_max = n_att[R - 1], RG = R * G, hv = hd / 16;
    /* scores, page by page */
    for (int si = 0, e0 = 0; si < nseg; e0 += segs[si].len, si++) {
        int L = segs[si].len;
        tile_f16(segs[si].K, L, hd, tile);
        for (int x = 0; x < RG; x++) {
            int r = x / G, g = x % G, lim = ks_attn_block_visible(n_att, G, x, e0, L);
            if (!lim) continue;
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
        float tot = ks_avx512_softmax_exp(s, n);
        __m512 inv = _mm512_set1_ps(1.0f / tot);
        int t;
        for (t = 0; t + 16 <= n; t += 16) _mm512_storeu_ps(s + t, _mm512_mul_ps(_mm512_loadu_ps(s + t), inv));
        for (; t < n; t++) s[t] *= 1.0f / tot;
        float *o = out + (size_t)(x / G) * out_stride + (size_t)(x % G) * hd;
        memset(o, 0, sizeof(float) * hd);
    }
    /* values, page by page */
    for (int si = 0, e0 = 0; si < nseg; e0 += segs[si].len, si++) {
        int L = segs[si].len;
        tile_f16(segs[si].V, L, hd, tile);
        for (int x = 0; x < RG; x++) {
            int lim = ks_attn_block_visible(n_att, G, x, e0, L);
            if (!lim) continue;
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
