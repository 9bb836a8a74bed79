/*
 * cmd_eval.c — `kvsieve eval`: long-context task accuracy.
 *
 * The command sweeps task x length x depth x sample, runs every instance
 * through the library's runner (prefill the prompt, greedy-decode the
 * answer) and reports accuracy and throughput per cell: a table on stdout,
 * or JSON with --json, plus SVG plots with --plot (eval_report.c).  Each instance's seed is
 * derived from (--seed, task, length, depth, sample) alone, so a cell is the
 * same prompt whatever else is swept — the property that makes a policy run
 * comparable with a dense run cell by cell.
 *
 * Dense attention always runs first: it is the reference.  Every other
 * --policy x --budget configuration then runs each instance twice on its own
 * context: free-running (task accuracy, token agreement with the dense
 * output) and teacher-forced with the dense tokens (top-1 agreement and
 * KL(dense || policy) position by position, and the attention recall probe:
 * the share of the dense attention mass its selections cover).  A budget
 * "6%" is 6% of each instance's length.  --calibrate also collects the
 * entropy and varentropy of every dense output distribution, averages them
 * per KV page of generated tokens (--page) and stores the 99th percentiles of
 * those page averages beside the model as CHESS's reconstruction thresholds
 * (calibrate.h); policy counters (selections, rebuilds) go to stderr and JSON.  Lengths over the model's trained
 * context are skipped with a note, since accuracy past it measures
 * extrapolation, not the policy.
 */
#include "args.h"
#include "calibrate.h"
#include "commands.h"
#include "eval_report.h"
#include "core/simd.h"
#include "eval/eval.h"
#include "infer/infer.h"
#include "kvsieve.h"
#include "policy_opts.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EVAL_MAX_LIST 32

static void eval_usage(FILE *f) {
    fprintf(f,
            "usage: kvsieve eval [-m MODEL.gguf] [--task passkey,multikey,multivalue,vartrack,longgen|all]\n"
            "                    [--lengths 1024,4096,8192] [--depths 0,0.25,0.5,0.75,1] [--samples N (4)]\n"
            "                    [--seed S (1)] [-t THREADS] [--json] [--plot FILE.svg] [--calibrate] [--show]\n"
            "                    [--dump-prompts DIR]\n"
            "                    [--policy dense,quest,...] [--budget 3%%,6%%,12%%] [--kv-type f16|q8]\n"
            "                    [--reference-simd scalar|avx2|avx512] [policy flags]\n"
            "  lengths count every token of an instance (prompt and answer budget); lengths above\n"
            "  the model's trained context are skipped.  Dense always runs as the reference.\n"
            "  --calibrate: write CHESS's thresholds (99th percentiles of the dense runs' per-page mean\n"
            "  entropy and varentropy, pages of --page tokens) to MODEL.gguf.chess.json, which\n"
            "  run/bench/eval then pass to chess.\n"
            "  --show: print each instance's question, expected and dense answer to stderr (a failing\n"
            "  task's errors, read one by one).\n"
            "  --dump-prompts DIR: write each instance's prompt to DIR/TASK-LENGTH-DEPTH-SAMPLE.txt (DIR\n"
            "  must exist), e.g. for tools/needle_study.py --prompt.\n"
            "  --kv-type q8: the compared configurations keep 8-bit KV (Q8_0 rows) while the dense\n"
            "  reference stays f16; list dense in --policy to compare dense on q8 with it.\n"
            "  --reference-simd scalar|avx2|avx512: run the dense reference on other kernels (another\n"
            "  summation order); with dense in --policy this measures the agreement two correct f16\n"
            "  computations reach, the noise floor of the agreement and KL columns.\n%s",
            app_policy_usage());
}

static void eval_show_text(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\n') fputs("\\n", stderr);
        else fputc(s[i], stderr);
    }
}

/* --show: one instance's question, the expected answers and what dense
 * generated (every GEN token, so longgen's own list shows too). */
