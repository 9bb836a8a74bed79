/*
 * lrqk_math.c — LRQK's numbers: solver, prefill factorisation, decode step.
 *
 * Every system LRQK solves is r x r (r = rank, 32 by default) with a
 * right-hand side of d (head dim) or G (query heads) columns, so a plain
 * Gaussian elimination with partial pivoting in double is both simplest and
 * fast enough; the big products (n x d times d x r) stay in fp32 with
 * inner loops over contiguous rows so the compiler vectorises them without
 * fast-math.  The matrices to invert are sums of Gram matrices, symmetric
 * positive semi-definite, which is why a tiny relative ridge is all the
 * regularisation needed (a randn start is full rank; a converged factor
 * with repeated columns is not).  See lrqk_math.h for the equations.
 */
#include "spec/lrqk_math.h"

#include "core/simd.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

ks_status ks_lrqk_solve(int32_t n, double *A, double *B, int32_t m) {
    if (n <= 0 || m < 0) return KS_FAIL(KS_ERR_INVALID_ARG, "lrqk solve: bad size %d x %d", n, m);
    double tr = 0;
    for (int32_t i = 0; i < n; i++) tr += fabs(A[(size_t)i * n + i]);
    if (!isfinite(tr)) return KS_FAIL(KS_ERR_INVALID_ARG, "lrqk solve: non-finite system");
    double ridge = 1e-7 * tr / n + 1e-30;
    for (int32_t i = 0; i < n; i++) A[(size_t)i * n + i] += ridge;
    for (int32_t c = 0; c < n; c++) {
        int32_t p = c;
        double best = fabs(A[(size_t)c * n + c]);
        for (int32_t i = c + 1; i < n; i++) {
            double v = fabs(A[(size_t)i * n + c]);
            if (v > best) best = v, p = i;
        }
        if (!(best > 0) || !isfinite(best)) return KS_FAIL(KS_ERR_INVALID_ARG, "lrqk solve: singular system");
        if (p != c) {
            for (int32_t j = 0; j < n; j++) {
                double t = A[(size_t)c * n + j];
                A[(size_t)c * n + j] = A[(size_t)p * n + j];
                A[(size_t)p * n + j] = t;
            }
            for (int32_t j = 0; j < m; j++) {
                double t = B[(size_t)c * m + j];
                B[(size_t)c * m + j] = B[(size_t)p * m + j];
                B[(size_t)p * m + j] = t;
            }
        }
        double inv = 1.0 / A[(size_t)c * n + c];
        for (int32_t i = c + 1; i < n; i++) {
            double f = A[(size_t)i * n + c] * inv;
            if (f == 0) continue;
            for (int32_t j = c; j < n; j++) A[(size_t)i * n + j] -= f * A[(size_t)c * n + j];
            for (int32_t j = 0; j < m; j++) B[(size_t)i * m + j] -= f * B[(size_t)c * m + j];
        }
    }
    for (int32_t c = n - 1; c >= 0; c--) {
        double inv = 1.0 / A[(size_t)c * n + c];
        for (int32_t j = 0; j < m; j++) {
            double s = B[(size_t)c * m + j];
            for (int32_t i = c + 1; i < n; i++) s -= A[(size_t)c * n + i] * B[(size_t)i * m + j];
            B[(size_t)c * m + j] = s * inv;
        }
    }
    for (size_t i = 0; i < (size_t)n * m; i++)
        if (!isfinite(B[i])) return KS_FAIL(KS_ERR_INVALID_ARG, "lrqk solve: non-finite solution");
    return KS_OK;
}

/* ---------------------------------------------------------- products -- */
/* The n-row products are the factorisation's whole cost (O(n d r) each);
 * they run on 4-lane GCC/clang vector extensions (SSE2's width) when the
 * inner dimension is a multiple of 4, scalar loops otherwise. */
typedef float lrqk_v4 __attribute__((vector_size(16)));

