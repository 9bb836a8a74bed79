/*
 * quant_types.c — scalar dequantizers and quantizers of Q4_1, Q5_0, Q5_1,
 * IQ4_NL, Q2_K, Q3_K, Q5_K, IQ4_XS and MXFP4.
 *
 * Why these types: a user's Q4_K_M or Q5_K_M file is not all Q4_K / Q5_K.
 * llama.cpp's mixes put some tensors in Q6_K, Q5_0 / Q5_1 / Q4_1 (rows whose
 * length is no multiple of 256), Q3_K or IQ4_NL, so an engine that reads only
 * "the" type of the file cannot load it.  Block layouts are GGML's (dtype.h
 * describes each), so a file written by either program reads in the other.
 *
 * The dequantizers are the definition the kernels in matmul.c and the golden
 * tests (tests/test_quant_types.c, fixtures made with gguf-py's independent
 * numpy dequantizers) are judged against, so they follow the layout one field
 * at a time, with no cleverness.
 *
 * The quantizers are simple and deterministic rather than llama.cpp's
 * error-minimizing searches: min/max per sub-block for the types with an
 * offset (Q4_1, Q5_1, Q2_K, Q5_K), the value of largest magnitude mapped to
 * the most negative level for the symmetric ones (Q5_0, Q3_K), and for the
 * non-uniform IQ4 levels one least-squares refit of the scale after a first
 * nearest-level assignment (the grid is not uniform, so amax alone leaves
 * visible error).  Super-block scales of the K-types are rounded so a
 * sub-block's range is never clipped.  They exist so `gen-model` and the
 * tests can produce valid blocks of every type; their round-trip error is
 * pinned in tests/test_quant_types.c.
 */
#include "tensor/quant_types.h"

#include "core/core.h"

#include <math.h>
#include <string.h>

_Static_assert(sizeof(ks_block_q4_1) == 20, "q4_1 block must match GGML");
_Static_assert(sizeof(ks_block_q5_0) == 22, "q5_0 block must match GGML");
_Static_assert(sizeof(ks_block_q5_1) == 24, "q5_1 block must match GGML");
_Static_assert(sizeof(ks_block_iq4_nl) == 18, "iq4_nl block must match GGML");
_Static_assert(sizeof(ks_block_q2_k) == 84, "q2_K block must match GGML");
_Static_assert(sizeof(ks_block_q3_k) == 110, "q3_K block must match GGML");
_Static_assert(sizeof(ks_block_q5_k) == 176, "q5_K block must match GGML");
_Static_assert(sizeof(ks_block_iq4_xs) == 136, "iq4_xs block must match GGML");
_Static_assert(sizeof(ks_block_mxfp4) == 17, "mxfp4 block must match GGML");

const int8_t ks_iq4_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
/* E2M1 (sign, 2 exponent bits, 1 mantissa bit; OCP Microscaling Formats
 * v1.0, section 5.3.3): 0, 0.5, 1, 1.5, 2, 3, 4, 6, doubled */
const int8_t ks_mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