static void eval_show(const ks_model *m, const ks_eval_instance *inst, const ks_eval_result *ref, int sample) {
    size_t n = strlen(inst->prompt);
    const char *tail = inst->prompt + (n > 90 ? n - 90 : 0);
    fprintf(stderr, "[%s %d depth %.2f #%d] score %.3f\n  ...", ks_eval_task_name(inst->task), inst->target_tokens,
            inst->depth, sample, ref->score);
    eval_show_text(tail, strlen(tail));
    if (inst->task != KS_EVAL_LONGGEN) { /* the inserted facts: every sentence with a digit or "VAR" before the question */
        fputs("\n  facts:", stderr);
        const char *question = strrchr(inst->prompt, '\n');
        for (const char *p = inst->prompt; *p && p < question;) {
            const char *end = strpbrk(p, ".\n");
            size_t len = end ? (size_t)(end - p) + 1 : strlen(p);
            bool fact = false;
            for (size_t i = 0; i < len && !fact; i++)
                fact = (p[i] >= '0' && p[i] <= '9') || (i + 3 <= len && !memcmp(p + i, "VAR", 3));
            if (fact) {
                fputs(" |", stderr);
                eval_show_text(p, len);
            }
            p += len;
        }
    }
    fputs("\n  expected:", stderr);
    for (int32_t i = 0; i < inst->n_answers; i++) fprintf(stderr, " '%s'", inst->answers[i]);
    fputs("\n  generated: '", stderr);
    for (int32_t i = 0; i < ref->n_gen; i++) {
        char piece[64];
        size_t len = 0;
        if (ks_token_to_piece(m, ref->tokens[i], piece, sizeof piece, &len) != KS_OK) continue;
        eval_show_text(piece, len < sizeof piece ? len : sizeof piece);
    }
    fputs("'\n", stderr);
}

/* --dump-prompts: the instance's prompt text, byte for byte. */
static ks_status eval_dump_prompt(const char *dir, const ks_eval_instance *inst, int sample) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s-%d-%.2f-%d.txt", dir, ks_eval_task_name(inst->task), inst->target_tokens,
             inst->depth, sample);
    FILE *f = fopen(path, "wb");
    size_t n = strlen(inst->prompt);
    bool ok = f && fwrite(inst->prompt, 1, n, f) == n;
    if (f && fclose(f) != 0) ok = false;
    return ok ? KS_OK : KS_FAIL(KS_ERR_IO, "cannot write %s", path);
}

static int eval_parse_depths(const char *s, double *out, int cap) {
    int n = 0;
    const char *p = s;
    while (*p) {
        char *end = NULL;
        errno = 0;
        double v = strtod(p, &end);
        if (end == p || errno || !(v >= 0.0 && v <= 1.0) || (*end && *end != ',') || n == cap) {
            fprintf(stderr, "kvsieve eval: --depths wants comma-separated numbers in [0, 1] (at most %d), got '%s'\n",
                    cap, s);
            return -1;
        }
        out[n++] = v;
        p = *end ? end + 1 : end;
        if (*end == ',' && !*p) {
            fprintf(stderr, "kvsieve eval: --depths has a trailing comma\n");
            return -1;
        }
    }
    if (!n) fprintf(stderr, "kvsieve eval: --depths is empty\n");
    return n ? n : -1;
}

static int eval_parse_tasks(const char *s, bool *on) {
    if (!strcmp(s, "all")) {
        for (int t = 0; t < KS_EVAL_TASK_COUNT; t++) on[t] = true;
        return KS_EVAL_TASK_COUNT;
    }
    char buf[256];
    if (strlen(s) >= sizeof buf || !*s) {
        fprintf(stderr, "kvsieve eval: bad --task '%s'\n", s);
        return -1;
    }
    strcpy(buf, s);
    int n = 0;
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        ks_eval_task t;
        if (ks_eval_task_parse(tok, &t) != KS_OK) {
            fprintf(stderr, "kvsieve eval: unknown task '%s' (passkey, multikey, multivalue, vartrack, longgen, all)\n",
                    tok);
            return -1;
        }
        n += !on[t];
        on[t] = true;
    }
    return n;
}

