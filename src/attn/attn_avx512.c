/*
 * attn_avx512.c — grouped decode attention over f16 KV segments, AVX-512.
 *
 * Long-context decode is bound by reading the KV cache, so the kernel's job
 * is to keep up with memory: every K and V row is converted from f16 once and
 * used by all query heads of its GQA group, and nothing but the scores leaves
 * the registers.
 *  - One pass, page by page (online softmax): a page's K rows give its
 *    scores, the running max and denominator are updated (the accumulators
 *    rescaled when the max grows), then the same page's V rows are weighted
 *    in.  A head is then one forward stream where a page is K rows then V
 *    rows (slow tier, gather buffer) and two where K and V live in regions
 *    of their own (fast tier, slots), which the hardware prefetchers follow.
 *    A kernel that read all K, then all V, would read the paged layout as
 *    small pieces with holes between them, which the prefetchers do not
 *    follow.
 *  - Scores: four rows x a group of up to 4 heads give 16 zmm partial dot
 *    products, reduced together by one unpack/shuffle butterfly into a
 *    16-vector that is already in the row-major layout [row][4 heads]; no
 *    horizontal sum per score.  exp is a polynomial (relative error ~2e-7).
 *  - V: the page's rows are accumulated into registers per head group
 *    (hd 64: 4 heads x 4 zmm; hd 128: 2 heads x 8 zmm, two passes over the
 *    page while it is in L1).
 * Only head dims 64 and 128 (nearly every current model) take this path; the
 * caller falls back to the AVX2 or portable kernel otherwise.
 *
 * 8-bit KV (Q8_0 rows) runs the same body (DECODE_BODY's KQ8) on integer
 * units: scores by zmm vpdpbusd against the group's query quantised once
 * per call, two 32-blocks of a row per zmm, the butterfly kept in int32 up
 * to the per-block scales (q8_score4); values by vpdpbusd too, the row's
 * block scale folded into the probabilities and these quantised to u8 per
 * block of rows (q8_values).  Held in cache, f32 FMAs over the values made
 * 8-bit KV slower than f16 (the conversions on top of the same FMA count);
 * one vpdpbusd does 64 multiply-adds where an FMA does 16.
 */
#include "attn/attn.h"

#include "core/core.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

#include "tensor/q8dot_avx512.h"
#include "tensor/simd_avx512.h"

/* Rows of a block: the unit of the online softmax, and of the memory order.
 * A block is one page, so a page's K and V rows are read back to back;
 * blocks of two pages (K0 K1 V0 V1) would break the single forward stream
 * again.  Pages longer than this are taken in pieces
 * (two forward streams, K and V); runs shorter than BLOCK_MIN (token-level
 * selections) are merged into one block and the next block's rows are
 * prefetched, since their addresses follow no stream. */
enum { BLOCK_MAX = 32, BLOCK_MIN = 16 };
/* avx512vnni for the 8-bit KV scores (ks_simd_current() == AVX512 implies it) */
#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c")))
#define INL static inline __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c"), always_inline))

INL __m128 exp128(__m128 x) { return _mm512_castps512_ps128(ks_avx512_exp_neg(_mm512_castps128_ps512(x))); }

/* Every cache line of a row (a 256-byte f16 row at hd 128 spans four or
 * five): a token-level selection's rows are scattered, so neither the
 * hardware prefetcher nor a single-line hint covers the rest of the row.
 * Into L2, not L1: a block's worth of lines is more misses than L1 can keep
 * in flight, and L2 can (every third page of a head from DRAM, hd 128:
 * 20.5 ms without, 18-19 with L1 hints, 13-16 with L2 hints; contiguous
 * 29 ms for three times the bytes; attn_bench ... f16 128 2 3). */
INL void prefetch_row(const void *row, int bytes) {
    const char *p = (const char *)row;
    for (int o = 0; o < bytes; o += 64) _mm_prefetch(p + o, _MM_HINT_T1);
    _mm_prefetch(p + bytes - 1, _MM_HINT_T1);
}

/* A contiguous run's row, KS_STREAM_AHEAD bytes ahead (tensor/simd_avx2.h). */
INL void prefetch_stream(const void *row, int bytes) {
    ks_prefetch_lines((const char *)row + KS_STREAM_AHEAD, (size_t)bytes);
}

