/*
 * fuzz_gguf.c — libFuzzer entry point for the GGUF reader.
 *
 * Why: GGUF files come from the internet and the reader is the first code to
 * touch them, so it must survive any byte string.  Parsing alone is not
 * enough: a reader can "succeed" while handing out a view that reaches past
 * the buffer, so after a successful open every kv, string, array element and
 * tensor byte is touched (ASan reports the first stray read) and every typed
 * getter is exercised on every key.  Built only with clang and
 * -DKVSIEVE_FUZZ=ON (see CMakeLists.txt); seeds live in tests/fuzz/corpus/.
 */
#include "gguf/gguf.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static volatile uint64_t g_sink; /* keeps the touches from being optimized away */

static void fuzz_gguf_walk_kv(const ks_gguf *g, const ks_gguf_kv *kv) {
    uint64_t h = 0;
    for (uint64_t j = 0; j < kv->key.len; j++) h += (uint8_t)kv->key.data[j];
    if (kv->type == KS_GGUF_STRING) {
        for (uint64_t j = 0; j < kv->str.len; j++) h += (uint8_t)kv->str.data[j];
    } else if (kv->type == KS_GGUF_ARRAY) {
        if (kv->arr_type == KS_GGUF_STRING) {
            for (uint64_t j = 0; j < kv->arr_n; j++)
                for (uint64_t c = 0; c < kv->arr_strs[j].len; c++) h += (uint8_t)kv->arr_strs[j].data[c];
        } else {
            for (uint64_t j = 0; j < kv->arr_n; j++) {
                h += (uint64_t)ks_gguf_arr_i64(kv, j);
                h += (uint64_t)(ks_gguf_arr_f64(kv, j) != 0.0);
            }
        }
    } else {
        for (size_t j = 0; j < ks_gguf_type_size(kv->type); j++) h += kv->scalar[j];
    }
    /* typed getters by key (a NUL-terminated copy; keys may hold NULs) */
    if (kv->key.len < 256) {
        char key[256];
        memcpy(key, kv->key.data, (size_t)kv->key.len);
        key[kv->key.len] = '\0';
        uint32_t u; int32_t i; float f; bool b; ks_gguf_str s; const ks_gguf_kv *a;
        if (ks_gguf_get_u32(g, key, &u) == KS_OK) h += u;
        if (ks_gguf_get_i32(g, key, &i) == KS_OK) h += (uint64_t)i;
        if (ks_gguf_get_f32(g, key, &f) == KS_OK) h += (uint64_t)(f == f);
        if (ks_gguf_get_bool(g, key, &b) == KS_OK) h += b;
        if (ks_gguf_get_str(g, key, &s) == KS_OK) h += s.len;
        if (ks_gguf_get_arr(g, key, &a) == KS_OK) h += a->arr_n;
        h += (uint64_t)(ks_gguf_find_kv(g, key) != NULL);
    }
    g_sink += h;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ks_gguf *g = NULL;
    if (ks_gguf_open_buffer(data, size, &g) != KS_OK) return 0;
    uint64_t h = ks_gguf_version(g) + ks_gguf_alignment(g) + ks_gguf_file_size(g);
    for (int64_t i = 0; i < ks_gguf_n_kv(g); i++) fuzz_gguf_walk_kv(g, ks_gguf_kv_at(g, i));
    for (int64_t i = 0; i < ks_gguf_n_tensors(g); i++) {
        const ks_gguf_tensor *t = ks_gguf_tensor_at(g, i);
        const uint8_t *d = t->data;
        for (size_t j = 0; j < t->nbytes; j++) h += d[j];
        for (uint64_t j = 0; j < t->name.len; j++) h += (uint8_t)t->name.data[j];
        h += ks_dtype_row_bytes(t->type, t->ne[0]);
        if (t->name.len < 128) {
            char name[128];
            memcpy(name, t->name.data, (size_t)t->name.len);
            name[t->name.len] = '\0';
            h += (uint64_t)(ks_gguf_find_tensor(g, name) != NULL);
        }
    }
    g_sink += h;
    ks_gguf_close(g);
    return 0;
}
