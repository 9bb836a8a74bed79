/*
 * matmul_x86_panel.c — the AVX-512 prefill tiles over packed weights: the
 * 4-row panels of Q8_0 / Q4_0 (ks_mm_q8_0p, ks_mm_q4_0p) and the transposed
 * 16-row Q8_0 panels (ks_mm_q8_0t for decode and odd panels, ks_mm_q8_0t2
 * the two-panel prefill tile).  Their layouts are made once at load by
 * ks_matmul_pack (matmul_packed.c), which also runs them.
 *
 * Why a file of their own: the kernels of matmul_x86.c read weights as the
 * file stores them and serve every level and both decode and prefill; these
 * serve prefill only (the packed layouts at the AVX-512 VNNI level, the
 * file's rows in multi-row tiles at AVX2), and each carries its own argument about what bounds it (instructions per MAC,
 * which pipes the epilogue shares with vpdpbusd, registers), which is where
 * a reader tuning prefill looks.  It is the same kind of template as
 * matmul_x86.c: matmul.c includes it right after that file in each level's
 * pass (the helpers it uses, e.g. ks_mm_dw4, come from there); compiled
 * on its own it is empty.
 *
 * At the AVX2 level (KS_MM_LEVEL 1) it holds the prefill tiles that read
 * the file's rows as they are (no repacking): the eight-row K-quant tiles
 * (Q4_K, Q5_K, Q6_K: rows transposed in registers, up to KS_MM_T8_NC
 * vectors a call), which matmul.c's ks_mm_worker takes from KS_MM_PAIR_N
 * vectors on, and the two-row float-weight tiles (f32, f16, bf16).
 * matmul_x86_tiles.c has IQ4_XS's eight-row tile.
 */
#ifndef KS_MM_TEMPLATE_PASS
typedef int ks_matmul_x86_panel_is_included_by_matmul_c; /* standalone: nothing to compile */
#else
#if KS_MM_LEVEL >= 2

#define KS_MM_FN static __attribute__((target(KS_MM_TGT)))
#define KS_MM_INL static inline __attribute__((target(KS_MM_TGT), always_inline))
/* ------------------------------- Q8_0 packed panels (prefill GEMM tile) --
 * The weights of a packed Q8_0 matrix (ks_matmul_pack, matmul_packed.c) are
 * already what the grouped kernel above builds per group: four rows form a
 * panel, and per group of four blocks the panel holds LO and HI of each row
 * as u8 (w + 128, shuffled into lane order once, at load), then, after all
 * groups, the rows' four f16 block scales per group.  So a group costs no
 * shuffle and no xor, and the tile below runs 4 rows x NC vectors: each
 * activation load (corr, LO, HI, scale) serves four rows and each weight
 * register NC vectors.  Per (row, vector, group) the arithmetic is the
 * grouped kernel's, op for op — corr + LO.lo + HI.hi in int32 (exact in any
 * order), one cvt, dw * dx, one FMA into the same 16 lanes, and the same
 * reduce_add_ps at the end — so a packed matmul gives the very bits of the
 * unpacked one, for every n and whatever the tiling: chunked prefill equals
 * one prefill, and decode equals prefill, as before.  Zero-padded tail
 * blocks (qs 0 -> u8 128 against zero activations, d 0) reproduce the
 * grouped kernel's stand-in blocks. */
#define KS_MM_P4_ROWS 4
#define KS_MM_P4_PF 6144 /* software prefetch distance in the panel's quants, bytes */

