// SPDX-License-Identifier: Apache-2.0
// cuda-wq-decode.cu: the weight-only layer's mma decode kernel (cuda-wq.cuh; equations in bie.h and
// src/ref/ref-wq.c).
//
// Decode (M <= 32 rows), f16/bf16 x, uniform 2/4/8 bits, N % 4 == 0, groups of whole chunks
// (a chunk is 4 word rows = 128/b packed rows): wq_mma_kernel. A warp owns 32 columns and a K range
// (split-K over blockIdx.y). Its chunks stream with cp.async through a ring in shared memory
// (8 lanes copy one 128-byte word row; one wait for each WQ_STEP chunks), so the weight is read once
// and the bytes in flight cost no registers. The prologue reads the split's scales and zeros while
// the first chunks fly, and puts the block's slice of x' (x scaled and permuted, rounded to the
// 16-bit type, in the chunk order below) and its sums per group in shared memory. A first kernel
// (wq_xs_kernel) orders x' once for all blocks; the decode kernel is its programmatic dependent
// launch and waits for it only before it copies its slice. Where the grid is one wave and small
// (own_x), each block orders its own slice instead, which saves that kernel's launch. Lane 4*g + t
// takes the 16 bytes of word row t, columns n0+4g .. n0+4g+3, from the ring. The codes become f16
// (bf16) halves by the magic-number trick ((code << p) | 0x6400 is the half 1024 + code * 2^p; one
// fma gives the code), or, 2- and 4-bit codes under f16 x, stay in place as subnormals (wq_sub),
// and feed mma.sync m16n8k16 as the A operand: m-tile u's row g is column 4g + 2u of the
// warp, its row g + 8 column 4g + 2u + 1, and the k index runs over the chunk's rows in the order in
// which the halves come out. x' is the B operand (its M <= 8 rows an n-tile, two n-tiles to 16, four to 32),
// laid out per chunk in that order (wq_chunk_row), so B fragments are plain 8-byte loads from shared
// memory. The mma sums x'*code per chunk in f32; each group ends with y += s*acc - c*xsum (c = s*z,
// s*2^(b-1) or z), like the CPU path. Partial sums of the K ranges go to a workspace and a second
// kernel, launched as this one's programmatic dependent, adds them in a fixed order
// (deterministic), with the bias.
#include <type_traits>

#include "cuda/cuda-ptx.cuh"
#include "cuda/cuda-wq.cuh"

#define WQ_WARPS 4  // warps a block for M <= 8 (each its own 32 columns); twice that for M > 8 (wq_block_warps)
#define WQ_STAGES 8 // chunks a warp's cp.async ring holds (a power of two, a multiple of WQ_STEP)
#define WQ_STEP 4   // chunks a wait covers (one cp.async group)
static_assert(WQ_STAGES % WQ_STEP == 0 && WQ_STAGES / WQ_STEP >= 2, "the ring holds whole steps, two at least");
#define WQ_MAX_SPLIT_GROUPS 34 // groups whose scales a decode block holds in shared memory
// Column warps a multiprocessor that the split aims at, with one n-tile (half as many for 2-bit
// codes, whose chunks carry twice the rows: a warp's fixed prologue weighs more against its
// streaming than the bytes it keeps in flight) and with two or four (whose blocks hold twice the warps and a
// larger x' slice, so that fewer fit), and the fewest it may leave when a split would otherwise take
// fewer than WQ_STAGES chunks.
#define WQ_WARPS_PER_SM_1 64
#define WQ_WARPS_PER_SM_1_B2 32
#define WQ_WARPS_PER_SM_2 24
#define WQ_MIN_WARPS_PER_SM 16

// Whether the kernel takes its codes as f16 subnormals (f16 x, 2- or 4-bit codes, at most two n-tiles
// of x rows: with four, a second set of accumulators would not fit the 128 registers that keep two
// blocks on a multiprocessor): a code c at bit p of its 16-bit half, masked in place, is the f16
// value c * 2^(p-24) with no conversion. Each mma step takes the two half pairs of equal p
// (wq_chunk_row's same_p); steps 2j and 2j + 1 shift the words down by 2*b*j bits first, so that
// every code sits at p = 0 or p = b, and the two go into their own sets of accumulators, which the
// flush scales by 2^(24-p), exactly. (A set for each p would cost 2-bit codes the kernel's
// occupancy; bf16 subnormals would underflow the f32 products.)
__host__ __device__ constexpr bool wq_sub(bool f16, int b, int nt) { return f16 && (b == 4 || b == 2) && nt <= 2; }
#define WQ_SUB_SETS 2 // accumulator sets of a subnormal kernel: codes at p = 0 and p = b

// The kernel's n-tiles of 8 activation rows for M rows (M <= WQ_MMA_MAX_M), and the warps of its
// block (each its own 32 columns): more n-tiles share a larger x' slice among more warps, up to 8.
__host__ __device__ constexpr int wq_n_tiles(int64_t M) { return M <= 8 ? 1 : M <= 16 ? 2 : 4; }
__host__ __device__ constexpr int wq_block_warps(int nt) { return WQ_WARPS * (nt == 1 ? 1 : 2); }
static_assert(8 * wq_n_tiles(WQ_MMA_MAX_M) == WQ_MMA_MAX_M, "the largest M fills its n-tiles");

// Blocks a multiprocessor holds at least, which bounds the kernel's registers: 64 with one n-tile
// (72 for 2-bit codes, whose loop needs them), 80 with two (more for 2-bit codes; their blocks are
// bounded by shared memory at 2 a multiprocessor where the splits are long), 128 with four.
__host__ __device__ constexpr int wq_min_blocks(int b, int nt) {
    return nt == 1 ? (b == 2 ? 7 : 8) : nt == 2 ? (b == 2 ? 2 : 3) : 2;
}

// --- x' in chunk order ------------------------------------------------------------------------------

