// SPDX-License-Identifier: Apache-2.0
// cuda-gemm-wgmma.cu: the Hopper (sm_90a) tensor-core GEMM of the forward pass: the same
// operands, accumulators and fused epilogue as cuda-gemm.cu (whose header comment gives the
// math), computed with warpgroup MMA fed by the tensor-memory accelerator.
//
//   binary: wgmma m64nNk256 .s32.b1.b1.and.popc (BGMMA in SASS, ~16 POPS on H100);
//   n-bit:  wgmma m64nNk32 .s32.s8.s8 (IGMMA) on the int8 codes.
// Both read 32 bytes of every row per instruction, so one shared-memory layout serves both.
//
// Layout: a CTA computes a BM x BN tile of C (BN = 128, 192 or 256 with BM = 128; BN = 64 with BM =
// 256): warpgroup 0 is the producer (one thread issues the bulk tensor copies), the others (two, or
// four for BN = 64) are the consumers, each owning 64 rows of the tile and BN/2 accumulators per
// thread. Binary 128 x 192 tiles add epilogue warps that finish and store each tile while the
// consumers compute the next (SPLIT, below); binary 256-column tiles are 64 x 256, each the whole
// work of one consumer warpgroup, the two taking turns (PP, below).
// K advances 128 bytes per stage through a ring of STAGES stages; each stage holds the A tile
// (BM rows) and the B tile (BN rows), 128 bytes per row, in the 128-byte swizzle that the copy
// engine writes and the MMA descriptors read (16-byte chunk c of row r lives at chunk c ^ (r % 8)).
// A stage is "full" when its copies have landed (an mbarrier counting bytes) and "empty" when
// all consumer warps have finished the MMAs that read it (an mbarrier counting arrivals).
// The grid is persistent: CTA b takes tiles b, b + grid, ... (m fastest), and the producer runs
// ahead into the next tile while the last one is stored. Rows past M or N are
// zero-filled by the copy engine and never stored. The popcount terms of the epilogue are loaded
// before a tile's MMAs and finished values leave through a per-warp shared-memory buffer as whole
// 128-byte row segments (see epilogue()): with 4-byte fragment stores and in-loop loads the
// epilogue would take longer than the MMAs. After a kernel that only wrote those terms
// (ep.terms_last) the GEMM is a programmatic dependent launch: it starts under that kernel and
// waits for it just before its first epilogue; after one that wrote an operand too
// (ep.operands_last), the producer also waits for it before its first load.
#include "cuda-epilogue.cuh"

#include <cuda.h> // CUtensorMap and its enums (the encoder is fetched from the driver at run time)
#include <stdlib.h>
#include <string.h>

#include <type_traits>

namespace {

constexpr int BK = 128;       // bytes of K per stage (1024 bits / 128 int8 codes)

// Consumer warpgroups per CTA, by tile width: 64-column tiles (convs with 64 channels, where
// K is short and a tile is one or two stages) take four, 256 x 64 tiles, so that twice the warps
// hide each tile's latency; wider tiles take two (their accumulators need the registers).
__host__ __device__ constexpr int cw_for(int bn) { return bn == 64 ? 4 : 2; }
// Binary 64 x 256 tiles (PP, ping-pong): each consumer warpgroup owns whole tiles (the CTA's tiles
// alternate between the two), and their main loops take turns, so that one warpgroup's epilogue
// runs while the other's MMAs keep the tensor cores busy (cooperative 128 x 256 tiles stop the
// tensor cores through every epilogue).
__host__ __device__ constexpr bool pp_for(bool binary, int bn) { return binary && bn == 256; }
__host__ __device__ constexpr int bm_for(bool binary, int bn) { // rows of A per tile
    return pp_for(binary, bn) ? 64 : 64 * cw_for(bn);
}
// Binary 128 x 192 tiles (large binary GEMMs) have epilogue warps (SPLIT): the consumers leave
// their accumulators in shared memory (popcounts, below 2^16 when K is, as the 16-bit halves of
// words: the dump) with the tile's popcount terms, and go on to the next tile's MMAs while
// seven epilogue warps (a fourth warpgroup and the producer warpgroup's three idle warps) finish
// and store them, so that the tensor cores do not wait through the epilogue (four epilogue warps
// are too few to keep up). 192 columns, because a wgmma's accumulators must fit the 128 registers per thread of a
// 512-thread launch (ptxas refuses m64n256 there). Elsewhere each consumer warp finishes its own
// accumulators.
constexpr int64_t SPLIT_MAX_KTILES = 63; // 63 * 1024 bits: the largest popcount fits 16 bits
// With few tiles per SM the last tile's epilogue, which nothing overlaps, and the partial last
// round weigh more than the overlap gains, so such GEMMs (4096^3 among them) take the 64 x 256
// ping-pong tiles.
constexpr int64_t SPLIT_MIN_ROUNDS = 12;
__host__ __device__ constexpr bool split_for(bool binary, int bn) { return binary && bn == 192; }
__host__ __device__ constexpr int threads_for(bool binary, int bn) { // + the producer (+ the epilogue)
    return 128 * (1 + cw_for(bn) + (split_for(binary, bn) ? 1 : 0));
}
__host__ __device__ constexpr int ring_for(bool binary, int bn) { // stage ring bytes
    return bn == 64 || split_for(binary, bn) ? 163840 : pp_for(binary, bn) ? 204800 : 196608;
}
__host__ __device__ constexpr int dump_for(bool binary, int bn) { return split_for(binary, bn) ? bm_for(binary, bn) * bn * 2 : 0; }
__host__ __device__ constexpr int epilogue_warps(bool binary, int bn) { return split_for(binary, bn) ? 7 : 4 * cw_for(bn); }
// Registers per thread after setmaxnreg: the producer gives up its registers above 40, and the
// consumers take them (the launch gives every thread 65536 / threads_for, rounded down to 8).
// SPLIT: the two warpgroups of epilogue warps give up 8 of their 128, and the consumers take them.
constexpr int PRODUCER_REGS = 40, SPLIT_HELPER_REGS = 120;
__host__ __device__ constexpr int consumer_regs(bool binary, int bn) {
    return split_for(binary, bn) ? 136 : cw_for(bn) == 2 ? 232 : 104;
}
__host__ __device__ constexpr int regs_needed(bool binary, int bn) {
    return 128 * ((split_for(binary, bn) ? 2 * SPLIT_HELPER_REGS : PRODUCER_REGS) + cw_for(bn) * consumer_regs(binary, bn));
}

// After the ring (and 1 KB for its barriers): each epilogue warp's stage (16 rows x 128 bytes in
// the 128-byte swizzle, 1024-byte aligned as the tensor copies of y need), then each epilogue
// warp's column terms of the tile (up to 256 ints). SPLIT: the dump, the tile's terms that the
// consumers leave with it (EP_TERMS: column terms, then the rows' float terms and border
// classes), then the stages.
constexpr int EP_STAGE = 16 * 128;
constexpr int EP_COLTERM = 256 * 4;
constexpr int EP_TERMS = 256 * 4 + 2 * 128 * 4;
// Binary 64-column tiles, whose gathered rows they count themselves, end with the ones operand
// (ONES bytes, 1024-byte aligned; see ones_operand). (Wider tiles keep conv_rowterms' counts: for
// them the extra MMA and the pixel terms cost more than that kernel.)
constexpr int ONES = 1024;
__host__ __device__ constexpr int ones_for(bool binary, int bn) { return binary && bn == 64 ? ONES : 0; }
__host__ __device__ constexpr int smem_for(bool binary, int bn) { // + alignment slack
    return 1024 + ring_for(binary, bn) + 1024 +
           (split_for(binary, bn) ? dump_for(binary, bn) + EP_TERMS + epilogue_warps(binary, bn) * EP_STAGE
                                  : epilogue_warps(binary, bn) * (EP_STAGE + EP_COLTERM)) +
           ones_for(binary, bn);
}

// The binary dot products reach float without the quarter-rate I2F, in two exact steps: the column
// part p = 4 acc - 2 popc(w) (+ a border correction) plus DOT_BIAS = the bits of 1.5 * 2^23 is the
// float 1.5 * 2^23 + p (in the binade [2^23, 2^24), where floats are the integers) for |p| < 2^22,
// and an FADD of the row part K - 2 popc(x) - 1.5 * 2^23 (an integer below 2^24, so a float)
// gives the dot product exactly (an integer of magnitude <= K < 2^24). |p| <= 2 K, so the host runs
// the fast epilogue for binary layers only when K < 2^21.
struct bits_t {}; // the output type of the fast epilogue's B1 y (epilogue_bits)
constexpr int64_t DOT_BIAS_MAX_K = (int64_t)1 << 21; // DOT_BIAS and its conversion: in the device code

__host__ __device__ constexpr int stages_for(bool binary, int bn) {
    return ring_for(binary, bn) / ((bm_for(binary, bn) + bn) * BK);
}
__host__ __device__ constexpr bool shape_ok(bool binary, int bn) {
    return stages_for(binary, bn) * (bm_for(binary, bn) + bn) * BK == ring_for(binary, bn) && stages_for(binary, bn) >= 3 &&
           smem_for(binary, bn) <= 232448 &&
           regs_needed(binary, bn) <= 65536 / threads_for(binary, bn) / 8 * 8 * threads_for(binary, bn);
}
static_assert(shape_ok(true, 64) && shape_ok(true, 128) && shape_ok(true, 192) && shape_ok(true, 256) &&
                  shape_ok(false, 64) && shape_ok(false, 128) && shape_ok(false, 256),
              "every tile shape: whole stages in the ring (so the area after it stays 1024-byte aligned), at least "
              "three, shared memory within Hopper's 227 KB, and the register split within the launch's registers");

// How the FAST epilogue stores y (the kernel's y_mode): rows of contiguous features, by the warp
// or by bulk tensor stores of the y map; or planes (NCHW-like y: a sample's pixels contiguous,
// its features y.stride[1] apart), where the 16 rows of a warp are 16 consecutive pixels.
enum { Y_ROWS = 0, Y_ROWS_MAP = 1, Y_PLANES = 2 };

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define BIE_WGMMA_DEVICE 1
#endif
// The device code below exists only in the sm_90a pass (the kernels are empty elsewhere and are
// never launched off Hopper).
#if !defined(__CUDA_ARCH__) || defined(BIE_WGMMA_DEVICE)

// --- PTX wrappers -------------------------------------------------------------------------------

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
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}
// Copies the box at (byte k0, row r0) of the tensor map into shared memory, completing on bar.
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap * map, int k0, int r0, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
                 ::"r"(dst), "l"((uint64_t)map), "r"(k0), "r"(r0), "r"(bar)
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

