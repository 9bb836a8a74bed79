/*
 * dtype.h — element types of weights and caches, their block layouts, and
 * row-level conversion between them and f32.
 *
 * Type ids equal GGML's so a GGUF tensor's type field maps directly.  All
 * quantized types are block formats: a row of n elements (n a multiple of the
 * block size) is n / block_size consecutive blocks, so a row's byte size is
 * exact and a tensor extent can be validated before any data is touched.
 *
 * Block layouts (little-endian, packed, identical to GGML's so files are
 * interchangeable):
 *   Q8_0 [32]: f16 d; int8 q[32];                      x = d * q
 *   Q4_0 [32]: f16 d; uint8 qs[16] (lo nibbles = x[0..15], hi = x[16..31]);
 *              x = d * (nibble - 8)
 *   Q4_K [256]: f16 d, dmin; uint8 scales[12] (8 six-bit scale/min pairs);
 *              uint8 qs[128]; x = d*sc*nibble - dmin*m per 32-element sub-block
 *   Q6_K [256]: uint8 ql[128], qh[64]; int8 scales[16]; f16 d;
 *              x = d * scale * (q6 - 32) per 16-element sub-block
 *   Q8_K [256]: f32 d; int8 qs[256]; int16 bsums[16] — activation-side only,
 *              the partner of the K-quants in integer dot products.
 * The further types of llama.cpp's common mixes (Q4_K_M, Q5_K_M, IQ4_XS...;
 * quant_types.c has their converters; "lo/hi nibbles" as in Q4_0):
 *   Q4_1 [32]: f16 d, m; uint8 qs[16];                  x = d * nibble + m
 *   Q5_0 [32]: f16 d; uint8 qh[4]; uint8 qs[16];        x = d * (q5 - 16),
 *              q5 = nibble | bit i of qh (LE u32) << 4 for element i
 *   Q5_1 [32]: f16 d, m; uint8 qh[4]; uint8 qs[16];     x = d * q5 + m
 *   IQ4_NL [32]: f16 d; uint8 qs[16];                   x = d * kvalues[nibble]
 *   MXFP4 [32]: uint8 e (E8M0 scale); uint8 qs[16] (E2M1 nibbles, lo/hi as
 *              Q4_0); x = 2^(e - 128) * ks_mxfp4_values[nibble], the OCP
 *              Microscaling spec's 2^(e - 127) times the E2M1 value, with the
 *              E2M1 values doubled to integers and the scale halved (GGML's
 *              kvalues_mxfp4 and GGML_E8M0_TO_FP32_HALF); gpt-oss ships its
 *              experts in it
 *   Q2_K [256]: uint8 scales[16] (lo 4 bits scale, hi 4 bits min per 16);
 *              uint8 qs[64] (2-bit planes); f16 d, dmin; x = d*sc*q - dmin*m
 *   Q3_K [256]: uint8 hmask[32]; uint8 qs[64]; uint8 scales[12] (16 six-bit
 *              scales); f16 d; x = d * (sc - 32) * (q2 - (hmask bit ? 0 : 4))
 *   Q5_K [256]: f16 d, dmin; uint8 scales[12] (as Q4_K); uint8 qh[32];
 *              uint8 qs[128] (as Q4_K); x = d*sc*q5 - dmin*m per 32
 *   IQ4_XS [256]: f16 d; uint16 scales_h; uint8 scales_l[4] (8 six-bit
 *              scales); uint8 qs[128]; x = d * (ls - 32) * kvalues[nibble]
 *   Q2_K / Q3_K element e of a block sits in qs[32 * (e / 128) + e % 32] at
 *   bits 2 * ((e / 32) % 4), with its sub-block scale at e / 16; Q3_K's high
 *   bit is bit (e / 32) of hmask[e % 32].  Q5_K's fifth bit of element
 *   64c + l (l < 32) is bit 2c of qh[l], of element 64c + 32 + l bit 2c + 1.
 */
#ifndef KS_DTYPE_H
#define KS_DTYPE_H

