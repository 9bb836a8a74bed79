/*
 * test_p_chess.c — CHESS (src/policies/p_chess.c).
 *
 * 1. Hierarchy on hand-made page vectors: chunk and grid scores are the
 *    anchor's product with the mean vectors; every kept page lies in a kept
 *    chunk inside a kept grid; counts follow the ratios (ceil at each level);
 *    a page that scores best on its own is lost when its grid is pruned.
 * 2. The policy on a real KV store: the anchor comes from the recent window
 *    (change the window's keys and the selection follows), the presets keep
 *    the counts their ratios give, the budget caps the pages (best first).
 * 3. Quality-aware reconstruction, per KV page of generated tokens: a page
 *    whose average entropy *and* average varentropy exceed the thresholds
 *    rebuilds the selection (counted); one of them alone, unknown values or
 *    no thresholds reuse it; the baselines period=N (every N pages) and
 *    horizon=1 (unscored entries would leave the window) fire as documented.
 * 4. Guards: bad arguments, heads with different entry counts (eviction).
 * (A budget covering the context equals dense bit for bit: test_policy.c.)
 */
#define _GNU_SOURCE
#include "kv/kv.h"
#include "policies/p_chess.h"
#include "policies/registry.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------ hand-made vectors -- */
enum { DIM = 4 };

static void check_levels(const float *vecs, int32_t np, const float *anchor, int32_t chunk, int32_t grid) {
    float ps[64], cs[64], gs[64];
    ks_chess_scores(vecs, np, DIM, anchor, chunk, grid, ps, cs, gs);
    int32_t nc = (np + chunk - 1) / chunk, ng = (nc + grid - 1) / grid;
    for (int32_t c = 0; c < nc; c++) { /* anchor . mean of the chunk's page vectors */
        float mean[DIM] = {0};
        int32_t a = c * chunk, b = a + chunk < np ? a + chunk : np;
        for (int32_t p = a; p < b; p++)
            for (int d = 0; d < DIM; d++) mean[d] += vecs[p * DIM + d] / (float)(b - a);
        float s = 0;
        for (int d = 0; d < DIM; d++) s += anchor[d] * mean[d];
        assert_true(fabsf(s - cs[c]) < 1e-4f);
    }
    for (int32_t g = 0; g < ng; g++) { /* anchor . mean of its chunk vectors */
        int32_t a = g * grid, b = a + grid < nc ? a + grid : nc;
        float s = 0;
        for (int32_t c = a; c < b; c++) s += cs[c] / (float)(b - a);
        assert_true(fabsf(s - gs[g]) < 1e-4f);
    }
}

/* 32 pages, chunk 2, grid 4: 16 chunks, 4 grids */
static void make_vectors(float *vecs, int32_t np) {
    for (int32_t p = 0; p < np; p++)
        for (int d = 0; d < DIM; d++) vecs[p * DIM + d] = sinf((float)(p * 7 + d * 3 + 1)) + (d == 0 ? 0.05f * p : 0);
}

static int32_t ceil_ratio(double r, int32_t n) {
    int32_t k = (int32_t)ceil(r * n - 1e-9);
    return k < 1 ? 1 : k > n ? n : k;
}