static inline lrqk_v4 v4_load(const float *p) {
    lrqk_v4 v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* o[0..m) += a * x[0..m) */
static inline void axpy(float *o, float a, const float *x, int32_t m) {
    int32_t j = 0;
    if (m % 4 == 0) {
        lrqk_v4 av = (lrqk_v4){0} + a;
        for (; j < m; j += 4) {
            lrqk_v4 v = v4_load(o + j) + av * v4_load(x + j);
            memcpy(o + j, &v, sizeof v);
        }
    }
    for (; j < m; j++) o[j] += a * x[j];
}

/* out [r][r] = A^T A for A [n][r] (fp32 rows, double result). */
static ks_status gram(const float *A, int32_t n, int32_t r, double *out) {
    float *acc = ks_calloc((size_t)r * r, sizeof(float));
    if (!acc) return KS_FAIL(KS_ERR_NOMEM, "lrqk: gram matrix of rank %d", r);
    for (int32_t e = 0; e < n; e++) {
        const float *a = A + (size_t)e * r;
        for (int32_t i = 0; i < r; i++) axpy(acc + (size_t)i * r, a[i], a, r);
    }
    for (size_t i = 0; i < (size_t)r * r; i++) out[i] = acc[i];
    ks_free(acc);
    return KS_OK;
}

/* out [r][d] = A^T X for A [n][r], X [n][d]; fp32 rows, double result. */
static void at_x(const float *A, const float *X, int32_t n, int32_t r, int32_t d, float *acc, double *out) {
    memset(acc, 0, sizeof(float) * (size_t)r * d);
    for (int32_t e = 0; e < n; e++) {
        const float *a = A + (size_t)e * r, *x = X + (size_t)e * d;
        for (int32_t i = 0; i < r; i++) axpy(acc + (size_t)i * d, a[i], x, d);
    }
    for (size_t i = 0; i < (size_t)r * d; i++) out[i] = acc[i];
}

/* out [n][r] = X S^T for X [n][d], S [r][d] (double -> transposed fp32 W [d][r]). */
static void x_st(const float *X, int32_t n, int32_t d, const double *S, int32_t r, float *W, float *out) {
    for (int32_t c = 0; c < d; c++)
        for (int32_t j = 0; j < r; j++) W[(size_t)c * r + j] = (float)S[(size_t)j * d + c];
    for (int32_t e = 0; e < n; e++) {
        const float *x = X + (size_t)e * d;
        float *o = out + (size_t)e * r;
        for (int32_t j = 0; j < r; j++) o[j] = 0;
        for (int32_t c = 0; c < d; c++) axpy(o, x[c], W + (size_t)c * r, r);
    }
}

/* fp32 dot product of two d-vectors */
static inline float dot(const float *a, const float *b, int32_t d) {
    int32_t c = 0;
    float s = 0;
    if (d % 4 == 0) {
        lrqk_v4 acc = {0};
        for (; c < d; c += 4) acc += v4_load(a + c) * v4_load(b + c);
        s = (acc[0] + acc[2]) + (acc[1] + acc[3]);
    }
    for (; c < d; c++) s += a[c] * b[c];
    return s;
}

/* out [r][r] = B B^T for B [r][d]. */
static void bbt(const float *B, int32_t r, int32_t d, double *out) {
    for (int32_t i = 0; i < r; i++)
        for (int32_t j = i; j < r; j++)
            out[(size_t)i * r + j] = out[(size_t)j * r + i] = dot(B + (size_t)i * d, B + (size_t)j * d, d);
}

void ks_lrqk_randn(float *x, size_t n, uint64_t seed) {
    uint64_t s = seed;
    for (size_t i = 0; i < n; i += 2) {
        double u[2];
        for (int k = 0; k < 2; k++) {
            uint64_t z = (s += 0x9E3779B97F4A7C15ull);
            z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
            z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
            z ^= z >> 31;
            u[k] = ((double)(z >> 11) + 0.5) / 9007199254740992.0; /* (0, 1) */
        }
        double rad = sqrt(-2.0 * log(u[0])), th = 6.283185307179586 * u[1];
        x[i] = (float)(rad * cos(th));
        if (i + 1 < n) x[i + 1] = (float)(rad * sin(th));
    }
}

/* B = (A^T A)^-1 A^T X: the least-squares right factor.  scratch: acc [r][d], rr [r][r]. */
static ks_status solve_b(const float *A, const float *X, int32_t n, int32_t r, int32_t d, float *acc, double *rr,
                         double *rd, float *B) {
    KS_TRY(gram(A, n, r, rr));
    at_x(A, X, n, r, d, acc, rd);
    KS_TRY(ks_lrqk_solve(r, rr, rd, d));
    for (size_t i = 0; i < (size_t)r * d; i++) B[i] = (float)rd[i];
    return KS_OK;
}

/* A_new = X (Y^T A_o + l B^T)(A_o^T A_o + l B B^T)^-1 for the other side's
 * A_o [ny][r], Y [ny][d]; this side's B [r][d], X [nx][d] -> A_new [nx][r]. */
static ks_status update_a(const float *X, int32_t nx, const float *Y, int32_t ny, const float *Ao, const float *B,
                          int32_t r, int32_t d, float lambda, float *acc, double *rr, double *rd, double *bb, float *W,
                          float *Anew) {
    KS_TRY(gram(Ao, ny, r, rr));
    bbt(B, r, d, bb);
    for (size_t i = 0; i < (size_t)r * r; i++) rr[i] += lambda * bb[i];
    at_x(Ao, Y, ny, r, d, acc, rd); /* A_o^T Y = (Y^T A_o)^T [r][d] */
    for (size_t i = 0; i < (size_t)r * d; i++) rd[i] += lambda * B[i];
    /* S sym: W^T = S^-1 (A_o^T Y + l B), A_new = X W */
    KS_TRY(ks_lrqk_solve(r, rr, rd, d));
    x_st(X, nx, d, rd, r, W, Anew);
    return KS_OK;
}

static double mse(const float *a, const float *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) {
        double t = (double)a[i] - b[i];
        s += t * t;
    }
    return n ? s / n : 0;
}

