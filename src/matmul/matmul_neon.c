/*
 * matmul_neon.c — the AArch64 kernels of ks_matmul (NEON, dot product and
 * int8 matrix multiply).  Not a translation unit of its own: matmul.c
 * includes it twice (KS_MM_NEON_PASS), once per SIMD level family, like
 * matmul_x86.c, so the kernels share matmul.c's partner layouts, its scalar
 * helpers and its driver.  Compiled alone (the module's source glob picks it
 * up) it is empty.
 *
 * Why it is shaped this way.
 *   - One source, two instruction sets.  The integer dot of a 32-block is
 *     written once with KS_NDOT(acc, a, b), "acc += the 16 products a*b,
 *     summed into four int32 lanes": sdot (FEAT_DotProd) in the dot pass;
 *     smull + sadalp (two widening multiplies and pairwise add-accumulates,
 *     Armv8.0) in the plain pass.  Both give the block's exact integer sum
 *     once the lanes are added, only the lanes' split differs.
 *   - Every level gives the same bits.  The integer sums are exact, and
 *     everything after them (the scale product, the f32 accumulation in
 *     groups of four blocks, the horizontal sum, the scalar tail) is the same
 *     code in every pass.  So plain NEON, sdot and smmla (the two-row i8mm
 *     form below) agree bit for bit, a run on a Cortex-A53 reproduces one on
 *     a Neoverse V1, and the choice between one-row and two-row kernels
 *     (which depends on the batch) never changes a result.  Q4_K and Q6_K go
 *     further: they keep the scalar kernel's very float expression per
 *     block, so they equal the scalar reference exactly.
 *   - The partner layouts are the scalar ones (matmul.c): int8 activations
 *     then f32 scales for Q8_0 / Q4_0, ks_block_q8_k for the K-quants.  NEON
 *     has no need of the AVX-512 lane orders, and one layout at every ARM
 *     level keeps ks_matmul_quantize_x level-independent here.
 *   - smmla (FEAT_I8MM) multiplies a 2x8 by an 8x2 int8 matrix: two weight
 *     rows against two activation vectors, 32 MACs per instruction against
 *     sdot's 16.  It is the two-row kernel form (ks_mm_kern2) that the
 *     driver uses for batches (n > 1): prefill's GEMM.  Every quantized type
 *     has one.  Its four integer results come out as [row0.x, row0.y,
 *     row1.x, row1.y]; each form then does exactly its sdot kernel's float
 *     arithmetic per output, so at every n it gives the sdot kernel's bits:
 *     Q8_0 / Q4_0 transpose four blocks of them so each output again holds
 *     four consecutive blocks in its lanes, the layout the shared f32 step
 *     expects; the mix types run their per-block float expression on the
 *     four lanes at once; the K-types weight each sub-block's four dots by
 *     its scales as [row0, row0, row1, row1] in int32 (the sdot kernels'
 *     exact sums) and finish each output with its kernel's float step.
 *     That form is matmul_neon_i8mm.c, included in the dot pass below.
 */
#ifndef KS_MM_NEON_PASS
typedef int ks_matmul_neon_empty; /* ISO C forbids an empty translation unit */
#else

/* ------------------------------------------------ once: shared helpers -- */
#ifndef KS_MM_NEON_COMMON
#define KS_MM_NEON_COMMON 1

#if defined(__clang__)
#define KS_NEON_TGT_DOT __attribute__((target("dotprod")))
#define KS_NEON_TGT_I8MM __attribute__((target("dotprod,i8mm")))
#else
#define KS_NEON_TGT_DOT __attribute__((target("arch=armv8.2-a+dotprod")))
#define KS_NEON_TGT_I8MM __attribute__((target("arch=armv8.2-a+dotprod+i8mm"))) /* the arch arm_neon.h asks of vmmlaq */
#endif
#define KS_NEON_INLINE static inline __attribute__((always_inline))
/* Unroll the fixed 2-, 4- and 8-trip loops over blocks and registers: left
 * as loops, GCC keeps their arrays of vectors in memory (a store and a
 * reload per element) instead of in registers. */
#define KS_NEON_UNROLL _Pragma("GCC unroll 8")

/* four f16 scales (the d fields of four blocks) as f32: fcvtl is exact */
KS_NEON_INLINE float32x4_t ks_neon_f16x4(ks_f16 a, ks_f16 b, ks_f16 c, ks_f16 d) {
    const uint16_t h[4] = {a, b, c, d};
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h)));
}

/* [sum a, sum b, sum c, sum d]: four blocks' lane partials to their sums */
KS_NEON_INLINE int32x4_t ks_neon_hsum4(int32x4_t a, int32x4_t b, int32x4_t c, int32x4_t d) {
    return vpaddq_s32(vpaddq_s32(a, b), vpaddq_s32(c, d));
}

/* One block's weights as two int8x16 (elements 0..15 and 16..31). */
KS_NEON_INLINE void ks_neon_load_q8_0(const ks_block_q8_0 *b, int8x16_t *w0, int8x16_t *w1) {
    *w0 = vld1q_s8(b->qs);
    *w1 = vld1q_s8(b->qs + 16);
}

/* Q4_0: low nibbles are elements 0..15, high nibbles 16..31, offset 8 */
KS_NEON_INLINE void ks_neon_load_q4_0(const ks_block_q4_0 *b, int8x16_t *w0, int8x16_t *w1) {
    uint8x16_t v = vld1q_u8(b->qs);
    *w0 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0F))), vdupq_n_s8(8));
    *w1 = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), vdupq_n_s8(8));
}

/* The f32 step every Q8_0/Q4_0 kernel shares: acc += isum4 * (dw4 * dx4),
 * four consecutive blocks in the lanes (the same operations in the same
 * order at every level, hence the same bits). */
KS_NEON_INLINE float32x4_t ks_neon_q8_step(float32x4_t acc, int32x4_t isum, float32x4_t dw, float32x4_t dx) {
    return vfmaq_f32(acc, vcvtq_f32_s32(isum), vmulq_f32(dw, dx));
}

/* The blocks past the last group of four, and the horizontal sum: one f32
 * result, identical code at every level. */
