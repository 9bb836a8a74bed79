/*
 * policy.c — the policy registry, composition, argument parsing, the group
 * reductions every selector shares (the top-k is in topk.c, Quest's page
 * bounds in page_bounds.c), and the scored prefill eviction of SnapKV and
 * DapQ (one loop: they differ only in which queries score and how the
 * budget is split).
 *
 * Composition: "a+b" runs a's prefill hooks (an evictor: SnapKV, DapQ) and
 * then b's, and b's decode hooks.  Both states live side by side; each sees
 * the same env and params.  The registry is a static table: adding a policy
 * is one file in src/select/ and one line here.  It is the only list of
 * policies: the CLI (--policy, `kvsieve policies`), the public selection API
 * (select_api.c), the tests and the docs test read it, with the data each
 * interface carries (summary, arg_names, needs_dlm, evicts, page_summaries).
 */
#define _GNU_SOURCE
#include "select/policy.h"
#include "core/simd.h"
#include "tensor/ops.h"
#include "tensor/simd_avx2.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern const ks_policy_i ks_policy_dense;
extern const ks_policy_i ks_policy_streaming;
extern const ks_policy_i ks_policy_h2o;
extern const ks_policy_i ks_policy_snapkv;
extern const ks_policy_i ks_policy_quest;
extern const ks_policy_i ks_policy_spec;
extern const ks_policy_i ks_policy_dapq;
extern const ks_policy_i ks_policy_freekv;
extern const ks_policy_i ks_policy_chess;
extern const ks_policy_i ks_policy_lrqk;

static const ks_policy_i *const registry[] = {
    &ks_policy_dense,
    &ks_policy_streaming,
    &ks_policy_h2o,
    &ks_policy_snapkv,
    &ks_policy_quest,
    &ks_policy_spec,
    &ks_policy_dapq,
    &ks_policy_freekv,
    &ks_policy_chess,
    &ks_policy_lrqk,
    NULL,
};

const ks_policy_i *const *ks_policy_list(void) { return registry; }

int32_t ks_policy_count(void) {
    int32_t n = 0;
    while (registry[n]) n++;
    return n;
}

bool ks_policy_accepts_arg(const char *spec, const char *key) {
    char buf[128];
    snprintf(buf, sizeof buf, "%s", spec);
    char *save = NULL;
    for (char *tok = strtok_r(buf, "+", &save); tok; tok = strtok_r(NULL, "+", &save)) {
        const ks_policy_i *vt = ks_policy_find(tok);
        for (int j = 0; vt && vt->arg_names && vt->arg_names[j]; j++)
            if (!strcmp(vt->arg_names[j], key)) return true;
    }
    return false;
}

const char *ks_policy_name_at(int32_t i, const char **summary) {
    KS_ASSERT(i >= 0 && i < ks_policy_count());
    if (summary) *summary = registry[i]->summary;
    return registry[i]->name;
}

const ks_policy_i *ks_policy_find(const char *name) {
    for (int i = 0; registry[i]; i++)
        if (strcmp(registry[i]->name, name) == 0) return registry[i];
    return NULL;
}

