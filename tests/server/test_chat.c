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
    {KS_ROLE_SYSTEM, "You are a helpful assistant"}, {KS_ROLE_USER, "Hello"},
    {KS_ROLE_ASSISTANT, "Hi there"},                 {KS_ROLE_USER, "Who are you"},
    {KS_ROLE_ASSISTANT, "   I am an assistant   "},  {KS_ROLE_USER, "Another question"},
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
        {KS_ROLE_USER, "Hi"}, {KS_ROLE_ASSISTANT, "Hello"}, {KS_ROLE_SYSTEM, "Be brief."}, {KS_ROLE_USER, "Why?"}};
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
    const ks_chat_message two_sys[] = {{KS_ROLE_SYSTEM, "A"}, {KS_ROLE_SYSTEM, "B"}, {KS_ROLE_USER, "Q"}};
    s = render(KS_CHAT_LLAMA2, two_sys, 3);
    assert_string_equal(s, "[INST] <<SYS>>\nA\nB\n<</SYS>>\n\nQ [/INST]");
    free(s);
    s = render(KS_CHAT_CHATML, two_sys, 3);
    assert_string_equal(s, "<|im_start|>system\nA<|im_end|>\n<|im_start|>system\nB<|im_end|>\n"
                           "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n");
    free(s);
    /* a trailing system message is not dropped (llama2: an empty user turn carries it) */
    const ks_chat_message tail_sys[] = {{KS_ROLE_USER, "Q"}, {KS_ROLE_SYSTEM, "S"}};
    s = render(KS_CHAT_LLAMA2, tail_sys, 2);
    assert_string_equal(s, "[INST] Q [/INST]<s>[INST] <<SYS>>\nS\n<</SYS>> [/INST]");
    free(s);
    const ks_chat_message asst_first[] = {{KS_ROLE_ASSISTANT, "Welcome."}, {KS_ROLE_USER, "Hi"}, {KS_ROLE_USER, "?"}};
    s = render(KS_CHAT_LLAMA2, asst_first, 3);
    assert_string_equal(s, " Welcome. </s><s>[INST] Hi [/INST]<s>[INST] ? [/INST]");
    free(s);
    s = render(KS_CHAT_PHI3, asst_first, 3);
    assert_string_equal(s, "<|assistant|>\nWelcome.<|end|>\n<|user|>\nHi<|end|>\n<|user|>\n?<|end|>\n<|assistant|>\n");
    free(s);
    /* errors: no template, bad role, missing content, too small a buffer */
    const ks_chat_message one[] = {{KS_ROLE_USER, "x"}};
    size_t k = 0;
    char buf[8];
    assert_int_equal(ks_chat_render_family(KS_CHAT_NONE, NULL, NULL, one, 1, buf, sizeof buf, &k), KS_ERR_UNSUPPORTED);
    const ks_chat_message bad_role[] = {{(ks_chat_role)7, "x"}}, no_content[] = {{KS_ROLE_USER, NULL}};
    assert_int_equal(ks_chat_render_family(KS_CHAT_CHATML, NULL, NULL, bad_role, 1, buf, sizeof buf, &k),
                     KS_ERR_INVALID_ARG);
    assert_int_equal(ks_chat_render_family(KS_CHAT_CHATML, NULL, NULL, no_content, 1, buf, sizeof buf, &k),
                     KS_ERR_INVALID_ARG);
    assert_int_equal(ks_chat_render_family(KS_CHAT_CHATML, NULL, NULL, one, 1, buf, sizeof buf, &k), KS_ERR_INVALID_ARG);
    assert_int_equal(k, strlen("<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n") + 1);
}

/* A four-turn conversation grown one question and answer at a time. */
static const ks_chat_message growing[] = {
    {KS_ROLE_SYSTEM, "You answer questions about the document."},
    {KS_ROLE_USER, "Here is a document: the pass key is 31415. What is the pass key?"},
    {KS_ROLE_ASSISTANT, "The pass key is 31415."},
    {KS_ROLE_USER, "Say it backwards."},
    {KS_ROLE_ASSISTANT, "51413"},
    {KS_ROLE_USER, "And twice?"},
    {KS_ROLE_ASSISTANT, "31415 31415"},
    {KS_ROLE_USER, "Thanks. Summarise the conversation."},
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_renderings),
        cmocka_unit_test(test_other_orders),
        cmocka_unit_test(test_prefix_property),
        cmocka_unit_test(test_prefix_property_tokens),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