#define KS_NEON_Q8_FINISH(BT, DOTFN, wb, b0, nb, q, d, acc, out)                        \
    do {                                                                                 \
        float s_ = vaddvq_f32(acc);                                                      \
        for (int64_t bb_ = (b0); bb_ < (nb); bb_++)                                      \
            s_ += ks_f16_to_f32((wb)[bb_].d) * (d)[bb_] * (float)DOTFN(&(wb)[bb_], (q) + bb_ * 32); \
        (out) = s_;                                                                      \
    } while (0)

/* 4x4 int32 transpose: r_i = [a_i, b_i, c_i, d_i] -> o = [a0..a3], [b0..b3], [c0..c3], [d0..d3] */
KS_NEON_INLINE void ks_neon_transpose4(int32x4_t r0, int32x4_t r1, int32x4_t r2, int32x4_t r3, int32x4_t *o) {
    int32x4_t t0 = vtrn1q_s32(r0, r1), t1 = vtrn2q_s32(r0, r1), t2 = vtrn1q_s32(r2, r3), t3 = vtrn2q_s32(r2, r3);
    o[0] = vreinterpretq_s32_s64(vtrn1q_s64(vreinterpretq_s64_s32(t0), vreinterpretq_s64_s32(t2)));
    o[1] = vreinterpretq_s32_s64(vtrn1q_s64(vreinterpretq_s64_s32(t1), vreinterpretq_s64_s32(t3)));
    o[2] = vreinterpretq_s32_s64(vtrn2q_s64(vreinterpretq_s64_s32(t0), vreinterpretq_s64_s32(t2)));
    o[3] = vreinterpretq_s32_s64(vtrn2q_s64(vreinterpretq_s64_s32(t1), vreinterpretq_s64_s32(t3)));
}

/* f32 / f16 / bf16 weights: eight columns at a time, the row converted once
 * for all nc vectors; two accumulators per vector hide the FMA latency.
 * The body is instantiated per vector count (NAME##_nc with a constant nc,
 * dispatched by a switch): with a run-time nc GCC keeps acc[][] on the stack,
 * a load and a store around every FMA, about 4x the AVX2 kernel's
 * instructions per weight byte (docs/BENCHMARKS.md); with a constant one the
 * vector loop unrolls and the accumulators live in registers.  The main loop
 * takes 16 columns a trip as two 8-column steps into the same two chains, so
 * the arithmetic, and the bits, are those of one 8-column step at a time. */
_Static_assert(KS_MM_NC == 4, "KS_NEON_FLOAT_KERNEL's switch covers nc = 1..4");
#define KS_NEON_FLOAT_STEP(WT, LOAD8, wr, i, nc, xq, xs, acc)                                            \
    do {                                                                                               \
        float32x4_t w0_, w1_;                                                                          \
        LOAD8((wr) + (i), w0_, w1_);                                                                   \
        KS_NEON_UNROLL for (int c_ = 0; c_ < (nc); c_++) {                                             \
            const float *x_ = (const float *)((xq) + c_ * (xs)) + (i);                                 \
            acc[c_][0] = vfmaq_f32(acc[c_][0], w0_, vld1q_f32(x_));                                    \
            acc[c_][1] = vfmaq_f32(acc[c_][1], w1_, vld1q_f32(x_ + 4));                                \
        }                                                                                              \
    } while (0)
#define KS_NEON_FLOAT_KERNEL(NAME, WT, LOAD8, CONV1)                                                   \
    KS_NEON_INLINE void NAME##_nc(const uint8_t *w, const uint8_t *xq, size_t xs, const int nc,         \
                                  int64_t cols, float *y, int64_t ys) {                                \
        const WT *wr = (const WT *)w;                                                                  \
        float32x4_t acc[KS_MM_NC][2];                                                                  \
        KS_NEON_UNROLL for (int c = 0; c < nc; c++) acc[c][0] = acc[c][1] = vdupq_n_f32(0.0f);         \
        int64_t i = 0;                                                                                 \
        for (; i + 16 <= cols; i += 16) {                                                              \
            KS_NEON_FLOAT_STEP(WT, LOAD8, wr, i, nc, xq, xs, acc);                                     \
            KS_NEON_FLOAT_STEP(WT, LOAD8, wr, i + 8, nc, xq, xs, acc);                                 \
        }                                                                                              \
        for (; i + 8 <= cols; i += 8) KS_NEON_FLOAT_STEP(WT, LOAD8, wr, i, nc, xq, xs, acc);           \
        KS_NEON_UNROLL for (int c = 0; c < nc; c++) {                                                  \
            const float *x = (const float *)(xq + c * xs);                                             \
            float s = vaddvq_f32(vaddq_f32(acc[c][0], acc[c][1]));                                     \
            for (int64_t k = i; k < cols; k++) s += CONV1(wr[k]) * x[k];                               \
            y[c * ys] = s;                                                                             \
        }                                                                                              \
    }                                                                                                  \
    static void NAME(const uint8_t *w, const uint8_t *xq, size_t xs, int nc, int64_t cols, float *y,   \
                     int64_t ys) {                                                                     \
        switch (nc) {                                                                                  \
        case 1: NAME##_nc(w, xq, xs, 1, cols, y, ys); break;                                           \
        case 2: NAME##_nc(w, xq, xs, 2, cols, y, ys); break;                                           \
        case 3: NAME##_nc(w, xq, xs, 3, cols, y, ys); break;                                           \
        default: NAME##_nc(w, xq, xs, 4, cols, y, ys); break; /* nc is 1..KS_MM_NC (4) */              \
        }                                                                                              \
    }
#define KS_NEON_LOAD8_F32(p, a, b) ((a) = vld1q_f32(p), (b) = vld1q_f32((p) + 4))
#define KS_NEON_LOAD8_F16(p, a, b)                                                                     \
    do {                                                                                               \
        uint16x8_t h_ = vld1q_u16(p);                                                                  \
        (a) = vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(h_)));                                    \
        (b) = vcvt_high_f32_f16(vreinterpretq_f16_u16(h_)); /* fcvtl2 */                                     \
    } while (0)
