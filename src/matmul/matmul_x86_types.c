/*
 * matmul_x86_types.c — SIMD kernels of Q4_1, Q5_0, Q5_1, IQ4_NL (against
 * the Q8S partner) and Q2_K, Q3_K, Q5_K, IQ4_XS (against Q8_K), written
 * once on ymm and compiled at both levels, like matmul_x86.c (included by
 * matmul.c after it, once per level; empty on its own).
 *
 * Why ymm at the AVX-512 level too.  These types are the minority tensors of
 * llama.cpp's mixes (attn_v, ffn_down, rows that are not multiples of 256) or
 * whole files at a type this engine did not read before; the first goal is
 * decode near the bandwidth of their bytes, and a ymm body with the level's
 * own dot primitive (maddubs + madd on AVX2, one vpdpbusd / vpdpwssd at the
 * AVX-512 level, through ks_mm_dot_u8s8 / ks_mm_dot_i16) does that: per
 * 32-byte run of weights it spends 3-6 vector ops per vector of the tile.
 * Q5_K and IQ4_XS, the main types of Q5_K_M and IQ4_XS files, have zmm
 * forms at the AVX-512 level instead (Q5_K: Q4_K's from matmul_x86_kquant.c plus
 * the fifth bit plane; IQ4_XS: the levels biased to unsigned), which read
 * their bytes at Q4_K's rate (docs/BENCHMARKS.md).
 *
 * How each type meets the integer dot product (u8 x s8 in maddubs/dpbusd):
 *   - unsigned weights with an offset taken out once per block or
 *     super-block: Q4_1 / Q5_1 nibbles (0..15 / 0..31) with + m * s (the
 *     partner's block sum), Q5_K (0..31, mins against the Q8_K bsums), Q2_K
 *     (0..3, ditto), Q3_K as q2 + 4 h in 0..7 with -4 * sum sc * bsum;
 *   - signed weights by the sign trick (|w| times sign(a, w)): Q5_0 (q5 - 16)
 *     and the IQ4 levels, looked up by pshufb from the nibbles.  No maddubs
 *     pair saturates: at most 2 * 127 * 127 (IQ4) or 2 * 31 * 127.
 * Per-sub-block scales multiply the int16 pair sums (madd / vpdpwssd), whose
 * lanes each belong to one sub-block of 16 or 32.  The Q5 fifth bits are
 * spread to bytes by a byte shuffle of the 32-bit qh and a bit mask compare.
 */
#ifndef KS_MM_TEMPLATE_PASS
typedef int ks_matmul_x86_types_is_included_by_matmul_c; /* standalone: nothing to compile */
#else

#define KS_MM_FN static __attribute__((target(KS_MM_TGT)))
#define KS_MM_INL static inline __attribute__((target(KS_MM_TGT), always_inline))

/* 32 nibbles of 16 bytes in element order: lo nibbles = 0..15, hi = 16..31 */
KS_MM_INL __m256i KS_MM_SFX(ks_mm_nib32)(const uint8_t *qs) {
    const __m128i q = _mm_loadu_si128((const __m128i *)qs), m = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m));
}

/* bit i of the little-endian u32 at qh as 0x10 in byte i */
KS_MM_INL __m256i KS_MM_SFX(ks_mm_q5_high)(const uint8_t *qh) {
    uint32_t h;
    memcpy(&h, qh, 4);
    const __m256i sh = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3,
                                        3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i b = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)h), sh), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(b, bit), _mm256_set1_epi8(0x10));
}

/* Q3_K's 16 scales (minus the 32 bias) from its 12 bytes (layout at
 * ks_q3k_get_scales): low nibbles from bytes 0-7 (scales 0-7) and their
 * high nibbles (8-15); the top 2 bits of scale j at bits 2 (j / 4) of byte
 * 8 + j % 4, one byte shuffle and four shifts blended by 4-byte groups. */
KS_MM_INL __m128i KS_MM_SFX(ks_mm_q3k_scales)(const uint8_t *q) {
    const __m128i m4 = _mm_set1_epi8(0x0F), m3 = _mm_set1_epi8(3);
    const __m128i lo8 = _mm_loadl_epi64((const __m128i *)q);
    uint32_t top;
    memcpy(&top, q + 8, 4);
    const __m128i l = _mm_unpacklo_epi64(_mm_and_si128(lo8, m4), _mm_and_si128(_mm_srli_epi16(lo8, 4), m4));
    const __m128i t = _mm_set1_epi32((int)top); /* byte j % 4 is byte 8 + j % 4 of the scales */
    __m128i h = _mm_blend_epi16(_mm_and_si128(t, m3), _mm_and_si128(_mm_srli_epi16(t, 2), m3), 0x0C);
    h = _mm_blend_epi16(h, _mm_and_si128(_mm_srli_epi16(t, 4), m3), 0x30);
    h = _mm_blend_epi16(h, _mm_and_si128(_mm_srli_epi16(t, 6), m3), 0xC0);
    return _mm_sub_epi8(_mm_or_si128(l, _mm_slli_epi16(h, 4)), _mm_set1_epi8(32));
}

