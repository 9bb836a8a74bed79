/*
 * eval_internal.h — a growable text buffer shared by the eval sources.
 *
 * Prompts and SVG documents are both built by appending formatted pieces of
 * unknown size; one tiny append-only buffer (ks_malloc-backed, so it cannot
 * fail) keeps every caller free of length arithmetic.
 */
#ifndef KS_EVAL_INTERNAL_H
#define KS_EVAL_INTERNAL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct ks_eval_sbuf {
    char *s;    /* [cap] NUL-terminated text */
    size_t n;   /* bytes used, excluding the NUL */
    size_t cap;
    bool refused; /* an append was dropped (allocation refused): later puts are no-ops */
} ks_eval_sbuf;

void ks_eval_sbuf_putn(ks_eval_sbuf *b, const char *s, size_t n);
void ks_eval_sbuf_puts(ks_eval_sbuf *b, const char *s);
void ks_eval_sbuf_printf(ks_eval_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Hands the text to the caller and empties the buffer; NULL when an append
 * was refused (the caller reports KS_ERR_NOMEM). */
char *ks_eval_sbuf_take(ks_eval_sbuf *b);

#endif
