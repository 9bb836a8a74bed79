/*
 * test_eagle3.c — EAGLE-3 draft checkpoints built here (H=8, 2 heads, 1 KV
 * head, head_dim 4, vocab 16): full and retrieval-head-only loads under both
 * tensor namings, sharded, BF16; missing / misshapen tensors; target checks;
 * the head's Q/K against an independent plain computation; RoPE scaling
 * (YaRN, llama3) against the published formulas.
 */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"

#include "draft/eagle3.h"
#include "tensor/dtype.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

enum { H = 8, NH = 2, NKV = 1, HD = 4, V = 16, DV = 8, FF = 12 };

static const char *tmp_dir(const char *name) {
    static char buf[4][1200];
    static int k;
    k = (k + 1) % 4;
    char base[1024];
    snprintf(base, sizeof base, "%s/test_eagle3_%d", KS_BINARY_DIR, (int)getpid());
    mkdir(base, 0755);
    snprintf(buf[k], sizeof buf[k], "%s/%s", base, name);
    mkdir(buf[k], 0755);
    return buf[k];
}

static const char *k_config =
    "{\"architectures\":[\"LlamaForCausalLMEagle3\"],\"hidden_size\":8,\"intermediate_size\":12,"
    "\"num_attention_heads\":2,\"num_key_value_heads\":1,\"head_dim\":4,\"vocab_size\":16,\"draft_vocab_size\":8,"
    "\"rms_norm_eps\":1e-5,\"rope_theta\":10000.0,\"max_position_embeddings\":2048%s}";

static void write_config(const char *dir, const char *extra) {
    char text[2048], p[1300];
    snprintf(text, sizeof text, k_config, extra ? extra : "");
    snprintf(p, sizeof p, "%s/config.json", dir);
    assert_int_equal(ks_test_write_file(p, text, strlen(text)), 0);
}

/* Deterministic weights, shared by the checkpoint and the reference. */
typedef struct {
    float embed[V * H], fc[H * 3 * H], hnorm[H], inorm[H], q[NH * HD * 2 * H], k[NKV * HD * 2 * H];
    float v[NKV * HD * 2 * H], o[H * NH * HD], post[H], gate[FF * H], up[FF * H], down[H * FF], norm[H], lm[DV * H];
    int64_t d2t[DV];
    uint8_t t2d[V];
} weights;

static weights g_w;

static void fill(float *x, int n, ks_rng *r, float scale, float offset) {
    for (int i = 0; i < n; i++) x[i] = offset + scale * (float)(ks_rng_uniform(r) * 2.0 - 1.0);
}

static void init_weights(void) {
    ks_rng r = {7};
    fill(g_w.embed, V * H, &r, 1, 0);
    fill(g_w.fc, H * 3 * H, &r, 0.5f, 0);
    fill(g_w.hnorm, H, &r, 0.2f, 1);
    fill(g_w.inorm, H, &r, 0.2f, 1);
    fill(g_w.q, NH * HD * 2 * H, &r, 0.5f, 0);
    fill(g_w.k, NKV * HD * 2 * H, &r, 0.5f, 0);
    fill(g_w.v, NKV * HD * 2 * H, &r, 0.5f, 0);
    fill(g_w.o, H * NH * HD, &r, 0.5f, 0);
    fill(g_w.post, H, &r, 0.2f, 1);
    fill(g_w.gate, FF * H, &r, 0.5f, 0);
    fill(g_w.up, FF * H, &r, 0.5f, 0);
    fill(g_w.down, H * FF, &r, 0.5f, 0);
    fill(g_w.norm, H, &r, 0.2f, 1);
    fill(g_w.lm, DV * H, &r, 0.5f, 0);
    for (int i = 0; i < DV; i++) g_w.d2t[i] = i; /* draft id i -> target 2i */
    for (int i = 0; i < V; i++) g_w.t2d[i] = (i % 2 == 0);
}

typedef struct {
    const char *prefix;  /* "midlayer." or "layers.0." */
    bool embed;          /* write embed_tokens */
    bool bf16;           /* matrices as BF16 */
    bool shard;          /* two shards + index */
    const char *skip;    /* a tensor to leave out */
    const char *bad;     /* a tensor to write with a wrong shape */
    const char *extra_config;
} ckpt_opts;

static uint16_t g_bf[64][512]; /* BF16 copies of the matrices */

