/*
 * buf.h — a growable, NUL-terminated byte buffer, shared by the scheduler
 * (request output, stop-string hold-back) and the server (bodies, SSE,
 * metrics text).  A refused allocation marks the buffer `refused` and
 * makes later puts no-ops, so a writer checks once, at the end, and fails
 * its one request (KS_ERR_NOMEM) instead of the process.
 */
#ifndef KS_SCHED_BUF_H
#define KS_SCHED_BUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct ks_sbuf {
    char *p;          /* NULL until the first put */
    size_t n, cap;
    bool refused;     /* an append was dropped: the contents are incomplete */
} ks_sbuf;

void ks_sbuf_put(ks_sbuf *b, const char *s, size_t n);
void ks_sbuf_puts(ks_sbuf *b, const char *s);
void ks_sbuf_printf(ks_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
