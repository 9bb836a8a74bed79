/*
 * topk.c — the partial selection every selector shares: the k best of n
 * scores, ties to the lower index, NaN as -inf.  A heap for small inputs; a
 * radix select from a few hundred entries up (digits as wide as the input
 * fills), which for k far below n first keeps the few candidates above a
 * threshold read off every 8th entry.  Every path returns the same set.
 * The sampled path's pieces are exported (topk_parts.h) for a caller that
 * makes its values on the fly (spec's group weights).
 */
#include "policy/policy.h"
#include "policy/topk_parts.h"
#include "policy/policy_util.h"
#include "core/simd.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#include "tensor/simd_avx2.h"
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif
/* The heap's order: the better of (value, index) pairs. */
static bool better(float a, int32_t ia, float b, int32_t ib) { return a > b || (a == b && ia < ib); }

/* x as an unsigned key whose order is the float order (NaN as -inf, -0 as
 * +0, so equal keys are exactly the ties of the float comparison). */
static inline uint32_t topk_key(float x) {
    x = x != x ? -INFINITY : x + 0.0f;
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    return b ^ (b >> 31 ? 0xFFFFFFFFu : 0x80000000u);
}

/* The k-th largest key of x[0..n) (1-based k) and how many entries equal
 * to it the top k take (*ties), by a radix select: a histogram of the top w
 * bits over all of x, the keys of the bucket the k-th falls in gathered into
 * tmp, then w more bits at a time over those.  Two branch-light passes over
 * x where a quickselect partitions random data with a mispredicted branch
 * per element (the top-k of SpeContext's 32K-token selections, per KV head). */
static uint32_t kth_largest_key(const float *x, int32_t n, int32_t k, uint32_t *tmp, int32_t *ties) {
    /* digits as wide as the entries can fill: a level costs a pass over its
     * candidates plus clearing and walking 2^w buckets, which at a few
     * hundred entries would outweigh the pass with 11-bit digits */
    const int w = n <= 512 ? 6 : n <= 8192 ? 8 : 11;
    uint32_t hist[2048];
    int shift = 32 - w;
    uint32_t mask = (1u << w) - 1u;
    memset(hist, 0, sizeof(uint32_t) << w);
    for (int32_t i = 0; i < n; i++) hist[topk_key(x[i]) >> shift]++;
    int32_t need = k, b = (int32_t)mask;
    while ((int32_t)hist[b] < need) need -= (int32_t)hist[b--];
    int32_t c = 0;
    for (int32_t i = 0; i < n; i++) {
        uint32_t u = topk_key(x[i]);
        tmp[c] = u;
        c += (int32_t)(u >> shift) == b;
    }
    uint32_t prefix = (uint32_t)b << shift;
    while (shift > 0) { /* the candidates share the bits above shift */
        int bits = shift < w ? shift : w;
        shift -= bits;
        mask = (1u << bits) - 1u;
        memset(hist, 0, sizeof(uint32_t) << bits);
        for (int32_t i = 0; i < c; i++) hist[tmp[i] >> shift & mask]++;
        b = (int32_t)mask;
        while ((int32_t)hist[b] < need) need -= (int32_t)hist[b--];
        prefix |= (uint32_t)b << shift;
        int32_t m = 0;
        for (int32_t i = 0; i < c; i++) {
            tmp[m] = tmp[i];
            m += (int32_t)(tmp[i] >> shift & mask) == b;
        }
        c = m;
    }
    *ties = need; /* the k-th and the equal keys above it in index order */
    return prefix;
}

/* The radix select's final pass: every index of x[0..n) whose key is above
 * the k-th largest and, among the keys equal to it, the first `ties`, in
 * index order (pos[i] is x[i]'s index in the caller's array). */
#if defined(__x86_64__)
static int32_t topk_emit_avx512(const float *x, const int32_t *pos, int32_t n, uint32_t th, int32_t *ties, int32_t *idx,
                                int32_t *done);
