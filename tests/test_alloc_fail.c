/*
 * test_alloc_fail.c — a refused allocation is KS_ERR_NOMEM, undone, at the
 * library's entry points (issue 38, item 4).
 *
 * The allocator returns NULL rather than abort, so every caller has a path
 * that undoes what it did; paths that never run are paths that are wrong.
 * The counting hook (ks_alloc_fail_after) walks them: for every n below the
 * number of allocations a call makes, refuse the n-th and require exactly
 * KS_ERR_NOMEM (with a message), nothing returned, and — under `make asan`,
 * where LeakSanitizer checks the process at exit — nothing leaked.  Then the
 * call must still succeed unrefused, and a context that saw a prefill or a
 * decode refused must still compute the same logits afterwards: a failure
 * leaves the objects involved valid (kvsieve.h's error convention).
 * Calls: model load (the GGUF, the tokenizer, the weights and their
 * repacking), context creation for the registry's policy families (spec
 * with a generated draft head), the tokenizer, prefill and decode, the
 * prefix cache on a directory, the sampler and the stop-string matcher.  The server-level test is
 * tests/server/test_oom.c.
 */
#define _GNU_SOURCE
#include "core/core.h"
#include "eval/eval.h"
#include "gguf/gguf.h"
#include "sample/stop.h"
#include "model/safetensors.h"
#include "model/torch_bin.h"
#include "model/eagle3.h"
#include "model/shapes.h"
#include "testutil.h"

#include "kvsieve.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static ks_model *g_model;
static char g_tmp[256], g_path[512], g_dlm[512], g_cache[512];

static int setup(void **state) {
    (void)state;
    ks_log_set_level(KS_LOG_WARN); /* spec logs each creation */
    snprintf(g_tmp, sizeof g_tmp, "/tmp/kvsieve-test-alloc-fail-XXXXXX");
    if (!mkdtemp(g_tmp)) return -1;
    snprintf(g_path, sizeof g_path, "%s/tiny.gguf", g_tmp);
    snprintf(g_dlm, sizeof g_dlm, "%s/dlm", g_tmp);
    snprintf(g_cache, sizeof g_cache, "%s/cache", g_tmp);
    if (ks_test_tiny_llama(2, 11, g_path, &g_model) != 0) return -1;
    return ks_eagle3_generate_head(ks_shape_find("tiny-llama"), 2, ks_model_n_vocab(g_model), 512, 7, g_dlm) == KS_OK ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    ks_alloc_fail_after(-1);
    ks_model_destroy(g_model);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
    return system(cmd) == 0 ? 0 : -1;
}

/* The n-th allocation refused: exactly KS_ERR_NOMEM with a message, or OK
 * when the call needed fewer (then *done). */
static void expect_nomem_or_ok(ks_status st, long n, const char *what, bool *done) {
    ks_alloc_fail_after(-1);
    if (st == KS_OK) {
        *done = true;
        return;
    }
    if (st != KS_ERR_NOMEM) fail_msg("%s, allocation %ld refused: %s (%s), want out of memory", what, n, ks_status_str(st),
                                     ks_last_error());
    assert_true(ks_last_error()[0] != 0);
}

static void test_model_load(void **state) {
    (void)state;
    const char *paths[] = {g_path, ks_test_fixture("models/aidreams260K.gguf")};
    for (int k = 0; k < 2; k++) {
        for (int mmap = 0; mmap < 2; mmap++) {
            ks_model_params mp = ks_model_default_params();
            mp.use_mmap = mmap;
            bool done = false;
            long n = 0;
            for (; !done && n < 100000; n++) {
                ks_model *m = NULL;
                ks_alloc_fail_after(n);
                ks_status st = ks_model_load(paths[k], mp, &m);
                expect_nomem_or_ok(st, n, "model load", &done);
                if (!done) assert_null(m);
                ks_model_destroy(m);
            }
            assert_true(done && n > 5);
            print_message("model load %s (%s): %ld allocations refused one at a time\n", k ? "aidreams260K" : "tiny-llama",
                          mmap ? "mapped" : "read", n - 1);
        }
    }
}

