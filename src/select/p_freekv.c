/*
 * p_freekv.c — `freekv`: speculative page retrieval with fine-grained
 * correction ("FreeKV: Boosting KV Cache Retrieval for Efficient LLM
 * Inference", Sections 3.2 Speculative retrieval and 3.3 Fine-grained
 * correction).
 *
 * Speculative retrieval.  Adjacent decode steps have very similar queries
 * (the paper measures mean cos > 0.84, mostly > 0.9), so they select nearly
 * the same pages.  FreeKV therefore takes selection and recall off the
 * critical path: step t attends over the pages selected during step t-1
 * (per sequence, layer and KV head), while the selection for step t+1 is
 * computed with q_t in the same call and returned as the prefetch hint
 * (ks_selection.next, pages) so the framework loads it for slow-tier layers
 * while the step goes on.  The framework's slot cache (kv.c ks_kv_fetch)
 * reuses resident pages and loads only the misses, which is FreeKV's
 * replacement rule; we count hits and misses ourselves as well: a page of the
 * fresh selection at t that was already in the selection of t-1 is a hit.
 * The first decode step has a "t-1" too: on_prefill seeds the state with the
 * selection of the prompt's last query (obs_window = 1), as if the last
 * prompt token had been a decode step.
 *
 * Fine-grained correction.  The mean over the G query heads of a group of
 * cos(q_t, q_{t-1}) decides per KV head: below `tau` the speculative pages
 * are stale and the fresh selection (made with q_t, already computed for the
 * hint) is used at once, as the paper's synchronous head-wise correction
 * recall does; the correction is counted.  tau = 0.8 by default (the paper's
 * value for long input, `preset=input`); `preset=gen` takes its 0.9 for long
 * generation / reasoning.
 * A missing or out-of-date previous step (the first sparse step after dense
 * ones, a truncated sequence) also selects fresh, without counting a
 * correction.
 *
 * Page scores.  The paper says "min-max pooled keys, similar to Quest"; its
 * public code stores c +/- r per page with c = (max+min)/2 and
 * r = mean_k |c - k| (a typical spread, tighter than the half range) and
 * scores sum_i max(q_i hi_i, q_i lo_i) (without 1/sqrt(d), see below).  Our store keeps
 * per page only kmin, kmax and ksum, so:
 *   summary=bound  (default) the Quest bound over [kmin, kmax] from kv
 *                  metadata: free, exact at every append.  Note that
 *                  c +/- (max-min)/2 *is* [kmin, kmax], so a "centre +
 *                  half range" summary would give the very same scores.
 *   summary=centre the public code's c +/- mean|c - k|.  The radius needs the
 *                  page's individual keys, which the metadata does not keep;
 *                  they are read once per full page through env->read_keys
 *                  and the summary cached (fingerprinted by the page's
 *                  min/max/sum so a compaction or truncation recomputes it).
 *                  Costs [n_seq][n_layer][n_head_kv][max_pages][2*hd+1]
 *                  floats and one page read per page that fills.
 * As in the public code only full pages are summarised; a partial last page
 * is scored with its live bound only when the window does not cover it
 * (window < its fill), which the public code's page-granular window never
 * meets.
 *
 * Group-consistent selection (Section 3.1): per query head the page scores
 * times 1/sqrt(d) (`scale=sqrt`, the default: the attention logits' own
 * scale, so that with head_dim 128-256 the softmax over raw bounds does not
 * collapse to one page and underflow every other page to an exact 0, which
 * would leave the rest of the ranking to index order; `scale=none` is the
 * public code's unscaled score) go through a softmax over the competing
 * pages, the G distributions are averaged, sum_j softmax(P^j) / G, and the
 * top pages are kept.
 *
 * Sink and window (Section 5.1, "sink size S, local window W"): the paper
 * keeps S sink and W recent tokens and selects B - S - W.  Its runs use
 * S = W = 128 with B = 2048 and tau = 0.8 for long input (LongBench v2) and
 * S = W = 512, tau = 0.9 for long generation and reasoning (also the public
 * code's defaults, counted there in whole pages).  kvsieve's budgets are
 * shares of the context, so the presets keep the paper's *ratios*:
 * `preset=input` (default) S = W = B/16, tau 0.8; `preset=gen` S = W = B/4,
 * tau 0.9; `sink_frac` / `recent_frac` / `tau` override.  As in the public
 * code they count whole pages: floor(frac * B / P) leading pages and as many
 * trailing pages are attended on top of the framework's --sink / --window
 * and paid from the budget's ceil(n_select / P) pages; the remaining pages go
 * to the scored selection (candidates: the pages that hold an entry in
 * [sink, n - window), so the budget is not spent on entries attended anyway).
 * Layer 0 stays dense by default, as in the paper ("KV cache compression is
 * not applied to the first layer").  When the budget covers every candidate
 * the selection is `all`, and the framework never asks at all when the
 * budget covers the head: a full budget is bit-identical to dense.
 *
 * State per (seq, layer, KV head): the previous selection (pages), the
 * previous group queries [G][head_dim], the position they were made at, and
 * the counters; each select_layer call writes only its own slot, so the
 * parallel attention workers need no locks.
 */
