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
    /* the model over an actual state: R sequences of one length S is the
     * model above; by hand otherwise (e1 = 512 B per token per layer) */
    for (int64_t S = 0; S < 200000; S += 997) {
        ks_memplan_state st = {.tokens_fast = 2 * S, .tokens_all = 2 * S, .longest = S, .active = 2};
        for (int l = 0; l <= 4; l++)
            assert_true(fabs(ks_memplan_bytes_state(&p, l, &st) - ks_memplan_bytes(&p, l, S)) < 1e-3);
        int32_t k = ks_memplan_offloaded_for(&p, &st);
        assert_true(k == ks_memplan_offloaded_at(thr, 4, S) || fabs(ks_memplan_bytes(&p, 4 - k, S) - p.mem_cap) < 1);
    }
    ks_memplan_state one = {.tokens_fast = 1000, .tokens_all = 3000, .longest = 700, .active = 1};
    /* fixed + 512 * (3 * 1000 + 3000 (retrieval cache, parked tokens too) + 0.5 * 2 * 700 + 1 * 100 * 1) */
    assert_true(fabs(ks_memplan_bytes_state(&p, 3, &one) - (1.43e9 + 512.0 * (3000 + 3000 + 700 + 100))) < 1e-3);
    assert_int_equal(ks_memplan_offloaded_for(&p, &one), 0);
    /* a cap below the weights never fits */
    p.mem_cap = 1e9;
    assert_int_equal(ks_memplan_offloaded_for(&p, &one), 5);
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

/* Sliding-window layers: a constant past their window, never offloaded; the
 * thresholds count global layers only. */
