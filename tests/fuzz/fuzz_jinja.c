/*
 * fuzz_jinja.c — libFuzzer entry point for the chat-template interpreter
 * (src/template/jinja.c): ks_jinja_parse, then ks_jinja_render.
 *
 * Why: the template comes from a GGUF file of any origin and runs on every
 * chat request, so the lexer, the parser and the evaluator must survive any
 * byte string: a clean status or a rendering, never a crash, a hang or an
 * unbounded allocation (the interpreter's own step, depth, value and output
 * limits are what keep a hostile template bounded).  The input is the
 * template; after a NUL byte, if any, the variables as JSON (a fixed
 * two-turn conversation otherwise), so mutations reach both the template
 * and the values it reads.  Built only with clang and -DKVSIEVE_FUZZ=ON;
 * seeds (published templates) in tests/fuzz/corpus_jinja/.
 */
#include "template/jinja.h"

#include <stdint.h>
#include <string.h>

static volatile size_t g_sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char def[] =
        "{\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":\" hi \"},"
        "{\"role\":\"assistant\",\"content\":\"<think>x</think>yo\"},{\"role\":\"user\",\"content\":\"q\"}],"
        "\"add_generation_prompt\":true,\"bos_token\":\"<s>\",\"eos_token\":\"</s>\"}";
    const uint8_t *nul = memchr(data, 0, size);
    size_t tlen = nul ? (size_t)(nul - data) : size;
    const char *vars = nul ? (const char *)nul + 1 : def;
    size_t vlen = nul ? size - tlen - 1 : sizeof def - 1;
    ks_jinja *t = NULL;
    if (ks_jinja_parse((const char *)data, tlen, &t) != KS_OK) return 0;
    char *out = NULL;
    size_t n = 0;
    if (ks_jinja_render(t, vars, vlen, 0, &out, &n) == KS_OK) {
        size_t h = 0;
        for (size_t i = 0; i < n; i++) h = h * 31 + (unsigned char)out[i]; /* ASan sees every byte */
        g_sink = h;
        ks_free(out);
    }
    ks_jinja_destroy(t);
    return 0;
}
