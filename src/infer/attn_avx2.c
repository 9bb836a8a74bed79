/*
 * attn_avx2.c — grouped decode attention over KV segments (f16 or 8-bit
 * rows), and the prefill block kernel, on AVX2 + FMA + F16C.
 *
 * The same plan as attn_avx512.c, fitted to sixteen 8-lane registers, for
 * the CPUs most edge users have (laptops, many cloud AMD parts without
 * AVX-512; AVX-512 machines run it for 8-bit KV).  Long-context decode is
 * bound by reading the KV cache, so every K and V row is converted once,
 * used by every query head of its GQA group, and nothing but the scores
 * leaves the registers:
 *  - Scores: eight accumulators = (8 / NG) rows x NG heads (NG = the group
 *    padded to 1, 2 or 4), reduced together by one hadd/permute butterfly
 *    into a vector that is already the t-major layout scores[t][NG]; no
 *    horizontal sum per score.
 *  - Softmax is fused into the other two passes: the score pass keeps each
 *    lane's running max (lane mod NG = head), and the value pass turns a
 *    block's scores into exp(s - max) (polynomial, relative error ~2e-7)
 *    just before using them, while they sit in L1.  A pass of its own read
 *    and wrote the [len][NG] scores twice more: 512 KiB per head at 32K, from
 *    L3 on a Zen 3 core (512 KiB L2); fusing it cut the 32K decode kernel's
 *    time by ~6% on two threads.  Outputs are normalised at the end, the
 *    same way whether or not the caller wants the weights.
 *  - V: rows are taken in blocks that stay in L1 while the head dim is swept
 *    in slices of 64 / NG floats; each slice keeps NG heads x (8 / NG)
 *    accumulators in registers, so every V element is converted once and V
 *    is read from memory once per step.  A block is a few runs of
 *    consecutive rows (pages), and the next block is prefetched evenly over
 *    all slices of the current one: issued in one burst it stalled the
 *    kernel on DRAM.
 * Rows are walked segment by segment (groups of rows may straddle pages) or
 * through a flat row-pointer list for fragmented selections.  On Zen 3 the
 * kernel, held in cache, is bound by FP-pipe issue: a row (GQA 4, hd 64)
 * costs ~48 cycles against 32 for its FMAs; on two threads from DRAM it
 * reaches the rate of a plain read loop in the host's quiet phases.
 * Measured, not guessed: the f16 conversions are free (a convert+FMA loop
 * runs at the FMA bound); the excess is the hadd reduction of the scores
 * (~4 cycles a row), the exp (~4) and loop overhead (docs/BENCHMARKS.md,
 * "On an AVX2-only host").
 * Head dims that are multiples of 16 up to 512 (32 for 8-bit KV) take this
 * path; others go portable.
 */
#include "infer/infer.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

#include "tensor/simd_avx2.h"

/* Rows ahead to prefetch (2 KiB at hd 64): the next page of a head is
 * usually not the next address, so the hardware prefetcher alone stalls at
 * every page boundary.  Same distance as the AVX-512 kernel; on Zen 3, 8,
 * 32, 48 and 64 rows and the T1 hint measured no better (the kernel is
 * issue-bound there, and with no software prefetch at all it lost ~7% on
 * two threads). */
#define ATTN2_PREFETCH_ROWS 16
#define ATTN2_VBLOCK 128 /* V rows per L1 block (16 KiB at hd 64) */
#define KS_ATTN2_MAX_HD 512 /* the bundled model has 288; 4 x 512 scaled queries live on the stack */
#define TGT __attribute__((target("avx2,fma,f16c")))
#define INL static inline __attribute__((target("avx2,fma,f16c"), always_inline))

/* Every lane gets op over the lanes of the same head (lane mod ng). */
#define FOLD_LANES(v, ng, OP)                                                              \
    do {                                                                                   \
        if ((ng) <= 4) v = OP(v, _mm256_permute2f128_ps(v, v, 0x01));                      \
        if ((ng) <= 2) v = OP(v, _mm256_permute_ps(v, _MM_SHUFFLE(1, 0, 3, 2)));           \
        if ((ng) <= 1) v = OP(v, _mm256_permute_ps(v, _MM_SHUFFLE(2, 3, 0, 1)));           \
    } while (0)

