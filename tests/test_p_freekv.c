/*
 * test_p_freekv.c — the `freekv` policy (speculative retrieval with
 * fine-grained correction).
 *
 * 1. Hand-made KV where the answer is known (the fake env of
 *    test_policy.c): the page with the highest bound is selected and the
 *    prefetch hint is the fresh selection; a query close to the previous one
 *    (group-mean cosine >= tau) attends the previous step's pages
 *    (speculative) while hinting the fresh ones; an orthogonal query is
 *    corrected (fresh pages now, counted); the prompt's last query seeds the
 *    first decode step; resets and position gaps start cold; hits / misses
 *    against the previous selection; the centre summary is the public code's
 *    (tighter than min/max) and read once per full page; bad arguments.
 * 2. Real models: a budget >= the context is bit-identical to dense (batch 1
 *    and 2, with and without slow-tier layers, alone and after snapkv), and a
 *    real sparse budget gives the same logits whether layers live in the fast
 *    or the slow tier (the prefetch hint changes traffic, never results),
 *    with either page summary.
 */
#define _GNU_SOURCE
#include "infer/infer.h"
#include "gguf/gguf.h"
#include "model/shapes.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------ hand-made selections -- */
enum { HD = 8, NKV = 1, NQ = 2, CTX = 64, PG = 4 };

typedef struct {
    ks_kv_store *kv;
    int reads;
} fake_svc;

static ks_status fake_probs(void *svc, int32_t seq, int32_t layer, int32_t head, const float *q, int32_t nq,
                            const int32_t *n_keys, float *acc) {
    (void)svc, (void)seq, (void)layer, (void)head, (void)q, (void)nq, (void)n_keys, (void)acc;
    return KS_OK;
}

static ks_status fake_evict(void *svc, int32_t seq, int32_t layer, int32_t head, const uint8_t *keep) {
    fake_svc *f = svc;
    return ks_kv_compact(f->kv, seq, layer, head, keep);
}

static ks_status fake_read_keys(void *svc, int32_t seq, int32_t layer, int32_t head, int32_t first, int32_t n,
                                float *out) {
    fake_svc *f = svc;
    f->reads++;
    if (first < 0 || first + n > ks_kv_n_entries(f->kv, seq, layer, head)) return KS_ERR_INVALID_ARG;
    for (int32_t e = first; e < first + n; e++) {
        const uint8_t *K, *V;
        ks_kv_page_rows(f->kv, seq, layer, head, e / PG, &K, &V);
        const ks_f16 *k = (const ks_f16 *)K + (e % PG) * HD;
        for (int d = 0; d < HD; d++) out[(size_t)(e - first) * HD + d] = ks_f16_to_f32(k[d]);
    }
    return KS_OK;
}

/* A one-layer store of the test's shape. */
static ks_kv_store *new_kv(void) {
    ks_kv_params kp = ks_kv_default_params();
    kp.n_layer = 1;
    kp.n_head_kv = NKV;
    kp.head_dim = HD;
    kp.n_ctx = CTX;
    kp.page = PG;
    ks_kv_store *kv = NULL;
    assert_int_equal(ks_kv_create(&kp, &kv), KS_OK);
    return kv;
}

/* 40 entries of small noise keys (10 pages of 4); entry 21 (page 5) has a
 * large key along dim 0, entry 9 (page 2) a larger one along dim 1. */
static void make_kv(fake_svc *f) {
    f->kv = new_kv();
    for (int e = 0; e < 40; e++) {
        float k[HD], v[HD];
        for (int d = 0; d < HD; d++) {
            k[d] = 0.1f * sinf((float)(e * HD + d));
            v[d] = (float)e;
        }
        if (e == 21) k[0] = 4.0f;
        if (e == 9) k[1] = 40.0f;
        assert_int_equal(ks_kv_append(f->kv, 0, 0, 0, e, k, v), KS_OK);
    }
}

static ks_status make_policy_st(fake_svc *f, const char *name, int32_t budget, const char *args, ks_policy **pol) {
    ks_policy_env env = {.n_layer = 1, .n_head = NQ, .n_head_kv = NKV, .head_dim = HD, .n_seq = 1, .n_ctx = CTX,
                         .kv = f->kv, .svc = f, .attn_probs = fake_probs, .evict = fake_evict,
                         .read_keys = fake_read_keys};
    return ks_test_policy_create(name, args, budget, 2, 4, 0, &env, pol);
}

static ks_policy *make_policy(fake_svc *f, const char *args) {
    ks_policy *pol = NULL;
    /* budget 10 = sink 2 + window 4 + 4 entries: one page of 4 */
    assert_int_equal(make_policy_st(f, "freekv", 10, args, &pol), KS_OK);
    return pol;
}

static ks_select_req req_at(const float *q, int32_t pos) {
    return (ks_select_req){.seq = 0, .layer = 0, .head = 0, .pos = pos, .n_entries = 40, .q = q,
                           .n_select = 4, .sink = 2, .window = 4};
}

