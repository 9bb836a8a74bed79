/*
 * policy.c — the policy registry, composition, argument parsing and the
 * small numeric helpers every selector shares (top-k, page bounds, group
 * reductions), and the scored prefill eviction of SnapKV and DapQ (one loop:
 * they differ only in which queries score and how the budget is split).
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
#include "tensor/dtype.h"
#include "tensor/ops.h"
#include "tensor/simd_avx2.h"
#include "tensor/simd_avx512.h"

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
    snprintf(pol->name, sizeof pol->name, "%s", spec);
    pol->p = *p;
    if (p->args) pol->args = ks_strdup(p->args);
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
/* Heap-free partial selection: a min-heap of the best k (value, index). */
static bool better(float a, int32_t ia, float b, int32_t ib) { return a > b || (a == b && ia < ib); }

/* x as an unsigned key whose order is the float order (NaN as -inf, -0 as
 * +0, so equal keys are exactly the ties of the float comparison). */
static inline uint32_t topk_key(float x) {
    x = x != x ? -INFINITY : x + 0.0f;
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    return b ^ (b >> 31 ? 0xFFFFFFFFu : 0x80000000u);
}

/* The k-th largest key of x[0..n) (1-based k) and how many entries equal
 * to it the top k take (*ties), by a radix select: a histogram of the top w
 * bits over all of x, the keys of the bucket the k-th falls in gathered into
 * tmp, then w more bits at a time over those.  Two branch-light passes over
 * x where a quickselect partitions random data with a mispredicted branch
 * per element (the top-k of SpeContext's 32K-token selections, per KV head). */
static uint32_t kth_largest_key(const float *x, int32_t n, int32_t k, uint32_t *tmp, int32_t *ties) {
    /* digits as wide as the entries can fill: a level costs a pass over its
     * candidates plus clearing and walking 2^w buckets, which at a few
     * hundred entries would outweigh the pass with 11-bit digits */
    const int w = n <= 512 ? 6 : n <= 8192 ? 8 : 11;
    uint32_t hist[2048];
    int shift = 32 - w;
    uint32_t mask = (1u << w) - 1u;
    memset(hist, 0, sizeof(uint32_t) << w);
    for (int32_t i = 0; i < n; i++) hist[topk_key(x[i]) >> shift]++;
    int32_t need = k, b = (int32_t)mask;
    while ((int32_t)hist[b] < need) need -= (int32_t)hist[b--];
    int32_t c = 0;
    for (int32_t i = 0; i < n; i++) {
        uint32_t u = topk_key(x[i]);
        tmp[c] = u;
        c += (int32_t)(u >> shift) == b;
    }
    uint32_t prefix = (uint32_t)b << shift;
    while (shift > 0) { /* the candidates share the bits above shift */
        int bits = shift < w ? shift : w;
        shift -= bits;
        mask = (1u << bits) - 1u;
        memset(hist, 0, sizeof(uint32_t) << bits);
        for (int32_t i = 0; i < c; i++) hist[tmp[i] >> shift & mask]++;
        b = (int32_t)mask;
        while ((int32_t)hist[b] < need) need -= (int32_t)hist[b--];
        prefix |= (uint32_t)b << shift;
        int32_t m = 0;
        for (int32_t i = 0; i < c; i++) {
            tmp[m] = tmp[i];
            m += (int32_t)(tmp[i] >> shift & mask) == b;
        }
        c = m;
    }
    *ties = need; /* the k-th and the equal keys above it in index order */
    return prefix;
}

/* The radix select's final pass: every index of x[0..n) whose key is above
 * the k-th largest and, among the keys equal to it, the first `ties`, in
 * index order (pos[i] is x[i]'s index in the caller's array). */
static int32_t topk_emit(const float *x, const int32_t *pos, int32_t n, uint32_t th, int32_t ties, int32_t *idx) {
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        uint32_t u = topk_key(x[i]);
        if (u >= th && (u > th || ties-- > 0)) idx[m++] = pos ? pos[i] : i;
    }
    return m;
}

#if defined(__x86_64__)
/* topk_sampled's filter, 16 entries a step: the keys (NaN as -inf, -0 as
 * +0, topk_key's order) compared with t, the passing values and their
 * indices compress-stored in index order.  Returns the candidates found in
 * x[0..*done) (*done: the multiple of 16 it stopped at), or -1 past cap. */
