/*
 * test_p_lrqk.c — the `lrqk` policy (Low Rank Query and Key attention).
 *
 * 1. Numerics: the r x r solver on known systems (pivoting needed, a
 *    rank-deficient Gram, non-finite input refused); the prefill joint
 *    factorisation's error ||QK^T - A_Q A_K^T|| / ||QK^T|| falls as the rank
 *    grows on low-rank-plus-noise Q, K; one decode step leaves B_K
 *    reproducing the new key from k^.
 * 2. Selection on hand-made KV (fake env): the planted hot key ranks first,
 *    after a prefill factorisation and through the no-prefill fallback;
 *    hit/miss counting across steps.
 * 3. Exactness: with a budget >= the context lrqk reproduces dense bit for
 *    bit on a generated tiny-llama (GQA) and aidreams260K (MHA), batch 1
 *    and 2, with and without slow-tier layers (memory and file); a real
 *    budget runs, selects and counts.
 */
#define _GNU_SOURCE
#include "infer/infer.h"
#include "gguf/gguf.h"
#include "model/shapes.h"
#include "spec/lrqk_math.h"
#include "policies/registry.h"
#include "tensor/dtype.h"
#include "core/simd.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static ks_model *g_gqa, *g_mha;
static char g_path[256], g_dir[256];

static int setup(void **state) {
    (void)state;
    snprintf(g_path, sizeof g_path, "/tmp/kvsieve-test-lrqk-%d.gguf", (int)getpid());
    if (ks_test_tiny_llama(3, 5, g_path, &g_gqa) != 0) return -1;
    if (ks_model_load(ks_test_fixture("models/aidreams260K.gguf"), ks_model_default_params(), &g_mha) != KS_OK) return -1;
    snprintf(g_dir, sizeof g_dir, "/tmp/kvsieve-test-lrqk-XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    ks_model_destroy(g_gqa);
    ks_model_destroy(g_mha);
    unlink(g_path);
    rmdir(g_dir);
    return 0;
}

/* ------------------------------------------------------------ numerics -- */
static void test_solver(void **state) {
    (void)state;
    /* A has a zero leading pivot: needs a row swap */
    double A[9] = {0, 2, 1, 1, 1, 0, 3, 0, 1};
    double X[6] = {1, -2, 2, 0.5, -1, 3}; /* [3][2] */
    double B[6];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++) {
            B[i * 2 + j] = 0;
            for (int k = 0; k < 3; k++) B[i * 2 + j] += A[i * 3 + k] * X[k * 2 + j];
        }
    double Ac[9];
    memcpy(Ac, A, sizeof A);
    assert_int_equal(ks_lrqk_solve(3, Ac, B, 2), KS_OK);
    for (int i = 0; i < 6; i++) assert_true(fabs(B[i] - X[i]) < 1e-6);
    /* a 32 x 32 SPD system (Gram of random rows) */
    enum { N = 32 };
    float rows[64 * N];
    ks_lrqk_randn(rows, 64 * N, 7);
    double G[N * N], Gc[N * N], x[N], b[N];
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int e = 0; e < 64; e++) s += (double)rows[e * N + i] * rows[e * N + j];
            G[i * N + j] = s;
        }
    for (int i = 0; i < N; i++) x[i] = sin(i + 1.0);
    for (int i = 0; i < N; i++) {
        b[i] = 0;
        for (int j = 0; j < N; j++) b[i] += G[i * N + j] * x[j];
    }
    memcpy(Gc, G, sizeof G);
    assert_int_equal(ks_lrqk_solve(N, Gc, b, 1), KS_OK);
    for (int i = 0; i < N; i++) assert_true(fabs(b[i] - x[i]) < 1e-5);
    /* rank-deficient Gram: the ridge keeps it solvable and finite */
    double D[4] = {1, 1, 1, 1}, d[2] = {2, 2};
    assert_int_equal(ks_lrqk_solve(2, D, d, 1), KS_OK);
    assert_true(isfinite(d[0]) && isfinite(d[1]) && fabs(d[0] + d[1] - 2) < 1e-3);
    /* non-finite input is refused, not propagated */
    double Nn[4] = {NAN, 0, 0, 1}, nb[2] = {1, 1};
    assert_int_equal(ks_lrqk_solve(2, Nn, nb, 1), KS_ERR_INVALID_ARG);
    assert_int_equal(ks_lrqk_solve(0, Nn, nb, 1), KS_ERR_INVALID_ARG);
}

