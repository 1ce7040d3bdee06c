// SPDX-License-Identifier: Apache-2.0
// cpu-isa.c: which x86 instruction sets this machine has (CPUID + XGETBV), and the
// BIE_CPU_ISA environment cap.
#include "bie-impl.h"

#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static unsigned long long xgetbv0(void) {
    unsigned int eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((unsigned long long)edx << 32) | eax;
}

static enum bie_cpu_isa detect(void) {
    unsigned int a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return BIE_CPU_ISA_SCALAR;
    const bool osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1, popcnt = (c >> 23) & 1,
               f16c = (c >> 29) & 1;
    if (!osxsave || !avx || !popcnt) return BIE_CPU_ISA_SCALAR;
    const unsigned long long xcr0 = xgetbv0();
    if ((xcr0 & 0x6) != 0x6) return BIE_CPU_ISA_SCALAR; // XMM and YMM state
    if (__get_cpuid_max(0, NULL) < 7) return BIE_CPU_ISA_SCALAR;
    __cpuid_count(7, 0, a, b, c, d);
    const bool avx2 = (b >> 5) & 1, bmi2 = (b >> 8) & 1;
    if (!avx2 || !fma || !f16c || !bmi2) return BIE_CPU_ISA_SCALAR;
    const bool avx512f = (b >> 16) & 1, avx512bw = (b >> 30) & 1, avx512vl = (b >> 31) & 1, avx512dq = (b >> 17) & 1;
    const bool zmm_state = (xcr0 & 0xe6) == 0xe6; // opmask, ZMM_Hi256, Hi16_ZMM + XMM/YMM
    if (!(avx512f && avx512bw && avx512vl && avx512dq && zmm_state)) return BIE_CPU_ISA_AVX2;
    const bool vpopcntdq = (c >> 14) & 1, bitalg = (c >> 12) & 1, vnni = (c >> 11) & 1;
    if (vpopcntdq && bitalg) return vnni ? BIE_CPU_ISA_AVX512_VNNI : BIE_CPU_ISA_AVX512_VPOPCNT;
    return BIE_CPU_ISA_AVX512;
}

// AVX512-VNNI on its own (CPUID leaf 7, ECX bit 11), which some AVX-512 machines have without
// VPOPCNTDQ; the OS support for ZMM state is part of the AVX-512 levels.
static bool has_vnni(void) {
    unsigned a, b, c, d;
    if (__get_cpuid_max(0, NULL) < 7) return false;
    __cpuid_count(7, 0, a, b, c, d);
    return (c >> 11) & 1;
}
#else
static enum bie_cpu_isa detect(void) { return BIE_CPU_ISA_SCALAR; }
static bool has_vnni(void) { return false; }
#endif

enum bie_cpu_isa bie_cpu_isa_detected(void) {
    static int cached = -1; // benign race: every thread computes the same value
    if (cached < 0) cached = (int)detect();
    return (enum bie_cpu_isa)cached;
}

const char * bie_cpu_isa_name(enum bie_cpu_isa isa) {
    switch (isa) {
    case BIE_CPU_ISA_SCALAR: return "scalar";
    case BIE_CPU_ISA_AVX2: return "avx2";
    case BIE_CPU_ISA_AVX512: return "avx512";
    case BIE_CPU_ISA_AVX512_VPOPCNT: return "avx512vpopcnt";
    case BIE_CPU_ISA_AVX512_VNNI: return "avx512vnni";
    case BIE_CPU_ISA_BEST: return "best";
    }
    return "?";
}

// Every level, in order, and BEST.
static const enum bie_cpu_isa levels[] = {BIE_CPU_ISA_SCALAR,         BIE_CPU_ISA_AVX2,        BIE_CPU_ISA_AVX512,
                                          BIE_CPU_ISA_AVX512_VPOPCNT, BIE_CPU_ISA_AVX512_VNNI, BIE_CPU_ISA_BEST};

enum bie_status bie_cpu_isa_from_name(const char * name, enum bie_cpu_isa * out) {
    if (!name || !out) return BIE_STATUS_INVALID_ARGUMENT;
    for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++)
        if (strcmp(name, bie_cpu_isa_name(levels[i])) == 0) {
            *out = levels[i];
            return BIE_STATUS_OK;
        }
    return BIE_STATUS_INVALID_ARGUMENT;
}

enum bie_cpu_isa bie_cpu_isa_cap_from_env(enum bie_cpu_isa isa) {
    const char * env = getenv("BIE_CPU_ISA");
    enum bie_cpu_isa cap;
    if (!env || !*env || bie_cpu_isa_from_name(env, &cap) != BIE_STATUS_OK)
        return isa; // (unknown names are ignored, as the README says)
    return cap < isa ? cap : isa;
}

bool bie_cpu_has_vnni(enum bie_cpu_isa cap) {
    static int cached = -1; // benign race: every thread computes the same value
    if (cached < 0) cached = has_vnni();
    return cached && cap >= BIE_CPU_ISA_AVX512_VNNI;
}