static void write_ckpt(const char *dir, ckpt_opts o) {
    write_config(dir, o.extra_config);
    const char *pf = o.prefix;
    char names[16][96];
    struct { const char *suffix; bool layer; const float *data; int rows, cols; } m[] = {
        {"embed_tokens.weight", false, g_w.embed, V, H},
        {"fc.weight", false, g_w.fc, H, 3 * H},
        {"hidden_norm.weight", true, g_w.hnorm, H, 0},
        {"input_layernorm.weight", true, g_w.inorm, H, 0},
        {"self_attn.q_proj.weight", true, g_w.q, NH * HD, 2 * H},
        {"self_attn.k_proj.weight", true, g_w.k, NKV * HD, 2 * H},
        {"self_attn.v_proj.weight", true, g_w.v, NKV * HD, 2 * H},
        {"self_attn.o_proj.weight", true, g_w.o, H, NH * HD},
        {"post_attention_layernorm.weight", true, g_w.post, H, 0},
        {"mlp.gate_proj.weight", true, g_w.gate, FF, H},
        {"mlp.up_proj.weight", true, g_w.up, FF, H},
        {"mlp.down_proj.weight", true, g_w.down, H, FF},
        {"norm.weight", false, g_w.norm, H, 0},
        {"lm_head.weight", false, g_w.lm, DV, H},
    };
    const int nm = (int)(sizeof m / sizeof m[0]);
    ks_test_st_tensor t[20];
    int n = 0;
    for (int i = 0; i < nm; i++) {
        if (!o.embed && i == 0) continue;
        snprintf(names[i], sizeof names[i], "%s%s", m[i].layer ? pf : "", m[i].suffix);
        if (o.skip && !strcmp(o.skip, names[i])) continue;
        ks_test_st_tensor *x = &t[n++];
        memset(x, 0, sizeof *x);
        x->name = names[i];
        int64_t elems = m[i].cols ? (int64_t)m[i].rows * m[i].cols : m[i].rows;
        if (m[i].cols) {
            x->n_dims = 2;
            x->shape[0] = m[i].rows;
            x->shape[1] = m[i].cols;
        } else {
            x->n_dims = 1;
            x->shape[0] = m[i].rows;
        }
        if (o.bad && !strcmp(o.bad, names[i])) { /* same bytes, transposed-looking shape */
            if (m[i].cols) {
                x->shape[0] = m[i].rows * 2;
                x->shape[1] = m[i].cols / 2;
            } else {
                x->n_dims = 2;
                x->shape[0] = m[i].rows / 2;
                x->shape[1] = 2;
            }
        }
        if (o.bf16 && m[i].cols) {
            for (int64_t j = 0; j < elems; j++) g_bf[i][j] = ks_f32_to_bf16(m[i].data[j]);
            x->dtype = "BF16";
            x->data = g_bf[i];
            x->nbytes = (size_t)elems * 2;
        } else {
            x->dtype = "F32";
            x->data = m[i].data;
            x->nbytes = (size_t)elems * 4;
        }
    }
    t[n++] = (ks_test_st_tensor){"d2t", "I64", 1, {DV}, g_w.d2t, sizeof g_w.d2t};
    t[n++] = (ks_test_st_tensor){"t2d", "BOOL", 1, {V}, g_w.t2d, sizeof g_w.t2d};
    char p[1300];
    if (!o.shard) {
        size_t len;
        uint8_t *img = ks_test_safetensors_build(t, n, "{\"format\":\"pt\"}", &len);
        snprintf(p, sizeof p, "%s/model.safetensors", dir);
        assert_int_equal(ks_test_write_file(p, img, len), 0);
        free(img);
        return;
    }
    int half = n / 2;
    char idx[8192];
    size_t il = (size_t)snprintf(idx, sizeof idx, "{\"weight_map\":{");
    for (int s = 0; s < 2; s++) {
        int lo = s ? half : 0, hi = s ? n : half;
        char file[64];
        snprintf(file, sizeof file, "model-0000%d-of-00002.safetensors", s + 1);
        size_t len;
        uint8_t *img = ks_test_safetensors_build(t + lo, hi - lo, NULL, &len);
        snprintf(p, sizeof p, "%s/%s", dir, file);
        assert_int_equal(ks_test_write_file(p, img, len), 0);
        free(img);
        for (int i = lo; i < hi; i++) il += (size_t)snprintf(idx + il, sizeof idx - il, "%s\"%s\":\"%s\"", i ? "," : "", t[i].name, file);
    }
    snprintf(idx + il, sizeof idx - il, "}}");
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    assert_int_equal(ks_test_write_file(p, idx, strlen(idx)), 0);
}

static int setup(void **state) {
    init_weights();
    return 0;
}

/* ------------------------------------------------------------- reference -- */

static void ref_rmsnorm(double *out, const double *x, const float *w, int n, double eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double inv = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) out[i] = w[i] * x[i] * inv;
}

/* Q/K of the head written out plainly, in double, rotate_half RoPE with the
 * given inverse frequencies and scale. */
static void ref_head_qk(const float *h3, const float *emb, int pos, bool embed_only, const double *inv_freq, double ms,
                        double *q, double *k) {
    double x[2 * H] = {0}, e[H], f[H];
    for (int i = 0; i < H; i++) e[i] = emb[i];
    ref_rmsnorm(x, e, g_w.inorm, H, 1e-5);
    if (!embed_only) {
        for (int r = 0; r < H; r++) {
            f[r] = 0;
            for (int c = 0; c < 3 * H; c++) f[r] += (double)g_w.fc[r * 3 * H + c] * h3[c];
        }
        ref_rmsnorm(x + H, f, g_w.hnorm, H, 1e-5);
    }
    for (int r = 0; r < NH * HD; r++) {
        q[r] = 0;
        for (int c = 0; c < 2 * H; c++) q[r] += (double)g_w.q[r * 2 * H + c] * x[c];
    }
    for (int r = 0; r < NKV * HD; r++) {
        k[r] = 0;
        for (int c = 0; c < 2 * H; c++) k[r] += (double)g_w.k[r * 2 * H + c] * x[c];
    }
    for (int h = 0; h < NH + NKV; h++) {
        double *v = h < NH ? q + h * HD : k + (h - NH) * HD;
        double out[HD];
        for (int j = 0; j < HD; j++) { /* v*cos + rotate_half(v)*sin, rotate_half(v) = [-v2, v1] */
            int jj = j % (HD / 2);
            double a = pos * inv_freq[jj], rh = j < HD / 2 ? -v[j + HD / 2] : v[j - HD / 2];
            out[j] = ms * (v[j] * cos(a) + rh * sin(a));
        }
        memcpy(v, out, sizeof out);
    }
}

