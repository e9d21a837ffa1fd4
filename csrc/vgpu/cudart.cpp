// libcudart.so.<major>: the CUDA runtime API torch calls, on the virtual GPU
// (core.h). Memory, streams, events and capture follow the model; kernels run
// nothing; copies and sets really copy and set.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core.h"
#include "driver_table.h"

namespace {

using vgpu::Result;

thread_local cudaError_t t_last_error = cudaSuccess;

cudaError_t to_cuda(Result r) {
  switch (r) {
    case Result::kOk: return cudaSuccess;
    case Result::kOutOfMemory: return cudaErrorMemoryAllocation;
    case Result::kInvalidValue: return cudaErrorInvalidValue;
    case Result::kInvalidDevice: return cudaErrorInvalidDevice;
    case Result::kInvalidHandle: return cudaErrorInvalidResourceHandle;
    case Result::kNotReady: return cudaErrorNotReady;
    case Result::kNoDevice: return cudaErrorNoDevice;
    case Result::kNotSupported: return cudaErrorNotSupported;
    case Result::kCaptureUnsupported: return cudaErrorStreamCaptureUnsupported;
    case Result::kIllegalState: return cudaErrorIllegalState;
  }
  return cudaErrorUnknown;
}

// Every entry point returns through here: errors become the thread's last
// error, as in CUDA (cudaErrorNotReady is an answer, not an error).
cudaError_t ret(cudaError_t e) {
  if (e != cudaSuccess && e != cudaErrorNotReady) t_last_error = e;
  return e;
}
cudaError_t ret(Result r) {
  return ret(to_cuda(r));
}

int current() {
  return vgpu::current_device();
}

// Streams and events by handle; an unknown handle is an error.
#define STREAM_OR_RETURN(var, handle)                      \
  vgpu::Stream* var = vgpu::resolve_stream(handle);        \
  if (var == nullptr) return ret(cudaErrorInvalidResourceHandle)
#define EVENT_OR_RETURN(var, handle)                       \
  vgpu::Event* var = vgpu::resolve_event(handle);          \
  if (var == nullptr) return ret(cudaErrorInvalidResourceHandle)

cudaError_t launch(const void* function, cudaStream_t handle) {
  STREAM_OR_RETURN(stream, handle);
  vgpu::submit(stream, vgpu::is_busy_kernel(function) ? vgpu::Work::kBusyKernel : vgpu::Work::kKernel);
  return cudaSuccess;
}

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

struct CallConfiguration {
  dim3 grid, block;
  size_t shared;
  cudaStream_t stream;
};
thread_local std::vector<CallConfiguration> t_calls;

// Opaque handles that only need to be distinct and stable.
struct Handle {
  int kind;
};
Handle g_fatbin{1}, g_library{2};
Handle g_mem_pools[16];

struct UserObject {
  void* ptr;
  cudaHostFn_t destroy;
  unsigned refs;
};
std::mutex g_user_objects_mu;
// References graphs hold, released when the graph is destroyed.
std::unordered_map<cudaGraph_t, std::vector<std::pair<UserObject*, unsigned>>> g_graph_objects;

void release_user_object(UserObject* o, unsigned count) {
  {
    std::lock_guard<std::mutex> lock(g_user_objects_mu);
    o->refs -= count < o->refs ? count : o->refs;
    if (o->refs > 0) return;
  }
  o->destroy(o->ptr);
  delete o;
}

const char* error_name(cudaError_t e) {
  switch (e) {
#define NAME(x) \
  case x: return #x;
    NAME(cudaSuccess)
    NAME(cudaErrorInvalidValue)
    NAME(cudaErrorMemoryAllocation)
    NAME(cudaErrorInitializationError)
    NAME(cudaErrorInvalidDevice)
    NAME(cudaErrorInvalidResourceHandle)
    NAME(cudaErrorNotReady)
    NAME(cudaErrorNoDevice)
    NAME(cudaErrorNotSupported)
    NAME(cudaErrorStreamCaptureUnsupported)
    NAME(cudaErrorIllegalState)
    NAME(cudaErrorPeerAccessAlreadyEnabled)
    NAME(cudaErrorInvalidDeviceFunction)
    NAME(cudaErrorUnknown)
#undef NAME
    default: return "cudaErrorUnknown";
  }
}

const char* error_string(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorNotSupported: return "operation not supported (allocscope virtual GPU)";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorIllegalState: return "the operation is not permitted in this state";
    case cudaErrorPeerAccessAlreadyEnabled: return "peer access is already enabled";
    default: return "unknown error";
  }
}

