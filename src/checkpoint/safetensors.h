/*
 * safetensors.h — validated reader for the safetensors format (single files
 * and sharded checkpoints).
 *
 * A safetensors file is an 8-byte little-endian header length N, N bytes of
 * JSON ({"name": {"dtype", "shape", "data_offsets": [begin, end]}, optional
 * "__metadata__": {str: str}}), then the data section; offsets are relative to
 * its start.  Hugging Face checkpoints (EAGLE-3 draft models among them) ship
 * in this format, so like the GGUF reader this one treats the file as hostile:
 * the header length is bounded by the file size before anything is parsed,
 * the JSON goes through cJSON with an explicit length, every dtype must be
 * known, shape product * element size must equal end - begin (computed with
 * overflow checks), every extent must lie in the data section, tensors may not
 * overlap and names must be unique (across shards too).  Only then is a
 * pointer into the file handed out.
 *
 * Ownership: the handle owns the mapping (or the heap copy when use_mmap is
 * false), the tensor table and the names; everything it returns stays valid
 * until ks_safetensors_close.  Tensor data pointers may be unaligned (the
 * header length is arbitrary): read them with memcpy, or convert with
 * ks_safetensors_to_f32, which does.
 */
#ifndef KS_SAFETENSORS_H
#define KS_SAFETENSORS_H

#include "core/core.h"

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KS_ST_MAX_DIMS 8
/* The reference implementation refuses headers above 100 MB; so do we. */
#define KS_ST_MAX_HEADER ((uint64_t)100 << 20)

typedef enum ks_st_dtype {
    KS_ST_BOOL, KS_ST_U8, KS_ST_I8, KS_ST_F8_E4M3, KS_ST_F8_E5M2,
    KS_ST_I16, KS_ST_U16, KS_ST_F16, KS_ST_BF16,
    KS_ST_I32, KS_ST_U32, KS_ST_F32,
    KS_ST_I64, KS_ST_U64, KS_ST_F64,
    KS_ST_DTYPE_COUNT_
} ks_st_dtype;

typedef struct ks_st_tensor {
    const char *name;              /* NUL-terminated, owned by the handle */
    ks_st_dtype dtype;
    int n_dims;                    /* 0 = scalar */
    int64_t shape[KS_ST_MAX_DIMS]; /* [n_dims], outermost first (PyTorch order); unused = 0 */
    int64_t n_elem;
    const void *data;              /* [nbytes] into the mapping; possibly unaligned */
    size_t nbytes;
    int shard;                     /* index of the file it lives in */
} ks_st_tensor;

typedef struct ks_safetensors ks_safetensors;

/* Open path: a .safetensors file, a *.safetensors.index.json (opens every
 * shard named by its weight_map), or a directory holding either
 * model.safetensors.index.json or model.safetensors.  use_mmap=false reads
 * the files into memory instead of mapping them.  KS_ERR_IO / KS_ERR_FORMAT /
 * KS_ERR_UNSUPPORTED with a message naming the file. */
ks_status ks_safetensors_open(const char *path, bool use_mmap, ks_safetensors **out);
/* Parse a caller-owned buffer (borrowed: must outlive the handle).  For the
 * fuzz target and tests. */
ks_status ks_safetensors_open_buffer(const void *buf, size_t size, ks_safetensors **out);
void ks_safetensors_close(ks_safetensors *st);

/* Tensors are kept sorted by name (lookups are binary searches). */
int64_t ks_safetensors_count(const ks_safetensors *st);
const ks_st_tensor *ks_safetensors_at(const ks_safetensors *st, int64_t i);
/* NULL if absent. */
const ks_st_tensor *ks_safetensors_find(const ks_safetensors *st, const char *name);
int ks_safetensors_n_shards(const ks_safetensors *st);
/* Total bytes of the files. */
size_t ks_safetensors_file_bytes(const ks_safetensors *st);

/* "__metadata__" entries, sorted by key (merged over shards; the first
 * occurrence of a repeated key wins). */
int64_t ks_safetensors_n_metadata(const ks_safetensors *st);
void ks_safetensors_metadata_at(const ks_safetensors *st, int64_t i, const char **key, const char **value);
/* NULL if absent. */
const char *ks_safetensors_metadata(const ks_safetensors *st, const char *key);

const char *ks_st_dtype_name(ks_st_dtype t); /* "F32", ...; "?" if unknown */
size_t ks_st_dtype_size(ks_st_dtype t);       /* bytes per element; 0 if unknown */
bool ks_st_dtype_from_name(const char *name, ks_st_dtype *out);

/* Writes "[4096, 8192]" into buf (truncated to cap). */
const char *ks_st_shape_str(int n_dims, const int64_t *shape, char *buf, size_t cap);

/* Convert a float tensor (F32/F16/BF16/F64) to a new ks_malloc'd f32 array
 * (release with ks_free).  If expect_shape is non-NULL the tensor must have
 * exactly expect_dims dimensions of those sizes, else KS_ERR_FORMAT with
 * "tensor X has shape [..], expected [..]".  Other dtypes: KS_ERR_UNSUPPORTED. */
ks_status ks_safetensors_to_f32(const ks_st_tensor *t, int expect_dims, const int64_t *expect_shape,
                                float **out);
/* Convert n elements of a float dtype at src (any alignment) to f32. */
void ks_st_convert_f32(ks_st_dtype t, const void *src, float *dst, int64_t n);
/* find + shape check + convert; KS_ERR_NOT_FOUND if the name is absent. */
ks_status ks_safetensors_load_f32(const ks_safetensors *st, const char *name, int expect_dims,
                                  const int64_t *expect_shape, float **out);

#ifdef __cplusplus
}
#endif
#endif
