/*
 * platform.c — OS-specific queries (core/platform.h): which ARM extensions
 * this CPU has.
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
#define _GNU_SOURCE /* getauxval, madvise, posix_fallocate: glibc declares them in C11 mode only with this */
#endif
#include "core/platform.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

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
