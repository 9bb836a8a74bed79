/*
 * test_policy.c — the selection-policy interface and the baseline policies.
 *
 * 1. Exactness: with a budget >= the context, every policy of the registry
 *    but spec (tests/test_spec.c), and each per-layer selector behind an
 *    evictor, produces logits bit-identical to dense, for batch 1 and
 *    batch 2, with and without layers in the slow tier (memory and file),
 *    on a generated GQA model whose head dim takes the AVX-512 kernel, on
 *    the real MHA aidreams260K model (portable kernels) and on a generated
 *    gemma3 (sliding-window layers, which attend their window densely).
 * 2. Selections on hand-made KV where the right answer is known: Quest's
 *    page bound finds the page aligned with the query; H2O keeps the entries
 *    that received the most weight; streaming keeps the entries just before
 *    the window; SnapKV keeps what the observation queries attend to.
 * 3. Helpers: top-k (deterministic ties), group reductions, argument parsing;
 *    the 8-bit page bounds (outward rounding, kept by the store, Quest's
 *    scoring from them an upper bound at every SIMD level).
 */
#define _GNU_SOURCE
#include "infer/infer.h"
#include "gguf/gguf.h"
#include "model/shapes.h"
#include "core/simd.h"
#include "policies/registry.h"
#include "tensor/dtype.h"
#include "testutil.h"
#include "kvsieve_tools.h" /* the turnover probe */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

static ks_model *g_gqa, *g_mha, *g_gemma, *g_gptoss;
static char g_path[256], g_dir[256], g_gemma_path[256], g_gptoss_path[256];

static int setup(void **state) {
    (void)state;
    snprintf(g_path, sizeof g_path, "/tmp/kvsieve-test-policy-%d.gguf", (int)getpid());
    if (ks_test_tiny_llama(3, 5, g_path, &g_gqa) != 0) return -1;
    if (ks_model_load(ks_test_fixture("models/aidreams260K.gguf"), ks_model_default_params(), &g_mha) != KS_OK) return -1;
    /* gemma3: five sliding-window layers (window 16) and one global one */
    snprintf(g_gemma_path, sizeof g_gemma_path, "/tmp/kvsieve-test-policy-gemma-%d.gguf", (int)getpid());
    ks_gguf *vocab = NULL;
    if (ks_gguf_open(ks_test_fixture("models/aidreams260K.gguf"), &vocab) != KS_OK) return -1;
    ks_shape_gen_params gp = {.type = KS_DTYPE_F16, .vocab = vocab, .seed = 11, .n_ctx = 512};
    ks_status st = ks_shape_generate(ks_shape_find("tiny-gemma3"), &gp, g_gemma_path, NULL);
    /* gpt-oss: attention sinks, two sliding-window layers (window 16) and two global ones, MXFP4 experts */
    snprintf(g_gptoss_path, sizeof g_gptoss_path, "/tmp/kvsieve-test-policy-gptoss-%d.gguf", (int)getpid());
    ks_shape_gen_params gpo = {.type = KS_DTYPE_MXFP4, .vocab = vocab, .seed = 12, .n_ctx = 512};
    if (st == KS_OK) st = ks_shape_generate(ks_shape_find("tiny-gptoss"), &gpo, g_gptoss_path, NULL);
    ks_gguf_close(vocab);
    if (st != KS_OK || ks_model_load(g_gemma_path, ks_model_default_params(), &g_gemma) != KS_OK) return -1;
    if (ks_model_load(g_gptoss_path, ks_model_default_params(), &g_gptoss) != KS_OK) return -1;
    snprintf(g_dir, sizeof g_dir, "/tmp/kvsieve-test-policy-XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    ks_model_destroy(g_gqa);
    ks_model_destroy(g_mha);
    ks_model_destroy(g_gemma);
    ks_model_destroy(g_gptoss);
    unlink(g_path);
    unlink(g_gemma_path);
    unlink(g_gptoss_path);
    rmdir(g_dir);
    return 0;
}

typedef struct {
    const char *policy;
    int32_t budget, page, offload_layers;
    const char *dir;
    const char *args;
} run_cfg;

/* Prefill two different prompts, then decode n_steps greedy steps as a batch
 * of two; returns every step's logits [n_steps][2][V] (malloc'd). */
static float *run_decode(ks_model *m, const run_cfg *cfg, int n_prompt, int n_steps, int n_seq) {
    ks_context_params p = ks_context_default_params();
    p.n_ctx = n_prompt + n_steps + 1;
    p.n_seq = n_seq;
    p.n_threads = 2;
    p.n_batch = 64;
    p.policy = cfg->policy;
    p.budget = cfg->budget;
    p.page = cfg->page;
    p.sink = 4;
    p.window = 8;
    p.kv_offload_layers = cfg->offload_layers;
    p.kv_offload_dir = cfg->dir;
    p.policy_args = cfg->args;
    ks_context *c = NULL;
    assert_int_equal(ks_context_create(m, p, &c), KS_OK);
    int32_t V = m->hp.n_vocab;
    float *out = malloc(sizeof(float) * (size_t)n_steps * n_seq * V);
    float *logits = malloc(sizeof(float) * (size_t)n_seq * V);
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)n_prompt);
    int32_t seqs[4], toks[4];
    for (int s = 0; s < n_seq; s++) {
        for (int i = 0; i < n_prompt; i++) prompt[i] = (int32_t)((i * 37 + s * 101 + 11) % V);
        assert_int_equal(ks_prefill(c, s, prompt, n_prompt, logits + (size_t)s * V, NULL), KS_OK);
        seqs[s] = s;
    }
    for (int t = 0; t < n_steps; t++) {
        for (int s = 0; s < n_seq; s++) {
            const float *row = logits + (size_t)s * V;
            int32_t best = 0;
            for (int32_t j = 1; j < V; j++) best = row[j] > row[best] ? j : best;
            toks[s] = best;
        }
        assert_int_equal(ks_decode(c, seqs, toks, n_seq, logits), KS_OK);
        memcpy(out + (size_t)t * n_seq * V, logits, sizeof(float) * (size_t)n_seq * V);
    }
    free(logits);
    free(prompt);
    ks_context_destroy(c);
    return out;
}

