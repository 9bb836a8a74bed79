/*
 * eval.h — the long-context evaluation harness (src/eval/).  Its whole API is
 * public, in include/kvsieve_eval.h (the CLI's `kvsieve eval` uses nothing
 * else); the module's sources and tests include it through this name.
 */
#ifndef KS_EVAL_H
#define KS_EVAL_H

#include "kvsieve_eval.h"

#endif
