/*
 * p_lrqk.c — `lrqk` (Low Rank Query and Key attention, Li et al.): select
 * the top-k entries by a rank-r proxy of q . k, plus sinks and the window.
 *
 * Prefill (obs_window = -1: the queries of every prompt row): per (layer,
 * KV head) the prompt's queries Q and the stored keys K are factored
 * jointly, Q ~ A_Q B_Q, K ~ A_K B_K with Q K^T ~ A_Q A_K^T (lrqk_math.c,
 * block coordinate descent in fp32, randn start with a fixed seed per
 * (layer, head), `iters` rounds or until the mean squared change of A_Q and
 * A_K is below `tol`).  GQA: the public code factors per query head with K
 * repeated, which stores G copies of A_K.  Here the G query heads of a group
 * are *stacked* as G x n_obs rows of Q sharing one B_Q, so one A_K [n][r]
 * per KV head serves the whole group and the
 * factorisation sees every head's queries; A_Q is discarded after prefill.
 *
 * Decode, per (seq, layer, KV head): on_append (serial, main thread) only
 * reserves the new row of A_K and keeps k; select_layer (parallel) runs the
 * paper's alternating closed-form steps for q^_g (one per query head, shared system) and k^ against B_Q, B_K and
 * the previous step's attended rows O, overwrites the new row of A_K with
 * k^, updates B_Q and B_K by one exact-line-search gradient step, and ranks
 * [sink, n - window) by max_g A_K q^_g (no softmax; max over the group: an
 * entry any head needs is kept, like the union of the public code's
 * per-head selections).  Token granularity; n_select entries.  A token
 * no select saw (dense phase: budget >= entries, or nothing to choose) gets
 * the k-only estimate k B_K^T (B_K B_K^T)^-1 (the public code's starting
 * guess) at the next append.
 *
 * The exact-key set K_Omega ("Efficient Low Rank Attention for Long-Context
 * Inference in Large Language Models", Section 4, decode stage): the
 * q-update's term q K_O^T A_KO uses the full-precision stored keys of the
 * tokens the previous step attended (the selected entries, sinks and
 * window), not a low-rank reconstruction A_KO B_K.  Both K_O^T A_KO
 * [hd][r] and the Gram A_KO^T A_KO [r][r] are kept incrementally (fp32) as
 * entries enter and leave O — the hit/miss bookkeeping — reading only the
 * keys of the entries that change (env->read_keys, in runs), and recomputed
 * from scratch every 64 steps against drift.
 *
 * Hit/miss: O of the previous select (the selected entries plus the sinks
 * and window the framework added) is what the paper's GPU cache holds; a
 * selected entry in it is a hit, else a miss (a transfer).  counters()
 * reports selections, hits, misses.
 *
 * No prefill (bench fills KV synthetically; a head whose entries no longer
 * match A_K, e.g. changed outside the hooks): the
 * first select_layer of the (seq, layer, head) rebuilds the factors from the
 * stored keys alone (read_keys) with Q := K, i.e. the keys' own low-rank
 * subspace, then proceeds as above.  That one-off cost lands in the first
 * decode step.  Numeric failure (non-finite keys/queries) answers `all`.
 *
 * State per (seq, layer >= dense_layers, KV head), allocated at the first
 * on_prefill / select of the sequence and freed by seq_reset:
 *   4 (n_ctx (r + 2) + 3 r hd + hd + r^2) + n_ctx / 4 bytes
 * (A_K [n_ctx][r], B_Q and B_K [r][hd], K_O^T A_KO [hd][r], the pending key, the Gram, the
 * resident bitmaps, and [2][n_ctx] score scratch kept per slot so a step
 * allocates little); e.g. n_ctx 8192, r 32, hd 64: 1.09 MiB per KV head,
 * 140 MiB per sequence for Llama-3.2-1B (16 layers x 8 KV heads).
 * Prefill adds transient 4 (n_ctx hd + G n hd + 2 G n r + n r) bytes (n prompt rows).
 * The paper applies LRQK to every layer: default_dense_layers = 0.  `rank`
 * may be anything up to head_dim (the paper's range r in [1, d]); larger
 * values are clamped to head_dim (Q K^T has rank <= head_dim).
 */
#include "spec/lrqk_math.h"
#include "policy/policy.h"
#include "core/simd.h"
#include "tensor/simd_avx2.h"

#if defined(__aarch64__)
#include <arm_neon.h>
#endif
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

enum { LRQK_MAX_RANK = 1024 }; /* argument bound; the rank used is min(rank, head_dim) */

