/*
 * cmd_plan.c — `kvsieve plan`: SpeContext's adaptive memory management,
 * before anything runs.
 *
 * It builds the context a run would build (same model, policy, budget,
 * requests, KV type, threads) so the memory model sees the real sizes —
 * weights as loaded, the retrieval head's weights, the KV row size and the
 * measured runtime factor alpha — and prints Algorithm 1's thresholds: for k
 * offloaded layers, the longest sequence that still fits the fast tier, and
 * the predicted split at --ctx.  The context is created with a tiny n_ctx:
 * the plan does not depend on it.
 */
#include "args.h"
#include "commands.h"
#include "kvsieve.h"
#include "kvsieve_tools.h"
#include "opts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --dlm DIR: --policy spec --policy-arg dlm=DIR */
bool app_parse_dlm(app_options *o, const char *flag, const char *v) {
    app_policy_opts *po = &o->po;
    size_t used = strlen(po->args);
    if (used + strlen(v) + 6 > sizeof po->args) { fprintf(stderr, "kvsieve plan: --dlm path too long\n"); return false; }
    if (used) strcat(po->args, ",");
    strcat(po->args, "dlm=");
    strcat(po->args, v);
    if (!strcmp(po->names[0], "dense")) snprintf(po->names[0], sizeof po->names[0], "spec");
    return true;
}

static void plan_print(const app_options *o, const ks_context_params *cp, const ks_memplan_info *pl,
                       const ks_model_info *mi) {
    printf("model %s | policy %s | requests %d | budget %d | fast tier %.3f GB\n", o->model_path, cp->policy, pl->requests,
           pl->budget, pl->mem_cap / 1e9);
    printf("weights %.3f GB, policy weights %.4f GB, overhead x%.2f, alpha %.4f (measured runtime memory per token)\n",
           pl->model_bytes / 1e9, pl->dlm_bytes / 1e9, pl->overhead, pl->alpha);
    /* the plan counts every expert as weights (mapped from the file); a step touches only the active ones */
    if (mi->n_expert)
        printf("experts %.3f GB of the weights (%d a layer, %d active), counted whole; a decode step of one token "
               "reads %.3f GB of experts, %.3f GB of weights in all\n",
               mi->expert_bytes / 1e9, mi->n_expert, mi->n_expert_used, mi->expert_active_bytes / 1e9,
               mi->decode_bytes / 1e9);
    int n_global = pl->n_layer - pl->n_local;
    if (pl->n_local)
        printf("%d local layers (sliding window %d) hold min(S, %d) entries and stay fast; %d global layers below\n",
               pl->n_local, pl->window, pl->window, n_global);
    printf("%10s %10s %14s\n", "offloaded", "fast", "max S");
    for (int k = 0; k <= n_global; k++) {
        if (pl->thresholds[k] < 0) printf("%10d %10d %14s\n", k, pl->n_layer - k, "does not fit");
        else printf("%10d %10d %14lld\n", k, pl->n_layer - k, (long long)pl->thresholds[k]);
    }
    long ctx_at = o->ctx_at;
    if (ctx_at > 0) {
        int k = 0;
        while (k <= n_global && !(pl->thresholds[k] >= 0 && ctx_at <= pl->thresholds[k])) k++;
        if (k > n_global) printf("at S=%ld: does not fit even with every layer offloaded\n", ctx_at);
        else if (pl->n_local)
            printf("at S=%ld: %d global layers fast, %d offloaded (last first), %d local layers fast\n", ctx_at,
                   n_global - k, k, pl->n_local);
        else printf("at S=%ld: %d layers fast (0..%d), %d offloaded (last first)\n", ctx_at, pl->n_layer - k,
                    pl->n_layer - k - 1, k);
    }
}

int cmd_plan(int argc, char **argv) {
    app_options o;
    int rc = app_parse("plan", argc, argv, &o);
    if (rc >= 0) return rc;
    app_policy_opts *po = &o.po;
    if (po->mem_cap <= 0) { fprintf(stderr, "kvsieve plan: --mem-cap SIZE is required\n"); return 2; }
    if (po->budgets[0].pct || po->budgets[0].value <= 0) {
        fprintf(stderr, "kvsieve plan: --budget N (tokens) is required: offloaded layers keep N entries per head fast\n");
        return 2;
    }
    if ((rc = app_resolve_model(&o, false)) >= 0) return rc;
    ks_model *m = NULL;
    ks_context *ctx = NULL;
    if (!app_load_model(&o, ks_model_default_params(), &m)) return 1;
    o.n_batch = 16; /* the plan does not depend on the context's sizes */
    ks_context_params cp = app_context_params(&o, 0, (int32_t)po->budgets[0].value, 16, false);
    cp.n_seq = (int32_t)o.requests;
    rc = 1;
    if (app_create_context(&o, m, cp, "building the plan", &ctx)) {
        ks_memplan_info pl;
        ks_context_memplan(ctx, &pl);
        ks_model_info mi;
        ks_model_get_info(m, &mi);
        plan_print(&o, &cp, &pl, &mi);
        rc = 0;
    }
    ks_context_destroy(ctx);
    ks_model_destroy(m);
    return rc;
}
