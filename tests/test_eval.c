/*
 * test_eval.c — the eval harness: task generators, metrics, SVG, runner.
 *
 * Generators are checked where a silent mistake would make every later
 * accuracy figure meaningless: the same seed must give the same prompt (or
 * runs are not comparable across policies), lengths must sit inside the
 * documented tolerance and never over the target (the context has exactly
 * that many slots), the evidence must sit at the requested depth and
 * actually be inside the span the instance reports, and the answer must be
 * in the prompt.  Token counts use a real SentencePiece vocabulary (the
 * llama-spm fixture, vocab only) at 1K and 4K tokens.
 *
 * Metrics are checked on cases small enough to work out by hand.  The
 * runner is checked on the real aidreams260K model: a teacher-forced replay
 * of its own tokens must reproduce them with KL 0 and agreement 1, which is
 * the contract a policy context will be compared under.
 */
#include "testutil.h"

#include "core/core.h"
#include "eval/eval.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static ks_model *g_vocab;

static int setup_vocab(void **state) {
    (void)state;
    ks_model_params p = ks_model_default_params();
    p.vocab_only = true;
    return ks_model_load(ks_test_fixture("tokenizer/ggml-vocab-llama-spm.gguf"), p, &g_vocab) == KS_OK ? 0 : -1;
}

static int teardown_vocab(void **state) {
    (void)state;
    ks_model_destroy(g_vocab);
    return 0;
}

static ks_eval_instance gen(ks_eval_task t, uint64_t seed, int32_t len, double depth) {
    ks_eval_instance inst;
    ks_status st = ks_eval_generate(t, seed, len, depth, g_vocab, &inst);
    if (st != KS_OK) fail_msg("%s len %d depth %g: %s", ks_eval_task_name(t), len, depth, ks_last_error());
    return inst;
}

static void test_task_names(void **state) {
    (void)state;
    for (int t = 0; t < KS_EVAL_TASK_COUNT; t++) {
        ks_eval_task got;
        assert_int_equal(ks_eval_task_parse(ks_eval_task_name((ks_eval_task)t), &got), KS_OK);
        assert_int_equal(got, t);
    }
    ks_eval_task got;
    assert_int_equal(ks_eval_task_parse("nope", &got), KS_ERR_NOT_FOUND);
}

static void test_deterministic(void **state) {
    (void)state;
    for (int t = 0; t < KS_EVAL_TASK_COUNT; t++) {
        ks_eval_instance a = gen((ks_eval_task)t, 7, 1024, 0.5), b = gen((ks_eval_task)t, 7, 1024, 0.5);
        ks_eval_instance c = gen((ks_eval_task)t, 8, 1024, 0.5);
        assert_string_equal(a.prompt, b.prompt);
        assert_int_equal(a.n_total, b.n_total);
        assert_int_equal(a.n_answers, b.n_answers);
        for (int i = 0; i < a.n_answers; i++) assert_string_equal(a.answers[i], b.answers[i]);
        assert_true(strcmp(a.prompt, c.prompt) != 0);
        ks_eval_instance_free(&a);
        ks_eval_instance_free(&b);
        ks_eval_instance_free(&c);
    }
}

/* Decoded text of prompt tokens [begin, end). */
static char *span_text(const char *prompt, int32_t begin, int32_t end) {
    size_t n = 0, len = strlen(prompt);
    ks_tokenize(g_vocab, prompt, len, true, false, NULL, 0, &n);
    int32_t *ids = malloc(sizeof(int32_t) * (n + 1));
    assert_int_equal(ks_tokenize(g_vocab, prompt, len, true, false, ids, n + 1, &n), KS_OK);
    assert_true(begin >= 0 && end <= (int32_t)n && begin <= end);
    char *out = calloc(1, 64 * (size_t)(end - begin) + 1);
    size_t at = 0;
    for (int32_t i = begin; i < end; i++) {
        size_t np = 0;
        assert_int_equal(ks_token_to_piece(g_vocab, ids[i], out + at, 64, &np), KS_OK);
        at += np;
    }
    out[at] = '\0';
    free(ids);
    return out;
}

