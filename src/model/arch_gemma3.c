/*
 * arch_gemma3.c — Gemma 3 (text): a llama block with five differences, all
 * resolved here into ks_hparams / ks_layer features.
 *
 *  - Local and global layers.  With <arch>.attention.sliding_window = W
 *    present and non-zero, layer il is local (its queries see the last W
 *    positions, their own included) unless il % pattern == pattern - 1,
 *    where pattern is <arch>.attention.sliding_window_pattern (default 6:
 *    five local layers, then one global).  This is how llama.cpp reads the
 *    file (set_swa_pattern without dense_first); the converter writes only
 *    sliding_window.  Without the key every layer is global.  gguf-py's
 *    add_sliding_window_pattern also writes the key as an array, one bool
 *    per layer, true for a sliding-window layer (its converters for
 *    gemma3n and later write HF's layer_types that way); such an array is
 *    read layer by layer here.  llama.cpp's gemma3 loader (get_key_or_arr
 *    into a scalar, not required) skips an array and keeps the period 6, so
 *    the two read the same layers exactly when the array has that period.
 *  - Two RoPE bases.  Global layers rotate with rope.freq_base (1e6) and
 *    the file's linear scaling (rope.scaling.factor: 8 on 4B and larger,
 *    read by model.c for every architecture); local layers with
 *    rope.freq_base_swa (default 10000, what llama.cpp assumes when the key
 *    is absent, as it is in converted files) and no scaling.
 *  - Norms around both sub-blocks: attn_norm and ffn_norm before, and
 *    post_attention_norm / post_ffw_norm on each sub-block's output before
 *    the residual add.  Gemma's RMSNorm multiplies by (1 + w); the
 *    converter stores w + 1, so every norm here is a plain RMSNorm.  Q and K
 *    carry per-head RMSNorms (before RoPE), as in Qwen3.
 *  - Input embeddings times sqrt(n_embd); the FFN gate through GELU (tanh
 *    approximation) instead of SiLU; NEOX RoPE pairing; tied output.
 *  - Attention scale 1/sqrt(head_dim), except the 27B (62 layers), whose
 *    query_pre_attn_scalar is n_embd / n_head (llama.cpp decides by layer
 *    count, and so do we).  An optional final_logit_softcapping applies
 *    cap * tanh(logits / cap).
 */
#include "model/arch.h"

#include <math.h>
#include <stdio.h>

/* the period of local/global layers: llama.cpp's default when the key is absent */
#define GEMMA3_SWA_PATTERN 6

/* Whether layer il of n_layer is local: from the pattern key as a period
 * (absent: GEMMA3_SWA_PATTERN) or as a per-layer array of bools / integers
 * (non-zero: local), whose length must be n_layer. */
static ks_status gemma3_layer_local(const ks_gguf *g, const char *arch, int32_t n_layer, int32_t il, bool *local) {
    char key[128];
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", arch);
    const ks_gguf_kv *kv = ks_gguf_find_kv(g, key);
    if (kv && kv->type == KS_GGUF_ARRAY) {
        if (kv->arr_type == KS_GGUF_STRING || kv->arr_type == KS_GGUF_ARRAY || !kv->arr_data)
            return KS_FAIL(KS_ERR_FORMAT, "'%s' is an array of %s, expected bools (one per layer)", key,
                           ks_gguf_type_name(kv->arr_type));
        if (kv->arr_n != (uint64_t)n_layer)
            return KS_FAIL(KS_ERR_FORMAT, "'%s' has %llu entries for %d layers", key, (unsigned long long)kv->arr_n,
                           n_layer);
        *local = ks_gguf_arr_f64(kv, (uint64_t)il) != 0.0;
        return KS_OK;
    }
    uint32_t pattern = GEMMA3_SWA_PATTERN;
    KS_TRY(ks_arch_key_u32(g, arch, "attention.sliding_window_pattern", &pattern, false));
    /* pattern 0: every layer local (llama.cpp's n_pattern == 0) */
    *local = pattern == 0 || (uint32_t)il % pattern < pattern - 1;
    return KS_OK;
}

static ks_status gemma3_read_hparams(const ks_gguf *g, ks_hparams *hp) {
    const char *a = hp->arch_name;
    uint32_t n_swa = 0;
    bool local = false;
    KS_TRY(ks_arch_key_u32(g, a, "attention.sliding_window", &n_swa, false));
    KS_TRY(gemma3_layer_local(g, a, hp->n_layer, 0, &local)); /* a malformed pattern key fails at load */
    if (n_swa > (1u << 24)) return KS_FAIL(KS_ERR_FORMAT, "sliding window %u is implausible", n_swa);
    hp->n_swa = (int32_t)n_swa;
    if (n_swa > 0) {
        hp->rope_base_swa = 10000.0f;
        KS_TRY(ks_arch_key_f32(g, a, "rope.freq_base_swa", &hp->rope_base_swa));
        if (!(hp->rope_base_swa > 1.0f) || !isfinite(hp->rope_base_swa))
            return KS_FAIL(KS_ERR_FORMAT, "local RoPE base %g must exceed 1", hp->rope_base_swa);
    }
    KS_TRY(ks_arch_key_f32(g, a, "final_logit_softcapping", &hp->logit_softcap));
    if (!(hp->logit_softcap >= 0) || !isfinite(hp->logit_softcap))
        return KS_FAIL(KS_ERR_FORMAT, "final logit softcapping %g must be >= 0", hp->logit_softcap);
    if (hp->n_layer == 62) /* 27B: query_pre_attn_scalar = n_embd / n_head */
        hp->attn_q_scale = sqrtf((float)hp->head_dim) / sqrtf((float)(hp->n_embd / hp->n_head));
    hp->embd_scale = true;
    hp->ffn_gelu = true;
    return KS_OK;
}

static ks_status gemma3_bind_layer(ks_model *m, int il, ks_layer *L) {
    const ks_hparams *hp = &m->hp;
    KS_TRY(ks_arch_bind_llama_layer(m, il, L, true));
    char nm[96];
    snprintf(nm, sizeof nm, "blk.%d.post_attention_norm.weight", il);
    KS_TRY(ks_model_bind_vec(m, nm, hp->n_embd, true, &L->attn_post_norm));
    snprintf(nm, sizeof nm, "blk.%d.post_ffw_norm.weight", il);
    KS_TRY(ks_model_bind_vec(m, nm, hp->n_embd, true, &L->ffn_post_norm));
    if (hp->n_swa > 0) {
        bool local = false;
        KS_TRY(gemma3_layer_local(m->gguf, hp->arch_name, hp->n_layer, il, &local));
        L->window = local ? hp->n_swa : 0;
    }
    return KS_OK;
}

const ks_arch_desc ks_arch_gemma3 = {.name = "gemma3",
                                     .id = KS_ARCH_GEMMA3,
                                     .rope_neox = true,
                                     .read_hparams = gemma3_read_hparams,
                                     .bind_layer = gemma3_bind_layer};