// Row r of chunk-local position p (chunk of 128/b rows): p = 16*s + 4*t + f is fragment value f of
// lane t's word in slab s; the word holds V = 32/b codes v (rows t*V + v), and its halves pair
// codes (i, i + V/2): slab s takes pairs 2s (values f = 0, 1) and 2s+1 (f = 2, 3), or (same_p)
// pairs s and s + 8/b, the pairs whose codes sit at the same bit of their bytes.
__host__ __device__ __forceinline__ int wq_chunk_row(int b, int p, bool same_p) {
    const int V = 32 / b, s = p / 16, t = (p / 4) % 4, f = p % 4;
    const int i = same_p ? s + (f / 2) * (8 / b) : 2 * s + f / 2;
    return t * V + i + (f % 2) * (V / 2);
}

// xs[m][p] (T, [M][Kp]) in the chunk order above, and xsc[m][c] the f32 sum of chunk c's rounded
// values. A warp per (m, c), a lane per value (and 32 on), the sum in a fixed tree: the loads of a
// chunk are in flight together.
template <typename T>
__global__ void wq_xs_kernel(wq_x a, int64_t M, int64_t K, int b, bool same_p, int64_t nchunk, T * xs, float * xsc) {
    griddep_launch_dependents(); // the decode kernel's prologue reads none of this
    const int64_t wid = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (wid >= M * nchunk) return;
    const int64_t m = wid / nchunk, c = wid % nchunk;
    const int cr = 128 / b;
    const int64_t Kp = nchunk * cr;
    float sum = 0.0f;
    for (int p = lane; p < cr; p += 32) {
        const int64_t r = c * cr + wq_chunk_row(b, p, same_p);
        const T v = from_f32<T>(r < K ? wq_xprime(a, m, r, K) : 0.0f);
        xs[m * Kp + c * cr + p] = v;
        sum += to_f32(v);
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) xsc[m * nchunk + c] = sum;
}

// --- the kernel -------------------------------------------------------------------------------------

// The 16-bit type's magic number: (code << p) | magic is the value base + code * 2^p, exactly
// (f16 base 1024: spacing 1 up to 2048; bf16 base 128: exact while the code's bits fit the
// mantissa, which holds for every (b, p) used below except 8-bit codes).
template <typename T> struct wq_mma_traits {
    static constexpr bool bf16 = sizeof(T) == 2 && !std::is_same<T, __half>::value;
    static constexpr uint32_t magic = bf16 ? 0x43004300u : 0x64006400u;
    static constexpr float base = bf16 ? 128.0f : 1024.0f;
    // h * m + a on both halves (one rounding: exact where the result is a small integer)
    __device__ static uint32_t fma(uint32_t h, float m, float a) {
        uint32_t r;
        if constexpr (bf16) {
            const __nv_bfloat162 v =
                __hfma2(*(const __nv_bfloat162 *)&h, __float2bfloat162_rn(m), __float2bfloat162_rn(a));
            r = *(const uint32_t *)&v;
        } else {
            const __half2 v = __hfma2(*(const __half2 *)&h, __float2half2_rn(m), __float2half2_rn(a));
            r = *(const uint32_t *)&v;
        }
        return r;
    }
    __device__ static void mma(float * d, const uint32_t * a, uint32_t b0, uint32_t b1) {
        mma_sync_f32<bf16>(d, a, b0, b1);
    }
};

// Half pair i of a word of b-bit codes: codes (i, i + V/2) (bits b*i and b*i + 16) as two halves (T)
// holding the codes. Pair i sits in byte i / P (P = 8/b pairs a byte) at bit p = b * (i % P): one
// shift per byte, then (v & mask) | magic = base + code * 2^p, and code = that * 2^-p - base * 2^-p
// in one fma (a subtraction where p = 0). Where bits p .. p+b-1 would leave the mantissa (bf16's
// 7 bits), the pair is shifted down to p = 0 first.
template <typename T, int B> __device__ __forceinline__ uint32_t wq_pair(uint32_t w, int i) {
    constexpr int P = 8 / B;
    constexpr int MANT = wq_mma_traits<T>::bf16 ? 7 : 10; // mantissa bits
    int p = B * (i % P);
    const int sh = 8 * (i / P) + (p + B > MANT ? p : 0); // the code's bits must stay in the mantissa
    p = p + B > MANT ? 0 : p;
    const uint32_t v = sh ? w >> sh : w;
    const uint32_t m = ((1u << B) - 1u) << p;
    if (B == 8 && wq_mma_traits<T>::bf16) {
        // bf16 codes up to 255: 128 + code is not exact; convert through f32
        const uint32_t c = v & 0x00FF00FFu;
        __nv_bfloat162 h = __floats2bfloat162_rn((float)(c & 0xFFFF), (float)(c >> 16));
        return *(uint32_t *)&h;
    }
    const uint32_t h = lop3_and_or(v, m | (m << 16), wq_mma_traits<T>::magic);
    const float inv = 1.0f / (float)(1 << p);
    return wq_mma_traits<T>::fma(h, inv, -wq_mma_traits<T>::base * inv);
}

// The ring's and the scale slots' bytes a warp takes in shared memory (ngroups: groups a split
// touches at most, wq_split_groups).
__host__ __device__ constexpr int wq_warp_smem(int ngroups) { return WQ_STAGES * 512 + ngroups * 256; }

// The x' slice's row stride in shared memory: kr halves padded to 16 mod 64, so that the rows of
// one B-fragment load (lane 4*g + t reads row g at 8-byte position t) start 8 banks apart and each
// half-warp touches all 32 banks once.
__host__ __device__ inline int64_t wq_x_stride(int64_t kr) { return kr + ((16 - kr % 64) + 64) % 64; }

// Groups that a split of cps chunks touches at most (cpg chunks a group; it may start inside one).
__host__ __device__ inline int wq_split_groups(int64_t cps, int64_t cpg) { return (int)((cps - 1) / cpg) + 2; }

// Slot gl of the split's scales and corrections (see wq_split_scales) from 4 scales and zeros.
__device__ __forceinline__ void wq_put_slot(unsigned char * slots, int gl, int quad, int zero, float4 sv, float4 zv) {
    float4 * sl = (float4 *)(slots + gl * 256 + quad);
    sl[0] = sv;
    sl[1] = make_float4(wq_correction(zero, sv.x, zv.x), wq_correction(zero, sv.y, zv.y),
                        wq_correction(zero, sv.z, zv.z), wq_correction(zero, sv.w, zv.w));
}

