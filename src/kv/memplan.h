/*
 * memplan.h — SpeContext's adaptive memory management (Section 6).
 *
 * A long generation grows the KV cache step by step; a fixed split between
 * the fast tier (compute memory) and the slow tier is either wasteful early
 * (everything offloaded, every step pays transfers) or fatal late (nothing
 * offloaded, the cache outgrows the tier).  SpeContext predicts memory with
 *
 *   M_part(L_fast, S) = c (M_O + M_D) + e R [ (L_fast + 1 + alpha) S + L_slow B ] H D
 *
 * (e = 2 x bytes per KV element: K and V; the "+1" is the retrieval head's
 * own K cache; alpha the runtime memory that grows with S, in units of one
 * layer's KV; an offloaded layer keeps B entries per head in fast slots) and
 * precomputes, before decoding, the sequence lengths S^T_k up to which
 * L - k layers still fit (Algorithm 1).  While decoding, each time S crosses
 * the next threshold one more layer — from the last backwards — moves to the
 * slow tier (Algorithm 2).
 */
#ifndef KS_KV_MEMPLAN_H
#define KS_KV_MEMPLAN_H

#include "core/core.h"

typedef struct ks_memplan_params {
    double model_bytes;     /* M_O: target weights */
    double dlm_bytes;       /* M_D: retrieval head weights (0 without one) */
    double overhead;        /* c: factor on weights for activations etc. (paper: 1.3) */
    int32_t n_layer, n_head_kv, head_dim;
    double kv_elem_bytes;   /* bytes per K or V element (f16: 2; 8-bit: 34/32) */
    bool k_only;            /* entries hold a K row only (latent attention: the values are the keys) */
    int32_t requests;       /* R: sequences decoded together */
    int32_t budget;         /* B: entries per head kept fast for an offloaded layer */
    bool dlm_cache;         /* count the retrieval head's K cache (the "+1") */
    double alpha;           /* runtime memory growing with S, in layers of KV */
    double mem_cap;         /* fast-tier capacity in bytes */
    /* Sliding-window layers (gemma3's local layers): n_local of the n_layer
     * keep min(S, window) entries per head whatever the length, stay fast
     * and are never offloaded.  With n_local > 0, every l_fast below and
     * every k of the thresholds counts global layers only (k <= n_layer -
     * n_local; thr[k] = -1 beyond).  0: every layer is global. */
    int32_t n_local, window;
} ks_memplan_params;

/* Predicted fast-tier bytes with l_fast (global) layers resident at sequence length S. */
double ks_memplan_bytes(const ks_memplan_params *p, int32_t l_fast, int64_t S);

/* Algorithm 1.  thr[k] (k = 0..n_layer) is the largest S at which n_layer - k
 * layers fit in mem_cap (k layers offloaded); -1 if none fits even at S = 0.
 * KS_ERR_INVALID_ARG on bad parameters. */
ks_status ks_memplan_thresholds(const ks_memplan_params *p, int64_t *thr);

/* Algorithm 2's decision: layers that must be offloaded at length S (the
 * smallest k with S <= thr[k]); n_layer + 1 when even all-offloaded overflows. */
int32_t ks_memplan_offloaded_at(const int64_t *thr, int32_t n_layer, int64_t S);

/* The model over the actual state of a batch rather than R sequences at the
 * longest length: with e1 the bytes of one token of one layer's KV (K and V,
 * every KV head),
 *
 *   M(L_fast) = c (M_O + M_D) + e1 [ L_fast T_fast + T_all + alpha R S_max
 *                                    + L_slow B n_active ]
 *
 * T_fast: tokens of the sequences whose KV is in the store (not parked);
 * T_all: tokens of every sequence, parked ones included (the retrieval
 * head's own K cache, counted only with dlm_cache, stays fast); S_max: the
 * longest unparked sequence (the runtime scratch grows with it, as in
 * ks_memplan_bytes); n_active: unparked sequences holding tokens (each keeps
 * B fast entries per head of an offloaded layer).  With R sequences all at
 * length S it equals ks_memplan_bytes, so Algorithm 1's thresholds remain
 * the conservative special case. */
typedef struct ks_memplan_state {
    int64_t tokens_fast, tokens_all, longest;
    int32_t active;
} ks_memplan_state;
double ks_memplan_bytes_state(const ks_memplan_params *p, int32_t l_fast, const ks_memplan_state *s);
/* Algorithm 2 over the state: the fewest layers to offload (last first) for
 * the state to fit mem_cap; n_layer + 1 when even all-offloaded overflows. */
int32_t ks_memplan_offloaded_for(const ks_memplan_params *p, const ks_memplan_state *s);

#endif
