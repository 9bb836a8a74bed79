/*
 * fuzz_torch_bin.c — libFuzzer entry point for the torch.save reader.
 *
 * Why: pytorch_model.bin files (the EAGLE authors publish their drafts so)
 * are downloaded, and a pickle is a program: the reader must refuse every
 * opcode and global outside the state-dict subset and never read outside
 * the buffer, whatever the zip directory, the local headers or the pickle
 * say.  A successful parse is touched fully: every tensor byte is read (ASan
 * reports a view past the buffer) and every name's length taken.  Built
 * only with clang and -DKVSIEVE_FUZZ=ON (see CMakeLists.txt); seeds live in
 * tests/fuzz/corpus_torch_bin/ (tools/make_dlm_layouts.py writes them).
 */
#include "checkpoint/torch_bin.h"

#include <stdint.h>
#include <string.h>

static volatile uint64_t g_sink; /* keeps the touches from being optimized away */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ks_torch_bin *b = NULL;
    if (ks_torch_bin_parse(data, size, &b) != KS_OK) return 0;
    uint64_t h = 0;
    for (int64_t i = 0; i < b->n_tensors; i++) {
        const ks_torch_tensor *t = &b->tensors[i];
        for (size_t j = 0; j < t->nbytes; j++) h += t->data[j];
        h += strlen(t->name) + (uint64_t)t->n_elem + (uint64_t)t->n_dims;
        if (t->nbytes != (size_t)t->n_elem * ks_st_dtype_size(t->dtype)) __builtin_trap();
    }
    g_sink = h;
    ks_torch_bin_free(b);
    return 0;
}
