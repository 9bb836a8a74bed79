/*
 * matmul_x86_kquant.c — the one-row Q4_K and Q6_K kernels of the x86
 * template: at AVX-512 their zmm forms (a super-block as four zmm, the
 * sub-block scales applied per lane by dpwssd), at AVX2 their ymm forms
 * (the 12 scale bytes unpacked as words, one shuffle per sub-block scale)
 * with the many-row form decode uses.
 *
 * Why apart from matmul_x86.c: that file is the template's primitives and
 * the 32-element block types (float, Q8_0, Q4_0, the AVX-512 grouped
 * partner); the K-quants' 256-element super-blocks are another problem
 * (packed 6-bit scales and mins, a partner with block sums) with their own
 * reasons, written out below, for how each level's kernel is shaped.  The
 * kernels use the template's primitives and pass macros (KS_MM_SFX,
 * KS_MM_FN, KS_MM_LEVEL), so this is a part of each pass: matmul_x86.c
 * includes it at its end with KS_MM_KQUANT_PART defined; compiled on its
 * own it is empty.  The kernels of matmul_x86_types.c reuse pieces of it:
 * Q5_K's zmm form is the Q4_K zmm body here, and the AVX2 Q5_K and IQ4_XS
 * kernels take its scale unpacking, prefetch and float step.
 */
#ifndef KS_MM_KQUANT_PART
typedef int ks_matmul_x86_kquant_is_included_by_matmul_x86_c; /* standalone: nothing to compile */
#else


/* ------------------------------------------- Q4_K / Q6_K, AVX-512 zmm form --
 * Why a second pair of kernels at this level.  The ymm kernels below were
 * bound not by multiplies but by per-super-block bookkeeping at n = 1: the
 * 6-bit Q4_K scales unpacked in scalar code, one GPR->vector broadcast per
 * sub-block scale, a scale shuffle per 32 bytes for Q6_K, and a float
 * epilogue on ymm.  Here a super-block is four zmm of weights (64 weights
 * each) against four plain zmm loads of the ordinary Q8_K partner, and each
 * int32 lane of a dpbusd holds four products of ONE sub-block, so the
 * sub-block scale is applied per lane by one dpwssd whose int32 scale lanes
 * are (scale, 0) int16 pairs: the dpbusd result fits int16 (|p| <= 4 * 63 *
 * 127 < 32768) and its sign-extension half meets the zero.  Per vector and
 * super-block that is 4 dpbusd + 4 dpwssd + a short float epilogue; the
 * weight side (nibble split, scale vectors) is built once for all nc.
 *
 * Q4_K: byte i of qs[32j..] holds element i of sub-block 2j (low nibble)
 * and 2j+1 (high), so the nibble planes of one 64-byte load are
 * [sb0 | sb2] and [sb1 | sb3]; one vshufi64x2 each puts them in element
 * order ([sb0 | sb1], [sb2 | sb3]) to match the activations.  The per-lane
 * scale vectors come from the zero-extended scales by one vpermd each.  Nibbles are
 * u8 in [0, 15] as dpbusd wants, no sign trick.  The 12 scale bytes are
 * unpacked with two pshufb, shifts and masks into [sc0..7 | m0..7]; the mins
 * meet the Q8_K bsums in one madd, scaled in f32 by dmin * da.
 *
 * Q6_K: ql[0..63] & 15 is elements 0-63 in order and ql >> 4 elements
 * 64-127, the two high bits coming from qh[0..31] at a per-half shift; q is
 * used unsigned (0..63) and the -32 offset is folded into the int32 chain as
 * -32 * sum_s sc_s * bsum_s (one madd, the chain's starting value).
 *
 * Q5_K (Q5 set; ks_mm_q5_kz, matmul_x86_types.c) is the Q4_K kernel plus the
 * fifth bit plane: zmm k (chunk k, sub-blocks 2k and 2k + 1) takes bit 2k of
 * qh[l] in its low half and bit 2k + 1 in its high half, brought to bit 4 by
 * a per-half variable shift of qh broadcast to both halves.  q5 <= 31, so
 * four products per int32 lane stay within int16 (4 * 31 * 127) for the
 * vpdpwssd scaling.  The header (d, dmin, the 12 scale bytes) is Q4_K's. */
#if KS_MM_LEVEL >= 2

