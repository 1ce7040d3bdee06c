// SPDX-License-Identifier: Apache-2.0
// cpu-gemv-scalar.c: the portable matrix-vector kernels (no ISA flags; contract in cpu-gemv.h).
// A weight row is read once for all m activation rows: each 64-bit word (binary) or byte (n-bit)
// of it is combined with the same word of every activation row before the next is loaded.
#include "cpu/cpu-gemv.h"

// Set bits of a 64-bit word (SWAR: this file is built without the popcnt instruction).
static inline uint64_t popc64(uint64_t v) {
    v = v - ((v >> 1) & 0x5555555555555555ull);
    v = (v & 0x3333333333333333ull) + ((v >> 2) & 0x3333333333333333ull);
    v = (v + (v >> 4)) & 0x0f0f0f0f0f0f0f0full;
    return (v * 0x0101010101010101ull) >> 56;
}

static void b1(const uint8_t * a, size_t lda, int m, const uint8_t * w, size_t ldw, int64_t n, size_t kb, int32_t * c,
               size_t ldc) {
    for (int64_t j = 0; j < n; j++) {
        const uint8_t * wj = w + (size_t)j * ldw;
        uint64_t s[CPU_GEMV_MR] = {0};
        size_t t = 0;
        for (; t + 8 <= kb; t += 8) {
            uint64_t wv;
            memcpy(&wv, wj + t, 8);
            for (int i = 0; i < m; i++) {
                uint64_t av;
                memcpy(&av, a + (size_t)i * lda + t, 8);
                s[i] += popc64(av ^ wv);
            }
        }
        for (; t < kb; t++)
            for (int i = 0; i < m; i++) s[i] += popc64((uint64_t)(a[(size_t)i * lda + t] ^ wj[t]));
        for (int i = 0; i < m; i++) c[(size_t)i * ldc + (size_t)j] = (int32_t)s[i];
    }
}

static void s4(const int8_t * a, size_t lda, const int32_t * asum, int m, const uint8_t * w, size_t ldw, int64_t n,
               size_t kb, int32_t * c, size_t ldc) {
    (void)asum;
    const size_t kp = cpu_round_up(kb, CPU_GEMV_ALIGN);
    for (int64_t j = 0; j < n; j++) {
        const uint8_t * wj = w + (size_t)j * ldw;
        uint32_t s[CPU_GEMV_MR] = {0};
        for (size_t t = 0; t < kb; t++) {
            const int32_t hi = (int8_t)wj[t] >> 4, lo = (int8_t)(uint8_t)(wj[t] << 4) >> 4;
            for (int i = 0; i < m; i++) {
                const int8_t * ai = a + (size_t)i * lda;
                s[i] += (uint32_t)(hi * ai[t] + lo * ai[kp + t]);
            }
        }
        for (int i = 0; i < m; i++) c[(size_t)i * ldc + (size_t)j] = (int32_t)s[i];
    }
}

static void s8(const int8_t * a, size_t lda, const int32_t * asum, int m, const int8_t * w, size_t ldw, int64_t n,
               size_t k, int32_t * c, size_t ldc) {
    (void)asum;
    for (int64_t j = 0; j < n; j++) {
        const int8_t * wj = w + (size_t)j * ldw;
        uint32_t s[CPU_GEMV_MR] = {0};
        for (size_t t = 0; t < k; t++)
            for (int i = 0; i < m; i++) s[i] += (uint32_t)(wj[t] * a[(size_t)i * lda + t]);
        for (int i = 0; i < m; i++) c[(size_t)i * ldc + (size_t)j] = (int32_t)s[i];
    }
}

const struct cpu_gemv_kernels bie_cpu_gemv_scalar = {.name = "scalar", .b1 = b1, .s4 = s4, .s8 = s8};
