/*
 * ks_cuda.h — OPTIONAL CUDA code, NOT USED BY THE ENGINE YET.
 *
 * What this is, plainly: a CUDA device handle (two streams, a cuBLAS handle),
 * device buffers, synchronous and asynchronous host<->device copies, and a
 * matmul for F32, F16 and Q8_0 weights (a hand-written Q8_0 decode matvec,
 * cuBLAS GEMMs otherwise).  It is built only as the separate library target
 * `ks_cuda`, and only with -DKVSIEVE_CUDA=ON; `make cuda-check` compiles it
 * with nvcc so that it keeps compiling.  Nothing in the engine calls it:
 * kvsieve, the CLI and the tests never link it, and no code outside
 * src/cuda/ includes this header.  It is the starting point for a GPU path,
 * not a GPU path.
 *
 * Conventions when it is used: every call on one handle comes from one host
 * thread; compute (matmul) is enqueued on the handle's compute stream and may
 * return before it finishes; synchronous copies and ks_cuda_synchronize wait
 * for all earlier work; an async upload runs on a separate copy stream and
 * returns an event that later compute can be ordered after.  Device pointers
 * (dev_*, W, X, Y of the matmul) must never be dereferenced by the host.
 * Failures are KS_ERR_BACKEND (or KS_ERR_NOMEM for device allocations) with
 * the failing CUDA / cuBLAS call in ks_last_error().
 */
#ifndef KS_CUDA_KS_CUDA_H
#define KS_CUDA_KS_CUDA_H

#include "core/core.h"
#include "tensor/dtype.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ks_cuda ks_cuda;             /* one device: streams, cuBLAS, scratch */
typedef struct ks_cuda_event ks_cuda_event; /* completion of an async upload */

/* Open device ordinal `device`; KS_ERR_INVALID_ARG if there is no such device. */
ks_status ks_cuda_create(int device, ks_cuda **out);
/* Waits for pending work, then releases everything; NULL is a no-op. */
void ks_cuda_destroy(ks_cuda *cu);

/* Device buffer of bytes (> 0); KS_ERR_NOMEM when the device is full. */
ks_status ks_cuda_buffer_alloc(ks_cuda *cu, size_t bytes, void **dev_out);
/* NULL is a no-op; waits for work that may still use the buffer. */
void ks_cuda_buffer_free(ks_cuda *cu, void *dev);

/* Synchronous copies: return when the bytes have arrived and all earlier
 * work on the handle is complete. */
ks_status ks_cuda_copy_to_device(ks_cuda *cu, void *dev_dst, const void *host_src, size_t bytes);
ks_status ks_cuda_copy_to_host(ks_cuda *cu, void *host_dst, const void *dev_src, size_t bytes);

/* Start a host->device copy on the copy stream; *ev_out completes with it.
 * host_src must stay unchanged until then (pinned memory for real overlap),
 * and dev_dst must not be read by compute still in flight. */
ks_status ks_cuda_copy_to_device_async(ks_cuda *cu, void *dev_dst, const void *host_src, size_t bytes,
                                       ks_cuda_event **ev_out);
/* Make compute issued after this call wait for ev (does not block the host). */
ks_status ks_cuda_event_wait(ks_cuda *cu, ks_cuda_event *ev);
void ks_cuda_event_free(ks_cuda *cu, ks_cuda_event *ev);

/* Weight types ks_cuda_matmul handles: F32, F16, Q8_0. */
bool ks_cuda_supports_matmul(ks_dtype wtype);
/* Y[n][rows] = X[n][cols] W[rows][cols]^T on the compute stream, W in wtype
 * with GGUF row layout, X and Y f32; all three device pointers. */
ks_status ks_cuda_matmul(ks_cuda *cu, ks_dtype wtype, const void *W, int64_t rows, int64_t cols, const float *X,
                         int64_t n, float *Y);

/* Wait for all work issued on the handle; reports any asynchronous failure
 * since the last call. */
ks_status ks_cuda_synchronize(ks_cuda *cu);

#ifdef __cplusplus
}
#endif
#endif