static void test_thresholds_local_layers(void **state) {
    (void)state;
    ks_memplan_params p = {.model_bytes = 1e9, .dlm_bytes = 0, .overhead = 1.0, .n_layer = 6, .n_head_kv = 2,
                           .head_dim = 64, .kv_elem_bytes = 2, .requests = 1, .budget = 100, .dlm_cache = false,
                           .alpha = 0, .mem_cap = 1.1e9, .n_local = 5, .window = 1000};
    /* e = 2 * 2 B * 1 * 2 * 64 = 512 B per token per layer; one global layer */
    assert_true(fabs(ks_memplan_bytes(&p, 1, 500) - (1e9 + 512.0 * (500 + 5 * 500))) < 1e-3);
    assert_true(fabs(ks_memplan_bytes(&p, 1, 50000) - (1e9 + 512.0 * (50000 + 5 * 1000))) < 1e-3);
    assert_true(fabs(ks_memplan_bytes(&p, 0, 50000) - (1e9 + 512.0 * (100 + 5 * 1000))) < 1e-3);
    int64_t thr[7];
    assert_int_equal(ks_memplan_thresholds(&p, thr), KS_OK);
    /* k = 0: S = floor((1e8 - 512 * 5 * 1000) / 512) = 190312 */
    assert_int_equal(thr[0], 190312);
    assert_true(ks_memplan_bytes(&p, 1, thr[0]) <= p.mem_cap && ks_memplan_bytes(&p, 1, thr[0] + 1) > p.mem_cap);
    assert_true(thr[1] > thr[0]); /* offloading the global layer: no growth left but the budget */
    for (int k = 2; k <= 6; k++) assert_int_equal(thr[k], -1); /* local layers stay */
    ks_memplan_state st = {.tokens_fast = 200000, .tokens_all = 200000, .longest = 200000, .active = 1};
    assert_int_equal(ks_memplan_offloaded_for(&p, &st), 1);
    /* before the window the local layers grow per token */
    p.mem_cap = 1e9 + 512.0 * 600;
    assert_int_equal(ks_memplan_thresholds(&p, thr), KS_OK);
    assert_int_equal(thr[0], 100); /* 600 / 6 */
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


/* Pause and resume (ks_seq_park / ks_seq_unpark): two sequences decode
 * together; one is parked for some steps while the other goes on (and a
 * layer moves to the slow tier meanwhile), then unparked; every logit of
 * both equals a run that never parked.  While parked: its KV counts in the
 * slow tier, the fast-tier bytes drop, the memory model stops counting it,
 * and decoding it is refused. */
static void park_run(ks_kv_type type, const char *policy, bool park, float *out) {
    ks_context_params p = ks_context_default_params();
    p.n_ctx = 128;
    p.n_seq = 2;
    p.n_threads = 2;
    p.policy = policy;
    p.budget = 32;
    p.page = 8;
    p.window = 8;
    p.kv_type = type;
    p.mem_cap = 1e12; /* a plan that never offloads by itself: the queries are checked */
    ks_context *c = NULL;
    if (ks_context_create(g_m, p, &c) != KS_OK) fail_msg("context: %s", ks_last_error());
    int32_t V = g_m->hp.n_vocab, prompt[64], seqs[2] = {0, 1}, toks[2];
    float *logits = malloc(sizeof(float) * 2 * V);
    for (int s = 0; s < 2; s++) {
        for (int i = 0; i < 30 + 7 * s; i++) prompt[i] = (i * (13 + s) + 5) % V;
        assert_int_equal(ks_prefill(c, s, prompt, 30 + 7 * s, logits + (size_t)s * V, NULL), KS_OK);
    }
    int k = 0;
    for (int t = 0; t < 24; t++) {
        for (int s = 0; s < 2; s++) {
            int32_t best = 0;
            for (int32_t j = 1; j < V; j++) best = logits[(size_t)s * V + j] > logits[(size_t)s * V + best] ? j : best;
            toks[s] = best;
        }
        bool alone = t >= 8 && t < 16; /* sequence 0 sits these steps out (parked or not) */
        if (park && t == 8) {
            int64_t f0, s0, f1, s1;
            ks_mem_fit m0, m1;
            ks_mem_query q = {0};
            assert_int_equal(ks_context_mem_fits(c, &q, &m0), KS_OK);
            ks_context_kv_bytes(c, &f0, &s0);
            assert_int_equal(ks_seq_park(c, 0), KS_OK);
            assert_true(ks_seq_parked(c, 0));
            ks_context_kv_bytes(c, &f1, &s1);
            assert_int_equal(ks_context_mem_fits(c, &q, &m1), KS_OK);
            assert_true(f1 < f0 && s1 > s0 && f0 + s0 == f1 + s1);
            assert_true(m0.active && m1.active && m1.tokens == m0.tokens - ks_seq_len(c, 0));
            assert_int_equal(m1.active_seqs, 1);
            assert_true(m1.bytes < m0.bytes);
            assert_int_equal(ks_seq_len(c, 0), 38); /* the length stays */
            float *tmp = malloc(sizeof(float) * V);
            assert_int_equal(ks_decode(c, seqs, toks, 1, tmp), KS_ERR_INVALID_ARG);
            assert_int_equal(ks_prefill(c, 0, toks, 1, tmp, NULL), KS_ERR_INVALID_ARG);
            free(tmp);
            assert_int_equal(ks_context_offload_layer(c, g_m->hp.n_layer - 1, true), KS_OK);
        }
        if (park && t == 16) {
            assert_int_equal(ks_seq_unpark(c, 0), KS_OK);
            assert_false(ks_seq_parked(c, 0));
        }
        if (!park && t == 8) assert_int_equal(ks_context_offload_layer(c, g_m->hp.n_layer - 1, true), KS_OK);
        if (alone) {
            assert_int_equal(ks_decode(c, seqs + 1, toks + 1, 1, logits + V), KS_OK);
            memcpy(out + (size_t)k++ * V, logits + V, sizeof(float) * V);
        } else {
            assert_int_equal(ks_decode(c, seqs, toks, 2, logits), KS_OK);
            memcpy(out + (size_t)k++ * V, logits, sizeof(float) * 2 * V);
            k++;
        }
    }
    free(logits);
    ks_context_destroy(c);
}

static void test_park_unpark_decode(void **state) {
    (void)state;
    assert_int_equal(ks_model_load(ks_test_fixture("models/aidreams260K.gguf"), ks_model_default_params(), &g_m), KS_OK);
    size_t n = (size_t)40 * g_m->hp.n_vocab;
    const char *pols[] = {"dense", "quest"};
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < 2; i++) {
            ks_kv_type type = t ? KS_KV_Q8 : KS_KV_F16;
            if (type == KS_KV_Q8 && g_m->hp.head_dim % 32) continue;
            float *ref = calloc(n, sizeof(float)), *got = calloc(n, sizeof(float));
            park_run(type, pols[i], false, ref);
            park_run(type, pols[i], true, got);
            if (memcmp(ref, got, n * sizeof(float))) fail_msg("%s, %s KV: logits differ after unpark", pols[i], t ? "q8" : "f16");
            free(ref);
            free(got);
        }
    ks_model_destroy(g_m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_thresholds_by_hand),
        cmocka_unit_test(test_thresholds_local_layers),
        cmocka_unit_test(test_offload_while_decoding),
        cmocka_unit_test(test_park_unpark_decode),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
