/*
 * pool.c — a minimal fork-join thread pool.
 *
 * Decode steps are short (tens of milliseconds) and made of many small
 * parallel-fors, so dispatch latency matters more than features: workers spin
 * briefly on a generation counter before falling back to a condition
 * variable, and the caller does a share of the work itself.
 */
#define _GNU_SOURCE
#include "core.h"

#include <pthread.h>
#include <stdatomic.h>
#include <sched.h>

/* Pause iterations before a waiting thread blocks (~50 us on current x86).
 * Decode dispatches a few hundred parallel-fors per step, so a worker that
 * spins briefly catches the next one without a futex round trip; spinning
 * much longer only burns a core that an oversubscribed machine needs. */
#define KS_POOL_SPIN 4000

struct ks_pool {
    int n;                       /* threads including the caller */
    pthread_t *threads;          /* [n-1] */
    pthread_mutex_t mu;
    pthread_cond_t cv_start;
    pthread_cond_t cv_done;
    atomic_uint generation;      /* bumped per job */
    atomic_int pending;          /* workers still running the job */
    atomic_bool stop;
    ks_pool_fn fn;
    void *arg;
};

typedef struct { ks_pool *pool; int ith; } worker_arg;

static void *worker_main(void *p) {
    worker_arg wa = *(worker_arg *)p;
    ks_free(p);
    ks_pool *pool = wa.pool;
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&pool->generation, memory_order_acquire)) == seen &&
               !atomic_load(&pool->stop)) {
            if (++spins < KS_POOL_SPIN) {
#if defined(__x86_64__)
                __builtin_ia32_pause();
#endif
                if ((spins & 63) == 0) sched_yield(); /* let a descheduled peer run */
                continue;
            }
            pthread_mutex_lock(&pool->mu);
            while (atomic_load(&pool->generation) == seen && !atomic_load(&pool->stop))
                pthread_cond_wait(&pool->cv_start, &pool->mu);
            pthread_mutex_unlock(&pool->mu);
        }
        if (atomic_load(&pool->stop)) return NULL;
        seen = g;
        pool->fn(pool->arg, wa.ith, pool->n);
        if (atomic_fetch_sub_explicit(&pool->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&pool->mu);
            pthread_cond_signal(&pool->cv_done);
            pthread_mutex_unlock(&pool->mu);
        }
    }
}

ks_status ks_pool_create(int n_threads, ks_pool **out) {
    if (n_threads < 1 || n_threads > 1024)
        return KS_FAIL(KS_ERR_INVALID_ARG, "thread count %d out of range [1, 1024]", n_threads);
    ks_pool *pool = ks_calloc(1, sizeof *pool);
    if (!pool) return KS_FAIL(KS_ERR_NOMEM, "thread pool");
    pool->n = n_threads;
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->cv_start, NULL);
    pthread_cond_init(&pool->cv_done, NULL);
    pool->threads = ks_calloc((size_t)n_threads, sizeof(pthread_t));
    if (!pool->threads) {
        pool->n = 1; /* no worker to join */
        ks_pool_destroy(pool);
        return KS_FAIL(KS_ERR_NOMEM, "thread pool of %d", n_threads);
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = ks_malloc(sizeof *wa);
        if (!wa) {
            pool->n = i;
            ks_pool_destroy(pool);
            return KS_FAIL(KS_ERR_NOMEM, "thread pool worker %d", i);
        }
        wa->pool = pool;
        wa->ith = i;
        if (pthread_create(&pool->threads[i - 1], NULL, worker_main, wa) != 0) {
            ks_free(wa);
            pool->n = i; /* only join what started */
            ks_pool_destroy(pool);
            return KS_FAIL(KS_ERR_NOMEM, "could not start worker thread %d", i);
        }
    }
    *out = pool;
    return KS_OK;
}

void ks_pool_destroy(ks_pool *pool) {
    if (!pool) return;
    pthread_mutex_lock(&pool->mu);
    atomic_store(&pool->stop, true);
    pthread_cond_broadcast(&pool->cv_start);
    pthread_mutex_unlock(&pool->mu);
    for (int i = 1; i < pool->n; i++) pthread_join(pool->threads[i - 1], NULL);
    pthread_mutex_destroy(&pool->mu);
    pthread_cond_destroy(&pool->cv_start);
    pthread_cond_destroy(&pool->cv_done);
    ks_free(pool->threads);
    ks_free(pool);
}

int ks_pool_size(const ks_pool *pool) { return pool ? pool->n : 1; }

void ks_pool_run(ks_pool *pool, ks_pool_fn fn, void *arg) {
    if (!pool || pool->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    pool->fn = fn;
    pool->arg = arg;
    atomic_store(&pool->pending, pool->n - 1);
    pthread_mutex_lock(&pool->mu);
    atomic_fetch_add_explicit(&pool->generation, 1, memory_order_release);
    pthread_cond_broadcast(&pool->cv_start);
    pthread_mutex_unlock(&pool->mu);
    fn(arg, 0, pool->n);
    int spins = 0;
    while (atomic_load_explicit(&pool->pending, memory_order_acquire) != 0) {
        if (++spins < KS_POOL_SPIN) {
#if defined(__x86_64__)
            __builtin_ia32_pause();
#endif
            if ((spins & 63) == 0) sched_yield();
            continue;
        }
        pthread_mutex_lock(&pool->mu);
        while (atomic_load(&pool->pending) != 0) pthread_cond_wait(&pool->cv_done, &pool->mu);
        pthread_mutex_unlock(&pool->mu);
    }
}

static void reserve_worker(void *arg, int ith, int nth) {
    (void)arg, (void)ith, (void)nth;
    ks_scratch_reserve();
}

void ks_pool_reserve_scratch(ks_pool *pool) { ks_pool_run(pool, reserve_worker, NULL); }