void fill_properties(cudaDeviceProp* p, int device) {
  const vgpu::DeviceInfo& d = *vgpu::device(device);
  const vgpu::Preset& preset = *d.preset;
  std::memset(p, 0, sizeof(*p));
  auto attr = [device](int a) {
    int v = 0;
    vgpu::device_attribute(device, a, &v);
    return v;
  };
  std::snprintf(p->name, sizeof(p->name), "%s", preset.name);
  // A stable UUID per (preset, index): "allocscope" in its first bytes.
  std::memcpy(p->uuid.bytes, "allocscope", 10);
  p->uuid.bytes[10] = static_cast<char>(device);
  p->uuid.bytes[11] = static_cast<char>(&preset - vgpu::kPresets);
  p->totalGlobalMem = d.total;
  p->sharedMemPerBlock = attr(cudaDevAttrMaxSharedMemoryPerBlock);
  p->regsPerBlock = attr(cudaDevAttrMaxRegistersPerBlock);
  p->warpSize = 32;
  p->memPitch = 0x7fffffff;
  p->maxThreadsPerBlock = 1024;
  p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
  p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 0x7fffffff;
  p->maxGridSize[1] = p->maxGridSize[2] = 65535;
  p->totalConstMem = 64 * 1024;
  p->major = preset.major;
  p->minor = preset.minor;
  p->textureAlignment = 512;
  p->texturePitchAlignment = 32;
  p->multiProcessorCount = preset.sms;
  p->canMapHostMemory = 1;
  p->concurrentKernels = 1;
  p->ECCEnabled = attr(cudaDevAttrEccEnabled);
  p->pciBusID = vgpu::pci_bus(device);
  p->asyncEngineCount = 2;
  p->unifiedAddressing = 1;
  p->memoryBusWidth = preset.bus_width_bits;
  p->l2CacheSize = preset.l2_bytes;
  p->persistingL2CacheMaxSize = preset.l2_bytes / 2;
  p->maxThreadsPerMultiProcessor = preset.max_threads_per_sm;
  p->streamPrioritiesSupported = 1;
  p->globalL1CacheSupported = 1;
  p->localL1CacheSupported = 1;
  p->sharedMemPerMultiprocessor = static_cast<size_t>(preset.smem_per_sm);
  p->regsPerMultiprocessor = 65536;
  p->managedMemory = 1;
  p->concurrentManagedAccess = 1;
  p->computePreemptionSupported = 1;
  p->canUseHostPointerForRegisteredMem = 1;
  p->cooperativeLaunch = 1;
  p->sharedMemPerBlockOptin = static_cast<size_t>(preset.smem_per_block_optin);
  p->maxBlocksPerMultiProcessor = preset.max_blocks_per_sm;
  p->reservedSharedMemPerBlock = 1024;
  p->hostRegisterSupported = 1;
  p->memoryPoolsSupported = 1;
  p->ipcEventSupported = 1;
  p->clusterLaunch = attr(cudaDevAttrClusterLaunch);
#if CUDART_VERSION < 13000
  p->clockRate = preset.clock_khz;
  p->memoryClockRate = preset.memory_clock_khz;
#endif
}

}  // namespace

