/*
 * dtype.c — element types, their block layouts, and row conversion to/from f32.
 *
 * Why this file is plain scalar C: every conversion here runs either at load
 * time (quantizing a test matrix, dequantizing a norm vector) or as the
 * reference the SIMD kernels in matmul.c are judged against.  Clarity and
 * exact agreement with GGML's bit layouts matter far more than speed, so the
 * code mirrors the published layout descriptions one field at a time and the
 * hot paths live elsewhere.
 *
 * Half-precision conversions are done in integer arithmetic rather than with
 * F16C so the results are identical on every CPU and build flag set (round to
 * nearest even, NaN stays NaN and is made quiet, overflow goes to infinity,
 * subnormals are produced and consumed exactly).
 *
 * The K-quant quantizers are deliberately simple (min/max per sub-block, then
 * 6- or 8-bit quantization of those scales against a super-block scale) rather
 * than llama.cpp's error-minimizing search (the further types of llama.cpp's
 * mixes, Q4_1 ... IQ4_XS, are quant_types.c): they exist so tests and tools can
 * produce valid blocks, and the engine normally reads pre-quantized GGUF
 * weights.  Their round-trip error is pinned in tests/test_dtype.c.
 */
#include "tensor/dtype.h"
#include "tensor/quant_types.h"

#include "core/core.h"

#include <math.h>
#include <string.h>

_Static_assert(sizeof(ks_block_q8_0) == 34, "q8_0 block must match GGML");
_Static_assert(sizeof(ks_block_q4_0) == 18, "q4_0 block must match GGML");
_Static_assert(sizeof(ks_block_q4_k) == 144, "q4_K block must match GGML");
_Static_assert(sizeof(ks_block_q6_k) == 210, "q6_K block must match GGML");
_Static_assert(sizeof(ks_block_q8_k) == 292, "q8_K block must match GGML");

/* ------------------------------------------------------------ type table -- */

typedef struct {
    ks_dtype type;
    const char *name;
    int64_t block_size; /* elements per block */
    size_t block_bytes; /* bytes per block */
    bool weight;        /* usable as a weight type */
} ks_dtype_info;

static const ks_dtype_info ks_dtype_table[] = {
    {KS_DTYPE_F32, "f32", 1, 4, true},
    {KS_DTYPE_F16, "f16", 1, 2, true},
    {KS_DTYPE_Q4_0, "q4_0", KS_QK4_0, sizeof(ks_block_q4_0), true},
    {KS_DTYPE_Q4_1, "q4_1", 32, sizeof(ks_block_q4_1), true},
    {KS_DTYPE_Q5_0, "q5_0", 32, sizeof(ks_block_q5_0), true},
    {KS_DTYPE_Q5_1, "q5_1", 32, sizeof(ks_block_q5_1), true},
    {KS_DTYPE_Q8_0, "q8_0", KS_QK8_0, sizeof(ks_block_q8_0), true},
    {KS_DTYPE_Q2_K, "q2_K", KS_QK_K, sizeof(ks_block_q2_k), true},
    {KS_DTYPE_Q3_K, "q3_K", KS_QK_K, sizeof(ks_block_q3_k), true},
    {KS_DTYPE_Q4_K, "q4_K", KS_QK_K, sizeof(ks_block_q4_k), true},
    {KS_DTYPE_Q5_K, "q5_K", KS_QK_K, sizeof(ks_block_q5_k), true},
    {KS_DTYPE_Q6_K, "q6_K", KS_QK_K, sizeof(ks_block_q6_k), true},
    {KS_DTYPE_Q8_K, "q8_K", KS_QK_K, sizeof(ks_block_q8_k), false},
    {KS_DTYPE_IQ4_NL, "iq4_nl", 32, sizeof(ks_block_iq4_nl), true},
    {KS_DTYPE_IQ4_XS, "iq4_xs", KS_QK_K, sizeof(ks_block_iq4_xs), true},
    {KS_DTYPE_BF16, "bf16", 1, 2, true},
    {KS_DTYPE_MXFP4, "mxfp4", 32, sizeof(ks_block_mxfp4), true},
};
#define KS_DTYPE_N (sizeof ks_dtype_table / sizeof ks_dtype_table[0])

static const ks_dtype_info *ks_dtype_lookup(uint32_t t) {
    for (size_t i = 0; i < KS_DTYPE_N; i++)
        if ((uint32_t)ks_dtype_table[i].type == t) return &ks_dtype_table[i];
    return NULL;
}

