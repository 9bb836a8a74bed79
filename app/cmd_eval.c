/*
 * cmd_eval.c — `kvsieve eval`: long-context task accuracy.
 *
 * The command sweeps task x length x depth x sample, runs every instance
 * through the library's runner (prefill the prompt, greedy-decode the
 * answer) and reports accuracy and throughput per cell: a table on stdout,
 * or JSON with --json, plus SVG plots with --plot.  Each instance's seed is
 * derived from (--seed, task, length, depth, sample) alone, so a cell is the
 * same prompt whatever else is swept — the property that makes a policy run
 * comparable with a dense run cell by cell.
 *
 * Only dense attention exists today; --policy and --budget are parsed now
 * so scripts written against this interface keep working when the KV-store
 * issue brings policies, at which point each instance will also run on a
 * policy context teacher-forced with the dense tokens (ks_eval_run).
 * Lengths over the model's trained context are skipped with a note, since
 * accuracy past it measures extrapolation, not the policy.
 */
#include "args.h"
#include "commands.h"
#include "infer/eval.h"
#include "kvsieve.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EVAL_MAX_LIST 32

static const char *const g_usage =
    "usage: kvsieve eval [-m MODEL.gguf] [--task passkey,multikey,multivalue,vartrack,longgen|all]\n"
    "                    [--lengths 1024,4096,8192] [--depths 0,0.25,0.5,0.75,1] [--samples N (4)]\n"
    "                    [--seed S (1)] [-t THREADS] [--json] [--plot FILE.svg] [--policy dense] [--budget N]\n"
    "  lengths count every token of an instance (prompt and answer budget); lengths above\n"
    "  the model's trained context are skipped.  Only the dense policy exists so far.\n";

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

/* One cell of the sweep. */
typedef struct eval_cell {
    int task, li, di;
    int runs;           /* instances that ran */
    double score_sum;
    double tokens, seconds;
    double total_sum;   /* instance lengths, to report the mean */
} eval_cell;

static bool eval_write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "kvsieve eval: cannot write '%s': %s\n", path, strerror(errno));
        return false;
    }
    bool ok = fputs(text, f) >= 0;
    ok &= fclose(f) == 0;
    if (!ok) fprintf(stderr, "kvsieve eval: writing '%s' failed\n", path);
    return ok;
}

static bool eval_plot(const char *path, const eval_cell *cells, const bool *task_on, const int32_t *lens,
                      int n_len, const double *depths, int n_depth, double overall, long budget) {
    const char *docs[KS_EVAL_TASK_COUNT + 2];
    char *own[KS_EVAL_TASK_COUNT + 2] = {0};
    int nd = 0;
    double *acc = malloc(sizeof(double) * (size_t)n_len * (size_t)n_depth); /* [n_depth][n_len] */
    bool ok = true;
    for (int t = -1; t < KS_EVAL_TASK_COUNT && ok; t++) {
        if (t >= 0 && !task_on[t]) continue;
        for (int d = 0; d < n_depth; d++)
            for (int l = 0; l < n_len; l++) {
                double s = 0;
                int r = 0;
                for (int tt = 0; tt < KS_EVAL_TASK_COUNT; tt++) {
                    if (!task_on[tt] || (t >= 0 && tt != t)) continue;
                    const eval_cell *c = &cells[((size_t)tt * n_len + l) * n_depth + d];
                    if (c->runs) s += c->score_sum / c->runs, r++;
                }
                acc[(size_t)d * n_len + l] = r ? s / r : NAN;
            }
        char title[96];
        snprintf(title, sizeof title, "dense accuracy: %s", t < 0 ? "all tasks" : ks_eval_task_name((ks_eval_task)t));
        if (ks_eval_svg_heatmap(title, lens, n_len, depths, n_depth, acc, &own[nd]) != KS_OK) ok = false;
        else docs[nd] = own[nd], nd++;
    }
    free(acc);
    double x = budget > 0 ? (double)budget : (double)lens[n_len - 1];
    ks_eval_series dense = {"dense", 1, &x, &overall, true};
    if (ok && ks_eval_svg_budget_chart("accuracy vs KV budget (all tasks)", &dense, 1, &own[nd]) == KS_OK)
        docs[nd] = own[nd], nd++;
    else
        ok = false;
    char *svg = NULL;
    if (ok && ks_eval_svg_stack(docs, nd, &svg) != KS_OK) ok = false;
    if (!ok) app_report("eval", "drawing the plot", KS_ERR_INVALID_ARG);
    if (ok) ok = eval_write_file(path, svg);
    free(svg);
    for (int i = 0; i < nd; i++) free(own[i]);
    return ok;
}

