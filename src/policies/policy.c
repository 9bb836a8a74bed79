/*
 * policy.c — a running policy: one interface, or an evictor composed with
 * a selector, behind the calls the engine makes (registry.h).  What the
 * policies share sits in policy/ below them: the env's metadata accessors
 * (policy_env.c), the group reductions (policy_util.c), the top-k (topk.c),
 * Quest's page bounds (page_bounds.c), the prefill eviction (prefill.c); the
 * registry and the parser are in registry.c.
 *
 * Composition: "a+b" runs a's prefill hooks (an evictor: SnapKV, DapQ) and
 * then b's, and b's decode hooks.  Both states live side by side; each sees
 * the same env and spec.  A refining stage written last ("quest+topp",
 * p_topp.c) prunes the selector's answer after select_layer returns it (or
 * every entry, with no selector); its selection then depends on each
 * layer's queries, so the chain never claims same_every_layer.  The chain
 * comes parsed (ks_policy_spec.part): no name is split again here.
 */
#define _GNU_SOURCE
#include "policies/registry.h"
#include "core/simd.h"
#include "tensor/ops.h"
#include "tensor/simd_avx2.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ks_policy {
    ks_policy_spec spec;                       /* copied whole at create */
    int n;                                     /* parts: 1, or 2-3 when composed */
    int nb;                                    /* of them, before the refining stage (n - 1 with one, else n) */
    const ks_policy_i *vt[KS_POLICY_MAX_PARTS]; /* [n] */
    void *st[KS_POLICY_MAX_PARTS];             /* [n] */
};

void ks_policy_destroy(ks_policy *pol) {
    if (!pol) return;
    for (int i = 0; i < pol->n; i++)
        if (pol->st[i]) pol->vt[i]->destroy(pol->st[i]);
    ks_free(pol);
}

ks_status ks_policy_create(const ks_policy_spec *spec, const ks_policy_env *env, ks_policy **out) {
    if (!spec || spec->n_parts < 1 || spec->n_parts > KS_POLICY_MAX_PARTS)
        return KS_FAIL(KS_ERR_INVALID_ARG, "no parsed policy spec");
    ks_policy *pol = ks_calloc(1, sizeof *pol);
    if (!pol) return KS_FAIL(KS_ERR_NOMEM, "policy '%s'", spec->name);
    pol->spec = *spec;
    pol->n = spec->n_parts;
    for (int i = 0; i < pol->n; i++) pol->vt[i] = ks_policy_spec_part(spec, i);
    pol->nb = pol->n - (pol->vt[pol->n - 1]->refine != NULL);
    for (int i = 0; i < pol->n; i++) {
        ks_status st = pol->vt[i]->create(env, &pol->spec, &pol->st[i]);
        if (st != KS_OK) {
            ks_policy_destroy(pol);
            return st;
        }
    }
    *out = pol;
    return KS_OK;
}

/* The decode selector: the last part's before a refining stage (NULL:
 * attends densely); the refining stage (NULL: none). */
static const ks_policy_select_i *sel(const ks_policy *pol) { return pol->nb ? pol->vt[pol->nb - 1]->select : NULL; }
static void *sel_state(const ks_policy *pol) { return pol->st[pol->nb - 1]; }
static const ks_policy_hidden_i *hidden(const ks_policy *pol) { return pol->nb ? pol->vt[pol->nb - 1]->hidden : NULL; }
static const ks_policy_refine_i *refiner(const ks_policy *pol) { return pol->vt[pol->n - 1]->refine; }

const char *ks_policy_name(const ks_policy *pol) { return pol->spec.name; }
const ks_policy_spec *ks_policy_spec_of(const ks_policy *pol) { return &pol->spec; }
int32_t ks_policy_dense_layers(const ks_policy *pol) {
    if (pol->spec.dense_layers >= 0) return pol->spec.dense_layers;
    return sel(pol) ? sel(pol)->default_dense_layers : 0;
}
int32_t ks_policy_obs_window(const ks_policy *pol) {
    int32_t w = 0;
    for (int i = 0; i < pol->n; i++) {
        int32_t o = ks_policy_i_obs_window(pol->vt[i]);
        if (o < 0) return -1;
        if (o > w) w = o;
    }
    return w;
}
bool ks_policy_wants_entropy(const ks_policy *pol) { return sel(pol) && sel(pol)->wants_entropy; }
int32_t ks_policy_pseudo_tokens(ks_policy *pol, const int32_t *prompt, int32_t n_prompt, int32_t *out, int32_t cap) {
    for (int i = 0; i < pol->n; i++) {
        const ks_policy_prefill_i *pf = pol->vt[i]->prefill;
        if (pf && pf->pseudo_tokens) return pf->pseudo_tokens(pol->st[i], prompt, n_prompt, out, cap);
    }
    return 0;
}
int32_t ks_policy_hidden_layers(ks_policy *pol, int32_t out[3]) {
    return hidden(pol) ? hidden(pol)->hidden_layers(sel_state(pol), out) : 0;
}
void ks_policy_on_hidden(ks_policy *pol, int32_t seq, int32_t pos, int32_t token, const float *h) {
    if (hidden(pol)) hidden(pol)->on_hidden(sel_state(pol), seq, pos, token, h);
}
size_t ks_policy_weight_bytes(ks_policy *pol) {
    size_t b = 0;
    for (int i = 0; i < pol->n; i++) {
        const ks_policy_hidden_i *hi = pol->vt[i]->hidden;
        if (hi && hi->weight_bytes) b += hi->weight_bytes(pol->st[i]);
    }
    return b;
}
bool ks_policy_own_kcache(const ks_policy *pol) { return hidden(pol) && hidden(pol)->own_kcache; }
void ks_policy_seq_fill_synthetic(ks_policy *pol, int32_t seq, int32_t n, uint64_t seed) {
    for (int i = 0; i < pol->n; i++) {
        const ks_policy_select_i *se = pol->vt[i]->select;
        if (se && se->seq_fill_synthetic) se->seq_fill_synthetic(pol->st[i], seq, n, seed);
    }
}
void ks_policy_get_counters(const ks_policy *pol, ks_policy_counters *out) {
    memset(out, 0, sizeof *out);
    for (int i = 0; i < pol->n; i++) {
        const ks_policy_select_i *se = pol->vt[i]->select;
        if (se && se->counters) se->counters(pol->st[i], out);
    }
    if (refiner(pol) && refiner(pol)->counters) refiner(pol)->counters(pol->st[pol->n - 1], out);
}
bool ks_policy_selects(const ks_policy *pol) { return sel(pol) != NULL || refiner(pol) != NULL; }
bool ks_policy_is_global(const ks_policy *pol) { return sel(pol) && sel(pol)->global; }
bool ks_policy_same_every_layer(const ks_policy *pol) {
    return sel(pol) && sel(pol)->same_every_layer && !refiner(pol); /* a refined answer depends on each layer's q */
}
bool ks_policy_wants_weights(const ks_policy *pol) { return sel(pol) && sel(pol)->after_attention; }

