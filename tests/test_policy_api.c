/*
 * test_policy_api.c — the public selection API over a caller-owned KV
 * (include/kvsieve_select.h, src/select/select_api.c) and the policy
 * registry behind it and the docs.
 *
 * 1. Registry: kvs_policy_get agrees with the registry; every policy is
 *    served or refused with KVS_ERR_UNSUPPORTED (and *out untouched);
 *    unknown names, compositions, bad shapes and bad arguments fail cleanly.
 * 2. Exactness: every served policy, with a budget covering the entries,
 *    selects every entry at every step and layer (iterating the registry).
 * 3. Views: f16 and f32 keys holding the same values, packed or strided,
 *    and caller page summaries vs the selector's own give identical
 *    selections (quest, chess, freekv: the page-summary readers).
 * 4. Contracts: select before begin_step, a shrinking view, a short buffer
 *    (KVS_ERR_BUFFER_TOO_SMALL with the size, state unchanged).
 * 5. Selections with known answers: quest finds the page aligned with the
 *    query, h2o keeps the entries fed the most weight, streaming keeps the
 *    entries before the window.
 * 6. docs/POLICIES.md's policy table lists exactly the registry's names.
 */
#define _GNU_SOURCE
#include "kvsieve_select.h"
#include "policies/registry.h"
#include "tensor/dtype.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { NL = 2, NH = 4, NKV = 2, G = NH / NKV, HD = 32, NCTX = 256, NPROMPT = 160, P = 16 };

typedef struct {
    float k32[NL * NKV][NCTX][HD];
    ks_f16 k16[NL * NKV][NCTX][HD];
    float kmin[NL * NKV][NCTX / P][HD], kmax[NL * NKV][NCTX / P][HD], ksum[NL * NKV][NCTX / P][HD];
    kvs_head_kv kv[NL * NKV];
    float q[NL * NKV][G * HD];
} fixture;

static uint64_t g_rng;
static float rnd(void) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_rng >> 40) & 0xFFFF) / 32768.0f - 1.0f;
}

/* Keys representable in f16 (so the f16 and f32 views hold the same values). */
static void fill_key(fixture *f, int i, int e) {
    for (int d = 0; d < HD; d++) {
        f->k16[i][e][d] = ks_f32_to_f16(rnd());
        f->k32[i][e][d] = ks_f16_to_f32(f->k16[i][e][d]);
    }
}

static void summarise(fixture *f, int i, int n) {
    for (int p = 0; p * P < n; p++)
        for (int d = 0; d < HD; d++) {
            float mn = INFINITY, mx = -INFINITY, s = 0;
            for (int e = p * P; e < n && e < (p + 1) * P; e++) {
                float x = f->k32[i][e][d];
                mn = x < mn ? x : mn;
                mx = x > mx ? x : mx;
                s += x;
            }
            f->kmin[i][p][d] = mn, f->kmax[i][p][d] = mx, f->ksum[i][p][d] = s;
        }
}

typedef enum { VIEW_F32, VIEW_F16, VIEW_F32_SUMMARIES } view_kind;

static void setup_fixture(fixture *f, view_kind vk) {
    g_rng = 7;
    for (int i = 0; i < NL * NKV; i++) {
        for (int e = 0; e < NPROMPT; e++) fill_key(f, i, e);
        f->kv[i] = (kvs_head_kv){.n_entries = NPROMPT};
        if (vk == VIEW_F16) f->kv[i].keys = (kvs_view){.data = f->k16[i], .type = KVS_TYPE_F16};
        else f->kv[i].keys = (kvs_view){.data = f->k32[i], .type = KVS_TYPE_F32, .row_stride = sizeof f->k32[i][0]};
        if (vk == VIEW_F32_SUMMARIES) {
            f->kv[i].page_kmin = &f->kmin[i][0][0];
            f->kv[i].page_kmax = &f->kmax[i][0][0];
            f->kv[i].page_ksum = &f->ksum[i][0][0];
            summarise(f, i, NPROMPT);
        }
    }
}

