/*
 * matmul_neon_i8mm.c — the two-row kernel form of every quantized type at
 * the FEAT_I8MM level (ks_mm_kern2, the "x2_i8mm" kernels): smmla, which
 * multiplies a 2x8 by an 8x2 int8 matrix, so two weight rows against two
 * activation vectors, 32 MACs per instruction against sdot's 16.  The
 * driver uses it for batches (n > 1): prefill's GEMM on ARM.
 *
 * Why apart from matmul_neon.c: that file is the one-row kernels, written
 * once for two instruction sets (plain NEON and sdot); these exist in the
 * dot pass only and are a different shape of kernel (two rows, vectors in
 * pairs, results to be untangled from smmla's [r0.x, r0.y, r1.x, r1.y]).
 * They still lean on the one-row kernels at every step, because each must
 * give its sdot kernel's bits at every n (matmul_neon.c, "Every level gives
 * the same bits"): the weight loaders and unpackers, the block transpose
 * and f32 step that Q8_0 / Q4_0 share with the sdot kernels, the K-types'
 * scale unpacking.  So this is a part of matmul_neon.c's dot pass:
 * matmul_neon.c includes it there with KS_MM_NEON_I8MM_PART defined;
 * compiled on its own it is empty.
 */
#ifndef KS_MM_NEON_I8MM_PART
typedef int ks_matmul_neon_i8mm_empty; /* ISO C forbids an empty translation unit */
#else

/* smmla's operands.  It multiplies a 2x8 by an 8x2 int8 matrix, each held as
 * one register of two 8-byte halves: the weights as [row 0 | row 1] (two
 * rows' 16 weights zipped into two such registers by ks_neon_mmla_rows), the
 * activations as [vector x | vector y]; the four results it adds to the
 * accumulator are [r0.x, r0.y, r1.x, r1.y]. */
KS_NEON_INLINE void ks_neon_mmla_rows(int8x16_t r0, int8x16_t r1, int8x16_t *lo, int8x16_t *hi) {
    *lo = vreinterpretq_s8_s64(vzip1q_s64(vreinterpretq_s64_s8(r0), vreinterpretq_s64_s8(r1)));
    *hi = vreinterpretq_s8_s64(vzip2q_s64(vreinterpretq_s64_s8(r0), vreinterpretq_s64_s8(r1)));
}

/* acc + the dots of 16 weights of two rows (lo, hi: ks_neon_mmla_rows) with
 * 16 activations of vectors x and y: two smmla */
KS_NEON_TGT_I8MM KS_NEON_INLINE int32x4_t ks_neon_mmla16(int32x4_t acc, int8x16_t lo, int8x16_t hi, const int8_t *x,
                                                         const int8_t *y) {
    const int64x2_t vx = vreinterpretq_s64_s8(vld1q_s8(x)), vy = vreinterpretq_s64_s8(vld1q_s8(y));
    acc = vmmlaq_s32(acc, lo, vreinterpretq_s8_s64(vzip1q_s64(vx, vy)));
    return vmmlaq_s32(acc, hi, vreinterpretq_s8_s64(vzip2q_s64(vx, vy)));
}

/* one 32-block (a: its two halves' lo, hi) against x and y: four smmla */
KS_NEON_TGT_I8MM KS_NEON_INLINE int32x4_t ks_neon_mmla32(const int8x16_t *a, const int8_t *x, const int8_t *y) {
    return ks_neon_mmla16(ks_neon_mmla16(vdupq_n_s32(0), a[0], a[1], x, y), a[2], a[3], x + 16, y + 16);
}

/* Q8_0 and Q4_0: two weight rows (w, w + wrow) against nc vectors, taken in
 * pairs (an odd last vector is paired with itself and its twin result
 * dropped).  Per block and pair: four smmla give [r0.x, r0.y, r1.x, r1.y];
 * after four blocks, ks_neon_transpose4 puts each output's four blocks in
 * its lanes for the shared f32 step. */
