/*
 * test_sched.c — the continuous-batching scheduler (src/sched/) on the real
 * aidreams260K model.
 *
 * The central property is batch invariance: a request's output must not
 * depend on what else runs.  Each request's text is computed alone on a
 * fresh one-sequence context (the whole prompt in one ks_prefill, then one
 * decode per token: what `kvsieve run` does) and compared byte for byte
 * with what the scheduler produced while it ran five requests in three slots
 * (so one joins late, at other depths), with prompts prefilled in chunks of
 * 4 tokens between decode steps, and with four other policies sharing the
 * same steps in the same context (streaming, quest and chess, chunkable;
 * snapkv, prefilled in one call).  Then the
 * contracts: cancellation frees the slot, the waiting queue is bounded,
 * over-long requests are refused before they run, stop strings never leak,
 * shutdown ends what runs and refuses what comes.
 */
#define _GNU_SOURCE
#include "testutil.h"

#include "sched/sched.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static ks_model *g_model;
static bool g_ignore_eos; /* reference(): keep going past end-of-generation tokens */

static int setup(void **state) {
    (void)state;
    ks_model_params mp = ks_model_default_params();
    if (ks_model_load(ks_test_fixture("models/aidreams260K.gguf"), mp, &g_model) != KS_OK) return -1;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    ks_model_destroy(g_model);
    return 0;
}

static int32_t tokenize(const char *text, int32_t *ids, int32_t cap) {
    size_t n = 0;
    assert_int_equal(ks_tokenize(g_model, text, strlen(text), true, false, ids, (size_t)cap, &n), KS_OK);
    return (int32_t)n;
}

/* The request alone: one context, whole-prompt prefill, one decode per token. */
static char *reference(const char *prompt, int32_t max_tokens, const char *policy, int32_t budget,
                       ks_sampler_params sp) {
    int32_t ids[128];
    int32_t n = tokenize(prompt, ids, 128);
    ks_context_params cp = ks_context_default_params();
    cp.n_ctx = 128;
    cp.n_threads = 2;
    cp.policy = policy;
    cp.budget = budget;
    ks_context *ctx = NULL;
    assert_int_equal(ks_context_create(g_model, cp, &ctx), KS_OK);
    int32_t V = ks_model_n_vocab(g_model);
    float *logits = malloc(sizeof(float) * (size_t)V);
    ks_sampler *smp = NULL;
    assert_int_equal(ks_sampler_create(sp, V, &smp), KS_OK);
    for (int32_t i = 0; i < n; i++) ks_sampler_accept(smp, ids[i]);
    assert_int_equal(ks_prefill(ctx, 0, ids, n, logits, NULL), KS_OK);
    char *out = calloc(1, 4096);
    size_t len = 0;
    int32_t seq = 0;
    for (int32_t k = 0; k < max_tokens; k++) {
        int32_t tok = ks_sampler_sample(smp, logits);
        ks_sampler_accept(smp, tok);
        if (!g_ignore_eos && ks_token_is_eog(g_model, tok)) break;
        size_t np = 0;
        ks_token_to_piece(g_model, tok, out + len, 4096 - len, &np);
        len += np;
        if (k + 1 < max_tokens) assert_int_equal(ks_decode(ctx, &seq, &tok, 1, logits), KS_OK);
    }
    ks_sampler_destroy(smp);
    free(logits);
    ks_context_destroy(ctx);
    return out;
}

static ks_sched *make_sched(int32_t parallel, int32_t batch, int32_t max_waiting) {
    ks_sched_params p = ks_sched_default_params();
    p.n_ctx = 128;
    p.n_parallel = parallel;
    p.n_threads = 2;
    p.n_batch = batch;
    p.max_waiting = max_waiting;
    ks_sched *s = NULL;
    char err[512];
    if (ks_sched_create(g_model, &p, &s, err, sizeof err) != KS_OK) fail_msg("sched: %s", err);
    return s;
}

