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

ks_status ks_tokenizer_chat_format(const ks_tokenizer *t, const char *system, const char *user,
                                   char *buf, size_t cap, size_t *n_out) {
    if (!t || !user || !n_out || (!buf && cap))
        return KS_FAIL(KS_ERR_INVALID_ARG, "chat: NULL argument");
    bool has_sys = system && system[0];
    ks_tok_sb b = {0};
    switch (t->chat) {
    case KS_CHAT_LLAMA3:
        if (has_sys) {
            ks_tok_sb_puts(&b, "<|start_header_id|>system<|end_header_id|>\n\n");
            ks_tok_sb_put_trimmed(&b, system);
            ks_tok_sb_puts(&b, "<|eot_id|>");
        }
        ks_tok_sb_puts(&b, "<|start_header_id|>user<|end_header_id|>\n\n");
        ks_tok_sb_put_trimmed(&b, user);
        ks_tok_sb_puts(&b, "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    case KS_CHAT_CHATML:
        if (has_sys) {
            ks_tok_sb_puts(&b, "<|im_start|>system\n");
            ks_tok_sb_puts(&b, system);
            ks_tok_sb_puts(&b, "<|im_end|>\n");
        }
        ks_tok_sb_puts(&b, "<|im_start|>user\n");
        ks_tok_sb_puts(&b, user);
        ks_tok_sb_puts(&b, "<|im_end|>\n<|im_start|>assistant\n");
        break;
    case KS_CHAT_PHI3:
        if (has_sys) {
            ks_tok_sb_puts(&b, "<|system|>\n");
            ks_tok_sb_puts(&b, system);
            ks_tok_sb_puts(&b, "<|end|>\n");
        }
        ks_tok_sb_puts(&b, "<|user|>\n");
        ks_tok_sb_puts(&b, user);
        ks_tok_sb_puts(&b, "<|end|>\n<|assistant|>\n");
        break;
    case KS_CHAT_LLAMA2:
        ks_tok_sb_puts(&b, "[INST] ");
        if (has_sys) {
            ks_tok_sb_puts(&b, "<<SYS>>\n");
            ks_tok_sb_puts(&b, system);
            ks_tok_sb_puts(&b, "\n<</SYS>>\n\n");
        }
        ks_tok_sb_puts(&b, user);
        ks_tok_sb_puts(&b, " [/INST]");
        break;
    default:
        return KS_FAIL(KS_ERR_UNSUPPORTED, "chat: the model has no known chat template");
    }
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
