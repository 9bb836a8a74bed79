/*
 * page_bounds.c — Quest's page score, the upper bound of q . k over a page
 * from its per-channel key min and max: sum_i max(q_i min_i, q_i max_i).
 * One page for one head (AVX2, portable), one page for a group of heads
 * (AVX-512, min and max read once), and every page of a head from the f16
 * bounds an f16 cache's store keeps (four pages x four heads per AVX-512
 * pass, the group max optionally fused in).  Quest and FreeKV score with
 * these.
 */
#include "policy/policy.h"
#include "kv/kv.h"
#include "core/simd.h"
#include "tensor/dtype.h"
#include "tensor/simd_avx2.h"
#include "tensor/simd_avx512.h"

#include <math.h>
#include <string.h>
#if defined(__aarch64__)
#include <arm_neon.h>
static void pages_neon(const float *q, int32_t G, const void *const *kb, int32_t np, int32_t hd, float *out,
                       float *red_max, int T8);
#endif

/* A page's 8-bit bounds (kv_meta.h): the scale, then int8 lo[hd], hi[hd]. */
static inline float bounds8_scale(const uint8_t *b) {
    float s;
    memcpy(&s, b, sizeof s);
    return s;
}

#if defined(__x86_64__)
/* Eight lanes of max(q*min, q*max), summed at the end: the scalar loop's add
 * chain made Quest's page scoring ~12% of a 16K decode step on AVX2 hosts. */
KS_AVX2_TGT static float page_upper_bound_avx2(const float *q, const float *kmin, const float *kmax, int32_t hd) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int32_t i = 0;
    for (; i + 16 <= hd; i += 16) {
        __m256 q0 = _mm256_loadu_ps(q + i), q1 = _mm256_loadu_ps(q + i + 8);
        acc0 = _mm256_add_ps(acc0, _mm256_max_ps(_mm256_mul_ps(q0, _mm256_loadu_ps(kmin + i)),
                                                 _mm256_mul_ps(q0, _mm256_loadu_ps(kmax + i))));
        acc1 = _mm256_add_ps(acc1, _mm256_max_ps(_mm256_mul_ps(q1, _mm256_loadu_ps(kmin + i + 8)),
                                                 _mm256_mul_ps(q1, _mm256_loadu_ps(kmax + i + 8))));
    }
    __m256 acc = _mm256_add_ps(acc0, acc1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    float s = _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
    for (; i < hd; i++) {
        float a = q[i] * kmin[i], b = q[i] * kmax[i];
        s += a > b ? a : b;
    }
    return s;
}

/* A page's f16 bounds to f32 by F16C, eight at a time; returns how many it
 * converted (the caller does the rest).  The conversion is exact, so the
 * floats, and the bounds, are those of ks_f16_to_f32: on AVX2 hosts the
 * scalar conversion was 9% of a 128K sparse prefill's CPU time and the loop
 * around it 6% (perf, docs/BENCHMARKS.md "128K"), more than the bounds. */
KS_AVX2_TGT static int32_t f16_to_f32_f16c(const uint16_t *src, float *dst, int32_t n) {
    int32_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(src + i))));
    return i;
}

/* The AVX2 kernel's arithmetic in 16 lanes: lanes 0-7 of acc are its acc0
 * and lanes 8-15 its acc1, summed in the same order, so each bound is bit
 * for bit page_upper_bound_avx2's; the min and max chunks are loaded once
 * for up to 8 heads.  F16: kmin, kmax are f16 (exact conversions of the f32
 * summaries, so the same values and the same bounds). */
