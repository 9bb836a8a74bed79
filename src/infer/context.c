/*
 * context.c — a context's life: creation, destruction, accessors and
 * statistics, and the services a policy calls back into.
 *
 * A context owns everything a step needs so that no step allocates on the
 * hot path: the paged KV store (src/kv), the policy (src/select), per-row
 * activation buffers sized for the largest batch, per-worker attention
 * scratch sized for the whole context, a decode step's own arrays, and the
thread pool; what the policies and the services to them need per call is
per-thread scratch that only grows (ks_scratch), so once a step has run at
a depth the next allocates nothing (tests/test_step_alloc.c).  Creation
 * validates every parameter before it allocates anything, then builds the
 * parts in dependency order; any failure after the first allocation goes
 * through the one cleanup path, ks_context_destroy, which accepts a
 * partially built context.
 *
 * Each sequence has a policy: the context's default (from params) unless
 * ks_seq_set_policy gave it another.  The context keeps one instance per
 * distinct configuration (pols; an instance indexes its state by sequence,
 * so sharing one is free), and the steps route each row to its sequence's
 * instance (ks_infer_policy_of); the memory plan is redone whenever an
 * instance is made, for the largest budget alive.
 *
 * A policy never sees the context: it sees ks_policy_env, whose services
 * (attention probabilities at prefill, stored keys, eviction) are
 * implemented here over the store, reading slow-tier pages through a
 * temporary buffer because they run once per prompt, not per step.
 *
 * How the rest of the work divides among the files is in infer/internal.h.
 */
#include "infer/internal.h"
#include "infer/moe.h"
#include "kvsieve_tools.h" /* ks_turnover */

#include <math.h>
#include <string.h>

#define KS_MOE_N_BATCH 1024 /* default prefill chunk of a model with experts (check_params) */

ks_context_params ks_context_default_params(void) {
    return (ks_context_params){.n_ctx = 0,
                               .n_seq = 1,
                               .n_threads = 0,
                               .n_batch = 0, /* by the model: check_params */
                               .kv_type = KS_KV_F16,
                               .policy = "dense",
                               .budget = 0,
                               .sink = 4,
                               .window = 64,
                               .page = 32,
                               .dense_layers = -1,
                               .policy_args = NULL,
                               .policy_spec = NULL,
                               .kv_offload_dir = NULL,
                               .kv_offload_layers = 0,
                               .mem_cap = 0,
                               .mem_overhead = 1.3,
                               .prefill_policy = NULL};
}

void ks_context_destroy(ks_context *c) {
    if (!c) return;
    for (int32_t k = 0; k < c->n_pols; k++) ks_policy_destroy(c->pols[k].pol);
    if (!c->pols) ks_policy_destroy(c->policy);
    ks_free(c->pols);
    ks_free(c->seq_pol);
    ks_kv_destroy(c->kv);
    for (int i = 0; c->scr && i < c->params.n_threads; i++) {
        ks_attn_scratch *s = &c->scr[i];
        ks_free_aligned(s->scores);
        ks_free_aligned(s->tmp);
        ks_free(s->weights);
        ks_free(s->entries);
        ks_free(s->mask);
        ks_free(s->sel);
        ks_free(s->next);
        ks_free(s->pages);
        ks_free(s->segs);
        ks_free(s->first);
        free(s->gather);
        ks_free(s->probe_out);
        ks_free(s->blk_S);
        ks_free(s->blk_tile);
        ks_free(s->blk_bf16);
        ks_free((void *)s->sp_kb);
        ks_free(s->recall_sum);
        ks_free(s->recall_n);
    }
    ks_free(c->scr);
    for (size_t i = 0; c->step_plans && i < (size_t)c->n_seq * c->model->hp.n_head_kv; i++) {
        ks_free(c->step_plans[i].mask);
        ks_free(c->step_plans[i].first);
        ks_free(c->step_plans[i].len);
        ks_free(c->step_plans[i].pages);
    }
    ks_free(c->step_plans);
    ks_free(c->turn_pol);
    ks_free(c->turn_orc);
    ks_free(c->turn_have);
    ks_free(c->turn_cnt);
    ks_free(c->obs_q);
    ks_free(c->plan_thr);
    ks_free(c->aux_h);
    ks_free(c->entropy);
    ks_free(c->varentropy);
    ks_free(c->n_att);
    ks_free(c->att_heads_done);
    ks_free(c->seq_len);
    ks_free(c->swa_hold);
    ks_free(c->seq_prefill);
    ks_free(c->seq_offgrid);
    ks_free(c->rope_cos_swa);
    ks_free(c->rope_sin_swa);
    ks_free((char *)c->params.kv_offload_dir);
    ks_free_aligned(c->x);
    ks_free_aligned(c->xn);
    ks_free_aligned(c->q);
    ks_free_aligned(c->kk);
    ks_free_aligned(c->vv);
    ks_free_aligned(c->att);
    ks_free_aligned(c->gate);
    ks_free_aligned(c->up);
    ks_free_aligned(c->mm_scratch);
    ks_moe_buf_destroy(c->moe);
    ks_free(c->rope_cos);
    ks_free(c->rope_sin);
    ks_free(c->rope_inv_freq);
    ks_free(c->step_i32);
    ks_free(c->step_f32);
    ks_free(c->step_want);
    ks_pool_destroy(c->pool);
    ks_free(c);
}

/* ------------------------------------------------- policy services -- */
/* Attention probabilities of nq query rows over every entry of a head (or,
 * with n_keys, row r over entries [0, n_keys[r]) only: DapQ's causal pseudo
 * queries), for policies that score entries at prefill (SnapKV, H2O, DapQ). */
