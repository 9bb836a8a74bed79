/*
 * test_gguf.c — GGUF writer/reader round trips, the real fixtures, hostile
 * input, and the random-weight model generator.
 *
 * Why these tests look the way they do:
 * - The writer and reader are tested against each other AND against files
 *   nobody here wrote: copying every kv and tensor of llama.cpp-written
 *   fixtures through our writer must reproduce them byte for byte.  That pins
 *   the encoding far harder than a self-consistent round trip can.
 * - Corrupt input is fed through ks_gguf_open_buffer from a heap buffer of
 *   exactly the truncated size, so under ASan (-DKVSIEVE_SANITIZE=ON) any read
 *   past the end is caught, not just wrong answers.  When a mutation happens
 *   to leave a valid file (a flipped bit in tensor data) the parse succeeds and
 *   the test walks every byte the reader hands out for the same reason.
 * - Absurd counts are crafted by hand in tiny files: a reader that sizes an
 *   allocation from an unchecked count would abort (OOM handler) or trip ASan.
 */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"

#include "gguf/gguf.h"
#include "model/shapes.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------- helpers -- */
static const char *tmp_path(const char *name) {
    static char buf[4][1024];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/test_gguf_%d_%s", KS_BINARY_DIR, (int)getpid(), name);
    return buf[k];
}

static uint8_t *read_all(const char *path, size_t *n) {
    uint8_t *b = (uint8_t *)ks_test_read_file(path, n);
    assert_non_null(b);
    return b;
}

/* Touch every byte the reader exposes (ASan finds out-of-bounds views). */
static uint64_t walk(const ks_gguf *g) {
    uint64_t h = 0;
    for (int64_t i = 0; i < ks_gguf_n_kv(g); i++) {
        const ks_gguf_kv *kv = ks_gguf_kv_at(g, i);
        for (uint64_t j = 0; j < kv->key.len; j++) h += (uint8_t)kv->key.data[j];
        if (kv->type == KS_GGUF_STRING) {
            for (uint64_t j = 0; j < kv->str.len; j++) h += (uint8_t)kv->str.data[j];
        } else if (kv->type == KS_GGUF_ARRAY) {
            if (kv->arr_type == KS_GGUF_STRING) {
                for (uint64_t j = 0; j < kv->arr_n; j++)
                    for (uint64_t c = 0; c < kv->arr_strs[j].len; c++) h += (uint8_t)kv->arr_strs[j].data[c];
            } else {
                for (uint64_t j = 0; j < kv->arr_n; j++) h += (uint64_t)ks_gguf_arr_i64(kv, j);
            }
        } else {
            for (size_t j = 0; j < ks_gguf_type_size(kv->type); j++) h += kv->scalar[j];
        }
    }
    for (int64_t i = 0; i < ks_gguf_n_tensors(g); i++) {
        const ks_gguf_tensor *t = ks_gguf_tensor_at(g, i);
        const uint8_t *d = t->data;
        for (size_t j = 0; j < t->nbytes; j++) h += d[j];
        for (uint64_t j = 0; j < t->name.len; j++) h += (uint8_t)t->name.data[j];
    }
    return h;
}

/* Parse a copy of buf[0..n) in a heap block of exactly n bytes. */
static ks_status parse_copy(const uint8_t *buf, size_t n) {
    uint8_t *c = malloc(n ? n : 1);
    if (n) memcpy(c, buf, n);
    ks_gguf *g = NULL;
    ks_status st = ks_gguf_open_buffer(c, n, &g);
    if (st == KS_OK) {
        (void)walk(g);
        ks_gguf_close(g);
    }
    free(c);
    return st;
}

/* A byte builder for hand-crafted files. */
typedef struct { uint8_t *p; size_t n, cap; } tb;
static void tb_raw(tb *b, const void *s, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}
static void tb_u32(tb *b, uint32_t v) { uint8_t x[4]; for (int i = 0; i < 4; i++) x[i] = (uint8_t)(v >> 8 * i); tb_raw(b, x, 4); }
static void tb_u64(tb *b, uint64_t v) { uint8_t x[8]; for (int i = 0; i < 8; i++) x[i] = (uint8_t)(v >> 8 * i); tb_raw(b, x, 8); }
static void tb_str(tb *b, const char *s) { tb_u64(b, strlen(s)); tb_raw(b, s, strlen(s)); }
static void tb_pad(tb *b, size_t a) { while (b->n % a) { uint8_t z = 0; tb_raw(b, &z, 1); } }
static void tb_zeros(tb *b, size_t n) { for (size_t i = 0; i < n; i++) { uint8_t z = 0; tb_raw(b, &z, 1); } }

/* ------------------------------------------------------- kv round trip -- */
static ks_gguf_kv mk_scalar_kv(const char *key, ks_gguf_type t, const uint8_t *le) {
    ks_gguf_kv kv;
    memset(&kv, 0, sizeof kv);
    kv.key.data = key;
    kv.key.len = strlen(key);
    kv.type = t;
    kv.scalar = le;
    return kv;
}

