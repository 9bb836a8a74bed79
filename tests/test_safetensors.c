/*
 * test_safetensors.c — the safetensors reader: round trips through files
 * written here (mmap and read-into-memory), sharded checkpoints, and one
 * malformed header per validation rule, each of which must fail with a
 * message naming the problem (and, under ASan, without a stray read).
 */
#include "testutil.h"

#include "checkpoint/safetensors.h"
#include "tensor/dtype.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *tmp_dir(void) {
    static char buf[1024];
    if (!buf[0]) {
        snprintf(buf, sizeof buf, "%s/test_safetensors_%d", KS_BINARY_DIR, (int)getpid());
        mkdir(buf, 0755);
    }
    return buf;
}

static const char *tmp_path(const char *name) {
    static char buf[4][1200];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmp_dir(), name);
    return buf[k];
}

/* Fixture: F32 [2,3], F16 [4], BF16 [2,2], I64 [3], BOOL [5], a scalar and an empty tensor. */
static float g_f32[6] = {1, -2, 3.5f, 0.25f, 1e-3f, -7};
static ks_f16 g_f16[4];
static ks_bf16 g_bf16[4];
static int64_t g_i64[3] = {5, -1, 1LL << 40};
static uint8_t g_bool[5] = {1, 0, 0, 1, 1};
static float g_scalar = 42.0f;

static uint8_t *fixture(size_t *size) {
    const float hv[4] = {0.5f, -1.5f, 2.0f, 65504.0f}, bv[4] = {1.0f, -0.125f, 3.0e5f, -2.5f};
    for (int i = 0; i < 4; i++) {
        g_f16[i] = ks_f32_to_f16(hv[i]);
        g_bf16[i] = ks_f32_to_bf16(bv[i]);
    }
    ks_test_st_tensor t[] = {
        {"w.f32", "F32", 2, {2, 3}, g_f32, sizeof g_f32},
        {"a.f16", "F16", 1, {4}, g_f16, sizeof g_f16},
        {"m.bf16", "BF16", 2, {2, 2}, g_bf16, sizeof g_bf16},
        {"ids", "I64", 1, {3}, g_i64, sizeof g_i64},
        {"mask", "BOOL", 1, {5}, g_bool, sizeof g_bool},
        {"scalar", "F32", 0, {0}, &g_scalar, 4},
        {"empty", "F32", 2, {0, 7}, NULL, 0},
    };
    return ks_test_safetensors_build(t, 7, "{\"format\":\"pt\",\"note\":\"hi\"}", size);
}

static void check_fixture(const ks_safetensors *st) {
    assert_int_equal(ks_safetensors_count(st), 7);
    /* sorted by name */
    for (int64_t i = 1; i < ks_safetensors_count(st); i++)
        assert_true(strcmp(ks_safetensors_at(st, i - 1)->name, ks_safetensors_at(st, i)->name) < 0);
    const ks_st_tensor *w = ks_safetensors_find(st, "w.f32");
    assert_non_null(w);
    assert_int_equal(w->dtype, KS_ST_F32);
    assert_int_equal(w->n_dims, 2);
    assert_int_equal(w->shape[0], 2);
    assert_int_equal(w->shape[1], 3);
    assert_int_equal(w->n_elem, 6);
    assert_int_equal(w->nbytes, 24);
    assert_memory_equal(w->data, g_f32, 24);
    float *f = NULL;
    const int64_t s23[2] = {2, 3};
    assert_int_equal(ks_safetensors_to_f32(w, 2, s23, &f), KS_OK);
    for (int i = 0; i < 6; i++) assert_true(f[i] == g_f32[i]);
    ks_free(f);
    const int64_t s4[1] = {4};
    assert_int_equal(ks_safetensors_load_f32(st, "a.f16", 1, s4, &f), KS_OK);
    assert_true(f[0] == 0.5f && f[1] == -1.5f && f[2] == 2.0f && f[3] == 65504.0f);
    ks_free(f);
    assert_int_equal(ks_safetensors_load_f32(st, "m.bf16", 0, NULL, &f), KS_OK);
    assert_true(f[0] == 1.0f && f[1] == -0.125f && f[3] == -2.5f);
    assert_true(fabsf(f[2] - 3.0e5f) < 3.0e5f / 128);
    ks_free(f);
    const ks_st_tensor *ids = ks_safetensors_find(st, "ids");
    assert_non_null(ids);
    int64_t iv[3];
    memcpy(iv, ids->data, 24);
    assert_true(iv[0] == 5 && iv[1] == -1 && iv[2] == (1LL << 40));
    const ks_st_tensor *m = ks_safetensors_find(st, "mask");
    assert_int_equal(m->dtype, KS_ST_BOOL);
    assert_memory_equal(m->data, g_bool, 5);
    const ks_st_tensor *sc = ks_safetensors_find(st, "scalar");
    assert_int_equal(sc->n_dims, 0);
    assert_int_equal(sc->n_elem, 1);
    const ks_st_tensor *e = ks_safetensors_find(st, "empty");
    assert_int_equal(e->n_elem, 0);
    assert_int_equal(e->nbytes, 0);
    assert_null(ks_safetensors_find(st, "nope"));
    assert_string_equal(ks_safetensors_metadata(st, "format"), "pt");
    assert_string_equal(ks_safetensors_metadata(st, "note"), "hi");
    assert_null(ks_safetensors_metadata(st, "absent"));
    assert_int_equal(ks_safetensors_n_metadata(st), 2);
}