/* both query heads of the group look along (a, b) in dims 0 and 1 */
static void set_q(float *q, float a0, float b0, float a1, float b1) {
    memset(q, 0, sizeof(float) * NQ * HD);
    q[0] = a0, q[1] = b0;
    q[HD] = a1, q[HD + 1] = b1;
}

typedef struct {
    int32_t idx[CTX], next[CTX];
    ks_selection sel;
} sel_buf;

static ks_selection *sel_of(sel_buf *b) {
    b->sel = (ks_selection){.cap = CTX, .idx = b->idx, .next = b->next};
    return &b->sel;
}

static void expect_one(const ks_selection *s, int32_t page, int32_t next_page) {
    assert_false(s->all);
    assert_true(s->pages);
    assert_int_equal(s->n, 1);
    assert_int_equal(s->idx[0], page);
    assert_true(s->next_pages);
    assert_int_equal(s->n_next, 1);
    assert_int_equal(s->next[0], next_page);
}

static void test_highest_bound_and_hint(void **state) {
    (void)state;
    const char *variants[] = {NULL, "scale=sqrt", "summary=centre", "tau=0.8,summary=bound,scale=none"};
    for (size_t v = 0; v < sizeof variants / sizeof *variants; v++) {
        fake_svc f = {0};
        make_kv(&f);
        ks_policy *pol = make_policy(&f, variants[v]);
        float q[NQ * HD];
        set_q(q, 1, 0, 1, 0); /* along dim 0: page 5 has the highest bound */
        sel_buf b;
        ks_select_req r = req_at(q, 40);
        assert_int_equal(ks_policy_select(pol, &r, sel_of(&b)), KS_OK);
        expect_one(&b.sel, 5, 5); /* cold start: the fresh selection, also the hint */
        set_q(q, 0, 1, 0, 1);     /* along dim 1 (a correction): page 2 */
        r = req_at(q, 41);
        assert_int_equal(ks_policy_select(pol, &r, sel_of(&b)), KS_OK);
        expect_one(&b.sel, 2, 2);
        if (variants[v] && strstr(variants[v], "centre")) {
            assert_true(f.reads > 0);
            int reads = f.reads; /* full pages are summarised once */
            r = req_at(q, 42);
            assert_int_equal(ks_policy_select(pol, &r, sel_of(&b)), KS_OK);
            assert_int_equal(f.reads, reads);
        }
        ks_policy_destroy(pol);
        ks_kv_destroy(f.kv);
    }
}

static void test_speculation_and_correction(void **state) {
    (void)state;
    fake_svc f = {0};
    make_kv(&f);
    ks_policy *pol = make_policy(&f, NULL);
    ks_policy_counters c;
    float q[NQ * HD];
    sel_buf b;
    ks_select_req r;

    set_q(q, 1, 0, 1, 0);
    r = req_at(q, 40);
    assert_int_equal(ks_policy_select(pol, &r, sel_of(&b)), KS_OK);
    expect_one(&b.sel, 5, 5);
    ks_policy_get_counters(pol, &c);
    assert_int_equal(c.selections, 1);
    assert_int_equal(c.hits, 0);
    assert_int_equal(c.misses, 1);
    assert_int_equal(c.corrections, 0); /* cold start, not a correction */

    /* nearly the same query (cos 0.99): the fresh selection would be page 2
     * (0.14 * 40 > 4), but this step attends step t-1's page 5 and hints 2 */
    set_q(q, 1, 0.14f, 1, 0.14f);
    r = req_at(q, 41);
    assert_int_equal(ks_policy_select(pol, &r, sel_of(&b)), KS_OK);
    expect_one(&b.sel, 5, 2);
    ks_policy_get_counters(pol, &c);
    assert_int_equal(c.selections, 2);
    assert_int_equal(c.hits, 1); /* page 5 stays in the recall buffer */
    assert_int_equal(c.misses, 1);
    assert_int_equal(c.corrections, 0);
    assert_int_equal(c.speculative, 1);

    /* the same query again: the pages it selected (page 2, the hint) are attended now */
    r = req_at(q, 42);
    assert_int_equal(ks_policy_select(pol, &r, sel_of(&b)), KS_OK);
    expect_one(&b.sel, 2, 2);
    ks_policy_get_counters(pol, &c);
    assert_int_equal(c.hits, 1);
    assert_int_equal(c.misses, 2); /* page 2 was not attended at step 41 */
    assert_int_equal(c.corrections, 0);
    assert_int_equal(c.speculative, 2);

    /* orthogonal query: corrected, the fresh selection (page 5) now */
    set_q(q, 1, 0, 1, 0);
    q[0] = 0.14f, q[1] = -1.0f; /* head 0: orthogonal to (1, 0.14) */
    q[HD] = 0.14f, q[HD + 1] = -1.0f;
    q[2] = 2.0f, q[HD + 2] = 2.0f; /* ... with some weight elsewhere, still orthogonal */
    r = req_at(q, 43);
    /* fresh: dim 1 negative -> page 2 loses; page 5 (dim 0 = 4 * 0.14) or the noise decides */
    assert_int_equal(ks_policy_select(pol, &r, sel_of(&b)), KS_OK);
    ks_policy_get_counters(pol, &c);
    assert_int_equal(c.corrections, 1);
    assert_int_equal(b.sel.n, 1);
    assert_int_equal(b.sel.n_next, 1);
    assert_int_equal(b.sel.idx[0], b.sel.next[0]); /* a correction uses the fresh selection now */
    assert_true(b.sel.idx[0] != 2);

    /* half the group turns away: the group-mean cosine ((1 - 0.45) / 2) is below tau */
    float prev[NQ * HD];
    memcpy(prev, q, sizeof prev);
    r = req_at(q, 44);
    assert_int_equal(ks_policy_select(pol, &r, sel_of(&b)), KS_OK); /* same q: speculative */
    ks_policy_get_counters(pol, &c);
    assert_int_equal(c.corrections, 1);
    memset(q + HD, 0, sizeof(float) * HD);
    q[HD + 1] = 1; /* head 1 along dim 1: cos with (0.14, -1, 2) is negative */
    r = req_at(q, 45);
    assert_int_equal(ks_policy_select(pol, &r, sel_of(&b)), KS_OK);
    ks_policy_get_counters(pol, &c);
    assert_int_equal(c.corrections, 2);

    /* a gap in positions (or a reset) has no previous step: cold, uncounted */
    r = req_at(q, 50);
    assert_int_equal(ks_policy_select(pol, &r, sel_of(&b)), KS_OK);
    ks_policy_seq_reset(pol, 0);
    r = req_at(q, 51);
    assert_int_equal(ks_policy_select(pol, &r, sel_of(&b)), KS_OK);
    ks_policy_get_counters(pol, &c);
    assert_int_equal(c.corrections, 2);
    assert_int_equal(c.speculative, 3); /* steps 41, 42 and 44 */
    assert_int_equal(c.selections, 8);
    assert_int_equal(c.hits + c.misses, 8); /* one page each */
    ks_policy_destroy(pol);
    ks_kv_destroy(f.kv);
}

