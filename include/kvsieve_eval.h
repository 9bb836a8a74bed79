/*
 * kvsieve_eval.h — the long-context evaluation harness behind `kvsieve eval`
 * (public: the CLI, and any application, runs the harness through it; the
 * module's own src/eval/eval.h includes this header).
 *
 * Sparse attention is only worth having if it answers long-context questions
 * as well as dense attention does, so the harness has three parts that the
 * policies of later issues plug into without change:
 *
 *   - task generators (eval_tasks.c): synthetic, seeded, deterministic
 *     prompts in the RULER family (passkey, multi-key and multi-value
 *     needles, variable tracking) plus a long-generation task that is scored
 *     against the model's *own* earlier output.  Each prompt is sized in the
 *     tokens of the model under test, because a policy's budget is counted in
 *     tokens, not characters;
 *   - metrics (eval_metrics.c): pure functions over strings, token streams,
 *     logits and attention probabilities, so each can be checked by hand;
 *   - the runner (eval.c): one instance on one context, returning the
 *     generated tokens and, on request, the logits behind them, so that a
 *     policy context can later be teacher-forced with the dense run's tokens
 *     and compared position by position (agreement, KL);
 *   - plots (eval_svg.c): plain SVG text, no plotting dependency.
 *
 * Everything here is library code: it never prints or exits; the CLI does.
 */
#ifndef KVSIEVE_EVAL_H
#define KVSIEVE_EVAL_H

#include "kvsieve.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------- tasks -- */
typedef enum ks_eval_task {
    KS_EVAL_PASSKEY = 0, /* one 5-digit key in filler; answer: the digits */
    KS_EVAL_MULTIKEY,    /* several key -> number needles; asked: one key */
    KS_EVAL_MULTIVALUE,  /* one key with several numbers; asked: all of them */
    KS_EVAL_VARTRACK,    /* VAR chains; asked: every name bound to a value */
    KS_EVAL_LONGGEN,     /* model writes a list, later repeats one item */
    KS_EVAL_TASK_COUNT
} ks_eval_task;

const char *ks_eval_task_name(ks_eval_task task);
/* "passkey", "multikey", ...; KS_ERR_NOT_FOUND for an unknown name. */
ks_status ks_eval_task_parse(const char *name, ks_eval_task *out);

/* Lengths land in [target - tol, target] with tol = max(2% of target,
 * KS_EVAL_LEN_SLACK) tokens: the absolute slack only matters for toy
 * contexts, where one filler word is already 2%. */
#define KS_EVAL_LEN_TOL 0.02
#define KS_EVAL_LEN_SLACK 4
#define KS_EVAL_MAX_ANSWERS 8
#define KS_EVAL_ANSWER_CAP 16

/* One step of an instance's script.  Plain tasks are [TEXT, GEN]; longgen
 * interleaves item labels (TEXT) with the model's items (GEN, stopped at a
 * newline) before the long stretch and the final question. */
typedef enum ks_eval_seg_kind { KS_EVAL_SEG_TEXT, KS_EVAL_SEG_GEN } ks_eval_seg_kind;
typedef struct ks_eval_seg {
    ks_eval_seg_kind kind;
    char *text;          /* TEXT: the text appended (owned) */
    int32_t max_tokens;  /* GEN: decode budget */
    bool stop_newline;   /* GEN: stop at the first generated newline */
} ks_eval_seg;

typedef struct ks_eval_instance {
    ks_eval_task task;
    uint64_t seed;
    int32_t target_tokens;  /* the length asked for: prompt + every decode budget */
    double depth;           /* requested evidence depth in [0, 1] */
    int32_t n_segs;
    ks_eval_seg *segs;      /* [n_segs] (owned) */
    char *prompt;           /* all TEXT segments joined, for display/tests (owned) */
    int32_t n_prompt;       /* tokens of the TEXT segments, BOS included */
    int32_t n_total;        /* n_prompt + every GEN budget: what the context must hold */
    /* Evidence token span [begin, end) in the full script; for longgen it is
     * the span reserved for the model's list.  The haystack is the filler
     * region the evidence is placed in; depth_actual is where the evidence
     * landed inside it (0: first token, 1: last possible start). */
    int32_t evidence_begin, evidence_end;
    int32_t haystack_begin, haystack_end;
    double depth_actual;
    int32_t n_needles;      /* needles (or list items) the instance carries */
    int32_t n_answers;
    char answers[KS_EVAL_MAX_ANSWERS][KS_EVAL_ANSWER_CAP]; /* expected strings; longgen: "" (own output) */
    int32_t longgen_item;   /* longgen: the 1-based item asked for */
} ks_eval_instance;

/* Build one instance for `model`'s tokenizer.  target_tokens is the whole
 * sequence (prompt plus decode budgets), depth in [0, 1].  Tasks shed
 * distractors (then the intro) to fit short targets; a target too short even
 * for the smallest form fails with KS_ERR_INVALID_ARG. */
ks_status ks_eval_generate(ks_eval_task task, uint64_t seed, int32_t target_tokens, double depth,
                           const ks_model *model, ks_eval_instance *out);
void ks_eval_instance_free(ks_eval_instance *inst);

