/*
 * segments.c — from "which entries does this (row, KV head) read" to "where
 * are their bytes", written once for every reader of the KV store.
 *
 * A policy answers with entries or pages; the framework adds the sinks and
 * the recent window, merged in a bitmap over the head's entries by
 * ks_policy_select_mask (src/select, shared with the public selection API).
 * The bitmap's runs of set bits are then cut at page boundaries, because a page
 * is the unit the store places in memory: a run inside one page is a
 * contiguous block of K rows and one of V rows, which the kernels read in
 * place.  Dense attention is the same walk with no bitmap.
 *
 * Planning (runs and the pages they touch) is separate from resolving
 * (pointers), because a slow-tier layer must fetch exactly the selected
 * entries into its elastic buffer between the two.  Entries land in
 * whatever slots the entries that left freed, so a run whose rows are not
 * consecutive slots is read through the worker's staging area, copied in
 * entry order with the same runs as a fast layer: the kernels' blocks (and
 * so their rounding) follow the runs, and this keeps an offloaded layer
 * bit-identical to a resident one (a fast-tier copy; slow-tier traffic is
 * only what the buffer misses).  A run that sits in consecutive slots — a
 * single token of a token-level selection, or a run whose slots kept their
 * order — is read in place, so an unchanged selection copies nothing.
 * A selection larger than the buffer reads whole pages into the same area
 * instead (counted as a synchronous fallback).  Every caller — decode
 * attention, the prefill block, the recall probe, the policies' attention
 * probabilities and the global prefetch — goes through these functions.
 */
#include "infer/internal.h"

#include <string.h>

/* Next index >= t (and < n) whose bit equals `value`, or n. */
static int32_t mask_next(const uint64_t *m, int32_t t, int32_t n, bool value) {
    while (t < n) {
        uint64_t w = m[t >> 6];
        if (!value) w = ~w;
        w >>= (t & 63);
        if (w) {
            t += __builtin_ctzll(w);
            return t < n ? t : n;
        }
        t = (t | 63) + 1;
    }
    return n;
}

bool ks_infer_budget_binds(const ks_context *c, int32_t seq, int32_t n) {
    return ks_policy_budget_binds(ks_infer_policy_of(c, seq), n);
}

ks_status ks_infer_select(ks_context *c, ks_attn_scratch *s, ks_select_req *req, ks_selection *sel, bool want_next,
                          double *seconds) {
    *sel = (ks_selection){.cap = c->n_ctx, .idx = s->sel, .next = want_next ? s->next : NULL};
    double t0 = ks_time_sec();
    ks_status st = ks_policy_select_mask(ks_infer_policy_of(c, req->seq), req, sel, c->params.page, s->mask);
    *seconds += ks_time_sec() - t0;
    return st;
}

int32_t ks_infer_segs_plan(const uint64_t *mask, int32_t n, int32_t P, ks_kv_seg *segs, int32_t *first,
                           int32_t *pages, int32_t *npages, int32_t *total) {
    return ks_infer_segs_plan_from(mask, 0, n, P, segs, first, pages, npages, total);
}

int32_t ks_infer_segs_plan_from(const uint64_t *mask, int32_t lo, int32_t n, int32_t P, ks_kv_seg *segs,
                                int32_t *first, int32_t *pages, int32_t *npages, int32_t *total) {
    int32_t nseg = 0, np = 0, tot = 0, shift = (P & (P - 1)) == 0 ? __builtin_ctz((unsigned)P) : -1;
    for (int32_t a = mask ? mask_next(mask, lo, n, true) : lo; a < n;) {
        int32_t b = mask ? mask_next(mask, a, n, false) : n;
        for (int32_t t = a; t < b;) {
            int32_t lp = shift >= 0 ? t >> shift : t / P, e = (lp + 1) * P < b ? (lp + 1) * P : b;
            if (np == 0 || pages[np - 1] != lp) pages[np++] = lp;
            first[nseg] = t;
            segs[nseg++] = (ks_kv_seg){NULL, NULL, e - t};
            tot += e - t;
            t = e;
        }
        a = mask ? mask_next(mask, b, n, true) : n;
    }
    *npages = np;
    *total = tot;
    return nseg;
}

