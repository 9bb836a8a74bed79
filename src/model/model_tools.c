/*
 * model_tools.c — the model module's part of the public tools API
 * (include/kvsieve_tools.h): a model's shape as plain numbers, the listing
 * of a model file (`kvsieve info`) and the synthetic-model writer
 * (`kvsieve gen-model`).
 *
 * Why here and not in the CLI: listing a GGUF's keys and tensors, or opening
 * an EAGLE-3 checkpoint, needs the file parsers' own structs (gguf.h,
 * safetensors.h, eagle3.h), which are the engine's and may change with it.
 * The CLI sees one call per command, with a status and the name of the step
 * that failed, so it keeps its messages and exit codes without knowing the
 * formats.  The code is the CLI's former cmd_info.c / cmd_gen_model.c
 * bodies, moved: the output is byte for byte what it was.
 */
#include "gguf/gguf.h"
#include "kvsieve_tools.h"
#include "draft/eagle3.h"
#include "model/eagle3_gen.h"
#include "model/model.h"
#include "checkpoint/safetensors.h"
#include "model/arch.h"
#include "model/shapes.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

void ks_model_get_info(const ks_model *m, ks_model_info *out) {
    const ks_hparams *hp = &m->hp;
    *out = (ks_model_info){.arch_name = hp->arch_name, .n_layer = hp->n_layer, .n_head = hp->n_head,
                           .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim, .n_embd = hp->n_embd,
                           .n_vocab = hp->n_vocab, .n_ctx_train = hp->n_ctx_train,
                           .weight_bytes = (double)m->weight_bytes, .n_swa = hp->n_swa};
    for (int il = 0; il < hp->n_layer; il++) out->n_local += m->layers[il].window > 0;
    /* as ks_model_describe's "decode bytes": every matrix once, one embedding row, the active experts */
    double step = (double)m->weight_bytes - (m->output_tied ? 0 : (double)ks_weight_bytes(&m->tok_embd));
    out->n_expert = hp->n_expert;
    out->n_expert_used = hp->n_expert_used;
    for (int il = 0; il < hp->n_layer; il++)
        if (m->layers[il].moe) {
            out->expert_bytes += (double)m->layers[il].moe->expert_bytes * hp->n_expert;
            out->expert_active_bytes += (double)m->layers[il].moe->expert_bytes * hp->n_expert_used;
        }
    out->decode_bytes = step - (out->expert_bytes - out->expert_active_bytes);
}

/* ------------------------------------------------------------------ info -- */
static void eagle3_listing(const char *dir, ks_eagle3 *d, bool show_kv, bool show_tensors, FILE *f) {
    if ((show_kv || show_tensors) && !d->st) {
        /* head-only loads close the checkpoint: reopen it for the listing */
        ks_safetensors *s = NULL;
        if (ks_safetensors_open(dir, true, &s) == KS_OK) d->st = s;
    }
    if (show_kv && d->st) {
        fprintf(f, "safetensors metadata (%lld keys):\n", (long long)ks_safetensors_n_metadata(d->st));
        for (int64_t i = 0; i < ks_safetensors_n_metadata(d->st); i++) {
            const char *k, *v;
            ks_safetensors_metadata_at(d->st, i, &k, &v);
            fprintf(f, "  %-48s \"%.80s\"\n", k, v);
        }
    }
    if (show_tensors && d->st) {
        fprintf(f, "tensors (%lld in %d file%s):\n", (long long)ks_safetensors_count(d->st),
                ks_safetensors_n_shards(d->st), ks_safetensors_n_shards(d->st) == 1 ? "" : "s");
        for (int64_t i = 0; i < ks_safetensors_count(d->st); i++) {
            const ks_st_tensor *t = ks_safetensors_at(d->st, i);
            char sb[160];
            fprintf(f, "  %-48s %-5s %s %zu bytes\n", t->name, ks_st_dtype_name(t->dtype),
                    ks_st_shape_str(t->n_dims, t->shape, sb, sizeof sb), t->nbytes);
        }
    }
}

