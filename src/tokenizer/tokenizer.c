/*
 * tokenizer.c — loading and validating GGUF tokenizer metadata, queries,
 * special-token partitioning, pieces and end-of-generation ids.  The string
 * tables and the merge queue live in tokenizer_tables.c,
 * the merge algorithms in tokenizer_spm.c / tokenizer_bpe.c, chat templates
 * in tokenizer_chat.c.
 *
 * Validation happens once, here, and is strict: a vocabulary whose arrays
 * disagree in length or whose special ids point outside it would otherwise
 * surface much later as a wrong token or an out-of-bounds read during
 * generation.  Everything the encoder touches is copied out of the GGUF
 * mapping, so the tokenizer has no lifetime tie to the file.
 *
 * Special tokens are split out of the text before any merging, longest
 * string first, over every remaining raw fragment — the order the reference
 * uses, which matters when one special string contains another.  Scanning
 * per special token is O(n_special * len); a bitmap of the byte pairs that
 * occur in the text lets us skip the (usually many) tokens that cannot
 * occur, so large user-defined vocabularies stay cheap on long prompts.
 */
#include "tokenizer/tokenizer_internal.h"

#include <string.h>

/* ------------------------------------------------------------- loading -- */

static bool ks_tok_mem_contains(const char *hay, size_t n, const char *needle) {
    size_t k = strlen(needle);
    if (k == 0) return true;
    for (size_t i = 0; i + k <= n; i++) {
        const char *p = memchr(hay + i, needle[0], n - i - k + 1);
        if (!p) return false;
        i = (size_t)(p - hay);
        if (memcmp(p, needle, k) == 0) return true;
    }
    return false;
}

/* Optional token-id key: absent -> *id unchanged; present -> must be in
 * range.  Converters write "none" as -1 or its uint32 image 0xFFFFFFFF;
 * that reads as absent (-1), any other out-of-range value is an error. */
static ks_status ks_tok_read_id(const ks_gguf *g, const char *key, int32_t n_vocab, int32_t *id) {
    const ks_gguf_kv *kv = ks_gguf_find_kv(g, key);
    if (!kv) return KS_OK;
    int32_t v = -1;
    uint32_t u = 0;
    if (ks_gguf_get_u32(g, key, &u) == KS_OK && u == UINT32_MAX) {
        *id = -1;
        return KS_OK;
    }
    if (ks_gguf_get_i32(g, key, &v) != KS_OK)
        return KS_FAIL(KS_ERR_FORMAT, "tokenizer: '%s' is not a 32-bit integer (type %s)", key,
                       ks_gguf_type_name(kv->type));
    if (v == -1) {
        *id = -1;
        return KS_OK;
    }
    if (v < 0 || v >= n_vocab)
        return KS_FAIL(KS_ERR_FORMAT, "tokenizer: '%s' = %d is outside the vocabulary [0, %d)", key,
                       v, n_vocab);
    *id = v;
    return KS_OK;
}

static ks_status ks_tok_read_bool(const ks_gguf *g, const char *key, bool *v) {
    if (!ks_gguf_find_kv(g, key)) return KS_OK;
    if (ks_gguf_get_bool(g, key, v) != KS_OK)
        return KS_FAIL(KS_ERR_FORMAT, "tokenizer: '%s' is not a bool", key);
    return KS_OK;
}

/* A numeric array of exactly n elements, or absent (*out = NULL). */
static ks_status ks_tok_read_num_arr(const ks_gguf *g, const char *key, int32_t n,
                                     const ks_gguf_kv **out) {
    *out = NULL;
    const ks_gguf_kv *kv = ks_gguf_find_kv(g, key);
    if (!kv) return KS_OK;
    if (kv->type != KS_GGUF_ARRAY || kv->arr_type == KS_GGUF_STRING || kv->arr_type == KS_GGUF_ARRAY ||
        kv->arr_type == KS_GGUF_BOOL || !kv->arr_data)
        return KS_FAIL(KS_ERR_FORMAT, "tokenizer: '%s' must be a numeric array", key);
    if (kv->arr_n != (uint64_t)n)
        return KS_FAIL(KS_ERR_FORMAT, "tokenizer: '%s' has %llu entries but the vocabulary has %d tokens",
                       key, (unsigned long long)kv->arr_n, n);
    *out = kv;
    return KS_OK;
}

