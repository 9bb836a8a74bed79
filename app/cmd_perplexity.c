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
#include "opts.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct ppl_state {
    char *text;
    ks_model *m;
    ks_context *ctx;
    int32_t *ids, *win;
    float *logits;
    size_t n;
    int32_t bos, V;
    bool chunk_bos, teacher;
    long body, decode_from;
    int32_t budget;
    double nll, nll2;
    long count, windows;
} ppl_state;

static int ppl_check(app_options *o) {
    long n_ctx = o->window;
    if (!o->file) { fprintf(stderr, "kvsieve perplexity: -f FILE is required\n"); return 2; }
    if (o->second_half && n_ctx < 3) {
        fprintf(stderr, "kvsieve perplexity: --score-second-half needs a window (-c) of at least 3 tokens, got %ld\n", n_ctx);
        return 2;
    }
    if (o->second_half && o->decode_from > n_ctx / 2 + 1) {
        fprintf(stderr, "kvsieve perplexity: --decode-from %ld is past the scored half of a %ld-token window (at most %ld)\n",
                o->decode_from, n_ctx, n_ctx / 2 + 1);
        return 2;
    }
    return app_resolve_model(o, true);
}

/* The text as tokens.  --score-second-half: BOS as the vocabulary's add_bos
 * says (llama.cpp's common_tokenize(..., add_special = true)); otherwise no
 * BOS here, one is put before every window. */
static int ppl_tokens(app_options *o, ppl_state *s) {
    const char *cmd = o->cmd;
    long n_ctx = o->window;
    bool second_half = o->second_half;
    size_t len = 0;
    if (!(s->text = app_read_file(cmd, o->file, &len))) return 1;
    if (!app_load_model(o, ks_model_default_params(), &s->m)) return 1;
    if (n_ctx > ks_model_n_ctx_train(s->m)) {
        fprintf(stderr, "kvsieve perplexity: window %ld exceeds the model's trained context %d\n", n_ctx, ks_model_n_ctx_train(s->m));
        return 2;
    }
    size_t n = 0;
    ks_tokenize(s->m, s->text, len, second_half, false, NULL, 0, &n);
    s->ids = malloc(sizeof(int32_t) * (n + 1));
    ks_status st = ks_tokenize(s->m, s->text, len, second_half, false, s->ids, n, &n);
    if (st != KS_OK) { app_report(cmd, "tokenizing", st); return 1; }
    s->n = n;
    s->bos = ks_token_bos(s->m);
    s->chunk_bos = second_half && s->bos >= 0 && n > 0 && s->ids[0] == s->bos; /* the vocabulary adds BOS */
    s->body = second_half ? n_ctx : s->bos >= 0 ? n_ctx - 1 : n_ctx; /* stream tokens per window */
    if ((long)n < 2 || (long)n < (s->bos >= 0 ? 1 : 2)) {
        fprintf(stderr, "kvsieve perplexity: the text has only %zu tokens\n", n);
        return 2;
    }
    if (second_half && (long)n < n_ctx) {
        fprintf(stderr, "kvsieve perplexity: --score-second-half scores whole windows only; the text has %zu tokens, "
                        "fewer than one window of %ld (-c)\n", n, n_ctx);
        return 2;
    }
    return -1;
}

static int ppl_context(app_options *o, ppl_state *s) {
    long n_ctx = o->window;
    ks_context_params cp = app_context_params(o, 0, app_budget_tokens(&o->po.budgets[0], (int32_t)n_ctx), (int32_t)n_ctx, true);
    s->budget = cp.budget;
    s->decode_from = o->decode_from;
    s->teacher = s->decode_from > 0 || strcmp(o->po.names[0], "dense") != 0 || cp.budget > 0;
    if (s->teacher && s->decode_from <= 0) s->decode_from = n_ctx / 2;
    if (!app_create_context(o, s->m, cp, "creating the context", &s->ctx)) return 1;
    s->V = ks_model_n_vocab(s->m);
    s->logits = malloc(sizeof(float) * (size_t)s->V * (size_t)n_ctx);
    s->win = malloc(sizeof(int32_t) * (size_t)n_ctx);
    return -1;
}

