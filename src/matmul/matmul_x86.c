/*
 * matmul_x86.c — the x86 SIMD kernels, written once and compiled twice.
 *
 * Why a template: the AVX2 and AVX-512 kernels differ in a handful of
 * primitives (the u8 x s8 dot product is maddubs+madd on AVX2 and one VNNI
 * dpbusd on AVX-512; float kernels use 8 or 16 lanes) but share every block
 * layout detail, which is where bugs hide.  matmul.c includes this file once
 * per level with KS_MM_SFX / KS_MM_TGT / KS_MM_LEVEL defined, and every
 * function carries __attribute__((target(KS_MM_TGT))) so the library builds
 * without -march flags and picks a level at run time.  Compiled on its own
 * (CMake compiles every .c under src/tensor) the file is empty.
 *
 * The AVX2 integer kernels work on 32-byte (ymm) runs: one Q8_0/Q4_0 block
 * or one Q4_K sub-block is exactly 32 bytes.  At the AVX-512 level every
 * integer kernel has a zmm form instead (Q8_0/Q4_0 grouped four blocks per
 * zmm, Q4_K/Q6_K a super-block as four zmm; see their sections, the
 * K-quants' in matmul_x86_kquant.c): at n = 1 these kernels are bound by
 * vector ops per MAC and per-block bookkeeping, not by the multiplies, and
 * the zmm forms cut both.  Products stay exact in int16 / int32:
 * activations are in [-127, 127], weights in [-128, 127]
 * (Q8_0, via the sign trick |w| * sign(a, w), or w + 128 unsigned at the
 * AVX-512 level), [0, 15] (Q4_K) or [0, 63] (Q6_K), so no maddubs pair can
 * saturate (max 2 * 128 * 127 = 32512).
 *
 * The activation quantizers that feed these kernels are matmul_x86_quant.c,
 * the same kind of template; the AVX-512 prefill tiles over packed weights
 * are matmul_x86_panel.c.
 *
 * Each kernel takes nc (1..4) vectors; a switch maps nc to an always-inline
 * body with a constant count, so accumulators live in registers and a weight
 * block is loaded, unpacked and scaled once for all nc vectors.
 */
#ifndef KS_MM_TEMPLATE_PASS
typedef int ks_matmul_x86_is_included_by_matmul_c; /* standalone: nothing to compile */
#else

#define KS_MM_FN static __attribute__((target(KS_MM_TGT)))
#define KS_MM_INL static inline __attribute__((target(KS_MM_TGT), always_inline))

/* ---------------------------------------------------------- primitives -- */

KS_MM_INL float KS_MM_SFX(ks_mm_hsum8)(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* acc + sum of 4 adjacent u8*s8 products per int32 lane */
KS_MM_INL __m256i KS_MM_SFX(ks_mm_dot_u8s8)(__m256i acc, __m256i u, __m256i s) {
#if KS_MM_LEVEL >= 2
    return _mm256_dpbusd_epi32(acc, u, s);
#else
    __m256i p = _mm256_maddubs_epi16(u, s);
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
#endif
}

/* acc + (int16 products p) * (int16 scales sc), pairwise summed into int32 */
KS_MM_INL __m256i KS_MM_SFX(ks_mm_dot_i16)(__m256i acc, __m256i p, __m256i sc) {
#if KS_MM_LEVEL >= 2
    return _mm256_dpwssd_epi32(acc, p, sc);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, sc));
#endif
}

KS_MM_INL float KS_MM_SFX(ks_mm_h2f)(ks_f16 h) { return _cvtsh_ss(h); }

/* --------------------------------------------------------- float weights -- */
#if KS_MM_LEVEL >= 2
#define KS_MM_FVL 16
typedef __m512 KS_MM_SFX(ks_mm_fvec);
#define KS_MM_FZERO() _mm512_setzero_ps()
#define KS_MM_FLOAD(p) _mm512_loadu_ps(p)
#define KS_MM_FFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define KS_MM_FHSUM(v) _mm512_reduce_add_ps(v)
#define KS_MM_FLOAD_F16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define KS_MM_FLOAD_BF16(p) \
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
#else
#define KS_MM_FVL 8
typedef __m256 KS_MM_SFX(ks_mm_fvec);
#define KS_MM_FZERO() _mm256_setzero_ps()
#define KS_MM_FLOAD(p) _mm256_loadu_ps(p)
#define KS_MM_FFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define KS_MM_FHSUM(v) KS_MM_SFX(ks_mm_hsum8)(v)
#define KS_MM_FLOAD_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define KS_MM_FLOAD_BF16(p) \
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
#endif

