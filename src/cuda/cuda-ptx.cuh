// SPDX-License-Identifier: Apache-2.0
// cuda-ptx.cuh: the PTX instructions that the GEMM kernels issue by inline assembly, one wrapper
// each: mbarriers, bulk tensor copies (TMA) and their stores, cp.async, the proxy fence,
// warpgroup MMA (wgmma) with its descriptors, ldmatrix/stmatrix, and the warp-level mma.sync.
// The wgmma, setmaxnreg and TMA forms need sm_90a; the kernels that use them compile them only
// in that pass (see cuda-wgmma-tiles.cuh).
#pragma once

#include <cuda.h> // CUtensorMap
#include <stdint.h>

// --- mbarriers and bulk tensor copies -------------------------------------------------------------

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}
// Copies the box at (byte k0, row r0) of the tensor map into shared memory, completing on bar.
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap * map, int k0, int r0, uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::
            "r"(dst),
        "l"((uint64_t)map), "r"(k0), "r"(r0), "r"(bar)
        : "memory");
}

// Asynchronous copy of B bytes (4, 8 or 16) from global to shared memory; src_bytes = 0 writes
// zeros without reading (a tap outside the image).
template <int B> __device__ __forceinline__ void cp_async(uint32_t dst, const void * src, uint32_t src_bytes) {
    if (B == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(B), "r"(src_bytes)
                     : "memory");
}
// An arrival on bar once this thread's earlier asynchronous copies have landed (counted among the
// barrier's expected arrivals).
__device__ __forceinline__ void cp_async_arrive(uint32_t bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
// Closes this thread's group of cp.async copies issued since the last commit.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Bulk tensor store of y: the box at (column c0, row r0) of the map from shared memory (rows and
// columns past the tensor's edges are not written), tracked by this thread's bulk groups.
__device__ __forceinline__ void tma_store(const CUtensorMap * map, uint32_t src, int c0, int r0) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"((uint64_t)map),
                 "r"(c0), "r"(r0), "r"(src)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Waits until at most N of this thread's bulk store groups have not yet read their shared memory
// (the older ones' sources may be refilled).
template <int N> __device__ __forceinline__ void tma_store_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
// Waits until this thread's bulk stores are complete.
__device__ __forceinline__ void tma_store_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
// Makes this thread's shared-memory writes visible to the bulk copies issued after it.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// --- warpgroup MMA (wgmma) ------------------------------------------------------------------------

// Shared-memory matrix descriptor of a K-major tile with 128-byte rows in the 128-byte swizzle:
// start address >> 4 (bits 0-13), leading offset 1 (unused for this layout, bits 16-29), stride
// between 8-row groups 1024 bytes >> 4 (bits 32-45), swizzle mode 1 = 128 bytes (bits 62-63).
// Advancing the start address by 32 bytes moves to the next 32-byte K slice of every row.
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
           ((uint64_t)1 << 62);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accumulator reads or writes across an asynchronous MMA.
template <int R> __device__ __forceinline__ void pin(int * d) {
#pragma unroll
    for (int i = 0; i < R; i++) asm volatile("" : "+r"(d[i])::"memory");
}

// One wgmma per (operand type, N): d holds the N/2 accumulators of this thread; scale_d = 0
// overwrites them, 1 accumulates.
#define WG_R0_31                                                                                                       \
    "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
#define WG_R32_63                                                                                                      \
    "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
#define WG_R64_95                                                                                                      \
    "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95"
#define WG_R96_127                                                                                                     \
    "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"
#define WG_O8(i)                                                                                                       \
    "+r"(d[i]), "+r"(d[i + 1]), "+r"(d[i + 2]), "+r"(d[i + 3]), "+r"(d[i + 4]), "+r"(d[i + 5]), "+r"(d[i + 6]),        \
        "+r"(d[i + 7])
#define WG_O32(i) WG_O8(i), WG_O8(i + 8), WG_O8(i + 16), WG_O8(i + 24)
#define WG_PRED(n) "{\n.reg .pred p;\nsetp.ne.b32 p, %" #n ", 0;\n"
#define WG_DEF8(name, instr)                                                                                           \
    __device__ __forceinline__ void name(int * d, uint64_t da, uint64_t db, int sc) {                                  \
        asm volatile(WG_PRED(6) instr " {%0,%1,%2,%3}, %4, %5, p;\n}\n"                                                \
                     : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])                                                  \
                     : "l"(da), "l"(db), "r"(sc));                                                                     \
    }
#define WG_DEF64(name, instr)                                                                                          \
    __device__ __forceinline__ void name(int * d, uint64_t da, uint64_t db, int sc) {                                  \
        asm volatile(WG_PRED(34) instr " {" WG_R0_31 "}, %32, %33, p;\n}\n" : WG_O32(0) : "l"(da), "l"(db), "r"(sc));  \
    }
