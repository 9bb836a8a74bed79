/*
 * toolcall.h — a model's tool calls, from the syntax its chat template
 * taught it to OpenAI's `tool_calls`, and back the other way when a call is
 * forced.
 *
 * Models write calls in their family's own syntax (ks_tool_syntax in
 * kvsieve.h: Hermes' <tool_call> blocks, Llama 3's JSON, Mistral's
 * [TOOL_CALLS], gpt-oss's harmony channel, DeepSeek's tool tokens).  The
 * parser is a pure function over the answer's text, so its unit tests and
 * the request fuzzer drive it without a model.  It is strict: a call must
 * name one of the request's functions and carry a JSON object of
 * arguments, and if any call in the answer is malformed the whole answer
 * stays text (a model that half-wrote a call has not called anything).
 *
 * tool_choice "required" or a named function is enforced rather than
 * hoped for: the prompt ends with the syntax's opening marker and sampling
 * is constrained (sample/json_constraint.h) to the call's JSON, whose
 * arguments follow the function's `parameters` schema; the text is then
 * closed and parsed as any answer.
 */
#ifndef KS_SERVER_TOOLCALL_H
#define KS_SERVER_TOOLCALL_H

#include "kvsieve.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ks_tool_call {
    char *name;
    char *arguments; /* a JSON object, compact */
} ks_tool_call;

typedef struct ks_tool_parsed {
    char *content;       /* the text outside the calls, trimmed; NULL when empty */
    ks_tool_call *calls; /* [n_calls] */
    int32_t n_calls;
} ks_tool_parsed;

/* The calls in text[len] written in syntax syn, for functions named
 * names[n_names] (NULL-terminated strings).  No calls (none written, or
 * any malformed): n_calls 0 and content a copy of the whole text.  false
 * only on a refused allocation (out is then empty). */
bool ks_tool_parse(ks_tool_syntax syn, const char *text, size_t len, const char *const *names, int32_t n_names,
                   ks_tool_parsed *out);
void ks_tool_parsed_free(ks_tool_parsed *p);

/* How many leading bytes of a streamed answer text[len] may be sent as
 * content now: those before the first place a call could begin (a marker,
 * or the start of one at the end of the text; for the JSON syntaxes, an
 * answer that opens with '{'). */
size_t ks_tool_stream_safe(ks_tool_syntax syn, const char *text, size_t len);

/* A forced call (tool_choice required, or the function `name`; NULL: any
 * of tools): *opener goes at the end of the prompt, *schema (JSON Schema
 * text) constrains the answer, and *parse_as parses opener + answer +
 * *closer.  tools: the request's OpenAI tools array (checked).  All three
 * strings malloc'd; false on a refused allocation or a bad tools text. */
bool ks_tool_forced(ks_tool_syntax syn, const char *tools, const char *name, char **opener, char **schema,
                    char **closer, ks_tool_syntax *parse_as);

const char *ks_tool_syntax_name(ks_tool_syntax syn);

#endif