static void test_kv_roundtrip(void **state) {
    (void)state;
    ks_gguf_writer *w;
    assert_int_equal(ks_gguf_writer_create(&w), KS_OK);
    ks_gguf_writer_set_u32(w, "t.u32", 4000000000u);
    ks_gguf_writer_set_i32(w, "t.i32", -123456);
    ks_gguf_writer_set_f32(w, "t.f32", 3.25f);
    ks_gguf_writer_set_bool(w, "t.true", true);
    ks_gguf_writer_set_bool(w, "t.false", false);
    ks_gguf_writer_set_str(w, "t.str", "h\xc3\xa9llo");
    ks_gguf_writer_set_str(w, "t.empty", "");
    ks_gguf_writer_set_u32(w, "t.dup", 1);
    ks_gguf_writer_set_u32(w, "t.dup", 2); /* replaces, keeps position */

    /* every scalar array type */
    const uint8_t a_u8[] = {0, 1, 255};
    const int8_t a_i8[] = {-128, 0, 127};
    const uint16_t a_u16[] = {0, 65535, 7};
    const int16_t a_i16[] = {-32768, 32767, -1};
    const uint32_t a_u32[] = {0, 0xFFFFFFFFu, 42};
    const int32_t a_i32[] = {INT32_MIN, INT32_MAX, -7};
    const float a_f32[] = {-1.5f, 0.0f, 1e30f};
    const bool a_bool[] = {true, false, true};
    const uint64_t a_u64[] = {0, UINT64_MAX, 1ull << 40};
    const int64_t a_i64[] = {INT64_MIN, INT64_MAX, -3};
    const double a_f64[] = {-2.5, 1e300, 0.125};
    ks_gguf_writer_set_arr(w, "a.u8", KS_GGUF_UINT8, a_u8, 3);
    ks_gguf_writer_set_arr(w, "a.i8", KS_GGUF_INT8, a_i8, 3);
    ks_gguf_writer_set_arr(w, "a.u16", KS_GGUF_UINT16, a_u16, 3);
    ks_gguf_writer_set_arr(w, "a.i16", KS_GGUF_INT16, a_i16, 3);
    ks_gguf_writer_set_arr(w, "a.u32", KS_GGUF_UINT32, a_u32, 3);
    ks_gguf_writer_set_arr(w, "a.i32", KS_GGUF_INT32, a_i32, 3);
    ks_gguf_writer_set_arr(w, "a.f32", KS_GGUF_FLOAT32, a_f32, 3);
    ks_gguf_writer_set_arr(w, "a.bool", KS_GGUF_BOOL, a_bool, 3);
    ks_gguf_writer_set_arr(w, "a.u64", KS_GGUF_UINT64, a_u64, 3);
    ks_gguf_writer_set_arr(w, "a.i64", KS_GGUF_INT64, a_i64, 3);
    ks_gguf_writer_set_arr(w, "a.f64", KS_GGUF_FLOAT64, a_f64, 3);
    ks_gguf_writer_set_arr(w, "a.empty", KS_GGUF_UINT32, NULL, 0);

    /* scalar types without a setter, and string arrays, through copy_kv */
    const uint8_t le_u8[] = {200}, le_i8[] = {0x80}, le_u16[] = {0x34, 0x12}, le_i16[] = {0xFE, 0xFF};
    const uint8_t le_u64[] = {1, 2, 3, 4, 5, 6, 7, 0x08}, le_i64[] = {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};
    double d = -0.75;
    uint8_t le_f64[8];
    memcpy(le_f64, &d, 8);
    ks_gguf_kv k;
    k = mk_scalar_kv("c.u8", KS_GGUF_UINT8, le_u8); ks_gguf_writer_copy_kv(w, &k);
    k = mk_scalar_kv("c.i8", KS_GGUF_INT8, le_i8); ks_gguf_writer_copy_kv(w, &k);
    k = mk_scalar_kv("c.u16", KS_GGUF_UINT16, le_u16); ks_gguf_writer_copy_kv(w, &k);
    k = mk_scalar_kv("c.i16", KS_GGUF_INT16, le_i16); ks_gguf_writer_copy_kv(w, &k);
    k = mk_scalar_kv("c.u64", KS_GGUF_UINT64, le_u64); ks_gguf_writer_copy_kv(w, &k);
    k = mk_scalar_kv("c.i64", KS_GGUF_INT64, le_i64); ks_gguf_writer_copy_kv(w, &k);
    k = mk_scalar_kv("c.f64", KS_GGUF_FLOAT64, le_f64); ks_gguf_writer_copy_kv(w, &k);
    ks_gguf_str strs[4] = {{5, "alpha"}, {0, ""}, {3, "a\0b"}, {4, "\xe2\x96\x81x"}};
    memset(&k, 0, sizeof k);
    k.key.data = "c.strs";
    k.key.len = 6;
    k.type = KS_GGUF_ARRAY;
    k.arr_type = KS_GGUF_STRING;
    k.arr_n = 4;
    k.arr_strs = strs;
    ks_gguf_writer_copy_kv(w, &k);
    ks_gguf_str s1 = {7, "single!"};
    memset(&k, 0, sizeof k);
    k.key = (ks_gguf_str){8, "c.single"};
    k.type = KS_GGUF_STRING;
    k.str = s1;
    ks_gguf_writer_copy_kv(w, &k);

    const char *path = tmp_path("kv.gguf");
    assert_int_equal(ks_gguf_writer_write(w, path), KS_OK);
    ks_gguf_writer_destroy(w);

    ks_gguf *g;
    assert_int_equal(ks_gguf_open(path, &g), KS_OK);
    assert_int_equal(ks_gguf_version(g), 3);
    assert_int_equal(ks_gguf_n_tensors(g), 0);
    assert_int_equal(ks_gguf_n_kv(g), 8 + 12 + 9);
    uint32_t u;
    int32_t i;
    float f;
    bool b;
    ks_gguf_str s;
    assert_int_equal(ks_gguf_get_u32(g, "t.u32", &u), KS_OK); assert_int_equal(u, 4000000000u);
    assert_int_equal(ks_gguf_get_i32(g, "t.i32", &i), KS_OK); assert_int_equal(i, -123456);
    assert_int_equal(ks_gguf_get_f32(g, "t.f32", &f), KS_OK); assert_true(f == 3.25f);
    assert_int_equal(ks_gguf_get_bool(g, "t.true", &b), KS_OK); assert_true(b);
    assert_int_equal(ks_gguf_get_bool(g, "t.false", &b), KS_OK); assert_false(b);
    assert_int_equal(ks_gguf_get_str(g, "t.str", &s), KS_OK); assert_true(ks_gguf_str_eq(s, "h\xc3\xa9llo"));
    assert_int_equal(ks_gguf_get_str(g, "t.empty", &s), KS_OK); assert_int_equal(s.len, 0);
    assert_int_equal(ks_gguf_get_u32(g, "t.dup", &u), KS_OK); assert_int_equal(u, 2);
    assert_true(ks_gguf_str_eq(ks_gguf_kv_at(g, 7)->key, "t.dup"));
    assert_int_equal(ks_gguf_get_u32(g, "absent", &u), KS_ERR_NOT_FOUND);

    const ks_gguf_kv *a;
    struct { const char *key; ks_gguf_type t; const void *data; size_t es; } arrs[] = {
        {"a.u8", KS_GGUF_UINT8, a_u8, 1}, {"a.i8", KS_GGUF_INT8, a_i8, 1}, {"a.u16", KS_GGUF_UINT16, a_u16, 2},
        {"a.i16", KS_GGUF_INT16, a_i16, 2}, {"a.u32", KS_GGUF_UINT32, a_u32, 4}, {"a.i32", KS_GGUF_INT32, a_i32, 4},
        {"a.f32", KS_GGUF_FLOAT32, a_f32, 4}, {"a.bool", KS_GGUF_BOOL, NULL, 1}, {"a.u64", KS_GGUF_UINT64, a_u64, 8},
        {"a.i64", KS_GGUF_INT64, a_i64, 8}, {"a.f64", KS_GGUF_FLOAT64, a_f64, 8},
    };
    for (size_t j = 0; j < sizeof arrs / sizeof arrs[0]; j++) {
        assert_int_equal(ks_gguf_get_arr(g, arrs[j].key, &a), KS_OK);
        assert_int_equal(a->arr_type, arrs[j].t);
        assert_int_equal(a->arr_n, 3);
        if (arrs[j].data) assert_memory_equal(a->arr_data, arrs[j].data, 3 * arrs[j].es); /* host is LE */
    }
    assert_int_equal(ks_gguf_get_arr(g, "a.bool", &a), KS_OK);
    assert_int_equal(a->arr_data[0], 1); assert_int_equal(a->arr_data[1], 0); assert_int_equal(a->arr_data[2], 1);
    assert_true(ks_gguf_arr_f64(ks_gguf_find_kv(g, "a.f64"), 1) == 1e300);
    assert_int_equal(ks_gguf_arr_i64(ks_gguf_find_kv(g, "a.i64"), 0), INT64_MIN);
    assert_int_equal(ks_gguf_get_arr(g, "a.empty", &a), KS_OK); assert_int_equal(a->arr_n, 0);

    assert_int_equal(ks_gguf_find_kv(g, "c.u8")->type, KS_GGUF_UINT8);
    assert_int_equal(ks_gguf_find_kv(g, "c.u8")->scalar[0], 200);
    assert_int_equal(ks_gguf_find_kv(g, "c.i8")->type, KS_GGUF_INT8);
    assert_int_equal(ks_gguf_get_i32(g, "c.i8", &i), KS_OK); assert_int_equal(i, -128);
    assert_int_equal(ks_gguf_get_u32(g, "c.u16", &u), KS_OK); assert_int_equal(u, 0x1234);
    assert_int_equal(ks_gguf_get_i32(g, "c.i16", &i), KS_OK); assert_int_equal(i, -2);
    assert_int_equal(ks_gguf_find_kv(g, "c.u64")->type, KS_GGUF_UINT64);
    assert_memory_equal(ks_gguf_find_kv(g, "c.u64")->scalar, le_u64, 8);
    assert_int_equal(ks_gguf_get_i32(g, "c.i64", &i), KS_OK); assert_int_equal(i, -1);
    assert_int_equal(ks_gguf_get_f32(g, "c.f64", &f), KS_OK); assert_true(f == -0.75f);
    assert_int_equal(ks_gguf_get_arr(g, "c.strs", &a), KS_OK);
    assert_int_equal(a->arr_type, KS_GGUF_STRING);
    assert_int_equal(a->arr_n, 4);
    for (int j = 0; j < 4; j++) {
        assert_int_equal(a->arr_strs[j].len, strs[j].len);
        assert_memory_equal(a->arr_strs[j].data, strs[j].data, strs[j].len);
    }
    assert_int_equal(ks_gguf_get_str(g, "c.single", &s), KS_OK); assert_true(ks_gguf_str_eq(s, "single!"));

    /* copying every kv of the file through a new writer reproduces it exactly */
    ks_gguf_writer *w2;
    assert_int_equal(ks_gguf_writer_create(&w2), KS_OK);
    for (int64_t j = 0; j < ks_gguf_n_kv(g); j++) ks_gguf_writer_copy_kv(w2, ks_gguf_kv_at(g, j));
    const char *path2 = tmp_path("kv2.gguf");
    assert_int_equal(ks_gguf_writer_write(w2, path2), KS_OK);
    ks_gguf_writer_destroy(w2);
    size_t n1, n2;
    uint8_t *b1 = read_all(path, &n1), *b2 = read_all(path2, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(b1, b2, n1);
    assert_int_equal(n1, ks_gguf_file_size(g)); /* no tensors: no padding after the header */
    free(b1);
    free(b2);
    ks_gguf_close(g);
    unlink(path);
    unlink(path2);
}

/* --------------------------------------------------- tensor round trip -- */
typedef struct { uint64_t seed; size_t calls; } fill_state;
static ks_status fill_bytes(void *user, void *dst, size_t n) {
    fill_state *fs = user;
    ks_rng r = {fs->seed};
    uint8_t *d = dst;
    for (size_t i = 0; i < n; i++) d[i] = (uint8_t)ks_rng_next(&r);
    fs->calls++;
    return KS_OK;
}

static void test_tensor_roundtrip(void **state) {
    (void)state;
    static const struct { ks_dtype t; uint32_t nd; int64_t ne[4]; } specs[] = {
        {KS_DTYPE_F32, 1, {7, 1, 1, 1}},      {KS_DTYPE_F16, 2, {3, 5, 1, 1}},
        {KS_DTYPE_BF16, 3, {2, 3, 4, 1}},     {KS_DTYPE_Q8_0, 2, {64, 3, 1, 1}},
        {KS_DTYPE_Q4_0, 4, {32, 2, 2, 2}},    {KS_DTYPE_Q4_K, 2, {256, 3, 1, 1}},
        {KS_DTYPE_Q6_K, 2, {512, 2, 1, 1}},   {KS_DTYPE_F32, 2, {1, 1, 1, 1}},
    };
    const size_t n_specs = sizeof specs / sizeof specs[0];
    const uint32_t aligns[] = {32, 1, 8, 256, 4096};
    for (size_t ai = 0; ai < sizeof aligns / sizeof aligns[0]; ai++) {
        uint32_t al = aligns[ai];
        ks_gguf_writer *w;
        assert_int_equal(ks_gguf_writer_create(&w), KS_OK);
        if (al != 32) ks_gguf_writer_set_u32(w, "general.alignment", al);
        ks_gguf_writer_set_str(w, "general.architecture", "test");
        fill_state fs[8];
        uint8_t *own[8] = {0};
        size_t sizes[8];
        for (size_t j = 0; j < n_specs; j++) {
            char name[32];
            snprintf(name, sizeof name, "t%zu.weight", j);
            int64_t rows = specs[j].ne[1] * specs[j].ne[2] * specs[j].ne[3];
            sizes[j] = ks_dtype_row_bytes(specs[j].t, specs[j].ne[0]) * (size_t)rows;
            fs[j] = (fill_state){1000 + j + 17 * ai, 0};
            if (j % 2) { /* borrowed data */
                own[j] = malloc(sizes[j]);
                fill_bytes(&fs[j], own[j], sizes[j]);
                fs[j].calls = 0;
                assert_int_equal(ks_gguf_writer_add_tensor(w, name, specs[j].t, specs[j].nd, specs[j].ne, own[j], NULL, NULL), KS_OK);
            } else {
                assert_int_equal(ks_gguf_writer_add_tensor(w, name, specs[j].t, specs[j].nd, specs[j].ne, NULL, fill_bytes, &fs[j]), KS_OK);
            }
        }
        const char *path = tmp_path("tensors.gguf");
        assert_int_equal(ks_gguf_writer_write(w, path), KS_OK);
        ks_gguf_writer_destroy(w);

        size_t fsize;
        uint8_t *file = read_all(path, &fsize);
        ks_gguf *g;
        assert_int_equal(ks_gguf_open(path, &g), KS_OK);
        assert_int_equal(ks_gguf_alignment(g), al);
        assert_int_equal(ks_gguf_n_tensors(g), (int64_t)n_specs);
        const uint8_t *data0 = NULL;
        uint64_t expect_off = 0;
        for (size_t j = 0; j < n_specs; j++) {
            const ks_gguf_tensor *t = ks_gguf_tensor_at(g, (int64_t)j);
            assert_int_equal(t->type, specs[j].t);
            assert_int_equal(t->n_dims, specs[j].nd);
            for (int d = 0; d < 4; d++) assert_int_equal(t->ne[d], specs[j].ne[d]);
            assert_int_equal(t->nbytes, sizes[j]);
            assert_int_equal(t->offset, expect_off); /* packed in order, each aligned */
            assert_int_equal(t->offset % al, 0);
            expect_off += (sizes[j] + al - 1) / al * al;
            if (j == 0) data0 = (const uint8_t *)t->data;
            assert_ptr_equal((const uint8_t *)t->data, data0 + t->offset);
            /* payload bytes */
            uint8_t *want = malloc(sizes[j]);
            fill_state f2 = {1000 + j + 17 * ai, 0};
            fill_bytes(&f2, want, sizes[j]);
            assert_memory_equal(t->data, want, sizes[j]);
            free(want);
            if (j % 2 == 0) assert_int_equal(fs[j].calls, 1); /* exactly one fill per tensor */
            /* padding after the tensor is zero */
            size_t pos = (size_t)((const uint8_t *)t->data - data0) + sizes[j];
            for (size_t p = pos; p % al; p++) assert_int_equal(data0[p], 0);
        }
        /* the file ends with the padded last tensor; the data section starts aligned */
        assert_int_equal(fsize, ks_gguf_file_size(g));
        assert_true(fsize > expect_off);
        assert_int_equal((fsize - expect_off) % al, 0);
        assert_memory_equal(file + (fsize - expect_off), data0, (size_t)expect_off);
        ks_gguf_close(g);
        free(file);
        for (size_t j = 0; j < n_specs; j++) free(own[j]);
        unlink(path);
    }
}

/* ------------------------------------------------------- writer errors -- */
static ks_status fill_fail(void *user, void *dst, size_t n) {
    (void)user; (void)dst; (void)n;
    return KS_FAIL(KS_ERR_NOMEM, "fill failed on purpose");
}

static void test_writer_errors(void **state) {
    (void)state;
    ks_gguf_writer *w;
    assert_int_equal(ks_gguf_writer_create(&w), KS_OK);
    float x[64] = {0};
    int64_t ne[4] = {33, 1, 1, 1};
    assert_int_equal(ks_gguf_writer_add_tensor(w, "a", KS_DTYPE_Q8_0, 1, ne, x, NULL, NULL), KS_ERR_INVALID_ARG);
    ne[0] = 4;
    assert_int_equal(ks_gguf_writer_add_tensor(w, "a", KS_DTYPE_F32, 0, ne, x, NULL, NULL), KS_ERR_INVALID_ARG);
    assert_int_equal(ks_gguf_writer_add_tensor(w, "a", KS_DTYPE_F32, 5, ne, x, NULL, NULL), KS_ERR_INVALID_ARG);
    assert_int_equal(ks_gguf_writer_add_tensor(w, "a", (ks_dtype)3, 1, ne, x, NULL, NULL), KS_ERR_INVALID_ARG);
    assert_int_equal(ks_gguf_writer_add_tensor(w, "a", KS_DTYPE_F32, 1, ne, NULL, NULL, NULL), KS_ERR_INVALID_ARG);
    assert_int_equal(ks_gguf_writer_add_tensor(w, "", KS_DTYPE_F32, 1, ne, x, NULL, NULL), KS_ERR_INVALID_ARG);
    char longname[80];
    memset(longname, 'n', 64);
    longname[64] = 0;
    assert_int_equal(ks_gguf_writer_add_tensor(w, longname, KS_DTYPE_F32, 1, ne, x, NULL, NULL), KS_ERR_INVALID_ARG);
    longname[63] = 0; /* 63 bytes is the longest llama.cpp accepts */
    assert_int_equal(ks_gguf_writer_add_tensor(w, longname, KS_DTYPE_F32, 1, ne, x, NULL, NULL), KS_OK);
    int64_t bad[2] = {4, 0};
    assert_int_equal(ks_gguf_writer_add_tensor(w, "z", KS_DTYPE_F32, 2, bad, x, NULL, NULL), KS_ERR_INVALID_ARG);
    bad[1] = -1;
    assert_int_equal(ks_gguf_writer_add_tensor(w, "z", KS_DTYPE_F32, 2, bad, x, NULL, NULL), KS_ERR_INVALID_ARG);
    int64_t huge[3] = {1ll << 40, 1ll << 40, 1ll << 40};
    assert_int_equal(ks_gguf_writer_add_tensor(w, "z", KS_DTYPE_F32, 3, huge, x, NULL, NULL), KS_ERR_INVALID_ARG);
    assert_int_equal(ks_gguf_writer_add_tensor(w, "ok", KS_DTYPE_F32, 1, ne, x, NULL, NULL), KS_OK);
    assert_int_equal(ks_gguf_writer_add_tensor(w, "ok", KS_DTYPE_F32, 1, ne, x, NULL, NULL), KS_ERR_INVALID_ARG);

    /* unwritable destinations */
    assert_int_equal(ks_gguf_writer_write(w, "/nonexistent-dir-kvsieve/x.gguf"), KS_ERR_IO);
    assert_non_null(strstr(ks_last_error(), "nonexistent"));
    if (access("/dev/full", W_OK) == 0) {
        assert_int_equal(ks_gguf_writer_write(w, "/dev/full"), KS_ERR_IO);
        assert_int_equal(access("/dev/full", F_OK), 0); /* never unlink a device */
    }
    /* bad alignment values */
    ks_gguf_writer_set_u32(w, "general.alignment", 3);
    assert_int_equal(ks_gguf_writer_write(w, tmp_path("bad.gguf")), KS_ERR_INVALID_ARG);
    ks_gguf_writer_set_u32(w, "general.alignment", 0);
    assert_int_equal(ks_gguf_writer_write(w, tmp_path("bad.gguf")), KS_ERR_INVALID_ARG);
    ks_gguf_writer_set_str(w, "general.alignment", "32");
    assert_int_equal(ks_gguf_writer_write(w, tmp_path("bad.gguf")), KS_ERR_INVALID_ARG);
    ks_gguf_writer_set_u32(w, "general.alignment", 64);

    /* a failing fill propagates its status and removes the partial file */
    assert_int_equal(ks_gguf_writer_add_tensor(w, "fails", KS_DTYPE_F32, 1, ne, NULL, fill_fail, NULL), KS_OK);
    const char *path = tmp_path("partial.gguf");
    assert_int_equal(ks_gguf_writer_write(w, path), KS_ERR_NOMEM);
    assert_non_null(strstr(ks_last_error(), "on purpose"));
    assert_int_not_equal(access(path, F_OK), 0);
    ks_gguf_writer_destroy(w);
    ks_gguf_writer_destroy(NULL);
}

/* ------------------------------------------------------------ fixtures -- */
/* Copy every kv and tensor of a file through the writer: must be identical. */
static void copy_through_writer(const char *src) {
    ks_gguf *g;
    assert_int_equal(ks_gguf_open(src, &g), KS_OK);
    ks_gguf_writer *w;
    assert_int_equal(ks_gguf_writer_create(&w), KS_OK);
    for (int64_t i = 0; i < ks_gguf_n_kv(g); i++) ks_gguf_writer_copy_kv(w, ks_gguf_kv_at(g, i));
    for (int64_t i = 0; i < ks_gguf_n_tensors(g); i++) {
        const ks_gguf_tensor *t = ks_gguf_tensor_at(g, i);
        char name[128];
        assert_true(t->name.len < sizeof name);
        memcpy(name, t->name.data, t->name.len);
        name[t->name.len] = 0;
        assert_int_equal(ks_gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data, NULL, NULL), KS_OK);
    }
    const char *dst = tmp_path("copy.gguf");
    assert_int_equal(ks_gguf_writer_write(w, dst), KS_OK);
    ks_gguf_writer_destroy(w);
    size_t na, nb;
    uint8_t *a = read_all(src, &na), *b = read_all(dst, &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na);
    free(a);
    free(b);
    ks_gguf_close(g);
    unlink(dst);
}

