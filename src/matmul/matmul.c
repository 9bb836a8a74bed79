/*
 * matmul.c — Y[n][rows] = X[n][cols] W^T for every weight type: the driver,
 * kernel choice by SIMD level (ks_simd_current(), core/simd.h; the tables
 * of which kernel serves which type and level are matmul_dispatch.c),
 * activation quantization and the scalar kernels.
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
 *     partner at every level; their AVX-512 kernels over the file's rows
 *     read it as four zmm per super-block (per-lane sub-block scales, SIMD
 *     scale unpacking), their group kernels over repacked rows
 *     (matmul_x86_q4k.c) as broadcast qwords.
 * The scalar kernels below are the reference: the SIMD kernels (AVX2+FMA and
 * AVX-512 VNNI, compiled from matmul_x86.c with target attributes so the
 * library needs no -march flag) must agree with them to float rounding, which
 * tests/test_matmul.c checks for every level the CPU has.
 *
 * Prefill is the other regime (weights reused from cache, the cost is
 * instructions per MAC and the cores' balance): weights repacked at load
 * for it, their drivers and ks_matmul_weight are matmul_packed.c, a part of
 * this translation unit (it shares the driver below), and its AVX-512 tiles
 * are matmul_x86_panel.c, a template like matmul_x86.c.  Q4_K (AVX2 and
 * AVX-512) and Q5_K, Q6_K, IQ4_XS (AVX-512) are repacked into eight-row
 * groups whose one kernel per type and level serves decode and prefill
 * (matmul_x86_q4k.c).  Where nothing is repacked at the AVX2 level, from
 * KS_MM_PAIR_N vectors on, ks_mm_worker runs multi-row tiles on the file's
 * rows (eight rows transposed in registers, up to KS_MM_T8_NC vectors a
 * call: Q4_K / Q5_K / Q6_K in matmul_x86_panel.c, IQ4_XS in
 * matmul_x86_tiles.c; two rows for the float types).
 */
#include "matmul/matmul.h"

#include "core/simd.h"
#include "tensor/quant_types.h"

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

/* Optional many-row form for one tile of vectors: rows w + r * wrow, r < nr,
 * results at y[c*ys + r].  Decode calls a kernel once per row, and a short
 * row (2048 columns: 8 Q4_K super-blocks) paid the kernel's set-up (shuffle
 * controls spilled to the stack, prologue, dispatch on nc) every time:
 * about 10% of the AVX2 K-quant kernels' instructions at n = 1
 * (docs/results/quant-types.md).  In this form the set-up is paid per call. */
typedef void (*ks_mm_kernr)(const uint8_t *w, size_t wrow, int64_t nr, const uint8_t *xq, size_t xs, int nc,
                            int64_t cols, float *y, int64_t ys);

#define KS_MM_NC 4     /* vectors per kernel call */
#define KS_MM_VG 16    /* most vectors per group (L2 reuse for large n) */
#define KS_MM_GROUP_L1 (20 * 1024) /* activation bytes a group may keep in L1 */
#define KS_MM_ROWS 16  /* row alignment of the thread split */
#define KS_MM_CHUNK_BYTES (192 * 1024) /* weight bytes per row chunk (L2) */
#define KS_MM_PAIR_N 8 /* vectors from which the AVX2 multi-row prefill tiles run */
#ifndef KS_MM_T8_NC
#define KS_MM_T8_NC 8  /* most vectors per call of the AVX2 eight-row tiles (4 or 8) */
#endif
/* Most vectors per call of the AVX-512 group kernels (matmul_x86_q4k.c): 8
 * spills a few registers and still beat 6 on every type (2048 x 2048 x 512,
 * 1 thread, G MAC per CPU-s: Q4_K 175 against 167, Q5_K 138 against 131,
 * Q6_K 111 against 107, IQ4_XS 122 against 113; alternated, host shared). */
#ifndef KS_MM_X8Q_NC
#define KS_MM_X8Q_NC 8
#endif
/* The entry of a SIMD kernel: body(args..., NC) with NC = nc a constant, so
 * that the body's loops over the vectors unroll and its accumulators stay in
 * registers.  KS_MM_NC_SWITCH: the one-row kernels (matmul_x86.c,
 * matmul_x86_types.c), nc = 1..KS_MM_NC; KS_MM_T8_SWITCH: the eight-row
 * tiles (matmul_x86_panel.c, matmul_x86_tiles.c, matmul_x86_q4k.c), nc =
 * 1..KS_MM_T8_NC. */
#define KS_MM_CASES_1_TO_4(body, ...)  \
    case 4: body(__VA_ARGS__, 4); break; \
    case 3: body(__VA_ARGS__, 3); break; \
    case 2: body(__VA_ARGS__, 2); break; \
    default: body(__VA_ARGS__, 1); break;
