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
           "                     EVICTOR+SELECTOR (e.g. snapkv+quest); bench/eval take a comma list\n"
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
            /* every part of a composition must be known */
            char part[64];
            snprintf(part, sizeof part, "%s", t);
            char *s2 = NULL;
            for (char *p = strtok_r(part, "+", &s2); p; p = strtok_r(NULL, "+", &s2)) {
                bool known = false;
                for (int k = 0; k < ks_policy_count(); k++)
                    if (!strcmp(ks_policy_name_at(k, NULL), p)) known = true;
                if (!known) {
                    fprintf(stderr, "kvsieve %s: unknown policy '%s' (known:", cmd, p);
                    for (int k = 0; k < ks_policy_count(); k++) fprintf(stderr, " %s", ks_policy_name_at(k, NULL));
                    fprintf(stderr, ")\n");
                    return -1;
                }
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
        if (!strchr(v, '=') || strchr(v, ',') || *v == '=') {
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

/* Does the spec "a" or "a+b" have the part `name`? */
static bool has_part(const char *spec, const char *name) {
    size_t n = strlen(name);
    for (const char *p = spec; *p;) {
        const char *e = strchr(p, '+');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && !strncmp(p, name, n)) return true;
        p += len + (e != NULL);
    }
    return false;
}

/* Does "k=v,k=v" set key? */
static bool has_key(const char *args, const char *key) {
    size_t n = strlen(key);
    for (const char *p = args; *p;) {
        if (!strncmp(p, key, n) && p[n] == '=') return true;
        const char *e = strchr(p, ',');
        if (!e) break;
        p = e + 1;
    }
    return false;
}

bool app_policy_calibration(app_policy_opts *o, const char *cmd, const char *model_path) {
    o->chess_args[0] = 0;
    bool chess = false;
    for (int k = 0; k < o->n_names; k++) chess |= has_part(o->names[k], "chess");
    bool need_h = !has_key(o->args, "h_max"), need_v = !has_key(o->args, "v_max");
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

void app_policy_apply(app_policy_opts *o, int k, int32_t budget, ks_context_params *cp) {
    cp->policy = o->names[k];
    /* the args this policy takes: unscoped keys it knows, or NAME.key=v for it */
    char *dst = o->scoped[k];
    dst[0] = 0;
    const char *a = o->args;
    while (*a) {
        const char *end = strchr(a, ',');
        size_t n = end ? (size_t)(end - a) : strlen(a);
        char item[1024], key[256];
        snprintf(item, sizeof item, "%.*s", (int)n, a);
        char *eq = strchr(item, '=');
        const char *use = NULL;
        if (eq) {
            snprintf(key, sizeof key, "%.*s", (int)(eq - item), item);
            char *dot = strchr(key, '.');
            if (dot) { /* scoped: only for the named policy (or a composition containing it) */
                *dot = 0;
                char names[128];
                snprintf(names, sizeof names, "+%s+", o->names[k]);
                char pat[260];
                snprintf(pat, sizeof pat, "+%s+", key);
                if (strstr(names, pat)) use = item + strlen(key) + 1;
            } else if (o->n_names == 1 || ks_policy_accepts_arg(o->names[k], key)) {
                use = item; /* one policy: pass everything, unknown keys are reported */
            }
        } else if (o->n_names == 1) {
            use = item;
        }
        if (use && strlen(dst) + strlen(use) + 2 < sizeof o->scoped[k]) {
            if (dst[0]) strcat(dst, ",");
            strcat(dst, use);
        }
        a += n;
        if (*a == ',') a++;
    }
    cp->budget = budget;
    cp->sink = (int32_t)o->sink;
    cp->window = (int32_t)o->window;
    cp->page = (int32_t)o->page;
    cp->dense_layers = (int32_t)o->dense_layers;
    /* spec without dlm=: the draft model shipped beside the model (MODEL.gguf -> MODEL-dlm/) */
    if (o->model_path && strstr(cp->policy, "spec") && !strstr(dst, "dlm=")) {
        char dir[1024];
        size_t n = strlen(o->model_path);
        if (n > 5 && !strcmp(o->model_path + n - 5, ".gguf")) n -= 5;
        snprintf(dir, sizeof dir, "%.*s-dlm", (int)n, o->model_path);
        char cfg[1100];
        snprintf(cfg, sizeof cfg, "%s/config.json", dir);
        FILE *f = fopen(cfg, "r");
        if (f) {
            fclose(f);
            if (strlen(dst) + strlen(dir) + 6 < sizeof o->scoped[k]) {
                if (dst[0]) strcat(dst, ",");
                strcat(dst, "dlm=");
                strcat(dst, dir);
            }
        }
    }
    if (o->chess_args[0] && has_part(o->names[k], "chess")) {
        size_t used = strlen(dst);
        snprintf(dst + used, sizeof o->scoped[k] - used, "%s%s", used ? "," : "", o->chess_args);
    }
    cp->policy_args = dst[0] ? dst : NULL;
    cp->kv_offload_dir = o->offload_dir;
    cp->kv_offload_layers = (int32_t)o->offload_layers;
    cp->kv_slots = (int32_t)o->kv_slots;
    cp->mem_cap = o->mem_cap;
    cp->mem_overhead = o->mem_overhead;
}

void app_budget_label(const app_budget *b, char *out, size_t cap) {
    if (b->pct) snprintf(out, cap, "%g%%", b->value);
    else if (b->value == 0) snprintf(out, cap, "all");
    else snprintf(out, cap, "%.0f", b->value);
}