/* ----------------------------------------------------------------- tests -- */

static void test_load_full_and_head(void **state) {
    const char *prefixes[2] = {"midlayer.", "layers.0."};
    for (int pi = 0; pi < 2; pi++) {
        const char *dir = tmp_dir(pi ? "ckpt_layers0" : "ckpt_midlayer");
        write_ckpt(dir, (ckpt_opts){.prefix = prefixes[pi], .embed = true});
        ks_eagle3 *d = NULL;
        ks_eagle3_params p = ks_eagle3_default_params();
        assert_int_equal(ks_eagle3_load(dir, p, &d), KS_OK);
        assert_string_equal(d->cfg.arch, "LlamaForCausalLMEagle3");
        assert_string_equal(d->layer_prefix, prefixes[pi]);
        assert_int_equal(d->cfg.hidden_size, H);
        assert_int_equal(d->cfg.target_hidden_size, H);
        assert_int_equal(d->cfg.n_head_kv, NKV);
        assert_int_equal(d->cfg.draft_vocab_size, DV);
        assert_false(d->cfg.aux_layers_set);
        assert_true(d->has_embed);
        assert_non_null(d->wv.data);
        assert_non_null(d->lm_head.data);
        assert_non_null(d->w_down.data);
        assert_non_null(d->d2t);
        assert_int_equal(d->d2t[3], 3);
        assert_int_equal(d->t2d[2], 1);
        assert_int_equal(d->t2d[3], 0);
        /* embed 128 + fc 192 + norms 16 + q 128 + k 64 = 528 head;
         * + v 64 + o 64 + post 8 + mlp 288 + norm 8 + lm_head 64 = 1024 full */
        assert_int_equal(d->n_params_head, 528);
        assert_int_equal(d->n_params_full, 1024);
        assert_int_equal(d->n_params_embed, 128);
        ks_eagle3_destroy(d);

        p.head_only = true;
        p.use_mmap = false;
        assert_int_equal(ks_eagle3_load(dir, p, &d), KS_OK);
        assert_true(d->head_only);
        assert_null(d->st);       /* checkpoint closed */
        assert_non_null(d->arena);
        assert_null(d->wv.data);
        assert_null(d->wo.data);
        assert_null(d->lm_head.data);
        assert_null(d->w_gate.data);
        assert_null(d->norm);
        assert_null(d->post_norm);
        assert_null(d->d2t);
        assert_non_null(d->wq.data);
        assert_non_null(d->fc.data);
        assert_int_equal(d->n_params_head, 528);
        assert_int_equal(d->n_params_full, 1024);
        float e[H];
        assert_int_equal(ks_eagle3_embed(d, 5, e), KS_OK);
        assert_memory_equal(e, g_w.embed + 5 * H, sizeof e);
        assert_int_equal(ks_eagle3_embed(d, V, e), KS_ERR_INVALID_ARG);
        char buf[2048];
        assert_int_equal(ks_eagle3_describe(d, buf, sizeof buf), KS_OK);
        assert_non_null(strstr(buf, "retrieval head only"));
        assert_non_null(strstr(buf, "48.4% fewer"));   /* 1 - 528/1024 */
        assert_non_null(strstr(buf, "55.4% fewer"));   /* without embedding: 1 - 400/896 */
        ks_eagle3_destroy(d);
    }
}

static void test_embed_only_head(void **state) {
    const char *dir = tmp_dir("ckpt_noembed");
    write_ckpt(dir, (ckpt_opts){.prefix = "midlayer.", .embed = false, .skip = "fc.weight"});
    ks_eagle3 *d = NULL;
    ks_eagle3_params p = ks_eagle3_default_params();
    p.head_only = true;
    assert_int_equal(ks_eagle3_load(dir, p, &d), KS_ERR_FORMAT); /* fused head needs fc */
    assert_non_null(strstr(ks_last_error(), "missing tensor fc.weight"));
    p.embed_only = true;
    assert_int_equal(ks_eagle3_load(dir, p, &d), KS_OK);
    assert_false(d->has_embed);
    assert_null(d->fc.data);
    assert_null(d->hidden_norm);
    assert_int_equal(d->n_params_head, 128 + 64 + 8); /* q, k, input norm */
    float e[H];
    assert_int_equal(ks_eagle3_embed(d, 1, e), KS_ERR_NOT_FOUND);
    /* embedding-only: x = [input_norm(e); 0] */
    float q[NH * HD], k[NKV * HD];
    double rq[NH * HD], rk[NKV * HD], inv[HD / 2];
    for (int j = 0; j < HD / 2; j++) inv[j] = pow(10000.0, -2.0 * j / HD);
    assert_int_equal(ks_eagle3_head_qk(d, NULL, g_w.embed + 3 * H, 5, q, k), KS_OK);
    ref_head_qk(NULL, g_w.embed + 3 * H, 5, true, inv, 1.0, rq, rk);
    for (int i = 0; i < NH * HD; i++) assert_true(fabs(q[i] - rq[i]) < 1e-5);
    for (int i = 0; i < NKV * HD; i++) assert_true(fabs(k[i] - rk[i]) < 1e-5);
    ks_eagle3_target hp = {.n_embd = H, .n_vocab = V, .n_layer = 2, .n_head = NH, .n_head_kv = NKV, .head_dim = HD};
    assert_int_equal(ks_eagle3_check_target(d, &hp), KS_OK); /* aux layers irrelevant */
    hp.n_embd = 16;
    assert_int_equal(ks_eagle3_check_target(d, &hp), KS_ERR_INVALID_ARG);
    assert_non_null(strstr(ks_last_error(), "no embed_tokens"));
    ks_eagle3_destroy(d);
}

