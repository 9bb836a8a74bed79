/*
 * policy_opts.c — parsing of the shared policy flags (see policy_opts.h).
 * Values are checked strictly; unknown policy names are caught here with the
 * list of known ones, before any model is loaded.
 */
#define _GNU_SOURCE
#include "policy_opts.h"

#include "args.h"
#include "calibrate.h"
#include "commands.h"
#include "kvsieve_select.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void app_policy_opts_init(app_policy_opts *o) {
    memset(o, 0, sizeof *o);
    snprintf(o->names[0], sizeof o->names[0], "dense");
    o->n_names = 1;
    o->n_budgets = 1; /* 0 = all */
    ks_context_params d = ks_context_default_params();
    o->sink = d.sink;
    o->window = d.window;
    o->page = d.page;
    o->dense_layers = -1;
    o->mem_overhead = 1.3;
}

bool app_parse_size(const char *s, double *out) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || v < 0) return false;
    double mul = 1;
    if (*end == 'K' || *end == 'k') mul = 1e3, end++;
    else if (*end == 'M' || *end == 'm') mul = 1e6, end++;
    else if (*end == 'G' || *end == 'g') mul = 1e9, end++;
    else if (*end == 'T' || *end == 't') mul = 1e12, end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end) return false;
    *out = v * mul;
    return true;
}

const char *app_policy_usage(void) {
    static char buf[4096];
    char names[512] = "";
    for (int k = 0; k < ks_policy_count(); k++) {
        if (k) strncat(names, ", ", sizeof names - strlen(names) - 1);
        strncat(names, ks_policy_name_at(k, NULL), sizeof names - strlen(names) - 1);
    }
    snprintf(buf, sizeof buf,
           "  --policy NAME      selection policy (%s; default dense; 'help' lists them), or\n"
           "                     EVICTOR+SELECTOR (e.g. snapkv+quest), either + topp (quest+topp); bench/eval take a comma list\n"
           "  --budget N|P%%      KV entries per head per decode step, sinks and window included\n"
           "                     (default 0 = all; P%% of the context); bench/eval take a comma list\n"
           "  --sink N           leading entries always attended (default 4)\n"
           "  --window N         recent entries always attended (default 64)\n"
           "  --page N           tokens per KV page (default 32)\n"
           "  --dense-layers N   first N layers attend densely (default: the policy's own)\n"
           "  --policy-arg K=V   policy-specific argument (repeatable; docs/POLICIES.md); with several\n"
           "                     policies each takes the keys it knows, or NAME.K=V for one of them\n"
           "  --kv-offload-dir D slow tier: a file per offloaded layer in D (default: host memory)\n"
           "  --kv-offload-layers N  keep the last N layers' KV in the slow tier (default 0)\n"
           "  --kv-slots N       fast slots (pages) per KV head of a slow-tier layer (default 2 x budget pages + 4)\n"
           "  --mem-cap SIZE     adaptive memory management: fast-tier capacity (e.g. 4G); layers move to\n"
           "                     the slow tier one by one as the sequences grow (needs --budget)\n"
           "  --mem-overhead X   factor on weight bytes in the memory model (default 1.3)\n", names);
    return buf;
}

void app_policy_list(FILE *f) {
    fprintf(f, "%-10s %-22s %s\n", "policy", "needs", "summary / arguments (--policy-arg K=V)");
    for (int32_t i = 0; i < kvs_policy_count(); i++) {
        kvs_policy_info p;
        if (kvs_policy_get(i, &p) != KVS_OK) continue;
        char needs[64];
        snprintf(needs, sizeof needs, "%s%s%s", p.needs_dlm ? "DLM " : "", p.evicts ? "evicts " : "",
                 p.api ? "" : "(not in C API)");
        fprintf(f, "%-10s %-22s %s\n", p.name, needs[0] ? needs : "-", p.summary);
        if (p.args[0]) {
            fprintf(f, "%-10s %-22s args:", "", "");
            for (int j = 0; p.args[j]; j++) fprintf(f, " %s", p.args[j]);
            fprintf(f, "\n");
        }
    }
    fprintf(f, "\nCompose as EVICTOR+SELECTOR (the first must evict at prefill), e.g. snapkv+quest; "
               "docs/POLICIES.md has the details.\n");
}

int cmd_policies(int argc, char **argv) {
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: kvsieve policies   (the selection policies, their arguments and needs)\n");
        return 0;
    }
    if (argc > 1) {
        fprintf(stderr, "kvsieve policies: unexpected argument '%s'\n", argv[1]);
        return 2;
    }
    app_policy_list(stdout);
    return 0;
}

static bool parse_budget(const char *cmd, const char *s, app_budget *b) {
    size_t n = strlen(s);
    char buf[64];
    if (n == 0 || n >= sizeof buf) goto bad;
    memcpy(buf, s, n + 1);
    b->pct = buf[n - 1] == '%';
    if (b->pct) buf[n - 1] = 0;
    char *end;
    double v = strtod(buf, &end);
    if (*end || end == buf || v < 0 || (b->pct && v > 100) || (!b->pct && (v > (1 << 24) || v != (long)v))) goto bad;
    b->value = v;
    return true;
bad:
    fprintf(stderr, "kvsieve %s: --budget wants N tokens or P%% (0..100), got '%s'\n", cmd, s);
    return false;
}

