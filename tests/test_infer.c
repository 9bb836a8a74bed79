/*
 * test_infer.c — the forward pass on a real pretrained model (aidreams260K, a
 * tiny llama nobody here trained): greedy text, and the invariants batching
 * and chunking must keep — a sequence decoded inside a batch gets the same
 * logits as decoded alone, prefill in chunks equals prefill in one go equals
 * token-by-token decode — plus the error contract (context full, empty or
 * out-of-vocabulary input, duplicate sequences) with state left unchanged,
 * and context creation's refusals.
 */
#include "infer/infer.h"
#include "testutil.h"

#include <math.h>
#include <string.h>

static ks_model *g_model;

static int setup(void **state) {
    (void)state;
    ks_status st = ks_model_load(ks_test_fixture("models/aidreams260K.gguf"), ks_model_default_params(), &g_model);
    if (st != KS_OK) fprintf(stderr, "load: %s\n", ks_last_error());
    return st == KS_OK ? 0 : -1;
}
static int teardown(void **state) {
    (void)state;
    ks_model_destroy(g_model);
    return 0;
}

static ks_context *make_ctx(int n_ctx, int n_seq, int n_batch, ks_kv_type kt, int threads) {
    ks_context_params p = ks_context_default_params();
    p.n_ctx = n_ctx;
    p.n_seq = n_seq;
    p.n_batch = n_batch;
    p.kv_type = kt;
    p.n_threads = threads;
    ks_context *c = NULL;
    assert_int_equal(ks_context_create(g_model, p, &c), KS_OK);
    return c;
}

static size_t tokenize(const char *text, int32_t *ids, size_t cap) {
    size_t n = 0;
    assert_int_equal(ks_tokenize(g_model, text, strlen(text), true, false, ids, cap, &n), KS_OK);
    return n;
}

static int32_t argmax(const float *x, int n) {
    int32_t b = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[b]) b = i;
    return b;
}

static void test_greedy_text(void **state) {
    (void)state;
    /* the fixture's documented greedy continuation */
    const char *expect = ", pixels unfolding like petals.";
    int32_t ids[64];
    size_t n = tokenize("Once upon a time", ids, 64);
    ks_context *c = make_ctx(128, 1, 256, KS_KV_F16, 2);
    int V = ks_model_n_vocab(g_model);
    float *logits = malloc(sizeof(float) * V);
    assert_int_equal(ks_prefill(c, 0, ids, (int32_t)n, logits, NULL), KS_OK);
    char text[512] = {0};
    size_t len = 0;
    int32_t seq = 0;
    for (int i = 0; i < 16; i++) {
        int32_t t = argmax(logits, V);
        size_t np = 0;
        assert_int_equal(ks_token_to_piece(g_model, t, text + len, sizeof text - len, &np), KS_OK);
        len += np;
        assert_int_equal(ks_decode(c, &seq, &t, 1, logits), KS_OK);
    }
    text[len] = 0;
    if (strncmp(text, expect, strlen(expect)) != 0) fail_msg("greedy text '%s', expected prefix '%s'", text, expect);
    free(logits);
    ks_context_destroy(c);
}

/* Three sequences with different prompts decoded together vs alone. */
static void test_batch_equals_single(void **state) {
    (void)state;
    const char *prompts[3] = {"Once upon a time", "The cat sat", "In a galaxy far away there"};
    int V = ks_model_n_vocab(g_model);
    float *batch_logits = malloc(sizeof(float) * V * 3), *single = malloc(sizeof(float) * V);
    /* f16 KV only: this model's head dim (16) rules out 8-bit KV (see below) */
    for (int kt = 0; kt < 1; kt++) {
        ks_context *cb = make_ctx(128, 3, 256, (ks_kv_type)kt, 2);
        int32_t next[3], seqs[3] = {2, 0, 1}; /* order of the batch is not the order of seqs */
        for (int s = 0; s < 3; s++) {
            int32_t ids[64];
            size_t n = tokenize(prompts[s], ids, 64);
            assert_int_equal(ks_prefill(cb, s, ids, (int32_t)n, single, NULL), KS_OK);
            next[s] = argmax(single, V);
        }
        int32_t toks[3] = {next[2], next[0], next[1]};
        for (int step = 0; step < 5; step++) {
            assert_int_equal(ks_decode(cb, seqs, toks, 3, batch_logits), KS_OK);
            for (int b = 0; b < 3; b++) toks[b] = argmax(batch_logits + (size_t)b * V, V);
        }
        /* replay each sequence alone in a fresh context */
        for (int b = 0; b < 3; b++) {
            int s = seqs[b];
            ks_context *c1 = make_ctx(128, 1, 256, (ks_kv_type)kt, 1);
            int32_t ids[64];
            size_t n = tokenize(prompts[s], ids, 64);
            assert_int_equal(ks_prefill(c1, 0, ids, (int32_t)n, single, NULL), KS_OK);
            int32_t t = argmax(single, V), z = 0;
            for (int step = 0; step < 5; step++) {
                assert_int_equal(ks_decode(c1, &z, &t, 1, single), KS_OK);
                t = argmax(single, V);
            }
            double mx, e = ks_test_nmse(batch_logits + (size_t)b * V, single, (size_t)V, &mx);
            if (e > 1e-5) fail_msg("kv %d seq %d: batch vs single nmse %g (max %g)", kt, s, e, mx);
            assert_int_equal(ks_seq_len(c1, 0), ks_seq_len(cb, s));
            ks_context_destroy(c1);
        }
        ks_context_destroy(cb);
    }
    free(batch_logits);
    free(single);
}

