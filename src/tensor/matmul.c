/*
 * matmul.c — Y[n][rows] = X[n][cols] W^T for every weight type: the driver,
 * kernel choice by SIMD level (ks_simd_current(), core/simd.h), activation
 * quantization and the scalar kernels.
 *
 * Why it is shaped this way.  Decode multiplies a handful of activation
 * vectors by matrices far larger than any cache, so the cost is the time to
 * stream W from DRAM once; arithmetic only has to keep up.  Hence:
 *   - rows are split across threads in contiguous, 16-row aligned ranges, so
 *     each core reads one sequential stream the hardware prefetcher follows;
 *   - a weight row is dotted against all n vectors (in tiles of up to 4
 *     vectors) while it is still in L1, so W is read from memory once per
 *     call whatever n is; when n vectors outgrow L1 they are taken in groups
 *     that fit (at most 16) and the rows in L2-sized chunks, so batched
 *     decode and prefill stay cache friendly too;
 *   - X is quantized once per call into scratch (int8 + f32 scale per 32, or
 *     Q8_K per 256), so the inner loops are integer dot products with the two
 *     block scales applied once per block in f32.  The Q8_0 partner uses a
 *     private split layout (all int8 first, then f32 scales) instead of
 *     ks_block_q8_0: it is never stored, and aligned int8 runs plus f32 scales
 *     save a conversion per block in the hottest loop.  At the AVX-512 level Q8_0 and
 *     Q4_0 use a grouped partner instead (4 blocks per zmm, lane order,
 *     expanded scales, weight-offset correction; see matmul_x86.c), about
 *     2x fewer vector ops per MAC.  Q4_K and Q6_K keep the ordinary Q8_K
 *     partner at every level; their AVX-512 kernels read it as four zmm per
 *     super-block (per-lane sub-block scales, SIMD scale unpacking).
 * The scalar kernels below are the reference: the SIMD kernels (AVX2+FMA and
 * AVX-512 VNNI, compiled from matmul_x86.c with target attributes so the
 * library needs no -march flag) must agree with them to float rounding, which
 * tests/test_matmul.c checks for every level the CPU has.
 */
#include "tensor/matmul.h"

#include "core/simd.h"

#include <math.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>

/* A kernel dots one weight row with nc (1..KS_MM_NC) quantized activation
 * vectors xq + c*xs and stores the results at y[c*ys]. */
typedef void (*ks_mm_kern)(const uint8_t *w, const uint8_t *xq, size_t xs, int nc, int64_t cols,
                           float *y, int64_t ys);

/* Optional two-row form: rows w and w + wrow, results at y[c*ys] and
 * y[c*ys + 1]; kernels with one share each activation load by both rows. */
typedef void (*ks_mm_kern2)(const uint8_t *w, size_t wrow, const uint8_t *xq, size_t xs, int nc,
                            int64_t cols, float *y, int64_t ys);

#define KS_MM_NC 4     /* vectors per kernel call */
#define KS_MM_VG 16    /* most vectors per group (L2 reuse for large n) */
#define KS_MM_GROUP_L1 (20 * 1024) /* activation bytes a group may keep in L1 */
#define KS_MM_ROWS 16  /* row alignment of the thread split */
#define KS_MM_CHUNK_BYTES (192 * 1024) /* weight bytes per row chunk (L2) */

static inline size_t ks_mm_align64(size_t x) { return (x + 63) & ~(size_t)63; }

/* ------------------------------------------------ activation quantization --
 * Q8 partner layout, per vector: int8 q[cols] (padded to 64 B), then
 * float d[cols/32] (padded to 64 B).  Values are kept in [-127, 127] so the
 * SIMD sign trick (negating activations) can never overflow. */
static size_t ks_mm_q8_stride(int64_t cols) {
    return ks_mm_align64((size_t)cols) + ks_mm_align64((size_t)(cols / KS_QK8_0) * sizeof(float));
}

