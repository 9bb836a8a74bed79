/*
 * test_sampler.c — sampler chain and stop-string matcher.
 *
 * The sampler is checked against a slow, obviously-correct reference (full
 * sort, then the same cuts) on random logits, because the fast path's
 * partial sorts are exactly where an off-by-one would hide; the draw itself
 * is checked statistically only where the expected frequency is exact
 * (e.g. two equal logits).  The stop matcher is fed text split at every
 * possible byte boundary, so no split can leak a stop string.
 */
#include "testutil.h"

#include "core/core.h"
#include "sample/stop.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ sampler -- */

static ks_sampler *mk(ks_sampler_params p, int32_t V) {
    ks_sampler *s = NULL;
    assert_int_equal(ks_sampler_create(p, V, &s), KS_OK);
    assert_non_null(s);
    return s;
}

static void test_params_validation(void **state) {
    (void)state;
    ks_sampler *s = NULL;
    ks_sampler_params p = ks_sampler_default_params();
    assert_int_equal(ks_sampler_create(p, 0, &s), KS_ERR_INVALID_ARG);
    assert_non_null(strstr(ks_last_error(), "n_vocab"));
    p.top_p = 0.0f;
    assert_int_equal(ks_sampler_create(p, 10, &s), KS_ERR_INVALID_ARG);
    assert_non_null(strstr(ks_last_error(), "top_p"));
    p.top_p = 1.5f;
    assert_int_equal(ks_sampler_create(p, 10, &s), KS_ERR_INVALID_ARG);
    p = ks_sampler_default_params();
    p.min_p = 1.0f;
    assert_int_equal(ks_sampler_create(p, 10, &s), KS_ERR_INVALID_ARG);
    assert_non_null(strstr(ks_last_error(), "min_p"));
    p.min_p = -0.1f;
    assert_int_equal(ks_sampler_create(p, 10, &s), KS_ERR_INVALID_ARG);
    p = ks_sampler_default_params();
    p.repeat_penalty = 0.0f;
    assert_int_equal(ks_sampler_create(p, 10, &s), KS_ERR_INVALID_ARG);
    assert_non_null(strstr(ks_last_error(), "repeat_penalty"));
    p = ks_sampler_default_params();
    p.temperature = NAN;
    assert_int_equal(ks_sampler_create(p, 10, &s), KS_ERR_INVALID_ARG);
    assert_null(s);
    p = ks_sampler_default_params();
    p.temperature = -1.0f; /* greedy, fine */
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    s = mk(p, 10);
    ks_sampler_destroy(s);
    ks_sampler_destroy(NULL);
}

static void test_greedy(void **state) {
    (void)state;
    ks_sampler_params p = ks_sampler_default_params();
    p.temperature = 0.0f;
    p.repeat_penalty = 2.0f; /* ignored in greedy mode */
    ks_sampler *s = mk(p, 6);
    float l[6] = {1, 5, 3, 5, -2, 0};
    assert_int_equal(ks_sampler_sample(s, l), 1); /* tie: lowest id */
    ks_sampler_accept(s, 1);
    float l2[6] = {1, 5, 3, 5, -2, 0};
    assert_int_equal(ks_sampler_sample(s, l2), 1);
    float l3[6] = {NAN, -INFINITY, -1, NAN, -1, -3};
    assert_int_equal(ks_sampler_sample(s, l3), 2);
    ks_sampler_destroy(s);
}

/* Reference: full sort, same cuts, returns the kept set as a probability
 * vector over ids (unnormalised weights w[id]); the fast path must keep the
 * same set with the same weights. */
typedef struct { float v; int32_t id; } ref_c;
static int ref_cmp(const void *a, const void *b) {
    const ref_c *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}
