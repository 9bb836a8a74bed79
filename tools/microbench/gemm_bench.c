/*
 * gemm_bench.c — one weight matrix times n activation vectors through
 * ks_matmul (rows as in the file) and ks_matmul_weight (packed, when the
 * type packs), alternated in one run (diagnostics, not a test).
 *
 * Why it exists: prefill time is mostly these products, and `kvsieve bench`
 * sees them mixed with attention and the host's noise; tuning a tile needs
 * the product alone, in G multiply-adds per second, next to the peak that
 * tools/microbench/vnni_peak.c measures.
 *
 * Usage: gemm_bench [threads=2] [rows=2048] [cols=2048] [n=512] [type=q8_0] [reps=5]
 * Prints the best of reps for each layout.  GEMM_ONLY=rows|packed runs one
 * layout only (for `perf stat -e cycles`: MACs per cycle survive a shared host).
 * GEMM_OFFSET=32 places the weights 32 bytes past a 64-byte boundary, as a
 * GGUF file with 32-byte alignment often does (every tensor of the 1B
 * models sits there).  Measured 2026-11-27 (EPYC-26, 1 thread, loaded
 * host): the Q8_0 panels' prefill tile within noise of the aligned case
 * (split zmm loads from L2 cost this core little), so they stay as packed.
 * GEMM_COLD=K rotates both products over K copies of the weights, so
 * that (K x the matrix > L3) each call reads them from DRAM, as a model's
 * prefill does (every matrix is used once per chunk).
 * GEMM_XREADY=1 quantizes the activations once before the timing and runs
 * the second layout with x_ready, as the model's norms and SwiGLU hand it
 * over (the product alone; the file layout is then skipped, since its own
 * quantization would overwrite the scratch).
 */
