/*
 * arch_deepseek2.c — DeepSeek-V2 / V2-Lite ("DeepSeek-V2: A Strong,
 * Economical, and Efficient Mixture-of-Experts Language Model"): multi-head
 * latent attention (Section 2.1) and DeepSeekMoE with shared experts
 * (Section 2.2), as llama.cpp's deepseek2 loader and graph read a GGUF
 * (src/models/deepseek2.cpp, conversion/deepseek.py DeepseekV2Model).
 *
 * Attention.  The converter writes the absorbed (MLA) form: one KV head
 * (head_count_kv 1) whose key is the latent plus the rope key
 * (key_length = kv_lora_rank + qk_rope) and whose value is the latent
 * (value_length = kv_lora_rank); key_length_mla / value_length_mla give the
 * per-head sizes of the decompressed form (qk_nope + qk_rope, v_head), and
 * rope.dimension_count is qk_rope.  kv_b is split per head into attn_k_b
 * (ne {qk_nope, kv_lora_rank, n_head}: W_UK_h transposed, ready to absorb
 * into the query) and attn_v_b (ne {kv_lora_rank, v_head, n_head}: W_UV_h).
 * Older files hold the fused attn_kv_b (ne {kv_lora_rank, n_head *
 * (qk_nope + v_head)}, head h's W_UK_h rows then its W_UV_h rows) and no
 * key_length_mla; their key_length / value_length / head_count_kv are the
 * decompressed heads'.  Those are read as the per-head sizes and the store
 * still gets the latent head; W_UV_h is a row view of kv_b, and W_UK_h is
 * transposed at load into an owned f32 copy (kv_lora_rank x qk_nope per
 * head: 4 MiB a layer at V2-Lite's shape), the price of absorbing a matrix
 * whose quantized blocks run along the other axis.  Q is attn_q (V2-Lite, q_lora_rank 0) or the
 * low-rank attn_q_a, attn_q_a_norm, attn_q_b (V2, q_lora_rank 1536).
 * RoPE pairs adjacent dimensions (llama.cpp's ROPE_TYPE_NORM: HF's
 * modeling de-interleaves q_pe / k_pe before rotate_half, the same map).
 *
 * Softmax scale.  llama.cpp scales the logits by mscale^2 / sqrt(qk_nope +
 * qk_rope), mscale = 1 + 0.1 mscale_all_dim ln(factor) under YaRN, as HF
 * does; the converter stores 0.1 mscale_all_dim as yarn_log_multiplier and
 * the loader divides it back by 0.1 ([TAG_DEEPSEEK2_YARN_LOG_MUL_FIX]).  The
 * cos/sin magnitude is g(s, mscale) / g(s, mscale_all_dim) = 1 for DeepSeek
 * (llama_context's special case: mscale = mscale_all_dim), which
 * rope_scaling.yarn_mscale states.  The store's kernels scale by
 * 1/sqrt(head_dim) of the latent head, so mla_q_scale carries the ratio.
 *
 * FFN.  The first leading_dense_block_count layers are dense SwiGLU of
 * feed_forward_length; the others route with softmax over expert_count
 * (expert_gating_func 1 or absent), keep expert_used_count, renormalise only
 * when expert_weights_norm, multiply by expert_weights_scale, and add
 * expert_shared_count shared experts fused into ffn_*_shexp.  Sigmoid
 * gating with a selection bias (exp_probs_b, V3) and group-limited routing
 * (expert_group_count > 1) are refused by name.
 */
#include "model/arch.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define MAX_EXPERTS 4096 /* a bound on file input before it sizes allocations (real models: <= 256) */

