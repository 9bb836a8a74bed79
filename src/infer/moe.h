/*
 * moe.h — the mixture-of-experts FFN over a list of rows (infer/moe.c).
 *
 * A layer whose ks_layer.moe is set runs this instead of the dense SwiGLU:
 * the router scores every expert for each row, the top n_expert_used are
 * kept with softmax weights (renormalised over the kept ones when
 * hp->expert_norm), and each expert runs once over all the rows that chose
 * it.  The buffers are sized at context creation for max_rows rows, so a
 * decode step allocates nothing.
 */
#ifndef KS_INFER_MOE_H
#define KS_INFER_MOE_H

#include "model/model.h"

typedef struct ks_moe_buf {
    int32_t max_rows, n_expert, n_used, n_embd, n_ff;
    float *logits;    /* [max_rows][n_expert] router logits */
    int32_t *sel;     /* [max_rows][n_used] each row's experts, best first */
    float *w;         /* [max_rows][n_used] their weights */
    int32_t *start;   /* [n_expert + 1] rows of expert e: by_expert[start[e], start[e+1]) */
    int32_t *by_expert; /* [max_rows * n_used] row indices grouped by expert, rows ascending */
    float *by_w;      /* [max_rows * n_used] the weight of that (row, expert) */
    int32_t *row_pair; /* [max_rows][n_used] each row's pair indices, ascending expert */
    int32_t *row_fill; /* [max_rows] fill counters of row_pair */
    float *xg;        /* [max_rows * n_used][n_embd] every pair's input row, grouped by expert */
    float *gate, *up; /* [max_rows * n_used][n_ff_exp] (or [max_rows][shared n_ff]) */
    float *yg;        /* [max_rows * n_used][n_embd] every pair's expert output */
    float *out;       /* [max_rows][n_embd] the FFN's output, summed over experts */
    uint8_t *xq;      /* [xq_pairs][xq_slot] a one-row-per-expert call's quantized inputs, one slot a pair */
    size_t xq_slot;
    int32_t xq_pairs;
} ks_moe_buf;

/* What the products of one call cost, for the context's statistics. */
typedef struct ks_moe_counters {
    double matmul_seconds;
    uint64_t macs, weight_bytes; /* only the experts that ran (and the router) */
    uint64_t expert_runs;        /* (expert, call) pairs that ran: one weight read each */
    uint64_t fast_calls;         /* calls that ran the single-token path (two pool runs for all experts) */
} ks_moe_counters;

/* Buffers for max_rows rows of a model with hp->n_expert > 0. */
ks_status ks_moe_buf_create(const ks_hparams *hp, int32_t max_rows, ks_moe_buf **out);
void ks_moe_buf_destroy(ks_moe_buf *b);

/* The ks_matmul scratch (quantized activations) and per-worker kernel
 * scratch the experts and routers of m need for rows rows: the context
 * sizes its shared buffers to at least these. */
size_t ks_moe_matmul_scratch_bytes(const ks_model *m, int64_t rows);
size_t ks_moe_worker_scratch_bytes(const ks_model *m);

/* Routing of one row: the k largest of softmax(logits[0..n_expert)) into
 * sel[0..k) (largest first; ties to the lower index) with their
 * probabilities in w, divided by their sum (clamped below at 2^-14, as
 * llama.cpp does) when norm. */
void ks_moe_route(const float *logits, int n_expert, int k, bool norm, int32_t *sel, float *w);
/* gpt-oss's routing: the same k largest logits, weighted by the softmax of
 * those k logits alone (hp->expert_softmax_topk). */
void ks_moe_route_topk_softmax(const float *logits, int n_expert, int k, int32_t *sel, float *w);

/* b->out[n][n_embd] = the MoE FFN of the rows xn[n][n_embd] (normed input).
 * Every (row, expert) pair's input is gathered at once, each expert's
 * products run over the rows that chose it (GEMM, SwiGLU, GEMM), and each
 * row sums its experts' outputs in ascending expert index, whatever else is
 * in the batch; gather and sum run on the pool for a prefill.  mm_scratch: ks_moe_matmul_scratch_bytes(n) bytes, 64-aligned.
 * cnt (optional) accumulates. */
void ks_moe_ffn(ks_pool *pool, const ks_hparams *hp, const ks_moe_layer *L, int n, const float *xn, ks_moe_buf *b,
                void *mm_scratch, ks_moe_counters *cnt);

#endif
