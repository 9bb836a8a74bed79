/*
 * ks_cuda.cu — the optional CUDA code (cuda/ks_cuda.h): compile-checked by
 * `make cuda-check`, not used by the engine yet.
 *
 * Why it looks the way it does:
 *   - Two streams.  Compute (cuBLAS, kernels) runs on one; optional async
 *     uploads run on another so that streaming the next layer's weights or a
 *     KV page over PCIe can overlap the current layer's math.  An event
 *     recorded on the copy stream and waited on by the compute stream orders
 *     them without blocking the host.
 *   - cuBLAS for f32/f16.  Row-major Y[n][rows] = X[n][cols] W[rows][cols]^T
 *     is, read column-major, C(rows x n) = op_T(W as cols x rows) * X(cols x n),
 *     so no transposes are materialised.  cuBLAS has no f16 x f32 GEMM, so X
 *     is converted to f16 in scratch; accumulation stays f32.
 *   - Q8_0 decode (n <= 8) is a hand-written warp-per-row matvec: decode is
 *     bandwidth-bound and each weight byte should cross the bus once for the
 *     whole batch.  Larger n (prefill) dequantises row tiles to f16 and uses
 *     GEMM, where tensor cores pay for the extra pass.
 *   - Every CUDA/cuBLAS call is checked; failures become KS_ERR_BACKEND with
 *     the call text and file:line (KS_FAIL), because an accelerator error
 *     leaves the handle unusable and the message is all the user gets.
 *
 * It began as the CUDA side of a backend function table that no engine path
 * ever called; the table is gone and these are plain functions, so that
 * wiring a GPU path in later starts from what it needs rather than from a
 * seam designed in advance.  The C headers carry their own extern "C"
 * guards.  Built only with -DKVSIEVE_CUDA=ON; the device is selected at
 * create (cudaSetDevice) and all calls on a handle must come from one host
 * thread.
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/ks_cuda.h"

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

/* ------------------------------------------------------------ checking -- */

#define KS_CUDA_CHECK(call)                                                                    \
    do {                                                                                       \
        cudaError_t ks_cu_e_ = (call);                                                         \
        if (ks_cu_e_ != cudaSuccess)                                                           \
            return KS_FAIL(ks_cu_e_ == cudaErrorMemoryAllocation ? KS_ERR_NOMEM : KS_ERR_BACKEND, \
                           "%s failed: %s (%s)", #call, cudaGetErrorName(ks_cu_e_),            \
                           cudaGetErrorString(ks_cu_e_));                                      \
    } while (0)

#define KS_CUBLAS_CHECK(call)                                                                  \
    do {                                                                                       \
        cublasStatus_t ks_cb_e_ = (call);                                                      \
        if (ks_cb_e_ != CUBLAS_STATUS_SUCCESS)                                                 \
            return KS_FAIL(KS_ERR_BACKEND, "%s failed: %s (%s)", #call,                        \
                           cublasGetStatusName(ks_cb_e_), cublasGetStatusString(ks_cb_e_));    \
    } while (0)

/* For paths that cannot return a status (free): log and go on. */
#define KS_CUDA_WARN(call)                                                                     \
    do {                                                                                       \
        cudaError_t ks_cu_e_ = (call);                                                         \
        if (ks_cu_e_ != cudaSuccess)                                                           \
            ks_log(KS_LOG_WARN, "%s:%d: %s failed: %s", __FILE__, __LINE__, #call,             \
                   cudaGetErrorString(ks_cu_e_));                                              \
    } while (0)

/* Kernel launches report configuration errors through cudaGetLastError. */
#define KS_CUDA_CHECK_LAUNCH() KS_CUDA_CHECK(cudaGetLastError())

/* --------------------------------------------------------------- state -- */

struct ks_cuda {
    int device;
    cudaStream_t compute; /* cuBLAS and kernels */
    cudaStream_t copy;    /* async uploads */
    cublasHandle_t blas;  /* bound to compute */
    void *scratch;        /* [scratch_bytes] device: f16 activations + f16 weight tiles */
    size_t scratch_bytes;
};

struct ks_cuda_event {
    cudaEvent_t ev;
};

static void cuda_release(ks_cuda *c) {
    if (!c) return;
    if (c->compute) KS_CUDA_WARN(cudaStreamSynchronize(c->compute));
    if (c->copy) KS_CUDA_WARN(cudaStreamSynchronize(c->copy));
    if (c->blas) cublasDestroy(c->blas);
    if (c->scratch) KS_CUDA_WARN(cudaFree(c->scratch));
    if (c->copy) KS_CUDA_WARN(cudaStreamDestroy(c->copy));
    if (c->compute) KS_CUDA_WARN(cudaStreamDestroy(c->compute));
    ks_free(c);
}