float ks_e8m0_half_to_f32(uint8_t e) {
    /* 2^(e - 128): the exponent field e - 1 for e >= 2, the subnormals
     * 2^-128 and 2^-127 (mantissa bit 21 and 22) for e = 0 and 1 */
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

bool ks_quant_ext_has(ks_dtype t) {
    switch (t) {
    case KS_DTYPE_Q4_1:
    case KS_DTYPE_Q5_0:
    case KS_DTYPE_Q5_1:
    case KS_DTYPE_IQ4_NL:
    case KS_DTYPE_Q2_K:
    case KS_DTYPE_Q3_K:
    case KS_DTYPE_Q5_K:
    case KS_DTYPE_IQ4_XS:
    case KS_DTYPE_MXFP4: return true;
    default: return false;
    }
}

static inline uint32_t ks_qt_le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline int ks_qt_clamp(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

void ks_q3k_get_scales(const uint8_t *q, uint8_t *sc) {
    /* bytes 0..7: low nibbles of scales 0..7, high nibbles of 8..15; bytes
     * 8..11: the top 2 bits, scale j at bits 2 * (j / 4) of byte 8 + j % 4 */
    for (int j = 0; j < 16; j++) {
        int lo = j < 8 ? (q[j] & 0xF) : (q[j - 8] >> 4);
        int hi = (q[8 + j % 4] >> (2 * (j / 4))) & 3;
        sc[j] = (uint8_t)(lo | hi << 4);
    }
}

static void ks_q3k_set_scales(uint8_t *q, const uint8_t *sc) {
    memset(q, 0, 12);
    for (int j = 0; j < 16; j++) {
        if (j < 8) q[j] |= (uint8_t)(sc[j] & 0xF);
        else q[j - 8] |= (uint8_t)((sc[j] & 0xF) << 4);
        q[8 + j % 4] |= (uint8_t)((sc[j] >> 4) << (2 * (j / 4)));
    }
}

/* --------------------------------------------------------- dequantizers -- */

static void ks_deq_q4_1(const ks_block_q4_1 *x, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, y += 32) {
        float d = ks_f16_to_f32(x[b].d), m = ks_f16_to_f32(x[b].m);
        for (int i = 0; i < 16; i++) {
            y[i] = d * (float)(x[b].qs[i] & 0xF) + m;
            y[i + 16] = d * (float)(x[b].qs[i] >> 4) + m;
        }
    }
}

static void ks_deq_q5_0(const ks_block_q5_0 *x, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, y += 32) {
        float d = ks_f16_to_f32(x[b].d);
        uint32_t qh = ks_qt_le32(x[b].qh);
        for (int i = 0; i < 16; i++) {
            int q0 = (x[b].qs[i] & 0xF) | (int)((qh >> i) & 1) << 4;
            int q1 = (x[b].qs[i] >> 4) | (int)((qh >> (i + 16)) & 1) << 4;
            y[i] = d * (float)(q0 - 16);
            y[i + 16] = d * (float)(q1 - 16);
        }
    }
}

static void ks_deq_q5_1(const ks_block_q5_1 *x, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, y += 32) {
        float d = ks_f16_to_f32(x[b].d), m = ks_f16_to_f32(x[b].m);
        uint32_t qh = ks_qt_le32(x[b].qh);
        for (int i = 0; i < 16; i++) {
            int q0 = (x[b].qs[i] & 0xF) | (int)((qh >> i) & 1) << 4;
            int q1 = (x[b].qs[i] >> 4) | (int)((qh >> (i + 16)) & 1) << 4;
            y[i] = d * (float)q0 + m;
            y[i + 16] = d * (float)q1 + m;
        }
    }
}

static void ks_deq_iq4_nl(const ks_block_iq4_nl *x, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, y += 32) {
        float d = ks_f16_to_f32(x[b].d);
        for (int i = 0; i < 16; i++) {
            y[i] = d * (float)ks_iq4_values[x[b].qs[i] & 0xF];
            y[i + 16] = d * (float)ks_iq4_values[x[b].qs[i] >> 4];
        }
    }
}

static void ks_deq_mxfp4(const ks_block_mxfp4 *x, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, y += 32) {
        float d = ks_e8m0_half_to_f32(x[b].e);
        for (int i = 0; i < 16; i++) {
            y[i] = d * (float)ks_mxfp4_values[x[b].qs[i] & 0xF];
            y[i + 16] = d * (float)ks_mxfp4_values[x[b].qs[i] >> 4];
        }
    }
}

