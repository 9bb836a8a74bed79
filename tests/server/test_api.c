/*
 * test_api.c — the request-body parser of the server (src/server/api.c).
 *
 * Each rule a client can run into is checked once with the exact error a
 * client would read: the status, the OpenAI `type`, `code` and `param`.
 * Valid bodies are checked field by field, including the `kvsieve`
 * extension object and the forms OpenAI clients send (content parts,
 * a batch of one prompt, token-id prompts, null for absent).
 */
#include "testutil.h"

#include "server/api.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool parse(const char *body, ks_api_kind kind, ks_api_request *r, ks_api_error *e) {
    return ks_api_parse(body, strlen(body), kind, r, e);
}

/* The body must fail with this status, code and param ("" for null). */
static void expect_error(const char *body, ks_api_kind kind, int status, const char *code, const char *param) {
    ks_api_request r;
    ks_api_error e;
    if (parse(body, kind, &r, &e)) {
        ks_api_request_free(&r);
        fail_msg("accepted: %s", body);
    }
    if (e.status != status || strcmp(e.code ? e.code : "", code) || strcmp(e.param, param))
        fail_msg("%s: got %d %s param '%s' (%s)", body, e.status, e.code ? e.code : "null", e.param, e.message);
}

static void test_completion_fields(void **state) {
    (void)state;
    ks_api_request r;
    ks_api_error e;
    const char *b = "{\"model\":\"m\",\"prompt\":\"Once\",\"max_tokens\":8,\"temperature\":0,\"top_p\":0.5,"
                    "\"top_k\":3,\"min_p\":0.1,\"seed\":-5,\"stop\":[\"a\",\"bc\"],\"stream\":true,"
                    "\"stream_options\":{\"include_usage\":true},\"user\":\"x\",\"metadata\":{\"a\":\"b\"},\"store\":false,"
                    "\"presence_penalty\":0.5,\"n\":1,\"logprobs\":null,\"echo\":false}";
    assert_true(parse(b, KS_API_COMPLETIONS, &r, &e));
    assert_string_equal(r.model, "m");
    assert_string_equal(r.prompt, "Once");
    assert_int_equal(r.max_tokens, 8);
    assert_true(r.stream && r.include_usage);
    assert_int_equal(r.set, KS_API_SET_TEMPERATURE | KS_API_SET_TOP_P | KS_API_SET_TOP_K | KS_API_SET_MIN_P |
                                KS_API_SET_SEED);
    assert_true(r.temperature == 0.0f && r.top_p == 0.5f && r.top_k == 3);
    assert_true(r.seed == (uint64_t)(int64_t)-5);
    assert_int_equal(r.n_stops, 2);
    assert_string_equal(r.stops[1], "bc");
    assert_int_equal(r.ext_set, 0);
    assert_false(r.logprobs); /* null: none */
    ks_api_request_free(&r);

    assert_true(parse("{\"prompt\":\"x\",\"logprobs\":3}", KS_API_COMPLETIONS, &r, &e));
    assert_true(r.logprobs && r.top_logprobs == 3);
    ks_api_request_free(&r);
    assert_true(parse("{\"prompt\":\"x\",\"logprobs\":false}", KS_API_COMPLETIONS, &r, &e));
    assert_false(r.logprobs);
    ks_api_request_free(&r);
    assert_true(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"u\"}],\"logprobs\":true,\"top_logprobs\":4}",
                      KS_API_CHAT, &r, &e));
    assert_true(r.logprobs && r.top_logprobs == 4);
    ks_api_request_free(&r);

    /* a batch of one prompt, token ids, and null meaning absent */
    assert_true(parse("{\"prompt\":[\"hi\"],\"max_tokens\":null,\"stop\":\"x\"}", KS_API_COMPLETIONS, &r, &e));
    assert_string_equal(r.prompt, "hi");
    assert_int_equal(r.max_tokens, 0);
    assert_int_equal(r.n_stops, 1);
    ks_api_request_free(&r);
    assert_true(parse("{\"prompt\":[[1,2,3]]}", KS_API_COMPLETIONS, &r, &e));
    assert_int_equal(r.n_prompt_ids, 3);
    assert_int_equal(r.prompt_ids[2], 3);
    assert_null(r.prompt);
    ks_api_request_free(&r);
}

