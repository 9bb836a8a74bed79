/*
 * arch_smollm3.c — SmolLM3 ("smollm3"): the llama layer (normal RoPE, the
 * converter permutes Q/K as for llama) with RoPE left out of every fourth
 * layer (NoPE layers: HF's no_rope_layer_interval = 4, layers 3, 7, 11, ...).
 * The converter writes no key for the interval; llama.cpp hard-codes it
 * (n_no_rope_layer_step = 4, use_rope = (il + 1) % 4 != 0), and so do we,
 * as the hparams flag the forward pass reads.
 */
#include "model/arch.h"

static ks_status smollm3_read_hparams(const ks_gguf *g, ks_hparams *hp) {
    (void)g;
    hp->rope_skip_every = 4;
    return KS_OK;
}

static ks_status smollm3_bind_layer(ks_model *m, int il, ks_layer *L) {
    return ks_arch_bind_llama_layer(m, il, L, false);
}

const ks_arch_desc ks_arch_smollm3 = {.name = "smollm3", .id = KS_ARCH_LLAMA, .rope_neox = false,
                                      .read_hparams = smollm3_read_hparams, .bind_layer = smollm3_bind_layer};