static void test_bad_checkpoints(void **state) {
    ks_eagle3 *d = NULL;
    ks_eagle3_params p = ks_eagle3_default_params();
    const char *dir = tmp_dir("ckpt_missing");
    write_ckpt(dir, (ckpt_opts){.prefix = "midlayer.", .embed = true, .skip = "midlayer.self_attn.k_proj.weight"});
    assert_int_equal(ks_eagle3_load(dir, p, &d), KS_ERR_FORMAT);
    assert_non_null(strstr(ks_last_error(), "missing tensor midlayer.self_attn.k_proj.weight"));
    /* a full-only tensor missing: head-only still loads */
    dir = tmp_dir("ckpt_nolm");
    write_ckpt(dir, (ckpt_opts){.prefix = "layers.0.", .embed = true, .skip = "lm_head.weight"});
    assert_int_equal(ks_eagle3_load(dir, p, &d), KS_ERR_FORMAT);
    assert_non_null(strstr(ks_last_error(), "missing tensor lm_head.weight"));
    p.head_only = true;
    assert_int_equal(ks_eagle3_load(dir, p, &d), KS_OK);
    ks_eagle3_destroy(d);
    p.head_only = false;
    dir = tmp_dir("ckpt_badshape");
    write_ckpt(dir, (ckpt_opts){.prefix = "midlayer.", .embed = true, .bad = "midlayer.self_attn.q_proj.weight"});
    assert_int_equal(ks_eagle3_load(dir, p, &d), KS_ERR_FORMAT);
    assert_non_null(strstr(ks_last_error(), "tensor midlayer.self_attn.q_proj.weight has shape [16, 8], expected [8, 16]"));
    dir = tmp_dir("ckpt_badnorm");
    write_ckpt(dir, (ckpt_opts){.prefix = "midlayer.", .embed = true, .bad = "midlayer.hidden_norm.weight"});
    assert_int_equal(ks_eagle3_load(dir, p, &d), KS_ERR_FORMAT);
    assert_non_null(strstr(ks_last_error(), "tensor midlayer.hidden_norm.weight has shape [4, 2], expected [8]"));
    /* no q_proj under any known prefix */
    dir = tmp_dir("ckpt_noq");
    write_ckpt(dir, (ckpt_opts){.prefix = "blocks.0.", .embed = true});
    assert_int_equal(ks_eagle3_load(dir, p, &d), KS_ERR_FORMAT);
    assert_non_null(strstr(ks_last_error(), "not an EAGLE-3 draft model"));
    /* config problems */
    dir = tmp_dir("ckpt_cfg");
    write_ckpt(dir, (ckpt_opts){.prefix = "midlayer.", .embed = true, .extra_config = ",\"rope_scaling\":{\"rope_type\":\"longrope\",\"factor\":4}"});
    assert_int_equal(ks_eagle3_load(dir, p, &d), KS_ERR_UNSUPPORTED);
    assert_non_null(strstr(ks_last_error(), "longrope"));
    char cp[1300];
    snprintf(cp, sizeof cp, "%s/config.json", dir);
    const char *bad_cfgs[] = {
        "{\"hidden_size\":8", "[]", "{\"num_attention_heads\":2,\"vocab_size\":16}",
        "{\"hidden_size\":8,\"num_attention_heads\":3,\"vocab_size\":16}",           /* no head_dim, 8 % 3 */
        "{\"hidden_size\":8,\"num_attention_heads\":2,\"num_key_value_heads\":3,\"vocab_size\":16}",
        "{\"hidden_size\":8,\"num_attention_heads\":2,\"head_dim\":5,\"vocab_size\":16}",
        "{\"hidden_size\":-8,\"num_attention_heads\":2,\"vocab_size\":16}",
        "{\"hidden_size\":8.5,\"num_attention_heads\":2,\"vocab_size\":16}",
        "{\"hidden_size\":8,\"num_attention_heads\":2,\"vocab_size\":16,\"eagle_aux_hidden_state_layer_ids\":[1,2]}",
        "{\"hidden_size\":8,\"num_attention_heads\":2,\"vocab_size\":16,\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":0.5}}",
    };
    for (size_t i = 0; i < sizeof bad_cfgs / sizeof bad_cfgs[0]; i++) {
        assert_int_equal(ks_test_write_file(cp, bad_cfgs[i], strlen(bad_cfgs[i])), 0);
        ks_status s = ks_eagle3_load(dir, p, &d);
        if (s == KS_OK) fail_msg("config %zu loaded: %s", i, bad_cfgs[i]);
        assert_non_null(strstr(ks_last_error(), "config.json"));
    }
    assert_int_equal(ks_eagle3_load(tmp_dir("empty_dir"), p, &d), KS_ERR_IO);
}

