/*
 * test_ops.c — the forward pass's small kernels against plain references:
 * RMSNorm, RoPE in both pairings (and with llama3 frequency factors), softmax,
 * GEGLU's GELU-tanh at every SIMD level,
 * and grouped attention (SIMD f16 path vs the portable path, f16 and 8-bit KV,
 * MHA/GQA/MQA group sizes) against a double-precision reference.
 */
#include "infer/infer.h"
#include "testutil.h"
#include "core/simd.h"
#include "tensor/act.h"

#include <math.h>
#include <string.h>

static void test_rmsnorm(void **state) {
    (void)state;
    float x[7] = {1, -2, 3, -4, 5, -6, 7}, w[7] = {1, 1, 1, 1, 2, 2, 2}, out[7];
    ks_rmsnorm(out, x, w, 7, 1e-6f);
    double ms = 0;
    for (int i = 0; i < 7; i++) ms += x[i] * x[i];
    ms /= 7;
    for (int i = 0; i < 7; i++) assert_float_equal(out[i], x[i] / sqrt(ms + 1e-6) * w[i], 1e-5);
}

static void test_rope_pairs(void **state) {
    (void)state;
    enum { D = 16 };
    float c[D / 2], s[D / 2], ff[D / 2];
    for (int j = 0; j < D / 2; j++) ff[j] = 1.0f + j; /* llama3-style divisors */
    for (int use_ff = 0; use_ff < 2; use_ff++)
        for (int neox = 0; neox < 2; neox++) {
            int pos = 37;
            ks_rope_angles(c, s, pos, D, 10000.0f, use_ff ? ff : NULL);
            float v[D], ref[D];
            for (int i = 0; i < D; i++) v[i] = ref[i] = (float)(i + 1) * 0.1f;
            ks_rope_apply(v, D, neox, c, s);
            for (int j = 0; j < D / 2; j++) {
                double th = pos * pow(10000.0, -2.0 * j / D) / (use_ff ? ff[j] : 1.0);
                int i0 = neox ? j : 2 * j, i1 = neox ? j + D / 2 : 2 * j + 1;
                double a = ref[i0] * cos(th) - ref[i1] * sin(th), b = ref[i0] * sin(th) + ref[i1] * cos(th);
                assert_float_equal(v[i0], a, 1e-5);
                assert_float_equal(v[i1], b, 1e-5);
            }
            /* rotation preserves the norm */
            double n0 = 0, n1 = 0;
            for (int i = 0; i < D; i++) n0 += ref[i] * ref[i], n1 += v[i] * v[i];
            assert_float_equal(n0, n1, 1e-4);
        }
    /* position 0 is the identity */
    ks_rope_angles(c, s, 0, D, 10000.0f, NULL);
    for (int j = 0; j < D / 2; j++) assert_float_equal(c[j], 1.0, 0), assert_float_equal(s[j], 0.0, 0);
}

static void test_softmax(void **state) {
    (void)state;
    float x[4] = {1000, 1000, 999, -INFINITY};
    ks_softmax(x, 4);
    double e = exp(-1.0), z = 2 + e;
    assert_float_equal(x[0], 1 / z, 1e-6);
    assert_float_equal(x[2], e / z, 1e-6);
    assert_float_equal(x[3], 0, 0);
}

/* sinks [G] (or NULL): one more logit per head in the softmax's
 * denominator, with no value row (gpt-oss); mass_out (or NULL) gets the
 * rows' total probability summed over the heads */
static void ref_attention_sinks(const float *Kf, const float *Vf, int len, int hd, int G, const float *q,
                                const float *sinks, double *out, double *mass_out) {
    double mass = 0;
    for (int g = 0; g < G; g++) {
        double *sc = malloc(sizeof(double) * len), mx = -1e300, sum = 0;
        for (int t = 0; t < len; t++) {
            double d = 0;
            for (int i = 0; i < hd; i++) d += (double)q[g * hd + i] * Kf[t * hd + i];
            sc[t] = d / sqrt(hd);
            if (sc[t] > mx) mx = sc[t];
        }
        if (sinks && sinks[g] > mx) mx = sinks[g];
        for (int t = 0; t < len; t++) sum += (sc[t] = exp(sc[t] - mx));
        double rows = sum;
        if (sinks) sum += exp(sinks[g] - mx);
        mass += rows / sum;
        for (int i = 0; i < hd; i++) {
            double acc = 0;
            for (int t = 0; t < len; t++) acc += sc[t] / sum * Vf[t * hd + i];
            out[g * hd + i] = acc;
        }
        free(sc);
    }
    if (mass_out) *mass_out = mass;
}

static void ref_attention(const float *Kf, const float *Vf, int len, int hd, int G, const float *q, double *out) {
    ref_attention_sinks(Kf, Vf, len, hd, G, q, NULL, out, NULL);
}

/* n random K and V rows stored as kt (K, V: [n][row bytes]) and, for the
 * reference, exactly the stored (rounded) values as f32 (Kf, Vf: [n][hd]). */
