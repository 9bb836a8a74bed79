/*
 * model.c — bind a GGUF file to the architectures kvsieve runs.
 *
 * Every tensor the forward pass will touch is looked up and its shape checked
 * against the hyper-parameters here, once, with a message naming the tensor:
 * a file that loads is a file the forward pass can run without further checks.
 * What differs between architectures lives in one file each
 * (src/model/arch_<name>.c, registered in arch.c; arch.h says how); this file
 * reads the keys they all share, binds the model-level tensors, runs the
 * architecture's slots and repacks the weights.
 */
#define _GNU_SOURCE /* mprotect */
#include "model/model.h"

#include "model/arch.h"

#include "core/file.h"
#include "core/platform.h"
#include "matmul/matmul.h"

#include <math.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

ks_model_params ks_model_default_params(void) {
    return (ks_model_params){.use_mmap = true, .vocab_only = false};
}

ks_status ks_arch_key_u32(const ks_gguf *g, const char *arch, const char *suffix, uint32_t *out, bool required) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    ks_status st = ks_gguf_get_u32(g, key, out);
    if (st == KS_ERR_NOT_FOUND && !required) return KS_OK;
    if (st == KS_ERR_NOT_FOUND) return KS_FAIL(KS_ERR_FORMAT, "required key '%s' is missing", key);
    return st;
}

ks_status ks_arch_key_f32(const ks_gguf *g, const char *arch, const char *suffix, float *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    ks_status st = ks_gguf_get_f32(g, key, out);
    return st == KS_ERR_NOT_FOUND ? KS_OK : st;
}

/* <arch>.rope.scaling.* as llama.cpp's converter writes them and
 * llama_model_loader reads them: the type string (absent: no scaling
 * unless an old-style factor is present, which llama.cpp then reads as
 * linear), factor, original context (default: the trained one),
 * attn_factor (a multiplier of the cos/sin magnitude, default 1) and
 * YaRN's ext_factor / beta_fast / beta_slow / log multiplier (defaults -1,
 * 32, 1, 0).  yarn_attn_factor (HF's attention_factor) is written by the
 * converter but read by llama.cpp for grok only, so it is ignored here too;
 * llama3 scaling comes as the rope_freqs.weight tensor.  Any other type is
 * refused by name. */
static ks_status read_rope_scaling(const ks_gguf *g, const char *a, ks_hparams *hp) {
    ks_rope_scaling *sc = &hp->rope_scaling;
    *sc = (ks_rope_scaling){.type = KS_ROPE_SCALING_NONE, .factor = 0, .orig_max_pos = hp->n_ctx_train,
                            .beta_fast = 32.0f, .beta_slow = 1.0f, .attention_factor = 1.0f, .ext_factor = -1.0f};
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    ks_gguf_str type;
    bool has_type = ks_gguf_get_str(g, key, &type) == KS_OK;
    KS_TRY(ks_arch_key_f32(g, a, "rope.scaling.factor", &sc->factor));
    if (sc->factor == 0) KS_TRY(ks_arch_key_f32(g, a, "rope.scale_linear", &sc->factor));
    if (!has_type) sc->type = sc->factor > 0 && sc->factor != 1 ? KS_ROPE_SCALING_LINEAR : KS_ROPE_SCALING_NONE;
    else if (ks_gguf_str_eq(type, "none") || ks_gguf_str_eq(type, "llama3")) sc->type = KS_ROPE_SCALING_NONE;
    else if (ks_gguf_str_eq(type, "linear")) sc->type = KS_ROPE_SCALING_LINEAR;
    else if (ks_gguf_str_eq(type, "yarn")) sc->type = KS_ROPE_SCALING_YARN;
    else if (ks_gguf_str_eq(type, "longrope")) sc->type = KS_ROPE_SCALING_LONGROPE;
    else
        return KS_FAIL(KS_ERR_UNSUPPORTED, "%s = '%.*s' is not a supported rope scaling (none, linear, yarn, longrope)",
                       key, (int)type.len, type.data);
    uint32_t orig = (uint32_t)hp->n_ctx_train;
    KS_TRY(ks_arch_key_u32(g, a, "rope.scaling.original_context_length", &orig, false));
    sc->orig_max_pos = orig == 0 || orig > INT32_MAX ? hp->n_ctx_train : (int32_t)orig;
    KS_TRY(ks_arch_key_f32(g, a, "rope.scaling.attn_factor", &sc->attention_factor));
    KS_TRY(ks_arch_key_f32(g, a, "rope.scaling.yarn_ext_factor", &sc->ext_factor));
    KS_TRY(ks_arch_key_f32(g, a, "rope.scaling.yarn_beta_fast", &sc->beta_fast));
    KS_TRY(ks_arch_key_f32(g, a, "rope.scaling.yarn_beta_slow", &sc->beta_slow));
    KS_TRY(ks_arch_key_f32(g, a, "rope.scaling.yarn_log_multiplier", &sc->log_mul));
    if (!(sc->factor >= 0 && sc->factor < 1e6f) || !(sc->attention_factor > 0 && sc->attention_factor < 100) ||
        !isfinite(sc->ext_factor) || !isfinite(sc->log_mul) || !(sc->beta_fast > 0) || !(sc->beta_slow > 0) ||
        !isfinite(sc->beta_fast) || !isfinite(sc->beta_slow))
        return KS_FAIL(KS_ERR_FORMAT,
                       "implausible rope scaling: factor %g, attn_factor %g, yarn ext %g, beta %g/%g, log_mul %g",
                       sc->factor, sc->attention_factor, sc->ext_factor, sc->beta_fast, sc->beta_slow, sc->log_mul);
    /* check once here, so a context never fails on what the file stated */
    double inv[512];
    float ms;
    return ks_rope_gguf_inv_freq(hp->n_rot, hp->rope_base, sc, NULL, inv, &ms);
}

