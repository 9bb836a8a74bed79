/*
 * attn_avx512_wide.c — decode attention of a wide query group (more than
 * four query heads on one KV head) over f16 KV segments, AVX-512.
 *
 * Why.  Latent attention (deepseek2, infer/mla.c) is multi-query attention:
 * every query head (16 in V2-Lite) scores the same stored row of 576
 * values.  The AVX2 kernel (attn_avx2.c), which AVX-512 hosts run for head
 * dims other than 64 and 128, takes a group four heads at a time, so a step
 * read each latent row from memory four times and converted it from f16
 * four times: at 32K the dense step's attention read ~4 GB a token where its
 * rows are 1 GB (docs/results/moe.md, "Decode at 32K").  Here a row is read
 * once per step for up to sixteen heads, and each f16 load feeds eight or
 * sixteen FMAs.
 *
 * Plan (one pass over the segments, block by block, online softmax, as
 * attn_avx2.c):
 *  - Scores: two rows x eight heads give sixteen zmm partial dot products
 *    (per 16 channels: two conversions, eight query loads, sixteen FMAs),
 *    reduced together into [row][head] by ks_avx512_reduce16.  Heads are
 *    padded to 8 or 16 with zero queries (their lanes are never written
 *    out).
 *  - Softmax: with at most sixteen heads a pass, one zmm holds a row's
 *    scores of every head, so the running max, the rescale factor and the
 *    denominator are one vector each.
 *  - Values: per slice of the head dim, sixteen accumulators (16 heads x 1
 *    zmm, or 8 heads x 2 zmm) take every row of the block: one conversion
 *    and sixteen broadcast probabilities per sixteen FMAs; the running sums
 *    [heads][hd] stay in L1/L2 between blocks.
 * More than sixteen heads (DeepSeek-V2/V3's 128) run in passes of sixteen.
 * The arithmetic of a head depends only on the rows and on where blocks fall
 * (the segments fix both), not on the other heads, so a policy that selects
 * every entry reproduces dense bit for bit, as with the other kernels.
 */
#include "attn/attn.h"

#include "core/core.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

#include "tensor/simd_avx512.h"

#define WTGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))
#define WINL static inline __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c"), always_inline))

/* Rows of a block (the online softmax's unit): a page, a piece of a longer
 * one, or short runs merged up to WB_MIN rows. */
enum { WB_MAX = 32, WB_MIN = 16, WIDE_HEADS = 16 };
#define KS_ATTN_WIDE_MAX_HD 1024 /* latent attention: 576 (deepseek2) */

typedef struct wide_block {
    const uint16_t *k[WB_MAX], *v[WB_MAX];
    int n;
} wide_block;

/* The next block of the walk (*si, *sj) over the segments; its row count. */
static int wide_next(const ks_kv_seg *segs, int nseg, size_t rb, int *si, int *sj, wide_block *b) {
    int n = 0;
    while (*si < nseg && n < WB_MAX) {
        int left = segs[*si].len - *sj, take = left < WB_MAX - n ? left : WB_MAX - n;
        const uint8_t *k = (const uint8_t *)segs[*si].K + (size_t)*sj * rb, *v = (const uint8_t *)segs[*si].V + (size_t)*sj * rb;
        for (int j = 0; j < take; j++) {
            b->k[n + j] = (const uint16_t *)(k + (size_t)j * rb);
            b->v[n + j] = (const uint16_t *)(v + (size_t)j * rb);
        }
        n += take;
        *sj += take;
        if (*sj == segs[*si].len) ++*si, *sj = 0;
        if (n >= WB_MIN) break;
    }
    b->n = n;
    return n;
}

WINL __m512 cvt16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }

WINL void prefetch_row(const void *row, size_t rb) {
    for (size_t o = 0; o < rb; o += 64) _mm_prefetch((const char *)row + o, _MM_HINT_T0);
}

/* Raw scores sc[t][GP] of the block's rows against qs [GP][hd] (scaled,
 * padded heads zero), prefetching the next block's K rows. */
