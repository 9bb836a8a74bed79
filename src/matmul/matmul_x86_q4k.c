/*
 * matmul_x86_q4k.c — the K-quant products over weights repacked at load into
 * eight-row interleaved super-blocks (made by ks_matmul_pack,
 * matmul_packed.c; the layouts byte by byte: matmul_packed_x8q.c), one
 * kernel per layout for decode and prefill:
 *   - AVX2: Q4_K in four-byte lanes (KS_WEIGHT_Q4_K_X8), maddubs / madd;
 *   - AVX-512 VNNI: Q4_K, Q5_K, Q6_K and IQ4_XS in eight-byte lanes
 *     (KS_WEIGHT_Q4_K_X8Q, _Q5_K_X8Q, _Q6_K_X8Q, _IQ4_XS_X8Q), vpdpbusd /
 *     vpdpwssd (second half of the file).
 *
 * Why a repacked layout.  On AVX2 without VNNI an int8 product is maddubs
 * (u8 x s8 pairs to int16) then madd (to int32), and the Q4_K eight-row
 * prefill tile over the file's rows (matmul_x86_panel.c) spends most of its
 * shuffle-pipe slots transposing eight rows into the lanes of a ymm (llvm-mca,
 * Zen 3: about 54 cycles per 2048 multiply-adds against 40 for the multiply
 * pipes), while the one-row decode kernel (matmul_x86_kquant.c) pays a madd per 32
 * weights and an integer horizontal sum per super-block and vector.  Stored
 * already transposed, a 32-byte load IS the register the tile wants (lane r
 * = four bytes of row r), so neither the transposes nor the horizontal sums
 * remain, and one broadcast activation dword serves eight rows in decode as
 * in prefill.  The idea of interleaving rows at load for AVX2 is llama.cpp's
 * (block_q4_Kx8, ggml-cpu/repack.cpp); the layout and the arithmetic here
 * are this engine's own (its per-output float order below).  At AVX-512 the
 * one-row zmm kernels over the file's rows (matmul_x86_kquant.c) ran the 1B Q4_K_M
 * model's prefill GEMM at 14% of the int8 peak: one row per call, so every
 * activation load and every weight unpack served one row; the groups there
 * serve eight rows per activation broadcast and up to KS_MM_X8Q_NC vectors
 * per weight unpack (docs/BENCHMARKS.md has the gain).
 *
 * Layout: rows 8g..8g+7 form group g, which sits where those rows sat
 * (8 * nb * 144 bytes); per super-block b it holds 1152 = 8 * 144 bytes:
 *     f16 d[8], f16 dmin[8]                       (32 B, lane r = row r)
 *     u32 H[3][8]: dword k of row r's 12 scale bytes (96 B)
 *     u8  qs[32][32]: chunk 8m + k, lane r = row r's qs[32m + 4k .. +3]
 * (low nibbles: sub-block 2m, elements 4k..4k+3; high: sub-block 2m + 1).
 *
 * Arithmetic per output (row r, vector c), whatever n, the tiling or the
 * thread, and the same as the eight-row tile and the one-row AVX2 kernel
 * over the file's rows (so packed and unpacked products give the same bits,
 * tests/test_matmul.c): acc = 0; per super-block, in order,
 *     acc = fma((float)isum, d * da, acc); acc = fma(-(float)msum, dmin * da, acc)
 * with isum = sum_s sc_s (q_s . a_s) and msum = sum_s m_s bsum_s exact int32.
 * A sub-block's eight maddubs outputs are summed in int16 before its one
 * madd with the eight rows' scales: Q4_K weights are 0..15 and the Q8_K
 * activations of this level |a| <= 127 (even -128 would do), so the sum is
 * at most 8 * 2 * 15 * 128 = 30720 < 32767, exact.
 *
 * It is a template like matmul_x86.c: matmul.c includes it in both x86
 * passes (the AVX2 kernel at level 1, the AVX-512 ones at level 2); compiled
 * on its own it is empty.
 */
#ifndef KS_MM_TEMPLATE_PASS
typedef int ks_matmul_x86_q4k_is_included_by_matmul_c; /* standalone: nothing to compile */
#else
#define KS_MM_FN static __attribute__((target(KS_MM_TGT)))
#define KS_MM_INL static inline __attribute__((target(KS_MM_TGT), always_inline))

#define KS_MM_X8_SB 1152 /* bytes of one super-block of eight rows */
#define KS_MM_X8_QS 128  /* offset of the quants in it */
#define KS_MM_Q6Q_SB 1680 /* bytes of one Q6_K super-block of eight rows (KS_WEIGHT_Q6_K_X8Q) */
#define KS_MM_Q5Q_SB 1408 /* bytes of one Q5_K super-block of eight rows (KS_WEIGHT_Q5_K_X8Q) */
#define KS_MM_IQ4Q_SB 1088 /* bytes of one IQ4_XS super-block of eight rows (KS_WEIGHT_IQ4_XS_X8Q) */

/* Software prefetch distance over the group's stream: as the row kernels'
 * KS_MM_QK_PF_BYTES (about one 4 KiB page ahead, where the hardware
 * prefetcher stops at page ends). */
#ifndef KS_MM_X8_PF_BYTES
#define KS_MM_X8_PF_BYTES 4096
#endif

#if KS_MM_LEVEL < 2

/* An int16 running sum kept as one chain.  Integer adds may be reassociated,
 * and GCC turned each sub-block's chain of eight into a tree whose leaves (all
 * the tile's maddubs results) outnumbered the 16 ymm registers: the NC = 4
 * tile spilled and reloaded every one (1016 stack references, 65 G MAC per
 * CPU-second against 58.6 for the unpacked tile), and the int32 sub-block
 * sums likewise.  An empty asm makes each partial sum opaque, so a chain
 * stays a chain. */
#if defined(__GNUC__)
#define KS_MM_X8_KEEP(v) __asm__("" : "+x"(v))
#else
#define KS_MM_X8_KEEP(v) ((void)0)
#endif

