/*
 * test_gptoss.c — the gpt-oss architecture (model/arch_gptoss.c) beyond
 * what the goldens (tests/golden/tiny-gptoss-*.bin against tools/reference.py)
 * and test_policy's full-budget check already pin:
 *
 *   - routing: the k largest logits, weighted by the softmax of those k
 *     alone (not of all experts, not renormalised probabilities);
 *   - binding: every layer has its sinks, output bias, expert biases, and
 *     local (even) / global (odd) layers alternate with the file's window;
 *   - a generated tiny-gptoss with MXFP4 experts: one prefill, a chunked
 *     prefill and prefill-then-decode give the same last logits (every
 *     attention row takes the same kernel: gpt-oss layers never take the
 *     blocked prefill kernels, which have no sinks);
 *   - bad files: a missing expert tensor, a missing sink tensor, an
 *     expert tensor of a type kvsieve does not know: clear errors, no crash.
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include "infer/infer.h"
#include "infer/moe.h"
#include "model/shapes.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_dir[128], g_path[192];
static ks_model *g_model;

static int setup(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/kvsieve-test-gptoss-XXXXXX");
    if (!mkdtemp(g_dir)) return -1;
    snprintf(g_path, sizeof g_path, "%s/tiny-gptoss-mxfp4.gguf", g_dir);
    ks_gguf *vocab = NULL;
    if (ks_gguf_open(ks_test_fixture("models/aidreams260K.gguf"), &vocab) != KS_OK) return -1;
    ks_shape_gen_params gp = {.type = KS_DTYPE_MXFP4, .vocab = vocab, .seed = 5, .n_ctx = 256, .n_threads = 2};
    ks_status st = ks_shape_generate(ks_shape_find("tiny-gptoss"), &gp, g_path, NULL);
    ks_gguf_close(vocab);
    if (st != KS_OK) return -1;
    return ks_model_load(g_path, ks_model_default_params(), &g_model) == KS_OK ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    ks_model_destroy(g_model);
    unlink(g_path);
    rmdir(g_dir);
    return 0;
}

static void test_route_topk_softmax(void **state) {
    (void)state;
    const float logits[6] = {0.5f, 2.0f, -1.0f, 2.5f, 1.0f, 0.0f};
    int32_t sel[3];
    float w[3];
    ks_moe_route_topk_softmax(logits, 6, 3, sel, w);
    assert_int_equal(sel[0], 3);
    assert_int_equal(sel[1], 1);
    assert_int_equal(sel[2], 4);
    double z = exp(2.5) + exp(2.0) + exp(1.0); /* the three kept logits only */
    assert_true(fabs(w[0] - exp(2.5) / z) < 1e-6);
    assert_true(fabs(w[1] - exp(2.0) / z) < 1e-6);
    assert_true(fabs(w[2] - exp(1.0) / z) < 1e-6);
}

static void test_binds(void **state) {
    (void)state;
    const ks_hparams *hp = &g_model->hp;
    assert_int_equal(hp->arch, KS_ARCH_GPTOSS);
    assert_int_equal(hp->n_expert, 8);
    assert_int_equal(hp->n_expert_used, 4);
    assert_int_equal(hp->n_swa, 16);
    assert_true(hp->expert_softmax_topk && hp->ffn_swiglu_oai && !hp->expert_norm);
    for (int il = 0; il < hp->n_layer; il++) {
        const ks_layer *L = &g_model->layers[il];
        assert_int_equal(L->window, il % 2 == 0 ? 16 : 0);
        assert_non_null(L->attn_sinks);
        assert_non_null(L->bo);
        assert_non_null(L->bq);
        assert_non_null(L->moe);
        assert_non_null(L->moe->router_b);
        assert_non_null(L->moe->down_b);
        assert_int_equal(L->moe->gate[0].type, KS_DTYPE_MXFP4);
        assert_int_equal(L->wq.type, KS_DTYPE_Q8_0);
    }
}

static ks_context *make_ctx(int n_batch) {
    ks_context_params p = ks_context_default_params();
    p.n_ctx = 128;
    p.n_batch = n_batch;
    p.n_threads = 2;
    ks_context *c = NULL;
    assert_int_equal(ks_context_create(g_model, p, &c), KS_OK);
    return c;
}

/* 40 tokens (past the 16-entry window): at once, in chunks of 7, and as 39
 * then one decode step. */
