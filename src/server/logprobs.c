/*
 * logprobs.c — the generated tokens' log-probabilities (ks_sched_logprob,
 * from the scheduler) in OpenAI's two JSON shapes:
 *
 *   chat:        {"content": [{"token", "logprob", "bytes",
 *                              "top_logprobs": [{"token", "logprob", "bytes"}]}],
 *                 "refusal": null}
 *   completions: {"tokens": [...], "token_logprobs": [...],
 *                 "top_logprobs": [{token: logprob}], "text_offset": [...]}
 *
 * A token's text is its piece; a piece that is not valid UTF-8 on its own
 * (a byte of a multi-byte character) is written with U+FFFD in "token",
 * and "bytes" (chat) always has the exact bytes.  A log-probability of
 * minus infinity (a token the model rules out) is -9999, as OpenAI writes
 * it, since JSON has no infinity.  text_offset counts bytes of the
 * completion's text from its start, across the chunks of a stream.
 */
#include "server/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static double finite_lp(float lp) { return isfinite(lp) ? (double)lp : -9999.0; }

/* The piece of id: cleaned text into *text (malloc'd), raw bytes into
 * raw[cap] (length *n).  false on a refused allocation. */
static bool piece_of(ks_server *srv, int32_t id, char **text, char *raw, size_t cap, size_t *n) {
    *n = 0;
    if (ks_token_to_piece(srv->model, id, raw, cap, n) != KS_OK) *n = 0; /* a piece over cap: shown empty */
    *text = ks_api_utf8_clean(raw, *n);
    return *text != NULL;
}

/* {"token", "logprob", "bytes"} into o; false on a refused allocation. */
static bool chat_token(ks_server *srv, cJSON *o, int32_t id, float lp) {
    char raw[256], *text;
    size_t n;
    if (!o || !piece_of(srv, id, &text, raw, sizeof raw, &n)) return false;
    bool ok = cJSON_AddStringToObject(o, "token", text) && cJSON_AddNumberToObject(o, "logprob", finite_lp(lp));
    free(text);
    cJSON *b = ok ? cJSON_AddArrayToObject(o, "bytes") : NULL;
    for (size_t k = 0; b && k < n; k++)
        if (!cJSON_AddItemToArray(b, cJSON_CreateNumber((unsigned char)raw[k]))) b = NULL;
    return b != NULL;
}

cJSON *ks_server_logprobs_chat(ks_server *srv, const ks_sched_logprob *lp, int32_t n) {
    cJSON *root = cJSON_CreateObject(), *content = root ? cJSON_AddArrayToObject(root, "content") : NULL;
    bool ok = content && cJSON_AddNullToObject(root, "refusal");
    for (int32_t i = 0; ok && i < n; i++) {
        cJSON *t = cJSON_CreateObject();
        ok = chat_token(srv, t, lp[i].id, lp[i].logprob);
        cJSON *top = ok ? cJSON_AddArrayToObject(t, "top_logprobs") : NULL;
        ok = ok && top;
        for (int32_t j = 0; ok && j < lp[i].n_top; j++) {
            cJSON *a = cJSON_CreateObject();
            ok = chat_token(srv, a, lp[i].top_id[j], lp[i].top_logprob[j]) && cJSON_AddItemToArray(top, a);
            if (!ok) cJSON_Delete(a);
        }
        if (t && (!ok || !cJSON_AddItemToArray(content, t))) {
            cJSON_Delete(t);
            ok = false;
        }
    }
    if (!ok) {
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

cJSON *ks_server_logprobs_text(ks_server *srv, const ks_sched_logprob *lp, int32_t n, size_t *text_offset) {
    cJSON *root = cJSON_CreateObject();
    cJSON *tokens = root ? cJSON_AddArrayToObject(root, "tokens") : NULL;
    cJSON *lps = tokens ? cJSON_AddArrayToObject(root, "token_logprobs") : NULL;
    cJSON *tops = lps ? cJSON_AddArrayToObject(root, "top_logprobs") : NULL;
    cJSON *offs = tops ? cJSON_AddArrayToObject(root, "text_offset") : NULL;
    bool ok = offs != NULL;
    for (int32_t i = 0; ok && i < n; i++) {
        char raw[256], *text;
        size_t len;
        if (!piece_of(srv, lp[i].id, &text, raw, sizeof raw, &len)) {
            ok = false;
            break;
        }
        ok = cJSON_AddItemToArray(tokens, cJSON_CreateString(text)) &&
             cJSON_AddItemToArray(lps, cJSON_CreateNumber(finite_lp(lp[i].logprob))) &&
             cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)*text_offset));
        free(text);
        *text_offset += len;
        cJSON *top = ok ? cJSON_CreateObject() : NULL;
        for (int32_t j = 0; top && j < lp[i].n_top; j++) {
            char r2[256], *t2;
            size_t l2;
            if (!piece_of(srv, lp[i].top_id[j], &t2, r2, sizeof r2, &l2)) {
                cJSON_Delete(top);
                top = NULL;
                break;
            }
            /* two pieces with the same text (rare): the first, the likelier, stays */
            if (!cJSON_GetObjectItemCaseSensitive(top, t2) && !cJSON_AddNumberToObject(top, t2, finite_lp(lp[i].top_logprob[j]))) {
                cJSON_Delete(top);
                top = NULL;
            }
            free(t2);
        }
        ok = top && cJSON_AddItemToArray(tops, top);
    }
    if (!ok) {
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}