/* prefill all at once == in chunks of 3 == one token at a time */
static void test_prefill_chunking(void **state) {
    (void)state;
    int32_t ids[128];
    size_t n = tokenize("Once upon a time, in a land of code and light, a small model dreamed of stars.", ids, 128);
    assert_true(n > 10);
    int V = ks_model_n_vocab(g_model);
    float *all = malloc(sizeof(float) * V * n), *chunked = malloc(sizeof(float) * V * n), *step = malloc(sizeof(float) * V);
    ks_context *a = make_ctx(128, 1, 256, KS_KV_F16, 2), *b = make_ctx(128, 1, 3, KS_KV_F16, 2), *d = make_ctx(128, 1, 1, KS_KV_F16, 1);
    assert_int_equal(ks_prefill(a, 0, ids, (int32_t)n, NULL, all), KS_OK);
    assert_int_equal(ks_prefill(b, 0, ids, (int32_t)n, NULL, chunked), KS_OK);
    double mx, e = ks_test_nmse(chunked, all, V * n, &mx);
    if (e > 1e-5) fail_msg("chunked prefill nmse %g", e);
    int32_t z = 0;
    assert_int_equal(ks_prefill(d, 0, ids, 1, step, NULL), KS_OK);
    e = ks_test_nmse(step, all, V, &mx);
    if (e > 1e-5) fail_msg("position 0 nmse %g", e);
    for (size_t i = 1; i < n; i++) {
        assert_int_equal(ks_decode(d, &z, &ids[i], 1, step), KS_OK);
        e = ks_test_nmse(step, all + i * V, V, &mx);
        /* prefill runs the blocked kernel (polynomial exp, other summation
         * order), decode the per-row one: equal up to rounding */
        if (e > 2e-4) fail_msg("decode position %zu nmse %g", i, e); /* test_golden bounds both against float64 */
    }
    ks_context_destroy(a);
    ks_context_destroy(b);
    ks_context_destroy(d);
    free(all);
    free(chunked);
    free(step);
}

/* The same on the bundled model (head_dim 64, GQA): on AVX-512 BF16 hosts
 * its prefill attention is the bf16 kernel (attn/attn_block_bf16.c), whose
 * online softmax must not depend on where chunks, blocks or threads split
 * the rows: one prefill, chunks of 7, 16 and 1 rows, and one thread give
 * the same logits bit for bit (f32 hosts check their own kernels), with f16
 * KV and with Q8_0 KV (whose tiles the kernel converts to bf16). */
static void test_prefill_chunking_bundled(void **state) {
    (void)state;
    ks_model *m = NULL;
    assert_int_equal(ks_model_load(KS_SOURCE_DIR "/models/kvsieve-default.gguf", ks_model_default_params(), &m), KS_OK);
    enum { N = 300 };
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = 3 + (int32_t)((i * 2654435761u) % 4000u); /* any tokens: it is arithmetic */
    int V = ks_model_n_vocab(m);
    float *ref = malloc(sizeof(float) * V * N), *got = malloc(sizeof(float) * V * N);
    const int batches[][2] = {{512, 2}, {7, 2}, {16, 2}, {1, 2}, {512, 1}};
    for (int kt = KS_KV_F16; kt <= KS_KV_Q8; kt++)
        for (size_t k = 0; k < sizeof batches / sizeof batches[0]; k++) {
            ks_context_params p = ks_context_default_params();
            p.n_ctx = N + 8;
            p.n_batch = batches[k][0];
            p.n_threads = batches[k][1];
            p.kv_type = (ks_kv_type)kt;
            ks_context *c = NULL;
            assert_int_equal(ks_context_create(m, p, &c), KS_OK);
            assert_int_equal(ks_prefill(c, 0, ids, N, NULL, k ? got : ref), KS_OK);
            if (k) assert_memory_equal(got, ref, sizeof(float) * V * N);
            ks_context_destroy(c);
        }
    free(ref);
    free(got);
    ks_model_destroy(m);
}

