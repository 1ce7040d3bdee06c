// SPDX-License-Identifier: Apache-2.0
// ref-impl.h: entry points of the plain-C reference backend (src/ref), the specification that
// every faster path is tested against.
#pragma once

#include "bie-impl.h"

enum bie_status bie_ref_layer_forward(bie_context_t * ctx, const struct bie_layer_call * call);
enum bie_status bie_ref_layer_backward(bie_context_t * ctx, const struct bie_layer_call * call);
enum bie_status bie_ref_pack(bie_context_t * ctx, const struct bie_tensor * src, float scale,
                             const struct bie_tensor * dst);
enum bie_status bie_ref_unpack(bie_context_t * ctx, const struct bie_tensor * src, float scale,
                               const struct bie_tensor * dst);
enum bie_status bie_ref_reduce(bie_context_t * ctx, const struct bie_tensor * x, double * sum_abs,
                               double * sum);