/* What the exactness check runs, from the registry: every policy but dense
 * (the reference) and those needing a DLM (tests/test_spec.c), and each
 * per-layer decode selector behind an evictor (the evictors in turn), the
 * compositions kvsieve runs. */
static int registry_specs(char (*out)[64], int cap) {
    const ks_policy_i *const *reg = ks_policy_list();
    const ks_policy_i *evictors[16];
    int n = 0, n_ev = 0, k = 0;
    for (int i = 0; reg[i]; i++)
        if (ks_policy_i_evicts(reg[i]) && n_ev < 16) evictors[n_ev++] = reg[i];
    assert_true(n_ev > 0);
    for (int i = 0; reg[i] && n < cap; i++) {
        const ks_policy_i *p = reg[i];
        if (!strcmp(p->name, "dense") || ks_policy_i_needs_dlm(p)) continue;
        snprintf(out[n++], 64, "%s", p->name);
        if (p->select && !ks_policy_i_global(p) && !ks_policy_i_evicts(p) && n < cap)
            snprintf(out[n++], 64, "%s+%s", evictors[k++ % n_ev]->name, p->name);
    }
    return n;
}

static void check_equal_dense(ks_model *m, int n_prompt, int page) {
    const int steps = 6;
    int32_t V = m->hp.n_vocab;
    for (int n_seq = 1; n_seq <= 2; n_seq++) {
        run_cfg dense = {.policy = "dense", .page = page};
        float *ref = run_decode(m, &dense, n_prompt, steps, n_seq);
        char names[64][64];
        int n_names = registry_specs(names, 64);
        for (int i = 0; i < n_names; i++) {
            for (int off = 0; off < 3; off++) {
                run_cfg cfg = {.policy = names[i], .budget = n_prompt + steps + 1, .page = page,
                               .offload_layers = off ? 1 : 0, .dir = off == 2 ? g_dir : NULL};
                float *got = run_decode(m, &cfg, n_prompt, steps, n_seq);
                if (memcmp(got, ref, sizeof(float) * (size_t)steps * n_seq * V) != 0)
                    fail_msg("policy %s (batch %d, offload %d) differs from dense with a full budget", names[i], n_seq, off);
                free(got);
            }
        }
        /* dense itself through the slow tier */
        run_cfg slow = {.policy = "dense", .page = page, .offload_layers = (int32_t)m->hp.n_layer, .dir = g_dir};
        float *got = run_decode(m, &slow, n_prompt, steps, n_seq);
        assert_memory_equal(got, ref, sizeof(float) * (size_t)steps * n_seq * V);
        free(got);
        free(ref);
    }
}

static void test_full_budget_equals_dense_gqa(void **state) {
    (void)state;
    check_equal_dense(g_gqa, 150, 32);
}

static void test_full_budget_equals_dense_mha(void **state) {
    (void)state;
    check_equal_dense(g_mha, 90, 8);
}

/* local layers attend their window densely whatever the policy, and the
 * global one selects: at a full budget still dense, bit for bit */
static void test_full_budget_equals_dense_gemma3(void **state) {
    (void)state;
    check_equal_dense(g_gemma, 90, 8);
}

/* gpt-oss: the sinks join every attention's softmax whatever a policy
 * selects (they are no KV entries), local layers keep their window, and the
 * MoE FFN runs between: at full budget every policy still equals dense. */
static void test_full_budget_equals_dense_gptoss(void **state) {
    (void)state;
    check_equal_dense(g_gptoss, 90, 8);
}

static void test_sparse_differs_and_counts(void **state) {
    (void)state;
    /* a real budget must change what is attended (else the tests above prove nothing) */
    ks_context_params p = ks_context_default_params();
    p.n_ctx = 200;
    p.n_threads = 2;
    p.policy = "quest";
    p.budget = 48;
    p.page = 8;
    p.sink = 4;
    p.window = 8;
    ks_context *c = NULL;
    assert_int_equal(ks_context_create(g_gqa, p, &c), KS_OK);
    int32_t prompt[150];
    for (int i = 0; i < 150; i++) prompt[i] = (i * 37 + 11) % g_gqa->hp.n_vocab;
    float *logits = malloc(sizeof(float) * g_gqa->hp.n_vocab);
    assert_int_equal(ks_prefill(c, 0, prompt, 150, logits, NULL), KS_OK);
    int32_t seq = 0, tok = 5;
    assert_int_equal(ks_decode(c, &seq, &tok, 1, logits), KS_OK);
    ks_stats st;
    ks_context_stats(c, &st);
    assert_true(st.kv_entries_attended < st.kv_entries_total);
    /* 1 of 3 layers dense by default? quest keeps 2 dense: layer 2 is sparse */
    assert_true(st.kv_entries_attended >= (uint64_t)(2 * 2 * 151 + 2 * 48 - 2 * 8));
    free(logits);
    ks_context_destroy(c);
}

/* Decode 6 steps after a 150-token prompt with the turnover probe on or off;
 * returns the last step's logits (malloc'd) and the probe's counts. */
static float *turnover_run(const char *policy, int32_t budget, bool probe, ks_turnover *t) {
    ks_context_params p = ks_context_default_params();
    p.n_ctx = 200;
    p.n_threads = 2;
    p.policy = policy;
    p.budget = budget;
    p.page = 8;
    p.sink = 4;
    p.window = 8;
    ks_context *c = NULL;
    assert_int_equal(ks_context_create(g_gqa, p, &c), KS_OK);
    if (probe) assert_int_equal(ks_context_set_turnover_probe(c, true), KS_OK);
    int32_t prompt[150], seq = 0, tok = 5;
    for (int i = 0; i < 150; i++) prompt[i] = (i * 37 + 11) % g_gqa->hp.n_vocab;
    float *logits = malloc(sizeof(float) * g_gqa->hp.n_vocab);
    assert_int_equal(ks_prefill(c, 0, prompt, 150, logits, NULL), KS_OK);
    for (int k = 0; k < 6; k++, tok = (tok * 31 + 7) % g_gqa->hp.n_vocab)
        assert_int_equal(ks_decode(c, &seq, &tok, 1, logits), KS_OK);
    ks_context_take_turnover(c, t);
    ks_context_destroy(c);
    return logits;
}