/* Both ends of a row (two lines at hd 64). */
INL void prefetch_row(const uint8_t *p, size_t rb) {
    _mm_prefetch((const char *)p, _MM_HINT_T0);
    _mm_prefetch((const char *)(p + rb - 1), _MM_HINT_T0);
}

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

/* Scores of 8 / NG rows k[] against NG heads: dst[r][NG] for the first nr
 * rows.  qs: [NG][hd] scaled queries (padded heads zero). */
INL void score_rows(const uint8_t *const *k, const float *qs, int hd, int NG, const int KT, float *dst, int nr,
                    __m256 *mx) {
    const int rps = 8 / NG;
    __m256 acc[8];
    _Pragma("GCC unroll 8") for (int a = 0; a < 8; a++) acc[a] = _mm256_setzero_ps();
    _Pragma("GCC unroll 16") for (int i = 0; i < hd; i += 8) {
        __m256 qv[4];
        _Pragma("GCC unroll 4") for (int g = 0; g < NG; g++) {
            qv[g] = _mm256_loadu_ps(qs + g * hd + i);
            __asm__("" : "+x"(qv[g])); /* one load per use by all rows (load ports) */
        }
        _Pragma("GCC unroll 8") for (int r = 0; r < rps; r++) {
            __m256 kv = load8(k[r], i, KT);
            _Pragma("GCC unroll 4") for (int g = 0; g < NG; g++)
                acc[r * NG + g] = _mm256_fmadd_ps(kv, qv[g], acc[r * NG + g]);
        }
    }
    __m256 s = ks_avx2_reduce8(acc);
    *mx = _mm256_max_ps(*mx, s); /* padded lanes repeat row 0's scores: harmless for a max */
    if (nr == rps) {
        _mm256_storeu_ps(dst, s);
    } else {
        float tmp8[8];
        _mm256_storeu_ps(tmp8, s);
        memcpy(dst, tmp8, sizeof(float) * (size_t)(nr * NG));
    }
}

/* scores[t][NG] over the rows of the segments (or of the flat list KR);
 * rows are rb bytes.  Returns each lane's running max (lane mod NG = head),
 * so the softmax needs no pass of its own over the scores. */
INL __m256 score_pass(const ks_kv_seg *segs, int nseg, const uint8_t *const *KR, int total, int hd, size_t rb,
                      int NG, const int KT, const float *qs, float *scores) {
    const int rps = 8 / NG, pf = ATTN2_PREFETCH_ROWS;
    const uint8_t *k[8];
    __m256 mx = _mm256_set1_ps(-INFINITY);
    if (KR) {
        for (int t = 0; t < total; t += rps) {
            int nr = total - t < rps ? total - t : rps;
            for (int r = 0; r < rps; r++) {
                k[r] = KR[r < nr ? t + r : t];
                if (t + r + pf < total) prefetch_row(KR[t + r + pf], rb);
            }
            score_rows(k, qs, hd, NG, KT, scores + (size_t)t * NG, nr, &mx);
        }
        return mx;
    }
    int t = 0, n = 0; /* n rows of k[] pending, straddling a page boundary */
    for (int si = 0; si < nseg; si++) {
        const uint8_t *K = segs[si].K, *Kn = si + 1 < nseg ? segs[si + 1].K : NULL;
        int len = segs[si].len, j = 0;
        while (n > 0 && n < rps && j < len) k[n++] = K + (size_t)j++ * rb;
        if (n == rps) {
            score_rows(k, qs, hd, NG, KT, scores + (size_t)t * NG, rps, &mx);
            t += rps;
            n = 0;
        }
        for (; j + rps <= len; j += rps, t += rps) {
            for (int r = 0; r < rps; r++) {
                k[r] = K + (size_t)(j + r) * rb;
                int a = j + r + pf;
                if (a < len) prefetch_row(K + (size_t)a * rb, rb);
                else if (Kn && a - len < segs[si + 1].len) prefetch_row(Kn + (size_t)(a - len) * rb, rb);
            }
            score_rows(k, qs, hd, NG, KT, scores + (size_t)t * NG, rps, &mx);
        }
        while (j < len) k[n++] = K + (size_t)j++ * rb;
    }
    if (n > 0) {
        for (int r = n; r < rps; r++) k[r] = k[0];
        score_rows(k, qs, hd, NG, KT, scores + (size_t)t * NG, n, &mx);
    }
    return mx;
}

