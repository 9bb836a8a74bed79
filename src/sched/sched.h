/*
 * sched.h — continuous batching over the public API (kvsieve.h).
 *
 * A server receives requests at any time, each with its own prompt, length,
 * sampling and selection policy, and must run many of them at once without
 * reading the weights once per request.  The scheduler owns that: one thread
 * drives the engine; clients submit requests from any thread and read their
 * text back as it is produced.
 *
 * Per-request policies in one step.  Every request brings its own selection
 * policy (policy, budget, sink, window, dense layers, policy arguments);
 * at admission the scheduler sets it on the request's sequence
 * (ks_seq_set_policy: the engine keeps one policy instance per distinct
 * configuration and routes each sequence's selection, prefill hook and
 * feedback to its own).  So one context with `n_parallel` sequence slots
 * serves every policy, and each step is one ks_decode call for all decoding
 * sequences, at whatever depths and with whatever policies (the weights are
 * read once for all of them), plus at most one prefill chunk of one newly
 * admitted prompt, so a long prompt does not stall the running decodes.  The
 * one thing a request can ask for that a context fixes is the KV page size
 * (the store's layout): a request with another page gets a context of its
 * own, created on demand, destroyed when idle, and stepped in turn with the
 * others (`max_groups` bounds how many live at once).  An unknown policy or
 * bad arguments fail that request alone (400), not its context.
 *
 * Prefill chunks are n_batch tokens, the engine's own chunking, so the
 * result is bit-identical to one ks_prefill of the whole prompt.  That holds
 * only for policies without a prefill hook (their state after a prompt does
 * not depend on how it was split), which the engine's policy registry
 * reports (ks_policy_prefill_chunkable: dense, streaming, quest, chess).
 * Prompts of other policies (SnapKV's eviction, SpeContext's retrieval
 * cache, ...) are prefilled in one call, as `kvsieve run` does, so they keep
 * their semantics at the cost of a stall of the other sequences.
 *
 * Admission.  A request waits until a context of its page has a free slot;
 * its worst case (prompt + max_tokens) must fit the context (checked at
 * submit: the prompt is never truncated).  Under a memory cap the engine's
 * memory model is taken over the actual state (ks_context_mem_fits: the sum
 * of the unpaused sequences' lengths, the longest of them, how many are
 * active; the largest budget and the policies' own weights over the policy
 * instances the context holds, the default's included; a finished request's
 * sequence drops its policy, so an unused instance leaves the plan):
 *  - a request whose worst case does not fit even alone with every layer
 *    offloaded is refused (KS_SCHED_ERR_TOO_LONG), after its policy is set;
 *  - otherwise it is admitted when the running sequences as they are, the
 *    prompts admitted and not yet prefilled, and its prompt, each with
 *    KS_SCHED_GROWTH_MARGIN tokens of room, fit with some number of layers
 *    offloaded: the actual sum, not n_parallel x the longest, so far more
 *    requests run side by side under a cap than a worst-case reservation
 *    allows;
 *  - it waits (FIFO) while a request of its context is paused (they resume
 *    first), or when its policy would leave a running request unable to
 *    finish even alone.
 * The waiting queue is bounded: beyond it submit refuses (the server
 * answers 429).
 *
 * Offload, pause, resume.  As sequences grow the engine offloads whole
 * layers (last first) whenever the coming step needs it (Algorithm 2 over
 * the actual state).  Since admission reserves no worst case, the running
 * sequences may outgrow the cap even with every layer offloaded: before
 * each step (ks_sched_group_balance) the scheduler checks the step against
 * the model and, while it does not fit, pauses the newest running request:
 * ks_seq_park moves all its KV (pages and metadata, every layer and KV
 * head) to the slow tier and frees its fast pages; it keeps its slot,
 * sampler, stop matcher and policy state, and stays RUNNING to its client.
 * The last running request is never paused (it fits alone by admission).
 * Then, at every step, the oldest paused request is resumed (ks_seq_unpark:
 * its KV back byte for byte, nothing recomputed) as soon as it fits beside
 * the running ones with room to grow, and always once nothing else runs,
 * so its output is byte-identical to running alone.  Pauses, resumes and
 * the requests paused now are metrics.  A context with offloaded layers is
 * recreated once it is idle, so the next requests start with every layer
 * fast again.  With a memory cap only `max_groups` contexts (default 1)
 * live at once, each under the cap.
 *
 * Output.  Tokens are sampled per request (its own sampler and seed), turned
 * into text, and passed through the engine's stop-string matcher
 * (sample/stop.h, the one `kvsieve run` uses: no part of a stop string, no
 * broken UTF-8 character is released).
 * A client takes the text released since its last take with
 * ks_sched_req_take, which blocks up to a timeout for news.  Cancellation
 * removes a waiting request at once and frees a running one's slot before
 * the next step.
 *
 * Threads: every ks_context is touched only by the scheduler thread; the
 * request state is guarded by one mutex; the model is shared read-only.
 */
