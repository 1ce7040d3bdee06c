// SPDX-License-Identifier: Apache-2.0
// cpu-impl.h: internals of the optimised CPU backend (src/cpu).
//
// Layering (BLIS style): the operators (cpu-binary.c, cpu-nbit.c, cpu-backward.c) pack the
// activations and weights into panels in the host workspace, run a register-blocked microkernel
// over MR x NR output tiles, and finish each tile with a fused epilogue (cpu-epilogue.c). The
// microkernels and the vectorised packing helpers live in one file per ISA
// (cpu-kernels-scalar.c, -avx2.c, -avx512.c, -avx512vpopcnt.c), each compiled with its own flags;
// bie_cpu_kernels() picks the table for the context's ISA (ctx->isa) at run time.
//
// Binary panel layout. The K = C*kh*kw codes of a row (output pixel) or column (output channel) are
// in tap-major, channel-minor order (OHWI for weights), each tap padded to Cb = ceil(C/8) bytes,
// bit c%8 of byte c/8 (LSB first, bit 1 <=> +1), zero-padded to KBp = round_up(kh*kw*Cb, 8) bytes,
// i.e. KBp/8 64-bit words. The padding bits are 0 in both operands, so XOR ignores them and
// acc = K - 2*popc(a XOR w) exactly.
//   A (activations): one row per output pixel, Mp = round_up(M, 4) rows.
//   B (weights): groups of nr columns (the tile's), word-interleaved: word w of column j of group g
//     at B + g*group_bytes + (w*nr + j)*8, so that one vector load gives word w of nr columns
//     and the microkernel broadcasts A's word against it (outer-product form: no horizontal sums).
// With `split` every word is stored as two words: its low nibbles (byte & 15) and its high
// nibbles (byte >> 4), in two planes (A: a row's lo plane of KBp bytes then its hi plane; B: a
// group's lo words then its hi words), which saves the nibble extraction in pshufb-lookup kernels.
//
// n-bit panel layout: same K order (no per-tap padding). 8-bit: the codes as int16, rows
// zero-padded to Kp = round_up(K, 32) elements; with an outer-product int16 tile (i16_outer_tile)
// the rows are interleaved in pairs of k instead: a panel of w rows (CPU_OUTER_MR activation rows,
// CPU_OUTER_NR weight columns) holds element k of its row r at (k/2)*2*w + 2*r + k%2, so that one
// 32-bit broadcast gives an activation row's pair and one vector load gives 16 columns' pairs (the
// weight panel is made block by block from int8 code rows by widen_nr). 4-bit: activations as bytes code + 8 (in [0, 15]),
// weights as signed bytes, rows zero-padded to round_up(K, 64) bytes; acc = sum (a+8)*w - 8*sum w.
// With an outer-product byte tile (u4s4_outer_tile) the byte rows are interleaved in quads of k
// the same way: byte k of row r of a panel of w rows at (k/4)*4*w + 4*r + k%4. Both interleaved
// layouts are the same transpose of 32-bit units (a pair of int16 codes, a quad of byte codes).
#pragma once

#include "bie-impl.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define CPU_MR 4         // rows of every microkernel tile
#define CPU_KB_ALIGN 8   // binary rows are padded to this many bytes (whole 64-bit words)
#define CPU_K16_ALIGN 32 // int16 rows are padded to this many elements
#define CPU_K4_ALIGN 64  // 4-bit byte rows are padded to this many elements
#define CPU_OUTER_MR 8   // rows of the outer-product int16 tile (activation panel width)
#define CPU_OUTER_NR 32  // columns of the outer-product int16 tile (weight panel width)
#ifndef CPU_STREAM_BYTES
#define CPU_STREAM_BYTES ((size_t)4 << 20) // f32 outputs from this size are stored past the caches
#endif