KS_MM_INL void KS_MM_SFX(ks_mm_q4_kx8_body)(const uint8_t *grp, const uint8_t *xq, size_t xs, int64_t cols, float *y,
                                            int64_t ys, const int NC) {
    const int64_t nb = cols / KS_QK_K;
    const __m256i m4 = _mm256_set1_epi8(0x0F), km1 = _mm256_set1_epi32(0x3f3f3f3f), km2 = _mm256_set1_epi32(0x0f0f0f0f),
                  km3 = _mm256_set1_epi32(0x03030303);
    __m256 acc[KS_MM_T8_NC];
    _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *sb = grp + (size_t)b * KS_MM_X8_SB;
#if KS_MM_X8_PF_BYTES > 0
        _Pragma("GCC unroll 18") for (int o = 0; o < KS_MM_X8_SB; o += 64)
            _mm_prefetch((const char *)((uintptr_t)sb + KS_MM_X8_PF_BYTES + (uintptr_t)o), _MM_HINT_T0);
#endif
        /* llama.cpp's k-quant scale unpacking (utmp, kmask1..3) on the eight rows' dwords at once */
        const __m256i H1 = _mm256_loadu_si256((const __m256i *)(sb + 32)),
                      H2 = _mm256_loadu_si256((const __m256i *)(sb + 64)),
                      H3 = _mm256_loadu_si256((const __m256i *)(sb + 96));
        const __m256i u1 = _mm256_or_si256(_mm256_and_si256(H3, km2),
                                           _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(H1, 6), km3), 4));
        const __m256i u0 = _mm256_and_si256(H1, km1);
        /* u0 / u1: sub-block scales 0-3 / 4-7 (byte s of each row's dword) */
        __m256i isum[KS_MM_T8_NC];
        _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) isum[c] = _mm256_setzero_si256();
        const uint8_t *qs = sb + KS_MM_X8_QS;
        _Pragma("GCC unroll 4") for (int m = 0; m < 4; m++) {
            const __m256i slo = _mm256_shuffle_epi8(m < 2 ? u0 : u1, KS_MM_SFX(ks_mm_t8_pick)((2 * m) & 3, (2 * m) & 3));
            const __m256i shi =
                _mm256_shuffle_epi8(m < 2 ? u0 : u1, KS_MM_SFX(ks_mm_t8_pick)((2 * m + 1) & 3, (2 * m + 1) & 3));
            if (NC <= 2) { /* both nibbles in one pass over the 8 chunks: each loaded once */
                __m256i plo[2], phi[2];
                _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) {
                    const __m256i V = _mm256_loadu_si256((const __m256i *)(qs + 32 * (8 * m + k)));
                    const __m256i lo = _mm256_and_si256(V, m4), hi = _mm256_and_si256(_mm256_srli_epi16(V, 4), m4);
                    _Pragma("GCC unroll 2") for (int c = 0; c < NC; c++) {
                        const int8_t *a = ((const ks_block_q8_k *)(xq + c * xs))[b].qs + 64 * m + 4 * k;
                        int32_t al, ah;
                        memcpy(&al, a, 4);
                        memcpy(&ah, a + 32, 4);
                        const __m256i pl = _mm256_maddubs_epi16(lo, _mm256_set1_epi32(al));
                        const __m256i ph = _mm256_maddubs_epi16(hi, _mm256_set1_epi32(ah));
                        plo[c] = k ? _mm256_add_epi16(plo[c], pl) : pl;
                        phi[c] = k ? _mm256_add_epi16(phi[c], ph) : ph;
                        KS_MM_X8_KEEP(plo[c]);
                        KS_MM_X8_KEEP(phi[c]);
                    }
                }
                _Pragma("GCC unroll 2") for (int c = 0; c < NC; c++) {
                    isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(plo[c], slo));
                    isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(phi[c], shi));
                    KS_MM_X8_KEEP(isum[c]);
                }
            } else { /* 3 or more vectors: one nibble plane per pass (fewer live registers) */
                _Pragma("GCC unroll 2") for (int nib = 0; nib < 2; nib++) {
                    __m256i p[KS_MM_T8_NC];
                    _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) {
                        const __m256i V = _mm256_loadu_si256((const __m256i *)(qs + 32 * (8 * m + k)));
                        const __m256i Wv = nib ? _mm256_and_si256(_mm256_srli_epi16(V, 4), m4) : _mm256_and_si256(V, m4);
                        _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) {
                            const int8_t *a = ((const ks_block_q8_k *)(xq + c * xs))[b].qs + 64 * m + 32 * nib + 4 * k;
                            int32_t av;
                            memcpy(&av, a, 4);
                            const __m256i pp = _mm256_maddubs_epi16(Wv, _mm256_set1_epi32(av));
                            p[c] = k ? _mm256_add_epi16(p[c], pp) : pp;
                            KS_MM_X8_KEEP(p[c]);
                        }
                    }
                    _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) {
                        isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(p[c], nib ? shi : slo));
                        KS_MM_X8_KEEP(isum[c]);
                    }
                }
            }
        }
        /* the mins (u2 / u3, bytes 0-3 / 4-7 of each row), d and dmin of the 8 rows */
        const __m256i u3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(H3, 4), km2),
                                           _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(H2, 6), km3), 4));
        const __m256i u2 = _mm256_and_si256(H2, km1);
        __m256i mnv[4];
        _Pragma("GCC unroll 4") for (int t = 0; t < 4; t++) mnv[t] =
            _mm256_shuffle_epi8(t < 2 ? u2 : u3, KS_MM_SFX(ks_mm_t8_pick)(2 * (t & 1), 2 * (t & 1) + 1));
        const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)sb)),
                     dm8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sb + 16)));
        _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) acc[c] =
            KS_MM_SFX(ks_mm_k8_finish)(acc[c], isum[c], mnv, d8, dm8, ((const ks_block_q8_k *)(xq + c * xs)) + b);
    }
    _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) _mm256_storeu_ps(y + c * ys, acc[c]);
}