static void fill_kv(ks_kv_type kt, ks_rng *rng, int n, int hd, uint8_t *K, uint8_t *V, float *Kf, float *Vf) {
    size_t rb = ks_kv_row_bytes(kt, hd);
    for (int t = 0; t < n; t++) {
        float kr[1024], vr[1024]; /* up to KS_ATTN_BF16_MAX_HD */
        for (int i = 0; i < hd; i++) kr[i] = ks_rng_normal(rng), vr[i] = ks_rng_normal(rng);
        if (kt == KS_KV_F16) {
            for (int i = 0; i < hd; i++) {
                ((ks_f16 *)(K + rb * t))[i] = ks_f32_to_f16(kr[i]);
                ((ks_f16 *)(V + rb * t))[i] = ks_f32_to_f16(vr[i]);
                Kf[t * hd + i] = ks_f16_to_f32(((ks_f16 *)(K + rb * t))[i]);
                Vf[t * hd + i] = ks_f16_to_f32(((ks_f16 *)(V + rb * t))[i]);
            }
        } else {
            ks_quantize_row(KS_DTYPE_Q8_0, kr, K + rb * t, hd);
            ks_quantize_row(KS_DTYPE_Q8_0, vr, V + rb * t, hd);
            ks_dequantize_row(KS_DTYPE_Q8_0, K + rb * t, Kf + t * hd, hd);
            ks_dequantize_row(KS_DTYPE_Q8_0, V + rb * t, Vf + t * hd, hd);
        }
    }
}

static void check_attention(ks_kv_type kt, int len, int hd, int G, bool simd) {
    if (kt != KS_KV_F16 && hd % 32) return; /* 8-bit KV rows are whole Q8_0 blocks */
    ks_rng rng = {(uint64_t)len * 131 + (uint64_t)hd * 7 + (uint64_t)G};
    size_t rb = ks_kv_row_bytes(kt, hd);
    uint8_t *K = malloc(rb * len), *V = malloc(rb * len);
    float *Kf = malloc(sizeof(float) * len * hd), *Vf = malloc(sizeof(float) * len * hd);
    float *q = malloc(sizeof(float) * G * hd), *out = malloc(sizeof(float) * G * hd);
    float *scores = malloc(sizeof(float) * (G > 4 ? G : 4) * len), *tmp = malloc(sizeof(float) * hd);
    double *ref = malloc(sizeof(double) * G * hd);
    fill_kv(kt, &rng, len, hd, K, V, Kf, Vf);
    for (int i = 0; i < G * hd; i++) q[i] = ks_rng_normal(&rng);
    ks_attention_group(kt, K, V, len, hd, G, q, scores, out, tmp, simd);
    ref_attention(Kf, Vf, len, hd, G, q, ref);
    float *reff = malloc(sizeof(float) * G * hd);
    for (int i = 0; i < G * hd; i++) reff[i] = (float)ref[i];
    double mx, e = ks_test_nmse(out, reff, (size_t)G * hd, &mx);
    /* 8-bit KV on the SIMD path scores with the query rounded to int8 (one
     * scale per 32-block, once per call) and weighs the values with the
     * probabilities rounded to 7 or 8 bits (per block of rows;
     * test_attention_q8_values): relative RMS error up to ~1e-2 against the
     * float reference, where every other path is at 1e-5 */
    double tol = kt == KS_KV_Q8 && simd && ks_simd_x86(ks_simd_current()) ? 2e-2 : 1e-5; /* NEON: no query rounding */
    if (e > tol) fail_msg("attention kt=%d len=%d hd=%d G=%d simd=%d: nmse %g max %g", kt, len, hd, G, simd, e, mx);
    free(K); free(V); free(Kf); free(Vf); free(q); free(out); free(scores); free(tmp); free(ref); free(reff);
}

/* A fragmented selection (runs of 1-3 rows out of len) through every kernel
 * path — SIMD (blocks merged from short runs), portable — against the
 * float64 reference over exactly the selected rows. */
static void check_segments_sinks(ks_kv_type kt, int len, int hd, int G, bool with_sinks) {
    if (kt != KS_KV_F16 && hd % 32) return;
    ks_rng rng = {(uint64_t)len * 17 + (uint64_t)hd + (uint64_t)G * 3};
    size_t rb = ks_kv_row_bytes(kt, hd);
    uint8_t *K = malloc(rb * len), *V = malloc(rb * len);
    float *Kf = malloc(sizeof(float) * len * hd), *Vf = malloc(sizeof(float) * len * hd);
    float *Ka = malloc(sizeof(float) * len * hd), *Va = malloc(sizeof(float) * len * hd); /* every row, stored values */
    fill_kv(kt, &rng, len, hd, K, V, Ka, Va);
    ks_kv_seg *segs = malloc(sizeof(ks_kv_seg) * len);
    int nseg = 0, total = 0;
    for (int t = 0; t < len;) {
        int run = 1 + (int)(ks_rng_next(&rng) % 3), gap = 1 + (int)(ks_rng_next(&rng) % 5);
        if (t + run > len) run = len - t;
        segs[nseg++] = (ks_kv_seg){K + rb * t, V + rb * t, run};
        for (int j = 0; j < run; j++, total++)
            for (int i = 0; i < hd; i++) {
                Kf[total * hd + i] = Ka[(t + j) * hd + i];
                Vf[total * hd + i] = Va[(t + j) * hd + i];
            }
        t += run + gap;
    }
    float *q = malloc(sizeof(float) * G * hd), *out = malloc(sizeof(float) * G * hd), *reff = malloc(sizeof(float) * G * hd);
    float *scores = malloc(sizeof(float) * ((G > 4 ? G : 4) * total + 16)), *tmp = malloc(sizeof(float) * (hd + 16));
    float *w = calloc((size_t)total, sizeof(float));
    double *ref = malloc(sizeof(double) * G * hd), mass = G;
    for (int i = 0; i < G * hd; i++) q[i] = ks_rng_normal(&rng);
    /* sinks around the scores' scale (some heads give them most of the mass, some little) */
    float sinks[32];
    KS_ASSERT(G <= 32);
    for (int g = 0; g < G; g++) sinks[g] = 2.0f * ks_rng_normal(&rng) + 2.0f;
    ref_attention_sinks(Kf, Vf, total, hd, G, q, with_sinks ? sinks : NULL, ref, &mass);
    for (int i = 0; i < G * hd; i++) reff[i] = (float)ref[i];
    for (int path = 0; path < 2; path++) {
        memset(w, 0, sizeof(float) * total);
        ks_attention_segs_sinks(kt, segs, nseg, total, hd, G, q, scores, out, tmp, w, path == 0,
                                with_sinks ? sinks : NULL);
        double mx, e = ks_test_nmse(out, reff, (size_t)G * hd, &mx);
        double tol = kt == KS_KV_Q8 && path == 0 && ks_simd_x86(ks_simd_current()) ? 2e-2 : 1e-5; /* see check_attention */
        if (e > tol)
            fail_msg("segments kt=%d len=%d hd=%d G=%d path %d sinks %d: nmse %g", kt, len, hd, G, path, with_sinks, e);
        double sum = 0;
        for (int t = 0; t < total; t++) sum += w[t];
        if (fabs(sum - mass) > 1e-3) fail_msg("segments path %d: weights sum %g, want %g", path, sum, mass);
    }
    free(K); free(V); free(Kf); free(Vf); free(Ka); free(Va); free(segs); free(q); free(out); free(reff); free(scores);
    free(tmp); free(w); free(ref);
}