static ks_sched_req *submit(ks_sched *s, const char *prompt, int32_t max_tokens, const char *policy, int32_t budget,
                            ks_sampler_params sp, const char *const *stops, int32_t n_stops, ks_sched_error *why) {
    int32_t ids[128];
    ks_sched_req_params p = {0};
    p.n_prompt = tokenize(prompt, ids, 128);
    p.prompt = ids;
    p.max_tokens = max_tokens;
    p.sampling = sp;
    p.stops = stops;
    p.n_stops = n_stops;
    p.policy = ks_sched_policy_default();
    if (ks_policy_spec_parse(policy, NULL, budget, 4, 64, -1, &p.policy.spec) != KS_OK)
        fail_msg("policy %s: %s", policy ? policy : "dense", ks_last_error());
    char msg[512];
    ks_sched_error w;
    ks_sched_req *r = ks_sched_submit(s, &p, why ? why : &w, msg, sizeof msg);
    if (!r && !why) fail_msg("submit refused: %s", msg);
    return r;
}

/* Wait for the end; returns the text (malloc'd) and fills u. */
static char *collect(ks_sched *s, ks_sched_req *r, ks_sched_update *u) {
    char *text = calloc(1, 1);
    size_t len = 0;
    for (int i = 0; i < 3000; i++) {
        ks_sched_req_take(s, r, 0.05, u);
        if (u->text) {
            text = realloc(text, len + u->len + 1);
            memcpy(text + len, u->text, u->len + 1);
            len += u->len;
            free(u->text);
            u->text = NULL;
        }
        if (u->state == KS_SCHED_FINISHED) return text;
    }
    fail_msg("request did not finish in 150 s");
    return NULL;
}

static ks_sampler_params greedy(void) {
    ks_sampler_params sp = ks_sampler_default_params();
    sp.temperature = 0;
    return sp;
}

static void test_batch_invariance(void **state) {
    (void)state;
    static const struct {
        const char *prompt;
        int32_t max_tokens;
        const char *policy;
        int32_t budget;
        bool sampled;
    } cases[] = {
        {"Once upon a time", 40, NULL, 0, false},
        {"The little dog ran to the river and", 30, NULL, 0, false},
        {"In a land far away there lived a king who loved", 20, "streaming", 24, false},
        {"Hi", 50, NULL, 0, false},
        {"The sun", 35, NULL, 0, true},
        {"A small bird sings by the river today and", 25, "snapkv", 24, false},
        {"The quiet farmer walks near the old bridge and", 40, "quest", 24, false},
        {"Lily wanted to play with her", 45, "chess", 24, false},
    };
    enum { N = sizeof cases / sizeof cases[0] };
    ks_sched *s = make_sched(3, 4, 16);
    ks_sched_req *r[N];
    for (int i = 0; i < N; i++) {
        ks_sampler_params sp = greedy();
        if (cases[i].sampled) {
            sp = ks_sampler_default_params();
            sp.seed = 7;
        }
        r[i] = submit(s, cases[i].prompt, cases[i].max_tokens, cases[i].policy, cases[i].budget, sp, NULL, 0, NULL);
    }
    for (int i = 0; i < N; i++) {
        ks_sched_update u;
        char *got = collect(s, r[i], &u);
        ks_sampler_params sp = greedy();
        if (cases[i].sampled) {
            sp = ks_sampler_default_params();
            sp.seed = 7;
        }
        char *want = reference(cases[i].prompt, cases[i].max_tokens, cases[i].policy ? cases[i].policy : "dense",
                               cases[i].budget, sp);
        assert_true(u.finish == KS_SCHED_FINISH_LENGTH || u.finish == KS_SCHED_FINISH_STOP);
        if (strcmp(got, want)) fail_msg("request %d differs:\n got  '%s'\n want '%s'", i, got, want);
        assert_true(u.n_generated > 0 && u.n_generated <= cases[i].max_tokens);
        assert_true(u.t_first >= u.t_admit && u.t_admit >= u.t_submit);
        free(got);
        free(want);
        ks_sched_req_release(s, r[i]);
    }
    ks_sched_metrics m;
    ks_sched_get_metrics(s, &m);
    assert_int_equal(m.requests_completed, N);
    assert_int_equal(m.running, 0);
    assert_true(m.prefill_chunks > N); /* prompts were chunked */
    /* one context for every policy, and sequences of different policies decoded in the same steps */
    assert_int_equal(m.contexts_created, 1);
    assert_true(m.decode_steps_mixed > 0);
    ks_sched_destroy(s);
}

