/*
 * test_chat.c — multi-turn chat rendering for POST /v1/chat/completions
 * (src/tokenizer/tokenizer_chat.c), for every chat template the engine
 * knows: llama3, ChatML, phi-3 and llama2.
 *
 * Two promises are checked.  First, a whole conversation renders as the
 * model family's published Jinja template renders it (the expected strings
 * are written out from those templates, quoted in the comments, for the
 * conversation llama.cpp's tests/test-chat-template.cpp uses, so the two
 * can be compared by eye; the leading BOS the Jinja writes is left out
 * because the encoder adds it).  Second, the property the prefix cache
 * lives on: turn N's rendering plus the assistant's answer is a prefix of
 * turn N+1's rendering, as text for every family and as token ids for the
 * phi-3 and llama (as llama2) vocabularies of the fixtures, so a follow-up
 * question shares every token of the previous turn.
 */
#include "testutil.h"

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const ks_chat_family families[] = {KS_CHAT_LLAMA3, KS_CHAT_CHATML, KS_CHAT_PHI3, KS_CHAT_LLAMA2};

/* The rendering of msgs[n] in fam (malloc'd), with llama's BOS and EOS texts. */
static char *render(ks_chat_family fam, const ks_chat_message *msgs, size_t n) {
    size_t need = 0;
    assert_int_equal(ks_chat_render_family(fam, "<s>", "</s>", msgs, n, NULL, 0, &need), KS_ERR_INVALID_ARG);
    char *buf = malloc(need);
    size_t len = 0;
    assert_int_equal(ks_chat_render_family(fam, "<s>", "</s>", msgs, n, buf, need, &len), KS_OK);
    assert_int_equal(len + 1, need);
    assert_int_equal(strlen(buf), len);
    return buf;
}

/* llama.cpp's test conversation: system, then three user turns with two
 * answers between them, the second answer padded with spaces. */
static const ks_chat_message conversation[] = {
    {.role = KS_ROLE_SYSTEM, .content = "You are a helpful assistant"}, {.role = KS_ROLE_USER, .content = "Hello"},
    {.role = KS_ROLE_ASSISTANT, .content = "Hi there"},                 {.role = KS_ROLE_USER, .content = "Who are you"},
    {.role = KS_ROLE_ASSISTANT, .content = "   I am an assistant   "},  {.role = KS_ROLE_USER, .content = "Another question"},
};
enum { N_CONV = sizeof conversation / sizeof conversation[0] };

static void expect_rendering(ks_chat_family fam, const char *want) {
    char *got = render(fam, conversation, N_CONV);
    if (strcmp(got, want)) fail_msg("%s:\n got: %s\nwant: %s", ks_chat_family_name(fam), got, want);
    free(got);
}

static void test_reference_renderings(void **state) {
    (void)state;
    /* Meta-Llama-3-Instruct:
     * {% set loop_messages = messages %}{% for message in loop_messages %}{% set content =
     * '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim +
     * '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}
     * {% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %} */
    expect_rendering(KS_CHAT_LLAMA3,
                     "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|>"
                     "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
                     "<|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|>"
                     "<|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|>"
                     "<|start_header_id|>assistant<|end_header_id|>\n\nI am an assistant<|eot_id|>"
                     "<|start_header_id|>user<|end_header_id|>\n\nAnother question<|eot_id|>"
                     "<|start_header_id|>assistant<|end_header_id|>\n\n");
    /* ChatML (OpenHermes-2.5, Qwen without its default system message):
     * {% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] +
     * '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %} */
    expect_rendering(KS_CHAT_CHATML,
                     "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n"
                     "<|im_start|>user\nHello<|im_end|>\n"
                     "<|im_start|>assistant\nHi there<|im_end|>\n"
                     "<|im_start|>user\nWho are you<|im_end|>\n"
                     "<|im_start|>assistant\n   I am an assistant   <|im_end|>\n"
                     "<|im_start|>user\nAnother question<|im_end|>\n"
                     "<|im_start|>assistant\n");
    /* Phi-3-small / Phi-3-vision / Phi-3.5-mini:
     * {{ bos_token }}{% for message in messages %}{{'<|' + message['role'] + '|>' + '\n' + message['content'] +
     * '<|end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %} */
    expect_rendering(KS_CHAT_PHI3,
                     "<|system|>\nYou are a helpful assistant<|end|>\n"
                     "<|user|>\nHello<|end|>\n"
                     "<|assistant|>\nHi there<|end|>\n"
                     "<|user|>\nWho are you<|end|>\n"
                     "<|assistant|>\n   I am an assistant   <|end|>\n"
                     "<|user|>\nAnother question<|end|>\n"
                     "<|assistant|>\n");
    /* Llama-2-chat (meta-llama/Llama-2-7b-chat-hf):
     * {% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message =
     * messages[0]['content'] %}{% else %}...{% endif %}{% for message in loop_messages %}...{% if loop.index0 == 0 and
     * system_message != false %}{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content']
     * %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token +
     * '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() +
     * ' ' + eos_token }}{% endif %}{% endfor %} */
    expect_rendering(KS_CHAT_LLAMA2,
                     "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST] Hi there </s>"
                     "<s>[INST] Who are you [/INST] I am an assistant </s>"
                     "<s>[INST] Another question [/INST]");
}

