/*
 * test_mla.c — multi-head latent attention (deepseek2) with sparse KV.
 *
 *  - The model binds: one KV head of kv_lora_rank + qk_rope = 576 dims (the
 *    latent head), per-head W_UK^T / W_UV views, a dense first layer, MoE
 *    layers with a shared expert.
 *  - Exactness: with a budget covering the context, every policy of the
 *    registry (and each per-layer selector behind an evictor), and spec with
 *    an EAGLE-3 head whose single KV head is the latent head, gives logits
 *    bit-identical to dense, batch 1 and 2, with a layer in the slow tier
 *    (memory and file) too.  Spec at a 6% budget runs and attends fewer
 *    entries.
 *  - Bytes: a sparse step reads only the selected latents, once each (the
 *    values come from the key rows): kv_bytes_read = attended x row bytes;
 *    the figures are printed.
 *  - Prefill in chunks and decode agree with one whole prefill (the rows'
 *    arithmetic does not depend on their batch).
 *  - The older converter's fused attn_kv_b loads (W_UK transposed at load)
 *    and gives the same logits.
 *  - Bad files: a missing latent tensor, a latent head of the wrong size,
 *    sigmoid gating, expert groups: a clear error, no crash.
 */
#define _GNU_SOURCE
#include "infer/infer.h"
#include "gguf/gguf.h"
#include "model/shapes.h"
#include "policies/registry.h"
#include "tensor/dtype.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The tiny MLA shape amplifies 4-bit rounding: against its f32 file the
 * last logits row of a 40-token prompt sits at nmse 0.088 in pure q8_0,
 * 0.69 in pure q4_k (tiny-deepseek2) and 0.61 in the q4_k_m mix
 * (tiny-deepseek2-odd; AVX2 host), so this bound only catches a mis-read
 * tensor (unrelated logits: nmse about 2).  The kernels' own accuracy is
 * test_quant_types.c's. */
#define MIX_NMSE_MAX 1.0

static char g_dir[256], g_path[300], g_dlm[300];
static ks_model *g_model;

enum { H = 256, DHD = 64, NQ = 4, V = 512 }; /* the draft: hidden = the target's n_embd, aidreams260K's vocabulary */

static void random_fill(float *x, size_t n, uint64_t seed, float scale) {
    ks_rng r = {seed};
    for (size_t i = 0; i < n; i++) x[i] = scale * (float)(ks_rng_uniform(&r) * 2 - 1);
}

/* A random EAGLE-3 head (as tests/test_spec.c writes them) with one KV head:
 * head-level selection maps draft KV heads to the target's one to one, and
 * the target's only KV head is the latent head. */
static int write_dlm(const char *dir) {
    mkdir(dir, 0700);
    char cfg[1024], p[400];
    snprintf(cfg, sizeof cfg,
             "{\"architectures\":[\"LlamaForCausalLMEagle3\"],\"hidden_size\":%d,\"intermediate_size\":64,"
             "\"num_attention_heads\":%d,\"num_key_value_heads\":1,\"head_dim\":%d,\"vocab_size\":%d,"
             "\"rms_norm_eps\":1e-5,\"rope_theta\":10000.0,\"max_position_embeddings\":4096,"
             "\"eagle_aux_hidden_state_layer_ids\":[0,1,2]}",
             H, NQ, DHD, V);
    snprintf(p, sizeof p, "%s/config.json", dir);
    if (ks_test_write_file(p, cfg, strlen(cfg)) != 0) return -1;
    float *embed = malloc(sizeof(float) * V * H), *fc = malloc(sizeof(float) * H * 3 * H);
    float *q = malloc(sizeof(float) * NQ * DHD * 2 * H), *k = malloc(sizeof(float) * DHD * 2 * H);
    static float ones[H];
    for (int i = 0; i < H; i++) ones[i] = 1.0f;
    random_fill(embed, (size_t)V * H, 1, 1.0f);
    random_fill(fc, (size_t)H * 3 * H, 2, 0.05f);
    random_fill(q, (size_t)NQ * DHD * 2 * H, 3, 0.1f);
    random_fill(k, (size_t)DHD * 2 * H, 4, 0.1f);
    ks_test_st_tensor t[] = {
        {"embed_tokens.weight", "F32", 2, {V, H}, embed, sizeof(float) * V * H},
        {"fc.weight", "F32", 2, {H, 3 * H}, fc, sizeof(float) * H * 3 * H},
        {"midlayer.hidden_norm.weight", "F32", 1, {H}, ones, sizeof ones},
        {"midlayer.input_layernorm.weight", "F32", 1, {H}, ones, sizeof ones},
        {"midlayer.self_attn.q_proj.weight", "F32", 2, {NQ * DHD, 2 * H}, q, sizeof(float) * NQ * DHD * 2 * H},
        {"midlayer.self_attn.k_proj.weight", "F32", 2, {DHD, 2 * H}, k, sizeof(float) * DHD * 2 * H},
    };
    size_t size = 0;
    uint8_t *img = ks_test_safetensors_build(t, 6, NULL, &size);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    int rc = ks_test_write_file(p, img, size);
    free(img);
    free(embed), free(fc), free(q), free(k);
    return rc;
}