KS_MM_INL void KS_MM_SFX(ks_mm_q8_0p_body)(const uint8_t *panel, int64_t ng, int64_t g0, int64_t g1,
                                           const uint8_t *xq, size_t xs, float *accio, float *y, int64_t ys,
                                           int nr, const int NC, const bool Q4) {
    const size_t gbytes = Q4 ? 256 : 512; /* quant bytes of a panel group */
    const uint8_t *qb = panel + (size_t)g0 * gbytes;
    const uint64_t *sb = (const uint64_t *)(panel + (size_t)ng * gbytes); /* [ng][4 rows] 4 x f16 */
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512 acc[KS_MM_P4_ROWS][4];
    _Pragma("GCC unroll 4") for (int r = 0; r < KS_MM_P4_ROWS; r++)
        _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) acc[r][c] =
            g0 ? _mm512_load_ps(accio + 16 * (4 * r + c)) : _mm512_setzero_ps();
    for (int64_t g = g0; g < g1; g++, qb += gbytes) {
        __m512i lo[KS_MM_P4_ROWS], hi[KS_MM_P4_ROWS];
        __m512 dw[KS_MM_P4_ROWS];
        /* decode streams the panel from DRAM: ~6 KiB ahead covers its latency at one core's
         * share of the bandwidth (the file-layout kernel prefetches 4.3 KiB ahead per row) */
        _Pragma("GCC unroll 4") for (int l = 0; l < 4; l++) _mm_prefetch((const char *)(qb + KS_MM_P4_PF + 64 * l), _MM_HINT_T0);
        if (!Q4) _Pragma("GCC unroll 4") for (int l = 4; l < 8; l++) _mm_prefetch((const char *)(qb + KS_MM_P4_PF + 64 * l), _MM_HINT_T0);
        if (!(g & 1)) _mm_prefetch((const char *)(sb + 4 * g + 4 * KS_MM_P4_PF / gbytes), _MM_HINT_T0); /* the scales' stream */
        _Pragma("GCC unroll 4") for (int r = 0; r < KS_MM_P4_ROWS; r++) {
            if (Q4) { /* 128-bit lane k: block 4g+k's 16 packed bytes; nibbles are u8 w + 8 */
                const __m512i z = _mm512_loadu_si512((const void *)(qb + 64 * r));
                lo[r] = _mm512_and_si512(z, m4);
                hi[r] = _mm512_and_si512(_mm512_srli_epi16(z, 4), m4);
            } else {
                lo[r] = _mm512_loadu_si512((const void *)(qb + 64 * r)); /* GGUF data is 32-byte aligned */
                hi[r] = _mm512_loadu_si512((const void *)(qb + 256 + 64 * r));
            }
            dw[r] = KS_MM_SFX(ks_mm_dw4)(sb[4 * g + r]);
        }
        _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) {
            const uint8_t *xg = xq + c * xs + (size_t)g * KS_MM_Q8X_GROUP;
            const __m512i corr = _mm512_load_si512((const void *)(xg + 192));
            const __m512 dx = _mm512_load_ps((const void *)(xg + 128));
            _Pragma("GCC unroll 4") for (int r = 0; r < KS_MM_P4_ROWS; r++) {
                __m512i p = _mm512_dpbusd_epi32(corr, lo[r], _mm512_load_si512((const void *)xg));
                p = _mm512_dpbusd_epi32(p, hi[r], _mm512_load_si512((const void *)(xg + 64)));
                acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dw[r], dx), acc[r][c]);
            }
        }
    }
    if (g1 < ng) { /* more K-blocks follow: park the lanes exactly */
        _Pragma("GCC unroll 4") for (int r = 0; r < KS_MM_P4_ROWS; r++)
            _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) _mm512_store_ps(accio + 16 * (4 * r + c), acc[r][c]);
        return;
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < KS_MM_P4_ROWS; r++)
        if (r < nr) _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) y[c * ys + r] = _mm512_reduce_add_ps(acc[r][c]);
}

/* One panel (nr <= 4 valid rows) times nc (1..4) vectors over groups
 * [g0, g1) of its ng: lanes start from zero (g0 == 0) or accio, and end in
 * accio (g1 < ng: a K-block of a long row, so that a tile's activations stay
 * in L1) or, reduced, in y[c*ys + r].  accio: 64-byte aligned, 4 x 4 x 16
 * floats.  Splitting K changes nothing in the arithmetic: each lane's FMA
 * chain runs in the same order, parked in memory between blocks. */
KS_MM_FN void KS_MM_SFX(ks_mm_q8_0p)(const uint8_t *panel, int64_t ng, int64_t g0, int64_t g1, const uint8_t *xq,
                                     size_t xs, int nc, float *accio, float *y, int64_t ys, int nr) {
    KS_ASSERT(((uintptr_t)xq & 63) == 0 && (xs & 63) == 0 && ((uintptr_t)accio & 63) == 0);
    switch (nc) {
    case 4: KS_MM_SFX(ks_mm_q8_0p_body)(panel, ng, g0, g1, xq, xs, accio, y, ys, nr, 4, false); break;
    case 3: KS_MM_SFX(ks_mm_q8_0p_body)(panel, ng, g0, g1, xq, xs, accio, y, ys, nr, 3, false); break;
    case 2: KS_MM_SFX(ks_mm_q8_0p_body)(panel, ng, g0, g1, xq, xs, accio, y, ys, nr, 2, false); break;
    default: KS_MM_SFX(ks_mm_q8_0p_body)(panel, ng, g0, g1, xq, xs, accio, y, ys, nr, 1, false); break;
    }
}

/* The same tile over a packed Q4_0 panel (per group: each row's 64 bytes,
 * 128-bit lane k = block 4g+k's packed nibbles, then the scales): the
 * grouped Q4_0 kernel's arithmetic, so the same bits as unpacked Q4_0. */
KS_MM_FN void KS_MM_SFX(ks_mm_q4_0p)(const uint8_t *panel, int64_t ng, int64_t g0, int64_t g1, const uint8_t *xq,
                                     size_t xs, int nc, float *accio, float *y, int64_t ys, int nr) {
    KS_ASSERT(((uintptr_t)xq & 63) == 0 && (xs & 63) == 0 && ((uintptr_t)accio & 63) == 0);
    switch (nc) {
    case 4: KS_MM_SFX(ks_mm_q8_0p_body)(panel, ng, g0, g1, xq, xs, accio, y, ys, nr, 4, true); break;
    case 3: KS_MM_SFX(ks_mm_q8_0p_body)(panel, ng, g0, g1, xq, xs, accio, y, ys, nr, 3, true); break;
    case 2: KS_MM_SFX(ks_mm_q8_0p_body)(panel, ng, g0, g1, xq, xs, accio, y, ys, nr, 2, true); break;
    default: KS_MM_SFX(ks_mm_q8_0p_body)(panel, ng, g0, g1, xq, xs, accio, y, ys, nr, 1, true); break;
    }
}


