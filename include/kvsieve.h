/*
 * kvsieve.h — public C API of libkvsieve.
 *
 * kvsieve is a long-context inference engine built around context sparsity.
 * This header is the only one applications include.  Everything behind it is
 * reached through opaque handles created with *_create() and released with
 * *_destroy() by the same caller; parameters come from *_default_params() so
 * that new fields never break old callers.
 *
 * Error convention: every fallible call returns ks_status and writes results
 * through out-parameters, which are left untouched on failure.  The message of
 * the last failure on the calling thread (with the source file and line where
 * it was detected) is available from ks_last_error().  The library never exits
 * the process: a refused allocation is KS_ERR_NOMEM from the call that needed
 * it, with what that call had built undone.
 */
#ifndef KVSIEVE_H
#define KVSIEVE_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVSIEVE_VERSION "0.1.0"

/* Return codes.  After any error the objects involved remain valid and may be
 * destroyed; what else survives is stated per code. */
typedef enum ks_status {
    KS_OK = 0,
    KS_ERR_INVALID_ARG,  /* caller passed a bad argument; no state changed */
    KS_ERR_IO,           /* open/read/write/mmap failed; nothing was created */
    KS_ERR_FORMAT,       /* file malformed, truncated or corrupt; nothing was created */
    KS_ERR_UNSUPPORTED,  /* well-formed but unsupported (architecture, type); nothing created */
    KS_ERR_NOMEM,        /* an allocation was refused, or a memory cap cannot hold what was asked; what the call built is undone */
    KS_ERR_CONTEXT_FULL, /* tokens would exceed the context; the sequence is unchanged */
    KS_ERR_NOT_FOUND,    /* a named key/tensor/token is absent */
    KS_ERR_BACKEND,      /* accelerator failure; the context must be destroyed */
    KS_ERR_COUNT_
} ks_status;

const char *ks_status_str(ks_status st);
/* Message of the last failure on this thread: "file:line: what happened". */
const char *ks_last_error(void);

/* ---------------------------------------------------------------- model -- */
typedef struct ks_model ks_model;

/* Whether a mixture-of-experts model's K-quant and IQ4_XS experts are
 * repacked at load into the eight-row groups the dense matrices get (faster
 * decode and prefill products; a resident copy of those experts when the
 * file is mapped).  AUTO packs them when read into memory, and from a mapped
 * file when the copy takes at most half of the memory available at load:
 * a model whose experts would not fit keeps reading them from the mapping. */
typedef enum ks_expert_pack {
    KS_EXPERT_PACK_AUTO = 0,
    KS_EXPERT_PACK_ON,
    KS_EXPERT_PACK_OFF,
} ks_expert_pack;

typedef struct ks_model_params {
    bool use_mmap;   /* map weights zero-copy (default true) */
    bool vocab_only; /* load only the tokenizer (vocabulary GGUF files) */
    bool no_repack;  /* keep the file's weight layout (default false: Q8_0 layer matrices are
                        repacked in place at load for the prefill GEMM; same bits, same memory) */
    ks_expert_pack expert_pack; /* K-quant / IQ4_XS experts (default AUTO); no_repack overrides it */
} ks_model_params;

ks_model_params ks_model_default_params(void);
ks_status ks_model_load(const char *path, ks_model_params params, ks_model **out);
void ks_model_destroy(ks_model *model);

/* Human-readable summary (architecture, shapes, types, tokenizer, memory). */
ks_status ks_model_describe(const ks_model *model, char *buf, size_t buf_size);
int32_t ks_model_n_vocab(const ks_model *model);
int32_t ks_model_n_ctx_train(const ks_model *model);

/* ------------------------------------------------------------ tokenizer -- */
/* Encode UTF-8 text.  *n_out receives the number of ids; if it exceeds cap
 * the call fails with KS_ERR_INVALID_ARG and *n_out holds the needed size. */
ks_status ks_tokenize(const ks_model *model, const char *text, size_t len, bool add_bos,
                      bool parse_special, int32_t *ids, size_t cap, size_t *n_out);
/* Text of one token (byte pieces decoded, SPM spaces restored). */
ks_status ks_token_to_piece(const ks_model *model, int32_t id, char *buf, size_t cap,
                            size_t *n_out);