typedef struct {
    int32_t n;          /* A_K rows filled; -1: no valid factors (rebuild at select) */
    int32_t final_rows; /* rows [0, final_rows) of A_K are final; row n - 1 may await select's k^ */
    int32_t updated;    /* n at the last B update */
    float *ak;          /* [n_ctx][r] */
    float *bq, *bk;     /* [r][hd] */
    float *kpend;       /* [hd] key of the newest entry */
    uint64_t *res;      /* [n_ctx / 64 + 1] entries attended at the previous select (O) */
    uint64_t *nres;     /* [n_ctx / 64 + 1] scratch: O of this select */
    float *sc;          /* [2][n_ctx] scratch: proxy scores, top-k workspace */
    float *gram;        /* [r][r] sum over O of A_K[e]^T A_K[e] */
    float *kao;         /* [hd][r] sum over O of k_e^T A_K[e], k_e the exact stored key (K_Omega) */
    int32_t gram_age;   /* incremental updates since the last full recompute */
    uint64_t selections, hits, misses;
} lrqk_slot;

typedef struct {
    ks_policy_env env;
    int32_t rank, iters, dense;
    float tol, lambda;
    lrqk_slot **slots;  /* [n_seq][n_layer][n_head_kv], NULL until used */
    uint64_t done_sel, done_hits, done_misses; /* of slots freed by seq_reset */
} lrqk_state;

static const char *const lrqk_args[] = {"rank", "iters", "tol", "lambda", NULL};

static size_t slot_index(const lrqk_state *s, int32_t seq, int32_t layer, int32_t head) {
    return ((size_t)seq * s->env.n_layer + layer) * s->env.n_head_kv + head;
}

static int32_t words_of(const lrqk_state *s) { return s->env.n_ctx / 64 + 1; }

static void slot_free(lrqk_state *s, lrqk_slot *t);

/* NULL when refused (nothing kept: a later call tries again). */
static lrqk_slot *slot_get(lrqk_state *s, int32_t seq, int32_t layer, int32_t head) {
    lrqk_slot **p = &s->slots[slot_index(s, seq, layer, head)];
    if (!*p) {
        int32_t r = s->rank, hd = s->env.head_dim;
        lrqk_slot *t = ks_calloc(1, sizeof *t);
        if (!t) return NULL;
        t->n = -1;
        t->updated = -1;
        t->ak = ks_malloc(sizeof(float) * (size_t)s->env.n_ctx * r);
        t->bq = ks_calloc((size_t)r * hd, sizeof(float));
        t->bk = ks_calloc((size_t)r * hd, sizeof(float));
        t->kpend = ks_calloc((size_t)hd, sizeof(float));
        t->res = ks_calloc((size_t)words_of(s), sizeof(uint64_t));
        t->nres = ks_calloc((size_t)words_of(s), sizeof(uint64_t));
        t->sc = ks_malloc(sizeof(float) * 2 * (size_t)s->env.n_ctx);
        t->gram = ks_calloc((size_t)r * r, sizeof(float));
        t->kao = ks_calloc((size_t)hd * r, sizeof(float));
        if (!t->ak || !t->bq || !t->bk || !t->kpend || !t->res || !t->nres || !t->sc || !t->gram || !t->kao) {
            slot_free(s, t);
            return NULL;
        }
        *p = t;
    }
    return *p;
}

static void slot_free(lrqk_state *s, lrqk_slot *t) {
    if (!t) return;
    s->done_sel += t->selections;
    s->done_hits += t->hits;
    s->done_misses += t->misses;
    ks_free(t->ak);
    ks_free(t->bq);
    ks_free(t->bk);
    ks_free(t->kpend);
    ks_free(t->res);
    ks_free(t->nres);
    ks_free(t->sc);
    ks_free(t->gram);
    ks_free(t->kao);
    ks_free(t);
}

static void slot_clear_resident(const lrqk_state *s, lrqk_slot *t) {
    memset(t->res, 0, sizeof(uint64_t) * (size_t)words_of(s));
    memset(t->gram, 0, sizeof(float) * (size_t)s->rank * s->rank);
    memset(t->kao, 0, sizeof(float) * (size_t)s->env.head_dim * s->rank);
    t->gram_age = 0;
}