#define KS_NEON_LOAD8_BF16(p, a, b)                                                                    \
    do {                                                                                               \
        uint16x8_t h_ = vld1q_u16(p);                                                                  \
        (a) = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h_), 16));                                \
        (b) = vreinterpretq_f32_u32(vshll_high_n_u16(h_, 16));                                         \
    } while (0)
KS_NEON_FLOAT_KERNEL(ks_mm_f32_neon, float, KS_NEON_LOAD8_F32, )
KS_NEON_FLOAT_KERNEL(ks_mm_f16_neon, ks_f16, KS_NEON_LOAD8_F16, ks_f16_to_f32)
KS_NEON_FLOAT_KERNEL(ks_mm_bf16_neon, ks_bf16, KS_NEON_LOAD8_BF16, ks_bf16_to_f32)

/* The Q8 partner's quantization (matmul.c, ks_mm_quantize_q8) in NEON, to
 * the same bytes: the same amax, d = amax / 127 and x * (1 / d), rounded to
 * nearest even as lrintf does in the default mode (fcvtns), so every level
 * reads one layout. */
static void ks_mm_quantize_q8_neon(const float *x, uint8_t *dst, int64_t cols) {
    int8_t *q = (int8_t *)dst;
    float *ds = (float *)(dst + ks_mm_align64((size_t)cols));
    for (int64_t b = 0; b < cols / KS_QK8_0; b++) {
        const float *xb = x + b * KS_QK8_0;
        float32x4_t v[8], m = vdupq_n_f32(0.0f);
        KS_NEON_UNROLL for (int k = 0; k < 8; k++) {
            v[k] = vld1q_f32(xb + 4 * k);
            m = vmaxq_f32(m, vabsq_f32(v[k]));
        }
        float amax = vmaxvq_f32(m);
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        ds[b] = d;
        int32x4_t r[8];
        KS_NEON_UNROLL for (int k = 0; k < 8; k++) r[k] = vcvtnq_s32_f32(vmulq_n_f32(v[k], id));
        KS_NEON_UNROLL for (int k = 0; k < 8; k += 2) {
            int16x8_t h = vcombine_s16(vmovn_s32(r[k]), vmovn_s32(r[k + 1]));
            vst1_s8(q + b * KS_QK8_0 + 4 * k, vmovn_s16(h));
        }
    }
}
/* The Q8_K partner of the K-quants and IQ4_XS (dtype.c, ks_quantize_row_q8_k)
 * in NEON, to the same bytes: amax over the 256-block, d = amax / 127,
 * x * (1 / d) rounded to nearest even (fcvtns, lrintf's default mode) and
 * held to [-127, 127], and the sums of each 16.  Scalar on ARM it cost about
 * as much per decode product as a Q2_K row set's dots (docs/BENCHMARKS.md,
 * "Counted at run time"); x86 has ks_mm_quantize_q8_k_avx2 for it. */
static void ks_mm_quantize_q8_k_neon(const float *x, uint8_t *dst, int64_t cols) {
    ks_block_q8_k *y = (ks_block_q8_k *)dst;
    for (int64_t b = 0; b < cols / KS_QK_K; b++, x += KS_QK_K) {
        float32x4_t m0 = vdupq_n_f32(0.0f), m1 = m0;
        for (int i = 0; i < KS_QK_K; i += 8) {
            m0 = vmaxq_f32(m0, vabsq_f32(vld1q_f32(x + i)));
            m1 = vmaxq_f32(m1, vabsq_f32(vld1q_f32(x + i + 4)));
        }
        const float amax = vmaxvq_f32(vmaxq_f32(m0, m1));
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = d;
        for (int i = 0; i < KS_QK_K; i += 16) {
            int32x4_t r[4];
            KS_NEON_UNROLL for (int k = 0; k < 4; k++) r[k] = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + i + 4 * k), id));
            const int16x8_t h0 = vcombine_s16(vqmovn_s32(r[0]), vqmovn_s32(r[1]));
            const int16x8_t h1 = vcombine_s16(vqmovn_s32(r[2]), vqmovn_s32(r[3]));
            const int8x16_t q = vmaxq_s8(vcombine_s8(vqmovn_s16(h0), vqmovn_s16(h1)), vdupq_n_s8(-127));
            vst1q_s8(y[b].qs + i, q);
            y[b].bsums[i / 16] = (int16_t)vaddvq_s16(vpaddlq_s8(q));
        }
    }
}
/* Q4_K's and Q5_K's eight 6-bit scales and mins from their 12 bytes, the
 * values ks_mm_q4k_scales gives, four at a time in 32-bit words (scale j < 4
 * is q[j] & 63, min j < 4 q[j + 4] & 63; for j >= 4 the low nibbles of
 * q[j + 4] take the top two bits of q[j - 4] (scales) or q[j] (mins) as
 * bits 4-5; every shift's spill into the next byte is masked off) */
KS_NEON_INLINE void ks_neon_q4k_scales8(const uint8_t *q, uint8x8_t *sc, uint8x8_t *m) {
    uint32_t w[3], s[2], n[2];
    memcpy(w, q, 12);
    s[0] = w[0] & 0x3F3F3F3Fu, n[0] = w[1] & 0x3F3F3F3Fu;
    s[1] = (w[2] & 0x0F0F0F0Fu) | ((w[0] >> 6) & 0x03030303u) << 4;
    n[1] = ((w[2] >> 4) & 0x0F0F0F0Fu) | ((w[1] >> 6) & 0x03030303u) << 4;
    *sc = vreinterpret_u8_u32(vld1_u32(s)), *m = vreinterpret_u8_u32(vld1_u32(n));
}

#endif /* KS_MM_NEON_COMMON */

/* ------------------------------------------- per pass: the dot kernels -- */

/* KS_NDOT(acc, a, b): acc (int32x4) += the 16 int8 products of a and b */
#if KS_MM_NEON_DOT
#define KS_NDOT(acc, a, b) vdotq_s32((acc), (a), (b))
#else
#define KS_NDOT(acc, a, b) vpadalq_s16(vpadalq_s16((acc), vmull_s8(vget_low_s8(a), vget_low_s8(b))), vmull_high_s8((a), (b)))
#endif

