/*
 * core.c — error recording, allocation, logging, clocks.
 *
 * The error buffer is thread-local so that concurrent contexts never see
 * each other's messages.  Allocation failure is a return value (NULL) that
 * every caller turns into KS_ERR_NOMEM; a counting hook lets tests refuse
 * the n-th allocation to walk that path.
 */
#define _GNU_SOURCE
#include "core.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static _Thread_local char g_last_error[1024];

static const char *const g_status_names[KS_ERR_COUNT_] = {
    [KS_OK] = "ok",
    [KS_ERR_INVALID_ARG] = "invalid argument",
    [KS_ERR_IO] = "I/O error",
    [KS_ERR_FORMAT] = "malformed input",
    [KS_ERR_UNSUPPORTED] = "unsupported",
    [KS_ERR_NOMEM] = "out of memory",
    [KS_ERR_CONTEXT_FULL] = "context full",
    [KS_ERR_NOT_FOUND] = "not found",
    [KS_ERR_BACKEND] = "backend error",
};

const char *ks_status_str(ks_status st) {
    if ((int)st < 0 || st >= KS_ERR_COUNT_) return "unknown status";
    return g_status_names[st];
}

const char *ks_last_error(void) { return g_last_error; }

ks_status ks_fail_at(ks_status st, const char *file, int line, const char *fmt, ...) {
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    int n = snprintf(g_last_error, sizeof g_last_error, "%s:%d: ", base, line);
    if (n < 0 || (size_t)n >= sizeof g_last_error) n = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_last_error + n, sizeof g_last_error - (size_t)n, fmt, ap);
    va_end(ap);
    return st;
}

void ks_assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "kvsieve: assertion failed: %s (%s:%d)\n", expr, file, line);
    abort();
}

/* Every ks_ allocation is counted (relaxed: a statistic, not a fence), so a
 * test can prove that a decode step allocates nothing. */
static atomic_uint_least64_t g_alloc_count;
uint64_t ks_alloc_count(void) { return atomic_load_explicit(&g_alloc_count, memory_order_relaxed); }

/* Failure injection (tests): g_fail_after counts down the allocations still
 * allowed; the one that finds it at zero is refused, once (-1: disarmed).  A
 * CAS loop, so that among threads racing for the last allowance exactly one
 * allocation fails. */
static atomic_int_least64_t g_fail_after = -1;
static atomic_uint_least64_t g_fail_count;
void ks_alloc_fail_after(int64_t n) { atomic_store(&g_fail_after, n < 0 ? -1 : n); }
uint64_t ks_alloc_failures_injected(void) { return atomic_load(&g_fail_count); }

/* Counts the allocation; false when the injection hook refuses it. */
static bool alloc_allowed(void) {
    atomic_fetch_add_explicit(&g_alloc_count, 1, memory_order_relaxed);
    int_least64_t left = atomic_load_explicit(&g_fail_after, memory_order_relaxed);
    while (left >= 0) {
        if (atomic_compare_exchange_weak(&g_fail_after, &left, left - 1)) {
            if (left > 0) return true;
            atomic_fetch_add(&g_fail_count, 1);
            return false;
        }
    }
    return true;
}

/* Failure is the caller's to handle: NULL, never an exit (a server must fail
 * one request, not every request in flight). */
void *ks_malloc(size_t n) { return alloc_allowed() ? malloc(n ? n : 1) : NULL; }
void *ks_calloc(size_t count, size_t size) {
    return alloc_allowed() ? calloc(count ? count : 1, size ? size : 1) : NULL;
}
void *ks_realloc(void *p, size_t n) { return alloc_allowed() ? realloc(p, n ? n : 1) : NULL; }
void *ks_malloc_aligned(size_t n) {
    void *p = NULL;
    if (!alloc_allowed() || posix_memalign(&p, 64, n ? (n + 63) & ~(size_t)63 : 64) != 0) return NULL;
    return p;
}
void ks_free_aligned(void *p) { free(p); }
/* Scratch: one set of slots per thread, kept in a pthread key so that a
 * worker's buffers are freed when the worker exits. */