#define PAGE_BOUNDS_AVX512(NAME, KT, LOAD, SCALAR)                                                                \
    __attribute__((target("avx512f,avx512dq,avx512vl,f16c"))) static void NAME(                                  \
        const float *q, int32_t G, const KT *kmin, const KT *kmax, int32_t hd, float *out, size_t stride) {     \
        for (int32_t g0 = 0; g0 < G; g0 += 8) {                                                                   \
            int32_t ng = G - g0 < 8 ? G - g0 : 8;                                                                 \
            __m512 acc[8];                                                                                        \
            for (int32_t g = 0; g < 8; g++) acc[g] = _mm512_setzero_ps();                                         \
            int32_t i = 0;                                                                                        \
            for (; i + 16 <= hd; i += 16) {                                                                       \
                __m512 lo = LOAD(kmin + i), hi = LOAD(kmax + i);                                                  \
                for (int32_t g = 0; g < ng; g++) {                                                                \
                    __m512 qv = _mm512_loadu_ps(q + (size_t)(g0 + g) * hd + i);                                   \
                    acc[g] = _mm512_add_ps(acc[g], _mm512_max_ps(_mm512_mul_ps(qv, lo), _mm512_mul_ps(qv, hi)));  \
                }                                                                                                 \
            }                                                                                                     \
            for (int32_t g = 0; g < ng; g++) {                                                                    \
                const float *qg = q + (size_t)(g0 + g) * hd;                                                      \
                __m256 a = _mm256_add_ps(_mm512_castps512_ps256(acc[g]), _mm512_extractf32x8_ps(acc[g], 1));      \
                __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));                    \
                h = _mm_add_ps(h, _mm_movehl_ps(h, h));                                                           \
                float s = _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));                                       \
                for (int32_t t = i; t < hd; t++) {                                                                \
                    float x = qg[t] * SCALAR(kmin[t]), y = qg[t] * SCALAR(kmax[t]);                               \
                    s += x > y ? x : y;                                                                           \
                }                                                                                                 \
                out[(size_t)(g0 + g) * stride] = s;                                                               \
            }                                                                                                     \
        }                                                                                                         \
    }
#define LOAD_F32(p) _mm512_loadu_ps(p)
#define LOAD_F16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(p)))
#define SCALAR_F32(x) (x)
#define SCALAR_F16(x) ks_f16_to_f32(x)
PAGE_BOUNDS_AVX512(page_upper_bounds_avx512, float, LOAD_F32, SCALAR_F32)
PAGE_BOUNDS_AVX512(page_upper_bounds16_avx512, uint16_t, LOAD_F16, SCALAR_F16)

/* ks_page_upper_bounds16_pages and ks_page_upper_bounds8_pages, AVX-512, hd
 * a multiple of 16: for each group of up to four heads, q+ and q- once;
 * then per four pages and 16 channels, the pages' lo and hi converted once
 * and two FMAs per (page, head) into sixteen accumulators, reduced together
 * at the end and times the page's scale (1 for f16 bounds). */
