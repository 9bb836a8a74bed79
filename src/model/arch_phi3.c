/*
 * arch_phi3.c — Phi-3 / Phi-3.5 / Phi-4-mini ("phi3" in GGUF).
 *
 * What differs from the llama layer, as llama.cpp's converter writes it:
 *   - Q, K and V fused in one attn_qkv.weight [q_dim + 2 kv_dim][n_embd],
 *     and gate and up fused in one ffn_up.weight [2 n_ff][n_embd] (gate
 *     first: HF's gate_up_proj.chunk(2)); both are bound as row views
 *     (ks_model_bind_rows), so the forward pass sees ordinary wq/wk/wv and
 *     w_gate/w_up and the file is not copied.
 *   - NEOX RoPE over a partial rotary dimension (Phi-4-mini rotates 96 of
 *     128 dims: rope.dimension_count), with LongRoPE: the file carries
 *     rope_factors_short/long.weight and rope.scaling.attn_factor but no
 *     rope.scaling.type key; model.c binds the factors for every
 *     architecture and ks_model_rope_freqs picks short or long by the
 *     context size against rope.scaling.original_context_length, as
 *     llama.cpp's get_rope_factors does.
 *   - attention.sliding_window is written (0 for Phi-4, 2047/262144 for
 *     others) but llama.cpp disables Phi's SWA (it warns and attends to the
 *     whole context, llama.cpp PR 13676), so it is not read here either.
 */
#include "model/arch.h"

#include <stdio.h>

static ks_status phi3_bind_layer(ks_model *m, int il, ks_layer *L) {
    const ks_hparams *hp = &m->hp;
    char nm[96];
    KS_TRY(ks_arch_bind_attention(m, il, L, false));
    snprintf(nm, sizeof nm, "blk.%d.ffn_up.weight", il); /* [gate; up] */
    KS_TRY(ks_model_bind_rows(m, nm, 2 * (int64_t)hp->n_ff, 0, hp->n_ff, hp->n_embd, &L->w_gate));
    KS_TRY(ks_model_bind_rows(m, nm, 2 * (int64_t)hp->n_ff, hp->n_ff, hp->n_ff, hp->n_embd, &L->w_up));
    snprintf(nm, sizeof nm, "blk.%d.ffn_down.weight", il);
    return ks_model_bind_weight(m, nm, hp->n_embd, hp->n_ff, &L->w_down);
}

const ks_arch_desc ks_arch_phi3 = {
    .name = "phi3", .id = KS_ARCH_LLAMA, .rope_neox = true, .bind_layer = phi3_bind_layer};
