/*
 * gguf_write.c — the writer half of gguf.h: GGUF v3, little-endian.
 *
 * Why it is built this way:
 *
 * - Key/values are encoded into their on-disk bytes the moment they are set.
 *   The writer then never needs a tagged union per GGUF type, copying a kv from
 *   a reader (string arrays included) is one encoding pass, and setting a key
 *   twice simply replaces the blob in place (the first position wins, so the
 *   key order a caller chose is stable).
 *
 * - Everything is encoded byte by byte in little-endian, never by memcpy of
 *   host integers, so the output is the same on every host and the same input
 *   always gives the same bytes (gen-model relies on byte-identical output).
 *
 * - Tensor payloads are produced at write time, one tensor at a time, through
 *   the fill callback into a single reusable buffer sized for the largest
 *   tensor.  A multi-GB model therefore never sits in memory as a whole, only
 *   its largest tensor does.  Borrowed payloads (fill == NULL) go straight to
 *   the stream without a copy.
 *
 * - Layout follows the GGUF spec and what llama.cpp writes: header, kvs,
 *   tensor infos, zero padding to general.alignment (default 32), then each
 *   tensor at an aligned offset relative to the data section with zero padding
 *   after every tensor (the last one included).  A file without tensors ends
 *   right after the header, like llama.cpp's vocabulary-only files.
 *
 * - A failed write (disk full, fill error) must not leave a half file that a
 *   later run would mistake for a model: the partial file is removed, but only
 *   if it is a regular file (never unlink a device such as /dev/full).
 */
#define _POSIX_C_SOURCE 200809L
#include "gguf/gguf.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

typedef struct ks_gguf_wkv {
    char *key;           /* NUL-terminated copy */
    ks_gguf_type type;
    uint8_t *val;        /* [val_len] encoded value, exactly as in the file */
    size_t val_len;
} ks_gguf_wkv;

typedef struct ks_gguf_wtensor {
    char *name;
    ks_dtype type;
    uint32_t n_dims;
    int64_t ne[KS_GGUF_MAX_DIMS];
    const void *data;    /* borrowed, or NULL when fill is set */
    ks_gguf_fill_fn fill;
    void *user;
    uint64_t nbytes;
    uint64_t offset;     /* relative to the data section; set at write time */
} ks_gguf_wtensor;

struct ks_gguf_writer {
    ks_gguf_wkv *kvs;    /* [n_kv] in insertion order */
    int64_t n_kv, cap_kv;
    ks_gguf_wtensor *ts; /* [n_t] in insertion order = file order */
    int64_t n_t, cap_t;
    bool refused;        /* a setter's allocation was refused: write reports KS_ERR_NOMEM */
};

/* ------------------------------------------------------- byte encoding -- */
/* A refused allocation makes the buffer "refused" and later puts no-ops,
 * so that encoders stay simple and the owner checks once. */
typedef struct ks_gguf_bytes {
    uint8_t *p;
    size_t n, cap;
    bool refused;
} ks_gguf_bytes;

static void ks_gguf_bytes_put(ks_gguf_bytes *b, const void *src, size_t n) {
    if (b->refused) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n) cap *= 2;
        uint8_t *p = ks_realloc(b->p, cap);
        if (!p) {
            b->refused = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void ks_gguf_bytes_put_le(ks_gguf_bytes *b, uint64_t v, int width) {
    uint8_t tmp[8];
    for (int i = 0; i < width; i++) tmp[i] = (uint8_t)(v >> (8 * i));
    ks_gguf_bytes_put(b, tmp, (size_t)width);
}
static void ks_gguf_bytes_put_str(ks_gguf_bytes *b, const char *s, uint64_t len) {
    ks_gguf_bytes_put_le(b, len, 8);
    ks_gguf_bytes_put(b, s, (size_t)len);
}
static uint32_t ks_gguf_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
/* Append n scalars of type t from host memory, converted to little-endian. */
static void ks_gguf_bytes_put_scalars(ks_gguf_bytes *b, ks_gguf_type t, const void *data, uint64_t n) {
    size_t sz = ks_gguf_type_size(t);
    KS_ASSERT(sz != 0);
    const uint8_t *src = data;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t v = 0;
        switch (sz) {
        case 1: v = src[i]; break;
        case 2: { uint16_t x; memcpy(&x, src + i * 2, 2); v = x; break; }
        case 4: { uint32_t x; memcpy(&x, src + i * 4, 4); v = x; break; }
        default: memcpy(&v, src + i * 8, 8); break;
        }
        ks_gguf_bytes_put_le(b, v, (int)sz);
    }
}

