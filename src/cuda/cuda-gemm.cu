// SPDX-License-Identifier: Apache-2.0
// cuda-gemm.cu: the tensor-core GEMM of the forward pass, on packed operands, with the layer
// epilogue fused.
//
//   binary: A [M][kbytes] and B [N][kbytes] (rows ep.ldb bytes apart) hold bits (1 <-> +1); acc = popc(a AND b) through
//           mma.sync m16n8k256 .and.popc (native BMMA on sm_80 and sm_90; the .xor form is
//           emulated on sm_90 and never used). The +-1 dot product over the row's K valid
//           positions is  dot = 4*popc(a&w) - 2*popc(a) - 2*popc(w) + K,  where padding bits are 0
//           in both operands and so add nothing to any popcount. For a conv with BIE_PAD_ZERO the
//           padded taps hold a = 0 bits and must contribute 0, not -w: summing only over the valid
//           taps V of the output position gives
//             dot = 4*popc(a&w) - 2*popc(a) - 2*(popc(w) - sum_{t not in V} popc(w_t)) + C*|V|
//           (popc(w_t) = the weight's popcount on tap t). The taps outside the image depend only on
//           the pixel's border class (border_class in cuda-impl.cuh: 9 classes for a 3x3 kernel with
//           padding 1), so 2 * sum_{t not in V} popc(w_t) is a table [class][output channel] built
//           before the GEMM, and the epilogue adds one entry of it on border pixels.
//   n-bit:  A, B hold int8 codes (4-bit codes unpacked to int8: Hopper has no native int4 MMA);
//           acc = dot through mma.sync m16n8k32 s8 (IMMA).
//   y = (float)dot * (scale_a * scale_w) rounded to y's dtype; I32 y = dot; B1 y = (dot >= 0).
//
// Tiling: a CTA computes BM x BN = (64*WM) x (64*WN) outputs with WM*WN warps, each warp 64 x 64
// (4 x 8 MMA tiles); K advances 128 bytes (1024 bits / 128 int8) per stage through a 3-stage
// cp.async pipeline; shared-memory rows are 128 bytes with their 16-byte chunks XOR-swizzled by
// the row so that ldmatrix reads are conflict-free. Rows past M or N are zero-filled.
#include "cuda-epilogue.cuh"
#include "cuda-ptx.cuh"

namespace {

constexpr int BKB = 128; // bytes of K per stage
constexpr int STAGES = 3;

template <bool BINARY, int WM, int WN>
__global__ void __launch_bounds__(WM * WN * 32, 1)
    gemm_kernel(const uint8_t * __restrict__ A, const uint8_t * __restrict__ B, int64_t M, int64_t N, int64_t kbytes,
                const gemm_epilogue ep) {
    constexpr int BM = 64 * WM, BN = 64 * WN, NT = WM * WN * 32;
    extern __shared__ __align__(128) uint8_t smem[];
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(smem);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp / WN, wn = warp % WN;
    const int64_t bm = (int64_t)blockIdx.x * BM, bn = (int64_t)blockIdx.y * BN;
    const int ktiles = (int)(kbytes / BKB);

    auto load_stage = [&](int stage, int kt) {
        const uint32_t sA = sbase + stage * (BM + BN) * BKB;
        for (int c = tid; c < (BM + BN) * 8; c += NT) {
            const int row = c >> 3, chunk = c & 7;
            const uint32_t dst = sA + row * BKB + ((chunk ^ (row & 7)) << 4);
            const uint8_t * src;
            bool valid;
            if (row < BM) {
                const int64_t gm = bm + row;
                valid = gm < M;
                src = A + (valid ? gm : 0) * kbytes + (int64_t)kt * BKB + chunk * 16;
            } else {
                const int64_t gn = bn + row - BM;
                valid = gn < N;
                src = B + (valid ? gn : 0) * ep.ldb + (int64_t)kt * BKB + chunk * 16;
            }
            cp_async16(dst, src, valid);
        }
    };

    int acc[4][8][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int k = 0; k < 4; k++) acc[i][j][k] = 0;

#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < ktiles) load_stage(s, s);
        cp_async_commit();
    }

