/*
 * eagle3.c — load EAGLE-3 draft checkpoints' tensors; the retrieval head's
 * Q/K.  The config and the conventions behind the tensor names, aux layers
 * and RoPE (with their sources) are eagle3_config.c's.
 *
 * Storage: a full load keeps the checkpoint open and views its bytes; a
 * head-only load copies the handful of head tensors into one arena and
 * closes the checkpoint, so the pruned model really holds only the pruned
 * tensors.
 */
#define _GNU_SOURCE
#include "draft/eagle3.h"

#include <math.h>
#include <string.h>

ks_eagle3_params ks_eagle3_default_params(void) {
    return (ks_eagle3_params){.head_only = false, .embed_only = false, .use_mmap = true};
}

/* --------------------------------------------------------------- tensors -- */

typedef struct {
    const ks_safetensors *st;
    const char *layer_prefix;
} loader;

/* name with an optional "model." prefix */
static const ks_st_tensor *find_any(const ks_safetensors *st, const char *name, char *used, size_t cap) {
    const ks_st_tensor *t = ks_safetensors_find(st, name);
    if (t) {
        snprintf(used, cap, "%s", name);
        return t;
    }
    snprintf(used, cap, "model.%s", name);
    t = ks_safetensors_find(st, used);
    if (!t) snprintf(used, cap, "%s", name);
    return t;
}

static const ks_st_tensor *find_role(const loader *L, bool in_layer, const char *suffix, char *used, size_t cap) {
    if (!in_layer) return find_any(L->st, suffix, used, cap);
    snprintf(used, cap, "%s%s", L->layer_prefix, suffix);
    return ks_safetensors_find(L->st, used);
}

static bool is_float_dtype(ks_st_dtype t) { return t == KS_ST_F32 || t == KS_ST_F16 || t == KS_ST_BF16; }

static ks_status get_mat(const loader *L, bool in_layer, const char *suffix, int64_t rows, int64_t cols, bool required,
                         ks_eagle3_mat *out) {
    char name[160];
    const ks_st_tensor *t = find_role(L, in_layer, suffix, name, sizeof name);
    memset(out, 0, sizeof *out);
    if (!t) return required ? KS_FAIL(KS_ERR_FORMAT, "EAGLE-3 checkpoint is missing tensor %s", name) : KS_OK;
    int64_t want[2] = {rows, cols};
    if (t->n_dims != 2 || t->shape[0] != rows || t->shape[1] != cols) {
        char a[160], b[160];
        return KS_FAIL(KS_ERR_FORMAT, "tensor %s has shape %s, expected %s", t->name, ks_st_shape_str(t->n_dims, t->shape, a, sizeof a),
                       ks_st_shape_str(2, want, b, sizeof b));
    }
    if (!is_float_dtype(t->dtype))
        return KS_FAIL(KS_ERR_UNSUPPORTED, "tensor %s has dtype %s (F32, F16 or BF16 expected)", t->name, ks_st_dtype_name(t->dtype));
    out->dtype = t->dtype;
    out->rows = rows;
    out->cols = cols;
    out->data = t->data;
    return KS_OK;
}

static ks_status get_vec(const loader *L, bool in_layer, const char *suffix, int64_t n, bool required, float **out) {
    char name[160];
    const ks_st_tensor *t = find_role(L, in_layer, suffix, name, sizeof name);
    *out = NULL;
    if (!t) return required ? KS_FAIL(KS_ERR_FORMAT, "EAGLE-3 checkpoint is missing tensor %s", name) : KS_OK;
    return ks_safetensors_to_f32(t, 1, &n, out);
}

static size_t mat_bytes(const ks_eagle3_mat *m) {
    return m->data ? (size_t)m->rows * (size_t)m->cols * ks_st_dtype_size(m->dtype) : 0;
}

static int64_t mat_elems(const ks_eagle3_mat *m) { return m->data ? m->rows * m->cols : 0; }

static const char *const k_layer_prefixes[] = {"midlayer.", "layers.0.", "model.midlayer.", "model.layers.0."};