static int32_t topk_emit_avx2(const float *x, const int32_t *pos, int32_t n, uint32_t th, int32_t *ties, int32_t *idx,
                              int32_t room, int32_t *done);
#elif defined(__aarch64__)
static int32_t topk_emit_neon(const float *x, const int32_t *pos, int32_t n, uint32_t th, int32_t *ties, int32_t *idx,
                              int32_t *done);
#endif
static int32_t topk_emit(const float *x, const int32_t *pos, int32_t n, uint32_t th, int32_t ties, int32_t *idx,
                         int32_t room) {
    int32_t m = 0, i = 0;
    (void)room;
#if defined(__x86_64__)
    ks_simd_level lv = ks_simd_current();
    if (lv >= KS_SIMD_AVX512) m = topk_emit_avx512(x, pos, n, th, &ties, idx, &i);
    else if (lv == KS_SIMD_AVX2) m = topk_emit_avx2(x, pos, n, th, &ties, idx, room, &i);
#elif defined(__aarch64__)
    if (ks_simd_current() >= KS_SIMD_NEON) m = topk_emit_neon(x, pos, n, th, &ties, idx, &i);
#endif
    for (; i < n; i++) {
        uint32_t u = topk_key(x[i]);
        if (u >= th && (u > th || ties-- > 0)) idx[m++] = pos ? pos[i] : i;
    }
    return m;
}

#if defined(__x86_64__)
/* topk_sampled's filter, 16 entries a step: the keys (NaN as -inf, -0 as
 * +0, topk_key's order) compared with t, the passing values and their
 * indices compress-stored in index order.  Returns the candidates found in
 * x[0..*done) (*done: the multiple of 16 it stopped at), or -1 past cap. */
__attribute__((target("avx512f"))) static int32_t topk_filter_avx512(const float *x, int32_t n, uint32_t t,
                                                                       float *cand, int32_t *pos, int32_t cap,
                                                                       int32_t *done) {
    const __m512i tv = _mm512_set1_epi32((int32_t)t);
    const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    int32_t c = 0, i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        __m512i key = ks_topk_key16(v);
        __mmask16 keep = _mm512_cmp_epu32_mask(key, tv, _MM_CMPINT_NLT);
        if (!keep) continue;
        int32_t nk = __builtin_popcount(keep);
        if (c + nk > cap) {
            *done = n;
            return -1;
        }
        _mm512_mask_compressstoreu_ps(cand + c, keep, v);
        _mm512_mask_compressstoreu_epi32(pos + c, keep, _mm512_add_epi32(lanes, _mm512_set1_epi32(i)));
        c += nk;
    }
    *done = i;
    return c;
}
#endif

#if defined(__x86_64__)
/* topk_emit 16 entries a step (its candidates are a few thousand at 32K
 * tokens, and the scalar loop's branch on each mispredicts): the keys above
 * th, and of those equal to it the first *ties, compress-stored in index
 * order.  Returns how many it wrote from x[0..*done). */
__attribute__((target("avx512f"))) static int32_t topk_emit_avx512(const float *x, const int32_t *pos, int32_t n,
                                                                     uint32_t th, int32_t *ties, int32_t *idx,
                                                                     int32_t *done) {
    const __m512i tv = _mm512_set1_epi32((int32_t)th);
    const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    int32_t m = 0, i = 0, left = *ties;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        __m512i key = ks_topk_key16(v);
        __mmask16 gt = _mm512_cmp_epu32_mask(key, tv, _MM_CMPINT_NLE);
        unsigned eq = _mm512_cmp_epu32_mask(key, tv, _MM_CMPINT_EQ);
        while (eq && __builtin_popcount(eq) > left) eq &= ~(1u << (31 - __builtin_clz(eq))); /* the first `left` */
        left -= __builtin_popcount(eq);
        __mmask16 keep = (__mmask16)(gt | eq);
        if (!keep) continue;
        __m512i p = pos ? _mm512_loadu_si512(pos + i) : _mm512_add_epi32(lanes, _mm512_set1_epi32(i));
        _mm512_mask_compressstoreu_epi32(idx + m, keep, p);
        m += __builtin_popcount(keep);
    }
    *ties = left;
    *done = i;
    return m;
}
#endif