#define PAGES_AVX512(NAME, KT, LOAD_LO, LOAD_HI, SCALE, BYTES)                                                     \
    __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,f16c"))) static void NAME(                          \
        const float *q, int32_t G, const KT *const *kb, int32_t np, int32_t hd, float *out, float *red_max) {      \
        float qp[4][1024] __attribute__((aligned(64))), qn[4][1024] __attribute__((aligned(64)));                 \
        for (int32_t g0 = 0; g0 < G; g0 += 4) {                                                                   \
            int32_t ng = G - g0 < 4 ? G - g0 : 4;                                                                 \
            const __m512i rep4 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);               \
            const __m512i first4 = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);            \
            const __mmask16 present = (__mmask16)(0x1111 * ((1u << ng) - 1)); /* lanes of heads < ng */          \
            for (int32_t g = 0; g < 4; g++)                                                                       \
                for (int32_t i = 0; i < hd; i++) {                                                                \
                    float x = g < ng ? q[(size_t)(g0 + g) * hd + i] : 0.0f;                                       \
                    qp[g][i] = x > 0 ? x : 0.0f;                                                                  \
                    qn[g][i] = x < 0 ? x : 0.0f;                                                                  \
                }                                                                                                 \
            for (int32_t p = 0; p < np; p += 4) {                                                                 \
                int32_t nr = np - p < 4 ? np - p : 4;                                                             \
                const KT *b[4];                                                                                   \
                for (int32_t r = 0; r < 4; r++) b[r] = kb[p + (r < nr ? r : 0)]; /* a short group repeats a page */ \
                if (g0 == 0 && p + 12 <= np) /* the pages two groups ahead: their ids need not be adjacent */    \
                    for (int32_t r = 8; r < 12; r++) ks_prefetch_lines(kb[p + r], BYTES);                        \
                __m512 acc[16];                                                                                   \
                _Pragma("GCC unroll 16") for (int a = 0; a < 16; a++) acc[a] = _mm512_setzero_ps();               \
                for (int32_t i = 0; i < hd; i += 16) {                                                            \
                    __m512 lo[4], hi[4];                                                                          \
                    _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++) {                                         \
                        lo[r] = LOAD_LO(b[r], i);                                                                 \
                        hi[r] = LOAD_HI(b[r], i);                                                                 \
                    }                                                                                             \
                    _Pragma("GCC unroll 4") for (int g = 0; g < 4; g++) {                                         \
                        __m512 pp = _mm512_load_ps(&qp[g][i]), pn = _mm512_load_ps(&qn[g][i]);                    \
                        _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++)                                       \
                            acc[4 * r + g] = _mm512_fmadd_ps(pp, hi[r], _mm512_fmadd_ps(pn, lo[r], acc[4 * r + g])); \
                    }                                                                                             \
                }                                                                                                 \
                __m512 bv = ks_avx512_reduce16(acc); /* lane 4 * page + head */                                  \
                if (!out && nr == 4) { /* the group max alone, in registers */                                  \
                    bv = _mm512_mul_ps(bv, _mm512_permutexvar_ps(rep4, _mm512_castps128_ps512(_mm_setr_ps(         \
                                             SCALE(b[0]), SCALE(b[1]), SCALE(b[2]), SCALE(b[3])))));             \
                    bv = _mm512_mask_blend_ps(present, _mm512_set1_ps(-INFINITY), bv);                             \
                    bv = _mm512_max_ps(bv, _mm512_permute_ps(bv, 0xB1));                                             \
                    bv = _mm512_max_ps(bv, _mm512_permute_ps(bv, 0x4E)); /* lane 4 * page: the page's max */        \
                    __m128 m = _mm512_castps512_ps128(_mm512_permutexvar_ps(first4, bv));                          \
                    if (g0 > 0) m = _mm_max_ps(m, _mm_loadu_ps(red_max + p));                                     \
                    _mm_storeu_ps(red_max + p, m);                                                                \
                    continue;                                                                                     \
                }                                                                                                 \
                float s[16];                                                                                      \
                _mm512_storeu_ps(s, bv);                                                                           \
                for (int32_t r = 0; r < nr; r++) {                                                                \
                    float sc = SCALE(b[r]);                                                                       \
                    float mx = s[4 * r] * sc;                                                                     \
                    for (int32_t g = 0; g < ng; g++) {                                                            \
                        float v = s[4 * r + g] * sc;                                                              \
                        if (out) out[(size_t)(g0 + g) * np + p + r] = v;                                          \
                        mx = v > mx ? v : mx;                                                                     \
                    }                                                                                             \
                    if (red_max) red_max[p + r] = g0 == 0 || mx > red_max[p + r] ? mx : red_max[p + r];          \
                }                                                                                                 \
            }                                                                                                     \
        }                                                                                                         \
    }
#define LO16(b, i) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)((b) + (i))))
#define HI16(b, i) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)((b) + hd + (i))))
#define ONE(b) 1.0f
/* the f16 products times 1.0f are the products: bounds as before, bit for bit */
PAGES_AVX512(page_bounds16_pages_avx512, uint16_t, LO16, HI16, ONE, 4 * (size_t)hd)
#define LO8(b, i) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)((b) + 4 + (i)))))
#define HI8(b, i) \
    _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)((b) + 4 + hd + (i)))))
PAGES_AVX512(page_bounds8_pages_avx512, uint8_t, LO8, HI8, bounds8_scale, 4 + 2 * (size_t)hd)
#endif

#if defined(__x86_64__)
/* ks_page_upper_bounds16_pages and ks_page_upper_bounds8_pages on AVX2
 * hosts (PAGES_AVX512 in 8 lanes), hd a multiple of 8: the per-page path
 * converted each page's bounds to floats in a scalar loop and summed one
 * head at a time, most of Quest's selection at 32K tokens.  Here, for each
 * group of up to four heads, q+ and q- once; then per two pages and 8
 * channels, the pages' lo and hi converted once and two FMAs per (page,
 * head) into eight accumulators (2 x 4: what 16 ymm registers hold with the
 * operands), reduced together by ks_avx2_reduce8.  The bounds are the FMA
 * form's (PAGES_AVX512's rounding): the per-page ones up to rounding. */
