/*
 * spec_proj.c — SpeContext's head projections at batch 1 (spec_proj.h).
 *
 * Why a kernel of its own: at batch 1 ks_matmul's float kernel keeps one
 * accumulator per output row, so each 16 weights wait for the previous FMA
 * (four cycles of latency): a core converts and multiplies a bf16 row at
 * about 8 bytes a cycle, and on a 2-core host whose other work preempts a
 * worker now and then, the head's 46 MB of bf16 projections (Llama-3.2-1B's
 * draft) took longer than streaming them needs.  Here four rows run side by
 * side: four independent chains share each load of x, so the FMA latency is
 * hidden and the loop is bound by loads and conversions.
 *
 * Exactness: each row's accumulator sees the same FMAs in the same column
 * order as ks_matmul's body at the level in force (AVX-512: lane l sums
 * columns l, l + 16, ..., then _mm512_reduce_add_ps; AVX2: 8 lanes, then
 * ks_mm_hsum8's reduction; NEON: rows_dot_neon), and cols is a multiple of 16 (no scalar tail),
 * so y is bit for bit ks_matmul's: the head's queries, keys and selections
 * do not move (tests/test_spec_proj.c checks it at each level).
 */
#include "spec/spec_proj.h"

#include "core/simd.h"

#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
/* software prefetch distance on each row's stream: four rows per thread
 * are more streams than the hardware prefetcher runs ahead on (2048 bytes
 * measured fastest of 0-4096 on Zen 4, ~30% over none on a loaded host) */
#define SPEC_PF 2048
#define SPEC_PROJ_TGT "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq"
#define SPEC_PROJ_INL static inline __attribute__((target(SPEC_PROJ_TGT), always_inline))

/* 16 weights at p as f32 lanes, as ks_matmul's AVX-512 loads convert them */
SPEC_PROJ_INL __m512 load_w(const void *p, const int T) {
    if (T == 2) return _mm512_loadu_ps((const float *)p);
    if (T == 1) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

/* y[r] for R rows starting at w (rows of rb bytes, es bytes per element) */
SPEC_PROJ_INL void rows_dot(const uint8_t *w, size_t rb, size_t es, const float *x, int64_t cols, float *y, const int R,
                            const int T) {
    __m512 acc[4];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t i = 0; i < cols; i += 16) {
        __m512 xv = _mm512_loadu_ps(x + i);
        if (T == 2 || (i & 31) == 0) /* once per 64-byte line */
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
                _mm_prefetch((const char *)(w + (size_t)r * rb + (size_t)i * es) + SPEC_PF, _MM_HINT_T0);
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
            acc[r] = _mm512_fmadd_ps(load_w(w + (size_t)r * rb + (size_t)i * es, T), xv, acc[r]);
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) y[r] = _mm512_reduce_add_ps(acc[r]);
}

SPEC_PROJ_INL void rows_span(const ks_spec_proj_mat *m, int64_t r0, int64_t r1, const float *x, const int T) {
    size_t es = T == 2 ? 4 : 2, rb = es * (size_t)m->cols;
    const uint8_t *w = m->w;
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) rows_dot(w + (size_t)r * rb, rb, es, x, m->cols, m->y + r, 4, T);
    for (; r < r1; r++) rows_dot(w + (size_t)r * rb, rb, es, x, m->cols, m->y + r, 1, T);
}

/* The AVX2 form (AMD Zen 1-3, most laptops): ks_matmul's AVX2 float body
 * is one 8-lane FMA chain per row (lane l sums columns l, l + 8, ...), then
 * ks_mm_hsum8's reduction (the halves, movehl, movehdup); four rows share
 * each load of x here, with the same per-row order and the same reduction,
 * so y is bit for bit ks_matmul's at this level. */
