/*
 * attn_block_bf16.c — the prefill block kernel on AVX-512 BF16: causal
 * attention of R consecutive query rows (G heads each) over one KV head's
 * f16 or Q8_0 pages, with bf16 dot products (vdpbf16ps) and an online
 * softmax.
 *
 * Why another block kernel.  ks_attention_block_avx512 (attn_block_avx512.c)
 * reproduces the decode kernel's f32 arithmetic bit for bit, and at a 16K
 * prompt it is what a prefill spends ~80% of its time on: bound by f32 FMAs
 * (16 multiply-adds an instruction), plus a [R*G][n] score matrix written,
 * normalised and read again.  vdpbf16ps does 32 multiply-adds an instruction
 * with f32 accumulation, so the same work is bound at twice the rate; the
 * online softmax of "FlashAttention: Fast and Memory-Efficient Exact
 * Attention with IO-Awareness" (Dao et al., section 3.1, the running max and
 * sum rescaled tile by tile) keeps no score matrix larger than one tile.
 *
 * The arithmetic.  Q, K, the probabilities and V are rounded to bf16 (round
 * to nearest even); every product of two bf16 is exact in f32 and is added
 * to an f32 accumulator, so the only new error is those roundings (relative
 * 2^-9 per operand): tests/test_ops.c bounds the kernel against a float64
 * reference, and docs/BENCHMARKS.md records its effect on the 1B model's
 * logits and perplexity.  K and V are converted once per tile of TILE keys
 * and used by every query of the block (R rows x G heads of a GQA group);
 * Q once per call.  8-bit KV (Q8_0 rows) goes through the same loops: its
 * tiles are dequantised (d x q, exact in f32) and rounded to bf16 once, so
 * it adds one rounding as f16 rows do, and the conversion, amortised over
 * the block's queries, costs about what f16's does (docs/BENCHMARKS.md).
 * An int8 (vpdpbusd) kernel would halve only the dot products' instructions
 * and would need the probabilities quantised to 8 bits with V's per-key
 * scales folded in, as the decode kernel does (relative error up to ~1e-2
 * in tests/test_ops.c, against 3.7e-3 for this kernel in attn_block_bench).
 *
 * Layouts, chosen so the inner loops are loads, broadcasts and vdpbf16ps:
 *   Q  [R*G][hd/2] dwords, dword p = (q[2p], q[2p+1]): its natural bf16 order;
 *   Kt [hd/2][Tp]  dwords, Kt[p][t] = (k_t[2p], k_t[2p+1]): keys in lanes, so
 *      a score vector of sixteen keys is hd/2 vdpbf16ps of a broadcast Q
 *      pair against a row of Kt, with no horizontal sum;
 *   Vt [Tp/2][hd]  dwords, Vt[u][d] = (v_2u[d], v_2u+1[d]): key pairs in a
 *      dword, so an output chunk of sixteen dims takes vdpbf16ps of a row of
 *      Vt against the broadcast probability pair (p_2u, p_2u+1).
 *
 * Exactness that must survive: chunked prefill == one prefill, and any
 * block split of the rows.  A query's result depends only on its own q, the
 * cache and its own visible count: tiles are aligned to absolute multiples
 * of TILE (not to the block, chunk or segment boundaries); a query's scores
 * are lane-independent chains; its softmax statistics take the vectors
 * [0, ceil(lim/16)) of each tile in order; and its value accumulation takes
 * exactly the key pairs [0, ceil(lim/2)) of each tile in order, whichever
 * queries share the register tile with it (the shared loop runs to the
 * smallest count, each query finishes its own tail alone).
 */
#include "attn/attn.h"

#include "core/core.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

#include "tensor/simd_avx512.h"

#define BTGT_ATTR __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,f16c")))
#define BTGT BTGT_ATTR
#define BINL static inline __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,f16c"), always_inline))

enum { TILE = KS_ATTN_BF16_TILE, NQ = 6 };

/* The scratch holds f32, bf16 pairs and bf16 halves side by side, written by
 * vector stores and read back as scalars: those scalar accesses go through
 * a may_alias type so that no aliasing assumption reorders them. */
typedef uint32_t __attribute__((may_alias)) u32a;
typedef uint16_t __attribute__((may_alias)) u16a;

