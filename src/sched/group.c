/*
 * group.c — contexts: one with n_parallel sequence slots per KV page size in
 * use (sched.h; nearly always one), created on demand and destroyed when
 * idle; a request's admission into a slot (with its own selection policy on
 * that sequence, and under a memory cap the engine's model over the actual
 * state), its end there, and under a cap the pauses and resumes before each
 * step (ks_sched_group_balance).
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
    a->kv_entries_loaded += b->kv_entries_loaded;
    a->kv_entries_hit += b->kv_entries_hit;
    a->kv_sync_fallbacks += b->kv_sync_fallbacks;
    a->kv_wait_seconds += b->kv_wait_seconds;
    a->kv_copy_seconds += b->kv_copy_seconds;
    a->policy_selections += b->policy_selections;
    a->policy_hits += b->policy_hits;
    a->policy_misses += b->policy_misses;
    a->policy_corrections += b->policy_corrections;
    a->policy_speculative += b->policy_speculative;
    a->policy_rebuilds += b->policy_rebuilds;
    if (b->policy_topp_refined) { /* the extremes over the groups' heads */
        bool first = !a->policy_topp_refined;
        a->policy_topp_head_min = first || b->policy_topp_head_min < a->policy_topp_head_min ? b->policy_topp_head_min
                                                                                          : a->policy_topp_head_min;
        a->policy_topp_head_max = first || b->policy_topp_head_max > a->policy_topp_head_max ? b->policy_topp_head_max
                                                                                          : a->policy_topp_head_max;
    }
    a->policy_topp_refined += b->policy_topp_refined;
    a->policy_topp_picked += b->policy_topp_picked;
    a->policy_topp_kept += b->policy_topp_kept;
    a->kv_offload_events += b->kv_offload_events;
    a->gather_seconds += b->gather_seconds;
    a->gather_bytes += b->gather_bytes;
    a->select_bytes_read += b->select_bytes_read;
}

