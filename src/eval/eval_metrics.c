/*
 * eval_metrics.c — the numbers `kvsieve eval` reports, as pure functions.
 *
 * Each metric is a few lines over plain arrays so that it can be checked on
 * cases small enough to work out by hand (tests/test_eval.c); nothing here
 * knows about contexts or models.
 *
 * Answer scoring normalises what a small model plausibly gets "almost right"
 * in harmless ways (leading spaces, trailing punctuation, case of variable
 * names) and nothing else: a number is a maximal run of ASCII digits, a name
 * a maximal run of [A-Za-z0-9_], compared case-insensitively.  Multi-answer
 * tasks use recall (share of the expected answers present), as RULER does,
 * so a partial answer earns partial credit.
 *
 * KL is computed from logits through log-softmax in double precision with the
 * row maximum subtracted, so large logits neither overflow nor lose the
 * small probabilities that dominate a KL; a term with p = 0 contributes 0.
 */
#include "core/core.h"
#include "eval/eval.h"
#include "tensor/ops.h"

#include <ctype.h>
#include <math.h>
#include <string.h>

/* Skips leading whitespace; returns the length of the first line after it. */
static const char *eval_first_line(const char *s, size_t *len) {
    while (*s && isspace((unsigned char)*s)) s++;
    const char *e = strchr(s, '\n');
    *len = e ? (size_t)(e - s) : strlen(s);
    return s;
}

bool ks_eval_first_number(const char *s, char *buf, size_t cap) {
    size_t len = 0;
    s = eval_first_line(s, &len);
    for (size_t i = 0; i < len; i++) {
        if (!isdigit((unsigned char)s[i])) continue;
        size_t j = i;
        while (j < len && isdigit((unsigned char)s[j])) j++;
        if (j - i + 1 > cap) return false;
        memcpy(buf, s + i, j - i);
        buf[j - i] = '\0';
        return true;
    }
    return false;
}

/* Does `s` contain `want` as a whole token of the given class? */
static bool eval_has_token(const char *s, const char *want, bool digits) {
    size_t wl = strlen(want);
    if (!wl) return false;
    for (const char *p = s; *p;) {
        bool in = digits ? isdigit((unsigned char)*p) : (isalnum((unsigned char)*p) || *p == '_');
        if (!in) {
            p++;
            continue;
        }
        const char *q = p;
        while (*q && (digits ? isdigit((unsigned char)*q) : (isalnum((unsigned char)*q) || *q == '_'))) q++;
        if ((size_t)(q - p) == wl) {
            bool eq = true;
            for (size_t i = 0; i < wl && eq; i++) eq = toupper((unsigned char)p[i]) == toupper((unsigned char)want[i]);
            if (eq) return true;
        }
        p = q;
    }
    return false;
}

/* First line, trimmed, runs of whitespace collapsed, lower-cased. */
static void eval_norm_line(const char *s, char *buf, size_t cap) {
    size_t len = 0, n = 0;
    s = eval_first_line(s, &len);
    bool space = false;
    for (size_t i = 0; i < len && n + 1 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (isspace(c)) {
            space = true;
            continue;
        }
        if (space && n) buf[n++] = ' ';
        space = false;
        if (n + 1 < cap) buf[n++] = (char)tolower(c);
    }
    buf[n] = '\0';
}

/* An item as compared for longgen: its first number if it has one, else
 * its normalised first line. */
static void eval_norm_item(const char *s, char *buf, size_t cap) {
    if (!ks_eval_first_number(s, buf, cap)) eval_norm_line(s, buf, cap);
}

double ks_eval_score(const ks_eval_instance *inst, const char *output, const char *const *items,
                     int32_t n_items) {
    if (!inst || !output) return 0.0;
    char got[64];
    switch (inst->task) {
    case KS_EVAL_PASSKEY:
    case KS_EVAL_MULTIKEY:
        if (inst->n_answers < 1 || !ks_eval_first_number(output, got, sizeof got)) return 0.0;
        return strcmp(got, inst->answers[0]) == 0 ? 1.0 : 0.0;
    case KS_EVAL_MULTIVALUE:
    case KS_EVAL_VARTRACK: {
        if (inst->n_answers < 1) return 0.0;
        int hit = 0;
        for (int32_t i = 0; i < inst->n_answers; i++)
            hit += eval_has_token(output, inst->answers[i], inst->task == KS_EVAL_MULTIVALUE);
        return (double)hit / inst->n_answers;
    }
    case KS_EVAL_LONGGEN: {
        int32_t k = inst->longgen_item;
        if (!items || k < 1 || k > n_items || !items[k - 1]) return 0.0;
        char want[256], other[256], a[256];
        eval_norm_item(items[k - 1], want, sizeof want);
        if (!want[0]) return 0.0; /* nothing to be consistent with */
        for (int32_t i = 0; i < n_items; i++) {
            if (i == k - 1 || !items[i]) continue;
            eval_norm_item(items[i], other, sizeof other);
            if (!strcmp(other, want)) return 0.0; /* a repeated item cannot tell recall from repetition */
        }
        eval_norm_item(output, a, sizeof a);
        return strcmp(a, want) == 0 ? 1.0 : 0.0;
    }
    default: return 0.0;
    }
}

