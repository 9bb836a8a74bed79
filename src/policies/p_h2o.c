/*
 * p_h2o.c — `h2o` (Heavy-Hitter Oracle): keep the entries that have received
 * the most attention so far, plus sinks and the recent window.
 *
 * Scores are the attention weights each entry received, summed over the
 * query heads of its KV head's group and accumulated over steps (the
 * framework reports them after every attention).  The prompt's scores are
 * seeded at prefill from its last obs queries, since re-scoring every prompt
 * row would repeat the whole prefill.  Tokens outside the selection receive
 * no attention and so never overtake the heavy hitters: the selection
 * behaves like H2O's eviction while keeping the entries in the store.
 * State: [n_seq][n_layer][n_head_kv][n_ctx] accumulated weights.
 */
#include "policy/policy.h"

#include <string.h>

typedef struct {
    ks_policy_env env;
    int32_t obs;
    float *acc; /* [n_seq][n_layer][n_head_kv][n_ctx] */
} h2o_state;

static const char *const h2o_args[] = {"obs", NULL};

static float *acc_of(h2o_state *s, int32_t seq, int32_t layer, int32_t head) {
    const ks_policy_env *e = &s->env;
    return s->acc + (((size_t)seq * e->n_layer + layer) * e->n_head_kv + head) * (size_t)e->n_ctx;
}

static ks_status h2o_create(const ks_policy_env *env, const ks_policy_spec *p, void **state) {
    int64_t obs;
    KS_TRY(ks_args_int(p->args, "obs", 64, 0, 64, &obs));
    h2o_state *s = ks_calloc(1, sizeof *s);
    if (!s) return KS_FAIL(KS_ERR_NOMEM, "h2o policy");
    s->env = *env;
    s->obs = (int32_t)obs;
    s->acc = ks_calloc((size_t)env->n_seq * env->n_layer * env->n_head_kv * env->n_ctx, sizeof(float));
    if (!s->acc) {
        ks_free(s);
        return KS_FAIL(KS_ERR_NOMEM, "h2o accumulators for %d x %d tokens", env->n_seq, env->n_ctx);
    }
    *state = s;
    return KS_OK;
}

static void h2o_destroy(void *state) {
    h2o_state *s = state;
    ks_free(s->acc);
    ks_free(s);
}

static void h2o_seq_reset(void *state, int32_t seq) {
    h2o_state *s = state;
    memset(acc_of(s, seq, 0, 0), 0, sizeof(float) * (size_t)s->env.n_layer * s->env.n_head_kv * s->env.n_ctx);
}

static ks_status h2o_prefill(void *state, const ks_prefill_info *info) {
    h2o_state *s = state;
    const ks_policy_env *e = &s->env;
    int32_t nobs = info->n_obs < s->obs ? info->n_obs : s->obs;
    if (nobs <= 0) return KS_OK;
    float *q = ks_malloc(sizeof(float) * (size_t)nobs * (e->n_head / e->n_head_kv) * e->head_dim);
    if (!q) return KS_FAIL(KS_ERR_NOMEM, "h2o: %d observation queries", nobs);
    for (int32_t l = 0; l < e->n_layer; l++) {
        for (int32_t h = 0; h < e->n_head_kv; h++) {
            float *acc = acc_of(s, info->seq, l, h);
            memset(acc, 0, sizeof(float) * e->n_ctx);
            ks_status st = ks_policy_prefill_probs(e, info, info->n_obs - nobs, nobs, l, h, q, acc);
            if (st != KS_OK) {
                ks_free(q);
                return st;
            }
        }
    }
    ks_free(q);
    return KS_OK;
}

static ks_status h2o_select(void *state, const ks_select_req *req, ks_selection *out) {
    h2o_state *s = state;
    const float *acc = acc_of(s, req->seq, req->layer, req->head);
    int32_t lo = req->sink, hi = req->n_entries - req->window;
    out->pages = false;
    if (hi <= lo || req->n_select <= 0) {
        out->n = 0;
        return KS_OK;
    }
    ks_selection_topk(out, acc, lo, hi, req->n_select, NULL);
    return KS_OK;
}

static void h2o_after(void *state, const ks_select_req *req, const int32_t *entries, const float *w, int32_t n) {
    h2o_state *s = state;
    float *acc = acc_of(s, req->seq, req->layer, req->head);
    for (int32_t i = 0; i < n; i++) acc[entries[i]] += w[i];
}

static const ks_policy_select_i h2o_select_i = {
    .seq_reset = h2o_seq_reset,
    .select_layer = h2o_select,
    .after_attention = h2o_after,
};

static const ks_policy_prefill_i h2o_prefill_i = {
    .obs_window = 64,
    .on_prefill = h2o_prefill,
};

const ks_policy_i ks_policy_h2o = {
    .name = "h2o",
    .summary = "H2O: heavy hitters by accumulated attention + sinks + recent window",
    .prefix_why = "its prefill scores are the attention of the last obs prompt rows, recomputed after a hit over the restored keys; decode accumulation starts after the prompt",
    .create = h2o_create,
    .destroy = h2o_destroy,
    .arg_names = h2o_args,
    .select = &h2o_select_i,
    .prefill = &h2o_prefill_i,
    .prefix = &ks_policy_prefix_stateless,
};