static ks_status deepseek2_read_hparams(const ks_gguf *g, ks_hparams *hp) {
    const char *a = hp->arch_name;
    uint32_t kv_lora = 0, q_lora = 0, k_mla = 0, v_mla = 0, dense = 0;
    uint32_t n_expert = 0, n_used = 0, n_ff_exp = 0, n_shared = 0, gating = 0, groups = 0;
    KS_TRY(ks_arch_key_u32(g, a, "attention.kv_lora_rank", &kv_lora, true));
    KS_TRY(ks_arch_key_u32(g, a, "attention.q_lora_rank", &q_lora, false));
    KS_TRY(ks_arch_key_u32(g, a, "attention.key_length_mla", &k_mla, false));
    v_mla = k_mla;
    KS_TRY(ks_arch_key_u32(g, a, "attention.value_length_mla", &v_mla, false));
    const uint32_t rope = (uint32_t)hp->n_rot;
    char key[96];
    if (k_mla == 0) { /* the older fused attn_kv_b form: key/value_length are the decompressed heads' */
        k_mla = (uint32_t)hp->head_dim;
        v_mla = k_mla;
        snprintf(key, sizeof key, "%s.attention.value_length", a);
        if (ks_gguf_get_u32(g, key, &v_mla) != KS_OK) v_mla = k_mla;
        if (kv_lora == 0 || kv_lora > 4096 || kv_lora % 2 || kv_lora + rope > 1024)
            return KS_FAIL(KS_ERR_FORMAT, "%s: kv_lora_rank %u is implausible", a, kv_lora);
        hp->head_dim = (int32_t)(kv_lora + rope); /* the store's head: the latent one */
        hp->n_head_kv = 1;
        hp->mla_fused_kv_b = true;
    }
    if (kv_lora == 0 || kv_lora > 4096 || kv_lora % 2 || q_lora > 65536)
        return KS_FAIL(KS_ERR_FORMAT, "%s: kv_lora_rank %u / q_lora_rank %u are implausible", a, kv_lora, q_lora);
    if ((uint32_t)hp->head_dim != kv_lora + rope)
        return KS_FAIL(KS_ERR_FORMAT,
                       "%s: the latent head is %d dims (key_length) but kv_lora_rank %u + rope %u = %u", a,
                       hp->head_dim, kv_lora, rope, kv_lora + rope);
    if (hp->n_head_kv != 1)
        return KS_FAIL(KS_ERR_FORMAT, "%s: latent attention has one KV head, the file states %d", a, hp->n_head_kv);
    uint32_t v_len = 0;
    snprintf(key, sizeof key, "%s.attention.value_length", a);
    if (!hp->mla_fused_kv_b && ks_gguf_get_u32(g, key, &v_len) == KS_OK && v_len != kv_lora)
        return KS_FAIL(KS_ERR_FORMAT, "%s: value_length %u must equal kv_lora_rank %u (the latent)", a, v_len, kv_lora);
    if (k_mla <= rope || k_mla - rope > 1024 || v_mla == 0 || v_mla > 1024)
        return KS_FAIL(KS_ERR_FORMAT, "%s: key_length_mla %u (rope %u) / value_length_mla %u are implausible", a, k_mla,
                       rope, v_mla);
    /* the decompressed sizes must fit the latent head's buffers (infer/mla.c) */
    if (k_mla > (uint32_t)hp->head_dim || v_mla > (uint32_t)hp->head_dim ||
        q_lora > (uint32_t)hp->n_head * (uint32_t)hp->head_dim)
        return KS_FAIL(KS_ERR_UNSUPPORTED, "%s: key_length_mla %u, value_length_mla %u or q_lora_rank %u exceed the "
                       "latent head of %d dims", a, k_mla, v_mla, q_lora, hp->head_dim);
    KS_TRY(ks_arch_key_u32(g, a, "leading_dense_block_count", &dense, false));
    KS_TRY(ks_arch_key_u32(g, a, "expert_count", &n_expert, true));
    KS_TRY(ks_arch_key_u32(g, a, "expert_used_count", &n_used, true));
    KS_TRY(ks_arch_key_u32(g, a, "expert_feed_forward_length", &n_ff_exp, true));
    KS_TRY(ks_arch_key_u32(g, a, "expert_shared_count", &n_shared, false));
    KS_TRY(ks_arch_key_u32(g, a, "expert_gating_func", &gating, false));
    KS_TRY(ks_arch_key_u32(g, a, "expert_group_count", &groups, false));
    if (n_expert == 0 || n_expert > MAX_EXPERTS)
        return KS_FAIL(KS_ERR_FORMAT, "%s.expert_count %u is outside [1, %d]", a, n_expert, MAX_EXPERTS);
    if (n_used == 0 || n_used > n_expert)
        return KS_FAIL(KS_ERR_FORMAT, "%s.expert_used_count %u must be in [1, expert_count %u]", a, n_used, n_expert);
    if (n_ff_exp == 0 || n_ff_exp > 1 << 20 || n_shared > 64 || dense > (uint32_t)hp->n_layer)
        return KS_FAIL(KS_ERR_FORMAT, "%s: expert n_ff %u, %u shared experts, %u dense layers are implausible", a,
                       n_ff_exp, n_shared, dense);
    if (gating > 1) /* llama.cpp: 1 softmax, 2 sigmoid (V3, with exp_probs_b) */
        return KS_FAIL(KS_ERR_UNSUPPORTED, "%s.expert_gating_func %u: only softmax gating (1) is supported", a, gating);
    if (groups > 1)
        return KS_FAIL(KS_ERR_UNSUPPORTED, "%s.expert_group_count %u: group-limited routing is not supported", a,
                       groups);
    float scale = 0;
    KS_TRY(ks_arch_key_f32(g, a, "expert_weights_scale", &scale));
    bool norm = false;
    snprintf(key, sizeof key, "%s.expert_weights_norm", a);
    ks_status st = ks_gguf_get_bool(g, key, &norm);
    if (st != KS_OK && st != KS_ERR_NOT_FOUND) return KS_FAIL(st, "%s is not a bool", key);
    if (!(scale >= 0 && scale < 1e4f)) return KS_FAIL(KS_ERR_FORMAT, "%s.expert_weights_scale %g is implausible", a, scale);
    hp->kv_lora_rank = (int32_t)kv_lora;
    hp->q_lora_rank = (int32_t)q_lora;
    hp->qk_nope = (int32_t)(k_mla - rope);
    hp->v_head_mla = (int32_t)v_mla;
    hp->n_dense_lead = (int32_t)dense;
    hp->n_expert = (int32_t)n_expert;
    hp->n_expert_used = (int32_t)n_used;
    hp->n_ff_exp = (int32_t)n_ff_exp;
    hp->n_expert_shared = (int32_t)n_shared;
    hp->expert_norm = norm;
    hp->expert_weights_scale = scale;
    /* YaRN as llama.cpp reads deepseek2 (see the essay) */
    ks_rope_scaling *sc = &hp->rope_scaling;
    if (sc->log_mul != 0) {
        sc->log_mul /= 0.1f;
        if (sc->log_mul != 1.0f) sc->yarn_mscale = sc->log_mul;
    }
    double inv[512];
    float ms = 1;
    KS_TRY(ks_rope_gguf_inv_freq(hp->n_rot, hp->rope_base, sc, NULL, inv, &ms));
    double mscale = ms / (sc->attention_factor > 0 ? sc->attention_factor : 1.0); /* attn_factor_org */
    double ext = sc->ext_factor >= 0 ? sc->ext_factor : sc->type == KS_ROPE_SCALING_YARN ? 1.0 : 0.0;
    if (ext != 0 && sc->factor > 1) mscale *= 1.0 + 0.1 * sc->log_mul * log((double)sc->factor);
    double kq = mscale * mscale / sqrt((double)k_mla);
    hp->mla_q_scale = (float)(kq * sqrt((double)hp->head_dim));
    return KS_OK;
}

