/*
 * cmd_tokenize.c — `kvsieve tokenize -m M -p TEXT`: ids one per line, or JSON.
 * Loads the vocabulary only, so it works on vocabulary-only GGUF files.
 */
#include "args.h"
#include "commands.h"
#include "kvsieve.h"
#include "opts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void print_ids(const app_options *o, const ks_model *m, const int32_t *ids, size_t n) {
    char piece[512];
    if (o->json) printf("[");
    for (size_t i = 0; i < n; i++) {
        if (o->json) printf("%s%d", i ? ", " : "", ids[i]);
        else if (o->pieces) {
            size_t np = 0;
            if (ks_token_to_piece(m, ids[i], piece, sizeof piece, &np) != KS_OK) np = 0;
            printf("%d\t'%.*s'\n", ids[i], (int)np, piece);
        } else printf("%d\n", ids[i]);
    }
    if (o->json) printf("]\n");
}

int cmd_tokenize(int argc, char **argv) {
    app_options o;
    int rc = app_parse("tokenize", argc, argv, &o);
    if (rc >= 0) return rc;
    const char *cmd = o.cmd, *text = o.prompt;
    if (!o.prompt == !o.file) { fprintf(stderr, "kvsieve tokenize: give exactly one of -p TEXT or -f FILE\n"); return 2; }
    if ((rc = app_resolve_model(&o, false)) >= 0) return rc;
    size_t len = 0;
    char *buf = NULL;
    if (o.file) { if (!(buf = app_read_file(cmd, o.file, &len))) return 1; text = buf; }
    else len = strlen(text);
    ks_model_params mp = ks_model_default_params();
    mp.vocab_only = true;
    ks_model *m = NULL;
    if (!app_load_model(&o, mp, &m)) { free(buf); return 1; }
    size_t n = 0;
    ks_tokenize(m, text, len, o.bos, o.special, NULL, 0, &n);
    int32_t *ids = malloc(sizeof(int32_t) * (n + 1));
    ks_status st = ks_tokenize(m, text, len, o.bos, o.special, ids, n, &n);
    if (st != KS_OK) app_report(cmd, "tokenizing", st);
    else print_ids(&o, m, ids, n);
    free(ids);
    free(buf);
    ks_model_destroy(m);
    return st == KS_OK ? 0 : 1;
}
