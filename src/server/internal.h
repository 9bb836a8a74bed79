/*
 * internal.h — the server's shared state, for its own files only: server.c
 * (routing, the API key, answers, lifecycle), completion.c (the completion
 * routes: prompt, policy, waiting, SSE), tokens.c (/tokenize, /detokenize,
 * /apply-template), web.c (the chat page) and metrics.c (/metrics, the model
 * object).
 */
#ifndef KS_SERVER_INTERNAL_H
#define KS_SERVER_INTERNAL_H

#include "core/core.h"
#include "sched/buf.h"
#include "server/api.h"
#include "server/server.h"

#include <cjson/cJSON.h>
#include <microhttpd.h>
#include <stdatomic.h>
#include <time.h>

/* HTTP statuses counted one by one in /metrics (the rest as "other") */
enum { KS_SERVER_N_CODES = 9 };
extern const int ks_server_codes[KS_SERVER_N_CODES];

struct ks_server {
    const ks_model *model;
    ks_sched *sched;
    ks_server_params p;
    char *host, *api_key, *model_id, *model_path;
    struct MHD_Daemon *daemon;
    int port;
    int32_t n_ctx, n_vocab;
    time_t created;
    atomic_bool shutting_down;
    atomic_int active;              /* completion requests holding a scheduler handle */
    atomic_ullong n_ids;
    atomic_ullong responses[KS_SERVER_N_CODES + 1]; /* by status; the last: any other */
};

/* server.c */
void ks_server_count_status(ks_server *srv, int status);
/* Queue body (malloc'd, taken) with status. */
enum MHD_Result ks_server_respond(ks_server *srv, struct MHD_Connection *c, int status, const char *ctype, char *body,
                                  int retry_after, const char *allow);
enum MHD_Result ks_server_respond_json(ks_server *srv, struct MHD_Connection *c, int status, cJSON *root);
enum MHD_Result ks_server_respond_error(ks_server *srv, struct MHD_Connection *c, const ks_api_error *e);
/* The client closed its side (or the socket failed). */
bool ks_server_client_gone(struct MHD_Connection *c);

/* completion.c: POST /v1/completions and /v1/chat/completions */
enum MHD_Result ks_server_handle_completion(ks_server *srv, struct MHD_Connection *conn, ks_api_kind kind,
                                            const char *body, size_t len);

/* The text of a chat request's prompt (malloc'd into *text): the GGUF's
 * chat template, or the contents joined for a model without one; *special:
 * encode it with special tokens parsed.  Shared with /apply-template. */
bool ks_server_chat_prompt(ks_server *srv, const ks_api_request *rq, char **text, bool *special, ks_api_error *e);

/* tokens.c: POST /tokenize, /detokenize, /apply-template */
bool ks_server_is_tokens_route(const char *path);
enum MHD_Result ks_server_handle_tokens(ks_server *srv, struct MHD_Connection *conn, const char *path,
                                        const char *body, size_t len);

/* logprobs.c: OpenAI's logprobs objects (NULL on a refused allocation);
 * text_offset: bytes of the completion's text before lp[0], advanced. */
cJSON *ks_server_logprobs_chat(ks_server *srv, const ks_sched_logprob *lp, int32_t n);
cJSON *ks_server_logprobs_text(ks_server *srv, const ks_sched_logprob *lp, int32_t n, size_t *text_offset);

/* metrics.c */
enum MHD_Result ks_server_handle_metrics(ks_server *srv, struct MHD_Connection *conn);
cJSON *ks_server_model_object(ks_server *srv);

#endif
