#include "testutil.h"
#include "policies/registry.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "model/shapes.h"
#include "tensor/dtype.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The fixtures live in the repository (tests/fixtures, see its README.md);
 * CMake passes KS_FIXTURES_DIR, which a build may point elsewhere. */
#ifndef KS_FIXTURES_DIR
#define KS_FIXTURES_DIR KS_SOURCE_DIR "/tests/fixtures"
#endif

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

uint8_t *ks_test_safetensors_raw(const char *header, const void *data, size_t data_len, size_t *size) {
    size_t h = strlen(header);
    uint8_t *b = malloc(8 + h + data_len + 1);
    uint64_t n = h;
    memcpy(b, &n, 8);
    memcpy(b + 8, header, h);
    if (data_len) memcpy(b + 8 + h, data, data_len);
    *size = 8 + h + data_len;
    return b;
}

uint8_t *ks_test_safetensors_build(const ks_test_st_tensor *t, int n, const char *metadata, size_t *size) {
    size_t cap = 256 + (metadata ? strlen(metadata) : 0), len = 0, off = 0, data_len = 0;
    for (int i = 0; i < n; i++) cap += strlen(t[i].name) + 160 + 24 * (size_t)t[i].n_dims;
    char *hdr = malloc(cap + 8);
    len += (size_t)snprintf(hdr + len, cap - len, "{");
    if (metadata) len += (size_t)snprintf(hdr + len, cap - len, "\"__metadata__\":%s%s", metadata, n ? "," : "");
    for (int i = 0; i < n; i++) {
        len += (size_t)snprintf(hdr + len, cap - len, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "", t[i].name, t[i].dtype);
        for (int d = 0; d < t[i].n_dims; d++) len += (size_t)snprintf(hdr + len, cap - len, "%s%lld", d ? "," : "", (long long)t[i].shape[d]);
        len += (size_t)snprintf(hdr + len, cap - len, "],\"data_offsets\":[%zu,%zu]}", off, off + t[i].nbytes);
        off += t[i].nbytes;
    }
    len += (size_t)snprintf(hdr + len, cap - len, "}");
    while (len % 8) hdr[len++] = ' ';
    hdr[len] = 0;
    data_len = off;
    uint8_t *data = malloc(data_len + 1);
    off = 0;
    for (int i = 0; i < n; i++) {
        if (t[i].nbytes) memcpy(data + off, t[i].data, t[i].nbytes);
        off += t[i].nbytes;
    }
    uint8_t *img = ks_test_safetensors_raw(hdr, data, data_len, size);
    free(hdr);
    free(data);
    return img;
}

int ks_test_write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(data, 1, n, f);
    return fclose(f) == 0 && w == n ? 0 : -1;
}

int ks_test_tiny_shape(const char *shape, int n_layer, uint64_t seed, int32_t n_ctx, const char *path,
                       struct ks_model **out) {
    ks_gguf *vocab = NULL;
    if (ks_gguf_open(ks_test_fixture("models/aidreams260K.gguf"), &vocab) != KS_OK) return -1;
    ks_shape_gen_params gp = {.type = KS_DTYPE_F16, .vocab = vocab, .seed = seed, .n_layer = n_layer, .n_ctx = n_ctx};
    ks_status st = ks_shape_generate(ks_shape_find(shape), &gp, path, NULL);
    ks_gguf_close(vocab);
    if (st != KS_OK) return -1;
    return ks_model_load(path, ks_model_default_params(), out) == KS_OK ? 0 : -1;
}

int ks_test_tiny_llama(int n_layer, uint64_t seed, const char *path, struct ks_model **out) {
    return ks_test_tiny_shape("tiny-llama", n_layer, seed, 512, path, out);
}

int ks_test_policy_create(const char *name, const char *args, int32_t budget, int32_t sink, int32_t window,
                          int32_t dense_layers, const ks_policy_env *env, ks_policy **out) {
    ks_policy_spec spec;
    ks_status st = ks_policy_spec_parse(name, args, budget, sink, window, dense_layers, &spec);
    return st != KS_OK ? (int)st : (int)ks_policy_create(&spec, env, out);
}

void ks_test_expect_load_refused(const char *path, const char *needle) {
    ks_model *m = NULL;
    assert_int_not_equal(ks_model_load(path, ks_model_default_params(), &m), KS_OK);
    assert_null(m);
    if (!strstr(ks_last_error(), needle)) fail_msg("error '%s' does not mention '%s'", ks_last_error(), needle);
    unlink(path);
}
