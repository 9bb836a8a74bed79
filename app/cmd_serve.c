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
#include "kvsieve_server.h"
#include "opts.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* --alias, or the file name without its directory and .gguf */
static void serve_model_id(const app_options *o, char *id, size_t cap) {
    if (o->alias) {
        snprintf(id, cap, "%s", o->alias);
        return;
    }
    const char *b = strrchr(o->model_path, '/');
    b = b ? b + 1 : o->model_path;
    size_t n = strlen(b);
    if (n > 5 && !strcmp(b + n - 5, ".gguf")) n -= 5;
    snprintf(id, cap, "%.*s", (int)n, b);
}

/* SIGINT / SIGTERM: wind down within the grace; a second signal ends the requests now. */
static void serve_wait(const app_options *o, ks_serve *srv, sigset_t *sigs) {
    int sig = 0;
    while (sigwait(sigs, &sig) != 0) {}
    fprintf(stderr, "kvsieve serve: %s: shutting down (running requests get %.0f s to finish)\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM", o->grace);
    ks_serve_begin_shutdown(srv, o->grace);
    struct timespec tick = {.tv_sec = 0, .tv_nsec = 100 * 1000000L};
    for (int waited = 0;; waited++) {
        if (ks_serve_idle(srv)) break;
        if (sigtimedwait(sigs, NULL, &tick) > 0) {
            fprintf(stderr, "kvsieve serve: second signal: ending running requests now\n");
            ks_serve_end_requests(srv);
        }
        if (waited > (int)(o->grace * 10) + 100) { /* the scheduler ends them at the grace; this is a backstop */
            fprintf(stderr, "kvsieve serve: requests still active after the grace; closing connections\n");
            break;
        }
    }
}

static int serve_cache(const app_options *o, const ks_model *model, ks_prefix_cache **cache) {
    if (o->cache_ram > 0) {
        ks_prefix_cache_params pcp = ks_prefix_cache_default_params();
        pcp.ram_bytes = (uint64_t)o->cache_ram;
        pcp.dir = o->cache_dir;
        pcp.disk_bytes = (uint64_t)o->cache_disk;
        ks_status st = ks_prefix_cache_create(model, &pcp, cache);
        if (st != KS_OK) { app_report(o->cmd, "creating the prefix cache", st); return 1; }
    } else if (o->cache_dir) {
        fprintf(stderr, "kvsieve serve: --cache-dir needs a prefix cache (--cache-ram > 0)\n");
        return 1;
    }
    return -1;
}

static int serve_start(app_options *o, const ks_model *model, ks_prefix_cache *cache, char *id, ks_serve **srv) {
    int32_t train = ks_model_n_ctx_train(model);
    long n_ctx = o->n_ctx ? o->n_ctx : train < 4096 ? train : 4096;
    if (n_ctx > train)
        fprintf(stderr, "kvsieve serve: warning: -c %ld is beyond the model's trained context of %d tokens\n", n_ctx, train);
    ks_serve_params sp = ks_serve_default_params();
    sp.defaults = app_context_params(o, 0, app_budget_tokens(&o->po.budgets[0], (int32_t)n_ctx), (int32_t)n_ctx, false);
    sp.n_ctx = (int32_t)n_ctx;
    sp.n_parallel = (int32_t)o->parallel;
    sp.n_threads = (int32_t)o->n_threads;
    if (o->n_batch) sp.n_batch = (int32_t)o->n_batch; /* else the server's default */
    sp.kv_type = o->kv_type;
    sp.max_waiting = (int32_t)o->max_queue;
    sp.max_groups = (int32_t)o->max_groups;
    sp.cache = cache;
    sp.host = o->host;
    sp.port = (int)o->port;
    sp.api_key = o->api_key;
    sp.model_id = id;
    sp.model_path = o->model_path;
    long conns = o->parallel * 4 + o->max_queue + 16;
    sp.max_connections = conns < 1024 ? (int)conns : 1024;
    char err[1024];
    const char *what = "";
    ks_status st = ks_serve_start(model, &sp, srv, err, sizeof err, &what);
    if (st != KS_OK) {
        bool sched = !strcmp(what, "creating the scheduler");
        if (sched) fprintf(stderr, "kvsieve serve: creating the scheduler: %s\n", err);
        else fprintf(stderr, "kvsieve serve: %s\n", err);
        return sched && st == KS_ERR_INVALID_ARG ? 2 : 1;
    }
    fprintf(stderr, "kvsieve serve: model %s, context %ld x %ld slots, policy %s budget %d%s%s\n", id, n_ctx, o->parallel,
            sp.defaults.policy, sp.defaults.budget, sp.defaults.mem_cap > 0 ? ", memory cap on" : "",
            o->api_key ? ", API key required" : "");
    if (cache)
        fprintf(stderr, "kvsieve serve: prefix cache %.2f GB of RAM%s%s\n", o->cache_ram / 1e9,
                o->cache_dir ? ", blocks in " : "", o->cache_dir ? o->cache_dir : "");
    bool v6 = strchr(o->host, ':') != NULL;
    printf("kvsieve serve: listening on http://%s%s%s:%d\n", v6 ? "[" : "", o->host, v6 ? "]" : "", ks_serve_port(*srv));
    fflush(stdout);
    return -1;
}

int cmd_serve(int argc, char **argv) {
    app_options o;
    int rc = app_parse("serve", argc, argv, &o);
    if (rc >= 0 || (rc = app_resolve_model(&o, true)) >= 0) return rc;
    if (!o.api_key) o.api_key = getenv("KVSIEVE_API_KEY");
    if (o.api_key && !*o.api_key) o.api_key = NULL;

    /* every thread started from here on inherits the mask: signals come to sigwait below */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    ks_model *model = NULL;
    ks_serve *srv = NULL;
    ks_prefix_cache *cache = NULL;
    char id[256];
    rc = 1;
    if (app_load_model(&o, ks_model_default_params(), &model) && (rc = serve_cache(&o, model, &cache)) < 0) {
        serve_model_id(&o, id, sizeof id);
        if ((rc = serve_start(&o, model, cache, id, &srv)) < 0) {
            serve_wait(&o, srv, &sigs);
            rc = 0;
        }
    }
    ks_serve_stop(srv);
    ks_prefix_cache_destroy(cache); /* after the scheduler: it borrows the cache */
    ks_model_destroy(model);
    if (rc == 0) fprintf(stderr, "kvsieve serve: stopped\n");
    return rc;
}
