/*
 * test_pool.c — the fork-join thread pool.
 *
 * The pool's failure modes are lost wake-ups and missed or doubled work
 * items, which show up only under many rapid dispatches; so besides the
 * exactly-once check per call, thousands of tiny back-to-back jobs are run
 * (the decode loop's pattern) and pools are created and destroyed in a loop
 * (the path where a worker might still be waking when stop is set).
 * Pools larger than the machine are included on purpose: oversubscription
 * is where a spin-then-sleep protocol is most likely to lose a wake-up.
 */
#include "testutil.h"

#include "core/core.h"

#include <stdatomic.h>
#include <string.h>

typedef struct {
    atomic_int hits[8]; /* [n] calls per ith */
    atomic_int bad_nth;
    int expect_nth;
} count_job;

static void count_fn(void *arg, int ith, int nth) {
    count_job *j = arg;
    if (nth != j->expect_nth || ith < 0 || ith >= nth) {
        atomic_fetch_add(&j->bad_nth, 1);
        return;
    }
    atomic_fetch_add(&j->hits[ith], 1);
}

static void test_pool_exactly_once(void **state) {
    (void)state;
    for (int n = 1; n <= 4; n++) {
        ks_pool *pool = NULL;
        assert_int_equal(ks_pool_create(n, &pool), KS_OK);
        assert_int_equal(ks_pool_size(pool), n);
        for (int call = 0; call < 50; call++) {
            count_job j;
            memset(&j, 0, sizeof j);
            j.expect_nth = n;
            ks_pool_run(pool, count_fn, &j);
            assert_int_equal(atomic_load(&j.bad_nth), 0);
            for (int i = 0; i < n; i++) assert_int_equal(atomic_load(&j.hits[i]), 1);
            for (int i = n; i < 8; i++) assert_int_equal(atomic_load(&j.hits[i]), 0);
        }
        ks_pool_destroy(pool);
    }
}

/* Each job adds ith+1 to a per-thread slot; results must be visible to the
 * caller when ks_pool_run returns (no atomics on the data itself). */
typedef struct {
    long slot[4][16]; /* [nth][pad]: one cache line per thread */
} sum_job;
static void sum_fn(void *arg, int ith, int nth) {
    sum_job *j = arg;
    j->slot[ith][0] += ith + 1;
}

static void test_pool_many_tiny_jobs(void **state) {
    (void)state;
    for (int n = 2; n <= 4; n++) {
        ks_pool *pool;
        assert_int_equal(ks_pool_create(n, &pool), KS_OK);
        sum_job j;
        memset(&j, 0, sizeof j);
        /* Oversubscribed pools (more threads than cores) pay a scheduler
         * time slice per job while workers spin (see report on pool.c), so
         * they get fewer jobs to keep the test fast. */
        const int N = n <= ks_cpu_count() ? 10000 : 300;
        for (int k = 0; k < N; k++) {
            ks_pool_run(pool, sum_fn, &j);
            if (k % 1000 == 999)
                for (int i = 0; i < n; i++) assert_int_equal(j.slot[i][0], (long)(k + 1) * (i + 1));
        }
        for (int i = 0; i < n; i++) assert_int_equal(j.slot[i][0], (long)N * (i + 1));
        ks_pool_destroy(pool);
    }
}

/* Sleeping workers: a pause long enough for workers to leave the spin and
 * block on the condition variable, then dispatch again. */
static void test_pool_wake_after_idle(void **state) {
    (void)state;
    ks_pool *pool;
    assert_int_equal(ks_pool_create(3, &pool), KS_OK);
    for (int r = 0; r < 5; r++) {
        double t0 = ks_time_sec();
        while (ks_time_sec() - t0 < 0.02) {
        }
        count_job j;
        memset(&j, 0, sizeof j);
        j.expect_nth = 3;
        ks_pool_run(pool, count_fn, &j);
        for (int i = 0; i < 3; i++) assert_int_equal(atomic_load(&j.hits[i]), 1);
    }
    ks_pool_destroy(pool);
}

static void test_pool_create_destroy_loop(void **state) {
    (void)state;
    for (int k = 0; k < 200; k++) {
        ks_pool *pool;
        int n = 1 + k % 4;
        assert_int_equal(ks_pool_create(n, &pool), KS_OK);
        if (k % 2) { /* half of them destroyed without ever running a job */
            count_job j;
            memset(&j, 0, sizeof j);
            j.expect_nth = n;
            ks_pool_run(pool, count_fn, &j);
            assert_int_equal(atomic_load(&j.hits[n - 1]), 1);
        }
        ks_pool_destroy(pool);
    }
    ks_pool_destroy(NULL);
}

static void test_pool_bad_args(void **state) {
    (void)state;
    ks_pool *pool = NULL;
    assert_int_equal(ks_pool_create(0, &pool), KS_ERR_INVALID_ARG);
    assert_null(pool);
    assert_int_equal(ks_pool_create(-3, &pool), KS_ERR_INVALID_ARG);
    assert_int_equal(ks_pool_create(100000, &pool), KS_ERR_INVALID_ARG);
    assert_null(pool);
    assert_true(strlen(ks_last_error()) > 0);
    /* a NULL pool runs inline as a single thread */
    assert_int_equal(ks_pool_size(NULL), 1);
    count_job j;
    memset(&j, 0, sizeof j);
    j.expect_nth = 1;
    ks_pool_run(NULL, count_fn, &j);
    assert_int_equal(atomic_load(&j.hits[0]), 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_exactly_once),
        cmocka_unit_test(test_pool_many_tiny_jobs),
        cmocka_unit_test(test_pool_wake_after_idle),
        cmocka_unit_test(test_pool_create_destroy_loop),
        cmocka_unit_test(test_pool_bad_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
