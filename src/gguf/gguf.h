/*
 * gguf.h — GGUF v3 reader (mmap, zero-copy) and writer.
 *
 * The reader treats the file as untrusted: every count, string length, array
 * extent, tensor dimension, offset and alignment is checked against the file
 * size before it is used, and arithmetic that could overflow is done checked.
 * After a successful open, every pointer it hands out (strings, arrays,
 * tensor data) points into the mapping and stays valid until ks_gguf_close.
 * Strings are NOT NUL-terminated: use the length.
 *
 * The writer produces the same format; tensor payloads may be supplied by a
 * callback at write time so multi-GB files are streamed, never held in RAM.
 */
#ifndef KS_GGUF_H
#define KS_GGUF_H

#include "core/core.h"
#include "tensor/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KS_GGUF_MAGIC 0x46554747u /* "GGUF" little-endian */
#define KS_GGUF_DEFAULT_ALIGNMENT 32
#define KS_GGUF_MAX_DIMS 4

typedef enum ks_gguf_type {
    KS_GGUF_UINT8 = 0, KS_GGUF_INT8 = 1, KS_GGUF_UINT16 = 2, KS_GGUF_INT16 = 3,
    KS_GGUF_UINT32 = 4, KS_GGUF_INT32 = 5, KS_GGUF_FLOAT32 = 6, KS_GGUF_BOOL = 7,
    KS_GGUF_STRING = 8, KS_GGUF_ARRAY = 9, KS_GGUF_UINT64 = 10, KS_GGUF_INT64 = 11,
    KS_GGUF_FLOAT64 = 12, KS_GGUF_TYPE_COUNT_
} ks_gguf_type;

typedef struct ks_gguf_str {
    uint64_t len;
    const char *data; /* into the mapping; not NUL-terminated */
} ks_gguf_str;

typedef struct ks_gguf_kv {
    ks_gguf_str key;
    ks_gguf_type type;
    /* scalars (type != ARRAY/STRING): raw little-endian bytes in the file */
    const uint8_t *scalar;
    ks_gguf_str str;            /* type == STRING */
    ks_gguf_type arr_type;      /* type == ARRAY: element type */
    uint64_t arr_n;             /* type == ARRAY: element count */
    const uint8_t *arr_data;    /* scalar arrays: arr_n packed elements */
    ks_gguf_str *arr_strs;      /* string arrays: [arr_n], owned by the reader */
} ks_gguf_kv;

typedef struct ks_gguf_tensor {
    ks_gguf_str name;
    uint32_t n_dims;
    int64_t ne[KS_GGUF_MAX_DIMS]; /* ne[0] = elements per row (innermost); unused dims = 1 */
    ks_dtype type;
    uint64_t offset;              /* relative to the data section */
    const void *data;             /* into the mapping */
    size_t nbytes;
} ks_gguf_tensor;

typedef struct ks_gguf ks_gguf;

/* Open and validate a file (mmap).  KS_ERR_IO / KS_ERR_FORMAT /
 * KS_ERR_UNSUPPORTED (tensor types outside the supported set) with a message. */
ks_status ks_gguf_open(const char *path, ks_gguf **out);
/* As ks_gguf_open; use_mmap=false reads the file into huge-page-advised
 * memory instead of mapping it (faster weight streaming, costs RAM + load time). */
ks_status ks_gguf_open_ex(const char *path, bool use_mmap, ks_gguf **out);
/* Parse a caller-owned buffer (borrowed: must outlive the handle).  Used by
 * the fuzz target and tests. */
ks_status ks_gguf_open_buffer(const void *buf, size_t size, ks_gguf **out);
void ks_gguf_close(ks_gguf *g);

uint32_t ks_gguf_version(const ks_gguf *g);
size_t ks_gguf_file_size(const ks_gguf *g);
uint32_t ks_gguf_alignment(const ks_gguf *g);
int64_t ks_gguf_n_kv(const ks_gguf *g);
const ks_gguf_kv *ks_gguf_kv_at(const ks_gguf *g, int64_t i);
/* NULL if absent. */
const ks_gguf_kv *ks_gguf_find_kv(const ks_gguf *g, const char *key);
int64_t ks_gguf_n_tensors(const ks_gguf *g);
const ks_gguf_tensor *ks_gguf_tensor_at(const ks_gguf *g, int64_t i);
const ks_gguf_tensor *ks_gguf_find_tensor(const ks_gguf *g, const char *name);

/* Typed getters.  KS_ERR_NOT_FOUND if absent (out untouched), KS_ERR_FORMAT if
 * the stored type cannot represent the request (integers of any width are
 * accepted when the value fits). */
ks_status ks_gguf_get_u32(const ks_gguf *g, const char *key, uint32_t *out);
ks_status ks_gguf_get_i32(const ks_gguf *g, const char *key, int32_t *out);
ks_status ks_gguf_get_f32(const ks_gguf *g, const char *key, float *out);
ks_status ks_gguf_get_bool(const ks_gguf *g, const char *key, bool *out);
ks_status ks_gguf_get_str(const ks_gguf *g, const char *key, ks_gguf_str *out);
/* Array: element type and count, data as in ks_gguf_kv. */
ks_status ks_gguf_get_arr(const ks_gguf *g, const char *key, const ks_gguf_kv **out);

/* Element i of a scalar array as double / int64 (any numeric element type). */
double ks_gguf_arr_f64(const ks_gguf_kv *kv, uint64_t i);
int64_t ks_gguf_arr_i64(const ks_gguf_kv *kv, uint64_t i);
/* Size in bytes of one scalar of type t (0 for STRING/ARRAY). */
size_t ks_gguf_type_size(ks_gguf_type t);
const char *ks_gguf_type_name(ks_gguf_type t);
/* Compare a GGUF string with a C string. */
bool ks_gguf_str_eq(ks_gguf_str s, const char *c);

/* ----------------------------------------------------------------- writer */
typedef struct ks_gguf_writer ks_gguf_writer;
/* Produces nbytes of tensor payload into dst.  Return KS_OK or an error. */
typedef ks_status (*ks_gguf_fill_fn)(void *user, void *dst, size_t nbytes);

ks_status ks_gguf_writer_create(ks_gguf_writer **out);
void ks_gguf_writer_destroy(ks_gguf_writer *w);
void ks_gguf_writer_set_u32(ks_gguf_writer *w, const char *key, uint32_t v);
void ks_gguf_writer_set_i32(ks_gguf_writer *w, const char *key, int32_t v);
void ks_gguf_writer_set_f32(ks_gguf_writer *w, const char *key, float v);
void ks_gguf_writer_set_bool(ks_gguf_writer *w, const char *key, bool v);
void ks_gguf_writer_set_str(ks_gguf_writer *w, const char *key, const char *v);
/* Copy a key/value (any type, arrays included) from an open reader. */
void ks_gguf_writer_copy_kv(ks_gguf_writer *w, const ks_gguf_kv *kv);
/* Scalar array of element type t with n elements (data copied). */
void ks_gguf_writer_set_arr(ks_gguf_writer *w, const char *key, ks_gguf_type t, const void *data, uint64_t n);
/* Register a tensor; payload comes from fill(user, dst, nbytes) at write time,
 * or from data (borrowed until write) if fill is NULL. */
ks_status ks_gguf_writer_add_tensor(ks_gguf_writer *w, const char *name, ks_dtype type,
                                    uint32_t n_dims, const int64_t *ne, const void *data,
                                    ks_gguf_fill_fn fill, void *user);
ks_status ks_gguf_writer_write(ks_gguf_writer *w, const char *path);

#ifdef __cplusplus
}
#endif
#endif