// Compiler-generated registration and launch entry points (crt/host_runtime.h).
extern "C" {
void** __cudaRegisterFatBinary(void* fat_cubin);
void __cudaRegisterFatBinaryEnd(void** handle);
void __cudaUnregisterFatBinary(void** handle);
void __cudaRegisterFunction(void** handle, const char* host_function, char* device_function, const char* device_name,
                            int thread_limit, uint3* tid, uint3* bid, dim3* block, dim3* grid, int* warp_size);
void __cudaRegisterVar(void** handle, char* host_var, char* device_address, const char* device_name, int ext,
                       size_t size, int constant, int global);
char __cudaInitModule(void** handle);
unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shared, struct CUstream_st* stream);
cudaError_t __cudaPopCallConfiguration(dim3* grid, dim3* block, size_t* shared, void* stream);
cudaError_t __cudaGetKernel(cudaKernel_t* kernel, const void* function);
cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void** args, size_t shared,
                               cudaStream_t stream);
cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 grid, dim3 block, void** args, size_t shared,
                                    cudaStream_t stream);
cudaError_t cudaProfilerStart(void);
cudaError_t cudaProfilerStop(void);
cudaError_t cudaGraphDebugDotPrint(cudaGraph_t graph, const char* path, unsigned int flags);
}

#define API extern "C" __attribute__((visibility("default")))

// ---- registration (at library load: cheap, no context)

API void** __cudaRegisterFatBinary(void*) {
  return reinterpret_cast<void**>(&g_fatbin);
}
API void __cudaRegisterFatBinaryEnd(void**) {}
API void __cudaUnregisterFatBinary(void**) {}
API void __cudaRegisterFunction(void**, const char* host_function, char*, const char* device_name, int, uint3*,
                                uint3*, dim3*, dim3*, int*) {
  vgpu::register_kernel(host_function, device_name);
}
API void __cudaRegisterVar(void**, char*, char*, const char*, int, size_t, int, int) {}
API char __cudaInitModule(void**) {
  return 1;
}

// ---- launches

API unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shared, struct CUstream_st* stream) {
  t_calls.push_back(CallConfiguration{grid, block, shared, stream});
  return 0;
}
API cudaError_t __cudaPopCallConfiguration(dim3* grid, dim3* block, size_t* shared, void* stream) {
  if (t_calls.empty()) return ret(cudaErrorInvalidConfiguration);
  CallConfiguration c = t_calls.back();
  t_calls.pop_back();
  *grid = c.grid;
  *block = c.block;
  *shared = c.shared;
  *static_cast<cudaStream_t*>(stream) = c.stream;
  return cudaSuccess;
}
API cudaError_t __cudaGetKernel(cudaKernel_t* kernel, const void* function) {
  *kernel = reinterpret_cast<cudaKernel_t>(const_cast<void*>(function));  // the host stub names the kernel
  return cudaSuccess;
}
API cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3, dim3, void**, size_t, cudaStream_t stream) {
  return launch(kernel, stream);
}
API cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3, dim3, void**, size_t, cudaStream_t stream) {
  return launch(kernel, stream);
}
API cudaError_t cudaLaunchKernel(const void* function, dim3, dim3, void**, size_t, cudaStream_t stream) {
  return launch(function, stream);
}
API cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t* config, const void* function, void**) {
  return launch(function, config->stream);
}
API cudaError_t cudaLaunchCooperativeKernel(const void* function, dim3, dim3, void**, size_t, cudaStream_t stream) {
  return launch(function, stream);
}
API cudaError_t cudaLaunchHostFunc(cudaStream_t handle, cudaHostFn_t fn, void* user_data) {
  STREAM_OR_RETURN(stream, handle);
  if (vgpu::submit(stream, vgpu::Work::kHostFunction)) fn(user_data);
  return cudaSuccess;
}
API cudaError_t cudaStreamAddCallback(cudaStream_t handle, cudaStreamCallback_t callback, void* user_data,
                                      unsigned int) {
  STREAM_OR_RETURN(stream, handle);
  if (vgpu::submit(stream, vgpu::Work::kHostFunction)) callback(handle, cudaSuccess, user_data);
  return cudaSuccess;
}
API cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, const void*) {
  std::memset(attr, 0, sizeof(*attr));
  attr->maxThreadsPerBlock = 1024;
  attr->numRegs = 32;
  attr->ptxVersion = attr->binaryVersion = 80;
  attr->preferredShmemCarveout = -1;
  return cudaSuccess;
}
API cudaError_t cudaFuncSetAttribute(const void*, cudaFuncAttribute, int) {
  return cudaSuccess;
}
API cudaError_t cudaKernelSetAttributeForDevice(cudaKernel_t, cudaFuncAttribute, int, int) {
  return cudaSuccess;
}
API cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* blocks, const void*, int block_size,
                                                                      size_t, unsigned int) {
  const vgpu::DeviceInfo* d = vgpu::device(current());
  if (d == nullptr || block_size <= 0) return ret(cudaErrorInvalidValue);
  int by_threads = d->preset->max_threads_per_sm / block_size;
  *blocks = by_threads < 1 ? 1 : (by_threads < d->preset->max_blocks_per_sm ? by_threads : d->preset->max_blocks_per_sm);
  return cudaSuccess;
}
API cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, const void* function, int block_size,
                                                             size_t shared) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(blocks, function, block_size, shared, 0);
}
API cudaError_t cudaLibraryLoadData(cudaLibrary_t* library, const void*, cudaJitOption*, void**, unsigned int,
                                    cudaLibraryOption*, void**, unsigned int) {
  *library = reinterpret_cast<cudaLibrary_t>(&g_library);
  return cudaSuccess;
}
API cudaError_t cudaLibraryGetKernel(cudaKernel_t* kernel, cudaLibrary_t library, const char*) {
  *kernel = reinterpret_cast<cudaKernel_t>(library);
  return cudaSuccess;
}
API cudaError_t cudaLibraryUnload(cudaLibrary_t) {
  return cudaSuccess;
}
API cudaError_t cudaGetSymbolAddress(void** address, const void* symbol) {
  // Kernels run nothing: a device symbol's host shadow serves as its address.
  *address = const_cast<void*>(symbol);
  return cudaSuccess;
}
API cudaError_t cudaMemcpyToSymbol(const void* symbol, const void* src, size_t count, size_t offset,
                                   cudaMemcpyKind) {
  std::memcpy(static_cast<char*>(const_cast<void*>(symbol)) + offset, src, count);
  return cudaSuccess;
}