/* The turnover probe leaves the output alone; streaming's selection (sinks
 * and a sliding window) gains exactly the one appended entry a step, and no
 * set can gain more entries than it has. */
static void test_turnover_probe(void **state) {
    (void)state;
    ks_turnover t0, t1;
    float *a = turnover_run("quest", 48, false, &t0), *b = turnover_run("quest", 48, true, &t1);
    assert_memory_equal(a, b, sizeof(float) * g_gqa->hp.n_vocab);
    assert_true(t0.selected == 0 && t1.selected > 0);
    assert_true(t1.policy_moved <= t1.selected && t1.oracle_moved <= t1.selected);
    free(a);
    free(b);
    a = turnover_run("streaming", 12, true, &t1);
    int32_t heads = g_gqa->hp.n_layer * g_gqa->hp.n_head_kv; /* streaming keeps no layer dense */
    assert_int_equal(t1.selected, 5 * heads * 12);           /* the first of the 6 steps is the baseline */
    assert_int_equal(t1.policy_moved, 5 * heads);
    assert_true(t1.oracle_moved <= t1.selected);
    free(a);
}

static void test_bad_policy_args(void **state) {
    (void)state;
    ks_context_params p = ks_context_default_params();
    p.n_ctx = 64;
    p.n_threads = 1;
    ks_context *c = NULL;
    p.policy = "nosuch";
    assert_int_equal(ks_context_create(g_gqa, p, &c), KS_ERR_NOT_FOUND);
    assert_non_null(strstr(ks_last_error(), "quest"));
    p.policy = "quest";
    p.policy_args = "group=median";
    assert_int_equal(ks_context_create(g_gqa, p, &c), KS_ERR_INVALID_ARG);
    p.policy_args = "bounds=q4"; /* refused by name, not taken as f16 */
    assert_int_equal(ks_context_create(g_gqa, p, &c), KS_ERR_INVALID_ARG);
    assert_non_null(strstr(ks_last_error(), "bounds=q4"));
    p.policy_args = "nokey=1";
    assert_int_equal(ks_context_create(g_gqa, p, &c), KS_ERR_INVALID_ARG);
    assert_non_null(strstr(ks_last_error(), "nokey"));
    p.policy = "quest+snapkv";
    p.policy_args = NULL;
    assert_int_equal(ks_context_create(g_gqa, p, &c), KS_ERR_INVALID_ARG);
    p.policy = "snapkv+quest";
    p.policy_args = "obs=16,group=mean";
    assert_int_equal(ks_context_create(g_gqa, p, &c), KS_OK);
    ks_context_destroy(c);
}

/* ------------------------------------------------ hand-made selections -- */
enum { HD = 8, NKV = 1, NQ = 2, CTX = 64, PG = 4 };

typedef struct {
    ks_kv_store *kv;
    uint8_t keep[CTX];
    int evicted;
} fake_svc;

static ks_status fake_probs(void *svc, int32_t seq, int32_t layer, int32_t head, const float *q, int32_t nq,
                            const int32_t *n_keys, float *acc) {
    fake_svc *f = svc;
    int32_t n = ks_kv_n_entries(f->kv, seq, layer, head);
    for (int32_t r = 0; r < nq; r++)
        for (int g = 0; g < NQ; g++) {
            float s[CTX], mx = -INFINITY, sum = 0;
            int32_t m = n_keys && n_keys[r] < n ? n_keys[r] : n; /* the row's keys in scope */
            for (int32_t e = 0; e < m; e++) {
                const uint8_t *K, *V;
                ks_kv_page_rows(f->kv, seq, layer, head, e / PG, &K, &V);
                const ks_f16 *k = (const ks_f16 *)K + (e % PG) * HD;
                s[e] = 0;
                for (int d = 0; d < HD; d++) s[e] += q[((size_t)r * NQ + g) * HD + d] * ks_f16_to_f32(k[d]);
                mx = fmaxf(mx, s[e]);
            }
            for (int32_t e = 0; e < m; e++) sum += (s[e] = expf(s[e] - mx));
            for (int32_t e = 0; e < m; e++) acc[e] += s[e] / sum;
        }
    return KS_OK;
}

static ks_status fake_evict(void *svc, int32_t seq, int32_t layer, int32_t head, const uint8_t *keep) {
    fake_svc *f = svc;
    memcpy(f->keep, keep, (size_t)ks_kv_n_entries(f->kv, seq, layer, head));
    f->evicted++;
    return ks_kv_compact(f->kv, seq, layer, head, keep);
}

/* 40 entries of small noise keys; entries in `hot` get a large key along dim 0 */
static void make_kv(fake_svc *f, const int *hot, int n_hot) {
    ks_kv_params kp = ks_kv_default_params();
    kp.n_layer = 1;
    kp.n_head_kv = NKV;
    kp.head_dim = HD;
    kp.n_ctx = CTX;
    kp.page = PG;
    assert_int_equal(ks_kv_create(&kp, &f->kv), KS_OK);
    for (int e = 0; e < 40; e++) {
        float k[HD], v[HD];
        for (int d = 0; d < HD; d++) {
            k[d] = 0.1f * sinf((float)(e * HD + d));
            v[d] = (float)e;
        }
        for (int i = 0; i < n_hot; i++)
            if (hot[i] == e) k[0] = 4.0f;
        assert_int_equal(ks_kv_append(f->kv, 0, 0, 0, e, k, v), KS_OK);
    }
}

static ks_policy *make_policy(fake_svc *f, const char *name, int32_t budget, const char *args) {
    ks_policy_env env = {.n_layer = 1, .n_head = NQ, .n_head_kv = NKV, .head_dim = HD, .n_seq = 1, .n_ctx = CTX,
                         .kv = f->kv, .svc = f, .attn_probs = fake_probs, .evict = fake_evict};
    ks_policy *pol = NULL;
    assert_int_equal(ks_test_policy_create(name, args, budget, 2, 4, 0, &env, &pol), KS_OK);
    return pol;
}

