/*
 * server.c — HTTP routes, prompt preparation, waiting, SSE (server.h).
 *
 * libmicrohttpd calls the access handler several times per request: once
 * with the headers (we allocate the connection state), once per piece of the
 * body (we append it, up to max_body), and once more with no data (we
 * answer).  Every connection has its own thread, so an answer may block:
 * a non-streaming completion waits for its request to finish and answers
 * with the status its outcome calls for; a streaming one waits until its
 * request is admitted (so that a refusal is still a plain HTTP error) and
 * then hands libmicrohttpd a content callback that blocks for the next text
 * and frames it as Server-Sent Events.  While waiting, both look at the
 * client's socket every 100 ms: a peer that hung up cancels its request.
 * If the peer vanishes while text is flowing, the failed write ends the
 * response and its free callback cancels the request.
 *
 * Nothing here touches the engine except tokenization and the chat template
 * (read-only uses of the model); the scheduler owns the contexts.
 */
#define _GNU_SOURCE
#include "server/server.h"

#include "server/api.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------ helpers -- */

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "kvsieve server: out of memory (%zu bytes)\n", n);
        abort();
    }
    return p;
}
static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) {
        fprintf(stderr, "kvsieve server: out of memory\n");
        abort();
    }
    return p;
}
static char *xstrdup(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    return memcpy(xmalloc(n), s, n);
}

typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

static void sbuf_put(sbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2 + 256;
        char *np = realloc(b->p, b->cap);
        if (!np) abort();
        b->p = np;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void sbuf_puts(sbuf *b, const char *s) { sbuf_put(b, s, strlen(s)); }
static void sbuf_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sbuf_printf(sbuf *b, const char *fmt, ...) {
    char tmp[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0) sbuf_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

static uint64_t random_u64(void) {
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        v = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)ts.tv_sec;
    }
    return v;
}

/* ------------------------------------------------------------- server -- */

static const int g_codes[] = {200, 400, 401, 404, 405, 413, 429, 500, 503};
enum { N_CODES = sizeof g_codes / sizeof g_codes[0] };

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
    atomic_ullong responses[N_CODES + 1]; /* by status; the last: any other */
};

ks_server_params ks_server_default_params(void) {
    ks_server_params p;
    memset(&p, 0, sizeof p);
    p.host = "127.0.0.1";
    p.port = 8080;
    p.model_id = "kvsieve";
    p.max_connections = 64;
    p.max_body = 8u << 20;
    p.retry_after = 1;
    p.defaults = ks_sched_policy_default();
    return p;
}

static void count_status(ks_server *srv, int status) {
    int k = N_CODES;
    for (int i = 0; i < N_CODES; i++)
        if (g_codes[i] == status) k = i;
    atomic_fetch_add(&srv->responses[k], 1);
}

/* Queue body (malloc'd, taken) with status. */
static enum MHD_Result respond(ks_server *srv, struct MHD_Connection *c, int status, const char *ctype, char *body,
                               int retry_after, const char *allow) {
    size_t len = body ? strlen(body) : 0;
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body ? body : (char *)"", body ? MHD_RESPMEM_MUST_FREE
                                                                                                  : MHD_RESPMEM_PERSISTENT);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (retry_after > 0) {
        char ra[32];
        snprintf(ra, sizeof ra, "%d", retry_after);
        MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, ra);
    }
    if (allow) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
    if (status == 401) MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    count_status(srv, status);
    return ret;
}

static enum MHD_Result respond_json(ks_server *srv, struct MHD_Connection *c, int status, cJSON *root) {
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return respond(srv, c, status, "application/json", s, 0, NULL);
}

static enum MHD_Result respond_error(ks_server *srv, struct MHD_Connection *c, const ks_api_error *e) {
    int retry = e->status == 429 || e->status == 503 ? (srv->p.retry_after > 0 ? srv->p.retry_after : 1) : 0;
    return respond(srv, c, e->status, "application/json", ks_api_error_json(e), retry, NULL);
}

/* The client closed its side (or the socket failed). */
static bool client_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return false;
    int fd = ci->connect_fd;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
    if (p.revents & POLLIN) {
        char b;
        return recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
    }
    return false;
}

