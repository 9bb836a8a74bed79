/*
 * test_spec.c — SpeContext in kvsieve: the `spec` policy and the tiers it
 * drives.
 *
 *  - Head-level selection on hand-made DLM weights picks the known tokens:
 *    MHA (per head), GQA (element-wise max over the group) and MQA, at every
 *    SIMD level this CPU has (the signal lies in the kernels' head-dim tails).
 *  - On random drafts, the AVX2 and AVX-512 scoring/softmax kernels select
 *    exactly what the scalar path does, for groups of 1, 2, 3, 4 and 8 heads,
 *    with the head's K cache in f16 and in Q8_0 (kcache=q8_0).
 *  - The scoring kernels against a scalar reference under stated tolerances
 *    (f16 and Q8_0 keys, head dims 64, 70 and 128, including the integer
 *    paths whose query is quantised too: AVX-512 VNNI, AVX2, NEON sdot and
 *    plain NEON, each also bit for bit against a scalar emulation of their
 *    shared integer sums and epilogue), which kernel each level runs (by
 *    name), and the group's log weights against a double-precision
 *    log-softmax.
 *  - With a budget >= the sequence, spec equals dense bit for bit (batch 1
 *    and 2, with slow-tier layers in memory and in files).
 *  - Elastic loading: with a small budget and layers in the slow tier, the
 *    logits equal those of the same policy with everything resident, so the
 *    slots hold exactly what a full reload would.
 *  - Offloading a layer in the middle of decoding leaves the logits unchanged.
 * The DLMs are written here as EAGLE-3 checkpoints (safetensors +
 * config.json) for generated tiny targets.
 */
#define _GNU_SOURCE
#include "infer/infer.h"
#include "gguf/gguf.h"
#include "model/shapes.h"
#include "core/simd.h"
#include "spec/spec_score.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* H, DHD: the draft's hidden size and head dim (70: not a multiple of 8 or 16,
 * so the AVX2 and AVX-512 scoring kernels both run their tails); HD: the
 * target's head dim; NQ: the draft's query heads unless a test says */
enum { H = 256, DHD = 70, HD = 64, NQ = 4, V = 512 };

static char g_tmp[256];
static ks_model *g_llama; /* tiny-llama: 4 heads / 2 KV, 3 layers */

static ks_model *gen_target(const char *shape, int n_layer, const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s.gguf", g_tmp, name);
    ks_gguf *vocab = NULL;
    assert_int_equal(ks_gguf_open(ks_test_fixture("models/aidreams260K.gguf"), &vocab), KS_OK);
    ks_shape_gen_params gp = {.type = KS_DTYPE_F16, .vocab = vocab, .seed = 11, .n_layer = n_layer, .n_ctx = 1024};
    assert_int_equal(ks_shape_generate(ks_shape_find(shape), &gp, path, NULL), KS_OK);
    ks_gguf_close(vocab);
    ks_model *m = NULL;
    assert_int_equal(ks_model_load(path, ks_model_default_params(), &m), KS_OK);
    return m;
}

/* Write an EAGLE-3 head checkpoint.  q, k: [nq*DHD][2H] and [nkv*DHD][2H]. */
static void write_dlm_nq(const char *dir, int nq, int nkv, const float *embed, const float *fc, const float *q,
                         const float *k, int aux_layers_max) {
    mkdir(dir, 0700);
    char cfg[1024], p[600];
    snprintf(cfg, sizeof cfg,
             "{\"architectures\":[\"LlamaForCausalLMEagle3\"],\"hidden_size\":%d,\"intermediate_size\":64,"
             "\"num_attention_heads\":%d,\"num_key_value_heads\":%d,\"head_dim\":%d,\"vocab_size\":%d,"
             "\"rms_norm_eps\":1e-5,\"rope_theta\":1000000000.0,\"max_position_embeddings\":4096,"
             "\"eagle_aux_hidden_state_layer_ids\":[0,%d,%d]}",
             H, nq, nkv, DHD, V, aux_layers_max / 2, aux_layers_max);
    snprintf(p, sizeof p, "%s/config.json", dir);
    assert_int_equal(ks_test_write_file(p, cfg, strlen(cfg)), 0);
    static float ones[H];
    for (int i = 0; i < H; i++) ones[i] = 1.0f;
    ks_test_st_tensor t[] = {
        {"embed_tokens.weight", "F32", 2, {V, H}, embed, sizeof(float) * V * H},
        {"fc.weight", "F32", 2, {H, 3 * H}, fc, sizeof(float) * H * 3 * H},
        {"midlayer.hidden_norm.weight", "F32", 1, {H}, ones, sizeof ones},
        {"midlayer.input_layernorm.weight", "F32", 1, {H}, ones, sizeof ones},
        {"midlayer.self_attn.q_proj.weight", "F32", 2, {nq * DHD, 2 * H}, q, sizeof(float) * nq * DHD * 2 * H},
        {"midlayer.self_attn.k_proj.weight", "F32", 2, {nkv * DHD, 2 * H}, k, sizeof(float) * nkv * DHD * 2 * H},
    };
    size_t size = 0;
    uint8_t *img = ks_test_safetensors_build(t, 6, NULL, &size);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    assert_int_equal(ks_test_write_file(p, img, size), 0);
    free(img);
}