/* ------------------------- Q8_0 transposed panels (the prefill GEMM tile) --
 * Why a second packed form.  The grouped kernels above finish every (row,
 * vector, 4 blocks) with an int->float conversion, a scale multiply and an
 * FMA, and on this core the multiply and the FMA share the two vector pipes
 * that run vpdpbusd: two of every four pipe slots go to the epilogue, which
 * caps them near half the int8 peak (tools/microbench/vnni_peak.c).  Here
 * sixteen rows form a panel stored transposed by 4-byte groups (zmm k of
 * block b: lane r = bytes 4k..4k+3 of row r's block b, as u8 w + 128), so
 * that a vector's activations enter as broadcast dwords and each lane of the
 * accumulator is one row: a block costs eight vpdpbusd for sixteen rows,
 * then ONE conversion, multiply and FMA for all sixteen, and no horizontal
 * reduction is ever needed (the lanes are the outputs).
 *
 * The arithmetic per output (row r, vector c) is fixed and sequential:
 *   acc = 0; for b in blocks: p = corr_c[b] + sum_i (w + 128) x  (int32, exact)
 *                             acc = fma((float)p, dw_r[b] * dx_c[b], acc)
 * whatever the tile, the chunk or the number of vectors, so decode and
 * prefill, chunked or not, give the same bits (tests/test_matmul.c checks it
 * against a scalar emulation).  dx_c[b] is a power of two, so the product
 * dw * dx is an integer add on dw's exponent (ks_mm_scale_pow2), off the
 * pipes that run vpdpbusd.  That is where it differs from the file-layout
 * kernels, beyond float rounding: they quantize activations with the scale
 * amax / 127, these with the next power of two up, a step up to twice as
 * coarse (ks_mm_quantize_q8t; docs/BENCHMARKS.md has what it costs).
 *
 * Partner per vector (ks_mm_quantize_q8t): per block a 40-byte record of
 * int8 q[32] in element order, int32 ex (log2 dx << 23) and int32 corr =
 * -128 * sum of the block's q (the +128 of the u8 weights taken off
 * exactly); the vector starts 64-byte aligned (matmul.c, ks_mm_q8t_stride,
 * says why the three are interleaved). */
/* The distance: the GEMV alone (8192 x 2048 Q8_0, one vector, weights
 * rotated over 8 copies so that every call reads DRAM, 2 threads, packed
 * against the file layout per core-second, alternated in one process,
 * 2026-11-27, host shared): 4 KiB 0.90-1.04 of the file layout (median
 * ~1.0), 2 KiB 0.91-1.08, 8 KiB 0.85-0.91, 32 KiB 0.87-0.93; at 2048 x 8192
 * 4 KiB 1.03-1.10 against 32 KiB's 0.93-1.06.  Far ahead, prefetches seem to wait
 * for miss buffers the demand loads need (perf's samples gather right after
 * the prefetches); 4 KiB is also about the file-layout kernel's distance.
 * (An earlier 6 KiB trial that trailed the file layout by up to 25% in
 * decode ran while each panel still began on a DRAM miss for its scales.) */
#ifndef KS_MM_P16_PF_HINT
#define KS_MM_P16_PF_HINT _MM_HINT_T0
#endif
#ifndef KS_MM_P16_PF
#define KS_MM_P16_PF 4096 /* software prefetch distance in a panel's quants, bytes (decode reads them from DRAM): see above */
#endif

/* dw * 2^k, with ex = k << 23 from the activations' quantizer
 * (ks_mm_quantize_q8t): an integer add on the exponent field, exact for
 * every finite nonzero dw (the quantizer's clamp keeps the result normal);
 * a zero dw gives a tiny nonzero scale, but its block's quants were zeroed
 * at packing (ks_mm_pack_p16), so the block's sum it multiplies is 0. */
KS_MM_INL __m512 KS_MM_SFX(ks_mm_scale_pow2)(__m512 dw, int32_t ex) {
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(dw), _mm512_set1_epi32(ex)));
}

