/*
 * p_dense.c — `dense`: every entry, every layer.  No hooks beyond create:
 * the framework attends everything when a policy has no selector, so dense
 * runs the very kernel every sparse policy runs, which is what makes
 * "budget >= context equals dense" a bit-exact check.
 */
#include "policy/policy.h"

static ks_status dense_create(const ks_policy_env *env, const ks_policy_spec *p, void **state) {
    (void)env;
    (void)p;
    *state = ks_calloc(1, 1);
    return *state ? KS_OK : KS_FAIL(KS_ERR_NOMEM, "dense policy");
}

static void dense_destroy(void *state) { ks_free(state); }

const ks_policy_i ks_policy_dense = {
    .name = "dense",
    .summary = "full attention over every KV entry (the reference)",
    .prefix_why = "no state beyond the KV store: the restored rows are all it reads",
    .create = dense_create,
    .destroy = dense_destroy,
    .prefix = &ks_policy_prefix_stateless,
};
