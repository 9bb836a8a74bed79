/*
 * vnni_peak.c — the int8 multiply-add peak of this CPU, measured with a
 * register-only vpdpbusd loop (diagnostics, not a test).
 *
 * Why it exists: "the GEMM runs at X% of the chip" needs a denominator that
 * was measured here, not taken from a datasheet: under a hypervisor the two
 * vCPUs may be two hyperthreads of one core (then two threads share one set
 * of VNNI pipes), and the clock under load is unknown.  The loop keeps
 * 24 independent zmm accumulator chains (more than latency x throughput on
 * any current core), all operands in registers, so nothing but the VNNI
 * pipes limits it.  Each vpdpbusd is 16 lanes x 4 u8*s8 = 64 multiply-adds.
 *
 * It also times the mix the Q8_0 prefill kernel runs per (row, vector,
 * 4-block group) — 2 vpdpbusd + int->float + multiply + FMA — to show how
 * much of the peak a kernel with that float epilogue can reach at best, and
 * the transposed-panel prefill tile's mix per 16 rows, vector and block
 * (8 vpdpbusd + int->float + multiply + FMA: its ceiling with exact block
 * scales; with the activations' power-of-two scales, which the engine uses,
 * the multiply is an integer add on the exponent: the "pow2" line), and
 * the f32 FMA peak (16 multiply-adds per instruction), the denominator of
 * the float weights (F16, BF16 converted to f32) and of f32 attention.
 *
 * Usage: vnni_peak [threads=2] [seconds=1]
 * Prints multiply-adds per second for 1 thread and for `threads` threads at
 * once (each thread pinned to its own CPU when possible), and per CPU-second
 * of a thread (robust to a shared host's time slicing; compare with
 * gemm_bench's "per CPU-s").
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define TGT __attribute__((target("avx512f,avx512bw,avx512vnni,avx512vl")))

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* this thread's CPU time: on a shared host the rate per CPU-second is what
 * a core does while it runs, whatever share of the wall time it gets */
static double thread_cpu(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#include "matmul/peak_loop.h" /* KS_PEAK_* and ks_peak_dpbusd: the engine's own probe loop */

TGT static int32_t dpbusd_loop(int64_t iters, int seed) { return ks_peak_dpbusd(iters, seed); }

/* The Q8_0 kernel's mix, 8 independent (row, vector) chains: per chain and
 * iteration 2 vpdpbusd (128 MACs) + cvt + mul + fma (named variables, so
 * nothing is spilled). */
TGT static float mix_loop(int64_t iters, int seed) {
    const __m512i u = _mm512_set1_epi8((char)(seed | 1)), s = _mm512_set1_epi8(3);
    const __m512 dw = _mm512_set1_ps(1e-3f), dx = _mm512_set1_ps(2e-3f);
    __m512 f0 = _mm512_setzero_ps(), f1 = f0, f2 = f0, f3 = f0, f4 = f0, f5 = f0, f6 = f0, f7 = f0;
    __m512i c0 = _mm512_set1_epi32(seed), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0;
    for (int64_t it = 0; it < iters; it++) {
#define MIX(f, c)                                                           \
    do {                                                                    \
        __m512i p = _mm512_dpbusd_epi32(c, u, s);                           \
        p = _mm512_dpbusd_epi32(p, s, u);                                   \
        f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dw, dx), f); \
    } while (0)
        MIX(f0, c0); MIX(f1, c1); MIX(f2, c2); MIX(f3, c3); MIX(f4, c4); MIX(f5, c5); MIX(f6, c6); MIX(f7, c7);
#undef MIX
        __asm__ volatile("" : "+v"(f0), "+v"(f1), "+v"(f2), "+v"(f3), "+v"(f4), "+v"(f5), "+v"(f6), "+v"(f7));
        __asm__ volatile("" : "+v"(c0), "+v"(c1), "+v"(c2), "+v"(c3), "+v"(c4), "+v"(c5), "+v"(c6), "+v"(c7));
    }
    __m512 t = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(f0, f1), _mm512_add_ps(f2, f3)),
                             _mm512_add_ps(_mm512_add_ps(f4, f5), _mm512_add_ps(f6, f7)));
    return _mm512_reduce_add_ps(t);
}