static int cmp_i32(const void *a, const void *b) { return *(const int32_t *)a - *(const int32_t *)b; }

static void test_topk_matches_ks_topk(void **state) {
    (void)state;
    enum { M = 300 };
    float x[M], tmp[M];
    int32_t a[M], b[M];
    for (int trial = 0; trial < 40; trial++) {
        ks_lrqk_randn(x, M, (uint64_t)trial);
        for (int i = 0; i < M; i++) {
            if (trial % 2) x[i] = roundf(x[i] * 2); /* many ties */
            if (i % 37 == trial % 37) x[i] = NAN;
        }
        int32_t ks[] = {0, 1, 7, 150, 299, 300, 400};
        for (size_t j = 0; j < sizeof ks / sizeof ks[0]; j++) {
            int32_t na = ks_lrqk_topk(x, M, ks[j], a, tmp), nb = ks_topk(x, M, ks[j], b);
            assert_int_equal(na, nb);
            qsort(a, (size_t)na, sizeof *a, cmp_i32);
            qsort(b, (size_t)nb, sizeof *b, cmp_i32);
            assert_memory_equal(a, b, sizeof(int32_t) * (size_t)na);
        }
    }
}

/* rows [n][d] = U [n][8] V [8][d] + noise */
static void low_rank_rows(float *out, int n, int d, const float *V, uint64_t seed, float noise) {
    float *U = malloc(sizeof(float) * (size_t)n * 8), *z = malloc(sizeof(float) * (size_t)n * d);
    ks_lrqk_randn(U, (size_t)n * 8, seed);
    ks_lrqk_randn(z, (size_t)n * d, seed + 1);
    for (int e = 0; e < n; e++)
        for (int c = 0; c < d; c++) {
            float s = noise * z[e * d + c];
            for (int i = 0; i < 8; i++) s += U[e * 8 + i] * V[i * d + c];
            out[e * d + c] = s;
        }
    free(U);
    free(z);
}

static void test_factor_error_falls_with_rank(void **state) {
    (void)state;
    enum { NQ = 96, NK = 80, D = 32 };
    float V[8 * D], Q[NQ * D], K[NK * D];
    /* decaying spectrum so each added rank pays */
    ks_lrqk_randn(V, 8 * D, 3);
    for (int i = 0; i < 8; i++)
        for (int c = 0; c < D; c++) V[i * D + c] *= powf(0.6f, (float)i);
    low_rank_rows(Q, NQ, D, V, 11, 0.01f);
    low_rank_rows(K, NK, D, V, 21, 0.01f);
    for (int iters = 2; iters <= 20; iters += 18) {
        double prev = INFINITY;
        for (int r = 2; r <= 8; r *= 2) {
            float aq[NQ * 8], ak[NK * 8], bq[8 * D], bk[8 * D];
            ks_lrqk_factor_params fp = {.rank = r, .iters = iters, .tol = 0, .lambda = 1, .seed = 1};
            assert_int_equal(ks_lrqk_factor(Q, NQ, K, NK, D, &fp, aq, ak, bq, bk), KS_OK);
            double err = ks_lrqk_rel_error(Q, NQ, K, NK, D, aq, ak, r);
            print_message("lrqk factor iters %d rank %d: rel error %.4f\n", iters, r, err);
            assert_true(err < prev);
            prev = err;
            if (r == 8) assert_true(err < 0.05);
            /* K ~ A_K B_K too */
            float kr[NK * D];
            for (int e = 0; e < NK; e++)
                for (int c = 0; c < D; c++) {
                    float s = 0;
                    for (int i = 0; i < r; i++) s += ak[e * r + i] * bk[i * D + c];
                    kr[e * D + c] = s;
                }
            if (r == 8) assert_true(ks_test_nmse(kr, K, NK * D, NULL) < 0.05);
        }
    }
    /* bad shapes are refused */
    float a[4], b[4];
    ks_lrqk_factor_params fp = {.rank = 0, .iters = 2, .tol = 0.01f, .lambda = 1, .seed = 1};
    assert_int_equal(ks_lrqk_factor(Q, NQ, K, NK, D, &fp, NULL, a, b, b), KS_ERR_INVALID_ARG);
}

