/*
 * kv_internal.h — the store's representation, shared by its two files:
 * kv.c (pages, appends, compaction, metadata) and kv_tier.c (where a page's
 * bytes live and how they move between the tiers).  Nothing outside src/kv
 * includes it: other modules see kv.h and kv_meta.h only.
 */
#ifndef KS_KV_INTERNAL_H
#define KS_KV_INTERNAL_H

#include "kv/copy.h"
#include "kv/kv.h"

#include <stdatomic.h>
#include <sys/types.h>

typedef struct {
    ks_kv_tier tier;
    uint8_t *fast;        /* [n_phys][page_bytes] pages of a FAST layer */
    uint8_t *slow;        /* [n_phys][page_bytes] memory slow tier (SLOW, no directory) */
    int fd;               /* file slow tier (SLOW with a directory), else -1 */
    uint8_t *slots;       /* elastic buffer of a SLOW layer: [n_sh][n_slot][row] K rows, then the same of V rows */
    int32_t *slot_ent;    /* [n_sh][n_slot] physical entry (id * P + row) held by a slot, -1 empty */
    uint32_t *slot_stamp; /* [n_sh][n_slot] fetch stamp of the last use */
    int32_t *slot_victim; /* [n_sh][n_slot] a fetch's scratch: the slots it may overwrite, oldest first */
    uint32_t *stamp;      /* [n_sh] current fetch stamp of each (seq, head) */
    int32_t *slot_of;     /* [n_phys * P] slot (sh * n_slot + s) holding a physical entry, -1 none */
    uint8_t *in_use;      /* [n_phys] refs > 0 */
    int32_t *refs;        /* [n_phys] holders of a page: page-table entries plus pins */
    int32_t *pins;        /* [n_phys] pins (holders outside any sequence, ks_kv_pin) */
    /* sharing counters: changed by the thread driving the layer, read by
     * anyone (ks_kv_share_info_get: a metrics snapshot), hence atomic */
    _Atomic int32_t n_pinned;   /* pages with pins > 0 (at most the store's pin_cap) */
    _Atomic int64_t dup_pages;  /* sum over pages of (table references - 1) where positive */
    _Atomic int64_t pin_tabled; /* pages pinned and in some page table too */
    int32_t *free_ids;    /* [n_phys] free stack (may hold stale ids) */
    int32_t n_free;
    int32_t *fill;        /* [n_phys] valid entries */
    int32_t *pos;         /* [n_phys][P] positions */
    float *kmin, *kmax, *ksum; /* [n_phys][head_dim] key summaries */
    uint16_t *kbound16;   /* [n_phys][2][head_dim] kmin then kmax as f16 (f16 KV only, else NULL) */
    uint8_t *kbound8;     /* [n_phys][ks_kv_bounds8_bytes(head_dim)] 8-bit outward-rounded bounds (kv_meta.h) */
    ks_copy_event ev;
    bool fail_reads;
} kv_layer;

/* A parked sequence (ks_kv_seq_park): every page of every (layer, KV head),
 * in order (layer, head, logical page), whole (K then V) and byte for byte,
 * in host memory or an unlinked file of the offload directory, with its
 * metadata (fill, positions, key summaries) and entry counts. */
typedef struct kv_parked {
    int32_t *n_ent;       /* [n_layer][n_head_kv] entries */
    int64_t n_pages, n_entries;
    uint8_t *data;        /* [n_pages][page_bytes] (memory), NULL with fd */
    int fd;               /* file, else -1 */
    int32_t *fill;        /* [n_pages] */
    int32_t *pos;         /* [n_pages][P] */
    float *kmin, *kmax, *ksum; /* [n_pages][head_dim] */
} kv_parked;

struct ks_kv_store {
    ks_kv_params p;
    int32_t P, hd, nh, max_pages, n_sh;
    int32_t n_slot;       /* entries of the elastic buffer per (seq, KV head) of a SLOW layer */
    int32_t n_phys;       /* head-pages per layer: every sequence's full context, plus pin_cap */
    int32_t pin_cap;      /* pages per layer that may be pinned (the pool's headroom for them) */
    size_t row, page_bytes;
    kv_layer *layers;     /* [n_layer] */
    int32_t *table;       /* [n_seq][n_layer][n_head_kv][max_pages] logical -> physical */
    int32_t *n_ent;       /* [n_seq][n_layer][n_head_kv] entries */
    ks_copy_engine *copy;
    ks_kv_pin_release_fn pin_release; /* the pins' holder (ks_kv_set_pin_holder) */
    void *pin_release_arg;
    kv_parked **parked;   /* [n_seq] NULL: the sequence is not parked */
    float *tmp;           /* [2][head_dim] row conversion scratch (appends are serial) */
    uint8_t *page_tmp;    /* [2][page_bytes] compaction scratch */
    _Atomic uint64_t bytes_loaded, bytes_stored, pages_loaded, pages_hit;
    _Atomic uint64_t entries_loaded, entries_hit, sync_fallbacks;
    double wait_seconds;
};

