/*
 * eval_report.c — `kvsieve eval`'s outputs (eval_report.h): the summary,
 * the JSON document, the plain table and the SVG plots, all read from the
 * filled cells of a sweep.
 */
#include "eval_report.h"

#include "commands.h"
#include "core/simd.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool write_file(const char *path, const char *text) {
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

/* heat maps of dense accuracy (all tasks, then each task), one "all tasks"
 * heat map per policy configuration, then accuracy vs budget per policy */
bool eval_plot(const char *path, const eval_sweep *w) {
    const eval_cell *cells = w->cells;
    const eval_cfg *cfgs = w->cfgs;
    const eval_summary *sum = w->sums;
    const app_policy_opts *po = w->po;
    const bool *task_on = w->task_on;
    const int32_t *lens = w->lens;
    const double *depths = w->depths;
    int n_len = w->n_len, n_depth = w->n_depth, n_cfg = w->n_cfg;
    int cap = KS_EVAL_TASK_COUNT + n_cfg + 2, nd = 0;
    const char **docs = calloc((size_t)cap, sizeof *docs);
    char **own = calloc((size_t)cap, sizeof *own);
    double *acc = malloc(sizeof(double) * (size_t)n_len * (size_t)n_depth); /* [n_depth][n_len] */
    size_t per_cfg = w->per_cfg;
    bool ok = true;
    for (int k = 0; k < n_cfg && ok; k++)
        for (int t = -1; t < KS_EVAL_TASK_COUNT && ok; t++) {
            if (t >= 0 && (!task_on[t] || k > 0)) continue;
            for (int d = 0; d < n_depth; d++)
                for (int l = 0; l < n_len; l++) {
                    double sc = 0;
                    int r = 0;
                    for (int tt = 0; tt < KS_EVAL_TASK_COUNT; tt++) {
                        if (!task_on[tt] || (t >= 0 && tt != t)) continue;
                        const eval_cell *c = &cells[k * per_cfg + ((size_t)tt * n_len + l) * n_depth + d];
                        if (c->runs) sc += c->score_sum / c->runs, r++;
                    }
                    acc[(size_t)d * n_len + l] = r ? sc / r : NAN;
                }
            char title[160];
            snprintf(title, sizeof title, "%s accuracy: %s", cfgs[k].label,
                     t < 0 ? "all tasks" : ks_eval_task_name((ks_eval_task)t));
            if (ks_eval_svg_heatmap(title, lens, n_len, depths, n_depth, acc, &own[nd]) != KS_OK) ok = false;
            else docs[nd] = own[nd], nd++;
        }
    free(acc);
    /* accuracy vs budget: x is the budget as % of the context when budgets are relative */
    ks_eval_series *series = calloc((size_t)po->n_names + 1, sizeof *series);
    double *xs = calloc((size_t)(po->n_names + 1) * (po->n_budgets + 1), sizeof(double));
    double *ys = calloc((size_t)(po->n_names + 1) * (po->n_budgets + 1), sizeof(double));
    int ns = 0;
    double dense_x = po->budgets[0].pct ? 100.0 : (double)lens[n_len - 1];
    xs[0] = dense_x;
    ys[0] = sum[0].acc;
    series[ns++] = (ks_eval_series){"dense", 1, xs, ys, true};
    for (int pi = 0; pi < po->n_names; pi++) {
        if (!strcmp(po->names[pi], "dense")) continue;
        double *x = xs + (size_t)ns * (po->n_budgets + 1), *y = ys + (size_t)ns * (po->n_budgets + 1);
        int n = 0;
        for (int k = 1; k < n_cfg; k++)
            if (cfgs[k].pi == pi) {
                x[n] = po->budgets[cfgs[k].bi].value;
                y[n++] = sum[k].acc;
            }
        series[ns++] = (ks_eval_series){po->names[pi], n, x, y, false};
    }
    const char *title = po->budgets[0].pct ? "accuracy vs KV budget (% of context, all tasks)"
                                           : "accuracy vs KV budget (tokens, all tasks)";
    if (ok && ks_eval_svg_budget_chart(title, series, ns, &own[nd]) == KS_OK) docs[nd] = own[nd], nd++;
    else ok = false;
    free(series);
    free(xs);
    free(ys);
    char *svg = NULL;
    if (ok && ks_eval_svg_stack(docs, nd, &svg) != KS_OK) ok = false;
    if (!ok) app_report("eval", "drawing the plot", KS_ERR_INVALID_ARG);
    if (ok) ok = write_file(path, svg);
    free(svg);
    for (int i = 0; i < nd; i++) free(own[i]);
    free(own);
    free(docs);
    return ok;
}