/* A metadata source over the store that counts page reads: one scoring
 * pass reads every competing page once. */
typedef struct {
    ks_kv_store *kv;
    int page_reads;
} counting_meta;

static int32_t cm_n_entries(void *ctx, int32_t seq, int32_t layer, int32_t head) {
    return ks_kv_n_entries(((counting_meta *)ctx)->kv, seq, layer, head);
}

static void cm_page_meta(void *ctx, int32_t seq, int32_t layer, int32_t head, int32_t lp, ks_kv_page_meta *out) {
    counting_meta *m = ctx;
    m->page_reads++;
    ks_kv_page_meta_get(m->kv, seq, layer, head, lp, out);
}

static ks_policy *make_counting_policy(counting_meta *cm, ks_kv_meta_src *src, int32_t budget, int32_t window) {
    *src = (ks_kv_meta_src){.ctx = cm, .page_size = PG, .n_entries = cm_n_entries, .page_meta = cm_page_meta};
    ks_policy_env env = {.n_layer = 1, .n_head = NQ, .n_head_kv = NKV, .head_dim = HD, .n_seq = 1, .n_ctx = CTX,
                         .meta = src, .attn_probs = fake_probs};
    ks_policy *pol = NULL;
    assert_int_equal(ks_test_policy_create("freekv", NULL, budget, 2, window, 0, &env, &pol), KS_OK);
    return pol;
}

/* Without a hint buffer (a fast-tier layer, the public API) a step scores
 * the pages at most once: a speculative step after a correction or a cold
 * start reuses the selection already made and scores nothing; one after a
 * speculative step makes the kept query's selection then; the prompt's last
 * query is kept at prefill without scoring. */