// Bulk tensor store of y: the box at (column c0, row r0) of the map from shared memory (rows and
// columns past the tensor's edges are not written), tracked by this thread's bulk groups.
__device__ __forceinline__ void tma_store(const CUtensorMap * map, uint32_t src, int c0, int r0) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n"
                 ::"l"((uint64_t)map), "r"(c0), "r"(r0), "r"(src)
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
#define WG_R0_31 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
#define WG_R32_63 "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
#define WG_R64_95 "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95"
#define WG_R96_127 "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"
#define WG_O8(i) "+r"(d[i]), "+r"(d[i + 1]), "+r"(d[i + 2]), "+r"(d[i + 3]), "+r"(d[i + 4]), "+r"(d[i + 5]), "+r"(d[i + 6]), "+r"(d[i + 7])
#define WG_O32(i) WG_O8(i), WG_O8(i + 8), WG_O8(i + 16), WG_O8(i + 24)
#define WG_PRED(n) "{\n.reg .pred p;\nsetp.ne.b32 p, %" #n ", 0;\n"
#define WG_DEF8(name, instr)                                                                       \
    __device__ __forceinline__ void name(int * d, uint64_t da, uint64_t db, int sc) {              \
        asm volatile(WG_PRED(6) instr " {%0,%1,%2,%3}, %4, %5, p;\n}\n"                              \
                     : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]) : "l"(da), "l"(db), "r"(sc)); \
    }
#define WG_DEF64(name, instr)                                                                      \
    __device__ __forceinline__ void name(int * d, uint64_t da, uint64_t db, int sc) {              \
        asm volatile(WG_PRED(34) instr " {" WG_R0_31 "}, %32, %33, p;\n}\n"                         \
                     : WG_O32(0) : "l"(da), "l"(db), "r"(sc));                                     \
    }
#define WG_DEF128(name, instr)                                                                     \
    __device__ __forceinline__ void name(int * d, uint64_t da, uint64_t db, int sc) {              \
        asm volatile(WG_PRED(66) instr " {" WG_R0_31 "," WG_R32_63 "}, %64, %65, p;\n}\n"           \
                     : WG_O32(0), WG_O32(32) : "l"(da), "l"(db), "r"(sc));                         \
    }
#define WG_DEF192(name, instr)                                                                     \
    __device__ __forceinline__ void name(int * d, uint64_t da, uint64_t db, int sc) {              \
        asm volatile(WG_PRED(98) instr " {" WG_R0_31 "," WG_R32_63 "," WG_R64_95 "}, %96, %97, p;\n}\n" \
                     : WG_O32(0), WG_O32(32), WG_O32(64) : "l"(da), "l"(db), "r"(sc));             \
    }
#define WG_DEF256(name, instr)                                                                     \
    __device__ __forceinline__ void name(int * d, uint64_t da, uint64_t db, int sc) {              \
        asm volatile(WG_PRED(130) instr " {" WG_R0_31 "," WG_R32_63 "," WG_R64_95 "," WG_R96_127      \
                                        "}, %128, %129, p;\n}\n"                                   \
                     : WG_O32(0), WG_O32(32), WG_O32(64), WG_O32(96) : "l"(da), "l"(db), "r"(sc)); \
    }
WG_DEF8(wg_b1_8, "wgmma.mma_async.sync.aligned.m64n8k256.s32.b1.b1.and.popc")
WG_DEF64(wg_b1_64, "wgmma.mma_async.sync.aligned.m64n64k256.s32.b1.b1.and.popc")
WG_DEF128(wg_b1_128, "wgmma.mma_async.sync.aligned.m64n128k256.s32.b1.b1.and.popc")
WG_DEF192(wg_b1_192, "wgmma.mma_async.sync.aligned.m64n192k256.s32.b1.b1.and.popc")
WG_DEF256(wg_b1_256, "wgmma.mma_async.sync.aligned.m64n256k256.s32.b1.b1.and.popc")
WG_DEF64(wg_s8_64, "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8")
WG_DEF128(wg_s8_128, "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8")
WG_DEF256(wg_s8_256, "wgmma.mma_async.sync.aligned.m64n256k32.s32.s8.s8")

template <bool BINARY, int BN>
__device__ __forceinline__ void wg_mma(int * d, uint64_t da, uint64_t db, int sc) {
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

// The tiles of one CTA of the persistent grid, b, b + grid, b + 2 grid, ... (m fastest), as
// (m tile, n tile) stepped without a division per tile.
struct tile_walk {
    uint32_t mi, ni, dm, dn, mt;
    __device__ tile_walk(uint32_t b, uint32_t grid, uint32_t m_tiles)
        : mi(b % m_tiles), ni(b / m_tiles), dm(grid % m_tiles), dn(grid / m_tiles), mt(m_tiles) {}
    __device__ void next() {
        mi += dm;
        ni += dn;
        if (mi >= mt) {
            mi -= mt;
            ni++;
        }
    }
};

// The ones operand of a gathering GEMM (rows gathered by the producer, binary): B of an m64n8k256
// MMA beside each of the tile's, whose first column is the popcount of every A row over its first
// K bits (popc(a & 1...1) = popc(a)), so that no kernel counts the gathered rows beforehand. It is
// one 128-byte-swizzled atom (8 rows of 128 bytes, 1024-byte aligned) whose rows 1-7 are zeros and
// whose row 0, which the swizzle leaves in place, holds two 32-byte K slices, then zeros: all ones
// (slice 0) and the first K % 256 bits (slice 1). The MMA of K step q (bits [256 q, 256 q + 256))
// reads slice 0 when the step lies below K and slice 1 when K ends inside it, so that the bits of
// a gathered stage past K (whatever its last fill left) count nothing; no step lies wholly past K
// (the last stage issues only the steps that hold K). (The descriptor's start moves by 32-byte
// steps across row 0's slices as it does across the K slices of a stage.)
__device__ __forceinline__ void ones_operand(uint8_t * ones, int64_t K) {
    const int part = (int)(K % 256);
    for (int b = threadIdx.x; b < ONES; b += blockDim.x) {
        const int bit = 8 * (b - 32); // slice 1: the byte's first bit
        ones[b] = b < 32 ? 0xff : b >= 64 || part <= bit ? 0 : part >= bit + 8 ? 0xff : (1 << (part - bit)) - 1;
    }
    fence_proxy_async(); // (before the CTA's barrier: the MMAs read it through the async proxy)
}
// The descriptor offset (16-byte units) of the ones operand's slice for K step q, given the number
// of whole K steps (K / 256).
__device__ __forceinline__ int ones_slice(int q, int whole) { return q < whole ? 0 : 2; }

// --- epilogue -----------------------------------------------------------------------------------

// Any y (B1, I32, strided, zero-padded conv): the shared element-wise path, out of line so that
// the unrolled fast path stays small.
__device__ __noinline__ void store_pair_any(const gemm_epilogue * ep, row_info r, int64_t n, int64_t N, int a0,
                                            int a1, float scale) {
    store_dot(*ep, r, n, binary_dot(*ep, r, n, a0), scale);
    if (n + 1 < N) store_dot(*ep, r, n + 1, binary_dot(*ep, r, n + 1, a1), scale);
}

// Two adjacent outputs, rounded to T, as one 4- or 8-byte store.
template <typename T> __device__ __forceinline__ void store_pair(T * p, float v0, float v1);
template <> __device__ __forceinline__ void store_pair<float>(float * p, float v0, float v1) {
    *(float2 *)p = make_float2(v0, v1);
}
template <> __device__ __forceinline__ void store_pair<__half>(__half * p, float v0, float v1) {
    *(__half2 *)p = __floats2half2_rn(v0, v1);
}
template <> __device__ __forceinline__ void store_pair<__nv_bfloat16>(__nv_bfloat16 * p, float v0, float v1) {
    *(__nv_bfloat162 *)p = __floats2bfloat162_rn(v0, v1);
}

constexpr int DOT_BIAS = BIE_DOT_BIAS;
constexpr float DOT_BIAS_F = 12582912.0f; // 1.5 * 2^23

// A warp's accumulators as the epilogue reads them: pair(i, h) is this thread's two values of
// column group i in fragment row h (d[4i + 2h + e] in the wgmma layout, see epilogue()), from the
// consumer's registers (acc_regs) or from its part of the dump (acc_dump, SPLIT: the 16-bit
// halves of word (2i + h) * 32 + lane, so that the 32 lanes of a warp read 32 consecutive words).
// The halves are taken apart by PRMTs that the compiler cannot fold into the 4 acc + colterm
// after them (it made two instructions of each, and 4 acc + colterm is one LEA).
struct acc_regs {
    const int * d;
    __device__ __forceinline__ int2 pair(int i, int h) const { return make_int2(d[4 * i + 2 * h], d[4 * i + 2 * h + 1]); }
};
struct acc_dump {
    const uint32_t * w;
    __device__ __forceinline__ int2 pair(int i, int h) const {
        const uint32_t v = w[(2 * i + h) * 32 + threadIdx.x % 32];
        int2 a;
        asm("prmt.b32 %0, %2, 0, 0x4410;\n\tprmt.b32 %1, %2, 0, 0x4432;" : "=r"(a.x), "=r"(a.y) : "r"(v));
        return a;
    }
};

// This thread's two column terms of column group i (DOT_BIAS - 2 popc(w), from the tile's colterm
// in shared memory; a zero-padded conv (TAPS) reads its own from ep.colcls instead, and n-bit
// GEMMs have none).
template <bool BINARY, bool TAPS> __device__ __forceinline__ int2 col_pair(const int * colterm, int i) {
    return !BINARY || TAPS ? make_int2(0, 0) : *(const int2 *)(colterm + 8 * i + 2 * (threadIdx.x % 4));
}

// The exact results of this thread's two columns 8i + 2(lane%4) + {0, 1} in fragment row h, as
// floats (binary: the dot products, from the column terms DOT_BIAS - 2 popc(w) and the row's rowf
// = K - 2 popc(x) - DOT_BIAS_F; n-bit: the accumulators, rounded to float). The column terms come
// from colterm (the tile's, in shared memory), or for a zero-padded conv (TAPS) from the row of
// ep.colcls of the row's border class (which adds back the taps outside the image): border is
// then that row's offset, class * colcls_ld + the tile's first column.
// fragment_ints: the binary pair's column parts, 4 acc + column term (the bits of 1.5 * 2^23 + p).
template <bool TAPS, class D>
__device__ __forceinline__ int2 fragment_ints(const gemm_epilogue & ep, const D & d, int2 ctc, int i, int h, int border) {
    const int2 a = d.pair(i, h);
    const int lane = threadIdx.x % 32;
    const int2 ct = TAPS ? __ldg((const int2 *)(ep.colcls + border + 8 * i + 2 * (lane % 4))) : ctc;
    return make_int2(4 * a.x + ct.x, 4 * a.y + ct.y);
}
template <bool BINARY, bool TAPS, class D>
__device__ __forceinline__ float2 fragment_pair(const gemm_epilogue & ep, const D & d, int2 ctc, int i, int h,
                                                float rowf, int border) {
    if (!BINARY) {
        const int2 a = d.pair(i, h);
        return make_float2(__int2float_rn(a.x), __int2float_rn(a.y));
    }
    const int2 v = fragment_ints<TAPS>(ep, d, ctc, i, h, border);
    return make_float2(__fadd_rn(__int_as_float(v.x), rowf), __fadd_rn(__int_as_float(v.y), rowf));
}

// The B1 y of the fast epilogue (T = bits_t; see bie_cuda_wgmma_packs_bits for when it applies): y
// holds the sign bits (result >= 0) with the features of a row contiguous, rows a whole number of
// bytes apart, N % 8 == 0. The warp's 16 rows of signs go to the stage (16 rows x BN/8 bytes) a
// word at a time, then leave a word per lane. (Two ballots per 8-column group and a bit-by-bit
// interleave would take about 30 instructions a byte; this takes about 5.)
template <bool BINARY, int BN, bool TAPS>
__device__ __forceinline__ void epilogue_bits(const gemm_epilogue & ep, const acc_regs & d, uint8_t * stage,
                                              const int * colterm, int64_t mw, int64_t nt, int64_t M, int64_t N,
                                              const float * rowf, const int * rowborder) {
    const int lane = threadIdx.x % 32, g = lane / 4;
    const struct dview & y = ep.y;
    // Rows lie evenly spaced in y (bie_cuda_wgmma_packs_bits): row m starts at bit m * pitch.
    const int64_t pitch = y_row_pitch(ep);
    const int64_t rb_mine = (mw + (lane & 15)) * pitch; // lane j < 16: the bit offset of row mw + j
    // Lane t of a quad holds columns 2t and 2t+1 of each 8-column group, i.e. bits 2t and 2t+1 of
    // the row's byte for that group: four groups make a word, ORed over the quad by two shuffles.
    // Binary: the sign test on the integers, result >= 0 exactly when fragment_ints' part >= the
    // row's threshold DOT_BIAS - (K - 2 popc(x)) (rowf + DOT_BIAS_F is that row term, exactly);
    // n-bit: acc >= 0.
    const int t = lane % 4;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int thr = BINARY ? DOT_BIAS - __float2int_rn(__fadd_rn(rowf[h], DOT_BIAS_F)) : 0;
#pragma unroll
        for (int w4 = 0; w4 < BN / 32; w4++) {
            uint32_t word = 0;
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int i = 4 * w4 + q;
                const int2 v = BINARY ? fragment_ints<TAPS>(ep, d, col_pair<BINARY, TAPS>(colterm, i), i, h, rowborder[h])
                                      : d.pair(i, h);
                word |= ((v.x >= thr ? 1u : 0u) | (v.y >= thr ? 2u : 0u)) << (8 * q + 2 * t);
            }
            word |= __shfl_xor_sync(0xffffffffu, word, 1);
            word |= __shfl_xor_sync(0xffffffffu, word, 2);
            if (t == 0) *(uint32_t *)(stage + (g + 8 * h) * (BN / 8) + 4 * w4) = word;
        }
    }
    __syncwarp();
    // The stage's 16 rows of BN/8 bytes leave a word per lane (bytes where a row's start in y is not
    // 4-byte aligned or the tile ends mid-word).
    const int64_t nbytes = (N - nt < BN ? N - nt : BN) / 8; // N % 8 == 0
    for (int e = lane; e < 16 * (BN / 32); e += 32) {
        const int row = e / (BN / 32), k = 4 * (e % (BN / 32));
        const int64_t rb = __shfl_sync(0xffffffffu, rb_mine, row); // (all lanes take part: same trip count)
        if (mw + row >= M || k >= nbytes) continue;
        uint8_t * dst = (uint8_t *)y.data + (rb + nt) / 8 + k;
        const uint8_t * src = stage + row * (BN / 8) + k;
        if ((uintptr_t)dst % 4 == 0 && k + 4 <= nbytes) *(uint32_t *)dst = *(const uint32_t *)src;
        else
            for (int b = 0; b < 4 && k + b < nbytes; b++) dst[b] = src[b];
    }
    __syncwarp();
}

