/*
 * prefill.c — the prefill scoring the evictors share: the attention that a
 * prompt's last query rows (or DapQ's pseudo queries) give every entry, and
 * the eviction loop of SnapKV and DapQ over those scores (one loop: they
 * differ only in which queries score and how the budget is split).  H2O
 * seeds its accumulated scores from the same attention.
 */
#include "policy/policy.h"

#include <string.h>

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

