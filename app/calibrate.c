/*
 * calibrate.c — CHESS threshold calibration file (see calibrate.h).
 *
 * The file is small JSON so it can be read, diffed and hand-edited:
 *   {"policy": "chess", "percentile": 99, "h_max": 2.31, "v_max": 4.07,
 *    "tokens": 1234, "pages": 321, "page": 32, "unit": "page mean",
 *    "model": "aidreams260K.gguf"}
 * h_max / v_max are 99th percentiles of per-page averages over `page`-token
 * KV pages; only they are read back; both must be finite and >= 0.
 */
#define _GNU_SOURCE
#include "calibrate.h"

#include "args.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void app_entropy_of(const float *logits, int32_t n, float *H, float *Var) {
    float mx = logits[0];
    for (int32_t i = 1; i < n; i++) mx = logits[i] > mx ? logits[i] : mx;
    double z = 0;
    for (int32_t i = 0; i < n; i++) z += exp((double)logits[i] - mx);
    double lz = log(z), h = 0, m2 = 0;
    for (int32_t i = 0; i < n; i++) {
        double lp = (double)logits[i] - mx - lz, p = exp(lp);
        h -= p * lp;
        m2 += p * lp * lp;
    }
    *H = (float)h;
    *Var = (float)(m2 - h * h > 0 ? m2 - h * h : 0);
}

size_t app_chess_page_means(const float *logits, int32_t n_gen, int32_t n_vocab, int32_t first_entry, int32_t page,
                            double *h_out, double *v_out) {
    size_t m = 0;
    double sh = 0, sv = 0;
    int32_t cnt = 0, cur = -1;
    for (int32_t g = 0; g < n_gen; g++) {
        int32_t pg = (first_entry + g) / (page > 0 ? page : 1);
        if (pg != cur && cnt > 0) {
            h_out[m] = sh / cnt;
            v_out[m++] = sv / cnt;
            sh = sv = 0;
            cnt = 0;
        }
        cur = pg;
        float H, Var;
        app_entropy_of(logits + (size_t)g * n_vocab, n_vocab, &H, &Var);
        sh += H;
        sv += Var;
        cnt++;
    }
    if (cnt > 0) {
        h_out[m] = sh / cnt;
        v_out[m++] = sv / cnt;
    }
    return m;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double app_percentile(double *x, size_t n, double pct) {
    if (n == 0) return NAN;
    qsort(x, n, sizeof *x, cmp_double);
    double r = pct / 100.0 * (double)(n - 1);
    size_t lo = (size_t)floor(r), hi = lo + 1 < n ? lo + 1 : lo;
    return x[lo] + (x[hi] - x[lo]) * (r - (double)lo);
}

bool app_chess_calib_path(const char *model, char *out, size_t cap) {
    int w = snprintf(out, cap, "%s%s", model, APP_CHESS_CALIB_SUFFIX);
    return w > 0 && (size_t)w < cap;
}

bool app_chess_calib_write(const char *cmd, const char *model, double h_max, double v_max, size_t n_tokens,
                           size_t n_pages, int32_t page) {
    char path[4096];
    if (!app_chess_calib_path(model, path, sizeof path)) {
        fprintf(stderr, "kvsieve %s: model path too long for the calibration file\n", cmd);
        return false;
    }
    cJSON *o = cJSON_CreateObject();
    const char *base = strrchr(model, '/');
    cJSON_AddStringToObject(o, "policy", "chess");
    cJSON_AddStringToObject(o, "model", base ? base + 1 : model);
    cJSON_AddNumberToObject(o, "percentile", APP_CHESS_CALIB_PERCENTILE);
    cJSON_AddNumberToObject(o, "h_max", h_max);
    cJSON_AddNumberToObject(o, "v_max", v_max);
    cJSON_AddNumberToObject(o, "tokens", (double)n_tokens);
    cJSON_AddNumberToObject(o, "pages", (double)n_pages);
    cJSON_AddNumberToObject(o, "page", page);
    cJSON_AddStringToObject(o, "unit", "page mean");
    cJSON_AddStringToObject(o, "written_by", "kvsieve eval --calibrate");
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    FILE *f = fopen(path, "w");
    bool ok = f != NULL;
    if (f) {
        ok = fprintf(f, "%s\n", text) > 0;
        ok &= fclose(f) == 0;
    }
    if (!ok) fprintf(stderr, "kvsieve %s: cannot write '%s': %s\n", cmd, path, strerror(errno));
    cJSON_free(text);
    return ok;
}

int app_chess_calib_read(const char *cmd, const char *model, double *h_max, double *v_max) {
    char path[4096];
    if (!app_chess_calib_path(model, path, sizeof path) || access(path, F_OK) != 0) return 0;
    size_t len = 0;
    char *text = app_read_file(cmd, path, &len);
    if (!text) return -1;
    cJSON *o = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(o, "h_max"), *v = cJSON_GetObjectItemCaseSensitive(o, "v_max");
    int rc = -1;
    if (cJSON_IsNumber(h) && cJSON_IsNumber(v) && isfinite(h->valuedouble) && isfinite(v->valuedouble) &&
        h->valuedouble >= 0 && v->valuedouble >= 0) {
        *h_max = h->valuedouble;
        *v_max = v->valuedouble;
        rc = 1;
    } else {
        fprintf(stderr, "kvsieve %s: '%s' is not a chess calibration (needs numbers h_max, v_max >= 0)\n", cmd, path);
    }
    cJSON_Delete(o);
    return rc;
}