static void test_decode_step(void **state) {
    (void)state;
    enum { N = 64, D = 16, R = 8, G = 2 };
    float V[8 * D], K[N * D], Q[N * G * D], ak[N * R], bq[R * D], bk[R * D];
    ks_lrqk_randn(V, 8 * D, 4);
    low_rank_rows(K, N, D, V, 31, 0.0f);
    low_rank_rows(Q, N * G, D, V, 41, 0.0f);
    ks_lrqk_factor_params fp = {.rank = R, .iters = 4, .tol = 0, .lambda = 1, .seed = 2};
    assert_int_equal(ks_lrqk_factor(Q, N * G, K, N, D, &fp, NULL, ak, bq, bk), KS_OK);
    float k[D], q[G * D], qh[G * R], kh[R];
    low_rank_rows(k, 1, D, V, 51, 0.0f);
    low_rank_rows(q, G, D, V, 61, 0.0f);
    double W[R * R] = {0};
    assert_int_equal(ks_lrqk_decode(bq, bk, R, D, W, NULL, q, G, k, 2, 0.001f, 1.0f, qh, kh), KS_OK);
    /* the exact line search zeroes the residual of k^ B_K - k */
    float rec[D];
    for (int c = 0; c < D; c++) {
        rec[c] = 0;
        for (int i = 0; i < R; i++) rec[c] += kh[i] * bk[i * D + c];
    }
    assert_true(ks_test_nmse(rec, k, D, NULL) < 1e-3);
    /* q^ . k^ approximates q . k */
    for (int g = 0; g < G; g++) {
        double t = 0, a = 0;
        for (int c = 0; c < D; c++) t += (double)q[g * D + c] * k[c];
        for (int i = 0; i < R; i++) a += (double)qh[g * R + i] * kh[i];
        assert_true(fabs(t - a) < 0.1 * fabs(t) + 0.1);
    }
    assert_int_equal(ks_lrqk_decode(bq, bk, 0, D, W, NULL, q, G, k, 2, 0.001f, 1.0f, qh, kh), KS_ERR_INVALID_ARG);
}

/* K_Omega: the q-update's term q K_O^T A_KO.  When the keys of O are exactly
 * A_KO B_K, the exact-key form (kao = K_O^T A_KO) equals the Gram form
 * (q B_K^T) W; with real keys off the span of B_K the two differ, and the
 * policy uses the exact one.  Ranks above the old 64 cap (up to head_dim)
 * work. */
