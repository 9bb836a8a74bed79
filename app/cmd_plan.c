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
#include "policy_opts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cmd_plan(int argc, char **argv) {
    const char *cmd = "plan", *model_path = NULL;
    long requests = 1, n_threads = 0, ctx_at = 0;
    ks_kv_type kv_type = KS_KV_F16;
    app_policy_opts po;
    app_policy_opts_init(&po);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int pr = app_policy_opt(cmd, argc, argv, &i, &po, false);
        if (pr < 0) return 2;
        if (pr > 0) continue;
        if (!strcmp(a, "-m")) { if (!(v = arg_value(cmd, argc, argv, &i))) return 2; model_path = v; }
        else if (!strcmp(a, "--requests")) { if (!(v = arg_value(cmd, argc, argv, &i)) || !arg_long(cmd, a, v, 1, 4096, &requests)) return 2; }
        else if (!strcmp(a, "--ctx")) { if (!(v = arg_value(cmd, argc, argv, &i)) || !arg_long(cmd, a, v, 1, 1 << 30, &ctx_at)) return 2; }
        else if (!strcmp(a, "-t")) { if (!(v = arg_value(cmd, argc, argv, &i)) || !arg_long(cmd, a, v, 1, 1024, &n_threads)) return 2; }
        else if (!strcmp(a, "--dlm")) {
            if (!(v = arg_value(cmd, argc, argv, &i))) return 2;
            size_t used = strlen(po.args);
            if (used + strlen(v) + 6 > sizeof po.args) { fprintf(stderr, "kvsieve plan: --dlm path too long\n"); return 2; }
            if (used) strcat(po.args, ",");
            strcat(po.args, "dlm=");
            strcat(po.args, v);
            if (!strcmp(po.names[0], "dense")) snprintf(po.names[0], sizeof po.names[0], "spec");
        } else if (!strcmp(a, "--kv-type")) {
            if (!(v = arg_value(cmd, argc, argv, &i)) || !arg_kv_type(cmd, v, &kv_type)) return 2;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: kvsieve plan [-m MODEL.gguf] [--dlm DIR] --mem-cap SIZE --requests R --budget B [--ctx S]\n"
                   "                    [--kv-type f16|q8] [-t THREADS] [policy flags]\n"
                   "  --dlm DIR is short for --policy spec --policy-arg dlm=DIR\n%s",
                   app_policy_usage());
            return 0;
        } else { fprintf(stderr, "kvsieve plan: unknown option '%s'\n", a); return 2; }
    }
    if (po.mem_cap <= 0) { fprintf(stderr, "kvsieve plan: --mem-cap SIZE is required\n"); return 2; }
    if (po.budgets[0].pct || po.budgets[0].value <= 0) {
        fprintf(stderr, "kvsieve plan: --budget N (tokens) is required: offloaded layers keep N entries per head fast\n");
        return 2;
    }
    if (!model_path) model_path = app_default_model();
    po.model_path = model_path;
    if (!model_path) { fprintf(stderr, "kvsieve plan: no model given (-m)\n"); return 2; }
    ks_model *m = NULL;
    ks_context *ctx = NULL;
    ks_status st = ks_model_load(model_path, ks_model_default_params(), &m);
    if (st != KS_OK) { app_report(cmd, "loading the model", st); return 1; }
    ks_context_params cp = ks_context_default_params();
    cp.n_ctx = 16;
    cp.n_seq = (int32_t)requests;
    cp.n_threads = (int32_t)n_threads;
    cp.n_batch = 16;
    cp.kv_type = kv_type;
    app_policy_apply(&po, 0, (int32_t)po.budgets[0].value, &cp);
    int rc = 1;
    if ((st = ks_context_create(m, cp, &ctx)) != KS_OK) { app_report(cmd, "building the plan", st); goto done; }
    ks_memplan_info pl;
    ks_context_memplan(ctx, &pl);
    printf("model %s | policy %s | requests %d | budget %d | fast tier %.3f GB\n", model_path, cp.policy, pl.requests,
           pl.budget, pl.mem_cap / 1e9);
    printf("weights %.3f GB, policy weights %.4f GB, overhead x%.2f, alpha %.4f (measured runtime memory per token)\n",
           pl.model_bytes / 1e9, pl.dlm_bytes / 1e9, pl.overhead, pl.alpha);
    printf("%10s %10s %14s\n", "offloaded", "fast", "max S");
    for (int k = 0; k <= pl.n_layer; k++) {
        if (pl.thresholds[k] < 0) printf("%10d %10d %14s\n", k, pl.n_layer - k, "does not fit");
        else printf("%10d %10d %14lld\n", k, pl.n_layer - k, (long long)pl.thresholds[k]);
    }
    if (ctx_at > 0) {
        int k = 0;
        while (k <= pl.n_layer && !(pl.thresholds[k] >= 0 && ctx_at <= pl.thresholds[k])) k++;
        if (k > pl.n_layer) printf("at S=%ld: does not fit even with every layer offloaded\n", ctx_at);
        else printf("at S=%ld: %d layers fast (0..%d), %d offloaded (last first)\n", ctx_at, pl.n_layer - k,
                    pl.n_layer - k - 1, k);
    }
    rc = 0;
done:
    ks_context_destroy(ctx);
    ks_model_destroy(m);
    return rc;
}
