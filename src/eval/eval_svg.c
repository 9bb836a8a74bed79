/*
 * eval_svg.c — the eval harness's two plots as plain SVG text.
 *
 * The plots are few and fixed (accuracy vs KV budget per policy; accuracy
 * over needle depth x context length), so a plotting dependency would cost
 * more than these hundred lines.  SVG is text any browser shows and any XML
 * parser checks, which is how the tests validate it.  Every document starts
 * with `<svg xmlns=... width=".." height=".."` and carries no prolog, so
 * ks_eval_svg_stack can nest several in one file by reading those two
 * attributes back.  All caller text (titles, policy names) is XML-escaped.
 */
#include "core/core.h"
#include "eval/eval.h"
#include "eval/eval_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const g_colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                       "#9467bd", "#8c564b", "#e377c2", "#17becf"};

static void svg_escaped(ks_eval_sbuf *b, const char *s) {
    for (; s && *s; s++) {
        switch (*s) {
        case '<': ks_eval_sbuf_puts(b, "&lt;"); break;
        case '>': ks_eval_sbuf_puts(b, "&gt;"); break;
        case '&': ks_eval_sbuf_puts(b, "&amp;"); break;
        case '"': ks_eval_sbuf_puts(b, "&quot;"); break;
        default:
            /* control characters are not allowed in XML 1.0 */
            if ((unsigned char)*s >= 0x20 || *s == '\n' || *s == '\t') ks_eval_sbuf_putn(b, s, 1);
        }
    }
}

