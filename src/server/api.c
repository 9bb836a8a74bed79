/*
 * api.c — parsing and validation of OpenAI-style request bodies (api.h).
 *
 * Every field goes through one of a few typed getters (string, integer in a
 * range, number in a range, boolean), each of which treats JSON null as
 * absent and reports a wrong type or value with the field's name as the
 * error's `param`, so that every rejection reads the same way to a client.
 * Only the public API is used (the policy registry, to name unknown
 * policies) and the structured-output schema compiler (to refuse a schema
 * it cannot enforce), so the fuzzer links nothing but this file and
 * libkvsieve.
 */
#define _GNU_SOURCE
#include "server/api.h"

#include "core/core.h"
#include "sample/json_constraint.h"
#include "kvsieve.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ks_api_error_set(ks_api_error *e, int status, const char *type, const char *code, const char *param,
                      const char *fmt, ...) {
    e->status = status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

#define BAD(code, param, ...) ks_api_error_set(err, 400, "invalid_request_error", (code), (param), __VA_ARGS__)
/* A refused allocation: 503 for this request, the server goes on. */
#define NOMEM(what) ks_api_error_set(err, 503, "server_error", "out_of_memory", NULL, "the server ran out of memory reading %s; retry later", (what))

char *ks_api_utf8_clean(const char *s, size_t len) {
    char *o = ks_malloc(len * 3 + 1), *w = o;
    if (!o) return NULL;
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        unsigned c = p[i];
        size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
        bool ok = n > 0 && i + n <= len;
        for (size_t k = 1; ok && k < n; k++) ok = (p[i + k] & 0xC0) == 0x80;
        if (ok && n > 1) { /* no overlong forms, surrogates or code points past U+10FFFF */
            unsigned cp = n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
            for (size_t k = 1; k < n; k++) cp = (cp << 6) | (p[i + k] & 0x3F);
            ok = (n == 2 && cp >= 0x80) || (n == 3 && cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF)) ||
                 (n == 4 && cp >= 0x10000 && cp <= 0x10FFFF);
        }
        if (ok && c == 0) ok = false; /* a NUL would end the C string */
        if (ok) {
            memcpy(w, p + i, n);
            w += n;
            i += n;
        } else {
            memcpy(w, "\xEF\xBF\xBD", 3);
            w += 3;
            i++;
        }
    }
    *w = 0;
    return o;
}

char *ks_api_error_json(const ks_api_error *e) {
    cJSON *root = cJSON_CreateObject(), *o = cJSON_AddObjectToObject(root, "error");
    char *msg = ks_api_utf8_clean(e->message, strlen(e->message));
    cJSON_AddStringToObject(o, "message", msg ? msg : e->message); /* unclean beats absent */
    free(msg);
    cJSON_AddStringToObject(o, "type", e->type ? e->type : "invalid_request_error");
    if (e->param[0]) cJSON_AddStringToObject(o, "param", e->param);
    else cJSON_AddNullToObject(o, "param");
    if (e->code) cJSON_AddStringToObject(o, "code", e->code);
    else cJSON_AddNullToObject(o, "code");
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

/* ------------------------------------------------------ typed getters -- */
/* Each returns 1 when the field is present and valid (value written), 0
 * when absent or null, -1 on a bad field (err filled). */

static const char *type_name(const cJSON *v) {
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    return "null";
}

/* The field key of o into *v when it passes is() (1), 0 when absent or
 * null, -1 (err filled) when of another type; want: the type in words. */
static int get_field(const cJSON *o, const char *key, const char *param, cJSON_bool (*is)(const cJSON *),
                     const char *want, const cJSON **v, ks_api_error *err) {
    *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!*v || cJSON_IsNull(*v)) return 0;
    if (!is(*v)) {
        BAD("invalid_type", param, "'%s' must be %s, got %s", param, want, type_name(*v));
        return -1;
    }
    return 1;
}

/* A field the request must carry (null counts as absent): NULL, err filled, without it. */
static const cJSON *get_required(const cJSON *o, const char *key, ks_api_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (v && !cJSON_IsNull(v)) return v;
    BAD("missing_required_parameter", key, "'%s' is required", key);
    return NULL;
}

static int get_bool(const cJSON *o, const char *key, const char *param, bool *out, ks_api_error *err) {
    const cJSON *v;
    int rc = get_field(o, key, param, cJSON_IsBool, "a boolean", &v, err);
    if (rc == 1) *out = cJSON_IsTrue(v);
    return rc;
}

static int get_int(const cJSON *o, const char *key, const char *param, double lo, double hi, double *out,
                   ks_api_error *err) {
    const cJSON *v;
    int rc = get_field(o, key, param, cJSON_IsNumber, "an integer", &v, err);
    if (rc != 1) return rc;
    double d = v->valuedouble;
    if (!isfinite(d) || d != floor(d)) {
        BAD("invalid_type", param, "'%s' must be an integer, got %g", param, d);
        return -1;
    }
    if (d < lo || d > hi) {
        BAD("invalid_value", param, "'%s' must be in [%.0f, %.0f], got %.0f", param, lo, hi, d);
        return -1;
    }
    *out = d;
    return 1;
}

