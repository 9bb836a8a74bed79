/*
 * test_prefix.c — the prefix cache (src/prefix/prefix_*.c).
 *
 * 1. Exactness over the registry: for every policy (and each per-layer
 *    selector behind an evictor, as test_policy.c composes them), with a
 *    budget that binds, a follow-up prompt sharing a long prefix with an
 *    earlier one gives the same prompt logits and the same greedy decode
 *    logits, bit for bit, as the uncached run: from RAM, from the
 *    directory (a new cache object on the same directory: a restart, or
 *    another replica; spec's per-token state comes back from its own
 *    files), and with a page-unaligned hit.  Shareable policies
 *    restore > 0 tokens; the others restore none.  spec runs with a random
 *    draft model written here.
 * 2. Files are untrusted: truncated, bit-flipped and foreign-model block
 *    files are skipped and counted, and the answer stays the uncached one;
 *    the record parser refuses each corruption on its own.
 * 3. The one-file prompt cache of `kvsieve run --prompt-cache`, and its
 *    checkpoints (appends) surviving a kill mid-prefill, bit for bit.
 * 4. Shared pages: a RAM hit maps the cached pages (no copy) for every
 *    policy that does not evict; three sequences of one context on one
 *    document (two mapping the first's pages while it decodes, one with a
 *    different question after the shared prefix, evictors cutting their
 *    own copies) each give the logits of its uncached run bit for bit; the
 *    memory plan counts the shared pages once (a cap at which counting
 *    them per sequence would offload layers keeps every layer fast), and
 *    a cache that outlives its context keeps its blocks.
 */
#define _GNU_SOURCE
#include "infer/infer.h"
#include "prefix/prefix.h"
#include "gguf/gguf.h"
#include "model/shapes.h"
#include "policies/registry.h"
#include "testutil.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { H = 256, DHD = 70, NQ = 4, V = 512, NCTX = 400, PAGE = 8, STEPS = 4 };

static char g_tmp[256], g_dlm[400];
static ks_model *g_model, *g_other;

static ks_model *gen_target(int seed, const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s.gguf", g_tmp, name);
    ks_gguf *vocab = NULL;
    if (ks_gguf_open(ks_test_fixture("models/aidreams260K.gguf"), &vocab) != KS_OK) return NULL;
    ks_shape_gen_params gp = {.type = KS_DTYPE_F16, .vocab = vocab, .seed = (uint64_t)seed, .n_layer = 3, .n_ctx = 1024};
    ks_status st = ks_shape_generate(ks_shape_find("tiny-llama"), &gp, path, NULL);
    ks_gguf_close(vocab);
    ks_model *m = NULL;
    if (st != KS_OK || ks_model_load(path, ks_model_default_params(), &m) != KS_OK) return NULL;
    return m;
}

static void random_fill(float *x, size_t n, uint64_t seed, float scale) {
    ks_rng r = {seed};
    for (size_t i = 0; i < n; i++) x[i] = scale * (float)(ks_rng_uniform(&r) * 2 - 1);
}

/* A random EAGLE-3 head for tiny-llama (fused states of layers 0, 1, 2). */
static int write_dlm(const char *dir) {
    mkdir(dir, 0700);
    char cfg[1024], p[600];
    snprintf(cfg, sizeof cfg,
             "{\"architectures\":[\"LlamaForCausalLMEagle3\"],\"hidden_size\":%d,\"intermediate_size\":64,"
             "\"num_attention_heads\":%d,\"num_key_value_heads\":2,\"head_dim\":%d,\"vocab_size\":%d,"
             "\"rms_norm_eps\":1e-5,\"rope_theta\":10000.0,\"max_position_embeddings\":4096,"
             "\"eagle_aux_hidden_state_layer_ids\":[0,1,2]}",
             H, NQ, DHD, V);
    snprintf(p, sizeof p, "%s/config.json", dir);
    if (ks_test_write_file(p, cfg, strlen(cfg))) return -1;
    static float ones[H];
    for (int i = 0; i < H; i++) ones[i] = 1.0f;
    float *embed = malloc(sizeof(float) * V * H), *fc = malloc(sizeof(float) * H * 3 * H);
    float *q = malloc(sizeof(float) * NQ * DHD * 2 * H), *k = malloc(sizeof(float) * 2 * DHD * 2 * H);
    random_fill(embed, (size_t)V * H, 1, 1.0f);
    random_fill(fc, (size_t)H * 3 * H, 2, 0.05f);
    random_fill(q, (size_t)NQ * DHD * 2 * H, 3, 0.1f);
    random_fill(k, (size_t)2 * DHD * 2 * H, 4, 0.1f);
    ks_test_st_tensor t[] = {
        {"embed_tokens.weight", "F32", 2, {V, H}, embed, sizeof(float) * V * H},
        {"fc.weight", "F32", 2, {H, 3 * H}, fc, sizeof(float) * H * 3 * H},
        {"midlayer.hidden_norm.weight", "F32", 1, {H}, ones, sizeof ones},
        {"midlayer.input_layernorm.weight", "F32", 1, {H}, ones, sizeof ones},
        {"midlayer.self_attn.q_proj.weight", "F32", 2, {NQ * DHD, 2 * H}, q, sizeof(float) * NQ * DHD * 2 * H},
        {"midlayer.self_attn.k_proj.weight", "F32", 2, {2 * DHD, 2 * H}, k, sizeof(float) * 2 * DHD * 2 * H},
    };
    size_t size = 0;
    uint8_t *img = ks_test_safetensors_build(t, 6, NULL, &size);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    int rc = ks_test_write_file(p, img, size);
    free(img);
    free(embed);
    free(fc);
    free(q);
    free(k);
    return rc;
}

static int setup(void **state) {
    (void)state;
    snprintf(g_tmp, sizeof g_tmp, "/tmp/kvsieve-test-prefix-XXXXXX");
    if (!mkdtemp(g_tmp)) return -1;
    g_model = gen_target(11, "target");
    g_other = gen_target(12, "other"); /* same shape, other weights: a foreign model */
    snprintf(g_dlm, sizeof g_dlm, "%s/dlm", g_tmp);
    return g_model && g_other && write_dlm(g_dlm) == 0 ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    ks_model_destroy(g_model);
    ks_model_destroy(g_other);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
    return system(cmd) == 0 ? 0 : -1;
}

