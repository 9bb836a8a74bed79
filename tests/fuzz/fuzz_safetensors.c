/*
 * fuzz_safetensors.c — libFuzzer entry point for the safetensors reader.
 *
 * Why: checkpoints (EAGLE-3 drafts among them) are downloaded files, and this
 * reader is the first code that touches them.  A successful open is not the
 * end of the check: every tensor byte it hands out is read (ASan reports a
 * view that reaches past the buffer), every name is looked up again, float
 * tensors are converted to f32 and metadata is walked.  Built only with clang
 * and -DKVSIEVE_FUZZ=ON (see CMakeLists.txt); seeds live in
 * tests/fuzz/corpus_safetensors/.
 */
#include "checkpoint/safetensors.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static volatile uint64_t g_sink; /* keeps the touches from being optimized away */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ks_safetensors *st = NULL;
    if (ks_safetensors_open_buffer(data, size, &st) != KS_OK) return 0;
    uint64_t h = (uint64_t)ks_safetensors_n_shards(st) + ks_safetensors_file_bytes(st);
    for (int64_t i = 0; i < ks_safetensors_count(st); i++) {
        const ks_st_tensor *t = ks_safetensors_at(st, i);
        const uint8_t *d = t->data;
        for (size_t j = 0; j < t->nbytes; j++) h += d[j];
        h += strlen(t->name) + ks_st_dtype_size(t->dtype) + (uint64_t)t->n_elem;
        h += (uint64_t)(ks_safetensors_find(st, t->name) == t);
        char sb[256];
        h += strlen(ks_st_shape_str(t->n_dims, t->shape, sb, sizeof sb));
        if (t->dtype == KS_ST_F32 || t->dtype == KS_ST_F16 || t->dtype == KS_ST_BF16 || t->dtype == KS_ST_F64) {
            float *f = NULL;
            if (ks_safetensors_to_f32(t, 0, NULL, &f) == KS_OK) {
                for (int64_t j = 0; j < t->n_elem; j++) h += (uint64_t)(f[j] == f[j]);
                ks_free(f);
            }
            int64_t want[1] = {t->n_elem};
            if (ks_safetensors_to_f32(t, 1, want, &f) == KS_OK) ks_free(f);
        }
    }
    for (int64_t i = 0; i < ks_safetensors_n_metadata(st); i++) {
        const char *k, *v;
        ks_safetensors_metadata_at(st, i, &k, &v);
        h += strlen(k) + strlen(v) + (uint64_t)(ks_safetensors_metadata(st, k) != NULL);
    }
    g_sink += h;
    ks_safetensors_close(st);
    return 0;
}