/* Group grp (eight interleaved rows) times nc (1..KS_MM_T8_NC) vectors: y[c * ys + r], r < 8. */
KS_MM_FN void KS_MM_SFX(ks_mm_q4_kx8)(const uint8_t *grp, const uint8_t *xq, size_t xs, int nc, int64_t cols, float *y,
                                      int64_t ys) {
    KS_MM_T8_SWITCH(KS_MM_SFX(ks_mm_q4_kx8_body), grp, xq, xs, cols, y, ys)
}

#undef KS_MM_X8_KEEP
#endif /* KS_MM_LEVEL < 2 */

#if KS_MM_LEVEL >= 2
/* ------------------------------------------ AVX-512 VNNI: eight-byte lanes --
 * Layout KS_WEIGHT_Q4_K_X8Q: the header of KS_WEIGHT_Q4_K_X8 (d[8], dmin[8],
 * H[3][8]), then the quants as 16 chunks of 64 bytes: chunk 4m + k, bytes
 * 8r..8r+7 = row r's qs[32m + 8k .. +7] (low nibbles: sub-block 2m,
 * elements 8k..8k+7; high: sub-block 2m + 1).
 *
 * Why its own lane width.  vpdpbusd takes u8 weights 0..15 against s8
 * activations straight to int32, so no maddubs / madd pair is needed and the
 * zmm holds 64 weights; what each product needs beside it is its activation
 * operand, four activation bytes per dword lane matching that lane's
 * weights.  With eight-byte lanes, dword lane 2r + j of a chunk holds row
 * r's elements 8k + 4j .. + 3, so the operand is the eight activation bytes
 * a[8k .. 8k + 7] broadcast as a qword: vpbroadcastq from memory, a load
 * and no shuffle, one per chunk and vector, serving all eight rows.  (The
 * four-byte lanes of the AVX2 layout would want a[4k] in one half of the zmm
 * and a[4k + 4] in the other: a permute per operand.)  No transposes, no
 * horizontal sums until the super-block's end, where lanes 2r and 2r + 1
 * meet in one integer add.
 *
 * Per super-block and vector: 32 vpdpbusd (2048 multiply-adds), 8 vpdpwssd
 * applying the sub-block scales (the int32 lanes of a sub-block's four
 * vpdpbusd sum at most 16 * 15 * 127 = 30480, an int16; the scale vector's
 * int32 lanes are (scale, 0) int16 pairs, so the lane's sign-extension half
 * meets the zero: matmul_x86_kquant.c's Q4_K zmm form does the same), 4 vpdpwssd
 * for the mins against the Q8_K bsums, and an epilogue of 13 ops per two
 * vectors (their outputs share a zmm; 9 for a vector alone).  The weight side
 * (nibble split, scale and min vectors by vpshufb) is built once per
 * super-block for every vector of the call, so prefill tiles of up to
 * KS_MM_X8Q_NC vectors share it.
 *
 * Arithmetic per output: exactly the AVX2 eight-row kernel's above (and so
 * the AVX2 one-row kernel's over the file's rows):
 *     acc = fma((float)isum, d * da, acc); acc = fma(-(float)msum, dmin * da, acc)
 * per super-block in order, isum and msum exact int32, whatever n, tiling
 * or thread: decode and prefill give the same bits, and they are the bits
 * the AVX2 level gives for the same matrix (tests/test_matmul.c).  They are
 * not the bits of the AVX-512 one-row kernel over the file's rows
 * (ks_mm_q4_kz, float lanes summed at the row's end), which `--no-repack`
 * and row counts that are no multiple of 8 keep using. */

/* vpshufb controls over a scale dword array arranged by
 * _mm512_shuffle_i64x2(u, u, (1, 1, 0, 0)) (128-bit lane q holding rows
 * 4 (q / 2) .. + 3): dword lane L (row L / 2) takes byte s of its row's
 * dword, zero-extended (S) or as an (m, m) int16 pair (M, s + (L & 1)). */
#define KS_MM_X8Q_B(L, s) (4 * (2 * (((L) >> 2) & 1) + (((L) >> 1) & 1)) + (s))
#define KS_MM_X8Q_S(L, s) ((int)(KS_MM_X8Q_B(L, s) | 0x80808000u))
#define KS_MM_X8Q_M(L, s) \
    ((int)(KS_MM_X8Q_B(L, (s) + ((L) & 1)) | 0x8000u | ((unsigned)KS_MM_X8Q_B(L, (s) + ((L) & 1)) << 16) | 0x80000000u))
#define KS_MM_X8Q_CTL(F, s)                                                                                           \
    _mm512_setr_epi32(F(0, s), F(1, s), F(2, s), F(3, s), F(4, s), F(5, s), F(6, s), F(7, s), F(8, s), F(9, s),       \
                      F(10, s), F(11, s), F(12, s), F(13, s), F(14, s), F(15, s))

/* Q5_K's qh bits moved by s (left if positive), each byte's from its own byte once masked */
KS_MM_INL __m512i KS_MM_SFX(ks_mm_x8q_shift)(__m512i v, int s) {
    return s > 0 ? _mm512_slli_epi16(v, (unsigned)s) : s < 0 ? _mm512_srli_epi16(v, (unsigned)-s) : v;
}

/* Q4_K, and Q5_K when Q5 (KS_WEIGHT_Q5_K_X8Q: the same super-block with qh
 * after the quants, see below). */
KS_MM_INL void KS_MM_SFX(ks_mm_q4_kx8q_body)(const uint8_t *grp, const uint8_t *xq, size_t xs, int64_t cols, float *y,
                                             int64_t ys, const int NC, const int Q5) {
    const int64_t nb = cols / KS_QK_K;
    const __m512i m4 = _mm512_set1_epi8(0x0F), b4 = _mm512_set1_epi8(0x10);
    const int sbytes = Q5 ? KS_MM_Q5Q_SB : KS_MM_X8_SB;
    const __m256i km1 = _mm256_set1_epi32(0x3f3f3f3f), km2 = _mm256_set1_epi32(0x0f0f0f0f),
                  km3 = _mm256_set1_epi32(0x03030303);
    /* lanes 2r / 2r + 1 of isum (first 8 outputs) and of msum (last 8) */
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30),
                  od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    /* accp[c / 2] = [outputs of vector c | of vector c + 1] (the upper half unused for a last odd c) */
    __m512 accp[(KS_MM_X8Q_NC + 1) / 2];
    _Pragma("GCC unroll 4") for (int c = 0; c < NC; c += 2) accp[c / 2] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *sb = grp + (size_t)b * (size_t)sbytes;
