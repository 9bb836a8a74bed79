/*
 * kv.h — the paged, tiered KV store.
 *
 * The unit of storage is the *head-page*: P rows of K and P rows of V of one
 * (layer, KV head).  In the slow tier a page is K [P][row] followed by V
 * [P][row], contiguous, so one KV head's page is one transfer (FreeKV's host
 * layout).  In the fast tier K halves and V halves live in two regions
 * (FreeKV's hybrid layout): a head whose pages have consecutive ids is then
 * one sequential K stream and one V stream for the attention kernel, as fast
 * as a flat cache, where interleaved K and V pages would split it into
 * pieces with holes.  Every layer has a pool of head-pages shared by all
 * sequences of the batch; each (sequence, layer, KV head) owns a page table
 * (logical page -> physical id) and an entry count.  Tables are per KV head so evictors
 * (SnapKV, H2O, DapQ) can drop different tokens per head and really free
 * pages: survivors are compacted toward the front, and each entry keeps its
 * original position in the page metadata, since its K is already rotated.
 *
 * Metadata lives apart from the data, indexed by physical id: positions,
 * per-channel min / max and the key sum (mean key = sum / fill), updated on
 * every append from the *stored* (rounded) rows, so summaries are exact at
 * page boundaries and identical whether a row came from prefill or decode.
 * Policies read metadata through kv_meta.h only; they never see tiers.
 *
 * Tiers are per layer (SpeContext's adaptive manager moves whole layers):
 *  - FAST: every page in compute memory; attention reads in place.
 *  - SLOW: pages live in host memory (a GPU engine's slow tier; on CPU a
 *    stand-in useful for tests) or in a file per layer in the offload
 *    directory, read with pread, so a context bigger than RAM still runs.
 *    Attention then reads a fast *elastic buffer* (SpeContext, Section 5.4):
 *    a fixed number of entry slots (one K row and one V row each) per
 *    (sequence, layer, KV head), B by default.  kv_fetch is given the
 *    entries a step reads (S_now); entries already buffered stay in their
 *    slots, and only S_now - S_last is copied, into the slots of the entries
 *    that left (then the least recently used), so a scattered selection
 *    moves exactly the entries that changed.  Misses that are consecutive
 *    rows of one page landing in consecutive slots merge into one transfer.
 *    Loads are queued on the copy engine, whose worker threads signal one
 *    completion counter per layer, so loads for layer l overlap the compute
 *    of layers < l and layer l waits only on its own.  Every byte moved is
 *    counted.
 * A whole sequence can also be *parked* (a scheduler's pause under a memory
 * cap): every page of all its layers and heads, with metadata, copied to
 * the slow tier and its pages freed in every pool; unparking restores it
 * byte for byte into whichever tier each layer is in by then.
 * Appends to a SLOW layer write through to the slow copy (and the slot, when
 * mapped) after that layer's in-flight loads have landed, so a load can never
 * overwrite a newer row.
 *
 * Return codes: KS_OK; KS_ERR_NOMEM (pool or slots exhausted: the store is
 * unchanged); KS_ERR_IO (slow-tier read/write failed: the layer's slow copy
 * may be partial, the caller must treat the sequence as lost); invalid
 * arguments are asserted (the context validates user input before).
 */
#ifndef KS_KV_H
#define KS_KV_H

#include "core/core.h"
#include "kv/kv_meta.h"

#define KS_KV_MAX_HEAD_DIM 1024

typedef enum ks_kv_tier { KS_TIER_FAST = 0, KS_TIER_SLOW = 1 } ks_kv_tier;

typedef struct ks_kv_params {
    int32_t n_layer, n_head_kv, head_dim;
    int32_t n_seq;            /* sequences sharing the pools */
    int32_t n_ctx;            /* max entries per (sequence, KV head) */
    int32_t page;             /* P: tokens per head-page (default 32) */
    ks_kv_type type;          /* element type of K and V rows */
    const char *offload_dir;  /* slow tier directory; NULL = host memory */
    int32_t slot_entries;     /* elastic buffer: entry slots per (seq, layer, head) of a SLOW layer; 0 = all */
    int32_t n_copy_threads;   /* copy engine workers (default 1) */
    int32_t pin_pages;        /* pages per layer that may be pinned (ks_kv_pin) beyond every sequence's own: the pool's headroom */
    bool k_only;              /* no V rows: every V read is the entry's K row (latent attention, infer/mla.c, whose
                               * values are its keys); appends store k only, pages are [P][row] K rows */
} ks_kv_params;

