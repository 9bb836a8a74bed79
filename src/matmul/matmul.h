/*
 * matmul.h — the weight-streaming products of the forward pass.
 *
 * Y[n][rows] = X[n][cols] * W[rows][cols]^T, W in any weight type, X and Y f32.
 * Decode is memory-bound: every weight byte is read once per step for all n
 * sequences of the batch (rows are split across threads, and each weight row
 * is dotted against every activation while it sits in L1).  Quantized types
 * first quantize X to the integer partner type (Q8_0 for Q8_0/Q4_0, Q8_0 with
 * block sums for Q4_1/Q5_0/Q5_1/IQ4_NL, Q8_K for the K-quants and IQ4_XS)
 * and use integer dot products with dequantization fused in.
 * SIMD paths (AVX2+FMA, AVX-512) are chosen at run time (core/simd.h); a portable scalar
 * path is the reference every SIMD path is tested against.
 */
#ifndef KS_MATMUL_H
#define KS_MATMUL_H

#include "core/core.h"
#include "tensor/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of scratch ks_matmul needs for this shape (quantized activations). */
size_t ks_matmul_scratch_bytes(ks_dtype wtype, int64_t cols, int64_t n);

/* Y[n][rows] = X[n][cols] W^T.  W: [rows][cols] of wtype, rows contiguous
 * (row stride = ks_dtype_row_bytes(wtype, cols)).  scratch: at least
 * ks_matmul_scratch_bytes bytes, 64-byte aligned.  pool may be NULL. */
void ks_matmul(ks_pool *pool, ks_dtype wtype, const void *W, int64_t rows, int64_t cols,
               const float *X, int64_t n, float *Y, void *scratch);

/* Y = X W^T for a bound weight, in whichever layout it has (ks_matmul for
 * KS_WEIGHT_ROWS).  Same scratch as ks_matmul. */
void ks_matmul_weight(ks_pool *pool, const ks_weight *w, const float *X, int64_t n, float *Y, void *scratch);

/* As ks_matmul_weight, but x_ready says scratch still holds X quantized by
 * the previous call (same X, n, cols and weight type, scratch untouched
 * since): Q, K and V of a chunk, or gate and up, quantize their input once. */
void ks_matmul_weight_ex(ks_pool *pool, const ks_weight *w, const float *X, int64_t n, float *Y, void *scratch,
                         bool x_ready);

/* Quantize activation vector x (row c of the X of a coming product with w)
 * into scratch, in the layout ks_matmul_weight_ex(..., x_ready = true)
 * reads for w: the very bytes the product would have made.  For a producer
 * that quantizes each row as it writes it, while the row is still in cache
 * (the RMSNorm, the SwiGLU gate), instead of the product reading all of X
 * back from memory.  Distinct c may run on different threads. */
void ks_matmul_quantize_x(const ks_weight *w, const float *x, int64_t c, void *scratch);

/* Whether ks_matmul_pack would repack w: a Q8_0 or Q4_0 matrix with rows
 * and blocks per row multiples of 4, or a Q5_K, Q6_K or IQ4_XS one with
 * rows a multiple of 8, on a CPU with AVX-512 VNNI; a Q4_K one with rows a
 * multiple of 8 on a CPU with AVX2 or AVX-512 VNNI. */
bool ks_matmul_can_pack(const ks_weight *w);

/* The row multiple at which w's rows can be cut into matrices of w's own
 * layout: rows [r0, r1) with r0 and r1 multiples of it are the matrix of
 * r1 - r0 rows at w->data + r0 * ks_dtype_row_bytes(type, cols).  1 for the
 * file's rows, 8 for the eight-row groups (each group is eight rows' bytes,
 * consecutive), 0 for the panel layouts (their scales follow a panel's
 * quants, so a cut is no matrix). */
int64_t ks_matmul_row_align(const ks_weight *w);

/* Repack w's bytes IN PLACE (they must be writable: w->data is cast) into
 * the panel layout of the AVX-512 prefill tile and set w->layout; the size
 * does not change.  Q8_0 with rows a multiple of 16 becomes transposed
 * 16-row panels, whose products have their own fixed arithmetic per output
 * (the same bits for every n and chunking; float rounding away from the
 * unpacked kernel); the 4-row panels (Q4_0, other Q8_0) give the unpacked
 * kernel's very bits; Q4_K, Q5_K, Q6_K and IQ4_XS become eight-row groups
 * (matmul_x86_q4k.c) whose products have the AVX2 level's arithmetic at
 * every n (at AVX-512, float rounding away from the file layout's zmm
 * kernels).  Correct at every level.  No-op when
 * !ks_matmul_can_pack(w).  KS_ERR_NOMEM (w unchanged) when the one panel
 * of working memory is refused. */
ks_status ks_matmul_pack(ks_weight *w);

/* Bytes of the KS_SCRATCH_KERNEL slot a worker needs for products with w (0
 * for the file layout).  The kernels cannot report a refused allocation from
 * inside a parallel-for, so whoever runs them (a context, at creation) makes
 * every thread's slot this large first, and the kernels assert that it is. */
size_t ks_matmul_worker_scratch_bytes(const ks_weight *w);

/* The int8 multiply-add peak of the pool's threads (MAC/s, all threads at
 * once) from a register-only vpdpbusd loop run for `seconds` (peak.c); 0
 * without AVX-512 VNNI.  The denominator of "share of the integer peak". */
double ks_int8_peak_macs(ks_pool *pool, double seconds);

/* The function name of the kernel ks_matmul runs for weight type t at the
 * current SIMD level (e.g. "ks_mm_q8_0_dot"): the one-row kernel, or with
 * rows2 the two-row form the driver uses for batches (NULL where there is
 * none).  For the dispatch test, which fails on a silent scalar fallback. */
const char *ks_matmul_kernel_name(ks_dtype t, bool rows2);

/* Dot product of one weight row of wtype with f32 x (no threads; scalar
 * reference used by tests and small ops). */
float ks_dot_row_ref(ks_dtype wtype, const void *wrow, const float *x, int64_t cols);

#ifdef __cplusplus
}
#endif
#endif