ks_status ks_lrqk_factor(const float *Q, int32_t nq, const float *K, int32_t nk, int32_t d,
                         const ks_lrqk_factor_params *fp, float *aq, float *ak, float *bq, float *bk) {
    int32_t r = fp->rank;
    if (r <= 0 || d <= 0 || nq <= 0 || nk <= 0)
        return KS_FAIL(KS_ERR_INVALID_ARG, "lrqk factor: bad shape (nq %d, nk %d, d %d, r %d)", nq, nk, d, r);
    float *AQ = ks_malloc(sizeof(float) * (size_t)nq * r), *AQn = ks_malloc(sizeof(float) * (size_t)nq * r);
    float *AKn = ks_malloc(sizeof(float) * (size_t)nk * r);
    float *acc = ks_malloc(sizeof(float) * (size_t)r * d), *W = ks_malloc(sizeof(float) * (size_t)r * d);
    double *rr = ks_malloc(sizeof(double) * (size_t)r * r), *bb = ks_malloc(sizeof(double) * (size_t)r * r);
    double *rd = ks_malloc(sizeof(double) * (size_t)r * d);
    ks_status st = !AQ || !AQn || !AKn || !acc || !W || !rr || !bb || !rd
                       ? KS_FAIL(KS_ERR_NOMEM, "lrqk factor of %d x %d keys, rank %d", nq, nk, r)
                       : KS_OK;
    if (st == KS_OK) ks_lrqk_randn(AQ, (size_t)nq * r, fp->seed);
    if (st == KS_OK) ks_lrqk_randn(ak, (size_t)nk * r, fp->seed ^ 0x5DEECE66Dull);
    for (int32_t it = 0; it < fp->iters && st == KS_OK; it++) {
        st = solve_b(AQ, Q, nq, r, d, acc, rr, rd, bq);
        if (st == KS_OK) st = solve_b(ak, K, nk, r, d, acc, rr, rd, bk);
        if (st == KS_OK) st = update_a(Q, nq, K, nk, ak, bq, r, d, fp->lambda, acc, rr, rd, bb, W, AQn);
        if (st == KS_OK) st = update_a(K, nk, Q, nq, AQn, bk, r, d, fp->lambda, acc, rr, rd, bb, W, AKn);
        if (st != KS_OK) break;
        double dq = mse(AQ, AQn, (size_t)nq * r), dk = mse(ak, AKn, (size_t)nk * r);
        memcpy(AQ, AQn, sizeof(float) * (size_t)nq * r);
        memcpy(ak, AKn, sizeof(float) * (size_t)nk * r);
        if ((dq > dk ? dq : dk) < fp->tol) break;
    }
    if (st == KS_OK) st = solve_b(AQ, Q, nq, r, d, acc, rr, rd, bq);
    if (st == KS_OK) st = solve_b(ak, K, nk, r, d, acc, rr, rd, bk);
    if (st == KS_OK && aq) memcpy(aq, AQ, sizeof(float) * (size_t)nq * r);
    ks_free(AQ);
    ks_free(AQn);
    ks_free(AKn);
    ks_free(acc);
    ks_free(W);
    ks_free(rr);
    ks_free(bb);
    ks_free(rd);
    return st;
}

