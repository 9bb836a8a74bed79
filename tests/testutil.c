#include "testutil.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

const char *ks_test_fixture(const char *rel) {
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s/%s", KS_FIXTURES_DIR, rel);
    return buf;
}
const char *ks_test_source(const char *rel) {
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s/%s", KS_SOURCE_DIR, rel);
    return buf;
}
char *ks_test_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (fread(b, 1, (size_t)n, f) != (size_t)n) { free(b); fclose(f); return NULL; }
    b[n] = 0;
    fclose(f);
    if (len) *len = (size_t)n;
    return b;
}
double ks_test_nmse(const float *a, const float *b, size_t n, double *max_abs) {
    double num = 0, den = 0, mx = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * b[i];
        if (fabs(d) > mx) mx = fabs(d);
    }
    if (max_abs) *max_abs = mx;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}
