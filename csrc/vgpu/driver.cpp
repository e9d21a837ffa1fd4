// libcuda.so.1: the driver API torch reaches (c10's expandable segments
// through cudaGetDriverEntryPointByVersion, NVRTC kernels through
// libcaffe2_nvrtc), on the virtual GPU (core.h).
#include <cuda.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "core.h"
#include "cubin.h"
#include "driver_table.h"

namespace {

using vgpu::Result;

CUresult to_cu(Result r) {
  switch (r) {
    case Result::kOk: return CUDA_SUCCESS;
    case Result::kOutOfMemory: return CUDA_ERROR_OUT_OF_MEMORY;
    case Result::kInvalidValue: return CUDA_ERROR_INVALID_VALUE;
    case Result::kInvalidDevice: return CUDA_ERROR_INVALID_DEVICE;
    case Result::kInvalidHandle: return CUDA_ERROR_INVALID_HANDLE;
    case Result::kNotReady: return CUDA_ERROR_NOT_READY;
    case Result::kNoDevice: return CUDA_ERROR_NO_DEVICE;
    case Result::kNotSupported: return CUDA_ERROR_NOT_SUPPORTED;
    case Result::kCaptureUnsupported: return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    case Result::kIllegalState: return CUDA_ERROR_ILLEGAL_STATE;
  }
  return CUDA_ERROR_UNKNOWN;
}

struct DriverError {
  CUresult code;
  const char* name;
  const char* text;
};

// One row per code this library returns (to_cu and the entry points): the
// name and the message of cuGetErrorName / cuGetErrorString.
constexpr DriverError kDriverErrors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported (allocscope virtual GPU)"},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
     "operation not permitted when stream is capturing"},
    {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation is not permitted in this state"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_FILE_NOT_FOUND, "CUDA_ERROR_FILE_NOT_FOUND", "file not found"},
    {CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

const DriverError& driver_error(CUresult code) {
  for (const DriverError& e : kDriverErrors)
    if (e.code == code) return e;
  return kDriverErrors[sizeof(kDriverErrors) / sizeof(kDriverErrors[0]) - 1];
}

// One context per device (its primary context); a CUcontext points at one.
struct Context {
  int device;
};
Context g_contexts[16] = {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}, {11}, {12}, {13}, {14}, {15}};
Context g_link_state{0};
char g_cubin[16];

// A loaded module's kernels, with what each asks of the card (cubin.h).
// A module whose image is not a cubin (PTX, a fatbin, what cuLinkComplete
// hands back) has one kernel that answers every name with the defaults.
struct Function {
  vgpu::KernelResources resources;
  int max_dynamic_shared;  // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
};
struct Module {
  std::vector<Function> functions;
  bool described;
};

// A block's dynamic shared memory without opting in, as on every card:
// 48 KiB whatever the kernel's .nv.shared section holds (a Triton kernel
// of 48 KiB launches on an H100 with its 1 KiB section: vLLM's fused MoE
// kernel, whose default configuration is that size). Static and dynamic
// together are held to the card's opt-in limit at launch.
constexpr int kDefaultDynamicShared = 48 * 1024;

CUresult load_module(CUmodule* out, const void* image) {
  std::vector<vgpu::KernelResources> kernels;
  auto* module = new Module{{}, vgpu::read_cubin(image, &kernels)};
  if (!module->described) kernels.assign(1, vgpu::KernelResources{});
  for (vgpu::KernelResources& k : kernels) module->functions.push_back(Function{std::move(k), kDefaultDynamicShared});
  *out = reinterpret_cast<CUmodule>(module);
  return CUDA_SUCCESS;
}

Function* function_of(CUfunction f) {
  return reinterpret_cast<Function*>(f);
}

const vgpu::Preset* current_preset() {
  const vgpu::DeviceInfo* d = vgpu::device(vgpu::current_device());
  return d == nullptr ? nullptr : d->preset;
}

// Blocks of `threads` threads and `dynamic_shared` bytes one SM holds at
// once: the least of what threads, blocks, registers and shared memory allow
// (the occupancy calculator's rule; 1 KiB of shared memory per block is the
// system's from sm_80 on).
int blocks_per_sm(const vgpu::Preset& p, const vgpu::KernelResources& k, int threads, size_t dynamic_shared) {
  int warps = (threads + 31) / 32;
  int blocks = p.max_blocks_per_sm;
  int by_threads = p.max_threads_per_sm / (warps * 32);
  if (by_threads < blocks) blocks = by_threads;
  if (k.registers > 0) {
    int per_warp = (k.registers * 32 + 255) / 256 * 256;
    int by_registers = 65536 / (per_warp * warps);
    if (by_registers < blocks) blocks = by_registers;
  }
  size_t shared = static_cast<size_t>(k.static_shared) + dynamic_shared;
  if (shared > 0) {
    size_t per_block = shared + (p.major >= 8 ? 1024 : 0);
    int by_shared = static_cast<int>(static_cast<size_t>(p.smem_per_sm) / per_block);
    if (by_shared < blocks) blocks = by_shared;
  }
  return blocks < 0 ? 0 : blocks;
}

CUcontext context_of(int device) {
  return reinterpret_cast<CUcontext>(&g_contexts[device]);
}

// A launch the card would refuse is refused (Triton and NVRTC callers see
// the card's error); one it accepts is a kernel on its stream.
CUresult launch(CUfunction f, unsigned block_x, unsigned block_y, unsigned block_z, unsigned shared,
                CUstream handle) {
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  const Function& function = *function_of(f);
  if (static_cast<int>(shared) > function.max_dynamic_shared) return CUDA_ERROR_INVALID_VALUE;
  const vgpu::Preset* p = current_preset();
  if (p != nullptr && static_cast<int>(shared) + function.resources.static_shared > p->smem_per_block_optin)
    return CUDA_ERROR_INVALID_VALUE;
  uint64_t threads = static_cast<uint64_t>(block_x) * block_y * block_z;
  if (threads == 0) return CUDA_ERROR_INVALID_VALUE;
  if (threads > static_cast<uint64_t>(vgpu::max_threads_per_block(function.resources)))
    return CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
  vgpu::Stream* stream = vgpu::resolve_stream(handle);
  if (stream == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  vgpu::submit(stream, vgpu::Work::kKernel);
  return CUDA_SUCCESS;
}

void* ptr(CUdeviceptr p) {
  return reinterpret_cast<void*>(static_cast<uintptr_t>(p));
}

}  // namespace

#define API extern "C" __attribute__((visibility("default")))

// ---- initialization, devices, contexts

API CUresult cuInit(unsigned int) {
  return vgpu::device_count() > 0 ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}
// NVIDIA's private tables by UUID. NVRTC opens libcuda.so.1 (this library,
// once loaded) and calls this without checking that it exists: absent, every
// NVRTC compile (torch's jiterator kernels) jumped to address 0. No table is
// offered: NVRTC then compiles as without a driver.
API CUresult cuGetExportTable(const void** table, const CUuuid*) {
  if (table != nullptr) *table = nullptr;
  return CUDA_ERROR_NOT_SUPPORTED;
}
API CUresult cuDriverGetVersion(int* version) {
  *version = CUDA_VERSION > 13000 ? CUDA_VERSION : 13000;
  return CUDA_SUCCESS;
}
API CUresult cuDeviceGetCount(int* count) {
  *count = vgpu::device_count();
  return CUDA_SUCCESS;
}
API CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  if (vgpu::device(ordinal) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}
API CUresult cuDeviceGetAttribute(int* value, CUdevice_attribute attribute, CUdevice device) {
  return to_cu(vgpu::device_attribute(device, static_cast<int>(attribute), value));
}
API CUresult cuDeviceGetName(char* name, int len, CUdevice device) {
  const vgpu::DeviceInfo* d = vgpu::device(device);
  if (d == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(name, static_cast<size_t>(len), "%s", d->preset->name);
  return CUDA_SUCCESS;
}
API CUresult cuDeviceTotalMem(size_t* bytes, CUdevice device) {
  const vgpu::DeviceInfo* d = vgpu::device(device);
  if (d == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = d->total;
  return CUDA_SUCCESS;
}
API CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice device) {
  const vgpu::DeviceInfo* d = vgpu::device(device);
  if (d == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  std::memset(uuid->bytes, 0, sizeof(uuid->bytes));
  std::memcpy(uuid->bytes, "allocscope", 10);  // as cudaGetDeviceProperties reports it
  uuid->bytes[10] = static_cast<char>(device);
  uuid->bytes[11] = static_cast<char>(d->preset - vgpu::kPresets);
  return CUDA_SUCCESS;
}
API CUresult cuDevicePrimaryCtxRetain(CUcontext* context, CUdevice device) {
  CUresult r = to_cu(vgpu::create_context(device));
  if (r == CUDA_SUCCESS) *context = context_of(device);
  return r;
}
API CUresult cuDevicePrimaryCtxGetState(CUdevice device, unsigned int* flags, int* active) {
  if (vgpu::device(device) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  *flags = 0;
  *active = vgpu::has_context(device) ? 1 : 0;  // asking creates none (torch relies on it)
  return CUDA_SUCCESS;
}
// The context a stream belongs to: its device's primary context (the only
// kind there is here). A CUDA runtime asks it before it launches into a
// stream (CuTe DSL's static runtime).
API CUresult cuStreamGetCtx(CUstream handle, CUcontext* context) {
  if (context == nullptr) return CUDA_ERROR_INVALID_VALUE;
  vgpu::Stream* stream = vgpu::resolve_stream(handle);
  if (stream == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  int device = vgpu::stream_device(stream);
  vgpu::create_context(device);
  *context = context_of(device);
  return CUDA_SUCCESS;
}
// The current context is the current device's (torch warns when there is
// none, and its cuBLAS handles look for one).
API CUresult cuCtxGetCurrent(CUcontext* context) {
  int device = vgpu::current_device();
  if (vgpu::device(device) == nullptr) {
    *context = nullptr;
    return CUDA_SUCCESS;
  }
  vgpu::create_context(device);
  *context = context_of(device);
  return CUDA_SUCCESS;
}
API CUresult cuCtxSetCurrent(CUcontext context) {
  if (context == nullptr) return CUDA_SUCCESS;
  int device = reinterpret_cast<Context*>(context)->device;
  Result r = vgpu::set_current_device(device);
  if (r == Result::kOk) r = vgpu::create_context(device);
  return to_cu(r);
}
API CUresult cuCtxPushCurrent(CUcontext context) {
  return cuCtxSetCurrent(context);
}
API CUresult cuCtxPopCurrent(CUcontext* context) {
  return cuCtxGetCurrent(context);
}
API CUresult cuCtxGetDevice(CUdevice* device) {
  *device = vgpu::current_device();
  return CUDA_SUCCESS;
}
API CUresult cuCtxSynchronize(void) {
  return to_cu(vgpu::device_synchronize(vgpu::current_device()));
}
API CUresult cuGetErrorString(CUresult error, const char** text) {
  *text = driver_error(error).text;
  return CUDA_SUCCESS;
}
API CUresult cuGetErrorName(CUresult error, const char** text) {
  *text = driver_error(error).name;
  return CUDA_SUCCESS;
}

// ---- memory: virtual memory management (c10's expandable segments)

API CUresult cuMemGetInfo(size_t* free, size_t* total) {
  uint64_t f = 0, t = 0;
  CUresult r = to_cu(vgpu::mem_info(vgpu::current_device(), &f, &t));
  *free = f;
  *total = t;
  return r;
}
API CUresult cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp*,
                                           CUmemAllocationGranularity_flags) {
  *granularity = vgpu::kGranularity;
  return CUDA_SUCCESS;
}
API CUresult cuMemAddressReserve(CUdeviceptr* out, size_t size, size_t alignment, CUdeviceptr, unsigned long long) {
  void* p = nullptr;
  CUresult r = to_cu(vgpu::va_reserve(size, alignment, &p));
  *out = reinterpret_cast<CUdeviceptr>(p);
  return r;
}
API CUresult cuMemAddressFree(CUdeviceptr p, size_t size) {
  return to_cu(vgpu::va_free(ptr(p), size));
}
API CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                         unsigned long long) {
  if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_NOT_SUPPORTED;
  if ((prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_FABRIC) != 0) return CUDA_ERROR_NOT_SUPPORTED;
  uint64_t h = 0;
  CUresult r = to_cu(vgpu::phys_create(prop->location.id, size, &h));
  *handle = h;
  return r;
}
API CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  return to_cu(vgpu::phys_release(handle));
}
API CUresult cuMemMap(CUdeviceptr p, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                      unsigned long long) {
  if (offset != 0) return CUDA_ERROR_INVALID_VALUE;
  return to_cu(vgpu::phys_map(ptr(p), size, handle));
}
API CUresult cuMemUnmap(CUdeviceptr p, size_t size) {
  return to_cu(vgpu::phys_unmap(ptr(p), size));
}
API CUresult cuMemSetAccess(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) {
  return CUDA_SUCCESS;
}
API CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop, CUmemGenericAllocationHandle handle) {
  int device = 0;
  size_t size = 0;
  CUresult r = to_cu(vgpu::phys_size(handle, &device, &size));
  if (r != CUDA_SUCCESS) return r;
  std::memset(prop, 0, sizeof(*prop));
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop->location.id = device;
  prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return CUDA_SUCCESS;
}
API CUresult cuMemGetAddressRange(CUdeviceptr* base, size_t* size, CUdeviceptr p) {
  vgpu::PointerInfo info = vgpu::pointer_info(ptr(p));
  if (info.kind != vgpu::PointerInfo::kDevice) return CUDA_ERROR_NOT_FOUND;
  if (base != nullptr) *base = reinterpret_cast<CUdeviceptr>(info.base);
  if (size != nullptr) *size = info.size;
  return CUDA_SUCCESS;
}
// Sharing between processes is not modelled.
API CUresult cuMemExportToShareableHandle(void*, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
                                          unsigned long long) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
API CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle*, void*, CUmemAllocationHandleType) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
API CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle*, void*) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
API CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t n, CUstream handle) {
  vgpu::Stream* stream = vgpu::resolve_stream(handle);
  if (stream == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (!vgpu::submit(stream, vgpu::Work::kSet)) return CUDA_SUCCESS;
  if (value == 0) return to_cu(vgpu::set(ptr(dst), 0, n * 4));
  if (!vgpu::accessible(ptr(dst), n * 4)) return CUDA_ERROR_INVALID_VALUE;
  auto* words = static_cast<unsigned int*>(ptr(dst));
  for (size_t i = 0; i < n; ++i) words[i] = value;
  return CUDA_SUCCESS;
}
API CUresult cuStreamWriteValue32(CUstream handle, CUdeviceptr addr, cuuint32_t value, unsigned int) {
  vgpu::Stream* stream = vgpu::resolve_stream(handle);
  if (stream == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (!vgpu::submit(stream, vgpu::Work::kSet)) return CUDA_SUCCESS;
  if (!vgpu::accessible(ptr(addr), sizeof(value))) return CUDA_ERROR_INVALID_VALUE;
  std::memcpy(ptr(addr), &value, sizeof(value));
  return CUDA_SUCCESS;
}
API CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr p) {
  vgpu::PointerInfo info = vgpu::pointer_info(ptr(p));
  if (info.kind == vgpu::PointerInfo::kUnregistered) return CUDA_ERROR_INVALID_VALUE;
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      *static_cast<CUcontext*>(data) = context_of(info.device < 0 ? 0 : info.device);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *static_cast<CUmemorytype*>(data) =
          info.kind == vgpu::PointerInfo::kDevice ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      *static_cast<CUdeviceptr*>(data) = p;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      *static_cast<int*>(data) = info.device;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      *static_cast<CUdeviceptr*>(data) = reinterpret_cast<CUdeviceptr>(info.base);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      *static_cast<size_t*>(data) = info.size;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_NOT_SUPPORTED;
  }
}

