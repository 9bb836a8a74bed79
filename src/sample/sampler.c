/*
 * sampler.c — turning one row of logits into one token id.
 *
 * The chain is the conventional one (repetition penalty, temperature, top-k,
 * top-p, min-p, draw) because users tune these knobs against llama.cpp-like
 * behaviour and expect the same meaning.  What matters here is cost: with a
 * 150K vocabulary a full sort per token is ~2-3 ms, comparable to a decode
 * step of a small model.  So nothing is sorted that need not be:
 *
 *   - top-k is one pass with a k-heap (an element costs one compare unless
 *     it beats the current k-th best), then a sort of only k;
 *   - top-p without top-k needs no order at all, only the cut: a weighted
 *     quickselect finds the smallest set of best tokens reaching top_p of
 *     the mass, after a linear pass has moved the few tokens with p >= 1e-4
 *     (relative to the max) to the front, where the nucleus nearly always is;
 *   - min-p is a linear filter (its cut is relative to the max probability,
 *     which renormalisation does not change, so it needs no order at all);
 *     when it is the only cut, tokens it drops skip even the exp.
 *
 * Candidates are (logit, id) pairs compared by (logit desc, id asc): a strict
 * total order, so ties and the quickselect's pivot choices can never make the
 * result depend on anything but the logits and the seed.  NaN logits are
 * treated as -inf.  Greedy (temperature <= 0) is a plain argmax, lowest id
 * on ties, with no penalty applied: greedy is the "reference" mode used to
 * compare against other engines, so it must not be shaped by history.
 *
 * The penalty window is a ring of the last repeat_last_n accepted tokens;
 * each distinct token in it is penalised once (CTRL: positive logits divided,
 * negative multiplied), as in llama.cpp.
 */
#include "core/core.h"
#include "tensor/ops.h"

#include <math.h>
#include <string.h>

typedef struct ks_cand {
    float v;    /* logit (after penalty and temperature) or probability */
    int32_t id; /* token id */
} ks_cand;

struct ks_sampler {
    ks_sampler_params p;
    int32_t n_vocab;
    ks_rng rng;
    int32_t *recent;   /* [repeat_last_n] ring of accepted tokens */
    int32_t n_recent;  /* valid entries in recent (<= repeat_last_n) */
    int32_t recent_head; /* next write position */
    int32_t *win;      /* [repeat_last_n] scratch: sorted copy of the window */
    ks_cand *cand;     /* [n_vocab] scratch candidates */
};

ks_sampler_params ks_sampler_default_params(void) {
    ks_sampler_params p;
    p.temperature = 0.8f;
    p.top_k = 40;
    p.top_p = 0.95f;
    p.min_p = 0.05f;
    p.repeat_penalty = 1.0f;
    p.repeat_last_n = 64;
    p.seed = 42;
    return p;
}

ks_status ks_sampler_create(ks_sampler_params params, int32_t n_vocab, ks_sampler **out) {
    if (!out) return KS_FAIL(KS_ERR_INVALID_ARG, "sampler: out is NULL");
    if (n_vocab <= 0) return KS_FAIL(KS_ERR_INVALID_ARG, "sampler: n_vocab %d must be > 0", n_vocab);
    if (isnan(params.temperature))
        return KS_FAIL(KS_ERR_INVALID_ARG, "sampler: temperature is NaN");
    if (!(params.top_p > 0.0f && params.top_p <= 1.0f))
        return KS_FAIL(KS_ERR_INVALID_ARG, "sampler: top_p %g must be in (0, 1]", (double)params.top_p);
    if (!(params.min_p >= 0.0f && params.min_p < 1.0f))
        return KS_FAIL(KS_ERR_INVALID_ARG, "sampler: min_p %g must be in [0, 1)", (double)params.min_p);
    if (!(params.repeat_penalty > 0.0f) || isinf(params.repeat_penalty))
        return KS_FAIL(KS_ERR_INVALID_ARG, "sampler: repeat_penalty %g must be finite and > 0",
                       (double)params.repeat_penalty);
    if (params.repeat_last_n < 0)
        return KS_FAIL(KS_ERR_INVALID_ARG, "sampler: repeat_last_n %d must be >= 0",
                       params.repeat_last_n);
    ks_sampler *s = ks_calloc(1, sizeof *s);
    if (!s) return KS_FAIL(KS_ERR_NOMEM, "sampler");
    s->p = params;
    s->n_vocab = n_vocab;
    s->rng.s = params.seed;
    if (params.repeat_last_n > 0) {
        s->recent = ks_malloc((size_t)params.repeat_last_n * sizeof *s->recent);
        s->win = ks_malloc((size_t)params.repeat_last_n * sizeof *s->win);
    }
    s->cand = ks_malloc((size_t)n_vocab * sizeof *s->cand);
    if (!s->cand || (params.repeat_last_n > 0 && (!s->recent || !s->win))) {
        ks_sampler_destroy(s);
        return KS_FAIL(KS_ERR_NOMEM, "sampler over %d tokens", n_vocab);
    }
    *out = s;
    return KS_OK;
}