#if KS_MM_T8_NC > 4
#define KS_MM_CASES_5_TO_8(body, ...)  \
    case 8: body(__VA_ARGS__, 8); break; \
    case 7: body(__VA_ARGS__, 7); break; \
    case 6: body(__VA_ARGS__, 6); break; \
    case 5: body(__VA_ARGS__, 5); break;
#else
#define KS_MM_CASES_5_TO_8(body, ...)
#endif
#define KS_MM_NC_SWITCH(body, ...) \
    switch (nc) { KS_MM_CASES_1_TO_4(body, __VA_ARGS__) }
#define KS_MM_T8_SWITCH(body, ...) \
    switch (nc) { KS_MM_CASES_5_TO_8(body, __VA_ARGS__) KS_MM_CASES_1_TO_4(body, __VA_ARGS__) }
/* KS_MM_X8Q_SWITCH: the AVX-512 group kernels (matmul_x86_q4k.c), nc =
 * 1..KS_MM_X8Q_NC (4, 6 or 8). */
#if KS_MM_X8Q_NC >= 8
#define KS_MM_X8Q_CASES_7_8(body, ...) \
    case 8: body(__VA_ARGS__, 8); break; \
    case 7: body(__VA_ARGS__, 7); break;
#else
#define KS_MM_X8Q_CASES_7_8(body, ...)
#endif
#if KS_MM_X8Q_NC >= 6
#define KS_MM_X8Q_CASES_5_6(body, ...) \
    case 6: body(__VA_ARGS__, 6); break; \
    case 5: body(__VA_ARGS__, 5); break;
#else
#define KS_MM_X8Q_CASES_5_6(body, ...)
#endif
#define KS_MM_X8Q_SWITCH(body, ...)                                                                     \
    switch (nc) {                                                                                   \
        KS_MM_X8Q_CASES_7_8(body, __VA_ARGS__)                                                      \
        KS_MM_X8Q_CASES_5_6(body, __VA_ARGS__) KS_MM_CASES_1_TO_4(body, __VA_ARGS__)                \
    }
/* The many-row form (ks_mm_kernr): the row loop inside each constant-nc
 * case, so the body's set-up is hoisted out of it. */
#define KS_MM_ROWS_SWITCH(body)                                                                    \
    switch (nc) {                                                                                  \
    case 4: for (int64_t r = 0; r < nr; r++) body(w + (size_t)r * wrow, xq, xs, cols, y + r, ys, 4); break; \
    case 3: for (int64_t r = 0; r < nr; r++) body(w + (size_t)r * wrow, xq, xs, cols, y + r, ys, 3); break; \
    case 2: for (int64_t r = 0; r < nr; r++) body(w + (size_t)r * wrow, xq, xs, cols, y + r, ys, 2); break; \
    default: for (int64_t r = 0; r < nr; r++) body(w + (size_t)r * wrow, xq, xs, cols, y + r, ys, 1); break; \
    }

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

/* Partner of the transposed Q8_0 panels (matmul_x86_panel.c, "Q8_0
 * transposed panels"): one 40-byte record per block, int8 q[32] then int32
 * ex and int32 corr.  Interleaved rather than three arrays because a tile
 * reads six vectors at once: one sequential stream per vector instead of
 * three is what the hardware prefetchers follow (18 streams lost them at
 * 8192 columns, where the tile's activations come from L2 or L3 every
 * pass: a copy of the tile, 1 thread, read 381-385 G MAC/s against 333-336
 * with the arrays, docs/history/benchmarks-notebook.md). */
#define KS_MM_Q8T_REC 40  /* bytes per block */
#define KS_MM_Q8T_EX 32   /* offset of ex in a record */
#define KS_MM_Q8T_CORR 36 /* offset of corr in a record */
static size_t ks_mm_q8t_stride(int64_t cols) {
    return ks_mm_align64((size_t)(cols / KS_QK8_0) * KS_MM_Q8T_REC);
}

static size_t ks_mm_q8k_stride(int64_t cols) {
    return ks_mm_align64((size_t)(cols / KS_QK_K) * sizeof(ks_block_q8_k));
}

/* The Q8S partner and the scalar kernels of the types added for llama.cpp's
 * mixes: matmul_types.c. */
#define KS_MM_TYPES_PART 1
#include "matmul_types.c"
#undef KS_MM_TYPES_PART

/* Partner layout of a weight type; 0 = none (float weights dot f32 X). */
typedef enum { KS_MM_XF32 = 0, KS_MM_XQ8, KS_MM_XQ8K, KS_MM_XQ8S } ks_mm_xkind;

