/*
 * test_step_alloc.c — a decode step allocates nothing.
 *
 * A step runs once per generated token for every sequence in flight; an
 * allocation there costs a lock in the allocator, touches cold memory and,
 * worse, is a point where a server could fail a request that had already been
 * admitted.  So everything a step needs is sized when the context is created
 * (or when a policy is attached to a sequence) and a step only reuses it.
 *
 * The check: core counts every ks_ allocation (ks_alloc_count); for every
 * policy of the registry (and each per-layer selector behind an evictor,
 * the compositions kvsieve runs), with a budget well under the context so the
 * selection really runs, batch 1 and 2, fast tier and a layer in the slow
 * tier, the count does not move across four decode steps after two
 * warm-up steps (those may size the per-thread scratch, ks_scratch, which
 * only grows, in powers of two, on whichever worker a head's work lands).
 */
#define _GNU_SOURCE
#include "infer/infer.h"
#include "gguf/gguf.h"
#include "draft/eagle3.h"
#include "model/eagle3_gen.h"
#include "model/shapes.h"
#include "policies/registry.h"
#include "tensor/dtype.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static ks_model *g_model;
static char g_tmp[256], g_path[512], g_dlm[512];

static int setup(void **state) {
    (void)state;
    snprintf(g_tmp, sizeof g_tmp, "/tmp/kvsieve-test-step-alloc-XXXXXX");
    if (!mkdtemp(g_tmp)) return -1;
    snprintf(g_path, sizeof g_path, "%s/tiny.gguf", g_tmp);
    if (ks_test_tiny_llama(3, 5, g_path, &g_model) != 0) return -1;
    snprintf(g_dlm, sizeof g_dlm, "%s/dlm", g_tmp);
    if (ks_eagle3_generate_head(ks_shape_find("tiny-llama"), 3, g_model->hp.n_vocab, 512, 7, g_dlm) != KS_OK) return -1;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    ks_model_destroy(g_model);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
    return system(cmd) == 0 ? 0 : -1;
}

/* Allocations made by decode steps 3..6 of one configuration. */
static uint64_t step_allocs(const char *policy, const char *args, int n_seq, int offload) {
    enum { PROMPT = 200, STEPS = 6 };
    ks_context_params p = ks_context_default_params();
    p.n_ctx = PROMPT + STEPS + 1;
    p.n_seq = n_seq;
    p.n_threads = 2;
    p.n_batch = 64;
    p.policy = policy;
    p.policy_args = args;
    p.budget = 48;
    p.page = 8;
    p.sink = 4;
    p.window = 8;
    p.kv_offload_layers = offload;
    ks_context *c = NULL;
    if (ks_context_create(g_model, p, &c) != KS_OK) fail_msg("%s: %s", policy, ks_last_error());
    int32_t V = g_model->hp.n_vocab, seqs[2] = {0, 1}, toks[2];
    float *logits = malloc(sizeof(float) * (size_t)n_seq * V);
    int32_t prompt[PROMPT];
    for (int s = 0; s < n_seq; s++) {
        for (int i = 0; i < PROMPT; i++) prompt[i] = (int32_t)((i * 37 + s * 101 + 11) % V);
        if (ks_prefill(c, s, prompt, PROMPT, logits + (size_t)s * V, NULL) != KS_OK)
            fail_msg("%s prefill: %s", policy, ks_last_error());
    }
    uint64_t before = 0;
    for (int t = 0; t < STEPS; t++) {
        for (int s = 0; s < n_seq; s++) toks[s] = (int32_t)((t * 13 + s * 7 + 3) % V);
        if (t == 2) before = ks_alloc_count();
        if (ks_decode(c, seqs, toks, n_seq, logits) != KS_OK) fail_msg("%s decode: %s", policy, ks_last_error());
    }
    uint64_t n = ks_alloc_count() - before;
    free(logits);
    ks_context_destroy(c);
    return n;
}

static void test_no_allocation_in_a_decode_step(void **state) {
    (void)state;
    const ks_policy_i *const *reg = ks_policy_list();
    const char *evictor = NULL;
    for (int i = 0; reg[i]; i++)
        if (ks_policy_i_evicts(reg[i]) && !evictor) evictor = reg[i]->name;
    char args[600];
    snprintf(args, sizeof args, "dlm=%s", g_dlm);
    int failures = 0, runs = 0;
    for (int i = 0; reg[i]; i++) {
        char names[2][64];
        int n_names = 0;
        snprintf(names[n_names++], 64, "%s", reg[i]->name);
        if (reg[i]->select && !ks_policy_i_global(reg[i]) && !ks_policy_i_evicts(reg[i]) && evictor)
            snprintf(names[n_names++], 64, "%s+%s", evictor, reg[i]->name);
        for (int k = 0; k < n_names; k++)
            for (int n_seq = 1; n_seq <= 2; n_seq++)
                for (int off = 0; off <= 1; off++) {
                    uint64_t n = step_allocs(names[k], ks_policy_i_needs_dlm(reg[i]) ? args : NULL, n_seq, off);
                    runs++;
                    if (n) {
                        print_message("%s, batch %d, %d layer(s) offloaded: %llu allocations in 4 steps\n", names[k],
                                      n_seq, off, (unsigned long long)n);
                        failures++;
                    }
                }
    }
    /* the refining stage behind a selector (alone, it is in the registry loop above) */
    const char *refined[] = {"quest+topp", "h2o+topp", "snapkv+quest+topp"};
    for (size_t k = 0; k < sizeof refined / sizeof refined[0]; k++)
        for (int n_seq = 1; n_seq <= 2; n_seq++)
            for (int off = 0; off <= 1; off++) {
                uint64_t n = step_allocs(refined[k], NULL, n_seq, off);
                runs++;
                if (n) {
                    print_message("%s, batch %d, %d layer(s) offloaded: %llu allocations in 4 steps\n", refined[k],
                                  n_seq, off, (unsigned long long)n);
                    failures++;
                }
            }
    print_message("%d configurations checked\n", runs);
    assert_int_equal(failures, 0);
}