// A binary microkernel and the panel layout it reads:
// c[i*ldc + j] = popcount(a_i XOR b_j) for i < CPU_MR, j < nr; a_i = a + i*lda (bytes), b the B
// group; kb = KBp bytes per plane (a multiple of 8).
struct cpu_bin_tile {
    int nr;     // columns of the tile (and of a B group): 4, 8 or 16
    bool split; // the panels hold nibble planes (see above)
    void (*tile)(const uint8_t * a, size_t lda, const uint8_t * b, size_t kb, int32_t * c, size_t ldc);
};

// An outer-product tile (the slots below say what it sums): n 32-bit units of k per row.
typedef void (*cpu_outer_tile_fn)(const void * a, const void * b, size_t n, bool accumulate, int32_t * c, size_t ldc);

struct cpu_kernels {
    enum bie_cpu_isa isa;
    struct cpu_bin_tile bin;      // the binary tile
    struct cpu_bin_tile bin_long; // the one for rows of at least bin_long_kb bytes (tile NULL: none)
    size_t bin_long_kb;
    int i16_nr;      // columns of the int16 tile (and of the byte tile)
    bool u8s8_exact; // u4s4_tile is exact for all unsigned x signed bytes (VNNI), not only 4-bit ones
    // c[i*ldc + j] = sum_k a_i[k] * b_j[k] (int32, wrapping) for i < CPU_MR, j < i16_nr;
    // k a multiple of 32; lda/ldb in elements.
    void (*i16_tile)(const int16_t * a, size_t lda, const int16_t * b, size_t ldb, size_t k, int32_t * c, size_t ldc);
    // The outer-product form of the same sums on pair-interleaved panels (layout above; NULL: none):
    // c[i*ldc + j] = (accumulate ? c[i*ldc + j] : 0) + sum_{k < 2*n} a_i[k] * b_j[k] (int32,
    // wrapping) for i < CPU_OUTER_MR, j < CPU_OUTER_NR; a, b (int16) point at pair p0 of their
    // panels; n > 0.
    cpu_outer_tile_fn i16_outer_tile;
    // With an outer tile: the weight panel of CPU_OUTER_NR rows of kp int16 codes (row stride kp,
    // even), i.e. the transpose of 32-bit units (byte rows of 2*kp bytes give the quad layout).
    void (*interleave_nr)(const int16_t * rows, size_t kp, int16_t * panel);
    // The same panel for n pairs of k (a multiple of 16) from rows of int8 codes, sign-extended: pair p
    // of panel row r = codes 2p, 2p+1 of rows + r*ld (bytes) for r < nr, zeros for nr <= r < CPU_OUTER_NR
    // (the int16 outer tile's weight block, built from byte rows as it is needed; panel 64-byte aligned).
    void (*widen_nr)(const int8_t * rows, ptrdiff_t ld, int nr, size_t n, int16_t * panel);
    // 32 planes of int16 codes as rows (NHWC from NCHW; NULL: none): dst[p*ldd + j] = src[j*lds + p]
    // for j < 32, p < np (np a multiple of 16; element strides).
    void (*planes_to_rows)(const int16_t * src, size_t lds, size_t np, int16_t * dst, size_t ldd);
    // The activation panel of an outer tile (either kind) from its CPU_OUTER_MR rows of n 32-bit
    // units (row stride rb bytes; n a multiple of 16): unit u of row r goes to unit u*CPU_OUTER_MR + r.
    void (*interleave_mr)(const void * rows, size_t rb, size_t n, void * panel);
    // c[i*ldc + j] = sum_k a_i[k] * b_j[k] for i < CPU_MR, j < i16_nr, with a unsigned bytes in
    // [0, 15] and b signed bytes in [-8, 7] (the 4-bit GEMM); k a multiple of 64; lda/ldb in bytes.
    void (*u4s4_tile)(const uint8_t * a, size_t lda, const int8_t * b, size_t ldb, size_t k, int32_t * c, size_t ldc);
    // The outer-product form of those sums on quad-interleaved byte panels (NULL: none): as
    // i16_outer_tile with sum_{k < 4*n}, a (unsigned) and b (signed) bytes pointing at quad q0.
    cpu_outer_tile_fn u4s4_outer_tile;
    // out bit i = (x[i] + b_i >= 0) with b_i = bias[i] if bias else b0 (f32 add; NaN -> 0), for
    // i < n; the unused high bits of the last byte are 0.
    void (*sign_bits)(const float * x, const float * bias, float b0, int64_t n, uint8_t * out);
    // out[i] = clamp(rne((x[i] + b_i) / scale), lo, hi) with b_i as above (f32 math).
    void (*quantize)(const float * x, const float * bias, float b0, int64_t n, float scale, int lo, int hi,
                     int16_t * out);
    // The binary backward's mask pass on a row: with v = x[i] + b_i (b_i = bias[i] if bias else
    // b0) and r = v / scale (f32): gx[i] = |r| <= 1 ? gx[i] : 0 (in place); returns
    // sum of gx[i] * (v >= 0 ? 1 : -1) over the row, in double, in an order fixed by n.
    double (*mask_binary)(const float * x, const float * bias, float b0, float scale, float * gx, int64_t n);
    // lo[i] = in[i] & 15, hi[i] = in[i] >> 4 for i < n (n a multiple of 8).
    void (*nibble_split)(const uint8_t * in, size_t n, uint8_t * lo, uint8_t * hi);
    // The f32 NCHW store of the epilogue, a scaled transpose: dst[o*ldd + r] = (float)acc[r*ldacc + o]
    // * s for r < rows, o < cols (f32 multiply). stream: the caller's output is much larger than the
    // caches (non-temporal stores allowed; visible to other threads after the call returns).
    void (*store_cols_f32)(const int32_t * acc, size_t ldacc, int64_t rows, int64_t cols, float s, float * dst,
                           size_t ldd, bool stream);

