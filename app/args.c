/*
 * args.c — strict number parsing and small I/O helpers for the CLI.
 */
#define _GNU_SOURCE
#include "args.h"
#include "kvsieve_tools.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

bool arg_long(const char *cmd, const char *flag, const char *s, long lo, long hi, long *out) {
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || !end || *end || end == s || v < lo || v > hi) {
        fprintf(stderr, "kvsieve %s: %s expects an integer in [%ld, %ld], got '%s'\n", cmd, flag, lo, hi, s);
        return false;
    }
    *out = v;
    return true;
}

bool arg_float(const char *cmd, const char *flag, const char *s, double lo, double hi, float *out) {
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || !end || *end || end == s || !(v >= lo && v <= hi)) {
        fprintf(stderr, "kvsieve %s: %s expects a number in [%g, %g], got '%s'\n", cmd, flag, lo, hi, s);
        return false;
    }
    *out = (float)v;
    return true;
}

bool arg_kv_type(const char *cmd, const char *s, ks_kv_type *out) {
    if (!strcmp(s, "f16")) *out = KS_KV_F16;
    else if (!strcmp(s, "q8") || !strcmp(s, "q8_0")) *out = KS_KV_Q8;
    else {
        fprintf(stderr, "kvsieve %s: --kv-type must be f16 or q8, got '%s'\n", cmd, s);
        return false;
    }
    return true;
}

const char *arg_value(const char *cmd, int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "kvsieve %s: option %s needs a value\n", cmd, argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

int arg_long_list(const char *cmd, const char *flag, const char *s, long lo, long hi, long *out, int cap) {
    int n = 0;
    char *copy = strdup(s), *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n == cap) {
            fprintf(stderr, "kvsieve %s: %s takes at most %d values\n", cmd, flag, cap);
            free(copy);
            return -1;
        }
        if (!arg_long(cmd, flag, tok, lo, hi, &out[n++])) {
            free(copy);
            return -1;
        }
    }
    free(copy);
    if (n == 0) fprintf(stderr, "kvsieve %s: %s needs at least one value\n", cmd, flag);
    return n ? n : -1;
}

char *app_read_file(const char *cmd, const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "kvsieve %s: cannot open '%s': %s\n", cmd, path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (n + 1 >= cap) buf = realloc(buf, cap *= 2);
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) break;
    }
    bool err = ferror(f);
    fclose(f);
    if (err) {
        fprintf(stderr, "kvsieve %s: error reading '%s'\n", cmd, path);
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

const char *app_default_model(void) {
    const char *env = getenv("KVSIEVE_MODEL");
    if (env && *env) return env;
    /* the bundled model, found relative to the executable (build/kvsieve -> ../models) */
    static char path[4096];
    char exe[4096];
    if (ks_host_exe_path(exe, sizeof exe)) {
        char *slash = strrchr(exe, '/');
        if (slash) *slash = 0;
        const char *cands[] = {"../models/kvsieve-default.gguf", "models/kvsieve-default.gguf",
                               "../share/kvsieve/kvsieve-default.gguf"};
        for (size_t i = 0; i < sizeof cands / sizeof cands[0]; i++) {
            int w = snprintf(path, sizeof path, "%s/%s", exe, cands[i]);
            if (w > 0 && (size_t)w < sizeof path && access(path, R_OK) == 0) return path; /* a cut path is no path */
        }
    }
    return NULL;
}