#define KS_NEON_Q8X2_I8MM(NAME, BT, LOADW, DOTFN)                                                     \
    KS_NEON_TGT_I8MM static void NAME(const uint8_t *w, size_t wrow, const uint8_t *xq, size_t xs,    \
                                      int nc, int64_t cols, float *y, int64_t ys) {                   \
        const BT *w0b = (const BT *)w, *w1b = (const BT *)(w + wrow);                                 \
        const int64_t nb = cols / 32;                                                                 \
        const size_t qoff = ks_mm_align64((size_t)cols);                                              \
        float32x4_t acc[2][KS_MM_NC];                                                                 \
        for (int c = 0; c < KS_MM_NC; c++) acc[0][c] = acc[1][c] = vdupq_n_f32(0.0f);                 \
        int64_t b = 0;                                                                                \
        for (; b + 4 <= nb; b += 4) {                                                                 \
            int8x16_t a[4][4]; /* [block][quarter]: rows 0 and 1 side by side */                      \
            KS_NEON_UNROLL for (int k = 0; k < 4; k++) {                                              \
                int8x16_t r0a, r0b, r1a, r1b;                                                         \
                LOADW(&w0b[b + k], &r0a, &r0b);                                                       \
                LOADW(&w1b[b + k], &r1a, &r1b);                                                       \
                ks_neon_mmla_rows(r0a, r1a, &a[k][0], &a[k][1]);                                      \
                ks_neon_mmla_rows(r0b, r1b, &a[k][2], &a[k][3]);                                      \
            }                                                                                         \
            const float32x4_t dw0 = ks_neon_f16x4(w0b[b].d, w0b[b + 1].d, w0b[b + 2].d, w0b[b + 3].d); \
            const float32x4_t dw1 = ks_neon_f16x4(w1b[b].d, w1b[b + 1].d, w1b[b + 2].d, w1b[b + 3].d); \
            for (int c = 0; c < nc; c += 2) {                                                         \
                const int c1 = c + 1 < nc ? c + 1 : c;                                                \
                const int8_t *qx = (const int8_t *)(xq + c * xs) + b * 32;                            \
                const int8_t *qy = (const int8_t *)(xq + c1 * xs) + b * 32;                           \
                int32x4_t r[4];                                                                       \
                KS_NEON_UNROLL for (int k = 0; k < 4; k++) r[k] = ks_neon_mmla32(a[k], qx + 32 * k, qy + 32 * k); \
                int32x4_t o[4]; /* r0.x, r0.y, r1.x, r1.y over the four blocks */                     \
                ks_neon_transpose4(r[0], r[1], r[2], r[3], o);                                        \
                const float32x4_t dx = vld1q_f32((const float *)(xq + c * xs + qoff) + b);            \
                const float32x4_t dy = vld1q_f32((const float *)(xq + c1 * xs + qoff) + b);           \
                acc[0][c] = ks_neon_q8_step(acc[0][c], o[0], dw0, dx);                                \
                acc[1][c] = ks_neon_q8_step(acc[1][c], o[2], dw1, dx);                                \
                if (c1 != c) {                                                                        \
                    acc[0][c1] = ks_neon_q8_step(acc[0][c1], o[1], dw0, dy);                          \
                    acc[1][c1] = ks_neon_q8_step(acc[1][c1], o[3], dw1, dy);                          \
                }                                                                                     \
            }                                                                                         \
        }                                                                                             \
        for (int c = 0; c < nc; c++) {                                                                \
            const int8_t *q = (const int8_t *)(xq + c * xs);                                          \
            const float *d = (const float *)(xq + c * xs + qoff);                                     \
            KS_NEON_Q8_FINISH(BT, DOTFN, w0b, b, nb, q, d, acc[0][c], y[c * ys]);                     \
            KS_NEON_Q8_FINISH(BT, DOTFN, w1b, b, nb, q, d, acc[1][c], y[c * ys + 1]);                 \
        }                                                                                             \
    }
KS_NEON_Q8X2_I8MM(ks_mm_q8_0x2_i8mm, ks_block_q8_0, ks_neon_load_q8_0, ks_mm_dot_q8_0)
KS_NEON_Q8X2_I8MM(ks_mm_q4_0x2_i8mm, ks_block_q4_0, ks_neon_load_q4_0, ks_mm_dot_q4_0)
#undef KS_NEON_Q8X2_I8MM

/* nk (1..4) floats of x and of y, zipped: z[0] = [x0, y0, x1, y1],
 * z[1] = [x2, y2, x3, y3] (lanes past nk zero) */
