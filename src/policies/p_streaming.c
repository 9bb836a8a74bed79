/*
 * p_streaming.c — `streaming` (StreamingLLM): attention sinks plus a recent
 * window, nothing else.  The framework adds --sink and --window; a budget
 * widens the recent window to budget - sink (so "streaming at 6%" means sinks
 * plus the most recent 6% of the context), and no budget means exactly
 * sink + window.
 * Entries outside are never attended again (StreamingLLM's permanent
 * eviction, as a selection: memory is not reclaimed, results are the same).
 */
#include "policy/policy.h"

typedef struct {
    int32_t budget;
} streaming_state;

static ks_status streaming_create(const ks_policy_env *env, const ks_policy_spec *p, void **state) {
    (void)env;
    streaming_state *s = ks_calloc(1, sizeof *s);
    if (!s) return KS_FAIL(KS_ERR_NOMEM, "streaming policy");
    s->budget = p->budget;
    *state = s;
    return KS_OK;
}

static void streaming_destroy(void *state) { ks_free(state); }

static ks_status streaming_select(void *state, const ks_select_req *req, ks_selection *out) {
    out->pages = false;
    out->n = 0;
    if (((const streaming_state *)state)->budget <= 0) return KS_OK; /* sinks + window only */
    /* the n_select entries just before the framework's window */
    int32_t hi = req->n_entries - req->window, lo = hi - req->n_select;
    if (lo < req->sink) lo = req->sink;
    for (int32_t e = lo; e < hi && out->n < out->cap; e++) out->idx[out->n++] = e;
    return KS_OK;
}

static const ks_policy_select_i streaming_select_i = {
    .select_layer = streaming_select,
};

const ks_policy_i ks_policy_streaming = {
    .name = "streaming",
    .summary = "StreamingLLM: sinks + recent window (set them with --sink/--window)",
    .prefix_why = "sinks and the recent window are positions: no state beyond the KV store",
    .create = streaming_create,
    .destroy = streaming_destroy,
    .select = &streaming_select_i,
    .prefix = &ks_policy_prefix_stateless,
};
