/*
 * prefix_cache.c — the prefix cache: pay for a long prompt once.  This file
 * holds its life cycle and the RAM tier's entry points (acquire, release,
 * trim); the table of blocks itself, their LRU and pinned store pages, is
 * prefix_table.c's; prefix_cache.h lists the files beside it.
 *
 * The same long prefix comes back again and again (a second question about
 * a document, the next turn of a chat, a shared system prompt).  Its KV is a
 * pure function of its tokens, the model, the KV layout and the prefill
 * policy: a dense prefill (the default, whatever the decode policy) makes a
 * row's K and V depend only on the rows before it, and a sparse one (Quest
 * pages per block of 16 rows, infer/prefill_sparse.c) on the tokens up to
 * its block's end, blocks on one grid; a sparse prefill's chains start from
 * a root with its canonical setting hashed in (infer/prefix_context.c), so
 * dense and sparse KV never meet.  So the cache keeps prefill-computed KV in page-sized blocks,
 * content-addressed (prefix_record.c: a block's key chains its parent's key
 * and its tokens from a root of the model's fingerprint and the layout).
 * Only full blocks are kept, and only rows a prefill computed (a decode
 * step's row may differ in its last bits from the prefill's, and a sparse
 * step's certainly does); prefix_context.c says why a hit is exact.  Prior
 * art: vLLM's automatic prefix caching (hashed block chains, full blocks
 * only, the last token recomputed), SGLang's RadixAttention and
 * llama-server's cache_prompt; no code of theirs is used.
 *
 * Shared pages.  A block taken from a context's store keeps no copy of its
 * KV: it pins the sequence's pages in the store (kv.h, "shared pages": a
 * full page is immutable and reference-counted), and a hit in that context
 * maps the pinned pages into the new sequence's page tables, so N requests
 * on one document and the cache hold its KV once, and a hit costs no copy.
 * The store copies on write wherever a sharer would change a page (an
 * evictor's compaction, a layer moving to the slow tier), and the rows
 * after a hit go into pages of the sequence's own (the partial block past
 * the last whole one is copied, never mapped).  Because the pages are the
 * ones prefill wrote, with the metadata prefill computed, a mapped hit is
 * exact by construction.  Blocks are pinned in one store at a time (the
 * context serve or run drives); a pin refused (the store's pin headroom
 * is full, a layer is in the slow tier, another store holds the pins)
 * falls back to a block of bytes, as is every block read from a file.
 * Pins are taken and released only by calls made with that context
 * (restore, capture, trim from the thread driving it): a block evicted
 * elsewhere (the writer thread drops the last reference) is only marked,
 * and its pages are let go by the next such call.  When the store goes
 * (ks_context_destroy) its release hook turns every pinned block into a
 * block of bytes, so the cache outlives the context.
 *
 * RAM tier: an LRU of blocks under ram_bytes (lowered while a memory cap
 * needs the room: ks_prefix_cache_trim), each block referenced by the
 * table while listed, by restores in progress and by the writer; a RAM miss
 * falls through to the directory (prefix_files.c).
 */
#include "prefix/prefix_cache.h"
#include "gguf/gguf.h"
#include "model/model.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

ks_prefix_cache_params ks_prefix_cache_default_params(void) {
    return (ks_prefix_cache_params){
        .ram_bytes = 1ull << 30, .dir = NULL, .disk_bytes = 8ull << 30, .write_behind = true, .share_pages = true};
}

ks_pc_key ks_pc_model_key(const ks_prefix_cache *pc) { return pc->model; }

void ks_prefix_cache_trim(ks_prefix_cache *pc, uint64_t ram_bytes) {
    if (!pc) return;
    pthread_mutex_lock(&pc->mu);
    pc->limit = ram_bytes < pc->p.ram_bytes ? ram_bytes : pc->p.ram_bytes;
    ks_pc_make_room_locked(pc, pc->limit, 0);
    ks_pc_reap_locked(pc); /* called by the thread driving the pin store's context (the scheduler) */
    pthread_mutex_unlock(&pc->mu);
}