static void test_lazy_speculation_scores_once(void **state) {
    (void)state;
    fake_svc f = {0};
    make_kv(&f);
    counting_meta cm = {.kv = f.kv};
    ks_kv_meta_src src;
    ks_policy *pol = make_counting_policy(&cm, &src, 10, 4);
    float q[NQ * HD];
    int32_t idx[CTX];
    ks_selection sel;
#define SELECT_AT(pos_)                                                                 \
    do {                                                                                \
        sel = (ks_selection){.cap = CTX, .idx = idx};                                   \
        ks_select_req r_ = req_at(q, (pos_));                                           \
        assert_int_equal(ks_policy_select(pol, &r_, &sel), KS_OK);                      \
        assert_int_equal(sel.n, 1);                                                     \
        assert_int_equal(sel.n_next, 0);                                                \
    } while (0)
    set_q(q, 1, 0, 1, 0);
    ks_prefill_info info = {.seq = 0, .n_prompt = 40, .n_obs = 1, .obs_q = q, .first_pos = 0};
    assert_int_equal(ks_policy_on_prefill(pol, &info), KS_OK);
    int pass = 0; /* page reads of one scoring pass: every competing page (9) */
    assert_int_equal(cm.page_reads, 0); /* prefill keeps the query, scores nothing */

    set_q(q, 1, 0.14f, 1, 0.14f); /* first decode step, similar: the prompt query's pages, scored now */
    SELECT_AT(40);
    assert_int_equal(idx[0], 5);
    pass = cm.page_reads;
    assert_true(pass >= 9);

    SELECT_AT(41); /* same query: the selection step 40's query makes (page 2), scored now: one pass */
    assert_int_equal(idx[0], 2);
    assert_int_equal(cm.page_reads, 2 * pass);

    set_q(q, 1, 0, 1, 0);
    q[0] = 0.14f, q[1] = -1.0f, q[2] = 2.0f; /* orthogonal: corrected, one pass */
    q[HD] = 0.14f, q[HD + 1] = -1.0f, q[HD + 2] = 2.0f;
    SELECT_AT(42);
    int32_t corrected = idx[0];
    assert_true(corrected != 2);
    assert_int_equal(cm.page_reads, 3 * pass);

    SELECT_AT(43); /* same query: the correction's pages, no pass at all */
    assert_int_equal(idx[0], corrected);
    assert_int_equal(cm.page_reads, 3 * pass);

    ks_policy_counters c = {0};
    ks_policy_get_counters(pol, &c);
    assert_int_equal(c.selections, 4);
    assert_int_equal(c.speculative, 3);
    assert_int_equal(c.corrections, 1);
#undef SELECT_AT
    ks_policy_destroy(pol);
    ks_kv_destroy(f.kv);
}

/* A selection made late is the one the earlier step would have made: with a
 * window shorter than a page the entry appended since lands in a candidate
 * page, and the replay still scores that page as step t-1 saw it.  Two
 * instances over one KV, one asked for hints (its selection made at step
 * t-1, as for a slow-tier layer), one not (made at step t, as for a
 * fast-tier layer), attend the same pages. */
static void append_noise(ks_kv_store *kv, int e, float k0) {
    float k[HD], v[HD] = {0};
    for (int d = 0; d < HD; d++) k[d] = 0.1f * sinf((float)(e * HD + d));
    if (k0 != 0) k[0] = k0;
    assert_int_equal(ks_kv_append(kv, 0, 0, 0, e, k, v), KS_OK);
}

static void test_late_selection_is_exact(void **state) {
    (void)state;
    ks_kv_store *kv = new_kv();
    for (int e = 0; e < 37; e++) append_noise(kv, e, e == 21 ? 4.0f : 0); /* page 5 stands out along dim 0 */
    counting_meta cm[2] = {{.kv = kv}, {.kv = kv}};
    ks_kv_meta_src src[2];
    /* budget 7 = sink 2 + window 1 + 4 entries: one page */
    ks_policy *pol[2] = {make_counting_policy(&cm[0], &src[0], 7, 1), make_counting_policy(&cm[1], &src[1], 7, 1)};
    float q[NQ * HD];
    sel_buf b[2];
    const float drift[3] = {0, 0.05f, 0.1f}; /* similar queries: steps 37 and 38 speculate */
    for (int t = 0; t < 3; t++) {
        int32_t pos = 36 + t, n = 37 + t;
        if (t == 1) append_noise(kv, 37, 0);
        if (t == 2) append_noise(kv, 38, 40.0f); /* lands in page 9, a candidate since step 37 (window 1) */
        set_q(q, 1, drift[t], 1, drift[t]);
        for (int i = 0; i < 2; i++) {
            ks_select_req r = {.seq = 0, .layer = 0, .head = 0, .pos = pos, .n_entries = n, .q = q, .n_select = 4,
                               .sink = 2, .window = 1};
            ks_selection *s = sel_of(&b[i]);
            if (i == 0) s->next = NULL;
            assert_int_equal(ks_policy_select(pol[i], &r, s), KS_OK);
            assert_int_equal(s->n, 1);
            assert_int_equal(s->idx[0], 5); /* at step 38: what step 37's query selected then, not page 9 */
        }
    }
    assert_int_equal(b[1].sel.n_next, 1);
    assert_int_equal(b[1].sel.next[0], 9); /* the hint for step 39 sees the new key */
    ks_policy_counters c = {0};
    ks_policy_get_counters(pol[0], &c);
    assert_int_equal(c.speculative, 2);
    for (int i = 0; i < 2; i++) ks_policy_destroy(pol[i]);
    ks_kv_destroy(kv);
}

