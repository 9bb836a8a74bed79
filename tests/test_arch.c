/*
 * test_arch.c — RoPE scaling as GGUF files state it, and the architectures
 * of their own files (phi3, smollm3, mistral3), below the golden logits.
 *
 * The goldens (tests/golden/tiny-{phi3,qwen3-yarn,smollm3,mistral3}-f16.bin)
 * check whole forward passes against tools/reference.py at the default
 * context; these tests pin what a golden cannot see at a glance: the
 * inverse frequencies and magnitude each scaling resolves to (checked
 * against the formulas written out here), LongRoPE's switch from short to
 * long factors with the context size, the fused tensors bound as row views
 * of one tensor, the flags each architecture sets, the messages for an
 * unknown architecture or scaling, and prefix-cache roots that differ when
 * the resolved RoPE does.
 */
#define _GNU_SOURCE /* mkdtemp */
#include "gguf/gguf.h"
#include "infer/infer.h"
#include "prefix/prefix.h"
#include "model/shapes.h"
#include "tensor/ops.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

static char g_dir[64];

/* Generates shape s (possibly a modified copy of a table row) in f16 into
 * g_dir/<tag>.gguf and loads it; returns the load status. */
static ks_status gen_load(const ks_model_shape *s, const char *tag, ks_model **out) {
    ks_gguf *vocab = NULL;
    assert_int_equal(ks_gguf_open(ks_test_fixture("models/aidreams260K.gguf"), &vocab), KS_OK);
    ks_shape_gen_params gp = {.type = KS_DTYPE_F16, .vocab = vocab, .seed = 7, .n_threads = 1};
    char path[128];
    snprintf(path, sizeof path, "%s/%s.gguf", g_dir, tag);
    ks_status st = ks_shape_generate(s, &gp, path, NULL);
    ks_gguf_close(vocab);
    assert_int_equal(st, KS_OK);
    st = ks_model_load(path, ks_model_default_params(), out);
    unlink(path);
    return st;
}

static ks_context *make_ctx(const ks_model *m, int32_t n_ctx) {
    ks_context_params cp = ks_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_seq = 1;
    cp.n_threads = 1;
    ks_context *c = NULL;
    ks_status st = ks_context_create(m, cp, &c);
    if (st != KS_OK) fail_msg("ks_context_create: %s", ks_last_error());
    return c;
}

/* ------------------------------------------------------ frequencies -- */
static void test_unscaled_equals_plain_angles(void **state) {
    (void)state;
    enum { NR = 64 };
    double inv[NR / 2];
    float ms, c0[NR / 2], s0[NR / 2], c1[NR / 2], s1[NR / 2], ff[NR / 2];
    for (int j = 0; j < NR / 2; j++) ff[j] = 1.0f + 0.25f * (float)j;
    for (int with_ff = 0; with_ff < 2; with_ff++) {
        assert_int_equal(ks_rope_gguf_inv_freq(NR, 500000.f, NULL, with_ff ? ff : NULL, inv, &ms), KS_OK);
        assert_true(ms == 1.0f);
        for (int32_t pos = 0; pos < 5000; pos += 997) {
            ks_rope_angles(c0, s0, pos, NR, 500000.f, with_ff ? ff : NULL);
            ks_rope_angles_inv(c1, s1, pos, NR, inv, ms);
            assert_memory_equal(c0, c1, sizeof c0); /* bit for bit: an old model's logits do not move */
            assert_memory_equal(s0, s1, sizeof s0);
        }
    }
}