#include "select/policy.h"

#include <math.h>
#include <string.h>

enum { SUM_BOUND = 0, SUM_CENTRE = 1 };

typedef struct {
    ks_policy_env env;
    ks_policy_params p;
    double tau;
    double sink_frac, recent_frac; /* the paper's S / B and W / B (whole pages, paid from the budget) */
    float scale;         /* multiplies page scores before the softmax */
    int summary;         /* SUM_BOUND or SUM_CENTRE */
    int32_t dense_layers;
    int32_t G, P, max_pages;
    size_t n_slot;       /* n_seq * n_layer * n_head_kv */
    int32_t *sel;        /* [n_slot][max_pages] previous selection (pages) */
    int32_t *n_sel;      /* [n_slot] its size; -1: none */
    int32_t *sel_pos;    /* [n_slot] position of the step that made it */
    float *q;            /* [n_slot][G][head_dim] the queries that made it */
    uint64_t *cnt;       /* [n_slot][4] selections, hits, misses, corrections */
    float *cs;           /* [n_slot][max_pages][2][head_dim] centre summaries lo, hi (summary=centre) */
    float *cs_fp;        /* [n_slot][max_pages] fingerprint of the page they were made from; NaN: none */
} freekv_state;

static const char *const freekv_args[] = {"tau", "summary", "scale", "preset", "sink_frac", "recent_frac", NULL};

static size_t slot_of(const freekv_state *s, int32_t seq, int32_t layer, int32_t head) {
    return ((size_t)seq * s->env.n_layer + (size_t)layer) * s->env.n_head_kv + (size_t)head;
}

