/*
 * p_freekv.c — `freekv`: speculative page retrieval with fine-grained
 * correction ("FreeKV: Boosting KV Cache Retrieval for Efficient LLM
 * Inference", Sections 3.2 Speculative retrieval and 3.3 Fine-grained
 * correction).
 *
 * Speculative retrieval.  Adjacent decode steps have very similar queries
 * (the paper measures mean cos > 0.84, mostly > 0.9), so they select nearly
 * the same pages.  FreeKV therefore takes selection and recall off the
 * critical path: step t attends over the pages selected with q_{t-1}
 * (per sequence, layer and KV head), while the selection for step t+1 is
 * made with q_t and recalled during step t.  Here:
 *   - a step that speculates attends the selection q_{t-1} made over the KV
 *     of step t-1.  When that selection exists already (step t-1 made it for
 *     a prefetch hint, or was itself a correction or a cold start) the step
 *     scores nothing; otherwise it is made now, by replaying step t-1's
 *     request with q_{t-1} (one entry fewer, and the one candidate page the
 *     new entry landed in scored by the [kmin, kmax] step t-1 saw, kept in
 *     keep_query), so it is exactly the selection step t-1 would have made;
 *   - a layer in the slow tier offers a hint buffer (ks_selection.next): the
 *     selection q_t makes is computed in the same call and returned there,
 *     and the framework queues its recall on the copy engine while the step
 *     goes on (its slot cache, kv.c ks_kv_fetch, keeps resident entries and
 *     loads only the misses: FreeKV's replacement rule); the next step then
 *     finds it made;
 *   - a fast-tier layer has nothing to recall, and the selection for step
 *     t+1 is left unmade until step t+1 needs it (it does not when it
 *     corrects).
 * So without a hint a step scores the pages at most once, the same work as
 * Quest's one selection per step; the paper's *time* win, selection hidden
 * behind the step's other layers, needs a core that would otherwise idle,
 * which kvsieve's CPU engine (every worker busy in every layer) does not
 * have, so the work is placed where it costs least rather than on a worker
 * thread.  The first decode step has a "t-1" too: on_prefill keeps the
 * prompt's last query (obs_window = 1) as if the last prompt token had been a
 * decode step; its selection is made when the first step speculates.
 *
 * Fine-grained correction.  The mean over the G query heads of a group of
 * cos(q_t, q_{t-1}) decides per KV head: below `tau` the speculative pages
 * are stale and the head is re-selected with q_t synchronously, as the
 * paper's head-wise correction recall does; the correction is counted and
 * its selection is also the next step's speculation.  tau = 0.8 by default
 * (the paper's value for long input, `preset=input`); `preset=gen` takes its
 * 0.9 for long generation / reasoning.  A missing previous step (the first
 * sparse step after dense ones, a position gap, a reset) selects fresh,
 * without counting a correction.
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
 * State per (seq, layer, KV head): the last step's queries [G][head_dim]
 * and position, the selection they make once made, the pages the last step
 * attended (hits / misses: the pages a recall buffer already holds vs the
 * ones it must load), the edge page's box and the counters; each
 * select_layer call writes only its own slot, so the parallel attention
 * workers need no locks.
 */
#include "policy/policy.h"

#include <math.h>
#include <string.h>

enum { SUM_BOUND = 0, SUM_CENTRE = 1 };