static void test_lengths_and_evidence(void **state) {
    (void)state;
    static const int32_t lens[] = {1024, 4096};
    static const double depths[] = {0.0, 0.5, 1.0};
    for (int t = 0; t < KS_EVAL_TASK_COUNT; t++)
        for (int li = 0; li < 2; li++)
            for (int di = 0; di < 3; di++) {
                int32_t L = lens[li];
                ks_eval_instance x = gen((ks_eval_task)t, 100 + di, L, depths[di]);
                int32_t tol = (int32_t)floor(L * KS_EVAL_LEN_TOL);
                if (x.n_total > L || x.n_total < L - tol)
                    fail_msg("%s: total %d outside [%d, %d]", ks_eval_task_name(x.task), x.n_total, L - tol, L);
                if (fabs(x.depth_actual - depths[di]) > 0.06)
                    fail_msg("%s len %d: evidence at depth %.3f, asked %.2f", ks_eval_task_name(x.task), L,
                             x.depth_actual, depths[di]);
                assert_true(x.haystack_begin <= x.evidence_begin && x.evidence_end <= x.haystack_end);
                if (x.task == KS_EVAL_LONGGEN) {
                    assert_true(x.longgen_item >= 1 && x.longgen_item <= x.n_needles);
                    ks_eval_instance_free(&x);
                    continue;
                }
                /* token count of the prompt is what the tokenizer says */
                size_t n = 0;
                ks_tokenize(g_vocab, x.prompt, strlen(x.prompt), true, false, NULL, 0, &n);
                assert_int_equal((int32_t)n, x.n_prompt);
                /* every answer is in the prompt, and in the evidence span */
                char *ev = span_text(x.prompt, x.evidence_begin, x.evidence_end);
                for (int i = 0; i < x.n_answers; i++) {
                    assert_non_null(strstr(x.prompt, x.answers[i]));
                    if (!strstr(ev, x.answers[i]))
                        fail_msg("%s: answer %s not in evidence span '%s'", ks_eval_task_name(x.task), x.answers[i], ev);
                }
                free(ev);
                ks_eval_instance_free(&x);
            }
}

static void test_too_short(void **state) {
    (void)state;
    ks_eval_instance x;
    assert_int_equal(ks_eval_generate(KS_EVAL_MULTIVALUE, 1, 20, 0.5, g_vocab, &x), KS_ERR_INVALID_ARG);
    assert_int_equal(ks_eval_generate(KS_EVAL_PASSKEY, 1, 1024, 1.5, g_vocab, &x), KS_ERR_INVALID_ARG);
    /* short targets shed distractors instead of failing */
    x = gen(KS_EVAL_MULTIKEY, 1, 4096, 0.5);
    int32_t big = x.n_needles;
    ks_eval_instance_free(&x);
    x = gen(KS_EVAL_MULTIKEY, 1, 60, 0.5);
    assert_true(x.n_needles < big && x.n_total <= 60);
    ks_eval_instance_free(&x);
}

/* ------------------------------------------------------------ metrics -- */

static void test_score(void **state) {
    (void)state;
    ks_eval_instance x = {.task = KS_EVAL_PASSKEY, .n_answers = 1};
    strcpy(x.answers[0], "12345");
    assert_true(ks_eval_score(&x, " 12345. Remember", NULL, 0) == 1.0);
    assert_true(ks_eval_score(&x, "\n  12345", NULL, 0) == 1.0);
    assert_true(ks_eval_score(&x, " 123456", NULL, 0) == 0.0);  /* whole digit run */
    assert_true(ks_eval_score(&x, " 54321 12345", NULL, 0) == 0.0); /* first number only */
    assert_true(ks_eval_score(&x, " none\n12345", NULL, 0) == 0.0);  /* first line only */
    char buf[8];
    assert_false(ks_eval_first_number("abc", buf, sizeof buf));
    x.task = KS_EVAL_MULTIVALUE;
    x.n_answers = 4;
    strcpy(x.answers[1], "11111");
    strcpy(x.answers[2], "22222");
    strcpy(x.answers[3], "33333");
    assert_true(ks_eval_score(&x, " 22222, 12345 and 99999", NULL, 0) == 0.5);
    x.task = KS_EVAL_VARTRACK;
    x.n_answers = 2;
    strcpy(x.answers[0], "ABCDE");
    strcpy(x.answers[1], "QWERT");
    assert_true(ks_eval_score(&x, " abcde, QWERTY", NULL, 0) == 0.5); /* case-insensitive, whole word */
    x.task = KS_EVAL_LONGGEN;
    x.longgen_item = 2;
    const char *items[] = {" 11111", " 48213", " the cat"};
    assert_true(ks_eval_score(&x, " 48213", items, 3) == 1.0);
    assert_true(ks_eval_score(&x, " 48214", items, 3) == 0.0);
    assert_true(ks_eval_score(&x, "48213", items, 1) == 0.0); /* item 2 missing */
    x.longgen_item = 3;
    assert_true(ks_eval_score(&x, "  The  Cat\nmore", items, 3) == 1.0); /* no digits: normalised text */
    const char *same[] = {" 7", " 7"}, *empty[] = {"", ""};
    x.longgen_item = 1;
    assert_true(ks_eval_score(&x, " 7", same, 2) == 0.0);  /* repeated item: uninformative */
    assert_true(ks_eval_score(&x, "", empty, 2) == 0.0);   /* nothing to be consistent with */
    assert_true(ks_eval_score(&x, "1", NULL, 0) == 0.0);
}