#if KS_MM_X8_PF_BYTES > 0
        _Pragma("GCC unroll 22") for (int o = 0; o < sbytes; o += 64)
            _mm_prefetch((const char *)((uintptr_t)sb + KS_MM_X8_PF_BYTES + (uintptr_t)o), _MM_HINT_T0);
#endif
        /* the AVX2 kernel's scale unpacking: u0 / u1 scales 0-3 / 4-7, u2 / u3 mins 0-3 / 4-7 */
        const __m256i H1 = _mm256_loadu_si256((const __m256i *)(sb + 32)),
                      H2 = _mm256_loadu_si256((const __m256i *)(sb + 64)),
                      H3 = _mm256_loadu_si256((const __m256i *)(sb + 96));
        const __m256i u0 = _mm256_and_si256(H1, km1);
        const __m256i u1 = _mm256_or_si256(_mm256_and_si256(H3, km2),
                                           _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(H1, 6), km3), 4));
        const __m512i z0 = _mm512_castsi256_si512(u0), z1 = _mm512_castsi256_si512(u1);
        const __m512i U0 = _mm512_shuffle_i64x2(z0, z0, _MM_SHUFFLE(1, 1, 0, 0)),
                      U1 = _mm512_shuffle_i64x2(z1, z1, _MM_SHUFFLE(1, 1, 0, 0));
        __m512i isum[KS_MM_X8Q_NC];
        _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) isum[c] = _mm512_setzero_si512();
        const uint8_t *qs = sb + KS_MM_X8_QS;
        _Pragma("GCC unroll 4") for (int m = 0; m < 4; m++) {
            __m512i plo[KS_MM_X8Q_NC], phi[KS_MM_X8Q_NC];
            const __m512i Us = m < 2 ? U0 : U1;
            const __m512i slo = _mm512_shuffle_epi8(Us, (m & 1) ? KS_MM_X8Q_CTL(KS_MM_X8Q_S, 2) : KS_MM_X8Q_CTL(KS_MM_X8Q_S, 0));
            const __m512i shi = _mm512_shuffle_epi8(Us, (m & 1) ? KS_MM_X8Q_CTL(KS_MM_X8Q_S, 3) : KS_MM_X8Q_CTL(KS_MM_X8Q_S, 1));
            _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
                const __m512i V = _mm512_loadu_si512((const void *)(qs + 64 * (4 * m + k)));
                __m512i lo, hi;
                if (Q5) { /* the fifth bit: qh chunk k's bits 2m (low nibbles) and 2m + 1 (high) to bit 4 */
                    const __m512i QH = _mm512_loadu_si512((const void *)(sb + KS_MM_X8_SB + 64 * k));
                    lo = _mm512_ternarylogic_epi32(V, _mm512_and_si512(KS_MM_SFX(ks_mm_x8q_shift)(QH, 4 - 2 * m), b4), m4, 0xEC);
                    hi = _mm512_ternarylogic_epi32(_mm512_srli_epi16(V, 4),
                                                   _mm512_and_si512(KS_MM_SFX(ks_mm_x8q_shift)(QH, 3 - 2 * m), b4), m4, 0xEC);
                } else {
                    lo = _mm512_and_si512(V, m4);
                    hi = _mm512_and_si512(_mm512_srli_epi16(V, 4), m4);
                }
                /* a chain restarts where the int16 bound would be passed: every 4 products of 0..15, 2 of 0..31 */
                const bool first = Q5 ? !(k & 1) : k == 0, last = Q5 ? (k & 1) : k == 3;
                _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) {
                    const int8_t *a = ((const ks_block_q8_k *)(xq + c * xs))[b].qs + 64 * m + 8 * k;
                    int64_t al, ah;
                    memcpy(&al, a, 8);
                    memcpy(&ah, a + 32, 8);
                    plo[c] = _mm512_dpbusd_epi32(first ? _mm512_setzero_si512() : plo[c], lo, _mm512_set1_epi64(al));
                    phi[c] = _mm512_dpbusd_epi32(first ? _mm512_setzero_si512() : phi[c], hi, _mm512_set1_epi64(ah));
                    if (last) {
                        isum[c] = _mm512_dpwssd_epi32(isum[c], plo[c], slo);
                        isum[c] = _mm512_dpwssd_epi32(isum[c], phi[c], shi);
                    }
                }
            }
        }
        /* the mins: M_t, lane 2r + j = row r's (m_s, m_s), s = 2t + j, against bsums dword s */
        const __m256i u2 = _mm256_and_si256(H2, km1);
        const __m256i u3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(H3, 4), km2),
                                           _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(H2, 6), km3), 4));
        const __m512i z2 = _mm512_castsi256_si512(u2), z3 = _mm512_castsi256_si512(u3);
        const __m512i U2 = _mm512_shuffle_i64x2(z2, z2, _MM_SHUFFLE(1, 1, 0, 0)),
                      U3 = _mm512_shuffle_i64x2(z3, z3, _MM_SHUFFLE(1, 1, 0, 0));
        const __m512i ce = KS_MM_X8Q_CTL(KS_MM_X8Q_M, 0), co = KS_MM_X8Q_CTL(KS_MM_X8Q_M, 2);
        const __m512i M0 = _mm512_shuffle_epi8(U2, ce), M1 = _mm512_shuffle_epi8(U2, co),
                      M2 = _mm512_shuffle_epi8(U3, ce), M3 = _mm512_shuffle_epi8(U3, co);
        const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)sb)),
                     dm8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sb + 16)));
        const __m512 d16 = _mm512_insertf32x8(_mm512_castps256_ps512(d8), d8, 1),
                     dm16 = _mm512_insertf32x8(_mm512_castps256_ps512(dm8), dm8, 1);
        __m512i msum[KS_MM_X8Q_NC];
        _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) {
            const ks_block_q8_k *a = ((const ks_block_q8_k *)(xq + c * xs)) + b;
            int64_t bs[4];
            memcpy(bs, a->bsums, sizeof bs);
            msum[c] = _mm512_dpwssd_epi32(_mm512_setzero_si512(), M0, _mm512_set1_epi64(bs[0]));
            msum[c] = _mm512_dpwssd_epi32(msum[c], M1, _mm512_set1_epi64(bs[1]));
            msum[c] = _mm512_dpwssd_epi32(msum[c], M2, _mm512_set1_epi64(bs[2]));
            msum[c] = _mm512_dpwssd_epi32(msum[c], M3, _mm512_set1_epi64(bs[3]));
        }
        /* Two vectors per zmm: the lanes of a vector's eight outputs take the same float steps as alone
         * (the AVX2 kernel's), 13 ops a pair where one vector alone takes 9. */
        _Pragma("GCC unroll 4") for (int c = 0; c < NC; c += 2) {
            const float da0 = ((const ks_block_q8_k *)(xq + c * xs))[b].d;
            if (c + 1 < NC) {
                const float da1 = ((const ks_block_q8_k *)(xq + (c + 1) * xs))[b].d;
                /* [isum of vector c | of vector c + 1], the same for msum: exact */
                const __m512i I = _mm512_add_epi32(_mm512_permutex2var_epi32(isum[c], ev, isum[c + 1]),
                                                   _mm512_permutex2var_epi32(isum[c], od, isum[c + 1]));
                const __m512i Mn = _mm512_add_epi32(_mm512_permutex2var_epi32(msum[c], ev, msum[c + 1]),
                                                    _mm512_permutex2var_epi32(msum[c], od, msum[c + 1]));
                const __m512 da = _mm512_insertf32x8(_mm512_set1_ps(da0), _mm256_set1_ps(da1), 1);
                accp[c / 2] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_mul_ps(d16, da), accp[c / 2]);
                accp[c / 2] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(Mn), _mm512_mul_ps(dm16, da), accp[c / 2]);
            } else {
                /* [isum of rows 0-7 | msum of rows 0-7], exact */
                const __m512i both = _mm512_add_epi32(_mm512_permutex2var_epi32(isum[c], ev, msum[c]),
                                                      _mm512_permutex2var_epi32(isum[c], od, msum[c]));
                const __m512 f = _mm512_cvtepi32_ps(both);
                const __m256 da = _mm256_set1_ps(da0);
                __m256 acc = _mm512_castps512_ps256(accp[c / 2]);
                acc = _mm256_fmadd_ps(_mm512_castps512_ps256(f), _mm256_mul_ps(d8, da), acc);
                acc = _mm256_fnmadd_ps(_mm512_extractf32x8_ps(f, 1), _mm256_mul_ps(dm8, da), acc);
                accp[c / 2] = _mm512_castps256_ps512(acc);
            }
        }
    }
    _Pragma("GCC unroll 4") for (int c = 0; c < NC; c += 2) {
        _mm256_storeu_ps(y + c * ys, _mm512_castps512_ps256(accp[c / 2]));
        if (c + 1 < NC) _mm256_storeu_ps(y + (c + 1) * ys, _mm512_extractf32x8_ps(accp[c / 2], 1));
    }
}