static void test_context_create(void **state) {
    (void)state;
    static const struct {
        const char *policy, *args;
        int32_t budget;
    } pols[] = {
        {"dense", NULL, 0},     {"quest", NULL, 32},    {"chess", NULL, 32}, {"streaming", NULL, 32},
        {"snapkv", NULL, 32},   {"lrqk", NULL, 32},     {"freekv", NULL, 32}, {"h2o", NULL, 32},
        {"snapkv+quest", NULL, 32}, {"spec", g_dlm, 32},
    };
    for (size_t k = 0; k < sizeof pols / sizeof pols[0]; k++) {
        ks_context_params cp = ks_context_default_params();
        cp.n_ctx = 128;
        cp.n_seq = 2;
        cp.n_threads = 2;
        cp.policy = pols[k].policy;
        char args[600];
        snprintf(args, sizeof args, "dlm=%s", pols[k].args ? pols[k].args : "");
        cp.policy_args = pols[k].args ? args : NULL;
        cp.budget = pols[k].budget;
        bool done = false;
        long n = 0;
        for (; !done && n < 100000; n++) {
            ks_context *c = NULL;
            ks_alloc_fail_after(n);
            ks_status st = ks_context_create(g_model, cp, &c);
            expect_nomem_or_ok(st, n, pols[k].policy, &done);
            if (!done) assert_null(c);
            ks_context_destroy(c);
        }
        assert_true(done && n > 5);
        print_message("context %s: %ld allocations refused one at a time\n", pols[k].policy, n - 1);
    }
}

static void test_tokenize(void **state) {
    (void)state;
    static const char text[] = "Once upon a time, a little dog ran to the river. <s> It was happy!";
    int32_t want[256], got[256];
    size_t nw = 0, ng = 0;
    assert_int_equal(ks_tokenize(g_model, text, strlen(text), true, true, want, 256, &nw), KS_OK);
    bool done = false;
    for (long n = 0; !done && n < 10000; n++) {
        ks_alloc_fail_after(n);
        ks_status st = ks_tokenize(g_model, text, strlen(text), true, true, got, 256, &ng);
        expect_nomem_or_ok(st, n, "tokenize", &done);
    }
    assert_true(done);
    assert_int_equal(ng, nw);
    assert_memory_equal(got, want, sizeof(int32_t) * nw);
}

/* A BPE vocabulary (GPT-2's pre-tokenizer regexes, merges) and an SPM one
 * with a chat template: load and encode refused anywhere give NOMEM or the
 * same ids. */
static void test_vocabularies(void **state) {
    (void)state;
    static const char *const vocabs[] = {"tokenizer/ggml-vocab-gpt-2.gguf", "tokenizer/ggml-vocab-phi-3.gguf"};
    static const char text[] = "Hello world!  It's 2024: the   quick brown fox, don't you think? \xc3\xa9t\xc3\xa9 <|end|>";
    for (size_t k = 0; k < sizeof vocabs / sizeof vocabs[0]; k++) {
        ks_model_params mp = ks_model_default_params();
        mp.vocab_only = true;
        ks_model *want_m = NULL;
        assert_int_equal(ks_model_load(ks_test_fixture(vocabs[k]), mp, &want_m), KS_OK);
        int32_t want[256], got[256];
        size_t nw = 0, ng = 0;
        assert_int_equal(ks_tokenize(want_m, text, strlen(text), true, true, want, 256, &nw), KS_OK);
        bool done = false;
        long n = 0;
        for (; !done && n < 100000; n++) {
            ks_model *m = NULL;
            ks_alloc_fail_after(n);
            ks_status st = ks_model_load(ks_test_fixture(vocabs[k]), mp, &m);
            if (st == KS_OK) st = ks_tokenize(m, text, strlen(text), true, true, got, 256, &ng);
            expect_nomem_or_ok(st, n, vocabs[k], &done);
            if (st == KS_OK) {
                assert_int_equal(ng, nw);
                assert_memory_equal(got, want, sizeof(int32_t) * nw);
            }
            ks_model_destroy(m);
        }
        assert_true(done);
        print_message("%s: load and encode, %ld allocations refused one at a time\n", vocabs[k], n - 1);
        ks_model_destroy(want_m);
    }
}

/* Prefill and decode refused part-way: NOMEM, the sequence reset or left as
 * it was, and the same logits as an unrefused run afterwards. */
