/*
 * eagle3.c — load EAGLE-3 draft checkpoints; the retrieval head's Q/K.
 *
 * Where the conventions come from (read in public code, not copied):
 *  - Tensor names and the forward: SafeAILab/EAGLE eagle/model/cnets.py
 *    (class Model: embed_tokens, fc = Linear(3 * target_hidden_size, H,
 *    bias=False), midlayer = LlamaDecoderLayeremb, norm, lm_head [draft_vocab,
 *    H], buffers d2t [draft_vocab] (I64) and t2d [vocab] (BOOL)).  In
 *    LlamaDecoderLayeremb.forward the fused hidden state goes through
 *    hidden_norm, the embedding through input_layernorm, and the attention
 *    input is torch.cat((input_emb, hidden_states), dim=-1): embedding first.
 *    q_proj / k_proj are Linear(2H, heads * head_dim, bias=False).
 *  - "layers.0." naming: vllm-project/speculators
 *    research/eagle3/convert_checkpoint.py renames hidden_norm /
 *    input_layernorm to layers.0.*.
 *  - Aux layers: SafeAILab/EAGLE eagle/model/modeling_llama_kv.py appends
 *    hidden_states *before* running decoder layer idx when idx == 2,
 *    len(layers) // 2 or len(layers) - 3 (quoted in SafeAILab/EAGLE issue
 *    #308); vLLM's get_eagle3_aux_hidden_state_layers and SGLang's
 *    set_eagle3_layers_to_capture use the same (2, L // 2, L - 3).  So aux id
 *    i means the residual stream entering layer i (= output of layer i - 1),
 *    concatenated in ascending order [lo; mid; hi].
 *  - RoPE: cnets.py's rotate_half / apply_rotary_pos_emb (halves, "neox").
 *  - YaRN: HF transformers _compute_yarn_parameters (find_correction_dim,
 *    linear_ramp_factor, get_mscale = 0.1 ln(s) + 1, beta_fast 32,
 *    beta_slow 1); llama3: _compute_llama3_parameters.  The RoPE, scaling
 *    and RMSNorm code itself is shared with the forward pass: tensor/ops.c.
 *
 * Storage: a full load keeps the checkpoint open and views its bytes; a
 * head-only load copies the handful of head tensors into one arena and
 * closes the checkpoint, so the pruned model really holds only the pruned
 * tensors.
 */
#define _GNU_SOURCE
#include "model/eagle3.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>

ks_eagle3_params ks_eagle3_default_params(void) {
    return (ks_eagle3_params){.head_only = false, .embed_only = false, .use_mmap = true};
}

/* ---------------------------------------------------------------- config -- */

static ks_status read_text(const char *path, size_t cap, char **out, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return KS_FAIL(KS_ERR_IO, "cannot open '%s'", path);
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fclose(f);
        return KS_FAIL(KS_ERR_IO, "'%s' is not a regular file", path);
    }
    if ((size_t)sb.st_size > cap) {
        fclose(f);
        return KS_FAIL(KS_ERR_FORMAT, "'%s' is %lld bytes (at most %zu expected)", path, (long long)sb.st_size, cap);
    }
    size_t n = (size_t)sb.st_size;
    char *buf = ks_malloc(n + 1);
    if (!buf) {
        fclose(f);
        return KS_FAIL(KS_ERR_NOMEM, "reading '%s' (%zu bytes)", path, n);
    }
    size_t got = fread(buf, 1, n, f);
    fclose(f);
    if (got != n) {
        ks_free(buf);
        return KS_FAIL(KS_ERR_IO, "reading '%s' failed", path);
    }
    buf[n] = 0;
    *out = buf;
    *len = n;
    return KS_OK;
}

/* vllm-project/speculators configs ("Eagle3Speculator") nest the Llama
 * fields under "transformer_layer_config" and keep vocabulary sizes and aux
 * layer ids at the top level: keys are looked up in that object first, then
 * at the root. */
typedef struct {
    const cJSON *first, *second; /* second may be NULL */
} cfg_src;

static const cJSON *cfg_item(const cfg_src *src, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(src->first, key);
    if (!v && src->second) v = cJSON_GetObjectItemCaseSensitive(src->second, key);
    return v;
}