/* The transposed-panel prefill tile's mix (matmul_x86_panel.c, ks_mm_q8_0t2), per
 * 16 rows, vector and 32-value block: 8 vpdpbusd (512 MACs) + cvt + one
 * multiply of the two scales + FMA; 12 chains (2 panels x 6 vectors), the
 * weights and activations in registers.  The multiply and the FMA share the
 * pipes that run vpdpbusd, so this is the ceiling of that kernel (8 / 10 of
 * the vpdpbusd peak; measured 80.0-80.6% on the EPYC-26 host): the loads it
 * adds are what separates it from this.  dx is made opaque after each tile,
 * as the kernel's twelve products of a block are distinct: without it the
 * compiler computes two and the mix reads 85-87%. */
TGT static inline __attribute__((always_inline)) float tile_body(int64_t iters, int seed, const bool pow2) {
    __m512i w0 = _mm512_set1_epi8(1), w1 = _mm512_set1_epi8(2), w2 = _mm512_set1_epi8(3), w3 = _mm512_set1_epi8(4);
    __m512i x0 = _mm512_set1_epi32(seed), x1 = _mm512_set1_epi32(seed + 1);
    __m512 dw0 = _mm512_set1_ps(1e-3f), dw1 = _mm512_set1_ps(2e-3f), dx = _mm512_set1_ps(3e-3f);
    __m512i ex = _mm512_set1_epi32(-(3 << 23)); /* the power-of-two form's exponent add */
    __m512 f0 = _mm512_setzero_ps(), f1 = f0, f2 = f0, f3 = f0, f4 = f0, f5 = f0, f6 = f0, f7 = f0, f8 = f0, f9 = f0,
           f10 = f0, f11 = f0;
    for (int64_t it = 0; it < iters; it++) {
#define TILE(f, W0, W1, W2, W3, X, DW)                                                  \
    do {                                                                              \
        __m512i p = _mm512_dpbusd_epi32(X, W0, X);                                    \
        p = _mm512_dpbusd_epi32(p, W1, X); p = _mm512_dpbusd_epi32(p, W2, X);         \
        p = _mm512_dpbusd_epi32(p, W3, X); p = _mm512_dpbusd_epi32(p, W0, X);         \
        p = _mm512_dpbusd_epi32(p, W1, X); p = _mm512_dpbusd_epi32(p, W2, X);         \
        p = _mm512_dpbusd_epi32(p, W3, X);                                            \
        f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p),                                    \
                            pow2 ? _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(DW), ex)) \
                                 : _mm512_mul_ps(DW, dx),                                \
                            f);                                                       \
        __asm__ volatile("" : "+v"(dx), "+v"(ex)); /* each tile's scale its own (no CSE) */ \
    } while (0)
        TILE(f0, w0, w1, w2, w3, x0, dw0); TILE(f1, w2, w3, w0, w1, x0, dw1);
        TILE(f2, w0, w1, w2, w3, x1, dw0); TILE(f3, w2, w3, w0, w1, x1, dw1);
        TILE(f4, w1, w0, w3, w2, x0, dw0); TILE(f5, w3, w2, w1, w0, x0, dw1);
        TILE(f6, w1, w0, w3, w2, x1, dw0); TILE(f7, w3, w2, w1, w0, x1, dw1);
        TILE(f8, w0, w2, w1, w3, x0, dw0); TILE(f9, w1, w3, w0, w2, x0, dw1);
        TILE(f10, w0, w2, w1, w3, x1, dw0); TILE(f11, w1, w3, w0, w2, x1, dw1);
#undef TILE
        /* opaque: the scales and operands change every iteration as far as
         * the compiler knows, so the multiply cannot be hoisted */
        __asm__ volatile("" : "+v"(dw0), "+v"(dw1), "+v"(dx), "+v"(x0), "+v"(x1));
        __asm__ volatile("" : "+v"(f0), "+v"(f1), "+v"(f2), "+v"(f3), "+v"(f4), "+v"(f5), "+v"(f6), "+v"(f7));
        __asm__ volatile("" : "+v"(f8), "+v"(f9), "+v"(f10), "+v"(f11));
    }
    __m512 t = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(f0, f1), _mm512_add_ps(f2, f3)),
                             _mm512_add_ps(_mm512_add_ps(f4, f5), _mm512_add_ps(f6, f7)));
    t = _mm512_add_ps(t, _mm512_add_ps(_mm512_add_ps(f8, f9), _mm512_add_ps(f10, f11)));
    return _mm512_reduce_add_ps(t);
}

TGT static float tile_loop(int64_t iters, int seed) { return tile_body(iters, seed, false); }
/* The same tile with the activations' power-of-two scales (ks_mm_quantize_q8t):
 * dw x dx is an integer add on dw's exponent, off the vpdpbusd pipes. */
