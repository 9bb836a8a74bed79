/*
 * eagle3_config.c — an EAGLE-3 draft's conventions: its config.json, its
 * RoPE scaling, which target layers feed it, whether a target fits it, and
 * its one-paragraph description.
 *
 * Why apart from the weights (eagle3.c): these are the parts where public
 * EAGLE-3 releases disagree and where a wrong guess gives a draft that
 * loads fine and scores nonsense, so each convention is decided here once,
 * with its source, and checked against the target before a step runs.
 * config.json is untrusted input: every field is range-checked
 * (cfg_int / cfg_float) and the file's size is capped before it is parsed.
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
 */
#define _GNU_SOURCE
#include "draft/eagle3.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

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

/* ------------------------------------------------------------------ rope -- */

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