/* Single-turn requests render as before (ks_tokenizer_chat_format's
 * contract), and the shapes the server allows beyond the templates' own
 * alternation: several system messages, a system message later on, an
 * assistant message first, consecutive user messages. */
static void test_other_orders(void **state) {
    (void)state;
    const ks_chat_message late_sys[] = {
        {.role = KS_ROLE_USER, .content = "Hi"}, {.role = KS_ROLE_ASSISTANT, .content = "Hello"}, {.role = KS_ROLE_SYSTEM, .content = "Be brief."}, {.role = KS_ROLE_USER, .content = "Why?"}};
    char *s = render(KS_CHAT_LLAMA3, late_sys, 4);
    assert_string_equal(s, "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                           "<|start_header_id|>assistant<|end_header_id|>\n\nHello<|eot_id|>"
                           "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                           "<|start_header_id|>user<|end_header_id|>\n\nWhy?<|eot_id|>"
                           "<|start_header_id|>assistant<|end_header_id|>\n\n");
    free(s);
    /* llama2 has system text only inside a user turn: it joins the next one */
    s = render(KS_CHAT_LLAMA2, late_sys, 4);
    assert_string_equal(s, "[INST] Hi [/INST] Hello </s><s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nWhy? [/INST]");
    free(s);
    const ks_chat_message two_sys[] = {{.role = KS_ROLE_SYSTEM, .content = "A"}, {.role = KS_ROLE_SYSTEM, .content = "B"}, {.role = KS_ROLE_USER, .content = "Q"}};
    s = render(KS_CHAT_LLAMA2, two_sys, 3);
    assert_string_equal(s, "[INST] <<SYS>>\nA\nB\n<</SYS>>\n\nQ [/INST]");
    free(s);
    s = render(KS_CHAT_CHATML, two_sys, 3);
    assert_string_equal(s, "<|im_start|>system\nA<|im_end|>\n<|im_start|>system\nB<|im_end|>\n"
                           "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n");
    free(s);
    /* a trailing system message is not dropped (llama2: an empty user turn carries it) */
    const ks_chat_message tail_sys[] = {{.role = KS_ROLE_USER, .content = "Q"}, {.role = KS_ROLE_SYSTEM, .content = "S"}};
    s = render(KS_CHAT_LLAMA2, tail_sys, 2);
    assert_string_equal(s, "[INST] Q [/INST]<s>[INST] <<SYS>>\nS\n<</SYS>> [/INST]");
    free(s);
    const ks_chat_message asst_first[] = {{.role = KS_ROLE_ASSISTANT, .content = "Welcome."}, {.role = KS_ROLE_USER, .content = "Hi"}, {.role = KS_ROLE_USER, .content = "?"}};
    s = render(KS_CHAT_LLAMA2, asst_first, 3);
    assert_string_equal(s, " Welcome. </s><s>[INST] Hi [/INST]<s>[INST] ? [/INST]");
    free(s);
    s = render(KS_CHAT_PHI3, asst_first, 3);
    assert_string_equal(s, "<|assistant|>\nWelcome.<|end|>\n<|user|>\nHi<|end|>\n<|user|>\n?<|end|>\n<|assistant|>\n");
    free(s);
    /* errors: no template, bad role, missing content, too small a buffer */
    const ks_chat_message one[] = {{.role = KS_ROLE_USER, .content = "x"}};
    size_t k = 0;
    char buf[8];
    assert_int_equal(ks_chat_render_family(KS_CHAT_NONE, NULL, NULL, one, 1, buf, sizeof buf, &k), KS_ERR_UNSUPPORTED);
    const ks_chat_message bad_role[] = {{.role = (ks_chat_role)7, .content = "x"}}, no_content[] = {{.role = KS_ROLE_USER, .content = NULL}};
    assert_int_equal(ks_chat_render_family(KS_CHAT_CHATML, NULL, NULL, bad_role, 1, buf, sizeof buf, &k),
                     KS_ERR_INVALID_ARG);
    assert_int_equal(ks_chat_render_family(KS_CHAT_CHATML, NULL, NULL, no_content, 1, buf, sizeof buf, &k),
                     KS_ERR_INVALID_ARG);
    assert_int_equal(ks_chat_render_family(KS_CHAT_CHATML, NULL, NULL, one, 1, buf, sizeof buf, &k), KS_ERR_INVALID_ARG);
    assert_int_equal(k, strlen("<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n") + 1);
}

