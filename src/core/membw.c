/*
 * membw.c — STREAM-like copy / triad / read kernels over the thread pool.
 *
 * Each thread owns one contiguous slice of every array and touches it first
 * (initialisation runs on the pool too), so on NUMA machines the pages land
 * on the node of the thread that streams them — exactly as the engine's
 * weight rows are split.  Timing brackets one ks_pool_run per kernel; the
 * dispatch cost (microseconds) is noise next to hundreds of MB.
 *
 * The read kernel uses 8 independent vector accumulators: a single running
 * sum is a chain of dependent adds (3-4 cycles each) and would measure FP
 * latency, not memory.  Arrays get MADV_HUGEPAGE where available: most of a
 * cold probe's time is otherwise 4 KiB page faults on first touch (~2 s for
 * 768 MiB on one thread), which is not what we came to measure.  Per-thread sums are written to their own cache line and
 * returned as a checksum so the compiler cannot drop the loop.
 */
#include "core/membw.h"
#include "core/platform.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* SSE-width vectors where GNU C is available: the plain loops are not
 * always vectorised at -O2, and a scalar read loop tops out near 20 GB/s per
 * core — below DRAM bandwidth on a big machine.  Slices are 64-byte aligned,
 * so aligned vector access is safe. */
#if defined(__GNUC__)
typedef float membw_v4 __attribute__((vector_size(16), may_alias));
#define MEMBW_VEC 1
#else
#define MEMBW_VEC 0
#endif

typedef enum { MEMBW_INIT, MEMBW_COPY, MEMBW_TRIAD, MEMBW_READ } membw_kernel;

typedef struct {
    double v;
    char pad[56];
} membw_slot; /* one cache line per thread */

typedef struct {
    float *a, *b, *c;   /* [n] each */
    size_t n;           /* elements per array */
    float s;            /* triad scalar */
    membw_kernel k;
    membw_slot *sums;   /* [nth] */
} membw_job;

static void membw_worker(void *arg, int ith, int nth) {
    membw_job *j = arg;
    /* Slices aligned to 16 floats (one line) so threads never share a line. */
    int64_t l0, l1;
    ks_pool_share((int64_t)(j->n / 16), ith, nth, &l0, &l1);
    size_t i0 = (size_t)l0 * 16, i1 = (size_t)l1 * 16;
    float *restrict a = j->a;
    const float *restrict b = j->b;
    const float *restrict c = j->c;
    switch (j->k) {
    case MEMBW_INIT:
        for (size_t i = i0; i < i1; i++) {
            a[i] = 1.0f;
            j->b[i] = 2.0f;
            j->c[i] = 0.5f;
        }
        break;
#if MEMBW_VEC
    case MEMBW_COPY: {
        membw_v4 *va = (membw_v4 *)(a + i0);
        const membw_v4 *vb = (const membw_v4 *)(b + i0);
        for (size_t i = 0; i < (i1 - i0) / 4; i += 4) {
            va[i] = vb[i];
            va[i + 1] = vb[i + 1];
            va[i + 2] = vb[i + 2];
            va[i + 3] = vb[i + 3];
        }
        break;
    }
    case MEMBW_TRIAD: {
        membw_v4 *va = (membw_v4 *)(a + i0);
        const membw_v4 *vb = (const membw_v4 *)(b + i0), *vc = (const membw_v4 *)(c + i0);
        const float s = j->s;
        const membw_v4 vs = {s, s, s, s};
        for (size_t i = 0; i < (i1 - i0) / 4; i += 4) {
            va[i] = vb[i] + vs * vc[i];
            va[i + 1] = vb[i + 1] + vs * vc[i + 1];
            va[i + 2] = vb[i + 2] + vs * vc[i + 2];
            va[i + 3] = vb[i + 3] + vs * vc[i + 3];
        }
        break;
    }
    case MEMBW_READ: {
        membw_v4 acc[8]; /* [8] independent chains of 4 lanes */
        memset(acc, 0, sizeof acc);
        const membw_v4 *vb = (const membw_v4 *)(b + i0);
        size_t nv = (i1 - i0) / 4, i = 0; /* nv is a multiple of 4 */
        for (; i + 8 <= nv; i += 8)
            for (int u = 0; u < 8; u++) acc[u] += vb[i + u];
        for (; i < nv; i++) acc[i % 8] += vb[i];
        double t = 0.0;
        for (int u = 0; u < 8; u++) t += (double)acc[u][0] + acc[u][1] + acc[u][2] + acc[u][3];
        j->sums[ith].v = t;
        break;
    }
#else
    case MEMBW_COPY:
        for (size_t i = i0; i < i1; i++) a[i] = b[i];
        break;
    case MEMBW_TRIAD: {
        const float s = j->s;
        for (size_t i = i0; i < i1; i++) a[i] = b[i] + s * c[i];
        break;
    }
    case MEMBW_READ: {
        float acc[16] = {0}; /* [16] independent chains */
        for (size_t i = i0; i < i1; i += 16)
            for (int u = 0; u < 16; u++) acc[u] += b[i + u];
        double t = 0.0;
        for (int u = 0; u < 16; u++) t += acc[u];
        j->sums[ith].v = t;
        break;
    }
#endif
    }
}

