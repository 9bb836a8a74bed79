/*
 * context.c — a context's life: creation, destruction, accessors and
 * statistics, and the services a policy calls back into.
 *
 * A context owns everything a step needs so that no step allocates on the
 * hot path: the paged KV store (src/kv), the policy (src/select), per-row
 * activation buffers sized for the largest batch, per-worker attention
 * scratch sized for the whole context, and the thread pool.  Creation
 * validates every parameter before it allocates anything, then builds the
 * parts in dependency order; any failure after the first allocation goes
 * through the one cleanup path, ks_context_destroy, which accepts a
 * partially built context.
 *
 * A policy never sees the context: it sees ks_policy_env, whose services
 * (attention probabilities at prefill, stored keys, eviction) are
 * implemented here over the store, reading slow-tier pages through a
 * temporary buffer because they run once per prompt, not per step.
 *
 * How the rest of the work divides among the files is in infer/internal.h.
 */
#include "infer/internal.h"

#include <math.h>
#include <string.h>

ks_context_params ks_context_default_params(void) {
    return (ks_context_params){.n_ctx = 0,
                               .n_seq = 1,
                               .n_threads = 0,
                               .n_batch = 256,
                               .kv_type = KS_KV_F16,
                               .policy = "dense",
                               .budget = 0,
                               .sink = 4,
                               .window = 64,
                               .page = 32,
                               .dense_layers = -1,
                               .policy_args = NULL,
                               .kv_offload_dir = NULL,
                               .kv_offload_layers = 0,
                               .mem_cap = 0,
                               .mem_overhead = 1.3};
}

void ks_context_destroy(ks_context *c) {
    if (!c) return;
    ks_policy_destroy(c->policy);
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
        ks_free(s->recall_sum);
        ks_free(s->recall_n);
    }
    ks_free(c->scr);
    ks_free(c->obs_q);
    ks_free(c->plan_thr);
    ks_free(c->aux_h);
    ks_free(c->entropy);
    ks_free(c->varentropy);
    ks_free(c->n_att);
    ks_free(c->seq_len);
    ks_free((char *)c->params.policy);
    ks_free((char *)c->params.policy_args);
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
    ks_free(c->rope_cos);
    ks_free(c->rope_sin);
    ks_pool_destroy(c->pool);
    ks_free(c);
}

/* ------------------------------------------------- policy services -- */
/* Attention probabilities of nq query rows over every entry of a head, for
 * policies that score entries at prefill (SnapKV, H2O, DapQ). */