static inline size_t kv_hidx(const ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head) {
    return ((size_t)seq * kv->p.n_layer + (size_t)layer) * (size_t)kv->nh + (size_t)head;
}
/* [max_pages] logical -> physical page ids of (seq, layer, head) */
static inline int32_t *kv_table_of(const ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head) {
    return kv->table + kv_hidx(kv, seq, layer, head) * (size_t)kv->max_pages;
}
/* Byte offset of row `slot` of K (or V) inside a page laid out K then V. */
static inline size_t kv_row_off(const ks_kv_store *kv, int32_t slot, bool is_v) {
    return ((is_v && !kv->p.k_only ? (size_t)kv->P : 0) + (size_t)slot) * kv->row;
}

/* Fast-tier layout (FreeKV's hybrid layout): all K halves of a layer's pages
 * back to back, then all V halves, so the K rows of a head whose pages are
 * consecutive ids form one sequential stream for the attention kernel, as in
 * a flat cache.  The slow tier keeps each page's K and V together (one
 * transfer); loads split it into the two halves. */
static inline size_t kv_half_bytes(const ks_kv_store *kv) { return (size_t)kv->P * kv->row; }
/* 2 halves a page (K, V), or 1 in a k_only store */
static inline size_t kv_n_halves(const ks_kv_store *kv) { return kv->p.k_only ? 1 : 2; }
static inline uint8_t *kv_fast_k(const ks_kv_store *kv, const kv_layer *L, int32_t id) {
    return L->fast + (size_t)id * kv_half_bytes(kv);
}
static inline uint8_t *kv_fast_v(const ks_kv_store *kv, const kv_layer *L, int32_t id) {
    if (kv->p.k_only) return L->fast + (size_t)id * kv_half_bytes(kv); /* V is K */
    return L->fast + ((size_t)kv->n_phys + (size_t)id) * kv_half_bytes(kv);
}
/* K (V) row of elastic-buffer slot s (= sh * n_slot + local slot). */
static inline uint8_t *kv_slot_k(const ks_kv_store *kv, const kv_layer *L, int32_t s) {
    return L->slots + (size_t)s * kv->row;
}
static inline uint8_t *kv_slot_v(const ks_kv_store *kv, const kv_layer *L, int32_t s) {
    if (kv->p.k_only) return L->slots + (size_t)s * kv->row;
    return L->slots + ((size_t)kv->n_sh * kv->n_slot + (size_t)s) * kv->row;
}
/* Contiguous bytes (K then V) of a page in the memory slow tier, or NULL. */
static inline uint8_t *kv_slow_mem(const ks_kv_store *kv, const kv_layer *L, int32_t id) {
    return L->tier == KS_TIER_SLOW && L->slow ? L->slow + (size_t)id * kv->page_bytes : NULL;
}

/* kv_tier.c */
ks_status ks_kv_file_write(int fd, const void *src, size_t n, off_t off);
/* Whole page id to / from buf, K then V (any tier). */
ks_status ks_kv_page_read(const ks_kv_store *kv, const kv_layer *L, int32_t id, uint8_t *buf);
ks_status ks_kv_page_write(ks_kv_store *kv, kv_layer *L, int32_t id, const uint8_t *buf);
/* Free a layer's slow copy and slots (FAST again, or destruction). */
void ks_kv_release_slow(kv_layer *L);
/* Free a parked sequence's copy (NULL: nothing). */
void ks_kv_parked_free(kv_parked *pk);
/* kv.c: page ids and summaries, for kv_tier.c's park / unpark */
int32_t ks_kv_page_alloc(ks_kv_store *kv, kv_layer *L, int32_t seq, int32_t head, int32_t lp);
/* Give (seq, head)'s logical page lp a page of its own if others hold it
 * too (copy on write: bytes and metadata copied, the shared page left as
 * it was).  KS_ERR_NOMEM / KS_ERR_IO leave the table unchanged. */
ks_status ks_kv_page_private(ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, int32_t lp);
void ks_kv_head_clear(ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head);

/* Rewrite page id's compact bounds (f16 where the cache keeps them, 8-bit
 * always) from its f32 kmin / kmax. */
void ks_kv_meta_compact_bounds(ks_kv_store *kv, kv_layer *L, int32_t id);

#endif
