/*
 * cmd_info.c — `kvsieve info FILE`: what a GGUF holds and what running it costs.
 * Works on vocabulary-only files; --kv and --tensors list the raw metadata.
 * Given a directory, describes an EAGLE-3 draft checkpoint (config.json +
 * safetensors): its shapes and the parameters of the full DLM vs the
 * SpeContext retrieval head; --kv and --tensors list the safetensors
 * metadata and tensors.
 */
#include "commands.h"
#include "model/eagle3.h"
#include "model/model.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

/* A checkpoint directory: load it in full (or, if only the head is there,
 * head-only) and describe it. */
static int info_eagle3(const char *dir, bool show_kv, bool show_tensors) {
    ks_eagle3 *d = NULL;
    ks_eagle3_params p = ks_eagle3_default_params();
    ks_status st = ks_eagle3_load(dir, p, &d);
    if (st == KS_ERR_FORMAT) {
        char full_msg[1024];
        snprintf(full_msg, sizeof full_msg, "%s", ks_last_error());
        p.head_only = true;
        if (ks_eagle3_load(dir, p, &d) == KS_OK) {
            printf("note: only the retrieval head loads (full model: %s)\n", full_msg);
        } else {
            ks_fail_at(st, __FILE__, __LINE__, "%s", full_msg); /* report the full load's reason */
            d = NULL;
        }
    }
    if (!d) {
        app_report("info", "reading the EAGLE-3 checkpoint", st);
        return 1;
    }
    if ((show_kv || show_tensors) && !d->st) {
        /* head-only loads close the checkpoint: reopen it for the listing */
        ks_safetensors *s = NULL;
        if (ks_safetensors_open(dir, true, &s) == KS_OK) d->st = s;
    }
    if (show_kv && d->st) {
        printf("safetensors metadata (%lld keys):\n", (long long)ks_safetensors_n_metadata(d->st));
        for (int64_t i = 0; i < ks_safetensors_n_metadata(d->st); i++) {
            const char *k, *v;
            ks_safetensors_metadata_at(d->st, i, &k, &v);
            printf("  %-48s \"%.80s\"\n", k, v);
        }
    }
    if (show_tensors && d->st) {
        printf("tensors (%lld in %d file%s):\n", (long long)ks_safetensors_count(d->st), ks_safetensors_n_shards(d->st),
               ks_safetensors_n_shards(d->st) == 1 ? "" : "s");
        for (int64_t i = 0; i < ks_safetensors_count(d->st); i++) {
            const ks_st_tensor *t = ks_safetensors_at(d->st, i);
            char sb[160];
            printf("  %-48s %-5s %s %zu bytes\n", t->name, ks_st_dtype_name(t->dtype),
                   ks_st_shape_str(t->n_dims, t->shape, sb, sizeof sb), t->nbytes);
        }
    }
    char buf[4096];
    st = ks_eagle3_describe(d, buf, sizeof buf);
    fputs(buf, stdout);
    ks_eagle3_destroy(d);
    return st == KS_OK ? 0 : 1;
}

static void print_kv(const ks_gguf_kv *kv) {
    printf("  %-48.*s %-8s ", (int)kv->key.len, kv->key.data, ks_gguf_type_name(kv->type));
    if (kv->type == KS_GGUF_STRING) {
        int n = kv->str.len > 80 ? 80 : (int)kv->str.len;
        printf("\"");
        for (int i = 0; i < n; i++) putchar(kv->str.data[i] == '\n' ? ' ' : kv->str.data[i]);
        printf("%s\"\n", kv->str.len > 80 ? "..." : "");
    } else if (kv->type == KS_GGUF_ARRAY) {
        printf("[%s x %llu]\n", ks_gguf_type_name(kv->arr_type), (unsigned long long)kv->arr_n);
    } else {
        /* view the scalar as a 1-element array to reuse the checked getters */
        ks_gguf_kv one = *kv;
        one.type = KS_GGUF_ARRAY;
        one.arr_type = kv->type;
        one.arr_n = 1;
        one.arr_data = kv->scalar;
        if (kv->type == KS_GGUF_FLOAT32 || kv->type == KS_GGUF_FLOAT64) printf("%g\n", ks_gguf_arr_f64(&one, 0));
        else printf("%lld\n", (long long)ks_gguf_arr_i64(&one, 0));
    }
}

int cmd_info(int argc, char **argv) {
    const char *path = NULL;
    bool show_kv = false, show_tensors = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--kv")) show_kv = true;
        else if (!strcmp(argv[i], "--tensors")) show_tensors = true;
        else if (!strcmp(argv[i], "-m") && i + 1 < argc) path = argv[++i];
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: kvsieve info [-m] FILE.gguf|EAGLE3_DIR [--kv] [--tensors]\n");
            return 0;
        } else if (argv[i][0] != '-' && !path) path = argv[i];
        else {
            fprintf(stderr, "kvsieve info: unknown option '%s'\nusage: kvsieve info FILE.gguf [--kv] [--tensors]\n", argv[i]);
            return 2;
        }
    }
    if (!path) {
        fprintf(stderr, "usage: kvsieve info FILE.gguf [--kv] [--tensors]\n");
        return 2;
    }
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) return info_eagle3(path, show_kv, show_tensors);
    ks_gguf *g = NULL;
    ks_status st = ks_gguf_open(path, &g);
    if (st != KS_OK) {
        app_report("info", "reading the file", st);
        return 1;
    }
    if (show_kv) {
        printf("metadata (%lld keys):\n", (long long)ks_gguf_n_kv(g));
        for (int64_t i = 0; i < ks_gguf_n_kv(g); i++) print_kv(ks_gguf_kv_at(g, i));
    }
    if (show_tensors) {
        printf("tensors (%lld):\n", (long long)ks_gguf_n_tensors(g));
        for (int64_t i = 0; i < ks_gguf_n_tensors(g); i++) {
            const ks_gguf_tensor *t = ks_gguf_tensor_at(g, i);
            printf("  %-40.*s %-5s [", (int)t->name.len, t->name.data, ks_dtype_name(t->type));
            for (uint32_t d = 0; d < t->n_dims; d++) printf("%s%lld", d ? ", " : "", (long long)t->ne[d]);
            printf("] %zu bytes\n", t->nbytes);
        }
    }
    bool vocab_only = ks_gguf_n_tensors(g) == 0;
    ks_gguf_close(g);
    ks_model_params mp = ks_model_default_params();
    mp.vocab_only = vocab_only;
    ks_model *m = NULL;
    if ((st = ks_model_load(path, mp, &m)) != KS_OK) {
        app_report("info", "loading the model", st);
        return 1;
    }
    char buf[8192];
    st = ks_model_describe(m, buf, sizeof buf);
    fputs(buf, stdout);
    ks_model_destroy(m);
    return st == KS_OK ? 0 : 1;
}