#if KS_MM_LEVEL < 2 /* the AVX-512 level has the zmm form below */
/* ------------------------------------------------ Q4_1 / Q5_0 / Q5_1 / IQ4_NL
 * One block for all NC vectors: w (32 int8 in element order), signed says
 * whether the sign trick is needed, dw and m the block's float factors. */
#define KS_MM_Q32S_BLOCK(UNPACK, SIGNED, OFFSET)                                                       \
    do {                                                                                               \
        __m256i wq;                                                                                    \
        float dw, m;                                                                                   \
        UNPACK;                                                                                        \
        const __m256i wu = SIGNED ? _mm256_sign_epi8(wq, wq) : wq;                                     \
        const __m256 dwv = _mm256_set1_ps(dw);                                                         \
        _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) {                                         \
            const uint8_t *xc = xq + c * xs;                                                           \
            const __m256i a = _mm256_loadu_si256((const __m256i *)(xc + 32 * b));                      \
            const __m256i p = KS_MM_SFX(ks_mm_dot_u8s8)(_mm256_setzero_si256(), wu,                    \
                                                        SIGNED ? _mm256_sign_epi8(a, wq) : a);         \
            const __m256 s = _mm256_mul_ps(dwv, _mm256_set1_ps(((const float *)(xc + doff))[b]));      \
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), s, acc[c]);                                \
            if (OFFSET) macc[c] += m * ((const float *)(xc + soff))[b];                                \
        }                                                                                              \
    } while (0)

#define KS_MM_Q32S_KERNEL(name, BT, UNPACK, SIGNED, OFFSET)                                            \
    KS_MM_INL void KS_MM_SFX(name##_body)(const uint8_t *w, const uint8_t *xq, size_t xs,              \
                                          int64_t cols, float *y, int64_t ys, const int NC) {          \
        const BT *wb = (const BT *)w;                                                                  \
        const int64_t nb = cols / 32;                                                                  \
        const size_t doff = ks_mm_align64((size_t)cols), soff = ks_mm_q8_stride(cols);                 \
        const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)ks_iq4_values)); \
        (void)lut;                                                                                     \
        __m256 acc[4];                                                                                 \
        float macc[4] = {0, 0, 0, 0};                                                                  \
        _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();             \
        for (int64_t b = 0; b < nb; b++) {                                                             \
            _mm_prefetch((const char *)(wb + b) + 64 * sizeof(BT), _MM_HINT_T0);                       \
            KS_MM_Q32S_BLOCK(UNPACK, SIGNED, OFFSET);                                                  \
        }                                                                                              \
        _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) y[c * ys] =                               \
            KS_MM_SFX(ks_mm_hsum8)(acc[c]) + macc[c];                                                  \
    }                                                                                                  \
    KS_MM_FN void KS_MM_SFX(name)(const uint8_t *w, const uint8_t *xq, size_t xs, int nc,              \
                                  int64_t cols, float *y, int64_t ys) {                                \
        KS_MM_NC_SWITCH(KS_MM_SFX(name##_body), w, xq, xs, cols, y, ys)                                \
    }

KS_MM_Q32S_KERNEL(ks_mm_q4_1t, ks_block_q4_1,
                  (wq = KS_MM_SFX(ks_mm_nib32)(wb[b].qs), dw = KS_MM_SFX(ks_mm_h2f)(wb[b].d),
                   m = KS_MM_SFX(ks_mm_h2f)(wb[b].m)),
                  0, 1)
KS_MM_Q32S_KERNEL(ks_mm_q5_1t, ks_block_q5_1,
                  (wq = _mm256_or_si256(KS_MM_SFX(ks_mm_nib32)(wb[b].qs), KS_MM_SFX(ks_mm_q5_high)(wb[b].qh)),
                   dw = KS_MM_SFX(ks_mm_h2f)(wb[b].d), m = KS_MM_SFX(ks_mm_h2f)(wb[b].m)),
                  0, 1)
KS_MM_Q32S_KERNEL(ks_mm_q5_0t, ks_block_q5_0,
                  (wq = _mm256_sub_epi8(_mm256_or_si256(KS_MM_SFX(ks_mm_nib32)(wb[b].qs),
                                                        KS_MM_SFX(ks_mm_q5_high)(wb[b].qh)),
                                        _mm256_set1_epi8(16)),
                   dw = KS_MM_SFX(ks_mm_h2f)(wb[b].d), m = 0.0f),
                  1, 0)
KS_MM_Q32S_KERNEL(ks_mm_iq4_nlt, ks_block_iq4_nl,
                  (wq = _mm256_shuffle_epi8(lut, KS_MM_SFX(ks_mm_nib32)(wb[b].qs)),
                   dw = KS_MM_SFX(ks_mm_h2f)(wb[b].d), m = 0.0f),
                  1, 0)
/* MXFP4: IQ4_NL's form with the doubled E2M1 values as the table and the
 * E8M0 scale as dw (one shuffle per block: 17 bytes in, 32 int8 out) */
KS_MM_Q32S_KERNEL(ks_mm_mxfp4t, ks_block_mxfp4,
                  (wq = _mm256_shuffle_epi8(
                       _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)ks_mxfp4_values)),
                       KS_MM_SFX(ks_mm_nib32)(wb[b].qs)),
                   dw = ks_e8m0_half_to_f32(wb[b].e), m = 0.0f),
                  1, 0)
