/*
 * internal.h — the scheduler's shared state, for its own files only:
 * sched.c (the API: requests, submit, take, cancel, metrics), group.c
 * (contexts, one per KV page size in use: its slots, admission into a slot
 * with the request's own policy, and the end of one), loop.c (the scheduler thread: admission, housekeeping, one step of a
 * group, publishing; stop strings with the engine's matcher, sample/stop.h,
 * the one `kvsieve run` uses).  Locking as in sched.h:
 * fields marked "under mu" are read and written with ks_sched.mu held;
 * contexts and slots' staging buffers belong to the scheduler thread.
 */
#ifndef KS_SCHED_INTERNAL_H
#define KS_SCHED_INTERNAL_H

#include "core/core.h"
#include "sample/json_constraint.h"
#include "sample/stop.h"
#include "sched/buf.h"
#include "sched/sched.h"

#include <pthread.h>
#include <time.h>

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
    bool no_cache;              /* cache_prompt: false */
    ks_sampler *smp;            /* created at submit; used by the scheduler thread only */
    bool logprobs;
    int32_t top_logprobs;
    float *lp_logits;           /* [n_vocab] with logprobs: the logits before the sampler changes them (scheduler thread) */
    ks_sbuf lp_stage;           /* ks_sched_logprob records of the running step (scheduler thread) */
    ks_sbuf lp_out;             /* published records not yet taken (under mu) */
    ks_json_constraint *json;   /* response_format's constraint (NULL: none); scheduler thread only */
    /* under mu */
    ks_sched_state state;
    bool cancel, news;
    ks_sbuf out;
    size_t out_taken;
    ks_sched_finish finish;
    ks_sched_error error;
    char message[1024];
    int32_t n_generated;
    int32_t n_cached;           /* prompt tokens restored from the prefix cache */
    double t_submit, t_admit, t_first;
    pthread_cond_t cv;
};

typedef struct slot {  /* a sequence of a group's context */
    ks_sched_req *req;          /* NULL: free */
    int32_t n_fed;              /* prompt tokens prefilled */
    bool decoding;
    int32_t next_tok;           /* the token the next decode step feeds */
    int32_t n_gen;
    int32_t n_cached;           /* staged: prompt tokens restored (-1: none to publish) */
    uint64_t order;             /* admission order (prefill FIFO) */
    bool chunkable;             /* its policy's prompt may be prefilled in chunks */
    bool paused;                /* its KV parked in the slow tier (ks_seq_park) until room returns */
    ks_stop_matcher *stop;      /* the request's stop strings (from admission to the end) */
    /* staged by the step, published under the lock */
    ks_sbuf emit;
    ks_sched_finish finish;
    ks_sched_error error;
    char message[256];
} slot;

typedef struct group {        /* a context: the sequences of one KV page size */
    int32_t page;
    ks_context *ctx;
    slot *slots;                /* [n_parallel] */
    int32_t n_used;
    bool is_default, blocked, broken;
    int32_t offloaded;          /* layers in the slow tier (snapshot for metrics) */
    double idle_since;
    ks_stats stats;             /* last snapshot */
    uint64_t kv_fast, kv_slow;  /* KV bytes held per tier now (snapshot for metrics) */
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
    uint64_t submitted, rejected, completed, cancelled, failed, tok_prompt, tok_gen, steps, chunks, mixed_steps;
    uint64_t ctx_created, ctx_recycled, pauses, resumes, cache_trims;
    int32_t n_paused;           /* slots paused now, over every group */
    uint64_t rate_tok[RATE_BUCKETS];
    int64_t rate_sec[RATE_BUCKETS];
    double t_start;
};
/* sched.c */
void ks_sched_deadline_in(struct timespec *ts, double seconds);
bool ks_sched_policy_equal(const ks_sched_policy *a, const ks_sched_policy *b);
void ks_sched_req_unref(ks_sched_req *r);                              /* under mu */
/* under mu: the request is over; the caller took it out of the queue or its
 * slot, and the scheduler's reference goes. */
void ks_sched_req_finish(ks_sched *s, ks_sched_req *r, ks_sched_finish fin, ks_sched_error err, const char *msg);
void ks_sched_queue_remove(ks_sched *s, ks_sched_req *r);              /* under mu */

/* group.c */
void ks_sched_stats_add(ks_stats *a, const ks_stats *b);
ks_status ks_sched_group_create(ks_sched *s, int32_t page, group **out, char *err, size_t err_cap);
void ks_sched_group_destroy(ks_sched *s, int32_t gi);                  /* under mu; the group idle */
group *ks_sched_group_find(ks_sched *s, int32_t page);
void ks_sched_group_account(ks_sched *s, group *g);                    /* refresh stats, tiers, KV bytes */
/* under mu; a slot is free: set r's policy on it, check the memory plan */
int32_t ks_sched_slot_prepare(ks_sched *s, group *g, const ks_sched_req *r, ks_sched_error *why, char *msg,
                              size_t msg_cap);
void ks_sched_slot_admit(ks_sched *s, group *g, int32_t i, ks_sched_req *r); /* under mu; after prepare */
void ks_sched_slot_end(ks_sched *s, group *g, int32_t i, ks_sched_finish fin, ks_sched_error err,
                       const char *msg);                               /* under mu */

/* Tokens of room kept per running sequence when a request is admitted or
 * resumed, so the next steps do not pause it straight away. */
enum { KS_SCHED_GROWTH_MARGIN = 16 };
/* Under a cap: whether r's worst case (prompt + max_tokens) fits the
 * context's plan on its own, with every layer offloaded if need be. */
bool ks_sched_fits_alone(group *g, const ks_sched_req *r);
/* Scheduler thread, no lock needed for the context: before a step, resume
 * paused slots (oldest first) while room allows, then pause the newest
 * running ones while the step would not fit even with every layer
 * offloaded.  Counts go to *paused / *resumed. */
void ks_sched_group_balance(ks_sched *s, group *g, int32_t *paused, int32_t *resumed);

/* Under a cap, with a prefix cache: trim the cache's RAM to the cap minus
 * the coming step's predicted bytes (before any pause); true when it gave
 * memory back. */
bool ks_sched_cache_fit(ks_sched *s, group *g);

/* loop.c: the scheduler thread */
void *ks_sched_main(void *arg);

#endif
