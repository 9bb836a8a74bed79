/*
 * fuzz_request.c — libFuzzer entry point for the server's request-body
 * parser (src/server/api.c).
 *
 * Why: the body of POST /v1/completions and /v1/chat/completions is the
 * first thing an untrusted client controls.  Each input is parsed as both
 * kinds of request; a successful parse is then walked (every string read,
 * the policy arguments checked against the registry) and freed, and every
 * error is rendered as the JSON object a client would get, so ASan sees the
 * whole life of what the parser produced.  The same input is also parsed as
 * the bodies of /tokenize and /detokenize (server/tokens.h), and as a
 * model's answer in every tool-call syntax (server/toolcall.h), with the
 * request's function names when it parsed as a chat request with tools,
 * and each tools array through the forced-call builder.  Built only with clang and
 * -DKVSIEVE_FUZZ=ON (cmake/server.cmake); seeds in tests/fuzz/corpus_request/.
 */
#include "server/api.h"
#include "server/tokens.h"
#include "server/toolcall.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static volatile uint64_t g_sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    for (int kind = 0; kind < 2; kind++) {
        ks_api_request r;
        ks_api_error e;
        uint64_t h = 0;
        if (ks_api_parse((const char *)data, size, (ks_api_kind)kind, &r, &e)) {
            if (r.model) h += strlen(r.model);
            if (r.prompt) h += strlen(r.prompt);
            for (int32_t i = 0; i < r.n_messages; i++) h += strlen(r.messages[i].content) + (uint64_t)r.messages[i].role;
            for (int32_t i = 0; i < r.n_prompt_ids; i++) h += (uint64_t)r.prompt_ids[i];
            for (int32_t i = 0; i < r.n_stops; i++) h += strlen(r.stops[i]);
            h += strlen(r.policy) + strlen(r.policy_args);
            for (int32_t i = 0; i < r.n_messages; i++) {
                if (r.messages[i].tool_calls) h += strlen(r.messages[i].tool_calls);
                if (r.messages[i].tool_call_id) h += strlen(r.messages[i].tool_call_id);
            }
            for (int syn = KS_TOOLS_GENERIC; r.n_tools && syn <= KS_TOOLS_DEEPSEEK; syn++) {
                ks_tool_parsed tp;
                if (ks_tool_parse((ks_tool_syntax)syn, (const char *)data, size, (const char *const *)r.tool_names,
                                  r.n_tools, &tp)) {
                    h += (uint64_t)tp.n_calls + (tp.content ? strlen(tp.content) : 0);
                    ks_tool_parsed_free(&tp);
                }
                char *op, *sch, *cl;
                ks_tool_syntax as;
                if (ks_tool_forced((ks_tool_syntax)syn, r.tools, r.tool_choice == KS_API_TOOLS_NAMED ? r.tool_name : NULL,
                                   &op, &sch, &cl, &as)) {
                    h += strlen(op) + strlen(sch) + strlen(cl);
                    free(op);
                    free(sch);
                    free(cl);
                }
            }
            if (r.ext_set & KS_API_EXT_POLICY) {
                ks_api_error e2;
                if (!ks_api_check_policy_args(r.policy, r.policy_args, &e2)) {
                    char *j = ks_api_error_json(&e2);
                    h += strlen(j);
                    free(j);
                }
            }
            ks_api_request_free(&r);
        } else {
            char *j = ks_api_error_json(&e);
            h += strlen(j) + (uint64_t)e.status;
            free(j);
        }
        char *c = ks_api_utf8_clean((const char *)data, size);
        h += strlen(c);
        free(c);
        g_sink += h;
    }
    /* the input as a model's answer, against fixed function names */
    static const char *const names[] = {"get_weather", "add", "f"};
    for (int syn = KS_TOOLS_GENERIC; syn <= KS_TOOLS_DEEPSEEK; syn++) {
        ks_tool_parsed tp;
        if (ks_tool_parse((ks_tool_syntax)syn, (const char *)data, size, names, 3, &tp)) {
            g_sink += (uint64_t)tp.n_calls + (tp.content ? strlen(tp.content) : 0);
            ks_tool_parsed_free(&tp);
        }
        g_sink += ks_tool_stream_safe((ks_tool_syntax)syn, (const char *)data, size);
    }
    ks_api_tokenize t;
    ks_api_detokenize d;
    ks_api_error e;
    uint64_t h = 0;
    if (ks_api_parse_tokenize((const char *)data, size, &t, &e)) {
        h += strlen(t.content) + t.add_special + t.parse_special + t.with_pieces;
        ks_api_tokenize_free(&t);
    } else h += (uint64_t)e.status + strlen(e.message);
    if (ks_api_parse_detokenize((const char *)data, size, &d, &e)) {
        for (int32_t i = 0; i < d.n_tokens; i++) h += (uint64_t)d.tokens[i];
        ks_api_detokenize_free(&d);
    } else {
        char *j = ks_api_error_json(&e);
        h += strlen(j);
        free(j);
    }
    g_sink += h;
    return 0;
}