typedef struct ks_tok_special_key {
    uint32_t len;
    int32_t id;
} ks_tok_special_key;

static int ks_tok_cmp_special(const void *a, const void *b) {
    const ks_tok_special_key *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Longest text first; ties by id so the order is deterministic. */
static ks_status ks_tok_sort_special(ks_tokenizer *t) {
    if (t->n_special < 2) return KS_OK;
    ks_tok_special_key *k = ks_malloc((size_t)t->n_special * sizeof *k);
    if (!k) return KS_FAIL(KS_ERR_NOMEM, "tokenizer: %d special tokens", t->n_special);
    for (int32_t i = 0; i < t->n_special; i++) {
        int32_t id = t->special_ids[i];
        k[i] = (ks_tok_special_key){t->vocab.off[id + 1] - t->vocab.off[id], id};
    }
    qsort(k, (size_t)t->n_special, sizeof *k, ks_tok_cmp_special);
    for (int32_t i = 0; i < t->n_special; i++) t->special_ids[i] = k[i].id;
    ks_free(k);
    return KS_OK;
}

static bool ks_tok_text_is(const ks_tokenizer *t, int32_t id, const char *s) {
    size_t n = t->vocab.off[id + 1] - t->vocab.off[id];
    return n == strlen(s) && memcmp(t->vocab.blob + t->vocab.off[id], s, n) == 0;
}

static int32_t ks_tok_find_cstr(const ks_tokenizer *t, const char *s) {
    return ks_tok_vocab_find(t, s, strlen(s));
}

static ks_status ks_tok_build_pieces(ks_tokenizer *t) {
    const ks_tok_strset *v = &t->vocab;
    t->piece_blob = ks_malloc(v->off[v->n] ? v->off[v->n] : 1);
    t->piece_off = ks_malloc(((size_t)v->n + 1) * sizeof(uint32_t));
    if (!t->piece_blob || !t->piece_off) return KS_FAIL(KS_ERR_NOMEM, "tokenizer: pieces of %d tokens", v->n);
    size_t o = 0;
    for (int32_t id = 0; id < v->n; id++) {
        t->piece_off[id] = (uint32_t)o;
        const char *s = v->blob + v->off[id];
        size_t n = v->off[id + 1] - v->off[id];
        uint8_t ty = t->types[id];
        char *dst = t->piece_blob + o;
        if (ty == KS_TT_CONTROL || ty == KS_TT_UNKNOWN || (t->kind == KS_TOK_BPE && ty == KS_TT_USER_DEFINED)) {
            memcpy(dst, s, n);
            o += n;
        } else if (t->kind == KS_TOK_SPM && ty == KS_TT_BYTE) {
            static const char hex[] = "0123456789ABCDEF";
            const char *h1, *h2;
            if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>' ||
                !(h1 = memchr(hex, s[3] >= 'a' ? s[3] - 32 : s[3], 16)) ||
                !(h2 = memchr(hex, s[4] >= 'a' ? s[4] - 32 : s[4], 16)))
                return KS_FAIL(KS_ERR_FORMAT, "tokenizer: byte token %d is '%.*s', expected <0xNN>", id,
                               (int)(n > 16 ? 16 : n), s);
            dst[0] = (char)(((h1 - hex) << 4) | (h2 - hex));
            o += 1;
        } else if (t->kind == KS_TOK_SPM) {
            for (size_t i = 0; i < n;) { /* U+2581 -> ' ' */
                if (i + 3 <= n && (unsigned char)s[i] == 0xE2 && (unsigned char)s[i + 1] == 0x96 &&
                    (unsigned char)s[i + 2] == 0x81) {
                    dst[(o++) - t->piece_off[id]] = ' ';
                    i += 3;
                } else {
                    dst[(o++) - t->piece_off[id]] = s[i++];
                }
            }
        } else {
            o += ks_tok_bpe_unmap(t, s, n, dst);
        }
    }
    t->piece_off[v->n] = (uint32_t)o;
    return KS_OK;
}