static void test_q8_kv_close_to_f16(void **state) {
    (void)state;
    int32_t ids[64];
    size_t n = tokenize("Once upon a time there was a robot", ids, 64);
    int V = ks_model_n_vocab(g_model);
    float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V);
    ks_context *cf = make_ctx(64, 1, 256, KS_KV_F16, 2);
    /* head_dim 16 is not a multiple of 32: 8-bit KV must be refused clearly */
    ks_context_params p = ks_context_default_params();
    p.kv_type = KS_KV_Q8;
    ks_context *cq = NULL;
    assert_int_equal(ks_context_create(g_model, p, &cq), KS_ERR_UNSUPPORTED);
    assert_non_null(strstr(ks_last_error(), "multiple of 32"));
    assert_int_equal(ks_prefill(cf, 0, ids, (int32_t)n, a, NULL), KS_OK);
    (void)b;
    ks_context_destroy(cf);
    free(a);
    free(b);
}

static void test_errors_leave_state(void **state) {
    (void)state;
    ks_context *c = make_ctx(16, 2, 256, KS_KV_F16, 2);
    int V = ks_model_n_vocab(g_model);
    float *logits = malloc(sizeof(float) * V);
    int32_t ids[32];
    for (int i = 0; i < 32; i++) ids[i] = 5 + i;
    assert_int_equal(ks_prefill(c, 0, ids, 10, logits, NULL), KS_OK);
    /* over the context: refused, sequence unchanged */
    assert_int_equal(ks_prefill(c, 0, ids, 7, logits, NULL), KS_ERR_CONTEXT_FULL);
    assert_int_equal(ks_seq_len(c, 0), 10);
    assert_int_equal(ks_prefill(c, 1, ids, 17, logits, NULL), KS_ERR_CONTEXT_FULL);
    assert_int_equal(ks_seq_len(c, 1), 0);
    /* empty prompt, bad sequence, token outside the vocabulary */
    assert_int_equal(ks_prefill(c, 1, ids, 0, logits, NULL), KS_ERR_INVALID_ARG);
    assert_int_equal(ks_prefill(c, 2, ids, 1, logits, NULL), KS_ERR_INVALID_ARG);
    int32_t bad = V;
    assert_int_equal(ks_prefill(c, 1, &bad, 1, logits, NULL), KS_ERR_INVALID_ARG);
    assert_non_null(strstr(ks_last_error(), "vocabulary"));
    assert_int_equal(ks_seq_len(c, 1), 0);
    /* the same sequence twice in one decode step */
    int32_t seqs[2] = {0, 0}, toks[2] = {5, 6};
    assert_int_equal(ks_decode(c, seqs, toks, 2, NULL), KS_ERR_INVALID_ARG);
    assert_int_equal(ks_seq_len(c, 0), 10);
    /* filling to the brim, then one more decode */
    assert_int_equal(ks_seq_fill_synthetic(c, 1, 16, 1), KS_OK);
    int32_t s1 = 1, t = 5;
    assert_int_equal(ks_decode(c, &s1, &t, 1, logits), KS_ERR_CONTEXT_FULL);
    assert_int_equal(ks_seq_len(c, 1), 16);
    ks_seq_reset(c, 1);
    assert_int_equal(ks_decode(c, &s1, &t, 1, logits), KS_OK);
    for (int i = 0; i < V; i++) assert_true(isfinite(logits[i]));
    free(logits);
    ks_context_destroy(c);
}

/* Bad parameters are refused by ks_context_create, with *out untouched, and
 * a failure after the first allocation frees everything (the ASan build's
 * leak checker runs this test). */
static void test_create_errors(void **state) {
    (void)state;
    ks_context *sentinel = (ks_context *)&sentinel, *c = sentinel;
    ks_context_params p = ks_context_default_params();
    p.n_ctx = 64;
    p.n_threads = 2;
    p.kv_slots = -1;
    assert_int_equal(ks_context_create(g_model, p, &c), KS_ERR_INVALID_ARG);
    assert_non_null(strstr(ks_last_error(), "kv_slots"));
    p.kv_slots = 0;
    p.policy = "no-such-policy"; /* fails after the pool and the KV store exist */
    assert_int_not_equal(ks_context_create(g_model, p, &c), KS_OK);
    p.policy = "dense";
    p.budget = 0;
    p.mem_cap = 1 << 20; /* adaptive memory without a budget: fails last of all */
    assert_int_equal(ks_context_create(g_model, p, &c), KS_ERR_INVALID_ARG);
    assert_ptr_equal(c, sentinel);
}

