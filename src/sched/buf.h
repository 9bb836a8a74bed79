/*
 * buf.h — a growable, NUL-terminated byte buffer, shared by the scheduler
 * (request output, stop-string hold-back) and the server (bodies, SSE,
 * metrics text).  Allocation failure aborts (core.h's allocator).
 */
#ifndef KS_SCHED_BUF_H
#define KS_SCHED_BUF_H

#include <stddef.h>

typedef struct ks_sbuf {
    char *p;          /* NULL until the first put */
    size_t n, cap;
} ks_sbuf;

void ks_sbuf_put(ks_sbuf *b, const char *s, size_t n);
void ks_sbuf_puts(ks_sbuf *b, const char *s);
void ks_sbuf_printf(ks_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