INL __m128 fold512(__m512 v) {
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* The four 128-bit lanes of v added: for a [4 rows][4 heads] vector, the
 * per-head sum. */
INL __m128 sum_lanes4(__m512 v) {
    return _mm_add_ps(_mm_add_ps(_mm512_castps512_ps128(v), _mm512_extractf32x4_ps(v, 1)),
                      _mm_add_ps(_mm512_extractf32x4_ps(v, 2), _mm512_extractf32x4_ps(v, 3)));
}

/* Scores of four Q8_0 rows (kp4: their starts as uint16 pointers) against
 * the four heads, in ks_avx512_reduce16's layout [row][head].  A zmm holds two 32-blocks
 * of a row (NZ zmm per row): vpdpbusd of the u8 query (q + 128) starting from
 * -128 * sum(k) (one more vpdpbusd per row) gives exact int32 lanes; the
 * butterfly's first three stages stay in int32 and leave each (row, head,
 * block) sum in a lane of its own, where it is scaled by d_k * d_q; the last
 * stage adds the blocks in float. */
INL __m512 q8_score4(const uint16_t *const *kp4, const ks_q8_query *qz, const int NZ) {
    const __m512i u128 = _mm512_set1_epi8((char)0x80), zero = _mm512_setzero_si512();
    const __m512i idx01 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i idx23 = _mm512_add_epi32(idx01, _mm512_set1_epi32(4));
    __m512 e01 = _mm512_setzero_ps(), e23 = _mm512_setzero_ps();
    _Pragma("GCC unroll 2") for (int c = 0; c < NZ; c++) {
        __m512i part[16];
        uint16_t h[8]; /* the rows' two block scales (f16) */
        _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++) {
            const uint8_t *row = (const uint8_t *)kp4[r] + 68 * (size_t)c;
            memcpy(&h[2 * r], row, 2);
            memcpy(&h[2 * r + 1], row + 34, 2);
            __m512i kz = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(row + 2))),
                                            _mm256_loadu_si256((const __m256i *)(row + 36)), 1);
            __m512i neg = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, u128, kz));
            _Pragma("GCC unroll 4") for (int g = 0; g < 4; g++)
                part[4 * r + g] = _mm512_dpbusd_epi32(neg, _mm512_load_si512(qz->qu[g] + 64 * c), kz);
        }
        __m512i a[8], cc[4];
        _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++)
            a[k] = _mm512_add_epi32(_mm512_unpacklo_epi32(part[2 * k], part[2 * k + 1]),
                                    _mm512_unpackhi_epi32(part[2 * k], part[2 * k + 1]));
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++)
            cc[j] = _mm512_add_epi32(_mm512_unpacklo_epi64(a[2 * j], a[2 * j + 1]),
                                     _mm512_unpackhi_epi64(a[2 * j], a[2 * j + 1]));
        /* [row 2j: block 2c, block 2c + 1 | row 2j + 1: ...] x 4 heads */
        __m512i i01 = _mm512_add_epi32(_mm512_shuffle_i32x4(cc[0], cc[1], 0x88), _mm512_shuffle_i32x4(cc[0], cc[1], 0xDD));
        __m512i i23 = _mm512_add_epi32(_mm512_shuffle_i32x4(cc[2], cc[3], 0x88), _mm512_shuffle_i32x4(cc[2], cc[3], 0xDD));
        __m128i hv = _mm_setr_epi16((short)h[0], (short)h[1], (short)h[2], (short)h[3], (short)h[4], (short)h[5],
                                    (short)h[6], (short)h[7]); /* built in registers, not stored and reloaded */
        __m512 dk = _mm512_castps256_ps512(_mm256_cvtph_ps(hv));
        __m512 dq = _mm512_load_ps(qz->dq[c]);
        e01 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i01), _mm512_mul_ps(_mm512_permutexvar_ps(idx01, dk), dq), e01);
        e23 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i23), _mm512_mul_ps(_mm512_permutexvar_ps(idx23, dk), dq), e23);
    }
    return _mm512_add_ps(_mm512_shuffle_f32x4(e01, e23, 0x88), _mm512_shuffle_f32x4(e01, e23, 0xDD));
}

/* Scores of sixteen Q8_0 rows against the four heads into sc[16][4]
 * (ks_q8_score16_heads, tensor/q8dot_avx512.h, then [head][row] -> [row][head]). */
INL void q8_score16(const uint16_t *const *kp, const ks_q8_query *qz, const int NZ, float *sc) {
    __m512 f[4];
    ks_q8_score16_heads(kp, qz, NZ, f);
    /* [head][row] -> [row][head] */
    __m512 lo01 = _mm512_unpacklo_ps(f[0], f[1]), hi01 = _mm512_unpackhi_ps(f[0], f[1]);
    __m512 lo23 = _mm512_unpacklo_ps(f[2], f[3]), hi23 = _mm512_unpackhi_ps(f[2], f[3]);
    __m512 z0 = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(lo01), _mm512_castps_pd(lo23)));
    __m512 z1 = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(lo01), _mm512_castps_pd(lo23)));
    __m512 z2 = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(hi01), _mm512_castps_pd(hi23)));
    __m512 z3 = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(hi01), _mm512_castps_pd(hi23)));
    /* z[m] lane L: row 4L + m */
    __m512 a = _mm512_shuffle_f32x4(z0, z1, 0x44), b = _mm512_shuffle_f32x4(z0, z1, 0xEE);
    __m512 c = _mm512_shuffle_f32x4(z2, z3, 0x44), d = _mm512_shuffle_f32x4(z2, z3, 0xEE);
    _mm512_storeu_ps(sc, _mm512_shuffle_f32x4(a, c, 0x88));
    _mm512_storeu_ps(sc + 16, _mm512_shuffle_f32x4(a, c, 0xDD));
    _mm512_storeu_ps(sc + 32, _mm512_shuffle_f32x4(b, d, 0x88));
    _mm512_storeu_ps(sc + 48, _mm512_shuffle_f32x4(b, d, 0xDD));
}