static ks_status cuda_init_into(ks_cuda *c, int device) {
    int n_dev = 0;
    KS_CUDA_CHECK(cudaGetDeviceCount(&n_dev));
    if (device < 0 || device >= n_dev)
        return KS_FAIL(KS_ERR_INVALID_ARG, "cuda: device %d not in [0, %d)", device, n_dev);
    c->device = device;
    KS_CUDA_CHECK(cudaSetDevice(device));
    KS_CUDA_CHECK(cudaStreamCreateWithFlags(&c->compute, cudaStreamNonBlocking));
    KS_CUDA_CHECK(cudaStreamCreateWithFlags(&c->copy, cudaStreamNonBlocking));
    KS_CUBLAS_CHECK(cublasCreate(&c->blas));
    KS_CUBLAS_CHECK(cublasSetStream(c->blas, c->compute));
    return KS_OK;
}

ks_status ks_cuda_create(int device, ks_cuda **out) {
    if (!out) return KS_FAIL(KS_ERR_INVALID_ARG, "cuda: out is NULL");
    ks_cuda *c = (ks_cuda *)ks_calloc(1, sizeof *c);
    ks_status st = cuda_init_into(c, device);
    if (st != KS_OK) {
        cuda_release(c);
        return st;
    }
    *out = c;
    return KS_OK;
}

void ks_cuda_destroy(ks_cuda *cu) { cuda_release(cu); }

/* Grow the scratch buffer to at least bytes (contents not kept). */
static ks_status cuda_scratch(ks_cuda *c, size_t bytes, void **out) {
    if (bytes > c->scratch_bytes) {
        if (c->scratch) {
            KS_CUDA_CHECK(cudaStreamSynchronize(c->compute)); /* old scratch may be in use */
            KS_CUDA_CHECK(cudaFree(c->scratch));
            c->scratch = NULL;
            c->scratch_bytes = 0;
        }
        KS_CUDA_CHECK(cudaMalloc(&c->scratch, bytes));
        c->scratch_bytes = bytes;
    }
    *out = c->scratch;
    return KS_OK;
}

/* ------------------------------------------------------------- buffers -- */

ks_status ks_cuda_buffer_alloc(ks_cuda *cu, size_t bytes, void **dev_out) {
    (void)cu;
    if (bytes == 0 || !dev_out) return KS_FAIL(KS_ERR_INVALID_ARG, "cuda: bad buffer request");
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* an OOM is not sticky; clear it for later checks */
        return KS_FAIL(e == cudaErrorMemoryAllocation ? KS_ERR_NOMEM : KS_ERR_BACKEND,
                       "cudaMalloc(%zu) failed: %s", bytes, cudaGetErrorString(e));
    }
    *dev_out = p;
    return KS_OK;
}

void ks_cuda_buffer_free(ks_cuda *cu, void *dev) {
    (void)cu;
    if (dev) KS_CUDA_WARN(cudaFree(dev)); /* cudaFree waits for work using it */
}

static ks_status cuda_sync_all(ks_cuda *c) {
    KS_CUDA_CHECK(cudaStreamSynchronize(c->copy));
    KS_CUDA_CHECK(cudaStreamSynchronize(c->compute));
    return KS_OK;
}

ks_status ks_cuda_copy_to_device(ks_cuda *c, void *dev_dst, const void *host_src, size_t bytes) {
    if (bytes == 0) return KS_OK;
    KS_CUDA_CHECK(cudaMemcpyAsync(dev_dst, host_src, bytes, cudaMemcpyHostToDevice, c->compute));
    return cuda_sync_all(c);
}

ks_status ks_cuda_copy_to_host(ks_cuda *c, void *host_dst, const void *dev_src, size_t bytes) {
    if (bytes == 0) return KS_OK;
    KS_CUDA_CHECK(cudaMemcpyAsync(host_dst, dev_src, bytes, cudaMemcpyDeviceToHost, c->compute));
    return cuda_sync_all(c);
}

/* The destination must not be read by compute still in flight: the copy
 * stream does not wait for the compute stream. */
