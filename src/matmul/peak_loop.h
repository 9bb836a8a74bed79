/*
 * peak_loop.h — the register-only loops behind the measured peaks, shared by
 * the engine's probe (peak.c, ks_int8_peak_macs) and the stand-alone tool
 * (tools/microbench/vnni_peak.c), so both measure exactly the same thing.
 * x86-64 with GCC or Clang only.
 */
#ifndef KS_MATMUL_PEAK_LOOP_H
#define KS_MATMUL_PEAK_LOOP_H

#include <immintrin.h>
#include <stdint.h>

/* 24 chains x 64 MACs per iteration; `iters` iterations.  Named variables
 * (not an array), so that the accumulators stay in registers: an array is
 * spilled and reloaded every iteration at -O2, and the stores then bound
 * the loop instead of the VNNI pipes. */
#define KS_PEAK_VARS(T) T a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21, a22, a23
#define KS_PEAK_APPLY(OP)                                                                                    \
    OP(a0); OP(a1); OP(a2); OP(a3); OP(a4); OP(a5); OP(a6); OP(a7); OP(a8); OP(a9); OP(a10); OP(a11);      \
    OP(a12); OP(a13); OP(a14); OP(a15); OP(a16); OP(a17); OP(a18); OP(a19); OP(a20); OP(a21); OP(a22); OP(a23)
#define KS_PEAK_BARRIER()                                                                                    \
    __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6), "+v"(a7)); \
    __asm__ volatile("" : "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11), "+v"(a12), "+v"(a13), "+v"(a14),     \
                     "+v"(a15));                                                                             \
    __asm__ volatile("" : "+v"(a16), "+v"(a17), "+v"(a18), "+v"(a19), "+v"(a20), "+v"(a21), "+v"(a22),   \
                     "+v"(a23))
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static inline int32_t ks_peak_dpbusd(int64_t iters, int seed) {
    KS_PEAK_VARS(__m512i);
    const __m512i u = _mm512_set1_epi8((char)(seed | 1)), s = _mm512_set1_epi8(3);
    int k = seed;
#define INIT(x) x = _mm512_set1_epi32(k++)
    KS_PEAK_APPLY(INIT);
#undef INIT
    for (int64_t it = 0; it < iters; it++) {
#define STEP(x) x = _mm512_dpbusd_epi32(x, u, s)
        KS_PEAK_APPLY(STEP);
#undef STEP
        KS_PEAK_BARRIER(); /* opaque to the compiler: the chains must really run */
    }
    __m512i t = _mm512_setzero_si512();
#define SUM(x) t = _mm512_add_epi32(t, x)
    KS_PEAK_APPLY(SUM);
#undef SUM
    /* lane 0 keeps every chain alive; _mm512_reduce_add_epi32 would add the
     * lanes as signed ints, which overflow (UB) on these sums */
    return _mm_cvtsi128_si32(_mm512_castsi512_si128(t));
}
#endif
