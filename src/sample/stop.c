/*
 * stop.c — incremental stop-string matching with hold-back.
 *
 * The matcher keeps only the undecided tail of the output ("pending"), which
 * is at most (longest stop string - 1) bytes plus a partial UTF-8 character
 * plus the newest piece.  So a naive search over pending per feed is
 * O(piece * stops * stop_len) and there is no need for Aho-Corasick: the
 * strings are few and short, the pieces are one token each.
 *
 * Released text is handed out as a pointer into pending and dropped at the
 * start of the next call, so a feed never copies output twice and the caller
 * never frees anything.
 */
#include "sample/stop.h"

#include <string.h>

struct ks_stop_matcher {
    char **stops;     /* [n_stops] owned copies */
    size_t *lens;     /* [n_stops] */
    size_t n_stops;
    char *buf;        /* [cap] pending bytes live in buf[0..n) */
    size_t n, cap;
    size_t n_released; /* buf[0..n_released) was handed out by the last call */
    bool matched;
    int32_t which;
};

ks_status ks_stop_create(const char *const *stops, size_t n_stops, ks_stop_matcher **out) {
    if (!out) return KS_FAIL(KS_ERR_INVALID_ARG, "stop: out is NULL");
    if (n_stops > 0 && !stops) return KS_FAIL(KS_ERR_INVALID_ARG, "stop: stops is NULL");
    for (size_t i = 0; i < n_stops; i++)
        if (!stops[i] || !stops[i][0])
            return KS_FAIL(KS_ERR_INVALID_ARG, "stop: stop string %zu is NULL or empty", i);
    ks_stop_matcher *m = ks_calloc(1, sizeof *m);
    if (!m) return KS_FAIL(KS_ERR_NOMEM, "stop matcher");
    m->stops = ks_calloc(n_stops, sizeof *m->stops);
    m->lens = ks_calloc(n_stops, sizeof *m->lens);
    if (m->stops) m->n_stops = n_stops; /* what destroy walks */
    bool ok = m->stops && m->lens;
    for (size_t i = 0; ok && i < n_stops; i++) {
        ok = (m->stops[i] = ks_strdup(stops[i])) != NULL;
        m->lens[i] = strlen(stops[i]);
    }
    m->cap = 256;
    m->buf = ok ? ks_malloc(m->cap) : NULL;
    if (!m->buf) {
        ks_stop_destroy(m);
        return KS_FAIL(KS_ERR_NOMEM, "stop matcher of %zu strings", n_stops);
    }
    m->which = -1;
    *out = m;
    return KS_OK;
}

void ks_stop_destroy(ks_stop_matcher *m) {
    if (!m) return;
    for (size_t i = 0; i < m->n_stops; i++) ks_free(m->stops[i]);
    ks_free(m->stops);
    ks_free(m->lens);
    ks_free(m->buf);
    ks_free(m);
}

void ks_stop_reset(ks_stop_matcher *m) {
    KS_ASSERT(m != NULL);
    m->n = 0;
    m->n_released = 0;
    m->matched = false;
    m->which = -1;
}

size_t ks_utf8_incomplete_tail(const char *text, size_t len) {
    const unsigned char *t = (const unsigned char *)text;
    /* Walk back over at most 3 continuation bytes to the lead byte. */
    size_t k = 0;
    while (k < len && k < 3 && (t[len - 1 - k] & 0xC0) == 0x80) k++;
    if (k == len) return 0; /* only continuation bytes: invalid, do not hold */
    unsigned char lead = t[len - 1 - k];
    size_t need;
    if (lead < 0x80) need = 1;
    else if ((lead & 0xE0) == 0xC0) need = 2;
    else if ((lead & 0xF0) == 0xE0) need = 3;
    else if ((lead & 0xF8) == 0xF0) need = 4;
    else return 0; /* stray continuation run or invalid lead: nothing to wait for */
    size_t have = k + 1;
    return have < need ? have : 0;
}

size_t ks_stop_partial_len(const char *const *stops, size_t n_stops, const char *text, size_t len) {
    size_t best = 0;
    for (size_t s = 0; s < n_stops; s++) {
        size_t sl = strlen(stops[s]);
        size_t maxk = sl - 1 < len ? sl - 1 : len;
        for (size_t k = maxk; k > best; k--)
            if (memcmp(text + len - k, stops[s], k) == 0) {
                best = k;
                break;
            }
    }
    return best;
}

static bool pending_append(ks_stop_matcher *m, const char *p, size_t len) {
    if (m->n + len > m->cap) {
        size_t cap = m->cap;
        while (cap < m->n + len) cap *= 2;
        char *buf = ks_realloc(m->buf, cap);
        if (!buf) return false;
        m->buf = buf;
        m->cap = cap;
    }
    memcpy(m->buf + m->n, p, len);
    m->n += len;
    return true;
}

/* Drop what the previous call handed out. */
static void pending_drop_released(ks_stop_matcher *m) {
    if (m->n_released == 0) return;
    memmove(m->buf, m->buf + m->n_released, m->n - m->n_released);
    m->n -= m->n_released;
    m->n_released = 0;
}

static void out_set(ks_stop_out *o, const char *text, size_t len, bool matched, int32_t which,
                    size_t held) {
    o->text = text;
    o->len = len;
    o->matched = matched;
    o->which = which;
    o->n_held = held;
}

ks_status ks_stop_feed(ks_stop_matcher *m, const char *piece, size_t len, ks_stop_out *out) {
    if (!m || !out || (len > 0 && !piece))
        return KS_FAIL(KS_ERR_INVALID_ARG, "stop: NULL matcher, out or piece");
    pending_drop_released(m);
    if (m->matched) {
        out_set(out, m->buf, 0, true, m->which, 0);
        return KS_OK;
    }
    /* A match must end inside the new bytes (the old pending had none), so
     * search only start positions from which a stop could reach them. */
    size_t old_n = m->n;
    if (!pending_append(m, piece, len)) return KS_FAIL(KS_ERR_NOMEM, "stop: %zu pending bytes", m->n + len);
    size_t best_pos = SIZE_MAX;
    int32_t best = -1;
    for (size_t s = 0; s < m->n_stops; s++) {
        size_t sl = m->lens[s];
        if (sl > m->n) continue;
        size_t from = old_n + 1 > sl ? old_n + 1 - sl : 0;
        for (size_t pos = from; pos + sl <= m->n && pos < best_pos; pos++)
            if (memcmp(m->buf + pos, m->stops[s], sl) == 0) {
                best_pos = pos;
                best = (int32_t)s;
                break;
            }
    }
    if (best >= 0) {
        m->matched = true;
        m->which = best;
        m->n = best_pos; /* the stop string and anything after it are swallowed */
        m->n_released = best_pos;
        out_set(out, m->buf, best_pos, true, best, 0);
        return KS_OK;
    }
    size_t hold = ks_stop_partial_len((const char *const *)m->stops, m->n_stops, m->buf, m->n);
    size_t u = ks_utf8_incomplete_tail(m->buf, m->n);
    if (u > hold) hold = u;
    m->n_released = m->n - hold;
    out_set(out, m->buf, m->n_released, false, -1, hold);
    return KS_OK;
}

void ks_stop_flush(ks_stop_matcher *m, ks_stop_out *out) {
    KS_ASSERT(m != NULL && out != NULL);
    pending_drop_released(m);
    if (m->matched) {
        out_set(out, m->buf, 0, true, m->which, 0);
        return;
    }
    m->n_released = m->n;
    out_set(out, m->buf, m->n, false, -1, 0);
}
