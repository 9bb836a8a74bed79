/*
 * test_prefill_sparse.c — the opt-in sparse prefill (infer/prefill_sparse.c)
 * on the policies' tiny model (GQA, head dim 64, f16 KV, so the bf16 block
 * kernel on hosts that have it): a budget that covers every page gives the
 * dense prefill's logits bit for bit, as does a policy whose dense layers
 * cover the model (f16 and 8-bit KV); a binding budget reads fewer KV bytes, changes the logits
 * (something was dropped) and stays deterministic; malformed settings are
 * refused with a message, and the default is dense.
 */
#include "infer/infer.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

enum { N_LAYER = 3, N_PROMPT = 400 };

static ks_model *g_model;
static char g_path[256];
static int32_t g_ids[N_PROMPT];

static int setup(void **state) {
    (void)state;
    snprintf(g_path, sizeof g_path, "/tmp/kvsieve-test-prefill-sparse-%d.gguf", (int)getpid());
    if (ks_test_tiny_llama(N_LAYER, 7, g_path, &g_model) != 0) return -1;
    int32_t V = ks_model_n_vocab(g_model);
    uint64_t x = 12345;
    for (int i = 0; i < N_PROMPT; i++) { /* any tokens: the weights are random too */
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        g_ids[i] = (int32_t)((x >> 33) % (uint64_t)V);
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    ks_model_destroy(g_model);
    unlink(g_path);
    return 0;
}

/* Prefill the prompt in chunks of n_batch under prefill policy spec: every
 * row's logits into out [N_PROMPT][V]; the KV bytes the prefill read. */
static ks_kv_type g_kv = KS_KV_F16;
static uint64_t prefill(const char *spec, int n_batch, int page, float *out) {
    ks_context_params p = ks_context_default_params();
    p.n_ctx = N_PROMPT;
    p.n_batch = n_batch;
    p.n_threads = 2;
    p.page = page;
    p.kv_type = g_kv;
    p.prefill_policy = spec;
    ks_context *c = NULL;
    ks_status st = ks_context_create(g_model, p, &c);
    if (st != KS_OK) fail_msg("%s: %s", spec ? spec : "NULL", ks_last_error());
    assert_int_equal(ks_prefill(c, 0, g_ids, N_PROMPT, NULL, out), KS_OK);
    ks_stats s;
    ks_context_stats(c, &s);
    ks_context_destroy(c);
    return s.kv_bytes_read;
}

static void test_full_budget_is_dense(void **state) {
    (void)state;
    size_t n = (size_t)N_PROMPT * ks_model_n_vocab(g_model);
    float *dense = malloc(sizeof(float) * n), *sparse = malloc(sizeof(float) * n);
    assert_non_null(dense);
    assert_non_null(sparse);
    for (int batch = 64; batch <= N_PROMPT; batch += N_PROMPT - 64) { /* chunked and in one go */
        uint64_t bd = prefill(NULL, batch, 16, dense);
        /* every middle page fits the budget: the sparse walk plans the dense runs */
        uint64_t bs = prefill("quest:budget=100000,sink=16,window=32,dense=1", batch, 16, sparse);
        assert_memory_equal(dense, sparse, sizeof(float) * n);
        assert_true(bs == bd);
        /* every layer dense */
        prefill("quest:budget=64,sink=16,window=32,dense=3", batch, 16, sparse);
        assert_memory_equal(dense, sparse, sizeof(float) * n);
        prefill("dense", batch, 16, sparse);
        assert_memory_equal(dense, sparse, sizeof(float) * n);
    }
    free(dense);
    free(sparse);
}

static void test_binding_budget(void **state) {
    (void)state;
    size_t V = (size_t)ks_model_n_vocab(g_model), n = (size_t)N_PROMPT * V;
    float *dense = malloc(sizeof(float) * n), *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n);
    assert_non_null(dense);
    assert_non_null(a);
    assert_non_null(b);
    const char *spec = "quest:budget=96,sink=16,window=32,dense=1"; /* 3 of up to ~20 middle pages of 16 */
    uint64_t bd = prefill(NULL, 128, 16, dense);
    uint64_t ba = prefill(spec, 128, 16, a);
    prefill(spec, 128, 16, b);
    assert_memory_equal(a, b, sizeof(float) * n); /* deterministic */
    assert_true(ba < bd);
    /* rows whose middle is empty (the first sink + window + block rows) are
     * the dense ones; past them something was dropped */
    assert_memory_equal(a, dense, sizeof(float) * 16 * V);
    bool differs = false;
    for (size_t i = (size_t)200 * V; i < n; i++) {
        assert_true(isfinite(a[i]));
        if (a[i] != dense[i]) differs = true;
    }
    assert_true(differs);
    double mx, e = ks_test_nmse(a, dense, n, &mx);
    assert_true(e < 1.0); /* an approximation, not noise */
    free(dense);
    free(a);
    free(b);
}