int32_t ks_token_bos(const ks_model *model);
int32_t ks_token_eos(const ks_model *model);
bool ks_token_is_eog(const ks_model *model, int32_t id);

/* Apply the model's chat template family (llama3, ChatML, phi-3, llama2) to one user turn
 * with an optional system prompt; writes a NUL-terminated prompt. */
ks_status ks_chat_format(const ks_model *model, const char *system, const char *user,
                         char *buf, size_t cap, size_t *n_out);

/* One message of a conversation; developer messages are system messages.
 * A tool message is the result of a call the assistant made. */
typedef enum ks_chat_role { KS_ROLE_SYSTEM = 0, KS_ROLE_USER = 1, KS_ROLE_ASSISTANT = 2, KS_ROLE_TOOL = 3 } ks_chat_role;
typedef struct ks_chat_message {
    ks_chat_role role;
    const char *content;      /* UTF-8, NUL-terminated */
    const char *tool_calls;   /* assistant: the calls it made, an OpenAI tool_calls JSON array; NULL: none */
    const char *tool_call_id; /* tool: the id of the call this message answers; NULL: none */
    const char *name;         /* tool: the function that answered; NULL: none */
} ks_chat_message;
/* A whole conversation, any order of roles, in the model's chat template,
 * ending with the prompt for the assistant's next turn: turn N's rendering
 * plus the answer is a prefix of turn N+1's (what lets a prefix cache hit).
 * Encode with add_bos and parse_special.  KS_ERR_UNSUPPORTED when the model
 * has no known template; cap too small: KS_ERR_INVALID_ARG with *n_out =
 * bytes needed including the NUL. */
ks_status ks_chat_render(const ks_model *model, const ks_chat_message *msgs, size_t n_msgs, char *buf, size_t cap,
                         size_t *n_out);
/* The same with the functions the model may call: tools, an OpenAI `tools`
 * JSON array (NULL: none), given to the GGUF's template as `tools`; without
 * a template, the family renders them as a system message in the Hermes
 * convention (ks_chat_tool_syntax then says KS_TOOLS_HERMES). */
ks_status ks_chat_render_tools(const ks_model *model, const ks_chat_message *msgs, size_t n_msgs, const char *tools,
                               char *buf, size_t cap, size_t *n_out);
/* How the model writes a tool call, read from its chat template (else its
 * special tokens): the syntax a server parses answers with. */
typedef enum ks_tool_syntax {
    KS_TOOLS_GENERIC = 0,  /* a bare JSON object {"name", "arguments"} */
    KS_TOOLS_HERMES = 1,   /* Qwen2.5/3, Hermes: <tool_call>{"name", "arguments"}</tool_call> */
    KS_TOOLS_LLAMA3 = 2,   /* Llama 3.x: {"name", "parameters"}, or after <|python_tag|> */
    KS_TOOLS_MISTRAL = 3,  /* [TOOL_CALLS][{"name", "arguments"}] or [TOOL_CALLS]NAME[ARGS]{...} */
    KS_TOOLS_HARMONY = 4,  /* gpt-oss: <|channel|>commentary to=functions.NAME ... <|message|>{...}<|call|> */
    KS_TOOLS_DEEPSEEK = 5, /* DeepSeek V3/R1: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>... */
} ks_tool_syntax;
ks_tool_syntax ks_chat_tool_syntax(const ks_model *model);

/* -------------------------------------------------------------- context -- */
typedef struct ks_context ks_context;

typedef enum ks_kv_type { KS_KV_F16 = 0, KS_KV_Q8 = 1 } ks_kv_type;

