/*
 * attn_avx2_lanes.h — what the AVX2 decode kernel (attn_avx2.c) and the AVX2
 * prefill block kernel (attn_block_avx2.c) share: the target attributes, a
 * row's eight elements as f32 (f16 or Q8_0), and the softmax over the
 * interleaved head lanes of a score array.  Internal to src/infer; include
 * only inside `#if defined(__x86_64__)`.
 */
#ifndef KS_ATTN_AVX2_LANES_H
#define KS_ATTN_AVX2_LANES_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define TGT __attribute__((target("avx2,fma,f16c")))
#define INL static inline __attribute__((target("avx2,fma,f16c"), always_inline))

/* Every lane gets op over the lanes of the same head (lane mod ng). */
#define FOLD_LANES(v, ng, OP)                                                              \
    do {                                                                                   \
        if ((ng) <= 4) v = OP(v, _mm256_permute2f128_ps(v, v, 0x01));                      \
        if ((ng) <= 2) v = OP(v, _mm256_permute_ps(v, _MM_SHUFFLE(1, 0, 3, 2)));           \
        if ((ng) <= 1) v = OP(v, _mm256_permute_ps(v, _MM_SHUFFLE(2, 3, 0, 1)));           \
    } while (0)

/* Eight elements i..i+7 of a row as f32.  KT 0: f16; KT 1: Q8_0 blocks
 * (34 bytes: f16 scale, 32 int8), where 8 | 32 keeps a chunk in one block;
 * int8 -> f32 is exact and the scale multiply is the one rounding the
 * portable dequantizer also does. */
INL __m256 load8(const uint8_t *row, int i, const int KT) {
    if (KT == 0) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 2 * (size_t)i)));
    const uint8_t *blk = row + (size_t)(i >> 5) * 34;
    uint16_t h;
    memcpy(&h, blk, 2);
    __m256 d = _mm256_set1_ps(_cvtsh_ss(h));
    __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 2 + (i & 31))));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(q), d);
}

/* Softmax numerators over t of each head lane of scores[len][ng] (ng in 1,
 * 2, 4): exp(s - max) in place; inv[g] = 1 / sum for head g. */
void ks_attn2_softmax_lanes(float *scores, int len, int ng, float inv[4]);
/* Probabilities in place (only when the caller wants them). */
void ks_attn2_normalize_lanes(float *scores, int len, int ng, const float inv[4]);

#endif