static void write_dlm(const char *dir, int nkv, const float *embed, const float *fc, const float *q, const float *k,
                      int aux_layers_max) {
    write_dlm_nq(dir, NQ, nkv, embed, fc, q, k, aux_layers_max);
}

static void random_fill(float *x, size_t n, uint64_t seed, float scale) {
    ks_rng r = {seed};
    for (size_t i = 0; i < n; i++) x[i] = scale * (float)(ks_rng_uniform(&r) * 2 - 1);
}

static char g_dlm_rand[400];

static int setup(void **state) {
    (void)state;
    snprintf(g_tmp, sizeof g_tmp, "/tmp/kvsieve-test-spec-XXXXXX");
    if (!mkdtemp(g_tmp)) return -1;
    g_llama = gen_target("tiny-llama", 3, "llama");
    /* a random DLM for tiny-llama: everything plausible, nothing meaningful */
    float *embed = malloc(sizeof(float) * V * H), *fc = malloc(sizeof(float) * H * 3 * H);
    float *q = malloc(sizeof(float) * NQ * DHD * 2 * H), *k = malloc(sizeof(float) * 2 * DHD * 2 * H);
    random_fill(embed, (size_t)V * H, 1, 1.0f);
    random_fill(fc, (size_t)H * 3 * H, 2, 0.05f);
    random_fill(q, (size_t)NQ * DHD * 2 * H, 3, 0.1f);
    random_fill(k, (size_t)2 * DHD * 2 * H, 4, 0.1f);
    snprintf(g_dlm_rand, sizeof g_dlm_rand, "%s/dlm-rand", g_tmp);
    write_dlm(g_dlm_rand, 2, embed, fc, q, k, 2);
    free(embed);
    free(fc);
    free(q);
    free(k);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    ks_model_destroy(g_llama);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
    return system(cmd) == 0 ? 0 : -1;
}

/* ----------------------------------------------- hand-made selection -- */
/* Embedding of token t: one-hot on dim t % H (rmsnorm makes it 16 e_t).
 * Query token QT; KV head h's key dims 64 + g (g < G) light up for the
 * token its query head g seeks: target[h][g].  Those dims lie in the tails
 * of both SIMD scoring kernels (64..69) and barely rotate (rope_theta 1e9). */
enum { QT = 300 };

static void check_selection(const char *shape, int nkv, const int *seek /* [NQ] token each query head seeks */,
                            const int *expect /* [nkv][G] positions expected in each KV head's set */) {
    int G = NQ / nkv;
    ks_model *m = gen_target(shape, 1, shape);
    float *embed = calloc((size_t)V * H, sizeof(float)), *fc = calloc((size_t)H * 3 * H, sizeof(float));
    float *q = calloc((size_t)NQ * DHD * 2 * H, sizeof(float)), *k = calloc((size_t)nkv * DHD * 2 * H, sizeof(float));
    for (int t = 0; t < V; t++) embed[(size_t)t * H + t % H] = 1.0f;
    for (int g = 0; g < NQ; g++) { /* query head g, dim 64 + g % G: the query token */
        int d = DHD - 6 + g % G;
        q[((size_t)g * DHD + d) * 2 * H + QT % H] = 1.0f;
        int kvh = g / G; /* its KV head's dim d: the sought token */
        k[((size_t)kvh * DHD + d) * 2 * H + seek[g] % H] = 1.0f;
    }
    char dir[400];
    snprintf(dir, sizeof dir, "%s/dlm-%s", g_tmp, shape);
    write_dlm(dir, nkv, embed, fc, q, k, 0);
    free(embed);
    free(fc);
    free(q);
    free(k);
    ks_pool *pool = NULL;
    assert_int_equal(ks_pool_create(2, &pool), KS_OK);
    ks_policy_env env = {.pool = pool, .n_layer = 1, .n_head = NQ, .n_head_kv = nkv, .head_dim = HD,
                         .n_seq = 1, .n_ctx = 64, .n_vocab = m->hp.n_vocab, .n_embd = m->hp.n_embd,
                         .tok_embd = m->tok_embd};
    ks_simd_level hw = ks_simd_detect();
    for (int run = 0; run <= 2 * (int)hw + 1; run++) {
        int lv = run / 2;
        const char *kc = run % 2 ? "q8_0" : "f16";
        ks_simd_level prev = ks_simd_force((ks_simd_level)lv);
        char args[500];
        snprintf(args, sizeof args, "dlm=%s,variant=embed,kcache=%s", dir, kc);
        ks_policy *pol = NULL;
        ks_status st = ks_test_policy_create("spec", args, 2 + 4 + G, 2, 4, -1, &env, &pol);
        if (st != KS_OK) fail_msg("spec create: %s", ks_last_error());
        int32_t prompt[40];
        for (int i = 0; i < 40; i++) prompt[i] = 5 + i % 3;
        for (int g = 0; g < NQ; g++) prompt[expect[g]] = seek[g]; /* the sought tokens at known positions */
        ks_prefill_info info = {.seq = 0, .n_prompt = 40, .prompt = prompt, .first_pos = 0};
        assert_int_equal(ks_policy_on_prefill(pol, &info), KS_OK);
        int32_t seq = 0, tok = QT, pos = 40;
        ks_step_info step = {.n = 1, .seq = &seq, .token = &tok, .pos = &pos};
        assert_int_equal(ks_policy_before_step(pol, &step), KS_OK);
        for (int h = 0; h < nkv; h++) {
            int32_t idx[64];
            ks_selection sel = {.cap = 64, .idx = idx};
            ks_select_req req = {.seq = 0, .layer = 0, .head = h, .pos = 40, .n_entries = 41, .q = NULL,
                                 .n_select = G, .sink = 2, .window = 4};
            assert_int_equal(ks_policy_select(pol, &req, &sel), KS_OK);
            assert_false(sel.pages);
            assert_int_equal(sel.n, G);
            for (int g = 0; g < G; g++) {
                bool found = false;
                for (int i = 0; i < sel.n; i++) found |= idx[i] == expect[h * G + g];
                if (!found)
                    fail_msg("%s (%s, kcache=%s): KV head %d did not select position %d", shape,
                             ks_simd_name((ks_simd_level)lv), kc, h, expect[h * G + g]);
            }
        }
        ks_policy_destroy(pol);
        ks_simd_force(prev);
    }
    ks_pool_destroy(pool);
    ks_model_destroy(m);
}

