// The CUDA baseline: the wrapped allocator's snapshot (segments and blocks),
// settings and statistics, and the devices' memory, as the JSON object that
// docs/format.md describes under BASELINE.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/util/Exception.h>

#include <dlfcn.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <tuple>
#include <utility>

#include "clock.h"
#include "cuda_allocator.h"
#include "json.h"
#include "recorder.h"
#include "torch_version.h"

// torch keeps one cuBLAS and one cuBLASLt workspace per (handle, stream), in
// maps that ATen/cuda/CUDAContextLight.h declares. That header pulls in the
// headers of cuBLAS, cuSPARSE, cuSOLVER and cuDSS, which a build from torch's
// wheels does not have, so the map's layout, as the torch versions we know
// define it, is declared here, and its accessors are looked up in the
// already loaded libtorch_cuda (_C does not link it: linked, a process that
// ran out of memory sometimes aborted at exit in a destructor). Versions
// whose layout we have not read (2.12, 2.13) report no workspaces.
#define ALLOCSCOPE_WORKSPACE_MAPS (ALLOCSCOPE_TORCH_AT_LEAST(2, 14) || !ALLOCSCOPE_TORCH_AT_LEAST(2, 12))
#if ALLOCSCOPE_WORKSPACE_MAPS
namespace allocscope::cuda {
namespace {
struct WorkspaceMapWithMutex {  // at::cuda::WorkspaceMapWithMutex
#if ALLOCSCOPE_TORCH_AT_LEAST(2, 14)
  std::map<std::tuple<void*, void*>, std::pair<c10::DataPtr, size_t>> map;
#else
  std::map<std::tuple<void*, void*>, c10::DataPtr> map;
#endif
  std::shared_mutex mutex;
};
using MapAccessor = WorkspaceMapWithMutex& (*)();
using SizeAccessor = size_t (*)();
}  // namespace
}  // namespace allocscope::cuda
#endif