#undef KS_MM_Q32S_KERNEL
#undef KS_MM_Q32S_BLOCK
#endif /* KS_MM_LEVEL < 2 */

#if KS_MM_LEVEL >= 2
/* The 32-element types' zmm form at the AVX-512 level: groups of eight
 * blocks, two per zmm, every type as unsigned weights u with an offset m
 * per block (Q4_1 / Q5_1 their own m; Q5_0 u = q5, m = -16 d; IQ4_NL u =
 * level + 128, m = -128 d), since zmm has no sign trick.  Per vector and
 * pair of blocks: one vpdpbusd (int32 lanes 0-7 block b, 8-15 block b + 1),
 * int->float, and one FMA by dw dx expanded per half; the offsets meet the
 * partner's block sums as one FMA per group of eight.  A partial last group
 * has zero weights, scales and offsets and masked activation loads, so it
 * reads nothing past the row or the vector. */
KS_MM_INL __m256i KS_MM_SFX(ks_mm_u32_block)(ks_dtype t, const uint8_t *blk, __m256i lut, float *dw, float *m) {
    switch (t) {
    case KS_DTYPE_Q4_1: {
        const ks_block_q4_1 *x = (const ks_block_q4_1 *)blk;
        *dw = KS_MM_SFX(ks_mm_h2f)(x->d), *m = KS_MM_SFX(ks_mm_h2f)(x->m);
        return KS_MM_SFX(ks_mm_nib32)(x->qs);
    }
    case KS_DTYPE_Q5_1: {
        const ks_block_q5_1 *x = (const ks_block_q5_1 *)blk;
        *dw = KS_MM_SFX(ks_mm_h2f)(x->d), *m = KS_MM_SFX(ks_mm_h2f)(x->m);
        return _mm256_or_si256(KS_MM_SFX(ks_mm_nib32)(x->qs), KS_MM_SFX(ks_mm_q5_high)(x->qh));
    }
    case KS_DTYPE_Q5_0: {
        const ks_block_q5_0 *x = (const ks_block_q5_0 *)blk;
        *dw = KS_MM_SFX(ks_mm_h2f)(x->d), *m = -16.0f * *dw;
        return _mm256_or_si256(KS_MM_SFX(ks_mm_nib32)(x->qs), KS_MM_SFX(ks_mm_q5_high)(x->qh));
    }
    case KS_DTYPE_MXFP4: { /* the table below holds the MXFP4 values for this type */
        const ks_block_mxfp4 *x = (const ks_block_mxfp4 *)blk;
        *dw = ks_e8m0_half_to_f32(x->e), *m = -128.0f * *dw;
        return _mm256_shuffle_epi8(lut, KS_MM_SFX(ks_mm_nib32)(x->qs));
    }
    default: { /* IQ4_NL */
        const ks_block_iq4_nl *x = (const ks_block_iq4_nl *)blk;
        *dw = KS_MM_SFX(ks_mm_h2f)(x->d), *m = -128.0f * *dw;
        return _mm256_shuffle_epi8(lut, KS_MM_SFX(ks_mm_nib32)(x->qs));
    }
    }
}

