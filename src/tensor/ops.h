/*
 * ops.h — the small per-row operations every forward pass shares: RMSNorm,
 * rotary position embeddings (RoPE) and softmax.
 *
 * One home, because the target's forward pass (infer/forward.c), the EAGLE-3
 * draft loader (model/eagle3.c) and SpeContext's retrieval head
 * (select/p_spec.c) all compute them, and a drifting copy would make the
 * retrieval head score keys the target never produced.  These are the plain-C
 * definitions: each loop accumulates in the order written (sums in double
 * where noted), so results are reproducible bit for bit, and tests compare
 * SIMD code against them.
 *
 * RoPE comes in two parts: the angles of a position (per pair of dims) and
 * the rotation, so a caller computes a row's angles once and rotates every
 * head with them.  The angles come from the GGUF convention (base and
 * optional llama3 frequency divisors) or from a table of inverse frequencies
 * (HF checkpoints, with linear / llama3 / YaRN scaling folded in by
 * ks_rope_inv_freq).  The rotation pairs adjacent dims (llama.cpp's GGUF
 * layout) or the two halves (`neox`, HF's rotate_half).
 */
#ifndef KS_TENSOR_OPS_H
#define KS_TENSOR_OPS_H

#include "core/core.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* out[i] = x[i] * (1 / sqrt(mean(x^2) + eps)) * w[i]; the sum of squares in
 * double.  out may alias x. */
void ks_rmsnorm(float *out, const float *x, const float *w, int n, float eps);

/* In place: x = softmax(x) over n, with the max subtracted and the sum in double. */
void ks_softmax(float *x, int n);

/* The normaliser of a softmax in double, for log-probabilities: returns
 * log(sum exp(x[i] - max)) and writes max = max x[i], so log p_i =
 * (x[i] - max) - returned.  n >= 1. */
double ks_log_sum_exp(const float *x, int n, float *max_out);
/* Index of the largest of x[0..n) (n >= 1): the lowest index among equal
 * maxima, and NaN never wins (all NaN: 0).  Greedy decoding everywhere. */
int32_t ks_argmax(const float *x, int32_t n);

/* cos/sin of the rotation angles of position pos: [n_rot/2] each; angle j is
 * pos * base^(-2j/n_rot) / freq_factors[j] (freq_factors NULL: 1). */
void ks_rope_angles(float *cos_out, float *sin_out, int32_t pos, int n_rot, float base,
                    const float *freq_factors);
/* The same from inverse frequencies (inv_freq [n_rot/2], ks_rope_inv_freq):
 * angle j is pos * inv_freq[j]; cos and sin are then multiplied by mscale. */
void ks_rope_angles_freq(float *cos_out, float *sin_out, int32_t pos, int n_rot, const float *inv_freq,
                         float mscale);
/* Rotate the first n_rot dims of v: adjacent pairs, or halves when neox. */
void ks_rope_apply(float *v, int n_rot, bool neox, const float *c, const float *s);

/* ------------------------------------------------------ RoPE scaling -- */
typedef enum ks_rope_scaling_type {
    KS_ROPE_SCALING_NONE,
    KS_ROPE_SCALING_LINEAR, /* positions / factor */
    KS_ROPE_SCALING_LLAMA3, /* Llama 3.1 wavelength-banded interpolation */
    KS_ROPE_SCALING_YARN,   /* YaRN: ramped interpolation + attention temperature */
    KS_ROPE_SCALING_LONGROPE, /* per-dimension divisors, short or long by context (GGUF only) */
} ks_rope_scaling_type;

typedef struct ks_rope_scaling {
    ks_rope_scaling_type type;
    float factor;                 /* s = new context / original context (>= 1) */
    int32_t orig_max_pos;         /* original_max_position_embeddings */
    float beta_fast, beta_slow;   /* YaRN ramp bounds in rotations (32, 1) */
    float attention_factor;       /* YaRN: 0 = default 0.1 ln(s) + 1 */
    float low_freq_factor, high_freq_factor; /* llama3 (1, 4) */
    /* GGUF only (ks_rope_gguf_inv_freq), as llama.cpp reads them: */
    float ext_factor;             /* YaRN ramp weight: < 0 = default (1 for YaRN, else 0) */
    float log_mul;                /* rope.scaling.yarn_log_multiplier (mscale_all_dim), 0 = none */
    float yarn_mscale;            /* HF's mscale, the numerator's g(s, mscale); 0 = 1.  deepseek2 sets it to
                                   * log_mul, as llama_context does, so that the cos/sin magnitude is 1 */
} ks_rope_scaling;

/* YaRN with the paper's defaults for factor s over orig_max_pos positions. */
ks_rope_scaling ks_rope_scaling_yarn(float factor, int32_t orig_max_pos);

/* Per-dimension inverse frequencies ([n_rot/2]) and the scale applied to
 * cos/sin (YaRN's sqrt(1/t) = 0.1 ln(s) + 1, applied to q and k alike so the
 * logits scale by 1/t; 1 for the other types).  sc NULL = plain RoPE.
 * Formulas follow the YaRN paper (Peng et al. 2023) as implemented in HF
 * transformers' _compute_yarn_parameters: correction dims
 *   d(r) = n_rot * ln(orig / (2 pi r)) / (2 ln base),
 *   low = floor(d(beta_fast)), high = ceil(d(beta_slow)) clamped to [0, n_rot-1],
 *   ramp_j = clamp((j - low) / (high - low), 0, 1),
 *   inv_j = base^(-2j/n_rot) * (ramp_j / s + (1 - ramp_j)).
 * KS_ERR_INVALID_ARG on bad parameters. */
ks_status ks_rope_inv_freq(int n_rot, float base, const ks_rope_scaling *sc, float *inv_freq, float *mscale);

/* The same for a GGUF model, with llama.cpp's semantics (ggml's rope_yarn and
 * llama_context's yarn_attn_factor), which differ from HF's in two places:
 * attention_factor multiplies the magnitude rather than replacing it, and
 * per-dimension divisors (rope_freqs.weight, LongRoPE's short/long factors;
 * freq_factors, NULL = 1) divide the base frequency before YaRN mixes:
 *   fs   = 1 / factor (1 for NONE and a factor <= 0),
 *   b_j  = base^(-2j/n_rot) / freq_factors[j],
 *   mix_j = ext_factor * (1 - clamp((j - low) / max(0.001, high - low), 0, 1)),
 *   inv_j = b_j * (fs (1 - mix_j) + mix_j)       (mix 0 unless ext_factor != 0),
 *   mscale = attention_factor (0 = 1) times, when ext_factor != 0,
 *            g(1/fs, 1) / g(1/fs, log_mul) (log_mul 0: g(1/fs, 1)),
 *            g(s, m) = s <= 1 ? 1 : 0.1 m ln(s) + 1.
 * Inverse frequencies in double, so angles pos * inv_j keep double precision
 * (ks_rope_angles_inv); an unscaled model gets exactly ks_rope_angles' values. */
ks_status ks_rope_gguf_inv_freq(int n_rot, float base, const ks_rope_scaling *sc, const float *freq_factors,
                                double *inv_freq, float *mscale);
/* cos/sin of position pos from double inverse frequencies: angle j is
 * pos * inv_freq[j] (in double); cos and sin are multiplied by mscale. */
void ks_rope_angles_inv(float *cos_out, float *sin_out, int32_t pos, int n_rot, const double *inv_freq, float mscale);
/* "none", "linear", "llama3", "yarn", "longrope". */
const char *ks_rope_scaling_name(ks_rope_scaling_type t);

#ifdef __cplusplus
}
#endif
#endif