int cmd_eval(int argc, char **argv) {
    const char *cmd = "eval", *model_path = NULL, *plot = NULL, *policy = "dense";
    bool task_on[KS_EVAL_TASK_COUNT] = {0}, json = false, tasks_given = false;
    long lens_l[EVAL_MAX_LIST] = {1024, 4096, 8192};
    int n_len = 3;
    double depths[EVAL_MAX_LIST] = {0, 0.25, 0.5, 0.75, 1};
    int n_depth = 5;
    long samples = 4, seed = 1, n_threads = 0, budget = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
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
        else if (!strcmp(a, "--budget")) { if (!(v = arg_value(cmd, argc, argv, &i)) || !arg_long(cmd, a, v, 1, 1 << 24, &budget)) return 2; }
        else if (!strcmp(a, "--policy")) { if (!(v = arg_value(cmd, argc, argv, &i))) return 2; policy = v; }
        else if (!strcmp(a, "--plot")) { if (!(v = arg_value(cmd, argc, argv, &i))) return 2; plot = v; }
        else if (!strcmp(a, "--json")) json = true;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { fputs(g_usage, stdout); return 0; }
        else { fprintf(stderr, "kvsieve eval: unknown option '%s'\n%s", a, g_usage); return 2; }
    }
    if (strcmp(policy, "dense")) {
        fprintf(stderr, "kvsieve eval: unknown policy '%s': only 'dense' exists so far; sparse policies arrive "
                        "with the KV-store issue\n", policy);
        return 2;
    }
    if (budget > 0) fprintf(stderr, "kvsieve eval: note: dense attention uses the whole context; --budget %ld is ignored\n", budget);
    if (!tasks_given)
        for (int t = 0; t < KS_EVAL_TASK_COUNT; t++) task_on[t] = true;
    if (!model_path) model_path = app_default_model();
    if (!model_path) { fprintf(stderr, "kvsieve eval: no model given (-m)\n"); return 2; }

    ks_model *m = NULL;
    ks_context *ctx = NULL;
    eval_cell *cells = NULL;
    cJSON *root = NULL;
    int rc = 1;
    ks_status st = ks_model_load(model_path, ks_model_default_params(), &m);
    if (st != KS_OK) { app_report(cmd, "loading the model", st); return 1; }
    int32_t n_train = ks_model_n_ctx_train(m);
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
    int32_t max_len = 0;
    for (int i = 0; i < n_len; i++) max_len = lens[i] > max_len ? lens[i] : max_len;
    ks_context_params cp = ks_context_default_params();
    cp.n_ctx = max_len;
    if (n_threads) cp.n_threads = (int32_t)n_threads;
    if ((st = ks_context_create(m, cp, &ctx)) != KS_OK) { app_report(cmd, "creating the context", st); goto done; }

    size_t n_cells = (size_t)KS_EVAL_TASK_COUNT * n_len * n_depth;
    cells = calloc(n_cells, sizeof *cells); /* [task][n_len][n_depth] */
    int ran = 0;
    for (int t = 0; t < KS_EVAL_TASK_COUNT; t++) {
        if (!task_on[t]) continue;
        for (int l = 0; l < n_len; l++)
            for (int d = 0; d < n_depth; d++) {
                eval_cell *c = &cells[((size_t)t * n_len + l) * n_depth + d];
                *c = (eval_cell){.task = t, .li = l, .di = d};
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
                    ks_eval_result res;
                    ks_eval_run_opts o = ks_eval_run_default_opts();
                    st = ks_eval_run(ctx, m, &inst, &o, &res);
                    ks_eval_instance_free(&inst);
                    if (st != KS_OK) { app_report(cmd, "running an instance", st); goto done; }
                    c->runs++;
                    c->score_sum += res.score;
                    c->tokens += res.n_prompt + res.n_gen;
                    c->seconds += res.seconds;
                    c->total_sum += inst.n_total;
                    ks_eval_result_free(&res);
                }
                ran += c->runs;
                if (c->runs)
                    fprintf(stderr, "kvsieve eval: %-10s len %6d depth %.2f: %.3f\n", ks_eval_task_name((ks_eval_task)t),
                            lens[l], depths[d], c->score_sum / c->runs);
            }
    }
    if (!ran) {
        fprintf(stderr, "kvsieve eval: no instance fits the lengths given\n");
        rc = 2;
        goto done;
    }

    /* per-task means (over cells) and the overall mean (over tasks) */
    double task_acc[KS_EVAL_TASK_COUNT] = {0}, overall = 0;
    int task_cells[KS_EVAL_TASK_COUNT] = {0}, n_tasks = 0;
    for (size_t i = 0; i < n_cells; i++)
        if (cells[i].runs) task_acc[cells[i].task] += cells[i].score_sum / cells[i].runs, task_cells[cells[i].task]++;
    for (int t = 0; t < KS_EVAL_TASK_COUNT; t++)
        if (task_cells[t]) task_acc[t] /= task_cells[t], overall += task_acc[t], n_tasks++;
    overall /= n_tasks;

    if (json) {
        root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "model", model_path);
        cJSON_AddStringToObject(root, "policy", policy);
        if (budget > 0) cJSON_AddNumberToObject(root, "budget", (double)budget);
        else cJSON_AddNullToObject(root, "budget");
        cJSON_AddNumberToObject(root, "seed", (double)seed);
        cJSON_AddNumberToObject(root, "samples", (double)samples);
        cJSON_AddNumberToObject(root, "n_ctx_train", n_train);
        cJSON *res = cJSON_AddArrayToObject(root, "results");
        for (size_t i = 0; i < n_cells; i++) {
            const eval_cell *c = &cells[i];
            if (!c->runs) continue;
            cJSON *r = cJSON_CreateObject();
            cJSON_AddStringToObject(r, "task", ks_eval_task_name((ks_eval_task)c->task));
            cJSON_AddNumberToObject(r, "length", lens[c->li]);
            cJSON_AddNumberToObject(r, "depth", depths[c->di]);
            cJSON_AddNumberToObject(r, "samples", c->runs);
            cJSON_AddNumberToObject(r, "accuracy", c->score_sum / c->runs);
            cJSON_AddNumberToObject(r, "mean_tokens", c->total_sum / c->runs);
            cJSON_AddNumberToObject(r, "tok_s", c->seconds > 0 ? c->tokens / c->seconds : 0);
            cJSON_AddItemToArray(res, r);
        }
        cJSON *sum = cJSON_AddObjectToObject(root, "summary");
        for (int t = 0; t < KS_EVAL_TASK_COUNT; t++)
            if (task_cells[t]) cJSON_AddNumberToObject(sum, ks_eval_task_name((ks_eval_task)t), task_acc[t]);
        cJSON_AddNumberToObject(sum, "all", overall);
        char *text = cJSON_Print(root);
        printf("%s\n", text);
        cJSON_free(text);
    } else {
        printf("%-10s %7s %6s %7s %9s %9s\n", "task", "length", "depth", "samples", "accuracy", "tok/s");
        for (size_t i = 0; i < n_cells; i++) {
            const eval_cell *c = &cells[i];
            if (!c->runs) continue;
            printf("%-10s %7d %6.2f %7d %9.3f %9.1f\n", ks_eval_task_name((ks_eval_task)c->task), lens[c->li],
                   depths[c->di], c->runs, c->score_sum / c->runs, c->seconds > 0 ? c->tokens / c->seconds : 0);
        }
        for (int t = 0; t < KS_EVAL_TASK_COUNT; t++)
            if (task_cells[t]) printf("mean %-10s %.3f\n", ks_eval_task_name((ks_eval_task)t), task_acc[t]);
        printf("mean all        %.3f  (policy %s)\n", overall, policy);
    }
    if (plot && !eval_plot(plot, cells, task_on, lens, n_len, depths, n_depth, overall, budget)) goto done;
    rc = 0;
done:
    cJSON_Delete(root);
    free(cells);
    ks_context_destroy(ctx);
    ks_model_destroy(m);
    return rc;
}