static void fresh_dir(char *out, size_t cap, const char *name) {
    snprintf(out, cap, "%s/%s", g_tmp, name);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", out);
    assert_int_equal(system(cmd), 0);
}

/* The document both prompts share, then each one's own question. */
static void make_prompt(int32_t *out, int n_doc, int n_q, int which) {
    for (int i = 0; i < n_doc; i++) out[i] = (i * 37 + 11) % V;
    for (int i = 0; i < n_q; i++) out[n_doc + i] = (i * 13 + which * 101 + 7) % V;
}

static int32_t g_offload;  /* layers in the slow tier of the contexts make_ctx makes */
static int32_t g_nseq = 1; /* their sequences */
static double g_memcap;    /* their memory cap (0: none) */
static ks_kv_type g_kvtype; /* their KV element type */

static ks_context *make_ctx(ks_model *m, const char *policy) {
    ks_context_params p = ks_context_default_params();
    p.kv_offload_layers = g_offload;
    p.n_seq = g_nseq;
    p.mem_cap = g_memcap;
    p.kv_type = g_kvtype;
    p.n_ctx = NCTX;
    p.n_threads = 2;
    p.n_batch = 16;
    p.policy = policy;
    p.budget = 40;
    p.page = PAGE;
    p.sink = 4;
    p.window = 8;
    char args[600];
    snprintf(args, sizeof args, "dlm=%s", g_dlm);
    p.policy_args = strstr(policy, "spec") ? args : NULL;
    ks_context *c = NULL;
    if (ks_context_create(m, p, &c) != KS_OK) fail_msg("context %s: %s", policy, ks_last_error());
    return c;
}

/* Prefill prompt (through pc when given) and decode STEPS greedy tokens:
 * the prompt's logits then each step's, [1 + STEPS][V]. */
static float *run(ks_context *c, ks_prefix_cache *pc, const int32_t *prompt, int n, int32_t *n_cached) {
    int32_t Vv = g_model->hp.n_vocab;
    float *out = malloc(sizeof(float) * (size_t)(1 + STEPS) * Vv);
    ks_seq_reset(c, 0);
    if (pc) {
        if (ks_prefill_cached(c, pc, 0, prompt, n, out, n_cached) != KS_OK) fail_msg("prefill: %s", ks_last_error());
    } else {
        assert_int_equal(ks_prefill(c, 0, prompt, n, out, NULL), KS_OK);
    }
    for (int t = 0; t < STEPS; t++) {
        const float *row = out + (size_t)t * Vv;
        int32_t best = 0, seq = 0;
        for (int32_t j = 1; j < Vv; j++) best = row[j] > row[best] ? j : best;
        if (ks_decode(c, &seq, &best, 1, out + (size_t)(t + 1) * Vv) != KS_OK) fail_msg("decode: %s", ks_last_error());
    }
    return out;
}

static int policy_specs(char (*out)[64], int cap) {
    const ks_policy_i *const *reg = ks_policy_list();
    const ks_policy_i *evictors[16];
    int n = 0, n_ev = 0, k = 0;
    for (int i = 0; reg[i]; i++)
        if (ks_policy_i_evicts(reg[i]) && n_ev < 16) evictors[n_ev++] = reg[i];
    for (int i = 0; reg[i] && n < cap; i++) {
        const ks_policy_i *p = reg[i];
        snprintf(out[n++], 64, "%s", p->name);
        if (p->select && !ks_policy_i_global(p) && !ks_policy_i_evicts(p) && n < cap)
            snprintf(out[n++], 64, "%s+%s", evictors[k++ % n_ev]->name, p->name);
    }
    return n;
}

static bool spec_shareable(const char *spec) {
    char buf[64];
    snprintf(buf, sizeof buf, "%s", spec);
    char *save = NULL;
    for (char *t = strtok_r(buf, "+", &save); t; t = strtok_r(NULL, "+", &save)) {
        const ks_policy_i *p = ks_policy_find(t);
        if (!p || !p->prefix || ks_policy_i_obs_window(p) < 0) return false;
    }
    return true;
}

static bool spec_evicts(const char *policy) {
    ks_policy_spec spec;
    if (ks_policy_spec_parse(policy, NULL, 0, 0, 0, -1, &spec) != KS_OK) return false;
    for (int i = 0; i < spec.n_parts; i++)
        if (ks_policy_i_evicts(ks_policy_spec_part(&spec, i))) return true;
    return false;
}

static void check_policy(const char *policy, int n_doc, int n_q) {
    int n = n_doc + n_q;
    size_t bytes = sizeof(float) * (size_t)(1 + STEPS) * g_model->hp.n_vocab;
    int32_t *first = malloc(sizeof(int32_t) * n), *follow = malloc(sizeof(int32_t) * n);
    make_prompt(first, n_doc, n_q, 1);
    make_prompt(follow, n_doc, n_q, 2);
    ks_context *c = make_ctx(g_model, policy);
    float *ref = run(c, NULL, follow, n, NULL);
    char dir[400];
    fresh_dir(dir, sizeof dir, "exact");
    ks_prefix_cache_params pp = ks_prefix_cache_default_params();
    pp.dir = dir;
    ks_prefix_cache *pc = NULL;
    assert_int_equal(ks_prefix_cache_create(g_model, &pp, &pc), KS_OK);
    int32_t hit = -1;
    float *got = run(c, pc, first, n, &hit);
    assert_int_equal(hit, 0);
    free(got);
    bool share = spec_shareable(policy);
    /* RAM hit */
    got = run(c, pc, follow, n, &hit);
    if (share != (hit > 0)) fail_msg("policy %s restored %d tokens (shareable %d)", policy, hit, share);
    if (memcmp(got, ref, bytes)) fail_msg("policy %s: a RAM hit of %d tokens changed the logits", policy, hit);
    free(got);
    ks_prefix_cache_stats st;
    ks_prefix_cache_get_stats(pc, &st);
    /* the hit mapped the cached pages (a policy that evicts cut copies of its own; a
     * block with a layer in the slow tier is kept as bytes) */
    if (share && hit >= PAGE && !spec_evicts(policy) && !g_offload && !st.ram_shared_bytes)
        fail_msg("policy %s: a RAM hit of %d tokens shares no page with the cache", policy, hit);
    assert_true(st.hit_tokens == (uint64_t)hit);
    ks_prefix_cache_destroy(pc); /* flushes the writes */
    /* a new cache object on the same directory: a restart, or another replica */
    assert_int_equal(ks_prefix_cache_create(g_model, &pp, &pc), KS_OK);
    int32_t hit2 = -1;
    got = run(c, pc, follow, n, &hit2);
    ks_prefix_cache_get_stats(pc, &st);
    /* the follow-up's own blocks were taken too: now it hits all but its last rows */
    assert_true(hit2 >= hit);
    if (share) assert_true(st.loads > 0);
    assert_int_equal(st.skipped_corrupt, 0);
    if (memcmp(got, ref, bytes)) fail_msg("policy %s: a disk hit of %d tokens changed the logits", policy, hit2);
    free(got);
    ks_prefix_cache_destroy(pc);
    ks_context_destroy(c);
    free(ref);
    free(first);
    free(follow);
}

