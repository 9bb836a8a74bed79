/*
 * attn_neon.c — decode attention on AArch64 NEON: G query heads of one GQA
 * group over a list of KV segments, f16 or 8-bit (Q8_0) rows, the same
 * contract as ks_attention_segs's other kernels (attn.h).
 *
 * Why it is shaped this way.  Decode attention streams K and V once per
 * step; the work per byte is a handful of multiply-adds, so what matters is
 * that each K row is converted to f32 once for all G heads of the group
 * (fcvtl for f16; sxtl + scvtf and the block scale for Q8_0), and each V row
 * likewise for the weighted sum.  Three passes like the reference (scores,
 * softmax, values) rather than an online softmax: the scores of a group are
 * a few KB per thousand rows and stay in cache, and the passes keep the
 * arithmetic the reference's own (the same scores to f32 rounding, the
 * probabilities by the shared e^x polynomial, tensor/simd_neon.h), which
 * keeps the kernel easy to check.  8-bit KV is dequantized in registers
 * rather than dotted in int8 against a quantized query: it stays within the
 * reference's 1e-5 and costs no query rounding; an sdot form (the x86
 * kernels' VNNI path) is a later step.  Plain Armv8.0 NEON, so it runs at
 * every ARM level.  On other architectures this file defines a stub that
 * declines, and the dispatch (attention.c) never calls it there anyway.
 */
#include "attn/attn.h"

#if defined(__aarch64__)
#include "tensor/simd_neon.h"

#include <math.h>
#include <string.h>

#define KS_ATTN_NEON_MAX_G 8
#define KS_ATTN_NEON_MAX_HD 1024

/* Eight elements of row r (f16, or Q8_0 blocks of 32: element i of block
 * i / 32, scale d) at element i, as two f32x4. */
static inline void attn_neon_load8(ks_kv_type kt, const uint8_t *r, int i, float32x4_t *a, float32x4_t *b) {
    if (kt == KS_KV_F16) {
        uint16x8_t h = vld1q_u16((const uint16_t *)r + i);
        *a = vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(h)));
        *b = vcvt_f32_f16(vreinterpret_f16_u16(vget_high_u16(h)));
    } else {
        const ks_block_q8_0 *blk = (const ks_block_q8_0 *)r + i / 32;
        uint16_t dh;
        memcpy(&dh, &blk->d, sizeof dh);
        float d = vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(dh))), 0);
        int16x8_t v = vmovl_s8(vld1_s8(blk->qs + i % 32));
        *a = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(v))), d);
        *b = vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(v)), d);
    }
}

