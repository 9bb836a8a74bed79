/*
 * internal.h — the seams between the files of the context, for those files
 * only (tests and tools use infer.h).
 *
 * The context is one object (struct ks_context, infer.h) served by several
 * files, each with one job:
 *   context.c   create / destroy, accessors, statistics, the services a
 *               policy calls back into (attention probabilities, keys, evict)
 *   step.c      the public steps: ks_prefill, ks_decode, synthetic fill
 *   forward.c   ks_infer_forward_rows: the layers of a transformer over a list of rows
 *   attend.c    the attention of one layer: tasks per (row, KV head), the
 *               policy's selection, the kernel call, the recall probe
 *   segments.c  which entries a (row, head) reads and where their bytes are:
 *               selection -> entry mask -> page-bounded segments -> pointers
 *   tiers.c     the slow tier seen from the context: the adaptive memory
 *               plan, prefetch of a global selection, prefill slot loading
 *   prefill_sparse.c  the opt-in sparse prefill's plan of a block
 *   prefix_context.c  the prefix cache (src/prefix/) from the context's side
 * The functions below are what one of them needs from another; no two of
 * them need each other (the CTest module_cycles checks it), which is why the
 * small accessors every file asks (ks_infer_policy_of) are inline in infer.h.
 * The attention kernels are a module of their own, attn/.
 */
#ifndef KS_INFER_INTERNAL_H
#define KS_INFER_INTERNAL_H

#include "infer/infer.h"

/* ------------------------------------------------------------ context.c -- */
/* Whether seq's policy selects at layer il of a decode step (it has a
 * selector and il is past its dense layers). */
bool ks_infer_seq_sparse(const ks_context *c, int32_t seq, int32_t il);

/* ------------------------------------------------------------ forward.c -- */
/* Rows: n entries (seq[i], pos[i], tok[i]); the logits of the rows with
 * want[i] (want NULL: none) are written one after another to logits_out
 * [n_want][n_vocab].  obs_slot[i] >= 0 (optional) copies row i's queries to
 * obs_q for on_prefill.  On failure the appended entries stay; callers reset
 * the sequence. */
ks_status ks_infer_forward_rows(ks_context *c, int n, const int32_t *seq, const int32_t *pos, const int32_t *tok,
                                const bool *want, float *logits_out, const int32_t *obs_slot);

/* ---------------------------------------------------------------- mla.c -- */
/* Latent attention (layers with L->mla): the absorbed queries of the n rows
 * into c->q ([n][n_head][head_dim]), each row's latent + rope key appended
 * to KV head 0, as ks_infer_forward_rows's qkv step does for other layers. */
ks_status ks_infer_mla_qkv(ks_context *c, const ks_layer *L, int il, int n, const int32_t *seq, const int32_t *pos,
                           const int32_t *obs_slot);
/* After attention: each head's weighted latent (c->att) through W_UV into
 * c->q as [n][n_head * v_head_mla], the input of L->wo. */
void ks_infer_mla_out(ks_context *c, const ks_layer *L, int n);
/* ------------------------------------------------------------- attend.c -- */
/* Attention of layer il for the n rows (seq, pos) whose q is in c->q: writes
 * c->att.  sparse: a decode step, where each row's own policy selects at
 * this layer when ks_infer_seq_sparse says so.  next (or NULL): the weight
 * that multiplies c->att next; each row is then also quantized for it into
 * c->mm_scratch as soon as its last head is written (ks_matmul_quantize_x),
 * so that product runs with x_ready. */
ks_status ks_infer_attend_layer(ks_context *c, int il, int n, const int32_t *seq, const int32_t *pos, bool sparse,
                                const ks_weight *next);

/* ------------------------------------------------------ prefill_sparse.c -- */
/* The sparse prefill's runs for the block of R rows of sequence seq (causal
 * counts n_att, queries q, row stride q_stride, G heads each) at layer il, KV
 * head h: planned into s->segs, s->first, s->pages as ks_infer_segs_plan
 * does (s->mask, s->sel, s->weights and s->scores used as scratch), with
 * n_out[r] row r's count within the runs.  Returns the number of runs, or
 * -1 when the block attends densely (off, a dense layer, no middle page). */
int32_t ks_prefill_sparse_plan(ks_context *c, ks_attn_scratch *s, int32_t seq, int il, int h, const float *q,
                               size_t q_stride, int R, const int32_t *n_att, int32_t *n_out, int32_t *npages,
                               int32_t *total);

/* ----------------------------------------------------------- segments.c -- */
/* Whether a budget leaves something to choose among n entries.  A budget that
 * covers the head attends everything, which is also what makes a full budget
 * bit-identical to dense for page-granular policies. */
bool ks_infer_budget_binds(const ks_context *c, int32_t seq, int32_t n);

/* Ask req->seq's policy for req (row, seq, layer, head, pos, n_entries and q filled
 * in; the budget's split into sinks, window and n_select is filled here),
 * adding the time it took to *seconds.  Unless sel->all, mask ([n/64 + 1]
 * words) receives the entries to attend: sinks, window and the selection.
 * sel's buffers are the scratch's; want_next offers the policy the hint
 * buffer (a slow-tier layer, where recall for the next step can start now):
 * without it a speculating policy defers its next selection until the next
 * step needs it. */