/* Ask for transparent huge pages on the 2 MiB-aligned interior of p[bytes]. */
static void membw_advise_huge(void *p, size_t bytes) {
    const uintptr_t huge = (uintptr_t)2 << 20;
    uintptr_t lo = ((uintptr_t)p + huge - 1) & ~(huge - 1);
    uintptr_t hi = ((uintptr_t)p + bytes) & ~(huge - 1);
    if (hi > lo) ks_platform_advise_huge((void *)lo, hi - lo); /* advice only (core/platform.c) */
}

/* Best (minimum) time of reps runs of kernel k. */
static double membw_time(ks_pool *pool, membw_job *j, membw_kernel k, int reps) {
    j->k = k;
    double best = INFINITY;
    for (int r = 0; r < reps; r++) {
        double t0 = ks_time_sec();
        ks_pool_run(pool, membw_worker, j);
        double dt = ks_time_sec() - t0;
        if (dt < best) best = dt;
    }
    return best > 1e-9 ? best : 1e-9;
}

ks_status ks_membw_measure(ks_pool *pool, size_t bytes_per_array, int reps, ks_membw_result *out) {
    if (!out) return KS_FAIL(KS_ERR_INVALID_ARG, "membw: out is NULL");
    if (bytes_per_array == 0) bytes_per_array = KS_MEMBW_DEFAULT_BYTES;
    if (reps <= 0) reps = KS_MEMBW_DEFAULT_REPS;
    if (bytes_per_array < 4096 || bytes_per_array > ((size_t)16 << 30))
        return KS_FAIL(KS_ERR_INVALID_ARG, "membw: array size %zu bytes outside [4 KiB, 16 GiB]",
                       bytes_per_array);
    double t_start = ks_time_sec();
    int nth = ks_pool_size(pool);
    membw_job j;
    memset(&j, 0, sizeof j);
    j.n = bytes_per_array / sizeof(float) / 16 * 16;
    j.s = 3.0f;
    j.a = ks_malloc_aligned(j.n * sizeof(float));
    j.b = ks_malloc_aligned(j.n * sizeof(float));
    j.c = ks_malloc_aligned(j.n * sizeof(float));
    j.sums = ks_malloc_aligned((size_t)nth * sizeof *j.sums);
    if (!j.a || !j.b || !j.c || !j.sums) {
        ks_free_aligned(j.a);
        ks_free_aligned(j.b);
        ks_free_aligned(j.c);
        ks_free_aligned(j.sums);
        return KS_FAIL(KS_ERR_NOMEM, "membw: three arrays of %zu bytes", bytes_per_array);
    }
    memset(j.sums, 0, (size_t)nth * sizeof *j.sums);
    membw_advise_huge(j.a, j.n * sizeof(float));
    membw_advise_huge(j.b, j.n * sizeof(float));
    membw_advise_huge(j.c, j.n * sizeof(float));

    j.k = MEMBW_INIT;
    ks_pool_run(pool, membw_worker, &j); /* first touch: page faults stay out of the timings */

    /* Bytes actually covered: whole lines per thread. */
    size_t covered = 0;
    for (int t = 0; t < nth; t++) {
        int64_t l0, l1;
        ks_pool_share((int64_t)(j.n / 16), t, nth, &l0, &l1);
        covered += (size_t)(l1 - l0) * 16;
    }
    double bytes = (double)covered * sizeof(float);

    double t_copy = membw_time(pool, &j, MEMBW_COPY, reps);
    double t_triad = membw_time(pool, &j, MEMBW_TRIAD, reps);
    double t_read = membw_time(pool, &j, MEMBW_READ, reps);

    double checksum = 0.0;
    for (int t = 0; t < nth; t++) checksum += j.sums[t].v;

    ks_membw_result r;
    memset(&r, 0, sizeof r);
    r.copy_gbs = 2.0 * bytes / t_copy * 1e-9;
    r.triad_gbs = 3.0 * bytes / t_triad * 1e-9;
    r.read_gbs = bytes / t_read * 1e-9;
    r.bytes_per_array = (size_t)bytes;
    r.reps = reps;
    r.n_threads = nth;
    r.checksum = checksum;

    ks_free_aligned(j.a);
    ks_free_aligned(j.b);
    ks_free_aligned(j.c);
    ks_free_aligned(j.sums);
    r.seconds = ks_time_sec() - t_start;
    *out = r;
    return KS_OK;
}