ks_status ks_lrqk_project(const float *bk, int32_t r, int32_t d, const float *k, float *a) {
    if (r <= 0 || d <= 0) return KS_FAIL(KS_ERR_INVALID_ARG, "lrqk project: rank %d", r);
    double *rr = ks_malloc(sizeof(double) * ((size_t)r * r + r));
    if (!rr) return KS_FAIL(KS_ERR_NOMEM, "lrqk project: rank %d", r);
    double *rhs = rr + (size_t)r * r;
    bbt(bk, r, d, rr);
    for (int32_t i = 0; i < r; i++) {
        double s = 0;
        for (int32_t c = 0; c < d; c++) s += (double)bk[(size_t)i * d + c] * k[c];
        rhs[i] = s;
    }
    ks_status st = ks_lrqk_solve(r, rr, rhs, 1);
    if (st == KS_OK)
        for (int32_t i = 0; i < r; i++) a[i] = (float)rhs[i];
    ks_free(rr);
    return st;
}

/* One gradient step on B [r][d] for rows xs [n][r] against targets ts [n][d]:
 * dB = sum x^T (x B - t), B -= ||dB||^2 / (sum ||x dB||^2 + 1e-6) dB. */
static void grad_step(float *B, int32_t r, int32_t d, const float *xs, const float *ts, int32_t n, float *dB,
                      float *e) {
    memset(dB, 0, sizeof(float) * (size_t)r * d);
    for (int32_t g = 0; g < n; g++) {
        const float *x = xs + (size_t)g * r, *t = ts + (size_t)g * d;
        for (int32_t c = 0; c < d; c++) e[c] = -t[c];
        for (int32_t i = 0; i < r; i++)
            for (int32_t c = 0; c < d; c++) e[c] += x[i] * B[(size_t)i * d + c];
        for (int32_t i = 0; i < r; i++)
            for (int32_t c = 0; c < d; c++) dB[(size_t)i * d + c] += x[i] * e[c];
    }
    double nd = 0, nxd = 0;
    for (size_t i = 0; i < (size_t)r * d; i++) nd += (double)dB[i] * dB[i];
    for (int32_t g = 0; g < n; g++) {
        const float *x = xs + (size_t)g * r;
        for (int32_t c = 0; c < d; c++) {
            double s = 0;
            for (int32_t i = 0; i < r; i++) s += (double)x[i] * dB[(size_t)i * d + c];
            nxd += s * s;
        }
    }
    float lr = (float)(nd / (nxd + 1e-6));
    if (!isfinite(lr)) return;
    for (size_t i = 0; i < (size_t)r * d; i++) B[i] -= lr * dB[i];
}