static void ks_deq_q2_k(const ks_block_q2_k *x, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, y += KS_QK_K) {
        float d = ks_f16_to_f32(x[b].d), dmin = ks_f16_to_f32(x[b].dmin);
        for (int e = 0; e < KS_QK_K; e++) {
            int q = (x[b].qs[32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3;
            uint8_t s = x[b].scales[e / 16];
            y[e] = d * (float)(s & 0xF) * (float)q - dmin * (float)(s >> 4);
        }
    }
}

static void ks_deq_q3_k(const ks_block_q3_k *x, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, y += KS_QK_K) {
        float d = ks_f16_to_f32(x[b].d);
        uint8_t sc[16];
        ks_q3k_get_scales(x[b].scales, sc);
        for (int e = 0; e < KS_QK_K; e++) {
            int q = (x[b].qs[32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3;
            if (!((x[b].hmask[e % 32] >> (e / 32)) & 1)) q -= 4;
            y[e] = d * (float)((int)sc[e / 16] - 32) * (float)q;
        }
    }
}

static void ks_deq_q5_k(const ks_block_q5_k *x, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++) {
        float d = ks_f16_to_f32(x[b].d), dmin = ks_f16_to_f32(x[b].dmin);
        for (int c = 0; c < 4; c++) {
            const uint8_t *ql = x[b].qs + 32 * c;
            for (int h = 0; h < 2; h++) {
                uint8_t sc, m;
                ks_q4k_get_scale_min(2 * c + h, x[b].scales, &sc, &m);
                float dl = d * sc, ml = dmin * m;
                for (int l = 0; l < 32; l++) {
                    int q = ((ql[l] >> (4 * h)) & 0xF) | ((x[b].qh[l] >> (2 * c + h)) & 1) << 4;
                    *y++ = dl * (float)q - ml;
                }
            }
        }
    }
}

static void ks_deq_iq4_xs(const ks_block_iq4_xs *x, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++) {
        float d = ks_f16_to_f32(x[b].d);
        for (int s = 0; s < 8; s++, y += 32) {
            int ls = ((x[b].scales_l[s / 2] >> (4 * (s % 2))) & 0xF) | ((x[b].scales_h >> (2 * s)) & 3) << 4;
            float dl = d * (float)(ls - 32);
            const uint8_t *qs = x[b].qs + 16 * s;
            for (int i = 0; i < 16; i++) {
                y[i] = dl * (float)ks_iq4_values[qs[i] & 0xF];
                y[i + 16] = dl * (float)ks_iq4_values[qs[i] >> 4];
            }
        }
    }
}

void ks_quant_ext_dequantize(ks_dtype t, const void *src, float *dst, int64_t n) {
    switch (t) {
    case KS_DTYPE_Q4_1: ks_deq_q4_1(src, dst, n / 32); break;
    case KS_DTYPE_Q5_0: ks_deq_q5_0(src, dst, n / 32); break;
    case KS_DTYPE_Q5_1: ks_deq_q5_1(src, dst, n / 32); break;
    case KS_DTYPE_IQ4_NL: ks_deq_iq4_nl(src, dst, n / 32); break;
    case KS_DTYPE_Q2_K: ks_deq_q2_k(src, dst, n / KS_QK_K); break;
    case KS_DTYPE_Q3_K: ks_deq_q3_k(src, dst, n / KS_QK_K); break;
    case KS_DTYPE_Q5_K: ks_deq_q5_k(src, dst, n / KS_QK_K); break;
    case KS_DTYPE_IQ4_XS: ks_deq_iq4_xs(src, dst, n / KS_QK_K); break;
    case KS_DTYPE_MXFP4: ks_deq_mxfp4(src, dst, n / 32); break;
    default: KS_ASSERT(!"ks_quant_ext_dequantize: not an extended type");
    }
}

/* ----------------------------------------------------------- quantizers -- */

/* min / max of n values, with the minimum capped at 0 (the offset types
 * store a non-negative min to subtract, as GGML does) when cap0. */