static ks_status svc_attn_probs(void *svc, int32_t seq, int32_t layer, int32_t head, const float *q, int32_t nq,
                                float *acc) {
    ks_context *c = svc;
    const ks_hparams *hp = &c->model->hp;
    int32_t n = ks_kv_n_entries(c->kv, seq, layer, head), G = hp->n_head / hp->n_head_kv, hd = hp->head_dim;
    if (n == 0) return KS_OK;
    ks_kv_seg *segs = ks_malloc(sizeof(ks_kv_seg) * ((size_t)n + 1));
    int32_t *first = ks_malloc(sizeof(int32_t) * ((size_t)n + 1)), *pages = ks_malloc(sizeof(int32_t) * ((size_t)n + 1));
    int32_t np, total;
    int32_t nseg = ks_infer_segs_plan(NULL, n, ks_kv_page_size(c->kv), segs, first, pages, &np, &total);
    bool slow = ks_kv_layer_tier(c->kv, layer) == KS_TIER_SLOW;
    uint8_t *buf = slow ? ks_malloc(ks_kv_page_bytes(c->kv) * (size_t)np) : NULL;
    ks_status st = ks_infer_segs_resolve(c->kv, seq, layer, head, segs, first, nseg, pages, buf);
    if (st == KS_OK) {
        float *scores = ks_malloc_aligned(sizeof(float) * ((size_t)(G > 4 ? G : 4) * n + 16));
        float *out = ks_malloc(sizeof(float) * (size_t)G * hd), *tmp = ks_malloc(sizeof(float) * ((size_t)hd + 16));
        for (int32_t r = 0; r < nq; r++)
            ks_attention_segs(c->kv_type, segs, nseg, n, hd, G, q + (size_t)r * G * hd, scores, out, tmp, acc, true);
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
    uint8_t *buf = ks_malloc(ks_kv_page_bytes(c->kv));
    size_t row = ks_kv_row_size(c->kv);
    ks_status st = KS_OK;
    for (int32_t e = first, lp = -1; e < first + n && st == KS_OK; e++) {
        if (e / P != lp) {
            lp = e / P;
            st = ks_kv_read_page(c->kv, seq, layer, head, lp, buf);
        }
        if (st == KS_OK)
            ks_dequantize_row(ks_kv_dtype(c->kv_type), buf + (size_t)(e % P) * row, out + (size_t)(e - first) * hd, hd);
    }
    ks_free(buf);
    return st;
}

static ks_status svc_evict(void *svc, int32_t seq, int32_t layer, int32_t head, const uint8_t *keep) {
    ks_context *c = svc;
    return ks_kv_compact(c->kv, seq, layer, head, keep);
}

/* ------------------------------------------------------------ create -- */
/* Defaults filled in and every parameter checked, before anything is allocated. */
static ks_status check_params(const ks_hparams *hp, ks_context_params *p) {
    if (p->n_ctx <= 0) p->n_ctx = hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096;
    if (p->n_threads <= 0) p->n_threads = ks_cpu_count();
    if (p->n_batch <= 0) p->n_batch = 256;
    if (!p->policy || !*p->policy) p->policy = "dense";
    if (p->page <= 0) p->page = 32;
    if (p->n_seq <= 0 || p->n_seq > 4096) return KS_FAIL(KS_ERR_INVALID_ARG, "n_seq %d out of range [1, 4096]", p->n_seq);
    if (p->n_ctx > (1 << 24)) return KS_FAIL(KS_ERR_INVALID_ARG, "n_ctx %d is too large", p->n_ctx);
    if (p->kv_type != KS_KV_F16 && p->kv_type != KS_KV_Q8)
        return KS_FAIL(KS_ERR_INVALID_ARG, "unknown KV type %d", (int)p->kv_type);
    if (p->kv_type == KS_KV_Q8 && hp->head_dim % KS_QK8_0)
        return KS_FAIL(KS_ERR_UNSUPPORTED, "8-bit KV needs a head dim multiple of 32 (have %d)", hp->head_dim);
    if (p->budget < 0 || p->sink < 0 || p->window < 0)
        return KS_FAIL(KS_ERR_INVALID_ARG, "budget, sink and window must be >= 0");
    if (p->page > 4096) return KS_FAIL(KS_ERR_INVALID_ARG, "page size %d out of range [1, 4096]", p->page);
    if (p->kv_slots < 0) return KS_FAIL(KS_ERR_INVALID_ARG, "kv_slots %d < 0", p->kv_slots);
    if (p->kv_offload_layers < 0 || p->kv_offload_layers > hp->n_layer)
        return KS_FAIL(KS_ERR_INVALID_ARG, "cannot offload %d of %d layers", p->kv_offload_layers, hp->n_layer);
    if (p->n_ctx > hp->n_ctx_train)
        KS_LOG(WARN, "context %d exceeds the model's trained context %d", p->n_ctx, hp->n_ctx_train);
    return KS_OK;
}

/* The store, with the last kv_offload_layers layers in the slow tier.  Slots
 * of an offloaded layer: what one step's selection can touch, with headroom so
 * pages stay resident across steps; all pages when dense. */
static ks_status create_kv(ks_context *c) {
    const ks_hparams *hp = &c->model->hp;
    const ks_context_params *p = &c->params;
    int32_t max_pages = (p->n_ctx + p->page - 1) / p->page, slot_pages = 0;
    if (p->kv_slots > 0) {
        slot_pages = p->kv_slots < max_pages ? p->kv_slots : 0;
    } else if (p->budget > 0) {
        slot_pages = 2 * ((p->budget + p->page - 1) / p->page) + 4;
        if (slot_pages > max_pages) slot_pages = 0;
    }
    ks_kv_params kp = ks_kv_default_params();
    kp.n_layer = hp->n_layer;
    kp.n_head_kv = hp->n_head_kv;
    kp.head_dim = hp->head_dim;
    kp.n_seq = p->n_seq;
    kp.n_ctx = p->n_ctx;
    kp.page = p->page;
    kp.type = p->kv_type;
    kp.offload_dir = p->kv_offload_dir;
    kp.slot_pages = slot_pages;
    KS_TRY(ks_kv_create(&kp, &c->kv));
    for (int32_t l = hp->n_layer - p->kv_offload_layers; l < hp->n_layer; l++)
        KS_TRY(ks_kv_set_layer_tier(c->kv, l, KS_TIER_SLOW));
    return KS_OK;
}

static ks_status create_policy(ks_context *c) {
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
    ks_policy_params pp = ks_policy_default_params();
    pp.budget = p->budget;
    pp.sink = p->sink;
    pp.window = p->window;
    pp.dense_layers = p->dense_layers;
    pp.args = p->policy_args;
    KS_TRY(ks_policy_create(p->policy, &c->penv, &pp, &c->policy));
    c->dense_layers = ks_policy_dense_layers(c->policy);
    c->n_aux = ks_policy_hidden_layers(c->policy, c->aux_layer);
    KS_ASSERT(c->n_aux >= 0 && c->n_aux <= 3);
    for (int k = 0; k < c->n_aux; k++)
        if (c->aux_layer[k] < 0 || c->aux_layer[k] > hp->n_layer)
            return KS_FAIL(KS_ERR_INVALID_ARG, "policy asks for the hidden state of layer %d of %d", c->aux_layer[k],
                           hp->n_layer);
    c->obs_window = ks_policy_obs_window(c->policy);
    return KS_OK;
}

/* Activations of max_rows rows, and the matmul scratch for the widest weight. */
static void alloc_rows(ks_context *c) {
    const ks_model *m = c->model;
    const ks_hparams *hp = &m->hp;
    size_t rows = (size_t)c->max_rows;
    size_t q_dim = (size_t)hp->n_head * hp->head_dim, kv_dim = (size_t)hp->n_head_kv * hp->head_dim;
    size_t wide = (size_t)hp->n_embd > q_dim ? (size_t)hp->n_embd : q_dim;
    c->seq_len = ks_calloc((size_t)c->n_seq, sizeof(int32_t));
    c->entropy = ks_malloc(sizeof(float) * (size_t)c->n_seq);
    c->varentropy = ks_malloc(sizeof(float) * (size_t)c->n_seq);
    for (int i = 0; i < c->n_seq; i++) c->entropy[i] = c->varentropy[i] = NAN;
    c->n_att = ks_calloc(rows * hp->n_head_kv, sizeof(int32_t));
    if (c->n_aux) c->aux_h = ks_malloc(sizeof(float) * rows * c->n_aux * hp->n_embd);
    c->x = ks_malloc_aligned(sizeof(float) * rows * hp->n_embd);
    c->xn = ks_malloc_aligned(sizeof(float) * rows * wide);
    c->q = ks_malloc_aligned(sizeof(float) * rows * q_dim);
    c->kk = ks_malloc_aligned(sizeof(float) * rows * kv_dim);
    c->vv = ks_malloc_aligned(sizeof(float) * rows * kv_dim);
    c->att = ks_malloc_aligned(sizeof(float) * rows * q_dim);
    c->gate = ks_malloc_aligned(sizeof(float) * rows * hp->n_ff);
    c->up = ks_malloc_aligned(sizeof(float) * rows * hp->n_ff);
    c->rope_cos = ks_malloc(sizeof(float) * rows * (hp->n_rot / 2));
    c->rope_sin = ks_malloc(sizeof(float) * rows * (hp->n_rot / 2));
    size_t mm = ks_matmul_scratch_bytes(m->output.type, m->output.cols, rows);
    for (int il = 0; il < hp->n_layer; il++) {
        const ks_layer *L = &m->layers[il];
        const ks_weight *lw[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof lw / sizeof lw[0]; i++) {
            size_t need = ks_matmul_scratch_bytes(lw[i]->type, lw[i]->cols, rows);
            if (need > mm) mm = need;
        }
    }
    c->mm_scratch = ks_malloc_aligned(mm ? mm : 64);
}

/* Per-worker attention scratch, sized for a whole head of the context. */
static void alloc_scratch(ks_context *c) {
    const ks_hparams *hp = &c->model->hp;
    int G = hp->n_head / hp->n_head_kv;
    size_t n_ctx = (size_t)c->n_ctx, max_pages = (n_ctx + c->params.page - 1) / c->params.page;
    c->scr = ks_calloc((size_t)c->params.n_threads, sizeof(ks_attn_scratch));
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
        s->recall_sum = ks_calloc((size_t)hp->n_layer * hp->n_head_kv, sizeof(double));
        s->recall_n = ks_calloc((size_t)hp->n_layer * hp->n_head_kv, sizeof(uint32_t));
    }
}