ks_status ks_lrqk_decode(float *bq, float *bk, int32_t r, int32_t d, const double *gram_o, const float *kao,
                         const float *q, int32_t G, const float *k, int32_t iters, float tol, float lambda, float *qhat,
                         float *khat) {
    if (r <= 0 || G <= 0 || d <= 0)
        return KS_FAIL(KS_ERR_INVALID_ARG, "lrqk decode: rank %d / group %d out of range", r, G);
    size_t rr = (size_t)r * r, rg = (size_t)r * G;
    /* BQ2, BK2, M [r][r]; R, c, qh [r][G]; kb, kh, nk, qbq, qbk [r]; s [G] */
    double *BQ2 = ks_scratch(KS_SCRATCH_MATH0, sizeof(double) * (3 * rr + 3 * rg + 5 * (size_t)r + (size_t)G));
    float *dB = ks_scratch(KS_SCRATCH_MATH1, sizeof(float) * ((size_t)r * d + (size_t)d));
    if (!BQ2 || !dB) return KS_FAIL(KS_ERR_NOMEM, "lrqk decode: rank %d", r);
    double *BK2 = BQ2 + rr, *M = BK2 + rr, *R = M + rr, *c = R + rg, *qh = c + rg, *kb = qh + rg, *kh = kb + r,
           *nk = kh + r, *qbq = nk + r, *qbk = qbq + r, *s = qbk + r;
    ks_status st = KS_OK;
    bbt(bq, r, d, BQ2);
    bbt(bk, r, d, BK2);
    for (int32_t i = 0; i < r; i++) {
        double t = 0;
        for (int32_t x = 0; x < d; x++) t += (double)bk[(size_t)i * d + x] * k[x];
        kb[i] = t;
    }
    for (int32_t g = 0; g < G; g++) {
        const float *qg = q + (size_t)g * d;
        double dot = 0;
        for (int32_t x = 0; x < d; x++) dot += (double)qg[x] * k[x];
        s[g] = dot;
        for (int32_t i = 0; i < r; i++) {
            double a = 0, b = 0;
            for (int32_t x = 0; x < d; x++) {
                a += (double)bq[(size_t)i * d + x] * qg[x];
                b += (double)bk[(size_t)i * d + x] * qg[x];
            }
            qbq[i] = a, qbk[i] = b;
        }
        /* c_g = l q B_Q^T + q K_O^T A_KO: with the exact keys of O (kao), or
         * (q B_K^T) W when only the Gram is known (K_O ~ A_KO B_K) */
        for (int32_t j = 0; j < r; j++) {
            double t = lambda * qbq[j];
            if (kao)
                for (int32_t x = 0; x < d; x++) t += (double)qg[x] * kao[(size_t)x * r + j];
            else if (gram_o)
                for (int32_t i = 0; i < r; i++) t += qbk[i] * gram_o[(size_t)i * r + j];
            c[(size_t)g * r + j] = t;
        }
    }
    /* start: k-only least squares */
    memcpy(M, BK2, sizeof(double) * rr);
    memcpy(kh, kb, sizeof(double) * (size_t)r);
    if ((st = ks_lrqk_solve(r, M, kh, 1)) != KS_OK) goto out;
    int32_t rounds = iters > 1 ? iters : 1;
    for (int32_t it = 0; it < rounds; it++) {
        /* q^: (l BQ2 + W + k^ k^T) X = R, R [r][G] */
        for (int32_t i = 0; i < r; i++)
            for (int32_t j = 0; j < r; j++)
                M[(size_t)i * r + j] = lambda * BQ2[(size_t)i * r + j] + (gram_o ? gram_o[(size_t)i * r + j] : 0) +
                                       kh[i] * kh[j];
        for (int32_t i = 0; i < r; i++)
            for (int32_t g = 0; g < G; g++) R[(size_t)i * G + g] = c[(size_t)g * r + i] + s[g] * kh[i];
        if ((st = ks_lrqk_solve(r, M, R, G)) != KS_OK) goto out;
        for (int32_t g = 0; g < G; g++)
            for (int32_t i = 0; i < r; i++) qh[(size_t)g * r + i] = R[(size_t)i * G + g];
        /* k^: (l BK2 + sum q^ q^T) x = l k B_K^T + sum s q^ */
        for (int32_t i = 0; i < r; i++) {
            double t = lambda * kb[i];
            for (int32_t g = 0; g < G; g++) t += s[g] * qh[(size_t)g * r + i];
            nk[i] = t;
            for (int32_t j = 0; j < r; j++) {
                double m = lambda * BK2[(size_t)i * r + j];
                for (int32_t g = 0; g < G; g++) m += qh[(size_t)g * r + i] * qh[(size_t)g * r + j];
                M[(size_t)i * r + j] = m;
            }
        }
        if ((st = ks_lrqk_solve(r, M, nk, 1)) != KS_OK) goto out;
        double delta = 0;
        for (int32_t i = 0; i < r; i++) delta += (nk[i] - kh[i]) * (nk[i] - kh[i]);
        memcpy(kh, nk, sizeof(double) * (size_t)r);
        if (delta / r < tol) break;
    }
    for (int32_t i = 0; i < r; i++) khat[i] = (float)kh[i];
    for (size_t i = 0; i < (size_t)G * r; i++) qhat[i] = (float)qh[i];
    float *e = dB + (size_t)r * d;
    grad_step(bq, r, d, qhat, q, G, dB, e);
    grad_step(bk, r, d, khat, k, 1, dB, e);
out:
    return st;
}