/* Q8_0 / Q4_0 against the Q8 partner: groups of four blocks, the weight
 * row's block loaded once for all nc vectors. */
#define KS_NEON_Q8X_KERNEL(NAME, BT, LOADW, DOTFN)                                                    \
    KS_MM_NTGT static void NAME(const uint8_t *w, const uint8_t *xq, size_t xs, int nc, int64_t cols, \
                                float *y, int64_t ys) {                                               \
        const BT *wb = (const BT *)w;                                                                 \
        const int64_t nb = cols / 32;                                                                 \
        const size_t qoff = ks_mm_align64((size_t)cols);                                              \
        float32x4_t acc[KS_MM_NC];                                                                    \
        for (int c = 0; c < KS_MM_NC; c++) acc[c] = vdupq_n_f32(0.0f);                                \
        int64_t b = 0;                                                                                \
        for (; b + 4 <= nb; b += 4) {                                                                 \
            int8x16_t wq[8];                                                                          \
            KS_NEON_UNROLL for (int k = 0; k < 4; k++) LOADW(&wb[b + k], &wq[2 * k], &wq[2 * k + 1]);                \
            const float32x4_t dw = ks_neon_f16x4(wb[b].d, wb[b + 1].d, wb[b + 2].d, wb[b + 3].d);     \
            for (int c = 0; c < nc; c++) {                                                            \
                const int8_t *q = (const int8_t *)(xq + c * xs) + b * 32;                             \
                int32x4_t s[4];                                                                       \
                KS_NEON_UNROLL for (int k = 0; k < 4; k++)                                                           \
                    s[k] = KS_NDOT(KS_NDOT(vdupq_n_s32(0), wq[2 * k], vld1q_s8(q + 32 * k)),          \
                                   wq[2 * k + 1], vld1q_s8(q + 32 * k + 16));                         \
                const float *d = (const float *)(xq + c * xs + qoff);                                 \
                acc[c] = ks_neon_q8_step(acc[c], ks_neon_hsum4(s[0], s[1], s[2], s[3]), dw,           \
                                         vld1q_f32(d + b));                                           \
            }                                                                                         \
        }                                                                                             \
        for (int c = 0; c < nc; c++) {                                                                \
            const int8_t *q = (const int8_t *)(xq + c * xs);                                          \
            const float *d = (const float *)(xq + c * xs + qoff);                                     \
            KS_NEON_Q8_FINISH(BT, DOTFN, wb, b, nb, q, d, acc[c], y[c * ys]);                         \
        }                                                                                             \
    }
KS_NEON_Q8X_KERNEL(KS_MM_NSFX(ks_mm_q8_0), ks_block_q8_0, ks_neon_load_q8_0, ks_mm_dot_q8_0)
KS_NEON_Q8X_KERNEL(KS_MM_NSFX(ks_mm_q4_0), ks_block_q4_0, ks_neon_load_q4_0, ks_mm_dot_q4_0)
#undef KS_NEON_Q8X_KERNEL

/* Q4_K against Q8_K, b outer and the vectors inner, so each super-block is
 * unpacked once per row.  Per 32-sub-block integer sums by KS_NDOT; the f32
 * expression per super-block is the scalar kernel's, so the result is too. */
KS_MM_NTGT static void KS_MM_NSFX(ks_mm_q4_k)(const uint8_t *w, const uint8_t *xq, size_t xs, int nc,
                                              int64_t cols, float *y, int64_t ys) {
    const ks_block_q4_k *wb = (const ks_block_q4_k *)w;
    const int64_t nb = cols / KS_QK_K;
    float s[KS_MM_NC] = {0};
    const uint8x16_t m4 = vdupq_n_u8(0x0F);
    for (int64_t b = 0; b < nb; b++) {
        uint8x8_t sc, m;
        ks_neon_q4k_scales8(wb[b].scales, &sc, &m);
        int8x16_t lo[8], hi[8]; /* sub-block 2p: lo[2p], lo[2p+1]; sub-block 2p+1: hi[...] */
        KS_NEON_UNROLL for (int p = 0; p < 4; p++)
            KS_NEON_UNROLL for (int h = 0; h < 2; h++) {
                uint8x16_t v = vld1q_u8(wb[b].qs + 32 * p + 16 * h);
                lo[2 * p + h] = vreinterpretq_s8_u8(vandq_u8(v, m4));
                hi[2 * p + h] = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
            }
        const int32x4_t sc_lo = vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(vmovl_u8(sc))));
        const int32x4_t sc_hi = vreinterpretq_s32_u32(vmovl_u16(vget_high_u16(vmovl_u8(sc))));
        const int16x8_t mm = vreinterpretq_s16_u16(vmovl_u8(m));
        const float dw = ks_f16_to_f32(wb[b].d), dmin = ks_f16_to_f32(wb[b].dmin);
        for (int c = 0; c < nc; c++) {
            const ks_block_q8_k *a = (const ks_block_q8_k *)(xq + c * xs) + b;
            int32x4_t j[8];
            KS_NEON_UNROLL for (int p = 0; p < 4; p++) {
                const int8_t *aq = a->qs + 64 * p;
                j[2 * p] = KS_NDOT(KS_NDOT(vdupq_n_s32(0), lo[2 * p], vld1q_s8(aq)), lo[2 * p + 1], vld1q_s8(aq + 16));
                j[2 * p + 1] =
                    KS_NDOT(KS_NDOT(vdupq_n_s32(0), hi[2 * p], vld1q_s8(aq + 32)), hi[2 * p + 1], vld1q_s8(aq + 48));
            }
            int32x4_t t = vmulq_s32(ks_neon_hsum4(j[0], j[1], j[2], j[3]), sc_lo);
            t = vmlaq_s32(t, ks_neon_hsum4(j[4], j[5], j[6], j[7]), sc_hi);
            const int32_t sumi = vaddvq_s32(t);
            /* bsums in pairs per 32-sub-block (each pair fits int16: 2 * 16 * 128) */
            const int16x8_t bs = vpaddq_s16(vld1q_s16(a->bsums), vld1q_s16(a->bsums + 8));
            const int32_t summ = vaddvq_s32(vmlal_high_s16(vmull_s16(vget_low_s16(bs), vget_low_s16(mm)), bs, mm));
            s[c] += a->d * (dw * (float)sumi - dmin * (float)summ);
        }
    }
    for (int c = 0; c < nc; c++) y[c * ys] = s[c];
}

