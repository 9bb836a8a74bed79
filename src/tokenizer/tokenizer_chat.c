/*
 * tokenizer_chat.c — a user message (and optional system prompt) rendered
 * in the chat template a model was trained with: llama3, ChatML, phi-3,
 * llama2.  The family is detected once from GGUF metadata at load time;
 * rendering is plain string building, so the prompt then goes through the
 * ordinary encoder with special tokens parsed.  llama3 trims the content as
 * its reference Jinja template does; the others insert it verbatim.
 */
#include "tokenizer/tokenizer_internal.h"

#include <string.h>

/* ---------------------------------------------------------------- chat -- */

ks_chat_family ks_tokenizer_chat_family(const ks_tokenizer *t) { return t->chat; }

const char *ks_chat_family_name(ks_chat_family f) {
    switch (f) {
    case KS_CHAT_LLAMA3: return "llama3";
    case KS_CHAT_CHATML: return "chatml";
    case KS_CHAT_LLAMA2: return "llama2";
    case KS_CHAT_PHI3: return "phi3";
    default: return "none";
    }
}

typedef struct ks_tok_sb {
    char *p; /* [cap] */
    size_t n, cap;
} ks_tok_sb;

static void ks_tok_sb_put(ks_tok_sb *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->p = ks_realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}
static void ks_tok_sb_puts(ks_tok_sb *b, const char *s) { ks_tok_sb_put(b, s, strlen(s)); }

/* Leading/trailing ASCII whitespace removed (llama3 templates trim content). */
static void ks_tok_sb_put_trimmed(ks_tok_sb *b, const char *s) {
    size_t n = strlen(s), i = 0;
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) i++;
    while (n > i && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n' || s[n - 1] == '\r')) n--;
    ks_tok_sb_put(b, s + i, n - i);
}

/* Every template is the same sequence of markers around the two contents:
 * begin, [sys_open system sys_close], user_open user end (end opens the
 * assistant's turn); trim: the contents are trimmed (llama3). */
typedef struct ks_chat_template {
    const char *begin, *sys_open, *sys_close, *user_open, *end;
    bool trim;
} ks_chat_template;

static const ks_chat_template ks_chat_templates[] = {
    [KS_CHAT_LLAMA3] = {"", "<|start_header_id|>system<|end_header_id|>\n\n", "<|eot_id|>",
                        "<|start_header_id|>user<|end_header_id|>\n\n",
                        "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n", true},
    [KS_CHAT_CHATML] = {"", "<|im_start|>system\n", "<|im_end|>\n", "<|im_start|>user\n",
                        "<|im_end|>\n<|im_start|>assistant\n", false},
    [KS_CHAT_LLAMA2] = {"[INST] ", "<<SYS>>\n", "\n<</SYS>>\n\n", "", " [/INST]", false},
    [KS_CHAT_PHI3] = {"", "<|system|>\n", "<|end|>\n", "<|user|>\n", "<|end|>\n<|assistant|>\n", false},
};

ks_status ks_tokenizer_chat_format(const ks_tokenizer *t, const char *system, const char *user,
                                   char *buf, size_t cap, size_t *n_out) {
    if (!t || !user || !n_out || (!buf && cap))
        return KS_FAIL(KS_ERR_INVALID_ARG, "chat: NULL argument");
    if (t->chat == KS_CHAT_NONE || (size_t)t->chat >= sizeof ks_chat_templates / sizeof ks_chat_templates[0])
        return KS_FAIL(KS_ERR_UNSUPPORTED, "chat: the model has no known chat template");
    const ks_chat_template *tp = &ks_chat_templates[t->chat];
    void (*put)(ks_tok_sb *, const char *) = tp->trim ? ks_tok_sb_put_trimmed : ks_tok_sb_puts;
    ks_tok_sb b = {0};
    ks_tok_sb_puts(&b, tp->begin);
    if (system && system[0]) {
        ks_tok_sb_puts(&b, tp->sys_open);
        put(&b, system);
        ks_tok_sb_puts(&b, tp->sys_close);
    }
    ks_tok_sb_puts(&b, tp->user_open);
    put(&b, user);
    ks_tok_sb_puts(&b, tp->end);
    ks_status st = KS_OK;
    if (b.n + 1 > cap) {
        *n_out = b.n + 1;
        st = KS_FAIL(KS_ERR_INVALID_ARG, "chat: prompt needs %zu bytes, buffer has %zu", b.n + 1, cap);
    } else {
        memcpy(buf, b.p, b.n + 1);
        *n_out = b.n;
    }
    ks_free(b.p);
    return st;
}