/* The k largest of sc[0..m) into idx (any order), ties toward the lower
 * index, NaN lowest — ks_topk's contract in O(m): quickselect the k-th
 * largest value on a copy, then take everything above it and the lowest
 * indices equal to it.  tmp [m]. */
int32_t ks_lrqk_topk(const float *sc, int32_t m, int32_t k, int32_t *idx, float *tmp) {
    if (k <= 0 || m <= 0) return 0;
    if (k >= m) {
        for (int32_t i = 0; i < m; i++) idx[i] = i;
        return m;
    }
    for (int32_t i = 0; i < m; i++) tmp[i] = sc[i] != sc[i] ? -INFINITY : sc[i];
    /* Hoare-style quickselect for the element of descending rank k - 1 */
    int32_t lo = 0, hi = m - 1, want = k - 1;
    while (lo < hi) {
        float piv = tmp[lo + (hi - lo) / 2];
        int32_t i = lo, j = hi;
        while (i <= j) {
            while (tmp[i] > piv) i++;
            while (tmp[j] < piv) j--;
            if (i <= j) {
                float t = tmp[i];
                tmp[i++] = tmp[j];
                tmp[j--] = t;
            }
        }
        if (want <= j) hi = j;
        else if (want >= i) lo = i;
        else break;
    }
    float thr = tmp[want];
    int32_t n = 0;
    for (int32_t i = 0; i < m; i++) {
        float v = sc[i] != sc[i] ? -INFINITY : sc[i];
        if (v > thr) idx[n++] = i;
    }
    for (int32_t i = 0; i < m && n < k; i++) {
        float v = sc[i] != sc[i] ? -INFINITY : sc[i];
        if (v == thr) idx[n++] = i;
    }
    return n;
}

double ks_lrqk_rel_error(const float *X, int32_t nx, const float *Y, int32_t ny, int32_t d, const float *A,
                         const float *B, int32_t r) {
    double num = 0, den = 0;
    for (int32_t i = 0; i < nx; i++)
        for (int32_t j = 0; j < ny; j++) {
            double t = 0, a = 0;
            for (int32_t c = 0; c < d; c++) t += (double)X[(size_t)i * d + c] * Y[(size_t)j * d + c];
            for (int32_t c = 0; c < r; c++) a += (double)A[(size_t)i * r + c] * B[(size_t)j * r + c];
            num += (t - a) * (t - a);
            den += t * t;
        }
    return den > 0 ? sqrt(num / den) : 0;
}

/* ------------------------------------------- Gram and K_O^T A_KO updates -- */

/* gram [r][r] += sign * a^T a, on the blocks at or right of the diagonal
 * (the lower triangle is mirrored when the Gram is read); 4-lane vector
 * extensions (SSE2's width, no ABI questions) when r % 4 == 0. */
static void gram_add(float *gram, const float *a, int32_t r, float sign) {
    if (r % 4 == 0) {
        for (int32_t i = 0; i < r; i++) {
            lrqk_v4 ai = (lrqk_v4){0} + sign * a[i];
            float *g = gram + (size_t)i * r;
            for (int32_t j = i & ~3; j < r; j += 4) {
                lrqk_v4 v = v4_load(g + j) + ai * v4_load(a + j);
                memcpy(g + j, &v, sizeof v);
            }
        }
        return;
    }
    for (int32_t i = 0; i < r; i++)
        for (int32_t j = i; j < r; j++) gram[(size_t)i * r + j] += sign * a[i] * a[j];
}

static void kao_add(float *kao, const float *k, const float *a, int32_t hd, int32_t r, float sign) {
    for (int32_t c = 0; c < hd; c++) {
        float kc = sign * k[c];
        float *row = kao + (size_t)c * r;
        for (int32_t j = 0; j < r; j++) row[j] += kc * a[j];
    }
}

