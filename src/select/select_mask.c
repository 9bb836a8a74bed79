/*
 * select_mask.c — the budget arithmetic and the entry mask, written once for
 * the two callers of a decode selection: the engine (src/infer, segments.c)
 * and the public selection API over a caller-owned cache (select_api.c).
 *
 * A budget counts every entry a KV head attends, sinks and window included:
 * the policy is asked for n_select = budget - sink - window entries (or
 * ceil(n_select / P) pages), and the three sources, which overlap and come
 * in any order, are merged in a bitmap over the head's entries, one bit
 * each, so the result is sorted and duplicate-free for free.
 */
#include "select/select_mask.h"

#include <string.h>

bool ks_policy_budget_binds(const ks_policy *pol, int32_t n) {
    int32_t budget = ks_policy_spec_of(pol)->budget;
    return budget > 0 && budget < n;
}

/* bits [a, b) of m, a word at a time */
static void mask_set_range(uint64_t *m, int32_t a, int32_t b) {
    while (a < b) {
        int32_t w = a >> 6, lo = a & 63, hi = b - (w << 6) < 64 ? b - (w << 6) : 64; /* bits [lo, hi) of word w */
        m[w] |= (hi == 64 ? ~0ull : (1ull << hi) - 1) & ~((1ull << lo) - 1);
        a = (w << 6) + hi;
    }
}

ks_status ks_policy_select_mask(ks_policy *pol, ks_select_req *req, ks_selection *sel, int32_t page, uint64_t *mask) {
    const ks_policy_spec *pp = ks_policy_spec_of(pol);
    int32_t n = req->n_entries, P = page;
    req->sink = pp->sink < n ? pp->sink : n;
    req->window = pp->window < n ? pp->window : n;
    req->n_select = pp->budget - req->sink - req->window > 0 ? pp->budget - req->sink - req->window : 0;
    KS_TRY(ks_policy_select(pol, req, sel));
    if (sel->all) return KS_OK;
    memset(mask, 0, sizeof(uint64_t) * ((size_t)n / 64 + 1));
    mask_set_range(mask, 0, req->sink);
    mask_set_range(mask, n - req->window, n);
    for (int32_t i = 0; i < sel->n; i++) {
        int32_t x = sel->idx[i];
        if (sel->pages) {
            if (x >= 0 && (int64_t)x * P < n) mask_set_range(mask, x * P, (x + 1) * P < n ? (x + 1) * P : n);
        } else if (x >= 0 && x < n) {
            mask[x >> 6] |= 1ull << (x & 63);
        }
    }
    return KS_OK;
}
