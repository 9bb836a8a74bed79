/*
 * test_tokenizer.c — the tokenizer against reference ids, plus round trips,
 * special tokens, chat prompts and malformed metadata.
 *
 * The reference ids come from llama.cpp's test-tokenizer-0 run on the same
 * vocabulary files, so matching them exactly is the definition of correct.
 * That tool reads *.inp by splitting on "\n__ggml_vocab_test__\n" (every
 * text, even the last, is followed by the separator, and a text keeps its
 * own leading/trailing newlines), and encodes without BOS and without
 * special-token parsing; we do the same.
 *
 * Malformed vocabularies are assembled byte by byte in memory so the tests
 * do not depend on the GGUF writer and can produce exactly the defect under
 * test (a length mismatch, an id out of range) that a writer would refuse.
 */
#include "testutil.h"

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *dupstr(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    memcpy(d, s, n);
    return d;
}

/* ------------------------------------------------------------- fixtures -- */

static ks_tokenizer *load_vocab(const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "tokenizer/ggml-vocab-%s.gguf", name);
    ks_gguf *g = NULL;
    ks_status st = ks_gguf_open(ks_test_fixture(rel), &g);
    if (st != KS_OK) print_error("open %s: %s\n", rel, ks_last_error());
    assert_int_equal(st, KS_OK);
    ks_tokenizer *t = NULL;
    st = ks_tokenizer_create(g, &t);
    if (st != KS_OK) print_error("tokenizer %s: %s\n", rel, ks_last_error());
    assert_int_equal(st, KS_OK);
    ks_gguf_close(g); /* the tokenizer must not depend on the mapping */
    return t;
}

typedef struct test_case {
    char *text;  /* [len] */
    size_t len;
    int32_t *ids; /* [n_ids] */
    size_t n_ids;
} test_case;

/* Inputs split like test-tokenizer-0: every text is followed by the separator. */
static size_t read_inputs(const char *name, test_case **out) {
    char rel[256];
    snprintf(rel, sizeof rel, "tokenizer/ggml-vocab-%s.gguf.inp", name);
    size_t len = 0;
    char *raw = ks_test_read_file(ks_test_fixture(rel), &len);
    assert_non_null(raw);
    static const char sep[] = "\n__ggml_vocab_test__\n";
    const size_t sl = sizeof sep - 1;
    size_t n = 0, cap = 64;
    test_case *v = calloc(cap, sizeof *v);
    size_t pos = 0;
    while (pos < len) {
        const char *p = NULL;
        for (size_t i = pos; i + sl <= len; i++)
            if (memcmp(raw + i, sep, sl) == 0) { p = raw + i; break; }
        if (!p) break;
        size_t tl = (size_t)(p - (raw + pos));
        if (n == cap) v = realloc(v, (cap *= 2) * sizeof *v);
        v[n].text = malloc(tl + 1);
        memcpy(v[n].text, raw + pos, tl);
        v[n].text[tl] = '\0';
        v[n].len = tl;
        n++;
        pos = (size_t)(p - raw) + sl;
    }
    free(raw);
    *out = v;
    return n;
}

/* Reference ids, one line per input (test-tokenizer-0's .out format), from a file. */
static void read_expected_file(const char *path, test_case *v, size_t n) {
    size_t len = 0;
    char *raw = ks_test_read_file(path, &len);
    assert_non_null(raw);
    char *line = raw;
    for (size_t i = 0; i < n; i++) {
        assert_true(line < raw + len || i == n - 1);
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        v[i].ids = malloc(sizeof(int32_t) * (strlen(line) / 2 + 1));
        v[i].n_ids = 0;
        char *p = line, *e;
        for (;;) {
            long x = strtol(p, &e, 10);
            if (e == p) break;
            v[i].ids[v[i].n_ids++] = (int32_t)x;
            p = e;
        }
        line = nl ? nl + 1 : raw + len;
    }
    free(raw);
}

static void read_expected(const char *name, test_case *v, size_t n) {
    char rel[256];
    snprintf(rel, sizeof rel, "tokenizer/ggml-vocab-%s.gguf.out", name);
    read_expected_file(ks_test_fixture(rel), v, n);
}

static void free_cases(test_case *v, size_t n) {
    for (size_t i = 0; i < n; i++) {
        free(v[i].text);
        free(v[i].ids);
    }
    free(v);
}

/* Concatenated pieces of ids; returns malloc'd buffer, length in *n. */
static char *decode(const ks_tokenizer *t, const int32_t *ids, size_t n_ids, size_t *n) {
    size_t cap = 64, len = 0;
    char *out = malloc(cap);
    for (size_t i = 0; i < n_ids; i++) {
        size_t k = 0;
        ks_status st = ks_tokenizer_piece(t, ids[i], NULL, 0, &k);
        assert_true(st == KS_OK || st == KS_ERR_INVALID_ARG);
        while (len + k + 1 > cap) out = realloc(out, cap *= 2);
        assert_int_equal(ks_tokenizer_piece(t, ids[i], out + len, cap - len, &k), KS_OK);
        len += k;
    }
    *n = len;
    return out;
}

static int32_t *encode(const ks_tokenizer *t, const char *text, size_t len, bool bos, bool special,
                       size_t *n) {
    size_t need = 0;
    ks_status st = ks_tokenizer_encode(t, text, len, bos, special, NULL, 0, &need);
    if (need > 0) assert_int_equal(st, KS_ERR_INVALID_ARG);
    else assert_int_equal(st, KS_OK);
    int32_t *ids = malloc(sizeof(int32_t) * (need + 1));
    size_t got = 0;
    st = ks_tokenizer_encode(t, text, len, bos, special, ids, need, &got);
    if (st != KS_OK) print_error("encode: %s\n", ks_last_error());
    assert_int_equal(st, KS_OK);
    assert_int_equal(got, need);
    *n = got;
    return ids;
}

/* Every input encodes to the reference ids and decodes back.  The inputs are
 * fixture `inputs`'s; the ids come from `expected` (a path), or from the
 * fixture's own .out file when it is NULL.  Takes ownership of t. */
