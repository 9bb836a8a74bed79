/*
 * test_dispatch.c — which kernel each hot path runs, asserted by name, so
 * that a kernel silently falling back to its scalar reference (a missed
 * feature bit, a dispatch that forgot a level, a build that compiled the
 * SIMD code out) fails a test instead of only running slower.
 *
 * The expected names follow from the CPU's level alone (ks_simd_detect()).
 * The level itself is checked against KS_EXPECT_SIMD when the environment
 * sets it: `make test-arm` runs the suite under QEMU with -cpu max
 * (expects "i8mm") and with a Cortex-A53 (expects "neon"), so feature
 * detection (core/platform.c) is under test too.  Every level up to the
 * CPU's is forced in turn and its kernels checked, on x86 and on ARM alike.
 */
#include "testutil.h"

#include "core/simd.h"
#include "attn/attn.h"
#include "matmul/matmul.h"
#include "policy/policy_util.h"
#include "spec/lrqk_math.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    ks_dtype t;
    const char *stem; /* the kernels' name stem: ks_mm_<stem>_<level> */
} k_types[] = {{KS_DTYPE_F32, "f32"},   {KS_DTYPE_F16, "f16"},   {KS_DTYPE_BF16, "bf16"}, {KS_DTYPE_Q8_0, "q8_0"},
               {KS_DTYPE_Q4_0, "q4_0"}, {KS_DTYPE_Q4_K, "q4_k"}, {KS_DTYPE_Q6_K, "q6_k"},
               /* the types of llama.cpp's mixes (index >= K_MIX) */
               {KS_DTYPE_Q4_1, "q4_1"}, {KS_DTYPE_Q5_0, "q5_0"}, {KS_DTYPE_Q5_1, "q5_1"}, {KS_DTYPE_IQ4_NL, "iq4_nl"},
               {KS_DTYPE_Q2_K, "q2_k"}, {KS_DTYPE_Q3_K, "q3_k"}, {KS_DTYPE_Q5_K, "q5_k"}, {KS_DTYPE_IQ4_XS, "iq4_xs"},
               {KS_DTYPE_MXFP4, "mxfp4"}};
#define K_MIX 7

/* The x86 kernels of the mix types (matmul_x86_types.c): "t" is the ymm
 * template at both levels, "z" the zmm forms AVX-512 has for some. */
static const char *mix_suffix(const char *stem, ks_simd_level lv) {
    if (lv == KS_SIMD_AVX2) return "t";
    return strcmp(stem, "q2_k") && strcmp(stem, "q3_k") ? "z" : "t";
}

/* The one-row kernel expected for type index ti at level lv. */
static void expected_kernel(size_t ti, ks_simd_level lv, char *buf, size_t n) {
    const char *stem = k_types[ti].stem;
    bool quant = ti >= 3, kquant = ti >= 5;
    if (ti >= K_MIX && (lv == KS_SIMD_AVX512 || lv == KS_SIMD_AVX2)) {
        snprintf(buf, n, "ks_mm_%s%s_%s", stem, mix_suffix(stem, lv), lv == KS_SIMD_AVX512 ? "avx512" : "avx2");
        return;
    }
    switch (lv) {
    case KS_SIMD_AVX512: /* grouped partner (Q8_0, Q4_0), zmm K-quants */
        snprintf(buf, n, "ks_mm_%s%s_avx512", stem, !quant ? "" : kquant ? "z" : "x");
        break;
    case KS_SIMD_AVX2: snprintf(buf, n, "ks_mm_%s_avx2", stem); break;
    case KS_SIMD_NEON: snprintf(buf, n, "ks_mm_%s_neon", stem); break;
    case KS_SIMD_NEON_DOT:
    case KS_SIMD_NEON_I8MM: snprintf(buf, n, "ks_mm_%s_%s", stem, quant ? "dot" : "neon"); break;
    default: snprintf(buf, n, "ks_mm_%s_scalar", stem); break;
    }
}