/* Q6_K against Q8_K: the 6-bit values unpacked with NEON once per
 * super-block into v (q6 - 32, element order), then per vector 16 integer
 * dots of 16, weighted by the int8 sub-block scales in int32 (exact), and
 * the scalar kernel's f32 expression per super-block. */
KS_MM_NTGT static void KS_MM_NSFX(ks_mm_q6_k)(const uint8_t *w, const uint8_t *xq, size_t xs, int nc,
                                              int64_t cols, float *y, int64_t ys) {
    const ks_block_q6_k *wb = (const ks_block_q6_k *)w;
    const int64_t nb = cols / KS_QK_K;
    float s[KS_MM_NC] = {0};
    const uint8x16_t m4 = vdupq_n_u8(0x0F), m3 = vdupq_n_u8(3);
    const int8x16_t off = vdupq_n_s8(32);
    for (int64_t b = 0; b < nb; b++) {
        int8x16_t v[16];
        KS_NEON_UNROLL for (int h = 0; h < 2; h++)
            KS_NEON_UNROLL for (int l = 0; l < 32; l += 16) {
                const uint8_t *ql = wb[b].ql + 64 * h, *qh = wb[b].qh + 32 * h;
                uint8x16_t q0 = vld1q_u8(ql + l), q1 = vld1q_u8(ql + 32 + l), hb = vld1q_u8(qh + l);
                int8x16_t *vh = v + 8 * h + l / 16; /* element 128h + l + 32k is v[8h + l/16 + 2k] */
                vh[0] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vandq_u8(q0, m4), vshlq_n_u8(vandq_u8(hb, m3), 4))), off);
                vh[2] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vandq_u8(q1, m4),
                                                              vshlq_n_u8(vandq_u8(vshrq_n_u8(hb, 2), m3), 4))), off);
                vh[4] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(q0, 4),
                                                              vshlq_n_u8(vandq_u8(vshrq_n_u8(hb, 4), m3), 4))), off);
                vh[6] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(q1, 4), vshlq_n_u8(vshrq_n_u8(hb, 6), 4))), off);
            }
        const int8x16_t sc8 = vld1q_s8(wb[b].scales);
        const int16x8_t sc_a = vmovl_s8(vget_low_s8(sc8)), sc_b = vmovl_high_s8(sc8);
        const int32x4_t sc4[4] = {vmovl_s16(vget_low_s16(sc_a)), vmovl_high_s16(sc_a), vmovl_s16(vget_low_s16(sc_b)),
                                  vmovl_high_s16(sc_b)};
        const float d = ks_f16_to_f32(wb[b].d);
        for (int c = 0; c < nc; c++) {
            const ks_block_q8_k *a = (const ks_block_q8_k *)(xq + c * xs) + b;
            int32x4_t t = vdupq_n_s32(0);
            KS_NEON_UNROLL for (int g = 0; g < 4; g++) {
                int32x4_t p[4];
                KS_NEON_UNROLL for (int k = 0; k < 4; k++) p[k] = KS_NDOT(vdupq_n_s32(0), v[4 * g + k], vld1q_s8(a->qs + 64 * g + 16 * k));
                t = vmlaq_s32(t, ks_neon_hsum4(p[0], p[1], p[2], p[3]), sc4[g]);
            }
            const int32_t sumi = vaddvq_s32(t);
            s[c] += d * a->d * (float)sumi;
        }
    }
    for (int c = 0; c < nc; c++) y[c * ys] = s[c];
}

/* ------------------------------- the types of llama.cpp's mixes (Q8S) -- */
/* Q4_1, Q5_0, Q5_1 and IQ4_NL against the Q8S partner (matmul_types.c):
 * each block unpacked by NEON to its 32 signed integer weights in element
 * order (two int8x16), four blocks' integer dots by KS_NDOT and one pairwise
 * reduction, then per block the scalar kernel's very float expression
 * (dw * dx * isum + m * sx, blocks in order), so every level gives the
 * scalar bits.  The weights fit int8 and their products with the partner's
 * int8 fit int16 (at most 127 * 127), as the plain pass's smull needs. */