// Any y, element by element (the shared path of cuda-epilogue.cuh): the warp's 16 rows (rpop: the
// popcounts of this thread's two fragment rows, counted by the GEMM, or NULL: ep.rowpop's).
template <bool BINARY, int BN>
__device__ __forceinline__ void epilogue_elements(const gemm_epilogue & ep, const acc_regs & d, int64_t mw, int64_t nt,
                                                  int64_t M, int64_t N, float scale, const int * rpop) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int64_t m = mw + lane / 4 + 8 * h;
        if (m >= M) continue;
        row_info r = make_row(ep, m, M);
        if (rpop) r.rowpop = rpop[h];
#pragma unroll
        for (int i = 0; i < BN / 8; i++) {
            const int64_t n = nt + 8 * i + 2 * (lane % 4);
            if (n >= N) break;
            const int2 a = d.pair(i, h);
            store_pair_any(&ep, r, n, N, a.x, a.y, scale);
        }
    }
}

// The finished value of this thread's two columns of column group i in fragment row h, scaled.
template <bool BINARY, bool TAPS, class D>
__device__ __forceinline__ float2 scaled_pair(const gemm_epilogue & ep, const D & d, int2 ct, int i, int h, float scale,
                                              float rowf, int border) {
    const float2 r = fragment_pair<BINARY, TAPS>(ep, d, ct, i, h, rowf, border);
    return make_float2(__fmul_rn(r.x, scale), __fmul_rn(r.y, scale));
}

// Two adjacent values rounded to a 16-bit T, as the bits of a T pair.
template <typename T> __device__ __forceinline__ uint32_t pack2(float2 v) {
    if constexpr (std::is_same<T, __half>::value) {
        const __half2 h = __floats2half2_rn(v.x, v.y);
        return *(const uint32_t *)&h;
    } else {
        const __nv_bfloat162 h = __floats2bfloat162_rn(v.x, v.y);
        return *(const uint32_t *)&h;
    }
}
// Stores four 8 x 8 matrices of 16-bit values from their mma fragments (r_i: matrix i's) to the
// row addresses that lanes 8i .. 8i + 7 give.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
                 "r"(r2), "r"(r3)
                 : "memory");
}

// Two adjacent values of a 16-row, 128-byte-wide stage in the 128-byte swizzle (16-byte unit u of
// row r at u ^ (r % 8)): those of column group j of the chunk in fragment row h go to byte
// b of row lane / 4 + 8 h.
template <typename T> __device__ __forceinline__ void stage_pair(uint8_t * rows, int j, int h, float2 v) {
    const int lane = threadIdx.x % 32, row = lane / 4 + 8 * h, b = (8 * j + 2 * (lane % 4)) * (int)sizeof(T);
    store_pair<T>((T *)(rows + row * 128 + (((b >> 4) ^ (row & 7)) << 4) + (b & 15)), v.x, v.y);
}