static void check_segments(ks_kv_type kt, int len, int hd, int G) {
    check_segments_sinks(kt, len, hd, G, false);
}

/* Runs body once per SIMD kernel family this CPU has (AVX2, then AVX-512),
 * so an AVX-512 machine still checks the AVX2 kernels most users run. */
#define FOR_EACH_SIMD_LEVEL(body)                                                      \
    do {                                                                               \
        ks_simd_level hw_ = ks_simd_detect(), saved_ = ks_simd_force(hw_);             \
        for (int lv_ = hw_ >= KS_SIMD_AVX2 ? KS_SIMD_AVX2 : hw_; lv_ <= (int)hw_; lv_++) { \
            ks_simd_force((ks_simd_level)lv_);                                         \
            body;                                                                      \
        }                                                                              \
        ks_simd_force(saved_);                                                         \
    } while (0)

static void test_attention_segments(void **state) {
    (void)state;
    int hds[] = {64, 128, 16, 48};
    int groups[] = {1, 2, 4, 7};
    FOR_EACH_SIMD_LEVEL(for (int kt = 0; kt < 2; kt++) for (int a = 0; a < 4; a++) for (int b = 0; b < 4; b++)
                            check_segments((ks_kv_type)kt, 700, hds[a], groups[b]));
}

/* Attention sinks (gpt-oss) through every decode kernel and the portable
 * one, against float64: outputs, and the returned weights summing to the
 * rows' share of the mass (the sinks take the rest). */
static void test_attention_sinks(void **state) {
    (void)state;
    int hds[] = {64, 128, 48};
    int groups[] = {1, 2, 4, 7};
    FOR_EACH_SIMD_LEVEL(for (int kt = 0; kt < 2; kt++) for (int a = 0; a < 3; a++) for (int b = 0; b < 4; b++)
                            check_segments_sinks((ks_kv_type)kt, 300, hds[a], groups[b], true));
}

/* A long context in whole pages (5000 rows, 32-row segments) with keys that
 * grow along it (sharp, late-peaking softmax): outputs against float64,
 * attention weights against the portable kernel's (both 1e-5 nmse: the sharp
 * logits amplify f32 dot-product rounding in either path). */
