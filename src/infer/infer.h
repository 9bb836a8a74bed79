/*
 * infer.h — internals of the forward pass shared by the context's files,
 * tests and the benchmark: the context struct and the attention entry points
 * with their plain-C reference (tests compare SIMD paths against it).  The
 * small ops (RMSNorm, RoPE, softmax) live in tensor/ops.h, the SIMD attention
 * kernels in attn/attn.h; how the context's files divide the work is in
 * infer/internal.h.
 */
#ifndef KS_INFER_H
#define KS_INFER_H

#include "attn/attn.h"
#include "infer/prefill_sparse.h"
#include "kv/kv.h"
#include "kv/memplan.h"
#include "model/model.h"
#include "policies/registry.h"
#include "select/select_mask.h"
#include "matmul/matmul.h"
#include "tensor/ops.h"

#include <stdatomic.h>

/* Query rows per prefill attention block (each KV page is read once per block). */
#define KS_PREFILL_BLOCK 16
_Static_assert(KS_PREFILL_BLOCK == KS_PREFILL_BLOCK_ROWS, "kvsieve.h states the sparse prefill's block");

/* Per-worker scratch of the attention jobs. */
#define KS_RECALL_ONE 4294967296.0 /* 2^32: a recall of 1 in ks_attn_scratch.recall_sum's fixed point */

typedef struct ks_attn_scratch {
    float *scores;        /* [max(G, 4) * n_ctx] scores / probabilities */
    float *tmp;           /* [head_dim + 16] */
    float *weights;       /* [n_ctx] attention weight per attended entry (policies that ask) */
    int32_t *entries;     /* [n_ctx] entry index of each attended row */
    uint64_t *mask;       /* [n_ctx / 64 + 1] selected entries */
    int32_t *sel;         /* [n_ctx] policy output buffer */
    int32_t *next;        /* [n_ctx] policy prefetch hint buffer */
    int32_t *pages;       /* [n_ctx / P + 1] logical pages touched */
    ks_kv_seg *segs;      /* [n_ctx + 1] kernel segments */
    int32_t *first;       /* [n_ctx + 1] first entry of each segment */
    uint8_t *gather;      /* [n_ctx / P + 1][page_bytes] slow-tier pages when the slots are too few (lazy) */
    float *probe_out;     /* [G][head_dim] throwaway output of the recall probe */
    float *blk_S;         /* [KS_PREFILL_BLOCK * G][n_ctx] prefill block scores (lazy) */
    float *blk_tile;      /* [page][head_dim] f32 tile of one page (lazy) */
    float *blk_bf16;      /* the bf16 block kernel's tiles and online-softmax state (lazy) */
    const void **sp_kb;   /* [n_ctx / P + 1] page bounds of the sparse prefill's scoring (lazy) */
    uint64_t *recall_sum; /* [n_layer][n_head_kv] recall probe sums of this worker, in units of 2^-32
                           * (fixed point: the threads' sums add in any order to the same total) */
    uint32_t *recall_n;   /* [n_layer][n_head_kv] */
    double select_seconds;
    double gather_seconds; /* decode: segment walk and staging copies (attend_one) */
    uint64_t gather_bytes; /* K and V bytes copied into the staging area */
    uint64_t entries_attended;
} ks_attn_scratch;

/* A decode step's plan of one (sequence, KV head) for a policy whose
 * selection is the same in every layer (ks_policy_same_every_layer): the
 * first sparse layer selects and plans, the later layers of the same step
 * reuse the runs and resolve only their own pointers. */
typedef struct ks_step_plan {
    uint64_t step;        /* ks_context.step_serial it was made in (0: none) */
    int32_t n;            /* entries of the head it was made for */
    bool all;             /* the selection was everything */
    int32_t nseg, npages, total;
    uint64_t *mask;       /* [n_ctx / 64 + 1] */
    int32_t *first, *len; /* [n_ctx + 1] first entry and length of each run */
    int32_t *pages;       /* [n_ctx / P + 1] */
} ks_step_plan;

