/*
 * topk_parts.h — the pieces of ks_topk_scratch's sampled radix select
 * (topk.c), for a caller that computes the values it ranks on the fly and
 * would rather not write them out first (SpeContext's group weights,
 * spec_score.c).  Used as topk_sampled uses them, they give exactly its set
 * and order.
 */
#ifndef KS_POLICY_TOPK_PARTS_H
#define KS_POLICY_TOPK_PARTS_H

#include <stdint.h>

/* x as an unsigned key whose order is ks_topk's (NaN as -inf, -0 as +0). */
uint32_t ks_topk_key(float x);
/* The k-th largest key of x[0..n) (1-based k), *ties as topk.c's
 * kth_largest_key; tmp [n]. */
uint32_t ks_topk_kth_key(const float *x, int32_t n, int32_t k, uint32_t *tmp, int32_t *ties);
/* Every pos[i] of x[0..n) whose key is above th, and the first `ties` equal
 * to it, in order; returns how many.  room: idx's capacity (at least the
 * count written; the AVX2 path stores whole vectors where they fit). */
int32_t ks_topk_emit(const float *x, const int32_t *pos, int32_t n, uint32_t th, int32_t ties, int32_t *idx,
                     int32_t room);
/* topk_sampled's sample size and rank for k of n: the sample is x[8 i] for
 * i < *m, its *want-th largest key the filter's threshold; 0 when the
 * sampled path does not apply (ks_topk_scratch then ranks all of x). */
int ks_topk_sample_plan(int32_t n, int32_t k, int32_t *m, int32_t *want);

#if defined(__x86_64__)
#include <immintrin.h>
#include <math.h>
/* ks_topk_key of 16 floats at once, for AVX-512 callers. */
static inline __attribute__((target("avx512f"), always_inline)) __m512i ks_topk_key16(__m512 v) {
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    __m512 f = _mm512_add_ps(_mm512_mask_blend_ps(nan, v, _mm512_set1_ps(-INFINITY)), _mm512_setzero_ps());
    __m512i b = _mm512_castps_si512(f);
    return _mm512_xor_si512(b, _mm512_or_si512(_mm512_srai_epi32(b, 31), _mm512_set1_epi32((int32_t)0x80000000)));
}
#endif

#if defined(__x86_64__)
/* AVX2 has no compress-store: a mask's set lanes are packed to the front by
 * a permutation whose lane indices are byte j of ks_topk_pack8_lanes[mask]
 * (the j-th set bit), widened by ks_topk_pack8. */
extern const uint64_t ks_topk_pack8_lanes[256];
/* ks_topk_key of 8 floats, as signed ints (the key ^ 0x80000000, so that
 * AVX2's signed compares give the keys' unsigned order). */
static inline __attribute__((target("avx2"), always_inline)) __m256i ks_topk_skey8(__m256 v) {
    __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    __m256 f = _mm256_add_ps(_mm256_blendv_ps(v, _mm256_set1_ps(-INFINITY), nan), _mm256_setzero_ps());
    __m256i b = _mm256_castps_si256(f);
    return _mm256_xor_si256(b, _mm256_srli_epi32(_mm256_srai_epi32(b, 31), 1));
}
static inline __attribute__((target("avx2"), always_inline)) __m256i ks_topk_pack8(unsigned mask) {
    return _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)ks_topk_pack8_lanes[mask]));
}
#endif

#endif
