/*
 * toolcall.c — tool-call syntaxes parsed into calls, and forced calls
 * (toolcall.h).
 *
 * Each syntax is read as its template writes it (the published templates
 * in tests/fixtures/templates/ render an assistant's tool_calls that way,
 * and models answer in the form they were trained on):
 *   Hermes   (Qwen2.5/3, Hermes 2/3)  <tool_call>\n{"name": N, "arguments": {...}}\n</tool_call>, repeated
 *   Llama 3  (3.1-3.3)  the answer is {"name": N, "parameters": {...}} (several joined by ';'),
 *            or such JSON after <|python_tag|>
 *   Mistral  [TOOL_CALLS][{"name": N, "arguments": {...}}, ...]  (v3), or
 *            [TOOL_CALLS]N[ARGS]{...} repeated (v11+, Devstral, Mistral Small 3.2)
 *   harmony  (gpt-oss)  ...to=functions.N ... <|message|>{...}<|call|>; the content
 *            is the final channel's message
 *   DeepSeek <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>N\n```json\n{...}\n```<｜tool▁call▁end｜>...
 *            (V3, R1), or <｜tool▁call▁begin｜>N<｜tool▁sep｜>{...}<｜tool▁call▁end｜> (V3.1+)
 *   generic  a bare {"name": N, "arguments": {...}} (the forced form for a syntax
 *            that cannot put the choice of function inside JSON)
 * JSON values are found with cJSON's parse-end pointer, so a brace inside a
 * string never confuses the scan.
 */
#define _GNU_SOURCE
#include "server/toolcall.h"

#include "core/core.h"
#include "sched/buf.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#define DS_CALLS_BEGIN "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_CALLS_END "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_CALL_BEGIN "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_CALL_END "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_SEP "<\xef\xbd\x9ctool\xe2\x96\x81" "sep\xef\xbd\x9c>"

const char *ks_tool_syntax_name(ks_tool_syntax syn) {
    switch (syn) {
    case KS_TOOLS_HERMES: return "hermes";
    case KS_TOOLS_LLAMA3: return "llama3";
    case KS_TOOLS_MISTRAL: return "mistral";
    case KS_TOOLS_HARMONY: return "harmony";
    case KS_TOOLS_DEEPSEEK: return "deepseek";
    default: return "generic";
    }
}

/* ------------------------------------------------------------ scanning -- */

typedef struct scan {
    const char *p, *end;
} scan;

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static void skip_ws(scan *s) {
    while (s->p < s->end && is_ws(*s->p)) s->p++;
}
static bool at_end(scan *s) {
    skip_ws(s);
    return s->p == s->end;
}
/* s begins with lit (then consumed) */
static bool eat(scan *s, const char *lit) {
    size_t n = strlen(lit);
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, lit, n)) return false;
    s->p += n;
    return true;
}
/* The first occurrence of lit at or after s->p, or NULL. */
static const char *find(const scan *s, const char *lit) {
    size_t n = strlen(lit);
    if (!n || (size_t)(s->end - s->p) < n) return NULL;
    return memmem(s->p, (size_t)(s->end - s->p), lit, n);
}
/* One JSON value after optional whitespace (NULL when there is none). */
static cJSON *json_value(scan *s) {
    skip_ws(s);
    if (s->p == s->end) return NULL;
    const char *after = NULL;
    cJSON *v = cJSON_ParseWithLengthOpts(s->p, (size_t)(s->end - s->p), &after, 0);
    if (v && after) s->p = after;
    return v;
}

/* The raw text of member key of the JSON object at [p, end) (already
 * parsed once, so well formed), into [*vs, *ve); false if absent.  The
 * arguments are passed on as the model wrote them: printing them again
 * from doubles would turn a long integer into 2.2e+23. */