static ks_status freekv_create(const ks_policy_env *env, const ks_policy_params *p, void **state) {
    double tau, sink_frac, recent_frac;
    char sum[16], sc[16], preset[16];
    KS_TRY(ks_args_str(p->args, "preset", "input", preset, sizeof preset));
    double tau0, frac0;
    if (strcmp(preset, "input") == 0) tau0 = 0.8, frac0 = 1.0 / 16; /* LongBench v2: S = W = 128 of B = 2048 */
    else if (strcmp(preset, "gen") == 0) tau0 = 0.9, frac0 = 0.25;  /* LongGenBench, reasoning: S = W = 512 */
    else return KS_FAIL(KS_ERR_INVALID_ARG, "freekv preset=%s: expected input or gen", preset);
    KS_TRY(ks_args_float(p->args, "tau", tau0, -1.0, 1.0, &tau));
    KS_TRY(ks_args_float(p->args, "sink_frac", frac0, 0.0, 0.5, &sink_frac));
    KS_TRY(ks_args_float(p->args, "recent_frac", frac0, 0.0, 0.5, &recent_frac));
    KS_TRY(ks_args_str(p->args, "summary", "bound", sum, sizeof sum));
    KS_TRY(ks_args_str(p->args, "scale", "sqrt", sc, sizeof sc));
    int summary;
    if (strcmp(sum, "bound") == 0) summary = SUM_BOUND;
    else if (strcmp(sum, "centre") == 0 || strcmp(sum, "center") == 0) summary = SUM_CENTRE;
    else return KS_FAIL(KS_ERR_INVALID_ARG, "freekv summary=%s: expected bound or centre", sum);
    if (strcmp(sc, "none") != 0 && strcmp(sc, "sqrt") != 0)
        return KS_FAIL(KS_ERR_INVALID_ARG, "freekv scale=%s: expected none or sqrt", sc);
    if (env->n_layer <= 0 || env->n_head <= 0 || env->n_head_kv <= 0 || env->head_dim <= 0 || env->n_seq <= 0 ||
        env->n_ctx <= 0 || env->n_head % env->n_head_kv != 0 || (!env->kv && !env->meta))
        return KS_FAIL(KS_ERR_INVALID_ARG, "freekv: bad model shapes");
    if (summary == SUM_CENTRE && !env->read_keys)
        return KS_FAIL(KS_ERR_INVALID_ARG, "freekv summary=centre needs the read_keys service");
    freekv_state *s = ks_calloc(1, sizeof *s);
    s->env = *env;
    s->p = *p;
    s->p.args = NULL; /* borrowed string: not kept */
    s->tau = tau;
    s->sink_frac = sink_frac;
    s->recent_frac = recent_frac;
    s->summary = summary;
    s->G = env->n_head / env->n_head_kv;
    s->P = ks_policy_kv_page_size(env);
    s->scale = strcmp(sc, "sqrt") == 0 ? 1.0f / sqrtf((float)env->head_dim) : 1.0f;
    s->dense_layers = p->dense_layers >= 0 ? p->dense_layers : 1;
    s->max_pages = env->n_ctx / s->P + 1;
    s->n_slot = (size_t)env->n_seq * env->n_layer * env->n_head_kv;
    s->sel = ks_malloc(sizeof(int32_t) * s->n_slot * (size_t)s->max_pages);
    s->n_sel = ks_malloc(sizeof(int32_t) * s->n_slot);
    s->sel_pos = ks_malloc(sizeof(int32_t) * s->n_slot);
    s->q = ks_calloc(s->n_slot * (size_t)s->G * env->head_dim, sizeof(float));
    s->cnt = ks_calloc(s->n_slot * 4, sizeof(uint64_t));
    for (size_t i = 0; i < s->n_slot; i++) s->n_sel[i] = -1, s->sel_pos[i] = -1;
    if (summary == SUM_CENTRE) {
        size_t np = s->n_slot * (size_t)s->max_pages;
        s->cs = ks_malloc(sizeof(float) * np * 2 * (size_t)env->head_dim);
        s->cs_fp = ks_malloc(sizeof(float) * np);
        for (size_t i = 0; i < np; i++) s->cs_fp[i] = NAN;
    }
    *state = s;
    return KS_OK;
}

static void freekv_destroy(void *state) {
    freekv_state *s = state;
    ks_free(s->sel);
    ks_free(s->n_sel);
    ks_free(s->sel_pos);
    ks_free(s->q);
    ks_free(s->cnt);
    ks_free(s->cs);
    ks_free(s->cs_fp);
    ks_free(s);
}

static void freekv_seq_reset(void *state, int32_t seq) {
    freekv_state *s = state;
    if (seq < 0 || seq >= s->env.n_seq) return;
    size_t a = slot_of(s, seq, 0, 0), n = (size_t)s->env.n_layer * s->env.n_head_kv;
    for (size_t i = a; i < a + n; i++) s->n_sel[i] = -1, s->sel_pos[i] = -1;
    if (s->cs_fp)
        for (size_t i = a * s->max_pages; i < (a + n) * s->max_pages; i++) s->cs_fp[i] = NAN;
}

/* A cheap fingerprint of a page's stored keys (from its metadata): a cached
 * centre summary is reused only while the page still has the same keys. */
static float page_fingerprint(const ks_kv_page_meta *m, int32_t hd) {
    float f = (float)m->fill;
    for (int32_t i = 0; i < hd; i++) f += (float)(i + 1) * m->ksum[i] + 0.5f * m->kmin[i] + 0.25f * m->kmax[i];
    return f;
}

/* lo/hi of page lp for scoring: [kmin, kmax], or the cached public-code
 * centre summary c -/+ mean|c - k| of a full page. */