static int setup(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/kvsieve-test-mla-XXXXXX");
    if (!mkdtemp(g_dir)) return -1;
    snprintf(g_path, sizeof g_path, "%s/tiny-deepseek2.gguf", g_dir);
    ks_gguf *vocab = NULL;
    if (ks_gguf_open(ks_test_fixture("models/aidreams260K.gguf"), &vocab) != KS_OK) return -1;
    ks_shape_gen_params gp = {.type = KS_DTYPE_F16, .vocab = vocab, .seed = 7, .n_ctx = 1024};
    ks_status st = ks_shape_generate(ks_shape_find("tiny-deepseek2"), &gp, g_path, NULL);
    ks_gguf_close(vocab);
    if (st != KS_OK || ks_model_load(g_path, ks_model_default_params(), &g_model) != KS_OK) return -1;
    snprintf(g_dlm, sizeof g_dlm, "%s/dlm", g_dir);
    return write_dlm(g_dlm);
}

static int teardown(void **state) {
    (void)state;
    ks_model_destroy(g_model);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_binds_latent_head(void **state) {
    (void)state;
    const ks_hparams *hp = &g_model->hp;
    assert_int_equal(hp->n_head_kv, 1);
    assert_int_equal(hp->head_dim, 576); /* kv_lora_rank 512 + qk_rope 64 */
    assert_int_equal(hp->kv_lora_rank, 512);
    assert_int_equal(hp->n_rot, 64);
    assert_int_equal(hp->qk_nope, 64);
    assert_int_equal(hp->v_head_mla, 64);
    assert_false(hp->rope_neox);
    const ks_layer *L0 = &g_model->layers[0], *L1 = &g_model->layers[1];
    assert_non_null(L0->mla);
    assert_null(L0->moe); /* leading dense layer */
    assert_non_null(L0->w_gate.data);
    assert_non_null(L1->moe);
    assert_non_null(L1->moe->sh_gate.data);
    assert_int_equal(L1->moe->sh_gate.rows, 256); /* one shared expert of 256 */
    assert_int_equal(L1->mla->k_b[3].rows, 512);
    assert_int_equal(L1->mla->k_b[3].cols, 64);
    assert_int_equal(L1->mla->v_b[3].rows, 64);
    assert_int_equal(L1->mla->v_b[3].cols, 512);
    /* llama.cpp's kq_scale with YaRN: (1 + 0.1 * 0.707 ln 40)^2 / sqrt(128), times sqrt(576) */
    double ms = 1.0 + 0.1 * 0.707 * log(40.0);
    double want = ms * ms / sqrt(128.0) * sqrt(576.0);
    assert_true(fabs(hp->mla_q_scale - want) < 1e-4 * want);
}

typedef struct {
    const char *policy, *args, *dir;
    int32_t budget, offload;
    int64_t *kv_held; /* optional: the context's KV bytes (fast + slow) at the end */
} run_cfg;

/* Prefill distinct prompts into n_seq sequences, then n_steps greedy decode
 * steps as one batch; every step's logits [n_steps][n_seq][V] (malloc'd);
 * *st (optional) receives the context's statistics. */
static int g_threads = 2;       /* run_decode's */
static bool g_split_wait = false; /* run_decode's: a split step's second thread always takes its half */

static float *run_decode(const run_cfg *cfg, int n_prompt, int n_steps, int n_seq, ks_stats *st) {
    ks_context_params p = ks_context_default_params();
    p.n_ctx = n_prompt + n_steps + 1;
    p.n_seq = n_seq;
    p.n_threads = g_threads;
    p.n_batch = 64;
    p.policy = cfg->policy;
    p.policy_args = cfg->args;
    p.budget = cfg->budget;
    p.page = 16;
    p.sink = 4;
    p.window = 8;
    p.kv_offload_layers = cfg->offload;
    p.kv_offload_dir = cfg->dir;
    ks_context *c = NULL;
    if (ks_context_create(g_model, p, &c) != KS_OK) fail_msg("%s: %s", cfg->policy, ks_last_error());
    c->split_wait = g_split_wait;
    const int32_t Vv = g_model->hp.n_vocab;
    float *out = malloc(sizeof(float) * (size_t)n_steps * n_seq * Vv), *logits = malloc(sizeof(float) * n_seq * Vv);
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)n_prompt), seqs[2] = {0, 1}, toks[2];
    for (int s = 0; s < n_seq; s++) {
        for (int i = 0; i < n_prompt; i++) prompt[i] = (int32_t)((i * 37 + s * 101 + 11) % Vv);
        assert_int_equal(ks_prefill(c, s, prompt, n_prompt, logits + (size_t)s * Vv, NULL), KS_OK);
    }
    for (int t = 0; t < n_steps; t++) {
        for (int s = 0; s < n_seq; s++) {
            const float *row = logits + (size_t)s * Vv;
            int32_t best = 0;
            for (int32_t j = 1; j < Vv; j++) best = row[j] > row[best] ? j : best;
            toks[s] = best;
        }
        if (ks_decode(c, seqs, toks, n_seq, logits) != KS_OK) fail_msg("decode: %s", ks_last_error());
        memcpy(out + (size_t)t * n_seq * Vv, logits, sizeof(float) * (size_t)n_seq * Vv);
    }
    if (st) ks_context_stats(c, st);
    if (cfg->kv_held) {
        /* a page is P latent rows and nothing else: no V half reserved */
        assert_int_equal(ks_kv_page_bytes(c->kv), (size_t)p.page * ks_kv_row_size(c->kv));
        assert_int_equal(ks_kv_page_v_off(c->kv), 0);
        int64_t f = 0, s = 0;
        ks_context_kv_bytes(c, &f, &s);
        *cfg->kv_held = f + s;
    }
    free(logits);
    free(prompt);
    ks_context_destroy(c);
    return out;
}

