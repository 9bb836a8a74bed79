/*
 * test_swa.c — gemma3 and its sliding-window (local) layers.
 *
 * The numbers themselves are checked against the independent reference
 * (tests/golden/tiny-gemma3-f16.bin, test_golden) and full-budget policies
 * against dense (test_policy); this file checks what those cannot see:
 *  1. loading: which layers are local, the window, the two RoPE bases and
 *     the linear scaling, from the GGUF keys as llama.cpp reads them (the
 *     pattern key changes the split; as a per-layer array it is read layer
 *     by layer, and an array of the wrong length is refused);
 *  2. a local layer's KV stays bounded: after a long prefill and decode its
 *     heads hold at most window + P - 1 entries and its pool only the pages
 *     of those, while the global layer holds everything;
 *  3. the window makes a difference: a local layer's result depends only on
 *     the last W tokens (two prompts that differ only before the window of
 *     every local layer *and* are read identically by the global layer
 *     cannot be built, so instead: changing a token far back changes the
 *     logits only through the global layer; with the global layer made a
 *     local one by the pattern key, it changes nothing);
 *  4. chunking does not change a row's bits (the window inside a chunk), and
 *     a prefix-cache hit reproduces a cold prefill and the decode after it.
 */
#define _GNU_SOURCE
#include "infer/infer.h"
#include "gguf/gguf.h"
#include "model/shapes.h"
#include "kv/kv.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_path[256], g_path_local[256];
static ks_model *g_m;

static int make_model_arr(const ks_model_shape *s, const char *path, int32_t n_layer, const uint8_t *swa_layers,
                          int32_t n_swa_layers) {
    ks_gguf *vocab = NULL;
    if (ks_gguf_open(ks_test_fixture("models/aidreams260K.gguf"), &vocab) != KS_OK) return -1;
    ks_shape_gen_params gp = {.type = KS_DTYPE_F16, .vocab = vocab, .seed = 7, .n_layer = n_layer, .n_ctx = 1024,
                              .swa_layers = swa_layers, .n_swa_layers = n_swa_layers};
    ks_status st = ks_shape_generate(s, &gp, path, NULL);
    ks_gguf_close(vocab);
    return st == KS_OK ? 0 : -1;
}

static int make_model(const ks_model_shape *s, const char *path, int32_t n_layer) {
    return make_model_arr(s, path, n_layer, NULL, 0);
}

static int setup(void **state) {
    (void)state;
    snprintf(g_path, sizeof g_path, "/tmp/kvsieve-test-swa-%d.gguf", (int)getpid());
    snprintf(g_path_local, sizeof g_path_local, "/tmp/kvsieve-test-swa-local-%d.gguf", (int)getpid());
    if (make_model(ks_shape_find("tiny-gemma3"), g_path, 0) != 0) return -1;
    return ks_model_load(g_path, ks_model_default_params(), &g_m) == KS_OK ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    ks_model_destroy(g_m);
    unlink(g_path);
    unlink(g_path_local);
    return 0;
}

static void test_load_pattern(void **state) {
    (void)state;
    const ks_hparams *hp = &g_m->hp;
    assert_int_equal(hp->arch, KS_ARCH_GEMMA3);
    assert_int_equal(hp->n_swa, 16);
    for (int il = 0; il < hp->n_layer; il++) /* llama.cpp's default pattern 6: layer 5 global */
        assert_int_equal(g_m->layers[il].window, il % 6 == 5 ? 0 : 16);
    assert_true(hp->rope_neox && hp->embd_scale && hp->ffn_gelu);
    assert_true(hp->rope_base == 1e6f && hp->rope_base_swa == 10000.0f && hp->rope_scaling.type == KS_ROPE_SCALING_LINEAR && hp->rope_scaling.factor == 8.0f);
    assert_null(g_m->rope_freq_factors); /* linear scaling is resolved per context, not as divisors */
    assert_non_null(g_m->layers[0].attn_post_norm);
    assert_non_null(g_m->layers[0].ffn_post_norm);
    assert_non_null(g_m->layers[0].q_norm);
    assert_true(hp->attn_q_scale == 0); /* not the 27B */
    char buf[4096];
    assert_int_equal(ks_model_describe(g_m, buf, sizeof buf), KS_OK);
    assert_non_null(strstr(buf, "5 local (sliding window 16"));

    /* the pattern key: 3 gives local 0, 1, global 2, local 3 ... */
    ks_model_shape s = *ks_shape_find("tiny-gemma3");
    s.swa_pattern = 3;
    assert_int_equal(make_model(&s, g_path_local, 4), 0);
    ks_model *m = NULL;
    assert_int_equal(ks_model_load(g_path_local, ks_model_default_params(), &m), KS_OK);
    assert_int_equal(m->layers[0].window, 16);
    assert_int_equal(m->layers[1].window, 16);
    assert_int_equal(m->layers[2].window, 0);
    assert_int_equal(m->layers[3].window, 16);
    ks_model_destroy(m);

    /* the key as gguf-py's per-layer bool array (true: local), read layer by
     * layer: a split no period gives */
    static const uint8_t split[4] = {1, 0, 0, 1};
    assert_int_equal(make_model_arr(&s, g_path_local, 4, split, 4), 0);
    assert_int_equal(ks_model_load(g_path_local, ks_model_default_params(), &m), KS_OK);
    assert_int_equal(m->layers[0].window, 16);
    assert_int_equal(m->layers[1].window, 0);
    assert_int_equal(m->layers[2].window, 0);
    assert_int_equal(m->layers[3].window, 16);
    ks_model_destroy(m);
    /* an array of the wrong length is refused by name, not read past its end */
    assert_int_equal(make_model_arr(&s, g_path_local, 4, split, 3), 0);
    ks_test_expect_load_refused(g_path_local, "has 3 entries for 4 layers");
}