int32_t ks_policy_kv_page_size(const ks_policy_env *env) {
    return env->meta ? env->meta->page_size : ks_kv_page_size(env->kv);
}
int32_t ks_policy_kv_n_entries(const ks_policy_env *env, int32_t seq, int32_t layer, int32_t head) {
    return env->meta ? env->meta->n_entries(env->meta->ctx, seq, layer, head) : ks_kv_n_entries(env->kv, seq, layer, head);
}
int32_t ks_policy_kv_n_pages(const ks_policy_env *env, int32_t seq, int32_t layer, int32_t head) {
    if (!env->meta) return ks_kv_n_pages(env->kv, seq, layer, head);
    int32_t P = env->meta->page_size;
    return (env->meta->n_entries(env->meta->ctx, seq, layer, head) + P - 1) / P;
}
bool ks_policy_kv_pages_bounds8(const ks_policy_env *env, int32_t seq, int32_t layer, int32_t head, int32_t np,
                                const uint8_t **out) {
    if (env->meta) return false; /* caller summaries are f32 */
    ks_kv_pages_bounds8(env->kv, seq, layer, head, np, out);
    return true;
}
bool ks_policy_kv_pages_bounds16(const ks_policy_env *env, int32_t seq, int32_t layer, int32_t head, int32_t np,
                                 const uint16_t **out) {
    return !env->meta && ks_kv_pages_bounds16(env->kv, seq, layer, head, np, out); /* caller summaries are f32 */
}
void ks_policy_kv_page_meta(const ks_policy_env *env, int32_t seq, int32_t layer, int32_t head, int32_t lp,
                            ks_kv_page_meta *out) {
    if (env->meta) env->meta->page_meta(env->meta->ctx, seq, layer, head, lp, out);
    else ks_kv_page_meta_get(env->kv, seq, layer, head, lp, out);
}

ks_policy_params ks_policy_default_params(void) {
    return (ks_policy_params){.budget = 0, .sink = 4, .window = 64, .dense_layers = -1, .args = NULL};
}

enum { MAX_PARTS = 2 };

struct ks_policy {
    char name[128];
    ks_policy_params p;
    char *args;                        /* owned copy of p.args */
    int n;                             /* parts: 1, or 2 when composed */
    const ks_policy_i *vt[MAX_PARTS];  /* [n] */
    void *st[MAX_PARTS];               /* [n] */
};

void ks_policy_destroy(ks_policy *pol) {
    if (!pol) return;
    for (int i = 0; i < pol->n; i++)
        if (pol->st[i]) pol->vt[i]->destroy(pol->st[i]);
    ks_free(pol->args);
    ks_free(pol);
}

ks_status ks_policy_create(const char *spec, const ks_policy_env *env, const ks_policy_params *p, ks_policy **out) {
    if (!spec || !*spec) return KS_FAIL(KS_ERR_INVALID_ARG, "empty policy name");
    if (strlen(spec) >= sizeof((ks_policy *)0)->name) return KS_FAIL(KS_ERR_INVALID_ARG, "policy spec too long");
    ks_policy *pol = ks_calloc(1, sizeof *pol);
    if (!pol) return KS_FAIL(KS_ERR_NOMEM, "policy '%s'", spec);
    snprintf(pol->name, sizeof pol->name, "%s", spec);
    pol->p = *p;
    if (p->args && !(pol->args = ks_strdup(p->args))) {
        ks_policy_destroy(pol);
        return KS_FAIL(KS_ERR_NOMEM, "policy '%s' arguments", spec);
    }
    pol->p.args = pol->args;
    char buf[128];
    snprintf(buf, sizeof buf, "%s", spec);
    char *save = NULL;
    for (char *tok = strtok_r(buf, "+", &save); tok; tok = strtok_r(NULL, "+", &save)) {
        const ks_policy_i *vt = ks_policy_find(tok);
        if (!vt) {
            ks_policy_destroy(pol);
            char names[512] = "";
            for (int i = 0; registry[i]; i++) {
                strncat(names, i ? ", " : "", sizeof names - strlen(names) - 1);
                strncat(names, registry[i]->name, sizeof names - strlen(names) - 1);
            }
            return KS_FAIL(KS_ERR_NOT_FOUND, "unknown policy '%s' (known: %s)", tok, names);
        }
        if (pol->n == MAX_PARTS) {
            ks_policy_destroy(pol);
            return KS_FAIL(KS_ERR_INVALID_ARG, "policy '%s': at most an evictor and a selector can be composed", spec);
        }
        pol->vt[pol->n++] = vt;
    }
    if (pol->n == 0) {
        ks_policy_destroy(pol);
        return KS_FAIL(KS_ERR_INVALID_ARG, "empty policy name");
    }
    if (pol->n == 2 && !pol->vt[0]->on_prefill) {
        ks_policy_destroy(pol);
        return KS_FAIL(KS_ERR_INVALID_ARG, "policy '%s': the first of a composition must evict at prefill (e.g. snapkv)",
                       spec);
    }
    const char *known[64];
    int n_known = 0;
    for (int i = 0; i < pol->n; i++)
        for (int j = 0; pol->vt[i]->arg_names && pol->vt[i]->arg_names[j] && n_known < 63; j++)
            known[n_known++] = pol->vt[i]->arg_names[j];
    known[n_known] = NULL;
    ks_status ast = ks_args_check(pol->args, spec, known);
    if (ast != KS_OK) {
        ks_policy_destroy(pol);
        return ast;
    }
    if (p->sink < 0 || p->window < 0) {
        ks_policy_destroy(pol);
        return KS_FAIL(KS_ERR_INVALID_ARG, "sink and window must be >= 0");
    }
    for (int i = 0; i < pol->n; i++) {
        ks_status st = pol->vt[i]->create(env, &pol->p, &pol->st[i]);
        if (st != KS_OK) {
            ks_policy_destroy(pol);
            return st;
        }
    }
    *out = pol;
    return KS_OK;
}