ks_status ks_infer_select(ks_context *c, ks_attn_scratch *s, ks_select_req *req, ks_selection *sel, bool want_next,
                          double *seconds);

/* The entries [0, n) set in mask (NULL: all of them) as runs that never cross
 * a page of P entries, in entry order: run i starts at entry first[i] and has
 * segs[i].len entries (its pointers are set by ks_infer_segs_resolve), and
 * pages[0..*npages) lists the logical pages touched, ascending.  Returns the
 * number of runs; *total receives the entries. */
int32_t ks_infer_segs_plan(const uint64_t *mask, int32_t n, int32_t P, ks_kv_seg *segs, int32_t *first,
                           int32_t *pages, int32_t *npages, int32_t *total);
/* The same over the entries [lo, n) only (a local layer's window). */
int32_t ks_infer_segs_plan_from(const uint64_t *mask, int32_t lo, int32_t n, int32_t P, ks_kv_seg *segs,
                                int32_t *first, int32_t *pages, int32_t *npages, int32_t *total);

/* A local layer's window (sliding-window attention, ks_layer.window): the
 * first entry a row holding n entries attends.  Local layers keep their
 * entries in position order with nothing evicted, so the window
 * (pos - window, pos] is the last `window` entries.  0 for a global layer. */
int32_t ks_infer_window_lo(const ks_context *c, int32_t il, int32_t n);
/* Drop the whole pages of seq's local layers that no later query can see
 * (every head keeps at least the window), unless swa_hold[seq]. */
ks_status ks_infer_swa_trim(ks_context *c, int32_t seq);

/* Point each run at its K and V rows: in place (a fast layer, or a slow one
 * whose pages sit in slots), or, with gather, reading page pages[i] into
 * gather + i * page_bytes first. */
ks_status ks_infer_segs_resolve(ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, ks_kv_seg *segs,
                                const int32_t *first, int32_t nseg, const int32_t *pages, uint8_t *gather);

/* The slow-tier variant (elastic buffer): point each of the nseg runs (all
 * fetched) at its rows in the buffer when they are consecutive slots, else
 * copy them into staging (K [cap][row], then V [cap][row]) in entry order
 * and point the run there; runs unchanged.  *copied (NULL: not counted)
 * grows by the bytes copied. */
ks_status ks_infer_segs_resolve_buffered(const ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, ks_kv_seg *segs,
                                         const int32_t *first, int32_t nseg, uint8_t *staging, size_t cap,
                                         uint64_t *copied);

/* The entries set in mask (NULL: all) below n, ascending, into out; returns their number. */
int32_t ks_infer_mask_entries(const uint64_t *mask, int32_t n, int32_t *out);

/* The scratch's gather buffer (every page of a head, or as many K and V rows:
 * ks_infer_gather_entries), allocated on first use: NULL when the allocator
 * refuses it. */
size_t ks_infer_gather_entries(const ks_context *c);
uint8_t *ks_infer_gather_buffer(ks_context *c, ks_attn_scratch *s);

/* -------------------------------------------------------------- tiers.c -- */
/* Entry slots of the elastic buffer per (seq, KV head) of an offloaded layer
 * (0: every entry), for the default policy's budget. */
int32_t ks_infer_buffer_entries(const ks_context_params *p, int32_t budget);
/* Whether a plan holds the weights and one sequence with every layer
 * offloaded (its budget entries): the least a capped context must hold; more
 * sequences are the scheduler's to admit or pause (ks_context_mem_fits). */
bool ks_infer_plan_holds_one(const ks_memplan_params *p);
/* The memory model over the context's real sizes (params.mem_cap > 0). */
ks_status ks_infer_plan_init(ks_context *c);
/* Algorithm 2 over the actual state (kv/memplan.h, ks_memplan_offloaded_for)
 * as the coming step leaves it: the unparked sequences plus extra_tokens,
 * extra_seqs sequences starting, the longest at least `longest`; moves the
 * deepest fast layers to the slow tier until it fits. */
ks_status ks_infer_plan_apply(ks_context *c, int64_t extra_tokens, int32_t extra_seqs, int64_t longest);
/* After before_step of a global policy: queue the entries its selection
 * touches in every slow-tier layer from first_layer (the policy's first
 * sparse layer) up, so loads overlap the layers before. */
ks_status ks_infer_prefetch_global(ks_context *c, int32_t first_layer, int32_t n, const int32_t *seqs,
                                   const int32_t *pos);
/* Prefill of slow-tier layer il: load each sequence's heads into the slots
 * (rows of one sequence run in parallel and share them), then wait. */
ks_status ks_infer_load_prefill_slots(ks_context *c, int il, int n, const int32_t *seq);

/* ----------------------------------------------------- prefix_context.c -- */
/* After the forward of a whole prompt (seq holds exactly prompt[0, n) from
 * position 0), before the prefill hooks: cache the prompt's full blocks of
 * KV not cached yet. */
ks_status ks_prefix_capture_kv(ks_context *c, ks_prefix_cache *pc, int32_t seq, const int32_t *prompt, int32_t n);
/* After the hooks: the policy's own per-token state of those blocks. */
ks_status ks_prefix_capture_state(ks_context *c, ks_prefix_cache *pc, int32_t seq, const int32_t *prompt, int32_t n);

#endif
