/*
 * torch_bin.h — read the tensors of a `torch.save(state_dict)` file
 * (`pytorch_model.bin`) without running any of it.
 *
 * Since PyTorch 1.6 such a file is a zip archive written without
 * compression: ARCHIVE/data.pkl is a pickle of the state dict, and each
 * tensor's storage is the raw bytes of ARCHIVE/data/KEY.  A pickle is a
 * program for a small stack machine whose GLOBAL and REDUCE opcodes import
 * and call arbitrary Python callables, so loading one with Python's
 * unpickler executes whatever the file says.  This reader is not an
 * unpickler in that sense: it interprets only the protocol-2 opcodes torch
 * writes for a state dict, knows exactly seven globals
 * (collections.OrderedDict, torch._utils._rebuild_tensor_v2 and the Half /
 * BFloat16 / Float / Long / Bool storage types) as inert tags, and builds
 * plain values from them; any other global, any REDUCE on something else,
 * any other opcode is refused with a message naming it.
 *
 * Every tensor it hands out is a contiguous view into the caller's buffer
 * (stored zip entries are contiguous bytes), checked to lie inside its
 * storage, whose zip entry in turn is checked to lie inside the buffer.
 */
#ifndef KS_TORCH_BIN_H
#define KS_TORCH_BIN_H

#include "checkpoint/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ks_torch_tensor {
    char *name;                    /* NUL-terminated, owned by the result */
    ks_st_dtype dtype;             /* F16, BF16, F32, I64 or BOOL */
    int n_dims;
    int64_t shape[KS_ST_MAX_DIMS];
    int64_t n_elem;
    const uint8_t *data;           /* [nbytes] into the caller's buffer; possibly unaligned */
    size_t nbytes;
} ks_torch_tensor;

typedef struct ks_torch_bin {
    ks_torch_tensor *tensors;      /* [n_tensors], in the pickle's order */
    int64_t n_tensors;
} ks_torch_bin;

/* Parse a whole torch.save file held in buf (borrowed: it must outlive the
 * result, whose data pointers point into it).  KS_ERR_FORMAT for a broken
 * or truncated zip / pickle, KS_ERR_UNSUPPORTED for well-formed content this
 * reader refuses (a foreign global, a compressed entry, a non-contiguous
 * tensor, the pre-1.6 format), each with a message. */
ks_status ks_torch_bin_parse(const void *buf, size_t size, ks_torch_bin **out);
void ks_torch_bin_free(ks_torch_bin *b);

#ifdef __cplusplus
}
#endif
#endif