static void test_cancel_frees_slot(void **state) {
    (void)state;
    ks_sched *s = make_sched(1, 256, 8);
    ks_sampler_params sp = greedy();
    int32_t ids[128];
    ks_sched_req_params p = {0};
    p.n_prompt = tokenize("Once upon a time", ids, 128);
    p.prompt = ids;
    p.max_tokens = 100;
    p.sampling = sp;
    p.ignore_eos = true;
    p.policy = ks_sched_policy_default();
    ks_sched_error why;
    char msg[256];
    ks_sched_req *a = ks_sched_submit(s, &p, &why, msg, sizeof msg);
    ks_sched_req *b = ks_sched_submit(s, &p, &why, msg, sizeof msg); /* waits for a's slot */
    assert_non_null(a);
    assert_non_null(b);
    ks_sched_update u;
    do ks_sched_req_take(s, a, 0.05, &u), free(u.text); while (u.state == KS_SCHED_WAITING);
    ks_sched_req_cancel(s, b); /* waiting: removed at once */
    ks_sched_req_take(s, b, 0, &u);
    free(u.text);
    assert_int_equal(u.state, KS_SCHED_FINISHED);
    assert_int_equal(u.finish, KS_SCHED_FINISH_CANCELLED);
    ks_sched_req_cancel(s, a);
    char *t = collect(s, a, &u);
    free(t);
    assert_true(u.finish == KS_SCHED_FINISH_CANCELLED || u.finish == KS_SCHED_FINISH_LENGTH);
    ks_sched_req_release(s, a);
    ks_sched_req_release(s, b);
    /* the slot is free again: a new request runs to the end */
    ks_sched_req *c = submit(s, "Once upon a time", 24, NULL, 0, greedy(), NULL, 0, NULL);
    char *got = collect(s, c, &u), *want = reference("Once upon a time", 24, "dense", 0, greedy());
    assert_string_equal(got, want);
    free(got);
    free(want);
    ks_sched_req_release(s, c);
    /* a handle released before the end cancels its request */
    ks_sched_req *d = submit(s, "Once upon a time", 100, NULL, 0, greedy(), NULL, 0, NULL);
    ks_sched_req_release(s, d);
    for (int i = 0; i < 200 && !ks_sched_idle(s); i++) usleep(10000);
    assert_true(ks_sched_idle(s));
    ks_sched_destroy(s);
}

static void test_queue_bound_and_lengths(void **state) {
    (void)state;
    ks_sched *s = make_sched(1, 256, 1);
    ks_sched_req *r[6];
    int refused = 0;
    for (int i = 0; i < 6; i++) {
        ks_sched_error why = KS_SCHED_ERR_NONE;
        r[i] = submit(s, "Once upon a time", 60, NULL, 0, greedy(), NULL, 0, &why);
        if (!r[i]) {
            assert_int_equal(why, KS_SCHED_ERR_QUEUE_FULL);
            refused++;
        }
    }
    assert_true(refused >= 1);
    for (int i = 0; i < 6; i++)
        if (r[i]) {
            ks_sched_update u;
            free(collect(s, r[i], &u));
            assert_int_not_equal(u.finish, KS_SCHED_FINISH_ERROR);
            ks_sched_req_release(s, r[i]);
        }
    /* prompt + max_tokens over the context: refused before it runs, never truncated */
    ks_sched_error why;
    assert_null(submit(s, "Once upon a time", 120, NULL, 0, greedy(), NULL, 0, &why));
    assert_int_equal(why, KS_SCHED_ERR_TOO_LONG);
    /* bad sampling parameters */
    ks_sampler_params bad = greedy();
    bad.top_p = 0;
    assert_null(submit(s, "Once upon a time", 4, NULL, 0, bad, NULL, 0, &why));
    assert_int_equal(why, KS_SCHED_ERR_INVALID);
    /* a policy configuration the engine refuses fails the request, not the server */
    ks_sched_req *x = submit(s, "Once upon a time", 4, "spec", 24, greedy(), NULL, 0, NULL); /* no draft model */
    ks_sched_update u;
    free(collect(s, x, &u));
    assert_int_equal(u.finish, KS_SCHED_FINISH_ERROR);
    assert_int_equal(u.error, KS_SCHED_ERR_INVALID);
    assert_non_null(strstr(u.message, "spec"));
    ks_sched_req_release(s, x);
    ks_sched_req *q = submit(s, "Once upon a time", 4, NULL, 0, greedy(), NULL, 0, NULL); /* the server goes on */
    free(collect(s, q, &u));
    assert_int_not_equal(u.finish, KS_SCHED_FINISH_ERROR);
    ks_sched_req_release(s, q);
    ks_sched_destroy(s);
}