#ifndef KS_MM_NEON_TYPES_COMMON
#define KS_MM_NEON_TYPES_COMMON 1
/* bit i of the little-endian u32 at qh as 0x10 in byte i, for i in 16h..16h+15 */
KS_NEON_INLINE uint8x16_t ks_neon_q5_high16(const uint8_t *qh, int h) {
    static const uint8_t bits[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t v = vcombine_u8(vdup_n_u8(qh[2 * h]), vdup_n_u8(qh[2 * h + 1]));
    return vandq_u8(vtstq_u8(v, vld1q_u8(bits)), vdupq_n_u8(0x10));
}
KS_NEON_INLINE void ks_neon_unpack_q4_1(const uint8_t *blk, int8x16_t *w0, int8x16_t *w1, float *dw, float *m) {
    const ks_block_q4_1 *b = (const ks_block_q4_1 *)blk;
    const uint8x16_t v = vld1q_u8(b->qs);
    *w0 = vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0F)));
    *w1 = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
    *dw = ks_f16_to_f32(b->d), *m = ks_f16_to_f32(b->m);
}
KS_NEON_INLINE void ks_neon_unpack_q5(const uint8_t *qs, const uint8_t *qh, int off, int8x16_t *w0, int8x16_t *w1) {
    const uint8x16_t v = vld1q_u8(qs);
    const uint8x16_t lo = vorrq_u8(vandq_u8(v, vdupq_n_u8(0x0F)), ks_neon_q5_high16(qh, 0));
    const uint8x16_t hi = vorrq_u8(vshrq_n_u8(v, 4), ks_neon_q5_high16(qh, 1));
    *w0 = vsubq_s8(vreinterpretq_s8_u8(lo), vdupq_n_s8((int8_t)off));
    *w1 = vsubq_s8(vreinterpretq_s8_u8(hi), vdupq_n_s8((int8_t)off));
}
KS_NEON_INLINE void ks_neon_unpack_q5_0(const uint8_t *blk, int8x16_t *w0, int8x16_t *w1, float *dw, float *m) {
    const ks_block_q5_0 *b = (const ks_block_q5_0 *)blk;
    ks_neon_unpack_q5(b->qs, b->qh, 16, w0, w1);
    *dw = ks_f16_to_f32(b->d), *m = 0.0f;
}
KS_NEON_INLINE void ks_neon_unpack_q5_1(const uint8_t *blk, int8x16_t *w0, int8x16_t *w1, float *dw, float *m) {
    const ks_block_q5_1 *b = (const ks_block_q5_1 *)blk;
    ks_neon_unpack_q5(b->qs, b->qh, 0, w0, w1);
    *dw = ks_f16_to_f32(b->d), *m = ks_f16_to_f32(b->m);
}
/* the IQ4 levels by one table lookup (tbl) of each nibble */
KS_NEON_INLINE void ks_neon_iq4_16(const uint8_t *qs, int8x16_t *w0, int8x16_t *w1) {
    const int8x16_t lut = vld1q_s8(ks_iq4_values);
    const uint8x16_t v = vld1q_u8(qs);
    *w0 = vqtbl1q_s8(lut, vandq_u8(v, vdupq_n_u8(0x0F)));
    *w1 = vqtbl1q_s8(lut, vshrq_n_u8(v, 4));
}
KS_NEON_INLINE void ks_neon_unpack_iq4_nl(const uint8_t *blk, int8x16_t *w0, int8x16_t *w1, float *dw, float *m) {
    const ks_block_iq4_nl *b = (const ks_block_iq4_nl *)blk;
    ks_neon_iq4_16(b->qs, w0, w1);
    *dw = ks_f16_to_f32(b->d), *m = 0.0f;
}
/* MXFP4 (OCP Microscaling Formats v1.0, section 5.3): the E2M1 levels doubled
 * to integers by the same one-register lookup, and the shared E8M0 scale
 * halved to match (ks_e8m0_half_to_f32), as the scalar unpack does */
KS_NEON_INLINE void ks_neon_unpack_mxfp4(const uint8_t *blk, int8x16_t *w0, int8x16_t *w1, float *dw, float *m) {
    const ks_block_mxfp4 *b = (const ks_block_mxfp4 *)blk;
    const int8x16_t lut = vld1q_s8(ks_mxfp4_values);
    const uint8x16_t v = vld1q_u8(b->qs);
    *w0 = vqtbl1q_s8(lut, vandq_u8(v, vdupq_n_u8(0x0F)));
    *w1 = vqtbl1q_s8(lut, vshrq_n_u8(v, 4));
    *dw = ks_e8m0_half_to_f32(b->e), *m = 0.0f;
}
#endif /* KS_MM_NEON_TYPES_COMMON */

#define KS_NEON_Q32S_KERNEL(NAME, BT, UNPACK)                                                         \
    KS_MM_NTGT static void NAME(const uint8_t *w, const uint8_t *xq, size_t xs, int nc, int64_t cols, \
                                float *y, int64_t ys) {                                               \
        const int64_t nb = cols / KS_QK8_0;                                                           \
        const size_t qoff = ks_mm_align64((size_t)cols), soff = ks_mm_q8_stride(cols);                \
        float s[KS_MM_NC] = {0};                                                                      \
        for (int64_t b = 0; b < nb; b += 4) {                                                         \
            const int nk = nb - b < 4 ? (int)(nb - b) : 4;                                            \
            int8x16_t wq[8];                                                                          \
            float dw[4], m[4];                                                                        \
            for (int k = 0; k < nk; k++)                                                              \
                UNPACK(w + (size_t)(b + k) * sizeof(BT), &wq[2 * k], &wq[2 * k + 1], &dw[k], &m[k]);  \
            for (int k = nk; k < 4; k++) wq[2 * k] = wq[2 * k + 1] = vdupq_n_s8(0);                   \
            for (int c = 0; c < nc; c++) {                                                            \
                const int8_t *q = (const int8_t *)(xq + c * xs) + b * 32;                             \
                const float *dx = (const float *)(xq + c * xs + qoff) + b;                            \
                const float *sx = (const float *)(xq + c * xs + soff) + b;                            \
                int32x4_t p[4];                                                                       \
                KS_NEON_UNROLL for (int k = 0; k < 4; k++) p[k] = vdupq_n_s32(0);                     \
                for (int k = 0; k < nk; k++)                                                          \
                    p[k] = KS_NDOT(KS_NDOT(p[k], wq[2 * k], vld1q_s8(q + 32 * k)), wq[2 * k + 1],     \
                                   vld1q_s8(q + 32 * k + 16));                                        \
                int32_t isum[4];                                                                      \
                vst1q_s32(isum, ks_neon_hsum4(p[0], p[1], p[2], p[3]));                               \
                for (int k = 0; k < nk; k++) s[c] += dw[k] * dx[k] * (float)isum[k] + m[k] * sx[k];   \
            }                                                                                         \
        }                                                                                             \
        for (int c = 0; c < nc; c++) y[c * ys] = s[c];                                                \
    }
KS_NEON_Q32S_KERNEL(KS_MM_NSFX(ks_mm_q4_1), ks_block_q4_1, ks_neon_unpack_q4_1)
KS_NEON_Q32S_KERNEL(KS_MM_NSFX(ks_mm_q5_0), ks_block_q5_0, ks_neon_unpack_q5_0)
KS_NEON_Q32S_KERNEL(KS_MM_NSFX(ks_mm_q5_1), ks_block_q5_1, ks_neon_unpack_q5_1)
KS_NEON_Q32S_KERNEL(KS_MM_NSFX(ks_mm_iq4_nl), ks_block_iq4_nl, ks_neon_unpack_iq4_nl)
KS_NEON_Q32S_KERNEL(KS_MM_NSFX(ks_mm_mxfp4), ks_block_mxfp4, ks_neon_unpack_mxfp4)
#undef KS_NEON_Q32S_KERNEL