#define SPEC_PROJ2_INL static inline __attribute__((target("avx2,fma,f16c"), always_inline))
SPEC_PROJ2_INL __m256 load_w8(const void *p, const int T) {
    if (T == 2) return _mm256_loadu_ps((const float *)p);
    if (T == 1) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
SPEC_PROJ2_INL float hsum8(__m256 v) { /* ks_mm_hsum8's order */
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
SPEC_PROJ2_INL void rows_dot8(const uint8_t *w, size_t rb, size_t es, const float *x, int64_t cols, float *y,
                              const int R, const int T) {
    __m256 acc[4];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < cols; i += 8) {
        __m256 xv = _mm256_loadu_ps(x + i);
        if ((i * (int64_t)es & 63) == 0) /* once per 64-byte line */
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
                _mm_prefetch((const char *)(w + (size_t)r * rb + (size_t)i * es) + SPEC_PF, _MM_HINT_T0);
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
            acc[r] = _mm256_fmadd_ps(load_w8(w + (size_t)r * rb + (size_t)i * es, T), xv, acc[r]);
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) y[r] = hsum8(acc[r]);
}
SPEC_PROJ2_INL void rows_span8(const ks_spec_proj_mat *m, int64_t r0, int64_t r1, const float *x, const int T) {
    size_t es = T == 2 ? 4 : 2, rb = es * (size_t)m->cols;
    const uint8_t *w = m->w;
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) rows_dot8(w + (size_t)r * rb, rb, es, x, m->cols, m->y + r, 4, T);
    for (; r < r1; r++) rows_dot8(w + (size_t)r * rb, rb, es, x, m->cols, m->y + r, 1, T);
}
__attribute__((target("avx2,fma,f16c"))) static void rows_avx2(const ks_spec_proj_mat *m, int64_t r0, int64_t r1,
                                                               const float *x) {
    switch (m->type) {
    case KS_DTYPE_F32: rows_span8(m, r0, r1, x, 2); break;
    case KS_DTYPE_F16: rows_span8(m, r0, r1, x, 1); break;
    default: rows_span8(m, r0, r1, x, 0); break;
    }
}

__attribute__((target(SPEC_PROJ_TGT))) static void rows_avx512(const ks_spec_proj_mat *m, int64_t r0, int64_t r1,
                                                               const float *x) {
    switch (m->type) {
    case KS_DTYPE_F32: rows_span(m, r0, r1, x, 2); break;
    case KS_DTYPE_F16: rows_span(m, r0, r1, x, 1); break;
    default: rows_span(m, r0, r1, x, 0); break;
    }
}
#endif

#if defined(__aarch64__)
#include <arm_neon.h>
/* The NEON form (every AArch64 level: ks_matmul runs its float kernels,
 * ks_mm_f32/f16/bf16_neon, at dotprod and i8mm too): there each row is two
 * 4-lane FMA chains over 8 columns a step (columns i..i+3 into the first,
 * i+4..i+7 into the second), then vaddvq_f32 of their sum; with cols a
 * multiple of 16 no scalar tail.  Four rows share each load of x here with
 * that very order, so y is bit for bit ks_matmul's on ARM as well; eight
 * chains in flight cover the FMA latency that one row's two cannot. */
#define SPEC_PF_NEON 2048 /* SPEC_PF's distance: not measured on ARM */
static inline __attribute__((always_inline)) void load_w8_neon(const uint8_t *p, float32x4_t *a, float32x4_t *b,
                                                               const int T) {
    if (T == 2) {
        *a = vld1q_f32((const float *)p), *b = vld1q_f32((const float *)p + 4);
    } else if (T == 1) {
        uint16x8_t h = vld1q_u16((const uint16_t *)p);
        *a = vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(h)));
        *b = vcvt_high_f32_f16(vreinterpretq_f16_u16(h));
    } else {
        uint16x8_t h = vld1q_u16((const uint16_t *)p);
        *a = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16));
        *b = vreinterpretq_f32_u32(vshll_high_n_u16(h, 16));
    }
}
static inline __attribute__((always_inline)) void rows_dot_neon(const uint8_t *w, size_t rb, size_t es,
                                                                 const float *x, int64_t cols, float *y, const int R,
                                                                 const int T) {
    float32x4_t acc[4][2];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = vdupq_n_f32(0.0f);
    for (int64_t i = 0; i < cols; i += 8) {
        const float32x4_t x0 = vld1q_f32(x + i), x1 = vld1q_f32(x + i + 4);
        if ((i * (int64_t)es & 63) == 0) /* once per 64-byte line */
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
                __builtin_prefetch(w + (size_t)r * rb + (size_t)i * es + SPEC_PF_NEON);
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            float32x4_t w0, w1;
            load_w8_neon(w + (size_t)r * rb + (size_t)i * es, &w0, &w1, T);
            acc[r][0] = vfmaq_f32(acc[r][0], w0, x0);
            acc[r][1] = vfmaq_f32(acc[r][1], w1, x1);
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) y[r] = vaddvq_f32(vaddq_f32(acc[r][0], acc[r][1]));
}
static inline __attribute__((always_inline)) void rows_span_neon(const ks_spec_proj_mat *m, int64_t r0, int64_t r1,
                                                                  const float *x, const int T) {
    size_t es = T == 2 ? 4 : 2, rb = es * (size_t)m->cols;
    const uint8_t *w = m->w;
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) rows_dot_neon(w + (size_t)r * rb, rb, es, x, m->cols, m->y + r, 4, T);
    for (; r < r1; r++) rows_dot_neon(w + (size_t)r * rb, rb, es, x, m->cols, m->y + r, 1, T);
}
static void rows_neon(const ks_spec_proj_mat *m, int64_t r0, int64_t r1, const float *x) {
    switch (m->type) {
    case KS_DTYPE_F32: rows_span_neon(m, r0, r1, x, 2); break;
    case KS_DTYPE_F16: rows_span_neon(m, r0, r1, x, 1); break;
    default: rows_span_neon(m, r0, r1, x, 0); break;
    }
}
#endif