static void test_decode_exact_keys(void **state) {
    (void)state;
    enum { N = 48, D = 16, R = 6, G = 2, NO = 10 };
    float V[8 * D], K[N * D], Q[N * G * D], ak[N * R], bq[R * D], bk[R * D];
    ks_lrqk_randn(V, 8 * D, 5);
    low_rank_rows(K, N, D, V, 32, 0.2f);
    low_rank_rows(Q, N * G, D, V, 42, 0.2f);
    ks_lrqk_factor_params fp = {.rank = R, .iters = 3, .tol = 0, .lambda = 1, .seed = 3};
    assert_int_equal(ks_lrqk_factor(Q, N * G, K, N, D, &fp, NULL, ak, bq, bk), KS_OK);
    float k[D], q[G * D];
    low_rank_rows(k, 1, D, V, 52, 0.2f);
    low_rank_rows(q, G, D, V, 62, 0.2f);
    /* O = rows 0..NO-1: W = A_KO^T A_KO; kao_rec from A_KO B_K, kao_ex from the real keys */
    double W[R * R] = {0};
    float kao_rec[D * R] = {0}, kao_ex[D * R] = {0};
    for (int e = 0; e < NO; e++)
        for (int i = 0; i < R; i++) {
            for (int j = 0; j < R; j++) W[i * R + j] += (double)ak[e * R + i] * ak[e * R + j];
            for (int c = 0; c < D; c++) {
                float krec = 0;
                for (int t = 0; t < R; t++) krec += ak[e * R + t] * bk[t * D + c];
                kao_rec[c * R + i] += krec * ak[e * R + i];
                kao_ex[c * R + i] += K[e * D + c] * ak[e * R + i];
            }
        }
    float qa[G * R], ka[R], qb[G * R], kb[R], qc[G * R], kc[R];
    float bq1[R * D], bk1[R * D];
    memcpy(bq1, bq, sizeof bq), memcpy(bk1, bk, sizeof bk);
    assert_int_equal(ks_lrqk_decode(bq1, bk1, R, D, W, NULL, q, G, k, 2, 0, 1.0f, qa, ka), KS_OK);
    memcpy(bq1, bq, sizeof bq), memcpy(bk1, bk, sizeof bk);
    assert_int_equal(ks_lrqk_decode(bq1, bk1, R, D, W, kao_rec, q, G, k, 2, 0, 1.0f, qb, kb), KS_OK);
    memcpy(bq1, bq, sizeof bq), memcpy(bk1, bk, sizeof bk);
    assert_int_equal(ks_lrqk_decode(bq1, bk1, R, D, W, kao_ex, q, G, k, 2, 0, 1.0f, qc, kc), KS_OK);
    double dab = 0, dac = 0, na = 0;
    for (int i = 0; i < G * R; i++) {
        dab += fabs((double)qa[i] - qb[i]);
        dac += fabs((double)qa[i] - qc[i]);
        na += fabs((double)qa[i]);
    }
    assert_true(dab < 1e-3 * na);  /* reconstructed keys: the Gram form */
    assert_true(dac > 1e-2 * na);  /* exact keys: a different (the paper's) q^ */

    /* rank above 64, up to head_dim */
    enum { D2 = 128, R2 = 96, N2 = 160 };
    float *V2 = malloc(sizeof(float) * D2 * D2), *K2 = malloc(sizeof(float) * N2 * D2),
          *Q2 = malloc(sizeof(float) * N2 * D2), *ak2 = malloc(sizeof(float) * N2 * R2),
          *bq2 = malloc(sizeof(float) * R2 * D2), *bk2 = malloc(sizeof(float) * R2 * D2);
    ks_lrqk_randn(K2, (size_t)N2 * D2, 7);
    ks_lrqk_randn(Q2, (size_t)N2 * D2, 8);
    ks_lrqk_factor_params fp2 = {.rank = R2, .iters = 2, .tol = 0, .lambda = 1, .seed = 4};
    assert_int_equal(ks_lrqk_factor(Q2, N2, K2, N2, D2, &fp2, NULL, ak2, bq2, bk2), KS_OK);
    float qh2[R2], kh2[R2], a2[R2];
    assert_int_equal(ks_lrqk_decode(bq2, bk2, R2, D2, NULL, NULL, Q2, 1, K2, 2, 0, 1.0f, qh2, kh2), KS_OK);
    assert_int_equal(ks_lrqk_project(bk2, R2, D2, K2, a2), KS_OK);
    for (int i = 0; i < R2; i++) assert_true(isfinite(qh2[i]) && isfinite(kh2[i]) && isfinite(a2[i]));
    free(V2), free(K2), free(Q2), free(ak2), free(bq2), free(bk2);
}

/* ------------------------------------------------------ hand-made KV -- */
enum { HD = 8, NKV = 1, NQH = 2, CTX = 64, PG = 4, N0 = 40 };

typedef struct {
    ks_kv_store *kv;
    int reads[CTX]; /* times each entry's key was read */
} fake_svc;

static ks_status fake_read_keys(void *svc, int32_t seq, int32_t layer, int32_t head, int32_t first, int32_t n,
                                float *out) {
    fake_svc *f = svc;
    if (first < 0 || first + n > ks_kv_n_entries(f->kv, seq, layer, head)) return KS_ERR_INVALID_ARG;
    for (int32_t e = first; e < first + n; e++) {
        f->reads[e]++;
        const uint8_t *K, *V;
        ks_kv_page_rows(f->kv, seq, layer, head, e / PG, &K, &V);
        const ks_f16 *k = (const ks_f16 *)K + (e % PG) * HD;
        for (int d = 0; d < HD; d++) out[(size_t)(e - first) * HD + d] = ks_f16_to_f32(k[d]);
    }
    return KS_OK;
}

static void key_of(int e, int hot, float *k) {
    for (int d = 0; d < HD; d++) k[d] = 0.3f * sinf((float)(e * HD + d) * 0.7f);
    if (e == hot) k[0] = 4.0f;
}