    for (int kt = 0; kt < ktiles; kt++) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        if (kt + STAGES - 1 < ktiles) load_stage((kt + STAGES - 1) % STAGES, kt + STAGES - 1);
        cp_async_commit();
        const uint32_t sA = sbase + (kt % STAGES) * (BM + BN) * BKB;
        const uint32_t sB = sA + BM * BKB;
#pragma unroll
        for (int ks = 0; ks < BKB / 32; ks++) {
            uint32_t a[4][4], b[8][2];
#pragma unroll
            for (int mi = 0; mi < 4; mi++) {
                const int row = wm * 64 + mi * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
                const int chunk = ks * 2 + (lane >> 4);
                ldsm_x4(sA + row * BKB + ((chunk ^ (row & 7)) << 4), a[mi][0], a[mi][1], a[mi][2], a[mi][3]);
            }
#pragma unroll
            for (int p = 0; p < 4; p++) {
                const int row = wn * 64 + p * 16 + (lane & 7) + (lane >> 4) * 8;
                const int chunk = ks * 2 + ((lane >> 3) & 1);
                ldsm_x4(sB + row * BKB + ((chunk ^ (row & 7)) << 4), b[2 * p][0], b[2 * p][1], b[2 * p + 1][0],
                        b[2 * p + 1][1]);
            }
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
#pragma unroll
                for (int nj = 0; nj < 8; nj++)
                    mma_sync<BINARY>(acc[mi][nj], a[mi][0], a[mi][1], a[mi][2], a[mi][3], b[nj][0], b[nj][1]);
        }
    }
    cp_async_wait<0>();

    // Epilogue, kept small (a fully unrolled one overflows the instruction cache): each warp puts
    // its 64 x 64 raw accumulators in shared memory, then walks its rows with the whole warp, lane
    // l owning columns 2l and 2l+1, so the layer math runs once per element in a rolled loop and
    // rows of y are written coalesced.
    __syncthreads(); // all warps are done reading the pipeline's shared memory
    constexpr int LD = 64 + 4;
    int * tile = (int *)smem + warp * 64 * LD;
    {
        const int g = lane >> 2, t = lane & 3;
#pragma unroll
        for (int mi = 0; mi < 4; mi++)
#pragma unroll
            for (int nj = 0; nj < 8; nj++) {
                *(int2 *)&tile[(mi * 16 + g) * LD + nj * 8 + 2 * t] = make_int2(acc[mi][nj][0], acc[mi][nj][1]);
                *(int2 *)&tile[(mi * 16 + g + 8) * LD + nj * 8 + 2 * t] = make_int2(acc[mi][nj][2], acc[mi][nj][3]);
            }
    }
    __syncwarp();
    const float scale = __fmul_rn(ld_scale(ep.sa), ld_scale(ep.sw));
    const int64_t n0 = bn + wn * 64 + 2 * lane;
#pragma unroll 1
    for (int lr = 0; lr < 64; lr++) {
        const int64_t m = bm + wm * 64 + lr;
        if (m >= M) break;
        if (n0 >= N) continue;
        const row_info r = make_row(ep, m, M);
        const bool two = n0 + 1 < N;
        const int d0 = binary_dot(ep, r, n0, tile[lr * LD + 2 * lane]);
        const int d1 = two ? binary_dot(ep, r, n0 + 1, tile[lr * LD + 2 * lane + 1]) : 0;
        store_pair(ep, r, n0, d0, d1, two, scale);
    }
}

