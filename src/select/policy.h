/*
 * policy.h — the one interface every sparse-attention method plugs into.
 *
 * A policy decides *which* KV entries attention reads; the framework (infer)
 * decides everything else: it adds the sinks and the recent window, clips to
 * the budget's bookkeeping, fetches what the selection needs from the slow
 * tier, and runs the same attention kernel for every policy, so policies are
 * compared on identical kernels.  A policy sees model shapes (and the token
 * embedding), the page metadata of kv_meta.h and the queries of the step —
 * never the loaded model, tiers or storage.
 *
 * The interface is a const table of function pointers (like llama.cpp's
 * sampler interface).  Every slot is marked REQUIRED or OPTIONAL; a NULL
 * optional slot means "nothing to do".  A policy with no select_layer attends
 * densely at decode (it may still evict at prefill: SnapKV, DapQ).
 *
 * Lifecycle and threading:
 *   create            once per context (all sequences), REQUIRED
 *   seq_reset         a sequence was cleared, OPTIONAL
 *   on_prefill        after a prompt was prefilled; may evict entries through
 *                     env->evict (SnapKV, DapQ) or build structures (LRQK), OPTIONAL
 *   before_step       once per decode step, before layer 0: one global
 *                     selection for all layers (SpeContext, CHESS), OPTIONAL
 *   select_layer      per decode row, layer >= dense_layers and KV head; may be
 *                     called concurrently for different (seq, head) pairs of
 *                     one layer, so it may only write state of its own
 *                     (seq, layer, head), OPTIONAL
 *   after_attention   the attention weights the selection received (summed
 *                     over the query heads of the group), same threading as
 *                     select_layer (H2O's accumulated scores), OPTIONAL
 *   on_append         a decode step appended the entry of a new token, OPTIONAL
 *   pseudo_tokens     tokens whose queries score the prompt at prefill (DapQ), OPTIONAL
 *   prefill_room      how many such tokens its arguments ask for, OPTIONAL
 *   counters          hits / misses / corrections / rebuilds so far, OPTIONAL
 *   hidden_layers     target layers whose input hidden states it wants, OPTIONAL
 *   on_hidden         those states, per row after every forward, OPTIONAL
 *   destroy           REQUIRED
 *
 * Budget convention: `budget` counts every entry a KV head attends at a
 * decode step, sinks and window included; the policy is asked for
 * n_select = budget - sink - window more.  With budget >= the entries in the
 * head every policy must select everything, which tests check bit for bit
 * against dense attention.
 *
 * Return codes: KS_OK, or KS_ERR_INVALID_ARG (bad arguments at create: the
 * policy is not created) / KS_ERR_NOMEM (the step fails; the sequence must be
 * reset).  Policy hooks never exit or print to stdout.
 */
#ifndef KS_SELECT_POLICY_H
#define KS_SELECT_POLICY_H

#include "core/core.h"
#include "kv/kv_meta.h"
#include "tensor/dtype.h"

typedef struct ks_policy_params {
    int32_t budget;       /* entries per KV head at a decode step, sinks + window included; <= 0: all */
    int32_t sink;         /* leading entries always attended (default 4) */
    int32_t window;       /* most recent entries always attended (default 64) */
    int32_t dense_layers; /* the first N layers attend densely; -1: the policy's own default */
    const char *args;     /* policy-specific "k=v,k=v" (NULL: none) */
} ks_policy_params;

ks_policy_params ks_policy_default_params(void);

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

/* Counters a policy reports (summed over its parts), surfaced by bench/eval. */
typedef struct ks_policy_counters {
    uint64_t selections;   /* selections made (per row, layer, head) */
    uint64_t hits, misses; /* entries already resident vs to load (LRQK, FreeKV) */
    uint64_t corrections;  /* speculative selections corrected (FreeKV) */
    uint64_t speculative;  /* selections served by the previous step's speculation (FreeKV) */
    uint64_t rebuilds;     /* selections rebuilt on a trigger (CHESS) */
    uint64_t bytes_read;   /* bytes the selection read itself: a retrieval head's weights and K cache,
                            * page summaries (spec, quest) */
} ks_policy_counters;

/* One prompt, prefilled (obs_q as requested by the policy's obs_window, or
 * the queries of its pseudo tokens). */