typedef struct ks_context_params {
    int32_t n_ctx;        /* tokens per sequence (default: min(train ctx, 4096)) */
    int32_t n_seq;        /* independent sequences decoded together (default 1) */
    int32_t n_threads;    /* CPU worker threads (default: online cores) */
    int32_t n_batch;      /* prefill chunk in tokens (default 0: 256, or 1024 for a model with experts) */
    ks_kv_type kv_type;   /* KV cache element type (default f16) */
    /* Selection policy (docs/POLICIES.md): which KV entries a decode step
     * reads.  The six fields below are parsed once, by ks_context_create,
     * into a ks_policy_spec (the context keeps that, not the strings). */
    const char *policy;        /* "dense" (default), "quest", "snapkv+quest", ... */
    int32_t budget;            /* entries per KV head per decode step, sinks + window included; 0: all */
    int32_t sink;              /* leading entries always attended (default 4) */
    int32_t window;            /* most recent entries always attended (default 64) */
    int32_t page;              /* tokens per KV page (default 32) */
    int32_t dense_layers;      /* first N layers dense at decode; -1: the policy's default */
    const char *policy_args;   /* policy-specific "k=v,k=v" */
    /* The policy already parsed (ks_policy_spec_parse; copied): when set,
     * policy, budget, sink, window, dense_layers and policy_args are not read. */
    const struct ks_policy_spec *policy_spec;
    /* Slow tier: the last kv_offload_layers layers keep their KV in the slow
     * tier (a file per layer in kv_offload_dir, or host memory when NULL) and
     * attention reads them through fast-tier slots. */
    const char *kv_offload_dir;
    int32_t kv_offload_layers;
    int32_t kv_slots;          /* elastic buffer of a slow-tier layer, in pages of entries per head; 0: budget + page - 1 entries */
    /* Adaptive memory management (SpeContext, Section 6): with a fast-tier
     * capacity in bytes, layers move to the slow tier one by one (last
     * first) as the sequences grow past precomputed thresholds.  0: off. */
    double mem_cap;
    double mem_overhead;       /* factor on weight bytes in the memory model (default 1.3) */
    /* Prefill attention (docs/POLICIES.md, "Sparse prefill"): NULL or
     * "dense" (default) attends every cached entry exactly; "quest" or
     * "quest:budget=N,sink=N,window=N,dense=N" lets each block of prompt
     * rows attend its sinks, a local window and the cached pages whose
     * Quest bounds score highest, budget entries per block and KV head.
     * Opt-in and approximate; decode is not affected.  The string is
     * parsed by ks_context_create (KS_ERR_INVALID_ARG when malformed). */
    const char *prefill_policy;
} ks_context_params;

ks_context_params ks_context_default_params(void);
/* The context borrows the model, which must outlive it. */
ks_status ks_context_create(const ks_model *model, ks_context_params params, ks_context **out);
void ks_context_destroy(ks_context *ctx);

/* Append n tokens to sequence seq and compute.  If logits is non-NULL it
 * receives the logits of the last token ([n_vocab]); if all_logits is
 * non-NULL it receives [n][n_vocab].  KS_ERR_CONTEXT_FULL leaves the sequence
 * unchanged. */
ks_status ks_prefill(ks_context *ctx, int32_t seq, const int32_t *tokens, int32_t n,
                     float *logits, float *all_logits);
/* One decode step for n_seq sequences at once: tokens[i] goes to seqs[i];
 * logits receives [n_seq][n_vocab].  Weights are read once for the batch. */
ks_status ks_decode(ks_context *ctx, const int32_t *seqs, const int32_t *tokens, int32_t n_seq,
                    float *logits);
/* Registered selection policies: count, and name (summary optional) of the i-th. */
int32_t ks_policy_count(void);
/* Whether a policy spec ("quest", "dapq+spec") takes argument key. */
bool ks_policy_accepts_arg(const char *spec, const char *key);
const char *ks_policy_name_at(int32_t i, const char **summary);

/* A selection policy as one immutable value: the composition as a chain of
 * registry entries (an evictor's prefill hooks, then the last part's decode
 * hooks), the budget knobs and the arguments, parsed and checked once by
 * ks_policy_spec_parse, the one parser of policy strings ("EVICTOR+SELECTOR"
 * and "k=v,k=v").  Every entrance (the CLI flags, the server's `kvsieve`
 * object, ks_context_params, ks_policy_config, the selection API) parses
 * into it; below them it is passed by const pointer or copied whole. */
enum { KS_POLICY_NAME_MAX = 64, KS_POLICY_ARGS_MAX = 1024, KS_POLICY_MAX_PARTS = 3 };
typedef struct ks_policy_spec {
    char name[KS_POLICY_NAME_MAX];     /* "quest", "snapkv+quest" */
    int32_t n_parts;                   /* 1, or 2-3 for a composition */
    int32_t part[KS_POLICY_MAX_PARTS]; /* registry indices (ks_policy_name_at): evictor, decode selector, then a
                                        * refining stage (topp), each optional but one */
    int32_t budget;       /* entries per KV head per decode step, sinks + window included; 0: all */
    int32_t sink, window; /* leading / most recent entries always attended */
    int32_t dense_layers; /* first N layers dense at decode; -1: the policy's default */
    char args[KS_POLICY_ARGS_MAX]; /* "k=v,k=v", every key taken by some part ("": none) */
} ks_policy_spec;

