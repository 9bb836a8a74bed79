/*
 * cmd_eval.c — `kvsieve eval`: long-context task accuracy.
 *
 * The command sweeps task x length x depth x sample, runs every instance
 * through the library's runner (prefill the prompt, greedy-decode the
 * answer) and reports accuracy and throughput per cell: a table on stdout,
 * or JSON with --json, plus SVG plots with --plot (eval_report.c).  Each instance's seed is
 * derived from (--seed, task, length, depth, sample) alone, so a cell is the
 * same prompt whatever else is swept — the property that makes a policy run
 * comparable with a dense run cell by cell.
 *
 * Dense attention always runs first: it is the reference.  Every other
 * --policy x --budget configuration then runs each instance twice on its own
 * context: free-running (task accuracy, token agreement with the dense
 * output) and teacher-forced with the dense tokens (top-1 agreement and
 * KL(dense || policy) position by position, and the attention recall probe:
 * the share of the dense attention mass its selections cover); with
 * --share-prefill those runs restore the prompt's KV where an earlier run of
 * the same prefill setting computed it (eval_open_cache).  A budget
 * "6%" is 6% of each instance's length.  --calibrate also collects the
 * entropy and varentropy of every dense output distribution, averages them
 * per KV page of generated tokens (--page) and stores the 99th percentiles of
 * those page averages beside the model as CHESS's reconstruction thresholds
 * (calibrate.h); policy counters (selections, rebuilds) go to stderr and JSON.  Lengths over the model's trained
 * context are skipped with a note, since accuracy past it measures
 * extrapolation, not the policy.
 */
#include "args.h"
#include "calibrate.h"
#include "commands.h"
#include "eval_report.h"
#include "kvsieve.h"
#include "kvsieve_eval.h"
#include "kvsieve_tools.h"
#include "opts.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EVAL_MAX_LIST APP_LIST_CAP

static void eval_show_text(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\n') fputs("\\n", stderr);
        else fputc(s[i], stderr);
    }
}

/* --show: one instance's question, the expected answers and what dense
 * generated (every GEN token, so longgen's own list shows too). */
static void eval_show(const ks_model *m, const ks_eval_instance *inst, const ks_eval_result *ref, int sample) {
    size_t n = strlen(inst->prompt);
    const char *tail = inst->prompt + (n > 90 ? n - 90 : 0);
    fprintf(stderr, "[%s %d depth %.2f #%d] score %.3f\n  ...", ks_eval_task_name(inst->task), inst->target_tokens,
            inst->depth, sample, ref->score);
    eval_show_text(tail, strlen(tail));
    if (inst->task != KS_EVAL_LONGGEN) { /* the inserted facts: every sentence with a digit or "VAR" before the question */
        fputs("\n  facts:", stderr);
        const char *question = strrchr(inst->prompt, '\n');
        for (const char *p = inst->prompt; *p && p < question;) {
            const char *end = strpbrk(p, ".\n");
            size_t len = end ? (size_t)(end - p) + 1 : strlen(p);
            bool fact = false;
            for (size_t i = 0; i < len && !fact; i++)
                fact = (p[i] >= '0' && p[i] <= '9') || (i + 3 <= len && !memcmp(p + i, "VAR", 3));
            if (fact) {
                fputs(" |", stderr);
                eval_show_text(p, len);
            }
            p += len;
        }
    }
    fputs("\n  expected:", stderr);
    for (int32_t i = 0; i < inst->n_answers; i++) fprintf(stderr, " '%s'", inst->answers[i]);
    fputs("\n  generated: '", stderr);
    for (int32_t i = 0; i < ref->n_gen; i++) {
        char piece[64];
        size_t len = 0;
        if (ks_token_to_piece(m, ref->tokens[i], piece, sizeof piece, &len) != KS_OK) continue;
        eval_show_text(piece, len < sizeof piece ? len : sizeof piece);
    }
    fputs("'\n", stderr);
}