static ks_status page_box(freekv_state *s, size_t slot, int32_t seq, int32_t layer, int32_t head, int32_t lp,
                          const ks_kv_page_meta *m, float *keys, const float **lo, const float **hi) {
    int32_t hd = s->env.head_dim;
    *lo = m->kmin;
    *hi = m->kmax;
    if (s->summary != SUM_CENTRE || m->fill != s->P || lp >= s->max_pages) return KS_OK;
    size_t i = slot * s->max_pages + (size_t)lp;
    float *box = s->cs + i * 2 * (size_t)hd;
    float fp = page_fingerprint(m, hd);
    if (s->cs_fp[i] != fp) {
        KS_TRY(s->env.read_keys(s->env.svc, seq, layer, head, lp * s->P, s->P, keys)); /* keys [P][hd] */
        for (int32_t d = 0; d < hd; d++) {
            float c = 0.5f * (m->kmin[d] + m->kmax[d]), r = 0;
            for (int32_t e = 0; e < s->P; e++) r += fabsf(c - keys[(size_t)e * hd + d]);
            r /= (float)s->P;
            box[d] = c - r;
            box[hd + d] = c + r;
        }
        s->cs_fp[i] = fp;
    }
    *lo = box;
    *hi = box + hd;
    return KS_OK;
}

/* The selection q [G][hd] makes over n entries with sink/window added by the
 * framework: pages into sel (cap >= max_pages), count into *n_out, *all when
 * the budget covers every candidate page (sel then lists them all).  The
 * paper's sink and recent pages (sink_frac / recent_frac of the budget, whole
 * pages) come first; the rest of the ceil(n_select / P) pages are the top of
 * the group-averaged softmax over the other candidates. */
static ks_status fresh_select(freekv_state *s, int32_t seq, int32_t layer, int32_t head, const float *q, int32_t n,
                              int32_t sink, int32_t window, int32_t n_select, int32_t *sel, int32_t *n_out,
                              bool *all) {
    const ks_policy_env *env = &s->env;
    int32_t G = s->G, hd = s->env.head_dim, P = s->P;
    int32_t np = ks_policy_kv_n_pages(env, seq, layer, head);
    *n_out = 0;
    *all = false;
    int32_t a = sink, b = n - window; /* the entries the framework does not add itself */
    if (n_select <= 0 || b <= a || np <= 0) return KS_OK;
    int32_t lo = a / P, hi = (b - 1) / P;
    if (hi >= np) hi = np - 1;
    if (hi >= s->max_pages) hi = s->max_pages - 1;
    if (lo > hi) return KS_OK;
    int32_t nc = hi - lo + 1, k = (int32_t)(((int64_t)n_select + P - 1) / P);
    if (k >= nc) {
        for (int32_t i = 0; i < nc; i++) sel[i] = lo + i;
        *n_out = nc;
        *all = true;
        return KS_OK;
    }
    /* the paper's S sink and W recent tokens, in whole pages of the budget */
    int32_t budget = s->p.budget > 0 ? s->p.budget : n;
    int32_t sp = (int32_t)(s->sink_frac * budget) / P, rp = (int32_t)(s->recent_frac * budget) / P;
    int32_t m = 0; /* forced pages taken so far */
    for (int32_t p = lo; p <= hi && p < sp && m < k; p++) sel[m++] = p;
    for (int32_t p = np - 1; p >= np - rp && p >= lo && m < k; p--)
        if (p <= hi && p >= sp) sel[m++] = p;
    if (m == k) {
        *n_out = m;
        return KS_OK;
    }
    float *sc = ks_malloc(sizeof(float) * (size_t)nc * (G + 1));
    int32_t *map = ks_malloc(sizeof(int32_t) * (size_t)nc * 2), *top = map + nc;
    float *red = sc + (size_t)nc * G;
    float *keys = s->summary == SUM_CENTRE ? ks_malloc(sizeof(float) * (size_t)P * hd) : NULL;
    size_t slot = slot_of(s, seq, layer, head);
    ks_status st = KS_OK;
    int32_t nm = 0; /* competing pages */
    for (int32_t p = lo; p <= hi; p++)
        if (p >= sp && p < np - rp) map[nm++] = p;
    for (int32_t i = 0; i < nm && st == KS_OK; i++) {
        ks_kv_page_meta mt;
        ks_policy_kv_page_meta(env, seq, layer, head, map[i], &mt);
        const float *bl, *bh;
        st = page_box(s, slot, seq, layer, head, map[i], &mt, keys, &bl, &bh);
        if (st != KS_OK) break;
        for (int32_t g = 0; g < G; g++)
            sc[(size_t)g * nm + i] = s->scale * ks_page_upper_bound(q + (size_t)g * hd, bl, bh, hd);
    }
    if (st == KS_OK && nm > 0) {
        ks_group_reduce_scores(sc, G, nm, KS_GROUP_SOFTMAX_MEAN, red);
        int32_t got = ks_topk(red, nm, k - m, top);
        for (int32_t i = 0; i < got; i++) sel[m + i] = map[top[i]];
        m += got;
    }
    *n_out = m;
    ks_free(keys);
    ks_free(map);
    ks_free(sc);
    return st;
}

