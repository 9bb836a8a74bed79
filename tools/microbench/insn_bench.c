/*
 * insn_bench.c — one decode product (a weight matrix times one activation
 * vector, ks_matmul, one thread) repeated reps times, for counting the
 * instructions a kernel spends per byte of weights (diagnostics, not a test).
 *
 * Why it exists: the NEON kernels are built and tested here under QEMU, on
 * x86 hosts, so their speed cannot be timed; what can be measured is how
 * many instructions each one executes per byte of weights it reads, against
 * the AVX2 kernel's on the same matrix.  scripts/insn_per_byte.sh runs this
 * program under qemu-user with one instruction per translation block and the
 * execution log, at reps and at 0 reps, and divides the difference (the
 * products alone: start-up, weight generation and quantization cancel) by
 * reps times the matrix's bytes.  Decode is the bandwidth-bound case, where
 * a kernel must retire few instructions per byte to keep up with memory.
 *
 * Usage: insn_bench type [rows=256] [cols=4096] [reps=2] [n=1]; KS_SIMD caps the
 * level.  n > 1 multiplies by n vectors at once (a batch: the two-row smmla
 * tiles at the i8mm level), counting the same weight bytes once per product.
 * INSN_PACK=1 repacks the matrix first where ks_matmul_pack would at load
 * (e.g. Q4_K's eight-row groups on AVX2) and runs ks_matmul_weight on it.
 */
#include "core/core.h"
#include "core/simd.h"
#include "tensor/dtype.h"
#include "matmul/matmul.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    const char *tname = argc > 1 ? argv[1] : "q8_0";
    const int64_t rows = argc > 2 ? atoll(argv[2]) : 256, cols = argc > 3 ? atoll(argv[3]) : 4096;
    const int reps = argc > 4 ? atoi(argv[4]) : 2;
    const int64_t n = argc > 5 ? atoll(argv[5]) : 1;
    ks_dtype t;
    if (!ks_dtype_from_name(tname, &t) || !ks_dtype_is_weight_type((uint32_t)t) || rows < 1 || cols < 256 ||
        cols % 256 || reps < 0 || n < 1 || n > 64) {
        fprintf(stderr, "usage: insn_bench type [rows] [cols, multiple of 256] [reps] [vectors, 1..64]\n");
        return 2;
    }
    const size_t rb = ks_dtype_row_bytes(t, cols), bytes = rb * (size_t)rows;
    uint8_t *W = ks_malloc_aligned(bytes);
    float *x = ks_malloc(sizeof(float) * (size_t)(cols * n)), *y = ks_malloc(sizeof(float) * (size_t)(rows * n));
    void *scratch = ks_malloc_aligned(ks_matmul_scratch_bytes(t, cols, n) + 64);
    if (!W || !x || !y || !scratch) return 1;
    ks_rng rng = {7};
    /* one quantized row copied to every row: the kernels' instruction counts
     * do not depend on the values, and quantizing every row would cost the
     * emulated run far more instructions than the products it measures */
    for (int64_t i = 0; i < cols; i++) x[i] = ks_rng_normal(&rng) * 0.05f;
    ks_quantize_row(t, x, W, cols);
    for (int64_t r = 1; r < rows; r++) memcpy(W + (size_t)r * rb, W, rb);
    for (int64_t i = 0; i < cols * n; i++) x[i] = ks_rng_normal(&rng);
    ks_weight w = {.type = t, .rows = rows, .cols = cols, .data = W};
    const char *pk = getenv("INSN_PACK");
    if (pk && atoi(pk) && ks_matmul_pack(&w) != KS_OK) return 1;
    double sum = 0;
    for (int k = 0; k < reps; k++) {
        ks_matmul_weight(NULL, &w, x, n, y, scratch);
        sum += y[k % rows];
    }
    /* the kernel that ran: at the i8mm level the driver takes the two-row
     * form for every product of more than one vector (matmul.c, ks_mm_worker) */
    const char *k2 = n > 1 && ks_simd_current() == KS_SIMD_NEON_I8MM ? ks_matmul_kernel_name(t, true) : NULL;
    printf("%s %s %lldx%lld x %lld vectors: %zu bytes, kernel %s, reps %d (checksum %g)\n", tname,
           ks_simd_name(ks_simd_current()), (long long)rows, (long long)cols, (long long)n, bytes,
           w.layout != KS_WEIGHT_ROWS ? "packed" : k2 ? k2 : ks_matmul_kernel_name(t, false), reps, sum);
    ks_free_aligned(W);
    ks_free(x);
    ks_free(y);
    ks_free_aligned(scratch);
    return 0;
}