static void test_vocab_only(void **state) {
    (void)state;
    ks_model_params mp = ks_model_default_params();
    mp.vocab_only = true;
    ks_model *m = NULL;
    assert_int_equal(ks_model_load(ks_test_fixture("tokenizer/ggml-vocab-llama-spm.gguf"), mp, &m), KS_OK);
    ks_context *c = NULL;
    assert_int_equal(ks_context_create(m, ks_context_default_params(), &c), KS_ERR_INVALID_ARG);
    char buf[4096];
    assert_int_equal(ks_model_describe(m, buf, sizeof buf), KS_OK);
    assert_non_null(strstr(buf, "vocabulary-only"));
    ks_model_destroy(m);
    /* and without vocab_only the same file is refused with a message */
    assert_int_not_equal(ks_model_load(ks_test_fixture("tokenizer/ggml-vocab-llama-spm.gguf"), ks_model_default_params(), &m), KS_OK);
    assert_true(strlen(ks_last_error()) > 0);
}

/* Per-sequence policies (ks_seq_set_policy): four sequences with different
 * policies (quest, the context's dense default, snapkv+quest with its prefill
 * eviction, h2o with its attention feedback) at different depths decode in
 * the same ks_decode calls, and each gets exactly the logits it gets alone in
 * a context whose default is that policy.  Also the refusals. */
typedef struct {
    const char *policy;
    int32_t budget;
    const char *prompt;
} seq_pol_case;

static void run_alone(const seq_pol_case *k, int steps, float *out /* [steps][V] */) {
    int V = ks_model_n_vocab(g_model);
    ks_context_params p = ks_context_default_params();
    p.n_ctx = 128;
    p.n_threads = 2;
    p.page = 8;
    p.window = 8;
    p.policy = k->policy;
    p.budget = k->budget;
    ks_context *c = NULL;
    assert_int_equal(ks_context_create(g_model, p, &c), KS_OK);
    int32_t ids[64], z = 0;
    size_t n = tokenize(k->prompt, ids, 64);
    float *l = malloc(sizeof(float) * V);
    assert_int_equal(ks_prefill(c, 0, ids, (int32_t)n, l, NULL), KS_OK);
    for (int i = 0; i < steps; i++) {
        int32_t t = argmax(l, V);
        assert_int_equal(ks_decode(c, &z, &t, 1, l), KS_OK);
        memcpy(out + (size_t)i * V, l, sizeof(float) * V);
    }
    free(l);
    ks_context_destroy(c);
}