static void test_fixture_model(void **state) {
    (void)state;
    const char *path = ks_test_fixture("models/aidreams260K.gguf");
    ks_gguf *g;
    assert_int_equal(ks_gguf_open(path, &g), KS_OK);
    assert_int_equal(ks_gguf_version(g), 3);
    assert_int_equal(ks_gguf_alignment(g), 32);
    assert_int_equal(ks_gguf_n_kv(g), 19);
    assert_int_equal(ks_gguf_n_tensors(g), 39);
    ks_gguf_str s;
    assert_int_equal(ks_gguf_get_str(g, "general.architecture", &s), KS_OK);
    assert_true(ks_gguf_str_eq(s, "llama"));
    uint32_t u;
    assert_int_equal(ks_gguf_get_u32(g, "llama.embedding_length", &u), KS_OK); assert_int_equal(u, 64);
    assert_int_equal(ks_gguf_get_u32(g, "llama.block_count", &u), KS_OK); assert_int_equal(u, 4);
    assert_int_equal(ks_gguf_get_u32(g, "llama.context_length", &u), KS_OK); assert_int_equal(u, 128);
    assert_int_equal(ks_gguf_get_u32(g, "llama.feed_forward_length", &u), KS_OK); assert_int_equal(u, 172);
    float eps;
    assert_int_equal(ks_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &eps), KS_OK);
    assert_true(fabsf(eps - 1e-5f) < 1e-9f);
    const ks_gguf_kv *tok;
    assert_int_equal(ks_gguf_get_arr(g, "tokenizer.ggml.tokens", &tok), KS_OK);
    assert_int_equal(tok->arr_type, KS_GGUF_STRING);
    assert_int_equal(tok->arr_n, 512);
    assert_true(ks_gguf_str_eq(tok->arr_strs[1], "<s>"));
    const ks_gguf_tensor *t = ks_gguf_find_tensor(g, "token_embd.weight");
    assert_non_null(t);
    assert_int_equal(t->type, KS_DTYPE_F32);
    assert_int_equal(t->ne[0], 64);
    assert_int_equal(t->ne[1], 512);
    assert_int_equal(t->nbytes, 64 * 512 * 4);
    t = ks_gguf_find_tensor(g, "blk.3.ffn_down.weight");
    assert_non_null(t);
    assert_int_equal(t->ne[0], 172);
    assert_int_equal(t->ne[1], 64);
    /* weights are finite and not all zero */
    const float *wd = t->data;
    double ss = 0;
    for (int64_t i = 0; i < 172 * 64; i++) { assert_true(isfinite(wd[i])); ss += wd[i] * wd[i]; }
    assert_true(ss > 0);
    assert_null(ks_gguf_find_tensor(g, "nope"));
    (void)walk(g);
    ks_gguf_close(g);
    copy_through_writer(path);
}

