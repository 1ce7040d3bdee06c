// SPDX-License-Identifier: Apache-2.0
// cuda-wgmma-kernels-nbit.cu: the n-bit instances of the Hopper GEMM (64-, 128- and 256-column
// tiles), compiled apart from the other groups so that a parallel build compiles them at once.
#include "cuda-wgmma-kernel.cuh"

namespace {
const wgmma_kernel kernels[] = {WGMMA_NBIT_KERNELS(64), WGMMA_NBIT_KERNELS(128), WGMMA_NBIT_KERNELS(256)};
} // namespace

const wgmma_kernel_group bie_wgmma_kernels_nbit = {kernels, (int)(sizeof kernels / sizeof kernels[0])};