static kvs_selector_params params(int32_t budget) {
    kvs_selector_params p = kvs_selector_default_params();
    p.n_layer = NL, p.n_head = NH, p.n_head_kv = NKV, p.head_dim = HD, p.n_ctx = NCTX, p.page_size = P;
    p.budget = budget, p.sink = 4, p.window = 16, p.dense_layers = 0;
    return p;
}

/* Decode `steps` steps; selections of every (step, layer, head) into sel
 * [steps][NL * NKV][NCTX] (-1 padded), counts into n. */
static void decode(const char *policy, kvs_selector_params p, view_kind vk, int steps, int32_t *sel, int32_t *n) {
    static fixture f;
    setup_fixture(&f, vk);
    kvs_selector *s = NULL;
    assert_int_equal(kvs_selector_create(policy, &p, &s), KVS_OK);
    int32_t obs = kvs_selector_obs_window(s) < 0 ? 4 : kvs_selector_obs_window(s);
    if (obs > 0) {
        float *q = malloc(sizeof(float) * NL * obs * NH * HD);
        for (int i = 0; i < NL * obs * NH * HD; i++) q[i] = rnd();
        assert_int_equal(kvs_selector_prefill(s, f.kv, q, obs), KVS_OK);
        free(q);
    }
    int32_t idx[NCTX], w_n = 0;
    float w[NCTX];
    for (int t = 0; t < steps; t++) {
        int32_t pos = NPROMPT + t;
        kvs_step st = {.pos = pos, .entropy = NAN, .varentropy = NAN};
        assert_int_equal(kvs_selector_begin_step(s, f.kv, &st), KVS_OK);
        for (int l = 0; l < NL; l++)
            for (int h = 0; h < NKV; h++) {
                int i = l * NKV + h;
                fill_key(&f, i, pos);
                f.kv[i].n_entries = pos + 1;
                if (vk == VIEW_F32_SUMMARIES) summarise(&f, i, pos + 1);
                for (int k = 0; k < G * HD; k++) f.q[i][k] = rnd();
                kvs_selection out = {.idx = idx, .cap = NCTX};
                kvs_status rc = kvs_selector_select(s, f.kv, l, h, &(kvs_view){.data = f.q[i], .type = KVS_TYPE_F32}, &out);
                if (rc != KVS_OK) fail_msg("%s: %s", policy, kvs_last_error());
                int32_t *row = sel + ((size_t)t * NL * NKV + i) * NCTX;
                for (int k = 0; k < NCTX; k++) row[k] = k < out.n ? out.idx[k] : -1;
                n[t * NL * NKV + i] = out.n;
                for (int k = 1; k < out.n; k++) assert_true(out.idx[k] > out.idx[k - 1]); /* ascending, unique */
                assert_true(out.all == (out.n == pos + 1));
                w_n = out.n;
                for (int k = 0; k < w_n; k++) w[k] = 1.0f / (float)(1 + k % 7);
                assert_int_equal(kvs_selector_feedback(s, l, h, idx, w, w_n), KVS_OK);
            }
    }
    kvs_selector_destroy(s);
}