typedef struct {
    ks_policy_env env;
    ks_policy_spec p;
    double tau;
    double sink_frac, recent_frac; /* the paper's S / B and W / B (whole pages, paid from the budget) */
    float scale;         /* multiplies page scores before the softmax */
    int summary;         /* SUM_BOUND or SUM_CENTRE */
    int32_t dense_layers;
    int32_t G, P, max_pages;
    size_t n_slot;       /* n_seq * n_layer * n_head_kv */
    /* the last step's queries: the speculation of the coming step */
    float *q;            /* [n_slot][G][head_dim] */
    int32_t *q_pos;      /* [n_slot] the position they were made at; -1: none */
    /* the selection those queries make, once computed (lazily, or at once
     * when it was corrected or a prefetch hint was asked for) */
    int32_t *spec;       /* [n_slot][max_pages] pages */
    int32_t *n_spec;     /* [n_slot] its size; -1: not computed */
    /* the candidate page the next entry lands in, as those queries saw it
     * ([kmin, kmax] before that entry), so that a selection made later is the
     * one the step that kept them would have made */
    int32_t *edge_page;  /* [n_slot] -1: none among the candidates */
    float *edge_box;     /* [n_slot][2][head_dim] */
    /* what the last step attended (the recall buffer's pages) */
    int32_t *att;        /* [n_slot][max_pages] pages */
    int32_t *n_att;      /* [n_slot] its size; -1: none (cold, or everything) */
    int32_t *att_pos;    /* [n_slot] its position */
    uint64_t *cnt;       /* [n_slot][N_CNT] */
    float *cs;           /* [n_slot][max_pages][2][head_dim] centre summaries lo, hi (summary=centre) */
    float *cs_fp;        /* [n_slot][max_pages] fingerprint of the page they were made from; NaN: none */
} freekv_state;

enum { CNT_SELECTIONS, CNT_HITS, CNT_MISSES, CNT_CORRECTIONS, CNT_SPECULATIVE, N_CNT };

static const char *const freekv_args[] = {"tau", "summary", "scale", "preset", "sink_frac", "recent_frac", NULL};

static size_t slot_of(const freekv_state *s, int32_t seq, int32_t layer, int32_t head) {
    return ((size_t)seq * s->env.n_layer + (size_t)layer) * s->env.n_head_kv + (size_t)head;
}

static void freekv_destroy(void *state);

static ks_status freekv_create(const ks_policy_env *env, const ks_policy_spec *p, void **state) {
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
    if (!s) return KS_FAIL(KS_ERR_NOMEM, "freekv policy");
    s->env = *env;
    s->p = *p;
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
    size_t np_all = s->n_slot * (size_t)s->max_pages;
    s->q = ks_calloc(s->n_slot * (size_t)s->G * env->head_dim, sizeof(float));
    s->q_pos = ks_malloc(sizeof(int32_t) * s->n_slot);
    s->spec = ks_malloc(sizeof(int32_t) * np_all);
    s->n_spec = ks_malloc(sizeof(int32_t) * s->n_slot);
    s->edge_page = ks_malloc(sizeof(int32_t) * s->n_slot);
    s->edge_box = ks_malloc(sizeof(float) * s->n_slot * 2 * (size_t)env->head_dim);
    s->att = ks_malloc(sizeof(int32_t) * np_all);
    s->n_att = ks_malloc(sizeof(int32_t) * s->n_slot);
    s->att_pos = ks_malloc(sizeof(int32_t) * s->n_slot);
    s->cnt = ks_calloc(s->n_slot * N_CNT, sizeof(uint64_t));
    if (summary == SUM_CENTRE) {
        s->cs = ks_malloc(sizeof(float) * np_all * 2 * (size_t)env->head_dim);
        s->cs_fp = ks_malloc(sizeof(float) * np_all);
    }
    if (!s->q || !s->q_pos || !s->spec || !s->n_spec || !s->edge_page || !s->edge_box || !s->att || !s->n_att ||
        !s->att_pos || !s->cnt || (summary == SUM_CENTRE && (!s->cs || !s->cs_fp))) {
        freekv_destroy(s);
        return KS_FAIL(KS_ERR_NOMEM, "freekv: state of %zu head pages", np_all);
    }
    for (size_t i = 0; i < s->n_slot; i++)
        s->q_pos[i] = s->n_spec[i] = s->n_att[i] = s->att_pos[i] = s->edge_page[i] = -1;
    if (summary == SUM_CENTRE)
        for (size_t i = 0; i < np_all; i++) s->cs_fp[i] = NAN;
    *state = s;
    return KS_OK;
}

static void freekv_destroy(void *state) {
    freekv_state *s = state;
    ks_free(s->q);
    ks_free(s->q_pos);
    ks_free(s->spec);
    ks_free(s->n_spec);
    ks_free(s->edge_page);
    ks_free(s->edge_box);
    ks_free(s->att);
    ks_free(s->n_att);
    ks_free(s->att_pos);
    ks_free(s->cnt);
    ks_free(s->cs);
    ks_free(s->cs_fp);
    ks_free(s);
}