static void set_error_from_sched(ks_api_error *e, ks_sched_error why, const char *msg, ks_api_kind kind) {
    switch (why) {
    case KS_SCHED_ERR_TOO_LONG:
        ks_api_error_set(e, 400, "invalid_request_error", "context_length_exceeded",
                         kind == KS_API_CHAT ? "messages" : "prompt", "%s", msg);
        break;
    case KS_SCHED_ERR_QUEUE_FULL:
        ks_api_error_set(e, 429, "requests", "rate_limit_exceeded", NULL, "%s", msg);
        break;
    case KS_SCHED_ERR_SHUTDOWN:
        ks_api_error_set(e, 503, "server_error", "server_shutting_down", NULL, "%s", msg);
        break;
    case KS_SCHED_ERR_INVALID:
        ks_api_error_set(e, 400, "invalid_request_error", "invalid_value", "kvsieve", "%s", msg);
        break;
    default:
        ks_api_error_set(e, 500, "server_error", "internal_error", NULL, "%s", msg && *msg ? msg : "internal error");
        break;
    }
}

/* ------------------------------------------------------ JSON answers -- */

static const char *finish_name(ks_sched_finish f) {
    return f == KS_SCHED_FINISH_LENGTH ? "length" : "stop";
}

static cJSON *usage_json(int32_t n_prompt, int32_t n_gen) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", n_gen);
    cJSON_AddNumberToObject(u, "total_tokens", (double)n_prompt + n_gen);
    return u;
}

static void add_clean_string(cJSON *o, const char *key, const char *s, size_t len) {
    char *c = ks_api_utf8_clean(s ? s : "", s ? len : 0);
    cJSON_AddStringToObject(o, key, c);
    free(c);
}

/* The envelope of a completion object or chunk. */
static cJSON *envelope(ks_server *srv, const char *id, const char *object, long created) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)created);
    cJSON_AddStringToObject(o, "model", srv->model_id);
    return o;
}

/* ------------------------------------------------------------- stream -- */

typedef struct stream {
    ks_server *srv;
    ks_sched_req *req;
    struct MHD_Connection *conn;
    ks_api_kind kind;
    bool include_usage, role_sent, done;
    char id[64];
    long created;
    sbuf out;          /* SSE bytes not yet handed to libmicrohttpd */
    size_t off;
    double last_check;
} stream;

static void sse_put(stream *st, cJSON *root) {
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    sbuf_puts(&st->out, "data: ");
    sbuf_puts(&st->out, s);
    sbuf_puts(&st->out, "\n\n");
    free(s);
}

static cJSON *chunk(stream *st, const char *text, size_t len, const char *finish) {
    bool chat = st->kind == KS_API_CHAT;
    cJSON *o = envelope(st->srv, st->id, chat ? "chat.completion.chunk" : "text_completion", st->created);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices"), *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", 0);
    if (chat) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (!st->role_sent) {
            cJSON_AddStringToObject(d, "role", "assistant");
            st->role_sent = true;
        }
        if (text) add_clean_string(d, "content", text, len);
    } else {
        add_clean_string(c, "text", text, len);
    }
    cJSON_AddNullToObject(c, "logprobs");
    if (finish) cJSON_AddStringToObject(c, "finish_reason", finish);
    else cJSON_AddNullToObject(c, "finish_reason");
    cJSON_AddItemToArray(choices, c);
    if (st->include_usage) cJSON_AddNullToObject(o, "usage");
    return o;
}