static void ks_mm_quantize_q8(const float *x, uint8_t *dst, int64_t cols) {
    int8_t *q = (int8_t *)dst;
    float *ds = (float *)(dst + ks_mm_align64((size_t)cols));
    for (int64_t b = 0; b < cols / KS_QK8_0; b++) {
        const float *xb = x + b * KS_QK8_0;
        float amax = 0.0f;
        for (int i = 0; i < KS_QK8_0; i++) amax = fmaxf(amax, fabsf(xb[i]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        ds[b] = d;
        for (int i = 0; i < KS_QK8_0; i++) q[b * KS_QK8_0 + i] = (int8_t)lrintf(xb[i] * id);
    }
}

/* AVX-512 grouped Q8 partner (see matmul_x86.c): 256 bytes per group of
 * four 32-blocks, in dpbusd lane order with expanded scales and the weight
 * offset correction.  Used only at that level, by Q8_0 and Q4_0. */
#define KS_MM_Q8X_GROUP 256
static size_t ks_mm_q8x_stride(int64_t cols) {
    return (size_t)((cols / KS_QK8_0 + 3) / 4) * KS_MM_Q8X_GROUP;
}

/* Partner of the transposed Q8_0 panels: int8 q[cols], f32 d[nb], int32
 * corr[nb] (matmul_x86.c, "Q8_0 transposed panels"). */
static size_t ks_mm_q8t_stride(int64_t cols) {
    return ks_mm_align64((size_t)cols) + 2 * ks_mm_align64((size_t)(cols / KS_QK8_0) * 4);
}

static size_t ks_mm_q8k_stride(int64_t cols) {
    return ks_mm_align64((size_t)(cols / KS_QK_K) * sizeof(ks_block_q8_k));
}

/* Partner layout of a weight type; 0 = none (float weights dot f32 X). */
typedef enum { KS_MM_XF32 = 0, KS_MM_XQ8, KS_MM_XQ8K } ks_mm_xkind;

static ks_mm_xkind ks_mm_xkind_of(ks_dtype t) {
    switch (t) {
    case KS_DTYPE_Q8_0:
    case KS_DTYPE_Q4_0: return KS_MM_XQ8;
    case KS_DTYPE_Q4_K:
    case KS_DTYPE_Q6_K: return KS_MM_XQ8K;
    default: return KS_MM_XF32;
    }
}

size_t ks_matmul_scratch_bytes(ks_dtype wtype, int64_t cols, int64_t n) {
    KS_ASSERT(ks_dtype_is_weight_type((uint32_t)wtype));
    switch (ks_mm_xkind_of(wtype)) {
    case KS_MM_XQ8: { /* the level may change after sizing: fit every layout */
        size_t a = ks_mm_q8_stride(cols), b = ks_mm_q8x_stride(cols), t = ks_mm_q8t_stride(cols);
        if (b > a) a = b;
        return (size_t)n * (t > a ? t : a);
    }
    case KS_MM_XQ8K: return (size_t)n * ks_mm_q8k_stride(cols);
    default: return 0;
    }
}

/* --------------------------------------------------------- scalar kernels -- */

/* f32 / f16 / bf16 weights: a plain dot product per column, each weight
 * widened by CONV (nothing for f32) */
#define KS_MM_FLOAT_SCALAR(NAME, WT, CONV)                                                             \
    static void NAME(const uint8_t *w, const uint8_t *xq, size_t xs, int nc, int64_t cols, float *y,  \
                     int64_t ys) {                                                                     \
        const WT *wr = (const WT *)w;                                                                  \
        for (int c = 0; c < nc; c++) {                                                                 \
            const float *x = (const float *)(xq + c * xs);                                             \
            float s = 0.0f;                                                                            \
            for (int64_t i = 0; i < cols; i++) s += CONV(wr[i]) * x[i];                                \
            y[c * ys] = s;                                                                             \
        }                                                                                              \
    }
KS_MM_FLOAT_SCALAR(ks_mm_f32_scalar, float, )
KS_MM_FLOAT_SCALAR(ks_mm_f16_scalar, ks_f16, ks_f16_to_f32)
KS_MM_FLOAT_SCALAR(ks_mm_bf16_scalar, ks_bf16, ks_bf16_to_f32)
#undef KS_MM_FLOAT_SCALAR

/* Q8_0 / Q4_0 weights against q8 activations ([cols] int8, then a 64-byte
 * aligned [cols / 32] f32 scales): an integer dot per 32-block (DOT), scaled
 * once by both blocks' scales */
static inline int32_t ks_mm_dot_q8_0(const ks_block_q8_0 *wb, const int8_t *qb) {
    int32_t isum = 0;
    for (int i = 0; i < KS_QK8_0; i++) isum += wb->qs[i] * qb[i];
    return isum;
}

static inline int32_t ks_mm_dot_q4_0(const ks_block_q4_0 *wb, const int8_t *qb) {
    int32_t isum = 0;
    for (int i = 0; i < 16; i++) isum += ((wb->qs[i] & 0xF) - 8) * qb[i] + ((wb->qs[i] >> 4) - 8) * qb[i + 16];
    return isum;
}

#define KS_MM_Q8X_SCALAR(NAME, BT, QK, DOT)                                                            \
    static void NAME(const uint8_t *w, const uint8_t *xq, size_t xs, int nc, int64_t cols, float *y,  \
                     int64_t ys) {                                                                     \
        const BT *wb = (const BT *)w;                                                                  \
        const int64_t nb = cols / (QK);                                                                \
        for (int c = 0; c < nc; c++) {                                                                 \
            const int8_t *q = (const int8_t *)(xq + c * xs);                                           \
            const float *d = (const float *)(xq + c * xs + ks_mm_align64((size_t)cols));               \
            float s = 0.0f;                                                                            \
            for (int64_t b = 0; b < nb; b++)                                                           \
                s += ks_f16_to_f32(wb[b].d) * d[b] * (float)DOT(&wb[b], q + b * (QK));                 \
            y[c * ys] = s;                                                                             \
        }                                                                                              \
    }
KS_MM_Q8X_SCALAR(ks_mm_q8_0_scalar, ks_block_q8_0, KS_QK8_0, ks_mm_dot_q8_0)
KS_MM_Q8X_SCALAR(ks_mm_q4_0_scalar, ks_block_q4_0, KS_QK4_0, ks_mm_dot_q4_0)
#undef KS_MM_Q8X_SCALAR

static void ks_mm_q4k_scales(const uint8_t *q, uint8_t *sc /* [8] */, uint8_t *m /* [8] */) {
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            sc[j] = q[j] & 63;
            m[j] = q[j + 4] & 63;
        } else {
            sc[j] = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
            m[j] = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
        }
    }
}

static void ks_mm_q4_k_scalar(const uint8_t *w, const uint8_t *xq, size_t xs, int nc, int64_t cols,
                              float *y, int64_t ys) {
    const ks_block_q4_k *wb = (const ks_block_q4_k *)w;
    const int64_t nb = cols / KS_QK_K;
    for (int c = 0; c < nc; c++) {
        const ks_block_q8_k *a = (const ks_block_q8_k *)(xq + c * xs);
        float s = 0.0f;
        for (int64_t b = 0; b < nb; b++) {
            uint8_t sc[8], m[8];
            ks_mm_q4k_scales(wb[b].scales, sc, m);
            int32_t sumi = 0, summ = 0;
            for (int j = 0; j < 8; j++) {
                const uint8_t *qs = wb[b].qs + 32 * (j / 2);
                const int8_t *aq = a[b].qs + 32 * j;
                int shift = (j & 1) * 4, isum = 0;
                for (int l = 0; l < 32; l++) isum += ((qs[l] >> shift) & 0xF) * aq[l];
                sumi += sc[j] * isum;
                summ += m[j] * (a[b].bsums[2 * j] + a[b].bsums[2 * j + 1]);
            }
            s += a[b].d * (ks_f16_to_f32(wb[b].d) * (float)sumi - ks_f16_to_f32(wb[b].dmin) * (float)summ);
        }
        y[c * ys] = s;
    }
}