// ---- devices

API cudaError_t cudaGetDeviceCount(int* count) {
  *count = vgpu::device_count();
  return *count == 0 ? ret(cudaErrorNoDevice) : cudaSuccess;
}
API cudaError_t cudaGetDevice(int* device) {
  if (vgpu::device_count() == 0) return ret(cudaErrorNoDevice);
  *device = current();
  return cudaSuccess;
}
API cudaError_t cudaSetDevice(int device) {
  Result r = vgpu::set_current_device(device);
  if (r == Result::kOk) r = vgpu::create_context(device);  // as CUDA 12+ does
  return ret(r);
}
API cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (vgpu::device(device) == nullptr) return ret(cudaErrorInvalidDevice);
  fill_properties(prop, device);
  return cudaSuccess;
}
API cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  return ret(vgpu::device_attribute(device, static_cast<int>(attr), value));
}
API cudaError_t cudaDeviceGetPCIBusId(char* bus_id, int len, int device) {
  if (vgpu::device(device) == nullptr) return ret(cudaErrorInvalidDevice);
  std::snprintf(bus_id, static_cast<size_t>(len), "00000000:%02X:00.0", vgpu::pci_bus(device));
  return cudaSuccess;
}
API cudaError_t cudaDeviceCanAccessPeer(int* can, int device, int peer) {
  if (vgpu::device(device) == nullptr || vgpu::device(peer) == nullptr) return ret(cudaErrorInvalidDevice);
  *can = device != peer;
  return cudaSuccess;
}
API cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int) {
  return vgpu::device(peer) == nullptr ? ret(cudaErrorInvalidDevice) : cudaSuccess;
}
API cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  if (least != nullptr) *least = 0;
  if (greatest != nullptr) *greatest = -5;
  return cudaSuccess;
}
API cudaError_t cudaDeviceSynchronize(void) {
  return ret(vgpu::device_synchronize(current()));
}
API cudaError_t cudaDriverGetVersion(int* version) {
  *version = CUDART_VERSION > 13000 ? CUDART_VERSION : 13000;
  return cudaSuccess;
}
API cudaError_t cudaRuntimeGetVersion(int* version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}
API cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** function, unsigned int, unsigned long long,
                                                 cudaDriverEntryPointQueryResult* status) {
  *function = vgpu_driver_entry_point(symbol);
  if (status != nullptr) *status = *function != nullptr ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}