/* ---------------------------------------------------------- kv storage -- */
static ks_gguf_wkv *ks_gguf_writer_slot(ks_gguf_writer *w, const char *key, ks_gguf_type type) {
    KS_ASSERT(w != NULL && key != NULL);
    for (int64_t i = 0; i < w->n_kv; i++) {
        if (!strcmp(w->kvs[i].key, key)) {
            ks_free(w->kvs[i].val);
            w->kvs[i].val = NULL;
            w->kvs[i].val_len = 0;
            w->kvs[i].type = type;
            return &w->kvs[i];
        }
    }
    char *copy = ks_strdup(key);
    if (!copy) return NULL;
    if (w->n_kv == w->cap_kv) {
        int64_t cap = w->cap_kv ? w->cap_kv * 2 : 32;
        ks_gguf_wkv *kvs = ks_realloc(w->kvs, (size_t)cap * sizeof *w->kvs);
        if (!kvs) {
            ks_free(copy);
            return NULL;
        }
        w->kvs = kvs;
        w->cap_kv = cap;
    }
    ks_gguf_wkv *kv = &w->kvs[w->n_kv++];
    kv->key = copy;
    kv->type = type;
    kv->val = NULL;
    kv->val_len = 0;
    return kv;
}
static void ks_gguf_writer_put(ks_gguf_writer *w, const char *key, ks_gguf_type type, ks_gguf_bytes *b) {
    ks_gguf_wkv *kv = b->refused ? NULL : ks_gguf_writer_slot(w, key, type);
    if (!kv) {
        w->refused = true;
        ks_free(b->p);
        return;
    }
    kv->val = b->p;
    kv->val_len = b->n;
}
static void ks_gguf_writer_set_scalar(ks_gguf_writer *w, const char *key, ks_gguf_type t, uint64_t bits) {
    ks_gguf_bytes b = {0};
    ks_gguf_bytes_put_le(&b, bits, (int)ks_gguf_type_size(t));
    ks_gguf_writer_put(w, key, t, &b);
}

ks_status ks_gguf_writer_create(ks_gguf_writer **out) {
    if (!out) return KS_FAIL(KS_ERR_INVALID_ARG, "gguf writer: out is NULL");
    *out = ks_calloc(1, sizeof(ks_gguf_writer));
    return *out ? KS_OK : KS_FAIL(KS_ERR_NOMEM, "gguf writer");
}

void ks_gguf_writer_destroy(ks_gguf_writer *w) {
    if (!w) return;
    for (int64_t i = 0; i < w->n_kv; i++) {
        ks_free(w->kvs[i].key);
        ks_free(w->kvs[i].val);
    }
    for (int64_t i = 0; i < w->n_t; i++) ks_free(w->ts[i].name);
    ks_free(w->kvs);
    ks_free(w->ts);
    ks_free(w);
}

void ks_gguf_writer_set_u32(ks_gguf_writer *w, const char *key, uint32_t v) {
    ks_gguf_writer_set_scalar(w, key, KS_GGUF_UINT32, v);
}
void ks_gguf_writer_set_i32(ks_gguf_writer *w, const char *key, int32_t v) {
    ks_gguf_writer_set_scalar(w, key, KS_GGUF_INT32, (uint32_t)v);
}
void ks_gguf_writer_set_f32(ks_gguf_writer *w, const char *key, float v) {
    ks_gguf_writer_set_scalar(w, key, KS_GGUF_FLOAT32, ks_gguf_f32_bits(v));
}
void ks_gguf_writer_set_bool(ks_gguf_writer *w, const char *key, bool v) {
    ks_gguf_writer_set_scalar(w, key, KS_GGUF_BOOL, v ? 1u : 0u);
}
void ks_gguf_writer_set_str(ks_gguf_writer *w, const char *key, const char *v) {
    KS_ASSERT(v != NULL);
    ks_gguf_bytes b = {0};
    ks_gguf_bytes_put_str(&b, v, strlen(v));
    ks_gguf_writer_put(w, key, KS_GGUF_STRING, &b);
}

