/*
 * kvsieve_select.h — kvsieve's KV selection policies over a KV cache the
 * caller owns.
 *
 * Another engine keeps its own KV cache and attention kernel; at each decode
 * step it asks a selector which entries of each (layer, KV head) attention
 * should read, attends over those only, and (for policies that learn from it,
 * H2O) reports the attention weights back.  The selector runs kvsieve's own
 * policy code (src/policies/p_*.c), the same code `kvsieve run --policy NAME`
 * runs; only the KV it reads is the caller's.
 *
 * What the caller passes (all borrowed for the duration of the call, never
 * kept, never written):
 *   - per (layer, KV head) a kvs_head_kv: a view of the keys (pointer, row
 *     stride, f32 / f16 / bf16; RoPE applied, as attention sees them), the
 *     entry count, optional positions, and optional page summaries
 *     (Quest-style per-page, per-channel key min / max / sum);
 *   - per selection the queries of the KV head's group (a kvs_view of G rows,
 *     RoPE applied).
 * What it gets: the entry indices to attend, ascending, sinks and recent
 * window included, within the budget (page-granular policies round their
 * share up to whole pages).
 *
 * Style follows llama.cpp: an opaque handle, default params, create/destroy,
 * status codes, results through out-parameters.  A selector serves ONE
 * sequence (create one per sequence) and is not thread-safe: calls on one
 * selector must not overlap (different selectors may run concurrently).
 *
 * The loop (examples/select_loop.c is a complete one):
 *
 *   kvs_selector_params p = kvs_selector_default_params();
 *   p.n_layer = L; p.n_head = H; p.n_head_kv = HKV; p.head_dim = D; p.n_ctx = N;
 *   p.budget = 512;
 *   kvs_selector *sel;
 *   if (kvs_selector_create("quest", &p, &sel) != KVS_OK) ... kvs_last_error()
 *   // optional, after the prompt: kvs_selector_prefill(sel, kv, obs_q, n_obs)
 *   for each decode step at position pos:
 *       kvs_selector_begin_step(sel, kv, &(kvs_step){.pos = pos, ...});  // before appending pos
 *       for each layer l: compute q, k, v; append k, v to the cache (kv[l * HKV + h].n_entries++)
 *           for each KV head h:
 *               kvs_selector_select(sel, kv, l, h, &q_view, &out);       // out.idx[0..out.n)
 *               attend over out.idx only
 *               kvs_selector_feedback(sel, l, h, out.idx, weights, out.n); // if kvs_selector_wants_feedback
 *   kvs_selector_destroy(sel);
 *
 * Policies.  kvs_policy_count / kvs_policy_get list every kvsieve policy
 * (the registry `kvsieve run --policy help` prints); `api` says whether this
 * API serves it.  Served: dense, streaming, h2o, quest, freekv, lrqk, chess,
 * topp, and any of them followed by the refining stage "+topp" ("quest+topp").
 * Not served (kvs_selector_create returns KVS_ERR_UNSUPPORTED): spec, which
 * needs a draft model's retrieval head and the target's hidden states, and
 * the prefill evictors snapkv and dapq (and compositions "a+b"), which remove
 * entries from the cache: a caller-owned cache cannot be compacted by us.
 *
 * Budget convention (as kvsieve's --budget): `budget` counts every entry a
 * KV head attends, sinks and window included; with budget <= 0 or budget >=
 * the entries of the head every entry is selected (out->all), which makes a
 * full budget exactly dense attention.  The first dense_layers layers are
 * always dense (-1: the policy's own default, kvs_policy_info.dense_layers).
 */
#ifndef KVSIEVE_SELECT_H
#define KVSIEVE_SELECT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------- status -- */
/* Every fallible call returns one; on failure kvs_last_error() says what and
 * where, and nothing was written through out-parameters unless noted. */
