/*
 * attn_block_avx512.c — the prefill block kernel on AVX-512: causal
 * attention of R consecutive query rows over one KV head's f16 pages, each
 * page converted once into an f32 tile that every query of the block uses
 * (decode attention, which streams the cache once per query, is
 * attn_avx512.c).
 */
#include "attn/attn.h"

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
 *   S: [R*G][n_att[R-1]] scores scratch; tile: [max page len + 16][hd] f32
 *
 * Sixteen keys at a time, and the same bits as one key at a time.  A score
 * is defined as the one-key kernel computes it: 16 lanes, lane j summing
 * q[j + 16i] k[j + 16i] over i (a multiply, then FMAs in i order), then
 * _mm512_reduce_add_ps's fixed tree (lanes j and j+8, then j and j+4, then
 * j and j+2, then 0 and 1), times the scale.  That costs a horizontal
 * reduction per key.  The K page is instead transposed into the tile
 * ([hd][keys], each key a lane), so sixteen registers A_j hold lane j of
 * sixteen keys' sums, built by the same multiply and FMAs with q[j + 16i]
 * broadcast, and the reduction tree becomes fifteen vertical adds over the
 * A_j in the same order: per key the identical IEEE operations on identical
 * operands, with no horizontal work (-std=c11 keeps FMA contraction off, so
 * the compiler fuses nothing either way).  Scores therefore do not depend on
 * the block, chunk or page boundaries any more than before.
 * Values: each lane of an output runs its FMA chain over the keys in order,
 * as before; the hd/16 chains of a query, and two queries, are interleaved
 * so that the FMA latency is hidden instead of paid per key. */
/* a page's f16 rows [L][hd] as f32 into tile [L][hd] */
INL void tile_f16(const uint16_t *rows, int L, int hd, float *tile) {
    for (int t = 0; t < L; t++)
        for (int i = 0; i < hd / 16; i++)
            _mm512_storeu_ps(tile + (size_t)t * hd + 16 * i,
                             _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rows + (size_t)t * hd + 16 * i))));
}

/* a page's f16 rows [L][hd] as f32 into kt [hd][Lp] (Lp = L rounded up to
 * 16; keys past L are zero) */
INL void tile_f16_t(const uint16_t *rows, int L, int Lp, int hd, float *kt) {
    for (int t0 = 0; t0 < Lp; t0 += 16) {
        float blk[16][16] __attribute__((aligned(64)));
        for (int i0 = 0; i0 < hd; i0 += 16) {
            for (int t = 0; t < 16; t++)
                _mm512_store_ps(blk[t], t0 + t < L ? _mm512_cvtph_ps(_mm256_loadu_si256(
                                                         (const __m256i *)(rows + (size_t)(t0 + t) * hd + i0)))
                                                   : _mm512_setzero_ps());
            for (int i = 0; i < 16; i++) {
                const __m512i idx = _mm512_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208,
                                                      224, 240);
                _mm512_storeu_ps(kt + (size_t)(i0 + i) * Lp + t0,
                                 _mm512_i32gather_ps(_mm512_add_epi32(idx, _mm512_set1_epi32(i)), &blk[0][0], 4));
            }
        }
    }
}

/* Scores of sixteen keys (kt + t: [hd][Lp]) against N queries qq[x] (N <=
 * SCORE_NQ, a compile-time constant at each call): the one-key kernel's
 * arithmetic, per lane (see above): A_j = q[j] k[j], then FMAs over i in
 * order, then the reduction tree.  One K vector serves the N queries (1 + N
 * loads for N FMAs, where a query alone needs two loads an FMA and runs at
 * half the FMA rate), and the N chains of one j hide the FMA latency.  The
 * 16 A_j of each query wait in memory for the tree; the order of the
 * operations inside each A_j is the same for any N, so a query's scores do
 * not depend on its neighbours. */