void eval_summarize(const eval_cell *cells, size_t n_cells, eval_summary *out) {
    memset(out, 0, sizeof *out);
    double secs = 0, toks = 0;
    for (size_t i = 0; i < n_cells; i++) {
        const eval_cell *c = &cells[i];
        if (!c->runs) continue;
        out->task_acc[c->task] += c->score_sum / c->runs;
        out->task_cells[c->task]++;
        out->agree_tf += c->agree_tf_sum;
        out->agree_free += c->agree_free_sum;
        out->kl += c->kl_sum;
        out->recall += c->recall_sum;
        out->recall_runs += c->recall_runs;
        out->runs += c->runs;
        secs += c->seconds;
        toks += c->tokens;
    }
    for (int t = 0; t < KS_EVAL_TASK_COUNT; t++)
        if (out->task_cells[t]) out->task_acc[t] /= out->task_cells[t], out->acc += out->task_acc[t], out->n_tasks++;
    if (out->n_tasks) out->acc /= out->n_tasks;
    if (out->runs) out->agree_tf /= out->runs, out->agree_free /= out->runs, out->kl /= out->runs;
    out->recall = out->recall_runs ? out->recall / out->recall_runs : NAN;
    out->tok_s = secs > 0 ? toks / secs : 0;
}

bool eval_print_json(const eval_sweep *w, const eval_meta *meta) {
    const eval_cell *cells = w->cells;
    const eval_cfg *cfgs = w->cfgs;
    const eval_summary *sums = w->sums;
    const app_policy_opts *po = w->po;
    const int32_t *lens = w->lens;
    const double *depths = w->depths;
    size_t per_cfg = w->per_cfg;
    int n_cfg = w->n_cfg;
    ks_kv_type kv_type = w->kv_type;
    const uint64_t *pol_sel = w->pol_sel, *pol_reb = w->pol_reb;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "model", meta->model_path);
    cJSON_AddNumberToObject(root, "seed", (double)meta->seed);
    cJSON_AddNumberToObject(root, "samples", (double)meta->samples);
    cJSON_AddNumberToObject(root, "n_ctx_train", meta->n_ctx_train);
    cJSON_AddNumberToObject(root, "sink", (double)po->sink);
    cJSON_AddNumberToObject(root, "window", (double)po->window);
    cJSON_AddNumberToObject(root, "page", (double)po->page);
    cJSON_AddStringToObject(root, "simd", ks_simd_name(ks_simd_current()));
    if (meta->ref_simd >= 0)
        cJSON_AddStringToObject(root, "reference_simd", ks_simd_name((ks_simd_level)meta->ref_simd));
    cJSON *res = cJSON_AddArrayToObject(root, "results");
    for (int k = 0; k < n_cfg; k++)
        for (size_t i = 0; i < per_cfg; i++) {
            const eval_cell *c = &cells[k * per_cfg + i];
            if (!c->runs) continue;
            cJSON *r = cJSON_CreateObject();
            cJSON_AddStringToObject(r, "config", cfgs[k].label);
            cJSON_AddStringToObject(r, "policy", k ? po->names[cfgs[k].pi] : "dense");
            if (k) cJSON_AddStringToObject(r, "kv_type", kv_type == KS_KV_Q8 ? "q8" : "f16");
            if (k && cfgs[k].bi >= 0) {
                char bl[32];
                app_budget_label(&po->budgets[cfgs[k].bi], bl, sizeof bl);
                cJSON_AddStringToObject(r, "budget", bl);
                cJSON_AddNumberToObject(r, "budget_tokens", app_budget_tokens(&po->budgets[cfgs[k].bi], lens[c->li]));
            } else {
                cJSON_AddNullToObject(r, "budget");
            }
            cJSON_AddStringToObject(r, "task", ks_eval_task_name((ks_eval_task)c->task));
            cJSON_AddNumberToObject(r, "length", lens[c->li]);
            cJSON_AddNumberToObject(r, "depth", depths[c->di]);
            cJSON_AddNumberToObject(r, "samples", c->runs);
            cJSON_AddNumberToObject(r, "accuracy", c->score_sum / c->runs);
            cJSON_AddNumberToObject(r, "mean_tokens", c->total_sum / c->runs);
            cJSON_AddNumberToObject(r, "tok_s", c->seconds > 0 ? c->tokens / c->seconds : 0);
            if (k) {
                cJSON_AddNumberToObject(r, "agreement_forced", c->agree_tf_sum / c->runs);
                cJSON_AddNumberToObject(r, "agreement_free", c->agree_free_sum / c->runs);
                cJSON_AddNumberToObject(r, "kl", c->kl_sum / c->runs);
                if (c->recall_runs) cJSON_AddNumberToObject(r, "attention_recall", c->recall_sum / c->recall_runs);
            }
            cJSON_AddItemToArray(res, r);
        }
    cJSON *sarr = cJSON_AddArrayToObject(root, "summary");
    for (int k = 0; k < n_cfg; k++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "config", cfgs[k].label);
        for (int t = 0; t < KS_EVAL_TASK_COUNT; t++)
            if (sums[k].task_cells[t]) cJSON_AddNumberToObject(o, ks_eval_task_name((ks_eval_task)t), sums[k].task_acc[t]);
        cJSON_AddNumberToObject(o, "all", sums[k].acc);
        cJSON_AddNumberToObject(o, "tok_s", sums[k].tok_s);
        if (k) {
            cJSON_AddNumberToObject(o, "agreement_forced", sums[k].agree_tf);
            cJSON_AddNumberToObject(o, "agreement_free", sums[k].agree_free);
            cJSON_AddNumberToObject(o, "kl", sums[k].kl);
            if (sums[k].recall == sums[k].recall) cJSON_AddNumberToObject(o, "attention_recall", sums[k].recall);
            cJSON *pc = cJSON_AddObjectToObject(o, "policy_counters");
            cJSON_AddNumberToObject(pc, "selections", (double)sums[k].selections);
            cJSON_AddNumberToObject(pc, "hits", (double)sums[k].hits);
            cJSON_AddNumberToObject(pc, "misses", (double)sums[k].misses);
            cJSON_AddNumberToObject(pc, "corrections", (double)sums[k].corrections);
            cJSON_AddNumberToObject(pc, "rebuilds", (double)sums[k].rebuilds);
            if (pol_sel[k]) {
                cJSON_AddNumberToObject(o, "selections", (double)pol_sel[k]);
                cJSON_AddNumberToObject(o, "rebuilds", (double)pol_reb[k]);
            }
        }
        cJSON_AddItemToArray(sarr, o);
    }
    char *text = root ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!text) {
        fprintf(stderr, "kvsieve eval: out of memory writing the JSON report\n");
        return false;
    }
    printf("%s\n", text);
    cJSON_free(text);
    return true;
}