typedef enum kvs_status {
    KVS_OK = 0,
    KVS_ERR_INVALID_ARG = 1,   /* bad argument or call order; the selector is unchanged */
    KVS_ERR_NOT_FOUND = 2,     /* unknown policy name; nothing was created */
    KVS_ERR_UNSUPPORTED = 3,   /* the policy needs what a caller-owned cache cannot supply
                                  (spec, snapkv, dapq, compositions); nothing was created */
    KVS_ERR_NOMEM = 4,         /* an allocation sized by the parameters was refused; at create nothing
                                  was created, later the selector must be reset (kvs_selector_reset) */
    KVS_ERR_BUFFER_TOO_SMALL = 5, /* kvs_selection.cap below the head's entries: .n holds the size
                                  needed, nothing else was written, the selector is unchanged */
} kvs_status;

const char *kvs_status_str(kvs_status st);
/* "file:line: message" of the last failure on this thread (never NULL). */
const char *kvs_last_error(void);

/* -------------------------------------------------------------- views -- */
typedef enum kvs_type {
    KVS_TYPE_F32 = 0,
    KVS_TYPE_F16 = 1,  /* IEEE 754 binary16, as uint16_t */
    KVS_TYPE_BF16 = 2, /* bfloat16, as uint16_t */
} kvs_type;

/* Rows of head_dim contiguous elements: row i at (const char *)data + i * row_stride. */
typedef struct kvs_view {
    const void *data;
    kvs_type type;
    size_t row_stride;   /* bytes between rows; 0: packed (head_dim elements) */
} kvs_view;

/* One (layer, KV head) of the caller's cache.  Entries are append-only
 * between kvs_selector_reset calls: entry i keeps its key once written (the
 * selector caches summaries of full pages; lrqk learns from each new key). */
typedef struct kvs_head_kv {
    kvs_view keys;         /* [n_entries] keys, RoPE applied as attention sees them */
    int32_t n_entries;
    const int32_t *pos;    /* [n_entries] increasing positions; NULL: entry i is at position i */
    /* Optional page summaries over pages of params.page_size entries (page p
     * = entries [p P, p P + P)), kept by the caller, all three or none, f32:
     * per-channel min, max and sum of the page's keys, [n_pages][head_dim]
     * packed.  NULL: the selector keeps its own (computed from the keys; full
     * pages once).  Only policies with kvs_policy_info.page_summaries read them. */
    const float *page_kmin, *page_kmax, *page_ksum;
} kvs_head_kv;

/* ----------------------------------------------------------- policies -- */
typedef struct kvs_policy_info {
    const char *name;           /* what kvs_selector_create takes */
    const char *summary;        /* one line */
    const char *const *args;    /* NULL-terminated keys params.args accepts (never NULL) */
    int32_t dense_layers;       /* default first dense layers */
    int32_t obs_window;         /* query rows kvs_selector_prefill uses: 0 none, -1 all, else the last N */
    bool api;                   /* served by this API (kvs_selector_create can succeed) */
    bool needs_dlm;             /* needs a draft model's retrieval head (spec) */
    bool evicts;                /* evicts at prefill (snapkv, dapq) */
    bool page_summaries;        /* reads page summaries (kvs_head_kv.page_*) */
    bool wants_feedback;        /* learns from kvs_selector_feedback (h2o) */
} kvs_policy_info;

int32_t kvs_policy_count(void);
/* i in [0, kvs_policy_count()): KVS_OK; else KVS_ERR_INVALID_ARG. */
kvs_status kvs_policy_get(int32_t i, kvs_policy_info *out);

/* ----------------------------------------------------------- selector -- */
typedef struct kvs_selector_params {
    int32_t n_layer;      /* layers (required) */
    int32_t n_head;       /* query heads (required) */
    int32_t n_head_kv;    /* KV heads; n_head % n_head_kv == 0 (required) */
    int32_t head_dim;     /* (required) */
    int32_t n_ctx;        /* most entries any (layer, KV head) will hold (required) */
    int32_t page_size;    /* entries per page (default 32): page-granular policies' unit */
    int32_t budget;       /* entries per KV head per step, sinks + window included; <= 0: all (default 0) */
    int32_t sink;         /* leading entries always selected (default 4) */
    int32_t window;       /* most recent entries always selected (default 64) */
    int32_t dense_layers; /* the first N layers select everything; -1: the policy's default */
    const char *args;     /* policy arguments "k=v,k=v" as --policy-arg takes them (copied; NULL: none) */
} kvs_selector_params;