KS_MM_INL void KS_MM_SFX(ks_mm_q32z_body)(ks_dtype t, const uint8_t *w, const uint8_t *xq, size_t xs, int64_t cols,
                                          float *y, int64_t ys, const int NC) {
    const size_t bb = ks_dtype_block_bytes(t);
    const int64_t nb = cols / 32;
    const size_t doff = ks_mm_align64((size_t)cols), soff = ks_mm_q8_stride(cols);
    const int8_t *levels = t == KS_DTYPE_MXFP4 ? ks_mxfp4_values : ks_iq4_values;
    const __m256i lut = _mm256_add_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)levels)),
                                        _mm256_set1_epi8((char)128));
    const __m512i half = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    __m512 acc[4];
    __m256 macc[4];
    _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) acc[c] = _mm512_setzero_ps(), macc[c] = _mm256_setzero_ps();
    for (int64_t g = 0; g < nb; g += 8) {
        const int nv = nb - g < 8 ? (int)(nb - g) : 8;
        __m512i W[4];
        __m512 DW[4];
        float dw[8] = {0}, m[8] = {0};
        _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
            __m256i u0 = _mm256_setzero_si256(), u1 = _mm256_setzero_si256();
            if (2 * k < nv) u0 = KS_MM_SFX(ks_mm_u32_block)(t, w + (size_t)(g + 2 * k) * bb, lut, &dw[2 * k], &m[2 * k]);
            if (2 * k + 1 < nv)
                u1 = KS_MM_SFX(ks_mm_u32_block)(t, w + (size_t)(g + 2 * k + 1) * bb, lut, &dw[2 * k + 1], &m[2 * k + 1]);
            W[k] = _mm512_inserti64x4(_mm512_castsi256_si512(u0), u1, 1);
            DW[k] = _mm512_insertf32x8(_mm512_set1_ps(dw[2 * k]), _mm256_set1_ps(dw[2 * k + 1]), 1);
        }
        const __m256 mv = _mm256_loadu_ps(m);
        const __mmask8 bm = (__mmask8)((1u << nv) - 1);
        _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) {
            const uint8_t *xc = xq + c * xs;
            const int8_t *q = (const int8_t *)xc + 32 * g;
            const float *dx = (const float *)(xc + doff) + g, *sx = (const float *)(xc + soff) + g;
            const __m256 dxv8 = nv == 8 ? _mm256_loadu_ps(dx) : _mm256_maskz_loadu_ps(bm, dx);
            const __m512 dx16 = _mm512_castps256_ps512(dxv8);
            _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
                const __m512i a = nv == 8 ? _mm512_loadu_si512((const void *)(q + 64 * k))
                                  : 2 * k < nv ? _mm512_maskz_loadu_epi8(
                                                     2 * k + 1 < nv ? ~(__mmask64)0 : (__mmask64)0xFFFFFFFFu, q + 64 * k)
                                               : _mm512_setzero_si512();
                const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), W[k], a);
                const __m512 dxk = _mm512_permutexvar_ps(_mm512_add_epi32(half, _mm512_set1_epi32(2 * k)), dx16);
                acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(DW[k], dxk), acc[c]);
            }
            macc[c] = _mm256_fmadd_ps(mv, nv == 8 ? _mm256_loadu_ps(sx) : _mm256_maskz_loadu_ps(bm, sx), macc[c]);
        }
    }
    _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) y[c * ys] =
        _mm512_reduce_add_ps(acc[c]) + KS_MM_SFX(ks_mm_hsum8)(macc[c]);
}

#define KS_MM_Q32Z(name, T)                                                                            \
    KS_MM_INL void KS_MM_SFX(name##_body)(const uint8_t *w, const uint8_t *xq, size_t xs, int64_t cols, \
                                          float *y, int64_t ys, const int NC) {                        \
        KS_MM_SFX(ks_mm_q32z_body)(T, w, xq, xs, cols, y, ys, NC);                                     \
    }                                                                                                  \
    KS_MM_FN void KS_MM_SFX(name)(const uint8_t *w, const uint8_t *xq, size_t xs, int nc, int64_t cols, \
                                  float *y, int64_t ys) {                                              \
        KS_MM_NC_SWITCH(KS_MM_SFX(name##_body), w, xq, xs, cols, y, ys)                                \
    }
KS_MM_Q32Z(ks_mm_q4_1z, KS_DTYPE_Q4_1)
KS_MM_Q32Z(ks_mm_q5_0z, KS_DTYPE_Q5_0)
KS_MM_Q32Z(ks_mm_q5_1z, KS_DTYPE_Q5_1)
KS_MM_Q32Z(ks_mm_iq4_nlz, KS_DTYPE_IQ4_NL)
KS_MM_Q32Z(ks_mm_mxfp4z, KS_DTYPE_MXFP4)
#undef KS_MM_Q32Z
#endif /* KS_MM_LEVEL >= 2 */

#if KS_MM_LEVEL < 2 /* the AVX-512 level has the zmm form below */
/* ---------------------------------------------------------------- Q5_K --
 * Q4_K's layout plus a fifth bit plane: qh[l] bit 2c is element 64c + l's,
 * bit 2c + 1 element 64c + 32 + l's; each is shifted to bit 4 by a 16-bit
 * shift of qh (the bits it carries across bytes are masked off). */
KS_MM_INL void KS_MM_SFX(ks_mm_q5_kt_body)(const uint8_t *w, const uint8_t *xq, size_t xs, int64_t cols,
                                           float *y, int64_t ys, const int NC) {
    const ks_block_q5_k *wb = (const ks_block_q5_k *)w;
    const int64_t nb = cols / KS_QK_K;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m10 = _mm256_set1_epi8(0x10);
    __m128 acc[4]; /* lane 0: the output, in the eight-row tile's order (matmul_x86_kquant.c, ks_mm_hsum2_i32) */
    _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) acc[c] = _mm_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        KS_MM_QK_PREFETCH(wb + b, sizeof(ks_block_q5_k) + 16); /* 176 bytes: 3 lines */
        /* scales and mins as in Q4_K (matmul_x86_kquant.c: word-wise unpack, one
         * in-lane shuffle per sub-block scale) */
        const __m128i scm = KS_MM_SFX(ks_mm_q4k_scales_v)(wb + b);
        const __m256i scales = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(scm));
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(scm, scm));
        /* d and dmin by one conversion: [d, dmin, 0, 0] */
        uint32_t ddm;
        memcpy(&ddm, &wb[b].d, 4);
        const __m128 dd = _mm_cvtph_ps(_mm_cvtsi32_si128((int)ddm));
        __m256i isum[4], isum2[4]; /* two chains for one vector only, as in Q4_K (matmul_x86_kquant.c) */
        _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) isum[c] = isum2[c] = _mm256_setzero_si256();
        const __m256i qh = _mm256_loadu_si256((const __m256i *)wb[b].qh);
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(wb[b].qs + 32 * j));
            /* bits 2j and 2j + 1 of qh moved straight to bit 4 (constant
             * shifts once unrolled; one fewer op per chunk than shifting qh) */
            const __m256i h0 = 2 * j <= 4 ? _mm256_slli_epi16(qh, 4 - 2 * j) : _mm256_srli_epi16(qh, 2 * j - 4);
            const __m256i h1 = 2 * j <= 3 ? _mm256_slli_epi16(qh, 3 - 2 * j) : _mm256_srli_epi16(qh, 2 * j - 3);
            const __m256i lo = _mm256_or_si256(_mm256_and_si256(q, m4), _mm256_and_si256(h0, m10));
            const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), _mm256_and_si256(h1, m10));
            const __m256i slo = _mm256_shuffle_epi8(scales, KS_MM_W16(2 * j));
            const __m256i shi = _mm256_shuffle_epi8(scales, KS_MM_W16(2 * j + 1));
            _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) {
                const int8_t *aq = ((const ks_block_q8_k *)(xq + c * xs))[b].qs + 64 * j;
                const __m256i plo = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)aq));
                const __m256i phi = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(aq + 32)));
                isum[c] = KS_MM_SFX(ks_mm_dot_i16)(isum[c], plo, slo);
                if (NC == 1) isum2[c] = KS_MM_SFX(ks_mm_dot_i16)(isum2[c], phi, shi);
                else isum[c] = KS_MM_SFX(ks_mm_dot_i16)(isum[c], phi, shi);
            }
        }
        _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) {
            const ks_block_q8_k *a = ((const ks_block_q8_k *)(xq + c * xs)) + b;
            const __m256i msum = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)a->bsums), mins);
            const __m128 s = _mm_mul_ps(dd, _mm_set1_ps(a->d)); /* [d * da, dmin * da] */
            acc[c] = KS_MM_SFX(ks_mm_kq_step)(acc[c], KS_MM_SFX(ks_mm_hsum2_i32)(_mm256_add_epi32(isum[c], isum2[c]), msum), s);
        }
    }
    _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) y[c * ys] = _mm_cvtss_f32(acc[c]);
}

