/*
 * cmd_run.c — `kvsieve run`: generate text from a prompt, streaming tokens.
 *
 * stdout carries only the generated text (so it can be piped); timings and
 * bandwidth go to stderr.  Stop strings are matched on the decoded text with
 * a hold-back buffer, so no part of a stop string is ever printed.  The
 * command is four steps over one run_state: prepare (prompt, model, tokens,
 * context), prefill (optionally through a prompt-cache file), generate and
 * report; each step returns -1 to go on or the exit code.
 */
#include "args.h"
#include "commands.h"
#include "kvsieve.h"
#include "kvsieve_tools.h"
#include "opts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool app_parse_stop(app_options *o, const char *flag, const char *v) {
    if (o->n_stops == APP_MAX_STOPS) { fprintf(stderr, "kvsieve run: at most 16 --stop strings\n"); return false; }
    if (!*v) { fprintf(stderr, "kvsieve run: --stop needs a non-empty string\n"); return false; }
    o->stops[o->n_stops++] = v;
    return true;
}

bool app_parse_verbose(app_options *o, const char *flag, const char *v) {
    ks_log_verbose(true);
    return true;
}

typedef struct run_state {
    char *file_text, *chat_buf;
    const char *prompt;
    size_t prompt_len, n_prompt;
    ks_model *model;
    ks_context *ctx;
    ks_context_params cp;
    ks_sampler *smp;
    ks_stop_matcher *stop;
    ks_prefix_cache *pcache;
    int32_t *ids;
    float *logits;
    double t_submit, ttft, t_pf, t_load, t_save;
    int32_t n_cached, n_saved, every, n_checkpoints;
    ks_stats s_prefill;
    const char *why;
    bool matched;
} run_state;

/* The prompt text (-p or -f), through the chat template with --chat, as tokens. */
static int run_tokens(app_options *o, run_state *s) {
    const char *cmd = o->cmd;
    bool chat = o->chat;
    ks_status st;
    if (chat) {
        size_t need = 0;
        ks_chat_format(s->model, o->system, s->prompt, NULL, 0, &need);
        s->chat_buf = malloc(need + 1);
        st = ks_chat_format(s->model, o->system, s->prompt, s->chat_buf, need + 1, &need);
        if (st != KS_OK) { app_report(cmd, "applying the chat template", st); return 1; }
        s->prompt = s->chat_buf;
        s->prompt_len = need;
    }
    size_t n = 0;
    st = ks_tokenize(s->model, s->prompt, s->prompt_len, !o->no_bos, chat, NULL, 0, &n);
    if (st != KS_OK && n == 0) { app_report(cmd, "tokenizing the prompt", st); return 1; }
    s->ids = malloc(sizeof(int32_t) * (n + (size_t)o->n_gen + 1));
    st = ks_tokenize(s->model, s->prompt, s->prompt_len, !o->no_bos, chat, s->ids, n, &n);
    if (st != KS_OK) { app_report(cmd, "tokenizing the prompt", st); return 1; }
    if (n == 0) { fprintf(stderr, "kvsieve run: the prompt has no tokens\n"); return 2; }
    s->n_prompt = n;
    return -1;
}

/* -c, or prompt + n (at least 512, at most the trained context) plus room
 * for the policy's prefill tokens; an explicit -c is the caller's (dapq logs a shortfall). */
static int run_context(app_options *o, run_state *s) {
    int32_t train = ks_model_n_ctx_train(s->model);
    long n_ctx = o->n_ctx, n_gen = o->n_gen;
    bool auto_ctx = n_ctx == 0;
    if (auto_ctx) {
        n_ctx = (long)s->n_prompt + n_gen;
        if (n_ctx < 512) n_ctx = 512;
        if (n_ctx > train) n_ctx = train;
    }
    if ((long)s->n_prompt + n_gen > n_ctx) {
        fprintf(stderr, "kvsieve run: prompt of %zu tokens + %ld to generate exceed the context of %ld tokens "
                        "(model trained for %d); shorten the prompt or raise -c\n", s->n_prompt, n_gen, n_ctx, train);
        return 2;
    }
    s->cp = app_context_params(o, 0, app_budget_tokens(&o->po.budgets[0], (int32_t)n_ctx), (int32_t)n_ctx, false);
    if (auto_ctx) {
        long with_room = n_ctx + ks_policy_prefill_room(s->cp.policy, s->cp.policy_args);
        if (with_room > train) with_room = train > n_ctx ? train : n_ctx;
        s->cp.n_ctx = (int32_t)with_room;
    }
    if (!app_create_context(o, s->model, s->cp, "creating the context", &s->ctx)) return 1;
    ks_status st = o->turnover ? ks_context_set_turnover_probe(s->ctx, true) : KS_OK;
    if (st != KS_OK) {
        app_report("run", "--turnover", st);
        return 1;
    }
    return -1;
}