void ks_gguf_writer_set_arr(ks_gguf_writer *w, const char *key, ks_gguf_type t, const void *data, uint64_t n) {
    KS_ASSERT(ks_gguf_type_size(t) != 0); /* string arrays: copy_kv */
    KS_ASSERT(data != NULL || n == 0);
    ks_gguf_bytes b = {0};
    ks_gguf_bytes_put_le(&b, (uint32_t)t, 4);
    ks_gguf_bytes_put_le(&b, n, 8);
    ks_gguf_bytes_put_scalars(&b, t, data, n);
    ks_gguf_writer_put(w, key, KS_GGUF_ARRAY, &b);
}

void ks_gguf_writer_copy_kv(ks_gguf_writer *w, const ks_gguf_kv *kv) {
    KS_ASSERT(w != NULL && kv != NULL);
    ks_gguf_bytes b = {0};
    if (kv->type == KS_GGUF_STRING) {
        ks_gguf_bytes_put_str(&b, kv->str.data, kv->str.len);
    } else if (kv->type == KS_GGUF_ARRAY) {
        /* The reader cannot represent nested arrays, so none can reach here. */
        KS_ASSERT(kv->arr_type != KS_GGUF_ARRAY);
        ks_gguf_bytes_put_le(&b, (uint32_t)kv->arr_type, 4);
        ks_gguf_bytes_put_le(&b, kv->arr_n, 8);
        if (kv->arr_type == KS_GGUF_STRING) {
            KS_ASSERT(kv->arr_strs != NULL || kv->arr_n == 0);
            for (uint64_t i = 0; i < kv->arr_n; i++)
                ks_gguf_bytes_put_str(&b, kv->arr_strs[i].data, kv->arr_strs[i].len);
        } else {
            size_t sz = ks_gguf_type_size(kv->arr_type);
            KS_ASSERT(sz != 0);
            /* already little-endian in the file: copy the raw bytes */
            ks_gguf_bytes_put(&b, kv->arr_data, (size_t)(kv->arr_n * sz));
        }
    } else {
        size_t sz = ks_gguf_type_size(kv->type);
        KS_ASSERT(sz != 0);
        ks_gguf_bytes_put(&b, kv->scalar, sz);
    }
    /* keys are not NUL-terminated in the reader: make a C string */
    char *key = ks_malloc((size_t)kv->key.len + 1);
    if (!key) {
        w->refused = true;
        ks_free(b.p);
        return;
    }
    memcpy(key, kv->key.data, (size_t)kv->key.len);
    key[kv->key.len] = '\0';
    ks_gguf_writer_put(w, key, kv->type, &b);
    ks_free(key);
}

