/*
 * prefill_sparse.c — the opt-in sparse prefill: each block of prompt rows
 * attends its sinks, a local window and the cached pages whose Quest bounds
 * score highest, instead of every cached entry.
 *
 * Why.  At a 16K prompt the prefill's attention is about half its time and
 * grows with the prompt's square, while the weights' part grows linearly:
 * past some length attention decides the time to first token.  "Quest:
 * Query-Aware Sparsity for Efficient Long-Context LLM Inference" (Tang et
 * al., section 3) keeps per page the per-channel min and max of its keys and
 * bounds q . k over the page by sum_i max(q_i min_i, q_i max_i); decoding
 * then reads only the pages with the highest bounds.  The same bounds serve a
 * prefill: the cached pages (earlier chunks, earlier blocks of this chunk)
 * already have them, because the KV store keeps them on every append for the
 * decode-time policies (kv_meta.h), so scoring costs no pass over the keys.
 *
 * What a block attends.  A block is KS_PREFILL_BLOCK consecutive rows of one
 * sequence and one KV head (attend.c's task), with causal counts n_att[0] <
 * ... < n_att[R-1] = n.  It reads, exactly as dense prefill would:
 *   - the sinks: the first ceil(sink / P) pages;
 *   - the window: from the page holding entry n_att[0] - 1 - window to n,
 *     which always includes the causal diagonal (the block's own rows) and
 *     at least `window` entries before its first row;
 *   - the top k pages of the middle (whole pages between the two), k =
 *     (budget - sinks - window) / P, ranked by the largest bound any of the
 *     block's R x G query rows gives the page (a page any query needs is
 *     kept: p_quest.c's group=max, extended over the block's rows).
 * The runs go to the same block kernels as a dense prefill (bf16 on AVX-512
 * BF16 hosts); each row's count becomes its count within the concatenated
 * runs, which is exact because every middle page precedes the block's first
 * row (all its rows see all of it) and the window is the runs' tail.  The
 * softmax renormalises over the attended entries only, as Quest's does.
 *
 * What stays dense.  The first `dense` layers (2, as Quest keeps its first
 * two layers dense: their attention is broad and every later layer builds on
 * them), any block whose middle has no page to drop, and everything outside
 * a single-sequence prefill (decode never comes here).  A budget that covers
 * every middle page selects them all, so the runs, counts and bits are the
 * dense prefill's (tests/test_prefill_sparse.c checks this).
 *
 * What changes.  Results depend on where blocks fall (the selection is per
 * block), so the blocks sit on one grid of entries (attend.c: the first
 * block of a chunk that starts off the grid is short) and every chunk but a
 * call's last ends on it (step.c): a row's KV then depends on the tokens up
 * to its block's end alone, whatever n_batch, and a prompt split into calls
 * on the grid, or resumed from a prefix-cache hit of the same setting (which
 * ends on a block: prefix_context.c), is bit-identical to one in one go.  It
 * is still an approximation of the dense prefill that users choose, and
 * `kvsieve eval` measures it; the cache keys its KV by the canonical setting
 * (ks_prefill_sparse_canonical), apart from dense KV.
 */
#include "infer/internal.h"

#include "policy/policy_util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One "k=v" value: a decimal integer in [lo, hi]. */
static ks_status parse_value(const char *key, const char *v, size_t len, long lo, long hi, int32_t *out) {
    char buf[32];
    if (len == 0 || len >= sizeof buf)
        return KS_FAIL(KS_ERR_INVALID_ARG, "prefill policy quest: %s needs an integer value", key);
    memcpy(buf, v, len);
    buf[len] = 0;
    char *end = NULL;
    errno = 0;
    long x = strtol(buf, &end, 10);
    if (errno || *end || buf[0] == '+' || buf[0] == ' ')
        return KS_FAIL(KS_ERR_INVALID_ARG, "prefill policy quest: %s=%s is not an integer", key, buf);
    if (x < lo || x > hi)
        return KS_FAIL(KS_ERR_INVALID_ARG, "prefill policy quest: %s=%ld out of range [%ld, %ld]", key, x, lo, hi);
    *out = (int32_t)x;
    return KS_OK;
}