/* lo_open: the lower bound is excluded. */
static int get_num(const cJSON *o, const char *key, const char *param, double lo, bool lo_open, double hi,
                   bool hi_open, float *out, ks_api_error *err) {
    const cJSON *v;
    int rc = get_field(o, key, param, cJSON_IsNumber, "a number", &v, err);
    if (rc != 1) return rc;
    double d = v->valuedouble;
    if (!isfinite(d) || (lo_open ? d <= lo : d < lo) || (hi_open ? d >= hi : d > hi)) {
        BAD("invalid_value", param, "'%s' must be in %c%g, %g%c, got %g", param, lo_open ? '(' : '[', lo, hi,
            hi_open ? ')' : ']', d);
        return -1;
    }
    *out = (float)d;
    return 1;
}

static int get_str(const cJSON *o, const char *key, const char *param, const char **out, ks_api_error *err) {
    const cJSON *v;
    int rc = get_field(o, key, param, cJSON_IsString, "a string", &v, err);
    if (rc == 1) *out = v->valuestring;
    return rc;
}

/* ------------------------------------------------------------- fields -- */

/* Text of a message's content: a string, or a non-empty array of
 * {"type":"text","text":...} parts (joined with nothing between, as OpenAI
 * does).  Other part types (image_url, input_audio, file, refusal) are
 * refused by name rather than dropped, so no answer ignores part of its
 * question. */
static char *content_text(const cJSON *c, int idx, ks_api_error *err) {
    char param[64];
    snprintf(param, sizeof param, "messages[%d].content", idx);
    if (!c || cJSON_IsNull(c)) {
        BAD("missing_required_parameter", param, "'%s' is required (a string or an array of text parts)", param);
        return NULL;
    }
    if (cJSON_IsString(c)) {
        char *s = ks_strdup(c->valuestring);
        if (!s) NOMEM(param);
        return s;
    }
    if (!cJSON_IsArray(c)) {
        BAD("invalid_type", param, "'%s' must be a string or an array of text parts, got %s", param, type_name(c));
        return NULL;
    }
    if (cJSON_GetArraySize(c) == 0) {
        BAD("invalid_value", param, "'%s' must not be an empty array", param);
        return NULL;
    }
    size_t n = 0, cap = 64;
    char *s = ks_malloc(cap);
    if (!s) {
        NOMEM(param);
        return NULL;
    }
    s[0] = 0;
    const cJSON *part;
    int j = 0;
    cJSON_ArrayForEach(part, c) {
        char pp[64];
        snprintf(pp, sizeof pp, "messages[%d].content[%d]", idx, j++);
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "type"), *tx = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(t)) {
            BAD("invalid_type", pp, "'%s' must be an object {\"type\": \"text\", \"text\": \"...\"}, got %s", pp,
                cJSON_IsObject(part) ? "an object without a string 'type'" : type_name(part));
            free(s);
            return NULL;
        }
        if (strcmp(t->valuestring, "text")) {
            BAD("unsupported", pp, "'%s' is a '%.32s' part: only text parts are supported", pp, t->valuestring);
            free(s);
            return NULL;
        }
        if (!cJSON_IsString(tx)) {
            BAD("invalid_type", pp, "'%s.text' must be a string, got %s", pp, tx ? type_name(tx) : "nothing");
            free(s);
            return NULL;
        }
        size_t m = strlen(tx->valuestring);
        if (n + m + 1 > cap) {
            cap = (n + m + 1) * 2;
            char *ns = ks_realloc(s, cap);
            if (!ns) {
                free(s);
                NOMEM(param);
                return NULL;
            }
            s = ns;
        }
        memcpy(s + n, tx->valuestring, m + 1);
        n += m;
    }
    return s;
}

/* An assistant's tool_calls: [{"id", "type": "function", "function":
 * {"name", "arguments": "JSON text"}}], kept as compact JSON for the
 * template.  NULL with err clear when absent, null or empty; NULL with
 * err->status set when bad. */
static char *parse_tool_calls(const cJSON *tc, int idx, ks_api_error *err) {
    char param[96];
    snprintf(param, sizeof param, "messages[%d].tool_calls", idx);
    if (!tc || cJSON_IsNull(tc) || (cJSON_IsArray(tc) && cJSON_GetArraySize(tc) == 0)) return NULL;
    if (!cJSON_IsArray(tc)) {
        BAD("invalid_type", param, "'%s' must be an array, got %s", param, type_name(tc));
        return NULL;
    }
    const cJSON *c;
    int j = 0;
    cJSON_ArrayForEach(c, tc) {
        snprintf(param, sizeof param, "messages[%d].tool_calls[%d]", idx, j++);
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(c, "type"), *f = cJSON_GetObjectItemCaseSensitive(c, "function");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(c, "id");
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(f, "name"), *args = cJSON_GetObjectItemCaseSensitive(f, "arguments");
        if (!cJSON_IsObject(c) || !cJSON_IsObject(f) || !cJSON_IsString(nm) || (ty && !cJSON_IsString(ty)) ||
            (id && !cJSON_IsString(id)) || !(cJSON_IsString(args) || cJSON_IsObject(args))) {
            BAD("invalid_type", param,
                "'%s' must be {\"id\": \"...\", \"type\": \"function\", \"function\": {\"name\": \"...\", "
                "\"arguments\": \"{...}\"}}", param);
            return NULL;
        }
        if (ty && strcmp(ty->valuestring, "function")) {
            BAD("invalid_value", param, "'%s.type' must be 'function', got '%.32s'", param, ty->valuestring);
            return NULL;
        }
    }
    char *s = cJSON_PrintUnformatted(tc);
    if (!s) NOMEM(param);
    return s;
}

/* The conversation: system (or developer), user, assistant and tool
 * messages in any order, kept in order so the chat template renders it
 * whole and turn N+1 shares turn N's rendered prefix.  An assistant message
 * may carry tool_calls (its content may then be null); a tool message is a
 * call's result, with the tool_call_id it answers. */
