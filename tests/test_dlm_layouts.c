#define _GNU_SOURCE
/*
 * test_dlm_layouts.c — published EAGLE-3 drafts load as they are downloaded.
 *
 * The fixtures (tests/fixtures/models/dlm-layouts/, written by
 * tools/make_dlm_layouts.py with PyTorch, committed) are one seeded draft
 * for a tiny llama target in the layouts users download: the EAGLE
 * authors' pytorch_model.bin (torch.save, fp16, no embed_tokens, their
 * config.json without rope_theta or aux ids), the same tensors as
 * model.safetensors and as a sharded torch checkpoint, and a SpecForge
 * export (bf16, fc_norm, eagle_config's aux ids counted as layer outputs,
 * transformers 5's rope_parameters).  Checked here:
 *  - the torch and safetensors copies hold the same tensors byte for byte,
 *    and the same selections come out of spec with each;
 *  - the retrieval head's q / k match the projects' forward computed by the
 *    tool in float64 (so fc_norm, rope_parameters' theta and the embedding /
 *    hidden order are all as published);
 *  - the aux-layer convention follows the key the checkpoint uses, ids are
 *    concatenated in ascending layer order, spec's aux_ids= overrides;
 *  - d2t / t2d are validated even when only the head is loaded;
 *  - spec at full budget is dense bit for bit with each layout;
 *  - the unpickler refuses a foreign global, a truncated zip and a view
 *    outside its storage with messages that say so.
 * Each convention test failed on the loader before these layouts were read.
 */
#include "draft/eagle3.h"
#include "model/shapes.h"
#include "checkpoint/torch_bin.h"
#include "gguf/gguf.h"
#include "infer/infer.h"
#include "testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_tmp[256];
static ks_model *g_target; /* hidden 64, 4 layers, 4 / 2 heads of 16: tools/make_dlm_layouts.py's target */

static const char *layout(const char *name) {
    static char buf[4][600];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s", ks_test_fixture("models/dlm-layouts"));
    size_t n = strlen(buf[k]);
    snprintf(buf[k] + n, sizeof buf[k] - n, "/%s", name);
    return buf[k];
}

static int setup(void **state) {
    (void)state;
    snprintf(g_tmp, sizeof g_tmp, "/tmp/kvsieve-test-dlm-layouts-XXXXXX");
    if (!mkdtemp(g_tmp)) return -1;
    static const ks_model_shape shape = {"tiny-eagle-target", "llama", 64, 4, 4, 2, 16, 64, 10000.f, 1e-5f, 1024,
                                         false, false, false, false, 0, 0, 0, 0, .n_rot = 0};
    ks_gguf *vocab = NULL;
    if (ks_gguf_open(ks_test_fixture("models/aidreams260K.gguf"), &vocab) != KS_OK) return -1;
    char path[400];
    snprintf(path, sizeof path, "%s/target.gguf", g_tmp);
    ks_shape_gen_params gp = {.type = KS_DTYPE_F16, .vocab = vocab, .seed = 37, .n_ctx = 1024};
    ks_status st = ks_shape_generate(&shape, &gp, path, NULL);
    ks_gguf_close(vocab);
    if (st != KS_OK) return -1;
    return ks_model_load(path, ks_model_default_params(), &g_target) == KS_OK ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    ks_model_destroy(g_target);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
    return system(cmd) == 0 ? 0 : -1;
}

/* ------------------------------------------------------- the tensors -- */

static void same_tensors(const char *a_dir, const char *b_dir) {
    ks_safetensors *a = NULL, *b = NULL;
    if (ks_safetensors_open(a_dir, true, &a) != KS_OK) fail_msg("%s: %s", a_dir, ks_last_error());
    if (ks_safetensors_open(b_dir, false, &b) != KS_OK) fail_msg("%s: %s", b_dir, ks_last_error());
    assert_int_equal(ks_safetensors_count(a), ks_safetensors_count(b));
    for (int64_t i = 0; i < ks_safetensors_count(a); i++) {
        const ks_st_tensor *x = ks_safetensors_at(a, i), *y = ks_safetensors_at(b, i);
        assert_string_equal(x->name, y->name);
        assert_int_equal(x->dtype, y->dtype);
        assert_int_equal(x->n_dims, y->n_dims);
        assert_memory_equal(x->shape, y->shape, sizeof x->shape);
        assert_int_equal(x->nbytes, y->nbytes);
        if (memcmp(x->data, y->data, x->nbytes)) fail_msg("tensor %s differs between %s and %s", x->name, a_dir, b_dir);
    }
    ks_safetensors_close(a);
    ks_safetensors_close(b);
}

