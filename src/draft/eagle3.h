/*
 * eagle3.h — EAGLE-3 draft models (the SpeContext "DLM") loaded from Hugging
 * Face checkpoints, and the retrieval head's Q/K computation.
 *
 * An EAGLE-3 draft model is one Llama decoder layer whose attention input is
 * 2H wide: [input_layernorm(embedding of the previous token); hidden_norm(fc(
 * [h_lo; h_mid; h_hi]))], where h_* are the residual-stream states of three
 * target layers (the input to decoder layers 2, L/2 and L-3 by default).
 * SpeContext's "lightweight retrieval head" keeps only what the attention
 * scores need: embedding, fc, the two norms and q_proj / k_proj; v/o, the MLP,
 * the final norm and the LM head are pruned.  ks_eagle3_load with
 * head_only=true loads exactly that set (copied out of the checkpoint, which
 * is then closed), so pruning is a load-time choice, not a second file.
 *
 * Checkpoint layout accepted (public EAGLE-3 releases differ): layer tensors
 * under "midlayer." (SafeAILab/EAGLE, e.g. yuhuili/EAGLE3-LLaMA3.1-Instruct-8B)
 * or "layers.0." (vllm-project/speculators conversions), each optionally with
 * a "model." prefix; embed_tokens is often absent (the target's embedding is
 * then supplied by the caller: has_embed=false).  Matrices stay in their file
 * dtype (F32/F16/BF16) and are read through ks_eagle3_mat_vec; the 1-D norms
 * are converted to f32 at load.
 *
 * RoPE: HF-layout checkpoints rotate with rotate_half, i.e. pairs (i, i+hd/2)
 * — the `neox` convention of ks_rope_apply — not llama.cpp's adjacent pairs
 * (GGUF converters permute q/k rows to get those; safetensors are unpermuted).
 * The draft was trained at 2K positions; long contexts use YaRN
 * (training-free), configured from config.json's rope_scaling or overridden
 * with ks_eagle3_set_rope_scaling.
 */
#ifndef KS_EAGLE3_H
#define KS_EAGLE3_H

#include "checkpoint/safetensors.h"
#include "tensor/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A matrix view: [rows][cols] row-major in the file dtype (F32/F16/BF16). */
typedef struct ks_eagle3_mat {
    ks_st_dtype dtype;
    int64_t rows, cols;
    const void *data;            /* possibly unaligned; NULL if absent */
} ks_eagle3_mat;

typedef struct ks_eagle3_config {
    char arch[64];               /* architectures[0], e.g. "LlamaForCausalLMEagle3" */
    int32_t hidden_size;         /* H of the draft */
    int32_t target_hidden_size;  /* H of the target (== hidden_size unless the config says) */
    int32_t intermediate_size;
    int32_t n_head, n_head_kv, head_dim;
    int32_t vocab_size, draft_vocab_size;
    int32_t max_pos;             /* max_position_embeddings */
    float rms_eps, rope_theta;
    ks_rope_scaling rope;
    int32_t aux_layers[3];       /* eagle_aux_hidden_state_layer_ids as written, or -1 = default [2, L/2, L-3] */
    bool aux_layers_set;
    /* What an id means.  false (EAGLE, vLLM, speculators: the top-level key):
     * id i is the residual stream *entering* layer i.  true (SpecForge and
     * SGLang: eagle_config.eagle_aux_hidden_state_layer_ids): id i is the
     * *output* of layer i, i.e. the stream entering layer i + 1. */
    bool aux_ids_are_outputs;
    char aux_source[96];         /* where the ids came from, for the log */
    bool fc_norm;                /* config "fc_norm": SpecForge's RMSNorm on each fused state before fc */
} ks_eagle3_config;

typedef struct ks_eagle3_params {
    bool head_only;              /* load only the retrieval head (SpeContext pruning) */
    bool embed_only;             /* retrieval head without fused target states: fc/hidden_norm not needed */
    bool use_mmap;               /* map the checkpoint (default) or read it into memory */
} ks_eagle3_params;

typedef struct ks_eagle3 {
    ks_eagle3_config cfg;
    bool head_only, embed_only;
    char layer_prefix[32];       /* "midlayer." / "layers.0." / with "model." */
    /* retrieval head */
    bool has_embed;              /* false: the caller supplies the target's embedding */
    ks_eagle3_mat embed;         /* [vocab_size][H] */
    ks_eagle3_mat fc;            /* [H][3*target_H]; absent when embed_only */
    float *fc_bias;              /* [H] or NULL */
    float *fc_norm[3];           /* [target_H] each: SpecForge's fc_norm.{0,1,2} (NULL when absent) */
    float *hidden_norm;          /* [H] (NULL when embed_only) */
    float *input_norm;           /* [H] */
    ks_eagle3_mat wq;            /* [n_head*head_dim][2H] */
    ks_eagle3_mat wk;            /* [n_head_kv*head_dim][2H] */
    float *q_norm, *k_norm;      /* [head_dim] or NULL (Qwen3-style drafts) */
    /* full model only (data NULL when head_only) */
    ks_eagle3_mat wv;            /* [n_head_kv*head_dim][2H] */
    ks_eagle3_mat wo;            /* [H][n_head*head_dim] */
    float *post_norm;            /* [H] */
    ks_eagle3_mat w_gate, w_up;  /* [intermediate][H] */
    ks_eagle3_mat w_down;        /* [H][intermediate] */
    float *norm;                 /* [H] */
    ks_eagle3_mat lm_head;       /* [draft_vocab][H] */
    int64_t *d2t;                /* [draft_vocab] draft id -> target id offset, or NULL */
    uint8_t *t2d;                /* [vocab] target id kept in the draft vocabulary, or NULL */
    /* RoPE tables for ks_eagle3_head_qk */
    float *inv_freq;             /* [head_dim/2] */
    float mscale;
    float yarn_factor;           /* YaRN added by ks_eagle3_add_yarn on top of cfg.rope (0: none) */
    /* parameter counts (elements) */
    int64_t n_params_ckpt;       /* every float tensor in the checkpoint */
    int64_t n_params_full;       /* the DLM's parameters as loaded in full (incl. embedding if present) */
    int64_t n_params_head;       /* the retrieval head (incl. embedding if present) */
    int64_t n_params_embed;      /* embedding alone (0 if absent) */
    /* storage */
    ks_safetensors *st;          /* open checkpoint (full load), or NULL */
    void *arena;                 /* owned copies of the head tensors (head_only) */
} ks_eagle3;