void ks_sampler_destroy(ks_sampler *s) {
    if (!s) return;
    ks_free(s->recent);
    ks_free(s->win);
    ks_free(s->cand);
    ks_free(s);
}

void ks_sampler_accept(ks_sampler *s, int32_t token) {
    KS_ASSERT(s != NULL);
    KS_ASSERT(token >= 0 && token < s->n_vocab);
    int32_t w = s->p.repeat_last_n;
    if (w <= 0) return;
    s->recent[s->recent_head] = token;
    s->recent_head = (s->recent_head + 1) % w;
    if (s->n_recent < w) s->n_recent++;
}

/* ------------------------------------------------------------ ordering -- */

/* a ranks before b: higher value, then lower id. */
static inline int cand_before(const ks_cand *a, const ks_cand *b) {
    return a->v > b->v || (a->v == b->v && a->id < b->id);
}

static inline void cand_swap(ks_cand *a, ks_cand *b) {
    ks_cand t = *a;
    *a = *b;
    *b = t;
}

static void cand_insertion_sort(ks_cand *c, int64_t n) {
    for (int64_t i = 1; i < n; i++) {
        ks_cand x = c[i];
        int64_t j = i;
        while (j > 0 && cand_before(&x, &c[j - 1])) {
            c[j] = c[j - 1];
            j--;
        }
        c[j] = x;
    }
}

/* Hoare partition of b[0..m) (m > 16) around a median-of-3 pivot; returns j
 * such that b[0..j] come before (or tie with) b[j+1..m). */
static int64_t cand_partition(ks_cand *b, int64_t m) {
    int64_t mid = m / 2;
    if (cand_before(&b[mid], &b[0])) cand_swap(&b[mid], &b[0]);
    if (cand_before(&b[m - 1], &b[0])) cand_swap(&b[m - 1], &b[0]);
    if (cand_before(&b[m - 1], &b[mid])) cand_swap(&b[m - 1], &b[mid]);
    ks_cand pivot = b[mid];
    int64_t i = 0, j = m - 1;
    for (;;) {
        while (cand_before(&b[i], &pivot)) i++;
        while (cand_before(&pivot, &b[j])) j--;
        if (i >= j) return j;
        cand_swap(&b[i], &b[j]);
        i++;
        j--;
    }
}

/* Sort c[0..n) by rank: quicksort with median-of-3, insertion below 16. */
static void cand_sort(ks_cand *c, int64_t n) {
    while (n > 16) {
        int64_t j = cand_partition(c, n); /* the order is strict: only the pivot equals itself */
        /* [0, j] ranks before-or-at pivot, [j+1, n) after; recurse on the smaller. */
        int64_t nl = j + 1;
        if (nl < n - nl) {
            cand_sort(c, nl);
            c += nl;
            n -= nl;
        } else {
            cand_sort(c + nl, n - nl);
            n = nl;
        }
    }
    cand_insertion_sort(c, n);
}

/* Rearrange c[0..n) so that c[0..k) are the k best (in any order), 0 < k < n.
 * Quickselect with median-of-3; expected O(n). */
