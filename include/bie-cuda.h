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

// Recorded calls: a sequence of calls made again with the same tensors (the same data pointers)
// and the same arguments replays as one CUDA graph, for the host cost of one launch.
// bie_cuda_record_begin makes the context's later calls (in this thread) be recorded instead of
// run, on a stream of the context's own, until bie_cuda_record_end, which returns the recorded
// calls as a graph (out NULL: drops them). Nothing recorded has run: bie_cuda_replay queues the
// graph on the context's stream, as often as wanted. A replay reads and writes exactly the memory
// that the recorded calls named (the context's workspace included, which stays valid for the
// graph while the context lives), with the scalar arguments they had. A call that fails while
// recording returns its status, and what it queued before failing stays in the recording: drop
// such a recording (record_end with out NULL). A call that cannot be recorded (one that
// synchronises) makes record_end fail. A replay is refused (INVALID_ARGUMENT: record again) on
// another context than the recording's, or once the context has released a library plan that the
// graph may use (cuDNN's plans are kept for 64 convolution shapes a context). UNSUPPORTED where
// the context's stream is itself being captured into a CUDA graph (record or replay; the caller
// then makes its calls as usual) or where there is no CUDA backend.
typedef struct bie_cuda_graph bie_cuda_graph_t;
BIE_API enum bie_status bie_cuda_record_begin(bie_context_t * ctx);
BIE_API enum bie_status bie_cuda_record_end(bie_context_t * ctx, bie_cuda_graph_t ** out);
BIE_API enum bie_status bie_cuda_replay(bie_context_t * ctx, const bie_cuda_graph_t * graph);
// Frees a graph (NULL is accepted). The contexts it was recorded with may already be gone.
BIE_API void bie_cuda_graph_destroy(bie_cuda_graph_t * graph);

#ifdef __cplusplus
}
#endif
