/*
 * matmul_dispatch.c — which kernel runs a product: for a weight type and a
 * SIMD level, the one-row kernel (ks_mm_kernel), the two-row form for
 * batches (ks_mm_kernel2), the AVX2 eight-row prefill tile (ks_mm_kernel8)
 * and the many-row decode form (ks_mm_kernel_rows); and the kernels' names
 * for the dispatch test (ks_matmul_kernel_name).
 *
 * Why apart from matmul.c: these are tables, one row per type and level,
 * that grow with every type or instruction set added, while the driver
 * (matmul.c) only asks them once per product; read apart, the driver's
 * loops are not interrupted by a hundred case labels, and the tables can be
 * checked against each other at a glance (every kernel a switch returns is
 * in ks_mm_names, or the dispatch test reports "?").  The kernels are static
 * functions of matmul.c's translation unit (the x86 and NEON templates are
 * included there once per level), so this file is a part of it: matmul.c
 * includes it after the kernels with KS_MM_DISPATCH_PART defined; compiled
 * on its own it is empty.
 */
#ifndef KS_MM_DISPATCH_PART
typedef int ks_matmul_dispatch_is_included_by_matmul_c; /* standalone: nothing to compile */
#else

static ks_mm_kern2 ks_mm_kernel2(ks_dtype t, ks_simd_level level) {
#if KS_MM_HAVE_X86
    if (level == KS_SIMD_AVX512 && t == KS_DTYPE_Q8_0) return ks_mm_q8_0x2_avx512;
    if (level == KS_SIMD_AVX512 && t == KS_DTYPE_Q4_0) return ks_mm_q4_0x2_avx512;
    if (level == KS_SIMD_AVX2) { /* prefill tiles, matmul_x86_panel.c */
        switch (t) {
        case KS_DTYPE_F32: return ks_mm_f32x2_avx2;
        case KS_DTYPE_F16: return ks_mm_f16x2_avx2;
        case KS_DTYPE_BF16: return ks_mm_bf16x2_avx2;
        default: break;
        }
    }
#elif KS_MM_HAVE_NEON
    if (level == KS_SIMD_NEON_I8MM) { /* smmla two-row tiles, matmul_neon.c: every quantized type */
        switch (t) {
        case KS_DTYPE_Q8_0: return ks_mm_q8_0x2_i8mm;
        case KS_DTYPE_Q4_0: return ks_mm_q4_0x2_i8mm;
        case KS_DTYPE_Q4_1: return ks_mm_q4_1x2_i8mm;
        case KS_DTYPE_Q5_0: return ks_mm_q5_0x2_i8mm;
        case KS_DTYPE_Q5_1: return ks_mm_q5_1x2_i8mm;
        case KS_DTYPE_IQ4_NL: return ks_mm_iq4_nlx2_i8mm;
        case KS_DTYPE_MXFP4: return ks_mm_mxfp4x2_i8mm;
        case KS_DTYPE_Q2_K: return ks_mm_q2_kx2_i8mm;
        case KS_DTYPE_Q3_K: return ks_mm_q3_kx2_i8mm;
        case KS_DTYPE_Q4_K: return ks_mm_q4_kx2_i8mm;
        case KS_DTYPE_Q5_K: return ks_mm_q5_kx2_i8mm;
        case KS_DTYPE_Q6_K: return ks_mm_q6_kx2_i8mm;
        case KS_DTYPE_IQ4_XS: return ks_mm_iq4_xsx2_i8mm;
        default: break;
        }
    }
#else
    (void)t, (void)level;
#endif
    return NULL;
}

/* Eight-row prefill tile (same signature as the two-row form, rows w ..
 * w + 7 * wrow, 1..KS_MM_T8_NC vectors): the AVX2 Q4_K / Q5_K / Q6_K tiles
 * of matmul_x86_panel.c, the IQ4_XS tile of matmul_x86_tiles.c, or NULL. */