static void test_prefill_decode_agree(void **state) {
    (void)state;
    enum { N = 40 };
    const int V = ks_model_n_vocab(g_model);
    int32_t toks[N];
    for (int i = 0; i < N; i++) toks[i] = i == 0 ? 1 : 3 + (int32_t)((i * 37) % (V - 3));
    float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V), *d = malloc(sizeof(float) * V);
    ks_context *c = make_ctx(64);
    assert_int_equal(ks_prefill(c, 0, toks, N, a, NULL), KS_OK);
    ks_context_destroy(c);
    c = make_ctx(7);
    assert_int_equal(ks_prefill(c, 0, toks, N, b, NULL), KS_OK);
    ks_context_destroy(c);
    c = make_ctx(64);
    assert_int_equal(ks_prefill(c, 0, toks, N - 1, d, NULL), KS_OK);
    int32_t seq = 0;
    assert_int_equal(ks_decode(c, &seq, &toks[N - 1], 1, d), KS_OK);
    ks_context_destroy(c);
    double mx, e1 = ks_test_nmse(b, a, (size_t)V, &mx), e2 = ks_test_nmse(d, a, (size_t)V, &mx);
    /* the products round 8-bit activations per row and the attention rows all take
     * attend_one, so chunks and decode differ only by the GEMM's summation order */
    if (e1 > 1e-5 || e2 > 1e-5) fail_msg("chunked nmse %g, decode nmse %g", e1, e2);
    free(a), free(b), free(d);
}

/* ----------------------------------------------------------- bad files -- */
/* Copy g_path to path without tensor `drop`. */
static int rewrite_drop(const char *path, const char *drop) {
    ks_gguf *g = NULL;
    if (ks_gguf_open(g_path, &g) != KS_OK) return -1;
    ks_gguf_writer *w = NULL;
    if (ks_gguf_writer_create(&w) != KS_OK) return -1;
    for (int64_t i = 0; i < ks_gguf_n_kv(g); i++) ks_gguf_writer_copy_kv(w, ks_gguf_kv_at(g, i));
    for (int64_t i = 0; i < ks_gguf_n_tensors(g); i++) {
        const ks_gguf_tensor *t = ks_gguf_tensor_at(g, i);
        char name[96];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.data);
        if (!strcmp(name, drop)) continue;
        int64_t ne[4] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
        if (ks_gguf_writer_add_tensor(w, name, t->type, t->n_dims, ne, t->data, NULL, NULL) != KS_OK) return -1;
    }
    ks_status st = ks_gguf_writer_write(w, path);
    ks_gguf_writer_destroy(w);
    ks_gguf_close(g);
    return st == KS_OK ? 0 : -1;
}

/* Copy g_path to path with the type field of tensor `name`'s header entry
 * set to `type` (the GGUF tensor info: name, n_dims u32, ne u64[n_dims],
 * type u32, offset u64). */
static int rewrite_type(const char *path, const char *name, uint32_t type) {
    size_t len = 0;
    char *buf = ks_test_read_file(g_path, &len);
    if (!buf) return -1;
    size_t nl = strlen(name);
    char *p = NULL;
    for (size_t i = 8; i + nl + 4 < len && !p; i++) /* the name, preceded by its u64 length */
        if (!memcmp(buf + i, name, nl) && (uint64_t)(uint8_t)buf[i - 8] == nl) p = buf + i + nl;
    if (!p) return -1;
    uint32_t n_dims;
    memcpy(&n_dims, p, 4);
    memcpy(p + 4 + 8 * (size_t)n_dims, &type, 4);
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(buf, 1, len, f) == len;
    if (f) fclose(f);
    free(buf);
    return ok ? 0 : -1;
}

static void test_bad_files(void **state) {
    (void)state;
    char path[256];
    snprintf(path, sizeof path, "%s/bad.gguf", g_dir);
    assert_int_equal(rewrite_drop(path, "blk.2.ffn_up_exps.weight"), 0);
    ks_test_expect_load_refused(path, "expert tensor 'blk.2.ffn_up_exps.weight' is missing");
    assert_int_equal(rewrite_drop(path, "blk.1.attn_sinks.weight"), 0);
    ks_test_expect_load_refused(path, "tensor 'blk.1.attn_sinks.weight' is missing");
    assert_int_equal(rewrite_drop(path, "blk.0.ffn_down_exps.bias"), 0);
    ks_test_expect_load_refused(path, "tensor 'blk.0.ffn_down_exps.bias' is missing");
    /* GGML's IQ2_XXS (16): a type id kvsieve does not compute with */
    assert_int_equal(rewrite_type(path, "blk.0.ffn_gate_exps.weight", 16), 0);
    ks_test_expect_load_refused(path, "tensor 'blk.0.ffn_gate_exps.weight': type 16");
    /* an id no GGML type has */
    assert_int_equal(rewrite_type(path, "blk.3.ffn_down_exps.weight", 77), 0);
    ks_test_expect_load_refused(path, "tensor 'blk.3.ffn_down_exps.weight': type 77");
}

int main(void) {
    setenv("KS_ATTN", "f32", 1); /* as test_moe.c: the f32 prefill kernels */
    const struct CMUnitTest unit[] = {
        cmocka_unit_test(test_route_topk_softmax),
    };
    const struct CMUnitTest model[] = {
        cmocka_unit_test(test_binds),
        cmocka_unit_test(test_prefill_decode_agree),
        cmocka_unit_test(test_bad_files),
    };
    int rc = cmocka_run_group_tests_name("gptoss routing", unit, NULL, NULL);
    return rc | cmocka_run_group_tests_name("tiny-gptoss", model, setup, teardown);
}