static void test_fixture_vocabs(void **state) {
    (void)state;
    static const struct { const char *file; uint64_t n_tokens; const char *model; } v[] = {
        {"tokenizer/ggml-vocab-llama-spm.gguf", 32000, "llama"},
        {"tokenizer/ggml-vocab-gpt-2.gguf", 50257, "gpt2"},
        {"tokenizer/ggml-vocab-deepseek-coder.gguf", 0, "gpt2"},
        {"tokenizer/ggml-vocab-falcon.gguf", 0, "gpt2"},
        {"tokenizer/ggml-vocab-phi-3.gguf", 0, "llama"},
        {"tokenizer/ggml-vocab-starcoder.gguf", 0, "gpt2"},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        const char *path = ks_test_fixture(v[i].file);
        ks_gguf *g;
        assert_int_equal(ks_gguf_open(path, &g), KS_OK);
        assert_int_equal(ks_gguf_n_tensors(g), 0);
        ks_gguf_str s;
        assert_int_equal(ks_gguf_get_str(g, "tokenizer.ggml.model", &s), KS_OK);
        assert_true(ks_gguf_str_eq(s, v[i].model));
        const ks_gguf_kv *tok;
        assert_int_equal(ks_gguf_get_arr(g, "tokenizer.ggml.tokens", &tok), KS_OK);
        assert_int_equal(tok->arr_type, KS_GGUF_STRING);
        assert_true(tok->arr_n > 1000);
        if (v[i].n_tokens) assert_int_equal(tok->arr_n, v[i].n_tokens);
        if (!strcmp(v[i].model, "gpt2")) {
            const ks_gguf_kv *m;
            assert_int_equal(ks_gguf_get_arr(g, "tokenizer.ggml.merges", &m), KS_OK);
            assert_true(m->arr_n > 1000);
        }
        (void)walk(g);
        ks_gguf_close(g);
        copy_through_writer(path);
    }
}

/* ------------------------------------------------------- hostile input -- */
/* A small valid model: kvs incl. a string array, three tensors. */
static uint8_t *make_small(size_t *n, size_t *header_end, size_t *data_end) {
    ks_gguf_writer *w;
    assert_int_equal(ks_gguf_writer_create(&w), KS_OK);
    ks_gguf_writer_set_str(w, "general.architecture", "llama");
    ks_gguf_writer_set_u32(w, "llama.block_count", 1);
    ks_gguf_writer_set_f32(w, "llama.rope.freq_base", 10000.f);
    ks_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true);
    const int32_t ids[3] = {1, 2, 3};
    ks_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", KS_GGUF_INT32, ids, 3);
    ks_gguf_str strs[3] = {{3, "<s>"}, {4, "</s>"}, {1, "a"}};
    ks_gguf_kv k;
    memset(&k, 0, sizeof k);
    k.key = (ks_gguf_str){21, "tokenizer.ggml.tokens"};
    k.type = KS_GGUF_ARRAY;
    k.arr_type = KS_GGUF_STRING;
    k.arr_n = 3;
    k.arr_strs = strs;
    ks_gguf_writer_copy_kv(w, &k);
    static uint8_t payload[4096];
    for (size_t i = 0; i < sizeof payload; i++) payload[i] = (uint8_t)(i * 7);
    int64_t ne1[1] = {32}, ne2[2] = {32, 4}, ne3[2] = {64, 2};
    assert_int_equal(ks_gguf_writer_add_tensor(w, "a.weight", KS_DTYPE_F32, 1, ne1, payload, NULL, NULL), KS_OK);
    assert_int_equal(ks_gguf_writer_add_tensor(w, "b.weight", KS_DTYPE_Q8_0, 2, ne2, payload, NULL, NULL), KS_OK);
    assert_int_equal(ks_gguf_writer_add_tensor(w, "c.weight", KS_DTYPE_F16, 2, ne3, payload, NULL, NULL), KS_OK);
    const char *path = tmp_path("small.gguf");
    assert_int_equal(ks_gguf_writer_write(w, path), KS_OK);
    ks_gguf_writer_destroy(w);
    uint8_t *b = read_all(path, n);
    unlink(path);
    ks_gguf *g;
    assert_int_equal(ks_gguf_open_buffer(b, *n, &g), KS_OK);
    const ks_gguf_tensor *a = ks_gguf_tensor_at(g, 0), *c = ks_gguf_tensor_at(g, 2);
    *header_end = (size_t)((const uint8_t *)a->data - b);   /* data section start */
    *data_end = (size_t)((const uint8_t *)c->data - b) + c->nbytes;
    ks_gguf_close(g);
    return b;
}

