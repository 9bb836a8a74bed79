/*
 * platform.h — the few facts about the machine that only the operating
 * system can tell, behind one portable call each.
 *
 * x86 CPUs report their extensions through cpuid, which the compiler's
 * __builtin_cpu_supports reads on any OS, so core/simd.c needs no help
 * there.  ARM CPUs do not let user code read their ID registers portably:
 * Linux hands the features to each process in the auxiliary vector
 * (getauxval(AT_HWCAP/AT_HWCAP2)), macOS through sysctl
 * (hw.optional.arm.FEAT_*).  platform.c is the one file that knows either
 * interface, so nothing else in the engine is Linux- or macOS-specific.
 * The same holds for the two memory and file calls POSIX leaves out:
 * transparent huge pages (Linux's madvise(MADV_HUGEPAGE); advice only, so
 * elsewhere nothing) and reserving a file's blocks up front
 * (posix_fallocate, which macOS lacks: fcntl(F_PREALLOCATE) there), and
 * the few facts read from /proc on Linux (resident memory, the executable's
 * path, the CPU's name, available memory) and sysctl or Mach calls on macOS.
 */
#ifndef KS_CORE_PLATFORM_H
#define KS_CORE_PLATFORM_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h> /* off_t */

#ifdef __cplusplus
extern "C" {
#endif

/* ARM features the kernels dispatch on (bits of ks_platform_arm_features). */
enum {
    KS_ARM_ASIMD = 1u << 0,   /* Advanced SIMD (NEON): every AArch64 CPU */
    KS_ARM_DOTPROD = 1u << 1, /* FEAT_DotProd: sdot/udot (Armv8.2, optional; Armv8.4 mandatory) */
    KS_ARM_I8MM = 1u << 2,    /* FEAT_I8MM: smmla/ummla/usdot (Armv8.6) */
};

/* The KS_ARM_* features of this CPU as the OS reports them; 0 on other
 * architectures, or where the OS does not say. */
unsigned ks_platform_arm_features(void);

/* Ask for transparent huge pages on [p, p + n) where the OS offers them
 * (advice: ignored, and harmless, where it does not). */
void ks_platform_advise_huge(void *p, size_t n);

/* Reserve the first bytes of file fd on disk, so later writes cannot fail
 * for space: 0, or an errno value. */
int ks_platform_reserve_file(int fd, off_t bytes);

/* The process's resident memory in bytes (Linux /proc/self/statm, macOS
 * task_info); -1 where the OS does not say. */
long long ks_platform_rss_bytes(void);

/* The running executable's path into buf (Linux /proc/self/exe, macOS
 * _NSGetExecutablePath): true when it fit, false otherwise. */
bool ks_platform_exe_path(char *buf, size_t cap);

/* A human-readable CPU name into buf (x86 Linux: /proc/cpuinfo's model
 * name; AArch64 Linux, which has none: its implementer and part numbers;
 * macOS: machdep.cpu.brand_string); "unknown" where none is found. */
void ks_platform_cpu_name(char *buf, size_t cap);

/* Memory the OS could give this process now, in bytes (Linux
 * MemAvailable; macOS hw.memsize, the total, as it keeps no such figure);
 * 0 where unknown. */
size_t ks_platform_mem_available(void);

/* n <= 256 random bytes from the OS (getentropy, glibc and macOS): true on
 * success. */
bool ks_platform_random(void *p, size_t n);

#ifdef __cplusplus
}
#endif
#endif