typedef struct ks_prefill_info {
    int32_t seq;
    int32_t n_prompt;     /* tokens of this prefill call */
    const int32_t *prompt;/* [n_prompt] */
    int32_t n_obs;        /* query rows: the last min(obs_window, n_prompt), all when obs_window < 0,
                             or the pseudo tokens' */
    const float *obs_q;   /* [n_layer][n_obs][n_head * head_dim] queries with RoPE */
    bool pseudo;          /* obs_q are pseudo queries */
    /* pseudo entries still in the store: the last n_pseudo entries of every
     * head of seq are the pseudo tokens' KV (row i's own at n - n_pseudo + i),
     * which the engine removes after this call; the policy must not evict
     * them.  0: none (the KV holds the prompt only, as for every part but the
     * one whose pseudo_tokens ran). */
    int32_t n_pseudo;
    int32_t first_pos;    /* position of the prompt's first token */
} ks_prefill_info;

/* One decode step (all rows of the batch). */
typedef struct ks_step_info {
    int32_t n;            /* rows */
    const int32_t *seq;   /* [n] */
    const int32_t *token; /* [n] */
    const int32_t *pos;   /* [n] */
    /* entropy and varentropy (nats) of each row's previous output
     * distribution, the one `token` was drawn from; NaN when unknown.  Only
     * computed for policies with wants_entropy. */
    const float *entropy, *varentropy;
} ks_step_info;

/* A selection request for one (row, layer, KV head) of a decode step. */
typedef struct ks_select_req {
    int32_t row, seq, layer, head;
    int32_t pos;          /* position of the token being decoded */
    int32_t n_entries;    /* entries of the head, the new token's included */
    const float *q;       /* [G][head_dim] queries of the group with RoPE; NULL in prefetch calls of global policies */
    int32_t n_select;     /* entries wanted beyond sinks and window (>= 0) */
    int32_t sink, window; /* what the framework adds: [0, sink) and [n_entries - window, n_entries) */
} ks_select_req;

/* The answer: a set of logical pages or entries (any order, duplicates allowed,
 * out-of-range ignored), or `all`.  idx is owned by the framework. */
typedef struct ks_selection {
    bool all;             /* attend every entry */
    bool pages;           /* idx holds logical pages (true) or entry indices */
    int32_t n, cap;
    int32_t *idx;         /* [cap] */
    /* optional prefetch hint: what the policy expects to select at the next
     * step (FreeKV's speculative recall); the framework starts loading it for
     * layers in the slow tier while the step goes on.  Same conventions.
     * next is NULL where there is nothing to recall (fast-tier layers, the
     * public selection API): a policy then need not make the hint at all. */
    bool next_pages;
    int32_t n_next;
    int32_t *next;        /* [cap] */
} ks_selection;

