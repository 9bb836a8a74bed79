/*
 * backend_cpu.c — the CPU implementation of the backend seam.
 *
 * "Device" memory is host memory, so copies are memcpy and everything is
 * synchronous; the backend exists so that the forward pass has exactly one
 * code path (through ks_backend_i) whichever hardware runs it, and so that
 * tests of the seam run on machines without a GPU.  Matmul is ks_matmul on
 * the borrowed pool; the only state is the quantized-activation scratch,
 * grown on demand and reused across calls.  The async-copy and attention
 * slots are left NULL: a copy that is done when it returns needs no event,
 * and CPU attention lives with the KV cache code, which knows its layout.
 */
#include "tensor/backend.h"
#include "tensor/matmul.h"

#include <string.h>

typedef struct cpu_ctx {
    ks_pool *pool;       /* borrowed */
    void *scratch;       /* [scratch_bytes] 64-byte aligned, for ks_matmul */
    size_t scratch_bytes;
} cpu_ctx;

static ks_status cpu_init(ks_backend *be, const ks_backend_params *params) {
    cpu_ctx *c = ks_calloc(1, sizeof *c);
    c->pool = params ? params->pool : NULL;
    be->ctx = c;
    return KS_OK;
}

static void cpu_free(ks_backend *be) {
    cpu_ctx *c = be->ctx;
    if (!c) return;
    ks_free_aligned(c->scratch);
    ks_free(c);
    be->ctx = NULL;
}

static ks_status cpu_buffer_alloc(ks_backend *be, size_t bytes, void **dev_out) {
    if (bytes == 0 || !dev_out) return KS_FAIL(KS_ERR_INVALID_ARG, "cpu backend: bad buffer request");
    *dev_out = ks_malloc_aligned(bytes); /* 64-byte aligned, as the seam promises */
    return KS_OK;
}

static void cpu_buffer_free(ks_backend *be, void *dev) { ks_free_aligned(dev); }

static ks_status cpu_copy(ks_backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes == 0) return KS_OK;
    if (!dst || !src) return KS_FAIL(KS_ERR_INVALID_ARG, "cpu backend: NULL copy pointer");
    memcpy(dst, src, bytes);
    return KS_OK;
}

static bool cpu_supports_matmul(const ks_backend *be, ks_dtype wtype) {
    return ks_dtype_is_weight_type((uint32_t)wtype);
}

static ks_status cpu_matmul(ks_backend *be, ks_dtype wtype, const void *W, int64_t rows,
                            int64_t cols, const float *X, int64_t n, float *Y) {
    cpu_ctx *c = be->ctx;
    if (!ks_dtype_is_weight_type((uint32_t)wtype))
        return KS_FAIL(KS_ERR_UNSUPPORTED, "cpu backend: matmul weight type %s", ks_dtype_name(wtype));
    if (rows <= 0 || cols <= 0 || n <= 0 || cols % ks_dtype_block_size(wtype) != 0)
        return KS_FAIL(KS_ERR_INVALID_ARG, "cpu backend: matmul shape rows=%lld cols=%lld n=%lld",
                       (long long)rows, (long long)cols, (long long)n);
    size_t need = ks_matmul_scratch_bytes(wtype, cols, n);
    if (need > c->scratch_bytes) {
        ks_free_aligned(c->scratch);
        c->scratch = ks_malloc_aligned(need);
        c->scratch_bytes = need;
    }
    ks_matmul(c->pool, wtype, W, rows, cols, X, n, Y, c->scratch);
    return KS_OK;
}

static ks_status cpu_synchronize(ks_backend *be) { return KS_OK; }

static const ks_backend_i g_cpu_backend = {
    .name = "cpu",
    .init = cpu_init,
    .free = cpu_free,
    .buffer_alloc = cpu_buffer_alloc,
    .buffer_free = cpu_buffer_free,
    .copy_to_device = cpu_copy,
    .copy_to_host = cpu_copy,
    .copy_to_device_async = NULL,
    .event_wait = NULL,
    .event_free = NULL,
    .supports_matmul = cpu_supports_matmul,
    .matmul = cpu_matmul,
    .attention = NULL,
    .synchronize = cpu_synchronize,
};

const ks_backend_i *ks_backend_cpu(void) { return &g_cpu_backend; }
