/*
 * sched.c — the continuous-batching scheduler's API (design in sched.h):
 * parameters, policies, requests (submit, take, cancel, release), shutdown
 * and metrics.  The thread and the groups are in loop.c and group.c.
 *
 * One thread runs the loop: under the lock it reaps cancelled requests,
 * admits waiting ones into free slots (setting each request's policy on its
 * sequence), recycles idle contexts, and picks the next context with work;
 * then, without the lock, it runs that context's step on the engine — one
 * ks_decode for every decoding slot, whatever their policies, and one
 * prefill chunk — samples, detokenizes and
 * matches stop strings into per-slot staging buffers; then, under the lock
 * again, it publishes the staged text and finishes what finished.  Clients
 * never touch a context, so the engine needs no locking of its own; they
 * only read and write request state under the lock, and wait on their
 * request's condition variable.
 *
 * A request is shared by its client and the scheduler and is reference
 * counted: the scheduler's reference goes when the request leaves the queue
 * or its slot, the client's at ks_sched_req_release.
 *
 * The engine is used only through its public API (kvsieve.h): the scheduler
 * is an application of the engine, and other applications can do what it
 * does.  Besides, core.h gives it the allocator and sample/stop.h the
 * stop-string matcher `kvsieve run` uses (so both release the same text).
 */
#define _GNU_SOURCE
#include "sched/internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

double ks_sched_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void ks_sched_deadline_in(struct timespec *ts, double seconds) {
    clock_gettime(CLOCK_MONOTONIC, ts);
    double whole = (double)(long)seconds;
    ts->tv_sec += (time_t)whole;
    ts->tv_nsec += (long)((seconds - whole) * 1e9);
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}


/* ----------------------------------------------------------- policies -- */

ks_sched_policy ks_sched_policy_default(void) {
    return (ks_sched_policy){.spec = ks_policy_spec_default(), .page = ks_context_default_params().page};
}

bool ks_sched_policy_equal(const ks_sched_policy *a, const ks_sched_policy *b) {
    return a->page == b->page && ks_policy_spec_equal(&a->spec, &b->spec);
}

bool ks_sched_policy_chunkable(const char *spec) {
    return ks_policy_prefill_chunkable(spec); /* the engine's policy registry decides */
}

ks_sched_params ks_sched_default_params(void) {
    ks_sched_params p;
    memset(&p, 0, sizeof p);
    p.n_parallel = 4;
    p.n_batch = 256;
    p.kv_type = KS_KV_F16;
    p.max_waiting = 64;
    p.max_groups = 0; /* 4, or 1 with a memory cap */
    p.defaults = ks_sched_policy_default();
    return p;
}


/* ------------------------------------------------------------ requests -- */

static void req_free(ks_sched_req *r) {
    free(r->prompt);
    for (int32_t i = 0; i < r->n_stops; i++) free(r->stops[i]);
    ks_sampler_destroy(r->smp);
    ks_json_constraint_destroy(r->json);
    free(r->out.p);
    free(r->lp_logits);
    free(r->lp_stage.p);
    free(r->lp_out.p);
    pthread_cond_destroy(&r->cv);
    free(r);
}

/* under mu */
void ks_sched_req_unref(ks_sched_req *r) {
    if (--r->refs == 0) req_free(r);
}

/* under mu: the request is over; the caller has taken it out of the queue
 * or its slot and drops the scheduler's reference. */
void ks_sched_req_finish(ks_sched *s, ks_sched_req *r, ks_sched_finish fin, ks_sched_error err, const char *msg) {
    r->state = KS_SCHED_FINISHED;
    r->finish = fin;
    r->error = err;
    if (msg) snprintf(r->message, sizeof r->message, "%s", msg);
    r->news = true;
    if (fin == KS_SCHED_FINISH_CANCELLED) s->cancelled++;
    else if (fin == KS_SCHED_FINISH_ERROR) s->failed++;
    else s->completed++;
    pthread_cond_broadcast(&r->cv);
    ks_sched_req_unref(r);
}

