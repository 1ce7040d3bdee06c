// SPDX-License-Identifier: Apache-2.0
// cuda-wgmma-epilogue.cuh: the epilogues of the Hopper GEMM (cuda-wgmma-tiles.cuh gives its
// layout): a consumer warp's accumulators (or its part of a SPLIT tile's dump) finished into y,
// element by element for any y, as sign bits for B1 y, or in 128-byte chunks staged in shared
// memory and stored by the warp or by bulk tensor copies for f32/f16/bf16 y.
#pragma once

#include "cuda-wgmma-tiles.cuh"

#if !defined(__CUDA_ARCH__) || defined(BIE_WGMMA_DEVICE)

namespace {

// Any y (B1, I32, strided, zero-padded conv): the shared element-wise path, out of line so that
// the unrolled fast path stays small.
__device__ __noinline__ void store_pair_any(const gemm_epilogue * ep, row_info r, int64_t n, int64_t N, int a0, int a1,
                                            float scale) {
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
    __device__ __forceinline__ int2 pair(int i, int h) const {
        return make_int2(d[4 * i + 2 * h], d[4 * i + 2 * h + 1]);
    }
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
__device__ __forceinline__ int2 fragment_ints(const gemm_epilogue & ep, const D & d, int2 ctc, int i, int h,
                                              int border) {
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
                const int2 v = BINARY
                                   ? fragment_ints<TAPS>(ep, d, col_pair<BINARY, TAPS>(colterm, i), i, h, rowborder[h])
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
__device__ __forceinline__ void
epilogue_chunk(const gemm_epilogue & ep, const D & d, uint8_t * stage, const int * colterm, const CUtensorMap * ymap,
               int64_t mw, int c, int64_t nt, int64_t M, float scale, const float * rowf, const int * border) {
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
        chunk_half<BINARY, T, TAPS>(
            cv[c % 2], ep, d, [&](int j) { return ct[c % 2][j]; }, c, h, scale, rowf, border);
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
                        : ((uintptr_t)yd % 4 == 0 && fs % 2 == 0 && sizeof(T) == 2)  ? 2
                                                                                     : 1;
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
            if (((uintptr_t)y.data % 16) == 0 && ((rb + n) % (16 / (int)sizeof(T))) == 0 &&
                n + 16 / (int)sizeof(T) <= N) {
                *(uint4 *)dst = *(const uint4 *)src;
            } else {
                for (int k = 0; k < 16 / (int)sizeof(T) && n + k < N; k++) dst[k] = ((const T *)src)[k];
            }
        }
        __syncwarp();
    }
}

} // namespace

#endif // sm_90a device code
