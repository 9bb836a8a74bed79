/*
 * test_p_topp.c — the `+topp` refining stage (src/policies/p_topp.c).
 *
 * 1. The parser: topp comes last, after an optional evictor and selector;
 *    p is a number in (0, 1].
 * 2. The pruning on hand-made keys (a fake env serving read_keys): the kept
 *    picks are the heaviest, and the smallest such set with the sinks and
 *    the window holds a share p of the exact group-mean softmax mass over
 *    the attended set; page picks prune to entries; p = 1 and a call without
 *    queries leave the answer alone.
 * 3. The engine: POLICY+topp at p = 1 gives the policy's logits bit for bit
 *    (a binding budget, with and without a slow-tier layer, an evictor in
 *    front); at p < 1 it prunes (counters: kept < picked) and the per-head
 *    extremes are reported.  (A covering budget equals dense:
 *    test_policy.c; no allocation in a step: test_step_alloc.c.)
 */
#define _GNU_SOURCE
#include "infer/infer.h"
#include "kvsieve_select.h"
#include "policies/registry.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* --------------------------------------------------------- parser -- */
static void test_parse(void **state) {
    (void)state;
    ks_policy_spec s;
    assert_int_equal(ks_policy_spec_parse("quest+topp", "p=0.9", 64, 4, 8, -1, &s), KS_OK);
    assert_int_equal(s.n_parts, 2);
    assert_int_equal(ks_policy_spec_parse("snapkv+quest+topp", NULL, 64, 4, 8, -1, &s), KS_OK);
    assert_int_equal(s.n_parts, 3);
    assert_int_equal(ks_policy_spec_parse("topp", NULL, 64, 4, 8, -1, &s), KS_OK);
    assert_int_equal(ks_policy_spec_parse("snapkv+topp", NULL, 64, 4, 8, -1, &s), KS_OK);
    assert_int_equal(ks_policy_spec_parse("topp+quest", NULL, 64, 4, 8, -1, &s), KS_ERR_INVALID_ARG);
    assert_non_null(strstr(ks_last_error(), "comes last"));
    assert_int_equal(ks_policy_spec_parse("quest+topp+topp", NULL, 64, 4, 8, -1, &s), KS_ERR_INVALID_ARG);
    assert_int_equal(ks_policy_spec_parse("snapkv+quest+h2o", NULL, 64, 4, 8, -1, &s), KS_ERR_INVALID_ARG);
    assert_int_equal(ks_policy_spec_parse("quest+snapkv+topp", NULL, 64, 4, 8, -1, &s), KS_ERR_INVALID_ARG);
    assert_int_equal(ks_policy_spec_parse("quest", "p=0.9", 64, 4, 8, -1, &s), KS_ERR_INVALID_ARG); /* quest takes no p */
    char scoped[128] = "";
    assert_int_equal(ks_policy_args_scope("quest+topp", "topp.p=0.5,quest.group=mean", false, scoped, sizeof scoped),
                     KS_OK);
    assert_string_equal(scoped, "p=0.5,group=mean");
    /* the selection API over a caller's cache serves a selector + topp, not an evictor's chain */
    kvs_selector_params sp = kvs_selector_default_params();
    sp.n_layer = 2, sp.n_head = 4, sp.n_head_kv = 2, sp.head_dim = 16, sp.n_ctx = 64, sp.page_size = 8;
    sp.budget = 32, sp.sink = 4, sp.window = 8;
    kvs_selector *sel = NULL;
    assert_int_equal(kvs_selector_create("quest+topp", &sp, &sel), KVS_OK);
    kvs_selector_destroy(sel);
    sel = NULL;
    assert_int_equal(kvs_selector_create("snapkv+quest+topp", &sp, &sel), KVS_ERR_UNSUPPORTED);
    assert_null(sel);
}

/* ------------------------------------------------- hand-made keys -- */
enum { N = 40, HD = 4, G = 2, PG = 4 };
static float g_keys[N][HD];