static ks_select_req req_for(const float *q, int32_t n_select) {
    return (ks_select_req){.seq = 0, .layer = 0, .head = 0, .pos = 40, .n_entries = 40, .q = q,
                           .n_select = n_select, .sink = 2, .window = 4};
}

static void test_quest_finds_the_page(void **state) {
    (void)state;
    for (int b8 = 0; b8 < 2; b8++) { /* f16 bounds, then the 8-bit ones */
    fake_svc f = {0};
    int hot[] = {21}; /* page 5 */
    make_kv(&f, hot, 1);
    ks_policy *pol = make_policy(&f, "quest", 10, b8 ? "bounds=q8" : NULL);
    float q[NQ * HD] = {0};
    q[0] = 1.0f;      /* head 0 looks along dim 0 */
    q[HD + 3] = 0.1f; /* head 1 looks elsewhere: max over the group keeps head 0's page */
    int32_t idx[CTX];
    ks_selection sel = {.cap = CTX, .idx = idx};
    ks_select_req r = req_for(q, 4);
    assert_int_equal(ks_policy_select(pol, &r, &sel), KS_OK);
    assert_true(sel.pages);
    assert_int_equal(sel.n, 1);
    assert_int_equal(idx[0], 5);
    /* a budget covering every page selects all of them */
    r.n_select = 40;
    assert_int_equal(ks_policy_select(pol, &r, &sel), KS_OK);
    assert_true(sel.all || sel.n == 10);
    ks_policy_destroy(pol);
    ks_kv_destroy(f.kv);
    }
}

/* The decoded 8-bit bounds of one page: lo[i] * s, hi[i] * s. */
static void bounds8_decode(const uint8_t *b, int hd, float *lo, float *hi) {
    float s;
    memcpy(&s, b, sizeof s);
    for (int i = 0; i < hd; i++) {
        lo[i] = (float)((const int8_t *)(b + 4))[i] * s;
        hi[i] = (float)((const int8_t *)(b + 4))[hd + i] * s;
    }
}

/* kv_meta.h's 8-bit bounds: rounded outward (never inside the f32 bounds),
 * at most two steps outside them, kept by the store through appends,
 * compaction and park / unpark; Quest's scoring from them is an upper bound
 * of every key's score at every SIMD level. */
static void test_bounds8(void **state) {
    (void)state;
    enum { D = 80 };
    uint8_t b[4 + 2 * D];
    float lo[D], hi[D], kmin[D], kmax[D];
    assert_int_equal(ks_kv_bounds8_bytes(D), 4 + 2 * D);
    assert_int_equal(ks_kv_bounds8_bytes(3), 12);
    const float mags[] = {1.0f, 1e-3f, 37.0f, 1e30f, 1e-40f, 0.0f};
    for (int m = 0; m < 6; m++) {
        for (int i = 0; i < D; i++) {
            float a = mags[m] * sinf(1.3f * (float)i + (float)m), c = mags[m] * cosf(0.7f * (float)i);
            kmin[i] = a < c ? a : c;
            kmax[i] = a < c ? c : a;
        }
        ks_kv_bounds8_encode(kmin, kmax, D, b);
        float s;
        memcpy(&s, b, sizeof s);
        assert_true(s >= 0.0f && isfinite(s));
        bounds8_decode(b, D, lo, hi);
        for (int i = 0; i < D; i++) {
            if (lo[i] > kmin[i] || hi[i] < kmax[i])
                fail_msg("magnitude %g, channel %d: [%g, %g] inside [%g, %g]", mags[m], i, lo[i], hi[i], kmin[i], kmax[i]);
            if (kmin[i] - lo[i] > 2 * s || hi[i] - kmax[i] > 2 * s)
                fail_msg("magnitude %g, channel %d: [%g, %g] too loose around [%g, %g] (step %g)", mags[m], i, lo[i],
                         hi[i], kmin[i], kmax[i], s);
        }
    }
    kmax[3] = INFINITY; /* a non-finite key: the widest finite bounds */
    ks_kv_bounds8_encode(kmin, kmax, D, b);
    bounds8_decode(b, D, lo, hi);
    assert_true(isfinite(lo[0]) && isfinite(hi[0]) && hi[0] > 1e30f && lo[0] < -1e30f);

    /* the store keeps them through appends, compaction and park / unpark */
    fake_svc f = {0};
    int hot[] = {5, 21};
    make_kv(&f, hot, 2);
    size_t nb = ks_kv_bounds8_bytes(HD);
    uint8_t want[4 + 2 * HD];
    for (int round = 0; round < 3; round++) {
        int32_t np = ks_kv_n_pages(f.kv, 0, 0, 0);
        const uint8_t *pb[CTX];
        ks_kv_pages_bounds8(f.kv, 0, 0, 0, np, pb);
        for (int32_t p = 0; p < np; p++) {
            ks_kv_page_meta m;
            ks_kv_page_meta_get(f.kv, 0, 0, 0, p, &m);
            assert_ptr_equal(m.kbound8, pb[p]);
            ks_kv_bounds8_encode(m.kmin, m.kmax, HD, want);
            if (memcmp(want, pb[p], nb)) fail_msg("round %d, page %d: the store's 8-bit bounds are stale", round, p);
        }
        if (round == 0) {
            uint8_t keep[CTX];
            for (int e = 0; e < 40; e++) keep[e] = e % 3 != 1;
            assert_int_equal(ks_kv_compact(f.kv, 0, 0, 0, keep), KS_OK);
        } else if (round == 1) {
            assert_int_equal(ks_kv_seq_park(f.kv, 0), KS_OK);
            assert_int_equal(ks_kv_seq_unpark(f.kv, 0), KS_OK);
        }
    }
    ks_kv_destroy(f.kv);

    /* Quest's scoring from them: >= every key's q . k, at every level */
    enum { NP = 6, G = 5, H2 = 64 };
    uint8_t pg[NP][4 + 2 * H2];
    const uint8_t *pp[NP];
    float keys[NP][8][H2], q[G * H2];
    for (int i = 0; i < G * H2; i++) q[i] = sinf(0.37f * (float)i + 0.5f);
    for (int p = 0; p < NP; p++) {
        for (int i = 0; i < H2; i++) kmin[i] = INFINITY, kmax[i] = -INFINITY;
        for (int r = 0; r < 8; r++)
            for (int i = 0; i < H2; i++) {
                keys[p][r][i] = (float)(p + 1) * sinf(0.11f * (float)(p * 997 + r * 131 + i * 7));
                kmin[i] = fminf(kmin[i], keys[p][r][i]);
                kmax[i] = fmaxf(kmax[i], keys[p][r][i]);
            }
        ks_kv_bounds8_encode(kmin, kmax, H2, pg[p]);
        pp[p] = pg[p];
    }
    ks_simd_level hw = ks_simd_detect(), saved = ks_simd_force(hw);
    float out[G * NP], red[NP];
    for (int lv = KS_SIMD_SCALAR; lv <= (int)hw; lv++) {
        ks_simd_force((ks_simd_level)lv);
        ks_page_upper_bounds8_pages(q, G, pp, NP, H2, out, red);
        float red2[NP]; /* the group max alone (a path of its own on AVX-512): the same */
        ks_page_upper_bounds8_pages(q, G, pp, NP, H2, NULL, red2);
        assert_memory_equal(red, red2, sizeof red);
        for (int p = 0; p < NP; p++) {
            float top = -INFINITY;
            bounds8_decode(pg[p], H2, lo, hi);
            for (int g = 0; g < G; g++) {
                double ref = 0, mag = 0;
                for (int i = 0; i < H2; i++) {
                    double x = q[g * H2 + i];
                    ref += x > 0 ? x * hi[i] : x * lo[i];
                    mag += fabs(x) * fmax(fabs(lo[i]), fabs(hi[i]));
                }
                if (fabs(out[g * NP + p] - ref) > 1e-5 * mag)
                    fail_msg("level %d, page %d, head %d: bound %.9g, want %.9g", lv, p, g, out[g * NP + p], ref);
                for (int r = 0; r < 8; r++) {
                    double dot = 0;
                    for (int i = 0; i < H2; i++) dot += (double)q[g * H2 + i] * keys[p][r][i];
                    if (out[g * NP + p] < dot - 1e-5 * mag)
                        fail_msg("level %d, page %d, head %d: bound %.9g below key %d's score %.9g", lv, p, g,
                                 out[g * NP + p], r, dot);
                }
                top = fmaxf(top, out[g * NP + p]);
            }
            if (red[p] != top) fail_msg("level %d: group max of page %d %.9g, want %.9g", lv, p, red[p], top);
        }
    }
    ks_simd_force(saved);
}

