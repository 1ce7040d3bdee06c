// SPDX-License-Identifier: Apache-2.0
// ref-impl.h: entry points of the plain-C reference backend (src/ref), the specification that
// every faster path is tested against, and the small helpers its files share.
#pragma once

#include "bie-impl.h"

bie_layer_slot bie_ref_layer_forward;
// The forward's epilogue on a host y that holds the layer's stored output (bie_forward_args):
//   y[n, o, h, w] = round_y(((f32(y) * out_mul[o]) + out_add[o]) + f32(residual[n, o, h, w]))
// each f32 operation rounded on its own, the step of an absent term skipped; then the sign bits
//   out_bits[n, o, h, w] = f32(y[n, o, h, w]) + out_bits_bias[o] >= 0   (NaN: 0).
void bie_ref_layer_epilogue(const struct bie_layer_call * call);
bie_layer_slot bie_ref_layer_backward;
bie_pack_slot bie_ref_pack, bie_ref_unpack;
bie_reduce_slot bie_ref_reduce;
bie_matmul_slot bie_ref_matmul_forward, bie_ref_matmul_backward;
bie_embedding_slot bie_ref_embedding_forward, bie_ref_embedding_backward;
bie_pool_slot bie_ref_affine_maxpool2d, bie_ref_affine_maxpool2d_backward;

// The binary STE (bie_binarize_ste), and its pass test on x': |x' / scale_a| <= 1 with the division
// in f32 (NaN fails).
bie_ste_slot bie_ref_binarize_ste;
static inline bool bie_ref_ste_passes(float xp, float scale_a) { return __builtin_fabsf(xp / scale_a) <= 1.0f; }

// --- src/ref/ref-codes.c: dense code arrays and the tap geometry ------------------------------
//
// Dense layouts used inside the reference (all row-major):
//   x-shaped arrays  [batch][C][H][W]      index ((n*C + c)*H + h)*W + w
//   weight arrays    [O][K], K = C*kh*kw   k = (c*kh + i)*kw + j
//   y-shaped arrays  [batch][O][OH][OW]

// clamp(rne(v / scale), lo, hi) with the division in f32; NaN gives lo.
int bie_ref_quantize(float v, float scale, int lo, int hi);

// x' = f32(x) + f32(bias_a[c]) for every element of a float x, dense (x clamped first when the
// call has an x_clamp).
void bie_ref_x_shifted(const struct bie_layer_call * call, float * xp);
// The clamp's derivative over the call's stored grad_x (a backward with an x_clamp t, after its
// sums; the CPU backend's too): grad_x = 0 where !(|f32(x)| < t).
void bie_ref_clamp_gate(const struct bie_layer_call * call);
// grad_x = round(f32(grad_x) + f32(grad_x_add)) over the call's stored grad_x (a backward's
// grad_x_add, added last; the CPU backend's too).
void bie_ref_grad_x_add(const struct bie_layer_call * call);

// Activation codes a (binary +-1, n-bit clamp(rne(x'/scale_a), lo, hi)), dense. xp is the
// output of bie_ref_x_shifted, or NULL when x is B1 (the codes are then its bits).
void bie_ref_x_codes(const struct bie_layer_call * call, const float * xp, int8_t * a);

// The +-1 values of a B1 4-D view t [d0][d1][d2][d3], dense.
void bie_ref_bits4(const struct bie_tensor * t, int8_t * out);

// Weight codes w (binary +-1, n-bit clamped integer codes), dense [O][K].
void bie_ref_w_codes(const struct bie_layer_call * call, int8_t * w);

// The patch read by output position (n, oh, ow): for each k, idx[k] is the dense x index of the
// tap or -1 when it falls in the padding, and val[k] is a_pad: the code a[idx[k]] inside the
// image, the pad value (0, -1 or +1) outside it.
void bie_ref_patch(const struct bie_geometry * g, const int8_t * a, int64_t n, int64_t oh, int64_t ow, int64_t * idx,
                   int8_t * val);

// Dense-to-view copies over a 4-D view t [d0][d1][d2][d3].
void bie_ref_load4(const struct bie_tensor * t, double * dense);
void bie_ref_store4(const struct bie_tensor * t, const double * dense);

// Writes v to element `off` of a float tensor with ONE rounding to its dtype (f16 and bf16 go
// through a round-to-odd f32, so no double rounding happens); other dtypes as bie_store.
void bie_ref_store_rounded(const struct bie_tensor * t, int64_t off, double v);

// Bump allocator over one workspace request: offsets are 64-byte aligned.
struct bie_ref_arena {
    size_t size;   // bytes planned so far
    bool overflow; // a size did not fit in size_t
};
size_t bie_ref_arena_take(struct bie_ref_arena * a, size_t count, size_t elem_size);