/* ------------------------------------------------------------- tests -- */
static void test_registry(void **state) {
    (void)state;
    const ks_policy_i *const *reg = ks_policy_list();
    int32_t n = 0;
    while (reg[n]) n++;
    assert_int_equal(kvs_policy_count(), n);
    int served = 0;
    for (int32_t i = 0; i < n; i++) {
        kvs_policy_info info;
        assert_int_equal(kvs_policy_get(i, &info), KVS_OK);
        assert_string_equal(info.name, reg[i]->name);
        assert_non_null(info.summary);
        assert_non_null(info.args);
        assert_true(info.api == (!ks_policy_i_needs_dlm(reg[i]) && !ks_policy_i_evicts(reg[i])));
        kvs_selector_params p = params(64);
        kvs_selector *s = (kvs_selector *)&served; /* must stay untouched on failure */
        kvs_status st = kvs_selector_create(info.name, &p, &s);
        if (info.api) {
            assert_int_equal(st, KVS_OK);
            kvs_selector_destroy(s);
            served++;
        } else {
            assert_int_equal(st, KVS_ERR_UNSUPPORTED);
            assert_ptr_equal(s, (kvs_selector *)&served);
            assert_non_null(strstr(kvs_last_error(), info.name));
        }
    }
    assert_true(served >= 5); /* dense, streaming, quest, h2o, lrqk/chess at least */
    kvs_policy_info info;
    assert_int_equal(kvs_policy_get(n, &info), KVS_ERR_INVALID_ARG);
    kvs_selector_params p = params(64);
    kvs_selector *s = NULL;
    assert_int_equal(kvs_selector_create("nope", &p, &s), KVS_ERR_NOT_FOUND);
    assert_non_null(strstr(kvs_last_error(), "quest")); /* lists the known ones */
    assert_int_equal(kvs_selector_create("snapkv+quest", &p, &s), KVS_ERR_UNSUPPORTED);
    p.args = "bogus=1";
    assert_int_equal(kvs_selector_create("quest", &p, &s), KVS_ERR_INVALID_ARG);
    p = params(64);
    p.n_head = 3;
    assert_int_equal(kvs_selector_create("quest", &p, &s), KVS_ERR_INVALID_ARG);
    assert_null(s);
    kvs_selector_destroy(NULL);
    assert_string_equal(kvs_status_str(KVS_ERR_BUFFER_TOO_SMALL), "buffer too small");
}

static void test_full_budget_selects_all(void **state) {
    (void)state;
    enum { STEPS = 5 };
    static int32_t sel[STEPS * NL * NKV * NCTX], n[STEPS * NL * NKV];
    for (int32_t i = 0; i < kvs_policy_count(); i++) {
        kvs_policy_info info;
        assert_int_equal(kvs_policy_get(i, &info), KVS_OK);
        if (!info.api) continue;
        for (int vk = VIEW_F32; vk <= VIEW_F32_SUMMARIES; vk++) {
            decode(info.name, params(NPROMPT + STEPS), (view_kind)vk, STEPS, sel, n);
            for (int t = 0; t < STEPS; t++)
                for (int k = 0; k < NL * NKV; k++)
                    if (n[t * NL * NKV + k] != NPROMPT + t + 1)
                        fail_msg("%s: step %d head %d selected %d of %d", info.name, t, k, n[t * NL * NKV + k],
                                 NPROMPT + t + 1);
        }
    }
}

static void test_views_agree(void **state) {
    (void)state;
    enum { STEPS = 6 };
    static int32_t a[STEPS * NL * NKV * NCTX], b[STEPS * NL * NKV * NCTX], na[STEPS * NL * NKV], nb[STEPS * NL * NKV];
    for (int32_t i = 0; i < kvs_policy_count(); i++) {
        kvs_policy_info info;
        assert_int_equal(kvs_policy_get(i, &info), KVS_OK);
        if (!info.api) continue;
        kvs_selector_params p = params(64);
        decode(info.name, p, VIEW_F32, STEPS, a, na);
        decode(info.name, p, VIEW_F16, STEPS, b, nb);
        if (memcmp(a, b, sizeof a) || memcmp(na, nb, sizeof na)) fail_msg("%s: f16 and f32 views differ", info.name);
        if (!info.page_summaries) continue;
        decode(info.name, p, VIEW_F32_SUMMARIES, STEPS, b, nb);
        if (memcmp(a, b, sizeof a) || memcmp(na, nb, sizeof na))
            fail_msg("%s: caller summaries and the selector's own differ", info.name);
    }
    /* a real budget selects less than everything somewhere */
    decode("quest", params(64), VIEW_F32, STEPS, a, na);
    assert_true(na[STEPS * NL * NKV - 1] < NPROMPT + STEPS);
}