static void svg_open(ks_eval_sbuf *b, int w, int h, const char *title) {
    ks_eval_sbuf_printf(b,
                        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
                        "font-family=\"sans-serif\" font-size=\"12\">\n",
                        w, h, w, h);
    ks_eval_sbuf_printf(b, "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", w, h);
    ks_eval_sbuf_printf(b, "<text x=\"%d\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">", w / 2);
    svg_escaped(b, title);
    ks_eval_sbuf_puts(b, "</text>\n");
}

ks_status ks_eval_svg_budget_chart(const char *title, const ks_eval_series *series, int32_t n_series,
                                   char **out_svg) {
    if (!out_svg || n_series < 0 || (n_series > 0 && !series))
        return KS_FAIL(KS_ERR_INVALID_ARG, "budget chart: bad arguments");
    const int W = 680, H = 420, L = 70, R = 170, T = 40, B = 60;
    const int pw = W - L - R, ph = H - T - B;
    double x0 = INFINITY, x1 = -INFINITY;
    for (int32_t s = 0; s < n_series; s++) {
        if (series[s].n < 0 || (series[s].n > 0 && (!series[s].x || !series[s].y)))
            return KS_FAIL(KS_ERR_INVALID_ARG, "budget chart: series %d has no data", s);
        for (int32_t i = 0; i < series[s].n; i++) {
            if (!isfinite(series[s].x[i])) continue;
            x0 = fmin(x0, series[s].x[i]);
            x1 = fmax(x1, series[s].x[i]);
        }
    }
    if (!(x0 <= x1)) x0 = 0, x1 = 1;
    if (x1 - x0 < 1e-9) { /* one budget: centre it */
        double pad = x0 > 0 ? x0 * 0.5 : 1;
        x0 -= pad;
        x1 += pad;
        if (x0 < 0 && x1 > 0) x0 = 0;
    }
#define SX(v) (L + ((v) - x0) / (x1 - x0) * pw)
#define SY(v) (T + (1.0 - (v)) * ph)
    ks_eval_sbuf b = {0};
    svg_open(&b, W, H, title ? title : "accuracy vs KV budget");
    /* grid, ticks, labels */
    for (int i = 0; i <= 4; i++) {
        double v = i / 4.0;
        ks_eval_sbuf_printf(&b, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", L, SY(v),
                            L + pw, SY(v));
        ks_eval_sbuf_printf(&b, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.2f</text>\n", L - 6, SY(v) + 4, v);
    }
    for (int i = 0; i <= 4; i++) {
        double v = x0 + (x1 - x0) * i / 4.0;
        ks_eval_sbuf_printf(&b, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"black\"/>\n", SX(v),
                            T + ph, SX(v), T + ph + 5);
        ks_eval_sbuf_printf(&b, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%.0f</text>\n", SX(v), T + ph + 18,
                            v);
    }
    ks_eval_sbuf_printf(&b, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", L, T + ph, L + pw,
                        T + ph);
    ks_eval_sbuf_printf(&b, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", L, T, L, T + ph);
    ks_eval_sbuf_printf(&b, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">KV budget (tokens)</text>\n", L + pw / 2,
                        H - 18);
    ks_eval_sbuf_printf(&b,
                        "<text x=\"18\" y=\"%d\" text-anchor=\"middle\" transform=\"rotate(-90 18 %d)\">accuracy</text>\n",
                        T + ph / 2, T + ph / 2);
    const int32_t n_colors = (int32_t)(sizeof g_colors / sizeof g_colors[0]);
    for (int32_t s = 0; s < n_series; s++) {
        const ks_eval_series *se = &series[s];
        const char *col = g_colors[s % n_colors];
        /* past the palette, series repeat its colours dotted, so each line stays distinct */
        const char *dots = s >= n_colors ? " stroke-dasharray=\"2 3\"" : "";
        if (se->reference && se->n > 0) {
            double y = fmin(1, fmax(0, se->y[0]));
            ks_eval_sbuf_printf(&b,
                                "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\" "
                                "stroke-dasharray=\"6 4\"/>\n",
                                L, SY(y), L + pw, SY(y), col);
        } else if (se->n > 0) {
            ks_eval_sbuf_printf(&b, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s points=\"", col, dots);
            for (int32_t i = 0; i < se->n; i++)
                ks_eval_sbuf_printf(&b, "%s%.1f,%.1f", i ? " " : "", SX(se->x[i]), SY(fmin(1, fmax(0, se->y[i]))));
            ks_eval_sbuf_puts(&b, "\"/>\n");
            for (int32_t i = 0; i < se->n; i++)
                ks_eval_sbuf_printf(&b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"/>\n", SX(se->x[i]),
                                    SY(fmin(1, fmax(0, se->y[i]))), col);
        }
        int ly = T + 10 + 20 * s;
        ks_eval_sbuf_printf(&b, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2\"%s/>\n",
                            L + pw + 16, ly, L + pw + 40, ly, col, se->reference ? " stroke-dasharray=\"6 4\"" : dots);
        ks_eval_sbuf_printf(&b, "<text x=\"%d\" y=\"%d\">", L + pw + 46, ly + 4);
        svg_escaped(&b, se->name ? se->name : "?");
        ks_eval_sbuf_puts(&b, "</text>\n");
    }
#undef SX
#undef SY
    ks_eval_sbuf_puts(&b, "</svg>\n");
    *out_svg = ks_eval_sbuf_take(&b);
    return KS_OK;
}

/* red (0) -> amber (0.5) -> green (1) */
static void svg_heat_color(double v, char *buf, size_t cap) {
    v = fmin(1, fmax(0, v));
    double r, g, bl;
    if (v < 0.5) {
        double t = v / 0.5;
        r = 215 + (240 - 215) * t, g = 48 + (190 - 48) * t, bl = 39 + (60 - 39) * t;
    } else {
        double t = (v - 0.5) / 0.5;
        r = 240 + (26 - 240) * t, g = 190 + (152 - 190) * t, bl = 60 + (80 - 60) * t;
    }
    snprintf(buf, cap, "rgb(%d,%d,%d)", (int)lround(r), (int)lround(g), (int)lround(bl));
}

ks_status ks_eval_svg_heatmap(const char *title, const int32_t *lengths, int32_t n_len, const double *depths,
                              int32_t n_depth, const double *acc, char **out_svg) {
    if (!out_svg || !lengths || !depths || !acc || n_len <= 0 || n_depth <= 0)
        return KS_FAIL(KS_ERR_INVALID_ARG, "heat map: empty grid");
    const int cw = 76, ch = 34, L = 90, T = 44;
    const int W = L + cw * n_len + 30, H = T + ch * n_depth + 56;
    ks_eval_sbuf b = {0};
    svg_open(&b, W, H, title ? title : "accuracy by depth and length");
    for (int32_t d = 0; d < n_depth; d++) {
        int y = T + ch * d;
        ks_eval_sbuf_printf(&b, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%.2f</text>\n", L - 8, y + ch / 2 + 4,
                            depths[d]);
        for (int32_t l = 0; l < n_len; l++) {
            int x = L + cw * l;
            double v = acc[(size_t)d * n_len + l];
            char col[32] = "#eeeeee";
            if (isfinite(v)) svg_heat_color(v, col, sizeof col);
            ks_eval_sbuf_printf(&b, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"%s\" stroke=\"white\"/>\n",
                                x, y, cw, ch, col);
            if (isfinite(v))
                ks_eval_sbuf_printf(&b, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%.2f</text>\n", x + cw / 2,
                                    y + ch / 2 + 4, v);
            else
                ks_eval_sbuf_printf(&b, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" fill=\"#888\">n/a</text>\n",
                                    x + cw / 2, y + ch / 2 + 4);
        }
    }
    for (int32_t l = 0; l < n_len; l++)
        ks_eval_sbuf_printf(&b, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%d</text>\n", L + cw * l + cw / 2,
                            T + ch * n_depth + 16, lengths[l]);
    ks_eval_sbuf_printf(&b, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">context length (tokens)</text>\n",
                        L + cw * n_len / 2, T + ch * n_depth + 38);
    ks_eval_sbuf_printf(&b,
                        "<text x=\"16\" y=\"%d\" text-anchor=\"middle\" transform=\"rotate(-90 16 %d)\">evidence depth</text>\n",
                        T + ch * n_depth / 2, T + ch * n_depth / 2);
    ks_eval_sbuf_puts(&b, "</svg>\n");
    *out_svg = ks_eval_sbuf_take(&b);
    return KS_OK;
}

static bool svg_attr(const char *doc, const char *name, int *out) {
    char key[32];
    snprintf(key, sizeof key, " %s=\"", name);
    const char *p = strstr(doc, key);
    const char *end = strchr(doc, '>');
    if (!p || (end && p > end)) return false;
    *out = atoi(p + strlen(key));
    return true;
}

ks_status ks_eval_svg_stack(const char *const *docs, int32_t n_docs, char **out_svg) {
    if (!docs || !out_svg || n_docs <= 0) return KS_FAIL(KS_ERR_INVALID_ARG, "svg stack: nothing to stack");
    int W = 0, H = 0;
    for (int32_t i = 0; i < n_docs; i++) {
        int w = 0, h = 0;
        if (!docs[i] || strncmp(docs[i], "<svg ", 5) || !svg_attr(docs[i], "width", &w) || !svg_attr(docs[i], "height", &h))
            return KS_FAIL(KS_ERR_INVALID_ARG, "svg stack: document %d is not one of ours", i);
        W = w > W ? w : W;
        H += h;
    }
    ks_eval_sbuf b = {0};
    ks_eval_sbuf_printf(&b,
                        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" "
                        "width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\">\n",
                        W, H, W, H);
    int y = 0;
    for (int32_t i = 0; i < n_docs; i++) {
        int h = 0;
        svg_attr(docs[i], "height", &h);
        ks_eval_sbuf_printf(&b, "<svg x=\"0\" y=\"%d\" ", y);
        ks_eval_sbuf_puts(&b, docs[i] + 5);
        y += h;
    }
    ks_eval_sbuf_puts(&b, "</svg>\n");
    *out_svg = ks_eval_sbuf_take(&b);
    return KS_OK;
}
