/*
 * tokenizer_chat.c — a conversation rendered in the chat template a model
 * was trained with.
 *
 * Two renderers, in this order:
 *   1. The GGUF's own tokenizer.chat_template, executed by the Jinja subset
 *      interpreter (jinja.c) with messages, add_generation_prompt = true,
 *      bos_token and eos_token: byte for byte what Hugging Face's
 *      apply_chat_template produces (tests/test_jinja.c checks 67
 *      published templates).  It is parsed once when the tokenizer loads.
 *   2. A built-in family (llama3, ChatML, phi-3, llama2), detected from the
 *      template text or the vocabulary's special tokens: when the GGUF has
 *      no template, when its template does not parse (a warning at load),
 *      or when it fails at run time on something the interpreter lacks (a
 *      warning per request).  A template that rejects the conversation
 *      (raise_exception, e.g. "System role not supported") does not fall
 *      back: its message is the error, KS_ERR_INVALID_ARG.
 * The BOS a template writes first is dropped when the encoder adds one
 * (tokenizer.ggml.add_bos_token), so it is never doubled.
 *
 * What each family follows:
 *   llama3  Meta-Llama-3-Instruct: every message as
 *           <|start_header_id|>ROLE<|end_header_id|>\n\n CONTENT|trim <|eot_id|>.
 *   ChatML  <|im_start|>ROLE\n CONTENT <|im_end|>\n, content verbatim.
 *   phi-3   Phi-3-small / Phi-3.5: <|ROLE|>\n CONTENT <|end|>\n.
 *   llama2  Llama-2-chat: the system text goes into the next user turn as
 *           <<SYS>>\n...\n<</SYS>>\n\n; a user turn is BOS [INST] CONTENT|strip
 *           [/INST], an assistant turn " CONTENT|strip " EOS.
 * Each ends with the generation prompt (the assistant's header; llama2 has
 * none, its user turn ends with [/INST]).  The BOS that starts the prompt is
 * never written: the encoder adds it.
 *
 * The property the prefix cache needs: the rendering of a conversation is
 * the concatenation of its messages' renderings, so turn N's prompt plus
 * the answer (and the end-of-turn marker the model stopped on) is a prefix
 * of turn N+1's prompt.  Every family keeps it, with two caveats the
 * templates themselves impose: llama3 and llama2 trim the content, so an
 * answer with leading or trailing whitespace comes back trimmed, and llama2
 * puts a space before the answer ("[/INST] answer").  An executed template
 * keeps it only as far as the template does (Qwen3's drops earlier turns'
 * <think> blocks, for one): the prefix cache then hits up to where the
 * renderings differ.  Roles are system, user, assistant and tool;
 * developer is the client's business (it maps to system).
 *
 * Tools: a template gets the request's `tools`, and each message its
 * tool_calls, tool_call_id and name, as transformers passes them.  A
 * family (no usable template) has no tool syntax of its own, so tools are
 * written the Hermes way Qwen2.5's template does: a system message listing
 * them, calls as <tool_call> blocks, results as <tool_response> user turns
 * (ks_tokenizer_tool_syntax then says Hermes, the syntax a server parses).
 */
#include "tokenizer/tokenizer_internal.h"

#include <cjson/cJSON.h>
#include <string.h>
#include <time.h>

/* ---------------------------------------------------------------- chat -- */

ks_chat_family ks_tokenizer_chat_family(const ks_tokenizer *t) { return t->chat; }

const char *ks_chat_family_name(ks_chat_family f) {
    switch (f) {
    case KS_CHAT_LLAMA3: return "llama3";
    case KS_CHAT_CHATML: return "chatml";
    case KS_CHAT_LLAMA2: return "llama2";
    case KS_CHAT_PHI3: return "phi3";
    default: return "none";
    }
}

/* A refused allocation sets `refused` and makes later puts no-ops; the
 * renderer checks once at the end. */
typedef struct ks_tok_sb {
    char *p; /* [cap] */
    size_t n, cap;
    bool refused;
} ks_tok_sb;