static bool raw_member(const char *p, const char *end, const char *key, const char **vs, const char **ve) {
    scan s = {p, end};
    skip_ws(&s);
    if (!eat(&s, "{")) return false;
    for (;;) {
        skip_ws(&s);
        if (s.p >= s.end || *s.p != '"') return false;
        cJSON *k = json_value(&s);
        bool hit = cJSON_IsString(k) && !strcmp(k->valuestring, key);
        cJSON_Delete(k);
        skip_ws(&s);
        if (!eat(&s, ":")) return false;
        skip_ws(&s);
        const char *start = s.p;
        cJSON *v = json_value(&s);
        if (!v) return false;
        cJSON_Delete(v);
        if (hit) {
            *vs = start;
            *ve = s.p;
            return true;
        }
        skip_ws(&s);
        if (!eat(&s, ",")) return false;
    }
}

/* ----------------------------------------------------------- the calls -- */

typedef struct calls {
    ks_tool_call *v;
    int32_t n, cap;
    bool bad;     /* malformed: the answer stays text */
    bool refused; /* an allocation failed */
    const char *const *names;
    int32_t n_names;
} calls;

static bool known_name(const calls *c, const char *name, size_t len) {
    for (int32_t i = 0; i < c->n_names; i++)
        if (strlen(c->names[i]) == len && !memcmp(c->names[i], name, len)) return true;
    return false;
}

/* A call of function name[len] with args (an object, or a string holding
 * one); anything else marks the answer malformed. */
static void add_call(calls *c, const char *name, size_t len, const cJSON *args, const char *raw, const char *raw_end) {
    if (c->bad || c->refused) return;
    cJSON *parsed = NULL;
    if (cJSON_IsString(args)) {
        raw = args->valuestring;
        raw_end = raw + strlen(raw);
        args = parsed = cJSON_Parse(raw);
    }
    if (!cJSON_IsObject(args) || !known_name(c, name, len)) {
        cJSON_Delete(parsed);
        c->bad = true;
        return;
    }
    char *a = NULL;
    if (raw && raw_end > raw) {
        size_t n = (size_t)(raw_end - raw);
        while (n && is_ws(raw[n - 1])) n--;
        if ((a = malloc(n + 1))) {
            memcpy(a, raw, n);
            a[n] = 0;
        }
    } else {
        a = cJSON_PrintUnformatted(args);
    }
    cJSON_Delete(parsed);
    char *nm = ks_malloc(len + 1);
    if (c->n == c->cap) {
        int32_t cap = c->cap ? c->cap * 2 : 4;
        ks_tool_call *v = ks_realloc(c->v, sizeof *v * (size_t)cap);
        if (v) {
            c->v = v;
            c->cap = cap;
        }
    }
    if (!a || !nm || c->n == c->cap) {
        free(a);
        free(nm);
        c->refused = true;
        return;
    }
    memcpy(nm, name, len);
    nm[len] = 0;
    c->v[c->n++] = (ks_tool_call){nm, a};
}

/* {"name": N, key: {...}} (key: "arguments", or "parameters" too when
 * alt is set). */
static void add_call_object(calls *c, const cJSON *o, bool alt, const char *raw, const char *raw_end) {
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(o, "name");
    const char *key = "arguments";
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!args && alt) args = cJSON_GetObjectItemCaseSensitive(o, key = "parameters");
    if (!cJSON_IsObject(o) || !cJSON_IsString(nm)) {
        c->bad = true;
        return;
    }
    const char *vs = NULL, *ve = NULL;
    if (!raw || !raw_member(raw, raw_end, key, &vs, &ve)) vs = ve = NULL;
    add_call(c, nm->valuestring, strlen(nm->valuestring), args, vs, ve);
}

/* A JSON value at s, with where its text began. */
static cJSON *json_value_at(scan *s, const char **start) {
    skip_ws(s);
    *start = s->p;
    return json_value(s);
}

/* ------------------------------------------------------------- syntaxes -- */