static void check_reference_ids(const char *name, ks_tokenizer *t, const char *inputs, const char *expected,
                                bool spm_prefix) {
    test_case *v = NULL;
    size_t n = read_inputs(inputs, &v);
    assert_true(n > 40);
    if (expected) read_expected_file(expected, v, n);
    else read_expected(inputs, v, n);
    int failures = 0;
    for (size_t i = 0; i < n; i++) {
        size_t got = 0;
        int32_t *ids = encode(t, v[i].text, v[i].len, false, false, &got);
        bool same = got == v[i].n_ids && (got == 0 || memcmp(ids, v[i].ids, got * sizeof(int32_t)) == 0);
        if (!same) {
            failures++;
            print_error("%s case %zu '%.40s': got %zu ids, want %zu\n  got:", name, i, v[i].text, got, v[i].n_ids);
            for (size_t k = 0; k < got && k < 40; k++) print_error(" %d", ids[k]);
            print_error("\n want:");
            for (size_t k = 0; k < v[i].n_ids && k < 40; k++) print_error(" %d", v[i].ids[k]);
            print_error("\n");
        }
        /* decode(encode(x)) == x (SPM: with the space prefix it added) */
        size_t dn = 0;
        char *d = decode(t, ids, got, &dn);
        size_t skip = (spm_prefix && v[i].len > 0) ? 1 : 0;
        if (skip) assert_true(dn >= 1 && d[0] == ' ');
        if (dn - skip != v[i].len || memcmp(d + skip, v[i].text, v[i].len) != 0) {
            failures++;
            print_error("%s case %zu: round trip differs\n", name, i);
        }
        free(d);
        free(ids);
    }
    assert_int_equal(failures, 0);
    free_cases(v, n);
    ks_tokenizer_destroy(t);
}

static void check_reference(const char *name, bool spm_prefix) {
    check_reference_ids(name, load_vocab(name), name, NULL, spm_prefix);
}

/* The bundled model's own tokenizer (a SentencePiece BPE vocabulary trained by
 * tools/train_model.py) against SentencePiece's ids for the llama-spm inputs
 * (tests/golden/kvsieve-default.tokens.out, tools/make_goldens.py --bundled-tokens). */
static void test_bundled_reference(void **state) {
    (void)state;
    ks_gguf *g = NULL;
    ks_status st = ks_gguf_open(ks_test_source("models/kvsieve-default.gguf"), &g);
    if (st != KS_OK) print_error("open the bundled model: %s\n", ks_last_error());
    assert_int_equal(st, KS_OK);
    ks_tokenizer *t = NULL;
    assert_int_equal(ks_tokenizer_create(g, &t), KS_OK);
    ks_gguf_close(g);
    assert_int_equal(ks_tokenizer_n_vocab(t), 4096);
    check_reference_ids("kvsieve-default", t, "llama-spm", ks_test_source("tests/golden/kvsieve-default.tokens.out"),
                        true);
}

static void test_gpt2_reference(void **state) { (void)state; check_reference("gpt-2", false); }
static void test_llama_spm_reference(void **state) { (void)state; check_reference("llama-spm", true); }
static void test_deepseek_coder_reference(void **state) { (void)state; check_reference("deepseek-coder", false); }

/* Vocabularies without reference ids: loads, and round-trips the fixture texts. */
static void check_round_trip(const char *name, bool spm_prefix) {
    ks_tokenizer *t = load_vocab(name);
    test_case *v = NULL;
    size_t n = read_inputs("gpt-2", &v);
    static const char code[] = "int main(int argc, char **argv) {\n\tprintf(\"%d\\n\", argc);\n    return 0;\n}\n";
    for (size_t i = 0; i <= n; i++) {
        const char *text = i < n ? v[i].text : code;
        size_t len = i < n ? v[i].len : strlen(code);
        size_t got = 0, dn = 0;
        int32_t *ids = encode(t, text, len, false, false, &got);
        if (len > 0) assert_true(got > 0);
        for (size_t k = 0; k < got; k++) assert_true(ids[k] >= 0 && ids[k] < ks_tokenizer_n_vocab(t));
        char *d = decode(t, ids, got, &dn);
        size_t skip = (spm_prefix && len > 0) ? 1 : 0;
        if (dn - skip != len || memcmp(d + skip, text, len) != 0)
            print_error("%s: round trip of case %zu differs: '%.*s'\n", name, i, (int)dn, d);
        assert_int_equal(dn - skip, len);
        assert_memory_equal(d + skip, text, len);
        free(d);
        free(ids);
    }
    free_cases(v, n);
    ks_tokenizer_destroy(t);
}

static void test_falcon_round_trip(void **state) { (void)state; check_round_trip("falcon", false); }
static void test_phi3_round_trip(void **state) { (void)state; check_round_trip("phi-3", true); }
static void test_starcoder_round_trip(void **state) { (void)state; check_round_trip("starcoder", false); }

/* ------------------------------------------------------- special tokens -- */

static void test_gpt2_special(void **state) {
    (void)state;
    ks_tokenizer *t = load_vocab("gpt-2");
    assert_int_equal(ks_tokenizer_n_vocab(t), 50257);
    assert_int_equal(ks_tokenizer_bos(t), 50256);
    assert_int_equal(ks_tokenizer_eos(t), 50256);
    assert_true(ks_tokenizer_is_eog(t, 50256));
    assert_false(ks_tokenizer_is_eog(t, 15496));
    const char *s = "Hello<|endoftext|> world";
    size_t n = 0;
    int32_t *ids = encode(t, s, strlen(s), false, true, &n);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], 15496);
    assert_int_equal(ids[1], 50256);
    assert_int_equal(ids[2], 995);
    free(ids);
    /* without parse_special the marker is plain text */
    ids = encode(t, s, strlen(s), false, false, &n);
    assert_true(n > 3);
    for (size_t i = 0; i < n; i++) assert_int_not_equal(ids[i], 50256);
    size_t dn = 0;
    char *d = decode(t, ids, n, &dn);
    assert_int_equal(dn, strlen(s));
    assert_memory_equal(d, s, dn);
    free(d);
    free(ids);
    /* gpt-2 does not ask for BOS: add_bos is a request, the model decides */
    ids = encode(t, "Hello", 5, true, false, &n);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 15496);
    free(ids);
    /* capacity contract */
    int32_t small[1];
    size_t need = 0;
    assert_int_equal(ks_tokenizer_encode(t, "Hello world", 11, false, false, small, 1, &need), KS_ERR_INVALID_ARG);
    assert_int_equal(need, 2);
    /* piece of the control token is its text; bad id is an error */
    char buf[32];
    size_t k = 0;
    assert_int_equal(ks_tokenizer_piece(t, 50256, buf, sizeof buf, &k), KS_OK);
    assert_int_equal(k, 13);
    assert_string_equal(buf, "<|endoftext|>");
    assert_int_equal(ks_tokenizer_piece(t, 50256, buf, 4, &k), KS_ERR_INVALID_ARG);
    assert_int_equal(k, 13);
    assert_int_equal(ks_tokenizer_piece(t, 50257, buf, sizeof buf, &k), KS_ERR_INVALID_ARG);
    assert_int_equal(ks_tokenizer_piece(t, -1, buf, sizeof buf, &k), KS_ERR_INVALID_ARG);
    assert_int_equal(ks_tokenizer_chat_family(t), KS_CHAT_NONE);
    assert_int_equal(ks_tokenizer_chat_format(t, NULL, "hi", buf, sizeof buf, &k), KS_ERR_UNSUPPORTED);
    ks_tokenizer_destroy(t);
}