static void test_roundtrip(void **state) {
    size_t n;
    uint8_t *img = fixture(&n);
    const char *path = tmp_path("rt.safetensors");
    assert_int_equal(ks_test_write_file(path, img, n), 0);
    for (int mm = 0; mm < 2; mm++) {
        ks_safetensors *st = NULL;
        assert_int_equal(ks_safetensors_open(path, mm == 1, &st), KS_OK);
        check_fixture(st);
        assert_int_equal(ks_safetensors_n_shards(st), 1);
        assert_int_equal(ks_safetensors_file_bytes(st), n);
        ks_safetensors_close(st);
    }
    ks_safetensors *st = NULL;
    assert_int_equal(ks_safetensors_open_buffer(img, n, &st), KS_OK);
    check_fixture(st);
    ks_safetensors_close(st);
    /* a directory holding model.safetensors */
    const char *dir = tmp_path("single");
    mkdir(dir, 0755);
    char p[1200];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    assert_int_equal(ks_test_write_file(p, img, n), 0);
    assert_int_equal(ks_safetensors_open(dir, true, &st), KS_OK);
    check_fixture(st);
    ks_safetensors_close(st);
    free(img);
}

static void test_shape_check_message(void **state) {
    size_t n;
    uint8_t *img = fixture(&n);
    ks_safetensors *st = NULL;
    assert_int_equal(ks_safetensors_open_buffer(img, n, &st), KS_OK);
    float *f = (float *)0x1;
    const int64_t want[2] = {3, 2};
    assert_int_equal(ks_safetensors_load_f32(st, "w.f32", 2, want, &f), KS_ERR_FORMAT);
    assert_true(f == (float *)0x1); /* out untouched */
    assert_non_null(strstr(ks_last_error(), "tensor w.f32 has shape [2, 3], expected [3, 2]"));
    assert_int_equal(ks_safetensors_load_f32(st, "ids", 0, NULL, &f), KS_ERR_UNSUPPORTED);
    assert_non_null(strstr(ks_last_error(), "I64"));
    assert_int_equal(ks_safetensors_load_f32(st, "missing", 0, NULL, &f), KS_ERR_NOT_FOUND);
    ks_safetensors_close(st);
    free(img);
}

typedef struct {
    const char *header;
    size_t data_len;
    ks_status want;
    const char *msg;
} bad_case;

static void test_malformed_headers(void **state) {
    static uint8_t data[64];
    const bad_case cases[] = {
        {"[1,2]", 0, KS_ERR_FORMAT, "must start with '{'"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}", 8, KS_ERR_FORMAT, "not well-formed JSON"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}xyz", 8, KS_ERR_FORMAT, "unexpected bytes after"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, KS_ERR_FORMAT, "outside the 8-byte data section"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
         16, KS_ERR_FORMAT, "overlap"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, KS_ERR_FORMAT, "needs 12 bytes"},
        {"{\"a\":{\"dtype\":\"F7\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, KS_ERR_UNSUPPORTED, "unknown dtype 'F7'"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
         16, KS_ERR_FORMAT, "duplicate tensor name 'a'"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, KS_ERR_FORMAT, "shape[0] is not a non-negative integer"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]}}", 8, KS_ERR_FORMAT, "shape[0]"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, KS_ERR_FORMAT, "data_offsets"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, KS_ERR_FORMAT, "end before they begin"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,\"8\"]}}", 8, KS_ERR_FORMAT, "data_offsets"},
        {"{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, KS_ERR_FORMAT, "\"dtype\""},
        {"{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, KS_ERR_FORMAT, "\"shape\""},
        {"{\"a\":7}", 0, KS_ERR_FORMAT, "not an object"},
        {"{\"__metadata__\":{\"k\":1}}", 0, KS_ERR_FORMAT, "__metadata__ value of 'k'"},
        {"{\"__metadata__\":[1]}", 0, KS_ERR_FORMAT, "__metadata__ is not an object"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, KS_ERR_UNSUPPORTED, "9 dimensions"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,4]}}", 4, KS_ERR_FORMAT, "overflows"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,1e300]}}", 4, KS_ERR_FORMAT, "data_offsets"},
        {"{\"\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, KS_ERR_FORMAT, "empty name"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n;
        uint8_t *img = ks_test_safetensors_raw(cases[i].header, data, cases[i].data_len, &n);
        ks_safetensors *st = (ks_safetensors *)0x1;
        ks_status s = ks_safetensors_open_buffer(img, n, &st);
        if (s != cases[i].want || !strstr(ks_last_error(), cases[i].msg))
            fail_msg("case %zu (%s): status %d, message '%s'", i, cases[i].header, (int)s, ks_last_error());
        assert_true(st == (ks_safetensors *)0x1);
        free(img);
    }
}

