/*
 * cmd_info.c — `kvsieve info FILE`: what a GGUF holds and what running it costs.
 * Works on vocabulary-only files; --kv and --tensors list the raw metadata.
 */
#include "commands.h"
#include "model/model.h"

#include <stdio.h>
#include <string.h>

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
            printf("usage: kvsieve info [-m] FILE.gguf [--kv] [--tensors]\n");
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