static void test_select_mha(void **state) {
    (void)state;
    int seek[NQ] = {100, 101, 102, 103}, expect[NQ] = {10, 15, 20, 25};
    check_selection("tiny-mha", 4, seek, expect);
}

static void test_select_gqa(void **state) {
    (void)state;
    int seek[NQ] = {100, 101, 102, 103}, expect[NQ] = {10, 15, 20, 25}; /* KV head 0: {10, 15}; 1: {20, 25} */
    check_selection("tiny-llama", 2, seek, expect);
}

static void test_select_mqa(void **state) {
    (void)state;
    int seek[NQ] = {100, 101, 102, 103}, expect[NQ] = {10, 15, 20, 25}; /* one KV head, all four */
    check_selection("tiny-mqa", 1, seek, expect);
}

/* ------------------------------------- SIMD kernels against scalar -- */
enum { LV_PROMPT = 290, LV_STEPS = 8, LV_CTX = LV_PROMPT + LV_STEPS, LV_BUDGET = 40 };

/* Selections of a random embed-only draft with nq query heads at each of
 * LV_STEPS decode steps (key counts 291..298: every remainder mod 8), at SIMD
 * level lv.  sel: [LV_STEPS][nkv][LV_BUDGET] positions, sorted. */
static void select_at_level(ks_model *m, const char *dir, int nq, int nkv, ks_simd_level lv, const char *kcache,
                            int32_t *sel) {
    ks_simd_level prev = ks_simd_force(lv);
    ks_pool *pool = NULL;
    assert_int_equal(ks_pool_create(2, &pool), KS_OK);
    ks_policy_env env = {.pool = pool, .n_layer = 1, .n_head = m->hp.n_head, .n_head_kv = nkv,
                         .head_dim = HD, .n_seq = 1, .n_ctx = LV_CTX, .n_vocab = m->hp.n_vocab,
                         .n_embd = m->hp.n_embd, .tok_embd = m->tok_embd};
    char args[500];
    snprintf(args, sizeof args, "dlm=%s,variant=embed,kcache=%s", dir, kcache);
    ks_policy *pol = NULL;
    if (ks_test_policy_create("spec", args, LV_BUDGET, 2, 4, -1, &env, &pol) != KS_OK) fail_msg("spec create: %s", ks_last_error());
    int32_t prompt[LV_PROMPT];
    for (int i = 0; i < LV_PROMPT; i++) prompt[i] = (i * 37 + 11) % V;
    ks_prefill_info info = {.seq = 0, .n_prompt = LV_PROMPT, .prompt = prompt, .first_pos = 0};
    assert_int_equal(ks_policy_on_prefill(pol, &info), KS_OK);
    int n_select = LV_BUDGET - 2 - 4;
    for (int t = 0; t < LV_STEPS; t++) {
        int32_t seq = 0, tok = (t * 53 + 7) % V, pos = LV_PROMPT + t;
        ks_step_info step = {.n = 1, .seq = &seq, .token = &tok, .pos = &pos};
        assert_int_equal(ks_policy_before_step(pol, &step), KS_OK);
        for (int h = 0; h < nkv; h++) {
            int32_t *idx = sel + ((size_t)t * nkv + h) * LV_BUDGET;
            ks_selection out = {.cap = LV_BUDGET, .idx = idx};
            ks_select_req req = {.seq = 0, .layer = 0, .head = h, .pos = pos, .n_entries = pos + 1,
                                 .n_select = n_select, .sink = 2, .window = 4};
            assert_int_equal(ks_policy_select(pol, &req, &out), KS_OK);
            assert_int_equal(out.n, n_select);
            for (int i = 1; i < out.n; i++) /* insertion sort: the set, not topk's order */
                for (int j = i; j > 0 && idx[j - 1] > idx[j]; j--) {
                    int32_t x = idx[j];
                    idx[j] = idx[j - 1];
                    idx[j - 1] = x;
                }
            for (int i = out.n; i < LV_BUDGET; i++) idx[i] = -1;
        }
    }
    ks_policy_destroy(pol);
    ks_pool_destroy(pool);
    ks_simd_force(prev);
}