static bool parse_messages(const cJSON *root, ks_api_request *r, ks_api_error *err) {
    const cJSON *msgs = get_required(root, "messages", err);
    if (!msgs) return false;
    if (!cJSON_IsArray(msgs)) {
        BAD("invalid_type", "messages", "'messages' must be an array, got %s", type_name(msgs));
        return false;
    }
    int n = cJSON_GetArraySize(msgs), i = 0;
    if (n == 0) {
        BAD("invalid_value", "messages", "'messages' must not be empty");
        return false;
    }
    r->messages = ks_calloc((size_t)n, sizeof *r->messages);
    if (!r->messages) {
        NOMEM("messages");
        return false;
    }
    bool any_user = false;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        char param[64];
        snprintf(param, sizeof param, "messages[%d]", i);
        if (!cJSON_IsObject(m)) {
            BAD("invalid_type", param, "'%s' must be an object, got %s", param, type_name(m));
            return false;
        }
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        snprintf(param, sizeof param, "messages[%d].role", i);
        if (!cJSON_IsString(role)) {
            BAD(role && !cJSON_IsNull(role) ? "invalid_type" : "missing_required_parameter", param,
                "'%s' must be a string (system, developer, user, assistant or tool)", param);
            return false;
        }
        const char *rn = role->valuestring;
        ks_api_role kind;
        if (!strcmp(rn, "system") || !strcmp(rn, "developer")) kind = KS_API_ROLE_SYSTEM;
        else if (!strcmp(rn, "user")) kind = KS_API_ROLE_USER;
        else if (!strcmp(rn, "assistant")) kind = KS_API_ROLE_ASSISTANT;
        else if (!strcmp(rn, "tool")) kind = KS_API_ROLE_TOOL;
        else if (!strcmp(rn, "function")) {
            BAD("unsupported", param, "'%s' is 'function': the deprecated function role is not supported; send the "
                "result as a 'tool' message with its 'tool_call_id'", param);
            return false;
        } else {
            BAD("invalid_value", param, "'%s' must be system, developer, user, assistant or tool, got '%.64s'", param, rn);
            return false;
        }
        ks_api_message *msg = &r->messages[r->n_messages++]; /* freed with the request from here on */
        msg->role = kind;
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (kind == KS_API_ROLE_ASSISTANT) {
            const cJSON *fc = cJSON_GetObjectItemCaseSensitive(m, "function_call");
            if (fc && !cJSON_IsNull(fc)) {
                snprintf(param, sizeof param, "messages[%d].function_call", i);
                BAD("unsupported", param, "'%s': the deprecated function_call is not supported; use tool_calls", param);
                return false;
            }
            err->status = 0;
            msg->tool_calls = parse_tool_calls(cJSON_GetObjectItemCaseSensitive(m, "tool_calls"), i, err);
            if (!msg->tool_calls && err->status) return false;
            if (msg->tool_calls && (!content || cJSON_IsNull(content))) content = NULL; /* OpenAI sends null beside calls */
        }
        if (kind == KS_API_ROLE_TOOL) {
            static const char *const keys[] = {"tool_call_id", "name"};
            for (int k = 0; k < 2; k++) {
                const char *v = NULL;
                char pp[64];
                snprintf(pp, sizeof pp, "messages[%d].%s", i, keys[k]);
                int rc = get_str(m, keys[k], pp, &v, err);
                if (rc < 0) return false;
                if (rc == 0 && k == 0) {
                    BAD("missing_required_parameter", pp, "'%s' is required in a tool message (the id of the call it "
                        "answers)", pp);
                    return false;
                }
                char **dst = k == 0 ? &msg->tool_call_id : &msg->name;
                if (rc > 0 && !(*dst = ks_strdup(v))) {
                    NOMEM(pp);
                    return false;
                }
            }
        }
        char *text = msg->tool_calls && !content ? ks_strdup("") : content_text(content, i, err);
        if (!text) {
            if (msg->tool_calls && !content) NOMEM("messages");
            return false;
        }
        msg->content = text;
        any_user = any_user || kind == KS_API_ROLE_USER;
        i++;
    }
    if (!any_user) {
        BAD("invalid_value", "messages", "'messages' needs at least one message with role 'user'");
        return false;
    }
    return true;
}

/* OpenAI's function names: letters, digits, '_' and '-', 1 to 64. */
static bool tool_name_ok(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > 64) return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return false;
    }
    return true;
}

/* The parameters schema of a function a call is forced to: compiled now,
 * so a keyword the constraint cannot enforce is a 400 naming it. */
static bool check_forced_schema(const cJSON *params, int idx, ks_api_error *err) {
    if (!params) return true;
    char *text = cJSON_PrintUnformatted(params), where[256], param[64];
    snprintf(param, sizeof param, "tools[%d].function.parameters", idx);
    if (!text) {
        NOMEM(param);
        return false;
    }
    ks_json_schema *cs = NULL;
    ks_status st = ks_json_schema_compile(text, strlen(text), &cs, where, sizeof where);
    ks_json_schema_destroy(cs);
    free(text);
    if (st == KS_OK) return true;
    if (st == KS_ERR_NOMEM) NOMEM(param);
    else BAD(st == KS_ERR_UNSUPPORTED ? "unsupported" : "invalid_value", param, "%s: %s (a forced call's arguments are "
             "constrained to this schema)", param, where);
    return false;
}