/* The next block from cursor (*si, *sj): its rows' K and V pointers into
 * kp/vp [BLOCK_MAX] and its row count; *frag is set when it merged runs. */
INL int next_block(const ks_kv_seg16 *segs, int nseg, int hd, int *si, int *sj, const uint16_t **kp,
                   const uint16_t **vp, int *frag) {
    int n = 0, runs = 0;
    while (*si < nseg && n < BLOCK_MAX) {
        int left = segs[*si].len - *sj, take = left < BLOCK_MAX - n ? left : BLOCK_MAX - n;
        const uint16_t *k = segs[*si].K + (size_t)*sj * hd, *v = segs[*si].V + (size_t)*sj * hd;
        for (int j = 0; j < take; j++) {
            kp[n + j] = k + (size_t)j * hd;
            vp[n + j] = v + (size_t)j * hd;
        }
        n += take, runs += take > 0;
        *sj += take;
        if (*sj == segs[*si].len) ++*si, *sj = 0;
        if (n >= BLOCK_MIN) break; /* a page, or a piece of a long one */
    }
    *frag = runs > 1;
    return n;
}

/* 8-bit V on integer units.  A block's output sum_t p[t][g] * V[t][d] has
 * V[t][d] = dv(t, blk(d)) * v[t][d] (Q8_0: one f16 scale per row and
 * 32-element block, int8 v); the scale is folded into the weight,
 * w[t][b][g] = p[t][g] * dv(t, b), and the weights of the block's rows are
 * quantised to u8 with one scale per (32-element block b, head g):
 * s = max_t w / 255, wq = round(w / s).  Then sum_t wq * v is exact in int32
 * by vpdpbusd (u8 x s8, four adjacent byte products per lane), once the V
 * rows are interleaved so that a lane's four bytes are four rows at the same
 * d (unpacklo/hi_epi8 then _epi16: row r's byte d lands in byte r of the
 * lane for d), and the int32 sums go to the f32 accumulators once per block,
 * times s.  A weight's rounding error is at most s / 2 = max_t w / 510: the
 * block's largest weights are kept to 0.2%, the small ones lose relative
 * precision but carry little of the sum.
 * The 64-byte half h of a row (blocks 2h, 2h + 1) is one zmm, so its
 * interleaved lanes are [block 2h: 128-bit lanes 0, 1 | block 2h + 1: 2, 3];
 * each half's dword weights for the four heads come from one 128-bit lane per
 * block (wq_lanes), broadcast into each 256-bit half and picked by vpshufd.
 * The accumulators' lanes are d in the order the unpacks leave them: the
 * f32 sums acc_mem[g][64h + 16m + 4k + j] hold d = 64h + 16k + 4m + j
 * (q8_unpermute puts them back at the end).
 * Rows are grouped by four for the interleave: hd 64, the quantised weights
 * of 8 rows are one zmm (rows 2k + tt, k = 0..3, form group tt); hd 128, of
 * 4 rows.  Rows past n (a short block) get weight 0 and read row 0. */
