/*
 * test_memplan.c — SpeContext's adaptive memory management.
 *
 * Algorithm 1's thresholds against a hand calculation of the memory model,
 * Algorithm 2's decisions, and a context that crosses thresholds while
 * decoding: layers move to the slow tier one by one from the last, the
 * events are counted, and the logits stay bit-identical to a run that never
 * offloads (budget >= the sequence).
 */
#include "infer/infer.h"
#include "kv/memplan.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void test_thresholds_by_hand(void **state) {
    (void)state;
    ks_memplan_params p = {.model_bytes = 1e9, .dlm_bytes = 1e8, .overhead = 1.3, .n_layer = 4, .n_head_kv = 2,
                           .head_dim = 64, .kv_elem_bytes = 2, .requests = 2, .budget = 100, .dlm_cache = true,
                           .alpha = 0.5, .mem_cap = 2e9};
    /* e = 2 * 2 B * R 2 * H 2 * D 64 = 1024 B per token per layer; fixed = 1.3 * 1.1e9 = 1.43e9 B
     * k offloaded: S_k = floor((2e9 - 1.43e9 - 1024 * k * 100) / (1024 * (4 - k + 1 + 0.5))) */
    int64_t thr[5];
    assert_int_equal(ks_memplan_thresholds(&p, thr), KS_OK);
    for (int k = 0; k < 5; k++) {
        double hand = floor((2e9 - 1.43e9 - 1024.0 * k * 100) / (1024.0 * (4 - k + 1 + 0.5)));
        assert_int_equal(thr[k], (int64_t)hand);
    }
    assert_int_equal(thr[0], 101207); /* 5.7e8 / 5632 */
    /* the model at a threshold fits, one token more does not */
    assert_true(ks_memplan_bytes(&p, 4, thr[0]) <= p.mem_cap);
    assert_true(ks_memplan_bytes(&p, 4, thr[0] + 1) > p.mem_cap);
    /* Algorithm 2 */
    assert_int_equal(ks_memplan_offloaded_at(thr, 4, 1000), 0);
    assert_int_equal(ks_memplan_offloaded_at(thr, 4, thr[0] + 1), 1);
    assert_int_equal(ks_memplan_offloaded_at(thr, 4, thr[3]), 3);
    assert_int_equal(ks_memplan_offloaded_at(thr, 4, thr[4] + 1), 5);
    /* a cap below the weights never fits */
    p.mem_cap = 1e9;
    assert_int_equal(ks_memplan_thresholds(&p, thr), KS_OK);
    assert_true(thr[0] < 0 && thr[4] < 0);
    assert_int_equal(ks_memplan_offloaded_at(thr, 4, 0), 5);
    p.requests = 0;
    assert_int_equal(ks_memplan_thresholds(&p, thr), KS_ERR_INVALID_ARG);
}

static ks_model *g_m;

static float *decode_run(const char *policy, double mem_cap, int n_prompt, int steps, int *offloaded, uint64_t *events,
                         int64_t *thr0, double *alpha) {
    ks_context_params p = ks_context_default_params();
    p.n_ctx = 128;
    p.n_threads = 2;
    p.policy = policy;
    p.budget = 32;
    p.page = 8;
    p.window = 8;
    p.mem_cap = mem_cap;
    ks_context *c = NULL;
    if (ks_context_create(g_m, p, &c) != KS_OK) fail_msg("context: %s", ks_last_error());
    int32_t V = g_m->hp.n_vocab, prompt[128];
    for (int i = 0; i < n_prompt; i++) prompt[i] = (i * 13 + 5) % V;
    float *logits = malloc(sizeof(float) * V), *out = malloc(sizeof(float) * (size_t)steps * V);
    assert_int_equal(ks_prefill(c, 0, prompt, n_prompt, logits, NULL), KS_OK);
    for (int t = 0; t < steps; t++) {
        int32_t best = 0, seq = 0;
        for (int32_t j = 1; j < V; j++) best = logits[j] > logits[best] ? j : best;
        if (ks_decode(c, &seq, &best, 1, logits) != KS_OK) fail_msg("decode: %s", ks_last_error());
        memcpy(out + (size_t)t * V, logits, sizeof(float) * V);
    }
    ks_memplan_info pl;
    ks_context_memplan(c, &pl);
    ks_stats st;
    ks_context_stats(c, &st);
    *offloaded = pl.offloaded;
    *events = st.kv_offload_events;
    if (thr0) *thr0 = pl.thresholds[0];
    if (alpha) *alpha = pl.alpha;
    for (int l = 0; l < g_m->hp.n_layer; l++) /* offloaded layers are the last ones */
        assert_int_equal(ks_kv_layer_tier(c->kv, l) == KS_TIER_SLOW, l >= g_m->hp.n_layer - pl.offloaded);
    free(logits);
    ks_context_destroy(c);
    return out;
}

static void check_policy(const char *policy) {
    int off = 0;
    uint64_t ev = 0;
    int64_t thr0 = 0;
    double alpha = 0;
    size_t bytes = sizeof(float) * 60 * g_m->hp.n_vocab;
    float *ref = decode_run(policy, 0, 40, 60, &off, &ev, NULL, NULL);
    assert_int_equal(off, 0);
    free(decode_run(policy, 1e12, 40, 2, &off, &ev, NULL, &alpha)); /* the measured alpha */
    /* a cap whose first threshold sits near S = 60 */
    double e = 2.0 * 2 * g_m->hp.n_head_kv * g_m->hp.head_dim;
    double cap = 1.3 * (double)g_m->weight_bytes + e * (g_m->hp.n_layer + alpha) * 60;
    float *got = decode_run(policy, cap, 40, 60, &off, &ev, &thr0, NULL);
    if (!(thr0 >= 59 && thr0 <= 61)) fail_msg("%s: first threshold %lld, expected 60", policy, (long long)thr0);
    assert_true(off >= 1);
    assert_int_equal((int)ev, off);
    assert_memory_equal(got, ref, bytes);
    free(ref);
    free(got);
}

static void test_offload_while_decoding(void **state) {
    (void)state;
    assert_int_equal(ks_model_load(ks_test_fixture("models/aidreams260K.gguf"), ks_model_default_params(), &g_m), KS_OK);
    check_policy("dense");
    check_policy("quest");
    /* a cap that cannot hold the weights is refused up front */
    ks_context_params cp = ks_context_default_params();
    cp.n_ctx = 64;
    cp.budget = 64;
    cp.mem_cap = 1000;
    ks_context *c = NULL;
    assert_int_equal(ks_context_create(g_m, cp, &c), KS_ERR_NOMEM);
    cp.budget = 0; /* and a cap needs a budget */
    cp.mem_cap = 1e9;
    assert_int_equal(ks_context_create(g_m, cp, &c), KS_ERR_INVALID_ARG);
    ks_model_destroy(g_m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_thresholds_by_hand),
        cmocka_unit_test(test_offload_while_decoding),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