static void test_spm_bos_and_pieces(void **state) {
    (void)state;
    ks_tokenizer *t = load_vocab("llama-spm");
    assert_int_equal(ks_tokenizer_bos(t), 1);
    assert_int_equal(ks_tokenizer_eos(t), 2);
    assert_true(ks_tokenizer_is_eog(t, 2));
    assert_false(ks_tokenizer_is_eog(t, 1));
    size_t n = 0;
    int32_t *ids = encode(t, "Hello world", 11, true, false, &n);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 15043);
    assert_int_equal(ids[2], 3186);
    free(ids);
    /* empty text with BOS -> just BOS */
    ids = encode(t, "", 0, true, false, &n);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 1);
    free(ids);
    /* "</s>" is control: only parsed on request; the following text gets
     * the space prefix again, as after any special token */
    const char *s = "Hi</s>Hi";
    ids = encode(t, s, strlen(s), false, true, &n);
    assert_true(n >= 3);
    bool found = false;
    for (size_t i = 0; i < n; i++) found |= ids[i] == 2;
    assert_true(found);
    free(ids);
    char buf[16];
    size_t k = 0;
    assert_int_equal(ks_tokenizer_piece(t, 13, buf, sizeof buf, &k), KS_OK); /* <0x0A> */
    assert_int_equal(k, 1);
    assert_int_equal(buf[0], '\n');
    assert_int_equal(ks_tokenizer_piece(t, 15043, buf, sizeof buf, &k), KS_OK); /* ▁Hello */
    assert_string_equal(buf, " Hello");
    /* invalid UTF-8 is encoded through byte fallback, losslessly */
    const char bad[] = {'a', (char)0xFF, (char)0xC3, 'b'};
    ids = encode(t, bad, sizeof bad, false, false, &n);
    size_t dn = 0;
    char *d = decode(t, ids, n, &dn);
    assert_int_equal(dn, sizeof bad + 1);
    assert_memory_equal(d + 1, bad, sizeof bad);
    free(d);
    free(ids);
    ks_tokenizer_destroy(t);
}

static void test_deepseek_user_defined(void **state) {
    (void)state;
    ks_tokenizer *t = load_vocab("deepseek-coder");
    /* user-defined tokens are matched even without parse_special */
    const char *s = "<|User|>hi";
    size_t n = 0;
    int32_t *ids = encode(t, s, strlen(s), false, false, &n);
    assert_true(n >= 2);
    assert_int_equal(ids[0], 32019);
    free(ids);
    /* control tokens only with parse_special */
    s = "<｜end▁of▁sentence｜>";
    ids = encode(t, s, strlen(s), false, true, &n);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 32014);
    free(ids);
    ids = encode(t, s, strlen(s), false, false, &n);
    assert_true(n > 1);
    free(ids);
    assert_true(ks_tokenizer_is_eog(t, 32014));
    assert_true(ks_tokenizer_is_eog(t, 32021)); /* <|EOT|> */
    ids = encode(t, "x", 1, true, false, &n);     /* add_bos_token = true */
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 32013);
    free(ids);
    ks_tokenizer_destroy(t);
}

/* The tokenizer of a real converted model (llama2.c vocabulary, 512 tokens;
 * its pad/separator ids are the converter's 0xFFFFFFFF "none"). */
static void test_real_model_vocab(void **state) {
    (void)state;
    ks_gguf *g = NULL;
    assert_int_equal(ks_gguf_open(ks_test_fixture("models/aidreams260K.gguf"), &g), KS_OK);
    ks_tokenizer *t = NULL;
    ks_status st = ks_tokenizer_create(g, &t);
    if (st != KS_OK) print_error("%s\n", ks_last_error());
    assert_int_equal(st, KS_OK);
    ks_gguf_close(g);
    assert_int_equal(ks_tokenizer_n_vocab(t), 512);
    assert_int_equal(ks_tokenizer_bos(t), 1);
    assert_int_equal(ks_tokenizer_eos(t), 2);
    const char *s = "Once upon a time, pixels unfolding like petals.";
    size_t n = 0, dn = 0;
    int32_t *ids = encode(t, s, strlen(s), true, false, &n);
    assert_int_equal(ids[0], 1);
    assert_true(n > 5 && n < strlen(s));
    char *d = decode(t, ids + 1, n - 1, &dn);
    assert_int_equal(dn, strlen(s) + 1);
    assert_memory_equal(d + 1, s, strlen(s));
    free(d);
    free(ids);
    ks_tokenizer_destroy(t);
}

static void test_phi3_chat(void **state) {
    (void)state;
    ks_tokenizer *t = load_vocab("phi-3");
    assert_int_equal(ks_tokenizer_chat_family(t), KS_CHAT_PHI3);
    assert_true(ks_tokenizer_is_eog(t, 32000)); /* <|endoftext|> */
    assert_true(ks_tokenizer_is_eog(t, 32007)); /* <|end|> */
    char buf[256];
    size_t k = 0;
    assert_int_equal(ks_tokenizer_chat_format(t, NULL, "Hi", buf, sizeof buf, &k), KS_OK);
    assert_string_equal(buf, "<|user|>\nHi<|end|>\n<|assistant|>\n");
    assert_int_equal(k, strlen(buf));
    size_t n = 0;
    int32_t *ids = encode(t, buf, k, true, true, &n);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 32010);
    bool has_assistant = false; /* "\n" after it gets the SPM space prefix: ▁ <0x0A> */
    for (size_t i = 0; i < n; i++) has_assistant |= ids[i] == 32001;
    assert_true(has_assistant);
    assert_int_equal(ids[n - 1], 13);
    free(ids);
    ks_tokenizer_destroy(t);
}

/* ------------------------------------------------- in-memory vocabularies -- */

typedef struct gbuf {
    unsigned char *p; /* [cap] */
    size_t n, cap;
    uint64_t n_kv;
} gbuf;

