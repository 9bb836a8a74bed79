/*
 * p_chess.c — `chess`: CHESS's context-aware hierarchical page selection
 * with quality-aware reconstruction ("CHESS: Context-aware Hierarchical
 * Efficient Semantic Selection for Long-Context LLM Inference", Sections
 * 3.1-3.3 and Algorithm 1).
 *
 * What it does.  Every page is summarized by its mean key (ksum / fill from
 * kv_meta.h), flattened over the layers and KV heads of the projection
 * (all layers by default, as in the paper; `layers=N` keeps N evenly spaced
 * layers, a cheaper projection).  Nc consecutive pages form a chunk, Ng
 * consecutive chunks a grid; chunk and grid vectors are the means of their
 * members.  The anchor is the mean of the page vectors of the recent window
 * (the pages the window of the step overlaps), and every unit u of the
 * hierarchy is scored by S(u) = anchor . v_u.  Because S is linear in v_u, a
 * chunk's (grid's) score is the mean of its pages' (chunks') scores, so one
 * pass over the page summaries scores all three levels — the paper's single
 * GEMM over the stacked [V_g; V_c; V_p] without building the stacked matrix.
 * Selection is coarse to fine: the top rho_g of the grids, then the top
 * rho_c of the chunks inside kept grids, then the top rho_p of the pages
 * inside kept chunks (counts rounded up, so each level keeps at least one).
 *
 * Budget.  The ratios decide *which* pages survive; the budget caps *how
 * many* are attended: select_layer returns at most ceil(n_select / P) of the
 * surviving pages, best page score first.  When the ratios keep fewer pages
 * than the budget allows, fewer are attended (the paper's budget is the
 * product of the ratios).  Note that the framework only asks for a selection
 * when 0 < budget < entries, so chess needs an explicit --budget; a budget
 * just under the context lets the ratios alone decide.
 *
 * Global and zero-copy.  The selection depends on no query: it is computed
 * once per decode step and sequence in before_step and handed, as logical
 * page indices, to every (layer >= dense_layers, KV head) in select_layer
 * (global = true; no layer is dense by default, as in the paper).  Logical
 * page i is the same positions in every (layer, head) only while no entry was
 * evicted, so chess assumes un-evicted heads: before_step checks that every
 * projected (layer, head) holds the same number of entries and fails the step
 * with KS_ERR_INVALID_ARG otherwise (e.g. "snapkv+chess").
 *
 * Quality-aware reconstruction (Section 3.3, "Quality-Aware Backtracking",
 * and Figure 4).  The selection of a sequence is kept from step to step and
 * rebuilt only when
 *   - it is the sequence's first selected step (not counted as a rebuild);
 *   - a KV page of generated tokens is complete and *both* its average
 *     entropy H_p and its average varentropy Var(H)_p exceed the calibrated
 *     thresholds `h_max` / `v_max` — the upper-right "pruned area" of the
 *     paper's Figure 4, which plots pages by (average entropy, varentropy)
 *     with 99th-percentile cut-offs on both axes.  The per-token values are
 *     those of the output distribution each decoded token was drawn from
 *     (ks_step_info, wants_entropy); a token belongs to the page its entry
 *     lands in, and a page is judged at the first step of the next page
 *     (unknown values, NaN, are left out of the averages; a page without any
 *     known value never triggers).  The thresholds are calibrated per model
 *     by `kvsieve eval --calibrate` over the same per-page averages of dense
 *     runs and loaded from MODEL.gguf.chess.json by the CLI; default +inf
 *     (no quality trigger) when none is given;
 *   - baselines, off by default: `period=N` rebuilds every N pages of
 *     generated tokens (the paper's Appendix C static reconstruction uses 6),
 *     and `horizon=1` rebuilds once entries that no build ranked would leave
 *     the window (a build scores the pages before the step's window start;
 *     without a rebuild, pages written after it are attended only while in
 *     the window, as in the paper, where the working set is P_selected plus
 *     sinks and the recent pages).
 * Triggered rebuilds are reported through the `rebuilds` counter; `selections`
 * counts the (row, step) pairs that received a selection.
 */
#include "policies/p_chess.h"