static ks_mm_kern2 ks_mm_kernel8(ks_dtype t, ks_simd_level level) {
#if KS_MM_HAVE_X86
    if (level == KS_SIMD_AVX2 && t == KS_DTYPE_Q4_K) return ks_mm_q4_k8_avx2;
    if (level == KS_SIMD_AVX2 && t == KS_DTYPE_Q5_K) return ks_mm_q5_k8_avx2;
    if (level == KS_SIMD_AVX2 && t == KS_DTYPE_Q6_K) return ks_mm_q6_k8_avx2;
    if (level == KS_SIMD_AVX2 && t == KS_DTYPE_IQ4_XS) return ks_mm_iq4_xs8_avx2; /* matmul_x86_tiles.c */
#endif
    (void)t, (void)level;
    return NULL;
}

static ks_mm_kern ks_mm_kernel(ks_dtype t, ks_simd_level level) {
#if KS_MM_HAVE_X86
    if (level == KS_SIMD_AVX512) {
        switch (t) {
        case KS_DTYPE_F32: return ks_mm_f32_avx512;
        case KS_DTYPE_F16: return ks_mm_f16_avx512;
        case KS_DTYPE_BF16: return ks_mm_bf16_avx512;
        case KS_DTYPE_Q8_0: return ks_mm_q8_0x_avx512; /* grouped partner layout */
        case KS_DTYPE_Q4_0: return ks_mm_q4_0x_avx512;
        case KS_DTYPE_Q4_K: return ks_mm_q4_kz_avx512; /* zmm form */
        case KS_DTYPE_Q6_K: return ks_mm_q6_kz_avx512;
        case KS_DTYPE_Q4_1: return ks_mm_q4_1z_avx512; /* matmul_x86_types.c */
        case KS_DTYPE_Q5_0: return ks_mm_q5_0z_avx512;
        case KS_DTYPE_Q5_1: return ks_mm_q5_1z_avx512;
        case KS_DTYPE_IQ4_NL: return ks_mm_iq4_nlz_avx512;
        case KS_DTYPE_MXFP4: return ks_mm_mxfp4z_avx512;
        case KS_DTYPE_Q2_K: return ks_mm_q2_kt_avx512;
        case KS_DTYPE_Q3_K: return ks_mm_q3_kt_avx512;
        case KS_DTYPE_Q5_K: return ks_mm_q5_kz_avx512; /* zmm form */
        case KS_DTYPE_IQ4_XS: return ks_mm_iq4_xsz_avx512; /* zmm form */
        default: break;
        }
    }
    if (level == KS_SIMD_AVX2) {
        switch (t) {
        case KS_DTYPE_F32: return ks_mm_f32_avx2;
        case KS_DTYPE_F16: return ks_mm_f16_avx2;
        case KS_DTYPE_BF16: return ks_mm_bf16_avx2;
        case KS_DTYPE_Q8_0: return ks_mm_q8_0_avx2;
        case KS_DTYPE_Q4_0: return ks_mm_q4_0_avx2;
        case KS_DTYPE_Q4_K: return ks_mm_q4_k_avx2;
        case KS_DTYPE_Q6_K: return ks_mm_q6_k_avx2;
        case KS_DTYPE_Q4_1: return ks_mm_q4_1t_avx2;
        case KS_DTYPE_Q5_0: return ks_mm_q5_0t_avx2;
        case KS_DTYPE_Q5_1: return ks_mm_q5_1t_avx2;
        case KS_DTYPE_IQ4_NL: return ks_mm_iq4_nlt_avx2;
        case KS_DTYPE_MXFP4: return ks_mm_mxfp4t_avx2;
        case KS_DTYPE_Q2_K: return ks_mm_q2_kt_avx2;
        case KS_DTYPE_Q3_K: return ks_mm_q3_kt_avx2;
        case KS_DTYPE_Q5_K: return ks_mm_q5_kt_avx2;
        case KS_DTYPE_IQ4_XS: return ks_mm_iq4_xst_avx2;
        default: break;
        }
    }
#endif
#if KS_MM_HAVE_NEON
    if (level >= KS_SIMD_NEON) {
        const bool dot = level >= KS_SIMD_NEON_DOT; /* i8mm implies it (core/simd.c) */
        switch (t) {
        case KS_DTYPE_F32: return ks_mm_f32_neon;
        case KS_DTYPE_F16: return ks_mm_f16_neon;
        case KS_DTYPE_BF16: return ks_mm_bf16_neon;
        case KS_DTYPE_Q8_0: return dot ? ks_mm_q8_0_dot : ks_mm_q8_0_neon;
        case KS_DTYPE_Q4_0: return dot ? ks_mm_q4_0_dot : ks_mm_q4_0_neon;
        case KS_DTYPE_Q4_K: return dot ? ks_mm_q4_k_dot : ks_mm_q4_k_neon;
        case KS_DTYPE_Q6_K: return dot ? ks_mm_q6_k_dot : ks_mm_q6_k_neon;
        case KS_DTYPE_Q4_1: return dot ? ks_mm_q4_1_dot : ks_mm_q4_1_neon;
        case KS_DTYPE_Q5_0: return dot ? ks_mm_q5_0_dot : ks_mm_q5_0_neon;
        case KS_DTYPE_Q5_1: return dot ? ks_mm_q5_1_dot : ks_mm_q5_1_neon;
        case KS_DTYPE_IQ4_NL: return dot ? ks_mm_iq4_nl_dot : ks_mm_iq4_nl_neon;
        case KS_DTYPE_MXFP4: return dot ? ks_mm_mxfp4_dot : ks_mm_mxfp4_neon;
        case KS_DTYPE_Q2_K: return dot ? ks_mm_q2_k_dot : ks_mm_q2_k_neon;
        case KS_DTYPE_Q3_K: return dot ? ks_mm_q3_k_dot : ks_mm_q3_k_neon;
        case KS_DTYPE_Q5_K: return dot ? ks_mm_q5_k_dot : ks_mm_q5_k_neon;
        case KS_DTYPE_IQ4_XS: return dot ? ks_mm_iq4_xs_dot : ks_mm_iq4_xs_neon;
        default: break;
        }
    }
#endif
    switch (t) {
    case KS_DTYPE_F32: return ks_mm_f32_scalar;
    case KS_DTYPE_F16: return ks_mm_f16_scalar;
    case KS_DTYPE_BF16: return ks_mm_bf16_scalar;
    case KS_DTYPE_Q8_0: return ks_mm_q8_0_scalar;
    case KS_DTYPE_Q4_0: return ks_mm_q4_0_scalar;
    case KS_DTYPE_Q4_K: return ks_mm_q4_k_scalar;
    case KS_DTYPE_Q6_K: return ks_mm_q6_k_scalar;
    case KS_DTYPE_Q4_1: return ks_mm_q4_1_scalar;
    case KS_DTYPE_Q5_0: return ks_mm_q5_0_scalar;
    case KS_DTYPE_Q5_1: return ks_mm_q5_1_scalar;
    case KS_DTYPE_IQ4_NL: return ks_mm_iq4_nl_scalar;
    case KS_DTYPE_MXFP4: return ks_mm_mxfp4_scalar;
    case KS_DTYPE_Q2_K: return ks_mm_q2_k_scalar;
    case KS_DTYPE_Q3_K: return ks_mm_q3_k_scalar;
    case KS_DTYPE_Q5_K: return ks_mm_q5_k_scalar;
    case KS_DTYPE_IQ4_XS: return ks_mm_iq4_xs_scalar;
    default: KS_ASSERT(!"ks_matmul: not a weight type"); return NULL;
    }
}