typedef struct ks_policy_i {
    const char *name;     /* REQUIRED: the name --policy takes */
    const char *summary;  /* REQUIRED: one line for --help and docs */
    int32_t default_dense_layers; /* used when params.dense_layers < 0 */
    int32_t obs_window;   /* query rows of the prompt's end passed to on_prefill (0: none, -1: all) */
    bool global;          /* select_layer does not depend on the layer's queries (q may be NULL) */
    bool same_every_layer; /* select_layer returns the same entries in every layer of a step while the layers
                              hold every position (no prefill eviction): the engine plans them once a step */
    const char *const *arg_names; /* NULL-terminated keys --policy-arg accepts (NULL: none) */
    bool wants_entropy;   /* fill ks_step_info.entropy / varentropy */
    ks_status (*create)(const ks_policy_env *env, const ks_policy_params *p, void **state); /* REQUIRED */
    void (*destroy)(void *state);                                                          /* REQUIRED */
    void (*seq_reset)(void *state, int32_t seq);                                           /* OPTIONAL */
    ks_status (*on_prefill)(void *state, const ks_prefill_info *info);                     /* OPTIONAL */
    ks_status (*before_step)(void *state, const ks_step_info *step);                       /* OPTIONAL */
    ks_status (*select_layer)(void *state, const ks_select_req *req, ks_selection *out);   /* OPTIONAL */
    void (*after_attention)(void *state, const ks_select_req *req, const int32_t *entries, const float *weight,
                            int32_t n);                                                    /* OPTIONAL */
    void (*on_append)(void *state, int32_t seq, int32_t layer, int32_t head, int32_t pos, const float *k); /* OPTIONAL */
    /* Pseudo tokens to run after the prompt (DapQ): written to out[cap],
     * count returned.  They are prefilled at positions L_p.., their queries
     * passed to this part's on_prefill (pseudo = true) while their KV is
     * still the last n_pseudo entries of every head (info->n_pseudo), then
     * their KV is removed and the other parts' on_prefill run (pseudo = true,
     * n_pseudo = 0). OPTIONAL */
    int32_t (*pseudo_tokens)(void *state, const int32_t *prompt, int32_t n_prompt, int32_t *out, int32_t cap);
    /* How many pseudo tokens the arguments ask for (the context room they
     * need after the prompt); 0 on bad arguments. OPTIONAL (with pseudo_tokens) */
    int32_t (*prefill_room)(const char *args);
    void (*counters)(void *state, ks_policy_counters *out);                                /* OPTIONAL: += */
    /* Target hidden states the policy reads (SpeContext's DLM fuses three):
     * layer ids whose *input* residual stream is captured (n_layer = the
     * final hidden state); returns how many (<= 3). OPTIONAL */
    int32_t (*hidden_layers)(void *state, int32_t out[3]);
    /* After each forward, for every row in order (prefill rows, then decode
     * rows): its token, position and captured states h [n][n_embd]. OPTIONAL */
    void (*on_hidden)(void *state, int32_t seq, int32_t pos, int32_t token, const float *h);
    /* Bytes of weights the policy keeps (SpeContext's M_D). OPTIONAL */
    size_t (*weight_bytes)(void *state);
    /* Whether it keeps a K cache of its own, one layer's worth (the memory model's "+1"). */
    bool own_kcache;
    /* The sequence was filled to n entries with synthetic KV (benchmarks):
     * fill the policy's own per-token state likewise. OPTIONAL */
    void (*seq_fill_synthetic)(void *state, int32_t seq, int32_t n, uint64_t seed);
    /* Registry data read by the CLI (--policy help), the docs test and the
     * public selection API (kvsieve_select.h), which serves exactly the
     * policies with neither needs_dlm nor evicts. */
    bool needs_dlm;       /* needs a draft model's retrieval head and the target's hidden states (spec) */
    bool evicts;          /* removes entries at prefill through env->evict (an EVICTOR of a composition) */
    bool page_summaries;  /* reads per-page key summaries (kmin / kmax / ksum of kv_meta.h) */
    /* Prefix caching (infer/prefix.c).  prefix_shareable: a prompt whose
     * leading tokens' KV is restored from the cache (byte for byte what a
     * prefill of them stores; the page summaries are recomputed from it) and
     * whose rest is prefilled, with the prefill hooks seeing the whole
     * prompt and the last max(1, obs_window) rows recomputed, leaves this
     * policy in exactly the state a prefill of the whole prompt does.
     * prefix_why says why (or why not), for docs/POLICIES.md and --help.
     * A policy with per-token state outside the store that the restored rows
     * would have built (spec's retrieval-head keys) saves and loads it
     * through the three hooks, kept with the cached blocks.  OPTIONAL */
    bool prefix_shareable;
    const char *prefix_why;
    size_t (*prefix_state_bytes)(void *state, int32_t n_tokens);
    /* positions [first, first + n) of seq, out / in [prefix_state_bytes(n)];
     * load is called in position order from 0 on an empty sequence. */
    ks_status (*prefix_state_save)(void *state, int32_t seq, int32_t first, int32_t n, uint8_t *out);
    ks_status (*prefix_state_load)(void *state, int32_t seq, int32_t first, int32_t n, const uint8_t *in);
} ks_policy_i;

/* ------------------------------------------------------------ registry -- */
/* A running policy: one interface, or an evictor composed with a selector
 * ("snapkv+quest": prefill hooks of the first, decode hooks of the last). */
typedef struct ks_policy ks_policy;

