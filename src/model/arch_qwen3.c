/*
 * arch_qwen3.c — Qwen3: no Q/K/V biases, but an RMSNorm over each head of Q
 * and of K (applied before RoPE), NEOX pairing.
 */
#include "model/arch.h"

static ks_status qwen3_bind_layer(ks_model *m, int il, ks_layer *L) {
    return ks_arch_bind_llama_layer(m, il, L, true);
}

const ks_arch_desc ks_arch_qwen3 = {
    .name = "qwen3", .id = KS_ARCH_QWEN3, .rope_neox = true, .bind_layer = qwen3_bind_layer};