static ks_status read_hparams(const ks_gguf *g, ks_hparams *hp, const ks_arch_desc **desc_out) {
    ks_gguf_str arch;
    ks_status st = ks_gguf_get_str(g, "general.architecture", &arch);
    if (st != KS_OK) return KS_FAIL(KS_ERR_FORMAT, "general.architecture is missing or not a string");
    size_t n = arch.len < sizeof hp->arch_name - 1 ? (size_t)arch.len : sizeof hp->arch_name - 1;
    memcpy(hp->arch_name, arch.data, n);
    hp->arch_name[n] = 0;
    const ks_arch_desc *desc = ks_arch_find(hp->arch_name);
    if (!desc)
        return KS_FAIL(KS_ERR_UNSUPPORTED, "architecture '%s' is not supported (%s)", hp->arch_name, ks_arch_names());
    hp->arch = desc->id;
    const char *a = hp->arch_name;
    uint32_t n_embd = 0, n_layer = 0, n_ff = 0, n_head = 0, n_head_kv = 0, head_dim = 0, n_rot = 0, n_ctx = 0;
    KS_TRY(ks_arch_key_u32(g, a, "embedding_length", &n_embd, true));
    KS_TRY(ks_arch_key_u32(g, a, "block_count", &n_layer, true));
    KS_TRY(ks_arch_key_u32(g, a, "feed_forward_length", &n_ff, true));
    KS_TRY(ks_arch_key_u32(g, a, "attention.head_count", &n_head, true));
    n_head_kv = n_head;
    KS_TRY(ks_arch_key_u32(g, a, "attention.head_count_kv", &n_head_kv, false));
    KS_TRY(ks_arch_key_u32(g, a, "context_length", &n_ctx, true));
    if (n_embd == 0 || n_embd > 65536 || n_layer == 0 || n_layer > 1024 || n_ff == 0 || n_ff > 1 << 20 ||
        n_head == 0 || n_head > 1024 || n_head_kv == 0 || n_head % n_head_kv != 0 || n_ctx == 0)
        return KS_FAIL(KS_ERR_FORMAT,
                       "implausible hyper-parameters: n_embd %u, n_layer %u, n_ff %u, n_head %u, n_head_kv %u, ctx %u",
                       n_embd, n_layer, n_ff, n_head, n_head_kv, n_ctx);
    head_dim = n_embd / n_head;
    KS_TRY(ks_arch_key_u32(g, a, "attention.key_length", &head_dim, false));
    uint32_t v_dim = head_dim;
    KS_TRY(ks_arch_key_u32(g, a, "attention.value_length", &v_dim, false));
    /* latent attention states the latent head's key (latent + rope key) and
     * value (latent) lengths; its arch file checks them */
    char mla_key[96];
    snprintf(mla_key, sizeof mla_key, "%s.attention.kv_lora_rank", a);
    bool mla = ks_gguf_find_kv(g, mla_key) != NULL;
    if (v_dim != head_dim && !mla)
        return KS_FAIL(KS_ERR_UNSUPPORTED, "key length %u != value length %u", head_dim, v_dim);
    if (head_dim == 0 || head_dim > 1024 || head_dim % 2)
        return KS_FAIL(KS_ERR_FORMAT, "head dimension %u is not an even number in [2, 1024]", head_dim);
    n_rot = head_dim;
    KS_TRY(ks_arch_key_u32(g, a, "rope.dimension_count", &n_rot, false));
    if (n_rot == 0 || n_rot > head_dim || n_rot % 2)
        return KS_FAIL(KS_ERR_FORMAT, "rope dimension %u must be even and <= head dim %u", n_rot, head_dim);
    hp->n_embd = (int32_t)n_embd;
    hp->n_layer = (int32_t)n_layer;
    hp->n_ff = (int32_t)n_ff;
    hp->n_head = (int32_t)n_head;
    hp->n_head_kv = (int32_t)n_head_kv;
    hp->head_dim = (int32_t)head_dim;
    hp->n_rot = (int32_t)n_rot;
    hp->n_ctx_train = n_ctx > INT32_MAX ? INT32_MAX : (int32_t)n_ctx;
    hp->rope_base = 10000.0f;
    hp->rms_eps = 1e-5f;
    KS_TRY(ks_arch_key_f32(g, a, "rope.freq_base", &hp->rope_base));
    KS_TRY(ks_arch_key_f32(g, a, "attention.layer_norm_rms_epsilon", &hp->rms_eps));
    if (!(hp->rope_base > 0) || !(hp->rms_eps > 0) || !isfinite(hp->rope_base))
        return KS_FAIL(KS_ERR_FORMAT, "rope base %g / rms epsilon %g must be positive", hp->rope_base, hp->rms_eps);
    KS_TRY(read_rope_scaling(g, a, hp));
    hp->rope_neox = desc->rope_neox;
    if (desc->read_hparams) KS_TRY(desc->read_hparams(g, hp));
    *desc_out = desc;
    return KS_OK;
}