/* Group grp (eight interleaved rows, eight-byte lanes) times nc (1..KS_MM_X8Q_NC)
 * vectors: y[c * ys + r], r < 8. */
/* The Q4_K and Q5_K entries of the one body (Q5: qh's fifth bit), with NC
 * last as KS_MM_X8Q_SWITCH passes it. */
KS_MM_INL void KS_MM_SFX(ks_mm_q4_kx8q_q4)(const uint8_t *grp, const uint8_t *xq, size_t xs, int64_t cols, float *y,
                                           int64_t ys, const int NC) {
    KS_MM_SFX(ks_mm_q4_kx8q_body)(grp, xq, xs, cols, y, ys, NC, 0);
}
KS_MM_INL void KS_MM_SFX(ks_mm_q4_kx8q_q5)(const uint8_t *grp, const uint8_t *xq, size_t xs, int64_t cols, float *y,
                                           int64_t ys, const int NC) {
    KS_MM_SFX(ks_mm_q4_kx8q_body)(grp, xq, xs, cols, y, ys, NC, 1);
}

KS_MM_FN void KS_MM_SFX(ks_mm_q4_kx8q)(const uint8_t *grp, const uint8_t *xq, size_t xs, int nc, int64_t cols,
                                       float *y, int64_t ys) {
    KS_MM_X8Q_SWITCH(KS_MM_SFX(ks_mm_q4_kx8q_q4), grp, xq, xs, cols, y, ys)
}

/* Q5_K (KS_WEIGHT_Q5_K_X8Q): Q4_K's eight-row super-block (1152 bytes) and
 * after it qh as 4 chunks of 64 bytes (chunk k, bytes 8r..8r+7 = row r's
 * qh[8k ..]): 1408 = 8 * 176 bytes.  A weight is the nibble with qh's bit
 * as bit 4 (vpternlogd), 0..31, so a vpdpbusd lane reaches 4 * 31 * 127 and
 * two of them (not four) sum within int16 before the scale's vpdpwssd: 16
 * vpdpwssd per super-block and vector instead of 8.  Arithmetic per output
 * exactly Q4_K's (the AVX2 Q5_K kernels', matmul_x86_tiles.c). */
KS_MM_FN void KS_MM_SFX(ks_mm_q5_kx8q)(const uint8_t *grp, const uint8_t *xq, size_t xs, int nc, int64_t cols,
                                       float *y, int64_t ys) {
    KS_MM_X8Q_SWITCH(KS_MM_SFX(ks_mm_q4_kx8q_q5), grp, xq, xs, cols, y, ys)
}
/* The float step of super-block b for the Q6_K and IQ4_XS groups: row r's
 * exact int32 sum is lanes 2r and 2r + 1 of isum[c] (added, then the even
 * lanes gathered), times d_r (the group's eight f16 scales at sb) and the
 * vector's d, into acc[c]: acc = fma(isum, d_r * d_a, acc). */