#define _POSIX_C_SOURCE 200809L
#include "core/core.h"
#include "tensor/dtype.h"
#include "matmul/matmul.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double cpu_sec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int nth = argc > 1 ? atoi(argv[1]) : 2;
    int64_t rows = argc > 2 ? atoll(argv[2]) : 2048, cols = argc > 3 ? atoll(argv[3]) : 2048;
    int64_t n = argc > 4 ? atoll(argv[4]) : 512;
    const char *tname = argc > 5 ? argv[5] : "q8_0";
    int reps = argc > 6 ? atoi(argv[6]) : 5;
    ks_dtype t;
    if (!ks_dtype_from_name(tname, &t) || !ks_dtype_is_weight_type((uint32_t)t)) {
        fprintf(stderr, "gemm_bench: unknown type '%s'\n", tname);
        return 2;
    }
    if (nth < 1 || rows < 4 || cols < 256 || n < 1 || reps < 1 || cols % 256) {
        fprintf(stderr, "usage: gemm_bench [threads] [rows] [cols, multiple of 256] [n] [type] [reps]\n");
        return 2;
    }
    ks_pool *pool = NULL;
    if (ks_pool_create(nth, &pool) != KS_OK) return 1;
    size_t rb = ks_dtype_row_bytes(t, cols), bytes = rb * (size_t)rows;
    const char *offs = getenv("GEMM_OFFSET");
    const size_t woff = offs ? (size_t)atoi(offs) % 64 : 0;
    uint8_t *W = ks_malloc_aligned(bytes + 64), *Wbuf = ks_malloc_aligned(bytes + 64);
    uint8_t *Wp = Wbuf ? Wbuf + woff : NULL;
    if (W) W += woff;
    float *tmp = ks_malloc(sizeof(float) * (size_t)cols), *X = ks_malloc(sizeof(float) * (size_t)(n * cols));
    float *Y = ks_malloc(sizeof(float) * (size_t)(n * rows));
    if (!W || !Wp || !tmp || !X || !Y) {
        fprintf(stderr, "gemm_bench: out of memory for a %lld x %lld matrix\n", (long long)rows, (long long)cols);
        return 1;
    }
    ks_rng rng = {1};
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < cols; i++) tmp[i] = ks_rng_normal(&rng) * 0.05f;
        ks_quantize_row(t, tmp, W + (size_t)r * rb, cols);
    }
    for (int64_t i = 0; i < n * cols; i++) X[i] = ks_rng_normal(&rng);
    memcpy(Wp, W, bytes);
    ks_weight w = {.type = t, .rows = rows, .cols = cols, .data = Wp};
    ks_matmul_pack(&w);
    const char *colds = getenv("GEMM_COLD");
    const int ncold = colds && atoi(colds) > 1 ? atoi(colds) : 1;
    ks_weight *wc = ks_calloc((size_t)ncold, sizeof *wc); /* wc[0] = w; the others: copies elsewhere */
    uint8_t **rc = ks_calloc((size_t)ncold, sizeof *rc);  /* the same for the file layout */
    if (!wc || !rc) return 1;
    wc[0] = w;
    rc[0] = W;
    for (int i = 1; i < ncold; i++) {
        uint8_t *c = ks_malloc_aligned(bytes + 64), *r = ks_malloc_aligned(bytes + 64);
        if (!c || !r) {
            fprintf(stderr, "gemm_bench: out of memory for %d copies\n", ncold);
            return 1;
        }
        memcpy(c + woff, w.data, bytes);
        memcpy(r + woff, W, bytes);
        wc[i] = w;
        wc[i].data = c + woff;
        rc[i] = r + woff;
    }
    void *scratch = ks_malloc_aligned(ks_matmul_scratch_bytes(t, cols, n) + 64);
    if (!scratch) {
        fprintf(stderr, "gemm_bench: out of memory for the activations' scratch\n");
        return 1;
    }
    const bool xready = getenv("GEMM_XREADY") && atoi(getenv("GEMM_XREADY"));
    if (xready)
        for (int64_t c = 0; c < n; c++) ks_matmul_quantize_x(&w, X + c * cols, c, scratch);
    memset(Y, 0, sizeof(float) * (size_t)(n * rows)); /* first touches outside the timing */
    double cbest[2] = {1e30, 1e30};
    double *times[2] = {ks_calloc((size_t)reps, sizeof(double)), ks_calloc((size_t)reps, sizeof(double))};
    int runs[2] = {0, 0};
    if (!times[0] || !times[1]) return 1;
    for (int rep = 0; rep < reps; rep++)
        for (int k = 0; k < 2; k++) {
            const char *only = getenv("GEMM_ONLY");
            if (only && strcmp(only, k ? "packed" : "rows")) continue;
            if (xready && k == 0) continue; /* the file layout's scratch would overwrite it */
            double t0 = ks_time_sec(), c0 = cpu_sec();
            if (k == 0) ks_matmul(pool, t, rc[rep % ncold], rows, cols, X, n, Y, scratch);
            else ks_matmul_weight_ex(pool, &wc[rep % ncold], X, n, Y, scratch, xready);
            double dt = ks_time_sec() - t0, dc = cpu_sec() - c0;
            times[k][runs[k]++] = dt;
            if (dc < cbest[k]) cbest[k] = dc;
        }
    double macs = (double)rows * (double)cols * (double)n;
    /* per CPU-second: what one core does while it runs (less sensitive to a
     * shared host than wall time) */
    for (int k = 0; k < 2; k++) qsort(times[k], (size_t)runs[k], sizeof(double), cmp_double); /* [0]: the best */
    printf("%s %lldx%lld n=%lld threads=%d:", tname, (long long)rows, (long long)cols, (long long)n, nth);
    const char *names[2] = {"rows", w.layout == KS_WEIGHT_ROWS ? "unpacked" : "packed"};
    for (int k = 0; k < 2; k++)
        if (runs[k])
            printf("%s %s %.1f G MAC/s (%.2f ms; %.1f G MAC per CPU-s)", k && runs[0] ? "," : "", names[k],
                   macs / times[k][0] * 1e-9, times[k][0] * 1e3, macs / cbest[k] * 1e-9);
    printf("\n");
    /* the median beside the best: a model's prefill pays every call, and on a
     * shared host the best of many says little about the typical one */
    for (int k = 0; k < 2; k++)
        if (runs[k])
            printf("  %s: median %.1f G MAC/s over %d products\n", names[k], macs / times[k][runs[k] / 2] * 1e-9,
                   runs[k]);
    ks_free(times[0]);
    ks_free(times[1]);
    for (int i = 1; i < ncold; i++) {
        ks_free_aligned((uint8_t *)(uintptr_t)wc[i].data - woff);
        ks_free_aligned(rc[i] - woff);
    }
    ks_free(wc);
    ks_free(rc);
    ks_free_aligned(scratch);
    ks_free_aligned(W - woff);
    ks_free_aligned(Wbuf);
    ks_free(tmp);
    ks_free(X);
    ks_free(Y);
    ks_pool_destroy(pool);
    return 0;
}