/* Binds a 2-D weight and checks its shape ([rows][cols] = ne[1], ne[0]). */
ks_status ks_model_bind_stacked(ks_model *m, const char *name, const char *what, int64_t rows, int64_t cols, int64_t n,
                                ks_weight *views) {
    const ks_gguf_tensor *t = ks_gguf_find_tensor(m->gguf, name);
    if (!t) return KS_FAIL(KS_ERR_FORMAT, "%s '%s' is missing", what, name);
    if (t->n_dims != 3 || t->ne[0] != cols || t->ne[1] != rows || t->ne[2] != n)
        return KS_FAIL(KS_ERR_FORMAT, "%s '%s' has shape [%lld, %lld, %lld] in %u dims, expected [%lld, %lld, %lld]",
                       what, name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], t->n_dims,
                       (long long)cols, (long long)rows, (long long)n);
    if (!ks_dtype_is_weight_type((uint32_t)t->type) || ks_dtype_block_size(t->type) <= 0 ||
        cols % ks_dtype_block_size(t->type) != 0)
        return KS_FAIL(KS_ERR_UNSUPPORTED, "%s '%s' has type %s, which a stacked matrix cannot use", what, name,
                       ks_dtype_name(t->type));
    const size_t slice = ks_dtype_row_bytes(t->type, cols) * (size_t)rows;
    for (int64_t e = 0; e < n; e++)
        views[e] = (ks_weight){.type = t->type, .rows = rows, .cols = cols,
                               .data = (const uint8_t *)t->data + (size_t)e * slice};
    m->weight_bytes += t->nbytes;
    m->n_params += rows * cols * n;
    return KS_OK;
}

ks_status ks_model_bind_weight(ks_model *m, const char *name, int64_t rows, int64_t cols, ks_weight *w) {
    const ks_gguf_tensor *t = ks_gguf_find_tensor(m->gguf, name);
    if (!t) return KS_FAIL(KS_ERR_FORMAT, "tensor '%s' is missing", name);
    if (t->n_dims > 2 || t->ne[0] != cols || t->ne[1] != rows)
        return KS_FAIL(KS_ERR_FORMAT, "tensor '%s' has shape [%lld, %lld], expected [%lld, %lld]", name,
                       (long long)t->ne[0], (long long)t->ne[1], (long long)cols, (long long)rows);
    w->type = t->type;
    w->rows = rows;
    w->cols = cols;
    w->data = t->data;
    m->weight_bytes += t->nbytes;
    m->n_params += rows * cols;
    return KS_OK;
}

/* Rows [row0, row0 + rows) of the 2-D tensor `name` ([total_rows][cols]) as
 * a weight of their own: a view into the file, no copy.  Fused tensors
 * (attn_qkv, phi3's gate+up ffn_up) are stored row-major with whole rows
 * contiguous for every weight type (a quantized row is a run of blocks), so
 * a row range is itself a valid matrix of that type; the repacker copies
 * or packs each view within its own bytes. */
ks_status ks_model_bind_rows(ks_model *m, const char *name, int64_t total_rows, int64_t row0, int64_t rows,
                             int64_t cols, ks_weight *w) {
    const ks_gguf_tensor *t = ks_gguf_find_tensor(m->gguf, name);
    if (!t) return KS_FAIL(KS_ERR_FORMAT, "tensor '%s' is missing", name);
    if (t->n_dims > 2 || t->ne[0] != cols || t->ne[1] != total_rows)
        return KS_FAIL(KS_ERR_FORMAT, "tensor '%s' has shape [%lld, %lld], expected [%lld, %lld]", name,
                       (long long)t->ne[0], (long long)t->ne[1], (long long)cols, (long long)total_rows);
    KS_ASSERT(row0 >= 0 && rows > 0 && row0 + rows <= total_rows);
    size_t row_bytes = ks_dtype_row_bytes(t->type, cols);
    w->type = t->type;
    w->rows = rows;
    w->cols = cols;
    w->data = (const uint8_t *)t->data + (size_t)row0 * row_bytes;
    m->weight_bytes += row_bytes * (size_t)rows;
    m->n_params += rows * cols;
    return KS_OK;
}

/* Loads a 1-D tensor of n elements as an owned f32 array; NULL if optional and absent. */
ks_status ks_model_bind_vec(ks_model *m, const char *name, int64_t n, bool required, float **out) {
    const ks_gguf_tensor *t = ks_gguf_find_tensor(m->gguf, name);
    if (!t) {
        if (required) return KS_FAIL(KS_ERR_FORMAT, "tensor '%s' is missing", name);
        *out = NULL;
        return KS_OK;
    }
    if (t->n_dims != 1 || t->ne[0] != n)
        return KS_FAIL(KS_ERR_FORMAT, "tensor '%s' has %lld elements in %u dims, expected a vector of %lld", name,
                       (long long)t->ne[0], t->n_dims, (long long)n);
    float *v = ks_malloc((size_t)n * sizeof(float));
    if (!v) return KS_FAIL(KS_ERR_NOMEM, "tensor '%s' of %lld floats", name, (long long)n);
    ks_dequantize_row(t->type, t->data, v, n);
    *out = v;
    m->weight_bytes += t->nbytes;
    m->n_params += n;
    return KS_OK;
}

