/*
 * shapes.h — a table of real model shapes, and a generator that writes a GGUF
 * with deterministic pseudo-random weights of any of them.
 *
 * Why: performance and memory behaviour of a decoder depend on its shape
 * (n_embd, heads, GQA ratio, head_dim, n_ff, vocabulary), not on trained
 * weights.  Downloading an 8B checkpoint in CI is not possible; generating
 * one of exactly the same shape is.  The tiny shapes (every dim a multiple of
 * 256 so all K-quants apply) exercise each architectural feature — GQA, MQA,
 * MHA, QKV bias, Q/K norm, llama3 rope scaling, tied output — in files small
 * enough for unit tests.  The generator lives in the library, not the CLI, so
 * tests of other modules can make a model in-process.
 */
#ifndef KS_SHAPES_H
#define KS_SHAPES_H

#include "core/core.h"
#include "gguf/gguf.h"

typedef struct ks_model_shape {
    const char *name;      /* "llama-3.1-8b" */
    const char *arch;      /* GGUF general.architecture: "llama" | "qwen2" | "qwen3" | "qwen3moe" */
    int32_t n_embd;
    int32_t n_layer;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t head_dim;      /* may differ from n_embd / n_head (qwen3) */
    int32_t n_ff;
    float rope_theta;
    float rms_eps;
    int32_t n_ctx;         /* training context (<arch>.context_length) */
    bool tied_output;      /* no output.weight: logits use token_embd */
    bool qkv_bias;         /* blk.N.attn_{q,k,v}.bias (qwen2) */
    bool qk_norm;          /* blk.N.attn_{q,k}_norm.weight [head_dim] (qwen3) */
    bool rope_llama3;      /* rope_freqs.weight from the Llama 3.1 rule */
    float rope_factor;     /* llama3: factor, low/high freq factors, original ctx */
    float rope_low_freq_factor;
    float rope_high_freq_factor;
    int32_t rope_orig_ctx;
    /* RoPE scaling stated by keys (rope_factor and rope_orig_ctx above give
     * its factor and original context) and the newer architectures' features;
     * zero / NULL = absent */
    const char *rope_scaling;  /* "yarn" / "linear": rope.scaling.type; "longrope": phi3's
                                  rope_factors_short/long.weight, no type key (as the converter) */
    float rope_attn_factor;    /* rope.scaling.attn_factor */
    float yarn_log_mul;        /* rope.scaling.yarn_log_multiplier (mistral3) */
    float attn_temp_scale;     /* attention.temperature_scale (mistral3) */
    int32_t n_rot;             /* rope.dimension_count (0: head_dim; phi3 rotates part of a head) */
    bool fused;                /* attn_qkv.weight and gate+up in ffn_up.weight (phi3) */
    /* gemma3 (arch "gemma3": post-norms, GELU, scaled embedding implied) */
    int32_t swa_window;    /* <arch>.attention.sliding_window (gemma3: its local layers; phi3 writes one
                              that llama.cpp ignores); 0: none written */
    int32_t swa_pattern;   /* <arch>.attention.sliding_window_pattern; 0: not written (llama.cpp's 6) */
    /* mixture of experts (qwen3moe): n_expert > 0 replaces every layer's
     * dense FFN by a router (ffn_gate_inp) and n_expert stacked SwiGLU
     * experts of n_ff_exp (ffn_{gate,up,down}_exps, 3-D) */
    int32_t n_expert, n_expert_used, n_ff_exp;
    /* deepseek2: multi-head latent attention when kv_lora_rank > 0 (head_dim
     * is then qk_nope + n_rot, the decompressed key, and n_head_kv 1: the
     * latent head, as the converter writes them), shared experts beside the
     * routed ones, the first n_dense_lead layers dense (n_ff), and the
     * routed weights' scale; zero = absent */
    int32_t kv_lora_rank, q_lora_rank, qk_nope, v_head;
    int32_t n_expert_shared, n_dense_lead;
    float expert_weights_scale;
} ks_model_shape;

int ks_shape_count(void);
const ks_model_shape *ks_shape_at(int i);
/* NULL if no shape has that name. */
const ks_model_shape *ks_shape_find(const char *name);

/* Per-frequency divisors of the Llama 3.1 rope scaling rule, as llama.cpp's
 * converter stores them in rope_freqs.weight: out[head_dim / 2]. */
void ks_shape_rope_factors(const ks_model_shape *s, float *out);
/* LongRoPE divisors of a generated phi3 file, out[n_rot / 2]: smooth ramps,
 * short from 1 to 1.5 and long from 1 to rope_factor (larger for the low
 * frequencies, as in real checkpoints).  Not a trained model's values. */
void ks_shape_longrope_factors(const ks_model_shape *s, bool long_factors, float *out);

/* llama.cpp's general.file_type (LLAMA_FTYPE_*) for a uniform weight type. */
uint32_t ks_shape_file_type(ks_dtype type);

typedef void (*ks_shape_progress_fn)(void *user, int64_t tensor, int64_t n_tensors, const char *name,
                                     uint64_t bytes_done, uint64_t bytes_total);

typedef struct ks_shape_gen_params {
    ks_dtype type;           /* weight type of the 2-D tensors */
    bool mix_k_m;            /* llama.cpp's _K_M mix: attn_v / ffn_down of its "more bits" layers and the
                              * output matrix in Q6_K, the rest in type (ks_shape_file_type_mix) */
    const ks_gguf *vocab;    /* tokenizer.* keys are copied from here; its token count is n_vocab */
    uint64_t seed;
    int32_t n_layer;         /* > 0: override the shape's layer count */
    int32_t n_ctx;           /* > 0: override the shape's context length */
    int32_t n_threads;       /* <= 0: all cores */
    /* non-NULL: <arch>.attention.sliding_window_pattern written as gguf-py's
     * per-layer form, an array of n_swa_layers bools (1: sliding-window layer),
     * instead of the shape's period (tests of files converted that way) */
    const uint8_t *swa_layers;
    int32_t n_swa_layers;
    ks_shape_progress_fn progress; /* optional, called before each tensor */
    void *progress_user;
} ks_shape_gen_params;

/* Write a GGUF of shape s with deterministic weights: the same params give a
 * byte-identical file, whatever the thread count.  *out_bytes (optional)
 * receives the file size.  KS_ERR_INVALID_ARG (vocab without tokens, bad
 * override), KS_ERR_IO (disk full; the partial file is removed). */
ks_status ks_shape_generate(const ks_model_shape *s, const ks_shape_gen_params *p, const char *path,
                            uint64_t *out_bytes);

#endif