/* Every policy but dense and those needing a DLM, and each per-layer decode
 * selector behind an evictor (as tests/test_policy.c composes them). */
static int registry_specs(char (*out)[64], int cap) {
    const ks_policy_i *const *reg = ks_policy_list();
    const ks_policy_i *evictors[16];
    int n = 0, n_ev = 0, k = 0;
    for (int i = 0; reg[i]; i++)
        if (ks_policy_i_evicts(reg[i]) && n_ev < 16) evictors[n_ev++] = reg[i];
    for (int i = 0; reg[i] && n < cap; i++) {
        const ks_policy_i *p = reg[i];
        if (!strcmp(p->name, "dense") || ks_policy_i_needs_dlm(p)) continue;
        snprintf(out[n++], 64, "%s", p->name);
        if (p->select && !ks_policy_i_global(p) && !ks_policy_i_evicts(p) && n < cap && n_ev)
            snprintf(out[n++], 64, "%s+%s", evictors[k++ % n_ev]->name, p->name);
    }
    return n;
}

static void test_full_budget_equals_dense(void **state) {
    (void)state;
    const int np = 90, steps = 5;
    const size_t Vv = (size_t)g_model->hp.n_vocab;
    char spec_args[400];
    snprintf(spec_args, sizeof spec_args, "dlm=%s", g_dlm);
    for (int n_seq = 1; n_seq <= 2; n_seq++) {
        run_cfg dense = {.policy = "dense"};
        float *ref = run_decode(&dense, np, steps, n_seq, NULL);
        char names[64][64];
        int n_names = registry_specs(names, 64);
        assert_true(n_names > 3);
        for (int i = 0; i <= n_names; i++) {
            bool spec = i == n_names;
            for (int off = 0; off < 3; off++) {
                if (n_seq == 2 && off == 1 && !spec) continue; /* memory tier: batch 1 and spec cover it */
                run_cfg cfg = {.policy = spec ? "spec" : names[i], .args = spec ? spec_args : NULL,
                               .budget = np + steps + 1, .offload = off ? 1 : 0, .dir = off == 2 ? g_dir : NULL};
                float *got = run_decode(&cfg, np, steps, n_seq, NULL);
                if (memcmp(got, ref, sizeof(float) * steps * n_seq * Vv) != 0)
                    fail_msg("policy %s (batch %d, offload %d) differs from dense at a full budget", cfg.policy,
                             n_seq, off);
                free(got);
            }
        }
        free(ref);
    }
}

/* Sixteen query heads on the latent head (V2-Lite's count): on AVX-512 the
 * decode attention takes the wide kernel in two halves of eight heads, and a
 * one-row step on two threads gives the upper half to the second thread
 * (attend.c, attn_split; here the first waits for it: c->split_wait).  The logits must not depend on that: one thread
 * and two give the same bits, dense and every policy at a full budget agree
 * bit for bit (quest: published halves; h2o: weights, both halves on one
 * thread; spec), batch 1 and 2, and spec at a small budget runs. */
static void test_wide_group_split(void **state) {
    (void)state;
    char path[400];
    snprintf(path, sizeof path, "%s/tiny-deepseek2-wide.gguf", g_dir);
    ks_model *wide = NULL, *saved = g_model;
    assert_int_equal(ks_test_tiny_shape("tiny-deepseek2-wide", 0, 11, 1024, path, &wide), 0);
    assert_int_equal(wide->hp.n_head, 16);
    g_model = wide;
    const int np = 120, steps = 4;
    g_split_wait = true;
    const size_t Vv = (size_t)wide->hp.n_vocab;
    char spec_args[400];
    snprintf(spec_args, sizeof spec_args, "dlm=%s", g_dlm);
    for (int n_seq = 1; n_seq <= 2; n_seq++) {
        size_t bytes = sizeof(float) * steps * n_seq * Vv;
        run_cfg dense = {.policy = "dense"};
        g_threads = 1;
        float *one = run_decode(&dense, np, steps, n_seq, NULL);
        g_threads = 2;
        float *ref = run_decode(&dense, np, steps, n_seq, NULL);
        if (memcmp(one, ref, bytes) != 0) fail_msg("dense, batch %d: one thread and two differ", n_seq);
        const char *pols[] = {"quest", "h2o", "spec"};
        for (int i = 0; i < 3; i++) {
            bool spec = !strcmp(pols[i], "spec");
            run_cfg cfg = {.policy = pols[i], .args = spec ? spec_args : NULL, .budget = np + steps + 1};
            float *got = run_decode(&cfg, np, steps, n_seq, NULL);
            if (memcmp(got, ref, bytes) != 0)
                fail_msg("policy %s (batch %d) differs from dense at a full budget", pols[i], n_seq);
            free(got);
        }
        run_cfg small = {.policy = "spec", .args = spec_args, .budget = 48};
        ks_stats st;
        free(run_decode(&small, np, steps, n_seq, &st));
        free(one);
        free(ref);
    }
    g_split_wait = false;
    g_model = saved;
    ks_model_destroy(wide);
}