static void test_registry_exact(void **state) {
    (void)state;
    char names[64][64];
    int n = policy_specs(names, 64);
    for (int i = 0; i < n; i++) {
        check_policy(names[i], 120, 75);  /* the hit ends on a page */
        check_policy(names[i], 123, 70);  /* and inside one */
    }
}

/* Greedy-decode STEPS tokens of seq from the prompt logits in out[0] into out[1..]. */
static void decode_step(ks_context *c, int32_t seq, float *out, int t) {
    int32_t Vv = g_model->hp.n_vocab, best = 0;
    const float *row = out + (size_t)t * Vv;
    for (int32_t j = 1; j < Vv; j++) best = row[j] > row[best] ? j : best;
    if (ks_decode(c, &seq, &best, 1, out + (size_t)(t + 1) * Vv) != KS_OK) fail_msg("decode: %s", ks_last_error());
}

/* Three sequences of one context on one document: seq 0 prefills it (the
 * cache pins its pages), seq 1 (another question) and seq 2 (the same
 * prompt) map them while seq 0 is alive; all three decode in turns.  Each
 * equals its uncached run; non-evicting policies share the prefix's pages,
 * and the plan counts them once. */
static void check_shared(const char *policy, int n_doc, int n_q) {
    int n = n_doc + n_q;
    int32_t Vv = g_model->hp.n_vocab;
    size_t bytes = sizeof(float) * (size_t)(1 + STEPS) * Vv;
    int32_t *first = malloc(sizeof(int32_t) * n), *follow = malloc(sizeof(int32_t) * n);
    make_prompt(first, n_doc, n_q, 1);
    make_prompt(follow, n_doc, n_q, 2);
    ks_context *c1 = make_ctx(g_model, policy);
    float *ref[3] = {run(c1, NULL, first, n, NULL), run(c1, NULL, follow, n, NULL), NULL};
    ref[2] = ref[0];
    ks_context_destroy(c1);
    g_nseq = 3;
    ks_context *c = make_ctx(g_model, policy);
    g_nseq = 1;
    ks_prefix_cache_params pp = ks_prefix_cache_default_params();
    ks_prefix_cache *pc = NULL;
    assert_int_equal(ks_prefix_cache_create(g_model, &pp, &pc), KS_OK);
    const int32_t *prompts[3] = {first, follow, first};
    float *got[3];
    int32_t hit[3];
    for (int s = 0; s < 3; s++) {
        got[s] = malloc(bytes);
        if (ks_prefill_cached(c, pc, s, prompts[s], n, got[s], &hit[s]) != KS_OK)
            fail_msg("%s: prefill of seq %d: %s", policy, s, ks_last_error());
    }
    assert_int_equal(hit[0], 0);
    bool share = spec_shareable(policy);
    if (share && !spec_evicts(policy) && n_doc >= PAGE) {
        ks_prefix_cache_stats st;
        ks_prefix_cache_get_stats(pc, &st);
        if (!st.ram_shared_bytes) fail_msg("%s: three sequences on one document share no page", policy);
        ks_mem_fit f;
        ks_mem_query q = {0};
        assert_int_equal(ks_context_mem_fits(c, &q, &f), KS_OK);
        int64_t sum = 3 * (int64_t)n, mapped = (int64_t)(hit[1] / PAGE + hit[2] / PAGE) * PAGE;
        if (f.tokens != sum - mapped)
            fail_msg("%s: the plan counts %lld tokens, not %lld (shared pages once)", policy, (long long)f.tokens,
                     (long long)(sum - mapped));
    }
    for (int t = 0; t < STEPS; t++)
        for (int s = 0; s < 3; s++) decode_step(c, s, got[s], t);
    for (int s = 0; s < 3; s++) {
        if (memcmp(got[s], ref[s], bytes))
            fail_msg("%s: seq %d (hit %d, sharing a prefix with others) changed its logits", policy, s, hit[s]);
        free(got[s]);
    }
    ks_context_destroy(c); /* before the cache: its pinned blocks become blocks of bytes */
    ks_prefix_cache_stats st;
    ks_prefix_cache_get_stats(pc, &st);
    assert_true(st.ram_blocks > 0);
    assert_int_equal(st.ram_shared_bytes, 0);
    /* the cache outlives the context: a new one hits the same blocks, exactly */
    c = make_ctx(g_model, policy);
    int32_t h = -1;
    float *again = run(c, pc, follow, n, &h);
    assert_true(share == (h > 0));
    if (memcmp(again, ref[1], bytes)) fail_msg("%s: a hit after the context that pinned the blocks went", policy);
    free(again);
    ks_context_destroy(c);
    ks_prefix_cache_destroy(pc);
    free(ref[0]);
    free(ref[1]);
    free(first);
    free(follow);
}

static void test_shared_sequences(void **state) {
    (void)state;
    char names[64][64];
    int n = policy_specs(names, 64);
    for (int i = 0; i < n; i++) {
        if (strstr(names[i], "spec")) continue; /* its draft model per context: covered by check_policy */
        check_shared(names[i], 120, 75);
        check_shared(names[i], 123, 70);
    }
}

/* Under a memory cap, three sequences mapping one document's pages are
 * planned as the document once: at a cap where counting every sequence's
 * pages would move layers to the slow tier, every layer stays fast. */
