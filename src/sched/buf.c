/*
 * buf.c — growable byte buffer (buf.h).
 */
#include "sched/buf.h"

#include "core/core.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void ks_sbuf_put(ks_sbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2 + 64;
        b->p = ks_realloc(b->p, b->cap);
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void ks_sbuf_puts(ks_sbuf *b, const char *s) { ks_sbuf_put(b, s, strlen(s)); }

void ks_sbuf_printf(ks_sbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n <= 0) return;
    ks_sbuf_put(b, "", 0);               /* room for the NUL at least */
    if (b->n + (size_t)n + 1 > b->cap) {
        b->cap = (b->n + (size_t)n + 1) * 2 + 64;
        b->p = ks_realloc(b->p, b->cap);
    }
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)n;
}
