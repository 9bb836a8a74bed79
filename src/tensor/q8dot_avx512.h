/*
 * q8dot_avx512.h — scores of Q8_0 rows (the 8-bit KV cache's, and
 * SpeContext's retrieval-head K cache with kcache=q8_0) against up to four
 * f32 query heads, on AVX-512 VNNI integer units.
 *
 * The queries are quantised once per call into the same Q8_0 blocks as the
 * keys (ks_quantize_query_q8), so that a row's dot product is vpdpbusd over
 * its bytes, scaled per block by d_k * d_q: one vpdpbusd does 64
 * multiply-adds where an f32 FMA over dequantised keys does 16, and 8-bit
 * keys turn a memory-bound scan compute-bound otherwise (the f16 kernels'
 * conversions plus a scale per chunk).  Header-only and always inline, like
 * simd_avx512.h: decode attention (attn/attn_avx512.c) and spec's scoring
 * (select/spec_score.c) compile it inside their own target functions.
 */
#ifndef KS_Q8DOT_AVX512_H
#define KS_Q8DOT_AVX512_H

#if defined(__x86_64__)
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "tensor/dtype.h" /* ks_quantize_query_q8 */

#define KS_Q8DOT_INL \
    static inline __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c"), always_inline))

/* Four heads' scaled queries (hd 64 or 128) quantised once per call. */
typedef struct ks_q8_query {
    uint8_t qu[4][128] __attribute__((aligned(64))); /* [head][hd] q + 128 (vpdpbusd's unsigned side) */
    int8_t qi[4][128] __attribute__((aligned(64)));  /* [head][hd] q (ks_q8_score16_heads' signed side) */
    float dq[2][16] __attribute__((aligned(64)));    /* [zmm chunk c][lane]: dq(head lane % 4, block 2c + lane / 4 % 2) */
    float dqb[4][4];                                 /* [head][block] dq */
    int32_t corr[4][4];                              /* [head][block] -128 * sum of the block's qi */
} ks_q8_query;

/* Heads g0 .. g0 + ng - 1 of q [*][hd] times scale, quantised into qz
 * (heads past ng are zero).  hd 64 or 128. */
static inline void ks_q8_query_init(const float *q, int hd, int g0, int ng, float scale, ks_q8_query *qz) {
    float qs[128], d[4][4];
    for (int g = 0; g < 4; g++) {
        for (int i = 0; i < hd; i++) qs[i] = g < ng ? q[(size_t)(g0 + g) * hd + i] * scale : 0.0f;
        ks_quantize_query_q8(qs, hd, qz->qi[g], qz->qu[g], d[g]);
        for (int b = 0; b < hd / 32; b++) {
            int32_t sum = 0;
            for (int i = 0; i < 32; i++) sum += qz->qi[g][32 * b + i];
            qz->corr[g][b] = -128 * sum;
            qz->dqb[g][b] = d[g][b];
        }
    }
    for (int c = 0; c < hd / 64; c++)
        for (int l = 0; l < 16; l++) qz->dq[c][l] = d[l % 4][2 * c + (l / 4) % 2];
}

/* r[i] lane j = the input r[j]'s dword i: a 16 x 16 transpose of dwords
 * (unpacks by 32 and 64 bits, then 128-bit lanes), 64 shuffles. */
KS_Q8DOT_INL void ks_q8_transpose16_epi32(__m512i r[16]) {
    __m512i t[16], u[16];
    _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) {
        t[2 * k] = _mm512_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
    }
    _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) { /* u[4q + m] lane L: rows 4q..4q+3 of dword 4L + m */
        u[4 * q] = _mm512_unpacklo_epi64(t[4 * q], t[4 * q + 2]);
        u[4 * q + 1] = _mm512_unpackhi_epi64(t[4 * q], t[4 * q + 2]);
        u[4 * q + 2] = _mm512_unpacklo_epi64(t[4 * q + 1], t[4 * q + 3]);
        u[4 * q + 3] = _mm512_unpackhi_epi64(t[4 * q + 1], t[4 * q + 3]);
    }
    _Pragma("GCC unroll 4") for (int m = 0; m < 4; m++) {
        __m512i a = _mm512_shuffle_i32x4(u[m], u[4 + m], 0x44), b = _mm512_shuffle_i32x4(u[m], u[4 + m], 0xEE);
        __m512i c = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0x44), d = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0xEE);
        r[m] = _mm512_shuffle_i32x4(a, c, 0x88);
        r[4 + m] = _mm512_shuffle_i32x4(a, c, 0xDD);
        r[8 + m] = _mm512_shuffle_i32x4(b, d, 0x88);
        r[12 + m] = _mm512_shuffle_i32x4(b, d, 0xDD);
    }
}

/* Scores of sixteen Q8_0 rows (kp: their starts, rows of NZ x 64 values)
 * against the four heads of qz, f[head] lane r = row r.
 * Transposed, so that no horizontal sums are needed: the rows' 4-byte
 * groups are transposed (lane = row), and vpdpbusd against the head's query
 * dword broadcast from memory sums each row's dot product in its own lane.
 * vpdpbusd takes u8 x s8: the rows are flipped to u8 (k + 128, one xor) and
 * the query is the signed side, the 128 * sum(q) this adds taken off by
 * starting each (head, block) sum from its negation (corr).  Per 16 rows and
 * 64 bytes: 16 xors, 64 shuffles and 64 vpdpbusd, against q8_score4's ~90
 * instructions per 4 rows. */
KS_Q8DOT_INL void ks_q8_score16_heads(const uint16_t *const *kp, const ks_q8_query *qz, const int NZ, __m512 f[4]) {
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    _Pragma("GCC unroll 2") for (int c = 0; c < NZ; c++) {
        uint16_t hk[2][16] __attribute__((aligned(32))); /* [block][row] f16 K scales */
        __m512i r[16];
        _Pragma("GCC unroll 16") for (int j = 0; j < 16; j++) {
            const uint8_t *row = (const uint8_t *)kp[j] + 68 * (size_t)c;
            memcpy(&hk[0][j], row, 2);
            memcpy(&hk[1][j], row + 34, 2);
            r[j] = _mm512_xor_si512(
                _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(row + 2))),
                                   _mm256_loadu_si256((const __m256i *)(row + 36)), 1),
                flip);
        }
        ks_q8_transpose16_epi32(r);
        const __m512 dk0 = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)hk[0]));
        const __m512 dk1 = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)hk[1]));
        _Pragma("GCC unroll 4") for (int g = 0; g < 4; g++) {
            const int32_t *qd = (const int32_t *)(qz->qi[g] + 64 * c);
            __m512i a0 = _mm512_set1_epi32(qz->corr[g][2 * c]), a1 = _mm512_set1_epi32(qz->corr[g][2 * c + 1]);
            _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {
                a0 = _mm512_dpbusd_epi32(a0, r[i], _mm512_set1_epi32(qd[i]));
                a1 = _mm512_dpbusd_epi32(a1, r[8 + i], _mm512_set1_epi32(qd[8 + i]));
            }
            __m512 s = _mm512_mul_ps(_mm512_cvtepi32_ps(a0), _mm512_mul_ps(dk0, _mm512_set1_ps(qz->dqb[g][2 * c])));
            s = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a1), _mm512_mul_ps(dk1, _mm512_set1_ps(qz->dqb[g][2 * c + 1])), s);
            f[g] = c ? _mm512_add_ps(f[g], s) : s;
        }
    }
}
#endif
#endif