static void gb_put(gbuf *b, const void *src, size_t n) {
    while (b->n + n > b->cap) b->p = realloc(b->p, b->cap = b->cap ? b->cap * 2 : 1024);
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void gb_u32(gbuf *b, uint32_t v) { gb_put(b, &v, 4); }
static void gb_u64(gbuf *b, uint64_t v) { gb_put(b, &v, 8); }
static void gb_str(gbuf *b, const char *s) { gb_u64(b, strlen(s)); gb_put(b, s, strlen(s)); }
static void gb_key(gbuf *b, const char *key, uint32_t type) { gb_str(b, key); gb_u32(b, type); b->n_kv++; }
static void gb_kv_str(gbuf *b, const char *key, const char *v) { gb_key(b, key, KS_GGUF_STRING); gb_str(b, v); }
static void gb_kv_u32(gbuf *b, const char *key, uint32_t v) { gb_key(b, key, KS_GGUF_UINT32); gb_u32(b, v); }
static void gb_kv_bool(gbuf *b, const char *key, bool v) { gb_key(b, key, KS_GGUF_BOOL); unsigned char c = v; gb_put(b, &c, 1); }
static void gb_kv_strs(gbuf *b, const char *key, const char *const *v, size_t n) {
    gb_key(b, key, KS_GGUF_ARRAY);
    gb_u32(b, KS_GGUF_STRING);
    gb_u64(b, n);
    for (size_t i = 0; i < n; i++) gb_str(b, v[i]);
}
static void gb_kv_arr(gbuf *b, const char *key, uint32_t type, const void *v, size_t n, size_t esz) {
    gb_key(b, key, KS_GGUF_ARRAY);
    gb_u32(b, type);
    gb_u64(b, n);
    gb_put(b, v, n * esz);
}
/* Header + kvs (kv count patched in). */
static unsigned char *gb_finish(gbuf *b, size_t *size) {
    gbuf h = {0};
    gb_u32(&h, KS_GGUF_MAGIC);
    gb_u32(&h, 3);
    gb_u64(&h, 0);
    gb_u64(&h, b->n_kv);
    gb_put(&h, b->p, b->n);
    free(b->p);
    *size = h.n;
    return h.p;
}

static ks_status try_create(gbuf *b, ks_tokenizer **t, unsigned char **mem) {
    size_t size = 0;
    *mem = gb_finish(b, &size);
    ks_gguf *g = NULL;
    ks_status st = ks_gguf_open_buffer(*mem, size, &g);
    if (st != KS_OK) print_error("gguf: %s\n", ks_last_error());
    assert_int_equal(st, KS_OK);
    st = ks_tokenizer_create(g, t);
    ks_gguf_close(g);
    return st;
}

/* A small SPM vocabulary: <unk> <s> </s>, 256 byte tokens, extras. */
static char **spm_tokens(const char *const *extra, size_t n_extra, size_t *n) {
    char **v = calloc(3 + 256 + n_extra, sizeof *v);
    v[0] = dupstr("<unk>");
    v[1] = dupstr("<s>");
    v[2] = dupstr("</s>");
    for (int i = 0; i < 256; i++) {
        v[3 + i] = malloc(8);
        snprintf(v[3 + i], 8, "<0x%02X>", i);
    }
    for (size_t i = 0; i < n_extra; i++) v[259 + i] = dupstr(extra[i]);
    *n = 259 + n_extra;
    return v;
}
static void free_tokens(char **v, size_t n) {
    for (size_t i = 0; i < n; i++) free(v[i]);
    free(v);
}
static int32_t *spm_types(size_t n, size_t n_control_extra) {
    int32_t *ty = malloc(n * sizeof *ty);
    for (size_t i = 0; i < n; i++) ty[i] = 1;
    ty[0] = 2;
    ty[1] = ty[2] = 3;
    for (int i = 0; i < 256; i++) ty[3 + i] = 6;
    for (size_t i = 0; i < n_control_extra; i++) ty[259 + i] = 3;
    return ty;
}

static void expect_format_error(gbuf *b, ks_status want, const char *needle) {
    ks_tokenizer *t = NULL;
    unsigned char *mem = NULL;
    ks_status st = try_create(b, &t, &mem);
    if (st != want || !strstr(ks_last_error(), needle))
        print_error("got %s: '%s', wanted %s containing '%s'\n", ks_status_str(st), ks_last_error(),
                    ks_status_str(want), needle);
    assert_int_equal(st, want);
    assert_null(t);
    assert_non_null(strstr(ks_last_error(), needle));
    free(mem);
}

static void test_bad_metadata(void **state) {
    (void)state;
    size_t n = 0;
    char **tok = spm_tokens(NULL, 0, &n);
    int32_t *ty = spm_types(n, 0);
    float *sc = calloc(n, sizeof *sc);

    gbuf b = {0}; /* no tokens at all */
    gb_kv_str(&b, "tokenizer.ggml.model", "llama");
    expect_format_error(&b, KS_ERR_FORMAT, "tokenizer.ggml.tokens");

    b = (gbuf){0}; /* scores shorter than tokens */
    gb_kv_str(&b, "tokenizer.ggml.model", "llama");
    gb_kv_strs(&b, "tokenizer.ggml.tokens", (const char *const *)tok, n);
    gb_kv_arr(&b, "tokenizer.ggml.scores", KS_GGUF_FLOAT32, sc, n - 1, 4);
    expect_format_error(&b, KS_ERR_FORMAT, "tokenizer.ggml.scores");

    b = (gbuf){0}; /* token_type longer than tokens */
    gb_kv_str(&b, "tokenizer.ggml.model", "llama");
    gb_kv_strs(&b, "tokenizer.ggml.tokens", (const char *const *)tok, n - 1);
    gb_kv_arr(&b, "tokenizer.ggml.token_type", KS_GGUF_INT32, ty, n, 4);
    expect_format_error(&b, KS_ERR_FORMAT, "tokenizer.ggml.token_type");

    b = (gbuf){0}; /* bos out of range */
    gb_kv_str(&b, "tokenizer.ggml.model", "llama");
    gb_kv_strs(&b, "tokenizer.ggml.tokens", (const char *const *)tok, n);
    gb_kv_arr(&b, "tokenizer.ggml.scores", KS_GGUF_FLOAT32, sc, n, 4);
    gb_kv_u32(&b, "tokenizer.ggml.bos_token_id", (uint32_t)n);
    expect_format_error(&b, KS_ERR_FORMAT, "bos_token_id");

    { /* 0xFFFFFFFF is the converters' "none": accepted as no token */
        b = (gbuf){0};
        gb_kv_str(&b, "tokenizer.ggml.model", "llama");
        gb_kv_strs(&b, "tokenizer.ggml.tokens", (const char *const *)tok, n);
        gb_kv_u32(&b, "tokenizer.ggml.bos_token_id", 1);
        gb_kv_u32(&b, "tokenizer.ggml.eos_token_id", UINT32_MAX);
        gb_kv_u32(&b, "tokenizer.ggml.padding_token_id", UINT32_MAX);
        ks_tokenizer *t = NULL;
        unsigned char *mem = NULL;
        assert_int_equal(try_create(&b, &t, &mem), KS_OK);
        assert_int_equal(ks_tokenizer_bos(t), 1);
        assert_int_equal(ks_tokenizer_eos(t), -1);
        ks_tokenizer_destroy(t);
        free(mem);
    }

    b = (gbuf){0}; /* eos out of range (but not the "none" marker) */
    gb_kv_str(&b, "tokenizer.ggml.model", "llama");
    gb_kv_strs(&b, "tokenizer.ggml.tokens", (const char *const *)tok, n);
    gb_kv_u32(&b, "tokenizer.ggml.eos_token_id", UINT32_MAX - 1);
    expect_format_error(&b, KS_ERR_FORMAT, "eos_token_id");

    b = (gbuf){0}; /* invalid token type */
    ty[5] = 9;
    gb_kv_str(&b, "tokenizer.ggml.model", "llama");
    gb_kv_strs(&b, "tokenizer.ggml.tokens", (const char *const *)tok, n);
    gb_kv_arr(&b, "tokenizer.ggml.token_type", KS_GGUF_INT32, ty, n, 4);
    expect_format_error(&b, KS_ERR_FORMAT, "type");
    ty[5] = 6;

    b = (gbuf){0}; /* tokens of the wrong type */
    gb_kv_str(&b, "tokenizer.ggml.model", "llama");
    gb_kv_arr(&b, "tokenizer.ggml.tokens", KS_GGUF_FLOAT32, sc, n, 4);
    expect_format_error(&b, KS_ERR_FORMAT, "array of strings");

    b = (gbuf){0}; /* invalid UTF-8 in a token */
    char *saved = tok[300 % n];
    tok[300 % n] = dupstr("\xff\xfe");
    gb_kv_str(&b, "tokenizer.ggml.model", "llama");
    gb_kv_strs(&b, "tokenizer.ggml.tokens", (const char *const *)tok, n);
    expect_format_error(&b, KS_ERR_FORMAT, "UTF-8");
    free(tok[300 % n]);
    tok[300 % n] = saved;

    b = (gbuf){0}; /* gpt2 without merges */
    gb_kv_str(&b, "tokenizer.ggml.model", "gpt2");
    gb_kv_strs(&b, "tokenizer.ggml.tokens", (const char *const *)tok, n);
    expect_format_error(&b, KS_ERR_FORMAT, "merges");

    b = (gbuf){0}; /* malformed merge */
    const char *merges[] = {"a b", "ab"};
    gb_kv_str(&b, "tokenizer.ggml.model", "gpt2");
    gb_kv_strs(&b, "tokenizer.ggml.tokens", (const char *const *)tok, n);
    gb_kv_strs(&b, "tokenizer.ggml.merges", merges, 2);
    expect_format_error(&b, KS_ERR_FORMAT, "merge 1");

    b = (gbuf){0}; /* unsupported model */
    gb_kv_str(&b, "tokenizer.ggml.model", "bert");
    gb_kv_strs(&b, "tokenizer.ggml.tokens", (const char *const *)tok, n);
    expect_format_error(&b, KS_ERR_UNSUPPORTED, "bert");

    free(sc);
    free(ty);
    free_tokens(tok, n);
}

/* GPT-2 byte alphabet for building a byte-level vocabulary by hand. */
static void byte_char(int b, char out[3]) {
    static int map[256];
    static int init = 0;
    if (!init) {
        int extra = 0;
        for (int i = 0; i < 256; i++) {
            bool direct = (i >= 33 && i <= 126) || (i >= 161 && i <= 172) || (i >= 174 && i <= 255);
            map[i] = direct ? i : 256 + extra++;
        }
        init = 1;
    }
    int cp = map[b];
    memset(out, 0, 3);
    if (cp < 0x80) out[0] = (char)cp;
    else { out[0] = (char)(0xC0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 0x3F)); }
}

