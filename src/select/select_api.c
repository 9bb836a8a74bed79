/*
 * select_api.c — the public selection API (include/kvsieve_select.h): the
 * registry's policies over a KV cache the caller owns.
 *
 * A thin adapter.  The policies are the ones the engine runs, created
 * through ks_policy_create with an env whose KV is not a ks_kv_store but
 * the caller's views: `meta` (ks_kv_meta_src, policy.h) answers entry
 * counts and page metadata from them, `read_keys` and `attn_probs` read their
 * keys.  What the engine's framework does around a policy (src/infer: the
 * budget arithmetic, sinks and window, page -> entry expansion, on_append of
 * new tokens) is done here the same way, so a full budget is exactly dense
 * and a selection is the one `kvsieve run --policy NAME` would make over
 * the same keys.
 *
 * Summaries.  Policies that read page summaries (quest, freekv, chess) get
 * the caller's when the views carry them, else the selector's own: per
 * (layer, KV head) kmin / kmax / ksum of every page, full pages computed once
 * (entries are append-only), the last partial page recomputed per call.
 * They are refreshed before the policy runs (select: its head; begin_step
 * and prefill: every head), so the meta callbacks only read.
 *
 * Appends.  The engine calls on_append for every token a decode step
 * appends.  Here each (layer, head) remembers how many entries the policy has
 * seen; entries beyond are reported (key converted to f32) before the policy
 * is asked.  Entries present at a head's first sight (prefill, begin_step)
 * are the prompt; at a first select all but the newest.
 *
 * Not served: policies with needs_dlm or evicts in the registry (spec;
 * snapkv, dapq) and compositions; see the header.
 */
#define _GNU_SOURCE
#include "kvsieve_select.h"

#include "select/select_mask.h"
#include "tensor/dtype.h"
#include "tensor/ops.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    float *kmin, *kmax, *ksum; /* [max_pages][hd] each, one allocation; NULL until needed */
    int32_t n_full;            /* full pages summarised */
    int32_t n;                 /* entries at the last refresh */
} sum_cache;

typedef struct {
    bool init;
    int32_t seen; /* entries the policy has been told of (prompt + appends) */
} head_state;

struct kvs_selector {
    kvs_selector_params p;
    const ks_policy_i *vt;
    ks_policy *pol;
    ks_kv_meta_src meta;
    int32_t G, nkv, max_pages, dense_layers;
    const kvs_head_kv *cur;    /* the views of the current call (borrowed) */
    sum_cache *sums;           /* [n_layer][n_head_kv] */
    head_state *heads;         /* [n_layer][n_head_kv] */
    int32_t *iota;             /* [n_ctx] positions when a view has none */
    float *qbuf;               /* [G][head_dim] */
    float *kbuf;               /* [head_dim] */
    int32_t *sel_idx;            /* [n_ctx] the policy's answer */
    uint64_t *mask;            /* [n_ctx / 64 + 1] */
    bool stepping;             /* begin_step called since create / reset */
    int32_t step_pos;
};

/* ------------------------------------------------------------ status -- */
/* propagate an internal failure as the API's status */
#define KVS_TRY(x)                                                                                                     \
    do {                                                                                                               \
        ks_status st_ = (x);                                                                                           \
        if (st_ != KS_OK) return status_of(st_);                                                                       \
    } while (0)

static kvs_status status_of(ks_status st) {
    switch (st) {
    case KS_OK: return KVS_OK;
    case KS_ERR_NOT_FOUND: return KVS_ERR_NOT_FOUND;
    case KS_ERR_UNSUPPORTED: return KVS_ERR_UNSUPPORTED;
    case KS_ERR_NOMEM: return KVS_ERR_NOMEM;
    default: return KVS_ERR_INVALID_ARG;
    }
}

const char *kvs_status_str(kvs_status st) {
    switch (st) {
    case KVS_OK: return "ok";
    case KVS_ERR_INVALID_ARG: return "invalid argument";
    case KVS_ERR_NOT_FOUND: return "not found";
    case KVS_ERR_UNSUPPORTED: return "unsupported";
    case KVS_ERR_NOMEM: return "out of memory";
    case KVS_ERR_BUFFER_TOO_SMALL: return "buffer too small";
    }
    return "unknown status";
}