/* Softmax numerators of one block's scores, in place: exp(s - m) with m the
 * per-head max (lanes mod NG), the vector sum accumulated in *sum.  Full
 * vectors only; the last block's tail (< 8 values) goes through the same
 * exp in one padded vector, into e_tail.  Summation order is that of a
 * separate softmax pass: vectors in order, then the tail after the fold. */
INL void softmax_block(float *p, int n, __m256 m, __m256 *sum, float *e_tail, int *n_tail) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = ks_avx2_exp_neg(_mm256_sub_ps(_mm256_loadu_ps(p + i), m));
        _mm256_storeu_ps(p + i, e);
        *sum = _mm256_add_ps(*sum, e);
    }
    if (i < n) {
        float x[8] = {0}, mm[8];
        _mm256_storeu_ps(mm, m);
        for (int k = 0; k < n - i; k++) x[k] = p[i + k] - mm[k]; /* 8 | i, so lane k is head k mod NG */
        _mm256_storeu_ps(e_tail, ks_avx2_exp_neg(_mm256_loadu_ps(x)));
        for (int k = 0; k < n - i; k++) p[i + k] = e_tail[k];
        *n_tail = n - i;
    }
}

/* A stretch of consecutive rows (rb bytes apart) of one V block. */
typedef struct attn2_run {
    const uint8_t *row; /* first row */
    int n;              /* rows */
} attn2_run;

/* The rows [t0, t0 + ATTN2_VBLOCK) of the segments (walk state *si, *j) or
 * of the flat list VR, as runs: a page is one run, adjacent rows of a flat
 * list merge.  The value loop then steps a row by one add instead of loading
 * a pointer per row and slice (~3-5 cycles a row on Zen 3, measured in a
 * microbenchmark).  Returns the run count; *nrows = rows in the block. */
INL int block_runs(const ks_kv_seg *segs, const uint8_t *const *VR, int total, int t0, size_t rb, int *si, int *j,
                   attn2_run *runs, int *nrows) {
    int n = total - t0 < ATTN2_VBLOCK ? total - t0 : ATTN2_VBLOCK, nr = 0;
    if (n < 0) n = 0;
    *nrows = n;
    if (VR) {
        for (int b = 0; b < n; b++) {
            const uint8_t *r = VR[t0 + b];
            if (nr > 0 && runs[nr - 1].row + (size_t)runs[nr - 1].n * rb == r) runs[nr - 1].n++;
            else runs[nr++] = (attn2_run){r, 1};
        }
        return nr;
    }
    for (int left = n; left > 0;) {
        while (*j >= segs[*si].len) (*si)++, *j = 0;
        int take = segs[*si].len - *j < left ? segs[*si].len - *j : left;
        runs[nr++] = (attn2_run){(const uint8_t *)segs[*si].V + (size_t)*j * rb, take};
        *j += take;
        left -= take;
    }
    return nr;
}

/* out[g0+g] (+)= sum_t p[t][g] V[t] for the real heads g < ng, over the rows
 * of the segments (or VR) in blocks of ATTN2_VBLOCK that stay in L1.  The
 * softmax is fused in: each block's scores become exp(s - m) (m: the score
 * pass's per-head max, folded) just before the block is used, while they are
 * in L1, so no pass of its own re-reads the [total][NG] scores (512 KiB per
 * head at 32K: from L3 on a 512 KiB-L2 core).  inv[g] = 1 / sum for g < NG. */