static void make_kv(fake_svc *f, int hot) {
    ks_kv_params kp = ks_kv_default_params();
    kp.n_layer = 1;
    kp.n_head_kv = NKV;
    kp.head_dim = HD;
    kp.n_ctx = CTX;
    kp.page = PG;
    assert_int_equal(ks_kv_create(&kp, &f->kv), KS_OK);
    for (int e = 0; e < N0; e++) {
        float k[HD], v[HD];
        key_of(e, hot, k);
        for (int d = 0; d < HD; d++) v[d] = (float)e;
        assert_int_equal(ks_kv_append(f->kv, 0, 0, 0, e, k, v), KS_OK);
    }
}

static ks_policy *make_policy(fake_svc *f, const char *args) {
    ks_policy_env env = {.n_layer = 1, .n_head = NQH, .n_head_kv = NKV, .head_dim = HD, .n_seq = 1, .n_ctx = CTX,
                         .kv = f->kv, .svc = f, .read_keys = fake_read_keys};
    ks_policy *pol = NULL;
    assert_int_equal(ks_test_policy_create("lrqk", args, 12, 2, 4, -1, &env, &pol), KS_OK);
    assert_int_equal(ks_policy_dense_layers(pol), 0);
    assert_int_equal(ks_policy_obs_window(pol), -1);
    return pol;
}

/* prompt queries: random directions */
static void prefill(ks_policy *pol) {
    float *q = malloc(sizeof(float) * N0 * NQH * HD);
    ks_lrqk_randn(q, N0 * NQH * HD, 99);
    ks_prefill_info info = {.seq = 0, .n_prompt = N0, .n_obs = N0, .obs_q = q};
    assert_int_equal(ks_policy_on_prefill(pol, &info), KS_OK);
    free(q);
}

/* append entry e (as a decode step would) and select for a query along dim 0 */
static int32_t step(fake_svc *f, ks_policy *pol, int e, int hot, int32_t n_select, float qdir, int32_t *idx) {
    float k[HD], v[HD] = {0};
    key_of(e, hot, k);
    assert_int_equal(ks_kv_append(f->kv, 0, 0, 0, e, k, v), KS_OK);
    ks_policy_on_append(pol, 0, 0, 0, e, k);
    float q[NQH * HD] = {0};
    q[0] = qdir;
    q[HD + 0] = qdir;
    q[HD + 1] = 0.5f;
    ks_select_req req = {.seq = 0, .layer = 0, .head = 0, .pos = e, .n_entries = e + 1, .q = q,
                         .n_select = n_select, .sink = 2, .window = 4};
    int32_t next[CTX];
    ks_selection sel = {.cap = CTX, .idx = idx, .next = next};
    assert_int_equal(ks_policy_select(pol, &req, &sel), KS_OK);
    assert_false(sel.all);
    assert_false(sel.pages);
    for (int32_t i = 0; i < sel.n; i++) assert_true(idx[i] >= 2 && idx[i] < e + 1 - 4);
    return sel.n;
}

static void test_hot_key_ranks_first(void **state) {
    (void)state;
    for (int with_prefill = 1; with_prefill >= 0; with_prefill--) {
        fake_svc f = {0};
        make_kv(&f, 21);
        const char *args[] = {"rank=4", "rank=3"}; /* vector and scalar kernels */
        for (int a = 0; a < 2; a++) {
            ks_policy *pol = make_policy(&f, args[a]);
            if (with_prefill) prefill(pol);
            int32_t idx[CTX];
            assert_int_equal(step(&f, pol, N0 + a, 21, 1, 3.0f, idx), 1);
            assert_int_equal(idx[0], 21);
            ks_policy_destroy(pol);
        }
        ks_kv_destroy(f.kv);
    }
}

/* The AVX2 proxy scores (r % 8 == 0) and the AVX-512 Gram / K_O^T A_KO
 * updates (r % 16 == 0) against the SSE/scalar ones: the same hot key ranks
 * first, and the same selections over three steps (the second and third
 * depend on the updates of the steps before), at every level the CPU has. */