const char *kvs_last_error(void) { return ks_last_error(); }

/* ---------------------------------------------------------- registry -- */
static bool served(const ks_policy_i *vt) { return !ks_policy_i_needs_dlm(vt) && !ks_policy_i_evicts(vt); }

int32_t kvs_policy_count(void) { return ks_policy_count(); }

kvs_status kvs_policy_get(int32_t i, kvs_policy_info *out) {
    if (i < 0 || i >= ks_policy_count() || !out)
        return status_of(KS_FAIL(KS_ERR_INVALID_ARG, "policy index %d outside [0, %d)", i, ks_policy_count()));
    static const char *const none[] = {NULL};
    const ks_policy_i *vt = ks_policy_list()[i];
    *out = (kvs_policy_info){.name = vt->name,
                             .summary = vt->summary,
                             .args = vt->arg_names ? vt->arg_names : none,
                             .dense_layers = vt->select ? vt->select->default_dense_layers : 0,
                             .obs_window = ks_policy_i_obs_window(vt),
                             .api = served(vt),
                             .needs_dlm = ks_policy_i_needs_dlm(vt),
                             .evicts = ks_policy_i_evicts(vt),
                             .page_summaries = vt->page_summaries,
                             .wants_feedback = vt->select && vt->select->after_attention};
    return KVS_OK;
}

/* ------------------------------------------------------------- views -- */
static size_t row_bytes(const kvs_view *v, int32_t hd) {
    if (v->row_stride) return v->row_stride;
    return (size_t)hd * (v->type == KVS_TYPE_F32 ? 4 : 2);
}

static void row_f32(const kvs_view *v, int32_t i, int32_t hd, float *out) {
    const void *src = (const char *)v->data + (size_t)i * row_bytes(v, hd);
    ks_dtype t = v->type == KVS_TYPE_F32 ? KS_DTYPE_F32 : v->type == KVS_TYPE_F16 ? KS_DTYPE_F16 : KS_DTYPE_BF16;
    ks_dequantize_row(t, src, out, hd);
}

static ks_status check_view(const kvs_view *v, int32_t n, const char *what) {
    if (n > 0 && !v->data) return KS_FAIL(KS_ERR_INVALID_ARG, "%s: NULL data", what);
    if (v->type != KVS_TYPE_F32 && v->type != KVS_TYPE_F16 && v->type != KVS_TYPE_BF16)
        return KS_FAIL(KS_ERR_INVALID_ARG, "%s: type %d is not f32, f16 or bf16", what, (int)v->type);
    return KS_OK;
}

static ks_status check_kv(const kvs_selector *s, const kvs_head_kv *kv) {
    if (!kv) return KS_FAIL(KS_ERR_INVALID_ARG, "NULL kv views");
    for (int32_t i = 0; i < s->p.n_layer * s->nkv; i++) {
        const kvs_head_kv *h = &kv[i];
        char what[64];
        snprintf(what, sizeof what, "keys of layer %d head %d", i / s->nkv, i % s->nkv);
        if (h->n_entries < 0 || h->n_entries > s->p.n_ctx)
            return KS_FAIL(KS_ERR_INVALID_ARG, "%s: %d entries outside [0, n_ctx = %d]", what, h->n_entries, s->p.n_ctx);
        KS_TRY(check_view(&h->keys, h->n_entries, what));
        int have = !!h->page_kmin + !!h->page_kmax + !!h->page_ksum;
        if (have != 0 && have != 3)
            return KS_FAIL(KS_ERR_INVALID_ARG, "%s: page summaries are kmin, kmax and ksum together, or none", what);
        if (s->heads[i].init && h->n_entries < s->heads[i].seen)
            return KS_FAIL(KS_ERR_INVALID_ARG, "%s: %d entries, %d before: entries are append-only (reset first)", what,
                           h->n_entries, s->heads[i].seen);
    }
    return KS_OK;
}

static int32_t pos_of(const kvs_selector *s, const kvs_head_kv *h, int32_t e) {
    return h->pos ? h->pos[e] : s->iota[e];
}