static void test_tau_bounds_correction(void **state) {
    (void)state;
    /* tau = -1: never corrected (pure reuse); tau = 1: corrected unless identical */
    for (int t = 0; t < 2; t++) {
        fake_svc f = {0};
        make_kv(&f);
        ks_policy *pol = make_policy(&f, t == 0 ? "tau=-1" : "tau=1");
        float q[NQ * HD];
        sel_buf b;
        set_q(q, 1, 0, 1, 0);
        ks_select_req r = req_at(q, 40);
        assert_int_equal(ks_policy_select(pol, &r, sel_of(&b)), KS_OK);
        set_q(q, 0, 1, 0, 1);
        r = req_at(q, 41);
        assert_int_equal(ks_policy_select(pol, &r, sel_of(&b)), KS_OK);
        expect_one(&b.sel, t == 0 ? 5 : 2, 2);
        ks_policy_counters c;
        ks_policy_get_counters(pol, &c);
        assert_int_equal(c.corrections, t == 0 ? 0 : 1);
        ks_policy_destroy(pol);
        ks_kv_destroy(f.kv);
    }
}

static void test_prefill_seeds_first_step(void **state) {
    (void)state;
    fake_svc f = {0};
    make_kv(&f);
    ks_policy *pol = make_policy(&f, NULL);
    /* the prompt's 40 tokens; the last query looks along dim 0 */
    float obs[1 * NQ * HD];
    set_q(obs, 1, 0, 1, 0);
    ks_prefill_info info = {.seq = 0, .n_prompt = 40, .n_obs = 1, .obs_q = obs, .first_pos = 0};
    assert_int_equal(ks_policy_on_prefill(pol, &info), KS_OK);
    /* first decode step (pos 40) with a similar query: the seeded page 5 */
    float q[NQ * HD];
    set_q(q, 1, 0.14f, 1, 0.14f);
    sel_buf b;
    ks_select_req r = req_at(q, 40);
    assert_int_equal(ks_policy_select(pol, &r, sel_of(&b)), KS_OK);
    expect_one(&b.sel, 5, 2);
    ks_policy_counters c;
    ks_policy_get_counters(pol, &c);
    assert_int_equal(c.selections, 1);
    assert_int_equal(c.misses, 1);
    assert_int_equal(c.corrections, 0);
    /* pseudo queries (DapQ) are no previous step */
    ks_policy_seq_reset(pol, 0);
    info.pseudo = true;
    assert_int_equal(ks_policy_on_prefill(pol, &info), KS_OK);
    assert_int_equal(ks_policy_select(pol, &r, sel_of(&b)), KS_OK);
    expect_one(&b.sel, 2, 2);
    ks_policy_destroy(pol);
    ks_kv_destroy(f.kv);
}

static void test_budget_covers_candidates(void **state) {
    (void)state;
    fake_svc f = {0};
    make_kv(&f);
    ks_policy *pol = make_policy(&f, NULL);
    float q[NQ * HD];
    set_q(q, 1, 0, 1, 0);
    sel_buf b;
    ks_select_req r = req_at(q, 40);
    r.n_select = 34; /* 9 pages hold the entries outside sinks and window: all of them */
    assert_int_equal(ks_policy_select(pol, &r, sel_of(&b)), KS_OK);
    assert_true(b.sel.all);
    assert_int_equal(b.sel.n_next, 9);
    r.n_select = 0; /* nothing to choose */
    r.pos = 41;
    assert_int_equal(ks_policy_select(pol, &r, sel_of(&b)), KS_OK);
    assert_false(b.sel.all);
    assert_int_equal(b.sel.n, 0);
    /* a selection without room for a hint is still answered */
    ks_selection nohint = {.cap = CTX, .idx = b.idx};
    r.n_select = 4;
    r.pos = 42;
    assert_int_equal(ks_policy_select(pol, &r, &nohint), KS_OK);
    assert_int_equal(nohint.n, 1);
    ks_policy_destroy(pol);
    ks_kv_destroy(f.kv);
}

/* The public code's centre summary c -/+ mean|c - k| is tighter than
 * [kmin, kmax]: page 3 spreads its keys over [0, 4] along dim 0 (box [1, 3]),
 * page 6 holds four keys at 3.5 (box [3.5, 3.5]).  The bound prefers page 3
 * (4 > 3.5), the centre summary page 6 (3 < 3.5). */
static void test_centre_summary_is_tighter(void **state) {
    (void)state;
    for (int v = 0; v < 2; v++) {
        fake_svc f = {0};
        ks_kv_params kp = ks_kv_default_params();
        kp.n_layer = 1;
        kp.n_head_kv = NKV;
        kp.head_dim = HD;
        kp.n_ctx = CTX;
        kp.page = PG;
        assert_int_equal(ks_kv_create(&kp, &f.kv), KS_OK);
        const float spread[4] = {0, 2, 2, 4};
        for (int e = 0; e < 40; e++) {
            float k[HD] = {0}, val[HD] = {0};
            for (int d = 1; d < HD; d++) k[d] = 0.1f * sinf((float)(e * HD + d));
            if (e / PG == 3) k[0] = spread[e % PG];
            if (e / PG == 6) k[0] = 3.5f;
            assert_int_equal(ks_kv_append(f.kv, 0, 0, 0, e, k, val), KS_OK);
        }
        ks_policy *pol = make_policy(&f, v ? "summary=centre" : NULL);
        float q[NQ * HD];
        set_q(q, 1, 0, 1, 0);
        sel_buf b;
        ks_select_req r = req_at(q, 40);
        assert_int_equal(ks_policy_select(pol, &r, sel_of(&b)), KS_OK);
        expect_one(&b.sel, v ? 6 : 3, v ? 6 : 3);
        ks_policy_destroy(pol);
        ks_kv_destroy(f.kv);
    }
}