static int run_prepare(app_options *o, run_state *s) {
    const char *cmd = o->cmd;
    if (!o->prompt == !o->file) {
        fprintf(stderr, "kvsieve run: give exactly one of -p PROMPT or -f FILE\n");
        return 2;
    }
    int rc = app_resolve_model(o, true);
    if (rc >= 0) return rc;
    if (o->file) {
        if (!(s->file_text = app_read_file(cmd, o->file, &s->prompt_len))) return 1;
        s->prompt = s->file_text;
    } else {
        s->prompt = o->prompt;
        s->prompt_len = strlen(o->prompt);
    }
    if (s->prompt_len == 0) { fprintf(stderr, "kvsieve run: the prompt is empty\n"); return 2; }
    if (!app_load_model(o, ks_model_default_params(), &s->model)) return 1;
    if ((rc = run_tokens(o, s)) >= 0 || (rc = run_context(o, s)) >= 0) return rc;
    int32_t n_vocab = ks_model_n_vocab(s->model);
    s->logits = malloc(sizeof(float) * (size_t)n_vocab);
    ks_status st;
    if ((st = ks_sampler_create(o->sampler, n_vocab, &s->smp)) != KS_OK) { app_report(cmd, "creating the sampler", st); return 1; }
    if ((st = ks_stop_create(o->stops, o->n_stops, &s->stop)) != KS_OK) { app_report(cmd, "stop strings", st); return 1; }
    for (size_t i = 0; i < s->n_prompt; i++) ks_sampler_accept(s->smp, s->ids[i]);
    return -1;
}

/* The tokens between two checkpoints of the prefill (--prompt-cache-every):
 * 0 for none.  By default a prompt over 16K tokens is checkpointed every
 * 8192, a few minutes of a 1B model's prefill on two cores and 1/16 of a
 * 128K prompt, and a shorter one not at all (it is done in minutes).  The
 * interval is a whole number of pages (only whole blocks are cached) and
 * of the sparse prefill's blocks of KS_PREFILL_BLOCK_ROWS rows (a call that
 * starts off their grid would split one, and a sparse sequence caches
 * nothing from then on). */
static int32_t run_checkpoint_every(const app_options *o, const run_state *s) {
    long every = o->cache_every < 0 ? (s->n_prompt > 16384 ? 8192 : 0) : o->cache_every;
    if (!o->cache_file || every <= 0) return 0;
    if (!ks_policy_prefill_chunkable(s->cp.policy)) { /* its prefill hooks need the prompt in one call */
        fprintf(stderr, "kvsieve run: policy %s prefills the prompt in one piece: no checkpoints before the answer\n",
                s->cp.policy);
        return 0;
    }
    long g = s->cp.page > 0 ? s->cp.page : 1, a = g, b = KS_PREFILL_BLOCK_ROWS;
    while (b) {
        long t = a % b;
        a = b;
        b = t;
    }
    long grid = g / a * KS_PREFILL_BLOCK_ROWS;
    every = (every + grid - 1) / grid * grid;
    return every < (long)s->n_prompt ? (int32_t)every : 0;
}

/* llama-cli's --prompt-cache: start from a file of the prompt's KV blocks
 * (run_save_cache writes them after the answer).  With checkpoints the rest
 * of the prompt is prefilled in pieces ending on multiples of the interval,
 * each piece's blocks appended to the file before the next starts
 * (ks_prefix_cache_append_file: a kill mid-append leaves the records before
 * it), so a killed run given the same command restores the longest saved
 * prefix and goes on.  The result is the uninterrupted run's bit for bit: a
 * prefill row's KV does not depend on the call it is computed in
 * (tests/test_prefix.c, test_chunk_invariance; a sparse prefill's pieces end
 * on its block grid), and the prompt's last piece runs the policy's prefill
 * hooks over the whole prompt as one prefill would (ks_prefill_rest). */