/* The weight products of a decode step: Q8_0 and Q4_0 weights take the
 * packed kernels on AVX-512 VNNI hosts (and their fallbacks elsewhere); no
 * tile buffer may be allocated per product. */
static void test_no_allocation_with_quantized_weights(void **state) {
    (void)state;
    const ks_dtype types[] = {KS_DTYPE_Q8_0, KS_DTYPE_Q4_0};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        char path[600];
        snprintf(path, sizeof path, "%s/tiny-%zu.gguf", g_tmp, t);
        ks_gguf *vocab = NULL;
        assert_int_equal(ks_gguf_open(ks_test_fixture("models/aidreams260K.gguf"), &vocab), KS_OK);
        ks_shape_gen_params gp = {.type = types[t], .vocab = vocab, .seed = 9, .n_layer = 2, .n_ctx = 512};
        assert_int_equal(ks_shape_generate(ks_shape_find("tiny-llama"), &gp, path, NULL), KS_OK);
        ks_gguf_close(vocab);
        ks_model *saved = g_model;
        assert_int_equal(ks_model_load(path, ks_model_default_params(), &g_model), KS_OK);
        for (int n_seq = 1; n_seq <= 2; n_seq++) {
            uint64_t n = step_allocs("dense", NULL, n_seq, 0);
            if (n) fail_msg("%s weights, batch %d: %llu allocations in 4 steps", ks_dtype_name(types[t]), n_seq,
                            (unsigned long long)n);
        }
        ks_model_destroy(g_model);
        g_model = saved;
    }
}

/* gemma3: local layers drop their oldest pages at every decode step (page
 * recycling, no allocation); every policy, selecting on the global layer. */
static void test_no_allocation_with_local_layers(void **state) {
    (void)state;
    char path[600], args[600];
    snprintf(path, sizeof path, "%s/tiny-gemma3.gguf", g_tmp);
    snprintf(args, sizeof args, "dlm=%s", g_dlm);
    ks_model *saved = g_model;
    assert_int_equal(ks_test_tiny_shape("tiny-gemma3", 0, 9, 512, path, &g_model), 0);
    const ks_policy_i *const *reg = ks_policy_list();
    int failures = 0;
    for (int i = 0; reg[i]; i++)
        for (int n_seq = 1; n_seq <= 2; n_seq++) {
            uint64_t n = step_allocs(reg[i]->name, ks_policy_i_needs_dlm(reg[i]) ? args : NULL, n_seq, 1);
            if (n) {
                print_message("gemma3 %s, batch %d: %llu allocations in 4 steps\n", reg[i]->name, n_seq,
                              (unsigned long long)n);
                failures++;
            }
        }
    ks_model_destroy(g_model);
    g_model = saved;
    assert_int_equal(failures, 0);
}

/* The MoE FFN (infer/moe.c): routing, grouping and the experts' products
 * use the buffers the context made at creation, for batch 1 and 2, f16
 * and Q8_0 experts, dense and a selecting policy. */
static void test_no_allocation_with_experts(void **state) {
    (void)state;
    const ks_dtype types[] = {KS_DTYPE_F16, KS_DTYPE_Q8_0};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        char path[600];
        snprintf(path, sizeof path, "%s/tiny-moe-%zu.gguf", g_tmp, t);
        ks_gguf *vocab = NULL;
        assert_int_equal(ks_gguf_open(ks_test_fixture("models/aidreams260K.gguf"), &vocab), KS_OK);
        ks_shape_gen_params gp = {.type = types[t], .vocab = vocab, .seed = 9, .n_ctx = 512};
        assert_int_equal(ks_shape_generate(ks_shape_find("tiny-qwen3moe"), &gp, path, NULL), KS_OK);
        ks_gguf_close(vocab);
        ks_model *saved = g_model;
        assert_int_equal(ks_model_load(path, ks_model_default_params(), &g_model), KS_OK);
        const char *policies[] = {"dense", "quest"};
        for (int k = 0; k < 2; k++)
            for (int n_seq = 1; n_seq <= 2; n_seq++) {
                uint64_t n = step_allocs(policies[k], NULL, n_seq, 0);
                if (n) fail_msg("%s experts, %s, batch %d: %llu allocations in 4 steps", ks_dtype_name(types[t]),
                                policies[k], n_seq, (unsigned long long)n);
            }
        ks_model_destroy(g_model);
        g_model = saved;
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_allocation_in_a_decode_step),
        cmocka_unit_test(test_no_allocation_with_local_layers),
        cmocka_unit_test(test_no_allocation_with_quantized_weights),
        cmocka_unit_test(test_no_allocation_with_experts),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
