/*
 * test_prefill_sparse.c — the opt-in sparse prefill (infer/prefill_sparse.c)
 * on the policies' tiny model (GQA, head dim 64, f16 KV, so the bf16 block
 * kernel on hosts that have it): a budget that covers every page gives the
 * dense prefill's logits bit for bit, as does a policy whose dense layers
 * cover the model (f16 and 8-bit KV); a binding budget reads fewer KV bytes, changes the logits
 * (something was dropped) and stays deterministic, whatever the chunking;
 * a prefix cache keys sparse KV by the setting (exact hits, no dense /
 * sparse cross hits); malformed settings are refused with a message, and
 * the default is dense.
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

/* A sparse prefill's rows share their block's selection, so its blocks sit
 * on one grid of entries (attend.c): split into other chunks, or into two
 * calls at any row, it gives the same bits as in one go. */
static void test_chunking_invariant(void **state) {
    (void)state;
    const char *spec = "quest:budget=96,sink=16,window=32,dense=1";
    size_t V = (size_t)ks_model_n_vocab(g_model), n = (size_t)N_PROMPT * V;
    float *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n);
    assert_non_null(a);
    assert_non_null(b);
    prefill(spec, N_PROMPT, 16, a);
    const int bats[] = {40, 24, 64};
    for (int i = 0; i < 3; i++) {
        prefill(spec, bats[i], 16, b);
        if (memcmp(a, b, sizeof(float) * n)) fail_msg("chunks of %d: logits differ from one chunk", bats[i]);
    }
    ks_context_params p = ks_context_default_params();
    p.n_ctx = N_PROMPT;
    p.n_threads = 2;
    p.page = 16;
    p.prefill_policy = spec;
    ks_context *c = NULL;
    assert_int_equal(ks_context_create(g_model, p, &c), KS_OK);
    const int splits[] = {16, 96, 256}; /* on the grid of blocks */
    for (int i = 0; i < 3; i++) {
        ks_seq_reset(c, 0);
        int k = splits[i];
        assert_int_equal(ks_prefill(c, 0, g_ids, k, NULL, b), KS_OK);
        assert_int_equal(ks_prefill(c, 0, g_ids + k, N_PROMPT - k, NULL, b + (size_t)k * V), KS_OK);
        if (memcmp(a, b, sizeof(float) * n)) fail_msg("split at %d: logits differ from one call", k);
    }
    ks_context_destroy(c);
    free(a);
    free(b);
}

/* A context of prefill policy spec (NULL: dense), n_seq sequences. */
static ks_context *ctx_of(const char *spec, int n_batch, int n_seq) {
    ks_context_params p = ks_context_default_params();
    p.n_ctx = N_PROMPT;
    p.n_threads = 2;
    p.n_batch = n_batch;
    p.n_seq = n_seq;
    p.page = 16;
    p.prefill_policy = spec;
    ks_context *c = NULL;
    if (ks_context_create(g_model, p, &c) != KS_OK) fail_msg("%s: %s", spec ? spec : "dense", ks_last_error());
    return c;
}

/* The prompt's last logits through the cache (pc NULL: a plain prefill);
 * *hit: the rows restored. */
static void last_logits(ks_context *c, ks_prefix_cache *pc, int32_t seq, const int32_t *ids, float *out, int32_t *hit) {
    ks_seq_reset(c, seq);
    *hit = 0;
    if (pc) assert_int_equal(ks_prefill_cached(c, pc, seq, ids, N_PROMPT, out, hit), KS_OK);
    else assert_int_equal(ks_prefill(c, seq, ids, N_PROMPT, out, NULL), KS_OK);
}

/* A prefix cache keys a prefill's KV by its prefill policy (the canonical
 * spec in the chain's root): a follow-up of the same sparse setting restores
 * the shared document and gives the bits of recomputing it sparsely, a
 * dense prefill never reads sparse KV nor a sparse one dense KV, another
 * sparse setting misses, and two spellings of one setting hit. */
