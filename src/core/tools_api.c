/*
 * tools_api.c — core's part of the public tools API (include/kvsieve_tools.h)
 * that is not already a core function under its public name: the verbosity
 * switch, which hides the engine's log-level enum from applications, and
 * the host facts of core/platform.c, so the CLI reads no /proc itself.
 */
#include "core/core.h"
#include "core/platform.h"
#include "kvsieve_tools.h"

void ks_log_verbose(bool on) { ks_log_set_level(on ? KS_LOG_DEBUG : KS_LOG_INFO); }

void ks_host_cpu_name(char *buf, size_t cap) { ks_platform_cpu_name(buf, cap); }
size_t ks_host_mem_available(void) { return ks_platform_mem_available(); }
bool ks_host_exe_path(char *buf, size_t cap) { return ks_platform_exe_path(buf, cap); }
