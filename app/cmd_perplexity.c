/*
 * cmd_perplexity.c — `kvsieve perplexity -m M -f TEXT`.
 *
 * The text is cut into windows of -c tokens; each window is prefilled from an
 * empty sequence (BOS first) and every token after the first is scored by the
 * logits of its predecessor.  The result is exp(mean NLL) with a standard
 * error from the per-token NLL variance.
 *
 * With a selection policy (--policy/--budget), or --decode-from N, the first N
 * tokens of each window (default half the window) are prefilled and every
 * later token is fed by a decode step, so each scored prediction is made by
 * the policy's sparse attention over the KV — teacher-forced decoding.
 *
 * --score-second-half reproduces llama.cpp's llama-perplexity, so figures can
 * be set beside the ones it prints: the text is tokenized with BOS when the
 * vocabulary asks for one, cut into whole chunks of -c tokens (a shorter tail
 * is dropped), the first token of every chunk is replaced by BOS, and only
 * the predictions from position c/2 on are scored — every scored token has
 * at least half a window of context.  The default mode also scores the
 * first tokens of a window, which have little context, so on the same text
 * its figure is usually higher.
 */
#include "args.h"
#include "commands.h"
#include "kvsieve.h"
#include "policy_opts.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cmd_perplexity(int argc, char **argv) {
    const char *cmd = "perplexity", *model_path = NULL, *file = NULL;
    long n_ctx = 512, n_threads = 0, max_windows = 0, decode_from = -1;
    bool second_half = false;
    app_policy_opts po;
    app_policy_opts_init(&po);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int pr = app_policy_opt(cmd, argc, argv, &i, &po, false);
        if (pr < 0) return 2;
        if (pr > 0) continue;
        if (!strcmp(a, "-m")) { if (!(v = arg_value(cmd, argc, argv, &i))) return 2; model_path = v; }
        else if (!strcmp(a, "-f")) { if (!(v = arg_value(cmd, argc, argv, &i))) return 2; file = v; }
        else if (!strcmp(a, "-c")) { if (!(v = arg_value(cmd, argc, argv, &i)) || !arg_long(cmd, a, v, 2, 1 << 20, &n_ctx)) return 2; }
        else if (!strcmp(a, "-t")) { if (!(v = arg_value(cmd, argc, argv, &i)) || !arg_long(cmd, a, v, 1, 1024, &n_threads)) return 2; }
        else if (!strcmp(a, "--windows")) { if (!(v = arg_value(cmd, argc, argv, &i)) || !arg_long(cmd, a, v, 1, 1 << 20, &max_windows)) return 2; }
        else if (!strcmp(a, "--decode-from")) { if (!(v = arg_value(cmd, argc, argv, &i)) || !arg_long(cmd, a, v, 1, 1 << 24, &decode_from)) return 2; }
        else if (!strcmp(a, "--score-second-half")) second_half = true;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: kvsieve perplexity [-m MODEL.gguf] -f TEXT [-c WINDOW (512)] [-t THREADS] [--windows N]\n"
                   "                          [--score-second-half] [--decode-from N] [policy flags]\n"
                   "  --score-second-half  score only the second half of each window of -c tokens, as llama.cpp's\n"
                   "                       llama-perplexity does (whole windows only, BOS first): comparable figures\n%s",
                   app_policy_usage());
            return 0;
        } else { fprintf(stderr, "kvsieve perplexity: unknown option '%s'\n", a); return 2; }
    }
    if (!file) { fprintf(stderr, "kvsieve perplexity: -f FILE is required\n"); return 2; }
    if (second_half && n_ctx < 3) {
        fprintf(stderr, "kvsieve perplexity: --score-second-half needs a window (-c) of at least 3 tokens, got %ld\n", n_ctx);
        return 2;
    }
    if (second_half && decode_from > n_ctx / 2 + 1) {
        fprintf(stderr, "kvsieve perplexity: --decode-from %ld is past the scored half of a %ld-token window (at most %ld)\n",
                decode_from, n_ctx, n_ctx / 2 + 1);
        return 2;
    }
    if (!model_path) model_path = app_default_model();
    po.model_path = model_path;
    if (!model_path) { fprintf(stderr, "kvsieve perplexity: no model given (-m)\n"); return 2; }
    if (!app_policy_calibration(&po, cmd, model_path)) return 2;
    size_t len = 0;
    char *text = app_read_file(cmd, file, &len);
    if (!text) return 1;
    int rc = 1;
    ks_model *m = NULL;
    ks_context *ctx = NULL;
    int32_t *ids = NULL;
    float *logits = NULL;
    ks_status st = ks_model_load(model_path, ks_model_default_params(), &m);
    if (st != KS_OK) { app_report(cmd, "loading the model", st); goto done; }
    if (n_ctx > ks_model_n_ctx_train(m)) {
        fprintf(stderr, "kvsieve perplexity: window %ld exceeds the model's trained context %d\n", n_ctx, ks_model_n_ctx_train(m));
        rc = 2;
        goto done;
    }
    /* --score-second-half: BOS as the vocabulary's add_bos says (llama.cpp's
     * common_tokenize(..., add_special = true)); otherwise no BOS here, one is
     * put before every window below */
    size_t n = 0;
    ks_tokenize(m, text, len, second_half, false, NULL, 0, &n);
    ids = malloc(sizeof(int32_t) * (n + 1));
    if ((st = ks_tokenize(m, text, len, second_half, false, ids, n, &n)) != KS_OK) { app_report(cmd, "tokenizing", st); goto done; }
    int32_t bos = ks_token_bos(m);
    bool chunk_bos = second_half && bos >= 0 && n > 0 && ids[0] == bos; /* the vocabulary adds BOS */
    long body = second_half ? n_ctx : bos >= 0 ? n_ctx - 1 : n_ctx; /* stream tokens per window */
    if ((long)n < 2 || (long)n < (bos >= 0 ? 1 : 2)) {
        fprintf(stderr, "kvsieve perplexity: the text has only %zu tokens\n", n);
        rc = 2;
        goto done;
    }
    if (second_half && (long)n < n_ctx) {
        fprintf(stderr, "kvsieve perplexity: --score-second-half scores whole windows only; the text has %zu tokens, "
                        "fewer than one window of %ld (-c)\n", n, n_ctx);
        rc = 2;
        goto done;
    }
    ks_context_params cp = ks_context_default_params();
    cp.n_ctx = (int32_t)n_ctx;
    cp.n_threads = (int32_t)n_threads;
    app_policy_apply(&po, 0, app_budget_tokens(&po.budgets[0], (int32_t)n_ctx), &cp);
    cp.n_ctx += ks_policy_prefill_room(cp.policy, cp.policy_args); /* room for DapQ's pseudo tokens */
    bool teacher = decode_from > 0 || strcmp(po.names[0], "dense") != 0 || cp.budget > 0;
    if (teacher && decode_from <= 0) decode_from = n_ctx / 2;
    if ((st = ks_context_create(m, cp, &ctx)) != KS_OK) { app_report(cmd, "creating the context", st); goto done; }
    int32_t V = ks_model_n_vocab(m);
    logits = malloc(sizeof(float) * (size_t)V * (size_t)n_ctx);
    int32_t *win = malloc(sizeof(int32_t) * (size_t)n_ctx);
    double nll = 0, nll2 = 0;
    long count = 0, windows = 0;
    for (size_t off = 0; off < n; off += (size_t)body) {
        if (max_windows && windows == max_windows) break;
        if (second_half && off + (size_t)n_ctx > n) break; /* the tail short of a window is dropped */
        long k = 0;
        if (bos >= 0 && !second_half) win[k++] = bos;
        long take = (long)(n - off) < body ? (long)(n - off) : body;
        memcpy(win + k, ids + off, sizeof(int32_t) * (size_t)take);
        k += take;
        if (chunk_bos) win[0] = bos; /* llama-perplexity: BOS replaces the chunk's first token */
        if (k < 2) break;
        ks_seq_reset(ctx, 0);
        long first = 0; /* first predicting position scored */
        if (!teacher) {
            if ((st = ks_prefill(ctx, 0, win, (int32_t)k, NULL, logits)) != KS_OK) { app_report(cmd, "prefill", st); free(win); goto done; }
        } else {
            long pre = decode_from < k ? decode_from : k - 1;
            if ((st = ks_prefill(ctx, 0, win, (int32_t)pre, NULL, logits + (size_t)(pre - 1) * V)) != KS_OK) { app_report(cmd, "prefill", st); free(win); goto done; }
            int32_t s0 = 0;
            for (long i = pre; i < k - 1; i++)
                if ((st = ks_decode(ctx, &s0, &win[i], 1, logits + (size_t)i * V)) != KS_OK) { app_report(cmd, "decode", st); free(win); goto done; }
            first = pre - 1;
        }
        if (second_half) first = n_ctx / 2; /* >= pre - 1: checked with the options */
        for (long i = first; i + 1 < k; i++) {
            const float *row = logits + (size_t)i * V;
            float mx = row[0];
            for (int32_t j = 1; j < V; j++) mx = row[j] > mx ? row[j] : mx;
            double se = 0;
            for (int32_t j = 0; j < V; j++) se += exp((double)row[j] - mx);
            double l = -((double)row[win[i + 1]] - mx - log(se));
            nll += l;
            nll2 += l * l;
            count++;
        }
        windows++;
        fprintf(stderr, "\r[%ld] running ppl %.4f", windows, exp(nll / count));
    }
    free(win);
    fprintf(stderr, "\n");
    double mean = nll / count, var = nll2 / count - mean * mean;
    double se = sqrt(var > 0 ? var / count : 0);
    printf("perplexity: %.4f +/- %.4f over %ld tokens in %ld windows of %ld%s\n", exp(mean), exp(mean) * se, count,
           windows, n_ctx, second_half ? ", second halves scored" : "");
    if (teacher) {
        ks_stats stt;
        ks_context_stats(ctx, &stt);
        printf("policy %s budget %d: decoded from token %ld; attended %.1f%% of the KV entries\n", po.names[0],
               cp.budget, decode_from, stt.kv_entries_total ? 100.0 * stt.kv_entries_attended / stt.kv_entries_total : 100.0);
    }
    rc = 0;
done:
    ks_context_destroy(ctx);
    ks_model_destroy(m);
    free(ids);
    free(logits);
    free(text);
    return rc;
}