static void ref_kept(const float *logits_in, int32_t V, ks_sampler_params p, const int32_t *hist,
                     int nh, double *w /* [V] */) {
    float *l = malloc((size_t)V * sizeof *l);
    memcpy(l, logits_in, (size_t)V * sizeof *l);
    int start = nh > p.repeat_last_n ? nh - p.repeat_last_n : 0;
    char *seen = calloc((size_t)V, 1);
    for (int i = start; i < nh; i++) {
        int t = hist[i];
        if (seen[t]) continue;
        seen[t] = 1;
        l[t] = l[t] > 0 ? l[t] / p.repeat_penalty : l[t] * p.repeat_penalty;
    }
    free(seen);
    ref_c *c = malloc((size_t)V * sizeof *c);
    for (int i = 0; i < V; i++) {
        c[i].v = l[i] * (1.0f / p.temperature);
        c[i].id = i;
    }
    qsort(c, (size_t)V, sizeof *c, ref_cmp);
    int n = V;
    if (p.top_k > 0 && p.top_k < n) n = p.top_k;
    float mx = c[0].v;
    double sum = 0;
    double *pr = malloc((size_t)V * sizeof *pr);
    for (int i = 0; i < n; i++) {
        pr[i] = expf(c[i].v - mx);
        sum += pr[i];
    }
    if (p.top_p < 1.0f) {
        double cum = 0;
        int keep = n;
        for (int i = 0; i < n; i++) {
            cum += pr[i];
            if (cum >= (double)p.top_p * sum) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }
    for (int i = 0; i < V; i++) w[i] = 0;
    for (int i = 0; i < n; i++)
        if (p.min_p <= 0 || pr[i] >= p.min_p) w[c[i].id] = pr[i];
    free(pr);
    free(c);
    free(l);
}

static void fill_logits(float *l, int32_t V, ks_rng *rng, float scale) {
    for (int i = 0; i < V; i++) l[i] = ks_rng_normal(rng) * scale;
}

/* Every sampled token must be in the reference's kept set; over many draws
 * with a fixed logits row, the empirical frequency tracks the weights. */
static void test_against_reference(void **state) {
    (void)state;
    const int32_t V = 6000;
    ks_rng rng = {7};
    float *base = malloc((size_t)V * sizeof *base);
    float *l = malloc((size_t)V * sizeof *l);
    double *w = malloc((size_t)V * sizeof *w);
    struct { int32_t k; float p, m, t; } cfg[] = {
        {40, 0.95f, 0.05f, 0.8f}, {0, 0.9f, 0.0f, 1.0f}, {0, 1.0f, 0.1f, 1.5f},
        {5, 1.0f, 0.0f, 1.0f},    {0, 0.5f, 0.0f, 3.0f}, {1, 1.0f, 0.0f, 1.0f},
        {0, 0.999f, 0.0f, 5.0f},  {100, 0.8f, 0.02f, 0.7f}, {5000, 0.9f, 0.0f, 2.0f},
        {4096, 0.97f, 0.01f, 4.0f}, {0, 0.3f, 0.5f, 0.5f},
    };
    for (size_t ci = 0; ci < sizeof cfg / sizeof cfg[0]; ci++) {
        for (int trial = 0; trial < 3; trial++) {
            fill_logits(base, V, &rng, 2.0f + trial);
            if (trial == 2) /* heavy ties */
                for (int i = 0; i < V; i++) base[i] = floorf(base[i]);
            ks_sampler_params p = ks_sampler_default_params();
            p.top_k = cfg[ci].k;
            p.top_p = cfg[ci].p;
            p.min_p = cfg[ci].m;
            p.temperature = cfg[ci].t;
            p.repeat_penalty = 1.3f;
            p.repeat_last_n = 8;
            p.seed = 1000 + ci * 10 + trial;
            ks_sampler *s = mk(p, V);
            int32_t hist[20];
            for (int i = 0; i < 20; i++) {
                hist[i] = (int32_t)(ks_rng_next(&rng) % 50);
                ks_sampler_accept(s, hist[i]);
            }
            ref_kept(base, V, p, hist, 20, w);
            for (int d = 0; d < 200; d++) {
                memcpy(l, base, (size_t)V * sizeof *l);
                int32_t id = ks_sampler_sample(s, l);
                assert_true(id >= 0 && id < V);
                if (!(w[id] > 0)) fail_msg("cfg %zu trial %d: id %d outside the kept set", ci, trial, id);
            }
            ks_sampler_destroy(s);
        }
    }
    free(base);
    free(l);
    free(w);
}

static void test_top_k_1_is_argmax(void **state) {
    (void)state;
    const int32_t V = 150000;
    ks_rng rng = {3};
    float *l = malloc((size_t)V * sizeof *l);
    ks_sampler_params p = ks_sampler_default_params();
    p.top_k = 1;
    p.temperature = 1.0f;
    ks_sampler *s = mk(p, V);
    for (int t = 0; t < 5; t++) {
        fill_logits(l, V, &rng, 3.0f);
        int32_t am = 0;
        for (int i = 1; i < V; i++)
            if (l[i] > l[am]) am = i;
        assert_int_equal(ks_sampler_sample(s, l), am);
    }
    ks_sampler_destroy(s);
    free(l);
}

static void test_determinism_and_distribution(void **state) {
    (void)state;
    const int32_t V = 150000;
    ks_rng rng = {11};
    float *base = malloc((size_t)V * sizeof *base);
    float *l = malloc((size_t)V * sizeof *l);
    fill_logits(base, V, &rng, 1.5f);
    ks_sampler_params p = ks_sampler_default_params();
    p.top_k = 0; /* exercise the growing-prefix top-p over the full vocab */
    p.top_p = 0.9f;
    p.min_p = 0.0f;
    p.seed = 99;
    int32_t seq[2][30];
    for (int run = 0; run < 2; run++) {
        ks_sampler *s = mk(p, V);
        for (int i = 0; i < 30; i++) {
            memcpy(l, base, (size_t)V * sizeof *l);
            seq[run][i] = ks_sampler_sample(s, l);
        }
        ks_sampler_destroy(s);
    }
    assert_memory_equal(seq[0], seq[1], sizeof seq[0]);

    /* Two equal top logits, everything else masked: 50/50 within 5 sigma. */
    float two[4] = {-INFINITY, 2.0f, 2.0f, -INFINITY};
    ks_sampler_params q = ks_sampler_default_params();
    q.top_k = 0;
    q.top_p = 1.0f;
    q.min_p = 0.0f;
    q.temperature = 1.0f;
    ks_sampler *s = mk(q, 4);
    int cnt[4] = {0};
    const int N = 4000;
    for (int i = 0; i < N; i++) {
        float t[4];
        memcpy(t, two, sizeof t);
        cnt[ks_sampler_sample(s, t)]++;
    }
    assert_int_equal(cnt[0] + cnt[3], 0);
    assert_true(abs(cnt[1] - N / 2) < 5 * 32); /* sigma = sqrt(N)/2 ~ 32 */
    ks_sampler_destroy(s);

    /* Nucleus renormalisation: p = .5 .3 .15 .05, top_p .7 keeps {0, 1}
     * drawn 5:3.  Ids shuffled so the cut does not follow id order. */
    float pr[6] = {-INFINITY, logf(0.15f), logf(0.5f), logf(0.05f), logf(0.3f), -INFINITY};
    q.top_p = 0.7f;
    s = mk(q, 6);
    int c6[6] = {0};
    for (int i = 0; i < N; i++) {
        float t[6];
        memcpy(t, pr, sizeof t);
        c6[ks_sampler_sample(s, t)]++;
    }
    assert_int_equal(c6[0] + c6[1] + c6[3] + c6[5], 0);
    assert_true(fabs(c6[2] - N * 0.625) < 5 * sqrt(N * 0.625 * 0.375));
    /* all masked: deterministic fallback, no crash */
    float none[6] = {-INFINITY, -INFINITY, NAN, -INFINITY, -INFINITY, -INFINITY};
    int32_t id = ks_sampler_sample(s, none);
    assert_true(id >= 0 && id < 6);
    ks_sampler_destroy(s);
    free(base);
    free(l);
}

static void test_repeat_penalty(void **state) {
    (void)state;
    ks_sampler_params p = ks_sampler_default_params();
    p.temperature = 1.0f;
    p.top_k = 1;
    p.repeat_penalty = 2.0f;
    p.repeat_last_n = 2;
    ks_sampler *s = mk(p, 4);
    /* token 0 at 3.0 beats 1 at 2.0 until 0 is penalised to 1.5. */
    float l[4] = {3.0f, 2.0f, -1.0f, -5.0f};
    assert_int_equal(ks_sampler_sample(s, l), 0);
    ks_sampler_accept(s, 0);
    ks_sampler_accept(s, 0); /* duplicates penalise once: 3/2 = 1.5, not 0.75 */
    float l2[4] = {3.0f, 2.0f, -1.0f, -5.0f};
    assert_int_equal(ks_sampler_sample(s, l2), 1);
    assert_float_equal(l2[0], 1.5f, 1e-6);
    /* negative logits are multiplied */
    ks_sampler_accept(s, 2);
    float l3[4] = {3.0f, 2.0f, -1.0f, -5.0f};
    (void)ks_sampler_sample(s, l3);
    assert_float_equal(l3[2], -2.0f, 1e-6);
    assert_float_equal(l3[0], 1.5f, 1e-6);
    /* window of 2: after two more tokens, 0 leaves the window */
    ks_sampler_accept(s, 3);
    float l4[4] = {3.0f, 2.0f, -1.0f, -5.0f};
    assert_int_equal(ks_sampler_sample(s, l4), 0);
    ks_sampler_destroy(s);
}

/* ------------------------------------------------------- stop strings -- */

/* Feed text in pieces split at the given cut points; collect the output. */
static size_t feed_split(ks_stop_matcher *m, const char *text, const size_t *cuts, int ncut,
                         char *out, bool *matched, int32_t *which) {
    size_t n = 0, prev = 0, len = strlen(text);
    ks_stop_out o = {0};
    *matched = false;
    for (int i = 0; i <= ncut; i++) {
        size_t end = i < ncut ? cuts[i] : len;
        assert_int_equal(ks_stop_feed(m, text + prev, end - prev, &o), KS_OK);
        memcpy(out + n, o.text, o.len);
        n += o.len;
        prev = end;
        if (o.matched) {
            *matched = true;
            *which = o.which;
            break;
        }
    }
    if (!*matched) {
        ks_stop_flush(m, &o);
        memcpy(out + n, o.text, o.len);
        n += o.len;
    }
    out[n] = 0;
    return n;
}

static void test_stop_all_splits(void **state) {
    (void)state;
    const char *stops[] = {"</s>", "\nUser:", "xx"};
    ks_stop_matcher *m;
    assert_int_equal(ks_stop_create(stops, 3, &m), KS_OK);
    struct { const char *text, *want; int which; } cases[] = {
        {"Hello world</s>trailing", "Hello world", 0},
        {"a < b </ c \nUse it\nUser: hi", "a < b </ c \nUse it", 1},
        {"no stop here <", "no stop here <", -1},
        {"x y xxz", "x y ", 2},
        {"caf\xc3\xa9 </", "caf\xc3\xa9 </", -1},
    };
    char out[256];
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        size_t len = strlen(cases[c].text);
        /* every single split point and every pair of split points */
        for (size_t a = 0; a <= len; a++)
            for (size_t b = a; b <= len; b++) {
                size_t cuts[2] = {a, b};
                bool matched;
                int32_t which = -1;
                ks_stop_reset(m);
                feed_split(m, cases[c].text, cuts, 2, out, &matched, &which);
                assert_string_equal(out, cases[c].want);
                assert_int_equal(matched, cases[c].which >= 0);
                if (matched) assert_int_equal(which, cases[c].which);
            }
        /* byte by byte: never emits a byte that later turns out to be in a stop */
        size_t cuts[256];
        for (size_t i = 0; i < len; i++) cuts[i] = i + 1;
        bool matched;
        int32_t which = -1;
        ks_stop_reset(m);
        feed_split(m, cases[c].text, cuts, (int)len, out, &matched, &which);
        assert_string_equal(out, cases[c].want);
    }
    ks_stop_destroy(m);
}