static void stream_absorb(stream *st, ks_sched_update *u) {
    if (u->text && u->len) sse_put(st, chunk(st, u->text, u->len, NULL));
    free(u->text);
    u->text = NULL;
    if (u->state != KS_SCHED_FINISHED) return;
    if (u->finish == KS_SCHED_FINISH_ERROR || u->finish == KS_SCHED_FINISH_CANCELLED) {
        ks_api_error e;
        set_error_from_sched(&e, u->error, u->message, st->kind);
        char *s = ks_api_error_json(&e);
        sbuf_puts(&st->out, "data: ");
        sbuf_puts(&st->out, s);
        sbuf_puts(&st->out, "\n\n");
        free(s);
    } else {
        sse_put(st, chunk(st, NULL, 0, finish_name(u->finish)));
        if (st->include_usage) {
            bool chat = st->kind == KS_API_CHAT;
            cJSON *o = envelope(st->srv, st->id, chat ? "chat.completion.chunk" : "text_completion", st->created);
            cJSON_AddArrayToObject(o, "choices");
            cJSON_AddItemToObject(o, "usage", usage_json(u->n_prompt, u->n_generated));
            sse_put(st, o);
        }
    }
    sbuf_puts(&st->out, "data: [DONE]\n\n");
    st->done = true;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream *st = cls;
    while (st->off == st->out.n) {
        if (st->done) return MHD_CONTENT_READER_END_OF_STREAM;
        st->out.n = st->off = 0;
        ks_sched_update u;
        bool news = ks_sched_req_take(st->srv->sched, st->req, 0.1, &u);
        stream_absorb(st, &u);
        double now = ks_sched_now();
        if (!st->done && (!news || now - st->last_check > 0.25)) {
            st->last_check = now;
            if (client_gone(st->conn)) {
                ks_sched_req_cancel(st->srv->sched, st->req);
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
        }
    }
    size_t n = st->out.n - st->off;
    if (n > max) n = max;
    memcpy(buf, st->out.p + st->off, n);
    st->off += n;
    return (ssize_t)n;
}

static void stream_free(void *cls) {
    stream *st = cls;
    ks_sched_req_release(st->srv->sched, st->req); /* cancels it if unfinished */
    atomic_fetch_sub(&st->srv->active, 1);
    free(st->out.p);
    free(st);
}

/* ------------------------------------------------------- completions -- */

static bool has_key(const char *args, const char *key) {
    size_t n = strlen(key);
    for (const char *p = args; p && *p;) {
        if (!strncmp(p, key, n) && p[n] == '=') return true;
        const char *e = strchr(p, ',');
        if (!e) break;
        p = e + 1;
    }
    return false;
}

/* The request's kvsieve object over the server's defaults.  A request that
 * names another policy than the default does not inherit the default's
 * arguments (they may not apply to it). */
static bool merge_policy(ks_server *srv, const ks_api_request *rq, ks_sched_policy *pol, ks_api_error *e) {
    *pol = srv->p.defaults;
    if ((rq->ext_set & KS_API_EXT_POLICY) && strcmp(rq->policy, pol->policy)) {
        snprintf(pol->policy, sizeof pol->policy, "%s", rq->policy);
        pol->args[0] = 0;
    }
    if (rq->ext_set & KS_API_EXT_BUDGET) pol->budget = rq->budget;
    if (rq->ext_set & KS_API_EXT_SINK) pol->sink = rq->sink;
    if (rq->ext_set & KS_API_EXT_WINDOW) pol->window = rq->window;
    if (rq->ext_set & KS_API_EXT_PAGE) pol->page = rq->page;
    if (rq->ext_set & KS_API_EXT_DENSE_LAYERS) pol->dense_layers = rq->dense_layers;
    if (rq->ext_set & KS_API_EXT_ARGS) {
        if (!ks_api_check_policy_args(pol->policy, rq->policy_args, e)) return false;
        snprintf(pol->args, sizeof pol->args, "%s", rq->policy_args);
    }
    /* spec without dlm=: the draft model shipped beside the model, as the CLI does */
    if (strstr(pol->policy, "spec") && !has_key(pol->args, "dlm") && srv->model_path) {
        char dir[1024], cfg[1100];
        size_t n = strlen(srv->model_path);
        if (n > 5 && !strcmp(srv->model_path + n - 5, ".gguf")) n -= 5;
        snprintf(dir, sizeof dir, "%.*s-dlm", (int)n, srv->model_path);
        snprintf(cfg, sizeof cfg, "%s/config.json", dir);
        struct stat sb;
        size_t used = strlen(pol->args);
        if (stat(cfg, &sb) == 0 && used + strlen(dir) + 6 < sizeof pol->args)
            snprintf(pol->args + used, sizeof pol->args - used, "%sdlm=%s", used ? "," : "", dir);
    }
    return true;
}

/* Prompt token ids of the request (malloc'd into *ids). */
static bool prepare_prompt(ks_server *srv, const ks_api_request *rq, int32_t **ids, int32_t *n_ids, ks_api_error *e) {
    const char *param = rq->kind == KS_API_CHAT ? "messages" : "prompt";
    if (rq->prompt_ids) {
        for (int32_t i = 0; i < rq->n_prompt_ids; i++)
            if (rq->prompt_ids[i] >= srv->n_vocab) {
                ks_api_error_set(e, 400, "invalid_request_error", "invalid_value", "prompt",
                                 "token id %d out of range [0, %d)", rq->prompt_ids[i], srv->n_vocab);
                return false;
            }
        *ids = xmalloc(sizeof(int32_t) * (size_t)rq->n_prompt_ids);
        memcpy(*ids, rq->prompt_ids, sizeof(int32_t) * (size_t)rq->n_prompt_ids);
        *n_ids = rq->n_prompt_ids;
        return true;
    }
    char *text = NULL;
    bool special = false;
    if (rq->kind == KS_API_CHAT) {
        size_t need = 0;
        ks_status st = ks_chat_format(srv->model, rq->system, rq->user, NULL, 0, &need);
        if (st == KS_ERR_UNSUPPORTED) {
            /* no known chat template in the GGUF: the system text, a blank line, the user text */
            size_t a = rq->system ? strlen(rq->system) : 0, b = strlen(rq->user);
            text = xmalloc(a + b + 3);
            if (a) {
                memcpy(text, rq->system, a);
                memcpy(text + a, "\n\n", 2);
                a += 2;
            }
            memcpy(text + a, rq->user, b + 1);
        } else {
            text = xmalloc(need + 1);
            st = ks_chat_format(srv->model, rq->system, rq->user, text, need + 1, &need);
            if (st != KS_OK) {
                free(text);
                ks_api_error_set(e, 500, "server_error", "internal_error", NULL, "chat template: %s",
                                 ks_last_error());
                return false;
            }
            special = true;
        }
    } else {
        text = xstrdup(rq->prompt);
    }
    size_t len = strlen(text), n = 0;
    ks_status st = ks_tokenize(srv->model, text, len, true, special, NULL, 0, &n);
    if (st != KS_OK && n == 0) {
        free(text);
        ks_api_error_set(e, 400, "invalid_request_error", "invalid_value", param, "tokenizing the prompt: %s",
                         ks_last_error());
        return false;
    }
    if (n > (size_t)1 << 28) {
        free(text);
        ks_api_error_set(e, 400, "invalid_request_error", "context_length_exceeded", param,
                         "the prompt is far longer than the context of %d tokens", srv->n_ctx);
        return false;
    }
    *ids = xmalloc(sizeof(int32_t) * (n ? n : 1));
    st = ks_tokenize(srv->model, text, len, true, special, *ids, n, &n);
    free(text);
    if (st != KS_OK) {
        free(*ids);
        *ids = NULL;
        ks_api_error_set(e, 400, "invalid_request_error", "invalid_value", param, "tokenizing the prompt: %s",
                         ks_last_error());
        return false;
    }
    *n_ids = (int32_t)n;
    return true;
}

static enum MHD_Result handle_completion(ks_server *srv, struct MHD_Connection *conn, ks_api_kind kind,
                                         const char *body, size_t len) {
    ks_api_error e;
    if (atomic_load(&srv->shutting_down)) {
        ks_api_error_set(&e, 503, "server_error", "server_shutting_down", NULL, "the server is shutting down");
        return respond_error(srv, conn, &e);
    }
    ks_api_request rq;
    if (!ks_api_parse(body, len, kind, &rq, &e)) return respond_error(srv, conn, &e);
    int32_t *ids = NULL, n_ids = 0;
    ks_sched_policy pol;
    if (!merge_policy(srv, &rq, &pol, &e) || !prepare_prompt(srv, &rq, &ids, &n_ids, &e)) {
        ks_api_request_free(&rq);
        return respond_error(srv, conn, &e);
    }
    const char *param = kind == KS_API_CHAT ? "messages" : "prompt";
    if (n_ids == 0) {
        ks_api_error_set(&e, 400, "invalid_request_error", "invalid_value", param, "the prompt has no tokens");
        goto fail;
    }
    if (n_ids >= srv->n_ctx) {
        ks_api_error_set(&e, 400, "invalid_request_error", "context_length_exceeded", param,
                         "This model's maximum context length is %d tokens. However, your prompt has %d tokens. "
                         "Please shorten the prompt (it is never truncated).", srv->n_ctx, n_ids);
        goto fail;
    }
    ks_sampler_params sp = ks_sampler_default_params();
    if (rq.set & KS_API_SET_TEMPERATURE) sp.temperature = rq.temperature;
    if (rq.set & KS_API_SET_TOP_P) sp.top_p = rq.top_p;
    if (rq.set & KS_API_SET_TOP_K) sp.top_k = rq.top_k;
    if (rq.set & KS_API_SET_MIN_P) sp.min_p = rq.min_p;
    if (rq.set & KS_API_SET_REPEAT_PENALTY) sp.repeat_penalty = rq.repeat_penalty;
    sp.seed = rq.set & KS_API_SET_SEED ? rq.seed : random_u64();
    ks_sched_req_params p = {
        .prompt = ids,
        .n_prompt = n_ids,
        .max_tokens = rq.max_tokens > 0 ? rq.max_tokens : srv->n_ctx - n_ids,
        .sampling = sp,
        .stops = (const char *const *)rq.stops,
        .n_stops = rq.n_stops,
        .ignore_eos = rq.ignore_eos,
        .policy = pol,
    };
    ks_sched_error why;
    char msg[512];
    ks_sched_req *req = ks_sched_submit(srv->sched, &p, &why, msg, sizeof msg);
    free(ids);
    ids = NULL;
    if (!req) {
        set_error_from_sched(&e, why, msg, kind);
        goto fail;
    }
    atomic_fetch_add(&srv->active, 1);
    char id[64];
    snprintf(id, sizeof id, "%s-%016llx%08llx", kind == KS_API_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)random_u64(), (unsigned long long)atomic_fetch_add(&srv->n_ids, 1));
    long created = (long)time(NULL);
    bool stream_it = rq.stream, include_usage = rq.include_usage;
    ks_api_request_free(&rq);

    sbuf text = {0};
    ks_sched_update u;
    double last_check = ks_sched_now();
    for (;;) {
        bool news = ks_sched_req_take(srv->sched, req, 0.1, &u);
        if (u.text) {
            if (!stream_it) sbuf_put(&text, u.text, u.len);
            else if (u.len) break; /* keep u for the stream */
            free(u.text);
            u.text = NULL;
        }
        if (u.state == KS_SCHED_FINISHED || (stream_it && u.state != KS_SCHED_WAITING)) break;
        double now = ks_sched_now();
        if (!news || now - last_check > 0.25) {
            last_check = now;
            if (client_gone(conn)) {
                ks_sched_req_release(srv->sched, req);
                atomic_fetch_sub(&srv->active, 1);
                free(text.p);
                return MHD_NO;
            }
        }
    }
    if (u.state == KS_SCHED_FINISHED && u.finish != KS_SCHED_FINISH_STOP && u.finish != KS_SCHED_FINISH_LENGTH &&
        !(stream_it && u.text)) {
        set_error_from_sched(&e, u.finish == KS_SCHED_FINISH_CANCELLED ? KS_SCHED_ERR_INTERNAL : u.error,
                             u.finish == KS_SCHED_FINISH_CANCELLED ? "the request was cancelled" : u.message, kind);
        ks_sched_req_release(srv->sched, req);
        atomic_fetch_sub(&srv->active, 1);
        free(text.p);
        return respond_error(srv, conn, &e);
    }
    if (!stream_it) {
        bool chat = kind == KS_API_CHAT;
        cJSON *o = envelope(srv, id, chat ? "chat.completion" : "text_completion", created);
        cJSON *choices = cJSON_AddArrayToObject(o, "choices"), *c = cJSON_CreateObject();
        cJSON_AddNumberToObject(c, "index", 0);
        if (chat) {
            cJSON *m = cJSON_AddObjectToObject(c, "message");
            cJSON_AddStringToObject(m, "role", "assistant");
            add_clean_string(m, "content", text.p, text.n);
        } else {
            add_clean_string(c, "text", text.p, text.n);
        }
        cJSON_AddNullToObject(c, "logprobs");
        cJSON_AddStringToObject(c, "finish_reason", finish_name(u.finish));
        cJSON_AddItemToArray(choices, c);
        cJSON_AddItemToObject(o, "usage", usage_json(u.n_prompt, u.n_generated));
        free(text.p);
        ks_sched_req_release(srv->sched, req);
        atomic_fetch_sub(&srv->active, 1);
        return respond_json(srv, conn, 200, o);
    }
    stream *st = xcalloc(1, sizeof *st);
    st->srv = srv;
    st->req = req;
    st->conn = conn;
    st->kind = kind;
    st->include_usage = include_usage;
    st->created = created;
    st->last_check = ks_sched_now();
    snprintf(st->id, sizeof st->id, "%s", id);
    if (kind == KS_API_CHAT) sse_put(st, chunk(st, "", 0, NULL)); /* the role first, as OpenAI does */
    stream_absorb(st, &u);
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, st, stream_free);
    if (!r) {
        stream_free(st);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result ret = MHD_queue_response(conn, 200, r);
    MHD_destroy_response(r);
    count_status(srv, 200);
    return ret;
fail:
    free(ids);
    ks_api_request_free(&rq);
    return respond_error(srv, conn, &e);
}