// A chunk of the FAST epilogue with a y map (see epilogue()): column chunk c (128 bytes of y) of
// the warp's 16 rows from mw (fragment rows h = 0, 1: rowf[h] and border[h] are their terms).
// Its values are made in registers (chunk_vals), staged in the warp's `stage` (2 KB, 1024-byte
// aligned, rows 8h .. 8h + 7 in half h) once the warp's last bulk store has read it (stage_free),
// and published: made visible to the async proxy and stored by lane 0 as one box (publish).
// (Boxes of 8 rows in two alternating halves would cost a fence and a store issue each.)
// STSM (16-bit y only): the values are rounded and paired in registers and staged by stmatrix,
// each 8 x 8 block (fragment row h, column group j) one matrix, whose fragment is the
// accumulators' (lane l: row l/4, columns 2(l%4), +1): GC/2 stmatrix.x4 where 2 GC 4-byte stores
// did. Lane l gives the address of row l % 8 of matrix l / 8 (h = (l/8) % 2, j = 2q + l/16), a
// 16-byte unit of the swizzle. Else a store per pair. (The epilogue warps of SPLIT tiles keep the
// stores: stmatrix is slower there; see docs/decisions.md.)
template <typename T, bool STSM> struct chunk_vals {
    static constexpr int GC = 128 / (int)sizeof(T) / 8; // column groups per chunk
    static_assert(!STSM || sizeof(T) == 2, "stmatrix stages 16-bit values");
    typename std::conditional<STSM, uint32_t, float2>::type v[2][GC];
};
// Row half h of chunk c into cv (ct(j): column group j's column terms, see col_pair).
template <bool BINARY, typename T, bool TAPS, bool STSM, class D, class CT>
__device__ __forceinline__ void chunk_half(chunk_vals<T, STSM> & cv, const gemm_epilogue & ep, const D & d,
                                           const CT & ct, int c, int h, float scale, const float * rowf,
                                           const int * border) {
    constexpr int GC = chunk_vals<T, STSM>::GC;
#pragma unroll
    for (int j = 0; j < GC; j++) {
        const float2 v = scaled_pair<BINARY, TAPS>(ep, d, ct(j), c * GC + j, h, scale, rowf[h], border[h]);
        if constexpr (STSM) cv.v[h][j] = pack2<T>(v);
        else cv.v[h][j] = v;
    }
}
__device__ __forceinline__ void stage_free() {
    if (threadIdx.x % 32 == 0) tma_store_wait_read<0>();
    __syncwarp();
}
template <typename T, bool STSM>
__device__ __forceinline__ void stage_chunk(uint8_t * stage, const chunk_vals<T, STSM> & cv) {
    constexpr int GC = chunk_vals<T, STSM>::GC;
    if constexpr (STSM) {
        const int lane = threadIdx.x % 32;
        const uint32_t st = (uint32_t)__cvta_generic_to_shared(stage);
        const int r = lane % 8, row = r + 8 * ((lane / 8) % 2);
#pragma unroll
        for (int q = 0; q < GC / 2; q++) {
            const int j = 2 * q + lane / 16;
            stmatrix_x4(st + row * 128 + ((j ^ r) << 4), cv.v[0][2 * q], cv.v[1][2 * q], cv.v[0][2 * q + 1],
                        cv.v[1][2 * q + 1]);
        }
    } else {
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int j = 0; j < GC; j++) stage_pair<T>(stage, j, h, cv.v[h][j]);
    }
}
template <typename T>
__device__ __forceinline__ void publish(const CUtensorMap * ymap, uint8_t * stage, int64_t mw, int c, int64_t nt,
                                        int64_t M) {
    fence_proxy_async();
    __syncwarp();
    if (threadIdx.x % 32 == 0 && mw < M)
        tma_store(ymap, (uint32_t)__cvta_generic_to_shared(stage), (int)(nt + c * (128 / (int)sizeof(T))), (int)mw);
}
// One chunk on its own (the epilogue warps of SPLIT tiles, which take chunks of several tiles'
// dumps in turn). The arithmetic comes before the wait, so the store before it has that long to
// read the stage.
template <bool BINARY, typename T, bool TAPS, class D>
__device__ __forceinline__ void epilogue_chunk(const gemm_epilogue & ep, const D & d, uint8_t * stage,
                                               const int * colterm, const CUtensorMap * ymap, int64_t mw, int c,
                                               int64_t nt, int64_t M, float scale, const float * rowf,
                                               const int * border) {
    chunk_vals<T, false> cv;
    const auto ct = [&](int j) { return col_pair<BINARY, TAPS>(colterm, c * chunk_vals<T, false>::GC + j); };
    chunk_half<BINARY, T, TAPS>(cv, ep, d, ct, c, 0, scale, rowf, border);
    chunk_half<BINARY, T, TAPS>(cv, ep, d, ct, c, 1, scale, rowf, border);
    stage_free();
    stage_chunk<T>(stage, cv);
    publish<T>(ymap, stage, mw, c, nt, M);
}
// All chunks of a consumer warp's tile, pipelined (16-bit y staged by stmatrix): while chunk c's
// stage writes complete (before its fence) the warp makes the first half of chunk c + 1, and
// while its bulk store reads the stage, the second half. (One chunk at a time, the fence would wait
// for the stage writes, and the loads of the column terms after each fence with it. A quarter or
// none of the next chunk before the fence does as well as half.)
template <bool BINARY, int BN, typename T, bool TAPS, class D>
__device__ __forceinline__ void epilogue_chunks(const gemm_epilogue & ep, const D & d, uint8_t * stage,
                                                const int * colterm, const CUtensorMap * ymap, int64_t mw, int64_t nt,
                                                int64_t M, float scale, const float * rowf, const int * border) {
    constexpr bool STSM = sizeof(T) == 2;
    constexpr int NC = BN / (128 / (int)sizeof(T)), GC = chunk_vals<T, STSM>::GC;
    chunk_vals<T, STSM> cv[2];
    int2 ct[2][GC]; // (loaded once for both halves: the fence between them orders shared-memory loads)
    auto load_ct = [&](int c) {
#pragma unroll
        for (int j = 0; j < GC; j++) ct[c % 2][j] = col_pair<BINARY, TAPS>(colterm, c * GC + j);
    };
    auto half = [&](int c, int h) {
        chunk_half<BINARY, T, TAPS>(cv[c % 2], ep, d, [&](int j) { return ct[c % 2][j]; }, c, h, scale, rowf, border);
    };
    load_ct(0);
    half(0, 0);
    half(0, 1);
#pragma unroll
    for (int c = 0; c < NC; c++) {
        stage_free();
        stage_chunk<T>(stage, cv[c % 2]);
        if (c + 1 < NC) {
            load_ct(c + 1);
            half(c + 1, 0);
        }
        publish<T>(ymap, stage, mw, c, nt, M);
        if (c + 1 < NC) half(c + 1, 1);
    }
}

// Stores this thread's accumulators. In the wgmma layout, thread (warp w, lane l) of a consumer
// warpgroup holds, for column group i (8 columns), d[4i + 2h + e] = C[w*16 + l/4 + 8h][8i + 2(l%4) + e].
// FAST (decided on the host): y is f32/f16/bf16 with contiguous features (or planes). Each warp finishes
// its 16 rows one 128-byte column chunk at a time in its own shared-memory stage (16 rows of 128
// bytes whose 16-byte units are swizzled by the row, unit u of row r at u ^ (r % 8), so the
// fragment writes hit 32 distinct banks), and the chunk leaves as whole 128-byte row segments:
// with a y map (ymap: rows of y evenly spaced, see make_y_map) as a bulk tensor store issued by
// lane 0, which runs while the warp computes the next chunk (epilogue_chunks); else row by row, 16
// bytes per lane. With y as planes (Y_PLANES) the stage holds the chunk transposed and each feature's
// 16 pixels leave as one run. TAPS: a zero-padded binary conv, whose border rows add back the
// popcounts of their taps outside the image. Other y go element by element (rpop: see
// epilogue_elements).
template <bool BINARY, int BN, typename T, bool FAST, bool TAPS>
__device__ __forceinline__ void epilogue(const gemm_epilogue & ep, const acc_regs & d, uint8_t * stage,
                                         const int * colterm, const CUtensorMap * ymap, int y_mode, int64_t mw,
                                         int64_t nt, int64_t M, int64_t N, float scale, const float * rowf,
                                         const int * rowborder, const int * rpop) {
    const int lane = threadIdx.x % 32;
    const struct dview & y = ep.y;
    if (!FAST) {
        epilogue_elements<BINARY, BN>(ep, d, mw, nt, M, N, scale, rpop);
        return;
    }
    if (y_mode == Y_PLANES) {
        // The warp's rows must be pixels of one sample (else element by element).
        const struct dgeom & g = ep.g;
        const int64_t hw = g.OH * g.OW, nb = (uint32_t)mw / (uint32_t)hw, p0 = mw - nb * hw; // (M < 2^31)
        if (mw + 16 > M || p0 + 16 > hw) {
            epilogue_elements<BINARY, BN>(ep, d, mw, nt, M, N, scale, rpop);
            return;
        }
        // Chunks of CC features: the values go to the stage transposed (feature-major, 16 pixels
        // each), then each feature's 16 pixels leave as one contiguous run, in units of VEC
        // elements where the run's alignment allows (y.stride[1] and p0 decide it for all runs).
        constexpr int CC = 2048 / (16 * (int)sizeof(T));
        T * const yd = (T *)y.data + nb * y.stride[0] + p0;
        const int64_t fs = y.stride[1];
        const int vec = ((uintptr_t)yd % 16 == 0 && fs % (16 / (int)sizeof(T)) == 0) ? 16 / (int)sizeof(T)
                        : ((uintptr_t)yd % 4 == 0 && fs % 2 == 0 && sizeof(T) == 2) ? 2 : 1;
        T * const st = (T *)stage;
#pragma unroll
        for (int c = 0; c < BN / CC; c++) {
#pragma unroll
            for (int j = 0; j < CC / 8; j++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int i = c * CC / 8 + j;
                    const float2 v = scaled_pair<BINARY, TAPS>(ep, d, col_pair<BINARY, TAPS>(colterm, i), i, h, scale,
                                                               rowf[h], rowborder[h]);
                    const int col = 8 * j + 2 * (lane % 4), row = lane / 4 + 8 * h;
                    st[col * 16 + row] = from_f32<T>(v.x);
                    st[(col + 1) * 16 + row] = from_f32<T>(v.y);
                }
            __syncwarp();
            const int64_t n0 = nt + c * CC;
            if (vec == 16 / (int)sizeof(T)) {
                for (int e = lane * vec; e < 16 * CC; e += 32 * vec)
                    if (n0 + e / 16 < N) *(uint4 *)(yd + (n0 + e / 16) * fs + e % 16) = *(const uint4 *)(st + e);
            } else if (vec == 2) {
                for (int e = lane * 2; e < 16 * CC; e += 64)
                    if (n0 + e / 16 < N) *(uint32_t *)(yd + (n0 + e / 16) * fs + e % 16) = *(const uint32_t *)(st + e);
            } else {
                for (int e = lane; e < 16 * CC; e += 32)
                    if (n0 + e / 16 < N) yd[(n0 + e / 16) * fs + e % 16] = st[e];
            }
            __syncwarp();
        }
        return;
    }
    // colterm: DOT_BIAS - 2 popc(w) of the tile's columns, written by the caller
    constexpr int CC = 128 / (int)sizeof(T), GC = CC / 8; // columns and column groups per chunk
    if (ymap) {
        epilogue_chunks<BINARY, BN, T, TAPS>(ep, d, stage, colterm, ymap, mw, nt, M, scale, rowf, rowborder);
        return;
    }
#pragma unroll
    for (int c = 0; c < BN / CC; c++) {
#pragma unroll
        for (int j = 0; j < GC; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int i = c * GC + j;
                stage_pair<T>(stage, j, h,
                              scaled_pair<BINARY, TAPS>(ep, d, col_pair<BINARY, TAPS>(colterm, i), i, h, scale, rowf[h],
                                                        rowborder[h]));
            }
        int64_t rb_mine = 0; // lane j < 16: row mw + j's offset in y
        if (lane < 16 && mw + lane < M) {
            const row_info r = make_row(ep, mw + lane, M);
            rb_mine = r.nb * y.stride[0] + r.oh * y.stride[2] + r.ow * y.stride[3];
        }
        __syncwarp();
        // 16 rows x 128 bytes: 8 lanes per row, 4 rows per pass.
#pragma unroll
        for (int pass = 0; pass < 4; pass++) {
            const int row = pass * 4 + lane / 8;
            const int64_t rb = __shfl_sync(0xffffffffu, rb_mine, row);
            const int64_t n = nt + c * CC + (lane % 8) * (16 / (int)sizeof(T));
            if (mw + row >= M || n >= N) continue;
            const uint8_t * src = stage + row * 128 + (((lane % 8) ^ (row & 7)) << 4);
            T * dst = (T *)y.data + rb + n;
            if (((uintptr_t)y.data % 16) == 0 && ((rb + n) % (16 / (int)sizeof(T))) == 0 && n + 16 / (int)sizeof(T) <= N) {
                *(uint4 *)dst = *(const uint4 *)src;
            } else {
                for (int k = 0; k < 16 / (int)sizeof(T) && n + k < N; k++) dst[k] = ((const T *)src)[k];
            }
        }
        __syncwarp();
    }
}