enum { Q8_WMAX = 255 };
INL void q8_values(const uint16_t *const *vp_in, int n, const uint16_t *const *vp_next, int pf, float *p_blk,
                   __m128 alpha, bool rescale, float *acc_mem, const int HDV) {
    const int NB = HDV / 2, NH = HDV / 4, U = HDV == 4 ? 8 : 4; /* blocks, 64-d halves, rows per weight zmm */
    const int np = (n + U - 1) / U * U;
    const uint16_t *vp[BLOCK_MAX];
    uint16_t hs[BLOCK_MAX * 4] __attribute__((aligned(16))); /* [row][block] f16 V scales */
    float wf[BLOCK_MAX * 16] __attribute__((aligned(64)));    /* [row][block][head] p * dv */
    __m512i wq[BLOCK_MAX / 4];                                /* quantised weights, U rows each */
    for (int t = 0; t < np; t++) {
        vp[t] = vp_in[t < n ? t : 0];
        for (int b = 0; b < NB; b++) hs[t * NB + b] = t < n ? vp[t][17 * b] : 0;
    }
    for (int i = 4 * n; i < 4 * np; i++) p_blk[i] = 0.0f;
    for (int r = 0; r < pf; r++) prefetch_row(vp_next[r], 17 * HDV);
    if (!pf) /* a contiguous run */
        for (int r = 0; r < n; r++) prefetch_stream(vp[r], 17 * HDV);
    const __m512i idx_d = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    __m512 mx = _mm512_setzero_ps(); /* weights are >= 0 */
    const int nz = np * NB / 4;      /* zmm of weights */
    for (int z = 0; z < nz; z++) {
        __m512 p, d;
        if (HDV == 4) { /* rows 2z, 2z + 1: [p(2z) p(2z) p(2z+1) p(2z+1)] x [dv(2z, 0) dv(2z, 1) ...] */
            p = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7, 4, 5, 6, 7),
                                      _mm512_castps256_ps512(_mm256_load_ps(p_blk + 8 * z)));
            d = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(hs + 4 * z))));
        } else { /* row z, blocks 0..3 */
            p = _mm512_broadcast_f32x4(_mm_load_ps(p_blk + 4 * z));
            d = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(hs + 4 * z))));
        }
        __m512 w = _mm512_mul_ps(p, _mm512_permutexvar_ps(idx_d, d));
        _mm512_store_ps(wf + 16 * z, w);
        mx = _mm512_max_ps(mx, w);
    }
    if (HDV == 4) mx = _mm512_max_ps(mx, _mm512_shuffle_f32x4(mx, mx, _MM_SHUFFLE(1, 0, 3, 2))); /* lanes [b][g] twice */
    __m512 inv = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(mx, _mm512_setzero_ps(), _CMP_GT_OQ),
                                     _mm512_set1_ps((float)Q8_WMAX), mx);
    float sbg[16] __attribute__((aligned(64))); /* [block][head] weight scale */
    _mm512_store_ps(sbg, _mm512_mul_ps(mx, _mm512_set1_ps(1.0f / Q8_WMAX)));
    /* in each 128-bit lane, [input k][head g] bytes -> [head g][input k]: a dword per head */
    const __m512i tr = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
    for (int z = 0; z < nz; z += 4) {
        __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_load_ps(wf + 16 * z), inv));
        __m512i i1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_load_ps(wf + 16 * z + 16), inv));
        __m512i i2 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_load_ps(wf + 16 * z + 32), inv));
        __m512i i3 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_load_ps(wf + 16 * z + 48), inv));
        /* lane l: [i0 i1 i2 i3][4 dwords of lane l] as bytes */
        __m512i b8 = _mm512_packus_epi16(_mm512_packus_epi32(i0, i1), _mm512_packus_epi32(i2, i3));
        wq[z / 4] = _mm512_shuffle_epi8(b8, tr);
    }
    for (int h = 0; h < NH; h++) {
        __m512i acc[4][4];
        _Pragma("GCC unroll 4") for (int g = 0; g < 4; g++)
            _Pragma("GCC unroll 4") for (int m = 0; m < 4; m++) acc[g][m] = _mm512_setzero_si512();
        for (int t0 = 0; t0 < np; t0 += U) {
            _Pragma("GCC unroll 2") for (int tt = 0; tt < U / 4; tt++) {
                /* hd 64: lane 2tt + b holds group tt's dwords for block b; hd 128: lane b */
                __m512i wl;
                if (HDV == 4) wl = tt ? _mm512_shuffle_i32x4(wq[t0 / U], wq[t0 / U], 0xFA)
                                      : _mm512_shuffle_i32x4(wq[t0 / U], wq[t0 / U], 0x50);
                else wl = h ? _mm512_shuffle_i32x4(wq[t0 / U], wq[t0 / U], 0xFA)
                            : _mm512_shuffle_i32x4(wq[t0 / U], wq[t0 / U], 0x50);
                __m512i x[4];
                _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
                    const uint8_t *row = (const uint8_t *)vp[HDV == 4 ? t0 + 2 * k + tt : t0 + k] + 68 * (size_t)h;
                    x[k] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(row + 2))),
                                              _mm256_loadu_si256((const __m256i *)(row + 36)), 1);
                }
                __m512i alo = _mm512_unpacklo_epi8(x[0], x[1]), ahi = _mm512_unpackhi_epi8(x[0], x[1]);
                __m512i clo = _mm512_unpacklo_epi8(x[2], x[3]), chi = _mm512_unpackhi_epi8(x[2], x[3]);
                __m512i o[4] = {_mm512_unpacklo_epi16(alo, clo), _mm512_unpackhi_epi16(alo, clo),
                                _mm512_unpacklo_epi16(ahi, chi), _mm512_unpackhi_epi16(ahi, chi)};
                __m512i w[4] = {_mm512_shuffle_epi32(wl, 0x00), _mm512_shuffle_epi32(wl, 0x55),
                                _mm512_shuffle_epi32(wl, 0xAA), _mm512_shuffle_epi32(wl, 0xFF)};
                _Pragma("GCC unroll 4") for (int g = 0; g < 4; g++)
                    _Pragma("GCC unroll 4") for (int m = 0; m < 4; m++)
                        acc[g][m] = _mm512_dpbusd_epi32(acc[g][m], w[g], o[m]);
            }
        }
        float al[4];
        _mm_storeu_ps(al, alpha);
        _Pragma("GCC unroll 4") for (int g = 0; g < 4; g++) {
            __m512 s = _mm512_insertf32x8(_mm512_set1_ps(sbg[(2 * h) * 4 + g]),
                                          _mm256_set1_ps(sbg[(2 * h + 1) * 4 + g]), 1);
            _Pragma("GCC unroll 4") for (int m = 0; m < 4; m++) {
                float *a = acc_mem + (size_t)g * 16 * HDV + 64 * h + 16 * m;
                __m512 f = _mm512_load_ps(a);
                if (rescale) f = _mm512_mul_ps(f, _mm512_set1_ps(al[g]));
                _mm512_store_ps(a, _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[g][m]), s, f));
            }
        }
    }
}

