/*
 * policy_opts.h — the policy flags every subcommand shares:
 *   --policy NAME[,NAME...]  --budget N[%][,...]  --sink N  --window N
 *   --page N  --dense-layers N  --policy-arg k=v (repeatable)
 *   --kv-offload-dir DIR  --kv-offload-layers N  --mem-cap SIZE  --mem-overhead X
 * run and perplexity take one policy and one budget; bench and eval take
 * lists and compare them in one run.  A budget "6%" is a share of the
 * context (eval: of each instance's length).
 */
#ifndef KS_APP_POLICY_OPTS_H
#define KS_APP_POLICY_OPTS_H

#include "kvsieve.h"

#include <stdbool.h>
#include <stdio.h>

enum { APP_MAX_POLICIES = 16, APP_MAX_BUDGETS = 16 };

typedef struct app_budget {
    double value;   /* tokens, or percent when pct */
    bool pct;
} app_budget;

typedef struct app_policy_opts {
    char names[APP_MAX_POLICIES][64];
    int n_names;
    app_budget budgets[APP_MAX_BUDGETS];
    int n_budgets;
    long sink, window, page, dense_layers, offload_layers, kv_slots;
    char args[1024];
    char scoped[APP_MAX_POLICIES][1024]; /* per policy: the args it takes (app_policy_apply) */
    const char *offload_dir;
    double mem_cap, mem_overhead;   /* --mem-cap SIZE (bytes; 0 off), --mem-overhead X */
    const char *model_path;         /* set by the command: spec finds MODEL-dlm/ beside it */
    char chess_args[128]; /* calibrated "h_max=..,v_max=.." added for policies with a chess part */
} app_policy_opts;

/* "4G", "512M", "300K", "12345" (bytes) -> bytes; false if malformed. */
bool app_parse_size(const char *s, double *out);

void app_policy_opts_init(app_policy_opts *o);
/* 1: argv[*i] was a policy flag (consumed with its value), 0: not one,
 * -1: bad value (message printed; exit 2). */
int app_policy_opt(const char *cmd, int argc, char **argv, int *i, app_policy_opts *o, bool lists);
/* The policy registry as a table (`kvsieve policies`, `--policy help`). */
void app_policy_list(FILE *f);
/* Help text for the flags. */
const char *app_policy_usage(void);
/* Budget in entries for a context / instance of `length` tokens (0 = all). */
int32_t app_budget_tokens(const app_budget *b, int32_t length);
/* Fill the policy fields of cp for policy names[k] and budget b.  With
 * several policies, each gets the --policy-arg keys it takes ("key=v"), or
 * those scoped to it ("NAME.key=v"); a key no listed policy takes is an
 * error at context creation. */
void app_policy_apply(app_policy_opts *o, int k, int32_t budget, ks_context_params *cp);
/* Policy names[k] with budget as one parsed value (the arguments scoped as
 * app_policy_apply's); false (message printed) when the parser refuses it. */
bool app_policy_spec(app_policy_opts *o, const char *cmd, int k, int32_t budget, ks_policy_spec *out);
/* CHESS thresholds: when a --policy name has a chess part and --policy-arg
 * did not give h_max / v_max, read the missing ones from MODEL.chess.json
 * (written by `kvsieve eval --calibrate`) and note it on stderr; they are
 * added to chess's arguments only (app_policy_apply).  Returns false (message
 * printed) when the file exists but is malformed. */
bool app_policy_calibration(app_policy_opts *o, const char *cmd, const char *model_path);
/* "6%" or "2048" for tables. */
void app_budget_label(const app_budget *b, char *out, size_t cap);

#endif