template <bool BINARY, int WM, int WN>
enum bie_status launch(bie_context_t * ctx, const uint8_t * A, const uint8_t * B, int64_t M, int64_t N, int64_t kbytes,
                       const gemm_epilogue & ep) {
    constexpr int BM = 64 * WM, BN = 64 * WN;
    const int pipe = STAGES * (BM + BN) * BKB, stage_out = WM * WN * 64 * (64 + 4) * 4; // epilogue tiles
    const int smem = pipe > stage_out ? pipe : stage_out;
    auto kern = gemm_kernel<BINARY, WM, WN>;
    const unsigned bit = 1u << ((BINARY ? 8 : 0) + WM * 4 + WN - 5); // one bit per instantiation
    if (!(ctx->cuda->gemm_smem_set & bit)) {                         // once per context and device
        CU_TRY(ctx, cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
               "cudaFuncSetAttribute(gemm)");
        ctx->cuda->gemm_smem_set |= bit;
    }
    const int64_t gx = (M + BM - 1) / BM, gy = (N + BN - 1) / BN;
    if (gy > 65535)
        return bie_set_error(ctx, BIE_STATUS_UNSUPPORTED, "weight: too many output features for one launch");
    kern<<<dim3((unsigned)gx, (unsigned)gy), WM * WN * 32, smem, ctx->cuda->stream>>>(A, B, M, N, kbytes, ep);
    LAUNCHED(ctx, "gemm");
    return BIE_STATUS_OK;
}

template <bool BINARY>
enum bie_status pick(bie_context_t * ctx, const uint8_t * A, const uint8_t * B, int64_t M, int64_t N, int64_t kbytes,
                     const gemm_epilogue & ep) {
    const int sms = bie_cuda_sm_count(ctx);
    auto tiles = [&](int bm, int bn) { return ((M + bm - 1) / bm) * ((N + bn - 1) / bn); };
    if (tiles(128, 256) >= sms) return launch<BINARY, 2, 4>(ctx, A, B, M, N, kbytes, ep);
    if (tiles(128, 128) >= sms) return launch<BINARY, 2, 2>(ctx, A, B, M, N, kbytes, ep);
    return launch<BINARY, 1, 1>(ctx, A, B, M, N, kbytes, ep);
}

} // namespace

// Routing (bie_cuda_gemm below): few rows -> the split-K kernel; more than 64 rows on Hopper ->
// wgmma; else mma.sync. The split-K and wgmma epilogues pack B1 outputs themselves.
bool bie_cuda_gemm_takes_wgmma(bie_context_t * ctx, int64_t M, bool taps) {
    return !bie_cuda_gemm_counts_popcounts(M, taps) && M > 64 && bie_cuda_wgmma_usable(ctx);
}

bool bie_cuda_gemm_packs_bits(bie_context_t * ctx, int64_t M, int64_t N, bool taps, const gemm_epilogue & ep) {
    return (bie_cuda_gemm_counts_popcounts(M, taps) || bie_cuda_gemm_takes_wgmma(ctx, M, taps)) &&
           bie_cuda_wgmma_packs_bits(ep, N);
}

enum bie_status bie_cuda_gemm(bie_context_t * ctx, const uint8_t * A, const uint8_t * B, int64_t M, int64_t N,
                              int64_t kbytes, const gemm_epilogue & ep, const gemm_gather * gs) {
    if (kbytes % BKB) return bie_set_error(ctx, BIE_STATUS_INTERNAL, "gemm: kbytes %% 128 != 0");
    if (M >= ((int64_t)1 << 31) || kbytes / BKB >= ((int64_t)1 << 31))
        return bie_set_error(ctx, BIE_STATUS_UNSUPPORTED, "x: more than 2^31 output rows in one call");
    // A few rows: one split-K launch with the popcounts fused (cuda-gemm-small.cu). Hopper:
    // warpgroup MMA, except up to 64 rows, where the 64-row mma.sync tiles waste less.
    const bool wgmma = bie_cuda_gemm_takes_wgmma(ctx, M, ep.tapcorr != NULL);
    if (gs && !wgmma) return bie_set_error(ctx, BIE_STATUS_INTERNAL, "gemm: gathered rows off the wgmma route");
    if (bie_cuda_gemm_counts_popcounts(M, ep.tapcorr != NULL)) return bie_cuda_gemm_small(ctx, A, B, M, N, kbytes, ep);
    if (wgmma) return bie_cuda_gemm_wgmma(ctx, A, B, M, N, kbytes, ep, gs);
    if (ep.y.dtype == BIE_DTYPE_B1 && !ep.sign)
        return bie_set_error(ctx, BIE_STATUS_INTERNAL, "gemm: B1 y without codes");
    return ep.binary ? pick<true>(ctx, A, B, M, N, kbytes, ep) : pick<false>(ctx, A, B, M, N, kbytes, ep);
}