KS_AVX2_INL __m256 pages_load_avx2(const void *b, int32_t i, const int T8) {
    if (T8) return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)((const uint8_t *)b + 4 + i))));
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)((const uint16_t *)b + i)));
}
KS_AVX2_INL void pages_avx2(const float *q, int32_t G, const void *const *kb, int32_t np, int32_t hd, float *out,
                            float *red_max, const int T8) {
    float qp[4][1024] __attribute__((aligned(32))), qn[4][1024] __attribute__((aligned(32)));
    const size_t hi_off = (size_t)hd; /* elements from lo to hi, either type */
    const size_t bytes = T8 ? 4 + 2 * (size_t)hd : 4 * (size_t)hd;
    for (int32_t g0 = 0; g0 < G; g0 += 4) {
        int32_t ng = G - g0 < 4 ? G - g0 : 4;
        for (int32_t g = 0; g < 4; g++)
            for (int32_t i = 0; i < hd; i++) {
                float x = g < ng ? q[(size_t)(g0 + g) * hd + i] : 0.0f;
                qp[g][i] = x > 0 ? x : 0.0f;
                qn[g][i] = x < 0 ? x : 0.0f;
            }
        for (int32_t p = 0; p < np; p += 2) {
            int32_t nr = np - p < 2 ? np - p : 2;
            const void *b[2] = {kb[p], kb[p + (nr > 1)]}; /* a short group repeats a page */
            if (g0 == 0 && p + 6 <= np) /* the pages two groups ahead: their ids need not be adjacent */
                for (int32_t r = 4; r < 6; r++) ks_prefetch_lines(kb[p + r], bytes);
            __m256 acc[8];
            _Pragma("GCC unroll 8") for (int a = 0; a < 8; a++) acc[a] = _mm256_setzero_ps();
            for (int32_t i = 0; i < hd; i += 8) {
                __m256 lo[2], hi[2];
                _Pragma("GCC unroll 2") for (int r = 0; r < 2; r++) {
                    lo[r] = pages_load_avx2(b[r], i, T8);
                    hi[r] = pages_load_avx2(b[r], i + (int32_t)hi_off, T8);
                }
                _Pragma("GCC unroll 4") for (int g = 0; g < 4; g++) {
                    __m256 pp = _mm256_load_ps(&qp[g][i]), pn = _mm256_load_ps(&qn[g][i]);
                    _Pragma("GCC unroll 2") for (int r = 0; r < 2; r++)
                        acc[4 * r + g] = _mm256_fmadd_ps(pp, hi[r], _mm256_fmadd_ps(pn, lo[r], acc[4 * r + g]));
                }
            }
            float sv[8];
            _mm256_storeu_ps(sv, ks_avx2_reduce8(acc)); /* lane 4 * page + head */
            for (int32_t r = 0; r < nr; r++) {
                float sc = T8 ? bounds8_scale(b[r]) : 1.0f;
                float mx = sv[4 * r] * sc;
                for (int32_t g = 0; g < ng; g++) {
                    float v = sv[4 * r + g] * sc;
                    if (out) out[(size_t)(g0 + g) * np + p + r] = v;
                    mx = v > mx ? v : mx;
                }
                if (red_max) red_max[p + r] = g0 == 0 || mx > red_max[p + r] ? mx : red_max[p + r];
            }
        }
    }
}
KS_AVX2_TGT static void page_bounds8_pages_avx2(const float *q, int32_t G, const uint8_t *const *kb, int32_t np,
                                                int32_t hd, float *out, float *red_max) {
    pages_avx2(q, G, (const void *const *)kb, np, hd, out, red_max, 1);
}
KS_AVX2_TGT static void page_bounds16_pages_avx2(const float *q, int32_t G, const uint16_t *const *kb, int32_t np,
                                                 int32_t hd, float *out, float *red_max) {
    pages_avx2(q, G, (const void *const *)kb, np, hd, out, red_max, 0);
}
#endif

void ks_page_upper_bounds(const float *q, int32_t G, const float *kmin, const float *kmax, int32_t hd, float *out,
                          size_t stride) {
#if defined(__x86_64__)
    if (hd >= 16 && ks_simd_current() >= KS_SIMD_AVX512) {
        page_upper_bounds_avx512(q, G, kmin, kmax, hd, out, stride);
        return;
    }
#endif
    for (int32_t g = 0; g < G; g++) out[(size_t)g * stride] = ks_page_upper_bound(q + (size_t)g * hd, kmin, kmax, hd);
}

