/*
 * tools_api.c — core's part of the public tools API (include/kvsieve_tools.h)
 * that is not already a core function under its public name: the verbosity
 * switch, which hides the engine's log-level enum from applications.
 */
#include "core/core.h"
#include "kvsieve_tools.h"

void ks_log_verbose(bool on) { ks_log_set_level(on ? KS_LOG_DEBUG : KS_LOG_INFO); }