    // The float-by-sign GEMM of the binary backward (cpu-signgemm.c); NULL where the backward
    // uses sgemm instead (below AVX-512, where a table lookup does not beat an FMA).
    // sign_idx: dst[k] |= (src[k] + b_k >= 0) << t for k < n (f32 add; b_k = bias[k], or 0 when
    // bias is NULL; NaN -> 0 bit).
    void (*sign_idx)(const float * src, const float * bias, int64_t n, int t, uint32_t * dst);
    // sign_tables: for i < CPU_MR and chunk q < nq, entry e of table (i, q) is
    //   tab[(i*nq + q)*16 + e] = alpha * (((s0*f_i[4q] + s1*f_i[4q+1]) + s2*f_i[4q+2]) + s3*f_i[4q+3])
    // with s_b = +1 if bit b of e is set, else -1, and f_i[j] = f[i*rs + j*cs] for i < mr, j < jn,
    // else 0 (f32 operations in that order).
    void (*sign_tables)(const float * f, ptrdiff_t rs, ptrdiff_t cs, int mr, int64_t jn, int64_t nq, float alpha,
                        float * tab);
    // fsign_tile: for i < mr, k < nk (nk <= 64; nq a multiple of 8):
    //   c[i*ldc + k] = (acc ? c[i*ldc + k] : 0) + tab(i, 0)[e_0] + tab(i, 1)[e_1] + ... (f32, in order q)
    // with e_q = (idx[(q/8)*ids + k] >> 4*(q%8)) & 15; idx must be readable for k < 64.
    void (*fsign_tile)(const float * tab, int64_t nq, const uint32_t * idx, size_t ids, int mr, int64_t nk, bool acc,
                       float * c, size_t ldc);
};

extern const struct cpu_kernels bie_cpu_kernels_scalar;
extern const struct cpu_kernels bie_cpu_kernels_avx2;
extern const struct cpu_kernels bie_cpu_kernels_avx512;
extern const struct cpu_kernels bie_cpu_kernels_avx512vpopcnt;
extern const struct cpu_kernels bie_cpu_kernels_avx512vpopcnt_vnni; // with AVX512-VNNI n-bit tiles

