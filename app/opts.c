/*
 * opts.c — the option table of every kvsieve subcommand, its parse loop and
 * its generated --help, and the routines that turn the parsed options into a
 * model and a context (what run, bench, eval, perplexity, plan and serve
 * share).
 *
 * Why a table rather than a loop per command: six hand-written loops of
 * strcmp chains had drifted apart (the same flag with different ranges,
 * messages and help in each), and a flag added to one command's loop was
 * easily missed in its usage text.  Here a row is the whole truth about a
 * flag; defaults are strings parsed by the same code as the user's value, so
 * a default cannot be out of the range the row checks.
 */
#include "opts.h"

#include "args.h"
#include "commands.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

typedef enum app_opt_kind {
    OPT_FLAG,      /* no value: the bool field becomes true (or parse(o, flag, NULL) runs) */
    OPT_STR,       /* const char * (argv's own string) */
    OPT_LONG,      /* long in [lo, hi] */
    OPT_I32,       /* int32_t in [lo, hi] */
    OPT_U64_LONG,  /* uint64_t, read as a long in [lo, hi] */
    OPT_UINT,      /* uint64_t in [lo, hi], unsigned digits only ("bad value" on error) */
    OPT_FLOAT,     /* float in [lo, hi] */
    OPT_LIST,      /* long[] in [lo, hi], at most cap, count in an int field */
    OPT_KV_TYPE,   /* ks_kv_type: f16 | q8 */
    OPT_SIZE,      /* double bytes: 4G, 512M, ... */
    OPT_CUSTOM,    /* parse(o, flag, value) */
    OPT_POLICY,    /* the policy flags group (policy_opts.c); never matched by name */
} app_opt_kind;

typedef struct app_opt {
    const char *name, *alias;  /* "--parallel", "-np" */
    app_opt_kind kind;
    unsigned cmds;             /* APP_RUN | ... */
    size_t off, count_off;     /* offsetof(app_options, field) (and of a list's count) */
    double lo, hi;
    int cap;                   /* lists: at most this many values */
    const char *def;           /* default, parsed like a value at start (NULL: zero / init) */
    const char *meta, *help;   /* "N", help text ('\n' continues the line) */
    bool (*parse)(app_options *o, const char *flag, const char *value);
} app_opt;

/* custom parsers, defined beside their commands */
bool app_parse_stop(app_options *o, const char *flag, const char *v);
bool app_parse_verbose(app_options *o, const char *flag, const char *v);
bool app_parse_offload(app_options *o, const char *flag, const char *v);
bool app_parse_tasks(app_options *o, const char *flag, const char *v);
bool app_parse_depths(app_options *o, const char *flag, const char *v);
bool app_parse_ref_simd(app_options *o, const char *flag, const char *v);
bool app_parse_dlm(app_options *o, const char *flag, const char *v);

static bool app_parse_expert_pack(app_options *o, const char *flag, const char *v) {
    static const char *const names[] = {"auto", "on", "off"}; /* ks_expert_pack order */
    for (int i = 0; i < 3; i++)
        if (!strcmp(v, names[i])) {
            o->expert_pack = (ks_expert_pack)i;
            return true;
        }
    fprintf(stderr, "kvsieve %s: %s must be auto, on or off, got '%s'\n", o->cmd, flag, v);
    return false;
}

#define F(field) offsetof(app_options, field)
#define MODELS (APP_RUN | APP_BENCH | APP_EVAL | APP_PPL | APP_PLAN | APP_SERVE | APP_TOKENIZE | APP_INFO)
#define THREADED (APP_RUN | APP_BENCH | APP_EVAL | APP_PPL | APP_PLAN | APP_SERVE)
#define KV_TYPED (APP_RUN | APP_BENCH | APP_EVAL | APP_PLAN | APP_SERVE | APP_PPL)
#define POLICIED (APP_RUN | APP_BENCH | APP_EVAL | APP_PPL | APP_PLAN | APP_SERVE)