ks_status ks_cuda_copy_to_device_async(ks_cuda *c, void *dev_dst, const void *host_src, size_t bytes,
                                       ks_cuda_event **ev_out) {
    if (!ev_out) return KS_FAIL(KS_ERR_INVALID_ARG, "cuda: ev_out is NULL");
    ks_cuda_event *ev = (ks_cuda_event *)ks_calloc(1, sizeof *ev);
    cudaError_t e = cudaEventCreateWithFlags(&ev->ev, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        ks_free(ev);
        return KS_FAIL(KS_ERR_BACKEND, "cudaEventCreateWithFlags failed: %s", cudaGetErrorString(e));
    }
    if (bytes > 0) e = cudaMemcpyAsync(dev_dst, host_src, bytes, cudaMemcpyHostToDevice, c->copy);
    if (e == cudaSuccess) e = cudaEventRecord(ev->ev, c->copy);
    if (e != cudaSuccess) {
        cudaEventDestroy(ev->ev);
        ks_free(ev);
        return KS_FAIL(KS_ERR_BACKEND, "async upload of %zu bytes failed: %s", bytes,
                       cudaGetErrorString(e));
    }
    *ev_out = ev;
    return KS_OK;
}

ks_status ks_cuda_event_wait(ks_cuda *c, ks_cuda_event *ev) {
    if (!ev) return KS_FAIL(KS_ERR_INVALID_ARG, "cuda: NULL event");
    KS_CUDA_CHECK(cudaStreamWaitEvent(c->compute, ev->ev, 0));
    return KS_OK;
}

void ks_cuda_event_free(ks_cuda *cu, ks_cuda_event *ev) {
    (void)cu;
    if (!ev) return;
    KS_CUDA_WARN(cudaEventDestroy(ev->ev)); /* safe while pending: released on completion */
    ks_free(ev);
}

/* ------------------------------------------------------------- kernels -- */

/* dst[i] = (half)src[i], i < n */
static __global__ void ks_cuda_f32_to_f16(const float *__restrict__ src, __half *__restrict__ dst, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride) dst[i] = __float2half(src[i]);
}

/* dst[r][c] = W[r][c] as f16 for r < nrows: Q8_0 rows of nblk blocks. */
static __global__ void ks_cuda_q8_0_to_f16(const ks_block_q8_0 *__restrict__ W, int64_t nrows, int64_t nblk,
                                    __half *__restrict__ dst) {
    int64_t n = nrows * nblk * KS_QK8_0;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride) {
        const ks_block_q8_0 *b = W + i / KS_QK8_0; /* rows are contiguous: block index = i / 32 */
        float d = __half2float(__ushort_as_half(b->d));
        dst[i] = __float2half(d * (float)b->qs[i % KS_QK8_0]);
    }
}

#define KS_CUDA_Q8_MAX_N 8
#define KS_CUDA_WARPS_PER_BLOCK 4

/* Y[s][row] = sum_c W[row][c] X[s][c] for s < n <= 8: one warp per row, lane
 * j takes element j of every 32-element block (coalesced 32-byte loads of
 * qs; the scale is a broadcast).  Each weight byte is read once for all n. */
static __global__ void ks_cuda_q8_0_matvec(const ks_block_q8_0 *__restrict__ W, int64_t rows, int64_t nblk,
                                    const float *__restrict__ X, int n, float *__restrict__ Y) {
    const int lane = threadIdx.x % 32;
    const int64_t row = (int64_t)blockIdx.x * KS_CUDA_WARPS_PER_BLOCK + threadIdx.x / 32;
    if (row >= rows) return; /* whole warp exits together */
    const int64_t cols = nblk * KS_QK8_0;
    const ks_block_q8_0 *w = W + row * nblk;
    float acc[KS_CUDA_Q8_MAX_N]; /* [n] partial sums, kept in registers by the unrolled loops */
#pragma unroll
    for (int s = 0; s < KS_CUDA_Q8_MAX_N; s++) acc[s] = 0.0f;
    for (int64_t b = 0; b < nblk; b++) {
        const float wv = __half2float(__ushort_as_half(w[b].d)) * (float)w[b].qs[lane];
        const int64_t c = b * KS_QK8_0 + lane;
#pragma unroll
        for (int s = 0; s < KS_CUDA_Q8_MAX_N; s++)
            if (s < n) acc[s] += wv * X[s * cols + c];
    }
#pragma unroll
    for (int s = 0; s < KS_CUDA_Q8_MAX_N; s++) {
        if (s >= n) break;
        float v = acc[s];
        for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
        if (lane == 0) Y[(int64_t)s * rows + row] = v;
    }
}

static unsigned ks_cuda_grid_1d(int64_t n, int block) {
    int64_t g = (n + block - 1) / block;
    return (unsigned)(g < 65535 * 16 ? (g > 0 ? g : 1) : 65535 * 16); /* grid-stride loops cover the rest */
}

/* -------------------------------------------------------------- matmul -- */

bool ks_cuda_supports_matmul(ks_dtype wtype) {
    return wtype == KS_DTYPE_F32 || wtype == KS_DTYPE_F16 || wtype == KS_DTYPE_Q8_0;
}

