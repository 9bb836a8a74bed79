/*
 * infer.h — internals of the forward pass shared by the context, tests and
 * the benchmark: the context struct and the small ops with their plain-C
 * semantics (tests compare SIMD paths against these).
 */
#ifndef KS_INFER_H
#define KS_INFER_H

#include "model/model.h"
#include "tensor/matmul.h"

struct ks_context {
    const ks_model *model;   /* borrowed; outlives the context */
    ks_context_params params;
    ks_pool *pool;
    int32_t n_ctx, n_seq, max_rows;
    ks_kv_type kv_type;
    size_t kv_row_bytes;     /* bytes of one token's K (or V) for one KV head */
    uint8_t **k, **v;        /* [n_layer] -> [n_seq][n_head_kv][n_ctx][kv_row_bytes] */
    size_t kv_bytes;         /* total allocated K+V bytes */
    int32_t *seq_len;        /* [n_seq] tokens in each sequence */
    float *x;                /* [max_rows][n_embd] residual stream */
    float *xn;               /* [max_rows][max(n_embd, q_dim)] normed input / sublayer output */
    float *q;                /* [max_rows][n_head*head_dim] */
    float *kk, *vv;          /* [max_rows][n_head_kv*head_dim] */
    float *att;              /* [max_rows][n_head*head_dim] attention output */
    float *gate, *up;        /* [max_rows][n_ff] */
    float *att_scratch;      /* [n_threads][att_stride]: scores [G][n_ctx] + tmp [head_dim] */
    size_t att_stride;
    void *mm_scratch;        /* quantized activations for ks_matmul */
    float *rope_cos, *rope_sin; /* [max_rows][n_rot/2] */
    ks_stats stats;
};

void ks_rmsnorm(float *out, const float *x, const float *w, int n, float eps);
/* cos/sin of the rotation angles of position pos: [n_rot/2] each. */
void ks_rope_angles(float *cos_out, float *sin_out, int32_t pos, int n_rot, float base,
                    const float *freq_factors);
/* Rotate the first n_rot dims of v: adjacent pairs, or halves when neox. */
void ks_rope_apply(float *v, int n_rot, bool neox, const float *c, const float *s);
void ks_softmax(float *x, int n);
size_t ks_kv_row_bytes(ks_kv_type t, int hd);
/* Attention of G query heads (q [G][hd]) over one KV head's rows K, V
 * ([len][row]) : out [G][hd].  scores: [G][len] scratch, tmp: [hd] scratch.
 * allow_simd=false forces the portable reference. */
void ks_attention_group(ks_kv_type kt, const void *K, const void *V, int len, int hd, int G,
                        const float *q, float *scores, float *out, float *tmp, bool allow_simd);

/* AVX-512 f16 kernel for head dims 64 and 128; false if it does not apply.
 * scores: [len][4] scratch. */
bool ks_attention_group_avx512(const uint16_t *K, const uint16_t *V, int len, int hd, int G, const float *q,
                               float *scores, float *out, float scale);

const ks_model *ks_context_model(const ks_context *c);
ks_pool *ks_context_pool(ks_context *c);

#endif
