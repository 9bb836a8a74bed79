/*
 * tokenizer_bpe.c — byte-level BPE ("gpt2" vocabularies): pre-tokenizer
 * regexes, the GPT-2 byte alphabet, and merging by rank.
 *
 * Pre-tokenization decides most of what a BPE tokenizer outputs, and every
 * model family ships its own split rules.  We run them with PCRE2 in UTF+UCP
 * mode (so \p{L}, \s and friends mean the Unicode classes, as in the
 * reference) compiled once per tokenizer and JIT-compiled where available.
 * Families that use several expressions apply them in sequence, each one
 * splitting every piece the previous one produced into matches and the gaps
 * between them; each piece is matched as its own subject, so lookaheads and
 * `$` stop at the piece boundary exactly as in the reference splitter.
 * Invalid UTF-8 is tolerated (PCRE2_MATCH_INVALID_UTF): such bytes never
 * match and travel on as gap pieces, which the byte alphabet can still
 * represent — encoding never fails on user text.
 *
 * Merging works on one pre-token ("word") at a time: symbols are the
 * characters of the byte-mapped word, every adjacent pair with a merge rank
 * goes into a priority queue, and the lowest rank (leftmost on ties) merges
 * first; stale entries are recognised by their recorded size and skipped.
 * That makes a word of n characters O(n log n), so even a 100 KB run without
 * spaces is cheap.
 */
#include "tokenizer/tokenizer_internal.h"

#include <string.h>

/* ------------------------------------------------------------ alphabet -- */

void ks_tok_bpe_init_bytes(ks_tokenizer *t) {
    int extra = 0;
    for (int i = 0; i < 324; i++) t->byte_of_cp[i] = -1;
    for (int b = 0; b < 256; b++) {
        bool direct = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        uint32_t cp = direct ? (uint32_t)b : 256u + (uint32_t)extra++;
        t->byte_of_cp[cp] = (int16_t)b;
        if (cp < 0x80) {
            t->byte_utf8[b][0] = (char)cp;
            t->byte_utf8_len[b] = 1;
        } else {
            t->byte_utf8[b][0] = (char)(0xC0 | (cp >> 6));
            t->byte_utf8[b][1] = (char)(0x80 | (cp & 0x3F));
            t->byte_utf8_len[b] = 2;
        }
    }
    KS_ASSERT(extra == 68);
}

size_t ks_tok_bpe_unmap(const ks_tokenizer *t, const char *src, size_t n, char *dst) {
    const unsigned char *s = (const unsigned char *)src;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp = 0xFFFFFFFFu;
        size_t k = 1;
        if (s[i] < 0x80) {
            cp = s[i];
        } else if ((s[i] & 0xE0) == 0xC0 && i + 1 < n && (s[i + 1] & 0xC0) == 0x80) {
            cp = ((uint32_t)(s[i] & 0x1F) << 6) | (s[i + 1] & 0x3F);
            k = 2;
        }
        if (cp < 324 && t->byte_of_cp[cp] >= 0) {
            dst[o++] = (char)t->byte_of_cp[cp];
            i += k;
        } else {
            /* not in the alphabet: copy the whole UTF-8 character through */
            k = ks_tok_utf8_len(s[i]);
            if (k > n - i) k = n - i;
            memcpy(dst + o, s + i, k);
            o += k;
            i += k;
        }
    }
    return o;
}

/* ------------------------------------------------------- pre-tokenizers -- */

/* The expressions are the ones the reference tokenizers publish for each
 * family (with the case-insensitive contraction group spelled out). */
#define KS_RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define KS_RE_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define KS_RE_LLAMA3                                                                         \
    KS_RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*" \
                       "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define KS_RE_QWEN2                                                                      \
    KS_RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*" \
                       "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* o200k (GPT-4o, gpt-oss; tokenizer.ggml.pre "gpt-4o"): tiktoken's
 * o200k_base pattern as its tokenizer.json publishes it, which PCRE2 takes
 * as is (llama.cpp's own regex engine runs a rewrite of it without the
 * Unicode categories; on text of Latin letters the two split alike) */