/* Q2_K, Q3_K, Q5_K and IQ4_XS against Q8_K: a super-block unpacked by NEON
 * once per row into v[16] (16 signed weights per 16-element sub-block, the
 * scalar ks_mm_unpack_k's order), its scales as int32 sc[16] and mins as
 * int16 mn[16]; per vector 16 integer dots, weighted by the scales in int32
 * (exact, so any order) and the scalar kernel's float expression. */
#ifndef KS_MM_NEON_KX_COMMON
#define KS_MM_NEON_KX_COMMON 1
typedef struct {
    int8x16_t v[16];
    int32x4_t sc[4];  /* sub-block scales, four per vector */
    int16x8_t mn[2];  /* sub-block mins (zero where the type has none) */
    float d, dmin;
} ks_neon_kx;

KS_NEON_INLINE void ks_neon_kx_scales_v(ks_neon_kx *u, int8x16_t s8) {
    const int16x8_t a = vmovl_s8(vget_low_s8(s8)), b = vmovl_high_s8(s8);
    u->sc[0] = vmovl_s16(vget_low_s16(a)), u->sc[1] = vmovl_high_s16(a);
    u->sc[2] = vmovl_s16(vget_low_s16(b)), u->sc[3] = vmovl_high_s16(b);
}
KS_NEON_INLINE void ks_neon_kx_scales(ks_neon_kx *u, const int8_t *sc16 /* [16], fits int8 */) {
    ks_neon_kx_scales_v(u, vld1q_s8(sc16));
}

/* Q4_K's and Q5_K's scales and mins, each repeated for the two 16-weight
 * halves of its 32-sub-block by one zip (a scalar loop of 16 here, with
 * ks_mm_q4k_scales, was half of the Q4_K two-row tile's instructions) */
KS_NEON_INLINE void ks_neon_kx_scales_mins8(ks_neon_kx *u, const uint8_t *q12) {
    uint8x8_t s, m;
    ks_neon_q4k_scales8(q12, &s, &m);
    ks_neon_kx_scales_v(u, vreinterpretq_s8_u8(vcombine_u8(vzip1_u8(s, s), vzip2_u8(s, s)))); /* < 64: fits int8 */
    u->mn[0] = vreinterpretq_s16_u16(vmovl_u8(vzip1_u8(m, m)));
    u->mn[1] = vreinterpretq_s16_u16(vmovl_u8(vzip2_u8(m, m)));
}

/* Q2_K: element 128h + 32j + l is bits 2j of qs[32h + l]; scales low nibble, mins high */
KS_NEON_INLINE void ks_neon_unpack_q2_k(const uint8_t *blk, ks_neon_kx *u) {
    const ks_block_q2_k *b = (const ks_block_q2_k *)blk;
    const uint8x16_t m3 = vdupq_n_u8(3);
    KS_NEON_UNROLL for (int h = 0; h < 2; h++)
        KS_NEON_UNROLL for (int k = 0; k < 2; k++) {
            const uint8x16_t q = vld1q_u8(b->qs + 32 * h + 16 * k);
            u->v[8 * h + k] = vreinterpretq_s8_u8(vandq_u8(q, m3));
            u->v[8 * h + 2 + k] = vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(q, 2), m3));
            u->v[8 * h + 4 + k] = vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(q, 4), m3));
            u->v[8 * h + 6 + k] = vreinterpretq_s8_u8(vshrq_n_u8(q, 6));
        }
    const uint8x16_t s = vld1q_u8(b->scales);
    const int16x8_t sl = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(vandq_u8(s, vdupq_n_u8(0x0F)))));
    const int16x8_t sh = vreinterpretq_s16_u16(vmovl_high_u8(vandq_u8(s, vdupq_n_u8(0x0F))));
    u->sc[0] = vmovl_s16(vget_low_s16(sl)), u->sc[1] = vmovl_high_s16(sl);
    u->sc[2] = vmovl_s16(vget_low_s16(sh)), u->sc[3] = vmovl_high_s16(sh);
    const uint8x16_t mh = vshrq_n_u8(s, 4);
    u->mn[0] = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(mh)));
    u->mn[1] = vreinterpretq_s16_u16(vmovl_high_u8(mh));
    u->d = ks_f16_to_f32(b->d), u->dmin = ks_f16_to_f32(b->dmin);
}

/* Q3_K: Q2_K's low bits, minus 4 where the hmask bit (128h + 32j + l: bit
 * 4h + j of hmask[l]) is clear; signed 6-bit scales (ks_q3k_get_scales - 32) */
KS_NEON_INLINE void ks_neon_unpack_q3_k(const uint8_t *blk, ks_neon_kx *u) {
    const ks_block_q3_k *b = (const ks_block_q3_k *)blk;
    const uint8x16_t m3 = vdupq_n_u8(3), four = vdupq_n_u8(4);
    const uint8x16_t hm[2] = {vld1q_u8(b->hmask), vld1q_u8(b->hmask + 16)};
    KS_NEON_UNROLL for (int h = 0; h < 2; h++)
        KS_NEON_UNROLL for (int k = 0; k < 2; k++) {
            const uint8x16_t q = vld1q_u8(b->qs + 32 * h + 16 * k);
            KS_NEON_UNROLL for (int j = 0; j < 4; j++) {
                const uint8x16_t q2 = vandq_u8(vshlq_u8(q, vdupq_n_s8((int8_t)(-2 * j))), m3);
                const uint8x16_t set = vtstq_u8(hm[k], vdupq_n_u8((uint8_t)(1u << (4 * h + j))));
                u->v[8 * h + 2 * j + k] = vsubq_s8(vreinterpretq_s8_u8(q2), vreinterpretq_s8_u8(vbicq_u8(four, set)));
            }
        }
    uint8_t sc[16];
    int8_t s8[16];
    ks_q3k_get_scales(b->scales, sc);
    for (int i = 0; i < 16; i++) s8[i] = (int8_t)((int)sc[i] - 32);
    ks_neon_kx_scales(u, s8);
    u->mn[0] = u->mn[1] = vdupq_n_s16(0);
    u->d = ks_f16_to_f32(b->d), u->dmin = 0.0f;
}

