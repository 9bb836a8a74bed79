/*
 * loop.c — the scheduler thread (sched.h).  Under the lock it reaps
 * cancelled requests, admits waiting ones into free slots (creating a
 * context when needed, setting each request's own policy on its sequence),
 * recycles idle contexts, and picks the next context with work; then,
 * without the lock, it runs that context's step on the engine — under a
 * memory cap first the pauses and resumes the step needs (group.c), then
 * one ks_decode for every decoding slot that is not paused, whatever their
 * policies, and one prefill chunk —
 * samples, detokenizes and matches stop strings into per-slot staging
 * buffers; then, under the lock again, it publishes the staged text and
 * finishes what finished.
 */
#include "sched/internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* under mu: fail every waiting request of KV page size page. */
static void fail_waiting_like(ks_sched *s, int32_t page, ks_sched_error err, const char *msg) {
    for (ks_sched_req *r = s->wait_head, *nx; r; r = nx) {
        nx = r->next;
        if (r->policy.page == page) {
            ks_sched_queue_remove(s, r);
            ks_sched_req_finish(s, r, KS_SCHED_FINISH_ERROR, err, msg);
        }
    }
}

/* under mu */
static void admit(ks_sched *s) {
    if (s->stopping) return;
    for (int32_t i = 0; i < s->n_groups; i++) s->groups[i]->blocked = false;
    bool need_new = false; /* a request needs a context that cannot be made now: strict FIFO from here */
    for (ks_sched_req *r = s->wait_head, *nx; r; r = nx) {
        nx = r->next;
        group *g = ks_sched_group_find(s, r->policy.page);
        if (!g) {
            if (need_new) continue;
            if (s->n_groups >= s->p.max_groups) { /* make room: an idle group goes */
                int32_t victim = -1;
                for (int32_t i = 0; i < s->n_groups; i++)
                    if (s->groups[i]->n_used == 0 && (victim < 0 || s->groups[victim]->is_default)) victim = i;
                if (victim < 0) {
                    need_new = true;
                    continue;
                }
                ks_sched_group_destroy(s, victim);
            }
            char err[768];
            group *ng = NULL;
            ks_status gst = ks_sched_group_create(s, r->policy.page, &ng, err, sizeof err);
            if (gst == KS_ERR_NOMEM) { /* memory, not the configuration: this request alone */
                ks_sched_queue_remove(s, r);
                ks_sched_req_finish(s, r, KS_SCHED_FINISH_ERROR, KS_SCHED_ERR_NOMEM, err);
                continue;
            }
            if (gst != KS_OK) {
                /* nx may be failed too: restart the walk after failing them all */
                fail_waiting_like(s, r->policy.page, KS_SCHED_ERR_INVALID, err);
                nx = s->wait_head;
                continue;
            }
            ng->is_default = r->policy.page == s->p.defaults.page;
            s->groups[s->n_groups++] = ng;
            g = ng;
        }
        if (g->blocked || need_new || g->n_used >= s->p.n_parallel) {
            g->blocked = true;
            continue;
        }
        char msg[1024];
        ks_sched_error why = KS_SCHED_ERR_NONE;
        int32_t slot_i = ks_sched_slot_prepare(s, g, r, &why, msg, sizeof msg);
        if (slot_i == -2) { /* its policy would shrink the plan under a running request: wait (FIFO) */
            g->blocked = true;
            continue;
        }
        ks_sched_queue_remove(s, r);
        if (slot_i < 0) ks_sched_req_finish(s, r, KS_SCHED_FINISH_ERROR, why, msg);
        else ks_sched_slot_admit(s, g, slot_i, r);
    }
}

/* under mu: free slots of cancelled requests; end everything after the
 * shutdown grace; recycle idle contexts. */
static void housekeeping(ks_sched *s) {
    double now = ks_sched_now();
    bool past_grace = s->stopping && now >= s->stop_deadline;
    for (int32_t gi = 0; gi < s->n_groups; gi++) {
        group *g = s->groups[gi];
        for (int32_t i = 0; i < s->p.n_parallel; i++) {
            ks_sched_req *r = g->slots[i].req;
            if (!r) continue;
            if (r->cancel) ks_sched_slot_end(s, g, i, KS_SCHED_FINISH_CANCELLED, KS_SCHED_ERR_NONE, "cancelled");
            else if (g->broken)
                ks_sched_slot_end(s, g, i, KS_SCHED_FINISH_ERROR, KS_SCHED_ERR_INTERNAL,
                         "the engine failed on another sequence of this request's context");
            else if (past_grace)
                ks_sched_slot_end(s, g, i, KS_SCHED_FINISH_ERROR, KS_SCHED_ERR_SHUTDOWN,
                         "the server is shutting down; the request was ended before it finished");
        }
    }
    for (int32_t gi = s->n_groups - 1; gi >= 0; gi--) {
        group *g = s->groups[gi];
        if (g->n_used) continue;
        ks_memplan_info mi;
        ks_context_memplan(g->ctx, &mi);
        /* layers the memory manager offloaded never come back on their own:
         * start the next requests from a fresh context with every layer fast */
        bool offloaded = mi.active && mi.offloaded > 0;
        bool stale = !g->is_default && now - g->idle_since > 2.0;
        if (g->broken || offloaded || stale) {
            if (offloaded) s->ctx_recycled++;
            ks_sched_group_destroy(s, gi);
        }
    }
}

