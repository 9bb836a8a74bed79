/*
 * server.h — the OpenAI-compatible HTTP server over the scheduler.
 *
 * HTTP is libmicrohttpd's (a thread per connection: a handler may block on
 * its request while the scheduler thread runs the engine); JSON is cJSON's.
 * Routes: POST /v1/completions, POST /v1/chat/completions (non-streaming, or
 * Server-Sent Events ending in `data: [DONE]`), GET /v1/models, GET /health,
 * GET /metrics (Prometheus text), POST /tokenize, /detokenize and
 * /apply-template (llama-server's shapes), and the chat page at GET /.  docs/SERVER.md is the reference: fields,
 * the `kvsieve` extension object, error objects and statuses, limits.
 *
 * A handler tokenizes its prompt, merges the request's `kvsieve` object over
 * the server's policy defaults, submits to the scheduler and then waits:
 * non-streaming for the end (answering with the status the outcome calls
 * for), streaming until the request is admitted (so a refusal is still a
 * proper HTTP error) and then from the response's content callback.  While
 * it waits it watches the client's socket: a client that hung up cancels its
 * request, which frees the slot before the next engine step.
 */
#ifndef KS_SERVER_H
#define KS_SERVER_H

#include "kvsieve.h"
#include "sched/sched.h"

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ks_server ks_server;

typedef struct ks_server_params {
    const char *host;          /* numeric address or "localhost" (default 127.0.0.1) */
    int port;                  /* 0: a free port (ks_server_port tells which) */
    const char *api_key;       /* NULL: no key; else "Authorization: Bearer KEY" on every request */
    const char *model_id;      /* the name /v1/models reports and responses carry */
    const char *model_path;    /* spec finds its draft model beside it (MODEL-dlm/) */
    int max_connections;       /* default 64 */
    size_t max_body;           /* bytes (default 8 MiB; more: 413) */
    int retry_after;           /* seconds in 429 answers (default 1) */
    ks_sched_policy defaults;  /* the server's policy flags */
} ks_server_params;

ks_server_params ks_server_default_params(void);

/* model and sched are borrowed and must outlive the server. */
ks_status ks_server_start(const ks_model *model, ks_sched *sched, const ks_server_params *params, ks_server **out,
                          char *err, size_t err_cap);
int ks_server_port(const ks_server *srv);
/* Refuse new completions (503) and report /health as shutting down; stop
 * accepting connections. */
void ks_server_begin_shutdown(ks_server *srv);
/* Completion requests still being answered. */
int ks_server_active(ks_server *srv);
/* Close every connection, join the threads, free. */
void ks_server_stop(ks_server *srv);

#ifdef __cplusplus
}
#endif
#endif