KS_MM_INL void KS_MM_SFX(ks_mm_q8_0t_body)(const uint8_t *panel, int64_t nb, const uint8_t *xq, size_t xs,
                                           float *y, int64_t ys, const int NC) {
    const uint16_t *sd = (const uint16_t *)(panel + (size_t)nb * 512); /* [nb][16] f16 */
    __m512 acc[8];
    _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *wb = panel + (size_t)b * 512;
        _Pragma("GCC unroll 8") for (int l = 0; l < 8; l++) _mm_prefetch((const char *)(wb + KS_MM_P16_PF + 64 * l), KS_MM_P16_PF_HINT);
        /* the scales: the next panel's, one line per two blocks, so that a panel never starts on
         * a DRAM miss (4 KiB ahead in the own scale stream ran past a 2048-column panel's 2 KiB
         * of scales, and the next panel's came from DRAM at its first block) */
        if (!(b & 1)) _mm_prefetch((const char *)((uintptr_t)sd + (size_t)nb * 544 + 32 * (size_t)b), _MM_HINT_T0);
        __m512i W[8];
        _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) W[k] = _mm512_loadu_si512((const void *)(wb + 64 * k));
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sd + 16 * b)));
        _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) {
            const uint8_t *xr = xq + c * xs + (size_t)b * KS_MM_Q8T_REC; /* block b's record */
            const int32_t *qd = (const int32_t *)xr;
            /* two dpbusd chains of four (latency), joined exactly in int32 */
            __m512i p = _mm512_set1_epi32(*(const int32_t *)(xr + KS_MM_Q8T_CORR)), p1 = _mm512_setzero_si512();
            _Pragma("GCC unroll 4") for (int k = 0; k < 8; k += 2) {
                p = _mm512_dpbusd_epi32(p, W[k], _mm512_set1_epi32(qd[k]));
                p1 = _mm512_dpbusd_epi32(p1, W[k + 1], _mm512_set1_epi32(qd[k + 1]));
            }
            p = _mm512_add_epi32(p, p1);
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), KS_MM_SFX(ks_mm_scale_pow2)(dw, *(const int32_t *)(xr + KS_MM_Q8T_EX)),
                                     acc[c]);
        }
    }
    _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) _mm512_storeu_ps(y + c * ys, acc[c]);
}

/* One 16-row panel times nc (1..8) vectors: y[c*ys + r], r < 16. */
KS_MM_FN void KS_MM_SFX(ks_mm_q8_0t)(const uint8_t *panel, int64_t nb, const uint8_t *xq, size_t xs, int nc, float *y,
                                     int64_t ys) {
    switch (nc) {
    case 8: KS_MM_SFX(ks_mm_q8_0t_body)(panel, nb, xq, xs, y, ys, 8); break;
    case 7: KS_MM_SFX(ks_mm_q8_0t_body)(panel, nb, xq, xs, y, ys, 7); break;
    case 6: KS_MM_SFX(ks_mm_q8_0t_body)(panel, nb, xq, xs, y, ys, 6); break;
    case 5: KS_MM_SFX(ks_mm_q8_0t_body)(panel, nb, xq, xs, y, ys, 5); break;
    case 4: KS_MM_SFX(ks_mm_q8_0t_body)(panel, nb, xq, xs, y, ys, 4); break;
    case 3: KS_MM_SFX(ks_mm_q8_0t_body)(panel, nb, xq, xs, y, ys, 3); break;
    case 2: KS_MM_SFX(ks_mm_q8_0t_body)(panel, nb, xq, xs, y, ys, 2); break;
    default: KS_MM_SFX(ks_mm_q8_0t_body)(panel, nb, xq, xs, y, ys, 1); break;
    }
}

/* KS_MM_T2_NP adjacent transposed panels (2: 32 rows) times nc
 * (1..KS_MM_T2_NC) vectors, the prefill tile.  Why: with one panel in
 * registers every vpdpbusd needs its own broadcast of four activation bytes,
 * about 1.2 loads per vpdpbusd with the weights and the scales, and the
 * kernel ran at 57-64% of the register-only peak.  Here the loop over the
 * block's eight dword columns k is outermost: one weight load per panel and
 * column, and each broadcast serves both panels (about 0.6 loads per
 * vpdpbusd).  Registers: 2 x NP x nc accumulators (int32 p and f32 acc)
 * + NP weights + 1 broadcast + scales: NP = 2, nc = 6 fits the 32 zmm
 * without spills (3 x 4 and 3 x 5 measured no faster).
 *
 * What bounds it: per 16 rows, vector and block the arithmetic needs 8
 * vpdpbusd, the scale dw x dx and 1 FMA, and on this core the FMA (and a
 * float multiply) runs on the two pipes that run vpdpbusd, the int->float
 * conversion and integer adds do not.  With exact scales dw x dx is a
 * multiply, each one used once (no sharing), which capped the tile at 8 / 10
 * of those pipes' slots: 80% of the register-only peak (measured 80.0-80.6%,
 * tools/microbench/vnni_peak.c), and the tile ran at 85-88% of that.  With
 * the activations' power-of-two scales it is an exponent add, and the
 * ceiling rises toward 8 / 9 (vnni_peak.c's "pow2" line measures the mix;
 * the tile's gain is in docs/BENCHMARKS.md).
 *
 * The arithmetic per output is exactly ks_mm_q8_0t's (the int32 sum is
 * exact in any order; the float steps per block are the same ops in the
 * same order), so the two kernels give the same bits (tests/test_matmul.c
 * compares both with the scalar emulation). */