static void test_bin_and_safetensors_hold_the_same(void **state) {
    (void)state;
    same_tensors(layout("eagle-bin"), layout("eagle-st"));
    same_tensors(layout("eagle-sharded"), layout("eagle-st"));
    ks_safetensors *st = NULL;
    assert_int_equal(ks_safetensors_open(layout("eagle-sharded"), true, &st), KS_OK);
    assert_int_equal(ks_safetensors_n_shards(st), 2);
    ks_safetensors_close(st);
    /* a single file by name too */
    assert_int_equal(ks_safetensors_open(layout("tiny.bin"), true, &st), KS_OK);
    assert_int_equal(ks_safetensors_count(st), 4);
    const ks_st_tensor *t = ks_safetensors_find(st, "b");
    assert_non_null(t);
    assert_int_equal(t->dtype, KS_ST_BF16);
    float *f = NULL;
    assert_int_equal(ks_safetensors_to_f32(t, 0, NULL, &f), KS_OK);
    assert_true(f[0] == 2.5f && f[3] == 2.5f);
    ks_free(f);
    t = ks_safetensors_find(st, "a");
    assert_true(t->dtype == KS_ST_F16 && t->n_dims == 2 && t->shape[0] == 2 && t->shape[1] == 3);
    t = ks_safetensors_find(st, "c");
    int64_t c[3];
    memcpy(c, t->data, sizeof c);
    assert_true(t->dtype == KS_ST_I64 && c[0] == 0 && c[2] == 2);
    t = ks_safetensors_find(st, "d");
    assert_true(t->dtype == KS_ST_BOOL && ((const uint8_t *)t->data)[0] == 1 && ((const uint8_t *)t->data)[1] == 0);
    ks_safetensors_close(st);
    /* the same archive with its directory in zip64 form (saturated 32-bit fields) */
    same_tensors(layout("tiny.bin"), layout("tiny-zip64.bin"));
}

/* ----------------------------------------------- the head's forward -- */

static double *json_vec(const cJSON *o, const char *key, int *n) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, key);
    assert_true(cJSON_IsArray(a));
    *n = cJSON_GetArraySize(a);
    double *v = malloc(sizeof(double) * (size_t)*n);
    int i = 0;
    for (const cJSON *e = a->child; e; e = e->next) v[i++] = e->valuedouble;
    return v;
}

/* q, k of the retrieval head at the reference position against the
 * published forward computed by tools/make_dlm_layouts.py. */
static void check_reference(const char *dir, const char *which) {
    size_t len = 0;
    char path[700];
    snprintf(path, sizeof path, "%s", layout("reference.json"));
    char *text = ks_test_read_file(path, &len);
    assert_non_null(text);
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    assert_non_null(root);
    int nh, ne, nq, nk;
    double *h3d = json_vec(root, "h3", &nh), *embd = json_vec(root, "emb", &ne);
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(root, which);
    double *qr = json_vec(r, "q", &nq), *kr = json_vec(r, "k", &nk);
    int pos = cJSON_GetObjectItemCaseSensitive(root, "pos")->valueint;
    float *h3 = malloc(sizeof(float) * nh), *emb = malloc(sizeof(float) * ne), *q = malloc(sizeof(float) * nq),
          *k = malloc(sizeof(float) * nk);
    for (int i = 0; i < nh; i++) h3[i] = (float)h3d[i];
    for (int i = 0; i < ne; i++) emb[i] = (float)embd[i];
    ks_eagle3_params ep = ks_eagle3_default_params();
    ep.head_only = true;
    ks_eagle3 *d = NULL;
    if (ks_eagle3_load(dir, ep, &d) != KS_OK) fail_msg("%s: %s", dir, ks_last_error());
    assert_int_equal(d->cfg.n_head * d->cfg.head_dim, nq);
    assert_int_equal(ks_eagle3_head_qk(d, h3, emb, pos, q, k), KS_OK);
    double scale = 0;
    for (int i = 0; i < nq; i++) scale = fmax(scale, fabs(qr[i]));
    for (int i = 0; i < nq; i++)
        if (fabs(q[i] - qr[i]) > 1e-3 * scale) fail_msg("%s: q[%d] = %g, the published forward gives %g", which, i, q[i], qr[i]);
    for (int i = 0; i < nk; i++)
        if (fabs(k[i] - kr[i]) > 1e-3 * scale) fail_msg("%s: k[%d] = %g, the published forward gives %g", which, i, k[i], kr[i]);
    ks_eagle3_destroy(d);
    free(h3); free(emb); free(q); free(k); free(h3d); free(embd); free(qr); free(kr);
    cJSON_Delete(root);
}