ks_kv_params ks_kv_default_params(void);

ks_status ks_kv_create(const ks_kv_params *p, ks_kv_store **out);
void ks_kv_destroy(ks_kv_store *kv);

/* Bytes of one head-page (K and V) and of one row. */
size_t ks_kv_page_bytes(const ks_kv_store *kv);
size_t ks_kv_row_size(const ks_kv_store *kv);
/* Offset of the V rows in a page as ks_kv_read_page returns it: P rows, or 0
 * for a k_only store (its V rows are its K rows). */
size_t ks_kv_page_v_off(const ks_kv_store *kv);

/* Append one entry (position pos) to (seq, layer, head); k, v: [head_dim].
 * Appends to different layers may run concurrently; one layer's are serial.
 * KS_ERR_NOMEM when the layer's pool is exhausted, KS_ERR_IO when the slow
 * tier refused the write. */
ks_status ks_kv_append(ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, int32_t pos, const float *k,
                       const float *v);
/* The same with the rows already in the stored format (ks_kv_row_size bytes
 * each, as ks_kv_read_page returns them): a restored prefix (infer/prefix_context.c)
 * is stored byte for byte as its prefill stored it, and its page summaries,
 * computed from the stored rows in append order, come out identical. */
ks_status ks_kv_append_stored(ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, int32_t pos,
                              const uint8_t *krow, const uint8_t *vrow);
/* The first m rows (1..P) of a page in the stored layout (K rows [P][row],
 * then V rows [P][row], as ks_kv_read_page returns it) appended at once to a
 * head whose entry count is a multiple of P, at positions pos0..: the same
 * bytes and summaries as m ks_kv_append_stored calls, with the summaries'
 * compact bounds encoded once instead of at every widening (a restored
 * prefix fills thousands of pages). */
ks_status ks_kv_append_page_stored(ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, int32_t pos0,
                                   const uint8_t *page, int32_t m);
/* Drop every entry of a sequence (all layers and heads); pages return to the pools. */
void ks_kv_seq_clear(ks_kv_store *kv, int32_t seq);
/* Keep only the entries with keep[i] != 0 (i < n_entries) of (seq, layer,
 * head), in order; pages freed by the compaction return to the pool. */
ks_status ks_kv_compact(ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, const uint8_t *keep);

/* Drop every entry after the first n_keep of (seq, layer, head). */
ks_status ks_kv_truncate(ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, int32_t n_keep);
/* Drop the first n_pages whole pages of (seq, layer, head) (n_pages * P <=
 * entries): they return to the pool (or stay with their other holders) and
 * the remaining entries become entries 0.., nothing copied.  This is how a
 * sliding-window layer keeps only its window: the caller (infer) knows the
 * window, the store only recycles pages, so a local layer's pages in use
 * stay bounded by about window / P per head whatever the length. */
ks_status ks_kv_drop_front(ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, int32_t n_pages);
/* Physical pages of a layer's pool in use (held by a table or a pin): tests. */
int32_t ks_kv_layer_pages_in_use(const ks_kv_store *kv, int32_t layer);

/* ---------------------------------------------------- shared pages -- */
/* A full page is immutable, so several holders may share it: page tables
 * of any sequences, and pins (a holder outside every sequence, e.g. a
 * prefix cache's RAM tier).  Each page carries a reference count; a page
 * returns to its pool when the last holder lets go.  Whoever would write a
 * shared page gets a copy of its own first (copy on write): compaction
 * (evictors, truncation) copies the pages it rewrites, an append never
 * writes a full page, and a layer moving to the slow tier gives every
 * sequence but one a copy (an elastic buffer's slot maps one physical entry
 * for one sequence).  Metadata (fill, positions, key bounds and sums) is
 * indexed by page, so it is shared with the page.  The pool holds every
 * sequence's full context plus pin_pages per layer, and pins never exceed
 * pin_pages: a sequence never runs out of pages because of pins.
 *
 * Pin logical page lp of (seq, layer, head): a full page of a FAST layer;
 * *id is its physical id, a handle for ks_kv_map_pinned / ks_kv_unpin.
 * KS_ERR_NOMEM when pin_pages are all pinned, KS_ERR_UNSUPPORTED for a SLOW
 * layer or a page not full (the caller copies the bytes instead). */
