/*
 * kv_meta.h — the part of the KV store a selection policy may see.
 *
 * Policies choose *which* entries attention reads; they must not know where
 * the entries live (fast or slow tier) or how they are stored.  So this
 * header exposes only logical structure and page summaries: the entry count
 * of a (sequence, layer, KV head), the page size, and per logical page its
 * fill, positions, per-channel key min / max and key sum.  All summaries are
 * of the stored (rounded) keys, exact at every append.  Pointers returned
 * stay valid until the next append, compaction or clear of that head.
 */
#ifndef KS_KV_META_H
#define KS_KV_META_H

#include "kvsieve.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ks_kv_store ks_kv_store;

int32_t ks_kv_page_size(const ks_kv_store *kv);
int32_t ks_kv_head_dim(const ks_kv_store *kv);
/* Entries of (seq, layer, head); logical page i holds entries [i*P, i*P+fill). */
int32_t ks_kv_n_entries(const ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head);
int32_t ks_kv_n_pages(const ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head);

typedef struct ks_kv_page_meta {
    int32_t fill;          /* valid entries in the page (P except maybe the last) */
    const int32_t *pos;    /* [fill] position of each entry */
    const float *kmin;     /* [head_dim] per-channel minimum of the stored keys */
    const float *kmax;     /* [head_dim] per-channel maximum */
    const float *ksum;     /* [head_dim] sum of the stored keys (mean = ksum / fill) */
    /* [2][head_dim]: kmin then kmax as f16, adjacent, or NULL.  Only an f16
     * cache has them, where they are exact (its keys are f16 values), so a
     * bound computed from them equals the f32 one bit for bit while a page
     * scorer reads half the bytes, in one block per page. */
    const uint16_t *kbound16;
    /* The 8-bit bounds every cache keeps (ks_kv_bounds8_bytes(head_dim)):
     * an f32 scale s, then int8 lo[head_dim], then int8 hi[head_dim], with
     * lo[i] * s <= kmin[i] and hi[i] * s >= kmax[i] (rounded outward, s =
     * max |k| / 126), so a bound computed from them is never below the exact
     * one (up to the float rounding of its sum) and at most about two steps
     * of s per channel above it, from a quarter of f32's bytes. */
    const uint8_t *kbound8;
} ks_kv_page_meta;
void ks_kv_page_meta_get(const ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, int32_t lp,
                         ks_kv_page_meta *out);
/* Bytes of one page's 8-bit bounds: 4 + 2 head_dim, rounded up to 4. */
size_t ks_kv_bounds8_bytes(int32_t hd);
/* The 8-bit bounds (layout above) of per-channel key bounds kmin, kmax [hd]
 * into out[ks_kv_bounds8_bytes(hd)]. */
void ks_kv_bounds8_encode(const float *kmin, const float *kmax, int32_t hd, uint8_t *out);
/* The kbound8 of logical pages [0, np) in one call (out[np]). */
void ks_kv_pages_bounds8(const ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, int32_t np,
                         const uint8_t **out);
/* The kbound16 of logical pages [0, np) in one call (out[np]); false, and
 * nothing written, when the cache keeps no f16 bounds. */
bool ks_kv_pages_bounds16(const ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, int32_t np,
                          const uint16_t **out);

#endif
