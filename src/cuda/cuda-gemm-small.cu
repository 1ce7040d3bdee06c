// SPDX-License-Identifier: Apache-2.0
// cuda-gemm-small.cu: the forward GEMM of calls with few rows (M <= SMALL_M_MAX: inference
// batches, single samples), where the tiled kernels leave most of the GPU idle and the separate
// popcount launches cost more than the GEMM. Same operands, formulas and epilogue as cuda-gemm.cu
// (whose header comment gives the math), through the same mma.sync instructions (BMMA .and.popc
// m16n8k256 / IMMA s8 m16n8k32), in one launch with the binary popcounts fused.
//
// Work split: a CTA owns NB = 16 output columns (two 8-column MMA tiles) and all M rows (MT tiles
// of 16); its KW warps split K in 128-byte chunks (warp w takes chunks w, w + KW, ...). The warps
// then hand their partial sums over through shared memory, and each adds them (in warp order) for
// a quarter of the outputs and stores those. The operands are not staged in shared memory: in a
// chunk, lane (g = lane/4, t = lane%4) loads the 16-byte vectors at bytes 16t and 64 + 16t of A
// rows g and g + 8 and of B row (output column) g; word i of the two vectors is the fragment's
// k-half 0 and 1 in MMA step i. Every k of the chunk is used once, and A and B see the same
// permutation of k, so the sums are those of the plain order. Binary popcounts come from the same
// words: A's padding bits are zero, and B's words are masked past K in the chunk that holds bit K
// (a weight read in place may hold anything there).
#include "cuda-epilogue.cuh"
#include "cuda-ptx.cuh"

namespace {

constexpr int KW = 4;      // warps splitting K
constexpr int NB = 16;     // output columns per CTA (two n8 tiles)
constexpr int CHUNK = 128; // bytes of K per warp step (four MMA k-steps)

__device__ __forceinline__ uint32_t word(const uint4 & v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Binary: adds a chunk's popcounts of the lane's A rows and B columns to pop (rows g, g + 8 of each
// m tile, then the two n tiles' columns), B's over its first K bits only.
template <int MT>
__device__ __forceinline__ void count_chunk(int * pop, const uint4 (&a)[MT][2][2], const uint4 (&b)[2][2],
                                            int64_t byte0, int64_t ch, int64_t K) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) pop[mt * 2 + h] += popc4(a[mt][h][0]) + popc4(a[mt][h][1]);
    const int64_t w0 = byte0 / 4;                 // first word of the lane's first vector
    const bool whole = (ch + 1) * CHUNK * 8 <= K; // no bit of the chunk past K
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
        pop[MT * 2 + nt] +=
            whole ? popc4(b[nt][0]) + popc4(b[nt][1]) : popc_below(b[nt][0], w0, K) + popc_below(b[nt][1], w0 + 16, K);
}

template <bool BINARY, int MT>
__global__ void __launch_bounds__(KW * 32)
    gemm_small_kernel(const uint8_t * __restrict__ A, const uint8_t * __restrict__ B, int64_t M, int64_t N,
                      int64_t kbytes, const gemm_epilogue ep) {
    constexpr int ACC = MT * 2 * 4;  // accumulators per lane
    constexpr int POPS = MT * 2 + 2; // row popcounts (rows g, g+8 of each m tile), then columns
    __shared__ int part[KW][32][ACC + POPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int64_t n0 = (int64_t)blockIdx.x * NB;
    const int64_t chunks = kbytes / CHUNK;
    // Launched as a programmatic dependent launch: the CTA starts while the kernel before finishes.
    // It asks the L2 cache for its weight rows at once (safe before the wait: the L2 is where all
    // writes meet, so a line the kernel before still writes is updated there, and the loads below
    // read it after the wait), waits for that kernel (which may write A or B, or still read y)
    // before any load or store, and lets the next kernel launch.
    if (threadIdx.x < NB && n0 + threadIdx.x < N) prefetch_l2(B + (n0 + threadIdx.x) * ep.ldb, (uint32_t)kbytes);
    griddep_wait();
    griddep_launch_dependents();

    int acc[ACC], pop[POPS];
#pragma unroll
    for (int i = 0; i < ACC; i++) acc[i] = 0;
#pragma unroll
    for (int i = 0; i < POPS; i++) pop[i] = 0;

    const uint4 zero = make_uint4(0, 0, 0, 0);
    for (int64_t ch = warp; ch < chunks; ch += KW) {
        const int64_t byte0 = ch * CHUNK + 16 * t;
        uint4 a[MT][2][2], b[2][2]; // [tile][row g / g+8][half], [n tile][half]
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int64_t m = mt * 16 + g + 8 * h;
                const uint4 * row = (const uint4 *)(A + m * kbytes + byte0);
                a[mt][h][0] = m < M ? __ldg(row) : zero;
                a[mt][h][1] = m < M ? __ldg(row + 4) : zero;
            }
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            const int64_t n = n0 + nt * 8 + g;
            const uint4 * row = (const uint4 *)(B + n * ep.ldb + byte0);
            b[nt][0] = n < N ? __ldg(row) : zero;
            b[nt][1] = n < N ? __ldg(row + 4) : zero;
        }
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < 2; nt++)
                    mma_sync<BINARY>(acc + (mt * 2 + nt) * 4, word(a[mt][0][0], i), word(a[mt][1][0], i),
                                     word(a[mt][0][1], i), word(a[mt][1][1], i), word(b[nt][0], i), word(b[nt][1], i));
        if (BINARY) count_chunk<MT>(pop, a, b, byte0, ch, ep.g.K);
    }

    // Every warp hands its partial sums over; warp w then finishes the fragment pairs of n tile
    // w / 2 in row half w % 2 (rows g or g + 8 of each m tile), adding the parts in warp order.
    static_assert(KW == 4, "one warp per (n tile, row half) in the epilogue");
