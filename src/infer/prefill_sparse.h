/*
 * prefill_sparse.h — the opt-in sparse prefill (prefill_sparse.c): which
 * cached entries a block of prompt rows attends when the context's
 * prefill_policy is "quest".  The context parses the setting once; the
 * prefill attention (attend.c) asks for a block's plan and hands it to the
 * block kernels it already calls.
 */
#ifndef KS_INFER_PREFILL_SPARSE_H
#define KS_INFER_PREFILL_SPARSE_H

#include "kvsieve.h"

#include <stdbool.h>
#include <stdint.h>

/* The parsed ks_context_params.prefill_policy.  on == false: dense (every
 * field below unused).  Sizes in entries, per block of rows and KV head. */
typedef struct ks_prefill_sparse {
    bool on;
    int32_t budget;       /* entries a block attends: sinks + window + selected pages */
    int32_t sink;         /* leading entries always attended (rounded up to whole pages) */
    int32_t window;       /* entries before the block's first row always attended (plus its own) */
    int32_t dense_layers; /* the first N layers attend every entry */
} ks_prefill_sparse;

/* Defaults of "quest" with no arguments. */
enum { KS_PREFILL_SPARSE_BUDGET = 2048, KS_PREFILL_SPARSE_SINK = 32, KS_PREFILL_SPARSE_WINDOW = 512,
       KS_PREFILL_SPARSE_DENSE = 2 };

/* spec: NULL, "" or "dense" (off), "quest" or "quest:k=v,k=v" with keys
 * budget, sink, window, dense.  page: the context's KV page size, which the
 * budget must exceed sink + window by.  KS_ERR_INVALID_ARG with a message
 * naming the fault; *out written only on success. */
ks_status ks_prefill_sparse_parse(const char *spec, int32_t page, ks_prefill_sparse *out);

/* The canonical spec of a parsed setting: "dense", or
 * "quest:budget=B,sink=S,window=W,dense=D" with every value written out, so
 * that two spellings of one configuration ("quest" and its defaults named)
 * are one string.  It is what the prefix cache keys a sparse prefill's KV
 * by (infer/prefix_context.c).  cap >= 96 always suffices. */
void ks_prefill_sparse_canonical(const ks_prefill_sparse *p, char *out, size_t cap);

#endif