/* The SIMD kernels score in another order than the scalar loop and use a
 * polynomial exp, so the weights differ in the last bits; the ranking of
 * random scores has no ties that close, so the selected sets are equal. */
static void test_simd_matches_scalar(void **state) {
    (void)state;
    static const struct {
        const char *shape;
        int nkv, nq; /* group nq / nkv: 1, 2, 3, 4, 8 */
    } cfg[] = {{"tiny-mha", 4, 4}, {"tiny-llama", 2, 4}, {"tiny-llama", 2, 6}, {"tiny-mqa", 1, 4}, {"tiny-mqa", 1, 8}};
    ks_simd_level hw = ks_simd_detect();
    if (hw == KS_SIMD_SCALAR) print_message("no SIMD on this CPU: nothing to compare\n");
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        int nq = cfg[c].nq, nkv = cfg[c].nkv;
        ks_model *m = gen_target(cfg[c].shape, 1, cfg[c].shape);
        float *embed = malloc(sizeof(float) * V * H), *fc = calloc((size_t)H * 3 * H, sizeof(float));
        float *q = malloc(sizeof(float) * nq * DHD * 2 * H), *k = malloc(sizeof(float) * nkv * DHD * 2 * H);
        random_fill(embed, (size_t)V * H, 10 + c, 1.0f);
        random_fill(q, (size_t)nq * DHD * 2 * H, 20 + c, 0.1f);
        random_fill(k, (size_t)nkv * DHD * 2 * H, 30 + c, 0.1f);
        char dir[400];
        snprintf(dir, sizeof dir, "%s/dlm-lv-%s-%d", g_tmp, cfg[c].shape, nq);
        write_dlm_nq(dir, nq, nkv, embed, fc, q, k, 0);
        free(embed);
        free(fc);
        free(q);
        free(k);
        size_t n = (size_t)LV_STEPS * nkv * LV_BUDGET;
        int32_t *ref = malloc(sizeof(int32_t) * n), *got = malloc(sizeof(int32_t) * n);
        for (int k8 = 0; k8 <= 1; k8++) {
            const char *kc = k8 ? "q8_0" : "f16";
            select_at_level(m, dir, nq, nkv, KS_SIMD_SCALAR, kc, ref);
            for (int lv = KS_SIMD_AVX2; lv <= (int)hw; lv++) {
                select_at_level(m, dir, nq, nkv, (ks_simd_level)lv, kc, got);
                for (size_t i = 0; i < n; i++)
                    if (got[i] != ref[i])
                        fail_msg("%s, %d query heads, kcache=%s: %s selects position %d at step %zu, KV head %zu; "
                                 "scalar %d", cfg[c].shape, nq, kc, ks_simd_name((ks_simd_level)lv), got[i],
                                 i / LV_BUDGET / nkv, i / LV_BUDGET % nkv, ref[i]);
            }
        }
        free(ref);
        free(got);
        ks_model_destroy(m);
    }
}

/* Which scoring kernel runs at each level this CPU has, by name
 * (test_dispatch's way): Q8_0 keys at hd 64 / 128 on the integer path of
 * the level (sdot where the CPU has dotprod, smull / sadalp on plain NEON),
 * so a path falling back to the float or scalar one fails here.  Under
 * `make test-arm`, QEMU_CPU=max runs the sdot kernel and cortex-a53 the
 * plain NEON one. */
