// What the runtime stand-in's files share (cudart*.cpp, libcudart.so.<major>):
// errors become the thread's last error on their way out, handles become the
// model's objects on their way in.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "core.h"

#define API extern "C" __attribute__((visibility("default")))

namespace cudart {

using vgpu::Result;

cudaError_t to_cuda(Result r);
// Every entry point returns through here: errors become the thread's last
// error, as in CUDA (cudaErrorNotReady is an answer, not an error).
cudaError_t ret(cudaError_t e);
inline cudaError_t ret(Result r) {
  return ret(to_cuda(r));
}

inline int current() {
  return vgpu::current_device();
}

}  // namespace cudart

// Streams and events by handle; an unknown handle is an error.
#define STREAM_OR_RETURN(var, handle)                      \
  vgpu::Stream* var = vgpu::resolve_stream(handle);        \
  if (var == nullptr) return cudart::ret(cudaErrorInvalidResourceHandle)
#define EVENT_OR_RETURN(var, handle)                       \
  vgpu::Event* var = vgpu::resolve_event(handle);          \
  if (var == nullptr) return cudart::ret(cudaErrorInvalidResourceHandle)
