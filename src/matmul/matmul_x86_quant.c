/*
 * matmul_x86_quant.c — the activation side of the x86 integer kernels:
 * f32 vectors quantized once per matmul call into what the kernels in
 * matmul_x86.c multiply against (Q8_0 blocks, Q8_K super-blocks with their
 * block sums, and at the AVX-512 level the grouped lane order of
 * ks_mm_quantize_q8x).  A template like matmul_x86.c: matmul.c includes it
 * once per level with KS_MM_SFX / KS_MM_TGT / KS_MM_LEVEL defined; compiled
 * on its own the file is empty.
 *
 * Each level must produce the very bytes the scalar quantizers produce, so
 * that a matmul's result does not depend on which level ran.
 */
#ifndef KS_MM_TEMPLATE_PASS
typedef int ks_matmul_x86_quant_is_included_by_matmul_c; /* standalone: nothing to compile */
#else

#define KS_MM_FN static __attribute__((target(KS_MM_TGT)))
#define KS_MM_INL static inline __attribute__((target(KS_MM_TGT), always_inline))

/* ------------------------------------------------ activation quantizers --
 * Same arithmetic as the scalar versions (id = 1/d in f32, x*id rounded to
 * nearest even by cvtps), so every level feeds the kernels identical bytes. */

KS_MM_INL __m256 KS_MM_SFX(ks_mm_absmax32)(const float *x, __m256 v[4]) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int k = 0; k < 4; k++) {
        v[k] = _mm256_loadu_ps(x + 8 * k);
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[k]));
    }
    return m;
}

KS_MM_INL float KS_MM_SFX(ks_mm_hmax8)(__m256 m) {
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* 32 floats times id -> 32 int8 in order; also returns the int32 vectors */
KS_MM_INL __m256i KS_MM_SFX(ks_mm_round32)(const __m256 v[4], float id, __m256i iv[4]) {
    const __m256 idv = _mm256_set1_ps(id);
    for (int k = 0; k < 4; k++) iv[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], idv));
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(iv[0], iv[1]), _mm256_packs_epi32(iv[2], iv[3]));
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

#if KS_MM_LEVEL < 2 /* AVX-512 quantizes into the grouped layout instead */
KS_MM_FN void KS_MM_SFX(ks_mm_quantize_q8)(const float *x, uint8_t *dst, int64_t cols) {
    int8_t *q = (int8_t *)dst;
    float *ds = (float *)(dst + ks_mm_align64((size_t)cols));
    for (int64_t b = 0; b < cols / 32; b++) {
        __m256 v[4];
        __m256i iv[4];
        float amax = KS_MM_SFX(ks_mm_hmax8)(KS_MM_SFX(ks_mm_absmax32)(x + 32 * b, v));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        ds[b] = d;
        _mm256_storeu_si256((__m256i *)(q + 32 * b), KS_MM_SFX(ks_mm_round32)(v, id, iv));
    }
}
#endif

KS_MM_FN void KS_MM_SFX(ks_mm_quantize_q8_k)(const float *x, uint8_t *dst, int64_t cols) {
    ks_block_q8_k *y = (ks_block_q8_k *)dst;
    for (int64_t b = 0; b < cols / KS_QK_K; b++, x += KS_QK_K) {
        __m256 v[8][4];
        __m256 m = _mm256_setzero_ps();
        for (int k = 0; k < 8; k++) m = _mm256_max_ps(m, KS_MM_SFX(ks_mm_absmax32)(x + 32 * k, v[k]));
        float amax = KS_MM_SFX(ks_mm_hmax8)(m);
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = d;
        for (int k = 0; k < 8; k++) {
            __m256i iv[4];
            _mm256_storeu_si256((__m256i *)(y[b].qs + 32 * k), KS_MM_SFX(ks_mm_round32)(v[k], id, iv));
            for (int h = 0; h < 2; h++) {
                __m256i s = _mm256_add_epi32(iv[2 * h], iv[2 * h + 1]);
                __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
                t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
                t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
                y[b].bsums[2 * k + h] = (int16_t)_mm_cvtsi128_si32(t);
            }
        }
    }
}