/* One body for f32/f16/bf16: WT is the element type, LOADW converts FVL of
 * them to f32 lanes, CVT1 converts one (tail). */
#define KS_MM_FLOAT_KERNEL(name, WT, LOADW, CVT1)                                                  \
    KS_MM_INL void KS_MM_SFX(name##_body)(const uint8_t *w, const uint8_t *xq, size_t xs,          \
                                          int64_t cols, float *y, int64_t ys, const int NC) {      \
        const WT *wr = (const WT *)w;                                                              \
        KS_MM_SFX(ks_mm_fvec) acc[4];                                                              \
        _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) acc[c] = KS_MM_FZERO();               \
        int64_t i = 0;                                                                             \
        for (; i + KS_MM_FVL <= cols; i += KS_MM_FVL) {                                            \
            KS_MM_SFX(ks_mm_fvec) wv = LOADW(wr + i);                                              \
            _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) acc[c] =                          \
                KS_MM_FFMA(wv, KS_MM_FLOAD((const float *)(xq + c * xs) + i), acc[c]);             \
        }                                                                                          \
        _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) {                                     \
            const float *x = (const float *)(xq + c * xs);                                         \
            float s = KS_MM_FHSUM(acc[c]);                                                         \
            for (int64_t k = i; k < cols; k++) s += CVT1(wr[k]) * x[k];                            \
            y[c * ys] = s;                                                                         \
        }                                                                                          \
    }                                                                                              \
    KS_MM_FN void KS_MM_SFX(name)(const uint8_t *w, const uint8_t *xq, size_t xs, int nc,          \
                                  int64_t cols, float *y, int64_t ys) {                            \
        KS_MM_NC_SWITCH(KS_MM_SFX(name##_body), w, xq, xs, cols, y, ys)                            \
    }

#define KS_MM_ID(x) (x)
KS_MM_FLOAT_KERNEL(ks_mm_f32, float, KS_MM_FLOAD, KS_MM_ID)
KS_MM_FLOAT_KERNEL(ks_mm_f16, ks_f16, KS_MM_FLOAD_F16, ks_f16_to_f32)
KS_MM_FLOAT_KERNEL(ks_mm_bf16, ks_bf16, KS_MM_FLOAD_BF16, ks_bf16_to_f32)
#undef KS_MM_ID
#undef KS_MM_FLOAT_KERNEL
#undef KS_MM_FVL
#undef KS_MM_FZERO
#undef KS_MM_FLOAD
#undef KS_MM_FFMA
#undef KS_MM_FHSUM
#undef KS_MM_FLOAD_F16
#undef KS_MM_FLOAD_BF16

/* ------------------------------------------------- Q8_0 / Q4_0 weights --
 * Both become 32 signed int8 weights + one f32 scale per block; the dot with
 * signed activations uses |w| (unsigned) times sign(a, w).  AVX2 only: the
 * AVX-512 level uses the grouped kernels below. */
#if KS_MM_LEVEL < 2

KS_MM_INL __m256i KS_MM_SFX(ks_mm_load_q8_0)(const ks_block_q8_0 *b) {
    return _mm256_loadu_si256((const __m256i *)b->qs);
}

KS_MM_INL __m256i KS_MM_SFX(ks_mm_load_q4_0)(const ks_block_q4_0 *b) {
    __m128i q = _mm_loadu_si128((const __m128i *)b->qs);
    __m128i m = _mm_set1_epi8(0x0F);
    __m128i lo = _mm_and_si128(q, m), hi = _mm_and_si128(_mm_srli_epi16(q, 4), m);
    return _mm256_sub_epi8(_mm256_set_m128i(hi, lo), _mm256_set1_epi8(8));
}

/* One block for all NC vectors into acc[]; dw is broadcast once and each
 * vector's scale is folded in with one multiply (the f32 activation scale is
 * a broadcast load, free of ALU work). */
#define KS_MM_Q32_STEP(LOADB, wb, b, acc)                                                          \
    do {                                                                                           \
        __m256i wq = LOADB((wb) + (b));                                                            \
        __m256i wa = _mm256_sign_epi8(wq, wq);                                                     \
        const __m256 dwv = _mm256_set1_ps(KS_MM_SFX(ks_mm_h2f)((wb)[b].d));                        \
        _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) {                                     \
            const uint8_t *xc = xq + c * xs;                                                       \
            __m256i a = _mm256_loadu_si256((const __m256i *)(xc + 32 * (b)));                      \
            __m256i p = KS_MM_SFX(ks_mm_dot_u8s8)(_mm256_setzero_si256(), wa,                      \
                                                  _mm256_sign_epi8(a, wq));                        \
            __m256 s = _mm256_mul_ps(dwv, _mm256_set1_ps(((const float *)(xc + doff))[b]));        \
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), s, acc[c]);                            \
        }                                                                                          \
    } while (0)

