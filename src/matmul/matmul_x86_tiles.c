/*
 * matmul_x86_tiles.c — AVX2 eight-row prefill tiles for the types of
 * llama.cpp's mixes that matmul_x86_panel.c's K-quant tiles do not cover:
 * IQ4_XS (the main type of IQ4_XS files).
 *
 * Why a file of their own: matmul_x86_panel.c holds the Q4_K / Q5_K / Q6_K
 * tiles and is being reworked for a repacked Q4_K layout beside this; the
 * tiles here read the file's rows as they are (no repacking, no memory) and
 * share only its two helpers (ks_mm_t8_transpose, ks_mm_t8_pick).  It is a
 * template like matmul_x86.c: matmul.c includes it after matmul_x86_panel.c
 * in each level's pass; it has code at the AVX2 level (KS_MM_LEVEL 1) only,
 * and compiled on its own it is empty.
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
    switch (nc) {
#if KS_MM_T8_NC > 4
    case 8: KS_MM_SFX(ks_mm_iq4_xs8_body)(w, wrow, xq, xs, cols, y, ys, 8); break;
    case 7: KS_MM_SFX(ks_mm_iq4_xs8_body)(w, wrow, xq, xs, cols, y, ys, 7); break;
    case 6: KS_MM_SFX(ks_mm_iq4_xs8_body)(w, wrow, xq, xs, cols, y, ys, 6); break;
    case 5: KS_MM_SFX(ks_mm_iq4_xs8_body)(w, wrow, xq, xs, cols, y, ys, 5); break;
#endif
    case 4: KS_MM_SFX(ks_mm_iq4_xs8_body)(w, wrow, xq, xs, cols, y, ys, 4); break;
    case 3: KS_MM_SFX(ks_mm_iq4_xs8_body)(w, wrow, xq, xs, cols, y, ys, 3); break;
    case 2: KS_MM_SFX(ks_mm_iq4_xs8_body)(w, wrow, xq, xs, cols, y, ys, 2); break;
    default: KS_MM_SFX(ks_mm_iq4_xs8_body)(w, wrow, xq, xs, cols, y, ys, 1); break;
    }
}

/* -------------------------------------------- AVX2 eight-row Q5_K tile --
 * matmul_x86_panel.c's Q5_K tile (ks_mm_q5_k8: eight rows transposed in
 * registers, the fifth bit plane OR'ed into the nibbles, int16 sums of four
 * maddubs outputs before one madd with the rows' scales) taking up to
 * KS_MM_T8_NC vectors per call instead of 4: the weight unpack per 32 bytes
 * of eight rows (the transposes, nibble masks and the fifth bit: about 60
 * ops per super-block and 8 rows, against ~20 per vector for the products)
 * is then shared by twice the vectors.  The same per-output arithmetic as
 * that tile and the one-row kernel (acc = fma(isum, d * da, acc) then
 * acc = fma(-msum, dmin * da, acc) per super-block), so the same bits
 * (test_matmul_avx2_k8). */
