/*
 * model.h — a loaded model: hyper-parameters, weight views, tokenizer.
 *
 * Weights stay in the GGUF mapping (zero-copy); only the small 1-D tensors
 * (norm weights, biases, RoPE frequency factors) are converted to owned f32
 * arrays at load, so the forward pass never branches on their type.  All
 * architecture differences (RoPE pairing, q/k norms, qkv biases, tied output)
 * are resolved here into flags and optional pointers; the forward pass has a
 * single code path.
 */
#ifndef KS_MODEL_H
#define KS_MODEL_H

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

typedef enum ks_arch { KS_ARCH_LLAMA, KS_ARCH_QWEN2, KS_ARCH_QWEN3, KS_ARCH_NONE, KS_ARCH_QWEN3MOE } ks_arch;

/* A mixture-of-experts FFN (qwen3moe): a router picks n_expert_used of
 * n_expert SwiGLU experts per row (infer/moe.c).  The experts are views into
 * llama.cpp's stacked 3-D tensors (ffn_{gate,up,down}_exps, ne = {cols, rows,
 * n_expert}): expert e's [rows][cols] matrix is the e-th contiguous slice, so
 * a view is a pointer and no bytes are copied.  One allocation: the three
 * view arrays follow the struct. */
typedef struct ks_moe_layer {
    ks_weight router;         /* ffn_gate_inp [n_expert][n_embd] (f32 in llama.cpp's files) */
    ks_weight *gate, *up;     /* [n_expert] views, each [n_ff_exp][n_embd] */
    ks_weight *down;          /* [n_expert] views, each [n_embd][n_ff_exp] */
    size_t expert_bytes;      /* bytes of one expert's gate + up + down */
    /* Shared experts (qwen2moe, deepseek2: an always-on FFN beside the routed
     * ones) would be a slot here; qwen3moe has none, so none is bound. */
} ks_moe_layer;

typedef struct ks_layer {
    float *attn_norm;         /* [n_embd] */
    ks_weight wq;             /* [n_head*head_dim][n_embd] */
    ks_weight wk, wv;         /* [n_head_kv*head_dim][n_embd] */
    ks_weight wo;             /* [n_embd][n_head*head_dim] */
    float *bq;                /* [n_head*head_dim] or NULL (qwen2) */
    float *bk, *bv;           /* [n_head_kv*head_dim] or NULL (qwen2) */
    float *q_norm, *k_norm;   /* [head_dim] or NULL (qwen3) */
    float *ffn_norm;          /* [n_embd] */
    ks_weight w_gate, w_up;   /* [n_ff][n_embd] */
    ks_weight w_down;         /* [n_embd][n_ff] */
    ks_moe_layer *moe;        /* owned; non-NULL: this layer's FFN is the MoE (w_gate/up/down unbound) */
} ks_layer;

typedef struct ks_hparams {
    ks_arch arch;
    char arch_name[32];
    int32_t n_vocab, n_embd, n_layer, n_ff;
    int32_t n_head, n_head_kv, head_dim, n_rot;
    int32_t n_ctx_train;
    float rope_base, rms_eps;
    bool rope_neox;           /* rotate (x[i], x[i+n_rot/2]) instead of (x[2i], x[2i+1]) */
    /* mixture of experts (0 experts: a dense FFN) */
    int32_t n_expert, n_expert_used, n_ff_exp;
    bool expert_norm;         /* renormalise the selected experts' softmax weights to sum 1 */
} ks_hparams;

struct ks_model {
    ks_gguf *gguf;            /* owns the mapping every weight points into */
    ks_tokenizer *tok;
    ks_hparams hp;
    bool vocab_only;
    ks_weight tok_embd;       /* [n_vocab][n_embd] */
    float *output_norm;       /* [n_embd] */
    ks_weight output;         /* [n_vocab][n_embd] (== tok_embd when tied) */
    bool output_tied;
    float *rope_freq_factors; /* [n_rot/2] divisors of the rotation frequencies, or NULL */
    ks_layer *layers;         /* [n_layer] */
    size_t weight_bytes;      /* bytes of all weight tensors */
    int64_t n_params;
    void *packed;             /* huge-page copy of the repacked layer weights of a mapped file, or NULL */
};

#endif
