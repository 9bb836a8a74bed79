/*
 * tokenizer.h — text <-> token ids for the two vocabulary families GGUF
 * files carry: SentencePiece-style BPE with scores ("llama") and byte-level
 * BPE with a merge list ("gpt2").
 *
 * Why a module of its own, and why it copies the vocabulary: the model owns
 * a mapping of the weights, but a tokenizer is also wanted on its own (the
 * CLI's `tokenize` command, vocabulary-only files, tests against reference
 * ids), and it must outlive whatever GGUF handle it came from.  So creation
 * validates every tokenizer key once — lengths agree, ids are in range,
 * strings are UTF-8 — and copies what encoding needs into flat arrays and
 * hash tables; after that no call can fail on malformed metadata.
 *
 * Behaviour follows the reference implementation the fixtures were produced
 * with (llama.cpp's test-tokenizer-0), because "the same ids as everyone
 * else" is the only definition of correct a tokenizer has: user-defined
 * tokens are always matched as whole tokens, control tokens only when the
 * caller asks (parse_special), SPM text gets the leading-space prefix, and
 * merging is greedy by score (SPM) or rank (BPE) through a priority queue so
 * that 32K-token prompts cost O(n log n).
 */
#ifndef KS_TOKENIZER_H
#define KS_TOKENIZER_H

#include "core/core.h"
#include "gguf/gguf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ks_tokenizer ks_tokenizer;

/* Read and validate the tokenizer.* keys of g.  Copies what it needs: g may
 * be closed afterwards.  KS_ERR_FORMAT (missing/inconsistent metadata: no
 * tokens, array lengths that disagree, a special id outside the vocabulary
 * — except -1/0xFFFFFFFF, the converters' "none" — invalid UTF-8, a gpt2
 * vocabulary without merges), KS_ERR_UNSUPPORTED (a tokenizer model other
 * than "llama"/"gpt2").  An unknown tokenizer.ggml.pre logs a warning and
 * uses the gpt-2 split rules.
 *
 * Every function below takes a const tokenizer and keeps its scratch on the
 * call, so one tokenizer may serve any number of threads at once. */
ks_status ks_tokenizer_create(const ks_gguf *g, ks_tokenizer **out);
void ks_tokenizer_destroy(ks_tokenizer *t);

int32_t ks_tokenizer_n_vocab(const ks_tokenizer *t);

/* Encode UTF-8 text (invalid UTF-8 is tolerated: it ends up in byte tokens).
 * *n_out receives the number of ids; if it exceeds cap the call fails with
 * KS_ERR_INVALID_ARG and *n_out holds the needed size (ids may be NULL when
 * cap is 0, to query the size).  add_bos adds the BOS id only if the vocab
 * has one and its metadata asks for it (tokenizer.ggml.add_bos_token).
 * parse_special: text equal to a control/unknown token string (e.g.
 * "<|eot_id|>") becomes that id; user-defined tokens are always matched. */
ks_status ks_tokenizer_encode(const ks_tokenizer *t, const char *text, size_t len, bool add_bos,
                              bool parse_special, int32_t *ids, size_t cap, size_t *n_out);

/* Decoded bytes of one token: SPM U+2581 -> ' ', <0xNN> -> the byte, GPT-2
 * byte alphabet reversed; control/user-defined tokens -> their text.  Writes
 * *n_out bytes (plus a NUL if room remains; pieces may contain NUL bytes).
 * cap too small: KS_ERR_INVALID_ARG with *n_out = bytes needed.  Bad id:
 * KS_ERR_INVALID_ARG. */
ks_status ks_tokenizer_piece(const ks_tokenizer *t, int32_t id, char *buf, size_t cap,
                             size_t *n_out);

/* Raw vocabulary string of a token (not decoded), NULL if id is out of range. */
const char *ks_tokenizer_token_text(const ks_tokenizer *t, int32_t id, size_t *len);
/* Id of an exact vocabulary string, -1 if absent. */
int32_t ks_tokenizer_find(const ks_tokenizer *t, const char *text, size_t len);

int32_t ks_tokenizer_bos(const ks_tokenizer *t); /* -1 if none */
int32_t ks_tokenizer_eos(const ks_tokenizer *t); /* -1 if none */
/* End of generation: eos, eot, eom, and control tokens named like
 * <|eot_id|>, <|im_end|>, <|end_of_text|>, <|endoftext|>, <|end|>. */
bool ks_tokenizer_is_eog(const ks_tokenizer *t, int32_t id);

typedef enum {
    KS_CHAT_NONE,
    KS_CHAT_LLAMA3, /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
    KS_CHAT_CHATML, /* <|im_start|>role\n...<|im_end|>\n */
    KS_CHAT_LLAMA2, /* [INST] <<SYS>>...<</SYS>> ... [/INST] */
    KS_CHAT_PHI3    /* <|system|>\n...<|end|>\n<|user|>\n...<|end|>\n<|assistant|>\n */
} ks_chat_family;

/* From tokenizer.chat_template if present, else from the vocab's special
 * tokens; KS_CHAT_NONE if neither says. */
ks_chat_family ks_tokenizer_chat_family(const ks_tokenizer *t);
const char *ks_chat_family_name(ks_chat_family f);

/* One user turn (system may be NULL or "") formatted in the model's family,
 * ending with the assistant header so generation continues as the
 * assistant.  The BOS token is not written: encode the prompt with
 * add_bos = true and parse_special = true.  Writes a NUL-terminated string;
 * *n_out = its length without the NUL.  cap too small: KS_ERR_INVALID_ARG
 * with *n_out = bytes needed including the NUL.  KS_ERR_UNSUPPORTED if the
 * family is KS_CHAT_NONE. */
ks_status ks_tokenizer_chat_format(const ks_tokenizer *t, const char *system, const char *user,
                                   char *buf, size_t cap, size_t *n_out);

/* A whole conversation (ks_chat_message, kvsieve.h) rendered by the GGUF's
 * own chat template when it has one this interpreter runs, else in the
 * model's family, ending with the generation prompt (tokenizer_chat.c has
 * the order and the fallbacks).  Same contract as ks_tokenizer_chat_format
 * otherwise, plus: KS_ERR_INVALID_ARG with *n_out untouched when the
 * template rejects the conversation (raise_exception; the message is the
 * template's), and KS_ERR_FORMAT when it fails and no family is known. */
ks_status ks_tokenizer_chat_render(const ks_tokenizer *t, const ks_chat_message *msgs, size_t n_msgs, char *buf,
                                   size_t cap, size_t *n_out);
/* The same with tools (an OpenAI tools JSON array, NULL: none): the
 * template gets them as `tools`, and messages their tool_calls (arguments
 * given as a JSON string become the object templates iterate),
 * tool_call_id and name; a family renders them the Hermes way
 * (tokenizer_chat.c). */
ks_status ks_tokenizer_chat_render_tools(const ks_tokenizer *t, const ks_chat_message *msgs, size_t n_msgs,
                                         const char *tools, char *buf, size_t cap, size_t *n_out);
/* The tool-call syntax of the model's template (ks_chat_tool_syntax). */
ks_tool_syntax ks_tokenizer_tool_syntax(const ks_tokenizer *t);
/* The same for a given family; bos_text / eos_text: the vocabulary's BOS and
 * EOS token texts, which llama2 writes between turns (NULL: none).  Pure
 * string building, for tests of every family without a vocabulary. */
ks_status ks_chat_render_family(ks_chat_family fam, const char *bos_text, const char *eos_text,
                                const ks_chat_message *msgs, size_t n_msgs, char *buf, size_t cap,
                                size_t *n_out);

#endif