static ks_status svc_attn_probs(void *svc, int32_t seq, int32_t layer, int32_t head, const float *q, int32_t nq,
                                const int32_t *n_keys, float *acc) {
    ks_context *c = svc;
    const ks_hparams *hp = &c->model->hp;
    int32_t n = ks_kv_n_entries(c->kv, seq, layer, head), G = hp->n_head / hp->n_head_kv, hd = hp->head_dim;
    if (n == 0) return KS_OK;
    ks_kv_seg *segs = ks_malloc(sizeof(ks_kv_seg) * ((size_t)n + 1));
    int32_t *first = ks_malloc(sizeof(int32_t) * ((size_t)n + 1)), *pages = ks_malloc(sizeof(int32_t) * ((size_t)n + 1));
    if (!segs || !first || !pages) {
        ks_free(segs);
        ks_free(first);
        ks_free(pages);
        return KS_FAIL(KS_ERR_NOMEM, "attention probabilities over %d entries", n);
    }
    int32_t np, total;
    int32_t nseg = ks_infer_segs_plan(NULL, n, ks_kv_page_size(c->kv), segs, first, pages, &np, &total);
    bool slow = ks_kv_layer_tier(c->kv, layer) == KS_TIER_SLOW;
    uint8_t *buf = slow ? ks_malloc(ks_kv_page_bytes(c->kv) * (size_t)np) : NULL;
    ks_status st = slow && !buf ? KS_FAIL(KS_ERR_NOMEM, "%d slow-tier pages", np)
                                : ks_infer_segs_resolve(c->kv, seq, layer, head, segs, first, nseg, pages, buf);
    if (st == KS_OK) {
        float *scores = ks_malloc_aligned(sizeof(float) * ((size_t)(G > 4 ? G : 4) * n + 16));
        float *out = ks_malloc(sizeof(float) * (size_t)G * hd), *tmp = ks_malloc(sizeof(float) * ((size_t)hd + 16));
        ks_kv_seg *lim = n_keys ? ks_malloc(sizeof(ks_kv_seg) * ((size_t)nseg + 1)) : NULL;
        if (!scores || !out || !tmp || (n_keys && !lim)) {
            st = KS_FAIL(KS_ERR_NOMEM, "attention scores over %d entries", n);
            nq = 0; /* skip the rows; the buffers are freed below */
        }
        for (int32_t r = 0; r < nq; r++) {
            const float *qr = q + (size_t)r * G * hd;
            int32_t m = n_keys && n_keys[r] < n ? n_keys[r] : n; /* the row's keys in scope: [0, m) */
            if (m == n) {
                ks_attention_segs(c->kv_type, segs, nseg, n, hd, G, qr, scores, out, tmp, acc, true);
                continue;
            }
            int32_t ns = 0; /* the segments' prefix that covers [0, m), the last one clipped */
            for (; ns < nseg && first[ns] < m; ns++) {
                lim[ns] = segs[ns];
                if (first[ns] + lim[ns].len > m) lim[ns].len = m - first[ns];
            }
            if (m > 0) ks_attention_segs(c->kv_type, lim, ns, m, hd, G, qr, scores, out, tmp, acc, true);
        }
        ks_free(lim);
        ks_free_aligned(scores);
        ks_free(out);
        ks_free(tmp);
    }
    ks_free(segs);
    ks_free(first);
    ks_free(pages);
    ks_free(buf);
    return st;
}

static ks_status svc_read_keys(void *svc, int32_t seq, int32_t layer, int32_t head, int32_t first, int32_t n,
                               float *out) {
    ks_context *c = svc;
    int32_t P = ks_kv_page_size(c->kv), hd = c->model->hp.head_dim;
    if (first < 0 || n < 0 || first + n > ks_kv_n_entries(c->kv, seq, layer, head))
        return KS_FAIL(KS_ERR_INVALID_ARG, "read_keys [%d, %d) outside the head", first, first + n);
    /* the K rows only, a page's worth at a time (a slow layer's V rows and
     * the rest of the page stay where they are) */
    size_t row = ks_kv_row_size(c->kv);
    uint8_t *buf = ks_scratch(KS_SCRATCH_SERVICE0, row * (size_t)P);
    if (!buf) return KS_FAIL(KS_ERR_NOMEM, "a page of keys");
    ks_status st = KS_OK;
    for (int32_t e = first; e < first + n && st == KS_OK;) {
        int32_t run = P - e % P < first + n - e ? P - e % P : first + n - e;
        st = ks_kv_read_keys(c->kv, seq, layer, head, e, run, buf);
        for (int32_t i = 0; i < run && st == KS_OK; i++)
            ks_dequantize_row(ks_kv_dtype(c->kv_type), buf + (size_t)i * row, out + (size_t)(e - first + i) * hd, hd);
        e += run;
    }
    return st;
}

static ks_status svc_evict(void *svc, int32_t seq, int32_t layer, int32_t head, const uint8_t *keep) {
    ks_context *c = svc;
    if (c->model->layers[layer].window > 0) return KS_OK; /* local layers keep their window, densely */
    return ks_kv_compact(c->kv, seq, layer, head, keep);
}