/* Integer config key in [lo, hi]; absent -> dflt (or an error when required). */
static ks_status cfg_int(const cfg_src *root, const char *key, bool required, int64_t dflt, int64_t lo, int64_t hi,
                         int32_t *out) {
    const cJSON *v = cfg_item(root, key);
    if (!v || cJSON_IsNull(v)) {
        if (required) return KS_FAIL(KS_ERR_FORMAT, "config.json: missing \"%s\"", key);
        *out = (int32_t)dflt;
        return KS_OK;
    }
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!(d == floor(d)) || d < (double)lo || d > (double)hi)
        return KS_FAIL(KS_ERR_FORMAT, "config.json: \"%s\" must be an integer in [%lld, %lld]", key, (long long)lo, (long long)hi);
    *out = (int32_t)d;
    return KS_OK;
}

static ks_status cfg_float(const cfg_src *root, const char *key, double dflt, double lo, double hi, float *out) {
    const cJSON *v = cfg_item(root, key);
    if (!v || cJSON_IsNull(v)) {
        *out = (float)dflt;
        return KS_OK;
    }
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!(d >= lo && d <= hi)) return KS_FAIL(KS_ERR_FORMAT, "config.json: \"%s\" must be a number in [%g, %g]", key, lo, hi);
    *out = (float)d;
    return KS_OK;
}

static ks_status parse_rope_scaling(const cJSON *rs, int32_t max_pos, ks_rope_scaling *out) {
    memset(out, 0, sizeof *out);
    out->type = KS_ROPE_SCALING_NONE;
    if (!rs || cJSON_IsNull(rs)) return KS_OK;
    if (!cJSON_IsObject(rs)) return KS_FAIL(KS_ERR_FORMAT, "config.json: \"rope_scaling\" must be an object or null");
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (!cJSON_IsString(t)) t = cJSON_GetObjectItemCaseSensitive(rs, "type");
    if (!cJSON_IsString(t)) return KS_FAIL(KS_ERR_FORMAT, "config.json: rope_scaling has no \"rope_type\"");
    const char *name = t->valuestring;
    *out = ks_rope_scaling_yarn(1.0f, max_pos);
    if (!strcmp(name, "default")) out->type = KS_ROPE_SCALING_NONE;
    else if (!strcmp(name, "linear")) out->type = KS_ROPE_SCALING_LINEAR;
    else if (!strcmp(name, "llama3")) out->type = KS_ROPE_SCALING_LLAMA3;
    else if (!strcmp(name, "yarn")) out->type = KS_ROPE_SCALING_YARN;
    else {
        char nb[48];
        snprintf(nb, sizeof nb, "%s", name);
        return KS_FAIL(KS_ERR_UNSUPPORTED, "config.json: rope_scaling type '%s' is not supported (default, linear, llama3, yarn)", nb);
    }
    if (out->type == KS_ROPE_SCALING_NONE) return KS_OK;
    const cfg_src src = {rs, NULL};
    KS_TRY(cfg_float(&src, "factor", 1.0, 1.0, 1e6, &out->factor));
    KS_TRY(cfg_int(&src, "original_max_position_embeddings", false, max_pos, 1, 1 << 24, &out->orig_max_pos));
    KS_TRY(cfg_float(&src, "beta_fast", 32.0, 1e-3, 1e6, &out->beta_fast));
    KS_TRY(cfg_float(&src, "beta_slow", 1.0, 1e-3, 1e6, &out->beta_slow));
    KS_TRY(cfg_float(&src, "attention_factor", 0.0, 0.0, 1e3, &out->attention_factor));
    KS_TRY(cfg_float(&src, "low_freq_factor", 1.0, 1e-6, 1e6, &out->low_freq_factor));
    KS_TRY(cfg_float(&src, "high_freq_factor", 4.0, 1e-6, 1e6, &out->high_freq_factor));
    return KS_OK;
}

static ks_status parse_aux_layers(const cJSON *v, ks_eagle3_config *c) {
    if (!v || cJSON_IsNull(v)) return KS_OK;
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 3)
        return KS_FAIL(KS_ERR_FORMAT, "config.json: \"eagle_aux_hidden_state_layer_ids\" must be an array of 3 layer ids");
    int i = 0;
    for (const cJSON *e = v->child; e; e = e->next, i++) {
        double d = cJSON_IsNumber(e) ? e->valuedouble : NAN;
        if (!(d == floor(d)) || d < 0 || d > 100000)
            return KS_FAIL(KS_ERR_FORMAT, "config.json: eagle_aux_hidden_state_layer_ids[%d] is not a layer index", i);
        c->aux_layers[i] = (int32_t)d;
    }
    c->aux_layers_set = true;
    return KS_OK;
}