/* tools (an array of {"type": "function", "function": {"name",
 * "description", "parameters", "strict"}}) and tool_choice ("auto",
 * "none", "required", or {"type": "function", "function": {"name"}}). */
static bool parse_tools(const cJSON *root, ks_api_request *r, ks_api_error *err) {
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
    const cJSON *choice = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    if (tools && !cJSON_IsNull(tools)) {
        if (r->kind != KS_API_CHAT) {
            BAD("unsupported", "tools", "'tools' are taken by /v1/chat/completions only");
            return false;
        }
        if (!cJSON_IsArray(tools)) {
            BAD("invalid_type", "tools", "'tools' must be an array, got %s", type_name(tools));
            return false;
        }
        if (cJSON_GetArraySize(tools) > KS_API_MAX_TOOLS) {
            BAD("invalid_value", "tools", "at most %d tools", KS_API_MAX_TOOLS);
            return false;
        }
        const cJSON *t;
        int i = 0;
        cJSON_ArrayForEach(t, tools) {
            char param[64];
            snprintf(param, sizeof param, "tools[%d]", i);
            const cJSON *ty = cJSON_GetObjectItemCaseSensitive(t, "type"), *f = cJSON_GetObjectItemCaseSensitive(t, "function");
            if (!cJSON_IsObject(t) || !cJSON_IsString(ty) || !cJSON_IsObject(f)) {
                BAD("invalid_type", param, "'%s' must be {\"type\": \"function\", \"function\": {\"name\": ...}}", param);
                return false;
            }
            if (strcmp(ty->valuestring, "function")) {
                snprintf(param, sizeof param, "tools[%d].type", i);
                BAD("unsupported", param, "'%s' is '%.32s': only function tools are supported", param, ty->valuestring);
                return false;
            }
            const char *name = NULL, *desc = NULL;
            bool strict;
            snprintf(param, sizeof param, "tools[%d].function.name", i);
            int rc = get_str(f, "name", param, &name, err);
            if (rc < 0) return false;
            if (rc == 0 || !tool_name_ok(name)) {
                BAD(rc == 0 ? "missing_required_parameter" : "invalid_value", param,
                    "'%s' must be 1 to 64 letters, digits, '_' or '-'", param);
                return false;
            }
            for (int k = 0; k < r->n_tools; k++)
                if (!strcmp(r->tool_names[k], name)) {
                    BAD("invalid_value", param, "'%s': two tools are named '%s'", param, name);
                    return false;
                }
            snprintf(param, sizeof param, "tools[%d].function.description", i);
            if (get_str(f, "description", param, &desc, err) < 0) return false;
            snprintf(param, sizeof param, "tools[%d].function.strict", i);
            if (get_bool(f, "strict", param, &strict, err) < 0) return false;
            const cJSON *pa = cJSON_GetObjectItemCaseSensitive(f, "parameters");
            if (pa && !cJSON_IsNull(pa) && !cJSON_IsObject(pa)) {
                snprintf(param, sizeof param, "tools[%d].function.parameters", i);
                BAD("invalid_type", param, "'%s' must be a JSON Schema object, got %s", param, type_name(pa));
                return false;
            }
            if (!(r->tool_names[r->n_tools] = ks_strdup(name))) {
                NOMEM("tools");
                return false;
            }
            r->n_tools++;
            i++;
        }
        if (r->n_tools && !(r->tools = cJSON_PrintUnformatted(tools))) {
            NOMEM("tools");
            return false;
        }
    }
    if (!choice || cJSON_IsNull(choice)) return true;
    const char *want = NULL;
    if (cJSON_IsString(choice)) {
        const char *c = choice->valuestring;
        if (!strcmp(c, "auto")) r->tool_choice = KS_API_TOOLS_AUTO;
        else if (!strcmp(c, "none")) r->tool_choice = KS_API_TOOLS_NONE;
        else if (!strcmp(c, "required")) r->tool_choice = KS_API_TOOLS_REQUIRED;
        else {
            BAD("invalid_value", "tool_choice", "'tool_choice' must be auto, none, required or {\"type\": \"function\", "
                "\"function\": {\"name\": ...}}, got '%.32s'", c);
            return false;
        }
    } else if (cJSON_IsObject(choice)) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(choice, "function");
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(f, "name");
        if (!cJSON_IsString(nm)) {
            BAD("invalid_type", "tool_choice", "'tool_choice' must be {\"type\": \"function\", \"function\": {\"name\": "
                "\"...\"}}");
            return false;
        }
        want = nm->valuestring;
        r->tool_choice = KS_API_TOOLS_NAMED;
    } else {
        BAD("invalid_type", "tool_choice", "'tool_choice' must be a string or an object, got %s", type_name(choice));
        return false;
    }
    if ((r->tool_choice == KS_API_TOOLS_REQUIRED || r->tool_choice == KS_API_TOOLS_NAMED) && r->n_tools == 0) {
        BAD("invalid_value", "tool_choice", "'tool_choice' %s needs 'tools'", want ? "naming a function" : "'required'");
        return false;
    }
    if (r->tool_choice == KS_API_TOOLS_REQUIRED || r->tool_choice == KS_API_TOOLS_NAMED) {
        if (r->json_schema) {
            BAD("invalid_value", "tool_choice", "a forced tool call cannot be combined with a JSON response_format");
            return false;
        }
        const cJSON *t;
        int i = 0, hit = -1;
        cJSON_ArrayForEach(t, tools) {
            const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
            if (!want || !strcmp(r->tool_names[i], want)) {
                hit = i;
                if (r->n_tools == 1 || want) /* the schema a single-function call is held to */
                    if (!check_forced_schema(cJSON_GetObjectItemCaseSensitive(f, "parameters"), i, err)) return false;
            }
            i++;
        }
        if (hit < 0) {
            BAD("invalid_value", "tool_choice", "'tool_choice' names '%.64s', which is not in 'tools'", want);
            return false;
        }
        if (want) snprintf(r->tool_name, sizeof r->tool_name, "%s", want);
    }
    return true;
}