ks_status ks_prefill_sparse_parse(const char *spec, int32_t page, ks_prefill_sparse *out) {
    if (!spec || !*spec || !strcmp(spec, "dense")) {
        *out = (ks_prefill_sparse){.on = false};
        return KS_OK;
    }
    if (strncmp(spec, "quest", 5) || (spec[5] && spec[5] != ':'))
        return KS_FAIL(KS_ERR_INVALID_ARG, "prefill policy '%s': expected dense, quest or quest:budget=N,sink=N,"
                                           "window=N,dense=N", spec);
    ks_prefill_sparse p = {.on = true,
                           .budget = KS_PREFILL_SPARSE_BUDGET,
                           .sink = KS_PREFILL_SPARSE_SINK,
                           .window = KS_PREFILL_SPARSE_WINDOW,
                           .dense_layers = KS_PREFILL_SPARSE_DENSE};
    const char *a = spec[5] ? spec + 6 : spec + 5;
    if (spec[5] && !*a) return KS_FAIL(KS_ERR_INVALID_ARG, "prefill policy '%s': no arguments after ':'", spec);
    while (*a) {
        const char *comma = strchr(a, ','), *end = comma ? comma : a + strlen(a), *eq = memchr(a, '=', (size_t)(end - a));
        if (!eq) return KS_FAIL(KS_ERR_INVALID_ARG, "prefill policy '%s': '%.*s' is not k=v", spec, (int)(end - a), a);
        size_t klen = (size_t)(eq - a), vlen = (size_t)(end - eq - 1);
        const char *v = eq + 1;
        if (klen == 6 && !strncmp(a, "budget", 6)) KS_TRY(parse_value("budget", v, vlen, 1, 1 << 24, &p.budget));
        else if (klen == 4 && !strncmp(a, "sink", 4)) KS_TRY(parse_value("sink", v, vlen, 0, 1 << 24, &p.sink));
        else if (klen == 6 && !strncmp(a, "window", 6)) KS_TRY(parse_value("window", v, vlen, 0, 1 << 24, &p.window));
        else if (klen == 5 && !strncmp(a, "dense", 5)) KS_TRY(parse_value("dense", v, vlen, 0, 1 << 16, &p.dense_layers));
        else
            return KS_FAIL(KS_ERR_INVALID_ARG, "prefill policy quest: unknown argument '%.*s' (budget, sink, window, dense)",
                           (int)klen, a);
        a = comma ? comma + 1 : end;
        if (comma && !*a) return KS_FAIL(KS_ERR_INVALID_ARG, "prefill policy '%s': trailing ','", spec);
    }
    int32_t sink_pages = (p.sink + page - 1) / page;
    if ((int64_t)p.budget < (int64_t)sink_pages * page + p.window + page)
        return KS_FAIL(KS_ERR_INVALID_ARG,
                       "prefill policy quest: budget=%d leaves no page to select: it must be at least sink (%d, in "
                       "whole pages of %d) + window (%d) + one page",
                       p.budget, sink_pages * page, page, p.window);
    *out = p;
    return KS_OK;
}

void ks_prefill_sparse_canonical(const ks_prefill_sparse *p, char *out, size_t cap) {
    if (!p->on) snprintf(out, cap, "dense");
    else snprintf(out, cap, "quest:budget=%d,sink=%d,window=%d,dense=%d", p->budget, p->sink, p->window, p->dense_layers);
}

ks_status ks_prefill_policy_canonical(const char *spec, int32_t page, char *out, size_t cap) {
    if (!out || cap == 0) return KS_FAIL(KS_ERR_INVALID_ARG, "NULL or empty output buffer");
    if (page <= 0) return KS_FAIL(KS_ERR_INVALID_ARG, "page %d must be positive", page);
    ks_prefill_sparse p;
    KS_TRY(ks_prefill_sparse_parse(spec, page, &p));
    ks_prefill_sparse_canonical(&p, out, cap);
    return KS_OK;
}