/* ------------------------------------------------------- other routes -- */

static cJSON *model_object(ks_server *srv) {
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
    cJSON_AddStringToObject(x, "policy", srv->p.defaults.policy);
    cJSON_AddNumberToObject(x, "budget", srv->p.defaults.budget);
    return m;
}

static enum MHD_Result handle_metrics(ks_server *srv, struct MHD_Connection *conn) {
    ks_sched_metrics m;
    ks_sched_get_metrics(srv->sched, &m);
    sbuf b = {0};
#define METRIC(name, type, help, fmt, val) \
    sbuf_printf(&b, "# HELP kvsieve_" name " " help "\n# TYPE kvsieve_" name " " type "\nkvsieve_" name " " fmt "\n", val)
    METRIC("requests_running", "gauge", "Requests holding a sequence slot (prefilling or decoding).", "%d", m.running);
    METRIC("requests_waiting", "gauge", "Requests queued for a slot.", "%d", m.waiting);
    METRIC("requests_waiting_limit", "gauge", "Waiting-queue bound; beyond it requests get 429.", "%d", m.max_waiting);
    sbuf_printf(&b, "# HELP kvsieve_requests_total Completion requests by outcome.\n# TYPE kvsieve_requests_total counter\n");
    sbuf_printf(&b, "kvsieve_requests_total{outcome=\"completed\"} %llu\n", (unsigned long long)m.requests_completed);
    sbuf_printf(&b, "kvsieve_requests_total{outcome=\"cancelled\"} %llu\n", (unsigned long long)m.requests_cancelled);
    sbuf_printf(&b, "kvsieve_requests_total{outcome=\"failed\"} %llu\n", (unsigned long long)m.requests_failed);
    sbuf_printf(&b, "kvsieve_requests_total{outcome=\"rejected_queue_full\"} %llu\n",
                (unsigned long long)m.requests_rejected);
    sbuf_printf(&b, "# HELP kvsieve_http_responses_total HTTP answers by status.\n# TYPE kvsieve_http_responses_total counter\n");
    for (int i = 0; i <= N_CODES; i++) {
        unsigned long long v = atomic_load(&srv->responses[i]);
        if (i < N_CODES) sbuf_printf(&b, "kvsieve_http_responses_total{code=\"%d\"} %llu\n", g_codes[i], v);
        else sbuf_printf(&b, "kvsieve_http_responses_total{code=\"other\"} %llu\n", v);
    }
    METRIC("prompt_tokens_total", "counter", "Prompt tokens of accepted requests.", "%llu",
           (unsigned long long)m.tokens_prompt);
    METRIC("tokens_generated_total", "counter", "Tokens generated.", "%llu", (unsigned long long)m.tokens_generated);
    METRIC("tokens_per_second", "gauge", "Generated tokens per second over the last 10 s.", "%.3f", m.tokens_per_second);
    METRIC("decode_steps_total", "counter", "Batched decode steps (one ks_decode each).", "%llu",
           (unsigned long long)m.decode_steps);
    METRIC("prefill_chunks_total", "counter", "Prefill calls (chunks of n_batch tokens, or whole prompts).", "%llu",
           (unsigned long long)m.prefill_chunks);
    METRIC("contexts", "gauge", "Engine contexts alive (one per policy configuration in use).", "%d", m.groups);
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
    long pages = 0, rss = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &rss) != 2) rss = 0;
        fclose(f);
    }
    METRIC("process_resident_bytes", "gauge", "Resident memory of the server process.", "%lld",
           (long long)rss * sysconf(_SC_PAGESIZE));
