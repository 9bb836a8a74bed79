/*
 * cmd_run.c — `kvsieve run`: generate text from a prompt, streaming tokens.
 *
 * stdout carries only the generated text (so it can be piped); timings and
 * bandwidth go to stderr.  Stop strings are matched on the decoded text with
 * a hold-back buffer, so no part of a stop string is ever printed.
 */
#include "args.h"
#include "commands.h"
#include "infer/infer.h"
#include "infer/stop.h"
#include "kvsieve.h"
#include "policy_opts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: kvsieve run [-m MODEL.gguf] (-p PROMPT | -f FILE) [options]\n"
            "  -m PATH            model (default: $KVSIEVE_MODEL or the bundled model)\n"
            "  -p TEXT            prompt text\n"
            "  -f FILE            read the prompt from a file\n"
            "  -n N               tokens to generate (default 128)\n"
            "  -c N               context length (default: prompt + n, at least 512, capped by the model)\n"
            "  -t N               threads (default: all cores)\n"
            "  --chat             wrap the prompt in the model's chat template\n"
            "  --system TEXT      system prompt for --chat\n"
            "  --temp X           temperature, 0 = greedy (default 0.8)\n"
            "  --top-k N          (default 40, 0 = off)\n"
            "  --top-p X          (default 0.95, 1 = off)\n"
            "  --min-p X          (default 0.05, 0 = off)\n"
            "  --repeat-penalty X (default 1.0 = off)   --repeat-last-n N (default 64)\n"
            "  --seed N           sampling seed (default 42)\n"
            "  --stop TEXT        stop when TEXT is generated (repeatable)\n"
            "  --ignore-eos       keep generating past end-of-generation tokens\n"
            "  --kv-type f16|q8   KV cache element type (default f16)\n"
            "  --batch N          prefill chunk size in tokens (default 256)\n"
            "  --prompt-cache FILE  start from the longest prefix of the prompt cached in FILE, and save the\n"
            "                     prompt's KV there after prefill (exact: the same output as without it)\n"
            "  --no-bos           do not prepend BOS\n"
            "  --verbose          log level debug\n"
            "%s", app_policy_usage());
}

