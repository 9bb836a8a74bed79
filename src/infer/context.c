/*
 * context.c — the forward pass: sequences, prefill, batched decode, and the
 * place where a selection policy meets the paged KV store.
 *
 * One function, forward_rows(), runs every case.  Its input is a list of rows
 * (sequence, position, token): a prefill chunk is rows of one sequence at
 * consecutive positions, a decode step is one row for each of several
 * sequences.  Each weight matrix is multiplied against all rows at once, so a
 * decode step of 16 sequences streams the weights once instead of 16 times —
 * the reason batching pays on memory-bound hardware.  K and V of every row are
 * appended to the store before attention runs, and each row remembers how
 * many entries existed right after its own append, which makes causal
 * attention inside a prefill chunk fall out of "attend to entries 0..n_att".
 *
 * KV lives in the paged store (src/kv): head-pages of P rows, K then V.
 * Attention runs per (row, KV head) over a list of segments — runs of
 * consecutive entries inside one page, read in place — so dense attention is
 * "every page in order" and sparse attention is "the selected runs", through
 * the same kernel: a policy with a budget >= the context reproduces dense
 * bit for bit.  At a decode step each (row, layer >= dense_layers, KV head)
 * asks the policy for a selection inside the attention worker (selection is
 * parallel with attention), the framework adds sinks and the recent window
 * in a bitmap, extracts runs, and — for a layer in the slow tier — fetches
 * the touched pages into fast slots (or gathers them when the slots are too
 * few) before the kernel reads them.
 *
 * Attention processes a whole GQA group per KV head: each K/V row is
 * converted once and used by all G query heads, so long-context decode reads
 * each selected entry exactly once per step.  Byte accounting (weights and KV
 * actually read, tier traffic) is kept per call, so every benchmark prints
 * GB/s beside tok/s.
 */
#define _GNU_SOURCE
#include "infer/infer.h"

#include "core/simd.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

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

/* ------------------------------------------------- attention kernels -- */
static void kv_row_to_f32_scalar(ks_kv_type t, const void *row, float *dst, int hd) {
    if (t == KS_KV_F16) {
        const ks_f16 *h = row;
        for (int i = 0; i < hd; i++) dst[i] = ks_f16_to_f32(h[i]);
    } else {
        ks_dequantize_row(KS_DTYPE_Q8_0, row, dst, hd);
    }
}

/* Portable reference: any KV type, any head dim.  tmp: [hd]. */
static void attn_segs_ref(ks_kv_type kt, const ks_kv_seg *segs, int nseg, int total, size_t row_bytes, int hd,
                          int G, const float *q, float *scores, float *out, float scale, float *tmp) {
    int t = 0;
    for (int si = 0; si < nseg; si++)
        for (int j = 0; j < segs[si].len; j++, t++) {
            kv_row_to_f32_scalar(kt, (const uint8_t *)segs[si].K + (size_t)j * row_bytes, tmp, hd);
            for (int g = 0; g < G; g++) {
                const float *qg = q + (size_t)g * hd;
                float acc = 0;
                for (int i = 0; i < hd; i++) acc += qg[i] * tmp[i];
                scores[(size_t)g * total + t] = acc * scale;
            }
        }
    for (int g = 0; g < G; g++) ks_softmax(scores + (size_t)g * total, total);
    for (int g = 0; g < G; g++) memset(out + (size_t)g * hd, 0, sizeof(float) * hd);
    t = 0;
    for (int si = 0; si < nseg; si++)
        for (int j = 0; j < segs[si].len; j++, t++) {
            kv_row_to_f32_scalar(kt, (const uint8_t *)segs[si].V + (size_t)j * row_bytes, tmp, hd);
            for (int g = 0; g < G; g++) {
                float p = scores[(size_t)g * total + t];
                float *o = out + (size_t)g * hd;
                for (int i = 0; i < hd; i++) o[i] += p * tmp[i];
            }
        }
}

void ks_attention_segs(ks_kv_type kt, const ks_kv_seg *segs, int nseg, int total, int hd, int G, const float *q,
                       float *scores, float *out, float *tmp, float *weights, bool allow_simd) {
    KS_ASSERT(total > 0);
    float scale = 1.0f / sqrtf((float)hd);
#if defined(__x86_64__)
    if (allow_simd && kt == KS_KV_F16 && ks_simd_current() >= KS_SIMD_AVX512 &&
        ks_attention_segs_avx512((const ks_kv_seg16 *)segs, nseg, total, hd, G, q, scores, out, scale, weights))
        return;
    if (allow_simd && ks_simd_current() >= KS_SIMD_AVX2 &&
        ks_attention_segs_avx2(kt, segs, nseg, total, hd, G, q, scores, out, scale, weights))
        return;
#endif
    attn_segs_ref(kt, segs, nseg, total, ks_kv_row_bytes(kt, hd), hd, G, q, scores, out, scale, tmp);
    if (weights)
        for (int g = 0; g < G; g++)
            for (int t = 0; t < total; t++) weights[t] += scores[(size_t)g * total + t];
}

void ks_attention_group(ks_kv_type kt, const void *K, const void *V, int len, int hd, int G,
                        const float *q, float *scores, float *out, float *tmp, bool allow_simd) {
    ks_kv_seg seg = {K, V, len};
    ks_attention_segs(kt, &seg, 1, len, hd, G, q, scores, out, tmp, NULL, allow_simd);
}

/* ------------------------------------------------------------ context -- */
static void record_failure(ks_context *c, ks_status st) {
    if (!atomic_flag_test_and_set(&c->step_failed)) c->step_status = st;
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

/* Attention probabilities of nq query rows over every entry of a head, for
 * policies that score entries at prefill (SnapKV, H2O, DapQ).  Slow-tier
 * pages are gathered into a temporary buffer: this runs once per prompt. */
static ks_status svc_attn_probs(void *svc, int32_t seq, int32_t layer, int32_t head, const float *q, int32_t nq,
                                float *acc) {
    ks_context *c = svc;
    const ks_hparams *hp = &c->model->hp;
    int32_t n = ks_kv_n_entries(c->kv, seq, layer, head), np = ks_kv_n_pages(c->kv, seq, layer, head);
    int32_t P = ks_kv_page_size(c->kv), G = hp->n_head / hp->n_head_kv, hd = hp->head_dim;
    if (n == 0) return KS_OK;
    size_t pb = ks_kv_page_bytes(c->kv), row = ks_kv_row_size(c->kv);
    bool slow = ks_kv_layer_tier(c->kv, layer) == KS_TIER_SLOW;
    uint8_t *buf = slow ? ks_malloc(pb * (size_t)np) : NULL;
    ks_kv_seg *segs = ks_malloc(sizeof(ks_kv_seg) * (size_t)np);
    ks_status st = KS_OK;
    for (int32_t lp = 0; lp < np && st == KS_OK; lp++) {
        const uint8_t *K, *V;
        if (slow) {
            st = ks_kv_read_page(c->kv, seq, layer, head, lp, buf + (size_t)lp * pb);
            K = buf + (size_t)lp * pb;
            V = K + (size_t)P * row;
        } else {
            ks_kv_page_rows(c->kv, seq, layer, head, lp, &K, &V);
        }
        segs[lp] = (ks_kv_seg){K, V, n - lp * P < P ? n - lp * P : P};
    }
    if (st == KS_OK) {
        float *scores = ks_malloc_aligned(sizeof(float) * ((size_t)(G > 4 ? G : 4) * n + 16));
        float *out = ks_malloc(sizeof(float) * (size_t)G * hd), *tmp = ks_malloc(sizeof(float) * ((size_t)hd + 16));
        for (int32_t r = 0; r < nq; r++)
            ks_attention_segs(c->kv_type, segs, np, n, hd, G, q + (size_t)r * G * hd, scores, out, tmp, acc, true);
        ks_free_aligned(scores);
        ks_free(out);
        ks_free(tmp);
    }
    ks_free(segs);
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
        if (st == KS_OK) kv_row_to_f32_scalar(c->kv_type, buf + (size_t)(e % P) * row, out + (size_t)(e - first) * hd, hd);
    }
    ks_free(buf);
    return st;
}

