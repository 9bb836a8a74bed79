/*
 * eval.c — runs one eval instance on one context.
 *
 * The runner is deliberately the only place that touches a context, and it
 * takes the context as an argument: a dense context and a policy context go
 * through the same code, so any difference in their outputs is the
 * policy's.  For the comparison metrics a policy run must see exactly the
 * dense run's token stream, so the runner can be teacher-forced with the
 * dense tokens (opts.forced) and can keep the logits each token was chosen
 * from.  Tokens that end a GEN segment (a newline, end of generation) are
 * recorded with their logits but not fed to the context, so a forced replay
 * takes the same stop decisions at the same positions.  With a prefix
 * cache (opts.prefix) the prompt's first segment is restored where an
 * earlier run cached it: the cache restores rows byte for byte and leaves
 * the rows a policy observes to compute, so the run's logits are the
 * uncached run's bits (docs/SERVER.md, "Prefix cache") and only its time
 * differs.
 */
#include "core/core.h"
#include "eval/eval.h"
#include "eval/eval_internal.h"
#include "tensor/ops.h"

#include <string.h>

ks_eval_run_opts ks_eval_run_default_opts(void) {
    return (ks_eval_run_opts){.seq = 0, .forced = NULL, .n_forced = 0, .keep_logits = false, .prefix = NULL};
}

void ks_eval_result_free(ks_eval_result *res) {
    if (!res) return;
    ks_free(res->answer);
    ks_free(res->tokens);
    ks_free(res->logits);
    *res = (ks_eval_result){0};
}

ks_status ks_eval_run(ks_context *ctx, const ks_model *model, const ks_eval_instance *inst,
                      const ks_eval_run_opts *opts_in, ks_eval_result *out) {
    if (!ctx || !model || !inst || !out) return KS_FAIL(KS_ERR_INVALID_ARG, "eval run: null argument");
    ks_eval_run_opts opts = opts_in ? *opts_in : ks_eval_run_default_opts();
    if (opts.n_forced < 0 || (opts.n_forced > 0 && !opts.forced))
        return KS_FAIL(KS_ERR_INVALID_ARG, "eval run: bad forced tokens");
    int32_t V = ks_model_n_vocab(model);
    int32_t gen_cap = 0, n_gen_segs = 0;
    for (int32_t i = 0; i < inst->n_segs; i++)
        if (inst->segs[i].kind == KS_EVAL_SEG_GEN) {
            gen_cap += inst->segs[i].max_tokens;
            n_gen_segs++;
        }
    float *logits = ks_malloc(sizeof(float) * (size_t)V);              /* [V] */
    int32_t *tokens = ks_malloc(sizeof(int32_t) * (size_t)(gen_cap + 1)); /* [gen_cap] */
    float *kept = opts.keep_logits ? ks_malloc(sizeof(float) * (size_t)V * (size_t)(gen_cap + 1)) : NULL;
    char **gen_text = ks_calloc((size_t)n_gen_segs + 1, sizeof(char *)); /* [n_gen_segs] */
    int32_t *ids = NULL;
    size_t ids_cap = 0;
    int32_t n_prompt = 0, n_gen = 0, gi = 0, n_restored = 0;
    ks_status st = !logits || !tokens || (opts.keep_logits && !kept) || !gen_text
                       ? KS_FAIL(KS_ERR_NOMEM, "eval run buffers (%d tokens)", gen_cap)
                       : KS_OK;
    ks_seq_reset(ctx, opts.seq);
    double t0 = ks_time_sec();
    for (int32_t si = 0; si < inst->n_segs && st == KS_OK; si++) {
        const ks_eval_seg *sg = &inst->segs[si];
        if (sg->kind == KS_EVAL_SEG_TEXT) {
            size_t n = 0;
            size_t len = strlen(sg->text);
            for (int pass = 0; pass < 2; pass++) {
                st = si == 0 ? ks_tokenize(model, sg->text, len, true, false, ids, ids_cap, &n)
                             : ks_eval_tokenize_cont(model, sg->text, ids, ids_cap, &n);
                if (st != KS_ERR_INVALID_ARG || n <= ids_cap) break;
                int32_t *grown = ks_realloc(ids, sizeof(int32_t) * (n + 1));
                if (!grown) {
                    st = KS_FAIL(KS_ERR_NOMEM, "prompt of %zu tokens", n);
                    break;
                }
                ids = grown;
                ids_cap = n;
            }
            if (st != KS_OK) break;
            if (n == 0) continue;
            /* the prompt's first segment starts the (reset) sequence: a cache can give its rows */
            if (opts.prefix && ks_seq_len(ctx, opts.seq) == 0)
                st = ks_prefill_cached(ctx, opts.prefix, opts.seq, ids, (int32_t)n, logits, &n_restored);
            else st = ks_prefill(ctx, opts.seq, ids, (int32_t)n, logits, NULL);
            n_prompt += (int32_t)n;
            continue;
        }
        ks_eval_sbuf text = {0};
        bool last = true;
        for (int32_t k = si + 1; k < inst->n_segs; k++) last &= inst->segs[k].kind != KS_EVAL_SEG_TEXT;
        for (int32_t t = 0; t < sg->max_tokens; t++) {
            int32_t tok = n_gen < opts.n_forced ? opts.forced[n_gen] : ks_argmax(logits, V);
            if (tok < 0 || tok >= V) {
                st = KS_FAIL(KS_ERR_INVALID_ARG, "eval run: forced token %d outside the vocabulary", tok);
                break;
            }
            if (kept) memcpy(kept + (size_t)n_gen * V, logits, sizeof(float) * (size_t)V);
            tokens[n_gen++] = tok;
            if (ks_token_is_eog(model, tok)) break;
            char piece[128];
            size_t np = 0;
            if (ks_token_to_piece(model, tok, piece, sizeof piece, &np) != KS_OK) np = 0;
            if (sg->stop_newline && memchr(piece, '\n', np)) break;
            ks_eval_sbuf_putn(&text, piece, np);
            if (last && t + 1 == sg->max_tokens) break; /* nothing reads its logits */
            if ((st = ks_decode(ctx, &opts.seq, &tok, 1, logits)) != KS_OK) break;
        }
        if (!(gen_text[gi++] = ks_eval_sbuf_take(&text)) && st == KS_OK)
            st = KS_FAIL(KS_ERR_NOMEM, "generated text");
    }
    double secs = ks_time_sec() - t0;
    if (st == KS_OK) {
        const char *answer = gi ? gen_text[gi - 1] : "";
        /* longgen: every GEN but the last is a list item */
        *out = (ks_eval_result){
            .score = ks_eval_score(inst, answer, (const char *const *)gen_text, gi > 0 ? gi - 1 : 0),
            .answer = ks_strdup(answer), /* checked below */
            .n_prompt = n_prompt,
            .n_gen = n_gen,
            .n_restored = n_restored,
            .tokens = tokens,
            .logits = kept,
            .seconds = secs,
        };
        tokens = NULL;
        kept = NULL;
        if (!out->answer) {
            ks_free(out->tokens);
            ks_free(out->logits);
            *out = (ks_eval_result){0};
            st = KS_FAIL(KS_ERR_NOMEM, "the answer");
        }
    }
    for (int32_t i = 0; gen_text && i < gi; i++) ks_free(gen_text[i]);
    ks_free(gen_text);
    ks_free(ids);
    ks_free(logits);
    ks_free(tokens);
    ks_free(kept);
    return st;
}
