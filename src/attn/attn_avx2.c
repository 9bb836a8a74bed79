/*
 * attn_avx2.c — grouped decode attention over KV segments (f16 or 8-bit
 * rows) on AVX2 + FMA + F16C (the prefill block kernel is
 * attn_block_avx2.c).
 *
 * The same plan as attn_avx512.c, fitted to sixteen 8-lane registers, for
 * the CPUs most edge users have (laptops, many cloud AMD parts without
 * AVX-512; AVX-512 machines run it for head dims other than 64 and 128,
 * with ymm vpdpbusd for 8-bit KV).  Long-context decode is
 * bound by reading the KV cache, so every K and V row is converted once,
 * used by every query head of its GQA group, and nothing but the scores
 * leaves the registers:
 *  - One pass, page by page (online softmax): a page's K rows give its
 *    scores, the running max and denominator per head are updated (the
 *    accumulators rescaled when the max grows), then the same page's V rows
 *    are weighted in while the page is in L1: one forward stream per head
 *    where a page is K rows then V rows (slow tier, gather buffer), two
 *    where K and V have regions of their own (fast tier, slots).  A kernel
 *    that read all K, then all V, would read the paged layout as small
 *    pieces with holes between them and could not overlap its arithmetic
 *    with its cache misses.
 *  - Scores: eight accumulators = (8 / NG) rows x NG heads (NG = the group
 *    padded to 1, 2 or 4), reduced together by one hadd/permute butterfly
 *    into a vector that is already the layout [row][NG]; no horizontal sum
 *    per score.  exp is a polynomial (relative error ~2e-7).
 *  - V: the head dim is swept in slices of 64 / NG floats; each slice keeps
 *    NG heads x (8 / NG) accumulators in registers, so every V element is
 *    converted once and V is read from memory once per step.
 * Held in cache, the kernel is bound by FP-pipe issue, not by the f16
 * conversions: what remains beyond the FMAs is the butterfly reduction, the
 * exp and loop overhead, which is why those are the parts kept lean.
 * Head dims that are multiples of 16 up to 512 (32 for 8-bit KV) take this
 * path; others go portable.
 *
 * 8-bit KV scores on integer units: the query of each head is quantised to
 * int8 once per call (one call is one step of one KV head), with one scale
 * per 32-element block like the Q8_0 rows it meets, and q . k is an integer
 * dot product per block: maddubs + madd with the sign trick (|k| * sign(q,
 * k), no pair can saturate: 2 * 128 * 127 < 2^15) on AVX2, one vpdpbusd on
 * AVX-512 VNNI (the query as u8 = q + 128, the 128 * sum(k) it adds taken off
 * by starting the chain from its negation).  Each block's eight (row, head)
 * integer sums are reduced together in int32 (exact), then scaled by
 * d_k(row) * d_q(head) into the float score.  The query's rounding (per
 * element at most half a step, 1/254 of the block's largest |q|) is the only
 * difference from the float path.  Values too are integer dot products
 * (q8v_block: the probabilities, times the rows' block scales, quantised to
 * 7 bits per block of rows, four rows interleaved per 32-bit lane).
 */
#include "attn/attn.h"

#include "core/core.h"
#include "core/simd.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

#include "tensor/simd_avx2.h"
#include "attn/attn_avx2_lanes.h"

/* A block: the unit of the online softmax and of the memory order, as in
 * attn_avx512.c: one page (K rows then V rows, adjacent), a piece of a
 * longer one, or short runs merged (then the next block is prefetched). */
enum { ATTN2_BLOCK_MAX = 32, ATTN2_BLOCK_MIN = 16 };
#define KS_ATTN2_MAX_HD 1024 /* latent attention: 576 (deepseek2); 4 x 1024 scaled queries live on the stack */
/* the same plus 256-bit VNNI (AVX512-VNNI + VL: vpdpbusd on ymm) */
#define TGT_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni")))
#define INL_VNNI static inline __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni"), always_inline))

/* Both ends of a row (two lines at hd 64). */
INL void prefetch_row(const uint8_t *p, size_t rb) {
    _mm_prefetch((const char *)p, _MM_HINT_T0);
    _mm_prefetch((const char *)(p + rb - 1), _MM_HINT_T0);
}

/* A contiguous run's row, KS_STREAM_AHEAD bytes ahead (tensor/simd_avx2.h). */
INL void prefetch_stream(const uint8_t *row, size_t rb) { ks_prefetch_lines(row + KS_STREAM_AHEAD, rb); }

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

/* The scaled query of a head group quantised for the integer scores, once
 * per call: per head and 32-block an int8 vector and its scale. */
typedef struct q8_query {
    float qd[KS_ATTN2_MAX_HD / 32][8]; /* [block][lane]: scale of head lane % NG's block */
    int8_t qi[4][KS_ATTN2_MAX_HD];     /* [NG][hd] round(q / d) in [-127, 127] (AVX2 sign trick) */
    uint8_t qu[4][KS_ATTN2_MAX_HD];    /* qi + 128 (VNNI: u8 x s8) */
} q8_query;

