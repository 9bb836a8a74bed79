/*
 * segments.c — from "which entries does this (row, KV head) read" to "where
 * are their bytes", written once for every reader of the KV store.
 *
 * A policy answers with entries or pages; the framework adds the sinks and
 * the recent window.  Those three sources overlap and arrive in any order, so
 * they are merged in a bitmap over the head's entries (one bit each: the
 * merge is cheap and the result is sorted and duplicate-free for free).  The
 * bitmap's runs of set bits are then cut at page boundaries, because a page
 * is the unit the store places in memory: a run inside one page is a
 * contiguous block of K rows and one of V rows, which the kernels read in
 * place.  Dense attention is the same walk with no bitmap.
 *
 * Planning (runs and the pages they touch) is separate from resolving
 * (pointers), because a slow-tier layer must fetch exactly the touched pages
 * into slots between the two; a selection touching more pages than there are
 * slots reads them into a gather buffer instead.  Every caller — decode
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

static void mask_set_range(uint64_t *m, int32_t a, int32_t b) {
    for (int32_t t = a; t < b;) {
        if ((t & 63) == 0 && b - t >= 64) {
            m[t >> 6] = ~0ull;
            t += 64;
        } else {
            m[t >> 6] |= 1ull << (t & 63);
            t++;
        }
    }
}

bool ks_infer_budget_binds(const ks_context *c, int32_t n) {
    int32_t budget = ks_policy_params_of(c->policy)->budget;
    return budget > 0 && budget < n;
}

ks_status ks_infer_select(ks_context *c, ks_attn_scratch *s, ks_select_req *req, ks_selection *sel, double *seconds) {
    const ks_policy_params *pp = ks_policy_params_of(c->policy);
    int32_t n = req->n_entries, P = c->params.page;
    req->sink = pp->sink < n ? pp->sink : n;
    req->window = pp->window < n ? pp->window : n;
    req->n_select = pp->budget - req->sink - req->window > 0 ? pp->budget - req->sink - req->window : 0;
    *sel = (ks_selection){.cap = c->n_ctx, .idx = s->sel, .next = s->next};
    double t0 = ks_time_sec();
    KS_TRY(ks_policy_select(c->policy, req, sel));
    *seconds += ks_time_sec() - t0;
    if (sel->all) return KS_OK;
    uint64_t *m = s->mask;
    memset(m, 0, sizeof(uint64_t) * ((size_t)n / 64 + 1));
    mask_set_range(m, 0, req->sink);
    mask_set_range(m, n - req->window, n);
    for (int32_t i = 0; i < sel->n; i++) {
        int32_t x = sel->idx[i];
        if (sel->pages) {
            if (x >= 0 && (int64_t)x * P < n) mask_set_range(m, x * P, (x + 1) * P < n ? (x + 1) * P : n);
        } else if (x >= 0 && x < n) {
            m[x >> 6] |= 1ull << (x & 63);
        }
    }
    return KS_OK;
}

int32_t ks_infer_segs_plan(const uint64_t *mask, int32_t n, int32_t P, ks_kv_seg *segs, int32_t *first,
                           int32_t *pages, int32_t *npages, int32_t *total) {
    int32_t nseg = 0, np = 0, tot = 0;
    for (int32_t a = mask ? mask_next(mask, 0, n, true) : 0; a < n;) {
        int32_t b = mask ? mask_next(mask, a, n, false) : n;
        for (int32_t t = a; t < b;) {
            int32_t lp = t / P, e = (lp + 1) * P < b ? (lp + 1) * P : b;
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
    size_t row = ks_kv_row_size(kv), pb = ks_kv_page_bytes(kv);
    const uint8_t *K = NULL, *V = NULL;
    for (int32_t i = 0, pi = 0, cur = -1; i < nseg; i++) {
        int32_t t = first[i], lp = t / P;
        if (lp != cur) { /* runs are in entry order: pages advance monotonically */
            while (pages[pi] != lp) pi++;
            cur = lp;
            if (gather) {
                uint8_t *dst = gather + (size_t)pi * pb;
                KS_TRY(ks_kv_read_page(kv, seq, layer, head, lp, dst));
                K = dst;
                V = dst + (size_t)P * row;
            } else {
                ks_kv_page_rows(kv, seq, layer, head, lp, &K, &V);
            }
        }
        segs[i].K = K + (size_t)(t % P) * row;
        segs[i].V = V + (size_t)(t % P) * row;
    }
    return KS_OK;
}

uint8_t *ks_infer_gather_buffer(ks_context *c, ks_attn_scratch *s) {
    if (!s->gather) s->gather = malloc(ks_kv_page_bytes(c->kv) * ((size_t)c->n_ctx / c->params.page + 1));
    return s->gather;
}