static void test_proxy_kernels_agree(void **state) {
    (void)state;
    const char *ranks[] = {"rank=8", "rank=16"};
    enum { STEPS = 3 };
    for (int ri = 0; ri < 2; ri++) {
        fake_svc f = {0};
        make_kv(&f, 21);
        int32_t first[STEPS][CTX], got[CTX], n_first[STEPS];
        ks_simd_level hw = ks_simd_detect(), saved = ks_simd_force(hw);
        for (int lv = KS_SIMD_SCALAR; lv <= (int)hw; lv++) {
            ks_simd_force((ks_simd_level)lv);
            ks_policy *pol = make_policy(&f, ranks[ri]);
            prefill(pol);
            for (int t = 0; t < STEPS; t++) {
                int32_t n = step(&f, pol, N0 + t, 21, 6, t == 1 ? -3.0f : 3.0f, got);
                qsort(got, (size_t)n, sizeof(int32_t), cmp_i32);
                if (t == 0) {
                    bool hot = false;
                    for (int32_t i = 0; i < n; i++) hot |= got[i] == 21;
                    assert_true(hot);
                }
                if (lv == KS_SIMD_SCALAR) {
                    n_first[t] = n;
                    memcpy(first[t], got, sizeof(int32_t) * (size_t)n);
                } else {
                    assert_int_equal(n, n_first[t]);
                    for (int32_t i = 0; i < n; i++)
                        if (got[i] != first[t][i])
                            fail_msg("%s, %s, step %d: entry %d selected %d, scalar %d", ranks[ri],
                                     ks_simd_name((ks_simd_level)lv), t, i, got[i], first[t][i]);
                }
            }
            ks_policy_destroy(pol);
            /* the steps appended entries: start the next level from the same cache */
            ks_kv_destroy(f.kv);
            make_kv(&f, 21);
        }
        ks_simd_force(saved);
        ks_kv_destroy(f.kv);
    }
}

/* ks_lrqk_gram_kao_add at every SIMD level equals the portable loops bit
 * for bit (the Gram's upper triangle and all of K_O^T A_KO), for ranks the
 * zmm path takes (16, 32, 48, 64), one only the ymm (AVX2) path takes
 * (8) and one only the NEON path takes (12), rows entering and leaving in
 * one run. */
static void test_gram_kao_bit_exact(void **state) {
    (void)state;
    const int32_t ranks[] = {8, 12, 16, 32, 48, 64}, hd = 64, len = 37;
    ks_simd_level hw = ks_simd_detect(), saved = ks_simd_force(hw);
    for (size_t ri = 0; ri < sizeof ranks / sizeof ranks[0]; ri++) {
        int32_t r = ranks[ri];
        float *g0 = malloc(sizeof(float) * r * r), *k0 = malloc(sizeof(float) * hd * r);
        float *g1 = malloc(sizeof(float) * r * r), *k1 = malloc(sizeof(float) * hd * r);
        float *keys = malloc(sizeof(float) * len * hd), *ak = malloc(sizeof(float) * len * r), sign[37];
        ks_lrqk_randn(g0, (size_t)r * r, 1 + ri);
        ks_lrqk_randn(k0, (size_t)hd * r, 2 + ri);
        ks_lrqk_randn(keys, (size_t)len * hd, 3 + ri);
        ks_lrqk_randn(ak, (size_t)len * r, 4 + ri);
        for (int32_t x = 0; x < len; x++) sign[x] = x % 3 ? 1.0f : -1.0f;
        float *gref = malloc(sizeof(float) * r * r), *kref = malloc(sizeof(float) * hd * r);
        memcpy(gref, g0, sizeof(float) * r * r);
        memcpy(kref, k0, sizeof(float) * hd * r);
        ks_simd_force(KS_SIMD_SCALAR);
        ks_lrqk_gram_kao_add(gref, kref, keys, ak, sign, len, hd, r);
        for (int lv = KS_SIMD_AVX2; lv <= (int)hw; lv++) {
            memcpy(g1, g0, sizeof(float) * r * r);
            memcpy(k1, k0, sizeof(float) * hd * r);
            ks_simd_force((ks_simd_level)lv);
            ks_lrqk_gram_kao_add(g1, k1, keys, ak, sign, len, hd, r);
            for (int32_t i = 0; i < r; i++)
                for (int32_t j = i; j < r; j++)
                    if (memcmp(&g1[i * r + j], &gref[i * r + j], sizeof(float)))
                        fail_msg("rank %d, %s: Gram[%d][%d] %.9g, portable %.9g", r, ks_simd_name((ks_simd_level)lv),
                                 i, j, g1[i * r + j], gref[i * r + j]);
            if (memcmp(k1, kref, sizeof(float) * hd * r))
                fail_msg("rank %d, %s: K_O^T A_KO differs from the portable loops", r, ks_simd_name((ks_simd_level)lv));
        }
        free(g0);
        free(k0);
        free(g1);
        free(k1);
        free(keys);
        free(ak);
        free(gref);
        free(kref);
    }
    ks_simd_force(saved);
}

