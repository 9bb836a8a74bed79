/*
 * backend.h — the seam between the forward pass and the hardware it runs on.
 *
 * A backend is a const table of function pointers (the llama_sampler_i
 * pattern) plus one opaque state pointer per instance.  A table, not a
 * switch on an enum, so that the CUDA backend can live in a separately
 * compiled translation unit (nvcc, C++) that the C core never includes, and
 * a build without CUDA simply never registers it.  Slots are REQUIRED or
 * OPTIONAL; an OPTIONAL slot left NULL means "not offered", and the caller
 * falls back to the CPU path for that op — which is how a backend can be
 * brought up one op at a time.
 *
 * Memory model: a backend owns "device buffers" addressed by plain pointers
 * (void *) that are meaningful only to that backend (host pointers for the
 * CPU backend, device addresses for CUDA).  Byte offsets inside a buffer may
 * be formed with char-pointer arithmetic; the pointers must never be
 * dereferenced by the host unless the backend is the CPU one.  Every
 * pointer argument named dev_* / W / X / Y below is a device pointer of the
 * same backend instance.
 *
 * Ordering: all calls on one instance are issued from one host thread.
 * Compute ops (matmul, attention) are enqueued in order on the backend's
 * compute queue and may return before they finish; synchronous copies wait
 * for all prior work; synchronize() waits for everything.  The optional
 * async host->device copy runs on a separate copy queue so weight or KV
 * uploads can overlap compute; event_wait() orders later compute after it.
 */
#ifndef KS_BACKEND_H
#define KS_BACKEND_H

#include "core/core.h"
#include "tensor/dtype.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ks_backend ks_backend;
typedef struct ks_backend_event ks_backend_event; /* opaque, backend-defined */

typedef struct ks_backend_params {
    int device;    /* device ordinal (CUDA); ignored by the CPU backend */
    ks_pool *pool; /* CPU threads for CPU-side work; borrowed, may be NULL */
} ks_backend_params;

/* Attention for n_q query rows of one sequence against its KV cache:
 *   out[t][h][:] = softmax_j(scale * q[t][h]·k[j][h/g]) · v[j][h/g],
 *   g = n_head / n_head_kv, j over [0, n_kv) (and j <= pos0 + t if causal). */
typedef struct ks_backend_attn {
    const float *q;     /* [n_q][n_head][head_dim] f32, device */
    const void *k;      /* [n_kv][n_head_kv][head_dim] of kv_type, device */
    const void *v;      /* [n_kv][n_head_kv][head_dim] of kv_type, device */
    float *out;         /* [n_q][n_head][head_dim] f32, device */
    int32_t n_q, n_kv, n_head, n_head_kv, head_dim;
    int32_t pos0;       /* position of query row 0 (for causal masking) */
    bool causal;
    ks_dtype kv_type;   /* KS_DTYPE_F16 or KS_DTYPE_Q8_0 */
    float scale;        /* usually 1/sqrt(head_dim) */
} ks_backend_attn;

typedef struct ks_backend_i {
    /* REQUIRED. Short stable name ("cpu", "cuda"); used in logs and --backend. */
    const char *name;

    /* REQUIRED. Create the instance state in be->ctx (streams, handles,
     * scratch).  On failure be->ctx must be left NULL and nothing leaked. */
    ks_status (*init)(ks_backend *be, const ks_backend_params *params);
    /* REQUIRED. Release be->ctx and everything it owns; waits for pending
     * work first.  Called once, only after a successful init. */
    void (*free)(ks_backend *be);

    /* REQUIRED. Device buffer of bytes (> 0), at least 64-byte aligned.
     * Stateless apart from the allocator; a failed allocation is
     * KS_ERR_NOMEM (device memory is the caller's budget, not a bug). */
    ks_status (*buffer_alloc)(ks_backend *be, size_t bytes, void **dev_out);
    /* REQUIRED. Free a buffer from buffer_alloc; NULL is a no-op.  Waits
     * for work that may still use it. */
    void (*buffer_free)(ks_backend *be, void *dev);

    /* REQUIRED. Synchronous copies: return when the bytes have arrived and
     * all earlier work on the instance is complete. */
    ks_status (*copy_to_device)(ks_backend *be, void *dev_dst, const void *host_src, size_t bytes);
    ks_status (*copy_to_host)(ks_backend *be, void *host_dst, const void *dev_src, size_t bytes);

    /* OPTIONAL (all three together). Start a host->device copy on the copy
     * queue and return an event that completes with it.  host_src must stay
     * unchanged until the event completes (and should be pinned memory for
     * true overlap).  The backend keeps the event until event_free. */
    ks_status (*copy_to_device_async)(ks_backend *be, void *dev_dst, const void *host_src,
                                      size_t bytes, ks_backend_event **ev_out);
    /* Make compute issued after this call wait for ev (does not block the host). */
    ks_status (*event_wait)(ks_backend *be, ks_backend_event *ev);
    void (*event_free)(ks_backend *be, ks_backend_event *ev);

    /* OPTIONAL. Whether matmul handles this weight type; NULL or false means
     * use the CPU path. */
    bool (*supports_matmul)(const ks_backend *be, ks_dtype wtype);
    /* OPTIONAL (with supports_matmul). Y[n][rows] = X[n][cols] W[rows][cols]^T,
     * W in wtype with GGUF row layout (row stride ks_dtype_row_bytes), X and
     * Y f32.  May keep scratch in be->ctx, grown on demand. */
    ks_status (*matmul)(ks_backend *be, ks_dtype wtype, const void *W, int64_t rows, int64_t cols,
                        const float *X, int64_t n, float *Y);

    /* OPTIONAL. Attention over a KV buffer (see ks_backend_attn). */
    ks_status (*attention)(ks_backend *be, const ks_backend_attn *args);

    /* REQUIRED. Wait for all work issued on this instance; reports any
     * asynchronous failure that happened since the last call. */
    ks_status (*synchronize)(ks_backend *be);
} ks_backend_i;

/* One backend instance: the table and its state.  Plain struct so a
 * context can embed it. */
struct ks_backend {
    const ks_backend_i *iface;
    void *ctx; /* backend-private state, created by iface->init */
};

/* The CPU backend: always available (host memory, ks_matmul, memcpy). */
const ks_backend_i *ks_backend_cpu(void);
#ifdef KVSIEVE_CUDA
/* The CUDA backend: only in builds with -DKVSIEVE_CUDA=ON. */
const ks_backend_i *ks_backend_cuda(void);
#endif

/* Convenience: be->iface = iface; iface->init(be, params). */
static inline ks_status ks_backend_init(ks_backend *be, const ks_backend_i *iface,
                                        const ks_backend_params *params) {
    be->iface = iface;
    be->ctx = NULL;
    return iface->init(be, params);
}
static inline void ks_backend_free(ks_backend *be) {
    if (be && be->iface && be->ctx) be->iface->free(be);
    if (be) be->ctx = NULL;
}

#ifdef __cplusplus
}
#endif
#endif
