// SPDX-License-Identifier: Apache-2.0
// cpu-backend.c: the optimised CPU backend's table. Empty slots fall back to the reference.
#include "bie-impl.h"

const struct bie_backend_ops bie_cpu_backend = {
    .name = "cpu",
};