static void ks_tok_add_eog(ks_tokenizer *t, int32_t id) {
    if (id < 0) return;
    for (int i = 0; i < t->n_eog; i++)
        if (t->eog_ids[i] == id) return;
    if (t->n_eog < KS_TOK_MAX_EOG) t->eog_ids[t->n_eog++] = id;
}

static ks_chat_family ks_tok_detect_chat(const ks_tokenizer *t, const ks_gguf *g) {
    ks_gguf_str tmpl = {0, NULL};
    const ks_gguf_kv *kv = ks_gguf_find_kv(g, "tokenizer.chat_template");
    if (kv && kv->type == KS_GGUF_STRING) tmpl = kv->str;
    if (tmpl.len) {
        if (ks_tok_mem_contains(tmpl.data, tmpl.len, "<|start_header_id|>")) return KS_CHAT_LLAMA3;
        if (ks_tok_mem_contains(tmpl.data, tmpl.len, "<|im_start|>")) return KS_CHAT_CHATML;
        if (ks_tok_mem_contains(tmpl.data, tmpl.len, "<|user|>") &&
            ks_tok_mem_contains(tmpl.data, tmpl.len, "<|assistant|>") &&
            ks_tok_mem_contains(tmpl.data, tmpl.len, "<|end|>"))
            return KS_CHAT_PHI3;
        if (ks_tok_mem_contains(tmpl.data, tmpl.len, "[INST]")) return KS_CHAT_LLAMA2;
    }
    if (ks_tok_find_cstr(t, "<|start_header_id|>") >= 0 && ks_tok_find_cstr(t, "<|eot_id|>") >= 0)
        return KS_CHAT_LLAMA3;
    if (ks_tok_find_cstr(t, "<|im_start|>") >= 0 && ks_tok_find_cstr(t, "<|im_end|>") >= 0)
        return KS_CHAT_CHATML;
    if (ks_tok_find_cstr(t, "<|user|>") >= 0 && ks_tok_find_cstr(t, "<|assistant|>") >= 0 &&
        ks_tok_find_cstr(t, "<|end|>") >= 0)
        return KS_CHAT_PHI3;
    return KS_CHAT_NONE;
}

/* The tool-call syntax a template teaches, by the markers it writes around
 * a call.  Checked in this order because templates mention other
 * families' markers: Hermes-3 on Llama 3.1 writes <tool_call> inside
 * Llama 3 headers, DeepSeek's Llama distill writes both. */
static ks_tool_syntax ks_tok_detect_tools(const char *tmpl, size_t len) {
    if (ks_tok_mem_contains(tmpl, len, "<tool_call>")) return KS_TOOLS_HERMES;
    if (ks_tok_mem_contains(tmpl, len, "tool▁calls▁begin")) return KS_TOOLS_DEEPSEEK;
    if (ks_tok_mem_contains(tmpl, len, "[TOOL_CALLS]")) return KS_TOOLS_MISTRAL;
    if (ks_tok_mem_contains(tmpl, len, "to=functions") || ks_tok_mem_contains(tmpl, len, "<|call|>"))
        return KS_TOOLS_HARMONY;
    if (ks_tok_mem_contains(tmpl, len, "<|python_tag|>") || ks_tok_mem_contains(tmpl, len, "<|start_header_id|>"))
        return KS_TOOLS_LLAMA3;
    return KS_TOOLS_GENERIC;
}

ks_tool_syntax ks_tokenizer_tool_syntax(const ks_tokenizer *t) { return t ? t->tools : KS_TOOLS_GENERIC; }