/* The log-softmax of logits[V] at tok, and the n_top largest entries
 * (most likely first; ties: the lower id), into *out.  Two passes over V
 * and an insertion into a list of at most KS_SCHED_MAX_TOP_LOGPROBS. */
static void logprob_of(const float *logits, int32_t V, int32_t tok, int32_t n_top, ks_sched_logprob *out) {
    memset(out, 0, sizeof *out);
    float mx = -INFINITY;
    for (int32_t i = 0; i < V; i++)
        if (logits[i] > mx) mx = logits[i];
    double sum = 0;
    for (int32_t i = 0; i < V; i++) sum += isfinite(logits[i]) ? exp((double)logits[i] - mx) : 0.0;
    const float lse = mx + (float)log(sum > 0 ? sum : 1.0);
    out->id = tok;
    out->logprob = isfinite(logits[tok]) ? logits[tok] - lse : -INFINITY;
    int32_t n = 0;
    for (int32_t i = 0; i < V && n_top > 0; i++) {
        float v = logits[i];
        if (!isfinite(v)) continue;
        if (n == n_top && v <= out->top_logprob[n - 1]) continue;
        int32_t j = n < n_top ? n++ : n - 1;
        while (j > 0 && out->top_logprob[j - 1] < v) {
            out->top_logprob[j] = out->top_logprob[j - 1];
            out->top_id[j] = out->top_id[j - 1];
            j--;
        }
        out->top_logprob[j] = v;
        out->top_id[j] = i;
    }
    for (int32_t j = 0; j < n; j++) out->top_logprob[j] -= lse;
    out->n_top = n;
}

/* Sample from logits and stage the outcome in the slot (no lock: the slot
 * and the sampler belong to this thread). */
static void take_token(ks_sched *s, slot *sl, float *logits) {
    ks_sched_req *r = sl->req;
    ks_stop_out o = {0};
    if (r->logprobs) memcpy(r->lp_logits, logits, sizeof(float) * (size_t)s->n_vocab); /* the sampler edits logits */
    /* structured output: only tokens that keep the text a prefix of a valid
     * document that can still close within the budget */
    if (r->json && ks_json_constraint_mask(r->json, logits, r->max_tokens - sl->n_gen) == 0) {
        ks_stop_flush(sl->stop, &o);
        ks_sbuf_put(&sl->emit, o.text, o.len);
        sl->finish = KS_SCHED_FINISH_ERROR;
        sl->error = KS_SCHED_ERR_INTERNAL;
        snprintf(sl->message, sizeof sl->message, "response_format: no token of the vocabulary continues the JSON document");
        return;
    }
    int32_t tok = ks_sampler_sample(r->smp, logits);
    ks_sampler_accept(r->smp, tok);
    if (r->json) ks_json_constraint_accept(r->json, tok); /* false only for end-of-generation, handled below */
    if (!r->ignore_eos && ks_token_is_eog(s->model, tok)) {
        ks_stop_flush(sl->stop, &o);
        ks_sbuf_put(&sl->emit, o.text, o.len);
        sl->finish = KS_SCHED_FINISH_STOP;
        return;
    }
    if (r->logprobs) {
        ks_sched_logprob lp;
        logprob_of(r->lp_logits, s->n_vocab, tok, r->top_logprobs, &lp);
        ks_sbuf_put(&r->lp_stage, (const char *)&lp, sizeof lp);
    }
    sl->n_gen++;
    char piece[256];
    size_t np = 0;
    if (ks_token_to_piece(s->model, tok, piece, sizeof piece, &np) != KS_OK) np = 0;
    ks_status st = ks_stop_feed(sl->stop, piece, np, &o);
    if (st != KS_OK) { /* only a refused allocation: the strings were checked at submit */
        sl->finish = KS_SCHED_FINISH_ERROR;
        sl->error = st == KS_ERR_NOMEM ? KS_SCHED_ERR_NOMEM : KS_SCHED_ERR_INTERNAL;
        snprintf(sl->message, sizeof sl->message, "stop strings: %s (%s)", ks_status_str(st), ks_last_error());
        return;
    }
    ks_sbuf_put(&sl->emit, o.text, o.len);
    if (o.matched || (r->json && ks_json_constraint_done(r->json))) {
        if (!o.matched) { /* the document closed: release what stop matching held back */
            ks_stop_flush(sl->stop, &o);
            ks_sbuf_put(&sl->emit, o.text, o.len);
        }
        sl->finish = KS_SCHED_FINISH_STOP;
        return;
    }
    if (sl->n_gen >= r->max_tokens) {
        ks_stop_flush(sl->stop, &o);
        ks_sbuf_put(&sl->emit, o.text, o.len);
        sl->finish = KS_SCHED_FINISH_LENGTH;
        return;
    }
    sl->next_tok = tok;
    sl->decoding = true;
}

