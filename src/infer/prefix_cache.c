/*
 * prefix.c — the prefix cache: pay for a long prompt once.
 *
 * The same long prefix comes back again and again (a second question about
 * a document, the next turn of a chat, a shared system prompt).  Its KV is a
 * pure function of its tokens, the model and the KV layout: prefill attends
 * densely whatever the policy, and a row's K and V depend only on the rows
 * before it.  So the cache keeps prefill-computed KV in page-sized blocks,
 * content-addressed as vLLM's automatic prefix caching does: block b's key
 * hashes its parent's key and its P tokens, the chain starting from a root
 * that hashes the model's fingerprint and the layout (type, page, layers,
 * heads, head dim).  Only full blocks are kept, and only rows a prefill
 * computed (a decode step's row may differ in its last bits from the
 * prefill's, and a sparse step's certainly does).
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
 * own beside the block's).  Prior art: vLLM's automatic prefix caching
 * (hashed block chains, full blocks only, the last token recomputed),
 * SGLang's RadixAttention and llama-server's cache_prompt; no code of
 * theirs is used.
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
 * Tiers.  RAM: an LRU of blocks under ram_bytes.  Directory: every block
 * taken is queued for a writer thread (write-behind: the request never
 * waits on the disk), which publishes it as <key>.kvb atomically (write a
 * temporary file, fsync, rename), so a reader never sees half a file and
 * several replicas may share the directory.  A RAM miss looks for the
 * file; a file is untrusted input: its header (magic, version, model
 * fingerprint, layout, key, parent), sizes, checksum and key chain are
 * checked before a byte is used (ks_pc_record_parse, fuzzed), and a bad
 * file is skipped with a counted warning.  The directory has its own LRU
 * under disk_bytes over the files this process knows (found at start or
 * written since).
 */
#define _GNU_SOURCE
#include "infer/internal.h"
#include "infer/prefix.h"
#include "gguf/gguf.h"
#include "tensor/dtype.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

/* ------------------------------------------------------------ hashing -- */
static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Two lanes with different mixing, fed 8 bytes at a time (tail zero-padded
 * with its length folded in): a 128-bit key, not cryptographic. */
static void hash_feed(ks_pc_key *h, const void *p, size_t n) {
    const uint8_t *b = p;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, b, 8);
        h->a = mix64(h->a ^ w) + 0x9E3779B97F4A7C15ull;
        h->b = mix64(h->b + w * 0xFF51AFD7ED558CCDull) ^ (h->a >> 29);
        b += 8;
        n -= 8;
    }
    if (n) {
        uint64_t w = (uint64_t)n << 56;
        memcpy(&w, b, n);
        h->a = mix64(h->a ^ w) + 0x9E3779B97F4A7C15ull;
        h->b = mix64(h->b + w * 0xFF51AFD7ED558CCDull) ^ (h->a >> 29);
    }
}

static ks_pc_key hash_seed(uint64_t tag) { return (ks_pc_key){mix64(tag ^ 0x6B7673696576652Dull), mix64(tag + 0x2D70726566697821ull)}; }

static bool key_eq(const ks_pc_key *x, const ks_pc_key *y) { return x->a == y->a && x->b == y->b; }

size_t ks_pc_payload_bytes(const ks_pc_format *f) {
    if (f->kv_type > 1 || f->page < 1 || f->page > 4096 || f->n_layer < 1 || f->n_layer > 1024 || f->n_head_kv < 1 ||
        f->n_head_kv > 1024 || f->head_dim < 1 || f->head_dim > 512)
        return 0;
    if (f->kv_type == KS_KV_Q8 && f->head_dim % 32) return 0;
    size_t row = ks_kv_row_bytes((ks_kv_type)f->kv_type, (int)f->head_dim);
    return (size_t)f->n_layer * f->n_head_kv * 2 * f->page * row; /* < 2^45: no overflow */
}

ks_pc_key ks_pc_root(const ks_pc_key *model, const ks_pc_format *f) {
    ks_pc_key h = hash_seed(KS_PC_VERSION);
    hash_feed(&h, model, sizeof *model);
    uint32_t v[5] = {f->kv_type, f->page, f->n_layer, f->n_head_kv, f->head_dim};
    hash_feed(&h, v, sizeof v);
    return h;
}

ks_pc_key ks_pc_chain(const ks_pc_key *parent, const int32_t *tokens, int32_t page) {
    ks_pc_key h = hash_seed(0x626C6F636Bull);
    hash_feed(&h, parent, sizeof *parent);
    hash_feed(&h, tokens, sizeof(int32_t) * (size_t)page);
    return h;
}

static uint64_t checksum_of(const ks_pc_key *key, const void *tokens, size_t tok_bytes, const uint8_t *payload,
                            size_t n) {
    ks_pc_key h = hash_seed(0x73756D);
    hash_feed(&h, key, sizeof *key);
    hash_feed(&h, tokens, tok_bytes);
    hash_feed(&h, payload, n);
    return h.a ^ h.b;
}

/* ------------------------------------------------------------- record -- */
static const char MAGIC[8] = {'K', 'S', 'P', 'C', 'B', 'L', 'K', 0};

static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static uint64_t get64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

void ks_pc_record_header(uint8_t *hdr, const ks_pc_format *f, const ks_pc_key *model, const ks_pc_key *key,
                         const ks_pc_key *parent, const int32_t *tokens, const uint8_t *payload) {
    size_t pb = ks_pc_payload_bytes(f);
    memset(hdr, 0, KS_PC_HEADER_BYTES);
    memcpy(hdr, MAGIC, 8);
    put32(hdr + 8, KS_PC_VERSION);
    put32(hdr + 12, f->kv_type);
    put32(hdr + 16, f->page);
    put32(hdr + 20, f->n_layer);
    put32(hdr + 24, f->n_head_kv);
    put32(hdr + 28, f->head_dim);
    put64(hdr + 32, model->a);
    put64(hdr + 40, model->b);
    put64(hdr + 48, key->a);
    put64(hdr + 56, key->b);
    put64(hdr + 64, parent->a);
    put64(hdr + 72, parent->b);
    put64(hdr + 80, pb);
    put64(hdr + 88, checksum_of(key, tokens, sizeof(int32_t) * f->page, payload, pb));
}

