/*
 * tokens.c — POST /tokenize, POST /detokenize and POST /apply-template, the
 * llama-server routes clients use to count and inspect tokens and to see the
 * exact prompt a chat request becomes.
 *
 * Shapes are llama-server's, so its clients work unchanged:
 *   /tokenize       {"content", "add_special": false, "parse_special": true,
 *                    "with_pieces": false} -> {"tokens": [id...]} or, with
 *                   pieces, [{"id", "piece"}] (a piece that is not valid
 *                   UTF-8 on its own, a byte of a multi-byte character, is
 *                   its bytes as an array of numbers, as llama-server does)
 *   /detokenize     {"tokens": [id...]} -> {"content"}
 *   /apply-template {"messages": [...]} -> {"prompt"}: the text
 *                   /v1/chat/completions tokenizes (ks_server_chat_prompt),
 *                   without the BOS the tokenizer adds.
 * None of them touches the scheduler: tokenizing and rendering are
 * read-only uses of the model, done on the connection's thread.  The body
 * parsers are pure functions (tokens.h) that the request fuzzer drives.
 */
#include "server/internal.h"
#include "server/tokens.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BAD(code, param, ...) ks_api_error_set(err, 400, "invalid_request_error", (code), (param), __VA_ARGS__)

/* ------------------------------------------------------------ parsing -- */

