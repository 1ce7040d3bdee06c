// SPDX-License-Identifier: Apache-2.0
// cuda-backward.cuh: what the two routes of the CUDA backward share (cuda-backward.cu gives the
// math): the passes that write weight and activation codes as GEMM operands, and the scatter of
// grad_weight (cuda-backward.cu); the cuDNN route of convs (cuda-backward-cudnn.cu).
#pragma once

#include "cuda-impl.cuh"
#include "cuda-ste.cuh"

// Whether the [rows, K] view t has rows the codes passes take (see launch_codes_rows).
bool codes_rows_ok(const struct dview & t, bool rows_are_k, int64_t K);
// The codes of t's rows (x + bias, or the weight, clamped and scaled by sc) as dense GEMM rows
// of dtype gdt; false (nothing queued) when the rows are not ones the passes take. gx: a grad_x
// (gx_ld elements between rows) to mask by the STE in the same pass; pass: for t of saved bits
// and a gx to mask, the saved mask (rows like t's); else unused.
bool launch_codes_rows(const struct dview & t, const struct dview & pass, bool rows_are_k, int64_t rows, int64_t K,
                       const struct dview & bias, int quant, struct dscale sc, int gdt, void * out, cudaStream_t stream,
                       void * gx = NULL, int64_t gx_ld = 0);
// An absent bias_a.
struct dview bias_none();
// Queues weight_codes: Wc[o][k] = weight code at (o, c, i, j) (tap_major: Wc[t][o][c]).
void launch_weight_codes(cudaStream_t s, const struct dview & w, const struct dgeom & g, int quant, struct dscale sw,
                         int gdt, int tap_major, void * Wc);
// Queues grad_W[o, c, i, j] = scale_a * R[o][(i*kw + j)*C + c], R of dtype dt (dense [O][K]): row by
// row where grad_W is OHWI with contiguous rows, by a transpose where it is dense OIHW, else a scatter.
void launch_grad_w(cudaStream_t s, int dt, const void * R, const struct dgeom & g, struct dscale sa,
                   const struct dview & gw);

// cuda-backward-cudnn.cu: whether the conv backward goes through cuDNN, and that route
// (BIE_DECLINED: cuDNN has no algorithm for the shape; the GEMM route takes it).
bool cudnn_route(bie_context_t * ctx, const struct bie_layer_call * c);
enum bie_status backward_cudnn(bie_context_t * ctx, const struct bie_layer_call * c, cudaStream_t s);