/* Software prefetch distance in blocks.  A row of a 2048-column matrix is
 * 64 blocks, so the prefetch runs into the next row, which the hardware
 * prefetcher (it stops at 4 KiB pages) would otherwise find late. */
#ifndef KS_MM_Q32_PF_BLOCKS
#define KS_MM_Q32_PF_BLOCKS 128
#endif

/* Two accumulator sets (even / odd blocks) hide the FMA latency at n = 1. */
#define KS_MM_Q32_KERNEL(name, BT, LOADB)                                                          \
    KS_MM_INL void KS_MM_SFX(name##_body)(const uint8_t *w, const uint8_t *xq, size_t xs,          \
                                          int64_t cols, float *y, int64_t ys, const int NC) {      \
        const BT *wb = (const BT *)w;                                                              \
        const int64_t nb = cols / 32;                                                              \
        const size_t doff = ks_mm_align64((size_t)cols);                                           \
        __m256 acc0[4], acc1[4];                                                                   \
        _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) acc0[c] = acc1[c] = _mm256_setzero_ps(); \
        int64_t b = 0;                                                                             \
        for (; b + 1 < nb; b += 2) {                                                               \
            /* two lines per two blocks (<= 68 bytes), KS_MM_Q32_PF_BLOCKS ahead (into the next row) */ \
            _mm_prefetch((const char *)((uintptr_t)(wb + b) + KS_MM_Q32_PF_BLOCKS * sizeof(BT)), _MM_HINT_T0); \
            _mm_prefetch((const char *)((uintptr_t)(wb + b) + KS_MM_Q32_PF_BLOCKS * sizeof(BT) + 64), _MM_HINT_T0); \
            KS_MM_Q32_STEP(LOADB, wb, b, acc0);                                                    \
            KS_MM_Q32_STEP(LOADB, wb, b + 1, acc1);                                                \
        }                                                                                          \
        if (b < nb) KS_MM_Q32_STEP(LOADB, wb, b, acc0);                                            \
        _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) y[c * ys] =                           \
            KS_MM_SFX(ks_mm_hsum8)(_mm256_add_ps(acc0[c], acc1[c]));                               \
    }                                                                                              \
    KS_MM_FN void KS_MM_SFX(name)(const uint8_t *w, const uint8_t *xq, size_t xs, int nc,          \
                                  int64_t cols, float *y, int64_t ys) {                            \
        KS_MM_NC_SWITCH(KS_MM_SFX(name##_body), w, xq, xs, cols, y, ys)                            \
    }

KS_MM_Q32_KERNEL(ks_mm_q8_0, ks_block_q8_0, KS_MM_SFX(ks_mm_load_q8_0))
KS_MM_Q32_KERNEL(ks_mm_q4_0, ks_block_q4_0, KS_MM_SFX(ks_mm_load_q4_0))
#undef KS_MM_Q32_KERNEL
#undef KS_MM_Q32_STEP
#endif /* KS_MM_LEVEL < 2 */

/* ------------------------------------- Q8_0 / Q4_0, AVX-512 grouped form --
 * Why a second kernel at this level.  The ymm kernel above spends five
 * vector ops per 32-MAC block and vector (sign of the activation, dpbusd,
 * int->float, scale multiply, FMA), and on a core that runs zmm ops as two
 * 256-bit halves widening alone gains nothing: only removing ops per MAC
 * does.  Three of the five are the per-block float epilogue, paid on
 * eight int32 lanes that all belong to one block.  So the grouped form packs
 * FOUR blocks into one zmm with only four lanes each: 128-bit lane k holds
 * elements 0-15 of block 4g+k in register LO and elements 16-31 in HI, two
 * dpbusd fill each int32 lane with eight products of one block, and one
 * cvt + mul + fma covers 128 MACs.  Per vector and 4 blocks that is 5 zmm
 * ops (10 half-ops) for 128 MACs against the ymm kernel's 20.
 *
 * What makes it possible is that the activation side is ours: the AVX-512
 * quantizer (ks_mm_quantize_q8x) writes each vector group by group in
 * exactly that lane order, so the activations are dpbusd's memory operand,
 * with no per-vector shuffle, and the weight side is rearranged once per
 * group for all vectors of the tile (two 128-bit lane shuffles for Q8_0; for
 * Q4_0 the nibble split gives the halves for free).  dpbusd wants u8 x s8,
 * so the weights are made unsigned — Q8_0 as w + 128 (xor 0x80), Q4_0 as the
 * raw nibble, i.e. w + 8 — and the offset is removed exactly in int32: the
 * quantizer stores, per lane, corr = -off * (sum of the eight activations the
 * lane multiplies), and the kernel starts the dpbusd chain from it (a plain
 * load).  The activation scale arrives pre-expanded to 16 floats (one per
 * lane), so scaling is one multiply with a memory operand by the group's
 * weight-scale vector, built once per group for all vectors.
 *
 * Partner layout per vector (KS_MM_Q8X_GROUP = 256 bytes per 4 blocks):
 *   int8  lo[64]    lo[16k + i] = q[4g+k][i]        (i < 16)
 *   int8  hi[64]    hi[16k + i] = q[4g+k][16 + i]
 *   float d[16]     d[4k + m]   = scale of block 4g+k
 *   int32 corr[16]  corr[4k+m]  = -off * sum_{j<4} (q[4g+k][4m+j] + q[4g+k][16+4m+j])
 * A trailing partial group is zero-padded (q = d = corr = 0), and the kernel
 * reads no weight block past the row: missing blocks dot zero activations
 * with zero weights and a zero scale.  Products stay exact: a lane sums at
 * most 8 * 255 * 127 plus the correction. */
#if KS_MM_LEVEL >= 2

/* The 64-bit word of four f16 block scales -> one f32 per lane, in the
 * group's lane order ([d0 x4, d1 x4, d2 x4, d3 x4]). */
KS_MM_INL __m512 KS_MM_SFX(ks_mm_dw4)(uint64_t h4) {
    const __m128 f = _mm_cvtph_ps(_mm_cvtsi64_si128((long long)h4));
    const __m512i idx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(f));
}

/* Q8_0 group: four blocks (pointers, so a tail can point at zeros) -> LO, HI
 * as u8 (w + 128) and the weight-scale vector. */
KS_MM_INL void KS_MM_SFX(ks_mm_q8x_wgroup)(const ks_block_q8_0 *b0, const ks_block_q8_0 *b1,
                                           const ks_block_q8_0 *b2, const ks_block_q8_0 *b3,
                                           __m512i *lo, __m512i *hi, __m512 *dw) {
    const __m512i z01 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)b0->qs)),
                                           _mm256_loadu_si256((const __m256i *)b1->qs), 1);
    const __m512i z23 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)b2->qs)),
                                           _mm256_loadu_si256((const __m256i *)b3->qs), 1);
    const __m512i x80 = _mm512_set1_epi8((char)0x80);
    /* 128-bit lanes of z01 = [b0 lo, b0 hi, b1 lo, b1 hi]: pick 0,2 | 1,3 */
    *lo = _mm512_xor_si512(_mm512_shuffle_i64x2(z01, z23, _MM_SHUFFLE(2, 0, 2, 0)), x80);
    *hi = _mm512_xor_si512(_mm512_shuffle_i64x2(z01, z23, _MM_SHUFFLE(3, 1, 3, 1)), x80);
    *dw = KS_MM_SFX(ks_mm_dw4)((uint64_t)b0->d | (uint64_t)b1->d << 16 | (uint64_t)b2->d << 32 |
                               (uint64_t)b3->d << 48);
}