static ks_status svc_evict(void *svc, int32_t seq, int32_t layer, int32_t head, const uint8_t *keep) {
    ks_context *c = svc;
    return ks_kv_compact(c->kv, seq, layer, head, keep);
}

static ks_status plan_init(ks_context *c);

ks_status ks_context_create(const ks_model *model, ks_context_params p, ks_context **out) {
    if (!model || !out) return KS_FAIL(KS_ERR_INVALID_ARG, "NULL model or out");
    if (model->vocab_only) return KS_FAIL(KS_ERR_INVALID_ARG, "the model was loaded vocabulary-only");
    const ks_hparams *hp = &model->hp;
    if (p.n_ctx <= 0) p.n_ctx = hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096;
    if (p.n_threads <= 0) p.n_threads = ks_cpu_count();
    if (p.n_batch <= 0) p.n_batch = 256;
    if (!p.policy || !*p.policy) p.policy = "dense";
    if (p.page <= 0) p.page = 32;
    if (p.n_seq <= 0 || p.n_seq > 4096) return KS_FAIL(KS_ERR_INVALID_ARG, "n_seq %d out of range [1, 4096]", p.n_seq);
    if (p.n_ctx > (1 << 24)) return KS_FAIL(KS_ERR_INVALID_ARG, "n_ctx %d is too large", p.n_ctx);
    if (p.kv_type != KS_KV_F16 && p.kv_type != KS_KV_Q8)
        return KS_FAIL(KS_ERR_INVALID_ARG, "unknown KV type %d", (int)p.kv_type);
    if (p.kv_type == KS_KV_Q8 && hp->head_dim % KS_QK8_0)
        return KS_FAIL(KS_ERR_UNSUPPORTED, "8-bit KV needs a head dim multiple of 32 (have %d)", hp->head_dim);
    if (p.budget < 0 || p.sink < 0 || p.window < 0)
        return KS_FAIL(KS_ERR_INVALID_ARG, "budget, sink and window must be >= 0");
    if (p.page > 4096) return KS_FAIL(KS_ERR_INVALID_ARG, "page size %d out of range [1, 4096]", p.page);
    if (p.kv_offload_layers < 0 || p.kv_offload_layers > hp->n_layer)
        return KS_FAIL(KS_ERR_INVALID_ARG, "cannot offload %d of %d layers", p.kv_offload_layers, hp->n_layer);
    if (p.n_ctx > hp->n_ctx_train)
        KS_LOG(WARN, "context %d exceeds the model's trained context %d", p.n_ctx, hp->n_ctx_train);
    ks_context *c = ks_calloc(1, sizeof *c);
    c->model = model;
    p.policy = ks_strdup(p.policy);
    p.policy_args = p.policy_args ? ks_strdup(p.policy_args) : NULL;
    p.kv_offload_dir = p.kv_offload_dir ? ks_strdup(p.kv_offload_dir) : NULL;
    c->params = p;
    c->n_ctx = p.n_ctx;
    c->n_seq = p.n_seq;
    c->kv_type = p.kv_type;
    c->kv_row_bytes = ks_kv_row_bytes(p.kv_type, hp->head_dim);
    ks_status st = ks_pool_create(p.n_threads, &c->pool);
    if (st != KS_OK) {
        c->params.n_threads = 0;
        ks_context_destroy(c);
        return st;
    }
    /* slots of an offloaded layer: what one step's selection can touch, with
     * headroom so pages stay resident across steps; all pages when dense */
    int32_t max_pages = (p.n_ctx + p.page - 1) / p.page, slot_pages = 0;
    if (p.kv_slots < 0) return KS_FAIL(KS_ERR_INVALID_ARG, "kv_slots %d < 0", p.kv_slots);
    if (p.kv_slots > 0) {
        slot_pages = p.kv_slots < max_pages ? p.kv_slots : 0;
    } else if (p.budget > 0) {
        slot_pages = 2 * ((p.budget + p.page - 1) / p.page) + 4;
        if (slot_pages > max_pages) slot_pages = 0;
    }
    ks_kv_params kp = ks_kv_default_params();
    kp.n_layer = hp->n_layer;
    kp.n_head_kv = hp->n_head_kv;
    kp.head_dim = hp->head_dim;
    kp.n_seq = p.n_seq;
    kp.n_ctx = p.n_ctx;
    kp.page = p.page;
    kp.type = p.kv_type;
    kp.offload_dir = p.kv_offload_dir;
    kp.slot_pages = slot_pages;
    st = ks_kv_create(&kp, &c->kv);
    if (st != KS_OK) {
        ks_context_destroy(c);
        return st;
    }
    for (int32_t l = hp->n_layer - p.kv_offload_layers; l < hp->n_layer; l++) {
        st = ks_kv_set_layer_tier(c->kv, l, KS_TIER_SLOW);
        if (st != KS_OK) {
            ks_context_destroy(c);
            return st;
        }
    }
    c->penv = (ks_policy_env){.pool = c->pool,
                              .n_layer = hp->n_layer,
                              .n_head = hp->n_head,
                              .n_head_kv = hp->n_head_kv,
                              .head_dim = hp->head_dim,
                              .n_seq = p.n_seq,
                              .n_ctx = p.n_ctx,
                              .n_vocab = hp->n_vocab,
                              .n_embd = hp->n_embd,
                              .tok_embd = model->tok_embd,
                              .kv = c->kv,
                              .svc = c,
                              .attn_probs = svc_attn_probs,
                              .evict = svc_evict,
                              .read_keys = svc_read_keys};
    ks_policy_params pp = ks_policy_default_params();
    pp.budget = p.budget;
    pp.sink = p.sink;
    pp.window = p.window;
    pp.dense_layers = p.dense_layers;
    pp.args = p.policy_args;
    st = ks_policy_create(p.policy, &c->penv, &pp, &c->policy);
    if (st != KS_OK) {
        ks_context_destroy(c);
        return st;
    }
    c->dense_layers = ks_policy_dense_layers(c->policy);
    c->n_aux = ks_policy_hidden_layers(c->policy, c->aux_layer);
    KS_ASSERT(c->n_aux >= 0 && c->n_aux <= 3);
    for (int k = 0; k < c->n_aux; k++)
        if (c->aux_layer[k] < 0 || c->aux_layer[k] > hp->n_layer) {
            int32_t bad = c->aux_layer[k];
            ks_context_destroy(c);
            return KS_FAIL(KS_ERR_INVALID_ARG, "policy asks for the hidden state of layer %d of %d", bad, hp->n_layer);
        }
    c->obs_window = ks_policy_obs_window(c->policy);
    c->seq_len = ks_calloc((size_t)c->n_seq, sizeof(int32_t));
    int rows = p.n_batch > c->n_seq ? p.n_batch : c->n_seq;
    c->max_rows = rows;
    c->n_att = ks_calloc((size_t)rows * hp->n_head_kv, sizeof(int32_t));
    if (c->n_aux) c->aux_h = ks_malloc(sizeof(float) * (size_t)rows * c->n_aux * hp->n_embd);
    size_t q_dim = (size_t)hp->n_head * hp->head_dim, kv_dim = (size_t)hp->n_head_kv * hp->head_dim;
    c->entropy = ks_malloc(sizeof(float) * (size_t)c->n_seq);
    c->varentropy = ks_malloc(sizeof(float) * (size_t)c->n_seq);
    for (int i = 0; i < c->n_seq; i++) c->entropy[i] = c->varentropy[i] = NAN;
    size_t wide = (size_t)hp->n_embd > q_dim ? (size_t)hp->n_embd : q_dim;
    c->x = ks_malloc_aligned(sizeof(float) * rows * hp->n_embd);
    c->xn = ks_malloc_aligned(sizeof(float) * rows * wide);
    c->q = ks_malloc_aligned(sizeof(float) * rows * q_dim);
    c->kk = ks_malloc_aligned(sizeof(float) * rows * kv_dim);
    c->vv = ks_malloc_aligned(sizeof(float) * rows * kv_dim);
    c->att = ks_malloc_aligned(sizeof(float) * rows * q_dim);
    c->gate = ks_malloc_aligned(sizeof(float) * rows * hp->n_ff);
    c->up = ks_malloc_aligned(sizeof(float) * rows * hp->n_ff);
    int G = hp->n_head / hp->n_head_kv;
    c->scr = ks_calloc((size_t)p.n_threads, sizeof(ks_attn_scratch));
    for (int i = 0; i < p.n_threads; i++) {
        ks_attn_scratch *s = &c->scr[i];
        /* scores: [G][n_ctx] for the portable kernels, [n_ctx][4] for the AVX-512 one */
        s->scores = ks_malloc_aligned(sizeof(float) * ((size_t)(G > 4 ? G : 4) * c->n_ctx + 16));
        s->tmp = ks_malloc_aligned(sizeof(float) * ((size_t)hp->head_dim + 16));
        s->weights = ks_malloc(sizeof(float) * (size_t)c->n_ctx);
        s->entries = ks_malloc(sizeof(int32_t) * (size_t)c->n_ctx);
        s->mask = ks_malloc(sizeof(uint64_t) * ((size_t)c->n_ctx / 64 + 2));
        s->sel = ks_malloc(sizeof(int32_t) * (size_t)c->n_ctx);
        s->next = ks_malloc(sizeof(int32_t) * (size_t)c->n_ctx);
        s->pages = ks_malloc(sizeof(int32_t) * ((size_t)max_pages + 1));
        s->segs = ks_malloc(sizeof(ks_kv_seg) * ((size_t)c->n_ctx + 1));
        s->probe_out = ks_malloc(sizeof(float) * (size_t)hp->n_head * hp->head_dim);
        s->recall_sum = ks_calloc((size_t)hp->n_layer * hp->n_head_kv, sizeof(double));
        s->recall_n = ks_calloc((size_t)hp->n_layer * hp->n_head_kv, sizeof(uint32_t));
    }
    size_t mm = 0;
    const ks_weight *ws[] = {&model->layers[0].wq, &model->layers[0].wo, &model->layers[0].w_gate,
                             &model->layers[0].w_down, &model->output};
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) {
        size_t need = ks_matmul_scratch_bytes(ws[i]->type, ws[i]->cols, rows);
        if (need > mm) mm = need;
    }
    for (int il = 0; il < hp->n_layer; il++) {
        const ks_layer *L = &model->layers[il];
        const ks_weight *lw[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < 7; i++) {
            size_t need = ks_matmul_scratch_bytes(lw[i]->type, lw[i]->cols, rows);
            if (need > mm) mm = need;
        }
    }
    c->mm_scratch = ks_malloc_aligned(mm ? mm : 64);
    c->rope_cos = ks_malloc(sizeof(float) * rows * (hp->n_rot / 2));
    c->rope_sin = ks_malloc(sizeof(float) * rows * (hp->n_rot / 2));
    if (p.mem_cap > 0) {
        st = plan_init(c);
        if (st != KS_OK) {
            ks_context_destroy(c);
            return st;
        }
    }
    *out = c;
    return KS_OK;
}

