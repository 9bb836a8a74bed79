/*
 * prefix_context.c — the prefix cache seen from an inference context:
 * restore a prompt's cached prefix into an empty sequence, capture a
 * prefill's blocks (and the policy's state of them), and save a prompt's
 * blocks to one file.
 *
 * Why apart from the cache: this is the only part that knows the context
 * (its store, its policy, its plan and pool); the cache's tiers
 * (prefix_cache.c, prefix_files.c) hold blocks and never run a model.
 *
 * Sparse prefills.  A sparse prefill's KV (infer/prefill_sparse.c) is
 * cached too, under a root with its canonical setting hashed in (root_of),
 * so only prefills of that setting read it and dense keys are unchanged.
 * It is exact because its rows' KV is a function of the tokens up to their
 * block's end: the blocks of KS_PREFILL_BLOCK rows, which share one
 * selection, sit on one grid of entries (attend.c) and every chunk but a
 * call's last ends on it (step.c), so with pages a whole number of blocks a
 * page's KV depends on the tokens up to its end, as its key says; a hit
 * ends on a block's end so that the rest starts a new block.  A call that
 * starts off the grid splits a block: the sequence caches nothing more.
 *
 * Exactness.  A hit appends the cached rows to an empty sequence byte for
 * byte through the store (ks_kv_append_page_stored), which recomputes the
 * page summaries from the stored rows as row appends would: everything
 * Quest, FreeKV and CHESS read comes out identical.  The rest of the prompt
 * is prefilled by ks_prefill_rest from the end of the hit, which may fall
 * on any page because a prefill row's result does not depend on the chunk
 * it is computed in (tests/test_prefix.c, test_chunk_invariance), with the
 * prefill hooks seeing the whole prompt, and
 * the restore leaves the policy's observation rows (and always the last row,
 * whose logits are the answer) to compute: SnapKV's window, H2O's scoring
 * rows, FreeKV's last query, DapQ's pseudo tokens all see what one prefill
 * gives them.  The cached KV is the pre-eviction KV (taken after the forward
 * and before the hooks), so an evictor cuts per request.  A policy whose
 * state needs what the cache does not keep (LRQK fits on every prompt row's
 * queries) is declared not shareable in the registry and restores nothing.
 * Per-token state a policy keeps outside the store (spec's retrieval keys)
 * travels with the blocks through the policy's prefix_state hooks, keyed by
 * the policy's configuration (in RAM with the block, and in a file of its
 * own beside the block's).  Pinned blocks are mapped into the sequence
 * rather than copied (prefix_cache.c, "Shared pages").
 */
#define _GNU_SOURCE
#include "infer/internal.h"
#include "prefix/prefix_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static ks_pc_format format_of(const ks_context *c) {
    const ks_hparams *hp = &c->model->hp;
    return (ks_pc_format){(uint32_t)c->kv_type, (uint32_t)ks_kv_page_size(c->kv), (uint32_t)hp->n_layer,
                          (uint32_t)hp->n_head_kv, (uint32_t)hp->head_dim};
}

/* The chain's root: the model and the KV layout, and the RoPE this context
 * resolved (a LongRoPE model rotates by its short or long factors
 * depending on n_ctx, so two contexts of one model can store different K
 * for the same tokens; an unscaled model adds the same bytes to every root). */
static ks_pc_key root_of(const ks_prefix_cache *pc, const ks_context *c, const ks_prefill_sparse *sp,
                         const ks_pc_format *fmt) {
    ks_pc_key model = ks_pc_model_key(pc);
    ks_pc_hash_feed(&model, c->rope_inv_freq, sizeof(double) * (size_t)(c->model->hp.n_rot / 2));
    ks_pc_hash_feed(&model, &c->rope_mscale, sizeof c->rope_mscale);
    if (sp->on) { /* a sparse prefill's KV: its canonical spec joins the root (a dense root hashes nothing more) */
        char spec[128];
        ks_prefill_sparse_canonical(sp, spec, sizeof spec);
        ks_pc_hash_feed(&model, "prefill_policy", 14);
        ks_pc_hash_feed(&model, spec, strlen(spec) + 1);
    }
    return ks_pc_root(&model, fmt);
}