static ks_status ks_tok_load(ks_tokenizer *t, const ks_gguf *g) {
    /* model */
    ks_gguf_str model;
    const ks_gguf_kv *kv = ks_gguf_find_kv(g, "tokenizer.ggml.model");
    if (!kv) return KS_FAIL(KS_ERR_FORMAT, "tokenizer: 'tokenizer.ggml.model' is missing");
    if (kv->type != KS_GGUF_STRING)
        return KS_FAIL(KS_ERR_FORMAT, "tokenizer: 'tokenizer.ggml.model' is not a string");
    model = kv->str;
    if (ks_gguf_str_eq(model, "llama")) t->kind = KS_TOK_SPM;
    else if (ks_gguf_str_eq(model, "gpt2")) t->kind = KS_TOK_BPE;
    else
        return KS_FAIL(KS_ERR_UNSUPPORTED, "tokenizer: model '%.*s' is not supported (only llama and gpt2)",
                       (int)(model.len > 64 ? 64 : model.len), model.data);

    /* tokens */
    kv = ks_gguf_find_kv(g, "tokenizer.ggml.tokens");
    if (!kv) return KS_FAIL(KS_ERR_FORMAT, "tokenizer: 'tokenizer.ggml.tokens' is missing");
    if (kv->type != KS_GGUF_ARRAY || kv->arr_type != KS_GGUF_STRING || !kv->arr_strs)
        return KS_FAIL(KS_ERR_FORMAT, "tokenizer: 'tokenizer.ggml.tokens' must be an array of strings");
    if (kv->arr_n == 0) return KS_FAIL(KS_ERR_FORMAT, "tokenizer: 'tokenizer.ggml.tokens' is empty");
    if (kv->arr_n > (uint64_t)INT32_MAX / 4)
        return KS_FAIL(KS_ERR_FORMAT, "tokenizer: %llu tokens is too many", (unsigned long long)kv->arr_n);
    const int32_t n = (int32_t)kv->arr_n;
    uint64_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        const ks_gguf_str s = kv->arr_strs[i];
        if (!ks_tok_utf8_valid((const unsigned char *)s.data, s.len))
            return KS_FAIL(KS_ERR_FORMAT, "tokenizer: token %d is not valid UTF-8", i);
        total += s.len;
    }
    if (total >= UINT32_MAX / 2) return KS_FAIL(KS_ERR_FORMAT, "tokenizer: token strings too large");
    t->n_vocab = n;
    const ks_gguf_kv *scores = NULL, *types = NULL;
    KS_TRY(ks_tok_read_num_arr(g, "tokenizer.ggml.scores", n, &scores));
    KS_TRY(ks_tok_read_num_arr(g, "tokenizer.ggml.token_type", n, &types));
    t->scores = ks_calloc((size_t)n, sizeof(float));
    t->types = ks_malloc((size_t)n);
    if (!t->scores || !t->types) return KS_FAIL(KS_ERR_NOMEM, "tokenizer: %d token scores", n);
    for (int32_t i = 0; i < n; i++) {
        if (scores) {
            double s = ks_gguf_arr_f64(scores, (uint64_t)i);
            if (s != s) return KS_FAIL(KS_ERR_FORMAT, "tokenizer: score of token %d is NaN", i);
            t->scores[i] = (float)s;
        }
        int64_t ty = types ? ks_gguf_arr_i64(types, (uint64_t)i) : KS_TT_NORMAL;
        if (ty < 0 || ty > KS_TT_BYTE)
            return KS_FAIL(KS_ERR_FORMAT, "tokenizer: token %d has invalid type %lld", i, (long long)ty);
        t->types[i] = (uint8_t)(ty == KS_TT_UNDEFINED ? KS_TT_NORMAL : ty);
    }
    KS_TRY(ks_tok_strset_build(&t->vocab, kv->arr_strs, n, true));
    /* Duplicate strings: the last id wins, as in the reference, except that a
     * normal/byte token beats a special one with the same text (deepseek's
     * user-defined "ÿ" duplicates the byte-level character for 0xFF; raw
     * bytes must keep mapping to the byte token or decoding is lossy). */
    for (int32_t i = 0; i < n; i++) {
        if (t->types[i] != KS_TT_NORMAL && t->types[i] != KS_TT_BYTE) continue;
        int32_t j = ks_tok_strset_find(&t->vocab, t->vocab.blob + t->vocab.off[i],
                                       t->vocab.off[i + 1] - t->vocab.off[i]);
        if (j >= 0 && j != i && t->types[j] != KS_TT_NORMAL && t->types[j] != KS_TT_BYTE)
            ks_tok_strset_point(&t->vocab, i);
    }

    /* merges */
    kv = ks_gguf_find_kv(g, "tokenizer.ggml.merges");
    if (t->kind == KS_TOK_BPE && !kv)
        return KS_FAIL(KS_ERR_FORMAT, "tokenizer: gpt2 vocabulary without 'tokenizer.ggml.merges'");
    if (t->kind == KS_TOK_BPE) {
        if (kv->type != KS_GGUF_ARRAY || kv->arr_type != KS_GGUF_STRING || !kv->arr_strs)
            return KS_FAIL(KS_ERR_FORMAT, "tokenizer: 'tokenizer.ggml.merges' must be an array of strings");
        if (kv->arr_n > (uint64_t)INT32_MAX / 4)
            return KS_FAIL(KS_ERR_FORMAT, "tokenizer: too many merges");
        const int32_t nm = (int32_t)kv->arr_n;
        uint64_t mtotal = 0;
        t->merge_split = ks_malloc((nm ? (size_t)nm : 1) * sizeof(uint32_t));
        if (!t->merge_split) return KS_FAIL(KS_ERR_NOMEM, "tokenizer: %d merges", nm);
        for (int32_t i = 0; i < nm; i++) {
            const ks_gguf_str s = kv->arr_strs[i];
            const char *sp = s.len > 1 ? memchr(s.data + 1, ' ', s.len - 1) : NULL;
            if (!sp || !ks_tok_utf8_valid((const unsigned char *)s.data, s.len))
                return KS_FAIL(KS_ERR_FORMAT, "tokenizer: merge %d '%.*s' is not \"left right\"", i,
                               (int)(s.len > 32 ? 32 : s.len), s.data);
            t->merge_split[i] = (uint32_t)(sp - s.data);
            mtotal += s.len;
        }
        if (mtotal >= UINT32_MAX / 2) return KS_FAIL(KS_ERR_FORMAT, "tokenizer: merge strings too large");
        KS_TRY(ks_tok_strset_build(&t->merges, kv->arr_strs, nm, false));
        ks_tok_bpe_init_bytes(t);
        ks_gguf_str pre = {0, NULL};
        const ks_gguf_kv *pkv = ks_gguf_find_kv(g, "tokenizer.ggml.pre");
        if (pkv) {
            if (pkv->type != KS_GGUF_STRING)
                return KS_FAIL(KS_ERR_FORMAT, "tokenizer: 'tokenizer.ggml.pre' is not a string");
            pre = pkv->str;
        }
        KS_TRY(ks_tok_bpe_compile_pre(t, pre.data, pre.len));
    }

    /* special ids and flags */
    t->bos = t->eos = t->eot = t->eom = t->unk = t->pad = -1;
    KS_TRY(ks_tok_read_id(g, "tokenizer.ggml.bos_token_id", n, &t->bos));
    KS_TRY(ks_tok_read_id(g, "tokenizer.ggml.eos_token_id", n, &t->eos));
    KS_TRY(ks_tok_read_id(g, "tokenizer.ggml.eot_token_id", n, &t->eot));
    KS_TRY(ks_tok_read_id(g, "tokenizer.ggml.eom_token_id", n, &t->eom));
    KS_TRY(ks_tok_read_id(g, "tokenizer.ggml.unknown_token_id", n, &t->unk));
    KS_TRY(ks_tok_read_id(g, "tokenizer.ggml.padding_token_id", n, &t->pad));
    t->add_bos = t->kind == KS_TOK_SPM;
    t->add_space_prefix = t->kind == KS_TOK_SPM;
    KS_TRY(ks_tok_read_bool(g, "tokenizer.ggml.add_bos_token", &t->add_bos));
    KS_TRY(ks_tok_read_bool(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix));

    /* SPM byte fallback table */
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_ids[b] = t->kind == KS_TOK_SPM ? ks_tok_find_cstr(t, name) : -1;
    }

    KS_TRY(ks_tok_build_pieces(t));

    /* special tokens, longest first */
    t->special_ids = ks_malloc((size_t)n * sizeof(int32_t));
    if (!t->special_ids) return KS_FAIL(KS_ERR_NOMEM, "tokenizer: special tokens of %d", n);
    for (int32_t i = 0; i < n; i++) {
        uint8_t ty = t->types[i];
        if ((ty == KS_TT_CONTROL || ty == KS_TT_USER_DEFINED || ty == KS_TT_UNKNOWN) &&
            t->vocab.off[i + 1] > t->vocab.off[i])
            t->special_ids[t->n_special++] = i;
    }
    KS_TRY(ks_tok_sort_special(t));

    /* end of generation */
    ks_tok_add_eog(t, t->eos);
    ks_tok_add_eog(t, t->eot);
    ks_tok_add_eog(t, t->eom);
    static const char *const eog_names[] = {
        "<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end_of_text|>", "<|endoftext|>", "<|end|>",
        "<end_of_turn>", "<|EOT|>", "<EOT>"};
    for (size_t k = 0; k < sizeof eog_names / sizeof eog_names[0]; k++) {
        int32_t id = ks_tok_find_cstr(t, eog_names[k]);
        if (id >= 0 && (t->types[id] == KS_TT_CONTROL || t->types[id] == KS_TT_USER_DEFINED) &&
            ks_tok_text_is(t, id, eog_names[k]))
            ks_tok_add_eog(t, id);
    }

    t->chat = ks_tok_detect_chat(t, g);
    /* The GGUF's own template, executed at render time (tokenizer_chat.c).
     * One this interpreter cannot parse is not fatal: the built-in family
     * detected above still formats chats, so the model stays usable. */
    kv = ks_gguf_find_kv(g, "tokenizer.chat_template");
    if (kv && kv->type == KS_GGUF_STRING && kv->str.len) {
        ks_status st = ks_jinja_parse(kv->str.data, kv->str.len, &t->chat_tmpl);
        if (st == KS_ERR_NOMEM) return st;
        if (st != KS_OK)
            KS_LOG(WARN, "tokenizer: the GGUF's chat template is not usable (%s); chats use the built-in %s format",
                   ks_last_error(), ks_chat_family_name(t->chat));
    }
    t->tools = t->chat_tmpl ? ks_tok_detect_tools(kv->str.data, kv->str.len) : KS_TOOLS_HERMES;
    return KS_OK;
}