/* The level the test harness says this CPU has, if it says. */
static void test_detected_level(void **state) {
    (void)state;
    ks_simd_level hw = ks_simd_detect();
    const char *want = getenv("KS_EXPECT_SIMD");
    fprintf(stderr, "dispatch: detected level %s%s%s\n", ks_simd_name(hw), want ? ", expected " : "",
            want ? want : "");
    if (want && !getenv("KS_SIMD")) assert_string_equal(ks_simd_name(hw), want);
#if defined(__aarch64__)
    assert_true(hw >= KS_SIMD_NEON || getenv("KS_SIMD")); /* every AArch64 CPU has NEON */
#endif
}

static void test_matmul_kernels(void **state) {
    (void)state;
    ks_simd_level hw = ks_simd_detect(), saved = ks_simd_force(hw);
    for (int lv = KS_SIMD_SCALAR; lv <= (int)KS_SIMD_LEVEL_MAX; lv++) {
        if (lv != KS_SIMD_SCALAR && (lv > (int)hw || (lv >= KS_SIMD_NEON) != (hw >= KS_SIMD_NEON))) continue;
        ks_simd_force((ks_simd_level)lv);
        assert_int_equal(ks_simd_current(), lv);
        for (size_t ti = 0; ti < sizeof k_types / sizeof k_types[0]; ti++) {
            char want[64];
            expected_kernel(ti, (ks_simd_level)lv, want, sizeof want);
            const char *got = ks_matmul_kernel_name(k_types[ti].t, false);
            if (!got || strcmp(got, want)) fail_msg("%s at %s: %s, expected %s", k_types[ti].stem,
                                                    ks_simd_name((ks_simd_level)lv), got ? got : "none", want);
            /* the two-row form: AVX-512 has one for Q8_0 and Q4_0, AVX2 for the
             * float types (its prefill tiles), i8mm (smmla) for every quantized type */
            const char *got2 = ks_matmul_kernel_name(k_types[ti].t, true);
            const ks_dtype t2 = k_types[ti].t;
            bool has2 = (lv == KS_SIMD_AVX512 && (t2 == KS_DTYPE_Q8_0 || t2 == KS_DTYPE_Q4_0)) ||
                        (lv == KS_SIMD_NEON_I8MM && ti >= 3) ||
                        (lv == KS_SIMD_AVX2 && (t2 == KS_DTYPE_F32 || t2 == KS_DTYPE_F16 || t2 == KS_DTYPE_BF16));
            if (has2) {
                snprintf(want, sizeof want, "ks_mm_%sx2_%s", k_types[ti].stem,
                         lv == KS_SIMD_AVX512 ? "avx512" : lv == KS_SIMD_AVX2 ? "avx2" : "i8mm");
                if (!got2 || strcmp(got2, want)) fail_msg("%s two-row at %s: %s, expected %s", k_types[ti].stem,
                                                          ks_simd_name((ks_simd_level)lv), got2 ? got2 : "none", want);
            } else if (got2) {
                fail_msg("%s at %s: unexpected two-row kernel %s", k_types[ti].stem, ks_simd_name((ks_simd_level)lv), got2);
            }
        }
    }
    ks_simd_force(saved);
}

static void test_attention_kernels(void **state) {
    (void)state;
    ks_simd_level hw = ks_simd_detect(), saved = ks_simd_force(hw);
    const char *simd = hw == KS_SIMD_AVX512 ? "avx512"
                       : hw == KS_SIMD_AVX2 ? "avx2"
                       : hw >= KS_SIMD_NEON ? "neon"
                                            : "reference";
    for (int kt = KS_KV_F16; kt <= KS_KV_Q8; kt++) {
        assert_string_equal(ks_attention_kernel_name((ks_kv_type)kt, 64, 4), simd);
        assert_string_equal(ks_attention_kernel_name((ks_kv_type)kt, 128, 8), simd);
    }
    /* the prefill block kernel (attend.c): NEON at every ARM level; on x86 the bf16 one where the CPU has it */
    const char *blk = ks_attention_block_kernel_name(KS_KV_Q8, 128);
    if (hw >= KS_SIMD_NEON) {
        assert_string_equal(ks_attention_block_kernel_name(KS_KV_F16, 64), "neon");
        assert_non_null(blk);
        assert_string_equal(blk, "neon");
    } else if (hw == KS_SIMD_AVX2) {
        assert_non_null(blk);
        assert_string_equal(blk, "avx2");
    } else if (hw == KS_SIMD_AVX512) {
        assert_non_null(blk);
        assert_true(!strcmp(blk, "bf16") || !strcmp(blk, "avx2"));
    }
    assert_null(ks_attention_block_kernel_name(KS_KV_Q8, 48)); /* 8-bit KV needs whole blocks of 32 */
    ks_simd_force(KS_SIMD_SCALAR);
    assert_string_equal(ks_attention_kernel_name(KS_KV_F16, 64, 4), "reference");
    assert_null(ks_attention_block_kernel_name(KS_KV_F16, 64));
    ks_simd_force(saved);
}

