// SPDX-License-Identifier: Apache-2.0
// cuda-wgmma.cu: the host side of the Hopper GEMM (cuda-wgmma-tiles.cuh gives its layout): the
// tensor maps of the operands and of y, the choice of the tile width, and the dispatch to an
// instance of the launch table (cuda-wgmma-kernels-*.cu).
#include "cuda-wgmma-tiles.cuh"

#include <stdlib.h>
#include <string.h>

namespace {

typedef CUresult (*encode_tiled_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                    const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                    CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The driver's tensor-map encoder, fetched once (NULL when the driver lacks it).
encode_tiled_fn encoder() {
    static const encode_tiled_fn fn = [] {
        void * p = NULL;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) !=
                cudaSuccess ||
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
    const CUtensorMapDataType dt = esz == 4                   ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
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

// The instance of the launch table for this GEMM (tile width bn): its key, as the epilogue needs.
// SPLIT tiles (bie_cuda_gemm_wgmma checked split_fits) store f16/bf16/f32 y by bulk copies, with
// the border correction of a zero-padded conv compiled in when there is one. Else: B1 y without a
// sign step straight from the epilogue (binary convs with the correction compiled in);
// f16/bf16/f32 y with contiguous features (or planes) by the FAST epilogue (zero-padded binary
// convs with the correction compiled in); any other y element by element (which handles the taps
// too).
wgmma_key choose_kernel(const gemm_epilogue & ep, int bn, int64_t N) {
    const struct dview & y = ep.y;
    const bool binary = ep.binary, taps = binary && ep.tapcorr != NULL;
    const wgmma_out fl = y.dtype == BIE_DTYPE_F16 ? OUT_F16 : y.dtype == BIE_DTYPE_BF16 ? OUT_BF16 : OUT_F32;
    const bool float_y = y.dtype == BIE_DTYPE_F16 || y.dtype == BIE_DTYPE_BF16 || y.dtype == BIE_DTYPE_F32;
    if (split_for(binary, bn)) return wgmma_key{binary, bn, fl, true, taps};
    if (y.dtype == BIE_DTYPE_B1 && !ep.sign) return wgmma_key{binary, bn, OUT_BITS, true, taps};
    const bool fast = (y.stride[1] == 1 || N == 1 || y_planes(ep)) && (!binary || ep.g.K < DOT_BIAS_MAX_K);
    if (fast && float_y) return wgmma_key{binary, bn, fl, true, taps};
    return wgmma_key{binary, bn, OUT_F32, false, false};
}

// The table entry of a key, and its index in the concatenated table (-1: none).
const wgmma_kernel * find_kernel(const wgmma_key & k, int * index) {
    static const wgmma_kernel_group * const groups[] = {&bie_wgmma_kernels_nbit, &bie_wgmma_kernels_b1_narrow,
                                                        &bie_wgmma_kernels_b1_wide};
    int i = 0;
    for (const wgmma_kernel_group * g : groups)
        for (int e = 0; e < g->n; e++, i++) {
            const wgmma_key & t = g->kernels[e].key;
            if (t.binary == k.binary && t.bn == k.bn && t.out == k.out && t.fast == k.fast && t.taps == k.taps) {
                *index = i;
                return &g->kernels[e];
            }
        }
    *index = -1;
    return NULL;
}

// Launches the table's instance for this GEMM. The first launch of an instance in a context checks
// its registers and sets its shared memory (its bit in wgmma_smem_set records it).
enum bie_status launch(bie_context_t * ctx, const CUtensorMap & ta, const CUtensorMap & tb, int bn, int64_t M,
                       int64_t N, int ktiles, const gemm_epilogue & ep, const gemm_gather & gs) {
    const wgmma_key key = choose_kernel(ep, bn, N);
    int slot;
    const wgmma_kernel * k = find_kernel(key, &slot);
    if (!k || slot >= 64)
        return bie_set_error(ctx, BIE_STATUS_INTERNAL, "wgmma gemm: no kernel for %s %d-column tiles, y type %d",
                             key.binary ? "binary" : "n-bit", bn, (int)key.out);
    const bool binary = key.binary;
    const int smem = smem_for(binary, bn), BM = bm_for(binary, bn), threads = threads_for(binary, bn);
    struct bie_cuda_state * st = ctx->cuda;
    if (!(st->wgmma_smem_set & (1ull << slot))) {
        // The consumers' setmaxnreg.inc would wait forever if the launch gave fewer registers
        // than the split assumes.
        cudaFuncAttributes fa;
        CU_TRY(ctx, cudaFuncGetAttributes(&fa, k->fn), "cudaFuncGetAttributes(wgmma gemm)");
        if (fa.numRegs * threads < regs_needed(binary, bn))
            return bie_set_error(ctx, BIE_STATUS_INTERNAL, "wgmma gemm: built with %d registers per thread, too few",
                                 fa.numRegs);
        CU_TRY(ctx, cudaFuncSetAttribute(k->fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
               "cudaFuncSetAttribute(wgmma gemm)");
        st->wgmma_smem_set |= 1ull << slot;
    }
    const int64_t tiles = ((M + BM - 1) / BM) * ((N + bn - 1) / bn);
    const int sms = bie_cuda_sm_count(ctx);
    if (sms <= 0) return bie_set_error(ctx, BIE_STATUS_DEVICE_ERROR, "cuda: the multiprocessor count cannot be read");
    const unsigned grid = (unsigned)(tiles < sms ? tiles : sms);
    CUtensorMap ty;
    const bool y_by_map = key.fast && make_y_map(&ty, ep, M, N);
    if (!y_by_map) memset(&ty, 0, sizeof ty);
    if (split_for(binary, bn) && (!y_by_map || gs.x))
        return bie_set_error(ctx, BIE_STATUS_INTERNAL, "wgmma gemm: SPLIT tiles without a y map or with gathered rows");
    const int y_mode = y_by_map ? Y_ROWS_MAP : key.fast && y_planes(ep) ? Y_PLANES : Y_ROWS;
    // After a kernel that wrote epilogue terms only, as a programmatic dependent launch: the CTAs
    // start (barriers, first loads and MMAs) while that kernel finishes. After one that wrote an
    // operand, the same with the producer waiting before its first load.
    cudaLaunchAttribute attr;
    cudaLaunchConfig_t cfg =
        bie_cuda_launch_config(ctx, dim3(grid), dim3(threads), (size_t)smem, ep.terms_last || ep.operands_last, &attr);
    CU_TRY(ctx, cudaLaunchKernelEx(&cfg, k->fn, ta, tb, ty, y_mode, M, N, ktiles, ep, gs), "wgmma gemm launch");
    LAUNCHED(ctx, "wgmma gemm");
    return BIE_STATUS_OK;
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
    if (binary && kbytes / BK <= SPLIT_MAX_KTILES && n192 * 192 - N <= N / 16 && mt * n192 >= SPLIT_MIN_ROUNDS * sms)
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
    if (!make_map(&tb, B, N, kbytes, ep.ldb, bn) ||
        (!gs && !make_map(&ta, A, M, kbytes, kbytes, bm_for(ep.binary, bn))))
        return bie_set_error(ctx, BIE_STATUS_DEVICE_ERROR, "cuda: cuTensorMapEncodeTiled refused the GEMM operands");
    if (gs) ta = tb; // (unused: the producer gathers A)
    gemm_gather none;
    memset(&none, 0, sizeof none);
    const int ktiles = (int)(kbytes / BK);
    return launch(ctx, ta, tb, bn, M, N, ktiles, ep, gs ? *gs : none);
}