ks_status ks_kv_pin(ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, int32_t lp, int32_t *id);
void ks_kv_unpin(ks_kv_store *kv, int32_t layer, int32_t id);
/* Append pinned page id, whole and by reference, to (seq, layer, head),
 * whose entry count must be a multiple of P: its rows, positions and
 * summaries become the head's next P entries, without a copy.
 * KS_ERR_UNSUPPORTED for a SLOW layer (the caller copies: ks_kv_read_pinned
 * and ks_kv_append_page_stored); KS_ERR_CONTEXT_FULL past n_ctx. */
ks_status ks_kv_map_pinned(ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, int32_t id);
/* A pinned page's bytes (K rows then V rows, as ks_kv_read_page) and its first position. */
ks_status ks_kv_read_pinned(ks_kv_store *kv, int32_t layer, int32_t id, uint8_t *buf);
int32_t ks_kv_pinned_pos0(const ks_kv_store *kv, int32_t layer, int32_t id);
/* Sharing now, over every layer: page-table references beyond a page's
 * first (each such reference holds P entries no memory is spent on), pages
 * pinned, and pinned pages some sequence also holds. */
typedef struct ks_kv_share_info {
    int64_t dup_pages, pinned_pages, pinned_tabled_pages;
} ks_kv_share_info;
void ks_kv_share_info_get(const ks_kv_store *kv, ks_kv_share_info *out);
/* The holder of the store's pins (one at most): fn(arg, kv) runs once at
 * the start of ks_kv_destroy, while the pinned pages are still readable,
 * so the holder copies what it keeps and forgets its handles.  NULL fn:
 * none. */
typedef void (*ks_kv_pin_release_fn)(void *arg, ks_kv_store *kv);
void ks_kv_set_pin_holder(ks_kv_store *kv, ks_kv_pin_release_fn fn, void *arg);
/* Page-table references to the physical page behind (seq, layer, head, lp) (tests). */
int32_t ks_kv_page_refs(const ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, int32_t lp);

/* ----------------------------------------------------------- tiers -- */
ks_kv_tier ks_kv_layer_tier(const ks_kv_store *kv, int32_t layer);
/* Move a layer between tiers (all sequences); its data is copied, nothing is
 * lost.  Moving to SLOW allocates its slots; KS_ERR_IO/NOMEM leave it FAST. */
ks_status ks_kv_set_layer_tier(ks_kv_store *kv, int32_t layer, ks_kv_tier tier);

/* ------------------------------------------------ parked sequences -- */
/* Park a sequence: copy every page of every (layer, KV head) of seq, whole
 * and byte for byte, with its metadata and entry counts, to the slow tier
 * (host memory, or an unlinked file in the offload directory), then free its
 * pages in every pool (fast pages, slow copies and buffered slots alike).
 * While parked the sequence holds no entries here (ks_kv_n_entries is 0)
 * and must not be appended to; ks_kv_seq_clear drops the parked copy.
 * KS_ERR_NOMEM / KS_ERR_IO leave the sequence as it was, unparked. */
ks_status ks_kv_seq_park(ks_kv_store *kv, int32_t seq);
/* Bring a parked sequence back: pages from the pools (home ids first), its
 * bytes and metadata restored exactly into whichever tier holds each layer
 * now.  KS_ERR_NOMEM / KS_ERR_IO leave it parked. */
ks_status ks_kv_seq_unpark(ks_kv_store *kv, int32_t seq);
bool ks_kv_seq_parked(const ks_kv_store *kv, int32_t seq);
/* Entries (summed over layers and KV heads) of a parked sequence; 0 if not parked. */
int64_t ks_kv_seq_parked_entries(const ks_kv_store *kv, int32_t seq);

/* Make entries ent[0..n) (ascending, < n_entries) of (seq, layer, head)
 * readable in the fast tier.  FAST layers: nothing to do.  SLOW layers:
 * buffered entries stay, the others are queued on the copy engine (async) or
 * copied by the caller (sync) into slots no entry of this request holds.
 * Fails with KS_ERR_NOMEM (nothing changed) if n exceeds the buffer.  Safe to
 * call concurrently for different (seq, head) of one layer. */
