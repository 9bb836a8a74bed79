/*
 * ops.c — RMSNorm, softmax, RoPE angles and rotation, RoPE scaling (see
 * ops.h).  Every forward pass (the target's, the EAGLE-3 draft's, the
 * retrieval head's) calls these, so the operations and their order of
 * accumulation are defined in exactly one place.
 *
 * The RoPE scaling conventions come from HF transformers
 * (_compute_yarn_parameters: find_correction_dim, linear_ramp_factor,
 * get_mscale = 0.1 ln(s) + 1, beta_fast 32, beta_slow 1;
 * _compute_llama3_parameters), read in public code, not copied.
 */
#include "tensor/ops.h"

#include <math.h>

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

void ks_rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float scale = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++) out[i] = x[i] * scale * w[i];
}

void ks_softmax(float *x, int n) {
    float mx = -INFINITY;
    for (int i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    double sum = 0;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    float inv = (float)(1.0 / sum);
    for (int i = 0; i < n; i++) x[i] *= inv;
}

int32_t ks_argmax(const float *x, int32_t n) {
    int32_t best = 0;
    float bv = isnan(x[0]) ? -INFINITY : x[0];
    for (int32_t i = 1; i < n; i++)
        if (x[i] > bv) { /* strict: the first maximum wins; a comparison with NaN is false */
            bv = x[i];
            best = i;
        }
    return best;
}

double ks_log_sum_exp(const float *x, int n, float *max_out) {
    float mx = x[0];
    for (int i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    double z = 0;
    for (int i = 0; i < n; i++) z += exp((double)x[i] - mx);
    *max_out = mx;
    return log(z);
}

/* ------------------------------------------------------------------ RoPE -- */

void ks_rope_angles(float *cos_out, float *sin_out, int32_t pos, int n_rot, float base,
                    const float *freq_factors) {
    for (int j = 0; j < n_rot / 2; j++) {
        double freq = pow((double)base, -2.0 * j / n_rot);
        if (freq_factors) freq /= freq_factors[j];
        double a = (double)pos * freq;
        cos_out[j] = (float)cos(a);
        sin_out[j] = (float)sin(a);
    }
}

void ks_rope_angles_freq(float *cos_out, float *sin_out, int32_t pos, int n_rot, const float *inv_freq,
                         float mscale) {
    for (int j = 0; j < n_rot / 2; j++) {
        double a = (double)pos * inv_freq[j];
        cos_out[j] = (float)cos(a) * mscale;
        sin_out[j] = (float)sin(a) * mscale;
    }
}

void ks_rope_apply(float *v, int n_rot, bool neox, const float *c, const float *s) {
    int half = n_rot / 2;
    for (int j = 0; j < half; j++) {
        int i0 = neox ? j : 2 * j, i1 = neox ? j + half : 2 * j + 1;
        float x0 = v[i0], x1 = v[i1];
        v[i0] = x0 * c[j] - x1 * s[j];
        v[i1] = x0 * s[j] + x1 * c[j];
    }
}

/* ---------------------------------------------------------- RoPE scaling -- */

ks_rope_scaling ks_rope_scaling_yarn(float factor, int32_t orig_max_pos) {
    return (ks_rope_scaling){.type = KS_ROPE_SCALING_YARN, .factor = factor, .orig_max_pos = orig_max_pos,
                             .beta_fast = 32.0f, .beta_slow = 1.0f, .attention_factor = 0.0f,
                             .low_freq_factor = 1.0f, .high_freq_factor = 4.0f};
}

static double yarn_correction_dim(double n_rot_dims, double rotations, double base, double orig) {
    return n_rot_dims * log(orig / (rotations * 2.0 * M_PI)) / (2.0 * log(base));
}

ks_status ks_rope_inv_freq(int n_rot, float base, const ks_rope_scaling *sc, float *inv_freq, float *mscale) {
    if (n_rot < 2 || n_rot % 2) return KS_FAIL(KS_ERR_INVALID_ARG, "RoPE dimension %d is not a positive even number", n_rot);
    if (!(base > 1.0f)) return KS_FAIL(KS_ERR_INVALID_ARG, "RoPE base %g must exceed 1", (double)base);
    ks_rope_scaling_type type = sc ? sc->type : KS_ROPE_SCALING_NONE;
    if (type != KS_ROPE_SCALING_NONE && !(sc->factor >= 1.0f && sc->factor < 1e6f))
        return KS_FAIL(KS_ERR_INVALID_ARG, "RoPE scaling factor %g must be in [1, 1e6)", (double)sc->factor);
    if ((type == KS_ROPE_SCALING_YARN || type == KS_ROPE_SCALING_LLAMA3) && sc->orig_max_pos < 1)
        return KS_FAIL(KS_ERR_INVALID_ARG, "RoPE scaling needs original_max_position_embeddings >= 1 (got %d)", sc->orig_max_pos);
    if (type == KS_ROPE_SCALING_LONGROPE)
        return KS_FAIL(KS_ERR_INVALID_ARG, "LongRoPE needs per-dimension factors (ks_rope_gguf_inv_freq)");
    const int half = n_rot / 2;
    double ms = 1.0;
    double low = 0, high = 0;
    if (type == KS_ROPE_SCALING_YARN) {
        if (!(sc->beta_fast > 0 && sc->beta_slow > 0 && sc->beta_fast >= sc->beta_slow))
            return KS_FAIL(KS_ERR_INVALID_ARG, "YaRN beta_fast %g / beta_slow %g must be positive with beta_fast >= beta_slow",
                           (double)sc->beta_fast, (double)sc->beta_slow);
        low = floor(yarn_correction_dim(n_rot, sc->beta_fast, base, sc->orig_max_pos));
        high = ceil(yarn_correction_dim(n_rot, sc->beta_slow, base, sc->orig_max_pos));
        if (low < 0) low = 0;
        if (high > n_rot - 1) high = n_rot - 1;
        if (low == high) high += 0.001; /* avoid a zero-width ramp */
        ms = sc->attention_factor > 0 ? sc->attention_factor : (sc->factor <= 1 ? 1.0 : 0.1 * log(sc->factor) + 1.0);
    }
    if (type == KS_ROPE_SCALING_LLAMA3 && !(sc->high_freq_factor > sc->low_freq_factor && sc->low_freq_factor > 0))
        return KS_FAIL(KS_ERR_INVALID_ARG, "llama3 RoPE scaling needs high_freq_factor > low_freq_factor > 0");
    for (int j = 0; j < half; j++) {
        double f = pow((double)base, -2.0 * j / n_rot);
        switch (type) {
        case KS_ROPE_SCALING_NONE:
        case KS_ROPE_SCALING_LONGROPE: break;
        case KS_ROPE_SCALING_LINEAR: f /= sc->factor; break;
        case KS_ROPE_SCALING_YARN: {
            double ramp = ((double)j - low) / (high - low);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            /* ramp 0: extrapolate (keep f), ramp 1: interpolate (f / s) */
            f = f / sc->factor * ramp + f * (1.0 - ramp);
            break;
        }
        case KS_ROPE_SCALING_LLAMA3: {
            double old = sc->orig_max_pos, wavelen = 2.0 * M_PI / f;
            double low_wl = old / sc->low_freq_factor, high_wl = old / sc->high_freq_factor;
            if (wavelen > low_wl) f /= sc->factor;
            else if (wavelen >= high_wl) {
                double smooth = (old / wavelen - sc->low_freq_factor) / (sc->high_freq_factor - sc->low_freq_factor);
                f = (1.0 - smooth) * f / sc->factor + smooth * f;
            }
            break;
        }
        }
        inv_freq[j] = (float)f;
    }
    *mscale = (float)ms;
    return KS_OK;
}

/* ------------------------------------------------- RoPE of a GGUF model --
 * llama.cpp's reading (see ops.h).  Two of its quirks matter for identical
 * output: llama_context divides its yarn_attn_factor by 1 + 0.1 ln(s)
 * because ggml's rope kernel multiplies that factor back in whenever
 * ext_factor != 0, so the net magnitude is g(s, mscale) [/ g(s, log_mul)] times
 * rope.scaling.attn_factor; and the correction dims use the n_rot rotated
 * dims with floor/ceil and the clamp to [0, n_rot - 1], as HF does. */
const char *ks_rope_scaling_name(ks_rope_scaling_type t) {
    switch (t) {
    case KS_ROPE_SCALING_NONE: return "none";
    case KS_ROPE_SCALING_LINEAR: return "linear";
    case KS_ROPE_SCALING_LLAMA3: return "llama3";
    case KS_ROPE_SCALING_YARN: return "yarn";
    case KS_ROPE_SCALING_LONGROPE: return "longrope";
    }
    return "?";
}

static double yarn_get_mscale(double s, double m) { return s <= 1.0 ? 1.0 : 0.1 * m * log(s) + 1.0; }

ks_status ks_rope_gguf_inv_freq(int n_rot, float base, const ks_rope_scaling *sc, const float *freq_factors,
                                double *inv_freq, float *mscale) {
    if (n_rot < 2 || n_rot % 2) return KS_FAIL(KS_ERR_INVALID_ARG, "RoPE dimension %d is not a positive even number", n_rot);
    if (!(base > 0.0f) || !isfinite(base)) return KS_FAIL(KS_ERR_INVALID_ARG, "RoPE base %g must be positive", (double)base);
    ks_rope_scaling none = {.type = KS_ROPE_SCALING_NONE};
    if (!sc) sc = &none;
    if (sc->type == KS_ROPE_SCALING_LLAMA3)
        return KS_FAIL(KS_ERR_INVALID_ARG, "llama3 scaling of a GGUF model comes as rope_freqs.weight, not as a type");
    double fs = 1.0;
    if (sc->type != KS_ROPE_SCALING_NONE && sc->factor > 0) {
        if (!(sc->factor < 1e6f)) return KS_FAIL(KS_ERR_INVALID_ARG, "RoPE scaling factor %g is implausible", (double)sc->factor);
        fs = 1.0 / (double)sc->factor;
    }
    double ext = sc->ext_factor >= 0 ? sc->ext_factor : sc->type == KS_ROPE_SCALING_YARN ? 1.0 : 0.0;
    double low = 0, high = 0, ms = sc->attention_factor > 0 ? sc->attention_factor : 1.0;
    if (ext != 0) {
        if (sc->orig_max_pos < 1)
            return KS_FAIL(KS_ERR_INVALID_ARG, "YaRN needs an original context length >= 1 (got %d)", sc->orig_max_pos);
        if (!(sc->beta_fast > 0 && sc->beta_slow > 0))
            return KS_FAIL(KS_ERR_INVALID_ARG, "YaRN beta_fast %g / beta_slow %g must be positive", (double)sc->beta_fast,
                           (double)sc->beta_slow);
        low = floor(yarn_correction_dim(n_rot, sc->beta_fast, base, sc->orig_max_pos));
        high = ceil(yarn_correction_dim(n_rot, sc->beta_slow, base, sc->orig_max_pos));
        if (low < 0) low = 0;
        if (high > n_rot - 1) high = n_rot - 1;
        double s = 1.0 / fs;
        double num = yarn_get_mscale(s, sc->yarn_mscale > 0 ? sc->yarn_mscale : 1.0);
        ms *= sc->log_mul != 0 ? num / yarn_get_mscale(s, sc->log_mul) : num;
    }
    for (int j = 0; j < n_rot / 2; j++) {
        double f = pow((double)base, -2.0 * j / n_rot);
        if (freq_factors) f /= freq_factors[j];
        if (ext != 0) {
            double y = ((double)j - low) / (high - low > 0.001 ? high - low : 0.001);
            double mix = (1.0 - (y < 0 ? 0 : y > 1 ? 1 : y)) * ext;
            f *= fs * (1.0 - mix) + mix;
        } else if (fs != 1.0) {
            f *= fs;
        }
        inv_freq[j] = f;
    }
    *mscale = (float)ms;
    return KS_OK;
}

void ks_rope_angles_inv(float *cos_out, float *sin_out, int32_t pos, int n_rot, const double *inv_freq, float mscale) {
    for (int j = 0; j < n_rot / 2; j++) {
        double a = (double)pos * inv_freq[j];
        cos_out[j] = (float)cos(a) * mscale;
        sin_out[j] = (float)sin(a) * mscale;
    }
}