static bool parse_prompt(const cJSON *root, ks_api_request *r, ks_api_error *err) {
    const cJSON *p = get_required(root, "prompt", err);
    if (!p) return false;
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 &&
        (cJSON_IsString(p->child) || cJSON_IsArray(p->child)))
        p = p->child; /* a batch of one prompt */
    if (cJSON_IsString(p)) {
        if (!p->valuestring[0]) {
            BAD("invalid_value", "prompt", "'prompt' must not be empty");
            return false;
        }
        r->prompt = ks_strdup(p->valuestring);
        if (!r->prompt) NOMEM("prompt");
        return r->prompt != NULL;
    }
    if (cJSON_IsArray(p)) {
        int n = cJSON_GetArraySize(p);
        if (n == 0) {
            BAD("invalid_value", "prompt", "'prompt' must not be empty");
            return false;
        }
        const cJSON *t;
        bool ids = true;
        cJSON_ArrayForEach(t, p) ids = ids && cJSON_IsNumber(t);
        if (!ids) {
            BAD("unsupported", "prompt",
                "'prompt' must be a string, one string in an array, or an array of token ids (batches of "
                "several prompts are not supported)");
            return false;
        }
        r->prompt_ids = ks_malloc(sizeof(int32_t) * (size_t)n);
        if (!r->prompt_ids) {
            NOMEM("prompt");
            return false;
        }
        cJSON_ArrayForEach(t, p) {
            double d = t->valuedouble;
            if (!isfinite(d) || d != floor(d) || d < 0 || d > 2147483647.0) {
                BAD("invalid_value", "prompt", "token ids must be non-negative integers, got %g", d);
                return false;
            }
            r->prompt_ids[r->n_prompt_ids++] = (int32_t)d;
        }
        return true;
    }
    BAD("invalid_type", "prompt", "'prompt' must be a string or an array of token ids, got %s", type_name(p));
    return false;
}

static bool parse_stop(const cJSON *root, ks_api_request *r, ks_api_error *err) {
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(root, "stop");
    if (!s || cJSON_IsNull(s)) return true;
    if (cJSON_IsString(s)) {
        if (!s->valuestring[0]) {
            BAD("invalid_value", "stop", "stop strings must not be empty");
            return false;
        }
        if (!(r->stops[r->n_stops] = ks_strdup(s->valuestring))) {
            NOMEM("stop");
            return false;
        }
        r->n_stops++;
        return true;
    }
    if (!cJSON_IsArray(s)) {
        BAD("invalid_type", "stop", "'stop' must be a string or an array of strings, got %s", type_name(s));
        return false;
    }
    if (cJSON_GetArraySize(s) > KS_API_MAX_STOPS) {
        BAD("invalid_value", "stop", "at most %d stop strings", KS_API_MAX_STOPS);
        return false;
    }
    const cJSON *t;
    cJSON_ArrayForEach(t, s) {
        if (!cJSON_IsString(t)) {
            BAD("invalid_type", "stop", "'stop' must be an array of strings, found %s", type_name(t));
            return false;
        }
        if (!t->valuestring[0]) {
            BAD("invalid_value", "stop", "stop strings must not be empty");
            return false;
        }
        if (!(r->stops[r->n_stops] = ks_strdup(t->valuestring))) {
            NOMEM("stop");
            return false;
        }
        r->n_stops++;
    }
    return true;
}

/* OpenAI's two shapes: chat takes logprobs (a boolean) and top_logprobs
 * (0..20, only with logprobs true); completions take logprobs as the
 * number of alternatives (0..20; OpenAI allows 5, llama-server more). */
static bool parse_logprobs(const cJSON *root, ks_api_request *r, ks_api_error *err) {
    double d;
    int k;
    if (r->kind == KS_API_CHAT) {
        if (get_bool(root, "logprobs", "logprobs", &r->logprobs, err) < 0) return false;
        if ((k = get_int(root, "top_logprobs", "top_logprobs", 0, 20, &d, err)) < 0) return false;
        if (k > 0) {
            if (!r->logprobs) {
                BAD("invalid_value", "top_logprobs", "'top_logprobs' needs 'logprobs': true");
                return false;
            }
            r->top_logprobs = (int32_t)d;
        }
        return true;
    }
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "logprobs");
    if (cJSON_IsFalse(v)) return true; /* some clients send false for none */
    if ((k = get_int(root, "logprobs", "logprobs", 0, 20, &d, err)) < 0) return false;
    if (k > 0) {
        r->logprobs = true;
        r->top_logprobs = (int32_t)d;
    }
    return true;
}