static ks_status lrqk_create(const ks_policy_env *env, const ks_policy_spec *p, void **state) {
    int64_t rank, iters;
    double tol, lambda;
    KS_TRY(ks_args_int(p->args, "rank", 32, 1, LRQK_MAX_RANK, &rank));
    KS_TRY(ks_args_int(p->args, "iters", 2, 1, 100, &iters));
    KS_TRY(ks_args_float(p->args, "tol", 0.01, 0.0, 1e30, &tol));
    KS_TRY(ks_args_float(p->args, "lambda", 1.0, 1e-6, 1e6, &lambda));
    if (env->n_head_kv <= 0 || env->n_head % env->n_head_kv != 0 || env->n_head / env->n_head_kv > 64 ||
        env->head_dim <= 0 || env->n_ctx <= 0 || env->n_seq <= 0 || env->n_layer <= 0)
        return KS_FAIL(KS_ERR_INVALID_ARG, "lrqk: unsupported shape (%d heads, %d KV heads, head dim %d)", env->n_head,
                       env->n_head_kv, env->head_dim);
    lrqk_state *s = ks_calloc(1, sizeof *s);
    if (!s) return KS_FAIL(KS_ERR_NOMEM, "lrqk policy");
    s->env = *env;
    /* a rank above the head dim adds nothing (Q K^T has rank <= hd) and
     * leaves B_Q B_Q^T singular: clamp */
    s->rank = (int32_t)(rank < env->head_dim ? rank : env->head_dim);
    s->iters = (int32_t)iters;
    s->tol = (float)tol;
    s->lambda = (float)lambda;
    s->dense = p->dense_layers >= 0 ? p->dense_layers : 0;
    s->slots = ks_calloc((size_t)env->n_seq * env->n_layer * env->n_head_kv, sizeof(lrqk_slot *));
    if (!s->slots) {
        ks_free(s);
        return KS_FAIL(KS_ERR_NOMEM, "lrqk: %d x %d x %d head slots", env->n_seq, env->n_layer, env->n_head_kv);
    }
    *state = s;
    return KS_OK;
}

static void lrqk_destroy(void *state) {
    lrqk_state *s = state;
    size_t n = (size_t)s->env.n_seq * s->env.n_layer * s->env.n_head_kv;
    for (size_t i = 0; i < n; i++) slot_free(s, s->slots[i]);
    ks_free(s->slots);
    ks_free(s);
}

static void lrqk_seq_reset(void *state, int32_t seq) {
    lrqk_state *s = state;
    if (seq < 0 || seq >= s->env.n_seq) return;
    for (int32_t l = 0; l < s->env.n_layer; l++)
        for (int32_t h = 0; h < s->env.n_head_kv; h++) {
            lrqk_slot **p = &s->slots[slot_index(s, seq, l, h)];
            slot_free(s, *p);
            *p = NULL;
        }
}

static uint64_t seed_of(int32_t layer, int32_t head) {
    return 0x4C52514Bull * 0x9E3779B97F4A7C15ull + ((uint64_t)layer << 20) + (uint64_t)head;
}

/* Factor Q [nq][hd] (NULL: Q := K) against the n stored keys of (seq, layer,
 * head) into the slot; keys [n][hd] is scratch. */
static ks_status factor_slot(lrqk_state *s, lrqk_slot *t, int32_t seq, int32_t layer, int32_t head, const float *Q,
                             int32_t nq, int32_t n, float *keys) {
    const ks_policy_env *e = &s->env;
    t->n = -1;
    t->updated = -1;
    slot_clear_resident(s, t);
    KS_TRY(e->read_keys(e->svc, seq, layer, head, 0, n, keys));
    ks_lrqk_factor_params fp = {.rank = s->rank, .iters = s->iters, .tol = s->tol, .lambda = s->lambda,
                                .seed = seed_of(layer, head)};
    if (ks_lrqk_factor(Q ? Q : keys, Q ? nq : n, keys, n, e->head_dim, &fp, NULL, t->ak, t->bq, t->bk) != KS_OK)
        return KS_OK; /* numeric trouble (non-finite keys): stay invalid, select answers `all` */
    memcpy(t->kpend, keys + (size_t)(n - 1) * e->head_dim, sizeof(float) * (size_t)e->head_dim);
    t->n = t->final_rows = n;
    return KS_OK;
}

/* The prompt's factorisation: one task per (layer >= dense, KV head), taken
 * from an atomic counter by the context's workers.  Each task owns its
 * slot, and keys and Q are per-worker scratch; the factors depend only on
 * (layer, head) (seed_of), so the result does not depend on who ran what. */
typedef struct {
    lrqk_state *s;
    const ks_prefill_info *info;
    int32_t nobs, total;
    float *keys, *Q;            /* [n_workers][n_ctx * hd], [n_workers][nobs * G * hd] */
    _Atomic int next;
    _Atomic int failed;         /* the first failure's status and message are kept */
    ks_status st;
    char msg[512];              /* ks_last_error of the worker that failed (it is per thread) */
} lrqk_prefill_job;

