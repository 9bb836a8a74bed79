/*
 * example_policy.c — the worked example of docs/DESIGN.md ("Adding a
 * policy"): a whole selection policy in one file.
 *
 * `uniform` spreads the entries it may choose evenly over the middle of
 * the head, between the sinks and the recent window that the framework
 * adds: a sparse baseline that looks at nothing, so any method that scores
 * entries should beat it.  With phase p in [0, 1) the i-th of k picks sits
 * at lo + (i + p) (hi - lo) / k.
 *
 * What a policy writes is only this: its state, create and destroy (the
 * spec carries the budget, sink, window and its checked "k=v" arguments),
 * the hooks of the sub-interfaces it has (here only a decode selector) and
 * the const table.  In src/select/ the file would be p_uniform.c and the
 * registry one line `&ks_policy_uniform,` in registry.c;
 * tests/test_example_policy.c registers it at run time instead
 * (ks_policy_register) and checks what every policy must do: a full budget
 * bit-identical to dense, a small one attending only what it chose.
 */
#include "policy/policy.h"

typedef struct { double phase; } uniform_state;
static const char *const uniform_args[] = {"phase", NULL};

static ks_status uniform_create(const ks_policy_env *env, const ks_policy_spec *spec, void **state) {
    (void)env;
    double phase; /* the spec's arguments were checked against uniform_args when parsed */
    KS_TRY(ks_args_float(spec->args, "phase", 0.5, 0.0, 0.999, &phase));
    uniform_state *s = ks_calloc(1, sizeof *s);
    s->phase = phase;
    *state = s;
    return KS_OK;
}
static void uniform_destroy(void *state) { ks_free(state); }

/* n_select entries evenly spaced between the sinks and the window (the framework adds those) */
static ks_status uniform_select(void *state, const ks_select_req *req, ks_selection *out) {
    const uniform_state *s = state;
    int32_t lo = req->sink, hi = req->n_entries - req->window, k = req->n_select;
    if (k > hi - lo) k = hi - lo;
    if (k > out->cap) k = out->cap;
    out->pages = false;
    out->n = 0;
    for (int32_t i = 0; i < k; i++) out->idx[out->n++] = lo + (int32_t)(((double)i + s->phase) * (hi - lo) / k);
    return KS_OK;
}

static const ks_policy_select_i uniform_select_i = {.select_layer = uniform_select, .default_dense_layers = 1};

const ks_policy_i ks_policy_uniform = {
    .name = "uniform",
    .summary = "worked example: entries evenly spaced between the sinks and the window",
    .prefix_why = "its picks are positions: no state beyond the KV store",
    .create = uniform_create,
    .destroy = uniform_destroy,
    .arg_names = uniform_args,
    .select = &uniform_select_i,
    .prefix = &ks_policy_prefix_stateless, /* a prefix-cache hit leaves it as a whole prefill would */
};