KS_MM_INL void KS_MM_SFX(ks_mm_q4_kz_body)(const bool Q5, const uint8_t *w, const uint8_t *xq, size_t xs,
                                           int64_t cols, float *y, int64_t ys, const int NC) {
    const int64_t nb = cols / KS_QK_K;
    const size_t bb = Q5 ? sizeof(ks_block_q5_k) : sizeof(ks_block_q4_k);
    const size_t qs_off = Q5 ? offsetof(ks_block_q5_k, qs) : offsetof(ks_block_q4_k, qs);
    const __m512i m4 = _mm512_set1_epi8(0x0F), one = _mm512_set1_epi8(1);
    /* scales[i] sits at byte 4 + i of the block's first 16 bytes */
    const __m128i i1 = _mm_setr_epi8(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m128i i2 = _mm_setr_epi8(-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11);
    const __m128i mlo = _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15);
    /* lane l of weight zmm k belongs to sub-block 2k + l / 8 */
    const __m512i s0i = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    /* Q5_K: the shift that brings bit 2k (low half) / 2k + 1 (high half) of qh to bit 0 */
    __m512i cnt[4];
    _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) cnt[k] =
        _mm512_inserti64x4(_mm512_set1_epi16((short)(2 * k)), _mm256_set1_epi16((short)(2 * k + 1)), 1);
    __m512 accd[4];
    __m256 accm[4];
    _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) {
        accd[c] = _mm512_setzero_ps();
        accm[c] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + (size_t)b * bb;
        const __m128i hd = _mm_loadu_si128((const __m128i *)blk); /* d, dmin, scales */
        const __m128i t1 = _mm_shuffle_epi8(hd, i1), t2 = _mm_shuffle_epi8(hd, i2);
        const __m128i u = _mm_mask_blend_epi8(0xF000, t1, _mm_srli_epi16(t1, 4));
        const __m128i scm = _mm_or_si128(_mm_and_si128(u, mlo),
                                         _mm_and_si128(_mm_srli_epi16(t2, 2), _mm_set1_epi8(0x30)));
        const __m512i sc32 = _mm512_cvtepu8_epi32(scm); /* [sc0..7, m0..7] */
        __m512i S[4];
        _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) S[k] = _mm512_permutexvar_epi32(
            _mm512_add_epi32(s0i, _mm512_set1_epi32(2 * k)), sc32);
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(scm, scm)); /* m0 m0 m1 m1 .. */
        const __m128 dd = _mm_cvtph_ps(hd);
        const __m512 dv = _mm512_broadcastss_ps(dd);
        const __m256 mv = _mm256_broadcastss_ps(_mm_movehdup_ps(dd));
        __m512i W[4];
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
            const __m512i z = _mm512_loadu_si512((const void *)(blk + qs_off + 64 * h));
            const __m512i lo = _mm512_and_si512(z, m4), hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), m4);
            W[2 * h] = _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(1, 0, 1, 0));
            W[2 * h + 1] = _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(3, 2, 3, 2));
        }
        if (Q5) {
            const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + offsetof(ks_block_q5_k, qh))));
            _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) W[k] = _mm512_or_si512(
                W[k], _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, cnt[k]), one), 4));
        }
        _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) {
            const ks_block_q8_k *a = ((const ks_block_q8_k *)(xq + c * xs)) + b;
            __m512i isum = _mm512_setzero_si512();
            _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
                const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), W[k],
                                                      _mm512_loadu_si512((const void *)(a->qs + 64 * k)));
                isum = _mm512_dpwssd_epi32(isum, p, S[k]);
            }
            const __m256i msum = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)a->bsums), mins);
            const __m512 da = _mm512_set1_ps(a->d);
            accd[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dv, da), accd[c]);
            accm[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_mul_ps(mv, _mm512_castps512_ps256(da)),
                                      accm[c]);
        }
    }
    _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) y[c * ys] =
        _mm512_reduce_add_ps(accd[c]) - KS_MM_SFX(ks_mm_hsum8)(accm[c]);
}

KS_MM_FN void KS_MM_SFX(ks_mm_q4_kz)(const uint8_t *w, const uint8_t *xq, size_t xs, int nc,
                                     int64_t cols, float *y, int64_t ys) {
    KS_MM_NC_SWITCH(KS_MM_SFX(ks_mm_q4_kz_body), false, w, xq, xs, cols, y, ys)
}