/* A byte-level vocabulary: the 256 byte characters, then `extra` tokens
 * (normal) and `n_ctl` control tokens after them. */
static ks_tokenizer *make_bpe_vocab(const char *pre, const char *const *extra, size_t n_extra,
                                    size_t n_ctl, const char *const *merges, size_t n_merges,
                                    const char *tmpl) {
    size_t n = 256 + n_extra;
    char **tok = calloc(n, sizeof *tok);
    int32_t *ty = malloc(n * sizeof *ty);
    for (int i = 0; i < 256; i++) {
        tok[i] = malloc(3);
        byte_char(i, tok[i]);
        ty[i] = 1;
    }
    for (size_t i = 0; i < n_extra; i++) {
        tok[256 + i] = dupstr(extra[i]);
        ty[256 + i] = i + n_ctl >= n_extra ? 3 : 1;
    }
    gbuf b = {0};
    gb_kv_str(&b, "tokenizer.ggml.model", "gpt2");
    if (pre) gb_kv_str(&b, "tokenizer.ggml.pre", pre);
    gb_kv_strs(&b, "tokenizer.ggml.tokens", (const char *const *)tok, n);
    gb_kv_arr(&b, "tokenizer.ggml.token_type", KS_GGUF_INT32, ty, n, 4);
    gb_kv_strs(&b, "tokenizer.ggml.merges", merges, n_merges);
    if (n_ctl) {
        gb_kv_u32(&b, "tokenizer.ggml.bos_token_id", (uint32_t)(n - n_ctl));
        gb_kv_u32(&b, "tokenizer.ggml.eos_token_id", (uint32_t)(n - 1));
        gb_kv_bool(&b, "tokenizer.ggml.add_bos_token", true);
    }
    if (tmpl) gb_kv_str(&b, "tokenizer.chat_template", tmpl);
    ks_tokenizer *t = NULL;
    unsigned char *mem = NULL;
    ks_status st = try_create(&b, &t, &mem);
    if (st != KS_OK) print_error("%s\n", ks_last_error());
    assert_int_equal(st, KS_OK);
    free(mem); /* the tokenizer copied what it needs */
    free_tokens(tok, n);
    free(ty);
    return t;
}