static void check_mask(const float *vecs, int32_t np, const float *anchor, const ks_chess_cfg *cfg) {
    float ps[64], cs[64], gs[64];
    int32_t out[64];
    ks_chess_scores(vecs, np, DIM, anchor, cfg->chunk, cfg->grid, ps, cs, gs);
    int32_t n = ks_chess_mask(ps, cs, gs, np, cfg, out);
    int32_t nc = (np + cfg->chunk - 1) / cfg->chunk, ng = (nc + cfg->grid - 1) / cfg->grid;
    /* reference: kept grids = the ceil(rho_g * ng) best */
    int32_t gk = ceil_ratio(cfg->rho_g, ng), gidx[64];
    assert_int_equal(ks_topk(gs, ng, gk, gidx), gk);
    bool gkept[64] = {0}, ckept[64] = {0};
    for (int i = 0; i < gk; i++) gkept[gidx[i]] = true;
    int32_t c_active = 0;
    for (int32_t c = 0; c < nc; c++) c_active += gkept[c / cfg->grid];
    int32_t ck = ceil_ratio(cfg->rho_c, c_active);
    /* the kept chunks are the ck best among the active ones */
    float tmp[64];
    int32_t map[64], m = 0, cidx[64];
    for (int32_t c = 0; c < nc; c++)
        if (gkept[c / cfg->grid]) tmp[m] = cs[c], map[m++] = c;
    assert_int_equal(ks_topk(tmp, m, ck, cidx), ck);
    for (int i = 0; i < ck; i++) ckept[map[cidx[i]]] = true;
    int32_t p_active = 0;
    for (int32_t p = 0; p < np; p++) p_active += ckept[p / cfg->chunk];
    assert_int_equal(n, ceil_ratio(cfg->rho_p, p_active));
    for (int32_t i = 0; i < n; i++) {
        assert_true(ckept[out[i] / cfg->chunk]);                  /* in a kept chunk */
        assert_true(gkept[out[i] / cfg->chunk / cfg->grid]);      /* inside a kept grid */
        if (i) assert_true(ps[out[i - 1]] >= ps[out[i]]);         /* best first */
    }
    /* every active page scoring above the worst kept one is kept */
    for (int32_t p = 0; p < np; p++)
        if (ckept[p / cfg->chunk] && ps[p] > ps[out[n - 1]]) {
            bool in = false;
            for (int32_t i = 0; i < n; i++) in |= out[i] == p;
            assert_true(in);
        }
}

static void test_hierarchy_on_vectors(void **state) {
    (void)state;
    float vecs[32 * DIM], anchor[DIM] = {1.0f, 0.5f, -0.25f, 0.1f};
    make_vectors(vecs, 32);
    check_levels(vecs, 32, anchor, 2, 4);
    check_levels(vecs, 29, anchor, 3, 2); /* partial chunk and grid */
    const char *presets[] = {"conservative", "moderate", "aggressive"};
    const double want[3][3] = {{0.9, 0.9, 0.9}, {0.8, 0.7, 0.7}, {0.5, 0.2, 0.1}};
    for (int i = 0; i < 3; i++) {
        ks_chess_cfg cfg = {.chunk = 2, .grid = 4};
        assert_int_equal(ks_chess_preset(presets[i], &cfg.rho_g, &cfg.rho_c, &cfg.rho_p), KS_OK);
        assert_true(cfg.rho_g == want[i][0] && cfg.rho_c == want[i][1] && cfg.rho_p == want[i][2]);
        check_mask(vecs, 32, anchor, &cfg);
        check_mask(vecs, 29, anchor, &cfg);
        cfg.chunk = 3;
        cfg.grid = 2;
        check_mask(vecs, 29, anchor, &cfg);
    }
    double rg, rc, rp;
    assert_int_equal(ks_chess_preset("reckless", &rg, &rc, &rp), KS_ERR_INVALID_ARG);
    /* counts for 32 pages, chunk 2, grid 4 (16 chunks, 4 grids): 0.5 -> 2 grids
     * -> 8 active chunks; 0.5 -> 4 chunks -> 8 active pages; 0.25 -> 2 pages */
    ks_chess_cfg cfg = {.chunk = 2, .grid = 4, .rho_g = 0.5, .rho_c = 0.5, .rho_p = 0.25};
    float ps[32], cs[16], gs[4];
    int32_t out[32];
    ks_chess_scores(vecs, 32, DIM, anchor, 2, 4, ps, cs, gs);
    assert_int_equal(ks_chess_mask(ps, cs, gs, 32, &cfg, out), 2);
    /* conservative on 32 pages: 4 grids -> 4; 16 chunks -> 15; 30 pages -> 27 */
    cfg.rho_g = cfg.rho_c = cfg.rho_p = 0.9;
    assert_int_equal(ks_chess_mask(ps, cs, gs, 32, &cfg, out), 27);
    /* the best page alone cannot survive when its grid loses */
    float v2[16 * DIM] = {0}, a2[DIM] = {1, 0, 0, 0};
    for (int p = 0; p < 16; p++) v2[p * DIM] = p < 8 ? 1.0f : 0.0f; /* grid 0 (pages 0-7) is good on average */
    v2[12 * DIM] = 5.0f;                                             /* page 12: the best page, grid 1 is poor */
    ks_chess_cfg c2 = {.chunk = 2, .grid = 4, .rho_g = 0.5, .rho_c = 1, .rho_p = 1};
    float p2[16], c2s[8], g2[2];
    ks_chess_scores(v2, 16, DIM, a2, 2, 4, p2, c2s, g2);
    assert_true(g2[0] > g2[1]);
    int32_t o2[16], n2 = ks_chess_mask(p2, c2s, g2, 16, &c2, o2);
    assert_int_equal(n2, 8);
    for (int i = 0; i < n2; i++) assert_true(o2[i] < 8);
    assert_int_equal(ks_chess_mask(p2, c2s, g2, 0, &c2, o2), 0);
}