static void test_contracts(void **state) {
    (void)state;
    static fixture f;
    setup_fixture(&f, VIEW_F32);
    kvs_selector_params p = params(48);
    kvs_selector *s = NULL;
    assert_int_equal(kvs_selector_create("lrqk", &p, &s), KVS_OK);
    int32_t idx[NCTX];
    kvs_view q = {.data = f.q[0], .type = KVS_TYPE_F32};
    kvs_selection out = {.idx = idx, .cap = NCTX};
    assert_int_equal(kvs_selector_select(s, f.kv, 0, 0, &q, &out), KVS_ERR_INVALID_ARG); /* no begin_step */
    kvs_step st = {.pos = NPROMPT, .entropy = NAN, .varentropy = NAN};
    assert_int_equal(kvs_selector_begin_step(s, f.kv, &st), KVS_OK);
    f.kv[0].n_entries = NPROMPT + 1;
    for (int k = 0; k < G * HD; k++) f.q[0][k] = rnd();
    kvs_selection small = {.idx = idx, .cap = 10};
    assert_int_equal(kvs_selector_select(s, f.kv, 0, 0, &q, &small), KVS_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(small.n, NPROMPT + 1);
    assert_int_equal(kvs_selector_select(s, f.kv, 0, 0, &q, &out), KVS_OK);
    int32_t first[NCTX], n1 = out.n;
    memcpy(first, idx, sizeof(int32_t) * (size_t)n1);
    assert_true(n1 < NPROMPT + 1 && n1 >= 48);
    assert_int_equal(kvs_selector_select(s, f.kv, 2, 0, &q, &out), KVS_ERR_INVALID_ARG); /* layer */
    kvs_view bad = {.data = f.q[0], .type = (kvs_type)9};
    assert_int_equal(kvs_selector_select(s, f.kv, 0, 0, &bad, &out), KVS_ERR_INVALID_ARG);
    f.kv[0].n_entries = NPROMPT - 1; /* entries are append-only */
    assert_int_equal(kvs_selector_begin_step(s, f.kv, &st), KVS_ERR_INVALID_ARG);
    f.kv[0].n_entries = NPROMPT + 1;
    int32_t bad_idx = NCTX + 5;
    float w1 = 1;
    assert_int_equal(kvs_selector_feedback(s, 0, 0, &bad_idx, &w1, 1), KVS_ERR_INVALID_ARG);
    /* the short buffer changed nothing: a fresh selector answers the same */
    kvs_selector_destroy(s);
    setup_fixture(&f, VIEW_F32);
    assert_int_equal(kvs_selector_create("lrqk", &p, &s), KVS_OK);
    assert_int_equal(kvs_selector_begin_step(s, f.kv, &st), KVS_OK);
    f.kv[0].n_entries = NPROMPT + 1;
    for (int k = 0; k < G * HD; k++) f.q[0][k] = rnd();
    assert_int_equal(kvs_selector_select(s, f.kv, 0, 0, &q, &out), KVS_OK);
    assert_int_equal(out.n, n1);
    assert_memory_equal(idx, first, sizeof(int32_t) * (size_t)n1);
    kvs_selector_reset(s);
    assert_int_equal(kvs_selector_select(s, f.kv, 0, 0, &q, &out), KVS_ERR_INVALID_ARG); /* reset: begin again */
    kvs_selector_destroy(s);
}

static void test_known_answers(void **state) {
    (void)state;
    static fixture f;
    setup_fixture(&f, VIEW_F32);
    int32_t idx[NCTX];
    kvs_selection out = {.idx = idx, .cap = NCTX};
    kvs_step st = {.pos = NPROMPT, .entropy = NAN, .varentropy = NAN};
    for (int i = 0; i < NL * NKV; i++) f.kv[i].n_entries = NPROMPT + 1; /* the step's token is in */
    /* quest: page 3 holds keys along the query */
    for (int e = 3 * P; e < 4 * P; e++)
        for (int d = 0; d < HD; d++) f.k32[0][e][d] = d % 2 ? 3.0f : -3.0f;
    for (int k = 0; k < G * HD; k++) f.q[0][k] = k % 2 ? 1.0f : -1.0f;
    kvs_view q = {.data = f.q[0], .type = KVS_TYPE_F32};
    kvs_selector_params p = params(4 + 16 + P); /* one page beyond sinks and window */
    kvs_selector *s = NULL;
    assert_int_equal(kvs_selector_create("quest", &p, &s), KVS_OK);
    assert_int_equal(kvs_selector_begin_step(s, f.kv, &st), KVS_OK);
    assert_int_equal(kvs_selector_select(s, f.kv, 0, 0, &q, &out), KVS_OK);
    assert_int_equal(out.n, 4 + 16 + P);
    assert_int_equal(idx[4], 3 * P);
    kvs_selector_destroy(s);
    /* h2o: entries fed weight are kept */
    p = params(4 + 16 + 3);
    assert_int_equal(kvs_selector_create("h2o", &p, &s), KVS_OK);
    assert_true(kvs_selector_wants_feedback(s));
    assert_int_equal(kvs_selector_begin_step(s, f.kv, &st), KVS_OK);
    int32_t fed[3] = {40, 77, 100};
    float w[3] = {0.5f, 0.3f, 0.2f};
    assert_int_equal(kvs_selector_select(s, f.kv, 1, 1, &q, &out), KVS_OK);
    assert_int_equal(kvs_selector_feedback(s, 1, 1, fed, w, 3), KVS_OK);
    assert_int_equal(kvs_selector_select(s, f.kv, 1, 1, &q, &out), KVS_OK);
    assert_int_equal(out.n, 4 + 16 + 3);
    assert_int_equal(idx[4], 40);
    assert_int_equal(idx[5], 77);
    assert_int_equal(idx[6], 100);
    kvs_selector_destroy(s);
    /* streaming: the budget - sink entries before the end */
    p = params(40);
    assert_int_equal(kvs_selector_create("streaming", &p, &s), KVS_OK);
    assert_int_equal(kvs_selector_begin_step(s, f.kv, &st), KVS_OK);
    assert_int_equal(kvs_selector_select(s, f.kv, 0, 1, &q, &out), KVS_OK);
    assert_int_equal(out.n, 40);
    for (int k = 0; k < 4; k++) assert_int_equal(idx[k], k);
    for (int k = 4; k < 40; k++) assert_int_equal(idx[k], NPROMPT + 1 - 36 + (k - 4));
    kvs_selector_destroy(s);
}

/* docs/POLICIES.md: the rows of the table under "## Policies" name exactly the registry's policies. */
static void test_docs_list_registry(void **state) {
    (void)state;
    size_t len = 0;
    char *doc = ks_test_read_file(ks_test_source("docs/POLICIES.md"), &len);
    assert_non_null(doc);
    char *sec = strstr(doc, "\n## Policies\n");
    assert_non_null(sec);
    char *end = strstr(sec + 1, "\n## ");
    char *sub = strstr(sec + 1, "\n### ");
    if (sub && (!end || sub < end)) end = sub;
    if (end) *end = 0;
    const ks_policy_i *const *reg = ks_policy_list();
    int n_doc = 0;
    for (char *line = strstr(sec, "\n| `"); line; line = strstr(line + 1, "\n| `")) {
        char name[64];
        assert_int_equal(sscanf(line, "\n| `%63[^`]`", name), 1);
        bool found = false;
        for (int i = 0; reg[i]; i++) found |= !strcmp(reg[i]->name, name);
        if (!found) fail_msg("docs/POLICIES.md lists '%s', which the registry does not have", name);
        n_doc++;
    }
    for (int i = 0; reg[i]; i++) {
        char pat[80];
        snprintf(pat, sizeof pat, "\n| `%s` |", reg[i]->name);
        if (!strstr(sec, pat)) fail_msg("docs/POLICIES.md's policy table lacks '%s'", reg[i]->name);
        if (i + 1 == ks_policy_count()) assert_int_equal(n_doc, i + 1);
    }
    free(doc);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registry),  cmocka_unit_test(test_full_budget_selects_all),
        cmocka_unit_test(test_views_agree), cmocka_unit_test(test_contracts),
        cmocka_unit_test(test_known_answers), cmocka_unit_test(test_docs_list_registry),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