// Four f16 values (8 bytes) as f32.
__device__ __forceinline__ float4 half4_to_float4(uint2 v) {
    const float2 lo = __half22float2(*(const __half2 *)&v.x), hi = __half22float2(*(const __half2 *)&v.y);
    return make_float4(lo.x, lo.y, hi.x, hi.y);
}

// The split's scales s and corrections c (s*z, s*2^(b-1) or z) of the quad's 4 columns as f32:
// group gl at slots + gl*256 + quad (float4 s, float4 c); lane t of the quad takes gl = t mod 4.
// F16 scales and zeros at 8-byte aligned addresses (GPTQ's form) take 8-byte loads, all of a lane's
// issued before any is used, and meanwhile() runs while they fly; other dtypes load value by value,
// after meanwhile().
template <int B, typename F>
__device__ __forceinline__ void wq_split_scales(const wq_dev & w, unsigned char * slots, int64_t g0, int ng, int t,
                                                int quad, int64_t ncol, bool cols_ok, F && meanwhile) {
    const bool sym = w.zero == BIE_WQ_ZERO_SYM;
    const bool f16 = w.sdt == BIE_DTYPE_F16 && ((uintptr_t)w.scales & 7) == 0 &&
                     (sym || (w.zdt == BIE_DTYPE_F16 && ((uintptr_t)w.zeros & 7) == 0));
    if (f16 && cols_ok) {                                // (N % 4 == 0: every offset below is a multiple of 4 elements)
        constexpr int U = (WQ_MAX_SPLIT_GROUPS + 3) / 4; // a lane's groups at most
        const int64_t gstep = 4 * w.N;                   // elements between a lane's groups
        const __half * sp = (const __half *)w.scales + (g0 + t) * w.N + ncol;
        const __half * zp = sym ? nullptr : (const __half *)w.zeros + (g0 + t) * w.N + ncol;
        const float4 symz = make_float4(1 << (B - 1), 1 << (B - 1), 1 << (B - 1), 1 << (B - 1)); // wq_zero's SYM
        uint2 rs[U], rz[U];
#pragma unroll
        for (int k = 0; k < U; k++) {
            if (t + 4 * k >= ng) break;
            rs[k] = *(const uint2 *)(sp + k * gstep);
            rz[k] = sym ? make_uint2(0, 0) : *(const uint2 *)(zp + k * gstep);
        }
        meanwhile();
#pragma unroll
        for (int k = 0; k < U; k++) {
            if (t + 4 * k >= ng) break;
            wq_put_slot(slots, t + 4 * k, quad, w.zero, half4_to_float4(rs[k]), sym ? symz : half4_to_float4(rz[k]));
        }
        return;
    }
    meanwhile();
    for (int gl = t; gl < ng; gl += 4) {
        float4 sv = make_float4(0.0f, 0.0f, 0.0f, 0.0f), zv = sv;
        if (cols_ok) {
            const int64_t g = g0 + gl, off = g * w.N + ncol;
            sv = make_float4(ld_float(w.scales, w.sdt, off), ld_float(w.scales, w.sdt, off + 1),
                             ld_float(w.scales, w.sdt, off + 2), ld_float(w.scales, w.sdt, off + 3));
            zv = make_float4(wq_zero(w, g, ncol, B), wq_zero(w, g, ncol + 1, B), wq_zero(w, g, ncol + 2, B),
                             wq_zero(w, g, ncol + 3, B));
        }
        wq_put_slot(slots, gl, quad, w.zero, sv, zv);
    }
}

// Where row rl of a chunk sits in the chunk order (the inverse of wq_chunk_row).
__host__ __device__ constexpr int wq_chunk_pos(int b, int rl, bool same_p) {
    const int V = 32 / b, t = rl / V, j = rl % V, h = j / (V / 2), i = j % (V / 2);
    const int s = same_p ? i % (8 / b) : i / 2, f2 = same_p ? i / (8 / b) : i % 2;
    return 16 * s + 4 * t + 2 * f2 + h;
}
// A piece (8 consecutive rows 8k .. 8k+7 of a chunk) lands at wq_chunk_pos(8k) + wq_chunk_pos(i), and
// where its rows i and wq_pair_of(i) land side by side from an even position on, the two are one
// 32-bit store (-1: none; i itself where it is the second of such a pair).
__host__ __device__ constexpr int wq_pair_of(int b, int i, bool same_p) {
    const int p = wq_chunk_pos(b, i, same_p);
    for (int j = 0; j < 8; j++) {
        if (p % 2 == 0 && wq_chunk_pos(b, j, same_p) == p + 1) return j;
        if (p % 2 == 1 && wq_chunk_pos(b, j, same_p) == p - 1) return i;
    }
    return -1;
}
__host__ __device__ constexpr bool wq_pieces_ok(int b, bool same_p) {
    for (int k = 0; k < 16 / b; k++)
        for (int i = 0; i < 8; i++)
            if (wq_chunk_pos(b, 8 * k + i, same_p) != wq_chunk_pos(b, 8 * k, same_p) + wq_chunk_pos(b, i, same_p) ||
                (wq_pair_of(b, i, same_p) >= 0 && wq_chunk_pos(b, 8 * k, same_p) % 2 != 0))
                return false;
    return true;
}
static_assert(wq_pieces_ok(2, false) && wq_pieces_ok(2, true) && wq_pieces_ok(4, false) && wq_pieces_ok(4, true) &&
                  wq_pieces_ok(8, false),
              "a piece's rows land at its base plus their own positions");
// Two 16-bit values as one word, a at the lower address.
template <typename T> __device__ __forceinline__ uint32_t pack_pair(T a, T b) {
    const uint32_t lo = *(const uint16_t *)&a, hi = *(const uint16_t *)&b;
    return lo | hi << 16;
}

// From wq_xs_kernel's xs: the block's x' slice (rows m < M, kr values from position p0 of Kp) to sx
// (row stride ks), by 16-byte cp.async copies (the slice being a multiple of 16 halves) in one group.
template <typename T>
__device__ __forceinline__ void wq_copy_x(const T * xs, T * sx, int M, int Kp, int p0, int kr, int ks) {
    const int pieces = kr / 8; // a row's
    const uint32_t dst = (uint32_t)__cvta_generic_to_shared(sx);
    for (int m = 0; m < M; m++)
        for (int i = threadIdx.x; i < pieces; i += blockDim.x)
            cp_async<16>(dst + (uint32_t)((m * ks + 8 * i) * sizeof(T)), xs + (int64_t)m * Kp + p0 + 8 * i, 16);
    cp_async_commit();
}