/* spec at a 6% budget on a 400-token context: it runs, selects, and every
 * attended latent is read once (values from the key rows) */
static void test_sparse_reads_selected_latents(void **state) {
    (void)state;
    const int np = 400, steps = 4;
    char spec_args[400];
    snprintf(spec_args, sizeof spec_args, "dlm=%s", g_dlm);
    const char *pols[] = {"spec", "quest"};
    for (int i = 0; i < 2; i++) {
        run_cfg cfg = {.policy = pols[i], .args = i == 0 ? spec_args : NULL, .budget = 24}; /* 6% of 400 */
        ks_stats st;
        float *got = run_decode(&cfg, np, steps, 1, &st);
        for (size_t j = 0; j < (size_t)steps * g_model->hp.n_vocab; j++) assert_true(isfinite(got[j]));
        free(got);
        int64_t held = 0;
        run_cfg dn = {.policy = "dense", .kv_held = &held};
        ks_stats sd;
        free(run_decode(&dn, np, steps, 1, &sd));
        const uint64_t row = 576 * 2; /* one f16 latent row: 512 latent + 64 rope key */
        /* the store holds one row per entry and layer, no V row (a k_only store) */
        assert_int_equal(held, (int64_t)g_model->hp.n_layer * (np + steps) * (int64_t)row);
        print_message("mla %s budget 24 of %d: decode attended %llu of %llu latents; KV bytes read %llu "
                      "(dense %llu), %llu bytes a latent\n",
                      pols[i], np, (unsigned long long)st.kv_entries_attended, (unsigned long long)st.kv_entries_total,
                      (unsigned long long)st.kv_bytes_read, (unsigned long long)sd.kv_bytes_read,
                      (unsigned long long)row);
        /* spec selects in every layer; quest keeps its first two layers dense by default */
        assert_true(st.kv_entries_attended < (i == 0 ? st.kv_entries_total / 10 : st.kv_entries_total));
        assert_true(st.kv_entries_total == sd.kv_entries_total);
        assert_true(sd.kv_entries_attended == sd.kv_entries_total);
        /* the store's bytes of decode and prefill: attended entries x one row, no V rows read */
        assert_true(st.kv_bytes_read < sd.kv_bytes_read);
        assert_true(sd.kv_bytes_read % row == 0 && st.kv_bytes_read % row == 0);
        assert_true(sd.kv_bytes_read - st.kv_bytes_read ==
                    (sd.kv_entries_attended - st.kv_entries_attended) * row);
    }
}

/* prefill in chunks of 7, then decode, equals one prefill of everything */
static void test_chunks_and_decode_agree(void **state) {
    (void)state;
    const int n = 40, Vv = g_model->hp.n_vocab;
    int32_t toks[40];
    for (int i = 0; i < n; i++) toks[i] = (i * 13 + 5) % Vv;
    ks_context_params p = ks_context_default_params();
    p.n_ctx = 64;
    p.n_threads = 2;
    ks_context *a = NULL, *b = NULL;
    assert_int_equal(ks_context_create(g_model, p, &a), KS_OK);
    assert_int_equal(ks_context_create(g_model, p, &b), KS_OK);
    float *la = malloc(sizeof(float) * Vv), *lb = malloc(sizeof(float) * Vv);
    assert_int_equal(ks_prefill(a, 0, toks, n, la, NULL), KS_OK);
    int done = 0;
    while (done < n - 1) {
        int m = n - 1 - done < 7 ? n - 1 - done : 7;
        assert_int_equal(ks_prefill(b, 0, toks + done, m, lb, NULL), KS_OK);
        done += m;
    }
    int32_t z = 0;
    assert_int_equal(ks_decode(b, &z, &toks[n - 1], 1, lb), KS_OK);
    double mx, e = ks_test_nmse(lb, la, (size_t)Vv, &mx);
    /* the AVX2 attention kernels sum prefill and decode in different orders
     * (nmse 1.4e-5 there, 1e-7 on AVX-512); test_infer.c allows 2e-4 */
    if (e > 1e-4) fail_msg("chunked prefill + decode vs one prefill: nmse %g (max %g)", e, mx);
    free(la), free(lb);
    ks_context_destroy(a);
    ks_context_destroy(b);
}

/* One decode step of one row runs all heads' absorption (W_UK_h^T) and value
 * projection (W_UV_h) in one pool run (mla.c, mla_heads_run); two rows take
 * the per-head loop.  Every output row is the same one-row kernel either way,
 * so two sequences decoded one at a time give the bits of the two decoded
 * together (the experts' one-row path is held the same way in test_moe). */
