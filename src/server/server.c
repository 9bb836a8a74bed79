/*
 * server.c — routing, the API key, answers, lifecycle (server.h); the
 * completion routes are in completion.c, /metrics in metrics.c.
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
 *
 * The chat page (GET /, /chat.js, /chat.css: web.h) is answered before the
 * API key is checked: it is the same static bytes for everyone and holds no
 * data, and a browser cannot send a Bearer header when it loads a page.
 * The page sends the key the user gives it with every API call.
 */
#define _GNU_SOURCE
#include "server/internal.h"
#include "server/web.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

const int ks_server_codes[KS_SERVER_N_CODES] = {200, 400, 401, 404, 405, 413, 429, 500, 503};

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

void ks_server_count_status(ks_server *srv, int status) {
    int k = KS_SERVER_N_CODES;
    for (int i = 0; i < KS_SERVER_N_CODES; i++)
        if (ks_server_codes[i] == status) k = i;
    atomic_fetch_add(&srv->responses[k], 1);
}

/* Queue body (malloc'd, taken) with status. */
enum MHD_Result ks_server_respond(ks_server *srv, struct MHD_Connection *c, int status, const char *ctype, char *body,
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
    ks_server_count_status(srv, status);
    return ret;
}

enum MHD_Result ks_server_respond_json(ks_server *srv, struct MHD_Connection *c, int status, cJSON *root) {
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return ks_server_respond(srv, c, status, "application/json", s, 0, NULL);
}

enum MHD_Result ks_server_respond_error(ks_server *srv, struct MHD_Connection *c, const ks_api_error *e) {
    int retry = e->status == 429 || e->status == 503 ? (srv->p.retry_after > 0 ? srv->p.retry_after : 1) : 0;
    return ks_server_respond(srv, c, e->status, "application/json", ks_api_error_json(e), retry, NULL);
}

/* The client closed its side (or the socket failed). */
bool ks_server_client_gone(struct MHD_Connection *c) {
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

/* ------------------------------------------------------------ routing -- */

typedef struct conn_state {
    ks_sbuf body;
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

/* A file of the chat page (web.h), from the binary's own bytes.  The page
 * holds no data, so it is served without the API key: the page asks for
 * the key and sends it with its API calls.  The policy headers keep the
 * page to this server (no other origin's scripts, styles or connections,
 * no framing). */
static enum MHD_Result serve_web(ks_server *srv, struct MHD_Connection *c, const ks_web_asset *a) {
    struct MHD_Response *r = MHD_create_response_from_buffer(a->size, (void *)a->data, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, a->content_type);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
    MHD_add_response_header(r, "Content-Security-Policy",
                            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                            "img-src 'self' data:; form-action 'none'; frame-ancestors 'none'; base-uri 'none'");
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    ks_server_count_status(srv, 200);
    return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    ks_server *srv = cls;
    conn_state *cs = *con_cls;
    ks_api_error e;
    if (!cs) {
        cs = ks_calloc(1, sizeof *cs);
        *con_cls = cs;
        if (cs) return MHD_YES;
        ks_api_error_set(&e, 503, "server_error", "out_of_memory", NULL, "the server ran out of memory; retry later");
        return ks_server_respond_error(srv, conn, &e);
    }
    if (*upload_size) {
        if (cs->body.n + *upload_size > srv->p.max_body) cs->too_big = true;
        else ks_sbuf_put(&cs->body, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    const ks_web_asset *page = ks_web_find(url);
    if (page && (!strcmp(method, "GET") || !strcmp(method, "HEAD"))) return serve_web(srv, conn, page);
    if (!key_ok(srv, conn)) {
        ks_api_error_set(&e, 401, "invalid_request_error", "invalid_api_key", NULL,
                         "Incorrect or missing API key: send 'Authorization: Bearer KEY'");
        return ks_server_respond_error(srv, conn, &e);
    }
    bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    const char *path = url;
    bool completion = !strcmp(path, "/v1/completions") || !strcmp(path, "/v1/chat/completions");
    if (completion || ks_server_is_tokens_route(path)) {
        if (!post) {
            ks_api_error_set(&e, 405, "invalid_request_error", "method_not_allowed", NULL, "use POST for %s", path);
            return ks_server_respond(srv, conn, 405, "application/json", ks_api_error_json(&e), 0, "POST");
        }
        if (cs->body.refused) {
            ks_api_error_set(&e, 503, "server_error", "out_of_memory", NULL,
                             "the server ran out of memory reading the request body; retry later");
            return ks_server_respond_error(srv, conn, &e);
        }
        if (cs->too_big) {
            ks_api_error_set(&e, 413, "invalid_request_error", "request_too_large", NULL,
                             "the request body exceeds %zu bytes", srv->p.max_body);
            return ks_server_respond_error(srv, conn, &e);
        }
        if (!completion) return ks_server_handle_tokens(srv, conn, path, cs->body.p ? cs->body.p : "", cs->body.n);
        return ks_server_handle_completion(srv, conn, strstr(path, "/chat/") ? KS_API_CHAT : KS_API_COMPLETIONS,
                                 cs->body.p ? cs->body.p : "", cs->body.n);
    }
    bool models = !strcmp(path, "/v1/models"), model_one = !strncmp(path, "/v1/models/", 11);
    bool health = !strcmp(path, "/health"), metrics = !strcmp(path, "/metrics");
    if (models || model_one || health || metrics) {
        if (!get) {
            ks_api_error_set(&e, 405, "invalid_request_error", "method_not_allowed", NULL, "use GET for %s", path);
            return ks_server_respond(srv, conn, 405, "application/json", ks_api_error_json(&e), 0, "GET");
        }
        if (health) {
            bool down = atomic_load(&srv->shutting_down);
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "status", down ? "shutting down" : "ok");
            return ks_server_respond_json(srv, conn, down ? 503 : 200, o);
        }
        if (metrics) return ks_server_handle_metrics(srv, conn);
        if (models) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "object", "list");
            cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "data"), ks_server_model_object(srv));
            return ks_server_respond_json(srv, conn, 200, o);
        }
        if (!strcmp(path + 11, srv->model_id)) return ks_server_respond_json(srv, conn, 200, ks_server_model_object(srv));
        ks_api_error_set(&e, 404, "invalid_request_error", "model_not_found", "model", "The model '%.200s' does not exist",
                         path + 11);
        return ks_server_respond_error(srv, conn, &e);
    }
    ks_api_error_set(&e, 404, "invalid_request_error", "unknown_url", NULL, "Unknown request URL: %s %.200s", method,
                     path);
    return ks_server_respond_error(srv, conn, &e);
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
    ks_server *srv = ks_calloc(1, sizeof *srv);
    if (!srv) {
        snprintf(err, err_cap, "out of memory for the server");
        return KS_ERR_NOMEM;
    }
    srv->model = model;
    srv->sched = sched;
    srv->p = p;
    srv->host = ks_strdup(host);
    srv->api_key = p.api_key && *p.api_key ? ks_strdup(p.api_key) : NULL;
    srv->model_id = ks_strdup(p.model_id && *p.model_id ? p.model_id : "kvsieve");
    srv->model_path = p.model_path ? ks_strdup(p.model_path) : NULL;
    if (!srv->host || (p.api_key && *p.api_key && !srv->api_key) || !srv->model_id || (p.model_path && !srv->model_path)) {
        free(srv->host);
        free(srv->api_key);
        free(srv->model_id);
        free(srv->model_path);
        free(srv);
        snprintf(err, err_cap, "out of memory for the server's settings");
        return KS_ERR_NOMEM;
    }
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