static void test_shared_plan(void **state) {
    (void)state;
    int n = 195;
    int32_t p[195];
    make_prompt(p, 184, 11, 1);
    g_nseq = 3;
    g_memcap = 1e12;
    ks_context *c = make_ctx(g_model, "quest");
    ks_prefix_cache_params pp = ks_prefix_cache_default_params();
    ks_prefix_cache *pc = NULL;
    assert_int_equal(ks_prefix_cache_create(g_model, &pp, &pc), KS_OK);
    int32_t Vv = g_model->hp.n_vocab, hit;
    float *logits = malloc(sizeof(float) * Vv);
    for (int s = 0; s < 3; s++) assert_int_equal(ks_prefill_cached(c, pc, s, p, n, logits, &hit), KS_OK);
    ks_mem_fit shared, apart;
    ks_mem_query q = {0};
    assert_int_equal(ks_context_mem_fits(c, &q, &shared), KS_OK);
    q.extra_tokens = 3 * (int64_t)n - shared.tokens; /* the same state, pages counted per sequence */
    assert_true(q.extra_tokens >= 2 * (n / PAGE - 2) * PAGE);
    assert_int_equal(ks_context_mem_fits(c, &q, &apart), KS_OK);
    ks_context_destroy(c);
    /* a cap between the two: fits with every layer fast only when shared pages count once */
    g_memcap = (shared.bytes + apart.bytes) / 2;
    c = make_ctx(g_model, "quest");
    for (int s = 0; s < 3; s++) assert_int_equal(ks_prefill_cached(c, pc, s, p, n, logits, &hit), KS_OK);
    q = (ks_mem_query){0};
    assert_int_equal(ks_context_mem_fits(c, &q, &shared), KS_OK);
    assert_true(shared.fits);
    assert_int_equal(shared.offloaded, 0);
    q.extra_tokens = 3 * (int64_t)n - shared.tokens;
    assert_int_equal(ks_context_mem_fits(c, &q, &apart), KS_OK);
    assert_true(apart.offloaded > 0);
    ks_memplan_info mi;
    ks_context_memplan(c, &mi);
    assert_int_equal(mi.offloaded, 0); /* and the restores kept every layer fast */
    g_memcap = 0;
    g_nseq = 1;
    free(logits);
    ks_context_destroy(c);
    ks_prefix_cache_destroy(pc);
}

/* A hit into layers in the slow tier (rows written through to it) */
static void test_offloaded(void **state) {
    (void)state;
    g_offload = 2;
    check_policy("quest", 120, 75);
    check_policy("snapkv+quest", 123, 70);
    g_offload = 0;
}

/* 8-bit KV: blocks of Q8_0 rows */
static void test_kv_q8(void **state) {
    (void)state;
    g_kvtype = KS_KV_Q8;
    check_policy("dense", 123, 70);
    check_policy("quest", 120, 75);
    check_policy("freekv", 123, 70);
    g_kvtype = KS_KV_F16;
}

/* A page appended at once equals its rows appended one by one: bytes,
 * positions and every summary. */
static void test_page_append(void **state) {
    (void)state;
    for (int type = 0; type < 2; type++) {
        ks_kv_params kp = ks_kv_default_params();
        kp.n_layer = 1;
        kp.n_head_kv = 1;
        kp.head_dim = 64;
        kp.n_seq = 2;
        kp.n_ctx = 64;
        kp.page = 16;
        kp.type = type ? KS_KV_Q8 : KS_KV_F16;
        ks_kv_store *kv = NULL;
        assert_int_equal(ks_kv_create(&kp, &kv), KS_OK);
        ks_rng r = {7};
        float k[64], v[64];
        for (int e = 0; e < 21; e++) {
            for (int i = 0; i < 64; i++) {
                k[i] = ks_rng_normal(&r) * (e + 1);
                v[i] = ks_rng_normal(&r);
            }
            assert_int_equal(ks_kv_append(kv, 0, 0, 0, e, k, v), KS_OK);
        }
        size_t pb = ks_kv_page_bytes(kv);
        uint8_t *pg = malloc(pb), *back = malloc(pb);
        for (int lp = 0; lp < 2; lp++) {
            int m = lp ? 5 : 16;
            assert_int_equal(ks_kv_read_page(kv, 0, 0, 0, lp, pg), KS_OK);
            assert_int_equal(ks_kv_append_page_stored(kv, 1, 0, 0, lp * 16, pg, m), KS_OK);
            assert_int_equal(ks_kv_read_page(kv, 1, 0, 0, lp, back), KS_OK);
            size_t row = ks_kv_row_size(kv);
            assert_memory_equal(pg, back, (size_t)m * row);
            assert_memory_equal(pg + 16 * row, back + 16 * row, (size_t)m * row);
            ks_kv_page_meta a, b;
            ks_kv_page_meta_get(kv, 0, 0, 0, lp, &a);
            ks_kv_page_meta_get(kv, 1, 0, 0, lp, &b);
            assert_int_equal(a.fill, b.fill);
            assert_memory_equal(a.pos, b.pos, sizeof(int32_t) * (size_t)m);
            assert_memory_equal(a.kmin, b.kmin, sizeof(float) * 64);
            assert_memory_equal(a.kmax, b.kmax, sizeof(float) * 64);
            assert_memory_equal(a.ksum, b.ksum, sizeof(float) * 64);
            assert_memory_equal(a.kbound8, b.kbound8, ks_kv_bounds8_bytes(64));
            if (a.kbound16) assert_memory_equal(a.kbound16, b.kbound16, sizeof(uint16_t) * 128);
        }
        free(pg);
        free(back);
        ks_kv_destroy(kv);
    }
}

/* What restoring at any page relies on: a prefill row's result does not
 * depend on the chunk it is computed in, nor on the thread count.  A prompt
 * prefilled in two calls split anywhere (one row first, one row last, a
 * page, off the chunk grid), with three chunk sizes and 1 or 2 threads,
 * gives the prompt's and the greedy decode's logits of one prefill. */
static float *run_split(ks_context *c, const int32_t *prompt, int n, int split) {
    int32_t Vv = g_model->hp.n_vocab;
    float *out = malloc(sizeof(float) * (size_t)(1 + STEPS) * Vv);
    ks_seq_reset(c, 0);
    if (split) assert_int_equal(ks_prefill(c, 0, prompt, split, NULL, NULL), KS_OK);
    assert_int_equal(ks_prefill(c, 0, prompt + split, n - split, out, NULL), KS_OK);
    for (int t = 0; t < STEPS; t++) {
        const float *row = out + (size_t)t * Vv;
        int32_t best = 0, seq = 0;
        for (int32_t j = 1; j < Vv; j++) best = row[j] > row[best] ? j : best;
        assert_int_equal(ks_decode(c, &seq, &best, 1, out + (size_t)(t + 1) * Vv), KS_OK);
    }
    return out;
}

