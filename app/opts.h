/*
 * opts.h — the kvsieve CLI's options as one table.
 *
 * Every option of every subcommand is declared once, in opts.c's table: its
 * spelling, the kind of argument it takes (and the range a number must lie
 * in), the help line, the commands that take it and the field of
 * app_options it is stored in.  One parse loop reads argv against the table,
 * and `kvsieve CMD --help` is generated from it, so a new flag is one line
 * and cannot be parsed one way and documented another.  An option spelled
 * alike in two commands with different meanings or ranges (run's -c is a
 * context, perplexity's a window) is two rows, each naming its commands.
 *
 * The policy flags (--policy, --budget, ...) belong to policy_opts.c: the
 * table has one row standing for the group and the loop hands those flags to
 * app_policy_opt.  Values are checked strictly (args.c): a typo is a usage
 * error (exit 2), never a silently different run.
 */
#ifndef KS_APP_OPTS_H
#define KS_APP_OPTS_H

#include "kvsieve.h"
#include "policy_opts.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* The subcommands, as bits of app_opt.cmds. */
enum {
    APP_RUN = 1u << 0, APP_BENCH = 1u << 1, APP_EVAL = 1u << 2, APP_PPL = 1u << 3, APP_PLAN = 1u << 4,
    APP_SERVE = 1u << 5, APP_TOKENIZE = 1u << 6, APP_INFO = 1u << 7, APP_GEN = 1u << 8,
};

enum { APP_LIST_CAP = 32, APP_MAX_STOPS = 16, APP_PREFILL_REPS_MAX = 32 };
enum { APP_OFFLOAD_NONE, APP_OFFLOAD_ALL, APP_OFFLOAD_ADAPTIVE };

/* Every command's options: each table row stores into one field here. */
typedef struct app_options {
    const char *cmd;                 /* "run", ... (messages) */
    unsigned cmd_bit;                /* APP_RUN, ... */
    /* shared */
    const char *model_path, *prompt, *file;
    long n_threads, n_ctx, n_batch;
    bool json;
    ks_kv_type kv_type;
    app_policy_opts po;
    const char *prefill_policy;      /* --prefill-policy (NULL: dense) */
    /* run */
    long n_gen;
    bool chat, ignore_eos, no_bos;
    bool turnover;                   /* --turnover: the selection turnover probe */
    const char *system, *cache_file;
    long cache_every;                /* --prompt-cache-every: tokens between checkpoints (-1: by the prompt's length) */
    ks_sampler_params sampler;
    const char *stops[APP_MAX_STOPS];
    size_t n_stops;
    /* tokenize */
    bool bos, special, pieces;
    /* perplexity */
    long window, max_windows, decode_from;
    bool second_half;
    /* bench */
    long depths[APP_LIST_CAP], batches[APP_LIST_CAP], prompts[APP_LIST_CAP];
    int n_depths, n_batches, n_prompts;
    long bench_gen;
    long prefill_depth;              /* --prefill-depth: synthetic KV before each prefill row (a follow-up's prompt) */
    int32_t prefill_reps;            /* --prefill-reps: prefills of each length (1..APP_PREFILL_REPS_MAX) */
    bool no_prefill, no_mmap, no_repack;
    ks_expert_pack expert_pack;      /* --expert-pack (all commands that load a model for inference) */
    int offload[3], n_offload;
    /* eval */
    bool task_on[8], tasks_given, calibrate, show, share_prefill;
    long lengths[APP_LIST_CAP];
    int n_lengths;
    double eval_depths[APP_LIST_CAP];
    int n_eval_depths;
    long samples, eval_seed;
    int ref_simd;                    /* --reference-simd level, -1: none */
    const char *plot, *dump_dir;
    /* plan */
    long requests, ctx_at;
    /* serve */
    const char *host, *api_key, *alias, *cache_dir;
    long port, parallel, max_queue, max_groups;
    float grace;
    double cache_ram, cache_disk;
    /* info */
    bool show_kv, show_tensors;
    /* gen-model */
    const char *shape, *type, *vocab_from, *out, *dlm_out;
    uint64_t gen_seed, gen_layers, gen_ctx, gen_threads;
} app_options;

/* Parse argv (argv[0] is the command) against the table into o, defaults
 * first.  Returns -1 to go on, or the exit code to return now: 0 after
 * --help, 2 after a usage error (message printed). */
int app_parse(const char *cmd, int argc, char **argv, app_options *o);
/* `kvsieve CMD --help`, generated from the table. */
void app_usage(const char *cmd, FILE *f);

/* The model the command runs on: -m, else $KVSIEVE_MODEL or the bundled
 * one.  With calibrate, CHESS thresholds are read beside it
 * (app_policy_calibration).  Returns -1 to go on, or the exit code (2). */
int app_resolve_model(app_options *o, bool calibrate);
/* Load o->model_path; reports and returns false on failure. */
bool app_load_model(const app_options *o, ks_model_params mp, ks_model **out);
/* Context parameters from the options: -t, --batch (when given), --kv-type
 * and the policy flags of policy pi at budget tokens, for n_ctx tokens
 * (plus room for the policy's prefill tokens when room is true). */
ks_context_params app_context_params(app_options *o, int pi, int32_t budget, int32_t n_ctx, bool room);
/* ks_context_create, reported on failure as `what`. */
bool app_create_context(const app_options *o, const ks_model *m, ks_context_params cp, const char *what,
                        ks_context **out);

#endif