#ifndef KS_MM_T2_NP
#define KS_MM_T2_NP 2 /* panels per tile */
#endif
#ifndef KS_MM_T2_NC
#define KS_MM_T2_NC 6 /* vectors per tile */
#endif

KS_MM_INL void KS_MM_SFX(ks_mm_q8_0t2_body)(const uint8_t *panel, size_t panel_bytes, int64_t nb, const uint8_t *xq,
                                            size_t xs, const uint8_t *xnext, float *y, int64_t ys, const int NC) {
    enum { NP = KS_MM_T2_NP };
    __m512 acc[NP][KS_MM_T2_NC];
    _Pragma("GCC unroll 8") for (int j = 0; j < NP; j++) _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) acc[j][c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m512i p[NP][KS_MM_T2_NC];
        const uint8_t *xr = xq + (size_t)b * KS_MM_Q8T_REC; /* vector c's record of block b: xr + c * xs */
        /* the next tile's activations: each line once, at the first record that starts in it */
        if (xnext && (((size_t)b * KS_MM_Q8T_REC) & 63) < KS_MM_Q8T_REC)
            _Pragma("GCC unroll 8") for (int c = 0; c < KS_MM_T2_NC; c++) _mm_prefetch((const char *)(xnext + c * xs + (size_t)b * KS_MM_Q8T_REC), _MM_HINT_T0);
        _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) {
            p[0][c] = _mm512_set1_epi32(*(const int32_t *)(xr + c * xs + KS_MM_Q8T_CORR));
            _Pragma("GCC unroll 8") for (int j = 1; j < NP; j++) p[j][c] = p[0][c];
        }
        _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) {
            __m512i w[NP];
            _Pragma("GCC unroll 8") for (int j = 0; j < NP; j++) w[j] = _mm512_loadu_si512((const void *)(panel + j * panel_bytes + (size_t)b * 512 + 64 * k));
            _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) {
                const __m512i xk = _mm512_set1_epi32(((const int32_t *)(xr + c * xs))[k]);
                _Pragma("GCC unroll 8") for (int j = 0; j < NP; j++) p[j][c] = _mm512_dpbusd_epi32(p[j][c], w[j], xk);
            }
        }
        __m512 dw[NP];
        _Pragma("GCC unroll 8") for (int j = 0; j < NP; j++)
            dw[j] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(panel + j * panel_bytes + (size_t)nb * 512 + 32 * (size_t)b)));
        _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) {
            const int32_t ex = *(const int32_t *)(xr + c * xs + KS_MM_Q8T_EX);
            _Pragma("GCC unroll 8") for (int j = 0; j < NP; j++)
                acc[j][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p[j][c]), KS_MM_SFX(ks_mm_scale_pow2)(dw[j], ex), acc[j][c]);
        }
    }
    _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) _Pragma("GCC unroll 8") for (int j = 0; j < NP; j++) _mm512_storeu_ps(y + c * ys + 16 * j, acc[j][c]);
}

/* Panels p .. p + KS_MM_T2_NP - 1 (panel_bytes apart) times nc (1..KS_MM_T2_NC)
 * vectors: y[c*ys + r], r < 16 * KS_MM_T2_NP; xnext (or NULL): the next
 * tile's activations, prefetched. */
KS_MM_FN void KS_MM_SFX(ks_mm_q8_0t2)(const uint8_t *panel, size_t panel_bytes, int64_t nb, const uint8_t *xq, size_t xs,
                                      const uint8_t *xnext, int nc, float *y, int64_t ys) {
    switch (nc) {
#if KS_MM_T2_NC >= 8
    case 8: KS_MM_SFX(ks_mm_q8_0t2_body)(panel, panel_bytes, nb, xq, xs, xnext, y, ys, 8); break;
#endif
#if KS_MM_T2_NC >= 7
    case 7: KS_MM_SFX(ks_mm_q8_0t2_body)(panel, panel_bytes, nb, xq, xs, xnext, y, ys, 7); break;
#endif
#if KS_MM_T2_NC >= 6
    case 6: KS_MM_SFX(ks_mm_q8_0t2_body)(panel, panel_bytes, nb, xq, xs, xnext, y, ys, 6); break;
#endif
#if KS_MM_T2_NC >= 5
    case 5: KS_MM_SFX(ks_mm_q8_0t2_body)(panel, panel_bytes, nb, xq, xs, xnext, y, ys, 5); break;
#endif
#if KS_MM_T2_NC >= 4
    case 4: KS_MM_SFX(ks_mm_q8_0t2_body)(panel, panel_bytes, nb, xq, xs, xnext, y, ys, 4); break;
#endif
    case 3: KS_MM_SFX(ks_mm_q8_0t2_body)(panel, panel_bytes, nb, xq, xs, xnext, y, ys, 3); break;
    case 2: KS_MM_SFX(ks_mm_q8_0t2_body)(panel, panel_bytes, nb, xq, xs, xnext, y, ys, 2); break;
    default: KS_MM_SFX(ks_mm_q8_0t2_body)(panel, panel_bytes, nb, xq, xs, xnext, y, ys, 1); break;
    }
}