/* EAGLE's config has no rope_theta: base 10000, as its rotary embedding defaults */
static void test_eagle_forward(void **state) {
    (void)state;
    check_reference(layout("eagle-bin"), "eagle");
    check_reference(layout("eagle-st"), "eagle");
}

/* fc_norm on each fused state, and theta from rope_parameters (500000):
 * both were ignored before, each moving q and k far outside the tolerance */
static void test_specforge_forward(void **state) {
    (void)state;
    check_reference(layout("specforge"), "specforge");
    ks_eagle3 *d = NULL;
    assert_int_equal(ks_eagle3_load(layout("specforge"), ks_eagle3_default_params(), &d), KS_OK);
    assert_true(d->cfg.rope_theta == 500000.0f);
    assert_non_null(d->fc_norm[0]);
    assert_true(d->cfg.fc_norm);
    char desc[1024];
    assert_int_equal(ks_eagle3_describe(d, desc, sizeof desc), KS_OK);
    assert_non_null(strstr(desc, "fc_norm"));
    ks_eagle3_destroy(d);
}

/* ------------------------------------------------------- conventions -- */

static void write_text(const char *dir, const char *name, const char *text) {
    mkdir(dir, 0700);
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    assert_int_equal(ks_test_write_file(p, text, strlen(text)), 0);
}

/* A head-only checkpoint (hidden 8, 2 heads of 4) with the given config
 * fragment and optional vocab maps (vocab 8, draft vocab 4). */
static void write_small(const char *dir, const char *extra_cfg, const int64_t *d2t, const uint8_t *t2d) {
    char cfg[800];
    snprintf(cfg, sizeof cfg,
             "{\"architectures\":[\"LlamaForCausalLMEagle3\"],\"hidden_size\":8,\"num_attention_heads\":2,"
             "\"num_key_value_heads\":1,\"head_dim\":4,\"vocab_size\":8,\"draft_vocab_size\":4%s}", extra_cfg);
    write_text(dir, "config.json", cfg);
    static float fc[8 * 24], ones[8], q[8 * 16], k[4 * 16];
    for (int i = 0; i < 8; i++) ones[i] = 1;
    ks_test_st_tensor t[8] = {
        {"fc.weight", "F32", 2, {8, 24}, fc, sizeof fc},
        {"midlayer.hidden_norm.weight", "F32", 1, {8}, ones, sizeof ones},
        {"midlayer.input_layernorm.weight", "F32", 1, {8}, ones, sizeof ones},
        {"midlayer.self_attn.q_proj.weight", "F32", 2, {8, 16}, q, sizeof q},
        {"midlayer.self_attn.k_proj.weight", "F32", 2, {4, 16}, k, sizeof k},
    };
    int n = 5;
    if (d2t) t[n++] = (ks_test_st_tensor){"d2t", "I64", 1, {4}, d2t, sizeof(int64_t) * 4};
    if (t2d) t[n++] = (ks_test_st_tensor){"t2d", "BOOL", 1, {8}, t2d, 8};
    size_t size = 0;
    uint8_t *img = ks_test_safetensors_build(t, n, NULL, &size);
    char p[600];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    assert_int_equal(ks_test_write_file(p, img, size), 0);
    free(img);
}

static ks_eagle3 *load_head(const char *dir) {
    ks_eagle3_params ep = ks_eagle3_default_params();
    ep.head_only = true;
    ks_eagle3 *d = NULL;
    if (ks_eagle3_load(dir, ep, &d) != KS_OK) fail_msg("%s: %s", dir, ks_last_error());
    return d;
}

static void expect_aux(const ks_eagle3 *d, int n_layer, int a, int b, int c) {
    int32_t aux[3];
    ks_eagle3_aux_layers(d, n_layer, aux);
    if (aux[0] != a || aux[1] != b || aux[2] != c)
        fail_msg("aux layers [%d, %d, %d], want [%d, %d, %d]", aux[0], aux[1], aux[2], a, b, c);
}