/* The older fused kv_b [n_head * (qk_nope + v_head)][kv_lora_rank]: W_UV_h as
 * row views, W_UK_h transposed into a[n_head][kv_lora_rank][qk_nope] f32 of
 * the mla struct's own (the file's rows run along kv_lora_rank, the absorbed
 * product needs them along qk_nope). */
static ks_status bind_fused_kv_b(ks_model *m, const char *name, ks_mla_layer *a) {
    const ks_hparams *hp = &m->hp;
    const int64_t nh = hp->n_head, R = hp->kv_lora_rank, nope = hp->qk_nope, V = hp->v_head_mla;
    const int64_t total = nh * (nope + V);
    for (int64_t h = 0; h < nh; h++)
        KS_TRY(ks_model_bind_rows(m, name, total, h * (nope + V) + nope, V, R, &a->v_b[h]));
    m->weight_bytes -= ks_weight_bytes(&a->v_b[0]) * (size_t)nh; /* counted once, below, with the key rows */
    m->n_params -= V * R * nh;
    const ks_gguf_tensor *t = ks_gguf_find_tensor(m->gguf, name);
    a->k_b_owned = ks_malloc(sizeof(float) * (size_t)(nh * R * nope));
    float *row = ks_malloc(sizeof(float) * (size_t)R);
    if (!a->k_b_owned || !row) {
        ks_free(row);
        return KS_FAIL(KS_ERR_NOMEM, "'%s': W_UK of %lld heads transposed", name, (long long)nh);
    }
    const size_t rb = ks_dtype_row_bytes(t->type, R);
    for (int64_t h = 0; h < nh; h++) {
        float *kt = a->k_b_owned + (size_t)(h * R * nope); /* [R][nope] */
        for (int64_t d = 0; d < nope; d++) {
            ks_dequantize_row(t->type, (const uint8_t *)t->data + (size_t)(h * (nope + V) + d) * rb, row, R);
            for (int64_t r = 0; r < R; r++) kt[r * nope + d] = row[r];
        }
        a->k_b[h] = (ks_weight){.type = KS_DTYPE_F32, .rows = R, .cols = nope, .data = kt};
    }
    ks_free(row);
    m->weight_bytes += t->nbytes;
    m->n_params += total * R;
    return KS_OK;
}

