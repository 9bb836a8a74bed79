/*
 * act.h — the feed-forward's gated activations over whole rows, on the
 * host's vector units.
 */
#ifndef KS_TENSOR_ACT_H
#define KS_TENSOR_ACT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* gate[i] = GELU_tanh(gate[i]) * up[i] for i in [0, n): gemma's GEGLU.
 * The SIMD level in force picks the lanes (core/simd.h); every element's
 * arithmetic depends only on its index and n, never on the call's rows or
 * threads, so a decode step and a prefill give the same bits. */
void ks_geglu_tanh(float *gate, const float *up, int64_t n);

#ifdef __cplusplus
}
#endif
#endif