KS_MM_INL void KS_MM_SFX(ks_mm_q6_kz_body)(const uint8_t *w, const uint8_t *xq, size_t xs,
                                           int64_t cols, float *y, int64_t ys, const int NC) {
    const ks_block_q6_k *wb = (const ks_block_q6_k *)w;
    const int64_t nb = cols / KS_QK_K;
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    /* per-half shifts that bring the 2 high bits of an element to bits 4-5 */
    const __m512i shl = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i shr = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    /* lane l of weight zmm k belongs to 16-element sub-block 4k + l / 4 */
    const __m512i s0i = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    __m512 acc[4];
    _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)wb[b].scales));
        const __m512i sc32 = _mm512_cvtepu16_epi32(sc16); /* (scale, 0) int16 pairs */
        const __m256i neg = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc16, 5));
        __m512i S[4];
        _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) S[k] = _mm512_permutexvar_epi32(
            _mm512_add_epi32(s0i, _mm512_set1_epi32(4 * k)), sc32);
        const __m512 dv = _mm512_set1_ps(KS_MM_SFX(ks_mm_h2f)(wb[b].d));
        __m512i W[4];
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
            const __m512i ql = _mm512_loadu_si512((const void *)(wb[b].ql + 64 * h));
            const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(wb[b].qh + 32 * h)));
            W[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_and_si512(_mm512_sllv_epi16(qh, shl), m30));
            W[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                           _mm512_and_si512(_mm512_srlv_epi16(qh, shr), m30));
        }
        _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) {
            const ks_block_q8_k *a = ((const ks_block_q8_k *)(xq + c * xs)) + b;
            __m512i isum = _mm512_zextsi256_si512(
                _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)a->bsums), neg));
            _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
                const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), W[k],
                                                      _mm512_loadu_si512((const void *)(a->qs + 64 * k)));
                isum = _mm512_dpwssd_epi32(isum, p, S[k]);
            }
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dv, _mm512_set1_ps(a->d)), acc[c]);
        }
    }
    _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) y[c * ys] = _mm512_reduce_add_ps(acc[c]);
}

KS_MM_FN void KS_MM_SFX(ks_mm_q6_kz)(const uint8_t *w, const uint8_t *xq, size_t xs, int nc,
                                     int64_t cols, float *y, int64_t ys) {
    KS_MM_NC_SWITCH(KS_MM_SFX(ks_mm_q6_kz_body), w, xq, xs, cols, y, ys)
}

#endif /* KS_MM_LEVEL >= 2 */

#if KS_MM_LEVEL < 2
/* ------------------------------------------------------------ Q4_K -------
 * AVX2 only (AVX-512 uses the zmm forms above).  Per super-block:
 * sum_j sc_j * (q_j . a_j) in int32 (maddubs to int16, then
 * times the 6-bit scale), minus sum_j m_j * (bsum pair of a), both scaled once
 * in f32 by d*da and dmin*da.
 *
 * Why the scale handling looks like this.  At n = 1 these kernels are bound
 * by instructions per super-block, not by DRAM (docs/results/quant-types.md),
 * and a per-byte scalar unpack of the 12 scale bytes plus one GPR->ymm
 * broadcast per sub-block scale cost about as much as the dot products
 * (perf: the out-of-line unpack alone was 13% of decode).  So the 12 bytes
 * are unpacked as 32-bit words, all four bytes of a word at once, in one
 * xmm (ks_mm_q4k_scales_v: 8 vector ops), widened once to int16 in both
 * 128-bit lanes, and each sub-block's scale is one in-lane byte shuffle of
 * that register with a constant control.  d and dmin are converted by one
 * vcvtph2ps.  With the many-row form (matmul.c) this took the kernel from
 * 260 to 84 instructions per super-block at n = 1, same int32 sums
 * (tools/insn_callgrind.sh, docs/results/quant-types.md). */