/* Q4_0 group: the 16 packed bytes of block k fill 128-bit lane k; low
 * nibbles are elements 0-15 (LO), high nibbles 16-31 (HI), both u8 = w + 8. */
KS_MM_INL void KS_MM_SFX(ks_mm_q4x_wgroup)(const ks_block_q4_0 *b0, const ks_block_q4_0 *b1,
                                           const ks_block_q4_0 *b2, const ks_block_q4_0 *b3,
                                           __m512i *lo, __m512i *hi, __m512 *dw) {
    const __m256i y01 = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)b0->qs)),
                                                _mm_loadu_si128((const __m128i *)b1->qs), 1);
    const __m256i y23 = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)b2->qs)),
                                                _mm_loadu_si128((const __m128i *)b3->qs), 1);
    const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(y01), y23, 1);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    *lo = _mm512_and_si512(z, m4);
    *hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), m4);
    *dw = KS_MM_SFX(ks_mm_dw4)((uint64_t)b0->d | (uint64_t)b1->d << 16 | (uint64_t)b2->d << 32 |
                               (uint64_t)b3->d << 48);
}

/* Software prefetch distance of the grouped Q8_0/Q4_0 kernels, in blocks of a
 * row (128 Q8_0 blocks = 4.3 KB; past a row's end it lands in the rows the
 * thread takes next, which the hardware prefetcher, stopping at 4 KiB pages,
 * would find late).  Far enough ahead to cover DRAM latency at full
 * bandwidth, near enough that prefetched lines are not evicted before use. */