static ks_status bind_mla(ks_model *m, int il, ks_layer *L) {
    const ks_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd, nh = hp->n_head, R = hp->kv_lora_rank, rope = hp->n_rot;
    const int64_t qk = hp->qk_nope + rope;
    char nm[96];
#define NAME(suffix) (snprintf(nm, sizeof nm, "blk.%d." suffix, il), nm)
    ks_mla_layer *a = ks_calloc(1, sizeof *a + 2 * (size_t)nh * sizeof(ks_weight));
    if (!a) return KS_FAIL(KS_ERR_NOMEM, "layer %d: latent attention views of %lld heads", il, (long long)nh);
    L->mla = a; /* the model frees it, and its vectors, whatever happens below */
    a->k_b = (ks_weight *)(a + 1);
    a->v_b = a->k_b + nh;
    KS_TRY(ks_model_bind_vec(m, NAME("attn_norm.weight"), E, true, &L->attn_norm));
    if (hp->q_lora_rank > 0) {
        KS_TRY(ks_model_bind_weight(m, NAME("attn_q_a.weight"), hp->q_lora_rank, E, &a->wq_a));
        KS_TRY(ks_model_bind_vec(m, NAME("attn_q_a_norm.weight"), hp->q_lora_rank, true, &a->q_a_norm));
        KS_TRY(ks_model_bind_weight(m, NAME("attn_q_b.weight"), nh * qk, hp->q_lora_rank, &a->wq_b));
    } else {
        KS_TRY(ks_model_bind_weight(m, NAME("attn_q.weight"), nh * qk, E, &L->wq));
    }
    KS_TRY(ks_model_bind_weight(m, NAME("attn_kv_a_mqa.weight"), R + rope, E, &a->wkv_a));
    KS_TRY(ks_model_bind_vec(m, NAME("attn_kv_a_norm.weight"), R, true, &a->kv_a_norm));
    if (hp->mla_fused_kv_b) {
        KS_TRY(bind_fused_kv_b(m, NAME("attn_kv_b.weight"), a));
    } else {
        KS_TRY(ks_model_bind_stacked(m, NAME("attn_k_b.weight"), "tensor", R, hp->qk_nope, nh, a->k_b));
        KS_TRY(ks_model_bind_stacked(m, NAME("attn_v_b.weight"), "tensor", hp->v_head_mla, R, nh, a->v_b));
    }
    KS_TRY(ks_model_bind_weight(m, NAME("attn_output.weight"), E, nh * hp->v_head_mla, &L->wo));
    KS_TRY(ks_model_bind_vec(m, NAME("ffn_norm.weight"), E, true, &L->ffn_norm));
#undef NAME
    return KS_OK;
}