ks_pc_key ks_pc_context_root(const ks_prefix_cache *pc, const ks_context *c, const ks_pc_format *fmt) {
    return root_of(pc, c, &c->prefill_sparse, fmt);
}

/* The root of sequence seq's chains: its prefill policy's. */
static ks_pc_key seq_root(const ks_prefix_cache *pc, const ks_context *c, int32_t seq, const ks_pc_format *fmt) {
    return root_of(pc, c, &c->seq_prefill[seq], fmt);
}

/* Whether seq's prefills give KV the cache may key: always for dense; for a
 * sparse prefill when its blocks of KS_PREFILL_BLOCK rows (whose rows share
 * one selection, so a row's KV depends on the tokens up to its block's end)
 * never straddle a page, so that a page's KV is a function of the tokens up
 * to the page's end, as its key says (attend.c puts the blocks on one grid). */
static bool seq_cacheable(const ks_context *c, int32_t seq, int32_t P) {
    return !c->seq_prefill[seq].on || (P % KS_PREFILL_BLOCK == 0 && !c->seq_offgrid[seq]);
}

static uint64_t policy_key(const ks_context *c, int32_t seq) {
    const ks_infer_pol *e = ks_infer_pol_of(c, seq);
    ks_pc_key h = ks_pc_hash_seed(0x706F6CULL);
    ks_pc_hash_feed(&h, e->spec.name, strlen(e->spec.name));
    if (e->spec.args[0]) ks_pc_hash_feed(&h, e->spec.args, strlen(e->spec.args) + 1);
    uint64_t k = h.a ^ h.b;
    return k ? k : 1; /* 0 names the block's own file */
}

/* The rows of a hit into the store, whole layers per worker (appends to one
 * layer are serial, to different layers independent). */
typedef struct {
    ks_context *c;
    pc_block *const *blocks;
    int32_t seq, hit;
    _Atomic int failed;
} restore_job;

static void restore_worker(void *arg, int ith, int nth) {
    restore_job *j = arg;
    ks_context *c = j->c;
    const ks_hparams *hp = &c->model->hp;
    int32_t P = ks_kv_page_size(c->kv);
    size_t page_bytes = ks_kv_page_bytes(c->kv);
    uint8_t *scratch = NULL; /* a pinned page copied rather than mapped */
    for (int32_t l = ith; l < hp->n_layer; l += nth) {
        bool fast = ks_kv_layer_tier(c->kv, l) == KS_TIER_FAST;
        for (int32_t b = 0; b * P < j->hit; b++) {
            int32_t m = j->hit - b * P < P ? j->hit - b * P : P;
            const pc_block *blk = j->blocks[b];
            for (int32_t h = 0; h < hp->n_head_kv; h++) {
                size_t i = (size_t)l * hp->n_head_kv + h;
                ks_status st = KS_OK;
                if (blk->pins && m == P && fast) { /* a whole block: its pages, by reference */
                    st = ks_kv_map_pinned(c->kv, j->seq, l, h, blk->pins[i]);
                } else if (blk->pins) { /* the part of a block past the hit, or a slow layer: a copy of its own */
                    if (!scratch && !(scratch = ks_malloc(page_bytes))) st = KS_FAIL(KS_ERR_NOMEM, "a page's bytes");
                    if (st == KS_OK) st = ks_kv_read_pinned(c->kv, l, blk->pins[i], scratch);
                    if (st == KS_OK) st = ks_kv_append_page_stored(c->kv, j->seq, l, h, b * P, scratch, m);
                } else {
                    st = ks_kv_append_page_stored(c->kv, j->seq, l, h, b * P, blk->kv + i * page_bytes, m);
                }
                if (st != KS_OK) {
                    atomic_store(&j->failed, (int)st); /* the message stays on the worker's thread */
                    ks_free(scratch);
                    return;
                }
            }
        }
    }
    ks_free(scratch);
}

