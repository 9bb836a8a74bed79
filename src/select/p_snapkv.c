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
#include "select/policy.h"

#include <string.h>

typedef struct {
    ks_policy_env env;
    ks_policy_params p;
    int32_t obs, pool;
} snapkv_state;

static const char *const snapkv_args[] = {"obs", "pool", NULL};

static ks_status snapkv_create(const ks_policy_env *env, const ks_policy_params *p, void **state) {
    int64_t obs, pool;
    KS_TRY(ks_args_int(p->args, "obs", 32, 1, 64, &obs));
    KS_TRY(ks_args_int(p->args, "pool", 5, 1, 63, &pool));
    if (pool % 2 == 0) return KS_FAIL(KS_ERR_INVALID_ARG, "snapkv pool=%lld must be odd", (long long)pool);
    snapkv_state *s = ks_calloc(1, sizeof *s);
    s->env = *env;
    s->p = *p;
    s->obs = (int32_t)obs;
    s->pool = (int32_t)pool;
    *state = s;
    return KS_OK;
}

static void snapkv_destroy(void *state) { ks_free(state); }

static ks_status snapkv_prefill(void *state, const ks_prefill_info *info) {
    snapkv_state *s = state;
    const ks_policy_env *e = &s->env;
    int32_t G = e->n_head / e->n_head_kv, hd = e->head_dim;
    int32_t nobs = info->n_obs < s->obs ? info->n_obs : s->obs;
    /* pseudo queries (a DapQ pass) are not SnapKV's observation window */
    if (s->p.budget <= 0 || nobs <= 0 || info->pseudo) return KS_OK;
    float *q = ks_malloc(sizeof(float) * (size_t)nobs * G * hd);
    float *acc = ks_malloc(sizeof(float) * (size_t)e->n_ctx), *pooled = ks_malloc(sizeof(float) * (size_t)e->n_ctx);
    int32_t *idx = ks_malloc(sizeof(int32_t) * (size_t)e->n_ctx);
    uint8_t *keep = ks_malloc((size_t)e->n_ctx);
    ks_status st = KS_OK;
    for (int32_t l = 0; l < e->n_layer && st == KS_OK; l++) {
        const float *lq = info->obs_q + ((size_t)l * info->n_obs + (info->n_obs - nobs)) * e->n_head * hd;
        for (int32_t h = 0; h < e->n_head_kv && st == KS_OK; h++) {
            int32_t n = ks_policy_kv_n_entries(e, info->seq, l, h);
            if (n <= s->p.budget) continue;
            for (int32_t r = 0; r < nobs; r++)
                memcpy(q + (size_t)r * G * hd, lq + ((size_t)r * e->n_head + (size_t)h * G) * hd, sizeof(float) * G * hd);
            memset(acc, 0, sizeof(float) * (size_t)n);
            st = e->attn_probs(e->svc, info->seq, l, h, q, nobs, acc);
            if (st != KS_OK) break;
            int32_t prefix = n - nobs, half = s->pool / 2;
            for (int32_t i = 0; i < prefix; i++) { /* average pool, clipped at the prefix edges */
                int32_t a = i - half < 0 ? 0 : i - half, b = i + half + 1 > prefix ? prefix : i + half + 1;
                float sum = 0;
                for (int32_t j = a; j < b; j++) sum += acc[j];
                pooled[i] = sum / (float)(b - a);
            }
            memset(keep, 0, (size_t)n);
            for (int32_t i = prefix; i < n; i++) keep[i] = 1;
            for (int32_t i = 0; i < s->p.sink && i < prefix; i++) keep[i] = 1;
            int32_t want = s->p.budget - nobs - (s->p.sink < prefix ? s->p.sink : prefix);
            int32_t lo = s->p.sink < prefix ? s->p.sink : prefix;
            int32_t got = want > 0 ? ks_topk(pooled + lo, prefix - lo, want, idx) : 0;
            for (int32_t i = 0; i < got; i++) keep[idx[i] + lo] = 1;
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

const ks_policy_i ks_policy_snapkv = {
    .name = "snapkv",
    .summary = "SnapKV: observation-window prefill eviction (pooled, per KV head), dense decode",
    .obs_window = 64,
    .arg_names = snapkv_args,
    .create = snapkv_create,
    .destroy = snapkv_destroy,
    .on_prefill = snapkv_prefill,
    .evicts = true,
};