static void ks_qt_minmax(const float *x, int n, bool cap0, float *lo, float *hi) {
    float a = x[0], b = x[0];
    for (int i = 1; i < n; i++) a = fminf(a, x[i]), b = fmaxf(b, x[i]);
    if (cap0 && a > 0.0f) a = 0.0f;
    *lo = a, *hi = b;
}

/* The value of largest magnitude (its sign kept). */
static float ks_qt_vmax(const float *x, int n) {
    float amax = 0.0f, v = 0.0f;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) amax = fabsf(x[i]), v = x[i];
    return v;
}

/* Index of the IQ4 level nearest to v (levels ascending). */
static int ks_qt_iq4_nearest(float v) {
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (v < (float)ks_iq4_values[mid]) hi = mid;
        else lo = mid;
    }
    return fabsf(v - (float)ks_iq4_values[lo]) <= fabsf(v - (float)ks_iq4_values[hi]) ? lo : hi;
}

/* Scale of n values on the IQ4 levels: the largest magnitude on -127, then
 * one least-squares refit d = sum(x v) / sum(v v) over the levels chosen,
 * kept only if it lowers the squared error.  Writes the level indices. */
static float ks_qt_iq4_scale(const float *x, int n, uint8_t *L) {
    float d = ks_qt_vmax(x, n) / -127.0f;
    if (d == 0.0f) {
        for (int i = 0; i < n; i++) L[i] = (uint8_t)ks_qt_iq4_nearest(0.0f);
        return 0.0f;
    }
    double sxv = 0, svv = 0, err = 0;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)ks_qt_iq4_nearest(x[i] / d);
        float v = (float)ks_iq4_values[L[i]];
        sxv += (double)x[i] * v, svv += (double)v * v;
        err += ((double)x[i] - d * v) * ((double)x[i] - d * v);
    }
    float d2 = svv > 0 ? (float)(sxv / svv) : 0.0f;
    if (d2 == 0.0f) return d;
    uint8_t L2[32];
    double err2 = 0;
    for (int i = 0; i < n; i++) {
        L2[i] = (uint8_t)ks_qt_iq4_nearest(x[i] / d2);
        double e = (double)x[i] - (double)d2 * ks_iq4_values[L2[i]];
        err2 += e * e;
    }
    if (err2 < err) {
        memcpy(L, L2, (size_t)n);
        return d2;
    }
    return d;
}

static void ks_q_q4_1(const float *x, ks_block_q4_1 *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, x += 32) {
        float lo, hi;
        ks_qt_minmax(x, 32, false, &lo, &hi);
        y[b].d = ks_f32_to_f16((hi - lo) / 15.0f);
        y[b].m = ks_f32_to_f16(lo);
        /* quantize against the stored (rounded) values */
        float d = ks_f16_to_f32(y[b].d), m = ks_f16_to_f32(y[b].m), id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int i = 0; i < 16; i++) {
            int q0 = ks_qt_clamp((int)lrintf((x[i] - m) * id), 0, 15);
            int q1 = ks_qt_clamp((int)lrintf((x[i + 16] - m) * id), 0, 15);
            y[b].qs[i] = (uint8_t)(q0 | q1 << 4);
        }
    }
}

static void ks_q5_pack(const int *q, uint8_t *qs, uint8_t *qh) {
    uint32_t h = 0;
    for (int i = 0; i < 16; i++) {
        qs[i] = (uint8_t)((q[i] & 0xF) | (q[i + 16] & 0xF) << 4);
        h |= (uint32_t)(q[i] >> 4) << i | (uint32_t)(q[i + 16] >> 4) << (i + 16);
    }
    for (int k = 0; k < 4; k++) qh[k] = (uint8_t)(h >> (8 * k));
}

