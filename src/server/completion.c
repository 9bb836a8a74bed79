/*
 * completion.c — POST /v1/completions and /v1/chat/completions: parse
 * (api.c), merge the request's `kvsieve` object over the server's policy
 * defaults, tokenize (the chat template from the GGUF), submit to the
 * scheduler and wait, answering with one JSON object or Server-Sent Events.
 * While waiting, the client's socket is watched: a peer that hung up cancels
 * its request.  If it vanishes while text is flowing, the failed write ends
 * the response and its free callback cancels the request.  With logprobs,
 * the scheduler's per-token records travel beside the text and are written
 * by logprobs.c; a stream sends them with the chunk of their text.
 */
#define _GNU_SOURCE
#include "server/internal.h"
#include "core/platform.h"
#include "server/toolcall.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t random_u64(void) {
    uint64_t v = 0;
    if (!ks_platform_random(&v, sizeof v)) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        v = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)ts.tv_sec;
    }
    return v;
}

/* A refused allocation fails this one request with 503; the server goes on. */
static bool out_of_memory(ks_api_error *e, const char *what) {
    ks_api_error_set(e, 503, "server_error", "out_of_memory", NULL, "the server ran out of memory %s; retry later", what);
    return false;
}

static void set_error_from_sched(ks_api_error *e, ks_sched_error why, const char *msg, ks_api_kind kind) {
    switch (why) {
    case KS_SCHED_ERR_NOMEM:
        ks_api_error_set(e, 503, "server_error", "out_of_memory", NULL, "%s", msg && *msg ? msg : "out of memory");
        break;
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

/* OpenAI's usage, with prompt_tokens_details.cached_tokens: the prompt
 * tokens restored from the prefix cache. */
static cJSON *usage_json(int32_t n_prompt, int32_t n_gen, int32_t n_cached) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", n_gen);
    cJSON_AddNumberToObject(u, "total_tokens", (double)n_prompt + n_gen);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "prompt_tokens_details"), "cached_tokens", n_cached);
    return u;
}