void ks_page_upper_bounds16(const float *q, int32_t G, const uint16_t *kbound16, int32_t hd, float *out, size_t stride) {
#if defined(__x86_64__)
    if (hd >= 16 && ks_simd_current() >= KS_SIMD_AVX512) {
        page_upper_bounds16_avx512(q, G, kbound16, kbound16 + hd, hd, out, stride);
        return;
    }
#endif
    float b[2 * KS_KV_MAX_HEAD_DIM]; /* the f32 values, then the f32 path (the store caps head dims) */
    KS_ASSERT(hd <= KS_KV_MAX_HEAD_DIM);
    int32_t i = 0;
#if defined(__x86_64__)
    if (ks_simd_current() >= KS_SIMD_AVX2) i = f16_to_f32_f16c(kbound16, b, 2 * hd);
#elif defined(__aarch64__)
    if (ks_simd_current() >= KS_SIMD_NEON) /* fcvtl, exact as F16C is: the same floats */
        for (; i + 8 <= 2 * hd; i += 8) {
            uint16x8_t h = vld1q_u16(kbound16 + i);
            vst1q_f32(b + i, vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(h))));
            vst1q_f32(b + i + 4, vcvt_f32_f16(vreinterpret_f16_u16(vget_high_u16(h))));
        }
#endif
    for (; i < 2 * hd; i++) b[i] = ks_f16_to_f32(kbound16[i]);
    ks_page_upper_bounds(q, G, b, b + hd, hd, out, stride);
}

void ks_page_upper_bounds16_pages(const float *q, int32_t G, const uint16_t *const *kb, int32_t np, int32_t hd,
                                  float *out, float *red_max) {
#if defined(__x86_64__)
    if (hd % 16 == 0 && hd <= 1024 && ks_simd_current() >= KS_SIMD_AVX512) {
        page_bounds16_pages_avx512(q, G, kb, np, hd, out, red_max);
        return;
    }
    if (hd % 8 == 0 && hd <= 1024 && ks_simd_current() >= KS_SIMD_AVX2) { /* also AVX-512 hosts at hd % 16 != 0 */
        page_bounds16_pages_avx2(q, G, kb, np, hd, out, red_max);
        return;
    }
#endif
#if defined(__aarch64__)
    if (hd % 8 == 0 && hd <= 1024 && ks_simd_current() >= KS_SIMD_NEON) {
        pages_neon(q, G, (const void *const *)kb, np, hd, out, red_max, 0);
        return;
    }
#endif
    float one[64];
    for (int32_t p = 0; p < np; p++)
        for (int32_t g0 = 0; g0 < G; g0 += 64) { /* the heads in chunks of 64 */
            int32_t ng = G - g0 < 64 ? G - g0 : 64;
            ks_page_upper_bounds16(q + (size_t)g0 * hd, ng, kb[p], hd, one, 1);
            for (int32_t g = 0; g < ng; g++) {
                if (out) out[(size_t)(g0 + g) * np + p] = one[g];
                if (red_max) red_max[p] = (g0 == 0 && g == 0) || one[g] > red_max[p] ? one[g] : red_max[p];
            }
        }
}

void ks_page_upper_bounds8_pages(const float *q, int32_t G, const uint8_t *const *kb, int32_t np, int32_t hd,
                                 float *out, float *red_max) {
#if defined(__x86_64__)
    if (hd % 16 == 0 && hd <= 1024 && ks_simd_current() >= KS_SIMD_AVX512) {
        page_bounds8_pages_avx512(q, G, kb, np, hd, out, red_max);
        return;
    }
    if (hd % 8 == 0 && hd <= 1024 && ks_simd_current() >= KS_SIMD_AVX2) { /* also AVX-512 hosts at hd % 16 != 0 */
        page_bounds8_pages_avx2(q, G, kb, np, hd, out, red_max);
        return;
    }
#endif
#if defined(__aarch64__)
    if (hd % 8 == 0 && hd <= 1024 && ks_simd_current() >= KS_SIMD_NEON) {
        pages_neon(q, G, (const void *const *)kb, np, hd, out, red_max, 1);
        return;
    }
#endif
    float b[2 * KS_KV_MAX_HEAD_DIM], one[64]; /* a page's int8 steps as floats, then the f32 bound times its scale */
    KS_ASSERT(hd <= KS_KV_MAX_HEAD_DIM);
    for (int32_t p = 0; p < np; p++) {
        const int8_t *lohi = (const int8_t *)(kb[p] + 4);
        for (int32_t i = 0; i < 2 * hd; i++) b[i] = (float)lohi[i];
        float sc = bounds8_scale(kb[p]);
        for (int32_t g0 = 0; g0 < G; g0 += 64) { /* the heads in chunks of 64 */
            int32_t ng = G - g0 < 64 ? G - g0 : 64;
            ks_page_upper_bounds(q + (size_t)g0 * hd, ng, b, b + hd, hd, one, 1);
            for (int32_t g = 0; g < ng; g++) {
                float v = one[g] * sc;
                if (out) out[(size_t)(g0 + g) * np + p] = v;
                if (red_max) red_max[p] = (g0 == 0 && g == 0) || v > red_max[p] ? v : red_max[p];
            }
        }
    }
}