ks_status ks_pc_record_parse(const uint8_t *buf, size_t len, const ks_pc_key *model, ks_pc_record *out) {
    if (len < KS_PC_HEADER_BYTES) return KS_FAIL(KS_ERR_FORMAT, "block record truncated (%zu bytes)", len);
    if (memcmp(buf, MAGIC, 8)) return KS_FAIL(KS_ERR_FORMAT, "not a kvsieve prefix block (bad magic)");
    if (get32(buf + 8) != KS_PC_VERSION)
        return KS_FAIL(KS_ERR_FORMAT, "block format version %u (this build reads %d)", get32(buf + 8), KS_PC_VERSION);
    ks_pc_record r = {0};
    r.fmt = (ks_pc_format){get32(buf + 12), get32(buf + 16), get32(buf + 20), get32(buf + 24), get32(buf + 28)};
    size_t pb = ks_pc_payload_bytes(&r.fmt);
    if (!pb) return KS_FAIL(KS_ERR_FORMAT, "block header has an invalid KV layout");
    r.model = (ks_pc_key){get64(buf + 32), get64(buf + 40)};
    r.key = (ks_pc_key){get64(buf + 48), get64(buf + 56)};
    r.parent = (ks_pc_key){get64(buf + 64), get64(buf + 72)};
    if (get64(buf + 80) != pb) return KS_FAIL(KS_ERR_FORMAT, "block payload size does not match its layout");
    size_t tok_bytes = sizeof(int32_t) * r.fmt.page;
    if (len - KS_PC_HEADER_BYTES < tok_bytes || len - KS_PC_HEADER_BYTES - tok_bytes < pb)
        return KS_FAIL(KS_ERR_FORMAT, "block record truncated (%zu of %zu bytes)", len,
                       KS_PC_HEADER_BYTES + tok_bytes + pb);
    if (model && !key_eq(model, &r.model)) return KS_FAIL(KS_ERR_FORMAT, "block of another model (fingerprint differs)");
    const uint8_t *tok = buf + KS_PC_HEADER_BYTES;
    r.payload = tok + tok_bytes;
    r.payload_bytes = pb;
    if (checksum_of(&r.key, tok, tok_bytes, r.payload, pb) != get64(buf + 88))
        return KS_FAIL(KS_ERR_FORMAT, "block checksum mismatch (corrupt)");
    int32_t *t = ks_malloc(tok_bytes);
    if (!t) return KS_FAIL(KS_ERR_NOMEM, "block tokens of %zu bytes", tok_bytes);
    memcpy(t, tok, tok_bytes);
    ks_pc_key k = ks_pc_chain(&r.parent, t, (int32_t)r.fmt.page);
    ks_free(t);
    if (!key_eq(&k, &r.key)) return KS_FAIL(KS_ERR_FORMAT, "block key does not match its parent and tokens");
    r.tokens = (const int32_t *)tok;
    r.bytes = KS_PC_HEADER_BYTES + tok_bytes + pb;
    *out = r;
    return KS_OK;
}

static const char SMAGIC[8] = {'K', 'S', 'P', 'C', 'S', 'T', 'A', 0};

static uint64_t state_checksum(const ks_pc_key *key, uint64_t pol, const uint8_t *data, size_t n) {
    ks_pc_key h = hash_seed(0x737461);
    hash_feed(&h, key, sizeof *key);
    hash_feed(&h, &pol, sizeof pol);
    hash_feed(&h, data, n);
    return h.a ^ h.b;
}

void ks_pc_state_header(uint8_t *hdr, const ks_pc_key *model, const ks_pc_key *key, uint64_t pol, const uint8_t *data,
                        size_t bytes) {
    memset(hdr, 0, KS_PC_STATE_HEADER_BYTES);
    memcpy(hdr, SMAGIC, 8);
    put32(hdr + 8, KS_PC_VERSION);
    put64(hdr + 16, model->a);
    put64(hdr + 24, model->b);
    put64(hdr + 32, key->a);
    put64(hdr + 40, key->b);
    put64(hdr + 48, pol);
    put64(hdr + 56, bytes);
    put64(hdr + 64, state_checksum(key, pol, data, bytes));
}

ks_status ks_pc_state_parse(const uint8_t *buf, size_t len, const ks_pc_key *model, ks_pc_state_record *out) {
    if (len < KS_PC_STATE_HEADER_BYTES) return KS_FAIL(KS_ERR_FORMAT, "state record truncated (%zu bytes)", len);
    if (memcmp(buf, SMAGIC, 8)) return KS_FAIL(KS_ERR_FORMAT, "not a kvsieve prefix state (bad magic)");
    if (get32(buf + 8) != KS_PC_VERSION)
        return KS_FAIL(KS_ERR_FORMAT, "state format version %u (this build reads %d)", get32(buf + 8), KS_PC_VERSION);
    ks_pc_state_record r = {0};
    r.model = (ks_pc_key){get64(buf + 16), get64(buf + 24)};
    r.key = (ks_pc_key){get64(buf + 32), get64(buf + 40)};
    r.pol = get64(buf + 48);
    uint64_t n = get64(buf + 56);
    if (n == 0 || n > ((uint64_t)1 << 30) || n > len - KS_PC_STATE_HEADER_BYTES)
        return KS_FAIL(KS_ERR_FORMAT, "state record truncated or oversized (%llu bytes of data)", (unsigned long long)n);
    if (model && !key_eq(model, &r.model)) return KS_FAIL(KS_ERR_FORMAT, "state of another model (fingerprint differs)");
    r.data = buf + KS_PC_STATE_HEADER_BYTES;
    r.data_bytes = (size_t)n;
    if (state_checksum(&r.key, r.pol, r.data, r.data_bytes) != get64(buf + 64))
        return KS_FAIL(KS_ERR_FORMAT, "state checksum mismatch (corrupt)");
    r.bytes = KS_PC_STATE_HEADER_BYTES + r.data_bytes;
    *out = r;
    return KS_OK;
}

/* -------------------------------------------------------------- cache -- */
typedef struct pc_state {
    uint64_t pol;          /* hash of the policy configuration */
    size_t bytes;
    uint8_t *data;
    struct pc_state *next;
} pc_state;

typedef struct pc_block {
    ks_pc_key key, parent;
    ks_pc_format fmt;
    int32_t *tok;          /* [page] */
    uint8_t *kv;           /* [n_layer][n_head_kv][page_bytes] */
    uint8_t *raw;          /* the record kv points into (a prompt-cache file's, read in place), or NULL: kv is its own */
    size_t kv_bytes, bytes; /* payload; everything counted against the RAM cap */
    pc_state *st;
    int32_t *pins;         /* [n_layer][n_head_kv] page ids pinned in the cache's pin store, or NULL (then kv) */
    bool dead;             /* pinned and unreferenced: its pages wait for reap_locked */
    struct pc_block *pnext; /* the cache's list of pinned blocks */
    uint64_t stamp;        /* LRU */
    int refs;              /* the table's (while listed), restores in progress, the writer's */
    bool listed;
    bool queued;           /* waiting for the writer */
    bool st_queued;        /* a state of it waits for the writer */
    struct pc_block *hnext;
} pc_block;