ks_status ks_prefix_restore(ks_context *c, ks_prefix_cache *pc, int32_t seq, const int32_t *prompt, int32_t n,
                            int32_t *n_restored) {
    if (!c || !prompt || !n_restored) return KS_FAIL(KS_ERR_INVALID_ARG, "NULL argument");
    if (seq < 0 || seq >= c->n_seq) return KS_FAIL(KS_ERR_INVALID_ARG, "sequence %d out of range [0, %d)", seq, c->n_seq);
    if (c->seq_len[seq] != 0 || ks_kv_seq_parked(c->kv, seq))
        return KS_FAIL(KS_ERR_INVALID_ARG, "sequence %d is not empty: a prefix restores into an empty one", seq);
    *n_restored = 0;
    if (!pc || n <= 0) return KS_OK;
    ks_policy *pol = ks_infer_policy_of(c, seq);
    ks_pc_format fmt = format_of(c);
    int32_t P = (int32_t)fmt.page;
    if (!seq_cacheable(c, seq, P)) return KS_OK;
    bool sparse = c->seq_prefill[seq].on;
    int32_t limit = ks_policy_prefix_shareable(pol) ? n - ks_policy_prefix_min_suffix(pol) : 0;
    size_t sbytes = ks_policy_prefix_state_bytes(pol, P);
    if (sbytes) limit = limit / P * P; /* per-token state is kept per whole block */
    /* The rest is prefilled in n_batch chunks from the hit on, not on the
     * uncached run's grid: exact because a prefill row's result does not
     * depend on the chunk it is computed in (every kernel is row-local, and
     * one-row chunks take the block kernel too: attend.c); test_prefix's
     * split test holds the engine to it. */
    if (limit < 0) limit = 0;
    if (limit > c->n_ctx) limit = c->n_ctx;
    int32_t nb_max = limit > 0 ? (limit + P - 1) / P : 0;
    if (nb_max > n / P) nb_max = n / P;
    uint64_t pk = policy_key(c, seq);
    pthread_mutex_lock(&pc->mu);
    if (pc->pin_kv == c->kv) ks_pc_reap_locked(pc);
    pthread_mutex_unlock(&pc->mu);
    pc_block **got = ks_malloc(sizeof(pc_block *) * (size_t)(nb_max + 1));
    if (!got) return KS_FAIL(KS_ERR_NOMEM, "cached blocks of %d", nb_max);
    int32_t nb = 0;
    ks_pc_key parent = seq_root(pc, c, seq, &fmt);
    for (int32_t b = 0; b < nb_max; b++) {
        ks_pc_key key = ks_pc_chain(&parent, prompt + (size_t)b * P, P);
        pc_block *blk = ks_pc_acquire(pc, c->kv, &key, &parent, prompt + (size_t)b * P, &fmt);
        if (!blk) break;
        if (memcmp(blk->tok, prompt + (size_t)b * P, sizeof(int32_t) * P) || (sbytes && !ks_pc_state_get(pc, blk, pk, sbytes))) {
            ks_pc_release(pc, blk);
            break;
        }
        got[nb++] = blk;
        parent = key;
    }
    /* Past the last whole block: a cached block under the same parent whose
     * first tokens match the prompt's next ones gives those rows too (a
     * row's KV depends on the tokens up to it alone), so a follow-up that
     * shares a document recomputes its question, not the document's last
     * partial page.  RAM only (files are found by their whole key); not for
     * policies whose state is kept per whole block; and only behind a whole
     * block (every prompt shares its first token, BOS, with every other). */
    int32_t tail = 0;
    if (!sbytes && nb > 0 && nb * P < limit) {
        int32_t want = limit - nb * P < P ? limit - nb * P : P;
        pc_block *best = NULL;
        pthread_mutex_lock(&pc->mu);
        for (int i = 0; i < N_BUCKETS; i++)
            for (pc_block *b = pc->buckets[i]; b; b = b->hnext) {
                if (!ks_pc_key_eq(&b->parent, &parent) || memcmp(&b->fmt, &fmt, sizeof fmt)) continue;
                if (b->pins && pc->pin_kv != c->kv) continue;
                int32_t k = 0;
                while (k < want && b->tok[k] == prompt[(size_t)nb * P + k]) k++;
                if (k > tail) {
                    tail = k;
                    best = b;
                }
            }
        if (best) {
            best->refs++;
            best->stamp = ++pc->clock;
            got[nb] = best;
        }
        pthread_mutex_unlock(&pc->mu);
    }
    int32_t hit = nb * P + tail < limit ? nb * P + tail : limit;
    /* a sparse prefill's rows depend on the rest of their block: the hit ends on a block's
     * end, so every restored row's block is restored whole and the rest starts a new one */
    if (sparse) hit = hit / KS_PREFILL_BLOCK * KS_PREFILL_BLOCK;
    ks_status st = KS_OK;
    /* whole blocks mapped from pinned pages add no memory (the cache or
     * another sequence holds them, and the plan counts them once) */
    int32_t mapped = 0;
    for (int32_t b = 0; b < nb && (b + 1) * P <= hit; b++) mapped += got[b]->pins ? P : 0;
    if (hit > 0) st = ks_infer_plan_apply(c, hit - mapped, 1, hit);
    if (st == KS_OK && hit > 0) {
        restore_job j = {.c = c, .blocks = got, .seq = seq, .hit = hit};
        atomic_init(&j.failed, 0);
        ks_pool_run(c->pool, restore_worker, &j);
        int f = atomic_load(&j.failed);
        if (f) st = KS_FAIL((ks_status)f, "restoring %d cached prompt tokens: %s (KV pool or slow tier)", hit,
                            ks_status_str((ks_status)f));
    }
    for (int32_t b = 0; b < nb && st == KS_OK && sbytes && b * P < hit; b++)
        st = ks_policy_prefix_state_load(pol, seq, b * P, P, ks_pc_state_of(got[b], pk)->data); /* attached: stays */
    for (int32_t b = 0; b < nb + (tail > 0); b++) ks_pc_release(pc, got[b]);
    ks_free(got);
    if (st != KS_OK) {
        ks_seq_reset(c, seq);
        return st;
    }
    c->seq_len[seq] = hit;
    /* local layers hold every restored row: the rest of the prompt reads their
     * window, and later captures read whole blocks of every layer (ks_infer_swa_trim) */
    c->swa_hold[seq] = 1;
    pthread_mutex_lock(&pc->mu);
    pc->st.hit_tokens += (uint64_t)hit;
    pc->st.miss_tokens += (uint64_t)(n - hit);
    pthread_mutex_unlock(&pc->mu);
    *n_restored = hit;
    return KS_OK;
}