static void test_chat_fields(void **state) {
    (void)state;
    ks_api_request r;
    ks_api_error e;
    const char *b = "{\"messages\":[{\"role\":\"system\",\"content\":\"A\"},{\"role\":\"developer\",\"content\":"
                    "[{\"type\":\"text\",\"text\":\"B\"},{\"type\":\"text\",\"text\":\"C\"}]},"
                    "{\"role\":\"user\",\"content\":\"Q?\"}],\"max_completion_tokens\":4}";
    assert_true(parse(b, KS_API_CHAT, &r, &e));
    assert_int_equal(r.n_messages, 3);
    assert_int_equal(r.messages[0].role, KS_API_ROLE_SYSTEM);
    assert_string_equal(r.messages[0].content, "A");
    assert_int_equal(r.messages[1].role, KS_API_ROLE_SYSTEM); /* developer is system */
    assert_string_equal(r.messages[1].content, "BC");
    assert_int_equal(r.messages[2].role, KS_API_ROLE_USER);
    assert_string_equal(r.messages[2].content, "Q?");
    assert_int_equal(r.max_tokens, 4);
    ks_api_request_free(&r);

    /* multi-turn, in any order of roles, kept in order; an assistant message
     * may carry an empty tool_calls list, null fields and a name */
    b = "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\",\"content\":\"b\","
        "\"tool_calls\":[],\"function_call\":null,\"name\":\"bot\"},{\"role\":\"system\",\"content\":\"\"},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"c\"}]},"
        "{\"role\":\"assistant\",\"content\":\"d\"}]}";
    assert_true(parse(b, KS_API_CHAT, &r, &e));
    assert_int_equal(r.n_messages, 5);
    const ks_api_role want[] = {KS_API_ROLE_USER, KS_API_ROLE_ASSISTANT, KS_API_ROLE_SYSTEM, KS_API_ROLE_USER,
                                KS_API_ROLE_ASSISTANT};
    const char *text[] = {"a", "b", "", "c", "d"};
    for (int i = 0; i < 5; i++) {
        assert_int_equal(r.messages[i].role, want[i]);
        assert_string_equal(r.messages[i].content, text[i]);
    }
    ks_api_request_free(&r);
}