// The producer of a gathering GEMM (gemm_gather): the whole producer warpgroup fills each stage's
// A tile from the NHWC words of x, and thread 0 also loads its B tile. A tile's rows are dealt to
// the threads (RPT rows each, or for 64-row tiles TPR = 2 threads per row taking every other
// piece), and a thread copies its rows' pieces of PIECE bytes (each within one tap) into the
// 128-byte swizzle the MMA descriptors read; a tap outside the image (and a row past M) is
// zero-filled. A row's output pixel (n, oh, ow) is found once per tile; the tap of a piece and its
// word offset from the pixel's first tap are stepped from the piece before, the same for all the
// thread's rows. Pieces
// past K are left as they are: B is zero there, so they add nothing. Each thread's copies of a
// stage arrive on its full barrier when they land (129 arrivals: 128 threads and the B load). Word
// offsets are 32-bit: the host keeps x under 2^31 words. (Threads that each take one 16-byte chunk
// of every 16th row spend about 30 instructions a copy, and the consumers wait for the stages.)
template <int PIECE, int BM, int BN, int STAGES>
__device__ __forceinline__ void gather_producer(const gemm_gather & gs, const CUtensorMap * tb, const struct dgeom & g,
                                                int64_t M, uint32_t mt, uint32_t ntn, int ktiles, uint32_t base,
                                                uint32_t bars) {
    constexpr int STAGE_BYTES = (BM + BN) * BK;
    constexpr int RS = BM < 128 ? BM : 128, TPR = 128 / RS, RPT = BM / RS; // row slots, threads per row, rows per thread
    constexpr int WPP = PIECE / 4, PPS = BK / PIECE; // words per piece, pieces per row and stage
    static_assert(PPS % TPR == 0, "a stage's pieces split evenly between a row's threads");
    const int t = threadIdx.x, rs = t % RS, phase = t / RS;
    const int H = (int)g.H, W = (int)g.W, wpt = (int)(g.C / 32), kwords = (int)(g.K / 32);
    const int w0 = (int)gs.w0, w2 = (int)gs.w2, w3 = (int)gs.w3;
    const int next_tap = g.dw * w3 - wpt, next_row = g.dh * w2 - g.kw * g.dw * w3; // word offsets (see step)
    int it = 0;
    for (tile_walk w(blockIdx.x, gridDim.x, mt); w.ni < ntn; w.next()) {
        // This thread's rows: the word offset of their top-left input pixel, and its position.
        // (A row past M reads as if its taps all lay outside the image: zeros.)
        int pix[RPT], hs[RPT], ws[RPT];
#pragma unroll
        for (int q = 0; q < RPT; q++) {
            const uint32_t m = w.mi * BM + rs + q * RS;
            const uint32_t nhw = fast_div(m, gs.div_ow), n = fast_div(nhw, gs.div_oh);
            hs[q] = (int)(nhw - n * (uint32_t)g.OH) * g.sh - g.ph;
            ws[q] = (int)(m - nhw * (uint32_t)g.OW) * g.sw - g.pw;
            pix[q] = (int)n * w0 + hs[q] * w2 + ws[q] * w3;
            if ((int64_t)m >= M) hs[q] = INT32_MIN / 2;
        }
        // The current piece: its first word `word` of the row's K, which lies at word wb of tap
        // (i, j) (ih = i dh, jw = j dw), `rel` words from the pixel's first word.
        int word = 0, wb = 0, j = 0, ih = 0, jw = 0, rel = 0;
        auto step = [&](int words) { // on by `words` words (within the row's K, or just past it)
            word += words;
            wb += words;
            rel += words;
            while (wb >= wpt) {
                wb -= wpt;
                rel += next_tap;
                jw += g.dw;
                if (++j == g.kw) {
                    j = 0;
                    jw = 0;
                    ih += g.dh;
                    rel += next_row;
                }
            }
        };
        step(phase * WPP);
        for (int kt = 0; kt < ktiles; kt++, it++) {
            const int s = it % STAGES;
            const uint32_t full = bars + 8 * s, sa = base + s * STAGE_BYTES;
            mbar_wait(bars + 8 * (STAGES + s), ((it / STAGES) & 1) ^ 1);
            if (t == 0) {
                mbar_expect_tx(full, BN * BK);
                tma_load(sa + BM * BK, tb, kt * BK, (int)(w.ni * BN), full);
            }
#pragma unroll 1 // (unrolled, it spilled the producer's 40 registers)
            for (int u = phase; u < PPS && word < kwords; u += TPR) {
#pragma unroll
                for (int q = 0; q < RPT; q++) {
                    const int row = rs + q * RS, b = u * PIECE;
                    const bool in = (unsigned)(hs[q] + ih) < (unsigned)H && (unsigned)(ws[q] + jw) < (unsigned)W;
                    const uint32_t dst = sa + row * BK + ((((b >> 4) ^ (row & 7)) << 4) | (b & 15));
                    cp_async<PIECE>(dst, gs.x + (in ? pix[q] + rel : 0), in ? PIECE : 0);
                }
                step(TPR * WPP);
            }
            cp_async_arrive(full);
        }
    }
    cp_async_wait_all();
}

#endif // sm_90a device code

