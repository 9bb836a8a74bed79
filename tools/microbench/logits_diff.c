/*
 * logits_diff.c — the logits of the last token of a prompt, compared between
 * two runs of this program (diagnostics, not a test): the accuracy check of
 * an arithmetic change such as the bf16 prefill attention
 * (attn/attn_block_bf16.c), run once with KS_ATTN=f32 and once without.
 *
 * Why a file and two processes: the attention kernel is chosen once per
 * process (ks_attention_block_bf16_usable caches KS_ATTN), so the two paths
 * cannot share one run.  The first run writes the logits (raw f32); the
 * second, given the same file, reads them back and prints the max absolute
 * difference, the normalised RMS difference ||a - b|| / ||b|| and whether
 * the top-1 token agrees.
 *
 * Usage: logits_diff MODEL.gguf TEXT_FILE N_TOKENS THREADS LOGITS_FILE write|compare [f16|q8]
 * (the last: the KV cache's type, f16 unless told)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvsieve.h"

int main(int argc, char **argv) {
    if (argc < 7 || argc > 8 || (strcmp(argv[6], "write") && strcmp(argv[6], "compare")) ||
        (argc == 8 && strcmp(argv[7], "f16") && strcmp(argv[7], "q8"))) {
        fprintf(stderr, "usage: logits_diff MODEL.gguf TEXT_FILE N_TOKENS THREADS LOGITS_FILE write|compare [f16|q8]\n");
        return 2;
    }
    int n = atoi(argv[3]), threads = atoi(argv[4]);
    FILE *f = fopen(argv[2], "rb");
    if (!f || n < 1 || threads < 1) {
        fprintf(stderr, "logits_diff: cannot read %s (or bad N_TOKENS/THREADS)\n", argv[2]);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)sz + 1);
    if (!text || fread(text, 1, (size_t)sz, f) != (size_t)sz) return 1;
    text[sz] = 0;
    fclose(f);
    ks_model *model;
    if (ks_model_load(argv[1], ks_model_default_params(), &model) != KS_OK) {
        fprintf(stderr, "logits_diff: %s\n", ks_last_error());
        return 1;
    }
    size_t cap = (size_t)sz + 16, nt = 0;
    int32_t *ids = malloc(sizeof(int32_t) * cap);
    if (!ids || ks_tokenize(model, text, (size_t)sz, true, false, ids, cap, &nt) != KS_OK || (int)nt < n) {
        fprintf(stderr, "logits_diff: the text gives %zu tokens, fewer than %d\n", nt, n);
        return 1;
    }
    ks_context_params cp = ks_context_default_params();
    cp.n_ctx = n + 16;
    cp.n_threads = threads;
    cp.kv_type = argc == 8 && !strcmp(argv[7], "q8") ? KS_KV_Q8 : KS_KV_F16;
    ks_context *ctx;
    if (ks_context_create(model, cp, &ctx) != KS_OK) {
        fprintf(stderr, "logits_diff: %s\n", ks_last_error());
        return 1;
    }
    int32_t nv = ks_model_n_vocab(model);
    float *lg = malloc(sizeof(float) * nv), *ref = malloc(sizeof(float) * nv);
    if (!lg || !ref || ks_prefill(ctx, 0, ids, n, lg, NULL) != KS_OK) {
        fprintf(stderr, "logits_diff: prefill: %s\n", ks_last_error());
        return 1;
    }
    if (!strcmp(argv[6], "write")) {
        FILE *o = fopen(argv[5], "wb");
        if (!o || fwrite(lg, sizeof(float), (size_t)nv, o) != (size_t)nv || fclose(o)) return 1;
        return 0;
    }
    FILE *r = fopen(argv[5], "rb");
    if (!r || fread(ref, sizeof(float), (size_t)nv, r) != (size_t)nv) return 1;
    fclose(r);
    double num = 0, den = 0, mx = 0;
    int am = 0, bm = 0;
    for (int i = 0; i < nv; i++) {
        double d = (double)lg[i] - ref[i];
        num += d * d, den += (double)ref[i] * ref[i];
        if (fabs(d) > mx) mx = fabs(d);
        if (lg[i] > lg[am]) am = i;
        if (ref[i] > ref[bm]) bm = i;
    }
    printf("logits_diff: %d tokens: max abs %.4g, nrmse %.3g, top-1 %s (%d vs %d)\n", n, mx, sqrt(num / den),
           am == bm ? "agrees" : "DIFFERS", am, bm);
    ks_context_destroy(ctx);
    ks_model_destroy(model);
    free(text), free(ids), free(lg), free(ref);
    return 0;
}