namespace allocscope::cuda {
namespace {

namespace cca = c10::cuda::CUDACachingAllocator;
using c10::CachingDeviceAllocator::DeviceStats;

void write_stat(JsonWriter& j, const char* name, const c10::CachingAllocator::StatArray& stat) {
  const auto& s = stat[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
  j.key(name).begin_object().field("current", s.current).field("peak", s.peak).end_object();
}

#if ALLOCSCOPE_WORKSPACE_MAPS
// size_symbol: the workspace size for versions whose map does not keep it
// (it reads the device's properties: called only if there is a workspace).
void write_workspaces(JsonWriter& j, const char* library, const char* map_symbol, const char* size_symbol) {
  // torch loaded it (privately: RTLD_DEFAULT does not see it); NOLOAD only
  // finds it, and the handle's reference is kept for the process's life.
  static void* torch_cuda = dlopen("libtorch_cuda.so", RTLD_LAZY | RTLD_NOLOAD);
  if (torch_cuda == nullptr) return;
  auto map_of = reinterpret_cast<MapAccessor>(dlsym(torch_cuda, map_symbol));
  auto default_size = reinterpret_cast<SizeAccessor>(dlsym(torch_cuda, size_symbol));
  if (map_of == nullptr || default_size == nullptr) return;
  WorkspaceMapWithMutex& m = map_of();
  std::shared_lock<std::shared_mutex> lock(m.mutex);
  for (const auto& [key, value] : m.map) {
#if ALLOCSCOPE_TORCH_AT_LEAST(2, 14)
    const c10::DataPtr& ptr = value.first;
    size_t size = value.second;
#else
    const c10::DataPtr& ptr = value;
    size_t size = default_size();
#endif
    if (ptr.get() == nullptr) continue;
    j.begin_object().field("library", std::string(library));
    j.field("address", uint64_t{reinterpret_cast<uintptr_t>(ptr.get())}).field("size", uint64_t{size});
    j.field("stream", uint64_t{reinterpret_cast<uintptr_t>(std::get<1>(key))});
    j.end_object();
  }
}
#endif

// The cuBLAS and cuBLASLt workspaces torch holds now (allocations through the
// caching allocator that no tensor owns).
void write_all_workspaces(JsonWriter& j) {
  j.key("workspaces").begin_array();
#if ALLOCSCOPE_WORKSPACE_MAPS
  write_workspaces(j, "cublas", "_ZN2at4cuda33cublas_handle_stream_to_workspaceEv",
                   "_ZN2at4cuda22getChosenWorkspaceSizeEv");
  write_workspaces(j, "cublaslt", "_ZN2at4cuda35cublaslt_handle_stream_to_workspaceEv",
                   "_ZN2at4cuda26getCUDABlasLtWorkspaceSizeEv");
#endif
  j.end_array();
}

}  // namespace

std::string baseline_json(const std::string& label, const std::vector<int>& devices,
                          const std::vector<int>& with_context) {
  cca::CUDAAllocator* a = wrapped();
  JsonWriter j;
  j.begin_object();
  j.field("label", label).field("device_type", std::string("cuda"));
  j.field("seq", Recorder::get().next_seq()).field("monotonic_ns", now_ns());
  j.field("allocator", a->name());
  // Takes the device locks; each device's SNAPSHOT trace entry, written
  // under its lock, marks where in the event stream that device's part was
  // read (other threads go on allocating around it).
  begin_snapshot_marks();
  cca::SnapshotInfo snap = a->snapshot({0, 0}, false);
  j.key("snapshot_events").begin_array();
  for (const auto& [device, seq] : end_snapshot_marks()) j.begin_array().value(int64_t{device}).value(seq).end_array();
  j.end_array();
  j.key("segments").begin_array();
  for (const auto& seg : snap.segments) {
    j.begin_object();
    j.field("device", int{seg.device}).field("address", uint64_t{seg.address});
    j.field("total_size", uint64_t{seg.total_size}).field("requested_size", uint64_t{seg.requested_size});
    j.field("allocated_size", uint64_t{seg.allocated_size}).field("active_size", uint64_t{seg.active_size});
    j.field("stream", uint64_t{reinterpret_cast<uintptr_t>(seg.stream)});
    j.field("is_large", seg.is_large).field("is_expandable", seg.is_expandable);
    j.key("pool").begin_array().value(uint64_t{seg.owner_private_pool_id.first});
    j.value(uint64_t{seg.owner_private_pool_id.second}).end_array();
    // Blocks in address order: [size, requested_size, allocated, active].
    j.key("blocks").begin_array();
    for (const auto& b : seg.blocks) {
      j.begin_array().value(uint64_t{b.size}).value(uint64_t{b.requested_size});
      j.value(b.allocated).value(b.active).end_array();
    }
    j.end_array().end_object();
  }
  j.end_array();
  write_all_workspaces(j);
  const auto& c = snap.config_metadata;
  j.key("config").begin_object();
  j.field("garbage_collection_threshold", c.garbage_collection_threshold);
  j.field("max_split_size", uint64_t{c.max_split_size});
  j.field("expandable_segments", c.expandable_segments);
  j.field("release_lock_on_malloc", c.release_lock_on_malloc);
  j.field("graph_capture_record_stream_reuse", c.graph_capture_record_stream_reuse);
  j.field("last_allocator_settings", c.last_allocator_settings);
  j.key("roundup_power2_divisions").begin_array();
  for (size_t d : c.roundup_power2_divisions) j.value(uint64_t{d});
  j.end_array();
  j.end_object();
  j.key("devices").begin_array();
  for (int device : devices) {
    auto index = static_cast<c10::DeviceIndex>(device);
    j.begin_object().field("index", device);
    try {
      if (std::find(with_context.begin(), with_context.end(), device) != with_context.end()) {
        auto [free, total] = a->getMemoryInfo(index);
        j.field("free", uint64_t{free}).field("total", uint64_t{total}).field("used", uint64_t{total - free});
      }
    } catch (const c10::Error&) {
    }
    try {
      j.field("memory_fraction", a->getMemoryFraction(index));
    } catch (const c10::Error&) {
    }
    try {
      DeviceStats stats = a->getDeviceStats(index);
      j.key("stats").begin_object();
      write_stat(j, "allocated_bytes", stats.allocated_bytes);
      write_stat(j, "reserved_bytes", stats.reserved_bytes);
      write_stat(j, "active_bytes", stats.active_bytes);
      write_stat(j, "requested_bytes", stats.requested_bytes);
      j.field("num_alloc_retries", stats.num_alloc_retries).field("num_ooms", stats.num_ooms);
      j.field("num_device_alloc", stats.num_device_alloc).field("num_device_free", stats.num_device_free);
      j.end_object();
    } catch (const c10::Error&) {
    }
    j.end_object();
  }
  j.end_array();
  j.end_object();
  return j.str();
}

}  // namespace allocscope::cuda