INL void value_pass(const ks_kv_seg *segs, int nseg, const uint8_t *const *VR, int total, int hd, size_t rb, int NG,
                    const int KT, int g0, int ng, float *scores, __m256 m, float *out, float inv[4]) {
    __m256 sum = _mm256_setzero_ps();
    float e_tail[8];
    int n_tail = 0;
    const int SL = 8 / NG; /* ymm per head per slice of 64 / NG floats */
    attn2_run runs[2][ATTN2_VBLOCK];
    int nrun[2], nrows[2], si = 0, j = 0; /* si, j: segment walk */
    nrun[0] = block_runs(segs, VR, total, 0, rb, &si, &j, runs[0], &nrows[0]);
    for (int t0 = 0, cur = 0; t0 < total; t0 += ATTN2_VBLOCK, cur ^= 1) {
        const int nx = cur ^ 1;
        /* the next block, prefetched while this one runs */
        nrun[nx] = block_runs(segs, VR, total, t0 + ATTN2_VBLOCK, rb, &si, &j, runs[nx], &nrows[nx]);
        softmax_block(scores + (size_t)t0 * NG, nrows[cur] * NG, m, &sum, e_tail, &n_tail);
        const float *p = scores + (size_t)t0 * NG;
        /* The next block's rows are prefetched one every nsl steps, spread
         * over all nsl slices of this block: issued all in the first slice
         * (256 lines in ~200 ns) they overflowed the core's miss queue, and
         * the next block's first slice stalled on DRAM (a quarter of the
         * kernel's samples on one vcvtph2ps).  Spread, the demand matches
         * what one core streams; 32K, 2 threads: 45.6 -> 36.4 ms. */
        const int nsl = hd / (8 * SL);
        int pr = 0, po = 0, pf_wait = 1; /* next row to prefetch: run pr, offset po; steps until then */
        for (int x = 0; x < hd; x += 8 * SL) {
            __m256 acc[4][8];
            _Pragma("GCC unroll 4") for (int g = 0; g < NG; g++)
                _Pragma("GCC unroll 8") for (int i = 0; i < SL; i++)
                    acc[g][i] = t0 > 0 && g < ng ? _mm256_loadu_ps(out + (size_t)(g0 + g) * hd + x + 8 * i)
                                                 : _mm256_setzero_ps();
            const float *pp = p;
            for (int r = 0; r < nrun[cur]; r++) {
                const uint8_t *row = runs[cur][r].row;
                for (int b = 0; b < runs[cur][r].n; b++, row += rb, pp += NG) {
                    if (--pf_wait == 0) {
                        pf_wait = nsl;
                        if (pr < nrun[nx]) {
                            prefetch_row(runs[nx][pr].row + (size_t)po * rb, rb);
                            if (++po == runs[nx][pr].n) pr++, po = 0;
                        }
                    }
                    __m256 pv[4];
                    _Pragma("GCC unroll 4") for (int g = 0; g < NG; g++) pv[g] = _mm256_broadcast_ss(pp + g);
                    _Pragma("GCC unroll 8") for (int i = 0; i < SL; i++) {
                        __m256 vv = load8(row, x + 8 * i, KT);
                        _Pragma("GCC unroll 4") for (int g = 0; g < NG; g++)
                            acc[g][i] = _mm256_fmadd_ps(pv[g], vv, acc[g][i]);
                    }
                }
            }
            _Pragma("GCC unroll 4") for (int g = 0; g < NG; g++)
                if (g < ng)
                    _Pragma("GCC unroll 8") for (int i = 0; i < SL; i++)
                        _mm256_storeu_ps(out + (size_t)(g0 + g) * hd + x + 8 * i, acc[g][i]);
        }
    }
    FOLD_LANES(sum, NG, _mm256_add_ps);
    float s8[8];
    _mm256_storeu_ps(s8, sum);
    for (int k = 0; k < n_tail; k++) s8[k % NG] += e_tail[k];
    for (int g = 0; g < NG; g++) inv[g] = 1.0f / s8[g];
}

/* Softmax numerators over t of each head lane of scores[len][ng] (ng in 1,
 * 2, 4): exp(s - max) in place; inv[g] = 1 / sum for head g. */