static ks_status pick_layer_prefix(const ks_safetensors *st, char *out, size_t cap) {
    int found = -1;
    for (int i = 0; i < 4; i++) {
        char name[96];
        snprintf(name, sizeof name, "%sself_attn.q_proj.weight", k_layer_prefixes[i]);
        if (!ks_safetensors_find(st, name)) continue;
        if (found >= 0)
            return KS_FAIL(KS_ERR_FORMAT, "EAGLE-3 checkpoint has both %sself_attn.q_proj.weight and %sself_attn.q_proj.weight",
                           k_layer_prefixes[found], k_layer_prefixes[i]);
        found = i;
    }
    if (found < 0)
        return KS_FAIL(KS_ERR_FORMAT, "EAGLE-3 checkpoint is missing tensor midlayer.self_attn.q_proj.weight "
                                      "(also looked for layers.0.self_attn.q_proj.weight): not an EAGLE-3 draft model?");
    snprintf(out, cap, "%s", k_layer_prefixes[found]);
    return KS_OK;
}

static void free_vecs(ks_eagle3 *d) {
    for (int i = 0; i < 3; i++) ks_free(d->fc_norm[i]);
    ks_free(d->fc_bias); ks_free(d->hidden_norm); ks_free(d->input_norm);
    ks_free(d->q_norm); ks_free(d->k_norm); ks_free(d->post_norm); ks_free(d->norm);
    ks_free(d->d2t); ks_free(d->t2d); ks_free(d->inv_freq);
}

void ks_eagle3_destroy(ks_eagle3 *d) {
    if (!d) return;
    free_vecs(d);
    ks_free(d->arena);
    ks_safetensors_close(d->st);
    ks_free(d);
}

/* Copies the head matrices into one arena so the checkpoint can be closed. */
static ks_status copy_to_arena(ks_eagle3 *d) {
    ks_eagle3_mat *m[] = {&d->embed, &d->fc, &d->wq, &d->wk};
    size_t total = 0;
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++) total += (mat_bytes(m[i]) + 63) & ~(size_t)63;
    uint8_t *a = ks_malloc(total ? total : 1);
    if (!a) return KS_FAIL(KS_ERR_NOMEM, "draft head of %zu bytes", total);
    size_t off = 0;
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++) {
        size_t n = mat_bytes(m[i]);
        if (!n) continue;
        memcpy(a + off, m[i]->data, n);
        m[i]->data = a + off;
        off += (n + 63) & ~(size_t)63;
    }
    d->arena = a;
    return KS_OK;
}

/* d2t / t2d (EAGLE-3's map between the draft's and the target's
 * vocabularies), checked whenever present, also for a head-only load, which
 * does not use them: a draft whose maps are inconsistent was exported wrong,
 * and its fused states are then suspect too.  d2t[i] is an offset: draft
 * token i is target token i + d2t[i], inside the vocabulary and distinct;
 * t2d marks exactly those target tokens. */
static ks_status load_vocab_maps(ks_eagle3 *d, const ks_safetensors *st) {
    const ks_eagle3_config *c = &d->cfg;
    char name[64];
    const ks_st_tensor *t = find_any(st, "d2t", name, sizeof name), *u = find_any(st, "t2d", name, sizeof name);
    if (t && (t->dtype != KS_ST_I64 || t->n_dims != 1 || t->shape[0] != c->draft_vocab_size))
        return KS_FAIL(KS_ERR_FORMAT, "tensor %s must be I64 [%d] (draft_vocab_size; is %s with %d dims)", t->name,
                       c->draft_vocab_size, ks_st_dtype_name(t->dtype), t->n_dims);
    if (u && (u->dtype != KS_ST_BOOL || u->n_dims != 1 || u->shape[0] != c->vocab_size))
        return KS_FAIL(KS_ERR_FORMAT, "tensor %s must be BOOL [%d] (vocab_size; is %s with %d dims)", u->name, c->vocab_size,
                       ks_st_dtype_name(u->dtype), u->n_dims);
    if (!t && !u) return KS_OK;
    ks_status s = KS_OK;
    int64_t *d2t = NULL;
    uint8_t *t2d = NULL, *hit = NULL;
    if (t) {
        d2t = ks_malloc(sizeof(int64_t) * (size_t)t->n_elem + 1);
        hit = ks_calloc((size_t)c->vocab_size, 1);
        if (!d2t || !hit) s = KS_FAIL(KS_ERR_NOMEM, "tensor %s", t->name);
        else memcpy(d2t, t->data, t->nbytes);
        for (int64_t i = 0; i < t->n_elem && s == KS_OK; i++) {
            if (d2t[i] < -i || d2t[i] >= (int64_t)c->vocab_size - i)
                s = KS_FAIL(KS_ERR_FORMAT, "tensor %s: entry %lld maps draft token %lld outside the %d-token vocabulary", t->name,
                            (long long)i, (long long)i, c->vocab_size);
            else if (hit[i + d2t[i]]++)
                s = KS_FAIL(KS_ERR_FORMAT, "tensor %s: draft tokens map twice to target token %lld", t->name, (long long)(i + d2t[i]));
        }
    }
    if (u && s == KS_OK) {
        t2d = ks_malloc((size_t)u->n_elem + 1);
        if (!t2d) s = KS_FAIL(KS_ERR_NOMEM, "tensor %s", u->name);
        else memcpy(t2d, u->data, u->nbytes);
        int64_t n_true = 0;
        for (int64_t i = 0; i < u->n_elem && s == KS_OK; i++) {
            if (t2d[i] > 1) s = KS_FAIL(KS_ERR_FORMAT, "tensor %s: entry %lld is %u, not a bool", u->name, (long long)i, t2d[i]);
            else if (hit && t2d[i] != hit[i])
                s = KS_FAIL(KS_ERR_FORMAT, "tensors d2t and t2d disagree on target token %lld (t2d says %s)", (long long)i,
                            t2d[i] ? "in the draft vocabulary" : "not in it");
            n_true += t2d[i];
        }
        if (s == KS_OK && n_true != c->draft_vocab_size)
            s = KS_FAIL(KS_ERR_FORMAT, "tensor %s marks %lld target tokens, but draft_vocab_size is %d", u->name, (long long)n_true,
                        c->draft_vocab_size);
    }
    ks_free(hit);
    if (s != KS_OK || d->head_only) {
        ks_free(d2t);
        ks_free(t2d);
        return s;
    }
    d->d2t = d2t;
    d->t2d = t2d;
    return KS_OK;
}