/* false when the copy was refused (the field is then missing: the caller fails the request). */
static bool add_clean_string(cJSON *o, const char *key, const char *s, size_t len) {
    char *c = ks_api_utf8_clean(s ? s : "", s ? len : 0);
    if (!c) return false;
    cJSON_AddStringToObject(o, key, c);
    free(c);
    return true;
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

/* ---------------------------------------------------------------- tools -- */

/* What a chat request's tools ask of the prompt and the answer: active when
 * it has tools and tool_choice is not "none"; forced (required or named)
 * adds the syntax's opener to the prompt and constrains the answer to the
 * call's schema (toolcall.h). */
typedef struct tool_plan {
    bool active, forced;
    ks_tool_syntax syn;          /* the syntax the answer is parsed in */
    char *opener, *schema, *closer;
    char *names[KS_API_MAX_TOOLS]; /* [n_names] the request's functions (taken from it: it is freed first) */
    int32_t n_names;
} tool_plan;

static void tool_plan_free(tool_plan *tp) {
    for (int32_t i = 0; i < tp->n_names; i++) free(tp->names[i]);
    free(tp->opener);
    free(tp->schema);
    free(tp->closer);
    memset(tp, 0, sizeof *tp);
}

static bool tool_plan_make(ks_server *srv, const ks_api_request *rq, tool_plan *tp, ks_api_error *e) {
    memset(tp, 0, sizeof *tp);
    tp->syn = ks_chat_tool_syntax(srv->model);
    tp->active = rq->kind == KS_API_CHAT && rq->n_tools > 0 && rq->tool_choice != KS_API_TOOLS_NONE;
    tp->forced = tp->active && (rq->tool_choice == KS_API_TOOLS_REQUIRED || rq->tool_choice == KS_API_TOOLS_NAMED);
    if (!tp->forced) return true;
    if (!ks_tool_forced(tp->syn, rq->tools, rq->tool_choice == KS_API_TOOLS_NAMED ? rq->tool_name : NULL, &tp->opener,
                        &tp->schema, &tp->closer, &tp->syn))
        return out_of_memory(e, "preparing the tool call");
    return true;
}

/* The calls in an answer (opener + text + closer for a forced one);
 * false on a refused allocation. */
static bool tool_plan_parse(const tool_plan *tp, const char *text, size_t len, ks_tool_parsed *out) {
    const char *const *names = (const char *const *)tp->names;
    if (!tp->forced) return ks_tool_parse(tp->syn, text, len, names, tp->n_names, out);
    ks_sbuf b = {0};
    ks_sbuf_puts(&b, tp->opener);
    ks_sbuf_put(&b, text, len);
    ks_sbuf_puts(&b, tp->closer);
    bool ok = !b.refused && ks_tool_parse(tp->syn, b.p, b.n, names, tp->n_names, out);
    free(b.p);
    return ok;
}

/* A fresh call id.  Mistral's templates accept only 9 letters and digits
 * (they raise_exception on anything else when the call comes back in the
 * next request), so its models get those; others OpenAI's call_ form. */
static void call_id(ks_tool_syntax syn, char *id, size_t cap) {
    if (syn == KS_TOOLS_MISTRAL) {
        static const char abc[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        uint64_t r = random_u64();
        for (int i = 0; i < 9; i++, r /= 62) id[i] = abc[r % 62];
        id[9] = 0;
        return;
    }
    snprintf(id, cap, "call_%016llx%08llx", (unsigned long long)random_u64(),
             (unsigned long long)(random_u64() & 0xffffffffull));
}

/* OpenAI's tool_calls array; with_index: a stream's delta form. */
static cJSON *tool_calls_json(const ks_tool_parsed *tc, ks_tool_syntax syn, bool with_index) {
    cJSON *a = cJSON_CreateArray();
    for (int32_t i = 0; a && i < tc->n_calls; i++) {
        cJSON *c = cJSON_CreateObject();
        if (!c || !cJSON_AddItemToArray(a, c)) {
            cJSON_Delete(c);
            cJSON_Delete(a);
            return NULL;
        }
        char id[48];
        call_id(syn, id, sizeof id);
        if (with_index) cJSON_AddNumberToObject(c, "index", i);
        cJSON_AddStringToObject(c, "id", id);
        cJSON_AddStringToObject(c, "type", "function");
        cJSON *f = cJSON_AddObjectToObject(c, "function");
        if (!f || !cJSON_AddStringToObject(f, "name", tc->calls[i].name) ||
            !cJSON_AddStringToObject(f, "arguments", tc->calls[i].arguments)) {
            cJSON_Delete(a);
            return NULL;
        }
    }
    return a;
}

/* ------------------------------------------------------------- stream -- */

typedef struct stream {
    ks_server *srv;
    ks_sched_req *req;
    struct MHD_Connection *conn;
    ks_api_kind kind;
    bool include_usage, role_sent, done;
    bool logprobs;        /* the request asked for them: every chunk with text carries its tokens' */
    size_t text_offset;   /* completions' logprobs.text_offset: bytes streamed so far */
    ks_sbuf lp_pending;   /* ks_sched_logprob records not yet sent (their text held back) */
    char id[64];
    long created;
    ks_sbuf out;          /* SSE bytes not yet handed to libmicrohttpd */
    size_t off;
    double last_check;
    tool_plan tools;      /* tools.active: the answer is held in acc until no call can begin in it */
    ks_sbuf acc;          /* the answer so far (with tools) */
    size_t sent;          /* bytes of acc sent as content */
} stream;

static void sse_put(stream *st, cJSON *root) {
    char *s = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!s) { /* a chunk that could not be made: the stream cannot go on whole */
        st->out.refused = true;
        return;
    }
    ks_sbuf_puts(&st->out, "data: ");
    ks_sbuf_puts(&st->out, s);
    ks_sbuf_puts(&st->out, "\n\n");
    free(s);
}

/* A chunk, with the logprobs of lp[n] when the request asked for them;
 * NULL when it could not be made (the stream then ends with an error event). */
static cJSON *chunk(stream *st, const char *text, size_t len, const char *finish, const ks_sched_logprob *lp,
                    int32_t n) {
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
        if (text && !add_clean_string(d, "content", text, len)) {
            cJSON_Delete(o);
            cJSON_Delete(c);
            return NULL;
        }
    } else if (!add_clean_string(c, "text", text, len)) {
        cJSON_Delete(o);
        cJSON_Delete(c);
        return NULL;
    }
    cJSON *lpo = NULL;
    if (st->logprobs && n > 0) {
        lpo = chat ? ks_server_logprobs_chat(st->srv, lp, n) : ks_server_logprobs_text(st->srv, lp, n, &st->text_offset);
        if (!lpo) {
            cJSON_Delete(o);
            cJSON_Delete(c);
            return NULL;
        }
        cJSON_AddItemToObject(c, "logprobs", lpo);
    } else cJSON_AddNullToObject(c, "logprobs");
    if (finish) cJSON_AddStringToObject(c, "finish_reason", finish);
    else cJSON_AddNullToObject(c, "finish_reason");
    cJSON_AddItemToArray(choices, c);
    if (st->include_usage) cJSON_AddNullToObject(o, "usage");
    return o;
}

