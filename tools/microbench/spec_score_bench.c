/*
 * spec_score_bench.c — SpeContext's head scores alone: G query heads
 * against each of H KV heads' K caches of n Q8_0 rows (M's head at 32K:
 * hd 64, G 4, H 8), one thread, the best of R rounds (diagnostics, not a
 * test).
 *
 * Why it exists: `kvsieve bench` shows the head's scoring only as a share
 * of a whole step, which this host's noise moves by more than the kernel's
 * own change.  Linked against two builds of src/spec/spec_score.c (or run at
 * two levels), it tells the kernels apart in one run; ms and GB/s of keys
 * read are printed.
 *
 * Usage: spec_score_bench [hd=64] [G=4] [n=32768] [rounds=30] [level=current]
 *   (level: 0 scalar, 1 avx2, 2 avx512, 3 neon, 4 dotprod, 5 i8mm)
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "core/simd.h"
#include "spec/spec_score.h"

static double now_sec(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int hd = argc > 1 ? atoi(argv[1]) : 64, G = argc > 2 ? atoi(argv[2]) : 4;
    int32_t n = argc > 3 ? atoi(argv[3]) : 32768;
    int rounds = argc > 4 ? atoi(argv[4]) : 30;
    ks_simd_level lv = argc > 5 ? (ks_simd_level)atoi(argv[5]) : ks_simd_current();
    const int H = 8;
    if (hd < 1 || hd > 128 || G < 1 || G > KS_SPEC_GROUP_MAX || n < 1 || rounds < 1 || (int)lv < 0 ||
        (int)lv > (int)ks_simd_detect()) {
        fprintf(stderr, "usage: spec_score_bench [hd<=128] [G<=%d] [n] [rounds] [level<=%d]\n", KS_SPEC_GROUP_MAX,
                (int)ks_simd_detect());
        return 2;
    }
    size_t rb = ks_spec_kcache_row_bytes(KS_DTYPE_Q8_0, hd);
    uint8_t *K = malloc(rb * (size_t)n * H);
    float *q = malloc(sizeof(float) * (size_t)G * hd), *k = malloc(sizeof(float) * (size_t)hd);
    float *out = malloc(sizeof(float) * (size_t)G * n);
    if (!K || !q || !k || !out) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    srand(1);
    for (int i = 0; i < G * hd; i++) q[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    for (size_t j = 0; j < (size_t)n * H; j++) {
        for (int i = 0; i < hd; i++) k[i] = (float)rand() / (float)RAND_MAX - 0.5f;
        ks_spec_kcache_store(KS_DTYPE_Q8_0, k, hd, K + j * rb);
    }
    double best = 1e30, sink = 0;
    for (int r = 0; r < rounds; r++) {
        double t0 = now_sec();
        for (int h = 0; h < H; h++) {
            ks_spec_scores(q, K + (size_t)h * n * rb, KS_DTYPE_Q8_0, n, hd, G, 0.125f, out, lv);
            sink += out[n / 2];
        }
        double t = now_sec() - t0;
        best = t < best ? t : best;
    }
    printf("hd %d, G %d, %d x %d rows (%s): best %.3f ms, %.2f GB/s of keys (checksum %g)\n", hd, G, H, n,
           ks_simd_name(lv), best * 1e3, (double)(rb * (size_t)n * H) / best / 1e9, sink);
    free(K);
    free(q);
    free(k);
    free(out);
    return 0;
}