static void test_aux_conventions(void **state) {
    (void)state;
    /* SpecForge / SGLang: eagle_config ids [0, 1, 2] are layer outputs -> the streams entering 1, 2, 3 */
    ks_eagle3 *d = load_head(layout("specforge"));
    expect_aux(d, 4, 1, 2, 3);
    assert_true(d->cfg.aux_ids_are_outputs);
    assert_non_null(strstr(d->cfg.aux_source, "SpecForge"));
    ks_eagle3_target t = {.n_vocab = 512, .n_embd = 64, .n_layer = 4, .n_head = 4, .n_head_kv = 2, .head_dim = 16};
    assert_int_equal(ks_eagle3_check_target(d, &t), KS_OK); /* output of the last layer (4) is capturable */
    ks_eagle3_destroy(d);
    /* EAGLE's release: no ids, EAGLE-3's default [2, L/2, L-3], ascending */
    d = load_head(layout("eagle-bin"));
    expect_aux(d, 32, 2, 16, 29);
    expect_aux(d, 4, 1, 2, 2);
    ks_eagle3_destroy(d);
    char dir[400];
    /* vLLM / speculators: the top-level key counts inputs; listed out of order, concatenated ascending */
    snprintf(dir, sizeof dir, "%s/aux-unsorted", g_tmp);
    write_small(dir, ",\"eagle_aux_hidden_state_layer_ids\":[9,1,5]", NULL, NULL);
    d = load_head(dir);
    expect_aux(d, 12, 1, 5, 9);
    /* spec's override, both conventions */
    int32_t ids[3] = {3, 0, 6};
    ks_eagle3_set_aux_layers(d, ids, true, "test");
    expect_aux(d, 12, 1, 4, 7);
    ks_eagle3_set_aux_layers(d, ids, false, "test");
    expect_aux(d, 12, 0, 3, 6);
    ks_eagle3_destroy(d);
    /* both keys: the nested (SpecForge) one is what trained the draft */
    snprintf(dir, sizeof dir, "%s/aux-both", g_tmp);
    write_small(dir, ",\"eagle_aux_hidden_state_layer_ids\":[2,6,9],\"eagle_config\":{\"eagle_aux_hidden_state_layer_ids\":[1,5,8]}",
                NULL, NULL);
    d = load_head(dir);
    expect_aux(d, 12, 2, 6, 9);
    assert_true(d->cfg.aux_ids_are_outputs);
    ks_eagle3_destroy(d);
}

static void test_rope_parameters(void **state) {
    (void)state;
    char dir[400];
    snprintf(dir, sizeof dir, "%s/rope-v5", g_tmp);
    write_small(dir,
                ",\"rope_parameters\":{\"rope_type\":\"llama3\",\"rope_theta\":500000.0,\"factor\":8.0,"
                "\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192}",
                NULL, NULL);
    ks_eagle3 *d = load_head(dir);
    assert_true(d->cfg.rope_theta == 500000.0f);
    assert_int_equal(d->cfg.rope.type, KS_ROPE_SCALING_LLAMA3);
    assert_true(d->cfg.rope.factor == 8.0f && d->cfg.rope.orig_max_pos == 8192);
    ks_eagle3_destroy(d);
    /* legacy keys still read; rope_parameters' default type adds no scaling */
    snprintf(dir, sizeof dir, "%s/rope-v4", g_tmp);
    write_small(dir, ",\"rope_theta\":1000000.0,\"rope_scaling\":{\"type\":\"linear\",\"factor\":2.0}", NULL, NULL);
    d = load_head(dir);
    assert_true(d->cfg.rope_theta == 1000000.0f && d->cfg.rope.type == KS_ROPE_SCALING_LINEAR);
    ks_eagle3_destroy(d);
}

static void expect_load_error(const char *dir, const char *needle) {
    ks_eagle3_params ep = ks_eagle3_default_params();
    ep.head_only = true;
    ks_eagle3 *d = NULL;
    ks_status st = ks_eagle3_load(dir, ep, &d);
    if (st == KS_OK) fail_msg("%s loaded; expected an error with '%s'", dir, needle);
    if (!strstr(ks_last_error(), needle)) fail_msg("%s: '%s' does not say '%s'", dir, ks_last_error(), needle);
}