static void cand_select(ks_cand *c, int64_t n, int64_t k) {
    KS_ASSERT(k > 0 && k < n);
    int64_t lo = 0, hi = n; /* the boundary k lies within [lo, hi) */
    while (hi - lo > 16) {
        ks_cand *b = c + lo;
        int64_t j = cand_partition(b, hi - lo);
        int64_t split = lo + j + 1; /* [lo, split) before [split, hi) */
        if (split == k) return;
        if (split < k) lo = split;
        else hi = split;
    }
    cand_insertion_sort(c + lo, hi - lo);
}

/* -------------------------------------------------------------- helpers -- */


static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static void apply_repeat_penalty(ks_sampler *s, float *logits) {
    float pen = s->p.repeat_penalty;
    int32_t n = s->n_recent;
    if (pen == 1.0f || n == 0) return;
    memcpy(s->win, s->recent, (size_t)n * sizeof *s->win);
    qsort(s->win, (size_t)n, sizeof *s->win, cmp_i32);
    for (int32_t i = 0; i < n; i++) {
        if (i > 0 && s->win[i] == s->win[i - 1]) continue; /* once per distinct token */
        float *l = &logits[s->win[i]];
        *l = *l > 0.0f ? *l / pen : *l * pen;
    }
}

/* ---------------------------------------------------------- selection -- */

/* Heap of the k best seen so far, worst at the root (h[0]). */
static void heap_sift_down(ks_cand *h, int64_t k, int64_t i) {
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < k && cand_before(&h[w], &h[l])) w = l; /* child l is worse than w */
        if (r < k && cand_before(&h[w], &h[r])) w = r;
        if (w == i) return;
        cand_swap(&h[i], &h[w]);
        i = w;
    }
}

/* c[0..k) = the k best of logits[V] (any order).  One pass; an element is
 * compared once against the current k-th best, so random-looking logits
 * cost ~1 compare each and only ascending runs pay the log k. */
static void cand_topk_heap(const float *logits, int32_t V, int32_t k, ks_cand *c) {
    for (int32_t i = 0; i < k; i++) {
        c[i].v = logits[i];
        c[i].id = i;
    }
    for (int64_t i = k / 2 - 1; i >= 0; i--) heap_sift_down(c, k, i);
    for (int32_t i = k; i < V; i++) {
        /* Ids ascend, so an equal value ranks after the root: strict > is the rank test. */
        if (logits[i] > c[0].v) {
            c[0].v = logits[i];
            c[0].id = i;
            heap_sift_down(c, k, 0);
        }
    }
}

/* Smallest m such that the m best of c[0..n) carry mass >= target; they are
 * moved to c[0..m) (unordered).  Weighted quickselect: partition, and keep
 * only the side where the target is crossed.  Returns n if rounding keeps the
 * target out of reach. */
static int64_t cand_nucleus(ks_cand *c, int64_t n, double target) {
    int64_t lo = 0, hi = n;
    double acc = 0.0; /* mass of c[0..lo), all of which is in the nucleus */
    while (hi - lo > 16) {
        ks_cand *b = c + lo;
        int64_t j = cand_partition(b, hi - lo);
        int64_t split = lo + j + 1;
        double ml = 0.0;
        for (int64_t t = lo; t < split; t++) ml += c[t].v;
        if (acc + ml >= target) {
            hi = split;
        } else {
            acc += ml;
            lo = split;
        }
    }
    cand_insertion_sort(c + lo, hi - lo);
    for (int64_t i = lo; i < hi; i++) {
        acc += c[i].v;
        if (acc >= target) return i + 1;
    }
    return n;
}

/* ------------------------------------------------------------- sampling -- */