static void stage_error(slot *sl, ks_sched_error err, const char *what, ks_status st) {
    sl->finish = KS_SCHED_FINISH_ERROR;
    sl->error = err;
    snprintf(sl->message, sizeof sl->message, "%s: %s (%s)", what, ks_status_str(st), ks_last_error());
}

/* One step of group g, without the lock.  The slot set cannot change under
 * us: only this thread admits and ends. */
static void group_step(ks_sched *s, group *g, bool *did_decode, bool *did_prefill, bool *mixed, int32_t *paused,
                       int32_t *resumed, bool *cache_trim) {
    int32_t V = s->n_vocab, n = 0;
    /* under a cap: resume paused requests when room returned, pause the
     * newest while this step would not fit even with every layer offloaded */
    if (ks_sched_cache_fit(s, g)) *cache_trim = true;
    ks_sched_group_balance(s, g, paused, resumed);
    for (int32_t i = 0; i < s->p.n_parallel; i++) {
        slot *sl = &g->slots[i];
        if (sl->req && !sl->paused && sl->decoding && sl->finish == KS_SCHED_FINISH_NONE) {
            s->seqs[n] = i;
            s->toks[n] = sl->next_tok;
            n++;
        }
    }
    *did_decode = n > 0;
    *mixed = false; /* sequences of different policies in this one ks_decode */
    for (int32_t k = 1; k < n; k++)
        if (!ks_sched_policy_equal(&g->slots[s->seqs[k]].req->policy, &g->slots[s->seqs[0]].req->policy)) *mixed = true;
    if (n > 0) {
        ks_status st = ks_decode(g->ctx, s->seqs, s->toks, n, s->logits);
        for (int32_t k = 0; k < n; k++) {
            slot *sl = &g->slots[s->seqs[k]];
            if (st == KS_OK) take_token(s, sl, s->logits + (size_t)k * V);
            else stage_error(sl, st == KS_ERR_NOMEM ? KS_SCHED_ERR_NOMEM : KS_SCHED_ERR_INTERNAL, "decode", st);
        }
        if (st == KS_ERR_BACKEND) g->broken = true;
    }
    /* one prefill chunk: the earliest admitted prompt not yet prefilled */
    slot *pf = NULL;
    int32_t pi = -1;
    for (int32_t i = 0; i < s->p.n_parallel; i++) {
        slot *sl = &g->slots[i];
        if (sl->req && !sl->paused && !sl->decoding && sl->finish == KS_SCHED_FINISH_NONE &&
            (!pf || sl->order < pf->order)) {
            pf = sl;
            pi = i;
        }
    }
    *did_prefill = pf != NULL;
    if (pf && !g->broken) {
        ks_sched_req *r = pf->req;
        ks_prefix_cache *pc = r->no_cache ? NULL : s->p.cache;
        ks_status st = KS_OK;
        if (pf->n_fed == 0 && pc && ks_seq_len(g->ctx, pi) == 0) { /* start from the longest cached prefix */
            int32_t hit = 0;
            st = ks_prefix_restore(g->ctx, pc, pi, r->prompt, r->n_prompt, &hit);
            if (st == KS_OK) {
                pf->n_fed = hit;
                pf->n_cached = hit;
            }
        }
        int32_t left = r->n_prompt - pf->n_fed;
        int32_t m = pf->chunkable && left > s->p.n_batch ? s->p.n_batch : left;
        /* a sparse prefill's piece ends on its grid of blocks (KS_PREFILL_BLOCK_ROWS), so
         * that its blocks are computed whole and its prompt's blocks can be cached */
        bool sparse = r->policy.prefill[0] && strcmp(r->policy.prefill, "dense"); /* "": dense */
        int32_t over = m < left && sparse ? (pf->n_fed + m) % KS_PREFILL_BLOCK_ROWS : 0;
        if (over < m) m -= over;
        bool last = m == left;
        if (st == KS_OK)
            st = ks_prefill_rest(g->ctx, pc, pi, r->prompt, r->n_prompt, pf->n_fed + m, last ? s->pf_logits : NULL);
        if (st != KS_OK) {
            stage_error(pf, st == KS_ERR_NOMEM ? KS_SCHED_ERR_NOMEM : KS_SCHED_ERR_INTERNAL, "prefill", st);
            if (st == KS_ERR_BACKEND) g->broken = true;
        } else {
            pf->n_fed += m;
            if (last) take_token(s, pf, s->pf_logits);
        }
    }
}