static void parse_hermes(scan s, calls *c, ks_sbuf *content) {
    const char *at;
    while ((at = find(&s, "<tool_call>"))) {
        ks_sbuf_put(content, s.p, (size_t)(at - s.p));
        s.p = at + strlen("<tool_call>");
        const char *st;
        cJSON *o = json_value_at(&s, &st);
        add_call_object(c, o, false, st, s.p);
        cJSON_Delete(o);
        skip_ws(&s);
        if (!eat(&s, "</tool_call>") && !at_end(&s)) c->bad = true; /* an unclosed call is fine only at the end */
        if (c->bad) return;
    }
    ks_sbuf_put(content, s.p, (size_t)(s.end - s.p));
}

/* JSON objects separated by ';' or whitespace up to the end. */
static void parse_json_list(scan s, calls *c, bool alt) {
    while (!at_end(&s)) {
        if (*s.p != '{') {
            c->bad = true;
            return;
        }
        const char *st;
        cJSON *o = json_value_at(&s, &st);
        add_call_object(c, o, alt, st, s.p);
        cJSON_Delete(o);
        if (c->bad) return;
        skip_ws(&s);
        if (s.p < s.end && *s.p == ';') s.p++;
    }
}

static void parse_llama3(scan s, calls *c, ks_sbuf *content, bool alt) {
    const char *at = find(&s, "<|python_tag|>");
    if (at) {
        ks_sbuf_put(content, s.p, (size_t)(at - s.p));
        s.p = at + strlen("<|python_tag|>");
        parse_json_list(s, c, true);
        return;
    }
    scan t = s;
    skip_ws(&t);
    if (t.p < t.end && *t.p == '{') parse_json_list(t, c, alt);
    else ks_sbuf_put(content, s.p, (size_t)(s.end - s.p)); /* not a call: text */
}

static void parse_mistral(scan s, calls *c, ks_sbuf *content) {
    const char *at = find(&s, "[TOOL_CALLS]");
    if (!at) {
        ks_sbuf_put(content, s.p, (size_t)(s.end - s.p));
        return;
    }
    ks_sbuf_put(content, s.p, (size_t)(at - s.p));
    s.p = at + strlen("[TOOL_CALLS]");
    skip_ws(&s);
    if (s.p < s.end && *s.p == '[') { /* v3: a JSON array of calls */
        cJSON *a = json_value(&s), *o;
        if (!cJSON_IsArray(a) || !cJSON_GetArraySize(a)) c->bad = true;
        cJSON_ArrayForEach(o, a) add_call_object(c, o, false, NULL, NULL); /* printed again: no spans inside an array */
        cJSON_Delete(a);
        eat(&s, "</s>");
        if (!at_end(&s)) c->bad = true;
        return;
    }
    for (;;) { /* v11: NAME[ARGS]{...}, optionally NAME[CALL_ID]id[ARGS]{...}, each after [TOOL_CALLS] */
        const char *args = find(&s, "[ARGS]");
        if (!args) {
            c->bad = true;
            return;
        }
        const char *name_end = args, *cid = memmem(s.p, (size_t)(args - s.p), "[CALL_ID]", 9);
        if (cid) name_end = cid;
        scan nm = {s.p, name_end};
        while (nm.end > nm.p && is_ws(nm.end[-1])) nm.end--;
        skip_ws(&nm);
        s.p = args + strlen("[ARGS]");
        const char *st;
        cJSON *o = json_value_at(&s, &st);
        add_call(c, nm.p, (size_t)(nm.end - nm.p), o, st, s.p);
        cJSON_Delete(o);
        if (c->bad) return;
        skip_ws(&s);
        if (!eat(&s, "[TOOL_CALLS]")) break;
    }
    eat(&s, "</s>");
    if (!at_end(&s)) c->bad = true;
}

/* harmony: every "to=functions.NAME" header starts a call whose arguments
 * are the JSON after the next <|message|>; the content is the final
 * channel's message, when the answer has one. */