static void ks_q_q5_0(const float *x, ks_block_q5_0 *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, x += 32) {
        y[b].d = ks_f32_to_f16(ks_qt_vmax(x, 32) / -16.0f); /* largest magnitude on -16 */
        float d = ks_f16_to_f32(y[b].d), id = d != 0.0f ? 1.0f / d : 0.0f;
        int q[32];
        for (int i = 0; i < 32; i++) q[i] = ks_qt_clamp((int)lrintf(x[i] * id) + 16, 0, 31);
        ks_q5_pack(q, y[b].qs, y[b].qh);
    }
}

static void ks_q_q5_1(const float *x, ks_block_q5_1 *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, x += 32) {
        float lo, hi;
        ks_qt_minmax(x, 32, false, &lo, &hi);
        y[b].d = ks_f32_to_f16((hi - lo) / 31.0f);
        y[b].m = ks_f32_to_f16(lo);
        float d = ks_f16_to_f32(y[b].d), m = ks_f16_to_f32(y[b].m), id = d != 0.0f ? 1.0f / d : 0.0f;
        int q[32];
        for (int i = 0; i < 32; i++) q[i] = ks_qt_clamp((int)lrintf((x[i] - m) * id), 0, 31);
        ks_q5_pack(q, y[b].qs, y[b].qh);
    }
}

static void ks_q_iq4_nl(const float *x, ks_block_iq4_nl *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, x += 32) {
        uint8_t L[32];
        float d = ks_qt_iq4_scale(x, 32, L);
        y[b].d = ks_f32_to_f16(d);
        /* reassign against the f16 scale actually stored */
        float dh = ks_f16_to_f32(y[b].d);
        for (int i = 0; i < 32; i++) L[i] = (uint8_t)ks_qt_iq4_nearest(dh != 0.0f ? x[i] / dh : 0.0f);
        for (int i = 0; i < 16; i++) y[b].qs[i] = (uint8_t)(L[i] | L[i + 16] << 4);
    }
}

/* The OCP Microscaling spec's conversion (v1.0, section 6.3): the shared
 * exponent is floor(log2(amax)) minus E2M1's largest exponent (2), so the
 * largest magnitude lands in [4, 8) of the element scale and values above
 * 6 clip to 6; each element then takes the nearest E2M1 level (ties to the
 * lower index). */
static int ks_qt_mxfp4_nearest(float v /* in units of the doubled values */) {
    int best = 0;
    float err = fabsf(v - (float)ks_mxfp4_values[0]);
    for (int i = 1; i < 16; i++) {
        float e = fabsf(v - (float)ks_mxfp4_values[i]);
        if (e < err) err = e, best = i;
    }
    return best;
}

static void ks_q_mxfp4(const float *x, ks_block_mxfp4 *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, x += 32) {
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
        int e = 0;
        if (amax > 0.0f && isfinite(amax)) e = ks_qt_clamp((int)floorf(log2f(amax)) - 2 + 127, 0, 254);
        y[b].e = (uint8_t)e;
        float d = ks_e8m0_half_to_f32(y[b].e); /* divide: 1 / 2^-128 is no float */
        for (int i = 0; i < 16; i++)
            y[b].qs[i] = (uint8_t)(ks_qt_mxfp4_nearest(x[i] / d) | ks_qt_mxfp4_nearest(x[i + 16] / d) << 4);
    }
}

/* The 2-bit planes of Q2_K / Q3_K: element e at bits 2 * ((e / 32) % 4) of
 * qs[32 * (e / 128) + e % 32]. */
static void ks_q2_pack(const uint8_t *L /* [256], 0..3 */, uint8_t *qs /* [64] */) {
    memset(qs, 0, 64);
    for (int e = 0; e < KS_QK_K; e++) qs[32 * (e / 128) + e % 32] |= (uint8_t)((L[e] & 3) << (2 * ((e / 32) % 4)));
}