KS_NEON_INLINE void ks_neon_xy4(int nk, const float *x, const float *y, float32x4_t *z) {
    float32x4_t vx, vy;
    if (nk == 4) {
        vx = vld1q_f32(x), vy = vld1q_f32(y);
    } else {
        float tx[4] = {0}, ty[4] = {0};
        for (int k = 0; k < nk; k++) tx[k] = x[k], ty[k] = y[k];
        vx = vld1q_f32(tx), vy = vld1q_f32(ty);
    }
    z[0] = vzip1q_f32(vx, vy), z[1] = vzip2q_f32(vx, vy);
}

/* [a, b, c, d] -> [a, b, a, b] (hi = 0) or [c, d, c, d] (hi = 1) */
KS_NEON_INLINE float32x4_t ks_neon_dup_pair(float32x4_t v, int hi) {
    const float64x2_t d = vreinterpretq_f64_f32(v);
    return vreinterpretq_f32_f64(hi ? vzip2q_f64(d, d) : vzip1q_f64(d, d));
}

/* Q4_1, Q5_0, Q5_1, IQ4_NL and MXFP4 (the Q8S partner), two rows by two
 * vectors.  Four blocks of each row unpacked as the sdot kernel unpacks
 * them and zipped once for every vector pair; per block four smmla give the
 * four outputs' exact integer sums in the lanes, and the sdot kernel's float
 * expression per block (s += dw dx isum + m sx, blocks in order) runs on the
 * four lanes at once, row scales as [row 0, row 0, row 1, row 1] and vector
 * ones as [x, y, x, y].  The same operations per output in the same order
 * (no contraction: -std=c11 leaves -ffp-contract off), so the sdot kernel's
 * bits, which are the scalar kernel's. */
#define KS_NEON_Q32S2_I8MM(NAME, BT, UNPACK)                                                          \
    KS_NEON_TGT_I8MM static void NAME(const uint8_t *w, size_t wrow, const uint8_t *xq, size_t xs,    \
                                      int nc, int64_t cols, float *y, int64_t ys) {                   \
        const int64_t nb = cols / KS_QK8_0;                                                           \
        const size_t qoff = ks_mm_align64((size_t)cols), soff = ks_mm_q8_stride(cols);                \
        float32x4_t acc[KS_MM_NC / 2]; /* per vector pair: [r0.x, r0.y, r1.x, r1.y] */                \
        KS_NEON_UNROLL for (int p = 0; p < KS_MM_NC / 2; p++) acc[p] = vdupq_n_f32(0.0f);             \
        for (int64_t b = 0; b < nb; b += 4) {                                                         \
            const int nk = nb - b < 4 ? (int)(nb - b) : 4;                                            \
            int8x16_t a[4][4];                                                                        \
            float32x4_t dw[4], m[4];                                                                  \
            KS_NEON_UNROLL for (int k = 0; k < 4; k++) {                                              \
                if (k < nk) {                                                                         \
                    int8x16_t r0a, r0b, r1a, r1b;                                                     \
                    float d0, d1, m0, m1;                                                             \
                    UNPACK(w + (size_t)(b + k) * sizeof(BT), &r0a, &r0b, &d0, &m0);                   \
                    UNPACK(w + wrow + (size_t)(b + k) * sizeof(BT), &r1a, &r1b, &d1, &m1);            \
                    ks_neon_mmla_rows(r0a, r1a, &a[k][0], &a[k][1]);                                  \
                    ks_neon_mmla_rows(r0b, r1b, &a[k][2], &a[k][3]);                                  \
                    dw[k] = vcombine_f32(vdup_n_f32(d0), vdup_n_f32(d1));                             \
                    m[k] = vcombine_f32(vdup_n_f32(m0), vdup_n_f32(m1));                              \
                } else {                                                                              \
                    a[k][0] = a[k][1] = a[k][2] = a[k][3] = vdupq_n_s8(0);                            \
                    dw[k] = m[k] = vdupq_n_f32(0.0f);                                                 \
                }                                                                                     \
            }                                                                                         \
            KS_NEON_UNROLL for (int p = 0; p < KS_MM_NC / 2; p++) {                                   \
                if (2 * p >= nc) continue;                                                            \
                const int c = 2 * p, c1 = c + 1 < nc ? c + 1 : c;                                     \
                const uint8_t *ux = xq + c * xs, *uy = xq + c1 * xs;                                  \
                const int8_t *qx = (const int8_t *)ux + b * 32, *qy = (const int8_t *)uy + b * 32;    \
                /* the four blocks' d and s of x and y as [x0, y0, x1, y1], [x2, y2, x3, y3] */       \
                float32x4_t zd[2], zs[2];                                                             \
                ks_neon_xy4(nk, (const float *)(ux + qoff) + b, (const float *)(uy + qoff) + b, zd);  \
                ks_neon_xy4(nk, (const float *)(ux + soff) + b, (const float *)(uy + soff) + b, zs);  \
                KS_NEON_UNROLL for (int k = 0; k < 4; k++) {                                          \
                    if (k >= nk) continue;                                                            \
                    const int32x4_t isum = ks_neon_mmla32(a[k], qx + 32 * k, qy + 32 * k);            \
                    const float32x4_t dxy = ks_neon_dup_pair(zd[k / 2], k & 1); /* [dx, dy, dx, dy] */ \
                    const float32x4_t sxy = ks_neon_dup_pair(zs[k / 2], k & 1);                       \
                    const float32x4_t t = vmulq_f32(vmulq_f32(dw[k], dxy), vcvtq_f32_s32(isum));      \
                    acc[p] = vaddq_f32(acc[p], vaddq_f32(t, vmulq_f32(m[k], sxy)));                   \
                }                                                                                     \
            }                                                                                         \
        }                                                                                             \
        KS_NEON_UNROLL for (int p = 0; p < KS_MM_NC / 2; p++) {                                       \
            if (2 * p >= nc) continue;                                                                \
            const int c = 2 * p, c1 = c + 1 < nc ? c + 1 : c;                                         \
            y[c * ys] = vgetq_lane_f32(acc[p], 0), y[c * ys + 1] = vgetq_lane_f32(acc[p], 2);         \
            if (c1 != c) y[c1 * ys] = vgetq_lane_f32(acc[p], 1), y[c1 * ys + 1] = vgetq_lane_f32(acc[p], 3); \
        }                                                                                             \
    }