// Where x is dense rows of T without a permutation or channel scales (vec), the block's x' slice is
// x's rows as they are: rows m < M, rows c0*CR .. of K (zeros past K), copied to sx (row stride ks)
// by 16-byte cp.async copies in one group, for wq_order_x to put in chunk order in place.
template <typename T>
__device__ __forceinline__ void wq_stage_x(const wq_x & xa, int64_t K, T * sx, int M, int64_t r0, int kr, int ks) {
    const int pr = kr / 8, n = M * pr; // 16-byte pieces a row, pieces
    const uint32_t dst = (uint32_t)__cvta_generic_to_shared(sx);
    const T * x = (const T *)xa.x.data;
    for (int e = threadIdx.x; e < n; e += blockDim.x) {
        const int m = e / pr, pc = e - m * pr;
        const int64_t r = r0 + 8 * pc;
        cp_async<16>(dst + (uint32_t)((m * ks + 8 * pc) * sizeof(T)), r < K ? x + m * xa.x.stride[2] + r : x,
                     r < K ? 16 : 0);
    }
    cp_async_commit();
}

// The block's x' slice in the chunk order above (rows m < M of x', rounded to T, at the split's
// chunks c0 .. c0+nc-1, in sx with row stride ks), and each chunk's sum of its values to
// sxc[m][c]. A lane per 8 consecutive rows (a piece; a chunk's CR/8 pieces are on consecutive lanes,
// so that a warp holds whole chunks): staged, the piece is read from sx, where wq_stage_x put it,
// and written back in place in chunk order; else its values come from x (wq_xprime). A piece's
// values are summed in order, then a chunk's pieces in a fixed tree.
template <typename T, int B, bool SAME_P>
__device__ __forceinline__ void wq_order_x(const wq_x & xa, int64_t K, bool staged, T * sx, float * sxc, int M, int c0,
                                           int nc, int ks) {
    constexpr int CR = 128 / B, PC = CR / 8;          // rows a chunk, pieces a chunk
    const int pr = nc * PC, n = M * pr;               // pieces a row, pieces
    const int lane = threadIdx.x & 31, k = lane % PC; // (the piece's place in its chunk: pr % PC == 0)
    const int kbase = wq_chunk_pos(B, 8 * k, SAME_P);
    int m = threadIdx.x / pr, pc = threadIdx.x % pr; // this lane's piece, advanced by blockDim.x a round
    const int dm = blockDim.x / pr, dpc = blockDim.x % pr;
    for (int base = threadIdx.x & ~31; base < n; base += blockDim.x) { // (whole warps: the tree's lanes)
        const bool live = base + lane < n;
        T * const row = sx + m * ks;
        T h[8];
        if (staged) {
            uint4 u = make_uint4(0, 0, 0, 0);
            if (live) u = *(const uint4 *)(row + 8 * pc);
            __syncwarp(); // (the warp's chunks are read before any is written)
            const T * hv = (const T *)&u;
#pragma unroll
            for (int i = 0; i < 8; i++) h[i] = hv[i];
        } else if (live) {
            const int64_t r = (int64_t)c0 * CR + 8 * pc; // the piece's first row
            int64_t kc[8];
            float v[8];
#pragma unroll
            for (int i = 0; i < 8; i++) kc[i] = wq_xcol(xa, r + i < K ? r + i : K - 1, K);
#pragma unroll
            for (int i = 0; i < 8; i++) v[i] = wq_xload<T>(xa, m, kc[i]);
#pragma unroll 1
            for (int i = 0; i < 8; i++) v[i] = r + i < K ? wq_xscaled(xa, kc[i], v[i]) : 0.0f;
#pragma unroll
            for (int i = 0; i < 8; i++) h[i] = from_f32<T>(v[i]);
        }
        float sum = 0.0f;
        if (live) {
            T * const dst = row + 8 * (pc - k) + kbase;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const int j = wq_pair_of(B, i, SAME_P), p = wq_chunk_pos(B, i, SAME_P);
                if (j < 0) dst[p] = h[i];
                else if (j != i) *(uint32_t *)(dst + p) = pack_pair(h[i], h[j]);
                sum += to_f32(h[i]);
            }
        }
#pragma unroll
        for (int o = PC / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if (live && k == 0) sxc[m * nc + pc / PC] = sum;
        m += dm;
        pc += dpc;
        if (pc >= pr) {
            pc -= pr;
            m++;
        }
    }
}

// x' summed per group of the split (in chunk order, from the chunk sums cs[m * ld + c0 + c]) to
// sxg[m][gl].
__device__ __forceinline__ void wq_split_sums(const float * cs, int64_t ld, int64_t c0, float * sxg, int M, int nc,
                                              int rem0, int cpg, int ng, int ngroups) {
    for (int i = threadIdx.x; i < M * ng; i += blockDim.x) {
        const int m = i / ng, gl = i % ng;
        const int a = gl == 0 ? 0 : rem0 + (gl - 1) * cpg, e = gl == 0 ? rem0 : a + cpg;
        float v = 0.0f;
        for (int c = a; c < e && c < nc; c++) v += cs[m * ld + c0 + c];
        sxg[m * ngroups + gl] = v;
    }
}