ks_status ks_context_create(const ks_model *model, ks_context_params p, ks_context **out) {
    if (!model || !out) return KS_FAIL(KS_ERR_INVALID_ARG, "NULL model or out");
    if (model->vocab_only) return KS_FAIL(KS_ERR_INVALID_ARG, "the model was loaded vocabulary-only");
    KS_TRY(check_params(&model->hp, &p));
    ks_context *c = ks_calloc(1, sizeof *c);
    c->model = model;
    p.policy = ks_strdup(p.policy);
    p.policy_args = p.policy_args ? ks_strdup(p.policy_args) : NULL;
    p.kv_offload_dir = p.kv_offload_dir ? ks_strdup(p.kv_offload_dir) : NULL;
    c->params = p;
    c->n_ctx = p.n_ctx;
    c->n_seq = p.n_seq;
    c->max_rows = p.n_batch > p.n_seq ? p.n_batch : p.n_seq;
    c->kv_type = p.kv_type;
    c->kv_row_bytes = ks_kv_row_bytes(p.kv_type, model->hp.head_dim);
    ks_status st;
    if ((st = ks_pool_create(p.n_threads, &c->pool)) != KS_OK) goto fail;
    if ((st = create_kv(c)) != KS_OK) goto fail;
    if ((st = create_policy(c)) != KS_OK) goto fail;
    alloc_rows(c);
    alloc_scratch(c);
    if (p.mem_cap > 0 && (st = ks_infer_plan_init(c)) != KS_OK) goto fail;
    *out = c;
    return KS_OK;
fail:
    ks_context_destroy(c); /* takes a partly built context */
    return st;
}

