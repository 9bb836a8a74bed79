/*
 * prefix_table.c — the prefix cache's table of blocks in RAM: lookup by key,
 * listing under the RAM cap with LRU eviction, references, and the pinned
 * blocks' pages let go.  Both the cache's life cycle (prefix_cache.c) and
 * its directory tier (prefix_files.c) work on the table, so it sits below
 * both of them rather than inside either: the two then depend on it and
 * not on each other.  Every function named *_locked is called with the
 * cache's mutex held.
 */
#include "prefix/prefix_cache.h"

static pc_block **bucket_of(ks_prefix_cache *pc, const ks_pc_key *k) { return &pc->buckets[k->a % N_BUCKETS]; }

pc_block *ks_pc_find_locked(ks_prefix_cache *pc, const ks_pc_key *k) {
    for (pc_block *b = *bucket_of(pc, k); b; b = b->hnext)
        if (ks_pc_key_eq(&b->key, k)) return b;
    return NULL;
}

void ks_pc_block_free(pc_block *b) {
    for (pc_state *s = b->st, *nx; s; s = nx) {
        nx = s->next;
        ks_free(s->data);
        ks_free(s);
    }
    ks_free(b->tok);
    if (b->raw) ks_free(b->raw);
    else ks_free(b->kv);
    ks_free(b->pins);
    ks_free(b);
}

void ks_pc_unref_locked(pc_block *b) {
    if (--b->refs > 0) return;
    if (b->pins) b->dead = true; /* its pages go at the next reap, on the thread driving their store */
    else ks_pc_block_free(b);
}

/* Let go of the pages of dead pinned blocks (caller holds mu and drives pc->pin_kv's context). */
void ks_pc_reap_locked(ks_prefix_cache *pc) {
    for (pc_block **pp = &pc->pinned; *pp;) {
        pc_block *b = *pp;
        if (!b->dead) {
            pp = &b->pnext;
            continue;
        }
        for (uint32_t l = 0; l < b->fmt.n_layer; l++)
            for (uint32_t h = 0; h < b->fmt.n_head_kv; h++) ks_kv_unpin(pc->pin_kv, (int32_t)l, b->pins[l * b->fmt.n_head_kv + h]);
        *pp = b->pnext;
        ks_pc_block_free(b);
    }
}

/* The pin store goes (ks_kv_destroy's hook): live pinned blocks become
 * blocks of bytes, dead ones go. */
void ks_pc_pins_released(void *arg, ks_kv_store *kv) {
    ks_prefix_cache *pc = arg;
    pthread_mutex_lock(&pc->mu);
    size_t page_bytes = ks_kv_page_bytes(kv);
    while (pc->pinned) {
        pc_block *b = pc->pinned;
        pc->pinned = b->pnext;
        b->pnext = NULL;
        if (b->dead) {
            ks_pc_block_free(b);
            continue;
        }
        uint8_t *bytes = ks_malloc(b->kv_bytes);
        ks_status st = bytes ? KS_OK : KS_FAIL(KS_ERR_NOMEM, "a block's bytes (%zu)", b->kv_bytes);
        for (uint32_t i = 0; bytes && i < b->fmt.n_layer * b->fmt.n_head_kv && st == KS_OK; i++)
            st = ks_kv_read_pinned(kv, (int32_t)(i / b->fmt.n_head_kv), b->pins[i], bytes + (size_t)i * page_bytes);
        ks_free(b->pins);
        b->pins = NULL;
        if (st != KS_OK) { /* unreadable (slow tier I/O): the block goes */
            KS_LOG(WARN, "prefix cache: a block's pages could not be read back: %s", ks_last_error());
            ks_free(bytes);
            if (b->listed) ks_pc_unlist_locked(pc, b);
            continue;
        }
        b->kv = bytes;
    }
    pc->pin_kv = NULL;
    pthread_mutex_unlock(&pc->mu);
}

void ks_pc_unlist_locked(ks_prefix_cache *pc, pc_block *b) {
    pc_block **pp = bucket_of(pc, &b->key);
    while (*pp != b) pp = &(*pp)->hnext;
    *pp = b->hnext;
    b->listed = false;
    pc->st.ram_bytes -= b->bytes;
    pc->st.ram_blocks--;
    ks_pc_unref_locked(b);
}

/* Evict LRU blocks until `need` more bytes fit under cap. */
void ks_pc_make_room_locked(ks_prefix_cache *pc, uint64_t cap, uint64_t need) {
    while (pc->st.ram_blocks > 0 && pc->st.ram_bytes + need > cap) {
        pc_block *old = NULL;
        for (int i = 0; i < N_BUCKETS; i++)
            for (pc_block *b = pc->buckets[i]; b; b = b->hnext)
                if (!old || b->stamp < old->stamp) old = b;
        ks_pc_unlist_locked(pc, old); /* a queued block stays alive for the writer (its ref) */
        pc->st.evictions++;
    }
}

/* List a new block (refs: the table's); false when it cannot fit the cap. */
bool ks_pc_insert_locked(ks_prefix_cache *pc, pc_block *b) {
    if (b->bytes > pc->limit) return false;
    ks_pc_make_room_locked(pc, pc->limit, b->bytes);
    b->stamp = ++pc->clock;
    b->refs = 1;
    b->listed = true;
    b->hnext = *bucket_of(pc, &b->key);
    *bucket_of(pc, &b->key) = b;
    pc->st.ram_bytes += b->bytes;
    pc->st.ram_blocks++;
    return true;
}

pc_state *ks_pc_state_of(pc_block *b, uint64_t pol) {
    for (pc_state *s = b->st; s; s = s->next)
        if (s->pol == pol) return s;
    return NULL;
}