// One chunk's 8/b mma steps: acc[j][u] += A(codes v, m-tile u) B(x' rows of n-tile j) (xr[j]: this
// lane's x' row of n-tile j at the chunk, in shared memory), into set s % 2 of accs for step s where
// the codes are subnormals (SETS > 1, wq_sub), else into set 0. Rows past M read row M - 1 instead of
// zeros: their sums are never stored.
template <typename T, int B, int NT, int SETS>
__device__ __forceinline__ void wq_chunk_mma(float (&accs)[SETS][NT][2][4], uint4 v, const T * const (&xr)[NT]) {
    const uint32_t wd[4] = {v.x, v.y, v.z, v.w};
    if constexpr (SETS > 1) { // wq_sub
        static_assert(SETS == WQ_SUB_SETS && (8 / B) % SETS == 0, "steps come in pairs of sets");
#pragma unroll
        for (int s = 0; s < 8 / B; s++) {
            constexpr uint32_t m = (1u << B) - 1u;
            const int q = s % SETS, sh = SETS * B * (s / SETS); // the step's set; the words' shift
            const uint32_t ms = (m << (B * q)) | (m << (B * q + 16));
            uint2 b[NT];
#pragma unroll
            for (int j = 0; j < NT; j++) b[j] = *(const uint2 *)(xr[j] + 16 * s);
#pragma unroll
            for (int u = 0; u < 2; u++) {
                const uint32_t w0 = wd[2 * u] >> sh, w1 = wd[2 * u + 1] >> sh;
                const uint32_t a[4] = {w0 & ms, w1 & ms, (w0 >> 8) & ms, (w1 >> 8) & ms};
#pragma unroll
                for (int j = 0; j < NT; j++) wq_mma_traits<T>::mma(accs[q][j][u], a, b[j].x, b[j].y);
            }
        }
        return;
    }
    float(&acc)[NT][2][4] = accs[0];
#pragma unroll
    for (int s = 0; s < 8 / B; s++) {
        uint2 b[NT];
#pragma unroll
        for (int j = 0; j < NT; j++) b[j] = *(const uint2 *)(xr[j] + 16 * s);
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const uint32_t a[4] = {wq_pair<T, B>(wd[2 * u], 2 * s), wq_pair<T, B>(wd[2 * u + 1], 2 * s),
                                   wq_pair<T, B>(wd[2 * u], 2 * s + 1), wq_pair<T, B>(wd[2 * u + 1], 2 * s + 1)};
#pragma unroll
            for (int j = 0; j < NT; j++) wq_mma_traits<T>::mma(acc[j][u], a, b[j].x, b[j].y);
        }
    }
}

// Group gl ends: y += s * acc - c * xsum (two fmas; slots: the quad's slot of group 0), acc = 0.
// acc[j][u][e]: n-tile j (rows 8j + 2t + (e & 1)), m-tile u: columns ncol + 2u + (e >> 1).
template <int B, int NT, int SETS>
__device__ __forceinline__ void wq_flush(float (&accs)[SETS][NT][2][4], float (&y)[NT][2][4],
                                         const unsigned char * slots, const float * sxg, int ngroups, int gl, int M,
                                         int t) {
    const float4 * sl = (const float4 *)(slots + gl * 256);
    const float4 s4 = sl[0], c4 = sl[1];
    const float sv[4] = {s4.x, s4.y, s4.z, s4.w}, cz[4] = {c4.x, c4.y, c4.z, c4.w};
    float xa[NT][2];
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int m = 8 * j + 2 * t + e;
            xa[j][e] = m < M ? sxg[m * ngroups + gl] : 0.0f;
        }
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                float a = accs[0][j][i >> 1][2 * (i & 1) + e];
                if constexpr (SETS > 1) { // set q holds sums of x' * code * 2^(B*q - 24)
                    a *= 16777216.0f;
#pragma unroll
                    for (int q = 1; q < SETS; q++)
                        a = __fmaf_rn(accs[q][j][i >> 1][2 * (i & 1) + e], (float)(1 << (24 - B * q)), a);
                }
#pragma unroll
                for (int q = 0; q < SETS; q++) accs[q][j][i >> 1][2 * (i & 1) + e] = 0.0f;
                float & o = y[j][i >> 1][2 * (i & 1) + e];
                o = __fmaf_rn(sv[i], a, __fmaf_rn(-cz[i], xa[j][e], o));
            }
}

