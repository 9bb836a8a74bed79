/*
 * simd.c — run-time detection of the SIMD level and the one process-wide
 * dispatch value (core/simd.h).  AVX-512 here means the subset the kernels
 * use (F, BW, VL, DQ and VNNI); AVX2 also requires FMA.  On AArch64 the
 * levels are NEON (every CPU), NEON_DOT (FEAT_DotProd: sdot) and NEON_I8MM
 * (FEAT_DotProd and FEAT_I8MM: smmla), as the OS reports them
 * (core/platform.c).  Moved out of matmul.c: matmul is one of several
 * readers.
 */
#include "core/simd.h"

#include "core/platform.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static _Atomic int ks_simd_hw = -1;  /* best level of this CPU, env-capped */
static _Atomic int ks_simd_cur = -1; /* level in use (forced or detected) */

/* Whether two levels belong to one architecture (scalar belongs to both). */
static int ks_simd_same_arch(int a, int b) {
    if (a == KS_SIMD_SCALAR || b == KS_SIMD_SCALAR) return 1;
    return (a >= KS_SIMD_NEON) == (b >= KS_SIMD_NEON);
}

ks_simd_level ks_simd_detect(void) {
    int lv = atomic_load(&ks_simd_hw);
    if (lv >= 0) return (ks_simd_level)lv;
    lv = KS_SIMD_SCALAR;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) lv = KS_SIMD_AVX2;
    if (lv == KS_SIMD_AVX2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vnni"))
        lv = KS_SIMD_AVX512;
#elif defined(__aarch64__)
    unsigned f = ks_platform_arm_features();
    if (f & KS_ARM_ASIMD) lv = KS_SIMD_NEON;
    if (lv == KS_SIMD_NEON && (f & KS_ARM_DOTPROD)) lv = KS_SIMD_NEON_DOT;
    if (lv == KS_SIMD_NEON_DOT && (f & KS_ARM_I8MM)) lv = KS_SIMD_NEON_I8MM;
#endif
    const char *env = getenv("KS_SIMD");
    if (env) {
        int cap = lv;
        if (!strcmp(env, "scalar")) cap = KS_SIMD_SCALAR;
        else if (!strcmp(env, "avx2")) cap = KS_SIMD_AVX2;
        else if (!strcmp(env, "avx512")) cap = KS_SIMD_AVX512;
        else if (!strcmp(env, "neon")) cap = KS_SIMD_NEON;
        else if (!strcmp(env, "dotprod")) cap = KS_SIMD_NEON_DOT;
        else if (!strcmp(env, "i8mm")) cap = KS_SIMD_NEON_I8MM;
        if (!ks_simd_same_arch(cap, lv)) cap = KS_SIMD_SCALAR; /* another architecture's name */
        if (cap < lv) lv = cap;
    }
    atomic_store(&ks_simd_hw, lv);
    return (ks_simd_level)lv;
}

const char *ks_simd_name(ks_simd_level level) {
    switch (level) {
    case KS_SIMD_SCALAR: return "scalar";
    case KS_SIMD_AVX2: return "avx2";
    case KS_SIMD_AVX512: return "avx512";
    case KS_SIMD_NEON: return "neon";
    case KS_SIMD_NEON_DOT: return "dotprod";
    case KS_SIMD_NEON_I8MM: return "i8mm";
    default: return "?";
    }
}

ks_simd_level ks_simd_current(void) {
    int lv = atomic_load(&ks_simd_cur);
    if (lv < 0) {
        lv = ks_simd_detect();
        atomic_store(&ks_simd_cur, lv);
    }
    return (ks_simd_level)lv;
}

ks_simd_level ks_simd_force(ks_simd_level level) {
    ks_simd_level prev = ks_simd_current();
    int hw = ks_simd_detect();
    int lv = (int)level;
    if (lv < KS_SIMD_SCALAR || lv > KS_SIMD_LEVEL_MAX || !ks_simd_same_arch(lv, hw)) lv = KS_SIMD_SCALAR;
    if (lv > hw) lv = hw; /* never run instructions the CPU lacks */
    atomic_store(&ks_simd_cur, lv);
    return prev;
}