/* --dump-prompts: the instance's prompt text, byte for byte. */
static ks_status eval_dump_prompt(const char *dir, const ks_eval_instance *inst, int sample) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s-%d-%.2f-%d.txt", dir, ks_eval_task_name(inst->task), inst->target_tokens,
             inst->depth, sample);
    FILE *f = fopen(path, "wb");
    size_t n = strlen(inst->prompt);
    bool ok = f && fwrite(inst->prompt, 1, n, f) == n;
    if (f && fclose(f) != 0) ok = false;
    return ok ? KS_OK : ks_fail_at(KS_ERR_IO, __FILE__, __LINE__, "cannot write %s", path);
}

bool app_parse_depths(app_options *o, const char *flag, const char *s) {
    int n = 0, cap = EVAL_MAX_LIST;
    const char *p = s;
    while (*p) {
        char *end = NULL;
        errno = 0;
        double v = strtod(p, &end);
        if (end == p || errno || !(v >= 0.0 && v <= 1.0) || (*end && *end != ',') || n == cap) {
            fprintf(stderr, "kvsieve eval: --depths wants comma-separated numbers in [0, 1] (at most %d), got '%s'\n",
                    cap, s);
            return false;
        }
        o->eval_depths[n++] = v;
        p = *end ? end + 1 : end;
        if (*end == ',' && !*p) {
            fprintf(stderr, "kvsieve eval: --depths has a trailing comma\n");
            return false;
        }
    }
    if (!n) fprintf(stderr, "kvsieve eval: --depths is empty\n");
    o->n_eval_depths = n;
    return n > 0;
}

bool app_parse_tasks(app_options *o, const char *flag, const char *s) {
    bool *on = o->task_on;
    o->tasks_given = true;
    if (!strcmp(s, "all")) {
        for (int t = 0; t < KS_EVAL_TASK_COUNT; t++) on[t] = true;
        return true;
    }
    char buf[256];
    if (strlen(s) >= sizeof buf || !*s) {
        fprintf(stderr, "kvsieve eval: bad --task '%s'\n", s);
        return false;
    }
    strcpy(buf, s);
    int n = 0;
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        ks_eval_task t;
        if (ks_eval_task_parse(tok, &t) != KS_OK) {
            fprintf(stderr, "kvsieve eval: unknown task '%s' (passkey, multikey, multivalue, vartrack, longgen, all)\n",
                    tok);
            return false;
        }
        n += !on[t];
        on[t] = true;
    }
    return n > 0;
}

bool app_parse_ref_simd(app_options *o, const char *flag, const char *v) {
    for (int lv = KS_SIMD_SCALAR; lv <= KS_SIMD_LEVEL_MAX; lv++)
        if (!strcmp(v, ks_simd_name((ks_simd_level)lv))) o->ref_simd = lv;
    if (o->ref_simd < 0) {
        fprintf(stderr, "kvsieve eval: --reference-simd must be scalar, avx2, avx512, neon, dotprod or i8mm, got '%s'\n", v);
        return false;
    }
    bool arm = ks_simd_current() >= KS_SIMD_NEON; /* a level of the other architecture would be scalar */
    if (o->ref_simd > (int)ks_simd_current() || (o->ref_simd != KS_SIMD_SCALAR && (o->ref_simd >= KS_SIMD_NEON) != arm)) {
        fprintf(stderr, "kvsieve eval: --reference-simd %s: this CPU (or KS_SIMD) allows up to %s\n", v,
                ks_simd_name(ks_simd_current()));
        return false;
    }
    return true;
}