static ks_status bind_weights(ks_model *m, const ks_arch_desc *desc) {
    const ks_hparams *hp = &m->hp;
    const ks_gguf_tensor *emb = ks_gguf_find_tensor(m->gguf, "token_embd.weight");
    if (!emb) return KS_FAIL(KS_ERR_FORMAT, "tensor 'token_embd.weight' is missing");
    if (emb->ne[1] != m->hp.n_vocab)
        return KS_FAIL(KS_ERR_FORMAT, "token_embd.weight has %lld rows but the vocabulary has %d tokens",
                       (long long)emb->ne[1], m->hp.n_vocab);
    KS_TRY(ks_model_bind_weight(m, "token_embd.weight", hp->n_vocab, hp->n_embd, &m->tok_embd));
    KS_TRY(ks_model_bind_vec(m, "output_norm.weight", hp->n_embd, true, &m->output_norm));
    if (ks_gguf_find_tensor(m->gguf, "output.weight")) {
        KS_TRY(ks_model_bind_weight(m, "output.weight", hp->n_vocab, hp->n_embd, &m->output));
    } else {
        m->output = m->tok_embd;
        m->output_tied = true;
    }
    KS_TRY(ks_model_bind_vec(m, "rope_freqs.weight", hp->n_rot / 2, false, &m->rope_freq_factors));
    if (m->rope_freq_factors)
        for (int i = 0; i < hp->n_rot / 2; i++)
            if (!(m->rope_freq_factors[i] > 0) || !isfinite(m->rope_freq_factors[i]))
                return KS_FAIL(KS_ERR_FORMAT, "rope_freqs.weight[%d] = %g is not a positive factor", i,
                               m->rope_freq_factors[i]);
    /* LongRoPE (phi3 and others): present or not, whatever the type key
     * says, as llama.cpp binds them as optional tensors */
    KS_TRY(ks_model_bind_vec(m, "rope_factors_short.weight", hp->n_rot / 2, false, &m->rope_factors_short));
    KS_TRY(ks_model_bind_vec(m, "rope_factors_long.weight", hp->n_rot / 2, false, &m->rope_factors_long));
    for (int k = 0; k < 2; k++) {
        const float *f = k ? m->rope_factors_long : m->rope_factors_short;
        for (int i = 0; f && i < hp->n_rot / 2; i++)
            if (!(f[i] > 0) || !isfinite(f[i]))
                return KS_FAIL(KS_ERR_FORMAT, "rope_factors_%s.weight[%d] = %g is not a positive factor",
                               k ? "long" : "short", i, f[i]);
    }
    if (desc->bind_model) KS_TRY(desc->bind_model(m));
    m->layers = ks_calloc((size_t)hp->n_layer, sizeof(ks_layer));
    if (!m->layers) return KS_FAIL(KS_ERR_NOMEM, "%d layers", hp->n_layer);
    for (int il = 0; il < hp->n_layer; il++) KS_TRY(desc->bind_layer(m, il, &m->layers[il]));
    return KS_OK;
}

void ks_model_destroy(ks_model *m) {
    if (!m) return;
    free(m->packed);
    for (int il = 0; m->layers && il < m->hp.n_layer; il++) {
        ks_layer *L = &m->layers[il];
        ks_free(L->attn_norm);
        ks_free(L->bq);
        ks_free(L->bk);
        ks_free(L->bv);
        ks_free(L->q_norm);
        ks_free(L->k_norm);
        ks_free(L->ffn_norm);
        ks_free(L->attn_post_norm);
        ks_free(L->ffn_post_norm);
        ks_free(L->bo);
        ks_free(L->attn_sinks);
        if (L->moe) ks_free(L->moe->bias_mem);
        ks_free(L->moe);
        if (L->mla) {
            ks_free(L->mla->q_a_norm);
            ks_free(L->mla->kv_a_norm);
            ks_free(L->mla->k_b_owned);
            ks_free(L->mla);
        }
    }
    ks_free(m->layers);
    ks_free(m->output_norm);
    ks_free(m->rope_freq_factors);
    ks_free(m->rope_factors_short);
    ks_free(m->rope_factors_long);
    ks_tokenizer_destroy(m->tok);
    ks_gguf_close(m->gguf);
    ks_free(m);
}

/* Repack the layer matrices that have a packed layout (ks_matmul_pack:
 * Q8_0 and Q4_0 for the AVX-512 prefill GEMM, Q4_K in eight-row groups for
 * AVX2 and AVX-512 decode and prefill, Q5_K, Q6_K and IQ4_XS likewise at
 * AVX-512), without doubling resident memory.
 * Read into memory (--no-mmap), the buffer is ours: they are repacked in
 * place.  From a mapped file they are copied into one huge-page buffer
 * (ks_alloc_streamed) and repacked there, and the file's pages under them
 * are dropped from the process (MADV_DONTNEED; they are never touched
 * again), so the packed copy replaces them rather than adding to them.
 * Huge pages matter for decode, which streams these bytes once per step:
 * copy-on-write pages of the mapping, repacked in place, are scattered 4 KiB
 * pages and decoded measurably slower than the file's page cache did.  If
 * the buffer cannot be had, the file layout stays (products are the same
 * bits either way for the 4-row panels; the transposed Q8_0 panels round
 * activations to power-of-two scales, matmul_x86_panel.c, so their products
 * differ from the file layout's by that rounding; the AVX-512 K-quant groups
 * have the AVX2 level's float order, not the file layout's zmm kernels'). */
