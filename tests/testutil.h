/*
 * testutil.h — shared helpers for the cmocka test programs.
 * Every tests/test_*.c becomes one CTest test (see CMakeLists.txt).
 */
#ifndef KS_TESTUTIL_H
#define KS_TESTUTIL_H
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

/* Path under the shared fixtures dir; returns a static buffer. */
const char *ks_test_fixture(const char *rel);
/* Path under the source tree; returns a static buffer. */
const char *ks_test_source(const char *rel);
/* Read a whole file into a malloc'd buffer (NUL-terminated); NULL on failure. */
char *ks_test_read_file(const char *path, size_t *len);
/* Normalized error ||a-b|| / ||b|| and max abs error. */
double ks_test_nmse(const float *a, const float *b, size_t n, double *max_abs);
#endif
