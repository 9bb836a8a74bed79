/*
 * simd.h — which instruction-set level the kernels dispatch on.
 *
 * Kernels carry `target` attributes instead of the library being built with
 * -march flags, so one binary runs everywhere and chooses at run time.  The
 * choice is one process-wide value: the best level the CPU has (cached,
 * capped by the KS_SIMD environment variable), unless a test forced a lower
 * one to compare a kernel against the scalar reference.  Every SIMD dispatch
 * (matmul, attention, policy scoring) reads ks_simd_current(), so forcing a
 * level moves all of them together.  It lives in core because it depends on
 * nothing but the CPU: tensor kernels, policies and the CLI all read it.
 */
#ifndef KS_CORE_SIMD_H
#define KS_CORE_SIMD_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ks_simd_level { KS_SIMD_SCALAR = 0, KS_SIMD_AVX2 = 1, KS_SIMD_AVX512 = 2 } ks_simd_level;

/* Best level this CPU supports (cached); KS_SIMD env var ("scalar", "avx2",
 * "avx512") caps it for testing. */
ks_simd_level ks_simd_detect(void);
const char *ks_simd_name(ks_simd_level level);
/* The level kernels dispatch on: the detected one unless a test forced
 * another.  Every SIMD dispatch (matmul, attention, selection) reads this. */
ks_simd_level ks_simd_current(void);
/* Force a level (tests); returns the previous one.  Not thread-safe. */
ks_simd_level ks_simd_force(ks_simd_level level);

#ifdef __cplusplus
}
#endif
#endif