/* Text as a content chunk, with the logprobs waiting for it. */
static void stream_text(stream *st, const char *text, size_t len) {
    sse_put(st, chunk(st, text, len, NULL, (const ks_sched_logprob *)st->lp_pending.p,
                      (int32_t)(st->lp_pending.n / sizeof(ks_sched_logprob))));
    st->lp_pending.n = 0;
}

/* The end of an answer with tools: its calls as one delta.tool_calls chunk
 * (finish_reason tool_calls), or, when it made none, the text held back.
 * Returns the finish reason. */
static const char *stream_tools_end(stream *st, const char *finish) {
    ks_tool_parsed tc;
    if (!tool_plan_parse(&st->tools, st->acc.p ? st->acc.p : "", st->acc.n, &tc)) {
        st->out.refused = true;
        return finish;
    }
    if (tc.n_calls == 0) {
        if (st->acc.n > st->sent) stream_text(st, st->acc.p + st->sent, st->acc.n - st->sent);
        ks_tool_parsed_free(&tc);
        return finish;
    }
    cJSON *o = chunk(st, NULL, 0, NULL, NULL, 0), *calls = tool_calls_json(&tc, st->tools.syn, true);
    cJSON *c = o ? cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "choices"), 0) : NULL;
    cJSON *d = c ? cJSON_GetObjectItemCaseSensitive(c, "delta") : NULL;
    if (!d || !calls || !cJSON_AddItemToObject(d, "tool_calls", calls)) {
        cJSON_Delete(calls);
        cJSON_Delete(o);
        o = NULL;
    }
    sse_put(st, o);
    ks_tool_parsed_free(&tc);
    return "tool_calls";
}