/* Pin the pages of block b of seq (every layer and KV head) for blk; false
 * (nothing pinned) when the store refuses one (headroom, slow tier). */
static bool pin_block(ks_context *c, int32_t seq, int32_t b, pc_block *blk) {
    const ks_hparams *hp = &c->model->hp;
    int32_t n = hp->n_layer * hp->n_head_kv;
    int32_t *ids = ks_malloc(sizeof(int32_t) * (size_t)n);
    if (!ids) return false; /* kept as bytes instead */
    for (int32_t i = 0; i < n; i++) {
        if (ks_kv_pin(c->kv, seq, i / hp->n_head_kv, i % hp->n_head_kv, b, &ids[i]) != KS_OK) {
            while (i-- > 0) ks_kv_unpin(c->kv, i / hp->n_head_kv, ids[i]);
            ks_free(ids);
            return false;
        }
    }
    blk->pins = ids;
    return true;
}

ks_status ks_prefix_capture_kv(ks_context *c, ks_prefix_cache *pc, int32_t seq, const int32_t *prompt, int32_t n) {
    ks_pc_format fmt = format_of(c);
    int32_t P = (int32_t)fmt.page, nb = n / P;
    if (c->seq_len[seq] != n || nb == 0 || !seq_cacheable(c, seq, P)) return KS_OK;
    const ks_hparams *hp = &c->model->hp;
    size_t page_bytes = ks_kv_page_bytes(c->kv);
    ks_pc_key parent = seq_root(pc, c, seq, &fmt);
    pthread_mutex_lock(&pc->mu);
    bool pin = pc->p.share_pages && (!pc->pin_kv || pc->pin_kv == c->kv);
    if (pin && !pc->pin_kv) { /* this context's store holds the cache's pages from now on */
        pc->pin_kv = c->kv;
        ks_kv_set_pin_holder(c->kv, ks_pc_pins_released, pc);
    }
    if (pc->pin_kv == c->kv) ks_pc_reap_locked(pc);
    pthread_mutex_unlock(&pc->mu);
    for (int32_t b = 0; b < nb; b++) {
        const int32_t *tok = prompt + (size_t)b * P;
        ks_pc_key key = ks_pc_chain(&parent, tok, P);
        pthread_mutex_lock(&pc->mu);
        pc_block *have = ks_pc_find_locked(pc, &key);
        if (have) {
            have->stamp = ++pc->clock;
            ks_pc_enqueue_locked(pc, have, NULL, NULL); /* no-op when on disk or queued, or pinned */
            /* a block of bytes (read from a file, or kept when its context
             * went) becomes this sequence's pinned pages, which hold the same
             * rows, when nobody reads its bytes now */
            if (pin && have->kv && !have->pins && have->refs == 1 && have->listed && pin_block(c, seq, b, have)) {
                if (have->raw) ks_free(have->raw);
                else ks_free(have->kv);
                have->kv = have->raw = NULL;
                have->pnext = pc->pinned;
                pc->pinned = have;
            }
        }
        pthread_mutex_unlock(&pc->mu);
        if (!have) {
            pc_block *blk = ks_calloc(1, sizeof *blk);
            if (!blk) return KS_FAIL(KS_ERR_NOMEM, "prefix cache block");
            blk->key = key;
            blk->parent = parent;
            blk->fmt = fmt;
            blk->tok = ks_malloc(sizeof(int32_t) * P);
            if (!blk->tok) {
                ks_pc_block_free(blk);
                return KS_FAIL(KS_ERR_NOMEM, "prefix cache block tokens");
            }
            memcpy(blk->tok, tok, sizeof(int32_t) * P);
            blk->kv_bytes = ks_pc_payload_bytes(&fmt);
            KS_ASSERT(blk->kv_bytes == (size_t)hp->n_layer * hp->n_head_kv * page_bytes);
            blk->bytes = blk->kv_bytes + sizeof(int32_t) * P + sizeof *blk;
            for (int32_t l = 0; l < hp->n_layer; l++)
                for (int32_t h = 0; h < hp->n_head_kv; h++) {
                    ks_kv_page_meta meta;
                    ks_kv_page_meta_get(c->kv, seq, l, h, b, &meta);
                    if (meta.fill != P || meta.pos[0] != b * P) { /* not the plain prompt: take nothing */
                        ks_pc_block_free(blk);
                        return KS_OK;
                    }
                }
            /* a pinned block keeps no bytes; the directory's writer gets a copy of its own */
            bool pinned = pin && pin_block(c, seq, b, blk);
            uint8_t *bytes = NULL;
            if (!pinned || pc->dir) bytes = ks_malloc(blk->kv_bytes);
            ks_status st = !pinned && !bytes ? KS_FAIL(KS_ERR_NOMEM, "prefix cache block of %zu bytes", blk->kv_bytes) : KS_OK;
            for (int32_t l = 0; bytes && l < hp->n_layer && st == KS_OK; l++)
                for (int32_t h = 0; h < hp->n_head_kv && st == KS_OK; h++)
                    st = ks_kv_read_page(c->kv, seq, l, h, b, bytes + ((size_t)l * hp->n_head_kv + h) * page_bytes);
            if (!pinned) blk->kv = bytes;
            pthread_mutex_lock(&pc->mu);
            if (st == KS_OK && !ks_pc_find_locked(pc, &key) && ks_pc_insert_locked(pc, blk)) {
                if (pinned) {
                    blk->pnext = pc->pinned;
                    pc->pinned = blk;
                }
                ks_pc_enqueue_locked(pc, blk, NULL, pinned ? bytes : NULL);
                if (pc->pin_kv == c->kv) ks_pc_reap_locked(pc); /* what the insert evicted frees its pages now */
            } else {
                if (pinned) {
                    for (int32_t i = 0; i < hp->n_layer * hp->n_head_kv; i++)
                        ks_kv_unpin(c->kv, i / hp->n_head_kv, blk->pins[i]);
                    ks_free(bytes);
                }
                ks_pc_block_free(blk);
            }
            pthread_mutex_unlock(&pc->mu);
            KS_TRY(st);
        }
        parent = key;
    }
    return KS_OK;
}