static void one_row_heads_case(ks_model *m, const char *what) {
    const int n = 24, Vv = m->hp.n_vocab;
    int32_t ta[24], tb[24];
    for (int i = 0; i < n; i++) ta[i] = (i * 13 + 5) % Vv, tb[i] = (i * 7 + 11) % Vv;
    ks_context_params p = ks_context_default_params();
    p.n_ctx = 64;
    p.n_seq = 2;
    p.n_threads = 2;
    ks_context *one = NULL, *two = NULL;
    assert_int_equal(ks_context_create(m, p, &one), KS_OK);
    assert_int_equal(ks_context_create(m, p, &two), KS_OK);
    float *l1 = malloc(sizeof(float) * 2 * Vv), *l2 = malloc(sizeof(float) * 2 * Vv);
    for (int k = 0; k < 2; k++) {
        ks_context *c = k ? two : one;
        assert_int_equal(ks_prefill(c, 0, ta, n - 1, l1, NULL), KS_OK);
        assert_int_equal(ks_prefill(c, 1, tb, n - 1, l1, NULL), KS_OK);
    }
    const int32_t seqs[2] = {0, 1}, toks[2] = {ta[n - 1], tb[n - 1]};
    assert_int_equal(ks_decode(one, &seqs[0], &toks[0], 1, l1), KS_OK);
    assert_int_equal(ks_decode(one, &seqs[1], &toks[1], 1, l1 + Vv), KS_OK);
    assert_int_equal(ks_decode(two, seqs, toks, 2, l2), KS_OK);
    for (int i = 0; i < 2 * Vv; i++)
        if (memcmp(&l1[i], &l2[i], sizeof(float)) != 0)
            fail_msg("%s: sequence %d logit %d: one row at a time %.9g, two rows %.9g", what, i / Vv, i % Vv, l1[i],
                     l2[i]);
    free(l1), free(l2);
    ks_context_destroy(one);
    ks_context_destroy(two);
}

static void test_one_row_heads_equal_loop(void **state) {
    (void)state;
    one_row_heads_case(g_model, "tiny-deepseek2 f16");
    /* the q4_k_m mix: attn_k_b Q5_0 (64 columns), attn_v_b Q4_K */
    char pq[320];
    snprintf(pq, sizeof pq, "%s/heads-q4_k_m.gguf", g_dir);
    ks_gguf *vocab = NULL;
    assert_int_equal(ks_gguf_open(ks_test_fixture("models/aidreams260K.gguf"), &vocab), KS_OK);
    ks_shape_gen_params gp = {.type = KS_DTYPE_Q4_K, .mix_k_m = true, .vocab = vocab, .seed = 7, .n_ctx = 1024};
    assert_int_equal(ks_shape_generate(ks_shape_find("tiny-deepseek2-odd"), &gp, pq, NULL), KS_OK);
    ks_gguf_close(vocab);
    ks_model *mq = NULL;
    assert_int_equal(ks_model_load(pq, ks_model_default_params(), &mq), KS_OK);
    assert_int_equal(mq->layers[1].mla->k_b[0].type, KS_DTYPE_Q5_0);
    one_row_heads_case(mq, "tiny-deepseek2-odd q4_k_m");
    ks_model_destroy(mq);
}

/* llama.cpp's Q4_K_M mix on a shape whose experts' rows are not whole K
 * blocks (experts of 352 as V2-Lite's 1408): gen-model writes the types
 * llama-quantize writes (attn_k_b of 64 columns and the down matrices in
 * Q5_0, Q8_0 where the mix gives Q6_K), and the engine binds, runs and
 * counts them.  The quantized logits stay near the f32 file's. */