bool ks_spec_proj_supported(ks_dtype type, int64_t cols) {
#if defined(__x86_64__) || defined(__aarch64__)
    ks_simd_level lv = ks_simd_current();
#if defined(__x86_64__)
    bool simd = ks_simd_x86(lv);
#else
    bool simd = lv >= KS_SIMD_NEON;
#endif
    return simd && cols > 0 && cols % 16 == 0 &&
           (type == KS_DTYPE_BF16 || type == KS_DTYPE_F16 || type == KS_DTYPE_F32);
#else
    (void)type;
    (void)cols;
    return false;
#endif
}

const char *ks_spec_proj_kernel_name(void) {
    if (!ks_spec_proj_supported(KS_DTYPE_BF16, 16)) return NULL;
#if defined(__aarch64__)
    return "neon";
#else
    return ks_simd_current() == KS_SIMD_AVX512 ? "avx512" : "avx2";
#endif
}

typedef struct {
    const ks_spec_proj_mat *mats;
    int n_mats;
    const float *x;
    bool avx512; /* else the AVX2 form: ks_matmul's order at the level in force */
} proj_job;

/* The rows of all matrices in one sequence, in units of four rows, shared
 * out evenly (the matrices have the same row length). */
static void proj_worker(void *arg, int ith, int nth) {
#if defined(__x86_64__) || defined(__aarch64__)
    const proj_job *j = arg;
    int64_t units = 0;
    for (int i = 0; i < j->n_mats; i++) units += (j->mats[i].rows + 3) / 4;
    int64_t u0, u1;
    ks_pool_share(units, ith, nth, &u0, &u1);
    int64_t base = 0;
    for (int i = 0; i < j->n_mats && u0 < u1; i++) {
        const ks_spec_proj_mat *m = &j->mats[i];
        int64_t mu = (m->rows + 3) / 4;
        int64_t a = u0 > base ? u0 - base : 0, b = u1 - base < mu ? u1 - base : mu;
        if (a < b) {
            int64_t r0 = a * 4, r1 = b * 4 < m->rows ? b * 4 : m->rows;
#if defined(__x86_64__)
            if (j->avx512) rows_avx512(m, r0, r1, j->x);
            else rows_avx2(m, r0, r1, j->x);
#else
            rows_neon(m, r0, r1, j->x);
#endif
        }
        base += mu;
    }
#else
    (void)arg;
    (void)ith;
    (void)nth;
#endif
}

void ks_spec_proj(ks_pool *pool, const ks_spec_proj_mat *mats, int n_mats, const float *x) {
    for (int i = 0; i < n_mats; i++) KS_ASSERT(ks_spec_proj_supported(mats[i].type, mats[i].cols));
    proj_job j = {.mats = mats, .n_mats = n_mats, .x = x, .avx512 = ks_simd_current() == KS_SIMD_AVX512};
    ks_pool_run(pool, proj_worker, &j);
}