/* ------------------------------------------------- policy on a store -- */
enum { HD = 8, NL = 2, NKV = 2, CTX = 128, PG = 4 };

typedef struct {
    ks_kv_store *kv;
    int32_t n;
} store;

/* Key of entry e: page e / PG points along dim dir[e / PG] (default: weak
 * noise), the same in every layer and head. */
static void append_entries(store *s, int32_t count, const int *dir) {
    for (int32_t i = 0; i < count; i++, s->n++) {
        int32_t e = s->n;
        float k[HD], v[HD];
        for (int d = 0; d < HD; d++) {
            k[d] = 0.05f * sinf((float)(e * HD + d));
            v[d] = (float)e;
        }
        if (dir && dir[e / PG] >= 0) k[dir[e / PG]] += 2.0f;
        for (int l = 0; l < NL; l++)
            for (int h = 0; h < NKV; h++) assert_int_equal(ks_kv_append(s->kv, 0, l, h, e, k, v), KS_OK);
    }
}

static void make_store(store *s) {
    ks_kv_params kp = ks_kv_default_params();
    kp.n_layer = NL;
    kp.n_head_kv = NKV;
    kp.head_dim = HD;
    kp.n_ctx = CTX;
    kp.page = PG;
    s->n = 0;
    assert_int_equal(ks_kv_create(&kp, &s->kv), KS_OK);
}

static ks_status make_chess(store *s, int32_t budget, const char *args, ks_policy **out) {
    ks_policy_env env = {.n_layer = NL, .n_head = NKV * 2, .n_head_kv = NKV, .head_dim = HD, .n_seq = 1,
                         .n_ctx = CTX, .kv = s->kv};
    return ks_test_policy_create("chess", args, budget, 2, 4, 0, &env, out);
}

/* One decode step of sequence 0 (entropies H, V), then the selection of
 * (layer, head) for n_select entries into idx; returns the page count. */
static int32_t step_select(ks_policy *pol, store *s, float H, float V, int32_t n_select, int32_t layer, int32_t head,
                           int32_t *idx) {
    int32_t seq = 0, tok = 1, pos = s->n;
    ks_step_info st = {.n = 1, .seq = &seq, .token = &tok, .pos = &pos, .entropy = &H, .varentropy = &V};
    assert_int_equal(ks_policy_before_step(pol, &st), KS_OK);
    ks_selection sel = {.cap = CTX, .idx = idx};
    ks_select_req r = {.seq = 0, .layer = layer, .head = head, .pos = pos, .n_entries = s->n + 1, .q = NULL,
                       .n_select = n_select, .sink = 2, .window = 4};
    assert_int_equal(ks_policy_select(pol, &r, &sel), KS_OK);
    assert_true(sel.pages && !sel.all);
    return sel.n;
}

static bool has(const int32_t *idx, int32_t n, int32_t page) {
    for (int32_t i = 0; i < n; i++)
        if (idx[i] == page) return true;
    return false;
}