/* Large head dims: with head_dim 256 the raw page bounds are 16x the
 * attention logits; unscaled, the softmax of one head gives the best page 1
 * and underflows every other to exactly 0, so the second page is picked by
 * index.  The default 1/sqrt(d) keeps the ranking (pages 5 > 7 > 2). */
static void test_scale_head_dim_256(void **state) {
    (void)state;
    enum { BIG = 256 };
    for (int v = 0; v < 2; v++) {
        fake_svc f = {0};
        ks_kv_params kp = ks_kv_default_params();
        kp.n_layer = 1;
        kp.n_head_kv = 1;
        kp.head_dim = BIG;
        kp.n_ctx = CTX;
        kp.page = PG;
        assert_int_equal(ks_kv_create(&kp, &f.kv), KS_OK);
        for (int e = 0; e < 40; e++) {
            float k[BIG] = {0}, val[BIG] = {0};
            if (e == 21) k[0] = 30.0f; /* page 5: bound 3000 */
            if (e == 29) k[0] = 20.0f; /* page 7: bound 2000 */
            if (e == 9) k[0] = 10.0f;  /* page 2: bound 1000 */
            assert_int_equal(ks_kv_append(f.kv, 0, 0, 0, e, k, val), KS_OK);
        }
        ks_policy_env env = {.n_layer = 1, .n_head = 1, .n_head_kv = 1, .head_dim = BIG, .n_seq = 1, .n_ctx = CTX,
                             .kv = f.kv, .svc = &f, .attn_probs = fake_probs, .evict = fake_evict};
        ks_policy *pol = NULL;
        assert_int_equal(ks_test_policy_create("freekv", v ? "scale=none" : NULL, 14, 2, 4, 0, &env, &pol), KS_OK);
        float q[BIG] = {0};
        q[0] = 100.0f;
        sel_buf b;
        ks_select_req r = {.seq = 0, .layer = 0, .head = 0, .pos = 40, .n_entries = 40, .q = q, .n_select = 8,
                           .sink = 2, .window = 4};
        assert_int_equal(ks_policy_select(pol, &r, sel_of(&b)), KS_OK);
        assert_int_equal(b.sel.n, 2);
        bool has5 = b.sel.idx[0] == 5 || b.sel.idx[1] == 5, has7 = b.sel.idx[0] == 7 || b.sel.idx[1] == 7;
        assert_true(has5);
        if (v == 0) assert_true(has7); /* scaled: the second best page is kept */
        else assert_false(has7);       /* unscaled: it underflowed to 0 and lost to page 0 by index */
        ks_policy_destroy(pol);
        ks_kv_destroy(f.kv);
    }
}

/* The paper's sink and recent windows: sink_frac / recent_frac of the budget
 * in whole pages, paid from the selected pages before the scored ones. */
static void test_paper_sink_recent_pages(void **state) {
    (void)state;
    fake_svc f = {0};
    make_kv(&f);
    float q[NQ * HD];
    set_q(q, 1, 1, 1, 1); /* pages 2 and 5 score highest */
    sel_buf b;
    /* budget 18 = sink 2 + window 4 + 12 entries: three pages */
    ks_select_req r = req_at(q, 40);
    r.n_select = 12;
    struct {
        const char *args;
        int32_t want[3];
    } cases[] = {
        {"sink_frac=0,recent_frac=0", {2, 5, -1}},     /* all three scored: 2, 5 and the best noise page */
        {"sink_frac=0.25,recent_frac=0", {0, 2, 5}},   /* floor(4.5) / 4 = 1 sink page */
        {"sink_frac=0.5,recent_frac=0.5", {0, 1, 8}},  /* 2 sink pages + the last page before the window */
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        ks_policy *pol = NULL;
        assert_int_equal(make_policy_st(&f, "freekv", 18, cases[c].args, &pol), KS_OK);
        assert_int_equal(ks_policy_select(pol, &r, sel_of(&b)), KS_OK);
        assert_int_equal(b.sel.n, 3);
        for (int i = 0; i < 3; i++) {
            if (cases[c].want[i] < 0) continue;
            bool found = false;
            for (int j = 0; j < b.sel.n; j++) found |= b.sel.idx[j] == cases[c].want[i];
            assert_true(found);
        }
        ks_policy_destroy(pol);
    }
    ks_kv_destroy(f.kv);
}