static ks_status bind_moe(ks_model *m, int il, ks_layer *L) {
    const ks_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd, F = hp->n_ff_exp, FS = (int64_t)hp->n_ff_exp * hp->n_expert_shared;
    char nm[96];
#define NAME(suffix) (snprintf(nm, sizeof nm, "blk.%d." suffix, il), nm)
    if (ks_gguf_find_tensor(m->gguf, NAME("exp_probs_b.bias")))
        return KS_FAIL(KS_ERR_UNSUPPORTED, "layer %d has exp_probs_b (V3's biased expert selection): not supported", il);
    if (ks_gguf_find_tensor(m->gguf, NAME("ffn_gate_up_exps.weight")))
        return KS_FAIL(KS_ERR_UNSUPPORTED, "layer %d fuses gate and up experts (ffn_gate_up_exps): not supported", il);
    const size_t n_expert = (size_t)hp->n_expert;
    ks_moe_layer *moe = ks_calloc(1, sizeof *moe + 3 * n_expert * sizeof(ks_weight));
    if (!moe) return KS_FAIL(KS_ERR_NOMEM, "layer %d: views of %zu experts", il, n_expert);
    L->moe = moe;
    moe->gate = (ks_weight *)(moe + 1);
    moe->up = moe->gate + n_expert;
    moe->down = moe->up + n_expert;
    KS_TRY(ks_model_bind_weight(m, NAME("ffn_gate_inp.weight"), hp->n_expert, E, &moe->router));
    KS_TRY(ks_model_bind_stacked(m, NAME("ffn_gate_exps.weight"), "expert tensor", F, E, hp->n_expert, moe->gate));
    KS_TRY(ks_model_bind_stacked(m, NAME("ffn_up_exps.weight"), "expert tensor", F, E, hp->n_expert, moe->up));
    KS_TRY(ks_model_bind_stacked(m, NAME("ffn_down_exps.weight"), "expert tensor", E, F, hp->n_expert, moe->down));
    moe->expert_bytes = ks_weight_bytes(&moe->gate[0]) + ks_weight_bytes(&moe->up[0]) + ks_weight_bytes(&moe->down[0]);
    if (FS > 0) {
        KS_TRY(ks_model_bind_weight(m, NAME("ffn_gate_shexp.weight"), FS, E, &moe->sh_gate));
        KS_TRY(ks_model_bind_weight(m, NAME("ffn_up_shexp.weight"), FS, E, &moe->sh_up));
        KS_TRY(ks_model_bind_weight(m, NAME("ffn_down_shexp.weight"), E, FS, &moe->sh_down));
    }
#undef NAME
    return KS_OK;
}

static ks_status deepseek2_bind_layer(ks_model *m, int il, ks_layer *L) {
    const ks_hparams *hp = &m->hp;
    char nm[96];
#define NAME(suffix) (snprintf(nm, sizeof nm, "blk.%d." suffix, il), nm)
    KS_TRY(bind_mla(m, il, L));
    if (il < hp->n_dense_lead) {
        KS_TRY(ks_model_bind_weight(m, NAME("ffn_gate.weight"), hp->n_ff, hp->n_embd, &L->w_gate));
        KS_TRY(ks_model_bind_weight(m, NAME("ffn_up.weight"), hp->n_ff, hp->n_embd, &L->w_up));
        KS_TRY(ks_model_bind_weight(m, NAME("ffn_down.weight"), hp->n_embd, hp->n_ff, &L->w_down));
        return KS_OK;
    }
#undef NAME
    return bind_moe(m, il, L);
}

const ks_arch_desc ks_arch_deepseek2 = {.name = "deepseek2",
                                        .id = KS_ARCH_DEEPSEEK2,
                                        .rope_neox = false,
                                        .read_hparams = deepseek2_read_hparams,
                                        .bind_layer = deepseek2_bind_layer};