static ks_status repack_list(ks_model *m, ks_weight **ws, size_t n, size_t total, bool mapped);

static bool is_group_expert_type(ks_dtype t) {
    return t == KS_DTYPE_Q4_K || t == KS_DTYPE_Q5_K || t == KS_DTYPE_Q6_K || t == KS_DTYPE_IQ4_XS;
}

/* Whether the K-quant / IQ4_XS experts join the repack (ks_expert_pack).
 * Their eight-row groups serve the single-token expert path as well as the
 * grouped prefill (moe.c slices them at multiples of 8 rows), so the only
 * cost is memory: from a mapped file the experts are most of the model's
 * bytes, and a copy that crowded out the page cache and the KV would undo
 * what mapping them buys (a 30B-A3B file in 24 GB).  Half of what the OS
 * could give now leaves the other half to the KV, the page cache of what
 * stays mapped, and other processes. */
static bool pack_group_experts(ks_expert_pack mode, bool mapped, size_t expert_bytes, size_t other_bytes) {
    if (mode == KS_EXPERT_PACK_ON) return true;
    if (mode == KS_EXPERT_PACK_OFF) return false;
    if (!mapped) return true; /* in place: no second copy */
    const size_t avail = ks_platform_mem_available();
    return avail && expert_bytes + other_bytes <= avail / 2;
}

static ks_status repack_weights(ks_model *m, bool mapped, ks_expert_pack mode) {
    /* the layer matrices, and in MoE layers every expert's three (each view
     * packs on its own: a product never spans two experts) */
    const size_t cap = (size_t)m->hp.n_layer * (13 + 3 * (size_t)m->hp.n_expert);
    ks_weight **ws = ks_malloc(cap * sizeof *ws);
    if (!ws) return KS_OK; /* keep the file layout */
    size_t n = 0, total = 0, n_group = 0, group_total = 0;
    /* two passes: the matrices always packed, then the group-type experts,
     * kept apart so they can be left out as a whole */
    for (int pass = 0; pass < 2; pass++)
        for (int il = 0; il < m->hp.n_layer; il++) {
            ks_layer *L = &m->layers[il];
            ks_moe_layer *E = L->moe;
            ks_mla_layer *A = L->mla;
            ks_weight none = {0}; /* data NULL: never packed */
            ks_weight *lw[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down,
                               E ? &E->sh_gate : &none, E ? &E->sh_up : &none, E ? &E->sh_down : &none,
                               A ? &A->wq_a : &none, A ? &A->wq_b : &none, A ? &A->wkv_a : &none};
            for (size_t i = 0; pass == 0 && i < sizeof lw / sizeof lw[0]; i++)
                if (lw[i]->data && ks_matmul_can_pack(lw[i])) {
                    ws[n++] = lw[i];
                    total += (ks_weight_bytes(lw[i]) + 63) & ~(size_t)63;
                }
            for (int e = 0; L->moe && e < m->hp.n_expert; e++) {
                ks_weight *ew[] = {&L->moe->gate[e], &L->moe->up[e], &L->moe->down[e]};
                for (size_t i = 0; i < 3; i++) {
                    if (!ks_matmul_can_pack(ew[i]) || is_group_expert_type(ew[i]->type) != (pass == 1)) continue;
                    const size_t b = (ks_weight_bytes(ew[i]) + 63) & ~(size_t)63;
                    ws[n++] = ew[i];
                    if (pass == 1) n_group++, group_total += b;
                    else total += b;
                }
            }
        }
    if (n_group && !pack_group_experts(mode, mapped, group_total, total)) n -= n_group, n_group = 0, group_total = 0;
    ks_status st = repack_list(m, ws, n, total + group_total, mapped);
    /* no buffer for a mapped file's copy leaves every matrix in the file layout */
    if (st == KS_OK && n_group && ws[n - 1]->layout != KS_WEIGHT_ROWS) m->packed_expert_bytes = group_total;
    ks_free(ws);
    return st;
}

static ks_status repack_list(ks_model *m, ks_weight **ws, size_t n, size_t total, bool mapped) {
    if (!n) return KS_OK;
    if (!mapped) {
        for (size_t i = 0; i < n; i++) KS_TRY(ks_matmul_pack(ws[i]));
        return KS_OK;
    }
    uint8_t *buf = ks_alloc_streamed(total);
    if (!buf) return KS_OK; /* keep the file layout */
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    size_t off = 0;
    m->packed = buf; /* owned from here, whatever happens below */
    for (size_t i = 0; i < n; i++) {
        const size_t bytes = ks_weight_bytes(ws[i]);
        const uint8_t *src = ws[i]->data;
        memcpy(buf + off, src, bytes);
        ws[i]->data = buf + off;
        KS_TRY(ks_matmul_pack(ws[i])); /* a refusal leaves this copy in the file layout */
        uintptr_t a = ((uintptr_t)src + page - 1) & ~(page - 1), e = ((uintptr_t)src + bytes) & ~(page - 1);
        if (e > a) madvise((void *)a, e - a, MADV_DONTNEED); /* pages wholly inside this tensor */
        off += (bytes + 63) & ~(size_t)63;
    }
    return KS_OK;
}