static bool parse_ext(const cJSON *root, ks_api_request *r, ks_api_error *err) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(root, "kvsieve");
    if (!x || cJSON_IsNull(x)) return true;
    if (!cJSON_IsObject(x)) {
        BAD("invalid_type", "kvsieve", "'kvsieve' must be an object, got %s", type_name(x));
        return false;
    }
    const char *s = NULL;
    int k = get_str(x, "policy", "kvsieve.policy", &s, err);
    if (k < 0) return false;
    if (k > 0) {
        ks_policy_spec spec; /* the name checked by the one parser; the request's spec is made at admission */
        ks_status st = ks_policy_spec_parse(s, NULL, 0, 0, 0, -1, &spec);
        if (st != KS_OK) {
            BAD(st == KS_ERR_NOT_FOUND ? "unknown_policy" : "invalid_value", "kvsieve.policy",
                "%s; or EVICTOR+SELECTOR", ks_last_error());
            return false;
        }
        snprintf(r->policy, sizeof r->policy, "%s", s);
        r->ext_set |= KS_API_EXT_POLICY;
    }
    k = get_str(x, "prefill_policy", "kvsieve.prefill_policy", &s, err);
    if (k < 0) return false;
    if (k > 0) { /* the syntax here (page 1: the weakest budget check); the budget against the page at admission */
        char canon[96];
        if (strlen(s) >= sizeof r->prefill_policy) {
            BAD("invalid_value", "kvsieve.prefill_policy", "'kvsieve.prefill_policy' must be under %zu bytes",
                sizeof r->prefill_policy);
            return false;
        }
        if (ks_prefill_policy_canonical(s, 1, canon, sizeof canon) != KS_OK) {
            BAD("invalid_value", "kvsieve.prefill_policy", "%s (docs/POLICIES.md, \"Sparse prefill\")", ks_last_error());
            return false;
        }
        snprintf(r->prefill_policy, sizeof r->prefill_policy, "%s", s);
        r->ext_set |= KS_API_EXT_PREFILL;
    }
    double d;
    struct {
        const char *key, *param;
        double lo, hi;
        int32_t *dst;
        unsigned bit;
    } ints[] = {
        {"budget", "kvsieve.budget", 0, 1 << 24, &r->budget, KS_API_EXT_BUDGET},
        {"sink", "kvsieve.sink", 0, 1 << 24, &r->sink, KS_API_EXT_SINK},
        {"window", "kvsieve.window", 0, 1 << 24, &r->window, KS_API_EXT_WINDOW},
        {"page", "kvsieve.page", 1, 4096, &r->page, KS_API_EXT_PAGE},
        {"dense_layers", "kvsieve.dense_layers", -1, 1 << 16, &r->dense_layers, KS_API_EXT_DENSE_LAYERS},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        k = get_int(x, ints[i].key, ints[i].param, ints[i].lo, ints[i].hi, &d, err);
        if (k < 0) return false;
        if (k > 0) {
            *ints[i].dst = (int32_t)d;
            r->ext_set |= ints[i].bit;
        }
    }
    if (get_bool(x, "ignore_eos", "kvsieve.ignore_eos", &r->ignore_eos, err) < 0) return false;
    if (get_bool(x, "cache_prompt", "kvsieve.cache_prompt", &r->cache_prompt, err) < 0) return false;
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(x, "policy_args");
    if (a && !cJSON_IsNull(a)) {
        char *dst = r->policy_args;
        size_t cap = sizeof r->policy_args;
        if (cJSON_IsString(a)) {
            if (strlen(a->valuestring) >= cap || !ks_policy_args_valid(a->valuestring)) {
                BAD("invalid_value", "kvsieve.policy_args",
                    "'kvsieve.policy_args' must be \"key=value,key=value\" (under %zu bytes)", cap);
                return false;
            }
            snprintf(dst, cap, "%s", a->valuestring);
        } else if (cJSON_IsObject(a)) {
            const cJSON *kv;
            cJSON_ArrayForEach(kv, a) {
                char val[256];
                if (cJSON_IsString(kv)) snprintf(val, sizeof val, "%s", kv->valuestring);
                else if (cJSON_IsNumber(kv) && isfinite(kv->valuedouble)) snprintf(val, sizeof val, "%.17g", kv->valuedouble);
                else if (cJSON_IsBool(kv)) snprintf(val, sizeof val, "%d", cJSON_IsTrue(kv) ? 1 : 0);
                else {
                    BAD("invalid_type", "kvsieve.policy_args", "policy argument '%s' must be a string, number or boolean",
                        kv->string ? kv->string : "");
                    return false;
                }
                const char *key = kv->string ? kv->string : "";
                if (!*key || strpbrk(key, ",=") || strchr(val, ',') || !*val) {
                    BAD("invalid_value", "kvsieve.policy_args", "bad policy argument '%s'", key);
                    return false;
                }
                size_t used = strlen(dst);
                int w = snprintf(dst + used, cap - used, "%s%s=%s", used ? "," : "", key, val);
                if (w < 0 || (size_t)w >= cap - used) {
                    BAD("invalid_value", "kvsieve.policy_args", "policy arguments too long (at most %zu bytes)", cap - 1);
                    return false;
                }
            }
        } else {
            BAD("invalid_type", "kvsieve.policy_args", "'kvsieve.policy_args' must be a string or an object, got %s",
                type_name(a));
            return false;
        }
        r->ext_set |= KS_API_EXT_ARGS;
    }
    return true;
}

bool ks_api_check_policy_args(const char *policy, const char *args, ks_api_error *err) {
    ks_policy_spec spec;
    if (ks_policy_spec_parse(policy, args, 0, 0, 0, -1, &spec) == KS_OK) return true;
    BAD("invalid_value", "kvsieve.policy_args", "%s (docs/POLICIES.md)", ks_last_error());
    return false;
}