/* dense, budget 0, sink 4, window 64, dense_layers -1, no arguments. */
ks_policy_spec ks_policy_spec_default(void);
/* policy: "NAME", "EVICTOR+SELECTOR", optionally followed by "+topp" (a
 * stage pruning the selection: "quest+topp", "snapkv+quest+topp") (NULL or
 * "": dense); args: "k=v,k=v"
 * (NULL: none), every key one some part takes.  KS_ERR_NOT_FOUND for an
 * unknown name, KS_ERR_INVALID_ARG for a bad composition, argument or a
 * negative budget, sink or window; *out is written only on success. */
ks_status ks_policy_spec_parse(const char *policy, const char *args, int32_t budget, int32_t sink, int32_t window,
                               int32_t dense_layers, ks_policy_spec *out);
/* The same configuration (instances may be shared). */
bool ks_policy_spec_equal(const ks_policy_spec *a, const ks_policy_spec *b);
/* What the registry says the policy needs: a part named name; a draft
 * model (the DLM, SpeContext's `spec`: ks_policy_draft_beside finds the one
 * shipped with a model); whether its prompt may be prefilled in several
 * ks_prefill calls with the same result as one (no part has a prefill hook). */
bool ks_policy_spec_has_part(const ks_policy_spec *spec, const char *name);
bool ks_policy_spec_needs_dlm(const ks_policy_spec *spec);
bool ks_policy_spec_chunkable(const ks_policy_spec *spec);
/* Whether "k=v,k=v" sets key; whether every item of it is k=v with a
 * non-empty key (NULL and "" are). */
bool ks_policy_args_has(const char *args, const char *key);
bool ks_policy_args_valid(const char *args);
/* The items of args ("k=v" or "NAME.k=v", comma-separated) that policy
 * ("a" or "a+b") takes, appended to out[cap] comma-separated: NAME.k=v for
 * a part of policy (as k=v), k=v when some part takes k or when all is set.
 * KS_ERR_INVALID_ARG when out is too small. */
ks_status ks_policy_args_scope(const char *policy, const char *args, bool all, char *out, size_t cap);
/* spec with dlm=DIR added when the registry says it needs a draft model
 * (ks_policy_spec_needs_dlm), its arguments name none, and one ships beside
 * the model file (MODEL.gguf -> MODEL-dlm/ holding a config.json);
 * otherwise an unchanged copy.  in and out may be the same. */
void ks_policy_spec_add_draft(const ks_policy_spec *in, const char *model_path, ks_policy_spec *out);
/* Whether a policy spec's prompt may be prefilled in several ks_prefill calls
 * with the same result as one (no part has a prefill hook: dense, streaming,
 * quest, chess).  False for unknown names. */
bool ks_policy_prefill_chunkable(const char *spec);
/* Context entries past the prompt that a policy's prefill uses for a moment
 * (DapQ's pseudo tokens, its n_pseudo argument: their KV is removed before
 * ks_prefill returns).  Size n_ctx as prompt + generation + this, or the
 * policy runs fewer of them than configured (it logs how many).  0 for
 * policies without such tokens and for unknown names. */
int32_t ks_policy_prefill_room(const char *spec, const char *args);

/* One sequence's selection policy: the policy fields of ks_context_params
 * for a single sequence (ks_seq_set_policy). */
typedef struct ks_policy_config {
    const char *policy;      /* spec: "dense", "quest", "snapkv+quest", ... (NULL or "": "dense") */
    int32_t budget;          /* entries per KV head per decode step, sinks + window included; 0: all */
    int32_t sink, window;
    int32_t page;            /* 0 or the context's page: the KV page size belongs to the context */
    int32_t dense_layers;    /* -1: the policy's default */
    const char *policy_args; /* "k=v,k=v" (NULL: none) */
} ks_policy_config;