static void test_prefill_decode(void **state) {
    (void)state;
    static const char *const policies[] = {"dense", "quest", "snapkv"};
    int32_t V = ks_model_n_vocab(g_model);
    float *want = malloc(sizeof(float) * (size_t)V), *got = malloc(sizeof(float) * (size_t)V);
    int32_t prompt[40];
    for (int i = 0; i < 40; i++) prompt[i] = 1 + (i * 7) % (V - 1);
    for (size_t k = 0; k < sizeof policies / sizeof policies[0]; k++) {
        ks_context_params cp = ks_context_default_params();
        cp.n_ctx = 128;
        cp.n_threads = 2;
        cp.policy = policies[k];
        cp.budget = strcmp(policies[k], "dense") ? 24 : 0;
        ks_context *c = NULL;
        assert_int_equal(ks_context_create(g_model, cp, &c), KS_OK);
        int32_t seq = 0, tok = 5;
        /* the reference: prefill, one decode */
        assert_int_equal(ks_prefill(c, 0, prompt, 40, got, NULL), KS_OK);
        assert_int_equal(ks_decode(c, &seq, &tok, 1, want), KS_OK);
        bool done = false;
        long n = 0;
        for (; !done && n < 10000; n++) {
            ks_seq_reset(c, 0);
            ks_alloc_fail_after(n);
            ks_status st = ks_prefill(c, 0, prompt, 40, got, NULL);
            if (st == KS_OK) st = ks_decode(c, &seq, &tok, 1, got);
            expect_nomem_or_ok(st, n, policies[k], &done);
        }
        assert_true(done);
        print_message("prefill + decode %s: %ld allocations refused one at a time\n", policies[k], n - 1);
        /* after every refusal: the same answer */
        ks_seq_reset(c, 0);
        assert_int_equal(ks_prefill(c, 0, prompt, 40, got, NULL), KS_OK);
        assert_int_equal(ks_decode(c, &seq, &tok, 1, got), KS_OK);
        assert_memory_equal(got, want, sizeof(float) * (size_t)V);
        ks_context_destroy(c);
    }
    free(want);
    free(got);
}

/* The prefix cache on a directory: a restore refused part-way computes the
 * rows itself (a miss) or fails with NOMEM, and either way the logits are
 * those of the uncached prefill. */
static void test_prefix_cache(void **state) {
    (void)state;
    int32_t V = ks_model_n_vocab(g_model);
    float *want = malloc(sizeof(float) * (size_t)V), *got = malloc(sizeof(float) * (size_t)V);
    int32_t prompt[100];
    for (int i = 0; i < 100; i++) prompt[i] = 1 + (i * 13) % (V - 1);
    ks_context_params cp = ks_context_default_params();
    cp.n_ctx = 128;
    cp.n_threads = 2;
    ks_context *c = NULL;
    assert_int_equal(ks_context_create(g_model, cp, &c), KS_OK);
    assert_int_equal(ks_prefill(c, 0, prompt, 100, want, NULL), KS_OK);
    ks_prefix_cache_params pp = ks_prefix_cache_default_params();
    pp.dir = g_cache;
    pp.write_behind = false;
    bool done = false;
    long n = 0;
    for (; !done && n < 10000; n++) {
        ks_prefix_cache *pc = NULL;
        ks_alloc_fail_after(n);
        ks_status st = ks_prefix_cache_create(g_model, &pp, &pc);
        if (st == KS_OK) {
            ks_seq_reset(c, 0);
            int32_t hit = 0;
            st = ks_prefill_cached(c, pc, 0, prompt, 100, got, &hit); /* takes the blocks */
            if (st == KS_OK) {
                ks_seq_reset(c, 0);
                st = ks_prefill_cached(c, pc, 0, prompt, 100, got, &hit); /* restores them */
            }
        }
        expect_nomem_or_ok(st, n, "prefix cache", &done);
        if (st == KS_OK) assert_memory_equal(got, want, sizeof(float) * (size_t)V);
        ks_prefix_cache_destroy(pc);
    }
    assert_true(done && n > 3);
    print_message("prefix cache create, capture and restore: %ld allocations refused one at a time\n", n - 1);
    ks_context_destroy(c);
    free(want);
    free(got);
}

static void test_sampler_and_stops(void **state) {
    (void)state;
    static const char *const stops[] = {"The end", "\n\n", "zz"};
    ks_sampler_params sp = ks_sampler_default_params();
    sp.repeat_last_n = 16;
    bool done = false;
    for (long n = 0; !done && n < 1000; n++) {
        ks_sampler *smp = NULL;
        ks_stop_matcher *m = NULL;
        ks_alloc_fail_after(n);
        ks_status st = ks_sampler_create(sp, ks_model_n_vocab(g_model), &smp);
        if (st == KS_OK) st = ks_stop_create(stops, 3, &m);
        ks_stop_out o;
        static char big[600];
        memset(big, 'a', sizeof big - 1);
        if (st == KS_OK) st = ks_stop_feed(m, "The e", 5, &o); /* held back: a stop may start here */
        if (st == KS_OK) st = ks_stop_feed(m, big, sizeof big - 1, &o);
        expect_nomem_or_ok(st, n, "sampler and stop strings", &done);
        ks_sampler_destroy(smp);
        ks_stop_destroy(m);
    }
    assert_true(done);
}