bool ks_attention_segs_neon(ks_kv_type kt, const ks_kv_seg *segs, int nseg, int total, int hd, int G, const float *q,
                            float *scores, float *out, float scale, float *weights, const float *sinks) {
    if (G < 1 || hd % 8 || hd > KS_ATTN_NEON_MAX_HD || (kt != KS_KV_F16 && (kt != KS_KV_Q8 || hd % 32))) return false;
    if (G > KS_ATTN_NEON_MAX_G) { /* a wider group (latent attention's 16 heads): eight heads a pass; a head's
                                   * arithmetic does not depend on the others, and the weights add up in the
                                   * same head order */
        for (int g0 = 0; g0 < G; g0 += KS_ATTN_NEON_MAX_G) {
            int ng = G - g0 < KS_ATTN_NEON_MAX_G ? G - g0 : KS_ATTN_NEON_MAX_G;
            if (!ks_attention_segs_neon(kt, segs, nseg, total, hd, ng, q + (size_t)g0 * hd, scores + (size_t)g0 * total,
                                        out + (size_t)g0 * hd, scale, weights, sinks ? sinks + g0 : NULL))
                return false;
        }
        return true;
    }
    const size_t rb = ks_kv_row_bytes(kt, hd);
    /* scores[g][t] = scale * q_g . k_t: each K row converted once for the group */
    int t = 0;
    for (int si = 0; si < nseg; si++)
        for (int j = 0; j < segs[si].len; j++, t++) {
            const uint8_t *kr = (const uint8_t *)segs[si].K + (size_t)j * rb;
            float32x4_t acc[KS_ATTN_NEON_MAX_G][2];
            for (int g = 0; g < G; g++) acc[g][0] = acc[g][1] = vdupq_n_f32(0.0f);
            for (int i = 0; i < hd; i += 8) {
                float32x4_t k0, k1;
                attn_neon_load8(kt, kr, i, &k0, &k1);
                for (int g = 0; g < G; g++) {
                    const float *qg = q + (size_t)g * hd + i;
                    acc[g][0] = vfmaq_f32(acc[g][0], k0, vld1q_f32(qg));
                    acc[g][1] = vfmaq_f32(acc[g][1], k1, vld1q_f32(qg + 4));
                }
            }
            for (int g = 0; g < G; g++) scores[(size_t)g * total + t] = vaddvq_f32(vaddq_f32(acc[g][0], acc[g][1])) * scale;
        }
    for (int g = 0; g < G; g++) {
        float *sg = scores + (size_t)g * total;
        float mx = -INFINITY;
        if (sinks) { /* the sink joins the denominator at the scores' max (attn.h), as the other kernels' */
            float32x4_t m4 = vdupq_n_f32(-INFINITY);
            int k = 0;
            for (; k + 4 <= total; k += 4) m4 = vmaxq_f32(m4, vld1q_f32(sg + k));
            mx = vmaxvq_f32(m4);
            for (; k < total; k++) mx = sg[k] > mx ? sg[k] : mx;
        }
        float sum = ks_neon_softmax_exp(sg, total);
        if (sinks) sum += expf(sinks[g] - mx);
        float inv = 1.0f / sum;
        float32x4_t iv = vdupq_n_f32(inv);
        int k = 0;
        for (; k + 4 <= total; k += 4) vst1q_f32(sg + k, vmulq_f32(vld1q_f32(sg + k), iv));
        for (; k < total; k++) sg[k] *= inv;
    }
    /* out[g] += p[g][t] v_t row by row: V streams once; the G output rows
     * (at most 8 x 512 floats) stay in L1 between rows */
    for (int g = 0; g < G; g++) memset(out + (size_t)g * hd, 0, sizeof(float) * (size_t)hd);
    t = 0;
    for (int si = 0; si < nseg; si++)
        for (int j = 0; j < segs[si].len; j++, t++) {
            const uint8_t *vr = (const uint8_t *)segs[si].V + (size_t)j * rb;
            float p[KS_ATTN_NEON_MAX_G];
            for (int g = 0; g < G; g++) p[g] = scores[(size_t)g * total + t];
            for (int i = 0; i < hd; i += 8) {
                float32x4_t v0, v1;
                attn_neon_load8(kt, vr, i, &v0, &v1);
                for (int g = 0; g < G; g++) {
                    float *o = out + (size_t)g * hd + i;
                    vst1q_f32(o, vfmaq_n_f32(vld1q_f32(o), v0, p[g]));
                    vst1q_f32(o + 4, vfmaq_n_f32(vld1q_f32(o + 4), v1, p[g]));
                }
            }
        }
    if (weights)
        for (int g = 0; g < G; g++)
            for (t = 0; t < total; t++) weights[t] += scores[(size_t)g * total + t];
    return true;
}

/* Prefill: the block form of the kernel above (attn.h, ks_attention_block_neon).
 * Each page of K and V is converted once into the f32 tile for all R * G
 * queries of the block; then each query takes exactly the decode kernel's
 * arithmetic: the score of a key is the same two-quad FMA chain over hd and
 * the same reduction, the softmax the same e^x pass and reciprocal, and the
 * values the same FMA per row in entry order (attn_neon_load8 converts the
 * tile as the decode kernel converts a row).  So a query's output is bit for
 * bit what ks_attention_segs_neon gives it, whatever block, chunk or page it
 * falls in: a prefix-cache hit that ends anywhere, and a prefill that falls
 * back to the per-row kernel, reproduce it. */
static void attn_neon_tile(ks_kv_type kt, const void *rows, int L, int hd, float *tile) {
    const size_t rb = ks_kv_row_bytes(kt, hd);
    for (int t = 0; t < L; t++)
        for (int i = 0; i < hd; i += 8) {
            float32x4_t a, b;
            attn_neon_load8(kt, (const uint8_t *)rows + (size_t)t * rb, i, &a, &b);
            vst1q_f32(tile + (size_t)t * hd + i, a);
            vst1q_f32(tile + (size_t)t * hd + i + 4, b);
        }
}

/* The decode kernel's score of one key: two accumulators over hd, added, reduced. */
static inline float attn_neon_score(const float *q, const float *k, int hd) {
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0;
    for (int i = 0; i < hd; i += 8) {
        a0 = vfmaq_f32(a0, vld1q_f32(k + i), vld1q_f32(q + i));
        a1 = vfmaq_f32(a1, vld1q_f32(k + i + 4), vld1q_f32(q + i + 4));
    }
    return vaddvq_f32(vaddq_f32(a0, a1));
}