/* ------------------------------------------------------------ create -- */
/* Defaults filled in and every parameter checked, before anything is allocated. */
static ks_status check_params(const ks_hparams *hp, ks_context_params *p) {
    if (p->n_ctx <= 0) p->n_ctx = hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096;
    if (p->n_threads <= 0) p->n_threads = ks_cpu_count();
    /* A model with experts prefills in larger chunks: each expert's products
     * run over the chunk's rows that chose it (infer/moe.c), n_batch x
     * n_expert_used / n_expert of them on average (16 for Qwen3-30B-A3B at
     * 256 rows), too few for the GEMM kernels to reach their peak. */
    if (p->n_batch <= 0) p->n_batch = hp->n_expert > 0 ? KS_MOE_N_BATCH : 256;
    if (p->page <= 0) p->page = 32;
    if (p->n_seq <= 0 || p->n_seq > 4096) return KS_FAIL(KS_ERR_INVALID_ARG, "n_seq %d out of range [1, 4096]", p->n_seq);
    if (p->n_ctx > (1 << 24)) return KS_FAIL(KS_ERR_INVALID_ARG, "n_ctx %d is too large", p->n_ctx);
    if (p->kv_type != KS_KV_F16 && p->kv_type != KS_KV_Q8)
        return KS_FAIL(KS_ERR_INVALID_ARG, "unknown KV type %d", (int)p->kv_type);
    if (p->kv_type == KS_KV_Q8 && hp->head_dim % KS_QK8_0)
        return KS_FAIL(KS_ERR_UNSUPPORTED, "8-bit KV needs a head dim multiple of 32 (have %d)", hp->head_dim);
    if (p->page > 4096) return KS_FAIL(KS_ERR_INVALID_ARG, "page size %d out of range [1, 4096]", p->page);
    if (p->kv_slots < 0) return KS_FAIL(KS_ERR_INVALID_ARG, "kv_slots %d < 0", p->kv_slots);
    if (p->kv_offload_layers < 0 || p->kv_offload_layers > hp->n_layer)
        return KS_FAIL(KS_ERR_INVALID_ARG, "cannot offload %d of %d layers", p->kv_offload_layers, hp->n_layer);
    if (p->n_ctx > hp->n_ctx_train)
        KS_LOG(WARN, "context %d exceeds the model's trained context %d", p->n_ctx, hp->n_ctx_train);
    return KS_OK;
}

/* The store, with the last kv_offload_layers layers in the slow tier and
 * their elastic buffers sized by tiers.c. */
static ks_status create_kv(ks_context *c, int32_t budget) {
    const ks_hparams *hp = &c->model->hp;
    const ks_context_params *p = &c->params;
    ks_kv_params kp = ks_kv_default_params();
    kp.n_layer = hp->n_layer;
    kp.n_head_kv = hp->n_head_kv;
    kp.head_dim = hp->head_dim;
    kp.n_seq = p->n_seq;
    kp.n_ctx = p->n_ctx;
    kp.page = p->page;
    kp.type = p->kv_type;
    kp.offload_dir = p->kv_offload_dir;
    kp.slot_entries = ks_infer_buffer_entries(p, budget);
    kp.k_only = hp->kv_lora_rank > 0; /* latent attention reads its values from the key rows (infer/mla.c) */
    /* headroom for a prefix cache's pinned pages (prefix/prefix_cache.c): one
     * sequence's full context; reserved address space, touched only when used */
    kp.pin_pages = hp->n_head_kv * ((p->n_ctx + p->page - 1) / p->page);
    KS_TRY(ks_kv_create(&kp, &c->kv));
    for (int32_t l = hp->n_layer - p->kv_offload_layers; l < hp->n_layer; l++)
        KS_TRY(ks_kv_set_layer_tier(c->kv, l, KS_TIER_SLOW));
    return KS_OK;
}

static ks_status pol_make(ks_context *c, const ks_policy_spec *spec, ks_infer_pol *e);

static ks_status create_policy(ks_context *c, const ks_policy_spec *spec) {
    const ks_hparams *hp = &c->model->hp;
    const ks_context_params *p = &c->params;
    c->penv = (ks_policy_env){.pool = c->pool,
                              .n_layer = hp->n_layer,
                              .n_head = hp->n_head,
                              .n_head_kv = hp->n_head_kv,
                              .head_dim = hp->head_dim,
                              .n_seq = p->n_seq,
                              .n_ctx = p->n_ctx,
                              .n_vocab = hp->n_vocab,
                              .n_embd = hp->n_embd,
                              .tok_embd = c->model->tok_embd,
                              .kv = c->kv,
                              .svc = c,
                              .attn_probs = svc_attn_probs,
                              .evict = svc_evict,
                              .read_keys = svc_read_keys};
    /* entry 0: the default, serving every sequence until ks_seq_set_policy */
    c->pols = ks_calloc((size_t)p->n_seq + 2, sizeof(ks_infer_pol));
    c->seq_pol = ks_calloc((size_t)p->n_seq, sizeof(int32_t));
    if (!c->pols || !c->seq_pol) return KS_FAIL(KS_ERR_NOMEM, "policy table of %d sequences", p->n_seq);
    KS_TRY(pol_make(c, spec, &c->pols[0]));
    c->n_pols = 1;
    c->pols[0].users = p->n_seq;
    c->policy = c->pols[0].pol;
    c->dense_layers = c->pols[0].dense_from;
    c->obs_window = c->pols[0].obs_window;
    return KS_OK;
}

/* An activation buffer, faulted in now rather than inside the first chunk's
 * products: at 256 rows of the 1B shape the buffers are ~27 MB, ~6,900 first
 * touches (the SwiGLU's 16 MB alone), which cost a fresh context's first
 * prefill about 34 ms inside its layer-0 matmuls (about 4% of a 512-token
 * prefill's GEMM time, EPYC-26).  It also commits the memory the context
 * will use at creation, where a shortage is reported, and not in the middle
 * of a request.  Peers do the same with a warm-up pass. */
