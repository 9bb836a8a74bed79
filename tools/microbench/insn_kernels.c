/*
 * insn_kernels.c — one call of a non-matmul kernel repeated reps times, for
 * counting its instructions per unit of work under QEMU (diagnostics, not a
 * test): insn_bench's method (scripts/insn_per_byte.sh) for the kernels that
 * are not weight products.
 *
 *   gram_kao   LRQK's Gram and K_O^T A_KO update (ks_lrqk_gram_kao_add),
 *              rank 32, head dim 64, a run of 64 rows; unit: one
 *              multiply-add of the update (64 x (32 x 33 / 2 + 64 x 32)).
 *   attn_sinks decode attention with attention sinks (ks_attention_segs_sinks,
 *              gpt-oss's form), f16 KV, head dim 64, 4 heads, 512 rows;
 *              unit: one byte of K and V read.
 *
 * Why: QEMU runs the ARM kernels here, so they cannot be timed; what can be
 * shown is the instructions each spends per unit against the AVX2 kernel and
 * against the portable code (KS_SIMD=scalar) on the same input.  Run it at
 * reps and at 0 and divide the difference by reps x the units it prints.
 *
 * Usage: insn_kernels gram_kao|attn_sinks [reps=2]; KS_SIMD caps the level.
 */
#include "core/core.h"
#include "core/simd.h"
#include "tensor/dtype.h"
#include "attn/attn.h"
#include "spec/lrqk_math.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int gram_kao(int reps) {
    enum { R = 32, HD = 64, LEN = 64 };
    float *gram = ks_malloc(sizeof(float) * R * R), *kao = ks_malloc(sizeof(float) * HD * R);
    float *keys = ks_malloc(sizeof(float) * LEN * HD), *ak = ks_malloc(sizeof(float) * LEN * R), sign[LEN];
    if (!gram || !kao || !keys || !ak) return 1;
    ks_lrqk_randn(gram, (size_t)R * R, 1);
    ks_lrqk_randn(kao, (size_t)HD * R, 2);
    ks_lrqk_randn(keys, (size_t)LEN * HD, 3);
    ks_lrqk_randn(ak, (size_t)LEN * R, 4);
    for (int x = 0; x < LEN; x++) sign[x] = x % 3 ? 1.0f : -1.0f;
    for (int k = 0; k < reps; k++) ks_lrqk_gram_kao_add(gram, kao, keys, ak, sign, LEN, HD, R);
    printf("gram_kao %s: %d units, kernel %s, reps %d (checksum %g)\n", ks_simd_name(ks_simd_current()),
           LEN * (R * (R + 1) / 2 + HD * R), ks_lrqk_gram_kao_kernel_name(R), reps, (double)(gram[R + 1] + kao[5]));
    ks_free(gram), ks_free(kao), ks_free(keys), ks_free(ak);
    return 0;
}

static int attn_sinks(int reps) {
    enum { HD = 64, G = 4, N = 512 };
    const size_t rb = ks_kv_row_bytes(KS_KV_F16, HD);
    uint16_t *K = ks_malloc(rb * N), *V = ks_malloc(rb * N);
    float *q = ks_malloc(sizeof(float) * G * HD), *out = ks_malloc(sizeof(float) * G * HD);
    float *scores = ks_malloc(sizeof(float) * G * N), *tmp = ks_malloc(sizeof(float) * (HD + 16));
    float sinks[G] = {1.0f, 2.0f, 0.5f, 3.0f};
    if (!K || !V || !q || !out || !scores || !tmp) return 1;
    ks_rng rng = {7};
    for (size_t i = 0; i < (size_t)N * HD; i++) K[i] = ks_f32_to_f16(ks_rng_normal(&rng));
    for (size_t i = 0; i < (size_t)N * HD; i++) V[i] = ks_f32_to_f16(ks_rng_normal(&rng));
    for (int i = 0; i < G * HD; i++) q[i] = ks_rng_normal(&rng);
    ks_kv_seg seg = {K, V, N};
    for (int k = 0; k < reps; k++)
        ks_attention_segs_sinks(KS_KV_F16, &seg, 1, N, HD, G, q, scores, out, tmp, NULL, true, sinks);
    printf("attn_sinks %s: %zu units, kernel %s, reps %d (checksum %g)\n", ks_simd_name(ks_simd_current()), 2 * rb * N,
           ks_attention_kernel_name(KS_KV_F16, HD, G), reps, (double)out[3]);
    ks_free(K), ks_free(V), ks_free(q), ks_free(out), ks_free(scores), ks_free(tmp);
    return 0;
}

int main(int argc, char **argv) {
    const char *what = argc > 1 ? argv[1] : "";
    const int reps = argc > 2 ? atoi(argv[2]) : 2;
    if (reps >= 0 && !strcmp(what, "gram_kao")) return gram_kao(reps);
    if (reps >= 0 && !strcmp(what, "attn_sinks")) return attn_sinks(reps);
    fprintf(stderr, "usage: insn_kernels gram_kao|attn_sinks [reps]\n");
    return 2;
}