/* ------------------------------------------------------------- tensors -- */
ks_status ks_gguf_writer_add_tensor(ks_gguf_writer *w, const char *name, ks_dtype type,
                                    uint32_t n_dims, const int64_t *ne, const void *data,
                                    ks_gguf_fill_fn fill, void *user) {
    if (!w || !name || !ne) return KS_FAIL(KS_ERR_INVALID_ARG, "gguf writer: NULL argument");
    /* llama.cpp keeps names in a 64-byte buffer including the NUL */
    if (name[0] == '\0' || strlen(name) >= 64)
        return KS_FAIL(KS_ERR_INVALID_ARG, "gguf writer: tensor name '%s' empty or longer than 63 bytes", name);
    if (n_dims < 1 || n_dims > KS_GGUF_MAX_DIMS)
        return KS_FAIL(KS_ERR_INVALID_ARG, "gguf writer: tensor '%s' has %u dims", name, n_dims);
    if (!data && !fill)
        return KS_FAIL(KS_ERR_INVALID_ARG, "gguf writer: tensor '%s' has neither data nor fill", name);
    int64_t bs = ks_dtype_block_size(type);
    if (bs <= 0 || ks_dtype_block_bytes(type) == 0)
        return KS_FAIL(KS_ERR_INVALID_ARG, "gguf writer: tensor '%s' has unknown type %d", name, (int)type);
    for (int64_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->ts[i].name, name))
            return KS_FAIL(KS_ERR_INVALID_ARG, "gguf writer: duplicate tensor '%s'", name);

    int64_t full[KS_GGUF_MAX_DIMS] = {1, 1, 1, 1};
    uint64_t rows = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] <= 0)
            return KS_FAIL(KS_ERR_INVALID_ARG, "gguf writer: tensor '%s' dim %u is %lld", name, d, (long long)ne[d]);
        full[d] = ne[d];
        if (d > 0) {
            if (rows > UINT64_MAX / (uint64_t)ne[d])
                return KS_FAIL(KS_ERR_INVALID_ARG, "gguf writer: tensor '%s' too large", name);
            rows *= (uint64_t)ne[d];
        }
    }
    if (full[0] % bs != 0)
        return KS_FAIL(KS_ERR_INVALID_ARG, "gguf writer: tensor '%s' row of %lld is not a multiple of %s's block %lld",
                       name, (long long)full[0], ks_dtype_name(type), (long long)bs);
    uint64_t row_bytes = (uint64_t)full[0] / (uint64_t)bs * ks_dtype_block_bytes(type);
    if (rows > (UINT64_MAX >> 1) / row_bytes || rows * row_bytes > (uint64_t)SIZE_MAX)
        return KS_FAIL(KS_ERR_INVALID_ARG, "gguf writer: tensor '%s' too large", name);

    char *copy = ks_strdup(name);
    if (!copy) return KS_FAIL(KS_ERR_NOMEM, "gguf writer: tensor '%s'", name);
    if (w->n_t == w->cap_t) {
        int64_t cap = w->cap_t ? w->cap_t * 2 : 64;
        ks_gguf_wtensor *ts = ks_realloc(w->ts, (size_t)cap * sizeof *w->ts);
        if (!ts) {
            ks_free(copy);
            return KS_FAIL(KS_ERR_NOMEM, "gguf writer: %lld tensors", (long long)cap);
        }
        w->ts = ts;
        w->cap_t = cap;
    }
    ks_gguf_wtensor *t = &w->ts[w->n_t++];
    memset(t, 0, sizeof *t);
    t->name = copy;
    t->type = type;
    t->n_dims = n_dims;
    memcpy(t->ne, full, sizeof full);
    t->data = fill ? NULL : data;
    t->fill = fill;
    t->user = user;
    t->nbytes = rows * row_bytes;
    return KS_OK;
}

/* --------------------------------------------------------------- write -- */
static ks_status ks_gguf_writer_alignment(const ks_gguf_writer *w, uint64_t *out) {
    *out = KS_GGUF_DEFAULT_ALIGNMENT;
    for (int64_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kvs[i].key, "general.alignment") != 0) continue;
        const ks_gguf_wkv *kv = &w->kvs[i];
        if (kv->type != KS_GGUF_UINT32)
            return KS_FAIL(KS_ERR_INVALID_ARG, "gguf writer: general.alignment must be a uint32");
        uint32_t a = (uint32_t)kv->val[0] | (uint32_t)kv->val[1] << 8 | (uint32_t)kv->val[2] << 16 |
                     (uint32_t)kv->val[3] << 24;
        if (a == 0 || (a & (a - 1)) != 0)
            return KS_FAIL(KS_ERR_INVALID_ARG, "gguf writer: general.alignment %u is not a power of two", a);
        *out = a;
    }
    return KS_OK;
}

typedef struct ks_gguf_out {
    FILE *f;
    const char *path;
    uint64_t pos;
} ks_gguf_out;

static ks_status ks_gguf_out_put(ks_gguf_out *o, const void *p, size_t n) {
    if (n && fwrite(p, 1, n, o->f) != n)
        return KS_FAIL(KS_ERR_IO, "gguf writer: writing '%s' at byte %llu: %s", o->path,
                       (unsigned long long)o->pos, strerror(errno));
    o->pos += n;
    return KS_OK;
}
static ks_status ks_gguf_out_pad(ks_gguf_out *o, uint64_t align) {
    static const uint8_t zeros[256];
    while (o->pos % align != 0) {
        uint64_t need = align - o->pos % align;
        KS_TRY(ks_gguf_out_put(o, zeros, need < sizeof zeros ? (size_t)need : sizeof zeros));
    }
    return KS_OK;
}