static void test_hit_miss_counting(void **state) {
    (void)state;
    fake_svc f = {0};
    make_kv(&f, 21);
    ks_policy *pol = make_policy(&f, "rank=4,iters=3,tol=0.001,lambda=1");
    prefill(pol);
    int32_t a[CTX], b[CTX], c[CTX];
    /* step 1: nothing was attended before: all misses */
    int32_t na = step(&f, pol, N0, 21, 6, 3.0f, a);
    ks_policy_counters pc;
    ks_policy_get_counters(pol, &pc);
    assert_int_equal(pc.selections, 1);
    assert_int_equal(pc.hits, 0);
    assert_int_equal(pc.misses, (uint64_t)na);
    /* step 2: same query: hits are the entries selected both times */
    int32_t nb = step(&f, pol, N0 + 1, 21, 6, 3.0f, b);
    int32_t common = 0;
    for (int i = 0; i < nb; i++)
        for (int j = 0; j < na; j++) common += b[i] == a[j];
    /* the entry that just left the window was attended too (resident) */
    for (int i = 0; i < nb; i++) common += b[i] == N0 + 1 - 4;
    ks_policy_get_counters(pol, &pc);
    assert_int_equal(pc.selections, 2);
    assert_int_equal(pc.hits, (uint64_t)common);
    assert_int_equal(pc.hits + pc.misses, (uint64_t)(na + nb));
    assert_true(pc.hits >= 1); /* the hot key stays */
    /* step 3: the opposite query picks other entries: mostly misses */
    int32_t nc = step(&f, pol, N0 + 2, 21, 6, -3.0f, c);
    ks_policy_get_counters(pol, &pc);
    assert_int_equal(pc.selections, 3);
    assert_int_equal(pc.hits + pc.misses, (uint64_t)(na + nb + nc));
    bool hot = false;
    for (int i = 0; i < nc; i++) hot |= c[i] == 21;
    assert_false(hot);
    /* counters survive a sequence reset */
    ks_policy_seq_reset(pol, 0);
    ks_policy_counters pc2;
    ks_policy_get_counters(pol, &pc2);
    assert_memory_equal(&pc, &pc2, sizeof pc);
    ks_policy_destroy(pol);
    ks_kv_destroy(f.kv);
}

/* K_Omega in the policy: the exact stored keys of the tokens a step attends
 * (selected entries, sinks, window) are read when they enter O, and a token
 * that stays resident is not read again (hit).  rank = head_dim and above it
 * (clamped) run and still rank the hot key first. */
static void test_exact_keys_of_selected(void **state) {
    (void)state;
    const char *args[] = {"rank=4", "rank=8", "rank=100"};
    for (int v = 0; v < 3; v++) {
        fake_svc f = {0};
        make_kv(&f, 21);
        ks_policy *pol = make_policy(&f, args[v]);
        prefill(pol);
        memset(f.reads, 0, sizeof f.reads);
        int32_t idx[CTX], idx2[CTX];
        int32_t n = step(&f, pol, N0, 21, 6, 1.0f, idx);
        assert_true(n == 6);
        bool hot = false;
        for (int32_t i = 0; i < n; i++) {
            assert_true(f.reads[idx[i]] >= 1); /* the selected tokens' exact keys */
            hot |= idx[i] == 21;
        }
        assert_true(hot);
        for (int e = 0; e < 2; e++) assert_true(f.reads[e] >= 1);           /* sinks */
        for (int e = N0 + 1 - 4; e <= N0; e++) assert_true(f.reads[e] >= 1); /* window */
        int before[CTX];
        memcpy(before, f.reads, sizeof before);
        int32_t n2 = step(&f, pol, N0 + 1, 21, 6, 1.0f, idx2);
        for (int32_t i = 0; i < n2; i++)
            for (int32_t j = 0; j < n; j++)
                if (idx2[i] == idx[j]) assert_int_equal(f.reads[idx2[i]], before[idx2[i]]); /* hit: not re-read */
        ks_policy_destroy(pol);
        ks_kv_destroy(f.kv);
    }
}

