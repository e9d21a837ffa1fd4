// libnvidia-ml.so.1: the NVML calls torch makes (c10 opens it for expandable
// segments and for the per-process lines of its out-of-memory message), on the
// virtual GPU (core.h). NVML's types are declared here: its header does not
// ship with torch's wheels, and these layouts are stable.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "core.h"

namespace {

using nvmlReturn_t = int;
constexpr nvmlReturn_t kSuccess = 0;
constexpr nvmlReturn_t kInvalidArgument = 2;
constexpr nvmlReturn_t kNotSupported = 3;
constexpr nvmlReturn_t kNotFound = 6;
constexpr nvmlReturn_t kInsufficientSize = 7;

struct Device {
  int index;
};
Device g_devices[16] = {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}, {11}, {12}, {13}, {14}, {15}};
using nvmlDevice_t = Device*;

struct nvmlMemory_t {
  unsigned long long total, free, used;
};
struct nvmlProcessInfo_v1_t {
  unsigned int pid;
  unsigned long long usedGpuMemory;
};
struct nvmlProcessInfo_t {  // _v2 and _v3
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId, computeInstanceId;
};

int index_of(nvmlDevice_t device) {
  if (device == nullptr) return -1;
  int i = device->index;
  return vgpu::device(i) != nullptr ? i : -1;
}

// This process is the one process on each device whose context it created.
template <typename Info>
nvmlReturn_t processes(nvmlDevice_t device, unsigned int* count, Info* infos) {
  int i = index_of(device);
  if (i < 0 || count == nullptr) return kInvalidArgument;
  uint64_t used = vgpu::used_bytes(i);
  unsigned int n = used > 0 ? 1 : 0;
  if (*count < n) {
    *count = n;
    return kInsufficientSize;
  }
  *count = n;
  if (n == 1) {
    std::memset(&infos[0], 0, sizeof(Info));
    infos[0].pid = static_cast<unsigned int>(getpid());
    infos[0].usedGpuMemory = used;
  }
  return kSuccess;
}

}  // namespace

#define API extern "C" __attribute__((visibility("default")))

API nvmlReturn_t nvmlInit_v2() {
  return kSuccess;
}
API nvmlReturn_t nvmlInit() {
  return kSuccess;
}
API nvmlReturn_t nvmlInitWithFlags(unsigned int) {
  return kSuccess;
}
API nvmlReturn_t nvmlShutdown() {
  return kSuccess;
}
API const char* nvmlErrorString(nvmlReturn_t result) {
  switch (result) {
    case kSuccess: return "Success";
    case kInvalidArgument: return "Invalid Argument";
    case kNotSupported: return "Not Supported (allocscope virtual GPU)";
    case kNotFound: return "Not Found";
    case kInsufficientSize: return "Insufficient Size";
    default: return "Unknown Error";
  }
}
API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int* version) {
  *version = 13000;
  return kSuccess;
}
API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int* version) {
  return nvmlSystemGetCudaDriverVersion_v2(version);
}
API nvmlReturn_t nvmlSystemGetDriverVersion(char* version, unsigned int length) {
  std::snprintf(version, length, "allocscope-virtual");
  return kSuccess;
}
API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* count) {
  *count = static_cast<unsigned int>(vgpu::device_count());
  return kSuccess;
}
API nvmlReturn_t nvmlDeviceGetCount(unsigned int* count) {
  return nvmlDeviceGetCount_v2(count);
}
API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
  if (vgpu::device(static_cast<int>(index)) == nullptr) return kInvalidArgument;
  *device = &g_devices[index];
  return kSuccess;
}
API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t* device) {
  return nvmlDeviceGetHandleByIndex_v2(index, device);
}
API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char* bus_id, nvmlDevice_t* device) {
  unsigned int domain = 0, bus = 0, slot = 0, function = 0;
  if (std::sscanf(bus_id, "%x:%x:%x.%x", &domain, &bus, &slot, &function) != 4) return kInvalidArgument;
  for (int i = 0; i < vgpu::device_count(); ++i) {
    if (static_cast<unsigned int>(vgpu::pci_bus(i)) == bus) {
      *device = &g_devices[i];
      return kSuccess;
    }
  }
  return kNotFound;
}
API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char* name, unsigned int length) {
  int i = index_of(device);
  if (i < 0) return kInvalidArgument;
  std::snprintf(name, length, "%s", vgpu::device(i)->preset->name);
  return kSuccess;
}
API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char* uuid, unsigned int length) {
  int i = index_of(device);
  if (i < 0) return kInvalidArgument;
  std::snprintf(uuid, length, "GPU-616c6c6f-6373-636f-7065-%02x%02x00000000", i,
                static_cast<int>(vgpu::device(i)->preset - vgpu::kPresets));
  return kSuccess;
}
API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) {
  int i = index_of(device);
  if (i < 0) return kInvalidArgument;
  uint64_t total = vgpu::device(i)->total, used = vgpu::used_bytes(i);
  memory->total = total;
  memory->used = used;
  memory->free = total - used;
  return kSuccess;
}
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int* count,
                                                      nvmlProcessInfo_v1_t* infos) {
  return processes(device, count, infos);
}
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int* count,
                                                         nvmlProcessInfo_t* infos) {
  return processes(device, count, infos);
}
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int* count,
                                                         nvmlProcessInfo_t* infos) {
  return processes(device, count, infos);
}
// NVLink and fabrics: a virtual GPU has neither.
API nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t, unsigned int, void*) {
  return kNotSupported;
}
API nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t, unsigned int, int*) {
  return kNotSupported;
}
// Answered as a card outside any NVLink fabric does: state NOT_SUPPORTED (0).
// The struct's first word is its version, whose low 24 bits are its size.
API nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, void* info) {
  if (index_of(device) < 0 || info == nullptr) return kInvalidArgument;
  unsigned int version = 0;
  std::memcpy(&version, info, sizeof(version));
  size_t size = version & 0xffffff;
  if (size <= sizeof(version) || size > 4096) return kInvalidArgument;
  std::memset(static_cast<char*>(info) + sizeof(version), 0, size - sizeof(version));
  return kSuccess;
}