#ifndef KS_SCHED_H
#define KS_SCHED_H

#include "kvsieve.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ks_sched ks_sched;
typedef struct ks_sched_req ks_sched_req;

/* The selection-policy configuration of a request, set on its sequence at
 * admission (requests with equal configurations share a policy instance;
 * all share the context's steps, except a request with another page). */
typedef struct ks_sched_policy {
    ks_policy_spec spec;   /* parsed once, where the request or the flags came in */
    int32_t page;          /* tokens per KV page: another page gets a context of its own */
    /* the prefill attention (ks_seq_set_prefill_policy), canonical
     * (ks_prefill_policy_canonical: checked against page); "" is dense.  Not
     * part of the policy instance: requests of any prefill policy share one;
     * the prefix cache keys what a prefill computes by it. */
    char prefill[96];
} ks_sched_policy;

/* The engine defaults (ks_policy_spec_default, the page of
 * ks_context_default_params). */
ks_sched_policy ks_sched_policy_default(void);

typedef struct ks_sched_params {
    int32_t n_ctx;           /* tokens per sequence (default: min(train ctx, 4096)) */
    int32_t n_parallel;      /* sequence slots per context (default 4) */
    int32_t n_threads;       /* engine threads (0: all cores) */
    int32_t n_batch;         /* prefill chunk (default 256) */
    ks_kv_type kv_type;
    int32_t max_waiting;     /* waiting-queue bound (default 64); beyond it submit refuses */
    int32_t max_groups;      /* contexts (KV page sizes) alive at once (default 4; 1 with a memory cap) */
    double mem_cap;          /* fast-tier bytes per context (0: no cap) */
    double mem_overhead;     /* factor on weight bytes in the memory model (0: engine default) */
    const char *kv_offload_dir; /* slow tier in files (NULL: host memory); copied */
    int32_t kv_offload_layers;
    int32_t kv_slots;
    ks_sched_policy defaults; /* the context's default policy; the context is created at start to validate the flags */
    /* Prefix cache (borrowed, NULL: none; must outlive the scheduler): a
     * request's prefill starts from the longest cached prefix its policy
     * can use and its prompt's blocks are cached after it.  Prompts are
     * prefilled one at a time in admission order, so of two requests that
     * arrive together with the same prefix the second restores what the
     * first computed.  Under a memory cap the cache's RAM is what the
     * running requests leave: before each step it is trimmed to the cap
     * minus the step's predicted bytes, so it gives memory back before any
     * request is paused or refused. */
    ks_prefix_cache *cache;
} ks_sched_params;

ks_sched_params ks_sched_default_params(void);

/* Why a submit was refused or a request failed. */
typedef enum ks_sched_error {
    KS_SCHED_ERR_NONE = 0,
    KS_SCHED_ERR_INVALID,    /* bad request (policy or sampling configuration): HTTP 400 */
    KS_SCHED_ERR_TOO_LONG,   /* prompt + max_tokens exceed the context or the memory plan: 400 */
    KS_SCHED_ERR_QUEUE_FULL, /* waiting queue full: 429 */
    KS_SCHED_ERR_SHUTDOWN,   /* the scheduler is shutting down: 503 */
    KS_SCHED_ERR_INTERNAL,   /* engine failure: 500 */
    KS_SCHED_ERR_NOMEM,      /* an allocation for this request was refused; the server goes on: 503 */
} ks_sched_error;

typedef enum ks_sched_finish {
    KS_SCHED_FINISH_NONE = 0,
    KS_SCHED_FINISH_STOP,      /* end-of-generation token or a stop string */
    KS_SCHED_FINISH_LENGTH,    /* max_tokens reached */
    KS_SCHED_FINISH_CANCELLED, /* cancelled by the client */
    KS_SCHED_FINISH_ERROR,     /* failed: see the error and message */
} ks_sched_finish;

typedef enum ks_sched_state {
    KS_SCHED_WAITING = 0,
    KS_SCHED_RUNNING,   /* admitted: has a slot (prefilling or decoding) */
    KS_SCHED_FINISHED,
} ks_sched_state;

typedef struct ks_sched_req_params {
    const int32_t *prompt;      /* [n_prompt] token ids (copied) */
    int32_t n_prompt;           /* >= 1 */
    int32_t max_tokens;         /* >= 1 */
    ks_sampler_params sampling;
    const char *const *stops;   /* [n_stops] non-empty strings (copied) */
    int32_t n_stops;            /* <= KS_SCHED_MAX_STOPS */
    bool ignore_eos;            /* keep generating past end-of-generation tokens */
    ks_sched_policy policy;
    bool no_prompt_cache;       /* neither restore from nor add to the prefix cache (cache_prompt: false) */
    bool logprobs;              /* report each generated token's log-probability (ks_sched_logprob) */
    int32_t top_logprobs;       /* and that many most likely alternatives, <= KS_SCHED_MAX_TOP_LOGPROBS */
    /* structured output (sample/json_constraint.h): NULL for free text, ""
     * for any JSON object, else a JSON Schema; compiled at submit (a bad
     * one is KS_SCHED_ERR_INVALID).  The output is then a complete document:
     * generation stops when it closes, and the budget always holds its close. */
    const char *json_schema;
} ks_sched_req_params;