static void test_chunk_invariance(void **state) {
    (void)state;
    int32_t Vv = g_model->hp.n_vocab, p[200];
    size_t bytes = sizeof(float) * (size_t)(1 + STEPS) * Vv;
    float *ref = NULL;
    for (int nd = 121; nd < 124; nd++) {
        make_prompt(p, nd, 70, 2);
        int n = nd + 70;
        const int bats[] = {16, 64, 7};
        for (int bi = 0; bi < 3; bi++)
            for (int th = 1; th <= 2; th++) {
                ks_context_params cp = ks_context_default_params();
                cp.n_ctx = NCTX;
                cp.n_threads = th;
                cp.n_batch = bats[bi];
                cp.page = PAGE;
                ks_context *c = NULL;
                assert_int_equal(ks_context_create(g_model, cp, &c), KS_OK);
                if (bi == 0 && th == 1) ref = run_split(c, p, n, 0);
                const int splits[] = {0, 1, 8, 120, n - 1};
                for (int k = 0; k < 5; k++) {
                    float *y = run_split(c, p, n, splits[k]);
                    if (memcmp(ref, y, bytes))
                        fail_msg("%d-token prompt split at %d, chunks of %d, %d threads: logits differ", n, splits[k],
                                 bats[bi], th);
                    free(y);
                }
                ks_context_destroy(c);
            }
        free(ref);
    }
}

/* A prompt prefilled in pieces leaves its whole blocks in the cache after
 * every piece (a long prompt cancelled halfway keeps what it computed). */
static void test_partial_prompt(void **state) {
    (void)state;
    ks_context *c = make_ctx(g_model, "quest");
    ks_prefix_cache_params pp = ks_prefix_cache_default_params();
    ks_prefix_cache *pc = NULL;
    assert_int_equal(ks_prefix_cache_create(g_model, &pp, &pc), KS_OK);
    int32_t p[195];
    make_prompt(p, 120, 75, 1);
    float *ref = run(c, NULL, p, 195, NULL);
    ks_seq_reset(c, 0);
    assert_int_equal(ks_prefill_rest(c, pc, 0, p, 195, 100, NULL), KS_OK); /* then "cancelled" */
    ks_prefix_cache_stats st;
    ks_prefix_cache_get_stats(pc, &st);
    assert_int_equal(st.ram_blocks, 100 / PAGE);
    int32_t hit = 0;
    float *got = run(c, pc, p, 195, &hit);
    assert_int_equal(hit, 100 / PAGE * PAGE);
    assert_memory_equal(got, ref, sizeof(float) * (size_t)(1 + STEPS) * g_model->hp.n_vocab);
    free(got);
    free(ref);
    ks_prefix_cache_destroy(pc);
    ks_context_destroy(c);
}

/* A prompt shorter than a policy's observation window restores nothing
 * (the window is always recomputed), and never a negative count. */
static void test_short_prompt(void **state) {
    (void)state;
    ks_context *c = make_ctx(g_model, "snapkv");
    ks_prefix_cache_params pp = ks_prefix_cache_default_params();
    ks_prefix_cache *pc = NULL;
    assert_int_equal(ks_prefix_cache_create(g_model, &pp, &pc), KS_OK);
    int32_t p[40];
    make_prompt(p, 30, 10, 1);
    float *ref = run(c, NULL, p, 40, NULL);
    for (int k = 0; k < 2; k++) {
        int32_t hit = -1;
        float *got = run(c, pc, p, 40, &hit);
        assert_int_equal(hit, 0);
        assert_memory_equal(got, ref, sizeof(float) * (size_t)(1 + STEPS) * g_model->hp.n_vocab);
        free(got);
    }
    free(ref);
    ks_prefix_cache_destroy(pc);
    ks_context_destroy(c);
}

/* spec alone in RAM: its keys come back with the blocks */
static void test_spec_state(void **state) {
    (void)state;
    check_policy("spec", 96, 70);
}

/* ---------------------------------------------------- corrupt files -- */
static void key_path(ks_prefix_cache *pc, const ks_context *c, const int32_t *tok, char *out, size_t cap,
                     const char *dir) {
    (void)pc;
    ks_pc_format f = {(uint32_t)c->kv_type, PAGE, 3, (uint32_t)g_model->hp.n_head_kv, (uint32_t)g_model->hp.head_dim};
    ks_pc_key root = ks_pc_context_root(pc, c, &f);
    ks_pc_key k = ks_pc_chain(&root, tok, PAGE);
    snprintf(out, cap, "%s/%016llx%016llx.kvb", dir, (unsigned long long)k.a, (unsigned long long)k.b);
}