static void test_k_m_mix_fallback_types(void **state) {
    (void)state;
    char pq[320], pf[320];
    snprintf(pq, sizeof pq, "%s/odd-q4_k_m.gguf", g_dir);
    snprintf(pf, sizeof pf, "%s/odd-f32.gguf", g_dir);
    ks_gguf *vocab = NULL;
    assert_int_equal(ks_gguf_open(ks_test_fixture("models/aidreams260K.gguf"), &vocab), KS_OK);
    ks_shape_gen_params gp = {.type = KS_DTYPE_Q4_K, .mix_k_m = true, .vocab = vocab, .seed = 7, .n_ctx = 1024};
    const ks_model_shape *shape = ks_shape_find("tiny-deepseek2-odd");
    assert_non_null(shape);
    assert_int_equal(ks_shape_generate(shape, &gp, pq, NULL), KS_OK);
    gp.type = KS_DTYPE_F32;
    gp.mix_k_m = false;
    assert_int_equal(ks_shape_generate(shape, &gp, pf, NULL), KS_OK);
    ks_gguf_close(vocab);
    /* 3 layers: layer 2 is the mix's "more bits" layer (the last eighth) */
    static const struct {
        const char *name;
        ks_dtype type;
    } want[] = {
        {"blk.1.attn_k_b.weight", KS_DTYPE_Q5_0},        {"blk.1.attn_v_b.weight", KS_DTYPE_Q4_K},
        {"blk.1.ffn_gate_exps.weight", KS_DTYPE_Q4_K},   {"blk.1.ffn_down_exps.weight", KS_DTYPE_Q5_0},
        {"blk.1.ffn_down_shexp.weight", KS_DTYPE_Q5_0},  {"blk.2.ffn_down_exps.weight", KS_DTYPE_Q8_0},
        {"blk.2.ffn_down_shexp.weight", KS_DTYPE_Q8_0},  {"blk.0.ffn_down.weight", KS_DTYPE_Q4_K},
        {"output.weight", KS_DTYPE_Q6_K},
    };
    ks_gguf *g = NULL;
    assert_int_equal(ks_gguf_open(pq, &g), KS_OK);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const ks_gguf_tensor *t = ks_gguf_find_tensor(g, want[i].name);
        assert_non_null(t);
        if (t->type != want[i].type)
            fail_msg("%s: %s, want %s", want[i].name, ks_dtype_name(t->type), ks_dtype_name(want[i].type));
    }
    ks_gguf_close(g);
    ks_model *mq = NULL, *mf = NULL;
    assert_int_equal(ks_model_load(pq, ks_model_default_params(), &mq), KS_OK);
    assert_int_equal(ks_model_load(pf, ks_model_default_params(), &mf), KS_OK);
    const ks_moe_layer *L = mq->layers[2].moe;
    assert_non_null(L);
    assert_int_equal(L->down[5].type, KS_DTYPE_Q8_0);
    assert_int_equal(L->down[5].cols, 352);
    assert_int_equal(L->expert_bytes,
                     ks_weight_bytes(&L->gate[0]) + ks_weight_bytes(&L->up[0]) + ks_weight_bytes(&L->down[0]));
    assert_int_equal(mq->layers[1].mla->k_b[0].type, KS_DTYPE_Q5_0);
    const int n = 40, Vv = mq->hp.n_vocab;
    int32_t toks[40];
    for (int i = 0; i < n; i++) toks[i] = (i * 13 + 5) % Vv;
    ks_context_params p = ks_context_default_params();
    p.n_ctx = 64;
    p.n_threads = 2;
    ks_context *cq = NULL, *cf = NULL, *cd = NULL;
    assert_int_equal(ks_context_create(mq, p, &cq), KS_OK);
    assert_int_equal(ks_context_create(mf, p, &cf), KS_OK);
    assert_int_equal(ks_context_create(mq, p, &cd), KS_OK);
    float *lq = malloc(sizeof(float) * Vv), *lf = malloc(sizeof(float) * Vv), *ld = malloc(sizeof(float) * Vv);
    assert_int_equal(ks_prefill(cq, 0, toks, n, lq, NULL), KS_OK);
    assert_int_equal(ks_prefill(cf, 0, toks, n, lf, NULL), KS_OK);
    double mx, e = ks_test_nmse(lq, lf, (size_t)Vv, &mx);
    printf("tiny-deepseek2-odd q4_k_m mix against f32: nmse %.3g (max abs %.3g)\n", e, mx);
    if (e > MIX_NMSE_MAX) fail_msg("q4_k_m mix against f32: nmse %g", e);
    /* prefill of n - 1 then one decode step: the Q5_0 / Q8_0 expert GEMV path */
    int32_t z = 0;
    assert_int_equal(ks_prefill(cd, 0, toks, n - 1, ld, NULL), KS_OK);
    assert_int_equal(ks_decode(cd, &z, &toks[n - 1], 1, ld), KS_OK);
    e = ks_test_nmse(ld, lq, (size_t)Vv, &mx);
    /* A random tiny MoE routes chaotically: the decode and prefill attention
     * kernels sum in different orders, and where a router decision is a
     * near-tie that flips one expert of the last token the logits move by
     * nmse ~0.04 (seen at AVX2; scalar agrees to 1e-6).  A misread fallback
     * type moves them by the order of the signal (nmse ~1), which this still
     * catches; the expert products themselves are held bit for bit in
     * test_moe (Q4_K gate/up with Q5_0 / Q8_0 down of 352, one row and many). */
    if (e > 0.1) fail_msg("q4_k_m mix: prefill + decode vs one prefill: nmse %g (max %g)", e, mx);
    free(lq), free(lf), free(ld);
    ks_context_destroy(cq);
    ks_context_destroy(cf);
    ks_context_destroy(cd);
    ks_model_destroy(mq);
    ks_model_destroy(mf);
}

/* The older converter's form of the same model: per layer one fused
 * attn_kv_b [n_head * (qk_nope + v_head)][kv_lora_rank] (f32, from the
 * f16 k_b / v_b, so the values are the same), no key_length_mla, and the
 * decompressed heads' key/value lengths and KV head count.  It loads and
 * gives the same logits up to the products' rounding (f32 weights against
 * f16 ones). */