static ks_context *make_ctx(ks_model *m, int32_t n_ctx, int n_batch, const char *policy, int32_t budget) {
    ks_context_params p = ks_context_default_params();
    p.n_ctx = n_ctx;
    p.n_threads = 2;
    p.n_batch = n_batch;
    p.page = 8;
    p.policy = policy;
    p.budget = budget;
    p.sink = 4;
    p.window = 8;
    ks_context *c = NULL;
    assert_int_equal(ks_context_create(m, p, &c), KS_OK);
    return c;
}

static void fill_prompt(int32_t *t, int n, int salt) {
    for (int i = 0; i < n; i++) t[i] = (i * 37 + 11 + salt) % g_m->hp.n_vocab;
    t[0] = ks_token_bos(g_m) >= 0 ? ks_token_bos(g_m) : t[0];
}

static void test_local_kv_bounded(void **state) {
    (void)state;
    const int n_prompt = 300, steps = 40;
    ks_context *c = make_ctx(g_m, n_prompt + steps + 1, 32, "quest", 64);
    int32_t prompt[300];
    fill_prompt(prompt, n_prompt, 0);
    float *logits = malloc(sizeof(float) * g_m->hp.n_vocab);
    assert_int_equal(ks_prefill(c, 0, prompt, n_prompt, logits, NULL), KS_OK);
    int32_t seq = 0, tok = 5;
    for (int s = 0; s < steps; s++) assert_int_equal(ks_decode(c, &seq, &tok, 1, logits), KS_OK);
    const int32_t P = 8, W = 16, nkv = g_m->hp.n_head_kv;
    for (int il = 0; il < g_m->hp.n_layer; il++)
        for (int h = 0; h < nkv; h++) {
            int32_t n = ks_kv_n_entries(c->kv, 0, il, h);
            if (g_m->layers[il].window) {
                assert_true(n >= W && n <= W + P - 1);
                /* the entries kept are the last ones, in position order */
                ks_kv_page_meta pm;
                ks_kv_page_meta_get(c->kv, 0, il, h, ks_kv_n_pages(c->kv, 0, il, h) - 1, &pm);
                assert_int_equal(pm.pos[pm.fill - 1], n_prompt + steps - 1);
            } else {
                assert_int_equal(n, n_prompt + steps);
            }
        }
    for (int il = 0; il < g_m->hp.n_layer; il++) {
        int32_t used = ks_kv_layer_pages_in_use(c->kv, il);
        if (g_m->layers[il].window) assert_true(used <= nkv * ((W + P - 1 + P - 1) / P));
        else assert_int_equal(used, nkv * ((n_prompt + steps + P - 1) / P));
    }
    /* selections counted on the global layer only: attended < total there */
    ks_stats st;
    ks_context_stats(c, &st);
    assert_true(st.kv_entries_attended < st.kv_entries_total);
    free(logits);
    ks_context_destroy(c);
}

/* The last row's logits of a prompt, prefilled in chunks of n_batch. */
static float *prefill_logits(ks_model *m, const int32_t *prompt, int n, int n_batch) {
    ks_context *c = make_ctx(m, n + 8, n_batch, "dense", 0);
    float *logits = malloc(sizeof(float) * m->hp.n_vocab);
    assert_int_equal(ks_prefill(c, 0, prompt, n, logits, NULL), KS_OK);
    ks_context_destroy(c);
    return logits;
}