static ks_status load_tensors(ks_eagle3 *d, const ks_safetensors *st) {
    const ks_eagle3_config *c = &d->cfg;
    KS_TRY(pick_layer_prefix(st, d->layer_prefix, sizeof d->layer_prefix));
    loader L = {st, d->layer_prefix};
    const int64_t H = c->hidden_size, TH = c->target_hidden_size, hd = c->head_dim;
    const int64_t qd = (int64_t)c->n_head * hd, kvd = (int64_t)c->n_head_kv * hd;
    KS_TRY(get_mat(&L, false, "embed_tokens.weight", c->vocab_size, H, false, &d->embed));
    d->has_embed = d->embed.data != NULL;
    if (!d->embed_only) {
        KS_TRY(get_mat(&L, false, "fc.weight", H, 3 * TH, true, &d->fc));
        KS_TRY(get_vec(&L, false, "fc.bias", H, false, &d->fc_bias));
        for (int i = 0; i < 3; i++) { /* SpecForge: a norm on each fused state before fc */
            char nm[32];
            snprintf(nm, sizeof nm, "fc_norm.%d.weight", i);
            KS_TRY(get_vec(&L, false, nm, TH, c->fc_norm, &d->fc_norm[i]));
        }
        if ((d->fc_norm[0] != NULL) != (d->fc_norm[1] != NULL) || (d->fc_norm[0] != NULL) != (d->fc_norm[2] != NULL))
            return KS_FAIL(KS_ERR_FORMAT, "EAGLE-3 checkpoint has some of fc_norm.{0,1,2}.weight but not all three");
        KS_TRY(get_vec(&L, true, "hidden_norm.weight", H, true, &d->hidden_norm));
    }
    KS_TRY(get_vec(&L, true, "input_layernorm.weight", H, true, &d->input_norm));
    KS_TRY(get_mat(&L, true, "self_attn.q_proj.weight", qd, 2 * H, true, &d->wq));
    KS_TRY(get_mat(&L, true, "self_attn.k_proj.weight", kvd, 2 * H, true, &d->wk));
    KS_TRY(get_vec(&L, true, "self_attn.q_norm.weight", hd, false, &d->q_norm));
    KS_TRY(get_vec(&L, true, "self_attn.k_norm.weight", hd, false, &d->k_norm));
    if (!d->head_only) {
        if (c->intermediate_size < 1) return KS_FAIL(KS_ERR_FORMAT, "config.json: missing \"intermediate_size\" (needed for a full load)");
        const int64_t I = c->intermediate_size;
        KS_TRY(get_mat(&L, true, "self_attn.v_proj.weight", kvd, 2 * H, true, &d->wv));
        KS_TRY(get_mat(&L, true, "self_attn.o_proj.weight", H, qd, true, &d->wo));
        KS_TRY(get_vec(&L, true, "post_attention_layernorm.weight", H, true, &d->post_norm));
        KS_TRY(get_mat(&L, true, "mlp.gate_proj.weight", I, H, true, &d->w_gate));
        KS_TRY(get_mat(&L, true, "mlp.up_proj.weight", I, H, true, &d->w_up));
        KS_TRY(get_mat(&L, true, "mlp.down_proj.weight", H, I, true, &d->w_down));
        KS_TRY(get_vec(&L, false, "norm.weight", H, true, &d->norm));
        KS_TRY(get_mat(&L, false, "lm_head.weight", c->draft_vocab_size, H, true, &d->lm_head));
    }
    KS_TRY(load_vocab_maps(d, st));
    /* parameter counts */
    for (int64_t i = 0; i < ks_safetensors_count(st); i++) {
        const ks_st_tensor *t = ks_safetensors_at(st, i);
        if (is_float_dtype(t->dtype) || t->dtype == KS_ST_F64) d->n_params_ckpt += t->n_elem;
    }
    d->n_params_embed = mat_elems(&d->embed);
    d->n_params_head = d->n_params_embed + mat_elems(&d->fc) + mat_elems(&d->wq) + mat_elems(&d->wk) + H /* input norm */ +
                       (d->fc_bias ? H : 0) + (d->fc_norm[0] ? 3 * TH : 0) + (d->hidden_norm ? H : 0) + (d->q_norm ? hd : 0) + (d->k_norm ? hd : 0);
    d->n_params_full = d->n_params_ckpt;
    return KS_OK;
}