/* Tokenize text that continues a sequence (no BOS, no SPM space prefix
 * injected at the seam).  *n_out as in ks_tokenize. */
ks_status ks_eval_tokenize_cont(const ks_model *model, const char *text, int32_t *ids, size_t cap,
                                size_t *n_out);

/* ----------------------------------------------------------- runner -- */
typedef struct ks_eval_run_opts {
    int32_t seq;              /* sequence of the context to use (reset first) */
    const int32_t *forced;    /* [n_forced] teacher-forced GEN tokens, or NULL: greedy */
    int32_t n_forced;
    bool keep_logits;         /* keep [n_gen][n_vocab] logits behind the GEN tokens */
    ks_prefix_cache *prefix;  /* optional (borrowed): the first TEXT segment through it (ks_prefill_cached):
                               * restored where a run of the same prompt, KV layout and prefill setting
                               * cached it, then captured for the next; the logits are the same bits */
} ks_eval_run_opts;
ks_eval_run_opts ks_eval_run_default_opts(void);

typedef struct ks_eval_result {
    double score;         /* task score in [0, 1] (see ks_eval_score) */
    char *answer;         /* text of the last GEN segment (owned) */
    int32_t n_prompt;     /* tokens prefilled (TEXT segments) */
    int32_t n_gen;        /* tokens decoded (GEN segments) */
    int32_t n_restored;   /* of n_prompt, rows restored from opts.prefix instead of computed */
    int32_t *tokens;      /* [n_gen] decoded tokens, all GEN segments in order (owned) */
    float *logits;        /* [n_gen][n_vocab] logits each token was chosen from, or NULL (owned) */
    double seconds;       /* wall time of prefill + decode */
} ks_eval_result;

/* Run one instance on ctx: prefill TEXT, greedily decode GEN (or follow
 * opts.forced, so a policy context can be scored on the dense tokens). */
ks_status ks_eval_run(ks_context *ctx, const ks_model *model, const ks_eval_instance *inst,
                      const ks_eval_run_opts *opts, ks_eval_result *out);
void ks_eval_result_free(ks_eval_result *res);

/* ---------------------------------------------------------- metrics -- */
/* Task score of `output` for the instance (definitions in docs/EVAL.md):
 * passkey/multikey: 1 if the first number in the first line equals the
 * answer; multivalue/vartrack: share of expected answers found among the
 * numbers/words of the output; longgen: 1 if the output repeats the model's
 * own item k (items: [n_items] the model's list items as generated), 0 if
 * item k is empty or equal to another item (uninformative). */
double ks_eval_score(const ks_eval_instance *inst, const char *output, const char *const *items,
                     int32_t n_items);
/* First maximal digit run of s (first line only) into buf; false if none. */
bool ks_eval_first_number(const char *s, char *buf, size_t cap);
/* Teacher-forced agreement: share of rows whose argmax is equal.
 * a, b: [n_pos][n_vocab]. */
ks_status ks_eval_top1_agreement(const float *a, const float *b, int32_t n_pos, int32_t n_vocab,
                                 double *out);
/* Free-running agreement: share of positions i < n with a[i] == b[i]. */
ks_status ks_eval_token_agreement(const int32_t *a, const int32_t *b, int32_t n, double *out);
/* Mean over positions of KL(softmax(p) || softmax(q)), from logits via
 * log-softmax.  p, q: [n_pos][n_vocab]. */
ks_status ks_eval_mean_kl(const float *p, const float *q, int32_t n_pos, int32_t n_vocab,
                          double *out);
/* Attention recall: for each (layer, head), the share of its attention mass
 * over n_kv positions that the selected indices cover.
 * probs: [n_layer][n_head][n_kv]; sel: [n_layer][n_head][n_sel] (indices in
 * [0, n_kv), duplicates counted once); per_head (optional): [n_layer][n_head];
 * *mean: average over layers and heads. */
ks_status ks_eval_attention_recall(const float *probs, int32_t n_layer, int32_t n_head, int32_t n_kv,
                                   const int32_t *sel, int32_t n_sel, double *per_head,
                                   double *mean);

/* -------------------------------------------------------------- svg -- */
typedef struct ks_eval_series {
    const char *name;
    int32_t n;
    const double *x; /* [n] budget (tokens) */
    const double *y; /* [n] accuracy in [0, 1] */
    bool reference;  /* draw y[0] as a dashed horizontal line (dense) */
} ks_eval_series;

/* Accuracy vs budget: one line per policy, axes, ticks and a legend. */
ks_status ks_eval_svg_budget_chart(const char *title, const ks_eval_series *series, int32_t n_series,
                                   char **out_svg);
/* Depth x length heat map; acc: [n_depth][n_len], NaN = not run. */
ks_status ks_eval_svg_heatmap(const char *title, const int32_t *lengths, int32_t n_len,
                              const double *depths, int32_t n_depth, const double *acc,
                              char **out_svg);
/* Stack complete SVG documents vertically into one (each becomes a nested
 * <svg>). */
ks_status ks_eval_svg_stack(const char *const *docs, int32_t n_docs, char **out_svg);

#ifdef __cplusplus
}
#endif
#endif