/* ---------------------------------------------------- env services -- */
static int32_t meta_n_entries(void *ctx, int32_t seq, int32_t layer, int32_t head) {
    const kvs_selector *s = ctx;
    (void)seq;
    KS_ASSERT(s->cur);
    return s->cur[(size_t)layer * s->nkv + head].n_entries;
}

static void meta_page(void *ctx, int32_t seq, int32_t layer, int32_t head, int32_t lp, ks_kv_page_meta *out) {
    const kvs_selector *s = ctx;
    (void)seq;
    KS_ASSERT(s->cur);
    size_t i = (size_t)layer * s->nkv + head;
    const kvs_head_kv *h = &s->cur[i];
    int32_t P = s->p.page_size, hd = s->p.head_dim, first = lp * P;
    KS_ASSERT(lp >= 0 && first < h->n_entries);
    out->fill = h->n_entries - first < P ? h->n_entries - first : P;
    out->pos = h->pos ? h->pos + first : s->iota + first;
    out->kbound16 = NULL; /* caller-given summaries are f32 only */
    out->kbound8 = NULL;
    if (h->page_kmin) {
        out->kmin = h->page_kmin + (size_t)lp * hd;
        out->kmax = h->page_kmax + (size_t)lp * hd;
        out->ksum = h->page_ksum + (size_t)lp * hd;
    } else {
        const sum_cache *c = &s->sums[i];
        KS_ASSERT(c->kmin && c->n == h->n_entries); /* refreshed before the policy ran */
        out->kmin = c->kmin + (size_t)lp * hd;
        out->kmax = c->kmax + (size_t)lp * hd;
        out->ksum = c->ksum + (size_t)lp * hd;
    }
}

static ks_status svc_read_keys(void *svc, int32_t seq, int32_t layer, int32_t head, int32_t first, int32_t n,
                               float *out) {
    const kvs_selector *s = svc;
    (void)seq;
    const kvs_head_kv *h = &s->cur[(size_t)layer * s->nkv + head];
    if (first < 0 || n < 0 || first + n > h->n_entries)
        return KS_FAIL(KS_ERR_INVALID_ARG, "keys [%d, %d) of layer %d head %d: the view holds %d", first, first + n,
                       layer, head, h->n_entries);
    for (int32_t i = 0; i < n; i++) row_f32(&h->keys, first + i, s->p.head_dim, out + (size_t)i * s->p.head_dim);
    return KS_OK;
}

/* acc[e] += sum over rows and group heads of softmax(q k^T / sqrt(d))[e] (policy.h, attn_probs) */
static ks_status svc_attn_probs(void *svc, int32_t seq, int32_t layer, int32_t head, const float *q, int32_t nq,
                                const int32_t *n_keys, float *acc) {
    const kvs_selector *s = svc;
    (void)seq;
    const kvs_head_kv *h = &s->cur[(size_t)layer * s->nkv + head];
    int32_t n = h->n_entries, hd = s->p.head_dim;
    if (n == 0) return KS_OK;
    float *keys = malloc(sizeof(float) * ((size_t)n * hd + n));
    if (!keys) return KS_FAIL(KS_ERR_NOMEM, "attention scores over %d keys", n);
    float *sc = keys + (size_t)n * hd, scale = 1.0f / sqrtf((float)hd);
    for (int32_t e = 0; e < n; e++) row_f32(&h->keys, e, hd, keys + (size_t)e * hd);
    for (int32_t r = 0; r < nq * s->G; r++) {
        const float *qr = q + (size_t)r * hd;
        int32_t m = n_keys && n_keys[r / s->G] < n ? n_keys[r / s->G] : n; /* the row's keys in scope */
        if (m <= 0) continue;
        for (int32_t e = 0; e < m; e++) {
            float d = 0;
            for (int32_t i = 0; i < hd; i++) d += qr[i] * keys[(size_t)e * hd + i];
            sc[e] = d * scale;
        }
        ks_softmax(sc, m);
        for (int32_t e = 0; e < m; e++) acc[e] += sc[e];
    }
    free(keys);
    return KS_OK;
}