/* dense, budget 0, sink 4, window 64, page 0 (the context's), dense_layers -1. */
ks_policy_config ks_policy_config_default(void);
/* Give sequence seq its own selection policy (cfg NULL: back to the
 * context's default, which serves every sequence never set).  Allowed only
 * while the sequence is empty; it keeps the policy across ks_seq_reset.
 * Sequences with equal configurations share one policy instance (created on
 * first use; an instance no sequence uses is destroyed when another is
 * created).  Sequences with different policies decode in the same ks_decode
 * call: the matmuls run over all rows, each row's selection, prefill hook,
 * feedback and counters go to its own instance.  Under a memory cap the
 * plan is recomputed for the largest budget and the policies' own weights
 * and caches over all instances (conservative: every sequence is counted at
 * the largest budget); a budget of 0 is refused there, and so is a
 * configuration with which the cap cannot hold even one sequence
 * (KS_ERR_NOMEM; how many fit is ks_context_mem_fits's answer).  KS_ERR_INVALID_ARG /
 * KS_ERR_NOT_FOUND / KS_ERR_UNSUPPORTED (a policy asking for other hidden
 * states than one already in use) leave the sequence's policy unchanged. */
ks_status ks_seq_set_policy(ks_context *ctx, int32_t seq, const ks_policy_config *cfg);
/* The same with the policy already parsed (NULL: the context's default). */
ks_status ks_seq_set_policy_spec(ks_context *ctx, int32_t seq, const ks_policy_spec *spec);
/* The prefill attention of one sequence's next prefills (the syntax of
 * ks_context_params.prefill_policy); NULL: the context's.  It stays until
 * set again.  A prefix cache keys the KV a prefill computes by this setting
 * (docs/SERVER.md, "Prefix cache"), so a sparse prefill's blocks serve only
 * prefills of the same setting, and never a dense one.  KS_ERR_INVALID_ARG
 * when malformed (the sequence keeps its setting). */
ks_status ks_seq_set_prefill_policy(ks_context *ctx, int32_t seq, const char *spec);
/* A sparse prefill's rows share one selection per block of this many rows,
 * the blocks on one grid of entries: chunks end on it (the prompt's end
 * aside), and a prefill call that starts off it (ks_prefill_rest after an
 * upto off the grid) splits a block, so its result differs from one call's
 * and the sequence's blocks are not cached from then on. */
enum { KS_PREFILL_BLOCK_ROWS = 16 };
/* Check a prefill policy for a context of KV page `page` and write its
 * canonical spelling ("dense", or "quest:budget=B,sink=S,window=W,dense=D"
 * with every value written out) to out[cap] (96 bytes always suffice). */
ks_status ks_prefill_policy_canonical(const char *spec, int32_t page, char *out, size_t cap);

/* Move layer's KV between the fast (offload = false) and the slow tier for
 * all sequences; nothing is lost.  KS_ERR_IO/NOMEM leave the layer where it was. */
ks_status ks_context_offload_layer(ks_context *ctx, int32_t layer, bool offload);
/* Drop all tokens of a sequence. */
void ks_seq_reset(ks_context *ctx, int32_t seq);
int32_t ks_seq_len(const ks_context *ctx, int32_t seq);
/* KV bytes (K and V, every layer and KV head) the sequences hold now in the
 * fast and the slow tier (entries actually stored: evictions count; a
 * slow-tier layer's fast slots are a cache and not counted; a parked
 * sequence's KV is all slow).  Either may be NULL. */
void ks_context_kv_bytes(const ks_context *ctx, int64_t *fast, int64_t *slow);