/* The body as one JSON object (NULL, err filled, otherwise). */
static cJSON *parse_object(const char *body, size_t len, ks_api_error *err) {
    const char *end = NULL;
    cJSON *root = body && len ? cJSON_ParseWithLengthOpts(body, len, &end, 0) : NULL;
    if (root && end) /* only whitespace may follow the value */
        for (const char *p = end; p < body + len; p++)
            if (!(*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) {
                cJSON_Delete(root);
                root = NULL;
                break;
            }
    if (!root) {
        BAD("invalid_json", NULL, "the request body is not valid JSON (expected one object)");
        return NULL;
    }
    if (!cJSON_IsObject(root)) {
        BAD("invalid_json", NULL, "the request body must be a JSON object");
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

/* An optional boolean field: false (err filled) when present and not a boolean. */
static bool opt_bool(const cJSON *root, const char *key, bool *out, ks_api_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) return true;
    if (!cJSON_IsBool(v)) {
        BAD("invalid_type", key, "'%s' must be a boolean", key);
        return false;
    }
    *out = cJSON_IsTrue(v);
    return true;
}

/* A field the route does not take: 400 unknown_parameter naming it (as
 * the completion routes do), so a misspelt "add_specials" is not silently
 * the default. */
static bool only_fields(const cJSON *root, const char *const *known, ks_api_error *err) {
    const cJSON *f;
    cJSON_ArrayForEach(f, root) {
        const char *k = f->string ? f->string : "";
        const char *const *p = known;
        while (*p && strcmp(*p, k)) p++;
        if (*p) continue;
        char param[64];
        snprintf(param, sizeof param, "%.60s", k);
        BAD("unknown_parameter", param, "Unrecognized request argument supplied: %s", param);
        return false;
    }
    return true;
}

bool ks_api_parse_tokenize(const char *body, size_t len, ks_api_tokenize *out, ks_api_error *err) {
    memset(out, 0, sizeof *out);
    out->parse_special = true;
    cJSON *root = parse_object(body, len, err);
    if (!root) return false;
    bool ok = false;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(root, "content");
    if (!c || cJSON_IsNull(c)) {
        BAD("missing_required_parameter", "content", "'content' is required (the text to tokenize)");
        goto done;
    }
    if (!cJSON_IsString(c)) {
        BAD("invalid_type", "content", "'content' must be a string");
        goto done;
    }
    if (!opt_bool(root, "add_special", &out->add_special, err) || !opt_bool(root, "parse_special", &out->parse_special, err) ||
        !opt_bool(root, "with_pieces", &out->with_pieces, err))
        goto done;
    static const char *const known[] = {"content", "add_special", "parse_special", "with_pieces", NULL};
    if (!only_fields(root, known, err)) goto done;
    if (!(out->content = ks_strdup(c->valuestring))) {
        ks_api_error_set(err, 503, "server_error", "out_of_memory", NULL, "the server ran out of memory reading 'content'");
        goto done;
    }
    ok = true;
done:
    cJSON_Delete(root);
    if (!ok) ks_api_tokenize_free(out);
    return ok;
}

void ks_api_tokenize_free(ks_api_tokenize *t) {
    free(t->content);
    memset(t, 0, sizeof *t);
}

bool ks_api_parse_detokenize(const char *body, size_t len, ks_api_detokenize *out, ks_api_error *err) {
    memset(out, 0, sizeof *out);
    cJSON *root = parse_object(body, len, err);
    if (!root) return false;
    bool ok = false;
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    if (!a || cJSON_IsNull(a)) {
        BAD("missing_required_parameter", "tokens", "'tokens' is required (an array of token ids)");
        goto done;
    }
    if (!cJSON_IsArray(a)) {
        BAD("invalid_type", "tokens", "'tokens' must be an array of token ids");
        goto done;
    }
    int n = cJSON_GetArraySize(a);
    if (n > 0 && !(out->tokens = ks_malloc(sizeof(int32_t) * (size_t)n))) {
        ks_api_error_set(err, 503, "server_error", "out_of_memory", NULL, "the server ran out of memory reading 'tokens'");
        goto done;
    }
    const cJSON *v;
    cJSON_ArrayForEach(v, a) {
        char param[32];
        snprintf(param, sizeof param, "tokens[%d]", (int)out->n_tokens);
        double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
        if (!cJSON_IsNumber(v) || !isfinite(d) || d != floor(d)) {
            BAD("invalid_type", param, "'%s' must be an integer token id", param);
            goto done;
        }
        if (d < 0 || d > INT32_MAX) {
            BAD("invalid_value", param, "'%s' is %.0f: not a token id", param, d);
            goto done;
        }
        out->tokens[out->n_tokens++] = (int32_t)d;
    }
    static const char *const known[] = {"tokens", NULL};
    if (!only_fields(root, known, err)) goto done;
    ok = true;
done:
    cJSON_Delete(root);
    if (!ok) ks_api_detokenize_free(out);
    return ok;
}

void ks_api_detokenize_free(ks_api_detokenize *d) {
    free(d->tokens);
    memset(d, 0, sizeof *d);
}

/* ----------------------------------------------------------- handlers -- */

static enum MHD_Result nomem(ks_server *srv, struct MHD_Connection *conn, const char *what) {
    ks_api_error e;
    ks_api_error_set(&e, 503, "server_error", "out_of_memory", NULL, "the server ran out of memory %s; retry later", what);
    return ks_server_respond_error(srv, conn, &e);
}

/* Whether s[len] is valid UTF-8 (a piece may be one byte of a character). */
static bool utf8_valid(const char *s, size_t len) {
    char *c = ks_api_utf8_clean(s, len);
    bool ok = c && strlen(c) == len && !memcmp(c, s, len);
    free(c);
    return ok;
}

/* One token's text (malloc'd into *out, length *n); false on failure. */
static bool piece(const ks_model *m, int32_t id, char **out, size_t *n) {
    char small[256];
    size_t need = 0;
    ks_status st = ks_token_to_piece(m, id, small, sizeof small, &need);
    if (st == KS_OK && need < sizeof small) {
        *out = ks_malloc(need + 1);
        if (!*out) return false;
        memcpy(*out, small, need);
        (*out)[need] = 0;
        *n = need;
        return true;
    }
    *out = ks_malloc(need + 1);
    if (!*out) return false;
    if (ks_token_to_piece(m, id, *out, need + 1, n) != KS_OK) {
        free(*out);
        *out = NULL;
        return false;
    }
    return true;
}

static enum MHD_Result handle_tokenize(ks_server *srv, struct MHD_Connection *conn, const char *body, size_t len) {
    ks_api_tokenize t;
    ks_api_error e;
    if (!ks_api_parse_tokenize(body, len, &t, &e)) return ks_server_respond_error(srv, conn, &e);
    size_t n = 0, clen = strlen(t.content);
    int32_t *ids = NULL;
    ks_status st = ks_tokenize(srv->model, t.content, clen, t.add_special, t.parse_special, NULL, 0, &n);
    if (st == KS_OK || (st == KS_ERR_INVALID_ARG && n > 0)) {
        ids = ks_malloc(sizeof *ids * (n ? n : 1));
        st = ids ? ks_tokenize(srv->model, t.content, clen, t.add_special, t.parse_special, ids, n, &n) : KS_ERR_NOMEM;
    }
    bool with_pieces = t.with_pieces;
    ks_api_tokenize_free(&t);
    if (st != KS_OK) {
        free(ids);
        if (st == KS_ERR_NOMEM) return nomem(srv, conn, "tokenizing");
        ks_api_error_set(&e, 400, "invalid_request_error", "invalid_value", "content", "tokenizing 'content': %s",
                         ks_last_error());
        return ks_server_respond_error(srv, conn, &e);
    }
    cJSON *root = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(root, "tokens");
    bool ok = root && arr;
    for (size_t i = 0; ok && i < n; i++) {
        if (!with_pieces) {
            ok = cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
            continue;
        }
        char *p = NULL;
        size_t pn = 0;
        if (!piece(srv->model, ids[i], &p, &pn)) {
            ok = false;
            break;
        }
        cJSON *o = cJSON_CreateObject();
        ok = o && cJSON_AddNumberToObject(o, "id", ids[i]);
        if (ok && utf8_valid(p, pn)) ok = cJSON_AddStringToObject(o, "piece", p) != NULL;
        else if (ok) {
            cJSON *bytes = cJSON_AddArrayToObject(o, "piece");
            for (size_t k = 0; ok && bytes && k < pn; k++)
                ok = cJSON_AddItemToArray(bytes, cJSON_CreateNumber((unsigned char)p[k]));
            ok = ok && bytes;
        }
        free(p);
        if (o && !cJSON_AddItemToArray(arr, o)) {
            cJSON_Delete(o);
            ok = false;
        }
    }
    free(ids);
    if (!ok) {
        cJSON_Delete(root);
        return nomem(srv, conn, "answering /tokenize");
    }
    return ks_server_respond_json(srv, conn, 200, root);
}

static enum MHD_Result handle_detokenize(ks_server *srv, struct MHD_Connection *conn, const char *body, size_t len) {
    ks_api_detokenize d;
    ks_api_error e;
    if (!ks_api_parse_detokenize(body, len, &d, &e)) return ks_server_respond_error(srv, conn, &e);
    for (int32_t i = 0; i < d.n_tokens; i++)
        if (d.tokens[i] >= srv->n_vocab) {
            char param[32];
            snprintf(param, sizeof param, "tokens[%d]", (int)i);
            ks_api_error_set(&e, 400, "invalid_request_error", "invalid_value", param,
                             "'%s' is %d: token ids are in [0, %d)", param, (int)d.tokens[i], (int)srv->n_vocab);
            ks_api_detokenize_free(&d);
            return ks_server_respond_error(srv, conn, &e);
        }
    ks_sbuf text = {0};
    for (int32_t i = 0; i < d.n_tokens; i++) {
        char *p = NULL;
        size_t pn = 0;
        if (!piece(srv->model, d.tokens[i], &p, &pn)) {
            text.refused = true;
            break;
        }
        ks_sbuf_put(&text, p, pn);
        free(p);
    }
    ks_api_detokenize_free(&d);
    /* pieces joined may still end inside a character: the answer is JSON text */
    char *clean = text.refused ? NULL : ks_api_utf8_clean(text.p ? text.p : "", text.n);
    free(text.p);
    cJSON *root = clean ? cJSON_CreateObject() : NULL;
    if (!root || !cJSON_AddStringToObject(root, "content", clean)) {
        free(clean);
        cJSON_Delete(root);
        return nomem(srv, conn, "answering /detokenize");
    }
    free(clean);
    return ks_server_respond_json(srv, conn, 200, root);
}

static enum MHD_Result handle_apply_template(ks_server *srv, struct MHD_Connection *conn, const char *body,
                                             size_t len) {
    ks_api_request rq;
    ks_api_error e;
    if (!ks_api_parse(body, len, KS_API_CHAT, &rq, &e)) return ks_server_respond_error(srv, conn, &e);
    char *text = NULL;
    bool special = false;
    bool ok = ks_server_chat_prompt(srv, &rq, &text, &special, &e);
    ks_api_request_free(&rq);
    if (!ok) return ks_server_respond_error(srv, conn, &e);
    char *clean = ks_api_utf8_clean(text, strlen(text));
    free(text);
    cJSON *root = clean ? cJSON_CreateObject() : NULL;
    if (!root || !cJSON_AddStringToObject(root, "prompt", clean)) {
        free(clean);
        cJSON_Delete(root);
        return nomem(srv, conn, "answering /apply-template");
    }
    free(clean);
    return ks_server_respond_json(srv, conn, 200, root);
}

bool ks_server_is_tokens_route(const char *path) {
    return !strcmp(path, "/tokenize") || !strcmp(path, "/detokenize") || !strcmp(path, "/apply-template");
}

enum MHD_Result ks_server_handle_tokens(ks_server *srv, struct MHD_Connection *conn, const char *path,
                                        const char *body, size_t len) {
    if (!strcmp(path, "/tokenize")) return handle_tokenize(srv, conn, body, len);
    if (!strcmp(path, "/detokenize")) return handle_detokenize(srv, conn, body, len);
    return handle_apply_template(srv, conn, body, len);
}
