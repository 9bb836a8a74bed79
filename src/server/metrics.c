/*
 * metrics.c — GET /metrics (Prometheus text format, version 0.0.4) and the
 * model object of /v1/models.
 */
#include "server/internal.h"
#include "core/platform.h"

#include <stdio.h>
#include <unistd.h>

cJSON *ks_server_model_object(ks_server *srv) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", srv->model_id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)srv->created);
    cJSON_AddStringToObject(m, "owned_by", "kvsieve");
    cJSON *x = cJSON_AddObjectToObject(m, "kvsieve");
    ks_sched_metrics mt;
    ks_sched_get_metrics(srv->sched, &mt);
    cJSON_AddNumberToObject(x, "n_ctx", srv->n_ctx);
    cJSON_AddNumberToObject(x, "n_vocab", srv->n_vocab);
    cJSON_AddNumberToObject(x, "n_parallel", mt.n_parallel);
    cJSON_AddStringToObject(x, "policy", srv->p.defaults.spec.name);
    cJSON_AddNumberToObject(x, "budget", srv->p.defaults.spec.budget);
    cJSON_AddBoolToObject(x, "prefix_cache", mt.cache_on); /* clients may expect cached_tokens to grow */
    return m;
}

enum MHD_Result ks_server_handle_metrics(ks_server *srv, struct MHD_Connection *conn) {
    ks_sched_metrics m;
    ks_sched_get_metrics(srv->sched, &m);
    ks_sbuf b = {0};
#define METRIC(name, type, help, fmt, val) \
    ks_sbuf_printf(&b, "# HELP kvsieve_" name " " help "\n# TYPE kvsieve_" name " " type "\nkvsieve_" name " " fmt "\n", val)
    METRIC("requests_running", "gauge", "Requests holding a sequence slot (prefilling or decoding).", "%d", m.running);
    METRIC("requests_waiting", "gauge", "Requests queued for a slot.", "%d", m.waiting);
    METRIC("requests_waiting_limit", "gauge", "Waiting-queue bound; beyond it requests get 429.", "%d", m.max_waiting);
    ks_sbuf_printf(&b, "# HELP kvsieve_requests_total Completion requests by outcome.\n# TYPE kvsieve_requests_total counter\n");
    ks_sbuf_printf(&b, "kvsieve_requests_total{outcome=\"completed\"} %llu\n", (unsigned long long)m.requests_completed);
    ks_sbuf_printf(&b, "kvsieve_requests_total{outcome=\"cancelled\"} %llu\n", (unsigned long long)m.requests_cancelled);
    ks_sbuf_printf(&b, "kvsieve_requests_total{outcome=\"failed\"} %llu\n", (unsigned long long)m.requests_failed);
    ks_sbuf_printf(&b, "kvsieve_requests_total{outcome=\"rejected_queue_full\"} %llu\n",
                (unsigned long long)m.requests_rejected);
    ks_sbuf_printf(&b, "# HELP kvsieve_http_responses_total HTTP answers by status.\n# TYPE kvsieve_http_responses_total counter\n");
    for (int i = 0; i <= KS_SERVER_N_CODES; i++) {
        unsigned long long v = atomic_load(&srv->responses[i]);
        if (i < KS_SERVER_N_CODES) ks_sbuf_printf(&b, "kvsieve_http_responses_total{code=\"%d\"} %llu\n", ks_server_codes[i], v);
        else ks_sbuf_printf(&b, "kvsieve_http_responses_total{code=\"other\"} %llu\n", v);
    }
    METRIC("prompt_tokens_total", "counter", "Prompt tokens of accepted requests.", "%llu",
           (unsigned long long)m.tokens_prompt);
    METRIC("tokens_generated_total", "counter", "Tokens generated.", "%llu", (unsigned long long)m.tokens_generated);
    METRIC("tokens_per_second", "gauge", "Generated tokens per second over the last 10 s.", "%.3f", m.tokens_per_second);
    METRIC("decode_steps_total", "counter", "Batched decode steps (one ks_decode each).", "%llu",
           (unsigned long long)m.decode_steps);
    METRIC("decode_steps_mixed_total", "counter", "Decode steps whose sequences had different policies.", "%llu",
           (unsigned long long)m.decode_steps_mixed);
    METRIC("prefill_chunks_total", "counter", "Prefill calls (chunks of n_batch tokens, or whole prompts).", "%llu",
           (unsigned long long)m.prefill_chunks);
    METRIC("contexts", "gauge", "Engine contexts alive (one per KV page size in use; policies share them).", "%d",
           m.groups);
    METRIC("contexts_created_total", "counter", "Engine contexts created.", "%llu", (unsigned long long)m.contexts_created);
    METRIC("contexts_recycled_total", "counter", "Idle contexts recreated to bring offloaded layers back.", "%llu",
           (unsigned long long)m.contexts_recycled);
    METRIC("weight_bytes_read_total", "counter", "Bytes of weights streamed by matmuls.", "%llu",
           (unsigned long long)m.engine.weight_bytes_read);
    METRIC("kv_bytes_read_total", "counter", "Bytes of K and V read by attention.", "%llu",
           (unsigned long long)m.engine.kv_bytes_read);
    METRIC("kv_bytes_loaded_total", "counter", "KV bytes loaded from the slow tier into the fast tier.", "%llu",
           (unsigned long long)m.engine.kv_bytes_loaded);
    METRIC("kv_bytes_stored_total", "counter", "KV bytes stored from the fast tier to the slow tier.", "%llu",
           (unsigned long long)m.engine.kv_bytes_stored);
    METRIC("kv_entries_attended_total", "counter", "KV entries read by decode attention.", "%llu",
           (unsigned long long)m.engine.kv_entries_attended);
    METRIC("kv_entries_dense_total", "counter", "KV entries dense decode attention would have read.", "%llu",
           (unsigned long long)m.engine.kv_entries_total);
    METRIC("kv_selection_share", "gauge", "Share of KV entries attended (attended / dense), cumulative.", "%.6f",
           m.engine.kv_entries_total ? (double)m.engine.kv_entries_attended / (double)m.engine.kv_entries_total : 1.0);
    METRIC("selection_seconds_total", "counter", "Policy selection time, summed over worker threads.", "%.6f",
           m.engine.select_seconds);
    METRIC("decode_seconds_total", "counter", "Engine time in decode steps.", "%.6f", m.engine.decode_seconds);
    METRIC("prefill_seconds_total", "counter", "Engine time in prefill.", "%.6f", m.engine.prefill_seconds);
    METRIC("kv_offload_events_total", "counter", "Layers moved to the slow tier by the memory manager.", "%llu",
           (unsigned long long)m.engine.kv_offload_events);
    METRIC("kv_layers_offloaded", "gauge", "Layers in the slow tier now, summed over contexts.", "%d", m.layers_offloaded);
    METRIC("kv_bytes_fast", "gauge", "KV bytes the running sequences hold in the fast tier now.", "%llu",
           (unsigned long long)m.kv_bytes_fast);
    METRIC("kv_bytes_slow", "gauge", "KV bytes the running sequences hold in the slow tier now (offloaded layers, paused requests).",
           "%llu", (unsigned long long)m.kv_bytes_slow);
    METRIC("requests_paused", "gauge", "Requests paused now, their KV parked in the slow tier (counted as running).", "%d",
           m.paused);
    METRIC("request_pauses_total", "counter", "Requests paused under the memory cap (KV parked in the slow tier).", "%llu",
           (unsigned long long)m.pauses);
    METRIC("request_resumes_total", "counter", "Paused requests resumed (KV brought back).", "%llu",
           (unsigned long long)m.resumes);
    if (m.cache_on) { /* the prefix cache (docs/SERVER.md, "Prefix cache") */
        const ks_prefix_cache_stats *c = &m.cache;
        METRIC("prefix_cache_hit_tokens_total", "counter", "Prompt tokens restored from the prefix cache.", "%llu",
               (unsigned long long)c->hit_tokens);
        METRIC("prefix_cache_miss_tokens_total", "counter", "Prompt tokens computed by requests that used the cache.",
               "%llu", (unsigned long long)c->miss_tokens);
        ks_sbuf_printf(&b, "# HELP kvsieve_prefix_cache_bytes Bytes of cached prefix blocks now, per tier.\n"
                           "# TYPE kvsieve_prefix_cache_bytes gauge\n");
        ks_sbuf_printf(&b, "kvsieve_prefix_cache_bytes{tier=\"ram\"} %llu\n", (unsigned long long)c->ram_bytes);
        ks_sbuf_printf(&b, "kvsieve_prefix_cache_bytes{tier=\"disk\"} %llu\n", (unsigned long long)c->disk_bytes);
        METRIC("prefix_cache_shared_bytes", "gauge",
               "Of the RAM tier: bytes of pinned pages running sequences map now (counted once, as theirs).", "%llu",
               (unsigned long long)c->ram_shared_bytes);
        ks_sbuf_printf(&b, "# HELP kvsieve_prefix_cache_blocks Cached prefix blocks now, per tier.\n"
                           "# TYPE kvsieve_prefix_cache_blocks gauge\n");
        ks_sbuf_printf(&b, "kvsieve_prefix_cache_blocks{tier=\"ram\"} %llu\n", (unsigned long long)c->ram_blocks);
        ks_sbuf_printf(&b, "kvsieve_prefix_cache_blocks{tier=\"disk\"} %llu\n", (unsigned long long)c->disk_blocks);
        METRIC("prefix_cache_evictions_total", "counter", "Blocks dropped from the RAM cache (LRU or memory cap).", "%llu",
               (unsigned long long)c->evictions);
        METRIC("prefix_cache_spills_total", "counter", "Blocks written to the cache directory.", "%llu",
               (unsigned long long)c->spills);
        METRIC("prefix_cache_loads_total", "counter", "Blocks read back from the cache directory.", "%llu",
               (unsigned long long)c->loads);
        METRIC("prefix_cache_disk_evictions_total", "counter", "Block files removed by the --cache-disk cap.", "%llu",
               (unsigned long long)c->disk_evictions);
        METRIC("prefix_cache_skipped_corrupt_total", "counter",
               "Block files skipped: corrupt, truncated or another model's.", "%llu",
               (unsigned long long)c->skipped_corrupt);
        METRIC("prefix_cache_healed_total", "counter",
               "Bad block files replaced by the recomputed block (so every replica hits them again).", "%llu",
               (unsigned long long)c->healed);
        METRIC("prefix_cache_trims_total", "counter", "Steps at which the cache gave RAM back under --mem-cap.", "%llu",
               (unsigned long long)m.cache_trims);
    }
    const long long rss = ks_platform_rss_bytes();
    METRIC("process_resident_bytes", "gauge", "Resident memory of the server process.", "%lld", rss < 0 ? 0 : rss);
#undef METRIC
    if (b.refused) {
        free(b.p);
        ks_api_error e;
        ks_api_error_set(&e, 503, "server_error", "out_of_memory", NULL, "the server ran out of memory writing the metrics");
        return ks_server_respond_error(srv, conn, &e);
    }
    return ks_server_respond(srv, conn, 200, "text/plain; version=0.0.4; charset=utf-8", b.p, 0, NULL);
}