#define KS_RE_O200K_CASE "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]"
#define KS_RE_O200K_LOWER "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]"
#define KS_RE_O200K                                                                                         \
    "[^\\r\\n\\p{L}\\p{N}]?" KS_RE_O200K_CASE "*" KS_RE_O200K_LOWER "+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"          \
    "|[^\\r\\n\\p{L}\\p{N}]?" KS_RE_O200K_CASE "+" KS_RE_O200K_LOWER "*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"        \
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define KS_RE_CJK "[\\x{4E00}-\\x{9FA5}\\x{0800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"

typedef struct ks_tok_pre_def {
    const char *names;   /* '|'-separated tokenizer.ggml.pre values */
    bool ignore_merges;
    const char *re[KS_TOK_MAX_REGEX]; /* NULL-terminated */
} ks_tok_pre_def;

static const ks_tok_pre_def g_pre_defs[] = {
    {"default|gpt-2|gpt2|mpt|olmo|jais|phi-2", false, {KS_RE_GPT2, NULL}},
    {"gpt-4o", false, {KS_RE_O200K, NULL}},
    {"llama3|llama-bpe|llama-v3", true, {KS_RE_LLAMA3, NULL}},
    {"dbrx|smaug-bpe|falcon3|pixtral|tekken", false, {KS_RE_LLAMA3, NULL}},
    {"qwen2|deepseek-r1-qwen|stablelm2|megrez", false, {KS_RE_QWEN2, NULL}},
    {"deepseek-coder", false,
     {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", KS_RE_CJK, "\\p{N}", NULL}},
    {"falcon", false,
     {"[\\p{P}\\$\\+<=>\\^~\\|`]+", KS_RE_GPT2, "[0-9][0-9][0-9]", NULL}},
    {"starcoder|refact|command-r|smollm|codeshell|exaone|minerva-7b", false,
     {"\\p{N}", KS_RE_GPT2, NULL}},
};

static bool ks_tok_name_in_list(const char *list, const char *name, size_t len) {
    const char *p = list;
    while (*p) {
        const char *e = strchr(p, '|');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n == len && memcmp(p, name, len) == 0) return true;
        if (!e) break;
        p = e + 1;
    }
    return false;
}

void ks_tok_bpe_free_pre(ks_tokenizer *t) {
    for (int i = 0; i < t->n_re; i++) pcre2_code_free(t->re[i]);
    t->n_re = 0;
}

ks_status ks_tok_bpe_compile_pre(ks_tokenizer *t, const char *pre, size_t pre_len) {
    const ks_tok_pre_def *def = &g_pre_defs[0];
    if (pre && pre_len > 0) {
        const ks_tok_pre_def *found = NULL;
        for (size_t i = 0; i < sizeof g_pre_defs / sizeof g_pre_defs[0] && !found; i++)
            if (ks_tok_name_in_list(g_pre_defs[i].names, pre, pre_len)) found = &g_pre_defs[i];
        if (found) {
            def = found;
        } else {
            KS_LOG(WARN, "tokenizer: unknown pre-tokenizer '%.*s', using the gpt-2 rules",
                   (int)(pre_len > 64 ? 64 : pre_len), pre);
        }
    }
    t->ignore_merges = def->ignore_merges;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP;
#ifdef PCRE2_MATCH_INVALID_UTF
    opts |= PCRE2_MATCH_INVALID_UTF;
#endif
    for (int i = 0; i < KS_TOK_MAX_REGEX && def->re[i]; i++) {
        int err = 0;
        PCRE2_SIZE erroff = 0;
        pcre2_code *re = pcre2_compile((PCRE2_SPTR)def->re[i], PCRE2_ZERO_TERMINATED, opts, &err,
                                       &erroff, NULL);
        if (!re) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(err, msg, sizeof msg);
            ks_tok_bpe_free_pre(t);
            return KS_FAIL(KS_ERR_UNSUPPORTED, "tokenizer: pre-tokenizer regex %d failed to compile at %zu: %s",
                           i, (size_t)erroff, (const char *)msg);
        }
        (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* interpreter if JIT is unavailable */
        t->re[t->n_re++] = re;
    }
    return KS_OK;
}

/* -------------------------------------------------------------- encoder -- */

typedef struct ks_tok_span {
    size_t off, len;
} ks_tok_span;

struct ks_tok_bpe_scratch {
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit;
    ks_tok_span *spans[2]; /* [span_cap[k]] pieces before/after one regex */
    size_t n_spans[2], span_cap[2];
    bool refused;          /* a span was dropped: the encode fails with KS_ERR_NOMEM */
    char *word;            /* [word_cap] byte-mapped word */
    size_t word_cap;
    ks_tok_sym *sym;       /* [sym_cap] */
    size_t sym_cap;
    ks_tok_heap heap;
};

ks_tok_bpe_scratch *ks_tok_bpe_scratch_create(const ks_tokenizer *t) {
    ks_tok_bpe_scratch *s = ks_calloc(1, sizeof *s);
    if (!s) return NULL;
    uint32_t max_pairs = 1;
    for (int i = 0; i < t->n_re; i++) {
        uint32_t c = 0;
        pcre2_pattern_info(t->re[i], PCRE2_INFO_CAPTURECOUNT, &c);
        if (c + 1 > max_pairs) max_pairs = c + 1;
    }
    s->md = pcre2_match_data_create(max_pairs, NULL);
    s->mctx = pcre2_match_context_create(NULL);
    s->jit = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
    if (!s->md || !s->mctx) {
        ks_tok_bpe_scratch_destroy(s);
        return NULL;
    }
    if (s->jit) pcre2_jit_stack_assign(s->mctx, NULL, s->jit);
    return s;
}

void ks_tok_bpe_scratch_destroy(ks_tok_bpe_scratch *s) {
    if (!s) return;
    pcre2_match_data_free(s->md);
    pcre2_match_context_free(s->mctx);
    if (s->jit) pcre2_jit_stack_free(s->jit);
    ks_free(s->spans[0]);
    ks_free(s->spans[1]);
    ks_free(s->word);
    ks_free(s->sym);
    ks_free(s->heap.v);
    ks_free(s);
}

static void ks_tok_span_push(ks_tok_bpe_scratch *s, int k, size_t off, size_t len) {
    if (s->n_spans[k] == s->span_cap[k]) {
        size_t cap = s->span_cap[k] ? s->span_cap[k] * 2 : 64;
        ks_tok_span *v = ks_realloc(s->spans[k], cap * sizeof(ks_tok_span));
        if (!v) {
            s->refused = true;
            return;
        }
        s->spans[k] = v;
        s->span_cap[k] = cap;
    }
    s->spans[k][s->n_spans[k]++] = (ks_tok_span){off, len};
}

/* Split every span of list `src` with regex re into list `dst`. */
static ks_status ks_tok_bpe_split(ks_tok_bpe_scratch *s, const pcre2_code *re, const char *text,
                                  int src, int dst) {
    s->n_spans[dst] = 0;
    for (size_t i = 0; i < s->n_spans[src]; i++) {
        const ks_tok_span sp = s->spans[src][i];
        PCRE2_SPTR subj = (PCRE2_SPTR)(text + sp.off);
        size_t pos = 0, last = 0;
        while (pos < sp.len) {
            int rc = pcre2_match(re, subj, sp.len, pos, 0, s->md, s->mctx);
            if (rc == PCRE2_ERROR_NOMATCH) break;
            if (rc < 0) {
                PCRE2_UCHAR msg[160];
                pcre2_get_error_message(rc, msg, sizeof msg);
                return KS_FAIL(KS_ERR_INVALID_ARG, "tokenizer: pre-tokenizer match failed: %s",
                               (const char *)msg);
            }
            const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->md);
            size_t ms = ov[0], me = ov[1];
            if (me <= ms) { /* empty match: step over one character */
                pos = ms + ks_tok_utf8_char_len(text + sp.off + ms, sp.len - ms);
                continue;
            }
            if (ms > last) ks_tok_span_push(s, dst, sp.off + last, ms - last);
            ks_tok_span_push(s, dst, sp.off + ms, me - ms);
            last = pos = me;
        }
        if (last < sp.len) ks_tok_span_push(s, dst, sp.off + last, sp.len - last);
    }
    return KS_OK;
}