/* ------------------------------------------------------ bookkeeping -- */
static ks_status refresh_sums(kvs_selector *s, size_t i) {
    const kvs_head_kv *h = &s->cur[i];
    if (!s->vt->page_summaries || h->page_kmin) return KS_OK;
    sum_cache *c = &s->sums[i];
    int32_t hd = s->p.head_dim, P = s->p.page_size, n = h->n_entries;
    if (!c->kmin) {
        c->kmin = malloc(sizeof(float) * 3 * (size_t)s->max_pages * hd);
        if (!c->kmin) return KS_FAIL(KS_ERR_NOMEM, "page summaries of %d pages", s->max_pages);
        c->kmax = c->kmin + (size_t)s->max_pages * hd;
        c->ksum = c->kmax + (size_t)s->max_pages * hd;
        c->n_full = 0;
    }
    if (n < c->n) c->n_full = 0; /* after a reset */
    for (int32_t lp = c->n_full; lp * P < n; lp++) {
        float *mn = c->kmin + (size_t)lp * hd, *mx = c->kmax + (size_t)lp * hd, *sm = c->ksum + (size_t)lp * hd;
        int32_t end = (lp + 1) * P < n ? (lp + 1) * P : n;
        for (int32_t e = lp * P; e < end; e++) {
            row_f32(&h->keys, e, hd, s->kbuf);
            for (int32_t d = 0; d < hd; d++) {
                float x = s->kbuf[d];
                if (e == lp * P) mn[d] = mx[d] = sm[d] = x;
                else {
                    mn[d] = x < mn[d] ? x : mn[d];
                    mx[d] = x > mx[d] ? x : mx[d];
                    sm[d] += x;
                }
            }
        }
    }
    c->n_full = n / P;
    c->n = n;
    return KS_OK;
}

/* Report entries [seen, n) of head i to the policy (engine: on_append at decode). */
static void sync_appends(kvs_selector *s, size_t i, bool first_is_prompt_but_last) {
    const kvs_head_kv *h = &s->cur[i];
    head_state *t = &s->heads[i];
    if (!t->init) {
        t->init = true;
        t->seen = first_is_prompt_but_last && h->n_entries > 0 ? h->n_entries - 1 : h->n_entries;
    }
    int32_t layer = (int32_t)(i / s->nkv), head = (int32_t)(i % s->nkv);
    for (; t->seen < h->n_entries; t->seen++) {
        row_f32(&h->keys, t->seen, s->p.head_dim, s->kbuf);
        ks_policy_on_append(s->pol, 0, layer, head, pos_of(s, h, t->seen), s->kbuf);
    }
}

/* ---------------------------------------------------------- selector -- */
kvs_selector_params kvs_selector_default_params(void) {
    ks_policy_spec d = ks_policy_spec_default();
    return (kvs_selector_params){.page_size = 32, .budget = d.budget, .sink = d.sink, .window = d.window,
                                 .dense_layers = d.dense_layers};
}

void kvs_selector_destroy(kvs_selector *s) {
    if (!s) return;
    ks_policy_destroy(s->pol);
    if (s->sums)
        for (int32_t i = 0; i < s->p.n_layer * s->nkv; i++) free(s->sums[i].kmin);
    free(s->sums);
    free(s->heads);
    free(s->iota);
    free(s->qbuf);
    free(s->kbuf);
    free(s->sel_idx);
    free(s->mask);
    free(s);
}