/* Malformed conversations: each names the message (and part) at fault. */
static void test_chat_errors(void **state) {
    (void)state;
    const ks_api_kind H = KS_API_CHAT;
    expect_error("{\"messages\":[]}", H, 400, "invalid_value", "messages");
    expect_error("{\"messages\":{}}", H, 400, "invalid_type", "messages");
    expect_error("{\"messages\":[\"hi\"]}", H, 400, "invalid_type", "messages[0]");
    expect_error("{\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"assistant\",\"content\":\"a\"}]}",
                 H, 400, "invalid_value", "messages");
    /* role: missing, wrong type, unknown, tool and function */
    expect_error("{\"messages\":[{\"role\":null,\"content\":\"x\"}]}", H, 400, "missing_required_parameter",
                 "messages[0].role");
    expect_error("{\"messages\":[{\"role\":3,\"content\":\"x\"}]}", H, 400, "invalid_type", "messages[0].role");
    expect_error("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"robot\",\"content\":\"x\"}]}", H,
                 400, "invalid_value", "messages[1].role");
    expect_error("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"tool\",\"content\":\"42\"}]}", H,
                 400, "missing_required_parameter", "messages[1].tool_call_id");
    expect_error("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"tool\",\"content\":\"42\","
                 "\"tool_call_id\":7}]}", H, 400, "invalid_type", "messages[1].tool_call_id");
    expect_error("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"function\",\"name\":\"f\","
                 "\"content\":\"42\"}]}", H, 400, "unsupported", "messages[1].role");
    expect_error("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":null,"
                 "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}]}",
                 H, 400, "invalid_type", "messages[1].tool_calls[0]");
    expect_error("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":null,"
                 "\"tool_calls\":{}}]}", H, 400, "invalid_type", "messages[1].tool_calls");
    expect_error("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":\"\","
                 "\"function_call\":{\"name\":\"f\"}}]}", H, 400, "unsupported", "messages[1].function_call");
    /* content: missing, null, wrong type, empty parts, other part types */
    expect_error("{\"messages\":[{\"role\":\"user\"}]}", H, 400, "missing_required_parameter", "messages[0].content");
    expect_error("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":null}]}",
                 H, 400, "missing_required_parameter", "messages[1].content");
    expect_error("{\"messages\":[{\"role\":\"user\",\"content\":true}]}", H, 400, "invalid_type", "messages[0].content");
    expect_error("{\"messages\":[{\"role\":\"user\",\"content\":{\"text\":\"x\"}}]}", H, 400, "invalid_type",
                 "messages[0].content");
    expect_error("{\"messages\":[{\"role\":\"user\",\"content\":[]}]}", H, 400, "invalid_value", "messages[0].content");
    expect_error("{\"messages\":[{\"role\":\"user\",\"content\":[\"x\"]}]}", H, 400, "invalid_type",
                 "messages[0].content[0]");
    expect_error("{\"messages\":[{\"role\":\"user\",\"content\":[{\"text\":\"x\"}]}]}", H, 400, "invalid_type",
                 "messages[0].content[0]");
    expect_error("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"x\"},"
                 "{\"type\":\"image_url\",\"image_url\":{\"url\":\"http://x\"}}]}]}", H, 400, "unsupported",
                 "messages[0].content[1]");
    expect_error("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":5}]}]}", H, 400,
                 "invalid_type", "messages[0].content[0]");

    /* the message says what to do */
    ks_api_request r;
    ks_api_error e;
    assert_false(parse("{\"messages\":[{\"role\":\"function\",\"content\":\"x\"}]}", H, &r, &e));
    assert_non_null(strstr(e.message, "tool_call_id"));
    assert_non_null(strstr(e.message, "not supported"));
    assert_false(parse("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_audio\"}]}]}", H, &r, &e));
    assert_non_null(strstr(e.message, "input_audio"));
    assert_non_null(strstr(e.message, "only text"));
}

#define TOOLS "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"d\"," \
              "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}," \
              "{\"type\":\"function\",\"function\":{\"name\":\"add\",\"strict\":true}}]"
#define UMSG "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]"