ks_status ks_model_load(const char *path, ks_model_params params, ks_model **out) {
    if (!path || !out) return KS_FAIL(KS_ERR_INVALID_ARG, "NULL path or out");
    ks_model *m = ks_calloc(1, sizeof *m);
    if (!m) return KS_FAIL(KS_ERR_NOMEM, "model");
    m->vocab_only = params.vocab_only;
    ks_status st = ks_gguf_open_ex(path, params.use_mmap, &m->gguf);
    if (st != KS_OK) {
        ks_free(m);
        return st;
    }
    st = ks_tokenizer_create(m->gguf, &m->tok);
    if (st == KS_OK) m->hp.n_vocab = ks_tokenizer_n_vocab(m->tok);
    const ks_arch_desc *desc = NULL;
    if (st == KS_OK && !params.vocab_only) st = read_hparams(m->gguf, &m->hp, &desc);
    if (st == KS_OK && !params.vocab_only) st = bind_weights(m, desc);
    if (st == KS_OK && !params.vocab_only && !params.no_repack) st = repack_weights(m, params.use_mmap, params.expert_pack);
    if (st != KS_OK) {
        ks_model_destroy(m);
        return st;
    }
    if (params.vocab_only) m->hp.arch = KS_ARCH_NONE;
    *out = m;
    return KS_OK;
}

/* The <arch>.* keys some loader slot reads (model.c and the arch files):
 * kvsieve info marks the others as ignored, so a user sees at once which
 * stated features (a sliding window, an unread YaRN key) have no effect. */
static const char *const g_keys_read[] = {
    "embedding_length", "block_count", "feed_forward_length", "attention.head_count", "attention.head_count_kv",
    "context_length", "attention.key_length", "attention.value_length", "rope.dimension_count", "rope.freq_base",
    "attention.layer_norm_rms_epsilon", "rope.scaling.type", "rope.scaling.factor", "rope.scale_linear",
    "rope.scaling.original_context_length", "rope.scaling.attn_factor", "rope.scaling.yarn_ext_factor",
    "rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow", "rope.scaling.yarn_log_multiplier",
    "attention.temperature_scale",
    /* deepseek2 (arch_deepseek2.c) */
    "attention.kv_lora_rank", "attention.q_lora_rank", "attention.key_length_mla", "attention.value_length_mla",
    "leading_dense_block_count", "expert_count", "expert_used_count", "expert_feed_forward_length",
    "expert_shared_count", "expert_weights_scale", "expert_weights_norm", "expert_gating_func",
    "expert_group_count", "expert_group_used_count",
};

/* Keys only some architectures' slots read: "key", then the '|'-separated
 * architectures (phi3 files carry a sliding_window nothing reads). */
static const char *const g_keys_read_by[][2] = {
    {"expert_count", "qwen3moe|gpt-oss"},
    {"expert_used_count", "qwen3moe|gpt-oss"},
    {"expert_feed_forward_length", "qwen3moe|gpt-oss"},
    {"attention.sliding_window", "gemma3|gpt-oss"},
    {"attention.sliding_window_pattern", "gemma3|gpt-oss"},
    {"rope.freq_base_swa", "gemma3|gpt-oss"},
};

static bool arch_in_list(const char *arch, const char *list) {
    size_t al = strlen(arch);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, '|');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n == al && !memcmp(p, arch, al)) return true;
        if (!e) break;
        p = e + 1;
    }
    return false;
}

bool ks_model_key_read(const char *arch, const char *key, size_t len) {
    size_t al = strlen(arch);
    if (len <= al + 1 || memcmp(key, arch, al) != 0 || key[al] != '.') return true; /* not an <arch>.* key */
    if (!ks_arch_find(arch)) return false;
    const char *suf = key + al + 1;
    size_t sl = len - al - 1;
    if (strcmp(arch, "mistral3") != 0 && sl == strlen("attention.temperature_scale") &&
        !memcmp(suf, "attention.temperature_scale", sl))
        return false; /* only mistral3 reads it */
    for (size_t i = 0; i < sizeof g_keys_read / sizeof g_keys_read[0]; i++)
        if (strlen(g_keys_read[i]) == sl && !memcmp(suf, g_keys_read[i], sl)) return true;
    for (size_t i = 0; i < sizeof g_keys_read_by / sizeof g_keys_read_by[0]; i++)
        if (strlen(g_keys_read_by[i][0]) == sl && !memcmp(suf, g_keys_read_by[i][0], sl))
            return arch_in_list(arch, g_keys_read_by[i][1]);
    return false;
}

ks_status ks_model_rope_freqs(const ks_model *m, int32_t n_ctx, double *inv_freq, float *mscale) {
    const ks_hparams *hp = &m->hp;
    /* llama_model::get_rope_factors: rope_freqs first, then long or short */
    const float *ff = m->rope_freq_factors;
    if (!ff) ff = n_ctx > hp->rope_scaling.orig_max_pos ? m->rope_factors_long : m->rope_factors_short;
    return ks_rope_gguf_inv_freq(hp->n_rot, hp->rope_base, &hp->rope_scaling, ff, inv_freq, mscale);
}

int32_t ks_model_n_vocab(const ks_model *m) { return m->hp.n_vocab; }
int32_t ks_model_n_ctx_train(const ks_model *m) { return m->hp.n_ctx_train; }