static void test_truncated_and_huge(void **state) {
    ks_safetensors *st = NULL;
    uint8_t small[5] = {1, 2, 3, 4, 5};
    assert_int_equal(ks_safetensors_open_buffer(small, sizeof small, &st), KS_ERR_FORMAT);
    assert_non_null(strstr(ks_last_error(), "too small"));
    uint8_t huge[16] = {0};
    uint64_t n = (uint64_t)1 << 62;
    memcpy(huge, &n, 8);
    memcpy(huge + 8, "{}      ", 8);
    assert_int_equal(ks_safetensors_open_buffer(huge, sizeof huge, &st), KS_ERR_FORMAT);
    assert_non_null(strstr(ks_last_error(), "exceeds"));
    /* every prefix of a valid file either fails cleanly or is a valid file */
    size_t len;
    uint8_t *img = fixture(&len);
    for (size_t cut = 0; cut < len; cut++) {
        uint8_t *p = malloc(cut ? cut : 1);
        memcpy(p, img, cut);
        st = NULL;
        ks_status s = ks_safetensors_open_buffer(p, cut, &st);
        assert_int_not_equal(s, KS_OK);
        free(p);
    }
    /* a truncated file on disk names the file */
    const char *path = tmp_path("trunc.safetensors");
    assert_int_equal(ks_test_write_file(path, img, len - 3), 0);
    assert_int_equal(ks_safetensors_open(path, true, &st), KS_ERR_FORMAT);
    assert_non_null(strstr(ks_last_error(), "trunc.safetensors"));
    assert_non_null(strstr(ks_last_error(), "outside"));
    assert_int_equal(ks_safetensors_open(tmp_path("does-not-exist"), true, &st), KS_ERR_IO);
    assert_int_equal(ks_safetensors_open(tmp_dir(), true, &st), KS_ERR_IO); /* dir without a model */
    free(img);
}

static void write_shard(const char *dir, const char *file, const ks_test_st_tensor *t, int n) {
    size_t len;
    uint8_t *img = ks_test_safetensors_build(t, n, NULL, &len);
    char p[1200];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    assert_int_equal(ks_test_write_file(p, img, len), 0);
    free(img);
}

static void write_index(const char *dir, const char *json) {
    char p[1200];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    assert_int_equal(ks_test_write_file(p, json, strlen(json)), 0);
}