#if defined(__x86_64__)
const uint64_t ks_topk_pack8_lanes[256] = {
    0x0000000000000000ull, 0x0000000000000000ull, 0x0000000000000001ull, 0x0000000000000100ull,
    0x0000000000000002ull, 0x0000000000000200ull, 0x0000000000000201ull, 0x0000000000020100ull,
    0x0000000000000003ull, 0x0000000000000300ull, 0x0000000000000301ull, 0x0000000000030100ull,
    0x0000000000000302ull, 0x0000000000030200ull, 0x0000000000030201ull, 0x0000000003020100ull,
    0x0000000000000004ull, 0x0000000000000400ull, 0x0000000000000401ull, 0x0000000000040100ull,
    0x0000000000000402ull, 0x0000000000040200ull, 0x0000000000040201ull, 0x0000000004020100ull,
    0x0000000000000403ull, 0x0000000000040300ull, 0x0000000000040301ull, 0x0000000004030100ull,
    0x0000000000040302ull, 0x0000000004030200ull, 0x0000000004030201ull, 0x0000000403020100ull,
    0x0000000000000005ull, 0x0000000000000500ull, 0x0000000000000501ull, 0x0000000000050100ull,
    0x0000000000000502ull, 0x0000000000050200ull, 0x0000000000050201ull, 0x0000000005020100ull,
    0x0000000000000503ull, 0x0000000000050300ull, 0x0000000000050301ull, 0x0000000005030100ull,
    0x0000000000050302ull, 0x0000000005030200ull, 0x0000000005030201ull, 0x0000000503020100ull,
    0x0000000000000504ull, 0x0000000000050400ull, 0x0000000000050401ull, 0x0000000005040100ull,
    0x0000000000050402ull, 0x0000000005040200ull, 0x0000000005040201ull, 0x0000000504020100ull,
    0x0000000000050403ull, 0x0000000005040300ull, 0x0000000005040301ull, 0x0000000504030100ull,
    0x0000000005040302ull, 0x0000000504030200ull, 0x0000000504030201ull, 0x0000050403020100ull,
    0x0000000000000006ull, 0x0000000000000600ull, 0x0000000000000601ull, 0x0000000000060100ull,
    0x0000000000000602ull, 0x0000000000060200ull, 0x0000000000060201ull, 0x0000000006020100ull,
    0x0000000000000603ull, 0x0000000000060300ull, 0x0000000000060301ull, 0x0000000006030100ull,
    0x0000000000060302ull, 0x0000000006030200ull, 0x0000000006030201ull, 0x0000000603020100ull,
    0x0000000000000604ull, 0x0000000000060400ull, 0x0000000000060401ull, 0x0000000006040100ull,
    0x0000000000060402ull, 0x0000000006040200ull, 0x0000000006040201ull, 0x0000000604020100ull,
    0x0000000000060403ull, 0x0000000006040300ull, 0x0000000006040301ull, 0x0000000604030100ull,
    0x0000000006040302ull, 0x0000000604030200ull, 0x0000000604030201ull, 0x0000060403020100ull,
    0x0000000000000605ull, 0x0000000000060500ull, 0x0000000000060501ull, 0x0000000006050100ull,
    0x0000000000060502ull, 0x0000000006050200ull, 0x0000000006050201ull, 0x0000000605020100ull,
    0x0000000000060503ull, 0x0000000006050300ull, 0x0000000006050301ull, 0x0000000605030100ull,
    0x0000000006050302ull, 0x0000000605030200ull, 0x0000000605030201ull, 0x0000060503020100ull,
    0x0000000000060504ull, 0x0000000006050400ull, 0x0000000006050401ull, 0x0000000605040100ull,
    0x0000000006050402ull, 0x0000000605040200ull, 0x0000000605040201ull, 0x0000060504020100ull,
    0x0000000006050403ull, 0x0000000605040300ull, 0x0000000605040301ull, 0x0000060504030100ull,
    0x0000000605040302ull, 0x0000060504030200ull, 0x0000060504030201ull, 0x0006050403020100ull,
    0x0000000000000007ull, 0x0000000000000700ull, 0x0000000000000701ull, 0x0000000000070100ull,
    0x0000000000000702ull, 0x0000000000070200ull, 0x0000000000070201ull, 0x0000000007020100ull,
    0x0000000000000703ull, 0x0000000000070300ull, 0x0000000000070301ull, 0x0000000007030100ull,
    0x0000000000070302ull, 0x0000000007030200ull, 0x0000000007030201ull, 0x0000000703020100ull,
    0x0000000000000704ull, 0x0000000000070400ull, 0x0000000000070401ull, 0x0000000007040100ull,
    0x0000000000070402ull, 0x0000000007040200ull, 0x0000000007040201ull, 0x0000000704020100ull,
    0x0000000000070403ull, 0x0000000007040300ull, 0x0000000007040301ull, 0x0000000704030100ull,
    0x0000000007040302ull, 0x0000000704030200ull, 0x0000000704030201ull, 0x0000070403020100ull,
    0x0000000000000705ull, 0x0000000000070500ull, 0x0000000000070501ull, 0x0000000007050100ull,
    0x0000000000070502ull, 0x0000000007050200ull, 0x0000000007050201ull, 0x0000000705020100ull,
    0x0000000000070503ull, 0x0000000007050300ull, 0x0000000007050301ull, 0x0000000705030100ull,
    0x0000000007050302ull, 0x0000000705030200ull, 0x0000000705030201ull, 0x0000070503020100ull,
    0x0000000000070504ull, 0x0000000007050400ull, 0x0000000007050401ull, 0x0000000705040100ull,
    0x0000000007050402ull, 0x0000000705040200ull, 0x0000000705040201ull, 0x0000070504020100ull,
    0x0000000007050403ull, 0x0000000705040300ull, 0x0000000705040301ull, 0x0000070504030100ull,
    0x0000000705040302ull, 0x0000070504030200ull, 0x0000070504030201ull, 0x0007050403020100ull,
    0x0000000000000706ull, 0x0000000000070600ull, 0x0000000000070601ull, 0x0000000007060100ull,
    0x0000000000070602ull, 0x0000000007060200ull, 0x0000000007060201ull, 0x0000000706020100ull,
    0x0000000000070603ull, 0x0000000007060300ull, 0x0000000007060301ull, 0x0000000706030100ull,
    0x0000000007060302ull, 0x0000000706030200ull, 0x0000000706030201ull, 0x0000070603020100ull,
    0x0000000000070604ull, 0x0000000007060400ull, 0x0000000007060401ull, 0x0000000706040100ull,
    0x0000000007060402ull, 0x0000000706040200ull, 0x0000000706040201ull, 0x0000070604020100ull,
    0x0000000007060403ull, 0x0000000706040300ull, 0x0000000706040301ull, 0x0000070604030100ull,
    0x0000000706040302ull, 0x0000070604030200ull, 0x0000070604030201ull, 0x0007060403020100ull,
    0x0000000000070605ull, 0x0000000007060500ull, 0x0000000007060501ull, 0x0000000706050100ull,
    0x0000000007060502ull, 0x0000000706050200ull, 0x0000000706050201ull, 0x0000070605020100ull,
    0x0000000007060503ull, 0x0000000706050300ull, 0x0000000706050301ull, 0x0000070605030100ull,
    0x0000000706050302ull, 0x0000070605030200ull, 0x0000070605030201ull, 0x0007060503020100ull,
    0x0000000007060504ull, 0x0000000706050400ull, 0x0000000706050401ull, 0x0000070605040100ull,
    0x0000000706050402ull, 0x0000070605040200ull, 0x0000070605040201ull, 0x0007060504020100ull,
    0x0000000706050403ull, 0x0000070605040300ull, 0x0000070605040301ull, 0x0007060504030100ull,
    0x0000070605040302ull, 0x0007060504030200ull, 0x0007060504030201ull, 0x0706050403020100ull,
};