// ---- modules and launches (Triton's and NVRTC's kernels): nothing runs, but
// what a kernel asks of the card is read from its cubin, and answered

API CUresult cuModuleLoad(CUmodule* module, const char* path) {
  std::vector<char> image;
  if (FILE* f = std::fopen(path, "rb")) {
    char chunk[65536];
    for (size_t n; (n = std::fread(chunk, 1, sizeof(chunk), f)) > 0;) image.insert(image.end(), chunk, chunk + n);
    std::fclose(f);
  } else {
    return CUDA_ERROR_FILE_NOT_FOUND;
  }
  image.push_back(0);  // a PTX file is text
  return load_module(module, image.data());
}
API CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  return load_module(module, image);
}
API CUresult cuModuleLoadDataEx(CUmodule* module, const void* image, unsigned int, CUjit_option*, void**) {
  return load_module(module, image);
}
API CUresult cuModuleUnload(CUmodule module) {
  delete reinterpret_cast<Module*>(module);
  return CUDA_SUCCESS;
}
API CUresult cuModuleGetFunction(CUfunction* function, CUmodule handle, const char* name) {
  auto* module = reinterpret_cast<Module*>(handle);
  if (module == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  for (Function& f : module->functions) {
    if (!module->described || f.resources.name == name) {
      *function = reinterpret_cast<CUfunction>(&f);
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_NOT_FOUND;
}
API CUresult cuLinkCreate(unsigned int, CUjit_option*, void**, CUlinkState* state) {
  *state = reinterpret_cast<CUlinkState>(&g_link_state);
  return CUDA_SUCCESS;
}
API CUresult cuLinkAddData(CUlinkState, CUjitInputType, void*, size_t, const char*, unsigned int, CUjit_option*,
                           void**) {
  return CUDA_SUCCESS;
}
API CUresult cuLinkComplete(CUlinkState, void** cubin, size_t* size) {
  *cubin = g_cubin;
  *size = sizeof(g_cubin);
  return CUDA_SUCCESS;
}
API CUresult cuFuncGetAttribute(int* value, CUfunction_attribute attribute, CUfunction f) {
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  const Function& function = *function_of(f);
  const vgpu::KernelResources& k = function.resources;
  const vgpu::Preset* p = current_preset();
  switch (attribute) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *value = vgpu::max_threads_per_block(k); break;
    case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: *value = k.static_shared; break;
    case CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES: *value = 0; break;
    case CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: *value = k.local_bytes; break;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: *value = k.registers; break;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION:
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION: *value = p == nullptr ? 0 : p->major * 10 + p->minor; break;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *value = function.max_dynamic_shared; break;
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH:
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT:
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH: *value = 0; break;
    default: *value = 0; break;
  }
  return CUDA_SUCCESS;
}
API CUresult cuFuncSetAttribute(CUfunction f, CUfunction_attribute attribute, int value) {
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  // An attribute newer than this driver (CUDA 13.0's headers): refused, as
  // that driver refuses it. Triton tries its "oversized shared memory" mode
  // (17) first and, refused, opts in with MAX_DYNAMIC_SHARED_SIZE_BYTES.
  if (attribute < 0 || attribute >= CU_FUNC_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
  Function& function = *function_of(f);
  if (attribute == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) {
    const vgpu::Preset* p = current_preset();
    if (p == nullptr || value < 0 || value + function.resources.static_shared > p->smem_per_block_optin)
      return CUDA_ERROR_INVALID_VALUE;
    function.max_dynamic_shared = value;
  }
  return CUDA_SUCCESS;
}
API CUresult cuFuncSetCacheConfig(CUfunction, CUfunc_cache) {
  return CUDA_SUCCESS;
}
API CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, CUfunction f, int block_size,
                                                         size_t dynamic_shared) {
  const vgpu::Preset* p = current_preset();
  if (p == nullptr || f == nullptr || block_size <= 0) return CUDA_ERROR_INVALID_VALUE;
  *blocks = blocks_per_sm(*p, function_of(f)->resources, block_size, dynamic_shared);
  return CUDA_SUCCESS;
}
// Clusters (sm_90 on) resident at once: the SMs' blocks grouped by cluster
// size. A card also keeps a cluster inside one GPC, which can leave a few
// SMs out; that is not modelled (Triton asks only whether any fit).
API CUresult cuOccupancyMaxActiveClusters(int* clusters, CUfunction f, const CUlaunchConfig* config) {
  const vgpu::Preset* p = current_preset();
  if (p == nullptr || f == nullptr || config == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (p->major < 9) return CUDA_ERROR_NOT_SUPPORTED;
  unsigned cluster = 1;
  for (unsigned i = 0; i < config->numAttrs; ++i) {
    const CUlaunchAttribute& a = config->attrs[i];
    if (a.id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
      cluster = a.value.clusterDim.x * a.value.clusterDim.y * a.value.clusterDim.z;
  }
  if (cluster == 0) return CUDA_ERROR_INVALID_VALUE;
  int threads = static_cast<int>(config->blockDimX * config->blockDimY * config->blockDimZ);
  int per_sm = blocks_per_sm(*p, function_of(f)->resources, threads, config->sharedMemBytes);
  *clusters = static_cast<int>(static_cast<unsigned>(p->sms * per_sm) / cluster);
  return CUDA_SUCCESS;
}
API CUresult cuLaunchKernel(CUfunction f, unsigned int, unsigned int, unsigned int, unsigned int block_x,
                            unsigned int block_y, unsigned int block_z, unsigned int shared, CUstream stream, void**,
                            void**) {
  return launch(f, block_x, block_y, block_z, shared, stream);
}
API CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int, unsigned int, unsigned int, unsigned int block_x,
                                       unsigned int block_y, unsigned int block_z, unsigned int shared,
                                       CUstream stream, void**) {
  return launch(f, block_x, block_y, block_z, shared, stream);
}
API CUresult cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void**, void**) {
  if (config == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return launch(f, config->blockDimX, config->blockDimY, config->blockDimZ, config->sharedMemBytes,
                config->hStream);
}
API CUresult cuTensorMapEncodeTiled(CUtensorMap* map, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                    const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                    CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill) {
  std::memset(map, 0, sizeof(*map));
  return CUDA_SUCCESS;
}
API CUresult cuTensorMapEncodeIm2col(CUtensorMap* map, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                     const cuuint64_t*, const int*, const int*, cuuint32_t, cuuint32_t,
                                     const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                     CUtensorMapL2promotion, CUtensorMapFloatOOBfill) {
  std::memset(map, 0, sizeof(*map));
  return CUDA_SUCCESS;
}

// ---- the context's limits (Triton sets printf's FIFO size): kept, and
// given back; the memory a larger stack or heap would take is not modelled

namespace {
std::mutex g_limits_lock;
size_t g_limits[] = {
    1024,         // CU_LIMIT_STACK_SIZE
    1048576,      // CU_LIMIT_PRINTF_FIFO_SIZE
    8388608,      // CU_LIMIT_MALLOC_HEAP_SIZE
    2,            // CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH
    2048,         // CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT
    32,           // CU_LIMIT_MAX_L2_FETCH_GRANULARITY
    0,            // CU_LIMIT_PERSISTING_L2_CACHE_SIZE
};
constexpr size_t kLimitCount = sizeof(g_limits) / sizeof(g_limits[0]);
}  // namespace

API CUresult cuCtxGetLimit(size_t* value, CUlimit limit) {
  if (static_cast<size_t>(limit) >= kLimitCount) return CUDA_ERROR_NOT_SUPPORTED;
  std::lock_guard<std::mutex> hold(g_limits_lock);
  *value = g_limits[limit];
  return CUDA_SUCCESS;
}
API CUresult cuCtxSetLimit(CUlimit limit, size_t value) {
  if (static_cast<size_t>(limit) >= kLimitCount) return CUDA_ERROR_NOT_SUPPORTED;
  std::lock_guard<std::mutex> hold(g_limits_lock);
  g_limits[limit] = value;
  return CUDA_SUCCESS;
}

// ---- features a virtual GPU does not have: multicast, green contexts, logs

API CUresult cuMulticastCreate(CUmemGenericAllocationHandle*, const CUmulticastObjectProp*) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
API CUresult cuMulticastAddDevice(CUmemGenericAllocationHandle, CUdevice) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
API CUresult cuMulticastBindMem(CUmemGenericAllocationHandle, size_t, CUmemGenericAllocationHandle, size_t, size_t,
                                unsigned long long) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
API CUresult cuMulticastUnbind(CUmemGenericAllocationHandle, CUdevice, size_t, size_t) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
API CUresult cuGreenCtxCreate(CUgreenCtx*, CUdevResourceDesc, CUdevice, unsigned int) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
API CUresult cuGreenCtxDestroy(CUgreenCtx) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
API CUresult cuGreenCtxStreamCreate(CUstream*, CUgreenCtx, unsigned int, int) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
API CUresult cuCtxFromGreenCtx(CUcontext*, CUgreenCtx) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
API CUresult cuDevResourceGenerateDesc(CUdevResourceDesc*, CUdevResource*, unsigned int) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
API CUresult cuDevSmResourceSplitByCount(CUdevResource*, unsigned int*, const CUdevResource*, CUdevResource*,
                                         unsigned int, unsigned int) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
API CUresult cuDeviceGetDevResource(CUdevice, CUdevResource*, CUdevResourceType) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
#if CUDA_VERSION >= 12090  // the driver's log callbacks came with CUDA 12.9
API CUresult cuLogsRegisterCallback(CUlogsCallback, void*, CUlogsCallbackHandle*) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
API CUresult cuLogsUnregisterCallback(CUlogsCallbackHandle) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
#define LOGS_ENTRIES ENTRY(cuLogsRegisterCallback), ENTRY(cuLogsUnregisterCallback),
#else
#define LOGS_ENTRIES
#endif

// ---- the entry points handed out by cudaGetDriverEntryPointByVersion

namespace {

struct Entry {
  const char* name;
  void* function;
};

// ENTRY(cuMemGetAddressRange): the name as asked ("cuMemGetAddressRange"),
// the function cuda.h maps it to (cuMemGetAddressRange_v2).
#define ENTRY(name) {#name, reinterpret_cast<void*>(&name)}
const Entry kEntries[] = {
    ENTRY(cuInit), ENTRY(cuDriverGetVersion), ENTRY(cuDeviceGetCount), ENTRY(cuDeviceGet),
    ENTRY(cuDeviceGetAttribute), ENTRY(cuDeviceGetName), ENTRY(cuDeviceTotalMem), ENTRY(cuDeviceGetUuid),
    ENTRY(cuDevicePrimaryCtxRetain), ENTRY(cuDevicePrimaryCtxGetState), ENTRY(cuCtxGetCurrent),
    ENTRY(cuCtxSetCurrent), ENTRY(cuCtxPushCurrent), ENTRY(cuCtxPopCurrent), ENTRY(cuCtxGetDevice),
    ENTRY(cuCtxSynchronize), ENTRY(cuGetErrorString), ENTRY(cuGetErrorName), ENTRY(cuMemGetInfo),
    ENTRY(cuMemGetAllocationGranularity), ENTRY(cuMemAddressReserve), ENTRY(cuMemAddressFree), ENTRY(cuMemCreate),
    ENTRY(cuMemRelease), ENTRY(cuMemMap), ENTRY(cuMemUnmap), ENTRY(cuMemSetAccess),
    ENTRY(cuMemGetAllocationPropertiesFromHandle), ENTRY(cuMemGetAddressRange), ENTRY(cuMemExportToShareableHandle),
    ENTRY(cuMemImportFromShareableHandle), ENTRY(cuMemRetainAllocationHandle), ENTRY(cuMemsetD32Async),
    ENTRY(cuStreamWriteValue32), ENTRY(cuPointerGetAttribute), ENTRY(cuModuleLoad), ENTRY(cuModuleLoadData),
    ENTRY(cuModuleLoadDataEx), ENTRY(cuModuleUnload), ENTRY(cuModuleGetFunction), ENTRY(cuLinkCreate),
    ENTRY(cuLinkAddData), ENTRY(cuLinkComplete), ENTRY(cuFuncGetAttribute), ENTRY(cuFuncSetAttribute),
    ENTRY(cuFuncSetCacheConfig), ENTRY(cuOccupancyMaxActiveBlocksPerMultiprocessor), ENTRY(cuLaunchKernel),
    ENTRY(cuLaunchCooperativeKernel), ENTRY(cuLaunchKernelEx), ENTRY(cuOccupancyMaxActiveClusters),
    ENTRY(cuTensorMapEncodeTiled), ENTRY(cuTensorMapEncodeIm2col), ENTRY(cuCtxGetLimit), ENTRY(cuCtxSetLimit), ENTRY(cuMulticastCreate),
    ENTRY(cuMulticastAddDevice), ENTRY(cuMulticastBindMem), ENTRY(cuMulticastUnbind), ENTRY(cuGreenCtxCreate),
    ENTRY(cuGreenCtxDestroy), ENTRY(cuGreenCtxStreamCreate), ENTRY(cuCtxFromGreenCtx),
    ENTRY(cuDevResourceGenerateDesc), ENTRY(cuDevSmResourceSplitByCount), ENTRY(cuDeviceGetDevResource),
    // itself: a CUDA runtime asks for it first (cuGetProcAddress gives the
    // CUDA 11 form where that is asked) and takes a driver without it for
    // one too old to use (cudaErrorCallRequiresNewerDriver)
    ENTRY(cuGetProcAddress), ENTRY(cuStreamGetCtx),
    LOGS_ENTRIES
};
#undef ENTRY

}  // namespace

void* vgpu_driver_entry_point(const char* symbol) {
  for (const Entry& e : kEntries) {
    if (std::strcmp(e.name, symbol) == 0) return e.function;
  }
  // What a program asked of the driver that the stand-in lacks, where the
  // user wants to know (ALLOCSCOPE_VGPU_TRACE_MISSING=1: docs/vgpu.md).
  static const bool trace = std::getenv("ALLOCSCOPE_VGPU_TRACE_MISSING") != nullptr;
  if (trace) std::fprintf(stderr, "allocscope virtual GPU: no driver entry point %s\n", symbol);
  return nullptr;
}

// The CUDA 11 form, without the status.
extern "C" __attribute__((visibility("default"))) CUresult vgpu_cuGetProcAddress_v1(
    const char* symbol, void** pfn, int version, cuuint64_t flags) __asm__("cuGetProcAddress");

// The same table for code that asks the driver itself (cuda-python's
// bindings, as vLLM loads them; cuda.h names this cuGetProcAddress_v2). As
// the driver does, an unknown symbol is CUDA_SUCCESS with a null pointer.
API CUresult cuGetProcAddress(const char* symbol, void** pfn, int version, cuuint64_t,
                              CUdriverProcAddressQueryResult* status) {
  if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pfn = vgpu_driver_entry_point(symbol);
  // Asked for itself as of CUDA 11 (a CUDA runtime asks at 11.3, then 12.0),
  // the caller passes four arguments: the form that writes no status.
  if (version < 12000 && std::strcmp(symbol, "cuGetProcAddress") == 0) {
    *pfn = reinterpret_cast<void*>(&vgpu_cuGetProcAddress_v1);
  }
  if (status != nullptr) *status = *pfn != nullptr ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return CUDA_SUCCESS;
}
CUresult vgpu_cuGetProcAddress_v1(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  return cuGetProcAddress(symbol, pfn, version, flags, nullptr);
}
