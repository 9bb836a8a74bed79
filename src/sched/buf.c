/*
 * buf.c — growable byte buffer (buf.h).
 */
#include "sched/buf.h"

#include "core/core.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Room for n more bytes and the NUL; false (and the buffer refused) when
 * the allocator says no. */
static bool sbuf_room(ks_sbuf *b, size_t n) {
    if (b->refused) return false;
    if (b->n + n + 1 <= b->cap) return true;
    size_t cap = (b->n + n + 1) * 2 + 64;
    char *p = ks_realloc(b->p, cap);
    if (!p) {
        b->refused = true;
        return false;
    }
    b->p = p;
    b->cap = cap;
    return true;
}

void ks_sbuf_put(ks_sbuf *b, const char *s, size_t n) {
    if (!sbuf_room(b, n)) return;
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
    if (n <= 0 || !sbuf_room(b, (size_t)n)) return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)n;
}
