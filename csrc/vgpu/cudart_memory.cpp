// libcudart.so.<major>: memory (cudart.cpp has the overview): device and
// host allocations, pointer attributes, copies and sets in stream order, the
// stream-ordered allocator's pools, and inter-process sharing of memory.
#include <unistd.h>

#include <cstdint>
#include <cstring>

#include "cudart_common.h"

namespace {

using namespace cudart;

cudaError_t copy_on(cudaStream_t handle, void* dst, const void* src, size_t n) {
  STREAM_OR_RETURN(stream, handle);
  if (!vgpu::submit(stream, vgpu::Work::kCopy)) return cudaSuccess;
  return ret(vgpu::copy(dst, src, n));
}

cudaError_t set_on(cudaStream_t handle, void* dst, int value, size_t n) {
  STREAM_OR_RETURN(stream, handle);
  if (!vgpu::submit(stream, vgpu::Work::kSet)) return cudaSuccess;
  return ret(vgpu::set(dst, value, n));
}

struct Pool {
  int device;
};
Pool g_mem_pools[16] = {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}, {11}, {12}, {13}, {14}, {15}};

}  // namespace

// ---- memory

API cudaError_t cudaMalloc(void** ptr, size_t size) {
  return ret(vgpu::malloc_device(current(), size, ptr));
}
// Managed memory is device memory here (the virtual card's memory is host
// memory the CPU can touch too), charged to the current device when made:
// a card charges it as its pages reach the device, for code that uses it
// on the device (a CUDAPluggableAllocator built on it) the same bytes.
API cudaError_t cudaMallocManaged(void** ptr, size_t size, unsigned int flags) {
  if (flags != cudaMemAttachGlobal && flags != cudaMemAttachHost) return cudaErrorInvalidValue;
  return ret(vgpu::malloc_device(current(), size, ptr));
}
API cudaError_t cudaFree(void* ptr) {
  if (ptr == nullptr) return ret(vgpu::create_context(current()));
  vgpu::PointerInfo info = vgpu::pointer_info(ptr);
  if (info.kind == vgpu::PointerInfo::kDevice) vgpu::device_synchronize(info.device);  // cudaFree synchronizes
  return ret(vgpu::free_device(ptr));
}
API cudaError_t cudaMallocAsync(void** ptr, size_t size, cudaStream_t handle) {
  STREAM_OR_RETURN(stream, handle);
  return ret(vgpu::malloc_device(vgpu::stream_device(stream), size, ptr));
}
API cudaError_t cudaFreeAsync(void* ptr, cudaStream_t) {
  return ret(vgpu::free_device(ptr));
}
API cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  uint64_t f = 0, t = 0;
  Result r = vgpu::mem_info(current(), &f, &t);
  *free = f;
  *total = t;
  return ret(r);
}
API cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int) {
  return ret(vgpu::host_alloc(size, ptr));
}
API cudaError_t cudaFreeHost(void* ptr) {
  return ret(vgpu::host_free(ptr));
}
// Unified addressing: mapped host memory has the same address on the device.
API cudaError_t cudaHostGetDevicePointer(void** device, void* host, unsigned int flags) {
  if (device == nullptr || flags != 0 || vgpu::pointer_info(host).kind != vgpu::PointerInfo::kHost) {
    return cudaErrorInvalidValue;
  }
  *device = host;
  return cudaSuccess;
}
API cudaError_t cudaHostRegister(void* ptr, size_t size, unsigned int) {
  return ret(vgpu::host_register(ptr, size));
}
API cudaError_t cudaHostUnregister(void* ptr) {
  return ret(vgpu::host_unregister(ptr));
}
API cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* ptr) {
  vgpu::PointerInfo info = vgpu::pointer_info(ptr);
  std::memset(attributes, 0, sizeof(*attributes));
  attributes->device = info.device;
  if (info.kind == vgpu::PointerInfo::kDevice) {
    attributes->type = cudaMemoryTypeDevice;
    attributes->devicePointer = const_cast<void*>(ptr);
  } else if (info.kind == vgpu::PointerInfo::kHost) {
    attributes->type = cudaMemoryTypeHost;
    attributes->devicePointer = attributes->hostPointer = const_cast<void*>(ptr);
  } else {
    attributes->type = cudaMemoryTypeUnregistered;
    attributes->device = -2;
    attributes->hostPointer = const_cast<void*>(ptr);
  }
  return cudaSuccess;
}
API cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind) {
  STREAM_OR_RETURN(legacy, nullptr);
  vgpu::stream_synchronize(legacy);  // waits for the legacy stream, as in CUDA
  return ret(vgpu::copy(dst, src, count));
}
API cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind, cudaStream_t stream) {
  return copy_on(stream, dst, src, count);
}
API cudaError_t cudaMemcpyPeerAsync(void* dst, int, const void* src, int, size_t count, cudaStream_t stream) {
  return copy_on(stream, dst, src, count);
}
API cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                                  size_t height, cudaMemcpyKind, cudaStream_t handle) {
  if (width > dpitch || width > spitch) return ret(cudaErrorInvalidValue);
  STREAM_OR_RETURN(stream, handle);
  if (!vgpu::submit(stream, vgpu::Work::kCopy)) return cudaSuccess;
  for (size_t row = 0; row < height; ++row) {
    Result r = vgpu::copy(static_cast<char*>(dst) + row * dpitch, static_cast<const char*>(src) + row * spitch, width);
    if (r != Result::kOk) return ret(r);
  }
  return cudaSuccess;
}
API cudaError_t cudaMemset(void* ptr, int value, size_t count) {
  STREAM_OR_RETURN(legacy, nullptr);
  vgpu::stream_synchronize(legacy);
  return ret(vgpu::set(ptr, value, count));
}
API cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream) {
  return set_on(stream, ptr, value, count);
}

