/*
 * gguf.c — GGUF reader: map the file, validate every field, hand out views.
 *
 * GGUF files arrive from anywhere, so the parser is written as if every byte
 * were hostile.  A cursor owns the only way to read (each read checks the
 * remaining length first); counts are bounded by the bytes left before any
 * allocation is sized from them (a count of 2^62 in a 1 KB file is rejected
 * before it reaches malloc); tensor extents are computed with overflow checks
 * and must land inside the data section at the declared alignment.  Nothing is
 * copied: strings, arrays and tensor data are views into the mapping, which
 * lives as long as the handle.
 */
#include "gguf/gguf.h"

#include "core/file.h"

#include <stdio.h>
#include <string.h>

struct ks_gguf {
    ks_file_map file;        /* the file bytes: mapped, read (owned) or borrowed */
    uint32_t version;
    uint32_t alignment;
    int64_t n_kv;
    ks_gguf_kv *kvs;         /* [n_kv] */
    int64_t n_tensors;
    ks_gguf_tensor *tensors; /* [n_tensors] */
    size_t data_offset;      /* start of the tensor data section */
};

typedef struct {
    const uint8_t *p;
    size_t pos, size;
} cursor;

static size_t cur_left(const cursor *c) { return c->size - c->pos; }

static ks_status cur_take(cursor *c, size_t n, const uint8_t **out, const char *what) {
    if (n > cur_left(c))
        return KS_FAIL(KS_ERR_FORMAT, "truncated file: %s needs %zu bytes at offset %zu, %zu left",
                       what, n, c->pos, cur_left(c));
    *out = c->p + c->pos;
    c->pos += n;
    return KS_OK;
}

static ks_status cur_u32(cursor *c, uint32_t *v, const char *what) {
    const uint8_t *b = NULL;
    KS_TRY(cur_take(c, 4, &b, what));
    memcpy(v, b, 4);
    return KS_OK;
}

static ks_status cur_u64(cursor *c, uint64_t *v, const char *what) {
    const uint8_t *b = NULL;
    KS_TRY(cur_take(c, 8, &b, what));
    memcpy(v, b, 8);
    return KS_OK;
}

static ks_status cur_str(cursor *c, ks_gguf_str *s, const char *what) {
    uint64_t len;
    KS_TRY(cur_u64(c, &len, what));
    if (len > cur_left(c))
        return KS_FAIL(KS_ERR_FORMAT, "%s: string length %llu at offset %zu exceeds the file",
                       what, (unsigned long long)len, c->pos - 8);
    const uint8_t *b = NULL;
    KS_TRY(cur_take(c, (size_t)len, &b, what));
    s->len = len;
    s->data = (const char *)b;
    return KS_OK;
}

