/*
 * arch_llama.c — Llama 2/3.x and Mistral (stored as "llama" or "mistral").
 *
 * llama.cpp's converter permutes the Q/K rows of these models so that RoPE
 * rotates adjacent pairs (2i, 2i+1): the "normal" pairing, not NEOX's
 * half-split.  Llama 3.1+ scales RoPE through a rope_freqs.weight tensor of
 * per-frequency divisors, which the loader binds for every architecture.
 */
#include "model/arch.h"

static ks_status llama_bind_layer(ks_model *m, int il, ks_layer *L) {
    return ks_arch_bind_llama_layer(m, il, L, false);
}

const ks_arch_desc ks_arch_llama = {
    .name = "llama", .id = KS_ARCH_LLAMA, .rope_neox = false, .bind_layer = llama_bind_layer};

const ks_arch_desc ks_arch_mistral = {
    .name = "mistral", .id = KS_ARCH_LLAMA, .rope_neox = false, .bind_layer = llama_bind_layer};