static void test_anchor_from_window(void **state) {
    (void)state;
    /* 40 entries = pages 0..9; page 9 (entries 36..39) holds the window.
     * Window along dim 1: page 3 shares it; along dim 2: page 6 does. */
    for (int variant = 0; variant < 2; variant++) {
        store s;
        make_store(&s);
        int dir[10];
        for (int i = 0; i < 10; i++) dir[i] = -1;
        dir[3] = 1;
        dir[6] = 2;
        dir[9] = variant ? 2 : 1;
        append_entries(&s, 40, dir);
        ks_policy *pol = NULL;
        assert_int_equal(make_chess(&s, 20, "preset=conservative", &pol), KS_OK);
        assert_true(ks_policy_is_global(pol) && ks_policy_wants_entropy(pol));
        int32_t idx[CTX];
        /* two pages: the window's own page (its first entry is outside the
         * step's window) and the page that shares its direction */
        int32_t n = step_select(pol, &s, 0.1f, 0.1f, 8, 0, 0, idx);
        assert_int_equal(n, 2);
        assert_true(has(idx, n, 9));
        assert_true(has(idx, n, variant ? 6 : 3));
        /* the same selection for every layer and head, best first */
        int32_t idx2[CTX];
        ks_selection sel = {.cap = CTX, .idx = idx2};
        ks_select_req r = {.seq = 0, .layer = 1, .head = 1, .pos = 40, .n_entries = 41, .n_select = 8, .sink = 2,
                           .window = 4};
        assert_int_equal(ks_policy_select(pol, &r, &sel), KS_OK);
        assert_int_equal(sel.n, 2);
        assert_memory_equal(idx, idx2, sizeof(int32_t) * 2);
        /* budget caps the pages: one page -> the best */
        r.n_select = 3;
        assert_int_equal(ks_policy_select(pol, &r, &sel), KS_OK);
        assert_int_equal(sel.n, 1);
        assert_int_equal(idx2[0], idx[0]);
        r.n_select = 0;
        assert_int_equal(ks_policy_select(pol, &r, &sel), KS_OK);
        assert_int_equal(sel.n, 0);
        ks_policy_destroy(pol);
        ks_kv_destroy(s.kv);
    }
}

static void test_presets_counts(void **state) {
    (void)state;
    /* 64 entries, window 4: candidate pages = ceil((65 - 4) / 4) = 16; chunk 2,
     * grid 2 -> 8 chunks, 4 grids.  Page 0 is entries 0..3 (sinks 0..1 only):
     * it is a candidate.  Counts: conservative 4 -> 8 -> 15;
     * moderate ceil(3.2)=4 grids -> 8 chunks -> ceil(5.6)=6 -> 12 pages -> ceil(8.4)=9;
     * aggressive 2 grids -> 4 chunks -> 1 chunk -> 2 pages -> 1 page. */
    const char *args[] = {"preset=conservative,chunk=2,grid=2", "preset=moderate,chunk=2,grid=2",
                          "preset=aggressive,chunk=2,grid=2", "rho_g=0.5,rho_c=0.5,rho_p=0.5,chunk=2,grid=2"};
    const int32_t want[] = {15, 9, 1, 2};
    for (int i = 0; i < 4; i++) {
        store s;
        make_store(&s);
        append_entries(&s, 64, NULL);
        ks_policy *pol = NULL;
        assert_int_equal(make_chess(&s, 64, args[i], &pol), KS_OK);
        int32_t idx[CTX];
        assert_int_equal(step_select(pol, &s, NAN, NAN, 58, 0, 0, idx), want[i]);
        ks_policy_destroy(pol);
        ks_kv_destroy(s.kv);
    }
}