bool ks_dtype_is_weight_type(uint32_t type) {
    const ks_dtype_info *in = ks_dtype_lookup(type);
    return in && in->weight;
}

const char *ks_dtype_name(ks_dtype t) {
    const ks_dtype_info *in = ks_dtype_lookup((uint32_t)t);
    return in ? in->name : "?";
}

bool ks_dtype_from_name(const char *name, ks_dtype *out) {
    if (!name) return false;
    for (size_t i = 0; i < KS_DTYPE_N; i++) {
        const char *a = ks_dtype_table[i].name, *b = name;
        /* case-insensitive: "Q4_K" and "q4_k" both name q4_K */
        while (*a && *b) {
            char ca = *a, cb = *b;
            if (ca >= 'A' && ca <= 'Z') ca = (char)(ca - 'A' + 'a');
            if (cb >= 'A' && cb <= 'Z') cb = (char)(cb - 'A' + 'a');
            if (ca != cb) break;
            a++, b++;
        }
        if (!*a && !*b) {
            *out = ks_dtype_table[i].type;
            return true;
        }
    }
    return false;
}

int64_t ks_dtype_block_size(ks_dtype t) {
    const ks_dtype_info *in = ks_dtype_lookup((uint32_t)t);
    return in ? in->block_size : 0;
}

size_t ks_dtype_block_bytes(ks_dtype t) {
    const ks_dtype_info *in = ks_dtype_lookup((uint32_t)t);
    return in ? in->block_bytes : 0;
}

size_t ks_dtype_row_bytes(ks_dtype t, int64_t n) {
    const ks_dtype_info *in = ks_dtype_lookup((uint32_t)t);
    KS_ASSERT(in != NULL);
    KS_ASSERT(n >= 0 && n % in->block_size == 0);
    return (size_t)(n / in->block_size) * in->block_bytes;
}

/* ------------------------------------------------------- half precision -- */

static inline uint32_t ks_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float ks_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float ks_f16_to_f32(ks_f16 h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24, exact in f32 */
        float v = (float)man * 0x1.0p-24f;
        return ks_bits_f32(ks_f32_bits(v) | sign);
    }
    if (exp == 31) return ks_bits_f32(sign | 0x7f800000u | (man << 13)); /* inf / nan */
    return ks_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

ks_f16 ks_f32_to_f16(float f) {
    uint32_t x = ks_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) {
        if (ax == 0x7f800000u) return (ks_f16)(sign | 0x7c00u);
        /* NaN: keep the top payload bits, force quiet so it never becomes inf */
        return (ks_f16)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    }
    if (ax >= 0x477ff000u) return (ks_f16)(sign | 0x7c00u); /* >= 65520 rounds to inf */
    if (ax < 0x38800000u) {
        /* below the smallest normal (2^-14): the result is a multiple of 2^-24.
         * Adding 0.5 (whose ulp is 2^-24) lets the FPU do the RNE rounding. */
        float v = ks_bits_f32(ax) + 0.5f;
        return (ks_f16)(sign | (ks_f32_bits(v) - 0x3f000000u));
    }
    /* normal: rebias exponent and round the 13 dropped mantissa bits to even */
    uint32_t odd = (ax >> 13) & 1u;
    ax += ((uint32_t)(15 - 127) << 23) + 0xfffu + odd;
    return (ks_f16)(sign | (ax >> 13));
}

float ks_bf16_to_f32(ks_bf16 h) { return ks_bits_f32((uint32_t)h << 16); }

ks_bf16 ks_f32_to_bf16(float f) {
    uint32_t u = ks_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (ks_bf16)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (ks_bf16)(u >> 16);
}

/* ------------------------------------------------------ block quantizers -- */

static inline int ks_round_int(float v) { return (int)lrintf(v); }

static void ks_quantize_row_q8_0(const float *x, ks_block_q8_0 *y, int64_t n) {
    for (int64_t b = 0; b < n / KS_QK8_0; b++, x += KS_QK8_0) {
        float amax = 0.0f;
        for (int i = 0; i < KS_QK8_0; i++) amax = fmaxf(amax, fabsf(x[i]));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = ks_f32_to_f16(d);
        for (int i = 0; i < KS_QK8_0; i++) y[b].qs[i] = (int8_t)ks_round_int(x[i] * id);
    }
}