KS_MM_FN void KS_MM_SFX(ks_mm_q5_kt)(const uint8_t *w, const uint8_t *xq, size_t xs, int nc, int64_t cols, float *y,
                                     int64_t ys) {
    KS_MM_NC_SWITCH(KS_MM_SFX(ks_mm_q5_kt_body), w, xq, xs, cols, y, ys)
}

KS_MM_FN void KS_MM_SFX(ks_mm_q5_kt_rows)(const uint8_t *w, size_t wrow, int64_t nr, const uint8_t *xq, size_t xs,
                                      int nc, int64_t cols, float *y, int64_t ys) {
    KS_MM_ROWS_SWITCH(KS_MM_SFX(ks_mm_q5_kt_body))
}
#endif /* KS_MM_LEVEL < 2 */

#if KS_MM_LEVEL >= 2
/* Q5_K's zmm form at the AVX-512 level: matmul_x86_kquant.c's Q4_K zmm kernel
 * with its fifth bit plane (Q5 set; that kernel's comment has the layout
 * work), which reads Q5_K's bytes at Q4_K's rate. */
KS_MM_FN void KS_MM_SFX(ks_mm_q5_kz)(const uint8_t *w, const uint8_t *xq, size_t xs, int nc, int64_t cols, float *y,
                                     int64_t ys) {
    KS_MM_NC_SWITCH(KS_MM_SFX(ks_mm_q4_kz_body), true, w, xq, xs, cols, y, ys)
}
#endif /* KS_MM_LEVEL >= 2 */

/* --------------------------------------------------------- Q2_K / Q3_K --
 * The same 2-bit planes: 32 bytes of qs per 128 elements, plane j (bits 2j)
 * being elements 32j..32j+31 of that half, i.e. sub-blocks 2j and 2j + 1 of
 * 16: one maddubs covers both, and its int16 lanes 0-7 / 8-15 meet the two
 * scales through a byte shuffle of the 16 scales (as Q6_K's AVX2 kernel).
 * Q3_K adds the hmask plane (bit 4n + j of hmask[l], shifted right by one
 * per plane) as + 4 to make q2 + 4h in 0..7, and takes the 4 out once per
 * super-block as -4 * sum_s sc_s * bsum_s; Q2_K takes its mins out as
 * dmin * sum_s m_s * bsum_s. */