size_t ks_attention_block_bf16_scratch(int R, int G, int hd) {
    size_t RG = (size_t)R * G, Tp = TILE + 32;
    /* Kt, Vt (bf16: Tp * hd each, in floats / 2), Q (RG * hd / 2), scores
     * (NQ * Tp), probabilities (NQ * Tp / 2 + pad), m and l (RG each) */
    return Tp * hd + RG * hd / 2 + NQ * Tp + NQ * (Tp / 2 + 16) + 2 * RG + 64;
}

bool ks_attention_block_bf16_usable(void) {
    static int cached = -1;
    if (cached < 0) {
        const char *env = getenv("KS_ATTN");
        cached = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512f") && !(env && !strcmp(env, "f32"));
    }
    return cached;
}

bool ks_attention_block_bf16_wide(void) {
    static int cached = -1;
    if (cached < 0) {
        const char *env = getenv("KS_ATTN");
        cached = ks_attention_block_bf16_usable() && env && !strcmp(env, "bf16");
    }
    return cached;
}

/* sixteen f32 -> sixteen bf16 (round to nearest even) as raw 16-bit words */
BINL __m256i to_bf16(__m512 v) { return (__m256i)_mm512_cvtneps_pbh(v); }

/* The row loaders, one per KV format (q8: a compile-time constant, so each
 * instantiation of the kernel has one).  A Q8_0 element is d * q with an f16
 * d and an int8 q: the product has at most 19 significant bits, exact in
 * f32, so a Q8_0 key or value reaches bf16 with one rounding, as an f16 one
 * does. */
/* elements [e, e + 16) of a row (e % 16 == 0) as f32 */
BINL __m512 load16(const uint8_t *row, int e, const int q8) {
    if (!q8) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + 2 * (size_t)e)));
    const uint8_t *blk = row + (size_t)(e / 32) * sizeof(ks_block_q8_0);
    uint16_t d;
    memcpy(&d, blk, sizeof d);
    __m512 x = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2 + e % 32))));
    return _mm512_mul_ps(x, _mm512_set1_ps(_cvtsh_ss(d)));
}

/* elements [e, e + 32) of a row (e % 32 == 0) as bf16 pairs in natural order */
BINL __m512i load32_bf16(const uint8_t *row, int e, const int q8) {
    return (__m512i)_mm512_cvtne2ps_pbh(load16(row, e + 16, q8), load16(row, e, q8));
}

/* a tile's keys: f16 rows [L][hd] (L <= 16 per call) at key offset t0 of Kt
 * [hd/2][Tp]; the rows' bf16 pairs are a 16 x (hd/2) dword matrix,
 * transposed 16 x 16 at a time; keys past L are zero */
BINL void tile_k(const uint8_t *rows, size_t rb, int L, int hd, u32a *kt, int Tp, int t0, const int q8) {
    for (int p0 = 0; p0 < hd / 2; p0 += 16) {
        __m512i r[16];
        _Pragma("GCC unroll 16") for (int t = 0; t < 16; t++) {
            if (t < L) r[t] = load32_bf16(rows + (size_t)t * rb, 2 * p0, q8); /* 16 pairs, natural order */
            else r[t] = _mm512_setzero_si512();
        }
        /* 16 x 16 dword transpose */
        __m512i a[16], b[16];
        _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {
            a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
            a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
        }
        _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
            b[4 * i] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
            b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
            b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
            b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
        }
        /* b[4i + j], 128-bit lane c: dword column 4c + j' of rows 4i..4i+3 */
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
            __m512i c0 = _mm512_shuffle_i32x4(b[j], b[4 + j], 0x88);      /* lanes 0,2 of rows 0-3, 4-7 */
            __m512i c1 = _mm512_shuffle_i32x4(b[j], b[4 + j], 0xDD);      /* lanes 1,3 */
            __m512i c2 = _mm512_shuffle_i32x4(b[8 + j], b[12 + j], 0x88); /* rows 8-11, 12-15 */
            __m512i c3 = _mm512_shuffle_i32x4(b[8 + j], b[12 + j], 0xDD);
            /* column j of lane 0: rows 0-15 */
            __m512i o0 = _mm512_shuffle_i32x4(c0, c2, 0x88); /* lane 0 */
            __m512i o2 = _mm512_shuffle_i32x4(c0, c2, 0xDD); /* lane 2 */
            __m512i o1 = _mm512_shuffle_i32x4(c1, c3, 0x88); /* lane 1 */
            __m512i o3 = _mm512_shuffle_i32x4(c1, c3, 0xDD); /* lane 3 */
            _mm512_storeu_si512(kt + (size_t)(p0 + j) * Tp + t0, o0);
            _mm512_storeu_si512(kt + (size_t)(p0 + 4 + j) * Tp + t0, o1);
            _mm512_storeu_si512(kt + (size_t)(p0 + 8 + j) * Tp + t0, o2);
            _mm512_storeu_si512(kt + (size_t)(p0 + 12 + j) * Tp + t0, o3);
        }
    }
}