static void check_pages(int len, int hd, int G) {
    ks_rng rng = {(uint64_t)len * 5 + (uint64_t)hd + (uint64_t)G};
    size_t rb = ks_kv_row_bytes(KS_KV_F16, hd);
    uint8_t *K = malloc(rb * len), *V = malloc(rb * len);
    float *Kf = malloc(sizeof(float) * len * hd), *Vf = malloc(sizeof(float) * len * hd);
    for (int t = 0; t < len; t++)
        for (int i = 0; i < hd; i++) {
            float ramp = 0.5f + 2.0f * (float)t / (float)len;
            ((ks_f16 *)(K + rb * t))[i] = ks_f32_to_f16(ramp * ks_rng_normal(&rng));
            ((ks_f16 *)(V + rb * t))[i] = ks_f32_to_f16(ks_rng_normal(&rng));
            Kf[t * hd + i] = ks_f16_to_f32(((ks_f16 *)(K + rb * t))[i]);
            Vf[t * hd + i] = ks_f16_to_f32(((ks_f16 *)(V + rb * t))[i]);
        }
    int nseg = 0;
    ks_kv_seg *segs = malloc(sizeof(ks_kv_seg) * (len / 32 + 1));
    for (int t = 0; t < len; t += 32) segs[nseg++] = (ks_kv_seg){K + rb * t, V + rb * t, len - t < 32 ? len - t : 32};
    float *q = malloc(sizeof(float) * G * hd), *out = malloc(sizeof(float) * G * hd), *reff = malloc(sizeof(float) * G * hd);
    float *scores = malloc(sizeof(float) * ((G > 4 ? G : 4) * len + 16)), *tmp = malloc(sizeof(float) * (hd + 16));
    float *w[2] = {calloc((size_t)len, sizeof(float)), calloc((size_t)len, sizeof(float))};
    double *ref = malloc(sizeof(double) * G * hd);
    for (int i = 0; i < G * hd; i++) q[i] = ks_rng_normal(&rng);
    ref_attention(Kf, Vf, len, hd, G, q, ref);
    for (int i = 0; i < G * hd; i++) reff[i] = (float)ref[i];
    for (int path = 0; path < 2; path++) { /* 0: SIMD (chunked for hd 64/128), 1: portable */
        ks_attention_segs(KS_KV_F16, segs, nseg, len, hd, G, q, scores, out, tmp, w[path], path == 0);
        double mx, e = ks_test_nmse(out, reff, (size_t)G * hd, &mx);
        if (e > 1e-5) fail_msg("pages len=%d hd=%d G=%d path %d: nmse %g", len, hd, G, path, e);
    }
    double mx, e = ks_test_nmse(w[0], w[1], (size_t)len, &mx);
    if (e > 1e-5) fail_msg("pages len=%d hd=%d G=%d: weights differ between paths, nmse %g", len, hd, G, e);
    free(K); free(V); free(Kf); free(Vf); free(segs); free(q); free(out); free(reff); free(scores); free(tmp);
    free(w[0]); free(w[1]); free(ref);
}

static void test_attention_pages(void **state) {
    (void)state;
    int hds[] = {64, 128};
    int groups[] = {1, 4, 7};
    FOR_EACH_SIMD_LEVEL(for (int a = 0; a < 2; a++) for (int b = 0; b < 3; b++) check_pages(5000, hds[a], groups[b]));
}

/* Wide query groups on one KV head (latent attention: 16 heads on a 576-dim
 * latent; more than sixteen take two passes; 5 and 12 are padded to 8 and
 * 16): the AVX-512 wide kernel where it applies (f16; 8-bit KV takes the
 * AVX2 one), every level against float64, with and without sinks, and over
 * a long paged context against the portable kernel's weights. */
static void test_attention_wide(void **state) {
    (void)state;
    const int shapes[][2] = {{576, 16}, {576, 12}, {96, 20}, {288, 5}, {32, 17}};
    FOR_EACH_SIMD_LEVEL(for (int kt = 0; kt < 2; kt++) for (int i = 0; i < 5; i++) {
        check_segments((ks_kv_type)kt, 300, shapes[i][0], shapes[i][1]);
        check_segments_sinks((ks_kv_type)kt, 120, shapes[i][0], shapes[i][1], true);
    });
    FOR_EACH_SIMD_LEVEL(check_pages(2000, 576, 16));
    if (ks_simd_detect() == KS_SIMD_AVX512)
        assert_string_equal(ks_attention_kernel_name(KS_KV_F16, 576, 16), "avx512_wide");
}

/* The prefill block kernel: R query rows with causal limits over pages, each
 * row against the float64 reference over its visible rows. */