/* qs [NG][hd] (padded heads zero) -> qq */
static void q8_query_init(const float *qs, int hd, int NG, q8_query *qq) {
    for (int g = 0; g < NG; g++) {
        float d[KS_ATTN2_MAX_HD / 32];
        ks_quantize_query_q8(qs + (size_t)g * hd, hd, qq->qi[g], qq->qu[g], d);
        for (int b = 0; b < hd / 32; b++)
            for (int l = g; l < 8; l += NG) qq->qd[b][l] = d[b];
    }
}

/* r[a] = sum of the int32 lanes of a[a] (ks_avx2_reduce8's butterfly, exact) */
INL __m256i reduce8_epi32(const __m256i a[8]) {
    __m256i h01 = _mm256_hadd_epi32(a[0], a[1]), h23 = _mm256_hadd_epi32(a[2], a[3]);
    __m256i h45 = _mm256_hadd_epi32(a[4], a[5]), h67 = _mm256_hadd_epi32(a[6], a[7]);
    __m256i l = _mm256_hadd_epi32(h01, h23), h = _mm256_hadd_epi32(h45, h67);
    return _mm256_add_epi32(_mm256_permute2x128_si256(l, h, 0x20), _mm256_permute2x128_si256(l, h, 0x31));
}

/* lane l: row l / NG's block scale, from the f16 at each row's block start */
INL __m256 q8_row_scales(const uint8_t *const *blk, const int NG) {
    float d[8];
    for (int r = 0; r < 8 / NG; r++) {
        uint16_t h;
        memcpy(&h, blk[r], 2);
        d[r] = _cvtsh_ss(h);
    }
    if (NG == 4) return _mm256_set_m128(_mm_set1_ps(d[1]), _mm_set1_ps(d[0]));
    if (NG == 2) return _mm256_setr_ps(d[0], d[0], d[1], d[1], d[2], d[2], d[3], d[3]);
    return _mm256_setr_ps(d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]);
}

/* score_rows for Q8_0 rows against the quantised query: per 32-block the
 * (row, head) integer dot products, reduced in int32, then scaled into the
 * float sums.  VNNI: one vpdpbusd per (row, head, block); otherwise the sign
 * trick, three ops. */
#define SCORE_ROWS_Q8_BODY(DOT_ROW)                                                                \
    do {                                                                                           \
        const int rps = 8 / NG;                                                                    \
        __m256 s = _mm256_setzero_ps();                                                            \
        for (int b = 0; b < hd / 32; b++) {                                                        \
            const uint8_t *blk[8];                                                                 \
            _Pragma("GCC unroll 8") for (int r = 0; r < rps; r++) blk[r] = k[r] + 34 * (size_t)b;  \
            __m256i acc[8];                                                                        \
            _Pragma("GCC unroll 8") for (int r = 0; r < rps; r++) {                                \
                __m256i kb = _mm256_loadu_si256((const __m256i *)(blk[r] + 2));                    \
                DOT_ROW;                                                                           \
            }                                                                                      \
            __m256 sc = _mm256_mul_ps(q8_row_scales(blk, NG), _mm256_loadu_ps(qq->qd[b]));         \
            s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce8_epi32(acc)), sc, s);                    \
        }                                                                                          \
        *mx = _mm256_max_ps(*mx, s); /* padded lanes repeat row 0's scores: harmless for a max */  \
        if (nr == rps) {                                                                           \
            _mm256_storeu_ps(dst, s);                                                              \
        } else {                                                                                   \
            float tmp8[8];                                                                         \
            _mm256_storeu_ps(tmp8, s);                                                             \
            memcpy(dst, tmp8, sizeof(float) * (size_t)(nr * NG));                                  \
        }                                                                                          \
    } while (0)

INL void score_rows_q8_avx2(const uint8_t *const *k, const void *qsv, int hd, const int NG, float *dst, int nr,
                            __m256 *mx) {
    const q8_query *qq = qsv;
    const __m256i ones = _mm256_set1_epi16(1);
    SCORE_ROWS_Q8_BODY({
        __m256i ka = _mm256_abs_epi8(kb);
        _Pragma("GCC unroll 4") for (int g = 0; g < NG; g++) {
            __m256i qv = _mm256_loadu_si256((const __m256i *)(qq->qi[g] + 32 * b));
            acc[r * NG + g] = _mm256_madd_epi16(_mm256_maddubs_epi16(ka, _mm256_sign_epi8(qv, kb)), ones);
        }
    });
}

INL_VNNI void score_rows_q8_vnni(const uint8_t *const *k, const void *qsv, int hd, const int NG, float *dst, int nr,
                                 __m256 *mx) {
    const q8_query *qq = qsv;
    const __m256i u128 = _mm256_set1_epi8((char)0x80);
    SCORE_ROWS_Q8_BODY({
        __m256i neg = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_dpbusd_epi32(_mm256_setzero_si256(), u128, kb));
        _Pragma("GCC unroll 4") for (int g = 0; g < NG; g++)
            acc[r * NG + g] = _mm256_dpbusd_epi32(neg, _mm256_loadu_si256((const __m256i *)(qq->qu[g] + 32 * b)), kb);
    });
}

INL void score_rows_f16(const uint8_t *const *k, const void *qs, int hd, const int NG, float *dst, int nr, __m256 *mx) {
    score_rows(k, qs, hd, NG, 0, dst, nr, mx);
}