kvs_status kvs_selector_create(const char *name, const kvs_selector_params *params, kvs_selector **out) {
    if (!name || !params || !out) return status_of(KS_FAIL(KS_ERR_INVALID_ARG, "NULL name, params or out"));
    /* the one parser of policy strings checks the name and the arguments */
    ks_policy_spec spec;
    KVS_TRY(ks_policy_spec_parse(name, params->args, params->budget > 0 ? params->budget : 0, params->sink,
                                 params->window, params->dense_layers, &spec));
    /* a refining stage after the selector ("quest+topp") runs here too; an evictor does not */
    if (spec.n_parts - ks_policy_i_refines(ks_policy_spec_part(&spec, spec.n_parts - 1)) > 1)
        return status_of(KS_FAIL(KS_ERR_UNSUPPORTED, "policy '%s': compositions start with a prefill evictor, which "
                                 "a caller-owned KV cache does not support", name));
    const ks_policy_i *vt = ks_policy_spec_part(&spec, 0);
    if (ks_policy_i_needs_dlm(vt))
        return status_of(KS_FAIL(KS_ERR_UNSUPPORTED, "policy '%s' needs a draft model's retrieval head and the "
                                 "target's hidden states, which this API does not take", name));
    if (ks_policy_i_evicts(vt))
        return status_of(KS_FAIL(KS_ERR_UNSUPPORTED, "policy '%s' evicts entries at prefill; a caller-owned KV cache "
                                 "cannot be compacted through this API", name));
    const kvs_selector_params *p = params;
    if (p->n_layer <= 0 || p->n_head <= 0 || p->n_head_kv <= 0 || p->n_head % p->n_head_kv || p->head_dim <= 0 ||
        p->n_ctx <= 0 || p->page_size <= 0)
        return status_of(KS_FAIL(KS_ERR_INVALID_ARG, "shapes: %d layers, %d heads, %d KV heads, head dim %d, n_ctx %d, "
                                 "page %d (all > 0, heads a multiple of KV heads)", p->n_layer, p->n_head,
                                 p->n_head_kv, p->head_dim, p->n_ctx, p->page_size));
    if (p->sink < 0 || p->window < 0)
        return status_of(KS_FAIL(KS_ERR_INVALID_ARG, "sink and window must be >= 0"));
    kvs_selector *s = calloc(1, sizeof *s);
    if (!s) return status_of(KS_FAIL(KS_ERR_NOMEM, "selector"));
    s->p = *p;
    s->vt = vt;
    s->G = p->n_head / p->n_head_kv;
    s->nkv = p->n_head_kv;
    s->max_pages = (p->n_ctx + p->page_size - 1) / p->page_size;
    size_t nh = (size_t)p->n_layer * p->n_head_kv;
    s->sums = calloc(nh, sizeof *s->sums);
    s->heads = calloc(nh, sizeof *s->heads);
    s->iota = malloc(sizeof(int32_t) * (size_t)p->n_ctx);
    s->qbuf = malloc(sizeof(float) * (size_t)s->G * p->head_dim);
    s->kbuf = malloc(sizeof(float) * (size_t)p->head_dim);
    s->sel_idx = malloc(sizeof(int32_t) * (size_t)p->n_ctx);
    s->mask = calloc((size_t)p->n_ctx / 64 + 1, sizeof(uint64_t));
    if (!s->sums || !s->heads || !s->iota || !s->qbuf || !s->kbuf || !s->sel_idx || !s->mask) {
        kvs_selector_destroy(s);
        return status_of(KS_FAIL(KS_ERR_NOMEM, "selector buffers for n_ctx %d", p->n_ctx));
    }
    s->p.args = NULL; /* the policy keeps its parsed spec */
    for (int32_t i = 0; i < p->n_ctx; i++) s->iota[i] = i;
    s->meta = (ks_kv_meta_src){.ctx = s, .page_size = p->page_size, .n_entries = meta_n_entries,
                               .page_meta = meta_page};
    ks_policy_env env = {.n_layer = p->n_layer, .n_head = p->n_head, .n_head_kv = p->n_head_kv,
                         .head_dim = p->head_dim, .n_seq = 1, .n_ctx = p->n_ctx, .svc = s,
                         .attn_probs = svc_attn_probs, .read_keys = svc_read_keys, .meta = &s->meta};
    ks_status st = ks_policy_create(&spec, &env, &s->pol);
    if (st != KS_OK) {
        kvs_selector_destroy(s);
        return status_of(st);
    }
    s->dense_layers = ks_policy_dense_layers(s->pol);
    *out = s;
    return KVS_OK;
}

void kvs_selector_reset(kvs_selector *s) {
    ks_policy_seq_reset(s->pol, 0);
    for (int32_t i = 0; i < s->p.n_layer * s->nkv; i++) {
        s->heads[i] = (head_state){0};
        s->sums[i].n_full = s->sums[i].n = 0;
    }
    s->stepping = false;
}