/* A policy instance of the context and the configuration it was made for;
 * sequences with equal configurations share it (ks_seq_set_policy). */
typedef struct ks_infer_pol {
    ks_policy *pol;          /* NULL: a free entry */
    ks_policy_spec spec;     /* as configured (a copy: sequences compare theirs with ks_policy_spec_equal) */
    int32_t dense_from;      /* resolved: layers below attend densely */
    int32_t obs_window;
    bool selects;            /* has a decode selector */
    int32_t users;           /* sequences it serves */
} ks_infer_pol;

struct ks_context {
    const ks_model *model;   /* borrowed; outlives the context */
    ks_context_params params;
    ks_pool *pool;
    int32_t n_ctx, n_seq, max_rows;
    ks_kv_type kv_type;
    size_t kv_row_bytes;     /* bytes of one token's K (or V) for one KV head */
    ks_kv_store *kv;         /* paged, tiered K/V of every sequence */
    ks_policy *policy;       /* the default selection policy (pols[0]; dense by default) */
    ks_policy_env penv;      /* what the policy sees; svc = this context */
    int32_t dense_layers;    /* layers attending densely at decode */
    int32_t obs_window;      /* query rows of a prompt's end kept for on_prefill (-1: all) */
    int32_t obs_cap;         /* rows of obs_q during the current prefill */
    float *obs_q;            /* [n_layer][obs_cap][n_head*head_dim] (per prefill) */
    float *entropy, *varentropy; /* [n_seq] of each sequence's last output distribution (NaN: none) */
    int32_t *n_att;          /* [max_rows][n_head_kv] entries row r attends (causal bound) */
    atomic_int *att_heads_done; /* [max_rows] KV heads finished per row group of an attention pass (attend.c) */
    int32_t *seq_len;        /* [n_seq] next position of each sequence */
    bool decoding;           /* the rows being computed are a decode step */
    bool split_wait;         /* tests: a split decode task waits for its second part to claim the upper half (attend.c) */
    uint64_t step_serial;    /* decode steps so far (keys step_plans) */
    uint64_t scratch_epoch;  /* ks_scratch_epoch() when the pool last reserved its scratch */
    ks_step_plan *step_plans; /* [n_seq][n_head_kv], buffers allocated on first use */
    bool plan_per_layer;     /* tests: select and plan in every layer even where one plan would do */
    float *x;                /* [max_rows][n_embd] residual stream */
    float *xn;               /* [max_rows][max(n_embd, q_dim)] normed input / sublayer output */
    float *q;                /* [max_rows][n_head*head_dim] */
    float *kk, *vv;          /* [max_rows][n_head_kv*head_dim] */
    float *att;              /* [max_rows][n_head*head_dim] attention output */
    float *gate, *up;        /* [max_rows][n_ff] */
    ks_attn_scratch *scr;    /* [n_threads] */
    void *mm_scratch;        /* quantized activations for ks_matmul */
    size_t mm_worker_bytes;  /* KS_SCRATCH_KERNEL bytes every thread holds (reserved at create; checked per call on the caller) */
    float *rope_cos, *rope_sin; /* [max_rows][n_rot/2] */
    /* A decode step's own arrays, sized once so that a step allocates nothing:
     * step_i32 [5][max_rows] (positions, then a policy's rows: sequences,
     * tokens, positions), step_f32 [4][max_rows] (entropy and varentropy of
     * the batch, then of a policy's rows), step_want [max_rows]. */
    int32_t *step_i32;
    float *step_f32;
    bool *step_want;
    int32_t n_aux;           /* hidden states captured for the policy (<= 3) */
    int32_t aux_layer[3];    /* layer whose input residual is captured (n_layer: final) */
    float *aux_h;            /* [max_rows][n_aux][n_embd] */
    ks_memplan_params plan;  /* adaptive memory management (plan.mem_cap > 0) */
    int64_t *plan_thr;       /* [n_layer + 1] Algorithm 1 thresholds */
    int32_t n_offloaded;     /* layers the manager moved to the slow tier */
    bool recall_probe;       /* eval: measure the dense attention mass each selection covers */
    /* turnover probe (ks_context_set_turnover_probe): per (seq, layer, KV head) the
     * last step's selection and the last step's oracle set, as bit masks of
     * turn_words words each, whether they hold a step yet, and the counts */
    bool turnover_probe;
    size_t turn_words;
    uint64_t *turn_pol;      /* [n_seq][n_layer][n_head_kv][turn_words] */
    uint64_t *turn_orc;      /* [n_seq][n_layer][n_head_kv][turn_words] */
    uint8_t *turn_have;      /* [n_seq][n_layer][n_head_kv] */
    uint64_t *turn_cnt;      /* [n_seq][n_layer][n_head_kv][3]: policy moved, oracle moved, selected */
    ks_prefill_sparse prefill_sparse; /* params.prefill_policy, parsed (prefill_sparse.c): the sequences' default */
    ks_prefill_sparse *seq_prefill;   /* [n_seq] each sequence's own (ks_seq_set_prefill_policy), from the default */
    uint8_t *seq_offgrid;             /* [n_seq] a sparse prefill split a block of rows: nothing more is cached */
    ks_status step_status;   /* first failure inside a parallel section */
    atomic_flag step_failed;
    ks_stats stats;
    /* per-sequence policies: pols[0] is the default (c->policy), seq_pol[s]
     * the instance serving sequence s */
    ks_infer_pol *pols;      /* [n_seq + 2] */
    int32_t n_pols;          /* entries in use or freed (pol NULL) */
    int32_t *seq_pol;        /* [n_seq] */
    ks_policy_counters retired_pc; /* counters of destroyed instances */
    uint64_t select_bytes_base;    /* the policies' bytes_read at the last ks_stats_reset */
    /* RoPE of this context, resolved once (ks_model_rope_freqs: the file's
     * scaling, and LongRoPE's short or long factors by n_ctx) */
    double *rope_inv_freq;   /* [n_rot/2] */
    float rope_mscale;       /* cos/sin magnitude */
    /* sliding-window (local) layers, when the model has them (ks_layer.window) */
    float *rope_cos_swa, *rope_sin_swa; /* [max_rows][n_rot/2] angles of the local layers' RoPE base, or NULL */
    uint8_t *swa_hold;       /* [n_seq] 1: keep every entry of the sequence's local layers (a prefix cache
                              * reads or wrote its blocks, which hold every layer's whole pages) */
    struct ks_moe_buf *moe;  /* the MoE FFN's buffers (infer/moe.h), or NULL for a dense model */
};

/* The policy instance serving sequence seq (the context's default unless
 * ks_seq_set_policy gave it another), and its entry.  Inline beside the
 * fields they read, so that a file which only asks which policy serves a
 * sequence (segments.c asks at every selection) does not depend on
 * context.c, which depends on it. */
static inline ks_policy *ks_infer_policy_of(const ks_context *c, int32_t seq) { return c->pols[c->seq_pol[seq]].pol; }
static inline const ks_infer_pol *ks_infer_pol_of(const ks_context *c, int32_t seq) { return &c->pols[c->seq_pol[seq]]; }

const ks_model *ks_context_model(const ks_context *c);
/* Attention recall probe (eval only; costs a dense attention pass per
 * sparse head): at every decode step, for each (layer, KV head) the share of
 * the dense attention mass (summed over the group's query heads) that the
 * attended entries cover; 1 where everything is attended.  take() returns
 * the mean per (layer, head) since the last take ([n_layer][n_head_kv], NaN
 * where no step ran) and the overall mean, then resets. */
void ks_context_set_recall_probe(ks_context *c, bool on);
void ks_context_take_recall(ks_context *c, double *per_layer_head, double *mean);
ks_pool *ks_context_pool(ks_context *c);

#endif
