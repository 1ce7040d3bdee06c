// SPDX-License-Identifier: Apache-2.0
// cuda-wgmma-kernels-b1-wide.cu: the binary instances of the Hopper GEMM with 192-column (SPLIT)
// and 256-column (ping-pong) tiles, compiled apart from the other groups so that a parallel build
// compiles them at once.
#include "cuda-wgmma-kernel.cuh"

namespace {
const wgmma_kernel kernels[] = {WGMMA_SPLIT_KERNELS(192), WGMMA_B1_KERNELS(256)};
} // namespace

const wgmma_kernel_group bie_wgmma_kernels_b1_wide = {kernels, (int)(sizeof kernels / sizeof kernels[0])};