/* A checkpoint directory: load it in full (or, if only the head is there, the head). */
static ks_status info_eagle3(const char *dir, bool show_kv, bool show_tensors, FILE *f, const char **what) {
    ks_eagle3 *d = NULL;
    ks_eagle3_params p = ks_eagle3_default_params();
    ks_status st = ks_eagle3_load(dir, p, &d);
    if (st == KS_ERR_FORMAT) {
        char full_msg[1024];
        snprintf(full_msg, sizeof full_msg, "%s", ks_last_error());
        p.head_only = true;
        if (ks_eagle3_load(dir, p, &d) == KS_OK) {
            fprintf(f, "note: only the retrieval head loads (full model: %s)\n", full_msg);
        } else {
            ks_fail_at(st, __FILE__, __LINE__, "%s", full_msg); /* report the full load's reason */
            d = NULL;
        }
    }
    if (!d) {
        *what = "reading the EAGLE-3 checkpoint";
        return st;
    }
    eagle3_listing(dir, d, show_kv, show_tensors, f);
    char buf[4096];
    st = ks_eagle3_describe(d, buf, sizeof buf);
    fputs(buf, f);
    ks_eagle3_destroy(d);
    *what = "describing the checkpoint";
    return st;
}

static void print_kv(const ks_gguf_kv *kv, const char *arch, FILE *f) {
    /* "-" marks a key of the architecture's namespace the loader does not read */
    fprintf(f, "%c %-48.*s %-8s ", ks_model_key_read(arch, kv->key.data, kv->key.len) ? ' ' : '-', (int)kv->key.len,
            kv->key.data, ks_gguf_type_name(kv->type));
    if (kv->type == KS_GGUF_STRING) {
        int n = kv->str.len > 80 ? 80 : (int)kv->str.len;
        fprintf(f, "\"");
        for (int i = 0; i < n; i++) fputc(kv->str.data[i] == '\n' ? ' ' : kv->str.data[i], f);
        fprintf(f, "%s\"\n", kv->str.len > 80 ? "..." : "");
    } else if (kv->type == KS_GGUF_ARRAY) {
        fprintf(f, "[%s x %llu]\n", ks_gguf_type_name(kv->arr_type), (unsigned long long)kv->arr_n);
    } else {
        /* view the scalar as a 1-element array to reuse the checked getters */
        ks_gguf_kv one = *kv;
        one.type = KS_GGUF_ARRAY;
        one.arr_type = kv->type;
        one.arr_n = 1;
        one.arr_data = kv->scalar;
        if (kv->type == KS_GGUF_FLOAT32 || kv->type == KS_GGUF_FLOAT64) fprintf(f, "%g\n", ks_gguf_arr_f64(&one, 0));
        else fprintf(f, "%lld\n", (long long)ks_gguf_arr_i64(&one, 0));
    }
}

static void gguf_listing(ks_gguf *g, bool show_kv, bool show_tensors, FILE *f) {
    if (show_kv) {
        char arch[64] = "";
        ks_gguf_str a;
        if (ks_gguf_get_str(g, "general.architecture", &a) == KS_OK)
            snprintf(arch, sizeof arch, "%.*s", (int)a.len, a.data);
        fprintf(f, "metadata (%lld keys; '-': not read by kvsieve%s%s%s):\n", (long long)ks_gguf_n_kv(g),
                arch[0] && !ks_arch_find(arch) ? ", architecture '" : "", arch[0] && !ks_arch_find(arch) ? arch : "",
                arch[0] && !ks_arch_find(arch) ? "' unknown" : "");
        for (int64_t i = 0; i < ks_gguf_n_kv(g); i++) print_kv(ks_gguf_kv_at(g, i), arch, f);
    }
    if (show_tensors) {
        fprintf(f, "tensors (%lld):\n", (long long)ks_gguf_n_tensors(g));
        for (int64_t i = 0; i < ks_gguf_n_tensors(g); i++) {
            const ks_gguf_tensor *t = ks_gguf_tensor_at(g, i);
            fprintf(f, "  %-40.*s %-5s [", (int)t->name.len, t->name.data, ks_dtype_name(t->type));
            for (uint32_t d = 0; d < t->n_dims; d++) fprintf(f, "%s%lld", d ? ", " : "", (long long)t->ne[d]);
            fprintf(f, "] %zu bytes\n", t->nbytes);
        }
    }
}