typedef struct disk_ent {
    ks_pc_key key;
    uint64_t pol;          /* 0: the block's file; else the state file of that policy configuration */
    uint64_t bytes, stamp;
} disk_ent;

/* A write for the writer: a block's file (st NULL) or one of its states'. */
typedef struct pc_job {
    struct pc_block *b;
    struct pc_state *st;
    uint8_t *payload;      /* a pinned block's bytes, owned by the job (else b->kv is written) */
} pc_job;

enum { N_BUCKETS = 4096 };

struct ks_prefix_cache {
    ks_pc_key model;
    ks_prefix_cache_params p;
    uint64_t limit;         /* the RAM cap now: p.ram_bytes, or less while a memory cap needs the room */
    char *dir;
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* writer: work or quit */
    pthread_cond_t done_cv; /* flush: queue drained */
    pc_block *buckets[N_BUCKETS];
    uint64_t clock;
    pc_job *q;              /* write queue */
    int32_t qn, qcap;
    bool writing, quit, has_writer;
    pthread_t writer;
    disk_ent *disk;
    int32_t n_disk, disk_cap;
    ks_kv_store *pin_kv;    /* the store the pinned blocks' pages live in, or NULL */
    pc_block *pinned;       /* blocks with pins (live and dead) */
    ks_prefix_cache_stats st;
};

ks_prefix_cache_params ks_prefix_cache_default_params(void) {
    return (ks_prefix_cache_params){
        .ram_bytes = 1ull << 30, .dir = NULL, .disk_bytes = 8ull << 30, .write_behind = true, .share_pages = true};
}

ks_pc_key ks_pc_model_key(const ks_prefix_cache *pc) { return pc->model; }

static pc_block **bucket_of(ks_prefix_cache *pc, const ks_pc_key *k) { return &pc->buckets[k->a % N_BUCKETS]; }

static pc_block *find_locked(ks_prefix_cache *pc, const ks_pc_key *k) {
    for (pc_block *b = *bucket_of(pc, k); b; b = b->hnext)
        if (key_eq(&b->key, k)) return b;
    return NULL;
}