template <bool BINARY, int BN, typename T, bool FAST, bool TAPS>
__global__ void __launch_bounds__(threads_for(BINARY, BN), 1)
    wgmma_gemm(const __grid_constant__ CUtensorMap ta, const __grid_constant__ CUtensorMap tb,
               const __grid_constant__ CUtensorMap ty, int y_mode, int64_t M, int64_t N, int ktiles,
               const __grid_constant__ gemm_epilogue ep, const __grid_constant__ gemm_gather gs) {
#ifdef BIE_WGMMA_DEVICE
    constexpr int NCW = cw_for(BN), BM = bm_for(BINARY, BN); // consumer warpgroups, rows per tile
    constexpr bool PP = pp_for(BINARY, BN);
    constexpr bool SPLIT = split_for(BINARY, BN);
    constexpr int STAGES = stages_for(BINARY, BN);
    constexpr int STAGE_BYTES = (BM + BN) * BK;
    constexpr int ACC = BN / 2; // accumulators per thread
    extern __shared__ uint8_t smem_raw[];
    const uint32_t base = ((uint32_t)__cvta_generic_to_shared(smem_raw) + 1023) & ~1023u; // swizzle atoms
    const uint32_t bars = base + STAGES * STAGE_BYTES; // full[STAGES], empty[STAGES], dump full, dump empty
    // then (1 KB on, so 1024-byte aligned) the epilogue area (see smem_for)
    uint8_t * const area = smem_raw + (bars + 1024 - (uint32_t)__cvta_generic_to_shared(smem_raw));
    uint32_t * const dump = (uint32_t *)area; // SPLIT: consumer warp c's part: words [c BN 8, (c + 1) BN 8)
    int * const terms_col = (int *)(area + dump_for(BINARY, BN));        // SPLIT: the tile's column terms,
    float * const terms_rowf = (float *)(area + dump_for(BINARY, BN) + 1024); // its rows' float terms
    int * const terms_border = (int *)(area + dump_for(BINARY, BN) + 1536);   // and offsets in ep.colcls
    const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    // The epilogue warps. SPLIT (never with gathered rows, which take the whole producer
    // warpgroup): warps 1-3 of the producer warpgroup and the fourth warpgroup; else the consumer
    // warps.
    static_assert(!SPLIT || (FAST && !std::is_same<T, bits_t>::value), "SPLIT tiles store float y by bulk copies");
    const int n_ewarps = epilogue_warps(BINARY, BN);
    const int ewarp = !SPLIT ? threadIdx.x / 32 - 4 : wg == 0 ? warp - 1 : 3 + warp;
    uint8_t * const ep_stage = area + (SPLIT ? dump_for(BINARY, BN) + EP_TERMS : 0) + ewarp * EP_STAGE;
    int * const ep_colterm = SPLIT ? terms_col : (int *)(area + n_ewarps * EP_STAGE + ewarp * EP_COLTERM);
    // A gathering GEMM's ones operand, after the epilogue areas (1024-byte aligned: they are whole
    // KBs); count_rows: the tile's rows are gathered and counted by the ones MMA.
    uint8_t * const ones = area + (SPLIT ? 0 : n_ewarps * (EP_STAGE + EP_COLTERM));
    const bool count_rows = ones_for(BINARY, BN) && gs.x;
    const CUtensorMap * const ymap = FAST && y_mode == Y_ROWS_MAP ? &ty : NULL;
    auto full = [&](int s) { return bars + 8 * s; };
    auto empty = [&](int s) { return bars + 8 * (STAGES + s); };
    const uint32_t dump_full = bars + 16 * STAGES, dump_empty = dump_full + 8;
    // PP: turn(c) completes a phase when consumer warpgroup c has issued the MMAs of its next tile.
    auto turn = [&](int c) { return bars + 16 * STAGES + 16 + 8 * c; };
    const uint32_t mt = (uint32_t)((M + BM - 1) / BM), ntn = (uint32_t)((N + BN - 1) / BN); // (M, N < 2^31)
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(full(s), gs.x ? 129 : 1); // (gathering: every producer thread and the B load)
            mbar_init(empty(s), PP ? 4 : 4 * NCW); // one arrival per consumer warp that reads it
        }
        if (PP) {
            mbar_init(turn(0), 4);
            mbar_init(turn(1), 4);
        }
        if (SPLIT) {
            mbar_init(dump_full, 128 * NCW); // every consumer thread, then every epilogue thread
            mbar_init(dump_empty, 32 * n_ewarps);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    if (count_rows) ones_operand(ones, ep.g.K);
    __syncthreads();

    // The epilogue's popcount terms of a tile: popc(w) of its columns, and popc(x) and K of this
    // thread's fragment rows of a warp's 16 rows. They are loaded by the consumers before the
    // tile's MMAs so that their latency hides behind them (and used only after them), except in
    // the first tile of a GEMM that starts under the kernel writing them (ep.terms_last or
    // ep.operands_last), which waits for that kernel just after its MMAs. Gathered rows that the
    // tile counts itself (count_rows) take their K terms and border classes from their pixel's
    // entry in ep.pixcls, and their popcounts from the ones MMA (see ones_operand).
    constexpr int NCP = BINARY && FAST && !SPLIT && !TAPS ? BN / 32 : 1; // column terms per lane (TAPS: ep.colcls)
    struct row_terms {
        int rpop[2], rk[2], rborder[2]; // (rborder: the border class, then its offset in ep.colcls)
        float rowf[2]; // K - 2 popc(x) - DOT_BIAS_F, made before the epilogue
    };
    auto load_cols = [&](int * cpop, int64_t n0) { // columns n0 + lane + 32 q
#pragma unroll
        for (int q = 0; q < NCP; q++) {
            const int64_t n = n0 + lane + 32 * q;
            cpop[q] = BINARY && FAST && !TAPS && n < N ? __ldg(ep.colpop + n) : 0;
        }
    };
    auto load_rows = [&](row_terms & rt, int64_t mw) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int64_t m = mw + lane / 4 + 8 * r;
            rt.rpop[r] = rt.rk[r] = rt.rborder[r] = 0;
            rt.rowf[r] = 0.0f;
            if (BINARY && FAST && m < M) {
                if (TAPS && count_rows) { // gathered rows: their pixel's terms (popc(x): the ones MMA's)
                    const uint32_t n = fast_div(fast_div((uint32_t)m, gs.div_ow), gs.div_oh);
                    const int2 t = __ldg(ep.pixcls + ((uint32_t)m - n * (uint32_t)(ep.g.OH * ep.g.OW)));
                    rt.rk[r] = t.x;
                    rt.rborder[r] = t.y;
                } else if (TAPS && ep.rowterms) { // gathered rows: terms made by bie_cuda_conv_rowpop
                    const int2 t = __ldg(ep.rowterms + m);
                    rt.rk[r] = t.x; // (K over the valid taps - 2 popc(x), with rpop 0)
                    rt.rborder[r] = t.y;
                } else if (TAPS) { // a zero-padded conv: K counts the valid taps only
                    const row_info ri = make_row(ep, m, M);
                    rt.rk[r] = (int)ri.kterm;
                    rt.rpop[r] = ri.rowpop;
                    rt.rborder[r] = ri.border;
                } else {
                    rt.rk[r] = (int)ep.g.K;
                    if (!count_rows) rt.rpop[r] = __ldg(ep.rowpop + m);
                }
            }
        }
    };
    // Before the epilogue of a tile at column nt: the row terms as floats, and the offsets of the
    // rows' column terms in ep.colcls (TAPS; the host keeps them below 2^31).
    auto prepare_rows = [&](row_terms & rt, int64_t nt) {
        if (BINARY && FAST) {
#pragma unroll
            for (int r = 0; r < 2; r++) {
                rt.rowf[r] = __fsub_rn(__int2float_rn(rt.rk[r] - 2 * rt.rpop[r]), DOT_BIAS_F);
                if (TAPS) rt.rborder[r] = rt.rborder[r] * ep.colcls_ld + (int)nt;
            }
        }
    };
    // The epilogue of a warp's 16 rows from mw of the tile at column nt (colterm: DOT_BIAS - 2
    // popc(w) of the tile's columns).
    auto finish = [&](const acc_regs & d, const float * rowf, const int * rowborder, const int * rpop, int64_t mw,
                      int64_t nt, float scale) {
        if constexpr (std::is_same<T, bits_t>::value)
            epilogue_bits<BINARY, BN, TAPS>(ep, d, ep_stage, ep_colterm, mw, nt, M, N, rowf, rowborder);
        else
            epilogue<BINARY, BN, T, FAST, TAPS>(ep, d, ep_stage, ep_colterm, ymap, y_mode, mw, nt, M, N, scale, rowf,
                                                rowborder, rpop);
    };
    // SPLIT: the epilogue warps. y leaves by bulk stores (the host launches SPLIT only with a y
    // map): each tile's chunks (consumer warp, 128 bytes of its 16 rows) are dealt round-robin.
    auto split_epilogue = [&] {
        if constexpr (SPLIT) {
            if (ep.terms_last || ep.operands_last) griddep_wait(); // (the scales and border corrections)
            const float scale = __fmul_rn(ld_scale(ep.sa), ld_scale(ep.sw));
            constexpr int NC = BN / (128 / (int)sizeof(T)); // column chunks
            int j = 0;
            for (tile_walk w(blockIdx.x, gridDim.x, mt); w.ni < ntn; w.next(), j++) {
                const int64_t mt0 = (int64_t)w.mi * BM, nt = (int64_t)w.ni * BN;
                mbar_wait(dump_full, j & 1);
                for (int u = ewarp; u < 8 * NC; u += n_ewarps) { // (consumer warp, chunk)
                    const int cw8 = u / NC, c = u % NC, row = cw8 * 16 + lane / 4;
                    const float rf[2] = {terms_rowf[row], terms_rowf[row + 8]};
                    const int rb[2] = {TAPS ? terms_border[row] : 0, TAPS ? terms_border[row + 8] : 0};
                    epilogue_chunk<BINARY, T, TAPS>(ep, acc_dump{dump + cw8 * BN * 8}, ep_stage, ep_colterm, ymap,
                                                    mt0 + 16 * cw8, c, nt, M, scale, rf, rb);
                }
                mbar_arrive(dump_empty);
            }
            if (lane == 0) tma_store_wait_all(); // the stage must outlive its last store
        }
    };

    if (wg == 0) { // producer: every stage of every tile of this CTA, in order
        if constexpr (SPLIT) asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(SPLIT_HELPER_REGS));
        else asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PRODUCER_REGS));
        if (ep.operands_last) griddep_wait(); // (before any load)
        if (gs.x) {
            if (gs.piece == 16) gather_producer<16, BM, BN, STAGES>(gs, &tb, ep.g, M, mt, ntn, ktiles, base, bars);
            else if (gs.piece == 8) gather_producer<8, BM, BN, STAGES>(gs, &tb, ep.g, M, mt, ntn, ktiles, base, bars);
            else gather_producer<4, BM, BN, STAGES>(gs, &tb, ep.g, M, mt, ntn, ktiles, base, bars);
            return;
        }
        if (SPLIT && warp > 0) {
            split_epilogue();
            return;
        }
        if (threadIdx.x != 0) return;
        int it = 0;
        for (tile_walk w(blockIdx.x, gridDim.x, mt); w.ni < ntn; w.next()) {
            const int m_row = (int)(w.mi * BM), n_row = (int)(w.ni * BN);
            for (int kt = 0; kt < ktiles; kt++, it++) {
                const int s = it % STAGES;
                mbar_wait(empty(s), ((it / STAGES) & 1) ^ 1);
                const uint32_t sa = base + s * STAGE_BYTES;
                mbar_expect_tx(full(s), STAGE_BYTES);
                tma_load(sa, &ta, kt * BK, m_row, full(s));
                tma_load(sa + BM * BK, &tb, kt * BK, n_row, full(s));
            }
        }
        return;
    }
    if (SPLIT && wg == 1 + NCW) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(SPLIT_HELPER_REGS));
        split_epilogue();
        return;
    }

    // Consumers: warpgroup cw computes rows [64 cw, 64 cw + 64) of every tile; PP: the whole of
    // every other tile (the CTA's tiles cw, cw + 2, ...).
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(consumer_regs(BINARY, BN)));
    const int cw = wg - 1, cwarp = cw * 4 + warp;
    // One stage of MMAs into d (kt: the stage's index in its tile); the stage before it goes back
    // to the producer once its MMAs are done (at most one group of MMAs stays in flight).
    // Gathered rows: pc, the ones MMA's accumulators (see ones_operand), gives the rows' popcounts.
    int it = 0, prev = -1;
    int pc[4] = {0, 0, 0, 0};
    const uint64_t dones = smem_desc((uint32_t)__cvta_generic_to_shared(ones));
    const int kwhole = (int)(ep.g.K / 256 < INT32_MAX ? ep.g.K / 256 : INT32_MAX);
    // The k-steps (32 bytes of K each) of a tile's last stage that hold any of K: those past it,
    // zeros in B, are not issued (3 of 4 at K = 576 bits, a 3x3 conv of 64 channels).
    // (1 to 4: the host rounds K's bytes up to whole stages, kbytes.)
    const int64_t kvbytes = BINARY ? (ep.g.K + 7) / 8 : ep.g.K;
    const int klast = (int)((kvbytes - (int64_t)(ktiles - 1) * BK + 31) / 32);
    // NK k-steps of one stage as one group (with the ones MMA beside each when count_rows).
    auto mma_group = [&](auto nk, int * d, uint64_t da, uint64_t db, int kt) {
        constexpr int NK = decltype(nk)::value;
        if (count_rows) {
            uint64_t dq[NK];
#pragma unroll
            for (int k = 0; k < NK; k++) dq[k] = dones + ones_slice(kt * (BK / 32) + k, kwhole);
            wg_fence();
#pragma unroll
            for (int k = 0; k < NK; k++) {
                wg_mma<BINARY, BN>(d, da + 2 * k, db + 2 * k, (kt | k) != 0);
                wg_b1_8(pc, da + 2 * k, dq[k], (kt | k) != 0);
            }
            wg_commit();
        } else {
            wg_fence();
#pragma unroll
            for (int k = 0; k < NK; k++) wg_mma<BINARY, BN>(d, da + 2 * k, db + 2 * k, (kt | k) != 0);
            wg_commit();
        }
    };
    auto mma_stage = [&](int * d, int kt) {
        const int s = it % STAGES;
        mbar_wait(full(s), (it / STAGES) & 1);
        if (gs.x) fence_proxy_async(); // rows written by the producer's copies, read by the MMAs
        const uint32_t sa = base + s * STAGE_BYTES;
        const uint64_t da = smem_desc(sa + (PP ? 0 : cw * 64 * BK)), db = smem_desc(sa + BM * BK);
        // (A branch per stage, each side a whole fenced group: with the branch between the MMAs,
        // or around them only, ptxas fences them itself.)
        static_assert(BK / 32 == 4, "four k-steps a stage");
        const int nk = kt == ktiles - 1 ? klast : BK / 32;
        if (nk == 4) mma_group(std::integral_constant<int, 4>(), d, da, db, kt);
        else if (nk == 3) mma_group(std::integral_constant<int, 3>(), d, da, db, kt);
        else if (nk == 2) mma_group(std::integral_constant<int, 2>(), d, da, db, kt);
        else mma_group(std::integral_constant<int, 1>(), d, da, db, kt);
        wg_wait<1>(); // (unconditional, so that ptxas sees every earlier group retired here)
        if (prev >= 0 && lane == 0) mbar_arrive(empty(prev));
        prev = s;
        it++;
    };
    auto drain = [&] {
        wg_wait<0>();
        if (prev >= 0 && lane == 0) mbar_arrive(empty(prev));
        prev = -1;
    };

    int d[ACC];
