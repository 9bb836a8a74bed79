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
 */
#include "select/policy.h"

#include <math.h>
#include <stdatomic.h>

typedef struct {
    ks_policy_env env;
    ks_group_reduce group;
    _Atomic uint64_t bytes_read; /* page bounds scored (selections run on every worker) */
} quest_state;

static const char *const quest_args[] = {"group", NULL};

static ks_status quest_create(const ks_policy_env *env, const ks_policy_params *p, void **state) {
    char g[16];
    KS_TRY(ks_args_str(p->args, "group", "max", g, sizeof g));
    ks_group_reduce how;
    KS_TRY(ks_group_reduce_parse(g, &how));
    quest_state *s = ks_calloc(1, sizeof *s);
    s->env = *env;
    s->group = how;
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
    float *sc = ks_malloc(sizeof(float) * (size_t)np * (G + 1));
    float *red = sc + (size_t)np * G;
    /* an f16 cache's store keeps f16 bounds: every page scored in one call
     * from half the bytes (the group max fused in); otherwise page by page
     * from the f32 summaries */
    const uint16_t **kb = ks_malloc(sizeof(*kb) * (size_t)np);
    bool f16 = ks_policy_kv_pages_bounds16(env, req->seq, req->layer, req->head, np, kb);
    bool fused = f16 && s->group == KS_GROUP_MAX;
    if (f16) {
        ks_page_upper_bounds16_pages(req->q, G, kb, np, hd, fused ? NULL : sc, fused ? red : NULL);
    } else {
        for (int32_t p = 0; p < np; p++) {
            ks_kv_page_meta m;
            ks_policy_kv_page_meta(env, req->seq, req->layer, req->head, p, &m);
            ks_page_upper_bounds(req->q, G, m.kmin, m.kmax, hd, sc + p, (size_t)np); /* min, max read once per group */
        }
    }
    ks_free(kb);
    uint64_t bytes = (uint64_t)np * 2 * hd * (f16 ? sizeof(uint16_t) : sizeof(float));
    if (s->group == KS_GROUP_SOFTMAX_MEAN) /* bounds are logits: scale like attention */
        for (size_t i = 0; i < (size_t)np * G; i++) sc[i] /= sqrtf((float)hd);
    atomic_fetch_add_explicit(&s->bytes_read, bytes, memory_order_relaxed);
    if (!fused) ks_group_reduce_scores(sc, G, np, s->group, red);
    int32_t kk = k < out->cap ? k : out->cap;
    out->n = ks_topk_scratch(red, np, kk, out->idx, sc); /* partial selection; the group scores are spent */
    ks_free(sc);
    return KS_OK;
}

const ks_policy_i ks_policy_quest = {
    .name = "quest",
    .summary = "Quest: per-layer top pages by the per-channel min/max bound (first two layers dense)",
    .default_dense_layers = 2,
    .arg_names = quest_args,
    .create = quest_create,
    .destroy = quest_destroy,
    .select_layer = quest_select,
    .counters = quest_counters,
    .page_summaries = true,
};
