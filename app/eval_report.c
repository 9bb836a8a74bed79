/*
 * eval_report.c — `kvsieve eval`'s outputs (eval_report.h): the summary,
 * the JSON document, the plain table and the SVG plots, all read from the
 * filled cells of a sweep.
 */
#include "eval_report.h"

#include "commands.h"
#include "kvsieve_tools.h"

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
    int cap = KS_EVAL_TASK_COUNT + w->n_cfg + 2, nd = 0;
    const char **docs = calloc((size_t)cap, sizeof *docs);
    char **own = calloc((size_t)cap, sizeof *own);
    double *acc = malloc(sizeof(double) * (size_t)w->n_len * (size_t)w->n_depth); /* [w->n_depth][w->n_len] */
    bool ok = true;
    for (int k = 0; k < w->n_cfg && ok; k++)
        for (int t = -1; t < KS_EVAL_TASK_COUNT && ok; t++) {
            if (t >= 0 && (!w->task_on[t] || k > 0)) continue;
            for (int d = 0; d < w->n_depth; d++)
                for (int l = 0; l < w->n_len; l++) {
                    double sc = 0;
                    int r = 0;
                    for (int tt = 0; tt < KS_EVAL_TASK_COUNT; tt++) {
                        if (!w->task_on[tt] || (t >= 0 && tt != t)) continue;
                        const eval_cell *c = &w->cells[k * w->per_cfg + ((size_t)tt * w->n_len + l) * w->n_depth + d];
                        if (c->runs) sc += c->score_sum / c->runs, r++;
                    }
                    acc[(size_t)d * w->n_len + l] = r ? sc / r : NAN;
                }
            char title[160];
            snprintf(title, sizeof title, "%s accuracy: %s", w->cfgs[k].label,
                     t < 0 ? "all tasks" : ks_eval_task_name((ks_eval_task)t));
            if (ks_eval_svg_heatmap(title, w->lens, w->n_len, w->depths, w->n_depth, acc, &own[nd]) != KS_OK) ok = false;
            else docs[nd] = own[nd], nd++;
        }
    free(acc);
    /* accuracy vs budget: x is the budget as % of the context when budgets are relative */
    ks_eval_series *series = calloc((size_t)w->po->n_names + 1, sizeof *series);
    double *xs = calloc((size_t)(w->po->n_names + 1) * (w->po->n_budgets + 1), sizeof(double));
    double *ys = calloc((size_t)(w->po->n_names + 1) * (w->po->n_budgets + 1), sizeof(double));
    int ns = 0;
    double dense_x = w->po->budgets[0].pct ? 100.0 : (double)w->lens[w->n_len - 1];
    xs[0] = dense_x;
    ys[0] = w->sums[0].acc;
    series[ns++] = (ks_eval_series){"dense", 1, xs, ys, true};
    for (int pi = 0; pi < w->po->n_names; pi++) {
        if (!strcmp(w->po->names[pi], "dense")) continue;
        double *x = xs + (size_t)ns * (w->po->n_budgets + 1), *y = ys + (size_t)ns * (w->po->n_budgets + 1);
        int n = 0;
        for (int k = 1; k < w->n_cfg; k++)
            if (w->cfgs[k].pi == pi) {
                x[n] = w->po->budgets[w->cfgs[k].bi].value;
                y[n++] = w->sums[k].acc;
            }
        series[ns++] = (ks_eval_series){w->po->names[pi], n, x, y, false};
    }
    const char *title = w->po->budgets[0].pct ? "accuracy vs KV budget (% of context, all tasks)"
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
        out->turn_pol += c->turn_pol;
        out->turn_orc += c->turn_orc;
        out->turn_sel += c->turn_sel;
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
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "model", meta->model_path);
    cJSON_AddNumberToObject(root, "seed", (double)meta->seed);
    cJSON_AddNumberToObject(root, "samples", (double)meta->samples);
    cJSON_AddNumberToObject(root, "n_ctx_train", meta->n_ctx_train);
    cJSON_AddNumberToObject(root, "sink", (double)w->po->sink);
    cJSON_AddNumberToObject(root, "window", (double)w->po->window);
    cJSON_AddNumberToObject(root, "page", (double)w->po->page);
    cJSON_AddStringToObject(root, "simd", ks_simd_name(ks_simd_current()));
    if (meta->ref_simd >= 0)
        cJSON_AddStringToObject(root, "reference_simd", ks_simd_name((ks_simd_level)meta->ref_simd));
    cJSON *res = cJSON_AddArrayToObject(root, "results");
    for (int k = 0; k < w->n_cfg; k++)
        for (size_t i = 0; i < w->per_cfg; i++) {
            const eval_cell *c = &w->cells[k * w->per_cfg + i];
            if (!c->runs) continue;
            cJSON *r = cJSON_CreateObject();
            cJSON_AddStringToObject(r, "config", w->cfgs[k].label);
            cJSON_AddStringToObject(r, "policy", k ? w->po->names[w->cfgs[k].pi] : "dense");
            if (k) cJSON_AddStringToObject(r, "kv_type", w->kv_type == KS_KV_Q8 ? "q8" : "f16");
            if (k && w->cfgs[k].bi >= 0) {
                char bl[32];
                app_budget_label(&w->po->budgets[w->cfgs[k].bi], bl, sizeof bl);
                cJSON_AddStringToObject(r, "budget", bl);
                cJSON_AddNumberToObject(r, "budget_tokens", app_budget_tokens(&w->po->budgets[w->cfgs[k].bi], w->lens[c->li]));
            } else {
                cJSON_AddNullToObject(r, "budget");
            }
            cJSON_AddStringToObject(r, "task", ks_eval_task_name((ks_eval_task)c->task));
            cJSON_AddNumberToObject(r, "length", w->lens[c->li]);
            cJSON_AddNumberToObject(r, "depth", w->depths[c->di]);
            cJSON_AddNumberToObject(r, "samples", c->runs);
            cJSON_AddNumberToObject(r, "accuracy", c->score_sum / c->runs);
            cJSON_AddNumberToObject(r, "mean_tokens", c->total_sum / c->runs);
            cJSON_AddNumberToObject(r, "tok_s", c->seconds > 0 ? c->tokens / c->seconds : 0);
            if (k) {
                cJSON_AddNumberToObject(r, "agreement_forced", c->agree_tf_sum / c->runs);
                cJSON_AddNumberToObject(r, "agreement_free", c->agree_free_sum / c->runs);
                cJSON_AddNumberToObject(r, "kl", c->kl_sum / c->runs);
                if (c->recall_runs) cJSON_AddNumberToObject(r, "attention_recall", c->recall_sum / c->recall_runs);
                if (c->turn_sel) {
                    cJSON_AddNumberToObject(r, "turnover", (double)c->turn_pol / (double)c->turn_sel);
                    cJSON_AddNumberToObject(r, "oracle_turnover", (double)c->turn_orc / (double)c->turn_sel);
                }
            }
            cJSON_AddItemToArray(res, r);
        }
    cJSON *sarr = cJSON_AddArrayToObject(root, "summary");
    for (int k = 0; k < w->n_cfg; k++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "config", w->cfgs[k].label);
        for (int t = 0; t < KS_EVAL_TASK_COUNT; t++)
            if (w->sums[k].task_cells[t]) cJSON_AddNumberToObject(o, ks_eval_task_name((ks_eval_task)t), w->sums[k].task_acc[t]);
        cJSON_AddNumberToObject(o, "all", w->sums[k].acc);
        cJSON_AddNumberToObject(o, "tok_s", w->sums[k].tok_s);
        if (k) {
            cJSON_AddNumberToObject(o, "agreement_forced", w->sums[k].agree_tf);
            cJSON_AddNumberToObject(o, "agreement_free", w->sums[k].agree_free);
            cJSON_AddNumberToObject(o, "kl", w->sums[k].kl);
            if (w->sums[k].recall == w->sums[k].recall) cJSON_AddNumberToObject(o, "attention_recall", w->sums[k].recall);
            if (w->sums[k].turn_sel) { /* entries new to the selection a step, and to the oracle's top-T */
                cJSON_AddNumberToObject(o, "turnover", (double)w->sums[k].turn_pol / (double)w->sums[k].turn_sel);
                cJSON_AddNumberToObject(o, "oracle_turnover", (double)w->sums[k].turn_orc / (double)w->sums[k].turn_sel);
                cJSON_AddNumberToObject(o, "turnover_vs_oracle",
                                        w->sums[k].turn_orc ? (double)w->sums[k].turn_pol / (double)w->sums[k].turn_orc : 0.0);
            }
            cJSON *pc = cJSON_AddObjectToObject(o, "policy_counters");
            cJSON_AddNumberToObject(pc, "selections", (double)w->sums[k].selections);
            cJSON_AddNumberToObject(pc, "hits", (double)w->sums[k].hits);
            cJSON_AddNumberToObject(pc, "misses", (double)w->sums[k].misses);
            cJSON_AddNumberToObject(pc, "corrections", (double)w->sums[k].corrections);
            cJSON_AddNumberToObject(pc, "rebuilds", (double)w->sums[k].rebuilds);
            if (w->sums[k].topp_refined) {
                double n = (double)w->sums[k].topp_refined;
                cJSON_AddNumberToObject(pc, "topp_picked_per_head", (double)w->sums[k].topp_picked / n);
                cJSON_AddNumberToObject(pc, "topp_kept_per_head", (double)w->sums[k].topp_kept / n);
                cJSON_AddNumberToObject(pc, "topp_head_min", w->sums[k].topp_head_min);
                cJSON_AddNumberToObject(pc, "topp_head_max", w->sums[k].topp_head_max);
            }
            if (w->pol_sel[k]) {
                cJSON_AddNumberToObject(o, "selections", (double)w->pol_sel[k]);
                cJSON_AddNumberToObject(o, "rebuilds", (double)w->pol_reb[k]);
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
    printf("%-18s %-10s %7s %6s %7s %9s %8s %8s %8s %8s %9s\n", "config", "task", "length", "depth", "samples",
           "accuracy", "agree_tf", "agree_fr", "KL", "recall", "tok/s");
    for (int k = 0; k < w->n_cfg; k++)
        for (size_t i = 0; i < w->per_cfg; i++) {
            const eval_cell *c = &w->cells[k * w->per_cfg + i];
            if (!c->runs) continue;
            char a1[16] = "-", a2[16] = "-", a3[16] = "-", a4[16] = "-";
            if (k) {
                snprintf(a1, sizeof a1, "%.3f", c->agree_tf_sum / c->runs);
                snprintf(a2, sizeof a2, "%.3f", c->agree_free_sum / c->runs);
                snprintf(a3, sizeof a3, "%.4f", c->kl_sum / c->runs);
                if (c->recall_runs) snprintf(a4, sizeof a4, "%.3f", c->recall_sum / c->recall_runs);
            }
            printf("%-18s %-10s %7d %6.2f %7d %9.3f %8s %8s %8s %8s %9.1f\n", w->cfgs[k].label,
                   ks_eval_task_name((ks_eval_task)c->task), w->lens[c->li], w->depths[c->di], c->runs,
                   c->score_sum / c->runs, a1, a2, a3, a4, c->seconds > 0 ? c->tokens / c->seconds : 0);
        }
    printf("\n%-18s", "summary");
    for (int t = 0; t < KS_EVAL_TASK_COUNT; t++)
        if (w->sums[0].task_cells[t]) printf(" %10s", ks_eval_task_name((ks_eval_task)t));
    printf(" %8s %8s %8s %8s %8s %9s\n", "all", "agree_tf", "agree_fr", "KL", "recall", "tok/s");
    for (int k = 0; k < w->n_cfg; k++) {
        printf("%-18s", w->cfgs[k].label);
        for (int t = 0; t < KS_EVAL_TASK_COUNT; t++)
            if (w->sums[0].task_cells[t]) printf(" %10.3f", w->sums[k].task_acc[t]);
        if (k)
            printf(" %8.3f %8.3f %8.3f %8.4f %8.3f %9.1f\n", w->sums[k].acc, w->sums[k].agree_tf, w->sums[k].agree_free,
                   w->sums[k].kl, w->sums[k].recall, w->sums[k].tok_s);
        else
            printf(" %8.3f %8s %8s %8s %8s %9.1f\n", w->sums[k].acc, "-", "-", "-", "-", w->sums[k].tok_s);
    }
    for (int k = 1; k < w->n_cfg; k++)
        if (w->sums[k].selections || w->sums[k].hits || w->sums[k].misses || w->sums[k].corrections || w->sums[k].rebuilds) {
            uint64_t hm = w->sums[k].hits + w->sums[k].misses;
            printf("counters %-18s selections %llu, hits %llu, misses %llu (miss rate %.3f), corrections %llu "
                   "(%.3f of selections), rebuilds %llu\n", w->cfgs[k].label, (unsigned long long)w->sums[k].selections,
                   (unsigned long long)w->sums[k].hits, (unsigned long long)w->sums[k].misses,
                   hm ? (double)w->sums[k].misses / hm : 0.0, (unsigned long long)w->sums[k].corrections,
                   w->sums[k].selections ? (double)w->sums[k].corrections / w->sums[k].selections : 0.0,
                   (unsigned long long)w->sums[k].rebuilds);
        }
    for (int k = 1; k < w->n_cfg; k++)
        if (w->sums[k].topp_refined)
            printf("topp     %-18s kept %.1f of %.1f picks per head and step (per head: %.1f to %.1f)\n", w->cfgs[k].label,
                   (double)w->sums[k].topp_kept / w->sums[k].topp_refined,
                   (double)w->sums[k].topp_picked / w->sums[k].topp_refined, w->sums[k].topp_head_min,
                   w->sums[k].topp_head_max);
    printf("mean all        %.3f  (policy dense)\n", w->sums[0].acc);
}
