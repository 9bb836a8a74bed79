/*
 * arch_gptoss.c — gpt-oss (gpt-oss-20b, gpt-oss-120b; GGUF arch "gpt-oss",
 * llama.cpp's LLM_ARCH_OPENAI_MOE): a mixture-of-experts decoder whose
 * differences from the llama block are all resolved here into ks_hparams /
 * ks_layer features, as arch.h prescribes.
 *
 *  - Attention: Q, K, V with biases, an output bias (attn_output.bias), NEOX
 *    RoPE with the file's YaRN scaling on every layer (llama.cpp gives the
 *    local layers the same base and scale), scale 1/sqrt(head_dim), and one
 *    learned sink logit per query head (attn_sinks.weight [n_head]) that
 *    joins the softmax's denominator with no value (infer/attn.h).  Sinks are
 *    not KV entries, so no selection policy can drop them.
 *  - Local and global layers alternate: with attention.sliding_window = W,
 *    layer il is local (window W) when il % pattern < pattern - 1, pattern
 *    being attention.sliding_window_pattern (default 2: even layers local,
 *    odd global), as llama.cpp's set_swa_pattern reads it and as the HF
 *    config's layer_types lists them.
 *  - The FFN's input norm is post_attention_norm.weight (HF's
 *    post_attention_layernorm; there is no ffn_norm), bound as ffn_norm.
 *  - Mixture of experts in every layer: a router with a bias
 *    (ffn_gate_inp.weight / .bias), the top expert_used_count experts by
 *    logit, their weights the softmax of the selected logits only (llama.cpp's
 *    LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT, HF's
 *    softmax(topk(router_logits))), each expert's three products with
 *    biases, and the clamped SwiGLU of gpt-oss (infer/moe.c):
 *    out = (clamp(up, -7, 7) + 1) * g * sigmoid(1.702 g), g = min(gate, 7).
 *    Experts are stored in MXFP4 in the published files (tensor/dtype.h).
 *
 * Keys: expert_count, expert_used_count, expert_feed_forward_length and
 * attention.sliding_window are required (llama.cpp's loader requires them
 * too); attention.sliding_window_pattern optional.  A rope.freq_base_swa
 * different from rope.freq_base is refused: the converter writes none, and
 * kvsieve's local-layer base would drop the YaRN scaling llama.cpp keeps.
 */
#include "model/arch.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define MAX_EXPERTS 4096  /* a bound on file input before it sizes allocations (gpt-oss: 32 and 128) */
#define GPTOSS_SWA_PATTERN 2 /* llama.cpp's default: every other layer local */

static ks_status gptoss_pattern(const ks_gguf *g, const char *arch, uint32_t *pattern) {
    *pattern = GPTOSS_SWA_PATTERN;
    KS_TRY(ks_arch_key_u32(g, arch, "attention.sliding_window_pattern", pattern, false));
    return KS_OK;
}

static ks_status gptoss_read_hparams(const ks_gguf *g, ks_hparams *hp) {
    const char *a = hp->arch_name;
    uint32_t n_expert = 0, n_used = 0, n_ff_exp = 0, n_swa = 0, pattern = 0;
    KS_TRY(ks_arch_key_u32(g, a, "expert_count", &n_expert, true));
    KS_TRY(ks_arch_key_u32(g, a, "expert_used_count", &n_used, true));
    KS_TRY(ks_arch_key_u32(g, a, "expert_feed_forward_length", &n_ff_exp, true));
    KS_TRY(ks_arch_key_u32(g, a, "attention.sliding_window", &n_swa, true));
    KS_TRY(gptoss_pattern(g, a, &pattern));
    if (n_expert == 0 || n_expert > MAX_EXPERTS)
        return KS_FAIL(KS_ERR_FORMAT, "%s.expert_count %u is outside [1, %d]", a, n_expert, MAX_EXPERTS);
    if (n_used == 0 || n_used > n_expert)
        return KS_FAIL(KS_ERR_FORMAT, "%s.expert_used_count %u must be in [1, expert_count %u]", a, n_used, n_expert);
    if (n_ff_exp == 0 || n_ff_exp > 1 << 20)
        return KS_FAIL(KS_ERR_FORMAT, "%s: expert feed-forward length %u is implausible", a, n_ff_exp);
    if (n_swa > (1u << 24)) return KS_FAIL(KS_ERR_FORMAT, "%s: sliding window %u is implausible", a, n_swa);
    float base_swa = hp->rope_base;
    KS_TRY(ks_arch_key_f32(g, a, "rope.freq_base_swa", &base_swa));
    if (base_swa != hp->rope_base)
        return KS_FAIL(KS_ERR_UNSUPPORTED, "%s.rope.freq_base_swa %g differs from rope.freq_base %g: not supported", a,
                       base_swa, hp->rope_base);
    hp->n_expert = (int32_t)n_expert;
    hp->n_expert_used = (int32_t)n_used;
    hp->n_ff_exp = (int32_t)n_ff_exp;
    hp->n_swa = (int32_t)n_swa;
    hp->rope_base_swa = 0; /* local layers rotate as the global ones, YaRN included */
    hp->expert_norm = false;
    hp->expert_softmax_topk = true;
    hp->ffn_swiglu_oai = true;
    return KS_OK;
}

/* A bias table [rows][cols] (ne {cols, rows}; rows 1: a vector, 1 or 2 dims)
 * dequantized into out[rows * cols]. */