static void test_stop_strings(void **state) {
    (void)state;
    ks_sched *s = make_sched(2, 256, 8);
    const char *stop1[] = {"petals"}, *stop2[] = {"like q", "zzz"};
    ks_sched_req *a = submit(s, "Once upon a time", 60, NULL, 0, greedy(), stop1, 1, NULL);
    ks_sched_req *b = submit(s, "Once upon a time", 24, NULL, 0, greedy(), stop2, 2, NULL);
    ks_sched_update u;
    char *t = collect(s, a, &u);
    assert_string_equal(t, ", pixels unfolding like ");
    assert_int_equal(u.finish, KS_SCHED_FINISH_STOP);
    free(t);
    t = collect(s, b, &u); /* "like " was held back, then released when "q" did not follow */
    char *want = reference("Once upon a time", 24, "dense", 0, greedy());
    assert_string_equal(t, want);
    assert_int_equal(u.finish, KS_SCHED_FINISH_LENGTH);
    free(t);
    free(want);
    ks_sched_req_release(s, a);
    ks_sched_req_release(s, b);
    ks_sched_destroy(s);
}

static void test_shutdown(void **state) {
    (void)state;
    ks_sched *s = make_sched(1, 256, 8);
    int32_t ids[128];
    ks_sched_req_params p = {0};
    p.n_prompt = tokenize("Once upon a time", ids, 128);
    p.prompt = ids;
    p.max_tokens = 110;
    p.sampling = greedy();
    p.ignore_eos = true;
    p.policy = ks_sched_policy_default();
    ks_sched_error why;
    char msg[256];
    ks_sched_req *a = ks_sched_submit(s, &p, &why, msg, sizeof msg);
    ks_sched_req *b = ks_sched_submit(s, &p, &why, msg, sizeof msg);
    ks_sched_update u;
    do ks_sched_req_take(s, a, 0.05, &u), free(u.text); while (u.state == KS_SCHED_WAITING);
    ks_sched_shutdown(s, 0);
    free(collect(s, b, &u));
    assert_int_equal(u.finish, KS_SCHED_FINISH_ERROR); /* queued: told, never started */
    assert_int_equal(u.error, KS_SCHED_ERR_SHUTDOWN);
    free(collect(s, a, &u));
    assert_true(u.finish == KS_SCHED_FINISH_LENGTH || u.error == KS_SCHED_ERR_SHUTDOWN);
    assert_null(ks_sched_submit(s, &p, &why, msg, sizeof msg));
    assert_int_equal(why, KS_SCHED_ERR_SHUTDOWN);
    ks_sched_req_release(s, a);
    ks_sched_req_release(s, b);
    assert_true(ks_sched_idle(s));
    ks_sched_destroy(s);
}

static void test_chunkable(void **state) {
    (void)state;
    assert_true(ks_sched_policy_chunkable("dense"));
    assert_true(ks_sched_policy_chunkable("quest"));
    assert_true(ks_sched_policy_chunkable("streaming+quest"));
    assert_false(ks_sched_policy_chunkable("snapkv+quest"));
    assert_false(ks_sched_policy_chunkable("spec"));
    assert_false(ks_sched_policy_chunkable("densex"));
    assert_false(ks_sched_policy_chunkable(""));
}