int cmd_run(int argc, char **argv) {
    const char *cmd = "run", *model_path = NULL, *prompt = NULL, *prompt_file = NULL, *system = NULL;
    const char *cache_file = NULL;
    ks_prefix_cache *pcache = NULL;
    long n_gen = 128, n_ctx = 0, n_threads = 0, n_batch = 256;
    bool chat = false, ignore_eos = false, add_bos = true;
    ks_sampler_params sp = ks_sampler_default_params();
    ks_kv_type kv_type = KS_KV_F16;
    const char *stops[16];
    size_t n_stops = 0;
    app_policy_opts po;
    app_policy_opts_init(&po);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        long lv;
        int pr = app_policy_opt(cmd, argc, argv, &i, &po, false);
        if (pr < 0) return 2;
        if (pr > 0) continue;
#define VAL() do { if (!(v = arg_value(cmd, argc, argv, &i))) return 2; } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "-m")) { VAL(); model_path = v; }
        else if (!strcmp(a, "-p")) { VAL(); prompt = v; }
        else if (!strcmp(a, "-f")) { VAL(); prompt_file = v; }
        else if (!strcmp(a, "-n")) { VAL(); if (!arg_long(cmd, a, v, 0, 1 << 24, &n_gen)) return 2; }
        else if (!strcmp(a, "-c")) { VAL(); if (!arg_long(cmd, a, v, 1, 1 << 24, &n_ctx)) return 2; }
        else if (!strcmp(a, "-t")) { VAL(); if (!arg_long(cmd, a, v, 1, 1024, &n_threads)) return 2; }
        else if (!strcmp(a, "--batch")) { VAL(); if (!arg_long(cmd, a, v, 1, 65536, &n_batch)) return 2; }
        else if (!strcmp(a, "--chat")) chat = true;
        else if (!strcmp(a, "--system")) { VAL(); system = v; }
        else if (!strcmp(a, "--temp")) { VAL(); if (!arg_float(cmd, a, v, 0, 100, &sp.temperature)) return 2; }
        else if (!strcmp(a, "--top-k")) { VAL(); if (!arg_long(cmd, a, v, 0, 1 << 30, &lv)) return 2; sp.top_k = (int32_t)lv; }
        else if (!strcmp(a, "--top-p")) { VAL(); if (!arg_float(cmd, a, v, 1e-6, 1, &sp.top_p)) return 2; }
        else if (!strcmp(a, "--min-p")) { VAL(); if (!arg_float(cmd, a, v, 0, 0.999999, &sp.min_p)) return 2; }
        else if (!strcmp(a, "--repeat-penalty")) { VAL(); if (!arg_float(cmd, a, v, 1e-3, 100, &sp.repeat_penalty)) return 2; }
        else if (!strcmp(a, "--repeat-last-n")) { VAL(); if (!arg_long(cmd, a, v, 0, 1 << 20, &lv)) return 2; sp.repeat_last_n = (int32_t)lv; }
        else if (!strcmp(a, "--seed")) { VAL(); if (!arg_long(cmd, a, v, 0, 0x7fffffffffffffffL, &lv)) return 2; sp.seed = (uint64_t)lv; }
        else if (!strcmp(a, "--stop")) {
            VAL();
            if (n_stops == 16) { fprintf(stderr, "kvsieve run: at most 16 --stop strings\n"); return 2; }
            if (!*v) { fprintf(stderr, "kvsieve run: --stop needs a non-empty string\n"); return 2; }
            stops[n_stops++] = v;
        }
        else if (!strcmp(a, "--ignore-eos")) ignore_eos = true;
        else if (!strcmp(a, "--no-bos")) add_bos = false;
        else if (!strcmp(a, "--verbose")) ks_log_set_level(KS_LOG_DEBUG);
        else if (!strcmp(a, "--kv-type")) { VAL(); if (!arg_kv_type(cmd, v, &kv_type)) return 2; }
        else if (!strcmp(a, "--prompt-cache")) { VAL(); cache_file = v; }
        else { fprintf(stderr, "kvsieve run: unknown option '%s'\n", a); usage(stderr); return 2; }
#undef VAL
    }
    if (!prompt == !prompt_file) {
        fprintf(stderr, "kvsieve run: give exactly one of -p PROMPT or -f FILE\n");
        return 2;
    }
    if (!model_path) model_path = app_default_model();
    po.model_path = model_path;
    if (!model_path) {
        fprintf(stderr, "kvsieve run: no model given (-m) and no bundled model found (set KVSIEVE_MODEL)\n");
        return 2;
    }
    if (!app_policy_calibration(&po, cmd, model_path)) return 2;
    char *file_text = NULL;
    size_t prompt_len = 0;
    if (prompt_file) {
        if (!(file_text = app_read_file(cmd, prompt_file, &prompt_len))) return 1;
        prompt = file_text;
    } else {
        prompt_len = strlen(prompt);
    }
    int rc = 1;
    ks_model *model = NULL;
    ks_context *ctx = NULL;
    ks_sampler *smp = NULL;
    ks_stop_matcher *stop = NULL;
    int32_t *ids = NULL;
    float *logits = NULL;
    char *chat_buf = NULL;
    if (prompt_len == 0) {
        fprintf(stderr, "kvsieve run: the prompt is empty\n");
        rc = 2;
        goto done;
    }
    ks_status st = ks_model_load(model_path, ks_model_default_params(), &model);
    if (st != KS_OK) { app_report(cmd, "loading the model", st); goto done; }
    if (chat) {
        size_t need = 0;
        ks_chat_format(model, system, prompt, NULL, 0, &need);
        chat_buf = malloc(need + 1);
        st = ks_chat_format(model, system, prompt, chat_buf, need + 1, &need);
        if (st != KS_OK) { app_report(cmd, "applying the chat template", st); goto done; }
        prompt = chat_buf;
        prompt_len = need;
    }
    size_t n_prompt = 0;
    st = ks_tokenize(model, prompt, prompt_len, add_bos, chat, NULL, 0, &n_prompt);
    if (st != KS_OK && n_prompt == 0) { app_report(cmd, "tokenizing the prompt", st); goto done; }
    ids = malloc(sizeof(int32_t) * (n_prompt + (size_t)n_gen + 1));
    st = ks_tokenize(model, prompt, prompt_len, add_bos, chat, ids, n_prompt, &n_prompt);
    if (st != KS_OK) { app_report(cmd, "tokenizing the prompt", st); goto done; }
    if (n_prompt == 0) { fprintf(stderr, "kvsieve run: the prompt has no tokens\n"); rc = 2; goto done; }
    int32_t train = ks_model_n_ctx_train(model);
    bool auto_ctx = n_ctx == 0;
    if (auto_ctx) {
        n_ctx = (long)n_prompt + n_gen;
        if (n_ctx < 512) n_ctx = 512;
        if (n_ctx > train) n_ctx = train;
    }
    if ((long)n_prompt + n_gen > n_ctx) {
        fprintf(stderr, "kvsieve run: prompt of %zu tokens + %ld to generate exceed the context of %ld tokens "
                        "(model trained for %d); shorten the prompt or raise -c\n", n_prompt, n_gen, n_ctx, train);
        rc = 2;
        goto done;
    }
    ks_context_params cp = ks_context_default_params();
    cp.n_ctx = (int32_t)n_ctx;
    cp.n_threads = (int32_t)n_threads;
    cp.n_batch = (int32_t)n_batch;
    cp.kv_type = kv_type;
    app_policy_apply(&po, 0, app_budget_tokens(&po.budgets[0], (int32_t)n_ctx), &cp);
    if (auto_ctx) { /* room for DapQ's pseudo tokens; an explicit -c is the caller's (dapq logs a shortfall) */
        long with_room = n_ctx + ks_policy_prefill_room(cp.policy, cp.policy_args);
        if (with_room > train) with_room = train > n_ctx ? train : n_ctx;
        cp.n_ctx = (int32_t)with_room;
    }
    if ((st = ks_context_create(model, cp, &ctx)) != KS_OK) { app_report(cmd, "creating the context", st); goto done; }
    int32_t n_vocab = ks_model_n_vocab(model);
    logits = malloc(sizeof(float) * (size_t)n_vocab);
    if ((st = ks_sampler_create(sp, n_vocab, &smp)) != KS_OK) { app_report(cmd, "creating the sampler", st); goto done; }
    if ((st = ks_stop_create(stops, n_stops, &stop)) != KS_OK) { app_report(cmd, "stop strings", st); goto done; }
    for (size_t i = 0; i < n_prompt; i++) ks_sampler_accept(smp, ids[i]);
    const double t_submit = ks_time_sec(); /* time to first token: from here to the first sampled token */
    double ttft = -1;
    double t_pf0 = t_submit, t_load = 0, t_save = 0;
    int32_t n_cached = 0, n_saved = 0;
    if (cache_file) { /* llama-cli's --prompt-cache: a file of the prompt's KV blocks */
        ks_prefix_cache_params pcp = ks_prefix_cache_default_params();
        pcp.ram_bytes = UINT64_MAX / 2; /* the file is the bound */
        if ((st = ks_prefix_cache_create(model, &pcp, &pcache)) != KS_OK) { app_report(cmd, "prompt cache", st); goto done; }
        int32_t nb = 0;
        st = ks_prefix_cache_load_file(pcache, cache_file, &nb);
        if (st != KS_OK && st != KS_ERR_NOT_FOUND) { app_report(cmd, "reading the prompt cache", st); goto done; }
        t_load = ks_time_sec() - t_pf0;
        st = ks_prefill_cached(ctx, pcache, 0, ids, (int32_t)n_prompt, logits, &n_cached);
    } else {
        st = ks_prefill(ctx, 0, ids, (int32_t)n_prompt, logits, NULL);
    }
    if (st != KS_OK) { app_report(cmd, "prefill", st); goto done; }
    double t_pf = ks_time_sec() - t_pf0;
    if (cache_file) {
        double t0 = ks_time_sec();
        if ((st = ks_prefix_cache_save_file(pcache, ctx, ids, (int32_t)n_prompt, cache_file, &n_saved)) != KS_OK) {
            app_report(cmd, "writing the prompt cache", st);
            goto done;
        }
        t_save = ks_time_sec() - t0;
    }
    ks_stats s_prefill;
    ks_context_stats(ctx, &s_prefill);
    ks_stats_reset(ctx);
    int32_t seq0 = 0, n_done = 0;
    const char *why = "length";
    char piece[256];
    ks_stop_out so = {0};
    while (n_done < n_gen) {
        int32_t tok = ks_sampler_sample(smp, logits);
        if (ttft < 0) ttft = ks_time_sec() - t_submit;
        ks_sampler_accept(smp, tok);
        if (!ignore_eos && ks_token_is_eog(model, tok)) { why = "end of generation"; break; }
        n_done++;
        size_t np = 0;
        if (ks_token_to_piece(model, tok, piece, sizeof piece, &np) != KS_OK) np = 0;
        if ((st = ks_stop_feed(stop, piece, np, &so)) != KS_OK) { app_report(cmd, "stop strings", st); goto done; }
        fwrite(so.text, 1, so.len, stdout);
        fflush(stdout);
        if (so.matched) { why = "stop string"; break; }
        if (n_done == n_gen) break; /* no decode for a token that will not be sampled from */
        if ((st = ks_decode(ctx, &seq0, &tok, 1, logits)) != KS_OK) { app_report(cmd, "decode", st); goto done; }
    }
    if (!so.matched) {
        ks_stop_flush(stop, &so);
        fwrite(so.text, 1, so.len, stdout);
    }
    fputc('\n', stdout);
    fflush(stdout);
    ks_stats sd;
    ks_context_stats(ctx, &sd);
    double pf_s = s_prefill.prefill_seconds, dc_s = sd.decode_seconds;
    fprintf(stderr, "\nkvsieve run: stopped by %s\n", why);
    fprintf(stderr, "  prompt:  %5zu tokens in %7.3f s = %8.2f tok/s\n", n_prompt, pf_s, pf_s > 0 ? n_prompt / pf_s : 0);
    if (cache_file)
        fprintf(stderr, "  cache:   %d prompt tokens cached, %zu computed, prompt done after %.3f s (cache read %.3f s); "
                        "%d blocks saved to %s in %.3f s\n",
                n_cached, n_prompt - (size_t)n_cached, t_pf, t_load, n_saved, cache_file, t_save);
    if (ttft >= 0) fprintf(stderr, "  time to first token: %.3f s\n", ttft);
    if (sd.tokens_decoded)
        fprintf(stderr, "  decode:  %5llu tokens in %7.3f s = %8.2f tok/s, %.2f GB/s (weights %.2f + KV %.3f GB read)\n",
                (unsigned long long)sd.tokens_decoded, dc_s, sd.tokens_decoded / dc_s,
                (sd.weight_bytes_read + sd.kv_bytes_read) / dc_s / 1e9, sd.weight_bytes_read / 1e9,
                sd.kv_bytes_read / 1e9);
    if (sd.tokens_decoded && (strcmp(cp.policy, "dense") != 0 || cp.kv_offload_layers > 0))
        fprintf(stderr, "  policy:  %s budget %d: attended %.1f%% of KV entries; selection %.2f ms/token (thread time); "
                        "slow tier: %.2f MB loaded, %.2f MB stored, %llu entries loaded / %llu kept buffered, "
                        "%llu whole pages read, %llu synchronous fallbacks\n",
                cp.policy, cp.budget,
                sd.kv_entries_total ? 100.0 * sd.kv_entries_attended / sd.kv_entries_total : 100.0,
                1e3 * sd.select_seconds / sd.tokens_decoded, sd.kv_bytes_loaded / 1e6, sd.kv_bytes_stored / 1e6,
                (unsigned long long)sd.kv_entries_loaded, (unsigned long long)sd.kv_entries_hit,
                (unsigned long long)sd.kv_pages_loaded, (unsigned long long)sd.kv_sync_fallbacks);
    if (cp.mem_cap > 0) {
        ks_memplan_info pl;
        ks_context_memplan(ctx, &pl);
        fprintf(stderr, "  memory:  cap %.2f GB: %d of %d layers offloaded at the end (%llu offload events, logged above)\n",
                cp.mem_cap / 1e9, pl.offloaded, pl.n_layer, (unsigned long long)sd.kv_offload_events);
    }
    rc = 0;
done:
    ks_stop_destroy(stop);
    ks_sampler_destroy(smp);
    ks_prefix_cache_destroy(pcache); /* first: its blocks are pages of ctx's store, let go rather than copied out */
    ks_context_destroy(ctx);
    ks_model_destroy(model);
    free(ids);
    free(logits);
    free(chat_buf);
    free(file_text);
    return rc;
}