/* Counters since the context was created (or ks_stats_reset). */
typedef struct ks_stats {
    uint64_t weight_bytes_read; /* bytes of weights streamed by matmuls */
    uint64_t kv_bytes_read;     /* bytes of K and V read by attention */
    uint64_t tokens_prefilled;
    uint64_t tokens_decoded;
    double prefill_seconds;
    double decode_seconds;
    uint64_t kv_entries_attended; /* KV entries read by decode attention (all layers, heads) */
    uint64_t kv_entries_total;    /* entries dense decode attention would have read */
    double select_seconds;        /* policy selection, summed over worker threads */
    uint64_t kv_bytes_loaded;     /* slow -> fast tier */
    uint64_t kv_bytes_stored;     /* fast -> slow tier */
    uint64_t kv_pages_loaded, kv_pages_hit; /* whole pages read past the elastic buffers (prefill, fallbacks) */
    uint64_t kv_entries_loaded;   /* entries copied into elastic buffers (each step's S_now - S_last) */
    uint64_t kv_entries_hit;      /* entries a fetch asked for that stayed buffered (loaded + hit = full reload) */
    uint64_t kv_sync_fallbacks;   /* decode selections read synchronously because they exceeded the buffer */
    double kv_wait_seconds;       /* compute waiting on slow-tier loads */
    double kv_copy_seconds;       /* copy-engine busy time */
    /* the policy's own counters (not reset by ks_stats_reset) */
    uint64_t policy_selections, policy_hits, policy_misses, policy_corrections, policy_rebuilds;
    uint64_t policy_speculative;  /* selections served by the previous step's speculation (freekv) */
    uint64_t policy_topp_refined, policy_topp_picked, policy_topp_kept; /* +topp: selections pruned, the
                                     selector's picks in them, the entries kept */
    double policy_topp_head_min, policy_topp_head_max; /* +topp: entries kept per selection by the (layer,
                                     KV head) keeping fewest / most, on average */
    uint64_t kv_offload_events;   /* layers moved to the slow tier by the memory manager */
    double gather_seconds;        /* decode: turning selections into the kernel's runs (segment walk, staging
                                     copies of slow-tier rows), summed over worker threads */
    uint64_t gather_bytes;        /* decode: K and V bytes copied into staging (elastic-buffer rows out of order) */
    uint64_t select_bytes_read;   /* bytes the selection itself read: a retrieval head's weights and K cache,
                                     page summaries (reset by ks_stats_reset) */
    double matmul_seconds;        /* weight products (prefill and decode), wall time */
    uint64_t matmul_macs;         /* their multiply-adds: rows x cols x vectors */
    double attention_seconds;     /* attention of every layer (prefill and decode), wall time */
} ks_stats;

/* The memory plan of a context (mem_cap > 0): thresholds[k] = longest
 * sequence with k layers offloaded (-1: never fits), k = 0..n_layer. */
typedef struct ks_memplan_info {
    bool active;
    double model_bytes, dlm_bytes, alpha, overhead, mem_cap;
    int32_t n_layer, requests, budget;
    int64_t thresholds[257];
    int32_t offloaded;            /* layers in the slow tier now */
    int32_t n_local, window;      /* sliding-window layers (never offloaded; k counts global layers) and their window */
} ks_memplan_info;
void ks_context_memplan(const ks_context *ctx, ks_memplan_info *out);
/* Apply Algorithm 2 now for the current state (also done before every
 * decode step and prefill): the fewest layers offloaded, last first, for
 * the unparked sequences' actual lengths to fit (ks_context_mem_fits); the
 * thresholds above are the special case of every sequence at one length. */
ks_status ks_context_apply_memplan(ks_context *ctx);
/* Pause and resume a sequence under memory pressure.  ks_seq_park moves all
 * of seq's KV (every layer and KV head: pages, page metadata, entry counts)
 * to the slow tier (host memory, or a file in kv_offload_dir) and frees its
 * fast-tier pages; the sequence keeps its length and its policy's state.  A
 * parked sequence cannot be prefilled or decoded (KS_ERR_INVALID_ARG) until
 * ks_seq_unpark brings its KV back byte for byte (nothing re-quantized or
 * recomputed: the next decode gives the logits it would have given without
 * the pause).  ks_seq_reset drops a parked sequence's copy too.
 * KS_ERR_NOMEM / KS_ERR_IO leave the sequence where it was. */
ks_status ks_seq_park(ks_context *ctx, int32_t seq);
ks_status ks_seq_unpark(ks_context *ctx, int32_t seq);
bool ks_seq_parked(const ks_context *ctx, int32_t seq);

/* The memory model over the actual state (mem_cap > 0): the fast-tier bytes
 * the unparked sequences need now, plus what the query adds, with the fewest
 * layers offloaded that fit the cap (the model of kv/memplan.h: each token
 * costs its layers that are still fast, an offloaded layer keeps `budget`
 * fast entries per head of each active sequence). */