#if KS_MM_LEVEL >= 2
/* Grouped partner of the AVX-512 Q8_0/Q4_0 kernels (layout above the
 * kernels): same per-block arithmetic as ks_mm_quantize_q8, so the integers
 * are identical to every other level's, only placed in lane order, with the
 * expanded scale and the -off * (lane sum) weight-offset correction. */
KS_MM_FN void KS_MM_SFX(ks_mm_quantize_q8x)(const float *x, uint8_t *dst, int64_t cols, int off) {
    const int64_t nb = cols / 32, ng = (nb + 3) / 4;
    const __m256i ones = _mm256_set1_epi8(1);
    const __m128i moff = _mm_set1_epi32(-off);
    for (int64_t g = 0; g < ng; g++) {
        uint8_t *grp = dst + (size_t)g * KS_MM_Q8X_GROUP; /* [lo 64 | hi 64 | d 16 f32 | corr 16 i32] */
        for (int k = 0; k < 4; k++) {
            const int64_t b = 4 * g + k;
            __m256i q = _mm256_setzero_si256();
            float d = 0.0f;
            if (b < nb) {
                __m256 v[4];
                __m256i iv[4];
                float amax = KS_MM_SFX(ks_mm_hmax8)(KS_MM_SFX(ks_mm_absmax32)(x + 32 * b, v));
                d = amax / 127.0f;
                float id = d != 0.0f ? 1.0f / d : 0.0f;
                q = KS_MM_SFX(ks_mm_round32)(v, id, iv);
            }
            /* lane m of s: elements 4m..4m+3 (m < 4) or 16+4(m-4).. (m >= 4) */
            const __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, q);
            const __m128i lsum = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            _mm_store_si128((__m128i *)(grp + 16 * k), _mm256_castsi256_si128(q));
            _mm_store_si128((__m128i *)(grp + 64 + 16 * k), _mm256_extracti128_si256(q, 1));
            _mm_store_ps((float *)(grp + 128 + 16 * k), _mm_set1_ps(d));
            _mm_store_si128((__m128i *)(grp + 192 + 16 * k), _mm_mullo_epi32(lsum, moff));
        }
    }
}
#endif

#if KS_MM_LEVEL >= 2
/* Sixteen 16-lane vectors v[0..15] -> one vector whose lane i is the
 * reduction (OP: max or add, exact in any order for these operands) of
 * v[i]'s lanes: a transposing tree of 15 combines instead of sixteen
 * separate horizontal reductions of four steps each. */
#define KS_MM_REDUCE16(T, OP, SH4, SHP, v, out)                                                          \
    do {                                                                                                 \
        T r8[8], r4[4], r2[2];                                                                           \
        for (int i = 0; i < 8; i++) /* quarters 0,1 vs 2,3: lanes 0-7 of v[2i], 8-15 of v[2i+1] */       \
            r8[i] = OP(SH4(v[2 * i], v[2 * i + 1], 0x44), SH4(v[2 * i], v[2 * i + 1], 0xEE));           \
        for (int i = 0; i < 4; i++) /* quarter q: 4 partials of block 4i + q */                          \
            r4[i] = OP(SH4(r8[2 * i], r8[2 * i + 1], 0x88), SH4(r8[2 * i], r8[2 * i + 1], 0xDD));       \
        for (int i = 0; i < 2; i++) /* quarter q: 2 partials of blocks 8i + q, 8i + 4 + q */             \
            r2[i] = OP(SHP(r4[2 * i], r4[2 * i + 1], 0x44), SHP(r4[2 * i], r4[2 * i + 1], 0xEE));       \
        out = OP(SHP(r2[0], r2[1], 0x88), SHP(r2[0], r2[1], 0xDD)); /* lane 4q + l: block q + 4l */      \
    } while (0)
