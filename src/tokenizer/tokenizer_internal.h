/*
 * tokenizer_internal.h — the tokenizer's state and the pieces its source
 * files share (not part of any public API).
 *
 * Layout choice: all token strings live in one blob indexed by an offset
 * array, and lookups go through open-addressing tables of int32 ids whose
 * keys are read back from the blob.  Versus one malloc'd string per token
 * this is two allocations instead of 150K, cache-friendly, and trivially
 * freed.  The merge table of byte-level BPE uses the same trick, keyed by the
 * "left right" merge string, so a candidate pair can be looked up by hashing
 * left, ' ', right incrementally without building the joined string.
 *
 * The priority queue is shared by both merge algorithms: entries carry a
 * priority (SPM score, or minus the BPE rank) and the left symbol index;
 * higher priority pops first and ties go to the leftmost pair, which is the
 * tie-break the reference tokenizers use.
 */
#ifndef KS_TOKENIZER_INTERNAL_H
#define KS_TOKENIZER_INTERNAL_H

#include "tokenizer/tokenizer.h"
#include "tokenizer/jinja.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

enum { KS_TOK_SPM = 1, KS_TOK_BPE = 2 };

/* GGUF tokenizer.ggml.token_type values. */
enum {
    KS_TT_UNDEFINED = 0, KS_TT_NORMAL = 1, KS_TT_UNKNOWN = 2, KS_TT_CONTROL = 3,
    KS_TT_USER_DEFINED = 4, KS_TT_UNUSED = 5, KS_TT_BYTE = 6
};

#define KS_TOK_MAX_REGEX 8
#define KS_TOK_MAX_EOG 16

/* A set of strings (blob + offsets) indexed by an open-addressing table. */
typedef struct ks_tok_strset {
    char *blob;        /* [off[n]] concatenated strings, no separators */
    uint32_t *off;     /* [n + 1] string i is blob[off[i] .. off[i+1]) */
    int32_t n;
    int32_t *slots;    /* [mask + 1] string index or -1 (empty) */
    uint32_t *hashes;  /* [n] full hash of string i (cheap reject on probe) */
    uint32_t mask;
} ks_tok_strset;

struct ks_tokenizer {
    int kind;                  /* KS_TOK_SPM or KS_TOK_BPE */
    int32_t n_vocab;
    ks_tok_strset vocab;       /* token strings, index = token id */
    float *scores;             /* [n_vocab] SPM merge scores (0 if absent) */
    uint8_t *types;            /* [n_vocab] KS_TT_* */
    char *piece_blob;          /* [piece_off[n_vocab]] decoded bytes of every token */
    uint32_t *piece_off;       /* [n_vocab + 1] */

    /* byte-level BPE */
    ks_tok_strset merges;      /* "left right" strings, index = rank */
    uint32_t *merge_split;     /* [merges.n] byte offset of the separating space */
    pcre2_code *re[KS_TOK_MAX_REGEX]; /* [n_re] pre-tokenizer, applied in order */
    int n_re;
    bool ignore_merges;        /* llama3: a word that is a token is emitted whole */
    char byte_utf8[256][3];    /* [256][3] GPT-2 byte -> unicode alphabet, UTF-8 */
    uint8_t byte_utf8_len[256];/* [256] */
    int16_t byte_of_cp[324];   /* [324] inverse: code point -> byte, -1 if not in the alphabet */

    /* SPM */
    int32_t byte_ids[256];     /* [256] id of <0xNN>, -1 if absent */
    bool add_space_prefix;

    /* special tokens, longest text first (partition order) */
    int32_t *special_ids;      /* [n_special] control, user-defined and unknown tokens */
    int32_t n_special;

    int32_t bos, eos, eot, eom, unk, pad; /* -1 if none */
    bool add_bos;
    int32_t eog_ids[KS_TOK_MAX_EOG]; /* [n_eog] */
    int n_eog;
    ks_chat_family chat;
    ks_jinja *chat_tmpl; /* tokenizer.chat_template parsed; NULL if absent or unparsable */
    ks_tool_syntax tools; /* how the template writes tool calls (Hermes without a usable template) */
};

/* Growable id list the encoders append to. */
/* Growable arrays of one encode call: a refused allocation sets `refused`
 * and drops the element, and the encoder reports KS_ERR_NOMEM at the end. */
