/*
 * p_topp.c — `+topp`: an adaptive budget after any selector (Twilight).
 *
 * A fixed budget is wrong both ways: a head whose attention is peaked needs
 * a handful of entries, a flat one needs many (Twilight: Accelerating
 * Long-Context Inference with Adaptive Sparse Attention, 2025, Sections 3-4:
 * "select-then-prune").  So this stage takes what the selector before it
 * picked for a KV head and keeps only the smallest part of it that holds a
 * share p of the attention mass.  It is a refining stage, the last part of
 * a chain (`quest+topp`, `snapkv+quest+topp`, or `topp` alone, which prunes
 * the whole head: an oracle top-p of full attention), written with the one
 * parser of policy strings (registry.c) and run by policy.c after the
 * selector's select_layer, on the selector's answer.
 *
 * The mass is exact, not estimated: for the entries attention would read
 * (the picks, the sinks and the recent window the framework adds), the keys
 * are read through env->read_keys (the store's rows, as attention sees
 * them; `select` never sees where they live), the logits q.k / sqrt(d) are
 * computed for every query head of the group, softmax is taken per head
 * over that set, and the group's mass of an entry is the mean over its
 * heads (so the kept set holds a share p of the group's average attention,
 * Twilight's GQA reduction).  The sinks and the window are attended
 * whatever this stage says, so their mass counts first; then the picks are
 * added in decreasing mass until the total reaches p.  The answer is a set
 * of entries (a page-level selector's pages are pruned to entries).
 *
 * p = 1 returns the selector's answer untouched (bit for bit the policy
 * alone: tests/test_p_topp.c), and so does a call without queries (the
 * global prefetch of spec and chess: a superset is a safe prefetch).  The
 * step stays allocation-free: everything lives in the policy scratch slots
 * (the selector before it has returned, so its slots are free).  Counters:
 * the picks it saw and the entries it kept, in total and per (layer, KV
 * head), whose extremes (the mean kept by the least and the most keeping
 * head) bench and eval report.
 */
#include "policy/policy.h"
#include "core/simd.h"
#include "tensor/simd_avx2.h"
#if defined(__aarch64__)
#include <arm_neon.h>
#endif

#include <math.h>
#include <stdatomic.h>
#include <string.h>

typedef struct {
    ks_policy_env env;
    double p;
    _Atomic uint64_t refined, picked, kept;
    _Atomic uint64_t *head_kept, *head_n; /* [n_layer][n_head_kv] */
} topp_state;

static const char *const topp_args[] = {"p", NULL};

static ks_status topp_create(const ks_policy_env *env, const ks_policy_spec *spec, void **state) {
    double p;
    KS_TRY(ks_args_float(spec->args, "p", 0.95, 1e-6, 1.0, &p));
    if (!env->read_keys) return KS_FAIL(KS_ERR_INVALID_ARG, "topp needs the read_keys service");
    topp_state *s = ks_calloc(1, sizeof *s);
    size_t nh = (size_t)env->n_layer * (size_t)env->n_head_kv;
    if (s) s->head_kept = ks_calloc(2 * (nh ? nh : 1), sizeof(uint64_t));
    if (!s || !s->head_kept) {
        ks_free(s);
        return KS_FAIL(KS_ERR_NOMEM, "topp policy");
    }
    s->head_n = s->head_kept + nh;
    s->env = *env;
    s->p = p;
    *state = s;
    return KS_OK;
}

static void topp_destroy(void *state) {
    topp_state *s = state;
    ks_free((void *)s->head_kept);
    ks_free(s);
}

static void topp_counters(void *state, ks_policy_counters *out) {
    topp_state *s = state;
    out->topp_refined += atomic_load_explicit(&s->refined, memory_order_relaxed);
    out->topp_picked += atomic_load_explicit(&s->picked, memory_order_relaxed);
    out->topp_kept += atomic_load_explicit(&s->kept, memory_order_relaxed);
    double lo = -1, hi = -1;
    for (size_t i = 0; i < (size_t)s->env.n_layer * (size_t)s->env.n_head_kv; i++) {
        uint64_t n = atomic_load_explicit(&s->head_n[i], memory_order_relaxed);
        if (!n) continue;
        double m = (double)atomic_load_explicit(&s->head_kept[i], memory_order_relaxed) / (double)n;
        if (lo < 0 || m < lo) lo = m;
        if (m > hi) hi = m;
    }
    if (lo >= 0) {
        out->topp_head_min = lo;
        out->topp_head_max = hi;
    }
}

/* (mass, entry) pairs in decreasing mass, ties by entry: a heap sort (no
 * allocation, deterministic). */
typedef struct {
    float w;
    int32_t e;
} cand;

