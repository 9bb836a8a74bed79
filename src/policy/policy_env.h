/*
 * policy_env.h — what a policy sees of the engine: model shapes, the
 * context's pool, the page metadata (kv_meta.h) of its sequences, and three
 * services (attention probabilities at prefill, stored keys, eviction).
 * The same env serves the engine's store (kv set) and a caller-owned cache
 * of the public selection API (meta set): policies read metadata through
 * ks_policy_kv_* only, which answer from either.
 */
#ifndef KS_POLICY_POLICY_ENV_H
#define KS_POLICY_POLICY_ENV_H

#include "core/core.h"
#include "kv/kv_meta.h"
#include "tensor/dtype.h"

/* Page metadata of a KV that is not a ks_kv_store: the caller-owned cache of
 * the public selection API (include/kvsieve_select.h, select_api.c).  Same
 * contract as kv_meta.h; pointers stay valid until the next call into the
 * selector. */
typedef struct ks_kv_meta_src {
    void *ctx;
    int32_t page_size;
    int32_t (*n_entries)(void *ctx, int32_t seq, int32_t layer, int32_t head);
    void (*page_meta)(void *ctx, int32_t seq, int32_t layer, int32_t head, int32_t lp, ks_kv_page_meta *out);
} ks_kv_meta_src;

/* What a policy may see and ask for; owned by the context, borrowed. */
typedef struct ks_policy_env {
    ks_pool *pool;         /* the context's worker threads (before_step / on_prefill may use them) */
    int32_t n_layer, n_head, n_head_kv, head_dim, n_seq, n_ctx;
    int32_t n_vocab, n_embd; /* the target model's vocabulary and hidden size */
    ks_weight tok_embd;    /* [n_vocab][n_embd] the target's token embedding (borrowed; data NULL: none) */
    const ks_kv_store *kv; /* metadata through kv_meta.h only */
    void *svc;             /* opaque to the policy: first argument of the services */
    /* acc[e] += sum over the nq query rows and the G heads of the group of
     * softmax(q k^T / sqrt(d))[e], for every entry e of (seq, layer, head).
     * q: [nq][G][head_dim] with RoPE applied.  acc: [n_entries].  n_keys
     * (NULL: every entry): row r's keys in scope are entries [0, n_keys[r])
     * only (its softmax is normalised over those; acc beyond untouched), the
     * causal limit of pseudo queries whose own KV is still in the head. */
    ks_status (*attn_probs)(void *svc, int32_t seq, int32_t layer, int32_t head, const float *q, int32_t nq,
                            const int32_t *n_keys, float *acc);
    /* Keep only entries with keep[e] != 0 of (seq, layer, head) (permanent). */
    ks_status (*evict)(void *svc, int32_t seq, int32_t layer, int32_t head, const uint8_t *keep);
    /* Stored keys of entries [first, first + n) of (seq, layer, head) as f32:
     * out [n][head_dim] (RoPE applied, as attention sees them). */
    ks_status (*read_keys)(void *svc, int32_t seq, int32_t layer, int32_t head, int32_t first, int32_t n, float *out);
    /* Set (and kv NULL) when the KV is caller-owned; policies read metadata
     * through ks_policy_kv_* below, which serve either. */
    const ks_kv_meta_src *meta;
} ks_policy_env;

/* kv_meta.h through the env: the store's metadata, or the caller's (meta). */
int32_t ks_policy_kv_page_size(const ks_policy_env *env);
int32_t ks_policy_kv_n_entries(const ks_policy_env *env, int32_t seq, int32_t layer, int32_t head);
int32_t ks_policy_kv_n_pages(const ks_policy_env *env, int32_t seq, int32_t layer, int32_t head);
/* Every page's f16 bounds (ks_kv_page_meta.kbound16) of pages [0, np) in
 * one call; false where the cache (or a caller's metadata) has none. */
bool ks_policy_kv_pages_bounds16(const ks_policy_env *env, int32_t seq, int32_t layer, int32_t head, int32_t np,
                                 const uint16_t **out);
/* Every page's 8-bit bounds (ks_kv_page_meta.kbound8) of pages [0, np);
 * false where the metadata is a caller's (f32 only). */
bool ks_policy_kv_pages_bounds8(const ks_policy_env *env, int32_t seq, int32_t layer, int32_t head, int32_t np,
                                const uint8_t **out);
void ks_policy_kv_page_meta(const ks_policy_env *env, int32_t seq, int32_t layer, int32_t head, int32_t lp,
                            ks_kv_page_meta *out);

#endif