static void test_h2o_keeps_heavy_hitters(void **state) {
    (void)state;
    fake_svc f = {0};
    make_kv(&f, NULL, 0);
    ks_policy *pol = make_policy(&f, "h2o", 9, NULL);
    float q[NQ * HD] = {0};
    ks_select_req r = req_for(q, 3);
    int32_t entries[40];
    float w[40];
    for (int e = 0; e < 40; e++) {
        entries[e] = e;
        w[e] = (e == 7 || e == 19 || e == 30) ? 0.3f : 0.001f;
    }
    ks_policy_after_attention(pol, &r, entries, w, 40);
    int32_t idx[CTX];
    ks_selection sel = {.cap = CTX, .idx = idx};
    assert_int_equal(ks_policy_select(pol, &r, &sel), KS_OK);
    assert_false(sel.pages);
    assert_int_equal(sel.n, 3);
    int seen = 0;
    for (int i = 0; i < 3; i++) seen |= (idx[i] == 7) << 0 | (idx[i] == 19) << 1 | (idx[i] == 30) << 2;
    assert_int_equal(seen, 7);
    ks_policy_seq_reset(pol, 0);
    ks_policy_destroy(pol);
    ks_kv_destroy(f.kv);
}

static void test_streaming_window(void **state) {
    (void)state;
    fake_svc f = {0};
    make_kv(&f, NULL, 0);
    ks_policy *pol = make_policy(&f, "streaming", 12, NULL);
    int32_t idx[CTX];
    ks_selection sel = {.cap = CTX, .idx = idx};
    ks_select_req r = req_for(NULL, 6);
    assert_int_equal(ks_policy_select(pol, &r, &sel), KS_OK);
    assert_int_equal(sel.n, 6);
    for (int i = 0; i < 6; i++) assert_int_equal(idx[i], 30 + i); /* just before the window [36, 40) */
    ks_policy_destroy(pol);
    ks_kv_destroy(f.kv);
}

static void test_snapkv_keeps_attended(void **state) {
    (void)state;
    fake_svc f = {0};
    int hot[] = {12, 25};
    make_kv(&f, hot, 2);
    ks_policy *pol = make_policy(&f, "snapkv", 12, "obs=4,pool=1");
    /* observation queries [n_layer=1][n_obs=4][NQ*HD], all looking along dim 0 */
    float obs[4 * NQ * HD] = {0};
    for (int r = 0; r < 4; r++)
        for (int g = 0; g < NQ; g++) obs[(r * NQ + g) * HD] = 2.0f;
    ks_prefill_info info = {.seq = 0, .n_prompt = 40, .n_obs = 4, .obs_q = obs};
    assert_int_equal(ks_policy_on_prefill(pol, &info), KS_OK);
    assert_int_equal(f.evicted, 1);
    assert_true(f.keep[12] && f.keep[25]);          /* the attended entries */
    assert_true(f.keep[0] && f.keep[1]);            /* sinks */
    for (int e = 36; e < 40; e++) assert_true(f.keep[e]); /* the observation window */
    int kept = 0;
    for (int e = 0; e < 40; e++) kept += f.keep[e];
    assert_int_equal(kept, 12);
    assert_int_equal(ks_kv_n_entries(f.kv, 0, 0, 0), 12);
    ks_kv_page_meta m;
    ks_kv_page_meta_get(f.kv, 0, 0, 0, 0, &m);
    assert_int_equal(m.pos[0], 0); /* positions travel with their rows */
    ks_policy_destroy(pol);
    ks_kv_destroy(f.kv);
}


