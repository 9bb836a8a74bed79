/*
 * test_toolcall.c — the tool-call parsers (src/server/toolcall.c): each
 * family's syntax as its template writes it, parsed into name and
 * arguments; malformed answers (unknown function, broken JSON, a call cut
 * off) stay text; the streaming hold-back; the forced call's opener,
 * schema and closer round-trip through the parser.
 */
#include "testutil.h"

#include "sample/json_constraint.h"
#include "server/toolcall.h"

#include <stdlib.h>
#include <string.h>

static const char *const NAMES[] = {"get_weather", "add"};

static ks_tool_parsed parse(ks_tool_syntax syn, const char *text) {
    ks_tool_parsed p;
    assert_true(ks_tool_parse(syn, text, strlen(text), NAMES, 2, &p));
    return p;
}

/* text parses into the calls name0/args0 (and name1/args1 when given) with this content (NULL: none) */
static void expect_calls(ks_tool_syntax syn, const char *text, const char *content, const char *name0,
                         const char *args0, const char *name1, const char *args1) {
    ks_tool_parsed p = parse(syn, text);
    if (p.n_calls != (name1 ? 2 : 1)) fail_msg("%s: %d calls in %s", ks_tool_syntax_name(syn), p.n_calls, text);
    assert_string_equal(p.calls[0].name, name0);
    assert_string_equal(p.calls[0].arguments, args0);
    if (name1) {
        assert_string_equal(p.calls[1].name, name1);
        assert_string_equal(p.calls[1].arguments, args1);
    }
    if (content) assert_string_equal(p.content ? p.content : "(null)", content);
    else assert_null(p.content);
    ks_tool_parsed_free(&p);
}

/* text has no call: the content is the whole text, unchanged */
static void expect_text(ks_tool_syntax syn, const char *text) {
    ks_tool_parsed p = parse(syn, text);
    if (p.n_calls) fail_msg("%s: a call in %s", ks_tool_syntax_name(syn), text);
    assert_string_equal(p.content, text);
    ks_tool_parsed_free(&p);
}

static void test_hermes(void **state) {
    (void)state;
    const ks_tool_syntax S = KS_TOOLS_HERMES;
    expect_calls(S, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", NULL,
                 "get_weather", "{\"city\": \"Paris\"}", NULL, NULL);
    expect_calls(S, "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n"
                    "</tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 12345678901234567890}}\n</tool_call>",
                 "Let me check.", "get_weather", "{\"city\": \"Oslo\"}", "add", "{\"a\": 12345678901234567890}");
    /* arguments as a JSON string (some models write them so); a call cut off before its closing tag at the end */
    expect_calls(S, "<tool_call>{\"name\":\"add\",\"arguments\":\"{\\\"a\\\":1}\"}", NULL, "add", "{\"a\":1}", NULL, NULL);
    expect_text(S, "The weather is fine.");
    expect_text(S, "<tool_call>\n{\"name\": \"launch\", \"arguments\": {}}\n</tool_call>");      /* not a request tool */
    expect_text(S, "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}\n</tool_call>");    /* broken JSON */
    expect_text(S, "<tool_call>\n{\"name\": \"add\", \"arguments\": [1]}\n</tool_call>");         /* arguments not an object */
    expect_text(S, "<tool_call>\n{\"arguments\": {}}\n</tool_call>");                            /* no name */
    expect_text(S, "<tool_call>{\"name\": \"add\", \"arguments\": {}} and then </tool_call>");    /* junk inside */
    expect_text(S, "<tool_call>");
    expect_text(S, "");
}

static void test_llama3(void **state) {
    (void)state;
    const ks_tool_syntax S = KS_TOOLS_LLAMA3;
    expect_calls(S, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}", NULL, "get_weather",
                 "{\"city\": \"Rome\"}", NULL, NULL);
    expect_calls(S, " {\"name\": \"add\", \"parameters\": {\"a\": 1}}; {\"name\": \"add\", \"arguments\": {\"a\": 2}}",
                 NULL, "add", "{\"a\": 1}", "add", "{\"a\": 2}");
    expect_calls(S, "Checking.<|python_tag|>{\"name\": \"add\", \"parameters\": {}}", "Checking.", "add", "{}", NULL, NULL);
    expect_text(S, "It is {\"name\": \"add\"} in the text");       /* JSON inside prose is not a call */
    expect_text(S, "{\"name\": \"add\", \"parameters\": {}} trailing");
    expect_text(S, "{\"city\": \"Rome\"}");
    expect_text(S, "{");
}

static void test_mistral(void **state) {
    (void)state;
    const ks_tool_syntax S = KS_TOOLS_MISTRAL;
    expect_calls(S, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Lyon\"}}, {\"name\": \"add\", "
                    "\"arguments\": {\"a\": 3}, \"id\": \"abcdefghi\"}]</s>",
                 NULL, "get_weather", "{\"city\":\"Lyon\"}", "add", "{\"a\":3}");
    expect_calls(S, "Sure.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Nice\"}[TOOL_CALLS]add[CALL_ID]x1[ARGS]{\"a\": 4}",
                 "Sure.", "get_weather", "{\"city\": \"Nice\"}", "add", "{\"a\": 4}");
    expect_text(S, "[TOOL_CALLS]");
    expect_text(S, "[TOOL_CALLS][]");
    expect_text(S, "[TOOL_CALLS]get_weather{\"city\": \"Nice\"}");
    expect_text(S, "[TOOL_CALLS][{\"name\": \"rm\", \"arguments\": {}}]");
    expect_text(S, "No calls here.");
}