/* Files of the other formats (the fuzzers' seeds), a written GGUF, and
 * generated eval instances: NOMEM or the same result as unrefused. */
static void test_formats_and_eval(void **state) {
    (void)state;
    static const char *const st_files[] = {"mixed.safetensors", "eagle3_head.safetensors", "metadata_only.safetensors"};
    for (size_t k = 0; k < sizeof st_files / sizeof st_files[0]; k++) {
        char rel[128];
        snprintf(rel, sizeof rel, "tests/fuzz/corpus_safetensors/%s", st_files[k]);
        size_t len = 0;
        char *buf = ks_test_read_file(ks_test_source(rel), &len);
        assert_non_null(buf);
        bool done = false;
        for (long n = 0; !done && n < 10000; n++) {
            ks_safetensors *st = NULL;
            ks_alloc_fail_after(n);
            expect_nomem_or_ok(ks_safetensors_open_buffer(buf, len, &st), n, st_files[k], &done);
            ks_safetensors_close(st);
        }
        assert_true(done);
        free(buf);
    }
    size_t len = 0;
    char *buf = ks_test_read_file(ks_test_source("tests/fuzz/corpus_torch_bin/shard.bin"), &len);
    assert_non_null(buf);
    bool done = false;
    for (long n = 0; !done && n < 10000; n++) {
        ks_torch_bin *tb = NULL;
        ks_alloc_fail_after(n);
        expect_nomem_or_ok(ks_torch_bin_parse(buf, len, &tb), n, "torch.save", &done);
        ks_torch_bin_free(tb);
    }
    assert_true(done);
    free(buf);
    /* a GGUF written with every kind of value */
    char out[600];
    snprintf(out, sizeof out, "%s/w.gguf", g_tmp);
    float data[64];
    for (int i = 0; i < 64; i++) data[i] = (float)i;
    int64_t ne[2] = {32, 2};
    done = false;
    for (long n = 0; !done && n < 10000; n++) {
        ks_gguf_writer *w = NULL;
        ks_alloc_fail_after(n);
        ks_status st = ks_gguf_writer_create(&w);
        if (st == KS_OK) {
            ks_gguf_writer_set_u32(w, "a.u32", 7);
            ks_gguf_writer_set_str(w, "a.str", "hello");
            uint32_t arr[3] = {1, 2, 3};
            ks_gguf_writer_set_arr(w, "a.arr", KS_GGUF_UINT32, arr, 3);
            st = ks_gguf_writer_add_tensor(w, "t", KS_DTYPE_F32, 2, ne, data, NULL, NULL);
            if (st == KS_OK) st = ks_gguf_writer_write(w, out);
        }
        expect_nomem_or_ok(st, n, "GGUF writer", &done);
        ks_gguf_writer_destroy(w);
    }
    assert_true(done);
    /* eval instances */
    for (int task = 0; task < KS_EVAL_TASK_COUNT; task++) {
        ks_eval_instance want;
        if (ks_eval_generate((ks_eval_task)task, 3, 200, 0.5, g_model, &want) != KS_OK) continue; /* too short for it */
        done = false;
        for (long n = 0; !done && n < 100000; n++) {
            ks_eval_instance got;
            ks_alloc_fail_after(n);
            ks_status st = ks_eval_generate((ks_eval_task)task, 3, 200, 0.5, g_model, &got);
            expect_nomem_or_ok(st, n, "eval instance", &done);
            if (st == KS_OK) {
                assert_string_equal(got.prompt, want.prompt);
                ks_eval_instance_free(&got);
            }
        }
        assert_true(done);
        ks_eval_instance_free(&want);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_load),
        cmocka_unit_test(test_context_create),
        cmocka_unit_test(test_tokenize),
        cmocka_unit_test(test_vocabularies),
        cmocka_unit_test(test_prefill_decode),
        cmocka_unit_test(test_prefix_cache),
        cmocka_unit_test(test_sampler_and_stops),
        cmocka_unit_test(test_formats_and_eval),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
