/*
 * tokenizer_tables.c — the data structures both merge algorithms stand on:
 * FNV-1a hashing, string sets (one blob of strings plus an open-addressing
 * table of ids, see tokenizer_internal.h for why), the vocabulary and merge
 * lookups over them, UTF-8 validation, and the priority queue of candidate
 * merges.
 *
 * Lookups hash incrementally, so the BPE merge table can be probed with
 * "left right" without building the joined string; the queue breaks ties
 * toward the leftmost pair, the order the reference tokenizers merge in.
 */
#include "tokenizer/tokenizer_internal.h"

#include <string.h>

/* ------------------------------------------------------------- helpers -- */

void ks_tok_ids_push(ks_tok_ids *ids, int32_t id) {
    if (ids->refused) return;
    if (ids->n == ids->cap) {
        size_t cap = ids->cap ? ids->cap * 2 : 256;
        int32_t *v = ks_realloc(ids->v, cap * sizeof(int32_t));
        if (!v) {
            ids->refused = true;
            return;
        }
        ids->v = v;
        ids->cap = cap;
    }
    ids->v[ids->n++] = id;
}

uint32_t ks_tok_hash_init(void) { return 2166136261u; }
uint32_t ks_tok_hash_bytes(uint32_t h, const void *p, size_t n) {
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 16777619u;
    return h;
}
static uint32_t ks_tok_hash_finish(uint32_t h) {
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    return h;
}

