/*
 * spec_score.h — the scoring kernels of SpeContext's retrieval head
 * (spec_head.c): attention weights of a step's DLM queries over the head's own
 * K cache, reduced over each KV head's group by an element-wise max.
 *
 * The K cache holds f16 rows, or Q8_0 rows (`kcache=q8_0`: one f16 scale
 * per 32 values, the head dim rounded up to whole blocks with zeros), which
 * halve the bytes a step streams at long contexts.  At head dims 64 and
 * 128 on AVX-512 VNNI the query is quantised to Q8_0 once per call and the
 * dot products are integer (tensor/q8dot_avx512.h, as 8-bit KV attention
 * does); elsewhere the query stays f32 and the keys are dequantised in
 * registers.
 *
 * They are the whole cost of a spec step at long contexts, so they have
 * AVX-512 and AVX2 paths (chosen by the caller's ks_simd_level, which tests
 * lower); the portable path is the scalar dot product and a double-precision
 * log-sum-exp.  The SIMD paths use a polynomial exp (relative error ~2e-7):
 * the selection only ranks these values.
 */
#ifndef KS_SPEC_SPEC_SCORE_H
#define KS_SPEC_SPEC_SCORE_H

#include "core/simd.h"
#include "tensor/dtype.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Largest head dim the kernels take (stack rows of this many floats), and
 * largest group (query heads per KV head) the group reduction takes. */
enum { KS_SPEC_HD_MAX = 1024, KS_SPEC_GROUP_MAX = 64 };

/* Elements per stored row: hd, rounded up to a whole Q8_0 block. */
int ks_spec_kcache_dim(int hd);
/* Bytes of one K cache row of type kt (KS_DTYPE_F16 or KS_DTYPE_Q8_0). */
size_t ks_spec_kcache_row_bytes(ks_dtype kt, int hd);
/* k [hd] into one row of type kt (ks_spec_kcache_row_bytes bytes at row). */
void ks_spec_kcache_store(ks_dtype kt, const float *k, int hd, void *row);

/* out[g][j] = scale * (q_g . K_j) for the G heads of q [G][hd] against the
 * keys K [n] rows of type kt; out [G][n].  hd <= KS_SPEC_HD_MAX. */
void ks_spec_scores(const float *q, const void *K, ks_dtype kt, int32_t n, int hd, int G, float scale, float *out,
                    ks_simd_level simd);

/* The name of the kernel ks_spec_scores runs for keys of type kt and head
 * dim hd at level simd (tests assert it, so no path falls back silently):
 * "q8_vnni", "avx512", "q8_int_avx2", "avx2", "q8_int_dot", "q8_int_neon",
 * "neon" or "scalar".  The "q8_" integer paths (Q8_0 keys at hd 64 or 128)
 * quantise the scaled query to Q8_0 blocks and give the same bits at every
 * level. */
const char *ks_spec_scores_kernel_name(ks_dtype kt, int hd, ks_simd_level simd);

/* w[j] = max over the G rows of x [G][n] of log softmax(x_g)[j]: the group
 * reduction of the heads' attention weights in the log domain (x is left
 * as it is).  G <= KS_SPEC_GROUP_MAX; nothing for n <= 0. */
void ks_spec_group_logweights(const float *x, int G, int32_t n, float *w, ks_simd_level simd);

/* The top-k positions in [lo, hi) of those group weights (ks_topk's set
 * and order, indices into [0, n)): exactly ks_spec_group_logweights(x, G,
 * n, w) then ks_topk_range(w, lo, hi, k, idx, x), fused on AVX-512 so the
 * weights need not be written out (spec_score.c).  x [G][n] and w [n] are
 * both clobbered; returns how many it wrote. */
int32_t ks_spec_group_topk(float *x, int G, int32_t n, int32_t lo, int32_t hi, int32_t k, int32_t *idx, float *w,
                           ks_simd_level simd);

#endif
