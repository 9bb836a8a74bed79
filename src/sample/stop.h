/*
 * stop.h — stop strings for streaming generation.
 *
 * A streaming CLI prints each token's text as soon as it is decoded, but a
 * stop string ("</s>", "\nUser:") may arrive split across several tokens,
 * and a multi-byte UTF-8 character may be split too.  Printing eagerly would
 * leak the first half of a stop string or a broken character to the user.
 * The matcher therefore sits between the detokenizer and the output: every
 * piece goes in, and what comes out is only text that can no longer become
 * part of a stop string and ends on a character boundary.  The rest is held
 * back until later pieces decide it (released, or swallowed by a match), or
 * until ks_stop_flush at the end of generation.
 *
 * Usage:
 *     ks_stop_matcher *m;  ks_stop_create(stops, n, &m);
 *     for each token:  ks_stop_feed(m, piece, len, &o);
 *                      fwrite(o.text, 1, o.len, stdout);
 *                      if (o.matched) break;
 *     if (!o.matched) { ks_stop_flush(m, &o); fwrite(o.text, 1, o.len, stdout); }
 *     ks_stop_destroy(m);
 *
 * Matching is by bytes.  When several stop strings complete in the same feed
 * the one that starts earliest wins (then the lowest index).  A stop string
 * may end inside a piece; bytes of the piece after the match are discarded.
 */
#ifndef KS_STOP_H
#define KS_STOP_H

#include "core/core.h"
#include "kvsieve_tools.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The matcher (ks_stop_matcher, ks_stop_out, create / destroy / reset / feed /
 * flush) is public: kvsieve_tools.h.  What follows is the engine's own. */

/* Stateless helpers (also used by the matcher). */
/* Length of the longest suffix of text[len] that is a proper prefix of any stop string. */
size_t ks_stop_partial_len(const char *const *stops, size_t n_stops, const char *text, size_t len);
/* Bytes at the end of text[len] that form an incomplete (so far valid) UTF-8 sequence: 0..3. */
size_t ks_utf8_incomplete_tail(const char *text, size_t len);

#endif