KS_MM_INL void KS_MM_SFX(ks_mm_q5_k8w_body)(const uint8_t *w, size_t wrow, const uint8_t *xq, size_t xs,
                                           int64_t cols, float *y, int64_t ys, const int NC) {
    const bool Q5 = true;
    const int64_t nb = cols / KS_QK_K;
    const size_t bb = Q5 ? sizeof(ks_block_q5_k) : sizeof(ks_block_q4_k);
    const size_t qs_off = Q5 ? offsetof(ks_block_q5_k, qs) : offsetof(ks_block_q4_k, qs);
    const __m256i m4 = _mm256_set1_epi8(0x0F), km1 = _mm256_set1_epi32(0x3f3f3f3f), km2 = _mm256_set1_epi32(0x0f0f0f0f),
                  km3 = _mm256_set1_epi32(0x03030303);
    __m256 acc[KS_MM_T8_NC];
    _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *wb = w + (size_t)b * bb;
        /* header dwords of the 8 rows: H[0] = d | dmin << 16, H[1..3] = the 12 scale bytes */
        __m256i H[4];
        KS_MM_SFX(ks_mm_t8_transpose)(wb, wrow, 0, H);
        /* llama.cpp's k-quant scale unpacking (utmp, kmask1..3), on 8 rows at once */
        const __m256i u3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(H[3], 4), km2),
                                           _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(H[2], 6), km3), 4));
        const __m256i u1 = _mm256_or_si256(_mm256_and_si256(H[3], km2),
                                           _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(H[1], 6), km3), 4));
        const __m256i u2 = _mm256_and_si256(H[2], km1), u0 = _mm256_and_si256(H[1], km1);
        /* u0 / u1: sub-block scales 0-3 / 4-7 (byte s of each row's dword); u2 / u3: the mins */
        __m256i scv[8], mnv[4];
        _Pragma("GCC unroll 8") for (int s = 0; s < 8; s++) scv[s] =
            _mm256_shuffle_epi8(s < 4 ? u0 : u1, KS_MM_SFX(ks_mm_t8_pick)(s & 3, s & 3));
        _Pragma("GCC unroll 4") for (int t = 0; t < 4; t++) mnv[t] =
            _mm256_shuffle_epi8(t < 2 ? u2 : u3, KS_MM_SFX(ks_mm_t8_pick)(2 * (t & 1), 2 * (t & 1) + 1));
        /* d, dmin of rows 0..7 as f32 */
        const __m256i dsel = _mm256_broadcastsi128_si256(_mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15));
        const __m256i dd = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(H[0], dsel), 0xD8); /* d0..7 | dmin0..7 */
        const __m256 d8 = _mm256_cvtph_ps(_mm256_castsi256_si128(dd)), dm8 = _mm256_cvtph_ps(_mm256_extracti128_si256(dd, 1));
        __m256i isum[KS_MM_T8_NC];
        _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) isum[c] = _mm256_setzero_si256();
        /* Q5_K: qh transposed once per super-block (qh byte l holds bit s = the fifth bit of element 32s + l) */
        __m256i QH[2][4];
        if (Q5) {
            KS_MM_SFX(ks_mm_t8_transpose)(wb, wrow, offsetof(ks_block_q5_k, qh), QH[0]);
            KS_MM_SFX(ks_mm_t8_transpose)(wb, wrow, offsetof(ks_block_q5_k, qh) + 16, QH[1]);
        }
        for (int j = 0; j < 4; j++) { /* qs bytes 32j..32j+31: sub-blocks 2j (low nibbles), 2j + 1 (high) */
            _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
                __m256i V[4];
                KS_MM_SFX(ks_mm_t8_transpose)(wb, wrow, qs_off + 32 * (size_t)j + 16 * (size_t)h, V);
                _Pragma("GCC unroll 2") for (int nib = 0; nib < 2; nib++) {
                    __m256i W[4];
                    _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) W[k] =
                        nib ? _mm256_and_si256(_mm256_srli_epi16(V[k], 4), m4) : _mm256_and_si256(V[k], m4);
                    if (Q5) { /* bit s = 2j + nib of each qh byte to 0x10 (16-bit shifts: no bit read crosses a byte) */
                        const int sb = 2 * j + nib;
                        _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
                            const __m256i hb = sb <= 4 ? _mm256_slli_epi16(QH[h][k], 4 - sb) : _mm256_srli_epi16(QH[h][k], sb - 4);
                            W[k] = _mm256_or_si256(W[k], _mm256_and_si256(hb, _mm256_set1_epi8(0x10)));
                        }
                    }
                    const __m256i sc = nib ? scv[2 * j + 1] : scv[2 * j];
                    _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) {
                        const int32_t *a = (const int32_t *)(((const ks_block_q8_k *)(xq + c * xs))[b].qs + 64 * j + 32 * nib + 16 * h);
                        __m256i p = _mm256_maddubs_epi16(W[0], _mm256_set1_epi32(a[0]));
                        _Pragma("GCC unroll 3") for (int k = 1; k < 4; k++) p =
                            _mm256_add_epi16(p, _mm256_maddubs_epi16(W[k], _mm256_set1_epi32(a[k])));
                        isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(p, sc));
                    }
                }
            }
        }
        _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) {
            const ks_block_q8_k *a = ((const ks_block_q8_k *)(xq + c * xs)) + b;
            int32_t hb[8]; /* dword t: (bsum 2t, bsum 2t + 1), bsum s = the sum of sub-block s's 32 activations */
            _mm256_storeu_si256((__m256i *)hb, _mm256_hadd_epi16(_mm256_loadu_si256((const __m256i *)a->bsums),
                                                                 _mm256_loadu_si256((const __m256i *)a->bsums)));
            __m256i msum = _mm256_madd_epi16(mnv[0], _mm256_set1_epi32(hb[0]));
            msum = _mm256_add_epi32(msum, _mm256_madd_epi16(mnv[1], _mm256_set1_epi32(hb[1])));
            msum = _mm256_add_epi32(msum, _mm256_madd_epi16(mnv[2], _mm256_set1_epi32(hb[4])));
            msum = _mm256_add_epi32(msum, _mm256_madd_epi16(mnv[3], _mm256_set1_epi32(hb[5])));
            const __m256 da = _mm256_set1_ps(a->d);
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[c]), _mm256_mul_ps(d8, da), acc[c]);
            acc[c] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_mul_ps(dm8, da), acc[c]);
        }
    }
    _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) _mm256_storeu_ps(y + c * ys, acc[c]);
}