int32_t kvs_selector_obs_window(const kvs_selector *s) { return ks_policy_obs_window(s->pol); }
bool kvs_selector_wants_feedback(const kvs_selector *s) { return ks_policy_wants_weights(s->pol); }

kvs_status kvs_selector_prefill(kvs_selector *s, const kvs_head_kv *kv, const float *obs_q, int32_t n_obs) {
    if (!s || n_obs < 0 || (n_obs > 0 && !obs_q))
        return status_of(KS_FAIL(KS_ERR_INVALID_ARG, "prefill: NULL selector or queries, or n_obs %d < 0", n_obs));
    KVS_TRY((check_kv(s, kv)));
    s->cur = kv;
    size_t nh = (size_t)s->p.n_layer * s->nkv;
    for (size_t i = 0; i < nh; i++) {
        s->heads[i] = (head_state){.init = true, .seen = kv[i].n_entries}; /* the prompt */
        ks_status st = refresh_sums(s, i);
        if (st != KS_OK) {
            s->cur = NULL;
            return status_of(st);
        }
    }
    int32_t w = ks_policy_obs_window(s->pol), use = w < 0 || w > n_obs ? n_obs : w;
    size_t row = (size_t)s->p.n_head * s->p.head_dim;
    float *q = NULL;
    if (use < n_obs) { /* the last `use` rows of each layer */
        q = malloc(sizeof(float) * (size_t)s->p.n_layer * use * row + 1);
        if (!q) {
            s->cur = NULL;
            return status_of(KS_FAIL(KS_ERR_NOMEM, "prefill queries"));
        }
        for (int32_t l = 0; l < s->p.n_layer; l++)
            memcpy(q + (size_t)l * use * row, obs_q + ((size_t)l * n_obs + (n_obs - use)) * row,
                   sizeof(float) * use * row);
    }
    ks_prefill_info info = {.seq = 0, .n_prompt = kv[0].n_entries, .n_obs = use, .obs_q = q ? q : obs_q,
                            .first_pos = kv[0].n_entries > 0 ? pos_of(s, &kv[0], 0) : 0};
    ks_status st = ks_policy_on_prefill(s->pol, &info);
    free(q);
    s->cur = NULL;
    return status_of(st);
}

kvs_status kvs_selector_begin_step(kvs_selector *s, const kvs_head_kv *kv, const kvs_step *step) {
    if (!s || !step) return status_of(KS_FAIL(KS_ERR_INVALID_ARG, "begin_step: NULL selector or step"));
    if (step->pos < 0) return status_of(KS_FAIL(KS_ERR_INVALID_ARG, "begin_step: position %d", step->pos));
    KVS_TRY((check_kv(s, kv)));
    s->cur = kv;
    ks_status st = KS_OK;
    for (size_t i = 0; i < (size_t)s->p.n_layer * s->nkv && st == KS_OK; i++) {
        sync_appends(s, i, false);
        st = refresh_sums(s, i);
    }
    if (st == KS_OK) {
        int32_t seq = 0, tok = 0, pos = step->pos;
        float ent[2] = {step->entropy, step->varentropy};
        ks_step_info info = {.n = 1, .seq = &seq, .token = &tok, .pos = &pos, .entropy = ent, .varentropy = ent + 1};
        st = ks_policy_before_step(s->pol, &info);
    }
    s->cur = NULL;
    if (st != KS_OK) return status_of(st);
    s->stepping = true;
    s->step_pos = step->pos;
    return KVS_OK;
}