static void test_sharded(void **state) {
    const char *dir = tmp_path("sharded");
    mkdir(dir, 0755);
    float a[4] = {1, 2, 3, 4}, b[2] = {5, 6};
    ks_test_st_tensor s1[] = {{"x.weight", "F32", 2, {2, 2}, a, sizeof a}};
    ks_test_st_tensor s2[] = {{"y.weight", "F32", 1, {2}, b, sizeof b}};
    write_shard(dir, "model-00001-of-00002.safetensors", s1, 1);
    write_shard(dir, "model-00002-of-00002.safetensors", s2, 1);
    write_index(dir, "{\"metadata\":{\"total_size\":24},\"weight_map\":{"
                     "\"x.weight\":\"model-00001-of-00002.safetensors\",\"y.weight\":\"model-00002-of-00002.safetensors\"}}");
    ks_safetensors *st = NULL;
    assert_int_equal(ks_safetensors_open(dir, false, &st), KS_OK);
    assert_int_equal(ks_safetensors_n_shards(st), 2);
    assert_int_equal(ks_safetensors_count(st), 2);
    float *f = NULL;
    assert_int_equal(ks_safetensors_load_f32(st, "y.weight", 0, NULL, &f), KS_OK);
    assert_true(f[0] == 5 && f[1] == 6);
    ks_free(f);
    ks_safetensors_close(st);
    char idx[1200];
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
    assert_int_equal(ks_safetensors_open(idx, true, &st), KS_OK);
    ks_safetensors_close(st);

    /* tensor mapped to the wrong shard */
    write_index(dir, "{\"weight_map\":{\"x.weight\":\"model-00002-of-00002.safetensors\",\"y.weight\":\"model-00001-of-00002.safetensors\"}}");
    assert_int_equal(ks_safetensors_open(dir, true, &st), KS_ERR_FORMAT);
    assert_non_null(strstr(ks_last_error(), "is mapped to"));
    /* a tensor no shard has */
    write_index(dir, "{\"weight_map\":{\"x.weight\":\"model-00001-of-00002.safetensors\",\"z\":\"model-00001-of-00002.safetensors\"}}");
    assert_int_equal(ks_safetensors_open(dir, true, &st), KS_ERR_FORMAT);
    assert_non_null(strstr(ks_last_error(), "in no shard"));
    /* shard names may not leave the directory */
    write_index(dir, "{\"weight_map\":{\"x.weight\":\"../model-00001-of-00002.safetensors\"}}");
    assert_int_equal(ks_safetensors_open(dir, true, &st), KS_ERR_FORMAT);
    assert_non_null(strstr(ks_last_error(), "does not name a file"));
    write_index(dir, "{\"weight_map\":{}}");
    assert_int_equal(ks_safetensors_open(dir, true, &st), KS_ERR_FORMAT);
    write_index(dir, "{\"weight_map\":");
    assert_int_equal(ks_safetensors_open(dir, true, &st), KS_ERR_FORMAT);
    /* missing shard file */
    write_index(dir, "{\"weight_map\":{\"x.weight\":\"gone.safetensors\"}}");
    assert_int_equal(ks_safetensors_open(dir, true, &st), KS_ERR_IO);
    /* the same name in two shards */
    ks_test_st_tensor s3[] = {{"x.weight", "F32", 1, {2}, b, sizeof b}};
    write_shard(dir, "dup.safetensors", s3, 1);
    write_index(dir, "{\"weight_map\":{\"x.weight\":\"model-00001-of-00002.safetensors\",\"w\":\"dup.safetensors\"}}");
    assert_int_equal(ks_safetensors_open(dir, true, &st), KS_ERR_FORMAT);
    assert_non_null(strstr(ks_last_error(), "duplicate tensor name 'x.weight'"));
}

/* A repeated metadata key keeps its first value; lookups work after sorting. */
static void test_metadata_duplicates(void **state) {
    size_t n;
    uint8_t *img = ks_test_safetensors_raw("{\"__metadata__\":{\"z\":\"1\",\"a\":\"2\",\"z\":\"3\",\"m\":\"4\"}}", NULL, 0, &n);
    ks_safetensors *st = NULL;
    assert_int_equal(ks_safetensors_open_buffer(img, n, &st), KS_OK);
    assert_int_equal(ks_safetensors_n_metadata(st), 3);
    assert_string_equal(ks_safetensors_metadata(st, "z"), "1");
    assert_string_equal(ks_safetensors_metadata(st, "a"), "2");
    assert_string_equal(ks_safetensors_metadata(st, "m"), "4");
    const char *k, *v;
    ks_safetensors_metadata_at(st, 0, &k, &v);
    assert_string_equal(k, "a");
    assert_int_equal(ks_safetensors_count(st), 0);
    ks_safetensors_close(st);
    free(img);
}

static void test_dtype_table(void **state) {
    ks_st_dtype t;
    assert_true(ks_st_dtype_from_name("BF16", &t) && t == KS_ST_BF16);
    assert_false(ks_st_dtype_from_name("bf16", &t));
    assert_int_equal(ks_st_dtype_size(KS_ST_I64), 8);
    assert_int_equal(ks_st_dtype_size(KS_ST_F8_E4M3), 1);
    assert_string_equal(ks_st_dtype_name(KS_ST_F16), "F16");
    char b[64];
    const int64_t s[3] = {4096, 8192, 1};
    assert_string_equal(ks_st_shape_str(3, s, b, sizeof b), "[4096, 8192, 1]");
    assert_string_equal(ks_st_shape_str(0, s, b, sizeof b), "[]");
}

/* The fuzz seeds are valid files (so the fuzzer starts from the happy path). */
static void test_fuzz_seeds(void **state) {
    const char *seeds[] = {"mixed.safetensors", "eagle3_head.safetensors", "empty_header.safetensors",
                           "metadata_only.safetensors"};
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "tests/fuzz/corpus_safetensors/%s", seeds[i]);
        ks_safetensors *st = NULL;
        if (ks_safetensors_open(ks_test_source(rel), i % 2 == 0, &st) != KS_OK) fail_msg("%s: %s", rel, ks_last_error());
        ks_safetensors_close(st);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),        cmocka_unit_test(test_shape_check_message),
        cmocka_unit_test(test_malformed_headers), cmocka_unit_test(test_truncated_and_huge),
        cmocka_unit_test(test_sharded),          cmocka_unit_test(test_dtype_table),
        cmocka_unit_test(test_fuzz_seeds),       cmocka_unit_test(test_metadata_duplicates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