static ks_status fake_read_keys(void *svc, int32_t seq, int32_t layer, int32_t head, int32_t first, int32_t n,
                                float *out) {
    (void)svc, (void)seq, (void)layer, (void)head;
    if (first < 0 || first + n > N) return KS_FAIL(KS_ERR_INVALID_ARG, "keys out of range");
    memcpy(out, g_keys[first], sizeof(float) * HD * (size_t)n);
    return KS_OK;
}
static int32_t fake_n_entries(void *ctx, int32_t seq, int32_t layer, int32_t head) {
    (void)ctx, (void)seq, (void)layer, (void)head;
    return N;
}
static void fake_page_meta(void *ctx, int32_t seq, int32_t layer, int32_t head, int32_t lp, ks_kv_page_meta *out) {
    (void)ctx, (void)seq, (void)layer, (void)head, (void)lp;
    memset(out, 0, sizeof *out);
}

static const ks_kv_meta_src g_meta = {.page_size = PG, .n_entries = fake_n_entries, .page_meta = fake_page_meta};

static ks_policy *make_topp(const char *args) {
    ks_policy_env env = {.n_layer = 1, .n_head = G, .n_head_kv = 1, .head_dim = HD, .n_seq = 1, .n_ctx = N,
                         .read_keys = fake_read_keys, .meta = &g_meta};
    ks_policy *pol = NULL;
    assert_int_equal(ks_test_policy_create("topp", args, 16, 2, 3, 0, &env, &pol), KS_OK);
    return pol;
}

/* The group-mean softmax mass of every attended entry (in[e]), reference in double. */
static void masses(const float *q, const bool *in, double *w) {
    double tot[G] = {0}, mx[G];
    for (int g = 0; g < G; g++) mx[g] = -INFINITY;
    double lg[G][N];
    for (int g = 0; g < G; g++)
        for (int e = 0; e < N; e++) {
            if (!in[e]) continue;
            double d = 0;
            for (int t = 0; t < HD; t++) d += (double)q[g * HD + t] * g_keys[e][t];
            lg[g][e] = d / sqrt((double)HD);
            if (lg[g][e] > mx[g]) mx[g] = lg[g][e];
        }
    for (int g = 0; g < G; g++)
        for (int e = 0; e < N; e++)
            if (in[e]) tot[g] += exp(lg[g][e] - mx[g]);
    for (int e = 0; e < N; e++) {
        w[e] = 0;
        for (int g = 0; g < G && in[e]; g++) w[e] += exp(lg[g][e] - mx[g]) / tot[g] / G;
    }
}

/* Run the stage on `picks` (entries, or pages) and check the answer against the reference. */
static void check_prune(ks_policy *pol, double p, const int32_t *picks, int32_t n_picks, bool pages, bool all) {
    float q[G * HD];
    for (int i = 0; i < G * HD; i++) q[i] = 2.0f * sinf((float)(i * 3 + 1));
    int32_t idx[N];
    ks_select_req req = {.row = 0, .seq = 0, .layer = 0, .head = 0, .pos = N - 1, .n_entries = N, .q = q,
                         .n_select = 11, .sink = 2, .window = 3};
    /* the stage alone prunes every entry; emulate the selector's answer by a
     * selection handed to the refine hook through ks_policy_select's path:
     * topp alone answers `all` first, so for picks the hook is called directly */
    ks_selection sel = {.cap = N, .idx = idx};
    const ks_policy_i *vt = ks_policy_find("topp");
    if (all) {
        assert_int_equal(ks_policy_select(pol, &req, &sel), KS_OK);
    } else {
        memcpy(idx, picks, sizeof(int32_t) * (size_t)n_picks);
        sel.n = n_picks;
        sel.pages = pages;
        void *st = NULL;
        ks_policy_env env = {.n_layer = 1, .n_head = G, .n_head_kv = 1, .head_dim = HD, .n_seq = 1, .n_ctx = N,
                             .read_keys = fake_read_keys, .meta = &g_meta};
        ks_policy_spec spec;
        char args[32];
        snprintf(args, sizeof args, "p=%.17g", p);
        assert_int_equal(ks_policy_spec_parse("topp", args, 16, 2, 3, 0, &spec), KS_OK);
        assert_int_equal(vt->create(&env, &spec, &st), KS_OK);
        assert_int_equal(vt->refine->refine(st, &req, &sel), KS_OK);
        vt->destroy(st);
    }
    bool cand[N] = {0}, in[N] = {0}, kept[N] = {0};
    if (all)
        for (int e = 0; e < N; e++) cand[e] = true;
    for (int i = 0; i < n_picks; i++)
        for (int e = pages ? picks[i] * PG : picks[i]; e < (pages ? (picks[i] + 1) * PG : picks[i] + 1) && e < N; e++)
            cand[e] = true; /* out-of-range picks are ignored */
    for (int e = 0; e < N; e++) {
        bool fixed = e < 2 || e >= N - 3;
        in[e] = cand[e] || fixed;
        if (fixed) cand[e] = false;
    }
    double w[N];
    masses(q, in, w);
    assert_false(sel.all);
    assert_false(sel.pages);
    double mass = 0, lightest = INFINITY;
    for (int e = 0; e < N; e++) mass += (e < 2 || e >= N - 3) ? w[e] : 0;
    for (int i = 0; i < sel.n; i++) {
        int32_t e = sel.idx[i];
        assert_true(cand[e]);
        assert_false(kept[e]); /* no duplicates */
        kept[e] = true;
        mass += w[e];
        if (w[e] < lightest) lightest = w[e];
    }
    assert_true(mass >= p - 1e-5);                         /* holds p */
    if (sel.n) assert_true(mass - lightest < p + 1e-5);     /* and is the smallest such set */
    for (int e = 0; e < N; e++)
        if (cand[e] && !kept[e]) assert_true(w[e] <= lightest + 1e-6); /* the heaviest picks are the ones kept */
}