TGT static void softmax_lanes(float *scores, int len, int ng, float inv[4]) {
    int n = ng * len, i;
    __m256 mx = _mm256_set1_ps(-INFINITY);
    for (i = 0; i + 8 <= n; i += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(scores + i));
    FOLD_LANES(mx, ng, _mm256_max_ps);
    float m[8];
    _mm256_storeu_ps(m, mx);
    for (; i < n; i++) m[i % ng] = scores[i] > m[i % ng] ? scores[i] : m[i % ng];
    for (int l = ng; l < 8; l++) m[l] = m[l % ng];
    mx = _mm256_loadu_ps(m);
    __m256 sum = _mm256_setzero_ps();
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 e = ks_avx2_exp_neg(_mm256_sub_ps(_mm256_loadu_ps(scores + i), mx));
        _mm256_storeu_ps(scores + i, e);
        sum = _mm256_add_ps(sum, e);
    }
    FOLD_LANES(sum, ng, _mm256_add_ps);
    float s[8];
    _mm256_storeu_ps(s, sum);
    if (i < n) { /* the tail through one vector */
        float x[8] = {0}, e[8];
        for (int k = 0; k < n - i; k++) x[k] = scores[i + k] - m[(i + k) % ng];
        _mm256_storeu_ps(e, ks_avx2_exp_neg(_mm256_loadu_ps(x)));
        for (int k = 0; k < n - i; k++) {
            scores[i + k] = e[k];
            s[(i + k) % ng] += e[k];
        }
    }
    for (int g = 0; g < ng; g++) inv[g] = 1.0f / s[g];
}

/* probabilities in place (only when the caller wants them) */
TGT static void normalize_lanes(float *scores, int len, int ng, const float inv[4]) {
    float iv8[8];
    for (int l = 0; l < 8; l++) iv8[l] = inv[l % ng];
    __m256 iv = _mm256_loadu_ps(iv8);
    int n = ng * len, i;
    for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(scores + i, _mm256_mul_ps(_mm256_loadu_ps(scores + i), iv));
    for (; i < n; i++) scores[i] *= inv[i % ng];
}

/* One head group: scores, softmax numerators, values; hd and NG constant
 * per instance.  The outputs are normalised at the end (hd values per head,
 * not one per row), and the same way whether or not the caller wants the
 * probabilities, so a policy that reads them stays bit-exact with dense. */
#define GROUP_FN(NAME, HD, NG, KT)                                                                       \
    TGT static void NAME(const ks_kv_seg *segs, int nseg, const uint8_t *const *KR, const uint8_t *const *VR,  \
                         int total, int hd_rt, size_t rb, int g0, int ng, const float *qs, float *scores,        \
                         float *out, float inv[4]) {                                                             \
        const int hd = (HD) ? (HD) : hd_rt;                                                                      \
        __m256 mx = score_pass(segs, nseg, KR, total, hd, rb, NG, KT, qs, scores);                               \
        FOLD_LANES(mx, NG, _mm256_max_ps);                                                                       \
        value_pass(segs, nseg, VR, total, hd, rb, NG, KT, g0, ng, scores, mx, out, inv);                         \
        for (int g = 0; g < ng; g++)                                                                             \
            for (int i = 0; i < hd; i++) out[(size_t)(g0 + g) * hd + i] *= inv[g];                               \
    }
GROUP_FN(group_64_4, 64, 4, 0)
GROUP_FN(group_64_2, 64, 2, 0)
GROUP_FN(group_64_1, 64, 1, 0)
GROUP_FN(group_128_4, 128, 4, 0)
GROUP_FN(group_128_2, 128, 2, 0)
GROUP_FN(group_128_1, 128, 1, 0)
GROUP_FN(group_any_4, 0, 4, 0)
GROUP_FN(group_any_2, 0, 2, 0)
GROUP_FN(group_any_1, 0, 1, 0)
/* 8-bit KV: one generic instance per group width (the type is for memory,
 * not speed; hd is a multiple of 32) */
GROUP_FN(group_q8_4, 0, 4, 1)
GROUP_FN(group_q8_2, 0, 2, 1)
GROUP_FN(group_q8_1, 0, 1, 1)