ks_status ks_file_info(const char *path, bool show_kv, bool show_tensors, FILE *f, const char **what) {
    const char *dummy;
    if (!what) what = &dummy;
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) return info_eagle3(path, show_kv, show_tensors, f, what);
    ks_gguf *g = NULL;
    ks_status st = ks_gguf_open(path, &g);
    if (st != KS_OK) {
        *what = "reading the file";
        return st;
    }
    gguf_listing(g, show_kv, show_tensors, f);
    bool vocab_only = ks_gguf_n_tensors(g) == 0;
    ks_gguf_close(g);
    ks_model_params mp = ks_model_default_params();
    mp.vocab_only = vocab_only;
    ks_model *m = NULL;
    if ((st = ks_model_load(path, mp, &m)) != KS_OK) {
        *what = "loading the model";
        return st;
    }
    char buf[8192];
    st = ks_model_describe(m, buf, sizeof buf);
    fputs(buf, f);
    ks_model_destroy(m);
    *what = "describing the model";
    return st;
}

/* ------------------------------------------------------------- gen-model -- */
ks_gen_model_params ks_gen_model_default_params(void) {
    return (ks_gen_model_params){.seed = 42, .progress = true};
}

void ks_gen_model_shapes(FILE *f) {
    for (int i = 0; i < ks_shape_count(); i++) {
        const ks_model_shape *s = ks_shape_at(i);
        fprintf(f, "  %-14s %-6s embd %-5d layers %-3d heads %d/%d head_dim %d ff %d%s%s%s%s", s->name, s->arch,
                s->n_embd, s->n_layer, s->n_head, s->n_head_kv, s->head_dim, s->n_ff, s->tied_output ? " tied" : "",
                s->qkv_bias ? " qkv-bias" : "", s->qk_norm ? " qk-norm" : "", s->rope_llama3 ? " llama3-rope" : "");
        if (s->rope_scaling) fprintf(f, " %s-rope x%g/%d", s->rope_scaling, s->rope_factor, s->rope_orig_ctx);
        if (s->n_rot > 0) fprintf(f, " n_rot %d", s->n_rot);
        if (s->fused) fprintf(f, " fused-qkv/gate-up");
        if (s->attn_temp_scale > 0) fprintf(f, " attn-temp %g", s->attn_temp_scale);
        fputc('\n', f);
        if (s->n_expert) fprintf(f, "  %-14s        experts %d, %d active, expert ff %d\n", "", s->n_expert, s->n_expert_used, s->n_ff_exp);
    }
}

bool ks_gen_model_shape_known(const char *shape) { return shape && ks_shape_find(shape) != NULL; }

/* A weight type name, or llama.cpp's mixes q4_k_m / q5_k_m: *t the main
 * type, *mix whether attn_v / ffn_down / output follow the _M rule. */
static bool gen_name_eq(const char *a, const char *lower) {
    for (; *a && *lower; a++, lower++)
        if ((*a >= 'A' && *a <= 'Z' ? *a - 'A' + 'a' : *a) != *lower) return false;
    return !*a && !*lower;
}

static bool gen_type_parse(const char *type, ks_dtype *t, bool *mix) {
    *mix = false;
    if (!type) return false;
    if (gen_name_eq(type, "q4_k_m") || gen_name_eq(type, "q5_k_m")) {
        *t = type[1] == '4' ? KS_DTYPE_Q4_K : KS_DTYPE_Q5_K;
        *mix = true;
        return true;
    }
    return ks_dtype_from_name(type, t) && ks_dtype_is_weight_type((uint32_t)*t);
}