static void test_prune_hand_made(void **state) {
    (void)state;
    for (int e = 0; e < N; e++)
        for (int t = 0; t < HD; t++) g_keys[e][t] = 1.5f * cosf((float)(e * 7 + t * 5)) + (e % 9 == 4 ? 1.0f : 0.0f);
    const double ps[] = {0.5, 0.8, 0.95, 0.999};
    int32_t picks[] = {5, 9, 13, 14, 20, 21, 22, 30, 33, 2, 9}; /* a sink and a duplicate among them */
    int32_t pages[] = {1, 4, 6, 9, 12};                           /* 12 is out of range: ignored */
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
        char args[32];
        snprintf(args, sizeof args, "p=%.17g", ps[i]);
        ks_policy *pol = make_topp(args);
        check_prune(pol, ps[i], NULL, 0, false, true);
        check_prune(pol, ps[i], picks, 11, false, false);
        check_prune(pol, ps[i], pages, 5, true, false);
        ks_policy_counters c;
        ks_policy_get_counters(pol, &c);
        assert_int_equal(c.topp_refined, 1); /* the direct hook calls count in their own instances */
        assert_true(c.topp_kept <= c.topp_picked);
        assert_true(c.topp_head_min == c.topp_head_max && c.topp_head_min == (double)c.topp_kept);
        ks_policy_destroy(pol);
    }
    /* p = 1 and a prefetch without queries leave the selector's answer alone */
    ks_policy *pol = make_topp("p=1");
    int32_t idx[N];
    float q[G * HD] = {1};
    ks_select_req req = {.n_entries = N, .q = q, .n_select = 11, .sink = 2, .window = 3};
    ks_selection sel = {.cap = N, .idx = idx};
    assert_int_equal(ks_policy_select(pol, &req, &sel), KS_OK);
    assert_true(sel.all);
    ks_policy_destroy(pol);
    pol = make_topp("p=0.5");
    req.q = NULL;
    assert_int_equal(ks_policy_select(pol, &req, &sel), KS_OK);
    assert_true(sel.all);
    ks_policy_counters c;
    ks_policy_get_counters(pol, &c);
    assert_int_equal(c.topp_refined, 0);
    ks_policy_destroy(pol);
    /* bad arguments */
    ks_policy_env env = {.n_layer = 1, .n_head = G, .n_head_kv = 1, .head_dim = HD, .n_seq = 1, .n_ctx = N,
                         .read_keys = fake_read_keys, .meta = &g_meta};
    assert_int_equal(ks_test_policy_create("topp", "p=0", 16, 2, 3, 0, &env, &pol), KS_ERR_INVALID_ARG);
    assert_int_equal(ks_test_policy_create("topp", "p=1.01", 16, 2, 3, 0, &env, &pol), KS_ERR_INVALID_ARG);
    assert_int_equal(ks_test_policy_create("topp", "p=x", 16, 2, 3, 0, &env, &pol), KS_ERR_INVALID_ARG);
    env.read_keys = NULL;
    assert_int_equal(ks_test_policy_create("topp", NULL, 16, 2, 3, 0, &env, &pol), KS_ERR_INVALID_ARG);
}

/* ------------------------------------------------------- engine -- */
static ks_model *g_model;
static char g_path[256], g_dir[256];