static void ks_quantize_row_q4_0(const float *x, ks_block_q4_0 *y, int64_t n) {
    for (int64_t b = 0; b < n / KS_QK4_0; b++, x += KS_QK4_0) {
        /* the value of largest magnitude maps to -8 exactly (GGML's choice) */
        float amax = 0.0f, vmax = 0.0f;
        for (int i = 0; i < KS_QK4_0; i++)
            if (fabsf(x[i]) > amax) amax = fabsf(x[i]), vmax = x[i];
        float d = vmax / -8.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = ks_f32_to_f16(d);
        for (int i = 0; i < KS_QK4_0 / 2; i++) {
            int q0 = (int)(x[i] * id + 8.5f), q1 = (int)(x[i + 16] * id + 8.5f);
            q0 = q0 < 0 ? 0 : q0 > 15 ? 15 : q0;
            q1 = q1 < 0 ? 0 : q1 > 15 ? 15 : q1;
            y[b].qs[i] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

/* Q4_K 6-bit scale/min packing (GGML get_scale_min_k4 layout):
 *   j < 4:  scales[j] low 6 bits = sc[j], scales[j+4] low 6 bits = m[j]
 *   j >= 4: scales[j+4] = sc[j] low 4 | m[j] low 4 << 4, and the top 2 bits of
 *           sc[j] / m[j] go to bits 6..7 of scales[j-4] / scales[j]. */
void ks_q4k_get_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

void ks_q4k_set_scale_min(uint8_t *q /* [12] */, const uint8_t *sc /* [8] */,
                                 const uint8_t *m /* [8] */) {
    memset(q, 0, 12);
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            q[j] = sc[j];
            q[j + 4] = m[j];
        } else {
            q[j + 4] = (uint8_t)((sc[j] & 0xF) | ((m[j] & 0xF) << 4));
            q[j - 4] |= (uint8_t)((sc[j] >> 4) << 6);
            q[j] |= (uint8_t)((m[j] >> 4) << 6);
        }
    }
}

static void ks_quantize_row_q4_k(const float *x, ks_block_q4_k *y, int64_t n) {
    for (int64_t b = 0; b < n / KS_QK_K; b++, x += KS_QK_K) {
        float scale[8], mins[8], max_scale = 0.0f, max_min = 0.0f;
        for (int j = 0; j < 8; j++) {
            float lo = x[32 * j], hi = x[32 * j];
            for (int i = 1; i < 32; i++) lo = fminf(lo, x[32 * j + i]), hi = fmaxf(hi, x[32 * j + i]);
            if (lo > 0.0f) lo = 0.0f; /* the offset is a non-negative min, as in GGML */
            scale[j] = (hi - lo) / 15.0f;
            mins[j] = -lo;
            max_scale = fmaxf(max_scale, scale[j]);
            max_min = fmaxf(max_min, mins[j]);
        }
        ks_f16 dh = ks_f32_to_f16(max_scale / 63.0f), mh = ks_f32_to_f16(max_min / 63.0f);
        float d = ks_f16_to_f32(dh), dmin = ks_f16_to_f32(mh);
        uint8_t ls[8], lm[8];
        for (int j = 0; j < 8; j++) {
            /* round the scale up so the sub-block's range is never clipped */
            int s = d > 0.0f ? (int)ceilf(scale[j] / d - 1e-4f) : 0;
            int mm = dmin > 0.0f ? ks_round_int(mins[j] / dmin) : 0;
            ls[j] = (uint8_t)(s < 0 ? 0 : s > 63 ? 63 : s);
            lm[j] = (uint8_t)(mm < 0 ? 0 : mm > 63 ? 63 : mm);
        }
        y[b].d = dh;
        y[b].dmin = mh;
        ks_q4k_set_scale_min(y[b].scales, ls, lm);
        uint8_t L[KS_QK_K];
        for (int j = 0; j < 8; j++) {
            float sc = d * ls[j], m = dmin * lm[j];
            float isc = sc > 0.0f ? 1.0f / sc : 0.0f;
            for (int i = 0; i < 32; i++) {
                int q = ks_round_int((x[32 * j + i] + m) * isc);
                L[32 * j + i] = (uint8_t)(q < 0 ? 0 : q > 15 ? 15 : q);
            }
        }
        /* each 64-element chunk: low nibbles = first 32, high nibbles = next 32 */
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                y[b].qs[32 * c + l] = (uint8_t)(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
    }
}

static void ks_quantize_row_q6_k(const float *x, ks_block_q6_k *y, int64_t n) {
    for (int64_t b = 0; b < n / KS_QK_K; b++, x += KS_QK_K) {
        float scale[16], amax_scale = 0.0f, max_scale = 0.0f;
        for (int s = 0; s < 16; s++) {
            float amax = 0.0f, vmax = 0.0f;
            for (int i = 0; i < 16; i++)
                if (fabsf(x[16 * s + i]) > amax) amax = fabsf(x[16 * s + i]), vmax = x[16 * s + i];
            scale[s] = vmax / -32.0f; /* largest magnitude maps to -32 exactly */
            if (fabsf(scale[s]) > amax_scale) amax_scale = fabsf(scale[s]), max_scale = scale[s];
        }
        ks_f16 dh = ks_f32_to_f16(max_scale / -128.0f);
        float d = ks_f16_to_f32(dh);
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint8_t L[KS_QK_K];
        for (int s = 0; s < 16; s++) {
            int ls = ks_round_int(scale[s] * id);
            ls = ls < -128 ? -128 : ls > 127 ? 127 : ls;
            y[b].scales[s] = (int8_t)ls;
            float sc = d * (float)ls;
            float isc = sc != 0.0f ? 1.0f / sc : 0.0f;
            for (int i = 0; i < 16; i++) {
                int q = ks_round_int(x[16 * s + i] * isc);
                q = q < -32 ? -32 : q > 31 ? 31 : q;
                L[16 * s + i] = (uint8_t)(q + 32);
            }
        }
        y[b].d = dh;
        /* per 128-element half: ql low nibbles hold elements l and l+32, high
         * nibbles l+64 and l+96; qh[l] holds the 2-bit tops of all four. */
        for (int h = 0; h < 2; h++) {
            uint8_t *ql = y[b].ql + 64 * h, *qh = y[b].qh + 32 * h;
            const uint8_t *Lh = L + 128 * h;
            for (int l = 0; l < 32; l++) {
                uint8_t q1 = Lh[l], q2 = Lh[l + 32], q3 = Lh[l + 64], q4 = Lh[l + 96];
                ql[l] = (uint8_t)((q1 & 0xF) | ((q3 & 0xF) << 4));
                ql[l + 32] = (uint8_t)((q2 & 0xF) | ((q4 & 0xF) << 4));
                qh[l] = (uint8_t)((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
            }
        }
    }
}

static void ks_quantize_row_q8_k(const float *x, ks_block_q8_k *y, int64_t n) {
    for (int64_t b = 0; b < n / KS_QK_K; b++, x += KS_QK_K) {
        float amax = 0.0f;
        for (int i = 0; i < KS_QK_K; i++) amax = fmaxf(amax, fabsf(x[i]));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = d;
        for (int i = 0; i < KS_QK_K; i++) {
            int q = ks_round_int(x[i] * id);
            y[b].qs[i] = (int8_t)(q < -127 ? -127 : q > 127 ? 127 : q);
        }
        for (int s = 0; s < KS_QK_K / 16; s++) {
            int sum = 0;
            for (int i = 0; i < 16; i++) sum += y[b].qs[16 * s + i];
            y[b].bsums[s] = (int16_t)sum;
        }
    }
}

/* ---------------------------------------------------- block dequantizers -- */

static void ks_dequantize_row_q4_k(const ks_block_q4_k *x, float *y, int64_t n) {
    for (int64_t b = 0; b < n / KS_QK_K; b++) {
        float d = ks_f16_to_f32(x[b].d), dmin = ks_f16_to_f32(x[b].dmin);
        const uint8_t *q = x[b].qs;
        for (int c = 0; c < 4; c++, q += 32) {
            uint8_t sc0, m0, sc1, m1;
            ks_q4k_get_scale_min(2 * c, x[b].scales, &sc0, &m0);
            ks_q4k_get_scale_min(2 * c + 1, x[b].scales, &sc1, &m1);
            float d0 = d * sc0, mm0 = dmin * m0, d1 = d * sc1, mm1 = dmin * m1;
            for (int l = 0; l < 32; l++) *y++ = d0 * (float)(q[l] & 0xF) - mm0;
            for (int l = 0; l < 32; l++) *y++ = d1 * (float)(q[l] >> 4) - mm1;
        }
    }
}

static void ks_dequantize_row_q6_k(const ks_block_q6_k *x, float *y, int64_t n) {
    for (int64_t b = 0; b < n / KS_QK_K; b++) {
        float d = ks_f16_to_f32(x[b].d);
        for (int h = 0; h < 2; h++, y += 128) {
            const uint8_t *ql = x[b].ql + 64 * h, *qh = x[b].qh + 32 * h;
            const int8_t *sc = x[b].scales + 8 * h;
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * (float)sc[is + 0] * (float)q1;
                y[l + 32] = d * (float)sc[is + 2] * (float)q2;
                y[l + 64] = d * (float)sc[is + 4] * (float)q3;
                y[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
        }
    }
}

void ks_dequantize_row(ks_dtype t, const void *src, float *dst, int64_t n) {
    KS_ASSERT(n >= 0 && ks_dtype_block_size(t) > 0 && n % ks_dtype_block_size(t) == 0);
    switch (t) {
    case KS_DTYPE_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        break;
    case KS_DTYPE_F16: {
        const ks_f16 *s = src;
        for (int64_t i = 0; i < n; i++) dst[i] = ks_f16_to_f32(s[i]);
        break;
    }
    case KS_DTYPE_BF16: {
        const ks_bf16 *s = src;
        for (int64_t i = 0; i < n; i++) dst[i] = ks_bf16_to_f32(s[i]);
        break;
    }
    case KS_DTYPE_Q8_0: {
        const ks_block_q8_0 *x = src;
        for (int64_t b = 0; b < n / KS_QK8_0; b++) {
            float d = ks_f16_to_f32(x[b].d);
            for (int i = 0; i < KS_QK8_0; i++) *dst++ = d * (float)x[b].qs[i];
        }
        break;
    }
    case KS_DTYPE_Q4_0: {
        const ks_block_q4_0 *x = src;
        for (int64_t b = 0; b < n / KS_QK4_0; b++, dst += KS_QK4_0) {
            float d = ks_f16_to_f32(x[b].d);
            for (int i = 0; i < KS_QK4_0 / 2; i++) {
                dst[i] = d * (float)((x[b].qs[i] & 0xF) - 8);
                dst[i + 16] = d * (float)((x[b].qs[i] >> 4) - 8);
            }
        }
        break;
    }
    case KS_DTYPE_Q4_K:
        ks_dequantize_row_q4_k(src, dst, n);
        break;
    case KS_DTYPE_Q6_K:
        ks_dequantize_row_q6_k(src, dst, n);
        break;
    case KS_DTYPE_Q8_K: {
        const ks_block_q8_k *x = src;
        for (int64_t b = 0; b < n / KS_QK_K; b++)
            for (int i = 0; i < KS_QK_K; i++) *dst++ = x[b].d * (float)x[b].qs[i];
        break;
    }
    default:
        KS_ASSERT(ks_quant_ext_has(t));
        ks_quant_ext_dequantize(t, src, dst, n);
    }
}

void ks_quantize_row(ks_dtype t, const float *src, void *dst, int64_t n) {
    KS_ASSERT(n >= 0 && ks_dtype_block_size(t) > 0 && n % ks_dtype_block_size(t) == 0);
    switch (t) {
    case KS_DTYPE_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        break;
    case KS_DTYPE_F16: {
        ks_f16 *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = ks_f32_to_f16(src[i]);
        break;
    }
    case KS_DTYPE_BF16: {
        ks_bf16 *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = ks_f32_to_bf16(src[i]);
        break;
    }
    case KS_DTYPE_Q8_0: ks_quantize_row_q8_0(src, dst, n); break;
    case KS_DTYPE_Q4_0: ks_quantize_row_q4_0(src, dst, n); break;
    case KS_DTYPE_Q4_K: ks_quantize_row_q4_k(src, dst, n); break;
    case KS_DTYPE_Q6_K: ks_quantize_row_q6_k(src, dst, n); break;
    case KS_DTYPE_Q8_K: ks_quantize_row_q8_k(src, dst, n); break;
    default:
        KS_ASSERT(ks_quant_ext_has(t));
        ks_quant_ext_quantize(t, src, dst, n);
    }
}

void ks_quantize_query_q8(const float *q, int hd, int8_t *qi, uint8_t *qu, float *d) {
    for (int b = 0; b < hd / 32; b++) {
        const float *x = q + 32 * b;
        float amax = 0;
        for (int i = 0; i < 32; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
        float id = amax > 0 ? 127.0f / amax : 0.0f;
        d[b] = amax / 127.0f;
        for (int i = 0; i < 32; i++) {
            int v = (int)lrintf(x[i] * id);
            v = v > 127 ? 127 : v < -127 ? -127 : v;
            if (qi) qi[32 * b + i] = (int8_t)v;
            qu[32 * b + i] = (uint8_t)(v + 128);
        }
    }
}