int app_policy_opt(const char *cmd, int argc, char **argv, int *i, app_policy_opts *o, bool lists) {
    const char *a = argv[*i], *v;
    long lv;
    if (!strcmp(a, "--policy")) {
        if (!(v = arg_value(cmd, argc, argv, i))) return -1;
        if (!strcmp(v, "help") || !strcmp(v, "list")) { /* the registry, then done */
            app_policy_list(stdout);
            exit(0);
        }
        o->n_names = 0;
        char buf[1024];
        snprintf(buf, sizeof buf, "%s", v);
        char *save = NULL;
        for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            if (o->n_names == APP_MAX_POLICIES || strlen(t) >= sizeof o->names[0]) {
                fprintf(stderr, "kvsieve %s: too many or too long --policy names\n", cmd);
                return -1;
            }
            ks_policy_spec spec; /* every part known, a composition led by an evictor */
            if (ks_policy_spec_parse(t, NULL, 0, 0, 0, -1, &spec) != KS_OK) {
                fprintf(stderr, "kvsieve %s: %s\n", cmd, ks_last_error());
                return -1;
            }
            snprintf(o->names[o->n_names++], sizeof o->names[0], "%s", t);
        }
        if (o->n_names == 0 || (!lists && o->n_names > 1)) {
            fprintf(stderr, "kvsieve %s: --policy takes %s\n", cmd, lists ? "a comma list of names" : "one name");
            return -1;
        }
        return 1;
    }
    if (!strcmp(a, "--budget")) {
        if (!(v = arg_value(cmd, argc, argv, i))) return -1;
        o->n_budgets = 0;
        char buf[1024];
        snprintf(buf, sizeof buf, "%s", v);
        char *save = NULL;
        for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            if (o->n_budgets == APP_MAX_BUDGETS) {
                fprintf(stderr, "kvsieve %s: at most %d budgets\n", cmd, APP_MAX_BUDGETS);
                return -1;
            }
            if (!parse_budget(cmd, t, &o->budgets[o->n_budgets++])) return -1;
        }
        if (o->n_budgets == 0 || (!lists && o->n_budgets > 1)) {
            fprintf(stderr, "kvsieve %s: --budget takes %s\n", cmd, lists ? "a comma list" : "one value");
            return -1;
        }
        return 1;
    }
    if (!strcmp(a, "--sink") || !strcmp(a, "--window") || !strcmp(a, "--page") || !strcmp(a, "--dense-layers") ||
        !strcmp(a, "--kv-offload-layers") || !strcmp(a, "--kv-slots")) {
        if (!(v = arg_value(cmd, argc, argv, i))) return -1;
        long lo = !strcmp(a, "--page") ? 1 : 0, hi = !strcmp(a, "--page") ? 4096 : (1 << 24);
        if (!arg_long(cmd, a, v, lo, hi, &lv)) return -1;
        if (!strcmp(a, "--sink")) o->sink = lv;
        else if (!strcmp(a, "--window")) o->window = lv;
        else if (!strcmp(a, "--page")) o->page = lv;
        else if (!strcmp(a, "--dense-layers")) o->dense_layers = lv;
        else if (!strcmp(a, "--kv-slots")) o->kv_slots = lv;
        else o->offload_layers = lv;
        return 1;
    }
    if (!strcmp(a, "--policy-arg")) {
        if (!(v = arg_value(cmd, argc, argv, i))) return -1;
        if (!*v || strchr(v, ',') || !ks_policy_args_valid(v)) { /* one KEY=VALUE item */
            fprintf(stderr, "kvsieve %s: --policy-arg wants KEY=VALUE, got '%s'\n", cmd, v);
            return -1;
        }
        size_t used = strlen(o->args);
        if (used + strlen(v) + 2 > sizeof o->args) {
            fprintf(stderr, "kvsieve %s: too many --policy-arg values\n", cmd);
            return -1;
        }
        if (used) strcat(o->args, ",");
        strcat(o->args, v);
        return 1;
    }
    if (!strcmp(a, "--mem-cap") || !strcmp(a, "--mem-overhead")) {
        if (!(v = arg_value(cmd, argc, argv, i))) return -1;
        double x;
        if (!strcmp(a, "--mem-cap")) {
            if (!app_parse_size(v, &x) || x <= 0) {
                fprintf(stderr, "kvsieve %s: --mem-cap wants a size like 4G or 512M, got '%s'\n", cmd, v);
                return -1;
            }
            o->mem_cap = x;
        } else {
            char *end;
            x = strtod(v, &end);
            if (*end || !(x >= 1.0 && x <= 10.0)) {
                fprintf(stderr, "kvsieve %s: --mem-overhead wants a number in [1, 10], got '%s'\n", cmd, v);
                return -1;
            }
            o->mem_overhead = x;
        }
        return 1;
    }
    if (!strcmp(a, "--kv-offload-dir")) {
        if (!(v = arg_value(cmd, argc, argv, i))) return -1;
        o->offload_dir = v;
        return 1;
    }
    return 0;
}

