/*
 * attn_block_avx2.c — the prefill block kernel on AVX2 + FMA + F16C: causal
 * attention of R consecutive query rows over one KV head's pages (f16 or
 * 8-bit rows), each page converted once into an f32 tile that every query
 * of the block uses (decode attention is attn_avx2.c).
 */
#include "attn/attn.h"

#include "core/core.h"

#include <string.h>

#if defined(__x86_64__)
#include "tensor/simd_avx2.h"
#include "attn/attn_avx2_lanes.h"

/* ------------------------------------------------ prefill, query blocks -- */
/* Causal attention of R consecutive query rows (G heads each) over one KV
 * head's pages, each page converted once into an f32 tile used by every
 * query of the block (see ks_attention_block_avx512).  Scores of one query
 * take eight tile rows at a time, reduced together by reduce8; values keep
 * four 8-float chunks of the output in registers across a page. */
/* a page's rows [L] as f32 into tile [L][hd] */
TGT static void block_tile(ks_kv_type kt, const void *rows, int L, int hd, float *tile) {
    size_t rb = ks_kv_row_bytes(kt, hd);
    for (int t = 0; t < L; t++) {
        const uint8_t *row = (const uint8_t *)rows + (size_t)t * rb;
        if (kt == KS_KV_F16)
            for (int i = 0; i < hd; i += 8) _mm256_storeu_ps(tile + (size_t)t * hd + i, load8(row, i, 0));
        else
            for (int i = 0; i < hd; i += 8) _mm256_storeu_ps(tile + (size_t)t * hd + i, load8(row, i, 1));
    }
}

TGT bool ks_attention_block_avx2(ks_kv_type kt, const ks_kv_seg *segs, int nseg, const int32_t *n_att, int R, int hd,
                                 int G, const float *q, size_t q_stride, float *out, size_t out_stride, float *S,
                                 float *tile, float scale) {
    if (hd % 8 || (kt != KS_KV_F16 && (kt != KS_KV_Q8 || hd % 32))) return false;
    int n_max = n_att[R - 1], RG = R * G;
    for (int si = 0, e0 = 0; si < nseg; e0 += segs[si].len, si++) {
        int L = segs[si].len;
        block_tile(kt, segs[si].K, L, hd, tile);
        for (int x = 0; x < RG; x++) {
            int r = x / G, g = x % G, lim = ks_attn_block_visible(n_att, G, x, e0, L);
            if (!lim) continue;
            const float *qq = q + (size_t)r * q_stride + (size_t)g * hd;
            float *srow = S + (size_t)x * n_max + e0;
            int t = 0;
            for (; t + 8 <= lim; t += 8) {
                __m256 acc[8];
                for (int a = 0; a < 8; a++) acc[a] = _mm256_setzero_ps();
                for (int i = 0; i < hd; i += 8) {
                    __m256 qv = _mm256_loadu_ps(qq + i);
                    for (int a = 0; a < 8; a++)
                        acc[a] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(tile + (size_t)(t + a) * hd + i), acc[a]);
                }
                _mm256_storeu_ps(srow + t, _mm256_mul_ps(ks_avx2_reduce8(acc), _mm256_set1_ps(scale)));
            }
            for (; t < lim; t++) {
                __m256 acc = _mm256_setzero_ps();
                for (int i = 0; i < hd; i += 8)
                    acc = _mm256_fmadd_ps(_mm256_loadu_ps(qq + i), _mm256_loadu_ps(tile + (size_t)t * hd + i), acc);
                __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
                h = _mm_hadd_ps(h, h);
                h = _mm_hadd_ps(h, h);
                srow[t] = _mm_cvtss_f32(h) * scale;
            }
        }
    }
    /* softmax per query over its visible entries */
    for (int x = 0; x < RG; x++) {
        int n = n_att[x / G];
        float inv[4];
        ks_attn2_softmax_lanes(S + (size_t)x * n_max, n, 1, inv);
        ks_attn2_normalize_lanes(S + (size_t)x * n_max, n, 1, inv);
        memset(out + (size_t)(x / G) * out_stride + (size_t)(x % G) * hd, 0, sizeof(float) * (size_t)hd);
    }
    for (int si = 0, e0 = 0; si < nseg; e0 += segs[si].len, si++) {
        int L = segs[si].len;
        block_tile(kt, segs[si].V, L, hd, tile);
        for (int x = 0; x < RG; x++) {
            int lim = ks_attn_block_visible(n_att, G, x, e0, L);
            if (!lim) continue;
            const float *p = S + (size_t)x * n_max + e0;
            float *o = out + (size_t)(x / G) * out_stride + (size_t)(x % G) * hd;
            int i = 0;
            for (; i + 32 <= hd; i += 32) {
                __m256 a0 = _mm256_loadu_ps(o + i), a1 = _mm256_loadu_ps(o + i + 8);
                __m256 a2 = _mm256_loadu_ps(o + i + 16), a3 = _mm256_loadu_ps(o + i + 24);
                for (int t = 0; t < lim; t++) {
                    __m256 pv = _mm256_broadcast_ss(p + t);
                    const float *v = tile + (size_t)t * hd + i;
                    a0 = _mm256_fmadd_ps(pv, _mm256_loadu_ps(v), a0);
                    a1 = _mm256_fmadd_ps(pv, _mm256_loadu_ps(v + 8), a1);
                    a2 = _mm256_fmadd_ps(pv, _mm256_loadu_ps(v + 16), a2);
                    a3 = _mm256_fmadd_ps(pv, _mm256_loadu_ps(v + 24), a3);
                }
                _mm256_storeu_ps(o + i, a0);
                _mm256_storeu_ps(o + i + 8, a1);
                _mm256_storeu_ps(o + i + 16, a2);
                _mm256_storeu_ps(o + i + 24, a3);
            }
            for (; i < hd; i += 8) {
                __m256 a = _mm256_loadu_ps(o + i);
                for (int t = 0; t < lim; t++)
                    a = _mm256_fmadd_ps(_mm256_broadcast_ss(p + t), _mm256_loadu_ps(tile + (size_t)t * hd + i), a);
                _mm256_storeu_ps(o + i, a);
            }
        }
    }
    return true;
}
#else
bool ks_attention_block_avx2(ks_kv_type kt, const ks_kv_seg *segs, int nseg, const int32_t *n_att, int R, int hd,
                             int G, const float *q, size_t q_stride, float *out, size_t out_stride, float *S,
                             float *tile, float scale) {
    (void)kt, (void)segs, (void)nseg, (void)n_att, (void)R, (void)hd, (void)G, (void)q, (void)q_stride, (void)out;
    (void)out_stride, (void)S, (void)tile, (void)scale;
    return false;
}
#endif