ks_eagle3_params ks_eagle3_default_params(void);
/* Parse config.json (a path to the file). */
ks_status ks_eagle3_read_config(const char *config_path, ks_eagle3_config *out);
/* Load a checkpoint directory (config.json + model.safetensors or the
 * sharded index).  Every tensor the mode needs must exist with its exact
 * shape (KS_ERR_FORMAT naming the tensor and both shapes otherwise). */
ks_status ks_eagle3_load(const char *dir, ks_eagle3_params params, ks_eagle3 **out);
void ks_eagle3_destroy(ks_eagle3 *dlm);

/* The target layers whose *entering* residual stream the draft fuses (the
 * engine's capture convention; n_layer = after the last layer), in
 * ascending order as EAGLE, vLLM and SGLang concatenate them: the config's
 * ids translated by their convention (aux_ids_are_outputs: + 1), or
 * EAGLE-3's default [2, L/2, L-3]. */
void ks_eagle3_aux_layers(const ks_eagle3 *dlm, int32_t n_layer, int32_t out[3]);
/* Override the ids (spec's aux_ids=): outputs=false means the streams
 * entering layers ids[i], true the outputs of layers ids[i]. */
void ks_eagle3_set_aux_layers(ks_eagle3 *dlm, const int32_t ids[3], bool outputs, const char *source);
/* RMSNorm each of the three [target_H] fused states in place with fc_norm
 * (SpecForge), a no-op when the draft has none. */
void ks_eagle3_fc_norm(const ks_eagle3 *dlm, float *h3);
/* The shapes of the target model a draft is checked against (a GGUF model's
 * hyper-parameters, or what a selection policy is told of its target). */
typedef struct ks_eagle3_target {
    int32_t n_vocab, n_embd, n_layer;
    int32_t n_head, n_head_kv, head_dim;
} ks_eagle3_target;
/* The DLM fits a target with these hyper-parameters (hidden size, vocab,
 * aux layer ids in range, head dim vs RoPE); KS_ERR_FORMAT with a message. */
ks_status ks_eagle3_check_target(const ks_eagle3 *dlm, const ks_eagle3_target *target);

/* Replace the RoPE scaling (e.g. YaRN for long contexts) and rebuild tables. */
ks_status ks_eagle3_set_rope_scaling(ks_eagle3 *dlm, const ks_rope_scaling *sc);
/* Extend the head's context with YaRN (factor over orig_max_pos positions)
 * on top of the checkpoint's own RoPE scaling from config.json: each
 * frequency of that scaling (linear, llama3, yarn or none) is multiplied by
 * YaRN's per-dimension ratio to plain RoPE, and the attention scales
 * multiply.  cfg.rope stays the checkpoint's; KS_ERR_INVALID_ARG on a bad
 * factor (the tables are unchanged then). */
ks_status ks_eagle3_add_yarn(ks_eagle3 *dlm, float factor, int32_t orig_max_pos);

/* y[rows] = W x[cols] in f32 whatever the stored dtype. */
ks_status ks_eagle3_mat_vec(const ks_eagle3_mat *w, const float *x, float *y); /* KS_ERR_NOMEM: row buffer */

/* Retrieval-head Q and K of one token at position pos.
 *   h3:  [3*target_H] = [h_lo; h_mid; h_hi] (ignored / may be NULL when embed_only)
 *   emb: [H] embedding of the token (shifted by one, EAGLE style)
 *   q_out: [n_head*head_dim], k_out: [n_head_kv*head_dim], RoPE applied.
 * x = [input_layernorm(emb); hidden_norm(fc(h3))]; in embed_only mode the
 * hidden half is zero (no fused features).  Dims are head-major. */
ks_status ks_eagle3_head_qk(const ks_eagle3 *dlm, const float *h3, const float *emb, int32_t pos,
                            float *q_out, float *k_out);
/* Embedding row of token id (needs has_embed). */
ks_status ks_eagle3_embed(const ks_eagle3 *dlm, int32_t token, float *out);

/* Human-readable summary (config, tensors kept, parameter counts). */
ks_status ks_eagle3_describe(const ks_eagle3 *dlm, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