ks_status ks_sched_group_create(ks_sched *s, int32_t page, group **out, char *err, size_t err_cap) {
    const ks_sched_policy *pol = &s->p.defaults; /* the context's default policy */
    ks_context_params cp = ks_context_default_params();
    cp.n_ctx = s->p.n_ctx;
    cp.n_seq = s->p.n_parallel;
    if (s->p.n_threads > 0) cp.n_threads = s->p.n_threads;
    cp.n_batch = s->p.n_batch;
    cp.kv_type = s->p.kv_type;
    cp.policy_spec = &pol->spec;
    cp.page = page;
    cp.kv_offload_dir = s->offload_dir;
    cp.kv_offload_layers = s->p.kv_offload_layers;
    cp.kv_slots = s->p.kv_slots;
    cp.mem_cap = s->p.mem_cap;
    if (s->p.mem_overhead > 0) cp.mem_overhead = s->p.mem_overhead;
    ks_context *ctx = NULL;
    ks_status st = ks_context_create(s->model, cp, &ctx);
    if (st != KS_OK) {
        snprintf(err, err_cap, "policy '%s' budget %d page %d: %s (%s)", pol->spec.name, pol->spec.budget, page,
                 ks_status_str(st), ks_last_error());
        return st;
    }
    group *g = ks_calloc(1, sizeof *g);
    slot *slots = ks_calloc((size_t)s->p.n_parallel, sizeof(slot));
    if (!g || !slots) {
        free(g);
        free(slots);
        ks_context_destroy(ctx);
        snprintf(err, err_cap, "out of memory for a group of %d slots", s->p.n_parallel);
        return KS_ERR_NOMEM;
    }
    g->page = page;
    g->ctx = ctx;
    g->slots = slots;
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

group *ks_sched_group_find(ks_sched *s, int32_t page) {
    for (int32_t i = 0; i < s->n_groups; i++)
        if (s->groups[i]->page == page) return s->groups[i];
    return NULL;
}

/* Snapshot for metrics (scheduler thread, under mu): the engine's counters,
 * the layers in the slow tier, and the KV bytes the sequences hold in each
 * tier (ks_context_kv_bytes: entries stored, evictions counted; an
 * offloaded layer's fast slots are a cache and not counted). */
void ks_sched_group_account(ks_sched *s, group *g) {
    (void)s;
    ks_context_stats(g->ctx, &g->stats);
    ks_memplan_info mi;
    ks_context_memplan(g->ctx, &mi);
    g->offloaded = mi.active ? mi.offloaded : 0;
    int64_t fast = 0, slow = 0;
    ks_context_kv_bytes(g->ctx, &fast, &slow);
    g->kv_fast = (uint64_t)fast;
    g->kv_slow = (uint64_t)slow;
}

/* under mu: end the request in slot i of g (staged or given outcome). */
void ks_sched_slot_end(ks_sched *s, group *g, int32_t i, ks_sched_finish fin, ks_sched_error err, const char *msg) {
    slot *sl = &g->slots[i];
    ks_sched_req *r = sl->req;
    if (!r) return;
    ks_seq_reset(g->ctx, i); /* a paused request's parked KV goes too */
    if (sl->paused) s->n_paused--;
    sl->paused = false;
    /* under a cap the sequence drops its policy, so an instance no request
     * uses leaves the memory plan at once */
    if (s->p.mem_cap > 0) (void)ks_seq_set_policy(g->ctx, i, NULL);
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

bool ks_sched_fits_alone(group *g, const ks_sched_req *r) {
    int64_t worst = (int64_t)r->n_prompt + r->max_tokens;
    ks_mem_query q = {.extra_tokens = worst, .extra_seqs = 1, .longest = worst, .alone = true};
    ks_mem_fit f;
    return ks_context_mem_fits(g->ctx, &q, &f) != KS_OK || f.fits;
}

/* Tokens admitted but not prefilled yet (the prompts of running slots still
 * prefilling, not paused), the sequences among them still empty, and the
 * length the longest of them will reach. */
static void pending(ks_sched *s, group *g, int32_t skip, int64_t *tokens, int32_t *seqs, int64_t *longest) {
    *tokens = 0, *seqs = 0, *longest = 0;
    for (int32_t j = 0; j < s->p.n_parallel; j++) {
        const slot *sl = &g->slots[j];
        if (!sl->req || sl->paused || sl->decoding || j == skip) continue;
        *tokens += sl->req->n_prompt - sl->n_fed;
        *seqs += sl->n_fed == 0;
        if (sl->req->n_prompt > *longest) *longest = sl->req->n_prompt;
    }
}

static int64_t margin(const slot *sl, int32_t len) {
    int64_t left = (int64_t)sl->req->n_prompt + sl->req->max_tokens - len;
    return left < KS_SCHED_GROWTH_MARGIN ? (left > 0 ? left : 0) : KS_SCHED_GROWTH_MARGIN;
}

/* under mu: a free slot of g with r's policy on its sequence, or -1 with
 * *why and msg set (the policy was refused, or under a memory cap the
 * request's worst case does not fit the plan even alone with every layer
 * offloaded), or -2 when r must wait: beside the running requests it does
 * not fit the plan now (the actual sum of their lengths, each with room to
 * grow), a request is paused (paused ones resume first), or r's policy
 * would leave a running request unable to finish even alone. */
int32_t ks_sched_slot_prepare(ks_sched *s, group *g, const ks_sched_req *r, ks_sched_error *why, char *msg,
                              size_t msg_cap) {
    int32_t i = 0;
    while (g->slots[i].req) i++;
    ks_seq_reset(g->ctx, i);
    const ks_sched_policy *pol = &r->policy;
    ks_status st = ks_seq_set_policy_spec(g->ctx, i, &pol->spec); /* the group's page is the request's */
    if (st == KS_OK) st = ks_seq_set_prefill_policy(g->ctx, i, pol->prefill); /* before any restore: its key */
    if (st != KS_OK) {
        *why = st == KS_ERR_CONTEXT_FULL ? KS_SCHED_ERR_TOO_LONG : st == KS_ERR_NOMEM ? KS_SCHED_ERR_NOMEM : KS_SCHED_ERR_INVALID;
        snprintf(msg, msg_cap, "policy '%s' budget %d: %s (%s)", pol->spec.name, pol->spec.budget, ks_status_str(st),
                 ks_last_error());
        return -1;
    }
    ks_mem_fit f;
    ks_mem_query q = {0};
    if (ks_context_mem_fits(g->ctx, &q, &f) != KS_OK || !f.active) return i;
    /* the plan may have changed with the policies the context holds now:
     * every running request must still be able to finish on its own */
    bool others = false, any_paused = false;
    int64_t run_margin = 0;
    for (int32_t j = 0; j < s->p.n_parallel; j++) {
        const slot *o = &g->slots[j];
        if (!o->req) continue;
        others = true;
        any_paused |= o->paused;
        if (!ks_sched_fits_alone(g, o->req)) any_paused = true; /* wait for it to end */
        if (!o->paused) run_margin += margin(o, ks_seq_len(g->ctx, j));
    }
    bool alone = ks_sched_fits_alone(g, r);
    if (!alone && !others) {
        int64_t worst = (int64_t)r->n_prompt + r->max_tokens;
        q = (ks_mem_query){.extra_tokens = worst, .extra_seqs = 1, .longest = worst, .alone = true};
        (void)ks_context_mem_fits(g->ctx, &q, &f);
        *why = KS_SCHED_ERR_TOO_LONG;
        snprintf(msg, msg_cap,
                 "the request needs up to %lld tokens per sequence; under the memory cap (%.1f MB) it does not fit "
                 "even alone with every layer offloaded (%.1f MB)",
                 (long long)worst, f.mem_cap / 1e6, f.bytes / 1e6);
        (void)ks_seq_set_policy(g->ctx, i, NULL);
        return -1;
    }
    if (others) {
        /* admission by the actual sum: the running sequences as they are,
         * the prompts admitted and not prefilled yet, and this prompt, each
         * with room to grow */
        int64_t pt, pl;
        int32_t ps;
        pending(s, g, -1, &pt, &ps, &pl);
        int64_t need = (int64_t)r->n_prompt + (r->max_tokens < KS_SCHED_GROWTH_MARGIN ? r->max_tokens : KS_SCHED_GROWTH_MARGIN);
        q = (ks_mem_query){.extra_tokens = pt + run_margin + need, .extra_seqs = ps + 1, .longest = pl > need ? pl : need};
        bool fits = ks_context_mem_fits(g->ctx, &q, &f) == KS_OK && f.fits;
        if (!alone || any_paused || !fits) {
            (void)ks_seq_set_policy(g->ctx, i, NULL); /* back to the default: the plan as it was */
            return -2;
        }
    }
    return i;
}

/* The step group_step will run: one token for each decoding slot that is
 * not paused, and the next prefill chunk of the earliest prefilling one. */
static void step_need(ks_sched *s, group *g, ks_mem_query *q, int32_t *n_run) {
    memset(q, 0, sizeof *q);
    *n_run = 0;
    const slot *pf = NULL;
    int32_t pi = -1;
    for (int32_t i = 0; i < s->p.n_parallel; i++) {
        const slot *sl = &g->slots[i];
        if (!sl->req || sl->paused) continue;
        (*n_run)++;
        int64_t len = ks_seq_len(g->ctx, i);
        if (sl->decoding) {
            q->extra_tokens++;
            if (len + 1 > q->longest) q->longest = len + 1;
        } else if (!pf || sl->order < pf->order) {
            pf = sl;
            pi = i;
        }
    }
    if (pf) {
        int32_t left = pf->req->n_prompt - pf->n_fed;
        int32_t m = pf->chunkable && left > s->p.n_batch ? s->p.n_batch : left;
        int64_t len = ks_seq_len(g->ctx, pi);
        q->extra_tokens += m;
        q->extra_seqs += len == 0;
        if (len + m > q->longest) q->longest = len + m;
    }
}

bool ks_sched_cache_fit(ks_sched *s, group *g) {
    if (!s->p.cache || s->p.mem_cap <= 0) return false;
    ks_mem_query q;
    int32_t n_run = 0;
    step_need(s, g, &q, &n_run);
    ks_mem_fit f;
    if (ks_context_mem_fits(g->ctx, &q, &f) != KS_OK || !f.active) return false;
    double room = f.mem_cap - f.bytes;
    uint64_t allow = room > 0 ? (uint64_t)room : 0;
    ks_prefix_cache_stats cs;
    ks_prefix_cache_get_stats(s->p.cache, &cs);
    /* blocks whose pages running sequences map are counted there already (once) */
    ks_prefix_cache_trim(s->p.cache, allow + cs.ram_shared_bytes); /* also raises the limit again when room returned */
    return cs.ram_bytes - cs.ram_shared_bytes > allow;
}

void ks_sched_group_balance(ks_sched *s, group *g, int32_t *paused, int32_t *resumed) {
    *paused = *resumed = 0;
    ks_mem_fit f;
    ks_mem_query q = {0};
    if (ks_context_mem_fits(g->ctx, &q, &f) != KS_OK || !f.active) return;
    /* resume, oldest first, while the paused one fits beside the running
     * ones with room to grow (always when nothing else runs: it fits alone) */
    for (;;) {
        int32_t best = -1, n_run = 0;
        int64_t run_margin = 0;
        for (int32_t i = 0; i < s->p.n_parallel; i++) {
            const slot *sl = &g->slots[i];
            if (!sl->req) continue;
            if (sl->paused) {
                if (best < 0 || sl->order < g->slots[best].order) best = i;
            } else {
                n_run++;
                run_margin += margin(sl, ks_seq_len(g->ctx, i));
            }
        }
        if (best < 0) break;
        slot *b = &g->slots[best];
        if (n_run > 0) {
            int64_t pt, pl;
            int32_t ps;
            pending(s, g, best, &pt, &ps, &pl);
            int64_t len = ks_seq_len(g->ctx, best), grow = margin(b, (int32_t)len);
            if (!b->decoding) grow += b->req->n_prompt - b->n_fed; /* paused while prefilling */
            q = (ks_mem_query){.extra_tokens = len + grow + pt + run_margin, .extra_seqs = 1 + ps,
                               .longest = len + grow > pl ? len + grow : pl};
            if (ks_context_mem_fits(g->ctx, &q, &f) != KS_OK || !f.fits) break;
        }
        ks_status st = ks_seq_unpark(g->ctx, best);
        b->paused = false;
        (*resumed)++;
        if (st != KS_OK) {
            b->finish = KS_SCHED_FINISH_ERROR;
            b->error = KS_SCHED_ERR_INTERNAL;
            snprintf(b->message, sizeof b->message, "resuming the paused request: %s (%s)", ks_status_str(st),
                     ks_last_error());
            break;
        }
    }
    /* pause the newest running request while the coming step would not fit
     * even with every layer offloaded (never the last one: it fits alone) */
    for (;;) {
        int32_t n_run = 0;
        step_need(s, g, &q, &n_run);
        if (n_run <= 1) break;
        if (ks_context_mem_fits(g->ctx, &q, &f) != KS_OK || f.fits) break;
        int32_t v = -1;
        for (int32_t i = 0; i < s->p.n_parallel; i++) {
            const slot *sl = &g->slots[i];
            if (sl->req && !sl->paused && sl->finish == KS_SCHED_FINISH_NONE && (v < 0 || sl->order > g->slots[v].order))
                v = i;
        }
        if (v < 0 || ks_seq_park(g->ctx, v) != KS_OK) {
            KS_LOG(WARN, "sched: could not pause a request to make room: %s", ks_last_error());
            break;
        }
        g->slots[v].paused = true;
        (*paused)++;
    }
}

/* under mu: r into slot i (ks_sched_slot_prepare's) */
void ks_sched_slot_admit(ks_sched *s, group *g, int32_t i, ks_sched_req *r) {
    slot *sl = &g->slots[i];
    sl->chunkable = ks_policy_spec_chunkable(&r->policy.spec);
    sl->req = r;
    sl->paused = false;
    sl->n_fed = 0;
    sl->decoding = false;
    sl->n_gen = 0;
    sl->n_cached = -1;
    sl->order = s->next_order++;
    ks_status st = ks_stop_create((const char *const *)r->stops, (size_t)r->n_stops, &sl->stop);
    sl->emit.n = 0;
    sl->emit.refused = false;
    sl->finish = KS_SCHED_FINISH_NONE;
    if (st != KS_OK) { /* only a refused allocation (the strings were checked at submit): the publish ends it */
        sl->finish = KS_SCHED_FINISH_ERROR;
        sl->error = st == KS_ERR_NOMEM ? KS_SCHED_ERR_NOMEM : KS_SCHED_ERR_INTERNAL;
        snprintf(sl->message, sizeof sl->message, "stop strings: %s (%s)", ks_status_str(st), ks_last_error());
    }
    g->n_used++;
    r->state = KS_SCHED_RUNNING;
    r->t_admit = ks_sched_now();
    r->news = true;
    pthread_cond_broadcast(&r->cv);
}