/* Mean over the group of cos(q_g, p_g); q, p: [G][hd]. */
static double group_cosine(const float *q, const float *p, int32_t G, int32_t hd) {
    double tot = 0;
    for (int32_t g = 0; g < G; g++) {
        double qq = 0, pp = 0, qp = 0;
        for (int32_t i = 0; i < hd; i++) {
            double x = q[(size_t)g * hd + i], y = p[(size_t)g * hd + i];
            qq += x * x, pp += y * y, qp += x * y;
        }
        tot += qq > 0 && pp > 0 ? qp / sqrt(qq * pp) : 0.0;
    }
    return tot / G;
}

/* Remember the fresh selection and the queries that made it. */
static void remember(freekv_state *s, size_t slot, const int32_t *sel, int32_t n, const float *q, int32_t pos) {
    size_t gh = (size_t)s->G * s->env.head_dim;
    memcpy(s->sel + slot * s->max_pages, sel, sizeof(int32_t) * (size_t)n);
    s->n_sel[slot] = n;
    s->sel_pos[slot] = pos;
    memcpy(s->q + slot * gh, q, sizeof(float) * gh);
}

static ks_status freekv_prefill(void *state, const ks_prefill_info *info) {
    freekv_state *s = state;
    const ks_policy_env *e = &s->env;
    int32_t hd = e->head_dim, G = s->G;
    if (info->pseudo || info->n_obs <= 0 || !info->obs_q || info->n_prompt <= 0 || s->p.budget <= 0) return KS_OK;
    if (info->seq < 0 || info->seq >= e->n_seq) return KS_FAIL(KS_ERR_INVALID_ARG, "freekv: sequence %d", info->seq);
    int32_t *sel = ks_malloc(sizeof(int32_t) * (size_t)s->max_pages);
    ks_status st = KS_OK;
    int32_t pos = info->first_pos + info->n_prompt - 1; /* the prompt's last token plays step t-1 */
    for (int32_t l = s->dense_layers; l < e->n_layer && st == KS_OK; l++) {
        const float *lq = info->obs_q + ((size_t)l * info->n_obs + (size_t)(info->n_obs - 1)) * e->n_head * hd;
        for (int32_t h = 0; h < e->n_head_kv && st == KS_OK; h++) {
            size_t slot = slot_of(s, info->seq, l, h);
            s->n_sel[slot] = -1;
            int32_t n = ks_policy_kv_n_entries(e, info->seq, l, h);
            if (s->p.budget >= n + 1) continue; /* the next step attends all: nothing to speculate on */
            int32_t sink = s->p.sink < n ? s->p.sink : n, window = s->p.window < n ? s->p.window : n;
            int32_t want = s->p.budget - sink - window, got = 0;
            bool all;
            const float *q = lq + (size_t)h * G * hd;
            st = fresh_select(s, info->seq, l, h, q, n, sink, window, want < 0 ? 0 : want, sel, &got, &all);
            if (st == KS_OK) remember(s, slot, sel, got, q, pos);
        }
    }
    ks_free(sel);
    return st;
}