#define KS_MM_PF_BLOCKS 128
/* as an address offset: prefetching past the array's end is harmless, forming the pointer is not */
#define KS_MM_PF_BYTES(BT) ((uintptr_t)KS_MM_PF_BLOCKS * sizeof(BT))

/* One group of NR rows (wg[r]: that row's first block of the group) for NC
 * vectors: corr + LO.lo + HI.hi in int32, then one cvt, one multiply by the
 * pre-expanded activation scale, one FMA.  The activation loads of a vector
 * are shared by the NR rows, which halves L1/L2 traffic per MAC at NR = 2
 * (the activations of a 4-vector tile outgrow L1 once cols > ~2048). */
#define KS_MM_QX_GROUP(BT, WGROUP, wg, nblk, goff)                                                 \
    do {                                                                                           \
        __m512i lo[2], hi[2];                                                                      \
        __m512 dw[2];                                                                              \
        _Pragma("GCC unroll 2") for (int r = 0; r < NR; r++) {                                     \
            static const BT zb; /* d = 0, qs = 0: stands in for blocks past the row */             \
            const BT *b0 = (wg)[r];                                                                \
            WGROUP(b0, (nblk) > 1 ? b0 + 1 : &zb, (nblk) > 2 ? b0 + 2 : &zb, (nblk) > 3 ? b0 + 3 : &zb, \
                   &lo[r], &hi[r], &dw[r]);                                                        \
        }                                                                                          \
        _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) {                                     \
            const uint8_t *xg = xq + c * xs + (goff);                                              \
            const __m512i corr = _mm512_load_si512((const void *)(xg + 192));                      \
            const __m512i alo = _mm512_load_si512((const void *)xg);                               \
            const __m512i ahi = _mm512_load_si512((const void *)(xg + 64));                        \
            const __m512 dx = _mm512_load_ps((const void *)(xg + 128));                            \
            _Pragma("GCC unroll 2") for (int r = 0; r < NR; r++) {                                 \
                __m512i p = _mm512_dpbusd_epi32(corr, lo[r], alo);                                 \
                p = _mm512_dpbusd_epi32(p, hi[r], ahi);                                            \
                acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dw[r], dx),       \
                                            acc[r][c]);                                            \
            }                                                                                      \
        }                                                                                          \
    } while (0)