static void test_bad_args(void **state) {
    (void)state;
    fake_svc f = {0};
    make_kv(&f);
    const char *bad[] = {"tau=2", "tau=x", "summary=mean", "scale=2", "window=3", "preset=long", "sink_frac=0.7"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ks_policy *pol = NULL;
        assert_int_equal(make_policy_st(&f, "freekv", 10, bad[i], &pol), KS_ERR_INVALID_ARG);
        assert_null(pol);
    }
    /* a request outside the shapes is refused, not a crash */
    ks_policy *pol = make_policy(&f, NULL);
    float q[NQ * HD] = {0};
    sel_buf b;
    ks_select_req r = req_at(q, 40);
    r.head = 3;
    assert_int_equal(ks_policy_select(pol, &r, sel_of(&b)), KS_ERR_INVALID_ARG);
    r = req_at(NULL, 40);
    assert_int_equal(ks_policy_select(pol, &r, sel_of(&b)), KS_ERR_INVALID_ARG);
    ks_policy_destroy(pol);
    assert_non_null(ks_policy_find("freekv"));
    ks_kv_destroy(f.kv);
}

/* ---------------------------------------------------------- real models -- */
static ks_model *g_gqa, *g_mha;
static char g_path[256], g_dir[256];

static int setup(void **state) {
    (void)state;
    snprintf(g_path, sizeof g_path, "/tmp/kvsieve-test-freekv-%d.gguf", (int)getpid());
    if (ks_test_tiny_llama(3, 5, g_path, &g_gqa) != 0) return -1;
    if (ks_model_load(ks_test_fixture("models/aidreams260K.gguf"), ks_model_default_params(), &g_mha) != KS_OK) return -1;
    snprintf(g_dir, sizeof g_dir, "/tmp/kvsieve-test-freekv-XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    ks_model_destroy(g_gqa);
    ks_model_destroy(g_mha);
    unlink(g_path);
    rmdir(g_dir);
    return 0;
}

typedef struct {
    const char *policy;
    int32_t budget, page, offload_layers;
    const char *dir;
    const char *args;
} run_cfg;

/* Prefill n_seq different prompts, then decode n_steps greedy steps as one
 * batch; returns every step's logits [n_steps][n_seq][V] (malloc'd) and the
 * context's counters. */
static float *run_decode(ks_model *m, const run_cfg *cfg, int n_prompt, int n_steps, int n_seq, ks_stats *stats) {
    ks_context_params p = ks_context_default_params();
    p.n_ctx = n_prompt + n_steps + 1;
    p.n_seq = n_seq;
    p.n_threads = 2;
    p.n_batch = 64;
    p.policy = cfg->policy;
    p.budget = cfg->budget;
    p.page = cfg->page;
    p.sink = 4;
    p.window = 8;
    p.kv_offload_layers = cfg->offload_layers;
    p.kv_offload_dir = cfg->dir;
    p.policy_args = cfg->args;
    ks_context *c = NULL;
    assert_int_equal(ks_context_create(m, p, &c), KS_OK);
    int32_t V = m->hp.n_vocab;
    float *out = malloc(sizeof(float) * (size_t)n_steps * n_seq * V);
    float *logits = malloc(sizeof(float) * (size_t)n_seq * V);
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)n_prompt);
    int32_t seqs[4], toks[4];
    for (int s = 0; s < n_seq; s++) {
        for (int i = 0; i < n_prompt; i++) prompt[i] = (int32_t)((i * 37 + s * 101 + 11) % V);
        assert_int_equal(ks_prefill(c, s, prompt, n_prompt, logits + (size_t)s * V, NULL), KS_OK);
        seqs[s] = s;
    }
    for (int t = 0; t < n_steps; t++) {
        for (int s = 0; s < n_seq; s++) {
            const float *row = logits + (size_t)s * V;
            int32_t best = 0;
            for (int32_t j = 1; j < V; j++) best = row[j] > row[best] ? j : best;
            toks[s] = best;
        }
        assert_int_equal(ks_decode(c, seqs, toks, n_seq, logits), KS_OK);
        memcpy(out + (size_t)t * n_seq * V, logits, sizeof(float) * (size_t)n_seq * V);
    }
    if (stats) ks_context_stats(c, stats);
    free(logits);
    free(prompt);
    ks_context_destroy(c);
    return out;
}

