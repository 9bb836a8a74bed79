/*
 * matmul_types.c — the scalar reference kernels of the weight types added
 * for llama.cpp's mixes (Q4_1, Q5_0, Q5_1, IQ4_NL, and gpt-oss's MXFP4,
 * against a Q8 partner with block sums; Q2_K, Q3_K, Q5_K, IQ4_XS against Q8_K), and that partner.
 *
 * A part of matmul.c's translation unit (included with KS_MM_TYPES_PART
 * defined, after the first types' scalar kernels), so the driver, the kernel
 * signature and the partner layouts stay private to one place; compiled on
 * its own it is empty.  The SIMD kernels of these types are
 * matmul_x86_types.c, and tests/test_matmul.c holds each to these.
 *
 * Why a third partner layout, "Q8S".  The 32-element types carry an offset
 * (Q4_1 and Q5_1: x = d q + m) whose product with an activation block needs
 * that block's sum; Q8_K has sums but needs rows of 256, and these types are
 * exactly the ones llama.cpp picks for rows that are not (Q5_0 / Q5_1 / Q4_1
 * / IQ4_NL for a 896- or 2880-wide tensor).  So the split Q8 layout (int8
 * q[cols] padded to 64 B, then f32 d[cols / 32] padded to 64 B) gains a third
 * array, f32 s[cols / 32] = d * sum(q), at every level: the AVX-512 grouped
 * layout of Q8_0 / Q4_0 is not used for these types.  The integers are the
 * same as the Q8_0 partner's (one quantizer), so a kernel's only freedom is
 * the float summation order.
 */
#ifndef KS_MM_TYPES_PART
typedef int ks_matmul_types_is_included_by_matmul_c; /* standalone: nothing to compile */
#else

static size_t ks_mm_q8s_stride(int64_t cols) {
    return ks_mm_q8_stride(cols) + ks_mm_align64((size_t)(cols / KS_QK8_0) * sizeof(float));
}

/* The block sums of a quantized Q8S vector (q and d written already). */
static void ks_mm_q8s_sums(uint8_t *dst, int64_t cols) {
    const int8_t *q = (const int8_t *)dst;
    const float *d = (const float *)(dst + ks_mm_align64((size_t)cols));
    float *s = (float *)(dst + ks_mm_q8_stride(cols));
    for (int64_t b = 0; b < cols / KS_QK8_0; b++) {
        int32_t sum = 0;
        for (int i = 0; i < KS_QK8_0; i++) sum += q[KS_QK8_0 * b + i];
        s[b] = d[b] * (float)sum;
    }
}

/* The 32 integer weights of one block of a 32-element type, in element
 * order, and its offset m (0 for the symmetric ones). */
static void ks_mm_unpack32(ks_dtype t, const uint8_t *blk, int8_t *v, float *dw, float *m) {
    *m = 0.0f;
    switch (t) {
    case KS_DTYPE_Q4_1: {
        const ks_block_q4_1 *b = (const ks_block_q4_1 *)blk;
        for (int i = 0; i < 16; i++) v[i] = (int8_t)(b->qs[i] & 0xF), v[i + 16] = (int8_t)(b->qs[i] >> 4);
        *dw = ks_f16_to_f32(b->d), *m = ks_f16_to_f32(b->m);
        break;
    }
    case KS_DTYPE_Q5_0:
    case KS_DTYPE_Q5_1: {
        const bool one = t == KS_DTYPE_Q5_1;
        const uint8_t *qs = one ? ((const ks_block_q5_1 *)blk)->qs : ((const ks_block_q5_0 *)blk)->qs;
        const uint8_t *qhp = one ? ((const ks_block_q5_1 *)blk)->qh : ((const ks_block_q5_0 *)blk)->qh;
        uint32_t qh = (uint32_t)qhp[0] | (uint32_t)qhp[1] << 8 | (uint32_t)qhp[2] << 16 | (uint32_t)qhp[3] << 24;
        const int off = one ? 0 : 16;
        for (int i = 0; i < 16; i++) {
            v[i] = (int8_t)(((qs[i] & 0xF) | (int)((qh >> i) & 1) << 4) - off);
            v[i + 16] = (int8_t)(((qs[i] >> 4) | (int)((qh >> (i + 16)) & 1) << 4) - off);
        }
        if (one) *dw = ks_f16_to_f32(((const ks_block_q5_1 *)blk)->d), *m = ks_f16_to_f32(((const ks_block_q5_1 *)blk)->m);
        else *dw = ks_f16_to_f32(((const ks_block_q5_0 *)blk)->d);
        break;
    }
    case KS_DTYPE_IQ4_NL: {
        const ks_block_iq4_nl *b = (const ks_block_iq4_nl *)blk;
        for (int i = 0; i < 16; i++) v[i] = ks_iq4_values[b->qs[i] & 0xF], v[i + 16] = ks_iq4_values[b->qs[i] >> 4];
        *dw = ks_f16_to_f32(b->d);
        break;
    }
    case KS_DTYPE_MXFP4: {
        const ks_block_mxfp4 *b = (const ks_block_mxfp4 *)blk;
        for (int i = 0; i < 16; i++) v[i] = ks_mxfp4_values[b->qs[i] & 0xF], v[i + 16] = ks_mxfp4_values[b->qs[i] >> 4];
        *dw = ks_e8m0_half_to_f32(b->e);
        break;
    }
    default: KS_ASSERT(!"ks_mm_unpack32: not a 32-element extended type");
    }
}

