/*
 * spec_score.h — the scoring kernels of SpeContext's retrieval head
 * (p_spec.c): attention weights of a step's DLM queries over the head's own
 * f16 K cache, reduced over each KV head's group by an element-wise max.
 *
 * They are the whole cost of a spec step at long contexts, so they have
 * AVX-512 and AVX2 paths (chosen by the caller's ks_simd_level, which tests
 * lower); the portable path is the scalar dot product and ks_softmax of
 * tensor/ops.h.  The SIMD softmax uses a polynomial exp (relative error
 * ~2e-7): the selection only ranks these values.
 */
#ifndef KS_SELECT_SPEC_SCORE_H
#define KS_SELECT_SPEC_SCORE_H

#include "core/simd.h"
#include "tensor/dtype.h"

#include <stdbool.h>
#include <stdint.h>

/* out[g][j] = scale * (q_g . K_j) for the G heads of q [G][hd] against the
 * f16 keys K [n][hd]; out [G][n]. */
void ks_spec_scores(const float *q, const ks_f16 *K, int32_t n, int hd, int G, float scale, float *out,
                    ks_simd_level simd);

/* x[0..n) = softmax(x) in place, then w = p (first) or max(w, p): the group
 * reduction fused with the normalisation. */
void ks_spec_softmax_max(float *x, int32_t n, float *w, bool first, ks_simd_level simd);

#endif
