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
#include "core/simd.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
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
#endif
static int32_t topk_emit(const float *x, const int32_t *pos, int32_t n, uint32_t th, int32_t ties, int32_t *idx) {
    int32_t m = 0, i = 0;
#if defined(__x86_64__)
    if (ks_simd_current() >= KS_SIMD_AVX512) m = topk_emit_avx512(x, pos, n, th, &ties, idx, &i);
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
    if (ks_simd_current() >= KS_SIMD_AVX512) c = topk_filter_avx512(x, n, t, cand, cand_pos, cap, &i);
#endif
    for (; i < n && c >= 0; i++) {
        if (topk_key(x[i]) < t) continue;
        if (c == cap) c = -1;
        else cand[c] = x[i], cand_pos[c++] = i;
    }
    if (c < k) return -1;
    uint32_t th = kth_largest_key(cand, c, k, cand_tmp, &ties);
    return topk_emit(cand, cand_pos, c, th, ties, idx);
}

int32_t ks_topk(const float *x, int32_t n, int32_t k, int32_t *idx) { return ks_topk_scratch(x, n, k, idx, NULL); }

uint32_t ks_topk_key(float x) { return topk_key(x); }
uint32_t ks_topk_kth_key(const float *x, int32_t n, int32_t k, uint32_t *tmp, int32_t *ties) {
    return kth_largest_key(x, n, k, tmp, ties);
}
int32_t ks_topk_emit(const float *x, const int32_t *pos, int32_t n, uint32_t th, int32_t ties, int32_t *idx) {
    return topk_emit(x, pos, n, th, ties, idx);
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
            m = topk_emit(x, NULL, n, th, ties, idx);
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