/* Quest's page bound (policy/page_bounds.c): the SIMD form for head dims of
 * 16 and more at any vector level, scalar below 16 or when forced. */
static void test_page_bound_kernel(void **state) {
    (void)state;
    ks_simd_level hw = ks_simd_detect(), saved = ks_simd_force(hw);
    const char *simd = hw >= KS_SIMD_NEON ? "neon" : hw >= KS_SIMD_AVX2 ? "avx2" : "scalar";
    assert_string_equal(ks_page_bound_kernel_name(128), simd);
    assert_string_equal(ks_page_bound_kernel_name(8), "scalar");
    ks_simd_force(KS_SIMD_SCALAR);
    assert_string_equal(ks_page_bound_kernel_name(128), "scalar");
    ks_simd_force(saved);
}

/* Quest's every-page scoring and the top-k's sampled filter and emit
 * (policy/page_bounds.c, topk.c): the widest form at each level this CPU
 * has, NEON at every ARM level, scalar when forced. */
static void test_selection_kernels(void **state) {
    (void)state;
    ks_simd_level hw = ks_simd_detect(), saved = ks_simd_force(hw);
    for (int lv = KS_SIMD_SCALAR; lv <= (int)KS_SIMD_LEVEL_MAX; lv++) {
        if (lv != KS_SIMD_SCALAR && (lv > (int)hw || (lv >= KS_SIMD_NEON) != (hw >= KS_SIMD_NEON))) continue;
        ks_simd_force((ks_simd_level)lv);
        const char *want = lv >= KS_SIMD_NEON ? "neon" : lv == KS_SIMD_AVX512 ? "avx512" : lv == KS_SIMD_AVX2 ? "avx2" : "scalar";
        assert_string_equal(ks_topk_kernel_name(), want);
        assert_string_equal(ks_page_bounds_pages_kernel_name(64), want);
        assert_string_equal(ks_page_bounds_pages_kernel_name(128), want);
        /* hd 72: whole 8-lane chunks only (the AVX2 form, also on AVX-512 hosts) */
        assert_string_equal(ks_page_bounds_pages_kernel_name(72), lv == KS_SIMD_AVX512 ? "avx2" : want);
        assert_string_equal(ks_page_bounds_pages_kernel_name(60), "scalar");
    }
    ks_simd_force(saved);
}

/* LRQK's Gram and K_O^T A_KO update (spec/lrqk_math.c): zmm at r % 16,
 * ymm at r % 8, NEON quads at r % 4 on every ARM level, up to r = 64;
 * scalar otherwise or when forced. */
static void test_lrqk_kernel(void **state) {
    (void)state;
    ks_simd_level hw = ks_simd_detect(), saved = ks_simd_force(hw);
    const char *r32 = hw >= KS_SIMD_NEON ? "neon" : hw == KS_SIMD_AVX512 ? "avx512" : hw == KS_SIMD_AVX2 ? "avx2" : "scalar";
    assert_string_equal(ks_lrqk_gram_kao_kernel_name(32), r32);
    assert_string_equal(ks_lrqk_gram_kao_kernel_name(12), hw >= KS_SIMD_NEON ? "neon" : "scalar");
    assert_string_equal(ks_lrqk_gram_kao_kernel_name(68), "scalar");
    ks_simd_force(KS_SIMD_SCALAR);
    assert_string_equal(ks_lrqk_gram_kao_kernel_name(32), "scalar");
    ks_simd_force(saved);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_detected_level),
        cmocka_unit_test(test_matmul_kernels),
        cmocka_unit_test(test_attention_kernels),
        cmocka_unit_test(test_page_bound_kernel),
        cmocka_unit_test(test_selection_kernels),
        cmocka_unit_test(test_lrqk_kernel),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
