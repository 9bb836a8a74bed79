/*
 * attn.h — the attention kernels' own header: the segment a kernel reads
 * and the SIMD kernels (attn_avx512.c, attn_avx2.c).  The KV row format
 * (ks_kv_row_bytes, ks_kv_dtype) is tensor/dtype.h's, shared with the store.
 *
 * The kernels need nothing of the context: they take query rows and runs of
 * K/V rows and write outputs, so they include only this header and the
 * context's files (through infer.h) include it to call them.  Keeping the
 * context struct out of the kernels' sight is what lets either side change
 * without the other.  The portable reference and the dispatch that picks a
 * kernel (ks_attention_segs, attention.c) are declared in infer.h.
 */
#ifndef KS_ATTN_ATTN_H
#define KS_ATTN_ATTN_H

#include "kvsieve.h"
#include "tensor/dtype.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A run of consecutive KV rows: K and V each [len][row], read in place. */
typedef struct ks_kv_seg {
    const void *K, *V;
    int32_t len;
} ks_kv_seg;
typedef struct ks_kv_seg16 {
    const uint16_t *K, *V;
    int32_t len;
} ks_kv_seg16;

/* Prefill: causal attention of R consecutive query rows (G heads each) of one
 * sequence over one KV head's pages, each page read once for the whole
 * block.  n_att[r]: entries row r sees.  S: [R*G][n_att[R-1]], tile: [P + 16][hd] (AVX-512: a K page transposed, keys padded to 16).
 * f16 KV, hd % 16 == 0, AVX-512; false if it does not apply. */
bool ks_attention_block_avx512(const ks_kv_seg16 *segs, int nseg, const int32_t *n_att, int R, int hd, int G,
                               const float *q, size_t q_stride, float *out, size_t out_stride, float *S, float *tile,
                               float scale);

/* The same on AVX2 + FMA + F16C, for f16 KV (hd % 8 == 0) and 8-bit KV
 * (hd % 32 == 0; pages dequantized into the tile). */
bool ks_attention_block_avx2(ks_kv_type kt, const ks_kv_seg *segs, int nseg, const int32_t *n_att, int R, int hd,
                             int G, const float *q, size_t q_stride, float *out, size_t out_stride, float *S,
                             float *tile, float scale);


/* The same on AVX-512 BF16 (attn_block_bf16.c): Q, K, probabilities and V
 * rounded to bf16, products summed in f32 by vdpbf16ps, an online softmax
 * over tiles of KS_ATTN_BF16_TILE keys aligned to absolute entry positions
 * (no score matrix).  f16 KV (Q8_0: _kv below), hd % 32 == 0 (up to
 * KS_ATTN_BF16_MAX_HD: MLA's latent heads are 576); scratch: floats as
 * ks_attention_block_bf16_scratch counts them.  A query's output depends on
 * its own q, the keys it sees and its count only, never on the block, chunk
 * or segment boundaries.  _usable: the CPU has AVX-512 BF16 and KS_ATTN is
 * not "f32" (which keeps the f32 kernels: the old goldens stay checkable). */
#define KS_ATTN_BF16_TILE 128
#define KS_ATTN_BF16_MAX_HD 1024
size_t ks_attention_block_bf16_scratch(int R, int G, int hd);
bool ks_attention_block_bf16_usable(void);
/* Whether the prefill takes the bf16 kernel for heads wider than 512 too
 * (KS_ATTN=bf16; MLA's 576-dim latent heads).  Off by default: on the
 * deepseek2 goldens the rounding of those wide rows moved the logits by
 * nerr 0.019-0.023 where the f32 kernel gives 0.0014-0.0028, and a
 * low-rank-Q model's perplexity by +0.56% against llama.cpp's (f32: +0.08%;
 * docs/results/mla.md) for a prefill 1.4x faster at 2048 tokens. */
bool ks_attention_block_bf16_wide(void);
bool ks_attention_block_bf16(const ks_kv_seg16 *segs, int nseg, const int32_t *n_att, int R, int hd, int G,
                             const float *q, size_t q_stride, float *out, size_t out_stride, float *scratch,
                             float scale);
/* The same over f16 or Q8_0 rows (kt): a tile's Q8_0 keys and values are
 * dequantised and rounded to bf16 once per tile, for every query of the
 * block, then go through the same loops (hd % 32 == 0: whole Q8_0 blocks). */
bool ks_attention_block_bf16_kv(ks_kv_type kt, const ks_kv_seg *segs, int nseg, const int32_t *n_att, int R, int hd,
                                int G, const float *q, size_t q_stride, float *out, size_t out_stride, float *scratch,
                                float scale);

/* The same with attention sinks (gpt-oss; sinks [G] per query head of the
 * group, or NULL), the only blocked prefill kernel that has them. */
bool ks_attention_block_bf16_sinks(ks_kv_type kt, const ks_kv_seg *segs, int nseg, const int32_t *n_att, int R,
                                   int hd, int G, const float *q, size_t q_stride, float *out, size_t out_stride,
                                   float *scratch, float scale, const float *sinks);

/* The prefill block kernels' causal clamp: of the page [e0, e0 + L), the
 * entries query x (row x / G of the block) sees; 0: none. */
static inline int ks_attn_block_visible(const int32_t *n_att, int G, int x, int e0, int L) {
    int lim = n_att[x / G] - e0;
    return lim <= 0 ? 0 : lim > L ? L : lim;
}