void eval_print_table(const eval_sweep *w) {
    const eval_cell *cells = w->cells;
    const eval_cfg *cfgs = w->cfgs;
    const eval_summary *sums = w->sums;
    const int32_t *lens = w->lens;
    const double *depths = w->depths;
    size_t per_cfg = w->per_cfg;
    int n_cfg = w->n_cfg;
    printf("%-18s %-10s %7s %6s %7s %9s %8s %8s %8s %8s %9s\n", "config", "task", "length", "depth", "samples",
           "accuracy", "agree_tf", "agree_fr", "KL", "recall", "tok/s");
    for (int k = 0; k < n_cfg; k++)
        for (size_t i = 0; i < per_cfg; i++) {
            const eval_cell *c = &cells[k * per_cfg + i];
            if (!c->runs) continue;
            char a1[16] = "-", a2[16] = "-", a3[16] = "-", a4[16] = "-";
            if (k) {
                snprintf(a1, sizeof a1, "%.3f", c->agree_tf_sum / c->runs);
                snprintf(a2, sizeof a2, "%.3f", c->agree_free_sum / c->runs);
                snprintf(a3, sizeof a3, "%.4f", c->kl_sum / c->runs);
                if (c->recall_runs) snprintf(a4, sizeof a4, "%.3f", c->recall_sum / c->recall_runs);
            }
            printf("%-18s %-10s %7d %6.2f %7d %9.3f %8s %8s %8s %8s %9.1f\n", cfgs[k].label,
                   ks_eval_task_name((ks_eval_task)c->task), lens[c->li], depths[c->di], c->runs,
                   c->score_sum / c->runs, a1, a2, a3, a4, c->seconds > 0 ? c->tokens / c->seconds : 0);
        }
    printf("\n%-18s", "summary");
    for (int t = 0; t < KS_EVAL_TASK_COUNT; t++)
        if (sums[0].task_cells[t]) printf(" %10s", ks_eval_task_name((ks_eval_task)t));
    printf(" %8s %8s %8s %8s %8s %9s\n", "all", "agree_tf", "agree_fr", "KL", "recall", "tok/s");
    for (int k = 0; k < n_cfg; k++) {
        printf("%-18s", cfgs[k].label);
        for (int t = 0; t < KS_EVAL_TASK_COUNT; t++)
            if (sums[0].task_cells[t]) printf(" %10.3f", sums[k].task_acc[t]);
        if (k)
            printf(" %8.3f %8.3f %8.3f %8.4f %8.3f %9.1f\n", sums[k].acc, sums[k].agree_tf, sums[k].agree_free,
                   sums[k].kl, sums[k].recall, sums[k].tok_s);
        else
            printf(" %8.3f %8s %8s %8s %8s %9.1f\n", sums[k].acc, "-", "-", "-", "-", sums[k].tok_s);
    }
    for (int k = 1; k < n_cfg; k++)
        if (sums[k].selections || sums[k].hits || sums[k].misses || sums[k].corrections || sums[k].rebuilds) {
            uint64_t hm = sums[k].hits + sums[k].misses;
            printf("counters %-18s selections %llu, hits %llu, misses %llu (miss rate %.3f), corrections %llu "
                   "(%.3f of selections), rebuilds %llu\n", cfgs[k].label, (unsigned long long)sums[k].selections,
                   (unsigned long long)sums[k].hits, (unsigned long long)sums[k].misses,
                   hm ? (double)sums[k].misses / hm : 0.0, (unsigned long long)sums[k].corrections,
                   sums[k].selections ? (double)sums[k].corrections / sums[k].selections : 0.0,
                   (unsigned long long)sums[k].rebuilds);
        }
    printf("mean all        %.3f  (policy dense)\n", sums[0].acc);
}