/* Softmax numerators over t of each head lane of scores[len][ng] (ng in 1,
 * 2, 4): exp(s - max) in place; inv[g] = 1 / sum for head g. */
TGT void ks_attn2_softmax_lanes(float *scores, int len, int ng, float inv[4]) {
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

TGT void ks_attn2_normalize_lanes(float *scores, int len, int ng, const float inv[4]) {
    float iv8[8];
    for (int l = 0; l < 8; l++) iv8[l] = inv[l % ng];
    __m256 iv = _mm256_loadu_ps(iv8);
    int n = ng * len, i;
    for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(scores + i, _mm256_mul_ps(_mm256_loadu_ps(scores + i), iv));
    for (; i < n; i++) scores[i] *= inv[i % ng];
}

/* A stretch of consecutive rows (rb bytes apart) of one block. */
typedef struct attn2_run {
    const uint8_t *row; /* first row */
    int n;              /* rows */
} attn2_run;

/* The next block from the walk (*si, *sj): its rows' K pointers into kp
 * [ATTN2_BLOCK_MAX], its V rows as runs of consecutive rows (the value loop
 * then steps a row by one add instead of loading a pointer per row and
 * slice), its row count; *frag is set when it merged runs. */
INL int next_block(const ks_kv_seg *segs, int nseg, size_t rb, int *si, int *sj, const uint8_t **kp,
                   attn2_run *vruns, int *nvrun, int *frag) {
    int n = 0, nr = 0;
    while (*si < nseg && n < ATTN2_BLOCK_MAX) {
        int left = segs[*si].len - *sj, take = left < ATTN2_BLOCK_MAX - n ? left : ATTN2_BLOCK_MAX - n;
        const uint8_t *k = (const uint8_t *)segs[*si].K + (size_t)*sj * rb;
        for (int j = 0; j < take; j++) kp[n + j] = k + (size_t)j * rb;
        if (take > 0) vruns[nr++] = (attn2_run){(const uint8_t *)segs[*si].V + (size_t)*sj * rb, take};
        n += take;
        *sj += take;
        if (*sj == segs[*si].len) ++*si, *sj = 0;
        if (n >= ATTN2_BLOCK_MIN) break; /* a page, or a piece of a long one */
    }
    *nvrun = nr;
    *frag = nr > 1;
    return n;
}

/* One head group in one pass over the segments, block by block: the block's
 * scores [n][NG] (lane mod NG = head), the running max and denominator per
 * head (accumulators rescaled when the max grows), then the block's V rows
 * weighted in, slice by slice of the head dim while the block is in L1.  A
 * page's K and V rows are read back to back, so a head is one forward
 * stream in the paged layout.  The result depends only on the rows and on where
 * blocks fall, which the segments fix: a policy that selects every page
 * gets dense output bit for bit.  With want_probs the raw scores are kept in
 * scores[total][NG] and become probabilities at the end.  Outputs are
 * normalised at the end (hd values per head, not one per row). */
/* A block's scores sc[n][NG] from its K rows kp[n] (prefetching the first
 * pf rows of kp_next); returns mx maxed with them, lane by lane.  A function
 * of its own, not inlined: inlined into the block loop, the compiler spills
 * its eight accumulators. */
#define SCORE_BLOCK_FN(NAME, HD, NG, ROWS, TGTA)                                                               \
    TGTA __attribute__((noinline)) static __m256 NAME(const uint8_t *const *kp, int n, const uint8_t *const *kp_next, \
                                                     int pf, int hd_rt, size_t rb, const void *qs, float *sc,   \
                                                     __m256 mx) {                                               \
        const int hd = (HD) ? (HD) : hd_rt, rps = 8 / (NG);                                                    \
        for (int t = 0; t < n; t += rps) {                                                                     \
            const uint8_t *k[8];                                                                               \
            int nr = n - t < rps ? n - t : rps;                                                                \
            for (int r = 0; r < rps; r++) {                                                                    \
                k[r] = kp[r < nr ? t + r : t]; /* padded rows repeat a real one: harmless for the max */       \
                if (t + r < pf) prefetch_row(kp_next[t + r], rb);                                              \
            }                                                                                                  \
            ROWS(k, qs, hd, NG, sc + (size_t)t * (NG), nr, &mx);                                               \
        }                                                                                                      \
        return mx;                                                                                             \
    }

typedef __m256 (*score_block_fn)(const uint8_t *const *kp, int n, const uint8_t *const *kp_next, int pf, int hd,
                                 size_t rb, const void *qs, float *sc, __m256 mx);

/* 8-bit V on integer units, one block (the plan of attn_avx512.c's
 * q8_values, in ymm): the weights w[t][g] = p[t][g] * dv(t, b) of the
 * block's rows, per 32-element block b, are quantised to 7 bits with one
 * scale per (b, head), s = max_t w / 127, and sum_t wq * v is an exact int32
 * sum: rows taken four at a time, interleaved by unpacklo/hi_epi8 then
 * _epi16 so that a lane's four bytes are the four rows at one d, then
 * maddubs + madd (u8 x s8 pairs: 2 * 127 * 128 < 2^15, no saturation) or one
 * vpdpbusd; the int32 sums go to the f32 sums once per block, times s.
 * Seven bits, not eight, so that maddubs cannot saturate and both variants
 * give the same sums bit for bit; a weight's rounding error is at most
 * s / 2 = max_t w / 254.
 * acc_mem [NG][hd] holds d in the unpacks' order: index 32b + 8e + 4k + j
 * is d = 32b + 16k + 4e + j (q8v_unpermute undoes it at the end).
 * Rows past n (a short block) read row 0 with weight 0. */
#define Q8V_BODY(NG, DOT)                                                                                  \
    do {                                                                                                   \
        const int nb = hd / 32, np = (n + 3) & ~3;                                                         \
        const uint8_t *rows[ATTN2_BLOCK_MAX];                                                              \
        uint16_t hs[KS_ATTN2_MAX_HD / 32][ATTN2_BLOCK_MAX] __attribute__((aligned(16))); /* [b][t] dv */   \
        float pt[ATTN2_BLOCK_MAX / 4][4][4] __attribute__((aligned(32)));   /* [t4][head][j] p */          \
        float wf[ATTN2_BLOCK_MAX / 4][16] __attribute__((aligned(32)));     /* one block's w, [t4][g][j] */ \
        int32_t wq[ATTN2_BLOCK_MAX / 4][KS_ATTN2_MAX_HD / 32][4];         /* [t4][b][slot] 4 rows' bytes */ \
        float sc[KS_ATTN2_MAX_HD / 32][4];                                  /* [b][slot] weight scale */   \
        int t = 0;                                                                                         \
        for (int r = 0; r < nvr; r++)                                                                      \
            for (int j = 0; j < vr[r].n; j++, t++) rows[t] = vr[r].row + (size_t)j * rb;                   \
        for (; t < np; t++) rows[t] = rows[0];                                                             \
        for (t = 0; t < np; t++)                                                                           \
            for (int b = 0; b < nb; b++) {                                                                 \
                uint16_t h = 0;                                                                            \
                if (t < n) memcpy(&h, rows[t] + 34 * (size_t)b, 2);                                        \
                hs[b][t] = h;                                                                              \
            }                                                                                              \
        /* p [t][NG] -> pt [t4][head][j]: whole groups of four rows by shuffles, a short last one by hand */ \
        for (t = 0; t + 4 <= n; t += 4) {                                                                  \
            if ((NG) == 4) {                                                                               \
                __m128 r0 = _mm_loadu_ps(p_blk + 4 * t), r1 = _mm_loadu_ps(p_blk + 4 * t + 4);             \
                __m128 r2 = _mm_loadu_ps(p_blk + 4 * t + 8), r3 = _mm_loadu_ps(p_blk + 4 * t + 12);        \
                _MM_TRANSPOSE4_PS(r0, r1, r2, r3);                                                         \
                _mm_store_ps(pt[t / 4][0], r0), _mm_store_ps(pt[t / 4][1], r1);                            \
                _mm_store_ps(pt[t / 4][2], r2), _mm_store_ps(pt[t / 4][3], r3);                            \
            } else if ((NG) == 2) {                                                                        \
                _mm256_store_ps(pt[t / 4][0], _mm256_permutevar8x32_ps(_mm256_loadu_ps(p_blk + 2 * t),     \
                                                                      _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7))); \
            } else {                                                                                       \
                _mm_store_ps(pt[t / 4][0], _mm_loadu_ps(p_blk + t));                                       \
                _mm_store_ps(pt[t / 4][1], _mm_setzero_ps()); /* NG 1: the second slot zero */             \
            }                                                                                              \
        }                                                                                                  \
        for (; t < np; t++)                                                                                \
            for (int g = 0; g < ((NG) == 1 ? 2 : (NG)); g++)                                               \
                pt[t / 4][g][t % 4] = t < n && g < (NG) ? p_blk[t * (NG) + g] : 0.0f;                      \
        { /* the next block's V rows, while this one computes */                                           \
            int pr = 0, po = 0;                                                                            \
            for (int i = 0; i < pf; i++) {                                                                 \
                prefetch_row(vr_next[pr].row + (size_t)po * rb, rb);                                       \
                if (++po == vr_next[pr].n) pr++, po = 0;                                                   \
            }                                                                                              \
        }                                                                                                  \
        /* quantise: lanes [g][j] (NG = 4: two ymm, g 0-1 and 2-3) */                                      \
        for (int b = 0; b < nb; b++) {                                                                     \
            __m256 m0 = _mm256_setzero_ps(), m1 = m0;                                                      \
            for (int t4 = 0; t4 < np / 4; t4++) {                                                          \
                __m128 d4 = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)&hs[b][4 * t4]));                \
                __m256 d8 = _mm256_set_m128(d4, d4);                                                       \
                __m256 w0 = _mm256_mul_ps(_mm256_load_ps(&pt[t4][0][0]), d8);                              \
                _mm256_store_ps(&wf[t4][0], w0);                                                           \
                m0 = _mm256_max_ps(m0, w0);                                                                \
                if ((NG) == 4) {                                                                           \
                    __m256 w1 = _mm256_mul_ps(_mm256_load_ps(&pt[t4][2][0]), d8);                          \
                    _mm256_store_ps(&wf[t4][8], w1);                                                       \
                    m1 = _mm256_max_ps(m1, w1);                                                            \
                }                                                                                          \
            }                                                                                              \
            /* each 4-lane group (a head) to its max */                                                    \
            m0 = _mm256_max_ps(m0, _mm256_permute_ps(m0, _MM_SHUFFLE(2, 3, 0, 1)));                        \
            m0 = _mm256_max_ps(m0, _mm256_permute_ps(m0, _MM_SHUFFLE(1, 0, 3, 2)));                        \
            m1 = _mm256_max_ps(m1, _mm256_permute_ps(m1, _MM_SHUFFLE(2, 3, 0, 1)));                        \
            m1 = _mm256_max_ps(m1, _mm256_permute_ps(m1, _MM_SHUFFLE(1, 0, 3, 2)));                        \
            const __m256 zero = _mm256_setzero_ps(), wmax = _mm256_set1_ps(127.0f);                        \
            __m256 i0 = _mm256_and_ps(_mm256_div_ps(wmax, m0), _mm256_cmp_ps(m0, zero, _CMP_GT_OQ));       \
            __m256 i1 = _mm256_and_ps(_mm256_div_ps(wmax, m1), _mm256_cmp_ps(m1, zero, _CMP_GT_OQ));       \
            float mm[16];                                                                                  \
            _mm256_storeu_ps(mm, m0);                                                                      \
            _mm256_storeu_ps(mm + 8, m1);                                                                  \
            for (int g = 0; g < (NG); g++) sc[b][g] = mm[4 * g] * (1.0f / 127.0f);                         \
            for (int t4 = 0; t4 < np / 4; t4++) {                                                          \
                __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(&wf[t4][0]), i0));            \
                __m256i q1 = (NG) == 4 ? _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(&wf[t4][8]), i1)) \
                                       : q0;                                                               \
                /* bytes: 128-bit lane 0 [g0 g2], lane 1 [g1 g3] (NG 2: [g0 g0], [g1 g1]): the unpack */   \
                /* of the lanes' low dwords puts head g's four bytes in dword g */                         \
                __m256i b8 = _mm256_packus_epi16(_mm256_packs_epi32(q0, q1), _mm256_setzero_si256());      \
                _mm_storeu_si128((__m128i *)wq[t4][b], _mm_unpacklo_epi32(_mm256_castsi256_si128(b8),      \
                                                                          _mm256_extracti128_si256(b8, 1))); \
            }                                                                                              \
        }                                                                                                  \
        float al[8];                                                                                       \
        _mm256_storeu_ps(al, alpha);                                                                       \
        for (int b = 0; b < nb; b++)                                                                       \
            _Pragma("GCC unroll 2") for (int u = 0; u < 2; u++) {                                          \
                __m256i acc[4][2];                                                                         \
                _Pragma("GCC unroll 4") for (int g = 0; g < (NG); g++) acc[g][0] = acc[g][1] = _mm256_setzero_si256(); \
                for (int t4 = 0; t4 < np / 4; t4++) {                                                      \
                    const uint8_t *const *r4 = rows + 4 * t4;                                              \
                    __m256i x0 = _mm256_loadu_si256((const __m256i *)(r4[0] + 34 * (size_t)b + 2));        \
                    __m256i x1 = _mm256_loadu_si256((const __m256i *)(r4[1] + 34 * (size_t)b + 2));        \
                    __m256i x2 = _mm256_loadu_si256((const __m256i *)(r4[2] + 34 * (size_t)b + 2));        \
                    __m256i x3 = _mm256_loadu_si256((const __m256i *)(r4[3] + 34 * (size_t)b + 2));        \
                    __m256i a = u ? _mm256_unpackhi_epi8(x0, x1) : _mm256_unpacklo_epi8(x0, x1);            \
                    __m256i c = u ? _mm256_unpackhi_epi8(x2, x3) : _mm256_unpacklo_epi8(x2, x3);            \
                    __m256i o0 = _mm256_unpacklo_epi16(a, c), o1 = _mm256_unpackhi_epi16(a, c);            \
                    _Pragma("GCC unroll 4") for (int g = 0; g < (NG); g++) {                               \
                        __m256i w = _mm256_set1_epi32(wq[t4][b][g]);                         \
                        acc[g][0] = DOT(acc[g][0], w, o0);                                                 \
                        acc[g][1] = DOT(acc[g][1], w, o1);                                                 \
                    }                                                                                      \
                }                                                                                          \
                _Pragma("GCC unroll 4") for (int g = 0; g < (NG); g++) {                                   \
                    __m256 s = _mm256_set1_ps(sc[b][g]), a = _mm256_set1_ps(al[g]);                        \
                    _Pragma("GCC unroll 2") for (int e = 0; e < 2; e++) {                                  \
                        float *f = acc_mem + (size_t)g * hd + 32 * b + 16 * u + 8 * e;                     \
                        _mm256_store_ps(f, _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[g][e]), s,               \
                                                           _mm256_mul_ps(_mm256_load_ps(f), a)));          \
                    }                                                                                      \
                }                                                                                          \
            }                                                                                              \
    } while (0)