ks_status ks_kv_fetch(ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, const int32_t *ent, int32_t n,
                      bool async);
/* Wait for the queued loads of a layer; returns the first I/O error seen. */
ks_status ks_kv_wait_layer(ks_kv_store *kv, int32_t layer);

/* Where the pages of one (sequence, FAST layer, KV head) live, for readers
 * that resolve many pages in a row (a token-level selection touches most of
 * a head's pages every layer): page lp's K rows start at
 * k + table[lp] * half, its V rows at v + table[lp] * half.  Valid until the
 * store changes that head's pages (append, eviction, compaction, tiering);
 * the store keeps ownership. */
typedef struct ks_kv_fast_view {
    const int32_t *table; /* [logical page] physical page id (borrowed) */
    const uint8_t *k, *v; /* the layer's K and V halves at id 0 (borrowed) */
    size_t half;          /* bytes of a page's K (or V) half: P rows */
} ks_kv_fast_view;
void ks_kv_fast_view_of(const ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, ks_kv_fast_view *out);
static inline void ks_kv_fast_view_page(const ks_kv_fast_view *v, int32_t lp, const uint8_t **K, const uint8_t **V) {
    size_t off = (size_t)v->table[lp] * v->half;
    *K = v->k + off;
    *V = v->v + off;
}

/* K and V rows of a logical page of a FAST layer: [P][row] each. */
void ks_kv_page_rows(const ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, int32_t lp,
                     const uint8_t **K, const uint8_t **V);
/* K and V row of entry e, readable now.  For SLOW layers the entry must have
 * been fetched (and waited for) this step. */
void ks_kv_entry_rows(const ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, int32_t e,
                      const uint8_t **K, const uint8_t **V);

/* Copy the K rows (stored format, [n][row]) of entries [first, first + n)
 * of (seq, layer, head) into dst: in place for a FAST layer, from the slow
 * tier itself for a SLOW one (K rows only, counted as bytes loaded: no V
 * rows and no whole pages).  A policy that needs exact keys of scattered
 * entries reads a row, not a page.  Fails only on a slow-tier I/O error. */
ks_status ks_kv_read_keys(ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, int32_t first, int32_t n,
                          uint8_t *dst);
/* Copy logical page lp of (seq, layer, head) into buf [page_bytes] from
 * wherever it lives (a synchronous slow-tier read when needed). */
ks_status ks_kv_read_page(ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, int32_t lp, uint8_t *buf);
/* Entry slots of the elastic buffer per (seq, KV head) of a SLOW layer. */
int32_t ks_kv_buffer_entries(const ks_kv_store *kv);
/* The caller read a slow-tier selection synchronously page by page because
 * it did not fit the buffer (counted in the traffic). */
void ks_kv_note_sync_fallback(ks_kv_store *kv);

/* Bytes moved between tiers and slot hits since the last call (then zeroed). */
typedef struct ks_kv_traffic {
    uint64_t bytes_loaded;   /* slow -> fast */
    uint64_t bytes_stored;   /* fast -> slow (appends and layer moves) */
    uint64_t pages_loaded, pages_hit; /* whole pages read past the buffer (prefill, fallbacks) */
    uint64_t entries_loaded;  /* entries copied into elastic buffers (S_now - S_last) */
    uint64_t entries_hit;     /* entries asked for that were buffered already */
    uint64_t sync_fallbacks;  /* selections read synchronously because they exceeded the buffer */
    double copy_seconds;     /* time the copy workers spent copying */
    double wait_seconds;     /* time compute waited on loads */
} ks_kv_traffic;
void ks_kv_take_traffic(ks_kv_store *kv, ks_kv_traffic *out);

/* Memory in use: fast (pages of FAST layers + slots) and slow bytes. */
void ks_kv_memory(const ks_kv_store *kv, uint64_t *fast_bytes, uint64_t *slow_bytes);

/* Test hook: make every later slow-tier read of a layer fail (I/O error path). */
void ks_kv_debug_fail_reads(ks_kv_store *kv, int32_t layer, bool fail);

#endif