/* A four-turn conversation grown one question and answer at a time. */
static const ks_chat_message growing[] = {
    {.role = KS_ROLE_SYSTEM, .content = "You answer questions about the document."},
    {.role = KS_ROLE_USER, .content = "Here is a document: the pass key is 31415. What is the pass key?"},
    {.role = KS_ROLE_ASSISTANT, .content = "The pass key is 31415."},
    {.role = KS_ROLE_USER, .content = "Say it backwards."},
    {.role = KS_ROLE_ASSISTANT, .content = "51413"},
    {.role = KS_ROLE_USER, .content = "And twice?"},
    {.role = KS_ROLE_ASSISTANT, .content = "31415 31415"},
    {.role = KS_ROLE_USER, .content = "Thanks. Summarise the conversation."},
};
/* Number of messages up to and including user turn `turn` (1-based). */
static size_t turn_end(int turn) { return (size_t)(2 * turn); }

static void test_prefix_property(void **state) {
    (void)state;
    for (size_t f = 0; f < sizeof families / sizeof families[0]; f++) {
        ks_chat_family fam = families[f];
        for (int turn = 1; turn < 4; turn++) {
            char *a = render(fam, growing, turn_end(turn)), *b = render(fam, growing, turn_end(turn + 1));
            const char *answer = growing[turn_end(turn)].content;
            size_t la = strlen(a);
            if (strncmp(a, b, la))
                fail_msg("%s turn %d: not a prefix of the next turn:\n%s\n---\n%s", ks_chat_family_name(fam), turn, a, b);
            /* then the answer (llama2 writes a space before it) */
            const char *rest = b + la + (fam == KS_CHAT_LLAMA2 ? 1 : 0);
            if (strncmp(rest, answer, strlen(answer)))
                fail_msg("%s turn %d: the answer does not follow the previous prompt: '%s'", ks_chat_family_name(fam), turn,
                         b + la);
            free(a);
            free(b);
        }
    }
}

/* The same property as token ids through real vocabularies: phi-3's (its
 * template detected from the vocabulary) and llama's SentencePiece one
 * rendered as llama2 (whose BOS and EOS it writes between turns), each turn
 * encoded as the server encodes it (BOS added, special tokens parsed). */
static void check_token_prefix(const char *vocab, ks_chat_family fam) {
    char rel[128];
    snprintf(rel, sizeof rel, "tokenizer/ggml-vocab-%s.gguf", vocab);
    ks_gguf *g = NULL;
    assert_int_equal(ks_gguf_open(ks_test_fixture(rel), &g), KS_OK);
    ks_tokenizer *t = NULL;
    assert_int_equal(ks_tokenizer_create(g, &t), KS_OK);
    ks_gguf_close(g);
    bool own = ks_tokenizer_chat_family(t) == fam; /* else render for fam with the vocabulary's BOS/EOS */
    int32_t *prev = NULL;
    size_t n_prev = 0;
    for (int turn = 1; turn <= 4; turn++) {
        size_t len = 0, n = 0;
        char *text;
        if (own) {
            size_t need = 0;
            ks_tokenizer_chat_render(t, growing, turn_end(turn), NULL, 0, &need);
            text = malloc(need);
            assert_int_equal(ks_tokenizer_chat_render(t, growing, turn_end(turn), text, need, &len), KS_OK);
        } else {
            text = render(fam, growing, turn_end(turn));
            len = strlen(text);
        }
        ks_tokenizer_encode(t, text, len, true, true, NULL, 0, &n);
        int32_t *ids = malloc(sizeof *ids * n);
        assert_int_equal(ks_tokenizer_encode(t, text, len, true, true, ids, n, &n), KS_OK);
        if (prev) {
            assert_true(n > n_prev);
            for (size_t i = 0; i < n_prev; i++)
                if (ids[i] != prev[i])
                    fail_msg("%s as %s, turn %d: token %zu is %d, was %d in turn %d", vocab, ks_chat_family_name(fam),
                             turn, i, ids[i], prev[i], turn - 1);
        }
        free(prev);
        prev = ids;
        n_prev = n;
        free(text);
    }
    free(prev);
    ks_tokenizer_destroy(t);
}

