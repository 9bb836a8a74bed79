/*
 * group.c — policy groups: a context with n_parallel sequence slots for one
 * selection-policy configuration (sched.h), created on demand and destroyed
 * when idle; a request's admission into a slot and its end there.
 */
#include "sched/internal.h"

#include <stdio.h>
#include <string.h>

void ks_sched_stats_add(ks_stats *a, const ks_stats *b) {
    a->weight_bytes_read += b->weight_bytes_read;
    a->kv_bytes_read += b->kv_bytes_read;
    a->tokens_prefilled += b->tokens_prefilled;
    a->tokens_decoded += b->tokens_decoded;
    a->prefill_seconds += b->prefill_seconds;
    a->decode_seconds += b->decode_seconds;
    a->kv_entries_attended += b->kv_entries_attended;
    a->kv_entries_total += b->kv_entries_total;
    a->select_seconds += b->select_seconds;
    a->kv_bytes_loaded += b->kv_bytes_loaded;
    a->kv_bytes_stored += b->kv_bytes_stored;
    a->kv_pages_loaded += b->kv_pages_loaded;
    a->kv_pages_hit += b->kv_pages_hit;
    a->kv_wait_seconds += b->kv_wait_seconds;
    a->kv_copy_seconds += b->kv_copy_seconds;
    a->policy_selections += b->policy_selections;
    a->policy_hits += b->policy_hits;
    a->policy_misses += b->policy_misses;
    a->policy_corrections += b->policy_corrections;
    a->policy_rebuilds += b->policy_rebuilds;
    a->kv_offload_events += b->kv_offload_events;
}

ks_status ks_sched_group_create(ks_sched *s, const ks_sched_policy *pol, group **out, char *err, size_t err_cap) {
    ks_context_params cp = ks_context_default_params();
    cp.n_ctx = s->p.n_ctx;
    cp.n_seq = s->p.n_parallel;
    if (s->p.n_threads > 0) cp.n_threads = s->p.n_threads;
    cp.n_batch = s->p.n_batch;
    cp.kv_type = s->p.kv_type;
    cp.policy = pol->policy;
    cp.budget = pol->budget;
    cp.sink = pol->sink;
    cp.window = pol->window;
    cp.page = pol->page;
    cp.dense_layers = pol->dense_layers;
    cp.policy_args = pol->args[0] ? pol->args : NULL;
    cp.kv_offload_dir = s->offload_dir;
    cp.kv_offload_layers = s->p.kv_offload_layers;
    cp.kv_slots = s->p.kv_slots;
    cp.mem_cap = s->p.mem_cap;
    if (s->p.mem_overhead > 0) cp.mem_overhead = s->p.mem_overhead;
    ks_context *ctx = NULL;
    ks_status st = ks_context_create(s->model, cp, &ctx);
    if (st != KS_OK) {
        snprintf(err, err_cap, "policy '%s' budget %d: %s (%s)", pol->policy, pol->budget, ks_status_str(st),
                 ks_last_error());
        return st;
    }
    group *g = ks_calloc(1, sizeof *g);
    g->pol = *pol;
    g->ctx = ctx;
    g->slots = ks_calloc((size_t)s->p.n_parallel, sizeof(slot));
    g->chunkable = ks_sched_policy_chunkable(pol->policy);
    ks_memplan_info mi;
    ks_context_memplan(ctx, &mi);
    g->mem_limit = mi.active ? mi.thresholds[mi.n_layer] : -1;
    g->idle_since = ks_sched_now();
    s->ctx_created++;
    *out = g;
    return KS_OK;
}

/* under mu; the group must be idle. */
void ks_sched_group_destroy(ks_sched *s, int32_t gi) {
    group *g = s->groups[gi];
    ks_stats st;
    ks_context_stats(g->ctx, &st);
    ks_sched_stats_add(&s->retired, &st);
    ks_context_destroy(g->ctx);
    for (int32_t i = 0; i < s->p.n_parallel; i++) {
        free(g->slots[i].emit.p);
        ks_stop_destroy(g->slots[i].stop);
    }
    free(g->slots);
    free(g);
    s->groups[gi] = s->groups[--s->n_groups];
    s->groups[s->n_groups] = NULL;
    if (s->rr >= s->n_groups) s->rr = 0;
}

group *ks_sched_group_find(ks_sched *s, const ks_sched_policy *pol) {
    for (int32_t i = 0; i < s->n_groups; i++)
        if (ks_sched_policy_equal(&s->groups[i]->pol, pol)) return s->groups[i];
    return NULL;
}

/* Snapshot for metrics (scheduler thread, under mu): the engine's counters,
 * the layers in the slow tier, and the KV bytes the sequences hold in each
 * tier (tokens x bytes per token and layer x layers in that tier; an
 * offloaded layer's fast slots are a cache and not counted). */
void ks_sched_group_account(ks_sched *s, group *g) {
    ks_context_stats(g->ctx, &g->stats);
    ks_memplan_info mi;
    ks_context_memplan(g->ctx, &mi);
    int32_t slow = mi.active ? mi.offloaded : s->p.kv_offload_layers;
    if (slow > s->n_layer) slow = s->n_layer;
    g->offloaded = mi.active ? mi.offloaded : 0;
    int64_t toks = 0;
    for (int32_t i = 0; i < s->p.n_parallel; i++)
        if (g->slots[i].req) toks += ks_seq_len(g->ctx, i);
    g->kv_fast = (uint64_t)((double)toks * s->kv_token_layer * (s->n_layer - slow));
    g->kv_slow = (uint64_t)((double)toks * s->kv_token_layer * slow);
}

/* under mu: end the request in slot i of g (staged or given outcome). */
void ks_sched_slot_end(ks_sched *s, group *g, int32_t i, ks_sched_finish fin, ks_sched_error err, const char *msg) {
    slot *sl = &g->slots[i];
    ks_sched_req *r = sl->req;
    if (!r) return;
    ks_seq_reset(g->ctx, i);
    sl->req = NULL;
    sl->decoding = false;
    sl->emit.n = 0;
    ks_stop_destroy(sl->stop);
    sl->stop = NULL;
    g->n_used--;
    if (g->n_used == 0) g->idle_since = ks_sched_now();
    ks_sched_group_account(s, g);
    ks_sched_req_finish(s, r, fin, err, msg);
}

/* under mu */
void ks_sched_slot_admit(ks_sched *s, group *g, ks_sched_req *r) {
    int32_t i = 0;
    while (g->slots[i].req) i++;
    slot *sl = &g->slots[i];
    ks_seq_reset(g->ctx, i);
    sl->req = r;
    sl->n_fed = 0;
    sl->decoding = false;
    sl->n_gen = 0;
    sl->order = s->next_order++;
    ks_status st = ks_stop_create((const char *const *)r->stops, (size_t)r->n_stops, &sl->stop);
    KS_ASSERT(st == KS_OK); /* the strings were checked at submit */
    sl->emit.n = 0;
    sl->finish = KS_SCHED_FINISH_NONE;
    g->n_used++;
    r->state = KS_SCHED_RUNNING;
    r->t_admit = ks_sched_now();
    r->news = true;
    pthread_cond_broadcast(&r->cv);
}