// The stream-ordered allocator's pools: its allocations are plain device
// allocations here (freed at once); pool attributes read 0.
API cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int device) {
  if (vgpu::device(device) == nullptr) return ret(cudaErrorInvalidDevice);
  *pool = reinterpret_cast<cudaMemPool_t>(&g_mem_pools[device]);
  return cudaSuccess;
}
API cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t, cudaMemPoolAttr attr, void* value) {
  if (attr == cudaMemPoolReuseFollowEventDependencies || attr == cudaMemPoolReuseAllowOpportunistic ||
      attr == cudaMemPoolReuseAllowInternalDependencies) {
    *static_cast<int*>(value) = 0;
  } else {
    *static_cast<cuuint64_t*>(value) = 0;
  }
  return cudaSuccess;
}
API cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t, cudaMemPoolAttr, void*) {
  return cudaSuccess;
}
API cudaError_t cudaMemPoolSetAccess(cudaMemPool_t, const cudaMemAccessDesc*, size_t) {
  return cudaSuccess;
}
API cudaError_t cudaMemPoolTrimTo(cudaMemPool_t, size_t) {
  return cudaSuccess;
}

// ---- inter-process sharing: memory (a handle names the exporter's
// allocation, which the importer maps without charging it again: vLLM's
// custom all-reduce shares its buffers so); events are refused

namespace {
// What a handle holds (cudaIpcMemHandle_t is 64 opaque bytes).
struct IpcMemory {
  char magic[8];
  int32_t device;
  int32_t pid;
  uint64_t base;
  uint64_t size;
};
static_assert(sizeof(IpcMemory) <= sizeof(cudaIpcMemHandle_t), "an IPC handle holds 64 bytes");
constexpr char kIpcMagic[8] = {'a', 'l', 's', 'c', 'i', 'p', 'c', '1'};
}  // namespace

API cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* ptr) {
  if (handle == nullptr) return ret(cudaErrorInvalidValue);
  vgpu::PointerInfo info = vgpu::pointer_info(ptr);
  if (info.kind != vgpu::PointerInfo::kDevice) return ret(cudaErrorInvalidValue);
  IpcMemory m{};
  std::memcpy(m.magic, kIpcMagic, sizeof(m.magic));
  m.device = info.device;
  m.pid = static_cast<int32_t>(getpid());
  m.base = reinterpret_cast<uintptr_t>(info.base);
  m.size = info.size;
  std::memset(handle, 0, sizeof(*handle));
  std::memcpy(handle, &m, sizeof(m));
  return cudaSuccess;
}
API cudaError_t cudaIpcOpenMemHandle(void** ptr, cudaIpcMemHandle_t handle, unsigned int) {
  if (ptr == nullptr) return ret(cudaErrorInvalidValue);
  IpcMemory m;
  std::memcpy(&m, &handle, sizeof(m));
  if (std::memcmp(m.magic, kIpcMagic, sizeof(m.magic)) != 0) return ret(cudaErrorInvalidValue);
  // as CUDA: a process cannot open its own handle
  if (m.pid == static_cast<int32_t>(getpid())) return ret(cudaErrorDeviceUninitialized);
  return ret(vgpu::ipc_import(m.device, m.size, ptr));
}
API cudaError_t cudaIpcCloseMemHandle(void* ptr) {
  return ret(vgpu::ipc_close(ptr));
}
API cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t*, cudaEvent_t) {
  return ret(cudaErrorNotSupported);
}
API cudaError_t cudaIpcOpenEventHandle(cudaEvent_t*, cudaIpcEventHandle_t) {
  return ret(cudaErrorNotSupported);
}