#undef KS_MM_FN
#undef KS_MM_INL
#endif /* KS_MM_LEVEL >= 2 */

#if KS_MM_LEVEL < 2
#define KS_MM_FN static __attribute__((target(KS_MM_TGT)))
#define KS_MM_INL static inline __attribute__((target(KS_MM_TGT), always_inline))
/* ---------------------------------- AVX2 eight-row Q4_K prefill tile ---
 * Why: the one-row kernels (matmul_x86_kquant.c, matmul_x86_types.c) spend, per
 * 32 weights, row and vector, a maddubs AND a madd (the sub-block scale), two of the two
 * integer-multiply pipes' slots, and per (row, vector, super-block) an
 * epilogue of about ten ops (the mins, two conversions, two FMAs) and at
 * the end a horizontal sum: measured, they ran far below the multiply
 * bound.  Here eight rows are transposed into the lanes of a ymm, 4 bytes
 * each (lane r = 4 consecutive weights of row r), so a vector's activations
 * enter as one broadcast dword (a load, no ALU op) and:
 *   - the int16 pair sums of a sub-block's 8 dword groups are added in int16
 *     before one madd with the scales of 8 rows (Q4_K weights are 0..15 and
 *     activations |a| <= 127, so 8 maddubs outputs sum to at most
 *     8 * 2 * 15 * 127 = 30480 < 32767: exact), one multiply-pipe op per
 *     32 MACs instead of two;
 *   - the epilogue (mins, conversions, FMAs) runs once per 8 rows, and the
 *     lanes are the outputs: no horizontal sum, one 8-float store.
 * The rows stay as the file stores them (no repacking, no memory, decode
 * untouched): each 16 bytes of 8 rows are transposed in registers (two
 * 128-bit loads per pair of rows r, r + 4 and an in-lane 4 x 4 dword
 * transpose, 16 ops per 8 x 32 bytes), shared by the tile's vectors.  The
 * 6-bit scales of the 8 rows are decoded in SIMD too (llama.cpp's k-quant
 * mask formulas on the transposed header dwords).
 * Arithmetic per output (row r, vector c), whatever n, the tiling or the
 * thread: acc = 0; per super-block b, in order:
 *     acc = fma((float)isum, d * da, acc); acc = fma(-(float)msum, dmin * da, acc)
 * with isum = sum_s sc_s * (q_s . a_s) and msum = sum_s m_s * bsum_s exact
 * int32 (tests/test_matmul.c emulates it in scalar C, bit for bit).  The
 * AVX2 one-row kernels (matmul_x86_kquant.c, ks_mm_hsum2_i32) follow the same
 * order, so a product of n >= KS_MM_PAIR_N vectors (prefill) and one of
 * fewer (decode, the rows past the last whole eight) give the same bits. */
KS_MM_INL __m256i KS_MM_SFX(ks_mm_t8_load)(const uint8_t *p0, const uint8_t *p4) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p0)),
                                   _mm_loadu_si128((const __m128i *)p4), 1);
}

/* The 16 bytes at offset off of rows 0..7 (row r at w + r * wrow + off) as
 * four ymm: T[k] lane r = dword k of row r's 16 bytes. */
KS_MM_INL void KS_MM_SFX(ks_mm_t8_transpose)(const uint8_t *w, size_t wrow, size_t off, __m256i T[4]) {
    const __m256i q0 = KS_MM_SFX(ks_mm_t8_load)(w + off, w + 4 * wrow + off);
    const __m256i q1 = KS_MM_SFX(ks_mm_t8_load)(w + wrow + off, w + 5 * wrow + off);
    const __m256i q2 = KS_MM_SFX(ks_mm_t8_load)(w + 2 * wrow + off, w + 6 * wrow + off);
    const __m256i q3 = KS_MM_SFX(ks_mm_t8_load)(w + 3 * wrow + off, w + 7 * wrow + off);
    const __m256i t0 = _mm256_unpacklo_epi32(q0, q1), t1 = _mm256_unpackhi_epi32(q0, q1);
    const __m256i t2 = _mm256_unpacklo_epi32(q2, q3), t3 = _mm256_unpackhi_epi32(q2, q3);
    T[0] = _mm256_unpacklo_epi64(t0, t2);
    T[1] = _mm256_unpackhi_epi64(t0, t2);
    T[2] = _mm256_unpacklo_epi64(t1, t3);
    T[3] = _mm256_unpackhi_epi64(t1, t3);
}