/* topk_filter_avx512 in 8 lanes for AVX2 hosts (AMD Zen 1-3, most laptops),
 * where the scalar filter was most of Quest's and SpeContext's selection at
 * 32K tokens: the passing lanes packed by a permutation (ks_topk_pack8)
 * and stored whole where the 8 lanes fit below cap (the tail of cand runs
 * into cand_pos, so the last stores go through a buffer).  The same
 * candidates in the same order as the scalar loop. */
KS_AVX2_TGT static int32_t topk_filter_avx2(const float *x, int32_t n, uint32_t t, float *cand, int32_t *pos,
                                            int32_t cap, int32_t *done) {
    const __m256i tv = _mm256_set1_epi32((int32_t)(t ^ 0x80000000u));
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    int32_t c = 0, i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256i below = _mm256_cmpgt_epi32(tv, ks_topk_skey8(v));
        unsigned keep = ~(unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(below)) & 0xFFu;
        if (!keep) continue;
        int32_t nk = __builtin_popcount(keep);
        if (c + nk > cap) {
            *done = n;
            return -1;
        }
        __m256i perm = ks_topk_pack8(keep);
        __m256 pv = _mm256_permutevar8x32_ps(v, perm);
        __m256i pp = _mm256_permutevar8x32_epi32(_mm256_add_epi32(lanes, _mm256_set1_epi32(i)), perm);
        if (c + 8 <= cap) {
            _mm256_storeu_ps(cand + c, pv);
            _mm256_storeu_si256((__m256i *)(void *)(pos + c), pp);
        } else {
            float bv[8];
            int32_t bp[8];
            _mm256_storeu_ps(bv, pv);
            _mm256_storeu_si256((__m256i *)(void *)bp, pp);
            memcpy(cand + c, bv, sizeof(float) * (size_t)nk);
            memcpy(pos + c, bp, sizeof(int32_t) * (size_t)nk);
        }
        c += nk;
    }
    *done = i;
    return c;
}