/* sum_b dw dx (w . q) + m * s, one block at a time */
static void ks_mm_q32s_scalar(ks_dtype t, const uint8_t *w, const uint8_t *xq, size_t xs, int nc, int64_t cols,
                              float *y, int64_t ys) {
    const int64_t nb = cols / KS_QK8_0;
    const size_t bb = ks_dtype_block_bytes(t);
    for (int c = 0; c < nc; c++) y[c * ys] = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        int8_t v[32];
        float dw, m;
        ks_mm_unpack32(t, w + (size_t)b * bb, v, &dw, &m);
        for (int c = 0; c < nc; c++) {
            const uint8_t *xc = xq + c * xs;
            const int8_t *q = (const int8_t *)xc + KS_QK8_0 * b;
            const float dx = ((const float *)(xc + ks_mm_align64((size_t)cols)))[b];
            const float sx = ((const float *)(xc + ks_mm_q8_stride(cols)))[b];
            int32_t isum = 0;
            for (int i = 0; i < 32; i++) isum += v[i] * q[i];
            y[c * ys] += dw * dx * (float)isum + m * sx;
        }
    }
}

#define KS_MM_Q32S_SCALAR(NAME, T)                                                                     \
    static void NAME(const uint8_t *w, const uint8_t *xq, size_t xs, int nc, int64_t cols, float *y,  \
                     int64_t ys) {                                                                     \
        ks_mm_q32s_scalar(T, w, xq, xs, nc, cols, y, ys);                                              \
    }
KS_MM_Q32S_SCALAR(ks_mm_q4_1_scalar, KS_DTYPE_Q4_1)
KS_MM_Q32S_SCALAR(ks_mm_q5_0_scalar, KS_DTYPE_Q5_0)
KS_MM_Q32S_SCALAR(ks_mm_q5_1_scalar, KS_DTYPE_Q5_1)
KS_MM_Q32S_SCALAR(ks_mm_iq4_nl_scalar, KS_DTYPE_IQ4_NL)
KS_MM_Q32S_SCALAR(ks_mm_mxfp4_scalar, KS_DTYPE_MXFP4)
#undef KS_MM_Q32S_SCALAR

/* One super-block of a Q8_K-partnered extended type as integers: v[256]
 * weights, the scale of each 16-element sub-block (sc16[16], a 32-element
 * sub-block's scale repeated), the min of each (mn16, 0 where none), and the
 * two float factors: x = d * sc * v - dmin * mn. */