ks_status ks_tokenizer_create(const ks_gguf *g, ks_tokenizer **out) {
    if (!g || !out) return KS_FAIL(KS_ERR_INVALID_ARG, "tokenizer: NULL argument");
    ks_tokenizer *t = ks_calloc(1, sizeof *t);
    if (!t) return KS_FAIL(KS_ERR_NOMEM, "tokenizer");
    ks_status st = ks_tok_load(t, g);
    if (st != KS_OK) {
        ks_tokenizer_destroy(t);
        return st;
    }
    *out = t;
    return KS_OK;
}

void ks_tokenizer_destroy(ks_tokenizer *t) {
    if (!t) return;
    ks_tok_strset_free(&t->vocab);
    ks_tok_strset_free(&t->merges);
    ks_free(t->merge_split);
    ks_free(t->scores);
    ks_free(t->types);
    ks_free(t->piece_blob);
    ks_free(t->piece_off);
    ks_free(t->special_ids);
    ks_tok_bpe_free_pre(t);
    ks_jinja_destroy(t->chat_tmpl);
    ks_free(t);
}

/* ------------------------------------------------------------ queries -- */

int32_t ks_tokenizer_n_vocab(const ks_tokenizer *t) { return t->n_vocab; }
int32_t ks_tokenizer_bos(const ks_tokenizer *t) { return t->bos; }
int32_t ks_tokenizer_eos(const ks_tokenizer *t) { return t->eos; }