/* Rows w .. w + 7 * wrow times nc (1..KS_MM_T8_NC) vectors: y[c * ys + r], r < 8. */
KS_MM_FN void KS_MM_SFX(ks_mm_q5_k8w)(const uint8_t *w, size_t wrow, const uint8_t *xq, size_t xs, int nc, int64_t cols,
                                      float *y, int64_t ys) {
    switch (nc) {
#if KS_MM_T8_NC > 4
    case 8: KS_MM_SFX(ks_mm_q5_k8w_body)(w, wrow, xq, xs, cols, y, ys, 8); break;
    case 7: KS_MM_SFX(ks_mm_q5_k8w_body)(w, wrow, xq, xs, cols, y, ys, 7); break;
    case 6: KS_MM_SFX(ks_mm_q5_k8w_body)(w, wrow, xq, xs, cols, y, ys, 6); break;
    case 5: KS_MM_SFX(ks_mm_q5_k8w_body)(w, wrow, xq, xs, cols, y, ys, 5); break;
#endif
    case 4: KS_MM_SFX(ks_mm_q5_k8w_body)(w, wrow, xq, xs, cols, y, ys, 4); break;
    case 3: KS_MM_SFX(ks_mm_q5_k8w_body)(w, wrow, xq, xs, cols, y, ys, 3); break;
    case 2: KS_MM_SFX(ks_mm_q5_k8w_body)(w, wrow, xq, xs, cols, y, ys, 2); break;
    default: KS_MM_SFX(ks_mm_q5_k8w_body)(w, wrow, xq, xs, cols, y, ys, 1); break;
    }
}

/* -------------------------------------------- AVX2 eight-row Q6_K tile --
 * matmul_x86_panel.c's Q6_K tile (ks_mm_q6_k8) taking up to KS_MM_T8_NC
 * vectors per call, as the Q5_K copy above: its per-super-block unpack (16
 * scales of 8 rows, the ql / qh transposes and the 2-bit planes) shared by
 * twice the vectors.  The same per-output arithmetic, so the same bits
 * (test_matmul_avx2_q6_k8). */