// The scalar store that the AVX2 table shares (cpu-kernels-scalar.c).
void bie_cpu_store_cols_f32__scalar(const int32_t * acc, size_t ldacc, int64_t rows, int64_t cols, float s, float * dst,
                                    size_t ldd, bool stream);

// The AVX-512 kernels that the VPOPCNTDQ table shares (cpu-kernels-avx512.c).
void bie_cpu_i16_tile_4x4__avx512(const int16_t * a, size_t lda, const int16_t * b, size_t ldb, size_t k, int32_t * c,
                                  size_t ldc);
void bie_cpu_i16_outer_tile__avx512(const void * a, const void * b, size_t kp, bool accumulate, int32_t * c,
                                    size_t ldc);
void bie_cpu_u4s4_outer_tile__avx512(const void * a, const void * b, size_t kq, bool accumulate, int32_t * c,
                                     size_t ldc);
void bie_cpu_interleave_nr__avx512(const int16_t * rows, size_t kp, int16_t * panel);
void bie_cpu_widen_nr__avx512(const int8_t * rows, ptrdiff_t ld, int nr, size_t n, int16_t * panel);
void bie_cpu_interleave_mr__avx512(const void * rows, size_t rb, size_t n, void * panel);
void bie_cpu_planes_to_rows__avx512(const int16_t * src, size_t lds, size_t np, int16_t * dst, size_t ldd);
void bie_cpu_u4s4_tile_4x4__avx512(const uint8_t * a, size_t lda, const int8_t * b, size_t ldb, size_t k, int32_t * c,
                                   size_t ldc);
double bie_cpu_mask_binary__avx512(const float * x, const float * bias, float b0, float scale, float * gx, int64_t n);
void bie_cpu_sign_bits__avx512(const float * x, const float * bias, float b0, int64_t n, uint8_t * out);
void bie_cpu_quantize__avx512(const float * x, const float * bias, float b0, int64_t n, float scale, int lo, int hi,
                              int16_t * out);
void bie_cpu_sign_idx__avx512(const float * src, const float * bias, int64_t n, int t, uint32_t * dst);
void bie_cpu_sign_tables__avx512(const float * f, ptrdiff_t rs, ptrdiff_t cs, int mr, int64_t jn, int64_t nq,
                                 float alpha, float * tab);
void bie_cpu_store_cols_f32__avx512(const int32_t * acc, size_t ldacc, int64_t rows, int64_t cols, float s, float * dst,
                                    size_t ldd, bool stream);
void bie_cpu_fsign_tile__avx512(const float * tab, int64_t nq, const uint32_t * idx, size_t ids, int mr, int64_t nk,
                                bool acc, float * c, size_t ldc);

// The entries every AVX-512 table holds alike, and the outer-product n-bit tiles of the tables
// without VNNI (with it, the vpdpbusd byte tile serves both n-bit kinds): a table lists these and
// adds only what differs, so a new AVX-512 kernel is named once.
#define BIE_CPU_AVX512_SHARED                                                                                          \
    .i16_nr = 4, .i16_tile = bie_cpu_i16_tile_4x4__avx512, .sign_bits = bie_cpu_sign_bits__avx512,                     \
    .quantize = bie_cpu_quantize__avx512, .mask_binary = bie_cpu_mask_binary__avx512,                                  \
    .store_cols_f32 = bie_cpu_store_cols_f32__avx512, .sign_idx = bie_cpu_sign_idx__avx512,                            \
    .sign_tables = bie_cpu_sign_tables__avx512, .fsign_tile = bie_cpu_fsign_tile__avx512,                              \
    .planes_to_rows = bie_cpu_planes_to_rows__avx512