static void prefill_worker(void *arg, int ith, int nth) {
    (void)nth;
    lrqk_prefill_job *j = arg;
    lrqk_state *s = j->s;
    const ks_policy_env *e = &s->env;
    int32_t G = e->n_head / e->n_head_kv, hd = e->head_dim, nkv = e->n_head_kv;
    float *keys = j->keys + (size_t)ith * e->n_ctx * hd;
    float *Q = j->nobs ? j->Q + (size_t)ith * j->nobs * G * hd : NULL;
    for (;;) {
        int task = atomic_fetch_add(&j->next, 1);
        if (task >= j->total || atomic_load(&j->failed)) break;
        int32_t l = s->dense + task / nkv, h = task % nkv;
        int32_t n = ks_policy_kv_n_entries(e, j->info->seq, l, h);
        lrqk_slot *t = slot_get(s, j->info->seq, l, h);
        if (!t) {
            if (!atomic_exchange(&j->failed, 1)) {
                j->st = KS_ERR_NOMEM;
                snprintf(j->msg, sizeof j->msg, "factors of layer %d head %d refused", l, h);
            }
            break;
        }
        if (n <= 0) { /* nothing stored: no factors, rebuilt at the first select */
            t->n = -1;
            continue;
        }
        const float *lq = j->nobs ? j->info->obs_q + (size_t)l * j->nobs * e->n_head * hd : NULL;
        for (int32_t r = 0; r < j->nobs; r++) /* stacked group: row (r, g) */
            memcpy(Q + (size_t)r * G * hd, lq + ((size_t)r * e->n_head + (size_t)h * G) * hd,
                   sizeof(float) * (size_t)G * hd);
        ks_status st = factor_slot(s, t, j->info->seq, l, h, Q, j->nobs * G, n, keys);
        if (st != KS_OK && !atomic_exchange(&j->failed, 1)) {
            j->st = st;
            snprintf(j->msg, sizeof j->msg, "%s", ks_last_error());
        }
    }
}

static ks_status lrqk_prefill(void *state, const ks_prefill_info *info) {
    lrqk_state *s = state;
    const ks_policy_env *e = &s->env;
    int32_t G = e->n_head / e->n_head_kv, hd = e->head_dim, nobs = info->n_obs > 0 && info->obs_q ? info->n_obs : 0;
    if (info->seq < 0 || info->seq >= e->n_seq) return KS_FAIL(KS_ERR_INVALID_ARG, "lrqk: sequence %d", info->seq);
    int workers = e->pool ? ks_pool_size(e->pool) : 1;
    lrqk_prefill_job j = {.s = s, .info = info, .nobs = nobs, .total = (e->n_layer - s->dense) * e->n_head_kv,
                          .st = KS_OK};
    if (j.total <= 0) return KS_OK;
    j.keys = ks_malloc(sizeof(float) * (size_t)workers * e->n_ctx * hd);
    j.Q = nobs ? ks_malloc(sizeof(float) * (size_t)workers * nobs * G * hd) : NULL;
    if (!j.keys || (nobs && !j.Q)) {
        ks_free(j.keys);
        ks_free(j.Q);
        return KS_FAIL(KS_ERR_NOMEM, "lrqk prefill: keys of %d workers", workers);
    }
    atomic_init(&j.next, 0);
    atomic_init(&j.failed, 0);
    ks_pool_run(e->pool, prefill_worker, &j);
    ks_free(j.keys);
    ks_free(j.Q);
    return j.st == KS_OK ? KS_OK : KS_FAIL(j.st, "lrqk prefill: %s", j.msg);
}

static void lrqk_append(void *state, int32_t seq, int32_t layer, int32_t head, int32_t pos, const float *k) {
    (void)pos;
    lrqk_state *s = state;
    if (layer < s->dense || layer >= s->env.n_layer || seq < 0 || seq >= s->env.n_seq || head < 0 ||
        head >= s->env.n_head_kv || !k)
        return;
    lrqk_slot *t = s->slots[slot_index(s, seq, layer, head)];
    if (!t || t->n < 0) return; /* no factors: rebuilt from the keys at select */
    if (t->n >= s->env.n_ctx) {
        t->n = -1;
        return;
    }
    if (t->final_rows < t->n) { /* no select refined the previous token: its k-only estimate */
        float *prev = t->ak + (size_t)(t->n - 1) * s->rank;
        if (ks_lrqk_project(t->bk, s->rank, s->env.head_dim, t->kpend, prev) != KS_OK)
            memset(prev, 0, sizeof(float) * (size_t)s->rank);
        t->final_rows = t->n;
    }
    /* the new row waits for select_layer (the joint q^/k^ step) or the next append */
    memset(t->ak + (size_t)t->n * s->rank, 0, sizeof(float) * (size_t)s->rank);
    memcpy(t->kpend, k, sizeof(float) * (size_t)s->env.head_dim);
    t->n++;
}