/* acc_mem's q8_values order back to d order, in place (one head) */
static inline void q8_unpermute(float *a, int hd) {
    float tmp[128];
    for (int h = 0; h < hd / 64; h++)
        for (int m = 0; m < 4; m++)
            for (int k = 0; k < 4; k++)
                for (int j = 0; j < 4; j++) tmp[64 * h + 16 * k + 4 * m + j] = a[64 * h + 16 * m + 4 * k + j];
    memcpy(a, tmp, sizeof(float) * (size_t)hd);
}

/* One pass over the segments for heads g0..g0+ng-1 (ng <= 4; absent heads
 * get zero q), block by block: the block's scores [n][4] (lane = head) by
 * four-row dot products reduced together (ks_avx512_reduce16's output order is that
 * layout), the running max and denominator per head, the accumulators
 * rescaled when the max grows, then the block's V rows weighted into them.
 * K and V of a page are read back to back while the page is in L1.
 * The result depends only on the sequence of rows and where blocks fall,
 * which is fixed by the segments: a policy that selects every page passes
 * the dense segments and gets dense output bit for bit.  With want_probs the
 * raw scores are kept in scores[total][4] and turned into probabilities at
 * the end (for the policies that accumulate attention weights). */
#define DECODE_BODY(HDV, VG, KQ8, GK)                                                                    \
    do {                                                                                          \
        __m512 qv[4][HDV];                                                                        \
        _Pragma("GCC unroll 16") for (int g = 0; g < 4; g++)                                      \
            _Pragma("GCC unroll 16") for (int i = 0; i < HDV; i++)                                \
                qv[g][i] = g < ng ? _mm512_mul_ps(_mm512_loadu_ps(q + (size_t)(g0 + g) * hd + 16 * i), \
                                                  _mm512_set1_ps(scale))                          \
                                  : _mm512_setzero_ps();                                          \
        float acc_mem[4][16 * HDV] __attribute__((aligned(64))); /* [head][hd] running sums */    \
        float p_blk[4 * BLOCK_MAX] __attribute__((aligned(64)));  /* [row][head] exp(s - max) */  \
        float s_blk[4 * BLOCK_MAX] __attribute__((aligned(64)));  /* [row][head] raw scores */    \
        const uint16_t *kp[2][BLOCK_MAX], *vp[2][BLOCK_MAX];                                      \
        const int rs = KQ8 ? (HDV) * 17 / 2 : hd; /* row stride in uint16 (Q8_0: 34 bytes per 32) */ \
        memset(acc_mem, 0, sizeof acc_mem);                                                       \
        __m128 run_max = _mm_set1_ps(-INFINITY), run_sum = _mm_setzero_ps();                      \
        int si = 0, sj = 0, cur = 0, frag = 0, nfrag = 0, done = 0;                               \
        int n = next_block(segs, nseg, rs, &si, &sj, kp[0], vp[0], &frag);                        \
        while (n > 0) {                                                                           \
            int nx = cur ^ 1;                                                                     \
            int nn = next_block(segs, nseg, rs, &si, &sj, kp[nx], vp[nx], &nfrag);                \
            /* prefetch the next block's rows unless they continue this block's run    */ \
            /* (the hardware stream covers that): scattered tokens, and also whole     */ \
            /* pages that jump (Quest's selection), whose first lines would miss      */ \
            const bool jump = nn > 0 && kp[nx][0] != kp[cur][n - 1] + rs;                       \
            int pf = frag || nfrag || jump ? nn : 0;                                            \
            float *sc = want_probs ? scores + 4 * (size_t)done : s_blk;                           \
            int t = 0;                                                                            \
            if (KQ8)                                                                              \
                for (; t + 16 <= n; t += 16) {                                                    \
                    for (int r = t; r < t + 16 && r < pf; r++)                                    \
                        prefetch_row(kp[nx][r], 2 * rs);                       \
                    if (!pf)                                                                      \
                        for (int r = t; r < t + 16; r++) prefetch_stream(kp[cur][r], 2 * rs);        \
                    q8_score16(kp[cur] + t, qz, HDV / 4, sc + 4 * (size_t)t);                     \
                }                                                                                 \
            for (; t + 4 <= n; t += 4) {                                                          \
                if (KQ8) {                                                                        \
                    _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++)                           \
                        if (t + r < pf) prefetch_row(kp[nx][t + r], 2 * rs);  \
                        else prefetch_stream(kp[cur][t + r], 2 * rs);                 \
                    _mm512_storeu_ps(sc + 4 * (size_t)t, q8_score4(kp[cur] + t, qz, HDV / 4));    \
                    continue;                                                                     \
                }                                                                                 \
                __m512 part[16];                                                                  \
                _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++) {                             \
                    const uint16_t *k = kp[cur][t + r];                                           \
                    if (t + r < pf) prefetch_row(kp[nx][t + r], 2 * rs);       \
                    else prefetch_stream(k, 2 * rs);                                  \
                    __m512 kv[HDV];                                                               \
                    _Pragma("GCC unroll 16") for (int i = 0; i < HDV; i++)                        \
                        kv[i] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(k + 16 * i))); \
                    _Pragma("GCC unroll 16") for (int g = 0; g < 4; g++) {                        \
                        if (g >= GK) { part[4 * r + g] = _mm512_setzero_ps(); continue; }         \
                        __m512 a = _mm512_mul_ps(kv[0], qv[g][0]);                                \
                        _Pragma("GCC unroll 16") for (int i = 1; i < HDV; i++)                    \
                            a = _mm512_fmadd_ps(kv[i], qv[g][i], a);                              \
                        part[4 * r + g] = a;                                                      \
                    }                                                                             \
                }                                                                                 \
                _mm512_storeu_ps(sc + 4 * (size_t)t, ks_avx512_reduce16(part));                             \
            }                                                                                     \
            for (; t < n; t++) {                                                                  \
                const uint16_t *k = kp[cur][t];                                                   \
                if (t < pf) prefetch_row(kp[nx][t], 2 * rs);                   \
                if (KQ8) { /* the row four times; its scores are the first four lanes */         \
                    const uint16_t *k4[4] = {k, k, k, k};                                         \
                    _mm_storeu_ps(sc + 4 * (size_t)t, _mm512_castps512_ps128(q8_score4(k4, qz, HDV / 4))); \
                    continue;                                                                     \
                }                                                                                 \
                __m512 kv[HDV];                                                                   \
                _Pragma("GCC unroll 16") for (int i = 0; i < HDV; i++)                            \
                    kv[i] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(k + 16 * i)));   \
                __m128 part[4];                                                                   \
                _Pragma("GCC unroll 4") for (int g = 0; g < 4; g++) {                             \
                    if (g >= GK) { part[g] = _mm_setzero_ps(); continue; }                        \
                    __m512 a = _mm512_mul_ps(kv[0], qv[g][0]);                                    \
                    _Pragma("GCC unroll 16") for (int i = 1; i < HDV; i++) a = _mm512_fmadd_ps(kv[i], qv[g][i], a); \
                    part[g] = fold512(a);                                                         \
                }                                                                                 \
                _mm_storeu_ps(sc + 4 * (size_t)t, _mm_hadd_ps(_mm_hadd_ps(part[0], part[1]), _mm_hadd_ps(part[2], part[3]))); \
            }                                                                                     \
            /* online softmax: new max, rescale factor, this block's exps */                      \
            __m512 bm_a = _mm512_set1_ps(-INFINITY), bm_b = bm_a; /* two chains: max is exact in any order */ \
            int m4 = 0;                                                                           \
            for (; m4 + 32 <= 4 * n; m4 += 32) {                                                  \
                bm_a = _mm512_max_ps(bm_a, _mm512_loadu_ps(sc + m4));                             \
                bm_b = _mm512_max_ps(bm_b, _mm512_loadu_ps(sc + m4 + 16));                        \
            }                                                                                     \
            for (; m4 + 16 <= 4 * n; m4 += 16) bm_a = _mm512_max_ps(bm_a, _mm512_loadu_ps(sc + m4)); \
            bm_a = _mm512_max_ps(bm_a, bm_b);                                                     \
            __m128 blk_max = _mm_max_ps(_mm_max_ps(_mm512_castps512_ps128(bm_a), _mm512_extractf32x4_ps(bm_a, 1)), \
                                        _mm_max_ps(_mm512_extractf32x4_ps(bm_a, 2), _mm512_extractf32x4_ps(bm_a, 3))); \
            blk_max = _mm_max_ps(blk_max, run_max);                                               \
            for (; m4 < 4 * n; m4 += 4) blk_max = _mm_max_ps(blk_max, _mm_loadu_ps(sc + m4));    \
            /* the max unchanged (most blocks once it settles): alpha is exactly 1 */             \
            const bool rescale = _mm_movemask_ps(_mm_cmpeq_ps(blk_max, run_max)) != 0xF;         \
            __m128 alpha = exp128(_mm_sub_ps(run_max, blk_max)); /* exp(-inf) clamps to ~1e-38 */ \
            run_max = blk_max;                                                                    \
            __m512 m16 = _mm512_broadcast_f32x4(run_max), psum = _mm512_setzero_ps();             \
            int i4 = 0;                                                                           \
            for (; i4 + 16 <= 4 * n; i4 += 16) {                                                  \
                __m512 e = ks_avx512_exp_neg(_mm512_sub_ps(_mm512_loadu_ps(sc + i4), m16));                  \
                _mm512_store_ps(p_blk + i4, e);                                                   \
                psum = _mm512_add_ps(psum, e);                                                    \
            }                                                                                     \
            __m128 s4 = sum_lanes4(psum);                                                         \
            for (; i4 < 4 * n; i4 += 4) {                                                         \
                __m128 e = exp128(_mm_sub_ps(_mm_loadu_ps(sc + i4), run_max));                    \
                _mm_store_ps(p_blk + i4, e);                                                      \
                s4 = _mm_add_ps(s4, e);                                                           \
            }                                                                                     \
            run_sum = _mm_add_ps(_mm_mul_ps(run_sum, alpha), s4);                                 \
            float al[4];                                                                          \
            _mm_storeu_ps(al, alpha);                                                             \
            if (KQ8)                                                                              \
                q8_values(vp[cur], n, vp[nx], pf, p_blk, alpha, rescale, &acc_mem[0][0], HDV);   \
            else                                                                                  \
            for (int gs = 0; gs < ng; gs += VG) {                                                 \
                __m512 acc[VG][HDV];                                                              \
                _Pragma("GCC unroll 16") for (int g = 0; g < VG; g++) {                           \
                    __m512 a = _mm512_set1_ps(al[gs + g]);                                  \
                    _Pragma("GCC unroll 16") for (int i = 0; i < HDV; i++) {                      \
                        acc[g][i] = _mm512_load_ps(&acc_mem[gs + g][16 * i]);              \
                        if (rescale) acc[g][i] = _mm512_mul_ps(acc[g][i], a);                      \
                    }                                                                             \
                }                                                                                 \
                for (int r = 0; r < n; r++) {                                                     \
                    const uint16_t *v = vp[cur][r];                                               \
                    if (gs == 0 && r < pf) prefetch_row(vp[nx][r], 2 * rs);    \
                    else if (gs == 0) prefetch_stream(v, 2 * rs);                                   \
                    __m512 vv[HDV];                                                               \
                    _Pragma("GCC unroll 16") for (int i = 0; i < HDV; i++)                        \
                        vv[i] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(v + 16 * i))); \
                    _Pragma("GCC unroll 16") for (int g = 0; g < VG; g++) {                       \
                        __m512 pr = _mm512_set1_ps(p_blk[4 * r + (gs + g)]);                \
                        _Pragma("GCC unroll 16") for (int i = 0; i < HDV; i++)                    \
                            acc[g][i] = _mm512_fmadd_ps(pr, vv[i], acc[g][i]);                    \
                    }                                                                             \
                }                                                                                 \
                _Pragma("GCC unroll 16") for (int g = 0; g < VG; g++)                             \
                    _Pragma("GCC unroll 16") for (int i = 0; i < HDV; i++)                        \
                        _mm512_store_ps(&acc_mem[gs + g][16 * i], acc[g][i]);               \
            }                                                                                     \
            done += n;                                                                            \
            n = nn;                                                                               \
            frag = nfrag;                                                                         \
            cur = nx;                                                                             \
        }                                                                                         \
        KS_ASSERT(done == total);                                                                 \
        float sums[4];                                                                            \
        _mm_storeu_ps(sums, run_sum);                                                             \
        if (sinks) { /* the sink joins the denominator (attn.h) */                                \
            float mxs[4];                                                                         \
            _mm_storeu_ps(mxs, run_max);                                                          \
            for (int g = 0; g < ng; g++) sums[g] += expf(sinks[g] - mxs[g]);                      \
            run_sum = _mm_loadu_ps(sums);                                                         \
        }                                                                                         \
        for (int g = 0; g < ng; g++) {                                                            \
            if (KQ8) q8_unpermute(acc_mem[g], hd);                                                \
            __m512 inv = _mm512_set1_ps(1.0f / sums[g]);                                          \
            _Pragma("GCC unroll 16") for (int i = 0; i < HDV; i++)                                \
                _mm512_storeu_ps(out + (size_t)(g0 + g) * hd + 16 * i,                            \
                                 _mm512_mul_ps(_mm512_load_ps(&acc_mem[g][16 * i]), inv));        \
        }                                                                                         \
        if (want_probs) {                                                                         \
            __m128 inv4 = _mm_div_ps(_mm_set1_ps(1.0f), run_sum);                                 \
            __m512 m16 = _mm512_broadcast_f32x4(run_max), inv16 = _mm512_broadcast_f32x4(inv4);   \
            int i4 = 0;                                                                           \
            for (; i4 + 16 <= 4 * total; i4 += 16)                                                \
                _mm512_storeu_ps(scores + i4,                                                     \
                                 _mm512_mul_ps(ks_avx512_exp_neg(_mm512_sub_ps(_mm512_loadu_ps(scores + i4), m16)), inv16)); \
            for (; i4 < 4 * total; i4 += 4)                                                       \
                _mm_storeu_ps(scores + i4, _mm_mul_ps(exp128(_mm_sub_ps(_mm_loadu_ps(scores + i4), run_max)), inv4)); \
        }                                                                                         \
    } while (0)