/* Column-major view: C(m x n, ldc) = op_T(A: k x m, lda=k) * B(k x n, ldb=k). */
static ks_status cuda_gemm_tn(ks_cuda *c, cudaDataType ab_type, const void *A, const void *B,
                              float *C, int m, int n, int k, int ldc) {
    const float alpha = 1.0f, beta = 0.0f;
    KS_CUBLAS_CHECK(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, A, ab_type, k, B,
                                 ab_type, k, &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT));
    return KS_OK;
}

ks_status ks_cuda_matmul(ks_cuda *c, ks_dtype wtype, const void *W, int64_t rows, int64_t cols, const float *X,
                         int64_t n, float *Y) {
    if (!ks_cuda_supports_matmul(wtype))
        return KS_FAIL(KS_ERR_UNSUPPORTED, "cuda: matmul weight type %s", ks_dtype_name(wtype));
    if (rows <= 0 || cols <= 0 || n <= 0 || rows > INT32_MAX || cols > INT32_MAX || n > INT32_MAX ||
        cols % ks_dtype_block_size(wtype) != 0)
        return KS_FAIL(KS_ERR_INVALID_ARG, "cuda: matmul shape rows=%lld cols=%lld n=%lld",
                       (long long)rows, (long long)cols, (long long)n);
    const int m = (int)rows, nn = (int)n, k = (int)cols;

    if (wtype == KS_DTYPE_F32) return cuda_gemm_tn(c, CUDA_R_32F, W, X, Y, m, nn, k, m);

    if (wtype == KS_DTYPE_Q8_0 && n <= KS_CUDA_Q8_MAX_N) {
        const int64_t nblk = cols / KS_QK8_0;
        const unsigned grid = (unsigned)((rows + KS_CUDA_WARPS_PER_BLOCK - 1) / KS_CUDA_WARPS_PER_BLOCK);
        ks_cuda_q8_0_matvec<<<grid, 32 * KS_CUDA_WARPS_PER_BLOCK, 0, c->compute>>>(
            (const ks_block_q8_0 *)W, rows, nblk, X, (int)n, Y);
        KS_CUDA_CHECK_LAUNCH();
        return KS_OK;
    }

    /* f16 GEMM: X -> f16 at the front of scratch; for Q8_0 a tile of W rows
     * is dequantised to f16 behind it (tiles of <= 64 MiB). */
    const size_t x16_bytes = ((size_t)n * (size_t)cols * sizeof(__half) + 255) & ~(size_t)255;
    int64_t tile_rows = rows;
    if (wtype == KS_DTYPE_Q8_0) {
        tile_rows = (int64_t)(((size_t)64 << 20) / ((size_t)cols * sizeof(__half)));
        if (tile_rows < 1) tile_rows = 1;
        if (tile_rows > rows) tile_rows = rows;
    }
    const size_t w16_bytes =
        wtype == KS_DTYPE_Q8_0 ? (size_t)tile_rows * (size_t)cols * sizeof(__half) : 0;
    void *scratch = NULL;
    KS_TRY(cuda_scratch(c, x16_bytes + w16_bytes, &scratch));
    __half *x16 = (__half *)scratch;
    const int64_t nx = n * cols;
    ks_cuda_f32_to_f16<<<ks_cuda_grid_1d(nx, 256), 256, 0, c->compute>>>(X, x16, nx);
    KS_CUDA_CHECK_LAUNCH();

    if (wtype == KS_DTYPE_F16) return cuda_gemm_tn(c, CUDA_R_16F, W, x16, Y, m, nn, k, m);

    __half *w16 = (__half *)((char *)scratch + x16_bytes);
    const int64_t nblk = cols / KS_QK8_0;
    for (int64_t r0 = 0; r0 < rows; r0 += tile_rows) {
        const int64_t nr = rows - r0 < tile_rows ? rows - r0 : tile_rows;
        const ks_block_q8_0 *wt = (const ks_block_q8_0 *)W + r0 * nblk;
        ks_cuda_q8_0_to_f16<<<ks_cuda_grid_1d(nr * cols, 256), 256, 0, c->compute>>>(wt, nr, nblk, w16);
        KS_CUDA_CHECK_LAUNCH();
        /* Rows r0.. of Y's column-major (rows x n) view start at Y + r0, ldc = rows. */
        KS_TRY(cuda_gemm_tn(c, CUDA_R_16F, w16, x16, Y + r0, (int)nr, nn, k, m));
    }
    return KS_OK;
}

ks_status ks_cuda_synchronize(ks_cuda *c) {
    KS_TRY(cuda_sync_all(c));
    KS_CUDA_CHECK(cudaGetLastError()); /* sticky errors from kernels */
    return KS_OK;
}