static const app_opt g_opts[] = {
    /* name, alias, kind, commands, field, count, lo, hi, cap, default, meta, help, parse */
    {"-m", 0, OPT_STR, MODELS, F(model_path), 0, 0, 0, 0, 0, "PATH", "model (default: $KVSIEVE_MODEL or the bundled model)", 0},
    {"-p", 0, OPT_STR, APP_RUN | APP_TOKENIZE, F(prompt), 0, 0, 0, 0, 0, "TEXT", "prompt text", 0},
    {"-f", 0, OPT_STR, APP_RUN | APP_TOKENIZE | APP_PPL, F(file), 0, 0, 0, 0, 0, "FILE", "read the text from a file", 0},
    {"-n", 0, OPT_LONG, APP_RUN, F(n_gen), 0, 0, 1 << 24, 0, "128", "N", "tokens to generate (default 128)", 0},
    {"-c", 0, OPT_LONG, APP_RUN, F(n_ctx), 0, 1, 1 << 24, 0, 0, "N",
     "context length (default: prompt + n, at least 512, capped by the model)", 0},
    {"-c", 0, OPT_LONG, APP_SERVE, F(n_ctx), 0, 8, 1 << 24, 0, 0, "N",
     "context per sequence (default: min(trained context, 4096))", 0},
    {"-c", 0, OPT_LONG, APP_PPL, F(window), 0, 2, 1 << 20, 0, "512", "WINDOW", "tokens per scored window (default 512)", 0},
    {"-t", 0, OPT_LONG, THREADED, F(n_threads), 0, 1, 1024, 0, 0, "N", "threads (default: all cores)", 0},
    {"--chat", 0, OPT_FLAG, APP_RUN, F(chat), 0, 0, 0, 0, 0, 0, "wrap the prompt in the model's chat template", 0},
    {"--system", 0, OPT_STR, APP_RUN, F(system), 0, 0, 0, 0, 0, "TEXT", "system prompt for --chat", 0},
    {"--temp", 0, OPT_FLOAT, APP_RUN, F(sampler.temperature), 0, 0, 100, 0, 0, "X", "temperature, 0 = greedy (default 0.8)", 0},
    {"--top-k", 0, OPT_I32, APP_RUN, F(sampler.top_k), 0, 0, 1 << 30, 0, 0, "N", "(default 40, 0 = off)", 0},
    {"--top-p", 0, OPT_FLOAT, APP_RUN, F(sampler.top_p), 0, 1e-6, 1, 0, 0, "X", "(default 0.95, 1 = off)", 0},
    {"--min-p", 0, OPT_FLOAT, APP_RUN, F(sampler.min_p), 0, 0, 0.999999, 0, 0, "X", "(default 0.05, 0 = off)", 0},
    {"--repeat-penalty", 0, OPT_FLOAT, APP_RUN, F(sampler.repeat_penalty), 0, 1e-3, 100, 0, 0, "X", "(default 1.0 = off)", 0},
    {"--repeat-last-n", 0, OPT_I32, APP_RUN, F(sampler.repeat_last_n), 0, 0, 1 << 20, 0, 0, "N", "(default 64)", 0},
    {"--seed", 0, OPT_U64_LONG, APP_RUN, F(sampler.seed), 0, 0, 9223372036854775807.0, 0, 0, "N", "sampling seed (default 42)", 0},
    {"--stop", 0, OPT_CUSTOM, APP_RUN, 0, 0, 0, 0, 0, 0, "TEXT", "stop when TEXT is generated (repeatable)", app_parse_stop},
    {"--ignore-eos", 0, OPT_FLAG, APP_RUN, F(ignore_eos), 0, 0, 0, 0, 0, 0, "keep generating past end-of-generation tokens", 0},
    {"--kv-type", 0, OPT_KV_TYPE, KV_TYPED, F(kv_type), 0, 0, 0, 0, 0, "f16|q8", "KV cache element type (default f16)", 0},
    {"--batch", 0, OPT_LONG, APP_RUN | APP_SERVE, F(n_batch), 0, 1, 65536, 0, 0, "N", "prefill chunk size in tokens (default 256; run: 1024 for a model with experts)", 0},
    {"--prompt-cache", 0, OPT_STR, APP_RUN, F(cache_file), 0, 0, 0, 0, 0, "FILE",
     "start from the longest prefix of the prompt cached in FILE, and save the\n"
     "prompt's KV there after prefill (exact: the same output as without it)", 0},
    {"--prompt-cache-every", 0, OPT_LONG, APP_RUN, F(cache_every), 0, -1, 1 << 30, 0, "-1", "N",
     "with --prompt-cache: also append the prompt's KV computed so far to FILE every\n"
     "N prompt tokens, so that a killed run restarted with the same command resumes\n"
     "from the last checkpoint (default: 8192 for prompts over 16384 tokens, else\n"
     "only after the answer; 0 = only after the answer)", 0},
    {"--prefill-policy", 0, OPT_STR, APP_RUN | APP_BENCH | APP_EVAL | APP_SERVE, F(prefill_policy), 0, 0, 0, 0, 0, "SPEC",
     "prompt attention: dense (default, exact) or quest[:budget=N,sink=N,window=N,dense=N]\n"
     "(opt-in sparse prefill: each block of 16 rows attends its sinks, a local window\n"
     "and the cached pages with the highest Quest bounds; defaults 2048, 32, 512, 2;\n"
     "bench prefills dense and SPEC side by side, eval gives SPEC to the compared\n"
     "configurations and keeps the reference dense; serve: each request's unless it\n"
     "sends kvsieve.prefill_policy; a prompt cache keys its KV by SPEC)", 0},
    {"--no-bos", 0, OPT_FLAG, APP_RUN, F(no_bos), 0, 0, 0, 0, 0, 0, "do not prepend BOS", 0},
    {"--turnover", 0, OPT_FLAG, APP_RUN, F(turnover), 0, 0, 0, 0, 0, 0,
     "report the selection's turnover per step (entries new to it, what elastic loading\n"
     "copies) against an oracle's: the true top-T of dense attention at the same size\n"
     "(a dense pass per selection: slow; resident layers only)", 0},
    {"--verbose", 0, OPT_FLAG, APP_RUN, 0, 0, 0, 0, 0, 0, 0, "log level debug", app_parse_verbose},
    /* tokenize */
    {"--json", 0, OPT_FLAG, APP_TOKENIZE | APP_BENCH | APP_EVAL, F(json), 0, 0, 0, 0, 0, 0, "JSON output", 0},
    {"--bos", 0, OPT_FLAG, APP_TOKENIZE, F(bos), 0, 0, 0, 0, 0, 0, "prepend BOS if the vocabulary asks for it", 0},
    {"--special", 0, OPT_FLAG, APP_TOKENIZE, F(special), 0, 0, 0, 0, 0, 0, "parse control-token text such as <|eot_id|> into its id", 0},
    {"--pieces", 0, OPT_FLAG, APP_TOKENIZE, F(pieces), 0, 0, 0, 0, 0, 0, "print each id with its decoded text", 0},
    /* perplexity */
    {"--windows", 0, OPT_LONG, APP_PPL, F(max_windows), 0, 1, 1 << 20, 0, 0, "N", "score at most N windows", 0},
    {"--decode-from", 0, OPT_LONG, APP_PPL, F(decode_from), 0, 1, 1 << 24, 0, 0, "N",
     "prefill N tokens of each window, decode the rest (default: half a window with a policy)", 0},
    {"--score-second-half", 0, OPT_FLAG, APP_PPL, F(second_half), 0, 0, 0, 0, 0, 0,
     "score only the second half of each window of -c tokens, as llama.cpp's\n"
     "llama-perplexity does (whole windows only, BOS first): comparable figures", 0},
    /* bench */
    {"--depth", 0, OPT_LIST, APP_BENCH, F(depths), F(n_depths), 0, 1 << 22, 16, "0", "0,4096,...", "KV depths to decode at", 0},
    {"--batch", 0, OPT_LIST, APP_BENCH, F(batches), F(n_batches), 1, 256, 16, "1", "1,4,16", "sequences decoded together", 0},
    {"--n-gen", 0, OPT_LONG, APP_BENCH, F(bench_gen), 0, 1, 100000, 0, "16", "N", "timed decode steps per row (default 16)", 0},
    {"--n-prompt", 0, OPT_LIST, APP_BENCH, F(prompts), F(n_prompts), 1, 1 << 20, 16, "256", "256,4096",
     "prompt lengths to prefill (each: tok/s, GEMM and attention shares of the time,\n"
     "GEMM multiply-adds/s as a share of the measured int8 peak)", 0},
    {"--prefill-reps", 0, OPT_I32, APP_BENCH, F(prefill_reps), 0, 1, APP_PREFILL_REPS_MAX, 0, "1", "N",
     "prefill each length N times on fresh contexts, then print the median\n"
     "and range of tok/s and of the GEMM's share of the peak (default 1)", 0},
    {"--prefill-depth", 0, OPT_LONG, APP_BENCH, F(prefill_depth), 0, 0, 1 << 24, 0, 0, "D",
     "prefill each --n-prompt after D tokens of synthetic KV (a follow-up question\n"
     "against a cached document: its rows attend all D; default 0)", 0},
    {"--no-prefill", 0, OPT_FLAG, APP_BENCH, F(no_prefill), 0, 0, 0, 0, 0, 0, "skip the prefill rows", 0},
    {"--no-mmap", 0, OPT_FLAG, APP_BENCH, F(no_mmap), 0, 0, 0, 0, 0, 0,
     "read the weights into huge-page memory instead of mapping the file", 0},
    {"--no-repack", 0, OPT_FLAG, APP_BENCH, F(no_repack), 0, 0, 0, 0, 0, 0, "keep the file's weight layout (no packed prefill GEMM)", 0},
    {"--expert-pack", 0, OPT_CUSTOM, THREADED, 0, 0, 0, 0, 0, 0, "auto|on|off",
     "MoE K-quant experts in eight-row groups (default auto: when read into memory,\n"
     "or when the resident copy of a mapped file's experts takes at most half the available memory)",
     app_parse_expert_pack},
    {"--offload", 0, OPT_CUSTOM, APP_BENCH, 0, 0, 0, 0, 0, "none", "none,all,adaptive",
     "slow-tier modes to compare: nothing offloaded, every layer\n"
     "offloaded, or SpeContext's adaptive manager under --mem-cap (default none)", app_parse_offload},
    /* eval */
    {"--task", 0, OPT_CUSTOM, APP_EVAL, 0, 0, 0, 0, 0, 0, "LIST",
     "passkey,multikey,multivalue,vartrack,longgen or all (default all)", app_parse_tasks},
    {"--lengths", 0, OPT_LIST, APP_EVAL, F(lengths), F(n_lengths), 16, 1 << 24, APP_LIST_CAP, "1024,4096,8192", "LIST",
     "instance lengths, every token counted (prompt and answer budget); lengths above\n"
     "the model's trained context are skipped (default 1024,4096,8192)", 0},
    {"--depths", 0, OPT_CUSTOM, APP_EVAL, 0, 0, 0, 0, 0, "0,0.25,0.5,0.75,1", "LIST",
     "evidence depths in [0, 1] (default 0,0.25,0.5,0.75,1)", app_parse_depths},
    {"--samples", 0, OPT_LONG, APP_EVAL, F(samples), 0, 1, 100000, 0, "4", "N", "instances per cell (default 4)", 0},
    {"--seed", 0, OPT_LONG, APP_EVAL, F(eval_seed), 0, 0, 0x7fffffffL, 0, "1", "S", "seed of the instances (default 1)", 0},
    {"--plot", 0, OPT_STR, APP_EVAL, F(plot), 0, 0, 0, 0, 0, "FILE.svg", "heat maps and the accuracy-vs-budget chart", 0},
    {"--calibrate", 0, OPT_FLAG, APP_EVAL, F(calibrate), 0, 0, 0, 0, 0, 0,
     "write CHESS's thresholds (99th percentiles of the dense runs' per-page mean\n"
     "entropy and varentropy, pages of --page tokens) to MODEL.gguf.chess.json, which\n"
     "run/bench/eval then pass to chess", 0},
    {"--share-prefill", 0, OPT_FLAG, APP_EVAL, F(share_prefill), 0, 0, 0, 0, 0, 0,
     "compute each instance's prompt once per prefill setting: the configurations\n"
     "(and their teacher-forced runs) restore it through a prefix cache in RAM, byte\n"
     "for byte, so every figure but tok/s is the same; off for sliding-window models\n"
     "and where the prompt's KV would not fit beside the contexts", 0},
    {"--show", 0, OPT_FLAG, APP_EVAL, F(show), 0, 0, 0, 0, 0, 0,
     "print each instance's question, expected and dense answer to stderr (a failing\n"
     "task's errors, read one by one)", 0},
    {"--dump-prompts", 0, OPT_STR, APP_EVAL, F(dump_dir), 0, 0, 0, 0, 0, "DIR",
     "write each instance's prompt to DIR/TASK-LENGTH-DEPTH-SAMPLE.txt (DIR\n"
     "must exist), e.g. for tools/needle_study.py --prompt", 0},
    {"--reference-simd", 0, OPT_CUSTOM, APP_EVAL, 0, 0, 0, 0, 0, 0, "scalar|avx2|avx512|neon|dotprod|i8mm",
     "run the dense reference on other kernels (another summation order); with dense\n"
     "in --policy this measures the agreement two correct f16 computations reach, the\n"
     "noise floor of the agreement and KL columns", app_parse_ref_simd},
    /* plan */
    {"--requests", 0, OPT_LONG, APP_PLAN, F(requests), 0, 1, 4096, 0, "1", "R", "sequences the plan holds (default 1)", 0},
    {"--ctx", 0, OPT_LONG, APP_PLAN, F(ctx_at), 0, 1, 1 << 30, 0, 0, "S", "also say how the layers split at length S", 0},
    {"--dlm", 0, OPT_CUSTOM, APP_PLAN, 0, 0, 0, 0, 0, 0, "DIR", "short for --policy spec --policy-arg dlm=DIR", app_parse_dlm},
    /* serve */
    {"--host", 0, OPT_STR, APP_SERVE, F(host), 0, 0, 0, 0, "127.0.0.1", "ADDR",
     "address to bind (default 127.0.0.1; numeric, or localhost)", 0},
    {"--port", 0, OPT_LONG, APP_SERVE, F(port), 0, 0, 65535, 0, "8080", "N", "TCP port (default 8080; 0: any free port, printed at start)", 0},
    {"--parallel", "-np", OPT_LONG, APP_SERVE, F(parallel), 0, 1, 256, 0, "4", "N",
     "sequences decoded together per policy configuration (default 4)", 0},
    {"--max-queue", 0, OPT_LONG, APP_SERVE, F(max_queue), 0, 0, 1 << 20, 0, "64", "N",
     "requests waiting for a slot before 429 (default 64)", 0},
    {"--max-groups", 0, OPT_LONG, APP_SERVE, F(max_groups), 0, 1, 16, 0, 0, "N",
     "contexts (KV page sizes) alive at once (default 4; 1 with --mem-cap)", 0},
    {"--api-key", 0, OPT_STR, APP_SERVE, F(api_key), 0, 0, 0, 0, 0, "KEY",
     "require 'Authorization: Bearer KEY' (default: $KVSIEVE_API_KEY, else none)", 0},
    {"--alias", 0, OPT_STR, APP_SERVE, F(alias), 0, 0, 0, 0, 0, "NAME", "model name reported by /v1/models (default: the file name)", 0},
    {"--shutdown-grace", 0, OPT_FLOAT, APP_SERVE, F(grace), 0, 0, 3600, 0, "10", "S",
     "seconds running requests may finish after SIGINT/SIGTERM (default 10)", 0},
    {"--cache-ram", 0, OPT_SIZE, APP_SERVE, F(cache_ram), 0, 0, 0, 0, "1G", "SIZE",
     "prefix cache in RAM (default 1G; 0: no prefix cache); under --mem-cap it\n"
     "only holds what the running requests leave", 0},
    {"--cache-dir", 0, OPT_STR, APP_SERVE, F(cache_dir), 0, 0, 0, 0, 0, "DIR",
     "also keep cached prefix blocks in DIR (written behind the requests; a\n"
     "restart or another replica with the same model hits them)", 0},
    {"--cache-disk", 0, OPT_SIZE, APP_SERVE, F(cache_disk), 0, 0, 0, 0, "8G", "SIZE", "cap of the blocks in --cache-dir (default 8G)", 0},
    /* info */
    {"--kv", 0, OPT_FLAG, APP_INFO, F(show_kv), 0, 0, 0, 0, 0, 0, "list the metadata keys", 0},
    {"--tensors", 0, OPT_FLAG, APP_INFO, F(show_tensors), 0, 0, 0, 0, 0, 0, "list the tensors", 0},
    /* gen-model */
    {"--shape", 0, OPT_STR, APP_GEN, F(shape), 0, 0, 0, 0, 0, "NAME", "model shape (listed below)", 0},
    {"--type", 0, OPT_STR, APP_GEN, F(type), 0, 0, 0, 0, 0, "TYPE", "q8_0 | q6_k | q5_k_m | q5_k | q5_1 | q5_0 | q4_k_m | q4_k | q4_1 | q4_0 | iq4_xs | iq4_nl | q3_k | q2_k | mxfp4 (experts; the rest q8_0) | f16 | bf16 | f32", 0},
    {"--vocab-from", 0, OPT_STR, APP_GEN, F(vocab_from), 0, 0, 0, 0, 0, "VOCAB.gguf", "tokenizer.* keys and vocabulary size", 0},
    {"--out", 0, OPT_STR, APP_GEN, F(out), 0, 0, 0, 0, 0, "FILE", "the GGUF to write", 0},
    {"--seed", 0, OPT_UINT, APP_GEN, F(gen_seed), 0, 0, 18446744073709551615.0, 0, "42", "N", "weights seed (default 42)", 0},
    {"--layers", 0, OPT_UINT, APP_GEN, F(gen_layers), 0, 1, 4096, 0, 0, "N", "override the layer count (small test files)", 0},
    {"--ctx", 0, OPT_UINT, APP_GEN, F(gen_ctx), 0, 1, 2147483647.0, 0, 0, "N", "override the training context length", 0},
    {"--threads", 0, OPT_UINT, APP_GEN, F(gen_threads), 0, 1, 1024, 0, 0, "N", "threads writing the file", 0},
    {"--dlm-out", 0, OPT_STR, APP_GEN, F(dlm_out), 0, 0, 0, 0, 0, "DIR", "also write a random EAGLE-3 retrieval head", 0},
    /* the policy flags: parsed and documented by policy_opts.c */
    {"(policy flags)", 0, OPT_POLICY, POLICIED, 0, 0, 0, 0, 0, 0, 0, 0, 0},
};