static void block_free(pc_block *b) {
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

static void unref_locked(pc_block *b) {
    if (--b->refs > 0) return;
    if (b->pins) b->dead = true; /* its pages go at the next reap, on the thread driving their store */
    else block_free(b);
}

static void unlist_locked(ks_prefix_cache *pc, pc_block *b);

/* Let go of the pages of dead pinned blocks (caller holds mu and drives pc->pin_kv's context). */
static void reap_locked(ks_prefix_cache *pc) {
    for (pc_block **pp = &pc->pinned; *pp;) {
        pc_block *b = *pp;
        if (!b->dead) {
            pp = &b->pnext;
            continue;
        }
        for (uint32_t l = 0; l < b->fmt.n_layer; l++)
            for (uint32_t h = 0; h < b->fmt.n_head_kv; h++) ks_kv_unpin(pc->pin_kv, (int32_t)l, b->pins[l * b->fmt.n_head_kv + h]);
        *pp = b->pnext;
        block_free(b);
    }
}

/* The pin store goes (ks_kv_destroy's hook): live pinned blocks become
 * blocks of bytes, dead ones go. */
static void pins_released(void *arg, ks_kv_store *kv) {
    ks_prefix_cache *pc = arg;
    pthread_mutex_lock(&pc->mu);
    size_t page_bytes = ks_kv_page_bytes(kv);
    while (pc->pinned) {
        pc_block *b = pc->pinned;
        pc->pinned = b->pnext;
        b->pnext = NULL;
        if (b->dead) {
            block_free(b);
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
            if (b->listed) unlist_locked(pc, b);
            continue;
        }
        b->kv = bytes;
    }
    pc->pin_kv = NULL;
    pthread_mutex_unlock(&pc->mu);
}

static void unlist_locked(ks_prefix_cache *pc, pc_block *b) {
    pc_block **pp = bucket_of(pc, &b->key);
    while (*pp != b) pp = &(*pp)->hnext;
    *pp = b->hnext;
    b->listed = false;
    pc->st.ram_bytes -= b->bytes;
    pc->st.ram_blocks--;
    unref_locked(b);
}

/* Evict LRU blocks until `need` more bytes fit under cap. */
static void make_room_locked(ks_prefix_cache *pc, uint64_t cap, uint64_t need) {
    while (pc->st.ram_blocks > 0 && pc->st.ram_bytes + need > cap) {
        pc_block *old = NULL;
        for (int i = 0; i < N_BUCKETS; i++)
            for (pc_block *b = pc->buckets[i]; b; b = b->hnext)
                if (!old || b->stamp < old->stamp) old = b;
        unlist_locked(pc, old); /* a queued block stays alive for the writer (its ref) */
        pc->st.evictions++;
    }
}

/* List a new block (refs: the table's); false when it cannot fit the cap. */
static bool insert_locked(ks_prefix_cache *pc, pc_block *b) {
    if (b->bytes > pc->limit) return false;
    make_room_locked(pc, pc->limit, b->bytes);
    b->stamp = ++pc->clock;
    b->refs = 1;
    b->listed = true;
    b->hnext = *bucket_of(pc, &b->key);
    *bucket_of(pc, &b->key) = b;
    pc->st.ram_bytes += b->bytes;
    pc->st.ram_blocks++;
    return true;
}

void ks_prefix_cache_trim(ks_prefix_cache *pc, uint64_t ram_bytes) {
    if (!pc) return;
    pthread_mutex_lock(&pc->mu);
    pc->limit = ram_bytes < pc->p.ram_bytes ? ram_bytes : pc->p.ram_bytes;
    make_room_locked(pc, pc->limit, 0);
    reap_locked(pc); /* called by the thread driving the pin store's context (the scheduler) */
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

/* ------------------------------------------------------------- files -- */
static uint64_t wall_us(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (uint64_t)tv.tv_sec * 1000000u + (uint64_t)tv.tv_usec;
}

static void file_name(const ks_prefix_cache *pc, const ks_pc_key *k, uint64_t pol, char *out, size_t cap) {
    if (pol)
        snprintf(out, cap, "%s/%016llx%016llx-%016llx.kvs", pc->dir, (unsigned long long)k->a,
                 (unsigned long long)k->b, (unsigned long long)pol);
    else
        snprintf(out, cap, "%s/%016llx%016llx.kvb", pc->dir, (unsigned long long)k->a, (unsigned long long)k->b);
}

static void skip_warn(ks_prefix_cache *pc, const char *what, const char *why) {
    pthread_mutex_lock(&pc->mu);
    pc->st.skipped_corrupt++;
    pthread_mutex_unlock(&pc->mu);
    KS_LOG(WARN, "prefix cache: skipped %s: %s", what, why);
}

static int32_t disk_find_locked(ks_prefix_cache *pc, const ks_pc_key *k, uint64_t pol) {
    for (int32_t i = 0; i < pc->n_disk; i++)
        if (key_eq(&pc->disk[i].key, k) && pc->disk[i].pol == pol) return i;
    return -1;
}

static void disk_note_locked(ks_prefix_cache *pc, const ks_pc_key *k, uint64_t pol, uint64_t bytes, uint64_t stamp) {
    int32_t i = disk_find_locked(pc, k, pol);
    if (i >= 0) {
        pc->disk[i].stamp = stamp;
        return;
    }
    if (pc->n_disk == pc->disk_cap) {
        int32_t cap = pc->disk_cap ? 2 * pc->disk_cap : 256;
        disk_ent *disk = ks_realloc(pc->disk, sizeof(disk_ent) * (size_t)cap);
        if (!disk) return; /* the file stays unlisted: the index only ever under-counts */
        pc->disk = disk;
        pc->disk_cap = cap;
    }
    pc->disk[pc->n_disk++] = (disk_ent){*k, pol, bytes, stamp};
    pc->st.disk_bytes += bytes;
    pc->st.disk_blocks++;
}

/* Remove the least recently used files while over the disk cap. */
static void disk_trim_locked(ks_prefix_cache *pc) {
    while (pc->p.disk_bytes && pc->st.disk_bytes > pc->p.disk_bytes && pc->n_disk > 0) {
        int32_t o = 0;
        for (int32_t i = 1; i < pc->n_disk; i++)
            if (pc->disk[i].stamp < pc->disk[o].stamp) o = i;
        char path[4096];
        file_name(pc, &pc->disk[o].key, pc->disk[o].pol, path, sizeof path);
        unlink(path); /* another replica may have removed it already */
        pc->st.disk_bytes -= pc->disk[o].bytes;
        pc->st.disk_blocks--;
        pc->st.disk_evictions++;
        pc->disk[o] = pc->disk[--pc->n_disk];
    }
}

static ks_status write_all(int fd, const void *p, size_t n) {
    const uint8_t *b = p;
    while (n) {
        ssize_t w = write(fd, b, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return KS_FAIL(KS_ERR_IO, "write: %s", strerror(errno));
        b += w;
        n -= (size_t)w;
    }
    return KS_OK;
}

/* Publish a file atomically: a temporary name, fsync, rename. */
static ks_status publish(const char *path, const void *const *parts, const size_t *sizes, int n_parts) {
    static _Atomic uint64_t serial;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d.%llu", path, (int)getpid(), (unsigned long long)atomic_fetch_add(&serial, 1));
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return KS_FAIL(KS_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    ks_status st = KS_OK;
    for (int i = 0; i < n_parts && st == KS_OK; i++) st = write_all(fd, parts[i], sizes[i]);
    if (st == KS_OK && fsync(fd) != 0) st = KS_FAIL(KS_ERR_IO, "fsync %s: %s", tmp, strerror(errno));
    if (close(fd) != 0 && st == KS_OK) st = KS_FAIL(KS_ERR_IO, "close %s: %s", tmp, strerror(errno));
    if (st == KS_OK && rename(tmp, path) != 0) st = KS_FAIL(KS_ERR_IO, "rename %s: %s", tmp, strerror(errno));
    if (st != KS_OK) unlink(tmp);
    return st;
}

static ks_status write_block(ks_prefix_cache *pc, const pc_block *b, const uint8_t *payload) {
    uint8_t hdr[KS_PC_HEADER_BYTES];
    ks_pc_record_header(hdr, &b->fmt, &pc->model, &b->key, &b->parent, b->tok, payload);
    char path[4096];
    file_name(pc, &b->key, 0, path, sizeof path);
    const void *parts[3] = {hdr, b->tok, payload};
    size_t sizes[3] = {sizeof hdr, sizeof(int32_t) * b->fmt.page, b->kv_bytes};
    return publish(path, parts, sizes, 3);
}

static ks_status write_state(ks_prefix_cache *pc, const pc_block *b, const pc_state *s) {
    uint8_t hdr[KS_PC_STATE_HEADER_BYTES];
    ks_pc_state_header(hdr, &pc->model, &b->key, s->pol, s->data, s->bytes);
    char path[4096];
    file_name(pc, &b->key, s->pol, path, sizeof path);
    const void *parts[2] = {hdr, s->data};
    size_t sizes[2] = {sizeof hdr, s->bytes};
    return publish(path, parts, sizes, 2);
}

static void written_locked(ks_prefix_cache *pc, const pc_block *b, const pc_state *s) {
    pc->st.spills += !s;
    disk_note_locked(pc, &b->key, s ? s->pol : 0,
                     s ? KS_PC_STATE_HEADER_BYTES + s->bytes
                       : KS_PC_HEADER_BYTES + sizeof(int32_t) * b->fmt.page + b->kv_bytes,
                     wall_us());
    disk_trim_locked(pc);
}

static void *writer_main(void *arg) {
    ks_prefix_cache *pc = arg;
    pthread_mutex_lock(&pc->mu);
    for (;;) {
        while (!pc->qn && !pc->quit) pthread_cond_wait(&pc->cv, &pc->mu);
        if (!pc->qn) break;
        pc_job job = pc->q[0];
        pc_block *b = job.b;
        memmove(pc->q, pc->q + 1, sizeof(pc_job) * (size_t)--pc->qn);
        pc->writing = true;
        pthread_mutex_unlock(&pc->mu);
        /* a block and its attached states are immutable: no lock needed */
        ks_status st = job.st ? write_state(pc, b, job.st) : write_block(pc, b, job.payload ? job.payload : b->kv);
        if (st != KS_OK) KS_LOG(WARN, "prefix cache: could not write a block: %s", ks_last_error());
        ks_free(job.payload);
        pthread_mutex_lock(&pc->mu);
        if (job.st) b->st_queued = false;
        else b->queued = false;
        if (st == KS_OK) written_locked(pc, b, job.st);
        unref_locked(b);
        pc->writing = false;
        if (!pc->qn) pthread_cond_broadcast(&pc->done_cv);
    }
    pthread_mutex_unlock(&pc->mu);
    return NULL;
}

/* Queue a listed block (s NULL) or one of its states for the directory
 * (caller holds mu).  A pinned block's bytes come as payload (the job owns
 * it: the writer thread never reads the store); a block of bytes passes
 * NULL. */
static void enqueue_locked(ks_prefix_cache *pc, pc_block *b, pc_state *s, uint8_t *payload) {
    if (!pc->dir || (s ? b->st_queued : b->queued) || disk_find_locked(pc, &b->key, s ? s->pol : 0) >= 0 ||
        (!s && !payload && !b->kv)) {
        ks_free(payload);
        return;
    }
    if (!pc->has_writer) { /* synchronous mode */
        ks_status st = s ? write_state(pc, b, s) : write_block(pc, b, payload ? payload : b->kv);
        ks_free(payload);
        if (st == KS_OK) written_locked(pc, b, s);
        else KS_LOG(WARN, "prefix cache: could not write a block: %s", ks_last_error());
        return;
    }
    if (pc->qn == pc->qcap) {
        int32_t cap = pc->qcap ? 2 * pc->qcap : 64;
        pc_job *q = ks_realloc(pc->q, sizeof(pc_job) * (size_t)cap);
        if (!q) { /* the block stays in RAM only, as without a directory */
            KS_LOG(WARN, "prefix cache: no room to queue a block write");
            return;
        }
        pc->q = q;
        pc->qcap = cap;
    }
    if (s) b->st_queued = true;
    else b->queued = true;
    b->refs++;
    pc->q[pc->qn++] = (pc_job){b, s, payload};
    pthread_cond_signal(&pc->cv);
}

void ks_prefix_cache_flush(ks_prefix_cache *pc) {
    if (!pc) return;
    pthread_mutex_lock(&pc->mu);
    while (pc->qn || pc->writing) pthread_cond_wait(&pc->done_cv, &pc->mu);
    pthread_mutex_unlock(&pc->mu);
}

/* Read a whole file of at most cap bytes (NULL and *len = 0 when absent). */
static ks_status read_file(const char *path, size_t cap, uint8_t **out, size_t *len) {
    *out = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT ? KS_ERR_NOT_FOUND : KS_FAIL(KS_ERR_IO, "open %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return KS_FAIL(KS_ERR_IO, "%s is not a regular file", path);
    }
    if ((uint64_t)sb.st_size > cap) {
        close(fd);
        return KS_FAIL(KS_ERR_FORMAT, "%s has %lld bytes, more than a block can", path, (long long)sb.st_size);
    }
    size_t n = (size_t)sb.st_size, got = 0;
    uint8_t *buf = ks_malloc(n ? n : 1);
    if (!buf) {
        close(fd);
        return KS_FAIL(KS_ERR_NOMEM, "reading %s (%zu bytes)", path, n);
    }
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    *out = buf;
    *len = got;
    return KS_OK;
}

/* A block from a parsed record (owned copy). */
static pc_block *block_from_record(const ks_pc_record *r) {
    pc_block *b = ks_calloc(1, sizeof *b);
    if (!b) return NULL;
    b->key = r->key;
    b->parent = r->parent;
    b->fmt = r->fmt;
    b->tok = ks_malloc(sizeof(int32_t) * r->fmt.page);
    b->kv_bytes = r->payload_bytes;
    b->kv = ks_malloc(r->payload_bytes);
    if (!b->tok || !b->kv) {
        block_free(b);
        return NULL;
    }
    memcpy(b->tok, r->tokens, sizeof(int32_t) * r->fmt.page);
    memcpy(b->kv, r->payload, r->payload_bytes);
    b->bytes = b->kv_bytes + sizeof(int32_t) * r->fmt.page + sizeof *b;
    return b;
}

/* The block of key from the directory, verified against the expected
 * parent, tokens and layout; NULL (counted when the file was bad) if none. */
static pc_block *load_block(ks_prefix_cache *pc, const ks_pc_key *key, const ks_pc_key *parent, const int32_t *tokens,
                            const ks_pc_format *fmt) {
    if (!pc->dir) return NULL;
    char path[4096];
    file_name(pc, key, 0, path, sizeof path);
    size_t want = KS_PC_HEADER_BYTES + sizeof(int32_t) * fmt->page + ks_pc_payload_bytes(fmt);
    uint8_t *buf = NULL;
    size_t len = 0;
    ks_status st = read_file(path, want, &buf, &len);
    if (st == KS_ERR_NOT_FOUND || st == KS_ERR_NOMEM) return NULL; /* a miss: the rows are computed */
    if (st != KS_OK) {
        skip_warn(pc, path, ks_last_error());
        return NULL;
    }
    ks_pc_record r;
    st = ks_pc_record_parse(buf, len, &pc->model, &r);
    pc_block *b = NULL;
    if (st != KS_OK) {
        skip_warn(pc, path, ks_last_error());
    } else if (!key_eq(&r.key, key) || !key_eq(&r.parent, parent) || memcmp(&r.fmt, fmt, sizeof *fmt) ||
               r.bytes != len || memcmp(r.tokens, tokens, sizeof(int32_t) * fmt->page)) {
        skip_warn(pc, path, "the block is not the one its name says");
    } else {
        b = block_from_record(&r);
    }
    ks_free(buf);
    if (b) {
        pthread_mutex_lock(&pc->mu);
        pc->st.loads++;
        disk_note_locked(pc, key, 0, len, wall_us());
        pthread_mutex_unlock(&pc->mu);
    }
    return b;
}

/* Files already in the directory join its LRU (oldest modified first out). */
static void scan_dir(ks_prefix_cache *pc) {
    DIR *d = opendir(pc->dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        bool block = n == 36 && !strcmp(e->d_name + 32, ".kvb");
        bool state = n == 53 && e->d_name[32] == '-' && !strcmp(e->d_name + 49, ".kvs");
        if (!block && !state) continue;
        char a[17] = {0}, b[17] = {0}, c[17] = {0};
        memcpy(a, e->d_name, 16);
        memcpy(b, e->d_name + 16, 16);
        if (state) memcpy(c, e->d_name + 33, 16);
        char *end1, *end2, *end3 = c;
        ks_pc_key k = {strtoull(a, &end1, 16), strtoull(b, &end2, 16)};
        uint64_t pol = state ? strtoull(c, &end3, 16) : 0;
        if (*end1 || *end2 || *end3 || (state && !pol)) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", pc->dir, e->d_name);
        struct stat sb;
        if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        disk_note_locked(pc, &k, pol, (uint64_t)sb.st_size,
                         (uint64_t)sb.st_mtim.tv_sec * 1000000u + (uint64_t)sb.st_mtim.tv_nsec / 1000u);
    }
    closedir(d);
    disk_trim_locked(pc);
}

/* The model's fingerprint: shapes, every metadata key and value type, every
 * tensor's name, type, dims and up to 3 samples of 4 KiB of its bytes
 * (start, middle, end): cheap, and two different weight files of one shape
 * (another fine-tune, another quantization) differ in it. */
static ks_pc_key fingerprint(const ks_model *m) {
    ks_pc_key h = hash_seed(0x6D6F64656Cull);
    hash_feed(&h, &m->hp.n_vocab, sizeof(int32_t) * 8);
    hash_feed(&h, &m->hp.rope_base, sizeof(float));
    hash_feed(&h, &m->hp.rms_eps, sizeof(float));
    const ks_gguf *g = m->gguf;
    if (!g) return h;
    int64_t nk = ks_gguf_n_kv(g);
    hash_feed(&h, &nk, sizeof nk);
    for (int64_t i = 0; i < ks_gguf_n_tensors(g); i++) {
        const ks_gguf_tensor *t = ks_gguf_tensor_at(g, i);
        hash_feed(&h, t->name.data, t->name.len);
        hash_feed(&h, &t->type, sizeof t->type);
        hash_feed(&h, t->ne, sizeof t->ne);
        if (!t->data) continue;
        size_t s = t->nbytes < 4096 ? t->nbytes : 4096;
        const uint8_t *d = t->data;
        hash_feed(&h, d, s);
        hash_feed(&h, d + t->nbytes / 2 - (t->nbytes / 2 < s ? t->nbytes / 2 : s / 2), s / 2);
        hash_feed(&h, d + t->nbytes - s, s);
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
        scan_dir(pc);
        pthread_mutex_unlock(&pc->mu);
        if (p->write_behind && pthread_create(&pc->writer, NULL, writer_main, pc) == 0) pc->has_writer = true;
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
        while (pc->buckets[i]) unlist_locked(pc, pc->buckets[i]);
    for (pc_block *b = pc->pinned; b; b = b->pnext) b->dead = true; /* no reference is left */
    if (pc->pin_kv) {
        reap_locked(pc);
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

/* ------------------------------------------------ context side -- */
static ks_pc_format format_of(const ks_context *c) {
    const ks_hparams *hp = &c->model->hp;
    return (ks_pc_format){(uint32_t)c->kv_type, (uint32_t)ks_kv_page_size(c->kv), (uint32_t)hp->n_layer,
                          (uint32_t)hp->n_head_kv, (uint32_t)hp->head_dim};
}

static uint64_t policy_key(const ks_context *c, int32_t seq) {
    const ks_infer_pol *e = ks_infer_pol_of(c, seq);
    ks_pc_key h = hash_seed(0x706F6CULL);
    hash_feed(&h, e->spec.name, strlen(e->spec.name));
    if (e->spec.args[0]) hash_feed(&h, e->spec.args, strlen(e->spec.args) + 1);
    uint64_t k = h.a ^ h.b;
    return k ? k : 1; /* 0 names the block's own file */
}

static pc_state *state_of(pc_block *b, uint64_t pol) {
    for (pc_state *s = b->st; s; s = s->next)
        if (s->pol == pol) return s;
    return NULL;
}

/* A block's state for policy configuration pol: in RAM, else from its file
 * (verified and attached); NULL when there is none. */
static pc_state *state_get(ks_prefix_cache *pc, pc_block *b, uint64_t pol, size_t want) {
    pthread_mutex_lock(&pc->mu);
    pc_state *s = state_of(b, pol);
    pthread_mutex_unlock(&pc->mu);
    if (s || !pc->dir) return s;
    char path[4096];
    file_name(pc, &b->key, pol, path, sizeof path);
    uint8_t *buf = NULL;
    size_t len = 0;
    ks_status st = read_file(path, KS_PC_STATE_HEADER_BYTES + want, &buf, &len);
    if (st == KS_ERR_NOT_FOUND || st == KS_ERR_NOMEM) return NULL; /* a miss: the rows are computed */
    if (st != KS_OK) {
        skip_warn(pc, path, ks_last_error());
        return NULL;
    }
    ks_pc_state_record r;
    if (ks_pc_state_parse(buf, len, &pc->model, &r) != KS_OK) {
        skip_warn(pc, path, ks_last_error());
    } else if (!key_eq(&r.key, &b->key) || r.pol != pol || r.data_bytes != want || r.bytes != len) {
        skip_warn(pc, path, "the state is not the one its name says");
    } else {
        s = ks_calloc(1, sizeof *s);
        if (s && !(s->data = ks_malloc(want))) {
            ks_free(s);
            s = NULL;
        }
        if (s) { /* refused: a miss */
            s->pol = pol;
            s->bytes = want;
            memcpy(s->data, r.data, want);
        }
    }
    ks_free(buf);
    if (!s) return NULL;
    pthread_mutex_lock(&pc->mu);
    pc_state *there = state_of(b, pol);
    if (there) {
        ks_free(s->data);
        ks_free(s);
        s = there;
    } else {
        s->next = b->st;
        b->st = s;
        b->bytes += s->bytes;
        if (b->listed) pc->st.ram_bytes += s->bytes;
        pc->st.loads++;
        disk_note_locked(pc, &b->key, pol, len, wall_us());
    }
    pthread_mutex_unlock(&pc->mu);
    return s;
}

/* The block of key (RAM, else the directory), referenced for the caller;
 * NULL when absent. */
static pc_block *acquire(ks_prefix_cache *pc, const ks_kv_store *kv, const ks_pc_key *key, const ks_pc_key *parent,
                         const int32_t *tokens, const ks_pc_format *fmt) {
    pthread_mutex_lock(&pc->mu);
    pc_block *b = find_locked(pc, key);
    if (b && b->pins && pc->pin_kv != kv) b = NULL; /* pinned in another context's store: not readable from here */
    if (b) {
        b->stamp = ++pc->clock;
        b->refs++;
    }
    pthread_mutex_unlock(&pc->mu);
    if (b) return b;
    b = load_block(pc, key, parent, tokens, fmt);
    if (!b) return NULL;
    pthread_mutex_lock(&pc->mu);
    pc_block *there = find_locked(pc, key); /* another thread loaded it meanwhile */
    if (there && there->pins && pc->pin_kv != kv) there = NULL;
    if (there) {
        block_free(b);
        b = there;
        b->refs++;
    } else if (!find_locked(pc, key) && insert_locked(pc, b)) {
        b->refs++;
    } else {
        b->refs = 1; /* too big for RAM: the caller's alone */
    }
    pthread_mutex_unlock(&pc->mu);
    return b;
}

static void release(ks_prefix_cache *pc, pc_block *b) {
    pthread_mutex_lock(&pc->mu);
    unref_locked(b);
    pthread_mutex_unlock(&pc->mu);
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
    if (pc->pin_kv == c->kv) reap_locked(pc);
    pthread_mutex_unlock(&pc->mu);
    pc_block **got = ks_malloc(sizeof(pc_block *) * (size_t)(nb_max + 1));
    if (!got) return KS_FAIL(KS_ERR_NOMEM, "cached blocks of %d", nb_max);
    int32_t nb = 0;
    ks_pc_key parent = ks_pc_root(&pc->model, &fmt);
    for (int32_t b = 0; b < nb_max; b++) {
        ks_pc_key key = ks_pc_chain(&parent, prompt + (size_t)b * P, P);
        pc_block *blk = acquire(pc, c->kv, &key, &parent, prompt + (size_t)b * P, &fmt);
        if (!blk) break;
        if (memcmp(blk->tok, prompt + (size_t)b * P, sizeof(int32_t) * P) || (sbytes && !state_get(pc, blk, pk, sbytes))) {
            release(pc, blk);
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
                if (!key_eq(&b->parent, &parent) || memcmp(&b->fmt, &fmt, sizeof fmt)) continue;
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
        st = ks_policy_prefix_state_load(pol, seq, b * P, P, state_of(got[b], pk)->data); /* attached: stays */
    for (int32_t b = 0; b < nb + (tail > 0); b++) release(pc, got[b]);
    ks_free(got);
    if (st != KS_OK) {
        ks_seq_reset(c, seq);
        return st;
    }
    c->seq_len[seq] = hit;
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
    if (c->seq_len[seq] != n || nb == 0) return KS_OK;
    const ks_hparams *hp = &c->model->hp;
    size_t page_bytes = ks_kv_page_bytes(c->kv);
    ks_pc_key parent = ks_pc_root(&pc->model, &fmt);
    pthread_mutex_lock(&pc->mu);
    bool pin = pc->p.share_pages && (!pc->pin_kv || pc->pin_kv == c->kv);
    if (pin && !pc->pin_kv) { /* this context's store holds the cache's pages from now on */
        pc->pin_kv = c->kv;
        ks_kv_set_pin_holder(c->kv, pins_released, pc);
    }
    if (pc->pin_kv == c->kv) reap_locked(pc);
    pthread_mutex_unlock(&pc->mu);
    for (int32_t b = 0; b < nb; b++) {
        const int32_t *tok = prompt + (size_t)b * P;
        ks_pc_key key = ks_pc_chain(&parent, tok, P);
        pthread_mutex_lock(&pc->mu);
        pc_block *have = find_locked(pc, &key);
        if (have) {
            have->stamp = ++pc->clock;
            enqueue_locked(pc, have, NULL, NULL); /* no-op when on disk or queued, or pinned */
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
                block_free(blk);
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
                        block_free(blk);
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
            if (st == KS_OK && !find_locked(pc, &key) && insert_locked(pc, blk)) {
                if (pinned) {
                    blk->pnext = pc->pinned;
                    pc->pinned = blk;
                }
                enqueue_locked(pc, blk, NULL, pinned ? bytes : NULL);
                if (pc->pin_kv == c->kv) reap_locked(pc); /* what the insert evicted frees its pages now */
            } else {
                if (pinned) {
                    for (int32_t i = 0; i < hp->n_layer * hp->n_head_kv; i++)
                        ks_kv_unpin(c->kv, i / hp->n_head_kv, blk->pins[i]);
                    ks_free(bytes);
                }
                block_free(blk);
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
    if (!sbytes || !ks_policy_prefix_shareable(pol)) return KS_OK;
    uint64_t pk = policy_key(c, seq);
    ks_pc_key parent = ks_pc_root(&pc->model, &fmt);
    for (int32_t b = 0; b < nb; b++) {
        ks_pc_key key = ks_pc_chain(&parent, prompt + (size_t)b * P, P);
        parent = key;
        pthread_mutex_lock(&pc->mu);
        pc_block *blk = find_locked(pc, &key);
        bool need = blk && !state_of(blk, pk);
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
        if (st == KS_OK && !state_of(blk, pk)) {
            s->next = blk->st;
            blk->st = s;
            blk->bytes += sbytes;
            if (blk->listed) {
                pc->st.ram_bytes += sbytes;
                enqueue_locked(pc, blk, s, NULL);
            }
            s = NULL;
        }
        unref_locked(blk);
        pthread_mutex_unlock(&pc->mu);
        if (s) {
            ks_free(s->data);
            ks_free(s);
        }
        KS_TRY(st);
    }
    return KS_OK;
}

ks_status ks_prefill_cached(ks_context *c, ks_prefix_cache *pc, int32_t seq, const int32_t *prompt, int32_t n,
                            float *logits, int32_t *n_cached) {
    int32_t hit = 0;
    KS_TRY(ks_prefix_restore(c, pc, seq, prompt, n, &hit));
    KS_TRY(ks_prefill_rest(c, pc, seq, prompt, n, n, logits));
    if (n_cached) *n_cached = hit;
    return KS_OK;
}

/* ------------------------------------------------ one-file caches -- */
ks_status ks_prefix_cache_save_file(ks_prefix_cache *pc, const ks_context *c, const int32_t *prompt, int32_t n,
                                    const char *path, int32_t *n_blocks) {
    if (!pc || !c || !prompt || !path) return KS_FAIL(KS_ERR_INVALID_ARG, "NULL argument");
    ks_pc_format fmt = format_of(c);
    int32_t P = (int32_t)fmt.page, nb = n / P;
    pc_block **got = ks_malloc(sizeof(pc_block *) * (size_t)(nb + 1));
    if (!got) return KS_FAIL(KS_ERR_NOMEM, "blocks of %d", nb);
    int32_t k = 0;
    ks_pc_key parent = ks_pc_root(&pc->model, &fmt);
    pthread_mutex_lock(&pc->mu);
    for (int32_t b = 0; b < nb; b++) {
        ks_pc_key key = ks_pc_chain(&parent, prompt + (size_t)b * P, P);
        pc_block *blk = find_locked(pc, &key);
        if (!blk || (blk->pins && pc->pin_kv != c->kv)) break;
        blk->refs++;
        got[k++] = blk;
        parent = key;
    }
    pthread_mutex_unlock(&pc->mu);
    /* Written a record at a time into a temporary file, then fsync and
     * rename (as publish): a pinned block's bytes are read from the store
     * (this thread drives it) into one reused buffer. */
    static _Atomic uint64_t serial;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d.%llu", path, (int)getpid(), (unsigned long long)atomic_fetch_add(&serial, 1));
    ks_status st = KS_OK;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) st = KS_FAIL(KS_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    size_t page_bytes = ks_kv_page_bytes(c->kv);
    uint8_t *own = NULL;
    for (int32_t i = 0; i < k && st == KS_OK; i++) {
        const uint8_t *payload = got[i]->kv;
        if (got[i]->pins) {
            if (!own && !(own = ks_malloc(got[i]->kv_bytes))) {
                st = KS_FAIL(KS_ERR_NOMEM, "a block's bytes (%zu)", got[i]->kv_bytes);
                break;
            }
            for (uint32_t j = 0; j < got[i]->fmt.n_layer * got[i]->fmt.n_head_kv && st == KS_OK; j++)
                st = ks_kv_read_pinned(c->kv, (int32_t)(j / got[i]->fmt.n_head_kv), got[i]->pins[j], own + j * page_bytes);
            payload = own;
        }
        uint8_t hdr[KS_PC_HEADER_BYTES];
        if (st == KS_OK) {
            ks_pc_record_header(hdr, &got[i]->fmt, &pc->model, &got[i]->key, &got[i]->parent, got[i]->tok, payload);
            st = write_all(fd, hdr, sizeof hdr);
        }
        if (st == KS_OK) st = write_all(fd, got[i]->tok, sizeof(int32_t) * P);
        if (st == KS_OK) st = write_all(fd, payload, got[i]->kv_bytes);
    }
    if (fd >= 0) {
        if (st == KS_OK && fsync(fd) != 0) st = KS_FAIL(KS_ERR_IO, "fsync %s: %s", tmp, strerror(errno));
        if (close(fd) != 0 && st == KS_OK) st = KS_FAIL(KS_ERR_IO, "close %s: %s", tmp, strerror(errno));
        if (st == KS_OK && rename(tmp, path) != 0) st = KS_FAIL(KS_ERR_IO, "rename %s: %s", tmp, strerror(errno));
        if (st != KS_OK) unlink(tmp);
    }
    pthread_mutex_lock(&pc->mu);
    for (int32_t i = 0; i < k; i++) unref_locked(got[i]);
    pthread_mutex_unlock(&pc->mu);
    ks_free(own);
    ks_free(got);
    if (st == KS_OK && n_blocks) *n_blocks = k;
    return st;
}

/* pread all n bytes at off; false at end of file or on an error */
static bool pread_all(int fd, void *dst, size_t n, off_t off) {
    uint8_t *d = dst;
    while (n) {
        ssize_t r = pread(fd, d, n, off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        d += r;
        n -= (size_t)r;
        off += r;
    }
    return true;
}

/* Streamed, a record at a time (a 16K-token prompt's file is half a GB of
 * a 1B model's KV: never the whole file in memory beside its blocks). */
ks_status ks_prefix_cache_load_file(ks_prefix_cache *pc, const char *path, int32_t *n_blocks) {
    if (!pc || !path) return KS_FAIL(KS_ERR_INVALID_ARG, "NULL argument");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) return KS_FAIL(KS_ERR_NOT_FOUND, "no prompt cache at %s yet", path);
        return KS_FAIL(KS_ERR_IO, "open %s: %s", path, strerror(errno));
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return KS_FAIL(KS_ERR_IO, "%s is not a regular file", path);
    }
    uint64_t len = (uint64_t)sb.st_size;
    uint8_t *buf = NULL;
    size_t cap = 0;
    int32_t k = 0;
    for (uint64_t off = 0; off < len;) {
        uint8_t hdr[KS_PC_HEADER_BYTES];
        const char *why = NULL;
        size_t rec = 0;
        if (len - off < KS_PC_HEADER_BYTES || !pread_all(fd, hdr, sizeof hdr, (off_t)off)) {
            why = "truncated record header";
        } else {
            ks_pc_format f = {get32(hdr + 12), get32(hdr + 16), get32(hdr + 20), get32(hdr + 24), get32(hdr + 28)};
            size_t pb = ks_pc_payload_bytes(&f);
            rec = KS_PC_HEADER_BYTES + sizeof(int32_t) * f.page + pb;
            if (!pb) rec = KS_PC_HEADER_BYTES; /* the parser names what is wrong */
            if (rec > len - off) rec = (size_t)(len - off);
        }
        if (!why) { /* a buffer per record: the block keeps it (no second copy of the payload) */
            if (!buf || rec > cap) {
                ks_free(buf);
                buf = ks_malloc(rec);
                cap = buf ? rec : 0;
            }
            if (!buf) {
                close(fd);
                return KS_FAIL(KS_ERR_NOMEM, "a record of %zu bytes from %s", rec, path);
            }
            if (!pread_all(fd, buf, rec, (off_t)off)) why = "read failed";
        }
        ks_pc_record r;
        if (!why && ks_pc_record_parse(buf, rec, &pc->model, &r) != KS_OK) why = ks_last_error();
        if (why) {
            skip_warn(pc, path, why);
            break;
        }
        pc_block *b = ks_calloc(1, sizeof *b);
        if (b && !(b->tok = ks_malloc(sizeof(int32_t) * r.fmt.page))) {
            ks_free(b);
            b = NULL;
        }
        if (!b) {
            ks_free(buf);
            close(fd);
            return KS_FAIL(KS_ERR_NOMEM, "a block from %s", path);
        }
        b->key = r.key;
        b->parent = r.parent;
        b->fmt = r.fmt;
        memcpy(b->tok, r.tokens, sizeof(int32_t) * r.fmt.page);
        b->kv_bytes = r.payload_bytes;
        b->raw = buf; /* the payload stays where it was read */
        b->kv = (uint8_t *)r.payload;
        b->bytes = b->kv_bytes + sizeof(int32_t) * r.fmt.page + sizeof *b;
        buf = NULL;
        cap = 0;
        pthread_mutex_lock(&pc->mu);
        if (find_locked(pc, &b->key) || !insert_locked(pc, b)) block_free(b);
        else k++;
        pthread_mutex_unlock(&pc->mu);
        off += r.bytes;
    }
    ks_free(buf);
    close(fd);
    if (n_blocks) *n_blocks = k;
    return KS_OK;
}