static int setup(void **state) {
    (void)state;
    snprintf(g_path, sizeof g_path, "/tmp/kvsieve-test-topp-%d.gguf", (int)getpid());
    if (ks_test_tiny_llama(3, 5, g_path, &g_model) != 0) return -1;
    snprintf(g_dir, sizeof g_dir, "/tmp/kvsieve-test-topp-XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    ks_model_destroy(g_model);
    unlink(g_path);
    rmdir(g_dir);
    return 0;
}

enum { NP = 150, STEPS = 5 };

/* Prefill one prompt, decode STEPS greedy steps: every step's logits [STEPS][V]. */
static float *run(const char *policy, const char *args, int32_t offload, ks_stats *stats) {
    ks_context_params p = ks_context_default_params();
    p.n_ctx = NP + STEPS + 1;
    p.n_threads = 2;
    p.n_batch = 64;
    p.policy = policy;
    p.policy_args = args;
    p.budget = 48;
    p.page = 8;
    p.sink = 4;
    p.window = 8;
    p.kv_offload_layers = offload;
    p.kv_offload_dir = offload ? g_dir : NULL;
    ks_context *c = NULL;
    if (ks_context_create(g_model, p, &c) != KS_OK) fail_msg("%s: %s", policy, ks_last_error());
    int32_t V = g_model->hp.n_vocab, prompt[NP];
    for (int i = 0; i < NP; i++) prompt[i] = (i * 37 + 11) % V;
    float *out = malloc(sizeof(float) * (size_t)(STEPS + 1) * V);
    assert_int_equal(ks_prefill(c, 0, prompt, NP, out, NULL), KS_OK);
    for (int t = 0; t < STEPS; t++) {
        const float *row = out + (size_t)t * V;
        int32_t best = 0, seq = 0;
        for (int32_t j = 1; j < V; j++) best = row[j] > row[best] ? j : best;
        assert_int_equal(ks_decode(c, &seq, &best, 1, out + (size_t)(t + 1) * V), KS_OK);
    }
    if (stats) ks_context_stats(c, stats);
    ks_context_destroy(c);
    return out;
}

static void test_p1_equals_policy(void **state) {
    (void)state;
    const char *bases[] = {"quest", "h2o", "streaming", "snapkv+quest", "freekv", "chess", "dapq+quest"};
    size_t bytes = sizeof(float) * (size_t)(STEPS + 1) * g_model->hp.n_vocab;
    for (size_t i = 0; i < sizeof bases / sizeof bases[0]; i++)
        for (int32_t off = 0; off <= 1; off++) {
            char name[64];
            snprintf(name, sizeof name, "%s+topp", bases[i]);
            float *ref = run(bases[i], NULL, off, NULL);
            float *got = run(name, "p=1", off, NULL);
            if (memcmp(ref, got, bytes)) fail_msg("%s at p=1 differs from %s (offload %d)", name, bases[i], off);
            free(ref);
            free(got);
        }
}

static void test_prunes(void **state) {
    (void)state;
    ks_stats st;
    free(run("quest+topp", "p=0.9", 0, &st));
    assert_true(st.policy_topp_refined > 0);
    assert_true(st.policy_topp_kept < st.policy_topp_picked);
    assert_true(st.policy_topp_head_min <= st.policy_topp_head_max);
    assert_true(st.policy_topp_head_max > 0);
    /* quest keeps 2 of 3 layers dense: 1 layer x n_head_kv heads x STEPS steps */
    assert_int_equal(st.policy_topp_refined, (uint64_t)g_model->hp.n_head_kv * STEPS);
    /* a smaller p keeps fewer */
    ks_stats lo;
    free(run("quest+topp", "p=0.5", 0, &lo));
    assert_int_equal(lo.policy_topp_refined, st.policy_topp_refined);
    assert_true(lo.policy_topp_kept < st.policy_topp_kept);
    /* topp alone prunes every entry of the head, every layer */
    free(run("topp", "p=0.9", 1, &st));
    assert_int_equal(st.policy_topp_refined, (uint64_t)g_model->hp.n_head_kv * STEPS * g_model->hp.n_layer);
    assert_true(st.policy_topp_kept < st.policy_topp_picked);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_prune_hand_made),
        cmocka_unit_test(test_p1_equals_policy),
        cmocka_unit_test(test_prunes),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