#define KS_MM_SH4F(a, b, i) _mm512_shuffle_f32x4(a, b, i)
#define KS_MM_SHPF(a, b, i) _mm512_shuffle_ps(a, b, i)
#define KS_MM_SH4I(a, b, i) _mm512_shuffle_i32x4(a, b, i)
#define KS_MM_SHPI(a, b, i) \
    _mm512_castps_si512(_mm512_shuffle_ps(_mm512_castsi512_ps(a), _mm512_castsi512_ps(b), i))

/* Partner of the transposed Q8_0 panels (matmul_x86_panel.c): int8 q[cols] in
 * element order, int32 ex[nb], int32 corr[nb] = -128 * sum of the block's q.
 *
 * The block scale is a power of two, dx = 2^k with k the least integer such
 * that amax <= 127 * 2^k (clamped to [-100, 100]), and ex = k << 23 is what
 * the panels add to the bits of a weight scale to multiply it by dx: exactly,
 * and on an integer pipe, where a float multiply would take a slot of the two
 * that run vpdpbusd (matmul_x86_panel.c, "What bounds it").  q = x * 2^-k is
 * exact before it is rounded to nearest even, and |q| <= 127.  The cost is
 * the scale's resolution: the step is up to twice amax / 127 (1.41x on a log
 * average), the error the activations' rounding adds to a product grows in
 * proportion (docs/BENCHMARKS.md, the row "Prefill GEMM with power-of-two activation
 * scales").
 *
 * ks_mm_q8t_kbias gives the biased exponent 127 + k of a block's amax from
 * its bits: amax = (1 + f) 2^e needs k = e - 6 while 1 + f <= 127 / 64
 * (f <= 63 / 64, the fraction bits <= 0x7E0000), else e - 5.  The clamp
 * keeps dw * dx a normal float for every finite f16 dw (|dw| in
 * [2^-24, 65504]), so that the bit addition is the product. */
#define KS_MM_Q8T_KB_MIN (127 - 100)
#define KS_MM_Q8T_KB_MAX (127 + 100)
static inline int32_t ks_mm_q8t_kbias(float amax) {
    uint32_t u;
    memcpy(&u, &amax, sizeof u);
    int32_t kb = (int32_t)(u >> 23) - 6 + ((u & 0x7FFFFFu) > 0x7E0000u);
    return kb < KS_MM_Q8T_KB_MIN ? KS_MM_Q8T_KB_MIN : kb > KS_MM_Q8T_KB_MAX ? KS_MM_Q8T_KB_MAX : kb;
}

/* Sixteen blocks at a time: the block maxima and the block sums come out of
 * one transposing tree each (KS_MM_REDUCE16), where a block at a time spent
 * most of its work on horizontal steps; prefill quantizes every chunk's
 * activations before each product, so this is part of the GEMM's time. */
