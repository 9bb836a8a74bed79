/*
 * tokens.h — the bodies of POST /tokenize and POST /detokenize (llama-server's
 * shapes), parsed apart from any HTTP or model state so that a fuzzer drives
 * them directly (tests/fuzz/fuzz_request.c), as api.h does for completions.
 * What needs the model (token ids against the vocabulary) is checked by the
 * handler (tokens.c) with the same error objects.
 */
#ifndef KS_SERVER_TOKENS_H
#define KS_SERVER_TOKENS_H

#include "server/api.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* {"content": "...", "add_special": false, "parse_special": true, "with_pieces": false} */
typedef struct ks_api_tokenize {
    char *content;              /* never NULL on success */
    bool add_special;           /* prepend the BOS the model's tokenizer adds (default false) */
    bool parse_special;         /* special-token text (<|eot_id|>) becomes its id (default true) */
    bool with_pieces;           /* [{"id", "piece"}] instead of [id] */
} ks_api_tokenize;

/* {"tokens": [id, ...]} */
typedef struct ks_api_detokenize {
    int32_t *tokens;            /* [n_tokens]; NULL when empty */
    int32_t n_tokens;
} ks_api_detokenize;

/* On failure err is filled (400 naming the field, or 503 out of memory) and
 * out is empty; on success free with the matching _free. */
bool ks_api_parse_tokenize(const char *body, size_t len, ks_api_tokenize *out, ks_api_error *err);
void ks_api_tokenize_free(ks_api_tokenize *t);
bool ks_api_parse_detokenize(const char *body, size_t len, ks_api_detokenize *out, ks_api_error *err);
void ks_api_detokenize_free(ks_api_detokenize *d);

#endif