ks_status ks_seq_set_prefill_policy(ks_context *c, int32_t seq, const char *spec) {
    if (!c) return KS_FAIL(KS_ERR_INVALID_ARG, "NULL context");
    if (seq < 0 || seq >= c->n_seq) return KS_FAIL(KS_ERR_INVALID_ARG, "sequence %d out of range [0, %d)", seq, c->n_seq);
    ks_prefill_sparse p = c->prefill_sparse;
    if (spec) KS_TRY(ks_prefill_sparse_parse(spec, c->params.page, &p));
    c->seq_prefill[seq] = p;
    return KS_OK;
}

static void mask_set(uint64_t *m, int32_t a, int32_t b) {
    for (int32_t t = a; t < b;) {
        int32_t w = t >> 6, lo = t & 63, hi = b - (w << 6) < 64 ? b - (w << 6) : 64;
        uint64_t bits = (hi == 64 ? ~0ull : (1ull << hi) - 1) & ~((1ull << lo) - 1);
        m[w] |= bits;
        t = (w << 6) + hi;
    }
}

int32_t ks_prefill_sparse_plan(ks_context *c, ks_attn_scratch *s, int32_t seq, int il, int h, const float *q,
                               size_t q_stride, int R, const int32_t *n_att, int32_t *n_out, int32_t *npages,
                               int32_t *total) {
    const ks_prefill_sparse *sp = &c->seq_prefill[seq];
    if (!sp->on || il < sp->dense_layers) return -1;
    const ks_hparams *hp = &c->model->hp;
    int32_t P = c->params.page, G = hp->n_head / hp->n_head_kv, hd = hp->head_dim, n = n_att[R - 1];
    int32_t sink_pages = (sp->sink + P - 1) / P;
    int32_t lo_page = sink_pages, hi_page = (n_att[0] - 1 - sp->window) / P; /* the middle: pages [lo, hi) */
    if (n_att[0] - 1 - sp->window < 0 || hi_page <= lo_page) return -1;  /* nothing between sinks and window */
    int32_t M = hi_page - lo_page, k = (sp->budget - sink_pages * P - sp->window) / P;
    if (!s->sp_kb) s->sp_kb = ks_malloc(sizeof(void *) * ((size_t)c->n_ctx / P + 1));
    if (!s->sp_kb) return -1; /* dense instead: the same rows, exactly */
    uint64_t *mask = s->mask;
    memset(mask, 0, sizeof(uint64_t) * ((size_t)n / 64 + 1));
    mask_set(mask, 0, lo_page * P);
    mask_set(mask, hi_page * P, n);
    if (M <= k) {
        mask_set(mask, lo_page * P, hi_page * P); /* the budget covers the middle: the dense runs */
    } else {
        /* bounds of pages [0, hi): the f16 ones of an f16 cache (exact), else the 8-bit ones every cache keeps */
        float *red = s->weights, *row = s->scores, *tmp = s->scores + c->n_ctx;
        bool f16 = ks_kv_pages_bounds16(c->kv, seq, il, h, hi_page, (const uint16_t **)s->sp_kb);
        if (!f16) ks_kv_pages_bounds8(c->kv, seq, il, h, hi_page, (const uint8_t **)s->sp_kb);
        for (int r = 0; r < R; r++) {
            const float *qr = q + (size_t)r * q_stride;
            float *dst = r == 0 ? red : row;
            if (f16)
                ks_page_upper_bounds16_pages(qr, G, (const uint16_t *const *)s->sp_kb + lo_page, M, hd, NULL, dst);
            else ks_page_upper_bounds8_pages(qr, G, (const uint8_t *const *)s->sp_kb + lo_page, M, hd, NULL, dst);
            if (r > 0)
                for (int32_t p = 0; p < M; p++) red[p] = row[p] > red[p] ? row[p] : red[p];
        }
        int32_t got = ks_topk_scratch(red, M, k, s->sel, tmp);
        for (int32_t i = 0; i < got; i++) mask_set(mask, (lo_page + s->sel[i]) * P, (lo_page + s->sel[i] + 1) * P);
    }
    int32_t nseg = ks_infer_segs_plan(mask, n, P, s->segs, s->first, s->pages, npages, total);
    for (int r = 0; r < R; r++) n_out[r] = *total - (n - n_att[r]); /* the window [hi * P, n) is the runs' tail */
    return nseg;
}