/* What --help says around the table's rows, and how a command parses. */
typedef struct app_command {
    const char *name;
    unsigned bit;
    bool policy_lists;          /* --policy / --budget take comma lists */
    bool positional;            /* a bare argument is the model path (info) */
    const char *synopsis, *epilogue;
} app_command;

static const app_command g_cmds[] = {
    {"run", APP_RUN, false, false, "kvsieve run [-m MODEL.gguf] (-p PROMPT | -f FILE) [options]", 0},
    {"bench", APP_BENCH, true, false,
     "kvsieve bench [-m MODEL.gguf] [--depth 0,4096,...] [--batch 1,4,16] [-t THREADS]\n"
     "                     [--n-gen 16] [--n-prompt 256,4096] [--prefill-reps 1] [--no-prefill] [--kv-type f16|q8] [--no-mmap] [--no-repack] [--json]", 0},
    {"eval", APP_EVAL, true, false,
     "kvsieve eval [-m MODEL.gguf] [--task LIST|all] [--lengths 1024,4096,8192] [--depths 0,0.25,...]\n"
     "                    [--samples N] [--seed S] [-t THREADS] [--json] [--plot FILE.svg] [--calibrate] [--show]\n"
     "                    [--dump-prompts DIR] [--share-prefill] [--policy dense,quest,...] [--budget 3%,6%,12%]\n"
     "                    [--kv-type f16|q8] [--reference-simd scalar|avx2|avx512|neon|dotprod|i8mm] [policy flags]",
     "Dense always runs as the reference.  --kv-type q8: the compared configurations keep 8-bit KV\n"
     "(Q8_0 rows) while the dense reference stays f16; list dense in --policy to compare dense on q8 with it.\n"},
    {"perplexity", APP_PPL, false, false,
     "kvsieve perplexity [-m MODEL.gguf] -f TEXT [-c WINDOW (512)] [-t THREADS] [--windows N]\n"
     "                          [--score-second-half] [--decode-from N] [--kv-type f16|q8] [policy flags]", 0},
    {"plan", APP_PLAN, false, false,
     "kvsieve plan [-m MODEL.gguf] [--dlm DIR] --mem-cap SIZE --requests R --budget B [--ctx S]\n"
     "                    [--kv-type f16|q8] [-t THREADS] [policy flags]", 0},
    {"serve", APP_SERVE, false, false, "kvsieve serve [-m MODEL.gguf] [options]",
     0},
    {"tokenize", APP_TOKENIZE, false, false,
     "kvsieve tokenize [-m MODEL.gguf] (-p TEXT | -f FILE) [--json] [--bos] [--special] [--pieces]", 0},
    {"info", APP_INFO, false, true, "kvsieve info [-m] FILE.gguf|EAGLE3_DIR [--kv] [--tensors]", 0},
    {"gen-model", APP_GEN, false, false,
     "kvsieve gen-model --shape NAME --type TYPE --vocab-from VOCAB.gguf --out FILE\n"
     "                         [--seed N] [--layers N] [--ctx N] [--threads N] [--dlm-out DIR]\n\n"
     "Writes a GGUF with deterministic pseudo-random weights of a real model shape\n"
     "(same arguments -> byte-identical file).  tokenizer.* keys are copied from\n"
     "VOCAB.gguf and its token count is the vocabulary size.", 0},
};