#include "kvsieve.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ks_dtype {
    KS_DTYPE_F32 = 0,
    KS_DTYPE_F16 = 1,
    KS_DTYPE_Q4_0 = 2,
    KS_DTYPE_Q4_1 = 3,
    KS_DTYPE_Q5_0 = 6,
    KS_DTYPE_Q5_1 = 7,
    KS_DTYPE_Q8_0 = 8,
    KS_DTYPE_Q2_K = 10,
    KS_DTYPE_Q3_K = 11,
    KS_DTYPE_Q4_K = 12,
    KS_DTYPE_Q5_K = 13,
    KS_DTYPE_Q6_K = 14,
    KS_DTYPE_Q8_K = 15,
    KS_DTYPE_IQ4_NL = 20,
    KS_DTYPE_IQ4_XS = 23,
    KS_DTYPE_BF16 = 30,
    KS_DTYPE_MXFP4 = 39,
    KS_DTYPE_MAX_ = 40 /* GGUF type ids at or above this are rejected */
} ks_dtype;

#define KS_QK8_0 32
#define KS_QK4_0 32
#define KS_QK_K 256

typedef uint16_t ks_f16;  /* IEEE binary16 bits */
typedef uint16_t ks_bf16; /* bfloat16 bits */

typedef struct { ks_f16 d; int8_t qs[KS_QK8_0]; } ks_block_q8_0;
typedef struct { ks_f16 d; uint8_t qs[KS_QK4_0 / 2]; } ks_block_q4_0;
typedef struct { ks_f16 d; ks_f16 dmin; uint8_t scales[12]; uint8_t qs[KS_QK_K / 2]; } ks_block_q4_k;
typedef struct { uint8_t ql[KS_QK_K / 2]; uint8_t qh[KS_QK_K / 4]; int8_t scales[KS_QK_K / 16]; ks_f16 d; } ks_block_q6_k;
typedef struct { float d; int8_t qs[KS_QK_K]; int16_t bsums[KS_QK_K / 16]; } ks_block_q8_k;
typedef struct { ks_f16 d, m; uint8_t qs[16]; } ks_block_q4_1;
typedef struct { ks_f16 d; uint8_t qh[4]; uint8_t qs[16]; } ks_block_q5_0;
typedef struct { ks_f16 d, m; uint8_t qh[4]; uint8_t qs[16]; } ks_block_q5_1;
typedef struct { ks_f16 d; uint8_t qs[16]; } ks_block_iq4_nl;
typedef struct { uint8_t e; uint8_t qs[16]; } ks_block_mxfp4;
typedef struct { uint8_t scales[KS_QK_K / 16]; uint8_t qs[KS_QK_K / 4]; ks_f16 d, dmin; } ks_block_q2_k;
typedef struct { uint8_t hmask[KS_QK_K / 8]; uint8_t qs[KS_QK_K / 4]; uint8_t scales[12]; ks_f16 d; } ks_block_q3_k;
typedef struct { ks_f16 d, dmin; uint8_t scales[12]; uint8_t qh[KS_QK_K / 8]; uint8_t qs[KS_QK_K / 2]; } ks_block_q5_k;
typedef struct { ks_f16 d; uint16_t scales_h; uint8_t scales_l[KS_QK_K / 64]; uint8_t qs[KS_QK_K / 2]; } ks_block_iq4_xs;

/* The 16 non-uniform levels of IQ4_NL / IQ4_XS (GGML's kvalues_iq4nl). */
extern const int8_t ks_iq4_values[16];
/* The 16 E2M1 values of MXFP4, doubled (GGML's kvalues_mxfp4): 0, 0.5, 1,
 * 1.5, 2, 3, 4, 6 and their negatives, times 2. */
extern const int8_t ks_mxfp4_values[16];
/* An MXFP4 block's E8M0 scale e as the factor of the doubled values:
 * 2^(e - 128) (e = 0 and 1 are subnormal floats; exact for every e). */
float ks_e8m0_half_to_f32(uint8_t e);