ks_status ks_eagle3_load(const char *dir, ks_eagle3_params params, ks_eagle3 **out) {
    if (!dir) return KS_FAIL(KS_ERR_INVALID_ARG, "NULL checkpoint directory");
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    ks_eagle3 *d = ks_calloc(1, sizeof *d);
    if (!d) return KS_FAIL(KS_ERR_NOMEM, "draft model");
    d->head_only = params.head_only;
    d->embed_only = params.embed_only;
    ks_status s = ks_eagle3_read_config(path, &d->cfg);
    ks_safetensors *st = NULL;
    if (s == KS_OK) s = ks_safetensors_open(dir, params.use_mmap, &st);
    if (s == KS_OK) {
        s = load_tensors(d, st);
        if (s != KS_OK) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", ks_last_error());
            s = KS_FAIL(s, "'%s': %s", dir, msg);
        }
    }
    if (s == KS_OK) {
        d->inv_freq = ks_malloc(sizeof(float) * (size_t)(d->cfg.head_dim / 2));
        s = !d->inv_freq ? KS_FAIL(KS_ERR_NOMEM, "rope frequencies") : ks_rope_inv_freq(d->cfg.head_dim, d->cfg.rope_theta, &d->cfg.rope, d->inv_freq, &d->mscale);
    }
    if (s != KS_OK) {
        ks_safetensors_close(st);
        ks_eagle3_destroy(d);
        return s;
    }
    if (d->head_only) {
        s = copy_to_arena(d);
        ks_safetensors_close(st);
        if (s != KS_OK) {
            ks_eagle3_destroy(d);
            return s;
        }
    } else {
        d->st = st;
    }
    *out = d;
    return KS_OK;
}

/* --------------------------------------------------------------- forward -- */

void ks_eagle3_fc_norm(const ks_eagle3 *d, float *h3) {
    if (!d->fc_norm[0]) return;
    const int TH = d->cfg.target_hidden_size;
    for (int i = 0; i < 3; i++) ks_rmsnorm(h3 + (size_t)i * TH, h3 + (size_t)i * TH, d->fc_norm[i], TH, d->cfg.rms_eps);
}

ks_status ks_eagle3_mat_vec(const ks_eagle3_mat *w, const float *x, float *y) {
    KS_ASSERT(w->data);
    float *row = ks_malloc(sizeof(float) * (size_t)w->cols);
    if (!row) return KS_FAIL(KS_ERR_NOMEM, "row of %lld", (long long)w->cols);
    const size_t rb = (size_t)w->cols * ks_st_dtype_size(w->dtype);
    for (int64_t r = 0; r < w->rows; r++) {
        ks_st_convert_f32(w->dtype, (const uint8_t *)w->data + (size_t)r * rb, row, w->cols);
        double acc = 0;
        for (int64_t i = 0; i < w->cols; i++) acc += (double)row[i] * x[i];
        y[r] = (float)acc;
    }
    ks_free(row);
    return KS_OK;
}