#if defined(__x86_64__)
/* The same updates on zmm, r % 16 == 0 and r <= 64: a row of the Gram or of
 * K_O^T A_KO stays in registers while every row of the run is added to it.
 * Each element still receives the same products in the same order, each a
 * multiply then an add (the library is built without FMA contraction), so
 * the sums are bit for bit those of the loops above; only the lower
 * triangle of the Gram, which is never read, is touched more.  With
 * selections that change most of their rows a step (noise KV), these
 * updates were most of LRQK's step at 32K. */
__attribute__((target("avx512f"))) static void gram_kao_add_avx512(float *gram, float *kao, const float *keys,
                                                                     const float *ak, const float *sign, int32_t len,
                                                                     int32_t hd, int32_t r) {
    const int nz = r / 16;
    for (int32_t i = 0; i < r; i++) { /* Gram row i, from column block i / 16 */
        float *g = gram + (size_t)i * r;
        int z0 = i / 16;
        __m512 acc[4];
        for (int z = z0; z < nz; z++) acc[z] = _mm512_loadu_ps(g + 16 * z);
        for (int32_t x = 0; x < len; x++) {
            const float *a = ak + (size_t)x * r;
            __m512 ai = _mm512_set1_ps(0.0f + sign[x] * a[i]);
            for (int z = z0; z < nz; z++)
                acc[z] = _mm512_add_ps(acc[z], _mm512_mul_ps(ai, _mm512_loadu_ps(a + 16 * z)));
        }
        for (int z = z0; z < nz; z++) _mm512_storeu_ps(g + 16 * z, acc[z]);
    }
    for (int32_t c = 0; c < hd; c++) { /* K_O^T A_KO row c */
        float *row = kao + (size_t)c * r;
        __m512 acc[4];
        for (int z = 0; z < nz; z++) acc[z] = _mm512_loadu_ps(row + 16 * z);
        for (int32_t x = 0; x < len; x++) {
            const float *a = ak + (size_t)x * r;
            __m512 kc = _mm512_set1_ps(sign[x] * keys[(size_t)x * hd + c]);
            for (int z = 0; z < nz; z++) acc[z] = _mm512_add_ps(acc[z], _mm512_mul_ps(kc, _mm512_loadu_ps(a + 16 * z)));
        }
        for (int z = 0; z < nz; z++) _mm512_storeu_ps(row + 16 * z, acc[z]);
    }
}

/* gram_kao_add_avx512 on ymm for AVX2 hosts, r % 8 == 0 and r <= 64: the
 * same products and adds in the same order (multiply, then add: no FMA), so
 * bit for bit the loops above. */
__attribute__((target("avx2"))) static void gram_kao_add_avx2(float *gram, float *kao, const float *keys,
                                                                const float *ak, const float *sign, int32_t len,
                                                                int32_t hd, int32_t r) {
    const int nz = r / 8;
    for (int32_t i = 0; i < r; i++) { /* Gram row i, from column block i / 8 */
        float *g = gram + (size_t)i * r;
        int z0 = i / 8;
        __m256 acc[8];
        for (int z = z0; z < nz; z++) acc[z] = _mm256_loadu_ps(g + 8 * z);
        for (int32_t x = 0; x < len; x++) {
            const float *a = ak + (size_t)x * r;
            __m256 ai = _mm256_set1_ps(0.0f + sign[x] * a[i]);
            for (int z = z0; z < nz; z++)
                acc[z] = _mm256_add_ps(acc[z], _mm256_mul_ps(ai, _mm256_loadu_ps(a + 8 * z)));
        }
        for (int z = z0; z < nz; z++) _mm256_storeu_ps(g + 8 * z, acc[z]);
    }
    for (int32_t c = 0; c < hd; c++) { /* K_O^T A_KO row c */
        float *row = kao + (size_t)c * r;
        __m256 acc[8];
        for (int z = 0; z < nz; z++) acc[z] = _mm256_loadu_ps(row + 8 * z);
        for (int32_t x = 0; x < len; x++) {
            const float *a = ak + (size_t)x * r;
            __m256 kc = _mm256_set1_ps(sign[x] * keys[(size_t)x * hd + c]);
            for (int z = 0; z < nz; z++) acc[z] = _mm256_add_ps(acc[z], _mm256_mul_ps(kc, _mm256_loadu_ps(a + 8 * z)));
        }
        for (int z = 0; z < nz; z++) _mm256_storeu_ps(row + 8 * z, acc[z]);
    }
}
#endif

