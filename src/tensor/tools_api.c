/*
 * tools_api.c — tensor's part of the public tools API
 * (include/kvsieve_tools.h): the KV row size, an inline of tensor/dtype.h,
 * as a function applications can call (bench sizes its KV need with it).
 */
#include "kvsieve_tools.h"
#include "tensor/dtype.h"

size_t ks_kv_type_row_bytes(ks_kv_type type, int32_t head_dim) { return ks_kv_row_bytes(type, head_dim); }