static void check_truncations(const uint8_t *b, size_t header_end, size_t data_end, size_t stride) {
    for (size_t cut = 0; cut < data_end; cut += (cut < header_end + 64 ? 1 : stride)) {
        ks_status st = parse_copy(b, cut);
        if (st == KS_OK) fail_msg("truncation at %zu of %zu parsed OK", cut, data_end);
    }
}

static void test_truncated(void **state) {
    (void)state;
    size_t n, he, de;
    uint8_t *b = make_small(&n, &he, &de);
    assert_int_equal(parse_copy(b, n), KS_OK);
    check_truncations(b, he, de, 1);
    free(b);
    /* the real model: every byte of its header, then strided through the data */
    b = read_all(ks_test_fixture("models/aidreams260K.gguf"), &n);
    assert_int_equal(parse_copy(b, n), KS_OK);
    check_truncations(b, 13648, n, 997);
    free(b);
    /* a vocabulary file (no tensors): every cut strided over 1.7 MB of kvs */
    b = read_all(ks_test_fixture("tokenizer/ggml-vocab-gpt-2.gguf"), &n);
    for (size_t cut = 0; cut < n; cut += (cut < 4096 ? 1 : 16411))
        if (parse_copy(b, cut) == KS_OK) fail_msg("vocab truncated at %zu parsed OK", cut);
    free(b);
}

static void test_bitflips(void **state) {
    (void)state;
    size_t n, he, de;
    uint8_t *b = make_small(&n, &he, &de);
    uint8_t *m = malloc(n);
    int ok = 0, bad = 0;
    /* every bit of the header region */
    for (size_t i = 0; i < he; i++) {
        for (int bit = 0; bit < 8; bit++) {
            memcpy(m, b, n);
            m[i] ^= (uint8_t)(1u << bit);
            if (parse_copy(m, n) == KS_OK) ok++; else bad++;
        }
    }
    /* random multi-byte garbage over the whole file */
    ks_rng r = {12345};
    for (int it = 0; it < 3000; it++) {
        memcpy(m, b, n);
        int flips = 1 + (int)(ks_rng_next(&r) % 8);
        for (int f = 0; f < flips; f++) {
            size_t pos = (size_t)(ks_rng_next(&r) % (it % 2 ? n : he));
            m[pos] = (it % 3 == 0) ? (uint8_t)ks_rng_next(&r) : (uint8_t)(m[pos] ^ (1u << (ks_rng_next(&r) % 8)));
        }
        if (parse_copy(m, n) == KS_OK) ok++; else bad++;
    }
    assert_true(bad > 0);
    print_message("bit flips: %d rejected, %d still valid\n", bad, ok);
    free(m);
    free(b);
    /* the real model's header */
    b = read_all(ks_test_fixture("models/aidreams260K.gguf"), &n);
    m = malloc(n);
    for (size_t i = 0; i < 13648; i += 3) {
        memcpy(m, b, n);
        m[i] ^= (uint8_t)(1u << (i % 8));
        (void)parse_copy(m, n);
    }
    free(m);
    free(b);
}

/* One-tensor file with every header field chosen by the caller. */
typedef struct {
    uint32_t magic, version;
    uint64_t n_tensors, n_kv;
    uint32_t n_dims;
    uint64_t ne[4];
    uint32_t type;
    uint64_t offset;
    size_t data_bytes;
} craft;

static craft craft_default(void) {
    craft c = {KS_GGUF_MAGIC, 3, 1, 1, 2, {32, 2, 1, 1}, KS_DTYPE_F32, 0, 256};
    return c;
}

static tb craft_build(const craft *c) {
    tb b = {0};
    tb_u32(&b, c->magic);
    tb_u32(&b, c->version);
    tb_u64(&b, c->n_tensors);
    tb_u64(&b, c->n_kv);
    tb_str(&b, "general.architecture");
    tb_u32(&b, KS_GGUF_STRING);
    tb_str(&b, "llama");
    tb_str(&b, "t.weight");
    tb_u32(&b, c->n_dims);
    for (uint32_t d = 0; d < c->n_dims && d < 4; d++) tb_u64(&b, c->ne[d]);
    for (uint32_t d = 4; d < c->n_dims && d < 200; d++) tb_u64(&b, 1);
    tb_u32(&b, c->type);
    tb_u64(&b, c->offset);
    tb_pad(&b, 32);
    tb_zeros(&b, c->data_bytes);
    return b;
}

static void expect_craft(const craft *c, bool ok, const char *what) {
    tb b = craft_build(c);
    ks_status st = parse_copy(b.p, b.n);
    if ((st == KS_OK) != ok) fail_msg("%s: expected %s, got %s (%s)", what, ok ? "OK" : "failure", ks_status_str(st), ks_last_error());
    free(b.p);
}

/* A file with a single kv whose value bytes the caller writes. */
static void expect_kv_fails(const char *what, void (*value)(tb *)) {
    tb b = {0};
    tb_u32(&b, KS_GGUF_MAGIC);
    tb_u32(&b, 3);
    tb_u64(&b, 0);
    tb_u64(&b, 1);
    value(&b);
    tb_zeros(&b, 64);
    ks_status st = parse_copy(b.p, b.n);
    if (st == KS_OK) fail_msg("%s: parsed OK", what);
    free(b.p);
}
static void kv_keylen_huge(tb *b) { tb_u64(b, 1ull << 63); tb_raw(b, "k", 1); tb_u32(b, KS_GGUF_UINT32); tb_u32(b, 1); }
static void kv_keylen_max(tb *b) { tb_u64(b, UINT64_MAX); tb_raw(b, "k", 1); }
static void kv_empty_key(tb *b) { tb_u64(b, 0); tb_u32(b, KS_GGUF_UINT32); tb_u32(b, 1); }
static void kv_type_13(tb *b) { tb_str(b, "k"); tb_u32(b, 13); tb_u32(b, 1); }
static void kv_type_99(tb *b) { tb_str(b, "k"); tb_u32(b, 99); tb_u32(b, 1); }
static void kv_type_max(tb *b) { tb_str(b, "k"); tb_u32(b, 0xFFFFFFFFu); tb_u32(b, 1); }
static void kv_strlen_huge(tb *b) { tb_str(b, "k"); tb_u32(b, KS_GGUF_STRING); tb_u64(b, 1ull << 63); tb_raw(b, "abc", 3); }
static void kv_arr_huge(tb *b) { tb_str(b, "k"); tb_u32(b, KS_GGUF_ARRAY); tb_u32(b, KS_GGUF_UINT32); tb_u64(b, 1ull << 62); tb_u32(b, 7); }
static void kv_arr_max(tb *b) { tb_str(b, "k"); tb_u32(b, KS_GGUF_ARRAY); tb_u32(b, KS_GGUF_UINT64); tb_u64(b, UINT64_MAX); }
static void kv_arr_strs_huge(tb *b) { tb_str(b, "k"); tb_u32(b, KS_GGUF_ARRAY); tb_u32(b, KS_GGUF_STRING); tb_u64(b, 1ull << 40); tb_str(b, "x"); }
static void kv_arr_strs_61(tb *b) { tb_str(b, "k"); tb_u32(b, KS_GGUF_ARRAY); tb_u32(b, KS_GGUF_STRING); tb_u64(b, 1ull << 61); }
static void kv_arr_str_len(tb *b) { tb_str(b, "k"); tb_u32(b, KS_GGUF_ARRAY); tb_u32(b, KS_GGUF_STRING); tb_u64(b, 2); tb_str(b, "x"); tb_u64(b, 1ull << 62); }
static void kv_arr_type_bad(tb *b) { tb_str(b, "k"); tb_u32(b, KS_GGUF_ARRAY); tb_u32(b, 13); tb_u64(b, 1); tb_u32(b, 0); }
static void kv_arr_nested(tb *b) { tb_str(b, "k"); tb_u32(b, KS_GGUF_ARRAY); tb_u32(b, KS_GGUF_ARRAY); tb_u64(b, 1); tb_u32(b, KS_GGUF_UINT8); tb_u64(b, 1); }
static void kv_bool_2(tb *b) { tb_str(b, "k"); tb_u32(b, KS_GGUF_BOOL); uint8_t v = 2; tb_raw(b, &v, 1); }
static void kv_align_0(tb *b) { tb_str(b, "general.alignment"); tb_u32(b, KS_GGUF_UINT32); tb_u32(b, 0); }
static void kv_align_3(tb *b) { tb_str(b, "general.alignment"); tb_u32(b, KS_GGUF_UINT32); tb_u32(b, 3); }
static void kv_align_str(tb *b) { tb_str(b, "general.alignment"); tb_u32(b, KS_GGUF_STRING); tb_str(b, "32"); }