KS_MM_FN void KS_MM_SFX(ks_mm_quantize_q8t)(const float *x, uint8_t *dst, int64_t cols) {
    const int64_t nb = cols / 32;
    /* block b's record: q at dst + 40 b, then ex and corr (matmul.c, ks_mm_q8t_stride) */
#define KS_MM_Q8T_AT(b, off) ((int32_t *)(dst + (size_t)(b) * KS_MM_Q8T_REC + (off)))
    /* lane i of a tree's result holds block (i % 4) * 4 + i / 4 */
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    int64_t b = 0;
    for (; b + 16 <= nb; b += 16) {
        const float *xb = x + 32 * b;
        __m512 m[16];
        for (int i = 0; i < 16; i++)
            m[i] = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(xb + 32 * i)), _mm512_abs_ps(_mm512_loadu_ps(xb + 32 * i + 16)));
        __m512 amax;
        KS_MM_REDUCE16(__m512, _mm512_max_ps, KS_MM_SH4F, KS_MM_SHPF, m, amax);
        amax = _mm512_permutexvar_ps(order, amax);
        const __m512i bits = _mm512_castps_si512(amax);
        __m512i kb = _mm512_sub_epi32(_mm512_srli_epi32(bits, 23), _mm512_set1_epi32(6));
        kb = _mm512_mask_add_epi32(kb, _mm512_cmpgt_epi32_mask(_mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFF)), _mm512_set1_epi32(0x7E0000)),
                                   kb, _mm512_set1_epi32(1));
        kb = _mm512_max_epi32(_mm512_min_epi32(kb, _mm512_set1_epi32(KS_MM_Q8T_KB_MAX)), _mm512_set1_epi32(KS_MM_Q8T_KB_MIN));
        int32_t exa[16], corra[16];
        _mm512_storeu_si512((void *)exa, _mm512_slli_epi32(_mm512_sub_epi32(kb, _mm512_set1_epi32(127)), 23));
        const __m512 id = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_sub_epi32(_mm512_set1_epi32(254), kb), 23));
        float ida[16];
        _mm512_storeu_ps(ida, id);
        __m512i s[16];
        for (int i = 0; i < 16; i++) {
            const __m512 idv = _mm512_set1_ps(ida[i]);
            const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + 32 * i), idv));
            const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + 32 * i + 16), idv));
            _mm_storeu_si128((__m128i *)(dst + KS_MM_Q8T_REC * (b + i)), _mm512_cvtsepi32_epi8(q0));
            _mm_storeu_si128((__m128i *)(dst + KS_MM_Q8T_REC * (b + i) + 16), _mm512_cvtsepi32_epi8(q1));
            s[i] = _mm512_add_epi32(q0, q1);
        }
        __m512i sum;
        KS_MM_REDUCE16(__m512i, _mm512_add_epi32, KS_MM_SH4I, KS_MM_SHPI, s, sum);
        _mm512_storeu_si512((void *)corra, _mm512_mullo_epi32(_mm512_permutexvar_epi32(order, sum), _mm512_set1_epi32(-128)));
        for (int i = 0; i < 16; i++) {
            *KS_MM_Q8T_AT(b + i, KS_MM_Q8T_EX) = exa[i];
            *KS_MM_Q8T_AT(b + i, KS_MM_Q8T_CORR) = corra[i];
        }
    }
    for (; b < nb; b++) { /* the last nb % 16 blocks, one at a time */
        __m256 v[4];
        __m256i iv[4];
        float amax = KS_MM_SFX(ks_mm_hmax8)(KS_MM_SFX(ks_mm_absmax32)(x + 32 * b, v));
        const int32_t kb = ks_mm_q8t_kbias(amax);
        const uint32_t idbits = (uint32_t)(254 - kb) << 23;
        float id;
        memcpy(&id, &idbits, sizeof id);
        *KS_MM_Q8T_AT(b, KS_MM_Q8T_EX) = (int32_t)((uint32_t)(kb - 127) << 23);
        _mm256_storeu_si256((__m256i *)(dst + KS_MM_Q8T_REC * b), KS_MM_SFX(ks_mm_round32)(v, id, iv));
        __m256i s = _mm256_add_epi32(_mm256_add_epi32(iv[0], iv[1]), _mm256_add_epi32(iv[2], iv[3]));
        __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
        *KS_MM_Q8T_AT(b, KS_MM_Q8T_CORR) = -128 * _mm_cvtsi128_si32(t);
    }
#undef KS_MM_Q8T_AT
}
#endif

#if KS_MM_LEVEL >= 2
#undef KS_MM_REDUCE16
#undef KS_MM_SH4F
#undef KS_MM_SHPF
#undef KS_MM_SH4I
#undef KS_MM_SHPI
#endif
#undef KS_MM_FN
#undef KS_MM_INL
#endif /* KS_MM_TEMPLATE_PASS */
