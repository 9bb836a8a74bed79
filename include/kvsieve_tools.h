/*
 * kvsieve_tools.h — the public API's tools and diagnostics: what a command
 * line, a benchmark or a model-file utility needs beyond inference itself
 * (kvsieve.h).
 *
 * Why a header of its own: the kvsieve CLI is written against the public
 * API only (a test fails when app/ includes anything else), and its
 * developer commands — bench, info, gen-model, eval — need the machine's
 * measured roofs, the engine's SIMD level, a model's shape, the listing of
 * a GGUF file and the synthetic-model writer.  Each is a small opaque-handle
 * or plain-struct call with a ks_status return, as in kvsieve.h; none
 * exposes an engine struct.  Applications that only generate text never
 * need this header.
 */
#ifndef KVSIEVE_TOOLS_H
#define KVSIEVE_TOOLS_H

#include "kvsieve.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- misc -- */
/* Monotonic seconds. */
double ks_time_sec(void);
/* Number of online CPU cores. */
int ks_cpu_count(void);
/* The host's facts the OS keeps (Linux /proc, macOS sysctl; src/core/platform.c):
 * the CPU's name ("unknown" if none), the memory available now in bytes (0:
 * unknown), the running executable's path (false: unknown). */
void ks_host_cpu_name(char *buf, size_t cap);
size_t ks_host_mem_available(void);
bool ks_host_exe_path(char *buf, size_t cap);
/* Debug logging on stderr (true) or the default level (false). */
void ks_log_verbose(bool on);
/* Record a failure as ks_last_error() reports it ("file:line: message") and return st. */
ks_status ks_fail_at(ks_status st, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* --------------------------------------------------------- stop strings -- */
/* A streaming matcher of stop strings (see src/sample/stop.h's essay): each
 * decoded piece goes in; what comes out can no longer become part of a stop
 * string and ends on a UTF-8 character boundary. */
typedef struct ks_stop_matcher ks_stop_matcher;

typedef struct ks_stop_out {
    const char *text; /* [len] bytes safe to emit now; valid until the next call on the matcher */
    size_t len;
    bool matched;     /* a stop string completed; text ends right before it */
    int32_t which;    /* index of the matched stop string, -1 if none */
    size_t n_held;    /* bytes held back after this call (possible stop prefix / partial UTF-8) */
} ks_stop_out;

/* stops: [n_stops] NUL-terminated, non-empty strings (copied).  n_stops may
 * be 0 (then only UTF-8 boundaries are held back). */
ks_status ks_stop_create(const char *const *stops, size_t n_stops, ks_stop_matcher **out);
void ks_stop_destroy(ks_stop_matcher *m);
/* Forget all held text and any match (new generation). */
void ks_stop_reset(ks_stop_matcher *m);
/* Feed the next piece of generated text.  After a match, further feeds emit nothing. */
ks_status ks_stop_feed(ks_stop_matcher *m, const char *piece, size_t len, ks_stop_out *out);
/* End of generation without a match: release everything held back. */
void ks_stop_flush(ks_stop_matcher *m, ks_stop_out *out);

/* ----------------------------------------------------------------- SIMD -- */
/* The instruction-set level the kernels dispatch on (one process-wide value).
 * x86 levels and ARM levels are ordered within their architecture; a CPU
 * only ever reports levels of its own (the ARM ones: NEON, NEON with the dot
 * product extension, and with int8 matrix multiply as well). */
typedef enum ks_simd_level {
    KS_SIMD_SCALAR = 0,
    KS_SIMD_AVX2 = 1,
    KS_SIMD_AVX512 = 2,
    KS_SIMD_NEON = 3,
    KS_SIMD_NEON_DOT = 4,
    KS_SIMD_NEON_I8MM = 5,
} ks_simd_level;
#define KS_SIMD_LEVEL_MAX KS_SIMD_NEON_I8MM

/* Best level this CPU supports (cached); KS_SIMD env var ("scalar", "avx2",
 * "avx512", "neon", "dotprod", "i8mm") caps it for testing. */
ks_simd_level ks_simd_detect(void);
const char *ks_simd_name(ks_simd_level level);
/* The level kernels dispatch on: the detected one unless forced. */
ks_simd_level ks_simd_current(void);
/* Force a level (tests, eval's --reference-simd); returns the previous one.
 * A level above the CPU's is capped at the CPU's; one of the other
 * architecture means scalar (so a test's loop over every level is safe).
 * Not thread-safe: call between steps, with no other call running. */
ks_simd_level ks_simd_force(ks_simd_level level);

/* ------------------------------------------------- machine measurements -- */
/* A thread pool for the probes below (the caller participates as thread 0). */
typedef struct ks_pool ks_pool;
ks_status ks_pool_create(int n_threads, ks_pool **out);
void ks_pool_destroy(ks_pool *pool);

typedef struct ks_membw_result {
    double copy_gbs;        /* a[i] = b[i] */
    double triad_gbs;       /* a[i] = b[i] + s * c[i] */
    double read_gbs;        /* sum += a[i] (several accumulators) */
    size_t bytes_per_array; /* as measured (rounded down to whole 64-byte lines per thread) */
    int reps;               /* best of this many repetitions per kernel */
    int n_threads;          /* threads of the pool used */
    double seconds;         /* wall time of the whole probe, allocation included */
    double checksum;        /* of the read kernel; keeps it from being optimised away */
} ks_membw_result;

/* STREAM-like bandwidth with three float32 arrays of bytes_per_array each
 * (0: default), best of reps (<= 0: default).  pool may be NULL (single
 * thread).  KS_ERR_INVALID_ARG if the size is below 4 KiB or above 16 GiB. */
ks_status ks_membw_measure(ks_pool *pool, size_t bytes_per_array, int reps, ks_membw_result *out);
/* The int8 multiply-add peak of the pool's threads (a register-only loop run
 * for about `seconds`), in multiply-adds per second; 0 without VNNI. */
double ks_int8_peak_macs(ks_pool *pool, double seconds);

/* ---------------------------------------------------------- model shape -- */
typedef struct ks_model_info {
    const char *arch_name;   /* "llama", "qwen3", ... (owned by the model) */
    int32_t n_layer, n_head, n_head_kv, head_dim, n_embd, n_vocab, n_ctx_train;
    double weight_bytes;     /* bytes of the weight tensors */
    int32_t n_local, n_swa;  /* sliding-window layers (they keep only their last n_swa entries) and the window; 0: none */
    /* mixture of experts (0 without): n_expert per layer, n_expert_used active per token; expert_bytes of
     * every layer's experts (part of weight_bytes), expert_active_bytes those one token reads, and
     * decode_bytes the weights one decode step of one token streams (its active experts only) */
    int32_t n_expert, n_expert_used;
    double expert_bytes, expert_active_bytes, decode_bytes;
} ks_model_info;
void ks_model_get_info(const ks_model *model, ks_model_info *out);
/* Bytes of one KV row of head_dim elements (one K or V vector of one head). */
size_t ks_kv_type_row_bytes(ks_kv_type type, int32_t head_dim);

/* Attention recall probe (eval): with the probe on, a context measures the
 * share of the dense attention mass each decode step's selection covers.
 * take_recall returns it since the last take (per layer x head into
 * per_layer_head when non-NULL, the mean into *mean; NaN when none). */
void ks_context_set_recall_probe(ks_context *c, bool on);
void ks_context_take_recall(ks_context *c, double *per_layer_head, double *mean);

/* Selection turnover probe (SpeContext's elastic loading judged against an
 * oracle): with the probe on, every decode step of a sparse layer (one that
 * selects, resident, no prefill eviction) compares, per sequence, layer and
 * KV head, the policy's selected entries with the previous step's, and the
 * oracle's set with its previous one: the oracle's set is the true top-T of
 * the step's dense attention weights (summed over the group's query heads),
 * T the number of entries the policy selected that step.  policy_moved
 * counts |S_now \ S_prev| (what elastic loading copies), oracle_moved the
 * same for the oracle's sets, selected the T of the steps compared (the
 * first step of each head only sets the baseline, and a sequence's reset
 * starts a new one).  On costs a dense pass
 * per selection, like the recall probe, and two bit masks of the context
 * per (sequence, layer, head), allocated here: KS_ERR_NOMEM when refused
 * (the probe stays off). */
typedef struct ks_turnover {
    uint64_t policy_moved, oracle_moved, selected;
} ks_turnover;
ks_status ks_context_set_turnover_probe(ks_context *c, bool on);
/* The counts since the last take (summed over sequences, layers and heads),
 * then zeroed. */
void ks_context_take_turnover(ks_context *c, ks_turnover *out);

/* ------------------------------------------------------------ model files -- */
/* `kvsieve info`: print a GGUF file's metadata keys (show_kv), tensors
 * (show_tensors) and the model's summary, or the same of an EAGLE-3
 * checkpoint directory, to f.  On failure *what (when non-NULL) names the
 * step that failed ("reading the file", "loading the model", ...). */
ks_status ks_file_info(const char *path, bool show_kv, bool show_tensors, FILE *f, const char **what);

/* `kvsieve gen-model`: a GGUF with deterministic pseudo-random weights of a
 * real model shape.  Same parameters -> byte-identical file. */
typedef struct ks_gen_model_params {
    const char *shape;       /* a shape name (ks_gen_model_shapes lists them) */
    const char *type;        /* weight type: q8_0 | q6_k | q5_k_m | q5_k | q5_1 | q5_0 | q4_k_m | q4_k | q4_1 | q4_0 | iq4_xs | iq4_nl | q3_k | q2_k | f16 | bf16 | f32 */
    const char *vocab_path;  /* tokenizer.* keys are copied from this GGUF; its token count is n_vocab */
    uint64_t seed;           /* default 42 */
    int32_t n_layer, n_ctx;  /* 0: the shape's own */
    int32_t n_threads;       /* 0: all cores */
    bool progress;           /* progress lines on stderr for files over 64 MiB (default true) */
} ks_gen_model_params;

typedef struct ks_gen_model_result {
    uint64_t bytes;          /* file size */
    int32_t n_layer;
    int64_t n_vocab;
    const char *shape_name, *arch, *type_name; /* static strings */
} ks_gen_model_result;

ks_gen_model_params ks_gen_model_default_params(void);
/* The shapes gen-model knows, one line each, to f. */
void ks_gen_model_shapes(FILE *f);
bool ks_gen_model_shape_known(const char *shape);
/* Whether name is a weight type gen-model writes. */
bool ks_gen_model_type_known(const char *type);
/* Write the model to path.  KS_ERR_NOT_FOUND for an unknown shape or type;
 * on failure *what (when non-NULL) names the step ("reading the vocabulary",
 * "writing the model"); no partial file is left. */
ks_status ks_gen_model(const ks_gen_model_params *p, const char *path, ks_gen_model_result *out, const char **what);
/* A random EAGLE-3 retrieval head (BF16) for a model written by ks_gen_model
 * with the same parameters, into directory dir. */
ks_status ks_gen_model_dlm(const ks_gen_model_params *p, int64_t n_vocab, const char *dir);

#ifdef __cplusplus
}
#endif
#endif