static void *alloc_faulted(size_t bytes) {
    void *p = ks_malloc_aligned(bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

/* Activations of max_rows rows, and the matmul scratch for the widest weight. */
static ks_status alloc_rows(ks_context *c) {
    const ks_model *m = c->model;
    const ks_hparams *hp = &m->hp;
    size_t rows = (size_t)c->max_rows;
    size_t q_dim = (size_t)hp->n_head * hp->head_dim, kv_dim = (size_t)hp->n_head_kv * hp->head_dim;
    size_t wide = (size_t)hp->n_embd > q_dim ? (size_t)hp->n_embd : q_dim;
    c->seq_len = ks_calloc((size_t)c->n_seq, sizeof(int32_t));
    c->swa_hold = ks_calloc((size_t)c->n_seq, 1);
    if (!c->swa_hold) return KS_FAIL(KS_ERR_NOMEM, "sliding-window flags of %d sequences", c->n_seq);
    c->seq_prefill = ks_malloc(sizeof(ks_prefill_sparse) * (size_t)c->n_seq);
    c->seq_offgrid = ks_calloc((size_t)c->n_seq, 1);
    if (!c->seq_prefill || !c->seq_offgrid) return KS_FAIL(KS_ERR_NOMEM, "prefill policies of %d sequences", c->n_seq);
    for (int32_t i = 0; i < c->n_seq; i++) c->seq_prefill[i] = c->prefill_sparse;
    c->entropy = ks_malloc(sizeof(float) * (size_t)c->n_seq);
    c->varentropy = ks_malloc(sizeof(float) * (size_t)c->n_seq);
    if (!c->seq_len || !c->entropy || !c->varentropy) return KS_FAIL(KS_ERR_NOMEM, "state of %d sequences", c->n_seq);
    for (int i = 0; i < c->n_seq; i++) c->entropy[i] = c->varentropy[i] = NAN;
    c->n_att = ks_calloc(rows * hp->n_head_kv, sizeof(int32_t));
    c->att_heads_done = ks_calloc(rows, sizeof(atomic_int));
    if (c->n_aux && !c->aux_h) c->aux_h = ks_malloc(sizeof(float) * rows * c->n_aux * hp->n_embd);
    c->x = alloc_faulted(sizeof(float) * rows * hp->n_embd);
    c->xn = alloc_faulted(sizeof(float) * rows * wide);
    c->q = alloc_faulted(sizeof(float) * rows * q_dim);
    c->kk = alloc_faulted(sizeof(float) * rows * kv_dim);
    c->vv = alloc_faulted(sizeof(float) * rows * kv_dim);
    c->att = alloc_faulted(sizeof(float) * rows * q_dim);
    c->gate = alloc_faulted(sizeof(float) * rows * hp->n_ff);
    c->up = alloc_faulted(sizeof(float) * rows * hp->n_ff);
    c->rope_cos = ks_malloc(sizeof(float) * rows * (hp->n_rot / 2));
    c->rope_inv_freq = ks_malloc(sizeof(double) * (size_t)(hp->n_rot / 2));
    if (!c->rope_inv_freq) return KS_FAIL(KS_ERR_NOMEM, "RoPE frequencies");
    KS_TRY(ks_model_rope_freqs(m, c->n_ctx, c->rope_inv_freq, &c->rope_mscale));
    c->rope_sin = ks_malloc(sizeof(float) * rows * (hp->n_rot / 2));
    if (hp->rope_base_swa > 0) {
        c->rope_cos_swa = ks_malloc(sizeof(float) * rows * (hp->n_rot / 2));
        c->rope_sin_swa = ks_malloc(sizeof(float) * rows * (hp->n_rot / 2));
        if (!c->rope_cos_swa || !c->rope_sin_swa) return KS_FAIL(KS_ERR_NOMEM, "local RoPE angles of %zu rows", rows);
    }
    c->step_i32 = ks_malloc(sizeof(int32_t) * 5 * rows);
    c->step_f32 = ks_malloc(sizeof(float) * 4 * rows);
    c->step_want = ks_malloc(sizeof(bool) * rows);
    size_t mm = ks_matmul_scratch_bytes(m->output.type, m->output.cols, rows);
    c->mm_worker_bytes = ks_matmul_worker_scratch_bytes(&m->output);
    for (int il = 0; il < hp->n_layer; il++) {
        const ks_layer *L = &m->layers[il];
        const ks_mla_layer *a = L->mla;
        const ks_weight *lw[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down,
                                 a ? &a->wq_a : &L->wq, a ? &a->wq_b : &L->wq, a ? &a->wkv_a : &L->wq,
                                 a ? &a->k_b[0] : &L->wq, a ? &a->v_b[0] : &L->wq};
        for (size_t i = 0; i < sizeof lw / sizeof lw[0]; i++) {
            if (!lw[i]->data) continue; /* unbound (a latent layer's wk / wv, a dense model's experts) */
            size_t need = ks_matmul_scratch_bytes(lw[i]->type, lw[i]->cols, rows);
            if (need > mm) mm = need;
            need = ks_matmul_worker_scratch_bytes(lw[i]);
            if (need > c->mm_worker_bytes) c->mm_worker_bytes = need;
        }
    }
    if (hp->n_expert) { /* experts are weights the loop above does not list (infer/moe.h) */
        KS_TRY(ks_moe_buf_create(hp, c->max_rows, &c->moe));
        size_t need = ks_moe_matmul_scratch_bytes(m, (int64_t)rows);
        if (need > mm) mm = need;
        need = ks_moe_worker_scratch_bytes(m);
        if (need > c->mm_worker_bytes) c->mm_worker_bytes = need;
    }
    c->mm_scratch = alloc_faulted(mm ? mm : 64);
    if (!c->n_att || !c->att_heads_done || (c->n_aux && !c->aux_h) || !c->x || !c->xn || !c->q || !c->kk || !c->vv ||
        !c->att || !c->gate || !c->up || !c->rope_cos || !c->rope_sin || !c->step_i32 || !c->step_f32 ||
        !c->step_want || !c->mm_scratch)
        return KS_FAIL(KS_ERR_NOMEM, "activations of %zu rows", rows);
    return KS_OK;
}

/* The packed weights' kernels take their tiles from every worker's
 * KS_SCRATCH_KERNEL slot and cannot report a refusal from inside a
 * parallel-for, so the slot is made large enough on every thread here. */
typedef struct {
    size_t bytes;
    _Atomic int refused;
} kernel_reserve_job;

static void kernel_reserve_worker(void *arg, int ith, int nth) {
    (void)ith, (void)nth;
    kernel_reserve_job *j = arg;
    void *p = ks_scratch(KS_SCRATCH_KERNEL, j->bytes);
    if (!p) j->refused = 1;
    else memset(p, 0, j->bytes); /* faulted in here, by its own thread, as the activations are (alloc_rows) */
}

static ks_status reserve_kernel_scratch(ks_context *c) {
    if (!c->mm_worker_bytes) return KS_OK;
    kernel_reserve_job j = {.bytes = c->mm_worker_bytes};
    ks_pool_run(c->pool, kernel_reserve_worker, &j);
    return j.refused ? KS_FAIL(KS_ERR_NOMEM, "matmul tiles of %zu bytes per thread", c->mm_worker_bytes) : KS_OK;
}

/* Per-worker attention scratch, sized for a whole head of the context. */
static ks_status alloc_scratch(ks_context *c) {
    const ks_hparams *hp = &c->model->hp;
    int G = hp->n_head / hp->n_head_kv;
    size_t n_ctx = (size_t)c->n_ctx, max_pages = (n_ctx + c->params.page - 1) / c->params.page;
    c->scr = ks_calloc((size_t)c->params.n_threads, sizeof(ks_attn_scratch));
    if (!c->scr) return KS_FAIL(KS_ERR_NOMEM, "attention scratch of %d threads", c->params.n_threads);
    for (int i = 0; i < c->params.n_threads; i++) {
        ks_attn_scratch *s = &c->scr[i];
        /* scores: [G][n_ctx] for the portable kernels, [n_ctx][4] for the AVX-512 one */
        s->scores = ks_malloc_aligned(sizeof(float) * ((size_t)(G > 4 ? G : 4) * n_ctx + 16));
        s->tmp = ks_malloc_aligned(sizeof(float) * ((size_t)hp->head_dim + 16));
        s->weights = ks_malloc(sizeof(float) * n_ctx);
        s->entries = ks_malloc(sizeof(int32_t) * n_ctx);
        s->mask = ks_malloc(sizeof(uint64_t) * (n_ctx / 64 + 2));
        s->sel = ks_malloc(sizeof(int32_t) * n_ctx);
        s->next = ks_malloc(sizeof(int32_t) * n_ctx);
        s->pages = ks_malloc(sizeof(int32_t) * (max_pages + 1));
        s->segs = ks_malloc(sizeof(ks_kv_seg) * (n_ctx + 1));
        s->first = ks_malloc(sizeof(int32_t) * (n_ctx + 1));
        s->probe_out = ks_malloc(sizeof(float) * (size_t)hp->n_head * hp->head_dim);
        s->recall_sum = ks_calloc((size_t)hp->n_layer * hp->n_head_kv, sizeof(uint64_t));
        s->recall_n = ks_calloc((size_t)hp->n_layer * hp->n_head_kv, sizeof(uint32_t));
        if (!s->scores || !s->tmp || !s->weights || !s->entries || !s->mask || !s->sel || !s->next || !s->pages ||
            !s->segs || !s->first || !s->probe_out || !s->recall_sum || !s->recall_n)
            return KS_FAIL(KS_ERR_NOMEM, "attention scratch of %zu entries", n_ctx);
    }
    c->step_plans = ks_calloc((size_t)c->n_seq * hp->n_head_kv, sizeof(ks_step_plan));
    if (!c->step_plans) return KS_FAIL(KS_ERR_NOMEM, "step plans of %d sequences", c->n_seq);
    return KS_OK;
}

ks_status ks_context_create(const ks_model *model, ks_context_params p, ks_context **out) {
    if (!model || !out) return KS_FAIL(KS_ERR_INVALID_ARG, "NULL model or out");
    if (model->vocab_only) return KS_FAIL(KS_ERR_INVALID_ARG, "the model was loaded vocabulary-only");
    KS_TRY(check_params(&model->hp, &p));
    /* the policy fields are read here, once: parsed into the spec the
     * default instance keeps (or the caller's, parsed already) */
    ks_policy_spec spec;
    if (p.policy_spec) spec = *p.policy_spec;
    else KS_TRY(ks_policy_spec_parse(p.policy, p.policy_args, p.budget, p.sink, p.window, p.dense_layers, &spec));
    p.policy = NULL;
    p.policy_args = NULL;
    p.policy_spec = NULL;
    ks_prefill_sparse psp;
    KS_TRY(ks_prefill_sparse_parse(p.prefill_policy, p.page, &psp));
    p.prefill_policy = NULL; /* parsed: the context keeps psp, not the caller's string */
    ks_context *c = ks_calloc(1, sizeof *c);
    if (!c) return KS_FAIL(KS_ERR_NOMEM, "context");
    c->model = model;
    c->prefill_sparse = psp;
    const char *offload_dir = p.kv_offload_dir;
    p.kv_offload_dir = p.kv_offload_dir ? ks_strdup(p.kv_offload_dir) : NULL;
    c->params = p;
    ks_status st = KS_OK;
    if (offload_dir && !p.kv_offload_dir) {
        st = KS_FAIL(KS_ERR_NOMEM, "context parameters (offload directory '%s')", offload_dir);
        goto fail;
    }
    c->n_ctx = p.n_ctx;
    c->n_seq = p.n_seq;
    c->max_rows = p.n_batch > p.n_seq ? p.n_batch : p.n_seq;
    c->kv_type = p.kv_type;
    c->kv_row_bytes = ks_kv_row_bytes(p.kv_type, model->hp.head_dim);
    if ((st = ks_pool_create(p.n_threads, &c->pool)) != KS_OK) goto fail;
    if ((st = create_kv(c, spec.budget)) != KS_OK) goto fail;
    if ((st = create_policy(c, &spec)) != KS_OK) goto fail;
    if ((st = alloc_rows(c)) != KS_OK) goto fail;
    if ((st = alloc_scratch(c)) != KS_OK) goto fail;
    if ((st = reserve_kernel_scratch(c)) != KS_OK) goto fail;
    if (p.mem_cap > 0 && (st = ks_infer_plan_init(c)) != KS_OK) goto fail;
    *out = c;
    return KS_OK;
fail:
    ks_context_destroy(c); /* takes a partly built context */
    return st;
}

/* ------------------------------------------------ per-sequence policies -- */
static void counters_add(ks_policy_counters *a, const ks_policy *pol) {
    ks_policy_counters b;
    ks_policy_get_counters(pol, &b);
    a->selections += b.selections;
    a->hits += b.hits;
    a->misses += b.misses;
    a->corrections += b.corrections;
    a->speculative += b.speculative;
    a->rebuilds += b.rebuilds;
    a->bytes_read += b.bytes_read;
    a->topp_refined += b.topp_refined;
    a->topp_picked += b.topp_picked;
    a->topp_kept += b.topp_kept;
    if (b.topp_refined) { /* the extremes over every instance's heads */
        bool first = a->topp_refined == b.topp_refined;
        a->topp_head_min = first || b.topp_head_min < a->topp_head_min ? b.topp_head_min : a->topp_head_min;
        a->topp_head_max = first || b.topp_head_max > a->topp_head_max ? b.topp_head_max : a->topp_head_max;
    }
}

bool ks_infer_seq_sparse(const ks_context *c, int32_t seq, int32_t il) {
    const ks_infer_pol *e = &c->pols[c->seq_pol[seq]];
    return e->selects && il >= e->dense_from && c->model->layers[il].window == 0;
}

int32_t ks_infer_window_lo(const ks_context *c, int32_t il, int32_t n) {
    int32_t w = c->model->layers[il].window;
    return w > 0 && n > w ? n - w : 0;
}

ks_status ks_infer_swa_trim(ks_context *c, int32_t seq) {
    const ks_hparams *hp = &c->model->hp;
    if (hp->n_swa <= 0 || c->swa_hold[seq]) return KS_OK;
    int32_t P = c->params.page;
    for (int32_t il = 0; il < hp->n_layer; il++) {
        int32_t w = c->model->layers[il].window;
        if (w <= 0) continue;
        for (int32_t h = 0; h < hp->n_head_kv; h++) {
            int32_t n = ks_kv_n_entries(c->kv, seq, il, h);
            if (n - w >= P) KS_TRY(ks_kv_drop_front(c->kv, seq, il, h, (n - w) / P));
        }
    }
    return KS_OK;
}

ks_policy_config ks_policy_config_default(void) {
    ks_context_params d = ks_context_default_params();
    return (ks_policy_config){.policy = "dense", .budget = 0, .sink = d.sink, .window = d.window, .page = 0,
                              .dense_layers = -1, .policy_args = NULL};
}

/* The memory plan for the instances alive now: the largest budget (every
 * active sequence counted at it: conservative), the policies' weights
 * summed, a retrieval K cache if any keeps one; refused when not even one
 * sequence fits.  On failure the plan is unchanged. */
static ks_status replan(ks_context *c) {
    if (!c->plan_thr) return KS_OK;
    ks_memplan_params p = c->plan;
    p.budget = 0;
    p.dlm_bytes = 0;
    p.dlm_cache = false;
    for (int32_t k = 0; k < c->n_pols; k++) {
        ks_infer_pol *e = &c->pols[k];
        if (!e->pol) continue;
        if (e->spec.budget > p.budget) p.budget = e->spec.budget;
        p.dlm_bytes += (double)ks_policy_weight_bytes(e->pol);
        p.dlm_cache = p.dlm_cache || ks_policy_own_kcache(e->pol);
    }
    int32_t L = c->model->hp.n_layer;
    int64_t *thr = ks_malloc(sizeof(int64_t) * (size_t)(L + 1));
    if (!thr) return KS_FAIL(KS_ERR_NOMEM, "plan thresholds of %d layers", L);
    ks_status st = ks_memplan_thresholds(&p, thr);
    if (st == KS_OK && !ks_infer_plan_holds_one(&p)) /* the budget does not fit the cap: a request's size, not a refused allocation */
        st = KS_FAIL(KS_ERR_CONTEXT_FULL, "a fast tier of %.2f GB cannot hold the weights (%.2f GB x %.1f, +%.3f GB policies) "
                     "and one sequence's %d budget entries per layer", p.mem_cap / 1e9, p.model_bytes / 1e9, p.overhead,
                     p.dlm_bytes / 1e9, p.budget);
    if (st == KS_OK) {
        c->plan = p;
        memcpy(c->plan_thr, thr, sizeof(int64_t) * (size_t)(L + 1));
    }
    ks_free(thr);
    return st;
}

static void pol_free(ks_context *c, int32_t k) {
    ks_infer_pol *e = &c->pols[k];
    counters_add(&c->retired_pc, e->pol);
    ks_policy_destroy(e->pol);
    memset(e, 0, sizeof *e);
    while (c->n_pols > 1 && !c->pols[c->n_pols - 1].pol) c->n_pols--;
}

/* An instance of spec into e (the spec copied whole, the resolved layers
 * and rows beside it), checked against the hidden states in use. */
static ks_status pol_make(ks_context *c, const ks_policy_spec *spec, ks_infer_pol *e) {
    const ks_hparams *hp = &c->model->hp;
    ks_policy *pol = NULL;
    KS_TRY(ks_policy_create(spec, &c->penv, &pol));
    int32_t lay[3], na = ks_policy_hidden_layers(pol, lay);
    ks_status st = KS_OK;
    if (na < 0 || na > 3) {
        st = KS_FAIL(KS_ERR_INVALID_ARG, "policy '%s' asks for %d hidden states", spec->name, na);
    } else if (na > 0 && c->n_aux > 0 && (na != c->n_aux || memcmp(lay, c->aux_layer, sizeof(int32_t) * na))) {
        st = KS_FAIL(KS_ERR_UNSUPPORTED, "policy '%s' needs other hidden states than a policy already in this context",
                     spec->name);
    } else {
        for (int i = 0; i < na; i++)
            if (lay[i] < 0 || lay[i] > hp->n_layer)
                st = KS_FAIL(KS_ERR_INVALID_ARG, "policy asks for the hidden state of layer %d of %d", lay[i], hp->n_layer);
    }
    if (st != KS_OK) {
        ks_policy_destroy(pol);
        return st;
    }
    *e = (ks_infer_pol){.pol = pol,
                        .spec = *spec,
                        .dense_from = ks_policy_dense_layers(pol),
                        .obs_window = ks_policy_obs_window(pol),
                        .selects = ks_policy_selects(pol)};
    if (na > 0 && c->n_aux == 0) { /* the first policy reading hidden states */
        float *aux_h = ks_malloc(sizeof(float) * (size_t)c->max_rows * na * hp->n_embd);
        if (!aux_h) {
            ks_policy_destroy(pol);
            memset(e, 0, sizeof *e);
            return KS_FAIL(KS_ERR_NOMEM, "hidden states of %d rows", c->max_rows);
        }
        ks_free(c->aux_h);
        c->aux_h = aux_h;
        memcpy(c->aux_layer, lay, sizeof(int32_t) * na);
        c->n_aux = na;
    }
    return KS_OK;
}

/* A new instance for spec in a free entry: *k receives its index. */
static ks_status pol_new(ks_context *c, const ks_policy_spec *spec, int32_t *k) {
    if (c->plan_thr && spec->budget <= 0)
        return KS_FAIL(KS_ERR_INVALID_ARG, "adaptive memory management needs a budget: offloaded layers keep B entries fast");
    /* instances no sequence uses go first (their memory, their plan share) */
    for (int32_t j = 1; j < c->n_pols; j++)
        if (c->pols[j].pol && c->pols[j].users == 0) pol_free(c, j);
    int32_t free_k = 1;
    while (free_k < c->n_pols && c->pols[free_k].pol) free_k++;
    /* n_seq + 2 entries: the default, one per sequence, and the new one while
     * the sequence being set still holds its old one */
    KS_ASSERT(free_k <= c->n_seq + 1);
    KS_TRY(pol_make(c, spec, &c->pols[free_k]));
    if (free_k == c->n_pols) c->n_pols++;
    ks_status st = replan(c);
    if (st != KS_OK) {
        pol_free(c, free_k);
        return st;
    }
    *k = free_k;
    return KS_OK;
}

ks_status ks_seq_set_policy(ks_context *c, int32_t seq, const ks_policy_config *cfg) {
    if (!c) return KS_FAIL(KS_ERR_INVALID_ARG, "NULL context");
    if (!cfg) return ks_seq_set_policy_spec(c, seq, NULL);
    if (cfg->page != 0 && cfg->page != c->params.page)
        return KS_FAIL(KS_ERR_INVALID_ARG, "page %d: the KV page size belongs to the context (%d)", cfg->page,
                       c->params.page);
    ks_policy_spec spec;
    KS_TRY(ks_policy_spec_parse(cfg->policy, cfg->policy_args, cfg->budget, cfg->sink, cfg->window, cfg->dense_layers,
                                &spec));
    return ks_seq_set_policy_spec(c, seq, &spec);
}

ks_status ks_seq_set_policy_spec(ks_context *c, int32_t seq, const ks_policy_spec *spec) {
    if (!c) return KS_FAIL(KS_ERR_INVALID_ARG, "NULL context");
    if (seq < 0 || seq >= c->n_seq) return KS_FAIL(KS_ERR_INVALID_ARG, "sequence %d out of range [0, %d)", seq, c->n_seq);
    if (c->seq_len[seq] != 0)
        return KS_FAIL(KS_ERR_INVALID_ARG, "sequence %d holds %d tokens: its policy can change only while it is empty",
                       seq, c->seq_len[seq]);
    int32_t k = 0;
    if (spec) {
        for (k = 0; k < c->n_pols; k++)
            if (c->pols[k].pol && ks_policy_spec_equal(&c->pols[k].spec, spec)) break;
        if (k == c->n_pols) KS_TRY(pol_new(c, spec, &k));
    }
    int32_t old = c->seq_pol[seq];
    if (old == k) return KS_OK;
    c->pols[old].users--;
    c->pols[k].users++;
    c->seq_pol[seq] = k;
    ks_policy_seq_reset(c->pols[k].pol, seq); /* whatever an earlier user left */
    if (c->plan_thr && old != 0 && c->pols[old].users == 0) {
        /* under a cap an unused instance goes now, so the plan relaxes */
        pol_free(c, old);
        KS_TRY(replan(c));
    }
    return KS_OK;
}

void ks_context_kv_bytes(const ks_context *c, int64_t *fast, int64_t *slow) {
    const ks_hparams *hp = &c->model->hp;
    int64_t f = 0, sl = 0, rows = hp->kv_lora_rank > 0 ? 1 : 2; /* a latent entry is one row (no V) */
    for (int32_t l = 0; l < hp->n_layer; l++) {
        int64_t e = 0;
        for (int32_t s = 0; s < c->n_seq; s++)
            for (int32_t h = 0; h < hp->n_head_kv; h++) e += ks_kv_n_entries(c->kv, s, l, h);
        *(ks_kv_layer_tier(c->kv, l) == KS_TIER_SLOW ? &sl : &f) += rows * e * (int64_t)c->kv_row_bytes;
    }
    for (int32_t s = 0; s < c->n_seq; s++) /* parked sequences: all in the slow tier */
        sl += rows * ks_kv_seq_parked_entries(c->kv, s) * (int64_t)c->kv_row_bytes;
    if (fast) *fast = f;
    if (slow) *slow = sl;
}

void ks_seq_reset(ks_context *c, int32_t seq) {
    KS_ASSERT(seq >= 0 && seq < c->n_seq);
    ks_kv_seq_clear(c->kv, seq);
    ks_policy_seq_reset(ks_infer_policy_of(c, seq), seq);
    c->seq_len[seq] = 0;
    c->swa_hold[seq] = 0;
    c->seq_offgrid[seq] = 0;
    c->entropy[seq] = c->varentropy[seq] = NAN;
    if (c->turn_have) { /* the turnover probe's next step of seq sets a new baseline */
        size_t per = (size_t)c->model->hp.n_layer * c->model->hp.n_head_kv;
        memset(c->turn_have + (size_t)seq * per, 0, per);
    }
}
int32_t ks_seq_len(const ks_context *c, int32_t seq) {
    KS_ASSERT(seq >= 0 && seq < c->n_seq);
    return c->seq_len[seq];
}
void ks_context_stats(const ks_context *c, ks_stats *out) {
    *out = c->stats;
    ks_policy_counters pc = c->retired_pc;
    for (int32_t k = 0; k < c->n_pols; k++)
        if (c->pols[k].pol) counters_add(&pc, c->pols[k].pol);
    out->policy_selections = pc.selections;
    out->policy_hits = pc.hits;
    out->policy_misses = pc.misses;
    out->policy_corrections = pc.corrections;
    out->policy_speculative = pc.speculative;
    out->policy_rebuilds = pc.rebuilds;
    out->policy_topp_refined = pc.topp_refined;
    out->policy_topp_picked = pc.topp_picked;
    out->policy_topp_kept = pc.topp_kept;
    out->policy_topp_head_min = pc.topp_head_min;
    out->policy_topp_head_max = pc.topp_head_max;
    out->select_bytes_read = pc.bytes_read - c->select_bytes_base;
}

void ks_stats_reset(ks_context *c) {
    memset(&c->stats, 0, sizeof c->stats);
    ks_policy_counters pc = c->retired_pc; /* the policies' byte counters run on: count from here */
    for (int32_t k = 0; k < c->n_pols; k++)
        if (c->pols[k].pol) counters_add(&pc, c->pols[k].pol);
    c->select_bytes_base = pc.bytes_read;
}
const ks_model *ks_context_model(const ks_context *c) { return c->model; }

void ks_context_set_recall_probe(ks_context *c, bool on) { c->recall_probe = on; }

void ks_context_take_recall(ks_context *c, double *per, double *mean) {
    const ks_hparams *hp = &c->model->hp;
    size_t n = (size_t)hp->n_layer * hp->n_head_kv;
    double tot = 0;
    size_t cnt = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t fix = 0; /* which worker probed which row is the scheduler's: integer sums do not care */
        uint32_t k = 0;
        for (int t = 0; t < c->params.n_threads; t++) {
            fix += c->scr[t].recall_sum[i];
            k += c->scr[t].recall_n[i];
            c->scr[t].recall_sum[i] = 0;
            c->scr[t].recall_n[i] = 0;
        }
        const double sum = (double)fix / KS_RECALL_ONE;
        if (per) per[i] = k ? sum / k : NAN;
        if (k) tot += sum / k, cnt++;
    }
    if (mean) *mean = cnt ? tot / (double)cnt : NAN;
}
ks_status ks_context_set_turnover_probe(ks_context *c, bool on) {
    if (!c) return KS_FAIL(KS_ERR_INVALID_ARG, "NULL context");
    const ks_hparams *hp = &c->model->hp;
    size_t slots = (size_t)c->n_seq * hp->n_layer * hp->n_head_kv, words = (size_t)c->n_ctx / 64 + 1;
    if (on && !c->turn_pol) {
        c->turn_pol = ks_calloc(slots * words, sizeof(uint64_t));
        c->turn_orc = ks_calloc(slots * words, sizeof(uint64_t));
        c->turn_have = ks_calloc(slots, 1);
        c->turn_cnt = ks_calloc(slots * 3, sizeof(uint64_t));
        if (!c->turn_pol || !c->turn_orc || !c->turn_have || !c->turn_cnt) {
            ks_free(c->turn_pol);
            ks_free(c->turn_orc);
            ks_free(c->turn_have);
            ks_free(c->turn_cnt);
            c->turn_pol = c->turn_orc = c->turn_cnt = NULL;
            c->turn_have = NULL;
            return KS_FAIL(KS_ERR_NOMEM, "turnover probe: two masks of %zu entries for %zu heads", words * 64, slots);
        }
        c->turn_words = words;
    }
    c->turnover_probe = on;
    return KS_OK;
}

void ks_context_take_turnover(ks_context *c, ks_turnover *out) {
    *out = (ks_turnover){0};
    if (!c->turn_cnt) return;
    const ks_hparams *hp = &c->model->hp;
    size_t slots = (size_t)c->n_seq * hp->n_layer * hp->n_head_kv;
    for (size_t i = 0; i < slots; i++) {
        out->policy_moved += c->turn_cnt[3 * i];
        out->oracle_moved += c->turn_cnt[3 * i + 1];
        out->selected += c->turn_cnt[3 * i + 2];
    }
    memset(c->turn_cnt, 0, sizeof(uint64_t) * 3 * slots);
}
ks_pool *ks_context_pool(ks_context *c) { return c->pool; }