static const app_command *find_command(const char *name) {
    for (size_t i = 0; i < sizeof g_cmds / sizeof g_cmds[0]; i++)
        if (!strcmp(g_cmds[i].name, name)) return &g_cmds[i];
    return NULL;
}

void app_gen_model_shapes(FILE *f); /* cmd_gen_model.c: the shapes, after gen-model's options */

static void print_row(FILE *f, const app_opt *r) {
    char left[64];
    snprintf(left, sizeof left, "%s%s%s%s%s", r->name, r->alias ? ", " : "", r->alias ? r->alias : "",
             r->meta ? " " : "", r->meta ? r->meta : "");
    if (strlen(left) > 20) fprintf(f, "  %s\n  %-20s ", left, ""); /* a long left column: help on the next line */
    else fprintf(f, "  %-20s ", left);
    for (const char *h = r->help; *h; h++) {
        fputc(*h, f);
        if (*h == '\n') fprintf(f, "  %-20s ", "");
    }
    fputc('\n', f);
}

void app_usage(const char *cmd, FILE *f) {
    const app_command *c = find_command(cmd);
    if (!c) return;
    fprintf(f, "usage: %s\n", c->synopsis);
    for (size_t i = 0; i < sizeof g_opts / sizeof g_opts[0]; i++) {
        const app_opt *r = &g_opts[i];
        if (!(r->cmds & c->bit)) continue;
        if (r->kind == OPT_POLICY) {
            if (c->bit == APP_SERVE) fprintf(f, "Policy flags are the defaults of requests without a \"kvsieve\" object (docs/SERVER.md):\n");
            fputs(app_policy_usage(), f);
        } else {
            print_row(f, r);
        }
    }
    if (c->epilogue) fputs(c->epilogue, f);
    if (c->bit == APP_GEN) app_gen_model_shapes(f);
}