static void test_ambiguous_prefix(void **state) {
    const char *dir = tmp_dir("ckpt_both");
    write_ckpt(dir, (ckpt_opts){.prefix = "midlayer.", .embed = true});
    /* add a second file holding layers.0.* too, via an index */
    ks_test_st_tensor t[] = {{"layers.0.self_attn.q_proj.weight", "F32", 2, {NH * HD, 2 * H}, g_w.q, sizeof g_w.q}};
    size_t len;
    uint8_t *img = ks_test_safetensors_build(t, 1, NULL, &len);
    char p[1300];
    snprintf(p, sizeof p, "%s/extra.safetensors", dir);
    assert_int_equal(ks_test_write_file(p, img, len), 0);
    free(img);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    const char *idx = "{\"weight_map\":{\"midlayer.self_attn.q_proj.weight\":\"model.safetensors\","
                      "\"layers.0.self_attn.q_proj.weight\":\"extra.safetensors\"}}";
    assert_int_equal(ks_test_write_file(p, idx, strlen(idx)), 0);
    ks_eagle3 *d = NULL;
    assert_int_equal(ks_eagle3_load(dir, ks_eagle3_default_params(), &d), KS_ERR_FORMAT);
    assert_non_null(strstr(ks_last_error(), "has both"));
}

static void test_sharded_bf16(void **state) {
    const char *dir = tmp_dir("ckpt_sharded");
    write_ckpt(dir, (ckpt_opts){.prefix = "layers.0.", .embed = true, .bf16 = true, .shard = true});
    ks_eagle3 *d = NULL;
    assert_int_equal(ks_eagle3_load(dir, ks_eagle3_default_params(), &d), KS_OK);
    assert_int_equal(d->wq.dtype, KS_ST_BF16);
    float h3[3 * H], q[NH * HD], k[NKV * HD];
    for (int i = 0; i < 3 * H; i++) h3[i] = (float)sin(i + 1.0);
    double rq[NH * HD], rk[NKV * HD], inv[HD / 2];
    for (int j = 0; j < HD / 2; j++) inv[j] = pow(10000.0, -2.0 * j / HD);
    assert_int_equal(ks_eagle3_head_qk(d, h3, g_w.embed + 2 * H, 9, q, k), KS_OK);
    ref_head_qk(h3, g_w.embed + 2 * H, 9, false, inv, 1.0, rq, rk);
    double mx = 0;
    float fq[NH * HD];
    for (int i = 0; i < NH * HD; i++) fq[i] = (float)rq[i];
    double e = ks_test_nmse(q, fq, NH * HD, &mx);
    assert_true(e < 2e-2); /* BF16 weights vs the f32 reference */
    ks_eagle3_destroy(d);
}

static void test_head_qk_exact(void **state) {
    const char *dir = tmp_dir("ckpt_qk");
    write_ckpt(dir, (ckpt_opts){.prefix = "midlayer.", .embed = true});
    ks_eagle3 *d = NULL;
    ks_eagle3_params p = ks_eagle3_default_params();
    p.head_only = true;
    assert_int_equal(ks_eagle3_load(dir, p, &d), KS_OK);
    float h3[3 * H], q[NH * HD], k[NKV * HD];
    for (int i = 0; i < 3 * H; i++) h3[i] = (float)cos(0.3 * i) * 2.0f;
    double rq[NH * HD], rk[NKV * HD], inv[HD / 2];
    for (int j = 0; j < HD / 2; j++) inv[j] = pow(10000.0, -2.0 * j / HD);
    const int positions[] = {0, 1, 7, 1000};
    for (int pi = 0; pi < 4; pi++) {
        assert_int_equal(ks_eagle3_head_qk(d, h3, g_w.embed + 4 * H, positions[pi], q, k), KS_OK);
        ref_head_qk(h3, g_w.embed + 4 * H, positions[pi], false, inv, 1.0, rq, rk);
        for (int i = 0; i < NH * HD; i++) assert_true(fabs(q[i] - rq[i]) < 1e-4);
        for (int i = 0; i < NKV * HD; i++) assert_true(fabs(k[i] - rk[i]) < 1e-4);
    }
    /* a fully hand-checkable case: at position 0 RoPE is the identity and with
     * unit embedding e = (1..1), input_norm(e) = inorm; h3 = 0 makes f = 0 so
     * hidden_norm(f) = 0: q[r] = sum_c W_q[r][c] * inorm[c] over the first H columns */
    float ones[H], zeros[3 * H] = {0};
    for (int i = 0; i < H; i++) ones[i] = 1.0f;
    assert_int_equal(ks_eagle3_head_qk(d, zeros, ones, 0, q, k), KS_OK);
    for (int r = 0; r < NH * HD; r++) {
        double s = 0;
        for (int c = 0; c < H; c++) s += (double)g_w.q[r * 2 * H + c] * g_w.inorm[c] / sqrt(1.0 + 1e-5);
        assert_true(fabs(q[r] - s) < 1e-5);
    }
    /* YaRN: at position 0 only the attention temperature remains */
    float q0[NH * HD], k0[NKV * HD];
    assert_int_equal(ks_eagle3_head_qk(d, h3, g_w.embed, 0, q0, k0), KS_OK);
    ks_rope_scaling y = ks_rope_scaling_yarn(4.0f, 2048);
    assert_int_equal(ks_eagle3_set_rope_scaling(d, &y), KS_OK);
    assert_true(fabsf(d->mscale - (float)(0.1 * log(4.0) + 1.0)) < 1e-6f);
    assert_int_equal(ks_eagle3_head_qk(d, h3, g_w.embed, 0, q, k), KS_OK);
    for (int i = 0; i < NH * HD; i++) assert_true(fabsf(q[i] - d->mscale * q0[i]) < 1e-5f);
    /* and at a far position the reference with the YaRN frequencies agrees */
    double yinv[HD / 2];
    for (int j = 0; j < HD / 2; j++) yinv[j] = d->inv_freq[j];
    assert_int_equal(ks_eagle3_head_qk(d, h3, g_w.embed + H, 5000, q, k), KS_OK);
    ref_head_qk(h3, g_w.embed + H, 5000, false, yinv, d->mscale, rq, rk);
    for (int i = 0; i < NH * HD; i++) assert_true(fabs(q[i] - rq[i]) < 1e-3);
    ks_rope_scaling bad = y;
    bad.factor = 0.5f;
    assert_int_equal(ks_eagle3_set_rope_scaling(d, &bad), KS_ERR_INVALID_ARG);
    assert_true(d->cfg.rope.factor == 4.0f); /* unchanged */
    assert_int_equal(ks_eagle3_head_qk(d, NULL, g_w.embed, 0, q, k), KS_ERR_INVALID_ARG);
    assert_int_equal(ks_eagle3_head_qk(d, h3, g_w.embed, -1, q, k), KS_ERR_INVALID_ARG);
    ks_eagle3_destroy(d);
}

