// libcudart.so.<major>: the CUDA runtime API torch calls, on the virtual GPU
// (core.h). This file: errors, devices, kernel registration and launches;
// cudart_memory.cpp: memory; cudart_streams.cpp: streams, events, graphs.
// Kernels run nothing; copies and sets really copy and set.
#include <cstdio>
#include <cstring>
#include <vector>

#include "cudart_common.h"
#include "driver_table.h"

namespace cudart {

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

cudaError_t ret(cudaError_t e) {
  if (e != cudaSuccess && e != cudaErrorNotReady) t_last_error = e;
  return e;
}

}  // namespace cudart

namespace {

using namespace cudart;

cudaError_t launch(const void* function, cudaStream_t handle) {
  STREAM_OR_RETURN(stream, handle);
  vgpu::submit(stream, vgpu::is_busy_kernel(function) ? vgpu::Work::kBusyKernel : vgpu::Work::kKernel);
  return cudaSuccess;
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

struct RuntimeError {
  cudaError_t code;
  const char* name;
  const char* text;
};

// One row per code this library returns: cudaGetErrorName / cudaGetErrorString.
#define ROW(code, text) {code, #code, text}
constexpr RuntimeError kRuntimeErrors[] = {
    ROW(cudaSuccess, "no error"),
    ROW(cudaErrorInvalidValue, "invalid argument"),
    ROW(cudaErrorMemoryAllocation, "out of memory"),
    ROW(cudaErrorInitializationError, "initialization error"),
    ROW(cudaErrorInvalidDevice, "invalid device ordinal"),
    ROW(cudaErrorInvalidResourceHandle, "invalid resource handle"),
    ROW(cudaErrorNotReady, "device not ready"),
    ROW(cudaErrorNoDevice, "no CUDA-capable device is detected"),
    ROW(cudaErrorNotSupported, "operation not supported (allocscope virtual GPU)"),
    ROW(cudaErrorStreamCaptureUnsupported, "operation not permitted when stream is capturing"),
    ROW(cudaErrorIllegalState, "the operation is not permitted in this state"),
    ROW(cudaErrorPeerAccessAlreadyEnabled, "peer access is already enabled"),
    ROW(cudaErrorInvalidDeviceFunction, "invalid device function"),
    ROW(cudaErrorUnknown, "unknown error"),
};
#undef ROW

const RuntimeError& runtime_error(cudaError_t code) {
  for (const RuntimeError& e : kRuntimeErrors)
    if (e.code == code) return e;
  return kRuntimeErrors[sizeof(kRuntimeErrors) / sizeof(kRuntimeErrors[0]) - 1];
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
  return runtime_error(error).name;
}
API const char* cudaGetErrorString(cudaError_t error) {
  return runtime_error(error).text;
}