KS_MM_INL void KS_MM_SFX(ks_mm_x8q_step)(const __m512i *isum, const uint8_t *sb, const uint8_t *xq, size_t xs,
                                         int64_t b, __m256 *acc, const int NC) {
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 2, 4, 6, 8, 10, 12, 14);
    const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)sb));
    _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) {
        const ks_block_q8_k *a = ((const ks_block_q8_k *)(xq + c * xs)) + b;
        const __m512i t = _mm512_add_epi32(isum[c], _mm512_srli_epi64(isum[c], 32));
        const __m256 f = _mm256_cvtepi32_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi32(ev, t)));
        acc[c] = _mm256_fmadd_ps(f, _mm256_mul_ps(d8, _mm256_set1_ps(a->d)), acc[c]);
    }
}

/* ------------------------------------------- Q6_K, AVX-512 VNNI: eight-byte lanes --
 * Layout KS_WEIGHT_Q6_K_X8Q: rows 8g..8g+7 form group g, in place of those
 * rows (8 * nb * 210 bytes); per super-block 1680 bytes:
 *     f16 d[8]                                   (16 B, lane r = row r)
 *     i8  sc[16][8]: sub-block s's scale of row r (128 B)
 *     u8  ql[16][64]: chunk c, bytes 8r..8r+7 = row r's ql[8c ..] (1024 B)
 *     u8  qh[8][64]:  chunk c, bytes 8r..8r+7 = row r's qh[8c ..] (512 B)
 * The lanes are Q4_K's eight bytes, for the same reason (the activation
 * operand a broadcast qword).  For half h and k < 4, ql chunks 8h + k and
 * 8h + k + 4 and qh chunk 4h + k hold four weight zmm: elements
 * 128h + 32i + 8k .. + 7 of every row (i = 0..3: ql 8h + k low nibbles, its
 * sibling's low nibbles, the first's high, the sibling's high, each with
 * qh's bit pair 2i .. 2i + 1 as bits 4-5), so a weight is a u8 in 0..63 and
 * the -32 offset goes into the int32 sum as -32 sum_s sc_s bsum_s (four
 * vpdpwssd against the Q8_K bsums).  A vpdpbusd lane sums at most
 * 4 * 63 * 127 = 32004, an int16, so each one meets its sub-block's scale in
 * one vpdpwssd ((sc, 0) int16 pairs, built by a zero-masked vpermw): 32 +
 * 32 + 4 dot products per super-block and vector, the unpack (13 ops per
 * 4 weight zmm) shared by the call's vectors.
 *
 * Arithmetic per output: acc = 0; per super-block acc = fma((float)isum,
 * d * da, acc), isum = sum_s sc_s (q_s - 32) . a_s exact in int32: the AVX2
 * Q6_K kernels' (the eight-row tile and the one-row kernel,
 * matmul_x86_tiles.c / matmul_x86_kquant.c), so at AVX-512 decode and prefill give
 * the bits the AVX2 level gives for the same matrix. */