static void ks_mm_q6_k_scalar(const uint8_t *w, const uint8_t *xq, size_t xs, int nc, int64_t cols,
                              float *y, int64_t ys) {
    const ks_block_q6_k *wb = (const ks_block_q6_k *)w;
    const int64_t nb = cols / KS_QK_K;
    for (int64_t c = 0; c < nc; c++) y[c * ys] = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        int8_t v[KS_QK_K]; /* q6 - 32 in element order */
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = wb[b].ql + 64 * h, *qh = wb[b].qh + 32 * h;
            int8_t *vh = v + 128 * h;
            for (int l = 0; l < 32; l++) {
                vh[l] = (int8_t)(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
                vh[l + 32] = (int8_t)(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
                vh[l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                vh[l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
            }
        }
        float d = ks_f16_to_f32(wb[b].d);
        for (int c = 0; c < nc; c++) {
            const ks_block_q8_k *a = (const ks_block_q8_k *)(xq + c * xs) + b;
            int32_t sumi = 0;
            for (int s = 0; s < 16; s++) {
                int32_t isum = 0;
                for (int l = 0; l < 16; l++) isum += v[16 * s + l] * a->qs[16 * s + l];
                sumi += wb[b].scales[s] * isum;
            }
            y[c * ys] += d * a->d * (float)sumi;
        }
    }
}

/* ------------------------------------------------------------ SIMD kernels -- */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KS_MM_HAVE_X86 1
#include <immintrin.h>
#define KS_MM_TEMPLATE_PASS 1
#define KS_MM_SFX(name) name##_avx2
#define KS_MM_TGT "avx2,fma,f16c"
#define KS_MM_LEVEL 1
#include "matmul_x86.c"
#include "matmul_x86_quant.c"
#undef KS_MM_SFX
#undef KS_MM_TGT
#undef KS_MM_LEVEL
#define KS_MM_SFX(name) name##_avx512
#define KS_MM_TGT "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni"
#define KS_MM_LEVEL 2
#include "matmul_x86.c"
#include "matmul_x86_quant.c"
#undef KS_MM_SFX
#undef KS_MM_TGT
#undef KS_MM_LEVEL
#undef KS_MM_TEMPLATE_PASS
#else
#define KS_MM_HAVE_X86 0
#endif

static ks_mm_kern2 ks_mm_kernel2(ks_dtype t, ks_simd_level level) {
#if KS_MM_HAVE_X86
    if (level == KS_SIMD_AVX512 && t == KS_DTYPE_Q8_0) return ks_mm_q8_0x2_avx512;
    if (level == KS_SIMD_AVX512 && t == KS_DTYPE_Q4_0) return ks_mm_q4_0x2_avx512;
#else
    (void)t, (void)level;
#endif
    return NULL;
}

static ks_mm_kern ks_mm_kernel(ks_dtype t, ks_simd_level level) {
#if KS_MM_HAVE_X86
    if (level == KS_SIMD_AVX512) {
        switch (t) {
        case KS_DTYPE_F32: return ks_mm_f32_avx512;
        case KS_DTYPE_F16: return ks_mm_f16_avx512;
        case KS_DTYPE_BF16: return ks_mm_bf16_avx512;
        case KS_DTYPE_Q8_0: return ks_mm_q8_0x_avx512; /* grouped partner layout */
        case KS_DTYPE_Q4_0: return ks_mm_q4_0x_avx512;
        case KS_DTYPE_Q4_K: return ks_mm_q4_kz_avx512; /* zmm form */
        case KS_DTYPE_Q6_K: return ks_mm_q6_kz_avx512;
        default: break;
        }
    }
    if (level == KS_SIMD_AVX2) {
        switch (t) {
        case KS_DTYPE_F32: return ks_mm_f32_avx2;
        case KS_DTYPE_F16: return ks_mm_f16_avx2;
        case KS_DTYPE_BF16: return ks_mm_bf16_avx2;
        case KS_DTYPE_Q8_0: return ks_mm_q8_0_avx2;
        case KS_DTYPE_Q4_0: return ks_mm_q4_0_avx2;
        case KS_DTYPE_Q4_K: return ks_mm_q4_k_avx2;
        case KS_DTYPE_Q6_K: return ks_mm_q6_k_avx2;
        default: break;
        }
    }
#endif
    switch (t) {
    case KS_DTYPE_F32: return ks_mm_f32_scalar;
    case KS_DTYPE_F16: return ks_mm_f16_scalar;
    case KS_DTYPE_BF16: return ks_mm_bf16_scalar;
    case KS_DTYPE_Q8_0: return ks_mm_q8_0_scalar;
    case KS_DTYPE_Q4_0: return ks_mm_q4_0_scalar;
    case KS_DTYPE_Q4_K: return ks_mm_q4_k_scalar;
    case KS_DTYPE_Q6_K: return ks_mm_q6_k_scalar;
    default: KS_ASSERT(!"ks_matmul: not a weight type"); return NULL;
    }
}

/* ----------------------------------------------------------------- driver -- */

typedef struct {
    ks_mm_kern kern;
    ks_mm_kern2 kern2; /* two-row form, or NULL */
    ks_simd_level level;
    ks_dtype wtype;
    ks_mm_xkind xkind;
    const uint8_t *W;  /* [rows][wrow bytes] */
    size_t wrow;       /* bytes per weight row */
    int64_t rows, cols, n;
    const float *X;    /* [n][cols] */
    const uint8_t *xq; /* [n][xs bytes]: quantized X, or X itself */
    uint8_t *scratch;
    size_t xs;         /* bytes per activation vector in xq */
    bool xt;           /* xq in the transposed panels' partner layout (ks_mm_quantize_q8t) */
    bool x_todo;       /* the worker quantizes X itself (share != NULL and X not ready) */
    float *Y;          /* [n][rows] */
    struct ks_mm_share *share; /* work cursors of the balanced prefill workers, or NULL */
} ks_mm_job;

/* Work cursors of a balanced product (ks_mm_p16_prefill_worker): the
 * activation vectors claimed and quantized, and per share of the panels the
 * next unit to run.  Each cursor has its own cache line (two cores bump them). */
#define KS_MM_SHARES 64
typedef struct ks_mm_share {
    _Alignas(64) atomic_llong qnext;
    _Alignas(64) atomic_llong qdone;
    struct {
        _Alignas(64) atomic_llong next;
    } unit[KS_MM_SHARES];
} ks_mm_share;

static void ks_mm_quantize_one(const ks_mm_job *job, int64_t c) {
    const float *x = job->X + c * job->cols;
    uint8_t *dst = job->scratch + (size_t)c * job->xs;
#if KS_MM_HAVE_X86
    if (job->level == KS_SIMD_AVX512) {
        if (job->xt) ks_mm_quantize_q8t_avx512(x, dst, job->cols);
        else if (job->xkind == KS_MM_XQ8) /* grouped layout; u8 weight offset 128 (Q8_0) or 8 (Q4_0) */
            ks_mm_quantize_q8x_avx512(x, dst, job->cols, job->wtype == KS_DTYPE_Q8_0 ? 128 : 8);
        else ks_mm_quantize_q8_k_avx512(x, dst, job->cols);
        return;
    }
    if (job->level == KS_SIMD_AVX2) {
        if (job->xkind == KS_MM_XQ8) ks_mm_quantize_q8_avx2(x, dst, job->cols);
        else ks_mm_quantize_q8_k_avx2(x, dst, job->cols);
        return;
    }
#endif
    if (job->xkind == KS_MM_XQ8) ks_mm_quantize_q8(x, dst, job->cols);
    else ks_quantize_row(KS_DTYPE_Q8_K, x, dst, job->cols);
}

static void ks_mm_quantize_worker(void *arg, int ith, int nth) {
    const ks_mm_job *job = arg;
    for (int64_t c = ith; c < job->n; c += nth) ks_mm_quantize_one(job, c);
}

static void ks_mm_worker(void *arg, int ith, int nth) {
    const ks_mm_job *job = arg;
    const int64_t units = (job->rows + KS_MM_ROWS - 1) / KS_MM_ROWS;
    int64_t u0, u1;
    ks_pool_share(units, ith, nth, &u0, &u1);
    const int64_t r_begin = u0 * KS_MM_ROWS;
    int64_t r_end = u1 * KS_MM_ROWS < job->rows ? u1 * KS_MM_ROWS : job->rows;
    int64_t chunk = (int64_t)(KS_MM_CHUNK_BYTES / job->wrow) / KS_MM_ROWS * KS_MM_ROWS;
    if (chunk < KS_MM_ROWS) chunk = KS_MM_ROWS;
    /* Vectors per group: as many as stay in L1 beside the weight row (at
     * least one kernel tile), so a row's NC-vector tiles do not evict each
     * other; each row chunk is still finished for all groups before the
     * next, so W streams from memory once whatever n is. */
    int64_t vg = (int64_t)(KS_MM_GROUP_L1 / job->xs) / KS_MM_NC * KS_MM_NC;
    if (vg < KS_MM_NC) vg = KS_MM_NC;
    if (vg > KS_MM_VG) vg = KS_MM_VG;
    if (job->n <= vg) chunk = r_end - r_begin; /* one pass: W streams once regardless */
    /* Two-row tiles share each activation load by two rows, halving L2
     * traffic, which only matters once a tile's activations outgrow L1 (long
     * rows, n > 1); on short rows two interleaved row streams defeat the
     * prefetcher, so they are used only where they pay. */
    const bool pair = job->kern2 && job->n > 1 && KS_MM_NC * job->xs > KS_MM_GROUP_L1;

    for (int64_t r0 = r_begin; r0 < r_end; r0 += chunk) {
        int64_t r1 = r0 + chunk < r_end ? r0 + chunk : r_end;
        for (int64_t c0 = 0; c0 < job->n; c0 += vg) {
            int64_t c1 = c0 + vg < job->n ? c0 + vg : job->n;
            for (int64_t r = r0; r < r1;) {
                const uint8_t *w = job->W + (size_t)r * job->wrow;
                const bool two = pair && r + 1 < r1;
                for (int64_t c = c0; c < c1; c += KS_MM_NC) {
                    int nc = (int)(c1 - c < KS_MM_NC ? c1 - c : KS_MM_NC);
                    if (two)
                        job->kern2(w, job->wrow, job->xq + (size_t)c * job->xs, job->xs, nc, job->cols,
                                   job->Y + c * job->rows + r, job->rows);
                    else
                        job->kern(w, job->xq + (size_t)c * job->xs, job->xs, nc, job->cols,
                                  job->Y + c * job->rows + r, job->rows);
                }
                r += two ? 2 : 1;
            }
        }
    }
}

static void ks_mm_run(ks_pool *pool, ks_dtype wtype, const void *W, int64_t rows, int64_t cols, const float *X,
                      int64_t n, float *Y, void *scratch, ks_pool_fn worker, bool x_ready, bool xt,
                      ks_mm_share *share) {
    KS_ASSERT(ks_dtype_is_weight_type((uint32_t)wtype));
    KS_ASSERT(rows >= 0 && cols >= 0 && n >= 0);
    KS_ASSERT(cols % ks_dtype_block_size(wtype) == 0);
    if (rows == 0 || n == 0) return;
    const ks_simd_level level = ks_simd_current();
    ks_mm_job job = {
        .kern = ks_mm_kernel(wtype, level),
        .kern2 = ks_mm_kernel2(wtype, level),
        .level = level,
        .wtype = wtype,
        .xkind = ks_mm_xkind_of(wtype),
        .W = W,
        .wrow = ks_dtype_row_bytes(wtype, cols),
        .rows = rows,
        .cols = cols,
        .n = n,
        .X = X,
        .scratch = scratch,
        .Y = Y,
        .xt = xt && level == KS_SIMD_AVX512,
        .share = share,
    };
    if (share) {
        atomic_init(&share->qnext, 0);
        atomic_init(&share->qdone, 0);
        for (int t = 0; t < KS_MM_SHARES; t++) atomic_init(&share->unit[t].next, 0);
    }
    if (cols == 0) {
        memset(Y, 0, (size_t)(n * rows) * sizeof(float));
        return;
    }
    if (job.xkind == KS_MM_XF32) {
        job.xq = (const uint8_t *)X;
        job.xs = (size_t)cols * sizeof(float);
    } else {
        KS_ASSERT(scratch != NULL && ((uintptr_t)scratch & 63) == 0);
        job.xs = job.xkind == KS_MM_XQ8K      ? ks_mm_q8k_stride(cols)
                 : job.xt                  ? ks_mm_q8t_stride(cols)
                 : level == KS_SIMD_AVX512 ? ks_mm_q8x_stride(cols)
                                           : ks_mm_q8_stride(cols);
        job.xq = scratch;
        /* Quantizing X costs ~1/rows of the product: do it inline for small
         * batches (one dispatch saved) and in parallel by vector for prefill. */
        if (x_ready) {
            /* the previous call left this very X quantized in scratch */
        } else if (job.share) {
            job.x_todo = true; /* the balanced worker quantizes (no hand-off between the two) */
        } else if (pool && ks_pool_size(pool) > 1 && n >= 4 && n * cols >= 32768) {
            ks_pool_run(pool, ks_mm_quantize_worker, &job);
        } else {
            for (int64_t c = 0; c < n; c++) ks_mm_quantize_one(&job, c);
        }
    }
    ks_pool_run(pool, worker, &job);
}

void ks_matmul(ks_pool *pool, ks_dtype wtype, const void *W, int64_t rows, int64_t cols,
               const float *X, int64_t n, float *Y, void *scratch) {
    ks_mm_run(pool, wtype, W, rows, cols, X, n, Y, scratch, ks_mm_worker, false, false, NULL);
}

/* ------------------------------------ packed Q8_0 / Q4_0 (prefill GEMM) --
 * (Q8_0 matrices whose rows are a multiple of 16 take the transposed
 * 16-row panels instead: ks_mm_pack_p16 below, matmul_x86.c.)
 * Layout (KS_WEIGHT_Q8_0_P4): four rows form a panel of ng = nb / 4 groups;
 * panel p sits where rows 4p..4p+3 sat (4 * nb * 34 = ng * 544 bytes):
 *   u8  q[ng][512]   per group: LO of rows 0..3 (64 B each), then HI of rows 0..3
 *   f16 d[ng][4][4]  per group and row: the scales of its four blocks
 * LO/HI are the grouped kernel's lane order (128-bit lane k: elements 0-15 /
 * 16-31 of block 4g+k) as u8 w + 128 (matmul_x86.c, "Q8_0 packed panels").
 * KS_WEIGHT_Q4_0_P4 is the same with q[ng][256]: per group and row 64 bytes,
 * 128-bit lane k holding block 4g+k's 16 packed nibble bytes as in the file
 * (ng * 288 = 4 * nb * 18 bytes).
 *
 * Why these products are shaped as they are: prefill multiplies hundreds of
 * vectors by each matrix, so weights are reused from cache and the cost is
 * instructions per MAC.  The packed tile takes 4 rows x 4 vectors per call
 * (each load serves 4 products), row panels in blocks that stay in L2 while
 * every 4-vector tile of activations (in L1 at 2048 columns) passes over
 * them, and the threads split the panels evenly, so both cores work on every
 * matmul of a chunk and finish together. */
#define KS_MM_P4_BLOCK_BYTES (256 * 1024) /* weight bytes of a row block kept in L2 */
#define KS_MM_P4_KGROUPS 16 /* groups (128 columns each) per K block */

bool ks_matmul_can_pack(const ks_weight *w) {
    if (w->layout != KS_WEIGHT_ROWS || (w->type != KS_DTYPE_Q8_0 && w->type != KS_DTYPE_Q4_0) || !w->data) return false;
    if (w->type == KS_DTYPE_Q8_0 && w->rows > 0 && w->rows % 16 == 0 && w->cols > 0 && w->cols % KS_QK8_0 == 0)
        return ks_simd_detect() == KS_SIMD_AVX512; /* transposed 16-row panels */
    if (w->rows <= 0 || w->rows % 4 || w->cols <= 0 || w->cols % (4 * KS_QK8_0)) return false;
    return ks_simd_detect() == KS_SIMD_AVX512;
}

/* Bytes of a packed panel's quants per group (4 rows x 4 blocks) and of a
 * block in the file, by type. */
static size_t ks_mm_p4_gbytes(ks_dtype t) { return t == KS_DTYPE_Q8_0 ? 512 : 256; }

/* Q8_0 into transposed 16-row panels (KS_WEIGHT_Q8_0_P16), in place:
 * panel p (rows 16p..16p+15, 16 * nb * 34 = nb * 544 bytes) holds per block
 * b eight 64-byte groups (group k, lane r: bytes 4k..4k+3 of row r's block
 * b, xor 0x80), then the f16 scales [nb][16]. */
static ks_status ks_mm_pack_p16(ks_weight *w) {
    const int64_t nb = w->cols / KS_QK8_0;
    const size_t panel_bytes = (size_t)nb * 544;
    ks_block_q8_0 *rows = ks_malloc(panel_bytes);
    if (!rows) return KS_FAIL(KS_ERR_NOMEM, "repacking a %lld-column matrix", (long long)w->cols);
    uint8_t *base = (uint8_t *)(uintptr_t)w->data;
    for (int64_t p = 0; p < w->rows / 16; p++) {
        uint8_t *panel = base + (size_t)p * panel_bytes;
        memcpy(rows, panel, panel_bytes);
        ks_f16 *d = (ks_f16 *)(panel + (size_t)nb * 512);
        for (int64_t b = 0; b < nb; b++)
            for (int r = 0; r < 16; r++) {
                const ks_block_q8_0 *blk = &rows[(size_t)r * nb + b];
                for (int k = 0; k < 8; k++)
                    for (int i = 0; i < 4; i++)
                        panel[(size_t)b * 512 + 64 * k + 4 * r + i] = (uint8_t)(blk->qs[4 * k + i] ^ 0x80);
                memcpy(&d[b * 16 + r], &blk->d, sizeof(ks_f16));
            }
    }
    ks_free(rows);
    w->layout = KS_WEIGHT_Q8_0_P16;
    return KS_OK;
}

static void ks_mm_unpack_p16(const uint8_t *panel, int64_t nb, ks_block_q8_0 *rows) {
    const ks_f16 *d = (const ks_f16 *)(panel + (size_t)nb * 512);
    for (int64_t b = 0; b < nb; b++)
        for (int r = 0; r < 16; r++) {
            ks_block_q8_0 *blk = &rows[(size_t)r * nb + b];
            for (int k = 0; k < 8; k++)
                for (int i = 0; i < 4; i++) blk->qs[4 * k + i] = (int8_t)(panel[(size_t)b * 512 + 64 * k + 4 * r + i] ^ 0x80);
            memcpy(&blk->d, &d[b * 16 + r], sizeof(ks_f16));
        }
}

#define KS_MM_P16_NC 8 /* vectors per transposed-panel tile */
#ifndef KS_MM_T2_BLOCK_BYTES
#define KS_MM_T2_BLOCK_BYTES (256 * 1024)
#endif

#if KS_MM_HAVE_X86
/* Rows b0..b1-1 of panels (a row block, its weights kept in L2) times
 * vectors c0..c1-1, KS_MM_T2_NP panels at a time through the multi-panel
 * tile (an odd panel left over through the one-panel kernel: same bits). */
static void ks_mm_p16_unit(const ks_mm_job *job, int64_t b0, int64_t b1, int64_t c0, int64_t c1) {
    const int64_t nb = job->cols / KS_QK8_0;
    const size_t panel_bytes = (size_t)nb * 544;
    for (int64_t c = c0; c < c1; c += KS_MM_T2_NC) {
        const int nc = (int)(c1 - c < KS_MM_T2_NC ? c1 - c : KS_MM_T2_NC);
        const uint8_t *xq = job->xq + (size_t)c * job->xs;
        float *y = job->Y + c * job->rows;
        int64_t p = b0;
        for (; p + KS_MM_T2_NP <= b1; p += KS_MM_T2_NP) {
            /* the block's last tile pulls the next vectors' activations into L1 */
            const uint8_t *xnext =
                p + 2 * KS_MM_T2_NP > b1 && c + 2 * KS_MM_T2_NC <= c1 ? xq + (size_t)KS_MM_T2_NC * job->xs : NULL;
            ks_mm_q8_0t2_avx512(job->W + (size_t)p * panel_bytes, panel_bytes, nb, xq, job->xs, xnext, nc, y + 16 * p,
                                job->rows);
        }
        for (; p < b1; p++)
            ks_mm_q8_0t_avx512(job->W + (size_t)p * panel_bytes, nb, xq, job->xs, nc, y + 16 * p, job->rows);
    }
}

/* Spin (politely) until *v reaches want. */
static void ks_mm_wait_at_least(atomic_llong *v, long long want) {
    for (int spins = 1; atomic_load_explicit(v, memory_order_acquire) < want; spins++) {
        __builtin_ia32_pause();
        if ((spins & 63) == 0) sched_yield(); /* a descheduled peer holds the rest */
    }
}

#define KS_MM_QGRAB 4 /* activation vectors claimed at a time */
#define KS_MM_SEG (8 * KS_MM_T2_NC) /* vectors per unit of work */

/* The prefill product over transposed panels (n > KS_MM_P16_NC, AVX-512),
 * balanced so that neither core waits for the other.
 *
 * Why: a static half each (what decode does) made every matmul as slow as
 * its later thread, and a thread is often late: the worker wakes from the
 * pool's futex while the caller already runs, and on a shared host either
 * may be descheduled for a while.  Measured on the 1B model's 512-token
 * prefill (host loaded), the worker started its half ~1/4 of the GEMM time
 * late in total.  So the work is cut into units (a row block of panels that
 * stays in L2 x KS_MM_SEG vectors) and claimed through atomic cursors:
 * the panels are split into one contiguous share per thread as before, each
 * thread runs its own share's units in order (the row block stays in its
 * L2 across the vector segments) and then helps with the others' remaining
 * units.  The activations are quantized the same way, by whoever comes
 * first, and the product starts once every vector is done, so there is one
 * hand-off per matmul instead of two.  Which thread computes an output
 * changes nothing in its arithmetic (one tile call over all of K, the same
 * bits for every nc), so the result is the static split's, bit for bit. */
static void ks_mm_p16_prefill_worker(void *arg, int ith, int nth) {
    const ks_mm_job *job = arg;
    ks_mm_share *sh = job->share;
    const int64_t n = job->n;
    if (job->x_todo) {
        for (;;) {
            const long long c0 = atomic_fetch_add_explicit(&sh->qnext, KS_MM_QGRAB, memory_order_relaxed);
            if (c0 >= n) break;
            const long long c1 = c0 + KS_MM_QGRAB < n ? c0 + KS_MM_QGRAB : n;
            for (long long c = c0; c < c1; c++) ks_mm_quantize_one(job, c);
            atomic_fetch_add_explicit(&sh->qdone, c1 - c0, memory_order_release);
        }
        ks_mm_wait_at_least(&sh->qdone, n);
    }
    const int64_t nb = job->cols / KS_QK8_0, n_panels = job->rows / 16;
    const size_t panel_bytes = (size_t)nb * 544;
    int64_t block = (int64_t)(KS_MM_T2_BLOCK_BYTES / panel_bytes) / KS_MM_T2_NP * KS_MM_T2_NP;
    if (block < KS_MM_T2_NP) block = KS_MM_T2_NP;
    const int64_t nseg = (n + KS_MM_SEG - 1) / KS_MM_SEG;
    const int shares = nth < KS_MM_SHARES ? nth : KS_MM_SHARES;
    for (int k = 0; k < shares; k++) {
        const int t = (ith + k) % shares; /* own share first, then the others' */
        int64_t p0, p1;
        ks_pool_share(n_panels, t, shares, &p0, &p1);
        const long long units = (p1 - p0 + block - 1) / block * nseg;
        for (;;) {
            const long long u = atomic_fetch_add_explicit(&sh->unit[t].next, 1, memory_order_relaxed);
            if (u >= units) break;
            const int64_t b0 = p0 + (u / nseg) * block, c0 = (u % nseg) * KS_MM_SEG;
            ks_mm_p16_unit(job, b0, b0 + block < p1 ? b0 + block : p1, c0, c0 + KS_MM_SEG < n ? c0 + KS_MM_SEG : n);
        }
    }
}
#endif

static void ks_mm_p16_worker(void *arg, int ith, int nth) {
    const ks_mm_job *job = arg;
    const int64_t nb = job->cols / KS_QK8_0, n_panels = job->rows / 16;
    const size_t panel_bytes = (size_t)nb * 544;
    int64_t p0, p1;
    ks_pool_share(n_panels, ith, nth, &p0, &p1);
    if (p0 >= p1) return;
#if KS_MM_HAVE_X86
    if (job->level == KS_SIMD_AVX512) {
        /* row block: weights kept in L2 while every 8-vector tile passes */
        int64_t block = (int64_t)(KS_MM_P4_BLOCK_BYTES / panel_bytes);
        if (block < 1) block = 1;
        if (job->n <= KS_MM_P16_NC) block = p1 - p0;
        for (int64_t b0 = p0; b0 < p1; b0 += block) {
            const int64_t b1 = b0 + block < p1 ? b0 + block : p1;
            for (int64_t c = 0; c < job->n; c += KS_MM_P16_NC) {
                const int nc = (int)(job->n - c < KS_MM_P16_NC ? job->n - c : KS_MM_P16_NC);
                for (int64_t p = b0; p < b1; p++)
                    ks_mm_q8_0t_avx512(job->W + (size_t)p * panel_bytes, nb, job->xq + (size_t)c * job->xs, job->xs,
                                       nc, job->Y + c * job->rows + 16 * p, job->rows);
            }
        }
        return;
    }
#endif
    ks_block_q8_0 *rows = ks_scratch(KS_SCRATCH_KERNEL, panel_bytes);
    KS_ASSERT(rows); /* reserved before the run (ks_matmul_worker_scratch_bytes) */
    for (int64_t p = p0; p < p1; p++) {
        ks_mm_unpack_p16(job->W + (size_t)p * panel_bytes, nb, rows);
        for (int r = 0; r < 16; r++)
            for (int64_t c = 0; c < job->n; c += KS_MM_NC) {
                const int nc = (int)(job->n - c < KS_MM_NC ? job->n - c : KS_MM_NC);
                job->kern((const uint8_t *)(rows + (size_t)r * nb), job->xq + (size_t)c * job->xs, job->xs, nc,
                          job->cols, job->Y + c * job->rows + 16 * p + r, job->rows);
            }
    }
}

ks_status ks_matmul_pack(ks_weight *w) {
    if (!ks_matmul_can_pack(w)) return KS_OK;
    if (w->type == KS_DTYPE_Q8_0 && w->rows % 16 == 0) return ks_mm_pack_p16(w);
    const bool q8 = w->type == KS_DTYPE_Q8_0;
    const int64_t nb = w->cols / 32, ng = nb / 4;
    const size_t bb = q8 ? sizeof(ks_block_q8_0) : sizeof(ks_block_q4_0), gq = ks_mm_p4_gbytes(w->type);
    const size_t panel_bytes = (size_t)ng * (gq + 32);
    KS_ASSERT(panel_bytes == 4 * (size_t)nb * bb); /* in place: same size */
    uint8_t *rows = ks_malloc(panel_bytes);
    if (!rows) return KS_FAIL(KS_ERR_NOMEM, "repacking a %lld-column matrix", (long long)w->cols);
    uint8_t *base = (uint8_t *)(uintptr_t)w->data; /* the caller made it writable */
    for (int64_t p = 0; p < w->rows / 4; p++) {
        uint8_t *panel = base + (size_t)p * panel_bytes;
        memcpy(rows, panel, panel_bytes);
        ks_f16 *d = (ks_f16 *)(panel + (size_t)ng * gq);
        for (int64_t g = 0; g < ng; g++)
            for (int r = 0; r < 4; r++)
                for (int k = 0; k < 4; k++) {
                    const uint8_t *b = rows + ((size_t)r * nb + 4 * g + k) * bb;
                    ks_f16 dk;
                    if (q8) {
                        const ks_block_q8_0 *b8 = (const ks_block_q8_0 *)b;
                        uint8_t *lo = panel + (size_t)g * gq + 64 * r + 16 * k, *hi = lo + 256;
                        for (int i = 0; i < 16; i++) {
                            lo[i] = (uint8_t)(b8->qs[i] ^ 0x80);
                            hi[i] = (uint8_t)(b8->qs[16 + i] ^ 0x80);
                        }
                        dk = b8->d;
                    } else {
                        const ks_block_q4_0 *b4 = (const ks_block_q4_0 *)b;
                        memcpy(panel + (size_t)g * gq + 64 * r + 16 * k, b4->qs, 16);
                        dk = b4->d;
                    }
                    memcpy(&d[(g * 4 + r) * 4 + k], &dk, sizeof(ks_f16));
                }
    }
    ks_free(rows);
    w->layout = q8 ? KS_WEIGHT_Q8_0_P4 : KS_WEIGHT_Q4_0_P4;
    return KS_OK;
}

/* Panel p back to four ordinary rows (the fallback below a level that has
 * the packed tile: tests forcing AVX2 or scalar). */
static void ks_mm_unpack_panel(ks_dtype t, const uint8_t *panel, int64_t nb, uint8_t *rows) {
    const bool q8 = t == KS_DTYPE_Q8_0;
    const int64_t ng = nb / 4;
    const size_t bb = q8 ? sizeof(ks_block_q8_0) : sizeof(ks_block_q4_0), gq = ks_mm_p4_gbytes(t);
    const ks_f16 *d = (const ks_f16 *)(panel + (size_t)ng * gq);
    for (int64_t g = 0; g < ng; g++)
        for (int r = 0; r < 4; r++)
            for (int k = 0; k < 4; k++) {
                uint8_t *b = rows + ((size_t)r * nb + 4 * g + k) * bb;
                const uint8_t *src = panel + (size_t)g * gq + 64 * r + 16 * k;
                if (q8) {
                    ks_block_q8_0 *b8 = (ks_block_q8_0 *)b;
                    for (int i = 0; i < 16; i++) {
                        b8->qs[i] = (int8_t)(src[i] ^ 0x80);
                        b8->qs[16 + i] = (int8_t)(src[256 + i] ^ 0x80);
                    }
                    memcpy(&b8->d, &d[(g * 4 + r) * 4 + k], sizeof(ks_f16));
                } else {
                    ks_block_q4_0 *b4 = (ks_block_q4_0 *)b;
                    memcpy(b4->qs, src, 16);
                    memcpy(&b4->d, &d[(g * 4 + r) * 4 + k], sizeof(ks_f16));
                }
            }
}

static void ks_mm_packed_worker(void *arg, int ith, int nth) {
    const ks_mm_job *job = arg;
    const int64_t nb = job->cols / KS_QK8_0, ng = nb / 4, n_panels = job->rows / 4;
    const size_t bb = job->wrow / (size_t)nb, panel_bytes = (size_t)ng * (ks_mm_p4_gbytes(job->wtype) + 32);
    int64_t p0, p1;
    ks_pool_share(n_panels, ith, nth, &p0, &p1);
    if (p0 >= p1) return;
#if KS_MM_HAVE_X86
    if (job->level == KS_SIMD_AVX512) {
        /* row block: weights kept in L2 while every vector tile passes;
         * K block: a tile's activations (4 x KG x 256 B) kept in L1 */
        int64_t block = (int64_t)(KS_MM_P4_BLOCK_BYTES / panel_bytes);
        if (block < 1) block = 1;
        if (job->n <= KS_MM_NC) block = p1 - p0;
        const int64_t kg = job->n <= KS_MM_NC || ng <= KS_MM_P4_KGROUPS ? ng : KS_MM_P4_KGROUPS;
        float *acc = ks_scratch(KS_SCRATCH_KERNEL, sizeof(float) * 256 * (size_t)(kg < ng ? block : 1));
        KS_ASSERT(acc); /* reserved before the run (ks_matmul_worker_scratch_bytes) */
        for (int64_t b0 = p0; b0 < p1; b0 += block) {
            const int64_t b1 = b0 + block < p1 ? b0 + block : p1;
            for (int64_t c = 0; c < job->n; c += KS_MM_NC) {
                const int nc = (int)(job->n - c < KS_MM_NC ? job->n - c : KS_MM_NC);
                for (int64_t g0 = 0; g0 < ng; g0 += kg) {
                    const int64_t g1 = g0 + kg < ng ? g0 + kg : ng;
                    for (int64_t p = b0; p < b1; p++)
                        (job->wtype == KS_DTYPE_Q8_0 ? ks_mm_q8_0p_avx512 : ks_mm_q4_0p_avx512)(
                            job->W + (size_t)p * panel_bytes, ng, g0, g1, job->xq + (size_t)c * job->xs, job->xs, nc,
                            acc + (kg < ng ? 256 * (size_t)(p - b0) : 0), job->Y + c * job->rows + 4 * p, job->rows, 4);
                }
            }
        }
        return;
    }
#endif
    uint8_t *rows = ks_scratch(KS_SCRATCH_KERNEL, panel_bytes);
    KS_ASSERT(rows); /* reserved before the run (ks_matmul_worker_scratch_bytes) */
    for (int64_t p = p0; p < p1; p++) {
        ks_mm_unpack_panel(job->wtype, job->W + (size_t)p * panel_bytes, nb, rows);
        for (int r = 0; r < 4; r++)
            for (int64_t c = 0; c < job->n; c += KS_MM_NC) {
                const int nc = (int)(job->n - c < KS_MM_NC ? job->n - c : KS_MM_NC);
                job->kern(rows + (size_t)r * nb * bb, job->xq + (size_t)c * job->xs, job->xs, nc, job->cols,
                          job->Y + c * job->rows + 4 * p + r, job->rows);
            }
    }
}

size_t ks_matmul_worker_scratch_bytes(const ks_weight *w) {
    const int64_t nb = w->cols / KS_QK8_0;
    size_t panel_bytes;
    if (w->layout == KS_WEIGHT_Q8_0_P16) panel_bytes = (size_t)nb * 544;
    else if (w->layout == KS_WEIGHT_Q8_0_P4 || w->layout == KS_WEIGHT_Q4_0_P4)
        panel_bytes = (size_t)(nb / 4) * (ks_mm_p4_gbytes(w->type) + 32);
    else return 0;
    /* the unpacked fallback's rows, or the AVX-512 tile's accumulators of a row block */
    size_t block = panel_bytes ? KS_MM_P4_BLOCK_BYTES / panel_bytes : 1;
    size_t acc = sizeof(float) * 256 * (block > 1 ? block : 1);
    return panel_bytes > acc ? panel_bytes : acc;
}

void ks_matmul_weight_ex(ks_pool *pool, const ks_weight *w, const float *X, int64_t n, float *Y, void *scratch,
                         bool x_ready) {
    if (w->layout == KS_WEIGHT_ROWS) {
        ks_mm_run(pool, w->type, w->data, w->rows, w->cols, X, n, Y, scratch, ks_mm_worker, x_ready, false, NULL);
        return;
    }
    if (w->layout == KS_WEIGHT_Q8_0_P16) {
        KS_ASSERT(w->type == KS_DTYPE_Q8_0);
        if (w->rows == 0 || n == 0) return;
#if KS_MM_HAVE_X86
        if (n > KS_MM_P16_NC && ks_simd_current() == KS_SIMD_AVX512) { /* prefill: balanced tiles */
            ks_mm_share share;
            ks_mm_run(pool, w->type, w->data, w->rows, w->cols, X, n, Y, scratch, ks_mm_p16_prefill_worker, x_ready,
                      true, &share);
            return;
        }
#endif
        ks_mm_run(pool, w->type, w->data, w->rows, w->cols, X, n, Y, scratch, ks_mm_p16_worker, x_ready, true, NULL);
        return;
    }
    KS_ASSERT((w->layout == KS_WEIGHT_Q8_0_P4 && w->type == KS_DTYPE_Q8_0) ||
              (w->layout == KS_WEIGHT_Q4_0_P4 && w->type == KS_DTYPE_Q4_0));
    if (w->rows == 0 || n == 0) return;
    ks_mm_run(pool, w->type, w->data, w->rows, w->cols, X, n, Y, scratch, ks_mm_packed_worker, x_ready, false, NULL);
}

void ks_matmul_weight(ks_pool *pool, const ks_weight *w, const float *X, int64_t n, float *Y, void *scratch) {
    ks_matmul_weight_ex(pool, w, X, n, Y, scratch, false);
}

/* ------------------------------------------------------ reference dot ----- */

float ks_dot_row_ref(ks_dtype wtype, const void *wrow, const float *x, int64_t cols) {
    KS_ASSERT(ks_dtype_is_weight_type((uint32_t)wtype));
    const int64_t bs = ks_dtype_block_size(wtype);
    KS_ASSERT(cols % bs == 0);
    /* dequantize a few blocks at a time; accumulate in double so the result
     * is the exact dot of dequant(w) and x rounded once to f32 */
    const int64_t chunk = bs >= KS_QK_K ? bs : (256 / bs) * bs;
    const size_t chunk_bytes = ks_dtype_row_bytes(wtype, chunk);
    float buf[256];
    double s = 0.0;
    const uint8_t *w = wrow;
    for (int64_t i = 0; i < cols; i += chunk, w += chunk_bytes) {
        int64_t m = cols - i < chunk ? cols - i : chunk;
        ks_dequantize_row(wtype, w, buf, m);
        for (int64_t k = 0; k < m; k++) s += (double)buf[k] * (double)x[i + k];
    }
    return (float)s;
}
