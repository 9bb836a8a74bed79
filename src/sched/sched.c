/*
 * sched.c — the continuous-batching scheduler (design in sched.h).
 *
 * One thread runs the loop: under the lock it reaps cancelled requests,
 * admits waiting ones into free slots (creating a group's context when
 * needed), recycles idle contexts, and picks the next group with work; then,
 * without the lock, it runs that group's step on the engine — one ks_decode
 * for every decoding slot and one prefill chunk — samples, detokenizes and
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
 * Everything here uses only the public API (kvsieve.h): the scheduler is an
 * application of the engine, and other applications can do what it does.
 */
#define _GNU_SOURCE
#include "sched/sched.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------ helpers -- */

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "kvsieve sched: out of memory (%zu bytes)\n", n);
        abort();
    }
    return p;
}
static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) {
        fprintf(stderr, "kvsieve sched: out of memory (%zu x %zu bytes)\n", n, size);
        abort();
    }
    return p;
}
static void *xrealloc(void *q, size_t n) {
    void *p = realloc(q, n ? n : 1);
    if (!p) {
        fprintf(stderr, "kvsieve sched: out of memory (%zu bytes)\n", n);
        abort();
    }
    return p;
}
static char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    return memcpy(xmalloc(n), s, n);
}

double ks_sched_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void deadline_in(struct timespec *ts, double seconds) {
    clock_gettime(CLOCK_MONOTONIC, ts);
    double whole = (double)(long)seconds;
    ts->tv_sec += (time_t)whole;
    ts->tv_nsec += (long)((seconds - whole) * 1e9);
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

/* Growable byte buffer, NUL-terminated. */
typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

static void sbuf_put(sbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2 + 64;
        b->p = xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

/* ------------------------------------------------------- stop strings -- */
/* Matching is by bytes on the detokenized text.  Whatever could still become
 * a stop string (the longest suffix that is a proper prefix of one) or is an
 * incomplete UTF-8 character stays held back; everything before it is
 * released.  The earliest-starting match wins; text after it is dropped. */

typedef struct stopm {
    char **stops;  /* [n] borrowed from the request */
    int32_t n;
    sbuf held;
    bool matched;
} stopm;

static size_t utf8_incomplete_tail(const char *t, size_t n) {
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        unsigned char c = (unsigned char)t[n - k];
        if ((c & 0xC0) == 0x80) continue; /* continuation byte: look further back */
        size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need > k ? k : 0;
    }
    return 0;
}

static size_t stop_partial_len(const stopm *m) {
    size_t best = 0;
    for (int32_t i = 0; i < m->n; i++) {
        size_t sl = strlen(m->stops[i]);
        for (size_t k = sl - 1; k > best; k--) /* proper prefixes, longest first */
            if (k <= m->held.n && !memcmp(m->held.p + m->held.n - k, m->stops[i], k)) {
                best = k;
                break;
            }
    }
    return best;
}

/* Feed piece; released bytes are appended to out.  Returns true on a match. */
static bool stop_feed(stopm *m, const char *piece, size_t len, sbuf *out) {
    if (m->matched) return true;
    sbuf_put(&m->held, piece, len);
    size_t at = (size_t)-1;
    for (int32_t i = 0; i < m->n; i++) {
        const char *p = memmem(m->held.p, m->held.n, m->stops[i], strlen(m->stops[i]));
        if (p && (size_t)(p - m->held.p) < at) at = (size_t)(p - m->held.p);
    }
    if (at != (size_t)-1) {
        sbuf_put(out, m->held.p, at);
        m->held.n = 0;
        m->matched = true;
        return true;
    }
    size_t keep = stop_partial_len(m), u = utf8_incomplete_tail(m->held.p, m->held.n);
    if (u > keep) keep = u;
    size_t rel = m->held.n - keep;
    sbuf_put(out, m->held.p, rel);
    memmove(m->held.p, m->held.p + rel, keep);
    m->held.n = keep;
    return false;
}

static void stop_flush(stopm *m, sbuf *out) {
    if (!m->matched && m->held.n) sbuf_put(out, m->held.p, m->held.n);
    m->held.n = 0;
}

/* ----------------------------------------------------------- policies -- */

ks_sched_policy ks_sched_policy_default(void) {
    ks_sched_policy p;
    memset(&p, 0, sizeof p);
    ks_context_params d = ks_context_default_params();
    snprintf(p.policy, sizeof p.policy, "%s", d.policy ? d.policy : "dense");
    p.budget = 0;
    p.sink = d.sink;
    p.window = d.window;
    p.page = d.page;
    p.dense_layers = d.dense_layers;
    return p;
}

static bool policy_equal(const ks_sched_policy *a, const ks_sched_policy *b) {
    return !strcmp(a->policy, b->policy) && a->budget == b->budget && a->sink == b->sink && a->window == b->window &&
           a->page == b->page && a->dense_layers == b->dense_layers && !strcmp(a->args, b->args);
}

bool ks_sched_policy_chunkable(const char *spec) {
    /* Policies with no prefill hook: their state after a prompt does not
     * depend on how the prompt was split into ks_prefill calls.  The engine
     * does not export this property yet; the list mirrors src/select/ and
     * tests/server/invariance.sh checks it for quest. */
    static const char *const safe[] = {"dense", "streaming", "quest", "chess"};
    if (!spec || !*spec) return false;
    const char *p = spec;
    while (*p) {
        const char *e = strchr(p, '+');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        bool ok = false;
        for (size_t i = 0; i < sizeof safe / sizeof safe[0]; i++)
            if (strlen(safe[i]) == n && !strncmp(safe[i], p, n)) ok = true;
        if (!ok) return false;
        p += n + (e != NULL);
    }
    return true;
}

/* ------------------------------------------------------------- structs -- */

struct ks_sched_req {
    int refs;                   /* client + scheduler; under mu */
    ks_sched_req *next;         /* waiting queue */
    uint64_t id;
    /* immutable after submit */
    int32_t *prompt;            /* [n_prompt] */
    int32_t n_prompt, max_tokens;
    char *stops[KS_SCHED_MAX_STOPS];
    int32_t n_stops;
    bool ignore_eos;
    ks_sched_policy policy;
    ks_sampler *smp;            /* created at submit; used by the scheduler thread only */
    /* under mu */
    ks_sched_state state;
    bool cancel, news;
    sbuf out;
    size_t out_taken;
    ks_sched_finish finish;
    ks_sched_error error;
    char message[1024];
    int32_t n_generated;
    double t_submit, t_admit, t_first;
    pthread_cond_t cv;
};

typedef struct slot {
    ks_sched_req *req;          /* NULL: free */
    int32_t n_fed;              /* prompt tokens prefilled */
    bool decoding;
    int32_t next_tok;           /* the token the next decode step feeds */
    int32_t n_gen;
    uint64_t order;             /* admission order (prefill FIFO) */
    stopm stop;
    /* staged by the step, published under the lock */
    sbuf emit;
    ks_sched_finish finish;
    ks_sched_error error;
    char message[256];
} slot;

typedef struct group {
    ks_sched_policy pol;
    ks_context *ctx;
    slot *slots;                /* [n_parallel] */
    int32_t n_used;
    int64_t mem_limit;          /* longest sequence the memory plan allows (-1: no plan) */
    bool chunkable, is_default, blocked, broken;
    int32_t offloaded;          /* layers in the slow tier (snapshot for metrics) */
    double idle_since;
    ks_stats stats;             /* last snapshot */
} group;

enum { MAX_GROUPS = 16, RATE_BUCKETS = 16, RATE_WINDOW = 10 };

struct ks_sched {
    const ks_model *model;
    ks_sched_params p;
    char *offload_dir;
    int32_t n_vocab;
    pthread_mutex_t mu;
    pthread_cond_t work_cv;     /* the scheduler thread waits here for work */
    pthread_t thread;
    bool quit, stopping;
    double stop_deadline;
    ks_sched_req *wait_head, *wait_tail;
    int32_t n_waiting;
    group *groups[MAX_GROUPS];
    int32_t n_groups, rr;
    uint64_t next_id, next_order;
    float *logits;              /* [n_parallel][n_vocab] decode output */
    float *pf_logits;           /* [n_vocab] */
    int32_t *seqs, *toks;       /* [n_parallel] */
    /* metrics (under mu) */
    ks_stats retired;
    uint64_t submitted, rejected, completed, cancelled, failed, tok_prompt, tok_gen, steps, chunks;
    uint64_t ctx_created, ctx_recycled;
    uint64_t rate_tok[RATE_BUCKETS];
    int64_t rate_sec[RATE_BUCKETS];
    double t_start;
};

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
    free(r->out.p);
    pthread_cond_destroy(&r->cv);
    free(r);
}