static ks_mm_kernr ks_mm_kernel_rows(ks_dtype t, ks_simd_level level) {
#if KS_MM_HAVE_X86
    if (level == KS_SIMD_AVX2) {
        switch (t) {
        case KS_DTYPE_Q4_K: return ks_mm_q4_k_rows_avx2;
        case KS_DTYPE_Q5_K: return ks_mm_q5_kt_rows_avx2;
        case KS_DTYPE_Q6_K: return ks_mm_q6_k_rows_avx2;
        case KS_DTYPE_IQ4_XS: return ks_mm_iq4_xst_rows_avx2;
        default: break;
        }
    }
#endif
    (void)t, (void)level;
    return NULL;
}

/* The kernels' names, for the dispatch test (tests/test_dispatch.c): a
 * pointer-to-name table, so the name reported is the function the dispatch
 * above really returns, and a silent fall back to scalar shows. */
#define KS_MM_NAMED(fn) {(const void *)(fn), #fn}
typedef struct {
    const void *fn;
    const char *name;
} ks_mm_named;
static const ks_mm_named ks_mm_names[] = {
    KS_MM_NAMED(ks_mm_f32_scalar), KS_MM_NAMED(ks_mm_f16_scalar), KS_MM_NAMED(ks_mm_bf16_scalar),
    KS_MM_NAMED(ks_mm_q8_0_scalar), KS_MM_NAMED(ks_mm_q4_0_scalar), KS_MM_NAMED(ks_mm_q4_k_scalar),
    KS_MM_NAMED(ks_mm_q6_k_scalar), KS_MM_NAMED(ks_mm_q4_1_scalar), KS_MM_NAMED(ks_mm_q5_0_scalar),
    KS_MM_NAMED(ks_mm_q5_1_scalar), KS_MM_NAMED(ks_mm_iq4_nl_scalar), KS_MM_NAMED(ks_mm_q2_k_scalar),
    KS_MM_NAMED(ks_mm_q3_k_scalar), KS_MM_NAMED(ks_mm_q5_k_scalar), KS_MM_NAMED(ks_mm_iq4_xs_scalar),
    KS_MM_NAMED(ks_mm_mxfp4_scalar),
#if KS_MM_HAVE_X86
    KS_MM_NAMED(ks_mm_f32_avx512), KS_MM_NAMED(ks_mm_f16_avx512), KS_MM_NAMED(ks_mm_bf16_avx512),
    KS_MM_NAMED(ks_mm_q8_0x_avx512), KS_MM_NAMED(ks_mm_q4_0x_avx512), KS_MM_NAMED(ks_mm_q4_kz_avx512),
    KS_MM_NAMED(ks_mm_q6_kz_avx512), KS_MM_NAMED(ks_mm_q8_0x2_avx512), KS_MM_NAMED(ks_mm_q4_0x2_avx512),
    KS_MM_NAMED(ks_mm_f32_avx2), KS_MM_NAMED(ks_mm_f16_avx2), KS_MM_NAMED(ks_mm_bf16_avx2),
    KS_MM_NAMED(ks_mm_q8_0_avx2), KS_MM_NAMED(ks_mm_q4_0_avx2), KS_MM_NAMED(ks_mm_q4_k_avx2),
    KS_MM_NAMED(ks_mm_q6_k_avx2),
    /* the types of llama.cpp's mixes (matmul_x86_types.c) */
    KS_MM_NAMED(ks_mm_q4_1z_avx512), KS_MM_NAMED(ks_mm_q5_0z_avx512), KS_MM_NAMED(ks_mm_q5_1z_avx512),
    KS_MM_NAMED(ks_mm_iq4_nlz_avx512), KS_MM_NAMED(ks_mm_q2_kt_avx512), KS_MM_NAMED(ks_mm_q3_kt_avx512),
    KS_MM_NAMED(ks_mm_q5_kz_avx512), KS_MM_NAMED(ks_mm_iq4_xsz_avx512), KS_MM_NAMED(ks_mm_q4_1t_avx2),
    KS_MM_NAMED(ks_mm_q5_0t_avx2), KS_MM_NAMED(ks_mm_q5_1t_avx2), KS_MM_NAMED(ks_mm_iq4_nlt_avx2),
    KS_MM_NAMED(ks_mm_q2_kt_avx2), KS_MM_NAMED(ks_mm_q3_kt_avx2), KS_MM_NAMED(ks_mm_q5_kt_avx2),
    KS_MM_NAMED(ks_mm_iq4_xst_avx2), KS_MM_NAMED(ks_mm_mxfp4z_avx512), KS_MM_NAMED(ks_mm_mxfp4t_avx2),
    KS_MM_NAMED(ks_mm_f32x2_avx2), KS_MM_NAMED(ks_mm_f16x2_avx2),
    KS_MM_NAMED(ks_mm_bf16x2_avx2), KS_MM_NAMED(ks_mm_q4_k8_avx2), KS_MM_NAMED(ks_mm_q5_k8_avx2), KS_MM_NAMED(ks_mm_q6_k8_avx2),
    KS_MM_NAMED(ks_mm_iq4_xs8_avx2),
#endif
#if KS_MM_HAVE_NEON
    KS_MM_NAMED(ks_mm_f32_neon), KS_MM_NAMED(ks_mm_f16_neon), KS_MM_NAMED(ks_mm_bf16_neon),
    KS_MM_NAMED(ks_mm_q8_0_neon), KS_MM_NAMED(ks_mm_q4_0_neon), KS_MM_NAMED(ks_mm_q4_k_neon),
    KS_MM_NAMED(ks_mm_q6_k_neon), KS_MM_NAMED(ks_mm_q8_0_dot), KS_MM_NAMED(ks_mm_q4_0_dot),
    KS_MM_NAMED(ks_mm_q4_k_dot), KS_MM_NAMED(ks_mm_q6_k_dot), KS_MM_NAMED(ks_mm_q8_0x2_i8mm),
    KS_MM_NAMED(ks_mm_q4_0x2_i8mm), KS_MM_NAMED(ks_mm_q4_1x2_i8mm), KS_MM_NAMED(ks_mm_q5_0x2_i8mm),
    KS_MM_NAMED(ks_mm_q5_1x2_i8mm), KS_MM_NAMED(ks_mm_iq4_nlx2_i8mm), KS_MM_NAMED(ks_mm_mxfp4x2_i8mm),
    KS_MM_NAMED(ks_mm_q2_kx2_i8mm), KS_MM_NAMED(ks_mm_q3_kx2_i8mm), KS_MM_NAMED(ks_mm_q4_kx2_i8mm),
    KS_MM_NAMED(ks_mm_q5_kx2_i8mm), KS_MM_NAMED(ks_mm_q6_kx2_i8mm), KS_MM_NAMED(ks_mm_iq4_xsx2_i8mm),
#define KS_MM_NAMED_NEON_TYPE(stem) KS_MM_NAMED(stem##_neon), KS_MM_NAMED(stem##_dot)
    KS_MM_NAMED_NEON_TYPE(ks_mm_q4_1), KS_MM_NAMED_NEON_TYPE(ks_mm_q5_0), KS_MM_NAMED_NEON_TYPE(ks_mm_q5_1),
    KS_MM_NAMED_NEON_TYPE(ks_mm_iq4_nl), KS_MM_NAMED_NEON_TYPE(ks_mm_q2_k), KS_MM_NAMED_NEON_TYPE(ks_mm_q3_k),
    KS_MM_NAMED_NEON_TYPE(ks_mm_q5_k), KS_MM_NAMED_NEON_TYPE(ks_mm_iq4_xs), KS_MM_NAMED_NEON_TYPE(ks_mm_mxfp4),
#undef KS_MM_NAMED_NEON_TYPE
#endif
};
#undef KS_MM_NAMED

const char *ks_matmul_kernel_name(ks_dtype t, bool rows2) {
    const void *fn = rows2 ? (const void *)ks_mm_kernel2(t, ks_simd_current())
                           : (const void *)ks_mm_kernel(t, ks_simd_current());
    if (!fn) return NULL;
    for (size_t i = 0; i < sizeof ks_mm_names / sizeof ks_mm_names[0]; i++)
        if (ks_mm_names[i].fn == fn) return ks_mm_names[i].name;
    return "?";
}

#endif /* KS_MM_DISPATCH_PART */
