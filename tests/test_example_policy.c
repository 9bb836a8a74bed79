/*
 * test_example_policy.c — the worked example of docs/DESIGN.md ("Adding a
 * policy") compiled and run: tests/example_policy.c's `uniform` registered
 * at run time (ks_policy_register; in the tree it would be one line in
 * src/policies/registry.c), then used the way every policy is: named in a
 * spec, alone or behind an evictor, its arguments checked by the one
 * parser, run in a context on a tiny model.  It must do what every policy
 * does: a full budget is bit-identical to dense attention, and a small one
 * attends fewer entries.
 */
#include "testutil.h"
#include "kvsieve.h"
#include "model/model.h"
#include "policies/registry.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern const ks_policy_i ks_policy_uniform;

static ks_model *g_model;
static char g_path[256];

static int setup(void **state) {
    (void)state;
    snprintf(g_path, sizeof g_path, "/tmp/kvsieve-test-example-policy-%d.gguf", (int)getpid());
    if (ks_test_tiny_llama(2, 11, g_path, &g_model) != 0) return -1;
    return ks_policy_register(&ks_policy_uniform) == KS_OK ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    ks_model_destroy(g_model);
    unlink(g_path);
    return 0;
}

static void test_registered(void **state) {
    (void)state;
    assert_ptr_equal(ks_policy_find("uniform"), &ks_policy_uniform);
    assert_string_equal(ks_policy_name_at(ks_policy_count() - 1, NULL), "uniform");
    assert_int_equal(ks_policy_register(&ks_policy_uniform), KS_ERR_INVALID_ARG); /* the name is taken */
    ks_policy_spec sp;
    assert_int_equal(ks_policy_spec_parse("uniform", "phase=0.25", 64, 4, 8, -1, &sp), KS_OK);
    assert_true(ks_policy_spec_chunkable(&sp) && !ks_policy_spec_needs_dlm(&sp));
    assert_int_equal(ks_policy_spec_parse("uniform", "phase=2", 64, 4, 8, -1, &sp), KS_OK); /* range: at create */
    assert_int_equal(ks_policy_spec_parse("uniform", "stride=2", 64, 4, 8, -1, &sp), KS_ERR_INVALID_ARG);
    assert_int_equal(ks_policy_spec_parse("snapkv+uniform", "obs=8,phase=0.5", 64, 4, 8, -1, &sp), KS_OK);
    assert_true(ks_policy_accepts_arg("snapkv+uniform", "phase"));
}

/* Greedy decode of n_steps after a prompt; the logits of every step and the
 * entries attended (malloc'd [n_steps][V]). */
static float *run(const char *policy, const char *args, int32_t budget, uint64_t *attended, uint64_t *total) {
    enum { N_PROMPT = 96, N_STEPS = 6 };
    ks_policy_spec spec;
    assert_int_equal(ks_policy_spec_parse(policy, args, budget, 4, 8, 0, &spec), KS_OK);
    ks_context_params p = ks_context_default_params();
    p.n_ctx = N_PROMPT + N_STEPS + 1;
    p.n_threads = 2;
    p.page = 16;
    p.policy_spec = &spec;
    ks_context *c = NULL;
    assert_int_equal(ks_context_create(g_model, p, &c), KS_OK);
    int32_t V = g_model->hp.n_vocab, prompt[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++) prompt[i] = (int32_t)((i * 37 + 11) % V);
    float *out = malloc(sizeof(float) * (size_t)N_STEPS * V), *logits = malloc(sizeof(float) * (size_t)V);
    assert_int_equal(ks_prefill(c, 0, prompt, N_PROMPT, logits, NULL), KS_OK);
    ks_stats_reset(c);
    for (int t = 0; t < N_STEPS; t++) {
        int32_t best = 0, seq = 0;
        for (int32_t j = 1; j < V; j++) best = logits[j] > logits[best] ? j : best;
        assert_int_equal(ks_decode(c, &seq, &best, 1, logits), KS_OK);
        memcpy(out + (size_t)t * V, logits, sizeof(float) * (size_t)V);
    }
    ks_stats st;
    ks_context_stats(c, &st);
    *attended = st.kv_entries_attended;
    *total = st.kv_entries_total;
    free(logits);
    ks_context_destroy(c);
    return out;
}

static void test_runs_like_every_policy(void **state) {
    (void)state;
    size_t n = (size_t)6 * g_model->hp.n_vocab;
    uint64_t a_dense, t_dense, a_full, t_full, a_small, t_small;
    float *dense = run("dense", NULL, 0, &a_dense, &t_dense);
    float *full = run("uniform", "phase=0.25", 4096, &a_full, &t_full); /* more than any head holds */
    assert_memory_equal(dense, full, n * sizeof(float));
    assert_int_equal(a_full, a_dense);
    float *small = run("uniform", NULL, 32, &a_small, &t_small);
    assert_true(a_small < a_dense);
    assert_int_equal(t_small, t_dense);
    free(dense);
    free(full);
    free(small);
}

/* docs/DESIGN.md shows the example as it is: its code block is the file's
 * code, after the file's opening essay. */
static void test_design_doc_shows_it(void **state) {
    (void)state;
    size_t n_doc, n_src;
    char *doc = ks_test_read_file(ks_test_source("docs/DESIGN.md"), &n_doc);
    char *src = ks_test_read_file(ks_test_source("tests/example_policy.c"), &n_src);
    assert_non_null(doc);
    assert_non_null(src);
    const char *block = strstr(doc, "```c\n#include \"policy/policy.h\"");
    const char *code = strstr(src, "#include \"policy/policy.h\"");
    assert_non_null(block);
    assert_non_null(code);
    block += 5;
    const char *end = strstr(block, "```");
    assert_non_null(end);
    assert_int_equal((size_t)(end - block), strlen(code));
    assert_memory_equal(block, code, strlen(code));
    free(doc);
    free(src);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registered),
        cmocka_unit_test(test_runs_like_every_policy),
        cmocka_unit_test(test_design_doc_shows_it),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