__attribute__((target("avx512f"))) static int32_t topk_filter_avx512(const float *x, int32_t n, uint32_t t,
                                                                       float *cand, int32_t *pos, int32_t cap,
                                                                       int32_t *done) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY), zero = _mm512_setzero_ps();
    const __m512i top = _mm512_set1_epi32((int32_t)0x80000000), tv = _mm512_set1_epi32((int32_t)t);
    const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    int32_t c = 0, i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        __m512 f = _mm512_add_ps(_mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), v, ninf), zero);
        __m512i b = _mm512_castps_si512(f);
        __m512i key = _mm512_xor_si512(b, _mm512_or_si512(_mm512_srai_epi32(b, 31), top));
        __mmask16 keep = _mm512_cmp_epu32_mask(key, tv, _MM_CMPINT_NLT);
        if (!keep) continue;
        int32_t nk = __builtin_popcount(keep);
        if (c + nk > cap) {
            *done = n;
            return -1;
        }
        _mm512_mask_compressstoreu_ps(cand + c, keep, v);
        _mm512_mask_compressstoreu_epi32(pos + c, keep, _mm512_add_epi32(lanes, _mm512_set1_epi32(i)));
        c += nk;
    }
    *done = i;
    return c;
}
#endif

/* k far below n (k <= n / 8: Quest's pages, SpeContext's tokens): a
 * threshold read off every 8th entry, meant to lie a little below the k-th
 * largest key, keeps the entries at or above it, in index order, with their
 * values.  When at least k are kept, every key down to the k-th largest is
 * among them, so the radix select over these candidates alone gives exactly
 * the set (and order) it gives over all of x.  Returns -1, having written
 * nothing to idx, when the threshold kept fewer than k or more than n / 4
 * (few distinct values): the caller then selects over all of x. */
static int32_t topk_sampled(const float *x, int32_t n, int32_t k, int32_t *idx, float *scratch) {
    int32_t m = n / 8, want = k / 8 + 4 + k / 16; /* the sample's want-th largest: about 8 x want keys above it */
    if (want > m) return -1;
    float *sample = scratch;                            /* [m] */
    uint32_t *sample_tmp = (uint32_t *)(void *)(scratch + m); /* [m] */
    float *cand = scratch + 2 * m;                      /* [n / 4] */
    int32_t *cand_pos = (int32_t *)(void *)(cand + n / 4);       /* [n / 4] */
    uint32_t *cand_tmp = (uint32_t *)(void *)(cand_pos + n / 4); /* [n / 4] */
    for (int32_t i = 0; i < m; i++) sample[i] = x[8 * i];
    int32_t ties, c = 0, cap = n / 4;
    uint32_t t = kth_largest_key(sample, m, want, sample_tmp, &ties);
    int32_t i = 0;
#if defined(__x86_64__)
    if (ks_simd_current() >= KS_SIMD_AVX512) c = topk_filter_avx512(x, n, t, cand, cand_pos, cap, &i);
#endif
    for (; i < n && c >= 0; i++) {
        if (topk_key(x[i]) < t) continue;
        if (c == cap) c = -1;
        else cand[c] = x[i], cand_pos[c++] = i;
    }
    if (c < k) return -1;
    uint32_t th = kth_largest_key(cand, c, k, cand_tmp, &ties);
    return topk_emit(cand, cand_pos, c, th, ties, idx);
}

int32_t ks_topk(const float *x, int32_t n, int32_t k, int32_t *idx) { return ks_topk_scratch(x, n, k, idx, NULL); }