KS_MM_INL void KS_MM_SFX(ks_mm_q6_k8w_body)(const uint8_t *w, size_t wrow, const uint8_t *xq, size_t xs, int64_t cols,
                                           float *y, int64_t ys, const int NC) {
    const int64_t nb = cols / KS_QK_K;
    const size_t bb = sizeof(ks_block_q6_k);
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    __m256 acc[KS_MM_T8_NC];
    _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *wb = w + (size_t)b * bb;
        /* the 16 int8 scales of 8 rows: S[k] lane r = scales 4k..4k+3 of row r */
        __m256i S[4];
        KS_MM_SFX(ks_mm_t8_transpose)(wb, wrow, offsetof(ks_block_q6_k, scales), S);
        __m256i scv[16], scp[8]; /* (sc_s, sc_s) and (sc_2t, sc_2t+1) per row, int16 sign-extended */
        _Pragma("GCC unroll 16") for (int sb = 0; sb < 16; sb++) scv[sb] =
            _mm256_shuffle_epi8(S[sb >> 2], KS_MM_SFX(ks_mm_t8_pick)(sb & 3, sb & 3));
        _Pragma("GCC unroll 8") for (int t = 0; t < 8; t++) scp[t] =
            _mm256_shuffle_epi8(S[t >> 1], KS_MM_SFX(ks_mm_t8_pick)(2 * (t & 1), 2 * (t & 1) + 1));
        /* pick() zero-extends: sign-extend the int8 in each int16 */
        _Pragma("GCC unroll 16") for (int sb = 0; sb < 16; sb++) scv[sb] = _mm256_srai_epi16(_mm256_slli_epi16(scv[sb], 8), 8);
        _Pragma("GCC unroll 8") for (int t = 0; t < 8; t++) scp[t] = _mm256_srai_epi16(_mm256_slli_epi16(scp[t], 8), 8);
        ks_f16 dh[8];
        for (int r = 0; r < 8; r++) memcpy(&dh[r], wb + (size_t)r * wrow + offsetof(ks_block_q6_k, d), sizeof(ks_f16));
        const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dh));
        __m256i isum[KS_MM_T8_NC];
        _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) isum[c] = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) /* elements 128h .. 128h + 127 */
            _Pragma("GCC unroll 2") for (int hh = 0; hh < 2; hh++) { /* l = 16hh .. 16hh + 15 of each 32-run */
                __m256i QH[4];
                KS_MM_SFX(ks_mm_t8_transpose)(wb, wrow, offsetof(ks_block_q6_k, qh) + 32 * (size_t)h + 16 * (size_t)hh, QH);
                _Pragma("GCC unroll 2") for (int odd = 0; odd < 2; odd++) { /* ql bytes 64h + 32 odd + 16hh + .. */
                    __m256i V[4];
                    KS_MM_SFX(ks_mm_t8_transpose)(wb, wrow, offsetof(ks_block_q6_k, ql) + 64 * (size_t)h + 32 * (size_t)odd + 16 * (size_t)hh, V);
                    _Pragma("GCC unroll 2") for (int up = 0; up < 2; up++) { /* low / high nibbles */
                        const int i = odd + 2 * up; /* the 32-run: elements 128h + 32i + l */
                        const int sb = 8 * h + 2 * i + hh;
                        __m256i W[4];
                        _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
                            const __m256i lo = up ? _mm256_and_si256(_mm256_srli_epi16(V[k], 4), m4) : _mm256_and_si256(V[k], m4);
                            const __m256i hb = i == 0 ? _mm256_slli_epi16(QH[k], 4)
                                               : i == 1 ? _mm256_slli_epi16(QH[k], 2)
                                               : i == 2 ? QH[k]
                                                        : _mm256_srli_epi16(QH[k], 2);
                            W[k] = _mm256_or_si256(lo, _mm256_and_si256(hb, m30));
                        }
                        _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) {
                            const int32_t *a = (const int32_t *)(((const ks_block_q8_k *)(xq + c * xs))[b].qs + 128 * h + 32 * i + 16 * hh);
                            const __m256i p0 = _mm256_add_epi16(_mm256_maddubs_epi16(W[0], _mm256_set1_epi32(a[0])),
                                                                _mm256_maddubs_epi16(W[1], _mm256_set1_epi32(a[1])));
                            const __m256i p1 = _mm256_add_epi16(_mm256_maddubs_epi16(W[2], _mm256_set1_epi32(a[2])),
                                                                _mm256_maddubs_epi16(W[3], _mm256_set1_epi32(a[3])));
                            isum[c] = _mm256_add_epi32(isum[c], _mm256_add_epi32(_mm256_madd_epi16(p0, scv[sb]),
                                                                                 _mm256_madd_epi16(p1, scv[sb])));
                        }
                    }
                }
            }
        _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) {
            const ks_block_q8_k *a = ((const ks_block_q8_k *)(xq + c * xs)) + b;
            const int32_t *bs = (const int32_t *)a->bsums; /* dword t: (bsum 2t, bsum 2t + 1), 16 activations each */
            __m256i corr = _mm256_madd_epi16(scp[0], _mm256_set1_epi32(bs[0]));
            _Pragma("GCC unroll 7") for (int t = 1; t < 8; t++) corr = _mm256_add_epi32(corr, _mm256_madd_epi16(scp[t], _mm256_set1_epi32(bs[t])));
            const __m256i tot = _mm256_sub_epi32(isum[c], _mm256_slli_epi32(corr, 5));
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(tot), _mm256_mul_ps(d8, _mm256_set1_ps(a->d)), acc[c]);
        }
    }
    _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) _mm256_storeu_ps(y + c * ys, acc[c]);
}

/* Rows w .. w + 7 * wrow times nc (1..KS_MM_T8_NC) vectors: y[c * ys + r], r < 8. */
KS_MM_FN void KS_MM_SFX(ks_mm_q6_k8w)(const uint8_t *w, size_t wrow, const uint8_t *xq, size_t xs, int nc, int64_t cols,
                                      float *y, int64_t ys) {
    switch (nc) {
#if KS_MM_T8_NC > 4
    case 8: KS_MM_SFX(ks_mm_q6_k8w_body)(w, wrow, xq, xs, cols, y, ys, 8); break;
    case 7: KS_MM_SFX(ks_mm_q6_k8w_body)(w, wrow, xq, xs, cols, y, ys, 7); break;
    case 6: KS_MM_SFX(ks_mm_q6_k8w_body)(w, wrow, xq, xs, cols, y, ys, 6); break;
    case 5: KS_MM_SFX(ks_mm_q6_k8w_body)(w, wrow, xq, xs, cols, y, ys, 5); break;
#endif
    case 4: KS_MM_SFX(ks_mm_q6_k8w_body)(w, wrow, xq, xs, cols, y, ys, 4); break;
    case 3: KS_MM_SFX(ks_mm_q6_k8w_body)(w, wrow, xq, xs, cols, y, ys, 3); break;
    case 2: KS_MM_SFX(ks_mm_q6_k8w_body)(w, wrow, xq, xs, cols, y, ys, 2); break;
    default: KS_MM_SFX(ks_mm_q6_k8w_body)(w, wrow, xq, xs, cols, y, ys, 1); break;
    }
}

#undef KS_MM_FN
#undef KS_MM_INL
#endif /* KS_MM_LEVEL < 2 */
#endif /* KS_MM_TEMPLATE_PASS */