static void ks_tok_bpe_try_pair(const ks_tokenizer *t, ks_tok_bpe_scratch *s, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const ks_tok_sym *a = &s->sym[l], *b = &s->sym[r];
    int32_t rank = ks_tok_merge_rank(t, s->word + a->off, a->n, s->word + b->off, b->n);
    if (rank < 0) return;
    ks_tok_heap_push(&s->heap, (ks_tok_pair){-(double)rank, l, r, a->n + b->n});
}

/* Emit a final symbol: its token, else its characters one by one (unknown id
 * for characters the vocabulary lacks). */
static void ks_tok_bpe_emit(const ks_tokenizer *t, const char *p, size_t n, ks_tok_ids *out) {
    int32_t id = ks_tok_vocab_find(t, p, n);
    if (id >= 0) {
        ks_tok_ids_push(out, id);
        return;
    }
    for (size_t i = 0; i < n;) {
        size_t k = ks_tok_utf8_len((unsigned char)p[i]);
        if (k > n - i) k = n - i;
        id = ks_tok_vocab_find(t, p + i, k);
        if (id < 0) id = t->unk;
        if (id >= 0) ks_tok_ids_push(out, id);
        i += k;
    }
}

static void ks_tok_bpe_word(const ks_tokenizer *t, ks_tok_bpe_scratch *s, const char *raw,
                            size_t len, ks_tok_ids *out) {
    /* byte-map the word */
    if (len * 2 > s->word_cap) {
        char *w = ks_realloc(s->word, len * 2);
        if (!w) {
            out->refused = true;
            return;
        }
        s->word = w;
        s->word_cap = len * 2;
    }
    size_t wn = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char b = (unsigned char)raw[i];
        memcpy(s->word + wn, t->byte_utf8[b], t->byte_utf8_len[b]);
        wn += t->byte_utf8_len[b];
    }
    if (t->ignore_merges) {
        int32_t id = ks_tok_vocab_find(t, s->word, wn);
        if (id >= 0) {
            ks_tok_ids_push(out, id);
            return;
        }
    }
    /* one symbol per byte of the input = one character of the mapped word */
    if (len > s->sym_cap) {
        ks_tok_sym *sym = ks_realloc(s->sym, len * sizeof(ks_tok_sym));
        if (!sym) {
            out->refused = true;
            return;
        }
        s->sym = sym;
        s->sym_cap = len;
    }
    int32_t ns = 0;
    for (size_t off = 0; off < wn; ns++) {
        size_t k = ks_tok_utf8_len((unsigned char)s->word[off]);
        s->sym[ns] = (ks_tok_sym){ns - 1, ns + 1, (uint32_t)off, (uint32_t)k};
        off += k;
    }
    s->sym[ns - 1].next = -1;
    s->heap.n = 0;
    for (int32_t i = 0; i + 1 < ns; i++) ks_tok_bpe_try_pair(t, s, i, i + 1);
    while (s->heap.n > 0) {
        ks_tok_pair p = ks_tok_heap_pop(&s->heap);
        ks_tok_sym *a = &s->sym[p.left], *b = &s->sym[p.right];
        if (a->n == 0 || b->n == 0 || a->next != p.right || a->n + b->n != p.size) continue;
        a->n += b->n;
        b->n = 0;
        a->next = b->next;
        if (a->next >= 0) s->sym[a->next].prev = p.left;
        ks_tok_bpe_try_pair(t, s, a->prev, p.left);
        ks_tok_bpe_try_pair(t, s, p.left, s->sym[p.left].next);
    }
    for (int32_t i = 0; i != -1; i = s->sym[i].next)
        ks_tok_bpe_emit(t, s->word + s->sym[i].off, s->sym[i].n, out);
    if (s->heap.refused) out->refused = true;
}

ks_status ks_tok_bpe_encode(const ks_tokenizer *t, ks_tok_bpe_scratch *s, const char *text,
                            size_t len, ks_tok_ids *out) {
    if (len == 0) return KS_OK;
    s->n_spans[0] = 0;
    ks_tok_span_push(s, 0, 0, len);
    int cur = 0;
    for (int i = 0; i < t->n_re; i++) {
        KS_TRY(ks_tok_bpe_split(s, t->re[i], text, cur, 1 - cur));
        cur = 1 - cur;
    }
    if (s->refused) return KS_FAIL(KS_ERR_NOMEM, "tokenizer: pre-tokenizing %zu bytes", len);
    for (size_t i = 0; i < s->n_spans[cur]; i++) {
        const ks_tok_span sp = s->spans[cur][i];
        ks_tok_bpe_word(t, s, text + sp.off, sp.len, out);
    }
    return KS_OK;
}