static void check_block(ks_kv_type kt, int n, int hd, int G, int P) {
    const bool neon = ks_simd_current() >= KS_SIMD_NEON;
    if (!ks_simd_x86(ks_simd_current()) && !neon) return; /* no block kernel below the SIMD levels */
    enum { R = 16 };
    ks_rng rng = {(uint64_t)n * 7 + (uint64_t)hd + (uint64_t)G * 11};
    size_t rb = ks_kv_row_bytes(kt, hd);
    uint8_t *K = malloc(rb * n), *V = malloc(rb * n);
    float *Kf = malloc(sizeof(float) * n * hd), *Vf = malloc(sizeof(float) * n * hd);
    fill_kv(kt, &rng, n, hd, K, V, Kf, Vf);
    ks_kv_seg segs[256];
    int nseg = 0;
    for (int t = 0; t < n; t += P) segs[nseg++] = (ks_kv_seg){K + rb * t, V + rb * t, n - t < P ? n - t : P};
    int32_t n_att[R];
    for (int r = 0; r < R; r++) n_att[r] = n - R + 1 + r;
    float *q = malloc(sizeof(float) * R * G * hd), *out = malloc(sizeof(float) * R * G * hd);
    float *S = malloc(sizeof(float) * R * G * n), *tile = malloc(sizeof(float) * (P + 16) * hd);
    for (int i = 0; i < R * G * hd; i++) q[i] = ks_rng_normal(&rng);
    float scale = 1.0f / sqrtf((float)hd);
    bool ok = neon ? ks_attention_block_neon(kt, segs, nseg, n_att, R, hd, G, q, (size_t)G * hd, out, (size_t)G * hd,
                                             S, tile, scale)
              : kt == KS_KV_F16 && ks_simd_current() >= KS_SIMD_AVX512
                  ? ks_attention_block_avx512((const ks_kv_seg16 *)segs, nseg, n_att, R, hd, G, q, (size_t)G * hd, out,
                                              (size_t)G * hd, S, tile, scale)
                  : ks_attention_block_avx2(kt, segs, nseg, n_att, R, hd, G, q, (size_t)G * hd, out, (size_t)G * hd, S,
                                            tile, scale);
    assert_true(ok);
    if (kt == KS_KV_F16 && !neon && ks_simd_current() >= KS_SIMD_AVX512) {
        /* the AVX-512 kernel scores up to 8 queries per K vector: each query alone (one row, one head) gives its bits */
        float *one = malloc(sizeof(float) * R * G * hd);
        for (int r = 0; r < R; r++)
            for (int g = 0; g < G; g++) {
                const size_t at = (size_t)r * G * hd + (size_t)g * hd;
                assert_true(ks_attention_block_avx512((const ks_kv_seg16 *)segs, nseg, n_att + r, 1, hd, 1, q + at,
                                                      (size_t)hd, one + at, (size_t)hd, S, tile, scale));
            }
        if (memcmp(one, out, sizeof(float) * R * G * hd))
            fail_msg("block n=%d hd=%d G=%d: the block's queries differ from each query alone", n, hd, G);
        free(one);
    }
    double *ref = malloc(sizeof(double) * G * hd);
    float *reff = malloc(sizeof(float) * G * hd);
    for (int r = 0; r < R; r++) {
        ref_attention(Kf, Vf, n_att[r], hd, G, q + (size_t)r * G * hd, ref);
        for (int i = 0; i < G * hd; i++) reff[i] = (float)ref[i];
        double mx, e = ks_test_nmse(out + (size_t)r * G * hd, reff, (size_t)G * hd, &mx);
        if (e > 1e-5) fail_msg("block kt=%d n=%d hd=%d G=%d P=%d row %d: nmse %g", kt, n, hd, G, P, r, e);
        if (neon) { /* NEON: bit for bit the decode kernel over the row's visible entries */
            ks_kv_seg rs[256];
            int nrs = 0;
            for (int t = 0; t < n_att[r]; t += P)
                rs[nrs++] = (ks_kv_seg){K + rb * t, V + rb * t, n_att[r] - t < P ? n_att[r] - t : P};
            float *sc = malloc(sizeof(float) * G * n), *one = malloc(sizeof(float) * G * hd);
            assert_true(ks_attention_segs_neon(kt, rs, nrs, n_att[r], hd, G, q + (size_t)r * G * hd, sc, one, scale, NULL, NULL));
            if (memcmp(one, out + (size_t)r * G * hd, sizeof(float) * G * hd))
                fail_msg("block kt=%d n=%d hd=%d G=%d P=%d row %d: not the decode kernel's bits", kt, n, hd, G, P, r);
            free(sc), free(one);
        }
    }
    free(K); free(V); free(Kf); free(Vf); free(q); free(out); free(S); free(tile); free(ref); free(reff);
}

static void test_attention_block(void **state) {
    (void)state;
    FOR_EACH_SIMD_LEVEL({
        check_block(KS_KV_F16, 20, 16, 1, 8);
        check_block(KS_KV_F16, 300, 64, 4, 32);
        check_block(KS_KV_F16, 513, 128, 2, 32);
        check_block(KS_KV_F16, 100, 288, 2, 16);
        check_block(KS_KV_F16, 150, 576, 16, 32); /* MLA's absorbed heads: 16 on one 576-dim latent */
        check_block(KS_KV_Q8, 300, 64, 4, 32);
        check_block(KS_KV_Q8, 100, 288, 2, 16);
    });
}

/* f32 -> the nearest bf16 (ties to even), as f32 */
static float round_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u = (u + 0x7FFFu + ((u >> 16) & 1)) & 0xFFFF0000u;
    memcpy(&f, &u, 4);
    return f;
}

/* The bf16 block kernel (AVX-512 BF16 hosts): each row against the float64
 * reference run on Q, K and V rounded to bf16 (normalised RMS error < 3e-3,
 * measured <= 1.8e-3: what is left is the probabilities' rounding to bf16,
 * ~2^-9 relative each) and against the exact reference (< 2e-2, measured
 * <= 6.7e-3 on sharp scores, q ~ 2 N(0,1): the inputs' 2^-9 rounding
 * amplified through the softmax); and every row's bits independent of how
 * the rows are split into blocks and the keys into segments (what chunked
 * prefill rests on).  Q8_0 KV (kt): the same bounds against the same
 * references on the dequantised keys and values, which the kernel rounds to
 * bf16 once each as it does f16 ones. */