static void test_bad_args(void **state) {
    (void)state;
    fake_svc f = {0};
    make_kv(&f, 21);
    ks_policy_env env = {.n_layer = 1, .n_head = NQH, .n_head_kv = NKV, .head_dim = HD, .n_seq = 1, .n_ctx = CTX,
                         .kv = f.kv, .svc = &f, .read_keys = fake_read_keys};
    const char *bad[] = {"rank=0", "rank=1025", "iters=0", "tol=-1", "lambda=0", "rank=x", "nokey=1", "rank"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ks_policy *pol = NULL;
        assert_int_equal(ks_test_policy_create("lrqk", bad[i], 0, 4, 64, -1, &env, &pol), KS_ERR_INVALID_ARG);
        assert_null(pol);
    }
    ks_kv_destroy(f.kv);
}

/* --------------------------------------------------- real models -- */
typedef struct {
    const char *policy;
    int32_t budget, page, offload_layers;
    const char *dir;
} run_cfg;

static float *run_decode(ks_model *m, const run_cfg *cfg, int n_prompt, int n_steps, int n_seq, ks_stats *stats) {
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
    if (stats) ks_context_stats(c, stats);
    free(logits);
    free(prompt);
    ks_context_destroy(c);
    return out;
}

static void check_equal_dense(ks_model *m, int n_prompt, int page) {
    const int steps = 6;
    int32_t V = m->hp.n_vocab;
    for (int n_seq = 1; n_seq <= 2; n_seq++) {
        run_cfg dense = {.policy = "dense", .page = page};
        float *ref = run_decode(m, &dense, n_prompt, steps, n_seq, NULL);
        const char *names[] = {"lrqk", "snapkv+lrqk"};
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
            for (int off = 0; off < 3; off++) {
                run_cfg cfg = {.policy = names[i], .budget = n_prompt + steps + 1, .page = page,
                               .offload_layers = off ? 1 : 0, .dir = off == 2 ? g_dir : NULL};
                float *got = run_decode(m, &cfg, n_prompt, steps, n_seq, NULL);
                if (memcmp(got, ref, sizeof(float) * (size_t)steps * n_seq * V) != 0)
                    fail_msg("policy %s (batch %d, offload %d) differs from dense with a full budget", names[i], n_seq, off);
                free(got);
            }
        }
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

static void test_sparse_runs_and_counts(void **state) {
    (void)state;
    for (int n_seq = 1; n_seq <= 2; n_seq++)
        for (int off = 0; off < 2; off++) {
            /* 300 prompt entries: 38 pages, more than the fetch slots a budget
             * of 40 gives, so the slow-tier prefill gathers pages */
            run_cfg cfg = {.policy = "lrqk", .budget = 40, .page = 8, .offload_layers = off, .dir = NULL};
            ks_stats st;
            float *got = run_decode(g_gqa, &cfg, 300, 5, n_seq, &st);
            for (size_t i = 0; i < (size_t)5 * n_seq * g_gqa->hp.n_vocab; i++) assert_true(isfinite(got[i]));
            free(got);
            /* every layer (default dense 0) x KV head x row x step selects */
            uint64_t want = (uint64_t)g_gqa->hp.n_layer * g_gqa->hp.n_head_kv * n_seq * 5;
            assert_int_equal(st.policy_selections, want);
            assert_int_equal(st.policy_hits + st.policy_misses, want * (40 - 4 - 8));
            assert_true(st.policy_hits > 0 && st.policy_misses > 0);
            assert_true(st.kv_entries_attended < st.kv_entries_total);
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_solver),
        cmocka_unit_test(test_topk_matches_ks_topk),
        cmocka_unit_test(test_factor_error_falls_with_rank),
        cmocka_unit_test(test_decode_step),
        cmocka_unit_test(test_hot_key_ranks_first),
        cmocka_unit_test(test_decode_exact_keys),
        cmocka_unit_test(test_exact_keys_of_selected),
        cmocka_unit_test(test_proxy_kernels_agree),
        cmocka_unit_test(test_gram_kao_bit_exact),
        cmocka_unit_test(test_hit_miss_counting),
        cmocka_unit_test(test_bad_args),
        cmocka_unit_test(test_full_budget_equals_dense_gqa),
        cmocka_unit_test(test_full_budget_equals_dense_mha),
        cmocka_unit_test(test_sparse_runs_and_counts),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
