/*
 * cmd_bench.c — `kvsieve bench`: prefill and decode throughput against the
 * machine's own measured memory bandwidth.
 *
 * Decode on CPU is memory-bound, so tok/s alone says little: each row also
 * reports the bytes a step must read (weights once per step for the whole
 * batch, plus every sequence's KV), the achieved GB/s, that figure as a
 * fraction of the STREAM-style triad and read bandwidth the bench measures
 * first, and the roofline time bytes / read-bandwidth next to the measured
 * step time.  Long depths are reached by filling the KV cache with synthetic
 * values (ks_seq_fill_synthetic): attention cost depends on the bytes, not on
 * the values, so no long prefill is needed.
 */
#include "args.h"
#include "commands.h"
#include "core/membw.h"
#include "core/simd.h"
#include "infer/infer.h"
#include "kvsieve.h"
#include "policy_opts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void progress(const char *what, int done, int total) {
    if (!isatty(2)) return;
    int w = 30, k = total ? done * w / total : w;
    fprintf(stderr, "\r[%.*s%*s] %d/%d %-40s", k, "##############################", w - k, "", done, total, what);
    if (done == total) fprintf(stderr, "\n");
}

/* The CPU's model name (Linux /proc/cpuinfo), for the record: kernel paths
 * and floors differ by host.  buf keeps "unknown" when it cannot be read. */
static void cpu_model_name(char *buf, size_t cap) {
    snprintf(buf, cap, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10)) continue;
        const char *v = strchr(line, ':');
        if (!v) break;
        v++;
        while (*v == ' ' || *v == '\t') v++;
        size_t n = strcspn(v, "\n");
        size_t k = 0;
        for (size_t i = 0; i < n && k + 1 < cap; i++)
            if (v[i] != '"' && v[i] != '\\') buf[k++] = v[i]; /* stays a valid JSON string */
        buf[k] = '\0';
        break;
    }
    fclose(f);
}

static double membw_best(const ks_membw_result *r) {
    double b = r->triad_gbs;
    if (r->read_gbs > b) b = r->read_gbs;
    if (r->copy_gbs > b) b = r->copy_gbs;
    return b;
}

static size_t mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return (size_t)1 << 40;
    char line[256];
    size_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %zu kB", &kb) == 1) break;
    fclose(f);
    return kb ? kb * 1024 : (size_t)1 << 40;
}

int cmd_bench(int argc, char **argv) {
    const char *cmd = "bench", *model_path = NULL;
    long depths[16] = {0}, batches[16] = {1};
    int n_depth = 1, n_batch = 1;
    long n_threads = 0, n_gen = 16, prompts[16] = {256};
    int n_prompts = 1;
    bool json = false, skip_prefill = false, use_mmap = true, no_repack = false;
    ks_kv_type kv_type = KS_KV_F16;
    app_policy_opts po;
    app_policy_opts_init(&po);
    enum { OFF_NONE, OFF_ALL, OFF_ADAPTIVE };
    int modes[3] = {OFF_NONE}, n_modes = 1;
    static const char *const mode_name[] = {"none", "all", "adaptive"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--offload")) {
            if (!(v = arg_value(cmd, argc, argv, &i))) return 2;
            n_modes = 0;
            char buf[64];
            snprintf(buf, sizeof buf, "%s", v);
            for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
                int m = !strcmp(t, "none") ? OFF_NONE : !strcmp(t, "all") ? OFF_ALL : !strcmp(t, "adaptive") ? OFF_ADAPTIVE : -1;
                if (m < 0 || n_modes == 3) {
                    fprintf(stderr, "kvsieve bench: --offload takes none,all,adaptive (got '%s')\n", v);
                    return 2;
                }
                modes[n_modes++] = m;
            }
            continue;
        }
        int pr = app_policy_opt(cmd, argc, argv, &i, &po, true);
        if (pr < 0) return 2;
        if (pr > 0) continue;
