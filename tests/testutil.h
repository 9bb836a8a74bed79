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

/* Path under the test fixtures dir (tests/fixtures); returns a static buffer. */
const char *ks_test_fixture(const char *rel);
/* Path under the source tree; returns a static buffer. */
const char *ks_test_source(const char *rel);
/* Read a whole file into a malloc'd buffer (NUL-terminated); NULL on failure. */
char *ks_test_read_file(const char *path, size_t *len);
/* Normalized error ||a-b|| / ||b|| and max abs error. */
double ks_test_nmse(const float *a, const float *b, size_t n, double *max_abs);

/* One tensor for ks_test_safetensors_build: dtype is the safetensors name
 * ("F32", "BF16", ...); data holds nbytes (may be NULL when nbytes is 0). */
typedef struct ks_test_st_tensor {
    const char *name;
    const char *dtype;
    int n_dims;
    int64_t shape[8];
    const void *data;
    size_t nbytes;
} ks_test_st_tensor;
/* A safetensors image: header with consecutive data_offsets (space-padded to
 * 8 bytes, like the reference writer), optional metadata JSON object text
 * (e.g. "{\"format\":\"pt\"}") or NULL.  malloc'd; *size receives its length. */
uint8_t *ks_test_safetensors_build(const ks_test_st_tensor *t, int n, const char *metadata, size_t *size);
/* Image from a raw header string and a data section (for malformed files). */
uint8_t *ks_test_safetensors_raw(const char *header, const void *data, size_t data_len, size_t *size);
/* Write bytes to path; 0 on success. */
int ks_test_write_file(const char *path, const void *data, size_t n);

/* The policies' test model: gen-model's tiny-llama (GQA, head dim 64, f16)
 * with n_layer layers, 512 tokens of context and aidreams260K's vocabulary,
 * written to path and loaded into *out.  0 on success. */
struct ks_model;
int ks_test_tiny_llama(int n_layer, uint64_t seed, const char *path, struct ks_model **out);
/* gen-model's shape `shape` (f16, the aidreams260K vocabulary; n_layer 0:
 * the shape's own) written to path and loaded into *out; 0 on success. */
int ks_test_tiny_shape(const char *shape, int n_layer, uint64_t seed, int32_t n_ctx, const char *path,
                       struct ks_model **out);
/* Asserts that loading the model file at path fails, leaves no model, and
 * that the error message contains needle; then removes the file. */
void ks_test_expect_load_refused(const char *path, const char *needle);
/* A policy instance over env from its name and arguments, through the one
 * parser (ks_policy_spec_parse) and ks_policy_create: the parser's status
 * when it refuses them, else create's. */
struct ks_policy_env;
struct ks_policy;
int ks_test_policy_create(const char *name, const char *args, int32_t budget, int32_t sink, int32_t window,
                          int32_t dense_layers, const struct ks_policy_env *env, struct ks_policy **out);
#endif