ks_status ks_eval_top1_agreement(const float *a, const float *b, int32_t n_pos, int32_t n_vocab,
                                 double *out) {
    if (!a || !b || !out || n_pos <= 0 || n_vocab <= 0)
        return KS_FAIL(KS_ERR_INVALID_ARG, "top-1 agreement: empty input");
    int64_t same = 0;
    for (int32_t p = 0; p < n_pos; p++) {
        const float *ra = a + (size_t)p * n_vocab, *rb = b + (size_t)p * n_vocab;
        int32_t ia = 0, ib = 0;
        for (int32_t i = 1; i < n_vocab; i++) {
            if (ra[i] > ra[ia]) ia = i;
            if (rb[i] > rb[ib]) ib = i;
        }
        same += ia == ib;
    }
    *out = (double)same / n_pos;
    return KS_OK;
}

ks_status ks_eval_token_agreement(const int32_t *a, const int32_t *b, int32_t n, double *out) {
    if (!a || !b || !out || n <= 0) return KS_FAIL(KS_ERR_INVALID_ARG, "token agreement: empty input");
    int32_t same = 0;
    for (int32_t i = 0; i < n; i++) same += a[i] == b[i];
    *out = (double)same / n;
    return KS_OK;
}

/* log-sum-exp of a row. */
static double eval_lse(const float *row, int32_t n) {
    float mx;
    double lz = ks_log_sum_exp(row, n, &mx);
    return mx + lz;
}

ks_status ks_eval_mean_kl(const float *p, const float *q, int32_t n_pos, int32_t n_vocab, double *out) {
    if (!p || !q || !out || n_pos <= 0 || n_vocab <= 0) return KS_FAIL(KS_ERR_INVALID_ARG, "KL: empty input");
    double total = 0;
    for (int32_t t = 0; t < n_pos; t++) {
        const float *rp = p + (size_t)t * n_vocab, *rq = q + (size_t)t * n_vocab;
        double lp = eval_lse(rp, n_vocab), lq = eval_lse(rq, n_vocab);
        if (!isfinite(lp) || !isfinite(lq)) return KS_FAIL(KS_ERR_INVALID_ARG, "KL: non-finite logits at row %d", t);
        double kl = 0;
        for (int32_t i = 0; i < n_vocab; i++) {
            double logp = (double)rp[i] - lp, logq = (double)rq[i] - lq;
            double pi = exp(logp);
            if (pi > 0) kl += pi * (logp - logq);
        }
        total += kl > 0 ? kl : 0; /* rounding can leave -1e-17 for identical rows */
    }
    *out = total / n_pos;
    return KS_OK;
}

ks_status ks_eval_attention_recall(const float *probs, int32_t n_layer, int32_t n_head, int32_t n_kv,
                                   const int32_t *sel, int32_t n_sel, double *per_head, double *mean) {
    if (!probs || !mean || n_layer <= 0 || n_head <= 0 || n_kv <= 0 || n_sel < 0 || (n_sel > 0 && !sel))
        return KS_FAIL(KS_ERR_INVALID_ARG, "attention recall: bad shape");
    unsigned char *mark = ks_calloc((size_t)n_kv, 1); /* [n_kv] */
    if (!mark) return KS_FAIL(KS_ERR_NOMEM, "attention recall over %d keys", n_kv);
    double sum = 0;
    for (int32_t lh = 0; lh < n_layer * n_head; lh++) {
        const float *pr = probs + (size_t)lh * n_kv;
        const int32_t *s = sel ? sel + (size_t)lh * n_sel : NULL;
        memset(mark, 0, (size_t)n_kv);
        for (int32_t i = 0; i < n_sel; i++) {
            if (s[i] < 0 || s[i] >= n_kv) {
                ks_free(mark);
                return KS_FAIL(KS_ERR_INVALID_ARG, "attention recall: index %d outside [0, %d)", s[i], n_kv);
            }
            mark[s[i]] = 1;
        }
        double all = 0, got = 0;
        for (int32_t i = 0; i < n_kv; i++) {
            all += pr[i];
            if (mark[i]) got += pr[i];
        }
        double r = all > 0 ? got / all : 1.0;
        if (per_head) per_head[lh] = r;
        sum += r;
    }
    ks_free(mark);
    *mean = sum / ((double)n_layer * n_head);
    return KS_OK;
}