KS_NEON_Q32S2_I8MM(ks_mm_q4_1x2_i8mm, ks_block_q4_1, ks_neon_unpack_q4_1)
KS_NEON_Q32S2_I8MM(ks_mm_q5_0x2_i8mm, ks_block_q5_0, ks_neon_unpack_q5_0)
KS_NEON_Q32S2_I8MM(ks_mm_q5_1x2_i8mm, ks_block_q5_1, ks_neon_unpack_q5_1)
KS_NEON_Q32S2_I8MM(ks_mm_iq4_nlx2_i8mm, ks_block_iq4_nl, ks_neon_unpack_iq4_nl)
KS_NEON_Q32S2_I8MM(ks_mm_mxfp4x2_i8mm, ks_block_mxfp4, ks_neon_unpack_mxfp4)
#undef KS_NEON_Q32S2_I8MM

/* Q4_K and Q6_K as ks_neon_kx (the other K-types' unpackers are above):
 * the same integers their own sdot kernels unpack, in element order; Q4_K's
 * 32-sub-block scales and mins repeated per 16, Q6_K's int8 scales as they
 * are. */
KS_NEON_INLINE void ks_neon_unpack_q4_k(const uint8_t *blk, ks_neon_kx *u) {
    const ks_block_q4_k *b = (const ks_block_q4_k *)blk;
    const uint8x16_t m4 = vdupq_n_u8(0x0F);
    KS_NEON_UNROLL for (int c = 0; c < 4; c++)
        KS_NEON_UNROLL for (int k = 0; k < 2; k++) { /* element 64c + 32h + l: nibble h of qs[32c + l] */
            const uint8x16_t q = vld1q_u8(b->qs + 32 * c + 16 * k);
            u->v[4 * c + k] = vreinterpretq_s8_u8(vandq_u8(q, m4));
            u->v[4 * c + 2 + k] = vreinterpretq_s8_u8(vshrq_n_u8(q, 4));
        }
    ks_neon_kx_scales_mins8(u, b->scales);
    u->d = ks_f16_to_f32(b->d), u->dmin = ks_f16_to_f32(b->dmin);
}

