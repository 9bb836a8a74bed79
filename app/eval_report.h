/*
 * eval_report.h — what `kvsieve eval` reports once its sweep has run: the
 * per-configuration summary, the JSON document (--json), the plain table and
 * the SVG plots (--plot).  cmd_eval.c runs the sweep and fills the cells;
 * everything here only reads them, so a new output format never touches the
 * runner.
 */
#ifndef KS_APP_EVAL_REPORT_H
#define KS_APP_EVAL_REPORT_H

#include "kvsieve_eval.h"
#include "kvsieve.h"
#include "policy_opts.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One cell of the sweep. */
typedef struct eval_cell {
    int task, li, di;
    int runs;           /* instances that ran */
    double score_sum;
    double tokens, seconds;
    double total_sum;   /* instance lengths, to report the mean */
    /* policy configurations only (vs the dense run of the same instance) */
    double agree_tf_sum, agree_free_sum, kl_sum, recall_sum;
    int recall_runs;
    uint64_t turn_pol, turn_orc, turn_sel; /* the free runs' turnover probe (ks_turnover) */
} eval_cell;

/* One compared configuration: config 0 is dense, the reference. */
typedef struct eval_cfg {
    int pi, bi;         /* indices into the policy / budget lists; -1: dense (bi -1 with pi >= 0: dense on
                           --kv-type, compared with the f16 reference) */
    char label[96];
} eval_cfg;

typedef struct eval_summary {
    uint64_t selections, hits, misses, corrections, rebuilds; /* the policy's counters, all lengths */
    uint64_t topp_refined, topp_picked, topp_kept;            /* +topp: selections pruned, picks seen, kept */
    double topp_head_min, topp_head_max;                      /* +topp: the least / most keeping head's mean */
    double task_acc[KS_EVAL_TASK_COUNT];
    int task_cells[KS_EVAL_TASK_COUNT];
    double acc, agree_tf, agree_free, kl, recall, tok_s;
    int n_tasks, runs, recall_runs;
    uint64_t turn_pol, turn_orc, turn_sel; /* the turnover probe's counts, all cells */
} eval_summary;

/* The sweep as the reports read it (all borrowed). */
typedef struct eval_sweep {
    const eval_cell *cells;    /* [n_cfg][task][n_len][n_depth] */
    size_t per_cfg;            /* cells per configuration: KS_EVAL_TASK_COUNT * n_len * n_depth */
    const eval_cfg *cfgs;      /* [n_cfg], config 0 the dense reference */
    int n_cfg;
    const eval_summary *sums;  /* [n_cfg] (eval_summarize plus the policy counters) */
    const int32_t *lens;       /* [n_len] */
    int n_len;
    const double *depths;      /* [n_depth] */
    int n_depth;
    const bool *task_on;       /* [KS_EVAL_TASK_COUNT] */
    const app_policy_opts *po; /* the policy and budget lists the configurations index */
    const uint64_t *pol_sel, *pol_reb; /* [n_cfg] selections / rebuilds from the contexts' stats */
    ks_kv_type kv_type;        /* the compared configurations' KV type */
} eval_sweep;

/* The JSON document's header fields. */
typedef struct eval_meta {
    const char *model_path;
    long seed, samples;
    int32_t n_ctx_train;
    int ref_simd; /* --reference-simd level, -1: none */
} eval_meta;

/* Means over one configuration's cells (tasks weigh alike); counters zero. */
void eval_summarize(const eval_cell *cells, size_t n_cells, eval_summary *out);
/* The --json document on stdout; false (message printed) when it cannot be built. */
bool eval_print_json(const eval_sweep *w, const eval_meta *meta);
/* The plain per-cell table, the summary and the counters on stdout. */
void eval_print_table(const eval_sweep *w);
/* Heat maps and the accuracy-vs-budget chart as one SVG file; false (message printed) on failure. */
bool eval_plot(const char *path, const eval_sweep *w);

#endif
