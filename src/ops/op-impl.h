// SPDX-License-Identifier: Apache-2.0
// op-impl.h: argument checks shared by the public entry points of the layers, the batched matmul
// and the embedding (src/ops/layer.c, matmul.c, embedding.c). Each names the argument in its message.
#pragma once

#include "bie-impl.h"

// t is on device (type, index).
enum bie_status bie_op_check_device(bie_context_t * ctx, const char * name, const struct bie_tensor * t,
                                    enum bie_device_type type, int32_t index);
// t is f32, f16 or bf16.
enum bie_status bie_op_check_float(bie_context_t * ctx, const char * name, const struct bie_tensor * t);
// A well-formed scalar float scale on the device, finite and > 0 when it is on the host (*value
// then holds it and *on_host stays as it is; a device scalar clears *on_host).
enum bie_status bie_op_check_scale(bie_context_t * ctx, const char * name, const struct bie_tensor * t,
                                   enum bie_device_type type, int32_t index, float * value, bool * on_host);
// A gradient output: a well-formed float tensor (no broadcast strides) on the device.
enum bie_status bie_op_check_grad(bie_context_t * ctx, const char * name, const struct bie_tensor * t,
                                  enum bie_device_type type, int32_t index);
// out = t with its first `lead` dims merged into one (extent the product, 1 when lead == 0):
// INVALID_ARGUMENT when they are not evenly strided (not mergeable without a copy).
enum bie_status bie_op_merge_leading(bie_context_t * ctx, const char * name, const struct bie_tensor * t, int32_t lead,
                                     struct bie_tensor * out);
// t has ndim dims equal to shape.
enum bie_status bie_op_check_shape(bie_context_t * ctx, const char * name, const struct bie_tensor * t, int32_t ndim,
                                   const int64_t * shape);