#define WIDE_SCORES_FN(NAME, GP)                                                                                   \
    WTGT __attribute__((noinline)) static void NAME(const wide_block *b, const wide_block *nb, int hd, size_t rb, \
                                                    const float *qs, float *sc) {                                  \
        for (int t = 0; t < b->n; t += 2) {                                                                        \
            const uint16_t *k0 = b->k[t], *k1 = b->k[t + 1 < b->n ? t + 1 : t];                                    \
            if (t < nb->n) prefetch_row(nb->k[t], rb);                                                             \
            if (t + 1 < nb->n) prefetch_row(nb->k[t + 1], rb);                                                     \
            for (int g8 = 0; g8 < (GP); g8 += 8) {                                                                 \
                const float *q8 = qs + (size_t)g8 * hd;                                                            \
                __m512 acc[16];                                                                                    \
                _Pragma("GCC unroll 16") for (int a = 0; a < 16; a++) acc[a] = _mm512_setzero_ps();                \
                for (int i = 0; i < hd; i += 16) {                                                                 \
                    __m512 a0 = cvt16(k0 + i), a1 = cvt16(k1 + i);                                                 \
                    _Pragma("GCC unroll 8") for (int g = 0; g < 8; g++) {                                          \
                        __m512 qv = _mm512_loadu_ps(q8 + (size_t)g * hd + i);                                      \
                        acc[g] = _mm512_fmadd_ps(a0, qv, acc[g]);                                                  \
                        acc[8 + g] = _mm512_fmadd_ps(a1, qv, acc[8 + g]);                                          \
                    }                                                                                              \
                }                                                                                                  \
                __m512 s = ks_avx512_reduce16(acc); /* lanes 0-7: row t, 8-15: row t + 1 */                      \
                _mm256_storeu_ps(sc + (size_t)t * (GP) + g8, _mm512_castps512_ps256(s));                           \
                if (t + 1 < b->n) _mm256_storeu_ps(sc + (size_t)(t + 1) * (GP) + g8, _mm512_extractf32x8_ps(s, 1)); \
            }                                                                                                      \
        }                                                                                                          \
    }
WIDE_SCORES_FN(wide_scores_8, 8)
WIDE_SCORES_FN(wide_scores_16, 16)

/* acc_mem [GP][hd] = acc_mem * alpha[head] + sum_t p[t][head] v_t over the
 * block's rows (p: [t][16]). */
#define WIDE_VALUES_FN(NAME, GP)                                                                                     \
    WTGT __attribute__((noinline)) static void NAME(const wide_block *b, int hd, const float *p, const float *alpha, \
                                                    float *acc_mem) {                                                \
        enum { CW = 16 / (GP) * 1 }; /* zmm per head per slice */                                                    \
        for (int x = 0; x < hd; x += 16 * CW) {                                                                      \
            __m512 acc[GP][CW];                                                                                      \
            _Pragma("GCC unroll 16") for (int g = 0; g < (GP); g++) {                                                \
                __m512 al = _mm512_set1_ps(alpha[g]);                                                                \
                _Pragma("GCC unroll 2") for (int c = 0; c < CW; c++)                                                 \
                    acc[g][c] = _mm512_mul_ps(_mm512_load_ps(acc_mem + (size_t)g * hd + x + 16 * c), al);            \
            }                                                                                                        \
            for (int t = 0; t < b->n; t++) {                                                                         \
                __m512 v[CW];                                                                                        \
                _Pragma("GCC unroll 2") for (int c = 0; c < CW; c++) v[c] = cvt16(b->v[t] + x + 16 * c);              \
                _Pragma("GCC unroll 16") for (int g = 0; g < (GP); g++) {                                            \
                    __m512 pb = _mm512_set1_ps(p[t * WIDE_HEADS + g]);                                               \
                    _Pragma("GCC unroll 2") for (int c = 0; c < CW; c++) acc[g][c] = _mm512_fmadd_ps(pb, v[c], acc[g][c]); \
                }                                                                                                    \
            }                                                                                                        \
            _Pragma("GCC unroll 16") for (int g = 0; g < (GP); g++)                                                  \
                _Pragma("GCC unroll 2") for (int c = 0; c < CW; c++)                                                 \
                    _mm512_store_ps(acc_mem + (size_t)g * hd + x + 16 * c, acc[g][c]);                               \
        }                                                                                                            \
    }
WIDE_VALUES_FN(wide_values_8, 8)
WIDE_VALUES_FN(wide_values_16, 16)