static void test_prefix_cache_keys(void **state) {
    (void)state;
    enum { DOC = 300 };
    const char *spec = "quest:budget=96,sink=16,window=32,dense=1";
    int32_t A[N_PROMPT], B[N_PROMPT];
    memcpy(A, g_ids, sizeof A);
    memcpy(B, g_ids, sizeof B);
    int32_t Vv = ks_model_n_vocab(g_model);
    for (int i = DOC; i < N_PROMPT; i++) B[i] = (g_ids[i] * 7 + 3) % Vv; /* another question */
    size_t V = (size_t)Vv;
    float *ref_sparse = malloc(sizeof(float) * V), *ref_dense = malloc(sizeof(float) * V), *got = malloc(sizeof(float) * V);
    float *ref_dense_a = malloc(sizeof(float) * V);
    int32_t hit = -1;
    ks_context *cs = ctx_of(spec, 40, 1), *cd = ctx_of(NULL, 40, 2);
    last_logits(cs, NULL, 0, B, ref_sparse, &hit);
    last_logits(cd, NULL, 0, B, ref_dense, &hit);
    last_logits(cd, NULL, 0, A, ref_dense_a, &hit);
    assert_true(memcmp(ref_sparse, ref_dense, sizeof(float) * V) != 0); /* the sparse prefill dropped something */
    ks_prefix_cache_params pcp = ks_prefix_cache_default_params();
    ks_prefix_cache *pc = NULL;
    assert_int_equal(ks_prefix_cache_create(g_model, &pcp, &pc), KS_OK);
    /* the first question: nothing cached; its blocks are kept */
    last_logits(cs, pc, 0, A, got, &hit);
    assert_int_equal(hit, 0);
    ks_prefix_cache_stats st;
    ks_prefix_cache_get_stats(pc, &st);
    assert_int_equal(st.ram_blocks, N_PROMPT / 16);
    /* a dense prefill of the follow-up: no sparse block serves it */
    last_logits(cd, pc, 0, B, got, &hit);
    assert_int_equal(hit, 0);
    assert_memory_equal(got, ref_dense, sizeof(float) * V);
    /* the sparse follow-up: the document's whole blocks of 16 rows, bit-exact */
    last_logits(cs, pc, 0, B, got, &hit);
    assert_int_equal(hit, DOC / 16 * 16);
    assert_memory_equal(got, ref_sparse, sizeof(float) * V);
    /* the dense blocks the dense follow-up left serve dense prefills only */
    last_logits(cd, pc, 1, A, got, &hit);
    assert_int_equal(hit, DOC);
    assert_memory_equal(got, ref_dense_a, sizeof(float) * V);
    /* another spelling of the setting hits; another setting misses (cs's store holds
     * the cached pages until it goes: then they are blocks of bytes any context reads) */
    ks_context_destroy(cs);
    ks_context *c2 = ctx_of("quest:dense=1,window=32,sink=16,budget=96", 64, 1);
    last_logits(c2, pc, 0, B, got, &hit);
    assert_int_equal(hit, (N_PROMPT - 1) / 16 * 16); /* B's own blocks now: all but the last row's block */
    assert_memory_equal(got, ref_sparse, sizeof(float) * V);
    ks_context_destroy(c2);
    c2 = ctx_of("quest:budget=112,sink=16,window=32,dense=1", 64, 1);
    last_logits(c2, pc, 0, B, got, &hit);
    assert_int_equal(hit, 0);
    ks_context_destroy(c2);
    /* a sequence's own setting (ks_seq_set_prefill_policy) in a dense context */
    assert_int_equal(ks_seq_set_prefill_policy(cd, 1, spec), KS_OK);
    last_logits(cd, pc, 1, B, got, &hit);
    assert_int_equal(hit, (N_PROMPT - 1) / 16 * 16);
    assert_memory_equal(got, ref_sparse, sizeof(float) * V);
    assert_int_equal(ks_seq_set_prefill_policy(cd, 1, "quest:budget=x"), KS_ERR_INVALID_ARG);
    assert_int_equal(ks_seq_set_prefill_policy(cd, 2, spec), KS_ERR_INVALID_ARG); /* no such sequence */
    last_logits(cd, pc, 1, B, got, &hit); /* the bad setting left the sequence's own */
    assert_memory_equal(got, ref_sparse, sizeof(float) * V);
    assert_int_equal(ks_seq_set_prefill_policy(cd, 1, NULL), KS_OK); /* back to the context's: dense */
    last_logits(cd, pc, 1, B, got, &hit);
    assert_int_equal(hit, N_PROMPT - 1); /* dense: up to the last row */
    assert_memory_equal(got, ref_dense, sizeof(float) * V);
    ks_context_destroy(cd);
    ks_prefix_cache_destroy(pc);
    free(ref_sparse);
    free(ref_dense);
    free(ref_dense_a);
    free(got);
}

/* A page that is not a whole number of blocks of rows: a page's KV would
 * depend on the next page's tokens, so a sparse prefill caches nothing. */
static void test_prefix_cache_odd_page(void **state) {
    (void)state;
    ks_context_params p = ks_context_default_params();
    p.n_ctx = N_PROMPT;
    p.n_threads = 2;
    p.page = 24;
    p.prefill_policy = "quest:budget=96,sink=16,window=24,dense=1";
    ks_context *c = NULL;
    assert_int_equal(ks_context_create(g_model, p, &c), KS_OK);
    ks_prefix_cache_params pcp = ks_prefix_cache_default_params();
    ks_prefix_cache *pc = NULL;
    assert_int_equal(ks_prefix_cache_create(g_model, &pcp, &pc), KS_OK);
    int32_t hit = -1;
    assert_int_equal(ks_prefill_cached(c, pc, 0, g_ids, N_PROMPT, NULL, &hit), KS_OK);
    ks_prefix_cache_stats st;
    ks_prefix_cache_get_stats(pc, &st);
    assert_int_equal(st.ram_blocks, 0);
    ks_prefix_cache_destroy(pc);
    ks_context_destroy(c);
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
    char canon[96];
    assert_int_equal(ks_prefill_policy_canonical("quest", 32, canon, sizeof canon), KS_OK);
    assert_string_equal(canon, "quest:budget=2048,sink=32,window=512,dense=2");
    assert_int_equal(ks_prefill_policy_canonical("quest:dense=0,budget=160,window=64,sink=4", 32, canon, sizeof canon), KS_OK);
    assert_string_equal(canon, "quest:budget=160,sink=4,window=64,dense=0");
    assert_int_equal(ks_prefill_policy_canonical(NULL, 32, canon, sizeof canon), KS_OK);
    assert_string_equal(canon, "dense");
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(ks_prefill_policy_canonical(bad[i], 32, canon, sizeof canon), KS_ERR_INVALID_ARG);
    assert_int_equal(ks_prefill_policy_canonical("quest", 0, canon, sizeof canon), KS_ERR_INVALID_ARG);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_budget_is_dense),
        cmocka_unit_test(test_binding_budget),
        cmocka_unit_test(test_q8),
        cmocka_unit_test(test_chunking_invariant),
        cmocka_unit_test(test_prefix_cache_keys),
        cmocka_unit_test(test_prefix_cache_odd_page),
        cmocka_unit_test(test_bad_settings),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
