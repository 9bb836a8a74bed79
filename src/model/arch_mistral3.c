/*
 * arch_mistral3.c — the text decoder of Mistral Small 3.x / Ministral 3
 * ("mistral3"): the llama layer (normal RoPE) with YaRN scaling whose
 * magnitude uses rope.scaling.yarn_log_multiplier (HF's mscale_all_dim,
 * read for every architecture by model.c), and Llama 4's attention
 * temperature tuning when attention.temperature_scale (HF's
 * llama_4_scaling_beta) is present: after RoPE, q is multiplied by
 *   1 + beta * ln(floor(pos / original_context) + 1),
 * the step length being rope.scaling.original_context_length, as
 * llama.cpp's mistral3 loader sets n_attn_temp_floor_scale = n_ctx_orig_yarn.
 * Older Mistral Small files are "llama" with no such keys; a mixture-of-
 * experts mistral3 (ffn_gate_inp) is refused by the missing ffn_gate.
 */
#include "model/arch.h"

#include <math.h>

static ks_status mistral3_read_hparams(const ks_gguf *g, ks_hparams *hp) {
    float beta = 0;
    KS_TRY(ks_arch_key_f32(g, hp->arch_name, "attention.temperature_scale", &beta));
    if (!isfinite(beta) || beta < 0 || beta > 100)
        return KS_FAIL(KS_ERR_FORMAT, "%s.attention.temperature_scale = %g is implausible", hp->arch_name, beta);
    if (beta > 0) {
        hp->attn_temp_scale = beta;
        hp->attn_temp_floor = hp->rope_scaling.orig_max_pos;
        if (hp->attn_temp_floor < 1)
            return KS_FAIL(KS_ERR_FORMAT, "%s: attention temperature scaling needs an original context length",
                           hp->arch_name);
    }
    return KS_OK;
}

static ks_status mistral3_bind_layer(ks_model *m, int il, ks_layer *L) {
    return ks_arch_bind_llama_layer(m, il, L, false);
}

const ks_arch_desc ks_arch_mistral3 = {.name = "mistral3", .id = KS_ARCH_LLAMA, .rope_neox = false,
                                       .read_hparams = mistral3_read_hparams, .bind_layer = mistral3_bind_layer};
