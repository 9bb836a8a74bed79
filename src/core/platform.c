/*
 * platform.c — OS-specific queries (core/platform.h): which ARM extensions
 * this CPU has, and the few process and machine facts that Linux keeps in
 * /proc and macOS behind sysctl and Mach calls.
 *
 * Linux: the kernel publishes HWCAP bits in the auxiliary vector; asimddp
 * (dot product) is in AT_HWCAP, i8mm in AT_HWCAP2.  The bit values are the
 * kernel's ABI (arch/arm64/include/uapi/asm/hwcap.h); they are defined
 * here when an older <asm/hwcap.h> lacks them, because the ABI never changes
 * and a binary built against old headers must still see a new CPU's features.
 * macOS: sysctlbyname("hw.optional.arm.FEAT_DotProd") and "...FEAT_I8MM"
 * answer 1 or 0 (absent on old releases: treated as 0).  Every Apple silicon
 * CPU has NEON, and every AArch64 CPU does, so ASIMD is set unconditionally
 * on AArch64.  Anything else (x86, another OS) answers 0: those builds never
 * compile an ARM kernel.
 */
#if defined(__linux__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE /* getauxval, madvise, posix_fallocate, getentropy: glibc declares them in C11 mode only with this */
#endif
#include "core/platform.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#if defined(__APPLE__)
#include <mach-o/dyld.h> /* _NSGetExecutablePath */
#include <mach/mach.h>   /* task_info */
#include <sys/random.h>  /* getentropy */
#include <sys/sysctl.h>
#endif

void ks_platform_advise_huge(void *p, size_t n) {
#if defined(MADV_HUGEPAGE)
    (void)madvise(p, n, MADV_HUGEPAGE); /* advice only: failure is fine */
#else
    (void)p, (void)n;
#endif
}

int ks_platform_reserve_file(int fd, off_t bytes) {
#if defined(__APPLE__)
    /* F_PREALLOCATE reserves space (contiguous if it can, else any), then
     * the length is set: posix_fallocate's effect */
    fstore_t st = {F_ALLOCATECONTIG, F_PEOFPOSMODE, 0, bytes, 0};
    if (fcntl(fd, F_PREALLOCATE, &st) == -1) {
        st.fst_flags = F_ALLOCATEALL;
        if (fcntl(fd, F_PREALLOCATE, &st) == -1) return errno;
    }
    return ftruncate(fd, bytes) == 0 ? 0 : errno;
#else
    return posix_fallocate(fd, 0, bytes);
#endif
}

long long ks_platform_rss_bytes(void) {
#if defined(__linux__)
    long pages = 0, rss = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return -1;
    int got = fscanf(f, "%ld %ld", &pages, &rss);
    fclose(f);
    return got == 2 ? (long long)rss * sysconf(_SC_PAGESIZE) : -1;
#elif defined(__APPLE__)
    struct mach_task_basic_info info;
    mach_msg_type_number_t n = MACH_TASK_BASIC_INFO_COUNT;
    if (task_info(mach_task_self(), MACH_TASK_BASIC_INFO, (task_info_t)&info, &n) != KERN_SUCCESS) return -1;
    return (long long)info.resident_size;
#else
    return -1;
#endif
}

bool ks_platform_exe_path(char *buf, size_t cap) {
    if (!buf || cap < 2) return false;
#if defined(__linux__)
    ssize_t n = readlink("/proc/self/exe", buf, cap - 1);
    if (n <= 0 || (size_t)n >= cap - 1) return false; /* a cut path is no path */
    buf[n] = 0;
    return true;
#elif defined(__APPLE__)
    uint32_t size = (uint32_t)(cap > UINT32_MAX ? UINT32_MAX : cap);
    return _NSGetExecutablePath(buf, &size) == 0;
#else
    return false;
#endif
}

/* the text after "key<spaces>:" of /proc/cpuinfo's first such line, or false */
#if defined(__linux__)
static bool ks_platform_cpuinfo(const char *key, char *out, size_t cap) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return false;
    char line[512];
    bool found = false;
    const size_t kl = strlen(key);
    while (!found && fgets(line, sizeof line, f)) {
        if (strncmp(line, key, kl) || (line[kl] != ' ' && line[kl] != '\t' && line[kl] != ':')) continue;
        const char *v = strchr(line, ':');
        if (!v) break;
        v++;
        while (*v == ' ' || *v == '\t') v++;
        size_t n = strcspn(v, "\n"), k = 0;
        for (size_t i = 0; i < n && k + 1 < cap; i++)
            if (v[i] != '"' && v[i] != '\\') out[k++] = v[i]; /* stays a valid JSON string */
        out[k] = '\0';
        found = k > 0;
    }
    fclose(f);
    return found;
}
#endif

void ks_platform_cpu_name(char *buf, size_t cap) {
    if (!buf || !cap) return;
    snprintf(buf, cap, "unknown");
#if defined(__linux__)
    if (ks_platform_cpuinfo("model name", buf, cap)) return;
    char impl[32], part[32];
    if (ks_platform_cpuinfo("CPU implementer", impl, sizeof impl) && ks_platform_cpuinfo("CPU part", part, sizeof part))
        snprintf(buf, cap, "AArch64 implementer %s part %s", impl, part); /* e.g. 0x41 0xd0c: Arm Neoverse N1 */
#elif defined(__APPLE__)
    size_t len = cap;
    if (sysctlbyname("machdep.cpu.brand_string", buf, &len, NULL, 0) != 0) snprintf(buf, cap, "unknown");
#endif
}

size_t ks_platform_mem_available(void) {
#if defined(__linux__)
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    size_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %zu kB", &kb) == 1) break;
    fclose(f);
    return kb * 1024;
#elif defined(__APPLE__)
    uint64_t bytes = 0;
    size_t len = sizeof bytes;
    return sysctlbyname("hw.memsize", &bytes, &len, NULL, 0) == 0 ? (size_t)bytes : 0;
#else
    return 0;
#endif
}

bool ks_platform_random(void *p, size_t n) { return n <= 256 && getentropy(p, n) == 0; }

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1UL << 20)
#endif
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1UL << 13)
#endif
#ifndef AT_HWCAP2
#define AT_HWCAP2 26
#endif

unsigned ks_platform_arm_features(void) {
    unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
    unsigned f = KS_ARM_ASIMD;
    if (hw & HWCAP_ASIMDDP) f |= KS_ARM_DOTPROD;
    if (hw2 & HWCAP2_I8MM) f |= KS_ARM_I8MM;
    return f;
}

#elif defined(__aarch64__) && defined(__APPLE__)
#include <sys/sysctl.h>
#include <sys/types.h>

static int ks_platform_sysctl_flag(const char *name) {
    int v = 0;
    size_t len = sizeof v;
    if (sysctlbyname(name, &v, &len, NULL, 0) != 0) return 0;
    return v != 0;
}

unsigned ks_platform_arm_features(void) {
    unsigned f = KS_ARM_ASIMD;
    if (ks_platform_sysctl_flag("hw.optional.arm.FEAT_DotProd")) f |= KS_ARM_DOTPROD;
    if (ks_platform_sysctl_flag("hw.optional.arm.FEAT_I8MM")) f |= KS_ARM_I8MM;
    return f;
}

#elif defined(__aarch64__)
unsigned ks_platform_arm_features(void) { return KS_ARM_ASIMD; } /* NEON is architectural; extensions unknown */

#else
unsigned ks_platform_arm_features(void) { return 0; }
#endif