static void test_fused_kv_b_form(void **state) {
    (void)state;
    const ks_hparams *hp = &g_model->hp;
    const int nh = hp->n_head, R = hp->kv_lora_rank, nope = hp->qk_nope, Vh = hp->v_head_mla;
    char path[400];
    snprintf(path, sizeof path, "%s/fused.gguf", g_dir);
    ks_gguf *g = NULL;
    assert_int_equal(ks_gguf_open(g_path, &g), KS_OK);
    ks_gguf_writer *w = NULL;
    assert_int_equal(ks_gguf_writer_create(&w), KS_OK);
    const char *skip[] = {"deepseek2.attention.key_length_mla", "deepseek2.attention.value_length_mla",
                          "deepseek2.attention.key_length", "deepseek2.attention.value_length",
                          "deepseek2.attention.head_count_kv"};
    for (int64_t i = 0; i < ks_gguf_n_kv(g); i++) {
        const ks_gguf_kv *kv = ks_gguf_kv_at(g, i);
        bool drop = false;
        for (size_t k = 0; k < sizeof skip / sizeof skip[0]; k++) drop |= ks_gguf_str_eq(kv->key, skip[k]);
        if (!drop) ks_gguf_writer_copy_kv(w, kv);
    }
    ks_gguf_writer_set_u32(w, "deepseek2.attention.key_length", (uint32_t)(nope + hp->n_rot));
    ks_gguf_writer_set_u32(w, "deepseek2.attention.value_length", (uint32_t)Vh);
    ks_gguf_writer_set_u32(w, "deepseek2.attention.head_count_kv", (uint32_t)nh);
    float *kvb[8] = {0};
    for (int64_t i = 0; i < ks_gguf_n_tensors(g); i++) {
        const ks_gguf_tensor *t = ks_gguf_tensor_at(g, i);
        char name[96];
        int il = -1;
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.data);
        if (strstr(name, ".attn_v_b.")) continue;
        if (strstr(name, ".attn_k_b.") && sscanf(name, "blk.%d.", &il) == 1) {
            const ks_gguf_tensor *tk = t;
            char vn[96];
            snprintf(vn, sizeof vn, "blk.%d.attn_v_b.weight", il);
            const ks_gguf_tensor *tv = ks_gguf_find_tensor(g, vn);
            assert_non_null(tv);
            float *b = kvb[il] = malloc(sizeof(float) * (size_t)nh * (nope + Vh) * R);
            float *row = malloc(sizeof(float) * R);
            for (int h = 0; h < nh; h++) {
                for (int r = 0; r < R; r++) { /* k_b[h] is [R][nope]: W_UK_h^T */
                    ks_dequantize_row(tk->type, (const uint8_t *)tk->data + ((size_t)h * R + r) * ks_dtype_row_bytes(tk->type, nope), row, nope);
                    for (int d = 0; d < nope; d++) b[((size_t)h * (nope + Vh) + d) * R + r] = row[d];
                }
                for (int v = 0; v < Vh; v++) /* v_b[h] is [Vh][R]: W_UV_h */
                    ks_dequantize_row(tv->type, (const uint8_t *)tv->data + ((size_t)h * Vh + v) * ks_dtype_row_bytes(tv->type, R),
                                      b + ((size_t)h * (nope + Vh) + nope + v) * R, R);
            }
            free(row);
            snprintf(name, sizeof name, "blk.%d.attn_kv_b.weight", il);
            int64_t ne[4] = {R, (int64_t)nh * (nope + Vh), 1, 1};
            assert_int_equal(ks_gguf_writer_add_tensor(w, name, KS_DTYPE_F32, 2, ne, b, NULL, NULL), KS_OK);
            continue;
        }
        int64_t ne[4] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
        assert_int_equal(ks_gguf_writer_add_tensor(w, name, t->type, t->n_dims, ne, t->data, NULL, NULL), KS_OK);
    }
    assert_int_equal(ks_gguf_writer_write(w, path), KS_OK);
    ks_gguf_writer_destroy(w);
    ks_gguf_close(g);
    for (int i = 0; i < 8; i++) free(kvb[i]);
    ks_model *m = NULL;
    if (ks_model_load(path, ks_model_default_params(), &m) != KS_OK) fail_msg("fused form: %s", ks_last_error());
    assert_true(m->hp.mla_fused_kv_b);
    assert_int_equal(m->hp.head_dim, 576);
    assert_int_equal(m->hp.n_head_kv, 1);
    assert_int_equal(m->hp.qk_nope, nope);
    assert_int_equal(m->hp.v_head_mla, Vh);
    const int n = 30, Vv = hp->n_vocab;
    int32_t toks[30];
    for (int i = 0; i < n; i++) toks[i] = (i * 17 + 2) % Vv;
    float *la = malloc(sizeof(float) * Vv), *lb = malloc(sizeof(float) * Vv);
    ks_model *ms[2] = {g_model, m};
    float *ls[2] = {la, lb};
    for (int k = 0; k < 2; k++) {
        ks_context_params p = ks_context_default_params();
        p.n_ctx = 64;
        p.n_threads = 2;
        ks_context *c = NULL;
        assert_int_equal(ks_context_create(ms[k], p, &c), KS_OK);
        assert_int_equal(ks_prefill(c, 0, toks, n, ls[k], NULL), KS_OK);
        ks_context_destroy(c);
    }
    double mx, e = ks_test_nmse(lb, la, (size_t)Vv, &mx);
    print_message("fused attn_kv_b form vs attn_k_b / attn_v_b: nmse %g, max abs %g\n", e, mx);
    if (e > 1e-4) fail_msg("fused form differs: nmse %g (max %g)", e, mx);
    free(la), free(lb);
    ks_model_destroy(m);
    unlink(path);
}

/* a decode step allocates nothing (the house rule tests/test_step_alloc.c
 * checks on other models): the latent path uses the context's buffers */