#undef METRIC
    return respond(srv, conn, 200, "text/plain; version=0.0.4; charset=utf-8", b.p, 0, NULL);
}

/* ------------------------------------------------------------ routing -- */

typedef struct conn_state {
    sbuf body;
    bool too_big;
} conn_state;

static bool key_ok(ks_server *srv, struct MHD_Connection *conn) {
    if (!srv->api_key) return true;
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7)) return false;
    h += 7;
    while (*h == ' ') h++;
    size_t a = strlen(h), b = strlen(srv->api_key);
    unsigned char diff = (unsigned char)(a != b);
    for (size_t i = 0; i < b; i++) diff |= (unsigned char)(h[i < a ? i : 0] ^ srv->api_key[i]); /* constant time */
    return diff == 0;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    ks_server *srv = cls;
    conn_state *cs = *con_cls;
    if (!cs) {
        cs = xcalloc(1, sizeof *cs);
        *con_cls = cs;
        return MHD_YES;
    }
    if (*upload_size) {
        if (cs->body.n + *upload_size > srv->p.max_body) cs->too_big = true;
        else sbuf_put(&cs->body, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    ks_api_error e;
    if (!key_ok(srv, conn)) {
        ks_api_error_set(&e, 401, "invalid_request_error", "invalid_api_key", NULL,
                         "Incorrect or missing API key: send 'Authorization: Bearer KEY'");
        return respond_error(srv, conn, &e);
    }
    bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    const char *path = url;
    if (!strcmp(path, "/v1/completions") || !strcmp(path, "/v1/chat/completions")) {
        if (!post) {
            ks_api_error_set(&e, 405, "invalid_request_error", "method_not_allowed", NULL, "use POST for %s", path);
            return respond(srv, conn, 405, "application/json", ks_api_error_json(&e), 0, "POST");
        }
        if (cs->too_big) {
            ks_api_error_set(&e, 413, "invalid_request_error", "request_too_large", NULL,
                             "the request body exceeds %zu bytes", srv->p.max_body);
            return respond_error(srv, conn, &e);
        }
        return handle_completion(srv, conn, strstr(path, "/chat/") ? KS_API_CHAT : KS_API_COMPLETIONS,
                                 cs->body.p ? cs->body.p : "", cs->body.n);
    }
    bool models = !strcmp(path, "/v1/models"), model_one = !strncmp(path, "/v1/models/", 11);
    bool health = !strcmp(path, "/health"), metrics = !strcmp(path, "/metrics");
    if (models || model_one || health || metrics) {
        if (!get) {
            ks_api_error_set(&e, 405, "invalid_request_error", "method_not_allowed", NULL, "use GET for %s", path);
            return respond(srv, conn, 405, "application/json", ks_api_error_json(&e), 0, "GET");
        }
        if (health) {
            bool down = atomic_load(&srv->shutting_down);
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "status", down ? "shutting down" : "ok");
            return respond_json(srv, conn, down ? 503 : 200, o);
        }
        if (metrics) return handle_metrics(srv, conn);
        if (models) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "object", "list");
            cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "data"), model_object(srv));
            return respond_json(srv, conn, 200, o);
        }
        if (!strcmp(path + 11, srv->model_id)) return respond_json(srv, conn, 200, model_object(srv));
        ks_api_error_set(&e, 404, "invalid_request_error", "model_not_found", "model", "The model '%.200s' does not exist",
                         path + 11);
        return respond_error(srv, conn, &e);
    }
    ks_api_error_set(&e, 404, "invalid_request_error", "unknown_url", NULL, "Unknown request URL: %s %.200s", method,
                     path);
    return respond_error(srv, conn, &e);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls;
    (void)conn;
    (void)toe;
    conn_state *cs = *con_cls;
    if (!cs) return;
    free(cs->body.p);
    free(cs);
    *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    fprintf(stderr, "kvsieve serve: http: ");
    vfprintf(stderr, fmt, ap);
}