static void test_yarn_formula(void **state) {
    /* head_dim 128, base 10000, s = 4 over 2048 positions, beta 32 / 1:
     * d(r) = 128 ln(2048 / (2 pi r)) / (2 ln 10000):
     * d(32) = 16.13 -> low 16, d(1) = 40.21 -> high 41. */
    float inv[64], ms;
    ks_rope_scaling y = ks_rope_scaling_yarn(4.0f, 2048);
    assert_int_equal(ks_rope_inv_freq(128, 10000.0f, &y, inv, &ms), KS_OK);
    assert_true(fabs(ms - (0.1 * log(4.0) + 1.0)) < 1e-6);
    for (int j = 0; j < 64; j++) {
        double base = pow(10000.0, -2.0 * j / 128);
        double ramp = (j - 16.0) / (41.0 - 16.0);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        double want = base * (ramp / 4.0 + (1.0 - ramp));
        if (fabs(inv[j] - want) > 1e-6 * base) fail_msg("j=%d: %g vs %g", j, (double)inv[j], want);
    }
    assert_true(fabs(inv[16] - 0.1) < 1e-7);                              /* last extrapolated dim */
    assert_true(fabs(inv[41] - pow(10000.0, -82.0 / 128) / 4) < 1e-9);    /* first interpolated dim */
    /* explicit attention_factor overrides the temperature */
    y.attention_factor = 1.5f;
    assert_int_equal(ks_rope_inv_freq(128, 10000.0f, &y, inv, &ms), KS_OK);
    assert_true(ms == 1.5f);
    /* none / linear */
    assert_int_equal(ks_rope_inv_freq(8, 10000.0f, NULL, inv, &ms), KS_OK);
    assert_true(ms == 1.0f && inv[0] == 1.0f && fabs(inv[1] - 0.1) < 1e-7);
    ks_rope_scaling lin = {.type = KS_ROPE_SCALING_LINEAR, .factor = 2.0f};
    assert_int_equal(ks_rope_inv_freq(8, 10000.0f, &lin, inv, &ms), KS_OK);
    assert_true(inv[0] == 0.5f);
    /* llama3 (Llama 3.1: factor 8, low 1, high 4, original 8192, base 500000) */
    ks_rope_scaling l3 = {.type = KS_ROPE_SCALING_LLAMA3, .factor = 8, .orig_max_pos = 8192, .low_freq_factor = 1, .high_freq_factor = 4};
    assert_int_equal(ks_rope_inv_freq(128, 500000.0f, &l3, inv, &ms), KS_OK);
    for (int j = 0; j < 64; j++) {
        double f = pow(500000.0, -2.0 * j / 128), wl = 2 * M_PI / f, want;
        if (wl < 8192.0 / 4) want = f;
        else if (wl > 8192.0) want = f / 8;
        else {
            double sm = (8192.0 / wl - 1) / 3;
            want = (1 - sm) * f / 8 + sm * f;
        }
        if (fabs(inv[j] - want) > 1e-6 * f) fail_msg("llama3 j=%d: %g vs %g", j, (double)inv[j], want);
    }
    assert_true(inv[0] == 1.0f);
    /* bad parameters */
    assert_int_equal(ks_rope_inv_freq(7, 10000.0f, NULL, inv, &ms), KS_ERR_INVALID_ARG);
    assert_int_equal(ks_rope_inv_freq(8, 1.0f, NULL, inv, &ms), KS_ERR_INVALID_ARG);
    y.orig_max_pos = 0;
    assert_int_equal(ks_rope_inv_freq(8, 10000.0f, &y, inv, &ms), KS_ERR_INVALID_ARG);
}

