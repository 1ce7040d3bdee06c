// SPDX-License-Identifier: Apache-2.0
// cuda-wgmma-tiles.cuh: the Hopper (sm_90a) tensor-core GEMM of the forward pass: the same
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
//
// This header holds the tile shapes and the shared-memory plan that the kernel and the host
// agree on, the tile walk of the persistent grid and the ones operand; the PTX wrappers are in
// cuda-ptx.cuh, the producers in cuda-wgmma-producer.cuh, the epilogues in
// cuda-wgmma-epilogue.cuh, the kernel in cuda-wgmma-kernel.cuh, its instances in
// cuda-wgmma-kernels-*.cu (one entry each in the launch table), and the tensor maps and the
// dispatch in cuda-wgmma.cu.
#pragma once

#include "cuda-epilogue.cuh"
#include "cuda-ptx.cuh"

#include <type_traits>

namespace {

constexpr int BK = 128; // bytes of K per stage (1024 bits / 128 int8 codes)

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
__host__ __device__ constexpr int dump_for(bool binary, int bn) {
    return split_for(binary, bn) ? bm_for(binary, bn) * bn * 2 : 0;
}
__host__ __device__ constexpr int epilogue_warps(bool binary, int bn) {
    return split_for(binary, bn) ? 7 : 4 * cw_for(bn);
}
// Registers per thread after setmaxnreg: the producer gives up its registers above 40, and the
// consumers take them (the launch gives every thread 65536 / threads_for, rounded down to 8).
// SPLIT: the two warpgroups of epilogue warps give up 8 of their 128, and the consumers take them.
constexpr int PRODUCER_REGS = 40, SPLIT_HELPER_REGS = 120;
__host__ __device__ constexpr int consumer_regs(bool binary, int bn) {
    return split_for(binary, bn) ? 136 : cw_for(bn) == 2 ? 232 : 104;
}
__host__ __device__ constexpr int regs_needed(bool binary, int bn) {
    return 128 *
           ((split_for(binary, bn) ? 2 * SPLIT_HELPER_REGS : PRODUCER_REGS) + cw_for(bn) * consumer_regs(binary, bn));
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
struct bits_t {};                                    // the output type of the fast epilogue's B1 y (epilogue_bits)
constexpr int64_t DOT_BIAS_MAX_K = (int64_t)1 << 21; // DOT_BIAS and its conversion: in the device code

__host__ __device__ constexpr int stages_for(bool binary, int bn) {
    return ring_for(binary, bn) / ((bm_for(binary, bn) + bn) * BK);
}
__host__ __device__ constexpr bool shape_ok(bool binary, int bn) {
    return stages_for(binary, bn) * (bm_for(binary, bn) + bn) * BK == ring_for(binary, bn) &&
           stages_for(binary, bn) >= 3 && smem_for(binary, bn) <= 232448 &&
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

#endif // sm_90a device code

// --- the launch table -----------------------------------------------------------------------------

// What a kernel instance stores: y's element type (OUT_BITS: the B1 y of epilogue_bits).
enum wgmma_out { OUT_BITS, OUT_F16, OUT_BF16, OUT_F32 };
template <typename T> constexpr wgmma_out out_of() {
    return std::is_same<T, bits_t>::value          ? OUT_BITS
           : std::is_same<T, __half>::value        ? OUT_F16
           : std::is_same<T, __nv_bfloat16>::value ? OUT_BF16
                                                   : OUT_F32;
}
// A kernel instance's template arguments (see wgmma_gemm): operand type, tile width, output,
// FAST epilogue, border correction of a zero-padded conv compiled in.
struct wgmma_key {
    bool binary;
    int bn;
    wgmma_out out;
    bool fast, taps;
};
typedef void (*wgmma_kernel_fn)(CUtensorMap, CUtensorMap, CUtensorMap, int, int64_t, int64_t, int, gemm_epilogue,
                                gemm_gather);
struct wgmma_kernel {
    wgmma_key key;
    wgmma_kernel_fn fn;
};

} // namespace

// The instances that the dispatch can choose, in groups compiled apart (cuda-wgmma-kernels-*.cu)
// so that a parallel build compiles them at once. A kernel's index in the concatenated table is
// its bit in bie_cuda_state.wgmma_smem_set.
struct wgmma_kernel_group {
    const wgmma_kernel * kernels;
    int n;
};
extern const wgmma_kernel_group bie_wgmma_kernels_nbit, bie_wgmma_kernels_b1_narrow, bie_wgmma_kernels_b1_wide;