static void test_absurd(void **state) {
    (void)state;
    craft c = craft_default();
    expect_craft(&c, true, "baseline");
    c.version = 2; expect_craft(&c, true, "version 2 (same layout as 3, accepted like llama.cpp)");
    c = craft_default(); c.magic = 0x46554748; expect_craft(&c, false, "bad magic");
    c = craft_default(); c.magic = 0x47475546; expect_craft(&c, false, "byte-swapped magic");
    const uint32_t versions[] = {0, 1, 4, 0x03000000, 0xFFFFFFFF};
    for (size_t i = 0; i < 5; i++) { c = craft_default(); c.version = versions[i]; expect_craft(&c, false, "version"); }
    c = craft_default(); c.n_tensors = 1ull << 62; expect_craft(&c, false, "n_tensors 2^62");
    c = craft_default(); c.n_tensors = UINT64_MAX; expect_craft(&c, false, "n_tensors max");
    c = craft_default(); c.n_tensors = 2; expect_craft(&c, false, "n_tensors one too many");
    c = craft_default(); c.n_kv = 1ull << 62; expect_craft(&c, false, "n_kv 2^62");
    c = craft_default(); c.n_kv = UINT64_MAX; expect_craft(&c, false, "n_kv max");
    c = craft_default(); c.n_kv = 2; expect_craft(&c, false, "n_kv one too many");
    c = craft_default(); c.n_dims = 0; expect_craft(&c, false, "n_dims 0");
    c = craft_default(); c.n_dims = 5; expect_craft(&c, false, "n_dims 5");
    c = craft_default(); c.n_dims = 99; expect_craft(&c, false, "n_dims 99");
    c = craft_default(); c.n_dims = 0xFFFFFFFF; expect_craft(&c, false, "n_dims max");
    c = craft_default(); c.ne[0] = 1ull << 62; c.ne[1] = 1ull << 62; expect_craft(&c, false, "ne overflow");
    c = craft_default(); c.n_dims = 4; c.ne[0] = 1ull << 32; c.ne[1] = 1ull << 32; c.ne[2] = 1ull << 32; c.ne[3] = 1ull << 32; expect_craft(&c, false, "ne product overflow");
    c = craft_default(); c.ne[1] = 0; expect_craft(&c, false, "ne 0");
    c = craft_default(); c.ne[1] = 1ull << 63; expect_craft(&c, false, "ne negative");
    c = craft_default(); c.ne[0] = 1024; c.ne[1] = 1024; expect_craft(&c, false, "data past EOF");
    c = craft_default(); c.type = KS_DTYPE_Q8_0; c.ne[0] = 33; expect_craft(&c, false, "q8_0 row not whole blocks");
    c = craft_default(); c.type = 16; expect_craft(&c, false, "iq2_xxs unsupported");
    c = craft_default(); c.type = KS_DTYPE_Q8_K; expect_craft(&c, false, "q8_K is not a weight type");
    c = craft_default(); c.type = 200; expect_craft(&c, false, "tensor type 200");
    c = craft_default(); c.type = 0xFFFFFFFF; expect_craft(&c, false, "tensor type max");
    c = craft_default(); c.offset = 1ull << 40; expect_craft(&c, false, "offset past EOF");
    c = craft_default(); c.offset = UINT64_MAX - 31; expect_craft(&c, false, "offset near 2^64");
    c = craft_default(); c.offset = 4; expect_craft(&c, false, "misaligned offset");
    c = craft_default(); c.offset = 32; expect_craft(&c, false, "offset + size past EOF");
    c = craft_default(); c.data_bytes = 0; expect_craft(&c, false, "no data section");

    expect_kv_fails("key length 2^63", kv_keylen_huge);
    expect_kv_fails("key length max", kv_keylen_max);
    expect_kv_fails("empty key", kv_empty_key);
    expect_kv_fails("kv type 13", kv_type_13);
    expect_kv_fails("kv type 99", kv_type_99);
    expect_kv_fails("kv type max", kv_type_max);
    expect_kv_fails("string length 2^63", kv_strlen_huge);
    expect_kv_fails("array of 2^62 u32", kv_arr_huge);
    expect_kv_fails("array of 2^64-1 u64", kv_arr_max);
    expect_kv_fails("array of 2^40 strings", kv_arr_strs_huge);
    expect_kv_fails("array of 2^61 strings", kv_arr_strs_61);
    expect_kv_fails("string in array of length 2^62", kv_arr_str_len);
    expect_kv_fails("array element type 13", kv_arr_type_bad);
    expect_kv_fails("nested array", kv_arr_nested);
    expect_kv_fails("bool 2", kv_bool_2);
    expect_kv_fails("alignment 0", kv_align_0);
    expect_kv_fails("alignment 3", kv_align_3);
    expect_kv_fails("alignment as string", kv_align_str);

    /* duplicate key / tensor name */
    tb b = {0};
    tb_u32(&b, KS_GGUF_MAGIC); tb_u32(&b, 3); tb_u64(&b, 0); tb_u64(&b, 2);
    tb_str(&b, "k"); tb_u32(&b, KS_GGUF_UINT32); tb_u32(&b, 1);
    tb_str(&b, "k"); tb_u32(&b, KS_GGUF_UINT32); tb_u32(&b, 2);
    if (parse_copy(b.p, b.n) == KS_OK) fail_msg("duplicate key parsed OK");
    free(b.p);
    b = (tb){0};
    tb_u32(&b, KS_GGUF_MAGIC); tb_u32(&b, 3); tb_u64(&b, 2); tb_u64(&b, 0);
    for (int i = 0; i < 2; i++) { tb_str(&b, "t"); tb_u32(&b, 1); tb_u64(&b, 8); tb_u32(&b, 0); tb_u64(&b, (uint64_t)i * 32); }
    tb_pad(&b, 32);
    tb_zeros(&b, 64);
    if (parse_copy(b.p, b.n) == KS_OK) fail_msg("duplicate tensor parsed OK");
    free(b.p);

    /* nothing, garbage, a tiny prefix */
    assert_int_not_equal(parse_copy((const uint8_t *)"", 0), KS_OK);
    assert_int_not_equal(parse_copy((const uint8_t *)"GGUF", 4), KS_OK);
    uint8_t junk[4096];
    ks_rng r = {7};
    for (size_t i = 0; i < sizeof junk; i++) junk[i] = (uint8_t)ks_rng_next(&r);
    assert_int_not_equal(parse_copy(junk, sizeof junk), KS_OK);
    memcpy(junk, "GGUF\x03\0\0\0", 8);
    for (int it = 0; it < 200; it++) {
        for (size_t i = 8; i < sizeof junk; i++) junk[i] = (uint8_t)ks_rng_next(&r);
        (void)parse_copy(junk, sizeof junk);
    }
    /* files on disk that are not GGUF */
    ks_gguf *g = NULL;
    assert_int_equal(ks_gguf_open("/nonexistent-kvsieve.gguf", &g), KS_ERR_IO);
    assert_int_not_equal(ks_gguf_open("/", &g), KS_OK);
    const char *empty = tmp_path("empty.gguf");
    FILE *f = fopen(empty, "wb");
    assert_non_null(f);
    fclose(f);
    assert_int_not_equal(ks_gguf_open(empty, &g), KS_OK);
    unlink(empty);
}