void ks_seq_reset(ks_context *c, int32_t seq) {
    KS_ASSERT(seq >= 0 && seq < c->n_seq);
    ks_kv_seq_clear(c->kv, seq);
    ks_policy_seq_reset(c->policy, seq);
    c->seq_len[seq] = 0;
    c->entropy[seq] = c->varentropy[seq] = NAN;
}
int32_t ks_seq_len(const ks_context *c, int32_t seq) {
    KS_ASSERT(seq >= 0 && seq < c->n_seq);
    return c->seq_len[seq];
}
void ks_context_stats(const ks_context *c, ks_stats *out) {
    *out = c->stats;
    ks_policy_counters pc;
    ks_policy_get_counters(c->policy, &pc);
    out->policy_selections = pc.selections;
    out->policy_hits = pc.hits;
    out->policy_misses = pc.misses;
    out->policy_corrections = pc.corrections;
    out->policy_rebuilds = pc.rebuilds;
}

void ks_stats_reset(ks_context *c) { memset(&c->stats, 0, sizeof c->stats); }
const ks_model *ks_context_model(const ks_context *c) { return c->model; }

void ks_context_set_recall_probe(ks_context *c, bool on) { c->recall_probe = on; }

void ks_context_take_recall(ks_context *c, double *per, double *mean) {
    const ks_hparams *hp = &c->model->hp;
    size_t n = (size_t)hp->n_layer * hp->n_head_kv;
    double tot = 0;
    size_t cnt = 0;
    for (size_t i = 0; i < n; i++) {
        double sum = 0;
        uint32_t k = 0;
        for (int t = 0; t < c->params.n_threads; t++) {
            sum += c->scr[t].recall_sum[i];
            k += c->scr[t].recall_n[i];
            c->scr[t].recall_sum[i] = 0;
            c->scr[t].recall_n[i] = 0;
        }
        if (per) per[i] = k ? sum / k : NAN;
        if (k) tot += sum / k, cnt++;
    }
    if (mean) *mean = cnt ? tot / (double)cnt : NAN;
}
ks_pool *ks_context_pool(ks_context *c) { return c->pool; }