KS_NEON_INLINE void ks_neon_unpack_q6_k(const uint8_t *blk, ks_neon_kx *u) {
    const ks_block_q6_k *b = (const ks_block_q6_k *)blk;
    const uint8x16_t m4 = vdupq_n_u8(0x0F), m3 = vdupq_n_u8(3);
    const int8x16_t off = vdupq_n_s8(32);
    KS_NEON_UNROLL for (int h = 0; h < 2; h++)
        KS_NEON_UNROLL for (int l = 0; l < 32; l += 16) {
            const uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
            uint8x16_t q0 = vld1q_u8(ql + l), q1 = vld1q_u8(ql + 32 + l), hb = vld1q_u8(qh + l);
            int8x16_t *vh = u->v + 8 * h + l / 16; /* element 128h + l + 32k is v[8h + l/16 + 2k] */
            vh[0] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vandq_u8(q0, m4), vshlq_n_u8(vandq_u8(hb, m3), 4))), off);
            vh[2] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vandq_u8(q1, m4),
                                                          vshlq_n_u8(vandq_u8(vshrq_n_u8(hb, 2), m3), 4))), off);
            vh[4] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(q0, 4),
                                                          vshlq_n_u8(vandq_u8(vshrq_n_u8(hb, 4), m3), 4))), off);
            vh[6] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(q1, 4), vshlq_n_u8(vshrq_n_u8(hb, 6), 4))), off);
        }
    ks_neon_kx_scales(u, b->scales);
    u->mn[0] = u->mn[1] = vdupq_n_s16(0);
    u->d = ks_f16_to_f32(b->d), u->dmin = 0.0f;
}

/* sum_s mn_s bsum_s of one super-block (exact) */
KS_NEON_INLINE int32_t ks_neon_kx_summ(const ks_neon_kx *u, const ks_block_q8_k *a) {
    const int16x8_t b0 = vld1q_s16(a->bsums), b1 = vld1q_s16(a->bsums + 8);
    int32x4_t mm = vmull_s16(vget_low_s16(b0), vget_low_s16(u->mn[0]));
    mm = vmlal_high_s16(mm, b0, u->mn[0]);
    mm = vmlal_s16(mm, vget_low_s16(b1), vget_low_s16(u->mn[1]));
    mm = vmlal_high_s16(mm, b1, u->mn[1]);
    return vaddvq_s32(mm);
}

/* The sdot kernels' float step per super-block and output, verbatim: Q4_K's
 * and the other K-types' (KS_NEON_KX_KERNEL), and Q6_K's (no mins). */
#define KS_NEON_KX_FSTEP(s, a, u, sumi) ((s) += (a)->d * ((u)->d * (float)(sumi) - (u)->dmin * (float)ks_neon_kx_summ((u), (a))))
#define KS_NEON_Q6K_FSTEP(s, a, u, sumi) ((s) += (u)->d * (a)->d * (float)(sumi))

/* The K-quants and IQ4_XS (Q8_K partner), two rows by two vectors.  Both
 * rows' super-blocks unpacked as ks_neon_kx, and per 16-weight sub-block
 * the rows zipped once for every vector pair; per pair two smmla give the
 * four outputs' integer dots of the sub-block, which its scales, as
 * [row 0, row 0, row 1, row 1], weight in int32.  The totals are the sdot
 * kernels' exact sumi (and the mins' sum the same integer), and each output
 * then takes its sdot kernel's very float expression (FSTEP), super-blocks
 * in order: the same bits at every n. */
