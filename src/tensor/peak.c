/*
 * peak.c — the int8 multiply-add peak of the threads of a pool, measured.
 *
 * Why measured: "the prefill GEMM runs at X% of the chip" needs a
 * denominator from this host, not a datasheet: under a hypervisor two vCPUs
 * may be hyperthreads of one core (sharing one set of VNNI pipes), and the
 * clock under load is unknown.  Every pool thread runs, at the same time, a
 * register-only vpdpbusd loop with 24 independent accumulator chains (more
 * than latency x throughput on any current core), so nothing but the
 * integer pipes limits it; each vpdpbusd is 16 lanes x 4 u8*s8 products.
 * tools/microbench/vnni_peak.c is the same loop as a stand-alone tool.
 * Without AVX-512 VNNI the probe reports 0 (no integer peak to compare to).
 */
#include "tensor/matmul.h"

#include "core/simd.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

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
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static int32_t ks_peak_dpbusd(int64_t iters, int seed) {
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
    return _mm512_reduce_add_epi32(t);
}
#define KS_PEAK_X86 1
#else
#define KS_PEAK_X86 0
#endif

typedef struct {
    double seconds;
    double macs[256]; /* per thread, MAC/s */
} ks_peak_job;

static void ks_peak_worker(void *arg, int ith, int nth) {
    (void)nth;
    ks_peak_job *job = arg;
#if KS_PEAK_X86
    const int64_t iters = 1 << 16; /* 100M MACs, ~0.4 ms */
    volatile int32_t sink = 0;
    int64_t done = 0;
    double t0 = ks_time_sec(), t;
    do {
        sink += ks_peak_dpbusd(iters, (int)done);
        done += iters;
        t = ks_time_sec();
    } while (t - t0 < job->seconds);
    (void)sink;
    if (ith < 256) job->macs[ith] = (double)done * 24.0 * 64.0 / (t - t0);
#else
    (void)job, (void)ith;
#endif
}

double ks_int8_peak_macs(ks_pool *pool, double seconds) {
    if (ks_simd_detect() < KS_SIMD_AVX512) return 0.0;
    ks_peak_job job = {.seconds = seconds > 0 ? seconds : 0.2};
    ks_pool_run(pool, ks_peak_worker, &job);
    int nth = pool ? ks_pool_size(pool) : 1;
    double total = 0;
    for (int i = 0; i < nth && i < 256; i++) total += job.macs[i];
    return total;
}