/* checked on a head-only load too (spec loads only the head) */
static void test_vocab_maps(void **state) {
    (void)state;
    char dir[400];
    int64_t good[4] = {1, 2, 2, 4};             /* draft 0..3 -> target 1, 3, 4, 7 */
    uint8_t t2d[8] = {0, 1, 0, 1, 1, 0, 0, 1};
    snprintf(dir, sizeof dir, "%s/maps-good", g_tmp);
    write_small(dir, "", good, t2d);
    ks_eagle3_destroy(load_head(dir));
    int64_t out_of_range[4] = {1, 2, 2, 5};      /* draft 3 -> target 8 */
    snprintf(dir, sizeof dir, "%s/maps-range", g_tmp);
    write_small(dir, "", out_of_range, NULL);
    expect_load_error(dir, "outside the 8-token vocabulary");
    int64_t twice[4] = {1, 0, 2, 4};             /* draft 0 and 1 -> target 1 */
    snprintf(dir, sizeof dir, "%s/maps-twice", g_tmp);
    write_small(dir, "", twice, NULL);
    expect_load_error(dir, "map twice");
    uint8_t other[8] = {1, 1, 0, 1, 0, 0, 0, 1};
    snprintf(dir, sizeof dir, "%s/maps-disagree", g_tmp);
    write_small(dir, "", good, other);
    expect_load_error(dir, "disagree");
    uint8_t five[8] = {1, 1, 0, 1, 1, 0, 0, 1};
    snprintf(dir, sizeof dir, "%s/maps-count", g_tmp);
    write_small(dir, "", NULL, five);
    expect_load_error(dir, "marks 5 target tokens");
}

/* ------------------------------------------------------- refusals -- */

static void expect_refused(const void *buf, size_t n, ks_status want, const char *needle) {
    ks_torch_bin *b = NULL;
    ks_status st = ks_torch_bin_parse(buf, n, &b);
    if (st == KS_OK) fail_msg("parsed (%zu bytes); expected '%s'", n, needle);
    assert_int_equal(st, want);
    if (!strstr(ks_last_error(), needle)) fail_msg("'%s' does not say '%s'", ks_last_error(), needle);
}

static void test_refusals(void **state) {
    (void)state;
    size_t n = 0;
    char *g = ks_test_read_file(layout("bad-global.bin"), &n);
    assert_non_null(g);
    expect_refused(g, n, KS_ERR_UNSUPPORTED, "global 'posix.system'");
    free(g);
    char *o = ks_test_read_file(layout("bad-oob.bin"), &n);
    expect_refused(o, n, KS_ERR_FORMAT, "out of bounds");
    free(o);
    char *w = ks_test_read_file(layout("eagle-bin/pytorch_model.bin"), &n);
    ks_torch_bin *b = NULL;
    assert_int_equal(ks_torch_bin_parse(w, n, &b), KS_OK);
    assert_int_equal(b->n_tensors, 15);
    ks_torch_bin_free(b);
    /* truncated anywhere: the end record is gone, or the directory points past the end */
    size_t cuts[] = {n - 1, n - 30, n / 2, 1000, 30};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) expect_refused(w, cuts[i], KS_ERR_FORMAT, "truncated");
    expect_refused(w, 0, KS_ERR_FORMAT, "not a zip");
    /* a bare pickle (the pre-1.6 format) */
    expect_refused("\x80\x02}q\x00.", 6, KS_ERR_UNSUPPORTED, "PyTorch >= 1.6");
    /* the loader's message names the file */
    char dir[400], p[500];
    snprintf(dir, sizeof dir, "%s/evil", g_tmp);
    write_text(dir, "config.json", "{\"hidden_size\":8,\"num_attention_heads\":2,\"vocab_size\":8}");
    g = ks_test_read_file(layout("bad-global.bin"), &n);
    snprintf(p, sizeof p, "%s/pytorch_model.bin", dir);
    assert_int_equal(ks_test_write_file(p, g, n), 0);
    free(g);
    expect_load_error(dir, "pytorch_model.bin");
    expect_load_error(dir, "posix.system");
    free(w);
}

/* ------------------------------------------------------ end to end -- */

static const char *g_extra = ""; /* run(): more spec arguments after dlm=, e.g. ",aux_ids=1:2:3" */

