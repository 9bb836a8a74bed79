/*
 * p_snapkv.c — `snapkv`: prefill-time eviction from an observation window.
 *
 * After the prompt is prefilled, the queries of its last `obs` tokens vote:
 * each prompt entry's score is the attention it receives from them, summed
 * over the window and over the query heads of its KV head's group (SnapKV's
 * group-consistent reduction), then smoothed by an average pool of width
 * `pool` (so a kept token brings its neighbours: clustered evidence
 * survives).  Each KV head keeps its top budget - obs entries of the prefix
 * plus the observation window itself, and the rest is evicted for good
 * (pages are freed).  Decoding is then dense over what is left, which makes
 * snapkv composable as the evictor of "snapkv+<selector>".
 */
#include "policy/policy.h"

typedef struct {
    ks_policy_env env;
    ks_policy_spec p;
    int32_t obs, pool;
} snapkv_state;

static const char *const snapkv_args[] = {"obs", "pool", NULL};

static ks_status snapkv_create(const ks_policy_env *env, const ks_policy_spec *p, void **state) {
    int64_t obs, pool;
    KS_TRY(ks_args_int(p->args, "obs", 32, 1, 64, &obs));
    KS_TRY(ks_args_int(p->args, "pool", 5, 1, 63, &pool));
    if (pool % 2 == 0) return KS_FAIL(KS_ERR_INVALID_ARG, "snapkv pool=%lld must be odd", (long long)pool);
    snapkv_state *s = ks_calloc(1, sizeof *s);
    if (!s) return KS_FAIL(KS_ERR_NOMEM, "snapkv policy");
    s->env = *env;
    s->p = *p;
    s->obs = (int32_t)obs;
    s->pool = (int32_t)pool;
    *state = s;
    return KS_OK;
}

static void snapkv_destroy(void *state) { ks_free(state); }

/* The window's own entries and the first `sink` are kept whatever the budget;
 * the rest of it goes to the top prefix entries, pooled over the whole
 * prefix (sinks included). */
static void snapkv_span(const void *ctx, int32_t n, int32_t nobs, ks_evict_span *sp) {
    const snapkv_state *s = ctx;
    int32_t prefix = n - nobs;
    sp->lo = s->p.sink < prefix ? s->p.sink : prefix;
    sp->hi = prefix;
    sp->want = s->p.budget - nobs - sp->lo;
    sp->pool_lo = 0;
}

static ks_status snapkv_prefill(void *state, const ks_prefill_info *info) {
    snapkv_state *s = state;
    int32_t nobs = info->n_obs < s->obs ? info->n_obs : s->obs;
    /* pseudo queries (a DapQ pass) are not SnapKV's observation window */
    if (s->p.budget <= 0 || nobs <= 0 || info->pseudo) return KS_OK;
    return ks_policy_evict_scored(&s->env, info, info->n_obs - nobs, nobs, s->p.budget, s->pool, snapkv_span, s);
}

static const ks_policy_prefill_i snapkv_prefill_i = {
    .obs_window = 64,
    .on_prefill = snapkv_prefill,
    .evicts = true,
};

const ks_policy_i ks_policy_snapkv = {
    .name = "snapkv",
    .summary = "SnapKV: observation-window prefill eviction (pooled, per KV head), dense decode",
    .prefix_why = "the cache keeps the full pre-eviction prefix; the observation window is recomputed (a hit stops obs_window rows early) and the eviction runs per request",
    .create = snapkv_create,
    .destroy = snapkv_destroy,
    .arg_names = snapkv_args,
    .prefill = &snapkv_prefill_i,
    .prefix = &ks_policy_prefix_stateless,
};