ks_status ks_model_describe(const ks_model *m, char *buf, size_t cap) {
    size_t n = 0;
#define OUT(...) do { int k_ = snprintf(buf + n, n < cap ? cap - n : 0, __VA_ARGS__); if (k_ > 0) n += (size_t)k_; } while (0)
    const ks_hparams *hp = &m->hp;
    ks_gguf_str s;
    OUT("file:          GGUF v%u, %zu bytes, %lld tensors, %lld metadata keys\n", ks_gguf_version(m->gguf),
        ks_gguf_file_size(m->gguf), (long long)ks_gguf_n_tensors(m->gguf), (long long)ks_gguf_n_kv(m->gguf));
    if (ks_gguf_get_str(m->gguf, "general.name", &s) == KS_OK) OUT("name:          %.*s\n", (int)s.len, s.data);
    if (ks_gguf_get_str(m->gguf, "tokenizer.ggml.model", &s) == KS_OK)
        OUT("tokenizer:     %.*s, %d tokens, chat template: %s\n", (int)s.len, s.data, hp->n_vocab,
            ks_chat_family_name(ks_tokenizer_chat_family(m->tok)));
    if (m->vocab_only) {
        OUT("weights:       none (vocabulary-only file)\n");
        return n < cap ? KS_OK : KS_FAIL(KS_ERR_INVALID_ARG, "buffer too small");
    }
    OUT("architecture:  %s (RoPE %s%s%s%s)\n", hp->arch_name, hp->rope_neox ? "neox" : "normal",
        m->rope_freq_factors ? ", llama3 frequency factors" : "",
        m->output_tied ? ", tied output" : "",
        m->layers[0].q_norm ? ", q/k norm" : m->layers[0].bq ? ", qkv bias" : "");
    if (m->layers[0].attn_sinks) /* gpt-oss */
        OUT("attention:     a learned sink logit per head in every softmax, output bias%s\n",
            hp->ffn_swiglu_oai ? "; experts: clamped SwiGLU (alpha 1.702, limit 7), weights softmax(top-k logits)" : "");
    const char *attn = hp->n_head_kv == hp->n_head ? "MHA" : hp->n_head_kv == 1 ? "MQA" : "GQA";
    OUT("shape:         n_embd %d, n_layer %d, n_ff %d, heads %d/%d kv (%s, group %d), head_dim %d, n_rot %d\n",
        hp->n_embd, hp->n_layer, hp->n_ff, hp->n_head, hp->n_head_kv, attn, hp->n_head / hp->n_head_kv,
        hp->head_dim, hp->n_rot);
    if (hp->kv_lora_rank > 0)
        OUT("latent attn:   one latent head of %d + %d rope dims stored per token; q%s, qk_nope %d, v_head %d a head; "
            "scale x %.4g; %d leading dense layer(s), %d shared expert(s)\n",
            hp->kv_lora_rank, hp->n_rot, hp->q_lora_rank > 0 ? " low rank" : " full", hp->qk_nope, hp->v_head_mla,
            hp->mla_q_scale, hp->n_dense_lead, hp->n_expert_shared);
    OUT("context:       %d trained, rope base %g, rms eps %g\n", hp->n_ctx_train, hp->rope_base, hp->rms_eps);
    const ks_rope_scaling *sc = &hp->rope_scaling;
    OUT("rope scaling:  %s", ks_rope_scaling_name(sc->type));
    if (sc->type == KS_ROPE_SCALING_LINEAR || sc->type == KS_ROPE_SCALING_YARN ||
        (sc->type == KS_ROPE_SCALING_LONGROPE && sc->factor > 0))
        OUT(", factor %g", sc->factor);
    if (sc->type == KS_ROPE_SCALING_YARN || m->rope_factors_long || m->rope_factors_short || hp->attn_temp_scale > 0)
        OUT(", original context %d", sc->orig_max_pos);
    if (sc->type == KS_ROPE_SCALING_YARN)
        OUT(", beta fast/slow %g/%g%s", sc->beta_fast, sc->beta_slow, sc->log_mul != 0 ? ", log multiplier" : "");
    if (sc->attention_factor != 1.0f) OUT(", attn factor %g", sc->attention_factor);
    if (m->rope_factors_short || m->rope_factors_long)
        OUT(", LongRoPE factors%s%s (long above the original context)", m->rope_factors_short ? " short" : "",
            m->rope_factors_long ? " long" : "");
    if (m->rope_freq_factors) OUT(", rope_freqs.weight divisors");
    if (hp->rope_skip_every > 0) OUT(", no RoPE on every %d-th layer", hp->rope_skip_every);
    if (hp->attn_temp_scale > 0) OUT(", attention temperature %g per %d positions", hp->attn_temp_scale, hp->attn_temp_floor);
    OUT("\n");
    int32_t n_local = 0;
    for (int il = 0; il < hp->n_layer; il++) n_local += m->layers[il].window > 0;
    if (n_local)
        OUT("layers:        %d local (sliding window %d, rope base %g), %d global (rope base %g%s)\n", n_local,
            hp->n_swa, hp->rope_base_swa > 0 ? hp->rope_base_swa : hp->rope_base, hp->n_layer - n_local, hp->rope_base,
            hp->rope_scaling.type == KS_ROPE_SCALING_LINEAR ? ", linear scaling" : "");
    /* type histogram over the tensors */
    int64_t count[KS_DTYPE_MAX_] = {0};
    size_t bytes[KS_DTYPE_MAX_] = {0};
    for (int64_t i = 0; i < ks_gguf_n_tensors(m->gguf); i++) {
        const ks_gguf_tensor *t = ks_gguf_tensor_at(m->gguf, i);
        count[t->type]++;
        bytes[t->type] += t->nbytes;
    }
    OUT("types:        ");
    for (int t = 0; t < KS_DTYPE_MAX_; t++)
        if (count[t]) OUT(" %s x%lld (%.1f MiB)", ks_dtype_name((ks_dtype)t), (long long)count[t], bytes[t] / 1048576.0);
    OUT("\n");
    OUT("parameters:    %.3f M (%.1f MiB of weights)\n", m->n_params / 1e6, m->weight_bytes / 1048576.0);
    /* K+V, f16, one layer; a latent entry is its K row alone (infer/mla.c) */
    double kv_layer_tok = (hp->kv_lora_rank > 0 ? 1.0 : 2.0) * hp->n_head_kv * hp->head_dim * 2;
    double kv_tok = kv_layer_tok * (hp->n_layer - n_local);           /* global layers grow with the context */
    double kv_local = kv_layer_tok * n_local * (hp->n_ctx_train < hp->n_swa ? hp->n_ctx_train : hp->n_swa);
    OUT("memory:        KV f16 %.1f KiB/token; at %d tokens %.1f MiB KV + %.1f MiB weights\n", kv_tok / 1024,
        hp->n_ctx_train, (kv_tok * hp->n_ctx_train + kv_local) / 1048576.0, m->weight_bytes / 1048576.0);
    if (n_local)
        OUT("KV by layer:   global %d x %.1f MiB at %d tokens; local %d x %.1f MiB (window %d, any length)\n",
            hp->n_layer - n_local, kv_layer_tok * hp->n_ctx_train / 1048576.0, hp->n_ctx_train, n_local,
            kv_layer_tok * (hp->n_ctx_train < hp->n_swa ? hp->n_ctx_train : hp->n_swa) / 1048576.0, hp->n_swa);
    /* a step streams every matrix once; of the embedding table only one row,
     * unless it doubles as the (tied) output matrix */
    size_t step_bytes = m->weight_bytes - (m->output_tied ? 0 : ks_weight_bytes(&m->tok_embd));
    if (hp->n_expert) { /* of the experts a token reads only the n_expert_used its router picks */
        size_t all = 0, active = 0;
        for (int il = 0; il < hp->n_layer; il++)
            if (m->layers[il].moe) {
                all += m->layers[il].moe->expert_bytes * (size_t)hp->n_expert;
                active += m->layers[il].moe->expert_bytes * (size_t)hp->n_expert_used;
            }
        OUT("experts:       %d per layer, %d active per token, expert n_ff %d; %.1f of %.1f MiB of expert weights "
            "read per token\n", hp->n_expert, hp->n_expert_used, hp->n_ff_exp, active / 1048576.0, all / 1048576.0);
        if (m->packed_expert_bytes)
            OUT("expert pack:   %.1f MiB of K-quant experts repacked into eight-row groups%s\n",
                m->packed_expert_bytes / 1048576.0, m->packed ? " (a resident copy: the file is mapped)" : "");
        step_bytes -= all - active;
    }
    OUT("decode bytes:  %.1f MiB of weights read per step (output matrix included%s)\n", step_bytes / 1048576.0,
        hp->n_expert ? "; active experts of one token" : "");
#undef OUT
    return n < cap ? KS_OK : KS_FAIL(KS_ERR_INVALID_ARG, "buffer too small (%zu needed)", n + 1);
}