static void check_block_bf16_s(ks_kv_type kt, int n, int hd, int G, int P, bool with_sinks) {
    if (!ks_attention_block_bf16_usable()) return;
    enum { R = 16 };
    ks_rng rng = {(uint64_t)n * 5 + (uint64_t)hd + (uint64_t)G * 3 + (uint64_t)kt * 101};
    size_t rb = ks_kv_row_bytes(kt, hd);
    uint8_t *K = malloc(rb * n), *V = malloc(rb * n);
    float *Kf = malloc(sizeof(float) * n * hd), *Vf = malloc(sizeof(float) * n * hd);
    fill_kv(kt, &rng, n, hd, K, V, Kf, Vf);
    float *Kb = malloc(sizeof(float) * n * hd), *Vb = malloc(sizeof(float) * n * hd);
    for (int i = 0; i < n * hd; i++) Kb[i] = round_bf16(Kf[i]), Vb[i] = round_bf16(Vf[i]);
    float *q = malloc(sizeof(float) * R * G * hd), *out = malloc(sizeof(float) * R * G * hd);
    float *out2 = malloc(sizeof(float) * R * G * hd);
    float *scr = malloc(sizeof(float) * ks_attention_block_bf16_scratch(R, G, hd));
    for (int i = 0; i < R * G * hd; i++) q[i] = 2.0f * ks_rng_normal(&rng);
    int32_t n_att[R];
    for (int r = 0; r < R; r++) n_att[r] = n - R + 1 + r;
    float scale = 1.0f / sqrtf((float)hd);
    ks_kv_seg segs[600];
    int nseg = 0;
    for (int t = 0; t < n; t += P) segs[nseg++] = (ks_kv_seg){K + rb * t, V + rb * t, n - t < P ? n - t : P};
    float sk[8], *sinks = with_sinks ? sk : NULL; /* gpt-oss's sinks (attn.h) */
    for (int g = 0; g < G && g < 8; g++) sk[g] = 2.0f * ks_rng_normal(&rng) + 2.0f;
    if (with_sinks)
        assert_true(ks_attention_block_bf16_sinks(kt, segs, nseg, n_att, R, hd, G, q, (size_t)G * hd, out,
                                                  (size_t)G * hd, scr, scale, sinks));
    else if (kt == KS_KV_F16) /* the f16 entry point */
        assert_true(ks_attention_block_bf16((const ks_kv_seg16 *)segs, nseg, n_att, R, hd, G, q, (size_t)G * hd, out,
                                            (size_t)G * hd, scr, scale));
    else assert_true(ks_attention_block_bf16_kv(kt, segs, nseg, n_att, R, hd, G, q, (size_t)G * hd, out, (size_t)G * hd,
                                                scr, scale));
    double *ref = malloc(sizeof(double) * G * hd);
    float *reff = malloc(sizeof(float) * G * hd), *qr = malloc(sizeof(float) * G * hd);
    for (int r = 0; r < R; r++) {
        ref_attention_sinks(Kf, Vf, n_att[r], hd, G, q + (size_t)r * G * hd, sinks, ref, NULL);
        for (int i = 0; i < G * hd; i++) reff[i] = (float)ref[i];
        double mx, e = ks_test_nmse(out + (size_t)r * G * hd, reff, (size_t)G * hd, &mx);
        if (e > 2e-2) fail_msg("bf16 block kt=%d n=%d hd=%d G=%d P=%d row %d: nmse %g", kt, n, hd, G, P, r, e);
        for (int i = 0; i < G * hd; i++) qr[i] = round_bf16(q[(size_t)r * G * hd + i]);
        ref_attention_sinks(Kb, Vb, n_att[r], hd, G, qr, sinks, ref, NULL);
        for (int i = 0; i < G * hd; i++) reff[i] = (float)ref[i];
        e = ks_test_nmse(out + (size_t)r * G * hd, reff, (size_t)G * hd, &mx);
        if (e > 3e-3)
            fail_msg("bf16 block (bf16 inputs) kt=%d n=%d hd=%d G=%d P=%d row %d: nmse %g", kt, n, hd, G, P, r, e);
    }
    /* the same rows one at a time, over segments of 7 keys (odd, unaligned) */
    nseg = 0;
    for (int t = 0; t < n; t += 7) segs[nseg++] = (ks_kv_seg){K + rb * t, V + rb * t, n - t < 7 ? n - t : 7};
    for (int r = 0; r < R; r++) {
        int ns = 0;
        for (int t = 0; ns < nseg && t < n_att[r]; t += segs[ns++].len) {}
        assert_true(ks_attention_block_bf16_sinks(kt, segs, ns, n_att + r, 1, hd, G, q + (size_t)r * G * hd,
                                                  (size_t)G * hd, out2 + (size_t)r * G * hd, (size_t)G * hd, scr, scale,
                                                  sinks));
    }
    assert_memory_equal(out, out2, sizeof(float) * R * G * hd);
    free(K); free(V); free(Kf); free(Vf); free(Kb); free(Vb); free(q); free(out); free(out2); free(scr); free(ref); free(reff); free(qr);
}

static void check_block_bf16(ks_kv_type kt, int n, int hd, int G, int P) {
    check_block_bf16_s(kt, n, hd, G, P, false);
}

static void test_attention_block_bf16(void **state) {
    (void)state;
    for (int kt = KS_KV_F16; kt <= KS_KV_Q8; kt++) {
        check_block_bf16((ks_kv_type)kt, 300, 64, 4, 32);
        check_block_bf16((ks_kv_type)kt, 513, 128, 2, 32);
        check_block_bf16((ks_kv_type)kt, 40, 32, 1, 16);
        check_block_bf16((ks_kv_type)kt, 1000, 64, 3, 64);
        /* MLA's absorbed attention (deepseek2): 16 heads on one latent head of 512 + 64 */
        check_block_bf16((ks_kv_type)kt, 150, 576, 16, 32);
        /* with gpt-oss's sinks: the same bounds against the references with sinks */
        check_block_bf16_s((ks_kv_type)kt, 300, 64, 4, 32, true);
        check_block_bf16_s((ks_kv_type)kt, 200, 64, 2, 16, true);
    }
}