/* Run one window of k tokens; *first receives the first predicting position scored. */
static int ppl_window(app_options *o, ppl_state *s, long k, long *first) {
    const char *cmd = o->cmd;
    int32_t *win = s->win, V = s->V;
    ks_status st;
    ks_seq_reset(s->ctx, 0);
    *first = 0;
    if (!s->teacher) {
        if ((st = ks_prefill(s->ctx, 0, win, (int32_t)k, NULL, s->logits)) != KS_OK) { app_report(cmd, "prefill", st); return 1; }
    } else {
        long pre = s->decode_from < k ? s->decode_from : k - 1;
        if ((st = ks_prefill(s->ctx, 0, win, (int32_t)pre, NULL, s->logits + (size_t)(pre - 1) * V)) != KS_OK) { app_report(cmd, "prefill", st); return 1; }
        int32_t s0 = 0;
        for (long i = pre; i < k - 1; i++)
            if ((st = ks_decode(s->ctx, &s0, &win[i], 1, s->logits + (size_t)i * V)) != KS_OK) { app_report(cmd, "decode", st); return 1; }
        *first = pre - 1;
    }
    if (o->second_half) *first = o->window / 2; /* >= pre - 1: checked with the options */
    return -1;
}

static void ppl_score(ppl_state *s, long first, long k) {
    int32_t V = s->V;
    for (long i = first; i + 1 < k; i++) {
        const float *row = s->logits + (size_t)i * V;
        float mx = row[0];
        for (int32_t j = 1; j < V; j++) mx = row[j] > mx ? row[j] : mx;
        double se = 0;
        for (int32_t j = 0; j < V; j++) se += exp((double)row[j] - mx);
        double l = -((double)row[s->win[i + 1]] - mx - log(se));
        s->nll += l;
        s->nll2 += l * l;
        s->count++;
    }
}

static int ppl_run(app_options *o, ppl_state *s) {
    long n_ctx = o->window;
    bool second_half = o->second_half;
    for (size_t off = 0; off < s->n; off += (size_t)s->body) {
        if (o->max_windows && s->windows == o->max_windows) break;
        if (second_half && off + (size_t)n_ctx > s->n) break; /* the tail short of a window is dropped */
        long k = 0;
        if (s->bos >= 0 && !second_half) s->win[k++] = s->bos;
        long take = (long)(s->n - off) < s->body ? (long)(s->n - off) : s->body;
        memcpy(s->win + k, s->ids + off, sizeof(int32_t) * (size_t)take);
        k += take;
        if (s->chunk_bos) s->win[0] = s->bos; /* llama-perplexity: BOS replaces the chunk's first token */
        if (k < 2) break;
        long first = 0;
        int rc = ppl_window(o, s, k, &first);
        if (rc >= 0) return rc;
        ppl_score(s, first, k);
        s->windows++;
        fprintf(stderr, "\r[%ld] running ppl %.4f", s->windows, exp(s->nll / s->count));
    }
    fprintf(stderr, "\n");
    return -1;
}

static void ppl_report(const app_options *o, const ppl_state *s) {
    double mean = s->nll / s->count, var = s->nll2 / s->count - mean * mean;
    double se = sqrt(var > 0 ? var / s->count : 0);
    printf("perplexity: %.4f +/- %.4f over %ld tokens in %ld windows of %ld%s\n", exp(mean), exp(mean) * se, s->count,
           s->windows, o->window, o->second_half ? ", second halves scored" : "");
    if (s->teacher) {
        ks_stats stt;
        ks_context_stats(s->ctx, &stt);
        printf("policy %s budget %d: decoded from token %ld; attended %.1f%% of the KV entries\n", o->po.names[0],
               s->budget, s->decode_from,
               stt.kv_entries_total ? 100.0 * stt.kv_entries_attended / stt.kv_entries_total : 100.0);
    }
}

int cmd_perplexity(int argc, char **argv) {
    app_options o;
    int rc = app_parse("perplexity", argc, argv, &o);
    if (rc >= 0 || (rc = ppl_check(&o)) >= 0) return rc;
    ppl_state s = {0};
    if ((rc = ppl_tokens(&o, &s)) < 0 && (rc = ppl_context(&o, &s)) < 0 && (rc = ppl_run(&o, &s)) < 0) {
        ppl_report(&o, &s);
        rc = 0;
    }
    ks_context_destroy(s.ctx);
    ks_model_destroy(s.m);
    free(s.ids);
    free(s.win);
    free(s.logits);
    free(s.text);
    return rc;
}
