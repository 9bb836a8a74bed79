/*
 * attn_block_bench.c — the prefill block kernels alone: the f32 AVX-512
 * kernel (ks_attention_block_avx512, the decode kernel's bits) against the
 * bf16 one (ks_attention_block_bf16, vdpbf16ps and an online softmax),
 * alternated in one run on one thread (diagnostics, not a test).
 *
 * Why it exists: `kvsieve bench` times whole prefills, where attention
 * shares the chunk with the weight products and the host's noise.  This
 * times one task of the engine's prefill, hot: R = 16 query rows x G heads
 * of one KV head over n cached keys (pages of 32 f16 rows, the causal limits
 * n - 15 .. n), repeated, each kernel in turn, so the two see the same host.
 * It prints, per round, the best of REPS calls of each (ms), their rate in
 * multiply-adds a second (scores and values: 2 x hd per visible key per
 * query head) and the bf16 one's share of the vdpbf16ps peak (a register-only
 * loop, measured first), and the normalised RMS difference of the outputs.
 *
 * kv=q8: the same over Q8_0 rows, the f32 kernel being the one 8-bit KV takes
 * under KS_ATTN=f32 (ks_attention_block_avx2: pages dequantised to f32, a
 * score matrix) and the bf16 one ks_attention_block_bf16_kv; a third column
 * times the bf16 kernel over f16 rows of the same values, so the price of
 * converting Q8_0 tiles (against f16 ones) shows.
 *
 * Usage: attn_block_bench [n=4016] [hd=64] [G=4] [rounds=5] [kv=f16|q8]
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <immintrin.h>

#include "core/simd.h"
#include "attn/attn.h"
#include "tensor/dtype.h"

enum { R = 16, P = 32, REPS = 7 };

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float rnd(void) { /* uniform in [-1, 1) */
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) * (2.0 / 16777216.0) - 1.0);
}

/* The bf16 multiply-add peak of one core: twenty-four independent
 * vdpbf16ps chains on registers only (32 multiply-adds each), in G MAC/s. */
