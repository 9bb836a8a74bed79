/*
 * p_dapq.c — `dapq`: prefill-time eviction scored by position-aware pseudo
 * queries (DapQ, "Where Matters More Than What: Decoding-aligned KV Cache
 * Compression via Position-aware Pseudo Queries", Sections 4.1-4.2).
 *
 * SnapKV scores the prompt with the queries of its own last tokens, which
 * sit at prompt positions and carry prompt content.  DapQ's observation is
 * that a query is dominated by its RoPE position, so queries placed where the
 * *answer* will be (positions L_p, L_p+1, ...) predict what decoding attends
 * far better, whatever their content.  So: after the prompt, the framework
 * prefills N pseudo tokens (ours: the first `n_head_tokens` and the last
 * N - n_head_tokens prompt tokens, the paper's prefix-suffix construction,
 * default 4 + 28) at positions L_p .. L_p+N-1 and hands their queries to
 * on_prefill with info->pseudo set while their KV is still the last
 * info->n_pseudo entries of every head; after the eviction it removes that
 * KV, and decoding starts at L_p as if they had never been there.
 *
 * Scoring (Section 4.2, Eq. 4-5): S(j) = sum over the pseudo queries and
 * over the query heads of the KV head's group of
 * softmax(q k^T / sqrt(d))[j] (env->attn_probs), then a plain top-K of S.
 * Pooling: Eq. 5 takes the top-K of S itself, so `pool=1` (no pooling) is
 * the default; `pool=5` is SnapKV's clustering, an option (computed over the
 * candidate range only, so the sinks' large mass does not spill onto their
 * neighbours).  GQA: the paper scores per attention head; summing the
 * group's heads gives one ranking per KV head, as our budgets are per KV
 * head.
 * Keys in scope, as the paper: Attention(q_i, k_j) is the attention of
 * pseudo query i in the extended sequence, whose softmax runs over the prompt
 * keys *and* the pseudo keys up to i (causal); Eq. 4 then reads the prompt
 * columns.  ks_policy_evict_scored does that when info->n_pseudo > 0: the
 * rows are scored with attn_probs' per-row key limit L_p + i + 1, only the
 * first n - n_pseudo entries (the prompt's) are candidates, and the pseudo
 * entries are kept for the framework to remove.  (Without pseudo KV,
 * n_pseudo = 0, the softmax covers the prompt keys only, as it did before
 * the engine kept the pseudo KV through on_prefill.)
 *
 * Budget (per KV head, the framework's convention): each head with more
 * than `budget` entries keeps exactly `budget`: the first `sink` entries,
 * the last `keep_recent` entries (default 0: the paper keeps a plain top-K
 * over [0, L_p); the pseudo queries *are* the observation window, and a
 * recent window is what they replace), and the top-scoring rest.  Every KV
 * head chooses for itself; the paper leaves per-head vs per-layer budgets
 * open, and per head is what the decode budget of every other policy means
 * here, so "dapq+quest" budgets stay comparable.  Layers are all evicted
 * (dense_layers only concerns decode selection).
 *
 * No decode hooks: decoding is dense over what is left, so dapq composes as
 * the evictor of "dapq+<selector>".
 *
 * Pseudo-token count: min(n_pseudo, n_prompt, the framework's cap, the room
 * left in the context).  pseudo_tokens() does not learn the sequence, so the
 * room is bounded by the longest sequence in the store (the last entry of
 * each sequence's (layer 0, head 0) is its newest position: the prompt was
 * just appended, so for the calling sequence it is exact, for the others an
 * over-estimate, which only makes the bound safe).  When no head can exceed
 * the budget (budget <= 0 or >= that length) no pseudo tokens are run at
 * all: nothing would be evicted, and the prefill stays bit-identical to dense.
 */
#include "policy/policy.h"

typedef struct {
    ks_policy_env env;
    ks_policy_spec p;
    int32_t n_pseudo, n_head_tokens, pool, keep_recent;
    bool told_short; /* the note that fewer pseudo tokens fit than asked was logged */
} dapq_state;

enum { DAPQ_PSEUDO_DEFAULT = 32, DAPQ_PSEUDO_MAX = 1024 }; /* the paper's N; the framework's row cap */

static const char *const dapq_args[] = {"n_pseudo", "n_head_tokens", "pool", "keep_recent", NULL};