/* "bad value" for gen-model's unsigned numbers: digits only, within [lo, hi]. */
static bool parse_uint(const char *s, double lo, double hi, uint64_t *out) {
    if (!s || !*s || *s < '0' || *s > '9') return false;
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || (double)v > hi || (double)v < lo) return false;
    *out = v;
    return true;
}

/* Store value v of row r into o; false (message printed) on a bad value. */
static bool store(const app_opt *r, app_options *o, const char *v) {
    const char *cmd = o->cmd, *a = r->name;
    void *dst = (char *)o + r->off;
    long lv;
    switch (r->kind) {
    case OPT_FLAG:
        if (r->parse) return r->parse(o, a, NULL);
        *(bool *)dst = true;
        return true;
    case OPT_STR: *(const char **)dst = v; return true;
    case OPT_LONG: return arg_long(cmd, a, v, (long)r->lo, (long)r->hi, (long *)dst);
    case OPT_I32:
        if (!arg_long(cmd, a, v, (long)r->lo, (long)r->hi, &lv)) return false;
        *(int32_t *)dst = (int32_t)lv;
        return true;
    case OPT_U64_LONG:
        if (!arg_long(cmd, a, v, (long)r->lo, 0x7fffffffffffffffL, &lv)) return false;
        *(uint64_t *)dst = (uint64_t)lv;
        return true;
    case OPT_UINT:
        if (parse_uint(v, r->lo, r->hi, (uint64_t *)dst)) return true;
        fprintf(stderr, "kvsieve %s: bad value '%s' for %s\n", cmd, v, a);
        return false;
    case OPT_FLOAT: return arg_float(cmd, a, v, r->lo, r->hi, (float *)dst);
    case OPT_LIST: {
        int n = arg_long_list(cmd, a, v, (long)r->lo, (long)r->hi, (long *)dst, r->cap);
        if (n < 0) return false;
        *(int *)((char *)o + r->count_off) = n;
        return true;
    }
    case OPT_KV_TYPE: return arg_kv_type(cmd, v, (ks_kv_type *)dst);
    case OPT_SIZE:
        if (app_parse_size(v, (double *)dst)) return true;
        fprintf(stderr, "kvsieve %s: %s '%s': expected a size such as 512M or 4G\n", cmd, a, v);
        return false;
    case OPT_CUSTOM: return r->parse(o, a, v);
    case OPT_POLICY: return false;
    }
    return false;
}