/* 8-bit KV: the other block kernel, scored from the 8-bit page bounds */
static void test_q8(void **state) {
    g_kv = KS_KV_Q8;
    test_full_budget_is_dense(state);
    test_binding_budget(state);
    g_kv = KS_KV_F16;
}

/* A prefix cache holds exact KV only: a sparse prefill captures nothing,
 * a dense one does (and a sparse context may restore what it cached). */
static void test_prefix_cache_exact_only(void **state) {
    (void)state;
    ks_prefix_cache_params pcp = ks_prefix_cache_default_params();
    ks_prefix_cache *pc = NULL;
    assert_int_equal(ks_prefix_cache_create(g_model, &pcp, &pc), KS_OK);
    const char *specs[] = {"quest:budget=96,sink=16,window=32,dense=1", NULL};
    uint64_t blocks[2];
    for (int k = 0; k < 2; k++) {
        ks_context_params p = ks_context_default_params();
        p.n_ctx = N_PROMPT;
        p.n_threads = 2;
        p.page = 16;
        p.prefill_policy = specs[k];
        ks_context *c = NULL;
        assert_int_equal(ks_context_create(g_model, p, &c), KS_OK);
        int32_t n_cached = -1;
        assert_int_equal(ks_prefill_cached(c, pc, 0, g_ids, N_PROMPT, NULL, &n_cached), KS_OK);
        assert_int_equal(n_cached, 0); /* nothing exact was there to restore */
        ks_prefix_cache_stats st;
        ks_prefix_cache_get_stats(pc, &st);
        blocks[k] = st.ram_blocks;
        ks_context_destroy(c);
    }
    assert_true(blocks[0] == 0 && blocks[1] > 0);
    ks_prefix_cache_destroy(pc);
}

static void test_bad_settings(void **state) {
    (void)state;
    const char *bad[] = {"sparse", "quest:", "quest:budget", "quest:budget=abc", "quest:budget=12x",
                         "quest:foo=1", "quest:budget=64,", "quest:budget=-5", "quest:budget=40,sink=8,window=8",
                         "questx", "quest:sink=99999999999", "quest:window=-1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ks_context_params p = ks_context_default_params();
        p.n_ctx = 64;
        p.n_threads = 1;
        p.prefill_policy = bad[i];
        ks_context *c = NULL;
        ks_status st = ks_context_create(g_model, p, &c);
        if (st != KS_ERR_INVALID_ARG) fail_msg("'%s' accepted (status %d)", bad[i], (int)st);
        assert_null(c);
        assert_non_null(strstr(ks_last_error(), "prefill policy"));
    }
    ks_prefill_sparse sp;
    assert_int_equal(ks_prefill_sparse_parse(NULL, 32, &sp), KS_OK);
    assert_false(sp.on);
    assert_int_equal(ks_prefill_sparse_parse("quest", 32, &sp), KS_OK);
    assert_true(sp.on && sp.budget == 2048 && sp.sink == 32 && sp.window == 512 && sp.dense_layers == 2);
    assert_int_equal(ks_prefill_sparse_parse("quest:window=64,budget=160,sink=4,dense=0", 32, &sp), KS_OK);
    assert_true(sp.budget == 160 && sp.sink == 4 && sp.window == 64 && sp.dense_layers == 0);
    assert_int_equal(ks_prefill_sparse_parse("quest:window=64,budget=127,sink=4", 32, &sp), KS_ERR_INVALID_ARG);
    assert_null(ks_context_default_params().prefill_policy); /* dense by default */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_budget_is_dense),
        cmocka_unit_test(test_binding_budget),
        cmocka_unit_test(test_q8),
        cmocka_unit_test(test_prefix_cache_exact_only),
        cmocka_unit_test(test_bad_settings),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
