/*
 * spec_proj.h — the retrieval head's once-a-step projections at batch 1
 * (spec_head.c): fc, then q_proj and k_proj together, for weights kept in the
 * checkpoint's float precision (bf16, f16, f32).
 *
 * ks_matmul computes each output as one chain of FMAs over the row, so at
 * batch 1 a core waits on the FMA latency (four cycles per 16 weights)
 * rather than on memory.  These kernels run four rows' chains side by side
 * with the very same per-row arithmetic (lane-wise FMAs in column order, the
 * same horizontal sum), so every output is bit for bit what ks_matmul's
 * AVX-512, AVX2 or NEON kernel gives at the level in force, and the selections
 * do not change.  q_proj and k_proj
 * read the same input, so they share one dispatch of the pool.
 */
#ifndef KS_SPEC_SPEC_PROJ_H
#define KS_SPEC_SPEC_PROJ_H

#include "core/core.h"
#include "tensor/dtype.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    ks_dtype type;   /* KS_DTYPE_BF16, KS_DTYPE_F16 or KS_DTYPE_F32 */
    const void *w;   /* [rows][cols] */
    int64_t rows, cols;
    float *y;        /* [rows] */
} ks_spec_proj_mat;

/* Whether ks_spec_proj computes y = W x for this matrix exactly as
 * ks_matmul(n = 1) does at the current SIMD level (AVX-512, AVX2 or NEON, a float
 * type, cols a multiple of 16); otherwise the caller uses ks_matmul. */
bool ks_spec_proj_supported(ks_dtype type, int64_t cols);

/* The form ks_spec_proj runs at the current level: "avx512", "avx2" or
 * "neon" (every ARM level), NULL where it has none (tests assert it). */
const char *ks_spec_proj_kernel_name(void);

/* y = W x for each of n_mats matrices (all with x's cols), on the pool:
 * their rows are shared out among the workers in runs of four. */
void ks_spec_proj(ks_pool *pool, const ks_spec_proj_mat *mats, int n_mats, const float *x);

#endif
