/*
 * registry.h — the policy registry and a running policy, as the engine and
 * the selection API use them.
 *
 * The registry (registry.c) is the only list of policies and the only parser
 * of policy strings: ks_policy_spec_parse (kvsieve.h) turns "EVICTOR+SELECTOR"
 * and "k=v,k=v" into a ks_policy_spec whose chain holds the registry's
 * entries, and everything that asks what a policy needs (a draft model, a
 * prefill hook, chunkable prefill, page summaries) asks the spec or the
 * interface here, never the name.
 *
 * A running policy (policy.c) is one interface, or an evictor composed with
 * a selector ("snapkv+quest": the prefill hooks of every part in order, the
 * decode hooks of the last).  The prefill helpers the engine calls around
 * it (how many observation rows, pseudo tokens) are here too.
 */
#ifndef KS_POLICIES_REGISTRY_H
#define KS_POLICIES_REGISTRY_H

#include "policy/policy.h"

/* All registered policies, NULL-terminated, and one by name (NULL: none). */
const ks_policy_i *const *ks_policy_list(void);
const ks_policy_i *ks_policy_find(const char *name);
/* Add a policy to the registry at run time (one not in registry.c's table:
 * a test, or a program built on ks_select), before any spec names it; not
 * safe concurrently with lookups.  KS_ERR_INVALID_ARG for an interface
 * lacking a required member or a name in use. */
ks_status ks_policy_register(const ks_policy_i *vt);
/* The interfaces of a spec's chain, the decode selector last. */
const ks_policy_i *ks_policy_spec_part(const ks_policy_spec *spec, int32_t i);

/* A running policy: one interface, or an evictor composed with a selector
 * ("snapkv+quest": prefill hooks of the first, decode hooks of the last). */
typedef struct ks_policy ks_policy;

/* The instance of a parsed spec (ks_policy_spec_parse): its parts created
 * in chain order, each with the same env and spec (copied). */
ks_status ks_policy_create(const ks_policy_spec *spec, const ks_policy_env *env, ks_policy **out);
void ks_policy_destroy(ks_policy *pol);
const char *ks_policy_name(const ks_policy *pol);
const ks_policy_spec *ks_policy_spec_of(const ks_policy *pol);
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

#endif
