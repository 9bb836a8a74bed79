/*
 * tokenizer_spm.c — SentencePiece-style BPE ("llama" vocabularies).
 *
 * SentencePiece BPE has no merge list: any two adjacent pieces may merge if
 * their concatenation is a vocabulary entry, and the entry with the highest
 * score wins (leftmost on ties).  Spaces are first rewritten to U+2581 and,
 * when the vocabulary asks for it (add_space_prefix, the default), a space is
 * put in front of the text so that the first word looks like every other
 * word.  Characters the vocabulary lacks fall back to <0xNN> byte tokens.
 *
 * The naive version rescans all pairs after every merge (quadratic); here
 * every candidate pair sits in a priority queue and a merge only queues the
 * two new pairs it creates, so a 32K-token prompt costs O(n log n).  Queue
 * entries remember the byte size of the pair they were made for; a pair
 * whose symbols have since grown or vanished no longer matches and is
 * skipped on pop.
 *
 * One deliberate difference from the reference: a malformed UTF-8 lead byte
 * forms a one-byte symbol instead of swallowing the bytes after it, so that
 * invalid input still decodes back to exactly what was encoded.  Valid
 * UTF-8 — everything the reference ids were produced from — is unaffected.
 */
#include "tokenizer/tokenizer_internal.h"

#include <string.h>

typedef struct ks_tok_spm_state {
    const ks_tokenizer *t;
    const char *text;
    ks_tok_sym *sym; /* [n_sym] */
    ks_tok_heap heap;
} ks_tok_spm_state;

static void ks_tok_spm_try_pair(ks_tok_spm_state *st, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const ks_tok_sym *a = &st->sym[l], *b = &st->sym[r];
    /* adjacent symbols are contiguous in the text */
    int32_t id = ks_tok_vocab_find(st->t, st->text + a->off, a->n + b->n);
    if (id < 0) return;
    ks_tok_heap_push(&st->heap, (ks_tok_pair){st->t->scores[id], l, r, a->n + b->n});
}

static void ks_tok_spm_emit(const ks_tokenizer *t, const char *p, size_t n, ks_tok_ids *out) {
    int32_t id = ks_tok_vocab_find(t, p, n);
    if (id >= 0) {
        ks_tok_ids_push(out, id);
        return;
    }
    for (size_t i = 0; i < n; i++) { /* byte fallback */
        unsigned char b = (unsigned char)p[i];
        id = t->byte_ids[b];
        if (id < 0) id = ks_tok_vocab_find(t, p + i, 1);
        if (id < 0) id = t->unk;
        if (id >= 0) ks_tok_ids_push(out, id);
    }
}

void ks_tok_spm_encode(const ks_tokenizer *t, const char *text, size_t len, bool space_prefix,
                       ks_tok_ids *out) {
    if (len == 0) return;
    /* escape: optional leading space, every ' ' -> U+2581 (3 bytes) */
    size_t n_sp = space_prefix ? 1 : 0;
    for (size_t i = 0; i < len; i++) n_sp += text[i] == ' ';
    size_t n = len + (space_prefix ? 1 : 0) + 2 * n_sp;
    char *buf = ks_malloc(n);
    if (!buf) {
        out->refused = true;
        return;
    }
    size_t o = 0;
    static const char k_ws[3] = {(char)0xE2, (char)0x96, (char)0x81};
    if (space_prefix) {
        memcpy(buf, k_ws, 3);
        o = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(buf + o, k_ws, 3);
            o += 3;
        } else {
            buf[o++] = text[i];
        }
    }
    KS_ASSERT(o == n);

    ks_tok_spm_state st = {.t = t, .text = buf};
    st.sym = ks_malloc(n * sizeof(ks_tok_sym));
    if (!st.sym) {
        ks_free(buf);
        out->refused = true;
        return;
    }
    int32_t ns = 0;
    for (size_t off = 0; off < n; ns++) {
        size_t k = ks_tok_utf8_char_len(buf + off, n - off);
        st.sym[ns] = (ks_tok_sym){ns - 1, ns + 1, (uint32_t)off, (uint32_t)k};
        off += k;
    }
    st.sym[ns - 1].next = -1;
    for (int32_t i = 0; i + 1 < ns; i++) ks_tok_spm_try_pair(&st, i, i + 1);
    while (st.heap.n > 0) {
        ks_tok_pair p = ks_tok_heap_pop(&st.heap);
        ks_tok_sym *a = &st.sym[p.left], *b = &st.sym[p.right];
        if (a->n == 0 || b->n == 0 || a->next != p.right || a->n + b->n != p.size) continue;
        a->n += b->n;
        b->n = 0;
        a->next = b->next;
        if (a->next >= 0) st.sym[a->next].prev = p.left;
        ks_tok_spm_try_pair(&st, a->prev, p.left);
        ks_tok_spm_try_pair(&st, p.left, st.sym[p.left].next);
    }
    for (int32_t i = 0; i != -1; i = st.sym[i].next)
        ks_tok_spm_emit(t, buf + st.sym[i].off, st.sym[i].n, out);
    if (st.heap.refused) out->refused = true;
    ks_free(st.heap.v);
    ks_free(st.sym);
    ks_free(buf);
}