#if defined(__aarch64__)
/* page_upper_bound_avx2's arithmetic in NEON: its two eight-lane
 * accumulators as four quads, reduced in its order (the halves, then pairs),
 * so a bound is the same float on either architecture.  Plain Armv8.0 NEON:
 * every AArch64 CPU has it, and every path above falls back to this one, so
 * the f16 and int8 page bounds are vectorised here too. */
static float page_upper_bound_neon(const float *q, const float *kmin, const float *kmax, int32_t hd) {
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, b0 = a0, b1 = a0; /* acc0 = [a0 a1], acc1 = [b0 b1] */
    int32_t i = 0;
    for (; i + 16 <= hd; i += 16) {
        float32x4_t q0 = vld1q_f32(q + i), q1 = vld1q_f32(q + i + 4), q2 = vld1q_f32(q + i + 8), q3 = vld1q_f32(q + i + 12);
        a0 = vaddq_f32(a0, vmaxq_f32(vmulq_f32(q0, vld1q_f32(kmin + i)), vmulq_f32(q0, vld1q_f32(kmax + i))));
        a1 = vaddq_f32(a1, vmaxq_f32(vmulq_f32(q1, vld1q_f32(kmin + i + 4)), vmulq_f32(q1, vld1q_f32(kmax + i + 4))));
        b0 = vaddq_f32(b0, vmaxq_f32(vmulq_f32(q2, vld1q_f32(kmin + i + 8)), vmulq_f32(q2, vld1q_f32(kmax + i + 8))));
        b1 = vaddq_f32(b1, vmaxq_f32(vmulq_f32(q3, vld1q_f32(kmin + i + 12)), vmulq_f32(q3, vld1q_f32(kmax + i + 12))));
    }
    float32x4_t h = vaddq_f32(vaddq_f32(a0, b0), vaddq_f32(a1, b1)); /* acc's low half + high half */
    float32x2_t p = vadd_f32(vget_low_f32(h), vget_high_f32(h));      /* [h0 + h2, h1 + h3] */
    float s = vget_lane_f32(p, 0) + vget_lane_f32(p, 1);
    for (; i < hd; i++) {
        float a = q[i] * kmin[i], b = q[i] * kmax[i];
        s += a > b ? a : b;
    }
    return s;
}
#endif

#if defined(__aarch64__)
/* pages_avx2 in NEON (every AArch64 CPU; issue 51): for each group of up to
 * four heads, q+ and q- once; per four pages and 4 channels the pages' lo
 * and hi converted once (int8 by two widenings, f16 by FCVTL) and two FMAs
 * per (page, head) into sixteen accumulators (of 32 q registers).  The
 * bounds are the FMA form's, as on x86: the per-page ones up to rounding. */
