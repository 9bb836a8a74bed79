/*
 * json_constraint.h — structured output: sampling constrained so that the
 * generated text is JSON that validates against a schema (the server's
 * response_format).
 *
 * Two layers.  A schema compiled from JSON Schema (the subset listed in
 * json_constraint.c; any other keyword is refused by name, never ignored)
 * and a byte-level acceptor whose state says whether the text so far is a
 * valid prefix of a conforming document.  Over it, a token-level constraint
 * that masks, before each draw, every token whose text would leave that
 * prefix, or would leave too few tokens of the budget to close the document
 * (each token adds at least one byte, so "the shortest completion fits in
 * the tokens left" is kept at every step and the output always completes).
 */
#ifndef KS_JSON_CONSTRAINT_H
#define KS_JSON_CONSTRAINT_H

#include "core/core.h"
#include "kvsieve.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ks_json_schema ks_json_schema;

/* Compile schema[len] (a JSON Schema object), or, with schema NULL, "any
 * JSON object" (response_format json_object).  KS_ERR_UNSUPPORTED with the
 * keyword and its location in where[where_cap] (e.g. "'pattern' at
 * /properties/name") for what the acceptor cannot enforce;
 * KS_ERR_INVALID_ARG for a malformed schema (where says what), KS_ERR_NOMEM. */
ks_status ks_json_schema_compile(const char *schema, size_t len, ks_json_schema **out, char *where, size_t where_cap);
void ks_json_schema_destroy(ks_json_schema *s);
/* Bytes of the shortest conforming document (what a max_tokens must at
 * least hold, one byte per token at worst). */
size_t ks_json_schema_min_len(const ks_json_schema *s);

/* The byte-level acceptor: a small copyable state (pushdown, bounded depth). */
enum { KS_JSON_MAX_DEPTH = 32 };
typedef struct ks_json_frame {
    uint8_t t, phase, key, need; /* frame kind, its phase, a free object key, UTF-8 continuation bytes due */
    uint8_t lo, hi;              /* range of the next continuation byte */
    uint16_t node;               /* schema node */
    uint16_t cur;                /* object: the property whose value is being read */
    uint32_t pos;                /* bytes matched (enum, literal, number) */
    uint64_t mask;               /* object: properties seen; enum: candidates alive */
} ks_json_frame;
typedef struct ks_json_state {
    int32_t n; /* frames in use; 0 with `done`: a complete document */
    bool done;
    ks_json_frame f[KS_JSON_MAX_DEPTH];
} ks_json_state;

void ks_json_state_init(const ks_json_schema *s, ks_json_state *st);
/* Feed bytes; false (st then undefined: feed a copy) when they leave the
 * valid prefixes. */
bool ks_json_state_feed(const ks_json_schema *s, ks_json_state *st, const char *p, size_t n);
/* The text so far is a whole conforming document (a number at top level is
 * complete once it could end). */
bool ks_json_state_complete(const ks_json_schema *s, const ks_json_state *st);
/* The shortest completion of st into buf[cap] (NUL-terminated when room);
 * returns its length (cap may be 0 to measure). */
size_t ks_json_state_finish(const ks_json_schema *s, const ks_json_state *st, char *buf, size_t cap);

/* The token-level constraint of one generation. */
typedef struct ks_json_constraint ks_json_constraint;
/* The schema is borrowed (it must outlive the constraint); the model gives
 * the vocabulary's token texts. */
ks_status ks_json_constraint_create(const ks_model *m, const ks_json_schema *s, ks_json_constraint **out);
/* The same over a schema it compiles and owns: schema_text is a JSON
 * Schema, or NULL / "" for any JSON object (the server's response_format). */
ks_status ks_json_constraint_create_text(const ks_model *m, const char *schema_text, ks_json_constraint **out);
void ks_json_constraint_destroy(ks_json_constraint *c);
/* Set logits[n_vocab] of every token that may not come next to -inf:
 * tokens_left counts this one.  Returns how many remain allowed (0: none,
 * the caller ends the generation). */
int32_t ks_json_constraint_mask(ks_json_constraint *c, float *logits, int32_t tokens_left);
/* Advance over the chosen token; false if it was not allowed. */
bool ks_json_constraint_accept(ks_json_constraint *c, int32_t token);
/* The document is complete: stop generating. */
bool ks_json_constraint_done(const ks_json_constraint *c);

#endif
