/*
 * restore_bench.c — the time a prefix-cache hit takes to put a cached
 * prefix into a new sequence (diagnostics, not a test): the cache's blocks
 * as pinned pages of the KV store, mapped by reference (share_pages, the
 * default), against blocks of bytes copied into the sequence's own pages
 * (share_pages off, as every hit did before shared pages), alternated in
 * one run on one model.
 *
 * Why it exists: the restore sits on the time to first token of every hit,
 * and on a long document it was a copy of the whole prefix's KV.  The KV
 * here is synthetic (ks_seq_fill_synthetic: noise rows, exactly the bytes
 * and page summaries a prefill would store, without minutes of prefill);
 * the restore does not look at values.
 *
 * Usage: restore_bench MODEL.gguf [tokens=4096] [rounds=5] [threads=2]
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "infer/internal.h"

static double now_sec(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: restore_bench MODEL.gguf [tokens=4096] [rounds=5] [threads=2]\n");
        return 2;
    }
    int n = argc > 2 ? atoi(argv[2]) : 4096, rounds = argc > 3 ? atoi(argv[3]) : 5, th = argc > 4 ? atoi(argv[4]) : 2;
    if (n < 64 || rounds < 1 || rounds > 100 || th < 1) return 2;
    ks_model *m = NULL;
    if (ks_model_load(argv[1], ks_model_default_params(), &m) != KS_OK) {
        fprintf(stderr, "%s\n", ks_last_error());
        return 1;
    }
    ks_context_params cp = ks_context_default_params();
    cp.n_ctx = n + 256;
    cp.n_seq = 2;
    cp.n_threads = th;
    ks_context *c = NULL;
    if (ks_context_create(m, cp, &c) != KS_OK) {
        fprintf(stderr, "%s\n", ks_last_error());
        return 1;
    }
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)(n + 1));
    for (int i = 0; i <= n; i++) prompt[i] = 1 + (i * 7919) % 1000;
    ks_prefix_cache *pc[2];
    double t[2][100];
    for (int mode = 0; mode < 2; mode++) {
        ks_prefix_cache_params pp = ks_prefix_cache_default_params();
        pp.ram_bytes = 8ull << 30;
        pp.share_pages = mode == 0;
        if (ks_prefix_cache_create(m, &pp, &pc[mode]) != KS_OK) return 1;
        /* the prefix in sequence 0, taken by the cache (pinned, or copied out) */
        if (ks_seq_fill_synthetic(c, 0, n, 7) != KS_OK || ks_prefix_capture_kv(c, pc[mode], 0, prompt, n) != KS_OK) {
            fprintf(stderr, "%s\n", ks_last_error());
            return 1;
        }
        if (mode == 1) ks_seq_reset(c, 0); /* the copies alone hold the prefix */
    }
    int32_t hit = 0;
    for (int r = 0; r < rounds; r++)
        for (int mode = 0; mode < 2; mode++) {
            ks_seq_reset(c, 1);
            double t0 = now_sec();
            /* the prompt is one token longer: the whole prefix is a hit */
            if (ks_prefix_restore(c, pc[mode], 1, prompt, n + 1, &hit) != KS_OK) {
                fprintf(stderr, "%s\n", ks_last_error());
                return 1;
            }
            t[mode][r] = now_sec() - t0;
        }
    for (int mode = 0; mode < 2; mode++) qsort(t[mode], (size_t)rounds, sizeof(double), cmp_d);
    printf("restore of %d cached tokens (%d threads, median of %d): mapped %.2f ms, copied %.2f ms\n", hit, th, rounds,
           1e3 * t[0][rounds / 2], 1e3 * t[1][rounds / 2]);
    ks_seq_reset(c, 1);
    ks_context_destroy(c);
    ks_prefix_cache_destroy(pc[0]);
    ks_prefix_cache_destroy(pc[1]);
    ks_model_destroy(m);
    free(prompt);
    return 0;
}