static void rate_add(ks_sched *s, uint64_t n) {
    int64_t sec = (int64_t)ks_sched_now();
    int b = (int)(sec % RATE_BUCKETS);
    if (s->rate_sec[b] != sec) {
        s->rate_sec[b] = sec;
        s->rate_tok[b] = 0;
    }
    s->rate_tok[b] += n;
}

/* under mu: publish what the step staged. */
static void group_publish(ks_sched *s, group *g) {
    double now = ks_sched_now();
    uint64_t gen = 0;
    for (int32_t i = 0; i < s->p.n_parallel; i++) {
        slot *sl = &g->slots[i];
        ks_sched_req *r = sl->req;
        if (!r) continue;
        if (sl->n_cached >= 0) {
            r->n_cached = sl->n_cached;
            sl->n_cached = -1;
        }
        if (sl->n_gen > r->n_generated) {
            gen += (uint64_t)(sl->n_gen - r->n_generated);
            if (!r->t_first) r->t_first = now;
            r->n_generated = sl->n_gen;
            r->news = true;
        }
        if (sl->emit.n) {
            ks_sbuf_put(&r->out, sl->emit.p, sl->emit.n);
            sl->emit.n = 0;
            r->news = true;
        }
        if (r->lp_stage.n) {
            ks_sbuf_put(&r->lp_out, r->lp_stage.p, r->lp_stage.n);
            r->lp_stage.n = 0;
            r->news = true;
        }
        if (r->lp_stage.refused || r->lp_out.refused) { /* a record was lost: fail the request below */
            r->lp_stage.refused = false;
            sl->emit.refused = true;
        }
        if (sl->emit.refused || r->out.refused) { /* text was lost: the request fails rather than come back short */
            sl->emit.refused = false;
            sl->finish = KS_SCHED_FINISH_ERROR;
            sl->error = KS_SCHED_ERR_NOMEM;
            snprintf(sl->message, sizeof sl->message, "out of memory holding the generated text");
        }
        if (sl->finish != KS_SCHED_FINISH_NONE) {
            ks_sched_finish fin = sl->finish;
            sl->finish = KS_SCHED_FINISH_NONE;
            ks_sched_slot_end(s, g, i, fin, fin == KS_SCHED_FINISH_ERROR ? sl->error : KS_SCHED_ERR_NONE,
                     fin == KS_SCHED_FINISH_ERROR ? sl->message : NULL);
        } else if (r->news) {
            pthread_cond_broadcast(&r->cv);
        }
    }
    s->tok_gen += gen;
    if (gen) rate_add(s, gen);
    ks_sched_group_account(s, g);
}

void *ks_sched_main(void *arg) {
    ks_sched *s = arg;
    pthread_mutex_lock(&s->mu);
    while (!s->quit) {
        housekeeping(s);
        admit(s);
        group *g = NULL;
        for (int32_t k = 0; k < s->n_groups && !g; k++) {
            int32_t gi = (s->rr + k) % s->n_groups;
            if (s->groups[gi]->n_used > 0 && !s->groups[gi]->broken) {
                g = s->groups[gi];
                s->rr = (gi + 1) % s->n_groups;
            }
        }
        if (!g) {
            struct timespec ts;
            /* idle: wake for new work, or to recycle idle contexts / end the grace */
            ks_sched_deadline_in(&ts, s->n_groups > 1 || s->stopping ? 0.25 : 5.0);
            pthread_cond_timedwait(&s->work_cv, &s->mu, &ts);
            continue;
        }
        pthread_mutex_unlock(&s->mu);
        bool dec = false, pre = false, mixed = false;
        int32_t paused = 0, resumed = 0;
        bool trimmed = false;
        group_step(s, g, &dec, &pre, &mixed, &paused, &resumed, &trimmed);
        pthread_mutex_lock(&s->mu);
        s->cache_trims += trimmed;
        s->pauses += (uint64_t)paused;
        s->resumes += (uint64_t)resumed;
        s->n_paused += paused - resumed;
        s->steps += dec;
        s->mixed_steps += mixed;
        s->chunks += pre;
        group_publish(s, g);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}