static ks_status parse_config(const cJSON *json, ks_eagle3_config *c) {
    memset(c, 0, sizeof *c);
    if (!cJSON_IsObject(json)) return KS_FAIL(KS_ERR_FORMAT, "config.json is not a JSON object");
    const cJSON *nested = cJSON_GetObjectItemCaseSensitive(json, "transformer_layer_config");
    const cfg_src src = cJSON_IsObject(nested) && !cJSON_GetObjectItemCaseSensitive(json, "hidden_size")
                            ? (cfg_src){nested, json} : (cfg_src){json, NULL};
    const cfg_src *root = &src;
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(json, "architectures");
    if (cJSON_IsArray(arch) && cJSON_IsString(arch->child)) snprintf(c->arch, sizeof c->arch, "%s", arch->child->valuestring);
    else snprintf(c->arch, sizeof c->arch, "?");
    const int64_t big = 1 << 20;
    KS_TRY(cfg_int(root, "hidden_size", true, 0, 1, big, &c->hidden_size));
    KS_TRY(cfg_int(root, "target_hidden_size", false, c->hidden_size, 1, big, &c->target_hidden_size));
    KS_TRY(cfg_int(root, "intermediate_size", false, 0, 0, big, &c->intermediate_size));
    KS_TRY(cfg_int(root, "num_attention_heads", true, 0, 1, 4096, &c->n_head));
    KS_TRY(cfg_int(root, "num_key_value_heads", false, c->n_head, 1, 4096, &c->n_head_kv));
    int64_t hd_default = c->hidden_size % c->n_head == 0 ? c->hidden_size / c->n_head : 0;
    KS_TRY(cfg_int(root, "head_dim", hd_default == 0, hd_default, 2, 65536, &c->head_dim));
    KS_TRY(cfg_int(root, "vocab_size", true, 0, 1, 1 << 24, &c->vocab_size));
    KS_TRY(cfg_int(root, "draft_vocab_size", false, c->vocab_size, 1, 1 << 24, &c->draft_vocab_size));
    KS_TRY(cfg_int(root, "max_position_embeddings", false, 2048, 1, 1 << 24, &c->max_pos));
    KS_TRY(cfg_float(root, "rms_norm_eps", 1e-6, 0.0, 1.0, &c->rms_eps));
    /* transformers 5 writes RoPE as rope_parameters {rope_type, rope_theta,
     * factor, ...} (SpecForge's llama3_eagle.py get_rope_config reads it
     * first); the legacy keys rope_theta / rope_scaling come next; EAGLE's
     * own configs have neither, and its rotary embedding then uses 10000. */
    const cJSON *rp = cfg_item(root, "rope_parameters");
    if (rp && !cJSON_IsNull(rp) && !cJSON_IsObject(rp))
        return KS_FAIL(KS_ERR_FORMAT, "config.json: \"rope_parameters\" must be an object");
    if (cJSON_IsObject(rp) && !cJSON_GetObjectItemCaseSensitive(rp, "rope_theta")) {
        /* per-layer-type parameters (e.g. {"full_attention": {...}}): the full-attention ones */
        const cJSON *full = cJSON_GetObjectItemCaseSensitive(rp, "full_attention");
        if (cJSON_IsObject(full)) rp = full;
    }
    const cfg_src rsrc = {cJSON_IsObject(rp) ? rp : NULL, NULL};
    if (rsrc.first && cJSON_GetObjectItemCaseSensitive(rp, "rope_theta"))
        KS_TRY(cfg_float(&rsrc, "rope_theta", 10000.0, 1.0 + 1e-6, 1e12, &c->rope_theta));
    else
        KS_TRY(cfg_float(root, "rope_theta", 10000.0, 1.0 + 1e-6, 1e12, &c->rope_theta));
    if (c->head_dim % 2) return KS_FAIL(KS_ERR_FORMAT, "config.json: head_dim %d is odd (RoPE rotates pairs)", c->head_dim);
    if (c->n_head % c->n_head_kv)
        return KS_FAIL(KS_ERR_FORMAT, "config.json: num_attention_heads %d is not a multiple of num_key_value_heads %d", c->n_head, c->n_head_kv);
    if (c->draft_vocab_size > c->vocab_size)
        return KS_FAIL(KS_ERR_FORMAT, "config.json: draft_vocab_size %d exceeds vocab_size %d", c->draft_vocab_size, c->vocab_size);
    const cJSON *legacy = cfg_item(root, "rope_scaling");
    KS_TRY(parse_rope_scaling(rsrc.first && (!legacy || cJSON_IsNull(legacy)) ? rsrc.first : legacy, c->max_pos, &c->rope));
    /* Aux ids and what they mean.  SpecForge and SGLang read
     * eagle_config.eagle_aux_hidden_state_layer_ids and capture at id + 1
     * (SGLang's set_eagle3_layers_to_capture: "[val + 1 for val in
     * layer_ids]", i.e. the output of layer id); vLLM and speculators read
     * the top-level key and capture the stream entering layer id.  A SpecForge
     * export is trained in its convention, so the nested key wins. */
    c->aux_layers[0] = c->aux_layers[1] = c->aux_layers[2] = -1;
    const cJSON *ec = cfg_item(root, "eagle_config");
    const cJSON *nested_aux = cJSON_IsObject(ec) ? cJSON_GetObjectItemCaseSensitive(ec, "eagle_aux_hidden_state_layer_ids") : NULL;
    const cJSON *aux = cfg_item(root, "eagle_aux_hidden_state_layer_ids");
    if (nested_aux && !cJSON_IsNull(nested_aux)) {
        KS_TRY(parse_aux_layers(nested_aux, c));
        c->aux_ids_are_outputs = true;
        snprintf(c->aux_source, sizeof c->aux_source, "eagle_config.eagle_aux_hidden_state_layer_ids: outputs of layers (SpecForge/SGLang)");
    } else {
        KS_TRY(parse_aux_layers(aux, c));
        snprintf(c->aux_source, sizeof c->aux_source, "%s",
                 c->aux_layers_set ? "eagle_aux_hidden_state_layer_ids: inputs of layers (EAGLE/vLLM)" : "EAGLE-3's default [2, L/2, L-3]");
    }
    const cJSON *fn = cfg_item(root, "fc_norm");
    c->fc_norm = cJSON_IsTrue(fn);
    return KS_OK;
}