typedef struct kvs_selector kvs_selector;

kvs_selector_params kvs_selector_default_params(void);

/* name: a policy of the registry.  On success *out owns a selector (destroy
 * it); on failure *out is untouched: KVS_ERR_NOT_FOUND, KVS_ERR_UNSUPPORTED,
 * KVS_ERR_INVALID_ARG (shapes, args), KVS_ERR_NOMEM. */
kvs_status kvs_selector_create(const char *name, const kvs_selector_params *params, kvs_selector **out);
void kvs_selector_destroy(kvs_selector *s); /* NULL: no-op */

/* Forget the sequence (a new one starts): policy state and cached summaries. */
void kvs_selector_reset(kvs_selector *s);

/* Query rows of the prompt the policy's prefill uses (kvs_policy_info.obs_window). */
int32_t kvs_selector_obs_window(const kvs_selector *s);
/* Whether kvs_selector_feedback changes anything (h2o). */
bool kvs_selector_wants_feedback(const kvs_selector *s);

/* Optional, once after the prompt is in the cache: lets the policy score the
 * prompt (h2o seeds its accumulated attention, lrqk factors the keys, freekv
 * speculates).  kv: [n_layer][n_head_kv] views; obs_q: [n_layer][n_obs]
 * [n_head][head_dim] f32 queries of the prompt's last n_obs tokens (RoPE
 * applied), at least kvs_selector_obs_window() rows where it is > 0 (more
 * are fine: the last ones are used; -1 wants every prompt row).  Without it
 * policies start from what they see at the first step. */
kvs_status kvs_selector_prefill(kvs_selector *s, const kvs_head_kv *kv, const float *obs_q, int32_t n_obs);

/* One decode step starts.  Call it before the step's token is appended to
 * any layer (kv then holds the entries before it): global policies (chess)
 * select once here for every layer. */
typedef struct kvs_step {
    int32_t pos;          /* position of the token being decoded */
    float entropy;        /* of the distribution the token was drawn from (nats); NaN: unknown */
    float varentropy;     /* NaN: unknown */
} kvs_step;
kvs_status kvs_selector_begin_step(kvs_selector *s, const kvs_head_kv *kv, const kvs_step *step);

/* The selection for one (layer, KV head) of the current step.  kv:
 * [n_layer][n_head_kv] views, the step's token already appended to this
 * (layer, head); q: the G = n_head / n_head_kv query rows of the head's
 * group (RoPE applied).  out->idx is the caller's buffer of out->cap >=
 * kv[layer * n_head_kv + head].n_entries entries (else
 * KVS_ERR_BUFFER_TOO_SMALL with out->n = that count); on KVS_OK out->n
 * entries, ascending and unique, and out->all when they are every entry.
 * On other failures out is untouched; KVS_ERR_NOMEM needs a reset. */
typedef struct kvs_selection {
    int32_t *idx;         /* [cap] caller-owned */
    int32_t cap;
    int32_t n;            /* out */
    bool all;             /* out */
} kvs_selection;
kvs_status kvs_selector_select(kvs_selector *s, const kvs_head_kv *kv, int32_t layer, int32_t head,
                               const kvs_view *q, kvs_selection *out);

/* The attention weights the selection received: for the n entries idx
 * (normally out->idx of the select), weight[i] = the softmax probability of
 * entry idx[i] summed over the G query heads of the group.  Ignored by
 * policies that do not want it and for dense layers. */
kvs_status kvs_selector_feedback(kvs_selector *s, int32_t layer, int32_t head, const int32_t *idx,
                                 const float *weight, int32_t n);

#ifdef __cplusplus
}
#endif

#endif