/* ------------------------------------------------------------ kernels --
 * The proxy scores over [sink, n - window) use GCC/clang vector extensions
 * in blocks of 4 lanes (SSE2's width, so no ABI questions) when r % 4 == 0
 * (the default 32), so they vectorise at -O2 without fast-math, and AVX2
 * (x86) or NEON FMA chains (ARM) where the CPU has them; other ranks take
 * the scalar loops.  The Gram and K_O^T A_KO updates over the rows entering
 * / leaving O are ks_lrqk_gram_kao_add (lrqk_math.c: zmm, ymm or NEON
 * quads, bit for bit the portable loops). */
typedef float lrqk_v4 __attribute__((vector_size(16)));

static inline lrqk_v4 v4_load(const float *p) {
    lrqk_v4 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static void gram_read(const float *gram, int32_t r, double *out) {
    for (int32_t i = 0; i < r; i++)
        for (int32_t j = 0; j < r; j++)
            out[(size_t)i * r + j] = j >= i ? gram[(size_t)i * r + j] : gram[(size_t)j * r + i];
}

#if defined(__x86_64__)
/* proxy_scores on AVX2 + FMA, r % 8 == 0: two rows x four heads of the
 * group (padded with copies of head 0, which leaves the max unchanged) in
 * eight accumulators over r, reduced together into [row][head] lanes; the
 * max over heads is taken on that vector.  About a third of the SSE form's
 * vector ops per row at r = 32, G = 4. */
KS_AVX2_TGT static void proxy_scores_avx2(const float *ak, int32_t m, int32_t r, const float *qhat, int32_t G,
                                          float *sc) {
    for (int32_t i = 0; i < m; i += 2) {
        const float *a0 = ak + (size_t)i * r, *a1 = i + 1 < m ? a0 + r : a0;
        __m256 best = _mm256_set1_ps(-INFINITY);
        for (int32_t g0 = 0; g0 < G; g0 += 4) {
            const float *qg[4];
            for (int g = 0; g < 4; g++) qg[g] = qhat + (size_t)(g0 + g < G ? g0 + g : 0) * r;
            __m256 acc[8];
            for (int k = 0; k < 8; k++) acc[k] = _mm256_setzero_ps();
            for (int32_t j = 0; j < r; j += 8) {
                __m256 x0 = _mm256_loadu_ps(a0 + j), x1 = _mm256_loadu_ps(a1 + j);
                for (int g = 0; g < 4; g++) {
                    __m256 qv = _mm256_loadu_ps(qg[g] + j);
                    acc[g] = _mm256_fmadd_ps(x0, qv, acc[g]);
                    acc[4 + g] = _mm256_fmadd_ps(x1, qv, acc[4 + g]);
                }
            }
            best = _mm256_max_ps(best, ks_avx2_reduce8(acc)); /* [row 0: heads 0-3 | row 1: heads 0-3] */
        }
        __m128 h[2] = {_mm256_castps256_ps128(best), _mm256_extractf128_ps(best, 1)};
        for (int u = 0; u < 2 && i + u < m; u++) {
            __m128 v = _mm_max_ps(h[u], _mm_movehl_ps(h[u], h[u]));
            v = _mm_max_ss(v, _mm_shuffle_ps(v, v, 1));
            sc[i + u] = _mm_cvtss_f32(v);
        }
    }
}
#elif defined(__aarch64__)
/* proxy_scores_avx2 in NEON quads (every AArch64 CPU), r % 4 == 0: two
 * rows x four heads of the group (padded with copies of head 0) in eight
 * FMA chains over r, reduced by pairwise adds into one [head] quad per row,
 * whose max over the heads is the row's score.  The selection it gives is
 * the portable form's (tests/test_p_lrqk.c, test_proxy_kernels_agree); the
 * sums differ from it in rounding only (FMA, pairwise reduction). */
static void proxy_scores_neon(const float *ak, int32_t m, int32_t r, const float *qhat, int32_t G, float *sc) {
    for (int32_t i = 0; i < m; i += 2) {
        const float *a0 = ak + (size_t)i * r, *a1 = i + 1 < m ? a0 + r : a0;
        float32x4_t best0 = vdupq_n_f32(-INFINITY), best1 = best0;
        for (int32_t g0 = 0; g0 < G; g0 += 4) {
            const float *qg[4];
            for (int g = 0; g < 4; g++) qg[g] = qhat + (size_t)(g0 + g < G ? g0 + g : 0) * r;
            float32x4_t acc[8];
            for (int k = 0; k < 8; k++) acc[k] = vdupq_n_f32(0.0f);
            for (int32_t j = 0; j < r; j += 4) {
                float32x4_t x0 = vld1q_f32(a0 + j), x1 = vld1q_f32(a1 + j);
                for (int g = 0; g < 4; g++) {
                    float32x4_t qv = vld1q_f32(qg[g] + j);
                    acc[g] = vfmaq_f32(acc[g], x0, qv);
                    acc[4 + g] = vfmaq_f32(acc[4 + g], x1, qv);
                }
            }
            /* [row 0: heads 0-3] and [row 1: heads 0-3] */
            float32x4_t h0 = vpaddq_f32(vpaddq_f32(acc[0], acc[1]), vpaddq_f32(acc[2], acc[3]));
            float32x4_t h1 = vpaddq_f32(vpaddq_f32(acc[4], acc[5]), vpaddq_f32(acc[6], acc[7]));
            best0 = vmaxq_f32(best0, h0);
            best1 = vmaxq_f32(best1, h1);
        }
        sc[i] = vmaxvq_f32(best0);
        if (i + 1 < m) sc[i + 1] = vmaxvq_f32(best1);
    }
}
#endif

/* sc[i] = max_g A_K[i] . q^_g for m rows of ak [m][r], qhat [G][r].
 * With G >= 3 the lanes run over the group: q^ is transposed to [r][Gp]
 * (Gp = G rounded up to 4, padded with copies of head 0, which leaves the
 * max unchanged), so a row costs r * Gp / 4 vector FMAs and no horizontal
 * sums; with G <= 2 they run over r. */
static ks_status proxy_scores(const float *ak, int32_t m, int32_t r, const float *qhat, int32_t G, float *sc) {
#if defined(__x86_64__)
    if (r % 8 == 0 && ks_simd_current() >= KS_SIMD_AVX2) {
        proxy_scores_avx2(ak, m, r, qhat, G, sc);
        return KS_OK;
    }
#elif defined(__aarch64__)
    if (r % 4 == 0 && ks_simd_current() >= KS_SIMD_NEON) {
        proxy_scores_neon(ak, m, r, qhat, G, sc);
        return KS_OK;
    }
#endif
    if (G >= 3) {
        int32_t Gp = (G + 3) & ~3;
        float *qt = ks_malloc(sizeof(float) * (size_t)r * Gp);
        if (!qt) return KS_FAIL(KS_ERR_NOMEM, "lrqk: transposed queries of rank %d", r);
        for (int32_t j = 0; j < r; j++)
            for (int32_t g = 0; g < Gp; g++) qt[(size_t)j * Gp + g] = qhat[(size_t)(g < G ? g : 0) * r + j];
        for (int32_t i = 0; i < m; i++) {
            const float *a = ak + (size_t)i * r;
            float best = -INFINITY;
            for (int32_t g = 0; g < Gp; g += 4) {
                lrqk_v4 acc = {0};
                for (int32_t j = 0; j < r; j++) acc += a[j] * v4_load(qt + (size_t)j * Gp + g);
                float v01 = acc[0] > acc[1] ? acc[0] : acc[1], v23 = acc[2] > acc[3] ? acc[2] : acc[3];
                float v = v01 > v23 ? v01 : v23;
                best = v > best ? v : best;
            }
            sc[i] = best;
        }
        ks_free(qt);
        return KS_OK;
    }
    for (int32_t i = 0; i < m; i++) {
        const float *a = ak + (size_t)i * r;
        float best = -INFINITY;
        for (int32_t g = 0; g < G; g++) {
            const float *q = qhat + (size_t)g * r;
            float v = 0;
            if (r % 4 == 0) {
                lrqk_v4 acc = {0};
                for (int32_t j = 0; j < r; j += 4) acc += v4_load(a + j) * v4_load(q + j);
                v = (acc[0] + acc[2]) + (acc[1] + acc[3]);
            } else {
                for (int32_t j = 0; j < r; j++) v += a[j] * q[j];
            }
            best = v > best ? v : best;
        }
        sc[i] = best;
    }
    return KS_OK;
}

/* kao [hd][r] += sign * k^T a */

/* Add (sign +1) or remove (-1) the entries of one run [first, first + len)
 * to the Gram and to K_O^T A_KO, with their exact keys (keys: [64][hd]). */
static ks_status apply_run(lrqk_state *s, lrqk_slot *t, const ks_select_req *req, int32_t first, int32_t len,
                           const uint64_t *nw, float *keys) {
    int32_t r = s->rank, hd = s->env.head_dim;
    KS_TRY(s->env.read_keys(s->env.svc, req->seq, req->layer, req->head, first, len, keys));
    float sign[64]; /* runs are at most 64 entries (keys' rows) */
    KS_ASSERT(len <= 64);
    for (int32_t i = 0; i < len; i++) {
        int32_t x = first + i;
        sign[i] = nw[x >> 6] >> (x & 63) & 1 ? 1.0f : -1.0f;
    }
    ks_lrqk_gram_kao_add(t->gram, t->kao, keys, t->ak + (size_t)first * r, sign, len, hd, r);
    return KS_OK;
}

/* O_t = selected + [0, sink) + [n - window, n); count hits against O_{t-1},
 * then bring the Gram and K_O^T A_KO to O_t: by the rows entering and leaving
 * when they are fewer than |O_t| (the usual case at a low miss rate), else,
 * and every 64 steps against fp32 drift, from scratch.  Only the keys of the
 * rows that change are read, in runs of consecutive entries. */
static ks_status update_resident(lrqk_state *s, lrqk_slot *t, const ks_select_req *req, const int32_t *idx, int32_t k,
                                 uint64_t *nw) {
    int32_t r = s->rank, n = req->n_entries, W = words_of(s), hd = s->env.head_dim;
    memset(nw, 0, sizeof(uint64_t) * (size_t)W);
    for (int32_t i = 0; i < req->sink && i < n; i++) nw[i >> 6] |= 1ull << (i & 63);
    for (int32_t i = n - req->window > 0 ? n - req->window : 0; i < n; i++) nw[i >> 6] |= 1ull << (i & 63);
    for (int32_t i = 0; i < k; i++) {
        int32_t x = idx[i];
        if (t->res[x >> 6] >> (x & 63) & 1) t->hits++;
        else t->misses++;
        nw[x >> 6] |= 1ull << (x & 63);
    }
    int64_t changes = 0, size = 0;
    for (int32_t w = 0; w < W; w++) {
        changes += __builtin_popcountll(nw[w] ^ t->res[w]);
        size += __builtin_popcountll(nw[w]);
    }
    bool full = changes > size || t->gram_age >= 64;
    if (full) {
        memset(t->gram, 0, sizeof(float) * (size_t)r * r);
        memset(t->kao, 0, sizeof(float) * (size_t)hd * r);
        t->gram_age = 0;
    } else {
        t->gram_age++;
    }
    float *keys = ks_scratch(KS_SCRATCH_POLICY0, sizeof(float) * 64 * (size_t)hd);
    if (!keys) { /* O unknown: start over at the next select */
        slot_clear_resident(s, t);
        return KS_FAIL(KS_ERR_NOMEM, "lrqk: keys of a resident run");
    }
    ks_status st = KS_OK;
    int32_t run0 = -1, run_len = 0;
    for (int32_t w = 0; w < W && st == KS_OK; w++) {
        uint64_t bits = full ? nw[w] : nw[w] ^ t->res[w];
        while (bits && st == KS_OK) {
            int b = __builtin_ctzll(bits);
            bits &= bits - 1;
            int32_t x = w * 64 + b;
            if (run_len > 0 && x == run0 + run_len && run_len < 64) {
                run_len++;
                continue;
            }
            if (run_len > 0) st = apply_run(s, t, req, run0, run_len, nw, keys);
            run0 = x;
            run_len = 1;
        }
    }
    if (st == KS_OK && run_len > 0) st = apply_run(s, t, req, run0, run_len, nw, keys);
    if (st != KS_OK) { /* O unknown: start over at the next select */
        slot_clear_resident(s, t);
        return st;
    }
    memcpy(t->res, nw, sizeof(uint64_t) * (size_t)W);
    return KS_OK;
}

static ks_status lrqk_select(void *state, const ks_select_req *req, ks_selection *out) {
    lrqk_state *s = state;
    const ks_policy_env *e = &s->env;
    int32_t n = req->n_entries, lo = req->sink, hi = req->n_entries - req->window, r = s->rank, hd = e->head_dim;
    int32_t G = e->n_head / e->n_head_kv;
    out->pages = false;
    out->n = 0;
    if (req->seq < 0 || req->seq >= e->n_seq || req->layer < 0 || req->layer >= e->n_layer || req->head < 0 ||
        req->head >= e->n_head_kv || n <= 0 || n > e->n_ctx || !req->q) {
        out->all = true;
        return KS_OK;
    }
    if (hi <= lo || req->n_select <= 0) return KS_OK;
    lrqk_slot *t = slot_get(s, req->seq, req->layer, req->head);
    if (!t) return KS_FAIL(KS_ERR_NOMEM, "lrqk: factors of layer %d head %d", req->layer, req->head);
    if (t->n != n || t->final_rows < n - 1) { /* no prefill factors, or out of sync: rebuild from the keys */
        float *keys = ks_scratch(KS_SCRATCH_POLICY0, sizeof(float) * (size_t)n * hd);
        if (!keys) return KS_FAIL(KS_ERR_NOMEM, "lrqk: keys of %d entries", n);
        ks_status st = factor_slot(s, t, req->seq, req->layer, req->head, NULL, 0, n, keys);
        KS_TRY(st);
        if (t->n != n) {
            out->all = true;
            return KS_OK;
        }
    }
    float *qhat = ks_scratch(KS_SCRATCH_POLICY1, sizeof(float) * ((size_t)G * r + r));
    double *gram = ks_scratch(KS_SCRATCH_POLICY2, sizeof(double) * (size_t)r * r);
    if (!qhat || !gram) return KS_FAIL(KS_ERR_NOMEM, "lrqk: estimates of rank %d", r);
    float *khat = qhat + (size_t)G * r;
    gram_read(t->gram, r, gram);
    ks_status st;
    if (t->updated != n) {
        st = ks_lrqk_decode(t->bq, t->bk, r, hd, gram, t->kao, req->q, G, t->kpend, s->iters, s->tol, s->lambda,
                            qhat, khat);
        if (st == KS_OK) {
            if (t->final_rows == n - 1) memcpy(t->ak + (size_t)(n - 1) * r, khat, sizeof(float) * (size_t)r);
            t->final_rows = n;
            t->updated = n;
        }
    } else { /* asked again for the same token: estimate on copies, no second update */
        float *bq = ks_scratch(KS_SCRATCH_POLICY3, sizeof(float) * (size_t)r * hd * 2);
        if (!bq) return KS_FAIL(KS_ERR_NOMEM, "lrqk: factor copies of rank %d", r);
        float *bk = bq + (size_t)r * hd;
        memcpy(bq, t->bq, sizeof(float) * (size_t)r * hd);
        memcpy(bk, t->bk, sizeof(float) * (size_t)r * hd);
        st = ks_lrqk_decode(bq, bk, r, hd, gram, t->kao, req->q, G, t->kpend, s->iters, s->tol, s->lambda, qhat,
                            khat);
    }
    if (st == KS_ERR_NOMEM) return st;
    if (st != KS_OK) {
        out->all = true;
        return KS_OK;
    }
    int32_t m = hi - lo, k = req->n_select < out->cap ? req->n_select : out->cap;
    KS_TRY(proxy_scores(t->ak + (size_t)lo * r, m, r, qhat, G, t->sc));
    out->n = ks_lrqk_topk(t->sc, m, k, out->idx, t->sc + m);
    for (int32_t i = 0; i < out->n; i++) out->idx[i] += lo;
    t->selections++;
    return update_resident(s, t, req, out->idx, out->n, t->nres);
}

static void lrqk_counters(void *state, ks_policy_counters *out) {
    lrqk_state *s = state;
    uint64_t sel = s->done_sel, hits = s->done_hits, misses = s->done_misses;
    size_t n = (size_t)s->env.n_seq * s->env.n_layer * s->env.n_head_kv;
    for (size_t i = 0; i < n; i++)
        if (s->slots[i]) {
            sel += s->slots[i]->selections;
            hits += s->slots[i]->hits;
            misses += s->slots[i]->misses;
        }
    out->selections += sel;
    out->hits += hits;
    out->misses += misses;
}

static const ks_policy_select_i lrqk_select_i = {
    .seq_reset = lrqk_seq_reset,
    .select_layer = lrqk_select,
    .on_append = lrqk_append,
    .counters = lrqk_counters,
};

static const ks_policy_prefill_i lrqk_prefill_i = {
    .obs_window = -1,
    .on_prefill = lrqk_prefill,
};

const ks_policy_i ks_policy_lrqk = {
    .name = "lrqk",
    .summary = "LRQK: top-k by a joint low-rank proxy of q.k (prefill factorisation, decode updates) + sinks + window",
    .prefix_why = "its low-rank factors are fitted on the queries of every prompt row, which the cache does not keep: a hit would change its answers",
    .create = lrqk_create,
    .destroy = lrqk_destroy,
    .arg_names = lrqk_args,
    .select = &lrqk_select_i,
    .prefill = &lrqk_prefill_i,
};