int32_t ks_topk_scratch(const float *x, int32_t n, int32_t k, int32_t *idx, float *tmp) {
    if (k <= 0 || n <= 0) return 0;
    if (k >= n) {
        for (int32_t i = 0; i < n; i++) idx[i] = i;
        return n;
    }
    if (n >= 256) {
        /* a few hundred entries and more (pages of long contexts, token
         * budgets): the k-th largest by a radix select, then every index
         * above it and, among ties, the lowest ones — the same set the heap
         * below returns, in index order, in O(n); with topk_sampled 6x
         * faster than the heap at 62 of 1024 (Quest's pages at 32K) */
        float *scr = tmp ? tmp : ks_malloc(sizeof(float) * (size_t)n);
        int32_t m = k <= n / 8 ? topk_sampled(x, n, k, idx, scr) : -1;
        if (m < 0) {
            int32_t ties;
            uint32_t th = kth_largest_key(x, n, k, (uint32_t *)(void *)scr, &ties);
            m = topk_emit(x, NULL, n, th, ties, idx);
        }
        if (scr != tmp) ks_free(scr);
        KS_ASSERT(m == k);
        return k;
    }
    /* idx[0..k) is a min-heap under `better` (root = worst kept) */
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        float v = x[i] != x[i] ? -INFINITY : x[i];
        if (m < k) {
            int32_t c = m++;
            idx[c] = i;
            while (c > 0) {
                int32_t p = (c - 1) / 2;
                float vp = x[idx[p]] != x[idx[p]] ? -INFINITY : x[idx[p]];
                float vc = x[idx[c]] != x[idx[c]] ? -INFINITY : x[idx[c]];
                if (!better(vp, idx[p], vc, idx[c])) break;
                int32_t t = idx[p];
                idx[p] = idx[c];
                idx[c] = t;
                c = p;
            }
            continue;
        }
        float vr = x[idx[0]] != x[idx[0]] ? -INFINITY : x[idx[0]];
        if (!better(v, i, vr, idx[0])) continue;
        idx[0] = i;
        int32_t c = 0;
        for (;;) {
            int32_t l = 2 * c + 1, r = l + 1, w = c;
            float vw = x[idx[w]] != x[idx[w]] ? -INFINITY : x[idx[w]];
            if (l < k) {
                float vl = x[idx[l]] != x[idx[l]] ? -INFINITY : x[idx[l]];
                if (better(vw, idx[w], vl, idx[l])) w = l, vw = vl;
            }
            if (r < k) {
                float vr2 = x[idx[r]] != x[idx[r]] ? -INFINITY : x[idx[r]];
                if (better(vw, idx[w], vr2, idx[r])) w = r;
            }
            if (w == c) break;
            int32_t t = idx[w];
            idx[w] = idx[c];
            idx[c] = t;
            c = w;
        }
    }
    return k;
}

#if defined(__x86_64__)
/* Eight lanes of max(q*min, q*max), summed at the end: the scalar loop's add
 * chain made Quest's page scoring ~12% of a 16K decode step on AVX2 hosts. */
KS_AVX2_TGT static float page_upper_bound_avx2(const float *q, const float *kmin, const float *kmax, int32_t hd) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int32_t i = 0;
    for (; i + 16 <= hd; i += 16) {
        __m256 q0 = _mm256_loadu_ps(q + i), q1 = _mm256_loadu_ps(q + i + 8);
        acc0 = _mm256_add_ps(acc0, _mm256_max_ps(_mm256_mul_ps(q0, _mm256_loadu_ps(kmin + i)),
                                                 _mm256_mul_ps(q0, _mm256_loadu_ps(kmax + i))));
        acc1 = _mm256_add_ps(acc1, _mm256_max_ps(_mm256_mul_ps(q1, _mm256_loadu_ps(kmin + i + 8)),
                                                 _mm256_mul_ps(q1, _mm256_loadu_ps(kmax + i + 8))));
    }
    __m256 acc = _mm256_add_ps(acc0, acc1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    float s = _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
    for (; i < hd; i++) {
        float a = q[i] * kmin[i], b = q[i] * kmax[i];
        s += a > b ? a : b;
    }
    return s;
}

/* The AVX2 kernel's arithmetic in 16 lanes: lanes 0-7 of acc are its acc0
 * and lanes 8-15 its acc1, summed in the same order, so each bound is bit
 * for bit page_upper_bound_avx2's; the min and max chunks are loaded once
 * for up to 8 heads.  F16: kmin, kmax are f16 (exact conversions of the f32
 * summaries, so the same values and the same bounds). */
#define PAGE_BOUNDS_AVX512(NAME, KT, LOAD, SCALAR)                                                                \
    __attribute__((target("avx512f,avx512dq,avx512vl,f16c"))) static void NAME(                                  \
        const float *q, int32_t G, const KT *kmin, const KT *kmax, int32_t hd, float *out, size_t stride) {     \
        for (int32_t g0 = 0; g0 < G; g0 += 8) {                                                                   \
            int32_t ng = G - g0 < 8 ? G - g0 : 8;                                                                 \
            __m512 acc[8];                                                                                        \
            for (int32_t g = 0; g < 8; g++) acc[g] = _mm512_setzero_ps();                                         \
            int32_t i = 0;                                                                                        \
            for (; i + 16 <= hd; i += 16) {                                                                       \
                __m512 lo = LOAD(kmin + i), hi = LOAD(kmax + i);                                                  \
                for (int32_t g = 0; g < ng; g++) {                                                                \
                    __m512 qv = _mm512_loadu_ps(q + (size_t)(g0 + g) * hd + i);                                   \
                    acc[g] = _mm512_add_ps(acc[g], _mm512_max_ps(_mm512_mul_ps(qv, lo), _mm512_mul_ps(qv, hi)));  \
                }                                                                                                 \
            }                                                                                                     \
            for (int32_t g = 0; g < ng; g++) {                                                                    \
                const float *qg = q + (size_t)(g0 + g) * hd;                                                      \
                __m256 a = _mm256_add_ps(_mm512_castps512_ps256(acc[g]), _mm512_extractf32x8_ps(acc[g], 1));      \
                __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));                    \
                h = _mm_add_ps(h, _mm_movehl_ps(h, h));                                                           \
                float s = _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));                                       \
                for (int32_t t = i; t < hd; t++) {                                                                \
                    float x = qg[t] * SCALAR(kmin[t]), y = qg[t] * SCALAR(kmax[t]);                               \
                    s += x > y ? x : y;                                                                           \
                }                                                                                                 \
                out[(size_t)(g0 + g) * stride] = s;                                                               \
            }                                                                                                     \
        }                                                                                                         \
    }