#define WG_DEF128(name, instr)                                                                                         \
    __device__ __forceinline__ void name(int * d, uint64_t da, uint64_t db, int sc) {                                  \
        asm volatile(WG_PRED(66) instr " {" WG_R0_31 "," WG_R32_63 "}, %64, %65, p;\n}\n"                              \
                     : WG_O32(0), WG_O32(32)                                                                           \
                     : "l"(da), "l"(db), "r"(sc));                                                                     \
    }
#define WG_DEF192(name, instr)                                                                                         \
    __device__ __forceinline__ void name(int * d, uint64_t da, uint64_t db, int sc) {                                  \
        asm volatile(WG_PRED(98) instr " {" WG_R0_31 "," WG_R32_63 "," WG_R64_95 "}, %96, %97, p;\n}\n"                \
                     : WG_O32(0), WG_O32(32), WG_O32(64)                                                               \
                     : "l"(da), "l"(db), "r"(sc));                                                                     \
    }
#define WG_DEF256(name, instr)                                                                                         \
    __device__ __forceinline__ void name(int * d, uint64_t da, uint64_t db, int sc) {                                  \
        asm volatile(WG_PRED(130) instr " {" WG_R0_31 "," WG_R32_63 "," WG_R64_95 "," WG_R96_127                       \
                                        "}, %128, %129, p;\n}\n"                                                       \
                     : WG_O32(0), WG_O32(32), WG_O32(64), WG_O32(96)                                                   \
                     : "l"(da), "l"(db), "r"(sc));                                                                     \
    }
WG_DEF8(wg_b1_8, "wgmma.mma_async.sync.aligned.m64n8k256.s32.b1.b1.and.popc")
WG_DEF64(wg_b1_64, "wgmma.mma_async.sync.aligned.m64n64k256.s32.b1.b1.and.popc")
WG_DEF128(wg_b1_128, "wgmma.mma_async.sync.aligned.m64n128k256.s32.b1.b1.and.popc")
WG_DEF192(wg_b1_192, "wgmma.mma_async.sync.aligned.m64n192k256.s32.b1.b1.and.popc")
WG_DEF256(wg_b1_256, "wgmma.mma_async.sync.aligned.m64n256k256.s32.b1.b1.and.popc")
WG_DEF64(wg_s8_64, "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8")
WG_DEF128(wg_s8_128, "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8")
WG_DEF256(wg_s8_256, "wgmma.mma_async.sync.aligned.m64n256k32.s32.s8.s8")

template <bool BINARY, int BN> __device__ __forceinline__ void wg_mma(int * d, uint64_t da, uint64_t db, int sc) {
    static_assert(BN == 64 || BN == 128 || BN == 256 || (BINARY && BN == 192), "a wgmma width");
    if constexpr (BINARY) {
        if constexpr (BN == 64) wg_b1_64(d, da, db, sc);
        else if constexpr (BN == 128) wg_b1_128(d, da, db, sc);
        else if constexpr (BN == 192) wg_b1_192(d, da, db, sc);
        else wg_b1_256(d, da, db, sc);
    } else {
        if constexpr (BN == 64) wg_s8_64(d, da, db, sc);
        else if constexpr (BN == 128) wg_s8_128(d, da, db, sc);
        else wg_s8_256(d, da, db, sc);
    }
}

// --- ldmatrix / stmatrix ------------------------------------------------------------------------

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t & r0, uint32_t & r1, uint32_t & r2, uint32_t & r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
// Stores four 8 x 8 matrices of 16-bit values from their mma fragments (r_i: matrix i's) to the
// row addresses that lanes 8i .. 8i + 7 give.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
                 "r"(r2), "r"(r3)
                 : "memory");
}

// (a & b) | c in one instruction (the compiler splits it in two when b and c are immediates).
__device__ __forceinline__ uint32_t lop3_and_or(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// --- cp.async and mma.sync (warp-level MMA; sm_80 and later) ---------------------------------------

// Asynchronous 16-byte copy from global to shared memory; valid = false writes zeros. (No memory
// clobber: the callers order it by cp.async.wait_group and a barrier.)
__device__ __forceinline__ void cp_async16(uint32_t smem, const void * gmem, bool valid) {
    const int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(n));
}

// c += A B for one m16n8 tile: binary m16n8k256 .and.popc (BMMA) or int8 m16n8k32 (IMMA), from
// the fragments a0..a3 (A, row-major) and b0, b1 (B, column-major).
template <bool BINARY>
__device__ __forceinline__ void mma_sync(int * c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
    if (BINARY)
        asm volatile("mma.sync.aligned.m16n8k256.row.col.s32.b1.b1.s32.and.popc "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// d += A B for one m16n8 tile of f16 (BF16: bf16) operands with f32 accumulators, m16n8k16, from
// the fragments a[0..3] (A, row-major) and b0, b1 (B, column-major).
template <bool BF16>
__device__ __forceinline__ void mma_sync_f32(float * d, const uint32_t * a, uint32_t b0, uint32_t b1) {
    if (BF16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