#if defined(__aarch64__)
/* gram_kao_add_avx2 in NEON quads (every AArch64 CPU), r % 4 == 0 and
 * r <= 64: a row of the Gram or of K_O^T A_KO (at most 16 quads of the 32
 * registers) stays in registers while every row of the run is added to it.
 * vmulq_f32 then vaddq_f32, never vfmaq (the library is built without FMA
 * contraction, -std=c11), so each element gets the same products in the same
 * order as the portable loops: bit for bit theirs on the Gram's upper
 * triangle and all of K_O^T A_KO, which tests/test_p_lrqk.c checks at every
 * level. */
static void gram_kao_add_neon(float *gram, float *kao, const float *keys, const float *ak, const float *sign,
                              int32_t len, int32_t hd, int32_t r) {
    const int nz = r / 4;
    for (int32_t i = 0; i < r; i++) { /* Gram row i, from column quad i / 4 */
        float *g = gram + (size_t)i * r;
        int z0 = i / 4;
        float32x4_t acc[16];
        for (int z = z0; z < nz; z++) acc[z] = vld1q_f32(g + 4 * z);
        for (int32_t x = 0; x < len; x++) {
            const float *a = ak + (size_t)x * r;
            float32x4_t ai = vdupq_n_f32(0.0f + sign[x] * a[i]);
            for (int z = z0; z < nz; z++) acc[z] = vaddq_f32(acc[z], vmulq_f32(ai, vld1q_f32(a + 4 * z)));
        }
        for (int z = z0; z < nz; z++) vst1q_f32(g + 4 * z, acc[z]);
    }
    for (int32_t c = 0; c < hd; c++) { /* K_O^T A_KO row c */
        float *row = kao + (size_t)c * r;
        float32x4_t acc[16];
        for (int z = 0; z < nz; z++) acc[z] = vld1q_f32(row + 4 * z);
        for (int32_t x = 0; x < len; x++) {
            const float *a = ak + (size_t)x * r;
            float32x4_t kc = vdupq_n_f32(sign[x] * keys[(size_t)x * hd + c]);
            for (int z = 0; z < nz; z++) acc[z] = vaddq_f32(acc[z], vmulq_f32(kc, vld1q_f32(a + 4 * z)));
        }
        for (int z = 0; z < nz; z++) vst1q_f32(row + 4 * z, acc[z]);
    }
}
#endif

const char *ks_lrqk_gram_kao_kernel_name(int32_t r) {
#if defined(__x86_64__)
    if (r % 16 == 0 && r <= 64 && ks_simd_current() >= KS_SIMD_AVX512) return "avx512";
    if (r % 8 == 0 && r <= 64 && ks_simd_current() >= KS_SIMD_AVX2) return "avx2";
#elif defined(__aarch64__)
    if (r % 4 == 0 && r <= 64 && ks_simd_current() >= KS_SIMD_NEON) return "neon";
#endif
    (void)r;
    return "scalar";
}

void ks_lrqk_gram_kao_add(float *gram, float *kao, const float *keys, const float *ak, const float *sign, int32_t len,
                          int32_t hd, int32_t r) {
#if defined(__x86_64__)
    if (r % 16 == 0 && r <= 64 && ks_simd_current() >= KS_SIMD_AVX512) {
        gram_kao_add_avx512(gram, kao, keys, ak, sign, len, hd, r);
        return;
    }
    if (r % 8 == 0 && r <= 64 && ks_simd_current() >= KS_SIMD_AVX2) { /* also AVX-512 hosts at r % 16 != 0 */
        gram_kao_add_avx2(gram, kao, keys, ak, sign, len, hd, r);
        return;
    }
#elif defined(__aarch64__)
    if (r % 4 == 0 && r <= 64 && ks_simd_current() >= KS_SIMD_NEON) {
        gram_kao_add_neon(gram, kao, keys, ak, sign, len, hd, r);
        return;
    }
#endif
    for (int32_t x = 0; x < len; x++) {
        gram_add(gram, ak + (size_t)x * r, r, sign[x]);
        kao_add(kao, keys + (size_t)x * hd, ak + (size_t)x * r, hd, r, sign[x]);
    }
}