static void parse_harmony(scan s, calls *c, ks_sbuf *content) {
    scan f = s;
    const char *fin = find(&f, "<|channel|>final");
    if (fin) {
        f.p = fin;
        const char *msg = find(&f, "<|message|>");
        if (msg) {
            f.p = msg + strlen("<|message|>");
            const char *e = find(&f, "<|end|>"), *r = find(&f, "<|return|>");
            if (!e || (r && r < e)) e = r;
            ks_sbuf_put(content, f.p, (size_t)((e ? e : f.end) - f.p));
        }
    }
    const char *at;
    bool any = false;
    while ((at = find(&s, "to=functions."))) {
        any = true;
        s.p = at + strlen("to=functions.");
        const char *nm = s.p;
        while (s.p < s.end && !is_ws(*s.p) && *s.p != '<') s.p++;
        size_t nlen = (size_t)(s.p - nm);
        const char *msg = find(&s, "<|message|>");
        if (!msg) {
            c->bad = true;
            return;
        }
        s.p = msg + strlen("<|message|>");
        const char *st;
        cJSON *o = json_value_at(&s, &st);
        add_call(c, nm, nlen, o, st, s.p);
        cJSON_Delete(o);
        if (c->bad) return;
        skip_ws(&s);
        eat(&s, "<|call|>");
    }
    if (!any && !fin) ks_sbuf_put(content, s.p, (size_t)(s.end - s.p));
}

static void parse_deepseek(scan s, calls *c, ks_sbuf *content) {
    const char *at = find(&s, DS_CALLS_BEGIN);
    if (!at) {
        ks_sbuf_put(content, s.p, (size_t)(s.end - s.p));
        return;
    }
    ks_sbuf_put(content, s.p, (size_t)(at - s.p));
    s.p = at + strlen(DS_CALLS_BEGIN);
    for (;;) {
        skip_ws(&s);
        if (!eat(&s, DS_CALL_BEGIN)) break;
        const char *sep = find(&s, DS_SEP);
        if (!sep) {
            c->bad = true;
            return;
        }
        const char *nm = s.p;
        size_t nlen = (size_t)(sep - s.p);
        s.p = sep + strlen(DS_SEP);
        bool fenced = nlen == 8 && !memcmp(nm, "function", 8); /* V3 / R1: function<sep>NAME\n```json ... ``` */
        if (fenced) {
            nm = s.p;
            while (s.p < s.end && *s.p != '\n') s.p++;
            nlen = (size_t)(s.p - nm);
            skip_ws(&s);
            if (!eat(&s, "```json")) {
                c->bad = true;
                return;
            }
        }
        const char *st;
        cJSON *o = json_value_at(&s, &st);
        add_call(c, nm, nlen, o, st, s.p);
        cJSON_Delete(o);
        if (c->bad) return;
        skip_ws(&s);
        if (fenced && !eat(&s, "```")) {
            c->bad = true;
            return;
        }
        skip_ws(&s);
        if (!eat(&s, DS_CALL_END) && !at_end(&s)) {
            c->bad = true;
            return;
        }
    }
    skip_ws(&s);
    eat(&s, DS_CALLS_END);
    eat(&s, "<\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>");
    if (!at_end(&s)) c->bad = true;
}

void ks_tool_parsed_free(ks_tool_parsed *p) {
    if (!p) return;
    free(p->content);
    for (int32_t i = 0; i < p->n_calls; i++) {
        free(p->calls[i].name);
        free(p->calls[i].arguments);
    }
    free(p->calls);
    memset(p, 0, sizeof *p);
}

static char *trimmed_copy(const char *s, size_t n) {
    while (n && is_ws(*s)) s++, n--;
    while (n && is_ws(s[n - 1])) n--;
    char *o = ks_malloc(n + 1);
    if (o) {
        memcpy(o, s, n);
        o[n] = 0;
    }
    return o;
}