static void test_score_kernel_names(void **state) {
    (void)state;
    ks_simd_level hw = ks_simd_detect();
    for (int lv = KS_SIMD_SCALAR; lv <= (int)hw; lv++) {
        if (lv != KS_SIMD_SCALAR && (lv >= KS_SIMD_NEON) != (hw >= KS_SIMD_NEON)) continue;
        const char *q8 = "scalar", *fl = "scalar";
        switch ((ks_simd_level)lv) {
        case KS_SIMD_AVX2: q8 = "q8_int_avx2", fl = "avx2"; break;
        case KS_SIMD_AVX512: q8 = "q8_vnni", fl = "avx512"; break;
        case KS_SIMD_NEON: q8 = "q8_int_neon", fl = "neon"; break;
        case KS_SIMD_NEON_DOT:
        case KS_SIMD_NEON_I8MM: q8 = "q8_int_dot", fl = "neon"; break;
        default: break;
        }
        for (int hd = 64; hd <= 128; hd += 64) {
            assert_string_equal(ks_spec_scores_kernel_name(KS_DTYPE_Q8_0, hd, (ks_simd_level)lv), q8);
            assert_string_equal(ks_spec_scores_kernel_name(KS_DTYPE_F16, hd, (ks_simd_level)lv), fl);
        }
        assert_string_equal(ks_spec_scores_kernel_name(KS_DTYPE_Q8_0, 70, (ks_simd_level)lv), fl); /* float path */
        fprintf(stderr, "spec scores at %s: q8_0 %s, f16 %s\n", ks_simd_name((ks_simd_level)lv), q8, fl);
    }
}

/* ------------------------------------------- kernels, under bounds -- */
/* ks_spec_scores at every SIMD level against the scalar path (which
 * dequantises the keys exactly and sums in f32): within 1e-5 of sum |q_i k_i|
 * (summation order).  The integer paths (Q8_0 keys, hd 64 or 128, at every
 * SIMD level) also round the scaled query to Q8_0 blocks
 * (ks_quantize_query_q8): they are held to the same 1e-5 against a
 * double-precision dot product of that rounded query with the keys, the
 * rounding itself is bounded by sum |k_i| * max|q| / 254 from the scalar
 * scores, and their bits must equal a scalar emulation of the VNNI kernel's
 * arithmetic (exact int32 block sums, then its float epilogue), so every
 * ISA scores alike. */