ks_status ks_prefix_capture_state(ks_context *c, ks_prefix_cache *pc, int32_t seq, const int32_t *prompt, int32_t n) {
    ks_policy *pol = ks_infer_policy_of(c, seq);
    ks_pc_format fmt = format_of(c);
    int32_t P = (int32_t)fmt.page, nb = n / P;
    size_t sbytes = ks_policy_prefix_state_bytes(pol, P);
    if (!sbytes || !ks_policy_prefix_shareable(pol) || !seq_cacheable(c, seq, P)) return KS_OK;
    uint64_t pk = policy_key(c, seq);
    ks_pc_key parent = seq_root(pc, c, seq, &fmt);
    for (int32_t b = 0; b < nb; b++) {
        ks_pc_key key = ks_pc_chain(&parent, prompt + (size_t)b * P, P);
        parent = key;
        pthread_mutex_lock(&pc->mu);
        pc_block *blk = ks_pc_find_locked(pc, &key);
        bool need = blk && !ks_pc_state_of(blk, pk);
        if (need) blk->refs++;
        pthread_mutex_unlock(&pc->mu);
        if (!need) continue;
        pc_state *s = ks_calloc(1, sizeof *s);
        if (s) s->data = ks_malloc(sbytes);
        ks_status st = KS_OK;
        if (!s || !s->data) {
            ks_free(s);
            s = NULL;
            st = KS_FAIL(KS_ERR_NOMEM, "policy state of %zu bytes", sbytes);
        } else {
            s->pol = pk;
            s->bytes = sbytes;
            st = ks_policy_prefix_state_save(pol, seq, b * P, P, s->data);
        }
        pthread_mutex_lock(&pc->mu);
        if (st == KS_OK && !ks_pc_state_of(blk, pk)) {
            s->next = blk->st;
            blk->st = s;
            blk->bytes += sbytes;
            if (blk->listed) {
                pc->st.ram_bytes += sbytes;
                ks_pc_enqueue_locked(pc, blk, s, NULL);
            }
            s = NULL;
        }
        ks_pc_unref_locked(blk);
        pthread_mutex_unlock(&pc->mu);
        if (s) {
            ks_free(s->data);
            ks_free(s);
        }
        KS_TRY(st);
    }
    return KS_OK;
}