static const ks_policy_i *decoder(const ks_policy *pol) { return pol->vt[pol->n - 1]; }
static void *decoder_state(const ks_policy *pol) { return pol->st[pol->n - 1]; }

const char *ks_policy_name(const ks_policy *pol) { return pol->name; }
const ks_policy_params *ks_policy_params_of(const ks_policy *pol) { return &pol->p; }
int32_t ks_policy_dense_layers(const ks_policy *pol) {
    return pol->p.dense_layers >= 0 ? pol->p.dense_layers : decoder(pol)->default_dense_layers;
}
int32_t ks_policy_obs_window(const ks_policy *pol) {
    int32_t w = 0;
    for (int i = 0; i < pol->n; i++) {
        if (pol->vt[i]->obs_window < 0) return -1;
        if (pol->vt[i]->obs_window > w) w = pol->vt[i]->obs_window;
    }
    return w;
}
bool ks_policy_wants_entropy(const ks_policy *pol) { return decoder(pol)->wants_entropy; }
int32_t ks_policy_pseudo_tokens(ks_policy *pol, const int32_t *prompt, int32_t n_prompt, int32_t *out, int32_t cap) {
    for (int i = 0; i < pol->n; i++)
        if (pol->vt[i]->pseudo_tokens) return pol->vt[i]->pseudo_tokens(pol->st[i], prompt, n_prompt, out, cap);
    return 0;
}
int32_t ks_policy_hidden_layers(ks_policy *pol, int32_t out[3]) {
    return decoder(pol)->hidden_layers ? decoder(pol)->hidden_layers(decoder_state(pol), out) : 0;
}
void ks_policy_on_hidden(ks_policy *pol, int32_t seq, int32_t pos, int32_t token, const float *h) {
    if (decoder(pol)->on_hidden) decoder(pol)->on_hidden(decoder_state(pol), seq, pos, token, h);
}
size_t ks_policy_weight_bytes(ks_policy *pol) {
    size_t b = 0;
    for (int i = 0; i < pol->n; i++)
        if (pol->vt[i]->weight_bytes) b += pol->vt[i]->weight_bytes(pol->st[i]);
    return b;
}
bool ks_policy_own_kcache(const ks_policy *pol) { return decoder(pol)->own_kcache; }
void ks_policy_seq_fill_synthetic(ks_policy *pol, int32_t seq, int32_t n, uint64_t seed) {
    for (int i = 0; i < pol->n; i++)
        if (pol->vt[i]->seq_fill_synthetic) pol->vt[i]->seq_fill_synthetic(pol->st[i], seq, n, seed);
}
void ks_policy_get_counters(const ks_policy *pol, ks_policy_counters *out) {
    memset(out, 0, sizeof *out);
    for (int i = 0; i < pol->n; i++)
        if (pol->vt[i]->counters) pol->vt[i]->counters(pol->st[i], out);
}
bool ks_policy_selects(const ks_policy *pol) { return decoder(pol)->select_layer != NULL; }
bool ks_policy_is_global(const ks_policy *pol) { return decoder(pol)->global; }
bool ks_policy_same_every_layer(const ks_policy *pol) { return decoder(pol)->same_every_layer; }
bool ks_policy_wants_weights(const ks_policy *pol) { return decoder(pol)->after_attention != NULL; }