static void test_stop_holdback(void **state) {
    (void)state;
    const char *stops[] = {"<|im_end|>"};
    ks_stop_matcher *m;
    assert_int_equal(ks_stop_create(stops, 1, &m), KS_OK);
    ks_stop_out o;
    assert_int_equal(ks_stop_feed(m, "abc<|im", 7, &o), KS_OK);
    assert_int_equal(o.len, 3);
    assert_memory_equal(o.text, "abc", 3);
    assert_int_equal(o.n_held, 4);
    assert_false(o.matched);
    assert_int_equal(ks_stop_feed(m, "_x", 2, &o), KS_OK); /* "<|im_x" no longer a prefix */
    assert_int_equal(o.len, 6);
    assert_memory_equal(o.text, "<|im_x", 6);
    assert_int_equal(o.n_held, 0);
    /* incomplete UTF-8 (e with acute: C3 A9; euro: E2 82 AC) */
    assert_int_equal(ks_stop_feed(m, "\xe2\x82", 2, &o), KS_OK);
    assert_int_equal(o.len, 0);
    assert_int_equal(o.n_held, 2);
    assert_int_equal(ks_stop_feed(m, "\xac!", 2, &o), KS_OK);
    assert_int_equal(o.len, 4);
    assert_memory_equal(o.text, "\xe2\x82\xac!", 4);
    /* after a match: silent until reset */
    assert_int_equal(ks_stop_feed(m, "ok<|im_end|>more", 16, &o), KS_OK);
    assert_true(o.matched);
    assert_int_equal(o.len, 2);
    assert_int_equal(ks_stop_feed(m, "zzz", 3, &o), KS_OK);
    assert_true(o.matched);
    assert_int_equal(o.len, 0);
    ks_stop_reset(m);
    assert_int_equal(ks_stop_feed(m, "zzz", 3, &o), KS_OK);
    assert_false(o.matched);
    assert_int_equal(o.len, 3);
    ks_stop_destroy(m);

    /* helpers */
    assert_int_equal(ks_utf8_incomplete_tail("a\xc3", 2), 1);
    assert_int_equal(ks_utf8_incomplete_tail("a\xc3\xa9", 3), 0);
    assert_int_equal(ks_utf8_incomplete_tail("\xf0\x9f\x98", 3), 3);
    assert_int_equal(ks_utf8_incomplete_tail("\xf0\x9f\x98\x80", 4), 0);
    assert_int_equal(ks_utf8_incomplete_tail("\x80\x80", 2), 0);
    assert_int_equal(ks_utf8_incomplete_tail("", 0), 0);
    const char *ss[] = {"abc", "bcd"};
    assert_int_equal(ks_stop_partial_len(ss, 2, "xxbc", 4), 2);
    assert_int_equal(ks_stop_partial_len(ss, 2, "xxab", 4), 2);
    assert_int_equal(ks_stop_partial_len(ss, 2, "abc", 3), 2); /* "bc": proper prefix of "bcd" */
    assert_int_equal(ks_stop_partial_len(ss, 2, "x", 1), 0);

    /* bad arguments */
    const char *bad[] = {"ok", ""};
    ks_stop_matcher *m2 = NULL;
    assert_int_equal(ks_stop_create(bad, 2, &m2), KS_ERR_INVALID_ARG);
    assert_null(m2);
    assert_int_equal(ks_stop_create(NULL, 0, &m2), KS_OK);
    assert_int_equal(ks_stop_feed(m2, "plain", 5, &o), KS_OK);
    assert_int_equal(o.len, 5);
    ks_stop_destroy(m2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_params_validation),
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_against_reference),
        cmocka_unit_test(test_top_k_1_is_argmax),
        cmocka_unit_test(test_determinism_and_distribution),
        cmocka_unit_test(test_repeat_penalty),
        cmocka_unit_test(test_stop_all_splits),
        cmocka_unit_test(test_stop_holdback),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