static void test_attention(void **state) {
    (void)state;
    int lens[] = {1, 2, 33, 500};
    int groups[] = {1, 2, 4, 7, 8}; /* MHA, GQA (incl. odd groups), MQA-like sizes */
    int hds[] = {32, 64, 128, 80, 48, 288};
    FOR_EACH_SIMD_LEVEL(for (int kt = 0; kt < 2; kt++) for (size_t a = 0; a < 4; a++) for (size_t b = 0; b < 5; b++)
                            for (size_t h = 0; h < 6; h++) for (int simd = 0; simd < 2; simd++)
                                check_attention((ks_kv_type)kt, lens[a], hds[h], groups[b], simd));
}

/* The integer 8-bit KV scores are exact int32 sums, so the AVX2 (sign
 * trick) and the ymm VNNI (u8 offset) variants of the AVX2-shaped kernel,
 * which an AVX-512 CPU runs for head dims other than 64 and 128, must agree
 * bit for bit; rows
 * with -128 (not produced by the quantizer, legal in the format) included. */
static void test_attention_q8_levels(void **state) {
    (void)state;
    if (ks_simd_detect() != KS_SIMD_AVX512) skip();
    const int len = 77, hds[] = {96, 288}, Gs[] = {1, 2, 4, 8}; /* head dims the AVX-512 kernel leaves to these */
    for (int h = 0; h < 2; h++)
        for (int b = 0; b < 4; b++) {
            int hd = hds[h], G = Gs[b];
            ks_rng rng = {(uint64_t)hd * 31 + (uint64_t)G};
            size_t rb = ks_kv_row_bytes(KS_KV_Q8, hd);
            uint8_t *K = malloc(rb * len), *V = malloc(rb * len);
            float *Kf = malloc(sizeof(float) * len * hd), *Vf = malloc(sizeof(float) * len * hd);
            float *q = malloc(sizeof(float) * G * hd), *o[2], *sc = malloc(sizeof(float) * 8 * len), *tmp = malloc(sizeof(float) * hd);
            fill_kv(KS_KV_Q8, &rng, len, hd, K, V, Kf, Vf);
            for (int t = 0; t < len; t += 5) K[rb * t + 2 + (size_t)t % 32] = 0x80; /* int8 -128 */
            for (int i = 0; i < G * hd; i++) q[i] = 3 * ks_rng_normal(&rng);
            ks_simd_level saved = ks_simd_current();
            for (int lv = 0; lv < 2; lv++) {
                o[lv] = malloc(sizeof(float) * G * hd);
                ks_simd_force(lv ? KS_SIMD_AVX512 : KS_SIMD_AVX2);
                ks_attention_group(KS_KV_Q8, K, V, len, hd, G, q, sc, o[lv], tmp, true);
            }
            ks_simd_force(saved);
            if (memcmp(o[0], o[1], sizeof(float) * G * hd)) fail_msg("q8 AVX2 and VNNI differ: hd=%d G=%d", hd, G);
            free(K); free(V); free(Kf); free(Vf); free(q); free(o[0]); free(o[1]); free(sc); free(tmp);
        }
}

/* The 8-bit KV kernels' integer values alone.  With one query head the
 * kernel's attention weights (ks_attention_segs' weights out) are its own
 * probabilities P, so sum_t P[t] * V[t] over the stored values, in float64,
 * is the output its scores imply, and the difference is the values' error
 * only.  The kernels fold each row's block scale dv(t, b) into its weight
 * and quantise P[t] * dv(t, b) per 32-row block and 32-element block b with
 * one scale s = max / W (AVX-512 at head dims 64 and 128: W = 255, u8; the
 * AVX2-shaped kernels: W = 127, so that maddubs cannot saturate), so each
 * weight is off by at most s / 2: every output element must be within
 * sum_t s / 2 * |v[t][d]| (v the int8 value) of the reference, plus float
 * rounding.  The relative RMS error is far below that worst case (roundings
 * of either sign; most weights far below their block's max) but large
 * against these zero-mean random values, whose weighted sum is the small
 * residue of rows that cancel: measured up to 0.50% with 8 bits and 1.2%
 * with 7 (about Q8_0's own rounding of V: half a step of max|v| / 127 per
 * element); the test allows 0.75% and 1.5%, so a lost bit shows. */