KS_MM_INL void KS_MM_SFX(ks_mm_q23_kt_body)(const uint8_t *w, const uint8_t *xq, size_t xs, int64_t cols,
                                            float *y, int64_t ys, const int NC, const bool q3) {
    const int64_t nb = cols / KS_QK_K;
    const size_t bb = q3 ? sizeof(ks_block_q3_k) : sizeof(ks_block_q2_k);
    const __m256i m3 = _mm256_set1_epi8(3), m04 = _mm256_set1_epi8(4);
    const __m128i pair = _mm_set_epi64x(0x0101010101010101LL, 0);
    __m256 acc[4];
    _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + (size_t)b * bb;
        __m128i sc8;  /* the 16 sub-block scales as int8 */
        __m256i corr16; /* int16 factors against the bsums: mins (Q2_K) or scales (Q3_K) */
        float d, dmin = 0.0f;
        const uint8_t *qs;
        __m256i hm = _mm256_setzero_si256();
        if (q3) {
            const ks_block_q3_k *x = (const ks_block_q3_k *)blk;
            sc8 = KS_MM_SFX(ks_mm_q3k_scales)(x->scales);
            corr16 = _mm256_cvtepi8_epi16(sc8);
            d = KS_MM_SFX(ks_mm_h2f)(x->d);
            qs = x->qs;
            hm = _mm256_loadu_si256((const __m256i *)x->hmask);
        } else {
            const ks_block_q2_k *x = (const ks_block_q2_k *)blk;
            const __m128i raw = _mm_loadu_si128((const __m128i *)x->scales);
            sc8 = _mm_and_si128(raw, _mm_set1_epi8(0x0F));
            corr16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0x0F)));
            d = KS_MM_SFX(ks_mm_h2f)(x->d), dmin = KS_MM_SFX(ks_mm_h2f)(x->dmin);
            qs = x->qs;
        }
        __m256i isum[4], isum2[4];
        _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) isum[c] = isum2[c] = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
                __m256i v = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m3);
                if (q3) {
                    v = _mm256_or_si256(v, _mm256_and_si256(_mm256_slli_epi16(hm, 2), m04));
                    hm = _mm256_srli_epi16(hm, 1);
                }
                const int s = 8 * h + 2 * j; /* v covers sub-blocks s, s + 1 */
                const __m256i scv = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, _mm_add_epi8(pair, _mm_set1_epi8((char)s))));
                _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) {
                    const int8_t *aq = ((const ks_block_q8_k *)(xq + c * xs))[b].qs + 128 * h + 32 * j;
                    const __m256i p = _mm256_maddubs_epi16(v, _mm256_loadu_si256((const __m256i *)aq));
                    if (j & 1) isum2[c] = KS_MM_SFX(ks_mm_dot_i16)(isum2[c], p, scv);
                    else isum[c] = KS_MM_SFX(ks_mm_dot_i16)(isum[c], p, scv);
                }
            }
        }
        _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) {
            const ks_block_q8_k *a = ((const ks_block_q8_k *)(xq + c * xs)) + b;
            const __m256i cs = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)a->bsums), corr16);
            __m256i tot = _mm256_add_epi32(isum[c], isum2[c]);
            if (q3) {
                tot = _mm256_sub_epi32(tot, _mm256_slli_epi32(cs, 2));
                acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(tot), _mm256_set1_ps(d * a->d), acc[c]);
            } else {
                acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(tot), _mm256_set1_ps(d * a->d), acc[c]);
                acc[c] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(cs), _mm256_set1_ps(dmin * a->d), acc[c]);
            }
        }
    }
    _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) y[c * ys] = KS_MM_SFX(ks_mm_hsum8)(acc[c]);
}

KS_MM_INL void KS_MM_SFX(ks_mm_q2_kt_body)(const uint8_t *w, const uint8_t *xq, size_t xs, int64_t cols, float *y,
                                           int64_t ys, const int NC) {
    KS_MM_SFX(ks_mm_q23_kt_body)(w, xq, xs, cols, y, ys, NC, false);
}
KS_MM_INL void KS_MM_SFX(ks_mm_q3_kt_body)(const uint8_t *w, const uint8_t *xq, size_t xs, int64_t cols, float *y,
                                           int64_t ys, const int NC) {
    KS_MM_SFX(ks_mm_q23_kt_body)(w, xq, xs, cols, y, ys, NC, true);
}
KS_MM_FN void KS_MM_SFX(ks_mm_q2_kt)(const uint8_t *w, const uint8_t *xq, size_t xs, int nc, int64_t cols, float *y,
                                     int64_t ys) {
    KS_MM_NC_SWITCH(KS_MM_SFX(ks_mm_q2_kt_body), w, xq, xs, cols, y, ys)
}
KS_MM_FN void KS_MM_SFX(ks_mm_q3_kt)(const uint8_t *w, const uint8_t *xq, size_t xs, int nc, int64_t cols, float *y,
                                     int64_t ys) {
    KS_MM_NC_SWITCH(KS_MM_SFX(ks_mm_q3_kt_body), w, xq, xs, cols, y, ys)
}