bool ks_tool_parse(ks_tool_syntax syn, const char *text, size_t len, const char *const *names, int32_t n_names,
                   ks_tool_parsed *out) {
    memset(out, 0, sizeof *out);
    if (!text) len = 0;
    scan s = {text ? text : "", (text ? text : "") + len};
    calls c = {.names = names, .n_names = n_names};
    ks_sbuf content = {0};
    switch (syn) {
    case KS_TOOLS_HERMES: parse_hermes(s, &c, &content); break;
    case KS_TOOLS_LLAMA3: parse_llama3(s, &c, &content, true); break;
    case KS_TOOLS_MISTRAL: parse_mistral(s, &c, &content); break;
    case KS_TOOLS_HARMONY: parse_harmony(s, &c, &content); break;
    case KS_TOOLS_DEEPSEEK: parse_deepseek(s, &c, &content); break;
    default: parse_llama3(s, &c, &content, false); break;
    }
    bool ok = !c.refused && !content.refused;
    if (ok && c.n > 0 && !c.bad) {
        out->calls = c.v;
        out->n_calls = c.n;
        c.v = NULL;
        c.n = 0;
        if (content.n) {
            out->content = trimmed_copy(content.p, content.n);
            ok = out->content != NULL;
            if (ok && !out->content[0]) {
                free(out->content);
                out->content = NULL;
            }
        }
    } else if (ok) { /* no calls, or a malformed one: the answer is text */
        out->content = ks_malloc(len + 1);
        ok = out->content != NULL;
        if (ok) {
            memcpy(out->content, s.p, len);
            out->content[len] = 0;
        }
    }
    for (int32_t i = 0; i < c.n; i++) {
        free(c.v[i].name);
        free(c.v[i].arguments);
    }
    free(c.v);
    free(content.p);
    if (!ok) ks_tool_parsed_free(out);
    return ok;
}

/* ------------------------------------------------------------ streaming -- */

/* The offset of the first occurrence of marker, or of the suffix of text
 * that is a proper prefix of it (the marker may be arriving); len if none. */
static size_t marker_cut(const char *text, size_t len, const char *marker) {
    size_t m = strlen(marker);
    const char *at = memmem(text, len, marker, m);
    if (at) return (size_t)(at - text);
    for (size_t k = m - 1; k > 0; k--)
        if (k <= len && !memcmp(text + len - k, marker, k)) return len - k;
    return len;
}

size_t ks_tool_stream_safe(ks_tool_syntax syn, const char *text, size_t len) {
    if (syn == KS_TOOLS_HARMONY) return 0; /* channels: the content is known at the end */
    if (syn == KS_TOOLS_LLAMA3 || syn == KS_TOOLS_GENERIC) {
        size_t i = 0;
        while (i < len && is_ws(text[i])) i++;
        if (i == len || text[i] == '{') return 0; /* a JSON call may be coming */
        return syn == KS_TOOLS_LLAMA3 ? marker_cut(text, len, "<|python_tag|>") : len;
    }
    const char *marker = syn == KS_TOOLS_HERMES    ? "<tool_call>"
                         : syn == KS_TOOLS_MISTRAL ? "[TOOL_CALLS]"
                                                   : DS_CALLS_BEGIN;
    return marker_cut(text, len, marker);
}

/* ---------------------------------------------------------- forced call -- */

