/*
 * cmd_tokenize.c — `kvsieve tokenize -m M -p TEXT`: ids one per line, or JSON.
 * Loads the vocabulary only, so it works on vocabulary-only GGUF files.
 */
#include "args.h"
#include "commands.h"
#include "kvsieve.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cmd_tokenize(int argc, char **argv) {
    const char *cmd = "tokenize", *model_path = NULL, *text = NULL, *file = NULL;
    bool json = false, add_bos = false, special = false, pieces = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-m")) { if (!(v = arg_value(cmd, argc, argv, &i))) return 2; model_path = v; }
        else if (!strcmp(a, "-p")) { if (!(v = arg_value(cmd, argc, argv, &i))) return 2; text = v; }
        else if (!strcmp(a, "-f")) { if (!(v = arg_value(cmd, argc, argv, &i))) return 2; file = v; }
        else if (!strcmp(a, "--json")) json = true;
        else if (!strcmp(a, "--bos")) add_bos = true;
        else if (!strcmp(a, "--special")) special = true;
        else if (!strcmp(a, "--pieces")) pieces = true;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: kvsieve tokenize [-m MODEL.gguf] (-p TEXT | -f FILE) [--json] [--bos] [--special] [--pieces]\n"
                   "  --bos      prepend BOS if the vocabulary asks for it\n"
                   "  --special  parse control-token text such as <|eot_id|> into its id\n"
                   "  --pieces   print each id with its decoded text\n");
            return 0;
        } else { fprintf(stderr, "kvsieve tokenize: unknown option '%s'\n", a); return 2; }
    }
    if (!text == !file) { fprintf(stderr, "kvsieve tokenize: give exactly one of -p TEXT or -f FILE\n"); return 2; }
    if (!model_path) model_path = app_default_model();
    if (!model_path) { fprintf(stderr, "kvsieve tokenize: no model given (-m)\n"); return 2; }
    size_t len = 0;
    char *buf = NULL;
    if (file) { if (!(buf = app_read_file(cmd, file, &len))) return 1; text = buf; }
    else len = strlen(text);
    ks_model_params mp = ks_model_default_params();
    mp.vocab_only = true;
    ks_model *m = NULL;
    ks_status st = ks_model_load(model_path, mp, &m);
    if (st != KS_OK) { app_report(cmd, "loading the vocabulary", st); free(buf); return 1; }
    size_t n = 0;
    ks_tokenize(m, text, len, add_bos, special, NULL, 0, &n);
    int32_t *ids = malloc(sizeof(int32_t) * (n + 1));
    st = ks_tokenize(m, text, len, add_bos, special, ids, n, &n);
    if (st != KS_OK) { app_report(cmd, "tokenizing", st); free(ids); free(buf); ks_model_destroy(m); return 1; }
    char piece[512];
    if (json) printf("[");
    for (size_t i = 0; i < n; i++) {
        if (json) printf("%s%d", i ? ", " : "", ids[i]);
        else if (pieces) {
            size_t np = 0;
            if (ks_token_to_piece(m, ids[i], piece, sizeof piece, &np) != KS_OK) np = 0;
            printf("%d\t'%.*s'\n", ids[i], (int)np, piece);
        } else printf("%d\n", ids[i]);
    }
    if (json) printf("]\n");
    free(ids);
    free(buf);
    ks_model_destroy(m);
    return 0;
}