#define Q8V_DOT_AVX2(acc, w, v) _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, v), _mm256_set1_epi16(1)))
#define Q8V_DOT_VNNI(acc, w, v) _mm256_dpbusd_epi32(acc, w, v)
typedef void (*q8v_block_fn)(const attn2_run *vr, int nvr, int n, const attn2_run *vr_next, int pf, size_t rb, int hd,
                             const float *p_blk, __m256 alpha, float *acc_mem);
#define Q8V_BLOCK_FN(NAME, NG, TGTA, DOT)                                                                  \
    TGTA __attribute__((noinline)) static void NAME(const attn2_run *vr, int nvr, int n, const attn2_run *vr_next, \
                                                   int pf, size_t rb, int hd, const float *p_blk, __m256 alpha, \
                                                   float *acc_mem) {                                       \
        Q8V_BODY(NG, DOT);                                                                                 \
    }
Q8V_BLOCK_FN(q8v_block_1, 1, TGT, Q8V_DOT_AVX2)
Q8V_BLOCK_FN(q8v_block_2, 2, TGT, Q8V_DOT_AVX2)
Q8V_BLOCK_FN(q8v_block_4, 4, TGT, Q8V_DOT_AVX2)
Q8V_BLOCK_FN(q8v_block_vnni_1, 1, TGT_VNNI, Q8V_DOT_VNNI)
Q8V_BLOCK_FN(q8v_block_vnni_2, 2, TGT_VNNI, Q8V_DOT_VNNI)
Q8V_BLOCK_FN(q8v_block_vnni_4, 4, TGT_VNNI, Q8V_DOT_VNNI)