/* tools, tool_choice, and the tool messages of a conversation. */
static void test_tools(void **state) {
    (void)state;
    const ks_api_kind H = KS_API_CHAT;
    ks_api_request r;
    ks_api_error e;
    /* a whole round trip: the call the assistant made and its result */
    const char *b = "{\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"},{\"role\":\"assistant\","
                    "\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":"
                    "\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":"
                    "\"c1\",\"name\":\"get_weather\",\"content\":\"sunny\"}],\"tools\":" TOOLS ",\"tool_choice\":\"auto\","
                    "\"parallel_tool_calls\":false}";
    assert_true(parse(b, H, &r, &e));
    assert_int_equal(r.n_tools, 2);
    assert_string_equal(r.tool_names[0], "get_weather");
    assert_string_equal(r.tool_names[1], "add");
    assert_int_equal(r.tool_choice, KS_API_TOOLS_AUTO);
    assert_non_null(r.tools);
    assert_int_equal(r.messages[1].role, KS_API_ROLE_ASSISTANT);
    assert_string_equal(r.messages[1].content, "");
    assert_non_null(strstr(r.messages[1].tool_calls, "\"get_weather\""));
    assert_int_equal(r.messages[2].role, KS_API_ROLE_TOOL);
    assert_string_equal(r.messages[2].tool_call_id, "c1");
    assert_string_equal(r.messages[2].name, "get_weather");
    assert_string_equal(r.messages[2].content, "sunny");
    ks_api_request_free(&r);

    assert_true(parse("{" UMSG ",\"tools\":" TOOLS ",\"tool_choice\":{\"type\":\"function\",\"function\":"
                      "{\"name\":\"add\"}}}", H, &r, &e));
    assert_int_equal(r.tool_choice, KS_API_TOOLS_NAMED);
    assert_string_equal(r.tool_name, "add");
    ks_api_request_free(&r);
    assert_true(parse("{" UMSG ",\"tools\":" TOOLS ",\"tool_choice\":\"required\"}", H, &r, &e));
    assert_int_equal(r.tool_choice, KS_API_TOOLS_REQUIRED);
    ks_api_request_free(&r);
    assert_true(parse("{" UMSG ",\"tools\":[],\"tool_choice\":\"none\"}", H, &r, &e));
    assert_int_equal(r.n_tools, 0);
    assert_null(r.tools);
    ks_api_request_free(&r);

    /* every bad field, named */
    expect_error("{" UMSG ",\"tools\":{}}", H, 400, "invalid_type", "tools");
    expect_error("{\"prompt\":\"x\",\"tools\":" TOOLS "}", KS_API_COMPLETIONS, 400, "unsupported", "tools");
    expect_error("{" UMSG ",\"tools\":[1]}", H, 400, "invalid_type", "tools[0]");
    expect_error("{" UMSG ",\"tools\":[{\"type\":\"code_interpreter\",\"function\":{}}]}", H, 400, "unsupported",
                 "tools[0].type");
    expect_error("{" UMSG ",\"tools\":[{\"type\":\"function\",\"function\":{}}]}", H, 400,
                 "missing_required_parameter", "tools[0].function.name");
    expect_error("{" UMSG ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a b\"}}]}", H, 400,
                 "invalid_value", "tools[0].function.name");
    expect_error("{" UMSG ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\"}},{\"type\":\"function\","
                 "\"function\":{\"name\":\"a\"}}]}", H, 400, "invalid_value", "tools[1].function.name");
    expect_error("{" UMSG ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\",\"parameters\":3}}]}", H,
                 400, "invalid_type", "tools[0].function.parameters");
    expect_error("{" UMSG ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\",\"description\":1}}]}", H,
                 400, "invalid_type", "tools[0].function.description");
    expect_error("{" UMSG ",\"tool_choice\":\"required\"}", H, 400, "invalid_value", "tool_choice");
    expect_error("{" UMSG ",\"tools\":" TOOLS ",\"tool_choice\":\"always\"}", H, 400, "invalid_value", "tool_choice");
    expect_error("{" UMSG ",\"tools\":" TOOLS ",\"tool_choice\":3}", H, 400, "invalid_type", "tool_choice");
    expect_error("{" UMSG ",\"tools\":" TOOLS ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"nope\"}}}",
                 H, 400, "invalid_value", "tool_choice");
    expect_error("{" UMSG ",\"tools\":" TOOLS ",\"tool_choice\":\"required\",\"response_format\":{\"type\":"
                 "\"json_object\"}}", H, 400, "invalid_value", "tool_choice");
    /* a forced call's schema must be one the constraint enforces; auto only renders it */
    const char *pat = "[{\"type\":\"function\",\"function\":{\"name\":\"a\",\"parameters\":{\"type\":\"object\","
                      "\"properties\":{\"s\":{\"type\":\"string\",\"pattern\":\"x+\"}}}}}]";
    char body[1024];
    snprintf(body, sizeof body, "{" UMSG ",\"tools\":%s,\"tool_choice\":\"required\"}", pat);
    expect_error(body, H, 400, "unsupported", "tools[0].function.parameters");
    snprintf(body, sizeof body, "{" UMSG ",\"tools\":%s}", pat);
    assert_true(parse(body, H, &r, &e));
    ks_api_request_free(&r);
    expect_error("{" UMSG ",\"parallel_tool_calls\":1}", H, 400, "invalid_type", "parallel_tool_calls");
}