/* qsort order of indices: value descending (NaN last), then index ascending */
static const float *g_topk_vals;
static int cmp_desc_index(const void *a, const void *b) {
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    float x = g_topk_vals[i] != g_topk_vals[i] ? -INFINITY : g_topk_vals[i];
    float y = g_topk_vals[j] != g_topk_vals[j] ? -INFINITY : g_topk_vals[j];
    if (x != y) return x > y ? -1 : 1;
    return (i > j) - (i < j);
}

/* The draft model shipped beside a model (MODEL.gguf -> MODEL-dlm/) is added
 * for the policies the registry says need one, by that answer alone. */
static void test_spec_draft_beside(void **state) {
    (void)state;
    char model[300], dlm[320], cfg[340];
    snprintf(model, sizeof model, "%s/m.gguf", g_dir);
    snprintf(dlm, sizeof dlm, "%s/m-dlm", g_dir);
    snprintf(cfg, sizeof cfg, "%s/config.json", dlm);
    ks_policy_spec sp, out;
    assert_int_equal(ks_policy_spec_parse("spec", "kcache=f16", 64, 4, 64, -1, &sp), KS_OK);
    ks_policy_spec_add_draft(&sp, model, &out); /* nothing beside it yet */
    assert_string_equal(out.args, "kcache=f16");
    assert_int_equal(mkdir(dlm, 0700), 0);
    FILE *f = fopen(cfg, "w");
    assert_non_null(f);
    fclose(f);
    char want[400];
    snprintf(want, sizeof want, "kcache=f16,dlm=%s", dlm);
    ks_policy_spec_add_draft(&sp, model, &out);
    assert_string_equal(out.args, want);
    assert_true(ks_policy_spec_equal(&sp, &sp) && !ks_policy_spec_equal(&sp, &out));
    assert_int_equal(ks_policy_spec_parse("dapq+spec", NULL, 64, 4, 64, -1, &sp), KS_OK);
    ks_policy_spec_add_draft(&sp, model, &sp); /* in place */
    snprintf(want, sizeof want, "dlm=%s", dlm);
    assert_string_equal(sp.args, want);
    assert_int_equal(ks_policy_spec_parse("spec", "dlm=elsewhere", 64, 4, 64, -1, &sp), KS_OK);
    ks_policy_spec_add_draft(&sp, model, &out); /* the user's draft stays */
    assert_string_equal(out.args, "dlm=elsewhere");
    assert_int_equal(ks_policy_spec_parse("quest", NULL, 64, 4, 64, -1, &sp), KS_OK);
    ks_policy_spec_add_draft(&sp, model, &out); /* no draft for a policy that needs none */
    assert_string_equal(out.args, "");
    unlink(cfg);
    rmdir(dlm);
}