static bool takes_value(const app_opt *r) { return r->kind != OPT_FLAG; }

static const app_opt *find_opt(unsigned bit, const char *a) {
    for (size_t i = 0; i < sizeof g_opts / sizeof g_opts[0]; i++) {
        const app_opt *r = &g_opts[i];
        if ((r->cmds & bit) && r->kind != OPT_POLICY && (!strcmp(a, r->name) || (r->alias && !strcmp(a, r->alias))))
            return r;
    }
    return NULL;
}

/* Defaults: the rows' own, as if given first; the rest zero (or the library's defaults). */
static void set_defaults(const app_command *c, app_options *o) {
    memset(o, 0, sizeof *o);
    o->cmd = c->name;
    o->cmd_bit = c->bit;
    o->kv_type = KS_KV_F16;
    o->sampler = ks_sampler_default_params();
    o->ref_simd = -1;
    app_policy_opts_init(&o->po);
    for (size_t i = 0; i < sizeof g_opts / sizeof g_opts[0]; i++) {
        const app_opt *r = &g_opts[i];
        if ((r->cmds & c->bit) && r->def && !store(r, o, r->def)) abort(); /* a default the row refuses: a bug */
    }
}

int app_parse(const char *cmd, int argc, char **argv, app_options *o) {
    const app_command *c = find_command(cmd);
    set_defaults(c, o);
    bool policied = false;
    for (size_t i = 0; i < sizeof g_opts / sizeof g_opts[0]; i++)
        if (g_opts[i].kind == OPT_POLICY && (g_opts[i].cmds & c->bit)) policied = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            app_usage(cmd, stdout);
            return 0;
        }
        if (policied) {
            int pr = app_policy_opt(cmd, argc, argv, &i, &o->po, c->policy_lists);
            if (pr < 0) return 2;
            if (pr > 0) continue;
        }
        const app_opt *r = find_opt(c->bit, a);
        if (!r && c->positional && a[0] != '-' && !o->model_path) {
            o->model_path = a;
            continue;
        }
        if (!r) {
            fprintf(stderr, "kvsieve %s: unknown option '%s' (kvsieve %s --help)\n", cmd, a, cmd);
            return 2;
        }
        const char *v = NULL;
        if (takes_value(r) && !(v = arg_value(cmd, argc, argv, &i))) return 2;
        if (!store(r, o, v)) return 2;
    }
    return -1;
}