static void ks_mm_unpack_k(ks_dtype t, const uint8_t *blk, int8_t *v, int32_t *sc16, int32_t *mn16, float *d,
                           float *dmin) {
    *dmin = 0.0f;
    for (int s = 0; s < 16; s++) mn16[s] = 0;
    switch (t) {
    case KS_DTYPE_Q2_K: {
        const ks_block_q2_k *b = (const ks_block_q2_k *)blk;
        for (int e = 0; e < KS_QK_K; e++) v[e] = (int8_t)((b->qs[32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3);
        for (int s = 0; s < 16; s++) sc16[s] = b->scales[s] & 0xF, mn16[s] = b->scales[s] >> 4;
        *d = ks_f16_to_f32(b->d), *dmin = ks_f16_to_f32(b->dmin);
        break;
    }
    case KS_DTYPE_Q3_K: {
        const ks_block_q3_k *b = (const ks_block_q3_k *)blk;
        uint8_t sc[16];
        ks_q3k_get_scales(b->scales, sc);
        for (int e = 0; e < KS_QK_K; e++) {
            int q = (b->qs[32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3;
            v[e] = (int8_t)(q - (((b->hmask[e % 32] >> (e / 32)) & 1) ? 0 : 4));
        }
        for (int s = 0; s < 16; s++) sc16[s] = (int32_t)sc[s] - 32;
        *d = ks_f16_to_f32(b->d);
        break;
    }
    case KS_DTYPE_Q5_K: {
        const ks_block_q5_k *b = (const ks_block_q5_k *)blk;
        for (int c = 0; c < 4; c++)
            for (int h = 0; h < 2; h++) {
                uint8_t sc, m;
                ks_q4k_get_scale_min(2 * c + h, b->scales, &sc, &m);
                sc16[4 * c + 2 * h] = sc16[4 * c + 2 * h + 1] = sc;
                mn16[4 * c + 2 * h] = mn16[4 * c + 2 * h + 1] = m;
                for (int l = 0; l < 32; l++)
                    v[64 * c + 32 * h + l] = (int8_t)(((b->qs[32 * c + l] >> (4 * h)) & 0xF) | ((b->qh[l] >> (2 * c + h)) & 1) << 4);
            }
        *d = ks_f16_to_f32(b->d), *dmin = ks_f16_to_f32(b->dmin);
        break;
    }
    case KS_DTYPE_IQ4_XS: {
        const ks_block_iq4_xs *b = (const ks_block_iq4_xs *)blk;
        for (int s = 0; s < 8; s++) {
            int ls = ((b->scales_l[s / 2] >> (4 * (s % 2))) & 0xF) | ((b->scales_h >> (2 * s)) & 3) << 4;
            sc16[2 * s] = sc16[2 * s + 1] = ls - 32;
            for (int i = 0; i < 16; i++) {
                v[32 * s + i] = ks_iq4_values[b->qs[16 * s + i] & 0xF];
                v[32 * s + 16 + i] = ks_iq4_values[b->qs[16 * s + i] >> 4];
            }
        }
        *d = ks_f16_to_f32(b->d);
        break;
    }
    default: KS_ASSERT(!"ks_mm_unpack_k: not a K-type extension");
    }
}

/* da (d sum_s sc_s (v_s . a_s) - dmin sum_s mn_s bsum_s), per super-block */
static void ks_mm_kx_scalar(ks_dtype t, const uint8_t *w, const uint8_t *xq, size_t xs, int nc, int64_t cols,
                            float *y, int64_t ys) {
    const int64_t nb = cols / KS_QK_K;
    const size_t bb = ks_dtype_block_bytes(t);
    for (int c = 0; c < nc; c++) y[c * ys] = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        int8_t v[KS_QK_K];
        int32_t sc[16], mn[16];
        float d, dmin;
        ks_mm_unpack_k(t, w + (size_t)b * bb, v, sc, mn, &d, &dmin);
        for (int c = 0; c < nc; c++) {
            const ks_block_q8_k *a = (const ks_block_q8_k *)(xq + c * xs) + b;
            int32_t sumi = 0, summ = 0;
            for (int s = 0; s < 16; s++) {
                int32_t isum = 0;
                for (int l = 0; l < 16; l++) isum += v[16 * s + l] * a->qs[16 * s + l];
                sumi += sc[s] * isum;
                summ += mn[s] * a->bsums[s];
            }
            y[c * ys] += a->d * (d * (float)sumi - dmin * (float)summ);
        }
    }
}

#define KS_MM_KX_SCALAR(NAME, T)                                                                       \
    static void NAME(const uint8_t *w, const uint8_t *xq, size_t xs, int nc, int64_t cols, float *y,  \
                     int64_t ys) {                                                                     \
        ks_mm_kx_scalar(T, w, xq, xs, nc, cols, y, ys);                                                \
    }
KS_MM_KX_SCALAR(ks_mm_q2_k_scalar, KS_DTYPE_Q2_K)
KS_MM_KX_SCALAR(ks_mm_q3_k_scalar, KS_DTYPE_Q3_K)
KS_MM_KX_SCALAR(ks_mm_q5_k_scalar, KS_DTYPE_Q5_K)
KS_MM_KX_SCALAR(ks_mm_iq4_xs_scalar, KS_DTYPE_IQ4_XS)
#undef KS_MM_KX_SCALAR

#endif /* KS_MM_TYPES_PART */