/* A field no list names is a 400 that names it, at the top level and in
 * the kvsieve object; the kind decides (prompt in a chat request is one). */
static void test_unknown_fields(void **state) {
    (void)state;
    expect_error("{\"prompt\":\"x\",\"temprature\":0.5}", KS_API_COMPLETIONS, 400, "unknown_parameter", "temprature");
    expect_error("{" UMSG ",\"prompt\":\"x\"}", KS_API_CHAT, 400, "unknown_parameter", "prompt");
    expect_error("{\"prompt\":\"x\",\"top_logprobs\":2}", KS_API_COMPLETIONS, 400, "unknown_parameter", "top_logprobs");
    expect_error("{\"prompt\":\"x\",\"kvsieve\":{\"budgett\":3}}", KS_API_COMPLETIONS, 400, "unknown_parameter",
                 "kvsieve.budgett");
    expect_error("{" UMSG ",\"logit_bias\":{\"5\":1}}", KS_API_CHAT, 400, "unknown_parameter", "logit_bias");
    ks_api_request r;
    ks_api_error e;
    assert_true(parse("{\"prompt\":\"x\",\"repetition_penalty\":1.3,\"service_tier\":\"auto\"}", KS_API_COMPLETIONS,
                      &r, &e));
    assert_true(r.set & KS_API_SET_REPEAT_PENALTY);
    assert_true(r.repeat_penalty > 1.29f && r.repeat_penalty < 1.31f);
    ks_api_request_free(&r);
    assert_false(parse("{\"prompt\":\"x\",\"foo\":1}", KS_API_COMPLETIONS, &r, &e));
    assert_non_null(strstr(e.message, "foo"));
}

static void test_extension(void **state) {
    (void)state;
    ks_api_request r;
    ks_api_error e;
    const char *b = "{\"prompt\":\"x\",\"kvsieve\":{\"policy\":\"snapkv+quest\",\"budget\":64,\"sink\":2,"
                    "\"window\":8,\"page\":16,\"dense_layers\":1,\"ignore_eos\":true,"
                    "\"policy_args\":{\"a\":1.5,\"b\":\"v\",\"c\":true}}}";
    assert_true(parse(b, KS_API_COMPLETIONS, &r, &e));
    assert_string_equal(r.policy, "snapkv+quest");
    assert_int_equal(r.budget, 64);
    assert_int_equal(r.sink, 2);
    assert_int_equal(r.window, 8);
    assert_int_equal(r.page, 16);
    assert_int_equal(r.dense_layers, 1);
    assert_true(r.ignore_eos);
    assert_string_equal(r.policy_args, "a=1.5,b=v,c=1");
    assert_int_equal(r.ext_set, KS_API_EXT_POLICY | KS_API_EXT_BUDGET | KS_API_EXT_SINK | KS_API_EXT_WINDOW |
                                    KS_API_EXT_PAGE | KS_API_EXT_DENSE_LAYERS | KS_API_EXT_ARGS);
    ks_api_request_free(&r);
    assert_true(parse("{\"prompt\":\"x\",\"kvsieve\":{\"policy_args\":\"k=1,j=2\"}}", KS_API_COMPLETIONS, &r, &e));
    assert_string_equal(r.policy_args, "k=1,j=2");
    ks_api_request_free(&r);
    /* the prefill policy: kept as sent (its budget is checked against the page at admission) */
    assert_true(parse("{\"prompt\":\"x\",\"kvsieve\":{\"prefill_policy\":\"quest:budget=1024\"}}", KS_API_COMPLETIONS, &r,
                      &e));
    assert_string_equal(r.prefill_policy, "quest:budget=1024");
    assert_int_equal(r.ext_set, KS_API_EXT_PREFILL);
    ks_api_request_free(&r);

    /* policy arguments are checked against the policy that will run */
    assert_false(ks_api_check_policy_args("dense", "nonsense_key=1", &e));
    assert_string_equal(e.param, "kvsieve.policy_args");
    assert_non_null(strstr(e.message, "nonsense_key"));
    assert_true(ks_api_check_policy_args("dense", "", &e));
}