static void check_q8_values(int len, int hd, float qmul) {
    ks_rng rng = {(uint64_t)len * 29 + (uint64_t)hd * 3 + (uint64_t)(qmul * 10)};
    size_t rb = ks_kv_row_bytes(KS_KV_Q8, hd);
    uint8_t *K = malloc(rb * len), *V = malloc(rb * len);
    float *Kf = malloc(sizeof(float) * len * hd), *Vf = malloc(sizeof(float) * len * hd);
    fill_kv(KS_KV_Q8, &rng, len, hd, K, V, Kf, Vf);
    float *q = malloc(sizeof(float) * hd), *out = malloc(sizeof(float) * hd), *reff = malloc(sizeof(float) * hd);
    float *scores = malloc(sizeof(float) * (4 * (size_t)len + 16)), *tmp = malloc(sizeof(float) * (hd + 16));
    float *w = calloc((size_t)len, sizeof(float));
    double *ref = calloc((size_t)hd, sizeof(double)), *bound = calloc((size_t)hd, sizeof(double));
    double *mag = calloc((size_t)hd, sizeof(double));
    for (int i = 0; i < hd; i++) q[i] = qmul * ks_rng_normal(&rng);
    ks_kv_seg seg = {K, V, len};
    ks_attention_segs(KS_KV_Q8, &seg, 1, len, hd, 1, q, scores, out, tmp, w, true);
    for (int t = 0; t < len; t++)
        for (int d = 0; d < hd; d++) {
            ref[d] += (double)w[t] * Vf[t * hd + d];
            mag[d] += fabs((double)w[t] * Vf[t * hd + d]);
        }
    const bool wide = ks_simd_current() >= KS_SIMD_AVX512 && (hd == 64 || hd == 128);
    const double wmax = wide ? 255 : 127;
    for (int t0 = 0; t0 < len; t0 += 32) /* the kernels' blocks: 32 rows of the one segment */
        for (int b = 0; b < hd / 32; b++) {
            double mx = 0;
            int t1 = t0 + 32 < len ? t0 + 32 : len;
            for (int t = t0; t < t1; t++) {
                double dv = ks_f16_to_f32(*(const ks_f16 *)(V + rb * t + 34 * b));
                if (w[t] * dv > mx) mx = w[t] * dv;
            }
            for (int t = t0; t < t1; t++)
                for (int d = 32 * b; d < 32 * b + 32; d++)
                    bound[d] += 0.5 * mx / wmax * fabs((double)((const int8_t *)V)[rb * t + 34 * b + 2 + d % 32]);
        }
    for (int d = 0; d < hd; d++) {
        double err = fabs(out[d] - ref[d]);
        if (err > bound[d] + 1e-5 * mag[d] + 1e-7)
            fail_msg("q8 values len=%d hd=%d qmul=%g d=%d: error %g over the rounding bound %g", len, hd, qmul, d, err,
                     bound[d]);
        reff[d] = (float)ref[d];
    }
    double mx, e = ks_test_nmse(out, reff, (size_t)hd, &mx);
    if (e > (wide ? 7.5e-3 : 1.5e-2))
        fail_msg("q8 values len=%d hd=%d qmul=%g simd=%d: relative RMS error %g", len, hd, qmul, ks_simd_current(), e);
    free(K); free(V); free(Kf); free(Vf); free(q); free(out); free(reff); free(scores); free(tmp); free(w); free(ref);
    free(bound); free(mag);
}

static void test_attention_q8_values(void **state) {
    (void)state;
    if (!ks_simd_x86(ks_simd_detect())) skip(); /* the x86 kernels' quantized probabilities */
    const int lens[] = {700, 4096}, hds[] = {64, 128, 96, 288};
    const float qmuls[] = {0.5f, 1.0f, 3.0f}; /* flat, typical and peaked attention */
    FOR_EACH_SIMD_LEVEL(for (int a = 0; a < 2; a++) for (int h = 0; h < 4; h++) for (int m = 0; m < 3; m++)
                            check_q8_values(lens[a], hds[h], qmuls[m]));
}

/* GEGLU's GELU-tanh (tensor/act.c: the sigmoid form over the vector exp)
 * against 0.5 g (1 + tanh u) in double (the same identity), at every SIMD level up to this
 * CPU's, for lengths that leave every tail, over the range where the
 * activation matters and far past it (saturated and underflowed lanes). */
static void test_geglu_tanh(void **state) {
    (void)state;
    enum { N = 300 };
    float g[N], up[N], got[N];
    ks_rng r = {42};
    for (int i = 0; i < N; i++) {
        g[i] = (float)(ks_rng_uniform(&r) * 24 - 12);
        up[i] = (float)(ks_rng_uniform(&r) * 4 - 2);
    }
    const float special[] = {0.0f, -0.0f, 1e-4f, -1e-4f, 30.0f, -30.0f, 200.0f, -200.0f, 0.5f, -0.5f, 3.0f, -3.0f};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) g[i * 7] = special[i];
    const int64_t lens[] = {1, 3, 7, 8, 15, 16, 17, 33, 40, 257, N};
    ks_simd_level hw = ks_simd_detect(), saved = ks_simd_force(hw);
    for (int lv = KS_SIMD_SCALAR; lv <= (int)hw; lv++) {
        ks_simd_force((ks_simd_level)lv);
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            int64_t n = lens[li];
            memcpy(got, g, sizeof(float) * (size_t)n);
            ks_geglu_tanh(got, up, n);
            for (int64_t i = 0; i < n; i++) {
                double x = g[i], u = 0.7978845608028654 * (x + 0.044715 * x * x * x);
                /* 0.5 (1 + tanh u) as 1 / (1 + e^(-2u)): the same number without
                 * 1 + tanh u's cancellation, which double alone loses below u ~ -10 */
                double ref = x / (1.0 + exp(-2.0 * u)) * up[i];
                /* u's own float rounding (a few ulp) moves e^(-2|u|) by 2|u| times as much */
                if (!(fabs(got[i] - ref) <= (2e-6 + 4e-7 * fabs(2 * u)) * fabs(ref) + 1e-30))
                    fail_msg("level %d, n %lld, i %lld: g %g up %g: %.9g against %.9g", lv, (long long)n, (long long)i,
                             g[i], up[i], got[i], ref);
            }
        }
    }
    ks_simd_force(saved);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_rope_pairs),
        cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_geglu_tanh),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_segments),
        cmocka_unit_test(test_attention_sinks),
        cmocka_unit_test(test_attention_pages),
        cmocka_unit_test(test_attention_wide),
        cmocka_unit_test(test_attention_block),
        cmocka_unit_test(test_attention_block_bf16),
        cmocka_unit_test(test_attention_q8_levels),
        cmocka_unit_test(test_attention_q8_values),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