static ks_status ks_gguf_writer_emit(ks_gguf_writer *w, ks_gguf_out *o, uint64_t align) {
    /* header + kvs + tensor infos, encoded in memory (small), then streamed */
    ks_gguf_bytes h = {0};
    ks_gguf_bytes_put_le(&h, KS_GGUF_MAGIC, 4);
    ks_gguf_bytes_put_le(&h, 3, 4);
    ks_gguf_bytes_put_le(&h, (uint64_t)w->n_t, 8);
    ks_gguf_bytes_put_le(&h, (uint64_t)w->n_kv, 8);
    for (int64_t i = 0; i < w->n_kv; i++) {
        const ks_gguf_wkv *kv = &w->kvs[i];
        ks_gguf_bytes_put_str(&h, kv->key, strlen(kv->key));
        ks_gguf_bytes_put_le(&h, (uint32_t)kv->type, 4);
        ks_gguf_bytes_put(&h, kv->val, kv->val_len);
    }
    uint64_t off = 0, max_fill = 0;
    for (int64_t i = 0; i < w->n_t; i++) {
        ks_gguf_wtensor *t = &w->ts[i];
        t->offset = off;
        off += (t->nbytes + align - 1) / align * align;
        if (t->fill && t->nbytes > max_fill) max_fill = t->nbytes;
        ks_gguf_bytes_put_str(&h, t->name, strlen(t->name));
        ks_gguf_bytes_put_le(&h, t->n_dims, 4);
        for (uint32_t d = 0; d < t->n_dims; d++) ks_gguf_bytes_put_le(&h, (uint64_t)t->ne[d], 8);
        ks_gguf_bytes_put_le(&h, (uint32_t)t->type, 4);
        ks_gguf_bytes_put_le(&h, t->offset, 8);
    }
    ks_status st = h.refused ? KS_FAIL(KS_ERR_NOMEM, "gguf writer: header of %lld tensors", (long long)w->n_t)
                             : ks_gguf_out_put(o, h.p, h.n);
    ks_free(h.p);
    if (st != KS_OK || w->n_t == 0) return st;
    KS_TRY(ks_gguf_out_pad(o, align));

    /* data section: one tensor at a time; the fill buffer is reused */
    uint64_t data_start = o->pos;
    void *buf = max_fill ? ks_malloc_aligned((size_t)max_fill) : NULL;
    if (max_fill && !buf) return KS_FAIL(KS_ERR_NOMEM, "gguf writer: fill buffer of %llu bytes", (unsigned long long)max_fill);
    for (int64_t i = 0; i < w->n_t && st == KS_OK; i++) {
        const ks_gguf_wtensor *t = &w->ts[i];
        KS_ASSERT(o->pos - data_start == t->offset);
        const void *src = t->data;
        if (t->fill) {
            st = t->fill(t->user, buf, (size_t)t->nbytes);
            if (st != KS_OK) break; /* the callback recorded its own message */
            src = buf;
        }
        st = ks_gguf_out_put(o, src, (size_t)t->nbytes);
        if (st == KS_OK) st = ks_gguf_out_pad(o, align);
    }
    ks_free_aligned(buf);
    return st;
}

ks_status ks_gguf_writer_write(ks_gguf_writer *w, const char *path) {
    if (!w || !path) return KS_FAIL(KS_ERR_INVALID_ARG, "gguf writer: NULL argument");
    if (w->refused) return KS_FAIL(KS_ERR_NOMEM, "gguf writer: a metadata value could not be stored");
    uint64_t align;
    KS_TRY(ks_gguf_writer_alignment(w, &align));

    FILE *f = fopen(path, "wb");
    if (!f) return KS_FAIL(KS_ERR_IO, "gguf writer: cannot create '%s': %s", path, strerror(errno));
    struct stat sb;
    bool regular = fstat(fileno(f), &sb) == 0 && S_ISREG(sb.st_mode);
    /* large buffer: headers are many tiny writes; tensor writes bypass it */
    setvbuf(f, NULL, _IOFBF, 1 << 20);

    ks_gguf_out o = {f, path, 0};
    ks_status st = ks_gguf_writer_emit(w, &o, align);
    if (st == KS_OK && fflush(f) != 0)
        st = KS_FAIL(KS_ERR_IO, "gguf writer: flushing '%s': %s", path, strerror(errno));
    if (st == KS_OK && ferror(f))
        st = KS_FAIL(KS_ERR_IO, "gguf writer: writing '%s' failed", path);
    if (fclose(f) != 0 && st == KS_OK)
        st = KS_FAIL(KS_ERR_IO, "gguf writer: closing '%s': %s", path, strerror(errno));
    if (st != KS_OK && regular) remove(path);
    return st;
}
