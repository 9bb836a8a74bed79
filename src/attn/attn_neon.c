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
                            float *scores, float *out, float scale, float *weights) {
    if (G < 1 || G > KS_ATTN_NEON_MAX_G || hd % 8 || hd > KS_ATTN_NEON_MAX_HD ||
        (kt != KS_KV_F16 && (kt != KS_KV_Q8 || hd % 32)))
        return false;
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
        float inv = 1.0f / ks_neon_softmax_exp(sg, total);
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

#else
bool ks_attention_segs_neon(ks_kv_type kt, const ks_kv_seg *segs, int nseg, int total, int hd, int G, const float *q,
                            float *scores, float *out, float scale, float *weights) {
    (void)kt, (void)segs, (void)nseg, (void)total, (void)hd, (void)G, (void)q, (void)scores, (void)out, (void)scale;
    (void)weights;
    return false;
}
#endif