/* Q5_K: Q4_K's nibbles (element 64c + 32h + l: nibble h of qs[32c + l]) and
 * the fifth bit (bit 2c + h of qh[l]); 6-bit scales and mins as Q4_K's */
KS_NEON_INLINE void ks_neon_unpack_q5_k(const uint8_t *blk, ks_neon_kx *u) {
    const ks_block_q5_k *b = (const ks_block_q5_k *)blk;
    const uint8x16_t m4 = vdupq_n_u8(0x0F), f = vdupq_n_u8(0x10);
    const uint8x16_t qh[2] = {vld1q_u8(b->qh), vld1q_u8(b->qh + 16)};
    KS_NEON_UNROLL for (int c = 0; c < 4; c++)
        KS_NEON_UNROLL for (int k = 0; k < 2; k++) {
            const uint8x16_t q = vld1q_u8(b->qs + 32 * c + 16 * k);
            const uint8x16_t b0 = vandq_u8(vtstq_u8(qh[k], vdupq_n_u8((uint8_t)(1u << (2 * c)))), f);
            const uint8x16_t b1 = vandq_u8(vtstq_u8(qh[k], vdupq_n_u8((uint8_t)(2u << (2 * c)))), f);
            u->v[4 * c + k] = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(q, m4), b0));
            u->v[4 * c + 2 + k] = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(q, 4), b1));
        }
    ks_neon_kx_scales_mins8(u, b->scales);
    u->d = ks_f16_to_f32(b->d), u->dmin = ks_f16_to_f32(b->dmin);
}

/* IQ4_XS: IQ4_NL's lookup per 32-sub-block; 6-bit scales minus 32 */
KS_NEON_INLINE void ks_neon_unpack_iq4_xs(const uint8_t *blk, ks_neon_kx *u) {
    const ks_block_iq4_xs *b = (const ks_block_iq4_xs *)blk;
    int8_t s8[16];
    KS_NEON_UNROLL for (int s = 0; s < 8; s++) {
        ks_neon_iq4_16(b->qs + 16 * s, &u->v[2 * s], &u->v[2 * s + 1]);
        const int ls = ((b->scales_l[s / 2] >> (4 * (s % 2))) & 0xF) | ((b->scales_h >> (2 * s)) & 3) << 4;
        s8[2 * s] = s8[2 * s + 1] = (int8_t)(ls - 32);
    }
    ks_neon_kx_scales(u, s8);
    u->mn[0] = u->mn[1] = vdupq_n_s16(0);
    u->d = ks_f16_to_f32(b->d), u->dmin = 0.0f;
}
#endif /* KS_MM_NEON_KX_COMMON */

#define KS_NEON_KX_KERNEL(NAME, BT, UNPACK)                                                           \
    KS_MM_NTGT static void NAME(const uint8_t *w, const uint8_t *xq, size_t xs, int nc, int64_t cols, \
                                float *y, int64_t ys) {                                               \
        const int64_t nb = cols / KS_QK_K;                                                            \
        float s[KS_MM_NC] = {0};                                                                      \
        for (int64_t b = 0; b < nb; b++) {                                                            \
            ks_neon_kx u;                                                                             \
            UNPACK(w + (size_t)b * sizeof(BT), &u);                                                   \
            for (int c = 0; c < nc; c++) {                                                            \
                const ks_block_q8_k *a = (const ks_block_q8_k *)(xq + c * xs) + b;                    \
                int32x4_t t = vdupq_n_s32(0);                                                         \
                KS_NEON_UNROLL for (int g = 0; g < 4; g++) {                                          \
                    int32x4_t p[4];                                                                   \
                    KS_NEON_UNROLL for (int k = 0; k < 4; k++)                                        \
                        p[k] = KS_NDOT(vdupq_n_s32(0), u.v[4 * g + k], vld1q_s8(a->qs + 64 * g + 16 * k)); \
                    t = vmlaq_s32(t, ks_neon_hsum4(p[0], p[1], p[2], p[3]), u.sc[g]);                 \
                }                                                                                     \
                const int32_t sumi = vaddvq_s32(t);                                                   \
                const int16x8_t b0 = vld1q_s16(a->bsums), b1 = vld1q_s16(a->bsums + 8);               \
                int32x4_t mm = vmull_s16(vget_low_s16(b0), vget_low_s16(u.mn[0]));                    \
                mm = vmlal_high_s16(mm, b0, u.mn[0]);                                                 \
                mm = vmlal_s16(mm, vget_low_s16(b1), vget_low_s16(u.mn[1]));                          \
                mm = vmlal_high_s16(mm, b1, u.mn[1]);                                                 \
                const int32_t summ = vaddvq_s32(mm);                                                  \
                s[c] += a->d * (u.d * (float)sumi - u.dmin * (float)summ);                            \
            }                                                                                         \
        }                                                                                             \
        for (int c = 0; c < nc; c++) y[c * ys] = s[c];                                                \
    }
KS_NEON_KX_KERNEL(KS_MM_NSFX(ks_mm_q2_k), ks_block_q2_k, ks_neon_unpack_q2_k)
KS_NEON_KX_KERNEL(KS_MM_NSFX(ks_mm_q3_k), ks_block_q3_k, ks_neon_unpack_q3_k)
KS_NEON_KX_KERNEL(KS_MM_NSFX(ks_mm_q5_k), ks_block_q5_k, ks_neon_unpack_q5_k)
KS_NEON_KX_KERNEL(KS_MM_NSFX(ks_mm_iq4_xs), ks_block_iq4_xs, ks_neon_unpack_iq4_xs)
#undef KS_NEON_KX_KERNEL

/* -------------------------------- dot pass only: the i8mm two-row form --
 * smmla, two rows by two vectors: matmul_neon_i8mm.c, which reuses this
 * pass's loaders, unpackers and Q8 float step. */
#if KS_MM_NEON_DOT
#define KS_MM_NEON_I8MM_PART 1
#include "matmul_neon_i8mm.c"
#undef KS_MM_NEON_I8MM_PART
#endif /* KS_MM_NEON_DOT */

#undef KS_NDOT
#endif /* KS_MM_NEON_PASS */