// grid (ceil(N / (32*wq_block_warps(NT))), S); K range of split y: chunks [y*cps, (y+1)*cps). NT n-tiles
// of 8 activation rows (M <= 8*NT), wq_block_warps(NT) warps. Groups are whole chunks: cpg chunks a group
// (the whole K range when there is one group); ngroups = wq_split_groups(cps, cpg). The prologue
// turns the split's scales and zeros into f32 scales and corrections and sums x' per group (in
// chunk order), so the loop only streams codes and multiplies; group and chunk positions advance by
// counters. OWN: the block makes its x' slice from x itself (wq_stage_x, wq_order_x); else it copies
// it from wq_xs_kernel's xs, as that kernel's programmatic dependent.
template <typename T, int B, int NT, bool OWN>
__global__ void __launch_bounds__(32 * wq_block_warps(NT), OWN ? wq_min_blocks(B, NT) : 0)
    wq_mma_kernel(wq_dev w, const T * xs, const float * xsc, int nchunk, int cps, int M, int cpg, int ngroups,
                  float * part, wq_x xa, bool xvec) {
    constexpr int CR = 128 / B; // rows per chunk
    constexpr int SETS = wq_sub(std::is_same<T, __half>::value, B, NT) ? WQ_SUB_SETS : 1;
    extern __shared__ __align__(16) unsigned char wq_smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, t = lane & 3;
    const int c0 = (int)blockIdx.y * cps, c1 = c0 + cps < nchunk ? c0 + cps : nchunk; // (wq_mma_ok: int)
    if (c0 >= c1) return;
    const int nc = c1 - c0;
    const int kr = nc * CR;
    const int ks = (int)wq_x_stride(kr);                                  // x' row stride in shared memory
    uint4 * ring = (uint4 *)(wq_smem + warp * wq_warp_smem(ngroups));     // [stage][lane]
    unsigned char * slots = (unsigned char *)(ring + WQ_STAGES * 32);     // [group][quad]: float4 s, float4 c
    T * sx = (T *)(wq_smem + wq_block_warps(NT) * wq_warp_smem(ngroups)); // [M][ks]
    float * sxg = (float *)(sx + M * ks);                                 // [M][ngroups]: x' sums per group
    float * sxc = sxg + M * ngroups;                                      // [M][nc]: x' sums per chunk
    const int64_t n0 = ((int64_t)blockIdx.x * wq_block_warps(NT) + warp) * 32;
    const int64_t ncol = n0 + 4 * gq; // this lane's 4 columns (N % 4 == 0: all of them exist or none)
    const bool cols_ok = ncol < w.N;
    const int rem0 = cpg - c0 % cpg; // chunks of the first group inside the split
    const int ng = nc <= rem0 ? 1 : 1 + (nc - rem0 + cpg - 1) / cpg;
    // Chunk i's words go to ring stage i % WQ_STAGES; chunks past the weight's last word row (or
    // columns past N) are zeros. The copying lane of the piece (word row tc, columns n0 + 4*gc ..) is
    // 8*tc + gc, so that 8 consecutive lanes read one 128-byte row (one L2 request); the piece lands
    // at 16-byte position (gc + 2*tc) % 8 of the stage's row tc, where the consuming lane 4*gc + tc
    // finds it and each 8-lane phase of either side touches every bank once.
    const int tc = lane >> 3, gc = lane & 7;
    const bool ccols = n0 + 4 * gc < w.N;
    const int64_t row0 = c0 * 4 + tc;
    const int live = !ccols ? 0 : row0 >= w.rows ? 0 : (int)((w.rows - row0 + 3) / 4);
    const int full = live < nc ? live : nc; // chunks [0, full) are copied whole
    const uint32_t * qp = w.qw + (ccols ? row0 * w.N + n0 + 4 * gc : 0);
    const int64_t step = 4 * w.N;
    const uint32_t ring0 = (uint32_t)__cvta_generic_to_shared(ring + 8 * tc + ((gc + 2 * tc) & 7));
    const uint4 * rp = ring + 8 * t + ((gq + 2 * t) & 7); // this lane's piece in stage 0
    // Step j's WQ_STEP chunks into their stages, one cp.async group a step (empty past the range).
    auto issue = [&](int j) {
        const int i0 = j * WQ_STEP;
        const uint32_t dst = ring0 + (uint32_t)((i0 & (WQ_STAGES - 1)) * 512);
        if (i0 + WQ_STEP <= full) {
#pragma unroll
            for (int u = 0; u < WQ_STEP; u++) cp_async<16>(dst + u * 512, qp + u * step, 16);
        } else {
            for (int u = 0; u < WQ_STEP && i0 + u < nc; u++)
                cp_async<16>(dst + u * 512, i0 + u < live ? qp + u * step : w.qw, i0 + u < live ? 16 : 0);
        }
        qp += WQ_STEP * step;
        cp_async_commit();
    };
    // The prologue: the ring's first steps and the split's scales (which wq_xs_kernel does not
    // write), and the x' slice: copied from wq_xs_kernel's once that is done, while the scales'
    // loads fly; or (OWN) staged from x before all else and ordered after the scales, once the
    // kernels before this one are done.
    constexpr int SS = WQ_STAGES / WQ_STEP; // steps the ring holds
    // Steps issued here: SS - 1, or with more n-tiles (whose prologue copies a larger x' slice) the
    // whole split where it fits the ring, so that none of it waits for the prologue's end.
    const int pre = NT > 1 && nc <= WQ_STAGES ? SS : SS - 1;
    if constexpr (OWN) {
        griddep_wait(); // (nothing is read before the kernels before this one are done)
        if (xvec) wq_stage_x(xa, w.K, sx, M, (int64_t)c0 * CR, kr, ks); // (the first cp.async group)
    }
    for (int j = 0; j < pre; j++) issue(j);
    wq_split_scales<B>(w, slots, c0 / cpg, ng, t, gq * 32, ncol, cols_ok, [&] { // (groups are whole chunks)
        if constexpr (!OWN) {
            griddep_wait(); // xs and xsc are written (the kernel may start while wq_xs_kernel runs)
            wq_copy_x(xs, sx, M, nchunk * CR, c0 * CR, kr, ks);
            wq_split_sums(xsc, nchunk, c0, sxg, M, nc, rem0, cpg, ng, ngroups);
        }
    });
    if constexpr (!OWN) {
        cp_async_wait_all(); // the x' slice (and the ring's first steps, issued long before) landed
    } else {
        if (xvec) {
            if (pre == SS) cp_async_wait<SS>(); // x's group landed (the ring's may not have)
            else cp_async_wait<SS - 1>();
            __syncthreads();
        }
        wq_order_x<T, B, SETS != 1>(xa, w.K, xvec, sx, sxc, M, c0, nc, ks);
        __syncthreads(); // the x' slice and its chunk sums are written
        wq_split_sums(sxc, nc, 0, sxg, M, nc, rem0, cpg, ng, ngroups);
    }
    __syncthreads();
    if (n0 >= w.N) return;
    float acc[SETS][NT][2][4], y[NT][2][4]; // as in wq_flush
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int u = 0; u < 2; u++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                y[j][u][e] = 0.0f;
#pragma unroll
                for (int q = 0; q < SETS; q++) acc[q][j][u][e] = 0.0f;
            }
    int gl = 0, crem = rem0;
    const T * xr[NT]; // this lane's x' row of each n-tile (row M - 1 past M), at chunk 0
#pragma unroll
    for (int j = 0; j < NT; j++) xr[j] = sx + (8 * j + gq < M ? 8 * j + gq : M - 1) * ks + 4 * t;
    // Chunk u of the step whose stages start at st: its group's flush when it opens a new one, then
    // its 8/b mma steps; the x' rows move on by a chunk.
    auto chunk = [&](const uint4 * st, int u) {
        if (crem == 0) {
            wq_flush<B, NT, SETS>(acc, y, slots + gq * 32, sxg, ngroups, gl++, M, t);
            crem = cpg;
        }
        crem--;
        wq_chunk_mma<T, B, NT, SETS>(acc, st[u * 32], xr);
#pragma unroll
        for (int j = 0; j < NT; j++) xr[j] += CR;
    };
    // Step j: wait for its chunks, refill the stages of step j - 1 (every lane has read them), then
    // the chunks' mma steps.
    const int nsteps = (nc + WQ_STEP - 1) / WQ_STEP;
    for (int j = 0; j < nsteps; j++) {
        cp_async_wait<SS - 2>(); // step j landed (one group a step, the prologue's first)
        __syncwarp();            // ... for the lanes that read it; and step j - 1 is read
        if (NT == 1 || j + SS - 1 >= pre) issue(j + SS - 1);
        else cp_async_commit(); // (issued in the prologue: an empty group keeps one a step)
        const int i0 = j * WQ_STEP;
        const uint4 * st = rp + (i0 & (WQ_STAGES - 1)) * 32;
        if (i0 + WQ_STEP <= nc) {
#pragma unroll
            for (int u = 0; u < WQ_STEP; u++) chunk(st, u);
        } else {
            for (int u = 0; i0 + u < nc; u++) chunk(st, u);
        }
    }
    cp_async_wait_all();
    wq_flush<B, NT, SETS>(acc, y, slots + gq * 32, sxg, ngroups, gl, M, t);
    // part[y][m][ncol .. ncol+3] for the rows that exist.
    float * p = part + (int64_t)blockIdx.y * M * w.N;
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int m = 8 * j + 2 * t + e;
            if (m < M && cols_ok)
                *(float4 *)(p + m * w.N + ncol) = make_float4(y[j][0][e], y[j][0][2 + e], y[j][1][e], y[j][1][2 + e]);
        }
    griddep_launch_dependents(); // wq_reduce_kernel may launch (it waits for this grid's writes)
}