/* ------------------------------------------------ one-file caches -- */
/* The listed blocks of prompt[0, n)'s chain under c's root, referenced,
 * up to the first one missing (or pinned in another context's store). */
static int32_t chain_blocks(ks_prefix_cache *pc, const ks_context *c, const ks_pc_format *fmt, const int32_t *prompt,
                            int32_t nb, pc_block **got) {
    int32_t P = (int32_t)fmt->page, k = 0;
    ks_pc_key parent = ks_pc_context_root(pc, c, fmt);
    pthread_mutex_lock(&pc->mu);
    for (int32_t b = 0; b < nb; b++) {
        ks_pc_key key = ks_pc_chain(&parent, prompt + (size_t)b * P, P);
        pc_block *blk = ks_pc_find_locked(pc, &key);
        if (!blk || (blk->pins && pc->pin_kv != c->kv)) break;
        blk->refs++;
        got[k++] = blk;
        parent = key;
    }
    pthread_mutex_unlock(&pc->mu);
    return k;
}

static void unref_blocks(ks_prefix_cache *pc, pc_block **got, int32_t k) {
    pthread_mutex_lock(&pc->mu);
    for (int32_t i = 0; i < k; i++) ks_pc_unref_locked(got[i]);
    pthread_mutex_unlock(&pc->mu);
}