/* a tile's values: rows [L] (L <= 2 per call, key pair u) into Vt[u] */
BINL void tile_v(const uint8_t *rows, size_t rb, int L, int hd, u32a *vt, const int q8) {
    static const uint16_t interleave[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                            8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    const __m512i idx = _mm512_loadu_si512(interleave);
    for (int d = 0; d < hd; d += 16) {
        __m512 e = load16(rows, d, q8);
        __m512 o = L > 1 ? load16(rows + rb, d, q8) : _mm512_setzero_ps();
        __m512i both = (__m512i)_mm512_cvtne2ps_pbh(o, e); /* e0..e15, o0..o15 */
        _mm512_storeu_si512(vt + d, _mm512_permutexvar_epi16(idx, both));
    }
}

/* Scores of N queries (Q pairs qb[x], scaled) against NK sixteen-key
 * vectors of the tile from key k0 into sc[x][Tp]; each lane its own chain
 * over the pairs in order.  vdpbf16ps has a long latency and two pipes, so
 * N x NK (up to 24) independent chains are what keeps them busy. */
BINL void scores_tile(const u32a *const qb[NQ], const u32a *kt, int Tp, int hp, int k0, float *sc, float scale,
                      const int N, const int NK) {
    __m512 acc[NQ][4];
    _Pragma("GCC unroll 6") for (int x = 0; x < N; x++)
        _Pragma("GCC unroll 4") for (int v = 0; v < NK; v++) acc[x][v] = _mm512_setzero_ps();
    const u32a *k = kt + k0;
    for (int p = 0; p < hp; p++) {
        __m512bh kv[4];
        _Pragma("GCC unroll 4") for (int v = 0; v < NK; v++) kv[v] = (__m512bh)_mm512_loadu_si512(k + (size_t)p * Tp + 16 * v);
        _Pragma("GCC unroll 6") for (int x = 0; x < N; x++) {
            __m512bh qv = (__m512bh)_mm512_set1_epi32((int)qb[x][p]);
            _Pragma("GCC unroll 4") for (int v = 0; v < NK; v++) acc[x][v] = _mm512_dpbf16_ps(acc[x][v], qv, kv[v]);
        }
    }
    const __m512 sv = _mm512_set1_ps(scale);
    _Pragma("GCC unroll 6") for (int x = 0; x < N; x++)
        _Pragma("GCC unroll 4") for (int v = 0; v < NK; v++)
            _mm512_storeu_ps(sc + (size_t)x * Tp + k0 + 16 * v, _mm512_mul_ps(acc[x][v], sv));
}

/* scores_tile over key vectors [0, nv), N a compile-time constant */
BINL void scores_n(const u32a *const qb[NQ], const u32a *kt, int Tp, int hp, int nv, float *sc, float scale,
                   const int N) {
    int v = 0;
    for (; v + 4 <= nv; v += 4) scores_tile(qb, kt, Tp, hp, 16 * v, sc, scale, N, 4);
    if (nv - v >= 2) scores_tile(qb, kt, Tp, hp, 16 * v, sc, scale, N, 2), v += 2;
    if (v < nv) scores_tile(qb, kt, Tp, hp, 16 * v, sc, scale, N, 1);
}

static void scores_any(const u32a *const qb[NQ], const u32a *kt, int Tp, int hp, int nv, float *sc,
                       float scale, int N) BTGT_ATTR;
static void scores_any(const u32a *const qb[NQ], const u32a *kt, int Tp, int hp, int nv, float *sc,
                       float scale, int N) {
    switch (N) {
    case 6: scores_n(qb, kt, Tp, hp, nv, sc, scale, 6); break;
    case 5: scores_n(qb, kt, Tp, hp, nv, sc, scale, 5); break;
    case 4: scores_n(qb, kt, Tp, hp, nv, sc, scale, 4); break;
    case 3: scores_n(qb, kt, Tp, hp, nv, sc, scale, 3); break;
    case 2: scores_n(qb, kt, Tp, hp, nv, sc, scale, 2); break;
    default: scores_n(qb, kt, Tp, hp, nv, sc, scale, 1); break;
    }
}

/* The online softmax step of one query over its lim visible scores s of a
 * tile: updates the running max *m and sum *l, rescales its output o, and
 * writes the probabilities as bf16 (natural order: dword u = pair u) into
 * pb, zero past lim up to the pair boundary. */
BINL void softmax_tile(float *s, int lim, float *m, float *l, float *o, int hd, u16a *pb) {
    int nv = (lim + 15) / 16;
    __m512 mx = _mm512_set1_ps(-FLT_MAX);
    for (int v = 0; v < nv; v++) {
        int left = lim - 16 * v;
        __mmask16 k = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
        mx = _mm512_mask_max_ps(mx, k, mx, _mm512_loadu_ps(s + 16 * v));
    }
    float mt = _mm512_reduce_max_ps(mx), mo = *m, mn = mt > mo ? mt : mo;
    if (mn != mo) { /* the running max moved: rescale what was accumulated */
        float alpha = _mm512_cvtss_f32(ks_avx512_exp_neg(_mm512_set1_ps(mo - mn)));
        if (*l == 0.0f) alpha = 0.0f; /* the first tile: nothing accumulated yet */
        *l *= alpha;
        const __m512 av = _mm512_set1_ps(alpha);
        for (int i = 0; i < hd; i += 16) _mm512_storeu_ps(o + i, _mm512_mul_ps(_mm512_loadu_ps(o + i), av));
        *m = mn;
    }
    const __m512 mv = _mm512_set1_ps(mn);
    __m512 sum = _mm512_setzero_ps();
    for (int v = 0; v < nv; v++) {
        int left = lim - 16 * v;
        __mmask16 k = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
        __m512 p = _mm512_maskz_mov_ps(k, ks_avx512_exp_neg(_mm512_sub_ps(_mm512_loadu_ps(s + 16 * v), mv)));
        sum = _mm512_add_ps(sum, p);
        _mm256_storeu_si256((__m256i *)(pb + 16 * v), to_bf16(p));
    }
    *l += _mm512_reduce_add_ps(sum);
}

/* o[x] += sum over key pairs u in [u0, u1) of Vt[u] * (p_2u, p_2u+1), for N
 * queries sharing the Vt rows (pb[x]: dwords), four 16-dim chunks of each
 * output at a time (N x 4 chains); each output lane one chain over u in
 * order. */
BINL void values_n(const u32a *const pb[NQ], float *const o[NQ], const u32a *vt, int u0, int u1, int hd,
                   const int N) {
    for (int i0 = 0; i0 < hd; i0 += 64) {
        int nc = hd - i0 >= 64 ? 4 : (hd - i0) / 16;
        if (nc == 4) {
            __m512 acc[NQ][4];
            _Pragma("GCC unroll 6") for (int x = 0; x < N; x++)
                _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) acc[x][i] = _mm512_loadu_ps(o[x] + i0 + 16 * i);
            for (int u = u0; u < u1; u++) {
                const u32a *v = vt + (size_t)u * hd + i0;
                __m512bh v0 = (__m512bh)_mm512_loadu_si512(v), v1 = (__m512bh)_mm512_loadu_si512(v + 16);
                __m512bh v2 = (__m512bh)_mm512_loadu_si512(v + 32), v3 = (__m512bh)_mm512_loadu_si512(v + 48);
                _Pragma("GCC unroll 6") for (int x = 0; x < N; x++) {
                    __m512bh pv = (__m512bh)_mm512_set1_epi32((int)pb[x][u]);
                    acc[x][0] = _mm512_dpbf16_ps(acc[x][0], v0, pv);
                    acc[x][1] = _mm512_dpbf16_ps(acc[x][1], v1, pv);
                    acc[x][2] = _mm512_dpbf16_ps(acc[x][2], v2, pv);
                    acc[x][3] = _mm512_dpbf16_ps(acc[x][3], v3, pv);
                }
            }
            _Pragma("GCC unroll 6") for (int x = 0; x < N; x++)
                _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) _mm512_storeu_ps(o[x] + i0 + 16 * i, acc[x][i]);
        } else {
            for (int x = 0; x < N; x++)
                for (int i = 0; i < nc; i++) {
                    __m512 acc = _mm512_loadu_ps(o[x] + i0 + 16 * i);
                    for (int u = u0; u < u1; u++)
                        acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(vt + (size_t)u * hd + i0 + 16 * i),
                                               (__m512bh)_mm512_set1_epi32((int)pb[x][u]));
                    _mm512_storeu_ps(o[x] + i0 + 16 * i, acc);
                }
        }
    }
}