static void test_linear_and_yarn(void **state) {
    (void)state;
    enum { NR = 128 };
    const double base = 1e6;
    double inv[NR / 2];
    float ms;
    ks_rope_scaling lin = {.type = KS_ROPE_SCALING_LINEAR, .factor = 4, .attention_factor = 1, .ext_factor = -1};
    assert_int_equal(ks_rope_gguf_inv_freq(NR, (float)base, &lin, NULL, inv, &ms), KS_OK);
    for (int j = 0; j < NR / 2; j++) assert_true(fabs(inv[j] - pow(base, -2.0 * j / NR) / 4) <= 1e-15 * pow(base, -2.0 * j / NR));
    assert_true(ms == 1.0f);

    /* Qwen3 at 128K: factor 4 over 32768.  Dims whose wavelength makes more
     * than 32 turns over the original context keep their frequency, those
     * under one turn are divided by 4, a linear ramp between; the magnitude
     * is 0.1 ln 4 + 1 (no log multiplier) */
    ks_rope_scaling y = {.type = KS_ROPE_SCALING_YARN, .factor = 4, .orig_max_pos = 32768, .beta_fast = 32,
                         .beta_slow = 1, .attention_factor = 1, .ext_factor = -1};
    assert_int_equal(ks_rope_gguf_inv_freq(NR, (float)base, &y, NULL, inv, &ms), KS_OK);
    double lo = floor(NR * log(32768 / (32 * 2 * M_PI)) / (2 * log(base)));
    double hi = ceil(NR * log(32768 / (1 * 2 * M_PI)) / (2 * log(base)));
    assert_true(lo > 0 && hi < NR / 2);
    for (int j = 0; j < NR / 2; j++) {
        double f = pow(base, -2.0 * j / NR), r = (j - lo) / (hi - lo);
        r = r < 0 ? 0 : r > 1 ? 1 : r;
        double want = f * (1 - r) + f / 4 * r;
        assert_true(fabs(inv[j] - want) <= 1e-12 * f);
    }
    assert_true(fabsf(ms - (float)(1 + 0.1 * log(4.0))) < 1e-6f);
    /* mistral3's log multiplier equal to 1 cancels the magnitude; the file's
     * attn_factor multiplies whatever YaRN gives */
    y.log_mul = 1;
    y.attention_factor = 1.5f;
    assert_int_equal(ks_rope_gguf_inv_freq(NR, (float)base, &y, NULL, inv, &ms), KS_OK);
    assert_true(fabsf(ms - 1.5f) < 1e-6f);
    /* ext_factor 0 turns YaRN into plain interpolation without magnitude */
    y.ext_factor = 0;
    y.attention_factor = 1;
    assert_int_equal(ks_rope_gguf_inv_freq(NR, (float)base, &y, NULL, inv, &ms), KS_OK);
    assert_true(ms == 1.0f && fabs(inv[0] - 0.25) < 1e-15);
    /* bad parameters are refused, never used */
    y = (ks_rope_scaling){.type = KS_ROPE_SCALING_YARN, .factor = 4, .orig_max_pos = 0, .beta_fast = 32,
                          .beta_slow = 1, .ext_factor = -1};
    assert_int_equal(ks_rope_gguf_inv_freq(NR, (float)base, &y, NULL, inv, &ms), KS_ERR_INVALID_ARG);
    assert_int_equal(ks_rope_gguf_inv_freq(7, (float)base, NULL, NULL, inv, &ms), KS_ERR_INVALID_ARG);
}

/* ---------------------------------------------------------- phi3 -- */
static void test_phi3_longrope_and_views(void **state) {
    (void)state;
    const ks_model_shape *s = ks_shape_find("tiny-phi3");
    assert_non_null(s);
    ks_model *m = NULL;
    assert_int_equal(gen_load(s, "phi3", &m), KS_OK);
    const ks_hparams *hp = &m->hp;
    assert_int_equal(hp->n_rot, 48);
    assert_true(hp->rope_neox);
    assert_int_equal(hp->rope_scaling.type, KS_ROPE_SCALING_NONE); /* phi3 files carry no type key */
    assert_int_equal(hp->rope_scaling.orig_max_pos, 4096);
    assert_non_null(m->rope_factors_short);
    assert_non_null(m->rope_factors_long);
    float sf[24], lf[24];
    ks_shape_longrope_factors(s, false, sf);
    ks_shape_longrope_factors(s, true, lf);
    /* the context size decides: 4096 = the original context is short, above is long */
    for (int k = 0; k < 2; k++) {
        ks_context *c = make_ctx(m, k ? 4097 : 4096);
        for (int j = 0; j < 24; j++) {
            double want = pow(10000.0, -2.0 * j / 48) / (k ? lf[j] : sf[j]);
            assert_true(fabs(c->rope_inv_freq[j] - want) <= 1e-12 * want);
        }
        assert_true(fabsf(c->rope_mscale - s->rope_attn_factor) < 1e-6f);
        ks_context_destroy(c);
    }
    /* one attn_qkv tensor: wq, wk, wv are consecutive row ranges of it; the
     * gate rows come first in ffn_up */
    const ks_layer *L = &m->layers[1];
    size_t row = ks_dtype_row_bytes(L->wq.type, hp->n_embd);
    assert_int_equal(L->wq.rows, hp->n_head * hp->head_dim);
    assert_int_equal(L->wk.rows, hp->n_head_kv * hp->head_dim);
    assert_ptr_equal((const uint8_t *)L->wq.data + row * (size_t)L->wq.rows, L->wk.data);
    assert_ptr_equal((const uint8_t *)L->wk.data + row * (size_t)L->wk.rows, L->wv.data);
    assert_ptr_equal((const uint8_t *)L->w_gate.data + row * (size_t)hp->n_ff, L->w_up.data);
    const ks_gguf_tensor *qkv = ks_gguf_find_tensor(m->gguf, "blk.1.attn_qkv.weight");
    const ks_gguf_tensor *up = ks_gguf_find_tensor(m->gguf, "blk.1.ffn_up.weight");
    assert_non_null(qkv);
    assert_non_null(up);
    /* m->packed (repacked copies) moves the data; the layout is still checked above */
    if (!m->packed) {
        assert_ptr_equal(L->wq.data, qkv->data);
        assert_ptr_equal(L->w_gate.data, up->data);
    }
    char buf[4096];
    assert_int_equal(ks_model_describe(m, buf, sizeof buf), KS_OK);
    assert_non_null(strstr(buf, "LongRoPE factors short long"));
    assert_non_null(strstr(buf, "attn factor 1.19"));
    ks_model_destroy(m);
}