static int run_prefill(app_options *o, run_state *s) {
    const char *cmd = o->cmd, *cache_file = o->cache_file;
    ks_status st;
    s->t_submit = ks_time_sec(); /* time to first token: from here to the first sampled token */
    s->ttft = -1;
    if (cache_file) {
        ks_prefix_cache_params pcp = ks_prefix_cache_default_params();
        pcp.ram_bytes = UINT64_MAX / 2; /* the file is the bound */
        if ((st = ks_prefix_cache_create(s->model, &pcp, &s->pcache)) != KS_OK) { app_report(cmd, "prompt cache", st); return 1; }
        int32_t nb = 0;
        st = ks_prefix_cache_load_file(s->pcache, cache_file, &nb);
        if (st != KS_OK && st != KS_ERR_NOT_FOUND) { app_report(cmd, "reading the prompt cache", st); return 1; }
        s->t_load = ks_time_sec() - s->t_submit;
        int32_t n = (int32_t)s->n_prompt, every = s->every = run_checkpoint_every(o, s);
        st = ks_prefix_restore(s->ctx, s->pcache, 0, s->ids, n, &s->n_cached);
        if (st == KS_OK && every)
            fprintf(stderr, "kvsieve run: %d of %d prompt tokens restored from %s; checkpoints every %d tokens\n",
                    s->n_cached, n, cache_file, every);
        /* test hook: end the process (as a kill would) after this many checkpoints */
        const char *hook = getenv("KS_TEST_EXIT_AFTER_CHECKPOINTS");
        int kill_after = hook ? atoi(hook) : 0, done = 0;
        for (int32_t have = s->n_cached; st == KS_OK && have < n;) {
            int32_t upto = every ? (have / every + 1) * every : n;
            if (upto > n) upto = n;
            st = ks_prefill_rest(s->ctx, s->pcache, 0, s->ids, n, upto, s->logits);
            if (st != KS_OK) break;
            have = upto;
            if (upto == n) break;
            double t0 = ks_time_sec();
            int32_t nf = 0;
            if ((st = ks_prefix_cache_append_file(s->pcache, s->ctx, s->ids, upto, cache_file, &nf)) != KS_OK) {
                app_report(cmd, "writing a prompt-cache checkpoint", st);
                return 1;
            }
            s->n_checkpoints++;
            s->t_save += ks_time_sec() - t0;
            fprintf(stderr, "kvsieve run: checkpoint: %d of %d prompt tokens prefilled, %d blocks in %s (%.1f s since "
                            "the start)\n", upto, n, nf, cache_file, ks_time_sec() - s->t_submit);
            if (kill_after > 0 && ++done == kill_after) _Exit(3);
        }
    } else {
        st = ks_prefill(s->ctx, 0, s->ids, (int32_t)s->n_prompt, s->logits, NULL);
    }
    if (st != KS_OK) { app_report(cmd, "prefill", st); return 1; }
    s->t_pf = ks_time_sec() - s->t_submit;
    ks_context_stats(s->ctx, &s->s_prefill);
    ks_stats_reset(s->ctx);
    return -1;
}

/* After the answer, not before its first token: the prompt's blocks are
 * full pages, which generation never writes.  A checkpointed run appends
 * the blocks after its last checkpoint to the same file (the whole file
 * rewritten would be a second copy of a 128K prompt's KV on the disk);
 * otherwise the file is written whole and renamed over the old one. */
static int run_save_cache(app_options *o, run_state *s) {
    if (!o->cache_file) return -1;
    double t0 = ks_time_sec();
    ks_status st = s->every ? ks_prefix_cache_append_file(s->pcache, s->ctx, s->ids, (int32_t)s->n_prompt, o->cache_file,
                                                          &s->n_saved)
                            : ks_prefix_cache_save_file(s->pcache, s->ctx, s->ids, (int32_t)s->n_prompt, o->cache_file,
                                                        &s->n_saved);
    if (st != KS_OK) { app_report(o->cmd, "writing the prompt cache", st); return 1; }
    s->t_save += ks_time_sec() - t0;
    return -1;
}

static int run_generate(app_options *o, run_state *s) {
    int32_t seq0 = 0, n_done = 0;
    char piece[256];
    ks_stop_out so = {0};
    ks_status st;
    s->why = "length";
    while (n_done < o->n_gen) {
        int32_t tok = ks_sampler_sample(s->smp, s->logits);
        if (s->ttft < 0) s->ttft = ks_time_sec() - s->t_submit;
        ks_sampler_accept(s->smp, tok);
        if (!o->ignore_eos && ks_token_is_eog(s->model, tok)) { s->why = "end of generation"; break; }
        n_done++;
        size_t np = 0;
        if (ks_token_to_piece(s->model, tok, piece, sizeof piece, &np) != KS_OK) np = 0;
        if ((st = ks_stop_feed(s->stop, piece, np, &so)) != KS_OK) { app_report(o->cmd, "stop strings", st); return 1; }
        fwrite(so.text, 1, so.len, stdout);
        fflush(stdout);
        if (so.matched) { s->why = "stop string"; break; }
        if (n_done == o->n_gen) break; /* no decode for a token that will not be sampled from */
        if ((st = ks_decode(s->ctx, &seq0, &tok, 1, s->logits)) != KS_OK) { app_report(o->cmd, "decode", st); return 1; }
    }
    if (!so.matched) {
        ks_stop_flush(s->stop, &so);
        fwrite(so.text, 1, so.len, stdout);
    }
    fputc('\n', stdout);
    fflush(stdout);
    return -1;
}