static void test_agreement_kl(void **state) {
    (void)state;
    /* [2][3] */
    const float a[] = {1, 2, 3, 0, 0, 5};
    const float b[] = {3, 2, 1, 0, 1, 6};
    double v;
    assert_int_equal(ks_eval_top1_agreement(a, a, 2, 3, &v), KS_OK);
    assert_true(v == 1.0);
    assert_int_equal(ks_eval_top1_agreement(a, b, 2, 3, &v), KS_OK);
    assert_true(v == 0.5);
    const int32_t ta[] = {1, 2, 3, 4}, tb[] = {1, 2, 0, 4};
    assert_int_equal(ks_eval_token_agreement(ta, tb, 4, &v), KS_OK);
    assert_true(v == 0.75);
    assert_int_equal(ks_eval_mean_kl(a, a, 2, 3, &v), KS_OK);
    assert_true(v == 0.0);
    /* shifting logits by a constant changes nothing */
    const float a_shift[] = {101, 102, 103, 1000, 1000, 1005};
    assert_int_equal(ks_eval_mean_kl(a, a_shift, 2, 3, &v), KS_OK);
    assert_true(v < 1e-12);
    /* by hand: P = (1/2, 1/2), Q = (1/(1+e), e/(1+e)) from logits (0,0) and (0,1):
     * KL = 1/2 log((1/2)(1+e)) + 1/2 log((1/2)(1+e)/e) = log((1+e)/2) - 1/2 */
    const float p[] = {0, 0}, q[] = {0, 1};
    assert_int_equal(ks_eval_mean_kl(p, q, 1, 2, &v), KS_OK);
    assert_true(fabs(v - (log((1 + exp(1.0)) / 2) - 0.5)) < 1e-9);
    /* large logits stay finite */
    const float big[] = {1e4f, 0}, big2[] = {0, 1e4f};
    assert_int_equal(ks_eval_mean_kl(big, big2, 1, 2, &v), KS_OK);
    assert_true(isfinite(v) && fabs(v - 1e4) < 1e-3);
    assert_int_equal(ks_eval_mean_kl(a, b, 0, 3, &v), KS_ERR_INVALID_ARG);
}

static void test_attention_recall(void **state) {
    (void)state;
    /* [1 layer][2 heads][4 kv] */
    const float probs[] = {0.5f, 0.25f, 0.125f, 0.125f, 0.1f, 0.2f, 0.3f, 0.4f};
    const int32_t all[] = {0, 1, 2, 3, 3, 2, 1, 0};
    double per[2], mean;
    assert_int_equal(ks_eval_attention_recall(probs, 1, 2, 4, all, 4, per, &mean), KS_OK);
    assert_true(fabs(mean - 1.0) < 1e-12 && fabs(per[0] - 1) < 1e-12 && fabs(per[1] - 1) < 1e-12);
    /* [1][2][2]: head 0 keeps {0, 0} (duplicate counted once) = 0.5; head 1 keeps {2, 3} = 0.7 */
    const int32_t some[] = {0, 0, 2, 3};
    assert_int_equal(ks_eval_attention_recall(probs, 1, 2, 4, some, 2, per, &mean), KS_OK);
    assert_true(fabs(per[0] - 0.5) < 1e-6 && fabs(per[1] - 0.7) < 1e-6 && fabs(mean - 0.6) < 1e-6);
    assert_int_equal(ks_eval_attention_recall(probs, 1, 2, 4, NULL, 0, per, &mean), KS_OK);
    assert_true(mean == 0.0);
    const int32_t bad[] = {0, 4, 0, 0};
    assert_int_equal(ks_eval_attention_recall(probs, 1, 2, 4, bad, 2, per, &mean), KS_ERR_INVALID_ARG);
}

