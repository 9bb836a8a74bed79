/*
 * eagle3_gen.h — writing EAGLE-3 checkpoints (eagle3_gen.c): a small
 * safetensors writer and the random retrieval head `kvsieve gen-model
 * --dlm-out` writes for a target shape.  It stays in model/, beside the
 * shapes it is generated for (shapes.h), while the draft model it writes is
 * read by draft/eagle3.h.
 */
#ifndef KS_MODEL_EAGLE3_GEN_H
#define KS_MODEL_EAGLE3_GEN_H

#include "draft/eagle3.h"

/* ------------------------------------------------------------ writing -- */
typedef struct ks_st_write_tensor {
    const char *name;
    ks_st_dtype dtype;
    int n_dims;
    int64_t shape[8];
    const void *data;      /* nbytes, little-endian */
    size_t nbytes;
} ks_st_write_tensor;
/* Write a safetensors file (header padded to 8 bytes); metadata_json: an
 * object of strings or NULL.  A failed write leaves no file behind. */
ks_status ks_safetensors_write(const char *path, const ks_st_write_tensor *t, int n, const char *metadata_json);

struct ks_model_shape;
/* A deterministic random EAGLE-3 retrieval head (config.json +
 * model.safetensors, BF16, no embed_tokens) for a target of shape s with
 * n_layer layers (<= 0: the shape's) and n_vocab tokens, for speed benchmarks. */
ks_status ks_eagle3_generate_head(const struct ks_model_shape *s, int32_t n_layer, int32_t n_vocab, int32_t max_pos,
                                  uint64_t seed, const char *dir);

#endif
