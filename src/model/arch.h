/*
 * arch.h — one file per architecture (src/model/arch_<name>.c), inside the
 * model module.
 *
 * Every architecture kvsieve runs is a llama-shaped decoder with a few
 * differences: where RoPE pairs its dimensions, whether Q/K carry biases or
 * per-head norms, how tensors are named or fused, how RoPE is scaled.  An
 * architecture file resolves those differences at load time into the flags
 * and optional pointers of ks_hparams and ks_layer, so the forward pass
 * (infer/forward.c) keeps a single code path that branches on features,
 * never on architecture names.  This is llama.cpp's src/models/ idea
 * (a file per architecture) applied to loading rather than to graph building.
 *
 * A descriptor is a small vtable with required and optional slots.  The
 * loader (model.c) reads the keys every architecture shares
 * (ks_arch_read_common_hparams), then calls the descriptor's slots in order:
 *   read_hparams (optional)  architecture-specific keys and flags;
 *   bind_model   (optional)  model-level tensors beyond embedding, output
 *                            norm, output matrix and rope_freqs;
 *   bind_layer   (required)  every tensor of layer il.
 * Adding an architecture: write arch_<name>.c defining one ks_arch_desc,
 * declare it below, and list it in arch.c's table.
 */
#ifndef KS_MODEL_ARCH_H
#define KS_MODEL_ARCH_H

#include "model/model.h"

typedef struct ks_arch_desc {
    const char *name;      /* general.architecture as llama.cpp's converter writes it */
    ks_arch id;
    bool rope_neox;        /* default RoPE pairing (read_hparams may change it) */
    ks_status (*read_hparams)(const ks_gguf *g, ks_hparams *hp);  /* optional */
    ks_status (*bind_model)(ks_model *m);                          /* optional */
    ks_status (*bind_layer)(ks_model *m, int il, ks_layer *L);     /* required */
} ks_arch_desc;

extern const ks_arch_desc ks_arch_llama, ks_arch_mistral, ks_arch_qwen2, ks_arch_qwen3;
extern const ks_arch_desc ks_arch_phi3, ks_arch_smollm3, ks_arch_mistral3;
extern const ks_arch_desc ks_arch_gemma3;
extern const ks_arch_desc ks_arch_qwen3moe;
extern const ks_arch_desc ks_arch_gptoss;
extern const ks_arch_desc ks_arch_deepseek2;

/* The descriptor for general.architecture `name`, or NULL. */
const ks_arch_desc *ks_arch_find(const char *name);
/* "llama, mistral, ..." for messages. */
const char *ks_arch_names(void);

/* ---- shared binding helpers (model.c) ---------------------------------- */

/* "<arch>.<suffix>" as u32 / f32; an absent optional key leaves *out as is. */
ks_status ks_arch_key_u32(const ks_gguf *g, const char *arch, const char *suffix, uint32_t *out, bool required);
ks_status ks_arch_key_f32(const ks_gguf *g, const char *arch, const char *suffix, float *out);
/* A 2-D weight [rows][cols] (GGUF ne = {cols, rows}), shape checked. */
ks_status ks_model_bind_weight(ks_model *m, const char *name, int64_t rows, int64_t cols, ks_weight *w);
/* Rows [row0, row0 + rows) of a fused 2-D tensor [total_rows][cols]: a view, no copy. */
ks_status ks_model_bind_rows(ks_model *m, const char *name, int64_t total_rows, int64_t row0, int64_t rows,
                             int64_t cols, ks_weight *w);
/* The 3-D tensor `name` (ne {cols, rows, n}) as n views of [rows][cols], the
 * i-th the i-th contiguous slice: stacked experts, or per-head matrices
 * (deepseek2's k_b / v_b).  `what` names it in errors ("expert tensor"). */
ks_status ks_model_bind_stacked(ks_model *m, const char *name, const char *what, int64_t rows, int64_t cols, int64_t n,
                                ks_weight *views);
/* A 1-D tensor of n elements as an owned f32 array; NULL if optional and absent. */
ks_status ks_model_bind_vec(ks_model *m, const char *name, int64_t n, bool required, float **out);
/* The llama tensor set of layer il (attn_norm, attn_q/k/v/output with
 * optional biases and q/k norms, ffn_norm, ffn_gate/up/down). */
ks_status ks_arch_bind_llama_layer(ks_model *m, int il, ks_layer *L, bool need_qk_norm);
/* Its attention half and ffn_norm (attn_norm, Q/K/V fused or not, attn_output,
 * optional q/k norms, ffn_norm), for architectures whose FFN differs. */
ks_status ks_arch_bind_attention(ks_model *m, int il, ks_layer *L, bool need_qk_norm);
/* Q, K, V of layer il (wq/wk/wv and optional biases): separate attn_q/k/v
 * tensors, or one fused attn_qkv.weight (+ attn_qkv.bias) [q_dim + 2 kv_dim]
 * bound as three row views, as llama.cpp accepts either for any
 * architecture (create_tensor_qkv). */
ks_status ks_arch_bind_qkv(ks_model *m, int il, ks_layer *L);

#endif