/* topk_emit_avx512 in 8 lanes: the same indices in the same order (ties to
 * the first `left` equal keys), whole 8-lane stores while they fit in room. */
KS_AVX2_TGT static int32_t topk_emit_avx2(const float *x, const int32_t *pos, int32_t n, uint32_t th, int32_t *ties,
                                          int32_t *idx, int32_t room, int32_t *done) {
    const __m256i tv = _mm256_set1_epi32((int32_t)(th ^ 0x80000000u));
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    int32_t m = 0, i = 0, left = *ties;
    for (; i + 8 <= n; i += 8) {
        __m256i key = ks_topk_skey8(_mm256_loadu_ps(x + i));
        unsigned gt = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(key, tv)));
        unsigned eq = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(key, tv)));
        while (eq && __builtin_popcount(eq) > left) eq &= ~(1u << (31 - __builtin_clz(eq))); /* the first `left` */
        left -= __builtin_popcount(eq);
        unsigned keep = gt | eq;
        if (!keep) continue;
        __m256i p = pos ? _mm256_loadu_si256((const __m256i *)(const void *)(pos + i))
                        : _mm256_add_epi32(lanes, _mm256_set1_epi32(i));
        p = _mm256_permutevar8x32_epi32(p, ks_topk_pack8(keep));
        int32_t nk = __builtin_popcount(keep);
        if (m + 8 <= room) {
            _mm256_storeu_si256((__m256i *)(void *)(idx + m), p);
        } else {
            int32_t bp[8];
            _mm256_storeu_si256((__m256i *)(void *)bp, p);
            memcpy(idx + m, bp, sizeof(int32_t) * (size_t)nk);
        }
        m += nk;
    }
    *ties = left;
    *done = i;
    return m;
}
#endif