bool ks_attention_block_neon(ks_kv_type kt, const ks_kv_seg *segs, int nseg, const int32_t *n_att, int R, int hd,
                             int G, const float *q, size_t q_stride, float *out, size_t out_stride, float *S,
                             float *tile, float scale) {
    if (hd % 8 || (kt != KS_KV_F16 && (kt != KS_KV_Q8 || hd % 32))) return false;
    const int n_max = n_att[R - 1], RG = R * G;
    for (int si = 0, e0 = 0; si < nseg; e0 += segs[si].len, si++) {
        const int L = segs[si].len;
        attn_neon_tile(kt, segs[si].K, L, hd, tile);
        for (int x = 0; x < RG; x++) {
            const int lim = ks_attn_block_visible(n_att, G, x, e0, L);
            const float *qq = q + (size_t)(x / G) * q_stride + (size_t)(x % G) * hd;
            float *srow = S + (size_t)x * n_max + e0;
            int t = 0;
            for (; t + 4 <= lim; t += 4) { /* four keys' independent chains side by side (ILP only) */
                float32x4_t a[4][2];
                for (int k = 0; k < 4; k++) a[k][0] = a[k][1] = vdupq_n_f32(0.0f);
                for (int i = 0; i < hd; i += 8) {
                    const float32x4_t q0 = vld1q_f32(qq + i), q1 = vld1q_f32(qq + i + 4);
                    for (int k = 0; k < 4; k++) {
                        const float *kr = tile + (size_t)(t + k) * hd + i;
                        a[k][0] = vfmaq_f32(a[k][0], vld1q_f32(kr), q0);
                        a[k][1] = vfmaq_f32(a[k][1], vld1q_f32(kr + 4), q1);
                    }
                }
                for (int k = 0; k < 4; k++) srow[t + k] = vaddvq_f32(vaddq_f32(a[k][0], a[k][1])) * scale;
            }
            for (; t < lim; t++) srow[t] = attn_neon_score(qq, tile + (size_t)t * hd, hd) * scale;
        }
    }
    for (int x = 0; x < RG; x++) { /* softmax per query over its visible entries, as the decode kernel */
        const int n = n_att[x / G];
        float *sg = S + (size_t)x * n_max;
        const float inv = 1.0f / ks_neon_softmax_exp(sg, n);
        const float32x4_t iv = vdupq_n_f32(inv);
        int k = 0;
        for (; k + 4 <= n; k += 4) vst1q_f32(sg + k, vmulq_f32(vld1q_f32(sg + k), iv));
        for (; k < n; k++) sg[k] *= inv;
        memset(out + (size_t)(x / G) * out_stride + (size_t)(x % G) * hd, 0, sizeof(float) * (size_t)hd);
    }
    for (int si = 0, e0 = 0; si < nseg; e0 += segs[si].len, si++) {
        const int L = segs[si].len;
        attn_neon_tile(kt, segs[si].V, L, hd, tile);
        for (int x = 0; x < RG; x++) {
            const int lim = ks_attn_block_visible(n_att, G, x, e0, L);
            const float *p = S + (size_t)x * n_max + e0;
            float *o = out + (size_t)(x / G) * out_stride + (size_t)(x % G) * hd;
            int i = 0;
            for (; i + 16 <= hd; i += 16) { /* 16 outputs in registers across the page */
                float32x4_t o0 = vld1q_f32(o + i), o1 = vld1q_f32(o + i + 4);
                float32x4_t o2 = vld1q_f32(o + i + 8), o3 = vld1q_f32(o + i + 12);
                for (int t = 0; t < lim; t++) {
                    const float *v = tile + (size_t)t * hd + i;
                    o0 = vfmaq_n_f32(o0, vld1q_f32(v), p[t]);
                    o1 = vfmaq_n_f32(o1, vld1q_f32(v + 4), p[t]);
                    o2 = vfmaq_n_f32(o2, vld1q_f32(v + 8), p[t]);
                    o3 = vfmaq_n_f32(o3, vld1q_f32(v + 12), p[t]);
                }
                vst1q_f32(o + i, o0), vst1q_f32(o + i + 4, o1), vst1q_f32(o + i + 8, o2), vst1q_f32(o + i + 12, o3);
            }
            for (; i < hd; i += 4) {
                float32x4_t a = vld1q_f32(o + i);
                for (int t = 0; t < lim; t++) a = vfmaq_n_f32(a, vld1q_f32(tile + (size_t)t * hd + i), p[t]);
                vst1q_f32(o + i, a);
            }
        }
    }
    return true;
}

#else
bool ks_attention_block_neon(ks_kv_type kt, const ks_kv_seg *segs, int nseg, const int32_t *n_att, int R, int hd,
                             int G, const float *q, size_t q_stride, float *out, size_t out_stride, float *S,
                             float *tile, float scale) {
    (void)kt, (void)segs, (void)nseg, (void)n_att, (void)R, (void)hd, (void)G, (void)q, (void)q_stride, (void)out;
    (void)out_stride, (void)S, (void)tile, (void)scale;
    return false;
}
bool ks_attention_segs_neon(ks_kv_type kt, const ks_kv_seg *segs, int nseg, int total, int hd, int G, const float *q,
                            float *scores, float *out, float scale, float *weights, const float *sinks) {
    (void)kt, (void)segs, (void)nseg, (void)total, (void)hd, (void)G, (void)q, (void)scores, (void)out, (void)scale;
    (void)weights, (void)sinks;
    return false;
}
#endif