#define BIE_CPU_AVX512_OUTER                                                                                           \
    .i16_outer_tile = bie_cpu_i16_outer_tile__avx512, .interleave_nr = bie_cpu_interleave_nr__avx512,                  \
    .widen_nr = bie_cpu_widen_nr__avx512, .interleave_mr = bie_cpu_interleave_mr__avx512,                              \
    .u4s4_outer_tile = bie_cpu_u4s4_outer_tile__avx512

// The table for an ISA level (the best one not above it); at the VPOPCNTDQ level, the VNNI variant
// when the CPU has AVX512-VNNI.
const struct cpu_kernels * bie_cpu_kernels(enum bie_cpu_isa isa);

// The binary tile for rows of kbp bytes.
static inline const struct cpu_bin_tile * cpu_bin_tile_for(const struct cpu_kernels * k, size_t kbp) {
    return k->bin_long.tile && kbp >= k->bin_long_kb ? &k->bin_long : &k->bin;
}

// Scalar quantisation shared by every ISA's tail handling: clamp(rne(v / scale), lo, hi).
// NaN maps to lo (the comparison v > lo is false), matching the reference.
static inline int cpu_quantize1(float v, float scale, int lo, int hi) {
    const float r = bie_rne(v / scale);
    if (!(r >= (float)lo)) return lo;
    if (r > (float)hi) return hi;
    return (int)r;
}

// --- shared helpers (cpu-common.c) ----------------------------------------------------------------

// Threads for a context: params.num_threads, or OpenMP's default when <= 0.
int cpu_threads(const bie_context_t * ctx);
// A planned call on the CPU backend (call->plan): its ISA level and threads, in words; the host
// workspace is sized when the call runs.
enum bie_status bie_cpu_plan(bie_context_t * ctx, const struct bie_layer_call * call);

static inline size_t cpu_round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

// Carves aligned pieces out of the call's single workspace buffer.
struct cpu_arena {
    uint8_t * base;
    size_t used, cap;
};
// Bytes to reserve for a piece of `bytes` (64-byte aligned).
static inline size_t cpu_arena_size(size_t bytes) { return cpu_round_up(bytes, 64); }
static inline void * cpu_arena_take(struct cpu_arena * a, size_t bytes) {
    void * p = a->base + a->used;
    a->used += cpu_arena_size(bytes);
    return p;
}

// Reads element `off` of a float / I8 / I32 / B1 / S4 view as float (B1: +-1, S4: the code).
float cpu_load(const struct bie_tensor * t, int64_t off);
// bias_a as a dense f32 array of C values (zeros when absent).
void cpu_bias_dense(const struct bie_tensor * bias, int64_t C, float * out);

// Geometry helpers: the K order is (tap t = i*kw + j, channel c).
static inline bool cpu_is_plain_1x1(const struct bie_geometry * g) {
    return g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 && g->pw == 0;
}

// Output transform of integer accumulators (fused epilogue, cpu-epilogue.c).
// acc holds mc rows (output pixels m0 .. m0+mc-1) of nc values (channels n0 .. n0+nc-1), row
// stride ldacc. Writes y = acc * scale (f32/f16/bf16, RNE), acc (I32) or (acc >= 0) (B1).
struct cpu_epilogue {
    const struct bie_layer_call * call;
    const struct cpu_kernels * kern;
    float scale;   // scale_a * scale_w, computed once in f32
    bool stream;   // y is large: stores may bypass the caches
    bool b1_bytes; // y is B1 with whole-byte channel rows (stride[1] == 1, others % 8 == 0)
};
void cpu_epilogue_init(struct cpu_epilogue * e, const struct bie_layer_call * call, const struct cpu_kernels * kern);
// True when the stores of different output pixels can run on different threads.
bool cpu_epilogue_parallel_safe(const struct cpu_epilogue * e);
void cpu_epilogue_store(const struct cpu_epilogue * e, int64_t m0, int64_t mc, int64_t n0, int64_t nc,
                        const int32_t * acc, size_t ldacc);