static void test_helpers(void **state) {
    (void)state;
    float x[] = {1, 5, 3, 5, -1, 2};
    int32_t idx[6];
    assert_int_equal(ks_topk(x, 6, 2, idx), 2);
    assert_true((idx[0] == 1 && idx[1] == 3) || (idx[0] == 3 && idx[1] == 1)); /* ties: lower index first */
    assert_int_equal(ks_topk(x, 6, 3, idx), 3);
    int has2 = 0;
    for (int i = 0; i < 3; i++) has2 |= idx[i] == 2;
    assert_true(has2);
    assert_int_equal(ks_topk(x, 6, 10, idx), 6);
    float tie[] = {1, 1, 1, 1};
    assert_int_equal(ks_topk(tie, 4, 2, idx), 2);
    assert_true((idx[0] == 0 && idx[1] == 1) || (idx[0] == 1 && idx[1] == 0));
    /* the O(n) path (large k): same set as sorting by (value desc, index asc), ties and NaN included */
    {
        enum { N = 5000, K = 300 };
        static float v[N];
        static int32_t got[N];
        static uint8_t in[N];
        ks_rng r = {99};
        for (int i = 0; i < N; i++) v[i] = (float)(int)(ks_rng_uniform(&r) * 200) / 10.0f; /* many ties */
        v[17] = NAN;
        for (int i = 0; i < N; i += 7) v[i] = i % 2 ? -0.0f : 0.0f; /* signed zeros tie */
        for (int i = 3; i < N; i += 11) v[i] = -v[i];
        assert_int_equal(ks_topk(v, N, K, got), K);
        memset(in, 0, sizeof in);
        for (int i = 0; i < K; i++) in[got[i]] = 1;
        int chosen = 0;
        for (int pass = 0; pass < N && chosen < K; pass++) { /* brute force: repeatedly the best remaining */
            int best = -1;
            for (int i = 0; i < N; i++) {
                float vi = v[i] != v[i] ? -INFINITY : v[i];
                if (in[i] == 2) continue;
                if (best < 0 || vi > (v[best] != v[best] ? -INFINITY : v[best])) best = i;
            }
            if (!in[best]) fail_msg("topk missed index %d", best);
            in[best] = 2;
            chosen++;
        }
        /* with the caller's scratch (spec, quest): the same indices in the same order */
        static float scratch[N];
        static int32_t got2[N];
        for (int k = 1; k <= K; k += K - 1) {
            assert_int_equal(ks_topk(v, N, k, got), k);
            assert_int_equal(ks_topk_scratch(v, N, k, got2, scratch), k);
            assert_memory_equal(got, got2, sizeof(int32_t) * (size_t)k);
        }
    }
    /* k far below n (the sampled threshold: Quest's pages, spec's tokens), at every SIMD level: exactly
     * the first k of the order (value desc, index asc), in index order; distinct values, ties, and ties at
     * the threshold */
    {
        static const int32_t shapes[][2] = {{1024, 62}, {512, 30}, {32768, 1980}, {4096, 8}};
        static float v[32768];
        static int32_t got[32768], order[32768];
        static uint8_t want[32768];
        ks_simd_level hw = ks_simd_detect(), saved = ks_simd_current();
        for (int sh = 0; sh < 4; sh++)
            for (int kind = 0; kind < 3; kind++)
                for (int lv = KS_SIMD_SCALAR; lv <= (int)hw; lv++) {
                    ks_simd_force((ks_simd_level)lv);
                    int32_t n = shapes[sh][0], k = shapes[sh][1];
                    ks_rng r = {(uint64_t)(7 + sh * 3 + kind)};
                    for (int32_t i = 0; i < n; i++) {
                        float u = ks_rng_uniform(&r);
                        v[i] = kind == 0 ? u * 10 - 3 : kind == 1 ? (float)(int)(u * 40) : (u < 0.9f ? u : 0.95f);
                    }
                    v[5] = NAN;
                    for (int32_t i = 0; i < n; i++) order[i] = i;
                    g_topk_vals = v;
                    qsort(order, (size_t)n, sizeof(int32_t), cmp_desc_index);
                    memset(want, 0, (size_t)n);
                    for (int32_t i = 0; i < k; i++) want[order[i]] = 1;
                    assert_int_equal(ks_topk(v, n, k, got), k);
                    for (int32_t i = 0; i < k; i++) {
                        if (!want[got[i]]) fail_msg("top %d of %d (kind %d, level %d): index %d", k, n, kind, lv, got[i]);
                        if (i && got[i] <= got[i - 1]) fail_msg("top %d of %d: not in index order", k, n);
                    }
                }
        ks_simd_force(saved);
    }
    float q[2] = {1, -1}, mn[2] = {-2, -3}, mx[2] = {3, 1};
    assert_true(fabsf(ks_page_upper_bound(q, mn, mx, 2) - 6.0f) < 1e-6f);
    { /* the SIMD bound (hd >= 16, with a tail) against a double-precision sum at every level */
        enum { D = 72 };
        float qq[D], lo[D], hi[D];
        double want = 0;
        for (int i = 0; i < D; i++) {
            qq[i] = sinf(0.37f * (float)i) * 2.0f;
            lo[i] = cosf(0.11f * (float)i) - 1.0f;
            hi[i] = lo[i] + 0.5f + 0.25f * (float)(i % 5);
            double a = (double)qq[i] * lo[i], b = (double)qq[i] * hi[i];
            want += a > b ? a : b;
        }
        ks_simd_level hw = ks_simd_detect(), saved = ks_simd_force(hw);
        for (int lv = KS_SIMD_SCALAR; lv <= (int)hw; lv++) {
            ks_simd_force((ks_simd_level)lv);
            float got = ks_page_upper_bound(qq, lo, hi, D);
            if (fabs(got - want) > 1e-4 * (1 + fabs(want))) fail_msg("page bound level %d: %g, want %g", lv, got, want);
        }
        ks_simd_force(saved);
        /* a group's bounds in one pass: bit for bit the per-head bound, at every level */
        enum { NG = 9 };
        float qg[NG * D], got[NG * 2];
        for (int i = 0; i < NG * D; i++) qg[i] = sinf(0.23f * (float)i + 1.0f) * 1.5f;
        for (int lv = KS_SIMD_SCALAR; lv <= (int)hw; lv++) {
            ks_simd_force((ks_simd_level)lv);
            for (int d = 16; d <= D; d += D - 16) /* a head dim without and with a tail */
                for (int G = 1; G <= NG; G += 4) {
                    ks_page_upper_bounds(qg, G, lo, hi, d, got, 2);
                    for (int g = 0; g < G; g++) {
                        float one = ks_page_upper_bound(qg + g * d, lo, hi, d);
                        if (memcmp(&one, &got[2 * g], sizeof one))
                            fail_msg("group bound level %d, hd %d, head %d of %d: %.9g, per head %.9g", lv, d, g, G,
                                     got[2 * g], one);
                    }
                }
        }
        /* from f16 bounds (an f16 cache's store keeps them): the f32 path's bits over the same values */
        uint16_t b16[2 * D];
        float lo16[D], hi16[D], got16[NG * 2];
        for (int i = 0; i < D; i++) {
            b16[i] = ks_f32_to_f16(lo[i]);
            b16[D + i] = ks_f32_to_f16(hi[i]);
            lo16[i] = ks_f16_to_f32(b16[i]);
            hi16[i] = ks_f16_to_f32(b16[D + i]);
        }
        for (int lv = KS_SIMD_SCALAR; lv <= (int)hw; lv++) {
            ks_simd_force((ks_simd_level)lv);
            for (int G = 1; G <= NG; G += 4) {
                uint16_t bd[2 * D]; /* [2][d] for d = D and for d = 16 */
                for (int d = 16; d <= D; d += D - 16) {
                    memcpy(bd, b16, sizeof(uint16_t) * d);
                    memcpy(bd + d, b16 + D, sizeof(uint16_t) * d);
                    ks_page_upper_bounds16(qg, G, bd, d, got16, 2);
                    ks_page_upper_bounds(qg, G, lo16, hi16, d, got, 2);
                    for (int g = 0; g < G; g++)
                        if (memcmp(&got[2 * g], &got16[2 * g], sizeof(float)))
                            fail_msg("f16 bounds level %d, hd %d, head %d of %d: %.9g, f32 path %.9g", lv, d, g, G,
                                     got16[2 * g], got[2 * g]);
                }
            }
        }
        /* many pages in one call (Quest's scoring): the per-page bounds up to rounding, any page count */
        enum { NP = 7 };
        uint16_t pg[NP][2 * 64];
        const uint16_t *pp[NP];
        float many[NG * NP], one[NG], red[NP];
        for (int p = 0; p < NP; p++) {
            for (int i = 0; i < 64; i++) { /* min <= max, as the store keeps them */
                float kmin = sinf(0.7f * (float)(p * 64 + i));
                pg[p][i] = ks_f32_to_f16(kmin);
                pg[p][64 + i] = ks_f32_to_f16(kmin + 0.5f + 0.5f * cosf(0.3f * (float)i));
            }
            pp[p] = pg[p];
        }
        for (int lv = KS_SIMD_SCALAR; lv <= (int)hw; lv++) {
            ks_simd_force((ks_simd_level)lv);
            for (int G = 1; G <= NG; G += 4)
                for (int np = 1; np <= NP; np += 3) {
                    ks_page_upper_bounds16_pages(qg, G, pp, np, 64, many, red);
                    float red2[NP];
                    ks_page_upper_bounds16_pages(qg, G, pp, np, 64, NULL, red2); /* the max alone: the same */
                    assert_memory_equal(red, red2, sizeof(float) * (size_t)np);
                    for (int p = 0; p < np; p++) {
                        ks_page_upper_bounds16(qg, G, pp[p], 64, one, 1);
                        float top = -INFINITY;
                        for (int g = 0; g < G; g++) {
                            if (fabsf(many[g * np + p] - one[g]) > 1e-5f * (1 + fabsf(one[g])))
                                fail_msg("bounds of %d pages, level %d, G %d, page %d head %d: %.9g, per page %.9g",
                                         np, lv, G, p, g, many[g * np + p], one[g]);
                            top = many[g * np + p] > top ? many[g * np + p] : top;
                        }
                        if (red[p] != top) fail_msg("group max of page %d, level %d, G %d: %.9g, want %.9g", p, lv, G, red[p], top);
                    }
                }
        }
        ks_simd_force(saved);
    }
    float sc[2 * 3] = {0, 1, 2, 2, 1, 0}, out[3];
    ks_group_reduce_scores(sc, 2, 3, KS_GROUP_MAX, out);
    assert_true(out[0] == 2 && out[1] == 1 && out[2] == 2);
    ks_group_reduce_scores(sc, 2, 3, KS_GROUP_MEAN, out);
    assert_true(out[0] == 1 && out[1] == 1 && out[2] == 1);
    ks_group_reduce_scores(sc, 2, 3, KS_GROUP_SOFTMAX_MEAN, out);
    assert_true(fabsf(out[0] + out[1] + out[2] - 1.0f) < 1e-6f);
    int64_t v;
    double d;
    char s[16];
    assert_int_equal(ks_args_int("a=3,b=x", "a", 0, 0, 10, &v), KS_OK);
    assert_int_equal(v, 3);
    assert_int_equal(ks_args_int("a=3,b=x", "c", 7, 0, 10, &v), KS_OK);
    assert_int_equal(v, 7);
    assert_int_equal(ks_args_int("a=30", "a", 0, 0, 10, &v), KS_ERR_INVALID_ARG);
    assert_int_equal(ks_args_int("a=3x", "a", 0, 0, 10, &v), KS_ERR_INVALID_ARG);
    assert_int_equal(ks_args_float("tau=0.8", "tau", 0.9, 0, 1, &d), KS_OK);
    assert_true(d == 0.8);
    assert_int_equal(ks_args_str("group=mean", "group", "max", s, sizeof s), KS_OK);
    assert_string_equal(s, "mean");
    /* the one parser: keys checked against the chain's parts, k=v syntax */
    ks_policy_spec sp;
    assert_int_equal(ks_policy_spec_parse("quest", "group=max,b=2", 0, 4, 64, -1, &sp), KS_ERR_INVALID_ARG);
    assert_int_equal(ks_policy_spec_parse("quest", "group", 0, 4, 64, -1, &sp), KS_ERR_INVALID_ARG);
    assert_int_equal(ks_policy_spec_parse("quest", "group=max", 0, 4, 64, -1, &sp), KS_OK);
    assert_int_equal(ks_policy_spec_parse("snapkv+quest", "obs=8,group=mean", 0, 4, 64, -1, &sp), KS_OK);
    assert_int_equal(sp.n_parts, 2);
    assert_string_equal(ks_policy_spec_part(&sp, 0)->name, "snapkv");
    assert_string_equal(ks_policy_spec_part(&sp, 1)->name, "quest");
    assert_int_equal(ks_policy_spec_parse("quest+snapkv", NULL, 0, 4, 64, -1, &sp), KS_ERR_INVALID_ARG);
    assert_int_equal(ks_policy_spec_parse("snapkv+nope", NULL, 0, 4, 64, -1, &sp), KS_ERR_NOT_FOUND);
    assert_int_equal(ks_policy_spec_parse("quest", NULL, -1, 4, 64, -1, &sp), KS_ERR_INVALID_ARG);
    assert_true(ks_policy_args_valid("a=1,b=2") && ks_policy_args_valid("") && ks_policy_args_valid(NULL));
    assert_false(ks_policy_args_valid("a=1,") || ks_policy_args_valid("a=1,,b=2") || ks_policy_args_valid("=1"));
    char scoped[64] = "";
    assert_int_equal(ks_policy_args_scope("snapkv+quest", "obs=8,quest.group=mean,chess.grid=2,x=1", false, scoped,
                                          sizeof scoped), KS_OK);
    assert_string_equal(scoped, "obs=8,group=mean");
    /* what a policy needs is the registry's answer, not its name */
    assert_int_equal(ks_policy_spec_parse("dapq+spec", NULL, 0, 4, 64, -1, &sp), KS_OK);
    assert_true(ks_policy_spec_needs_dlm(&sp) && !ks_policy_spec_chunkable(&sp));
    assert_int_equal(ks_policy_spec_parse("quest", NULL, 0, 4, 64, -1, &sp), KS_OK);
    assert_true(!ks_policy_spec_needs_dlm(&sp) && ks_policy_spec_chunkable(&sp));
    assert_true(ks_policy_count() >= 6);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_budget_equals_dense_gqa), cmocka_unit_test(test_full_budget_equals_dense_mha),
        cmocka_unit_test(test_full_budget_equals_dense_gemma3),
        cmocka_unit_test(test_full_budget_equals_dense_gptoss),
        cmocka_unit_test(test_sparse_differs_and_counts),    cmocka_unit_test(test_bad_policy_args),
        cmocka_unit_test(test_quest_finds_the_page),         cmocka_unit_test(test_h2o_keeps_heavy_hitters),
        cmocka_unit_test(test_streaming_window),             cmocka_unit_test(test_snapkv_keeps_attended),
        cmocka_unit_test(test_helpers),                      cmocka_unit_test(test_spec_draft_beside),
        cmocka_unit_test(test_bounds8),                      cmocka_unit_test(test_turnover_probe),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