#pragma unroll
    for (int i = 0; i < ACC; i++) d[i] = 0;
    const float scale = SPLIT ? 0.0f : __fmul_rn(ld_scale(ep.sa), ld_scale(ep.sw));
    // (SPLIT: consumer warp c loads the column terms of columns c BN/8 + lane, lane < BN/8, only)
    // j: the tile's index among the CTA's, the stages' sequence number from j * ktiles.
    const int j0 = PP ? cw : 0, dj = PP ? 2 : 1;
    const bool after_prev = ep.terms_last || ep.operands_last; // started under the kernel before
    tile_walk w(blockIdx.x, gridDim.x, mt);
    if (j0) w.next();
    for (int j = j0; w.ni < ntn; j += dj) {
        const int64_t mt0 = (int64_t)w.mi * BM, nt = (int64_t)w.ni * BN;
        const int64_t mw = mt0 + (PP ? 0 : cw * 64) + warp * 16; // this warp's first row
        const int64_t n0 = SPLIT ? nt + cwarp * (BN / 8) : nt;
        int cpop[NCP];
        row_terms rt;
        if (!(j == j0 && after_prev)) {
            load_cols(cpop, n0);
            load_rows(rt, mw);
        }
        if (PP) {
            // The main loops take turns: tile j's after tile j - 1's MMAs were issued (by the other
            // warpgroup). So every stage's previous fill has been waited for when this one waits
            // for the next (a parity wait cannot mistake one for the other), and the epilogue of
            // one warpgroup overlaps the other's MMAs.
            if (j > 0) mbar_wait(turn(1 - cw), ((j - 1) >> 1) & 1);
            it = j * ktiles;
        }
        for (int kt = 0; kt < ktiles; kt++) mma_stage(d, kt);
        if (PP && lane == 0) mbar_arrive(turn(cw));
        drain();
        pin<ACC>(d);
        pin<4>(pc);
        if (j == j0 && after_prev) {
            griddep_wait();
            load_cols(cpop, n0);
            load_rows(rt, mw);
        }
        // Gathered rows: this thread's two fragment rows' popcounts, column 0 of pc in lanes 4q. (A
        // copy of rt.rpop: the element-wise epilogue takes its address, and handed rt.rpop, ptxas
        // puts all of rt in local memory, 32 bytes of stack in the 64-column kernels against 8.)
        int rpop[2] = {0, 0};
        if (count_rows) {
            rpop[0] = rt.rpop[0] = __shfl_sync(0xffffffffu, pc[0], lane & ~3);
            rpop[1] = rt.rpop[1] = __shfl_sync(0xffffffffu, pc[2], lane & ~3);
        }
        prepare_rows(rt, nt);
        if constexpr (SPLIT) {
            // The warp's part of the dump and its terms: once the epilogue warps have read the last
            // tile's.
            uint32_t * const part = dump + cwarp * BN * 8;
            mbar_wait(dump_empty, (j & 1) ^ 1);
#pragma unroll
            for (int i = 0; i < BN / 8; i++)
#pragma unroll
                for (int h = 0; h < 2; h++) part[(2 * i + h) * 32 + lane] = __byte_perm(d[4 * i + 2 * h], d[4 * i + 2 * h + 1], 0x5410);
            if (!TAPS && lane < BN / 8) terms_col[cwarp * (BN / 8) + lane] = DOT_BIAS - 2 * cpop[0];
            if (lane % 4 == 0)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    terms_rowf[cwarp * 16 + lane / 4 + 8 * h] = rt.rowf[h];
                    if (TAPS) terms_border[cwarp * 16 + lane / 4 + 8 * h] = rt.rborder[h];
                }
            mbar_arrive(dump_full);
        } else {
            if (BINARY && FAST && !TAPS) {
#pragma unroll
                for (int q = 0; q < NCP; q++) ep_colterm[lane + 32 * q] = DOT_BIAS - 2 * cpop[q];
                __syncwarp();
            }
            finish(acc_regs{d}, rt.rowf, rt.rborder, count_rows ? rpop : NULL, mw, nt, scale);
        }
        w.next();
        if (PP) w.next();
    }
    if (!SPLIT && ymap && lane == 0) tma_store_wait_all(); // the stage must outlive its last store
#endif
}

// --- host side ----------------------------------------------------------------------------------


typedef CUresult (*encode_tiled_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                    const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                    CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The driver's tensor-map encoder, fetched once (NULL when the driver lacks it).
encode_tiled_fn encoder() {
    static const encode_tiled_fn fn = [] {
        void * p = NULL;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess) {
            cudaGetLastError();
            return (encode_tiled_fn)NULL;
        }
        return (encode_tiled_fn)p;
    }();
    return fn;
}

