/*
 * prefix.h — the prefix cache's block record (prefix/prefix_record.c), exposed for
 * the tests and the fuzz target: the parser is what reads untrusted bytes
 * (files another process or replica wrote), so it is a function of a buffer
 * alone, testable and fuzzable without a model.
 */
#ifndef KS_PREFIX_PREFIX_H
#define KS_PREFIX_PREFIX_H

#include "core/core.h"

#include <stddef.h>
#include <stdint.h>

/* A 128-bit content key (two independent 64-bit lanes). */
typedef struct ks_pc_key {
    uint64_t a, b;
} ks_pc_key;

/* The KV layout a block was stored in: a block restores only into a store
 * of the same layout. */
typedef struct ks_pc_format {
    uint32_t kv_type, page, n_layer, n_head_kv, head_dim;
} ks_pc_format;

enum { KS_PC_HEADER_BYTES = 96, KS_PC_VERSION = 1 };

/* A record parsed in place: pointers into the buffer. */
typedef struct ks_pc_record {
    ks_pc_format fmt;
    ks_pc_key model, key, parent;
    const int32_t *tokens; /* [fmt.page] (unaligned reads: copy before use) */
    const uint8_t *payload;
    size_t payload_bytes;  /* [n_layer][n_head_kv][2][page][row] */
    size_t bytes;          /* the whole record */
} ks_pc_record;

/* The hash every key is built from (two 64-bit lanes, not cryptographic):
 * a seed per kind of key, then the bytes it covers. */
ks_pc_key ks_pc_hash_seed(uint64_t tag);
void ks_pc_hash_feed(ks_pc_key *h, const void *p, size_t n);
bool ks_pc_key_eq(const ks_pc_key *x, const ks_pc_key *y);

/* Bytes of a block's KV in a format (0 when the format is invalid). */
size_t ks_pc_payload_bytes(const ks_pc_format *f);
/* The key a block's chain starts from: the model and the KV layout.  A
 * dense prefill row's KV is a function of the tokens up to it alone
 * (whatever the chunking or thread count), so nothing else belongs in it;
 * a context hashes its RoPE and a sparse prefill's setting into the model
 * key first (ks_pc_context_root). */
ks_pc_key ks_pc_root(const ks_pc_key *model, const ks_pc_format *f);
/* The key of a block of `page` tokens under parent. */
ks_pc_key ks_pc_chain(const ks_pc_key *parent, const int32_t *tokens, int32_t page);

/* The KV layout a record's header (KS_PC_HEADER_BYTES) declares, unchecked:
 * ks_pc_payload_bytes says whether it is valid. */
ks_pc_format ks_pc_header_format(const uint8_t *hdr);
/* Parse one record at the start of buf[len]: magic, version, a valid
 * format, sizes inside the buffer, checksum, and key == chain(parent,
 * tokens).  model (optional) must match the record's fingerprint.  Any
 * mismatch is KS_ERR_FORMAT with a message; nothing is allocated. */
ks_status ks_pc_record_parse(const uint8_t *buf, size_t len, const ks_pc_key *model, ks_pc_record *out);
/* A policy's per-token state of one block (spec's retrieval keys), kept in
 * a file of its own beside the block's: a header (magic, version, model,
 * block key, policy-configuration hash, size, checksum) and the bytes. */
enum { KS_PC_STATE_HEADER_BYTES = 80 };
typedef struct ks_pc_state_record {
    ks_pc_key model, key;
    uint64_t pol;
    const uint8_t *data;
    size_t data_bytes, bytes;
} ks_pc_state_record;
/* Parse one state record at the start of buf[len] (bytes of data at most
 * 1 GiB); same rules as ks_pc_record_parse. */
ks_status ks_pc_state_parse(const uint8_t *buf, size_t len, const ks_pc_key *model, ks_pc_state_record *out);
void ks_pc_state_header(uint8_t *hdr, const ks_pc_key *model, const ks_pc_key *key, uint64_t pol, const uint8_t *data,
                        size_t bytes);

/* The fingerprint a cache keys its model by (tests find block files with it). */
typedef struct ks_prefix_cache ks_prefix_cache;
ks_pc_key ks_pc_model_key(const ks_prefix_cache *pc);
/* The root of context c's chains in cache pc: ks_pc_root of the model key
 * with c's resolved RoPE (inverse frequencies, magnitude) hashed in, and,
 * when c's default prefill policy is sparse, its canonical spec (a
 * sequence of another setting chains from that setting's root). */
struct ks_context;
ks_pc_key ks_pc_context_root(const ks_prefix_cache *pc, const struct ks_context *c, const ks_pc_format *fmt);
/* Write a record's header (KS_PC_HEADER_BYTES) for tokens and payload. */
void ks_pc_record_header(uint8_t *hdr, const ks_pc_format *f, const ks_pc_key *model, const ks_pc_key *key,
                         const ks_pc_key *parent, const int32_t *tokens, const uint8_t *payload);

#endif