#if defined(__aarch64__)
/* The keys of 4 floats (topk_key's order): NaN as -inf, -0 as +0. */
static inline uint32x4_t topk_key4(float32x4_t v) {
    uint32x4_t ok = vceqq_f32(v, v);
    float32x4_t f = vaddq_f32(vbslq_f32(ok, v, vdupq_n_f32(-INFINITY)), vdupq_n_f32(0.0f));
    uint32x4_t b = vreinterpretq_u32_f32(f);
    uint32x4_t neg = vreinterpretq_u32_s32(vshrq_n_s32(vreinterpretq_s32_u32(b), 31));
    return veorq_u32(b, vorrq_u32(neg, vdupq_n_u32(0x80000000u)));
}
/* The lanes of a comparison as a 4-bit mask (bit l: lane l). */
static inline unsigned topk_mask4(uint32x4_t m) {
    static const uint32_t bit[4] = {1, 2, 4, 8};
    return vaddvq_u32(vandq_u32(m, vld1q_u32(bit)));
}

/* topk_filter_avx2 in 4 lanes for NEON (every AArch64 CPU): the keys
 * compared 4 at a time and the rare passing lanes stored one by one; the
 * same candidates in the same order as the scalar loop. */
static int32_t topk_filter_neon(const float *x, int32_t n, uint32_t t, float *cand, int32_t *pos, int32_t cap,
                                int32_t *done) {
    const uint32x4_t tv = vdupq_n_u32(t);
    int32_t c = 0, i = 0;
    for (; i + 8 <= n; i += 8) {
        uint32x4_t k0 = vcgeq_u32(topk_key4(vld1q_f32(x + i)), tv), k1 = vcgeq_u32(topk_key4(vld1q_f32(x + i + 4)), tv);
        if (vmaxvq_u32(vorrq_u32(k0, k1)) == 0) continue;
        unsigned keep = topk_mask4(k0) | topk_mask4(k1) << 4;
        int32_t nk = __builtin_popcount(keep);
        if (c + nk > cap) {
            *done = n;
            return -1;
        }
        for (; keep; keep &= keep - 1) {
            int l = __builtin_ctz(keep);
            cand[c] = x[i + l];
            pos[c++] = i + l;
        }
    }
    *done = i;
    return c;
}

/* topk_emit_avx2 in 4 lanes (NEON) */
static int32_t topk_emit_neon(const float *x, const int32_t *pos, int32_t n, uint32_t th, int32_t *ties, int32_t *idx,
                              int32_t *done) {
    const uint32x4_t tv = vdupq_n_u32(th);
    int32_t m = 0, i = 0, left = *ties;
    for (; i + 4 <= n; i += 4) {
        uint32x4_t key = topk_key4(vld1q_f32(x + i));
        unsigned gt = topk_mask4(vcgtq_u32(key, tv)), eq = topk_mask4(vceqq_u32(key, tv));
        while (eq && __builtin_popcount(eq) > left) eq &= ~(1u << (31 - __builtin_clz(eq))); /* the first `left` */
        left -= __builtin_popcount(eq);
        for (unsigned keep = gt | eq; keep; keep &= keep - 1) {
            int l = __builtin_ctz(keep);
            idx[m++] = pos ? pos[i + l] : i + l;
        }
    }
    *ties = left;
    *done = i;
    return m;
}
#endif