static void ks_q_q2_k(const float *x, ks_block_q2_k *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, x += KS_QK_K) {
        float scale[16], mins[16], max_scale = 0.0f, max_min = 0.0f;
        for (int s = 0; s < 16; s++) {
            float lo, hi;
            ks_qt_minmax(x + 16 * s, 16, true, &lo, &hi);
            scale[s] = (hi - lo) / 3.0f;
            mins[s] = -lo;
            max_scale = fmaxf(max_scale, scale[s]);
            max_min = fmaxf(max_min, mins[s]);
        }
        y[b].d = ks_f32_to_f16(max_scale / 15.0f);
        y[b].dmin = ks_f32_to_f16(max_min / 15.0f);
        float d = ks_f16_to_f32(y[b].d), dmin = ks_f16_to_f32(y[b].dmin);
        uint8_t L[KS_QK_K];
        for (int s = 0; s < 16; s++) {
            /* scale rounded up and min rounded to nearest: no range clipped
             * by more than half a min step */
            int ls = d > 0.0f ? ks_qt_clamp((int)ceilf(scale[s] / d - 1e-4f), 0, 15) : 0;
            int lm = dmin > 0.0f ? ks_qt_clamp((int)lrintf(mins[s] / dmin), 0, 15) : 0;
            y[b].scales[s] = (uint8_t)(ls | lm << 4);
            float sc = d * (float)ls, m = dmin * (float)lm, isc = sc > 0.0f ? 1.0f / sc : 0.0f;
            for (int i = 0; i < 16; i++) L[16 * s + i] = (uint8_t)ks_qt_clamp((int)lrintf((x[16 * s + i] + m) * isc), 0, 3);
        }
        ks_q2_pack(L, y[b].qs);
    }
}

static void ks_q_q3_k(const float *x, ks_block_q3_k *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, x += KS_QK_K) {
        float scale[16], smax = 0.0f;
        for (int s = 0; s < 16; s++) {
            scale[s] = ks_qt_vmax(x + 16 * s, 16) / -4.0f; /* largest magnitude on -4 */
            if (fabsf(scale[s]) > fabsf(smax)) smax = scale[s];
        }
        y[b].d = ks_f32_to_f16(smax / -32.0f);
        float d = ks_f16_to_f32(y[b].d), id = d != 0.0f ? 1.0f / d : 0.0f;
        uint8_t sc[16], L[KS_QK_K];
        memset(y[b].hmask, 0, sizeof y[b].hmask);
        for (int s = 0; s < 16; s++) {
            int ls = ks_qt_clamp((int)lrintf(scale[s] * id), -32, 31);
            sc[s] = (uint8_t)(ls + 32);
            float dl = d * (float)ls, idl = dl != 0.0f ? 1.0f / dl : 0.0f;
            for (int i = 0; i < 16; i++) {
                int e = 16 * s + i;
                int q = ks_qt_clamp((int)lrintf(x[e] * idl), -4, 3) + 4; /* 0..7 */
                L[e] = (uint8_t)(q & 3);
                if (q >= 4) y[b].hmask[e % 32] |= (uint8_t)(1u << (e / 32)); /* set: no -4 */
            }
        }
        ks_q3k_set_scales(y[b].scales, sc);
        ks_q2_pack(L, y[b].qs);
    }
}