static void test_seq_policies_share_a_step(void **state) {
    (void)state;
    const seq_pol_case cases[4] = {
        {"quest", 24, "Once upon a time there was a little girl who"},
        {"dense", 0, "The cat sat"},
        {"snapkv+quest", 24, "In a galaxy far away there lived a small robot named"},
        {"h2o", 20, "Tom and his mom went to the park to"},
    };
    enum { STEPS = 24 };
    int V = ks_model_n_vocab(g_model);
    float *ref[4], *l = malloc(sizeof(float) * V * 4), *first = malloc(sizeof(float) * V);
    for (int s = 0; s < 4; s++) {
        ref[s] = malloc(sizeof(float) * V * STEPS);
        run_alone(&cases[s], STEPS, ref[s]);
    }
    ks_context_params p = ks_context_default_params();
    p.n_ctx = 128;
    p.n_seq = 4;
    p.n_threads = 2;
    p.page = 8;
    p.window = 8; /* default policy: dense */
    ks_context *c = NULL;
    assert_int_equal(ks_context_create(g_model, p, &c), KS_OK);
    int32_t toks[4], seqs[4] = {3, 1, 0, 2}, done[4] = {0};
    for (int s = 0; s < 4; s++) {
        if (s != 1) { /* seq 1 keeps the context's default */
            ks_policy_config pc = ks_policy_config_default();
            pc.policy = cases[s].policy;
            pc.budget = cases[s].budget;
            pc.window = 8;
            assert_int_equal(ks_seq_set_policy(c, s, &pc), KS_OK);
        }
        int32_t ids[64];
        size_t n = tokenize(cases[s].prompt, ids, 64);
        assert_int_equal(ks_prefill(c, s, ids, (int32_t)n, first, NULL), KS_OK);
        toks[s] = argmax(first, V);
    }
    /* sequences join at different steps, so their depths differ */
    int32_t joins[4] = {0, 3, 1, 5};
    for (int step = 0; done[0] < STEPS || done[1] < STEPS || done[2] < STEPS || done[3] < STEPS; step++) {
        int32_t bs[4], bt[4], m = 0;
        for (int b = 0; b < 4; b++) {
            int s = seqs[b];
            if (step >= joins[s] && done[s] < STEPS) bs[m] = s, bt[m++] = toks[s];
        }
        assert_int_equal(ks_decode(c, bs, bt, m, l), KS_OK);
        for (int b = 0; b < m; b++) {
            int s = bs[b];
            if (memcmp(l + (size_t)b * V, ref[s] + (size_t)done[s] * V, sizeof(float) * V) != 0)
                fail_msg("seq %d (%s) step %d: logits differ from the policy alone", s, cases[s].policy, done[s]);
            toks[s] = argmax(l + (size_t)b * V, V);
            done[s]++;
        }
    }
    ks_stats st;
    ks_context_stats(c, &st);
    assert_true(st.kv_entries_attended < st.kv_entries_total);
    /* refusals leave the policy unchanged: a non-empty sequence, another page, an unknown policy */
    ks_policy_config pc = ks_policy_config_default();
    assert_int_equal(ks_seq_set_policy(c, 0, &pc), KS_ERR_INVALID_ARG);
    assert_non_null(strstr(ks_last_error(), "empty"));
    ks_seq_reset(c, 0);
    pc.page = 32;
    assert_int_equal(ks_seq_set_policy(c, 0, &pc), KS_ERR_INVALID_ARG);
    pc.page = 0;
    pc.policy = "no-such-policy";
    assert_int_not_equal(ks_seq_set_policy(c, 0, &pc), KS_OK);
    assert_int_equal(ks_seq_set_policy(c, 0, NULL), KS_OK); /* back to the default */
    int64_t fast = -1, slow = -1;
    ks_context_kv_bytes(c, &fast, &slow);
    assert_true(fast > 0);
    assert_int_equal(slow, 0);
    assert_true(ks_policy_prefill_chunkable("quest") && ks_policy_prefill_chunkable("dense"));
    assert_false(ks_policy_prefill_chunkable("snapkv+quest") || ks_policy_prefill_chunkable("nope"));
    ks_context_destroy(c);
    /* one sequence switching among configurations while empty (an instance
     * no sequence uses goes when the next is made), and under a memory cap
     * a policy without a budget is refused */
    p.n_seq = 1;
    p.policy = "quest";
    p.budget = 32;
    p.mem_cap = 64e6;
    assert_int_equal(ks_context_create(g_model, p, &c), KS_OK);
    const char *specs[] = {"streaming", "quest", "h2o", "streaming", "snapkv+quest"};
    for (int i = 0; i < 5; i++) {
        ks_policy_config q = ks_policy_config_default();
        q.policy = specs[i];
        q.budget = 16 + 8 * i;
        assert_int_equal(ks_seq_set_policy(c, 0, &q), KS_OK);
        int32_t ids[64];
        size_t n = tokenize(cases[0].prompt, ids, 64);
        assert_int_equal(ks_prefill(c, 0, ids, (int32_t)n, first, NULL), KS_OK);
        int32_t z = 0, t = argmax(first, V);
        assert_int_equal(ks_decode(c, &z, &t, 1, l), KS_OK);
        ks_seq_reset(c, 0);
    }
    ks_memplan_info mi;
    ks_context_memplan(c, &mi);
    assert_true(mi.active);
    assert_int_equal(mi.budget, 48); /* the largest budget alive: snapkv+quest's (and the default's 32) */
    ks_policy_config q = ks_policy_config_default();
    assert_int_equal(ks_seq_set_policy(c, 0, &q), KS_ERR_INVALID_ARG); /* budget 0 under a cap */
    ks_context_destroy(c);
    for (int s = 0; s < 4; s++) free(ref[s]);
    free(l);
    free(first);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_text),
        cmocka_unit_test(test_batch_equals_single),
        cmocka_unit_test(test_prefill_chunking),
        cmocka_unit_test(test_prefill_chunking_bundled),
        cmocka_unit_test(test_q8_kv_close_to_f16),
        cmocka_unit_test(test_errors_leave_state),
        cmocka_unit_test(test_create_errors),
        cmocka_unit_test(test_vocab_only),
        cmocka_unit_test(test_seq_policies_share_a_step),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