static void test_window_reach(void **state) {
    (void)state;
    const int n = 80;
    int32_t a[80], b[80];
    fill_prompt(a, n, 0);
    memcpy(b, a, sizeof a);
    b[3] = (b[3] + 100) % g_m->hp.n_vocab; /* far before every local window of the last row */
    size_t V = (size_t)g_m->hp.n_vocab;
    float *la = prefill_logits(g_m, a, n, 32), *lb = prefill_logits(g_m, b, n, 32);
    assert_true(memcmp(la, lb, V * sizeof(float)) != 0); /* the global layer sees it */
    free(la);
    free(lb);
    /* every layer local (pattern 0): a token 20 back (beyond W = 16 in every
     * layer, and the receptive field of the last row grows by W - 1 per
     * layer, so take one layer) changes nothing */
    ks_model_shape s = *ks_shape_find("tiny-gemma3");
    s.swa_pattern = 0;
    assert_int_equal(make_model(&s, g_path_local, 1), 0);
    ks_model *m = NULL;
    assert_int_equal(ks_model_load(g_path_local, ks_model_default_params(), &m), KS_OK);
    assert_int_equal(m->layers[0].window, 16);
    memcpy(b, a, sizeof a);
    b[n - 17] = (b[n - 17] + 100) % m->hp.n_vocab; /* just out of the last row's window */
    la = prefill_logits(m, a, n, 32);
    lb = prefill_logits(m, b, n, 32);
    assert_memory_equal(la, lb, V * sizeof(float));
    free(lb);
    memcpy(b, a, sizeof a);
    b[n - 16] = (b[n - 16] + 100) % m->hp.n_vocab; /* the oldest entry of the window */
    lb = prefill_logits(m, b, n, 32);
    assert_true(memcmp(la, lb, V * sizeof(float)) != 0);
    free(la);
    free(lb);
    ks_model_destroy(m);
}

static void test_chunk_invariance(void **state) {
    (void)state;
    const int n = 100;
    int32_t a[100];
    fill_prompt(a, n, 3);
    size_t V = (size_t)g_m->hp.n_vocab;
    float *ref = prefill_logits(g_m, a, n, 128);
    const int batches[] = {1, 7, 16, 33};
    for (size_t i = 0; i < sizeof batches / sizeof batches[0]; i++) {
        float *got = prefill_logits(g_m, a, n, batches[i]);
        if (memcmp(got, ref, V * sizeof(float)) != 0) fail_msg("chunks of %d differ from one chunk", batches[i]);
        free(got);
    }
    free(ref);
}

/* A prefix-cache hit (local layers restored whole, trimmed only after)
 * reproduces a cold prefill and the decode after it, bit for bit. */
static void test_prefix_cache_exact(void **state) {
    (void)state;
    const int n = 120, steps = 20;
    int32_t a[120];
    fill_prompt(a, n, 5);
    size_t V = (size_t)g_m->hp.n_vocab;
    float *cold = malloc(sizeof(float) * V * (steps + 1)), *warm = malloc(sizeof(float) * V * (steps + 1));
    ks_prefix_cache_params pp = ks_prefix_cache_default_params();
    ks_prefix_cache *pc = NULL;
    assert_int_equal(ks_prefix_cache_create(g_m, &pp, &pc), KS_OK);
    for (int pass = 0; pass < 3; pass++) {
        ks_context *c = make_ctx(g_m, n + steps + 8, 32, "dense", 0);
        float *out = pass == 0 ? cold : warm;
        int32_t cached = 0;
        if (pass == 0) assert_int_equal(ks_prefill(c, 0, a, n, out, NULL), KS_OK);
        else assert_int_equal(ks_prefill_cached(c, pc, 0, a, n, out, &cached), KS_OK);
        if (pass == 2) assert_true(cached > 0);
        int32_t seq = 0;
        for (int s = 0; s < steps; s++) {
            int32_t tok = (s * 13 + 1) % (int32_t)V;
            assert_int_equal(ks_decode(c, &seq, &tok, 1, out + (size_t)(s + 1) * V), KS_OK);
        }
        if (pass > 0 && memcmp(cold, warm, sizeof(float) * V * (steps + 1)) != 0)
            fail_msg("prefix cache pass %d (%d rows restored) differs from a cold prefill", pass, cached);
        ks_context_destroy(c);
    }
    ks_prefix_cache_destroy(pc);
    free(cold);
    free(warm);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_pattern),     cmocka_unit_test(test_local_kv_bounded),
        cmocka_unit_test(test_window_reach),     cmocka_unit_test(test_chunk_invariance),
        cmocka_unit_test(test_prefix_cache_exact),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