#include "policy/policy.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------ pure helpers -- */
ks_status ks_chess_preset(const char *name, double *rho_g, double *rho_c, double *rho_p) {
    static const struct {
        const char *name;
        double g, c, p;
    } presets[] = {{"conservative", 0.9, 0.9, 0.9}, {"moderate", 0.8, 0.7, 0.7}, {"aggressive", 0.5, 0.2, 0.1}};
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (strcmp(name, presets[i].name) == 0) {
            *rho_g = presets[i].g;
            *rho_c = presets[i].c;
            *rho_p = presets[i].p;
            return KS_OK;
        }
    return KS_FAIL(KS_ERR_INVALID_ARG, "chess preset '%s': expected conservative, moderate or aggressive", name);
}

void ks_chess_level_scores(const float *page_s, int32_t np, int32_t chunk, int32_t grid, float *chunk_s,
                           float *grid_s) {
    int32_t nc = (np + chunk - 1) / chunk, ng = (nc + grid - 1) / grid;
    for (int32_t c = 0; c < nc; c++) {
        int32_t a = c * chunk, b = a + chunk < np ? a + chunk : np;
        double s = 0;
        for (int32_t p = a; p < b; p++) s += page_s[p];
        chunk_s[c] = (float)(s / (b - a));
    }
    for (int32_t g = 0; g < ng; g++) {
        int32_t a = g * grid, b = a + grid < nc ? a + grid : nc;
        double s = 0;
        for (int32_t c = a; c < b; c++) s += chunk_s[c];
        grid_s[g] = (float)(s / (b - a));
    }
}

void ks_chess_scores(const float *vecs, int32_t np, int32_t dim, const float *anchor, int32_t chunk, int32_t grid,
                     float *page_s, float *chunk_s, float *grid_s) {
    for (int32_t p = 0; p < np; p++) {
        double s = 0;
        for (int32_t d = 0; d < dim; d++) s += (double)anchor[d] * vecs[(size_t)p * dim + d];
        page_s[p] = (float)s;
    }
    ks_chess_level_scores(page_s, np, chunk, grid, chunk_s, grid_s);
}

/* ceil(rho * n) in [1, n] (n > 0), robust to 0.7 * 10 = 7.000000000000001 */
static int32_t keep_count(double rho, int32_t n) {
    int32_t k = (int32_t)ceil(rho * n - 1e-9);
    return k < 1 ? 1 : k > n ? n : k;
}

/* Top keep_count(rho, n_active) of the active units (score s, flag on) -> kept flags. */
static void keep_top(const float *s, int32_t n, const uint8_t *active, double rho, uint8_t *kept, float *tmp,
                     int32_t *map, int32_t *idx) {
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        kept[i] = 0;
        if (!active || active[i]) {
            tmp[m] = s[i];
            map[m++] = i;
        }
    }
    if (m == 0) return;
    int32_t k = ks_topk(tmp, m, keep_count(rho, m), idx);
    for (int32_t i = 0; i < k; i++) kept[map[idx[i]]] = 1;
}

typedef struct {
    float s;
    int32_t i;
} scored;