typedef void (*group_fn)(const ks_kv_seg *, int, const uint8_t *const *, const uint8_t *const *, int, int, size_t,
                         int, int, const float *, float *, float *, float[4]);
/* [f16 hd 64, f16 hd 128, f16 other hd, 8-bit][NGP 1, 2, 4] */
static const group_fn group_fns[4][3] = {{group_64_1, group_64_2, group_64_4},
                                         {group_128_1, group_128_2, group_128_4},
                                         {group_any_1, group_any_2, group_any_4},
                                         {group_q8_1, group_q8_2, group_q8_4}};

bool ks_attention_segs_avx2(ks_kv_type kt, const ks_kv_seg *segs, int nseg, int total, int hd, int G, const float *q,
                            float *scores, float *out, float scale, float *weights, const void **rows) {
    if (hd % 16 || hd > KS_ATTN2_MAX_HD || (kt != KS_KV_F16 && (kt != KS_KV_Q8 || hd % 32))) return false;
    size_t rb = ks_kv_row_bytes(kt, hd);
    /* short segments on average: flatten to row pointers (rows: [2][total]) */
    const uint8_t **KR = NULL, **VR = NULL;
    if (rows && (size_t)nseg * 8 > (size_t)total) {
        KR = (const uint8_t **)rows;
        VR = KR + total;
        for (int si = 0, t = 0; si < nseg; si++)
            for (int j = 0; j < segs[si].len; j++, t++) {
                KR[t] = (const uint8_t *)segs[si].K + (size_t)j * rb;
                VR[t] = (const uint8_t *)segs[si].V + (size_t)j * rb;
            }
    }
    for (int g0 = 0; g0 < G; g0 += 4) {
        int ng = G - g0 < 4 ? G - g0 : 4;
        /* the group padded to 1, 2 or 4 heads; a V slice (64 / NGP floats) must divide hd */
        int NGP = ng == 1 ? 1 : ng == 2 ? 2 : 4;
        while (NGP < 4 && hd % (64 / NGP)) NGP *= 2;
        float qs[4 * KS_ATTN2_MAX_HD]; /* [NGP][hd] scaled queries, padded heads zero */
        for (int g = 0; g < NGP; g++)
            for (int i = 0; i < hd; i++) qs[g * hd + i] = g < ng ? q[(size_t)(g0 + g) * hd + i] * scale : 0.0f;
        float inv[4];
        int kind = kt == KS_KV_Q8 ? 3 : hd == 64 ? 0 : hd == 128 ? 1 : 2;
        group_fns[kind][NGP == 4 ? 2 : NGP - 1](segs, nseg, KR, VR, total, hd, rb, g0, ng, qs, scores, out, inv);
        if (weights)
            for (int t = 0; t < total; t++)
                for (int g = 0; g < ng; g++) weights[t] += scores[(size_t)NGP * t + g] * inv[g];
    }
    return true;
}

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
            int r = x / G, g = x % G, lim = n_att[r] - e0;
            if (lim <= 0) continue;
            if (lim > L) lim = L;
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
        softmax_lanes(S + (size_t)x * n_max, n, 1, inv);
        normalize_lanes(S + (size_t)x * n_max, n, 1, inv);
        memset(out + (size_t)(x / G) * out_stride + (size_t)(x % G) * hd, 0, sizeof(float) * (size_t)hd);
    }
    for (int si = 0, e0 = 0; si < nseg; e0 += segs[si].len, si++) {
        int L = segs[si].len;
        block_tile(kt, segs[si].V, L, hd, tile);
        for (int x = 0; x < RG; x++) {
            int lim = n_att[x / G] - e0;
            if (lim <= 0) continue;
            if (lim > L) lim = L;
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
bool ks_attention_segs_avx2(ks_kv_type kt, const ks_kv_seg *segs, int nseg, int total, int hd, int G, const float *q,
                            float *scores, float *out, float scale, float *weights, const void **rows) {
    (void)kt, (void)segs, (void)nseg, (void)total, (void)hd, (void)G, (void)q, (void)scores, (void)out, (void)scale;
    (void)weights, (void)rows;
    return false;
}
#endif