/* --------------------------------------------------------- lifecycle -- */

ks_status ks_server_start(const ks_model *model, ks_sched *sched, const ks_server_params *params, ks_server **out,
                          char *err, size_t err_cap) {
    ks_server_params p = *params;
    const char *host = p.host && *p.host ? p.host : "127.0.0.1";
    if (!strcmp(host, "localhost")) host = "127.0.0.1";
    struct sockaddr_in sa4;
    struct sockaddr_in6 sa6;
    memset(&sa4, 0, sizeof sa4);
    memset(&sa6, 0, sizeof sa6);
    const struct sockaddr *sa = NULL;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC;
    if (p.port < 0 || p.port > 65535) {
        snprintf(err, err_cap, "port %d out of range", p.port);
        return KS_ERR_INVALID_ARG;
    }
    if (inet_pton(AF_INET, host, &sa4.sin_addr) == 1) {
        sa4.sin_family = AF_INET;
        sa4.sin_port = htons((uint16_t)p.port);
        sa = (const struct sockaddr *)&sa4;
    } else if (inet_pton(AF_INET6, host, &sa6.sin6_addr) == 1) {
        sa6.sin6_family = AF_INET6;
        sa6.sin6_port = htons((uint16_t)p.port);
        sa = (const struct sockaddr *)&sa6;
        flags |= MHD_USE_IPv6;
    } else {
        snprintf(err, err_cap, "host '%s' is not a numeric IPv4/IPv6 address (or localhost)", host);
        return KS_ERR_INVALID_ARG;
    }
    ks_server *srv = xcalloc(1, sizeof *srv);
    srv->model = model;
    srv->sched = sched;
    srv->p = p;
    srv->host = xstrdup(host);
    srv->api_key = p.api_key && *p.api_key ? xstrdup(p.api_key) : NULL;
    srv->model_id = xstrdup(p.model_id && *p.model_id ? p.model_id : "kvsieve");
    srv->model_path = xstrdup(p.model_path);
    srv->p.host = srv->host;
    srv->p.api_key = srv->api_key;
    srv->p.model_id = srv->model_id;
    srv->p.model_path = srv->model_path;
    if (srv->p.max_connections <= 0) srv->p.max_connections = 64;
    if (srv->p.max_body == 0) srv->p.max_body = 8u << 20;
    srv->created = time(NULL);
    srv->n_vocab = ks_model_n_vocab(model);
    ks_sched_metrics m;
    ks_sched_get_metrics(sched, &m);
    srv->n_ctx = m.n_ctx;
    srv->daemon = MHD_start_daemon(flags, (uint16_t)p.port, NULL, NULL, &on_request, srv, MHD_OPTION_SOCK_ADDR, sa,
                                   MHD_OPTION_CONNECTION_LIMIT, (unsigned)srv->p.max_connections,
                                   MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)300, MHD_OPTION_NOTIFY_COMPLETED,
                                   &on_completed, srv, MHD_OPTION_EXTERNAL_LOGGER, &mhd_log, srv, MHD_OPTION_END);
    if (!srv->daemon) {
        snprintf(err, err_cap, "cannot listen on %s port %d (in use, or not an address of this machine?)", host, p.port);
        ks_server_stop(srv);
        return KS_ERR_IO;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(srv->daemon, MHD_DAEMON_INFO_BIND_PORT);
    srv->port = di ? di->port : p.port;
    *out = srv;
    return KS_OK;
}

int ks_server_port(const ks_server *srv) { return srv->port; }

int ks_server_active(ks_server *srv) { return atomic_load(&srv->active); }

void ks_server_begin_shutdown(ks_server *srv) {
    atomic_store(&srv->shutting_down, true);
}

void ks_server_stop(ks_server *srv) {
    if (!srv) return;
    if (srv->daemon) {
        /* stop accepting, give answers in flight a moment to reach their
         * clients, then close whatever is left (idle keep-alive ones) */
        MHD_socket ls = MHD_quiesce_daemon(srv->daemon);
        if (ls != MHD_INVALID_SOCKET) close(ls);
        for (int i = 0; i < 40; i++) {
            const union MHD_DaemonInfo *di = MHD_get_daemon_info(srv->daemon, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
            if (!di || di->num_connections == 0) break;
            usleep(25000);
        }
        MHD_stop_daemon(srv->daemon);
    }
    free(srv->host);
    free(srv->api_key);
    free(srv->model_id);
    free(srv->model_path);
    free(srv);
}