bool ks_policy_prefix_shareable(const ks_policy *pol) {
    for (int i = 0; i < pol->n; i++)
        if (!pol->vt[i]->prefix_shareable || pol->vt[i]->obs_window < 0) return false;
    return true;
}
int32_t ks_policy_prefix_min_suffix(const ks_policy *pol) {
    int32_t w = ks_policy_obs_window(pol);
    return w > 1 ? w : 1;
}
size_t ks_policy_prefix_state_bytes(ks_policy *pol, int32_t n_tokens) {
    size_t b = 0;
    for (int i = 0; i < pol->n; i++)
        if (pol->vt[i]->prefix_state_bytes) b += pol->vt[i]->prefix_state_bytes(pol->st[i], n_tokens);
    return b;
}
ks_status ks_policy_prefix_state_save(ks_policy *pol, int32_t seq, int32_t first, int32_t n, uint8_t *out) {
    for (int i = 0; i < pol->n; i++)
        if (pol->vt[i]->prefix_state_bytes) {
            KS_TRY(pol->vt[i]->prefix_state_save(pol->st[i], seq, first, n, out));
            out += pol->vt[i]->prefix_state_bytes(pol->st[i], n);
        }
    return KS_OK;
}
ks_status ks_policy_prefix_state_load(ks_policy *pol, int32_t seq, int32_t first, int32_t n, const uint8_t *in) {
    for (int i = 0; i < pol->n; i++)
        if (pol->vt[i]->prefix_state_bytes) {
            KS_TRY(pol->vt[i]->prefix_state_load(pol->st[i], seq, first, n, in));
            in += pol->vt[i]->prefix_state_bytes(pol->st[i], n);
        }
    return KS_OK;
}
void ks_policy_seq_reset(ks_policy *pol, int32_t seq) {
    for (int i = 0; i < pol->n; i++)
        if (pol->vt[i]->seq_reset) pol->vt[i]->seq_reset(pol->st[i], seq);
}
ks_status ks_policy_on_prefill(ks_policy *pol, const ks_prefill_info *info) {
    for (int i = 0; i < pol->n; i++)
        if (pol->vt[i]->on_prefill) KS_TRY(pol->vt[i]->on_prefill(pol->st[i], info));
    return KS_OK;
}
ks_status ks_policy_on_prefill_split(ks_policy *pol, const ks_prefill_info *info, bool pseudo_part) {
    int part = -1; /* the part ks_policy_pseudo_tokens asks */
    for (int i = 0; i < pol->n && part < 0; i++)
        if (pol->vt[i]->pseudo_tokens) part = i;
    for (int i = 0; i < pol->n; i++)
        if ((i == part) == pseudo_part && pol->vt[i]->on_prefill) KS_TRY(pol->vt[i]->on_prefill(pol->st[i], info));
    return KS_OK;
}
ks_status ks_policy_before_step(ks_policy *pol, const ks_step_info *step) {
    return decoder(pol)->before_step ? decoder(pol)->before_step(decoder_state(pol), step) : KS_OK;
}
ks_status ks_policy_select(ks_policy *pol, const ks_select_req *req, ks_selection *out) {
    out->all = false;
    out->pages = false;
    out->n = 0;
    out->n_next = 0;
    if (!decoder(pol)->select_layer) {
        out->all = true;
        return KS_OK;
    }
    return decoder(pol)->select_layer(decoder_state(pol), req, out);
}
void ks_policy_after_attention(ks_policy *pol, const ks_select_req *req, const int32_t *entries, const float *w,
                               int32_t n) {
    if (decoder(pol)->after_attention) decoder(pol)->after_attention(decoder_state(pol), req, entries, w, n);
}
void ks_policy_on_append(ks_policy *pol, int32_t seq, int32_t layer, int32_t head, int32_t pos, const float *k) {
    for (int i = 0; i < pol->n; i++)
        if (pol->vt[i]->on_append) pol->vt[i]->on_append(pol->st[i], seq, layer, head, pos, k);
}