bool ks_policy_prefix_shareable(const ks_policy *pol) {
    for (int i = 0; i < pol->n; i++)
        if (!pol->vt[i]->prefix || ks_policy_i_obs_window(pol->vt[i]) < 0) return false;
    return true;
}
int32_t ks_policy_prefix_min_suffix(const ks_policy *pol) {
    int32_t w = ks_policy_obs_window(pol);
    return w > 1 ? w : 1;
}
/* the part's prefix-state hooks, NULL when it keeps no per-token state of its own */
static const ks_policy_prefix_i *prefix_state(const ks_policy *pol, int i) {
    const ks_policy_prefix_i *px = pol->vt[i]->prefix;
    return px && px->state_bytes ? px : NULL;
}
size_t ks_policy_prefix_state_bytes(ks_policy *pol, int32_t n_tokens) {
    size_t b = 0;
    for (int i = 0; i < pol->n; i++)
        if (prefix_state(pol, i)) b += prefix_state(pol, i)->state_bytes(pol->st[i], n_tokens);
    return b;
}
ks_status ks_policy_prefix_state_save(ks_policy *pol, int32_t seq, int32_t first, int32_t n, uint8_t *out) {
    for (int i = 0; i < pol->n; i++) {
        const ks_policy_prefix_i *px = prefix_state(pol, i);
        if (!px) continue;
        KS_TRY(px->state_save(pol->st[i], seq, first, n, out));
        out += px->state_bytes(pol->st[i], n);
    }
    return KS_OK;
}
ks_status ks_policy_prefix_state_load(ks_policy *pol, int32_t seq, int32_t first, int32_t n, const uint8_t *in) {
    for (int i = 0; i < pol->n; i++) {
        const ks_policy_prefix_i *px = prefix_state(pol, i);
        if (!px) continue;
        KS_TRY(px->state_load(pol->st[i], seq, first, n, in));
        in += px->state_bytes(pol->st[i], n);
    }
    return KS_OK;
}
void ks_policy_seq_reset(ks_policy *pol, int32_t seq) {
    for (int i = 0; i < pol->n; i++) {
        const ks_policy_select_i *se = pol->vt[i]->select;
        if (se && se->seq_reset) se->seq_reset(pol->st[i], seq);
    }
}
ks_status ks_policy_on_prefill(ks_policy *pol, const ks_prefill_info *info) {
    for (int i = 0; i < pol->n; i++)
        if (pol->vt[i]->prefill) KS_TRY(pol->vt[i]->prefill->on_prefill(pol->st[i], info));
    return KS_OK;
}
ks_status ks_policy_on_prefill_split(ks_policy *pol, const ks_prefill_info *info, bool pseudo_part) {
    int part = -1; /* the part ks_policy_pseudo_tokens asks */
    for (int i = 0; i < pol->n && part < 0; i++)
        if (pol->vt[i]->prefill && pol->vt[i]->prefill->pseudo_tokens) part = i;
    for (int i = 0; i < pol->n; i++)
        if ((i == part) == pseudo_part && pol->vt[i]->prefill)
            KS_TRY(pol->vt[i]->prefill->on_prefill(pol->st[i], info));
    return KS_OK;
}
ks_status ks_policy_before_step(ks_policy *pol, const ks_step_info *step) {
    return sel(pol) && sel(pol)->before_step ? sel(pol)->before_step(sel_state(pol), step) : KS_OK;
}
ks_status ks_policy_select(ks_policy *pol, const ks_select_req *req, ks_selection *out) {
    out->all = false;
    out->pages = false;
    out->n = 0;
    out->n_next = 0;
    if (sel(pol)) KS_TRY(sel(pol)->select_layer(sel_state(pol), req, out));
    else out->all = true;
    return refiner(pol) ? refiner(pol)->refine(pol->st[pol->n - 1], req, out) : KS_OK;
}
void ks_policy_after_attention(ks_policy *pol, const ks_select_req *req, const int32_t *entries, const float *w,
                               int32_t n) {
    if (sel(pol) && sel(pol)->after_attention) sel(pol)->after_attention(sel_state(pol), req, entries, w, n);
}
void ks_policy_on_append(ks_policy *pol, int32_t seq, int32_t layer, int32_t head, int32_t pos, const float *k) {
    for (int i = 0; i < pol->n; i++) {
        const ks_policy_select_i *se = pol->vt[i]->select;
        if (se && se->on_append) se->on_append(pol->st[i], seq, layer, head, pos, k);
    }
}