void ks_prefix_cache_get_stats(ks_prefix_cache *pc, ks_prefix_cache_stats *out) {
    pthread_mutex_lock(&pc->mu);
    pc->st.ram_shared_bytes = 0;
    if (pc->pin_kv) { /* pinned pages some sequence maps: their memory is the sequences' too */
        ks_kv_share_info si;
        ks_kv_share_info_get(pc->pin_kv, &si);
        uint64_t b = (uint64_t)si.pinned_tabled_pages * ks_kv_page_bytes(pc->pin_kv);
        pc->st.ram_shared_bytes = b < pc->st.ram_bytes ? b : pc->st.ram_bytes;
    }
    *out = pc->st;
    pthread_mutex_unlock(&pc->mu);
}


/* The model's fingerprint: shapes, every metadata key and value type, every
 * tensor's name, type, dims and up to 3 samples of 4 KiB of its bytes
 * (start, middle, end): cheap, and two different weight files of one shape
 * (another fine-tune, another quantization) differ in it. */
static ks_pc_key fingerprint(const ks_model *m) {
    ks_pc_key h = ks_pc_hash_seed(0x6D6F64656Cull);
    ks_pc_hash_feed(&h, &m->hp.n_vocab, sizeof(int32_t) * 8);
    ks_pc_hash_feed(&h, &m->hp.rope_base, sizeof(float));
    ks_pc_hash_feed(&h, &m->hp.rms_eps, sizeof(float));
    /* the scaling the file states and the per-layer RoPE / temperature
     * features (values, which the metadata walk below does not hash) */
    ks_pc_hash_feed(&h, &m->hp.rope_scaling, sizeof m->hp.rope_scaling);
    ks_pc_hash_feed(&h, &m->hp.rope_skip_every, sizeof m->hp.rope_skip_every);
    ks_pc_hash_feed(&h, &m->hp.attn_temp_scale, sizeof m->hp.attn_temp_scale);
    ks_pc_hash_feed(&h, &m->hp.attn_temp_floor, sizeof m->hp.attn_temp_floor);
    const ks_gguf *g = m->gguf;
    if (!g) return h;
    int64_t nk = ks_gguf_n_kv(g);
    ks_pc_hash_feed(&h, &nk, sizeof nk);
    for (int64_t i = 0; i < ks_gguf_n_tensors(g); i++) {
        const ks_gguf_tensor *t = ks_gguf_tensor_at(g, i);
        ks_pc_hash_feed(&h, t->name.data, t->name.len);
        ks_pc_hash_feed(&h, &t->type, sizeof t->type);
        ks_pc_hash_feed(&h, t->ne, sizeof t->ne);
        if (!t->data) continue;
        size_t s = t->nbytes < 4096 ? t->nbytes : 4096;
        const uint8_t *d = t->data;
        ks_pc_hash_feed(&h, d, s);
        ks_pc_hash_feed(&h, d + t->nbytes / 2 - (t->nbytes / 2 < s ? t->nbytes / 2 : s / 2), s / 2);
        ks_pc_hash_feed(&h, d + t->nbytes - s, s);
    }
    return h;
}