enum { SCORE_NQ = 8 };
INL void scores16_n(const float *const qq[SCORE_NQ], const float *kt, int Lp, int hv, float scale,
                    __m512 sc[SCORE_NQ], const int N) {
    __m512 A[SCORE_NQ][16];
    for (int j = 0; j < 16; j++) {
        __m512 acc[SCORE_NQ];
        const __m512 k0 = _mm512_loadu_ps(kt + (size_t)j * Lp);
        _Pragma("GCC unroll 8") for (int x = 0; x < N; x++) acc[x] = _mm512_mul_ps(_mm512_set1_ps(qq[x][j]), k0);
        for (int i = 1; i < hv; i++) {
            const __m512 k = _mm512_loadu_ps(kt + (size_t)(j + 16 * i) * Lp);
            _Pragma("GCC unroll 8") for (int x = 0; x < N; x++) acc[x] =
                _mm512_fmadd_ps(_mm512_set1_ps(qq[x][j + 16 * i]), k, acc[x]);
        }
        _Pragma("GCC unroll 8") for (int x = 0; x < N; x++) A[x][j] = acc[x];
    }
    _Pragma("GCC unroll 8") for (int x = 0; x < N; x++) {
        __m512 T3[8], T6[4];
        _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) T3[j] = _mm512_add_ps(A[x][j + 8], A[x][j]);
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) T6[j] = _mm512_add_ps(T3[j + 4], T3[j]);
        __m512 T80 = _mm512_add_ps(T6[0], T6[2]), T81 = _mm512_add_ps(T6[1], T6[3]);
        sc[x] = _mm512_mul_ps(_mm512_add_ps(T80, T81), _mm512_set1_ps(scale));
    }
}

/* The visible scores of queries [x0, x0 + N) of the block, which all see lim
 * keys of this page, into their rows of S. */
INL void scores_rows_n(const float *const qq[SCORE_NQ], float *const srow[SCORE_NQ], const float *tile, int Lp, int hv,
                       float scale, int lim, const int N) {
    for (int t = 0; t < lim; t += 16) {
        __m512 sc[SCORE_NQ];
        scores16_n(qq, tile + t, Lp, hv, scale, sc, N);
        _Pragma("GCC unroll 8") for (int x = 0; x < N; x++) {
            if (t + 16 <= lim) _mm512_storeu_ps(srow[x] + t, sc[x]);
            else _mm512_mask_storeu_ps(srow[x] + t, (__mmask16)((1u << (lim - t)) - 1), sc[x]);
        }
    }
}

TGT static void scores_rows(const float *const qq[SCORE_NQ], float *const srow[SCORE_NQ], const float *tile, int Lp,
                            int hv, float scale, int lim, int N) {
    switch (N) {
    case 8: scores_rows_n(qq, srow, tile, Lp, hv, scale, lim, 8); break;
    case 7: scores_rows_n(qq, srow, tile, Lp, hv, scale, lim, 7); break;
    case 6: scores_rows_n(qq, srow, tile, Lp, hv, scale, lim, 6); break;
    case 5: scores_rows_n(qq, srow, tile, Lp, hv, scale, lim, 5); break;
    case 4: scores_rows_n(qq, srow, tile, Lp, hv, scale, lim, 4); break;
    case 3: scores_rows_n(qq, srow, tile, Lp, hv, scale, lim, 3); break;
    case 2: scores_rows_n(qq, srow, tile, Lp, hv, scale, lim, 2); break;
    default: scores_rows_n(qq, srow, tile, Lp, hv, scale, lim, 1); break;
    }
}

/* o[0..hd) += sum over t < lim of p[t] * tile[t] (each lane in t order), for
 * NQ (1 or 2) queries sharing the tile rows; hv = hd / 16 (4 or 8). */