/* Greedy decode of a fixed prompt; returns the logits of every step. */
static float *run(const char *policy, int32_t budget, const char *dlm, int n_prompt, int steps) {
    ks_context_params p = ks_context_default_params();
    p.n_ctx = n_prompt + steps + 1;
    p.n_threads = 2;
    p.n_batch = 32;
    p.policy = policy;
    p.budget = budget;
    p.sink = 4;
    p.window = 8;
    char args[700];
    snprintf(args, sizeof args, "dlm=%s%s", dlm ? dlm : "", g_extra);
    p.policy_args = dlm ? args : NULL;
    ks_context *c = NULL;
    if (ks_context_create(g_target, p, &c) != KS_OK) fail_msg("context (%s): %s", dlm ? dlm : policy, ks_last_error());
    int32_t Vv = g_target->hp.n_vocab;
    float *out = malloc(sizeof(float) * (size_t)(steps + 1) * Vv);
    int32_t *prompt = malloc(sizeof(int32_t) * n_prompt), seq = 0;
    for (int i = 0; i < n_prompt; i++) prompt[i] = (i * 37 + 11) % Vv;
    assert_int_equal(ks_prefill(c, 0, prompt, n_prompt, out, NULL), KS_OK);
    for (int t = 0; t < steps; t++) {
        const float *row = out + (size_t)t * Vv;
        int32_t best = 0;
        for (int32_t j = 1; j < Vv; j++) best = row[j] > row[best] ? j : best;
        if (ks_decode(c, &seq, &best, 1, out + (size_t)(t + 1) * Vv) != KS_OK) fail_msg("decode: %s", ks_last_error());
    }
    free(prompt);
    ks_context_destroy(c);
    return out;
}

static void test_spec_on_each_layout(void **state) {
    (void)state;
    const int np = 96, steps = 6;
    size_t bytes = sizeof(float) * (steps + 1) * g_target->hp.n_vocab;
    float *dense = run("dense", 0, NULL, np, steps);
    const char *names[] = {"eagle-bin", "eagle-st", "eagle-sharded", "specforge"};
    for (int i = 0; i < 4; i++) {
        float *full = run("spec", np + steps + 1, layout(names[i]), np, steps);
        if (memcmp(full, dense, bytes)) fail_msg("spec at full budget with %s differs from dense", names[i]);
        free(full);
    }
    /* at 24 entries spec's selection decides the logits: the .bin and
     * safetensors copies must select alike, the SpecForge draft otherwise */
    float *bin = run("spec", 24, layout("eagle-bin"), np, steps);
    float *st = run("spec", 24, layout("eagle-st"), np, steps);
    float *sh = run("spec", 24, layout("eagle-sharded"), np, steps);
    assert_memory_equal(bin, st, bytes);
    assert_memory_equal(sh, st, bytes);
    assert_true(memcmp(bin, dense, bytes) != 0); /* the budget really is sparse */
    free(bin);
    free(st);
    free(sh);
    free(dense);
}

/* spec's aux_ids= override: the two conventions name the same streams, and
 * other streams change the selection; a malformed value is refused */
static void test_aux_ids_override(void **state) {
    (void)state;
    const int np = 96, steps = 4;
    size_t bytes = sizeof(float) * (steps + 1) * g_target->hp.n_vocab;
    float *dflt = run("spec", 24, layout("eagle-st"), np, steps); /* default [2, L/2, L-3] -> 1, 2, 2 */
    g_extra = ",aux_ids=1:2:3";
    float *in = run("spec", 24, layout("eagle-st"), np, steps);
    g_extra = ",aux_ids=out:0:1:2";
    float *out = run("spec", 24, layout("eagle-st"), np, steps);
    g_extra = ",aux_ids=in:2:1:2"; /* the default's layers, listed out of order */
    float *same = run("spec", 24, layout("eagle-st"), np, steps);
    g_extra = "";
    assert_memory_equal(in, out, bytes);
    assert_memory_equal(same, dflt, bytes);
    assert_true(memcmp(in, dflt, bytes) != 0);
    free(dflt);
    free(in);
    free(out);
    free(same);
    ks_context_params p = ks_context_default_params();
    p.n_ctx = 64;
    p.policy = "spec";
    p.budget = 16;
    char args[700];
    snprintf(args, sizeof args, "dlm=%s,aux_ids=1:2", layout("eagle-st"));
    p.policy_args = args;
    ks_context *c = NULL;
    assert_int_not_equal(ks_context_create(g_target, p, &c), KS_OK);
    assert_non_null(strstr(ks_last_error(), "aux_ids"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bin_and_safetensors_hold_the_same),
        cmocka_unit_test(test_eagle_forward),
        cmocka_unit_test(test_specforge_forward),
        cmocka_unit_test(test_aux_conventions),
        cmocka_unit_test(test_rope_parameters),
        cmocka_unit_test(test_vocab_maps),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_spec_on_each_layout),
        cmocka_unit_test(test_aux_ids_override),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