ks_status ks_prefix_cache_create(const ks_model *model, const ks_prefix_cache_params *p, ks_prefix_cache **out) {
    if (!model || !p || !out) return KS_FAIL(KS_ERR_INVALID_ARG, "NULL argument");
    if (p->dir) {
        if (mkdir(p->dir, 0755) != 0 && errno != EEXIST)
            return KS_FAIL(KS_ERR_IO, "cannot create the cache directory %s: %s", p->dir, strerror(errno));
        struct stat sb;
        if (stat(p->dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
            return KS_FAIL(KS_ERR_IO, "%s is not a directory", p->dir);
    }
    ks_prefix_cache *pc = ks_calloc(1, sizeof *pc);
    if (!pc) return KS_FAIL(KS_ERR_NOMEM, "prefix cache");
    pc->p = *p;
    pc->dir = p->dir ? ks_strdup(p->dir) : NULL;
    if (p->dir && !pc->dir) {
        ks_free(pc);
        return KS_FAIL(KS_ERR_NOMEM, "prefix cache directory name");
    }
    pc->p.dir = pc->dir;
    pc->limit = pc->p.ram_bytes;
    pc->model = fingerprint(model);
    pthread_mutex_init(&pc->mu, NULL);
    pthread_cond_init(&pc->cv, NULL);
    pthread_cond_init(&pc->done_cv, NULL);
    if (pc->dir) {
        pthread_mutex_lock(&pc->mu);
        ks_pc_scan_dir(pc);
        pthread_mutex_unlock(&pc->mu);
        if (p->write_behind && pthread_create(&pc->writer, NULL, ks_pc_writer_main, pc) == 0) pc->has_writer = true;
    }
    *out = pc;
    return KS_OK;
}

void ks_prefix_cache_destroy(ks_prefix_cache *pc) {
    if (!pc) return;
    if (pc->has_writer) {
        pthread_mutex_lock(&pc->mu);
        pc->quit = true; /* the writer drains the queue first */
        pthread_cond_signal(&pc->cv);
        pthread_mutex_unlock(&pc->mu);
        pthread_join(pc->writer, NULL);
    }
    for (int i = 0; i < N_BUCKETS; i++)
        while (pc->buckets[i]) ks_pc_unlist_locked(pc, pc->buckets[i]);
    for (pc_block *b = pc->pinned; b; b = b->pnext) b->dead = true; /* no reference is left */
    if (pc->pin_kv) {
        ks_pc_reap_locked(pc);
        ks_kv_set_pin_holder(pc->pin_kv, NULL, NULL);
    }
    pthread_mutex_destroy(&pc->mu);
    pthread_cond_destroy(&pc->cv);
    pthread_cond_destroy(&pc->done_cv);
    ks_free(pc->q);
    ks_free(pc->disk);
    ks_free(pc->dir);
    ks_free(pc);
}

/* The block of key (RAM, else the directory), referenced for the caller;
 * NULL when absent. */
pc_block *ks_pc_acquire(ks_prefix_cache *pc, const ks_kv_store *kv, const ks_pc_key *key, const ks_pc_key *parent,
                        const int32_t *tokens, const ks_pc_format *fmt) {
    pthread_mutex_lock(&pc->mu);
    pc_block *b = ks_pc_find_locked(pc, key);
    if (b && b->pins && pc->pin_kv != kv) b = NULL; /* pinned in another context's store: not readable from here */
    if (b) {
        b->stamp = ++pc->clock;
        b->refs++;
    }
    pthread_mutex_unlock(&pc->mu);
    if (b) return b;
    b = ks_pc_load_block(pc, key, parent, tokens, fmt);
    if (!b) return NULL;
    pthread_mutex_lock(&pc->mu);
    pc_block *there = ks_pc_find_locked(pc, key); /* another thread loaded it meanwhile */
    if (there && there->pins && pc->pin_kv != kv) there = NULL;
    if (there) {
        ks_pc_block_free(b);
        b = there;
        b->refs++;
    } else if (!ks_pc_find_locked(pc, key) && ks_pc_insert_locked(pc, b)) {
        b->refs++;
    } else {
        b->refs = 1; /* too big for RAM: the caller's alone */
    }
    pthread_mutex_unlock(&pc->mu);
    return b;
}

void ks_pc_release(ks_prefix_cache *pc, pc_block *b) {
    pthread_mutex_lock(&pc->mu);
    ks_pc_unref_locked(b);
    pthread_mutex_unlock(&pc->mu);
}