/* k far below n (k <= n / 8: Quest's pages, SpeContext's tokens): a
 * threshold read off every 8th entry, meant to lie a little below the k-th
 * largest key, keeps the entries at or above it, in index order, with their
 * values.  When at least k are kept, every key down to the k-th largest is
 * among them, so the radix select over these candidates alone gives exactly
 * the set (and order) it gives over all of x.  Returns -1, having written
 * nothing to idx, when the threshold kept fewer than k or more than n / 4
 * (few distinct values): the caller then selects over all of x. */
int ks_topk_sample_plan(int32_t n, int32_t k, int32_t *m, int32_t *want) {
    if (n < 256 || k <= 0 || k >= n || k > n / 8) return 0; /* ks_topk_scratch's conditions for topk_sampled */
    *m = n / 8;
    *want = k / 8 + 4 + k / 16; /* the sample's want-th largest: about 8 x want keys above it */
    return *want <= *m;
}

static int32_t topk_sampled(const float *x, int32_t n, int32_t k, int32_t *idx, float *scratch) {
    int32_t m, want;
    if (!ks_topk_sample_plan(n, k, &m, &want)) return -1;
    float *sample = scratch;                            /* [m] */
    uint32_t *sample_tmp = (uint32_t *)(void *)(scratch + m); /* [m] */
    float *cand = scratch + 2 * m;                      /* [n / 4] */
    int32_t *cand_pos = (int32_t *)(void *)(cand + n / 4);       /* [n / 4] */
    uint32_t *cand_tmp = (uint32_t *)(void *)(cand_pos + n / 4); /* [n / 4] */
    for (int32_t i = 0; i < m; i++) sample[i] = x[8 * i];
    int32_t ties, c = 0, cap = n / 4;
    uint32_t t = kth_largest_key(sample, m, want, sample_tmp, &ties);
    int32_t i = 0;
#if defined(__x86_64__)
    ks_simd_level lv = ks_simd_current();
    if (lv >= KS_SIMD_AVX512) c = topk_filter_avx512(x, n, t, cand, cand_pos, cap, &i);
    else if (lv == KS_SIMD_AVX2) c = topk_filter_avx2(x, n, t, cand, cand_pos, cap, &i);
#elif defined(__aarch64__)
    if (ks_simd_current() >= KS_SIMD_NEON) c = topk_filter_neon(x, n, t, cand, cand_pos, cap, &i);
#endif
    for (; i < n && c >= 0; i++) {
        if (topk_key(x[i]) < t) continue;
        if (c == cap) c = -1;
        else cand[c] = x[i], cand_pos[c++] = i;
    }
    if (c < k) return -1;
    uint32_t th = kth_largest_key(cand, c, k, cand_tmp, &ties);
    return topk_emit(cand, cand_pos, c, th, ties, idx, k);
}

int32_t ks_topk(const float *x, int32_t n, int32_t k, int32_t *idx) { return ks_topk_scratch(x, n, k, idx, NULL); }

const char *ks_topk_kernel_name(void) {
    ks_simd_level lv = ks_simd_current();
#if defined(__x86_64__)
    if (lv >= KS_SIMD_AVX512) return "avx512";
    if (lv == KS_SIMD_AVX2) return "avx2";
#elif defined(__aarch64__)
    if (lv >= KS_SIMD_NEON) return "neon";
#endif
    (void)lv;
    return "scalar";
}

uint32_t ks_topk_key(float x) { return topk_key(x); }
uint32_t ks_topk_kth_key(const float *x, int32_t n, int32_t k, uint32_t *tmp, int32_t *ties) {
    return kth_largest_key(x, n, k, tmp, ties);
}
int32_t ks_topk_emit(const float *x, const int32_t *pos, int32_t n, uint32_t th, int32_t ties, int32_t *idx,
                     int32_t room) {
    return topk_emit(x, pos, n, th, ties, idx, room);
}

