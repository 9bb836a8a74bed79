/*
 * arch_qwen2.c — Qwen2 / Qwen2.5: the llama layer plus biases on Q, K and V,
 * with Hugging Face's half-split (NEOX) RoPE pairing kept by the converter.
 */
#include "model/arch.h"

static ks_status qwen2_bind_layer(ks_model *m, int il, ks_layer *L) {
    return ks_arch_bind_llama_layer(m, il, L, false);
}

const ks_arch_desc ks_arch_qwen2 = {
    .name = "qwen2", .id = KS_ARCH_QWEN2, .rope_neox = true, .bind_layer = qwen2_bind_layer};