/* ---------------------------------------------------------------- svg -- */

static void test_svg(void **state) {
    (void)state;
    const double x[] = {256, 1024, 4096}, y[] = {0.2, 0.6, 0.9}, dense[] = {0.95};
    ks_eval_series s[2] = {{"quest <k=16> & co", 3, x, y, false}, {"dense", 1, x, dense, true}};
    char *chart = NULL, *heat = NULL, *both = NULL;
    assert_int_equal(ks_eval_svg_budget_chart("t", s, 2, &chart), KS_OK);
    assert_non_null(strstr(chart, "&lt;k=16&gt; &amp; co"));
    assert_non_null(strstr(chart, "polyline"));
    assert_non_null(strstr(chart, "stroke-dasharray"));
    const int32_t lens[] = {1024, 4096};
    const double depths[] = {0, 1}, acc[] = {1.0, 0.5, NAN, 0.0};
    assert_int_equal(ks_eval_svg_heatmap("h", lens, 2, depths, 2, acc, &heat), KS_OK);
    assert_non_null(strstr(heat, ">n/a<"));
    assert_non_null(strstr(heat, ">0.50<"));
    const char *docs[] = {heat, chart};
    assert_int_equal(ks_eval_svg_stack(docs, 2, &both), KS_OK);
    assert_true(strncmp(both, "<?xml", 5) == 0);
    /* balanced: 3 <svg openings, 3 closings */
    int open = 0, close = 0;
    for (const char *p = both; (p = strstr(p, "<svg")); p++) open++;
    for (const char *p = both; (p = strstr(p, "</svg>")); p++) close++;
    assert_int_equal(open, 3);
    assert_int_equal(close, 3);
    free(chart);
    free(heat);
    free(both);
}

/* ------------------------------------------------------------- runner -- */

static void test_run_replay(void **state) {
    (void)state;
    ks_model *m = NULL;
    assert_int_equal(ks_model_load(ks_test_fixture("models/aidreams260K.gguf"), ks_model_default_params(), &m), KS_OK);
    ks_context_params cp = ks_context_default_params();
    cp.n_ctx = 128;
    cp.n_threads = 1;
    ks_context *ctx = NULL;
    assert_int_equal(ks_context_create(m, cp, &ctx), KS_OK);
    for (int t = 0; t < KS_EVAL_TASK_COUNT; t++) {
        ks_eval_instance x;
        if (ks_eval_generate((ks_eval_task)t, 3, 120, 0.5, m, &x) != KS_OK) fail_msg("%s", ks_last_error());
        assert_true(x.n_total <= 120);
        ks_eval_run_opts o = ks_eval_run_default_opts();
        o.keep_logits = true;
        ks_eval_result a, b;
        assert_int_equal(ks_eval_run(ctx, m, &x, &o, &a), KS_OK);
        assert_true(a.n_gen > 0 && a.n_prompt + a.n_gen <= x.n_total);
        assert_true(a.score >= 0 && a.score <= 1);
        o.forced = a.tokens;
        o.n_forced = a.n_gen;
        assert_int_equal(ks_eval_run(ctx, m, &x, &o, &b), KS_OK);
        assert_int_equal(a.n_gen, b.n_gen);
        double agree, kl;
        assert_int_equal(ks_eval_token_agreement(a.tokens, b.tokens, a.n_gen, &agree), KS_OK);
        assert_true(agree == 1.0);
        assert_int_equal(ks_eval_top1_agreement(a.logits, b.logits, a.n_gen, ks_model_n_vocab(m), &agree), KS_OK);
        assert_true(agree == 1.0);
        assert_int_equal(ks_eval_mean_kl(a.logits, b.logits, a.n_gen, ks_model_n_vocab(m), &kl), KS_OK);
        assert_true(kl < 1e-9);
        assert_string_equal(a.answer, b.answer);
        ks_eval_result_free(&a);
        ks_eval_result_free(&b);
        ks_eval_instance_free(&x);
    }
    ks_context_destroy(ctx);
    ks_model_destroy(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_task_names),
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_lengths_and_evidence),
        cmocka_unit_test(test_too_short),
        cmocka_unit_test(test_score),
        cmocka_unit_test(test_agreement_kl),
        cmocka_unit_test(test_attention_recall),
        cmocka_unit_test(test_svg),
        cmocka_unit_test(test_run_replay),
    };
    return cmocka_run_group_tests(tests, setup_vocab, teardown_vocab);
}