/* Write the records of got[from, k) to fd, a record at a time: a pinned
 * block's bytes are read from the store (this thread drives it) into *own,
 * one reused buffer. */
static ks_status write_records(int fd, ks_prefix_cache *pc, const ks_context *c, pc_block **got, int32_t from,
                               int32_t k, uint8_t **own) {
    size_t page_bytes = ks_kv_page_bytes(c->kv);
    ks_status st = KS_OK;
    for (int32_t i = from; i < k && st == KS_OK; i++) {
        const uint8_t *payload = got[i]->kv;
        int32_t P = (int32_t)got[i]->fmt.page;
        if (got[i]->pins) {
            if (!*own && !(*own = ks_malloc(got[i]->kv_bytes)))
                return KS_FAIL(KS_ERR_NOMEM, "a block's bytes (%zu)", got[i]->kv_bytes);
            for (uint32_t j = 0; j < got[i]->fmt.n_layer * got[i]->fmt.n_head_kv && st == KS_OK; j++)
                st = ks_kv_read_pinned(c->kv, (int32_t)(j / got[i]->fmt.n_head_kv), got[i]->pins[j], *own + j * page_bytes);
            payload = *own;
        }
        uint8_t hdr[KS_PC_HEADER_BYTES];
        if (st == KS_OK) {
            ks_pc_record_header(hdr, &got[i]->fmt, &pc->model, &got[i]->key, &got[i]->parent, got[i]->tok, payload);
            st = ks_pc_write_all(fd, hdr, sizeof hdr);
        }
        if (st == KS_OK) st = ks_pc_write_all(fd, got[i]->tok, sizeof(int32_t) * P);
        if (st == KS_OK) st = ks_pc_write_all(fd, payload, got[i]->kv_bytes);
    }
    return st;
}

ks_status ks_prefix_cache_save_file(ks_prefix_cache *pc, const ks_context *c, const int32_t *prompt, int32_t n,
                                    const char *path, int32_t *n_blocks) {
    if (!pc || !c || !prompt || !path) return KS_FAIL(KS_ERR_INVALID_ARG, "NULL argument");
    ks_pc_format fmt = format_of(c);
    int32_t P = (int32_t)fmt.page, nb = n / P;
    pc_block **got = ks_malloc(sizeof(pc_block *) * (size_t)(nb + 1));
    if (!got) return KS_FAIL(KS_ERR_NOMEM, "blocks of %d", nb);
    int32_t k = chain_blocks(pc, c, &fmt, prompt, nb, got);
    /* Written a record at a time into a temporary file, then fsync and
     * rename (as publish). */
    static _Atomic uint64_t serial;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d.%llu", path, (int)getpid(), (unsigned long long)atomic_fetch_add(&serial, 1));
    ks_status st = KS_OK;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) st = KS_FAIL(KS_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    uint8_t *own = NULL;
    if (st == KS_OK) st = write_records(fd, pc, c, got, 0, k, &own);
    if (fd >= 0) {
        if (st == KS_OK && fsync(fd) != 0) st = KS_FAIL(KS_ERR_IO, "fsync %s: %s", tmp, strerror(errno));
        if (close(fd) != 0 && st == KS_OK) st = KS_FAIL(KS_ERR_IO, "close %s: %s", tmp, strerror(errno));
        if (st == KS_OK && rename(tmp, path) != 0) st = KS_FAIL(KS_ERR_IO, "rename %s: %s", tmp, strerror(errno));
        if (st != KS_OK) unlink(tmp);
    }
    unref_blocks(pc, got, k);
    ks_free(own);
    ks_free(got);
    if (st == KS_OK && n_blocks) *n_blocks = k;
    return st;
}