#define KS_NEON_KX2_I8MM(NAME, BT, UNPACK, FSTEP)                                                     \
    KS_NEON_TGT_I8MM static void NAME(const uint8_t *w, size_t wrow, const uint8_t *xq, size_t xs,    \
                                      int nc, int64_t cols, float *y, int64_t ys) {                   \
        const int64_t nb = cols / KS_QK_K;                                                            \
        float s[2][KS_MM_NC] = {{0}};                                                                 \
        for (int64_t b = 0; b < nb; b++) {                                                            \
            ks_neon_kx u[2];                                                                          \
            UNPACK(w + (size_t)b * sizeof(BT), &u[0]);                                                \
            UNPACK(w + wrow + (size_t)b * sizeof(BT), &u[1]);                                         \
            const ks_block_q8_k *ax[KS_MM_NC / 2], *ay[KS_MM_NC / 2];                                 \
            int32x4_t t[KS_MM_NC / 2];                                                                \
            KS_NEON_UNROLL for (int p = 0; p < KS_MM_NC / 2; p++) {                                   \
                const int c = 2 * p < nc ? 2 * p : 0, c1 = c + 1 < nc ? c + 1 : c;                    \
                ax[p] = (const ks_block_q8_k *)(xq + c * xs) + b;                                     \
                ay[p] = (const ks_block_q8_k *)(xq + c1 * xs) + b;                                    \
                t[p] = vdupq_n_s32(0);                                                                \
            }                                                                                         \
            KS_NEON_UNROLL for (int g = 0; g < 4; g++) {                                              \
                const int32x4_t z0 = vzip1q_s32(u[0].sc[g], u[1].sc[g]); /* [a0, b0, a1, b1] */       \
                const int32x4_t z1 = vzip2q_s32(u[0].sc[g], u[1].sc[g]);                              \
                const int32x4_t sc[4] = {vzip1q_s32(z0, z0), vzip2q_s32(z0, z0), vzip1q_s32(z1, z1),  \
                                         vzip2q_s32(z1, z1)}; /* [a_k, a_k, b_k, b_k] */              \
                KS_NEON_UNROLL for (int k = 0; k < 4; k++) {                                          \
                    const int j = 4 * g + k;                                                          \
                    int8x16_t lo, hi;                                                                 \
                    ks_neon_mmla_rows(u[0].v[j], u[1].v[j], &lo, &hi);                                \
                    KS_NEON_UNROLL for (int p = 0; p < KS_MM_NC / 2; p++) {                           \
                        if (2 * p >= nc) continue;                                                    \
                        const int32x4_t r = ks_neon_mmla16(vdupq_n_s32(0), lo, hi, ax[p]->qs + 16 * j, ay[p]->qs + 16 * j); \
                        t[p] = vmlaq_s32(t[p], r, sc[k]);                                             \
                    }                                                                                 \
                }                                                                                     \
            }                                                                                         \
            KS_NEON_UNROLL for (int p = 0; p < KS_MM_NC / 2; p++) {                                   \
                if (2 * p >= nc) continue;                                                            \
                const int c = 2 * p, c1 = c + 1 < nc ? c + 1 : c;                                     \
                FSTEP(s[0][c], ax[p], &u[0], vgetq_lane_s32(t[p], 0));                                \
                FSTEP(s[1][c], ax[p], &u[1], vgetq_lane_s32(t[p], 2));                                \
                if (c1 != c) {                                                                        \
                    FSTEP(s[0][c1], ay[p], &u[0], vgetq_lane_s32(t[p], 1));                           \
                    FSTEP(s[1][c1], ay[p], &u[1], vgetq_lane_s32(t[p], 3));                           \
                }                                                                                     \
            }                                                                                         \
        }                                                                                             \
        for (int c = 0; c < nc; c++) y[c * ys] = s[0][c], y[c * ys + 1] = s[1][c];                    \
    }
KS_NEON_KX2_I8MM(ks_mm_q4_kx2_i8mm, ks_block_q4_k, ks_neon_unpack_q4_k, KS_NEON_KX_FSTEP)
KS_NEON_KX2_I8MM(ks_mm_q6_kx2_i8mm, ks_block_q6_k, ks_neon_unpack_q6_k, KS_NEON_Q6K_FSTEP)
KS_NEON_KX2_I8MM(ks_mm_q2_kx2_i8mm, ks_block_q2_k, ks_neon_unpack_q2_k, KS_NEON_KX_FSTEP)
KS_NEON_KX2_I8MM(ks_mm_q3_kx2_i8mm, ks_block_q3_k, ks_neon_unpack_q3_k, KS_NEON_KX_FSTEP)
KS_NEON_KX2_I8MM(ks_mm_q5_kx2_i8mm, ks_block_q5_k, ks_neon_unpack_q5_k, KS_NEON_KX_FSTEP)
KS_NEON_KX2_I8MM(ks_mm_iq4_xsx2_i8mm, ks_block_iq4_xs, ks_neon_unpack_iq4_xs, KS_NEON_KX_FSTEP)
#undef KS_NEON_KX2_I8MM
#undef KS_NEON_KX_FSTEP
#undef KS_NEON_Q6K_FSTEP
#endif /* KS_MM_NEON_I8MM_PART */