TGT static float tile_pow2_loop(int64_t iters, int seed) { return tile_body(iters, seed, true); }

/* f32 FMA peak (the float weights' denominator): 24 chains x 16 MACs. */
TGT static float fma_loop(int64_t iters, int seed) {
    KS_PEAK_VARS(__m512);
    const __m512 x = _mm512_set1_ps(1.0f + 1e-7f * (float)seed), y = _mm512_set1_ps(0.999999f);
    float k = 0;
#define INIT(v) v = _mm512_set1_ps(k++)
    KS_PEAK_APPLY(INIT);
#undef INIT
    for (int64_t it = 0; it < iters; it++) {
#define STEP(v) v = _mm512_fmadd_ps(v, x, y)
        KS_PEAK_APPLY(STEP);
#undef STEP
        KS_PEAK_BARRIER();
    }
    __m512 t = _mm512_setzero_ps();
#define SUM(v) t = _mm512_add_ps(t, v)
    KS_PEAK_APPLY(SUM);
#undef SUM
    return _mm512_reduce_add_ps(t);
}

typedef struct {
    int cpu, mode;
    double seconds, macs, macs_cpu;
    volatile int *go;
} job;

static void *worker(void *arg) {
    job *j = arg;
    if (j->cpu >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(j->cpu, &set);
        pthread_setaffinity_np(pthread_self(), sizeof set, &set);
    }
    while (!*j->go) {
    }
    const int64_t iters = 1 << 20;
    const double per = j->mode >= 3 ? 12.0 * 512 : j->mode == 2 ? 24.0 * 16 : j->mode ? 8.0 * 128 : 24.0 * 64;
    double t0 = now(), c0 = thread_cpu(), t;
    int64_t done = 0;
    volatile float sink = 0;
    do {
        sink += j->mode == 4   ? tile_pow2_loop(iters, (int)done)
                : j->mode == 3 ? tile_loop(iters, (int)done)
                : j->mode == 2 ? fma_loop(iters, (int)done)
                : j->mode  ? mix_loop(iters, (int)done)
                           : (float)dpbusd_loop(iters, (int)done);
        done += iters;
        t = now();
    } while (t - t0 < j->seconds);
    (void)sink;
    j->macs = (double)done * per / (t - t0);
    j->macs_cpu = (double)done * per / (thread_cpu() - c0);
    return NULL;
}

static double run(int nth, int mode, double seconds, double *per_cpu) {
    pthread_t th[64];
    job jobs[64];
    volatile int go = 0;
    int ncpu = (int)sysconf(_SC_NPROCESSORS_ONLN);
    for (int i = 0; i < nth; i++) {
        jobs[i] = (job){.cpu = ncpu >= nth ? i : -1, .mode = mode, .seconds = seconds, .go = &go};
        pthread_create(&th[i], NULL, worker, &jobs[i]);
    }
    go = 1;
    double total = 0, cpu = 0;
    for (int i = 0; i < nth; i++) {
        pthread_join(th[i], NULL);
        total += jobs[i].macs;
        cpu += jobs[i].macs_cpu;
    }
    *per_cpu = cpu / nth;
    return total;
}

int main(int argc, char **argv) {
    int nth = argc > 1 ? atoi(argv[1]) : 2;
    double seconds = argc > 2 ? atof(argv[2]) : 1.0;
    if (nth < 1 || nth > 64 || !(seconds > 0)) {
        fprintf(stderr, "usage: vnni_peak [threads=2] [seconds=1]\n");
        return 2;
    }
    if (!__builtin_cpu_supports("avx512vnni")) {
        fprintf(stderr, "vnni_peak: this CPU has no AVX-512 VNNI\n");
        return 1;
    }
    for (int mode = 0; mode < 5; mode++) {
        const char *name = mode == 4   ? "q8_0 tile, pow2 (8 dpbusd+cvt+add+fma)"
                           : mode == 3 ? "q8_0 panel tile (8 dpbusd+cvt+mul+fma)"
                           : mode == 2 ? "f32 vfmadd231ps register-only"
                           : mode    ? "q8_0 mix (2 dpbusd+cvt+mul+fma)"
                                     : "vpdpbusd register-only";
        double c1, cn;
        double one = run(1, mode, seconds, &c1), all = run(nth, mode, seconds, &cn);
        printf("%-40s 1 thread %7.1f G MAC/s   %d threads %7.1f G MAC/s   (per CPU-second: %.1f / %.1f)\n", name,
               one * 1e-9, nth, all * 1e-9, c1 * 1e-9, cn * 1e-9);
    }
    return 0;
}