static int32_t topk_heap(const float *x, int32_t n, int32_t k, int32_t *idx);
static int cmp_index(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}
/* The heap's set in index order: what the radix select returns. */
static int32_t topk_heap_sorted(const float *x, int32_t n, int32_t k, int32_t *idx) {
    int32_t m = topk_heap(x, n, k, idx);
    qsort(idx, (size_t)m, sizeof *idx, cmp_index);
    return m;
}

int32_t ks_topk_scratch(const float *x, int32_t n, int32_t k, int32_t *idx, float *tmp) {
    if (k <= 0 || n <= 0) return 0;
    if (k >= n) {
        for (int32_t i = 0; i < n; i++) idx[i] = i;
        return n;
    }
    if (n >= 256) {
        /* a few hundred entries and more (pages of long contexts, token
         * budgets): the k-th largest by a radix select, then every index
         * above it and, among ties, the lowest ones — the same set the heap
         * below returns, in index order, in O(n); with topk_sampled 6x
         * faster than the heap at 62 of 1024 (Quest's pages at 32K) */
        float *scr = tmp ? tmp : ks_malloc(sizeof(float) * (size_t)n);
        if (!scr) return topk_heap_sorted(x, n, k, idx); /* refused: the same indices without scratch */
        int32_t m = k <= n / 8 ? topk_sampled(x, n, k, idx, scr) : -1;
        if (m < 0) {
            int32_t ties;
            uint32_t th = kth_largest_key(x, n, k, (uint32_t *)(void *)scr, &ties);
            m = topk_emit(x, NULL, n, th, ties, idx, k);
        }
        if (scr != tmp) ks_free(scr);
        KS_ASSERT(m == k);
        return k;
    }
    return topk_heap(x, n, k, idx);
}

static int32_t topk_heap(const float *x, int32_t n, int32_t k, int32_t *idx) {
    /* idx[0..k) is a min-heap under `better` (root = worst kept) */
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        float v = x[i] != x[i] ? -INFINITY : x[i];
        if (m < k) {
            int32_t c = m++;
            idx[c] = i;
            while (c > 0) {
                int32_t p = (c - 1) / 2;
                float vp = x[idx[p]] != x[idx[p]] ? -INFINITY : x[idx[p]];
                float vc = x[idx[c]] != x[idx[c]] ? -INFINITY : x[idx[c]];
                if (!better(vp, idx[p], vc, idx[c])) break;
                int32_t t = idx[p];
                idx[p] = idx[c];
                idx[c] = t;
                c = p;
            }
            continue;
        }
        float vr = x[idx[0]] != x[idx[0]] ? -INFINITY : x[idx[0]];
        if (!better(v, i, vr, idx[0])) continue;
        idx[0] = i;
        int32_t c = 0;
        for (;;) {
            int32_t l = 2 * c + 1, r = l + 1, w = c;
            float vw = x[idx[w]] != x[idx[w]] ? -INFINITY : x[idx[w]];
            if (l < k) {
                float vl = x[idx[l]] != x[idx[l]] ? -INFINITY : x[idx[l]];
                if (better(vw, idx[w], vl, idx[l])) w = l, vw = vl;
            }
            if (r < k) {
                float vr2 = x[idx[r]] != x[idx[r]] ? -INFINITY : x[idx[r]];
                if (better(vw, idx[w], vr2, idx[r])) w = r;
            }
            if (w == c) break;
            int32_t t = idx[w];
            idx[w] = idx[c];
            idx[c] = t;
            c = w;
        }
    }
    return k;
}

int32_t ks_topk_range(const float *x, int32_t lo, int32_t hi, int32_t k, int32_t *idx, float *tmp) {
    int32_t got = ks_topk_scratch(x + lo, hi - lo, k, idx, tmp);
    for (int32_t i = 0; i < got; i++) idx[i] += lo;
    return got;
}

void ks_selection_topk(ks_selection *out, const float *x, int32_t lo, int32_t hi, int32_t k, float *tmp) {
    out->n = ks_topk_range(x, lo, hi, k < out->cap ? k : out->cap, out->idx, tmp);
}