/* True for the types weights may have (the set the engine can compute with). */
bool ks_dtype_is_weight_type(uint32_t type);
const char *ks_dtype_name(ks_dtype t);          /* "q8_0", ...; "?" if unknown */
bool ks_dtype_from_name(const char *name, ks_dtype *out);
int64_t ks_dtype_block_size(ks_dtype t);         /* elements per block; 0 if unknown */
size_t ks_dtype_block_bytes(ks_dtype t);         /* bytes per block; 0 if unknown */
/* Bytes of a row of n elements; n must be a multiple of the block size. */
size_t ks_dtype_row_bytes(ks_dtype t, int64_t n);

float ks_f16_to_f32(ks_f16 h);
ks_f16 ks_f32_to_f16(float f);   /* round to nearest even */
float ks_bf16_to_f32(ks_bf16 h);
ks_bf16 ks_f32_to_bf16(float f); /* round to nearest even */

/* Row conversions; n a multiple of the block size of t. */
void ks_dequantize_row(ks_dtype t, const void *src, float *dst, int64_t n);
void ks_quantize_row(ks_dtype t, const float *src, void *dst, int64_t n);

/* One head's scaled query q [hd] (hd % 32 == 0) quantised once per call for
 * the Q8_0 integer dot products (tensor/q8dot_avx512.h, the AVX2 attention):
 * per 32-block d[b] = max |q| / 127 and qi = round(q / d) in [-127, 127]
 * (the sign trick's signed side; NULL: not wanted), qu = qi + 128
 * (vpdpbusd's unsigned side). */
void ks_quantize_query_q8(const float *q, int hd, int8_t *qi, uint8_t *qu, float *d);

/* The KV row format, shared by the store (kv) and attention (infer): one
 * token's K or V for one KV head is hd elements of f16, or of Q8_0 blocks for
 * 8-bit KV. */
static inline ks_dtype ks_kv_dtype(ks_kv_type t) { return t == KS_KV_F16 ? KS_DTYPE_F16 : KS_DTYPE_Q8_0; }
static inline size_t ks_kv_row_bytes(ks_kv_type t, int hd) { return ks_dtype_row_bytes(ks_kv_dtype(t), hd); }

/* How a weight's bytes are laid out: rows as in the file, or repacked once
 * at load into the prefill GEMM's panels (ks_matmul_pack, matmul/matmul.h;
 * same size, so it is done in place). */
typedef enum ks_weight_layout {
    KS_WEIGHT_ROWS = 0,
    KS_WEIGHT_Q8_0_P4 = 1,  /* 4-row panels, grouped lane order (rows not a multiple of 16) */
    KS_WEIGHT_Q4_0_P4 = 2,
    KS_WEIGHT_Q8_0_P16 = 3, /* 16-row panels transposed by 4-byte groups */
    KS_WEIGHT_Q4_K_X8 = 4,  /* Q4_K, 8-row groups interleaved per super-block (AVX2 decode and prefill) */
    KS_WEIGHT_Q4_K_X8Q = 5, /* the same with 8-byte lanes (AVX-512 VNNI decode and prefill) */
    KS_WEIGHT_Q6_K_X8Q = 6, /* Q6_K, 8-row groups with 8-byte lanes (AVX-512 VNNI decode and prefill) */
    KS_WEIGHT_IQ4_XS_X8Q = 7, /* IQ4_XS, likewise */
    KS_WEIGHT_Q5_K_X8Q = 8,   /* Q5_K, likewise */
} ks_weight_layout;

/* A 2-D weight matrix: [rows][cols] of type, rows contiguous (a model's
 * weights point into the GGUF mapping), unless layout says packed. */
typedef struct ks_weight {
    ks_dtype type;
    int64_t rows, cols;
    const void *data;
    ks_weight_layout layout;
} ks_weight;

/* Bytes one step streams from a weight. */
static inline size_t ks_weight_bytes(const ks_weight *w) {
    return ks_dtype_row_bytes(w->type, w->cols) * (size_t)w->rows;
}

#ifdef __cplusplus
}
#endif
#endif