/* pshufb control: in every dword p, bytes (4p + b0, 0, 4p + b1, 0) as int16 */
KS_MM_INL __m256i KS_MM_SFX(ks_mm_t8_pick)(int b0, int b1) {
    const __m128i c = _mm_setr_epi8((char)b0, (char)0x80, (char)b1, (char)0x80, (char)(4 + b0), (char)0x80, (char)(4 + b1),
                                    (char)0x80, (char)(8 + b0), (char)0x80, (char)(8 + b1), (char)0x80, (char)(12 + b0),
                                    (char)0x80, (char)(12 + b1), (char)0x80);
    return _mm256_broadcastsi128_si256(c);
}

/* The end of a Q4_K / Q5_K super-block for one vector, eight rows in the
 * lanes (this file's tile and matmul_x86_q4k.c's groups): msum = sum_s m_s
 * bsum_s exact in int32 (mnv[t]: the rows' mins of sub-blocks 2t, 2t + 1 as
 * int16 pairs), then acc = fma(isum, d * da, acc) and acc = fma(-msum,
 * dmin * da, acc), the order of every Q4_K / Q5_K kernel of this level. */
KS_MM_INL __m256 KS_MM_SFX(ks_mm_k8_finish)(__m256 acc, __m256i isum, const __m256i mnv[4], __m256 d8, __m256 dm8,
                                            const ks_block_q8_k *a) {
    int32_t hb[8]; /* dword t: (bsum 2t, bsum 2t + 1), bsum s = the sum of sub-block s's 32 activations */
    _mm256_storeu_si256((__m256i *)hb, _mm256_hadd_epi16(_mm256_loadu_si256((const __m256i *)a->bsums),
                                                         _mm256_loadu_si256((const __m256i *)a->bsums)));
    __m256i msum = _mm256_madd_epi16(mnv[0], _mm256_set1_epi32(hb[0]));
    msum = _mm256_add_epi32(msum, _mm256_madd_epi16(mnv[1], _mm256_set1_epi32(hb[1])));
    msum = _mm256_add_epi32(msum, _mm256_madd_epi16(mnv[2], _mm256_set1_epi32(hb[4])));
    msum = _mm256_add_epi32(msum, _mm256_madd_epi16(mnv[3], _mm256_set1_epi32(hb[5])));
    const __m256 da = _mm256_set1_ps(a->d);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d8, da), acc);
    return _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_mul_ps(dm8, da), acc);
}

KS_MM_INL void KS_MM_SFX(ks_mm_q4_k8_body)(const bool Q5, const uint8_t *w, size_t wrow, const uint8_t *xq, size_t xs,
                                           int64_t cols, float *y, int64_t ys, const int NC) {
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
        _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) acc[c] =
            KS_MM_SFX(ks_mm_k8_finish)(acc[c], isum[c], mnv, d8, dm8, ((const ks_block_q8_k *)(xq + c * xs)) + b);
    }
    _Pragma("GCC unroll 8") for (int c = 0; c < NC; c++) _mm256_storeu_ps(y + c * ys, acc[c]);
}

/* Rows w .. w + 7 * wrow times nc (1..KS_MM_T8_NC) vectors: y[c * ys + r],
 * r < 8.  matmul.c's worker gives every eight-row tile up to KS_MM_T8_NC
 * vectors a call: the weight unpack per 32 bytes of eight rows (the
 * transposes, nibble masks, Q5_K's fifth bit: about 60 ops per super-block
 * and 8 rows, against ~20 per vector for the products) is then shared by
 * twice the vectors of the 4 it used to take.  The per-output arithmetic is
 * the same whatever nc, so the bits are too. */
KS_MM_FN void KS_MM_SFX(ks_mm_q4_k8)(const uint8_t *w, size_t wrow, const uint8_t *xq, size_t xs, int nc, int64_t cols,
                                     float *y, int64_t ys) {
    KS_MM_T8_SWITCH(KS_MM_SFX(ks_mm_q4_k8_body), false, w, wrow, xq, xs, cols, y, ys)
}

/* The same tile over Q5_K rows (the fifth bit plane OR'ed in; weights 0..31,
 * so 4 maddubs outputs sum to at most 4 * 2 * 31 * 127 = 31496 in int16,
 * exact): the same per-output arithmetic as the Q4_K tile. */
KS_MM_FN void KS_MM_SFX(ks_mm_q5_k8)(const uint8_t *w, size_t wrow, const uint8_t *xq, size_t xs, int nc, int64_t cols,
                                     float *y, int64_t ys) {
    KS_MM_T8_SWITCH(KS_MM_SFX(ks_mm_q4_k8_body), true, w, wrow, xq, xs, cols, y, ys)
}

/* The eight-row tile over Q6_K rows.  Weights are 0..63 (the -32 offset
 * taken off once per super-block as 32 * sum_s sc_s * bsum_s, as in
 * ks_mm_q6_k), so two maddubs outputs sum to at most 2 * 2 * 63 * 127 =
 * 32004 in int16 and a 16-weight sub-block (4 dword groups) takes two
 * madds with its signed scale.  Per output, per super-block:
 *     acc = fma((float)(isum - 32 * corr), d * da, acc)
 * isum = sum_s sc_s (q_s . a_s), corr = sum_s sc_s bsum_s, exact int32. */