#define LOAD_F32(p) _mm512_loadu_ps(p)
#define LOAD_F16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(p)))
#define SCALAR_F32(x) (x)
#define SCALAR_F16(x) ks_f16_to_f32(x)
PAGE_BOUNDS_AVX512(page_upper_bounds_avx512, float, LOAD_F32, SCALAR_F32)
PAGE_BOUNDS_AVX512(page_upper_bounds16_avx512, uint16_t, LOAD_F16, SCALAR_F16)

/* ks_page_upper_bounds16_pages, AVX-512, hd a multiple of 16: for each
 * group of up to four heads, q+ and q- once; then per four pages and 16
 * channels, the pages' lo and hi converted once and two FMAs per (page,
 * head) into sixteen accumulators, reduced together at the end. */
__attribute__((target("avx512f,avx512dq,avx512vl,f16c"))) static void page_bounds16_pages_avx512(
    const float *q, int32_t G, const uint16_t *const *kb, int32_t np, int32_t hd, float *out, float *red_max) {
    float qp[4][512] __attribute__((aligned(64))), qn[4][512] __attribute__((aligned(64)));
    for (int32_t g0 = 0; g0 < G; g0 += 4) {
        int32_t ng = G - g0 < 4 ? G - g0 : 4;
        for (int32_t g = 0; g < 4; g++)
            for (int32_t i = 0; i < hd; i++) {
                float x = g < ng ? q[(size_t)(g0 + g) * hd + i] : 0.0f;
                qp[g][i] = x > 0 ? x : 0.0f;
                qn[g][i] = x < 0 ? x : 0.0f;
            }
        for (int32_t p = 0; p < np; p += 4) {
            int32_t nr = np - p < 4 ? np - p : 4;
            const uint16_t *b[4];
            for (int32_t r = 0; r < 4; r++) b[r] = kb[p + (r < nr ? r : 0)]; /* a short group repeats a page */
            if (g0 == 0 && p + 12 <= np) /* the pages two groups ahead: their ids need not be adjacent */
                for (int32_t r = 8; r < 12; r++)
                    for (int32_t o = 0; o < 4 * hd; o += 64) _mm_prefetch((const char *)kb[p + r] + o, _MM_HINT_T0);
            __m512 acc[16];
            _Pragma("GCC unroll 16") for (int a = 0; a < 16; a++) acc[a] = _mm512_setzero_ps();
            for (int32_t i = 0; i < hd; i += 16) {
                __m512 lo[4], hi[4];
                _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++) {
                    lo[r] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(b[r] + i)));
                    hi[r] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(b[r] + hd + i)));
                }
                _Pragma("GCC unroll 4") for (int g = 0; g < 4; g++) {
                    __m512 pp = _mm512_load_ps(&qp[g][i]), pn = _mm512_load_ps(&qn[g][i]);
                    _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++)
                        acc[4 * r + g] = _mm512_fmadd_ps(pp, hi[r], _mm512_fmadd_ps(pn, lo[r], acc[4 * r + g]));
                }
            }
            float s[16];
            _mm512_storeu_ps(s, ks_avx512_reduce16(acc)); /* lane 4 * page + head */
            for (int32_t r = 0; r < nr; r++) {
                float mx = s[4 * r];
                for (int32_t g = 0; g < ng; g++) {
                    if (out) out[(size_t)(g0 + g) * np + p + r] = s[4 * r + g];
                    mx = s[4 * r + g] > mx ? s[4 * r + g] : mx;
                }
                if (red_max) red_max[p + r] = g0 == 0 || mx > red_max[p + r] ? mx : red_max[p + r];
            }
        }
    }
}

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

int32_t ks_topk_range(const float *x, int32_t lo, int32_t hi, int32_t k, int32_t *idx, float *tmp) {
    int32_t got = ks_topk_scratch(x + lo, hi - lo, k, idx, tmp);
    for (int32_t i = 0; i < got; i++) idx[i] += lo;
    return got;
}