API cudaError_t cudaProfilerStart(void) {
  return cudaSuccess;
}
API cudaError_t cudaProfilerStop(void) {
  return cudaSuccess;
}

// ---- errors

API cudaError_t cudaGetLastError(void) {
  cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}
API cudaError_t cudaPeekAtLastError(void) {
  return t_last_error;
}
API const char* cudaGetErrorName(cudaError_t error) {
  return error_name(error);
}
API const char* cudaGetErrorString(cudaError_t error) {
  return error_string(error);
}

// ---- memory

API cudaError_t cudaMalloc(void** ptr, size_t size) {
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
  vgpu::stream_synchronize(vgpu::resolve_stream(nullptr));  // waits for the legacy stream, as in CUDA
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
  vgpu::stream_synchronize(vgpu::resolve_stream(nullptr));
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

// ---- inter-process sharing: not modelled

API cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t*, void*) {
  return ret(cudaErrorNotSupported);
}
API cudaError_t cudaIpcOpenMemHandle(void**, cudaIpcMemHandle_t, unsigned int) {
  return ret(cudaErrorNotSupported);
}
API cudaError_t cudaIpcCloseMemHandle(void*) {
  return ret(cudaErrorNotSupported);
}
API cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t*, cudaEvent_t) {
  return ret(cudaErrorNotSupported);
}
API cudaError_t cudaIpcOpenEventHandle(cudaEvent_t*, cudaIpcEventHandle_t) {
  return ret(cudaErrorNotSupported);
}

// ---- streams

API cudaError_t cudaStreamCreateWithPriority(cudaStream_t* handle, unsigned int flags, int priority) {
  vgpu::Stream* stream = nullptr;
  Result r = vgpu::stream_create(current(), flags, priority, &stream);
  *handle = reinterpret_cast<cudaStream_t>(stream);
  return ret(r);
}
API cudaError_t cudaStreamCreateWithFlags(cudaStream_t* handle, unsigned int flags) {
  return cudaStreamCreateWithPriority(handle, flags, 0);
}
API cudaError_t cudaStreamCreate(cudaStream_t* handle) {
  return cudaStreamCreateWithPriority(handle, 0, 0);
}
API cudaError_t cudaStreamDestroy(cudaStream_t handle) {
  STREAM_OR_RETURN(stream, handle);
  return ret(vgpu::stream_destroy(stream));
}
API cudaError_t cudaStreamGetPriority(cudaStream_t handle, int* priority) {
  STREAM_OR_RETURN(stream, handle);
  *priority = vgpu::stream_priority(stream);
  return cudaSuccess;
}
API cudaError_t cudaStreamQuery(cudaStream_t handle) {
  STREAM_OR_RETURN(stream, handle);
  return ret(vgpu::stream_query(stream));
}
API cudaError_t cudaStreamSynchronize(cudaStream_t handle) {
  STREAM_OR_RETURN(stream, handle);
  return ret(vgpu::stream_synchronize(stream));
}
API cudaError_t cudaStreamWaitEvent(cudaStream_t stream_handle, cudaEvent_t event_handle, unsigned int) {
  STREAM_OR_RETURN(stream, stream_handle);
  EVENT_OR_RETURN(event, event_handle);
  return ret(vgpu::stream_wait_event(stream, event));
}

// ---- events