KS_MM_INL void KS_MM_SFX(ks_mm_q6_k8_body)(const uint8_t *w, size_t wrow, const uint8_t *xq, size_t xs, int64_t cols,
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

KS_MM_FN void KS_MM_SFX(ks_mm_q6_k8)(const uint8_t *w, size_t wrow, const uint8_t *xq, size_t xs, int nc, int64_t cols,
                                     float *y, int64_t ys) {
    KS_MM_T8_SWITCH(KS_MM_SFX(ks_mm_q6_k8_body), w, wrow, xq, xs, cols, y, ys)
}

/* ------------------------------------- AVX2 two-row float-weight tile --
 * Why: the one-row float kernel keeps one FMA chain per vector, four at
 * most, and on Zen 3 an FMA has 4 cycles of latency on 2 pipes, so four
 * chains fill half of them: a prefill product over f16 weights (the f16
 * expert down projections of deepseek-v2-lite files, 1408 columns, which no
 * 256-block type divides) ran at half the FMA peak.  Two rows give eight
 * chains, and each activation load serves two rows.  Each (row, vector)
 * chain is the one-row kernel's, op for op (the same loads, the same FMA
 * order, the same hsum8 and scalar tail), so the bits are the same. */
#define KS_MM_F2(name, WT, LOADW, CVT1)                                                                           \
    KS_MM_INL void KS_MM_SFX(name##_body)(const uint8_t *w, size_t wrow, const uint8_t *xq, size_t xs, int64_t cols,  \
                                          float *y, int64_t ys, const int NC) {                                    \
        const WT *w0 = (const WT *)w, *w1 = (const WT *)(w + wrow);                                                \
        __m256 acc0[4], acc1[4];                                                                                   \
        _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) acc0[c] = acc1[c] = _mm256_setzero_ps();             \
        int64_t i = 0;                                                                                             \
        for (; i + 8 <= cols; i += 8) {                                                                            \
            const __m256 v0 = LOADW(w0 + i), v1 = LOADW(w1 + i);                                                   \
            _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) {                                                 \
                const __m256 x = _mm256_loadu_ps((const float *)(xq + c * xs) + i);                                \
                acc0[c] = _mm256_fmadd_ps(v0, x, acc0[c]);                                                         \
                acc1[c] = _mm256_fmadd_ps(v1, x, acc1[c]);                                                         \
            }                                                                                                      \
        }                                                                                                          \
        _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++) {                                                     \
            const float *x = (const float *)(xq + c * xs);                                                         \
            float s0 = KS_MM_SFX(ks_mm_hsum8)(acc0[c]), s1 = KS_MM_SFX(ks_mm_hsum8)(acc1[c]);                       \
            for (int64_t k = i; k < cols; k++) s0 += CVT1(w0[k]) * x[k];                                           \
            for (int64_t k = i; k < cols; k++) s1 += CVT1(w1[k]) * x[k];                                           \
            y[c * ys] = s0;                                                                                        \
            y[c * ys + 1] = s1;                                                                                    \
        }                                                                                                          \
    }                                                                                                              \
    KS_MM_FN void KS_MM_SFX(name)(const uint8_t *w, size_t wrow, const uint8_t *xq, size_t xs, int nc, int64_t cols, \
                                  float *y, int64_t ys) {                                                          \
        switch (nc) {                                                                                              \
        case 4: KS_MM_SFX(name##_body)(w, wrow, xq, xs, cols, y, ys, 4); break;                                    \
        case 3: KS_MM_SFX(name##_body)(w, wrow, xq, xs, cols, y, ys, 3); break;                                    \
        case 2: KS_MM_SFX(name##_body)(w, wrow, xq, xs, cols, y, ys, 2); break;                                    \
        default: KS_MM_SFX(name##_body)(w, wrow, xq, xs, cols, y, ys, 1); break;                                   \
        }                                                                                                          \
    }
#define KS_MM_F2_ID(x) (x)
#define KS_MM_F2_LOAD_F32(p) _mm256_loadu_ps(p)
#define KS_MM_F2_LOAD_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define KS_MM_F2_LOAD_BF16(p) \
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
KS_MM_F2(ks_mm_f32x2, float, KS_MM_F2_LOAD_F32, KS_MM_F2_ID)
KS_MM_F2(ks_mm_f16x2, ks_f16, KS_MM_F2_LOAD_F16, ks_f16_to_f32)
KS_MM_F2(ks_mm_bf16x2, ks_bf16, KS_MM_F2_LOAD_BF16, ks_bf16_to_f32)
#undef KS_MM_F2_ID
#undef KS_MM_F2_LOAD_F32
#undef KS_MM_F2_LOAD_F16
#undef KS_MM_F2_LOAD_BF16
#undef KS_MM_F2

#undef KS_MM_FN
#undef KS_MM_INL
#endif /* KS_MM_LEVEL < 2 */
#endif /* KS_MM_TEMPLATE_PASS */
