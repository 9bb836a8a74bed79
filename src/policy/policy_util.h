/*
 * policy_util.h — helpers the policies share, so that each p_*.c holds only
 * its own method: typed lookups of its "k=v" arguments (parsed by the one
 * argument walker in registry.c), deterministic top-k (topk.c), the scored
 * prefill eviction of SnapKV and DapQ and the prefill attention scores of
 * H2O (prefill.c), Quest's page bounds (page_bounds.c) and the group
 * reductions (policy.c).
 */
#ifndef KS_POLICY_POLICY_UTIL_H
#define KS_POLICY_POLICY_UTIL_H

#include "policy/policy.h"

/* Typed "k=v,k=v" lookups (registry.c); the spec's keys were checked when it was parsed. */
ks_status ks_args_int(const char *args, const char *key, int64_t def, int64_t lo, int64_t hi, int64_t *out);
ks_status ks_args_float(const char *args, const char *key, double def, double lo, double hi, double *out);
ks_status ks_args_str(const char *args, const char *key, const char *def, char *out, size_t cap);

/* Indices of the k largest of x[0..n) (any order) into idx; returns k' = min(k, n).
 * Ties break toward the lower index, so results are deterministic. */
int32_t ks_topk(const float *x, int32_t n, int32_t k, int32_t *idx);
/* The same (same set, same order) with tmp [n] as the radix select's scratch
 * (NULL: allocated), for callers that have one: at long contexts the copy is
 * large enough to be mmap'd and faulted in afresh on every call. */
int32_t ks_topk_scratch(const float *x, int32_t n, int32_t k, int32_t *idx, float *tmp);
/* ks_topk_scratch over x[lo, hi) (tmp [hi - lo] or NULL), the indices
 * returned into x (lo added); 0 when hi <= lo. */
int32_t ks_topk_range(const float *x, int32_t lo, int32_t hi, int32_t k, int32_t *idx, float *tmp);
/* A selection of entries: the top min(k, out->cap) of x[lo, hi) into out->idx
 * (indices into x), out->n set; tmp as ks_topk_range's. */
void ks_selection_topk(ks_selection *out, const float *x, int32_t lo, int32_t hi, int32_t k, float *tmp);

/* acc[e] += the attention that query rows [row0, row0 + nq) of info's layer l
 * give entry e of KV head h (env->attn_probs over the group's heads; acc
 * [n_entries]), for SnapKV, DapQ and H2O.  q: scratch [nq][G][head_dim].
 * With info->n_pseudo > 0 the rows are pseudo queries and row i sees the
 * entries [0, n - n_pseudo + i] (causal: the prompt and the pseudo keys up to
 * its own), so its softmax has the keys in scope of the extended sequence. */
ks_status ks_policy_prefill_probs(const ks_policy_env *env, const ks_prefill_info *info, int32_t row0, int32_t nq,
                                  int32_t layer, int32_t head, float *q, float *acc);
/* Prefill eviction by query scores, the loop SnapKV and DapQ share: for every
 * layer l and KV head with more than `budget` entries (prompt entries: the
 * last info->n_pseudo entries are the pseudo tokens', scored over but never
 * counted, spanned, evicted), score each entry by the
 * attention the nq query rows obs_q[l][row0, row0 + nq) of info give it
 * (env->attn_probs: summed over the rows and the group's heads); span() splits
 * the head's n entries into kept heads [0, lo) and tails [hi, n) and the
 * candidates [lo, hi); the candidates' scores are average-pooled over `pool`
 * (odd) entries, the window clipped at [pool_lo, hi); the top `want` of them
 * are kept and everything else is evicted (env->evict). */
typedef struct ks_evict_span {
    int32_t lo, hi;  /* candidates [lo, hi); [0, lo) and [hi, n) are kept */
    int32_t want;    /* candidates to keep (<= 0: none) */
    int32_t pool_lo; /* the pooling window's left clip (<= lo) */
} ks_evict_span;
typedef void (*ks_evict_span_fn)(const void *ctx, int32_t n, int32_t nq, ks_evict_span *out);
ks_status ks_policy_evict_scored(const ks_policy_env *env, const ks_prefill_info *info, int32_t row0, int32_t nq,
                                 int32_t budget, int32_t pool, ks_evict_span_fn span, const void *ctx);

/* Quest's upper bound of q . k over a page: sum_i max(q_i min_i, q_i max_i). */
float ks_page_upper_bound(const float *q, const float *kmin, const float *kmax, int32_t hd);
/* The kernel ks_page_upper_bound runs at the current SIMD level for head
 * dim hd ("avx2", "neon" or "scalar"), for the dispatch test. */
const char *ks_page_bound_kernel_name(int32_t hd);
/* The kernels ks_page_upper_bounds8_pages / ks_page_upper_bounds16_pages
 * (every page of a head at once: Quest's scoring) and the top-k's sampled
 * filter and emit run at the current SIMD level, for the dispatch test:
 * "avx512", "avx2", "neon" or "scalar" (pages: head dim hd). */
const char *ks_page_bounds_pages_kernel_name(int32_t hd);
const char *ks_topk_kernel_name(void);
/* The bounds of G query heads q [G][hd] over one page into out[g * stride],
 * each bit for bit ks_page_upper_bound's: the page's min and max are read
 * once for the group (AVX-512: all G heads per pass). */
void ks_page_upper_bounds(const float *q, int32_t G, const float *kmin, const float *kmax, int32_t hd, float *out,
                          size_t stride);
/* The same from a page's f16 bounds (ks_kv_page_meta.kbound16: kmin then
 * kmax, [2][hd]): equal bit for bit to ks_page_upper_bounds over their f32
 * values, from half the bytes. */
void ks_page_upper_bounds16(const float *q, int32_t G, const uint16_t *kbound16, int32_t hd, float *out, size_t stride);
/* Quest's page scoring in one call: the bounds of G heads over np pages,
 * out[g * np + p] (out may be NULL), and with red_max their maximum over the
 * heads per page (red_max[p], Quest's default group reduction fused in),
 * from each page's f16 bounds kb[p].  AVX-512 scores four
 * pages x four heads at once, max(q lo, q hi) as q+ hi + q- lo (q+ = max(q, 0),
 * q- = min(q, 0)) in FMAs, the sixteen sums reduced together: the same bounds
 * as ks_page_upper_bounds16 up to rounding (a few ulps), at about half the
 * instructions; other levels call it page by page. */
void ks_page_upper_bounds16_pages(const float *q, int32_t G, const uint16_t *const *kb, int32_t np, int32_t hd,
                                  float *out, float *red_max);
/* The same from each page's 8-bit bounds kb[p] (kv_meta.h's kbound8):
 * s * sum_i (q+_i hi_i + q-_i lo_i), an upper bound at least the exact one
 * up to rounding, from half the f16 bounds' bytes.  AVX-512 as above; other
 * levels the f32 bound over the decoded steps, page by page. */
void ks_page_upper_bounds8_pages(const float *q, int32_t G, const uint8_t *const *kb, int32_t np, int32_t hd,
                                 float *out, float *red_max);

typedef enum ks_group_reduce { KS_GROUP_MAX = 0, KS_GROUP_MEAN = 1, KS_GROUP_SOFTMAX_MEAN = 2 } ks_group_reduce;
/* scores [G][n] -> out [n] by the reduction (softmax_mean: softmax over n per
 * head, then mean over heads: FreeKV's group-consistent choice). */
ks_status ks_group_reduce_scores(const float *scores, int32_t G, int32_t n, ks_group_reduce how, float *out);
ks_status ks_group_reduce_parse(const char *s, ks_group_reduce *out);

#endif
