// SPDX-License-Identifier: Apache-2.0
// abi.c: bie_abi_layout, the sizes and field offsets of the public structs, so that a binding
// which declares them by hand (python/bie/_lib.py) can check its declarations against the
// library it loaded instead of passing misread arguments.
#include "bie-impl.h"

#include <stddef.h>
#include <string.h>

struct abi_field {
    const char * strct;
    const char * field; // NULL: the struct itself
    size_t offset, size;
};

#define ABI_STRUCT(s)                                                                                                  \
    { #s, NULL, 0, sizeof(struct s) }
#define ABI_FIELD(s, f)                                                                                                \
    { #s, #f, offsetof(struct s, f), sizeof(((struct s *)0)->f) }

static const struct abi_field fields[] = {
    ABI_STRUCT(bie_tensor),
    ABI_FIELD(bie_tensor, data),
    ABI_FIELD(bie_tensor, dtype),
    ABI_FIELD(bie_tensor, ndim),
    ABI_FIELD(bie_tensor, shape),
    ABI_FIELD(bie_tensor, stride),
    ABI_FIELD(bie_tensor, device_type),
    ABI_FIELD(bie_tensor, device_index),
    ABI_STRUCT(bie_context_params),
    ABI_FIELD(bie_context_params, backend),
    ABI_FIELD(bie_context_params, num_threads),
    ABI_FIELD(bie_context_params, max_isa),
    ABI_STRUCT(bie_linear_desc),
    ABI_FIELD(bie_linear_desc, quant),
    ABI_FIELD(bie_linear_desc, in_features),
    ABI_FIELD(bie_linear_desc, out_features),
    ABI_STRUCT(bie_conv2d_desc),
    ABI_FIELD(bie_conv2d_desc, quant),
    ABI_FIELD(bie_conv2d_desc, in_channels),
    ABI_FIELD(bie_conv2d_desc, out_channels),
    ABI_FIELD(bie_conv2d_desc, kernel),
    ABI_FIELD(bie_conv2d_desc, stride),
    ABI_FIELD(bie_conv2d_desc, padding),
    ABI_FIELD(bie_conv2d_desc, dilation),
    ABI_FIELD(bie_conv2d_desc, groups),
    ABI_FIELD(bie_conv2d_desc, pad_value),
    ABI_STRUCT(bie_forward_args),
    ABI_FIELD(bie_forward_args, x),
    ABI_FIELD(bie_forward_args, bias_a),
    ABI_FIELD(bie_forward_args, weight),
    ABI_FIELD(bie_forward_args, scale_a),
    ABI_FIELD(bie_forward_args, scale_w),
    ABI_FIELD(bie_forward_args, y),
    ABI_STRUCT(bie_backward_args),
    ABI_FIELD(bie_backward_args, x),
    ABI_FIELD(bie_backward_args, bias_a),
    ABI_FIELD(bie_backward_args, weight),
    ABI_FIELD(bie_backward_args, scale_a),
    ABI_FIELD(bie_backward_args, scale_w),
    ABI_FIELD(bie_backward_args, grad_y),
    ABI_FIELD(bie_backward_args, grad_x),
    ABI_FIELD(bie_backward_args, grad_weight),
    ABI_FIELD(bie_backward_args, grad_scale_a),
    ABI_FIELD(bie_backward_args, grad_bias_a),
    ABI_FIELD(bie_backward_args, x_mask),
    ABI_STRUCT(bie_matmul_desc),
    ABI_FIELD(bie_matmul_desc, quant),
    ABI_STRUCT(bie_matmul_args),
    ABI_FIELD(bie_matmul_args, x),
    ABI_FIELD(bie_matmul_args, y),
    ABI_FIELD(bie_matmul_args, x_clip),
    ABI_FIELD(bie_matmul_args, y_clip),
    ABI_FIELD(bie_matmul_args, out),
    ABI_STRUCT(bie_matmul_backward_args),
    ABI_FIELD(bie_matmul_backward_args, x),
    ABI_FIELD(bie_matmul_backward_args, y),
    ABI_FIELD(bie_matmul_backward_args, x_clip),
    ABI_FIELD(bie_matmul_backward_args, y_clip),
    ABI_FIELD(bie_matmul_backward_args, grad_out),
    ABI_FIELD(bie_matmul_backward_args, grad_x),
    ABI_FIELD(bie_matmul_backward_args, grad_y),
    ABI_FIELD(bie_matmul_backward_args, grad_x_clip),
    ABI_FIELD(bie_matmul_backward_args, grad_y_clip),
    ABI_STRUCT(bie_embedding_desc),
    ABI_FIELD(bie_embedding_desc, quant),
    ABI_FIELD(bie_embedding_desc, bag),
    ABI_STRUCT(bie_embedding_args),
    ABI_FIELD(bie_embedding_args, indices),
    ABI_FIELD(bie_embedding_args, table),
    ABI_FIELD(bie_embedding_args, scale),
    ABI_FIELD(bie_embedding_args, out),
    ABI_STRUCT(bie_embedding_backward_args),
    ABI_FIELD(bie_embedding_backward_args, indices),
    ABI_FIELD(bie_embedding_backward_args, inverse),
    ABI_FIELD(bie_embedding_backward_args, scale),
    ABI_FIELD(bie_embedding_backward_args, grad_out),
    ABI_FIELD(bie_embedding_backward_args, grad_rows),
    ABI_STRUCT(bie_adam_params),
    ABI_FIELD(bie_adam_params, lr),
    ABI_FIELD(bie_adam_params, beta1),
    ABI_FIELD(bie_adam_params, beta2),
    ABI_FIELD(bie_adam_params, eps),
    ABI_FIELD(bie_adam_params, weight_decay),
    ABI_FIELD(bie_adam_params, clip),
    ABI_STRUCT(bie_diode_params),
    ABI_FIELD(bie_diode_params, lr),
    ABI_FIELD(bie_diode_params, beta1),
    ABI_FIELD(bie_diode_params, beta2),
    ABI_STRUCT(bie_wq_desc),
    ABI_FIELD(bie_wq_desc, in_features),
    ABI_FIELD(bie_wq_desc, out_features),
    ABI_FIELD(bie_wq_desc, bits),
    ABI_FIELD(bie_wq_desc, group_size),
    ABI_FIELD(bie_wq_desc, zero),
    ABI_FIELD(bie_wq_desc, act),
    ABI_STRUCT(bie_wq_weight),
    ABI_FIELD(bie_wq_weight, qweight),
    ABI_FIELD(bie_wq_weight, scales),
    ABI_FIELD(bie_wq_weight, zeros),
    ABI_FIELD(bie_wq_weight, group_bits),
    ABI_FIELD(bie_wq_weight, perm),
    ABI_FIELD(bie_wq_weight, channel_scale),
    ABI_FIELD(bie_wq_weight, bias),
};

enum bie_status bie_abi_layout(const char * name, const char * field, int64_t * offset, int64_t * size) {
    if (!name || !offset || !size) return BIE_STATUS_INVALID_ARGUMENT;
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        const struct abi_field * f = &fields[i];
        if (strcmp(f->strct, name) != 0) continue;
        if (field ? f->field && strcmp(f->field, field) == 0 : f->field == NULL) {
            *offset = (int64_t)f->offset;
            *size = (int64_t)f->size;
            return BIE_STATUS_OK;
        }
    }
    return BIE_STATUS_INVALID_ARGUMENT;
}