// A 2-D byte tensor of `rows` rows of `kbytes` bytes, `ld` bytes apart, read in boxes of
// 128 bytes x box_rows rows with the 128-byte swizzle; reads past the edges return zeros.
bool make_map(CUtensorMap * map, const uint8_t * p, int64_t rows, int64_t kbytes, int64_t ld, int box_rows) {
    const cuuint64_t dims[2] = {(cuuint64_t)kbytes, (cuuint64_t)rows};
    const cuuint64_t strides[1] = {(cuuint64_t)ld};
    const cuuint32_t box[2] = {(cuuint32_t)BK, (cuuint32_t)box_rows};
    const cuuint32_t estr[2] = {1, 1};
    return encoder()(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, (void *)p, dims, strides, box, estr,
                     CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                     CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// A map of y as a 2-D tensor [M rows][N features] for the epilogue's bulk stores, when the rows
// (n, oh, ow) of the GEMM lie evenly spaced in y (NHWC or [batch, O] with contiguous features),
// 16-byte aligned, and y is f32/f16/bf16; boxes of 16 rows x 128 bytes in the 128-byte swizzle.
// false: the epilogue stores rows itself.
bool make_y_map(CUtensorMap * map, const gemm_epilogue & ep, int64_t M, int64_t N) {
    const struct dview & y = ep.y;
    const struct dgeom & g = ep.g;
    const int esz = y.dtype == BIE_DTYPE_F32 ? 4 : y.dtype == BIE_DTYPE_F16 || y.dtype == BIE_DTYPE_BF16 ? 2 : 0;
    if (!esz || (y.stride[1] != 1 && N > 1) || ((uintptr_t)y.data % 16) != 0) return false;
    const int64_t pitch = g.OW > 1 ? y.stride[3] : g.OH > 1 ? y.stride[2] : y.stride[0]; // elements between rows
    if (g.OW > 1 && g.OH > 1 && y.stride[2] != pitch * g.OW) return false;
    if ((g.OW > 1 || g.OH > 1) && g.batch > 1 && y.stride[0] != pitch * g.OH * g.OW) return false;
    if (pitch < N || (pitch * esz) % 16 != 0 || M > INT32_MAX || N > INT32_MAX) return false;
    const cuuint64_t dims[2] = {(cuuint64_t)N, (cuuint64_t)M};
    const cuuint64_t strides[1] = {(cuuint64_t)(pitch * esz)};
    const cuuint32_t box[2] = {(cuuint32_t)(128 / esz), 16};
    const cuuint32_t estr[2] = {1, 1};
    const CUtensorMapDataType dt = esz == 4 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                   : y.dtype == BIE_DTYPE_F16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                              : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    return encoder()(map, dt, 2, (void *)y.data, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                     CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                     CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Whether the epilogue may store y as planes (Y_PLANES): f32/f16/bf16 y of a conv whose features
// are not contiguous but whose samples' pixels are (NCHW: stride[3] == 1, stride[2] == OW).
bool y_planes(const gemm_epilogue & ep) {
    const struct dview & y = ep.y;
    const struct dgeom & g = ep.g;
    const bool fl = y.dtype == BIE_DTYPE_F32 || y.dtype == BIE_DTYPE_F16 || y.dtype == BIE_DTYPE_BF16;
    return fl && g.OH * g.OW > 1 && y.stride[1] != 1 && (g.OW == 1 || y.stride[3] == 1) &&
           (g.OH == 1 || y.stride[2] == g.OW);
}

// Whether the SPLIT tiles can take this GEMM: their epilogue warps store float y by bulk copies only.
bool split_fits(const gemm_epilogue & ep, int64_t M, int64_t N) {
    const int dt = ep.y.dtype;
    CUtensorMap m;
    return (dt == BIE_DTYPE_F16 || dt == BIE_DTYPE_BF16 || dt == BIE_DTYPE_F32) && ep.g.K < DOT_BIAS_MAX_K &&
           make_y_map(&m, ep, M, N);
}

template <bool BINARY, int BN, typename T, bool FAST, bool TAPS>
enum bie_status launch(bie_context_t * ctx, const CUtensorMap & ta, const CUtensorMap & tb, int64_t M, int64_t N,
                       int ktiles, const gemm_epilogue & ep, const gemm_gather & gs, int slot) {
    auto kern = wgmma_gemm<BINARY, BN, T, FAST, TAPS>;
    const int smem = smem_for(BINARY, BN), BM = bm_for(BINARY, BN), threads = threads_for(BINARY, BN);
    struct bie_cuda_state * st = ctx->cuda;
    if (slot < 0 || slot >= 64) return bie_set_error(ctx, BIE_STATUS_INTERNAL, "wgmma gemm: launch slot %d out of range", slot);
    if (!(st->wgmma_smem_set & (1ull << slot))) {
        // The consumers' setmaxnreg.inc would wait forever if the launch gave fewer registers
        // than the split assumes.
        cudaFuncAttributes fa;
        CU_TRY(ctx, cudaFuncGetAttributes(&fa, kern), "cudaFuncGetAttributes(wgmma gemm)");
        if (fa.numRegs * threads < regs_needed(BINARY, BN))
            return bie_set_error(ctx, BIE_STATUS_INTERNAL, "wgmma gemm: built with %d registers per thread, too few",
                                 fa.numRegs);
        CU_TRY(ctx, cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
               "cudaFuncSetAttribute(wgmma gemm)");
        st->wgmma_smem_set |= 1ull << slot;
    }
    const int64_t tiles = ((M + BM - 1) / BM) * ((N + BN - 1) / BN);
    const int sms = bie_cuda_sm_count(ctx);
    if (sms <= 0) return bie_set_error(ctx, BIE_STATUS_DEVICE_ERROR, "cuda: the multiprocessor count cannot be read");
    const unsigned grid = (unsigned)(tiles < sms ? tiles : sms);
    CUtensorMap ty;
    const bool y_by_map = FAST && make_y_map(&ty, ep, M, N);
    if (!y_by_map) memset(&ty, 0, sizeof ty);
    if (split_for(BINARY, BN) && (!y_by_map || gs.x))
        return bie_set_error(ctx, BIE_STATUS_INTERNAL, "wgmma gemm: SPLIT tiles without a y map or with gathered rows");
    const int y_mode = y_by_map ? Y_ROWS_MAP : FAST && y_planes(ep) ? Y_PLANES : Y_ROWS;
    // After a kernel that wrote epilogue terms only, as a programmatic dependent launch: the CTAs
    // start (barriers, first loads and MMAs) while that kernel finishes. After one that wrote an
    // operand, the same with the producer waiting before its first load.
    cudaLaunchAttribute attr;
    cudaLaunchConfig_t cfg =
        bie_cuda_launch_config(ctx, dim3(grid), dim3(threads), (size_t)smem, ep.terms_last || ep.operands_last, &attr);
    CU_TRY(ctx, cudaLaunchKernelEx(&cfg, kern, ta, tb, ty, y_mode, M, N, ktiles, ep, gs), "wgmma gemm launch");
    LAUNCHED(ctx, "wgmma gemm");
    return BIE_STATUS_OK;
}

// Launch slots (bits of wgmma_smem_set): 9 per tile shape (width, operand type), in the order
// of by_output's launches below.
template <bool BINARY, int BN>
enum bie_status by_output(bie_context_t * ctx, const CUtensorMap & ta, const CUtensorMap & tb, int64_t M, int64_t N,
                          int ktiles, const gemm_epilogue & ep, const gemm_gather & gs, int shape) {
    const struct dview & y = ep.y;
    const bool fast = (y.stride[1] == 1 || N == 1 || y_planes(ep)) && (!BINARY || ep.g.K < DOT_BIAS_MAX_K);
    const int slot = 9 * shape;
    if constexpr (split_for(BINARY, BN)) { // (bie_cuda_gemm_wgmma checked split_fits)
        const bool taps = ep.tapcorr != NULL;
        if (y.dtype == BIE_DTYPE_F16)
            return taps ? launch<BINARY, BN, __half, true, true>(ctx, ta, tb, M, N, ktiles, ep, gs, slot + 2)
                        : launch<BINARY, BN, __half, true, false>(ctx, ta, tb, M, N, ktiles, ep, gs, slot + 5);
        if (y.dtype == BIE_DTYPE_BF16)
            return taps ? launch<BINARY, BN, __nv_bfloat16, true, true>(ctx, ta, tb, M, N, ktiles, ep, gs, slot + 3)
                        : launch<BINARY, BN, __nv_bfloat16, true, false>(ctx, ta, tb, M, N, ktiles, ep, gs, slot + 6);
        return taps ? launch<BINARY, BN, float, true, true>(ctx, ta, tb, M, N, ktiles, ep, gs, slot + 4)
                    : launch<BINARY, BN, float, true, false>(ctx, ta, tb, M, N, ktiles, ep, gs, slot + 7);
    } else {
        if (y.dtype == BIE_DTYPE_B1 && !ep.sign) { // sign bits straight from the epilogue
            if (BINARY && ep.tapcorr) return launch<BINARY, BN, bits_t, true, true>(ctx, ta, tb, M, N, ktiles, ep, gs, slot);
            return launch<BINARY, BN, bits_t, true, false>(ctx, ta, tb, M, N, ktiles, ep, gs, slot + 1);
        }
        if (BINARY && ep.tapcorr && fast) { // a zero-padded binary conv: the border correction compiled in
            if (y.dtype == BIE_DTYPE_F16) return launch<BINARY, BN, __half, true, true>(ctx, ta, tb, M, N, ktiles, ep, gs, slot + 2);
            if (y.dtype == BIE_DTYPE_BF16)
                return launch<BINARY, BN, __nv_bfloat16, true, true>(ctx, ta, tb, M, N, ktiles, ep, gs, slot + 3);
            if (y.dtype == BIE_DTYPE_F32) return launch<BINARY, BN, float, true, true>(ctx, ta, tb, M, N, ktiles, ep, gs, slot + 4);
        } // (other y of a zero-padded conv: the element-wise path below, which handles the taps too)
        if (fast && y.dtype == BIE_DTYPE_F16) return launch<BINARY, BN, __half, true, false>(ctx, ta, tb, M, N, ktiles, ep, gs, slot + 5);
        if (fast && y.dtype == BIE_DTYPE_BF16)
            return launch<BINARY, BN, __nv_bfloat16, true, false>(ctx, ta, tb, M, N, ktiles, ep, gs, slot + 6);
        if (fast && y.dtype == BIE_DTYPE_F32)
            return launch<BINARY, BN, float, true, false>(ctx, ta, tb, M, N, ktiles, ep, gs, slot + 7);
        return launch<BINARY, BN, float, false, false>(ctx, ta, tb, M, N, ktiles, ep, gs, slot + 8);
    }
}

// Shapes 0-2: n-bit 64, 128, 256 columns; 3-6: binary 64, 128, 192, 256.
template <bool BINARY>
enum bie_status by_width(bie_context_t * ctx, const CUtensorMap & ta, const CUtensorMap & tb, int bn, int64_t M,
                         int64_t N, int ktiles, const gemm_epilogue & ep, const gemm_gather & gs) {
    if constexpr (BINARY) {
        if (bn == 64) return by_output<true, 64>(ctx, ta, tb, M, N, ktiles, ep, gs, 3);
        if (bn == 128) return by_output<true, 128>(ctx, ta, tb, M, N, ktiles, ep, gs, 4);
        if (bn == 192) return by_output<true, 192>(ctx, ta, tb, M, N, ktiles, ep, gs, 5);
        return by_output<true, 256>(ctx, ta, tb, M, N, ktiles, ep, gs, 6);
    } else {
        if (bn == 64) return by_output<false, 64>(ctx, ta, tb, M, N, ktiles, ep, gs, 0);
        if (bn == 128) return by_output<false, 128>(ctx, ta, tb, M, N, ktiles, ep, gs, 1);
        return by_output<false, 256>(ctx, ta, tb, M, N, ktiles, ep, gs, 2);
    }
}

} // namespace

bool bie_cuda_wgmma_packs_bits(const gemm_epilogue & ep, int64_t N) {
    const struct dview & y = ep.y;
    const struct dgeom & g = ep.g;
    if (y.dtype != BIE_DTYPE_B1 || N % 8 || (y.stride[1] != 1 && N > 1) || (ep.binary && g.K >= DOT_BIAS_MAX_K))
        return false;
    const int64_t pitch = y_row_pitch(ep); // bits between rows
    if (g.OW > 1 && g.OH > 1 && y.stride[2] != pitch * g.OW) return false;
    if ((g.OW > 1 || g.OH > 1) && g.batch > 1 && y.stride[0] != pitch * g.OH * g.OW) return false;
    return pitch >= N && pitch % 8 == 0;
}

bool bie_cuda_wgmma_usable(bie_context_t * ctx) {
    return bie_cuda_cc(ctx) == 90 && !ctx->cuda->force_mma && encoder() != NULL;
}

int bie_cuda_wgmma_tile_n(bie_context_t * ctx, int64_t M, int64_t N, int64_t kbytes, bool binary) {
    // The narrowest width that covers N when N is small (a conv with 64 channels wastes nothing).
    // Wider, tiles that still give every SM one: binary, 192 (SPLIT, the epilogue overlapped) when
    // the popcounts fit 16 bits, the last column tile wastes at most N / 16 and every SM gets
    // SPLIT_MIN_ROUNDS tiles or more; else 256, else 128.
    const int64_t mt = (M + 127) / 128, sms = bie_cuda_sm_count(ctx), n192 = (N + 191) / 192;
    if (N <= 64) return 64;
    if (N <= 128) return 128;
    if (binary && kbytes / BK <= SPLIT_MAX_KTILES && n192 * 192 - N <= N / 16 &&
        mt * n192 >= SPLIT_MIN_ROUNDS * sms)
        return 192;
    return mt * ((N + 255) / 256) >= sms ? 256 : 128;
}

bool bie_cuda_wgmma_counts_rows(bie_context_t * ctx, int64_t M, int64_t N, int64_t kbytes) {
    return ones_for(true, bie_cuda_wgmma_tile_n(ctx, M, N, kbytes, true)) > 0;
}

enum bie_status bie_cuda_gemm_wgmma(bie_context_t * ctx, const uint8_t * A, const uint8_t * B, int64_t M, int64_t N,
                                    int64_t kbytes, const gemm_epilogue & ep, const gemm_gather * gs) {
    int bn = bie_cuda_wgmma_tile_n(ctx, M, N, kbytes, ep.binary);
    // (B1 y, y without a map, gathered rows: the consumers store the tiles)
    if (bn == 192 && (gs || !split_fits(ep, M, N))) bn = 256;
    CUtensorMap ta, tb;
    if (!make_map(&tb, B, N, kbytes, ep.ldb, bn) || (!gs && !make_map(&ta, A, M, kbytes, kbytes, bm_for(ep.binary, bn))))
        return bie_set_error(ctx, BIE_STATUS_DEVICE_ERROR, "cuda: cuTensorMapEncodeTiled refused the GEMM operands");
    if (gs) ta = tb; // (unused: the producer gathers A)
    gemm_gather none;
    memset(&none, 0, sizeof none);
    const int ktiles = (int)(kbytes / BK);
    if (gs && !ep.binary) return bie_set_error(ctx, BIE_STATUS_INTERNAL, "wgmma gemm: gathered rows of an n-bit layer");
    return ep.binary ? by_width<true>(ctx, ta, tb, bn, M, N, ktiles, ep, gs ? *gs : none)
                     : by_width<false>(ctx, ta, tb, bn, M, N, ktiles, ep, none);
}