bool ks_tokenizer_is_eog(const ks_tokenizer *t, int32_t id) {
    for (int i = 0; i < t->n_eog; i++)
        if (t->eog_ids[i] == id) return true;
    return false;
}

const char *ks_tokenizer_token_text(const ks_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) return NULL;
    if (len) *len = t->vocab.off[id + 1] - t->vocab.off[id];
    return t->vocab.blob + t->vocab.off[id];
}

int32_t ks_tokenizer_find(const ks_tokenizer *t, const char *text, size_t len) {
    if (!text && len) return -1;
    return ks_tok_vocab_find(t, text ? text : "", len);
}

ks_status ks_tokenizer_piece(const ks_tokenizer *t, int32_t id, char *buf, size_t cap, size_t *n_out) {
    if (!t || !n_out || (!buf && cap)) return KS_FAIL(KS_ERR_INVALID_ARG, "tokenizer: NULL argument");
    if (id < 0 || id >= t->n_vocab)
        return KS_FAIL(KS_ERR_INVALID_ARG, "tokenizer: token id %d outside [0, %d)", id, t->n_vocab);
    size_t n = t->piece_off[id + 1] - t->piece_off[id];
    if (n > cap) {
        *n_out = n;
        return KS_FAIL(KS_ERR_INVALID_ARG, "tokenizer: piece of token %d needs %zu bytes, buffer has %zu",
                       id, n, cap);
    }
    memcpy(buf, t->piece_blob + t->piece_off[id], n);
    if (n < cap) buf[n] = '\0';
    *n_out = n;
    return KS_OK;
}

