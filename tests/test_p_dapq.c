/*
 * test_p_dapq.c — the `dapq` evictor (position-aware pseudo queries).
 *
 * 1. Pseudo-token choice: the first n_head_tokens and the last
 *    n_pseudo - n_head_tokens prompt tokens (4 + 28 by default), clipped for
 *    short prompts, the framework's cap and the room left in the context;
 *    none when nothing can be evicted; bad arguments refused; the room a
 *    context needs for all of them (ks_policy_prefill_room).
 * 2. On real models (the generated GQA tiny-llama, whose head dim takes the
 *    AVX-512 kernel, and the MHA aidreams260K): after a prefill with dapq
 *    every KV head holds exactly `budget` entries, their positions are a
 *    strictly increasing subset of 0..L_p-1 that starts with the sinks (so
 *    no pseudo token survived), ks_seq_len stays L_p, and the next decode
 *    step appends position L_p.  Also composed with quest and h2o.
 * 3. The pseudo-token round trip alone is invisible (dapq and dapq+quest): a sequence whose heads
 *    fit the budget (pseudo tokens run because another sequence is longer)
 *    decodes bit for bit like dense.  (budget >= context == dense for dapq
 *    and dapq+quest is in test_policy.c's check_equal_dense.)
 * 4. Hand-made KV with a fake env: the entries the pseudo queries attend to
 *    are kept (alone with pool=1, with their pooled neighbourhood with
 *    pool=5), sinks and keep_recent are kept, non-pseudo prefills evict
 *    nothing.
 * 5. The paper's keys in scope: with the pseudo KV still in the head
 *    (info->n_pseudo), pseudo row i's softmax covers [0, L_p + i] (the limit
 *    reaches attn_probs, columns beyond get nothing, each head sums to 1),
 *    a query that looks mostly at its own pseudo key gives the prompt little,
 *    which changes the kept entry against a prompt-only normaliser; only
 *    prompt entries are evicted and the pseudo entries stay last.
 * 6. The engine's attn_probs with a per-row key limit equals a direct
 *    softmax(q k^T / sqrt(d)) over the stored keys [0, m), limits inside
 *    pages and at their boundaries; no limit == a limit of n, bit for bit.
 */
#define _GNU_SOURCE
#include "infer/infer.h"
#include "gguf/gguf.h"
#include "model/shapes.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static ks_model *g_gqa, *g_mha;
static char g_path[256];

static int setup(void **state) {
    (void)state;
    snprintf(g_path, sizeof g_path, "/tmp/kvsieve-test-dapq-%d.gguf", (int)getpid());
    ks_gguf *vocab = NULL;
    if (ks_gguf_open(ks_test_fixture("models/aidreams260K.gguf"), &vocab) != KS_OK) return -1;
    ks_shape_gen_params gp = {.type = KS_DTYPE_F16, .vocab = vocab, .seed = 5, .n_layer = 3, .n_ctx = 512};
    ks_status st = ks_shape_generate(ks_shape_find("tiny-llama"), &gp, g_path, NULL);
    ks_gguf_close(vocab);
    if (st != KS_OK) return -1;
    if (ks_model_load(g_path, ks_model_default_params(), &g_gqa) != KS_OK) return -1;
    if (ks_model_load(ks_test_fixture("models/aidreams260K.gguf"), ks_model_default_params(), &g_mha) != KS_OK) return -1;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    ks_model_destroy(g_gqa);
    ks_model_destroy(g_mha);
    unlink(g_path);
    return 0;
}

/* ------------------------------------------------------- fake env & KV -- */
enum { HD = 8, NKV = 1, NQ = 2, CTX = 128, PG = 4, NE = 40 };

typedef struct {
    ks_kv_store *kv;
    uint8_t keep[CTX];
    int evicted;
    int32_t n_keys[CTX]; /* the last attn_probs call's per-row key limits (-1: none given) */
} fake_svc;