typedef struct ks_tok_ids {
    int32_t *v; /* [cap] */
    size_t n, cap;
    bool refused;
} ks_tok_ids;
void ks_tok_ids_push(ks_tok_ids *ids, int32_t id);

/* Hashing and lookup. */
uint32_t ks_tok_hash_init(void);
uint32_t ks_tok_hash_bytes(uint32_t h, const void *p, size_t n);
int32_t ks_tok_strset_find(const ks_tok_strset *s, const char *p, size_t n);
/* Copy n strings into s and index them; on a duplicate the last index wins
 * when last_wins, else the first.  Empty strings are stored, not indexed. */
ks_status ks_tok_strset_build(ks_tok_strset *s, const ks_gguf_str *strs, int32_t n, bool last_wins);
void ks_tok_strset_free(ks_tok_strset *s);
/* Make the table resolve string i's text to i (settles duplicates). */
void ks_tok_strset_point(ks_tok_strset *s, int32_t i);
bool ks_tok_utf8_valid(const unsigned char *s, size_t n);
int32_t ks_tok_vocab_find(const ks_tokenizer *t, const char *p, size_t n);
/* Rank of merge (left, right) or -1. */
int32_t ks_tok_merge_rank(const ks_tokenizer *t, const char *l, size_t nl, const char *r, size_t nr);

/* Priority queue of candidate merges. */
typedef struct ks_tok_pair {
    double prio;   /* higher pops first */
    int32_t left;  /* symbol index; ties: lower pops first */
    int32_t right;
    uint32_t size; /* bytes of left+right when queued (staleness check) */
} ks_tok_pair;
typedef struct ks_tok_heap {
    ks_tok_pair *v; /* [cap] */
    size_t n, cap;
    bool refused;
} ks_tok_heap;
void ks_tok_heap_push(ks_tok_heap *h, ks_tok_pair p);
ks_tok_pair ks_tok_heap_pop(ks_tok_heap *h);

/* Symbols of a word being merged: a doubly linked list over byte spans. */
typedef struct ks_tok_sym {
    int32_t prev, next; /* neighbour indices, -1 at the ends */
    uint32_t off, n;    /* span in the word; n == 0 once merged away */
} ks_tok_sym;

/* Length of the UTF-8 sequence a lead byte announces (1 for stray bytes). */
static inline size_t ks_tok_utf8_len(unsigned char c) {
    static const uint8_t lens[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lens[c >> 4];
}

/* Length of the character at p (n bytes left): the announced length when
 * the continuation bytes are there, else 1, so a stray byte never swallows
 * the start of the next (valid) character. */
static inline size_t ks_tok_utf8_char_len(const char *p, size_t n) {
    size_t k = ks_tok_utf8_len((unsigned char)p[0]);
    if (k > n) return 1;
    for (size_t i = 1; i < k; i++)
        if (((unsigned char)p[i] & 0xC0) != 0x80) return 1;
    return k;
}

/* Per-family entry points (text contains no special tokens). */
void ks_tok_spm_encode(const ks_tokenizer *t, const char *text, size_t len, bool space_prefix,
                       ks_tok_ids *out);
/* Scratch for one BPE encode call (match data, JIT stack, buffers). */
typedef struct ks_tok_bpe_scratch ks_tok_bpe_scratch;
ks_tok_bpe_scratch *ks_tok_bpe_scratch_create(const ks_tokenizer *t); /* NULL: refused */
void ks_tok_bpe_scratch_destroy(ks_tok_bpe_scratch *s);
ks_status ks_tok_bpe_encode(const ks_tokenizer *t, ks_tok_bpe_scratch *s, const char *text,
                            size_t len, ks_tok_ids *out);

/* BPE setup: byte alphabet and pre-tokenizer regexes for a tokenizer.ggml.pre name. */
void ks_tok_bpe_init_bytes(ks_tokenizer *t);
ks_status ks_tok_bpe_compile_pre(ks_tokenizer *t, const char *pre, size_t pre_len);
void ks_tok_bpe_free_pre(ks_tokenizer *t);
/* Reverse the byte alphabet: mapped UTF-8 text -> raw bytes appended to dst.
 * Characters outside the alphabet are copied through.  Returns bytes written
 * (dst must hold at least n bytes). */
size_t ks_tok_bpe_unmap(const ks_tokenizer *t, const char *src, size_t n, char *dst);

#endif
