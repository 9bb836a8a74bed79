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

#include "kvsieve_tools.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whether a level is one of x86's (AVX2, AVX-512): for the paths that exist
 * only there, where ">= KS_SIMD_AVX2" would also admit the ARM levels. */
static inline bool ks_simd_x86(ks_simd_level lv) { return lv == KS_SIMD_AVX2 || lv == KS_SIMD_AVX512; }

/* ks_simd_level, ks_simd_detect, ks_simd_name, ks_simd_current and
 * ks_simd_force are public (kvsieve_tools.h): eval and bench name the level. */

#ifdef __cplusplus
}
#endif
#endif