size_t ks_gguf_type_size(ks_gguf_type t) {
    switch (t) {
    case KS_GGUF_UINT8: case KS_GGUF_INT8: case KS_GGUF_BOOL: return 1;
    case KS_GGUF_UINT16: case KS_GGUF_INT16: return 2;
    case KS_GGUF_UINT32: case KS_GGUF_INT32: case KS_GGUF_FLOAT32: return 4;
    case KS_GGUF_UINT64: case KS_GGUF_INT64: case KS_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

const char *ks_gguf_type_name(ks_gguf_type t) {
    static const char *const names[KS_GGUF_TYPE_COUNT_] = {
        "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"};
    return (unsigned)t < KS_GGUF_TYPE_COUNT_ ? names[t] : "?";
}

bool ks_gguf_str_eq(ks_gguf_str s, const char *c) {
    size_t n = strlen(c);
    return s.len == n && memcmp(s.data, c, n) == 0;
}

static ks_status parse_value(cursor *c, ks_gguf_kv *kv, const char *key_for_msg) {
    if ((unsigned)kv->type >= KS_GGUF_TYPE_COUNT_)
        return KS_FAIL(KS_ERR_FORMAT, "key '%s': unknown value type %u", key_for_msg, (unsigned)kv->type);
    if (kv->type == KS_GGUF_STRING) return cur_str(c, &kv->str, key_for_msg);
    if (kv->type != KS_GGUF_ARRAY) {
        KS_TRY(cur_take(c, ks_gguf_type_size(kv->type), &kv->scalar, key_for_msg));
        if (kv->type == KS_GGUF_BOOL && *kv->scalar > 1)
            return KS_FAIL(KS_ERR_FORMAT, "key '%s': bool value %u", key_for_msg, *kv->scalar);
        return KS_OK;
    }
    uint32_t at;
    KS_TRY(cur_u32(c, &at, key_for_msg));
    KS_TRY(cur_u64(c, &kv->arr_n, key_for_msg));
    kv->arr_type = (ks_gguf_type)at;
    if (at >= KS_GGUF_TYPE_COUNT_ || at == KS_GGUF_ARRAY)
        return KS_FAIL(KS_ERR_FORMAT, "key '%s': unsupported array element type %u", key_for_msg, at);
    if (kv->arr_type == KS_GGUF_STRING) {
        /* every string needs at least its 8-byte length: bound n before allocating */
        if (kv->arr_n > cur_left(c) / 8)
            return KS_FAIL(KS_ERR_FORMAT, "key '%s': %llu strings cannot fit in %zu bytes", key_for_msg,
                           (unsigned long long)kv->arr_n, cur_left(c));
        kv->arr_strs = ks_malloc((size_t)kv->arr_n * sizeof(ks_gguf_str) + 1);
        if (!kv->arr_strs) return KS_FAIL(KS_ERR_NOMEM, "key '%s': %llu strings", key_for_msg, (unsigned long long)kv->arr_n);
        for (uint64_t i = 0; i < kv->arr_n; i++) KS_TRY(cur_str(c, &kv->arr_strs[i], key_for_msg));
        return KS_OK;
    }
    size_t es = ks_gguf_type_size(kv->arr_type);
    if (kv->arr_n > cur_left(c) / es)
        return KS_FAIL(KS_ERR_FORMAT, "key '%s': array of %llu x %zu bytes exceeds the file", key_for_msg,
                       (unsigned long long)kv->arr_n, es);
    KS_TRY(cur_take(c, (size_t)kv->arr_n * es, &kv->arr_data, key_for_msg));
    if (kv->arr_type == KS_GGUF_BOOL)
        for (uint64_t i = 0; i < kv->arr_n; i++)
            if (kv->arr_data[i] > 1) return KS_FAIL(KS_ERR_FORMAT, "key '%s': bool element %llu", key_for_msg, (unsigned long long)i);
    return KS_OK;
}

/* Copies a GGUF string into a bounded C buffer for messages. */
static const char *msg_str(ks_gguf_str s, char *buf, size_t cap) {
    size_t n = s.len < cap - 1 ? (size_t)s.len : cap - 1;
    for (size_t i = 0; i < n; i++) buf[i] = (s.data[i] >= 32 && s.data[i] < 127) ? s.data[i] : '?';
    buf[n] = 0;
    return buf;
}

static ks_status parse_tensor(cursor *c, ks_gguf_tensor *t, int64_t index) {
    char nb[96];
    KS_TRY(cur_str(c, &t->name, "tensor name"));
    msg_str(t->name, nb, sizeof nb);
    if (t->name.len == 0) return KS_FAIL(KS_ERR_FORMAT, "tensor %lld has an empty name", (long long)index);
    KS_TRY(cur_u32(c, &t->n_dims, "tensor dims"));
    if (t->n_dims < 1 || t->n_dims > KS_GGUF_MAX_DIMS)
        return KS_FAIL(KS_ERR_FORMAT, "tensor '%s': %u dimensions (1..%d allowed)", nb, t->n_dims, KS_GGUF_MAX_DIMS);
    uint64_t n_elem = 1;
    for (int d = 0; d < KS_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t ne;
        KS_TRY(cur_u64(c, &ne, "tensor shape"));
        if (ne == 0 || ne > ((uint64_t)1 << 40))
            return KS_FAIL(KS_ERR_FORMAT, "tensor '%s': dimension %u has absurd size %llu", nb, d, (unsigned long long)ne);
        if (n_elem > ((uint64_t)1 << 50) / ne)
            return KS_FAIL(KS_ERR_FORMAT, "tensor '%s': element count overflows", nb);
        n_elem *= ne;
        t->ne[d] = (int64_t)ne;
    }
    uint32_t type;
    KS_TRY(cur_u32(c, &type, "tensor type"));
    KS_TRY(cur_u64(c, &t->offset, "tensor offset"));
    if (!ks_dtype_is_weight_type(type))
        return KS_FAIL(KS_ERR_UNSUPPORTED, "tensor '%s': type %u (%s) is not supported (supported: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_xs, mxfp4)",
                       nb, type, ks_dtype_name((ks_dtype)type));
    t->type = (ks_dtype)type;
    int64_t bs = ks_dtype_block_size(t->type);
    if (t->ne[0] % bs != 0)
        return KS_FAIL(KS_ERR_FORMAT, "tensor '%s': row length %lld is not a multiple of the %s block size %lld",
                       nb, (long long)t->ne[0], ks_dtype_name(t->type), (long long)bs);
    /* n_elem < 2^50 and block bytes <= 256/16 per element: no overflow below */
    t->nbytes = ks_dtype_row_bytes(t->type, t->ne[0]) * (size_t)(n_elem / (uint64_t)t->ne[0]);
    return KS_OK;
}

static int str_cmp(const void *a, const void *b) {
    const ks_gguf_str *x = a, *y = b;
    size_t n = x->len < y->len ? (size_t)x->len : (size_t)y->len;
    int c = n ? memcmp(x->data, y->data, n) : 0;
    return c ? c : (x->len > y->len) - (x->len < y->len);
}

/* Sort a copy of the names and compare neighbours: O(n log n), so a crafted
 * file with millions of entries cannot turn loading quadratic. */
static ks_status check_unique(const ks_gguf_str *names, size_t stride, int64_t n, const char *what) {
    if (n < 2) return KS_OK;
    ks_gguf_str *sorted = ks_malloc(sizeof(ks_gguf_str) * (size_t)n);
    if (!sorted) return KS_FAIL(KS_ERR_NOMEM, "checking %lld %s names", (long long)n, what);
    for (int64_t i = 0; i < n; i++) sorted[i] = *(const ks_gguf_str *)((const uint8_t *)names + (size_t)i * stride);
    qsort(sorted, (size_t)n, sizeof *sorted, str_cmp);
    ks_status st = KS_OK;
    for (int64_t i = 1; i < n && st == KS_OK; i++)
        if (!str_cmp(&sorted[i - 1], &sorted[i])) {
            char nb[96];
            st = KS_FAIL(KS_ERR_FORMAT, "duplicate %s '%s'", what, msg_str(sorted[i], nb, sizeof nb));
        }
    ks_free(sorted);
    return st;
}

static void gguf_free(ks_gguf *g) {
    if (!g) return;
    for (int64_t i = 0; g->kvs && i < g->n_kv; i++) ks_free(g->kvs[i].arr_strs);
    ks_free(g->kvs);
    ks_free(g->tensors);
    ks_file_map_close(&g->file);
    ks_free(g);
}

static ks_status gguf_parse(ks_gguf *g) {
    cursor c = {g->file.data, 0, g->file.size};
    uint32_t magic;
    KS_TRY(cur_u32(&c, &magic, "magic"));
    if (magic != KS_GGUF_MAGIC) return KS_FAIL(KS_ERR_FORMAT, "not a GGUF file (bad magic 0x%08x)", magic);
    KS_TRY(cur_u32(&c, &g->version, "version"));
    if (g->version != 2 && g->version != 3)
        return KS_FAIL(KS_ERR_UNSUPPORTED, "GGUF version %u is not supported (2 or 3 expected)", g->version);
    uint64_t n_tensors, n_kv;
    KS_TRY(cur_u64(&c, &n_tensors, "tensor count"));
    KS_TRY(cur_u64(&c, &n_kv, "kv count"));
    /* a kv needs >= 8 (key len) + 4 (type) + 1 bytes; a tensor info >= 8+4+8+4+8 */
    if (n_kv > cur_left(&c) / 13)
        return KS_FAIL(KS_ERR_FORMAT, "kv count %llu cannot fit in a %zu-byte file", (unsigned long long)n_kv, g->file.size);
    if (n_tensors > cur_left(&c) / 32)
        return KS_FAIL(KS_ERR_FORMAT, "tensor count %llu cannot fit in a %zu-byte file", (unsigned long long)n_tensors, g->file.size);
    g->kvs = ks_calloc((size_t)n_kv + 1, sizeof(ks_gguf_kv));
    if (!g->kvs) return KS_FAIL(KS_ERR_NOMEM, "%llu metadata keys", (unsigned long long)n_kv);
    g->alignment = KS_GGUF_DEFAULT_ALIGNMENT;
    for (uint64_t i = 0; i < n_kv; i++) {
        ks_gguf_kv *kv = &g->kvs[i];
        g->n_kv = (int64_t)i + 1; /* so gguf_free releases what was parsed */
        KS_TRY(cur_str(&c, &kv->key, "kv key"));
        char kb[96];
        msg_str(kv->key, kb, sizeof kb);
        if (kv->key.len == 0) return KS_FAIL(KS_ERR_FORMAT, "kv %llu has an empty key", (unsigned long long)i);
        uint32_t type;
        KS_TRY(cur_u32(&c, &type, "kv type"));
        kv->type = (ks_gguf_type)type;
        KS_TRY(parse_value(&c, kv, kb));
        if (ks_gguf_str_eq(kv->key, "general.alignment")) {
            uint64_t a = 0;
            if (kv->type == KS_GGUF_UINT32) { uint32_t v; memcpy(&v, kv->scalar, 4); a = v; }
            else if (kv->type == KS_GGUF_UINT64) memcpy(&a, kv->scalar, 8);
            else return KS_FAIL(KS_ERR_FORMAT, "general.alignment has type %s", ks_gguf_type_name(kv->type));
            if (a == 0 || (a & (a - 1)) || a > 65536)
                return KS_FAIL(KS_ERR_FORMAT, "general.alignment %llu is not a power of two <= 65536", (unsigned long long)a);
            g->alignment = (uint32_t)a;
        }
    }
    KS_TRY(check_unique(&g->kvs[0].key, sizeof(ks_gguf_kv), g->n_kv, "key"));
    g->tensors = ks_calloc((size_t)n_tensors + 1, sizeof(ks_gguf_tensor));
    if (!g->tensors) return KS_FAIL(KS_ERR_NOMEM, "%llu tensor infos", (unsigned long long)n_tensors);
    g->n_tensors = (int64_t)n_tensors;
    for (uint64_t i = 0; i < n_tensors; i++) KS_TRY(parse_tensor(&c, &g->tensors[i], (int64_t)i));
    KS_TRY(check_unique(&g->tensors[0].name, sizeof(ks_gguf_tensor), g->n_tensors, "tensor name"));
    size_t data_off = (c.pos + g->alignment - 1) / g->alignment * g->alignment;
    if (n_tensors > 0 && data_off > g->file.size)
        return KS_FAIL(KS_ERR_FORMAT, "truncated file: tensor data section starts at %zu, file has %zu bytes", data_off, g->file.size);
    g->data_offset = data_off;
    size_t data_size = g->file.size >= data_off ? g->file.size - data_off : 0;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        ks_gguf_tensor *t = &g->tensors[i];
        char nb[96];
        msg_str(t->name, nb, sizeof nb);
        if (t->offset % g->alignment)
            return KS_FAIL(KS_ERR_FORMAT, "tensor '%s': offset %llu is not aligned to %u", nb, (unsigned long long)t->offset, g->alignment);
        if (t->offset > data_size || t->nbytes > data_size - t->offset)
            return KS_FAIL(KS_ERR_FORMAT, "tensor '%s': data [%llu, +%zu) lies outside the %zu-byte data section (truncated file?)",
                           nb, (unsigned long long)t->offset, t->nbytes, data_size);
        t->data = g->file.data + data_off + t->offset;
    }
    return KS_OK;
}

ks_status ks_gguf_open_buffer(const void *buf, size_t size, ks_gguf **out) {
    if (!buf && size) return KS_FAIL(KS_ERR_INVALID_ARG, "NULL buffer");
    ks_gguf *g = ks_calloc(1, sizeof *g);
    if (!g) return KS_FAIL(KS_ERR_NOMEM, "GGUF handle");
    g->file = (ks_file_map){.data = buf, .size = size};
    ks_status st = gguf_parse(g);
    if (st != KS_OK) {
        gguf_free(g);
        return st;
    }
    *out = g;
    return KS_OK;
}

ks_status ks_gguf_open_ex(const char *path, bool use_mmap, ks_gguf **out) {
    ks_file_map file;
    KS_TRY(ks_file_map_open(path, use_mmap, &file));
    if (file.size < 24) {
        size_t size = file.size;
        ks_file_map_close(&file);
        return KS_FAIL(KS_ERR_FORMAT, "'%s' is too small (%zu bytes) to be a GGUF file", path, size);
    }
    ks_gguf *g = ks_calloc(1, sizeof *g);
    if (!g) {
        ks_file_map_close(&file);
        return KS_FAIL(KS_ERR_NOMEM, "GGUF handle for '%s'", path);
    }
    g->file = file;
    ks_status st = gguf_parse(g);
    if (st != KS_OK) {
        /* prefix the path so the CLI message names the file */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", ks_last_error());
        gguf_free(g);
        return KS_FAIL(st, "'%s': %s", path, msg);
    }
    *out = g;
    return KS_OK;
}

ks_status ks_gguf_open(const char *path, ks_gguf **out) { return ks_gguf_open_ex(path, true, out); }

void ks_gguf_close(ks_gguf *g) { gguf_free(g); }

uint32_t ks_gguf_version(const ks_gguf *g) { return g->version; }
size_t ks_gguf_file_size(const ks_gguf *g) { return g->file.size; }
uint32_t ks_gguf_alignment(const ks_gguf *g) { return g->alignment; }
int64_t ks_gguf_n_kv(const ks_gguf *g) { return g->n_kv; }
int64_t ks_gguf_n_tensors(const ks_gguf *g) { return g->n_tensors; }

const ks_gguf_kv *ks_gguf_kv_at(const ks_gguf *g, int64_t i) {
    KS_ASSERT(i >= 0 && i < g->n_kv);
    return &g->kvs[i];
}
const ks_gguf_tensor *ks_gguf_tensor_at(const ks_gguf *g, int64_t i) {
    KS_ASSERT(i >= 0 && i < g->n_tensors);
    return &g->tensors[i];
}
const ks_gguf_kv *ks_gguf_find_kv(const ks_gguf *g, const char *key) {
    for (int64_t i = 0; i < g->n_kv; i++)
        if (ks_gguf_str_eq(g->kvs[i].key, key)) return &g->kvs[i];
    return NULL;
}
const ks_gguf_tensor *ks_gguf_find_tensor(const ks_gguf *g, const char *name) {
    for (int64_t i = 0; i < g->n_tensors; i++)
        if (ks_gguf_str_eq(g->tensors[i].name, name)) return &g->tensors[i];
    return NULL;
}

/* Reads a scalar of any numeric type as int64/uint64/double. */
static bool scalar_as_i64(ks_gguf_type t, const uint8_t *p, int64_t *out) {
    switch (t) {
    case KS_GGUF_UINT8: *out = *p; return true;
    case KS_GGUF_INT8: *out = (int8_t)*p; return true;
    case KS_GGUF_BOOL: *out = *p; return true;
    case KS_GGUF_UINT16: { uint16_t v; memcpy(&v, p, 2); *out = v; return true; }
    case KS_GGUF_INT16: { int16_t v; memcpy(&v, p, 2); *out = v; return true; }
    case KS_GGUF_UINT32: { uint32_t v; memcpy(&v, p, 4); *out = v; return true; }
    case KS_GGUF_INT32: { int32_t v; memcpy(&v, p, 4); *out = v; return true; }
    case KS_GGUF_UINT64: { uint64_t v; memcpy(&v, p, 8); if (v > INT64_MAX) return false; *out = (int64_t)v; return true; }
    case KS_GGUF_INT64: { int64_t v; memcpy(&v, p, 8); *out = v; return true; }
    default: return false;
    }
}
static bool scalar_as_f64(ks_gguf_type t, const uint8_t *p, double *out) {
    if (t == KS_GGUF_FLOAT32) { float v; memcpy(&v, p, 4); *out = v; return true; }
    if (t == KS_GGUF_FLOAT64) { memcpy(out, p, 8); return true; }
    if (t == KS_GGUF_UINT64) { uint64_t v; memcpy(&v, p, 8); *out = (double)v; return true; }
    int64_t i;
    if (!scalar_as_i64(t, p, &i)) return false;
    *out = (double)i;
    return true;
}

double ks_gguf_arr_f64(const ks_gguf_kv *kv, uint64_t i) {
    KS_ASSERT(kv->type == KS_GGUF_ARRAY && i < kv->arr_n && kv->arr_data);
    double v = 0;
    KS_ASSERT(scalar_as_f64(kv->arr_type, kv->arr_data + i * ks_gguf_type_size(kv->arr_type), &v));
    return v;
}
int64_t ks_gguf_arr_i64(const ks_gguf_kv *kv, uint64_t i) {
    KS_ASSERT(kv->type == KS_GGUF_ARRAY && i < kv->arr_n && kv->arr_data);
    int64_t v = 0;
    if (scalar_as_i64(kv->arr_type, kv->arr_data + i * ks_gguf_type_size(kv->arr_type), &v)) return v;
    /* u64 above INT64_MAX and floats saturate; NaN reads as 0 */
    double d = 0;
    KS_ASSERT(scalar_as_f64(kv->arr_type, kv->arr_data + i * ks_gguf_type_size(kv->arr_type), &d));
    if (d != d) return 0;
    if (d >= 9.2233720368547748e18) return INT64_MAX;
    if (d <= -9.2233720368547758e18) return INT64_MIN;
    return (int64_t)d;
}

static ks_status get_scalar(const ks_gguf *g, const char *key, const ks_gguf_kv **out) {
    const ks_gguf_kv *kv = ks_gguf_find_kv(g, key);
    if (!kv) return KS_FAIL(KS_ERR_NOT_FOUND, "key '%s' not found", key);
    if (kv->type == KS_GGUF_ARRAY || kv->type == KS_GGUF_STRING)
        return KS_FAIL(KS_ERR_FORMAT, "key '%s' has type %s, expected a number", key, ks_gguf_type_name(kv->type));
    *out = kv;
    return KS_OK;
}

/* key's scalar as an integer in [lo, hi]; what: the type, for the error */
static ks_status get_int_in(const ks_gguf *g, const char *key, int64_t lo, int64_t hi, const char *what,
                            int64_t *out) {
    const ks_gguf_kv *kv;
    KS_TRY(get_scalar(g, key, &kv));
    int64_t v;
    if (!scalar_as_i64(kv->type, kv->scalar, &v) || v < lo || v > hi)
        return KS_FAIL(KS_ERR_FORMAT, "key '%s' is not %s", key, what);
    *out = v;
    return KS_OK;
}
ks_status ks_gguf_get_u32(const ks_gguf *g, const char *key, uint32_t *out) {
    int64_t v = 0;
    KS_TRY(get_int_in(g, key, 0, UINT32_MAX, "an unsigned 32-bit integer", &v));
    *out = (uint32_t)v;
    return KS_OK;
}
ks_status ks_gguf_get_i32(const ks_gguf *g, const char *key, int32_t *out) {
    int64_t v = 0;
    KS_TRY(get_int_in(g, key, INT32_MIN, INT32_MAX, "a 32-bit integer", &v));
    *out = (int32_t)v;
    return KS_OK;
}
ks_status ks_gguf_get_f32(const ks_gguf *g, const char *key, float *out) {
    const ks_gguf_kv *kv;
    KS_TRY(get_scalar(g, key, &kv));
    double v;
    if (!scalar_as_f64(kv->type, kv->scalar, &v)) return KS_FAIL(KS_ERR_FORMAT, "key '%s' is not a number", key);
    *out = (float)v;
    return KS_OK;
}
ks_status ks_gguf_get_bool(const ks_gguf *g, const char *key, bool *out) {
    int64_t v = 0;
    KS_TRY(get_int_in(g, key, INT64_MIN, INT64_MAX, "a bool", &v));
    *out = v != 0;
    return KS_OK;
}
ks_status ks_gguf_get_str(const ks_gguf *g, const char *key, ks_gguf_str *out) {
    const ks_gguf_kv *kv = ks_gguf_find_kv(g, key);
    if (!kv) return KS_FAIL(KS_ERR_NOT_FOUND, "key '%s' not found", key);
    if (kv->type != KS_GGUF_STRING)
        return KS_FAIL(KS_ERR_FORMAT, "key '%s' has type %s, expected string", key, ks_gguf_type_name(kv->type));
    *out = kv->str;
    return KS_OK;
}
ks_status ks_gguf_get_arr(const ks_gguf *g, const char *key, const ks_gguf_kv **out) {
    const ks_gguf_kv *kv = ks_gguf_find_kv(g, key);
    if (!kv) return KS_FAIL(KS_ERR_NOT_FOUND, "key '%s' not found", key);
    if (kv->type != KS_GGUF_ARRAY)
        return KS_FAIL(KS_ERR_FORMAT, "key '%s' has type %s, expected array", key, ks_gguf_type_name(kv->type));
    *out = kv;
    return KS_OK;
}