/* ---------------------------------------------- tokenizer pass-throughs -- */
ks_status ks_tokenize(const ks_model *m, const char *text, size_t len, bool add_bos, bool parse_special,
                      int32_t *ids, size_t cap, size_t *n_out) {
    return ks_tokenizer_encode(m->tok, text, len, add_bos, parse_special, ids, cap, n_out);
}
ks_status ks_token_to_piece(const ks_model *m, int32_t id, char *buf, size_t cap, size_t *n_out) {
    return ks_tokenizer_piece(m->tok, id, buf, cap, n_out);
}
int32_t ks_token_bos(const ks_model *m) { return ks_tokenizer_bos(m->tok); }
int32_t ks_token_eos(const ks_model *m) { return ks_tokenizer_eos(m->tok); }
bool ks_token_is_eog(const ks_model *m, int32_t id) { return ks_tokenizer_is_eog(m->tok, id); }
ks_status ks_chat_format(const ks_model *m, const char *system, const char *user, char *buf, size_t cap,
                         size_t *n_out) {
    return ks_tokenizer_chat_format(m->tok, system, user, buf, cap, n_out);
}
ks_status ks_chat_render(const ks_model *m, const ks_chat_message *msgs, size_t n_msgs, char *buf, size_t cap,
                         size_t *n_out) {
    if (!m) return KS_FAIL(KS_ERR_INVALID_ARG, "chat: NULL model");
    return ks_tokenizer_chat_render(m->tok, msgs, n_msgs, buf, cap, n_out);
}
ks_status ks_chat_render_tools(const ks_model *m, const ks_chat_message *msgs, size_t n_msgs, const char *tools,
                               char *buf, size_t cap, size_t *n_out) {
    if (!m) return KS_FAIL(KS_ERR_INVALID_ARG, "chat: NULL model");
    return ks_tokenizer_chat_render_tools(m->tok, msgs, n_msgs, tools, buf, cap, n_out);
}
ks_tool_syntax ks_chat_tool_syntax(const ks_model *m) { return m ? ks_tokenizer_tool_syntax(m->tok) : KS_TOOLS_GENERIC; }