ks_status ks_eagle3_read_config(const char *config_path, ks_eagle3_config *out) {
    char *text = NULL;
    size_t len = 0;
    KS_TRY(read_text(config_path, (size_t)16 << 20, &text, &len));
    cJSON *root = cJSON_ParseWithLength(text, len);
    ks_free(text);
    if (!root) return KS_FAIL(KS_ERR_FORMAT, "'%s' is not well-formed JSON", config_path);
    ks_eagle3_config c;
    ks_status s = parse_config(root, &c);
    cJSON_Delete(root);
    if (s != KS_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", ks_last_error());
        return KS_FAIL(s, "'%s': %s", config_path, msg);
    }
    *out = c;
    return KS_OK;
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

ks_status ks_eagle3_set_rope_scaling(ks_eagle3 *d, const ks_rope_scaling *sc) {
    ks_rope_scaling none = {.type = KS_ROPE_SCALING_NONE};
    const ks_rope_scaling *use = sc ? sc : &none;
    float *f = ks_malloc(sizeof(float) * (size_t)(d->cfg.head_dim / 2));
    if (!f) return KS_FAIL(KS_ERR_NOMEM, "rope frequencies");
    float ms;
    ks_status s = ks_rope_inv_freq(d->cfg.head_dim, d->cfg.rope_theta, use, f, &ms);
    if (s != KS_OK) {
        ks_free(f);
        return s;
    }
    ks_free(d->inv_freq);
    d->inv_freq = f;
    d->mscale = ms;
    d->cfg.rope = *use;
    return KS_OK;
}

ks_status ks_eagle3_add_yarn(ks_eagle3 *d, float factor, int32_t orig_max_pos) {
    int half = d->cfg.head_dim / 2;
    float *f = ks_malloc(sizeof(float) * (size_t)half * 3);
    if (!f) return KS_FAIL(KS_ERR_NOMEM, "rope frequencies");
    float *plain = f + half, *yarn = f + 2 * half;
    float ms0, ms1, ms2;
    ks_rope_scaling y = ks_rope_scaling_yarn(factor, orig_max_pos);
    /* the checkpoint's own frequencies (its rope_scaling: linear, llama3, yarn
     * or none), then YaRN's per-dimension ratio to plain RoPE on top */
    ks_status s = ks_rope_inv_freq(d->cfg.head_dim, d->cfg.rope_theta, &d->cfg.rope, f, &ms0);
    if (s == KS_OK) s = ks_rope_inv_freq(d->cfg.head_dim, d->cfg.rope_theta, NULL, plain, &ms1);
    if (s == KS_OK) s = ks_rope_inv_freq(d->cfg.head_dim, d->cfg.rope_theta, &y, yarn, &ms2);
    if (s != KS_OK) {
        ks_free(f);
        return s;
    }
    for (int j = 0; j < half; j++) d->inv_freq[j] = (float)((double)f[j] * ((double)yarn[j] / (double)plain[j]));
    d->mscale = ms0 * ms2;
    d->yarn_factor = factor;
    ks_free(f);
    return KS_OK;
}

/* ------------------------------------------------------- target checking -- */

void ks_eagle3_aux_layers(const ks_eagle3 *d, int32_t n_layer, int32_t out[3]) {
    if (d->cfg.aux_layers_set) {
        for (int i = 0; i < 3; i++) out[i] = d->cfg.aux_layers[i] + (d->cfg.aux_ids_are_outputs ? 1 : 0);
    } else {
        out[0] = 2;
        out[1] = n_layer / 2;
        out[2] = n_layer - 3;
    }
    /* ascending: EAGLE, vLLM and SGLang append the states as the layer loop meets them */
    for (int i = 1; i < 3; i++)
        for (int j = i; j > 0 && out[j - 1] > out[j]; j--) {
            int32_t t = out[j];
            out[j] = out[j - 1];
            out[j - 1] = t;
        }
}

void ks_eagle3_set_aux_layers(ks_eagle3 *d, const int32_t ids[3], bool outputs, const char *source) {
    memcpy(d->cfg.aux_layers, ids, sizeof(int32_t) * 3);
    d->cfg.aux_layers_set = true;
    d->cfg.aux_ids_are_outputs = outputs;
    snprintf(d->cfg.aux_source, sizeof d->cfg.aux_source, "%s", source ? source : "set by the caller");
}

void ks_eagle3_fc_norm(const ks_eagle3 *d, float *h3) {
    if (!d->fc_norm[0]) return;
    const int TH = d->cfg.target_hidden_size;
    for (int i = 0; i < 3; i++) ks_rmsnorm(h3 + (size_t)i * TH, h3 + (size_t)i * TH, d->fc_norm[i], TH, d->cfg.rms_eps);
}

ks_status ks_eagle3_check_target(const ks_eagle3 *d, const ks_eagle3_target *t) {
    const ks_eagle3_config *c = &d->cfg;
    if (!d->embed_only && t->n_embd != c->target_hidden_size)
        return KS_FAIL(KS_ERR_INVALID_ARG, "EAGLE-3 draft expects a target with hidden size %d (fc is [%d, 3*%d]) but the target has n_embd %d",
                       c->target_hidden_size, c->hidden_size, c->target_hidden_size, t->n_embd);
    if (!d->has_embed && t->n_embd != c->hidden_size)
        return KS_FAIL(KS_ERR_INVALID_ARG, "EAGLE-3 draft has no embed_tokens and needs the target's embedding, but the target's n_embd %d differs from the draft hidden size %d",
                       t->n_embd, c->hidden_size);
    if (t->n_vocab != c->vocab_size)
        return KS_FAIL(KS_ERR_INVALID_ARG, "EAGLE-3 draft vocabulary has %d tokens but the target's has %d", c->vocab_size, t->n_vocab);
    if (t->n_head_kv != c->n_head_kv)
        return KS_FAIL(KS_ERR_INVALID_ARG, "EAGLE-3 draft has %d KV heads but the target has %d (head-level selection maps them one to one)",
                       c->n_head_kv, t->n_head_kv);
    if (!d->embed_only) {
        int32_t aux[3];
        ks_eagle3_aux_layers(d, t->n_layer, aux);
        for (int i = 0; i < 3; i++)
            if (aux[i] < 0 || aux[i] > t->n_layer || (!d->cfg.aux_ids_are_outputs && aux[i] == t->n_layer))
                return KS_FAIL(KS_ERR_INVALID_ARG, "EAGLE-3 aux hidden-state layer %d (%s) is out of range for a %d-layer target",
                               d->cfg.aux_layers_set ? aux[i] - (d->cfg.aux_ids_are_outputs ? 1 : 0) : aux[i],
                               d->cfg.aux_layers_set ? d->cfg.aux_source : "default [2, L/2, L-3]", t->n_layer);
    }
    return KS_OK;
}

/* --------------------------------------------------------------- forward -- */

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

/* ------------------------------------------------------------- describe -- */

static const char *rope_name(ks_rope_scaling_type t) {
    switch (t) {
    case KS_ROPE_SCALING_LINEAR: return "linear";
    case KS_ROPE_SCALING_LLAMA3: return "llama3";
    case KS_ROPE_SCALING_YARN: return "yarn";
    default: return "none";
    }
}

static void human(double n, char *buf, size_t cap) {
    if (n >= 1e9) snprintf(buf, cap, "%.2fB", n / 1e9);
    else if (n >= 1e6) snprintf(buf, cap, "%.2fM", n / 1e6);
    else if (n >= 1e3) snprintf(buf, cap, "%.2fK", n / 1e3);
    else snprintf(buf, cap, "%.0f", n);
}

ks_status ks_eagle3_describe(const ks_eagle3 *d, char *buf, size_t cap) {
    if (!buf || cap == 0) return KS_FAIL(KS_ERR_INVALID_ARG, "empty buffer");
    const ks_eagle3_config *c = &d->cfg;
    size_t n = 0;
#define P(...) do { if (n < cap) n += (size_t)snprintf(buf + n, cap - n, __VA_ARGS__); } while (0)
    P("EAGLE-3 draft model (%s)%s\n", c->arch, d->head_only ? ", retrieval head only" : "");
    P("  hidden %d (target %d), intermediate %d, heads %d / kv %d x %d, vocab %d (draft %d)\n", c->hidden_size,
      c->target_hidden_size, c->intermediate_size, c->n_head, c->n_head_kv, c->head_dim, c->vocab_size, c->draft_vocab_size);
    P("  rms_eps %g, rope_theta %g, max_pos %d, rope scaling %s", (double)c->rms_eps, (double)c->rope_theta, c->max_pos,
      rope_name(c->rope.type));
    if (c->rope.type != KS_ROPE_SCALING_NONE) P(" (factor %g, original %d)", (double)c->rope.factor, c->rope.orig_max_pos);
    P("\n  layer tensors under '%s', embed_tokens %s%s\n", d->layer_prefix,
      d->has_embed ? "present" : "absent (the target's embedding is used)", d->embed_only ? ", embedding-only head" : "");
    if (c->aux_layers_set)
        P("  aux layers [%d, %d, %d] (from config: %s)\n", c->aux_layers[0], c->aux_layers[1], c->aux_layers[2], c->aux_source);
    else P("  aux layers: default [2, L/2, L-3] of the target\n");
    if (d->fc_norm[0]) P("  fc_norm on each fused state (SpecForge)\n");
    char a[32], b[32], e[32], f[32];
    human((double)d->n_params_full, a, sizeof a);
    human((double)d->n_params_head, b, sizeof b);
    P("  params: full DLM (every checkpoint tensor) %s, retrieval head %s (%.1f%% fewer)\n", a, b,
      d->n_params_full ? 100.0 * (1.0 - (double)d->n_params_head / (double)d->n_params_full) : 0.0);
    if (d->n_params_embed) {
        int64_t fx = d->n_params_full - d->n_params_embed, hx = d->n_params_head - d->n_params_embed;
        human((double)fx, e, sizeof e);
        human((double)hx, f, sizeof f);
        P("  without the (target-shared) embedding: full %s, head %s (%.1f%% fewer)\n", e, f,
          fx > 0 ? 100.0 * (1.0 - (double)hx / (double)fx) : 0.0);
    }
#undef P
    return KS_OK;
}