static void test_config_rope_and_aux(void **state) {
    const char *dir = tmp_dir("ckpt_yarn");
    write_ckpt(dir, (ckpt_opts){.prefix = "midlayer.", .embed = true,
                                .extra_config = ",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":8.0,\"original_max_position_embeddings\":2048},"
                                                "\"eagle_aux_hidden_state_layer_ids\":[1,5,30],\"target_hidden_size\":8"});
    ks_eagle3 *d = NULL;
    assert_int_equal(ks_eagle3_load(dir, ks_eagle3_default_params(), &d), KS_OK);
    assert_int_equal(d->cfg.rope.type, KS_ROPE_SCALING_YARN);
    assert_true(d->cfg.rope.factor == 8.0f);
    assert_int_equal(d->cfg.rope.orig_max_pos, 2048);
    assert_true(d->cfg.rope.beta_fast == 32.0f && d->cfg.rope.beta_slow == 1.0f);
    assert_true(fabsf(d->mscale - (float)(0.1 * log(8.0) + 1)) < 1e-6f);
    assert_true(d->cfg.aux_layers_set);
    int32_t aux[3];
    ks_eagle3_aux_layers(d, 32, aux);
    assert_true(aux[0] == 1 && aux[1] == 5 && aux[2] == 30);
    ks_eagle3_target hp = {.n_embd = H, .n_vocab = V, .n_layer = 32, .n_head = NH, .n_head_kv = NKV, .head_dim = HD};
    assert_int_equal(ks_eagle3_check_target(d, &hp), KS_OK);
    hp.n_layer = 16;
    assert_int_equal(ks_eagle3_check_target(d, &hp), KS_ERR_INVALID_ARG);
    assert_non_null(strstr(ks_last_error(), "aux hidden-state layer 30"));
    assert_non_null(strstr(ks_last_error(), "16-layer target"));
    ks_eagle3_destroy(d);
}

/* YaRN for a long context composes with the checkpoint's own scaling: every
 * frequency of that scaling times YaRN's ratio to plain RoPE, scales multiplied. */
static void test_yarn_composes(void **state) {
    (void)state;
    const char *cfgs[3] = {",\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":2.0}",
                           (",\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,"
                            "\"high_freq_factor\":4.0,\"original_max_position_embeddings\":64}"),
                           ",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":2.0,\"original_max_position_embeddings\":256}"};
    for (int c = 0; c < 3; c++) {
        char name[32];
        snprintf(name, sizeof name, "ckpt_compose%d", c);
        const char *dir = tmp_dir(name);
        write_ckpt(dir, (ckpt_opts){.prefix = "midlayer.", .embed = true, .extra_config = cfgs[c]});
        ks_eagle3 *d = NULL;
        assert_int_equal(ks_eagle3_load(dir, ks_eagle3_default_params(), &d), KS_OK);
        ks_rope_scaling own = d->cfg.rope;
        assert_true(own.type != KS_ROPE_SCALING_NONE);
        float base[HD / 2], plain[HD / 2], yarn[HD / 2], ms_own, ms_plain, ms_yarn;
        assert_int_equal(ks_rope_inv_freq(HD, d->cfg.rope_theta, &own, base, &ms_own), KS_OK);
        assert_int_equal(ks_rope_inv_freq(HD, d->cfg.rope_theta, NULL, plain, &ms_plain), KS_OK);
        ks_rope_scaling y = ks_rope_scaling_yarn(4.0f, 512);
        assert_int_equal(ks_rope_inv_freq(HD, d->cfg.rope_theta, &y, yarn, &ms_yarn), KS_OK);
        assert_int_equal(ks_eagle3_add_yarn(d, 4.0f, 512), KS_OK);
        bool differs_from_replace = false;
        for (int j = 0; j < HD / 2; j++) {
            double want = (double)base[j] * yarn[j] / plain[j];
            assert_true(fabs(d->inv_freq[j] - want) <= 1e-6 * want);
            differs_from_replace |= fabsf(d->inv_freq[j] - yarn[j]) > 1e-6f * yarn[j];
        }
        assert_true(differs_from_replace); /* the checkpoint's scaling was not dropped */
        assert_true(fabsf(d->mscale - ms_own * ms_yarn) < 1e-6f);
        assert_int_equal(d->cfg.rope.type, own.type);
        assert_int_equal(ks_eagle3_add_yarn(d, 0.5f, 512), KS_ERR_INVALID_ARG);
        ks_eagle3_destroy(d);
    }
}

