/*
 * matmul_x86_q4k.c — the AVX2 product over Q4_K weights repacked at load
 * into eight-row interleaved super-blocks (KS_WEIGHT_Q4_K_X8, made by
 * ks_matmul_pack, matmul_packed.c): one kernel for decode and prefill.
 *
 * Why a repacked layout.  On AVX2 without VNNI an int8 product is maddubs
 * (u8 x s8 pairs to int16) then madd (to int32), and the Q4_K eight-row
 * prefill tile over the file's rows (matmul_x86_panel.c) spends most of its
 * shuffle-pipe slots transposing eight rows into the lanes of a ymm (llvm-mca,
 * Zen 3: about 54 cycles per 2048 multiply-adds against 40 for the multiply
 * pipes), while the one-row decode kernel (matmul_x86.c) pays a madd per 32
 * weights and an integer horizontal sum per super-block and vector.  Stored
 * already transposed, a 32-byte load IS the register the tile wants (lane r
 * = four bytes of row r), so neither the transposes nor the horizontal sums
 * remain, and one broadcast activation dword serves eight rows in decode as
 * in prefill.  The idea of interleaving rows at load for AVX2 is llama.cpp's
 * (block_q4_Kx8, ggml-cpu/repack.cpp); the layout and the arithmetic here
 * are this engine's own (its per-output float order below).
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
 * It is a template like matmul_x86.c: matmul.c includes it in the AVX2 pass
 * (the AVX-512 level keeps its zmm kernels over the file's rows); compiled
 * on its own it is empty.
 */
#ifndef KS_MM_TEMPLATE_PASS
typedef int ks_matmul_x86_q4k_is_included_by_matmul_c; /* standalone: nothing to compile */
#else
#if KS_MM_LEVEL < 2
#define KS_MM_FN static __attribute__((target(KS_MM_TGT)))
#define KS_MM_INL static inline __attribute__((target(KS_MM_TGT), always_inline))

#define KS_MM_X8_SB 1152 /* bytes of one super-block of eight rows */
#define KS_MM_X8_QS 128  /* offset of the quants in it */

/* Software prefetch distance over the group's stream: as the row kernels'
 * KS_MM_QK_PF_BYTES (about one 4 KiB page ahead, where the hardware
 * prefetcher stops at page ends). */
#ifndef KS_MM_X8_PF_BYTES
#define KS_MM_X8_PF_BYTES 4096
#endif

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

#undef KS_MM_X8_SB
#undef KS_MM_X8_QS
#undef KS_MM_X8_KEEP
#undef KS_MM_FN
#undef KS_MM_INL
#endif /* KS_MM_LEVEL < 2 */
#endif /* KS_MM_TEMPLATE_PASS */