/* -------------------------------------------------------------- args -- */
/* Find key in "k=v,k=v"; value span into *v, *vn. */
static bool args_find(const char *args, const char *key, const char **v, size_t *vn) {
    if (!args) return false;
    size_t kl = strlen(key);
    const char *s = args;
    while (*s) {
        const char *end = strchr(s, ',');
        size_t n = end ? (size_t)(end - s) : strlen(s);
        const char *eq = memchr(s, '=', n);
        if (eq && (size_t)(eq - s) == kl && strncmp(s, key, kl) == 0) {
            *v = eq + 1;
            *vn = n - kl - 1;
            return true;
        }
        s += n;
        if (*s == ',') s++;
    }
    return false;
}

/* key's value as a NUL-terminated string in buf for a numeric parse; *found
 * false when the key is absent; `what` names the number in the error. */
static ks_status args_number(const char *args, const char *key, const char *what, char buf[64], bool *found) {
    const char *v;
    size_t vn;
    *found = args_find(args, key, &v, &vn);
    if (!*found) return KS_OK;
    if (vn == 0 || vn >= 64) return KS_FAIL(KS_ERR_INVALID_ARG, "policy argument %s needs %s", key, what);
    memcpy(buf, v, vn);
    buf[vn] = 0;
    return KS_OK;
}

ks_status ks_args_int(const char *args, const char *key, int64_t def, int64_t lo, int64_t hi, int64_t *out) {
    char buf[64];
    bool found;
    KS_TRY(args_number(args, key, "an integer", buf, &found));
    if (!found) {
        *out = def;
        return KS_OK;
    }
    char *end;
    errno = 0;
    long long x = strtoll(buf, &end, 10);
    if (*end || errno || x < lo || x > hi)
        return KS_FAIL(KS_ERR_INVALID_ARG, "policy argument %s=%s: expected an integer in [%lld, %lld]", key, buf,
                       (long long)lo, (long long)hi);
    *out = x;
    return KS_OK;
}

ks_status ks_args_float(const char *args, const char *key, double def, double lo, double hi, double *out) {
    char buf[64];
    bool found;
    KS_TRY(args_number(args, key, "a number", buf, &found));
    if (!found) {
        *out = def;
        return KS_OK;
    }
    char *end;
    errno = 0;
    double x = strtod(buf, &end);
    if (*end || errno || !(x >= lo && x <= hi))
        return KS_FAIL(KS_ERR_INVALID_ARG, "policy argument %s=%s: expected a number in [%g, %g]", key, buf, lo, hi);
    *out = x;
    return KS_OK;
}

ks_status ks_args_str(const char *args, const char *key, const char *def, char *out, size_t cap) {
    const char *v;
    size_t vn;
    if (!args_find(args, key, &v, &vn)) {
        snprintf(out, cap, "%s", def ? def : "");
        return KS_OK;
    }
    if (vn >= cap) return KS_FAIL(KS_ERR_INVALID_ARG, "policy argument %s is too long", key);
    memcpy(out, v, vn);
    out[vn] = 0;
    return KS_OK;
}

