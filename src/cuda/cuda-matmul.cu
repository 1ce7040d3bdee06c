// SPDX-License-Identifier: Apache-2.0
// cuda-matmul.cu: the batched matmul of two activations on CUDA tensors. Batch b is the linear layer
// whose input is x[b] and whose weight is y[b] (bie_matmul_layer_call), so each batch runs the
// layers' forward: x[b] and y[b] packed to bit rows (binary) or int8 code rows by the layers'
// packers, then the tensor-core GEMM (binary: AND-popcount, on Hopper through wgmma) with the scale
// epilogue fused, writing out[b] in its dtype. The backward runs each operand's side as that
// layer's backward (cuBLAS GEMMs of grad_out with the other operand's codes, then the fused STE
// pass), the y side with grad_out[b] transposed. Each side's clip gradient is the batches' partial
// sums (each over its batch's numel) added in double in batch order and divided by sqrt(B), from
// partials kept in the context's aux arena, which the layer calls (they use the workspace) leave
// alone. Nothing synchronises the host.
#include "cuda-impl.cuh"

#include <math.h>

extern "C" {
enum bie_status bie_cuda_layer_forward(bie_context_t * ctx, const struct bie_layer_call * call);
enum bie_status bie_cuda_layer_backward(bie_context_t * ctx, const struct bie_layer_call * call);
}

namespace {

// out (a scalar of F32, F16 or BF16) = sum(part[0 .. n)) / sqrt(n), the sum in double in a fixed
// order: lane j adds elements j, j + 32, ... and the lanes meet in a fixed tree.
__global__ void clip_total(const float * part, int64_t n, struct dview out) {
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += 32) s += (double)part[i];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
    if (threadIdx.x == 0) st_float(out.data, out.dtype, 0, (float)(s / sqrt((double)n)));
}

} // namespace

extern "C" enum bie_status bie_cuda_matmul_forward(bie_context_t * ctx, const struct bie_matmul_call * mc) {
    for (int64_t b = 0; b < mc->B; b++) {
        struct bie_layer_call lc;
        bie_matmul_layer_call(mc, b, 0, &lc);
        BIE_TRY(bie_cuda_layer_forward(ctx, &lc));
    }
    return BIE_STATUS_OK;
}

extern "C" enum bie_status bie_cuda_matmul_backward(bie_context_t * ctx, const struct bie_matmul_call * mc) {
    struct bie_cuda_state * st;
    BIE_TRY(bie_cuda_state_get(ctx, mc->device_index, &st));
    const struct bie_tensor *grads[2] = {&mc->grad_x, &mc->grad_y}, *clips[2] = {&mc->grad_x_clip, &mc->grad_y_clip};
    float * part = NULL;
    if (clips[0]->data || clips[1]->data) BIE_TRY(bie_cuda_aux(ctx, 2 * (size_t)mc->B * sizeof(float), (void **)&part));
    for (int side = 0; side < 2; side++) {
        if (!grads[side]->data && !clips[side]->data) continue;
        for (int64_t b = 0; b < mc->B; b++) {
            struct bie_layer_call lc;
            bie_matmul_layer_call(mc, b, side, &lc);
            if (clips[side]->data) {
                bie_tensor_make(&lc.grad_scale_a, part + side * mc->B + b, BIE_DTYPE_F32, 0, NULL);
                lc.grad_scale_a.device_type = BIE_DEVICE_CUDA;
                lc.grad_scale_a.device_index = mc->device_index;
            }
            BIE_TRY(bie_cuda_layer_backward(ctx, &lc));
        }
        if (clips[side]->data) {
            struct dview out;
            dview_make(clips[side], &out);
            clip_total<<<1, 32, 0, st->stream>>>(part + side * mc->B, mc->B, out);
            LAUNCHED(ctx, "matmul clip gradient");
        }
    }
    return BIE_STATUS_OK;
}