/* under mu */
static void req_unref(ks_sched_req *r) {
    if (--r->refs == 0) req_free(r);
}

/* under mu: the request is over; the caller has taken it out of the queue
 * or its slot and drops the scheduler's reference. */
static void req_finish(ks_sched *s, ks_sched_req *r, ks_sched_finish fin, ks_sched_error err, const char *msg) {
    r->state = KS_SCHED_FINISHED;
    r->finish = fin;
    r->error = err;
    if (msg) snprintf(r->message, sizeof r->message, "%s", msg);
    r->news = true;
    if (fin == KS_SCHED_FINISH_CANCELLED) s->cancelled++;
    else if (fin == KS_SCHED_FINISH_ERROR) s->failed++;
    else s->completed++;
    pthread_cond_broadcast(&r->cv);
    req_unref(r);
}

static void queue_remove(ks_sched *s, ks_sched_req *r) {
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

/* ------------------------------------------------------------- groups -- */

static void stats_add(ks_stats *a, const ks_stats *b) {
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

static ks_status group_create(ks_sched *s, const ks_sched_policy *pol, group **out, char *err, size_t err_cap) {
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
    group *g = xcalloc(1, sizeof *g);
    g->pol = *pol;
    g->ctx = ctx;
    g->slots = xcalloc((size_t)s->p.n_parallel, sizeof(slot));
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
static void group_destroy(ks_sched *s, int32_t gi) {
    group *g = s->groups[gi];
    ks_stats st;
    ks_context_stats(g->ctx, &st);
    stats_add(&s->retired, &st);
    ks_context_destroy(g->ctx);
    for (int32_t i = 0; i < s->p.n_parallel; i++) {
        free(g->slots[i].emit.p);
        free(g->slots[i].stop.held.p);
    }
    free(g->slots);
    free(g);
    s->groups[gi] = s->groups[--s->n_groups];
    s->groups[s->n_groups] = NULL;
    if (s->rr >= s->n_groups) s->rr = 0;
}

static group *group_find(ks_sched *s, const ks_sched_policy *pol) {
    for (int32_t i = 0; i < s->n_groups; i++)
        if (policy_equal(&s->groups[i]->pol, pol)) return s->groups[i];
    return NULL;
}

/* under mu: end the request in slot i of g (staged or given outcome). */
static void slot_end(ks_sched *s, group *g, int32_t i, ks_sched_finish fin, ks_sched_error err, const char *msg) {
    slot *sl = &g->slots[i];
    ks_sched_req *r = sl->req;
    if (!r) return;
    ks_seq_reset(g->ctx, i);
    sl->req = NULL;
    sl->decoding = false;
    sl->emit.n = 0;
    sl->stop.held.n = 0;
    sl->stop.matched = false;
    g->n_used--;
    if (g->n_used == 0) g->idle_since = ks_sched_now();
    req_finish(s, r, fin, err, msg);
}

/* under mu */
static void slot_admit(ks_sched *s, group *g, ks_sched_req *r) {
    int32_t i = 0;
    while (g->slots[i].req) i++;
    slot *sl = &g->slots[i];
    ks_seq_reset(g->ctx, i);
    sl->req = r;
    sl->n_fed = 0;
    sl->decoding = false;
    sl->n_gen = 0;
    sl->order = s->next_order++;
    sl->stop.stops = r->stops;
    sl->stop.n = r->n_stops;
    sl->stop.held.n = 0;
    sl->stop.matched = false;
    sl->emit.n = 0;
    sl->finish = KS_SCHED_FINISH_NONE;
    g->n_used++;
    r->state = KS_SCHED_RUNNING;
    r->t_admit = ks_sched_now();
    r->news = true;
    pthread_cond_broadcast(&r->cv);
}

/* ----------------------------------------------------------- the loop -- */

/* under mu: fail every waiting request of configuration pol. */
static void fail_waiting_like(ks_sched *s, const ks_sched_policy *pol, ks_sched_error err, const char *msg) {
    for (ks_sched_req *r = s->wait_head, *nx; r; r = nx) {
        nx = r->next;
        if (policy_equal(&r->policy, pol)) {
            queue_remove(s, r);
            req_finish(s, r, KS_SCHED_FINISH_ERROR, err, msg);
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
        group *g = group_find(s, &r->policy);
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
                group_destroy(s, victim);
            }
            char err[768];
            group *ng = NULL;
            if (group_create(s, &r->policy, &ng, err, sizeof err) != KS_OK) {
                ks_sched_policy pol = r->policy;
                /* nx may be failed too: restart the walk after failing them all */
                fail_waiting_like(s, &pol, KS_SCHED_ERR_INVALID, err);
                nx = s->wait_head;
                continue;
            }
            ng->is_default = policy_equal(&r->policy, &s->p.defaults);
            s->groups[s->n_groups++] = ng;
            g = ng;
        }
        if (g->blocked || need_new || g->n_used >= s->p.n_parallel) {
            g->blocked = true;
            continue;
        }
        int64_t worst = (int64_t)r->n_prompt + r->max_tokens;
        if (g->mem_limit >= 0 && worst > g->mem_limit) {
            char msg[256];
            snprintf(msg, sizeof msg,
                     "the request needs up to %lld tokens per sequence; under the memory cap the longest "
                     "sequence that fits with every layer offloaded is %lld tokens",
                     (long long)worst, (long long)g->mem_limit);
            queue_remove(s, r);
            req_finish(s, r, KS_SCHED_FINISH_ERROR, KS_SCHED_ERR_TOO_LONG, msg);
            continue;
        }
        queue_remove(s, r);
        slot_admit(s, g, r);
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
            if (r->cancel) slot_end(s, g, i, KS_SCHED_FINISH_CANCELLED, KS_SCHED_ERR_NONE, "cancelled");
            else if (g->broken)
                slot_end(s, g, i, KS_SCHED_FINISH_ERROR, KS_SCHED_ERR_INTERNAL,
                         "the engine failed on another sequence of this request's context");
            else if (past_grace)
                slot_end(s, g, i, KS_SCHED_FINISH_ERROR, KS_SCHED_ERR_SHUTDOWN,
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
            group_destroy(s, gi);
        }
    }
}

/* Sample from logits and stage the outcome in the slot (no lock: the slot
 * and the sampler belong to this thread). */
static void take_token(ks_sched *s, slot *sl, float *logits) {
    ks_sched_req *r = sl->req;
    int32_t tok = ks_sampler_sample(r->smp, logits);
    ks_sampler_accept(r->smp, tok);
    if (!r->ignore_eos && ks_token_is_eog(s->model, tok)) {
        stop_flush(&sl->stop, &sl->emit);
        sl->finish = KS_SCHED_FINISH_STOP;
        return;
    }
    sl->n_gen++;
    char piece[256];
    size_t np = 0;
    if (ks_token_to_piece(s->model, tok, piece, sizeof piece, &np) != KS_OK) np = 0;
    if (stop_feed(&sl->stop, piece, np, &sl->emit)) {
        sl->finish = KS_SCHED_FINISH_STOP;
        return;
    }
    if (sl->n_gen >= r->max_tokens) {
        stop_flush(&sl->stop, &sl->emit);
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
static void group_step(ks_sched *s, group *g, bool *did_decode, bool *did_prefill) {
    int32_t V = s->n_vocab, n = 0;
    for (int32_t i = 0; i < s->p.n_parallel; i++) {
        slot *sl = &g->slots[i];
        if (sl->req && sl->decoding && sl->finish == KS_SCHED_FINISH_NONE) {
            s->seqs[n] = i;
            s->toks[n] = sl->next_tok;
            n++;
        }
    }
    *did_decode = n > 0;
    if (n > 0) {
        ks_status st = ks_decode(g->ctx, s->seqs, s->toks, n, s->logits);
        for (int32_t k = 0; k < n; k++) {
            slot *sl = &g->slots[s->seqs[k]];
            if (st == KS_OK) take_token(s, sl, s->logits + (size_t)k * V);
            else stage_error(sl, KS_SCHED_ERR_INTERNAL, "decode", st);
        }
        if (st == KS_ERR_BACKEND) g->broken = true;
    }
    /* one prefill chunk: the earliest admitted prompt not yet prefilled */
    slot *pf = NULL;
    int32_t pi = -1;
    for (int32_t i = 0; i < s->p.n_parallel; i++) {
        slot *sl = &g->slots[i];
        if (sl->req && !sl->decoding && sl->finish == KS_SCHED_FINISH_NONE && (!pf || sl->order < pf->order)) {
            pf = sl;
            pi = i;
        }
    }
    *did_prefill = pf != NULL;
    if (pf && !g->broken) {
        ks_sched_req *r = pf->req;
        int32_t left = r->n_prompt - pf->n_fed;
        int32_t m = g->chunkable && left > s->p.n_batch ? s->p.n_batch : left;
        bool last = m == left;
        ks_status st = ks_prefill(g->ctx, pi, r->prompt + pf->n_fed, m, last ? s->pf_logits : NULL, NULL);
        if (st != KS_OK) {
            stage_error(pf, st == KS_ERR_NOMEM ? KS_SCHED_ERR_TOO_LONG : KS_SCHED_ERR_INTERNAL, "prefill", st);
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
        if (sl->n_gen > r->n_generated) {
            gen += (uint64_t)(sl->n_gen - r->n_generated);
            if (!r->t_first) r->t_first = now;
            r->n_generated = sl->n_gen;
            r->news = true;
        }
        if (sl->emit.n) {
            sbuf_put(&r->out, sl->emit.p, sl->emit.n);
            sl->emit.n = 0;
            r->news = true;
        }
        if (sl->finish != KS_SCHED_FINISH_NONE) {
            ks_sched_finish fin = sl->finish;
            sl->finish = KS_SCHED_FINISH_NONE;
            slot_end(s, g, i, fin, fin == KS_SCHED_FINISH_ERROR ? sl->error : KS_SCHED_ERR_NONE,
                     fin == KS_SCHED_FINISH_ERROR ? sl->message : NULL);
        } else if (r->news) {
            pthread_cond_broadcast(&r->cv);
        }
    }
    s->tok_gen += gen;
    if (gen) rate_add(s, gen);
    ks_context_stats(g->ctx, &g->stats);
    ks_memplan_info mi;
    ks_context_memplan(g->ctx, &mi);
    g->offloaded = mi.active ? mi.offloaded : 0;
}

static void *sched_main(void *arg) {
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
            deadline_in(&ts, s->n_groups > 1 || s->stopping ? 0.25 : 5.0);
            pthread_cond_timedwait(&s->work_cv, &s->mu, &ts);
            continue;
        }
        pthread_mutex_unlock(&s->mu);
        bool dec = false, pre = false;
        group_step(s, g, &dec, &pre);
        pthread_mutex_lock(&s->mu);
        s->steps += dec;
        s->chunks += pre;
        group_publish(s, g);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
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
    ks_sched *s = xcalloc(1, sizeof *s);
    s->model = model;
    s->p = p;
    s->offload_dir = p.kv_offload_dir ? xstrdup(p.kv_offload_dir) : NULL;
    s->p.kv_offload_dir = NULL;
    s->n_vocab = ks_model_n_vocab(model);
    s->logits = xmalloc(sizeof(float) * (size_t)p.n_parallel * (size_t)s->n_vocab);
    s->pf_logits = xmalloc(sizeof(float) * (size_t)s->n_vocab);
    s->seqs = xmalloc(sizeof(int32_t) * (size_t)p.n_parallel);
    s->toks = xmalloc(sizeof(int32_t) * (size_t)p.n_parallel);
    s->t_start = ks_sched_now();
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->work_cv, &ca);
    pthread_condattr_destroy(&ca);
    group *g = NULL;
    ks_status st = group_create(s, &p.defaults, &g, err, err_cap);
    if (st != KS_OK) {
        s->n_groups = 0;
        ks_sched_destroy(s);
        return st;
    }
    g->is_default = true;
    s->groups[s->n_groups++] = g;
    if (pthread_create(&s->thread, NULL, sched_main, s) != 0) {
        snprintf(err, err_cap, "cannot start the scheduler thread");
        pthread_mutex_lock(&s->mu);
        group_destroy(s, 0);
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
        queue_remove(s, r);
        req_finish(s, r, KS_SCHED_FINISH_ERROR, KS_SCHED_ERR_SHUTDOWN, "the server is shutting down");
    }
    while (s->n_groups) {
        group *g = s->groups[s->n_groups - 1];
        for (int32_t i = 0; i < s->p.n_parallel; i++)
            if (g->slots[i].req)
                slot_end(s, g, i, KS_SCHED_FINISH_ERROR, KS_SCHED_ERR_SHUTDOWN, "the server is shutting down");
        group_destroy(s, s->n_groups - 1);
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
    r = xcalloc(1, sizeof *r);
    if (ks_sampler_create(p->sampling, s->n_vocab, &r->smp) != KS_OK)
        REFUSE(KS_SCHED_ERR_INVALID, "sampling parameters: %s", ks_last_error());
    r->prompt = xmalloc(sizeof(int32_t) * (size_t)p->n_prompt);
    memcpy(r->prompt, p->prompt, sizeof(int32_t) * (size_t)p->n_prompt);
    r->n_prompt = p->n_prompt;
    r->max_tokens = p->max_tokens;
    for (int32_t i = 0; i < p->n_stops; i++) r->stops[i] = xstrdup(p->stops[i]);
    r->n_stops = p->n_stops;
    r->ignore_eos = p->ignore_eos;
    r->policy = p->policy;
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
        free(r->prompt);
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
        deadline_in(&ts, timeout_s);
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
    if (r->out.n > r->out_taken) {
        out->len = r->out.n - r->out_taken;
        out->text = xmalloc(out->len + 1);
        memcpy(out->text, r->out.p + r->out_taken, out->len);
        out->text[out->len] = 0;
        r->out_taken = r->out.n = 0; /* everything was taken: reuse the buffer */
    }
    out->finish = r->finish;
    out->error = r->error;
    snprintf(out->message, sizeof out->message, "%s", r->message);
    out->n_prompt = r->n_prompt;
    out->n_generated = r->n_generated;
    out->t_submit = r->t_submit;
    out->t_admit = r->t_admit;
    out->t_first = r->t_first;
    pthread_mutex_unlock(&s->mu);
    return news;
}

void ks_sched_req_cancel(ks_sched *s, ks_sched_req *r) {
    pthread_mutex_lock(&s->mu);
    if (r->state == KS_SCHED_WAITING) {
        queue_remove(s, r);
        req_finish(s, r, KS_SCHED_FINISH_CANCELLED, KS_SCHED_ERR_NONE, "cancelled");
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
    req_unref(r);
    pthread_mutex_unlock(&s->mu);
}

void ks_sched_shutdown(ks_sched *s, double grace_s) {
    pthread_mutex_lock(&s->mu);
    if (!s->stopping) {
        s->stopping = true;
        s->stop_deadline = ks_sched_now() + (grace_s > 0 ? grace_s : 0);
        while (s->wait_head) {
            ks_sched_req *r = s->wait_head;
            queue_remove(s, r);
            req_finish(s, r, KS_SCHED_FINISH_ERROR, KS_SCHED_ERR_SHUTDOWN,
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
        stats_add(&m->engine, &g->stats);
        m->layers_offloaded += g->offloaded;
    }
    m->requests_submitted = s->submitted;
    m->requests_rejected = s->rejected;
    m->requests_completed = s->completed;
    m->requests_cancelled = s->cancelled;
    m->requests_failed = s->failed;
    m->tokens_prompt = s->tok_prompt;
    m->tokens_generated = s->tok_gen;
    m->decode_steps = s->steps;
    m->prefill_chunks = s->chunks;
    m->contexts_created = s->ctx_created;
    m->contexts_recycled = s->ctx_recycled;
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
