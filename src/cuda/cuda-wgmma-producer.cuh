// SPDX-License-Identifier: Apache-2.0
// cuda-wgmma-producer.cuh: the producers of the Hopper GEMM (cuda-wgmma-tiles.cuh gives its
// layout): they fill the stage ring, by bulk tensor copies of both operands (tma_producer) or, for
// a conv whose rows are gathered from x, by the whole producer warpgroup's cp.async copies
// (gather_producer).
#pragma once

#include "cuda-wgmma-tiles.cuh"

#if !defined(__CUDA_ARCH__) || defined(BIE_WGMMA_DEVICE)

namespace {

// The producer of a GEMM with both operands in tensor maps: thread 0 loads every stage of every
// tile of this CTA, in order, each stage once the consumers have released its last fill.
template <int BM, int BN, int STAGES>
__device__ __forceinline__ void tma_producer(const CUtensorMap * ta, const CUtensorMap * tb, uint32_t mt, uint32_t ntn,
                                             int ktiles, uint32_t base, uint32_t bars) {
    constexpr int STAGE_BYTES = (BM + BN) * BK;
    int it = 0;
    for (tile_walk w(blockIdx.x, gridDim.x, mt); w.ni < ntn; w.next()) {
        const int m_row = (int)(w.mi * BM), n_row = (int)(w.ni * BN);
        for (int kt = 0; kt < ktiles; kt++, it++) {
            const int s = it % STAGES;
            const uint32_t full = bars + 8 * s;
            mbar_wait(bars + 8 * (STAGES + s), ((it / STAGES) & 1) ^ 1);
            const uint32_t sa = base + s * STAGE_BYTES;
            mbar_expect_tx(full, STAGE_BYTES);
            tma_load(sa, ta, kt * BK, m_row, full);
            tma_load(sa + BM * BK, tb, kt * BK, n_row, full);
        }
    }
}

// The producer of a gathering GEMM (gemm_gather): the whole producer warpgroup fills each stage's
// A tile from the NHWC words of x (bits or int8 codes), and thread 0 also loads its B tile. A tile's rows are dealt to
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
    constexpr int RS = BM < 128 ? BM : 128, TPR = 128 / RS,
                  RPT = BM / RS;                     // row slots, threads per row, rows per thread
    constexpr int WPP = PIECE / 4, PPS = BK / PIECE; // words per piece, pieces per row and stage
    static_assert(PPS % TPR == 0, "a stage's pieces split evenly between a row's threads");
    const int t = threadIdx.x, rs = t % RS, phase = t / RS;
    const int H = (int)g.H, W = (int)g.W, wpt = gs.wpt, kwords = gs.kwords;
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

} // namespace

#endif // sm_90a device code
