// SPDX-License-Identifier: Apache-2.0
// ref-backend.c: the reference backend's table.
#include "ref/ref-impl.h"

const struct bie_backend_ops bie_ref_backend = {
    .name = "ref",
    BIE_BACKEND_SLOTS(bie_ref),
    .reduce = bie_ref_reduce,
    .affine_maxpool2d = bie_ref_affine_maxpool2d,
    .affine_maxpool2d_backward = bie_ref_affine_maxpool2d_backward,
};