static void stream_absorb(stream *st, ks_sched_update *u) {
    /* tokens whose text is still held back (a possible stop string) wait
     * for the next chunk with text, or go with the final one */
    if (u->n_logprobs) ks_sbuf_put(&st->lp_pending, (const char *)u->logprobs, sizeof *u->logprobs * (size_t)u->n_logprobs);
    free(u->logprobs);
    u->logprobs = NULL;
    u->n_logprobs = 0;
    if (u->text && u->len && st->tools.active) {
        /* content streams up to where a call could begin; a forced call is all call */
        ks_sbuf_put(&st->acc, u->text, u->len);
        size_t safe = st->tools.forced || st->acc.refused ? 0 : ks_tool_stream_safe(st->tools.syn, st->acc.p, st->acc.n);
        if (safe > st->sent) {
            stream_text(st, st->acc.p + st->sent, safe - st->sent);
            st->sent = safe;
        }
        if (st->acc.refused) st->out.refused = true;
    } else if (u->text && u->len) {
        stream_text(st, u->text, u->len);
    }
    free(u->text);
    u->text = NULL;
    if (st->out.refused || st->lp_pending.refused) { /* text was lost: end the stream with the error rather than a short answer */
        free(st->out.p);
        st->out = (ks_sbuf){0};
        st->off = 0;
        ks_sched_req_cancel(st->srv->sched, st->req);
        u->state = KS_SCHED_FINISHED;
        u->finish = KS_SCHED_FINISH_ERROR;
        u->error = KS_SCHED_ERR_NOMEM;
        snprintf(u->message, sizeof u->message, "the server ran out of memory streaming the answer");
    }
    if (u->state != KS_SCHED_FINISHED) return;
    if (u->finish == KS_SCHED_FINISH_ERROR || u->finish == KS_SCHED_FINISH_CANCELLED) {
        ks_api_error e;
        set_error_from_sched(&e, u->error, u->message, st->kind);
        char *s = ks_api_error_json(&e);
        ks_sbuf_puts(&st->out, "data: ");
        ks_sbuf_puts(&st->out, s ? s : "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}");
        ks_sbuf_puts(&st->out, "\n\n");
        free(s);
    } else {
        const char *finish = finish_name(u->finish);
        if (st->tools.active) finish = stream_tools_end(st, finish);
        sse_put(st, chunk(st, NULL, 0, finish, (const ks_sched_logprob *)st->lp_pending.p,
                          (int32_t)(st->lp_pending.n / sizeof(ks_sched_logprob))));
        st->lp_pending.n = 0;
        if (st->include_usage) {
            bool chat = st->kind == KS_API_CHAT;
            cJSON *o = envelope(st->srv, st->id, chat ? "chat.completion.chunk" : "text_completion", st->created);
            cJSON_AddArrayToObject(o, "choices");
            cJSON_AddItemToObject(o, "usage", usage_json(u->n_prompt, u->n_generated, u->n_cached));
            sse_put(st, o);
        }
    }
    ks_sbuf_puts(&st->out, "data: [DONE]\n\n");
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
        if (st->out.refused) return MHD_CONTENT_READER_END_WITH_ERROR; /* not even the error event fits */
        double now = ks_sched_now();
        if (!st->done && (!news || now - st->last_check > 0.25)) {
            st->last_check = now;
            if (ks_server_client_gone(st->conn)) {
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
    free(st->lp_pending.p);
    free(st->acc.p);
    tool_plan_free(&st->tools);
    free(st);
}

/* ------------------------------------------------------- completions -- */

/* The request's kvsieve object over the server's defaults, parsed into
 * the request's spec.  A request that names another policy than the
 * default does not inherit the default's arguments (they may not apply to
 * it).  A policy that needs a draft model and names none gets the one
 * shipped beside the model, as the CLI does. */
static bool merge_policy(ks_server *srv, const ks_api_request *rq, ks_sched_policy *pol, ks_api_error *e) {
    const ks_policy_spec *d = &srv->p.defaults.spec;
    *pol = srv->p.defaults;
    bool other = (rq->ext_set & KS_API_EXT_POLICY) && strcmp(rq->policy, d->name);
    const char *args = (rq->ext_set & KS_API_EXT_ARGS) ? rq->policy_args : other ? "" : d->args;
    if (rq->ext_set & KS_API_EXT_PAGE) pol->page = rq->page;
    ks_status st = ks_policy_spec_parse(other ? rq->policy : d->name, args,
                                        rq->ext_set & KS_API_EXT_BUDGET ? rq->budget : d->budget,
                                        rq->ext_set & KS_API_EXT_SINK ? rq->sink : d->sink,
                                        rq->ext_set & KS_API_EXT_WINDOW ? rq->window : d->window,
                                        rq->ext_set & KS_API_EXT_DENSE_LAYERS ? rq->dense_layers : d->dense_layers,
                                        &pol->spec);
    if (st != KS_OK) { /* the name was checked when the request was parsed: the arguments */
        ks_api_error_set(e, 400, "invalid_request_error", "invalid_value", "kvsieve.policy_args", "%s (docs/POLICIES.md)",
                         ks_last_error());
        return false;
    }
    ks_policy_spec_add_draft(&pol->spec, srv->model_path, &pol->spec);
    /* the prefill policy (the server's --prefill-policy unless the request names one), checked
     * against the request's page: a budget must leave a page to select beside sinks and window.
     * A request that names its own setting is refused when it does not fit its page (its
     * mistake, said in a 400).  The server's setting was checked at start against the server's
     * page only, and a request asking for larger pages (kvsieve.page) may leave it no page to
     * select: that request asked for nothing wrong, so it prefills dense (the exact prefill the
     * sparse one approximates, and what every request gets without --prefill-policy) and the
     * log says why, rather than a 400 naming a field the request never sent. */
    bool own = rq->ext_set & KS_API_EXT_PREFILL;
    const char *pp = own ? rq->prefill_policy : srv->p.defaults.prefill;
    char canon[sizeof pol->prefill];
    if (ks_prefill_policy_canonical(pp, pol->page, canon, sizeof canon) != KS_OK) {
        if (own) {
            ks_api_error_set(e, 400, "invalid_request_error", "invalid_value", "kvsieve.prefill_policy",
                             "%s (docs/POLICIES.md, \"Sparse prefill\")", ks_last_error());
            return false;
        }
        KS_LOG(WARN, "serve: --prefill-policy %s does not fit the request's page of %d tokens (%s): the request "
                     "prefills dense", pp, pol->page, ks_last_error());
        snprintf(canon, sizeof canon, "dense");
    }
    snprintf(pol->prefill, sizeof pol->prefill, "%s", canon);
    return true;
}

/* The text of a chat request's prompt: the whole conversation rendered by
 * the GGUF's chat template (parse special tokens), or, for a model with no
 * known template, the non-empty contents joined by a blank line (system
 * messages in a row by a newline), as a base model would read a transcript. */
bool ks_server_chat_prompt(ks_server *srv, const ks_api_request *rq, char **text, bool *special, ks_api_error *e) {
    ks_chat_message *msgs = ks_malloc(sizeof *msgs * (size_t)rq->n_messages);
    if (!msgs) return out_of_memory(e, "reading the messages");
    for (int32_t i = 0; i < rq->n_messages; i++) {
        const ks_api_message *m = &rq->messages[i];
        msgs[i] = (ks_chat_message){m->role == KS_API_ROLE_SYSTEM ? KS_ROLE_SYSTEM
                                    : m->role == KS_API_ROLE_USER ? KS_ROLE_USER
                                    : m->role == KS_API_ROLE_TOOL ? KS_ROLE_TOOL
                                                                  : KS_ROLE_ASSISTANT,
                                    m->content, m->tool_calls, m->tool_call_id, m->name};
    }
    /* tool_choice none: the model is not told of the tools at all */
    const char *tools = rq->tool_choice == KS_API_TOOLS_NONE ? NULL : rq->tools;
    tool_plan tp;
    if (!tool_plan_make(srv, rq, &tp, e)) {
        free(msgs);
        return false;
    }
    size_t op = tp.opener ? strlen(tp.opener) : 0; /* a forced call's opener ends the prompt */
    size_t need = 0, n = (size_t)rq->n_messages;
    ks_status st = ks_chat_render_tools(srv->model, msgs, n, tools, NULL, 0, &need);
    if (st == KS_ERR_UNSUPPORTED) {
        size_t len = 0;
        for (size_t i = 0; i < n; i++) len += strlen(msgs[i].content) + 2;
        char *t = ks_malloc(len + 1), *w = t;
        if (!t) {
            free(msgs);
            return out_of_memory(e, "joining the messages");
        }
        const ks_chat_message *prev = NULL; /* empty messages add nothing */
        for (size_t i = 0; i < n; i++) {
            if (!msgs[i].content[0]) continue;
            if (prev) w = stpcpy(w, prev->role == KS_ROLE_SYSTEM && msgs[i].role == KS_ROLE_SYSTEM ? "\n" : "\n\n");
            w = stpcpy(w, msgs[i].content);
            prev = &msgs[i];
        }
        *w = 0;
        *text = t;
        *special = false;
        free(msgs);
        tool_plan_free(&tp);
        return true;
    }
    *text = ks_malloc(need + 1 + op);
    st = *text ? ks_chat_render_tools(srv->model, msgs, n, tools, *text, need + 1, &need) : KS_ERR_NOMEM;
    free(msgs);
    if (st == KS_OK && op) memcpy(*text + need, tp.opener, op + 1);
    tool_plan_free(&tp);
    if (st != KS_OK) {
        free(*text);
        *text = NULL;
        if (st == KS_ERR_NOMEM) return out_of_memory(e, "rendering the chat template");
        if (st == KS_ERR_INVALID_ARG) { /* the GGUF's template rejected the conversation (raise_exception) */
            ks_api_error_set(e, 400, "invalid_request_error", "invalid_value", "messages", "%s", ks_last_error());
            return false;
        }
        ks_api_error_set(e, 500, "server_error", "internal_error", NULL, "chat template: %s", ks_last_error());
        return false;
    }
    *special = true;
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
        *ids = ks_malloc(sizeof(int32_t) * (size_t)rq->n_prompt_ids);
        if (!*ids) return out_of_memory(e, "copying the prompt");
        memcpy(*ids, rq->prompt_ids, sizeof(int32_t) * (size_t)rq->n_prompt_ids);
        *n_ids = rq->n_prompt_ids;
        return true;
    }
    char *text = NULL;
    bool special = false;
    if (rq->kind == KS_API_CHAT) {
        if (!ks_server_chat_prompt(srv, rq, &text, &special, e)) return false;
    } else {
        if (!(text = ks_strdup(rq->prompt))) return out_of_memory(e, "copying the prompt");
    }
    size_t len = strlen(text), n = 0;
    ks_status st = ks_tokenize(srv->model, text, len, true, special, NULL, 0, &n);
    if (st != KS_OK && n == 0) {
        free(text);
        if (st == KS_ERR_NOMEM) return out_of_memory(e, "tokenizing the prompt");
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
    *ids = ks_malloc(sizeof(int32_t) * (n ? n : 1));
    st = *ids ? ks_tokenize(srv->model, text, len, true, special, *ids, n, &n) : KS_ERR_NOMEM;
    free(text);
    if (st != KS_OK) {
        free(*ids);
        *ids = NULL;
        if (st == KS_ERR_NOMEM) return out_of_memory(e, "tokenizing the prompt");
        ks_api_error_set(e, 400, "invalid_request_error", "invalid_value", param, "tokenizing the prompt: %s",
                         ks_last_error());
        return false;
    }
    *n_ids = (int32_t)n;
    return true;
}

enum MHD_Result ks_server_handle_completion(ks_server *srv, struct MHD_Connection *conn, ks_api_kind kind,
                                         const char *body, size_t len) {
    ks_api_error e;
    if (atomic_load(&srv->shutting_down)) {
        ks_api_error_set(&e, 503, "server_error", "server_shutting_down", NULL, "the server is shutting down");
        return ks_server_respond_error(srv, conn, &e);
    }
    ks_api_request rq;
    if (!ks_api_parse(body, len, kind, &rq, &e)) return ks_server_respond_error(srv, conn, &e);
    int32_t *ids = NULL, n_ids = 0;
    ks_sched_policy pol;
    tool_plan tools = {0};
    if (!merge_policy(srv, &rq, &pol, &e) || !tool_plan_make(srv, &rq, &tools, &e) ||
        !prepare_prompt(srv, &rq, &ids, &n_ids, &e)) {
        ks_api_request_free(&rq);
        tool_plan_free(&tools);
        return ks_server_respond_error(srv, conn, &e);
    }
    /* the function names outlive the request (a stream parses at its end) */
    memcpy(tools.names, rq.tool_names, sizeof(char *) * (size_t)rq.n_tools);
    tools.n_names = rq.n_tools;
    rq.n_tools = 0;
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
        .no_prompt_cache = !rq.cache_prompt,
        .logprobs = rq.logprobs,
        .top_logprobs = rq.top_logprobs,
        .json_schema = tools.forced ? tools.schema : rq.json_schema,
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
    bool stream_it = rq.stream, include_usage = rq.include_usage, want_lp = rq.logprobs;
    ks_api_request_free(&rq);

    ks_sbuf text = {0}, lps = {0}; /* lps: the ks_sched_logprob records of a non-streamed answer */
    ks_sched_update u;
    double last_check = ks_sched_now();
    for (;;) {
        bool news = ks_sched_req_take(srv->sched, req, 0.1, &u);
        if (u.logprobs && !stream_it) {
            ks_sbuf_put(&lps, (const char *)u.logprobs, sizeof *u.logprobs * (size_t)u.n_logprobs);
            free(u.logprobs);
            u.logprobs = NULL;
            u.n_logprobs = 0;
        }
        if (u.text) {
            if (!stream_it) ks_sbuf_put(&text, u.text, u.len);
            else if (u.len) break; /* keep u for the stream */
            free(u.text);
            u.text = NULL;
        }
        if (u.state == KS_SCHED_FINISHED || (stream_it && u.state != KS_SCHED_WAITING)) break;
        double now = ks_sched_now();
        if (!news || now - last_check > 0.25) {
            last_check = now;
            if (ks_server_client_gone(conn)) {
                ks_sched_req_release(srv->sched, req);
                atomic_fetch_sub(&srv->active, 1);
                free(text.p);
                free(lps.p);
                free(u.logprobs);
                tool_plan_free(&tools);
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
        free(lps.p);
        free(u.logprobs);
        tool_plan_free(&tools);
        return ks_server_respond_error(srv, conn, &e);
    }
    if (!stream_it) {
        bool chat = kind == KS_API_CHAT;
        cJSON *o = envelope(srv, id, chat ? "chat.completion" : "text_completion", created);
        cJSON *choices = cJSON_AddArrayToObject(o, "choices"), *c = cJSON_CreateObject();
        cJSON_AddNumberToObject(c, "index", 0);
        bool whole = !text.refused && !lps.refused; /* every generated byte made it into the answer */
        const char *finish = finish_name(u.finish);
        if (chat) {
            cJSON *m = cJSON_AddObjectToObject(c, "message");
            cJSON_AddStringToObject(m, "role", "assistant");
            ks_tool_parsed tc = {0};
            if (whole && tools.active) whole = tool_plan_parse(&tools, text.p ? text.p : "", text.n, &tc);
            if (whole && tc.n_calls) {
                cJSON *calls = tool_calls_json(&tc, tools.syn, false);
                if (tc.content) whole = add_clean_string(m, "content", tc.content, strlen(tc.content));
                else cJSON_AddNullToObject(m, "content");
                whole = whole && calls && cJSON_AddItemToObject(m, "tool_calls", calls);
                if (!whole) cJSON_Delete(calls);
                finish = "tool_calls";
            } else {
                whole = whole && add_clean_string(m, "content", text.p, text.n);
            }
            ks_tool_parsed_free(&tc);
        } else {
            whole = whole && add_clean_string(c, "text", text.p, text.n);
        }
        cJSON *lpo = NULL;
        if (whole && want_lp) {
            const ks_sched_logprob *lp = (const ks_sched_logprob *)lps.p;
            int32_t n_lp = (int32_t)(lps.n / sizeof *lp);
            size_t offset = 0;
            lpo = chat ? ks_server_logprobs_chat(srv, lp, n_lp) : ks_server_logprobs_text(srv, lp, n_lp, &offset);
            whole = lpo != NULL;
        }
        free(lps.p);
        if (!whole) {
            cJSON_Delete(o);
            cJSON_Delete(c);
            out_of_memory(&e, "writing the answer");
            free(text.p);
            tool_plan_free(&tools);
            ks_sched_req_release(srv->sched, req);
            atomic_fetch_sub(&srv->active, 1);
            return ks_server_respond_error(srv, conn, &e);
        }
        if (lpo) cJSON_AddItemToObject(c, "logprobs", lpo);
        else cJSON_AddNullToObject(c, "logprobs");
        cJSON_AddStringToObject(c, "finish_reason", finish);
        cJSON_AddItemToArray(choices, c);
        cJSON_AddItemToObject(o, "usage", usage_json(u.n_prompt, u.n_generated, u.n_cached));
        free(text.p);
        tool_plan_free(&tools);
        ks_sched_req_release(srv->sched, req);
        atomic_fetch_sub(&srv->active, 1);
        return ks_server_respond_json(srv, conn, 200, o);
    }
    stream *st = ks_calloc(1, sizeof *st);
    if (!st) {
        free(u.text);
        free(u.logprobs);
        tool_plan_free(&tools);
        ks_sched_req_release(srv->sched, req);
        atomic_fetch_sub(&srv->active, 1);
        out_of_memory(&e, "starting the stream");
        return ks_server_respond_error(srv, conn, &e);
    }
    st->srv = srv;
    st->req = req;
    st->conn = conn;
    st->kind = kind;
    st->include_usage = include_usage;
    st->logprobs = want_lp;
    st->created = created;
    st->last_check = ks_sched_now();
    st->tools = tools; /* the stream owns it now */
    snprintf(st->id, sizeof st->id, "%s", id);
    if (kind == KS_API_CHAT) sse_put(st, chunk(st, "", 0, NULL, NULL, 0)); /* the role first, as OpenAI does */
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
    ks_server_count_status(srv, 200);
    return ret;
fail:
    free(ids);
    ks_api_request_free(&rq);
    tool_plan_free(&tools);
    return ks_server_respond_error(srv, conn, &e);
}