int32_t app_budget_tokens(const app_budget *b, int32_t length) {
    if (!b->pct) return (int32_t)b->value;
    if (b->value <= 0) return 0;
    int32_t t = (int32_t)(b->value / 100.0 * length + 0.5);
    return t < 1 ? 1 : t;
}

/* Does a --policy name have the part `name` (names were checked when parsed)? */
static bool has_part(const char *policy, const char *name) {
    ks_policy_spec spec;
    return ks_policy_spec_parse(policy, NULL, 0, 0, 0, -1, &spec) == KS_OK && ks_policy_spec_has_part(&spec, name);
}

bool app_policy_calibration(app_policy_opts *o, const char *cmd, const char *model_path) {
    o->chess_args[0] = 0;
    bool chess = false;
    for (int k = 0; k < o->n_names; k++) chess |= has_part(o->names[k], "chess");
    bool need_h = !ks_policy_args_has(o->args, "h_max"), need_v = !ks_policy_args_has(o->args, "v_max");
    if (!chess || !model_path || (!need_h && !need_v)) return true;
    double h, v;
    int r = app_chess_calib_read(cmd, model_path, &h, &v);
    if (r < 0) return false;
    if (r == 0) {
        fprintf(stderr,
                "kvsieve %s: no chess calibration beside the model (%s%s; kvsieve eval --calibrate writes it):"
                " chess rebuilds only on its horizon\n",
                cmd, model_path, APP_CHESS_CALIB_SUFFIX);
        return true;
    }
    char hb[48] = "", vb[48] = "";
    if (need_h) snprintf(hb, sizeof hb, "h_max=%.9g", h);
    if (need_v) snprintf(vb, sizeof vb, "v_max=%.9g", v);
    snprintf(o->chess_args, sizeof o->chess_args, "%s%s%s", hb, need_h && need_v ? "," : "", vb);
    fprintf(stderr, "kvsieve %s: chess thresholds from %s%s: %s\n", cmd, model_path, APP_CHESS_CALIB_SUFFIX,
            o->chess_args);
    return true;
}

/* o->scoped[k]: the arguments policy k takes (unscoped keys one of its
 * parts knows, or all of them for a lone policy, and NAME.key=v for a part
 * NAME), the draft model shipped beside the model for a policy that needs
 * one (the registry says which), and the calibrated chess thresholds. */
static const char *scoped_args(app_policy_opts *o, int k, int32_t budget) {
    char *dst = o->scoped[k];
    size_t cap = sizeof o->scoped[k];
    dst[0] = 0;
    (void)ks_policy_args_scope(o->names[k], o->args, o->n_names == 1, dst, cap); /* too long: what fits */
    ks_policy_spec spec;
    if (ks_policy_spec_parse(o->names[k], dst, budget, (int32_t)o->sink, (int32_t)o->window, (int32_t)o->dense_layers,
                             &spec) == KS_OK) {
        ks_policy_spec_add_draft(&spec, o->model_path, &spec);
        snprintf(dst, cap, "%s", spec.args);
    }
    if (o->chess_args[0] && has_part(o->names[k], "chess")) {
        size_t used = strlen(dst);
        snprintf(dst + used, cap - used, "%s%s", used ? "," : "", o->chess_args);
    }
    return dst[0] ? dst : NULL;
}

void app_policy_apply(app_policy_opts *o, int k, int32_t budget, ks_context_params *cp) {
    cp->policy = o->names[k];
    cp->policy_args = scoped_args(o, k, budget);
    cp->budget = budget;
    cp->sink = (int32_t)o->sink;
    cp->window = (int32_t)o->window;
    cp->page = (int32_t)o->page;
    cp->dense_layers = (int32_t)o->dense_layers;
    cp->kv_offload_dir = o->offload_dir;
    cp->kv_offload_layers = (int32_t)o->offload_layers;
    cp->kv_slots = (int32_t)o->kv_slots;
    cp->mem_cap = o->mem_cap;
    cp->mem_overhead = o->mem_overhead;
}

bool app_policy_spec(app_policy_opts *o, const char *cmd, int k, int32_t budget, ks_policy_spec *out) {
    const char *args = scoped_args(o, k, budget);
    if (ks_policy_spec_parse(o->names[k], args, budget, (int32_t)o->sink, (int32_t)o->window, (int32_t)o->dense_layers,
                             out) == KS_OK)
        return true;
    fprintf(stderr, "kvsieve %s: %s\n", cmd, ks_last_error());
    return false;
}

void app_budget_label(const app_budget *b, char *out, size_t cap) {
    if (b->pct) snprintf(out, cap, "%g%%", b->value);
    else if (b->value == 0) snprintf(out, cap, "all");
    else snprintf(out, cap, "%.0f", b->value);
}