/* Each pre-tokenizer family splits digits differently, and llama3 emits a
 * word that is a token without merging. */
static void test_pre_tokenizers(void **state) {
    (void)state;
    const char *extra[] = {"12", "123", "1234", "45", "xyz"};
    const char *merges[] = {"1 2", "12 3", "123 4", "4 5"};
    static const struct {
        const char *pre;
        int32_t want[5]; /* byte tokens have id = byte value */
        size_t n;
    } cases[] = {
        {"llama-bpe", {257, 259}, 2},      /* \p{N}{1,3}: "123" "45" */
        {"gpt-2", {258, '5'}, 2},          /* one word: "1234" + "5" */
        {"qwen2", {'1', '2', '3', '4', '5'}, 5}, /* single digits */
        {"deepseek-coder", {'1', '2', '3', '4', '5'}, 5},
        {"starcoder", {'1', '2', '3', '4', '5'}, 5},
        {"falcon", {257, 259}, 2},         /* [0-9]{3} pass after the gpt-2 one */
        {"gpt-4o", {257, 259}, 2},         /* o200k (gpt-oss): \p{N}{1,3} too */
        {"no-such-pre", {258, '5'}, 2},    /* warns, then behaves like gpt-2 */
        {NULL, {258, '5'}, 2},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ks_tokenizer *t = make_bpe_vocab(cases[c].pre, extra, 5, 0, merges, 4, NULL);
        size_t n = 0;
        int32_t *ids = encode(t, "12345", 5, false, false, &n);
        if (n != cases[c].n || memcmp(ids, cases[c].want, n * sizeof(int32_t)) != 0) {
            print_error("pre %s:", cases[c].pre ? cases[c].pre : "(none)");
            for (size_t i = 0; i < n; i++) print_error(" %d", ids[i]);
            print_error("\n");
        }
        assert_int_equal(n, cases[c].n);
        assert_memory_equal(ids, cases[c].want, n * sizeof(int32_t));
        free(ids);
        /* "xyz" has no merges: only llama3 (ignore_merges) emits it whole */
        ids = encode(t, "xyz", 3, false, false, &n);
        assert_int_equal(n, c == 0 ? 1 : 3);
        if (c == 0) assert_int_equal(ids[0], 260);
        free(ids);
        ks_tokenizer_destroy(t);
    }
}

static void test_llama3_chat(void **state) {
    (void)state;
    /* ids: He 256, ll 257, llo 258, then the control tokens 259..262 */
    const char *extra[] = {"He", "ll", "llo", "<|begin_of_text|>", "<|start_header_id|>",
                           "<|end_header_id|>", "<|eot_id|>"};
    const char *merges[] = {"H e", "l l", "ll o"};
    ks_tokenizer *t = make_bpe_vocab("llama-bpe", extra, 7, 4, merges, 3,
                                     "{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
                                     "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
                                     "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n"
                                     "{% endif %}");
    assert_int_equal(ks_tokenizer_chat_family(t), KS_CHAT_LLAMA3);
    char buf[512];
    size_t k = 0;
    assert_int_equal(ks_tokenizer_chat_format(t, "Be brief.", "Hello", buf, sizeof buf, &k), KS_OK);
    const char *want =
        "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n";
    assert_string_equal(buf, want);
    assert_int_equal(k, strlen(want));
    /* too small: needed size including the NUL */
    assert_int_equal(ks_tokenizer_chat_format(t, "Be brief.", "Hello", buf, 10, &k), KS_ERR_INVALID_ARG);
    assert_int_equal(k, strlen(want) + 1);
    assert_int_equal(ks_tokenizer_chat_format(t, NULL, "Hello", buf, sizeof buf, &k), KS_OK);
    assert_null(strstr(buf, "system"));
    char buf2[512]; /* llama3 templates trim the content */
    assert_int_equal(ks_tokenizer_chat_format(t, "", "  Hello \n", buf2, sizeof buf2, &k), KS_OK);
    assert_string_equal(buf2, buf);

    /* specials come out whole; "Hello" (not a token) merges to He + llo */
    size_t ni = 0;
    int32_t *ids = encode(t, buf, k, true, true, &ni);
    assert_int_equal(ids[0], 259);             /* BOS */
    assert_int_equal(ids[1], 260);             /* <|start_header_id|> */
    assert_int_equal(ids[ni - 1], '\n'); /* byte token of the second newline */
    int n_eot = 0, n_hello = 0;
    for (size_t i = 0; i < ni; i++) {
        n_eot += ids[i] == 262;
        if (i + 1 < ni && ids[i] == 256 && ids[i + 1] == 258) n_hello++;
    }
    assert_int_equal(n_eot, 1);
    assert_int_equal(n_hello, 1);
    assert_true(ks_tokenizer_is_eog(t, 262));
    free(ids);
    ks_tokenizer_destroy(t);
}

/* The GGUF's own template is executed (tokenizer_chat.c): what it says wins
 * over the family; the BOS it writes is dropped (the encoder adds it); a
 * template that rejects the conversation is an error; one this interpreter
 * cannot parse or run falls back to the detected family. */