/* GK: query heads the f16 K scores are computed for (4, or 2 when the
 * group has at most 2: Qwen3's and MHA-like groups would otherwise spend
 * half or three quarters of the score FMAs on absent heads' zero queries).
 * The present heads' arithmetic is the same in both, so outputs are too. */
#define DECODE_FN(NAME, HDV, VG, KQ8, GK)                                                                   \
    TGT static void NAME(const ks_kv_seg16 *segs, int nseg, int total, int hd, int g0, int ng, const float *q,       \
                         const ks_q8_query *qz, float *scores, float *out, float scale, bool want_probs,              \
                         const float *sinks) {                                                                  \
        DECODE_BODY(HDV, VG, KQ8, GK);                                                                          \
    }
DECODE_FN(decode64, 4, 4, 0, 4)
DECODE_FN(decode128, 8, 2, 0, 4)
DECODE_FN(decode64_g2, 4, 4, 0, 2)
DECODE_FN(decode128_g2, 8, 2, 0, 2)
DECODE_FN(decode64_q8, 4, 4, 1, 4)
DECODE_FN(decode128_q8, 8, 2, 1, 4)

bool ks_attention_segs_avx512_kv(ks_kv_type kt, const ks_kv_seg *segs, int nseg, int total, int hd, int G,
                                 const float *q, float *scores, float *out, float scale, float *weights,
                                 const float *sinks) {
    if ((hd != 64 && hd != 128) || (kt != KS_KV_F16 && kt != KS_KV_Q8)) return false;
    const ks_kv_seg16 *s16 = (const ks_kv_seg16 *)segs; /* Q8_0 rows are even-sized: walked as uint16 */
    for (int g0 = 0; g0 < G; g0 += 4) {
        int ng = G - g0 < 4 ? G - g0 : 4;
        bool wp = weights != NULL;
        const float *sk = sinks ? sinks + g0 : NULL;
        if (kt == KS_KV_Q8) {
            ks_q8_query qz;
            ks_q8_query_init(q, hd, g0, ng, scale, &qz);
            if (hd == 64) decode64_q8(s16, nseg, total, hd, g0, ng, q, &qz, scores, out, scale, wp, sk);
            else decode128_q8(s16, nseg, total, hd, g0, ng, q, &qz, scores, out, scale, wp, sk);
        } else if (hd == 64) {
            (ng <= 2 ? decode64_g2 : decode64)(s16, nseg, total, hd, g0, ng, q, NULL, scores, out, scale, wp, sk);
        } else {
            (ng <= 2 ? decode128_g2 : decode128)(s16, nseg, total, hd, g0, ng, q, NULL, scores, out, scale, wp, sk);
        }
        if (weights)
            for (int t = 0; t < total; t++)
                for (int g = 0; g < ng; g++) weights[t] += scores[4 * (size_t)t + g];
    }
    return true;
}

bool ks_attention_segs_avx512(const ks_kv_seg16 *segs, int nseg, int total, int hd, int G, const float *q,
                              float *scores, float *out, float scale, float *weights) {
    return ks_attention_segs_avx512_kv(KS_KV_F16, (const ks_kv_seg *)segs, nseg, total, hd, G, q, scores, out, scale,
                                       weights, NULL);
}
#else
bool ks_attention_segs_avx512_kv(ks_kv_type kt, const ks_kv_seg *segs, int nseg, int total, int hd, int G,
                                 const float *q, float *scores, float *out, float scale, float *weights,
                                 const float *sinks) {
    return false;
}
bool ks_attention_segs_avx512(const ks_kv_seg16 *segs, int nseg, int total, int hd, int G, const float *q,
                              float *scores, float *out, float scale, float *weights) {
    return false;
}
#endif