typedef struct {
    void *p[KS_SCRATCH_SLOTS];
    size_t n[KS_SCRATCH_SLOTS];
} scratch_set;
static pthread_key_t g_scratch_key;
static pthread_once_t g_scratch_once = PTHREAD_ONCE_INIT;
static void scratch_release(void *v) {
    scratch_set *s = v;
    for (int i = 0; i < KS_SCRATCH_SLOTS; i++) ks_free_aligned(s->p[i]);
    ks_free(s);
}
static void scratch_make_key(void) { KS_ASSERT(pthread_key_create(&g_scratch_key, scratch_release) == 0); }

/* Each slot's largest size on any thread, and a counter bumped when one
 * rises (relaxed: a thread that misses a rise reserves at the next check). */
static atomic_size_t g_scratch_mark[KS_SCRATCH_SLOTS];
static atomic_uint_least64_t g_scratch_epoch;

static scratch_set *scratch_of_thread(void) {
    pthread_once(&g_scratch_once, scratch_make_key);
    scratch_set *s = pthread_getspecific(g_scratch_key);
    if (!s) {
        s = ks_calloc(1, sizeof *s);
        if (s && pthread_setspecific(g_scratch_key, s) != 0) {
            ks_free(s);
            s = NULL;
        }
    }
    return s;
}

/* False when refused: the slot is then empty (the old buffer is gone, and
 * a later call tries again). */
static bool scratch_grow(scratch_set *s, ks_scratch_slot slot, size_t bytes) {
    /* powers of two: a context's growing depth (one entry a step) regrows
     * a slot O(log n) times */
    size_t n = 4096;
    while (n < bytes) n *= 2;
    ks_free_aligned(s->p[slot]);
    s->p[slot] = ks_malloc_aligned(n);
    s->n[slot] = s->p[slot] ? n : 0;
    if (!s->p[slot]) return false;
    size_t mark = atomic_load_explicit(&g_scratch_mark[slot], memory_order_relaxed);
    while (mark < n && !atomic_compare_exchange_weak(&g_scratch_mark[slot], &mark, n)) {
    }
    if (mark < n) atomic_fetch_add_explicit(&g_scratch_epoch, 1, memory_order_relaxed);
    return true;
}

void *ks_scratch(ks_scratch_slot slot, size_t bytes) {
    KS_ASSERT((int)slot >= 0 && slot < KS_SCRATCH_SLOTS);
    scratch_set *s = scratch_of_thread();
    if (!s || ((s->n[slot] < bytes || !s->p[slot]) && !scratch_grow(s, slot, bytes))) return NULL; /* NULL: refused */
    return s->p[slot];
}

uint64_t ks_scratch_epoch(void) { return atomic_load_explicit(&g_scratch_epoch, memory_order_relaxed); }

bool ks_scratch_reserve(void) {
    scratch_set *s = scratch_of_thread();
    if (!s) return false;
    bool ok = true;
    for (int i = 0; i < KS_SCRATCH_SLOTS; i++) {
        size_t mark = atomic_load_explicit(&g_scratch_mark[i], memory_order_relaxed);
        if (s->n[i] < mark && !scratch_grow(s, (ks_scratch_slot)i, mark)) ok = false;
    }
    return ok;
}

char *ks_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = ks_malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

static ks_log_level g_log_level = KS_LOG_INFO;
void ks_log_set_level(ks_log_level level) { g_log_level = level; }
void ks_log(ks_log_level level, const char *fmt, ...) {
    if (level < g_log_level) return;
    static const char *const tags[] = {"debug", "info", "warn", "error"};
    fprintf(stderr, "kvsieve %s: ", tags[level]);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

double ks_time_sec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

float ks_rng_normal(ks_rng *r) {
    /* Box-Muller; one value per call keeps the stream simple to reproduce. */
    double u1 = ks_rng_uniform(r), u2 = ks_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

int ks_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}