/* ----------------------------------------------------------- generator -- */
static double tensor_std(const ks_gguf_tensor *t, double *mean) {
    int64_t n = t->ne[0], rows = t->nbytes / ks_dtype_row_bytes(t->type, n);
    float *x = malloc((size_t)n * sizeof(float));
    double s = 0, ss = 0;
    size_t rb = ks_dtype_row_bytes(t->type, n);
    for (int64_t r = 0; r < rows; r++) {
        ks_dequantize_row(t->type, (const uint8_t *)t->data + (size_t)r * rb, x, n);
        for (int64_t i = 0; i < n; i++) { s += x[i]; ss += (double)x[i] * x[i]; }
    }
    free(x);
    double cnt = (double)n * (double)rows;
    *mean = s / cnt;
    return sqrt(ss / cnt - *mean * *mean);
}

static void gen_file(const char *shape, ks_dtype type, uint64_t seed, int threads, int layers, const char *path) {
    ks_gguf *vocab;
    assert_int_equal(ks_gguf_open(ks_test_fixture("models/aidreams260K.gguf"), &vocab), KS_OK);
    ks_shape_gen_params p = {0};
    p.type = type;
    p.vocab = vocab;
    p.seed = seed;
    p.n_threads = threads;
    p.n_layer = layers;
    uint64_t bytes = 0;
    const ks_model_shape *s = ks_shape_find(shape);
    assert_non_null(s);
    ks_status st = ks_shape_generate(s, &p, path, &bytes);
    if (st != KS_OK) fail_msg("generate %s: %s", shape, ks_last_error());
    assert_true(bytes > 0);
    ks_gguf_close(vocab);
}

static void test_shapes_table(void **state) {
    (void)state;
    assert_true(ks_shape_count() >= 15);
    for (int i = 0; i < ks_shape_count(); i++) {
        const ks_model_shape *s = ks_shape_at(i);
        assert_ptr_equal(ks_shape_find(s->name), s);
        assert_true(s->n_head % s->n_head_kv == 0);
        /* every matrix row is whole K-quant super-blocks, but for real shapes
         * that are not (gemma-3-1b's 1152: whole Q8_0 / Q4_0 blocks, and the
         * generator writes f16 rows for K-quants, as llama.cpp falls back) */
        int sb = s->n_embd % 256 ? 32 : 256;
        /* deepseek-v2-lite's dense FFN of 10944: whole Q8_0 blocks only */
        int sbf = s->n_ff % 256 ? 32 : 256;
        if (!strncmp(s->name, "tiny-", 5)) assert_int_equal(sb, 256);
        if (!strncmp(s->name, "tiny-", 5)) assert_int_equal(sbf, 256);
        assert_int_equal(s->n_embd % sb, 0);
        assert_int_equal(s->n_ff % sbf, 0);
        assert_int_equal((s->n_head * s->head_dim) % sb, 0);
        assert_int_equal(s->head_dim % 2, 0);
    }
    const ks_model_shape *g = ks_shape_find("gemma-3-4b");
    assert_int_equal(g->swa_window, 1024);
    assert_true(g->rope_scaling && !strcmp(g->rope_scaling, "linear") && g->rope_factor == 8.0f && g->qk_norm && g->tied_output);
    assert_int_equal(ks_shape_find("gemma-3-1b")->swa_window, 512);
    assert_null(ks_shape_find("gpt-5"));
    const ks_model_shape *s = ks_shape_find("llama-3.1-8b");
    assert_int_equal(s->n_embd, 4096); assert_int_equal(s->n_layer, 32); assert_int_equal(s->n_head_kv, 8);
    assert_int_equal(s->n_ff, 14336);
    s = ks_shape_find("qwen3-0.6b");
    assert_int_equal(s->n_head * s->head_dim, 2048); assert_int_equal(s->n_embd, 1024);
    assert_true(s->qk_norm && s->tied_output);
    assert_true(ks_shape_find("qwen2.5-7b")->qkv_bias);
    assert_int_equal(ks_shape_find("tiny-mqa")->n_head_kv, 1);
    assert_int_equal(ks_shape_find("tiny-mha")->n_head_kv, ks_shape_find("tiny-mha")->n_head);

    /* Llama 3.1 rule, spot values for head_dim 128, theta 500000, factor 8:
     * high frequencies untouched, low ones divided by 8, a smooth band between */
    float rf[64];
    ks_shape_rope_factors(ks_shape_find("llama-3.1-8b"), rf);
    assert_true(rf[0] == 1.0f);
    assert_true(rf[63] == 8.0f);
    int n_mid = 0;
    for (int i = 0; i < 64; i++) {
        assert_true(rf[i] >= 1.0f && rf[i] <= 8.0f);
        if (i) assert_true(rf[i] >= rf[i - 1]);
        if (rf[i] > 1.0f && rf[i] < 8.0f) n_mid++;
    }
    assert_true(n_mid >= 3 && n_mid <= 12);
    assert_int_equal(ks_shape_file_type(KS_DTYPE_Q8_0), 7);
    assert_int_equal(ks_shape_file_type(KS_DTYPE_Q4_K), 14);
}

static void test_generate_tiny(void **state) {
    (void)state;
    static const char *shapes[] = {"tiny-llama", "tiny-llama3", "tiny-qwen2", "tiny-qwen3", "tiny-mistral", "tiny-mha", "tiny-mqa"};
    static const ks_dtype types[] = {KS_DTYPE_Q8_0, KS_DTYPE_Q4_0, KS_DTYPE_Q4_K, KS_DTYPE_Q6_K, KS_DTYPE_F16, KS_DTYPE_BF16, KS_DTYPE_F32};
    ks_gguf *vocab;
    assert_int_equal(ks_gguf_open(ks_test_fixture("models/aidreams260K.gguf"), &vocab), KS_OK);
    int64_t n_tok_keys = 0;
    for (int64_t i = 0; i < ks_gguf_n_kv(vocab); i++)
        if (ks_gguf_kv_at(vocab, i)->key.len > 10 && !memcmp(ks_gguf_kv_at(vocab, i)->key.data, "tokenizer.", 10)) n_tok_keys++;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
            const ks_model_shape *s = ks_shape_find(shapes[si]);
            const char *path = tmp_path("gen.gguf");
            gen_file(shapes[si], types[ti], 7, 2, 0, path);
            ks_gguf *g;
            assert_int_equal(ks_gguf_open(path, &g), KS_OK);
            ks_gguf_str str;
            char key[128];
            uint32_t u;
            assert_int_equal(ks_gguf_get_str(g, "general.architecture", &str), KS_OK);
            assert_true(ks_gguf_str_eq(str, s->arch));
            assert_int_equal(ks_gguf_get_u32(g, "general.file_type", &u), KS_OK);
            assert_int_equal(u, ks_shape_file_type(types[ti]));
#define KEYU(suffix, want)                                                      \
    snprintf(key, sizeof key, "%s." suffix, s->arch);                          \
    assert_int_equal(ks_gguf_get_u32(g, key, &u), KS_OK);                       \
    assert_int_equal(u, (uint32_t)(want))
            KEYU("embedding_length", s->n_embd);
            KEYU("block_count", s->n_layer);
            KEYU("feed_forward_length", s->n_ff);
            KEYU("attention.head_count", s->n_head);
            KEYU("attention.head_count_kv", s->n_head_kv);
            KEYU("attention.key_length", s->head_dim);
            KEYU("attention.value_length", s->head_dim);
            KEYU("rope.dimension_count", s->head_dim);
            KEYU("context_length", s->n_ctx);
            KEYU("vocab_size", 512);
#undef KEYU
            float f;
            snprintf(key, sizeof key, "%s.rope.freq_base", s->arch);
            assert_int_equal(ks_gguf_get_f32(g, key, &f), KS_OK);
            assert_true(f == s->rope_theta);
            int64_t n_tok = 0;
            for (int64_t i = 0; i < ks_gguf_n_kv(g); i++)
                if (ks_gguf_kv_at(g, i)->key.len > 10 && !memcmp(ks_gguf_kv_at(g, i)->key.data, "tokenizer.", 10)) n_tok++;
            assert_int_equal(n_tok, n_tok_keys);

            int64_t E = s->n_embd, QD = (int64_t)s->n_head * s->head_dim, KVD = (int64_t)s->n_head_kv * s->head_dim;
            int64_t expect_tensors = 2 + (s->tied_output ? 0 : 1) + (s->rope_llama3 ? 1 : 0) +
                                     s->n_layer * (9 + (s->qkv_bias ? 3 : 0) + (s->qk_norm ? 2 : 0));
            assert_int_equal(ks_gguf_n_tensors(g), expect_tensors);
            const ks_gguf_tensor *t = ks_gguf_find_tensor(g, "token_embd.weight");
            assert_non_null(t); assert_int_equal(t->ne[0], E); assert_int_equal(t->ne[1], 512); assert_int_equal(t->type, types[ti]);
            assert_true((ks_gguf_find_tensor(g, "output.weight") == NULL) == s->tied_output);
            t = ks_gguf_find_tensor(g, "blk.1.attn_q.weight");
            assert_non_null(t); assert_int_equal(t->ne[0], E); assert_int_equal(t->ne[1], QD); assert_int_equal(t->n_dims, 2);
            t = ks_gguf_find_tensor(g, "blk.1.attn_k.weight");
            assert_non_null(t); assert_int_equal(t->ne[1], KVD);
            t = ks_gguf_find_tensor(g, "blk.0.attn_output.weight");
            assert_non_null(t); assert_int_equal(t->ne[0], QD); assert_int_equal(t->ne[1], E);
            t = ks_gguf_find_tensor(g, "blk.0.ffn_down.weight");
            assert_non_null(t); assert_int_equal(t->ne[0], s->n_ff); assert_int_equal(t->ne[1], E);
            t = ks_gguf_find_tensor(g, "blk.0.attn_norm.weight");
            assert_non_null(t); assert_int_equal(t->type, KS_DTYPE_F32); assert_int_equal(t->n_dims, 1);
            double mean, sd = tensor_std(t, &mean);
            assert_true(fabs(mean - 1.0) < 0.01 && sd > 0.005 && sd < 0.05);
            if (s->qkv_bias) {
                t = ks_gguf_find_tensor(g, "blk.0.attn_k.bias");
                assert_non_null(t); assert_int_equal(t->ne[0], KVD); assert_int_equal(t->type, KS_DTYPE_F32);
            }
            if (s->qk_norm) {
                t = ks_gguf_find_tensor(g, "blk.1.attn_q_norm.weight");
                assert_non_null(t); assert_int_equal(t->ne[0], s->head_dim);
                assert_non_null(ks_gguf_find_tensor(g, "blk.1.attn_k_norm.weight"));
            }
            t = ks_gguf_find_tensor(g, "rope_freqs.weight");
            assert_true((t != NULL) == s->rope_llama3);
            if (t) {
                float want[128];
                ks_shape_rope_factors(s, want);
                assert_int_equal(t->ne[0], s->head_dim / 2);
                assert_memory_equal(t->data, want, (size_t)(s->head_dim / 2) * 4);
            }
            /* weight statistics: N(0, 1/sqrt(fan_in)) */
            t = ks_gguf_find_tensor(g, "blk.0.ffn_up.weight");
            sd = tensor_std(t, &mean);
            double want_sd = 1.0 / sqrt((double)E);
            if (fabs(sd / want_sd - 1.0) > 0.1 || fabs(mean) > 0.01 * want_sd * 10)
                fail_msg("%s %s: ffn_up std %g (want %g) mean %g", shapes[si], ks_dtype_name(types[ti]), sd, want_sd, mean);
            (void)walk(g);
            ks_gguf_close(g);
            unlink(path);
        }
    }
    ks_gguf_close(vocab);
}