API cudaError_t cudaEventCreateWithFlags(cudaEvent_t* handle, unsigned int flags) {
  vgpu::Event* event = nullptr;
  Result r = vgpu::event_create(flags, &event);
  *handle = reinterpret_cast<cudaEvent_t>(event);
  return ret(r);
}
API cudaError_t cudaEventCreate(cudaEvent_t* handle) {
  return cudaEventCreateWithFlags(handle, 0);
}
API cudaError_t cudaEventDestroy(cudaEvent_t handle) {
  EVENT_OR_RETURN(event, handle);
  return ret(vgpu::event_destroy(event));
}
API cudaError_t cudaEventRecord(cudaEvent_t event_handle, cudaStream_t stream_handle) {
  EVENT_OR_RETURN(event, event_handle);
  STREAM_OR_RETURN(stream, stream_handle);
  return ret(vgpu::event_record(event, stream));
}
API cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned int) {
  return cudaEventRecord(event, stream);
}
API cudaError_t cudaEventQuery(cudaEvent_t handle) {
  EVENT_OR_RETURN(event, handle);
  return ret(vgpu::event_query(event));
}
API cudaError_t cudaEventSynchronize(cudaEvent_t handle) {
  EVENT_OR_RETURN(event, handle);
  return ret(vgpu::event_synchronize(event));
}
API cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start_handle, cudaEvent_t end_handle) {
  EVENT_OR_RETURN(start, start_handle);
  EVENT_OR_RETURN(end, end_handle);
  return ret(vgpu::event_elapsed_ms(start, end, ms));
}

// ---- capture and graphs

API cudaError_t cudaStreamBeginCapture(cudaStream_t handle, cudaStreamCaptureMode mode) {
  STREAM_OR_RETURN(stream, handle);
  return ret(vgpu::capture_begin(stream, static_cast<int>(mode), nullptr));
}
API cudaError_t cudaStreamBeginCaptureToGraph(cudaStream_t handle, cudaGraph_t graph_handle, const cudaGraphNode_t*,
                                              const cudaGraphEdgeData*, size_t, cudaStreamCaptureMode mode) {
  STREAM_OR_RETURN(stream, handle);
  vgpu::Graph* graph = vgpu::resolve_graph(graph_handle);
  if (graph == nullptr) return ret(cudaErrorInvalidValue);
  return ret(vgpu::capture_begin(stream, static_cast<int>(mode), graph));
}
API cudaError_t cudaStreamEndCapture(cudaStream_t handle, cudaGraph_t* graph) {
  STREAM_OR_RETURN(stream, handle);
  vgpu::Graph* g = nullptr;
  Result r = vgpu::capture_end(stream, &g);
  *graph = reinterpret_cast<cudaGraph_t>(g);
  return ret(r);
}
API cudaError_t cudaStreamIsCapturing(cudaStream_t handle, cudaStreamCaptureStatus* status) {
  STREAM_OR_RETURN(stream, handle);
  vgpu::CaptureStatus s;
  vgpu::capture_info(stream, &s, nullptr, nullptr);
  *status = static_cast<cudaStreamCaptureStatus>(s);
  return cudaSuccess;
}
namespace {
cudaError_t capture_info(cudaStream_t handle, cudaStreamCaptureStatus* status, unsigned long long* id,
                         cudaGraph_t* graph, const cudaGraphNode_t** dependencies,
                         const cudaGraphEdgeData** edge_data, size_t* num_dependencies) {
  STREAM_OR_RETURN(stream, handle);
  vgpu::CaptureStatus s;
  uint64_t capture_id = 0;
  vgpu::Graph* g = nullptr;
  vgpu::capture_info(stream, &s, &capture_id, &g);
  *status = static_cast<cudaStreamCaptureStatus>(s);
  if (id != nullptr) *id = capture_id;
  if (graph != nullptr) *graph = reinterpret_cast<cudaGraph_t>(g);
  if (dependencies != nullptr) *dependencies = nullptr;
  if (edge_data != nullptr) *edge_data = nullptr;
  if (num_dependencies != nullptr) *num_dependencies = 0;
  return cudaSuccess;
}
cudaError_t add_node(cudaGraphNode_t* node, cudaGraph_t graph_handle) {
  vgpu::Graph* graph = vgpu::resolve_graph(graph_handle);
  if (graph == nullptr) return ret(cudaErrorInvalidValue);
  *node = reinterpret_cast<cudaGraphNode_t>(graph);  // an opaque handle; nodes are only counted
  return cudaSuccess;
}
}  // namespace

