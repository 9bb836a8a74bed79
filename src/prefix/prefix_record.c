/*
 * prefix_record.c — the prefix cache's records: how a block of KV (and a
 * policy's per-token state of it) is named, written and read back.
 *
 * Why a file of its own: these are the bytes that cross a trust boundary.
 * Block files live in a directory other processes and replicas write
 * (--cache-dir), and `kvsieve run --prompt-cache` reads a file the user
 * names, so the parser is a function of a buffer alone (no cache, no model,
 * no context), which is what lets tests/fuzz/fuzz_prefix.c drive it with
 * any byte string.  The cache's other files only call it.
 *
 * Keys.  A block is content-addressed, as in vLLM's automatic prefix
 * caching: its key hashes its parent's key and its page of tokens, the chain
 * starting from a root that hashes the model's fingerprint and the KV layout
 * (type, page, layers, KV heads, head dim).  The hash is two 64-bit lanes
 * with different mixing (a 128-bit key, not cryptographic: a collision
 * needs a writer to the cache directory, who could write any KV anyway).
 *
 * A record is a 96-byte header (magic, version, layout, model fingerprint,
 * key, parent, payload size, checksum), the page's tokens and the KV
 * payload [n_layer][n_head_kv][2][page][row].  ks_pc_record_parse checks
 * everything before a byte is used: magic, version, a valid layout, sizes
 * inside the buffer, the fingerprint, the checksum and key == chain(parent,
 * tokens); any mismatch is KS_ERR_FORMAT with a message, never a crash.  A
 * state record (80-byte header and the policy's bytes, at most 1 GiB) is
 * checked the same way.
 */
#include "prefix/prefix.h"
#include "tensor/dtype.h"

#include <string.h>

/* ------------------------------------------------------------ hashing -- */
static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Two lanes with different mixing, fed 8 bytes at a time (tail zero-padded
 * with its length folded in): a 128-bit key, not cryptographic. */
void ks_pc_hash_feed(ks_pc_key *h, const void *p, size_t n) {
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

ks_pc_key ks_pc_hash_seed(uint64_t tag) {
    return (ks_pc_key){mix64(tag ^ 0x6B7673696576652Dull), mix64(tag + 0x2D70726566697821ull)};
}

bool ks_pc_key_eq(const ks_pc_key *x, const ks_pc_key *y) { return x->a == y->a && x->b == y->b; }

size_t ks_pc_payload_bytes(const ks_pc_format *f) {
    if (f->kv_type > 1 || f->page < 1 || f->page > 4096 || f->n_layer < 1 || f->n_layer > 1024 || f->n_head_kv < 1 ||
        f->n_head_kv > 1024 || f->head_dim < 1 || f->head_dim > 1024)
        return 0;
    if (f->kv_type == KS_KV_Q8 && f->head_dim % 32) return 0;
    size_t row = ks_kv_row_bytes((ks_kv_type)f->kv_type, (int)f->head_dim);
    return (size_t)f->n_layer * f->n_head_kv * 2 * f->page * row; /* < 2^45: no overflow */
}

ks_pc_key ks_pc_root(const ks_pc_key *model, const ks_pc_format *f) {
    ks_pc_key h = ks_pc_hash_seed(KS_PC_VERSION);
    ks_pc_hash_feed(&h, model, sizeof *model);
    uint32_t v[5] = {f->kv_type, f->page, f->n_layer, f->n_head_kv, f->head_dim};
    ks_pc_hash_feed(&h, v, sizeof v);
    return h;
}

ks_pc_key ks_pc_chain(const ks_pc_key *parent, const int32_t *tokens, int32_t page) {
    ks_pc_key h = ks_pc_hash_seed(0x626C6F636Bull);
    ks_pc_hash_feed(&h, parent, sizeof *parent);
    ks_pc_hash_feed(&h, tokens, sizeof(int32_t) * (size_t)page);
    return h;
}

static uint64_t checksum_of(const ks_pc_key *key, const void *tokens, size_t tok_bytes, const uint8_t *payload,
                            size_t n) {
    ks_pc_key h = ks_pc_hash_seed(0x73756D);
    ks_pc_hash_feed(&h, key, sizeof *key);
    ks_pc_hash_feed(&h, tokens, tok_bytes);
    ks_pc_hash_feed(&h, payload, n);
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

ks_pc_format ks_pc_header_format(const uint8_t *hdr) {
    return (ks_pc_format){get32(hdr + 12), get32(hdr + 16), get32(hdr + 20), get32(hdr + 24), get32(hdr + 28)};
}

ks_status ks_pc_record_parse(const uint8_t *buf, size_t len, const ks_pc_key *model, ks_pc_record *out) {
    if (len < KS_PC_HEADER_BYTES) return KS_FAIL(KS_ERR_FORMAT, "block record truncated (%zu bytes)", len);
    if (memcmp(buf, MAGIC, 8)) return KS_FAIL(KS_ERR_FORMAT, "not a kvsieve prefix block (bad magic)");
    if (get32(buf + 8) != KS_PC_VERSION)
        return KS_FAIL(KS_ERR_FORMAT, "block format version %u (this build reads %d)", get32(buf + 8), KS_PC_VERSION);
    ks_pc_record r = {0};
    r.fmt = ks_pc_header_format(buf);
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
    if (model && !ks_pc_key_eq(model, &r.model)) return KS_FAIL(KS_ERR_FORMAT, "block of another model (fingerprint differs)");
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
    if (!ks_pc_key_eq(&k, &r.key)) return KS_FAIL(KS_ERR_FORMAT, "block key does not match its parent and tokens");
    r.tokens = (const int32_t *)tok;
    r.bytes = KS_PC_HEADER_BYTES + tok_bytes + pb;
    *out = r;
    return KS_OK;
}

static const char SMAGIC[8] = {'K', 'S', 'P', 'C', 'S', 'T', 'A', 0};

static uint64_t state_checksum(const ks_pc_key *key, uint64_t pol, const uint8_t *data, size_t n) {
    ks_pc_key h = ks_pc_hash_seed(0x737461);
    ks_pc_hash_feed(&h, key, sizeof *key);
    ks_pc_hash_feed(&h, &pol, sizeof pol);
    ks_pc_hash_feed(&h, data, n);
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
    if (model && !ks_pc_key_eq(model, &r.model)) return KS_FAIL(KS_ERR_FORMAT, "state of another model (fingerprint differs)");
    r.data = buf + KS_PC_STATE_HEADER_BYTES;
    r.data_bytes = (size_t)n;
    if (state_checksum(&r.key, r.pol, r.data, r.data_bytes) != get64(buf + 64))
        return KS_FAIL(KS_ERR_FORMAT, "state checksum mismatch (corrupt)");
    r.bytes = KS_PC_STATE_HEADER_BYTES + r.data_bytes;
    *out = r;
    return KS_OK;
}
