/*
 * matmul_x86_tiles.c — the AVX2 eight-row prefill tile for IQ4_XS (the main
 * type of IQ4_XS files), over the file's rows as they are (no repacking, no
 * memory).
 *
 * Why a file of its own: the K-quant tiles of matmul_x86_panel.c share one
 * arithmetic (unsigned weights, int16 sums of several maddubs outputs before
 * the scales' madd, the mins or the offset taken off per super-block), and
 * IQ4_XS's signed levels do not fit it (see below); what it shares with them
 * is the eight-row transpose (ks_mm_t8_transpose) and the entry switch
 * (KS_MM_T8_SWITCH, matmul.c).  It is a template like matmul_x86.c:
 * matmul.c includes it after matmul_x86_panel.c in each level's pass; it has
 * code at the AVX2 level (KS_MM_LEVEL 1) only, and compiled on its own it is
 * empty.
 */
#ifndef KS_MM_TEMPLATE_PASS
typedef int ks_matmul_x86_tiles_is_included_by_matmul_c; /* standalone: nothing to compile */
#else
#if KS_MM_LEVEL < 2
#define KS_MM_FN static __attribute__((target(KS_MM_TGT)))
#define KS_MM_INL static inline __attribute__((target(KS_MM_TGT), always_inline))

/* ------------------------------------------ AVX2 eight-row IQ4_XS tile --
 * IQ4_XS weights are signed levels (-127..113, ks_iq4_values) with a signed
 * 6-bit scale (ls - 32) per 32 weights and d per 256.  Unlike the K-quants'
 * 0..15 / 0..31, two maddubs outputs of these levels can reach
 * 2 * 2 * 127 * 127 > 32767, so they cannot be summed in int16 before the
 * scale's madd: without VNNI every layout pays a maddubs and a madd per 32
 * multiply-adds, and per vector a sign op (vpsignb: maddubs takes one
 * unsigned operand) and an int32 add.  What eight rows in the lanes still
 * save over the one-row kernel (ks_mm_iq4_xst_avx2): the activations enter
 * as broadcast dwords (loads, no ALU op), the weight unpack (nibbles, the
 * level lookup, |w|) has no cross-lane permutes and serves the tile's four
 * vectors, the scales of eight rows are decoded once in SIMD, and the
 * epilogue is one FMA per eight outputs with no horizontal sum.
 * Arithmetic per output (row r, vector c), whatever n, the tiling or the
 * thread: acc = 0; per super-block b: acc = fma((float)isum, d * da, acc),
 * isum = sum_s (ls_s - 32) (q_s . a_s) exact in int32.  The AVX2 one-row
 * kernel reduces its int32 lanes per super-block and takes the same FMA, so
 * decode, batches and prefill give the same bits (tests/test_matmul.c
 * emulates it in scalar C, test_matmul_avx2_iq4_xs8). */
KS_MM_INL void KS_MM_SFX(ks_mm_iq4_xs8_body)(const uint8_t *w, size_t wrow, const uint8_t *xq, size_t xs,
                                             int64_t cols, float *y, int64_t ys, const int NC) {
    const int64_t nb = cols / KS_QK_K;
    const size_t bb = sizeof(ks_block_iq4_xs), qs_off = offsetof(ks_block_iq4_xs, qs);
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)ks_iq4_values));
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc[KS_MM_T8_NC];
    _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *wb = w + (size_t)b * bb;
        /* header of the 8 rows: H[0] lane r = d | scales_h << 16, H[1] = scales_l[0..3] */
        __m256i H[4];
        KS_MM_SFX(ks_mm_t8_transpose)(wb, wrow, 0, H);
        /* d of rows 0..7 as f32 (bytes 0, 1 of each dword to the low 128 bits) */
        const __m256i dsel = _mm256_broadcastsi128_si256(_mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1));
        const __m256 d8 = _mm256_cvtph_ps(_mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_shuffle_epi8(H[0], dsel), 0x08)));
        __m256i isum[KS_MM_T8_NC];
        _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) isum[c] = _mm256_setzero_si256();
        for (int s = 0; s < 8; s++) {
            /* ls_s = nibble s of scales_l | bits 2s, 2s + 1 of scales_h << 4, as (ls - 32, ls - 32) int16 in each lane */
            const __m256i ls = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(H[1], 4 * s), _mm256_set1_epi32(0x0F)),
                                               _mm256_and_si256(_mm256_srli_epi32(H[0], 12 + 2 * s), _mm256_set1_epi32(0x30)));
            const __m256i scv = _mm256_sub_epi16(_mm256_or_si256(ls, _mm256_slli_epi32(ls, 16)), _mm256_set1_epi16(32));
            /* qs bytes 16s .. 16s + 15: low nibbles elements 32s + 0..15, high nibbles 32s + 16..31 */
            __m256i V[4];
            KS_MM_SFX(ks_mm_t8_transpose)(wb, wrow, qs_off + 16 * (size_t)s, V);
            _Pragma("GCC unroll 2") for (int hi = 0; hi < 2; hi++)
                _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
                    const __m256i nib = hi ? _mm256_and_si256(_mm256_srli_epi16(V[k], 4), m4) : _mm256_and_si256(V[k], m4);
                    const __m256i wv = _mm256_shuffle_epi8(lut, nib), wa = _mm256_sign_epi8(wv, wv);
                    _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) {
                        const int32_t *a = (const int32_t *)(((const ks_block_q8_k *)(xq + c * xs))[b].qs + 32 * s + 16 * hi + 4 * k);
                        const __m256i p = _mm256_maddubs_epi16(wa, _mm256_sign_epi8(_mm256_set1_epi32(*a), wv));
                        isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(p, scv));
                    }
                }
        }
        _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) {
            const ks_block_q8_k *a = ((const ks_block_q8_k *)(xq + c * xs)) + b;
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[c]), _mm256_mul_ps(d8, _mm256_set1_ps(a->d)), acc[c]);
        }
    }
    _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) _mm256_storeu_ps(y + c * ys, acc[c]);
}

/* Rows w .. w + 7 * wrow times nc (1..KS_MM_T8_NC) vectors: y[c * ys + r], r < 8. */
KS_MM_FN void KS_MM_SFX(ks_mm_iq4_xs8)(const uint8_t *w, size_t wrow, const uint8_t *xq, size_t xs, int nc, int64_t cols,
                                       float *y, int64_t ys) {
    KS_MM_T8_SWITCH(KS_MM_SFX(ks_mm_iq4_xs8_body), w, wrow, xq, xs, cols, y, ys)
}

#undef KS_MM_FN
#undef KS_MM_INL
#endif /* KS_MM_LEVEL < 2 */
#endif /* KS_MM_TEMPLATE_PASS */
