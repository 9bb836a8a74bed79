/*
 * cmd_serve.c — `kvsieve serve`: the OpenAI-compatible HTTP server.
 *
 * The command wires three things together: the model, the scheduler
 * (src/sched: continuous batching, one context per policy configuration)
 * and the HTTP server (src/server).  The policy flags every decoding command
 * takes are the defaults for requests that do not name their own in the
 * `kvsieve` extension object.
 *
 * Signals: SIGINT and SIGTERM are blocked in every thread and taken here
 * with sigwait, so shutdown runs in ordinary code, not in a handler.  The
 * first one stops admission (queued requests get 503, /health turns 503),
 * lets running requests finish for --shutdown-grace seconds and then ends
 * them with an error their clients see; a second signal ends them at once.
 * Then the HTTP threads are joined and everything is freed.
 */
#define _GNU_SOURCE
#include "args.h"
#include "commands.h"
#include "kvsieve.h"
#include "policy_opts.h"
#include "sched/sched.h"
#include "server/server.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: kvsieve serve [-m MODEL.gguf] [options]\n"
            "  -m PATH              model (default: $KVSIEVE_MODEL or the bundled model)\n"
            "  --host ADDR          address to bind (default 127.0.0.1; numeric, or localhost)\n"
            "  --port N             TCP port (default 8080; 0: any free port, printed at start)\n"
            "  --parallel N         sequences decoded together per policy configuration (default 4)\n"
            "  -c N                 context per sequence (default: min(trained context, 4096))\n"
            "  -t N                 engine threads (default: all cores)\n"
            "  --batch N            prefill chunk in tokens (default 256)\n"
            "  --kv-type f16|q8     KV cache element type (default f16)\n"
            "  --max-queue N        requests waiting for a slot before 429 (default 64)\n"
            "  --max-groups N       contexts (KV page sizes) alive at once (default 4; 1 with --mem-cap)\n"
            "  --api-key KEY        require 'Authorization: Bearer KEY' (default: $KVSIEVE_API_KEY, else none)\n"
            "  --alias NAME         model name reported by /v1/models (default: the file name)\n"
            "  --shutdown-grace S   seconds running requests may finish after SIGINT/SIGTERM (default 10)\n"
            "  --cache-ram SIZE     prefix cache in RAM (default 1G; 0: no prefix cache); under --mem-cap it\n"
            "                       only holds what the running requests leave\n"
            "  --cache-dir DIR      also keep cached prefix blocks in DIR (written behind the requests; a\n"
            "                       restart or another replica with the same model hits them)\n"
            "  --cache-disk SIZE    cap of the blocks in --cache-dir (default 8G)\n"
            "Policy flags are the defaults of requests without a \"kvsieve\" object (docs/SERVER.md):\n"
            "%s",
            app_policy_usage());
}

