/*
 * policy.h — the one interface every sparse-attention method plugs into.
 *
 * A policy decides *which* KV entries attention reads; the framework (infer)
 * decides everything else: it adds the sinks and the recent window, clips to
 * the budget's bookkeeping, fetches what the selection needs from the slow
 * tier, and runs the same attention kernel for every policy, so policies are
 * compared on identical kernels.  A policy sees model shapes (and the token
 * embedding), the page metadata of kv_meta.h and the queries of the step
 * (policy_env.h) — never the loaded model, tiers or storage.
 *
 * The interface is a const table (like llama.cpp's sampler interface) with
 * five REQUIRED members — name, summary, prefix_why, create, destroy — and
 * optional sub-interfaces, each NULL when the policy has no such part:
 *   select   a decode selector (NULL: attends densely at decode, as dense
 *            and a lone evictor do)
 *   prefill  hooks that run once a prompt is prefilled: evictors (SnapKV,
 *            DapQ), structures built from the prompt (LRQK, FreeKV, H2O)
 *   hidden   consumers of the target's hidden states and owners of a draft
 *            model (SpeContext's spec)
 *   prefix   prefix-cache shareability: present when a prompt restored from
 *            the cache leaves the policy as a whole prefill would
 *   refine   a stage that prunes the decode selector's answer (topp): such
 *            a policy is written last in a chain ("quest+topp") and has no
 *            select of its own
 * Inside a sub-interface the slots are marked REQUIRED or OPTIONAL as well.
 * Adding a policy is one file p_NAME.c defining `const ks_policy_i
 * ks_policy_NAME` and one line in registry.c (docs/DESIGN.md walks through
 * tests/example_policy.c).
 *
 * Lifecycle and threading:
 *   create            once per context (all sequences), with the policy's
 *                     spec (kvsieve.h: budget, sink, window, arguments)
 *   select.seq_reset  a sequence was cleared
 *   prefill.on_prefill after a prompt was prefilled; may evict entries
 *                     through env->evict or build structures
 *   select.before_step once per decode step, before layer 0: one global
 *                     selection for all layers (SpeContext, CHESS)
 *   select.select_layer per decode row, layer >= dense_layers and KV head;
 *                     may be called concurrently for different (seq, head)
 *                     pairs of one layer, so it may only write state of its
 *                     own (seq, layer, head)
 *   select.after_attention the attention weights the selection received
 *                     (summed over the group's query heads), same threading
 *   select.on_append  a decode step appended the entry of a new token
 *   hidden.on_hidden  the captured hidden states, per row after every forward
 *   destroy
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
#ifndef KS_POLICY_POLICY_H
#define KS_POLICY_POLICY_H

#include "policy/policy_env.h"

/* Counters a policy reports (summed over its parts), surfaced by bench/eval. */
typedef struct ks_policy_counters {
    uint64_t selections;   /* selections made (per row, layer, head) */
    uint64_t hits, misses; /* entries already resident vs to load (LRQK, FreeKV) */
    uint64_t corrections;  /* speculative selections corrected (FreeKV) */
    uint64_t speculative;  /* selections served by the previous step's speculation (FreeKV) */
    uint64_t rebuilds;     /* selections rebuilt on a trigger (CHESS) */
    uint64_t bytes_read;   /* bytes the selection read itself: a retrieval head's weights and K cache,
                            * page summaries (spec, quest) */
    uint64_t topp_refined, topp_picked, topp_kept; /* topp: selections pruned, the selector's picks in them,
                                                    * the picks kept */
    double topp_head_min, topp_head_max; /* topp: entries kept per selection by the (layer, KV head) keeping
                                          * fewest / most, on average (0 before any) */
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

/* A decode selector. */
typedef struct ks_policy_select_i {
    ks_status (*select_layer)(void *state, const ks_select_req *req, ks_selection *out);   /* REQUIRED */
    int32_t default_dense_layers; /* used when the spec's dense_layers < 0 */
    bool global;           /* select_layer does not depend on the layer's queries (q may be NULL) */
    bool same_every_layer; /* select_layer returns the same entries in every layer of a step while the layers
                              hold every position (no prefill eviction): the engine plans them once a step */
    bool wants_entropy;    /* fill ks_step_info.entropy / varentropy */
    void (*seq_reset)(void *state, int32_t seq);                                           /* OPTIONAL */
    ks_status (*before_step)(void *state, const ks_step_info *step);                       /* OPTIONAL */
    void (*after_attention)(void *state, const ks_select_req *req, const int32_t *entries, const float *weight,
                            int32_t n);                                                    /* OPTIONAL */
    void (*on_append)(void *state, int32_t seq, int32_t layer, int32_t head, int32_t pos, const float *k); /* OPTIONAL */
    void (*counters)(void *state, ks_policy_counters *out);                                /* OPTIONAL: += */
    /* The sequence was filled to n entries with synthetic KV (benchmarks):
     * fill the policy's own per-token state likewise. OPTIONAL */
    void (*seq_fill_synthetic)(void *state, int32_t seq, int32_t n, uint64_t seed);
} ks_policy_select_i;

/* Hooks that run once a prompt is prefilled. */
typedef struct ks_policy_prefill_i {
    ks_status (*on_prefill)(void *state, const ks_prefill_info *info);                     /* REQUIRED */
    int32_t obs_window;   /* query rows of the prompt's end passed to on_prefill (0: none, -1: all) */
    bool evicts;          /* removes entries through env->evict (an EVICTOR of a composition) */
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
} ks_policy_prefill_i;

/* A reader of the target's hidden states with weights of its own
 * (SpeContext's distilled retrieval head). */
typedef struct ks_policy_hidden_i {
    bool needs_dlm;       /* needs a draft model (dlm=, or the one shipped beside the model) */
    /* layer ids whose *input* residual stream is captured (n_layer = the
     * final hidden state); returns how many (<= 3). REQUIRED */
    int32_t (*hidden_layers)(void *state, int32_t out[3]);
    /* After each forward, for every row in order (prefill rows, then decode
     * rows): its token, position and captured states h [n][n_embd]. REQUIRED */
    void (*on_hidden)(void *state, int32_t seq, int32_t pos, int32_t token, const float *h);
    /* Bytes of weights the policy keeps (SpeContext's M_D). OPTIONAL */
    size_t (*weight_bytes)(void *state);
    /* Whether it keeps a K cache of its own, one layer's worth (the memory model's "+1"). */
    bool own_kcache;
} ks_policy_hidden_i;

/* A refining stage: prunes the selection the chain's selector made (or
 * every entry, when there is none) in place, for the same request; req->q
 * may be NULL (a global prefetch): then it leaves the answer alone. */
typedef struct ks_policy_refine_i {
    ks_status (*refine)(void *state, const ks_select_req *req, ks_selection *sel);        /* REQUIRED */
    void (*counters)(void *state, ks_policy_counters *out);                                /* OPTIONAL: += */
} ks_policy_refine_i;

/* Prefix caching (infer/prefix_context.c): present when a prompt whose leading
 * tokens' KV is restored from the cache (byte for byte what a prefill of
 * them stores; the page summaries are recomputed from it) and whose rest is
 * prefilled, with the prefill hooks seeing the whole prompt and the last
 * max(1, obs_window) rows recomputed, leaves this policy in exactly the
 * state a prefill of the whole prompt does.  A policy with per-token state
 * outside the store that the restored rows would have built (spec's
 * retrieval-head keys) saves and loads it through the three hooks, kept
 * with the cached blocks (all three or none). */
typedef struct ks_policy_prefix_i {
    size_t (*state_bytes)(void *state, int32_t n_tokens);
    /* positions [first, first + n) of seq, out / in [state_bytes(n)]; load is
     * called in position order from 0 on an empty sequence. */
    ks_status (*state_save)(void *state, int32_t seq, int32_t first, int32_t n, uint8_t *out);
    ks_status (*state_load)(void *state, int32_t seq, int32_t first, int32_t n, const uint8_t *in);
} ks_policy_prefix_i;
/* The prefix part of a shareable policy with no per-token state outside
 * the store (every policy but spec): no hooks. */
extern const ks_policy_prefix_i ks_policy_prefix_stateless;

typedef struct ks_policy_i {
    const char *name;     /* REQUIRED: the name --policy takes */
    const char *summary;  /* REQUIRED: one line for --help and docs */
    /* REQUIRED: why a prefix-cache hit does (prefix set) or does not leave
     * the policy as a whole prefill would, for docs/POLICIES.md and --help */
    const char *prefix_why;
    ks_status (*create)(const ks_policy_env *env, const ks_policy_spec *spec, void **state); /* REQUIRED */
    void (*destroy)(void *state);                                                            /* REQUIRED */
    const char *const *arg_names; /* NULL-terminated keys --policy-arg accepts (NULL: none) */
    bool page_summaries;  /* reads per-page key summaries (kmin / kmax / ksum of kv_meta.h) */
    const ks_policy_select_i *select;   /* OPTIONAL */
    const ks_policy_prefill_i *prefill; /* OPTIONAL */
    const ks_policy_hidden_i *hidden;   /* OPTIONAL */
    const ks_policy_prefix_i *prefix;   /* OPTIONAL */
    const ks_policy_refine_i *refine;   /* OPTIONAL (then no select, prefill or hidden: a chain's last stage) */
} ks_policy_i;

/* What the interface says, for the registry's readers. */
static inline bool ks_policy_i_evicts(const ks_policy_i *vt) { return vt->prefill && vt->prefill->evicts; }
static inline bool ks_policy_i_needs_dlm(const ks_policy_i *vt) { return vt->hidden && vt->hidden->needs_dlm; }
static inline bool ks_policy_i_global(const ks_policy_i *vt) { return vt->select && vt->select->global; }
static inline bool ks_policy_i_refines(const ks_policy_i *vt) { return vt->refine != NULL; }
static inline int32_t ks_policy_i_obs_window(const ks_policy_i *vt) { return vt->prefill ? vt->prefill->obs_window : 0; }

#include "policy/policy_util.h"

#endif