int32_t ks_sampler_sample(ks_sampler *s, float *logits) {
    KS_ASSERT(s != NULL && logits != NULL);
    const int32_t V = s->n_vocab;
    if (s->p.temperature <= 0.0f) return ks_argmax(logits, V);

    /* Penalty and temperature in place (NaN -> -inf so the order is total). */
    apply_repeat_penalty(s, logits);
    const float inv_t = 1.0f / s->p.temperature;
    for (int32_t i = 0; i < V; i++) {
        float v = logits[i] * inv_t;
        logits[i] = isnan(v) ? -INFINITY : v;
    }

    ks_cand *c = s->cand; /* [n] live candidates */
    int64_t n = V;
    bool sorted = false; /* c[0..n) in rank order */
    const int32_t k = s->p.top_k;
    if (k > 0 && k < V) {
        if (k <= 4096) {
            cand_topk_heap(logits, V, k, c);
        } else {
            for (int32_t i = 0; i < V; i++) {
                c[i].v = logits[i];
                c[i].id = i;
            }
            cand_select(c, V, k);
        }
        n = k;
        cand_sort(c, n);
        sorted = true;
    } else if (s->p.top_p >= 1.0f && s->p.min_p > 0.0f) {
        /* Only min-p cuts: tokens it will drop need no exp.  Prefilter on
         * the logit with a margin; the exact test on p follows below. */
        float mxl = -INFINITY;
        for (int32_t i = 0; i < V; i++)
            if (logits[i] > mxl) mxl = logits[i];
        const float lcut = mxl + logf(s->p.min_p) - 1e-3f;
        n = 0;
        for (int32_t i = 0; i < V; i++)
            if (logits[i] >= lcut) {
                c[n].v = logits[i];
                c[n].id = i;
                n++;
            }
        if (n == 0) return ks_argmax(logits, V); /* all -inf */
    } else {
        for (int32_t i = 0; i < V; i++) {
            c[i].v = logits[i];
            c[i].id = i;
        }
    }

    /* Softmax numerators exp(l - max): the max probability is exactly 1. */
    float mx = c[0].v;
    if (!sorted)
        for (int64_t i = 1; i < n; i++)
            if (c[i].v > mx) mx = c[i].v;
    if (mx == -INFINITY) return ks_argmax(logits, V); /* everything masked: deterministic fallback */
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        float p = expf(c[i].v - mx);
        c[i].v = p; /* monotone map: rank order is unchanged */
        sum += p;
    }

    /* top-p: the shortest rank prefix whose mass reaches top_p (at least one). */
    if (s->p.top_p < 1.0f && n > 1) {
        const double target = (double)s->p.top_p * sum;
        int64_t keep = n;
        if (sorted) {
            double cum = 0.0;
            for (int64_t i = 0; i < n; i++) {
                cum += c[i].v;
                if (cum >= target) {
                    keep = i + 1;
                    break;
                }
            }
        } else {
            /* Move p >= tau to the front first.  With tau = (1 - top_p) *
             * sum / n the rest carries less than 1 - top_p of the mass, so
             * the nucleus lies in the front (barring rounding, handled
             * below) and the select runs on it instead of the vocabulary. */
            const float tau = (float)((1.0 - (double)s->p.top_p) * sum / (double)n);
            int64_t f = 0;
            double mf = 0.0;
            for (int64_t i = 0; i < n; i++)
                if (c[i].v >= tau) {
                    cand_swap(&c[f], &c[i]);
                    mf += c[f].v;
                    f++;
                }
            if (mf >= target) keep = cand_nucleus(c, f, target);
            else keep = f + cand_nucleus(c + f, n - f, target - mf);
            if (keep > n) keep = n;
        }
        n = keep;
        sum = 0.0;
        for (int64_t j = 0; j < n; j++) sum += c[j].v;
    }

    /* min-p: drop p < min_p * p_max (p_max = 1).  Stable compaction. */
    if (s->p.min_p > 0.0f && n > 1) {
        const float thr = s->p.min_p;
        int64_t m = 0;
        sum = 0.0;
        for (int64_t i = 0; i < n; i++)
            if (c[i].v >= thr) {
                c[m++] = c[i];
                sum += c[i].v;
            }
        KS_ASSERT(m >= 1); /* the max has p = 1 > min_p */
        n = m;
    }

    /* Draw. */
    double r = ks_rng_uniform(&s->rng) * sum;
    double cum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        cum += c[i].v;
        if (r < cum) return c[i].id;
    }
    /* r landed on the rounding slack at the top: take the last candidate with p > 0. */
    for (int64_t i = n - 1; i > 0; i--)
        if (c[i].v > 0.0f) return c[i].id;
    return c[0].id;
}