static void check_equal_dense(ks_model *m, int n_prompt, int page) {
    const int steps = 6;
    int32_t V = m->hp.n_vocab;
    for (int n_seq = 1; n_seq <= 2; n_seq++) {
        run_cfg dense = {.policy = "dense", .page = page};
        float *ref = run_decode(m, &dense, n_prompt, steps, n_seq, NULL);
        const char *names[] = {"freekv", "snapkv+freekv", "freekv"};
        const char *args[] = {NULL, NULL, "summary=centre,tau=0.5,scale=sqrt"};
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
            for (int off = 0; off < 3; off++) {
                run_cfg cfg = {.policy = names[i], .budget = n_prompt + steps + 1, .page = page,
                               .offload_layers = off ? 1 : 0, .dir = off == 2 ? g_dir : NULL, .args = args[i]};
                float *got = run_decode(m, &cfg, n_prompt, steps, n_seq, NULL);
                if (memcmp(got, ref, sizeof(float) * (size_t)steps * n_seq * V) != 0)
                    fail_msg("policy %s %s (batch %d, offload %d) differs from dense with a full budget", names[i],
                             args[i] ? args[i] : "", n_seq, off);
                free(got);
            }
        }
        free(ref);
    }
}

static void test_full_budget_equals_dense_gqa(void **state) {
    (void)state;
    check_equal_dense(g_gqa, 150, 32);
}

static void test_full_budget_equals_dense_mha(void **state) {
    (void)state;
    check_equal_dense(g_mha, 90, 8);
}

/* A real budget: the policy selects, speculates and corrects; the slow tier
 * (memory or file, all layers) with its prefetch hints gives the same logits
 * as the fast tier, for batch 1 and 2. */
static void check_sparse_tiers(ks_model *m, int n_prompt, int page, int budget, const char *args) {
    const int steps = 8;
    int32_t V = m->hp.n_vocab;
    for (int n_seq = 1; n_seq <= 2; n_seq++) {
        ks_stats st;
        run_cfg fast = {.policy = "freekv", .budget = budget, .page = page, .args = args};
        float *ref = run_decode(m, &fast, n_prompt, steps, n_seq, &st);
        assert_true(st.kv_entries_attended < st.kv_entries_total);
        /* one selection per row, sparse layer (all but layer 0) and KV head per step */
        uint64_t want = (uint64_t)steps * n_seq * (m->hp.n_layer - 1) * m->hp.n_head_kv;
        assert_int_equal(st.policy_selections, want);
        assert_true(st.policy_hits + st.policy_misses > 0);
        assert_true(st.policy_hits > 0); /* adjacent steps share pages */
        assert_true(st.policy_corrections + st.policy_speculative <= st.policy_selections);
        for (int off = 1; off < 3; off++) {
            run_cfg slow = {.policy = "freekv", .budget = budget, .page = page, .offload_layers = (int32_t)m->hp.n_layer,
                            .dir = off == 2 ? g_dir : NULL, .args = args};
            ks_stats st2;
            float *got = run_decode(m, &slow, n_prompt, steps, n_seq, &st2);
            if (memcmp(got, ref, sizeof(float) * (size_t)steps * n_seq * V) != 0)
                fail_msg("freekv: slow tier (%d) changed the logits (batch %d)", off, n_seq);
            assert_int_equal(st2.policy_selections, st.policy_selections);
            assert_int_equal(st2.policy_corrections, st.policy_corrections);
            free(got);
        }
        /* tau = 1 corrects (nearly) every speculative step, tau = -1 never does */
        run_cfg never = {.policy = "freekv", .budget = budget, .page = page, .args = "tau=-1"};
        free(run_decode(m, &never, n_prompt, steps, n_seq, &st));
        assert_int_equal(st.policy_corrections, 0);
        assert_true(st.policy_speculative > 0); /* every step after the first speculates */
        run_cfg always = {.policy = "freekv", .budget = budget, .page = page, .args = "tau=1"};
        free(run_decode(m, &always, n_prompt, steps, n_seq, &st));
        assert_true(st.policy_corrections > 0);
        free(ref);
    }
}

static void test_sparse_tiers_gqa(void **state) {
    (void)state;
    check_sparse_tiers(g_gqa, 150, 8, 48, NULL);
    check_sparse_tiers(g_gqa, 150, 8, 48, "summary=centre"); /* key reads from workers, both tiers */
}

static void test_sparse_tiers_mha(void **state) {
    (void)state;
    check_sparse_tiers(g_mha, 90, 8, 40, NULL);
    check_sparse_tiers(g_mha, 90, 8, 40, "summary=centre,scale=sqrt");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_highest_bound_and_hint),       cmocka_unit_test(test_speculation_and_correction),
        cmocka_unit_test(test_tau_bounds_correction),        cmocka_unit_test(test_prefill_seeds_first_step),
        cmocka_unit_test(test_lazy_speculation_scores_once), cmocka_unit_test(test_late_selection_is_exact),
        cmocka_unit_test(test_budget_covers_candidates),     cmocka_unit_test(test_bad_args),
        cmocka_unit_test(test_centre_summary_is_tighter),
        cmocka_unit_test(test_scale_head_dim_256),           cmocka_unit_test(test_paper_sink_recent_pages),
        cmocka_unit_test(test_full_budget_equals_dense_gqa), cmocka_unit_test(test_full_budget_equals_dense_mha),
        cmocka_unit_test(test_sparse_tiers_gqa),             cmocka_unit_test(test_sparse_tiers_mha),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