static void ks_tok_sb_put(ks_tok_sb *b, const char *s, size_t n) {
    if (b->refused) return;
    if (b->n + n + 1 > b->cap) {
        char *p = ks_realloc(b->p, (b->n + n + 1) * 2);
        if (!p) {
            b->refused = true;
            return;
        }
        b->p = p;
        b->cap = (b->n + n + 1) * 2;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}
static void ks_tok_sb_puts(ks_tok_sb *b, const char *s) { ks_tok_sb_put(b, s, strlen(s)); }

static bool ks_tok_is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* s[n] without leading and trailing ASCII whitespace (Jinja's trim and
 * Python's strip, which the templates apply to the content). */
static void ks_tok_sb_put_trimmed(ks_tok_sb *b, const char *s, size_t n) {
    size_t i = 0;
    while (i < n && ks_tok_is_space(s[i])) i++;
    while (n > i && ks_tok_is_space(s[n - 1])) n--;
    ks_tok_sb_put(b, s + i, n - i);
}

static const char *ks_chat_role_name(ks_chat_role r) {
    return r == KS_ROLE_SYSTEM ? "system" : r == KS_ROLE_USER ? "user" : r == KS_ROLE_TOOL ? "tool" : "assistant";
}

/* The families whose messages are all "open ROLE close": the markers
 * around one message, and whether its content is trimmed. */
static void ks_chat_render_uniform(ks_tok_sb *b, ks_chat_family fam, ks_chat_role role, const char *content) {
    const char *rn = ks_chat_role_name(role);
    size_t n = strlen(content);
    switch (fam) {
    case KS_CHAT_LLAMA3:
        ks_tok_sb_puts(b, "<|start_header_id|>");
        ks_tok_sb_puts(b, rn);
        ks_tok_sb_puts(b, "<|end_header_id|>\n\n");
        ks_tok_sb_put_trimmed(b, content, n);
        ks_tok_sb_puts(b, "<|eot_id|>");
        break;
    case KS_CHAT_CHATML:
        ks_tok_sb_puts(b, "<|im_start|>");
        ks_tok_sb_puts(b, rn);
        ks_tok_sb_puts(b, "\n");
        ks_tok_sb_put(b, content, n);
        ks_tok_sb_puts(b, "<|im_end|>\n");
        break;
    default: /* KS_CHAT_PHI3 */
        ks_tok_sb_puts(b, "<|");
        ks_tok_sb_puts(b, rn);
        ks_tok_sb_puts(b, "|>\n");
        ks_tok_sb_put(b, content, n);
        ks_tok_sb_puts(b, "<|end|>\n");
        break;
    }
}

/* llama2: system text waits for the next user turn (several are joined by
 * a newline); a trailing system message with no user turn after it gets an
 * empty user turn of its own rather than being dropped. */
static void ks_chat_render_llama2(ks_tok_sb *b, const char *bos, const char *eos, const ks_chat_message *msgs,
                                  size_t n) {
    ks_tok_sb sys = {0}, turn = {0};
    for (size_t i = 0; i < n; i++) {
        const char *c = msgs[i].content;
        if (msgs[i].role == KS_ROLE_SYSTEM) {
            if (sys.p) ks_tok_sb_puts(&sys, "\n");
            ks_tok_sb_puts(&sys, c);
            if (i + 1 < n) continue;
            c = ""; /* trailing system text: an empty user turn carries it */
        }
        if (msgs[i].role == KS_ROLE_ASSISTANT) {
            ks_tok_sb_puts(b, " ");
            ks_tok_sb_put_trimmed(b, c, strlen(c));
            ks_tok_sb_puts(b, " ");
            ks_tok_sb_puts(b, eos);
            continue;
        }
        turn.n = 0;
        if (sys.p) {
            ks_tok_sb_puts(&turn, "<<SYS>>\n");
            ks_tok_sb_put(&turn, sys.p, sys.n);
            ks_tok_sb_puts(&turn, "\n<</SYS>>\n\n");
            ks_free(sys.p);
            sys = (ks_tok_sb){0};
        }
        ks_tok_sb_puts(&turn, c);
        if (b->n) ks_tok_sb_puts(b, bos); /* the first BOS is the encoder's */
        ks_tok_sb_puts(b, "[INST] ");
        ks_tok_sb_put_trimmed(b, turn.p, turn.n);
        ks_tok_sb_puts(b, " [/INST]");
    }
    if (sys.refused || turn.refused) b->refused = true;
    ks_free(sys.p);
    ks_free(turn.p);
}

ks_status ks_chat_render_family(ks_chat_family fam, const char *bos_text, const char *eos_text,
                                const ks_chat_message *msgs, size_t n_msgs, char *buf, size_t cap,
                                size_t *n_out) {
    if (!n_out || (!msgs && n_msgs) || (!buf && cap)) return KS_FAIL(KS_ERR_INVALID_ARG, "chat: NULL argument");
    if (fam != KS_CHAT_LLAMA3 && fam != KS_CHAT_CHATML && fam != KS_CHAT_PHI3 && fam != KS_CHAT_LLAMA2)
        return KS_FAIL(KS_ERR_UNSUPPORTED, "chat: the model has no known chat template");
    for (size_t i = 0; i < n_msgs; i++) {
        if (!msgs[i].content) return KS_FAIL(KS_ERR_INVALID_ARG, "chat: message %zu has no content", i);
        if (msgs[i].role != KS_ROLE_SYSTEM && msgs[i].role != KS_ROLE_USER && msgs[i].role != KS_ROLE_ASSISTANT)
            return KS_FAIL(KS_ERR_INVALID_ARG, "chat: message %zu has an unknown role %d", i, (int)msgs[i].role);
    }
    ks_tok_sb b = {0};
    ks_tok_sb_put(&b, "", 0);
    if (fam == KS_CHAT_LLAMA2) {
        ks_chat_render_llama2(&b, bos_text ? bos_text : "", eos_text ? eos_text : "", msgs, n_msgs);
    } else {
        for (size_t i = 0; i < n_msgs; i++) ks_chat_render_uniform(&b, fam, msgs[i].role, msgs[i].content);
        ks_tok_sb_puts(&b, fam == KS_CHAT_LLAMA3   ? "<|start_header_id|>assistant<|end_header_id|>\n\n"
                           : fam == KS_CHAT_CHATML ? "<|im_start|>assistant\n"
                                                   : "<|assistant|>\n");
    }
    ks_status st = KS_OK;
    if (b.refused) {
        st = KS_FAIL(KS_ERR_NOMEM, "chat: rendering %zu messages", n_msgs);
    } else if (b.n + 1 > cap) {
        *n_out = b.n + 1;
        st = KS_FAIL(KS_ERR_INVALID_ARG, "chat: prompt needs %zu bytes, buffer has %zu", b.n + 1, cap);
    } else {
        memcpy(buf, b.p, b.n + 1);
        *n_out = b.n;
    }
    ks_free(b.p);
    return st;
}

/* Text of a special token (its vocabulary string), "" when the vocabulary
 * has none; copied into dst[cap]. */
static const char *ks_tok_special_text(const ks_tokenizer *t, int32_t id, char *dst, size_t cap) {
    dst[0] = '\0';
    if (id < 0 || id >= t->n_vocab) return dst;
    size_t n = t->vocab.off[id + 1] - t->vocab.off[id];
    if (n >= cap) return dst;
    memcpy(dst, t->vocab.blob + t->vocab.off[id], n);
    dst[n] = '\0';
    return dst;
}

/* A message's tool_calls for a template: the OpenAI array, with each
 * function's `arguments` (a JSON string on the wire) turned into the
 * object it encodes, since templates iterate it (`arguments.items()`) or
 * write it with tojson (llama.cpp's server does the same).  NULL when the
 * text is not a JSON array (the server has checked it already). */
static cJSON *ks_tok_calls_json(const char *text) {
    cJSON *a = cJSON_Parse(text);
    if (!cJSON_IsArray(a)) {
        cJSON_Delete(a);
        return NULL;
    }
    cJSON *c;
    cJSON_ArrayForEach(c, a) {
        cJSON *f = cJSON_GetObjectItemCaseSensitive(c, "function");
        cJSON *args = f ? cJSON_GetObjectItemCaseSensitive(f, "arguments") : NULL;
        if (!cJSON_IsString(args)) continue;
        cJSON *obj = cJSON_Parse(args->valuestring); /* not JSON: the string stays as it came */
        if (obj && !cJSON_ReplaceItemInObjectCaseSensitive(f, "arguments", obj)) cJSON_Delete(obj);
    }
    return a;
}

/* The conversation as the template's variables: messages (with their
 * tool calls, tool_call_id and name), tools when given, the generation
 * prompt always on (the caller generates the assistant's turn), and the
 * vocabulary's BOS / EOS texts.  Without tools the variable is left
 * undefined, as transformers leaves it. */
static char *ks_tok_chat_vars(const ks_chat_message *msgs, size_t n, const char *tools, const char *bos,
                              const char *eos) {
    cJSON *v = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(v, "messages");
    bool ok = v && arr && cJSON_AddBoolToObject(v, "add_generation_prompt", 1) &&
              cJSON_AddStringToObject(v, "bos_token", bos) && cJSON_AddStringToObject(v, "eos_token", eos);
    if (ok && tools) {
        cJSON *t = cJSON_Parse(tools);
        ok = t && cJSON_AddItemToObject(v, "tools", t);
        if (!ok) cJSON_Delete(t);
    }
    for (size_t i = 0; ok && i < n; i++) {
        cJSON *m = cJSON_CreateObject();
        if (!m || !cJSON_AddItemToArray(arr, m)) {
            cJSON_Delete(m); /* not in the array: still ours */
            ok = false;
            break;
        }
        ok = cJSON_AddStringToObject(m, "role", ks_chat_role_name(msgs[i].role)) &&
             cJSON_AddStringToObject(m, "content", msgs[i].content);
        if (ok && msgs[i].tool_calls) {
            cJSON *c = ks_tok_calls_json(msgs[i].tool_calls);
            ok = c && cJSON_AddItemToObject(m, "tool_calls", c);
            if (!ok) cJSON_Delete(c);
        }
        if (ok && msgs[i].tool_call_id) ok = cJSON_AddStringToObject(m, "tool_call_id", msgs[i].tool_call_id);
        if (ok && msgs[i].name) ok = cJSON_AddStringToObject(m, "name", msgs[i].name);
    }
    char *txt = ok ? cJSON_PrintUnformatted(v) : NULL;
    cJSON_Delete(v);
    return txt;
}

/* The GGUF's template over msgs into *out (ks_malloc'd).  The encoder adds
 * BOS itself when the vocabulary asks for it, so a BOS the template writes
 * first is dropped then (it would be doubled otherwise, which llama.cpp
 * warns about for the same reason). */
static ks_status ks_tok_render_template(const ks_tokenizer *t, const char *bos, const char *eos,
                                        const ks_chat_message *msgs, size_t n, const char *tools, char **out,
                                        size_t *n_out) {
    char *vars = ks_tok_chat_vars(msgs, n, tools, bos, eos);
    if (!vars) return KS_FAIL(KS_ERR_NOMEM, "chat: the template's variables for %zu messages", n);
    char *txt = NULL;
    size_t len = 0;
    ks_status st = ks_jinja_render(t->chat_tmpl, vars, strlen(vars), (int64_t)time(NULL), &txt, &len);
    cJSON_free(vars);
    if (st != KS_OK) return st;
    size_t nb = strlen(bos);
    if (t->add_bos && nb && len >= nb && memcmp(txt, bos, nb) == 0) {
        memmove(txt, txt + nb, len - nb + 1);
        len -= nb;
    }
    *out = txt;
    *n_out = len;
    return KS_OK;
}

ks_status ks_tokenizer_chat_render(const ks_tokenizer *t, const ks_chat_message *msgs, size_t n_msgs, char *buf,
                                   size_t cap, size_t *n_out) {
    return ks_tokenizer_chat_render_tools(t, msgs, n_msgs, NULL, buf, cap, n_out);
}

/* The Hermes convention (Qwen2.5's template words it so) for a family
 * without tool syntax of its own: the tools as a system message (after the
 * caller's first system message, if any), an assistant's calls as
 * <tool_call>{"name", "arguments"}</tool_call> after its text, a tool
 * result as a user turn in <tool_response> tags.  *out: messages whose
 * contents point into *arena (both ks_malloc'd; the caller frees). */
static ks_status ks_tok_tools_to_hermes(const ks_chat_message *msgs, size_t n, const char *tools,
                                        ks_chat_message **out, size_t *n_out, char ***arena) {
    ks_chat_message *m = ks_calloc(n + 1, sizeof *m);
    char **keep = ks_calloc(n + 1, sizeof *keep);
    if (!m || !keep) {
        ks_free(m);
        ks_free(keep);
        return KS_FAIL(KS_ERR_NOMEM, "chat: tools for %zu messages", n);
    }
    size_t k = 0, kk = 0, i = 0;
    bool refused = false;
    if (tools) {
        ks_tok_sb b = {0};
        if (n && msgs[0].role == KS_ROLE_SYSTEM) {
            ks_tok_sb_puts(&b, msgs[0].content);
            ks_tok_sb_puts(&b, "\n\n");
            i = 1;
        }
        ks_tok_sb_puts(&b, "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                           "You are provided with function signatures within <tools></tools> XML tags:\n<tools>");
        cJSON *ta = cJSON_Parse(tools), *t;
        cJSON_ArrayForEach(t, ta) {
            char *js = cJSON_PrintUnformatted(t);
            ks_tok_sb_puts(&b, "\n");
            if (js) ks_tok_sb_puts(&b, js);
            else b.refused = true;
            cJSON_free(js);
        }
        cJSON_Delete(ta);
        ks_tok_sb_puts(&b, "\n</tools>\n\nFor each function call, return a json object with function name and "
                           "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
                           "<function-name>, \"arguments\": <args-json-object>}\n</tool_call>");
        refused |= b.refused;
        keep[kk++] = b.p;
        m[k++] = (ks_chat_message){.role = KS_ROLE_SYSTEM, .content = b.p ? b.p : ""};
    }
    for (; i < n; i++) {
        ks_chat_message x = msgs[i];
        x.tool_calls = x.tool_call_id = x.name = NULL;
        ks_tok_sb b = {0};
        if (msgs[i].role == KS_ROLE_TOOL) {
            ks_tok_sb_puts(&b, "<tool_response>\n");
            ks_tok_sb_puts(&b, msgs[i].content);
            ks_tok_sb_puts(&b, "\n</tool_response>");
            x.role = KS_ROLE_USER;
        } else if (msgs[i].role == KS_ROLE_ASSISTANT && msgs[i].tool_calls) {
            ks_tok_sb_puts(&b, msgs[i].content);
            cJSON *ca = ks_tok_calls_json(msgs[i].tool_calls), *c;
            cJSON_ArrayForEach(c, ca) {
                cJSON *f = cJSON_GetObjectItemCaseSensitive(c, "function");
                cJSON *nm = cJSON_GetObjectItemCaseSensitive(f, "name");
                cJSON *args = cJSON_GetObjectItemCaseSensitive(f, "arguments");
                char *a = args ? cJSON_PrintUnformatted(args) : NULL, *nj = NULL;
                cJSON *ns = cJSON_CreateString(cJSON_IsString(nm) ? nm->valuestring : "");
                nj = ns ? cJSON_PrintUnformatted(ns) : NULL;
                cJSON_Delete(ns);
                if (b.n) ks_tok_sb_puts(&b, "\n");
                ks_tok_sb_puts(&b, "<tool_call>\n{\"name\": ");
                ks_tok_sb_puts(&b, nj ? nj : "\"\"");
                ks_tok_sb_puts(&b, ", \"arguments\": ");
                ks_tok_sb_puts(&b, a ? a : "{}");
                ks_tok_sb_puts(&b, "}\n</tool_call>");
                cJSON_free(a);
                cJSON_free(nj);
            }
            cJSON_Delete(ca);
        } else {
            m[k++] = x;
            continue;
        }
        refused |= b.refused;
        keep[kk++] = b.p;
        x.content = b.p ? b.p : "";
        m[k++] = x;
    }
    *out = m;
    *n_out = k;
    *arena = keep;
    if (refused) return KS_FAIL(KS_ERR_NOMEM, "chat: tools for %zu messages", n);
    return KS_OK;
}

static void ks_tok_arena_free(ks_chat_message *m, char **arena, size_t n) {
    for (size_t i = 0; arena && i <= n; i++) ks_free(arena[i]);
    ks_free(arena);
    ks_free(m);
}

ks_status ks_tokenizer_chat_render_tools(const ks_tokenizer *t, const ks_chat_message *msgs, size_t n_msgs,
                                         const char *tools, char *buf, size_t cap, size_t *n_out) {
    if (!t || !n_out || (!msgs && n_msgs) || (!buf && cap)) return KS_FAIL(KS_ERR_INVALID_ARG, "chat: NULL argument");
    char bos[64], eos[64];
    ks_tok_special_text(t, t->bos, bos, sizeof bos);
    ks_tok_special_text(t, t->eos, eos, sizeof eos);
    if (t->chat_tmpl) {
        for (size_t i = 0; i < n_msgs; i++) {
            if (!msgs[i].content) return KS_FAIL(KS_ERR_INVALID_ARG, "chat: message %zu has no content", i);
            if (msgs[i].role != KS_ROLE_SYSTEM && msgs[i].role != KS_ROLE_USER && msgs[i].role != KS_ROLE_ASSISTANT &&
                msgs[i].role != KS_ROLE_TOOL)
                return KS_FAIL(KS_ERR_INVALID_ARG, "chat: message %zu has an unknown role %d", i, (int)msgs[i].role);
        }
        char *txt = NULL;
        size_t len = 0;
        ks_status st = ks_tok_render_template(t, bos, eos, msgs, n_msgs, tools, &txt, &len);
        if (st == KS_OK) {
            if (len + 1 > cap) {
                *n_out = len + 1;
                st = KS_FAIL(KS_ERR_INVALID_ARG, "chat: prompt needs %zu bytes, buffer has %zu", len + 1, cap);
            } else {
                memcpy(buf, txt, len + 1);
                *n_out = len;
            }
            ks_free(txt);
            return st;
        }
        /* A template that parsed but fails at run time on something this
         * interpreter lacks falls back to the built-in family, loudly; one
         * that rejects the conversation (raise_exception: INVALID_ARG) or
         * ran out of memory is the answer. */
        if (st != KS_ERR_FORMAT || t->chat == KS_CHAT_NONE) return st;
        KS_LOG(WARN, "chat: the GGUF's template failed (%s); using the built-in %s format", ks_last_error(),
               ks_chat_family_name(t->chat));
    }
    bool any_tool = tools != NULL;
    for (size_t i = 0; i < n_msgs; i++) {
        if (!msgs[i].content) return KS_FAIL(KS_ERR_INVALID_ARG, "chat: message %zu has no content", i);
        any_tool = any_tool || msgs[i].role == KS_ROLE_TOOL || msgs[i].tool_calls;
    }
    if (!any_tool || t->chat == KS_CHAT_NONE) return ks_chat_render_family(t->chat, bos, eos, msgs, n_msgs, buf, cap, n_out);
    ks_chat_message *m = NULL;
    char **arena = NULL;
    size_t n = 0;
    ks_status st = ks_tok_tools_to_hermes(msgs, n_msgs, tools, &m, &n, &arena);
    if (st == KS_OK) st = ks_chat_render_family(t->chat, bos, eos, m, n, buf, cap, n_out);
    ks_tok_arena_free(m, arena, n_msgs);
    return st;
}

ks_status ks_tokenizer_chat_format(const ks_tokenizer *t, const char *system, const char *user, char *buf,
                                   size_t cap, size_t *n_out) {
    if (!t || !user || !n_out || (!buf && cap)) return KS_FAIL(KS_ERR_INVALID_ARG, "chat: NULL argument");
    ks_chat_message m[2];
    size_t n = 0;
    if (system && system[0]) m[n++] = (ks_chat_message){.role = KS_ROLE_SYSTEM, .content = system};
    m[n++] = (ks_chat_message){.role = KS_ROLE_USER, .content = user};
    return ks_tokenizer_chat_render(t, m, n, buf, cap, n_out);
}