void ks_sched_queue_remove(ks_sched *s, ks_sched_req *r) {
    ks_sched_req **pp = &s->wait_head, *prev = NULL;
    while (*pp && *pp != r) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    if (!*pp) return;
    *pp = r->next;
    if (s->wait_tail == r) s->wait_tail = prev;
    r->next = NULL;
    s->n_waiting--;
}

/* ---------------------------------------------------------------- API -- */

ks_status ks_sched_create(const ks_model *model, const ks_sched_params *params, ks_sched **out, char *err,
                          size_t err_cap) {
    if (!model || !params || !out) {
        snprintf(err, err_cap, "NULL argument");
        return KS_ERR_INVALID_ARG;
    }
    ks_sched_params p = *params;
    int32_t train = ks_model_n_ctx_train(model);
    if (p.n_ctx <= 0) p.n_ctx = train < 4096 ? train : 4096;
    if (p.n_parallel <= 0 || p.n_parallel > 256 || p.n_batch <= 0 || p.max_waiting < 0) {
        snprintf(err, err_cap, "bad parameters: parallel %d (1..256), batch %d, max waiting %d", p.n_parallel,
                 p.n_batch, p.max_waiting);
        return KS_ERR_INVALID_ARG;
    }
    if (p.max_groups <= 0) p.max_groups = p.mem_cap > 0 ? 1 : 4;
    if (p.max_groups > MAX_GROUPS) p.max_groups = MAX_GROUPS;
    ks_sched *s = ks_calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, err_cap, "out of memory for the scheduler");
        return KS_ERR_NOMEM;
    }
    s->model = model;
    s->p = p;
    s->offload_dir = p.kv_offload_dir ? ks_strdup(p.kv_offload_dir) : NULL;
    s->p.kv_offload_dir = NULL;
    s->n_vocab = ks_model_n_vocab(model);
    s->logits = ks_malloc(sizeof(float) * (size_t)p.n_parallel * (size_t)s->n_vocab);
    s->pf_logits = ks_malloc(sizeof(float) * (size_t)s->n_vocab);
    s->seqs = ks_malloc(sizeof(int32_t) * (size_t)p.n_parallel);
    s->toks = ks_malloc(sizeof(int32_t) * (size_t)p.n_parallel);
    s->t_start = ks_sched_now();
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->work_cv, &ca);
    pthread_condattr_destroy(&ca);
    group *g = NULL;
    ks_status st = KS_OK;
    if ((p.kv_offload_dir && !s->offload_dir) || !s->logits || !s->pf_logits || !s->seqs || !s->toks) {
        snprintf(err, err_cap, "out of memory for the scheduler's buffers (%d slots)", p.n_parallel);
        st = KS_ERR_NOMEM;
    }
    if (st == KS_OK) st = ks_sched_group_create(s, p.defaults.page, &g, err, err_cap);
    if (st != KS_OK) {
        s->n_groups = 0;
        ks_sched_destroy(s);
        return st;
    }
    g->is_default = true;
    s->groups[s->n_groups++] = g;
    if (pthread_create(&s->thread, NULL, ks_sched_main, s) != 0) {
        snprintf(err, err_cap, "cannot start the scheduler thread");
        pthread_mutex_lock(&s->mu);
        ks_sched_group_destroy(s, 0);
        pthread_mutex_unlock(&s->mu);
        ks_sched_destroy(s);
        return KS_ERR_INVALID_ARG;
    }
    *out = s;
    return KS_OK;
}

