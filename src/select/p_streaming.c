/*
 * p_streaming.c — `streaming` (StreamingLLM): attention sinks plus a recent
 * window, nothing else.  The framework already adds both, so the selector
 * asks for nothing more; the budget only matters through sink + window.
 * Entries outside are never attended again (StreamingLLM's permanent
 * eviction, as a selection: memory is not reclaimed, results are the same).
 */
#include "select/policy.h"

static ks_status streaming_create(const ks_policy_env *env, const ks_policy_params *p, void **state) {
    (void)env;
    (void)p;
    *state = ks_calloc(1, 1);
    return KS_OK;
}

static void streaming_destroy(void *state) { ks_free(state); }

static ks_status streaming_select(void *state, const ks_select_req *req, ks_selection *out) {
    (void)state;
    (void)req;
    out->n = 0;
    return KS_OK;
}

const ks_policy_i ks_policy_streaming = {
    .name = "streaming",
    .summary = "StreamingLLM: sinks + recent window (set them with --sink/--window)",
    .create = streaming_create,
    .destroy = streaming_destroy,
    .select_layer = streaming_select,
};