static void test_score_kernels(void **state) {
    (void)state;
    const int hds[] = {64, 70, 128}, Gs[] = {1, 2, 3, 4, 8};
    const int32_t n = 291;
    ks_simd_level hw = ks_simd_detect();
    for (int kt8 = 0; kt8 <= 1; kt8++) {
        ks_dtype kt = kt8 ? KS_DTYPE_Q8_0 : KS_DTYPE_F16;
        for (size_t a = 0; a < sizeof hds / sizeof hds[0]; a++)
            for (size_t b = 0; b < sizeof Gs / sizeof Gs[0]; b++) {
                int hd = hds[a], G = Gs[b];
                float scale = 1.0f / sqrtf((float)hd);
                size_t rb = ks_spec_kcache_row_bytes(kt, hd);
                float *q = malloc(sizeof(float) * G * hd), *kf = malloc(sizeof(float) * n * hd);
                float *kd = malloc(sizeof(float) * KS_SPEC_HD_MAX), *ref = malloc(sizeof(float) * G * n);
                float *got = malloc(sizeof(float) * G * n), *bound = malloc(sizeof(float) * G * n);
                float *qround = malloc(sizeof(float) * G * n), *refq = malloc(sizeof(float) * G * n);
                float *refi = malloc(sizeof(float) * G * n);
                uint8_t *K = malloc(rb * n);
                random_fill(q, (size_t)G * hd, 100 + a * 10 + b, 1.0f);
                random_fill(kf, (size_t)n * hd, 200 + a * 10 + b, 1.0f);
                for (int32_t j = 0; j < n; j++) ks_spec_kcache_store(kt, kf + (size_t)j * hd, hd, K + (size_t)j * rb);
                ks_spec_scores(q, K, kt, n, hd, G, scale, ref, KS_SIMD_SCALAR);
                float qmax = 0;
                for (int i = 0; i < G * hd; i++) qmax = fabsf(q[i]) > qmax ? fabsf(q[i]) : qmax;
                for (int32_t j = 0; j < n; j++) {
                    if (kt8) ks_dequantize_row(KS_DTYPE_Q8_0, K + (size_t)j * rb, kd, ks_spec_kcache_dim(hd));
                    else
                        for (int i = 0; i < hd; i++) kd[i] = ks_f16_to_f32(((const ks_f16 *)K)[(size_t)j * hd + i]);
                    for (int g = 0; g < G; g++) {
                        double qk = 0, k1 = 0;
                        for (int i = 0; i < hd; i++) {
                            qk += fabs((double)q[g * hd + i] * kd[i]);
                            k1 += fabs(kd[i]);
                        }
                        bound[(size_t)g * n + j] = (float)(scale * 1e-5 * qk + 1e-6);
                        qround[(size_t)g * n + j] = (float)(scale * k1 * qmax / 254.0);
                        if (kt8 && hd % 64 == 0) { /* the rounded query's exact score */
                            float qs[128], d[4];
                            int8_t qi[128];
                            uint8_t qu[128];
                            for (int i = 0; i < hd; i++) qs[i] = q[g * hd + i] * scale;
                            ks_quantize_query_q8(qs, hd, qi, qu, d);
                            double acc = 0;
                            for (int i = 0; i < hd; i++) acc += (double)qi[i] * d[i / 32] * kd[i];
                            refq[(size_t)g * n + j] = (float)acc;
                            /* the integer paths' bits: exact int32 block sums, then the
                             * VNNI kernel's epilogue per 64-value chunk (spec_score.c) */
                            const uint8_t *row = K + (size_t)j * rb;
                            float f = 0.0f;
                            for (int c = 0; c < hd / 64; c++) {
                                float part[2], p[2];
                                for (int h = 0; h < 2; h++) {
                                    const uint8_t *blk = row + 34 * (size_t)(2 * c + h);
                                    ks_f16 dk;
                                    memcpy(&dk, blk, 2);
                                    int32_t isum = 0;
                                    for (int i = 0; i < 32; i++) isum += (int32_t)(int8_t)blk[2 + i] * qi[64 * c + 32 * h + i];
                                    part[h] = (float)isum;
                                    p[h] = ks_f16_to_f32(dk) * d[2 * c + h];
                                }
                                float sc = part[0] * p[0];
                                sc = fmaf(part[1], p[1], sc);
                                f = c ? f + sc : sc;
                            }
                            refi[(size_t)g * n + j] = f;
                        }
                    }
                }
                for (int lv = KS_SIMD_AVX2; lv <= (int)hw; lv++) {
                    if ((lv >= KS_SIMD_NEON) != (hw >= KS_SIMD_NEON)) continue; /* the CPU's own family of levels */
                    /* every SIMD level scores Q8_0 keys at hd 64 / 128 on integer units */
                    bool vnni = kt8 && (hd == 64 || hd == 128);
                    ks_spec_scores(q, K, kt, n, hd, G, scale, got, (ks_simd_level)lv);
                    if (vnni && memcmp(got, refi, sizeof(float) * (size_t)G * n)) {
                        size_t i = 0;
                        while (memcmp(got + i, refi + i, sizeof(float))) i++;
                        fail_msg("%s, kcache q8_0, hd %d, G %d: score[%zu][%zu] %.9g, the integer path's bits %.9g",
                                 ks_simd_name((ks_simd_level)lv), hd, G, i / n, i % n, got[i], refi[i]);
                    }
                    for (size_t i = 0; i < (size_t)G * n; i++) {
                        float lim = bound[i] + (vnni ? qround[i] : 0.0f);
                        if (vnni && !(fabsf(got[i] - refq[i]) <= bound[i]))
                            fail_msg("%s, kcache q8_0, hd %d, G %d: score[%zu][%zu] %g vs the rounded query's %g",
                                     ks_simd_name((ks_simd_level)lv), hd, G, i / n, i % n, got[i], refq[i]);
                        if (!(fabsf(got[i] - ref[i]) <= lim))
                            fail_msg("%s, kcache %s, hd %d, G %d: score[%zu][%zu] %g vs scalar %g (bound %g)",
                                     ks_simd_name((ks_simd_level)lv), kt8 ? "q8_0" : "f16", hd, G, i / n, i % n,
                                     got[i], ref[i], lim);
                    }
                }
                free(q);
                free(kf);
                free(kd);
                free(ref);
                free(got);
                free(bound);
                free(qround);
                free(refq);
                free(refi);
                free(K);
            }
    }
    /* the group's log weights: max over heads of log softmax, vs double */
    const int G = 4;
    float *x = malloc(sizeof(float) * G * n), *w = malloc(sizeof(float) * n);
    random_fill(x, (size_t)G * n, 77, 5.0f);
    double c[4];
    for (int g = 0; g < G; g++) {
        double m = -INFINITY, tot = 0;
        for (int32_t j = 0; j < n; j++) m = x[g * n + j] > m ? x[g * n + j] : m;
        for (int32_t j = 0; j < n; j++) tot += exp(x[g * n + j] - m);
        c[g] = m + log(tot);
    }
    for (int lv = KS_SIMD_SCALAR; lv <= (int)hw; lv++) {
        ks_spec_group_logweights(x, G, n, w, (ks_simd_level)lv);
        for (int32_t j = 0; j < n; j++) {
            double want = -INFINITY;
            for (int g = 0; g < G; g++) want = fmax(want, x[g * n + j] - c[g]);
            if (!(fabs(w[j] - want) <= 1e-4))
                fail_msg("%s: log weight %d: %g, want %g", ks_simd_name((ks_simd_level)lv), j, w[j], want);
        }
    }
    free(x);
    free(w);
}

/* ------------------------------------------------- end-to-end runs -- */
static bool g_plan_per_layer; /* run(): turn off the engine's once-a-step plan of a same-every-layer policy */
static const char *g_spec_extra = ""; /* run(): more policy arguments after dlm=, e.g. ",weights=q8_0" */