static void test_harmony(void **state) {
    (void)state;
    const ks_tool_syntax S = KS_TOOLS_HARMONY;
    expect_calls(S, "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
                    "to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Bern\"}<|call|>",
                 NULL, "get_weather", "{\"city\":\"Bern\"}", NULL, NULL);
    expect_calls(S, "<|start|>assistant to=functions.add<|channel|>commentary json<|message|>{\"a\": 5}",
                 NULL, "add", "{\"a\": 5}", NULL, NULL);
    expect_text(S, "<|channel|>final<|message|>Hello there.");  /* no call: the text as it came */
    expect_text(S, "<|channel|>commentary to=functions.add <|constrain|>json<|message|>{\"a\":");
    expect_text(S, "<|channel|>commentary to=functions.shell <|message|>{}<|call|>");
    expect_text(S, "to=functions.add");
}

#define DS_B "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_E "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_CB "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_CE "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_S "<\xef\xbd\x9ctool\xe2\x96\x81" "sep\xef\xbd\x9c>"

static void test_deepseek(void **state) {
    (void)state;
    const ks_tool_syntax S = KS_TOOLS_DEEPSEEK;
    expect_calls(S, "I will look." DS_B DS_CB "function" DS_S "get_weather\n```json\n{\"city\": \"Kyiv\"}\n```" DS_CE
                    DS_CB "function" DS_S "add\n```json\n{\"a\": 6}\n```" DS_CE DS_E,
                 "I will look.", "get_weather", "{\"city\": \"Kyiv\"}", "add", "{\"a\": 6}");
    expect_calls(S, DS_B DS_CB "add" DS_S "{\"a\": 7}" DS_CE DS_E, NULL, "add", "{\"a\": 7}", NULL, NULL); /* V3.1 */
    expect_text(S, DS_B DS_CB "function" DS_S "add\n{\"a\": 7}" DS_CE DS_E); /* V3 form without its fence */
    expect_text(S, DS_B DS_CB "add");
    expect_text(S, DS_B DS_CB "exec" DS_S "{}" DS_CE DS_E);
    expect_text(S, "plain");
}

/* Content streams up to where a call could begin. */
static void test_stream_safe(void **state) {
    (void)state;
    const char *t = "Hello <tool_call>{";
    assert_int_equal(ks_tool_stream_safe(KS_TOOLS_HERMES, t, strlen(t)), 6);
    t = "Hello <tool_c";
    assert_int_equal(ks_tool_stream_safe(KS_TOOLS_HERMES, t, strlen(t)), 6);
    t = "Hello <b>";
    assert_int_equal(ks_tool_stream_safe(KS_TOOLS_HERMES, t, strlen(t)), strlen(t));
    t = "  {\"name\"";
    assert_int_equal(ks_tool_stream_safe(KS_TOOLS_LLAMA3, t, strlen(t)), 0);
    assert_int_equal(ks_tool_stream_safe(KS_TOOLS_LLAMA3, "  ", 2), 0);
    t = "Sure [TOOL";
    assert_int_equal(ks_tool_stream_safe(KS_TOOLS_MISTRAL, t, strlen(t)), 5);
    t = "Hi";
    assert_int_equal(ks_tool_stream_safe(KS_TOOLS_HARMONY, t, strlen(t)), 0);
    t = "Ok " DS_B;
    assert_int_equal(ks_tool_stream_safe(KS_TOOLS_DEEPSEEK, t, strlen(t)), 3);
}

#define TOOLS "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\"," \
              "\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}}," \
              "{\"type\":\"function\",\"function\":{\"name\":\"add\"}}]"

/* A forced call: the schema compiles, its shortest document closed by the
 * opener and closer parses as one call of an allowed function. */
static void check_forced(ks_tool_syntax syn, const char *name, const char *want_name) {
    char *op, *sch, *cl;
    ks_tool_syntax as;
    assert_true(ks_tool_forced(syn, TOOLS, name, &op, &sch, &cl, &as));
    ks_json_schema *s = NULL;
    char where[256];
    assert_int_equal(ks_json_schema_compile(sch, strlen(sch), &s, where, sizeof where), KS_OK);
    ks_json_state st;
    ks_json_state_init(s, &st);
    char doc[512];
    size_t n = ks_json_state_finish(s, &st, doc, sizeof doc);
    assert_true(n > 0 && n < sizeof doc);
    char text[1024];
    snprintf(text, sizeof text, "%s%s%s", op, doc, cl);
    ks_tool_parsed p;
    assert_true(ks_tool_parse(as, text, strlen(text), NAMES, 2, &p));
    if (p.n_calls != 1) fail_msg("%s: %s gave %d calls", ks_tool_syntax_name(syn), text, p.n_calls);
    if (want_name) assert_string_equal(p.calls[0].name, want_name);
    ks_tool_parsed_free(&p);
    ks_json_schema_destroy(s);
    free(op);
    free(sch);
    free(cl);
}

static void test_forced(void **state) {
    (void)state;
    for (int syn = KS_TOOLS_GENERIC; syn <= KS_TOOLS_DEEPSEEK; syn++) {
        check_forced((ks_tool_syntax)syn, "get_weather", "get_weather");
        check_forced((ks_tool_syntax)syn, "add", "add");
        check_forced((ks_tool_syntax)syn, NULL, NULL);
    }
    char *op, *sch, *cl;
    ks_tool_syntax as;
    assert_false(ks_tool_forced(KS_TOOLS_HERMES, "not json", NULL, &op, &sch, &cl, &as));
    assert_false(ks_tool_forced(KS_TOOLS_HERMES, TOOLS, "nope", &op, &sch, &cl, &as));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hermes),  cmocka_unit_test(test_llama3),      cmocka_unit_test(test_mistral),
        cmocka_unit_test(test_harmony), cmocka_unit_test(test_deepseek),    cmocka_unit_test(test_stream_safe),
        cmocka_unit_test(test_forced),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