ks_status ks_infer_segs_resolve(ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, ks_kv_seg *segs,
                                const int32_t *first, int32_t nseg, const int32_t *pages, uint8_t *gather) {
    int32_t P = ks_kv_page_size(kv);
    /* a token selection has a run per entry: no division per run when P is a power of two */
    int32_t shift = (P & (P - 1)) == 0 ? __builtin_ctz((unsigned)P) : -1;
    size_t row = ks_kv_row_size(kv), pb = ks_kv_page_bytes(kv);
    const uint8_t *K = NULL, *V = NULL;
    ks_kv_fast_view view; /* in place: the head's page table read inline, not a call per page */
    if (!gather) ks_kv_fast_view_of(kv, seq, layer, head, &view);
    for (int32_t i = 0, pi = 0, cur = -1; i < nseg; i++) {
        int32_t t = first[i], lp = shift >= 0 ? t >> shift : t / P;
        if (lp != cur) { /* runs are in entry order: pages advance monotonically */
            cur = lp;
            if (gather) {
                while (pages[pi] != lp) pi++;
                uint8_t *dst = gather + (size_t)pi * pb;
                KS_TRY(ks_kv_read_page(kv, seq, layer, head, lp, dst));
                K = dst;
                V = dst + ks_kv_page_v_off(kv); /* a k_only store's V rows are its K rows */
            } else {
                ks_kv_fast_view_page(&view, lp, &K, &V);
            }
        }
        size_t off = (size_t)(t - lp * P) * row;
        segs[i].K = K + off;
        segs[i].V = V + off;
    }
    return KS_OK;
}

int32_t ks_infer_mask_entries(const uint64_t *mask, int32_t n, int32_t *out) {
    int32_t m = 0;
    for (int32_t a = mask ? mask_next(mask, 0, n, true) : 0; a < n;) {
        int32_t b = mask ? mask_next(mask, a, n, false) : n;
        for (int32_t t = a; t < b; t++) out[m++] = t;
        a = mask ? mask_next(mask, b, n, true) : n;
    }
    return m;
}

ks_status ks_infer_segs_resolve_buffered(const ks_kv_store *kv, int32_t seq, int32_t layer, int32_t head, ks_kv_seg *segs,
                                         const int32_t *first, int32_t nseg, uint8_t *staging, size_t cap,
                                         uint64_t *copied) {
    size_t row = ks_kv_row_size(kv);
    uint8_t *Kd = staging, *Vd = staging + cap * row;
    size_t t = 0;
    uint64_t bytes = 0;
    for (int32_t i = 0; i < nseg; i++) {
        int32_t e = first[i], end = first[i] + segs[i].len;
        /* rows adjacent in the buffer: a block copy, or none when the whole
         * run is one block (every run of a token-level selection that left
         * single tokens, and runs whose slots stayed in order) */
        const uint8_t *K, *V, *K2, *V2;
        ks_kv_entry_rows(kv, seq, layer, head, e, &K, &V);
        int32_t k = 1;
        for (; e + k < end; k++) {
            ks_kv_entry_rows(kv, seq, layer, head, e + k, &K2, &V2);
            if (K2 != K + (size_t)k * row || V2 != V + (size_t)k * row) break;
        }
        if (e + k == end) { /* read in place: the same rows in the same run, so the same result */
            segs[i].K = K;
            segs[i].V = V;
            continue;
        }
        segs[i].K = Kd + t * row;
        segs[i].V = Vd + t * row;
        for (;;) {
            KS_ASSERT(t + (size_t)k <= cap);
            memcpy(Kd + t * row, K, (size_t)k * row);
            memcpy(Vd + t * row, V, (size_t)k * row);
            t += (size_t)k;
            bytes += 2 * (uint64_t)k * row;
            e += k;
            if (e == end) break;
            ks_kv_entry_rows(kv, seq, layer, head, e, &K, &V);
            for (k = 1; e + k < end; k++) {
                ks_kv_entry_rows(kv, seq, layer, head, e + k, &K2, &V2);
                if (K2 != K + (size_t)k * row || V2 != V + (size_t)k * row) break;
            }
        }
    }
    if (copied) *copied += bytes;
    return KS_OK;
}

size_t ks_infer_gather_entries(const ks_context *c) {
    return ((size_t)c->n_ctx / c->params.page + 1) * (size_t)c->params.page;
}

uint8_t *ks_infer_gather_buffer(ks_context *c, ks_attn_scratch *s) {
    if (!s->gather) s->gather = malloc(ks_kv_page_bytes(c->kv) * ((size_t)c->n_ctx / c->params.page + 1));
    return s->gather;
}