void ks_api_request_free(ks_api_request *r) {
    if (!r) return;
    free(r->model);
    free(r->prompt);
    free(r->prompt_ids);
    for (int32_t i = 0; i < r->n_messages; i++) {
        free(r->messages[i].content);
        free(r->messages[i].tool_calls);
        free(r->messages[i].tool_call_id);
        free(r->messages[i].name);
    }
    free(r->tools);
    for (int32_t i = 0; i < r->n_tools; i++) free(r->tool_names[i]);
    free(r->messages);
    for (int32_t i = 0; i < r->n_stops; i++) free(r->stops[i]);
    free(r->json_schema);
    memset(r, 0, sizeof *r);
}

/* response_format: text, json_object, or json_schema whose schema the
 * sampler enforces (sample/json_constraint.c).  A schema keyword it cannot
 * enforce is refused by name, never ignored. */
static bool parse_response_format(const cJSON *root, ks_api_request *out, ks_api_error *err) {
    const cJSON *rf = cJSON_GetObjectItemCaseSensitive(root, "response_format");
    if (!rf || cJSON_IsNull(rf)) return true;
    if (!cJSON_IsObject(rf)) {
        BAD("invalid_type", "response_format", "'response_format' must be an object, got %s", type_name(rf));
        return false;
    }
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(rf, "type");
    if (!cJSON_IsString(ty)) {
        BAD("missing_required_parameter", "response_format.type",
            "'response_format.type' must be one of text, json_object, json_schema");
        return false;
    }
    if (!strcmp(ty->valuestring, "text")) return true;
    const cJSON *schema = NULL;
    if (!strcmp(ty->valuestring, "json_schema")) {
        const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
        if (!cJSON_IsObject(js)) {
            BAD("missing_required_parameter", "response_format.json_schema",
                "'response_format.json_schema' must be an object with a 'schema'");
            return false;
        }
        schema = cJSON_GetObjectItemCaseSensitive(js, "schema");
        if (!cJSON_IsObject(schema)) {
            BAD("missing_required_parameter", "response_format.json_schema.schema",
                "'response_format.json_schema.schema' must be a JSON Schema object");
            return false;
        }
    } else if (strcmp(ty->valuestring, "json_object")) {
        BAD("invalid_value", "response_format.type", "'response_format.type' must be one of text, json_object, json_schema");
        return false;
    }
    char *text = schema ? cJSON_PrintUnformatted(schema) : NULL;
    if (schema && !text) {
        NOMEM("response_format");
        return false;
    }
    ks_json_schema *cs = NULL;
    char where[256];
    ks_status st = ks_json_schema_compile(text, text ? strlen(text) : 0, &cs, where, sizeof where);
    size_t min_len = cs ? ks_json_schema_min_len(cs) : 0;
    ks_json_schema_destroy(cs);
    if (st != KS_OK) {
        free(text);
        if (st == KS_ERR_NOMEM) NOMEM("response_format");
        else BAD(st == KS_ERR_UNSUPPORTED ? "unsupported" : "invalid_value", "response_format.json_schema.schema",
                 "response_format.json_schema.schema: %s", where);
        return false;
    }
    /* one byte per token at worst: a budget below the shortest document could end it unclosed */
    if (out->max_tokens > 0 && (size_t)out->max_tokens < min_len) {
        free(text);
        BAD("invalid_value", "max_tokens", "max_tokens %d cannot hold the shortest document of the schema (%zu bytes)",
            out->max_tokens, min_len);
        return false;
    }
    out->json_schema = text ? text : ks_strdup("");
    if (!out->json_schema) {
        NOMEM("response_format");
        return false;
    }
    return true;
}

/* The fields a request may carry: every one is read by this parser, except
 * the few OpenAI fields accepted and knowingly ignored because they change
 * nothing about the answer (docs/SERVER.md lists them: user, metadata,
 * store, service_tier; presence_penalty and frequency_penalty are range
 * checked and not applied).  Anything else is a 400 naming it: a misspelt
 * "temprature" would otherwise pass silently with the default. */
static const char *const known_common[] = {
    "model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "min_p", "top_k", "repeat_penalty",
    "repetition_penalty", "seed", "stop", "n", "best_of", "presence_penalty", "frequency_penalty", "logprobs",
    "response_format", "kvsieve", "cache_prompt", "user", "metadata", "store", "service_tier", NULL};
static const char *const known_chat[] = {"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice",
                                         "parallel_tool_calls", NULL};
static const char *const known_completions[] = {"prompt", "echo", "suffix", NULL};
static const char *const known_ext[] = {"policy", "budget", "sink", "window", "page", "dense_layers", "policy_args",
                                        "ignore_eos", "cache_prompt", "prefill_policy", NULL};

static bool in_list(const char *const *list, const char *k) {
    for (; *list; list++)
        if (!strcmp(*list, k)) return true;
    return false;
}

/* The first field of o that no list names: a 400 unknown_parameter. */
static bool check_known(const cJSON *o, const char *prefix, const char *const *a, const char *const *b,
                        ks_api_error *err) {
    const cJSON *f;
    cJSON_ArrayForEach(f, o) {
        const char *k = f->string ? f->string : "";
        if (in_list(a, k) || (b && in_list(b, k))) continue;
        char param[64];
        snprintf(param, sizeof param, "%s%.48s", prefix, k);
        BAD("unknown_parameter", param, "Unrecognized request argument supplied: %s (docs/SERVER.md lists the fields)",
            param);
        return false;
    }
    return true;
}

