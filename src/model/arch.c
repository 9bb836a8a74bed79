/*
 * arch.c — the table of architectures (arch.h) and the layer binding most
 * of them share.
 *
 * The table is the one place a new architecture is registered; an unknown
 * general.architecture is refused with the list of known names, so a user
 * sees at once that the file is understood but not supported.
 */
#include "model/arch.h"

#include <stdio.h>
#include <string.h>

static const ks_arch_desc *const arch_table[] = {
    &ks_arch_llama,
    &ks_arch_mistral,
    &ks_arch_qwen2,
    &ks_arch_qwen3,
    &ks_arch_phi3,
    &ks_arch_smollm3,
    &ks_arch_mistral3,
    &ks_arch_gemma3,
    &ks_arch_qwen3moe,
    &ks_arch_gptoss,
    &ks_arch_deepseek2,
};
#define N_ARCH (sizeof arch_table / sizeof arch_table[0])

const ks_arch_desc *ks_arch_find(const char *name) {
    for (size_t i = 0; i < N_ARCH; i++)
        if (!strcmp(arch_table[i]->name, name)) return arch_table[i];
    return NULL;
}

const char *ks_arch_names(void) {
    static char names[512];
    if (!names[0]) {
        size_t n = 0;
        for (size_t i = 0; i < N_ARCH && n < sizeof names; i++)
            n += (size_t)snprintf(names + n, sizeof names - n, "%s%s", i ? ", " : "", arch_table[i]->name);
    }
    return names;
}

ks_status ks_arch_bind_attention(ks_model *m, int il, ks_layer *L, bool need_qk_norm) {
    const ks_hparams *hp = &m->hp;
    int64_t q_dim = (int64_t)hp->n_head * hp->head_dim;
    char nm[96];
#define NAME(suffix) (snprintf(nm, sizeof nm, "blk.%d." suffix, il), nm)
    KS_TRY(ks_model_bind_vec(m, NAME("attn_norm.weight"), hp->n_embd, true, &L->attn_norm));
    KS_TRY(ks_arch_bind_qkv(m, il, L));
    KS_TRY(ks_model_bind_weight(m, NAME("attn_output.weight"), hp->n_embd, q_dim, &L->wo));
    KS_TRY(ks_model_bind_vec(m, NAME("attn_q_norm.weight"), hp->head_dim, need_qk_norm, &L->q_norm));
    KS_TRY(ks_model_bind_vec(m, NAME("attn_k_norm.weight"), hp->head_dim, need_qk_norm, &L->k_norm));
    KS_TRY(ks_model_bind_vec(m, NAME("ffn_norm.weight"), hp->n_embd, true, &L->ffn_norm));
#undef NAME
    return KS_OK;
}

ks_status ks_arch_bind_llama_layer(ks_model *m, int il, ks_layer *L, bool need_qk_norm) {
    const ks_hparams *hp = &m->hp;
    char nm[96];
#define NAME(suffix) (snprintf(nm, sizeof nm, "blk.%d." suffix, il), nm)
    KS_TRY(ks_arch_bind_attention(m, il, L, need_qk_norm));
    KS_TRY(ks_model_bind_weight(m, NAME("ffn_gate.weight"), hp->n_ff, hp->n_embd, &L->w_gate));
    KS_TRY(ks_model_bind_weight(m, NAME("ffn_up.weight"), hp->n_ff, hp->n_embd, &L->w_up));
    KS_TRY(ks_model_bind_weight(m, NAME("ffn_down.weight"), hp->n_embd, hp->n_ff, &L->w_down));
#undef NAME
    return KS_OK;
}

/* Splits an owned [q_dim + 2 kv_dim] bias into three owned arrays. */
static ks_status split_qkv_bias(const float *b, int64_t q_dim, int64_t kv_dim, ks_layer *L, const char *name) {
    L->bq = ks_malloc(sizeof(float) * (size_t)q_dim);
    L->bk = ks_malloc(sizeof(float) * (size_t)kv_dim);
    L->bv = ks_malloc(sizeof(float) * (size_t)kv_dim);
    if (!L->bq || !L->bk || !L->bv) return KS_FAIL(KS_ERR_NOMEM, "splitting '%s'", name); /* the model frees them */
    memcpy(L->bq, b, sizeof(float) * (size_t)q_dim);
    memcpy(L->bk, b + q_dim, sizeof(float) * (size_t)kv_dim);
    memcpy(L->bv, b + q_dim + kv_dim, sizeof(float) * (size_t)kv_dim);
    return KS_OK;
}

ks_status ks_arch_bind_qkv(ks_model *m, int il, ks_layer *L) {
    const ks_hparams *hp = &m->hp;
    int64_t q_dim = (int64_t)hp->n_head * hp->head_dim, kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    char nm[96];
#define NAME(suffix) (snprintf(nm, sizeof nm, "blk.%d." suffix, il), nm)
    if (ks_gguf_find_tensor(m->gguf, NAME("attn_qkv.weight"))) {
        int64_t total = q_dim + 2 * kv_dim;
        KS_TRY(ks_model_bind_rows(m, nm, total, 0, q_dim, hp->n_embd, &L->wq));
        KS_TRY(ks_model_bind_rows(m, nm, total, q_dim, kv_dim, hp->n_embd, &L->wk));
        KS_TRY(ks_model_bind_rows(m, nm, total, q_dim + kv_dim, kv_dim, hp->n_embd, &L->wv));
        float *b = NULL;
        KS_TRY(ks_model_bind_vec(m, NAME("attn_qkv.bias"), total, false, &b));
        if (b) {
            ks_status st = split_qkv_bias(b, q_dim, kv_dim, L, nm);
            ks_free(b);
            KS_TRY(st);
        }
        return KS_OK;
    }
    KS_TRY(ks_model_bind_weight(m, NAME("attn_q.weight"), q_dim, hp->n_embd, &L->wq));
    KS_TRY(ks_model_bind_weight(m, NAME("attn_k.weight"), kv_dim, hp->n_embd, &L->wk));
    KS_TRY(ks_model_bind_weight(m, NAME("attn_v.weight"), kv_dim, hp->n_embd, &L->wv));
    KS_TRY(ks_model_bind_vec(m, NAME("attn_q.bias"), q_dim, false, &L->bq));
    KS_TRY(ks_model_bind_vec(m, NAME("attn_k.bias"), kv_dim, false, &L->bk));
    KS_TRY(ks_model_bind_vec(m, NAME("attn_v.bias"), kv_dim, false, &L->bv));
#undef NAME
    return KS_OK;
}
