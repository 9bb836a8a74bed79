/*
 * policy_env.c — what a policy reads of the KV store through its env
 * (policy_env.h): the engine's store, or the metadata callbacks another
 * engine gives the public selection API (kvsieve_select.h).  Every policy
 * reads through these, so they sit below the policies and the registry,
 * beside the interface (policy.h), not in the running policy (policy.c).
 */
#include "policy/policy.h"

int32_t ks_policy_kv_page_size(const ks_policy_env *env) {
    return env->meta ? env->meta->page_size : ks_kv_page_size(env->kv);
}
int32_t ks_policy_kv_n_entries(const ks_policy_env *env, int32_t seq, int32_t layer, int32_t head) {
    return env->meta ? env->meta->n_entries(env->meta->ctx, seq, layer, head) : ks_kv_n_entries(env->kv, seq, layer, head);
}
int32_t ks_policy_kv_n_pages(const ks_policy_env *env, int32_t seq, int32_t layer, int32_t head) {
    if (!env->meta) return ks_kv_n_pages(env->kv, seq, layer, head);
    int32_t P = env->meta->page_size;
    return (env->meta->n_entries(env->meta->ctx, seq, layer, head) + P - 1) / P;
}
bool ks_policy_kv_pages_bounds8(const ks_policy_env *env, int32_t seq, int32_t layer, int32_t head, int32_t np,
                                const uint8_t **out) {
    if (env->meta) return false; /* caller summaries are f32 */
    ks_kv_pages_bounds8(env->kv, seq, layer, head, np, out);
    return true;
}
bool ks_policy_kv_pages_bounds16(const ks_policy_env *env, int32_t seq, int32_t layer, int32_t head, int32_t np,
                                 const uint16_t **out) {
    return !env->meta && ks_kv_pages_bounds16(env->kv, seq, layer, head, np, out); /* caller summaries are f32 */
}
void ks_policy_kv_page_meta(const ks_policy_env *env, int32_t seq, int32_t layer, int32_t head, int32_t lp,
                            ks_kv_page_meta *out) {
    if (env->meta) env->meta->page_meta(env->meta->ctx, seq, layer, head, lp, out);
    else ks_kv_page_meta_get(env->kv, seq, layer, head, lp, out);
}

const ks_policy_prefix_i ks_policy_prefix_stateless = {0};
