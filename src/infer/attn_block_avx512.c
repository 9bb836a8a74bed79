/*
 * attn_block_avx512.c — the prefill block kernel on AVX-512: causal
 * attention of R consecutive query rows over one KV head's f16 pages, each
 * page converted once into an f32 tile that every query of the block uses
 * (decode attention, which streams the cache once per query, is
 * attn_avx512.c).
 */
#include "infer/attn.h"

#include "core/core.h"

#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

#include "tensor/simd_avx512.h"

#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))
#define INL static inline __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c"), always_inline))
#endif

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
