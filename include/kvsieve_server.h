/*
 * kvsieve_server.h — the OpenAI-compatible HTTP server with continuous
 * batching (docs/SERVER.md) as one public handle.
 *
 * Why one handle: behind `kvsieve serve` sit a scheduler (src/sched/) and an
 * HTTP front (src/server/) whose parameters and policy struct are the
 * engine's own and change with it.  An application (the CLI included) only
 * needs to start a server on a model, learn its port, ask it to wind down
 * and stop it; the defaults for requests without a "kvsieve" object come as
 * the policy fields of a ks_context_params, the same value a `kvsieve run`
 * would create its context from.  Link ks_server (CMake) to use it.
 */
#ifndef KVSIEVE_SERVER_H
#define KVSIEVE_SERVER_H

#include "kvsieve.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ks_serve ks_serve;

typedef struct ks_serve_params {
    const char *host;         /* numeric address or "localhost" (default 127.0.0.1) */
    int port;                 /* 0: a free port (ks_serve_port tells which); default 8080 */
    const char *api_key;      /* NULL: none; else "Authorization: Bearer KEY" on every request */
    const char *model_id;     /* the name /v1/models reports */
    const char *model_path;   /* spec finds its draft model beside it */
    int32_t n_ctx;            /* tokens per sequence */
    int32_t n_parallel;       /* sequences decoded together per policy configuration (default 4) */
    int32_t n_threads;        /* 0: all cores */
    int32_t n_batch;          /* prefill chunk (default 256) */
    ks_kv_type kv_type;
    int32_t max_waiting;      /* requests waiting for a slot before 429 (default 64) */
    int32_t max_groups;       /* contexts alive at once (0: the scheduler's default) */
    int max_connections;      /* 0: the server's default */
    /* Requests' default policy and the slow tier / memory cap: the policy,
     * budget, sink, window, page, dense_layers, policy_args, kv_offload_*,
     * kv_slots, mem_cap and mem_overhead fields (the rest is ignored). */
    ks_context_params defaults;
    ks_prefix_cache *cache;   /* borrowed (NULL: none); must outlive the server */
} ks_serve_params;

ks_serve_params ks_serve_default_params(void);
/* Start serving model (borrowed, must outlive the server).  On failure err
 * receives the reason and *what (when non-NULL) the step: "creating the
 * scheduler" (KS_ERR_INVALID_ARG there: the parameters are refused) or
 * "starting the server". */
ks_status ks_serve_start(const ks_model *model, const ks_serve_params *p, ks_serve **out, char *err, size_t err_cap,
                         const char **what);
int ks_serve_port(const ks_serve *s);
/* Refuse new requests (503) and give the running ones grace_s seconds to finish. */
void ks_serve_begin_shutdown(ks_serve *s, double grace_s);
/* End the running requests now. */
void ks_serve_end_requests(ks_serve *s);
/* No request running or queued, and no completion still being answered. */
bool ks_serve_idle(ks_serve *s);
/* Close every connection, join the threads, free (NULL: no-op). */
void ks_serve_stop(ks_serve *s);

#ifdef __cplusplus
}
#endif
#endif