// Runs an integer GEMM over row panels a (Mp rows) and column panels b (Np rows) in tiles on
// `threads` threads, then calls the epilogue on every tile. kind 1: binary (bin->tile, the
// tile gives popcounts, finish() turns them into acc); kind 16: int16 (kern->i16_tile); kind 4:
// unsigned x signed bytes (kern->u4s4_tile).
struct cpu_gemm {
    const struct cpu_kernels * kern;
    int kind;
    const struct cpu_bin_tile * bin; // kind 1
    const void * a;
    const void * b;
    size_t lda, ldb; // per row: bytes (binary, int8) or elements (int16); binary B: group bytes / bin->nr
    size_t k;        // KBp bytes (binary) or Kp elements (int16)
    int64_t M, N;    // valid rows / columns
    // Called per tile with the raw tile (popcounts or acc), to fix it up and store it.
    void (*finish)(void * ctx, int64_t m0, int64_t mc, int64_t n0, int64_t nc, int32_t * acc, size_t ldacc);
    void * finish_ctx;
};
// Workspace bytes run_gemm needs for its per-thread tile buffers.
size_t cpu_gemm_workspace(int threads);
void cpu_gemm_run(const struct cpu_gemm * job, int threads, void * tile_ws, bool parallel_stores);

// Float-by-sign GEMM (cpu-signgemm.c), the two GEMMs of a binary linear layer's backward:
//   c[r*ldc + k] = alpha * sum_{j<J} F(r, j) * S[j][k]    (r < R, k < K)
// with F(r, j) = f[r*rs + j*cs] (f32) and S a +-1 matrix given as sign-index blocks: bit j%32 of
// idx[(j/32)*ids + k] is set iff S[j][k] = +1 (ids = cpu_signgemm_ids(K); see cpu_signgemm_idx).
// Every output is summed in the same order whatever the thread count.
struct cpu_signgemm {
    const float * f;
    ptrdiff_t rs, cs;
    int64_t R, J, K;
    float alpha;
    const uint32_t * idx;
    float * c;
    size_t ldc;
};
static inline size_t cpu_signgemm_ids(int64_t K) { return cpu_round_up((size_t)K, 64); }
static inline size_t cpu_signgemm_idx_bytes(int64_t J, int64_t K) {
    return (size_t)((J + 31) / 32) * cpu_signgemm_ids(K) * sizeof(uint32_t);
}
// The sign-index blocks of S[j][k] = (t[j*s0 + k*s1] + bias[k] >= 0 ? +1 : -1) for j < J, k < K (f32
// add; bias NULL: none; an element of a B1 view reads as +-1).
void cpu_signgemm_idx(const struct cpu_kernels * kern, const struct bie_tensor * t, int64_t J, int64_t K, int64_t s0,
                      int64_t s1, const float * bias, int threads, uint32_t * idx);
size_t cpu_signgemm_workspace(int threads);
void cpu_signgemm_run(const struct cpu_kernels * kern, const struct cpu_signgemm * job, int threads, void * ws);

// Task sizes of the conv backward (output pixels per task; grad_W partials per wave). Shape-only
// constants; tests lower them to exercise many tasks and waves.
extern int64_t bie_cpu_bwd_task_pixels;
extern int64_t bie_cpu_bwd_wave_max;

// Operators: the binary and n-bit forwards (the table's forward picks one) and the table's slots.
bie_layer_slot bie_cpu_binary_forward, bie_cpu_nbit_forward, bie_cpu_layer_forward, bie_cpu_layer_backward;
// A layer call with an x_clamp (cpu-backend.c): the call without it on a clamped f32 copy of x.
enum bie_status bie_cpu_clamped(bie_context_t * ctx, const struct bie_layer_call * call, bool backward);
bie_pack_slot bie_cpu_pack, bie_cpu_unpack;
bie_ste_slot bie_cpu_binarize_ste;
bie_matmul_slot bie_cpu_matmul_forward, bie_cpu_matmul_backward;
bie_embedding_slot bie_cpu_embedding_forward, bie_cpu_embedding_backward;
