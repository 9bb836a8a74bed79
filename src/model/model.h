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
#include "tensor/ops.h"
#include "tokenizer/tokenizer.h"

typedef enum ks_arch {
    KS_ARCH_LLAMA,
    KS_ARCH_QWEN2,
    KS_ARCH_QWEN3,
    KS_ARCH_GEMMA3,
    KS_ARCH_QWEN3MOE,
    KS_ARCH_GPTOSS,
    KS_ARCH_DEEPSEEK2,
    KS_ARCH_NONE
} ks_arch;

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
    /* gpt-oss: biases of the router and of every expert's three products
     * (ffn_gate_inp.bias, ffn_{gate,up,down}_exps.bias), views into the one
     * owned block bias_mem; NULL where the model has none (qwen3moe) */
    float *router_b;          /* [n_expert] */
    float *gate_b, *up_b;     /* [n_expert][n_ff_exp] */
    float *down_b;            /* [n_expert][n_embd] */
    float *bias_mem;          /* owned */
    /* Shared experts (deepseek2): an always-on SwiGLU beside the routed ones,
     * n_expert_shared of them fused into one FFN of n_ff_exp * n_expert_shared
     * (llama.cpp's ffn_{gate,up,down}_shexp); data NULL when the model has none
     * (qwen3moe). */
    ks_weight sh_gate, sh_up; /* [n_ff_exp * n_expert_shared][n_embd] */
    ks_weight sh_down;        /* [n_embd][n_ff_exp * n_expert_shared] */
} ks_moe_layer;

/* Multi-head latent attention (deepseek2; "DeepSeek-V2: A Strong, Economical,
 * and Efficient Mixture-of-Experts Language Model", Section 2.1).  A token's
 * keys and values are one compressed latent c_KV = RMSNorm(W_DKV x)
 * [kv_lora_rank] plus one decoupled RoPE key k_R [qk_rope] shared by every
 * head.  The store keeps exactly that, [c_KV ; k_R] as one KV head of
 * kv_lora_rank + qk_rope dims (hp.head_dim); the up-projections are absorbed
 * into the query (q_h^T W_UK_h c = (W_UK_h^T q_h)^T c) and into the output
 * (W_UV_h applied to the attention-weighted latent), infer/mla.c.  The
 * per-head matrices are views into llama.cpp's 3-D attn_k_b / attn_v_b.  One
 * allocation: the two view arrays follow the struct. */
typedef struct ks_mla_layer {
    ks_weight wq_a;           /* [q_lora_rank][n_embd], unbound (data NULL) when Q is one matrix (ks_layer.wq) */
    float *q_a_norm;          /* [q_lora_rank] or NULL; owned */
    ks_weight wq_b;           /* [n_head * (qk_nope + qk_rope)][q_lora_rank] (with wq_a) */
    ks_weight wkv_a;          /* [kv_lora_rank + qk_rope][n_embd]: latent, then the rope key */
    float *kv_a_norm;         /* [kv_lora_rank]; owned */
    ks_weight *k_b;           /* [n_head] views, each [kv_lora_rank][qk_nope]: W_UK_h^T (q_nope -> latent) */
    ks_weight *v_b;           /* [n_head] views, each [v_head][kv_lora_rank]: W_UV_h (latent -> value) */
    float *k_b_owned;         /* [n_head][kv_lora_rank][qk_nope] or NULL: k_b's data when the file has the
                               * older fused attn_kv_b (W_UK_h transposed at load); owned */
} ks_mla_layer;

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
    /* gemma3: RMSNorms of the attention output and of the FFN output, before
     * each joins the residual stream; NULL elsewhere */
    float *attn_post_norm, *ffn_post_norm; /* [n_embd] or NULL */
    /* sliding window of a local layer: a query at position p sees the keys
     * at positions (p - window, p]; 0: a global layer (sees every key) */
    int32_t window;
    ks_moe_layer *moe;        /* owned; non-NULL: this layer's FFN is the MoE (w_gate/up/down unbound) */
    float *bo;                /* [n_embd] attention output bias, or NULL (gpt-oss has one) */
    /* gpt-oss: one learned logit per query head that joins the attention
     * softmax's denominator (infer/attn.h); NULL: none */
    float *attn_sinks;        /* [n_head] or NULL */
    ks_mla_layer *mla;        /* owned; non-NULL: latent attention (wq is Q when no q_a; wk, wv unbound) */
} ks_layer;