static int cmp_scored(const void *a, const void *b) {
    const scored *x = a, *y = b;
    float sx = x->s != x->s ? -INFINITY : x->s, sy = y->s != y->s ? -INFINITY : y->s;
    if (sx != sy) return sx > sy ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

int32_t ks_chess_mask(const float *page_s, const float *chunk_s, const float *grid_s, int32_t np,
                      const ks_chess_cfg *cfg, int32_t *out) {
    if (np <= 0) return 0;
    int32_t nc = (np + cfg->chunk - 1) / cfg->chunk, ng = (nc + cfg->grid - 1) / cfg->grid;
    /* one scratch block (no step allocates): pages scored and sorted [np],
     * top-k scratch [np], map and index [2][np], then the keep flags of the
     * grid, the chunks (active, kept) and the pages (active, kept) */
    scored *sv = ks_scratch(KS_SCRATCH_MATH0, sizeof(scored) * (size_t)np + sizeof(float) * (size_t)np +
                                                  sizeof(int32_t) * 2 * (size_t)np + (size_t)ng + 2 * (size_t)nc + 2 * (size_t)np);
    if (!sv) return -1;
    float *tmp = (float *)(sv + np);
    int32_t *map = (int32_t *)(tmp + np), *idx = map + np;
    uint8_t *gk = (uint8_t *)(idx + np), *ca = gk + ng, *ck = ca + nc, *pa = ck + nc, *pk = pa + np;
    keep_top(grid_s, ng, NULL, cfg->rho_g, gk, tmp, map, idx);
    for (int32_t c = 0; c < nc; c++) ca[c] = gk[c / cfg->grid];
    keep_top(chunk_s, nc, ca, cfg->rho_c, ck, tmp, map, idx);
    for (int32_t p = 0; p < np; p++) pa[p] = ck[p / cfg->chunk];
    keep_top(page_s, np, pa, cfg->rho_p, pk, tmp, map, idx);
    int32_t n = 0;
    for (int32_t p = 0; p < np; p++)
        if (pk[p]) sv[n++] = (scored){page_s[p], p};
    qsort(sv, (size_t)n, sizeof *sv, cmp_scored);
    for (int32_t i = 0; i < n; i++) out[i] = sv[i].i;
    return n;
}

/* ------------------------------------------------------------ policy -- */
typedef struct {
    bool built;           /* a selection exists for this sequence */
    bool pending;         /* a quality trigger fired while no selection was needed */
    int32_t horizon;      /* entries [0, horizon) lie in pages the last build ranked */
    int32_t built_n;      /* entries when the selection was last built (period=N) */
    int32_t acc_page;     /* page whose generated tokens acc_* average; -1: none */
    int32_t acc_n;        /* tokens with known entropy in it */
    double acc_h, acc_v;  /* their entropy and varentropy sums */
    int32_t n_sel;
    int32_t *sel;         /* [max_pages] kept pages, best page score first */
} chess_seq;

typedef struct {
    ks_policy_env env;
    ks_policy_spec p;
    ks_chess_cfg cfg;
    double h_max, v_max;
    bool horizon_on;
    int32_t period;       /* rebuild every `period` pages of generated tokens (0: off) */
    int32_t P, max_pages, n_proj;
    int32_t *proj;        /* [n_proj] layers of the page vectors */
    chess_seq *seqs;      /* [n_seq] */
    float *page_s, *chunk_s, *grid_s, *anchor; /* [max_pages] x3, [head_dim] */
    uint64_t selections, rebuilds;
} chess_state;

static const char *const chess_args[] = {"chunk", "grid",  "preset", "rho_g",   "rho_c", "rho_p",
                                         "h_max", "v_max", "layers", "horizon", "period", NULL};

static void chess_destroy(void *state) {
    chess_state *s = state;
    if (!s) return;
    for (int32_t i = 0; s->seqs && i < s->env.n_seq; i++) ks_free(s->seqs[i].sel);
    ks_free(s->seqs);
    ks_free(s->proj);
    ks_free(s->page_s);
    ks_free(s->anchor);
    ks_free(s);
}

static ks_status chess_create(const ks_policy_env *env, const ks_policy_spec *p, void **state) {
    int64_t chunk, grid, layers, horizon, period;
    double rg, rc, rp, h_max, v_max;
    char preset[32];
    KS_TRY(ks_args_int(p->args, "chunk", 4, 1, 1 << 20, &chunk));
    KS_TRY(ks_args_int(p->args, "grid", 4, 1, 1 << 20, &grid));
    KS_TRY(ks_args_int(p->args, "layers", 0, 0, env->n_layer, &layers));
    KS_TRY(ks_args_int(p->args, "horizon", 0, 0, 1, &horizon));
    KS_TRY(ks_args_int(p->args, "period", 0, 0, 1 << 20, &period));
    KS_TRY(ks_args_str(p->args, "preset", "moderate", preset, sizeof preset));
    KS_TRY(ks_chess_preset(preset, &rg, &rc, &rp));
    KS_TRY(ks_args_float(p->args, "rho_g", rg, 1e-6, 1, &rg));
    KS_TRY(ks_args_float(p->args, "rho_c", rc, 1e-6, 1, &rc));
    KS_TRY(ks_args_float(p->args, "rho_p", rp, 1e-6, 1, &rp));
    KS_TRY(ks_args_float(p->args, "h_max", INFINITY, 0, INFINITY, &h_max));
    KS_TRY(ks_args_float(p->args, "v_max", INFINITY, 0, INFINITY, &v_max));
    chess_state *s = ks_calloc(1, sizeof *s);
    if (!s) return KS_FAIL(KS_ERR_NOMEM, "chess policy");
    s->env = *env;
    s->p = *p;
    s->cfg = (ks_chess_cfg){(int32_t)chunk, (int32_t)grid, rg, rc, rp};
    s->h_max = h_max;
    s->v_max = v_max;
    s->horizon_on = horizon != 0;
    s->period = (int32_t)period;
    s->P = ks_policy_kv_page_size(env);
    s->max_pages = (env->n_ctx + s->P - 1) / s->P + 1;
    /* layers=N: N evenly spaced layers (0: all) */
    s->n_proj = layers > 0 ? (int32_t)layers : env->n_layer;
    s->proj = ks_malloc(sizeof(int32_t) * (size_t)s->n_proj);
    s->seqs = ks_calloc((size_t)env->n_seq, sizeof *s->seqs);
    s->page_s = ks_malloc(sizeof(float) * (size_t)s->max_pages * 3);
    s->anchor = ks_malloc(sizeof(float) * (size_t)env->head_dim);
    bool ok = s->proj && s->seqs && s->page_s && s->anchor;
    for (int32_t i = 0; ok && i < env->n_seq; i++) ok = (s->seqs[i].sel = ks_malloc(sizeof(int32_t) * (size_t)s->max_pages));
    if (!ok) {
        chess_destroy(s);
        return KS_FAIL(KS_ERR_NOMEM, "chess: page tables of %d sequences", env->n_seq);
    }
    for (int32_t i = 0; i < s->n_proj; i++) s->proj[i] = (int32_t)((int64_t)i * env->n_layer / s->n_proj);
    for (int32_t i = 0; i < env->n_seq; i++) s->seqs[i].acc_page = -1;
    s->chunk_s = s->page_s + s->max_pages;
    s->grid_s = s->chunk_s + s->max_pages;
    *state = s;
    return KS_OK;
}

static void chess_seq_reset(void *state, int32_t seq) {
    chess_state *s = state;
    chess_seq *q = &s->seqs[seq];
    q->built = q->pending = false;
    q->n_sel = 0;
    q->acc_page = -1;
    q->acc_n = 0;
    q->acc_h = q->acc_v = 0;
}

/* Rank the pages of `seq` (n entries before this step's token) and keep the
 * hierarchy's survivors.  The candidates are the pages reaching before the
 * step's window start ws = n + 1 - window; pages entirely inside the sinks
 * are dropped from the result (the framework attends them anyway). */
static ks_status chess_build(chess_state *s, int32_t seq, int32_t n) {
    const ks_policy_env *env = &s->env;
    int32_t P = s->P, hd = s->env.head_dim, nkv = s->env.n_head_kv;
    for (int32_t i = 0; i < s->n_proj; i++)
        for (int32_t h = 0; h < nkv; h++)
            if (ks_policy_kv_n_entries(env, seq, s->proj[i], h) != n)
                return KS_FAIL(KS_ERR_INVALID_ARG,
                               "chess: layer %d head %d of sequence %d holds %d entries, layer 0 head 0 %d: chess "
                               "needs un-evicted heads (no evictor in front of it)",
                               s->proj[i], h, seq, ks_policy_kv_n_entries(env, seq, s->proj[i], h), n);
    chess_seq *q = &s->seqs[seq];
    int32_t ws = n + 1 - s->p.window;
    if (ws < 0) ws = 0;
    int32_t np = (ws + P - 1) / P; /* candidate pages [0, np) */
    int32_t np_all = (n + P - 1) / P;
    if (np > np_all) np = np_all;
    q->built = true;
    q->pending = false;
    q->built_n = n;
    q->horizon = np * P;
    q->n_sel = 0;
    if (np == 0) return KS_OK;
    /* window pages: those overlapping [n - window, n), at least the last one */
    int32_t w0 = s->p.window > 0 ? (n - s->p.window > 0 ? n - s->p.window : 0) / P : np_all - 1;
    float *ps = s->page_s;
    memset(ps, 0, sizeof(float) * (size_t)np);
    for (int32_t i = 0; i < s->n_proj; i++)
        for (int32_t h = 0; h < nkv; h++) {
            int32_t l = s->proj[i];
            ks_kv_page_meta m;
            memset(s->anchor, 0, sizeof(float) * (size_t)hd);
            for (int32_t w = w0; w < np_all; w++) {
                ks_policy_kv_page_meta(env, seq, l, h, w, &m);
                float inv = 1.0f / (float)(np_all - w0) / (float)m.fill;
                for (int32_t d = 0; d < hd; d++) s->anchor[d] += m.ksum[d] * inv;
            }
            for (int32_t p = 0; p < np; p++) {
                ks_policy_kv_page_meta(env, seq, l, h, p, &m);
                float dot = 0;
                for (int32_t d = 0; d < hd; d++) dot += s->anchor[d] * m.ksum[d];
                ps[p] += dot / (float)m.fill;
            }
        }
    ks_chess_level_scores(ps, np, s->cfg.chunk, s->cfg.grid, s->chunk_s, s->grid_s);
    int32_t k = ks_chess_mask(ps, s->chunk_s, s->grid_s, np, &s->cfg, q->sel);
    if (k < 0) return KS_FAIL(KS_ERR_NOMEM, "chess: ranking %d pages", np);
    int32_t m = 0;
    for (int32_t i = 0; i < k; i++) /* drop pages the sinks cover entirely */
        if ((q->sel[i] + 1) * P > s->p.sink) q->sel[m++] = q->sel[i];
    q->n_sel = m;
    return KS_OK;
}

/* The quality trigger: the generated token of this step (entropy H,
 * varentropy V of the distribution it was drawn from) lands in entry n, page
 * n / P.  When that page differs from the one being averaged, the finished
 * page is judged: both averages above their thresholds -> true. */
static bool chess_page_trigger(const chess_state *s, chess_seq *q, int32_t n, float H, float V) {
    int32_t page = n / s->P;
    bool fire = false;
    if (q->acc_page != page) {
        if (q->acc_page >= 0 && q->acc_n > 0)
            fire = q->acc_h / q->acc_n > s->h_max && q->acc_v / q->acc_n > s->v_max;
        q->acc_page = page;
        q->acc_n = 0;
        q->acc_h = q->acc_v = 0;
    }
    if (H == H && V == V) { /* NaN (unknown) is left out */
        q->acc_h += H;
        q->acc_v += V;
        q->acc_n++;
    }
    return fire;
}

static ks_status chess_before_step(void *state, const ks_step_info *step) {
    chess_state *s = state;
    for (int32_t r = 0; r < step->n; r++) {
        int32_t seq = step->seq[r];
        int32_t n = ks_policy_kv_n_entries(&s->env, seq, 0, 0);
        chess_seq *q = &s->seqs[seq];
        float H = step->entropy ? step->entropy[r] : NAN, V = step->varentropy ? step->varentropy[r] : NAN;
        if (chess_page_trigger(s, q, n, H, V)) q->pending = true;
        /* the framework asks only when 0 < budget < entries (the new token's included) */
        if (s->p.budget <= 0 || s->p.budget >= n + 1) continue;
        s->selections++;
        bool rebuild = !q->built;
        if (!rebuild) {
            bool quality = q->pending;
            bool horizon = s->horizon_on && n + 1 - s->p.window > q->horizon;
            bool period = s->period > 0 && n - q->built_n >= s->period * s->P;
            rebuild = quality || horizon || period;
            if (rebuild) s->rebuilds++;
        }
        if (rebuild) KS_TRY(chess_build(s, seq, n));
    }
    return KS_OK;
}

static ks_status chess_select(void *state, const ks_select_req *req, ks_selection *out) {
    chess_state *s = state;
    const chess_seq *q = &s->seqs[req->seq];
    out->pages = true;
    int32_t k = (req->n_select + s->P - 1) / s->P;
    if (k > q->n_sel) k = q->n_sel;
    if (k > out->cap) k = out->cap;
    if (!q->built || k <= 0) {
        out->n = 0;
        return KS_OK;
    }
    memcpy(out->idx, q->sel, sizeof(int32_t) * (size_t)k); /* best page score first */
    out->n = k;
    return KS_OK;
}

static void chess_counters(void *state, ks_policy_counters *out) {
    chess_state *s = state;
    out->selections += s->selections;
    out->rebuilds += s->rebuilds;
}

static const ks_policy_select_i chess_select_i = {
    .global = true,
    .wants_entropy = true,
    .seq_reset = chess_seq_reset,
    .before_step = chess_before_step,
    .select_layer = chess_select,
    .counters = chess_counters,
};

const ks_policy_i ks_policy_chess = {
    .name = "chess",
    .summary = "CHESS: one global grid/chunk/page selection by key-key affinity to the window, rebuilt when a "
               "page's mean entropy and varentropy both pass calibrated thresholds",
    .prefix_why = "its summaries are built at decode steps from the store's page metadata, recomputed from the restored keys",
    .create = chess_create,
    .destroy = chess_destroy,
    .arg_names = chess_args,
    .page_summaries = true,
    .select = &chess_select_i,
    .prefix = &ks_policy_prefix_stateless,
};