static bool before(const cand *a, const cand *b) { return a->w < b->w || (a->w == b->w && a->e > b->e); }

static void sift(cand *c, int32_t i, int32_t n) { /* a min-heap by `before`: the root is the last in order */
    for (;;) {
        int32_t l = 2 * i + 1, m = i;
        if (l < n && before(&c[l], &c[m])) m = l;
        if (l + 1 < n && before(&c[l + 1], &c[m])) m = l + 1;
        if (m == i) return;
        cand t = c[i];
        c[i] = c[m];
        c[m] = t;
        i = m;
    }
}

static void sort_desc(cand *c, int32_t n) {
    for (int32_t i = n / 2 - 1; i >= 0; i--) sift(c, i, n);
    for (int32_t k = n - 1; k > 0; k--) { /* the smallest goes to the end */
        cand t = c[0];
        c[0] = c[k];
        c[k] = t;
        sift(c, 0, k);
    }
}

/* sc[g][i] = q_g . k_i * scale for the group's G queries and m keys. */
static void logits_c(const float *q, const float *keys, int32_t G, int32_t m, int32_t hd, float scale, float *sc) {
    for (int32_t g = 0; g < G; g++)
        for (int32_t i = 0; i < m; i++) {
            const float *a = q + (size_t)g * hd, *k = keys + (size_t)i * hd;
            float d = 0;
            for (int32_t t = 0; t < hd; t++) d += a[t] * k[t];
            sc[(size_t)g * m + i] = d * scale;
        }
}

#if defined(__x86_64__)
KS_AVX2_TGT static void logits_avx2(const float *q, const float *keys, int32_t G, int32_t m, int32_t hd, float scale,
                                    float *sc) {
    for (int32_t g = 0; g < G; g++)
        for (int32_t i = 0; i < m; i++) {
            const float *a = q + (size_t)g * hd, *k = keys + (size_t)i * hd;
            __m256 acc = _mm256_setzero_ps();
            int32_t t = 0;
            for (; t + 8 <= hd; t += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + t), _mm256_loadu_ps(k + t), acc);
            float d = ks_avx2_hsum(acc);
            for (; t < hd; t++) d += a[t] * k[t];
            sc[(size_t)g * m + i] = d * scale;
        }
}
#elif defined(__aarch64__)
/* logits_avx2 in NEON quads (every AArch64 CPU): two FMA chains over the
 * head dim, summed across lanes once per key. */
static void logits_neon(const float *q, const float *keys, int32_t G, int32_t m, int32_t hd, float scale, float *sc) {
    for (int32_t g = 0; g < G; g++)
        for (int32_t i = 0; i < m; i++) {
            const float *a = q + (size_t)g * hd, *k = keys + (size_t)i * hd;
            float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = acc0;
            int32_t t = 0;
            for (; t + 8 <= hd; t += 8) {
                acc0 = vfmaq_f32(acc0, vld1q_f32(a + t), vld1q_f32(k + t));
                acc1 = vfmaq_f32(acc1, vld1q_f32(a + t + 4), vld1q_f32(k + t + 4));
            }
            float d = vaddvq_f32(vaddq_f32(acc0, acc1));
            for (; t < hd; t++) d += a[t] * k[t];
            sc[(size_t)g * m + i] = d * scale;
        }
}
#endif