const ks_policy_i *ks_policy_find(const char *name);
/* All registered policies, NULL-terminated. */
const ks_policy_i *const *ks_policy_list(void);
/* spec: "name" or "evictor+selector".  KS_ERR_NOT_FOUND for unknown names. */
ks_status ks_policy_create(const char *spec, const ks_policy_env *env, const ks_policy_params *p, ks_policy **out);
void ks_policy_destroy(ks_policy *pol);
const char *ks_policy_name(const ks_policy *pol);
const ks_policy_params *ks_policy_params_of(const ks_policy *pol);
int32_t ks_policy_dense_layers(const ks_policy *pol);
int32_t ks_policy_obs_window(const ks_policy *pol);
bool ks_policy_selects(const ks_policy *pol);   /* has a decode selector */
bool ks_policy_is_global(const ks_policy *pol);
bool ks_policy_same_every_layer(const ks_policy *pol);
bool ks_policy_wants_weights(const ks_policy *pol);
void ks_policy_seq_reset(ks_policy *pol, int32_t seq);
ks_status ks_policy_on_prefill(ks_policy *pol, const ks_prefill_info *info);
/* After pseudo tokens ran, in two calls: pseudo_part = true calls only the
 * part whose pseudo_tokens ran (ks_policy_pseudo_tokens'), with the pseudo KV
 * still in the store (info->n_pseudo set); false calls every other part in
 * order (after the engine removed that KV; info->n_pseudo = 0). */
ks_status ks_policy_on_prefill_split(ks_policy *pol, const ks_prefill_info *info, bool pseudo_part);
ks_status ks_policy_before_step(ks_policy *pol, const ks_step_info *step);
ks_status ks_policy_select(ks_policy *pol, const ks_select_req *req, ks_selection *out);
/* Budget arithmetic and entry mask (select_mask.c), shared by the engine and
 * the public selection API.  budget_binds: the budget leaves something to
 * choose among n entries (otherwise everything is attended, which is also
 * what makes a full budget bit-identical to dense).  select_mask: fill req's
 * sink, window and n_select from the policy's budget, ask the policy (sel's
 * buffers and cap set by the caller), and unless sel->all set in mask
 * ([n_entries / 64 + 1] words) the entries to attend: sinks, window and the
 * selection, pages expanded to their entries (page = P). */
bool ks_policy_budget_binds(const ks_policy *pol, int32_t n);
ks_status ks_policy_select_mask(ks_policy *pol, ks_select_req *req, ks_selection *sel, int32_t page, uint64_t *mask);
void ks_policy_after_attention(ks_policy *pol, const ks_select_req *req, const int32_t *entries, const float *w,
                               int32_t n);
void ks_policy_on_append(ks_policy *pol, int32_t seq, int32_t layer, int32_t head, int32_t pos, const float *k);
bool ks_policy_wants_entropy(const ks_policy *pol);
/* Pseudo tokens of the first part that has them; 0 if none. */
int32_t ks_policy_pseudo_tokens(ks_policy *pol, const int32_t *prompt, int32_t n_prompt, int32_t *out, int32_t cap);
void ks_policy_get_counters(const ks_policy *pol, ks_policy_counters *out);
int32_t ks_policy_hidden_layers(ks_policy *pol, int32_t out[3]);
void ks_policy_on_hidden(ks_policy *pol, int32_t seq, int32_t pos, int32_t token, const float *h);
size_t ks_policy_weight_bytes(ks_policy *pol);
bool ks_policy_own_kcache(const ks_policy *pol);
void ks_policy_seq_fill_synthetic(ks_policy *pol, int32_t seq, int32_t n, uint64_t seed);
/* Prefix caching over every part: shareable only when every part is (and
 * no part reads every prompt row's queries, obs_window < 0); min_suffix:
 * prompt rows a hit must leave to recompute (the observation window, at
 * least 1: the last row's logits); the parts' per-token state, concatenated
 * in part order (bytes 0: none). */
bool ks_policy_prefix_shareable(const ks_policy *pol);
int32_t ks_policy_prefix_min_suffix(const ks_policy *pol);
size_t ks_policy_prefix_state_bytes(ks_policy *pol, int32_t n_tokens);
ks_status ks_policy_prefix_state_save(ks_policy *pol, int32_t seq, int32_t first, int32_t n, uint8_t *out);
ks_status ks_policy_prefix_state_load(ks_policy *pol, int32_t seq, int32_t first, int32_t n, const uint8_t *in);

/* ------------------------------------------------------------- helpers -- */
/* Typed "k=v,k=v" lookups; unknown keys are reported by ks_args_check. */
ks_status ks_args_int(const char *args, const char *key, int64_t def, int64_t lo, int64_t hi, int64_t *out);
ks_status ks_args_float(const char *args, const char *key, double def, double lo, double hi, double *out);
ks_status ks_args_str(const char *args, const char *key, const char *def, char *out, size_t cap);
/* KS_ERR_INVALID_ARG naming the first key not in the NULL-terminated list. */
ks_status ks_args_check(const char *args, const char *policy, const char *const *known);

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