#define VAL() do { if (!(v = arg_value(cmd, argc, argv, &i))) return 2; } while (0)
        if (!strcmp(a, "-m")) { VAL(); model_path = v; }
        else if (!strcmp(a, "--depth")) { VAL(); if ((n_depth = arg_long_list(cmd, a, v, 0, 1 << 22, depths, 16)) < 0) return 2; }
        else if (!strcmp(a, "--batch")) { VAL(); if ((n_batch = arg_long_list(cmd, a, v, 1, 256, batches, 16)) < 0) return 2; }
        else if (!strcmp(a, "-t")) { VAL(); if (!arg_long(cmd, a, v, 1, 1024, &n_threads)) return 2; }
        else if (!strcmp(a, "--n-gen")) { VAL(); if (!arg_long(cmd, a, v, 1, 100000, &n_gen)) return 2; }
        else if (!strcmp(a, "--n-prompt")) { VAL(); if ((n_prompts = arg_long_list(cmd, a, v, 1, 1 << 20, prompts, 16)) < 0) return 2; }
        else if (!strcmp(a, "--no-prefill")) skip_prefill = true;
        else if (!strcmp(a, "--json")) json = true;
        else if (!strcmp(a, "--no-mmap")) use_mmap = false;
        else if (!strcmp(a, "--no-repack")) no_repack = true;
        else if (!strcmp(a, "--kv-type")) {
            VAL();
            if (!arg_kv_type(cmd, v, &kv_type)) return 2;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: kvsieve bench [-m MODEL.gguf] [--depth 0,4096,...] [--batch 1,4,16] [-t THREADS]\n"
                   "                     [--n-gen 16] [--n-prompt 256,4096] [--no-prefill] [--kv-type f16|q8] [--no-mmap] [--no-repack] [--json]\n"
                   "  --no-mmap  read the weights into huge-page memory instead of mapping the file\n"
                   "  --no-repack  keep the file's weight layout (no packed prefill GEMM)\n"
                   "  --n-prompt  prompt lengths to prefill (each: tok/s, GEMM and attention shares of the time,\n"
                   "             GEMM multiply-adds/s as a share of the measured int8 peak)\n"
                   "  --offload none,all,adaptive  slow-tier modes to compare: nothing offloaded, every layer\n"
                   "             offloaded, or SpeContext's adaptive manager under --mem-cap (default none)\n%s",
                   app_policy_usage());
            return 0;
        } else { fprintf(stderr, "kvsieve bench: unknown option '%s'\n", a); return 2; }