static void forget(freekv_state *s, size_t slot) {
    s->q_pos[slot] = s->n_spec[slot] = s->n_att[slot] = s->att_pos[slot] = s->edge_page[slot] = -1;
}

static void freekv_seq_reset(void *state, int32_t seq) {
    freekv_state *s = state;
    if (seq < 0 || seq >= s->env.n_seq) return;
    size_t a = slot_of(s, seq, 0, 0), n = (size_t)s->env.n_layer * s->env.n_head_kv;
    for (size_t i = a; i < a + n; i++) forget(s, i);
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

/* The pages a selection chooses among: candidates [lo, hi] (the pages that
 * hold an entry in [sink, n - window), the entries the framework does not
 * add itself), k = ceil(n_select / P) of them wanted; np pages in all. */
typedef struct {
    int32_t lo, hi, nc, k, np;
} cand_range;

/* false: nothing to choose (no budget beyond sinks and window, or no candidate) */
static bool candidates(const freekv_state *s, const ks_select_req *req, cand_range *cr) {
    int32_t P = s->P, np = ks_policy_kv_n_pages(&s->env, req->seq, req->layer, req->head);
    int32_t np_req = (int32_t)(((int64_t)req->n_entries + P - 1) / P); /* a replayed request sees fewer */
    if (np_req < np) np = np_req;
    int32_t a = req->sink, b = req->n_entries - req->window;
    if (req->n_select <= 0 || b <= a || np <= 0) return false;
    int32_t lo = a / P, hi = (b - 1) / P;
    if (hi >= np) hi = np - 1;
    if (hi >= s->max_pages) hi = s->max_pages - 1;
    if (lo > hi) return false;
    *cr = (cand_range){.lo = lo, .hi = hi, .nc = hi - lo + 1, .k = (int32_t)(((int64_t)req->n_select + P - 1) / P),
                       .np = np};
    return true;
}

/* The request step t-1 made for the same head: one entry fewer, the budget
 * split as ks_policy_select_mask splits it. */
static ks_select_req previous_request(const freekv_state *s, const ks_select_req *req) {
    ks_select_req r = *req;
    int32_t n = req->n_entries - 1;
    r.n_entries = n;
    r.pos = req->pos - 1;
    r.sink = s->p.sink < n ? s->p.sink : n;
    r.window = s->p.window < n ? s->p.window : n;
    r.n_select = s->p.budget - r.sink - r.window > 0 ? s->p.budget - r.sink - r.window : 0;
    return r;
}

/* The selection the group queries q [G][hd] make among cr: pages into sel
 * (cap >= max_pages), count into *n_out.  Every candidate when k >= nc;
 * else the paper's sink and recent pages (sink_frac / recent_frac of the
 * budget, whole pages) first, and the rest of the k pages the top of the
 * group-averaged softmax over the other candidates.  slot's edge page, when
 * set (a replay for queries kept from an earlier step), is scored with the
 * box that step saw.  This is the one O(pages) pass of the policy. */
static ks_status fresh_select(freekv_state *s, const ks_select_req *req, const float *q, const cand_range *cr,
                              bool edge, int32_t *sel, int32_t *n_out) {
    const ks_policy_env *env = &s->env;
    int32_t seq = req->seq, layer = req->layer, head = req->head;
    int32_t G = s->G, hd = s->env.head_dim, P = s->P, lo = cr->lo, hi = cr->hi, np = cr->np, k = cr->k;
    *n_out = 0;
    if (k >= cr->nc) {
        for (int32_t i = 0; i < cr->nc; i++) sel[i] = lo + i;
        *n_out = cr->nc;
        return KS_OK;
    }
    /* the paper's S sink and W recent tokens, in whole pages of the budget */
    int32_t budget = s->p.budget > 0 ? s->p.budget : req->n_entries;
    int32_t sp = (int32_t)(s->sink_frac * budget) / P, rp = (int32_t)(s->recent_frac * budget) / P;
    int32_t m = 0; /* forced pages taken so far */
    for (int32_t p = lo; p <= hi && p < sp && m < k; p++) sel[m++] = p;
    for (int32_t p = np - 1; p >= np - rp && p >= lo && m < k; p--)
        if (p <= hi && p >= sp) sel[m++] = p;
    *n_out = m;
    if (m == k) return KS_OK;
    int32_t nc = cr->nc;
    /* one scratch block (a step allocates nothing): the f16 boxes' pointers
     * [nc], the per-head scores and their reduction [nc][G + 1], the f16
     * boxes' scores [nc][G], candidate map, top and f16 places [3][nc] */
    size_t n_sc = (size_t)nc * (G + 1), n_b16 = (size_t)nc * G;
    const uint16_t **kb16 = ks_scratch(KS_SCRATCH_POLICY1, sizeof(uint16_t *) * (size_t)nc +
                                                              sizeof(float) * (n_sc + n_b16) + sizeof(int32_t) * 3 * (size_t)nc);
    float *keys = s->summary == SUM_CENTRE ? ks_scratch(KS_SCRATCH_POLICY2, sizeof(float) * (size_t)P * hd) : NULL;
    if (!kb16 || (s->summary == SUM_CENTRE && !keys)) return KS_FAIL(KS_ERR_NOMEM, "freekv: scores of %d pages", nc);
    float *sc = (float *)(kb16 + nc), *b16 = sc + n_sc;
    int32_t *map = (int32_t *)(b16 + n_b16), *top = map + nc, *at16 = top + nc, n16 = 0;
    float *red = sc + (size_t)nc * G;
    size_t slot = slot_of(s, seq, layer, head);
    int32_t edge_page = edge ? s->edge_page[slot] : -1;
    ks_status st = KS_OK;
    int32_t nm = 0; /* competing pages */
    for (int32_t p = lo; p <= hi; p++)
        if (p >= sp && p < np - rp) map[nm++] = p;
    /* pages whose box is the store's own min / max (kept in f16 too, the
     * same values) are scored together, as Quest scores them (half the
     * bytes, four pages x four heads a pass); the edge page and centre
     * boxes one by one */
    for (int32_t i = 0; i < nm && st == KS_OK; i++) {
        const float *bl, *bh;
        if (map[i] == edge_page) {
            bl = s->edge_box + slot * 2 * (size_t)hd;
            bh = bl + hd;
        } else {
            ks_kv_page_meta mt;
            ks_policy_kv_page_meta(env, seq, layer, head, map[i], &mt);
            st = page_box(s, slot, seq, layer, head, map[i], &mt, keys, &bl, &bh);
            if (st != KS_OK) break;
            if (bl == mt.kmin && mt.kbound16) {
                kb16[n16] = mt.kbound16;
                at16[n16++] = i;
                continue;
            }
        }
        for (int32_t g = 0; g < G; g++)
            sc[(size_t)g * nm + i] = s->scale * ks_page_upper_bound(q + (size_t)g * hd, bl, bh, hd);
    }
    if (st == KS_OK && n16 > 0) {
        ks_page_upper_bounds16_pages(q, G, kb16, n16, hd, b16, NULL);
        for (int32_t g = 0; g < G; g++)
            for (int32_t j = 0; j < n16; j++) sc[(size_t)g * nm + at16[j]] = s->scale * b16[(size_t)g * n16 + j];
    }
    if (st == KS_OK && nm > 0) {
        KS_TRY(ks_group_reduce_scores(sc, G, nm, KS_GROUP_SOFTMAX_MEAN, red));
        int32_t got = ks_topk_scratch(red, nm, k - m, top, sc); /* the per-head scores are spent */
        for (int32_t i = 0; i < got; i++) sel[m + i] = map[top[i]];
        m += got;
    }
    *n_out = m;
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

/* req's queries are the ones the next step speculates with; their selection
 * is not made yet.  The candidate page the next entry will land in (only
 * when the window is shorter than a page) keeps the box req saw. */
static void keep_query(freekv_state *s, size_t slot, const ks_select_req *req) {
    int32_t hd = s->env.head_dim;
    size_t gh = (size_t)s->G * hd;
    memcpy(s->q + slot * gh, req->q, sizeof(float) * gh);
    s->q_pos[slot] = req->pos;
    s->n_spec[slot] = -1;
    s->edge_page[slot] = -1;
    cand_range cr;
    int32_t edge = req->n_entries / s->P;
    if (candidates(s, req, &cr) && edge >= cr.lo && edge <= cr.hi) {
        ks_kv_page_meta mt;
        ks_policy_kv_page_meta(&s->env, req->seq, req->layer, req->head, edge, &mt);
        float *box = s->edge_box + slot * 2 * (size_t)hd;
        memcpy(box, mt.kmin, sizeof(float) * (size_t)hd);
        memcpy(box + hd, mt.kmax, sizeof(float) * (size_t)hd);
        s->edge_page[slot] = edge;
    }
}

/* The prompt's last query plays step t-1 for the first decode step: kept, its
 * selection made when that step needs it. */
static ks_status freekv_prefill(void *state, const ks_prefill_info *info) {
    freekv_state *s = state;
    const ks_policy_env *e = &s->env;
    int32_t hd = e->head_dim, G = s->G;
    if (info->pseudo || info->n_obs <= 0 || !info->obs_q || info->n_prompt <= 0 || s->p.budget <= 0) return KS_OK;
    if (info->seq < 0 || info->seq >= e->n_seq) return KS_FAIL(KS_ERR_INVALID_ARG, "freekv: sequence %d", info->seq);
    int32_t pos = info->first_pos + info->n_prompt - 1;
    for (int32_t l = s->dense_layers; l < e->n_layer; l++) {
        const float *lq = info->obs_q + ((size_t)l * info->n_obs + (size_t)(info->n_obs - 1)) * e->n_head * hd;
        for (int32_t h = 0; h < e->n_head_kv; h++) {
            size_t slot = slot_of(s, info->seq, l, h);
            forget(s, slot);
            /* the request the last prompt token would have made as a decode step */
            ks_select_req as_step = {.seq = info->seq, .layer = l, .head = h, .pos = pos + 1, .q = lq + (size_t)h * G * hd,
                                     .n_entries = ks_policy_kv_n_entries(e, info->seq, l, h) + 1};
            as_step = previous_request(s, &as_step);
            keep_query(s, slot, &as_step);
        }
    }
    return KS_OK;
}

/* Step t of (seq, layer, KV head), query q_t:
 *   speculative (q_{t-1} kept, group-mean cos(q_t, q_{t-1}) >= tau): the
 *     pages q_{t-1} selected over the KV of step t-1: no scoring when they
 *     were made already (a prefetch hint, a correction), else their one pass
 *     now (a replay of step t-1's request, exact);
 *   correction (cos < tau): the pages q_t selects, now; they are also what
 *     the next step speculates on, so that step scores nothing;
 *   cold (no q_{t-1}): the pages q_t selects, uncounted.
 * q_t is kept for step t + 1.  With a hint buffer (out->next: the layer is in
 * the slow tier, recall for step t + 1 starts now) the pages q_t selects are
 * made at once and returned there; otherwise step t + 1 makes them only if it
 * speculates.  Without a hint a step scores the pages at most once. */
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
    size_t slot = slot_of(s, req->seq, req->layer, req->head), gh = (size_t)s->G * e->head_dim;
    uint64_t *cnt = s->cnt + slot * N_CNT;
    int32_t cap = out->cap > 0 ? out->cap : 0;
    cnt[CNT_SELECTIONS]++;
    cand_range cr;
    bool any = candidates(s, req, &cr);
    if (!any || cr.k >= cr.nc) {
        /* sinks and window only, or every candidate: nothing to speculate on */
        if (any) {
            out->all = true;
            if (out->next) {
                out->n_next = cr.nc < cap ? cr.nc : cap;
                for (int32_t i = 0; i < out->n_next; i++) out->next[i] = cr.lo + i;
            }
        }
        s->n_att[slot] = -1;
        keep_query(s, slot, req);
        return KS_OK;
    }
    int32_t *cur = ks_scratch(KS_SCRATCH_POLICY0, sizeof(int32_t) * (size_t)s->max_pages * 2);
    if (!cur) return KS_FAIL(KS_ERR_NOMEM, "freekv: page marks of %d pages", s->max_pages);
    uint8_t *mark = (uint8_t *)(cur + s->max_pages); /* [max_pages] pages attended at step t-1 */
    int32_t *spec = s->spec + slot * s->max_pages, nu = 0;
    bool have_prev = s->q_pos[slot] == req->pos - 1;
    bool speculate = have_prev && group_cosine(req->q, s->q + slot * gh, s->G, e->head_dim) >= s->tau;
    ks_status st = KS_OK;
    if (speculate) {
        cnt[CNT_SPECULATIVE]++;
        if (s->n_spec[slot] < 0) { /* not made yet: replay step t-1's request with its queries */
            ks_select_req pr = previous_request(s, req);
            cand_range pc;
            if (candidates(s, &pr, &pc))
                st = fresh_select(s, &pr, s->q + slot * gh, &pc, true, spec, &s->n_spec[slot]);
            else s->n_spec[slot] = 0;
        }
        nu = s->n_spec[slot];
        if (st == KS_OK) memcpy(cur, spec, sizeof(int32_t) * (size_t)nu);
    } else {
        if (have_prev) cnt[CNT_CORRECTIONS]++; /* the queries moved: re-select now */
        st = fresh_select(s, req, req->q, &cr, false, cur, &nu);
    }
    if (st != KS_OK) {
        forget(s, slot);
        return st;
    }
    /* hits / misses: pages the recall buffer holds from step t-1 vs pages it must load */
    const int32_t *att = s->att + slot * s->max_pages;
    bool had_att = s->n_att[slot] >= 0 && s->att_pos[slot] == req->pos - 1;
    memset(mark, 0, (size_t)s->max_pages);
    for (int32_t i = 0; had_att && i < s->n_att[slot]; i++) mark[att[i]] = 1;
    for (int32_t i = 0; i < nu; i++) cnt[mark[cur[i]] ? CNT_HITS : CNT_MISSES]++;
    out->n = nu < cap ? nu : cap;
    memcpy(out->idx, cur, sizeof(int32_t) * (size_t)out->n);
    memcpy(s->att + slot * s->max_pages, cur, sizeof(int32_t) * (size_t)nu);
    s->n_att[slot] = nu;
    s->att_pos[slot] = req->pos;
    keep_query(s, slot, req);
    if (!speculate) { /* what q_t selects is made already: the next step reuses it */
        memcpy(spec, cur, sizeof(int32_t) * (size_t)nu);
        s->n_spec[slot] = nu;
    }
    if (out->next) { /* recall for step t + 1 starts now */
        if (s->n_spec[slot] < 0) {
            st = fresh_select(s, req, req->q, &cr, false, spec, &s->n_spec[slot]);
            if (st != KS_OK) {
                forget(s, slot);
                return st;
            }
        }
        out->n_next = s->n_spec[slot] < cap ? s->n_spec[slot] : cap;
        memcpy(out->next, spec, sizeof(int32_t) * (size_t)out->n_next);
    }
    return KS_OK;
}

static void freekv_counters(void *state, ks_policy_counters *out) {
    freekv_state *s = state;
    for (size_t i = 0; i < s->n_slot; i++) {
        out->selections += s->cnt[i * N_CNT + CNT_SELECTIONS];
        out->hits += s->cnt[i * N_CNT + CNT_HITS];
        out->misses += s->cnt[i * N_CNT + CNT_MISSES];
        out->corrections += s->cnt[i * N_CNT + CNT_CORRECTIONS];
        out->speculative += s->cnt[i * N_CNT + CNT_SPECULATIVE];
    }
}

static const ks_policy_select_i freekv_select_i = {
    .default_dense_layers = 1,
    .seq_reset = freekv_seq_reset,
    .select_layer = freekv_select,
    .counters = freekv_counters,
};

static const ks_policy_prefill_i freekv_prefill_i = {
    .obs_window = 1,
    .on_prefill = freekv_prefill,
};

const ks_policy_i ks_policy_freekv = {
    .name = "freekv",
    .summary = "FreeKV: speculative page retrieval (previous step's pages, next step's prefetched) with query-"
               "similarity correction (layer 0 dense)",
    .prefix_why = "its page bounds are recomputed from the restored keys; its prefill state is the last prompt row's query, always recomputed",
    .create = freekv_create,
    .destroy = freekv_destroy,
    .arg_names = freekv_args,
    .page_summaries = true,
    .select = &freekv_select_i,
    .prefill = &freekv_prefill_i,
    .prefix = &ks_policy_prefix_stateless,
};