/* ------------------------------------------------------------ encoding -- */

typedef struct ks_tok_frag {
    size_t off, len; /* raw text span (id < 0) */
    int32_t id;      /* token id, or -1 for raw text */
} ks_tok_frag;

typedef struct ks_tok_frags {
    ks_tok_frag *v; /* [cap] */
    size_t n, cap;
    bool refused; /* a fragment was dropped: the encode fails with KS_ERR_NOMEM */
} ks_tok_frags;

static void ks_tok_frags_push(ks_tok_frags *f, ks_tok_frag x) {
    if (f->refused) return;
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 16;
        ks_tok_frag *v = ks_realloc(f->v, cap * sizeof(ks_tok_frag));
        if (!v) {
            f->refused = true;
            return;
        }
        f->v = v;
        f->cap = cap;
    }
    f->v[f->n++] = x;
}

/* Split raw fragments at every occurrence of each special token (longest
 * first).  Result in *a. */
static void ks_tok_partition(const ks_tokenizer *t, const char *text, size_t len, bool parse_special,
                             ks_tok_frags *a, ks_tok_frags *b) {
    a->n = 0;
    if (len == 0) return;
    ks_tok_frags_push(a, (ks_tok_frag){0, len, -1});
    if (t->n_special == 0) return;
    /* which adjacent byte pairs occur at all: [65536 bits] */
    uint64_t *pairs = ks_calloc(65536 / 64, sizeof(uint64_t));
    if (!pairs) {
        a->refused = true;
        return;
    }
    bool bytes[256] = {false};
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)text[i];
        bytes[c] = true;
        if (i + 1 < len) {
            unsigned k = ((unsigned)c << 8) | (unsigned char)text[i + 1];
            pairs[k >> 6] |= 1ull << (k & 63);
        }
    }
    for (int32_t s = 0; s < t->n_special; s++) {
        int32_t id = t->special_ids[s];
        uint8_t ty = t->types[id];
        if (!parse_special && ty != KS_TT_USER_DEFINED) continue;
        const char *tok = t->vocab.blob + t->vocab.off[id];
        size_t tn = t->vocab.off[id + 1] - t->vocab.off[id];
        if (tn > len || !bytes[(unsigned char)tok[0]]) continue;
        if (tn >= 2) {
            unsigned k = ((unsigned)(unsigned char)tok[0] << 8) | (unsigned char)tok[1];
            if (!(pairs[k >> 6] & (1ull << (k & 63)))) continue;
        }
        b->n = 0;
        bool any = false;
        for (size_t f = 0; f < a->n; f++) {
            ks_tok_frag fr = a->v[f];
            if (fr.id >= 0 || fr.len < tn) {
                ks_tok_frags_push(b, fr);
                continue;
            }
            size_t pos = fr.off, end = fr.off + fr.len;
            while (pos + tn <= end) {
                const char *p = memchr(text + pos, tok[0], end - pos - tn + 1);
                if (!p) break;
                size_t at = (size_t)(p - text);
                if (memcmp(p, tok, tn) != 0) {
                    pos = at + 1;
                    continue;
                }
                if (at > fr.off) ks_tok_frags_push(b, (ks_tok_frag){fr.off, at - fr.off, -1});
                ks_tok_frags_push(b, (ks_tok_frag){at, tn, id});
                any = true;
                fr.len -= at + tn - fr.off;
                fr.off = at + tn;
                pos = fr.off;
            }
            if (fr.len > 0) ks_tok_frags_push(b, fr);
        }
        if (any) {
            ks_tok_frags tmp = *a;
            *a = *b;
            *b = tmp;
        }
    }
    ks_free(pairs);
}