#if KS_MM_LEVEL >= 2
/* IQ4_XS's zmm form at the AVX-512 level.  Zmm k holds the 64 weights of
 * sub-blocks 2k and 2k + 1 in element order: a 64-byte load of qs is four
 * sub-blocks' 16 bytes, whose low nibbles are elements 0-15 and high
 * nibbles 16-31 of each, interleaved by 128-bit lanes with one
 * vpermt2q.  The levels are looked up as unsigned (level + 128, vpshufb
 * within each 128-bit lane) for vpdpbusd, which has no sign trick on zmm;
 * the + 128 is taken out once per super-block as -128 * sum_s sc_s * (the
 * two Q8_K bsums of sub-block s).  Four products of up to 241 * 127 do not
 * fit the int16 that vpdpwssd scaling needs, so the sub-block scale is one
 * vpmulld per zmm instead. */
KS_MM_INL void KS_MM_SFX(ks_mm_iq4_xsz_body)(const uint8_t *w, const uint8_t *xq, size_t xs, int64_t cols,
                                             float *y, int64_t ys, const int NC) {
    const ks_block_iq4_xs *wb = (const ks_block_iq4_xs *)w;
    const int64_t nb = cols / KS_QK_K;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i lut = _mm512_broadcast_i32x4(
        _mm_add_epi8(_mm_loadu_si128((const __m128i *)ks_iq4_values), _mm_set1_epi8((char)128)));
    const __m512i ilv = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), ilv2 = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
    const __m512i s0i = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m256i shl = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28), shh = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    __m512 acc[4];
    _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        uint32_t sl;
        memcpy(&sl, wb[b].scales_l, 4);
        const __m256i ls = _mm256_sub_epi32(
            _mm256_or_si256(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)sl), shl), _mm256_set1_epi32(15)),
                            _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(wb[b].scales_h), shh),
                                                               _mm256_set1_epi32(3)),
                                              4)),
            _mm256_set1_epi32(32)); /* ls_s - 32, s = 0..7 */
        const __m512i sc32 = _mm512_zextsi256_si512(ls);
        __m512i S[4];
        _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) S[k] = _mm512_permutexvar_epi32(
            _mm512_add_epi32(s0i, _mm512_set1_epi32(2 * k)), sc32);
        const __m128i l16 = _mm256_cvtepi32_epi16(ls);
        const __m256i pairs = _mm256_set_m128i(_mm_unpackhi_epi16(l16, l16), _mm_unpacklo_epi16(l16, l16));
        __m512i W[4];
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
            const __m512i z = _mm512_loadu_si512((const void *)(wb[b].qs + 64 * h));
            const __m512i lo = _mm512_shuffle_epi8(lut, _mm512_and_si512(z, m4));
            const __m512i hi = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(z, 4), m4));
            W[2 * h] = _mm512_permutex2var_epi64(lo, ilv, hi);
            W[2 * h + 1] = _mm512_permutex2var_epi64(lo, ilv2, hi);
        }
        const __m512 dv = _mm512_set1_ps(KS_MM_SFX(ks_mm_h2f)(wb[b].d));
        _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) {
            const ks_block_q8_k *a = ((const ks_block_q8_k *)(xq + c * xs)) + b;
            const __m256i corr = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)a->bsums), pairs);
            __m512i isum = _mm512_zextsi256_si512(_mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(corr, 7)));
            _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
                const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), W[k],
                                                      _mm512_loadu_si512((const void *)(a->qs + 64 * k)));
                isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(p, S[k]));
            }
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dv, _mm512_set1_ps(a->d)), acc[c]);
        }
    }
    _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) y[c * ys] = _mm512_reduce_add_ps(acc[c]);
}

KS_MM_FN void KS_MM_SFX(ks_mm_iq4_xsz)(const uint8_t *w, const uint8_t *xq, size_t xs, int nc, int64_t cols, float *y,
                                       int64_t ys) {
    KS_MM_NC_SWITCH(KS_MM_SFX(ks_mm_iq4_xsz_body), w, xq, xs, cols, y, ys)
}
#endif /* KS_MM_LEVEL >= 2 */

#if KS_MM_LEVEL < 2 /* the AVX-512 level has the zmm form above */
/* -------------------------------------------------------------- IQ4_XS --
 * Per 32-element sub-block: the nibbles looked up into the IQ4 levels, the
 * sign trick, and the int16 pair sums times the signed 6-bit scale
 * (ls - 32); d * da once per super-block.
 *
 * Bookkeeping is what bounds this at n = 1 (as in Q4_K, matmul_x86_kquant.c), so:
 * the eight 6-bit scales are built in one xmm of int16 (the nibbles by a
 * mask, a shift and an unpack; the 2-bit high parts by one multiply that
 * shifts lane s left by 14 - 2s, then a shift right by 14) and each
 * sub-block's scale is one in-lane shuffle of that register; and one 32-byte load serves two sub-blocks: its low and
 * high nibbles are [s: 0-15 | s+1: 0-15] and [s: 16-31 | s+1: 16-31], and two
 * 128-bit lane permutes give each sub-block in element order, against one
 * 16-byte load, nibble split and insert per sub-block before.
 * The int32 lanes are summed per super-block (exact) before the one FMA by
 * d * da, the eight-row prefill tile's order (matmul_x86_tiles.c): an
 * output has the same bits in decode, batches and prefill. */