static void test_generate_deterministic(void **state) {
    (void)state;
    const char *a = tmp_path("det_a.gguf"), *b = tmp_path("det_b.gguf"), *c = tmp_path("det_c.gguf");
    gen_file("tiny-qwen3", KS_DTYPE_Q4_K, 99, 1, 0, a);
    gen_file("tiny-qwen3", KS_DTYPE_Q4_K, 99, 3, 0, b);
    gen_file("tiny-qwen3", KS_DTYPE_Q4_K, 100, 2, 0, c);
    size_t na, nb, nc;
    uint8_t *ba = read_all(a, &na), *bb = read_all(b, &nb), *bc = read_all(c, &nc);
    assert_int_equal(na, nb);
    assert_memory_equal(ba, bb, na); /* thread count does not matter */
    assert_int_equal(na, nc);
    assert_true(memcmp(ba, bc, na) != 0); /* the seed does */
    free(ba); free(bb); free(bc);
    unlink(a); unlink(b); unlink(c);

    /* layer override: blk.0 of a 1-layer file equals blk.0 of the 2-layer one */
    gen_file("tiny-llama", KS_DTYPE_Q8_0, 5, 2, 1, a);
    gen_file("tiny-llama", KS_DTYPE_Q8_0, 5, 2, 0, b);
    ks_gguf *ga, *gb;
    assert_int_equal(ks_gguf_open(a, &ga), KS_OK);
    assert_int_equal(ks_gguf_open(b, &gb), KS_OK);
    uint32_t u;
    assert_int_equal(ks_gguf_get_u32(ga, "llama.block_count", &u), KS_OK); assert_int_equal(u, 1);
    assert_null(ks_gguf_find_tensor(ga, "blk.1.attn_q.weight"));
    const ks_gguf_tensor *ta = ks_gguf_find_tensor(ga, "blk.0.ffn_down.weight"), *tb2 = ks_gguf_find_tensor(gb, "blk.0.ffn_down.weight");
    assert_int_equal(ta->nbytes, tb2->nbytes);
    assert_memory_equal(ta->data, tb2->data, ta->nbytes);
    ks_gguf_close(ga);
    ks_gguf_close(gb);
    unlink(a); unlink(b);
}

static void test_generate_real_shape(void **state) {
    (void)state;
    /* one layer of llama-3.2-1b in q4_0: real dims, llama3 rope factor 32, tied */
    const char *p = tmp_path("l1b.gguf");
    gen_file("llama-3.2-1b", KS_DTYPE_Q4_0, 1, 2, 1, p);
    ks_gguf *g;
    assert_int_equal(ks_gguf_open(p, &g), KS_OK);
    const ks_gguf_tensor *t = ks_gguf_find_tensor(g, "blk.0.ffn_gate.weight");
    assert_non_null(t);
    assert_int_equal(t->ne[0], 2048); assert_int_equal(t->ne[1], 8192); assert_int_equal(t->type, KS_DTYPE_Q4_0);
    t = ks_gguf_find_tensor(g, "blk.0.attn_k.weight");
    assert_int_equal(t->ne[1], 512);
    t = ks_gguf_find_tensor(g, "rope_freqs.weight");
    assert_non_null(t);
    assert_int_equal(t->ne[0], 32);
    const float *rf = t->data;
    assert_true(rf[0] == 1.0f && rf[31] == 32.0f);
    assert_null(ks_gguf_find_tensor(g, "output.weight"));
    ks_gguf_close(g);
    unlink(p);

    /* a vocabulary without tokens is refused */
    ks_gguf_writer *w;
    assert_int_equal(ks_gguf_writer_create(&w), KS_OK);
    ks_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    const char *vp = tmp_path("notok.gguf");
    assert_int_equal(ks_gguf_writer_write(w, vp), KS_OK);
    ks_gguf_writer_destroy(w);
    ks_gguf *v;
    assert_int_equal(ks_gguf_open(vp, &v), KS_OK);
    ks_shape_gen_params gp = {0};
    gp.type = KS_DTYPE_Q8_0;
    gp.vocab = v;
    assert_int_equal(ks_shape_generate(ks_shape_find("tiny-llama"), &gp, p, NULL), KS_ERR_INVALID_ARG);
    gp.type = KS_DTYPE_Q8_K;
    assert_int_equal(ks_shape_generate(ks_shape_find("tiny-llama"), &gp, p, NULL), KS_ERR_INVALID_ARG);
    ks_gguf_close(v);
    unlink(vp);
}

/* Fuzzer findings stay fixed: each reproducer loads and every numeric getter
 * (including f64 views and saturating i64 views of u64/float arrays) is safe. */
static void test_fuzz_reproducers(void **state) {
    (void)state;
    const char *names[] = {"arr_u64_over_int64max.gguf", "arr_f32_nan_to_i64.gguf", "arr_f32_1e30_to_i64.gguf"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "tests/fuzz/repro/%s", names[i]);
        ks_gguf *g = NULL;
        assert_int_equal(ks_gguf_open(ks_test_source(rel), &g), KS_OK);
        (void)walk(g);
        for (int64_t k = 0; k < ks_gguf_n_kv(g); k++) {
            const ks_gguf_kv *kv = ks_gguf_kv_at(g, k);
            if (kv->type == KS_GGUF_ARRAY && kv->arr_type != KS_GGUF_STRING)
                for (uint64_t j = 0; j < kv->arr_n; j++) (void)ks_gguf_arr_f64(kv, j);
        }
        ks_gguf_close(g);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kv_roundtrip),
        cmocka_unit_test(test_tensor_roundtrip),
        cmocka_unit_test(test_writer_errors),
        cmocka_unit_test(test_fixture_model),
        cmocka_unit_test(test_fixture_vocabs),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_bitflips),
        cmocka_unit_test(test_absurd),
        cmocka_unit_test(test_shapes_table),
        cmocka_unit_test(test_generate_tiny),
        cmocka_unit_test(test_generate_deterministic),
        cmocka_unit_test(test_generate_real_shape),
        cmocka_unit_test(test_fuzz_reproducers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