#undef VAL
    }
    if (!model_path) model_path = app_default_model();
    po.model_path = model_path;
    if (!model_path) { fprintf(stderr, "kvsieve bench: no model given (-m)\n"); return 2; }
    if (!app_policy_calibration(&po, cmd, model_path)) return 2;
    ks_model *m = NULL;
    ks_model_params mp = ks_model_default_params();
    mp.use_mmap = use_mmap;
    mp.no_repack = no_repack;
    ks_status st = ks_model_load(model_path, mp, &m);
    if (st != KS_OK) { app_report(cmd, "loading the model", st); return 1; }
    if (n_threads == 0) n_threads = ks_cpu_count();
    ks_pool *pool = NULL;
    if ((st = ks_pool_create((int)n_threads, &pool)) != KS_OK) { app_report(cmd, "threads", st); ks_model_destroy(m); return 1; }
    ks_membw_result bw;
    if ((st = ks_membw_measure(pool, 0, 0, &bw)) != KS_OK) { app_report(cmd, "bandwidth probe", st); return 1; }
    double bw_best = membw_best(&bw);
    const ks_hparams *hp = &m->hp;
    char cpu[128];
    cpu_model_name(cpu, sizeof cpu);
    fprintf(stderr, "kvsieve bench: %s, %d threads on %s, SIMD %s; memory bandwidth: triad %.2f GB/s, read %.2f GB/s, copy %.2f GB/s\n",
            hp->arch_name, (int)n_threads, cpu, ks_simd_name(ks_simd_current()), bw.triad_gbs, bw.read_gbs, bw.copy_gbs);
    if (json)
        printf("{\"model\": \"%s\", \"threads\": %ld, \"cpu\": \"%s\", \"simd\": \"%s\", \"bandwidth\": {\"best_gbs\": %.3f, \"triad_gbs\": %.3f, \"read_gbs\": %.3f, \"copy_gbs\": %.3f},\n \"results\": [",
               model_path, n_threads, cpu, ks_simd_name(ks_simd_current()), bw_best, bw.triad_gbs, bw.read_gbs, bw.copy_gbs);
    else {
        printf("model %s | threads %ld | bandwidth %.2f GB/s (triad %.2f, read %.2f, copy %.2f)\n", model_path, n_threads,
               bw_best, bw.triad_gbs, bw.read_gbs, bw.copy_gbs);
        printf("%-14s %6s %6s %6s %11s %9s %9s %8s %8s %7s %9s %8s %6s %6s %6s %9s %7s %7s %5s %6s\n", "test", "budget",
               "depth", "batch", "tok/s", "x dense", "ms/step", "GB/step", "GB/s", "%bw", "roof ms", "ms/roof", "sel%", "gat%",
               "att%", "MB moved", "reload", "hidden", "slow", "syncfb");
    }
    int n_pol = po.n_names, n_bud = po.n_budgets;
    for (int k = 1; k < n_pol; k++) /* dense first, so every row can be divided by it */
        if (!strcmp(po.names[k], "dense")) {
            char tmp[64];
            memcpy(tmp, po.names[k], sizeof tmp);
            memmove(po.names[1], po.names[0], sizeof po.names[0] * (size_t)k);
            memcpy(po.names[0], tmp, sizeof tmp);
        }
    for (int k = 0; k < n_modes; k++)
        if (modes[k] == OFF_ADAPTIVE && po.mem_cap <= 0) {
            fprintf(stderr, "kvsieve bench: --offload adaptive needs --mem-cap SIZE\n");
            return 2;
        }
    int total = (skip_prefill ? 0 : n_prompts) + n_depth * n_batch * n_pol * n_bud * n_modes, done = 0;
    bool first = true;
    int32_t V = hp->n_vocab;
    /* prefill: one fresh context per prompt length; the GEMM's multiply-adds
     * per second are set against the int8 peak of the same threads, measured
     * here (a register-only vpdpbusd loop, tensor/peak.c) */
    double peak = 0;
    for (int k = 0; k < 3 && !skip_prefill; k++) { /* best of three: a shared host only ever lowers it */
        double p = ks_int8_peak_macs(pool, 0.2);
        if (p > peak) peak = p;
    }
    if (!skip_prefill && !json) printf("int8 peak (vpdpbusd, %ld threads, best of 3): %.1f G MAC/s\n", n_threads, peak * 1e-9);
    for (int pi = 0; !skip_prefill && pi < n_prompts; pi++) {
        long n_prompt = prompts[pi];
        ks_context_params cp = ks_context_default_params();
        cp.n_ctx = (int32_t)n_prompt + 1;
        cp.n_threads = (int32_t)n_threads;
        cp.kv_type = kv_type;
        ks_context *ctx = NULL;
        if ((st = ks_context_create(m, cp, &ctx)) != KS_OK) { app_report(cmd, "context", st); return 1; }
        int32_t *toks = malloc(sizeof(int32_t) * (size_t)n_prompt);
        ks_rng rng = {7};
        for (long i = 0; i < n_prompt; i++) toks[i] = (int32_t)(ks_rng_next(&rng) % (uint64_t)V);
        progress("prefill", done, total);
        float *logits = malloc(sizeof(float) * (size_t)V);
        st = ks_prefill(ctx, 0, toks, (int32_t)n_prompt, logits, NULL);
        if (st != KS_OK) { app_report(cmd, "prefill", st); return 1; }
        ks_stats s;
        ks_context_stats(ctx, &s);
        double tps = n_prompt / s.prefill_seconds;
        double gb = (s.weight_bytes_read + s.kv_bytes_read) / 1e9;
        double mm_share = s.matmul_seconds / s.prefill_seconds, att_share = s.attention_seconds / s.prefill_seconds;
        double mm_rate = s.matmul_seconds > 0 ? s.matmul_macs / s.matmul_seconds : 0;
        progress("prefill", ++done, total);
        if (json) {
            printf("%s\n  {\"test\": \"prefill\", \"tokens\": %ld, \"tok_s\": %.3f, \"seconds\": %.4f, \"gb_read\": %.4f, "
                   "\"gemm_share\": %.4f, \"attention_share\": %.4f, \"gemm_macs_s\": %.4g, \"int8_peak_macs_s\": %.4g, "
                   "\"gemm_peak_share\": %.4f}",
                   first ? "" : ",", n_prompt, tps, s.prefill_seconds, gb, mm_share, att_share, mm_rate, peak,
                   peak > 0 ? mm_rate / peak : 0);
            first = false;
        } else
            printf("%-14s %6s %6ld %6d %11.2f %9s %9.2f %8.3f %8.2f %7s   gemm %4.1f%% of time at %.1f G MAC/s = %.1f%% of peak, "
                   "attention %4.1f%%\n",
                   "prefill", "-", n_prompt, 1, tps, "-", 1e3 * s.prefill_seconds, gb, gb / s.prefill_seconds, "-",
                   100 * mm_share, mm_rate * 1e-9, peak > 0 ? 100 * mm_rate / peak : 0, 100 * att_share);
        fflush(stdout);
        free(toks);
        free(logits);
        ks_context_destroy(ctx);
    }
    for (int di = 0; di < n_depth; di++)
        for (int bi = 0; bi < n_batch; bi++) {
          double dense_tps = 0;
          for (int pi = 0; pi < n_pol; pi++)
          for (int ui = 0; ui < n_bud; ui++)
          for (int mi = 0; mi < n_modes; mi++) {
            long depth = depths[di], batch = batches[bi];
            char what[256], blabel[32], label[96];
            app_budget_label(&po.budgets[ui], blabel, sizeof blabel);
            snprintf(label, sizeof label, "%s%s%s", po.names[pi], n_modes > 1 ? "/" : "",
                     n_modes > 1 ? mode_name[modes[mi]] : "");
            snprintf(what, sizeof what, "%s %s depth %ld batch %ld", label, blabel, depth, batch);
            progress(what, done, total);
            ks_context_params cp = ks_context_default_params();
            cp.n_ctx = (int32_t)(depth + n_gen + 1);
            cp.n_seq = (int32_t)batch;
            cp.n_threads = (int32_t)n_threads;
            cp.kv_type = kv_type;
            app_policy_apply(&po, pi, app_budget_tokens(&po.budgets[ui], (int32_t)(depth + 1)), &cp);
            cp.n_ctx += ks_policy_prefill_room(cp.policy, cp.policy_args);
            cp.mem_cap = 0;
            if (modes[mi] == OFF_ALL) cp.kv_offload_layers = hp->n_layer;
            if (modes[mi] == OFF_ADAPTIVE) cp.mem_cap = po.mem_cap;
            if (modes[mi] != OFF_NONE && cp.budget <= 0) cp.budget = (int32_t)(depth + 1);
            bool is_dense = !strcmp(po.names[pi], "dense") && modes[mi] == OFF_NONE;
            if (!strcmp(po.names[pi], "dense") && ui > 0) { done++; continue; } /* dense ignores the budget: one row */
            double kv_need = 2.0 * hp->n_layer * hp->n_head_kv * ks_kv_row_bytes(kv_type, hp->head_dim) * cp.n_ctx * batch;
            /* KV plus its page metadata (positions, per-channel min/max/sum: ~11% at hd 64, P 32) */
            double meta = kv_need / (2.0 * cp.page * ks_kv_row_bytes(kv_type, hp->head_dim)) *
                          (4.0 * cp.page + 12.0 * hp->head_dim);
            if (kv_need + meta > 0.80 * (double)mem_available()) {
                fprintf(stderr, "\nkvsieve bench: skipping depth %ld batch %ld: KV cache of %.1f GiB exceeds available memory\n",
                        depth, batch, kv_need / 1073741824.0);
                if (json) { printf("%s\n  {\"test\": \"decode\", \"policy\": \"%s\", \"budget\": %d, \"depth\": %ld, \"batch\": %ld, \"skipped\": \"memory\"}", first ? "" : ",", label, cp.budget, depth, batch); first = false; }
                else printf("%-14s %6s %6ld %6ld %11s\n", label, blabel, depth, batch, "skipped (memory)");
                done++;
                continue;
            }
            ks_context *ctx = NULL;
            if ((st = ks_context_create(m, cp, &ctx)) != KS_OK) { app_report(cmd, "context", st); return 1; }
            int32_t *seqs = malloc(sizeof(int32_t) * (size_t)batch), *toks = malloc(sizeof(int32_t) * (size_t)batch);
            float *logits = malloc(sizeof(float) * (size_t)V * (size_t)batch);
            for (long b = 0; b < batch; b++) {
                seqs[b] = (int32_t)b;
                toks[b] = (int32_t)((b * 7919 + 13) % V);
                if ((st = ks_seq_fill_synthetic(ctx, (int32_t)b, (int32_t)depth, 1234 + (uint64_t)b)) != KS_OK) { app_report(cmd, "fill", st); return 1; }
            }
            /* one warm-up step (page faults, caches), then n_gen timed steps */
            if ((st = ks_decode(ctx, seqs, toks, (int32_t)batch, logits)) != KS_OK) { app_report(cmd, "decode", st); return 1; }
            ks_memplan_info plan;
            ks_context_memplan(ctx, &plan);
            ks_stats_reset(ctx);
            for (long s = 0; s < n_gen; s++) {
                if ((st = ks_decode(ctx, seqs, toks, (int32_t)batch, logits)) != KS_OK) { app_report(cmd, "decode", st); return 1; }
                for (long b = 0; b < batch; b++) toks[b] = (int32_t)((toks[b] * 31 + 7) % V);
            }
            ks_stats s;
            ks_context_stats(ctx, &s);
            double step = s.decode_seconds / n_gen;
            double gb_step = (s.weight_bytes_read + s.kv_bytes_read) / 1e9 / n_gen;
            /* the bandwidth of a shared machine drifts by 2x within minutes:
             * measure it again right after the row, under the same conditions */
            ks_membw_result bw_row;
            double bw_now = ks_membw_measure(pool, 0, 0, &bw_row) == KS_OK ? membw_best(&bw_row) : bw_best;
            double gbs = gb_step / step, roof = gb_step / bw_now;
            double tps = batch / step;
            if (is_dense) dense_tps = tps;
            double sel = s.select_seconds / (double)n_threads / s.decode_seconds;
            double gat = s.gather_seconds / (double)n_threads / s.decode_seconds;
            double att = s.kv_entries_total ? (double)s.kv_entries_attended / s.kv_entries_total : 1.0;
            double moved_mb = (s.kv_bytes_loaded + s.kv_bytes_stored) / 1e6 / n_gen;
            char xd[16] = "-";
            if (dense_tps > 0) snprintf(xd, sizeof xd, "%.2fx", tps / dense_tps);
            /* how many layers the slow tier holds, and whether "none" would fit the cap */
            int n_slow = modes[mi] == OFF_ALL ? hp->n_layer : modes[mi] == OFF_ADAPTIVE ? plan.offloaded : 0;
            double kv_fast = kv_need * (double)(hp->n_layer - n_slow) / hp->n_layer;
            bool over_cap = po.mem_cap > 0 && kv_fast + (double)m->weight_bytes > po.mem_cap;
            /* elastic loading: entries loaded vs a full reload of every entry decode attention read from
             * the slow layers (exact with every layer offloaded: the attended entries of a step, pro rata
             * under the adaptive split); copy time hidden behind compute */
            uint64_t needed = (uint64_t)((double)s.kv_entries_attended * n_slow / hp->n_layer);
            char reload[16] = "-", hidden[16] = "-";
            if (needed) snprintf(reload, sizeof reload, "%.1f%%", 100.0 * s.kv_entries_loaded / needed);
            if (s.kv_copy_seconds > 0)
                snprintf(hidden, sizeof hidden, "%.0f%%",
                         100.0 * (s.kv_copy_seconds - s.kv_wait_seconds > 0 ? s.kv_copy_seconds - s.kv_wait_seconds : 0) /
                             s.kv_copy_seconds);
            /* speculative retrieval (freekv): the share of speculations the query-similarity check kept */
            uint64_t judged = s.policy_speculative + s.policy_corrections;
            double spec_rate = judged ? (double)s.policy_speculative / judged : 0.0;
            progress(what, ++done, total);
            if (json) {
                printf("%s\n  {\"test\": \"decode\", \"policy\": \"%s\", \"budget\": %d, \"depth\": %ld, \"batch\": %ld, "
                       "\"tok_s\": %.3f, \"vs_dense\": %.4f, \"ms_per_step\": %.3f, "
                       "\"gb_per_step\": %.5f, \"weight_gb_per_step\": %.5f, \"kv_gb_per_step\": %.5f, \"gb_s\": %.3f, "
                       "\"bw_gbs\": %.3f, \"frac_bw\": %.4f, \"roofline_ms\": %.3f, \"select_share\": %.4f, "
                       "\"gather_share\": %.4f, \"select_gb_per_step\": %.5f, \"gather_mb_per_step\": %.4f, "
                       "\"attended_share\": %.4f, \"mb_moved_per_step\": %.4f, \"pages_loaded\": %llu, \"pages_hit\": %llu, "
                       "\"slow_layers\": %d, \"over_cap\": %s, \"copy_ms_per_step\": %.3f, \"wait_ms_per_step\": %.3f, "
                       "\"bytes_loaded_per_step\": %.1f, \"entries_loaded_per_step\": %.1f, "
                       "\"entries_full_reload_per_step\": %.1f, \"reload_share\": %.4f, \"sync_fallbacks\": %llu, "
                       "\"policy_selections\": %llu, \"policy_hits\": %llu, \"policy_misses\": %llu, \"policy_corrections\": %llu, "
                       "\"policy_speculative\": %llu, \"spec_hit_rate\": %.4f, \"policy_rebuilds\": %llu}",
                       first ? "" : ",", label, cp.budget, depth, batch, tps, dense_tps > 0 ? tps / dense_tps : 0,
                       1e3 * step, gb_step, s.weight_bytes_read / 1e9 / n_gen, s.kv_bytes_read / 1e9 / n_gen, gbs, bw_now,
                       gbs / bw_now, 1e3 * roof, sel, gat, s.select_bytes_read / 1e9 / n_gen,
                       s.gather_bytes / 1e6 / n_gen, att, moved_mb, (unsigned long long)s.kv_pages_loaded,
                       (unsigned long long)s.kv_pages_hit, n_slow, over_cap ? "true" : "false",
                       1e3 * s.kv_copy_seconds / n_gen, 1e3 * s.kv_wait_seconds / n_gen,
                       (double)s.kv_bytes_loaded / n_gen, (double)s.kv_entries_loaded / n_gen, (double)needed / n_gen,
                       needed ? (double)s.kv_entries_loaded / needed : 0.0, (unsigned long long)s.kv_sync_fallbacks,
                       (unsigned long long)s.policy_selections, (unsigned long long)s.policy_hits,
                       (unsigned long long)s.policy_misses, (unsigned long long)s.policy_corrections,
                       (unsigned long long)s.policy_speculative, spec_rate, (unsigned long long)s.policy_rebuilds);
                first = false;
            } else
                printf("%-14s %6s %6ld %6ld %11.2f %9s %9.2f %8.3f %8.2f %6.1f%% %9.2f %8.2f %5.1f%% %5.1f%% %5.1f%% %9.2f %7s %7s %5d %6llu%s\n",
                       label, blabel, depth, batch, tps, xd, 1e3 * step, gb_step, gbs, 100 * gbs / bw_now,
                       1e3 * roof, step / roof, 100 * sel, 100 * gat, 100 * att, moved_mb, reload, hidden, n_slow,
                       (unsigned long long)s.kv_sync_fallbacks, over_cap ? "  OVER CAP" : "");
            fflush(stdout);
            free(seqs);
            free(toks);
            free(logits);
            ks_context_destroy(ctx);
          }
        }
    if (json) printf("\n]}\n");
    ks_pool_destroy(pool);
    ks_model_destroy(m);
    return 0;
}