ks_status ks_eagle3_head_qk(const ks_eagle3 *d, const float *h3, const float *emb, int32_t pos, float *q_out, float *k_out) {
    if (!emb || !q_out || !k_out) return KS_FAIL(KS_ERR_INVALID_ARG, "NULL embedding or output");
    if (!d->embed_only && !h3) return KS_FAIL(KS_ERR_INVALID_ARG, "NULL aux hidden states (load with embed_only for the embedding-only head)");
    if (pos < 0) return KS_FAIL(KS_ERR_INVALID_ARG, "negative position %d", pos);
    const ks_eagle3_config *c = &d->cfg;
    const int64_t H = c->hidden_size, hd = c->head_dim;
    float *x = ks_calloc((size_t)(2 * H), sizeof(float)); /* [2H] = [input_norm(e); hidden_norm(f)] */
    float *f = d->embed_only ? NULL : ks_malloc(sizeof(float) * (size_t)H); /* [H] fused aux states */
    float *hn = d->fc_norm[0] ? ks_malloc(sizeof(float) * 3 * (size_t)c->target_hidden_size) : NULL;
    float *cs = ks_malloc(sizeof(float) * (size_t)hd); /* [hd/2] cos, [hd/2] sin */
    ks_status s = !x || (!d->embed_only && !f) || (d->fc_norm[0] && !hn) || !cs
                      ? KS_FAIL(KS_ERR_NOMEM, "draft head buffers of hidden size %lld", (long long)H)
                      : KS_OK;
    if (s != KS_OK) {
        ks_free(x);
        ks_free(f);
        ks_free(hn);
        ks_free(cs);
        return s;
    }
    /* HF LlamaRMSNorm (w * x / sqrt(mean(x^2) + eps)) and rotate_half RoPE with
     * cos/sin scaled by mscale, as in HF: tensor/ops.h */
    ks_rmsnorm(x, emb, d->input_norm, (int)H, c->rms_eps);
    if (!d->embed_only) {
        if (d->fc_norm[0]) { /* SpecForge: each state normed before fc */
            memcpy(hn, h3, sizeof(float) * 3 * (size_t)c->target_hidden_size);
            ks_eagle3_fc_norm(d, hn);
            h3 = hn;
        }
        s = ks_eagle3_mat_vec(&d->fc, h3, f);
        if (d->fc_bias)
            for (int64_t i = 0; i < H; i++) f[i] += d->fc_bias[i];
        ks_rmsnorm(x + H, f, d->hidden_norm, (int)H, c->rms_eps);
    }
    if (s == KS_OK) s = ks_eagle3_mat_vec(&d->wq, x, q_out);
    if (s == KS_OK) s = ks_eagle3_mat_vec(&d->wk, x, k_out);
    ks_free(hn);
    ks_free(f);
    ks_free(x);
    if (s != KS_OK) {
        ks_free(cs);
        return s;
    }
    float *sn = cs + hd / 2;
    ks_rope_angles_freq(cs, sn, pos, (int)hd, d->inv_freq, d->mscale);
    for (int h = 0; h < c->n_head; h++) {
        float *q = q_out + (size_t)h * hd;
        if (d->q_norm) ks_rmsnorm(q, q, d->q_norm, (int)hd, c->rms_eps);
        ks_rope_apply(q, (int)hd, true, cs, sn);
    }
    for (int h = 0; h < c->n_head_kv; h++) {
        float *k = k_out + (size_t)h * hd;
        if (d->k_norm) ks_rmsnorm(k, k, d->k_norm, (int)hd, c->rms_eps);
        ks_rope_apply(k, (int)hd, true, cs, sn);
    }
    ks_free(cs);
    return KS_OK;
}

ks_status ks_eagle3_embed(const ks_eagle3 *d, int32_t token, float *out) {
    if (!d->has_embed) return KS_FAIL(KS_ERR_NOT_FOUND, "this EAGLE-3 checkpoint has no embed_tokens: use the target's embedding");
    if (token < 0 || token >= d->cfg.vocab_size)
        return KS_FAIL(KS_ERR_INVALID_ARG, "token %d outside the %d-token vocabulary", token, d->cfg.vocab_size);
    const size_t rb = (size_t)d->embed.cols * ks_st_dtype_size(d->embed.dtype);
    ks_st_convert_f32(d->embed.dtype, (const uint8_t *)d->embed.data + (size_t)token * rb, out, d->embed.cols);
    return KS_OK;
}