typedef struct ks_hparams {
    ks_arch arch;
    char arch_name[32];
    int32_t n_vocab, n_embd, n_layer, n_ff;
    int32_t n_head, n_head_kv, head_dim, n_rot;
    int32_t n_ctx_train;
    float rope_base, rms_eps;
    bool rope_neox;           /* rotate (x[i], x[i+n_rot/2]) instead of (x[2i], x[2i+1]) */
    /* RoPE scaling as the file states it (<arch>.rope.scaling.*; type NONE
     * when absent), resolved per context by ks_model_rope_freqs */
    ks_rope_scaling rope_scaling;
    int32_t rope_skip_every;  /* > 0: layers il with (il + 1) % rope_skip_every == 0 apply no RoPE (smollm3: 4) */
    float attn_temp_scale;    /* > 0: q *= 1 + attn_temp_scale * ln(floor(pos / attn_temp_floor) + 1) (mistral3) */
    int32_t attn_temp_floor;  /* positions per temperature step (the original context) */
    /* ---- features beyond the llama block (gemma3); zero: absent ---- */
    int32_t n_swa;            /* sliding window of the local layers (ks_layer.window), 0: no local layers */
    float rope_base_swa;      /* RoPE base of the local layers (unscaled); 0: they use rope_base */
    float attn_q_scale;       /* multiplies Q after RoPE so that the logits scale by attn_scale instead of
                               * 1/sqrt(head_dim) (gemma3 27B); 0: the usual 1/sqrt(head_dim) */
    float logit_softcap;      /* logits = cap * tanh(logits / cap); 0: none */
    bool embd_scale;          /* input embeddings times sqrt(n_embd) */
    bool ffn_gelu;            /* FFN gate through GELU (tanh approximation) instead of SiLU */
    /* mixture of experts (0 experts: a dense FFN) */
    int32_t n_expert, n_expert_used, n_ff_exp;
    bool expert_norm;         /* renormalise the selected experts' softmax weights to sum 1 */
    bool expert_softmax_topk; /* gpt-oss: the weights are the softmax of the k selected logits only */
    bool ffn_swiglu_oai;      /* gpt-oss's clamped SwiGLU (infer/moe.c) instead of silu(gate) * up */
    float expert_weights_scale; /* the routed weights times this (deepseek2's routed_scaling_factor); 0: none */
    int32_t n_expert_shared;  /* always-on experts beside the routed ones (ks_moe_layer.sh_*) */
    int32_t n_dense_lead;     /* leading layers whose FFN is dense (deepseek2's first_k_dense_replace) */
    /* multi-head latent attention (ks_mla_layer); kv_lora_rank 0: none.  The
     * store's head is then kv_lora_rank + n_rot dims (head_dim), one KV head. */
    int32_t kv_lora_rank, q_lora_rank, qk_nope, v_head_mla;
    bool mla_fused_kv_b;      /* the file has the older fused attn_kv_b (arch_deepseek2.c) */
    float mla_q_scale;        /* multiplies the absorbed Q so that the store's 1/sqrt(head_dim) becomes
                               * llama.cpp's kq_scale, mscale^2 / sqrt(qk_nope + n_rot) */
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
    size_t packed_expert_bytes; /* K-quant / IQ4_XS experts repacked into eight-row groups (ks_expert_pack) */
    float *rope_factors_short, *rope_factors_long; /* [n_rot/2] LongRoPE divisors, or NULL */
};

/* The inverse RoPE frequencies ([n_rot/2], double) and cos/sin magnitude a
 * context of n_ctx positions per sequence uses: the file's scaling, its
 * rope_freqs.weight divisors, or LongRoPE's long factors when n_ctx exceeds
 * the original context (else the short ones), as llama.cpp chooses them
 * (by the context size, not per position). */
ks_status ks_model_rope_freqs(const ks_model *m, int32_t n_ctx, double *inv_freq, float *mscale);

/* Whether the loader reads key[len] of a file of architecture arch: false
 * for an <arch>.* key no slot reads (or any key of an unknown arch), true
 * for keys outside the <arch>. namespace (general.*, tokenizer.*). */
bool ks_model_key_read(const char *arch, const char *key, size_t len);

#endif