bool ks_api_parse(const char *body, size_t len, ks_api_kind kind, ks_api_request *out, ks_api_error *err) {
    memset(out, 0, sizeof *out);
    out->kind = kind;
    out->dense_layers = -1;
    const char *end = NULL;
    cJSON *root = body && len ? cJSON_ParseWithLengthOpts(body, len, &end, 0) : NULL;
    if (root && end) { /* only whitespace may follow the value */
        for (const char *p = end; p < body + len; p++)
            if (!(*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) {
                cJSON_Delete(root);
                root = NULL;
                break;
            }
    }
    if (!root) {
        BAD("invalid_json", NULL,
            "the request body is not valid JSON (expected one object, e.g. {\"prompt\": \"...\"})");
        return false;
    }
    bool ok = false;
    if (!cJSON_IsObject(root)) {
        BAD("invalid_json", NULL, "the request body must be a JSON object, got %s", type_name(root));
        goto done;
    }
    const char *s = NULL;
    int k = get_str(root, "model", "model", &s, err);
    if (k < 0) goto done;
    if (k > 0 && !(out->model = ks_strdup(s))) {
        NOMEM("model");
        goto done;
    }
    if (kind == KS_API_CHAT ? !parse_messages(root, out, err) : !parse_prompt(root, out, err)) goto done;
    if (get_bool(root, "stream", "stream", &out->stream, err) < 0) goto done;
    out->cache_prompt = true; /* llama-server's name; kvsieve.cache_prompt below too */
    if (get_bool(root, "cache_prompt", "cache_prompt", &out->cache_prompt, err) < 0) goto done;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so)) {
            BAD("invalid_type", "stream_options", "'stream_options' must be an object, got %s", type_name(so));
            goto done;
        }
        if (get_bool(so, "include_usage", "stream_options.include_usage", &out->include_usage, err) < 0) goto done;
    }
    double d;
    const char *mt = kind == KS_API_CHAT && cJSON_GetObjectItemCaseSensitive(root, "max_completion_tokens")
                         ? "max_completion_tokens" : "max_tokens";
    if ((k = get_int(root, mt, mt, 1, 1 << 24, &d, err)) < 0) goto done;
    if (k > 0) out->max_tokens = (int32_t)d;
    if ((k = get_int(root, "n", "n", 1, 1 << 20, &d, err)) < 0) goto done;
    if (k > 0 && d != 1) {
        BAD("unsupported", "n", "only n = 1 is supported");
        goto done;
    }
    if ((k = get_int(root, "best_of", "best_of", 1, 1 << 20, &d, err)) < 0) goto done;
    if (k > 0 && d != 1) {
        BAD("unsupported", "best_of", "only best_of = 1 is supported");
        goto done;
    }
    struct {
        const char *key;
        double lo;
        bool lo_open;
        double hi;
        bool hi_open;
        float *dst;
        unsigned bit;
    } nums[] = {
        {"temperature", 0, false, 2, false, &out->temperature, KS_API_SET_TEMPERATURE},
        {"top_p", 0, true, 1, false, &out->top_p, KS_API_SET_TOP_P},
        {"min_p", 0, false, 1, true, &out->min_p, KS_API_SET_MIN_P},
        {"repeat_penalty", 0, true, 100, false, &out->repeat_penalty, KS_API_SET_REPEAT_PENALTY},
        {"repetition_penalty", 0, true, 100, false, &out->repeat_penalty, KS_API_SET_REPEAT_PENALTY},
    };
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        if ((k = get_num(root, nums[i].key, nums[i].key, nums[i].lo, nums[i].lo_open, nums[i].hi, nums[i].hi_open,
                         nums[i].dst, err)) < 0)
            goto done;
        if (k > 0) out->set |= nums[i].bit;
    }
    float ignored;
    if (get_num(root, "presence_penalty", "presence_penalty", -2, false, 2, false, &ignored, err) < 0 ||
        get_num(root, "frequency_penalty", "frequency_penalty", -2, false, 2, false, &ignored, err) < 0)
        goto done;
    if ((k = get_int(root, "top_k", "top_k", 0, 1 << 30, &d, err)) < 0) goto done;
    if (k > 0) {
        out->top_k = (int32_t)d;
        out->set |= KS_API_SET_TOP_K;
    }
    if ((k = get_int(root, "seed", "seed", -9007199254740991.0, 9007199254740991.0, &d, err)) < 0) goto done;
    if (k > 0) {
        out->seed = (uint64_t)(int64_t)d;
        out->set |= KS_API_SET_SEED;
    }
    if (!parse_stop(root, out, err)) goto done;
    if (!parse_response_format(root, out, err)) goto done;
    /* asked-for features that are not there: an error, not a silently different answer */
    const cJSON *v;
    if (!parse_logprobs(root, out, err)) goto done;
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "echo")) && cJSON_IsTrue(v)) {
        BAD("unsupported", "echo", "echo is not supported");
        goto done;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "suffix")) && !cJSON_IsNull(v)) {
        BAD("unsupported", "suffix", "suffix (insertion) is not supported");
        goto done;
    }
    if (!parse_tools(root, out, err)) goto done;
    if (get_bool(root, "parallel_tool_calls", "parallel_tool_calls", &(bool){0}, err) < 0) goto done;
    if (!parse_ext(root, out, err)) goto done;
    /* last, so a request missing what it needs says that first */
    if (!check_known(root, "", known_common, kind == KS_API_CHAT ? known_chat : known_completions, err)) goto done;
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(root, "kvsieve");
    if (cJSON_IsObject(x) && !check_known(x, "kvsieve.", known_ext, NULL, err)) goto done;
    ok = true;
done:
    cJSON_Delete(root);
    if (!ok) ks_api_request_free(out);
    return ok;
}
