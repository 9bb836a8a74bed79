/*
 * copy.h — the copy engine: worker threads that move head-pages from the
 * slow tier into fast-tier slots while the caller computes.
 *
 * A job is one contiguous transfer (a head-page: K then V), read from memory
 * or with preadv from a file, optionally split into two destinations (the
 * fast tier keeps K and V apart).  Jobs carry an event; an event counts its
 * pending jobs and keeps the first error (with file and line), so a layer
 * waits only for its own loads and a failed read surfaces as KS_ERR_IO at the
 * wait instead of as stale data in attention.
 */
#ifndef KS_KV_COPY_H
#define KS_KV_COPY_H

#include "core/core.h"

#include <stdatomic.h>
#include <sys/types.h>

typedef struct ks_copy_engine ks_copy_engine;

typedef struct ks_copy_event {
    atomic_int pending;   /* jobs queued or running */
    atomic_int failed;    /* 1 once a job failed; msg holds the first error */
    char msg[256];
} ks_copy_event;

typedef struct ks_copy_job {
    const uint8_t *src;   /* memory source, or NULL to pread from fd */
    int fd;
    off_t offset;         /* file offset when src == NULL */
    uint8_t *dst;         /* first half of the bytes (all of them when dst2 is NULL) */
    uint8_t *dst2;        /* optional: second half (a page's V goes apart from its K) */
    size_t bytes;
    size_t src2_off;      /* with dst2, non-zero: the second half starts src2_off bytes after the first (a run of
                           * rows inside a page, whose K and V rows are apart) instead of right after it */
    bool fail;            /* test hook: report an I/O error instead of copying */
    ks_copy_event *ev;
} ks_copy_job;

ks_status ks_copy_engine_create(int n_threads, ks_copy_engine **out);
/* Waits for queued jobs, then joins the workers. */
void ks_copy_engine_destroy(ks_copy_engine *e);
void ks_copy_submit(ks_copy_engine *e, const ks_copy_job *job);
/* Runs a job in the calling thread (same error reporting). */
void ks_copy_run(const ks_copy_job *job);
/* Block until ev has no pending jobs; KS_ERR_IO if any failed (then cleared). */
ks_status ks_copy_wait(ks_copy_event *ev, double *waited_seconds);
/* Seconds the workers spent copying since the last call (then zeroed). */
double ks_copy_take_busy(ks_copy_engine *e);

#endif