// ---- what serving engines ask of NVML before they touch CUDA (vLLM's
// platform detection reads the capability and topology through pynvml,
// without initializing CUDA). Layouts as in nvml.h (and pynvml's ctypes).

API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int* index) {
  int i = index_of(device);
  if (i < 0 || index == nullptr) return kInvalidArgument;
  *index = static_cast<unsigned int>(i);
  return kSuccess;
}
API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int* major, int* minor) {
  int i = index_of(device);
  if (i < 0 || major == nullptr || minor == nullptr) return kInvalidArgument;
  *major = vgpu::device(i)->preset->major;
  *minor = vgpu::device(i)->preset->minor;
  return kSuccess;
}
API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char* uuid, nvmlDevice_t* device) {
  if (uuid == nullptr || device == nullptr) return kInvalidArgument;
  char mine[96];
  for (int i = 0; i < vgpu::device_count(); ++i) {
    if (nvmlDeviceGetUUID(&g_devices[i], mine, sizeof(mine)) == kSuccess && std::strcmp(mine, uuid) == 0) {
      *device = &g_devices[i];
      return kSuccess;
    }
  }
  return kNotFound;
}

namespace {
struct nvmlPciInfo_t {
  char busIdLegacy[16];
  unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
};
}  // namespace

API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t* pci) {
  int i = index_of(device);
  if (i < 0 || pci == nullptr) return kInvalidArgument;
  std::memset(pci, 0, sizeof(*pci));
  pci->bus = static_cast<unsigned int>(vgpu::pci_bus(i));
  std::snprintf(pci->busId, sizeof(pci->busId), "00000000:%02X:00.0", pci->bus);
  std::snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "0000:%02X:00.0", pci->bus);
  return kSuccess;
}
// (_v2 fills the same struct; the unversioned symbol's is an older, smaller
// one, left out rather than overrun)
API nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t* pci) {
  return nvmlDeviceGetPciInfo_v3(device, pci);
}
// Every card is near every CPU of the host: one NUMA node.
API nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int* node) {
  if (index_of(device) < 0 || node == nullptr) return kInvalidArgument;
  *node = 0;
  return kSuccess;
}
API nvmlReturn_t nvmlDeviceGetCpuAffinity(nvmlDevice_t device, unsigned int words, unsigned long* cpus) {
  if (index_of(device) < 0 || cpus == nullptr) return kInvalidArgument;
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  constexpr long kBits = 8 * sizeof(unsigned long);
  for (unsigned int w = 0; w < words; ++w) {
    long first = static_cast<long>(w) * kBits, n = std::max(0L, std::min(kBits, online - first));
    cpus[w] = n >= kBits ? ~0UL : (1UL << n) - 1;
  }
  return kSuccess;
}
// Peer access between two cards of one node: as NVLink gives it on the
// cards that have it (the SXM parts), not over PCIe (NVML_P2P_STATUS_OK 0,
// _NOT_SUPPORTED 5), for every capability asked (read, write, atomics, NVLink).
API nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t a, nvmlDevice_t b, int, int* status) {
  int i = index_of(a), j = index_of(b);
  if (i < 0 || j < 0 || status == nullptr) return kInvalidArgument;
  *status = i != j && vgpu::has_nvlink(*vgpu::device(i)->preset) ? 0 : 5;
  return kSuccess;
}