int app_resolve_model(app_options *o, bool calibrate) {
    if (!o->model_path) o->model_path = app_default_model();
    o->po.model_path = o->model_path;
    if (!o->model_path) {
        fprintf(stderr, "kvsieve %s: no model given (-m) and no bundled model found (set KVSIEVE_MODEL)\n", o->cmd);
        return 2;
    }
    if (calibrate && !app_policy_calibration(&o->po, o->cmd, o->model_path)) return 2;
    return -1;
}

bool app_load_model(const app_options *o, ks_model_params mp, ks_model **out) {
    mp.expert_pack = o->expert_pack;
    ks_status st = ks_model_load(o->model_path, mp, out);
    if (st != KS_OK) app_report(o->cmd, mp.vocab_only ? "loading the vocabulary" : "loading the model", st);
    return st == KS_OK;
}

ks_context_params app_context_params(app_options *o, int pi, int32_t budget, int32_t n_ctx, bool room) {
    ks_context_params cp = ks_context_default_params();
    cp.n_ctx = n_ctx;
    if (o->n_threads) cp.n_threads = (int32_t)o->n_threads;
    if (o->n_batch) cp.n_batch = (int32_t)o->n_batch;
    cp.kv_type = o->kv_type;
    cp.prefill_policy = o->prefill_policy;
    app_policy_apply(&o->po, pi, budget, &cp);
    if (room) cp.n_ctx += ks_policy_prefill_room(cp.policy, cp.policy_args); /* e.g. DapQ's pseudo tokens */
    return cp;
}

bool app_create_context(const app_options *o, const ks_model *m, ks_context_params cp, const char *what,
                        ks_context **out) {
    ks_status st = ks_context_create(m, cp, out);
    if (st != KS_OK) app_report(o->cmd, what, st);
    return st == KS_OK;
}