#pragma unroll
    for (int i = 0; i < ACC; i++) part[warp][lane][i] = acc[i];
#pragma unroll
    for (int i = 0; i < POPS; i++) part[warp][lane][ACC + i] = pop[i];
    __syncthreads();
    const int nt = warp >> 1, h = warp & 1;
    int sum[MT][2], rowpop[MT], colpop = 0;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) sum[mt][0] = sum[mt][1] = rowpop[mt] = 0;
    for (int w = 0; w < KW; w++) {
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            sum[mt][0] += part[w][lane][(mt * 2 + nt) * 4 + 2 * h];
            sum[mt][1] += part[w][lane][(mt * 2 + nt) * 4 + 2 * h + 1];
            rowpop[mt] += part[w][lane][ACC + mt * 2 + h];
        }
        colpop += part[w][lane][ACC + MT * 2 + nt];
    }
    // Whole-row popcounts: the four lanes of a group hold parts of the same rows and columns.
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        rowpop[mt] += __shfl_xor_sync(0xffffffffu, rowpop[mt], 1);
        rowpop[mt] += __shfl_xor_sync(0xffffffffu, rowpop[mt], 2);
    }
    colpop += __shfl_xor_sync(0xffffffffu, colpop, 1);
    colpop += __shfl_xor_sync(0xffffffffu, colpop, 2);

    // Lane (g, t) holds rows g + 8h of each m tile at columns 2t and 2t+1 of the n tile; the
    // popcount of column j of the n tile is in the lanes of group j.
    const float scale = __fmul_rn(ld_scale(ep.sa), ld_scale(ep.sw));
    const int cp0 = __shfl_sync(0xffffffffu, colpop, 8 * t), cp1 = __shfl_sync(0xffffffffu, colpop, 8 * t + 4);
    const int64_t n = n0 + nt * 8 + 2 * t;
    if (n >= N) return; // (with a packed y, N % 8 == 0: all four lanes of a group, or none)
    // A B1 y that the kernel packs (bie_cuda_gemm_packs_bits: rows y_row_pitch bits apart, whole
    // bytes, N % 8 == 0): the four lanes of a group hold the 8 signs of the n tile's byte in a row.
    const bool bits = ep.y.dtype == BIE_DTYPE_B1 && !ep.sign;
    const unsigned quad = 0xfu << (lane & ~3);
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        const int64_t m = mt * 16 + g + 8 * h;
        if (m >= M) continue;
        row_info r = make_row(ep, m, M);
        r.rowpop = rowpop[mt];
        const int d0 = BINARY ? dot_from_terms(sum[mt][0], r.rowpop, cp0, r.kterm) : sum[mt][0];
        const int d1 = BINARY ? dot_from_terms(sum[mt][1], r.rowpop, cp1, r.kterm) : sum[mt][1];
        if (bits) { // (the sign codes' rule: dot >= 0)
            unsigned b = ((d0 >= 0 ? 1u : 0u) | (d1 >= 0 ? 2u : 0u)) << (2 * t);
            b |= __shfl_xor_sync(quad, b, 1);
            b |= __shfl_xor_sync(quad, b, 2);
            if (t == 0) ((uint8_t *)ep.y.data)[(m * y_row_pitch(ep) + n0 + nt * 8) / 8] = (uint8_t)b;
            continue;
        }
        store_pair(ep, r, n, d0, d1, n + 1 < N, scale);
    }
}

template <bool BINARY, int MT>
enum bie_status launch(bie_context_t * ctx, const uint8_t * A, const uint8_t * B, int64_t M, int64_t N, int64_t kbytes,
                       const gemm_epilogue & ep) {
    const int64_t blocks = (N + NB - 1) / NB;
    if (blocks > INT32_MAX)
        return bie_set_error(ctx, BIE_STATUS_UNSUPPORTED, "weight: too many output features for one launch");
    // A programmatic dependent launch on sm_90 and later: the CTAs are scheduled while the kernel
    // before finishes (they wait for it first thing), which hides most of a launch's latency in a
    // run of small calls.
    cudaLaunchAttribute attr;
    cudaLaunchConfig_t cfg =
        bie_cuda_launch_config(ctx, dim3((unsigned)blocks), dim3(KW * 32), 0, bie_cuda_cc(ctx) >= 90, &attr);
    CU_TRY(ctx, cudaLaunchKernelEx(&cfg, gemm_small_kernel<BINARY, MT>, A, B, M, N, kbytes, ep),
           "gemm (few rows) launch");
    LAUNCHED(ctx, "gemm (few rows)");
    return BIE_STATUS_OK;
}

} // namespace

enum bie_status bie_cuda_gemm_small(bie_context_t * ctx, const uint8_t * A, const uint8_t * B, int64_t M, int64_t N,
                                    int64_t kbytes, const gemm_epilogue & ep) {
    if (M > SMALL_M_MAX || ep.tapcorr || kbytes % CHUNK)
        return bie_set_error(ctx, BIE_STATUS_INTERNAL, "gemm (few rows): called outside its case");
    if (ep.binary)
        return M <= 16 ? launch<true, 1>(ctx, A, B, M, N, kbytes, ep) : launch<true, 2>(ctx, A, B, M, N, kbytes, ep);
    return M <= 16 ? launch<false, 1>(ctx, A, B, M, N, kbytes, ep) : launch<false, 2>(ctx, A, B, M, N, kbytes, ep);
}