int cmd_serve(int argc, char **argv) {
    const char *cmd = "serve", *model_path = NULL, *host = "127.0.0.1", *api_key = getenv("KVSIEVE_API_KEY");
    const char *alias = NULL;
    long port = 8080, parallel = 4, n_ctx = 0, n_threads = 0, n_batch = 256, max_queue = 64, max_groups = 0;
    float grace = 10;
    double cache_ram = 1e9, cache_disk = 8e9;
    const char *cache_dir = NULL;
    ks_kv_type kv_type = KS_KV_F16;
    app_policy_opts po;
    app_policy_opts_init(&po);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int pr = app_policy_opt(cmd, argc, argv, &i, &po, false);
        if (pr < 0) return 2;
        if (pr > 0) continue;
#define VAL() do { if (!(v = arg_value(cmd, argc, argv, &i))) return 2; } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "-m")) { VAL(); model_path = v; }
        else if (!strcmp(a, "--host")) { VAL(); host = v; }
        else if (!strcmp(a, "--port")) { VAL(); if (!arg_long(cmd, a, v, 0, 65535, &port)) return 2; }
        else if (!strcmp(a, "--parallel") || !strcmp(a, "-np")) { VAL(); if (!arg_long(cmd, a, v, 1, 256, &parallel)) return 2; }
        else if (!strcmp(a, "-c")) { VAL(); if (!arg_long(cmd, a, v, 8, 1 << 24, &n_ctx)) return 2; }
        else if (!strcmp(a, "-t")) { VAL(); if (!arg_long(cmd, a, v, 1, 1024, &n_threads)) return 2; }
        else if (!strcmp(a, "--batch")) { VAL(); if (!arg_long(cmd, a, v, 1, 65536, &n_batch)) return 2; }
        else if (!strcmp(a, "--max-queue")) { VAL(); if (!arg_long(cmd, a, v, 0, 1 << 20, &max_queue)) return 2; }
        else if (!strcmp(a, "--max-groups")) { VAL(); if (!arg_long(cmd, a, v, 1, 16, &max_groups)) return 2; }
        else if (!strcmp(a, "--api-key")) { VAL(); api_key = v; }
        else if (!strcmp(a, "--alias")) { VAL(); alias = v; }
        else if (!strcmp(a, "--shutdown-grace")) { VAL(); if (!arg_float(cmd, a, v, 0, 3600, &grace)) return 2; }
        else if (!strcmp(a, "--kv-type")) { VAL(); if (!arg_kv_type(cmd, v, &kv_type)) return 2; }
        else if (!strcmp(a, "--cache-ram") || !strcmp(a, "--cache-disk")) {
            VAL();
            double *dst = !strcmp(a, "--cache-ram") ? &cache_ram : &cache_disk;
            if (!app_parse_size(v, dst)) {
                fprintf(stderr, "kvsieve serve: %s '%s': expected a size such as 512M or 4G\n", a, v);
                return 2;
            }
        }
        else if (!strcmp(a, "--cache-dir")) { VAL(); cache_dir = v; }
        else { fprintf(stderr, "kvsieve serve: unknown option '%s'\n", a); usage(stderr); return 2; }
#undef VAL
    }
    if (!model_path) model_path = app_default_model();
    if (!model_path) {
        fprintf(stderr, "kvsieve serve: no model given (-m) and no bundled model found (set KVSIEVE_MODEL)\n");
        return 2;
    }
    po.model_path = model_path;
    if (!app_policy_calibration(&po, cmd, model_path)) return 2;
    if (api_key && !*api_key) api_key = NULL;

    /* every thread started from here on inherits the mask: signals come to sigwait below */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    int rc = 1;
    ks_model *model = NULL;
    ks_sched *sched = NULL;
    ks_server *srv = NULL;
    ks_prefix_cache *cache = NULL;
    char err[1024];
    ks_status st = ks_model_load(model_path, ks_model_default_params(), &model);
    if (st != KS_OK) { app_report(cmd, "loading the model", st); goto done; }
    int32_t train = ks_model_n_ctx_train(model);
    if (n_ctx == 0) n_ctx = train < 4096 ? train : 4096;
    if (n_ctx > train)
        fprintf(stderr, "kvsieve serve: warning: -c %ld is beyond the model's trained context of %d tokens\n", n_ctx, train);

    ks_context_params cp = ks_context_default_params();
    app_policy_apply(&po, 0, app_budget_tokens(&po.budgets[0], (int32_t)n_ctx), &cp);
    ks_sched_params sp = ks_sched_default_params();
    sp.n_ctx = (int32_t)n_ctx;
    sp.n_parallel = (int32_t)parallel;
    sp.n_threads = (int32_t)n_threads;
    sp.n_batch = (int32_t)n_batch;
    sp.kv_type = kv_type;
    sp.max_waiting = (int32_t)max_queue;
    sp.max_groups = (int32_t)max_groups;
    sp.mem_cap = cp.mem_cap;
    sp.mem_overhead = cp.mem_overhead;
    sp.kv_offload_dir = cp.kv_offload_dir;
    sp.kv_offload_layers = cp.kv_offload_layers;
    sp.kv_slots = cp.kv_slots;
    if (cache_ram > 0) {
        ks_prefix_cache_params pcp = ks_prefix_cache_default_params();
        pcp.ram_bytes = (uint64_t)cache_ram;
        pcp.dir = cache_dir;
        pcp.disk_bytes = (uint64_t)cache_disk;
        if ((st = ks_prefix_cache_create(model, &pcp, &cache)) != KS_OK) { app_report(cmd, "creating the prefix cache", st); goto done; }
        sp.cache = cache;
    } else if (cache_dir) {
        fprintf(stderr, "kvsieve serve: --cache-dir needs a prefix cache (--cache-ram > 0)\n");
        goto done;
    }
    ks_sched_policy *d = &sp.defaults;
    d->page = cp.page;
    if (!app_policy_spec(&po, cmd, 0, cp.budget, &d->spec)) {
        rc = 2;
        goto done;
    }
    if ((st = ks_sched_create(model, &sp, &sched, err, sizeof err)) != KS_OK) {
        fprintf(stderr, "kvsieve serve: creating the scheduler: %s\n", err);
        rc = st == KS_ERR_INVALID_ARG ? 2 : 1;
        goto done;
    }

    char id[256];
    if (alias) {
        snprintf(id, sizeof id, "%s", alias);
    } else { /* the file name without its directory and .gguf */
        const char *b = strrchr(model_path, '/');
        b = b ? b + 1 : model_path;
        size_t n = strlen(b);
        if (n > 5 && !strcmp(b + n - 5, ".gguf")) n -= 5;
        snprintf(id, sizeof id, "%.*s", (int)n, b);
    }
    ks_server_params hp = ks_server_default_params();
    hp.host = host;
    hp.port = (int)port;
    hp.api_key = api_key;
    hp.model_id = id;
    hp.model_path = model_path;
    hp.defaults = sp.defaults;
    hp.max_connections = (int)(parallel * 4 + max_queue + 16) < 1024 ? (int)(parallel * 4 + max_queue + 16) : 1024;
    if ((st = ks_server_start(model, sched, &hp, &srv, err, sizeof err)) != KS_OK) {
        fprintf(stderr, "kvsieve serve: %s\n", err);
        goto done;
    }
    fprintf(stderr, "kvsieve serve: model %s, context %ld x %ld slots, policy %s budget %d%s%s\n", id, n_ctx, parallel,
            d->spec.name, d->spec.budget, sp.mem_cap > 0 ? ", memory cap on" : "", api_key ? ", API key required" : "");
    if (cache)
        fprintf(stderr, "kvsieve serve: prefix cache %.2f GB of RAM%s%s\n", cache_ram / 1e9, cache_dir ? ", blocks in " : "",
                cache_dir ? cache_dir : "");
    bool v6 = strchr(host, ':') != NULL;
    printf("kvsieve serve: listening on http://%s%s%s:%d\n", v6 ? "[" : "", host, v6 ? "]" : "", ks_server_port(srv));
    fflush(stdout);

    int sig = 0;
    while (sigwait(&sigs, &sig) != 0) {}
    fprintf(stderr, "kvsieve serve: %s: shutting down (running requests get %.0f s to finish)\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM", grace);
    ks_server_begin_shutdown(srv);
    ks_sched_shutdown(sched, grace);
    struct timespec tick = {.tv_sec = 0, .tv_nsec = 100 * 1000000L};
    for (int waited = 0;; waited++) {
        if (ks_sched_idle(sched) && ks_server_active(srv) == 0) break;
        if (sigtimedwait(&sigs, NULL, &tick) > 0) {
            fprintf(stderr, "kvsieve serve: second signal: ending running requests now\n");
            ks_sched_shutdown(sched, 0);
        }
        if (waited > (int)(grace * 10) + 100) { /* the scheduler ends them at the grace; this is a backstop */
            fprintf(stderr, "kvsieve serve: requests still active after the grace; closing connections\n");
            break;
        }
    }
    rc = 0;
done:
    ks_server_stop(srv);
    ks_sched_destroy(sched);
    ks_prefix_cache_destroy(cache); /* after the scheduler: it borrows the cache */
    ks_model_destroy(model);
    if (rc == 0) fprintf(stderr, "kvsieve serve: stopped\n");
    return rc;
}