typedef struct ks_mem_query {
    int64_t extra_tokens; /* tokens added to the unparked sequences (new or existing) */
    int32_t extra_seqs;   /* sequences that start holding tokens (a request admitted or unparked) */
    int64_t longest;      /* the longest unparked sequence will be at least this long */
    bool alone;           /* ignore what the context holds: a request on its own */
} ks_mem_query;
typedef struct ks_mem_fit {
    bool active;          /* the context has a memory cap (else fits is true, the rest 0) */
    bool fits;            /* some number of offloaded layers holds it under the cap */
    int32_t offloaded;    /* layers that would be offloaded (n_layer + 1: none fits) */
    double bytes;         /* predicted fast-tier bytes then (all layers offloaded when none fits) */
    double mem_cap;
    int64_t tokens;       /* tokens of the unparked sequences, extra included */
    int32_t active_seqs;  /* unparked sequences holding tokens, extra included */
} ks_mem_fit;
ks_status ks_context_mem_fits(const ks_context *ctx, const ks_mem_query *q, ks_mem_fit *out);
void ks_context_stats(const ks_context *ctx, ks_stats *out);
void ks_stats_reset(ks_context *ctx);

/* Fill sequence seq to depth n with synthetic KV (deterministic noise) so that
 * long-depth decode can be benchmarked without a long prefill. */
ks_status ks_seq_fill_synthetic(ks_context *ctx, int32_t seq, int32_t n, uint64_t seed);

/* --------------------------------------------------------- prefix cache -- */
/* A cache of prompt prefixes' KV shared by every context of one model
 * (docs/SERVER.md, "Prefix cache").  Content-addressed by a chain of
 * page-sized token blocks (a block's key hashes its parent's key and its
 * tokens; the chain starts from the model's fingerprint and the KV layout),
 * only full blocks, only rows a prefill computed.  Kept in RAM under its own
 * cap (LRU) and, with a directory, written there behind the request path
 * (bounded, LRU; files published atomically, each with a header and a
 * checksum: a corrupt, truncated or foreign file is skipped and counted),
 * so a restarted process or another replica on the same directory hits the
 * blocks too.  A hit restores the rows byte for byte: the logits equal those
 * of the uncached prefill bit for bit.  Thread-safe. */
typedef struct ks_prefix_cache ks_prefix_cache;

typedef struct ks_prefix_cache_params {
    uint64_t ram_bytes;   /* RAM cap (default 1 GiB) */
    const char *dir;      /* block files (NULL: RAM only); created if missing; copied */
    uint64_t disk_bytes;  /* cap of the directory's block files this process manages (default 8 GiB; 0: none) */
    bool write_behind;    /* write files on a thread of their own (default true; false: before the call returns) */
    bool share_pages;     /* keep blocks as pinned pages of the context's KV store, mapped by a hit (default true; false: copies) */
} ks_prefix_cache_params;

typedef struct ks_prefix_cache_stats {
    uint64_t hit_tokens, miss_tokens;  /* prompt tokens restored / computed by restores */
    uint64_t ram_bytes, disk_bytes;    /* bytes cached now per tier */
    uint64_t ram_shared_bytes;         /* of ram_bytes: pages some sequence maps now (their memory counted once, there) */
    uint64_t ram_blocks, disk_blocks;
    uint64_t evictions;                /* blocks dropped from RAM */
    uint64_t spills;                   /* blocks written to the directory */
    uint64_t loads;                    /* blocks read back from the directory */
    uint64_t disk_evictions;           /* files removed by the disk cap */
    uint64_t skipped_corrupt;          /* files (or records) refused: corrupt, truncated, foreign */
    uint64_t healed;                   /* of those, files replaced by this process with the recomputed block */
} ks_prefix_cache_stats;

ks_prefix_cache_params ks_prefix_cache_default_params(void);
/* The model is fingerprinted (shapes, metadata, samples of every tensor);
 * it must outlive the cache. */
ks_status ks_prefix_cache_create(const ks_model *model, const ks_prefix_cache_params *p, ks_prefix_cache **out);
/* Waits for the pending writes, then frees. */
void ks_prefix_cache_destroy(ks_prefix_cache *pc);
/* Wait until every block taken so far is written to the directory. */
void ks_prefix_cache_flush(ks_prefix_cache *pc);
/* Give RAM back: evict (LRU) until the cache holds at most ram_bytes, and
 * keep it there (a later call with more raises the limit again, never past
 * the cap it was created with). */