void ks_sched_destroy(ks_sched *s) {
    if (!s) return;
    if (s->thread) {
        pthread_mutex_lock(&s->mu);
        s->quit = true;
        pthread_cond_broadcast(&s->work_cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    pthread_mutex_lock(&s->mu);
    while (s->wait_head) {
        ks_sched_req *r = s->wait_head;
        ks_sched_queue_remove(s, r);
        ks_sched_req_finish(s, r, KS_SCHED_FINISH_ERROR, KS_SCHED_ERR_SHUTDOWN, "the server is shutting down");
    }
    while (s->n_groups) {
        group *g = s->groups[s->n_groups - 1];
        for (int32_t i = 0; i < s->p.n_parallel; i++)
            if (g->slots[i].req)
                ks_sched_slot_end(s, g, i, KS_SCHED_FINISH_ERROR, KS_SCHED_ERR_SHUTDOWN, "the server is shutting down");
        ks_sched_group_destroy(s, s->n_groups - 1);
    }
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->work_cv);
    free(s->offload_dir);
    free(s->logits);
    free(s->pf_logits);
    free(s->seqs);
    free(s->toks);
    free(s);
}

ks_sched_req *ks_sched_submit(ks_sched *s, const ks_sched_req_params *p, ks_sched_error *why, char *msg,
                              size_t msg_cap) {
#define REFUSE(code, ...)                       \
    do {                                        \
        *why = (code);                          \
        snprintf(msg, msg_cap, __VA_ARGS__);    \
        goto refused;                           \
    } while (0)
    ks_sched_req *r = NULL;
    if (!p->prompt || p->n_prompt < 1) REFUSE(KS_SCHED_ERR_INVALID, "the prompt has no tokens");
    if (p->max_tokens < 1) REFUSE(KS_SCHED_ERR_INVALID, "max_tokens must be at least 1");
    if (p->n_stops < 0 || p->n_stops > KS_SCHED_MAX_STOPS)
        REFUSE(KS_SCHED_ERR_INVALID, "at most %d stop strings", KS_SCHED_MAX_STOPS);
    for (int32_t i = 0; i < p->n_stops; i++)
        if (!p->stops[i] || !p->stops[i][0]) REFUSE(KS_SCHED_ERR_INVALID, "stop strings must not be empty");
    for (int32_t i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || p->prompt[i] >= s->n_vocab)
            REFUSE(KS_SCHED_ERR_INVALID, "token id %d out of range [0, %d)", p->prompt[i], s->n_vocab);
    if (p->n_prompt >= s->p.n_ctx || (int64_t)p->n_prompt + p->max_tokens > s->p.n_ctx)
        REFUSE(KS_SCHED_ERR_TOO_LONG,
               "This model's maximum context length is %d tokens. However, you requested %lld tokens "
               "(%d in the prompt, %d for the completion). Please reduce the prompt or the completion length.",
               s->p.n_ctx, (long long)p->n_prompt + p->max_tokens, p->n_prompt, p->max_tokens);
    r = ks_calloc(1, sizeof *r);
    if (!r) REFUSE(KS_SCHED_ERR_NOMEM, "out of memory for the request");
    ks_status sst = ks_sampler_create(p->sampling, s->n_vocab, &r->smp);
    if (sst != KS_OK)
        REFUSE(sst == KS_ERR_NOMEM ? KS_SCHED_ERR_NOMEM : KS_SCHED_ERR_INVALID, "sampling parameters: %s", ks_last_error());
    if (p->json_schema) {
        sst = ks_json_constraint_create_text(s->model, p->json_schema, &r->json);
        if (sst != KS_OK)
            REFUSE(sst == KS_ERR_NOMEM ? KS_SCHED_ERR_NOMEM : KS_SCHED_ERR_INVALID, "response_format: %s", ks_last_error());
    }
    r->prompt = ks_malloc(sizeof(int32_t) * (size_t)p->n_prompt);
    if (!r->prompt) REFUSE(KS_SCHED_ERR_NOMEM, "out of memory for a prompt of %d tokens", p->n_prompt);
    memcpy(r->prompt, p->prompt, sizeof(int32_t) * (size_t)p->n_prompt);
    r->n_prompt = p->n_prompt;
    r->max_tokens = p->max_tokens;
    r->n_stops = p->n_stops;
    for (int32_t i = 0; i < p->n_stops; i++)
        if (!(r->stops[i] = ks_strdup(p->stops[i]))) REFUSE(KS_SCHED_ERR_NOMEM, "out of memory for the stop strings");
    r->ignore_eos = p->ignore_eos;
    r->policy = p->policy;
    r->no_cache = p->no_prompt_cache;
    if (p->logprobs) {
        if (p->top_logprobs < 0 || p->top_logprobs > KS_SCHED_MAX_TOP_LOGPROBS)
            REFUSE(KS_SCHED_ERR_INVALID, "top_logprobs must be in [0, %d]", KS_SCHED_MAX_TOP_LOGPROBS);
        r->logprobs = true;
        r->top_logprobs = p->top_logprobs;
        r->lp_logits = ks_malloc(sizeof(float) * (size_t)s->n_vocab);
        if (!r->lp_logits) REFUSE(KS_SCHED_ERR_NOMEM, "out of memory for the logprobs");
    }
    /* the repetition penalty sees the prompt, as in `kvsieve run` */
    for (int32_t i = 0; i < p->n_prompt; i++) ks_sampler_accept(r->smp, p->prompt[i]);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->cv, &ca);
    pthread_condattr_destroy(&ca);
    r->refs = 2;
    r->t_submit = ks_sched_now();
    pthread_mutex_lock(&s->mu);
    if (s->stopping || s->quit) {
        pthread_mutex_unlock(&s->mu);
        REFUSE(KS_SCHED_ERR_SHUTDOWN, "the server is shutting down");
    }
    if (s->n_waiting >= s->p.max_waiting) {
        s->rejected++;
        int32_t nw = s->n_waiting;
        pthread_mutex_unlock(&s->mu);
        REFUSE(KS_SCHED_ERR_QUEUE_FULL, "too many requests waiting (%d); retry later", nw);
    }
    r->id = ++s->next_id;
    r->state = KS_SCHED_WAITING;
    if (s->wait_tail) s->wait_tail->next = r;
    else s->wait_head = r;
    s->wait_tail = r;
    s->n_waiting++;
    s->submitted++;
    s->tok_prompt += (uint64_t)p->n_prompt;
    pthread_cond_broadcast(&s->work_cv);
    pthread_mutex_unlock(&s->mu);
    *why = KS_SCHED_ERR_NONE;
    return r;
refused:
    if (r) {
        if (r->smp) {
            ks_sampler_destroy(r->smp);
            r->smp = NULL;
        }
        ks_json_constraint_destroy(r->json);
        free(r->prompt);
        free(r->lp_logits);
        for (int32_t i = 0; i < r->n_stops; i++) free(r->stops[i]);
        if (r->refs) pthread_cond_destroy(&r->cv);
        free(r);
    }
    return NULL;
#undef REFUSE
}