kvs_status kvs_selector_select(kvs_selector *s, const kvs_head_kv *kv, int32_t layer, int32_t head,
                               const kvs_view *q, kvs_selection *out) {
    if (!s || !kv || !q || !out) return status_of(KS_FAIL(KS_ERR_INVALID_ARG, "select: NULL argument"));
    if (!s->stepping) return status_of(KS_FAIL(KS_ERR_INVALID_ARG, "select before kvs_selector_begin_step"));
    if (layer < 0 || layer >= s->p.n_layer || head < 0 || head >= s->nkv)
        return status_of(KS_FAIL(KS_ERR_INVALID_ARG, "select: layer %d head %d outside %d x %d", layer, head,
                                 s->p.n_layer, s->nkv));
    size_t i = (size_t)layer * s->nkv + head;
    const kvs_head_kv *h = &kv[i];
    int32_t n = h->n_entries, hd = s->p.head_dim;
    if (n <= 0 || n > s->p.n_ctx)
        return status_of(KS_FAIL(KS_ERR_INVALID_ARG, "select: layer %d head %d holds %d entries (1..n_ctx = %d)", layer,
                                 head, n, s->p.n_ctx));
    if (out->cap < n) {
        KS_FAIL(KS_ERR_INVALID_ARG, "select: a buffer of %d for %d entries", out->cap, n);
        out->n = n;
        return KVS_ERR_BUFFER_TOO_SMALL;
    }
    KVS_TRY((check_view(&h->keys, n, "keys")));
    KVS_TRY((check_view(q, s->G, "queries")));
    int have = !!h->page_kmin + !!h->page_kmax + !!h->page_ksum;
    if (have != 0 && have != 3)
        return status_of(KS_FAIL(KS_ERR_INVALID_ARG, "select: page summaries are kmin, kmax and ksum together, or none"));
    if (s->heads[i].init && n < s->heads[i].seen)
        return status_of(KS_FAIL(KS_ERR_INVALID_ARG, "select: %d entries, %d before: entries are append-only", n,
                                 s->heads[i].seen));
    s->cur = kv;
    sync_appends(s, i, true);
    bool all = true;
    /* as the engine (src/infer, attend_one): only a sparse layer whose budget
     * leaves something out asks the policy */
    if (layer >= s->dense_layers && ks_policy_budget_binds(s->pol, n)) {
        ks_status st = refresh_sums(s, i);
        if (st != KS_OK) {
            s->cur = NULL;
            return status_of(st);
        }
        for (int32_t g = 0; g < s->G; g++) row_f32(q, g, hd, s->qbuf + (size_t)g * hd);
        ks_select_req req = {.row = 0, .seq = 0, .layer = layer, .head = head, .pos = s->step_pos, .n_entries = n,
                             .q = s->qbuf};
        ks_selection sel = {.cap = s->p.n_ctx, .idx = s->sel_idx}; /* no recall to start: no hint */
        st = ks_policy_select_mask(s->pol, &req, &sel, s->p.page_size, s->mask);
        s->cur = NULL;
        if (st != KS_OK) return status_of(st);
        all = sel.all;
    }
    s->cur = NULL;
    int32_t m = 0;
    for (int32_t e = 0; e < n; e++)
        if (all || (s->mask[e >> 6] >> (e & 63) & 1)) out->idx[m++] = e;
    out->n = m;
    out->all = m == n;
    return KVS_OK;
}

kvs_status kvs_selector_feedback(kvs_selector *s, int32_t layer, int32_t head, const int32_t *idx,
                                 const float *weight, int32_t n) {
    if (!s || n < 0 || (n > 0 && (!idx || !weight)))
        return status_of(KS_FAIL(KS_ERR_INVALID_ARG, "feedback: NULL argument or n %d < 0", n));
    if (layer < 0 || layer >= s->p.n_layer || head < 0 || head >= s->nkv)
        return status_of(KS_FAIL(KS_ERR_INVALID_ARG, "feedback: layer %d head %d outside %d x %d", layer, head,
                                 s->p.n_layer, s->nkv));
    const head_state *t = &s->heads[(size_t)layer * s->nkv + head];
    for (int32_t k = 0; k < n; k++)
        if (idx[k] < 0 || idx[k] >= t->seen)
            return status_of(KS_FAIL(KS_ERR_INVALID_ARG, "feedback: entry %d outside the %d selected from", idx[k],
                                     t->seen));
    /* the engine reports weights of sparse layers only */
    if (layer < s->dense_layers || !ks_policy_wants_weights(s->pol)) return KVS_OK;
    ks_select_req req = {.seq = 0, .layer = layer, .head = head, .pos = s->step_pos, .n_entries = t->seen};
    ks_policy_after_attention(s->pol, &req, idx, weight, n);
    return KVS_OK;
}