/* The memory model's answer for `seqs` sequences of `len` tokens each on
 * their own (ks_context_mem_fits), in a context of the given cap and
 * default budget. */
static bool fits_state(double cap, int32_t budget, int32_t parallel, int32_t seqs, int64_t len) {
    ks_context_params cp = ks_context_default_params();
    cp.n_ctx = 128;
    cp.n_seq = parallel;
    cp.n_threads = 2;
    cp.policy = "quest";
    cp.budget = budget;
    cp.mem_cap = cap;
    ks_context *c = NULL;
    if (ks_context_create(g_model, cp, &c) != KS_OK) return false;
    ks_mem_query q = {.extra_tokens = (int64_t)seqs * len, .extra_seqs = seqs, .longest = len, .alone = true};
    ks_mem_fit f;
    assert_int_equal(ks_context_mem_fits(c, &q, &f), KS_OK);
    ks_context_destroy(c);
    return f.active && f.fits;
}

/* The smallest cap (to 1 kB) at which the state fits. */
static double min_cap(int32_t budget, int32_t parallel, int32_t seqs, int64_t len) {
    double lo = 1e5, hi = 1e9;
    if (!fits_state(hi, budget, parallel, seqs, len)) return -1;
    while (hi - lo > 1e3) {
        double mid = (lo + hi) / 2;
        if (fits_state(mid, budget, parallel, seqs, len)) hi = mid;
        else lo = mid;
    }
    return hi;
}

static ks_sched_req *submit_ie(ks_sched *s, const char *prompt, int32_t max_tokens, const char *policy, int32_t budget) {
    int32_t ids[128];
    ks_sched_req_params p = {0};
    p.n_prompt = tokenize(prompt, ids, 128);
    p.prompt = ids;
    p.max_tokens = max_tokens;
    p.sampling = greedy();
    p.ignore_eos = true;
    p.policy = ks_sched_policy_default();
    if (ks_policy_spec_parse(policy, NULL, budget, 4, 64, -1, &p.policy.spec) != KS_OK)
        fail_msg("policy %s: %s", policy, ks_last_error());
    char msg[512];
    ks_sched_error w;
    ks_sched_req *r = ks_sched_submit(s, &p, &w, msg, sizeof msg);
    if (!r) fail_msg("submit refused: %s", msg);
    return r;
}

/* Under a memory cap the plan counts the largest budget among the policies
 * the context holds: a request whose policy would leave a running request
 * unable to finish even alone waits for it (and is never refused for it),
 * then runs exactly as alone. */
static void test_mem_cap_mixed_budgets(void **state) {
    (void)state;
    /* a cap where a (budget 16, up to 95 tokens) fits alone, and b (budget
     * 64, up to 59) fits alone, but a does not fit under b's budget */
    double cap = min_cap(64, 2, 1, 60);
    if (cap < 0 || !fits_state(cap, 16, 2, 1, 100) || fits_state(cap, 64, 2, 1, 95)) skip();
    ks_sched_params p = ks_sched_default_params();
    p.n_ctx = 128;
    p.n_parallel = 2;
    p.n_threads = 2;
    p.mem_cap = cap;
    assert_int_equal(ks_policy_spec_parse("quest", NULL, 16, 4, 64, -1, &p.defaults.spec), KS_OK);
    ks_sched *s = NULL;
    char err[512];
    if (ks_sched_create(g_model, &p, &s, err, sizeof err) != KS_OK) fail_msg("sched: %s", err);
    ks_sampler_params sp = greedy();
    ks_sched_req *a = submit(s, "Once upon a time", 90, "quest", 16, sp, NULL, 0, NULL);
    ks_sched_req *b = submit(s, "The little dog ran to the river and", 40, "streaming", 64, sp, NULL, 0, NULL);
    /* b never runs beside a: the plan with b's budget cannot hold a's length */
    ks_sched_metrics m;
    do {
        ks_sched_get_metrics(s, &m);
        assert_true(m.running <= 1);
    } while (m.requests_completed + m.requests_failed < 2);
    ks_sched_update ua, u;
    char *ga = collect(s, a, &ua), *gb = collect(s, b, &u);
    if (ua.finish == KS_SCHED_FINISH_ERROR || u.finish == KS_SCHED_FINISH_ERROR)
        fail_msg("cap %.0f: a: %s; b: %s", cap, ua.message, u.message);
    char *wa = reference("Once upon a time", 90, "quest", 16, sp);
    char *wb = reference("The little dog ran to the river and", 40, "streaming", 64, sp);
    assert_string_equal(ga, wa);
    assert_string_equal(gb, wb);
    free(ga), free(gb), free(wa), free(wb);
    ks_sched_req_release(s, a);
    ks_sched_req_release(s, b);
    ks_sched_destroy(s);
}

