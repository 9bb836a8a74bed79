/*
 * serve_api.c — the public server handle (include/kvsieve_server.h): a
 * scheduler and the HTTP front started together, stopped together.  The
 * request defaults arrive as a ks_context_params whose policy (its
 * policy_spec, or its strings parsed here once) becomes the scheduler's
 * default, so no caller sees ks_sched_policy.
 */
#include "kvsieve_server.h"
#include "sched/sched.h"
#include "server/server.h"

#include <stdio.h>
#include <stdlib.h>

struct ks_serve {
    ks_sched *sched;
    ks_server *server;
};

ks_serve_params ks_serve_default_params(void) {
    return (ks_serve_params){.host = "127.0.0.1", .port = 8080, .n_parallel = 4, .n_batch = 256, .max_waiting = 64,
                             .defaults = ks_context_default_params()};
}

static ks_status serve_sched_params(const ks_serve_params *p, ks_sched_params *sp) {
    const ks_context_params *cp = &p->defaults;
    *sp = ks_sched_default_params();
    sp->n_ctx = p->n_ctx;
    sp->n_parallel = p->n_parallel;
    sp->n_threads = p->n_threads;
    sp->n_batch = p->n_batch;
    sp->kv_type = p->kv_type;
    sp->max_waiting = p->max_waiting;
    sp->max_groups = p->max_groups;
    sp->mem_cap = cp->mem_cap;
    sp->mem_overhead = cp->mem_overhead;
    sp->kv_offload_dir = cp->kv_offload_dir;
    sp->kv_offload_layers = cp->kv_offload_layers;
    sp->kv_slots = cp->kv_slots;
    sp->cache = p->cache;
    ks_sched_policy *d = &sp->defaults;
    d->page = cp->page;
    /* --prefill-policy: every request's unless it names its own (kvsieve.prefill_policy) */
    ks_status st = ks_prefill_policy_canonical(cp->prefill_policy, cp->page, d->prefill, sizeof d->prefill);
    if (st != KS_OK) return st;
    if (cp->policy_spec) {
        d->spec = *cp->policy_spec;
        return KS_OK;
    }
    return ks_policy_spec_parse(cp->policy ? cp->policy : "dense", cp->policy_args, cp->budget, cp->sink, cp->window,
                                cp->dense_layers, &d->spec);
}

ks_status ks_serve_start(const ks_model *model, const ks_serve_params *p, ks_serve **out, char *err, size_t err_cap,
                         const char **what) {
    const char *dummy;
    if (!what) what = &dummy;
    ks_serve *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, err_cap, "out of memory");
        *what = "creating the scheduler";
        return KS_ERR_NOMEM;
    }
    ks_sched_params sp;
    ks_status st = serve_sched_params(p, &sp);
    if (st != KS_OK) {
        snprintf(err, err_cap, "%s", ks_last_error());
        *what = "creating the scheduler"; /* its default policy */
        free(s);
        return st;
    }
    st = ks_sched_create(model, &sp, &s->sched, err, err_cap);
    if (st != KS_OK) {
        *what = "creating the scheduler";
        free(s);
        return st;
    }
    ks_server_params hp = ks_server_default_params();
    hp.host = p->host;
    hp.port = p->port;
    hp.api_key = p->api_key;
    hp.model_id = p->model_id;
    hp.model_path = p->model_path;
    hp.defaults = sp.defaults;
    if (p->max_connections > 0) hp.max_connections = p->max_connections;
    if ((st = ks_server_start(model, s->sched, &hp, &s->server, err, err_cap)) != KS_OK) {
        *what = "starting the server";
        ks_sched_destroy(s->sched);
        free(s);
        return st;
    }
    *out = s;
    return KS_OK;
}

int ks_serve_port(const ks_serve *s) { return ks_server_port(s->server); }

void ks_serve_begin_shutdown(ks_serve *s, double grace_s) {
    ks_server_begin_shutdown(s->server);
    ks_sched_shutdown(s->sched, grace_s);
}

void ks_serve_end_requests(ks_serve *s) { ks_sched_shutdown(s->sched, 0); }

bool ks_serve_idle(ks_serve *s) { return ks_sched_idle(s->sched) && ks_server_active(s->server) == 0; }

void ks_serve_stop(ks_serve *s) {
    if (!s) return;
    ks_server_stop(s->server);
    ks_sched_destroy(s->sched);
    free(s);
}