static void test_corrupt_files(void **state) {
    (void)state;
    char dir[400];
    fresh_dir(dir, sizeof dir, "corrupt");
    enum { ND = 60, NQQ = 10, N = ND + NQQ };
    int32_t prompts[3][N];
    for (int d = 0; d < 3; d++)
        for (int i = 0; i < N; i++) prompts[d][i] = (i * 31 + d * 57 + 5) % V;
    ks_context *c = make_ctx(g_model, "dense");
    float *ref[3];
    for (int d = 0; d < 3; d++) ref[d] = run(c, NULL, prompts[d], N, NULL);
    ks_prefix_cache_params pp = ks_prefix_cache_default_params();
    pp.dir = dir;
    ks_prefix_cache *pc = NULL;
    assert_int_equal(ks_prefix_cache_create(g_model, &pp, &pc), KS_OK);
    for (int d = 0; d < 3; d++) free(run(c, pc, prompts[d], N, NULL));
    ks_prefix_cache_flush(pc);
    char path[3][600];
    for (int d = 0; d < 3; d++) key_path(pc, c, prompts[d], path[d], sizeof path[d], dir);
    ks_prefix_cache_destroy(pc);
    /* 0: truncated, 1: a payload bit flipped, 2: another model's fingerprint */
    size_t len = 0;
    uint8_t *buf = (uint8_t *)ks_test_read_file(path[0], &len);
    assert_non_null(buf);
    assert_int_equal(ks_test_write_file(path[0], buf, len / 2), 0);
    free(buf);
    buf = (uint8_t *)ks_test_read_file(path[1], &len);
    buf[len - 17] ^= 0x10;
    assert_int_equal(ks_test_write_file(path[1], buf, len), 0);
    free(buf);
    buf = (uint8_t *)ks_test_read_file(path[2], &len);
    buf[33] ^= 0x01; /* the model fingerprint's second byte */
    assert_int_equal(ks_test_write_file(path[2], buf, len), 0);
    free(buf);
    assert_int_equal(ks_prefix_cache_create(g_model, &pp, &pc), KS_OK);
    size_t bytes = sizeof(float) * (size_t)(1 + STEPS) * g_model->hp.n_vocab;
    for (int d = 0; d < 3; d++) {
        int32_t hit = -1;
        float *got = run(c, pc, prompts[d], N, &hit);
        assert_int_equal(hit, 0); /* the chain's first block is bad: nothing restores */
        assert_memory_equal(got, ref[d], bytes);
        free(got);
        free(ref[d]);
    }
    ks_prefix_cache_stats st;
    ks_prefix_cache_get_stats(pc, &st);
    assert_int_equal(st.skipped_corrupt, 3);
    ks_prefix_cache_destroy(pc);
    /* another model on the same directory hits nothing and skips nothing (its keys differ) */
    ks_context *co = make_ctx(g_other, "dense");
    assert_int_equal(ks_prefix_cache_create(g_other, &pp, &pc), KS_OK);
    int32_t hit = -1;
    free(run(co, pc, prompts[1], N, &hit));
    assert_int_equal(hit, 0);
    ks_prefix_cache_destroy(pc);
    ks_context_destroy(co);
    ks_context_destroy(c);
}

/* Two replicas on one directory, one damaged block file in the middle of
 * a document's chain: the first replica to meet it recomputes from there
 * and writes the block again (an atomic replace), after which both
 * replicas, and a restart, hit the whole prefix. */
static void block_path(ks_prefix_cache *pc, const ks_context *c, const int32_t *tok, int32_t blk, char *out,
                       size_t cap, const char *dir) {
    ks_pc_format f = {(uint32_t)c->kv_type, PAGE, 3, (uint32_t)g_model->hp.n_head_kv, (uint32_t)g_model->hp.head_dim};
    ks_pc_key k = ks_pc_context_root(pc, c, &f);
    for (int32_t b = 0; b <= blk; b++) k = ks_pc_chain(&k, tok + (size_t)b * PAGE, PAGE);
    snprintf(out, cap, "%s/%016llx%016llx.kvb", dir, (unsigned long long)k.a, (unsigned long long)k.b);
}

static void test_heal(void **state) {
    (void)state;
    char dir[400];
    fresh_dir(dir, sizeof dir, "heal");
    enum { ND = 64, NQQ = 6, N = ND + NQQ, BAD = 3 };
    int32_t prompt[N];
    make_prompt(prompt, ND, NQQ, 0);
    ks_context *ca = make_ctx(g_model, "dense"), *cb = make_ctx(g_model, "dense");
    float *ref = run(ca, NULL, prompt, N, NULL);
    size_t bytes = sizeof(float) * (size_t)(1 + STEPS) * g_model->hp.n_vocab;
    ks_prefix_cache_params pp = ks_prefix_cache_default_params();
    pp.dir = dir;
    ks_prefix_cache *pa = NULL, *pb = NULL;
    assert_int_equal(ks_prefix_cache_create(g_model, &pp, &pa), KS_OK);
    free(run(ca, pa, prompt, N, NULL));
    ks_prefix_cache_flush(pa);
    char path[600];
    block_path(pa, ca, prompt, BAD, path, sizeof path, dir);
    ks_prefix_cache_destroy(pa);
    size_t len = 0;
    uint8_t *buf = (uint8_t *)ks_test_read_file(path, &len);
    assert_non_null(buf);
    buf[len - 21] ^= 0x04; /* a payload bit: the checksum fails */
    assert_int_equal(ks_test_write_file(path, buf, len), 0);
    free(buf);
    struct stat before;
    assert_int_equal(stat(path, &before), 0);
    /* both replicas start on the damaged directory */
    assert_int_equal(ks_prefix_cache_create(g_model, &pp, &pa), KS_OK);
    assert_int_equal(ks_prefix_cache_create(g_model, &pp, &pb), KS_OK);
    int32_t whole = (N - 1) / PAGE * PAGE, hit = -1; /* the last token is always computed */
    float *got = run(ca, pa, prompt, N, &hit);
    assert_int_equal(hit, BAD * PAGE); /* the chain stops at the bad block */
    assert_memory_equal(got, ref, bytes);
    free(got);
    ks_prefix_cache_flush(pa);
    struct stat after;
    assert_int_equal(stat(path, &after), 0);
    assert_true(after.st_ino != before.st_ino); /* replaced by rename, not rewritten in place */
    ks_prefix_cache_stats st;
    ks_prefix_cache_get_stats(pa, &st);
    assert_int_equal(st.skipped_corrupt, 1);
    assert_int_equal(st.healed, 1);
    /* the other replica, which never recomputed anything, hits it all */
    got = run(cb, pb, prompt, N, &hit);
    assert_int_equal(hit, whole);
    assert_memory_equal(got, ref, bytes);
    free(got);
    ks_prefix_cache_get_stats(pb, &st);
    assert_int_equal(st.skipped_corrupt, 0);
    assert_int_equal(st.healed, 0);
    ks_prefix_cache_destroy(pb);
    ks_prefix_cache_destroy(pa);
    /* and so does a restart of the first */
    assert_int_equal(ks_prefix_cache_create(g_model, &pp, &pa), KS_OK);
    got = run(ca, pa, prompt, N, &hit);
    assert_int_equal(hit, whole);
    assert_memory_equal(got, ref, bytes);
    free(got);
    ks_prefix_cache_get_stats(pa, &st);
    assert_int_equal(st.skipped_corrupt, 0);
    assert_int_equal(st.healed, 0);
    ks_prefix_cache_destroy(pa);
    free(ref);
    ks_context_destroy(cb);
    ks_context_destroy(ca);
}