static inline float32x4_t pages_load_f16_neon(const void *b, int32_t i) {
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)b + i)));
}
static void pages_neon(const float *q, int32_t G, const void *const *kb, int32_t np, int32_t hd, float *out,
                       float *red_max, int T8) {
    float qp[4][1024] __attribute__((aligned(16))), qn[4][1024] __attribute__((aligned(16)));
    for (int32_t g0 = 0; g0 < G; g0 += 4) {
        int32_t ng = G - g0 < 4 ? G - g0 : 4;
        for (int32_t g = 0; g < 4; g++)
            for (int32_t i = 0; i < hd; i++) {
                float x = g < ng ? q[(size_t)(g0 + g) * hd + i] : 0.0f;
                qp[g][i] = x > 0 ? x : 0.0f;
                qn[g][i] = x < 0 ? x : 0.0f;
            }
        for (int32_t p = 0; p < np; p += 4) {
            int32_t nr = np - p < 4 ? np - p : 4;
            const void *b[4];
            for (int32_t r = 0; r < 4; r++) b[r] = kb[p + (r < nr ? r : 0)]; /* a short group repeats a page */
            float32x4_t acc[16];
            for (int a = 0; a < 16; a++) acc[a] = vdupq_n_f32(0.0f);
            for (int32_t i = 0; i < hd; i += 8) { /* two chunks of 4 channels: 8 int8 steps per load */
                for (int32_t h = 0; h < 2; h++) {
                    float32x4_t lo[4], hi[4];
                    for (int r = 0; r < 4; r++) {
                        if (T8) {
                            int8x8_t l8 = vld1_s8((const int8_t *)b[r] + 4 + i), h8 = vld1_s8((const int8_t *)b[r] + 4 + hd + i);
                            int16x8_t l16 = vmovl_s8(l8), h16 = vmovl_s8(h8);
                            lo[r] = vcvtq_f32_s32(vmovl_s16(h ? vget_high_s16(l16) : vget_low_s16(l16)));
                            hi[r] = vcvtq_f32_s32(vmovl_s16(h ? vget_high_s16(h16) : vget_low_s16(h16)));
                        } else {
                            lo[r] = pages_load_f16_neon(b[r], i + 4 * h);
                            hi[r] = pages_load_f16_neon(b[r], hd + i + 4 * h);
                        }
                    }
                    for (int g = 0; g < 4; g++) {
                        float32x4_t pp = vld1q_f32(&qp[g][i + 4 * h]), pn = vld1q_f32(&qn[g][i + 4 * h]);
                        for (int r = 0; r < 4; r++)
                            acc[4 * r + g] = vfmaq_f32(vfmaq_f32(acc[4 * r + g], pn, lo[r]), pp, hi[r]);
                    }
                }
            }
            for (int32_t r = 0; r < nr; r++) {
                float sc = 1.0f;
                if (T8) sc = bounds8_scale(b[r]);
                float mx = vaddvq_f32(acc[4 * r]) * sc;
                for (int32_t g = 0; g < ng; g++) {
                    float v = vaddvq_f32(acc[4 * r + g]) * sc;
                    if (out) out[(size_t)(g0 + g) * np + p + r] = v;
                    mx = v > mx ? v : mx;
                }
                if (red_max) red_max[p + r] = g0 == 0 || mx > red_max[p + r] ? mx : red_max[p + r];
            }
        }
    }
}
#endif

const char *ks_page_bounds_pages_kernel_name(int32_t hd) {
    ks_simd_level lv = ks_simd_current();
#if defined(__x86_64__)
    if (hd % 16 == 0 && hd <= 1024 && lv >= KS_SIMD_AVX512) return "avx512";
    if (hd % 8 == 0 && hd <= 1024 && lv >= KS_SIMD_AVX2) return "avx2";
#elif defined(__aarch64__)
    if (hd % 8 == 0 && hd <= 1024 && lv >= KS_SIMD_NEON) return "neon";
#endif
    (void)lv;
    (void)hd;
    return "scalar";
}

const char *ks_page_bound_kernel_name(int32_t hd) {
#if defined(__x86_64__)
    if (hd >= 16 && ks_simd_current() >= KS_SIMD_AVX2) return "avx2";
#elif defined(__aarch64__)
    if (hd >= 16 && ks_simd_current() >= KS_SIMD_NEON) return "neon";
#endif
    (void)hd;
    return "scalar";
}

float ks_page_upper_bound(const float *q, const float *kmin, const float *kmax, int32_t hd) {
#if defined(__x86_64__)
    if (hd >= 16 && ks_simd_current() >= KS_SIMD_AVX2) return page_upper_bound_avx2(q, kmin, kmax, hd);
#elif defined(__aarch64__)
    if (hd >= 16 && ks_simd_current() >= KS_SIMD_NEON) return page_upper_bound_neon(q, kmin, kmax, hd);
#endif
    float s = 0;
    for (int32_t i = 0; i < hd; i++) {
        float a = q[i] * kmin[i], b = q[i] * kmax[i];
        s += a > b ? a : b;
    }
    return s;
}