static void test_prefix_property_tokens(void **state) {
    (void)state;
    check_token_prefix("phi-3", KS_CHAT_PHI3);
    check_token_prefix("llama-spm", KS_CHAT_LLAMA2);
}

/* Tools without a template: a family renders them the Hermes way (the
 * tools in a system message, the assistant's calls as <tool_call> blocks
 * with the arguments as JSON objects, results as <tool_response> user
 * turns).  With a template (phi-3's vocabulary carries Phi-3's), the
 * template gets them, and a template that does not mention tool calls
 * makes the syntax the generic JSON one. */
static void test_tools_family(void **state) {
    (void)state;
    const char *tools = "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}]";
    const ks_chat_message msgs[] = {
        {.role = KS_ROLE_SYSTEM, .content = "Be brief."},
        {.role = KS_ROLE_USER, .content = "Weather?"},
        {.role = KS_ROLE_ASSISTANT, .content = "",
         .tool_calls = "[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                       "\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}]"},
        {.role = KS_ROLE_TOOL, .content = "sunny", .tool_call_id = "c1", .name = "get_weather"},
    };
    size_t need = 0, len = 0;
    assert_int_equal(ks_chat_render_family_tools(KS_CHAT_PHI3, "<s>", "</s>", msgs, 4, tools, NULL, 0, &need),
                     KS_ERR_INVALID_ARG);
    char *buf = malloc(need);
    assert_int_equal(ks_chat_render_family_tools(KS_CHAT_PHI3, "<s>", "</s>", msgs, 4, tools, buf, need, &len), KS_OK);
    const char *want =
        "<|system|>\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}\n</tools>\n\nFor each function call, return a "
        "json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|end|>\n"
        "<|user|>\nWeather?<|end|>\n"
        "<|assistant|>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}\n</tool_call><|end|>\n"
        "<|user|>\n<tool_response>\nsunny\n</tool_response><|end|>\n<|assistant|>\n";
    assert_string_equal(buf, want);
    /* without tools and tool messages the rendering is the plain one */
    char *plain = render(KS_CHAT_PHI3, msgs, 2);
    assert_int_equal(ks_chat_render_family_tools(KS_CHAT_PHI3, "<s>", "</s>", msgs, 2, NULL, buf, need, &len), KS_OK);
    assert_string_equal(buf, plain);
    free(plain);
    free(buf);

    ks_gguf *g = NULL;
    assert_int_equal(ks_gguf_open(ks_test_fixture("tokenizer/ggml-vocab-phi-3.gguf"), &g), KS_OK);
    ks_tokenizer *t = NULL;
    assert_int_equal(ks_tokenizer_create(g, &t), KS_OK);
    ks_gguf_close(g);
    assert_int_equal(ks_tokenizer_tool_syntax(t), KS_TOOLS_GENERIC);
    need = 0;
    assert_int_equal(ks_tokenizer_chat_render_tools(t, msgs, 4, tools, NULL, 0, &need), KS_ERR_INVALID_ARG);
    buf = malloc(need);
    assert_int_equal(ks_tokenizer_chat_render_tools(t, msgs, 4, tools, buf, need, &len), KS_OK);
    assert_non_null(strstr(buf, "Weather?")); /* Phi-3's template writes only system, user and assistant turns */
    free(buf);
    ks_tokenizer_destroy(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_renderings),
        cmocka_unit_test(test_other_orders),
        cmocka_unit_test(test_prefix_property),
        cmocka_unit_test(test_prefix_property_tokens),
        cmocka_unit_test(test_tools_family),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