/* A checkpoint of a long prefill (`kvsieve run --prompt-cache-every`).
 * Rewriting the whole file at every checkpoint would write a 128K-token
 * prompt's KV (4 GB for a 1B model at f16) once per checkpoint and need
 * twice its size on disk, so the file grows by appends instead, and what
 * makes that safe is the loader: it reads records in order and stops at
 * the first one that fails validation (a short header, a size past the end
 * of the file, a checksum), keeping every record before it.  A kill in the
 * middle of an append therefore leaves a file that restores its whole
 * records, and the next append first cuts the file back to the records
 * known good (in_file: read back by ks_prefix_cache_load_file, which
 * checked them, or written by an append of this cache) that are this
 * prompt's chain, in order; anything after (a torn record, another
 * prompt's blocks, bytes the loader never reached) is truncated away and
 * the chain written from there.  fsync before returning: a checkpoint
 * claimed is on the disk. */
ks_status ks_prefix_cache_append_file(ks_prefix_cache *pc, const ks_context *c, const int32_t *prompt, int32_t n,
                                      const char *path, int32_t *n_blocks) {
    if (!pc || !c || !prompt || !path) return KS_FAIL(KS_ERR_INVALID_ARG, "NULL argument");
    if (n < 0) return KS_FAIL(KS_ERR_INVALID_ARG, "prompt of %d tokens", n);
    ks_pc_format fmt = format_of(c);
    int32_t P = (int32_t)fmt.page, nb = n / P;
    pc_block **got = ks_malloc(sizeof(pc_block *) * (size_t)(nb + 1));
    if (!got) return KS_FAIL(KS_ERR_NOMEM, "blocks of %d", nb);
    int32_t k = chain_blocks(pc, c, &fmt, prompt, nb, got);
    ks_status st = KS_OK;
    uint8_t *own = NULL;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) st = KS_FAIL(KS_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    if (st == KS_OK && (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)))
        st = KS_FAIL(KS_ERR_IO, "%s is not a regular file", path);
    /* the records already there that are this chain's, known good, in order */
    uint64_t off = 0, len = st == KS_OK ? (uint64_t)sb.st_size : 0;
    size_t rec = KS_PC_HEADER_BYTES + sizeof(int32_t) * (size_t)P + ks_pc_payload_bytes(&fmt);
    int32_t have = 0;
    while (st == KS_OK && have < k && len - off >= rec) {
        uint8_t hdr[KS_PC_HEADER_BYTES];
        if (pread(fd, hdr, sizeof hdr, (off_t)off) != (ssize_t)sizeof hdr) break;
        ks_pc_format f = ks_pc_header_format(hdr);
        uint64_t key[2];
        memcpy(key, hdr + 48, sizeof key);
        pthread_mutex_lock(&pc->mu);
        bool good = got[have]->in_file;
        pthread_mutex_unlock(&pc->mu);
        if (!good || memcmp(&f, &fmt, sizeof f) || key[0] != got[have]->key.a || key[1] != got[have]->key.b) break;
        off += rec;
        have++;
    }
    if (st == KS_OK && off != len && ftruncate(fd, (off_t)off) != 0)
        st = KS_FAIL(KS_ERR_IO, "truncating %s: %s", path, strerror(errno));
    if (st == KS_OK && lseek(fd, (off_t)off, SEEK_SET) < 0) st = KS_FAIL(KS_ERR_IO, "seek %s: %s", path, strerror(errno));
    if (st == KS_OK) st = write_records(fd, pc, c, got, have, k, &own);
    if (st == KS_OK && fsync(fd) != 0) st = KS_FAIL(KS_ERR_IO, "fsync %s: %s", path, strerror(errno));
    if (fd >= 0 && close(fd) != 0 && st == KS_OK) st = KS_FAIL(KS_ERR_IO, "close %s: %s", path, strerror(errno));
    if (st == KS_OK) {
        pthread_mutex_lock(&pc->mu);
        for (int32_t i = have; i < k; i++) got[i]->in_file = true;
        pthread_mutex_unlock(&pc->mu);
    }
    unref_blocks(pc, got, k);
    ks_free(own);
    ks_free(got);
    if (st == KS_OK && n_blocks) *n_blocks = k;
    return st;
}