void ks_selection_topk(ks_selection *out, const float *x, int32_t lo, int32_t hi, int32_t k, float *tmp) {
    out->n = ks_topk_range(x, lo, hi, k < out->cap ? k : out->cap, out->idx, tmp);
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
    ks_status st = KS_OK;
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

void ks_page_upper_bounds(const float *q, int32_t G, const float *kmin, const float *kmax, int32_t hd, float *out,
                          size_t stride) {
#if defined(__x86_64__)
    if (hd >= 16 && ks_simd_current() >= KS_SIMD_AVX512) {
        page_upper_bounds_avx512(q, G, kmin, kmax, hd, out, stride);
        return;
    }
#endif
    for (int32_t g = 0; g < G; g++) out[(size_t)g * stride] = ks_page_upper_bound(q + (size_t)g * hd, kmin, kmax, hd);
}

void ks_page_upper_bounds16(const float *q, int32_t G, const uint16_t *kbound16, int32_t hd, float *out, size_t stride) {
#if defined(__x86_64__)
    if (hd >= 16 && ks_simd_current() >= KS_SIMD_AVX512) {
        page_upper_bounds16_avx512(q, G, kbound16, kbound16 + hd, hd, out, stride);
        return;
    }
#endif
    float b[2 * 512]; /* the f32 values, then the f32 path (the store's head dims are at most 512) */
    KS_ASSERT(hd <= 512);
    for (int32_t i = 0; i < 2 * hd; i++) b[i] = ks_f16_to_f32(kbound16[i]);
    ks_page_upper_bounds(q, G, b, b + hd, hd, out, stride);
}

void ks_page_upper_bounds16_pages(const float *q, int32_t G, const uint16_t *const *kb, int32_t np, int32_t hd,
                                  float *out, float *red_max) {
#if defined(__x86_64__)
    if (hd % 16 == 0 && hd <= 512 && ks_simd_current() >= KS_SIMD_AVX512) {
        page_bounds16_pages_avx512(q, G, kb, np, hd, out, red_max);
        return;
    }
#endif
    float one[64];
    for (int32_t p = 0; p < np; p++)
        for (int32_t g0 = 0; g0 < G; g0 += 64) { /* the heads in chunks of 64 */
            int32_t ng = G - g0 < 64 ? G - g0 : 64;
            ks_page_upper_bounds16(q + (size_t)g0 * hd, ng, kb[p], hd, one, 1);
            for (int32_t g = 0; g < ng; g++) {
                if (out) out[(size_t)(g0 + g) * np + p] = one[g];
                if (red_max) red_max[p] = (g0 == 0 && g == 0) || one[g] > red_max[p] ? one[g] : red_max[p];
            }
        }
}

float ks_page_upper_bound(const float *q, const float *kmin, const float *kmax, int32_t hd) {
#if defined(__x86_64__)
    if (hd >= 16 && ks_simd_current() >= KS_SIMD_AVX2) return page_upper_bound_avx2(q, kmin, kmax, hd);
#endif
    float s = 0;
    for (int32_t i = 0; i < hd; i++) {
        float a = q[i] * kmin[i], b = q[i] * kmax[i];
        s += a > b ? a : b;
    }
    return s;
}

void ks_group_reduce_scores(const float *scores, int32_t G, int32_t n, ks_group_reduce how, float *out) {
    if (how == KS_GROUP_SOFTMAX_MEAN) { /* softmax per head, averaged: out = sum_g e_g / (G sum e_g) */
        if (n <= 0) return;
        float *p = ks_malloc(sizeof(float) * (size_t)n);
        for (int32_t g = 0; g < G; g++) {
            memcpy(p, scores + (size_t)g * n, sizeof(float) * (size_t)n);
            float w = 1.0f / (softmax_exp(p, n) * (float)G);
            if (g == 0)
                for (int32_t i = 0; i < n; i++) out[i] = p[i] * w;
            else
                for (int32_t i = 0; i < n; i++) out[i] += p[i] * w;
        }
        ks_free(p);
        return;
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
}

ks_status ks_group_reduce_parse(const char *s, ks_group_reduce *out) {
    if (strcmp(s, "max") == 0) *out = KS_GROUP_MAX;
    else if (strcmp(s, "mean") == 0) *out = KS_GROUP_MEAN;
    else if (strcmp(s, "softmax") == 0) *out = KS_GROUP_SOFTMAX_MEAN;
    else return KS_FAIL(KS_ERR_INVALID_ARG, "group reduction '%s': expected max, mean or softmax", s);
    return KS_OK;
}