/* acc_mem's q8v order back to d order, one head of hd */
static void q8v_unpermute(float *a, int hd) {
    float tmp[KS_ATTN2_MAX_HD];
    for (int b = 0; b < hd / 32; b++)
        for (int e = 0; e < 4; e++)
            for (int k = 0; k < 2; k++)
                for (int j = 0; j < 4; j++) tmp[32 * b + 16 * k + 4 * e + j] = a[32 * b + 8 * e + 4 * k + j];
    memcpy(a, tmp, sizeof(float) * (size_t)hd);
}

INL void decode_group(const ks_kv_seg *segs, int nseg, int total, int hd, size_t rb, int NG, const int KT, int g0,
                      int ng, const void *qs, float *scores, float *out, bool want_probs, score_block_fn score_block,
                      q8v_block_fn q8v_block, const float *sinks) {
    const int SL = 8 / NG; /* ymm per head per V slice of 64 / NG floats */
    float acc_mem[4 * KS_ATTN2_MAX_HD] __attribute__((aligned(32))); /* [NG][hd] running sums */
    float s_blk[4 * ATTN2_BLOCK_MAX + 8] __attribute__((aligned(32)));  /* [row][NG] raw scores */
    float p_blk[4 * ATTN2_BLOCK_MAX + 8] __attribute__((aligned(32)));  /* [row][NG] exp(s - max) */
    const uint8_t *kp[2][ATTN2_BLOCK_MAX];
    attn2_run vr[2][ATTN2_BLOCK_MAX];
    int nvr[2], frag[2];
    memset(acc_mem, 0, sizeof(float) * (size_t)NG * hd);
    __m256 run_max = _mm256_set1_ps(-INFINITY), run_sum = _mm256_setzero_ps(); /* lanes mod NG = head */
    int si = 0, sj = 0, cur = 0, done = 0;
    int n = next_block(segs, nseg, rb, &si, &sj, kp[0], vr[0], &nvr[0], &frag[0]);
    while (n > 0) {
        const int nx = cur ^ 1;
        int nn = next_block(segs, nseg, rb, &si, &sj, kp[nx], vr[nx], &nvr[nx], &frag[nx]);
        int pf = frag[cur] || frag[nx] ? nn : 0; /* rows of the next block to prefetch */
        if (!pf) { /* a contiguous run: its streams, ahead */
            for (int r = 0; r < n; r++) prefetch_stream(kp[cur][r], rb);
            for (int r = 0; r < nvr[cur]; r++)
                for (int j = 0; j < vr[cur][r].n; j++) prefetch_stream(vr[cur][r].row + (size_t)j * rb, rb);
        }
        float *sc = want_probs ? scores + (size_t)done * NG : s_blk;
        __m256 blk_max = score_block(kp[cur], n, kp[nx], pf, hd, rb, qs, sc, run_max);
        FOLD_LANES(blk_max, NG, _mm256_max_ps);
        __m256 alpha = ks_avx2_exp_neg(_mm256_sub_ps(run_max, blk_max)); /* exp(-inf) clamps to ~1e-38 */
        run_max = blk_max;
        __m256 psum = _mm256_setzero_ps();
        int nv = n * NG, i = 0;
        for (; i + 8 <= nv; i += 8) {
            __m256 e = ks_avx2_exp_neg(_mm256_sub_ps(_mm256_loadu_ps(sc + i), run_max));
            _mm256_store_ps(p_blk + i, e);
            psum = _mm256_add_ps(psum, e);
        }
        if (i < nv) { /* the tail through one vector, lanes past it zeroed (8 | i: lane k is head k mod NG) */
            float x[8] = {0};
            memcpy(x, sc + i, sizeof(float) * (size_t)(nv - i));
            __m256 live = _mm256_cmp_ps(_mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_ps((float)(nv - i)), _CMP_LT_OQ);
            __m256 e = _mm256_and_ps(ks_avx2_exp_neg(_mm256_sub_ps(_mm256_loadu_ps(x), run_max)), live);
            _mm256_store_ps(p_blk + i, e);
            psum = _mm256_add_ps(psum, e);
        }
        FOLD_LANES(psum, NG, _mm256_add_ps);
        run_sum = _mm256_fmadd_ps(run_sum, alpha, psum);
        if (KT == 1) {
            q8v_block(vr[cur], nvr[cur], n, vr[nx], pf, rb, hd, p_blk, alpha, acc_mem);
            done += n;
            n = nn;
            cur = nx;
            continue;
        }
        float al[8];
        _mm256_storeu_ps(al, alpha);
        for (int x = 0; x < hd; x += 8 * SL) {
            __m256 acc[4][8];
            _Pragma("GCC unroll 4") for (int g = 0; g < NG; g++) {
                __m256 a = _mm256_set1_ps(al[g]);
                _Pragma("GCC unroll 8") for (int j = 0; j < SL; j++)
                    acc[g][j] = _mm256_mul_ps(_mm256_load_ps(acc_mem + (size_t)g * hd + x + 8 * j), a);
            }
            const float *pp = p_blk;
            int pr = 0, po = 0, pleft = x == 0 ? pf : 0; /* next block's V rows to prefetch: run pr, offset po */
            for (int r = 0; r < nvr[cur]; r++) {
                const uint8_t *row = vr[cur][r].row;
                for (int j = 0; j < vr[cur][r].n; j++, row += rb, pp += NG) {
                    if (pleft > 0) {
                        pleft--;
                        prefetch_row(vr[nx][pr].row + (size_t)po * rb, rb);
                        if (++po == vr[nx][pr].n) pr++, po = 0;
                    }
                    __m256 pv[4];
                    _Pragma("GCC unroll 4") for (int g = 0; g < NG; g++) pv[g] = _mm256_broadcast_ss(pp + g);
                    _Pragma("GCC unroll 8") for (int l = 0; l < SL; l++) {
                        __m256 vv = load8(row, x + 8 * l, 0);
                        _Pragma("GCC unroll 4") for (int g = 0; g < NG; g++)
                            acc[g][l] = _mm256_fmadd_ps(pv[g], vv, acc[g][l]);
                    }
                }
            }
            _Pragma("GCC unroll 4") for (int g = 0; g < NG; g++)
                _Pragma("GCC unroll 8") for (int j = 0; j < SL; j++)
                    _mm256_store_ps(acc_mem + (size_t)g * hd + x + 8 * j, acc[g][j]);
        }
        done += n;
        n = nn;
        cur = nx;
    }
    KS_ASSERT(done == total);
    float sums[8], mxs[8];
    _mm256_storeu_ps(sums, run_sum);
    _mm256_storeu_ps(mxs, run_max);
    if (sinks) { /* the sink joins the denominator (attn.h); lane l holds head l % NG */
        for (int l = 0; l < 8; l++)
            if (l % NG < ng) sums[l] += expf(sinks[l % NG] - mxs[l]);
        run_sum = _mm256_loadu_ps(sums);
    }
    for (int g = 0; g < ng; g++) {
        if (KT == 1) q8v_unpermute(acc_mem + (size_t)g * hd, hd);
        __m256 inv = _mm256_set1_ps(1.0f / sums[g]);
        for (int i = 0; i < hd; i += 8)
            _mm256_storeu_ps(out + (size_t)(g0 + g) * hd + i, _mm256_mul_ps(_mm256_load_ps(acc_mem + (size_t)g * hd + i), inv));
    }
    if (want_probs) { /* scores -> probabilities, for the policies that accumulate attention weights */
        __m256 inv = _mm256_div_ps(_mm256_set1_ps(1.0f), run_sum);
        int nv = total * NG, i = 0;
        for (; i + 8 <= nv; i += 8)
            _mm256_storeu_ps(scores + i, _mm256_mul_ps(ks_avx2_exp_neg(_mm256_sub_ps(_mm256_loadu_ps(scores + i), run_max)), inv));
        for (; i < nv; i++) {
            int g = i % NG;
            float x8[8] = {scores[i] - mxs[g]}, e8[8];
            _mm256_storeu_ps(e8, ks_avx2_exp_neg(_mm256_loadu_ps(x8)));
            scores[i] = e8[0] / sums[g];
        }
    }
}