INL void values_acc(const float *const p[2], float *const o[2], const float *tile, int lim, int hd, int hv,
                    const int NQ) {
    if (hv % 4) { /* head dims not a multiple of 64: one chain at a time, the same arithmetic */
        for (int x = 0; x < NQ; x++)
            for (int i = 0; i < hv; i++) {
                __m512 acc = _mm512_loadu_ps(o[x] + 16 * i);
                for (int t = 0; t < lim; t++)
                    acc = _mm512_fmadd_ps(_mm512_set1_ps(p[x][t]), _mm512_loadu_ps(tile + (size_t)t * hd + 16 * i), acc);
                _mm512_storeu_ps(o[x] + 16 * i, acc);
            }
        return;
    }
    for (int i0 = 0; i0 < hv; i0 += 4) { /* four chains per query at a time */
        __m512 acc[2][4];
        _Pragma("GCC unroll 2") for (int x = 0; x < NQ; x++)
            _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) acc[x][i] = _mm512_loadu_ps(o[x] + 16 * (i0 + i));
        for (int t = 0; t < lim; t++) {
            const float *v = tile + (size_t)t * hd + 16 * i0;
            _Pragma("GCC unroll 2") for (int x = 0; x < NQ; x++) {
                const __m512 pt = _mm512_set1_ps(p[x][t]);
                _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) acc[x][i] =
                    _mm512_fmadd_ps(pt, _mm512_loadu_ps(v + 16 * i), acc[x][i]);
            }
        }
        _Pragma("GCC unroll 2") for (int x = 0; x < NQ; x++)
            _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) _mm512_storeu_ps(o[x] + 16 * (i0 + i), acc[x][i]);
    }
}

TGT bool ks_attention_block_avx512(const ks_kv_seg16 *segs, int nseg, const int32_t *n_att, int R, int hd, int G,
                                   const float *q, size_t q_stride, float *out, size_t out_stride, float *S,
                                   float *tile, float scale) {
    if (hd % 16) return false;
    int n_max = n_att[R - 1], RG = R * G, hv = hd / 16;
    /* scores, page by page */
    for (int si = 0, e0 = 0; si < nseg; e0 += segs[si].len, si++) {
        int L = segs[si].len, Lp = (L + 15) & ~15;
        tile_f16_t(segs[si].K, L, Lp, hd, tile);
        for (int x0 = 0, x1; x0 < RG; x0 = x1) { /* runs of up to SCORE_NQ queries that see the same keys */
            const int lim = ks_attn_block_visible(n_att, G, x0, e0, L);
            const float *qq[SCORE_NQ];
            float *srow[SCORE_NQ];
            for (x1 = x0; x1 < RG && x1 - x0 < SCORE_NQ && ks_attn_block_visible(n_att, G, x1, e0, L) == lim; x1++) {
                qq[x1 - x0] = q + (size_t)(x1 / G) * q_stride + (size_t)(x1 % G) * hd;
                srow[x1 - x0] = S + (size_t)x1 * n_max + e0;
            }
            if (lim) scores_rows(qq, srow, tile, Lp, hv, scale, lim, x1 - x0);
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
        for (int x = 0; x < RG; x += 2) {
            int lim0 = ks_attn_block_visible(n_att, G, x, e0, L);
            int lim1 = x + 1 < RG ? ks_attn_block_visible(n_att, G, x + 1, e0, L) : -1;
            const float *p[2] = {S + (size_t)x * n_max + e0, S + (size_t)(x + 1) * n_max + e0};
            float *o[2] = {out + (size_t)(x / G) * out_stride + (size_t)(x % G) * hd,
                           out + (size_t)((x + 1) / G) * out_stride + (size_t)((x + 1) % G) * hd};
            if (lim0 == lim1) {
                if (lim0) values_acc(p, o, tile, lim0, hd, hv, 2);
                continue;
            }
            for (int k = 0; k < 2; k++) {
                int lim = k ? lim1 : lim0;
                if (lim <= 0) continue;
                const float *pk[2] = {p[k], p[k]};
                float *ok[2] = {o[k], o[k]};
                values_acc(pk, ok, tile, lim, hd, hv, 1);
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