static ks_mm_xkind ks_mm_xkind_of(ks_dtype t) {
    switch (t) {
    case KS_DTYPE_Q8_0:
    case KS_DTYPE_Q4_0: return KS_MM_XQ8;
    case KS_DTYPE_Q4_1:
    case KS_DTYPE_Q5_0:
    case KS_DTYPE_Q5_1:
    case KS_DTYPE_IQ4_NL:
    case KS_DTYPE_MXFP4: return KS_MM_XQ8S; /* matmul_types.c */
    case KS_DTYPE_Q2_K:
    case KS_DTYPE_Q3_K:
    case KS_DTYPE_Q4_K:
    case KS_DTYPE_Q5_K:
    case KS_DTYPE_Q6_K:
    case KS_DTYPE_IQ4_XS: return KS_MM_XQ8K;
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
    case KS_MM_XQ8S: return (size_t)n * ks_mm_q8s_stride(cols);
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
#include "matmul_x86_types.c"
#include "matmul_x86_panel.c"
#include "matmul_x86_q4k.c"
#include "matmul_x86_tiles.c"
#include "matmul_x86_quant.c"
#undef KS_MM_SFX
#undef KS_MM_TGT
#undef KS_MM_LEVEL
#define KS_MM_SFX(name) name##_avx512
#define KS_MM_TGT "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni"
#define KS_MM_LEVEL 2
#include "matmul_x86.c"
#include "matmul_x86_types.c"
#include "matmul_x86_panel.c"
#include "matmul_x86_q4k.c"
#include "matmul_x86_tiles.c"
#include "matmul_x86_quant.c"
#undef KS_MM_SFX
#undef KS_MM_TGT
#undef KS_MM_LEVEL
#undef KS_MM_TEMPLATE_PASS
#else
#define KS_MM_HAVE_X86 0
#endif

#if defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
#define KS_MM_HAVE_NEON 1
#include <arm_neon.h>
#define KS_MM_NEON_PASS 1
#define KS_MM_NSFX(name) name##_neon /* plain NEON (Armv8.0) */
#define KS_MM_NTGT
#define KS_MM_NEON_DOT 0
#include "matmul_neon.c"
#undef KS_MM_NSFX
#undef KS_MM_NTGT
#undef KS_MM_NEON_DOT
#define KS_MM_NSFX(name) name##_dot /* FEAT_DotProd: sdot */
#define KS_MM_NTGT KS_NEON_TGT_DOT
#define KS_MM_NEON_DOT 1
#include "matmul_neon.c"
#undef KS_MM_NSFX
#undef KS_MM_NTGT
#undef KS_MM_NEON_DOT
#undef KS_MM_NEON_PASS
#else
#define KS_MM_HAVE_NEON 0
#endif

/* ------------------------------------------ kernel choice by type and level --
 * ks_mm_kernel, ks_mm_kernel2, ks_mm_kernel8, ks_mm_kernel_rows and the
 * kernels' names: matmul_dispatch.c. */
#define KS_MM_DISPATCH_PART 1
#include "matmul_dispatch.c"
#undef KS_MM_DISPATCH_PART

/* ----------------------------------------------------------------- driver -- */

typedef struct {
    ks_mm_kern kern;
    ks_mm_kern2 kern2; /* two-row form, or NULL */
    ks_mm_kern2 kern8; /* eight-row prefill tile, or NULL */
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
    ks_mm_kernr kernr; /* many-row form for decode tiles, or NULL */
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
    if (job->xkind == KS_MM_XQ8S) { /* the plain split Q8 at every level, then the block sums */
#if KS_MM_HAVE_X86
        if (job->level >= KS_SIMD_AVX2) ks_mm_quantize_q8_avx2(x, dst, job->cols);
        else
#endif
#if KS_MM_HAVE_NEON
        if (job->level >= KS_SIMD_NEON) ks_mm_quantize_q8_neon(x, dst, job->cols);
        else
#endif
            ks_mm_quantize_q8(x, dst, job->cols);
        ks_mm_q8s_sums(dst, job->cols);
        return;
    }
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
#if KS_MM_HAVE_NEON
    if (job->level >= KS_SIMD_NEON && job->xkind == KS_MM_XQ8) { /* the scalar layout and bytes */
        ks_mm_quantize_q8_neon(x, dst, job->cols);
        return;
    }
    if (job->level >= KS_SIMD_NEON && job->xkind == KS_MM_XQ8K) { /* ks_quantize_row's Q8_K bytes */
        ks_mm_quantize_q8_k_neon(x, dst, job->cols);
        return;
    }
#endif
    if (job->xkind == KS_MM_XQ8) ks_mm_quantize_q8(x, dst, job->cols);
    else ks_quantize_row(KS_DTYPE_Q8_K, x, dst, job->cols);
}

/* Bytes per quantized activation vector in scratch (xkind not XF32). */
static size_t ks_mm_x_stride(ks_mm_xkind xkind, bool xt, ks_simd_level level, int64_t cols) {
    return xkind == KS_MM_XQ8K      ? ks_mm_q8k_stride(cols)
           : xkind == KS_MM_XQ8S    ? ks_mm_q8s_stride(cols)
           : xt                     ? ks_mm_q8t_stride(cols)
           : level == KS_SIMD_AVX512 ? ks_mm_q8x_stride(cols)
                                     : ks_mm_q8_stride(cols);
}

void ks_matmul_quantize_x(const ks_weight *w, const float *x, int64_t c, void *scratch) {
    const ks_simd_level level = ks_simd_current();
    const ks_mm_xkind xkind = ks_mm_xkind_of(w->type);
    if (xkind == KS_MM_XF32) return; /* float weights read X itself */
    KS_ASSERT(scratch != NULL && ((uintptr_t)scratch & 63) == 0 && c >= 0);
    const bool xt = w->layout == KS_WEIGHT_Q8_0_P16 && level == KS_SIMD_AVX512; /* as ks_matmul_weight_ex */
    const size_t xs = ks_mm_x_stride(xkind, xt, level, w->cols);
    const ks_mm_job job = {.level = level, .wtype = w->type, .xkind = xkind, .cols = w->cols, .X = x,
                           .scratch = (uint8_t *)scratch + (size_t)c * xs, .xs = xs, .xt = xt};
    ks_mm_quantize_one(&job, 0);
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
    const bool eight = job->kern8 && job->n >= KS_MM_PAIR_N;
    /* vectors per eight-row tile call: up to KS_MM_T8_NC (the weight unpack
     * shared by more vectors; a tile reads its eight rows and vectors
     * super-block by super-block, from L2), also where the L1 rule above
     * leaves fewer (rows of 8192 columns) */
    if (eight && vg < KS_MM_T8_NC) vg = KS_MM_T8_NC;
    if (job->n <= vg) chunk = r_end - r_begin; /* one pass: W streams once regardless */
    /* Two-row tiles share each activation load by two rows, halving L2
     * traffic, which only matters once a tile's activations outgrow L1 (long
     * rows, n > 1); on short rows two interleaved row streams defeat the
     * prefetcher, so they are used only where they pay. */
    /* smmla (i8mm) does two rows by two vectors per instruction: the
     * two-row form, which every quantized type has at that level
     * (matmul_neon.c, the same bits as the one-row sdot kernels), pays
     * there whenever there are two vectors. */
    /* The AVX2 prefill tiles (matmul_x86_panel.c) are taken from
     * KS_MM_PAIR_N vectors on, below which (decode, small batches) the
     * one-row kernels stream W. */
    const bool pair = job->kern2 && job->n > 1 &&
                      (job->level == KS_SIMD_NEON_I8MM || KS_MM_NC * job->xs > KS_MM_GROUP_L1 ||
                       (job->level == KS_SIMD_AVX2 && job->n >= KS_MM_PAIR_N));

    for (int64_t r0 = r_begin; r0 < r_end; r0 += chunk) {
        int64_t r1 = r0 + chunk < r_end ? r0 + chunk : r_end;
        for (int64_t c0 = 0; c0 < job->n; c0 += vg) {
            int64_t c1 = c0 + vg < job->n ? c0 + vg : job->n;
            if (job->kernr && !pair && c1 - c0 <= KS_MM_NC) { /* one tile: all rows in one call */
                job->kernr(job->W + (size_t)r0 * job->wrow, job->wrow, r1 - r0, job->xq + (size_t)c0 * job->xs,
                           job->xs, (int)(c1 - c0), job->cols, job->Y + c0 * job->rows + r0, job->rows);
                continue;
            }
            for (int64_t r = r0; r < r1;) {
                const uint8_t *w = job->W + (size_t)r * job->wrow;
                if (eight && r + 8 <= r1) {
                    for (int64_t c = c0; c < c1; c += KS_MM_T8_NC) {
                        const int nc = (int)(c1 - c < KS_MM_T8_NC ? c1 - c : KS_MM_T8_NC);
                        job->kern8(w, job->wrow, job->xq + (size_t)c * job->xs, job->xs, nc, job->cols,
                                   job->Y + c * job->rows + r, job->rows);
                    }
                    r += 8;
                    continue;
                }
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
        .kern8 = ks_mm_kernel8(wtype, level),
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
        .kernr = ks_mm_kernel_rows(wtype, level),
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
        job.xs = ks_mm_x_stride(job.xkind, job.xt, level, cols);
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

/* ------------------------------------------- packed layouts (prefill GEMM) --
 * ks_matmul_pack, ks_matmul_weight and their drivers: matmul_packed.c. */
#define KS_MM_PACKED_PART 1
#include "matmul_packed.c"
#undef KS_MM_PACKED_PART

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
