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
 */
#ifndef KS_CORE_PLATFORM_H
#define KS_CORE_PLATFORM_H

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

#ifdef __cplusplus
}
#endif
#endif