KS_MM_INL void KS_MM_SFX(ks_mm_q6_kx8q_body)(const uint8_t *grp, const uint8_t *xq, size_t xs, int64_t cols, float *y,
                                             int64_t ys, const int NC) {
    const int64_t nb = cols / KS_QK_K;
    const __m512i m0f = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    /* word 2L of S (L = 2r + j): scale of row r, sub-block (s mod 4) of a 4-sub-block sc16 (index 8 (s mod 4) + r);
     * word 2L + 1 zero (masked) */
#define KS_MM_Q6Q_SI(L, s) ((8 * (s) + ((L) >> 1)) | ((8 * (s) + ((L) >> 1)) << 16))
    /* words 2L, 2L + 1 of O_t: -32 sc of row r, sub-blocks 4t + 2j, 4t + 2j + 1 */
#define KS_MM_Q6Q_OI(L, s) ((8 * 2 * ((L) & 1) + ((L) >> 1)) | ((8 * (2 * ((L) & 1) + 1) + ((L) >> 1)) << 16))
    const __m512i sidx[4] = {KS_MM_X8Q_CTL(KS_MM_Q6Q_SI, 0), KS_MM_X8Q_CTL(KS_MM_Q6Q_SI, 1),
                             KS_MM_X8Q_CTL(KS_MM_Q6Q_SI, 2), KS_MM_X8Q_CTL(KS_MM_Q6Q_SI, 3)};
    const __m512i oidx = KS_MM_X8Q_CTL(KS_MM_Q6Q_OI, 0);
#undef KS_MM_Q6Q_SI
#undef KS_MM_Q6Q_OI
    __m256 acc[KS_MM_X8Q_NC];
    _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *sb = grp + (size_t)b * KS_MM_Q6Q_SB;
#if KS_MM_X8_PF_BYTES > 0
        _Pragma("GCC unroll 27") for (int o = 0; o < KS_MM_Q6Q_SB; o += 64)
            _mm_prefetch((const char *)((uintptr_t)sb + KS_MM_X8_PF_BYTES + (uintptr_t)o), _MM_HINT_T0);
#endif
        const uint8_t *ql = sb + 144, *qh = sb + 1168;
        __m512i isum[KS_MM_X8Q_NC];
        _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) isum[c] = _mm512_setzero_si512();
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
            /* scales of sub-blocks 8h .. 8h + 3 and 8h + 4 .. 8h + 7, int16 [s][r] */
            const __m512i scA = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(sb + 16 + 64 * h))),
                          scB = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(sb + 16 + 64 * h + 32)));
            /* the offset: O_t, t = 2h (scA) and 2h + 1 (scB), against bsums[4t .. 4t + 3] */
            const __m512i oA = _mm512_permutexvar_epi16(oidx, _mm512_sub_epi16(_mm512_setzero_si512(), _mm512_slli_epi16(scA, 5))),
                          oB = _mm512_permutexvar_epi16(oidx, _mm512_sub_epi16(_mm512_setzero_si512(), _mm512_slli_epi16(scB, 5)));
            _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) {
                const ks_block_q8_k *a = ((const ks_block_q8_k *)(xq + c * xs)) + b;
                int64_t bs[2];
                memcpy(bs, a->bsums + 8 * h, sizeof bs);
                isum[c] = _mm512_dpwssd_epi32(isum[c], oA, _mm512_set1_epi64(bs[0]));
                isum[c] = _mm512_dpwssd_epi32(isum[c], oB, _mm512_set1_epi64(bs[1]));
            }
            _Pragma("GCC unroll 2") for (int kp = 0; kp < 2; kp++) {
                /* S_i: the scale of sub-block 8h + 2i + kp, for elements 128h + 32i + 8k (k = 2kp, 2kp + 1) */
                const __m512i S0 = _mm512_maskz_permutexvar_epi16(0x55555555u, sidx[kp], scA),
                              S1 = _mm512_maskz_permutexvar_epi16(0x55555555u, sidx[2 + kp], scA),
                              S2 = _mm512_maskz_permutexvar_epi16(0x55555555u, sidx[kp], scB),
                              S3 = _mm512_maskz_permutexvar_epi16(0x55555555u, sidx[2 + kp], scB);
                _Pragma("GCC unroll 2") for (int kk = 0; kk < 2; kk++) {
                    const int k = 2 * kp + kk;
                    const __m512i QH = _mm512_loadu_si512((const void *)(qh + 64 * (4 * h + k))),
                                  L0 = _mm512_loadu_si512((const void *)(ql + 64 * (8 * h + k))),
                                  L1 = _mm512_loadu_si512((const void *)(ql + 64 * (8 * h + k + 4)));
                    /* (A & 0x0F) | B, B already masked to bits 4-5: vpternlogd 0xEC over (A, B, 0x0F) */
                    const __m512i W0 = _mm512_ternarylogic_epi32(L0, _mm512_and_si512(_mm512_slli_epi16(QH, 4), m30), m0f, 0xEC),
                                  W1 = _mm512_ternarylogic_epi32(L1, _mm512_and_si512(_mm512_slli_epi16(QH, 2), m30), m0f, 0xEC),
                                  W2 = _mm512_ternarylogic_epi32(_mm512_srli_epi16(L0, 4), _mm512_and_si512(QH, m30), m0f, 0xEC),
                                  W3 = _mm512_ternarylogic_epi32(_mm512_srli_epi16(L1, 4),
                                                                 _mm512_and_si512(_mm512_srli_epi16(QH, 2), m30), m0f, 0xEC);
                    _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) {
                        const int8_t *a = ((const ks_block_q8_k *)(xq + c * xs))[b].qs + 128 * h + 8 * k;
                        int64_t a0, a1, a2, a3;
                        memcpy(&a0, a, 8);
                        memcpy(&a1, a + 32, 8);
                        memcpy(&a2, a + 64, 8);
                        memcpy(&a3, a + 96, 8);
                        const __m512i z = _mm512_setzero_si512();
                        isum[c] = _mm512_dpwssd_epi32(isum[c], _mm512_dpbusd_epi32(z, W0, _mm512_set1_epi64(a0)), S0);
                        isum[c] = _mm512_dpwssd_epi32(isum[c], _mm512_dpbusd_epi32(z, W1, _mm512_set1_epi64(a1)), S1);
                        isum[c] = _mm512_dpwssd_epi32(isum[c], _mm512_dpbusd_epi32(z, W2, _mm512_set1_epi64(a2)), S2);
                        isum[c] = _mm512_dpwssd_epi32(isum[c], _mm512_dpbusd_epi32(z, W3, _mm512_set1_epi64(a3)), S3);
                    }
                }
            }
        }
        KS_MM_SFX(ks_mm_x8q_step)(isum, sb, xq, xs, b, acc, NC);
    }
    _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) _mm256_storeu_ps(y + c * ys, acc[c]);
}

KS_MM_FN void KS_MM_SFX(ks_mm_q6_kx8q)(const uint8_t *grp, const uint8_t *xq, size_t xs, int nc, int64_t cols,
                                       float *y, int64_t ys) {
    KS_MM_X8Q_SWITCH(KS_MM_SFX(ks_mm_q6_kx8q_body), grp, xq, xs, cols, y, ys)
}

/* ----------------------------------------- IQ4_XS, AVX-512 VNNI: eight-byte lanes --
 * Layout KS_WEIGHT_IQ4_XS_X8Q: rows 8g..8g+7 form group g, in place of those
 * rows (8 * nb * 136 bytes); per super-block 1088 bytes:
 *     f16 d[8], u16 scales_h[8]                   (32 B, lane r = row r)
 *     u32 scales_l[8]: row r's four scales_l bytes (32 B)
 *     u8  qs[16][64]: chunk c, bytes 8r..8r+7 = row r's qs[8c ..] (1024 B)
 * Chunk 2j + h holds sub-block j's elements 8h .. 8h + 7 (low nibbles) and
 * 16 + 8h .. (high), so each vpdpbusd meets a broadcast qword of
 * activations, as for Q4_K.
 *
 * The levels (ks_iq4_values, -127..113) are signed and vpdpbusd wants its
 * weights unsigned: one vpshufb maps a nibble to level + 128 (1..241), and
 * the offset leaves 128 sum(a) per sub-block, taken out as
 * -128 sum_s (ls_s - 32) bsum_s by four vpdpwssd against the Q8_K bsums
 * (as Q4_K's mins).  A lane of a sub-block's four vpdpbusd reaches
 * 16 * 241 * 127, no int16, so its scale is applied by one vpmulld (exact
 * int32) and an add: 32 vpdpbusd, 8 vpmulld, 4 vpdpwssd per super-block and
 * vector; the nibble split, the lookups and the scale vectors are shared by
 * the call's vectors.
 *
 * Arithmetic per output: acc = 0; per super-block acc = fma((float)isum,
 * d * da, acc), isum = sum_s (ls_s - 32) (q_s . a_s) exact in int32: the
 * AVX2 IQ4_XS kernels' (the eight-row tile and the one-row kernel,
 * matmul_x86_tiles.c), so at AVX-512 decode and prefill give the bits the
 * AVX2 level gives for the same matrix. */