static void values_any(const u32a *const pb[NQ], float *const o[NQ], const u32a *vt, int u0, int u1, int hd,
                       int N) BTGT_ATTR;
static void values_any(const u32a *const pb[NQ], float *const o[NQ], const u32a *vt, int u0, int u1, int hd,
                       int N) {
    switch (N) {
    case 6: values_n(pb, o, vt, u0, u1, hd, 6); break;
    case 5: values_n(pb, o, vt, u0, u1, hd, 5); break;
    case 4: values_n(pb, o, vt, u0, u1, hd, 4); break;
    case 3: values_n(pb, o, vt, u0, u1, hd, 3); break;
    case 2: values_n(pb, o, vt, u0, u1, hd, 2); break;
    default: values_n(pb, o, vt, u0, u1, hd, 1); break;
    }
}

BINL void block_bf16(const ks_kv_seg *segs, const int32_t *n_att, int R, int hd, int G, const float *q,
                     size_t q_stride, float *out, size_t out_stride, float *scratch, float scale, const int q8,
                     const float *sinks) {
    const int RG = R * G, hp = hd / 2, Tp = TILE + 32;
    const size_t rb = ks_kv_row_bytes(q8 ? KS_KV_Q8 : KS_KV_F16, hd);
    /* scratch, as ks_attention_block_bf16_scratch counts it (64-byte pieces) */
    u32a *kt = (u32a *)scratch;                                 /* [hp][Tp] */
    u32a *vt = kt + (size_t)hp * Tp;                            /* [Tp/2][hd] */
    u32a *qb = vt + (size_t)(Tp / 2) * hd;                      /* [RG][hp] */
    float *sc = (float *)(qb + (size_t)RG * hp);                /* [NQ][Tp] */
    u16a *pbuf = (u16a *)(sc + (size_t)NQ * Tp);                /* [NQ][Tp + 32] bf16 */
    float *mrun = (float *)(pbuf + (size_t)NQ * (Tp + 32));     /* [RG] */
    float *lrun = mrun + RG;                                    /* [RG] */
    for (int x = 0; x < RG; x++) {
        const float *qq = q + (size_t)(x / G) * q_stride + (size_t)(x % G) * hd;
        for (int i = 0; i < hd; i += 32)
            _mm512_storeu_si512(qb + (size_t)x * hp + i / 2, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(qq + i + 16),
                                                                                           _mm512_loadu_ps(qq + i)));
        mrun[x] = -FLT_MAX;
        lrun[x] = 0.0f;
        memset(out + (size_t)(x / G) * out_stride + (size_t)(x % G) * hd, 0, sizeof(float) * (size_t)hd);
    }
    const int n_max = n_att[R - 1];
    int si = 0, off = 0; /* the next unconverted key: segment si, row off */
    for (int e0 = 0; e0 < n_max; e0 += TILE) {
        int L = n_max - e0 < TILE ? n_max - e0 : TILE;
        /* convert the tile's keys and values, walking the segments */
        for (int t = 0; t < L;) {
            while (off >= segs[si].len) si++, off = 0;
            int take = segs[si].len - off;
            if (take > L - t) take = L - t;
            const uint8_t *K = (const uint8_t *)segs[si].K + (size_t)off * rb;
            const uint8_t *V = (const uint8_t *)segs[si].V + (size_t)off * rb;
            for (int a = 0; a < take;) { /* K: whole aligned blocks of 16 keys transposed, other keys one by one */
                int tt = t + a;
                if ((tt & 15) == 0 && take - a >= 16) {
                    tile_k(K + (size_t)a * rb, rb, 16, hd, kt, Tp, tt, q8);
                    a += 16;
                    continue;
                }
                const uint8_t *src = K + (size_t)a * rb;
                for (int p0 = 0; p0 < hp; p0 += 16) {
                    uint32_t w[16];
                    _mm512_storeu_si512(w, load32_bf16(src, 2 * p0, q8));
                    for (int p = 0; p < 16; p++) kt[(size_t)(p0 + p) * Tp + tt] = w[p];
                }
                a++;
            }
            for (int a = 0; a < take;) { /* V: key pairs (u = t / 2) */
                int tt = t + a;
                u32a *row = vt + (size_t)(tt / 2) * hd;
                const uint8_t *src = V + (size_t)a * rb;
                if (!(tt & 1)) { /* a pair's first key, with its second if this segment has it (else zero, for now) */
                    int two = take - a >= 2 ? 2 : 1;
                    tile_v(src, rb, two, hd, row, q8);
                    a += two;
                    continue;
                }
                for (int d = 0; d < hd; d += 16) { /* a pair's second key, its first from the previous segment */
                    __m256i h = (__m256i)_mm512_cvtneps_pbh(load16(src, d, q8));
                    __m512i cur = _mm512_and_si512(_mm512_loadu_si512(row + d), _mm512_set1_epi32(0xFFFF));
                    _mm512_storeu_si512(row + d, _mm512_or_si512(cur, _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
                }
                a++;
            }
            off += take;
            t += take;
        }
        for (int tt = L; tt < ((L + 15) & ~15); tt++) /* keys past L in the last block: zero (their scores are masked) */
            for (int p = 0; p < hp; p++) kt[(size_t)p * Tp + tt] = 0;
        /* queries, NQ at a time */
        for (int x0 = 0; x0 < RG; x0 += NQ) {
            int N = RG - x0 < NQ ? RG - x0 : NQ, lim[NQ], limax = 0, nu_min = TILE;
            for (int k = 0; k < NQ; k++) {
                lim[k] = k < N ? ks_attn_block_visible(n_att, G, x0 + k, e0, L) : 0;
                if (lim[k] > limax) limax = lim[k];
            }
            if (!limax) continue;
            const u32a *qp[NQ];
            for (int k = 0; k < NQ; k++) qp[k] = qb + (size_t)(x0 + (k < N ? k : 0)) * hp;
            scores_any(qp, kt, Tp, hp, (limax + 15) / 16, sc, scale, N);
            const u32a *pp[NQ];
            float *op[NQ];
            for (int k = 0; k < NQ; k++) {
                int x = x0 + (k < N ? k : 0);
                op[k] = out + (size_t)(x / G) * out_stride + (size_t)(x % G) * hd;
                pp[k] = (const u32a *)(pbuf + (size_t)k * (Tp + 32));
                if (k >= N) continue;
                if (!lim[k]) { /* sees none of this tile: the others' shared loop must not add to it */
                    nu_min = 0;
                    continue;
                }
                softmax_tile(sc + (size_t)k * Tp, lim[k], &mrun[x], &lrun[x], op[k], hd, pbuf + (size_t)k * (Tp + 32));
                int nu = (lim[k] + 1) / 2;
                if (nu < nu_min) nu_min = nu;
            }
            if (nu_min > 0) values_any(pp, op, vt, 0, nu_min, hd, N);
            for (int k = 0; k < N; k++) { /* each query's own tail */
                int nu = (lim[k] + 1) / 2;
                if (nu > nu_min) {
                    const u32a *p1[NQ] = {pp[k]};
                    float *o1[NQ] = {op[k]};
                    values_any(p1, o1, vt, nu_min, nu, hd, 1);
                }
            }
        }
    }
    for (int x = 0; x < RG; x++) {
        float *o = out + (size_t)(x / G) * out_stride + (size_t)(x % G) * hd;
        /* a sink (gpt-oss, attn.h) joins the denominator against the same running max */
        const float l = sinks ? lrun[x] + expf(sinks[x % G] - mrun[x]) : lrun[x];
        const __m512 inv = _mm512_set1_ps(1.0f / l);
        for (int i = 0; i < hd; i += 16) _mm512_storeu_ps(o + i, _mm512_mul_ps(_mm512_loadu_ps(o + i), inv));
    }
}

/* one instantiation per KV format: the format's test stays out of the loops */
static void block_bf16_f16(const ks_kv_seg *segs, const int32_t *n_att, int R, int hd, int G, const float *q,
                           size_t q_stride, float *out, size_t out_stride, float *scratch, float scale,
                           const float *sinks) BTGT_ATTR;
static void block_bf16_f16(const ks_kv_seg *segs, const int32_t *n_att, int R, int hd, int G, const float *q,
                           size_t q_stride, float *out, size_t out_stride, float *scratch, float scale,
                           const float *sinks) {
    block_bf16(segs, n_att, R, hd, G, q, q_stride, out, out_stride, scratch, scale, 0, sinks);
}
static void block_bf16_q8(const ks_kv_seg *segs, const int32_t *n_att, int R, int hd, int G, const float *q,
                          size_t q_stride, float *out, size_t out_stride, float *scratch, float scale,
                          const float *sinks) BTGT_ATTR;
static void block_bf16_q8(const ks_kv_seg *segs, const int32_t *n_att, int R, int hd, int G, const float *q,
                          size_t q_stride, float *out, size_t out_stride, float *scratch, float scale,
                          const float *sinks) {
    block_bf16(segs, n_att, R, hd, G, q, q_stride, out, out_stride, scratch, scale, 1, sinks);
}

bool ks_attention_block_bf16_sinks(ks_kv_type kt, const ks_kv_seg *segs, int nseg, const int32_t *n_att, int R,
                                   int hd, int G, const float *q, size_t q_stride, float *out, size_t out_stride,
                                   float *scratch, float scale, const float *sinks) {
    if (hd % 32 || hd > KS_ATTN_BF16_MAX_HD || R < 1 || G < 1 || (kt != KS_KV_F16 && kt != KS_KV_Q8)) return false;
    (void)nseg; /* the segments are walked up to n_att[R - 1] entries */
    (kt == KS_KV_Q8 ? block_bf16_q8 : block_bf16_f16)(segs, n_att, R, hd, G, q, q_stride, out, out_stride, scratch,
                                                      scale, sinks);
    return true;
}

bool ks_attention_block_bf16_kv(ks_kv_type kt, const ks_kv_seg *segs, int nseg, const int32_t *n_att, int R, int hd,
                                int G, const float *q, size_t q_stride, float *out, size_t out_stride, float *scratch,
                                float scale) {
    return ks_attention_block_bf16_sinks(kt, segs, nseg, n_att, R, hd, G, q, q_stride, out, out_stride, scratch,
                                         scale, NULL);
}

bool ks_attention_block_bf16(const ks_kv_seg16 *segs, int nseg, const int32_t *n_att, int R, int hd, int G,
                             const float *q, size_t q_stride, float *out, size_t out_stride, float *scratch,
                             float scale) {
    return ks_attention_block_bf16_kv(KS_KV_F16, (const ks_kv_seg *)segs, nseg, n_att, R, hd, G, q, q_stride, out,
                                      out_stride, scratch, scale);
}
#else
size_t ks_attention_block_bf16_scratch(int R, int G, int hd) {
    (void)R, (void)G, (void)hd;
    return 0;
}
bool ks_attention_block_bf16_usable(void) { return false; }
bool ks_attention_block_bf16_wide(void) { return false; }
bool ks_attention_block_bf16(const ks_kv_seg16 *segs, int nseg, const int32_t *n_att, int R, int hd, int G,
                             const float *q, size_t q_stride, float *out, size_t out_stride, float *scratch,
                             float scale) {
    (void)segs, (void)nseg, (void)n_att, (void)R, (void)hd, (void)G, (void)q, (void)q_stride, (void)out;
    (void)out_stride, (void)scratch, (void)scale;
    return false;
}
bool ks_attention_block_bf16_kv(ks_kv_type kt, const ks_kv_seg *segs, int nseg, const int32_t *n_att, int R, int hd,
                                int G, const float *q, size_t q_stride, float *out, size_t out_stride, float *scratch,
                                float scale) {
    (void)kt, (void)segs, (void)nseg, (void)n_att, (void)R, (void)hd, (void)G, (void)q, (void)q_stride, (void)out;
    (void)out_stride, (void)scratch, (void)scale;
    return false;
}
bool ks_attention_block_bf16_sinks(ks_kv_type kt, const ks_kv_seg *segs, int nseg, const int32_t *n_att, int R,
                                   int hd, int G, const float *q, size_t q_stride, float *out, size_t out_stride,
                                   float *scratch, float scale, const float *sinks) {
    (void)sinks;
    return ks_attention_block_bf16_kv(kt, segs, nseg, n_att, R, hd, G, q, q_stride, out, out_stride, scratch, scale);
}
#endif