bool ks_tool_forced(ks_tool_syntax syn, const char *tools, const char *name, char **opener, char **schema,
                    char **closer, ks_tool_syntax *parse_as) {
    *opener = *schema = *closer = NULL;
    cJSON *ta = cJSON_Parse(tools), *t;
    if (!cJSON_IsArray(ta)) {
        cJSON_Delete(ta);
        return false;
    }
    /* the functions that may be called, and the arguments' schema: the
     * function's own when there is one function to call, else any object
     * (the subset the constraint enforces has no anyOf to tie a schema to
     * a name) */
    cJSON *sch = cJSON_CreateObject(), *props = cJSON_AddObjectToObject(sch, "properties");
    cJSON *names = cJSON_CreateArray(), *params = NULL;
    const char *only = name;
    int n = 0;
    cJSON_ArrayForEach(t, ta) {
        cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        cJSON *nm = cJSON_GetObjectItemCaseSensitive(f, "name");
        if (!cJSON_IsString(nm) || (name && strcmp(nm->valuestring, name))) continue;
        cJSON_AddItemToArray(names, cJSON_CreateString(nm->valuestring));
        params = cJSON_GetObjectItemCaseSensitive(f, "parameters");
        only = nm->valuestring;
        n++;
    }
    cJSON *args = n == 1 && cJSON_IsObject(params) ? cJSON_Duplicate(params, true) : cJSON_CreateObject();
    if (args && !cJSON_GetObjectItemCaseSensitive(args, "type")) cJSON_AddStringToObject(args, "type", "object");
    bool by_name = n == 1 && (syn == KS_TOOLS_HARMONY || syn == KS_TOOLS_DEEPSEEK); /* the name is outside the JSON */
    if (!by_name && (syn == KS_TOOLS_HARMONY || syn == KS_TOOLS_DEEPSEEK)) syn = KS_TOOLS_GENERIC;
    *parse_as = syn;
    const char *key = syn == KS_TOOLS_LLAMA3 ? "parameters" : "arguments";
    char *js = NULL;
    if (by_name) {
        js = args ? cJSON_PrintUnformatted(args) : NULL;
    } else {
        cJSON_AddStringToObject(sch, "type", "object");
        cJSON *nmo = cJSON_AddObjectToObject(props, "name");
        if (nmo) cJSON_AddItemToObject(nmo, "enum", names);
        else cJSON_Delete(names);
        names = NULL;
        cJSON_AddItemToObject(props, key, args);
        args = NULL;
        cJSON *req = cJSON_AddArrayToObject(sch, "required");
        cJSON_AddItemToArray(req, cJSON_CreateString("name"));
        cJSON_AddItemToArray(req, cJSON_CreateString(key));
        cJSON_AddFalseToObject(sch, "additionalProperties");
        js = cJSON_PrintUnformatted(sch);
    }
    ks_sbuf op = {0}, cl = {0};
    ks_sbuf_put(&op, "", 0);
    ks_sbuf_put(&cl, "", 0);
    switch (syn) {
    case KS_TOOLS_HERMES:
        ks_sbuf_puts(&op, "<tool_call>\n");
        ks_sbuf_puts(&cl, "\n</tool_call>");
        break;
    case KS_TOOLS_MISTRAL:
        ks_sbuf_puts(&op, "[TOOL_CALLS][");
        ks_sbuf_puts(&cl, "]");
        break;
    case KS_TOOLS_HARMONY:
        ks_sbuf_printf(&op, "<|channel|>commentary to=functions.%s <|constrain|>json<|message|>", only);
        ks_sbuf_puts(&cl, "<|call|>");
        break;
    case KS_TOOLS_DEEPSEEK:
        ks_sbuf_printf(&op, DS_CALLS_BEGIN DS_CALL_BEGIN "function" DS_SEP "%s\n```json\n", only);
        ks_sbuf_puts(&cl, "\n```" DS_CALL_END DS_CALLS_END);
        break;
    default: break; /* Llama 3, generic: the JSON alone */
    }
    cJSON_Delete(args);
    cJSON_Delete(names);
    cJSON_Delete(sch);
    cJSON_Delete(ta);
    bool ok = js && n > 0 && !op.refused && !cl.refused;
    if (!ok) {
        cJSON_free(js);
        free(op.p);
        free(cl.p);
        return false;
    }
    *schema = js;
    *opener = op.p;
    *closer = cl.p;
    return true;
}