ks_status ks_args_check(const char *args, const char *policy, const char *const *known) {
    if (!args) return KS_OK;
    const char *s = args;
    while (*s) {
        const char *end = strchr(s, ',');
        size_t n = end ? (size_t)(end - s) : strlen(s);
        const char *eq = memchr(s, '=', n);
        if (!eq) return KS_FAIL(KS_ERR_INVALID_ARG, "policy argument '%.*s' is not key=value", (int)n, s);
        size_t kl = (size_t)(eq - s);
        bool ok = false;
        for (int i = 0; known && known[i]; i++)
            if (strlen(known[i]) == kl && strncmp(known[i], s, kl) == 0) ok = true;
        if (!ok) return KS_FAIL(KS_ERR_INVALID_ARG, "policy %s has no argument '%.*s'", policy, (int)kl, s);
        s += n;
        if (*s == ',') s++;
    }
    return KS_OK;
}

/* ----------------------------------------------------------- helpers -- */
/* (top-k: topk.c; Quest's page bounds: page_bounds.c) */

#if defined(__x86_64__)
KS_AVX2_TGT static float softmax_exp_avx2(float *x, int32_t n) { return ks_avx2_softmax_exp(x, n); }
#endif

/* x[0..n) = e^(x - max x) in place; returns their sum.  FreeKV's group
 * reduction runs it G times per selection over every competing page, so the
 * AVX2 polynomial (relative error ~2e-7) replaces libm's expf there. */