static void test_record_parse(void **state) {
    (void)state;
    ks_pc_format f = {0, 4, 2, 1, 32};
    size_t pb = ks_pc_payload_bytes(&f);
    assert_int_equal(pb, 2 * 1 * 2 * 4 * 64);
    ks_pc_key model = {1, 2}, root = ks_pc_root(&model, &f);
    int32_t tok[4] = {5, 6, 7, 8};
    ks_pc_key key = ks_pc_chain(&root, tok, 4);
    size_t n = KS_PC_HEADER_BYTES + sizeof tok + pb;
    uint8_t *buf = calloc(1, n);
    uint8_t *payload = buf + KS_PC_HEADER_BYTES + sizeof tok;
    for (size_t i = 0; i < pb; i++) payload[i] = (uint8_t)(i * 7);
    memcpy(buf + KS_PC_HEADER_BYTES, tok, sizeof tok);
    ks_pc_record_header(buf, &f, &model, &key, &root, tok, payload);
    ks_pc_record r;
    assert_int_equal(ks_pc_record_parse(buf, n, &model, &r), KS_OK);
    assert_int_equal(r.bytes, n);
    for (size_t cut = 0; cut < n; cut += 37) assert_int_equal(ks_pc_record_parse(buf, cut, &model, &r), KS_ERR_FORMAT);
    ks_pc_key other = {1, 3};
    assert_int_equal(ks_pc_record_parse(buf, n, &other, &r), KS_ERR_FORMAT);
    for (size_t i = 0; i < n; i += 13) {
        buf[i] ^= 0x40;
        assert_int_equal(ks_pc_record_parse(buf, n, &model, &r), KS_ERR_FORMAT);
        buf[i] ^= 0x40;
    }
    free(buf);
    /* a policy-state record */
    uint8_t st[KS_PC_STATE_HEADER_BYTES + 40];
    for (int i = 0; i < 40; i++) st[KS_PC_STATE_HEADER_BYTES + i] = (uint8_t)(i * 3);
    ks_pc_state_header(st, &model, &key, 77, st + KS_PC_STATE_HEADER_BYTES, 40);
    ks_pc_state_record sr;
    assert_int_equal(ks_pc_state_parse(st, sizeof st, &model, &sr), KS_OK);
    assert_int_equal(sr.pol, 77);
    assert_int_equal(sr.data_bytes, 40);
    assert_int_equal(ks_pc_state_parse(st, sizeof st - 1, &model, &sr), KS_ERR_FORMAT);
    assert_int_equal(ks_pc_state_parse(st, sizeof st, &other, &sr), KS_ERR_FORMAT);
    for (size_t i = 0; i < sizeof st; i += 3) {
        if (i >= 72 && i < 80) continue; /* reserved */
        if (i >= 12 && i < 16) continue;
        st[i] ^= 0x08;
        assert_int_equal(ks_pc_state_parse(st, sizeof st, &model, &sr), KS_ERR_FORMAT);
        st[i] ^= 0x08;
    }
}

/* ------------------------------------------------- one-file cache -- */
static void test_prompt_file(void **state) {
    (void)state;
    enum { ND = 100, NQQ = 20, N = ND + NQQ };
    int32_t a[N], b[N];
    make_prompt(a, ND, NQQ, 1);
    make_prompt(b, ND, NQQ, 2);
    ks_context *c = make_ctx(g_model, "quest");
    float *ref = run(c, NULL, b, N, NULL);
    char path[400];
    snprintf(path, sizeof path, "%s/prompt.cache", g_tmp);
    unlink(path);
    ks_prefix_cache_params pp = ks_prefix_cache_default_params();
    ks_prefix_cache *pc = NULL;
    assert_int_equal(ks_prefix_cache_create(g_model, &pp, &pc), KS_OK);
    int32_t nb = -1;
    assert_int_equal(ks_prefix_cache_load_file(pc, path, &nb), KS_ERR_NOT_FOUND);
    free(run(c, pc, a, N, NULL));
    assert_int_equal(ks_prefix_cache_save_file(pc, c, a, N, path, &nb), KS_OK);
    assert_int_equal(nb, N / PAGE);
    ks_prefix_cache_destroy(pc);
    assert_int_equal(ks_prefix_cache_create(g_model, &pp, &pc), KS_OK);
    assert_int_equal(ks_prefix_cache_load_file(pc, path, &nb), KS_OK);
    assert_int_equal(nb, N / PAGE);
    int32_t hit = 0;
    float *got = run(c, pc, b, N, &hit);
    assert_int_equal(hit, ND); /* whole pages, then the shared rows of the next cached page */
    assert_memory_equal(got, ref, sizeof(float) * (size_t)(1 + STEPS) * g_model->hp.n_vocab);
    free(got);
    free(ref);
    ks_prefix_cache_destroy(pc);
    ks_context_destroy(c);
}

/* A checkpointed prefill (`kvsieve run --prompt-cache-every`): a prompt
 * prefilled in pieces with its blocks appended to one file after each, the
 * process "killed" after the second checkpoint (cache and sequence dropped,
 * a torn record left at the file's end), then resumed from the file by a
 * new cache gives the prompt's and the greedy decode's logits of one
 * uninterrupted prefill bit for bit, dense and under a sparse prefill whose
 * budget binds; the resume cuts the torn bytes and the finished file holds
 * every block, each in order. */
static void decode_greedy(ks_context *c, float *out) {
    int32_t Vv = g_model->hp.n_vocab;
    for (int t = 0; t < STEPS; t++) {
        const float *row = out + (size_t)t * Vv;
        int32_t best = 0, seq = 0;
        for (int32_t j = 1; j < Vv; j++) best = row[j] > row[best] ? j : best;
        if (ks_decode(c, &seq, &best, 1, out + (size_t)(t + 1) * Vv) != KS_OK) fail_msg("decode: %s", ks_last_error());
    }
}