KS_MM_INL void KS_MM_SFX(ks_mm_iq4_xst_body)(const uint8_t *w, const uint8_t *xq, size_t xs, int64_t cols,
                                             float *y, int64_t ys, const int NC) {
    const ks_block_iq4_xs *wb = (const ks_block_iq4_xs *)w;
    const int64_t nb = cols / KS_QK_K;
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)ks_iq4_values));
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m128 acc[4]; /* lane 0: the output, in the eight-row tile's order (matmul_x86_tiles.c, ks_mm_hsum2_i32) */
    _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) acc[c] = _mm_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        KS_MM_QK_PREFETCH(wb + b, sizeof(ks_block_iq4_xs)); /* 136 bytes: 3 lines */
        uint32_t sl;
        memcpy(&sl, wb[b].scales_l, 4);
        const __m128i v = _mm_cvtsi32_si128((int)sl), m4x = _mm_set1_epi8(0x0F);
        /* low nibbles: byte s = nibble s of scales_l */
        const __m128i lo4 = _mm_cvtepu8_epi16(
            _mm_unpacklo_epi8(_mm_and_si128(v, m4x), _mm_and_si128(_mm_srli_epi16(v, 4), m4x)));
        /* high bits: bits 2s, 2s + 1 of scales_h moved to the top of lane s, then down */
        const __m128i hi2 = _mm_srli_epi16(
            _mm_mullo_epi16(_mm_set1_epi16((short)wb[b].scales_h),
                            _mm_setr_epi16(1 << 14, 1 << 12, 1 << 10, 1 << 8, 1 << 6, 1 << 4, 1 << 2, 1)),
            14);
        const __m256i scales = _mm256_broadcastsi128_si256(
            _mm_sub_epi16(_mm_or_si128(lo4, _mm_slli_epi16(hi2, 4)), _mm_set1_epi16(32))); /* ls_s - 32 */
        __m256i isum[4], isum2[4];
        _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) isum[c] = isum2[c] = _mm256_setzero_si256();
        _Pragma("GCC unroll 4") for (int s2 = 0; s2 < 4; s2++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(wb[b].qs + 32 * s2));
            const __m256i lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(q, m4));
            const __m256i hi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(q, 4), m4));
            const __m256i wq2[2] = {_mm256_permute2x128_si256(lo, hi, 0x20), _mm256_permute2x128_si256(lo, hi, 0x31)};
            _Pragma("GCC unroll 2") for (int t = 0; t < 2; t++) {
                const int s = 2 * s2 + t;
                const __m256i scv = _mm256_shuffle_epi8(scales, KS_MM_W16(s));
                const __m256i wq = wq2[t], wu = _mm256_sign_epi8(wq, wq);
                _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) {
                    const int8_t *aq = ((const ks_block_q8_k *)(xq + c * xs))[b].qs + 32 * s;
                    const __m256i p =
                        _mm256_maddubs_epi16(wu, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)aq), wq));
                    if ((s & 1) && NC == 1) isum2[c] = KS_MM_SFX(ks_mm_dot_i16)(isum2[c], p, scv);
                    else isum[c] = KS_MM_SFX(ks_mm_dot_i16)(isum[c], p, scv);
                }
            }
        }
        const float d = KS_MM_SFX(ks_mm_h2f)(wb[b].d);
        _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) {
            const ks_block_q8_k *a = ((const ks_block_q8_k *)(xq + c * xs)) + b;
            const __m256i tot = _mm256_add_epi32(isum[c], isum2[c]);
            acc[c] = _mm_fmadd_ss(_mm_cvtepi32_ps(KS_MM_SFX(ks_mm_hsum2_i32)(tot, tot)), _mm_set_ss(d * a->d), acc[c]);
        }
    }
    _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) y[c * ys] = _mm_cvtss_f32(acc[c]);
}

KS_MM_FN void KS_MM_SFX(ks_mm_iq4_xst)(const uint8_t *w, const uint8_t *xq, size_t xs, int nc, int64_t cols, float *y,
                                       int64_t ys) {
    KS_MM_NC_SWITCH(KS_MM_SFX(ks_mm_iq4_xst_body), w, xq, xs, cols, y, ys)
}

KS_MM_FN void KS_MM_SFX(ks_mm_iq4_xst_rows)(const uint8_t *w, size_t wrow, int64_t nr, const uint8_t *xq, size_t xs,
                                      int nc, int64_t cols, float *y, int64_t ys) {
    KS_MM_ROWS_SWITCH(KS_MM_SFX(ks_mm_iq4_xst_body))
}
#endif /* KS_MM_LEVEL < 2 */

#undef KS_MM_FN
#undef KS_MM_INL
#endif /* KS_MM_TEMPLATE_PASS */
