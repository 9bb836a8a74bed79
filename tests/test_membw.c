/*
 * test_membw.c — sanity of the bandwidth probe.
 *
 * Timing thresholds would make the suite flaky on shared CI machines, so the
 * checks are only about plausibility: every figure positive and finite, the
 * read roof not wildly below the triad (a broken read kernel that measures
 * FP latency would land far below), and the checksum proving the read loop
 * really ran over every element.  Arrays are small (32 MiB) to stay fast;
 * best-of-several keeps a preempted repetition from deciding the result.
 */
#include "testutil.h"

#include "core/core.h"
#include "core/membw.h"

#include <math.h>

static void check_result(const ks_membw_result *r, size_t bytes) {
    assert_true(r->copy_gbs > 0 && isfinite(r->copy_gbs));
    assert_true(r->triad_gbs > 0 && isfinite(r->triad_gbs));
    assert_true(r->read_gbs > 0 && isfinite(r->read_gbs));
    assert_true(r->bytes_per_array > 0 && r->bytes_per_array <= bytes);
    /* read sums b[i] = 2.0 over every covered element */
    double want = 2.0 * (double)(r->bytes_per_array / sizeof(float));
    assert_true(fabs(r->checksum - want) <= 1e-6 * want);
    assert_true(r->seconds > 0);
}

static void test_membw_single(void **state) {
    (void)state;
    ks_membw_result r;
    const size_t bytes = (size_t)32 << 20;
    assert_int_equal(ks_membw_measure(NULL, bytes, 3, &r), KS_OK);
    check_result(&r, bytes);
    assert_int_equal(r.n_threads, 1);
    assert_int_equal(r.reps, 3);
}

static void test_membw_pool(void **state) {
    (void)state;
    /* Pools no larger than the machine: an oversubscribed pool pays a
     * scheduler time slice per dispatch, comparable to one 32 MiB pass, and
     * the ratio check would then measure the scheduler. */
    int max_nt = ks_cpu_count() < 4 ? ks_cpu_count() : 4;
    for (int nt = 2; nt <= max_nt; nt++) {
        ks_pool *pool;
        assert_int_equal(ks_pool_create(nt, &pool), KS_OK);
        ks_membw_result r;
        const size_t bytes = ((size_t)32 << 20) + 12345; /* uneven split */
        assert_int_equal(ks_membw_measure(pool, bytes, 5, &r), KS_OK);
        check_result(&r, bytes);
        assert_int_equal(r.n_threads, nt);
        ks_pool_destroy(pool);
    }
}

static void test_membw_bad_args(void **state) {
    (void)state;
    ks_membw_result r;
    assert_int_equal(ks_membw_measure(NULL, 100, 1, &r), KS_ERR_INVALID_ARG);
    assert_int_equal(ks_membw_measure(NULL, (size_t)1 << 20, 1, NULL), KS_ERR_INVALID_ARG);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_membw_single),
        cmocka_unit_test(test_membw_pool),
        cmocka_unit_test(test_membw_bad_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