/* The memory model over this context's real sizes: weights as loaded, the
 * policy's own weights, the KV element size, R = n_seq, B = the budget, and
 * alpha measured from the per-token scratch the workers allocate. */
static ks_status plan_init(ks_context *c) {
    const ks_hparams *hp = &c->model->hp;
    const ks_context_params *p = &c->params;
    if (p->budget <= 0)
        return KS_FAIL(KS_ERR_INVALID_ARG, "adaptive memory management needs a budget: offloaded layers keep B entries fast");
    int G = hp->n_head / hp->n_head_kv;
    double per_tok_scratch = (double)p->n_threads *
                             (4.0 * (G > 4 ? G : 4) + 4 + 4 + 4 + 4 + sizeof(ks_kv_seg) + 1.0 / 8 +
                              2.0 * c->kv_row_bytes /* gather buffer */);
    double elem = (double)c->kv_row_bytes / hp->head_dim;
    c->plan = (ks_memplan_params){.model_bytes = (double)c->model->weight_bytes,
                                  .dlm_bytes = (double)ks_policy_weight_bytes(c->policy),
                                  .overhead = p->mem_overhead > 0 ? p->mem_overhead : 1.3,
                                  .n_layer = hp->n_layer,
                                  .n_head_kv = hp->n_head_kv,
                                  .head_dim = hp->head_dim,
                                  .kv_elem_bytes = elem,
                                  .requests = c->n_seq,
                                  .budget = p->budget,
                                  .dlm_cache = ks_policy_own_kcache(c->policy),
                                  .alpha = per_tok_scratch / (2.0 * elem * c->n_seq * hp->n_head_kv * hp->head_dim),
                                  .mem_cap = p->mem_cap};
    c->plan_thr = ks_malloc(sizeof(int64_t) * (size_t)(hp->n_layer + 1));
    KS_TRY(ks_memplan_thresholds(&c->plan, c->plan_thr));
    if (c->plan_thr[hp->n_layer] < 0)
        return KS_FAIL(KS_ERR_NOMEM, "a fast tier of %.2f GB cannot hold the weights (%.2f GB x %.1f) and %d x %d budget "
                       "entries", p->mem_cap / 1e9, c->plan.model_bytes / 1e9, c->plan.overhead, c->n_seq, p->budget);
    KS_LOG(INFO, "memory plan: cap %.2f GB, weights %.2f GB (+%.3f GB policy), alpha %.3f; all layers fast up to S=%lld, "
           "all offloaded up to S=%lld", p->mem_cap / 1e9, c->plan.model_bytes / 1e9, c->plan.dlm_bytes / 1e9,
           c->plan.alpha, (long long)c->plan_thr[0], (long long)c->plan_thr[hp->n_layer]);
    return KS_OK;
}

void ks_context_memplan(const ks_context *c, ks_memplan_info *out) {
    memset(out, 0, sizeof *out);
    if (!c->plan_thr) return;
    out->active = true;
    out->model_bytes = c->plan.model_bytes;
    out->dlm_bytes = c->plan.dlm_bytes;
    out->alpha = c->plan.alpha;
    out->overhead = c->plan.overhead;
    out->mem_cap = c->plan.mem_cap;
    out->n_layer = c->plan.n_layer;
    out->requests = c->plan.requests;
    out->budget = c->plan.budget;
    for (int32_t k = 0; k <= c->plan.n_layer && k < 257; k++) out->thresholds[k] = c->plan_thr[k];
    out->offloaded = c->n_offloaded;
}

/* Algorithm 2 for the longest sequence at length S. */
static ks_status plan_apply(ks_context *c, int64_t S) {
    if (!c->plan_thr) return KS_OK;
    int32_t L = c->model->hp.n_layer, want = ks_memplan_offloaded_at(c->plan_thr, L, S);
    if (want > L) {
        KS_LOG(WARN, "memory plan: S=%lld exceeds the fast tier even with every layer offloaded", (long long)S);
        want = L;
    }
    while (c->n_offloaded < want) {
        int32_t layer = L - 1 - c->n_offloaded;
        if (ks_kv_layer_tier(c->kv, layer) == KS_TIER_FAST) KS_TRY(ks_kv_set_layer_tier(c->kv, layer, KS_TIER_SLOW));
        c->n_offloaded++;
        c->stats.kv_offload_events++;
        KS_LOG(INFO, "memory plan: S=%lld crossed %lld: layer %d moved to the slow tier (%d of %d offloaded)",
               (long long)S, (long long)c->plan_thr[c->n_offloaded - 1], layer, c->n_offloaded, L);
    }
    return KS_OK;
}

ks_status ks_context_apply_memplan(ks_context *c) {
    int64_t S = 0;
    for (int32_t i = 0; i < c->n_seq; i++) S = c->seq_len[i] > S ? c->seq_len[i] : S;
    return plan_apply(c, S);
}

