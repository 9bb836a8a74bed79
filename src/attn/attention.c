/*
 * attention.c — which attention kernel runs, and the portable reference the
 * SIMD kernels are tested against.
 *
 * Every caller (decode, the prefill fallback, the recall probe, the policies'
 * attention probabilities) asks for the same thing: G query heads of one GQA
 * group against a list of segments, softmax over exactly the rows listed.
 * The dispatch picks the widest kernel the CPU and the KV type allow; each
 * kernel returns false when a shape does not suit it, and the next one is
 * tried, down to the reference, which takes any KV type and head dim.  The
 * reference is deliberately plain (convert a row, dot it, softmax, sum V) so
 * that it is obviously right.
 */
#include "attn/attn.h"

#include "core/simd.h"
#include "tensor/ops.h"

#include <math.h>
#include <string.h>

/* softmax of x[n] with a sink logit (attn.h) in the denominator */
static void softmax_sink(float *x, int n, float sink) {
    float mx = x[0];
    for (int i = 1; i < n; i++)
        if (x[i] > mx) mx = x[i];
    float sum = 0;
    for (int i = 0; i < n; i++) sum += x[i] = expf(x[i] - mx);
    sum += expf(sink - mx);
    for (int i = 0; i < n; i++) x[i] /= sum;
}

/* tmp: [hd]; scores [G][total]; sinks [G] or NULL. */
static void attn_segs_ref(ks_kv_type kt, const ks_kv_seg *segs, int nseg, int total, int hd, int G, const float *q,
                          float *scores, float *out, float scale, float *tmp, const float *sinks) {
    ks_dtype dt = ks_kv_dtype(kt);
    size_t row_bytes = ks_kv_row_bytes(kt, hd);
    int t = 0;
    for (int si = 0; si < nseg; si++)
        for (int j = 0; j < segs[si].len; j++, t++) {
            ks_dequantize_row(dt, (const uint8_t *)segs[si].K + (size_t)j * row_bytes, tmp, hd);
            for (int g = 0; g < G; g++) {
                const float *qg = q + (size_t)g * hd;
                float acc = 0;
                for (int i = 0; i < hd; i++) acc += qg[i] * tmp[i];
                scores[(size_t)g * total + t] = acc * scale;
            }
        }
    for (int g = 0; g < G; g++)
        if (sinks) softmax_sink(scores + (size_t)g * total, total, sinks[g]);
        else ks_softmax(scores + (size_t)g * total, total);
    for (int g = 0; g < G; g++) memset(out + (size_t)g * hd, 0, sizeof(float) * hd);
    t = 0;
    for (int si = 0; si < nseg; si++)
        for (int j = 0; j < segs[si].len; j++, t++) {
            ks_dequantize_row(dt, (const uint8_t *)segs[si].V + (size_t)j * row_bytes, tmp, hd);
            for (int g = 0; g < G; g++) {
                float p = scores[(size_t)g * total + t];
                float *o = out + (size_t)g * hd;
                for (int i = 0; i < hd; i++) o[i] += p * tmp[i];
            }
        }
}

void ks_attention_segs(ks_kv_type kt, const ks_kv_seg *segs, int nseg, int total, int hd, int G, const float *q,
                       float *scores, float *out, float *tmp, float *weights, bool allow_simd) {
    ks_attention_segs_sinks(kt, segs, nseg, total, hd, G, q, scores, out, tmp, weights, allow_simd, NULL);
}

void ks_attention_segs_sinks(ks_kv_type kt, const ks_kv_seg *segs, int nseg, int total, int hd, int G, const float *q,
                             float *scores, float *out, float *tmp, float *weights, bool allow_simd,
                             const float *sinks) {
    KS_ASSERT(total > 0);
    float scale = 1.0f / sqrtf((float)hd);
#if defined(__x86_64__)
    if (allow_simd && ks_simd_current() >= KS_SIMD_AVX512 &&
        ks_attention_segs_avx512_kv(kt, segs, nseg, total, hd, G, q, scores, out, scale, weights, sinks))
        return;
    if (allow_simd && ks_simd_current() >= KS_SIMD_AVX512 &&
        ks_attention_segs_avx512_wide(kt, segs, nseg, total, hd, G, q, scores, out, scale, weights, sinks))
        return;
    if (allow_simd && ks_simd_current() >= KS_SIMD_AVX2 &&
        ks_attention_segs_avx2(kt, segs, nseg, total, hd, G, q, scores, out, scale, weights, sinks))
        return;
#elif defined(__aarch64__)
    if (allow_simd && ks_simd_current() >= KS_SIMD_NEON &&
        ks_attention_segs_neon(kt, segs, nseg, total, hd, G, q, scores, out, scale, weights, sinks))
        return;
#endif
    attn_segs_ref(kt, segs, nseg, total, hd, G, q, scores, out, scale, tmp, sinks);
    if (weights)
        for (int g = 0; g < G; g++)
            for (int t = 0; t < total; t++) weights[t] += scores[(size_t)g * total + t];
}

const char *ks_attention_kernel_name(ks_kv_type kt, int hd, int G) {
    const ks_simd_level lv = ks_simd_current();
    /* the conditions each kernel states in attn.h, in the dispatch's order */
    if (lv == KS_SIMD_AVX512 && (hd == 64 || hd == 128)) return "avx512";
    if (lv == KS_SIMD_AVX512 && kt == KS_KV_F16 && G > 4 && hd % 32 == 0 && hd <= 1024) return "avx512_wide";
    if ((lv == KS_SIMD_AVX2 || lv == KS_SIMD_AVX512) && hd % 16 == 0 && hd <= 1024 &&
        (kt == KS_KV_F16 || hd % 32 == 0))
        return "avx2";
    if (lv >= KS_SIMD_NEON && G >= 1 && hd % 8 == 0 && hd <= 1024 && (kt == KS_KV_F16 || hd % 32 == 0))
        return "neon";
    return "reference";
}

void ks_attention_group(ks_kv_type kt, const void *K, const void *V, int len, int hd, int G,
                        const float *q, float *scores, float *out, float *tmp, bool allow_simd) {
    ks_kv_seg seg = {K, V, len};
    ks_attention_segs(kt, &seg, 1, len, hd, G, q, scores, out, tmp, NULL, allow_simd);
}