static ks_status topp_refine(void *state, const ks_select_req *req, ks_selection *sel) {
    topp_state *s = state;
    if (s->p >= 1.0 || !req->q) return KS_OK;
    const ks_policy_env *env = &s->env;
    int32_t n = req->n_entries, hd = env->head_dim, G = env->n_head / env->n_head_kv;
    int32_t P = ks_policy_kv_page_size(env);
    if (n <= 0) return KS_OK;
    int32_t lo = req->sink < n ? req->sink : n, hi = n - (req->window < n ? req->window : n); /* fixed: [0, lo), [hi, n) */
    size_t words = (size_t)n / 64 + 1;
    uint8_t *b2 = ks_scratch(KS_SCRATCH_POLICY2, sizeof(uint64_t) * words + (sizeof(int32_t) + sizeof(cand)) * (size_t)n);
    if (!b2) return KS_FAIL(KS_ERR_NOMEM, "topp: the set of %d entries", n);
    uint64_t *mask = (uint64_t *)(void *)b2;
    int32_t *ent = (int32_t *)(void *)(mask + words);     /* [m] the attended entries, ascending */
    cand *cd = (cand *)(void *)(ent + n);                  /* [m - fixed] the picks' masses */
    memset(mask, 0, sizeof(uint64_t) * words);
    int32_t picks = 0;
    if (sel->all) {
        memset(mask, 0xff, sizeof(uint64_t) * ((size_t)n / 64));
        for (int32_t e = n / 64 * 64; e < n; e++) mask[e >> 6] |= 1ull << (e & 63);
    } else {
        for (int32_t i = 0; i < sel->n; i++) {
            int32_t x = sel->idx[i];
            int32_t a = sel->pages ? x * P : x, z = sel->pages ? (x + 1) * P : x + 1;
            if (x < 0 || (sel->pages && (int64_t)x * P >= n) || (!sel->pages && x >= n)) continue;
            if (z > n) z = n;
            for (int32_t e = a; e < z; e++) mask[e >> 6] |= 1ull << (e & 63);
        }
    }
    for (int32_t e = 0; e < n; e++) picks += (mask[e >> 6] >> (e & 63)) & 1 && e >= lo && e < hi;
    if (picks == 0) return KS_OK; /* nothing of the selector's to prune */
    for (int32_t e = 0; e < lo; e++) mask[e >> 6] |= 1ull << (e & 63);
    for (int32_t e = hi; e < n; e++) mask[e >> 6] |= 1ull << (e & 63);
    int32_t m = 0;
    for (int32_t e = 0; e < n; e++)
        if ((mask[e >> 6] >> (e & 63)) & 1) ent[m++] = e;
    float *keys = ks_scratch(KS_SCRATCH_POLICY0, sizeof(float) * (size_t)m * hd);
    float *sc = ks_scratch(KS_SCRATCH_POLICY1, sizeof(float) * (size_t)m * (G + 1));
    if (!keys || !sc) return KS_FAIL(KS_ERR_NOMEM, "topp: keys of %d entries", m);
    for (int32_t i = 0; i < m;) { /* runs of consecutive entries */
        int32_t j = i + 1;
        while (j < m && ent[j] == ent[j - 1] + 1) j++;
        KS_TRY(env->read_keys(env->svc, req->seq, req->layer, req->head, ent[i], j - i, keys + (size_t)i * hd));
        i = j;
    }
    float scale = 1.0f / sqrtf((float)hd), *w = sc + (size_t)m * G;
#if defined(__x86_64__)
    if (ks_simd_current() >= KS_SIMD_AVX2) logits_avx2(req->q, keys, G, m, hd, scale, sc);
    else
#elif defined(__aarch64__)
    if (ks_simd_current() >= KS_SIMD_NEON) logits_neon(req->q, keys, G, m, hd, scale, sc);
    else
#endif
        logits_c(req->q, keys, G, m, hd, scale, sc);
    KS_TRY(ks_group_reduce_scores(sc, G, m, KS_GROUP_SOFTMAX_MEAN, w));
    double mass = 0;
    int32_t nc = 0;
    for (int32_t i = 0; i < m; i++) {
        if (ent[i] < lo || ent[i] >= hi) mass += w[i]; /* attended anyway */
        else cd[nc++] = (cand){w[i], ent[i]};
    }
    sort_desc(cd, nc);
    int32_t kept = 0;
    while (kept < nc && mass < s->p) mass += cd[kept++].w;
    if (kept > sel->cap) return KS_FAIL(KS_ERR_INVALID_ARG, "topp: %d entries kept, room for %d", kept, sel->cap);
    for (int32_t i = 0; i < kept; i++) sel->idx[i] = cd[i].e;
    sel->all = false;
    sel->pages = false;
    sel->n = kept;
    atomic_fetch_add_explicit(&s->refined, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->picked, (uint64_t)picks, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->kept, (uint64_t)kept, memory_order_relaxed);
    if (req->layer >= 0 && req->layer < env->n_layer && req->head >= 0 && req->head < env->n_head_kv) {
        size_t h = (size_t)req->layer * env->n_head_kv + req->head;
        atomic_fetch_add_explicit(&s->head_kept[h], (uint64_t)kept, memory_order_relaxed);
        atomic_fetch_add_explicit(&s->head_n[h], 1, memory_order_relaxed);
    }
    return KS_OK;
}

static const ks_policy_refine_i topp_refine_i = {.refine = topp_refine, .counters = topp_counters};

const ks_policy_i ks_policy_topp = {
    .name = "topp",
    .summary = "prunes the picks of the policy before it (POLICY+topp; alone: all entries) to the smallest set "
               "holding a share p of the exact attention mass (Twilight); p=1 is the policy alone",
    .prefix_why = "it keeps no state: it prunes each step's selection from the stored keys",
    .create = topp_create,
    .destroy = topp_destroy,
    .arg_names = topp_args,
    .refine = &topp_refine_i,
    .prefix = &ks_policy_prefix_stateless,
};