static void test_step_allocates_nothing(void **state) {
    (void)state;
    const char *pols[] = {"dense", "quest", "h2o"};
    for (int i = 0; i < 3; i++) {
        ks_context_params p = ks_context_default_params();
        p.n_ctx = 128;
        p.n_threads = 2;
        p.policy = pols[i];
        p.budget = 32;
        p.page = 16;
        ks_context *c = NULL;
        assert_int_equal(ks_context_create(g_model, p, &c), KS_OK);
        int32_t prompt[60], z = 0, tok = 7;
        for (int j = 0; j < 60; j++) prompt[j] = (j * 11 + 3) % g_model->hp.n_vocab;
        float *logits = malloc(sizeof(float) * g_model->hp.n_vocab);
        assert_int_equal(ks_prefill(c, 0, prompt, 60, logits, NULL), KS_OK);
        uint64_t before = 0;
        for (int t = 0; t < 5; t++) {
            if (t == 2) before = ks_alloc_count();
            assert_int_equal(ks_decode(c, &z, &tok, 1, logits), KS_OK);
        }
        uint64_t n = ks_alloc_count() - before;
        if (n) fail_msg("%s: %llu allocations in 3 decode steps", pols[i], (unsigned long long)n);
        free(logits);
        ks_context_destroy(c);
    }
}

/* ----------------------------------------------------------- bad files -- */
/* Copy g_path to path without tensor `drop` (or NULL), with tensor `rename`
 * (or NULL) renamed to `to`, and the u32 key `key` (or NULL) set to val. */
static int rewrite(const char *path, const char *drop, const char *rename, const char *to, const char *key,
                   uint32_t val) {
    ks_gguf *g = NULL;
    if (ks_gguf_open(g_path, &g) != KS_OK) return -1;
    ks_gguf_writer *w = NULL;
    if (ks_gguf_writer_create(&w) != KS_OK) return -1;
    for (int64_t i = 0; i < ks_gguf_n_kv(g); i++) {
        const ks_gguf_kv *kv = ks_gguf_kv_at(g, i);
        if (key && ks_gguf_str_eq(kv->key, key)) continue;
        ks_gguf_writer_copy_kv(w, kv);
    }
    if (key) ks_gguf_writer_set_u32(w, key, val);
    for (int64_t i = 0; i < ks_gguf_n_tensors(g); i++) {
        const ks_gguf_tensor *t = ks_gguf_tensor_at(g, i);
        char name[96];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.data);
        if (drop && !strcmp(name, drop)) continue;
        int64_t ne[4] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
        const char *nm = rename && !strcmp(name, rename) ? to : name;
        if (ks_gguf_writer_add_tensor(w, nm, t->type, t->n_dims, ne, t->data, NULL, NULL) != KS_OK) return -1;
    }
    ks_status st = ks_gguf_writer_write(w, path);
    ks_gguf_writer_destroy(w);
    ks_gguf_close(g);
    return st == KS_OK ? 0 : -1;
}

static void test_bad_files(void **state) {
    (void)state;
    char path[400];
    snprintf(path, sizeof path, "%s/bad.gguf", g_dir);
    assert_int_equal(rewrite(path, "blk.1.attn_kv_a_mqa.weight", NULL, NULL, NULL, 0), 0);
    ks_test_expect_load_refused(path, "tensor 'blk.1.attn_kv_a_mqa.weight' is missing");
    assert_int_equal(rewrite(path, "blk.2.attn_v_b.weight", NULL, NULL, NULL, 0), 0);
    ks_test_expect_load_refused(path, "tensor 'blk.2.attn_v_b.weight' is missing");
    assert_int_equal(rewrite(path, "blk.1.ffn_up_shexp.weight", NULL, NULL, NULL, 0), 0);
    ks_test_expect_load_refused(path, "blk.1.ffn_up_shexp.weight");
    /* wrong latent dims: a latent head that is not kv_lora_rank + rope, a rank the tensors do not have */
    assert_int_equal(rewrite(path, NULL, NULL, NULL, "deepseek2.attention.key_length", 560), 0);
    ks_test_expect_load_refused(path, "kv_lora_rank 512 + rope 64 = 576");
    assert_int_equal(rewrite(path, NULL, NULL, NULL, "deepseek2.attention.kv_lora_rank", 256), 0);
    ks_test_expect_load_refused(path, "kv_lora_rank 256");
    assert_int_equal(rewrite(path, NULL, NULL, NULL, "deepseek2.attention.head_count_kv", 4), 0);
    ks_test_expect_load_refused(path, "one KV head");
    assert_int_equal(rewrite(path, NULL, NULL, NULL, "deepseek2.expert_gating_func", 2), 0);
    ks_test_expect_load_refused(path, "only softmax gating");
    assert_int_equal(rewrite(path, NULL, NULL, NULL, "deepseek2.expert_group_count", 4), 0);
    ks_test_expect_load_refused(path, "group-limited routing");
}

int main(void) {
    /* f32 prefill attention: on AVX-512 BF16 hosts the default prefill
     * kernel rounds to bf16 (tested in test_infer.c and the goldens), which
     * the chunked-prefill comparison would otherwise measure */
    setenv("KS_ATTN", "f32", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_binds_latent_head),
        cmocka_unit_test(test_full_budget_equals_dense),
        cmocka_unit_test(test_wide_group_split),
        cmocka_unit_test(test_sparse_reads_selected_latents),
        cmocka_unit_test(test_chunks_and_decode_agree),
        cmocka_unit_test(test_one_row_heads_equal_loop),
        cmocka_unit_test(test_step_allocates_nothing),
        cmocka_unit_test(test_fused_kv_b_form),
        cmocka_unit_test(test_k_m_mix_fallback_types),
        cmocka_unit_test(test_bad_files),
    };
    return cmocka_run_group_tests_name("mla", tests, setup, teardown);
}
