/*
 * jinja.h — the subset of Jinja2 that published chat templates use, so a
 * GGUF's own tokenizer.chat_template can be executed instead of guessed.
 *
 * The reference is Python jinja2 as Hugging Face transformers'
 * apply_chat_template configures it: trim_blocks and lstrip_blocks on,
 * keep_trailing_newline off, the loopcontrols extension (break/continue),
 * a `tojson` that is json.dumps(ensure_ascii=False) and the global
 * raise_exception(msg).  What is supported is listed in jinja.c's opening
 * essay; anything else is a parse or render error naming the line, never
 * silently different output.
 *
 * Template text and the variables are untrusted (a GGUF from anywhere, a
 * request's messages): parsing and rendering are bounded in nesting depth,
 * evaluation steps and output size, and every failure is a status.
 */
#ifndef KS_JINJA_H
#define KS_JINJA_H

#include "core/core.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ks_jinja ks_jinja;

/* Parse template text (need not be NUL-terminated).  KS_ERR_FORMAT with
 * "template line N: ..." for a syntax error or an unsupported construct,
 * KS_ERR_NOMEM. */
ks_status ks_jinja_parse(const char *src, size_t len, ks_jinja **out);
void ks_jinja_destroy(ks_jinja *t);

/* Render with the members of the JSON object vars[len] as the template's
 * variables (e.g. {"messages":[...],"add_generation_prompt":true,
 * "bos_token":"<s>"}).  *out receives a NUL-terminated ks_malloc'd string
 * the caller ks_frees, *n_out its length.  now: the Unix time
 * strftime_now(fmt) formats (in UTC), passed in so tests are reproducible.  Errors: KS_ERR_INVALID_ARG when
 * vars is not a JSON object or the template called raise_exception (the
 * message is the template's: it rejects the conversation), KS_ERR_FORMAT
 * for a runtime error of the template (a type error, an undefined value
 * used as an object, a limit exceeded), KS_ERR_NOMEM. */
ks_status ks_jinja_render(const ks_jinja *t, const char *vars, size_t len, int64_t now, char **out,
                          size_t *n_out);

#endif