__attribute__((target("avx512f,avx512bf16"), noinline)) static double bf16_peak(void) {
    /* distinct starting values, or the compiler merges the identical chains */
#define Z(i) _mm512_set1_ps((float)(i))
    __m512 c0 = Z(0), c1 = Z(1), c2 = Z(2), c3 = Z(3), c4 = Z(4), c5 = Z(5), c6 = Z(6), c7 = Z(7), c8 = Z(8), c9 = Z(9),
           c10 = Z(10), c11 = Z(11), d0 = Z(12), d1 = Z(13), d2 = Z(14), d3 = Z(15), d4 = Z(16), d5 = Z(17), d6 = Z(18),
           d7 = Z(19), d8 = Z(20), d9 = Z(21), d10 = Z(22), d11 = Z(23);
#undef Z
    __m512bh a = (__m512bh)_mm512_set1_epi32(0x3F803F80), b = (__m512bh)_mm512_set1_epi32(0x3C003C00);
    const long iters = 100000; /* ~1 ms a repetition: short, like the kernel calls, so both catch the quiet moments of a shared host */
    double best = 1e30;
    for (int rep = 0; rep < 200; rep++) {
        double t0 = now();
        for (long it = 0; it < iters; it++) {
#define DP(c) c = _mm512_dpbf16_ps(c, a, b)
            DP(c0), DP(c1), DP(c2), DP(c3), DP(c4), DP(c5), DP(c6), DP(c7), DP(c8), DP(c9), DP(c10), DP(c11);
            DP(d0), DP(d1), DP(d2), DP(d3), DP(d4), DP(d5), DP(d6), DP(d7), DP(d8), DP(d9), DP(d10), DP(d11);
#undef DP
            __asm__ volatile("" : "+v"(a), "+v"(b)); /* operands opaque: nothing is hoisted */
        }
        double dt = now() - t0;
        if (dt < best) best = dt;
    }
    __m512 all = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c0, c1), _mm512_add_ps(c2, c3)),
                               _mm512_add_ps(_mm512_add_ps(c4, c5), _mm512_add_ps(c6, c7)));
    all = _mm512_add_ps(all, _mm512_add_ps(_mm512_add_ps(c8, c9), _mm512_add_ps(c10, c11)));
    all = _mm512_add_ps(all, _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(d0, d1), _mm512_add_ps(d2, d3)),
                                           _mm512_add_ps(_mm512_add_ps(d4, d5), _mm512_add_ps(d6, d7))));
    all = _mm512_add_ps(all, _mm512_add_ps(_mm512_add_ps(d8, d9), _mm512_add_ps(d10, d11)));
    if (_mm512_reduce_add_ps(all) == 1.0f) printf("-\n"); /* keeps the chains live */
    return iters * 24.0 * 32 / best * 1e-9;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 4016, hd = argc > 2 ? atoi(argv[2]) : 64, G = argc > 3 ? atoi(argv[3]) : 4;
    int rounds = argc > 4 ? atoi(argv[4]) : 5;
    const int q8 = argc > 5 && !strcmp(argv[5], "q8");
    if (n < R || n > 1 << 20 || hd < 32 || hd > 512 || hd % 32 || G < 1 || G > 16 || rounds < 1) {
        fprintf(stderr, "usage: attn_block_bench [n>=16] [hd: multiple of 32] [G 1-16] [rounds]\n");
        return 2;
    }
    if (ks_simd_current() < KS_SIMD_AVX512 || !ks_attention_block_bf16_usable()) {
        fprintf(stderr, "attn_block_bench: needs AVX-512 BF16 (and KS_ATTN unset)\n");
        return 1;
    }
    uint16_t *K = malloc(sizeof(uint16_t) * n * hd), *V = malloc(sizeof(uint16_t) * n * hd);
    float *q = malloc(sizeof(float) * R * G * hd), *o32 = malloc(sizeof(float) * R * G * hd);
    float *o16 = malloc(sizeof(float) * R * G * hd), *S = malloc(sizeof(float) * R * G * n);
    float *tile = malloc(sizeof(float) * (P + 16) * hd);
    float *scr = malloc(sizeof(float) * ks_attention_block_bf16_scratch(R, G, hd));
    ks_kv_seg16 *segs = malloc(sizeof(ks_kv_seg16) * (n / P + 1));
    size_t rb8 = ks_kv_row_bytes(KS_KV_Q8, hd);
    uint8_t *K8 = malloc(rb8 * n), *V8 = malloc(rb8 * n);
    float *row = malloc(sizeof(float) * hd), *o16b = malloc(sizeof(float) * R * G * hd);
    ks_kv_seg *segs8 = malloc(sizeof(ks_kv_seg) * (n / P + 1));
    if (!K || !V || !q || !o32 || !o16 || !S || !tile || !scr || !segs || !K8 || !V8 || !row || !o16b || !segs8) {
        fprintf(stderr, "attn_block_bench: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < (size_t)n * hd; i++) K[i] = ks_f32_to_f16(rnd() * 2), V[i] = ks_f32_to_f16(rnd());
    if (q8) /* Q8_0 rows, and the f16 rows made their dequantised values (the third column's input) */
        for (int t = 0; t < n; t++) {
            uint16_t *rows[2] = {K + (size_t)t * hd, V + (size_t)t * hd};
            uint8_t *qrows[2] = {K8 + rb8 * t, V8 + rb8 * t};
            for (int w = 0; w < 2; w++) {
                for (int i = 0; i < hd; i++) row[i] = ks_f16_to_f32(rows[w][i]);
                ks_quantize_row(KS_DTYPE_Q8_0, row, qrows[w], hd);
                ks_dequantize_row(KS_DTYPE_Q8_0, qrows[w], row, hd);
                for (int i = 0; i < hd; i++) rows[w][i] = ks_f32_to_f16(row[i]);
            }
        }
    for (int i = 0; i < R * G * hd; i++) q[i] = rnd() * 2;
    int nseg = 0;
    for (int t = 0; t < n; t += P) {
        segs8[nseg] = (ks_kv_seg){K8 + rb8 * t, V8 + rb8 * t, n - t < P ? n - t : P};
        segs[nseg++] = (ks_kv_seg16){K + (size_t)t * hd, V + (size_t)t * hd, n - t < P ? n - t : P};
    }
    int32_t n_att[R];
    double macs = 0;
    for (int r = 0; r < R; r++) n_att[r] = n - R + 1 + r, macs += 2.0 * n_att[r] * G * hd;
    float scale = 1.0f / sqrtf((float)hd);
    printf("attn_block_bench: %d rows x %d heads over %d keys, hd %d, %s pages of %d, 1 thread, hot; best of %d\n", R,
           G, n, hd, q8 ? "Q8_0" : "f16", P, REPS);
    double peak = bf16_peak();
    printf("vdpbf16ps peak (24 register chains, one core): %.1f G MAC/s\n", peak);
    for (int round = 0; round < rounds; round++) {
        double best[3] = {1e30, 1e30, 1e30};
        for (int k = 0; k < (q8 ? 3 : 2); k++)
            for (int rep = 0; rep < REPS; rep++) {
                double t0 = now();
                if (k == 0 && q8)
                    ks_attention_block_avx2(KS_KV_Q8, segs8, nseg, n_att, R, hd, G, q, (size_t)G * hd, o32,
                                            (size_t)G * hd, S, tile, scale);
                else if (k == 0)
                    ks_attention_block_avx512(segs, nseg, n_att, R, hd, G, q, (size_t)G * hd, o32, (size_t)G * hd, S,
                                              tile, scale);
                else if (k == 1 && q8)
                    ks_attention_block_bf16_kv(KS_KV_Q8, segs8, nseg, n_att, R, hd, G, q, (size_t)G * hd, o16,
                                               (size_t)G * hd, scr, scale);
                else
                    ks_attention_block_bf16(segs, nseg, n_att, R, hd, G, q, (size_t)G * hd, k == 1 ? o16 : o16b,
                                            (size_t)G * hd, scr, scale);
                double dt = now() - t0;
                if (dt < best[k]) best[k] = dt;
            }
        double num = 0, den = 0;
        for (int i = 0; i < R * G * hd; i++) num += (o16[i] - o32[i]) * (double)(o16[i] - o32[i]), den += (double)o32[i] * o32[i];
        printf("round %d: f32 %.3f ms (%.1f G MAC/s)  bf16 %.3f ms (%.1f G MAC/s, %.0f%% of peak)  speedup %.2fx  "
               "nrmse %.2e\n",
               round, best[0] * 1e3, macs / best[0] * 1e-9, best[1] * 1e3, macs / best[1] * 1e-9,
               100 * macs / best[1] * 1e-9 / peak, best[0] / best[1], sqrt(num / den));
        if (q8) { /* the same values as f16 rows (d * q rounded to f16 first, so near but not the same bits) */
            double nb = 0;
            for (int i = 0; i < R * G * hd; i++) nb += (o16[i] - o16b[i]) * (double)(o16[i] - o16b[i]);
            printf("         bf16 over f16 rows of the same values %.3f ms (Q8_0 tiles cost %.2fx), nrmse %.2e\n",
                   best[2] * 1e3, best[1] / best[2], sqrt(nb / den));
        }
    }
    free(K), free(V), free(q), free(o32), free(o16), free(S), free(tile), free(scr), free(segs);
    free(K8), free(V8), free(row), free(o16b), free(segs8);
    return 0;
}
