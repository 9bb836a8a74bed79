/*
 * p_quest.c — `quest`: query-aware page selection from per-channel bounds.
 *
 * Each page keeps the per-channel min and max of its keys (the store
 * maintains them on append).  For a query q the page's best possible score is
 * sum_i max(q_i min_i, q_i max_i), an upper bound on q . k for every key in
 * it; the pages with the highest bounds are attended, at page granularity.
 * Quest ranks pages per query head; kvsieve needs one set per KV head, so the
 * group's bounds are reduced (max by default: a page any head needs is kept;
 * `group=mean|softmax` as alternatives).  The first two layers stay dense as
 * in the paper (--dense-layers overrides); the last page is always in the
 * recent window.
 * The bounds are read every step for every page, so at long contexts and
 * many sequences their bytes rival the selected KV's (a page of 32 f16 keys
 * at hd 64 has 256 bytes of f16 bounds against 8 KB of K and V, but a step
 * reads every page's bounds and only B / P pages).  So by default
 * (`bounds=q8`) the pages are scored from the store's 8-bit bounds
 * (kv_meta.h: rounded outward, so still an upper bound, a looser one), half
 * the bytes of f16 bounds: on the bundled pair every task's accuracy is the
 * same as with f16 bounds at 2-12% of 4K and 8K (docs/results/EVAL.md,
 * "Quest's 8-bit page bounds"), and at 32K the f16 bounds' 33.5 MB a step
 * alone are 2.9% of M's sparse step.  The paper keeps the bounds in the
 * keys' own precision; `bounds=f16` does, bit for bit.
 */
#include "policy/policy.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

typedef struct {
    ks_policy_env env;
    ks_group_reduce group;
    bool bounds8; /* score from the 8-bit page bounds */
    _Atomic uint64_t bytes_read; /* page bounds scored (selections run on every worker) */
} quest_state;

static const char *const quest_args[] = {"group", "bounds", NULL};

static ks_status quest_create(const ks_policy_env *env, const ks_policy_spec *p, void **state) {
    char g[16];
    KS_TRY(ks_args_str(p->args, "group", "max", g, sizeof g));
    ks_group_reduce how;
    KS_TRY(ks_group_reduce_parse(g, &how));
    char b[16];
    KS_TRY(ks_args_str(p->args, "bounds", "q8", b, sizeof b));
    if (strcmp(b, "f16") && strcmp(b, "q8"))
        return KS_FAIL(KS_ERR_INVALID_ARG, "quest: bounds=%s: expected q8 or f16", b);
    quest_state *s = ks_calloc(1, sizeof *s);
    if (!s) return KS_FAIL(KS_ERR_NOMEM, "quest policy");
    s->env = *env;
    s->group = how;
    s->bounds8 = !strcmp(b, "q8");
    *state = s;
    return KS_OK;
}

static void quest_destroy(void *state) { ks_free(state); }

static void quest_counters(void *state, ks_policy_counters *out) {
    out->bytes_read += atomic_load_explicit(&((quest_state *)state)->bytes_read, memory_order_relaxed);
}

static ks_status quest_select(void *state, const ks_select_req *req, ks_selection *out) {
    quest_state *s = state;
    const ks_policy_env *env = &s->env;
    int32_t G = s->env.n_head / s->env.n_head_kv, hd = s->env.head_dim, P = ks_policy_kv_page_size(env);
    int32_t np = ks_policy_kv_n_pages(env, req->seq, req->layer, req->head);
    out->pages = true;
    int32_t k = (req->n_select + P - 1) / P;
    if (k <= 0 || np == 0) {
        out->n = 0;
        return KS_OK;
    }
    if (k >= np) {
        out->all = true;
        return KS_OK;
    }
    float *sc = ks_scratch(KS_SCRATCH_POLICY0, sizeof(float) * (size_t)np * (G + 1));
    void *kb = ks_scratch(KS_SCRATCH_POLICY1, sizeof(void *) * (size_t)np);
    if (!sc || !kb) return KS_FAIL(KS_ERR_NOMEM, "quest: scores of %d pages", np);
    float *red = sc + (size_t)np * G;
    /* the store's compact bounds: every page scored in one call (the group
     * max fused in), from the 8-bit bounds with bounds=q8, else from an f16
     * cache's f16 bounds; otherwise (a caller's metadata, or f16 bounds
     * asked of another cache) page by page from the f32 summaries */
    bool b8 = s->bounds8 && ks_policy_kv_pages_bounds8(env, req->seq, req->layer, req->head, np, (const uint8_t **)kb);
    bool f16 = !b8 && ks_policy_kv_pages_bounds16(env, req->seq, req->layer, req->head, np, (const uint16_t **)kb);
    bool fused = (b8 || f16) && s->group == KS_GROUP_MAX;
    if (b8) {
        ks_page_upper_bounds8_pages(req->q, G, (const uint8_t *const *)kb, np, hd, fused ? NULL : sc, fused ? red : NULL);
    } else if (f16) {
        ks_page_upper_bounds16_pages(req->q, G, (const uint16_t *const *)kb, np, hd, fused ? NULL : sc,
                                     fused ? red : NULL);
    } else {
        for (int32_t p = 0; p < np; p++) {
            ks_kv_page_meta m;
            ks_policy_kv_page_meta(env, req->seq, req->layer, req->head, p, &m);
            ks_page_upper_bounds(req->q, G, m.kmin, m.kmax, hd, sc + p, (size_t)np); /* min, max read once per group */
        }
    }
    uint64_t bytes = b8 ? (uint64_t)np * ks_kv_bounds8_bytes(hd)
                        : (uint64_t)np * 2 * hd * (f16 ? sizeof(uint16_t) : sizeof(float));
    if (s->group == KS_GROUP_SOFTMAX_MEAN) /* bounds are logits: scale like attention */
        for (size_t i = 0; i < (size_t)np * G; i++) sc[i] /= sqrtf((float)hd);
    atomic_fetch_add_explicit(&s->bytes_read, bytes, memory_order_relaxed);
    if (!fused) KS_TRY(ks_group_reduce_scores(sc, G, np, s->group, red));
    int32_t kk = k < out->cap ? k : out->cap;
    out->n = ks_topk_scratch(red, np, kk, out->idx, sc); /* partial selection; the group scores are spent */
    return KS_OK;
}

static const ks_policy_select_i quest_select_i = {
    .default_dense_layers = 2,
    .select_layer = quest_select,
    .counters = quest_counters,
};

const ks_policy_i ks_policy_quest = {
    .name = "quest",
    .summary = "Quest: per-layer top pages by the per-channel min/max bound (first two layers dense)",
    .prefix_why = "its page bounds are the store's summaries, recomputed from the restored keys on append",
    .create = quest_create,
    .destroy = quest_destroy,
    .arg_names = quest_args,
    .page_summaries = true,
    .select = &quest_select_i,
    .prefix = &ks_policy_prefix_stateless,
};