static ks_status freekv_select(void *state, const ks_select_req *req, ks_selection *out) {
    freekv_state *s = state;
    const ks_policy_env *e = &s->env;
    out->pages = true;
    out->next_pages = true;
    out->n = 0;
    out->n_next = 0;
    if (!req->q || req->seq < 0 || req->seq >= e->n_seq || req->layer < 0 || req->layer >= e->n_layer ||
        req->head < 0 || req->head >= e->n_head_kv)
        return KS_FAIL(KS_ERR_INVALID_ARG, "freekv: bad selection request (seq %d, layer %d, head %d)", req->seq,
                       req->layer, req->head);
    size_t slot = slot_of(s, req->seq, req->layer, req->head);
    uint64_t *cnt = s->cnt + slot * 4;
    int32_t *fresh = ks_malloc(sizeof(int32_t) * (size_t)s->max_pages * 2);
    uint8_t *mark = (uint8_t *)(fresh + s->max_pages); /* [max_pages] pages of the previous selection */
    int32_t nf = 0;
    bool all = false;
    ks_status st = fresh_select(s, req->seq, req->layer, req->head, req->q, req->n_entries, req->sink, req->window,
                                req->n_select, fresh, &nf, &all);
    if (st != KS_OK) {
        ks_free(fresh);
        return st;
    }
    const int32_t *prev = s->sel + slot * s->max_pages;
    int32_t np_prev = s->n_sel[slot];
    /* step t-1 made a non-empty selection that fits this step's budget (else: cold) */
    int64_t k_now = req->n_select > 0 ? ((int64_t)req->n_select + s->P - 1) / s->P : 0;
    bool have_prev = np_prev > 0 && s->sel_pos[slot] == req->pos - 1 && np_prev <= k_now;
    /* hits / misses of the fresh selection against what step t-1 recalled */
    memset(mark, 0, (size_t)s->max_pages);
    if (have_prev)
        for (int32_t i = 0; i < np_prev; i++)
            if (prev[i] >= 0 && prev[i] < s->max_pages) mark[prev[i]] = 1;
    cnt[0]++;
    for (int32_t i = 0; i < nf; i++) cnt[mark[fresh[i]] ? 1 : 2]++;
    /* what this step attends: the speculative pages, or the fresh ones */
    const int32_t *use = fresh;
    int32_t nu = nf;
    if (all) {
        out->all = true;
    } else if (have_prev && group_cosine(req->q, s->q + slot * (size_t)s->G * e->head_dim, s->G, e->head_dim) >= s->tau) {
        use = prev;
        nu = np_prev;
    } else if (have_prev) {
        cnt[3]++; /* correction: the queries moved, re-select now */
    }
    int32_t cap = out->cap > 0 ? out->cap : 0;
    out->n = nu < cap ? nu : cap;
    if (out->n > 0) memcpy(out->idx, use, sizeof(int32_t) * (size_t)out->n);
    if (out->next && nf > 0) {
        out->n_next = nf < cap ? nf : cap;
        memcpy(out->next, fresh, sizeof(int32_t) * (size_t)out->n_next);
    }
    remember(s, slot, fresh, nf, req->q, req->pos);
    ks_free(fresh);
    return KS_OK;
}

static void freekv_counters(void *state, ks_policy_counters *out) {
    freekv_state *s = state;
    for (size_t i = 0; i < s->n_slot; i++) {
        out->selections += s->cnt[i * 4 + 0];
        out->hits += s->cnt[i * 4 + 1];
        out->misses += s->cnt[i * 4 + 2];
        out->corrections += s->cnt[i * 4 + 3];
    }
}

const ks_policy_i ks_policy_freekv = {
    .name = "freekv",
    .summary = "FreeKV: speculative page retrieval (previous step's pages, next step's prefetched) with query-"
               "similarity correction (layer 0 dense)",
    .default_dense_layers = 1,
    .obs_window = 1,
    .arg_names = freekv_args,
    .create = freekv_create,
    .destroy = freekv_destroy,
    .seq_reset = freekv_seq_reset,
    .on_prefill = freekv_prefill,
    .select_layer = freekv_select,
    .counters = freekv_counters,
    .page_summaries = true,
};