static void ks_q_q5_k(const float *x, ks_block_q5_k *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, x += KS_QK_K) {
        float scale[8], mins[8], max_scale = 0.0f, max_min = 0.0f;
        for (int j = 0; j < 8; j++) {
            float lo, hi;
            ks_qt_minmax(x + 32 * j, 32, true, &lo, &hi);
            scale[j] = (hi - lo) / 31.0f;
            mins[j] = -lo;
            max_scale = fmaxf(max_scale, scale[j]);
            max_min = fmaxf(max_min, mins[j]);
        }
        y[b].d = ks_f32_to_f16(max_scale / 63.0f);
        y[b].dmin = ks_f32_to_f16(max_min / 63.0f);
        float d = ks_f16_to_f32(y[b].d), dmin = ks_f16_to_f32(y[b].dmin);
        uint8_t ls[8], lm[8], L[KS_QK_K];
        for (int j = 0; j < 8; j++) {
            ls[j] = (uint8_t)(d > 0.0f ? ks_qt_clamp((int)ceilf(scale[j] / d - 1e-4f), 0, 63) : 0);
            lm[j] = (uint8_t)(dmin > 0.0f ? ks_qt_clamp((int)lrintf(mins[j] / dmin), 0, 63) : 0);
            float sc = d * ls[j], m = dmin * lm[j], isc = sc > 0.0f ? 1.0f / sc : 0.0f;
            for (int i = 0; i < 32; i++) L[32 * j + i] = (uint8_t)ks_qt_clamp((int)lrintf((x[32 * j + i] + m) * isc), 0, 31);
        }
        ks_q4k_set_scale_min(y[b].scales, ls, lm);
        memset(y[b].qh, 0, sizeof y[b].qh);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                uint8_t a = L[64 * c + l], e = L[64 * c + 32 + l];
                y[b].qs[32 * c + l] = (uint8_t)((a & 0xF) | (e & 0xF) << 4);
                y[b].qh[l] |= (uint8_t)((a >> 4) << (2 * c) | (e >> 4) << (2 * c + 1));
            }
    }
}

static void ks_q_iq4_xs(const float *x, ks_block_iq4_xs *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, x += KS_QK_K) {
        float scale[8], smax = 0.0f;
        uint8_t L[32];
        for (int s = 0; s < 8; s++) {
            scale[s] = ks_qt_iq4_scale(x + 32 * s, 32, L);
            if (fabsf(scale[s]) > fabsf(smax)) smax = scale[s];
        }
        y[b].d = ks_f32_to_f16(smax / -32.0f);
        float d = ks_f16_to_f32(y[b].d), id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].scales_h = 0;
        memset(y[b].scales_l, 0, sizeof y[b].scales_l);
        for (int s = 0; s < 8; s++) {
            int ls = ks_qt_clamp((int)lrintf(scale[s] * id), -32, 31) + 32;
            y[b].scales_l[s / 2] |= (uint8_t)((ls & 0xF) << (4 * (s % 2)));
            y[b].scales_h |= (uint16_t)((ls >> 4) << (2 * s));
            float dl = d * (float)(ls - 32), idl = dl != 0.0f ? 1.0f / dl : 0.0f;
            const float *xs = x + 32 * s;
            for (int i = 0; i < 32; i++) L[i] = (uint8_t)ks_qt_iq4_nearest(xs[i] * idl);
            for (int i = 0; i < 16; i++) y[b].qs[16 * s + i] = (uint8_t)(L[i] | L[i + 16] << 4);
        }
    }
}

void ks_quant_ext_quantize(ks_dtype t, const float *src, void *dst, int64_t n) {
    switch (t) {
    case KS_DTYPE_Q4_1: ks_q_q4_1(src, dst, n / 32); break;
    case KS_DTYPE_Q5_0: ks_q_q5_0(src, dst, n / 32); break;
    case KS_DTYPE_Q5_1: ks_q_q5_1(src, dst, n / 32); break;
    case KS_DTYPE_IQ4_NL: ks_q_iq4_nl(src, dst, n / 32); break;
    case KS_DTYPE_Q2_K: ks_q_q2_k(src, dst, n / KS_QK_K); break;
    case KS_DTYPE_Q3_K: ks_q_q3_k(src, dst, n / KS_QK_K); break;
    case KS_DTYPE_Q5_K: ks_q_q5_k(src, dst, n / KS_QK_K); break;
    case KS_DTYPE_IQ4_XS: ks_q_iq4_xs(src, dst, n / KS_QK_K); break;
    case KS_DTYPE_MXFP4: ks_q_mxfp4(src, dst, n / 32); break;
    default: KS_ASSERT(!"ks_quant_ext_quantize: not an extended type");
    }
}