static void test_rebuild_trigger(void **state) {
    (void)state;
    store s;
    make_store(&s);
    int dir[CTX / PG];
    for (int i = 0; i < CTX / PG; i++) dir[i] = -1;
    dir[3] = 1;
    dir[6] = 2;
    dir[9] = 1;  /* window along dim 1 first */
    dir[10] = 2; /* then a page along dim 2 becomes the window */
    append_entries(&s, 40, dir);
    ks_policy *pol = NULL;
    assert_int_equal(make_chess(&s, 20, "preset=conservative,h_max=2.0,v_max=3.0", &pol), KS_OK);
    int32_t idx[CTX];
    ks_policy_counters c;
    /* 40 entries: the generated token lands in entry 40, page 10 */
    int32_t n = step_select(pol, &s, 0.5f, 0.5f, 8, 0, 0, idx); /* first step: built, not a rebuild */
    assert_true(n == 2 && has(idx, n, 3));
    ks_policy_get_counters(pol, &c);
    assert_int_equal(c.rebuilds, 0);
    assert_int_equal(c.selections, 1);
    append_entries(&s, 4, dir); /* page 10 along dim 2 is now the window */
    /* page 10 judged (0.5, 0.5): calm, the selection is reused */
    n = step_select(pol, &s, 1.9f, 2.9f, 8, 0, 0, idx);
    assert_true(n == 2 && has(idx, n, 3) && !has(idx, n, 6));
    append_entries(&s, 1, NULL);
    n = step_select(pol, &s, 2.5f, 0.5f, 8, 0, 0, idx); /* same page 11: averaged, not judged yet */
    assert_true(has(idx, n, 3) && !has(idx, n, 6));
    ks_policy_get_counters(pol, &c);
    assert_int_equal(c.rebuilds, 0);
    append_entries(&s, 3, NULL);
    /* page 11 judged: mean entropy 2.2 > 2 but mean varentropy 1.7 < 3 -> one
     * condition is not enough, reused; unknown values (NaN) are left out */
    n = step_select(pol, &s, NAN, NAN, 8, 0, 0, idx);
    assert_true(has(idx, n, 3) && !has(idx, n, 6));
    ks_policy_get_counters(pol, &c);
    assert_int_equal(c.rebuilds, 0);
    append_entries(&s, 1, NULL);
    step_select(pol, &s, 0.5f, 3.5f, 8, 0, 0, idx); /* varentropy alone high, page 12 */
    append_entries(&s, 3, NULL);
    step_select(pol, &s, 2.5f, 3.5f, 8, 0, 0, idx); /* page 12 judged (0.5, 3.5): reused */
    ks_policy_get_counters(pol, &c);
    assert_int_equal(c.rebuilds, 0);
    append_entries(&s, 4, NULL);
    step_select(pol, &s, 0.1f, 0.1f, 8, 0, 0, idx); /* page 13 judged (2.5, 3.5): both high -> rebuilt */
    ks_policy_get_counters(pol, &c);
    assert_int_equal(c.rebuilds, 1);
    assert_int_equal(c.selections, 7);
    /* a reset sequence builds afresh (not counted) */
    ks_policy_seq_reset(pol, 0);
    step_select(pol, &s, 0.5f, 0.5f, 8, 0, 0, idx);
    ks_policy_get_counters(pol, &c);
    assert_int_equal(c.rebuilds, 1);
    ks_policy_destroy(pol);

    /* thresholds 0: the first finished page rebuilds; without thresholds
     * (+inf, no calibration) nothing fires */
    assert_int_equal(make_chess(&s, 20, "h_max=0,v_max=0", &pol), KS_OK);
    step_select(pol, &s, 1, 1, 8, 0, 0, idx);
    append_entries(&s, 4, NULL);
    step_select(pol, &s, 1, 1, 8, 0, 0, idx);
    ks_policy_get_counters(pol, &c);
    assert_int_equal(c.rebuilds, 1);
    ks_policy_destroy(pol);
    assert_int_equal(make_chess(&s, 20, NULL, &pol), KS_OK);
    for (int i = 0; i < 3; i++, append_entries(&s, 4, NULL)) step_select(pol, &s, 50, 50, 8, 0, 0, idx);
    ks_policy_get_counters(pol, &c);
    assert_int_equal(c.rebuilds, 0);
    ks_policy_destroy(pol);

    /* period=2 (the paper's static baseline): every 2 pages of entries */
    assert_int_equal(make_chess(&s, 20, "h_max=100,v_max=100,period=2", &pol), KS_OK);
    step_select(pol, &s, 0.5f, 0.5f, 8, 0, 0, idx);
    append_entries(&s, 4, NULL);
    step_select(pol, &s, 0.5f, 0.5f, 8, 0, 0, idx);
    ks_policy_get_counters(pol, &c);
    assert_int_equal(c.rebuilds, 0);
    append_entries(&s, 4, NULL);
    step_select(pol, &s, 0.5f, 0.5f, 8, 0, 0, idx);
    ks_policy_get_counters(pol, &c);
    assert_int_equal(c.rebuilds, 1);
    ks_policy_destroy(pol);

    /* horizon: at 44 entries the step's window is [41, 45), so the build
     * ranks pages [0, 11) (entries < 44); the step at 48 entries has the
     * window [45, 49): entry 44 was never ranked and leaves it -> rebuild */
    assert_int_equal(make_chess(&s, 20, "h_max=100,v_max=100,horizon=1", &pol), KS_OK);
    step_select(pol, &s, 0.5f, 0.5f, 8, 0, 0, idx);
    for (int i = 0; i < 3; i++) { /* 45..47 entries: the window starts at 42..44 */
        append_entries(&s, 1, NULL);
        step_select(pol, &s, 0.5f, 0.5f, 8, 0, 0, idx);
        ks_policy_get_counters(pol, &c);
        assert_int_equal(c.rebuilds, 0);
    }
    append_entries(&s, 1, NULL);
    step_select(pol, &s, 0.5f, 0.5f, 8, 0, 0, idx);
    ks_policy_get_counters(pol, &c);
    assert_int_equal(c.rebuilds, 1);
    ks_policy_destroy(pol);
    ks_kv_destroy(s.kv);
}