void ks_prefix_cache_trim(ks_prefix_cache *pc, uint64_t ram_bytes);
void ks_prefix_cache_get_stats(ks_prefix_cache *pc, ks_prefix_cache_stats *out);

/* Start an empty sequence from the longest cached prefix of prompt[0, n),
 * cached under the sequence's prefill policy (ks_seq_set_prefill_policy),
 * that its policy can use (ks_policy_prefix_shareable: 0 for policies whose
 * state a restore cannot rebuild; the policy's observation rows and the
 * last row are always left to compute): *n_restored rows are in the
 * sequence afterwards; continue with ks_prefill_rest.  pc NULL: 0. */
ks_status ks_prefix_restore(ks_context *ctx, ks_prefix_cache *pc, int32_t seq, const int32_t *prompt, int32_t n,
                            int32_t *n_restored);
/* Prefill prompt rows [ks_seq_len(seq), upto) of prompt[0, n), the
 * sequence holding exactly the rows before (restored or prefilled by
 * earlier calls); pc (optional) takes the whole blocks of prompt[0, upto).
 * Stopping short of n is for policies whose prefill may be split
 * (ks_policy_prefill_chunkable).  When upto == n the prompt ends: the
 * policy's prefill hooks see the whole prompt (as one ks_prefill of it) and
 * logits receives the last row's. */
ks_status ks_prefill_rest(ks_context *ctx, ks_prefix_cache *pc, int32_t seq, const int32_t *prompt, int32_t n,
                          int32_t upto, float *logits);
/* ks_prefix_restore then ks_prefill_rest to the end, for an empty sequence. */
ks_status ks_prefill_cached(ks_context *ctx, ks_prefix_cache *pc, int32_t seq, const int32_t *prompt, int32_t n,
                            float *logits, int32_t *n_cached);
/* One file holding the cached blocks of prompt[0, n) in the context's KV
 * layout, under its prefill policy (`kvsieve run --prompt-cache`): written atomically; *n_blocks
 * receives how many.  Loading inserts every valid record into the cache
 * (an invalid one ends the file, counted in skipped_corrupt); a missing
 * file is KS_ERR_NOT_FOUND. */
ks_status ks_prefix_cache_save_file(ks_prefix_cache *pc, const ks_context *ctx, const int32_t *prompt, int32_t n,
                                    const char *path, int32_t *n_blocks);
/* A checkpoint of a long prefill into the same file: the file keeps its
 * records that are known good (read by ks_prefix_cache_load_file of this
 * cache, or appended by this function) and are prompt[0, n)'s chain in
 * order, is cut after them (a record torn by a kill, another prompt's
 * blocks), and the cached blocks of prompt[0, n) after them are appended,
 * then fsync.  A kill during the append leaves a file that still loads
 * every record before the torn one.  *n_blocks receives the blocks the
 * file holds. */
ks_status ks_prefix_cache_append_file(ks_prefix_cache *pc, const ks_context *ctx, const int32_t *prompt, int32_t n,
                                      const char *path, int32_t *n_blocks);
ks_status ks_prefix_cache_load_file(ks_prefix_cache *pc, const char *path, int32_t *n_blocks);

/* ------------------------------------------------------------- sampling -- */
typedef struct ks_sampler ks_sampler;

typedef struct ks_sampler_params {
    float temperature;    /* <= 0: greedy (default 0.8) */
    int32_t top_k;        /* <= 0: off (default 40) */
    float top_p;          /* in (0, 1]; 1: off (default 0.95) */
    float min_p;          /* <= 0: off (default 0.05) */
    float repeat_penalty; /* 1: off (default 1.0) */
    int32_t repeat_last_n;/* window of recent tokens penalised (default 64) */
    uint64_t seed;        /* RNG seed (default 42) */
} ks_sampler_params;

ks_sampler_params ks_sampler_default_params(void);
ks_status ks_sampler_create(ks_sampler_params params, int32_t n_vocab, ks_sampler **out);
void ks_sampler_destroy(ks_sampler *s);
/* Pick a token from logits[n_vocab] (modified in place). */
int32_t ks_sampler_sample(ks_sampler *s, float *logits);
/* Record an accepted token (for the repetition penalty). */
void ks_sampler_accept(ks_sampler *s, int32_t token);

#ifdef __cplusplus
}
#endif
#endif