/* ---------------------------------------- smollm3, mistral3, qwen3 yarn -- */
static void test_arch_flags(void **state) {
    (void)state;
    ks_model *m = NULL;
    assert_int_equal(gen_load(ks_shape_find("tiny-smollm3"), "smollm3", &m), KS_OK);
    assert_int_equal(m->hp.rope_skip_every, 4);
    assert_false(m->hp.rope_neox);
    assert_true(m->hp.attn_temp_scale == 0);
    ks_model_destroy(m);

    assert_int_equal(gen_load(ks_shape_find("tiny-mistral3"), "mistral3", &m), KS_OK);
    assert_int_equal(m->hp.rope_scaling.type, KS_ROPE_SCALING_YARN);
    assert_true(m->hp.rope_scaling.log_mul == 1.0f);
    assert_true(fabsf(m->hp.attn_temp_scale - 0.1f) < 1e-7f);
    assert_int_equal(m->hp.attn_temp_floor, 32);
    assert_int_equal(m->hp.rope_skip_every, 0);
    ks_context *c = make_ctx(m, 256);
    assert_true(fabsf(c->rope_mscale - 1.0f) < 1e-6f);
    ks_context_destroy(c);
    ks_model_destroy(m);

    assert_int_equal(gen_load(ks_shape_find("tiny-qwen3-yarn"), "qwen3yarn", &m), KS_OK);
    assert_int_equal(m->hp.rope_scaling.type, KS_ROPE_SCALING_YARN);
    assert_true(m->hp.rope_scaling.factor == 4.0f);
    assert_int_equal(m->hp.rope_scaling.orig_max_pos, 32768);
    c = make_ctx(m, 256);
    assert_true(fabsf(c->rope_mscale - (float)(1 + 0.1 * log(4.0))) < 1e-6f);
    ks_context_destroy(c);
    char buf[4096];
    assert_int_equal(ks_model_describe(m, buf, sizeof buf), KS_OK);
    assert_non_null(strstr(buf, "rope scaling:  yarn, factor 4, original context 32768"));
    ks_model_destroy(m);
}

/* ------------------------------------------------------- bad input -- */
static void test_unknown_names(void **state) {
    (void)state;
    ks_model_shape s = *ks_shape_find("tiny-llama");
    s.rope_scaling = "dynamic";
    s.rope_factor = 2;
    s.rope_orig_ctx = 4096;
    ks_model *m = NULL;
    assert_int_equal(gen_load(&s, "dynamic", &m), KS_ERR_UNSUPPORTED);
    assert_non_null(strstr(ks_last_error(), "llama.rope.scaling.type = 'dynamic'"));
    s = *ks_shape_find("tiny-llama");
    s.arch = "gpt-foo";
    assert_int_equal(gen_load(&s, "gptfoo", &m), KS_ERR_UNSUPPORTED);
    assert_non_null(strstr(ks_last_error(), "'gpt-foo'"));
    assert_non_null(strstr(ks_last_error(), "phi3"));
    assert_null(m);
}

/* ------------------------------------------------- prefix-cache roots -- */
static void test_prefix_root_follows_rope(void **state) {
    (void)state;
    ks_model *m = NULL;
    assert_int_equal(gen_load(ks_shape_find("tiny-phi3"), "phi3pc", &m), KS_OK);
    ks_prefix_cache_params pp = ks_prefix_cache_default_params();
    ks_prefix_cache *pc = NULL;
    assert_int_equal(ks_prefix_cache_create(m, &pp, &pc), KS_OK);
    ks_context *a = make_ctx(m, 4096), *b = make_ctx(m, 8192), *a2 = make_ctx(m, 2048);
    ks_pc_format f = {(uint32_t)a->kv_type, 16, (uint32_t)m->hp.n_layer, (uint32_t)m->hp.n_head_kv,
                      (uint32_t)m->hp.head_dim};
    ks_pc_key ra = ks_pc_context_root(pc, a, &f), rb = ks_pc_context_root(pc, b, &f), ra2 = ks_pc_context_root(pc, a2, &f);
    assert_false(ks_pc_key_eq(&ra, &rb)); /* short vs long factors: never a hit */
    assert_true(ks_pc_key_eq(&ra, &ra2)); /* both short: the same K, so shared */
    ks_context_destroy(a);
    ks_context_destroy(b);
    ks_context_destroy(a2);
    ks_prefix_cache_destroy(pc);
    ks_model_destroy(m);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/kvsieve-test-arch-XXXXXX");
    if (!mkdtemp(g_dir)) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unscaled_equals_plain_angles),
        cmocka_unit_test(test_linear_and_yarn),
        cmocka_unit_test(test_phi3_longrope_and_views),
        cmocka_unit_test(test_arch_flags),
        cmocka_unit_test(test_unknown_names),
        cmocka_unit_test(test_prefix_root_follows_rope),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    rmdir(g_dir);
    return rc;
}