static ks_status bind_table(ks_model *m, const char *name, int64_t rows, int64_t cols, float *out) {
    const ks_gguf_tensor *t = ks_gguf_find_tensor(m->gguf, name);
    if (!t) return KS_FAIL(KS_ERR_FORMAT, "tensor '%s' is missing", name);
    bool ok = t->ne[0] == cols && (rows == 1 ? t->n_dims == 1 || (t->n_dims == 2 && t->ne[1] == 1)
                                             : t->n_dims == 2 && t->ne[1] == rows);
    if (!ok)
        return KS_FAIL(KS_ERR_FORMAT, "tensor '%s' has shape [%lld, %lld] in %u dims, expected [%lld, %lld]", name,
                       (long long)t->ne[0], (long long)(t->n_dims > 1 ? t->ne[1] : 1), t->n_dims, (long long)cols,
                       (long long)rows);
    if (ks_dtype_block_size(t->type) <= 0 || cols % ks_dtype_block_size(t->type) != 0)
        return KS_FAIL(KS_ERR_UNSUPPORTED, "tensor '%s' has type %s, which a bias cannot use", name,
                       ks_dtype_name(t->type));
    const size_t rb = ks_dtype_row_bytes(t->type, cols);
    for (int64_t r = 0; r < rows; r++)
        ks_dequantize_row(t->type, (const uint8_t *)t->data + (size_t)r * rb, out + (size_t)r * cols, cols);
    m->weight_bytes += t->nbytes;
    m->n_params += rows * cols;
    return KS_OK;
}

static ks_status gptoss_bind_layer(ks_model *m, int il, ks_layer *L) {
    const ks_hparams *hp = &m->hp;
    const int64_t D = hp->n_embd, F = hp->n_ff_exp, E = hp->n_expert;
    const int64_t q_dim = (int64_t)hp->n_head * hp->head_dim;
    char nm[96];
#define NAME(suffix) (snprintf(nm, sizeof nm, "blk.%d." suffix, il), nm)
    KS_TRY(ks_model_bind_vec(m, NAME("attn_norm.weight"), D, true, &L->attn_norm));
    KS_TRY(ks_arch_bind_qkv(m, il, L));
    KS_TRY(ks_model_bind_weight(m, NAME("attn_output.weight"), D, q_dim, &L->wo));
    KS_TRY(ks_model_bind_vec(m, NAME("attn_output.bias"), D, true, &L->bo));
    KS_TRY(ks_model_bind_vec(m, NAME("attn_sinks.weight"), hp->n_head, true, &L->attn_sinks));
    KS_TRY(ks_model_bind_vec(m, NAME("post_attention_norm.weight"), D, true, &L->ffn_norm));
    /* the struct and its three view arrays in one block (model destroy frees L->moe), biases in another */
    ks_moe_layer *moe = ks_calloc(1, sizeof *moe + 3 * (size_t)E * sizeof(ks_weight));
    if (!moe) return KS_FAIL(KS_ERR_NOMEM, "layer %d: views of %lld experts", il, (long long)E);
    L->moe = moe;
    moe->gate = (ks_weight *)(moe + 1);
    moe->up = moe->gate + E;
    moe->down = moe->up + E;
    moe->bias_mem = ks_malloc(sizeof(float) * (size_t)(E + 2 * E * F + E * D));
    if (!moe->bias_mem) return KS_FAIL(KS_ERR_NOMEM, "layer %d: expert biases", il);
    moe->router_b = moe->bias_mem;
    moe->gate_b = moe->router_b + E;
    moe->up_b = moe->gate_b + E * F;
    moe->down_b = moe->up_b + E * F;
    KS_TRY(ks_model_bind_weight(m, NAME("ffn_gate_inp.weight"), E, D, &moe->router));
    KS_TRY(bind_table(m, NAME("ffn_gate_inp.bias"), 1, E, moe->router_b));
    KS_TRY(ks_model_bind_stacked(m, NAME("ffn_gate_exps.weight"), "expert tensor", F, D, m->hp.n_expert, moe->gate));
    KS_TRY(ks_model_bind_stacked(m, NAME("ffn_up_exps.weight"), "expert tensor", F, D, m->hp.n_expert, moe->up));
    KS_TRY(ks_model_bind_stacked(m, NAME("ffn_down_exps.weight"), "expert tensor", D, F, m->hp.n_expert, moe->down));
    KS_TRY(bind_table(m, NAME("ffn_gate_exps.bias"), E, F, moe->gate_b));
    KS_TRY(bind_table(m, NAME("ffn_up_exps.bias"), E, F, moe->up_b));
    KS_TRY(bind_table(m, NAME("ffn_down_exps.bias"), E, D, moe->down_b));
#undef NAME
    moe->expert_bytes = ks_weight_bytes(&moe->gate[0]) + ks_weight_bytes(&moe->up[0]) + ks_weight_bytes(&moe->down[0]);
    if (hp->n_swa > 0) {
        uint32_t pattern = 0;
        KS_TRY(gptoss_pattern(m->gguf, hp->arch_name, &pattern));
        bool local = pattern == 0 || (uint32_t)il % pattern < pattern - 1; /* pattern 0: every layer local */
        L->window = local ? hp->n_swa : 0;
    }
    return KS_OK;
}

const ks_arch_desc ks_arch_gptoss = {.name = "gpt-oss",
                                     .id = KS_ARCH_GPTOSS,
                                     .rope_neox = true,
                                     .read_hparams = gptoss_read_hparams,
                                     .bind_layer = gptoss_bind_layer};
