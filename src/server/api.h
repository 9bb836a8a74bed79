/*
 * api.h — the OpenAI-compatible request body: parsing, validation and error
 * objects, apart from any HTTP or engine state.
 *
 * The body of a completion request is the first thing an untrusted client
 * controls, so its parser is one pure function (bytes in, a plain struct or
 * an error out) that a fuzzer can drive directly (tests/fuzz/fuzz_request.c).
 * It checks everything that does not need the model: JSON syntax, the type
 * of every known field, ranges, the required fields, the `kvsieve`
 * extension object (policy names against the registry, policy-argument
 * syntax).  What needs the model (token counts against the context) or the
 * server's defaults (policy arguments against the effective policy) is
 * checked by the server afterwards, with the same error objects.
 *
 * Unknown fields are ignored, as OpenAI's own server does; known fields of
 * the wrong type are errors.  Fields that ask for something not implemented
 * (n > 1, echo, suffix, best_of > 1) are errors rather than silently
 * different answers.  `tools` and `tool_choice` are checked here (names,
 * types, the parameters schema a forced call is constrained to); the
 * calls themselves are parsed from the answer by toolcall.c.
 */
#ifndef KS_SERVER_API_H
#define KS_SERVER_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ks_api_kind { KS_API_COMPLETIONS = 0, KS_API_CHAT = 1 } ks_api_kind;

enum { KS_API_MAX_STOPS = 16 };

/* bits of ks_api_request.set: sampling fields the request gave */
enum {
    KS_API_SET_TEMPERATURE = 1 << 0,
    KS_API_SET_TOP_P = 1 << 1,
    KS_API_SET_TOP_K = 1 << 2,
    KS_API_SET_MIN_P = 1 << 3,
    KS_API_SET_REPEAT_PENALTY = 1 << 4,
    KS_API_SET_SEED = 1 << 5,
};
/* bits of ks_api_request.ext_set: fields of the `kvsieve` object */
enum {
    KS_API_EXT_POLICY = 1 << 0,
    KS_API_EXT_BUDGET = 1 << 1,
    KS_API_EXT_SINK = 1 << 2,
    KS_API_EXT_WINDOW = 1 << 3,
    KS_API_EXT_PAGE = 1 << 4,
    KS_API_EXT_DENSE_LAYERS = 1 << 5,
    KS_API_EXT_ARGS = 1 << 6,
    KS_API_EXT_PREFILL = 1 << 7,
};

/* One message of a chat request: developer is folded into system; the
 * deprecated function role is refused (tool replaces it). */
typedef enum ks_api_role {
    KS_API_ROLE_SYSTEM = 0,
    KS_API_ROLE_USER = 1,
    KS_API_ROLE_ASSISTANT = 2,
    KS_API_ROLE_TOOL = 3
} ks_api_role;
typedef struct ks_api_message {
    ks_api_role role;
    char *content;              /* text parts joined; never NULL ("" for an assistant's null content) */
    char *tool_calls;           /* assistant: its tool_calls, a checked JSON array (compact); NULL: none */
    char *tool_call_id;         /* tool: the call it answers; NULL: none */
    char *name;                 /* tool: the function's name; NULL: none */
} ks_api_message;

/* tool_choice */
typedef enum ks_api_tool_choice {
    KS_API_TOOLS_AUTO = 0,      /* the model may call (the default with tools) */
    KS_API_TOOLS_NONE = 1,      /* no call: tools are neither rendered nor parsed */
    KS_API_TOOLS_REQUIRED = 2,  /* exactly one call, sampling constrained to it */
    KS_API_TOOLS_NAMED = 3,     /* one call of tool_name, constrained */
} ks_api_tool_choice;

enum { KS_API_MAX_TOOLS = 128 };

typedef struct ks_api_request {
    ks_api_kind kind;
    char *model;                /* NULL when absent */
    /* completions: a text prompt, or token ids */
    char *prompt;
    int32_t *prompt_ids;        /* [n_prompt_ids] */
    int32_t n_prompt_ids;
    /* chat: the conversation in order (at least one user message) */
    ks_api_message *messages;   /* [n_messages] */
    int32_t n_messages;
    bool stream, include_usage;
    int32_t max_tokens;         /* 0: not given */
    unsigned set;               /* KS_API_SET_* */
    float temperature, top_p, min_p, repeat_penalty;
    int32_t top_k;
    uint64_t seed;
    char *stops[KS_API_MAX_STOPS];
    int32_t n_stops;
    bool ignore_eos;            /* kvsieve.ignore_eos */
    bool cache_prompt;          /* cache_prompt (or kvsieve.cache_prompt): use the prefix cache (default true) */
    bool logprobs;              /* chat: logprobs true; completions: logprobs an integer */
    int32_t top_logprobs;       /* chat: top_logprobs; completions: the logprobs integer (0..20) */
    unsigned ext_set;           /* KS_API_EXT_* */
    char policy[128];
    char prefill_policy[128];   /* kvsieve.prefill_policy (checked against the page at admission: merge_policy) */
    int32_t budget, sink, window, page, dense_layers;
    char policy_args[1024];
    /* response_format: NULL for text; "" for json_object (any JSON object);
     * else json_schema's schema as compact JSON, already compiled once to
     * check it (sample/json_constraint.h) */
    char *json_schema;
    /* tools: the OpenAI array as compact JSON (NULL: none), its function
     * names in order, and tool_choice */
    char *tools;
    char *tool_names[KS_API_MAX_TOOLS]; /* [n_tools] */
    int32_t n_tools;
    ks_api_tool_choice tool_choice;
    char tool_name[65];         /* KS_API_TOOLS_NAMED: the function */
} ks_api_request;

typedef struct ks_api_error {
    int status;                 /* HTTP status */
    const char *type;           /* "invalid_request_error", "server_error", ... */
    const char *code;           /* NULL: null */
    char param[64];             /* "": null */
    char message[768];
} ks_api_error;

/* Parse body[len] (need not be NUL-terminated).  On failure fills err
 * (status 400) and returns false; out is then empty.  On success the caller
 * frees out with ks_api_request_free. */
bool ks_api_parse(const char *body, size_t len, ks_api_kind kind, ks_api_request *out, ks_api_error *err);
void ks_api_request_free(ks_api_request *r);

/* Whether policy (a known spec) takes every key of args ("k=v,k=v"); on
 * failure err names the key. */
bool ks_api_check_policy_args(const char *policy, const char *args, ks_api_error *err);

void ks_api_error_set(ks_api_error *e, int status, const char *type, const char *code, const char *param,
                      const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* {"error":{"message","type","param","code"}} as a malloc'd string. */
char *ks_api_error_json(const ks_api_error *e);

/* A malloc'd copy of s[len] that is valid UTF-8 (each invalid byte becomes
 * U+FFFD), for JSON strings. */
char *ks_api_utf8_clean(const char *s, size_t len);

#ifdef __cplusplus
}
#endif
#endif
