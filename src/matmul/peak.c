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
#include "matmul/matmul.h"

#include "core/simd.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#include "matmul/peak_loop.h"
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
    volatile uint32_t sink = 0; /* unsigned: the sums wrap by design */
    int64_t done = 0;
    double t0 = ks_time_sec(), t;
    do {
        sink += (uint32_t)ks_peak_dpbusd(iters, (int)done);
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
    if (ks_simd_detect() != KS_SIMD_AVX512) return 0.0; /* a vpdpbusd loop: x86 only */
    ks_peak_job job = {.seconds = seconds > 0 ? seconds : 0.2};
    ks_pool_run(pool, ks_peak_worker, &job);
    int nth = pool ? ks_pool_size(pool) : 1;
    double total = 0;
    for (int i = 0; i < nth && i < 256; i++) total += job.macs[i];
    return total;
}
