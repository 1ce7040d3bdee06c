// SPDX-License-Identifier: Apache-2.0
// cuda-wgmma-kernels-b1-narrow.cu: the binary instances of the Hopper GEMM with 64- and 128-column
// tiles, compiled apart from the other groups so that a parallel build compiles them at once.
#include "cuda-wgmma-kernel.cuh"

namespace {
const wgmma_kernel kernels[] = {WGMMA_B1_KERNELS(64), WGMMA_B1_KERNELS(128)};
} // namespace

const wgmma_kernel_group bie_wgmma_kernels_b1_narrow = {kernels, (int)(sizeof kernels / sizeof kernels[0])};
