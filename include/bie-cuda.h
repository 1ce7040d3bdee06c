// SPDX-License-Identifier: Apache-2.0
// bie-cuda.h: CUDA-specific entry points of libbie (present in every build; where the CUDA backend
// is not available they return BIE_STATUS_UNSUPPORTED, and bie_backend_unavailable_reason says why).
// The backend is a plugin, libbie-cuda.so, that libbie opens at run time; libbie itself links no
// CUDA library.
//
// Tensors whose device_type is BIE_DEVICE_CUDA are processed by the CUDA backend, on the device
// `device_index`, asynchronously on the context's stream: a call returns once its work is queued,
// and the caller synchronises the stream (or records an event on it) before reading results on
// the host. Scales may be host scalars (read when the call is made) or device scalars (read by
// the kernels). The device workspace is planned once: it grows only when a larger shape arrives
// (bie_context_reserve(ctx, BIE_DEVICE_CUDA, bytes) sizes it ahead), so steady-state calls never
// allocate. Every CUDA error becomes BIE_STATUS_DEVICE_ERROR with the CUDA message in
// bie_context_last_error.
#pragma once

#include "bie.h"

#ifdef __cplusplus
extern "C" {
#endif

// Makes the context queue all its CUDA work on `stream` (a cudaStream_t; NULL = the default
// stream). The stream must belong to the device of the tensors passed later. UNSUPPORTED when
// the CUDA backend is not available or no GPU is present.
BIE_API enum bie_status bie_context_set_cuda_stream(bie_context_t * ctx, void * stream);

// The stream set by bie_context_set_cuda_stream (NULL: the default stream, or no CUDA state).
BIE_API void * bie_context_cuda_stream(const bie_context_t * ctx);

// Waits for the work queued on the context's stream (a convenience for C callers and tests).
BIE_API enum bie_status bie_context_cuda_synchronize(bie_context_t * ctx);

#ifdef __cplusplus
}
#endif