bool ks_sched_req_take(ks_sched *s, ks_sched_req *r, double timeout_s, ks_sched_update *out) {
    pthread_mutex_lock(&s->mu);
    if (!r->news && timeout_s > 0) {
        struct timespec ts;
        ks_sched_deadline_in(&ts, timeout_s);
        while (!r->news) {
            int e = pthread_cond_timedwait(&r->cv, &s->mu, &ts);
            if (e == ETIMEDOUT) break;
        }
    }
    bool news = r->news;
    r->news = false;
    out->state = r->state;
    out->text = NULL;
    out->len = 0;
    /* text that cannot be copied out stays for the next take */
    if (r->out.n > r->out_taken) {
        size_t len = r->out.n - r->out_taken;
        if ((out->text = ks_malloc(len + 1))) {
            out->len = len;
            memcpy(out->text, r->out.p + r->out_taken, out->len);
            out->text[out->len] = 0;
            r->out_taken = r->out.n = 0; /* everything was taken: reuse the buffer */
        } else {
            r->news = true;
            news = true;
            if (out->state == KS_SCHED_FINISHED) out->state = KS_SCHED_RUNNING; /* not over before its text is out */
        }
    }
    out->finish = r->finish;
    out->error = r->error;
    snprintf(out->message, sizeof out->message, "%s", r->message);
    out->n_prompt = r->n_prompt;
    out->n_generated = r->n_generated;
    out->n_cached = r->n_cached;
    out->t_submit = r->t_submit;
    out->t_admit = r->t_admit;
    out->t_first = r->t_first;
    out->logprobs = NULL;
    out->n_logprobs = 0;
    if (r->lp_out.n) { /* records that cannot be copied out stay for the next take, with their text */
        if ((out->logprobs = ks_malloc(r->lp_out.n))) {
            memcpy(out->logprobs, r->lp_out.p, r->lp_out.n);
            out->n_logprobs = (int32_t)(r->lp_out.n / sizeof(ks_sched_logprob));
            r->lp_out.n = 0;
        } else {
            r->news = true;
            news = true;
            if (out->state == KS_SCHED_FINISHED) out->state = KS_SCHED_RUNNING;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return news;
}

void ks_sched_req_cancel(ks_sched *s, ks_sched_req *r) {
    pthread_mutex_lock(&s->mu);
    if (r->state == KS_SCHED_WAITING) {
        ks_sched_queue_remove(s, r);
        ks_sched_req_finish(s, r, KS_SCHED_FINISH_CANCELLED, KS_SCHED_ERR_NONE, "cancelled");
    } else if (r->state == KS_SCHED_RUNNING && !r->cancel) {
        r->cancel = true;
        pthread_cond_broadcast(&s->work_cv);
    }
    pthread_mutex_unlock(&s->mu);
}

void ks_sched_req_release(ks_sched *s, ks_sched_req *r) {
    if (!r) return;
    ks_sched_req_cancel(s, r);
    pthread_mutex_lock(&s->mu);
    ks_sched_req_unref(r);
    pthread_mutex_unlock(&s->mu);
}

void ks_sched_shutdown(ks_sched *s, double grace_s) {
    pthread_mutex_lock(&s->mu);
    if (!s->stopping) {
        s->stopping = true;
        s->stop_deadline = ks_sched_now() + (grace_s > 0 ? grace_s : 0);
        while (s->wait_head) {
            ks_sched_req *r = s->wait_head;
            ks_sched_queue_remove(s, r);
            ks_sched_req_finish(s, r, KS_SCHED_FINISH_ERROR, KS_SCHED_ERR_SHUTDOWN,
                       "the server is shutting down; the request was not started");
        }
    } else if (grace_s <= 0) {
        s->stop_deadline = ks_sched_now(); /* a second call: end now */
    }
    pthread_cond_broadcast(&s->work_cv);
    pthread_mutex_unlock(&s->mu);
}

bool ks_sched_idle(ks_sched *s) {
    pthread_mutex_lock(&s->mu);
    bool idle = s->n_waiting == 0;
    for (int32_t i = 0; i < s->n_groups && idle; i++) idle = s->groups[i]->n_used == 0;
    pthread_mutex_unlock(&s->mu);
    return idle;
}

void ks_sched_get_metrics(ks_sched *s, ks_sched_metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_lock(&s->mu);
    m->waiting = s->n_waiting;
    m->groups = s->n_groups;
    m->n_parallel = s->p.n_parallel;
    m->n_ctx = s->p.n_ctx;
    m->max_waiting = s->p.max_waiting;
    m->engine = s->retired;
    for (int32_t i = 0; i < s->n_groups; i++) {
        group *g = s->groups[i];
        m->running += g->n_used;
        ks_sched_stats_add(&m->engine, &g->stats);
        m->layers_offloaded += g->offloaded;
        m->kv_bytes_fast += g->kv_fast;
        m->kv_bytes_slow += g->kv_slow;
    }
    m->requests_submitted = s->submitted;
    m->requests_rejected = s->rejected;
    m->requests_completed = s->completed;
    m->requests_cancelled = s->cancelled;
    m->requests_failed = s->failed;
    m->tokens_prompt = s->tok_prompt;
    m->tokens_generated = s->tok_gen;
    m->decode_steps = s->steps;
    m->decode_steps_mixed = s->mixed_steps;
    m->prefill_chunks = s->chunks;
    m->contexts_created = s->ctx_created;
    m->contexts_recycled = s->ctx_recycled;
    m->pauses = s->pauses;
    m->resumes = s->resumes;
    m->paused = s->n_paused;
    m->cache_trims = s->cache_trims;
    if (s->p.cache) {
        m->cache_on = true;
        ks_prefix_cache_get_stats(s->p.cache, &m->cache);
    }
    double now = ks_sched_now();
    int64_t sec = (int64_t)now;
    uint64_t tok = 0;
    for (int b = 0; b < RATE_BUCKETS; b++)
        if (s->rate_sec[b] > sec - RATE_WINDOW && s->rate_sec[b] <= sec) tok += s->rate_tok[b];
    double span = now - s->t_start;
    if (span > RATE_WINDOW) span = RATE_WINDOW;
    m->tokens_per_second = span > 0 ? (double)tok / span : 0;
    pthread_mutex_unlock(&s->mu);
}