static void test_errors(void **state) {
    (void)state;
    const ks_api_kind C = KS_API_COMPLETIONS, H = KS_API_CHAT;
    /* malformed JSON */
    expect_error("", C, 400, "invalid_json", "");
    expect_error("{\"prompt\":\"x\",", C, 400, "invalid_json", "");
    expect_error("{\"prompt\":\"x\"} trailing", C, 400, "invalid_json", "");
    expect_error("[1,2]", C, 400, "invalid_json", "");
    /* missing required fields */
    expect_error("{\"max_tokens\":3}", C, 400, "missing_required_parameter", "prompt");
    expect_error("{\"prompt\":\"x\"}", H, 400, "missing_required_parameter", "messages");
    /* wrong types */
    expect_error("{\"prompt\":1}", C, 400, "invalid_type", "prompt");
    expect_error("{\"prompt\":\"x\",\"max_tokens\":\"8\"}", C, 400, "invalid_type", "max_tokens");
    expect_error("{\"prompt\":\"x\",\"max_tokens\":2.5}", C, 400, "invalid_type", "max_tokens");
    expect_error("{\"prompt\":\"x\",\"temperature\":\"hot\"}", C, 400, "invalid_type", "temperature");
    expect_error("{\"prompt\":\"x\",\"stream\":\"yes\"}", C, 400, "invalid_type", "stream");
    expect_error("{\"prompt\":\"x\",\"stop\":5}", C, 400, "invalid_type", "stop");
    expect_error("{\"prompt\":\"x\",\"stop\":[\"a\",3]}", C, 400, "invalid_type", "stop");
    expect_error("{\"prompt\":\"x\",\"kvsieve\":[]}", C, 400, "invalid_type", "kvsieve");
    expect_error("{\"prompt\":\"x\",\"kvsieve\":{\"budget\":\"all\"}}", C, 400, "invalid_type", "kvsieve.budget");
    expect_error("{\"messages\":\"hi\"}", H, 400, "invalid_type", "messages");
    expect_error("{\"messages\":[{\"role\":\"user\",\"content\":7}]}", H, 400, "invalid_type", "messages[0].content");
    expect_error("{\"messages\":[{\"content\":\"x\"}]}", H, 400, "missing_required_parameter", "messages[0].role");
    /* values out of range */
    expect_error("{\"prompt\":\"x\",\"max_tokens\":0}", C, 400, "invalid_value", "max_tokens");
    expect_error("{\"prompt\":\"x\",\"max_tokens\":-3}", C, 400, "invalid_value", "max_tokens");
    expect_error("{\"prompt\":\"x\",\"max_tokens\":1e12}", C, 400, "invalid_value", "max_tokens");
    expect_error("{\"prompt\":\"x\",\"temperature\":3}", C, 400, "invalid_value", "temperature");
    expect_error("{\"prompt\":\"x\",\"top_p\":0}", C, 400, "invalid_value", "top_p");
    expect_error("{\"prompt\":\"\"}", C, 400, "invalid_value", "prompt");
    expect_error("{\"prompt\":[-1]}", C, 400, "invalid_value", "prompt");
    expect_error("{\"prompt\":\"x\",\"stop\":\"\"}", C, 400, "invalid_value", "stop");
    expect_error("{\"prompt\":\"x\",\"kvsieve\":{\"page\":0}}", C, 400, "invalid_value", "kvsieve.page");
    expect_error("{\"prompt\":\"x\",\"kvsieve\":{\"policy_args\":\"novalue\"}}", C, 400, "invalid_value",
                 "kvsieve.policy_args");
    expect_error("{\"messages\":[]}", H, 400, "invalid_value", "messages");
    expect_error("{\"messages\":[{\"role\":\"system\",\"content\":\"s\"}]}", H, 400, "invalid_value", "messages");
    /* unknown policy */
    expect_error("{\"prompt\":\"x\",\"kvsieve\":{\"policy\":\"magic\"}}", C, 400, "unknown_policy", "kvsieve.policy");
    expect_error("{\"prompt\":\"x\",\"kvsieve\":{\"policy\":\"snapkv+magic\"}}", C, 400, "unknown_policy",
                 "kvsieve.policy");
    /* malformed prefill policies */
    const char *bad_pp[] = {"\"sparse\"", "\"quest:budget=abc\"", "\"quest:nokey=1\"", "\"quest:budget=64,\"",
                            "\"quest:budget=40,sink=8,window=40\"", "7", "{}"};
    for (size_t i = 0; i < sizeof bad_pp / sizeof bad_pp[0]; i++) {
        char body[200];
        snprintf(body, sizeof body, "{\"prompt\":\"x\",\"kvsieve\":{\"prefill_policy\":%s}}", bad_pp[i]);
        expect_error(body, C, 400, i < 5 ? "invalid_value" : "invalid_type", "kvsieve.prefill_policy");
    }
    /* asked-for features that are not there */
    expect_error("{\"prompt\":\"x\",\"n\":2}", C, 400, "unsupported", "n");
    /* logprobs: OpenAI's shapes, chat a boolean with top_logprobs, completions an integer */
    expect_error("{\"prompt\":\"x\",\"logprobs\":21}", C, 400, "invalid_value", "logprobs");
    expect_error("{\"prompt\":\"x\",\"logprobs\":true}", C, 400, "invalid_type", "logprobs");
    expect_error("{\"prompt\":\"x\",\"logprobs\":1.5}", C, 400, "invalid_type", "logprobs");
    expect_error("{\"messages\":[{\"role\":\"user\",\"content\":\"u\"}],\"logprobs\":1}", H, 400, "invalid_type",
                 "logprobs");
    expect_error("{\"messages\":[{\"role\":\"user\",\"content\":\"u\"}],\"top_logprobs\":2}", H, 400,
                 "invalid_value", "top_logprobs");
    expect_error("{\"messages\":[{\"role\":\"user\",\"content\":\"u\"}],\"logprobs\":true,\"top_logprobs\":21}", H,
                 400, "invalid_value", "top_logprobs");
    expect_error("{\"messages\":[{\"role\":\"user\",\"content\":\"u\"}],\"logprobs\":true,\"top_logprobs\":\"3\"}",
                 H, 400, "invalid_type", "top_logprobs");
    expect_error("{\"prompt\":[\"a\",\"b\"]}", C, 400, "unsupported", "prompt");
}

static void test_error_json_and_utf8(void **state) {
    (void)state;
    ks_api_error e;
    ks_api_error_set(&e, 429, "requests", "rate_limit_exceeded", NULL, "too many: %d", 3);
    char *j = ks_api_error_json(&e);
    assert_string_equal(j, "{\"error\":{\"message\":\"too many: 3\",\"type\":\"requests\",\"param\":null,"
                           "\"code\":\"rate_limit_exceeded\"}}");
    free(j);
    char *c = ks_api_utf8_clean("a\xC3\xA9" "b\xC3" "c\xED\xA0\x80" "d", 10);
    assert_string_equal(c, "a\xC3\xA9" "b\xEF\xBF\xBD" "c\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD" "d");
    free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_completion_fields), cmocka_unit_test(test_chat_fields),
        cmocka_unit_test(test_chat_errors),
        cmocka_unit_test(test_tools),
        cmocka_unit_test(test_unknown_fields),
        cmocka_unit_test(test_extension),         cmocka_unit_test(test_errors),
        cmocka_unit_test(test_error_json_and_utf8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