static void test_guards(void **state) {
    (void)state;
    store s;
    make_store(&s);
    append_entries(&s, 40, NULL);
    ks_policy *pol = NULL;
    assert_int_equal(make_chess(&s, 20, "preset=wild", &pol), KS_ERR_INVALID_ARG);
    assert_int_equal(make_chess(&s, 20, "rho_p=0", &pol), KS_ERR_INVALID_ARG);
    assert_int_equal(make_chess(&s, 20, "chunk=0", &pol), KS_ERR_INVALID_ARG);
    assert_int_equal(make_chess(&s, 20, "h_max=-1", &pol), KS_ERR_INVALID_ARG);
    assert_int_equal(make_chess(&s, 20, "layers=3", &pol), KS_ERR_INVALID_ARG);
    assert_int_equal(make_chess(&s, 20, "nokey=1", &pol), KS_ERR_INVALID_ARG);
    assert_int_equal(make_chess(&s, 20, "layers=1,preset=aggressive,h_max=inf", &pol), KS_OK);
    int32_t idx[CTX];
    assert_int_equal(step_select(pol, &s, 0.1f, 0.1f, 8, 0, 0, idx), 1);
    /* no budget: nothing to select, nothing built */
    ks_policy_destroy(pol);
    assert_int_equal(make_chess(&s, 0, NULL, &pol), KS_OK);
    ks_policy_counters c;
    step_select(pol, &s, 0.1f, 0.1f, 8, 0, 0, idx);
    ks_policy_get_counters(pol, &c);
    assert_int_equal(c.selections, 0);
    ks_policy_destroy(pol);
    /* an evicted head breaks the shared page index: the step fails clearly */
    uint8_t keep[40];
    for (int e = 0; e < 40; e++) keep[e] = e % 2 == 0;
    assert_int_equal(ks_kv_compact(s.kv, 0, 1, 1, keep), KS_OK);
    assert_int_equal(make_chess(&s, 20, NULL, &pol), KS_OK);
    int32_t seq = 0, tok = 1, pos = 40;
    float H = 0, V = 0;
    ks_step_info st = {.n = 1, .seq = &seq, .token = &tok, .pos = &pos, .entropy = &H, .varentropy = &V};
    assert_int_equal(ks_policy_before_step(pol, &st), KS_ERR_INVALID_ARG);
    assert_non_null(strstr(ks_last_error(), "un-evicted"));
    ks_policy_destroy(pol);
    ks_kv_destroy(s.kv);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hierarchy_on_vectors), cmocka_unit_test(test_anchor_from_window),
        cmocka_unit_test(test_presets_counts),       cmocka_unit_test(test_rebuild_trigger),
        cmocka_unit_test(test_guards),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
