/*
 * hello.c — a program built against an installed kvsieve with nothing but
 * `pkg-config --cflags --libs kvsieve` (tests/install/install.sh): it loads
 * a model through the public API, tokenizes a sentence and takes the
 * server's defaults, so the engine's libraries and the server's all link.
 */
#include "kvsieve.h"
#include "kvsieve_server.h"

#include <stdio.h>

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    ks_model *m = NULL;
    if (ks_model_load(argv[1], ks_model_default_params(), &m) != KS_OK) {
        fprintf(stderr, "hello: cannot load %s\n", argv[1]);
        return 1;
    }
    int32_t ids[64];
    size_t n = 0;
    const char *text = "The quiet farmer walks near the old bridge.";
    ks_status st = ks_tokenize(m, text, 43, true, false, ids, 64, &n);
    ks_serve_params sp = ks_serve_default_params();
    printf("tokens %zu port %d\n", n, sp.port);
    ks_model_destroy(m);
    return st == KS_OK && n > 1 ? 0 : 1;
}
