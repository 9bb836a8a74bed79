/*
 * args.h — tiny option parsing shared by the subcommands.  Values are checked
 * strictly (whole string numeric, inside range) so a typo is a usage error,
 * never a silently different run.
 */
#ifndef KS_APP_ARGS_H
#define KS_APP_ARGS_H

#include "kvsieve.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Parses an integer in [lo, hi]; false (with a message on stderr) otherwise. */
bool arg_long(const char *cmd, const char *flag, const char *s, long lo, long hi, long *out);
bool arg_float(const char *cmd, const char *flag, const char *s, double lo, double hi, float *out);
/* --kv-type: "f16", or "q8" / "q8_0"; false (with a message) otherwise. */
bool arg_kv_type(const char *cmd, const char *s, ks_kv_type *out);
/* Returns argv[*i + 1] and advances *i, or NULL with a message if missing. */
const char *arg_value(const char *cmd, int argc, char **argv, int *i);
/* Comma-separated list of integers into out[cap]; returns the count or -1. */
int arg_long_list(const char *cmd, const char *flag, const char *s, long lo, long hi, long *out, int cap);
/* Reads a whole file; NULL with a message on failure.  Caller frees. */
char *app_read_file(const char *cmd, const char *path, size_t *len);
/* Default model path when -m is not given (KVSIEVE_MODEL or the bundled one). */
const char *app_default_model(void);

#endif
