/*
 * bounds_bench.c — Quest's page scoring alone: every page of H heads
 * scored from the store's f16 bounds and from its 8-bit bounds, one thread,
 * with Quest's fused group max (diagnostics, not a test).
 *
 * Why it exists: at batch 16 and long contexts Quest reads every page's
 * bounds every step, as many bytes as the selected KV, and `kvsieve bench`
 * shows only the share of a whole step.  Whether a scorer is bound by its
 * arithmetic or by memory shows here: with few heads the bounds stay in L2
 * (the arithmetic alone), with many they come from DRAM; ns per page and
 * GB/s of bounds read are printed for both formats, alternated in one run.
 *
 * Usage: bounds_bench [heads=1024] [rounds=3]   (1024 pages of 32 entries
 * per head, hd 64, four query heads per KV head: M's shape at 32K)
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kv/kv_meta.h"
#include "policy/policy.h"

enum { NPG = 1024, HD = 64, G = 4 };

static double now_sec(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    long heads = argc > 1 ? atol(argv[1]) : 1024;
    int rounds = argc > 2 ? atoi(argv[2]) : 3;
    if (heads < 1 || heads > 65536 || rounds < 1) {
        fprintf(stderr, "usage: bounds_bench [heads 1-65536] [rounds]\n");
        return 2;
    }
    size_t stride8 = ks_kv_bounds8_bytes(HD), n = (size_t)heads * NPG;
    uint8_t *b8 = malloc(stride8 * n);
    uint16_t *b16 = malloc(sizeof(uint16_t) * 2 * HD * n);
    const uint8_t **p8 = malloc(sizeof(*p8) * NPG);
    const uint16_t **p16 = malloc(sizeof(*p16) * NPG);
    if (!b8 || !b16 || !p8 || !p16) {
        fprintf(stderr, "bounds_bench: out of memory\n");
        return 1;
    }
    float kmin[HD], kmax[HD], q[G * HD], red[NPG];
    for (size_t pg = 0; pg < n; pg++) { /* bounds of varied pages, min <= max */
        for (int i = 0; i < HD; i++) {
            kmin[i] = -(float)((pg * 7 + (size_t)i) % 13) / 10.0f;
            kmax[i] = (float)((pg * 3 + (size_t)i) % 11) / 10.0f;
            b16[pg * 2 * HD + (size_t)i] = ks_f32_to_f16(kmin[i]);
            b16[pg * 2 * HD + HD + (size_t)i] = ks_f32_to_f16(kmax[i]);
        }
        ks_kv_bounds8_encode(kmin, kmax, HD, b8 + pg * stride8);
    }
    for (int i = 0; i < G * HD; i++) q[i] = (float)(i % 9) - 4.0f;
    printf("bounds_bench: %ld heads x %d pages, hd %d, group %d, one thread\n", heads, NPG, HD, G);
    for (int r = 1; r <= rounds; r++) {
        double t0 = now_sec();
        for (long h = 0; h < heads; h++) {
            for (int p = 0; p < NPG; p++) p8[p] = b8 + ((size_t)h * NPG + (size_t)p) * stride8;
            ks_page_upper_bounds8_pages(q, G, p8, NPG, HD, NULL, red);
        }
        double t1 = now_sec();
        for (long h = 0; h < heads; h++) {
            for (int p = 0; p < NPG; p++) p16[p] = b16 + ((size_t)h * NPG + (size_t)p) * 2 * HD;
            ks_page_upper_bounds16_pages(q, G, p16, NPG, HD, NULL, red);
        }
        double t2 = now_sec();
        printf("round %d: 8-bit %.1f ns/page (%.1f GB/s) | f16 %.1f ns/page (%.1f GB/s)\n", r, (t1 - t0) / (double)n * 1e9,
               (double)(stride8 * n) / (t1 - t0) / 1e9, (t2 - t1) / (double)n * 1e9,
               (double)(4 * HD * n) / (t2 - t1) / 1e9);
    }
    free(b8), free(b16), free(p8), free(p16);
    return 0;
}