/* The 12 scale bytes of a Q4_K / Q5_K super-block (ks_mm_q4k_scales's
 * layout), read as the block's first 16 bytes (d, dmin, then the scales, in
 * both block types) -> bytes [sc0..sc7 | m0..m7] of one xmm.  With u0, u1,
 * u2 the scale words: scales 0-3 = u0 & 0x3f, mins 0-3 = u1 & 0x3f, scales
 * 4-7 = (u2 & 0xf) | (u0 >> 6) << 4, mins 4-7 = (u2 >> 4) | (u1 >> 6) << 4,
 * bytewise; two shuffles place [u0 u2 u1 u2] and [0 u0 0 u1], and a
 * per-word shift, masks and an or finish all four words at once. */
KS_MM_INL __m128i KS_MM_SFX(ks_mm_q4k_scales_v)(const void *blk) {
    const __m128i x = _mm_loadu_si128((const __m128i *)blk);
    const __m128i a = _mm_shuffle_epi8(x, _mm_setr_epi8(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15));
    const __m128i hb = _mm_shuffle_epi8(x, _mm_setr_epi8(-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11));
    const __m128i lo = _mm_and_si128(_mm_srlv_epi32(a, _mm_setr_epi32(0, 0, 0, 4)),
                                     _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
    /* (u >> 6) << 4 per byte: bits 6-7 to 4-5 (bits from the next byte masked off) */
    return _mm_or_si128(lo, _mm_and_si128(_mm_srli_epi32(hb, 2), _mm_set1_epi8(0x30)));
}

/* Shuffle control broadcasting int16 word k of each 128-bit lane. */
#define KS_MM_W16(k) _mm256_set1_epi16((short)(0x0100 + 0x0202 * (k)))

/* Software prefetch distance of the K-quant row kernels, in bytes ahead of
 * the super-block being read: like KS_MM_Q32_PF_BLOCKS, about one 4 KiB
 * page, so the prefetch runs into the next rows of the thread's range which
 * the hardware prefetcher (stopping at page ends) would find late. */
#ifndef KS_MM_QK_PF_BYTES
#define KS_MM_QK_PF_BYTES 4096
#endif
/* every 64-byte line of a super-block of SZ bytes, PF bytes ahead (addresses
 * formed as integers: past the array's end they are harmless) */
#if KS_MM_QK_PF_BYTES > 0
#define KS_MM_QK_PREFETCH(p, SZ)                                                                   \
    do {                                                                                           \
        _Pragma("GCC unroll 8") for (size_t o_ = 0; o_ < (SZ); o_ += 64)                           \
            _mm_prefetch((const char *)((uintptr_t)(p) + KS_MM_QK_PF_BYTES + o_), _MM_HINT_T0);    \
    } while (0)
#else
#define KS_MM_QK_PREFETCH(p, SZ) ((void)0)
#endif

/* The per-output float order of the AVX2 eight-row prefill tiles
 * (matmul_x86_panel.c), which the row kernels below follow too: per
 * super-block the exact int32 totals, then acc = fma(T, d * da, acc) and
 * acc = fma(-M, dmin * da, acc) in that order.  An output's bits then do not
 * depend on how many vectors share the product (one decode step, a batch of
 * sequences, a prefill chunk, an expert's gathered rows), so a batch or a
 * prefix-cache hit answers exactly what the lone request would.  The lanes
 * are summed in int32 (exact: the same integers in any order), two vectors
 * at once: [sum a, sum b, sum a, sum b]. */
KS_MM_INL __m128i KS_MM_SFX(ks_mm_hsum2_i32)(__m256i a, __m256i b) {
    __m256i x = _mm256_hadd_epi32(a, b);
    x = _mm256_hadd_epi32(x, x);
    return _mm_add_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
}

/* acc = fma(T, s0, acc) then acc = fma(-M, s1, acc), lane 0, from t = [T, M, ..]
 * and s = [s0, s1, ..] (the tiles' epilogue for one output) */
KS_MM_INL __m128 KS_MM_SFX(ks_mm_kq_step)(__m128 acc, __m128i t, __m128 s) {
    const __m128 f = _mm_cvtepi32_ps(t);
    acc = _mm_fmadd_ss(f, s, acc);
    return _mm_fnmadd_ss(_mm_movehdup_ps(f), _mm_movehdup_ps(s), acc);
}

KS_MM_INL void KS_MM_SFX(ks_mm_q4_k_body)(const uint8_t *w, const uint8_t *xq, size_t xs,
                                          int64_t cols, float *y, int64_t ys, const int NC) {
    const ks_block_q4_k *wb = (const ks_block_q4_k *)w;
    const int64_t nb = cols / KS_QK_K;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m128 acc[4]; /* lane 0: the output (ks_mm_hsum2_i32's order) */
    _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) acc[c] = _mm_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        KS_MM_QK_PREFETCH(wb + b, sizeof(ks_block_q4_k) + 48);
        const __m128i scm = KS_MM_SFX(ks_mm_q4k_scales_v)(wb + b);
        /* [sc0..sc7] as int16 in both lanes; [m0 m0 m1 m1 ... m7 m7] as
         * int16, to pair with the 16 bsums */
        const __m256i scales = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(scm));
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(scm, scm));
        /* d and dmin by one conversion: [d, dmin, 0, 0] */
        uint32_t ddm;
        memcpy(&ddm, &wb[b].d, 4);
        const __m128 dd = _mm_cvtph_ps(_mm_cvtsi32_si128((int)ddm));
        /* two int32 chains (lo / hi sub-blocks) for one vector, whose adds would
         * otherwise wait on each other; with 2-4 vectors the vectors' chains
         * already overlap, and one chain each leaves fewer of the 16 ymm
         * registers spilled (stack references in the AVX2 kernel: Q4_K 73 -> 33,
         * Q5_K 89 -> 44, Q6_K 102 -> 73; same int32 sums, so the same bits) */
        __m256i isum[4], isum2[4];
        _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) isum[c] = isum2[c] = _mm256_setzero_si256();
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(wb[b].qs + 32 * j));
            __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            __m256i slo = _mm256_shuffle_epi8(scales, KS_MM_W16(2 * j));
            __m256i shi = _mm256_shuffle_epi8(scales, KS_MM_W16(2 * j + 1));
            _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) {
                const int8_t *aq = ((const ks_block_q8_k *)(xq + c * xs))[b].qs + 64 * j;
                __m256i plo = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)aq));
                __m256i phi = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(aq + 32)));
                isum[c] = KS_MM_SFX(ks_mm_dot_i16)(isum[c], plo, slo);
                if (NC == 1) isum2[c] = KS_MM_SFX(ks_mm_dot_i16)(isum2[c], phi, shi);
                else isum[c] = KS_MM_SFX(ks_mm_dot_i16)(isum[c], phi, shi);
            }
        }
        _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) {
            const ks_block_q8_k *a = ((const ks_block_q8_k *)(xq + c * xs)) + b;
            __m256i msum = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)a->bsums), mins);
            __m256i tot = _mm256_add_epi32(isum[c], isum2[c]);
            const __m128 s = _mm_mul_ps(dd, _mm_set1_ps(a->d)); /* [d * da, dmin * da]: the scalar products */
            acc[c] = KS_MM_SFX(ks_mm_kq_step)(acc[c], KS_MM_SFX(ks_mm_hsum2_i32)(tot, msum), s);
        }
    }
    _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) y[c * ys] = _mm_cvtss_f32(acc[c]);
}

