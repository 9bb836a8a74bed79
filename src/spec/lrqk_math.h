/*
 * lrqk_math.h — the numeric core of the `lrqk` policy (Low Rank Query and
 * Key attention): a small dense linear solver, the prefill joint
 * factorisation by block coordinate descent, and the per-token decode
 * update.  Kept apart from p_lrqk.c so the tests can check each piece on
 * hand-made matrices without a model.  Everything is row-major fp32 with the
 * r x r systems solved in double (they are tiny, and the Gram matrices they
 * hold are badly scaled in fp32).
 */
#ifndef KS_SPEC_LRQK_MATH_H
#define KS_SPEC_LRQK_MATH_H

#include "core/core.h"

/* Solve A X = B in place by Gaussian elimination with partial pivoting.
 * A: [n][n] (destroyed), B: [n][m] (overwritten by X).  A tiny ridge
 * (1e-7 x the mean |diagonal|, plus 1e-30) is added to the diagonal first so
 * the rank-deficient Gram matrices LRQK builds stay solvable.
 * KS_ERR_INVALID_ARG for n <= 0, m < 0 or a singular / non-finite system
 * (B is then unspecified). */
ks_status ks_lrqk_solve(int32_t n, double *A, double *B, int32_t m);

/* Prefill: jointly factor Q [nq][d] ~ A_Q B_Q and K [nk][d] ~ A_K B_K with
 * Q K^T ~ A_Q A_K^T, rank r, by block coordinate descent (method facts):
 *   B_Q = (A_Q^T A_Q)^-1 A_Q^T Q,  B_K = (A_K^T A_K)^-1 A_K^T K
 *   A_Q <- Q (K^T A_K + l B_Q^T)(A_K^T A_K + l B_Q B_Q^T)^-1
 *   A_K <- K (Q^T A_Q + l B_K^T)(A_Q^T A_Q + l B_K B_K^T)^-1   (the new A_Q)
 * A_Q, A_K start as N(0, 1) from `seed`; the loop stops when the larger mean
 * squared change of A_Q, A_K is < tol or after `iters` rounds; B is
 * recomputed from the final A.  nq and nk may differ (stacked GQA queries).
 * Outputs: aq [nq][r] (may be NULL: not returned), ak [nk][r], bq [r][d],
 * bk [r][d].  Fails (outputs unspecified) only on a singular system. */
typedef struct ks_lrqk_factor_params {
    int32_t rank, iters;
    float tol, lambda;
    uint64_t seed;
} ks_lrqk_factor_params;

ks_status ks_lrqk_factor(const float *Q, int32_t nq, const float *K, int32_t nk, int32_t d,
                         const ks_lrqk_factor_params *fp, float *aq, float *ak, float *bq, float *bk);

/* k-only estimate of a key's coordinates: a = k B_K^T (B_K B_K^T)^-1.
 * bk [r][d], k [d] -> a [r]. */
ks_status ks_lrqk_project(const float *bk, int32_t r, int32_t d, const float *k, float *a);

/* Decode: one new token with G queries q [G][d] (the GQA group, sharing B_Q)
 * and key k [d].  Alternating closed-form steps (public code's
 * _lrqk_decode_inv, lambdas folded as documented in p_lrqk.c):
 *   k^ <- k B_K^T (B_K B_K^T)^-1                                    (start)
 *   q^_g <- (l q_g B_Q^T + c_g + (q_g.k) k^)(l B_Q B_Q^T + W + k^T k^)^-1
 *   k^   <- (l k B_K^T + sum_g (q_g.k) q^_g)(l B_K B_K^T + sum_g q^_g^T q^_g)^-1
 * where W = A_KO^T A_KO is the Gram of the previous step's attended rows O
 * (gram [r][r], double) and c_g = q_g K_O^T A_KO with K_O the exact stored
 * keys of O: kao [d][r] = K_O^T A_KO (float; NULL: approximated from the
 * Gram as (q_g B_K^T) W, i.e. K_O ~ A_KO B_K; gram NULL too: no O term).  Stops when the mean squared
 * change of k^ is < tol or after iters rounds; then one gradient step on
 * B_Q, B_K with step ||dB||^2 / (sum ||x dB||^2 + 1e-6) (exact line search).
 * bq, bk [r][d] updated in place; qhat [G][r], khat [r] out. */
ks_status ks_lrqk_decode(float *bq, float *bk, int32_t r, int32_t d, const double *gram, const float *kao,
                         const float *q, int32_t G, const float *k, int32_t iters, float tol, float lambda, float *qhat,
                         float *khat);

/* The k largest of sc[0..m) into idx (any order; ties toward the lower
 * index, NaN lowest: ks_topk's contract, same set) in O(m) by quickselect
 * instead of ks_topk's O(m log k) heap.  tmp [m] scratch; returns min(k, m). */
int32_t ks_lrqk_topk(const float *sc, int32_t m, int32_t k, int32_t *idx, float *tmp);

/* The resident set's running sums, for the len rows entering (sign +1) or
 * leaving (-1) it, in row order: gram [r][r] += sign_x a_x^T a_x (only the
 * upper triangle, j >= i, is meaningful) and kao [hd][r] += sign_x k_x^T a_x,
 * for ak [len][r] (the rows' A_K) and keys [len][hd] (their exact keys).
 * Every SIMD level gives the same bits: each product is a multiply then an
 * add, in the same order. */
void ks_lrqk_gram_kao_add(float *gram, float *kao, const float *keys, const float *ak, const float *sign, int32_t len,
                          int32_t hd, int32_t r);

/* Which form ks_lrqk_gram_kao_add takes for rank r at the current SIMD
 * level: "avx512", "avx2", "neon" or "scalar" (tests/test_dispatch.c). */
const char *ks_lrqk_gram_kao_kernel_name(int32_t r);

/* Deterministic N(0, 1) fill (splitmix64 + Box-Muller). */
void ks_lrqk_randn(float *x, size_t n, uint64_t seed);

/* || X Y^T - A B^T ||_F / || X Y^T ||_F for X [nx][d], Y [ny][d], A [nx][r],
 * B [ny][r] (the tests' factorisation error). */
double ks_lrqk_rel_error(const float *X, int32_t nx, const float *Y, int32_t ny, int32_t d, const float *A,
                         const float *B, int32_t r);

#endif