static void check_resume(const char *prefill_policy, const char *policy) {
    enum { N = 150, PG = 16, EVERY = 32 };
    int32_t p[N];
    make_prompt(p, N - 10, 10, 3);
    ks_context_params cp = ks_context_default_params();
    cp.n_ctx = NCTX;
    cp.n_threads = 2;
    cp.n_batch = 24; /* not a divisor of the interval: the pieces' chunks differ from one prefill's */
    cp.page = PG;
    cp.policy = policy;
    cp.budget = 48;
    cp.prefill_policy = prefill_policy;
    ks_context *c = NULL;
    assert_int_equal(ks_context_create(g_model, cp, &c), KS_OK);
    size_t bytes = sizeof(float) * (size_t)(1 + STEPS) * g_model->hp.n_vocab;
    float *ref = malloc(bytes), *got = malloc(bytes);
    assert_int_equal(ks_prefill(c, 0, p, N, ref, NULL), KS_OK);
    decode_greedy(c, ref);
    char path[400];
    snprintf(path, sizeof path, "%s/resume.cache", g_tmp);
    unlink(path);
    ks_prefix_cache_params pp = ks_prefix_cache_default_params();
    ks_prefix_cache *pc = NULL;
    int32_t nb = -1, hit = -1;
    /* the first run: killed after its second checkpoint */
    ks_seq_reset(c, 0);
    assert_int_equal(ks_prefix_cache_create(g_model, &pp, &pc), KS_OK);
    assert_int_equal(ks_prefix_restore(c, pc, 0, p, N, &hit), KS_OK);
    assert_int_equal(hit, 0);
    for (int32_t upto = EVERY; upto <= 2 * EVERY; upto += EVERY) {
        assert_int_equal(ks_prefill_rest(c, pc, 0, p, N, upto, NULL), KS_OK);
        assert_int_equal(ks_prefix_cache_append_file(pc, c, p, upto, path, &nb), KS_OK);
        assert_int_equal(nb, upto / PG);
    }
    ks_prefix_cache_destroy(pc);
    ks_seq_reset(c, 0);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    off_t rec = sb.st_size / (2 * EVERY / PG);
    FILE *f = fopen(path, "ab"); /* a torn record: the kill came in the middle of a third append */
    assert_non_null(f);
    char junk[700];
    memset(junk, 0x5A, sizeof junk);
    memcpy(junk, "KSPCBLK", 8);
    assert_int_equal(fwrite(junk, 1, sizeof junk, f), sizeof junk);
    fclose(f);
    /* the same command again: restores the checkpoints and goes on */
    assert_int_equal(ks_prefix_cache_create(g_model, &pp, &pc), KS_OK);
    assert_int_equal(ks_prefix_cache_load_file(pc, path, &nb), KS_OK);
    assert_int_equal(nb, 2 * EVERY / PG);
    assert_int_equal(ks_prefix_restore(c, pc, 0, p, N, &hit), KS_OK);
    assert_int_equal(hit, 2 * EVERY);
    for (int32_t have = hit; have < N;) {
        int32_t upto = (have / EVERY + 1) * EVERY < N ? (have / EVERY + 1) * EVERY : N;
        assert_int_equal(ks_prefill_rest(c, pc, 0, p, N, upto, upto == N ? got : NULL), KS_OK);
        assert_int_equal(ks_prefix_cache_append_file(pc, c, p, upto, path, &nb), KS_OK);
        have = upto;
    }
    decode_greedy(c, got);
    if (memcmp(got, ref, bytes)) fail_msg("prefill %s, policy %s: the resumed run's logits differ", prefill_policy, policy);
    assert_int_equal(nb, N / PG);
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_size, rec * (N / PG)); /* the torn bytes are gone */
    ks_prefix_cache_destroy(pc);
    assert_int_equal(ks_prefix_cache_create(g_model, &pp, &pc), KS_OK);
    assert_int_equal(ks_prefix_cache_load_file(pc, path, &nb), KS_OK);
    assert_int_equal(nb, N / PG);
    ks_prefix_cache_destroy(pc);
    /* a file of another prompt is replaced, not appended to */
    int32_t q[N];
    make_prompt(q, N - 10, 10, 4);
    q[0] = (q[0] + 1) % V;
    assert_int_equal(ks_prefix_cache_create(g_model, &pp, &pc), KS_OK);
    assert_int_equal(ks_prefix_cache_load_file(pc, path, &nb), KS_OK);
    ks_seq_reset(c, 0);
    assert_int_equal(ks_prefix_restore(c, pc, 0, q, N, &hit), KS_OK);
    assert_int_equal(hit, 0);
    assert_int_equal(ks_prefill_rest(c, pc, 0, q, N, EVERY, NULL), KS_OK);
    assert_int_equal(ks_prefix_cache_append_file(pc, c, q, EVERY, path, &nb), KS_OK);
    assert_int_equal(nb, EVERY / PG);
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_size, rec * (EVERY / PG));
    ks_prefix_cache_destroy(pc);
    free(ref);
    free(got);
    ks_context_destroy(c);
}

static void test_prompt_file_resume(void **state) {
    (void)state;
    check_resume(NULL, "dense");
    check_resume(NULL, "quest");
    check_resume("quest:budget=48,sink=4,window=16,dense=0", "dense");
}

/* docs/POLICIES.md's prefix-caching table says what the registry says. */
static void test_docs_table(void **state) {
    (void)state;
    size_t len = 0;
    char *doc = ks_test_read_file(ks_test_source("docs/POLICIES.md"), &len);
    assert_non_null(doc);
    char *sec = strstr(doc, "\n### Prefix caching\n");
    assert_non_null(sec);
    const ks_policy_i *const *reg = ks_policy_list();
    for (int i = 0; reg[i]; i++) {
        char pat[128];
        snprintf(pat, sizeof pat, "\n| `%s` | %s |", reg[i]->name, reg[i]->prefix ? "yes" : "**no**");
        if (!strstr(sec, pat)) fail_msg("docs/POLICIES.md's prefix-caching table lacks '%s'", pat + 1);
        assert_non_null(reg[i]->prefix_why);
    }
    free(doc);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_record_parse),
        cmocka_unit_test(test_chunk_invariance),
        cmocka_unit_test(test_docs_table),
        cmocka_unit_test(test_registry_exact),
        cmocka_unit_test(test_shared_sequences),
        cmocka_unit_test(test_shared_plan),
        cmocka_unit_test(test_spec_state),
        cmocka_unit_test(test_short_prompt),
        cmocka_unit_test(test_partial_prompt),
        cmocka_unit_test(test_offloaded),
        cmocka_unit_test(test_kv_q8),
        cmocka_unit_test(test_page_append),
        cmocka_unit_test(test_corrupt_files),
        cmocka_unit_test(test_heal),
        cmocka_unit_test(test_prompt_file),
        cmocka_unit_test(test_prompt_file_resume),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