/* Attention sinks (gpt-oss; "Efficient Streaming Language Models with
 * Attention Sinks", section 3.2, as a learned per-head logit): sinks, when
 * not NULL, holds one logit per query head of the group ([G]) that joins the
 * softmax's denominator with no value row, so a head can put mass on
 * "nothing".  It is not a KV entry: no policy can drop it.  A kernel keeps
 * its running max m and sum S as before and divides by S + exp(sink - m)
 * at the end (the probabilities it returns for the policies too).
 *
 * AVX-512 f16 kernel for head dims 64 and 128; false if it does not apply.
 * scores: [total][4] scratch.  kt KS_KV_Q8: the same kernel over Q8_0 rows
 * on integer units: scores by zmm vpdpbusd against the query quantised once
 * per call, values by vpdpbusd against the probabilities quantised to u8
 * per block of rows. */
bool ks_attention_segs_avx512_kv(ks_kv_type kt, const ks_kv_seg *segs, int nseg, int total, int hd, int G, const float *q,
                                 float *scores, float *out, float scale, float *weights, const float *sinks);
bool ks_attention_segs_avx512(const ks_kv_seg16 *segs, int nseg, int total, int hd, int G, const float *q,
                              float *scores, float *out, float scale, float *weights);

/* AVX2 + FMA + F16C kernel for f16 KV (head dims that are multiples of 16,
 * up to 512) and 8-bit KV (multiples of 32; scores and values on integer
 * units, the query quantised once per call and the probabilities to 7 bits
 * per block of rows: vpdpbusd where ks_simd_current() is AVX-512 (which
 * implies VNNI), maddubs otherwise); false if it does not apply.  scores:
 * [total][4] scratch. */
bool ks_attention_segs_avx2(ks_kv_type kt, const ks_kv_seg *segs, int nseg, int total, int hd, int G, const float *q,
                            float *scores, float *out, float scale, float *weights, const float *sinks);

/* AVX-512 kernel for a wide group (attn_avx512_wide.c): f16 KV, G > 4 query
 * heads on one KV head (latent attention's 16), head dims that are
 * multiples of 32 up to 1024; each row is read and converted once for up to
 * sixteen heads.  false if it does not apply.  scores: [total][G] scratch
 * (probabilities when weights is not NULL). */
bool ks_attention_segs_avx512_wide(ks_kv_type kt, const ks_kv_seg *segs, int nseg, int total, int hd, int G,
                                   const float *q, float *scores, float *out, float scale, float *weights,
                                   const float *sinks);

/* AArch64 NEON (attn_neon.c) for f16 KV and 8-bit KV (hd % 32), hd % 8 ==
 * 0 up to 1024, any G (eight heads a pass), with or without sinks (above); false if it does
 * not apply (always, off AArch64).  scores: [G][total] scratch. */
bool ks_attention_segs_neon(ks_kv_type kt, const ks_kv_seg *segs, int nseg, int total, int hd, int G, const float *q,
                            float *scores, float *out, float scale, float *weights, const float *sinks);
/* The prefill block form of it (attn_neon.c): ks_attention_block_avx2's
 * contract (f16 KV with hd % 8 == 0, 8-bit KV with hd % 32 == 0; S and
 * tile as there), each query's output bit for bit what
 * ks_attention_segs_neon gives it.  false off AArch64. */
bool ks_attention_block_neon(ks_kv_type kt, const ks_kv_seg *segs, int nseg, const int32_t *n_att, int R, int hd,
                             int G, const float *q, size_t q_stride, float *out, size_t out_stride, float *S,
                             float *tile, float scale);
/* Which prefill block kernel attend_block (attend.c) runs for this KV type
 * and head dim at the current level: "bf16", "avx512", "avx2", "neon", or
 * NULL where prefill goes row by row through the decode kernels. */
const char *ks_attention_block_kernel_name(ks_kv_type kt, int hd);

/* Which kernel ks_attention_segs runs for this KV type, head dim and group
 * size at the current SIMD level: "avx512", "avx2", "neon" or "reference"
 * (the dispatch test).  x86 kernels can still decline inside; the name is
 * their documented conditions. */
const char *ks_attention_kernel_name(ks_kv_type kt, int hd, int G);

/* Attention of G query heads (q [G][hd]) over one KV head's rows K, V
 * ([len][row]) : out [G][hd].  scores: [G][len] scratch, tmp: [hd] scratch.
 * allow_simd=false forces the portable reference. */
void ks_attention_group(ks_kv_type kt, const void *K, const void *V, int len, int hd, int G,
                        const float *q, float *scores, float *out, float *tmp, bool allow_simd);

/* Attention of G query heads over the concatenation of nseg segments (total
 * rows): softmax renormalised over exactly these rows.  weights (optional,
 * [total], accumulated +=): each row's probability summed over the G heads.
 * scores: [max(G, 4)][total] scratch; tmp: [hd + 16]. */
void ks_attention_segs(ks_kv_type kt, const ks_kv_seg *segs, int nseg, int total, int hd, int G, const float *q,
                       float *scores, float *out, float *tmp, float *weights, bool allow_simd);
/* The same with attention sinks (above): sinks [G] per-head logits in the
 * softmax's denominator, or NULL (then exactly ks_attention_segs). */
void ks_attention_segs_sinks(ks_kv_type kt, const ks_kv_seg *segs, int nseg, int total, int hd, int G, const float *q,
                             float *scores, float *out, float *tmp, float *weights, bool allow_simd,
                             const float *sinks);

#endif