// --- host side ----------------------------------------------------------------------------------------

bool wq_mma_ok(const struct bie_wq_call * c) {
    const int b = c->bits;
    if (c->M > WQ_MMA_MAX_M || (b != 2 && b != 4 && b != 8) || c->N % 4 != 0) return false;
    if (c->x.dtype != BIE_DTYPE_F16 && c->x.dtype != BIE_DTYPE_BF16) return false;
    if (c->K >= ((int64_t)1 << 31)) return false; // the kernel counts rows and chunks in int
    return c->G == 1 || c->gs % (128 / b) == 0;
}

// The decode kernel's shared memory: the warps' rings and scale slots, the x' slice and its sums
// per group (and per chunk, where the block orders x' itself).
static size_t mma_smem(int bits, int M, int64_t cps, int ngroups, bool own) {
    return (size_t)wq_block_warps(wq_n_tiles(M)) * wq_warp_smem(ngroups) +
           (size_t)M * wq_x_stride(cps * (128 / bits)) * 2 + (size_t)M * (ngroups + (own ? cps : 0)) * 4;
}

// Chunks a group (the whole K range when there is one group).
static int64_t chunks_per_group(const struct bie_wq_call * c, int64_t nchunk) {
    return c->G == 1 ? nchunk : c->gs / (128 / c->bits);
}

// The x' slice's source: wq_xs_kernel's xs and xsc where xs is given, else x itself (vec: dense rows
// of T without a permutation or channel scales, which wq_stage_x copies whole).
template <typename T> struct wq_xsrc {
    const T * xs;
    const float * xsc;
    wq_x x;
    bool vec;
};