static void test_gguf_template(void **state) {
    (void)state;
    const char *extra[] = {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"};
    const char *merges[] = {"H e"};
    ks_chat_message m[2] = {{.role = KS_ROLE_USER, .content = " Hi "}, {.role = KS_ROLE_ASSISTANT, .content = "Yo"}};
    char buf[512];
    size_t k = 0;
    /* executed: an unusual header the llama3 family would never write */
    ks_tokenizer *t = make_bpe_vocab("llama-bpe", extra, 4, 4, merges, 1,
                                     "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role | upper }}"
                                     "<|end_header_id|>[{{ m.content }}]<|eot_id|>{% endfor %}"
                                     "{% if add_generation_prompt %}<|start_header_id|>ASSISTANT<|end_header_id|>{% endif %}");
    assert_int_equal(ks_tokenizer_chat_render(t, m, 2, buf, sizeof buf, &k), KS_OK);
    assert_string_equal(buf, "<|start_header_id|>USER<|end_header_id|>[ Hi ]<|eot_id|>"
                             "<|start_header_id|>ASSISTANT<|end_header_id|>[Yo]<|eot_id|>"
                             "<|start_header_id|>ASSISTANT<|end_header_id|>");
    assert_int_equal(k, strlen(buf));
    assert_int_equal(ks_tokenizer_chat_render(t, m, 2, buf, 8, &k), KS_ERR_INVALID_ARG);
    assert_int_equal(k, strlen("<|start_header_id|>USER<|end_header_id|>[ Hi ]<|eot_id|>"
                               "<|start_header_id|>ASSISTANT<|end_header_id|>[Yo]<|eot_id|>"
                               "<|start_header_id|>ASSISTANT<|end_header_id|>") + 1);
    ks_tokenizer_destroy(t);
    /* rejected: the template's message is the error */
    t = make_bpe_vocab("llama-bpe", extra, 4, 4, merges, 1,
                       "<|start_header_id|>{% if messages[0].role != 'system' %}{{ raise_exception('System first!') }}{% endif %}");
    assert_int_equal(ks_tokenizer_chat_render(t, m, 2, buf, sizeof buf, &k), KS_ERR_INVALID_ARG);
    assert_non_null(strstr(ks_last_error(), "System first!"));
    ks_tokenizer_destroy(t);
    /* unparsable, and failing at run time: the llama3 family */
    const char *broken[] = {"<|start_header_id|>{% if %}", "<|start_header_id|>{{ messages | nosuchfilter }}"};
    for (int i = 0; i < 2; i++) {
        t = make_bpe_vocab("llama-bpe", extra, 4, 4, merges, 1, broken[i]);
        assert_int_equal(ks_tokenizer_chat_family(t), KS_CHAT_LLAMA3);
        assert_int_equal(ks_tokenizer_chat_render(t, m, 2, buf, sizeof buf, &k), KS_OK);
        assert_string_equal(buf, "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                                 "<|start_header_id|>assistant<|end_header_id|>\n\nYo<|eot_id|>"
                                 "<|start_header_id|>assistant<|end_header_id|>\n\n");
        ks_tokenizer_destroy(t);
    }
}

/* Tools reach the template as transformers passes them: `tools`, each
 * message's tool_calls with the arguments' JSON string turned into the
 * object, tool_call_id and name; the tool-call syntax is read from the
 * template's markers. */
static void test_gguf_template_tools(void **state) {
    (void)state;
    const char *extra[] = {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"};
    const char *merges[] = {"H e"};
    ks_tokenizer *t = make_bpe_vocab(
        "llama-bpe", extra, 4, 4, merges, 1,
        "{% if tools %}T={{ tools[0].function.name }};{% endif %}{% for m in messages %}{{ m.role }}:"
        "{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function.name }}({{ c.function.arguments.city }})"
        "{{ c.function.arguments | tojson }}{% endfor %}{% endif %}{% if m.tool_call_id %}[{{ m.tool_call_id }},{{ m.name }}]"
        "{% endif %}{{ m.content }}|{% endfor %}");
    assert_int_equal(ks_tokenizer_tool_syntax(t), KS_TOOLS_HERMES);
    const ks_chat_message m[] = {
        {.role = KS_ROLE_USER, .content = "Weather?"},
        {.role = KS_ROLE_ASSISTANT, .content = "",
         .tool_calls = "[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                       "\"arguments\":\"{\\\"city\\\": \\\"Paris\\\"}\"}}]"},
        {.role = KS_ROLE_TOOL, .content = "sunny", .tool_call_id = "c1", .name = "get_weather"},
    };
    char buf[512];
    size_t k = 0;
    assert_int_equal(ks_tokenizer_chat_render_tools(t, m, 3, "[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]",
                                                    buf, sizeof buf, &k), KS_OK);
    assert_string_equal(buf, "T=f;user:Weather?|assistant:<tool_call>get_weather(Paris){\"city\": \"Paris\"}|"
                             "tool:[c1,get_weather]sunny|");
    /* without tools the variable is undefined, as before */
    assert_int_equal(ks_tokenizer_chat_render(t, m, 1, buf, sizeof buf, &k), KS_OK);
    assert_string_equal(buf, "user:Weather?|");
    ks_tokenizer_destroy(t);
    /* the syntax each family's markers name */
    static const struct { const char *tmpl; ks_tool_syntax want; } syn[] = {
        {"<|start_header_id|>{{ '<|python_tag|>' }}", KS_TOOLS_LLAMA3},
        {"<|start_header_id|>[TOOL_CALLS]", KS_TOOLS_MISTRAL},
        {"<|start_header_id|><|call|> to=functions.", KS_TOOLS_HARMONY},
        {"<|start_header_id|><\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>", KS_TOOLS_DEEPSEEK},
        {"{{ messages[0].content }}", KS_TOOLS_GENERIC},
        {"<|start_header_id|>{% if %}", KS_TOOLS_HERMES}, /* unparsable: the family, which writes Hermes' */
    };
    for (size_t i = 0; i < sizeof syn / sizeof syn[0]; i++) {
        t = make_bpe_vocab("llama-bpe", extra, 4, 4, merges, 1, syn[i].tmpl);
        assert_int_equal(ks_tokenizer_tool_syntax(t), syn[i].want);
        ks_tokenizer_destroy(t);
    }
}

static void test_chatml_chat(void **state) {
    (void)state;
    const char *extra[] = {"<|im_start|>", "<|im_end|>"};
    size_t n = 0;
    char **tok = spm_tokens(extra, 2, &n);
    int32_t *ty = spm_types(n, 2);
    float *sc = calloc(n, sizeof *sc);
    gbuf b = {0};
    gb_kv_str(&b, "tokenizer.ggml.model", "llama");
    gb_kv_strs(&b, "tokenizer.ggml.tokens", (const char *const *)tok, n);
    gb_kv_arr(&b, "tokenizer.ggml.scores", KS_GGUF_FLOAT32, sc, n, 4);
    gb_kv_arr(&b, "tokenizer.ggml.token_type", KS_GGUF_INT32, ty, n, 4);
    gb_kv_u32(&b, "tokenizer.ggml.bos_token_id", 1);
    gb_kv_u32(&b, "tokenizer.ggml.eos_token_id", 2);
    gb_kv_bool(&b, "tokenizer.ggml.add_space_prefix", false);
    ks_tokenizer *t = NULL;
    unsigned char *mem = NULL;
    ks_status st = try_create(&b, &t, &mem); /* no template: family from the vocab */
    if (st != KS_OK) print_error("%s\n", ks_last_error());
    assert_int_equal(st, KS_OK);
    free(mem);
    assert_int_equal(ks_tokenizer_chat_family(t), KS_CHAT_CHATML);
    assert_true(ks_tokenizer_is_eog(t, 260)); /* <|im_end|> */
    char buf[256];
    size_t k = 0;
    assert_int_equal(ks_tokenizer_chat_format(t, "sys", "hi", buf, sizeof buf, &k), KS_OK);
    const char *want = "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
    assert_string_equal(buf, want);
    size_t ni = 0;
    int32_t *ids = encode(t, buf, k, false, true, &ni);
    /* every character is a byte token; specials come out whole */
    assert_int_equal(ids[0], 259);
    assert_int_equal(ids[1], 3 + 's');
    assert_int_equal(ids[ni - 1], 3 + '\n');
    int n_start = 0;
    for (size_t i = 0; i < ni; i++) n_start += ids[i] == 259;
    assert_int_equal(n_start, 3);
    free(ids);
    /* no space prefix (metadata said so) */
    ids = encode(t, "a b", 3, false, false, &ni);
    assert_int_equal(ni, 5); /* 'a' + U+2581 as 3 bytes + 'b' */
    assert_int_equal(ids[0], 3 + 'a');
    free(ids);
    ks_tokenizer_destroy(t);
    free_tokens(tok, n);
    free(ty);
    free(sc);
}

/* Random bytes (valid UTF-8 or not, with special strings mixed in) always
 * encode to in-range ids and decode back to the same bytes (parse_special is
 * off, so "<|endoftext|>" and "<s>" are plain text here). */
static void test_random_round_trip(void **state) {
    (void)state;
    const char *names[] = {"gpt-2", "llama-spm", "deepseek-coder", "falcon"};
    static const char *const frags[] = {" ", "  ", "\n", "\t", "a", "Z", "3", "'s", "é", "ü", "ж", "我", "🦙",
                                        "<|endoftext|>", "<s>", "\xff", "\xc3", "\x80", "\r\n", "!!"};
    ks_rng rng = {12345};
    for (int m = 0; m < 4; m++) {
        ks_tokenizer *t = load_vocab(names[m]);
        for (int it = 0; it < 300; it++) {
            char text[256];
            size_t len = 0;
            int nf = (int)(ks_rng_next(&rng) % 24);
            for (int f = 0; f < nf; f++) {
                const char *fr = frags[ks_rng_next(&rng) % (sizeof frags / sizeof frags[0])];
                /* Bytes that never occur in UTF-8 are not representable in every
                 * vocabulary: falcon lacks the byte characters of 0xC0, 0xFF, ...,
                 * and deepseek-coder's user-defined "ÿ", "ü", ... share their text
                 * with them.  Only gpt-2 and SPM (byte fallback) take them all. */
                unsigned char c0 = (unsigned char)fr[0];
                if (m >= 2 && ((c0 >= 0x80 && c0 < 0xC2) || c0 >= 0xF5)) continue;
                size_t fl = strlen(fr);
                memcpy(text + len, fr, fl);
                len += fl;
            }
            size_t n = 0, dn = 0;
            int32_t *ids = encode(t, text, len, false, false, &n);
            for (size_t i = 0; i < n; i++) assert_true(ids[i] >= 0 && ids[i] < ks_tokenizer_n_vocab(t));
            char *d = decode(t, ids, n, &dn);
            size_t skip = (m == 1 && len > 0) ? 1 : 0;
            if (dn - skip != len || memcmp(d + skip, text, len) != 0)
                print_error("%s: round trip differs for '%.*s' -> '%.*s'\n", names[m], (int)len, text, (int)dn, d);
            assert_int_equal(dn - skip, len);
            assert_memory_equal(d + skip, text, len);
            free(d);
            free(ids);
        }
        ks_tokenizer_destroy(t);
    }
}

/* ---------------------------------------------------------- long input -- */

static void test_long_input(void **state) {
    (void)state;
    test_case *v = NULL;
    size_t nc = read_inputs("gpt-2", &v);
    size_t want = 100 * 1024, len = 0;
    char *text = malloc(want + 4096);
    for (size_t i = 0; len < want; i = (i + 1) % nc) {
        memcpy(text + len, v[i].text, v[i].len);
        len += v[i].len;
        text[len++] = ' ';
    }
    char *run = malloc(want); /* one 100 KB word: worst case for merging */
    for (size_t i = 0; i < want; i++) run[i] = "ab"[i % 7 == 0];
    const char *names[] = {"gpt-2", "llama-spm", "deepseek-coder"};
    for (int m = 0; m < 3; m++) {
        ks_tokenizer *t = load_vocab(names[m]);
        double t0 = ks_time_sec();
        size_t n = 0, n2 = 0, dn = 0;
        int32_t *ids = encode(t, text, len, false, false, &n);
        double t1 = ks_time_sec();
        int32_t *ids2 = encode(t, run, want, false, false, &n2);
        double t2 = ks_time_sec();
        print_message("  %s: 100 KB text -> %zu tokens in %.3f s; 100 KB word -> %zu tokens in %.3f s\n",
                      names[m], n, t1 - t0, n2, t2 - t1);
        assert_true(n > 10000);
        char *d = decode(t, ids, n, &dn);
        size_t skip = m == 1 ? 1 : 0;
        assert_int_equal(dn - skip, len);
        assert_memory_equal(d + skip, text, len);
        free(d);
        free(ids);
        free(ids2);
        ks_tokenizer_destroy(t);
    }
    free(run);
    free(text);
    free_cases(v, nc);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2_reference),
        cmocka_unit_test(test_llama_spm_reference),
        cmocka_unit_test(test_bundled_reference),
        cmocka_unit_test(test_deepseek_coder_reference),
        cmocka_unit_test(test_falcon_round_trip),
        cmocka_unit_test(test_phi3_round_trip),
        cmocka_unit_test(test_starcoder_round_trip),
        cmocka_unit_test(test_gpt2_special),
        cmocka_unit_test(test_spm_bos_and_pieces),
        cmocka_unit_test(test_deepseek_user_defined),
        cmocka_unit_test(test_real_model_vocab),
        cmocka_unit_test(test_phi3_chat),
        cmocka_unit_test(test_bad_metadata),
        cmocka_unit_test(test_pre_tokenizers),
        cmocka_unit_test(test_llama3_chat),
        cmocka_unit_test(test_gguf_template),
        cmocka_unit_test(test_gguf_template_tools),
        cmocka_unit_test(test_chatml_chat),
        cmocka_unit_test(test_random_round_trip),
        cmocka_unit_test(test_long_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