// CUDA 13 added edge data to these; CUDA 12 has both forms (the edge-data one
// as _v2/_v3), and its header maps cudaStreamGetCaptureInfo to _v2.
#if CUDART_VERSION >= 13000
API cudaError_t cudaStreamGetCaptureInfo(cudaStream_t handle, cudaStreamCaptureStatus* status, unsigned long long* id,
                                         cudaGraph_t* graph, const cudaGraphNode_t** dependencies,
                                         const cudaGraphEdgeData** edge_data, size_t* num_dependencies) {
  return capture_info(handle, status, id, graph, dependencies, edge_data, num_dependencies);
}
API cudaError_t cudaStreamUpdateCaptureDependencies(cudaStream_t, cudaGraphNode_t*, const cudaGraphEdgeData*, size_t,
                                                    unsigned int) {
  return cudaSuccess;
}
API cudaError_t cudaGraphNodeGetDependencies(cudaGraphNode_t, cudaGraphNode_t*, cudaGraphEdgeData*, size_t* count) {
  *count = 0;
  return cudaSuccess;
}
API cudaError_t cudaGraphAddNode(cudaGraphNode_t* node, cudaGraph_t graph, const cudaGraphNode_t*,
                                 const cudaGraphEdgeData*, size_t, cudaGraphNodeParams*) {
  return add_node(node, graph);
}
#else
API cudaError_t cudaStreamGetCaptureInfo(cudaStream_t handle, cudaStreamCaptureStatus* status, unsigned long long* id,
                                         cudaGraph_t* graph, const cudaGraphNode_t** dependencies,
                                         size_t* num_dependencies) {
  return capture_info(handle, status, id, graph, dependencies, nullptr, num_dependencies);
}
API cudaError_t cudaStreamGetCaptureInfo_v3(cudaStream_t handle, cudaStreamCaptureStatus* status,
                                            unsigned long long* id, cudaGraph_t* graph,
                                            const cudaGraphNode_t** dependencies, const cudaGraphEdgeData** edge_data,
                                            size_t* num_dependencies) {
  return capture_info(handle, status, id, graph, dependencies, edge_data, num_dependencies);
}
API cudaError_t cudaStreamUpdateCaptureDependencies(cudaStream_t, cudaGraphNode_t*, size_t, unsigned int) {
  return cudaSuccess;
}
API cudaError_t cudaStreamUpdateCaptureDependencies_v2(cudaStream_t, cudaGraphNode_t*, const cudaGraphEdgeData*,
                                                       size_t, unsigned int) {
  return cudaSuccess;
}
API cudaError_t cudaGraphNodeGetDependencies(cudaGraphNode_t, cudaGraphNode_t*, size_t* count) {
  *count = 0;
  return cudaSuccess;
}
API cudaError_t cudaGraphNodeGetDependencies_v2(cudaGraphNode_t, cudaGraphNode_t*, cudaGraphEdgeData*, size_t* count) {
  *count = 0;
  return cudaSuccess;
}
API cudaError_t cudaGraphAddNode(cudaGraphNode_t* node, cudaGraph_t graph, const cudaGraphNode_t*, size_t,
                                 cudaGraphNodeParams*) {
  return add_node(node, graph);
}
API cudaError_t cudaGraphAddNode_v2(cudaGraphNode_t* node, cudaGraph_t graph, const cudaGraphNode_t*,
                                    const cudaGraphEdgeData*, size_t, cudaGraphNodeParams*) {
  return add_node(node, graph);
}
#endif
API cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  *mode = static_cast<cudaStreamCaptureMode>(vgpu::exchange_capture_mode(static_cast<int>(*mode)));
  return cudaSuccess;
}
API cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t* exec, cudaGraph_t graph_handle, unsigned long long) {
  vgpu::Graph* graph = vgpu::resolve_graph(graph_handle);
  if (graph == nullptr) return ret(cudaErrorInvalidValue);
  vgpu::GraphExec* e = nullptr;
  Result r = vgpu::graph_instantiate(graph, &e);
  *exec = reinterpret_cast<cudaGraphExec_t>(e);
  return ret(r);
}
API cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t handle) {
  STREAM_OR_RETURN(stream, handle);
  return ret(vgpu::graph_launch(reinterpret_cast<vgpu::GraphExec*>(exec), stream));
}
API cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  return ret(vgpu::graph_exec_destroy(reinterpret_cast<vgpu::GraphExec*>(exec)));
}
API cudaError_t cudaGraphDestroy(cudaGraph_t graph_handle) {
  vgpu::Graph* graph = vgpu::resolve_graph(graph_handle);
  if (graph == nullptr) return ret(cudaErrorInvalidValue);
  Result r = vgpu::graph_destroy(graph);
  if (r != Result::kOk) return ret(r);
  std::vector<std::pair<UserObject*, unsigned>> held;
  {
    std::lock_guard<std::mutex> lock(g_user_objects_mu);
    auto it = g_graph_objects.find(graph_handle);
    if (it != g_graph_objects.end()) {
      held.swap(it->second);
      g_graph_objects.erase(it);
    }
  }
  for (auto& [object, count] : held) release_user_object(object, count);
  return cudaSuccess;
}
API cudaError_t cudaGraphGetNodes(cudaGraph_t graph_handle, cudaGraphNode_t* nodes, size_t* count) {
  vgpu::Graph* graph = vgpu::resolve_graph(graph_handle);
  if (graph == nullptr) return ret(cudaErrorInvalidValue);
  return ret(vgpu::graph_nodes(graph, reinterpret_cast<void**>(nodes), count));
}
API cudaError_t cudaGraphConditionalHandleCreate(cudaGraphConditionalHandle* handle, cudaGraph_t, unsigned int,
                                                 unsigned int) {
  static std::atomic<unsigned long long> next{1};
  *handle = next++;
  return cudaSuccess;
}
API cudaError_t cudaGraphDebugDotPrint(cudaGraph_t, const char* path, unsigned int) {
  FILE* f = std::fopen(path, "w");
  if (f == nullptr) return ret(cudaErrorInvalidValue);
  std::fputs("digraph allocscope_virtual_gpu {}\n", f);
  std::fclose(f);
  return cudaSuccess;
}
API cudaError_t cudaDeviceGetGraphMemAttribute(int, cudaGraphMemAttributeType, void* value) {
  *static_cast<cuuint64_t*>(value) = 0;
  return cudaSuccess;
}
API cudaError_t cudaDeviceSetGraphMemAttribute(int, cudaGraphMemAttributeType, void*) {
  return cudaSuccess;
}
// User objects keep what a graph needs alive: destroyed when released for good.
API cudaError_t cudaUserObjectCreate(cudaUserObject_t* object, void* ptr, cudaHostFn_t destroy, unsigned int refs,
                                     unsigned int) {
  *object = reinterpret_cast<cudaUserObject_t>(new UserObject{ptr, destroy, refs});
  return cudaSuccess;
}
API cudaError_t cudaUserObjectRelease(cudaUserObject_t object, unsigned int count) {
  release_user_object(reinterpret_cast<UserObject*>(object), count);
  return cudaSuccess;
}
API cudaError_t cudaGraphRetainUserObject(cudaGraph_t graph, cudaUserObject_t object, unsigned int count,
                                          unsigned int flags) {
  auto* o = reinterpret_cast<UserObject*>(object);
  std::lock_guard<std::mutex> lock(g_user_objects_mu);
  if ((flags & cudaGraphUserObjectMove) == 0) o->refs += count;  // with Move, the caller's references move
  g_graph_objects[graph].emplace_back(o, count);
  return cudaSuccess;
}