/* NR (1..2) rows from w, row stride wrow, times NC vectors; y[c*ys + r]. */
#define KS_MM_QX_KERNEL(name, BT, WGROUP)                                                          \
    KS_MM_INL void KS_MM_SFX(name##_body)(const uint8_t *w, size_t wrow, const uint8_t *xq,        \
                                          size_t xs, int64_t cols, float *y, int64_t ys,           \
                                          const int NR, const int NC) {                            \
        const int64_t nb = cols / 32;                                                              \
        __m512 acc[2][4];                                                                          \
        _Pragma("GCC unroll 2") for (int r = 0; r < NR; r++)                                       \
            _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) acc[r][c] = _mm512_setzero_ps();  \
        const BT *wg[2] = {(const BT *)w, (const BT *)(w + (NR > 1 ? wrow : 0))};                  \
        int64_t b = 0;                                                                             \
        for (; b + 4 <= nb; b += 4) {                                                              \
            _Pragma("GCC unroll 2") for (int r = 0; r < NR; r++) {                                 \
                _mm_prefetch((const char *)((uintptr_t)wg[r] + KS_MM_PF_BYTES(BT)), _MM_HINT_T0);  \
                _mm_prefetch((const char *)((uintptr_t)wg[r] + KS_MM_PF_BYTES(BT) + 64), _MM_HINT_T0); \
            }                                                                                      \
            KS_MM_QX_GROUP(BT, WGROUP, wg, 4, (size_t)b / 4 * KS_MM_Q8X_GROUP);                    \
            wg[0] += 4;                                                                            \
            wg[1] += 4;                                                                            \
        }                                                                                          \
        if (b < nb) { /* 1-3 trailing blocks, zero-padded in the partner */                        \
            const int64_t left = nb - b;                                                           \
            KS_MM_QX_GROUP(BT, WGROUP, wg, left, (size_t)b / 4 * KS_MM_Q8X_GROUP);                 \
        }                                                                                          \
        _Pragma("GCC unroll 2") for (int r = 0; r < NR; r++)                                       \
            _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) y[c * ys + r] =                   \
                _mm512_reduce_add_ps(acc[r][c]);                                                   \
    }                                                                                              \
    KS_MM_INL void KS_MM_SFX(name##_r1)(const uint8_t *w, const uint8_t *xq, size_t xs,            \
                                        int64_t cols, float *y, int64_t ys, const int NC) {        \
        KS_MM_SFX(name##_body)(w, 0, xq, xs, cols, y, ys, 1, NC);                                  \
    }                                                                                              \
    KS_MM_INL void KS_MM_SFX(name##_r2)(const uint8_t *w, size_t wrow, const uint8_t *xq,          \
                                        size_t xs, int64_t cols, float *y, int64_t ys,             \
                                        const int NC) {                                            \
        KS_MM_SFX(name##_body)(w, wrow, xq, xs, cols, y, ys, 2, NC);                               \
    }                                                                                              \
    KS_MM_FN void KS_MM_SFX(name)(const uint8_t *w, const uint8_t *xq, size_t xs, int nc,          \
                                  int64_t cols, float *y, int64_t ys) {                            \
        KS_ASSERT(((uintptr_t)xq & 63) == 0 && (xs & 63) == 0);                                    \
        KS_MM_NC_SWITCH(KS_MM_SFX(name##_r1), w, xq, xs, cols, y, ys)                              \
    }                                                                                              \
    KS_MM_FN void KS_MM_SFX(name##2)(const uint8_t *w, size_t wrow, const uint8_t *xq, size_t xs,  \
                                     int nc, int64_t cols, float *y, int64_t ys) {                 \
        KS_ASSERT(((uintptr_t)xq & 63) == 0 && (xs & 63) == 0);                                    \
        KS_MM_NC_SWITCH(KS_MM_SFX(name##_r2), w, wrow, xq, xs, cols, y, ys)                        \
    }

KS_MM_QX_KERNEL(ks_mm_q8_0x, ks_block_q8_0, KS_MM_SFX(ks_mm_q8x_wgroup))
KS_MM_QX_KERNEL(ks_mm_q4_0x, ks_block_q4_0, KS_MM_SFX(ks_mm_q4x_wgroup))
#undef KS_MM_QX_KERNEL
#undef KS_MM_QX_GROUP

#endif /* KS_MM_LEVEL >= 2 */

/* ------------------------------------------------------ Q4_K / Q6_K --
 * The one-row K-quant kernels (zmm forms at AVX-512, ymm at AVX2):
 * matmul_x86_kquant.c, a part of this template. */
#define KS_MM_KQUANT_PART 1
#include "matmul_x86_kquant.c"
#undef KS_MM_KQUANT_PART

#undef KS_MM_FN
#undef KS_MM_INL
#endif /* KS_MM_TEMPLATE_PASS */