static void run_report(const app_options *o, const run_state *s) {
    ks_stats sd;
    ks_context_stats(s->ctx, &sd);
    const ks_context_params *cp = &s->cp;
    double pf_s = s->s_prefill.prefill_seconds, dc_s = sd.decode_seconds;
    size_t n_prompt = s->n_prompt;
    fprintf(stderr, "\nkvsieve run: stopped by %s\n", s->why);
    fprintf(stderr, "  prompt:  %5zu tokens in %7.3f s = %8.2f tok/s\n", n_prompt, pf_s, pf_s > 0 ? n_prompt / pf_s : 0);
    if (o->cache_file)
        fprintf(stderr, "  cache:   %d prompt tokens cached, %zu computed, prompt done after %.3f s (cache read %.3f s); "
                        "%d blocks saved to %s in %.3f s (%d checkpoints)\n",
                s->n_cached, n_prompt - (size_t)s->n_cached, s->t_pf, s->t_load, s->n_saved, o->cache_file, s->t_save,
                s->n_checkpoints);
    if (s->ttft >= 0) fprintf(stderr, "  time to first token: %.3f s\n", s->ttft);
    if (sd.tokens_decoded)
        fprintf(stderr, "  decode:  %5llu tokens in %7.3f s = %8.2f tok/s, %.2f GB/s (weights %.2f + KV %.3f GB read)\n",
                (unsigned long long)sd.tokens_decoded, dc_s, sd.tokens_decoded / dc_s,
                (sd.weight_bytes_read + sd.kv_bytes_read) / dc_s / 1e9, sd.weight_bytes_read / 1e9,
                sd.kv_bytes_read / 1e9);
    if (sd.tokens_decoded && (strcmp(cp->policy, "dense") != 0 || cp->kv_offload_layers > 0))
        fprintf(stderr, "  policy:  %s budget %d: attended %.1f%% of KV entries; selection %.2f ms/token (thread time); "
                        "slow tier: %.2f MB loaded, %.2f MB stored, %llu entries loaded / %llu kept buffered, "
                        "%llu whole pages read, %llu synchronous fallbacks\n",
                cp->policy, cp->budget,
                sd.kv_entries_total ? 100.0 * sd.kv_entries_attended / sd.kv_entries_total : 100.0,
                1e3 * sd.select_seconds / sd.tokens_decoded, sd.kv_bytes_loaded / 1e6, sd.kv_bytes_stored / 1e6,
                (unsigned long long)sd.kv_entries_loaded, (unsigned long long)sd.kv_entries_hit,
                (unsigned long long)sd.kv_pages_loaded, (unsigned long long)sd.kv_sync_fallbacks);
    if (o->turnover) {
        ks_turnover t;
        ks_context_take_turnover(s->ctx, &t);
        fprintf(stderr, "  turnover: %llu entries selected over the steps compared; new to the selection %llu (%.1f%%), "
                        "new to the oracle's true top-T %llu (%.1f%%): %.2fx the oracle's\n",
                (unsigned long long)t.selected, (unsigned long long)t.policy_moved,
                t.selected ? 100.0 * t.policy_moved / t.selected : 0.0, (unsigned long long)t.oracle_moved,
                t.selected ? 100.0 * t.oracle_moved / t.selected : 0.0,
                t.oracle_moved ? (double)t.policy_moved / t.oracle_moved : 0.0);
    }
    if (cp->mem_cap > 0) {
        ks_memplan_info pl;
        ks_context_memplan(s->ctx, &pl);
        fprintf(stderr, "  memory:  cap %.2f GB: %d of %d layers offloaded at the end (%llu offload events, logged above)\n",
                cp->mem_cap / 1e9, pl.offloaded, pl.n_layer, (unsigned long long)sd.kv_offload_events);
    }
}

int cmd_run(int argc, char **argv) {
    app_options o;
    int rc = app_parse("run", argc, argv, &o);
    if (rc >= 0) return rc;
    run_state s = {0};
    if ((rc = run_prepare(&o, &s)) < 0 && (rc = run_prefill(&o, &s)) < 0 && (rc = run_generate(&o, &s)) < 0 &&
        (rc = run_save_cache(&o, &s)) < 0) {
        run_report(&o, &s);
        rc = 0;
    }
    ks_stop_destroy(s.stop);
    ks_sampler_destroy(s.smp);
    ks_prefix_cache_destroy(s.pcache); /* first: its blocks are pages of ctx's store, let go rather than copied out */
    ks_context_destroy(s.ctx);
    ks_model_destroy(s.model);
    free(s.ids);
    free(s.logits);
    free(s.chat_buf);
    free(s.file_text);
    return rc;
}