static float softmax_exp(float *x, int32_t n) {
#if defined(__x86_64__)
    if (ks_simd_current() >= KS_SIMD_AVX2) return softmax_exp_avx2(x, n);
#endif
    float mx = -INFINITY;
    for (int32_t i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    double sum = 0;
    for (int32_t i = 0; i < n; i++) sum += x[i] = expf(x[i] - mx);
    return (float)sum;
}

ks_status ks_policy_prefill_probs(const ks_policy_env *e, const ks_prefill_info *info, int32_t row0, int32_t nq,
                                  int32_t l, int32_t h, float *q, float *acc) {
    int32_t G = e->n_head / e->n_head_kv, hd = e->head_dim;
    const float *lq = info->obs_q + ((size_t)l * info->n_obs + row0) * e->n_head * hd; /* [nq][n_head * hd] */
    for (int32_t r = 0; r < nq; r++) /* row r's heads of group h */
        memcpy(q + (size_t)r * G * hd, lq + ((size_t)r * e->n_head + (size_t)h * G) * hd, sizeof(float) * G * hd);
    if (info->n_pseudo <= 0) return e->attn_probs(e->svc, info->seq, l, h, q, nq, NULL, acc);
    /* pseudo row i (of the n_pseudo) sees the prompt entries and the pseudo keys up to its own */
    int32_t base = ks_policy_kv_n_entries(e, info->seq, l, h) - info->n_pseudo;
    int32_t *n_keys = ks_malloc(sizeof(int32_t) * (size_t)(nq > 0 ? nq : 1));
    if (!n_keys) return KS_FAIL(KS_ERR_NOMEM, "key counts of %d rows", nq);
    for (int32_t r = 0; r < nq; r++) n_keys[r] = base + row0 + r + 1;
    ks_status st = e->attn_probs(e->svc, info->seq, l, h, q, nq, n_keys, acc);
    ks_free(n_keys);
    return st;
}

ks_status ks_policy_evict_scored(const ks_policy_env *e, const ks_prefill_info *info, int32_t row0, int32_t nq,
                                 int32_t budget, int32_t pool, ks_evict_span_fn span, const void *ctx) {
    int32_t G = e->n_head / e->n_head_kv, hd = e->head_dim, half = pool / 2;
    float *q = ks_malloc(sizeof(float) * (size_t)nq * G * hd); /* [nq][G][hd] */
    float *acc = ks_malloc(sizeof(float) * (size_t)e->n_ctx);    /* [n] */
    float *pooled = ks_malloc(sizeof(float) * (size_t)e->n_ctx); /* [n], read in [lo, hi) */
    int32_t *idx = ks_malloc(sizeof(int32_t) * (size_t)e->n_ctx);
    uint8_t *keep = ks_malloc((size_t)e->n_ctx); /* [n] */
    ks_status st = !q || !acc || !pooled || !idx || !keep ? KS_FAIL(KS_ERR_NOMEM, "eviction scores of %d entries", e->n_ctx)
                                                          : KS_OK;
    for (int32_t l = 0; l < e->n_layer && st == KS_OK; l++) {
        for (int32_t h = 0; h < e->n_head_kv && st == KS_OK; h++) {
            /* the prompt's entries; the pseudo tokens' (the last n_pseudo) are only scored over */
            int32_t n_all = ks_policy_kv_n_entries(e, info->seq, l, h), n = n_all - info->n_pseudo;
            if (n <= budget) continue;
            memset(acc, 0, sizeof(float) * (size_t)n_all);
            st = ks_policy_prefill_probs(e, info, row0, nq, l, h, q, acc);
            if (st != KS_OK) break;
            ks_evict_span sp;
            span(ctx, n, nq, &sp);
            KS_ASSERT(0 <= sp.pool_lo && sp.pool_lo <= sp.lo && sp.lo <= sp.hi && sp.hi <= n);
            for (int32_t i = sp.lo; i < sp.hi; i++) { /* average pool, clipped at [pool_lo, hi) */
                int32_t a = i - half < sp.pool_lo ? sp.pool_lo : i - half;
                int32_t b = i + half + 1 > sp.hi ? sp.hi : i + half + 1;
                float sum = 0;
                for (int32_t j = a; j < b; j++) sum += acc[j];
                pooled[i] = sum / (float)(b - a);
            }
            memset(keep, 0, (size_t)n_all);
            for (int32_t i = 0; i < sp.lo; i++) keep[i] = 1;
            for (int32_t i = sp.hi; i < n_all; i++) keep[i] = 1; /* the pseudo entries: the engine removes them */
            int32_t got = ks_topk_range(pooled, sp.lo, sp.hi, sp.want, idx, NULL);
            for (int32_t i = 0; i < got; i++) keep[idx[i]] = 1;
            st = e->evict(e->svc, info->seq, l, h, keep);
        }
    }
    ks_free(q);
    ks_free(acc);
    ks_free(pooled);
    ks_free(idx);
    ks_free(keep);
    return st;
}

ks_status ks_group_reduce_scores(const float *scores, int32_t G, int32_t n, ks_group_reduce how, float *out) {
    if (how == KS_GROUP_SOFTMAX_MEAN) { /* softmax per head, averaged: out = sum_g e_g / (G sum e_g) */
        if (n <= 0) return KS_OK;
        float *p = ks_scratch(KS_SCRATCH_MATH1, sizeof(float) * (size_t)n);
        if (!p) return KS_FAIL(KS_ERR_NOMEM, "softmax of %d scores", n);
        for (int32_t g = 0; g < G; g++) {
            memcpy(p, scores + (size_t)g * n, sizeof(float) * (size_t)n);
            float w = 1.0f / (softmax_exp(p, n) * (float)G);
            if (g == 0)
                for (int32_t i = 0; i < n; i++) out[i] = p[i] * w;
            else
                for (int32_t i = 0; i < n; i++) out[i] += p[i] * w;
        }
        return KS_OK;
    }
    for (int32_t i = 0; i < n; i++) {
        float acc = how == KS_GROUP_MAX ? -INFINITY : 0;
        for (int32_t g = 0; g < G; g++) {
            float v = scores[(size_t)g * n + i];
            if (how == KS_GROUP_MAX) acc = v > acc ? v : acc;
            else acc += v / G;
        }
        out[i] = acc;
    }
    return KS_OK;
}

ks_status ks_group_reduce_parse(const char *s, ks_group_reduce *out) {
    if (strcmp(s, "max") == 0) *out = KS_GROUP_MAX;
    else if (strcmp(s, "mean") == 0) *out = KS_GROUP_MEAN;
    else if (strcmp(s, "softmax") == 0) *out = KS_GROUP_SOFTMAX_MEAN;
    else return KS_FAIL(KS_ERR_INVALID_ARG, "group reduction '%s': expected max, mean or softmax", s);
    return KS_OK;
}