bool ks_gen_model_type_known(const char *type) {
    ks_dtype t;
    bool mix;
    return gen_type_parse(type, &t, &mix);
}

typedef struct gen_progress {
    double t0, last;
    int last_pct;
} gen_progress;

static void gen_on_progress(void *user, int64_t tensor, int64_t n_tensors, const char *name, uint64_t done,
                            uint64_t total) {
    gen_progress *pr = user;
    if (total < (64u << 20)) return; /* small files: stay quiet */
    int pct = (int)(100.0 * (double)done / (double)total);
    double now = ks_time_sec();
    if (pct < pr->last_pct + 5 && now - pr->last < 10.0) return; /* every 5% or 10 s */
    pr->last_pct = pct;
    pr->last = now;
    fprintf(stderr, "gen-model: %3d%%  %6.2f / %.2f GiB  [%lld/%lld] %s  (%.0f s)\n", pct,
            (double)done / (1u << 30), (double)total / (1u << 30), (long long)tensor + 1, (long long)n_tensors,
            name, now - pr->t0);
}

ks_status ks_gen_model(const ks_gen_model_params *p, const char *path, ks_gen_model_result *out, const char **what) {
    const char *dummy;
    if (!what) what = &dummy;
    *what = "checking the parameters";
    const ks_model_shape *shape = p->shape ? ks_shape_find(p->shape) : NULL;
    ks_shape_gen_params gp = {0};
    if (!shape) return KS_FAIL(KS_ERR_NOT_FOUND, "unknown shape '%s'", p->shape ? p->shape : "(none)");
    if (!ks_gen_model_type_known(p->type)) return KS_FAIL(KS_ERR_NOT_FOUND, "unknown weight type '%s'", p->type ? p->type : "(none)");
    gen_type_parse(p->type, &gp.type, &gp.mix_k_m);
    ks_gguf *vocab = NULL;
    ks_status st = ks_gguf_open(p->vocab_path, &vocab);
    if (st != KS_OK) {
        *what = "reading the vocabulary";
        return st;
    }
    gen_progress pr = {ks_time_sec(), 0, -100};
    gp.vocab = vocab;
    gp.seed = p->seed;
    gp.n_layer = p->n_layer;
    gp.n_ctx = p->n_ctx;
    gp.n_threads = p->n_threads;
    if (p->progress) {
        gp.progress = gen_on_progress;
        gp.progress_user = &pr;
    }
    uint64_t bytes = 0;
    st = ks_shape_generate(shape, &gp, path, &bytes);
    const ks_gguf_kv *tokens = ks_gguf_find_kv(vocab, "tokenizer.ggml.tokens");
    int64_t n_vocab = tokens ? (int64_t)tokens->arr_n : 0;
    ks_gguf_close(vocab);
    if (st != KS_OK) {
        *what = "writing the model";
        return st;
    }
    *out = (ks_gen_model_result){.bytes = bytes, .n_layer = p->n_layer > 0 ? p->n_layer : shape->n_layer,
                                 .n_vocab = n_vocab, .shape_name = shape->name, .arch = shape->arch,
                                 .type_name = ks_dtype_name(gp.type)};
    return KS_OK;
}

ks_status ks_gen_model_dlm(const ks_gen_model_params *p, int64_t n_vocab, const char *dir) {
    const ks_model_shape *shape = p->shape ? ks_shape_find(p->shape) : NULL;
    if (!shape) return KS_FAIL(KS_ERR_NOT_FOUND, "unknown shape '%s'", p->shape ? p->shape : "(none)");
    return ks_eagle3_generate_head(shape, p->n_layer, (int32_t)n_vocab, p->n_ctx > 0 ? p->n_ctx : 2048, p->seed + 1, dir);
}