static float *run(const char *policy, int32_t budget, int offload, const char *dir, int n_seq, int n_prompt, int steps,
                  int offload_at /* step at which layer 2 moves to the slow tier, or -1 */) {
    ks_context_params p = ks_context_default_params();
    p.n_ctx = n_prompt + steps + 1;
    p.n_seq = n_seq;
    p.n_threads = 2;
    p.n_batch = 64;
    p.policy = policy;
    p.budget = budget;
    p.page = 16;
    p.sink = 4;
    p.window = 16;
    p.kv_offload_layers = offload;
    p.kv_offload_dir = dir;
    char args[500];
    snprintf(args, sizeof args, "dlm=%s%s", g_dlm_rand, g_spec_extra);
    p.policy_args = strcmp(policy, "dense") ? args : NULL;
    ks_context *c = NULL;
    if (ks_context_create(g_llama, p, &c) != KS_OK) fail_msg("context: %s", ks_last_error());
    c->plan_per_layer = g_plan_per_layer;
    int32_t Vv = g_llama->hp.n_vocab;
    float *out = malloc(sizeof(float) * (size_t)steps * n_seq * Vv), *logits = malloc(sizeof(float) * n_seq * Vv);
    int32_t *prompt = malloc(sizeof(int32_t) * n_prompt), seqs[2] = {0, 1}, toks[2];
    for (int s = 0; s < n_seq; s++) {
        for (int i = 0; i < n_prompt; i++) prompt[i] = (i * 29 + s * 7 + 3) % Vv;
        assert_int_equal(ks_prefill(c, s, prompt, n_prompt, logits + (size_t)s * Vv, NULL), KS_OK);
    }
    for (int t = 0; t < steps; t++) {
        if (t == offload_at) assert_int_equal(ks_context_offload_layer(c, 2, true), KS_OK);
        for (int s = 0; s < n_seq; s++) {
            const float *row = logits + (size_t)s * Vv;
            int32_t best = 0;
            for (int32_t j = 1; j < Vv; j++) best = row[j] > row[best] ? j : best;
            toks[s] = best;
        }
        if (ks_decode(c, seqs, toks, n_seq, logits) != KS_OK) fail_msg("decode: %s", ks_last_error());
        memcpy(out + (size_t)t * n_seq * Vv, logits, sizeof(float) * n_seq * Vv);
    }
    ks_stats st;
    ks_context_stats(c, &st);
    if (budget > 0 && budget < n_prompt && strcmp(policy, "dense")) assert_true(st.kv_entries_attended < st.kv_entries_total);
    free(logits);
    free(prompt);
    ks_context_destroy(c);
    return out;
}

static void test_full_budget_equals_dense(void **state) {
    (void)state;
    const int np = 120, steps = 5;
    size_t bytes = sizeof(float) * steps * g_llama->hp.n_vocab;
    char dir[400];
    snprintf(dir, sizeof dir, "%s/slow", g_tmp);
    mkdir(dir, 0700);
    for (int n_seq = 1; n_seq <= 2; n_seq++) {
        float *ref = run("dense", 0, 0, NULL, n_seq, np, steps, -1);
        for (int off = 0; off < 3; off++) {
            float *got = run("spec", np + steps + 1, off ? 2 : 0, off == 2 ? dir : NULL, n_seq, np, steps, -1);
            if (memcmp(got, ref, bytes * n_seq)) fail_msg("spec (batch %d, offload %d) differs from dense", n_seq, off);
            free(got);
        }
        g_spec_extra = ",weights=q8_0"; /* the head's projections requantised: full budget is still dense */
        float *q8w = run("spec", np + steps + 1, 0, NULL, n_seq, np, steps, -1);
        g_spec_extra = "";
        if (memcmp(q8w, ref, bytes * n_seq)) fail_msg("spec weights=q8_0 (batch %d) differs from dense", n_seq);
        free(q8w);
        /* K-quant projections (fc and q_proj in eight-row groups where the host packs, k_proj's 140 rows not) */
        static const char *const kq[] = {",weights=q6_k", ",weights=q5_k", ",weights=q4_k"};
        for (int i = 0; i < 3; i++) {
            g_spec_extra = kq[i];
            float *kqw = run("spec", np + steps + 1, 0, NULL, n_seq, np, steps, -1);
            g_spec_extra = "";
            if (memcmp(kqw, ref, bytes * n_seq)) fail_msg("spec %s (batch %d) differs from dense", kq[i] + 1, n_seq);
            free(kqw);
        }
        g_spec_extra = ",kcache=q8_0"; /* 8-bit head keys: full budget is still dense */
        float *q8k = run("spec", np + steps + 1, 0, NULL, n_seq, np, steps, -1);
        g_spec_extra = "";
        if (memcmp(q8k, ref, bytes * n_seq)) fail_msg("spec kcache=q8_0 (batch %d) differs from dense", n_seq);
        free(q8k);
        float *snap = run("snapkv+spec", np + steps + 1, 0, NULL, n_seq, np, steps, -1);
        assert_memory_equal(snap, ref, bytes * n_seq);
        free(snap);
        free(ref);
    }
}