static uint64_t eval_mix(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* The sweep's state: the contexts of the length being run, the cells, the
 * calibration samples and the policy counters. */
typedef struct eval_state {
    ks_model *m;
    int32_t V, n_train;
    eval_cfg cfgs[1 + APP_MAX_POLICIES * APP_MAX_BUDGETS];
    int n_cfg;
    ks_context **ctxs;
    eval_cell *cells;    /* [cfg][task][n_len][n_depth] */
    eval_summary *sums;
    size_t per_cfg;
    int32_t lens[EVAL_MAX_LIST];
    int n_len, ran;
    double *cal_h, *cal_v; /* [n_cal] entropies of the dense runs (--calibrate) */
    size_t n_cal, cap_cal, n_cal_tok; /* pages, room, tokens */
    uint64_t *pol_sel, *pol_reb;
    ks_prefix_cache *pc;   /* --share-prefill: this length's cache, or NULL */
    uint64_t pc_cap;       /* its RAM cap */
    int64_t restored, prompt_rows; /* this length's prompt rows restored / prefilled, every run */
} eval_state;

/* Dense first (the reference), then every other policy x budget. */
static void eval_configs(const app_options *o, eval_state *e) {
    eval_cfg *cfgs = e->cfgs;
    int n = 0, ref_simd = o->ref_simd;
    cfgs[n++] = (eval_cfg){-1, -1, "dense"};
    if (ref_simd >= 0) snprintf(cfgs[0].label, sizeof cfgs[0].label, "dense/ref-%s", ks_simd_name((ks_simd_level)ref_simd));
    const char *kv_suffix = o->kv_type == KS_KV_Q8 ? "/q8" : "";
    bool sparse_prefill = o->prefill_policy && strcmp(o->prefill_policy, "dense"); /* every compared config's */
    for (int pi = 0; pi < o->po.n_names; pi++) {
        if (!strcmp(o->po.names[pi], "dense")) {
            /* dense on the other KV type, on other kernels than the reference's, or after a sparse
             * prefill (--prefill-policy) is a configuration of its own */
            if (o->kv_type != KS_KV_F16 || ref_simd >= 0 || sparse_prefill) {
                cfgs[n] = (eval_cfg){pi, -1, ""};
                snprintf(cfgs[n++].label, sizeof cfgs[0].label, "dense%s%s", kv_suffix, sparse_prefill ? "/sparse-prefill" : "");
            }
            continue;
        }
        for (int bi = 0; bi < o->po.n_budgets; bi++) {
            eval_cfg *c = &cfgs[n++];
            char bl[32];
            app_budget_label(&o->po.budgets[bi], bl, sizeof bl);
            *c = (eval_cfg){pi, bi, ""};
            snprintf(c->label, sizeof c->label, "%s@%s%s%s", o->po.names[pi], bl, kv_suffix,
                     sparse_prefill ? "/sparse-prefill" : "");
        }
    }
    e->n_cfg = n;
}

/* Lengths over the trained context are skipped: accuracy there measures extrapolation. */
static int eval_lengths(const app_options *o, eval_state *e) {
    int kept = 0;
    for (int i = 0; i < o->n_lengths; i++) {
        if (o->lengths[i] > e->n_train) {
            fprintf(stderr, "kvsieve eval: skipping length %ld: above the model's trained context %d\n", o->lengths[i],
                    e->n_train);
            continue;
        }
        e->lens[kept++] = (int32_t)o->lengths[i];
    }
    if (!kept) {
        fprintf(stderr, "kvsieve eval: every length exceeds the model's trained context %d (try --lengths %d)\n",
                e->n_train, e->n_train);
        return 2;
    }
    e->n_len = kept;
    e->per_cfg = (size_t)KS_EVAL_TASK_COUNT * kept * o->n_eval_depths;
    e->cells = calloc(e->per_cfg * e->n_cfg, sizeof *e->cells);
    e->sums = calloc((size_t)e->n_cfg, sizeof *e->sums);
    return -1;
}

static void eval_open_cache(const app_options *o, eval_state *e, int l);

/* One context per configuration, sized for length l (budgets in % follow it). */
static int eval_open_contexts(app_options *o, eval_state *e, int l) {
    for (int k = 0; k < e->n_cfg; k++) {
        const eval_cfg *c = &e->cfgs[k];
        ks_kv_type kv_type = o->kv_type;
        if (k == 0) o->kv_type = KS_KV_F16; /* the compared configurations' KV; the reference is always f16 */
        ks_context_params cp = app_context_params(o, c->pi < 0 ? 0 : c->pi,
                                                  c->bi < 0 ? 0 : app_budget_tokens(&o->po.budgets[c->bi], e->lens[l]),
                                                  e->lens[l], true); /* DapQ's pseudo tokens, all of them */
        o->kv_type = kv_type;
        if (c->pi < 0) { /* the reference: dense, resident, f16, none of the policy's arguments */
            cp.policy = "dense";
            cp.budget = 0;
            cp.policy_args = NULL;
            cp.kv_offload_layers = 0;
            cp.mem_cap = 0;
            cp.prefill_policy = NULL; /* the reference prefills densely */
        }
        if (!app_create_context(o, e->m, cp, "creating a context", &e->ctxs[k])) return 1;
        ks_context_set_recall_probe(e->ctxs[k], k > 0);
        ks_status st = k > 0 ? ks_context_set_turnover_probe(e->ctxs[k], true) : KS_OK;
        if (st != KS_OK) {
            app_report("eval", "the turnover probe", st);
            return 1;
        }
    }
    eval_open_cache(o, e, l);
    return -1;
}

/* --share-prefill at length l: a RAM prefix cache every configuration's
 * runs go through, so that each instance's prompt is computed once per
 * prefill setting and KV layout (the reference's dense prefill serves every
 * configuration that prefills densely; a teacher-forced run restores its
 * own free run's).  A restore is byte for byte and leaves what a policy
 * observes to compute (SnapKV's window, DapQ's pseudo tokens; LRQK and
 * spec without cached state recompute), so the figures are those of
 * separate prefills; only tok/s changes.  It holds one copy of the prompt's
 * KV beside the contexts' own, so it stays off where three copies would
 * not fit in the memory available, and for sliding-window models, whose
 * local layers would then keep every row of the prompt (a cached prompt
 * must be restorable at any block). */
static void eval_open_cache(const app_options *o, eval_state *e, int l) {
    if (!o->share_prefill) return;
    ks_model_info mi;
    ks_model_get_info(e->m, &mi);
    if (mi.n_local > 0) {
        if (l == 0)
            fprintf(stderr, "kvsieve eval: --share-prefill: off for this model (sliding-window layers would keep "
                            "every row of a cached prompt)\n");
        return;
    }
    double per_token = (double)mi.n_layer * mi.n_head_kv * 2.0 * (double)ks_kv_type_row_bytes(KS_KV_F16, mi.head_dim);
    double kv = per_token * e->lens[l], avail = (double)ks_host_mem_available();
    if (3.0 * kv > avail) {
        fprintf(stderr, "kvsieve eval: --share-prefill: off at length %d (the prompt's KV, %.2f GB, three times "
                        "over does not fit in the %.2f GB available)\n", e->lens[l], kv / 1e9, avail / 1e9);
        return;
    }
    ks_prefix_cache_params pp = ks_prefix_cache_default_params();
    pp.ram_bytes = (uint64_t)(1.25 * kv) + (64ull << 20); /* the rows, a policy's per-token state, the tokens */
    pp.share_pages = false; /* blocks of bytes: every context restores them (pages pin in one store) */
    pp.write_behind = false;
    e->pc_cap = pp.ram_bytes;
    ks_status st = ks_prefix_cache_create(e->m, &pp, &e->pc);
    if (st != KS_OK) {
        app_report("eval", "--share-prefill's cache (computing every prefill instead)", st);
        e->pc = NULL;
    }
    e->restored = e->prompt_rows = 0;
}

/* --calibrate: per-page means of the dense distributions. */
static void eval_collect_calibration(const app_options *o, eval_state *e, const ks_eval_result *ref) {
    while (e->n_cal + (size_t)ref->n_gen > e->cap_cal) {
        e->cap_cal = e->cap_cal ? 2 * e->cap_cal : 1024;
        e->cal_h = realloc(e->cal_h, sizeof(double) * e->cap_cal);
        e->cal_v = realloc(e->cal_v, sizeof(double) * e->cap_cal);
    }
    e->n_cal += app_chess_page_means(ref->logits, ref->n_gen, e->V, ref->n_prompt, (int32_t)o->po.page,
                                     e->cal_h + e->n_cal, e->cal_v + e->n_cal);
    e->n_cal_tok += (size_t)ref->n_gen;
}

/* Configuration k on one instance: free-running (accuracy, token agreement)
 * and teacher-forced with the dense tokens (top-1 agreement, KL, recall). */
static ks_status eval_compare(eval_state *e, int k, const ks_eval_instance *inst, const ks_eval_result *ref,
                              eval_cell *c) {
    ks_eval_result fr, tf;
    ks_eval_run_opts of = ks_eval_run_default_opts();
    of.keep_logits = true;
    of.prefix = e->pc;
    ks_status st;
    if ((st = ks_eval_run(e->ctxs[k], e->m, inst, &of, &fr)) != KS_OK) return st;
    e->restored += fr.n_restored;
    e->prompt_rows += fr.n_prompt;
    /* a free run that produced exactly the dense tokens *is* the teacher-forced
     * run (same inputs, same steps): reuse it instead of running again */
    bool same = fr.n_gen == ref->n_gen && (ref->n_gen == 0 || !memcmp(fr.tokens, ref->tokens, sizeof(int32_t) * ref->n_gen));
    double recall = NAN;
    ks_turnover tv; /* the free run's: the policy's own steps */
    ks_context_take_turnover(e->ctxs[k], &tv);
    c->turn_pol += tv.policy_moved;
    c->turn_orc += tv.oracle_moved;
    c->turn_sel += tv.selected;
    if (same) {
        ks_context_take_recall(e->ctxs[k], NULL, &recall);
        tf = fr;
        tf.answer = NULL;
        tf.tokens = NULL;
        tf.logits = fr.logits;
    } else {
        ks_context_take_recall(e->ctxs[k], NULL, NULL); /* count the forced run only */
        ks_eval_run_opts ot = ks_eval_run_default_opts();
        ot.forced = ref->tokens;
        ot.n_forced = ref->n_gen;
        ot.keep_logits = true;
        ot.prefix = e->pc;
        if ((st = ks_eval_run(e->ctxs[k], e->m, inst, &ot, &tf)) != KS_OK) { ks_eval_result_free(&fr); return st; }
        e->restored += tf.n_restored;
        e->prompt_rows += tf.n_prompt;
        ks_context_take_recall(e->ctxs[k], NULL, &recall);
    }
    double agree_tf = 1, agree_free = 1, kl = 0;
    int32_t nf = fr.n_gen < ref->n_gen ? fr.n_gen : ref->n_gen;
    if (ref->n_gen > 0 && tf.n_gen == ref->n_gen) {
        ks_eval_top1_agreement(tf.logits, ref->logits, ref->n_gen, e->V, &agree_tf);
        ks_eval_mean_kl(ref->logits, tf.logits, ref->n_gen, e->V, &kl);
    }
    if (nf > 0) ks_eval_token_agreement(fr.tokens, ref->tokens, nf, &agree_free);
    if (fr.n_gen != ref->n_gen && ref->n_gen > 0) /* stopped at a different length */
        agree_free = agree_free * nf / (fr.n_gen > ref->n_gen ? fr.n_gen : ref->n_gen);
    c->runs++;
    c->score_sum += fr.score;
    c->tokens += fr.n_prompt + fr.n_gen;
    c->seconds += fr.seconds;
    c->total_sum += inst->n_total;
    c->agree_tf_sum += agree_tf;
    c->agree_free_sum += agree_free;
    c->kl_sum += kl;
    if (recall == recall) c->recall_sum += recall, c->recall_runs++;
    if (same) tf.logits = NULL; /* owned by fr */
    ks_eval_result_free(&fr);
    ks_eval_result_free(&tf);
    return KS_OK;
}

static eval_cell *eval_cell_at(eval_state *e, int k, int t, int l, int d, int n_depth) {
    return &e->cells[k * e->per_cfg + ((size_t)t * e->n_len + l) * n_depth + d];
}

/* The dense reference on its kernels (--reference-simd), then --calibrate,
 * --show and --dump-prompts, then the reference's cell. */
static int eval_reference(app_options *o, eval_state *e, const ks_eval_instance *inst, int s, eval_cell *c0,
                          ks_eval_result *ref) {
    ks_eval_run_opts ro = ks_eval_run_default_opts();
    ro.keep_logits = e->n_cfg > 1 || o->calibrate;
    /* a reference on other kernels (--reference-simd) computes KV the others must not restore:
     * the cache keys a prompt by model, layout and prefill setting, not by kernels */
    ro.prefix = o->ref_simd >= 0 ? NULL : e->pc;
    ks_simd_level simd_saved = ks_simd_current();
    if (o->ref_simd >= 0) ks_simd_force((ks_simd_level)o->ref_simd); /* no other thread runs: a step boundary */
    ks_status st = ks_eval_run(e->ctxs[0], e->m, inst, &ro, ref);
    ks_simd_force(simd_saved);
    if (st != KS_OK) { app_report(o->cmd, "running an instance", st); return 1; }
    e->restored += ref->n_restored;
    e->prompt_rows += ref->n_prompt;
    if (o->calibrate && ref->n_gen > 0) eval_collect_calibration(o, e, ref);
    if (o->show) eval_show(e->m, inst, ref, s);
    if (o->dump_dir && (st = eval_dump_prompt(o->dump_dir, inst, s)) != KS_OK) {
        ks_eval_result_free(ref);
        app_report(o->cmd, "--dump-prompts", st);
        return 1;
    }
    c0->runs++;
    c0->score_sum += ref->score;
    c0->tokens += ref->n_prompt + ref->n_gen;
    c0->seconds += ref->seconds;
    c0->total_sum += inst->n_total;
    return -1;
}

/* Sample s of cell (task t, length l, depth d) on every configuration; 0: the
 * task does not fit this length (the cell stays n/a). */
static int eval_sample(app_options *o, eval_state *e, int t, int l, int d, long s) {
    double depth = o->eval_depths[d];
    uint64_t sd = eval_mix(eval_mix(eval_mix(eval_mix((uint64_t)o->eval_seed) ^ (uint64_t)t) ^ (uint64_t)e->lens[l]) ^
                           (uint64_t)llround(depth * 1e6)) ^ (uint64_t)s;
    ks_eval_instance inst;
    ks_status st = ks_eval_generate((ks_eval_task)t, sd, e->lens[l], depth, e->m, &inst);
    if (st == KS_ERR_INVALID_ARG) { /* too short for this task */
        if (d == 0)
            fprintf(stderr, "kvsieve eval: skipping %s at length %d: too short for its smallest form\n",
                    ks_eval_task_name((ks_eval_task)t), e->lens[l]);
        return 0;
    }
    if (st != KS_OK) { app_report(o->cmd, "generating a task", st); return 1; }
    ks_eval_result ref;
    int rc = eval_reference(o, e, &inst, (int)s, eval_cell_at(e, 0, t, l, d, o->n_eval_depths), &ref);
    if (rc >= 0) { ks_eval_instance_free(&inst); return rc; }
    for (int k = 1; k < e->n_cfg && st == KS_OK; k++)
        st = eval_compare(e, k, &inst, &ref, eval_cell_at(e, k, t, l, d, o->n_eval_depths));
    if (e->pc) { /* the next instance shares no prompt with this one: its blocks go */
        ks_prefix_cache_trim(e->pc, 0);
        ks_prefix_cache_trim(e->pc, e->pc_cap);
    }
    ks_eval_result_free(&ref);
    ks_eval_instance_free(&inst);
    if (st != KS_OK) { app_report(o->cmd, "running an instance on a policy", st); return 1; }
    return -1;
}

static int eval_cell_run(app_options *o, eval_state *e, int t, int l, int d) {
    for (int k = 0; k < e->n_cfg; k++) *eval_cell_at(e, k, t, l, d, o->n_eval_depths) = (eval_cell){.task = t, .li = l, .di = d};
    for (long s = 0; s < o->samples; s++) {
        int rc = eval_sample(o, e, t, l, d, s);
        if (rc == 0) break;
        if (rc > 0) return rc;
    }
    for (int k = 0; k < e->n_cfg; k++) {
        const eval_cell *c = eval_cell_at(e, k, t, l, d, o->n_eval_depths);
        if (k == 0) e->ran += c->runs;
        if (c->runs)
            fprintf(stderr, "kvsieve eval: %-18s %-10s len %6d depth %.2f: %.3f\n", e->cfgs[k].label,
                    ks_eval_task_name((ks_eval_task)t), e->lens[l], o->eval_depths[d], c->score_sum / c->runs);
    }
    return -1;
}

/* The policy counters of length l's contexts, then the contexts go. */
static void eval_close_contexts(eval_state *e, int l) {
    if (e->pc) {
        fprintf(stderr, "kvsieve eval: len %6d: --share-prefill restored %lld of %lld prompt rows (%.1f%%)\n", e->lens[l],
                (long long)e->restored, (long long)e->prompt_rows,
                e->prompt_rows ? 100.0 * (double)e->restored / (double)e->prompt_rows : 0.0);
        ks_prefix_cache_destroy(e->pc);
        e->pc = NULL;
    }
    for (int k = 0; k < e->n_cfg; k++) {
        ks_stats cs;
        ks_context_stats(e->ctxs[k], &cs);
        e->sums[k].selections += cs.policy_selections;
        e->sums[k].hits += cs.policy_hits;
        e->sums[k].misses += cs.policy_misses;
        e->sums[k].corrections += cs.policy_corrections;
        e->sums[k].rebuilds += cs.policy_rebuilds;
        if (cs.policy_topp_refined) { /* the extremes over every length's heads */
            eval_summary *w = &e->sums[k];
            bool first = !w->topp_refined;
            w->topp_head_min = first || cs.policy_topp_head_min < w->topp_head_min ? cs.policy_topp_head_min : w->topp_head_min;
            w->topp_head_max = first || cs.policy_topp_head_max > w->topp_head_max ? cs.policy_topp_head_max : w->topp_head_max;
        }
        e->sums[k].topp_refined += cs.policy_topp_refined;
        e->sums[k].topp_picked += cs.policy_topp_picked;
        e->sums[k].topp_kept += cs.policy_topp_kept;
        e->pol_sel[k] += cs.policy_selections;
        e->pol_reb[k] += cs.policy_rebuilds;
        if (k && cs.policy_selections)
            fprintf(stderr, "kvsieve eval: %-18s len %6d: %llu selections, %llu rebuilds\n", e->cfgs[k].label, e->lens[l],
                    (unsigned long long)cs.policy_selections, (unsigned long long)cs.policy_rebuilds);
        ks_context_destroy(e->ctxs[k]);
        e->ctxs[k] = NULL;
    }
}

static int eval_sweep_all(app_options *o, eval_state *e) {
    for (int l = 0; l < e->n_len; l++) {
        int rc = eval_open_contexts(o, e, l);
        if (rc >= 0) return rc;
        for (int t = 0; t < KS_EVAL_TASK_COUNT; t++) {
            if (!o->task_on[t]) continue;
            for (int d = 0; d < o->n_eval_depths; d++)
                if ((rc = eval_cell_run(o, e, t, l, d)) >= 0) return rc;
        }
        eval_close_contexts(e, l);
    }
    if (!e->ran) {
        fprintf(stderr, "kvsieve eval: no instance fits the lengths given\n");
        return 2;
    }
    return -1;
}

/* Summaries, the --calibrate file, then the table or JSON and the plots. */
static int eval_finish(app_options *o, eval_state *e) {
    for (int k = 0; k < e->n_cfg; k++) {
        eval_summary counters = e->sums[k];
        eval_summarize(e->cells + k * e->per_cfg, e->per_cfg, &e->sums[k]);
        e->sums[k].selections = counters.selections;
        e->sums[k].hits = counters.hits;
        e->sums[k].misses = counters.misses;
        e->sums[k].corrections = counters.corrections;
        e->sums[k].rebuilds = counters.rebuilds;
        e->sums[k].topp_refined = counters.topp_refined;
        e->sums[k].topp_picked = counters.topp_picked;
        e->sums[k].topp_kept = counters.topp_kept;
        e->sums[k].topp_head_min = counters.topp_head_min;
        e->sums[k].topp_head_max = counters.topp_head_max;
    }
    if (o->calibrate) {
        if (!e->n_cal) {
            fprintf(stderr, "kvsieve eval: --calibrate: the dense runs decoded no token\n");
            return 1;
        }
        double h = app_percentile(e->cal_h, e->n_cal, APP_CHESS_CALIB_PERCENTILE);
        double v = app_percentile(e->cal_v, e->n_cal, APP_CHESS_CALIB_PERCENTILE);
        if (!app_chess_calib_write(o->cmd, o->model_path, h, v, e->n_cal_tok, e->n_cal, (int32_t)o->po.page)) return 1;
        fprintf(stderr,
                "kvsieve eval: chess calibration over %zu dense tokens in %zu pages of %ld: h_max=%.9g v_max=%.9g -> "
                "%s%s\n",
                e->n_cal_tok, e->n_cal, o->po.page, h, v, o->model_path, APP_CHESS_CALIB_SUFFIX);
    }
    eval_sweep sweep = {.cells = e->cells, .per_cfg = e->per_cfg, .cfgs = e->cfgs, .n_cfg = e->n_cfg, .sums = e->sums,
                        .lens = e->lens, .n_len = e->n_len, .depths = o->eval_depths, .n_depth = o->n_eval_depths,
                        .task_on = o->task_on, .po = &o->po, .pol_sel = e->pol_sel, .pol_reb = e->pol_reb,
                        .kv_type = o->kv_type};
    if (o->json) {
        eval_meta meta = {.model_path = o->model_path, .seed = o->eval_seed, .samples = o->samples,
                          .n_ctx_train = e->n_train, .ref_simd = o->ref_simd};
        if (!eval_print_json(&sweep, &meta)) return 1;
    } else {
        eval_print_table(&sweep);
    }
    if (o->plot && !eval_plot(o->plot, &sweep)) return 1;
    return -1;
}

int cmd_eval(int argc, char **argv) {
    app_options o;
    int rc = app_parse("eval", argc, argv, &o);
    if (rc >= 0) return rc;
    if (!o.tasks_given)
        for (int t = 0; t < KS_EVAL_TASK_COUNT; t++) o.task_on[t] = true;
    if ((rc = app_resolve_model(&o, true)) >= 0) return rc;
    eval_state *e = calloc(1, sizeof *e);
    eval_configs(&o, e);
    e->ctxs = calloc((size_t)e->n_cfg, sizeof *e->ctxs);
    e->pol_sel = calloc((size_t)e->n_cfg * 2, sizeof(uint64_t));
    e->pol_reb = e->pol_sel + e->n_cfg;
    rc = 1;
    if (app_load_model(&o, ks_model_default_params(), &e->m)) {
        e->n_train = ks_model_n_ctx_train(e->m);
        e->V = ks_model_n_vocab(e->m);
        if ((rc = eval_lengths(&o, e)) < 0 && (rc = eval_sweep_all(&o, e)) < 0 && (rc = eval_finish(&o, e)) < 0) rc = 0;
    }
    free(e->cal_h);
    free(e->cal_v);
    free(e->pol_sel);
    free(e->cells);
    free(e->sums);
    ks_prefix_cache_destroy(e->pc); /* a sweep stopped by an error */
    for (int k = 0; k < e->n_cfg; k++) ks_context_destroy(e->ctxs[k]);
    free(e->ctxs);
    ks_model_destroy(e->m);
    free(e);
    return rc;
}