static ks_status dapq_create(const ks_policy_env *env, const ks_policy_spec *p, void **state) {
    int64_t n_pseudo, n_head, pool, recent;
    KS_TRY(ks_args_int(p->args, "n_pseudo", DAPQ_PSEUDO_DEFAULT, 1, DAPQ_PSEUDO_MAX, &n_pseudo));
    KS_TRY(ks_args_int(p->args, "n_head_tokens", 4, 0, 1024, &n_head));
    KS_TRY(ks_args_int(p->args, "pool", 1, 1, 63, &pool));
    KS_TRY(ks_args_int(p->args, "keep_recent", 0, 0, 1 << 24, &recent));
    if (pool % 2 == 0) return KS_FAIL(KS_ERR_INVALID_ARG, "dapq pool=%lld must be odd", (long long)pool);
    if (n_head > n_pseudo)
        return KS_FAIL(KS_ERR_INVALID_ARG, "dapq n_head_tokens=%lld exceeds n_pseudo=%lld", (long long)n_head,
                       (long long)n_pseudo);
    dapq_state *s = ks_calloc(1, sizeof *s);
    if (!s) return KS_FAIL(KS_ERR_NOMEM, "dapq policy");
    s->env = *env;
    s->p = *p;
    s->n_pseudo = (int32_t)n_pseudo;
    s->n_head_tokens = (int32_t)n_head;
    s->pool = (int32_t)pool;
    s->keep_recent = (int32_t)recent;
    *state = s;
    return KS_OK;
}

static void dapq_destroy(void *state) { ks_free(state); }

static int32_t dapq_prefill_room(const char *args) {
    int64_t n;
    return ks_args_int(args, "n_pseudo", DAPQ_PSEUDO_DEFAULT, 1, DAPQ_PSEUDO_MAX, &n) == KS_OK ? (int32_t)n : 0;
}

/* Upper bound on the calling sequence's length: max over sequences of the
 * newest position in (layer 0, head 0) plus one (see the essay). */
static int32_t longest_seq(const ks_policy_env *e) {
    int32_t m = 0;
    for (int32_t s = 0; s < e->n_seq; s++) {
        int32_t np = ks_policy_kv_n_pages(e, s, 0, 0);
        if (np <= 0) continue;
        ks_kv_page_meta meta;
        ks_policy_kv_page_meta(e, s, 0, 0, np - 1, &meta);
        if (meta.fill > 0 && meta.pos[meta.fill - 1] + 1 > m) m = meta.pos[meta.fill - 1] + 1;
    }
    return m;
}

static int32_t dapq_pseudo_tokens(void *state, const int32_t *prompt, int32_t n_prompt, int32_t *out, int32_t cap) {
    dapq_state *s = state;
    if (s->p.budget <= 0 || n_prompt <= 0) return 0;
    int32_t len = longest_seq(&s->env);
    if (len < n_prompt) len = n_prompt; /* defensive: the prompt is in the store already */
    if (s->p.budget >= len) return 0;   /* no head can exceed the budget: nothing to score */
    int32_t n = s->n_pseudo;
    if (n > n_prompt) n = n_prompt;
    int32_t want = n;
    if (n > cap) n = cap;
    if (n > s->env.n_ctx - len) n = s->env.n_ctx - len;
    if (n < want && !s->told_short) {
        KS_LOG(INFO, "dapq: %d of %d pseudo tokens fit after a %d-token prompt (context %d; %d would fit them all)",
               n > 0 ? n : 0, want, n_prompt, s->env.n_ctx, len + want);
        s->told_short = true;
    }
    if (n <= 0) return 0;
    int32_t head = s->n_head_tokens < n ? s->n_head_tokens : n, tail = n - head;
    for (int32_t i = 0; i < head; i++) out[i] = prompt[i];
    for (int32_t i = 0; i < tail; i++) out[head + i] = prompt[n_prompt - tail + i];
    return n;
}

/* [0, lo): sinks, [hi, n): recent window, [lo, hi): candidates; all three
 * within the budget, pooled over the candidates only */
static void dapq_span(const void *ctx, int32_t n, int32_t nq, ks_evict_span *sp) {
    const dapq_state *s = ctx;
    (void)nq;
    int32_t K = s->p.budget;
    int32_t lo = s->p.sink < K ? s->p.sink : K;
    int32_t r = s->keep_recent < K - lo ? s->keep_recent : K - lo;
    sp->lo = lo;
    sp->hi = n - r;
    sp->want = K - lo - r;
    sp->pool_lo = lo;
}

static ks_status dapq_prefill(void *state, const ks_prefill_info *info) {
    dapq_state *s = state;
    if (!info->pseudo || s->p.budget <= 0 || info->n_obs <= 0) return KS_OK;
    return ks_policy_evict_scored(&s->env, info, 0, info->n_obs, s->p.budget, s->pool, dapq_span, s);
}

static const ks_policy_prefill_i dapq_prefill_i = {
    .on_prefill = dapq_prefill,
    .pseudo_tokens = dapq_pseudo_tokens,
    .prefill_room = dapq_prefill_room,
    .evicts = true,
};

const ks_policy_i ks_policy_dapq = {
    .name = "dapq",
    .summary = "DapQ: prefill eviction scored by pseudo queries at the decode positions (pooled, per KV head), dense decode",
    .prefix_why = "the cache keeps the full pre-eviction prefix; the pseudo tokens run after the whole prompt as without a hit and the eviction runs per request",
    .create = dapq_create,
    .destroy = dapq_destroy,
    .arg_names = dapq_args,
    .page_summaries = true,
    .prefill = &dapq_prefill_i,
    .prefix = &ks_policy_prefix_stateless,
};