template <typename T, int B, int NT, bool OWN>
static enum bie_status launch_mma(bie_context_t * ctx, const wq_dev & w, const wq_xsrc<T> & xv, int64_t nchunk,
                                  int64_t S, int64_t cps, int M, int cpg, float * part) {
    const int ngroups = wq_split_groups(cps, cpg);
    const size_t smem = mma_smem(B, M, cps, ngroups, OWN);
    if (smem > 48 * 1024)
        CU_TRY(
            ctx,
            cudaFuncSetAttribute(wq_mma_kernel<T, B, NT, OWN>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
            "wq: shared memory");
    const dim3 grid(blocks_for(w.N, 32 * wq_block_warps(NT)), (unsigned)S);
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg =
        bie_cuda_launch_config(ctx, grid, dim3(32 * wq_block_warps(NT)), smem, bie_cuda_cc(ctx) >= 90, &attr);
    CU_TRY(ctx,
           cudaLaunchKernelEx(&cfg, wq_mma_kernel<T, B, NT, OWN>, w, xv.xs, xv.xsc, (int)nchunk, (int)cps, M, cpg,
                              ngroups, part, xv.x, xv.vec),
           "wq_mma_kernel launch");
    LAUNCHED(ctx, "wq_mma_kernel");
    return BIE_STATUS_OK;
}

template <typename T, int B>
static enum bie_status launch_mma_rows(bie_context_t * ctx, const wq_dev & w, const wq_xsrc<T> & xv, int64_t nchunk,
                                       int64_t S, int64_t cps, int M, int cpg, float * part) {
    const bool own = !xv.xs;
    if (wq_n_tiles(M) == 1)
        return own ? launch_mma<T, B, 1, true>(ctx, w, xv, nchunk, S, cps, M, cpg, part)
                   : launch_mma<T, B, 1, false>(ctx, w, xv, nchunk, S, cps, M, cpg, part);
    if (wq_n_tiles(M) == 2)
        return own ? launch_mma<T, B, 2, true>(ctx, w, xv, nchunk, S, cps, M, cpg, part)
                   : launch_mma<T, B, 2, false>(ctx, w, xv, nchunk, S, cps, M, cpg, part);
    return own ? launch_mma<T, B, 4, true>(ctx, w, xv, nchunk, S, cps, M, cpg, part)
               : launch_mma<T, B, 4, false>(ctx, w, xv, nchunk, S, cps, M, cpg, part);
}

// A decode call is small where its blocks together would order at most WQ_OWN_X_MAX_1 (one n-tile)
// or WQ_OWN_X_MAX_2 (two) values of x' themselves (M * K for each block across the columns); its
// split then keeps the grid to one wave (wq_mma_plan), and the blocks make their x' slices
// themselves (the kernel's OWN) rather than copy them from wq_xs_kernel's (own_x) where the grid
// does fit the multiprocessors at once (at the blocks a multiprocessor holds at least). A block's
// own ordering saves the other kernel's launch but costs each block's prologue its time, which the
// blocks of a second wave would wait for again. With one n-tile a wave holds half the column warps
// that the split aims at, which only calls of little streaming can spare; with two, a wave is what
// the split aims at.
#define WQ_OWN_X_MAX_1 ((int64_t)3 << 19)
#define WQ_OWN_X_MAX_2 ((int64_t)4 << 20)
static int64_t column_blocks(const struct bie_wq_call * c) {
    return blocks_for(c->N, 32 * wq_block_warps(wq_n_tiles(c->M)));
}
static bool small_call(const struct bie_wq_call * c) {
    return c->M * c->K * column_blocks(c) <= (wq_n_tiles(c->M) == 1 ? WQ_OWN_X_MAX_1 : WQ_OWN_X_MAX_2);
}
// The device's multiprocessors (132 where they cannot be read).
static int sm_count(bie_context_t * ctx) { return bie_cuda_sm_count(ctx) > 0 ? bie_cuda_sm_count(ctx) : 132; }
// Blocks of the call's kernel that one wave holds.
static int64_t wave_blocks(bie_context_t * ctx, const struct bie_wq_call * c) {
    return (int64_t)sm_count(ctx) * wq_min_blocks(c->bits, wq_n_tiles(c->M));
}
static bool own_x(bie_context_t * ctx, const struct bie_wq_call * c, int64_t S) {
    bie_cuda_cc(ctx); // (reads BIE_CUDA_WQ)
    return !ctx->cuda->force_wq_xs && small_call(c) && column_blocks(c) * S <= wave_blocks(ctx, c);
}

// The split: S K ranges of cps chunks. The kernel keeps its weights in flight in shared memory
// rather than registers; the K range is split until about WQ_WARPS_PER_SM_1 (_B2, _2) column warps a
// multiprocessor are launched (more than fit at once: the split tail's blocks then fill the last
// wave), within the x' slice's and the scale slots' shared memory. A split keeps at least a ring's
// worth of chunks (WQ_STAGES), since each warp pays a fixed prologue (its scales, its x' slice, the
// ring's first fill) and the partial sums cost a pass each, unless that would leave fewer than
// WQ_MIN_WARPS_PER_SM column warps a multiprocessor. A small call (small_call) keeps its grid to one
// wave instead. The x' slice stays within 32 KiB: at M = 16 a larger one lengthens each block's
// prologue and leaves fewer, longer blocks for the last wave. With four n-tiles it stays within
// 48 KiB, where two blocks still fit a multiprocessor and the partial sums of 32 rows (S of them)
// weigh less than at 32 KiB (8192x28672 at M = 32 on an H200: 96 us, against 108 at 32 KiB and
// 103 at 64 KiB).
void wq_mma_plan(bie_context_t * ctx, const struct bie_wq_call * c, int64_t * S, int64_t * cps) {
    const int64_t col_warps = (c->N + 31) / 32;
    const int cr = 128 / c->bits;
    const int64_t nchunk = (c->K + cr - 1) / cr;
    const int sm = sm_count(ctx);
    const int aim = wq_n_tiles(c->M) > 1 ? WQ_WARPS_PER_SM_2 : c->bits == 2 ? WQ_WARPS_PER_SM_1_B2 : WQ_WARPS_PER_SM_1;
    int64_t s = (int64_t)aim * sm / col_warps;
    const int64_t whole_rings = nchunk / WQ_STAGES, enough_warps = (int64_t)WQ_MIN_WARPS_PER_SM * sm / col_warps;
    const int64_t most = whole_rings > enough_warps ? whole_rings : enough_warps;
    if (s > most) s = most;
    if (small_call(c) && s * column_blocks(c) > wave_blocks(ctx, c)) s = wave_blocks(ctx, c) / column_blocks(c);
    s = s < 1 ? 1 : s > nchunk ? nchunk : s;
    int64_t per = (nchunk + s - 1) / s;
    const int64_t max_per = (wq_n_tiles(c->M) == 4 ? 48 : 32) * 1024 / (c->M * cr * 2); // the x' slice's bound
    if (per > max_per) per = max_per;
    const int64_t cpg = chunks_per_group(c, nchunk);
    if (wq_split_groups(per, cpg) > WQ_MAX_SPLIT_GROUPS) per = (WQ_MAX_SPLIT_GROUPS - 1) * cpg;
    *cps = per;
    *S = (nchunk + per - 1) / per;
}

template <typename T>
static enum bie_status decode_mma(bie_context_t * ctx, const struct bie_wq_call * c, wq_ws & a, const wq_dev & w,
                                  int64_t S, int64_t cps, float * part) {
    const int b = c->bits, cr = 128 / b;
    const int64_t nchunk = (c->K + cr - 1) / cr;
    const int cpg = (int)chunks_per_group(c, nchunk);
    wq_xsrc<T> xv = {nullptr, nullptr, x_of(c, &c->x), false};
    if (own_x(ctx, c, S)) {
        xv.vec = !xv.x.perm && !xv.x.cs && xv.x.x.stride[3] == 1 && c->K % 8 == 0 && (uintptr_t)xv.x.x.data % 16 == 0 &&
                 (c->M == 1 || xv.x.x.stride[2] % 8 == 0);
    } else {
        T * xs = (T *)take(a, (size_t)c->M * nchunk * cr * sizeof(T));
        float * xsc = (float *)take(a, (size_t)c->M * nchunk * sizeof(float));
        wq_xs_kernel<T><<<blocks_for(c->M * nchunk * 32, 128), 128, 0, ctx->cuda->stream>>>(
            xv.x, c->M, c->K, b, wq_sub(std::is_same<T, __half>::value, b, wq_n_tiles(c->M)), nchunk, xs, xsc);
        LAUNCHED(ctx, "wq_xs_kernel");
        xv.xs = xs;
        xv.xsc = xsc;
    }
    switch (b) {
    case 2: return launch_mma_rows<T, 2>(ctx, w, xv, nchunk, S, cps, (int)c->M, cpg, part);
    case 4: return launch_mma_rows<T, 4>(ctx, w, xv, nchunk, S, cps, (int)c->M, cpg, part);
    default: return launch_mma_rows<T, 8>(ctx, w, xv, nchunk, S, cps, (int)c->M, cpg, part);
    }
}

enum bie_status wq_decode_mma(bie_context_t * ctx, const struct bie_wq_call * c, wq_ws & a, const wq_dev & w, int64_t S,
                              int64_t cps, float * part) {
    if (c->x.dtype == BIE_DTYPE_F16) return decode_mma<__half>(ctx, c, a, w, S, cps, part);
    return decode_mma<__nv_bfloat16>(ctx, c, a, w, S, cps, part);
}