static uint64_t eval_mix(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

int cmd_eval(int argc, char **argv) {
    const char *cmd = "eval", *model_path = NULL, *plot = NULL, *dump_dir = NULL;
    bool task_on[KS_EVAL_TASK_COUNT] = {0}, json = false, tasks_given = false, calibrate = false, show = false;
    long lens_l[EVAL_MAX_LIST] = {1024, 4096, 8192};
    int n_len = 3;
    double depths[EVAL_MAX_LIST] = {0, 0.25, 0.5, 0.75, 1};
    int n_depth = 5;
    long samples = 4, seed = 1, n_threads = 0;
    ks_kv_type kv_type = KS_KV_F16; /* the compared configurations' KV; the reference is always f16 */
    int ref_simd = -1;              /* --reference-simd: the level the reference runs on (-1: the same) */
    app_policy_opts po;
    app_policy_opts_init(&po);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int pr = app_policy_opt(cmd, argc, argv, &i, &po, true);
        if (pr < 0) return 2;
        if (pr > 0) continue;
        if (!strcmp(a, "-m")) { if (!(v = arg_value(cmd, argc, argv, &i))) return 2; model_path = v; }
        else if (!strcmp(a, "--task")) {
            if (!(v = arg_value(cmd, argc, argv, &i)) || eval_parse_tasks(v, task_on) <= 0) return 2;
            tasks_given = true;
        } else if (!strcmp(a, "--lengths")) {
            if (!(v = arg_value(cmd, argc, argv, &i))) return 2;
            if ((n_len = arg_long_list(cmd, a, v, 16, 1 << 24, lens_l, EVAL_MAX_LIST)) <= 0) return 2;
        } else if (!strcmp(a, "--depths")) {
            if (!(v = arg_value(cmd, argc, argv, &i)) || (n_depth = eval_parse_depths(v, depths, EVAL_MAX_LIST)) <= 0) return 2;
        } else if (!strcmp(a, "--samples")) { if (!(v = arg_value(cmd, argc, argv, &i)) || !arg_long(cmd, a, v, 1, 100000, &samples)) return 2; }
        else if (!strcmp(a, "--seed")) { if (!(v = arg_value(cmd, argc, argv, &i)) || !arg_long(cmd, a, v, 0, 0x7fffffffL, &seed)) return 2; }
        else if (!strcmp(a, "-t")) { if (!(v = arg_value(cmd, argc, argv, &i)) || !arg_long(cmd, a, v, 1, 1024, &n_threads)) return 2; }
        else if (!strcmp(a, "--reference-simd")) {
            if (!(v = arg_value(cmd, argc, argv, &i))) return 2;
            for (int lv = KS_SIMD_SCALAR; lv <= KS_SIMD_AVX512; lv++)
                if (!strcmp(v, ks_simd_name((ks_simd_level)lv))) ref_simd = lv;
            if (ref_simd < 0) { fprintf(stderr, "kvsieve eval: --reference-simd must be scalar, avx2 or avx512, got '%s'\n", v); return 2; }
            if (ref_simd > (int)ks_simd_current()) {
                fprintf(stderr, "kvsieve eval: --reference-simd %s: this CPU (or KS_SIMD) allows up to %s\n", v,
                        ks_simd_name(ks_simd_current()));
                return 2;
            }
        }
        else if (!strcmp(a, "--kv-type")) { if (!(v = arg_value(cmd, argc, argv, &i)) || !arg_kv_type(cmd, v, &kv_type)) return 2; }
        else if (!strcmp(a, "--plot")) { if (!(v = arg_value(cmd, argc, argv, &i))) return 2; plot = v; }
        else if (!strcmp(a, "--json")) json = true;
        else if (!strcmp(a, "--calibrate")) calibrate = true;
        else if (!strcmp(a, "--show")) show = true;
        else if (!strcmp(a, "--dump-prompts")) { if (!(dump_dir = arg_value(cmd, argc, argv, &i))) return 2; }
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { eval_usage(stdout); return 0; }
        else { fprintf(stderr, "kvsieve eval: unknown option '%s'\n", a); eval_usage(stderr); return 2; }
    }
    if (!tasks_given)
        for (int t = 0; t < KS_EVAL_TASK_COUNT; t++) task_on[t] = true;
    if (!model_path) model_path = app_default_model();
    po.model_path = model_path;
    if (!model_path) { fprintf(stderr, "kvsieve eval: no model given (-m)\n"); return 2; }
    if (!app_policy_calibration(&po, cmd, model_path)) return 2;
    /* configurations: dense first, then every other policy x budget */
    eval_cfg cfgs[1 + APP_MAX_POLICIES * APP_MAX_BUDGETS];
    int n_cfg = 0;
    cfgs[n_cfg++] = (eval_cfg){-1, -1, "dense"};
    if (ref_simd >= 0) snprintf(cfgs[0].label, sizeof cfgs[0].label, "dense/ref-%s", ks_simd_name((ks_simd_level)ref_simd));
    const char *kv_suffix = kv_type == KS_KV_Q8 ? "/q8" : "";
    for (int pi = 0; pi < po.n_names; pi++) {
        if (!strcmp(po.names[pi], "dense")) {
            /* dense on the other KV type, or on other kernels than the reference's, is a configuration of its own */
            if (kv_type != KS_KV_F16 || ref_simd >= 0) {
                cfgs[n_cfg] = (eval_cfg){pi, -1, ""};
                snprintf(cfgs[n_cfg++].label, sizeof cfgs[0].label, "dense%s", kv_suffix);
            }
            continue;
        }
        for (int bi = 0; bi < po.n_budgets; bi++) {
            eval_cfg *c = &cfgs[n_cfg++];
            char bl[32];
            app_budget_label(&po.budgets[bi], bl, sizeof bl);
            *c = (eval_cfg){pi, bi, ""};
            snprintf(c->label, sizeof c->label, "%s@%s%s", po.names[pi], bl, kv_suffix);
        }
    }

    ks_model *m = NULL;
    ks_context **ctxs = calloc((size_t)n_cfg, sizeof *ctxs);
    eval_cell *cells = NULL;
    eval_summary *sums = NULL;
    int rc = 1;
    double *cal_h = NULL, *cal_v = NULL; /* [n_cal] entropies of the dense runs (--calibrate) */
    size_t n_cal = 0, cap_cal = 0, n_cal_tok = 0; /* pages, room, tokens */
    uint64_t *pol_sel = calloc((size_t)n_cfg * 2, sizeof(uint64_t)), *pol_reb = pol_sel + n_cfg;
    ks_status st = ks_model_load(model_path, ks_model_default_params(), &m);
    if (st != KS_OK) { app_report(cmd, "loading the model", st); free(ctxs); free(pol_sel); return 1; }
    int32_t n_train = ks_model_n_ctx_train(m), V = ks_model_n_vocab(m);
    int32_t lens[EVAL_MAX_LIST];
    int kept = 0;
    for (int i = 0; i < n_len; i++) {
        if (lens_l[i] > n_train) {
            fprintf(stderr, "kvsieve eval: skipping length %ld: above the model's trained context %d\n", lens_l[i], n_train);
            continue;
        }
        lens[kept++] = (int32_t)lens_l[i];
    }
    if (!kept) {
        fprintf(stderr, "kvsieve eval: every length exceeds the model's trained context %d (try --lengths %d)\n", n_train,
                n_train);
        rc = 2;
        goto done;
    }
    n_len = kept;
    size_t per_cfg = (size_t)KS_EVAL_TASK_COUNT * n_len * n_depth;
    cells = calloc(per_cfg * n_cfg, sizeof *cells); /* [cfg][task][n_len][n_depth] */
    sums = calloc((size_t)n_cfg, sizeof *sums);
    int ran = 0;
    for (int l = 0; l < n_len; l++) {
        /* one context per configuration, sized for this length (budgets in % follow it) */
        for (int k = 0; k < n_cfg; k++) {
            ks_context_params cp = ks_context_default_params();
            cp.n_ctx = lens[l];
            if (n_threads) cp.n_threads = (int32_t)n_threads;
            app_policy_apply(&po, cfgs[k].pi < 0 ? 0 : cfgs[k].pi,
                             cfgs[k].bi < 0 ? 0 : app_budget_tokens(&po.budgets[cfgs[k].bi], lens[l]), &cp);
            cp.n_ctx += ks_policy_prefill_room(cp.policy, cp.policy_args); /* DapQ's pseudo tokens, all of them */
            if (k > 0) cp.kv_type = kv_type;
            if (cfgs[k].pi < 0) { /* the reference: dense, resident, f16, none of the policy's arguments */
                cp.policy = "dense";
                cp.budget = 0;
                cp.policy_args = NULL;
                cp.kv_offload_layers = 0;
                cp.mem_cap = 0;
                cp.policy_args = NULL; /* the reference takes no policy's arguments */
            }
            if ((st = ks_context_create(m, cp, &ctxs[k])) != KS_OK) { app_report(cmd, "creating a context", st); goto done; }
            ks_context_set_recall_probe(ctxs[k], k > 0);
        }
        for (int t = 0; t < KS_EVAL_TASK_COUNT; t++) {
            if (!task_on[t]) continue;
            for (int d = 0; d < n_depth; d++) {
                for (int k = 0; k < n_cfg; k++)
                    cells[k * per_cfg + ((size_t)t * n_len + l) * n_depth + d] = (eval_cell){.task = t, .li = l, .di = d};
                for (long s = 0; s < samples; s++) {
                    uint64_t sd = eval_mix(eval_mix(eval_mix(eval_mix((uint64_t)seed) ^ (uint64_t)t) ^ (uint64_t)lens[l]) ^
                                           (uint64_t)llround(depths[d] * 1e6)) ^ (uint64_t)s;
                    ks_eval_instance inst;
                    st = ks_eval_generate((ks_eval_task)t, sd, lens[l], depths[d], m, &inst);
                    if (st == KS_ERR_INVALID_ARG) { /* too short for this task: the cell stays n/a */
                        if (d == 0)
                            fprintf(stderr, "kvsieve eval: skipping %s at length %d: too short for its smallest form\n",
                                    ks_eval_task_name((ks_eval_task)t), lens[l]);
                        break;
                    }
                    if (st != KS_OK) { app_report(cmd, "generating a task", st); goto done; }
                    ks_eval_result ref;
                    ks_eval_run_opts o = ks_eval_run_default_opts();
                    o.keep_logits = n_cfg > 1 || calibrate;
                    ks_simd_level simd_saved = ks_simd_current();
                    if (ref_simd >= 0) ks_simd_force((ks_simd_level)ref_simd); /* no other thread runs: a step boundary */
                    st = ks_eval_run(ctxs[0], m, &inst, &o, &ref);
                    ks_simd_force(simd_saved);
                    if (st != KS_OK) { ks_eval_instance_free(&inst); app_report(cmd, "running an instance", st); goto done; }
                    if (calibrate && ref.n_gen > 0) { /* per-page means of the dense distributions */
                        while (n_cal + (size_t)ref.n_gen > cap_cal) {
                            cap_cal = cap_cal ? 2 * cap_cal : 1024;
                            cal_h = realloc(cal_h, sizeof(double) * cap_cal);
                            cal_v = realloc(cal_v, sizeof(double) * cap_cal);
                        }
                        n_cal += app_chess_page_means(ref.logits, ref.n_gen, V, ref.n_prompt, (int32_t)po.page,
                                                      cal_h + n_cal, cal_v + n_cal);
                        n_cal_tok += (size_t)ref.n_gen;
                    }
                    if (show) eval_show(m, &inst, &ref, (int)s);
                    if (dump_dir && (st = eval_dump_prompt(dump_dir, &inst, (int)s)) != KS_OK) {
                        ks_eval_instance_free(&inst);
                        ks_eval_result_free(&ref);
                        app_report(cmd, "--dump-prompts", st);
                        goto done;
                    }
                    eval_cell *c0 = &cells[((size_t)t * n_len + l) * n_depth + d];
                    c0->runs++;
                    c0->score_sum += ref.score;
                    c0->tokens += ref.n_prompt + ref.n_gen;
                    c0->seconds += ref.seconds;
                    c0->total_sum += inst.n_total;
                    for (int k = 1; k < n_cfg && st == KS_OK; k++) {
                        eval_cell *c = &cells[k * per_cfg + ((size_t)t * n_len + l) * n_depth + d];
                        ks_eval_result fr, tf;
                        ks_eval_run_opts of = ks_eval_run_default_opts();
                        of.keep_logits = true;
                        if ((st = ks_eval_run(ctxs[k], m, &inst, &of, &fr)) != KS_OK) break;
                        /* a free run that produced exactly the dense tokens *is* the teacher-forced
                         * run (same inputs, same steps): reuse it instead of running again */
                        bool same = fr.n_gen == ref.n_gen &&
                                    (ref.n_gen == 0 || !memcmp(fr.tokens, ref.tokens, sizeof(int32_t) * ref.n_gen));
                        double recall = NAN;
                        if (same) {
                            ks_context_take_recall(ctxs[k], NULL, &recall);
                            tf = fr;
                            tf.answer = NULL;
                            tf.tokens = NULL;
                            tf.logits = fr.logits;
                        } else {
                            ks_context_take_recall(ctxs[k], NULL, NULL); /* count the forced run only */
                            ks_eval_run_opts ot = ks_eval_run_default_opts();
                            ot.forced = ref.tokens;
                            ot.n_forced = ref.n_gen;
                            ot.keep_logits = true;
                            if ((st = ks_eval_run(ctxs[k], m, &inst, &ot, &tf)) != KS_OK) { ks_eval_result_free(&fr); break; }
                            ks_context_take_recall(ctxs[k], NULL, &recall);
                        }
                        double agree_tf = 1, agree_free = 1, kl = 0;
                        int32_t nf = fr.n_gen < ref.n_gen ? fr.n_gen : ref.n_gen;
                        if (ref.n_gen > 0 && tf.n_gen == ref.n_gen) {
                            ks_eval_top1_agreement(tf.logits, ref.logits, ref.n_gen, V, &agree_tf);
                            ks_eval_mean_kl(ref.logits, tf.logits, ref.n_gen, V, &kl);
                        }
                        if (nf > 0) ks_eval_token_agreement(fr.tokens, ref.tokens, nf, &agree_free);
                        if (fr.n_gen != ref.n_gen && ref.n_gen > 0) /* stopped at a different length */
                            agree_free = agree_free * nf / (fr.n_gen > ref.n_gen ? fr.n_gen : ref.n_gen);
                        c->runs++;
                        c->score_sum += fr.score;
                        c->tokens += fr.n_prompt + fr.n_gen;
                        c->seconds += fr.seconds;
                        c->total_sum += inst.n_total;
                        c->agree_tf_sum += agree_tf;
                        c->agree_free_sum += agree_free;
                        c->kl_sum += kl;
                        if (recall == recall) c->recall_sum += recall, c->recall_runs++;
                        if (same) tf.logits = NULL; /* owned by fr */
                        ks_eval_result_free(&fr);
                        ks_eval_result_free(&tf);
                    }
                    ks_eval_result_free(&ref);
                    ks_eval_instance_free(&inst);
                    if (st != KS_OK) { app_report(cmd, "running an instance on a policy", st); goto done; }
                }
                for (int k = 0; k < n_cfg; k++) {
                    const eval_cell *c = &cells[k * per_cfg + ((size_t)t * n_len + l) * n_depth + d];
                    if (k == 0) ran += c->runs;
                    if (c->runs)
                        fprintf(stderr, "kvsieve eval: %-18s %-10s len %6d depth %.2f: %.3f\n", cfgs[k].label,
                                ks_eval_task_name((ks_eval_task)t), lens[l], depths[d], c->score_sum / c->runs);
                }
            }
        }
        for (int k = 0; k < n_cfg; k++) {
            ks_stats cs;
            ks_context_stats(ctxs[k], &cs);
            sums[k].selections += cs.policy_selections;
            sums[k].hits += cs.policy_hits;
            sums[k].misses += cs.policy_misses;
            sums[k].corrections += cs.policy_corrections;
            sums[k].rebuilds += cs.policy_rebuilds;
            ks_stats ps;
            ks_context_stats(ctxs[k], &ps);
            pol_sel[k] += ps.policy_selections;
            pol_reb[k] += ps.policy_rebuilds;
            if (k && ps.policy_selections)
                fprintf(stderr, "kvsieve eval: %-18s len %6d: %llu selections, %llu rebuilds\n", cfgs[k].label, lens[l],
                        (unsigned long long)ps.policy_selections, (unsigned long long)ps.policy_rebuilds);
            ks_context_destroy(ctxs[k]);
            ctxs[k] = NULL;
        }
    }
    if (!ran) {
        fprintf(stderr, "kvsieve eval: no instance fits the lengths given\n");
        rc = 2;
        goto done;
    }
    for (int k = 0; k < n_cfg; k++) {
        eval_summary counters = sums[k];
        eval_summarize(cells + k * per_cfg, per_cfg, &sums[k]);
        sums[k].selections = counters.selections;
        sums[k].hits = counters.hits;
        sums[k].misses = counters.misses;
        sums[k].corrections = counters.corrections;
        sums[k].rebuilds = counters.rebuilds;
    }
    if (calibrate) {
        if (!n_cal) {
            fprintf(stderr, "kvsieve eval: --calibrate: the dense runs decoded no token\n");
            goto done;
        }
        double h = app_percentile(cal_h, n_cal, APP_CHESS_CALIB_PERCENTILE);
        double v = app_percentile(cal_v, n_cal, APP_CHESS_CALIB_PERCENTILE);
        if (!app_chess_calib_write(cmd, model_path, h, v, n_cal_tok, n_cal, (int32_t)po.page)) goto done;
        fprintf(stderr,
                "kvsieve eval: chess calibration over %zu dense tokens in %zu pages of %ld: h_max=%.9g v_max=%.9g -> "
                "%s%s\n",
                n_cal_tok, n_cal, po.page, h, v, model_path, APP_CHESS_CALIB_SUFFIX);
    }

    eval_sweep sweep = {.cells = cells, .per_cfg = per_cfg, .cfgs = cfgs, .n_cfg = n_cfg, .sums = sums,
                        .lens = lens, .n_len = n_len, .depths = depths, .n_depth = n_depth, .task_on = task_on,
                        .po = &po, .pol_sel = pol_sel, .pol_reb = pol_reb, .kv_type = kv_type};
    if (json) {
        eval_meta meta = {.model_path = model_path, .seed = seed, .samples = samples, .n_ctx_train = n_train,
                          .ref_simd = ref_simd};
        if (!eval_print_json(&sweep, &meta)) goto done;
    } else {
        eval_print_table(&sweep);
    }
    if (plot && !eval_plot(plot, &sweep)) goto done;
    rc = 0;
done:
    free(cal_h);
    free(cal_v);
    free(pol_sel);
    free(cells);
    free(sums);
    for (int k = 0; k < n_cfg; k++) ks_context_destroy(ctxs[k]);
    free(ctxs);
    ks_model_destroy(m);
    return rc;
}