/* Heads g0 .. g0 + ng - 1 (ng <= 16) in one pass over the segments. */
WTGT static void wide_pass(const ks_kv_seg *segs, int nseg, int total, int hd, int G, int g0, int ng, const float *q,
                           float scale, float *scores, float *out, bool want_probs, const float *sinks, float *qs,
                           float *acc_mem) {
    const int GP = ng <= 8 ? 8 : 16;
    const size_t rb = (size_t)hd * 2;
    for (int g = 0; g < GP; g++)
        for (int i = 0; i < hd; i++) qs[(size_t)g * hd + i] = g < ng ? q[(size_t)(g0 + g) * hd + i] * scale : 0.0f;
    memset(acc_mem, 0, sizeof(float) * (size_t)GP * hd);
    const __mmask16 live = (__mmask16)((1u << ng) - 1), lanes = GP == 8 ? 0xFF : 0xFFFF;
    float s_blk[WB_MAX * WIDE_HEADS] __attribute__((aligned(64)));
    float p_blk[WB_MAX * WIDE_HEADS] __attribute__((aligned(64)));
    float al[WIDE_HEADS] __attribute__((aligned(64)));
    wide_block blk[2];
    __m512 run_max = _mm512_set1_ps(-INFINITY), run_sum = _mm512_setzero_ps(); /* lane = head */
    int si = 0, sj = 0, cur = 0, done = 0;
    int n = wide_next(segs, nseg, rb, &si, &sj, &blk[0]);
    while (n > 0) {
        const int nx = cur ^ 1;
        int nn = wide_next(segs, nseg, rb, &si, &sj, &blk[nx]);
        if (GP == 8) wide_scores_8(&blk[cur], &blk[nx], hd, rb, qs, s_blk);
        else wide_scores_16(&blk[cur], &blk[nx], hd, rb, qs, s_blk);
        __m512 bm = run_max;
        for (int t = 0; t < n; t++) bm = _mm512_max_ps(bm, _mm512_maskz_loadu_ps(lanes, s_blk + (size_t)t * GP));
        __m512 alpha = ks_avx512_exp_neg(_mm512_sub_ps(run_max, bm)); /* exp(-inf) clamps to ~1e-38: 0 * it = 0 */
        run_max = bm;
        __m512 psum = _mm512_setzero_ps();
        for (int t = 0; t < n; t++) {
            __m512 s = _mm512_maskz_loadu_ps(lanes, s_blk + (size_t)t * GP);
            if (want_probs) _mm512_mask_storeu_ps(scores + (size_t)(done + t) * G + g0, live, s);
            __m512 e = ks_avx512_exp_neg(_mm512_sub_ps(s, run_max));
            _mm512_store_ps(p_blk + (size_t)t * WIDE_HEADS, e);
            psum = _mm512_add_ps(psum, e);
        }
        run_sum = _mm512_fmadd_ps(run_sum, alpha, psum);
        _mm512_store_ps(al, alpha);
        if (GP == 8) wide_values_8(&blk[cur], hd, p_blk, al, acc_mem);
        else wide_values_16(&blk[cur], hd, p_blk, al, acc_mem);
        done += n;
        n = nn;
        cur = nx;
    }
    KS_ASSERT(done == total);
    float sums[WIDE_HEADS], mxs[WIDE_HEADS];
    _mm512_storeu_ps(sums, run_sum);
    _mm512_storeu_ps(mxs, run_max);
    if (sinks) /* the sink joins the denominator (attn.h) */
        for (int g = 0; g < ng; g++) sums[g] += expf(sinks[g0 + g] - mxs[g]);
    for (int g = 0; g < ng; g++) {
        __m512 inv = _mm512_set1_ps(1.0f / sums[g]);
        for (int i = 0; i < hd; i += 16)
            _mm512_storeu_ps(out + (size_t)(g0 + g) * hd + i, _mm512_mul_ps(_mm512_load_ps(acc_mem + (size_t)g * hd + i), inv));
    }
    if (want_probs) { /* raw scores -> probabilities */
        float iv[WIDE_HEADS];
        for (int g = 0; g < WIDE_HEADS; g++) iv[g] = g < ng ? 1.0f / sums[g] : 0.0f;
        __m512 inv = _mm512_loadu_ps(iv);
        for (int t = 0; t < total; t++) {
            float *row = scores + (size_t)t * G + g0;
            __m512 s = _mm512_maskz_loadu_ps(live, row);
            _mm512_mask_storeu_ps(row, live, _mm512_mul_ps(ks_avx512_exp_neg(_mm512_sub_ps(s, run_max)), inv));
        }
    }
}

bool ks_attention_segs_avx512_wide(ks_kv_type kt, const ks_kv_seg *segs, int nseg, int total, int hd, int G,
                                   const float *q, float *scores, float *out, float scale, float *weights,
                                   const float *sinks) {
    if (kt != KS_KV_F16 || G <= 4 || hd % 32 || hd > KS_ATTN_WIDE_MAX_HD) return false;
    /* 128 KiB of stack at the largest head: no allocation on the decode path, none to fail */
    float qs[WIDE_HEADS * KS_ATTN_WIDE_MAX_HD] __attribute__((aligned(64)));      /* [16][hd] scaled queries */
    float acc_mem[WIDE_HEADS * KS_ATTN_WIDE_MAX_HD] __attribute__((aligned(64))); /* [16][hd] running sums */
    for (int g0 = 0; g0 < G; g0 += WIDE_HEADS) {
        int ng = G - g0 < WIDE_HEADS ? G - g0 : WIDE_HEADS;
        wide_pass(segs, nseg, total, hd, G, g0, ng, q, scale, scores, out, weights != NULL, sinks, qs, acc_mem);
    }
    if (weights) /* scores [total][G] are probabilities: each row's sum over the heads */
        for (int t = 0; t < total; t++) {
            float w = 0;
            for (int g = 0; g < G; g++) w += scores[(size_t)t * G + g];
            weights[t] += w;
        }
    return true;
}

#else
bool ks_attention_segs_avx512_wide(ks_kv_type kt, const ks_kv_seg *segs, int nseg, int total, int hd, int G,
                                   const float *q, float *scores, float *out, float scale, float *weights,
                                   const float *sinks) {
    (void)kt, (void)segs, (void)nseg, (void)total, (void)hd, (void)G, (void)q, (void)scores, (void)out, (void)scale;
    (void)weights, (void)sinks;
    return false;
}
#endif
