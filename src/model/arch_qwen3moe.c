/*
 * arch_qwen3moe.c — Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's
 * attention (no biases, per-head RMSNorm of Q and K before NEOX RoPE) with a
 * mixture-of-experts FFN in every layer.
 *
 * Every layer is MoE: llama.cpp's qwen3moe loader binds ffn_gate_inp and the
 * stacked experts in each layer and no dense FFN (HF's mlp_only_layers is
 * empty and decoder_sparse_step is 1 for the published checkpoints), and
 * there are no shared experts (qwen2moe's ffn_*_shexp do not exist here).
 * Routing follows llama.cpp's build_moe_ffn as qwen3moe calls it: softmax
 * over the router logits, top expert_used_count, the selected weights
 * renormalised to sum 1 (norm_w is always on for qwen3moe, whatever the HF
 * config's norm_topk_prob said), no weight scale.
 *
 * Keys: <arch>.expert_count, <arch>.expert_used_count (required),
 * <arch>.expert_feed_forward_length (optional: llama.cpp falls back to
 * feed_forward_length / expert_used_count, and so do we).  Tensors of layer
 * N: ffn_gate_inp.weight ne {n_embd, n_expert}, ffn_gate_exps.weight and
 * ffn_up_exps.weight ne {n_embd, n_ff_exp, n_expert}, ffn_down_exps.weight
 * ne {n_ff_exp, n_embd, n_expert}, as the converter stacks them.
 */
#include "model/arch.h"

#include <stdio.h>
#include <string.h>

#define MAX_EXPERTS 4096 /* a bound on file input before it sizes allocations (real models: <= 512) */

static ks_status qwen3moe_read_hparams(const ks_gguf *g, ks_hparams *hp) {
    uint32_t n_expert = 0, n_used = 0, n_ff_exp = 0;
    KS_TRY(ks_arch_key_u32(g, hp->arch_name, "expert_count", &n_expert, true));
    KS_TRY(ks_arch_key_u32(g, hp->arch_name, "expert_used_count", &n_used, true));
    KS_TRY(ks_arch_key_u32(g, hp->arch_name, "expert_feed_forward_length", &n_ff_exp, false));
    if (n_expert == 0 || n_expert > MAX_EXPERTS)
        return KS_FAIL(KS_ERR_FORMAT, "%s.expert_count %u is outside [1, %d]", hp->arch_name, n_expert, MAX_EXPERTS);
    if (n_used == 0 || n_used > n_expert)
        return KS_FAIL(KS_ERR_FORMAT, "%s.expert_used_count %u must be in [1, expert_count %u]", hp->arch_name, n_used,
                       n_expert);
    if (n_ff_exp == 0) n_ff_exp = (uint32_t)hp->n_ff / n_used;
    if (n_ff_exp == 0 || n_ff_exp > 1 << 20)
        return KS_FAIL(KS_ERR_FORMAT, "%s: expert feed-forward length %u is implausible", hp->arch_name, n_ff_exp);
    hp->n_expert = (int32_t)n_expert;
    hp->n_expert_used = (int32_t)n_used;
    hp->n_ff_exp = (int32_t)n_ff_exp;
    hp->expert_norm = true;
    return KS_OK;
}

static ks_status qwen3moe_bind_layer(ks_model *m, int il, ks_layer *L) {
    const ks_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd, F = hp->n_ff_exp;
    char nm[96];
#define NAME(suffix) (snprintf(nm, sizeof nm, "blk.%d." suffix, il), nm)
    /* qwen3's attention tensors (q/k norms required); the FFN is the experts below */
    KS_TRY(ks_arch_bind_attention(m, il, L, true));
    /* the struct and its three view arrays in one block: model destroy frees L->moe alone */
    const size_t n_expert = (size_t)hp->n_expert;
    ks_moe_layer *moe = ks_calloc(1, sizeof *moe + 3 * n_expert * sizeof(ks_weight));
    if (!moe) return KS_FAIL(KS_ERR_NOMEM, "layer %d: views of %zu experts", il, n_expert);
    L->moe = moe;
    moe->gate = (ks_weight *)(moe + 1);
    moe->up = moe->gate + n_expert;
    moe->down = moe->up + n_expert;
    KS_TRY(ks_model_bind_weight(m, NAME("ffn_gate_inp.weight"), hp->n_expert, E, &moe->router));
    KS_TRY(ks_model_bind_stacked(m, NAME("ffn_gate_exps.weight"), "expert tensor", F, E, m->hp.n_expert, moe->gate));
    KS_TRY(ks_model_bind_stacked(m, NAME("ffn_up_exps.weight"), "expert tensor", F, E, m->hp.n_expert, moe->up));
    KS_TRY(ks_model_bind_stacked(m, NAME("ffn_down_exps.weight"), "expert tensor", E, F, m->hp.n_expert, moe->down));
#undef NAME
    moe->expert_bytes = ks_weight_bytes(&moe->gate[0]) + ks_weight_bytes(&moe->up[0]) + ks_weight_bytes(&moe->down[0]);
    return KS_OK;
}

const ks_arch_desc ks_arch_qwen3moe = {.name = "qwen3moe",
                                       .id = KS_ARCH_QWEN3MOE,
                                       .rope_neox = true,
                                       .read_hparams = qwen3moe_read_hparams,
                                       .bind_layer = qwen3moe_bind_layer};
