/*
 * core.h — the small utilities every module stands on.
 *
 * Errors: a failing function records "file:line: message" in a thread-local
 * buffer with KS_FAIL and returns the status up the stack unchanged, so the
 * message that reaches the module boundary names the place the problem was
 * found, not where it was reported.  Invariants use KS_ASSERT, which stays on
 * in release builds: a broken invariant is a bug and must stop the process
 * loudly rather than produce wrong logits quietly.
 *
 * Allocation: ks_malloc/ks_calloc/ks_realloc/ks_strdup return NULL when
 * refused, and every caller checks and returns KS_ERR_NOMEM after undoing
 * what it did, so that in a server one failed allocation fails one request
 * and not the process (the compiler insists the result is used).  Sizes that
 * come from untrusted input are validated against the file size *before* they
 * reach ks_malloc.
 */
#ifndef KS_CORE_H
#define KS_CORE_H

#include "kvsieve.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef __cplusplus
extern "C" {
#endif

ks_status ks_fail_at(ks_status st, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define KS_FAIL(st, ...) ks_fail_at((st), __FILE__, __LINE__, __VA_ARGS__)
/* Propagate a failure without overwriting the original message. */
#define KS_TRY(expr)                          \
    do {                                      \
        ks_status ks_try_st_ = (expr);        \
        if (ks_try_st_ != KS_OK) return ks_try_st_; \
    } while (0)

void ks_assert_fail(const char *expr, const char *file, int line) __attribute__((noreturn));
#define KS_ASSERT(x) ((x) ? (void)0 : ks_assert_fail(#x, __FILE__, __LINE__))

#define KS_ALLOC_FN __attribute__((warn_unused_result, malloc))
KS_ALLOC_FN void *ks_malloc(size_t n);
KS_ALLOC_FN void *ks_calloc(size_t count, size_t size);
/* NULL when refused, and then p is untouched (still the caller's). */
__attribute__((warn_unused_result)) void *ks_realloc(void *p, size_t n);
/* 64-byte aligned (cache line / AVX-512); release with ks_free_aligned. */
KS_ALLOC_FN void *ks_malloc_aligned(size_t n);
void ks_free_aligned(void *p);
KS_ALLOC_FN char *ks_strdup(const char *s);
#define ks_free free
/* How many ks_ allocations the process has made (tests: no step allocates). */
uint64_t ks_alloc_count(void);
/* Test hook: the next n ks_ allocations (process-wide) succeed and the one
 * after is refused, once; n < 0 disarms.  ks_alloc_failures_injected counts
 * the refusals made so far, so a test knows whether its failure happened. */
void ks_alloc_fail_after(int64_t n);
uint64_t ks_alloc_failures_injected(void);
/* Per-thread scratch for the hot path, so that a decode step allocates
 * nothing once its threads have seen a step as large: slot `slot` of the
 * calling thread, at least `bytes`, 64-byte aligned, owned by the thread
 * (freed when it exits).  The buffer stays valid until the same thread asks
 * for the same slot again, so a function uses only its own slots: the
 * policies' selection 0-3, their math helpers 4-5, the engine's services
 * to policies 6-7, the tensor kernels' workers 8. */
typedef enum {
    KS_SCRATCH_POLICY0, KS_SCRATCH_POLICY1, KS_SCRATCH_POLICY2, KS_SCRATCH_POLICY3,
    KS_SCRATCH_MATH0, KS_SCRATCH_MATH1,
    KS_SCRATCH_SERVICE0, KS_SCRATCH_SERVICE1,
    KS_SCRATCH_KERNEL, /* a tensor kernel's worker (matmul tiles), below everything else */
    KS_SCRATCH_SLOTS
} ks_scratch_slot;
/* NULL when the slot had to grow and the allocator refused (KS_ERR_NOMEM
 * for the caller). */
__attribute__((warn_unused_result)) void *ks_scratch(ks_scratch_slot slot, size_t bytes);
/* Which thread of a pool takes which head varies from step to step, so a
 * slot grown on one worker must be grown on the others before the next step
 * or a later step allocates there: the process keeps each slot's high-water
 * mark, ks_scratch_epoch() changes whenever one rises, and
 * ks_scratch_reserve() grows the calling thread's slots to the marks
 * (ks_pool_reserve_scratch does it on every thread of a pool).  Reserving
 * is ahead-of-time only: false when a slot could not grow, which a later
 * ks_scratch of that slot reports as NULL. */
uint64_t ks_scratch_epoch(void);
bool ks_scratch_reserve(void);

/* Logging goes to stderr; stdout belongs to the program's output. */
typedef enum { KS_LOG_DEBUG, KS_LOG_INFO, KS_LOG_WARN, KS_LOG_ERROR } ks_log_level;
void ks_log_set_level(ks_log_level level);
void ks_log(ks_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define KS_LOG(level, ...) ks_log(KS_LOG_##level, __VA_ARGS__)

double ks_time_sec(void); /* monotonic seconds */

/* splitmix64 / xoshiro-free small RNG: deterministic across platforms. */
typedef struct ks_rng { uint64_t s; } ks_rng;
static inline uint64_t ks_rng_next(ks_rng *r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
/* Uniform in [0, 1). */
static inline double ks_rng_uniform(ks_rng *r) { return (double)(ks_rng_next(r) >> 11) * 0x1.0p-53; }
float ks_rng_normal(ks_rng *r);

/* ------------------------------------------------------------ thread pool --
 * A fixed set of workers that run one parallel-for at a time.  The caller
 * participates as thread 0, so a pool of n threads spawns n-1 workers.  Work
 * is split statically by the callee from (ith, nth): every kernel knows its
 * own best split (rows for matvec, heads for attention). */
typedef struct ks_pool ks_pool;
typedef void (*ks_pool_fn)(void *arg, int ith, int nth);
ks_status ks_pool_create(int n_threads, ks_pool **out);
void ks_pool_destroy(ks_pool *pool);
int ks_pool_size(const ks_pool *pool);
/* Runs fn(arg, i, n) for i in [0, n) on the pool and returns when all are done. */
void ks_pool_run(ks_pool *pool, ks_pool_fn fn, void *arg);
/* ks_scratch_reserve on every thread of the pool, the caller included. */
void ks_pool_reserve_scratch(ks_pool *pool);
/* Worker ith's share [*begin, *end) of n units split as evenly as possible
 * among nth workers (shares differ by at most one unit, and are in order). */
static inline void ks_pool_share(int64_t n, int ith, int nth, int64_t *begin, int64_t *end) {
    *begin = n * ith / nth;
    *end = n * (ith + 1) / nth;
}

/* Number of online CPU cores. */
int ks_cpu_count(void);

#ifdef __cplusplus
}
#endif
#endif