bool ks_tok_utf8_valid(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        size_t k;
        uint32_t cp;
        if (c < 0x80) { i++; continue; }
        else if ((c & 0xE0) == 0xC0) { k = 2; cp = c & 0x1F; }
        else if ((c & 0xF0) == 0xE0) { k = 3; cp = c & 0x0F; }
        else if ((c & 0xF8) == 0xF0) { k = 4; cp = c & 0x07; }
        else return false;
        if (k > n - i) return false;
        for (size_t j = 1; j < k; j++) {
            if ((s[i + j] & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (s[i + j] & 0x3F);
        }
        static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min_cp[k] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        i += k;
    }
    return true;
}

/* ------------------------------------------------------------ strsets -- */

/* Copy n strings (from a GGUF string array) into s and index them.  On a
 * duplicate string the last index wins when last_wins, else the first.
 * Empty strings are stored but not indexed (they can never match). */
ks_status ks_tok_strset_build(ks_tok_strset *s, const ks_gguf_str *strs, int32_t n,
                                bool last_wins) {
    size_t total = 0;
    for (int32_t i = 0; i < n; i++) total += strs[i].len;
    KS_ASSERT(total < UINT32_MAX);
    s->n = n;
    s->blob = ks_malloc(total ? total : 1);
    s->off = ks_malloc(((size_t)n + 1) * sizeof(uint32_t));
    s->hashes = ks_malloc((n ? (size_t)n : 1) * sizeof(uint32_t));
    uint32_t cap = 16;
    while (cap < 2u * (uint32_t)n) cap <<= 1;
    s->mask = cap - 1;
    s->slots = ks_malloc((size_t)cap * sizeof(int32_t));
    if (!s->blob || !s->off || !s->hashes || !s->slots) /* the owner frees with ks_tok_strset_free */
        return KS_FAIL(KS_ERR_NOMEM, "tokenizer: table of %d strings", n);
    for (uint32_t i = 0; i < cap; i++) s->slots[i] = -1;
    size_t o = 0;
    for (int32_t i = 0; i < n; i++) {
        s->off[i] = (uint32_t)o;
        if (strs[i].len) memcpy(s->blob + o, strs[i].data, strs[i].len);
        o += strs[i].len;
    }
    s->off[n] = (uint32_t)o;
    for (int32_t i = 0; i < n; i++) {
        const char *p = s->blob + s->off[i];
        size_t len = s->off[i + 1] - s->off[i];
        uint32_t h = ks_tok_hash_finish(ks_tok_hash_bytes(ks_tok_hash_init(), p, len));
        s->hashes[i] = h;
        if (len == 0) continue;
        for (uint32_t j = h & s->mask;; j = (j + 1) & s->mask) {
            int32_t e = s->slots[j];
            if (e < 0) {
                s->slots[j] = i;
                break;
            }
            if (s->hashes[e] == h && s->off[e + 1] - s->off[e] == len &&
                memcmp(s->blob + s->off[e], p, len) == 0) {
                if (last_wins) s->slots[j] = i;
                break;
            }
        }
    }
    return KS_OK;
}

void ks_tok_strset_free(ks_tok_strset *s) {
    ks_free(s->blob);
    ks_free(s->off);
    ks_free(s->slots);
    ks_free(s->hashes);
    memset(s, 0, sizeof *s);
}

static int32_t ks_tok_strset_find_h(const ks_tok_strset *s, uint32_t h, const char *p, size_t n) {
    if (!s->slots) return -1;
    for (uint32_t j = h & s->mask;; j = (j + 1) & s->mask) {
        int32_t e = s->slots[j];
        if (e < 0) return -1;
        if (s->hashes[e] == h && s->off[e + 1] - s->off[e] == n &&
            memcmp(s->blob + s->off[e], p, n) == 0)
            return e;
    }
}

/* Make the table resolve string i's text to i (used to settle duplicates). */
void ks_tok_strset_point(ks_tok_strset *s, int32_t i) {
    const char *p = s->blob + s->off[i];
    size_t n = s->off[i + 1] - s->off[i];
    if (n == 0) return;
    for (uint32_t j = s->hashes[i] & s->mask;; j = (j + 1) & s->mask) {
        int32_t e = s->slots[j];
        KS_ASSERT(e >= 0);
        if (s->hashes[e] == s->hashes[i] && s->off[e + 1] - s->off[e] == n &&
            memcmp(s->blob + s->off[e], p, n) == 0) {
            s->slots[j] = i;
            return;
        }
    }
}

int32_t ks_tok_strset_find(const ks_tok_strset *s, const char *p, size_t n) {
    return ks_tok_strset_find_h(s, ks_tok_hash_finish(ks_tok_hash_bytes(ks_tok_hash_init(), p, n)), p, n);
}

int32_t ks_tok_vocab_find(const ks_tokenizer *t, const char *p, size_t n) {
    return ks_tok_strset_find(&t->vocab, p, n);
}

int32_t ks_tok_merge_rank(const ks_tokenizer *t, const char *l, size_t nl, const char *r, size_t nr) {
    const ks_tok_strset *s = &t->merges;
    if (!s->slots) return -1;
    uint32_t h = ks_tok_hash_bytes(ks_tok_hash_init(), l, nl);
    h = ks_tok_hash_bytes(h, " ", 1);
    h = ks_tok_hash_finish(ks_tok_hash_bytes(h, r, nr));
    size_t n = nl + 1 + nr;
    for (uint32_t j = h & s->mask;; j = (j + 1) & s->mask) {
        int32_t e = s->slots[j];
        if (e < 0) return -1;
        const char *m = s->blob + s->off[e];
        if (s->hashes[e] == h && s->off[e + 1] - s->off[e] == n && t->merge_split[e] == nl &&
            memcmp(m, l, nl) == 0 && memcmp(m + nl + 1, r, nr) == 0)
            return e;
    }
}

/* --------------------------------------------------------------- heap -- */

static bool ks_tok_pair_before(const ks_tok_pair *a, const ks_tok_pair *b) {
    return a->prio > b->prio || (a->prio == b->prio && a->left < b->left);
}

void ks_tok_heap_push(ks_tok_heap *h, ks_tok_pair p) {
    if (h->refused) return;
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        ks_tok_pair *v = ks_realloc(h->v, cap * sizeof(ks_tok_pair));
        if (!v) {
            h->refused = true;
            return;
        }
        h->v = v;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!ks_tok_pair_before(&p, &h->v[parent])) break;
        h->v[i] = h->v[parent];
        i = parent;
    }
    h->v[i] = p;
}

ks_tok_pair ks_tok_heap_pop(ks_tok_heap *h) {
    KS_ASSERT(h->n > 0);
    ks_tok_pair top = h->v[0];
    ks_tok_pair last = h->v[--h->n];
    size_t i = 0, n = h->n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && ks_tok_pair_before(&h->v[c + 1], &h->v[c])) c++;
        if (!ks_tok_pair_before(&h->v[c], &last)) break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (n > 0) h->v[i] = last;
    return top;
}