static void test_elastic_loading_exact(void **state) {
    (void)state;
    const int np = 200, steps = 8;
    size_t bytes = sizeof(float) * steps * 2 * g_llama->hp.n_vocab;
    float *ref = run("spec", 48, 0, NULL, 2, np, steps, -1);
    float *mem = run("spec", 48, 3, NULL, 2, np, steps, -1);
    assert_memory_equal(mem, ref, bytes);
    char dir[400];
    snprintf(dir, sizeof dir, "%s/slow2", g_tmp);
    mkdir(dir, 0700);
    float *file = run("spec", 48, 2, dir, 2, np, steps, -1);
    assert_memory_equal(file, ref, bytes);
    free(ref);
    free(mem);
    free(file);
}

/* Spec selects the same entries in every layer, so the engine plans them
 * once a step (ks_policy_same_every_layer): the logits must equal those of
 * selecting and planning in every layer, resident and offloaded, batch 2. */
static void test_plan_once_per_step(void **state) {
    (void)state;
    const int np = 200, steps = 6;
    size_t bytes = sizeof(float) * steps * 2 * g_llama->hp.n_vocab;
    for (int off = 0; off <= 3; off += 3) {
        g_plan_per_layer = true;
        float *ref = run("spec", 48, off, NULL, 2, np, steps, -1);
        g_plan_per_layer = false;
        float *got = run("spec", 48, off, NULL, 2, np, steps, -1);
        if (memcmp(got, ref, bytes)) fail_msg("spec planned once a step differs from per layer (offload %d)", off);
        free(ref);
        free(got);
    }
}

static void test_offload_mid_sequence(void **state) {
    (void)state;
    const int np = 100, steps = 6;
    size_t bytes = sizeof(float) * steps * g_llama->hp.n_vocab;
    float *ref = run("dense", 0, 0, NULL, 1, np, steps, -1);
    float *got = run("dense", 0, 0, NULL, 1, np, steps, 3);
    assert_memory_equal(got, ref, bytes);
    float *sref = run("spec", 40, 0, NULL, 1, np, steps, -1);
    float *sgot = run("spec", 40, 0, NULL, 1, np, steps, 2);
    assert_memory_equal(sgot, sref, bytes);
    free(ref);
    free(got);
    free(sref);
    free(sgot);
}

static void test_bad_dlm(void **state) {
    (void)state;
    ks_context_params p = ks_context_default_params();
    p.n_ctx = 64;
    p.n_threads = 1;
    p.policy = "spec";
    ks_context *c = NULL;
    assert_int_equal(ks_context_create(g_llama, p, &c), KS_ERR_INVALID_ARG); /* no dlm= */
    assert_non_null(strstr(ks_last_error(), "dlm=DIR"));
    p.policy_args = "dlm=/nonexistent/dlm";
    assert_true(ks_context_create(g_llama, p, &c) != KS_OK);
    /* the MQA test DLM (1 KV head) does not fit tiny-llama (2) */
    char args[500];
    snprintf(args, sizeof args, "dlm=%s/dlm-tiny-mqa", g_tmp);
    p.policy_args = args;
    ks_status st = ks_context_create(g_llama, p, &c);
    assert_int_equal(st, KS_ERR_INVALID_ARG);
    assert_non_null(strstr(ks_last_error(), "KV heads"));
    snprintf(args, sizeof args, "dlm=%s,variant=odd", g_dlm_rand);
    assert_int_equal(ks_context_create(g_llama, p, &c), KS_ERR_INVALID_ARG);
    snprintf(args, sizeof args, "dlm=%s,weights=q4", g_dlm_rand);
    assert_int_equal(ks_context_create(g_llama, p, &c), KS_ERR_INVALID_ARG);
    assert_non_null(strstr(ks_last_error(), "weights=q4"));
    snprintf(args, sizeof args, "dlm=%s,kcache=q4", g_dlm_rand);
    assert_int_equal(ks_context_create(g_llama, p, &c), KS_ERR_INVALID_ARG);
    assert_non_null(strstr(ks_last_error(), "kcache=q4"));
    snprintf(args, sizeof args, "dlm=%s,weights=q8_0", g_dlm_rand);
    assert_int_equal(ks_context_create(g_llama, p, &c), KS_OK);
    ks_context_destroy(c);
    snprintf(args, sizeof args, "dlm=%s,weights=q4_k", g_dlm_rand);
    assert_int_equal(ks_context_create(g_llama, p, &c), KS_OK);
    ks_context_destroy(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_select_mha),
        cmocka_unit_test(test_select_gqa),
        cmocka_unit_test(test_select_mqa),
        cmocka_unit_test(test_simd_matches_scalar),
        cmocka_unit_test(test_score_kernels),
        cmocka_unit_test(test_score_kernel_names),
        cmocka_unit_test(test_full_budget_equals_dense),
        cmocka_unit_test(test_elastic_loading_exact),
        cmocka_unit_test(test_plan_once_per_step),
        cmocka_unit_test(test_offload_mid_sequence),
        cmocka_unit_test(test_bad_dlm),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