KS_MM_FN void KS_MM_SFX(ks_mm_q4_k)(const uint8_t *w, const uint8_t *xq, size_t xs, int nc,
                                    int64_t cols, float *y, int64_t ys) {
    KS_MM_NC_SWITCH(KS_MM_SFX(ks_mm_q4_k_body), w, xq, xs, cols, y, ys)
}

KS_MM_FN void KS_MM_SFX(ks_mm_q4_k_rows)(const uint8_t *w, size_t wrow, int64_t nr, const uint8_t *xq, size_t xs,
                                      int nc, int64_t cols, float *y, int64_t ys) {
    KS_MM_ROWS_SWITCH(KS_MM_SFX(ks_mm_q4_k_body))
}

/* ------------------------------------------------------------ Q6_K -------
 * q6 is used unsigned (0..63) in maddubs; the -32 offset is removed once per
 * super-block as 32 * sum_s sc_s * bsum_s. */

KS_MM_INL void KS_MM_SFX(ks_mm_q6_k_body)(const uint8_t *w, const uint8_t *xq, size_t xs,
                                          int64_t cols, float *y, int64_t ys, const int NC) {
    const ks_block_q6_k *wb = (const ks_block_q6_k *)w;
    const int64_t nb = cols / KS_QK_K;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    __m128 acc[4]; /* lane 0: the output, in the eight-row tile's order (ks_mm_hsum2_i32) */
    _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) acc[c] = _mm_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        KS_MM_QK_PREFETCH(wb + b, sizeof(ks_block_q6_k) + 46); /* 210 bytes: 4 lines */
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)wb[b].scales);
        const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
        /* scales 0-7 (half 0) and 8-15 (half 1) as int16 in both 128-bit
         * lanes: the scale pair of v[i] (sub-blocks s, s + 1 in the low and
         * high lane) is then one in-lane shuffle with a constant control */
        const __m256i sch[2] = {_mm256_permute2x128_si256(sc16, sc16, 0x00),
                                _mm256_permute2x128_si256(sc16, sc16, 0x11)};
        const float d = KS_MM_SFX(ks_mm_h2f)(wb[b].d);
        __m256i isum[4], isum2[4]; /* two chains (even / odd i) for one vector only, as in Q4_K */
        _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) isum[c] = isum2[c] = _mm256_setzero_si256();
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
            __m256i ql0 = _mm256_loadu_si256((const __m256i *)(wb[b].ql + 64 * h));
            __m256i ql1 = _mm256_loadu_si256((const __m256i *)(wb[b].ql + 64 * h + 32));
            __m256i qh = _mm256_loadu_si256((const __m256i *)(wb[b].qh + 32 * h));
            __m256i v[4];
            v[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
            v[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
            v[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, m30));
            v[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                                   _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
            _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
                /* v[i] covers sub-blocks 8h + 2i (low lane) and 8h + 2i + 1 (high lane) */
                __m256i scv = _mm256_shuffle_epi8(
                    sch[h], _mm256_setr_epi16(0x0100 + 0x0404 * i, 0x0100 + 0x0404 * i, 0x0100 + 0x0404 * i,
                                              0x0100 + 0x0404 * i, 0x0100 + 0x0404 * i, 0x0100 + 0x0404 * i,
                                              0x0100 + 0x0404 * i, 0x0100 + 0x0404 * i, 0x0302 + 0x0404 * i,
                                              0x0302 + 0x0404 * i, 0x0302 + 0x0404 * i, 0x0302 + 0x0404 * i,
                                              0x0302 + 0x0404 * i, 0x0302 + 0x0404 * i, 0x0302 + 0x0404 * i,
                                              0x0302 + 0x0404 * i));
                _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) {
                    const int8_t *aq = ((const ks_block_q8_k *)(xq + c * xs))[b].qs + 128 * h + 32 * i;
                    __m256i p = _mm256_maddubs_epi16(v[i], _mm256_loadu_si256((const __m256i *)aq));
                    if ((i & 1) && NC == 1) isum2[c] = KS_MM_SFX(ks_mm_dot_i16)(isum2[c], p, scv);
                    else isum[c] = KS_MM_SFX(ks_mm_dot_i16)(isum[c], p, scv);
                }
            }
        }
        _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) {
            const ks_block_q8_k *a = ((const ks_block_q8_k *)(xq + c * xs)) + b;
            __m256i corr = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)a->bsums), sc16);
            __m256i tot = _mm256_sub_epi32(_mm256_add_epi32(isum[c], isum2[c]), _mm256_slli_epi32(corr, 5));
            acc[c] = _mm_fmadd_ss(_mm_cvtepi32_ps(KS_MM_SFX(ks_mm_hsum2_i32)(tot, tot)), _mm_set_ss(d * a->d), acc[c]);
        }
    }
    _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) y[c * ys] = _mm_cvtss_f32(acc[c]);
}

KS_MM_FN void KS_MM_SFX(ks_mm_q6_k)(const uint8_t *w, const uint8_t *xq, size_t xs, int nc,
                                    int64_t cols, float *y, int64_t ys) {
    KS_MM_NC_SWITCH(KS_MM_SFX(ks_mm_q6_k_body), w, xq, xs, cols, y, ys)
}

KS_MM_FN void KS_MM_SFX(ks_mm_q6_k_rows)(const uint8_t *w, size_t wrow, int64_t nr, const uint8_t *xq, size_t xs,
                                      int nc, int64_t cols, float *y, int64_t ys) {
    KS_MM_ROWS_SWITCH(KS_MM_SFX(ks_mm_q6_k_body))
}
#endif /* KS_MM_LEVEL < 2 */

#endif /* KS_MM_KQUANT_PART */
