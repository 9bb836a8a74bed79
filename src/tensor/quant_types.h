/*
 * quant_types.h — row converters of the weight types beyond the first seven
 * (Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q5_K, IQ4_XS, MXFP4), which dtype.c's
 * ks_dequantize_row / ks_quantize_row dispatch to.  Internal to tensor/.
 *
 * They live in their own file so dtype.c stays the place of the table and
 * the first types, and these block layouts (described in dtype.h) can be read
 * one at a time beside the converters that define them for this engine.
 */
#ifndef KS_QUANT_TYPES_H
#define KS_QUANT_TYPES_H

#include "tensor/dtype.h"

/* Whether t is one of the types handled here. */
bool ks_quant_ext_has(ks_dtype t);
/* n a multiple of t's block size; t one of ks_quant_ext_has's types. */
void ks_quant_ext_dequantize(ks_dtype t, const void *src, float *dst, int64_t n);
void ks_quant_ext_quantize(ks_dtype t, const float *src, void *dst, int64_t n);

/* Q4_K's 6-bit scale/min packing, shared with Q5_K (defined in dtype.c). */
void ks_q4k_get_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m);
void ks_q4k_set_scale_min(uint8_t *q /* [12] */, const uint8_t *sc /* [8] */, const uint8_t *m /* [8] */);

/* Q3_K's 16 six-bit scales (0..63, stored biased by 32) from its 12 bytes. */
void ks_q3k_get_scales(const uint8_t *q /* [12] */, uint8_t *sc /* [16] */);

#endif