static ks_status fake_probs(void *svc, int32_t seq, int32_t layer, int32_t head, const float *q, int32_t nq,
                            const int32_t *n_keys, float *acc) {
    fake_svc *f = svc;
    int32_t n = ks_kv_n_entries(f->kv, seq, layer, head);
    for (int32_t r = 0; r < nq && r < CTX; r++) f->n_keys[r] = n_keys ? n_keys[r] : -1;
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

/* NE entries of small noise keys; entries in `hot` get a large key along dim 0 */
static void make_kv(fake_svc *f, const int *hot, int n_hot) {
    ks_kv_params kp = ks_kv_default_params();
    kp.n_layer = 1;
    kp.n_head_kv = NKV;
    kp.head_dim = HD;
    kp.n_ctx = CTX;
    kp.page = PG;
    assert_int_equal(ks_kv_create(&kp, &f->kv), KS_OK);
    for (int e = 0; e < NE; e++) {
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

static ks_status make_policy_ctx(fake_svc *f, const char *name, int32_t budget, const char *args, int32_t n_ctx,
                                 ks_policy **pol) {
    ks_policy_env env = {.n_layer = 1, .n_head = NQ, .n_head_kv = NKV, .head_dim = HD, .n_seq = 1, .n_ctx = n_ctx,
                         .kv = f->kv, .svc = f, .attn_probs = fake_probs, .evict = fake_evict};
    return ks_test_policy_create(name, args, budget, 2, 4, -1, &env, pol);
}

static ks_policy *make_policy(fake_svc *f, const char *name, int32_t budget, const char *args) {
    ks_policy *pol = NULL;
    assert_int_equal(make_policy_ctx(f, name, budget, args, CTX, &pol), KS_OK);
    return pol;
}

/* ------------------------------------------------------- pseudo tokens -- */
static void test_pseudo_choice(void **state) {
    (void)state;
    fake_svc f = {0};
    make_kv(&f, NULL, 0); /* the prompt (NE tokens) is in the store, as when the framework asks */
    int32_t prompt[NE], out[CTX];
    for (int i = 0; i < NE; i++) prompt[i] = 100 + i;

    ks_policy *pol = make_policy(&f, "dapq", 12, NULL);
    assert_int_equal(ks_policy_pseudo_tokens(pol, prompt, NE, out, CTX), 32);
    for (int i = 0; i < 4; i++) assert_int_equal(out[i], 100 + i);          /* the first 4 */
    for (int i = 0; i < 28; i++) assert_int_equal(out[4 + i], 100 + 12 + i); /* the last 28 */
    /* short prompts: all of it, once, in order */
    assert_int_equal(ks_policy_pseudo_tokens(pol, prompt, 10, out, CTX), 10);
    for (int i = 0; i < 10; i++) assert_int_equal(out[i], 100 + i);
    assert_int_equal(ks_policy_pseudo_tokens(pol, prompt, 3, out, CTX), 3);
    for (int i = 0; i < 3; i++) assert_int_equal(out[i], 100 + i);
    /* the framework's cap: 4 + 4 */
    assert_int_equal(ks_policy_pseudo_tokens(pol, prompt, NE, out, 8), 8);
    for (int i = 0; i < 4; i++) assert_int_equal(out[i], 100 + i);
    for (int i = 0; i < 4; i++) assert_int_equal(out[4 + i], 100 + 36 + i);
    ks_policy_destroy(pol);

    /* composed: the evictor's pseudo tokens */
    pol = make_policy(&f, "dapq+quest", 12, "n_pseudo=16,n_head_tokens=2");
    assert_int_equal(ks_policy_pseudo_tokens(pol, prompt, NE, out, CTX), 16);
    assert_int_equal(out[0], 100);
    assert_int_equal(out[1], 101);
    for (int i = 0; i < 14; i++) assert_int_equal(out[2 + i], 100 + 26 + i);
    ks_policy_destroy(pol);

    /* the room left in the context: NE entries in a context of NE + 10 */
    assert_int_equal(make_policy_ctx(&f, "dapq", 12, NULL, NE + 10, &pol), KS_OK);
    assert_int_equal(ks_policy_pseudo_tokens(pol, prompt, NE, out, CTX), 10);
    for (int i = 0; i < 4; i++) assert_int_equal(out[i], 100 + i);
    for (int i = 0; i < 6; i++) assert_int_equal(out[4 + i], 100 + 34 + i);
    ks_policy_destroy(pol);
    assert_int_equal(make_policy_ctx(&f, "dapq", 12, NULL, NE, &pol), KS_OK);
    assert_int_equal(ks_policy_pseudo_tokens(pol, prompt, NE, out, CTX), 0); /* full: none */
    ks_policy_destroy(pol);

    /* nothing to evict: no pseudo tokens at all */
    pol = make_policy(&f, "dapq", 0, NULL);
    assert_int_equal(ks_policy_pseudo_tokens(pol, prompt, NE, out, CTX), 0);
    ks_policy_destroy(pol);
    pol = make_policy(&f, "dapq", NE, NULL);
    assert_int_equal(ks_policy_pseudo_tokens(pol, prompt, NE, out, CTX), 0);
    ks_policy_destroy(pol);
    pol = make_policy(&f, "dapq", NE - 1, NULL);
    assert_int_equal(ks_policy_pseudo_tokens(pol, prompt, NE, out, CTX), 32);
    ks_policy_destroy(pol);

    /* arguments */
    assert_int_equal(make_policy_ctx(&f, "dapq", 12, "pool=4", CTX, &pol), KS_ERR_INVALID_ARG);
    assert_int_equal(make_policy_ctx(&f, "dapq", 12, "n_pseudo=8,n_head_tokens=9", CTX, &pol), KS_ERR_INVALID_ARG);
    assert_int_equal(make_policy_ctx(&f, "dapq", 12, "n_pseudo=0", CTX, &pol), KS_ERR_INVALID_ARG);
    assert_int_equal(make_policy_ctx(&f, "dapq", 12, "obs=8", CTX, &pol), KS_ERR_INVALID_ARG);
    assert_int_equal(make_policy_ctx(&f, "dapq", 12, "n_pseudo=8,n_head_tokens=0,pool=1,keep_recent=3", CTX, &pol),
                     KS_OK);
    assert_int_equal(ks_policy_pseudo_tokens(pol, prompt, NE, out, CTX), 8);
    for (int i = 0; i < 8; i++) assert_int_equal(out[i], 100 + 32 + i); /* all from the end */
    ks_policy_destroy(pol);
    assert_non_null(ks_policy_find("dapq"));
    ks_kv_destroy(f.kv);

    /* the room a context needs for all of them (the public ks_policy_prefill_room) */
    assert_int_equal(ks_policy_prefill_room("dapq", NULL), 32);
    assert_int_equal(ks_policy_prefill_room("dapq+quest", "n_pseudo=16,n_head_tokens=2"), 16);
    assert_int_equal(ks_policy_prefill_room("dapq+spec", "spec.dlm=x,n_pseudo=1024"), 1024);
    assert_int_equal(ks_policy_prefill_room("dapq", "n_pseudo=0"), 0); /* refused at create anyway */
    assert_int_equal(ks_policy_prefill_room("snapkv+quest", NULL), 0);
    assert_int_equal(ks_policy_prefill_room("dense", NULL), 0);
    assert_int_equal(ks_policy_prefill_room("nosuch", NULL), 0);
    assert_int_equal(ks_policy_prefill_room(NULL, NULL), 0);
}

/* ---------------------------------------------------- hand-made scoring -- */
/* pseudo queries [n_layer=1][4][NQ*HD], all looking along dim 0 */
static void pseudo_queries(float *obs) {
    memset(obs, 0, sizeof(float) * 4 * NQ * HD);
    for (int r = 0; r < 4; r++)
        for (int g = 0; g < NQ; g++) obs[(r * NQ + g) * HD] = 2.0f;
}

static int count_kept(const fake_svc *f) {
    int kept = 0;
    for (int e = 0; e < NE; e++) kept += f->keep[e];
    return kept;
}

static void test_keeps_attended(void **state) {
    (void)state;
    int hot[] = {12, 25};
    float obs[4 * NQ * HD];
    pseudo_queries(obs);
    ks_prefill_info info = {.seq = 0, .n_prompt = NE, .n_obs = 4, .obs_q = obs, .pseudo = true};

    /* default pool=1 (the paper's Eq. 5, a plain top-K of S): the two attended entries, the sinks, and the next best */
    fake_svc f = {0};
    make_kv(&f, hot, 2);
    ks_policy *pol = make_policy(&f, "dapq", 12, NULL);
    assert_int_equal(ks_policy_on_prefill(pol, &info), KS_OK);
    assert_int_equal(f.evicted, 1);
    assert_true(f.keep[12] && f.keep[25]);
    assert_true(f.keep[0] && f.keep[1]);
    assert_int_equal(count_kept(&f), 12);
    assert_int_equal(ks_kv_n_entries(f.kv, 0, 0, 0), 12);
    ks_kv_page_meta m;
    ks_kv_page_meta_get(f.kv, 0, 0, 0, 0, &m);
    assert_int_equal(m.pos[0], 0);
    ks_policy_destroy(pol);
    ks_kv_destroy(f.kv);

    /* pool=5 (SnapKV's clustering, an option): each attended entry brings its neighbourhood; no recent window by default */
    f = (fake_svc){0};
    make_kv(&f, hot, 2);
    pol = make_policy(&f, "dapq", 12, "pool=5");
    assert_int_equal(ks_policy_on_prefill(pol, &info), KS_OK);
    for (int e = 0; e < NE; e++) {
        bool want = e < 2 || (e >= 10 && e <= 14) || (e >= 23 && e <= 27);
        if ((bool)f.keep[e] != want) fail_msg("entry %d: kept %d, expected %d", e, f.keep[e], want);
    }
    ks_policy_destroy(pol);
    ks_kv_destroy(f.kv);

    /* keep_recent=4: the last 4 entries too, the rest by score */
    f = (fake_svc){0};
    make_kv(&f, hot, 2);
    pol = make_policy(&f, "dapq+h2o", 12, "pool=1,keep_recent=4");
    assert_int_equal(ks_policy_on_prefill(pol, &info), KS_OK);
    assert_true(f.keep[12] && f.keep[25] && f.keep[0] && f.keep[1]);
    for (int e = NE - 4; e < NE; e++) assert_true(f.keep[e]);
    assert_int_equal(count_kept(&f), 12);
    ks_policy_destroy(pol);
    ks_kv_destroy(f.kv);

    /* a budget below sink + keep_recent still keeps exactly `budget` */
    f = (fake_svc){0};
    make_kv(&f, hot, 2);
    pol = make_policy(&f, "dapq", 3, "keep_recent=8");
    assert_int_equal(ks_policy_on_prefill(pol, &info), KS_OK);
    assert_int_equal(count_kept(&f), 3);
    assert_true(f.keep[0] && f.keep[1] && f.keep[NE - 1]);
    ks_policy_destroy(pol);
    ks_kv_destroy(f.kv);

    /* no pseudo queries (e.g. they did not fit): nothing evicted; budget >= entries: nothing either */
    f = (fake_svc){0};
    make_kv(&f, hot, 2);
    pol = make_policy(&f, "dapq", 12, NULL);
    ks_prefill_info plain = info;
    plain.pseudo = false;
    assert_int_equal(ks_policy_on_prefill(pol, &plain), KS_OK);
    assert_int_equal(f.evicted, 0);
    ks_policy_destroy(pol);
    pol = make_policy(&f, "dapq", NE, NULL);
    assert_int_equal(ks_policy_on_prefill(pol, &info), KS_OK);
    assert_int_equal(f.evicted, 0);
    assert_int_equal(ks_kv_n_entries(f.kv, 0, 0, 0), NE);
    ks_policy_destroy(pol);
    ks_kv_destroy(f.kv);
}

/* The paper's keys in scope: pseudo query i attends over the prompt keys and
 * the pseudo keys [0, L_p + i] (causal), and the prompt columns are summed.
 * Row 0 looks at prompt entry 12 (moderately), row 1 at prompt entry 25 but
 * far more at its own pseudo key: with the pseudo keys in the normaliser
 * row 1 gives entry 25 almost nothing and 12 wins the one free slot; a
 * prompt-only normaliser (the old deviation) would pick 25. */
enum { NPS = 4 };
static void make_kv_pseudo(fake_svc *f, bool with_pseudo) {
    ks_kv_params kp = ks_kv_default_params();
    kp.n_layer = 1;
    kp.n_head_kv = NKV;
    kp.head_dim = HD;
    kp.n_ctx = CTX;
    kp.page = PG;
    assert_int_equal(ks_kv_create(&kp, &f->kv), KS_OK);
    for (int e = 0; e < NE + (with_pseudo ? NPS : 0); e++) {
        float k[HD], v[HD];
        for (int d = 0; d < HD; d++) {
            k[d] = 0.1f * sinf((float)(e * HD + d));
            v[d] = (float)e;
        }
        if (e == 12) k[0] = 3.0f;
        if (e == 25) k[1] = 3.0f;
        if (e == NE + 1) k[1] = 6.0f; /* row 1's own pseudo key */
        assert_int_equal(ks_kv_append(f->kv, 0, 0, 0, e, k, v), KS_OK);
    }
}

static void test_pseudo_keys_in_scope(void **state) {
    (void)state;
    float obs[NPS * NQ * HD];
    memset(obs, 0, sizeof obs);
    for (int g = 0; g < NQ; g++) {
        obs[(0 * NQ + g) * HD + 0] = 1.5f; /* row 0 -> entry 12 */
        obs[(1 * NQ + g) * HD + 1] = 2.0f; /* row 1 -> entry 25, and its own pseudo key */
    }                                      /* rows 2, 3: uniform over their scope */
    ks_prefill_info info = {.seq = 0, .n_prompt = NE, .n_obs = NPS, .obs_q = obs, .pseudo = true, .n_pseudo = NPS};

    /* the scores themselves: row i's softmax covers [0, NE + i], the rest untouched */
    fake_svc f = {0};
    make_kv_pseudo(&f, true);
    ks_policy_env env = {.n_layer = 1, .n_head = NQ, .n_head_kv = NKV, .head_dim = HD, .n_seq = 1, .n_ctx = CTX,
                         .kv = f.kv, .svc = &f, .attn_probs = fake_probs, .evict = fake_evict};
    float q[NPS * NQ * HD], acc[CTX];
    for (int r = 0; r < NPS; r++) {
        memset(acc, 0, sizeof acc);
        assert_int_equal(ks_policy_prefill_probs(&env, &info, r, 1, 0, 0, q, acc), KS_OK);
        assert_int_equal(f.n_keys[0], NE + r + 1);
        float sum = 0;
        for (int e = 0; e < NE + NPS; e++) {
            if (e > NE + r && acc[e] != 0) fail_msg("row %d: entry %d outside its scope got %g", r, e, acc[e]);
            sum += acc[e];
        }
        assert_true(fabsf(sum - (float)NQ) < 1e-4f); /* each head's softmax sums to 1 over its scope */
        if (r == 1) {
            assert_true(acc[25] < 0.01f * NQ);    /* the prompt key is outweighed by the pseudo key */
            assert_true(acc[NE + 1] > 0.98f * NQ);
        }
    }
    memset(acc, 0, sizeof acc); /* all rows at once: the same limits, row by row */
    assert_int_equal(ks_policy_prefill_probs(&env, &info, 0, NPS, 0, 0, q, acc), KS_OK);
    for (int r = 0; r < NPS; r++) assert_int_equal(f.n_keys[r], NE + r + 1);

    /* eviction: prompt entries only (sinks + the best one), the pseudo entries kept, last, for the engine to drop */
    ks_policy *pol = make_policy(&f, "dapq", 3, NULL);
    assert_int_equal(ks_policy_on_prefill_split(pol, &info, true), KS_OK);
    assert_int_equal(f.evicted, 1);
    assert_true(f.keep[0] && f.keep[1] && f.keep[12]);
    assert_false(f.keep[25]);
    for (int e = NE; e < NE + NPS; e++) assert_true(f.keep[e]);
    assert_int_equal(ks_kv_n_entries(f.kv, 0, 0, 0), 3 + NPS);
    ks_kv_page_meta m;
    ks_kv_page_meta_get(f.kv, 0, 0, 0, 0, &m);
    assert_int_equal(m.pos[2], 12);
    assert_int_equal(m.pos[3], NE); /* then the pseudo entries, in order */
    ks_policy_destroy(pol);
    ks_kv_destroy(f.kv);

    /* contrast: the same queries normalised over the prompt keys only (no pseudo KV) pick entry 25 */
    f = (fake_svc){0};
    make_kv_pseudo(&f, false);
    info.n_pseudo = 0;
    pol = make_policy(&f, "dapq", 3, NULL);
    assert_int_equal(ks_policy_on_prefill(pol, &info), KS_OK);
    assert_int_equal(f.n_keys[0], -1);
    assert_true(f.keep[25]);
    assert_false(f.keep[12]);
    ks_policy_destroy(pol);
    ks_kv_destroy(f.kv);
}

/* ------------------------------------------------------- real models -- */
static ks_context *make_ctx(ks_model *m, const char *policy, int32_t budget, int32_t n_ctx, int32_t n_seq) {
    ks_context_params p = ks_context_default_params();
    p.n_ctx = n_ctx;
    p.n_seq = n_seq;
    p.n_threads = 2;
    p.n_batch = 64;
    p.policy = policy;
    p.budget = budget;
    p.page = 8;
    p.sink = 4;
    p.window = 8;
    ks_context *c = NULL;
    assert_int_equal(ks_context_create(m, p, &c), KS_OK);
    return c;
}

static void fill_prompt(int32_t *prompt, int n, int s, int32_t V) {
    for (int i = 0; i < n; i++) prompt[i] = (int32_t)((i * 37 + s * 101 + 11) % V);
}

/* Every head of seq holds n entries: sinks first, strictly increasing
 * positions below `below`, the newest at `last` (when >= 0). */
static void check_heads(ks_context *c, int32_t seq, int32_t n, int32_t below, int32_t last) {
    const ks_hparams *hp = &c->model->hp;
    for (int32_t l = 0; l < hp->n_layer; l++)
        for (int32_t h = 0; h < hp->n_head_kv; h++) {
            if (ks_kv_n_entries(c->kv, seq, l, h) != n)
                fail_msg("layer %d head %d: %d entries, expected %d", l, h, ks_kv_n_entries(c->kv, seq, l, h), n);
            int32_t prev = -1, e = 0;
            for (int32_t lp = 0; lp < ks_kv_n_pages(c->kv, seq, l, h); lp++) {
                ks_kv_page_meta meta;
                ks_kv_page_meta_get(c->kv, seq, l, h, lp, &meta);
                for (int32_t i = 0; i < meta.fill; i++, e++) {
                    int32_t pos = meta.pos[i];
                    if (pos <= prev || pos >= below)
                        fail_msg("layer %d head %d entry %d: position %d (previous %d, bound %d)", l, h, e, pos, prev,
                                 below);
                    if (e < c->params.sink) assert_int_equal(pos, e); /* the sinks */
                    prev = pos;
                }
            }
            assert_int_equal(e, n);
            if (last >= 0) assert_int_equal(prev, last);
        }
}

static void run_real(ks_model *m, const char *policy, int n_prompt, int32_t budget) {
    const int steps = 3;
    int32_t V = m->hp.n_vocab;
    ks_context *c = make_ctx(m, policy, budget, n_prompt + 32 + steps, 1);
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)n_prompt);
    float *logits = malloc(sizeof(float) * (size_t)V);
    fill_prompt(prompt, n_prompt, 0, V);
    assert_int_equal(ks_prefill(c, 0, prompt, n_prompt, logits, NULL), KS_OK);
    assert_int_equal(ks_seq_len(c, 0), n_prompt);
    check_heads(c, 0, budget, n_prompt, -1); /* only prompt positions: no pseudo token survived */
    for (int t = 0; t < steps; t++) {
        int32_t seq = 0, tok = 0;
        for (int32_t j = 1; j < V; j++) tok = logits[j] > logits[tok] ? j : tok;
        assert_int_equal(ks_decode(c, &seq, &tok, 1, logits), KS_OK);
        for (int32_t j = 0; j < V; j++) assert_true(isfinite(logits[j]));
        /* the decoded token went in at L_p + t, right after the (compressed) prompt */
        check_heads(c, 0, budget + t + 1, n_prompt + t + 1, n_prompt + t);
        assert_int_equal(ks_seq_len(c, 0), n_prompt + t + 1);
    }
    free(prompt);
    free(logits);
    ks_context_destroy(c);
}

static void test_real_gqa(void **state) {
    (void)state;
    run_real(g_gqa, "dapq", 150, 40);
    run_real(g_gqa, "dapq+quest", 150, 40);
    run_real(g_gqa, "dapq+h2o", 150, 64);
}

static void test_real_mha(void **state) {
    (void)state;
    run_real(g_mha, "dapq", 90, 24);
    run_real(g_mha, "dapq+quest", 90, 45);
}

/* The engine's attn_probs with a per-row key limit against a direct
 * computation from the stored keys: row r's softmax(q k^T / sqrt(d)) over
 * entries [0, m) only (limits inside and at page boundaries, and none). */
static void test_attn_probs_key_limit(void **state) {
    (void)state;
    ks_model *mdl = g_gqa;
    const ks_hparams *hp = &mdl->hp;
    int32_t G = hp->n_head / hp->n_head_kv, hd = hp->head_dim, V = hp->n_vocab;
    enum { N = 37 };
    ks_context *c = make_ctx(mdl, "dense", 0, 64, 1);
    int32_t prompt[N];
    fill_prompt(prompt, N, 3, V);
    assert_int_equal(ks_prefill(c, 0, prompt, N, NULL, NULL), KS_OK);
    float *keys = malloc(sizeof(float) * (size_t)N * hd), *q = malloc(sizeof(float) * (size_t)G * hd);
    float acc[N], want[N], sc[N];
    const int32_t limits[] = {1, 5, 8, 9, 16, 30, N - 1, N, N + 10};
    for (int32_t l = 0; l < hp->n_layer; l += 2) {
        int32_t h = hp->n_head_kv - 1;
        assert_int_equal(ks_kv_n_entries(c->kv, 0, l, h), N);
        assert_int_equal(c->penv.read_keys(c->penv.svc, 0, l, h, 0, N, keys), KS_OK);
        for (int32_t i = 0; i < G * hd; i++) q[i] = 0.05f * sinf((float)(i * 7 + l + 1));
        for (size_t t = 0; t < sizeof limits / sizeof *limits; t++) {
            int32_t lim = limits[t], m = lim < N ? lim : N;
            memset(acc, 0, sizeof acc);
            memset(want, 0, sizeof want);
            assert_int_equal(c->penv.attn_probs(c->penv.svc, 0, l, h, q, 1, &lim, acc), KS_OK);
            for (int32_t g = 0; g < G; g++) {
                double mx = -INFINITY, sum = 0;
                for (int32_t e = 0; e < m; e++) {
                    double d = 0;
                    for (int32_t i = 0; i < hd; i++) d += (double)q[g * hd + i] * keys[(size_t)e * hd + i];
                    sc[e] = (float)(d / sqrt((double)hd));
                    mx = sc[e] > mx ? sc[e] : mx;
                }
                for (int32_t e = 0; e < m; e++) sum += exp(sc[e] - mx);
                for (int32_t e = 0; e < m; e++) want[e] += (float)(exp(sc[e] - mx) / sum);
            }
            for (int32_t e = 0; e < N; e++) {
                if (e >= m && acc[e] != 0) fail_msg("limit %d: entry %d out of scope got %g", lim, e, acc[e]);
                if (fabsf(acc[e] - want[e]) > 1e-4f)
                    fail_msg("layer %d limit %d entry %d: %g, direct %g", l, lim, e, acc[e], want[e]);
            }
        }
        memset(acc, 0, sizeof acc); /* NULL: every entry, the same as a limit of N */
        assert_int_equal(c->penv.attn_probs(c->penv.svc, 0, l, h, q, 1, NULL, acc), KS_OK);
        float acc_n[N] = {0};
        int32_t lim = N;
        assert_int_equal(c->penv.attn_probs(c->penv.svc, 0, l, h, q, 1, &lim, acc_n), KS_OK);
        assert_memory_equal(acc, acc_n, sizeof acc);
    }
    free(keys);
    free(q);
    ks_context_destroy(c);
}

/* Seq 1 (150 tokens) makes the pseudo tokens run for seq 0 (100 tokens,
 * within the budget of 120): the round trip (append at L_p.., truncate) must
 * leave seq 0 exactly as dense leaves it. */
static void round_trip(ks_model *m, const char *policy) {
    int32_t V = m->hp.n_vocab;
    const int n0 = 100, n1 = 150, steps = 4;
    ks_context *cd = make_ctx(m, "dense", 0, n1 + 32 + steps, 2);
    ks_context *cp = make_ctx(m, policy, 120, n1 + 32 + steps, 2);
    int32_t prompt[150];
    float *ld = malloc(sizeof(float) * (size_t)V), *lp = malloc(sizeof(float) * (size_t)V);
    fill_prompt(prompt, n1, 1, V);
    assert_int_equal(ks_prefill(cd, 1, prompt, n1, ld, NULL), KS_OK);
    assert_int_equal(ks_prefill(cp, 1, prompt, n1, lp, NULL), KS_OK);
    check_heads(cp, 1, 120, n1, -1); /* seq 1 was compressed */
    fill_prompt(prompt, n0, 0, V);
    assert_int_equal(ks_prefill(cd, 0, prompt, n0, ld, NULL), KS_OK);
    assert_int_equal(ks_prefill(cp, 0, prompt, n0, lp, NULL), KS_OK);
    assert_memory_equal(ld, lp, sizeof(float) * (size_t)V);
    check_heads(cp, 0, n0, n0, n0 - 1);
    for (int t = 0; t < steps; t++) {
        int32_t seq = 0, tok = 0;
        for (int32_t j = 1; j < V; j++) tok = ld[j] > ld[tok] ? j : tok;
        assert_int_equal(ks_decode(cd, &seq, &tok, 1, ld), KS_OK);
        assert_int_equal(ks_decode(cp, &seq, &tok, 1, lp), KS_OK);
        assert_memory_equal(ld, lp, sizeof(float) * (size_t)V);
    }
    free(ld);
    free(lp);
    ks_context_destroy(cd);
    ks_context_destroy(cp);
}

static void test_pseudo_round_trip_is_invisible(void **state) {
    (void)state;
    round_trip(g_gqa, "dapq");
    round_trip(g_gqa, "dapq+quest"); /* quest's page summaries are rebuilt by the truncation */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pseudo_choice),   cmocka_unit_test(test_keeps_attended),
        cmocka_unit_test(test_real_gqa),        cmocka_unit_test(test_real_mha),
        cmocka_unit_test(test_pseudo_round_trip_is_invisible),
        cmocka_unit_test(test_pseudo_keys_in_scope), cmocka_unit_test(test_attn_probs_key_limit),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