enum { KS_SCHED_MAX_TOP_LOGPROBS = 20 };

/* A generated token's log-probability under the model: the log-softmax of
 * its logits as the model gave them, before the sampler's penalty,
 * temperature and cuts (what OpenAI's logprobs report), with the
 * top_logprobs most likely tokens, most likely first. */
typedef struct ks_sched_logprob {
    int32_t id;
    float logprob;
    int32_t n_top;
    int32_t top_id[KS_SCHED_MAX_TOP_LOGPROBS];
    float top_logprob[KS_SCHED_MAX_TOP_LOGPROBS];
} ks_sched_logprob;

enum { KS_SCHED_MAX_STOPS = 16 };

/* A snapshot of a request for its client.  text is what was released since
 * the previous take (malloc'd, NUL-terminated, the caller frees; NULL when
 * nothing new). */
typedef struct ks_sched_update {
    ks_sched_state state;
    char *text;
    size_t len;
    ks_sched_finish finish;
    ks_sched_error error;
    char message[1024];
    int32_t n_prompt, n_generated;
    int32_t n_cached;           /* prompt tokens restored from the prefix cache */
    double t_submit, t_admit, t_first; /* ks_sched_now() times; 0 when not yet */
    /* with logprobs: the tokens generated since the previous take, in order
     * (malloc'd, the caller frees; NULL when none).  An end-of-generation
     * token that ended the answer is not listed (it has no text); tokens
     * whose text a stop string withheld are. */
    ks_sched_logprob *logprobs;
    int32_t n_logprobs;
} ks_sched_update;

/* Loads nothing: the model is borrowed and must outlive the scheduler.  The
 * context of the default page is created now, so bad flags fail here
 * (message in err). */
ks_status ks_sched_create(const ks_model *model, const ks_sched_params *params, ks_sched **out, char *err,
                          size_t err_cap);
/* Cancels everything still queued or running, joins the thread, frees. */
void ks_sched_destroy(ks_sched *s);

/* Queue a request.  On refusal returns NULL and sets *why and msg. The
 * handle belongs to the caller until ks_sched_req_release. */
ks_sched_req *ks_sched_submit(ks_sched *s, const ks_sched_req_params *p, ks_sched_error *why, char *msg,
                              size_t msg_cap);
/* Wait up to timeout_s (0: do not wait) for news (new text or a state
 * change); fill out.  Returns true when there was news. */
bool ks_sched_req_take(ks_sched *s, ks_sched_req *r, double timeout_s, ks_sched_update *out);
/* Cancel (idempotent; no effect on a finished request). */
void ks_sched_req_cancel(ks_sched *s, ks_sched_req *r);
/* Drop the caller's handle; an unfinished request is cancelled. */
void ks_sched_req_release(ks_sched *s, ks_sched_req *r);

/* Stop admitting: queued requests fail with KS_SCHED_ERR_SHUTDOWN, running
 * ones go on for up to grace_s seconds, then are ended with that error. */
void ks_sched_shutdown(ks_sched *s, double grace_s);
/* No request queued or running. */
bool ks_sched_idle(ks_sched *s);

typedef struct ks_sched_metrics {
    int32_t running, waiting, groups, n_parallel, n_ctx, max_waiting;
    uint64_t requests_submitted, requests_rejected, requests_completed, requests_cancelled, requests_failed;
    uint64_t tokens_prompt, tokens_generated;
    double tokens_per_second;   /* generated, over the last 10 s */
    uint64_t decode_steps, prefill_chunks;
    uint64_t decode_steps_mixed; /* decode steps whose sequences had different policies */
    ks_stats engine;            /* summed over every context, live and retired */
    int32_t layers_offloaded;   /* now, summed over live contexts */
    uint64_t kv_bytes_fast, kv_bytes_slow; /* KV the running sequences hold now, per tier */
    uint64_t contexts_created, contexts_recycled;
    uint64_t pauses, resumes;   /* requests paused (KV parked in the slow tier) and resumed, since start */
    int32_t paused;             /* requests paused now (counted in running too) */
    bool cache_on;              /* a prefix cache is in use */
    ks_prefix_cache_stats cache;
    uint64_t cache_trims;       /* times the cache gave RAM back to the running requests under the cap */
} ks_sched_metrics;

void ks_sched_get_metrics(ks_sched *s, ks_sched_metrics *out);

/* Monotonic seconds (the clock of ks_sched_update). */
double ks_sched_now(void);

/* Whether a policy spec's prefill may be split into separate ks_prefill
 * calls without changing its results (every part has no prefill hook). */
bool ks_sched_policy_chunkable(const char *spec);

#ifdef __cplusplus
}
#endif
#endif