ks_status ks_tokenizer_encode(const ks_tokenizer *t, const char *text, size_t len, bool add_bos,
                              bool parse_special, int32_t *ids, size_t cap, size_t *n_out) {
    if (!t || !n_out || (!text && len) || (!ids && cap))
        return KS_FAIL(KS_ERR_INVALID_ARG, "tokenizer: NULL argument");
    ks_tok_frags fa = {0}, fb = {0};
    ks_tok_ids out = {0};
    ks_status st = KS_OK;
    ks_tok_partition(t, text, len, parse_special, &fa, &fb);
    if (add_bos && t->add_bos && t->bos >= 0) ks_tok_ids_push(&out, t->bos);
    ks_tok_bpe_scratch *scratch = t->kind == KS_TOK_BPE ? ks_tok_bpe_scratch_create(t) : NULL;
    if (fa.refused || fb.refused || (t->kind == KS_TOK_BPE && !scratch))
        st = KS_FAIL(KS_ERR_NOMEM, "tokenizer: encoding %zu bytes", len);
    bool prev_special = true; /* SPM: the first fragment gets the space prefix */
    for (size_t i = 0; i < fa.n && st == KS_OK; i++) {
        const ks_tok_frag fr = fa.v[i];
        if (fr.id >= 0) {
            ks_tok_ids_push(&out, fr.id);
            prev_special = true;
        } else if (t->kind == KS_TOK_SPM) {
            ks_tok_spm_encode(t, text + fr.off, fr.len, t->add_space_prefix && prev_special, &out);
            prev_special = false;
        } else {
            st = ks_tok_bpe_encode(t, scratch, text + fr.off, fr.len, &out);
        }
    }
    ks_tok_bpe_scratch_destroy(scratch);
    if (st == KS_OK && out.refused) st = KS_FAIL(KS_ERR_NOMEM, "tokenizer: %zu tokens", out.n);
    if (st == KS_OK) {
        *n_out = out.n;
        if (out.n > cap)
            st = KS_FAIL(KS_ERR_INVALID_ARG, "tokenizer: %zu tokens do not fit in %zu", out.n, cap);
        else if (out.n)
            memcpy(ids, out.v, out.n * sizeof(int32_t));
    }
    ks_free(out.v);
    ks_free(fa.v);
    ks_free(fb.v);
    return st;
}