ks_status ks_context_offload_layer(ks_context *c, int32_t layer, bool offload) {
    if (!c || layer < 0 || layer >= c->model->hp.n_layer)
        return KS_FAIL(KS_ERR_INVALID_ARG, "layer %d out of range", layer);
    return ks_kv_set_layer_tier(c->kv, layer, offload ? KS_TIER_SLOW : KS_TIER_FAST);
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

/* Entropy and varentropy (nats) of softmax(logits): H = -sum p log p,
 * V = sum p (log p + H)^2 — CHESS's quality signals. */
static void entropy_of(const float *logits, int32_t n, float *H, float *Var) {
    float mx = logits[0];
    for (int32_t i = 1; i < n; i++) mx = logits[i] > mx ? logits[i] : mx;
    double z = 0;
    for (int32_t i = 0; i < n; i++) z += exp((double)logits[i] - mx);
    double lz = log(z), h = 0, m2 = 0;
    for (int32_t i = 0; i < n; i++) {
        double lp = (double)logits[i] - mx - lz, p = exp(lp);
        h -= p * lp;
        m2 += p * lp * lp;
    }
    *H = (float)h;
    *Var = (float)(m2 - h * h > 0 ? m2 - h * h : 0);
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

/* ------------------------------------------------------------ forward -- */
typedef struct {
    ks_context *c;
    int il, n;
    const int32_t *seq, *pos;
    bool sparse;          /* this layer of this step runs the policy */
    bool blocked;         /* prefill of one sequence: blocks of rows per task */
    atomic_int next;
} attn_job;

/* Next index >= t (and < n) whose bit equals `value`, or n. */
static int32_t mask_next(const uint64_t *m, int32_t t, int32_t n, bool value) {
    while (t < n) {
        uint64_t w = m[t >> 6];
        if (!value) w = ~w;
        w >>= (t & 63);
        if (w) {
            t += __builtin_ctzll(w);
            return t < n ? t : n;
        }
        t = (t | 63) + 1;
    }
    return n;
}

static void mask_set_range(uint64_t *m, int32_t a, int32_t b) {
    for (int32_t t = a; t < b;) {
        if ((t & 63) == 0 && b - t >= 64) {
            m[t >> 6] = ~0ull;
            t += 64;
        } else {
            m[t >> 6] |= 1ull << (t & 63);
            t++;
        }
    }
}

/* One (row, KV head): selection (decode, sparse layers), segments, kernel. */
static ks_status attend_one(ks_context *c, attn_job *j, ks_attn_scratch *s, int r, int h) {
    const ks_hparams *hp = &c->model->hp;
    int G = hp->n_head / hp->n_head_kv, hd = hp->head_dim;
    int32_t seq = j->seq[r], n = c->n_att[(size_t)r * hp->n_head_kv + h], P = c->params.page;
    const float *q = c->q + ((size_t)r * hp->n_head + (size_t)h * G) * hd;
    float *o = c->att + ((size_t)r * hp->n_head + (size_t)h * G) * hd;
    ks_select_req req = {.row = r, .seq = seq, .layer = j->il, .head = h, .pos = j->pos[r], .n_entries = n, .q = q};
    /* runs of entries to attend: one [0, n) when dense, else from the mask */
    ks_kv_seg *segs = s->segs;
    int32_t nseg = 0, total = 0, npages = 0, n_next = 0;
    bool all = true, next_pages = false;
    const ks_policy_params *pp = ks_policy_params_of(c->policy);
    /* a budget that covers the head leaves nothing to choose: attend all (the
     * policy still sees the weights below), which is also what makes a full
     * budget bit-identical to dense for page-granular policies */
    if (j->sparse && pp->budget > 0 && pp->budget < n) {
        req.sink = pp->sink < n ? pp->sink : n;
        req.window = pp->window < n ? pp->window : n;
        req.n_select = pp->budget > 0 ? pp->budget - req.sink - req.window : n;
        if (req.n_select < 0) req.n_select = 0;
        ks_selection sel = {.cap = c->n_ctx, .idx = s->sel, .next = s->next};
        double t0 = ks_time_sec();
        KS_TRY(ks_policy_select(c->policy, &req, &sel));
        s->select_seconds += ks_time_sec() - t0;
        n_next = sel.n_next;
        next_pages = sel.next_pages;
        if (!sel.all) {
            all = false;
            memset(s->mask, 0, sizeof(uint64_t) * ((size_t)n / 64 + 1));
            mask_set_range(s->mask, 0, req.sink);
            mask_set_range(s->mask, n - req.window, n);
            for (int32_t i = 0; i < sel.n; i++) {
                int32_t x = sel.idx[i];
                if (sel.pages) {
                    if (x >= 0 && (int64_t)x * P < n) mask_set_range(s->mask, x * P, (x + 1) * P < n ? (x + 1) * P : n);
                } else if (x >= 0 && x < n) {
                    s->mask[x >> 6] |= 1ull << (x & 63);
                }
            }
        }
    }
    bool slow = ks_kv_layer_tier(c->kv, j->il) == KS_TIER_SLOW;
    /* after a prefill eviction the evicted entries are gone: no dense mass to compare with */
    if (c->recall_probe && c->decoding && n == j->pos[r] + 1) {
        size_t slot = (size_t)j->il * hp->n_head_kv + (size_t)h;
        double recall = 1.0;
        if (!all && !slow) { /* dense pass over resident pages: mass covered by the mask */
            for (int32_t lp = 0, t = 0; t < n; lp++, t += P) {
                const uint8_t *K, *V;
                ks_kv_page_rows(c->kv, seq, j->il, h, lp, &K, &V);
                segs[lp] = (ks_kv_seg){K, V, n - t < P ? n - t : P};
            }
            memset(s->weights, 0, sizeof(float) * (size_t)n);
            ks_attention_segs(c->kv_type, segs, (n + P - 1) / P, n, hd, G, q, s->scores, s->probe_out, s->tmp,
                              s->weights, true);
            double in = 0, tot = 0;
            for (int32_t e = 0; e < n; e++) {
                tot += s->weights[e];
                if (s->mask[e >> 6] >> (e & 63) & 1) in += s->weights[e];
            }
            recall = tot > 0 ? in / tot : 1.0;
        }
        if (!slow || all) {
            s->recall_sum[slot] += recall;
            s->recall_n[slot]++;
        }
    }
    /* runs -> page-bounded segments (entries listed only when weights are wanted) */
    bool want_w = j->sparse && ks_policy_wants_weights(c->policy);
    for (int32_t a = all ? 0 : mask_next(s->mask, 0, n, true); a < n;) {
        int32_t b = all ? n : mask_next(s->mask, a, n, false);
        for (int32_t t = a; t < b;) {
            int32_t lp = t / P, e = (lp + 1) * P < b ? (lp + 1) * P : b;
            if (npages == 0 || s->pages[npages - 1] != lp) s->pages[npages++] = lp;
            segs[nseg++] = (ks_kv_seg){(const void *)(intptr_t)t, NULL, e - t}; /* first entry; resolved below */
            if (want_w)
                for (int32_t x = t; x < e; x++) s->entries[total + (x - t)] = x;
            total += e - t;
            t = e;
        }
        a = all ? n : mask_next(s->mask, b, n, true);
    }
    KS_ASSERT(total > 0 && total <= n);
    /* resolve segment pointers: in place (fast tier or fetched slots) or gathered */
    bool gather = false;
    if (slow) {
        /* prefill: forward_rows loaded every page of the head when they all fit */
        int32_t need = c->decoding ? npages : ks_kv_n_pages(c->kv, seq, j->il, h);
        if (need <= ks_kv_slot_pages(c->kv)) {
            /* prefill rows share their sequence's slots: forward_rows loaded
             * them before the parallel section; a decode row owns (seq, h) */
            if (c->decoding) KS_TRY(ks_kv_fetch(c->kv, seq, j->il, h, s->pages, npages, false));
        } else {
            gather = true;
            if (!s->gather) {
                s->gather = malloc(ks_kv_page_bytes(c->kv) * ((size_t)c->n_ctx / P + 1));
                if (!s->gather) return KS_FAIL(KS_ERR_NOMEM, "gather buffer for a slow-tier layer refused");
            }
        }
    }
    size_t row = ks_kv_row_size(c->kv), pb = ks_kv_page_bytes(c->kv);
    const uint8_t *K = NULL, *V = NULL;
    for (int32_t i = 0, pi = 0, cur = -1; i < nseg; i++) {
        int32_t t = (int32_t)(intptr_t)segs[i].K, lp = t / P;
        if (lp != cur) { /* segments are in entry order: pages advance monotonically */
            while (s->pages[pi] != lp) pi++;
            cur = lp;
            if (gather) {
                uint8_t *dst = s->gather + (size_t)pi * pb;
                KS_TRY(ks_kv_read_page(c->kv, seq, j->il, h, lp, dst));
                K = dst;
                V = dst + (size_t)P * row;
            } else {
                ks_kv_page_rows(c->kv, seq, j->il, h, lp, &K, &V);
            }
        }
        segs[i].K = K + (size_t)(t % P) * row;
        segs[i].V = V + (size_t)(t % P) * row;
    }
    float *w = NULL;
    if (want_w) {
        w = s->weights;
        memset(w, 0, sizeof(float) * (size_t)total);
    }
    ks_attention_segs(c->kv_type, segs, nseg, total, hd, G, q, s->scores, o, s->tmp, w, true);
    if (want_w) ks_policy_after_attention(c->policy, &req, s->entries, w, total);
    s->entries_attended += (uint64_t)total;
    if (slow && n_next > 0) { /* speculative recall for the next step, overlapped with the rest of this one */
        int32_t np = ks_kv_n_pages(c->kv, seq, j->il, h), m = 0;
        for (int32_t i = 0; i < n_next; i++) {
            int32_t lp = next_pages ? s->next[i] : s->next[i] / P;
            if (lp < 0 || lp >= np) continue;
            bool dup = false;
            for (int32_t k = m - 1; k >= 0 && k >= m - 4 && !dup; k--) dup = s->pages[k] == lp;
            if (!dup) s->pages[m++] = lp;
        }
        if (m <= ks_kv_slot_pages(c->kv)) KS_TRY(ks_kv_fetch(c->kv, seq, j->il, h, s->pages, m, true));
    }
    return KS_OK;
}

/* Prefill rows r0..r0+R-1 (one sequence, consecutive) of KV head h as one
 * block: every page is read once for the block.  false: use attend_one. */
static bool attend_block(ks_context *c, attn_job *j, ks_attn_scratch *s, int r0, int R, int h) {
    const ks_hparams *hp = &c->model->hp;
    int G = hp->n_head / hp->n_head_kv, hd = hp->head_dim, nkv = hp->n_head_kv;
    int32_t P = c->params.page, seq = j->seq[r0];
    int32_t n_att[KS_PREFILL_BLOCK];
    for (int r = 0; r < R; r++) n_att[r] = c->n_att[(size_t)(r0 + r) * nkv + h];
    int32_t n = n_att[R - 1];
    if (!s->blk_S) s->blk_S = ks_malloc(sizeof(float) * (size_t)KS_PREFILL_BLOCK * G * c->n_ctx);
    if (!s->blk_tile) s->blk_tile = ks_malloc(sizeof(float) * (size_t)P * hd);
    ks_kv_seg *segs = s->segs;
    int32_t nseg = 0;
    /* a slow-tier layer: its pages are in the slots (forward_rows loaded them) or gathered here */
    bool gather = ks_kv_layer_tier(c->kv, j->il) == KS_TIER_SLOW &&
                  ks_kv_n_pages(c->kv, seq, j->il, h) > ks_kv_slot_pages(c->kv);
    size_t pb = ks_kv_page_bytes(c->kv), row = ks_kv_row_size(c->kv);
    if (gather && !s->gather && !(s->gather = malloc(pb * ((size_t)c->n_ctx / P + 1)))) return false;
    for (int32_t lp = 0, t = 0; t < n; lp++, t += P) {
        const uint8_t *K, *V;
        if (gather) {
            uint8_t *dst = s->gather + (size_t)lp * pb;
            if (ks_kv_read_page(c->kv, seq, j->il, h, lp, dst) != KS_OK) return false; /* attend_one reports it */
            K = dst;
            V = dst + (size_t)P * row;
        } else {
            ks_kv_page_rows(c->kv, seq, j->il, h, lp, &K, &V);
        }
        segs[nseg++] = (ks_kv_seg){K, V, n - t < P ? n - t : P};
    }
    const float *q = c->q + ((size_t)r0 * hp->n_head + (size_t)h * G) * hd;
    float *o = c->att + ((size_t)r0 * hp->n_head + (size_t)h * G) * hd;
    size_t qo_stride = (size_t)hp->n_head * hd;
    float scale = 1.0f / sqrtf((float)hd);
    bool done = c->kv_type == KS_KV_F16 && ks_simd_current() >= KS_SIMD_AVX512
                    ? ks_attention_block_avx512((const ks_kv_seg16 *)segs, nseg, n_att, R, hd, G, q, qo_stride, o,
                                                qo_stride, s->blk_S, s->blk_tile, scale)
                    : ks_attention_block_avx2(c->kv_type, segs, nseg, n_att, R, hd, G, q, qo_stride, o, qo_stride,
                                              s->blk_S, s->blk_tile, scale);
    if (!done) return false;
    for (int r = 0; r < R; r++) s->entries_attended += (uint64_t)n_att[r];
    return true;
}

static void attn_worker(void *arg, int ith, int nth) {
    attn_job *j = arg;
    ks_context *c = j->c;
    const ks_hparams *hp = &c->model->hp;
    ks_attn_scratch *s = &c->scr[ith];
    if (j->blocked) { /* prefill: tasks are (block of rows, KV head) */
        int nb = (j->n + KS_PREFILL_BLOCK - 1) / KS_PREFILL_BLOCK, total = nb * hp->n_head_kv;
        for (;;) {
            int task = atomic_fetch_add(&j->next, 1);
            if (task >= total) break;
            int b = task / hp->n_head_kv, h = task % hp->n_head_kv;
            int r0 = b * KS_PREFILL_BLOCK, R = j->n - r0 < KS_PREFILL_BLOCK ? j->n - r0 : KS_PREFILL_BLOCK;
            if (attend_block(c, j, s, r0, R, h)) continue;
            for (int r = r0; r < r0 + R; r++) {
                ks_status st = attend_one(c, j, s, r, h);
                if (st != KS_OK) record_failure(c, st);
            }
        }
        return;
    }
    int total = j->n * hp->n_head_kv;
    for (;;) {
        int task = atomic_fetch_add(&j->next, 1);
        if (task >= total) break;
        ks_status st = attend_one(c, j, s, task / hp->n_head_kv, task % hp->n_head_kv);
        if (st != KS_OK) record_failure(c, st);
    }
    (void)nth;
}

static void matmul_w(ks_context *c, const ks_weight *w, const float *X, int n, float *Y) {
    ks_matmul(c->pool, w->type, w->data, w->rows, w->cols, X, n, Y, c->mm_scratch);
    c->stats.weight_bytes_read += ks_weight_bytes(w);
}

/* Copy the residual stream entering layer il (n_layer: after the last) of
 * every row, when the policy asked for it (SpeContext's fused states). */
static void capture_hidden(ks_context *c, int il, int n) {
    int D = c->model->hp.n_embd;
    for (int k = 0; k < c->n_aux; k++)
        if (c->aux_layer[k] == il)
            for (int r = 0; r < n; r++)
                memcpy(c->aux_h + ((size_t)r * c->n_aux + k) * D, c->x + (size_t)r * D, sizeof(float) * D);
}

/* rows: n entries (seq[i], pos[i], tok[i]); logits rows selected by want[i]
 * (NULL = none) are written consecutively to logits_out [n_want][n_vocab].
 * obs_slot[i] >= 0 (optional) copies row i's queries to obs_q for on_prefill.
 * On failure the appended entries stay; callers reset the sequence. */
static ks_status forward_rows(ks_context *c, int n, const int32_t *seq, const int32_t *pos, const int32_t *tok,
                              const bool *want, float *logits_out, const int32_t *obs_slot) {
    const ks_model *m = c->model;
    const ks_hparams *hp = &m->hp;
    int D = hp->n_embd, hd = hp->head_dim, nh = hp->n_head, nkv = hp->n_head_kv, half = hp->n_rot / 2;
    size_t q_dim = (size_t)nh * hd, kv_dim = (size_t)nkv * hd;
    KS_ASSERT(n > 0 && n <= c->max_rows);
    bool selects = c->decoding && ks_policy_selects(c->policy);
    for (int r = 0; r < n; r++) {
        ks_dequantize_row(m->tok_embd.type,
                          (const uint8_t *)m->tok_embd.data + ks_dtype_row_bytes(m->tok_embd.type, D) * (size_t)tok[r],
                          c->x + (size_t)r * D, D);
        ks_rope_angles(c->rope_cos + (size_t)r * half, c->rope_sin + (size_t)r * half, pos[r], hp->n_rot,
                       hp->rope_base, m->rope_freq_factors);
    }
    for (int il = 0; il < hp->n_layer; il++) {
        const ks_layer *L = &m->layers[il];
        capture_hidden(c, il, n);
        for (int r = 0; r < n; r++) ks_rmsnorm(c->xn + (size_t)r * D, c->x + (size_t)r * D, L->attn_norm, D, hp->rms_eps);
        matmul_w(c, &L->wq, c->xn, n, c->q);
        matmul_w(c, &L->wk, c->xn, n, c->kk);
        matmul_w(c, &L->wv, c->xn, n, c->vv);
        for (int r = 0; r < n; r++) {
            float *q = c->q + r * q_dim, *k = c->kk + r * kv_dim, *v = c->vv + r * kv_dim;
            if (L->bq) for (size_t i = 0; i < q_dim; i++) q[i] += L->bq[i];
            if (L->bk) for (size_t i = 0; i < kv_dim; i++) k[i] += L->bk[i];
            if (L->bv) for (size_t i = 0; i < kv_dim; i++) v[i] += L->bv[i];
            const float *cs = c->rope_cos + (size_t)r * half, *sn = c->rope_sin + (size_t)r * half;
            for (int h = 0; h < nh; h++) {
                if (L->q_norm) ks_rmsnorm(q + (size_t)h * hd, q + (size_t)h * hd, L->q_norm, hd, hp->rms_eps);
                ks_rope_apply(q + (size_t)h * hd, hp->n_rot, hp->rope_neox, cs, sn);
            }
            if (obs_slot && obs_slot[r] >= 0)
                memcpy(c->obs_q + ((size_t)il * c->obs_cap + obs_slot[r]) * q_dim, q, sizeof(float) * q_dim);
            for (int h = 0; h < nkv; h++) {
                if (L->k_norm) ks_rmsnorm(k + (size_t)h * hd, k + (size_t)h * hd, L->k_norm, hd, hp->rms_eps);
                ks_rope_apply(k + (size_t)h * hd, hp->n_rot, hp->rope_neox, cs, sn);
                KS_TRY(ks_kv_append(c->kv, seq[r], il, h, pos[r], k + (size_t)h * hd, v + (size_t)h * hd));
                c->n_att[(size_t)r * nkv + h] = ks_kv_n_entries(c->kv, seq[r], il, h);
                if (c->decoding) ks_policy_on_append(c->policy, seq[r], il, h, pos[r], k + (size_t)h * hd);
            }
        }
        if (!c->decoding && ks_kv_layer_tier(c->kv, il) == KS_TIER_SLOW) {
            /* prefill: every page of each sequence's heads, loaded once here
             * (rows of one sequence run in parallel and share the slots) */
            for (int r = 0; r < n; r++) {
                if (r > 0 && seq[r] == seq[r - 1]) continue;
                for (int h = 0; h < nkv; h++) {
                    int32_t np = ks_kv_n_pages(c->kv, seq[r], il, h);
                    if (np > ks_kv_slot_pages(c->kv)) continue; /* workers gather */
                    int32_t *lp = c->scr[0].pages;
                    for (int32_t i = 0; i < np; i++) lp[i] = i;
                    KS_TRY(ks_kv_fetch(c->kv, seq[r], il, h, lp, np, true));
                }
            }
            KS_TRY(ks_kv_wait_layer(c->kv, il));
        }
        attn_job job = {.c = c, .il = il, .n = n, .seq = seq, .pos = pos, .sparse = selects && il >= c->dense_layers};
        /* prefill chunks of one sequence take the blocked kernel (f16, or 8-bit KV in whole Q8_0 blocks) */
        job.blocked = !c->decoding && n > 1 && seq[0] == seq[n - 1] &&
                      (c->kv_type == KS_KV_F16 || hd % 32 == 0) &&
                      hd % 16 == 0 && ks_simd_current() >= KS_SIMD_AVX2;
        atomic_init(&job.next, 0);
        atomic_flag_clear(&c->step_failed);
        ks_pool_run(c->pool, attn_worker, &job);
        if (atomic_flag_test_and_set(&c->step_failed)) return c->step_status;
        atomic_flag_clear(&c->step_failed);
        matmul_w(c, &L->wo, c->att, n, c->xn);
        for (size_t i = 0; i < (size_t)n * D; i++) c->x[i] += c->xn[i];
        for (int r = 0; r < n; r++) ks_rmsnorm(c->xn + (size_t)r * D, c->x + (size_t)r * D, L->ffn_norm, D, hp->rms_eps);
        matmul_w(c, &L->w_gate, c->xn, n, c->gate);
        matmul_w(c, &L->w_up, c->xn, n, c->up);
        for (size_t i = 0; i < (size_t)n * hp->n_ff; i++) {
            float g = c->gate[i];
            c->gate[i] = g / (1.0f + expf(-g)) * c->up[i];
        }
        matmul_w(c, &L->w_down, c->gate, n, c->xn);
        for (size_t i = 0; i < (size_t)n * D; i++) c->x[i] += c->xn[i];
    }
    capture_hidden(c, hp->n_layer, n);
    for (int r = 0; c->n_aux && r < n; r++)
        ks_policy_on_hidden(c->policy, seq[r], pos[r], tok[r], c->aux_h + (size_t)r * c->n_aux * D);
    /* traffic and attention counters of this call */
    uint64_t attended = 0;
    for (int i = 0; i < c->params.n_threads; i++) {
        attended += c->scr[i].entries_attended;
        c->stats.select_seconds += c->scr[i].select_seconds;
        c->scr[i].entries_attended = 0;
        c->scr[i].select_seconds = 0;
    }
    c->stats.kv_bytes_read += 2 * attended * c->kv_row_bytes;
    if (c->decoding) {
        c->stats.kv_entries_attended += attended;
        for (int il = 0; il < hp->n_layer; il++)
            for (int r = 0; r < n; r++)
                for (int h = 0; h < nkv; h++) c->stats.kv_entries_total += (uint64_t)ks_kv_n_entries(c->kv, seq[r], il, h);
    }
    ks_kv_traffic tr;
    ks_kv_take_traffic(c->kv, &tr);
    c->stats.kv_bytes_loaded += tr.bytes_loaded;
    c->stats.kv_bytes_stored += tr.bytes_stored;
    c->stats.kv_pages_loaded += tr.pages_loaded;
    c->stats.kv_pages_hit += tr.pages_hit;
    c->stats.kv_wait_seconds += tr.wait_seconds;
    c->stats.kv_copy_seconds += tr.copy_seconds;
    if (!want || !logits_out) return KS_OK;
    int n_want = 0;
    for (int r = 0; r < n; r++)
        if (want[r]) ks_rmsnorm(c->xn + (size_t)(n_want++) * D, c->x + (size_t)r * D, m->output_norm, D, hp->rms_eps);
    if (n_want) matmul_w(c, &m->output, c->xn, n_want, logits_out);
    return KS_OK;
}

/* SpeContext's asynchronous prefetch: a global selection does not depend on
 * the layer, so right after before_step the pages of every slow-tier layer
 * are queued on the copy engine; layer l's loads then overlap the compute of
 * layers < l, and attend_one's fetch only waits for (and maps) what is left.
 * Pages already in a slot stay (elastic loading: only the set difference is
 * transferred). */
static ks_status prefetch_global(ks_context *c, int32_t n, const int32_t *seqs, const int32_t *pos) {
    const ks_hparams *hp = &c->model->hp;
    const ks_policy_params *pp = ks_policy_params_of(c->policy);
    ks_attn_scratch *s = &c->scr[0];
    int32_t P = c->params.page;
    for (int il = c->dense_layers; il < hp->n_layer; il++) {
        if (ks_kv_layer_tier(c->kv, il) != KS_TIER_SLOW) continue;
        for (int32_t r = 0; r < n; r++)
            for (int h = 0; h < hp->n_head_kv; h++) {
                int32_t ne = ks_kv_n_entries(c->kv, seqs[r], il, h), np = (ne + P - 1) / P, e1 = ne + 1;
                if (np == 0 || pp->budget <= 0 || pp->budget >= e1) continue; /* dense: attend_one loads */
                ks_select_req req = {.row = r, .seq = seqs[r], .layer = il, .head = h, .pos = pos[r], .n_entries = e1};
                req.sink = pp->sink < e1 ? pp->sink : e1;
                req.window = pp->window < e1 ? pp->window : e1;
                req.n_select = pp->budget - req.sink - req.window > 0 ? pp->budget - req.sink - req.window : 0;
                ks_selection sel = {.cap = c->n_ctx, .idx = s->sel, .next = s->next};
                double t0 = ks_time_sec();
                KS_TRY(ks_policy_select(c->policy, &req, &sel));
                c->stats.select_seconds += ks_time_sec() - t0;
                if (sel.all) continue;
                memset(s->mask, 0, sizeof(uint64_t) * ((size_t)np / 64 + 1));
                for (int32_t p = 0; p * P < req.sink && p < np; p++) s->mask[p >> 6] |= 1ull << (p & 63);
                for (int32_t p = (e1 - req.window) / P; p < np; p++) s->mask[p >> 6] |= 1ull << (p & 63);
                for (int32_t i = 0; i < sel.n; i++) {
                    int32_t p = sel.pages ? sel.idx[i] : sel.idx[i] / P;
                    if (p >= 0 && p < np) s->mask[p >> 6] |= 1ull << (p & 63);
                }
                int32_t m = 0;
                for (int32_t p = 0; p < np; p++)
                    if (s->mask[p >> 6] >> (p & 63) & 1) s->pages[m++] = p;
                if (m <= ks_kv_slot_pages(c->kv)) KS_TRY(ks_kv_fetch(c->kv, seqs[r], il, h, s->pages, m, true));
            }
    }
    return KS_OK;
}

static ks_status check_tokens(const ks_context *c, const int32_t *tokens, int32_t n) {
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->model->hp.n_vocab)
            return KS_FAIL(KS_ERR_INVALID_ARG, "token %d at index %d is outside the vocabulary [0, %d)", tokens[i], i,
                           c->model->hp.n_vocab);
    return KS_OK;
}

/* DapQ-style pseudo queries: run the policy's pseudo tokens at the positions
 * that follow the prompt, keep their queries in obs_q, then remove their KV
 * (and leave the sequence's position where the prompt ended). */
static ks_status prefill_pseudo(ks_context *c, int32_t seq, const int32_t *prompt, int32_t n, int32_t *n_obs) {
    const ks_hparams *hp = &c->model->hp;
    int32_t cap = c->max_rows < 1024 ? c->max_rows : 1024, room = c->n_ctx - c->seq_len[seq];
    if (room < cap) cap = room; /* pseudo tokens only ever use the room after the prompt */
    if (cap <= 0) return KS_OK;
    int32_t *pt = ks_malloc(sizeof(int32_t) * (size_t)cap);
    int32_t np = ks_policy_pseudo_tokens(c->policy, prompt, n, pt, cap);
    *n_obs = 0;
    if (np <= 0) {
        ks_free(pt);
        return KS_OK;
    }
    if (np > cap || c->seq_len[seq] + np > c->n_ctx) {
        ks_free(pt);
        return KS_FAIL(KS_ERR_CONTEXT_FULL, "%d pseudo tokens do not fit after the prompt (context %d)", np, c->n_ctx);
    }
    ks_status cst = check_tokens(c, pt, np);
    if (cst != KS_OK) {
        ks_free(pt);
        return cst;
    }
    int32_t *sq = ks_malloc(sizeof(int32_t) * (size_t)np), *ps = ks_malloc(sizeof(int32_t) * (size_t)np);
    int32_t *obs = ks_malloc(sizeof(int32_t) * (size_t)np);
    int32_t *before = ks_malloc(sizeof(int32_t) * (size_t)hp->n_layer * hp->n_head_kv);
    for (int32_t l = 0; l < hp->n_layer; l++)
        for (int32_t h = 0; h < hp->n_head_kv; h++) before[l * hp->n_head_kv + h] = ks_kv_n_entries(c->kv, seq, l, h);
    for (int32_t i = 0; i < np; i++) {
        sq[i] = seq;
        ps[i] = c->seq_len[seq] + i;
        obs[i] = i;
    }
    ks_free(c->obs_q);
    c->obs_cap = np;
    c->obs_q = ks_malloc(sizeof(float) * (size_t)hp->n_layer * np * hp->n_head * hp->head_dim);
    ks_status st = forward_rows(c, np, sq, ps, pt, NULL, NULL, obs);
    for (int32_t l = 0; l < hp->n_layer && st == KS_OK; l++)
        for (int32_t h = 0; h < hp->n_head_kv && st == KS_OK; h++)
            st = ks_kv_truncate(c->kv, seq, l, h, before[l * hp->n_head_kv + h]);
    if (st == KS_OK) *n_obs = np;
    ks_free(pt);
    ks_free(sq);
    ks_free(ps);
    ks_free(obs);
    ks_free(before);
    return st;
}

ks_status ks_prefill(ks_context *c, int32_t seq, const int32_t *tokens, int32_t n, float *logits,
                     float *all_logits) {
    if (!c || !tokens) return KS_FAIL(KS_ERR_INVALID_ARG, "NULL context or tokens");
    if (seq < 0 || seq >= c->n_seq) return KS_FAIL(KS_ERR_INVALID_ARG, "sequence %d out of range [0, %d)", seq, c->n_seq);
    if (n <= 0) return KS_FAIL(KS_ERR_INVALID_ARG, "empty prompt (%d tokens)", n);
    if ((int64_t)c->seq_len[seq] + n > c->n_ctx)
        return KS_FAIL(KS_ERR_CONTEXT_FULL, "%d tokens + %d already in sequence %d exceed the context of %d", n,
                       c->seq_len[seq], seq, c->n_ctx);
    KS_TRY(check_tokens(c, tokens, n));
    KS_TRY(plan_apply(c, (int64_t)c->seq_len[seq] + n));
    const ks_hparams *hp = &c->model->hp;
    double t0 = ks_time_sec();
    int chunk = c->params.n_batch;
    int32_t *sq = ks_malloc(sizeof(int32_t) * chunk), *ps = ks_malloc(sizeof(int32_t) * chunk);
    int32_t *obs = ks_malloc(sizeof(int32_t) * chunk);
    bool *want = ks_calloc((size_t)chunk, sizeof(bool));
    size_t V = (size_t)hp->n_vocab;
    int32_t first_pos = c->seq_len[seq];
    int32_t n_obs = c->obs_window < 0 ? n : (c->obs_window < n ? c->obs_window : n);
    ks_free(c->obs_q);
    c->obs_q = NULL;
    c->obs_cap = n_obs;
    if (n_obs > 0) c->obs_q = ks_malloc(sizeof(float) * (size_t)hp->n_layer * n_obs * hp->n_head * hp->head_dim);
    float *last = logits ? logits : (ks_policy_wants_entropy(c->policy) ? ks_malloc(sizeof(float) * V) : NULL);
    ks_status st = KS_OK;
    for (int32_t off = 0; off < n && st == KS_OK; off += chunk) {
        int m = n - off < chunk ? n - off : chunk;
        bool last_chunk = off + m == n;
        for (int i = 0; i < m; i++) {
            sq[i] = seq;
            ps[i] = c->seq_len[seq] + i;
            want[i] = all_logits != NULL || (last != NULL && last_chunk && i == m - 1);
            obs[i] = off + i >= n - n_obs ? off + i - (n - n_obs) : -1;
        }
        float *dst = all_logits ? all_logits + (size_t)off * V : last;
        st = forward_rows(c, m, sq, ps, tokens + off, want, dst, n_obs > 0 ? obs : NULL);
        if (st == KS_OK) c->seq_len[seq] += m;
    }
    if (st == KS_OK && all_logits && last) memcpy(last, all_logits + (size_t)(n - 1) * V, V * sizeof(float));
    bool pseudo = false;
    if (st == KS_OK) {
        int32_t n_pseudo = 0;
        st = prefill_pseudo(c, seq, tokens, n, &n_pseudo);
        if (n_pseudo > 0) {
            pseudo = true;
            n_obs = n_pseudo;
        }
    }
    if (st == KS_OK) {
        ks_prefill_info info = {.seq = seq, .n_prompt = n, .prompt = tokens, .n_obs = n_obs, .obs_q = c->obs_q,
                                .pseudo = pseudo, .first_pos = first_pos};
        st = ks_policy_on_prefill(c->policy, &info);
    }
    if (st == KS_OK && last && ks_policy_wants_entropy(c->policy))
        entropy_of(last, (int32_t)V, &c->entropy[seq], &c->varentropy[seq]);
    ks_free(c->obs_q);
    c->obs_q = NULL;
    c->obs_cap = 0;
    if (last != logits) ks_free(last);
    ks_free(sq);
    ks_free(ps);
    ks_free(obs);
    ks_free(want);
    if (st != KS_OK) {
        ks_seq_reset(c, seq); /* nothing half-appended survives */
        return st;
    }
    c->stats.tokens_prefilled += (uint64_t)n;
    c->stats.prefill_seconds += ks_time_sec() - t0;
    return KS_OK;
}

ks_status ks_decode(ks_context *c, const int32_t *seqs, const int32_t *tokens, int32_t n, float *logits) {
    if (!c || !seqs || !tokens) return KS_FAIL(KS_ERR_INVALID_ARG, "NULL argument");
    if (n <= 0 || n > c->max_rows) return KS_FAIL(KS_ERR_INVALID_ARG, "batch of %d sequences (1..%d allowed)", n, c->max_rows);
    for (int32_t i = 0; i < n; i++) {
        if (seqs[i] < 0 || seqs[i] >= c->n_seq)
            return KS_FAIL(KS_ERR_INVALID_ARG, "sequence %d out of range [0, %d)", seqs[i], c->n_seq);
        for (int32_t j = 0; j < i; j++)
            if (seqs[j] == seqs[i]) return KS_FAIL(KS_ERR_INVALID_ARG, "sequence %d appears twice in one step", seqs[i]);
        if (c->seq_len[seqs[i]] + 1 > c->n_ctx)
            return KS_FAIL(KS_ERR_CONTEXT_FULL, "sequence %d is full (%d tokens)", seqs[i], c->n_ctx);
    }
    KS_TRY(check_tokens(c, tokens, n));
    if (c->plan_thr) { /* Algorithm 2: the step will make the longest sequence one longer */
        int64_t S = 0;
        for (int32_t i = 0; i < n; i++) S = c->seq_len[seqs[i]] + 1 > S ? c->seq_len[seqs[i]] + 1 : S;
        KS_TRY(plan_apply(c, S));
    }
    double t0 = ks_time_sec();
    int32_t *ps = ks_malloc(sizeof(int32_t) * (size_t)n);
    bool *want = ks_malloc(sizeof(bool) * (size_t)n);
    for (int32_t i = 0; i < n; i++) {
        ps[i] = c->seq_len[seqs[i]];
        want[i] = true;
    }
    float *ent = ks_malloc(sizeof(float) * 2 * (size_t)n);
    for (int32_t i = 0; i < n; i++) {
        ent[i] = c->entropy[seqs[i]];
        ent[n + i] = c->varentropy[seqs[i]];
    }
    ks_step_info step = {.n = n, .seq = seqs, .token = tokens, .pos = ps, .entropy = ent, .varentropy = ent + n};
    double ts = ks_time_sec();
    ks_status st = ks_policy_before_step(c->policy, &step);
    /* before_step may use every worker: count thread time like the per-head selections */
    c->stats.select_seconds += (ks_time_sec() - ts) * c->params.n_threads;
    if (st == KS_OK && ks_policy_is_global(c->policy))
        st = prefetch_global(c, n, seqs, ps);
    if (st == KS_OK) {
        c->decoding = true;
        st = forward_rows(c, n, seqs, ps, tokens, logits ? want : NULL, logits, NULL);
        c->decoding = false;
    }
    if (st == KS_OK)
        for (int32_t i = 0; i < n; i++) {
            c->seq_len[seqs[i]]++;
            if (logits && ks_policy_wants_entropy(c->policy))
                entropy_of(logits + (size_t)i * c->model->hp.n_vocab, c->model->hp.n_vocab, &c->entropy[seqs[i]],
                           &c->varentropy[seqs[i]]);
        }
    ks_free(ent);
    ks_free(ps);
    ks_free(want);
    if (st != KS_OK) return st;
    c->stats.tokens_decoded += (uint64_t)n;
    c->stats.decode_seconds += ks_time_sec() - t0;
    return KS_OK;
}

typedef struct {
    ks_context *c;
    int32_t seq, n;
    const float *noise; /* [n_noise] */
    size_t n_noise;
    atomic_int failed;
} fill_job;

static void fill_worker(void *arg, int ith, int nth) {
    fill_job *j = arg;
    ks_context *c = j->c;
    const ks_hparams *hp = &c->model->hp;
    int hd = hp->head_dim;
    /* whole layers per worker: appends to one layer must stay serial */
    for (int il = ith; il < hp->n_layer; il += nth)
        for (int32_t p = 0; p < j->n; p++)
            for (int h = 0; h < hp->n_head_kv; h++) {
                size_t u = ((size_t)il * hp->n_head_kv + h) * 2;
                size_t ko = ((size_t)p * 7919 + u * 104729) % (j->n_noise - (size_t)hd);
                size_t vo = ((size_t)p * 7919 + (u + 1) * 104729) % (j->n_noise - (size_t)hd);
                if (ks_kv_append(c->kv, j->seq, il, h, p, j->noise + ko, j->noise + vo) != KS_OK) {
                    atomic_store(&j->failed, 1);
                    return;
                }
            }
}

ks_status ks_seq_fill_synthetic(ks_context *c, int32_t seq, int32_t n, uint64_t seed) {
    if (seq < 0 || seq >= c->n_seq) return KS_FAIL(KS_ERR_INVALID_ARG, "sequence %d out of range", seq);
    if (n < 0 || n > c->n_ctx) return KS_FAIL(KS_ERR_CONTEXT_FULL, "depth %d exceeds the context of %d", n, c->n_ctx);
    ks_seq_reset(c, seq);
    /* values are Gaussian noise: only the bytes matter for bandwidth benchmarks */
    size_t n_noise = 1 << 16;
    float *noise = ks_malloc(sizeof(float) * n_noise);
    ks_rng rng = {seed};
    for (size_t i = 0; i < n_noise; i++) noise[i] = ks_rng_normal(&rng);
    fill_job j = {.c = c, .seq = seq, .n = n, .noise = noise, .n_noise = n_noise};
    atomic_init(&j.failed, 0);
    ks_pool_run(c->pool, fill_worker, &j);
    ks_free(noise);
    if (atomic_load(&j.failed)) {
        ks_seq_reset(c, seq);
        return KS_FAIL(KS_ERR_IO, "could not fill the KV cache of sequence %d: %s", seq, ks_last_error());
    }
    c->seq_len[seq] = n;
    ks_policy_seq_fill_synthetic(c->policy, seq, n, seed);
    return KS_OK;
}