KS_MM_INL void KS_MM_SFX(ks_mm_iq4_xsx8q_body)(const uint8_t *grp, const uint8_t *xq, size_t xs, int64_t cols, float *y,
                                               int64_t ys, const int NC) {
    const int64_t nb = cols / KS_QK_K;
    const __m512i m4 = _mm512_set1_epi8(0x0F), lo4 = _mm512_set1_epi32(0x0F), b45 = _mm512_set1_epi32(0x30),
                  k32 = _mm512_set1_epi32(32);
    int8_t lut8[16];
    for (int i = 0; i < 16; i++) lut8[i] = (int8_t)(ks_iq4_values[i] + 128);
    const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)lut8));
    const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    /* vpshufb control: the low int16 of each dword into both halves */
    const __m512i w2 = _mm512_set4_epi32(0x0D0C0D0C, 0x09080908, 0x05040504, 0x01000100);
    __m256 acc[KS_MM_X8Q_NC];
    _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *sb = grp + (size_t)b * KS_MM_IQ4Q_SB;
#if KS_MM_X8_PF_BYTES > 0
        _Pragma("GCC unroll 17") for (int o = 0; o < KS_MM_IQ4Q_SB; o += 64)
            _mm_prefetch((const char *)((uintptr_t)sb + KS_MM_X8_PF_BYTES + (uintptr_t)o), _MM_HINT_T0);
#endif
        /* lanes 2r, 2r + 1: row r's scales_h, scales_l dword */
        const __m512i SH = _mm512_permutexvar_epi32(
                          dup, _mm512_castsi256_si512(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(sb + 16))))),
                      SL = _mm512_permutexvar_epi32(dup, _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(sb + 32))));
        const uint8_t *qs = sb + 64;
        __m512i isum[KS_MM_X8Q_NC];
        _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) isum[c] = _mm512_setzero_si512();
        __m512i Sprev = _mm512_setzero_si512();
        _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {
            /* ls_j - 32 of every row, int32: nibble j of scales_l | bits 2j, 2j + 1 of scales_h as bits 4, 5 */
            const __m512i hs = 2 * j < 4 ? _mm512_slli_epi32(SH, 4 - 2 * j) : _mm512_srli_epi32(SH, 2 * j - 4);
            const __m512i S = _mm512_sub_epi32(
                _mm512_ternarylogic_epi32(_mm512_srli_epi32(SL, 4 * j), _mm512_and_si512(hs, b45), lo4, 0xEC), k32);
            const __m512i V0 = _mm512_loadu_si512((const void *)(qs + 64 * (2 * j))),
                          V1 = _mm512_loadu_si512((const void *)(qs + 64 * (2 * j + 1)));
            const __m512i l0 = _mm512_shuffle_epi8(lut, _mm512_and_si512(V0, m4)),
                          h0 = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(V0, 4), m4)),
                          l1 = _mm512_shuffle_epi8(lut, _mm512_and_si512(V1, m4)),
                          h1 = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(V1, 4), m4));
            /* for odd j, the offset of sub-blocks j - 1 (lanes 2r) and j (lanes 2r + 1): (v, v) int16 pairs,
             * v = -128 (ls - 32), against bsums dword j - 1 + (lane & 1) */
            __m512i C = _mm512_setzero_si512();
            if (j & 1)
                C = _mm512_shuffle_epi8(
                    _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(_mm512_mask_blend_epi32(0xAAAA, Sprev, S), 7)), w2);
            _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) {
                const ks_block_q8_k *ab = ((const ks_block_q8_k *)(xq + c * xs)) + b;
                const int8_t *a = ab->qs + 32 * j;
                int64_t a0, a1, a2, a3;
                memcpy(&a0, a, 8);
                memcpy(&a1, a + 16, 8);
                memcpy(&a2, a + 8, 8);
                memcpy(&a3, a + 24, 8);
                __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), l0, _mm512_set1_epi64(a0));
                p = _mm512_dpbusd_epi32(p, h0, _mm512_set1_epi64(a1));
                p = _mm512_dpbusd_epi32(p, l1, _mm512_set1_epi64(a2));
                p = _mm512_dpbusd_epi32(p, h1, _mm512_set1_epi64(a3));
                isum[c] = _mm512_add_epi32(isum[c], _mm512_mullo_epi32(p, S));
                if (j & 1) {
                    int64_t bs;
                    memcpy(&bs, ab->bsums + 4 * (j / 2), 8);
                    isum[c] = _mm512_dpwssd_epi32(isum[c], C, _mm512_set1_epi64(bs));
                }
            }
            Sprev = S;
        }
        KS_MM_SFX(ks_mm_x8q_step)(isum, sb, xq, xs, b, acc, NC);
    }
    _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) _mm256_storeu_ps(y + c * ys, acc[c]);
}

KS_MM_FN void KS_MM_SFX(ks_mm_iq4_xsx8q)(const uint8_t *grp, const uint8_t *xq, size_t xs, int nc, int64_t cols,
                                         float *y, int64_t ys) {
    KS_MM_X8Q_SWITCH(KS_MM_SFX(ks_mm_iq4_xsx8q_body), grp, xq, xs, cols, y, ys)
}

#undef KS_MM_X8Q_B
#undef KS_MM_X8Q_S
#undef KS_MM_X8Q_M
#undef KS_MM_X8Q_CTL
#endif /* KS_MM_LEVEL >= 2 */

#undef KS_MM_X8_SB
#undef KS_MM_X8_QS
#undef KS_MM_Q6Q_SB
#undef KS_MM_Q5Q_SB
#undef KS_MM_IQ4Q_SB
#undef KS_MM_FN
#undef KS_MM_INL
#endif /* KS_MM_TEMPLATE_PASS */