/* VKT: the V rows' type for load8; ROWS, TGTA: the score rows and their
 * target; VBLK: the 8-bit V block functions (VBLK##_NG; q8v_none: f16) */
#define q8v_none_1 NULL
#define q8v_none_2 NULL
#define q8v_none_4 NULL
#define GROUP_FN_X(NAME, HD, NG, VKT, ROWS, TGTA, VBLK)                                                         \
    SCORE_BLOCK_FN(NAME##_scores, HD, NG, ROWS, TGTA)                                                           \
    TGT static void NAME(const ks_kv_seg *segs, int nseg, int total, int hd_rt, size_t rb, int g0, int ng,       \
                         const void *qs, float *scores, float *out, bool want_probs, const float *sinks) {       \
        decode_group(segs, nseg, total, (HD) ? (HD) : hd_rt, rb, NG, VKT, g0, ng, qs, scores, out, want_probs,  \
                     NAME##_scores, VBLK##_##NG, sinks);                                                       \
    }
/* the three group widths (NGP 1, 2, 4) of one kind */
#define GROUP_FNS(NAME, HD, VKT, ROWS, TGTA, VBLK)             \
    GROUP_FN_X(NAME##_1, HD, 1, VKT, ROWS, TGTA, VBLK)         \
    GROUP_FN_X(NAME##_2, HD, 2, VKT, ROWS, TGTA, VBLK)         \
    GROUP_FN_X(NAME##_4, HD, 4, VKT, ROWS, TGTA, VBLK)
GROUP_FNS(group_64, 64, 0, score_rows_f16, TGT, q8v_none)
GROUP_FNS(group_128, 128, 0, score_rows_f16, TGT, q8v_none)
GROUP_FNS(group_any, 0, 0, score_rows_f16, TGT, q8v_none)
/* 8-bit KV (hd a multiple of 32): integer scores and values, AVX2 or VNNI;
 * hd 64 (the Llama-3 shape's) gets its own instances, other head dims one
 * generic each */
GROUP_FNS(group_q8_64, 64, 1, score_rows_q8_avx2, TGT, q8v_block)
GROUP_FNS(group_q8, 0, 1, score_rows_q8_avx2, TGT, q8v_block)
GROUP_FNS(group_q8v_64, 64, 1, score_rows_q8_vnni, TGT_VNNI, q8v_block_vnni)
GROUP_FNS(group_q8v, 0, 1, score_rows_q8_vnni, TGT_VNNI, q8v_block_vnni)

typedef void (*group_fn)(const ks_kv_seg *, int, int, int, size_t, int, int, const void *, float *, float *, bool,
                         const float *);
/* [f16 hd 64, f16 hd 128, f16 other hd, 8-bit hd 64, 8-bit, VNNI 8-bit hd 64, VNNI 8-bit][NGP 1, 2, 4] */
static const group_fn group_fns[7][3] = {{group_64_1, group_64_2, group_64_4},
                                         {group_128_1, group_128_2, group_128_4},
                                         {group_any_1, group_any_2, group_any_4},
                                         {group_q8_64_1, group_q8_64_2, group_q8_64_4},
                                         {group_q8_1, group_q8_2, group_q8_4},
                                         {group_q8v_64_1, group_q8v_64_2, group_q8v_64_4},
                                         {group_q8v_1, group_q8v_2, group_q8v_4}};

bool ks_attention_segs_avx2(ks_kv_type kt, const ks_kv_seg *segs, int nseg, int total, int hd, int G, const float *q,
                            float *scores, float *out, float scale, float *weights, const float *sinks) {
    if (hd % 16 || hd > KS_ATTN2_MAX_HD || (kt != KS_KV_F16 && (kt != KS_KV_Q8 || hd % 32))) return false;
    size_t rb = ks_kv_row_bytes(kt, hd);
    for (int g0 = 0; g0 < G; g0 += 4) {
        int ng = G - g0 < 4 ? G - g0 : 4;
        /* the group padded to 1, 2 or 4 heads; a V slice (64 / NGP floats) must divide hd */
        int NGP = ng == 1 ? 1 : ng == 2 ? 2 : 4;
        while (NGP < 4 && hd % (64 / NGP)) NGP *= 2;
        float qs[4 * KS_ATTN2_MAX_HD]; /* [NGP][hd] scaled queries, padded heads zero */
        for (int g = 0; g < NGP; g++)
            for (int i = 0; i < hd; i++) qs[g * hd + i] = g < ng ? q[(size_t)(g0 + g) * hd + i] * scale : 0.0f;
        int kind = hd == 64 ? 0 : hd == 128 ? 1 : 2;
        const void *qarg = qs;
        q8_query qq;
        if (kt == KS_KV_Q8) { /* the query quantised once for all the rows */
            q8_query_init(qs, hd, NGP, &qq);
            qarg = &qq;
            kind = (ks_simd_current() >= KS_SIMD_AVX512 ? 5 : 3) + (hd == 64 ? 0 : 1);
        }
        group_fns[kind][NGP == 4 ? 2 : NGP - 1](segs, nseg, total, hd, rb, g0, ng, qarg, scores, out, weights != NULL,
                                                sinks ? sinks + g0 : NULL);
        if (weights)
            for (int t = 0; t < total; t++)
                for (int g = 0; g < ng; g++) weights[t] += scores[(size_t)NGP * t + g];
    }
    return true;
}

#else
bool ks_attention_segs_avx2(ks_kv_type kt, const ks_kv_seg *segs, int nseg, int total, int hd, int G, const float *q,
                            float *scores, float *out, float scale, float *weights, const float *sinks) {
    (void)kt, (void)segs, (void)nseg, (void)total, (void)hd, (void)G, (void)q, (void)scores, (void)out, (void)scale;
    (void)weights, (void)sinks;
    return false;
}
#endif