/* vllm-project/speculators layout: Llama fields under transformer_layer_config. */
static void test_speculators_config(void **state) {
    const char *dir = tmp_dir("ckpt_speculators");
    write_ckpt(dir, (ckpt_opts){.prefix = "layers.0.", .embed = false});
    const char *cfg =
        "{\"architectures\":[\"Eagle3Speculator\"],\"draft_vocab_size\":8,\"speculators_model_type\":\"eagle3\","
        "\"eagle_aux_hidden_state_layer_ids\":[2,8,13],"
        "\"transformer_layer_config\":{\"head_dim\":4,\"hidden_size\":8,\"intermediate_size\":12,"
        "\"max_position_embeddings\":131072,\"num_attention_heads\":2,\"num_hidden_layers\":1,\"num_key_value_heads\":1,"
        "\"rms_norm_eps\":1e-05,\"rope_scaling\":{\"factor\":8.0,\"high_freq_factor\":4.0,\"low_freq_factor\":1.0,"
        "\"original_max_position_embeddings\":8192,\"rope_type\":\"llama3\"},\"rope_theta\":500000.0,\"vocab_size\":16}}";
    char p[1300];
    snprintf(p, sizeof p, "%s/config.json", dir);
    assert_int_equal(ks_test_write_file(p, cfg, strlen(cfg)), 0);
    ks_eagle3 *d = NULL;
    assert_int_equal(ks_eagle3_load(dir, ks_eagle3_default_params(), &d), KS_OK);
    assert_string_equal(d->cfg.arch, "Eagle3Speculator");
    assert_int_equal(d->cfg.hidden_size, H);
    assert_int_equal(d->cfg.vocab_size, V);
    assert_int_equal(d->cfg.draft_vocab_size, DV);
    assert_int_equal(d->cfg.max_pos, 131072);
    assert_int_equal(d->cfg.rope.type, KS_ROPE_SCALING_LLAMA3);
    assert_int_equal(d->cfg.rope.orig_max_pos, 8192);
    assert_true(d->cfg.rope_theta == 500000.0f);
    assert_true(d->cfg.aux_layers_set && d->cfg.aux_layers[1] == 8);
    ks_eagle3_destroy(d);
}

static void test_check_target(void **state) {
    const char *dir = tmp_dir("ckpt_target");
    write_ckpt(dir, (ckpt_opts){.prefix = "midlayer.", .embed = true, .extra_config = ",\"rope_scaling\":null"});
    ks_eagle3 *d = NULL;
    ks_eagle3_params p = ks_eagle3_default_params();
    p.head_only = true;
    assert_int_equal(ks_eagle3_load(dir, p, &d), KS_OK);
    ks_eagle3_target ok = {.n_embd = H, .n_vocab = V, .n_layer = 32, .n_head = NH, .n_head_kv = NKV, .head_dim = HD};
    assert_int_equal(ks_eagle3_check_target(d, &ok), KS_OK);
    int32_t aux[3];
    ks_eagle3_aux_layers(d, 32, aux); /* EAGLE-3 default for a 32-layer target */
    assert_true(aux[0] == 2 && aux[1] == 16 && aux[2] == 29);
    ks_eagle3_target t = ok;
    t.n_embd = 16;
    assert_int_equal(ks_eagle3_check_target(d, &t), KS_ERR_INVALID_ARG);
    assert_non_null(strstr(ks_last_error(), "hidden size 8"));
    t = ok;
    t.n_vocab = 32000;
    assert_int_equal(ks_eagle3_check_target(d, &t), KS_ERR_INVALID_ARG);
    assert_non_null(strstr(ks_last_error(), "vocabulary has 16 tokens but the target's has 32000"));
    t = ok;
    t.n_head_kv = 2;
    assert_int_equal(ks_eagle3_check_target(d, &t), KS_ERR_INVALID_ARG);
    assert_non_null(strstr(ks_last_error(), "KV heads"));
    t = ok;
    t.n_layer = 2; /* default [2, 1, -1] */
    assert_int_equal(ks_eagle3_check_target(d, &t), KS_ERR_INVALID_ARG);
    assert_non_null(strstr(ks_last_error(), "default [2, L/2, L-3]"));
    ks_eagle3_destroy(d);
}

/* `kvsieve info DIR` describes a checkpoint directory; a non-EAGLE one fails cleanly. */
static void test_cli_info(void **state) {
    const char *dir = tmp_dir("ckpt_cli");
    write_ckpt(dir, (ckpt_opts){.prefix = "midlayer.", .embed = false});
    char cmd[4096], out[8192];
    snprintf(cmd, sizeof cmd, "'%s' info '%s' --tensors 2>&1", KS_CLI, dir);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = 0;
    int rc = pclose(f);
    if (rc != 0) fail_msg("exit %d: %s", rc, out);
    assert_non_null(strstr(out, "EAGLE-3 draft model (LlamaForCausalLMEagle3)"));
    assert_non_null(strstr(out, "midlayer.self_attn.q_proj.weight"));
    assert_non_null(strstr(out, "embed_tokens absent"));
    assert_non_null(strstr(out, "retrieval head 400 (55.4% fewer)"));
    const char *bad = tmp_dir("ckpt_cli_bad");
    write_ckpt(bad, (ckpt_opts){.prefix = "blocks.0.", .embed = true});
    snprintf(cmd, sizeof cmd, "'%s' info '%s' >/dev/null 2>&1", KS_CLI, bad);
    rc = system(cmd);
    assert_true(WIFEXITED(rc) && WEXITSTATUS(rc) == 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_full_and_head), cmocka_unit_test(test_embed_only_head),
        cmocka_unit_test(test_bad_checkpoints),    cmocka_unit_test(test_ambiguous_prefix),
        cmocka_unit_test(test_sharded_bf16),       cmocka_unit_test(test_head_qk_exact),
        cmocka_unit_test(test_yarn_formula),       cmocka_unit_test(test_config_rope_and_aux),
        cmocka_unit_test(test_check_target),       cmocka_unit_test(test_cli_info),
        cmocka_unit_test(test_speculators_config), cmocka_unit_test(test_yarn_composes),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