/* Admission by the actual sum, and pausing: under a cap where three
 * requests start together (short prompts) but cannot all reach their
 * length even with every layer offloaded, while two can, the newest is
 * paused (its KV parked in the slow tier) as they grow and resumed when the
 * others end.  Every output equals the request run alone, nothing fails,
 * and afterwards nothing is paused and no KV is held in either tier. */
static void test_mem_cap_pause(void **state) {
    (void)state;
    enum { N = 100 };
    const char *prompts[3] = {"Once upon a time", "The little dog", "A big red ball"};
    int32_t ids[128], longest = 0;
    for (int i = 0; i < 3; i++) {
        int32_t n = tokenize(prompts[i], ids, 128);
        longest = n > longest ? n : longest;
    }
    double cap = min_cap(16, 3, 2, longest + N);
    if (cap < 0 || fits_state(cap, 16, 3, 3, longest + N) || !fits_state(cap, 16, 3, 3, longest + 16))
        skip(); /* this model's shapes leave no such cap */
    ks_sched_params p = ks_sched_default_params();
    p.n_ctx = 128;
    p.n_parallel = 3;
    p.n_threads = 2;
    p.mem_cap = cap;
    assert_int_equal(ks_policy_spec_parse("quest", NULL, 16, 4, 64, -1, &p.defaults.spec), KS_OK);
    ks_sched *s = NULL;
    char err[512];
    if (ks_sched_create(g_model, &p, &s, err, sizeof err) != KS_OK) fail_msg("sched: %s", err);
    ks_sched_req *r[3];
    for (int i = 0; i < 3; i++) r[i] = submit_ie(s, prompts[i], N, "quest", 16);
    int32_t max_running = 0;
    ks_sched_metrics m;
    do {
        ks_sched_get_metrics(s, &m);
        max_running = m.running > max_running ? m.running : max_running;
        usleep(1000);
    } while (m.requests_completed + m.requests_failed < 3);
    ks_sampler_params sp = greedy();
    g_ignore_eos = true;
    for (int i = 0; i < 3; i++) {
        ks_sched_update u;
        char *got = collect(s, r[i], &u);
        if (u.finish == KS_SCHED_FINISH_ERROR) fail_msg("request %d failed: %s", i, u.message);
        assert_int_equal(u.finish, KS_SCHED_FINISH_LENGTH);
        char *want = reference(prompts[i], N, "quest", 16, sp);
        assert_string_equal(got, want);
        free(got), free(want);
        ks_sched_req_release(s, r[i]);
    }
    g_ignore_eos = false;
    ks_sched_get_metrics(s, &m);
    if (m.pauses < 1) fail_msg("cap %.0f: no request was paused", cap);
    assert_int_equal(m.resumes, m.pauses);
    assert_int_equal(m.paused, 0);
    assert_int_equal(max_running, 3); /* admitted together: by the sum, not slots x longest */
    assert_int_equal(m.requests_failed, 0);
    assert_int_equal(m.kv_bytes_fast, 0);
    assert_int_equal(m.kv_bytes_slow, 0);
    ks_sched_destroy(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chunkable),
        cmocka_unit_test(test_mem_cap_mixed_budgets),
        cmocka_unit_test(test_mem_cap_pause),
        cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_cancel_frees_slot),
        cmocka_unit_test(test_queue_bound_and_lengths),
        cmocka_unit_test(test_stop_strings),
        cmocka_unit_test(test_shutdown),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
